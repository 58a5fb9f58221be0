"""``biaxial`` entry point: builds the subcommand parser and turns every expected error into
one clear line on stderr with a non-zero exit code, never a traceback: invalid input exits 2,
other failures 1 (each command's ``--help`` lists its codes), and an unexpected exception, a
bug, exits 70 with one line (``-vv`` logs the traceback)."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

import biaxial.commands
from biaxial import ROOT_LOGGER
from driver.api.errors import BiaxialError, InvalidInputError

EXIT_INVALID_INPUT = 2
EXIT_FAILURE = 1
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug, reported in one line


def _command_modules() -> list[ModuleType]:
    modules = [
        importlib.import_module(f"biaxial.commands.{info.name}")
        for info in pkgutil.iter_modules(biaxial.commands.__path__)
        if not info.name.startswith("_")
    ]
    return sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))


def _one_line(exc: BaseException) -> str:
    """The error's message on one line (a message never spans lines on the terminal)."""
    return " ".join(str(exc).split())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="biaxial",
        description="Kubernetes DRA driver for NVIDIA GPUs with node x GPU binpack/spread.",
    )
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-v INFO, -vv DEBUG)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules():
        cmd = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=module.HELP,
            epilog=getattr(module, "EPILOG", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(cmd)
        cmd.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Every biaxial logger is under ``biaxial.``: -v/-vv raise all of biaxial, never the
    # libraries underneath (aiohttp, grpc), which stay at WARNING.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger(ROOT_LOGGER).setLevel(
        {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    )
    try:
        code: int = args.run(args)
    except InvalidInputError as exc:
        print(f"biaxial {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_INVALID_INPUT
    except BiaxialError as exc:
        print(f"biaxial {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last resort: one line, never a traceback
        logging.getLogger(ROOT_LOGGER).debug("internal error", exc_info=exc)
        print(
            f"biaxial {args.command}: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(a bug in "
            "biaxial: please report it with the input; -vv shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    return code

"""Flags with environment twins: the one convention of the long-running commands
(``biaxial controller``, ``biaxial kubelet-plugin``).

Each command declares its settings once, as a table of :class:`Flag` (name, help, the
``Settings`` field it sets, its kind, its default), and gets from :class:`Flags`:

* the argparse options, each help line ending in ``[env BIAXIAL_<FLAG>; default D]``, and the
  rules below as the ``--help`` epilog (:data:`EPILOG`);
* the value in force for every flag (:meth:`Flags.read`), first of: the flag on the command
  line; its environment twin ``BIAXIAL_<FLAG IN UPPER SNAKE CASE>`` (``--qps`` ->
  ``BIAXIAL_QPS``); a conventional variable where the flag names one (``KUBECONFIG``,
  ``NODE_NAME``, ``POD_UID``); the default. A blank value counts as not set;
* values converted for their kind: text, number, integer, path, or a switch. Switches are
  ``--x`` / ``--no-x`` on the command line and ``true`` / ``false`` (or ``1``/``0``,
  ``yes``/``no``, ``on``/``off``, any case) in the environment; anything else is an error,
  never a silent false;
* one line for a value that cannot be used, naming the flag, the value and where it came from
  (:meth:`Given.build`): ``--qps: 'fast' is not a number (from $BIAXIAL_QPS)``. The same
  suffix is added to the settings' own validation errors, which start with the flag they are
  about. The CLI prints it and exits 2.

:func:`daemon_logging` is the log level a long-running command runs with: INFO by default (a
daemon logs its lifecycle), DEBUG with ``-vv``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from biaxial import ROOT_LOGGER
from driver.api.errors import ConfigError, InvalidInputError

S = TypeVar("S")

ENV_PREFIX: Final = "BIAXIAL_"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_LEADING_FLAG: Final = re.compile(r"--([a-z0-9][a-z0-9-]*)")

EPILOG: Final = """\
flags and environment:
  Every flag has an environment twin: BIAXIAL_ and the flag's name in upper snake case
  (--qps -> BIAXIAL_QPS). The flag wins over its twin, the twin over a conventional
  variable where one is shown (KUBECONFIG, NODE_NAME, POD_UID), and that over the
  default; a blank value counts as not set. Switches are --x / --no-x on the command line
  and true or false (also 1/0, yes/no, on/off) in the environment. A value that cannot be
  used is one line on stderr naming the flag and where the value came from; exit code 2.

logging:
  INFO by default (lifecycle steps with durations), DEBUG with -vv; every logger is under
  "biaxial", so this one setting reaches the whole program.
"""


def parse_switch(text: str) -> bool:
    """``true``/``false`` and their usual spellings; anything else is a ValueError."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(text)


@dataclass(frozen=True, slots=True)
class Kind:
    """How a flag's text becomes a value: ``parse`` raises ValueError when it cannot."""

    what: str  # completes "'x' is not ..."
    parse: Callable[[str], Any]
    switch: bool = False


TEXT: Final = Kind("text", str)
NUMBER: Final = Kind("a number", float)
INTEGER: Final = Kind("an integer", int)
PATH: Final = Kind("a path", Path)
SWITCH: Final = Kind("true or false", parse_switch, switch=True)


@dataclass(frozen=True, slots=True)
class Flag:
    """One setting: ``--name``, its environment twin, and the Settings field it fills."""

    name: str  # without the leading dashes
    help: str
    field: str | None = None  # None: the command reads it itself (Given.text)
    kind: Kind = TEXT
    default: str | None = None  # as text; None: not set (the Settings default applies)
    metavar: str = "VALUE"
    conventional_env: tuple[str, ...] = ()  # read after the twin (KUBECONFIG, NODE_NAME)

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def describe(self) -> str:
        """The help line: the text, then where else the value may come from."""
        envs = ", then ".join((self.env, *self.conventional_env))
        default = f"; default {self.default}" if self.default else ""
        return f"{self.help} [env {envs}{default}]"


@dataclass(frozen=True, slots=True)
class Value:
    """A flag's text in force and where it came from: ``flag``, an environment variable's
    name, or ``default``."""

    text: str | None
    source: str


class Flags:
    """A command's flags (see the module docstring)."""

    def __init__(self, *flags: Flag) -> None:
        self._flags = {f.name: f for f in flags}
        if len(self._flags) != len(flags):
            raise ValueError("a flag is declared twice")

    def __iter__(self) -> Iterator[Flag]:
        return iter(self._flags.values())

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add every flag (switches as ``--x`` / ``--no-x``) and the convention as epilog."""
        for flag in self:
            form: dict[str, Any] = (
                {"action": argparse.BooleanOptionalAction}
                if flag.kind.switch
                else {"metavar": flag.metavar}
            )
            parser.add_argument(
                flag.option, dest=flag.dest, default=None, help=flag.describe(), **form
            )
        parser.epilog = EPILOG
        parser.formatter_class = argparse.RawDescriptionHelpFormatter

    def read(self, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Given:
        """The value in force for every flag: flag, twin, conventional variable, default."""
        env = os.environ if environ is None else environ
        values: dict[str, Value] = {}
        for flag in self:
            given = getattr(args, flag.dest, None)
            if isinstance(given, bool):  # a switch on the command line
                given = "true" if given else "false"
            values[flag.name] = _first(flag, given, env)
        return Given(self._flags, values)


def _first(flag: Flag, given: str | None, env: Mapping[str, str]) -> Value:
    if given is not None and given.strip():
        return Value(given, "flag")
    for name in (flag.env, *flag.conventional_env):
        found = env.get(name, "").strip()
        if found:
            return Value(found, name)
    return Value(flag.default, "default")


class Given:
    """The values in force for one command line (:meth:`Flags.read`)."""

    def __init__(self, flags: Mapping[str, Flag], values: Mapping[str, Value]) -> None:
        self._flags = flags
        self._values = values

    def value(self, name: str) -> Value:
        return self._values[name]

    def text(self, name: str) -> str:
        """The text in force for a flag that sets no field ("" when nothing set it)."""
        return self._values[name].text or ""

    def build(self, make: Callable[[dict[str, Any]], S]) -> S:
        """Convert every flag that sets a field and call ``make(fields)``, which builds and
        validates the settings; an InvalidInputError that names a flag (parsing here, or the
        settings' own validation) gets one suffix saying where the value came from."""
        with self._blame():
            return make(self._fields())

    def _fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for name, flag in self._flags.items():
            text = self._values[name].text
            if flag.field is None or text is None:
                continue
            try:
                fields[flag.field] = flag.kind.parse(text)
            except ValueError as exc:
                raise ConfigError(f"{flag.option}: {text!r} is not {flag.kind.what}") from exc
        return fields

    @contextlib.contextmanager
    def _blame(self) -> Iterator[None]:
        try:
            yield
        except InvalidInputError as exc:
            message = str(exc)
            match = _LEADING_FLAG.match(message)
            flag = self._flags.get(match.group(1)) if match else None
            if flag is None or flag.env in message:
                raise
            source = self._values[flag.name].source
            if source == "flag":
                where = f"from the flag; environment twin ${flag.env}"
            elif source == "default":
                where = f"the default; environment twin ${flag.env}"
            else:
                where = f"from ${source}"
            raise type(exc)(f"{message} ({where})") from exc


def daemon_logging(verbose: int) -> None:
    """A long-running command logs its lifecycle: INFO unless ``-vv`` asked for DEBUG."""
    if verbose == 0:
        logging.getLogger(ROOT_LOGGER).setLevel(logging.INFO)

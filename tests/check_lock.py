"""Check that the lock files agree with ``pyproject.toml`` (``make check``), or rewrite them.

Usage::

    python -m tests.check_lock            # exit 1 with one line per disagreement
    python -m tests.check_lock --update   # re-resolve both locks (``make lock``)

``pyproject.toml`` keeps version *ranges* for users who install the package; the locks pin the
exact versions (with every file's hash) that development, CI and the image install:

- ``requirements/dev.lock``: the package's dependencies with the ``dev`` extra (which includes
  ``test``); ``make venv`` installs it with ``pip --require-hashes``.
- ``requirements/runtime.lock``: the dependencies alone; the Dockerfile installs it.

The check: every requirement of ``pyproject.toml`` that applies on this interpreter is pinned
in the lock, at a version its range allows; every pin carries at least one hash; no package is
pinned twice for the same environment. A range changed in ``pyproject.toml`` without
``make lock`` therefore fails here, and so does a lock edited by hand into something the ranges
refuse. The resolver is uv (``UV_VERSION`` below), run from a throw-away virtual environment so
the project's own environment never changes while it is being resolved.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT: Final = Path(__file__).resolve().parent.parent
PYPROJECT: Final = ROOT / "pyproject.toml"
UV_VERSION: Final = "0.13.9"
# lock file -> the extras of the project it holds
LOCKS: Final = {
    ROOT / "requirements" / "dev.lock": ("dev",),
    ROOT / "requirements" / "runtime.lock": (),
}
_PIN: Final = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: Version
    marker: Marker | None
    hashed: bool
    line: int


def read_lock(path: Path) -> list[Pin]:
    """The pins of a lock in uv's (pip-compatible) requirements format."""
    pins: list[Pin] = []
    lines = path.read_text().splitlines()
    for i, text in enumerate(lines):
        match = _PIN.match(text)
        if match is None:
            continue
        name, version, marker = match.groups()
        hashed = i + 1 < len(lines) and lines[i + 1].strip().startswith("--hash=sha256:")
        pins.append(
            Pin(
                canonicalize_name(name),
                Version(version),
                Marker(marker) if marker else None,
                hashed,
                i + 1,
            )
        )
    return pins


def wanted(extras: tuple[str, ...]) -> list[Requirement]:
    """The requirements of ``pyproject.toml`` for these extras, self-references expanded."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    own = canonicalize_name(project["name"])
    optional: dict[str, list[str]] = project.get("optional-dependencies", {})
    result: list[Requirement] = []
    seen: set[str] = set()
    todo = [Requirement(r) for r in project["dependencies"]]
    todo += [Requirement(f"{own}[{extra}]") for extra in extras]
    while todo:
        req = todo.pop()
        if canonicalize_name(req.name) != own:
            result.append(req)
            continue
        for extra in sorted(req.extras - seen):
            seen.add(extra)
            todo += [Requirement(r) for r in optional[extra]]
    return result


def problems(path: Path, extras: tuple[str, ...]) -> list[str]:
    """What is wrong with one lock, one line each (empty when it agrees)."""
    rel = path.relative_to(ROOT)
    if not path.exists():
        return [f"{rel}: missing; run `make lock`"]
    pins = read_lock(path)
    out = [f"{rel}:{p.line}: {p.name}=={p.version} has no --hash" for p in pins if not p.hashed]
    here = [p for p in pins if p.marker is None or p.marker.evaluate()]
    by_name: dict[str, Pin] = {}
    for pin in here:
        if pin.name in by_name:
            out.append(f"{rel}:{pin.line}: {pin.name} is pinned twice for this environment")
        by_name[pin.name] = pin
    for req in wanted(extras):
        if req.marker is not None and not req.marker.evaluate():
            continue
        pin = by_name.get(canonicalize_name(req.name))
        if pin is None:
            out.append(f"{rel}: {req.name} ({req}) is required by pyproject.toml but not locked")
        elif not req.specifier.contains(pin.version, prereleases=True):
            out.append(
                f"{rel}:{pin.line}: {pin.name}=={pin.version} is outside pyproject.toml's "
                f"range {req.specifier}; run `make lock`"
            )
    return out


def update() -> None:
    """Re-resolve every lock with the pinned uv, from a throw-away environment."""
    with tempfile.TemporaryDirectory(prefix="biaxial-lock-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        uv = venv / "bin" / "uv"
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, f"uv=={UV_VERSION}"], check=True)
        for path, extras in LOCKS.items():
            path.parent.mkdir(exist_ok=True)
            args = [str(uv), "pip", "compile", str(PYPROJECT.relative_to(ROOT)), "--quiet"]
            args += [arg for extra in extras for arg in ("--extra", extra)]
            args += ["--generate-hashes", "--universal", "--python-version", "3.11"]
            args += ["--custom-compile-command", "make lock", "-o", str(path.relative_to(ROOT))]
            subprocess.run(args, check=True, cwd=ROOT)
            print(f"wrote {path.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="re-resolve the locks")
    args = parser.parse_args(argv)
    if args.update:
        update()
    found = [line for path, extras in LOCKS.items() for line in problems(path, extras)]
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

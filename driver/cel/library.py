"""Values and functions of the Kubernetes CEL libraries that DRA selectors use: ``quantity`` and
``semver``, as plain Python with upstream semantics, independent of any CEL engine.

``driver.cel.engine`` binds these to cel-expr-python; the test-only cel-python adapter binds
the same functions, so both engines share one implementation of the libraries and differ only
where the engines themselves differ.

* quantity (k8s.io/apiserver/pkg/cel/library/quantity.go): ``quantity(s)``, ``isQuantity(s)``,
  members ``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``, ``add`` / ``sub``
  (quantity or int), ``compareTo``, ``isGreaterThan``, ``isLessThan``. Values are
  :class:`driver.api.quantity.Quantity` (exact).
* semver (k8s.io/apiserver/pkg/cel/library/semverlib.go, blang/semver): ``semver(s)`` parses
  strict semver 2.0.0; ``semver(s, true)`` normalises first (drops a leading ``v``, fills in a
  missing minor/patch with 0, strips leading zeros); ``isSemver(s[, normalize])``; members
  ``major``, ``minor``, ``patch``, ``compareTo``, ``isGreaterThan``, ``isLessThan``. Comparison
  follows semver precedence (build metadata ignored).

Every function raises :class:`CELFunctionError` with upstream's wording when its input is
invalid; the engine turns that into a CEL runtime error. Pure module, immutable values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from driver.api.errors import QuantityError
from driver.api.quantity import Quantity

_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)


class CELFunctionError(ValueError):
    """A library function was called with an invalid argument (a CEL runtime error)."""


# --------------------------------------------------------------------------- semver

_NUM = r"0|[1-9][0-9]*"
_PRE_ID = r"(?:0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER: Final = re.compile(
    rf"(?P<major>{_NUM})\.(?P<minor>{_NUM})\.(?P<patch>{_NUM})"
    rf"(?:-(?P<pre>{_PRE_ID}(?:\.{_PRE_ID})*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)
_LOOSE_CORE: Final = re.compile(
    r"(?P<core>[0-9]+(?:\.[0-9]+){0,2})(?P<rest>(?:[-+].*)?)", re.DOTALL
)


@dataclass(frozen=True, slots=True)
class Semver:
    """A semantic version; ordering and equality follow semver precedence (build ignored)."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: str = ""

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(p) for p in self.pre)
        if self.build:
            text += "+" + self.build
        return text

    @property
    def precedence_text(self) -> str:
        """The version without build metadata: equal text <=> equal precedence."""
        return str(Semver(self.major, self.minor, self.patch, self.pre))

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 by semver 2.0.0 precedence."""
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if self.pre == other.pre:
            return 0
        if not self.pre:
            return 1
        if not other.pre:
            return -1
        for a, b in zip(self.pre, other.pre, strict=False):
            if a == b:
                continue
            if isinstance(a, int) and isinstance(b, int):
                return -1 if a < b else 1
            if isinstance(a, int):
                return -1  # numeric identifiers have lower precedence than alphanumeric ones
            if isinstance(b, int):
                return 1
            return -1 if a < b else 1
        return -1 if len(self.pre) < len(other.pre) else 1


def _normalize_semver(text: str) -> str:
    """blang/semver ParseTolerant-like normalisation used by ``semver(s, true)``."""
    text = text.strip()
    if text[:1] in ("v", "V"):
        text = text[1:]
    match = _LOOSE_CORE.fullmatch(text)
    if match is None:
        return text
    parts = [str(int(p)) for p in match["core"].split(".")]
    if len(parts) < 3 and match["rest"]:
        return text  # a short version cannot carry pre-release or build metadata
    parts += ["0"] * (3 - len(parts))
    return ".".join(parts) + match["rest"]


@lru_cache(maxsize=4096)
def parse_semver(text: str, normalize: bool = False) -> Semver:
    """Parse a semver 2.0.0 string; raises CELFunctionError with upstream's wording."""
    candidate = _normalize_semver(text) if normalize else text
    match = _SEMVER.fullmatch(candidate)
    if match is None:
        raise CELFunctionError(f"could not parse {text!r} as semver")
    pre: tuple[int | str, ...] = ()
    if match["pre"]:
        pre = tuple(int(p) if p.isdigit() else p for p in match["pre"].split("."))
    major, minor, patch = int(match["major"]), int(match["minor"]), int(match["patch"])
    if max(major, minor, patch) > 2**64 - 1:
        raise CELFunctionError(f"could not parse {text!r} as semver: number out of range")
    return Semver(major, minor, patch, pre, match["build"] or "")


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize)
    except CELFunctionError:
        return False
    return True


def semver_int(value: int) -> int:
    """A semver component as a CEL int; errors beyond int64 like upstream."""
    if value > _INT64_MAX:
        raise CELFunctionError("semver component out of the int64 range")
    return value


# --------------------------------------------------------------------------- quantity


@lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """``quantity(s)``: raises CELFunctionError for malformed text."""
    try:
        return Quantity.parse(text)
    except QuantityError as exc:
        raise CELFunctionError(str(exc)) from exc


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except CELFunctionError:
        return False
    return True


def quantity_as_integer(value: Quantity) -> int:
    """``asInteger()``: the exact int64 value, else an error (upstream's wording)."""
    if not value.is_integer():
        raise CELFunctionError("cannot convert value to integer")
    return value.as_integer()


def quantity_add_int(value: Quantity, amount: int) -> Quantity:
    return value + Quantity.from_int(amount)


def quantity_sub_int(value: Quantity, amount: int) -> Quantity:
    return value - Quantity.from_int(amount)


def traversal_cost(value: object) -> int:
    """Kubernetes' traversalCost: a tenth of each string's or bytes' length in bytes (rounded
    down), summed over lists and maps, 1 for anything else."""
    if isinstance(value, str):
        return int(len(value.encode()) * 0.1)
    if isinstance(value, bytes | bytearray):
        return int(len(value) * 0.1)
    if isinstance(value, list):
        return sum(traversal_cost(v) for v in value)
    if isinstance(value, dict):
        return sum(traversal_cost(k) + traversal_cost(v) for k, v in value.items())
    return 1


def check_int64(value: int) -> int:
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise CELFunctionError("integer overflow")
    return value

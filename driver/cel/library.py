"""Values and functions of the Kubernetes CEL libraries that DRA selectors use: ``quantity`` and
``semver``, as plain Python with upstream semantics, independent of any CEL engine.

``driver.cel.bindings`` binds these to cel-expr-python; the test-only cel-python adapter binds
the same functions, so both engines share one implementation of the libraries and differ only
where the engines themselves differ.

* quantity (k8s.io/apiserver/pkg/cel/library/quantity.go): ``quantity(s)``, ``isQuantity(s)``,
  members ``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``, ``add`` / ``sub``
  (quantity or int), ``compareTo``, ``isGreaterThan``, ``isLessThan``. Values are
  :class:`driver.api.quantity.Quantity` (exact).
* semver (k8s.io/apiserver/pkg/cel/library/semverlib.go, blang/semver v4): ``semver(s)``
  parses as blang's ``Parse`` (its messages too); ``semver(s, true)`` normalises first as
  Kubernetes does (drops one leading ``v``, strips leading zeros, fills in a missing minor /
  patch with 0); ``isSemver(s[, normalize])``; members ``major``, ``minor``, ``patch``,
  ``compareTo``, ``isGreaterThan``, ``isLessThan``. Comparison follows semver precedence
  (build metadata ignored).

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


_NUMBERS: Final = frozenset("0123456789")
_ALPHANUMERIC: Final = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")
_UINT64_MAX: Final = 2**64 - 1


def _normalize_semver(text: str) -> str:
    """Kubernetes' normalizeAndParse (``semver(s, true)``): drop one leading ``v``, strip
    leading zeros from the three parts, fill in a missing minor / patch with 0."""
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or stripped[0] not in _NUMBERS:
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(c in "+-" for c in parts[-1]):
            raise CELFunctionError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def _uint(text: str) -> int:
    """Go's strconv.ParseUint(text, 10, 64), its errors included."""
    if not text or any(c not in _NUMBERS for c in text):
        raise CELFunctionError(f'strconv.ParseUint: parsing "{text}": invalid syntax')
    value = int(text)
    if value > _UINT64_MAX:
        raise CELFunctionError(f'strconv.ParseUint: parsing "{text}": value out of range')
    return value


def _number(text: str, what: str) -> int:
    if any(c not in _NUMBERS for c in text):
        raise CELFunctionError(f"Invalid character(s) found in {what} number {go_quote(text)}")
    if len(text) > 1 and text[0] == "0":
        raise CELFunctionError(
            f"{what.capitalize()} number must not contain leading zeroes {go_quote(text)}"
        )
    return _uint(text)


def go_quote(text: str) -> str:
    """Go's strconv.Quote (%q): double quotes, backslash escapes for quotes, backslashes and
    what is not printable."""
    out = ['"']
    for ch in text:
        if ch in GO_ESCAPES:
            out.append(GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


GO_ESCAPES: Final = {  # Go's strconv.Quote and cel-go's strings.quote alike
    '"': '\\"',
    "\\": "\\\\",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


@lru_cache(maxsize=4096)
def parse_semver(text: str, normalize: bool = False) -> Semver:
    """blang/semver v4's Parse (after Kubernetes' normalisation with *normalize*); raises
    CELFunctionError with its messages."""
    candidate = _normalize_semver(text) if normalize else text
    if not candidate:
        raise CELFunctionError("Version string empty")
    parts = candidate.split(".", 2)
    if len(parts) != 3:
        raise CELFunctionError("No Major.Minor.Patch elements found")
    major = _number(parts[0], "major")
    minor = _number(parts[1], "minor")
    patch_text = parts[2]
    build: list[str] = []
    pre_parts: list[str] = []
    if "+" in patch_text:
        patch_text, _, build_text = patch_text.partition("+")
        build = build_text.split(".")
    if "-" in patch_text:
        patch_text, _, pre_text = patch_text.partition("-")
        pre_parts = pre_text.split(".")
    patch = _number(patch_text, "patch")
    pre: list[int | str] = []
    for part in pre_parts:
        if not part:
            raise CELFunctionError("Prerelease is empty")
        if all(c in _NUMBERS for c in part):
            if len(part) > 1 and part[0] == "0":
                raise CELFunctionError(
                    f"Numeric PreRelease version must not contain leading zeroes {go_quote(part)}"
                )
            pre.append(_uint(part))
        elif all(c in _ALPHANUMERIC for c in part):
            pre.append(part)
        else:
            raise CELFunctionError(f"Invalid character(s) found in prerelease {go_quote(part)}")
    for part in build:
        if not part:
            raise CELFunctionError("Build meta data is empty")
        if any(c not in _ALPHANUMERIC for c in part):
            raise CELFunctionError(
                f"Invalid character(s) found in build meta data {go_quote(part)}"
            )
    return Semver(major, minor, patch, tuple(pre), ".".join(build))


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize)
    except CELFunctionError:
        return False
    return True


def semver_int(value: int) -> int:
    """A semver component (uint64) as a CEL int, as Go converts it: wrapping past int64."""
    return value - 2**64 if value > _INT64_MAX else value


# --------------------------------------------------------------------------- quantity


# resource.ParseQuantity's first check; text that passes it but is not a quantity fails on its
# suffix or its number, with upstream's messages.
_QUANTITY_SHAPE: Final = re.compile(r"([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)")
_SUFFIXES: Final = re.compile(r"|[numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]+")


@lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """``quantity(s)``: raises CELFunctionError for malformed text."""
    try:
        return Quantity.parse(text)
    except QuantityError as exc:
        shape = _QUANTITY_SHAPE.fullmatch(text)
        if shape is not None and not _SUFFIXES.fullmatch(shape[2]):
            raise CELFunctionError(
                f"invalid quantity {text!r}: unable to parse quantity's suffix"
            ) from exc
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

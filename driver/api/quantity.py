"""Kubernetes resource quantities with upstream (k8s.io/apimachinery) semantics.

A quantity is stored exactly as an integer number of nano-units plus the format it was written
in, which decides how it is printed back:

* ``BinarySI`` (``Ki Mi Gi Ti Pi Ei``), ``DecimalSI`` (``n u m "" k M G T P E``) and
  ``DecimalExponent`` (``1e3``, ``5E-3``);
* parsing rounds up (away from zero) to nano precision, as upstream does; binary quantities
  are capped at the int64 maximum and a binary value between 0 and 1 becomes decimal;
* :meth:`Quantity.__str__` gives upstream's canonical form: ``1536Mi`` stays ``1536Mi``,
  ``0.5Gi`` becomes ``512Mi``, ``1000`` becomes ``1k``, ``1.5`` becomes ``1500m``, a binary
  quantity that is not a whole multiple of 1024 is printed in decimal, and values beyond the
  largest suffix use exponent notation (``1e21``, ``10e69``), as upstream prints them;
* equality, ordering and hashing use the value only (``1Ki == 1024``).

Malformed strings raise :class:`~driver.api.errors.QuantityError` with the offending text.
The module is pure and every value is immutable.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import total_ordering
from typing import Final, Literal

from driver.api.errors import QuantityError

Format = Literal["BinarySI", "DecimalSI", "DecimalExponent"]

NANO: Final = 10**9
_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)
_MAX_EXPONENT: Final = 1000  # beyond any real quantity (and what we print); stops 1e999999999

_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_SUFFIX_FOR: Final = {exp: suffix for suffix, exp in _DECIMAL.items()}
_BINARY_SUFFIX_FOR: Final = {exp: suffix for suffix, exp in _BINARY.items()}

_PATTERN: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+\.?[0-9]*|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE](?P<exp>[+-]?[0-9]+))?"
)

_SYNTAX_HINT: Final = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def _ceil_away_from_zero(value: Fraction) -> int:
    """Round to an integer, away from zero (upstream's inf.RoundUp)."""
    return _divide_away_from_zero(value.numerator, value.denominator)


def _divide_away_from_zero(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` (``denominator`` > 0) rounded away from zero, in integers."""
    magnitude = -((-abs(numerator)) // denominator)
    return magnitude if numerator >= 0 else -magnitude


_PARSED_MAX: Final = 4096


@total_ordering
class Quantity:
    """An exact, immutable Kubernetes quantity."""

    __slots__ = ("_format", "_nanos")

    _nanos: int
    _format: Format

    def __init__(self, nanos: int = 0, fmt: Format = "DecimalSI") -> None:
        object.__setattr__(self, "_nanos", nanos)
        object.__setattr__(self, "_format", fmt)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Quantity is immutable")

    def __copy__(self) -> Quantity:
        return self  # immutable: a copy is the same value

    def __deepcopy__(self, memo: dict[int, object]) -> Quantity:
        return self

    def __reduce__(self) -> tuple[type[Quantity], tuple[int, Format]]:
        return (Quantity, (self._nanos, self._format))

    # ----------------------------------------------------------------- construction
    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse a quantity string such as ``"40Gi"``, ``"1500m"`` or ``"1e3"``.

        Results are memoised per string (quantities are immutable and manifests repeat the
        same few strings thousands of times; the cache is bounded)."""
        if cls is Quantity and isinstance(text, str):
            cached = _PARSED.get(text)
            if cached is None:
                cached = cls._parse(text)
                if len(_PARSED) >= _PARSED_MAX:
                    _PARSED.clear()
                _PARSED[text] = cached
            return cached
        return cls._parse(text)

    @classmethod
    def _parse(cls, text: str) -> Quantity:
        if not isinstance(text, str):
            raise QuantityError(f"quantity must be a string, got {type(text).__name__}")
        stripped = text.strip()
        match = _PATTERN.fullmatch(stripped) if stripped else None
        if match is None or stripped != text:
            raise QuantityError(f"invalid quantity {text!r}: {_SYNTAX_HINT}")
        number = Fraction(match["number"])
        fmt: Format
        if match["exp"] is not None:
            exponent = int(match["exp"])
            if abs(exponent) > _MAX_EXPONENT:
                raise QuantityError(f"invalid quantity {text!r}: exponent {exponent} out of range")
            value = number * Fraction(10) ** exponent
            fmt = "DecimalExponent"
        elif (suffix := match["suffix"]) in _BINARY:
            value = number * (1 << _BINARY[suffix])
            fmt = "BinarySI"
        else:
            value = number * Fraction(10) ** _DECIMAL[suffix or ""]
            fmt = "DecimalSI"
        magnitude = _ceil_away_from_zero(value * NANO)
        if fmt == "BinarySI":
            # Upstream caps binary quantities at the int64 maximum, and prints a binary
            # quantity between 0 and 1 as decimal (".000000000001Ki" is "2n", DecimalSI).
            magnitude = min(magnitude, _INT64_MAX * NANO)
            if 0 < magnitude < NANO:
                fmt = "DecimalSI"
        return cls(-magnitude if match["sign"] == "-" else magnitude, fmt)

    @classmethod
    def of(cls, value: str | int | Quantity) -> Quantity:
        """Accept what JSON manifests carry: a string, a plain integer, or a Quantity."""
        if isinstance(value, Quantity):
            return value
        if isinstance(value, bool):
            raise QuantityError(f"invalid quantity {value!r}: a boolean is not a quantity")
        if isinstance(value, int):
            return cls(value * NANO, "DecimalSI")
        return cls.parse(value)

    @classmethod
    def from_int(cls, value: int, fmt: Format = "DecimalSI") -> Quantity:
        return cls(value * NANO, fmt)

    @classmethod
    def from_milli(cls, milli: int, fmt: Format = "DecimalSI") -> Quantity:
        return cls(milli * 10**6, fmt)

    # ----------------------------------------------------------------- accessors
    @property
    def format(self) -> Format:
        return self._format

    @property
    def nanos(self) -> int:
        """The exact value in units of 1e-9."""
        return self._nanos

    @property
    def exact(self) -> Fraction:
        return Fraction(self._nanos, NANO)

    def value(self) -> int:
        """The value rounded up (away from zero) to an integer, like upstream's ``Value()``."""
        # (in integers: no Fraction built; read for every device an allocation consumes)
        return _divide_away_from_zero(self._nanos, NANO)

    def milli_value(self) -> int:
        """The value in milli-units rounded away from zero, like upstream's ``MilliValue()``."""
        return _divide_away_from_zero(self._nanos, 10**6)

    def is_integer(self) -> bool:
        """True when the value is a whole number that fits in an int64 (CEL ``isInteger``)."""
        return self._nanos % NANO == 0 and _INT64_MIN <= self._nanos // NANO <= _INT64_MAX

    def as_integer(self) -> int:
        """The exact integer value; raises QuantityError if fractional or beyond int64."""
        if not self.is_integer():
            raise QuantityError(f"cannot convert quantity {self} to an integer without loss")
        return self._nanos // NANO

    def as_approximate_float(self) -> float:
        return self._nanos / NANO

    def sign(self) -> int:
        return (self._nanos > 0) - (self._nanos < 0)

    def is_zero(self) -> bool:
        return self._nanos == 0

    # ----------------------------------------------------------------- arithmetic
    def __add__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        return Quantity(
            self._nanos + other._nanos, other._format if self._nanos == 0 else self._format
        )

    def __sub__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        return Quantity(
            self._nanos - other._nanos, other._format if self._nanos == 0 else self._format
        )

    def __neg__(self) -> Quantity:
        return Quantity(-self._nanos, self._format)

    def with_format(self, fmt: Format) -> Quantity:
        return Quantity(self._nanos, fmt)

    # ----------------------------------------------------------------- comparison
    def __eq__(self, other: object) -> bool:
        if isinstance(other, Quantity):
            return self._nanos == other._nanos
        return NotImplemented

    def __lt__(self, other: Quantity) -> bool:
        if isinstance(other, Quantity):
            return self._nanos < other._nanos
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._nanos)

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1, like upstream's ``Cmp`` and CEL's ``compareTo``."""
        return (self._nanos > other._nanos) - (self._nanos < other._nanos)

    # ----------------------------------------------------------------- formatting
    def __str__(self) -> str:
        return _canonical(self._nanos, self._format)

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"


_PARSED: dict[str, Quantity] = {}


def _canonical(nanos: int, fmt: Format) -> str:
    if nanos == 0:
        return "0"
    sign = "-" if nanos < 0 else ""
    magnitude = abs(nanos)
    if fmt == "BinarySI" and magnitude % NANO == 0 and magnitude >= 1024 * NANO:
        whole = magnitude // NANO
        exponent = 0
        while whole % 1024 == 0:
            whole //= 1024
            exponent += 10
        if exponent in _BINARY_SUFFIX_FOR or exponent == 0:
            return f"{sign}{whole}{_BINARY_SUFFIX_FOR.get(exponent, '')}"
        fmt = "DecimalExponent"  # beyond Ei there is no binary suffix: exact decimal form
    # Decimal: mantissa * 10^exponent with the exponent a multiple of 3, mantissa as small an
    # integer as possible (trailing groups of 000 moved into the exponent). Beyond E (10^18)
    # there is no suffix, so DecimalSI falls back to exponent notation ("1e21"), as upstream.
    mantissa, exponent = magnitude, -9
    while mantissa % 1000 == 0:
        mantissa //= 1000
        exponent += 3
    if fmt == "DecimalExponent" or exponent not in _DECIMAL_SUFFIX_FOR:
        return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")
    return f"{sign}{mantissa}{_DECIMAL_SUFFIX_FOR[exponent]}"


def parse_quantity(value: str | int | Quantity) -> Quantity:
    """Shorthand for :meth:`Quantity.of`."""
    return Quantity.of(value)

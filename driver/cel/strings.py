"""cel-go's strings extension at the version Kubernetes enables (``ext.Strings(StringsVersion(2))``)
and Kubernetes' regex library (``find``, ``findAll``), as plain Python with upstream semantics.

The engine binds these instead of cel-cpp's own strings extension because the Kubernetes lists
library adds ``indexOf`` / ``lastIndexOf`` overloads on lists, which the checker only accepts
when one library declares both. Version 2 is: ``charAt``, ``indexOf``, ``lastIndexOf``,
``lowerAscii``, ``upperAscii``, ``replace``, ``split``, ``substring``, ``trim``, ``join``,
``format`` (the version-1..3 formatter) and ``strings.quote``; ``reverse`` (version 3) is not
part of it. Indices count Unicode code points, as CEL strings do. Every function raises
:class:`~driver.cel.library.CELFunctionError` with upstream's wording on bad input, and charges
its actual cost (upstream's units, ``k8s.io/apiserver/pkg/cel/library/cost.go``) to the running
evaluation's meter, if any. Pure module.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Callable
from typing import Any, Final

import re2

from driver.cel import cost
from driver.cel.library import GO_ESCAPES, CELFunctionError, go_quote, traversal_cost

# --------------------------------------------------------------------------- strings extension


def char_at(text: str, index: int) -> str:
    cost.charge(1)  # upstream has no size-dependent cost for charAt
    if index < 0 or index > len(text):
        raise CELFunctionError(f"index out of range: {index}")
    return text[index : index + 1]


def index_of(text: str, sub: str, offset: int = 0) -> int:
    """cel-go's ``indexOfOffset``: an empty ``sub`` answers ``offset`` unchecked, an offset past
    the end answers -1, a negative one is an error."""
    cost.charge(traversal_cost(text))
    if sub == "":
        return offset
    if offset < 0:
        raise CELFunctionError(f"index out of range: {offset}")
    if offset >= len(text):
        return -1
    return text.find(sub, offset)


def last_index_of(text: str, sub: str, offset: int | None = None) -> int:
    """cel-go's ``lastIndexOf`` / ``lastIndexOfOffset``, their edge cases included (the
    one-argument form compares lengths in UTF-8 bytes before searching)."""
    cost.charge(traversal_cost(text))
    if offset is None:
        if sub == "":
            return len(text)
        if len(text.encode("utf-8", "surrogatepass")) < len(sub.encode("utf-8", "surrogatepass")):
            return -1
        offset = len(text) - 1
    if sub == "":
        return offset
    if offset < 0:
        raise CELFunctionError(f"index out of range: {offset}")
    if offset >= len(text):
        return -1
    return text.rfind(sub, 0, min(offset, len(text) - len(sub)) + len(sub))


def lower_ascii(text: str) -> str:
    cost.charge_traversal(len(text))
    return text.translate(_LOWER)


def upper_ascii(text: str) -> str:
    cost.charge_traversal(len(text))
    return text.translate(_UPPER)


_LOWER: Final = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_UPPER: Final = {c: c - 32 for c in range(ord("a"), ord("z") + 1)}


def replace(text: str, old: str, new: str, count: int = -1) -> str:
    cost.charge_traversal(2 * len(text))
    if count == 0:
        return text
    if old == "":
        # Go's strings.Replace: the replacement surrounds every code point.
        pieces = list(text)
        limit = len(pieces) + 1 if count < 0 else count
        out = []
        for i, piece in enumerate(pieces):
            out.append(new if i < limit else "")
            out.append(piece)
        out.append(new if len(pieces) < limit else "")
        return "".join(out)
    return text.replace(old, new, count)


def split(text: str, sep: str, count: int = -1) -> list[str]:
    cost.charge_traversal(2 * len(text))
    if count == 0:
        return []
    if sep == "":
        chars = list(text)
        if 0 < count < len(chars):
            return [*chars[: count - 1], "".join(chars[count - 1 :])]
        return chars
    return text.split(sep, -1 if count < 0 else count - 1)


def substring(text: str, start: int, end: int | None = None) -> str:
    """cel-go's ``substr`` / ``substrRange``, checks in upstream's order."""
    cost.charge_traversal(len(text))
    if end is not None and start > end:
        raise CELFunctionError(f"invalid substring range. start: {start}, end: {end}")
    stop = len(text) if end is None else end
    if start < 0 or start > len(text):
        raise CELFunctionError(f"index out of range: {start}")
    if stop < 0 or stop > len(text):
        raise CELFunctionError(f"index out of range: {stop}")
    return text[start:stop]


def trim(text: str) -> str:
    cost.charge_traversal(len(text))
    return text.strip(_UNICODE_SPACE)


# Go's unicode.IsSpace.
_UNICODE_SPACE: Final = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"  # noqa: E501


def join(items: list[Any], sep: str = "") -> str:
    for item in items:
        if not isinstance(item, str):
            raise CELFunctionError(f"join: list contains a non-string value {item!r}")
    result = sep.join(items)
    cost.charge_traversal(2 * len(result))
    return result


def quote(text: str) -> str:
    cost.charge_traversal(len(text))
    return quote_plain(text)


def quote_plain(text: str) -> str:
    """cel-go's strings.quote: double quotes, escapes for the C escapes, backslash and quote
    only (other characters as they are)."""
    return '"' + "".join(GO_ESCAPES.get(ch, ch) for ch in text) + '"'


# --------------------------------------------------------------------------- format
#
# cel-go's string formatter of strings-extension versions 1 to 3 (ext/formatting.go), with
# the en_US locale Kubernetes leaves it: %s %d %f %e %b %o %x %X and %%, a precision as in
# %.3f. Numbers in %f and %e go through golang.org/x/text's printer: thousands grouped with
# commas, infinity as ∞, and %e as a mantissa times ten to a superscript power (always six
# digits: the formatter passes the precision as a width).

FORMAT_PRECISION: Final = 6
_SUPERSCRIPT: Final = str.maketrans("0123456789-+", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺")
_NARROW_SPACE: Final = "\u202f"


class FormatError(CELFunctionError):
    """A string.format failure; the engine reports its message as upstream's."""


Clause = Callable[[str, "int | None", int], str]


def parse_format(template: str, clause: Clause, count: int, *, checking: bool = False) -> str:
    """cel-go's parseFormatString: walk *template*, calling ``clause(verb, precision,
    index)`` for each clause (the index of the argument it takes); *count* arguments. At run
    time a missing argument is found before a dangling %; the compile-time check (*checking*)
    finds them the other way round, as upstream's."""
    out: list[str] = []
    i = 0
    index = 0
    while i < len(template):
        if template[i] != "%":
            out.append(template[i])
            i += 1
            continue
        if template[i + 1 : i + 2] == "%":
            out.append("%")
            i += 2
            continue
        if not checking and index >= count:
            raise FormatError(f"index {index} out of range")
        if i + 1 >= len(template):
            raise FormatError("unexpected end of string")
        if index >= count:
            raise FormatError(f"index {index} out of range")
        j = i + 1
        precision: int | None = None
        if template[j] == ".":
            k = j + 1
            while k < len(template) and template[k] in "0123456789":
                k += 1
            if k >= len(template):
                raise FormatError(
                    "could not parse formatting clause: error while parsing precision: "
                    "could not find end of precision specifier"
                )
            digits = template[j + 1 : k]
            if not digits:
                raise FormatError(
                    "could not parse formatting clause: error while parsing precision: "
                    'error while converting precision to integer: strconv.Atoi: parsing "": '
                    "invalid syntax"
                )
            precision = int(digits)
            j = k
        verb = template[j]
        if verb not in "sdfebxXo":
            raise FormatError(
                f'could not parse formatting clause: unrecognized formatting clause "{verb}"'
            )
        out.append(clause(verb, precision, index))
        index += 1
        i = j + 1
    return "".join(out)


def format_string(template: str, args: list[Any]) -> str:
    """``"...".format([args])`` at run time."""
    cost.charge_traversal(len(template))

    def clause(verb: str, precision: int | None, index: int) -> str:
        try:
            return _format_clause(verb, precision, args[index])
        except _ClauseError as exc:
            raise FormatError(f"error during formatting: {exc}") from exc

    return parse_format(template, clause, len(args))


class _ClauseError(ValueError):
    pass


def _format_clause(verb: str, precision: int | None, value: Any) -> str:
    if verb == "s":
        return format_value(value)
    if verb == "d":
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise _ClauseError(
            f"decimal clause can only be used on integers, was given {type_name(value)}"
        )
    if verb in "fe":
        number = _float_for(verb, value)
        if verb == "f":
            return _en_us_fixed(number, FORMAT_PRECISION if precision is None else precision)
        return _en_us_scientific(number)
    if verb == "b":
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, int):
            return format(value, "b")
        raise _ClauseError(
            f"only integers and bools can be formatted as binary, was given {type_name(value)}"
        )
    if verb in "xX":
        if isinstance(value, str | bytes | bytearray):
            text = (value.encode() if isinstance(value, str) else bytes(value)).hex()
            return text.upper() if verb == "X" else text
        if isinstance(value, int) and not isinstance(value, bool):
            text = format(value, "x")
            return text.upper() if verb == "X" else text
        raise _ClauseError(
            "only integers, byte buffers, and strings can be formatted as hex, was given "
            + type_name(value)
        )
    if isinstance(value, int) and not isinstance(value, bool):  # "o"
        return format(value, "o")
    raise _ClauseError(f"octal clause can only be used on integers, was given {type_name(value)}")


def _float_for(verb: str, value: Any) -> float:
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    if isinstance(value, float):
        return value
    kind = "fixed-point" if verb == "f" else "scientific"
    raise _ClauseError(f"{kind} clause can only be used on doubles, was given {type_name(value)}")


def _en_us_fixed(number: float, precision: int) -> str:
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "∞" if number > 0 else "-∞"
    return f"{number:,.{precision}f}"


def _en_us_scientific(number: float) -> str:
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "∞" if number > 0 else "-∞"
    mantissa, _, exponent = f"{number:.{FORMAT_PRECISION}e}".partition("e")
    power = int(exponent)
    digits = f"{'-' if power < 0 else ''}{abs(power):02d}".translate(_SUPERSCRIPT)
    return f"{mantissa}{_NARROW_SPACE}\u00d7{_NARROW_SPACE}10{digits}"


def type_name(value: Any) -> str:
    """cel-go's type name of a value, as the formatter's errors name it."""
    if value is None:
        return "null_type"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes | bytearray):
        return "bytes"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, dt.timedelta):
        return "google.protobuf.Duration"
    if isinstance(value, dt.datetime):
        return "google.protobuf.Timestamp"
    descriptor = getattr(value, "DESCRIPTOR", None)
    return str(descriptor.full_name) if descriptor is not None else type(value).__name__


def format_value(value: Any) -> str:
    """%s: cel-go's FormatString (the value's string conversion; lists and maps spelled out
    as CEL literals)."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(_member(v) for v in value) + "]"
    if isinstance(value, dict):
        pairs = sorted((_key(k), _member(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, float):
        return go_general(value)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError as exc:
            raise _ClauseError("invalid UTF-8 in bytes, cannot convert to string") from exc
    if isinstance(value, dt.timedelta):
        return _duration_text(value)
    if isinstance(value, dt.datetime):
        return _timestamp_text(value)
    if type(value).__name__ == "Type" and callable(getattr(value, "name", None)):
        return str(value.name()).lower()  # a type value: its name, as upstream's %s
    raise _ClauseError(
        "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists,"
        f" types, durations, and timestamps, was given {type_name(value)}"
    )


def _member(value: Any) -> str:
    """A list element or map value, as clauseForType and quoteForCEL write it."""
    if isinstance(value, float):
        text = "NaN" if math.isnan(value) else f"{value:.{FORMAT_PRECISION}f}"
        if math.isinf(value):
            text = "+Inf" if value > 0 else "-Inf"
        return go_quote(text) if math.isnan(value) or math.isinf(value) else text
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, bytes | bytearray):
        return "b" + go_quote(format_value(value))
    if isinstance(value, dt.timedelta):
        return f"duration({go_quote(_duration_text(value))})"
    if isinstance(value, dt.datetime):
        return f"timestamp({go_quote(_timestamp_text(value))})"
    return format_value(value)


def _key(value: Any) -> str:
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, bool | int):
        return format_value(value)
    raise _ClauseError(f"no formatting function for map key of type {type_name(value)}")


def go_general(value: float) -> str:
    """Go's strconv.FormatFloat(value, 'g', -1, 64), CEL's double-to-string conversion: the
    shortest digits, in exponent form below 1e-4 and from 1e6 on."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign, digits, exponent = decimal.Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    point = len(digits) + int(exponent)  # digits before the decimal point
    power = point - 1
    prefix = "-" if sign else ""
    if text == "0":
        return prefix + "0"
    if power < -4 or power >= 6:  # Go: %e where the exponent is < -4 or >= 6 (shortest)
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{text}"
    if point >= len(text):
        return prefix + text + "0" * (point - len(text))
    return f"{prefix}{text[:point]}.{text[point:]}"


def _duration_text(value: dt.timedelta) -> str:
    """CEL's duration to string: seconds, Go's shortest 'f' form, and an s."""
    seconds = decimal.Decimal(value.days * 86400 + value.seconds) + decimal.Decimal(
        value.microseconds
    ) / decimal.Decimal(1_000_000)
    text = format(seconds.normalize(), "f")
    return f"{text}s"


def _timestamp_text(value: dt.datetime) -> str:
    """CEL's timestamp to string: RFC 3339 in UTC, fractional seconds without trailing zeros."""
    utc = value.astimezone(dt.UTC) if value.tzinfo else value
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond:06d}".rstrip("0")
    return text + "Z"


# --------------------------------------------------------------------------- regex (Kubernetes)


# RE2's error codes (re2/regexp.cc) in the words of Go's regexp/syntax, which was ported from it.
_GO_REGEXP_CODES: Final = {
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid named capture group": "invalid named capture",
    "pattern too large - compile failed": "expression too large",
}
RE2_PREFIX: Final = "invalid regular expression: "


def go_regexp_error(re2_message: str) -> str:
    """cel-cpp's ``invalid regular expression: <code>: <arg>`` as Go's regexp words it
    (``error parsing regexp: <code>: `<arg>```), the message upstream's users see."""
    text = re2_message.removeprefix(RE2_PREFIX)
    code, _, arg = text.partition(": ")
    code = _GO_REGEXP_CODES.get(code, code)
    return f"error parsing regexp: {code}: `{arg}`"


_RE2_OPTIONS: Final = re2.Options()
_RE2_OPTIONS.log_errors = False  # the error is raised, and worded for the pod; no stderr line


def _compiled(pattern: str) -> Any:
    try:
        return _regex(pattern)
    except re2.error as exc:
        raise CELFunctionError(go_regexp_error(_re2_message(exc))) from exc


_REGEX_CACHE: dict[str, Any] = {}


def _regex(pattern: str) -> Any:
    """RE2 itself (google-re2), as Go's regexp upstream: linear time in the text, RE2 syntax
    and leftmost-first matches, so ``find`` and ``matches`` agree on every pattern."""
    compiled = _REGEX_CACHE.get(pattern)
    if compiled is None:
        if len(_REGEX_CACHE) > 512:
            _REGEX_CACHE.clear()
        compiled = re2.compile(pattern, options=_RE2_OPTIONS)
        _REGEX_CACHE[pattern] = compiled
    return compiled


def _re2_message(exc: Exception) -> str:
    """RE2's ``<code>: <argument>`` (google-re2 raises it as bytes)."""
    (reason, *_) = exc.args or ("",)
    return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)


def _regex_cost(text: str, pattern: str) -> int:
    return math.ceil((1 + len(text)) * 0.1) * math.ceil(len(pattern) * 0.25)


def charge_regex(text: str, pattern: str) -> None:
    """The actual cost of ``find`` / ``findAll`` (Kubernetes' regex library)."""
    cost.charge(_regex_cost(text, pattern))


def find(text: str, pattern: str) -> str:
    """``find``: the first match, or "" (k8s.io/apiserver/pkg/cel/library/regex.go)."""
    cost.charge(_regex_cost(text, pattern))
    match = _compiled(pattern).search(text)
    return match.group(0) if match else ""


def find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    """``findAll``: every match (at most ``limit`` when it is not negative), as Go's
    ``FindAllString``."""
    cost.charge(_regex_cost(text, pattern))
    if limit == 0:
        return []
    found: list[str] = []
    for match in _compiled(pattern).finditer(text):
        found.append(match.group(0))
        if len(found) == limit:
            break
    return found


def check_regex(pattern: str) -> str | None:
    """Why *pattern* is not a valid RE2 expression (in RE2's words), or None."""
    try:
        _regex(pattern)
    except re2.error as exc:
        return _re2_message(exc)
    return None


STRING_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "charAt": char_at,
    "lowerAscii": lower_ascii,
    "upperAscii": upper_ascii,
    "trim": trim,
    "strings.quote": quote,
}

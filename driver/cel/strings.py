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
import math
import re
from collections.abc import Callable
from typing import Any, Final

from driver.cel import cost
from driver.cel.library import CELFunctionError, traversal_cost

# --------------------------------------------------------------------------- strings extension


def char_at(text: str, index: int) -> str:
    cost.charge(1)  # upstream has no size-dependent cost for charAt
    if index < 0 or index > len(text):
        raise CELFunctionError(f"index out of range: {index}")
    return text[index : index + 1]


def index_of(text: str, sub: str, offset: int = 0) -> int:
    cost.charge(traversal_cost(text))
    if offset < 0 or offset > len(text):
        raise CELFunctionError(f"index out of range: {offset}")
    return text.find(sub, offset)


def last_index_of(text: str, sub: str, offset: int | None = None) -> int:
    cost.charge(traversal_cost(text))
    if offset is None:
        return text.rfind(sub)
    if offset < 0 or (offset >= max(len(text), 1) and not (offset == 0 and not text)):
        raise CELFunctionError(f"index out of range: {offset}")
    return text.rfind(sub, 0, offset + len(sub))


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
    cost.charge_traversal(len(text))
    stop = len(text) if end is None else end
    if start < 0 or start > len(text):
        raise CELFunctionError(f"index out of range: {start}")
    if stop < 0 or stop > len(text):
        raise CELFunctionError(f"index out of range: {stop}")
    if start > stop:
        raise CELFunctionError(f"invalid substring range. start: {start}, end: {stop}")
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


_QUOTE_ESCAPES: Final = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


# --------------------------------------------------------------------------- format


_CLAUSE: Final = re.compile(r"%(?:\.(\d+))?([a-zA-Z%])")


def format_string(template: str, args: list[Any]) -> str:
    """``"...".format([args])``: %s %d %f %e %b %o %x %X and %%; precision as ``%.3f``."""
    cost.charge_traversal(len(template))
    out: list[str] = []
    pos = 0
    used = 0
    for match in _CLAUSE.finditer(template):
        out.append(template[pos : match.start()])
        pos = match.end()
        precision, verb = match.group(1), match.group(2)
        if verb == "%":
            out.append("%")
            continue
        if used >= len(args):
            raise CELFunctionError(
                f"index {used} out of range"
                if args
                else f'could not format "{template}": not enough arguments'
            )
        value = args[used]
        used += 1
        out.append(_format_clause(verb, precision, value))
    out.append(template[pos:])
    if used < len(args):
        raise CELFunctionError(f"too many arguments supplied to string.format (expected {used})")
    return "".join(out)


def _format_clause(verb: str, precision: str | None, value: Any) -> str:
    if verb == "s":
        return to_cel_string(value)
    if verb == "d":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CELFunctionError(
                "error during formatting: decimal clause can only be used on integers, "
                f"was given {_kind(value)}"
            )
        if isinstance(value, float):
            if math.isnan(value):
                return "NaN"
            if math.isinf(value):
                return "Infinity" if value > 0 else "-Infinity"
            raise CELFunctionError(
                "error during formatting: decimal clause can only be used on integers, "
                "was given double"
            )
        return str(value)
    if verb in "fe":
        if isinstance(value, bool) or not isinstance(value, int | float):
            kind = "fixed-point" if verb == "f" else "scientific"
            raise CELFunctionError(
                f"error during formatting: {kind} clause can only be used on doubles, "
                f"was given {_kind(value)}"
            )
        number = float(value)
        if math.isnan(number):
            return "NaN"
        if math.isinf(number):
            return "Infinity" if number > 0 else "-Infinity"
        digits = 6 if precision is None else int(precision)
        return f"{number:.{digits}{verb}}"
    if verb in "boxX":
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, str | bytes | bytearray) and verb in "xX":
            raw = value.encode() if isinstance(value, str) else bytes(value)
            text = raw.hex()
            return text.upper() if verb == "X" else text
        if not isinstance(value, int):
            raise CELFunctionError(
                "error during formatting: only integers and bools can be formatted as "
                f"{verb}, was given {_kind(value)}"
            )
        sign = "-" if value < 0 else ""
        body = format(abs(value), {"b": "b", "o": "o", "x": "x", "X": "X"}[verb])
        return sign + body
    raise CELFunctionError(
        f'could not parse formatting clause: unrecognized formatting clause "{verb}"'
    )


def _kind(value: Any) -> str:
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
    return type(value).__name__


def to_cel_string(value: Any) -> str:
    """``%s``: the value as CEL's ``string()`` would show it (lists and maps spelled out)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    if isinstance(value, float):
        return _double_text(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, list):
        return "[" + ", ".join(_quoted(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(((_quoted(k), _quoted(v)) for k, v in value.items()))
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
        return f"{seconds:g}s"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    raise CELFunctionError(f"error during formatting: no formatting for {_kind(value)}")


def _quoted(value: Any) -> str:
    return quote_plain(value) if isinstance(value, str) else to_cel_string(value)


def quote_plain(text: str) -> str:
    return '"' + "".join(_QUOTE_ESCAPES.get(ch, ch) for ch in text) + '"'


def _double_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value).removesuffix(".0")


# --------------------------------------------------------------------------- regex (Kubernetes)


def _compiled(pattern: str) -> re.Pattern[str]:
    try:
        return _regex(pattern)
    except re.error as exc:
        raise CELFunctionError(f"invalid regular expression: {exc}") from exc


_REGEX_CACHE: dict[str, re.Pattern[str]] = {}


def _regex(pattern: str) -> re.Pattern[str]:
    compiled = _REGEX_CACHE.get(pattern)
    if compiled is None:
        if len(_REGEX_CACHE) > 512:
            _REGEX_CACHE.clear()
        compiled = re.compile(translate_re2(pattern))
        _REGEX_CACHE[pattern] = compiled
    return compiled


def translate_re2(pattern: str) -> str:
    """RE2 syntax -> Python ``re`` for what selectors use (``\\z`` is ``\\Z`` in Python);
    RE2 has no backreferences or lookaround, which Python would accept: refuse them."""
    if re.search(r"\\[1-9]|\(\?[=!<]", pattern):
        raise re.error("RE2 does not support backreferences or lookaround")
    return pattern.replace("\\z", "\\Z")


def _regex_cost(text: str, pattern: str) -> int:
    return math.ceil((1 + len(text)) * 0.1) * math.ceil(len(pattern) * 0.25)


def find(text: str, pattern: str) -> str:
    """``find``: the first match, or "" (k8s.io/apiserver/pkg/cel/library/regex.go)."""
    cost.charge(_regex_cost(text, pattern))
    match = _compiled(pattern).search(text)
    return match.group(0) if match else ""


def find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    """``findAll``: every match (at most ``limit`` when it is not negative)."""
    cost.charge(_regex_cost(text, pattern))
    if limit == 0:
        return []
    found = [m.group(0) for m in _compiled(pattern).finditer(text)]
    return found if limit < 0 else found[:limit]


def check_regex(pattern: str) -> str | None:
    """Why *pattern* is not a valid regular expression, or None (for the compile-time check
    of constant patterns that upstream's ``ValidateRegexLiterals`` does)."""
    try:
        _regex(pattern)
    except re.error as exc:
        return str(exc)
    return None


STRING_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "charAt": char_at,
    "lowerAscii": lower_ascii,
    "upperAscii": upper_ascii,
    "trim": trim,
    "strings.quote": quote,
}

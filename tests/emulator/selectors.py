"""Label and field selectors with the API server's grammar and per-kind field tables.

* Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``,
  ``!k``, ``k>1``, ``k<1``, comma separated (all must hold). Malformed text raises a 400.
* Field selectors: ``f=v``, ``f==v``, ``f!=v`` with ``\\`` escapes, limited to the fields the
  kind supports (``Kind.field_labels``); anything else is a 400 like
  ``field label not supported: spec.pool.name``.

Both compile once into an immutable matcher that takes a raw JSON object.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tests.emulator.errors import bad_request
from tests.emulator.kinds import Kind

_KEY: Final = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE: Final = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in {"=", "in"}:
            return present and value in self.values
        if self.op in {"!=", "notin"}:
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if not present:
            return False
        try:
            number = int(str(value))
        except ValueError:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == "gt" else number < bound


@dataclass(frozen=True, slots=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in self.requirements)


_TOKEN: Final = re.compile(r"\s*(!=|==|=|!|\(|\)|,|>|<|[^\s!=(),<>]+)")


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            break
        tokens.append(match.group(1))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


def _check_key(key: str, text: str) -> str:
    name = key.rsplit("/", 1)[-1]
    if not _KEY.match(key) or len(name) > 63:
        raise bad_request(
            f"unable to parse requirement: found '{key}', expected: valid label key ({text!r})"
        )
    return key


def _check_value(value: str, text: str) -> str:
    if not _VALUE.match(value) or len(value) > 63:
        raise bad_request(f"unable to parse requirement: invalid label value: {value!r} ({text!r})")
    return value


def parse_label_selector(text: str) -> LabelSelector:
    """Parse ``labelSelector``; raises a 400 ApiStatusError on bad syntax."""
    tokens = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def fail(found: str, expected: str) -> Exception:
        return bad_request(f"unable to parse requirement: found '{found}', expected: {expected}")

    while i < len(tokens):
        tok = tokens[i]
        if tok == "!":
            if i + 1 >= len(tokens):
                raise fail("", "identifier after '!'")
            reqs.append(Requirement(_check_key(tokens[i + 1], text), "!", ()))
            i += 2
        else:
            key = _check_key(tok, text)
            i += 1
            op = tokens[i] if i < len(tokens) else ","
            if op == ",":
                reqs.append(Requirement(key, "exists", ()))
            elif op in {"=", "==", "!="}:
                value = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] != "," else ""
                if value:
                    i += 1
                reqs.append(
                    Requirement(key, "!=" if op == "!=" else "=", (_check_value(value, text),))
                )
                i += 1
            elif op in {">", "<"}:
                if i + 1 >= len(tokens) or not re.fullmatch(r"-?\d+", tokens[i + 1]):
                    raise fail(tokens[i + 1] if i + 1 < len(tokens) else "", "integer value")
                reqs.append(Requirement(key, "gt" if op == ">" else "lt", (tokens[i + 1],)))
                i += 2
            elif op in {"in", "notin"}:
                i += 1
                if i >= len(tokens) or tokens[i] != "(":
                    raise fail(tokens[i] if i < len(tokens) else "", "'(' after set operator")
                i += 1
                values: list[str] = []
                while True:
                    if i >= len(tokens):
                        raise fail("", "')'")
                    if tokens[i] == ")":
                        i += 1
                        break
                    if tokens[i] == ",":
                        i += 1
                        continue
                    values.append(_check_value(tokens[i], text))
                    i += 1
                if not values:
                    raise bad_request(
                        f"unable to parse requirement: for 'in', 'notin' operators, values set "
                        f"can't be empty ({text!r})"
                    )
                reqs.append(Requirement(key, op, tuple(values)))
            else:
                raise fail(op, "one of: '=', '==', '!=', 'in', 'notin', ',', '>', '<'")
        if i < len(tokens):
            if tokens[i] != ",":
                raise fail(tokens[i], "','")
            i += 1
            if i >= len(tokens):
                raise fail("", "identifier after ','")
    return LabelSelector(tuple(reqs))


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    value: str
    negate: bool


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...]

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for req in self.requirements:
            actual = field_value(obj, req.field)
            if (actual == req.value) == req.negate:
                return False
        return True

    def value_of(self, field: str) -> str | None:
        """The value of an equality term on ``field``, or None."""
        for req in self.requirements:
            if req.field == field and not req.negate:
                return req.value
        return None


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(value: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] == "\\":
            if i + 1 >= len(value) or value[i + 1] not in "\\,=":
                raise bad_request(f"invalid field selector: invalid escape sequence in {value!r}")
            out.append(value[i + 1])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def parse_field_selector(text: str, kind: Kind) -> FieldSelector:
    """Parse ``fieldSelector`` against the kind's field table; raises 400 otherwise."""
    reqs: list[FieldRequirement] = []
    for raw in _split_unescaped(text, ","):
        term = raw.strip()
        if not term:
            continue
        for op in ("!=", "==", "="):
            idx = _find_unescaped(term, op)
            if idx >= 0:
                name, value = term[:idx].strip(), term[idx + len(op) :]
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        if name not in kind.field_labels:
            raise bad_request(f"field label not supported: {name}")
        reqs.append(FieldRequirement(name, _unescape(value), op == "!="))
    return FieldSelector(tuple(reqs))


def _find_unescaped(text: str, op: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(op, i):
            return i
        i += 1
    return -1


def _bool_text(value: Any) -> str:
    return "true" if value else "false"


_SPECIAL: Final[dict[str, Callable[[Mapping[str, Any]], str]]] = {
    "spec.hostNetwork": lambda o: _bool_text(
        ((o.get("spec") or {}).get("securityContext") or {}).get("hostNetwork")
        or (o.get("spec") or {}).get("hostNetwork")
    ),
    "spec.unschedulable": lambda o: _bool_text((o.get("spec") or {}).get("unschedulable")),
    "source": lambda o: str(((o.get("source") or {}).get("component")) or ""),
}


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string value of a dotted field path (missing fields read as ``""``)."""
    if path in _SPECIAL:
        return _SPECIAL[path](obj)
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping):
            return ""
        current = current.get(part)
    if current is None:
        return ""
    if isinstance(current, bool):
        return _bool_text(current)
    return str(current)

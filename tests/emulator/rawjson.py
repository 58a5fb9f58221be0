"""The bytes of a ResourceClaim's opaque ``parameters``, as the real API server holds them.

The server keeps each ``status.allocation.devices.config[].opaque.parameters`` (a
``runtime.RawExtension``) as the bytes the writer sent, and ``status.allocation`` may not be
modified once set: equal values in other bytes are a modification (422 "field cannot be
modified once set"). A PUT sends its own bytes; a patch is applied to the stored object as
Go re-encodes it: a merge or JSON patch compacts the stored bytes (``<``, ``>``, ``&``,
U+2028, U+2029 escaped), a strategic merge patch goes through a map (keys sorted, whole
numbers as integers). So a writer whose bytes are not in that form can no longer write the
status of the claim except to deallocate it.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from kubeapi import codec

#: A claim's parameters in ``config`` order (None for an entry without them).
Raw = list[bytes | None]

_DECODER: Final = json.JSONDecoder()
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
_GO_ESCAPES: Final = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}
_GO_ESCAPES.update({"\u2028": "\\u2028", "\u2029": "\\u2029"})
STRATEGIC: Final = "application/strategic-merge-patch+json"


def parameters(claim: Any) -> list[Any]:
    """The decoded parameters of a claim's allocation, aligned with :data:`Raw`."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    config = (allocation.get("devices") or {}).get("config") or []
    return [(c.get("opaque") or {}).get("parameters") for c in config if isinstance(c, dict)]


def stored_form(claim: Any) -> Raw:
    """The bytes of a claim whose writer's bytes are unknown: Go's form."""
    return [None if p is None else codec.dumps(p) for p in parameters(claim)]


def sent(body: bytes, decoded: Any = None) -> Raw | None:
    """The parameters' bytes exactly as a request body carries them; None when it has no
    allocation (or nests deeper than this reader goes). ``decoded``: the body as decoded
    (the last of duplicate keys kept, as here), which answers without reading the text when
    the allocation has no ``config`` (reading it decodes every member again: 43 us a claim),
    or when the body is the decoded value's compact encoding (:func:`kubeapi.codec.dumps`,
    as Go and this project's clients write it: each parameter's bytes are then its own
    compact encoding; 5 us a claim)."""
    if decoded is not None:
        node = decoded
        for key in ("status", "allocation", "devices"):
            node = node.get(key) if isinstance(node, dict) else None
            if node is None:
                return None if key != "devices" else []
        if not isinstance(node, dict) or node.get("config") is None:
            return []
        config = node["config"]
        if isinstance(config, list) and codec.dumps(decoded) == body:
            out: Raw = []
            for item in config:
                if isinstance(item, dict):
                    opaque = item.get("opaque")
                    params = opaque.get("parameters") if isinstance(opaque, dict) else None
                    out.append(None if params is None else codec.dumps(params))
            return out
    try:
        text = body.decode()
        span = (_skip(text, 0), len(text))
        for key in ("status", "allocation", "devices"):
            found = _member(text, span[0], key)
            if found is None or text.startswith("null", found[0]):
                return None if key != "devices" else []
            span = found
        found = _member(text, span[0], "config")
        if found is None or text.startswith("null", found[0]):
            return []
        out = []
        for item in _items(text, found[0]):
            if text[item[0]] != "{":
                continue
            opaque = _member(text, item[0], "opaque")
            params = None if opaque is None else _member(text, opaque[0], "parameters")
            if params is None or text.startswith("null", params[0]):
                out.append(None)
            else:
                out.append(text[params[0] : params[1]].encode())
    except (RecursionError, ValueError, IndexError):
        return None
    return out


def reencoded(raw: Raw, content_type: str) -> Raw:
    """The stored bytes after the server applied a patch of ``content_type`` to them."""
    return [None if b is None else _reencode(b, content_type) for b in raw]


def _reencode(raw: bytes, content_type: str) -> bytes:
    if content_type == STRATEGIC:
        try:
            return codec.dumps(_whole_numbers(codec.loads(raw)))
        except RecursionError:
            return codec.dumps(codec.loads(raw))
    out: list[str] = []
    in_string = escaped = False
    for char in raw.decode():
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            out.append(_GO_ESCAPES.get(char, char))
        elif char == '"':
            in_string = True
            out.append(char)
        elif char not in " \t\n\r":
            out.append(char)
    return "".join(out).encode()


def _whole_numbers(value: Any) -> Any:
    """Go's JSON decoder into a map gives a whole number an integer (``1.0`` is ``1``)."""
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


def _value(text: str, i: int) -> tuple[int, int]:
    start = _skip(text, i)
    _, end = _DECODER.raw_decode(text, start)
    return start, end


def _member(text: str, i: int, key: str) -> tuple[int, int] | None:
    """The span of member ``key`` (the last, as Go's decoder keeps it) of the object at i."""
    if text[i] != "{":
        return None
    found = None
    i = _skip(text, i + 1)
    while text[i] != "}":
        name, i = _scanstring(text, i + 1, True)
        i = _skip(text, i) + 1  # past ':'
        span = _value(text, i)
        if name == key:
            found = span
        i = _skip(text, span[1])
        if text[i] == ",":
            i = _skip(text, i + 1)
    return found


def _items(text: str, i: int) -> list[tuple[int, int]]:
    """The spans of the items of the array at i."""
    if text[i] != "[":
        return []
    spans = []
    i = _skip(text, i + 1)
    while text[i] != "]":
        span = _value(text, i)
        spans.append(span)
        i = _skip(text, span[1])
        if text[i] == ",":
            i = _skip(text, i + 1)
    return spans

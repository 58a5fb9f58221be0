"""JSON text <-> data for everything the API server accepts, at any nesting depth.

The API server accepts objects nested up to Go's decoder limit (10,000 levels) within its size
limits: a ResourceClaim's opaque ``parameters`` (10 KiB) alone can nest about 5,000 deep.
Python's recursive codecs stop far earlier (``json`` raises ``RecursionError`` near 1,000
levels), and a decode failure on a list page or watch line would take every object of it
with it. So:

* :func:`loads` decodes with ``msgspec`` (C, the fast path: 2.5-3x ``json`` on watch events,
  ``python -m bench.codec``), and whatever it refuses (nesting past the recursion limit, a
  number out of a float's range, a lone surrogate, ``NaN``) with ``json``, which gives the
  same values wherever both accept the text; for text nested too deep for ``json`` too, it
  falls back to an iterative decoder with the same semantics (the last of duplicate keys
  wins, integers of any size stay integers). It raises ``ValueError`` only for text that is
  not JSON. (``orjson``, as fast, was not taken: it turns integers past 64 bits into floats,
  which would change opaque parameters a claim carries, and refuses to encode them.)
* :func:`dumps` encodes compactly (``msgspec``; ``json`` for what it refuses, iteratively when
  the data nests too deep for both) in
  the form Go's ``encoding/json`` gives a map (keys sorted, UTF-8, and ``<``, ``>``, ``&``,
  U+2028, U+2029 escaped as ``\\u003c``, ...): the API server keeps a claim's opaque
  ``parameters`` as the bytes the writer sent and compares them byte for byte, and a status
  write whose ``status.allocation`` differs is refused (422 "field cannot be modified once
  set"). A patch of the status by anyone (an attaching driver reporting ``status.devices``)
  is applied to the stored object as Go re-encodes it (a strategic merge patch, as
  kube-scheduler unreserves, from a map: keys sorted), and a PUT of ours re-sends what we
  decoded: both leave the bytes unchanged only when they are already in this form. Floats
  are written shortest-first as Go writes them below 1e16 (``0.5``, ``0.00001``, ``1e-7``),
  not at or above it (``1e16`` where Go writes ``10000000000000000``, ``1e21`` for its
  ``1e+21``); an API object carries no such float but in free-form parameters;
* :func:`loads_list` decodes a list page as :func:`loads` does, except that each item that
  decodes as a given ``msgspec`` type (a ``Struct`` describing the common form of an object)
  is handed over as that, in a :class:`Typed` beside its own text: a reader turns it into its
  model without the intermediate dicts (decoding and freeing them cost about as much as
  reading them: 0.9 of 1.9 CPU s for the slices of 10,000 mixed nodes), and reads the text
  with :func:`loads` wherever the typed form does not decide (``bench.startup``);
* :func:`copy` deep-copies and :func:`equal` compares JSON data, iteratively when it nests
  too deep for recursion.

Pure: no I/O. Readers of the decoded data that walk it recursively must bound its depth first
(:func:`driver.api.model.json_depth`); the core does so where it reads free-form fields
(opaque parameters).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Final, Generic, TypeVar

import msgspec

#: The standard decoder's string scanner (C): typeshed does not list it.
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")
_NUMBER: Final = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_CONSTANTS: Final[tuple[tuple[str, Any], ...]] = (
    ("null", None),
    ("true", True),
    ("false", False),
)


_DECODER: Final = msgspec.json.Decoder()
_ENCODER: Final = msgspec.json.Encoder(order="sorted")


def loads(data: bytes | str) -> Any:
    """The JSON value of ``data`` at any depth; ``ValueError`` when it is not JSON."""
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        pass  # what msgspec refuses (module docstring), json decides
    try:
        return json.loads(data)
    except RecursionError:
        pass
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"not UTF-8: {exc}") from exc
    else:
        text = data
    return _decode(text)


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Typed(Generic[_T]):
    """A list item :func:`loads_list` decoded as the type it was asked for, with the item's
    own JSON text (``loads(text)`` is what :func:`loads` gives for the item)."""

    value: _T
    text: msgspec.Raw


class _RawList(msgspec.Struct):
    """A list page with its items left as their text (unknown members ignored: the readers
    of a page read its ``metadata`` and ``items`` alone)."""

    items: list[msgspec.Raw] | msgspec.UnsetType | None = msgspec.UNSET
    metadata: dict[str, Any] | msgspec.UnsetType | None = msgspec.UNSET


_RAW_LIST: Final = msgspec.json.Decoder(_RawList)
_ITEM_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {}


def loads_list(data: bytes, item_type: type[_T]) -> Any:
    """The ``metadata`` and ``items`` of the list page ``data`` as :func:`loads` decodes them
    (``ValueError`` when it is not JSON; the page's other members are left out), except that
    each item that decodes as ``item_type`` is a :class:`Typed` of it instead of its dicts. A
    page that is not the usual object (items a list, metadata an object) is decoded by
    :func:`loads` whole; each item that ``item_type`` refuses, by :func:`loads` alone."""
    try:
        page = _RAW_LIST.decode(data)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        return loads(data)  # not a page of the usual form: as loads reads it, or ValueError
    decoder = _ITEM_DECODERS.get(item_type)
    if decoder is None:
        decoder = _ITEM_DECODERS[item_type] = msgspec.json.Decoder(item_type)
    out: dict[str, Any] = {}
    if page.metadata is not msgspec.UNSET:
        out["metadata"] = page.metadata
    if page.items is None or page.items is msgspec.UNSET:
        if page.items is None:
            out["items"] = None
        return out
    items: list[Any] = []
    for text in page.items:
        try:
            items.append(Typed(decoder.decode(text), text))
        except (msgspec.DecodeError, RecursionError, UnicodeError):
            items.append(loads(bytes(text)))
    out["items"] = items
    return out


def _skip(text: str, i: int) -> int:
    match = _WHITESPACE.match(text, i)
    return match.end() if match else i


def _key(text: str, i: int) -> tuple[str, int]:
    """An object key and its colon at ``i``: the key and the index of its value."""
    if text[i : i + 1] != '"':
        raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
    key, i = _scanstring(text, i + 1, True)
    i = _skip(text, i)
    if text[i : i + 1] != ":":
        raise json.JSONDecodeError("Expecting ':' delimiter", text, i)
    return key, _skip(text, i + 1)


def _scalar(text: str, i: int) -> tuple[Any, int]:
    char = text[i : i + 1]
    if char == '"':
        return _scanstring(text, i + 1, True)
    for word, value in _CONSTANTS:
        if text.startswith(word, i):
            return value, i + len(word)
    match = _NUMBER.match(text, i)
    if match is None:
        raise json.JSONDecodeError("Expecting value", text, i)
    integer, fraction, exponent = match.groups()
    if fraction or exponent:
        return float(integer + (fraction or "") + (exponent or "")), match.end()
    return int(integer), match.end()


def _decode(text: str) -> Any:
    """Iterative JSON decoding: an explicit stack of open containers instead of recursion."""
    # Each open container with the key its next value goes under (None for arrays).
    stack: list[tuple[dict[str, Any] | list[Any], list[str | None]]] = []
    i = _skip(text, 0)
    while True:
        char = text[i : i + 1]
        value: Any
        if char == "{":
            i = _skip(text, i + 1)
            if text[i : i + 1] != "}":
                key, i = _key(text, i)
                stack.append(({}, [key]))
                continue
            value, i = {}, i + 1
        elif char == "[":
            i = _skip(text, i + 1)
            if text[i : i + 1] != "]":
                stack.append(([], [None]))
                continue
            value, i = [], i + 1
        else:
            value, i = _scalar(text, i)
        while True:  # hand the value to its container; close the containers that end here
            if not stack:
                i = _skip(text, i)
                if i != len(text):
                    raise json.JSONDecodeError("Extra data", text, i)
                return value
            container, slot = stack[-1]
            if isinstance(container, dict):
                container[str(slot[0])] = value
            else:
                container.append(value)
            i = _skip(text, i)
            char = text[i : i + 1]
            if char == ",":
                i = _skip(text, i + 1)
                if isinstance(container, dict):
                    slot[0], i = _key(text, i)
                break
            if char != ("}" if isinstance(container, dict) else "]"):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
            stack.pop()
            value, i = container, i + 1


#: What Go's encoder escapes and ``json`` leaves alone; they occur only in strings.
_GO_ESCAPES: Final = str.maketrans(
    {
        "<": "\\u003c",
        ">": "\\u003e",
        "&": "\\u0026",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)


#: The same, as UTF-8 bytes, for what msgspec wrote: ``(probe, char, escaped)``, where the
#: probe finds ``char`` in the text by ``probe in text``: a single byte's probe is its value,
#: which ``bytes.__contains__`` looks for at once (given ``bytes``, it first tries to read
#: them as an integer and clears that error: 0.15 of 0.18 us a search).
_GO_ESCAPED_BYTES: Final = tuple(
    (char[0] if len(char) == 1 else char, char, escaped)
    for char, escaped in (
        (char.encode(), escaped.encode())
        for char, escaped in (
            ("<", "\\u003c"),
            (">", "\\u003e"),
            ("&", "\\u0026"),
            ("\u2028", "\\u2028"),
            ("\u2029", "\\u2029"),
        )
    )
)


#: Those of them that are ASCII.
_ASCII_ESCAPED_BYTES: Final = tuple(entry for entry in _GO_ESCAPED_BYTES if entry[1].isascii())


def dumps(value: Any) -> bytes:
    """Compact JSON (``separators=(",", ":")``, keys sorted, UTF-8, ``<>&`` and U+2028/9
    escaped as Go escapes them) of ``value`` at any depth: decoding and encoding it again
    gives the same bytes, here and in Go."""
    try:
        data = _ENCODER.encode(value)
    except (msgspec.EncodeError, TypeError, RecursionError):
        pass  # keys that are not strings, nesting past the recursion limit
    else:
        # U+2028 and U+2029 only where the text is not ASCII (one C pass, ~0.1 us a claim:
        # searching each encoded body for their three-byte sequences cost more than the
        # encoding itself); ``<``, ``>`` and ``&`` each by one byte search.
        escapes = _GO_ESCAPED_BYTES if not data.isascii() else _ASCII_ESCAPED_BYTES
        for probe, char, escaped in escapes:
            if probe in data:
                data = data.replace(char, escaped)
        return data
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    except RecursionError:
        text = _encode(value)
    return text.translate(_GO_ESCAPES).encode()


def _encode(value: Any) -> str:
    """Iterative encoding (keys sorted): a stack of the open containers, each with an
    iterator over its members and how many it has written."""
    out: list[str] = []
    stack: list[tuple[str, Iterator[Any], bool, list[int]]] = []
    item: Any = value
    while True:
        if isinstance(item, dict):
            out.append("{")
            stack.append(("}", iter(sorted(item.items())), True, [0]))
        elif isinstance(item, (list, tuple)):
            out.append("[")
            stack.append(("]", iter(item), False, [0]))
        else:
            out.append(json.dumps(item, ensure_ascii=False))
        while stack:  # the next member of the innermost open container, closing finished ones
            closer, members, is_object, written = stack[-1]
            member: Any = next(members, _END)
            if member is _END:
                out.append(closer)
                stack.pop()
                continue
            if written[0]:
                out.append(",")
            written[0] += 1
            if is_object:
                name, item = member
                out.append(encode_basestring(str(name)) + ":")
            else:
                item = member
            break
        else:
            return "".join(out)


_END: Final = object()


def copy(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars) at any depth."""
    try:
        return _copy(value)
    except RecursionError:
        return loads(dumps(value))


def _copy(value: Any) -> Any:
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy(v) for v in value]
    return value


def equal(a: Any, b: Any) -> bool:
    """``a == b`` for JSON data at any depth."""
    try:
        return bool(a == b)
    except RecursionError:
        pass
    pairs: list[tuple[Any, Any]] = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            pairs.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return False
            pairs.extend(zip(x, y, strict=True))
        elif isinstance(x, (dict, list)) or isinstance(y, (dict, list)) or x != y:
            return False
    return True

"""kubeapi.codec: JSON at any depth the API server accepts, with the standard library's
semantics (its iterative decoder and encoder agree with ``json`` wherever ``json`` works)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from driver.api.model import json_depth
from kubeapi import codec

_json: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)


@given(_json)
def test_the_iterative_codec_agrees_with_json(value: Any) -> None:
    text = json.dumps(value)
    assert codec._decode(text) == json.loads(text)
    compact = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    assert codec._encode(value) == compact
    assert codec.copy(value) == value


@given(_json)
def test_the_fast_path_decodes_as_json_does(value: Any) -> None:
    """msgspec decodes what it accepts to what ``json`` gives (integers of any size, the last
    of duplicate keys); the text it refuses goes to ``json``."""
    text = json.dumps(value)
    assert codec.loads(text.encode()) == json.loads(text)
    assert codec.loads(text) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',
        "[123456789012345678901234567890, -9223372036854775809]",
        "[1e400, -1e400, NaN, Infinity]",
        '["\\ud800", "\\udc00x"]',
    ],
)
def test_what_msgspec_refuses_or_reads_otherwise_decodes_as_json_does(text: str) -> None:
    expected = json.loads(text)
    assert repr(codec.loads(text)) == repr(expected)
    assert repr(codec.loads(text.encode("utf-8", "surrogatepass"))) == repr(expected)


@given(_json)
def test_encoding_is_a_fixed_point(value: Any) -> None:
    """What was written decodes and encodes to the same bytes: a claim's opaque parameters
    are compared byte for byte by the API server on every status write."""
    written = codec.dumps(value)
    assert codec.dumps(codec.loads(written)) == written


def test_encoding_is_what_go_writes_for_a_map() -> None:
    """Keys sorted, UTF-8, and what Go's encoding/json escapes (HTML characters, U+2028,
    U+2029) escaped as it does, so that the API server's own re-encoding of stored opaque
    parameters (a merge or strategic merge patch of the status) leaves them unchanged."""
    value = {"b": 1.5, "a": ["x&y<z>", "é", "\u2028\u2029", "\b\n\x01"]}
    expected = '{"a":["x\\u0026y\\u003cz\\u003e","é","\\u2028\\u2029","\\b\\n\\u0001"],"b":1.5}'
    assert codec.dumps(value) == expected.encode()


@given(st.text(alphabet=st.sampled_from('<>&\u2028\u2029aé\n"'), max_size=12))
def test_escapes_are_written_as_the_standard_path_writes_them(text: str) -> None:
    """The escapes msgspec's text gets (by byte probes, ASCII text or not) are those of the
    ``json`` path, which translates the whole text."""
    value = {"k": text, text: [text, "plain"]}
    standard = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    assert codec.dumps(value) == standard.translate(codec._GO_ESCAPES).encode()


@pytest.mark.parametrize("levels", [999, 1_000, 10_000])
def test_any_nesting_the_api_server_accepts_decodes(levels: int) -> None:
    text = '{"a":' * levels + "[1, 2.5e3, true, null]" + "}" * levels
    value = codec.loads(text.encode())
    assert json_depth(value, 20_000) == levels + 1
    assert codec.loads(codec.dumps(value)) is not None
    copied = codec.copy(value)
    assert codec.equal(copied, value)
    assert codec.dumps(copied) == codec.dumps(value)


def test_integers_past_64_bits_stay_integers() -> None:
    deep = "[" * 2_000 + str(10**30) + "]" * 2_000
    value = codec.loads(deep)
    for _ in range(2_000):
        value = value[0]
    assert value == 10**30


@pytest.mark.parametrize(
    "text", ["1 2", "[", "[1,]", '{"a"}', '{"a":1,}', "[1] x", "nul", "{1:2}", b"\xff"]
)
def test_what_is_not_json_is_a_value_error(text: str | bytes) -> None:
    deep = text if isinstance(text, bytes) else "[" * 2_000 + text + "]" * 2_000
    with pytest.raises(ValueError):
        codec.loads(deep)


def test_equal_tells_deep_values_apart() -> None:
    a = codec.loads("[" * 3_000 + "1" + "]" * 3_000)
    b = codec.loads("[" * 3_000 + "2" + "]" * 3_000)
    assert not codec.equal(a, b)
    assert codec.equal(a, codec.copy(a))

"""Strict field checks, like ``kubectl``'s server-side field validation: every field of an
object must exist in its kind's schema, with a value of the right shape.

The schema is ``fields.json`` beside this module, generated from the official Kubernetes
OpenAPI schemas (``python -m tests.gen_field_schema``; the test suite fails when it is
stale). :func:`check_object` raises :class:`~driver.api.errors.ManifestError` with the field's
path and, for an unknown field, the known field it most resembles::

    spec.containers[0].resources.limit: unknown field; did you mean limits?

Kinds the schema does not cover are not checked here (the caller decides what to do with
them). ``null`` is accepted for every field, as the API server accepts it, but not as a list
item. Pure; nothing is mutated.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, Final

from driver.api.errors import ManifestError

_SCALARS: Final[Mapping[str, tuple[str, tuple[type, ...]]]] = {
    "s": ("a string", (str,)),
    "i": ("an integer", (int,)),
    "n": ("a number", (int, float)),
    "b": ("a boolean", (bool,)),
    "q": ("a quantity (string or number)", (str, int, float)),
}


@cache
def _schema() -> dict[str, Any]:
    text = resources.files("biaxial.simulate").joinpath("fields.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def known(api_version: str, kind: str) -> bool:
    """Whether the schema covers this apiVersion and kind."""
    return f"{api_version}/{kind}" in _schema()["roots"]


def kinds() -> frozenset[tuple[str, str]]:
    """Every (apiVersion, kind) the schema covers."""
    pairs = (str(k).rsplit("/", 1) for k in _schema()["roots"])
    return frozenset((api_version, kind) for api_version, kind in pairs)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check(value: Any, node: Any, path: str, defs: Mapping[str, Any]) -> None:
    while isinstance(node, str) and node.startswith("#"):
        node = defs[node[1:]]
    if value is None or node == "*":
        return
    if isinstance(node, str):
        what, types = _SCALARS[node]
        if not isinstance(value, types) or (node != "b" and isinstance(value, bool)):
            raise ManifestError(f"{path}: expected {what}, got {_type_name(value)}")
        return
    if "o" in node:
        if not isinstance(value, dict):
            raise ManifestError(f"{path or 'object'}: expected an object, got {_type_name(value)}")
        fields = node["o"]
        for key, item in value.items():
            sub = fields.get(key)
            if sub is None:
                where = _join(path, str(key))
                guess = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
                hint = f"; did you mean {guess[0]}?" if guess else ""
                raise ManifestError(f"{where}: unknown field{hint}")
            _check(item, sub, _join(path, key), defs)
        return
    if "m" in node:
        if not isinstance(value, dict):
            raise ManifestError(f"{path}: expected an object, got {_type_name(value)}")
        for key, item in value.items():
            if not isinstance(key, str):
                raise ManifestError(f"{path}: keys must be strings, got {key!r}")
            _check(item, node["m"], f"{path}[{key}]", defs)
        return
    if "a" in node:
        if not isinstance(value, list):
            raise ManifestError(f"{path}: expected a list, got {_type_name(value)}")
        for index, item in enumerate(value):
            if item is None:
                raise ManifestError(f"{path}[{index}]: a list item must not be null")
            _check(item, node["a"], f"{path}[{index}]", defs)
        return
    values = node["e"]
    if value not in values:
        raise ManifestError(f"{path}: unsupported value {value!r} (supported: {', '.join(values)})")


def check_object(obj: Mapping[str, Any]) -> None:
    """Check every field of ``obj`` against its kind's schema (see the module docstring)."""
    schema = _schema()
    root = schema["roots"].get(f"{obj.get('apiVersion')}/{obj.get('kind')}")
    if root is not None:
        _check(obj, root, "", schema["defs"])

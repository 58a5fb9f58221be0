"""Strict field checks, like ``kubectl``'s server-side field validation: every field of an
object must exist in its kind's schema, with a value of the right shape.

The schema is ``fields.json`` beside this module, generated from the official Kubernetes
OpenAPI schemas (``python -m tests.gen_field_schema``; the test suite fails when it is
stale). :func:`check_object` raises :class:`~driver.api.errors.ManifestError` with the field's
path and, for an unknown field, the known field it most resembles::

    spec.containers[0].resources.limit: unknown field; did you mean limits?

A field an older API version had in that place says where it lives now: a flat v1beta1 request
in a v1 claim (``deviceClassName`` belongs under ``exactly``) and a pod's pre-1.31
``resourceClaims[].source``.

Kinds the schema does not cover are not checked here (the caller decides what to do with
them). ``null`` is accepted for every field, as the API server accepts it, but not as a list
item. Pure; nothing is mutated.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Mapping
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


_EXACT_FIELDS: Final = (
    "deviceClassName|selectors|allocationMode|count|adminAccess|tolerations|capacity"
)
#: Fields users write in an older API's place: path pattern -> what to say instead of
#: "unknown field" (the API version of the object is given as ``{version}``).
_MOVED: Final = (
    (
        re.compile(rf"devices\.requests\[\d+\]\.({_EXACT_FIELDS})"),
        (
            "unknown field: in {version} a request's {field} goes under exactly: "
            "(requests[].exactly.{field}); directly on the request is the v1beta1 shape"
        ),
    ),
    (
        re.compile(r"resourceClaims\[\d+\]\.(source)"),
        (
            "unknown field: source is the shape before Kubernetes 1.31; write "
            "resourceClaimName: <claim> or resourceClaimTemplateName: <template> on the entry "
            "itself"
        ),
    ),
)


def _moved(path: str, version: str) -> str | None:
    for pattern, message in _MOVED:
        found = pattern.search(path)
        if found is not None and found.end() == len(path):
            return message.format(version=version, field=found.group(1))
    return None


@cache
def _schema() -> dict[str, Any]:
    text = resources.files("biaxial.simulate").joinpath("fields.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def known(api_version: str, kind: str) -> bool:
    """Whether the schema covers this apiVersion and kind."""
    return f"{api_version}/{kind}" in _schema()["roots"]


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


class _Invalid(Exception):  # noqa: N818 - internal signal, turned into ManifestError
    """A problem found deep in an object; the path is filled in while unwinding (paths are
    only built for the one error, never while checking)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []


Check = Callable[[Any], None]


def _skip(value: Any) -> None:
    del value


def _scalar(code: str) -> Check:
    what, types = _SCALARS[code]
    boolean = code == "b"

    def check(value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, types) or (not boolean and isinstance(value, bool)):
            raise _Invalid(f"expected {what}, got {_type_name(value)}")

    return check


class _Compiler:
    """Turns the schema's nodes into checking closures, once per definition."""

    def __init__(self, defs: Mapping[str, Any]) -> None:
        self.defs = defs
        self.compiled: dict[str, Check] = {}

    def node(self, node: Any) -> Check:
        if node == "*":
            return _skip
        if isinstance(node, str):
            if node.startswith("#"):
                return self.definition(node[1:])
            return _scalar(node)
        if "o" in node:
            return self._object(node["o"])
        if "m" in node:
            return self._map(self.node(node["m"]))
        if "a" in node:
            return self._list(self.node(node["a"]))
        return self._enum(tuple(node["e"]))

    def definition(self, name: str) -> Check:
        found = self.compiled.get(name)
        if found is not None:
            return found
        slot: list[Check] = []

        def deferred(value: Any) -> None:  # recursion: resolved after compiling
            slot[0](value)

        self.compiled[name] = deferred
        compiled = self.node(self.defs[name])
        slot.append(compiled)
        self.compiled[name] = compiled
        return compiled

    def _object(self, fields_raw: Mapping[str, Any]) -> Check:
        fields = {k: self.node(v) for k, v in fields_raw.items()}
        names = list(fields)

        def check(value: Any) -> None:
            if value is None:
                return
            if not isinstance(value, dict):
                raise _Invalid(f"expected an object, got {_type_name(value)}")
            for key, item in value.items():
                sub = fields.get(key)
                if sub is None:
                    guess = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
                    error = _Invalid(
                        "unknown field" + (f"; did you mean {guess[0]}?" if guess else "")
                    )
                    error.path.append(f".{key}")
                    raise error
                if sub is not _skip and item is not None:
                    try:
                        sub(item)
                    except _Invalid as exc:
                        exc.path.append(f".{key}")
                        raise

        return check

    @staticmethod
    def _map(items: Check) -> Check:
        def check(value: Any) -> None:
            if value is None:
                return
            if not isinstance(value, dict):
                raise _Invalid(f"expected an object, got {_type_name(value)}")
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _Invalid(f"keys must be strings, got {key!r}")
                if items is not _skip and item is not None:
                    try:
                        items(item)
                    except _Invalid as exc:
                        exc.path.append(f"[{key}]")
                        raise

        return check

    @staticmethod
    def _list(items: Check) -> Check:
        def check(value: Any) -> None:
            if value is None:
                return
            if not isinstance(value, list):
                raise _Invalid(f"expected a list, got {_type_name(value)}")
            for index, item in enumerate(value):
                if item is None:
                    error = _Invalid("a list item must not be null")
                    error.path.append(f"[{index}]")
                    raise error
                try:
                    items(item)
                except _Invalid as exc:
                    exc.path.append(f"[{index}]")
                    raise

        return check

    @staticmethod
    def _enum(values: tuple[str, ...]) -> Check:
        def check(value: Any) -> None:
            if value is not None and value not in values:
                raise _Invalid(f"unsupported value {value!r} (supported: {', '.join(values)})")

        return check


@cache
def _roots() -> dict[str, Check]:
    schema = _schema()
    compiler = _Compiler(schema["defs"])
    return {key: compiler.node(node) for key, node in schema["roots"].items()}


def check_object(obj: Mapping[str, Any]) -> None:
    """Check every field of ``obj`` against its kind's schema (see the module docstring)."""
    check = _roots().get(f"{obj.get('apiVersion')}/{obj.get('kind')}")
    if check is None:
        return
    try:
        check(obj)
    except _Invalid as exc:
        path = "".join(reversed(exc.path)).removeprefix(".")
        message = _moved(path, str(obj.get("apiVersion"))) or exc.message
        raise ManifestError(f"{path or 'object'}: {message}") from None

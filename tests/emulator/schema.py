"""A compiled validator for the Kubernetes OpenAPI-derived JSON schemas of kubernetes-validate.

The strict schemas use a small keyword set (``type``, ``properties``, ``additionalProperties``,
``required``, ``items``, ``enum``, ``$ref``, ``oneOf`` of plain types for Quantity and
IntOrString; ``format`` and ``x-kubernetes-*`` are annotations). :func:`compile_schema` turns a
schema into nested closures once, so validating a 128-device ResourceSlice costs about a
millisecond instead of ~15 ms through ``jsonschema`` with a ``referencing`` registry. The
result is a list of :class:`Issue`; the test suite cross-checks it against ``jsonschema`` on
valid and broken objects (``tests/integration/test_emulator_validation.py``).

Pure functions; compiled validators are immutable and safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

IssueKind = Literal["unknown", "type", "required", "enum", "invalid"]
Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Issue:
    """One schema violation: ``unknown`` field, wrong ``type``, missing ``required`` field or a
    value outside the ``enum``. ``path`` ends with the offending key for unknown/required."""

    kind: IssueKind
    path: Path
    instance: Any
    expected: tuple[Any, ...] = ()


Check = Callable[[Any, Path, list[Issue]], None]

_PY_TYPES: Final[dict[str, Callable[[Any], bool]]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


class _Compiler:
    def __init__(self, definitions: Mapping[str, Any]) -> None:
        self._definitions = definitions
        self._refs: dict[str, list[Check]] = {}

    def ref(self, ref: str) -> Check:
        name = ref.rsplit("/", 1)[-1]
        if name not in self._definitions:
            raise KeyError(f"schema reference {ref!r} not found")
        slot = self._refs.get(name)
        if slot is None:
            slot = self._refs[name] = []
            slot.append(self.compile(self._definitions[name]))

        def check(value: Any, path: Path, out: list[Issue]) -> None:
            slot[0](value, path, out)

        return check

    def compile(self, node: Mapping[str, Any]) -> Check:
        if "$ref" in node:
            return self.ref(str(node["$ref"]))
        types: tuple[str, ...] = ()
        if "type" in node:
            raw = node["type"]
            types = tuple(raw) if isinstance(raw, list) else (str(raw),)
        if "oneOf" in node:
            alternatives = node["oneOf"]
            if not all(set(alt) == {"type"} for alt in alternatives):
                raise ValueError(f"unsupported oneOf: {alternatives!r}")
            types = tuple(
                t
                for alt in alternatives
                for t in (alt["type"] if isinstance(alt["type"], list) else [alt["type"]])
            )
        type_checks = tuple(_PY_TYPES[t] for t in dict.fromkeys(types))
        enum = tuple(node["enum"]) if "enum" in node else None
        properties = {k: self.compile(v) for k, v in (node.get("properties") or {}).items()}
        extra = node.get("additionalProperties", True)
        extra_check: Check | None = self.compile(extra) if isinstance(extra, dict) else None
        closed = extra is False
        required = tuple(node.get("required") or ())
        items = self.compile(node["items"]) if isinstance(node.get("items"), dict) else None
        wanted = tuple(dict.fromkeys(types))

        def check(value: Any, path: Path, out: list[Issue]) -> None:
            if type_checks and not any(t(value) for t in type_checks):
                out.append(Issue("type", path, value, wanted))
                return
            if enum is not None and value is not None and value not in enum:
                out.append(Issue("enum", path, value, enum))
            if isinstance(value, dict):
                out.extend(
                    Issue("required", (*path, key), None) for key in required if key not in value
                )
                for key, child in value.items():
                    sub = properties.get(key)
                    if sub is not None:
                        sub(child, (*path, key), out)
                    elif extra_check is not None:
                        extra_check(child, (*path, key), out)
                    elif closed:
                        out.append(Issue("unknown", (*path, key), child))
            elif isinstance(value, list) and items is not None:
                for index, child in enumerate(value):
                    items(child, (*path, index), out)

        return check


def compile_schema(schema: Mapping[str, Any], definitions: Mapping[str, Any]) -> Check:
    """Compile a kind's schema (``$ref`` into ``definitions``, the ``$defs`` map)."""
    return _Compiler(definitions).compile(schema)


def issues(check: Check, obj: Any) -> list[Issue]:
    out: list[Issue] = []
    check(obj, (), out)
    return out


__all__ = ["Issue", "compile_schema", "issues"]

"""Read Kubernetes objects from YAML or JSON files: a single object, multi-document YAML, or a
``v1`` ``List`` (``kind: List`` or any ``*List`` kind with ``items``), in any mix. Items of a
typed list as the API returns it (``ResourceSliceList``) inherit its apiVersion and kind.

:func:`load_objects` returns the objects in file order, Lists flattened in place, empty YAML
documents skipped. Input is strict, as ``kubectl`` (server-side field validation) is:

* a duplicate key in a mapping is an error (YAML would keep the last one; two objects
  concatenated without ``---`` merge that way);
* every field of a kind the schema covers (:mod:`biaxial.simulate.schema`) must exist there,
  with a value of the right shape; an unknown field names its path and the field meant;
* ``resource.k8s.io`` ``v1beta2`` and ``v1beta1`` objects are converted to v1 as the API
  server converts them (:mod:`biaxial.simulate.convert`), older versions refused by name;
* unquoted timestamps stay strings, as Kubernetes reads them.

It raises :class:`~driver.api.errors.ManifestError` naming the file (and the document) for an
unreadable file, a YAML/JSON syntax error, a document that is not an object with
``apiVersion`` and ``kind``, and every refusal above. It never guesses: a scalar or a list at
the top level is an error, not ignored. Kind filtering is the caller's job
(:func:`objects_of_kind`). Pure apart from reading the named files; ``-`` reads standard input.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Final

import yaml
import yaml.constructor
import yaml.nodes

from biaxial.simulate.convert import needs_conversion, to_v1
from biaxial.simulate.schema import check_object
from driver.api.errors import ManifestError
from driver.api.yamltext import MAX_DEPTH, too_deep

JSON = dict[str, Any]
_BASE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class StrictLoader(_BASE):  # type: ignore[misc]
    """PyYAML's safe loader (libyaml's parser when built in) that refuses duplicate keys and
    keeps unquoted timestamps as strings."""

    yaml_implicit_resolvers: ClassVar[dict[Any, Any]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in _BASE.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.nodes.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.nodes.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue  # merged keys may be overridden: that is YAML's own rule
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    continue  # an unhashable key: the base class reports it
                if duplicate:
                    hint = (
                        " (two objects without '---' between them?)"
                        if key in ("apiVersion", "kind", "metadata")
                        else ""
                    )
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"duplicate key {key!r}{hint}",
                        key_node.start_mark,
                    )
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


StrictLoader.add_constructor("tag:yaml.org,2002:map", StrictLoader.construct_yaml_map)


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise ManifestError(f"{path}: is a directory, not a manifest file") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return mapping


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_document(path: str, text: str) -> Any:
    """A JSON file through the json module (a cluster dump: 10x faster than YAML), or
    :data:`_NOT_JSON` when it is not JSON (YAML's flow style looks alike)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except _DuplicateKeyError as exc:
        raise ManifestError(f"{path}: malformed YAML/JSON: duplicate key {exc.key!r}") from exc
    except RecursionError as exc:
        raise ManifestError(f"{path}: malformed YAML/JSON: nested too deeply") from exc
    except ValueError:
        return _NOT_JSON


_NOT_JSON: Any = object()


MAX_EXPANDED_VALUES: Final = 1_000_000


def _expanded_size(value: Any, sizes: dict[int, int]) -> int:
    """How many values ``value`` holds once every YAML alias is written out. The loader shares
    one object per anchor, so a few lines of nested aliases stand for billions of values that
    any later walk (validation, conversion, JSON) would visit; shared objects are counted once
    per use but sized once (``sizes``, by identity)."""
    if isinstance(value, dict):
        children: Iterable[Any] = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return 1
    known = sizes.get(id(value))
    if known is None:
        known = sizes[id(value)] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return known


def _documents(path: str, text: str) -> Iterator[tuple[int, Any]]:
    if text.lstrip()[:1] in ("{", "["):
        document = _json_document(path, text)
        if document is not _NOT_JSON:
            yield 1, document
            return
    if too_deep(text):
        raise ManifestError(f"{path}: malformed YAML/JSON: nested more than {MAX_DEPTH} deep")
    try:
        # JSON is YAML 1.2; PyYAML's safe loader reads every JSON manifest kubectl writes.
        # libyaml's parser when PyYAML was built with it (10x faster on a cluster dump).
        for index, document in enumerate(yaml.load_all(text, Loader=StrictLoader), start=1):
            if "*" in text and _expanded_size(document, {}) > MAX_EXPANDED_VALUES:
                raise ManifestError(
                    f"{path}: document {index}: YAML aliases expand to more than "
                    f"{MAX_EXPANDED_VALUES:,} values (a 'billion laughs' document?); "
                    "write the values out instead of repeating aliases"
                )
            yield index, document
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(f"{path}: malformed YAML/JSON{where}: {problem}") from exc
    except RecursionError as exc:
        raise ManifestError(f"{path}: malformed YAML/JSON: nested too deeply") from exc


def _flatten(where: str, document: Any) -> Iterator[JSON]:
    if not isinstance(document, dict):
        raise ManifestError(f"{where}: expected a Kubernetes object, got {type(document).__name__}")
    kind = document.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ManifestError(f"{where}: object without a kind")
    if kind.endswith("List") and "items" in document:
        items = document["items"]
        if items is None:
            return
        if not isinstance(items, list):
            raise ManifestError(f"{where}: {kind}.items must be a list")
        item_kind = kind.removesuffix("List")
        for position, item in enumerate(items):
            typed = item
            if item_kind and isinstance(item, dict) and "kind" not in item:
                # An API list response (ResourceSliceList) leaves kind and apiVersion to the list.
                typed = {"apiVersion": document.get("apiVersion"), "kind": item_kind, **item}
            yield from _flatten(f"{where} item {position}", typed)
        return
    if not isinstance(document.get("apiVersion"), str):
        raise ManifestError(f"{where}: {kind} without an apiVersion")
    name = (
        (document.get("metadata") or {}).get("name")
        if isinstance(document.get("metadata"), dict)
        else None
    )
    label = f"{where} ({kind} {name})" if isinstance(name, str) and name else where
    try:
        check_object(document)
    except ManifestError as exc:
        raise ManifestError(f"{label}: {exc}") from exc
    if needs_conversion(document):
        converted = to_v1(document, label)
        try:
            check_object(converted)
        except ManifestError as exc:
            raise ManifestError(f"{label} (converted to v1): {exc}") from exc
        document = converted
    yield document


def load_documents(paths: Iterable[str]) -> list[tuple[JSON, str]]:
    """Every object in *paths* with the path it came from, in order (see the module
    docstring)."""
    objects: list[tuple[JSON, str]] = []
    for path in paths:
        text = _read(path)
        for index, document in _documents(path, text):
            if document is None:
                continue
            objects.extend((obj, path) for obj in _flatten(f"{path} document {index}", document))
    return objects


def load_objects(paths: Iterable[str]) -> list[JSON]:
    """Every object in *paths*, in order; see the module docstring."""
    return [obj for obj, _ in load_documents(paths)]


def objects_of_kind(objects: Sequence[JSON], kind: str, api_group: str | None = None) -> list[JSON]:
    """The objects of one kind (and API group, when given: ``""`` for the core group)."""
    selected = []
    for obj in objects:
        if obj.get("kind") != kind:
            continue
        if api_group is not None:
            group = obj.get("apiVersion", "").rpartition("/")[0]
            if group != api_group:
                continue
        selected.append(obj)
    return selected

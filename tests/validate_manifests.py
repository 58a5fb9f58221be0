"""Strict schema validation of Kubernetes objects in YAML/JSON files, for 1.34 and 1.37.

Usage::

    python -m tests.validate_manifests DIR_OR_FILE... [--version 1.34 --version 1.37]

Every ``*.yaml`` / ``*.yml`` / ``*.json`` file found (directories are searched recursively) is
read; every document is a Kubernetes object, or a ``List`` whose ``items`` are. Each object is
validated with the official OpenAPI schemas shipped by ``kubernetes-validate``, in strict mode
(unknown fields are errors), for every requested Kubernetes version. Objects of biaxial's own
kinds (``apiVersion`` ``biaxial.dev/v1alpha1`` or ``gpu.biaxial.dev/v1alpha1``) are skipped and
counted. A kind without a schema is a failure, never a pass. One line per failure is printed;
the exit code is 1 if anything failed (2 if no object was found at all), else 0.

:func:`validate_object` is the reusable entry point for tests. Validators are built once per
(version, apiVersion, kind) and cached, because ``kubernetes_validate.validate`` re-reads the
1.8 MB definitions file on every call.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import jsonschema
import referencing
import referencing.jsonschema
import yaml

DEFAULT_VERSIONS: Final = ("1.34", "1.37")
OWN_API_VERSIONS: Final = frozenset({"biaxial.dev/v1alpha1", "gpu.biaxial.dev/v1alpha1"})
SUFFIXES: Final = frozenset({".yaml", ".yml", ".json"})


class SchemaNotFoundError(LookupError):
    """No schema exists for an (apiVersion, kind) in a Kubernetes version."""


def _schema_root(version: str) -> Any:
    root = resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    folder = root.joinpath(f"v{version}.0-local-strict")
    if not folder.is_dir():
        known = sorted(
            p.name.removeprefix("v").removesuffix(".0-local-strict")
            for p in root.iterdir()
            if p.name.endswith("-local-strict")
        )
        raise SchemaNotFoundError(f"no schemas for Kubernetes {version} (have: {', '.join(known)})")
    return folder


@functools.cache
def _registry(version: str) -> referencing.Registry[Any]:
    folder = _schema_root(version)
    definitions = json.loads(folder.joinpath("_definitions.json").read_text(encoding="utf-8"))
    resource = referencing.jsonschema.DRAFT202012.create_resource(definitions)
    registry: referencing.Registry[Any] = resource @ referencing.Registry()
    return registry


@functools.cache
def _validator(version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator:
    # Schema files are named "<kind>-<group's first label>-<version>.json"; the core group is "".
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    if "/" in group_version or not re.fullmatch(r"[A-Za-z0-9-]+", kind + group_version):
        raise SchemaNotFoundError(f"no schema for {api_version} {kind}")
    entry = _schema_root(version).joinpath(f"{kind.lower()}-{group_version}.json")
    if not entry.is_file():
        raise SchemaNotFoundError(f"no schema for {api_version} {kind} in Kubernetes {version}")
    schema = json.loads(entry.read_text(encoding="utf-8"))
    # The files are keyed by the group's first label only; make sure the full apiVersion is
    # the one the schema declares (e.g. "resource.k8s.io/v1", not "resource.example.com/v1").
    declared = schema.get("x-kubernetes-group-version-kind") or []
    wanted_group, _, wanted_version = api_version.rpartition("/")
    if not any(
        g.get("group", "") == wanted_group
        and g.get("version") == wanted_version
        and g.get("kind") == kind
        for g in declared
    ):
        raise SchemaNotFoundError(f"no schema for {api_version} {kind} in Kubernetes {version}")
    registry = referencing.jsonschema.DRAFT202012.create_resource(schema) @ _registry(version)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _describe(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    return f"{obj.get('kind', '<no kind>')}/{name}"


def validate_object(obj: object, version: str) -> list[str]:
    """Strictly validate one object for one Kubernetes version; return error lines (empty = ok).

    biaxial's own kinds are not validated here (the caller decides whether to skip them).
    """
    if not isinstance(obj, dict):
        return [f"document is a {type(obj).__name__}, not a Kubernetes object"]
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [f"{_describe(obj)}: apiVersion and kind must be strings"]
    try:
        validator = _validator(version, api_version, kind)
    except SchemaNotFoundError as exc:
        return [f"{_describe(obj)}: {exc}"]
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    where = _describe(obj)
    return [
        f"{where}: v{version}: {'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in errors
    ]


@dataclass
class Report:
    """What a run found."""

    checked: int = 0
    skipped_own: int = 0
    failures: list[str] = field(default_factory=list)


def _files(paths: Sequence[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        else:
            yield path


def _documents(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return [json.loads(text)]
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _objects(doc: object) -> Iterator[object]:
    if isinstance(doc, dict) and doc.get("kind") == "List" and doc.get("apiVersion") == "v1":
        for item in doc.get("items") or []:
            yield from _objects(item)
    else:
        yield doc


def validate_paths(paths: Sequence[str], versions: Sequence[str] = DEFAULT_VERSIONS) -> Report:
    """Validate every object in the given files and directories."""
    report = Report()
    for path in _files(paths):
        try:
            documents = _documents(path)
        except (OSError, UnicodeDecodeError) as exc:
            report.failures.append(f"{path}: cannot read: {exc}")
            continue
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            report.failures.append(f"{path}: not valid YAML/JSON: {' '.join(str(exc).split())}")
            continue
        for doc in documents:
            for obj in _objects(doc):
                if isinstance(obj, dict) and obj.get("apiVersion") in OWN_API_VERSIONS:
                    report.skipped_own += 1
                    continue
                report.checked += 1
                for version in versions:
                    report.failures.extend(
                        f"{path}: {line}" for line in validate_object(obj, version)
                    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.validate_manifests", description=__doc__.split("\n")[0]
    )
    parser.add_argument("paths", nargs="+", metavar="DIR_OR_FILE")
    parser.add_argument(
        "--version",
        dest="versions",
        action="append",
        help="Kubernetes version to validate for (repeatable; default "
        f"{' and '.join(DEFAULT_VERSIONS)})",
    )
    args = parser.parse_args(argv)
    versions = tuple(args.versions or DEFAULT_VERSIONS)
    try:
        for version in versions:
            _schema_root(version)
    except SchemaNotFoundError as exc:
        print(f"validate_manifests: {exc}", file=sys.stderr)
        return 2
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(
            f"validate_manifests: no such file or directory: {', '.join(missing)}", file=sys.stderr
        )
        return 2
    report = validate_paths(args.paths, versions)
    for line in report.failures:
        print(line)
    print(
        f"validate_manifests: {report.checked} object(s) checked for Kubernetes "
        f"{', '.join(versions)}; {report.skipped_own} biaxial object(s) skipped; "
        f"{len(report.failures)} failure(s)",
        file=sys.stderr,
    )
    if report.failures:
        return 1
    return 2 if report.checked == 0 and report.skipped_own == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

"""Generate the field schema ``biaxial simulate`` checks manifests against, from the official
Kubernetes OpenAPI schemas that ``kubernetes-validate`` ships (strict variant).

Usage::

    python -m tests.gen_field_schema            # (re)write biaxial/simulate/fields.json
    python -m tests.gen_field_schema --check    # exit 1 when the file is stale

The output is compact JSON: ``roots`` maps ``<apiVersion>/<kind>`` to a definition, and each
node is ``"s"`` (string), ``"i"`` (integer), ``"n"`` (number), ``"b"`` (boolean), ``"q"`` (a
quantity or int-or-string: string or number), ``"*"`` (any value: raw extensions, free
objects), ``"#<definition>"``, ``{"o": {field: node}}`` (an object with exactly these
fields), ``{"m": node}`` (a map), ``{"a": node}`` (a list), ``{"e": [values]}`` (a string
enum). Only definitions reachable from :data:`ROOTS` are kept. The scheduler issues add the
kinds here that the simulator learns.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Final

VERSION: Final = "1.37"
OUTPUT: Final = Path(__file__).resolve().parents[1] / "biaxial" / "simulate" / "fields.json"
_RESOURCE = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate")
ROOTS: Final[dict[str, str]] = {
    "v1/Pod": "io.k8s.api.core.v1.Pod",
    "v1/Node": "io.k8s.api.core.v1.Node",
    "v1/Namespace": "io.k8s.api.core.v1.Namespace",
    "v1/Service": "io.k8s.api.core.v1.Service",
    "apps/v1/Deployment": "io.k8s.api.apps.v1.Deployment",
    "apps/v1/ReplicaSet": "io.k8s.api.apps.v1.ReplicaSet",
    "apps/v1/StatefulSet": "io.k8s.api.apps.v1.StatefulSet",
    "apps/v1/DaemonSet": "io.k8s.api.apps.v1.DaemonSet",
    "batch/v1/Job": "io.k8s.api.batch.v1.Job",
    "scheduling.k8s.io/v1/PriorityClass": "io.k8s.api.scheduling.v1.PriorityClass",
    "policy/v1/PodDisruptionBudget": "io.k8s.api.policy.v1.PodDisruptionBudget",
    "v1/PersistentVolumeClaim": "io.k8s.api.core.v1.PersistentVolumeClaim",
    "v1/PersistentVolume": "io.k8s.api.core.v1.PersistentVolume",
    **{
        f"storage.k8s.io/v1/{kind}": f"io.k8s.api.storage.v1.{kind}"
        for kind in (
            "StorageClass",
            "CSINode",
            "CSIDriver",
            "CSIStorageCapacity",
            "VolumeAttachment",
        )
    },
    **{
        f"resource.k8s.io/{version}/{kind}": f"io.k8s.api.resource.{version}.{kind}"
        for version in ("v1", "v1beta2", "v1beta1")
        for kind in _RESOURCE
    },
}
_PREFIX: Final = "#/$defs/"


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind} - {"null"}
    if isinstance(kind, list):
        return {k for k in kind if k != "null"}
    return set()


class _Builder:
    def __init__(self, definitions: dict[str, Any]) -> None:
        self.definitions = definitions
        self.out: dict[str, Any] = {}

    def definition(self, name: str) -> str:
        if name not in self.out:
            self.out[name] = "*"  # placeholder: recursive definitions terminate
            self.out[name] = self.node(self.definitions[name])
        return f"#{name}"

    def node(self, schema: dict[str, Any]) -> Any:
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self.definition(ref.removeprefix(_PREFIX))
        one_of = schema.get("oneOf")
        if isinstance(one_of, list):
            kinds = set().union(*(_types(s) for s in one_of))
            return "q" if kinds <= {"string", "number", "integer"} else "*"
        kinds = _types(schema)
        if kinds == {"array"}:
            return {"a": self.node(schema.get("items") or {})}
        if kinds == {"object"}:
            properties = schema.get("properties")
            extra = schema.get("additionalProperties")
            if isinstance(properties, dict):
                return {"o": {k: self.node(v) for k, v in sorted(properties.items())}}
            if isinstance(extra, dict):
                return {"m": self.node(extra)}
            return "*"
        if kinds == {"string"}:
            enum = schema.get("enum")
            if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
                return {"e": sorted(enum)}
            return "s"
        if kinds == {"integer"}:
            return "i"
        if kinds == {"number"}:
            return "n"
        if kinds == {"boolean"}:
            return "b"
        return "*"


def generate() -> str:
    folder = resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema", f"v{VERSION}.0-local-strict"
    )
    definitions = json.loads(folder.joinpath("_definitions.json").read_text(encoding="utf-8"))
    builder = _Builder(definitions["$defs"])
    roots = {key: builder.definition(name) for key, name in ROOTS.items()}
    document = {
        "kubernetes": VERSION,
        "roots": roots,
        "defs": dict(sorted(builder.out.items())),
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the file is stale")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT} is stale: run python -m tests.gen_field_schema", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

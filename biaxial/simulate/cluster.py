"""The simulated cluster's nodes and devices: from a ``Cluster`` inventory (fake GPUs through
the real slice builder), from the ``Node`` and ``ResourceSlice`` objects a cluster dump holds,
or both.

The inventory (``apiVersion: biaxial.dev/v1alpha1``, ``kind: Cluster``)::

    nodes:
      - name: gpu-t4               # required, unique
        gpus: t4x4                 # a built-in fake GPU profile, or the path of a profile
                                   # file, relative to the inventory's own file
        cpu: "32"                  # allocatable quantities (defaults 64, 256Gi, 110)
        memory: 128Gi
        pods: 110                  # a non-negative whole number
        labels: {zone: a}          # string values
        taints: [{key: k, value: v, effect: NoSchedule}]  # NoSchedule|PreferNoSchedule|NoExecute
        attachLimits: {ebs.csi.aws.com: 25}  # CSI driver -> volumes the node can attach

Every field is checked: an unknown field names its path and the field meant, a quantity must
parse and not be negative, a taint needs a key and one of the three effects, an attach limit
is a non-negative whole number (the node's ``CSINode``, as its kubelet would publish it:
``allocatable.count`` per driver). ``Node`` objects
are checked the same way where the API server would (taint effects); ``ResourceSlice`` objects
through the slice validation the API server applies. Errors are
:class:`~driver.api.errors.ManifestError` naming the node. Pure apart from reading profile
files.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from biaxial.simulate.workloads import stable_uid
from driver.api.errors import BiaxialError, ManifestError, QuantityError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import JSON, ResourceSlice
from driver.api.nodes import Node
from driver.api.quantity import Quantity
from driver.api.validation import validate_slice
from driver.discovery.devices import DeviceTable
from driver.discovery.fake import FakeBackend, builtin_profiles
from driver.discovery.mig import DynamicMigPolicy
from driver.discovery.slices import build_slices

INVENTORY_API_VERSION: Final = "biaxial.dev/v1alpha1"
TAINT_EFFECTS: Final = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_INVENTORY_FIELDS: Final = ("apiVersion", "kind", "metadata", "nodes")
_NODE_FIELDS: Final = ("name", "gpus", "cpu", "memory", "pods", "labels", "taints", "attachLimits")
_TAINT_FIELDS: Final = ("key", "value", "effect")
_DEFAULTS: Final = {"cpu": "64", "memory": "256Gi", "pods": "110"}


@dataclass(frozen=True, slots=True)
class InventoryNode:
    node: Node
    raw: JSON
    profile: str | None
    csi_node: JSON | None = None  # from attachLimits


def _unknown(raw: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    for key in raw:
        if key not in allowed:
            guess = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            hint = f"; did you mean {guess[0]}?" if guess else ""
            raise ManifestError(f"{where}.{key}: unknown field{hint}")


def _quantity(raw: Any, where: str) -> str:
    try:
        quantity = Quantity.of(raw)
    except QuantityError as exc:
        raise ManifestError(f"{where}: {exc}") from exc
    if quantity.sign() < 0:
        raise ManifestError(f"{where}: {quantity} is negative")
    return str(quantity)


def _taints(raw: Any, where: str) -> list[JSON]:
    if not isinstance(raw, list):
        raise ManifestError(f"{where}: must be a list")
    out = []
    for i, taint in enumerate(raw):
        twhere = f"{where}[{i}]"
        if not isinstance(taint, Mapping):
            raise ManifestError(f"{twhere}: must be an object")
        _unknown(taint, _TAINT_FIELDS, twhere)
        check_taint(taint, twhere)
        out.append({k: taint[k] for k in _TAINT_FIELDS if taint.get(k) is not None})
    return out


def check_taint(taint: Mapping[str, Any], where: str) -> None:
    """A node taint as the API server validates it: a key and one of the three effects."""
    key = taint.get("key")
    if not isinstance(key, str) or not key:
        raise ManifestError(f"{where}.key: required")
    value = taint.get("value")
    if value is not None and not isinstance(value, str):
        raise ManifestError(f"{where}.value: must be a string")
    effect = taint.get("effect")
    if effect not in TAINT_EFFECTS:
        guess = difflib.get_close_matches(str(effect), TAINT_EFFECTS, n=1, cutoff=0.6)
        hint = f"; did you mean {guess[0]}?" if guess else ""
        raise ManifestError(
            f"{where}.effect: unsupported value {effect!r}{hint} "
            f"(supported: {', '.join(TAINT_EFFECTS)})"
        )


def _csi_node(raw: Any, name: str, where: str) -> JSON | None:
    """The CSINode of ``attachLimits`` (driver -> count), None when there is none."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw:
        raise ManifestError(f"{where}: must map CSI driver names to volume counts")
    drivers = []
    for driver, count in raw.items():
        if not isinstance(driver, str) or not driver:
            raise ManifestError(f"{where}: a CSI driver name must be a non-empty string")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ManifestError(f"{where}.{driver}: {count!r} is not a non-negative whole number")
        drivers.append({"name": driver, "nodeID": name, "allocatable": {"count": count}})
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": name, "uid": stable_uid("CSINode", "", name)},
        "spec": {"drivers": drivers},
    }


def _profile(raw: Any, where: str, base: Path | None) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise ManifestError(f"{where}: must name a GPU profile, e.g. t4x4")
    if raw in builtin_profiles():
        return raw
    path = Path(raw)
    if base is not None and not path.is_absolute():
        path = base / path
    if not path.exists() and "/" not in raw and not raw.endswith((".yaml", ".yml", ".json")):
        # a profile name, misspelt (names are lower case): the near miss and the list
        near = difflib.get_close_matches(raw.lower(), builtin_profiles(), n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise ManifestError(
            f"{where}: no built-in profile {raw[:40]!r} and no such file{hint} (built-in: "
            f"{', '.join(builtin_profiles())})"
        )
    return str(path)


def _inventory_node(
    raw: Any, index: int, base: Path | None
) -> tuple[JSON, str | None, JSON | None]:
    where = f"Cluster inventory: nodes[{index}]"
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where}: must be an object")
    _unknown(raw, _NODE_FIELDS, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where}.name: required")
    where = f"{where} ({name})"
    profile = _profile(raw.get("gpus"), f"{where}.gpus", base)
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ManifestError(f"{where}.labels: must map strings to strings")
    taints = _taints(raw.get("taints") or [], f"{where}.taints")
    csi_node = _csi_node(raw.get("attachLimits"), name, f"{where}.attachLimits")
    allocatable = {k: _quantity(raw.get(k, d), f"{where}.{k}") for k, d in _DEFAULTS.items()}
    pods = Quantity.of(allocatable["pods"])
    if not pods.is_integer():
        raise ManifestError(f"{where}.pods: {pods} is not a whole number")
    node: JSON = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": stable_uid("Node", "", name),
            "labels": {"kubernetes.io/hostname": name, **labels},
        },
        "spec": {"taints": copy.deepcopy(taints)} if taints else {},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return node, profile, csi_node


def build_inventory(
    inventory: Mapping[str, Any], base: Path | None = None
) -> tuple[list[InventoryNode], list[ResourceSlice]]:
    """Nodes and their published slices (fake GPUs through the real slice builder).
    ``base`` is the inventory file's folder: profile paths are relative to it."""
    if inventory.get("apiVersion") != INVENTORY_API_VERSION:
        raise ManifestError(f"Cluster inventory: apiVersion must be {INVENTORY_API_VERSION}")
    _unknown(inventory, _INVENTORY_FIELDS, "Cluster inventory")
    nodes_raw = inventory.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ManifestError("Cluster inventory: nodes must be a non-empty list")
    nodes: list[InventoryNode] = []
    slices: list[ResourceSlice] = []
    validated: set[str] = set()
    seen: set[str] = set()
    for index, raw in enumerate(nodes_raw):
        node_json, profile, csi_node = _inventory_node(raw, index, base)
        name = node_json["metadata"]["name"]
        if name in seen:
            raise ManifestError(f"Cluster inventory: duplicate node name {name!r}")
        seen.add(name)
        node = Node.from_api(node_json)
        if profile:
            try:
                with FakeBackend.from_profile(profile, node_name=name) as backend:
                    gpus = backend.discover()
                    # GPUs the profile declares dynamic publish as the plugin would.
                    policy = DynamicMigPolicy(gpus=backend.dynamic_mig)
            except BiaxialError as exc:
                raise ManifestError(f"Cluster inventory: node {name}: {exc}") from exc
            slices.extend(
                build_slices(
                    DeviceTable.from_gpus(gpus, policy),
                    node_name=name,
                    driver_name=DEFAULT_DRIVER_NAME,
                    node_uid=node.uid,
                    # The first node of a profile is validated; its other nodes differ only
                    # in node name (checked anyway) and GPU UUIDs.
                    validate=profile not in validated,
                )
            )
            validated.add(profile)
        nodes.append(InventoryNode(node=node, raw=node_json, profile=profile, csi_node=csi_node))
    return nodes, slices


def node_from_object(raw: Mapping[str, Any]) -> Node:
    """A ``Node`` object of a cluster dump, checked where the API server would check it."""
    name = (raw.get("metadata") or {}).get("name")
    for i, taint in enumerate((raw.get("spec") or {}).get("taints") or ()):
        if not isinstance(taint, Mapping):
            raise ManifestError(f"Node {name}: spec.taints[{i}]: must be an object")
        check_taint(taint, f"Node {name}: spec.taints[{i}]")
    return Node.from_api(raw)


def slice_from_object(raw: Mapping[str, Any]) -> ResourceSlice:
    """A ``ResourceSlice`` object, validated as the API server validates it (unless an API
    server stored it, which its ``metadata.resourceVersion`` shows: then it did)."""
    meta = raw.get("metadata") or {}
    name = meta.get("name")
    try:
        parsed = ResourceSlice.from_api(raw)
        if not meta.get("resourceVersion"):
            validate_slice(parsed)
    except BiaxialError as exc:
        raise ManifestError(f"ResourceSlice {name}: {exc}") from exc
    return parsed

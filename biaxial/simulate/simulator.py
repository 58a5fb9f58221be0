"""The simulator behind ``biaxial simulate``: a whole cluster in memory, the real decision code.

Input is a list of Kubernetes objects (already parsed, see :mod:`biaxial.simulate.manifests`):

* exactly one inventory, ``apiVersion: biaxial.dev/v1alpha1, kind: Cluster`` with
  ``nodes: [{name, gpus: PROFILE, cpu, memory, pods, labels, taints}]`` (``gpus`` names a fake
  GPU profile, e.g. ``t4x4``; the node's slices come from the real slice builder);
* DeviceClasses (added to, and overriding by name, the default classes the caller passes),
  ResourceClaimTemplates, ResourceClaims (an allocated one is cluster state), Pods, and
  Deployments, whose replicas become pods ``<deployment>-<n>`` (n = 0, 1, ...) in place.

Pods are placed in input order with :class:`~driver.scheduling.decision.DecisionEngine`.
The simulator plays the resourceclaim controller for templates: a pod's claim is named
``<pod>-<claim>-<5 characters>`` (deterministic, derived from the pod's UID) and annotated
``resource.kubernetes.io/pod-claim-name``. Bridge claims (KEP-5004) get the name
``<pod>-extended-resources-<5 characters>`` the API server would generate. UIDs are UUIDv5 of
the object's namespace/name, so a run is reproducible byte for byte (timings aside).

Bad input for one pod (unknown class, invalid CEL, unknown policy, impossible request, a
malformed Pod or Deployment) becomes an entry in ``unschedulable`` with a specific reason; the
other pods are still placed. A malformed inventory is a :class:`~driver.api.errors.ManifestError`
for the whole run.

**Fragmentation** (``summary.fragmentation``): the share of free GPU memory that sits on GPUs
already partly in use, i.e. memory a whole-GPU request cannot use. 0 means every free byte is on
an idle GPU; 1 means no idle GPU is left although memory is free.
"""

from __future__ import annotations

import copy
import hashlib
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from driver.api.claims import AllocationResult, DeviceClass, DeviceResult, ResourceClaim
from driver.api.errors import BiaxialError, ManifestError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import JSON, ResourceSlice
from driver.api.nodes import Node
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement, PodError, Unschedulable
from driver.scheduling.policy import PolicyDefaults

INVENTORY_API_VERSION: Final = "biaxial.dev/v1alpha1"
POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
_UID_NAMESPACE: Final = uuid.UUID("2b0f5c3e-6f0a-5d61-8c2e-9a4b7d1e3f50")
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # upstream's generateName alphabet
_SUPPORTED: Final = frozenset(
    {"Cluster", "DeviceClass", "ResourceClaimTemplate", "ResourceClaim", "Pod", "Deployment"}
)


def stable_uid(kind: str, namespace: str, name: str) -> str:
    return str(uuid.uuid5(_UID_NAMESPACE, f"{kind}/{namespace}/{name}"))


def generated_suffix(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_NAME_ALPHABET[b % len(_NAME_ALPHABET)] for b in digest[:5])


def _ns_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


# --------------------------------------------------------------------------- inventory


@dataclass(frozen=True, slots=True)
class InventoryNode:
    node: Node
    raw: JSON
    profile: str | None


def _inventory_node(raw: Any, index: int) -> tuple[JSON, str | None]:
    where = f"Cluster inventory: nodes[{index}]"
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where}: must be an object")
    unknown = set(raw) - {"name", "gpus", "cpu", "memory", "pods", "labels", "taints"}
    if unknown:
        raise ManifestError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where}: name is required")
    profile = raw.get("gpus")
    if profile is not None and not isinstance(profile, str):
        raise ManifestError(f"{where} ({name}): gpus must name a GPU profile, e.g. t4x4")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise ManifestError(f"{where} ({name}): labels must be an object")
    taints = raw.get("taints") or []
    if not isinstance(taints, list):
        raise ManifestError(f"{where} ({name}): taints must be a list")
    node: JSON = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": stable_uid("Node", "", name),
            "labels": {
                "kubernetes.io/hostname": name,
                **{str(k): str(v) for k, v in labels.items()},
            },
        },
        "spec": {"taints": copy.deepcopy(taints)} if taints else {},
        "status": {
            "allocatable": {
                "cpu": str(raw.get("cpu", "64")),
                "memory": str(raw.get("memory", "256Gi")),
                "pods": str(raw.get("pods", "110")),
            },
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    return node, profile


def build_inventory(
    inventory: Mapping[str, Any],
) -> tuple[list[InventoryNode], list[ResourceSlice]]:
    """Nodes and their published slices (fake GPUs through the real slice builder)."""
    nodes_raw = inventory.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ManifestError("Cluster inventory: nodes must be a non-empty list")
    nodes: list[InventoryNode] = []
    slices: list[ResourceSlice] = []
    seen: set[str] = set()
    for index, raw in enumerate(nodes_raw):
        node_json, profile = _inventory_node(raw, index)
        name = node_json["metadata"]["name"]
        if name in seen:
            raise ManifestError(f"Cluster inventory: duplicate node name {name!r}")
        seen.add(name)
        node = Node.from_api(node_json)
        if profile:
            try:
                with open_backend(fake=profile, node_name=name) as backend:
                    gpus = backend.discover()
            except BiaxialError as exc:
                raise ManifestError(f"Cluster inventory: node {name}: {exc}") from exc
            slices.extend(
                build_slices(
                    gpus, node_name=name, driver_name=DEFAULT_DRIVER_NAME, node_uid=node.uid
                )
            )
        nodes.append(InventoryNode(node=node, raw=node_json, profile=profile))
    return nodes, slices


# --------------------------------------------------------------------------- pods


def expand_deployment(deployment: Mapping[str, Any]) -> list[JSON]:
    """``<deployment>-<n>`` pods from the template, in order (raises ManifestError)."""
    namespace, name = _ns_name(deployment)
    where = f"Deployment {namespace}/{name}"
    if not name:
        raise ManifestError("Deployment without metadata.name")
    spec = deployment.get("spec") or {}
    replicas = spec.get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise ManifestError(f"{where}: spec.replicas must be a non-negative integer")
    template = spec.get("template")
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise ManifestError(f"{where}: spec.template.spec is required")
    pods = []
    for n in range(replicas):
        meta = copy.deepcopy(dict(template.get("metadata") or {}))
        meta["name"] = f"{name}-{n}"
        meta["namespace"] = namespace
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": name,
                "uid": stable_uid("Deployment", namespace, name),
                "controller": True,
            }
        ]
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": copy.deepcopy(template["spec"]),
            }
        )
    return pods


def _with_uid(pod: Mapping[str, Any]) -> JSON:
    out = copy.deepcopy(dict(pod))
    meta = dict(out.get("metadata") or {})
    namespace, name = _ns_name(out)
    meta["namespace"] = namespace
    meta.setdefault("uid", stable_uid("Pod", namespace, name))
    out["metadata"] = meta
    return out


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class PodPlacement:
    pod: str
    node: str
    devices: tuple[JSON, ...]


@dataclass(frozen=True, slots=True)
class PodFailure:
    pod: str
    reason: str


@dataclass(frozen=True, slots=True)
class GpuUsage:
    node: str
    device: str
    uuid: str
    product: str
    memory: int
    memory_used: int
    cores: int
    cores_used: int
    pods: tuple[tuple[str, int], ...]  # (pod, memory bytes)


@dataclass(slots=True)
class SimulationResult:
    placements: list[PodPlacement] = field(default_factory=list)
    unschedulable: list[PodFailure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    gpus: list[GpuUsage] = field(default_factory=list)
    node_names: list[str] = field(default_factory=list)
    objects: list[JSON] = field(default_factory=list)
    startup_seconds: float = 0.0
    decision_seconds: float = 0.0
    durations: list[float] = field(default_factory=list)
    policies: PolicyDefaults = field(default_factory=PolicyDefaults)

    # ------------------------------------------------------------------ summary
    def summary(self) -> JSON:
        by_node: dict[str, list[GpuUsage]] = {name: [] for name in self.node_names}
        for gpu in self.gpus:
            by_node.setdefault(gpu.node, []).append(gpu)
        nodes = []
        for name in self.node_names:
            gpus = by_node[name]
            memory = sum(g.memory for g in gpus)
            used = sum(g.memory_used for g in gpus)
            nodes.append(
                {
                    "node": name,
                    "gpus": len(gpus),
                    "gpusInUse": sum(1 for g in gpus if g.pods),
                    "pods": len({p for g in gpus for p, _ in g.pods}),
                    "memoryBytes": memory,
                    "memoryUsedBytes": used,
                    "memoryUtilisation": round(used / memory, 4) if memory else 0.0,
                }
            )
        free_total = sum(g.memory - g.memory_used for g in self.gpus)
        free_partial = sum(g.memory - g.memory_used for g in self.gpus if g.pods)
        decisions = len(self.durations)
        ordered = sorted(self.durations)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
        return {
            "pods": len(self.placements) + len(self.unschedulable),
            "placed": len(self.placements),
            "unschedulable": len(self.unschedulable),
            "nodesUsed": len({p.node for p in self.placements}),
            "gpusInUse": sum(1 for g in self.gpus if g.pods),
            "wholeGpusFree": sum(1 for g in self.gpus if not g.pods),
            "fragmentation": round(free_partial / free_total, 4) if free_total else 0.0,
            "policies": {"node": self.policies.node, "gpu": self.policies.gpu},
            "nodes": nodes,
            "gpus": [
                {
                    "node": g.node,
                    "device": g.device,
                    "uuid": g.uuid,
                    "productName": g.product,
                    "memoryBytes": g.memory,
                    "memoryUsedBytes": g.memory_used,
                    "coresUsed": g.cores_used,
                    "pods": [p for p, _ in g.pods],
                }
                for g in self.gpus
            ],
            "timing": {
                "startupSeconds": round(self.startup_seconds, 6),
                "decisionSeconds": round(self.decision_seconds, 6),
                "podsPerSecond": round(decisions / self.decision_seconds, 1)
                if self.decision_seconds > 0
                else 0.0,
                "p99DecisionMs": round(p99 * 1000, 3),
            },
        }

    def to_json(self) -> JSON:
        return {
            "placements": [
                {"pod": p.pod, "node": p.node, "devices": [dict(d) for d in p.devices]}
                for p in self.placements
            ],
            "unschedulable": [{"pod": f.pod, "reason": f.reason} for f in self.unschedulable],
            "errors": list(self.errors),
            "summary": self.summary(),
            "objects": copy.deepcopy(self.objects),
        }


# --------------------------------------------------------------------------- the run


class _Run:
    """One simulation; holds the mutable bookkeeping so :func:`simulate` stays readable."""

    def __init__(
        self,
        objects: Sequence[Mapping[str, Any]],
        default_classes: Sequence[Mapping[str, Any]],
        defaults: PolicyDefaults,
    ) -> None:
        self.result = SimulationResult(policies=defaults)
        self.defaults = defaults
        self.objects = objects
        self.default_classes = default_classes
        self.templates: dict[tuple[str, str], JSON] = {}
        self.claims: dict[tuple[str, str], JSON] = {}
        self.claim_order: list[tuple[str, str]] = []
        self.pods: list[JSON] = []
        self.placed_pods: list[JSON] = []
        self._device_pods: list[tuple[str, DeviceResult]] = []
        self._uuids: dict[tuple[str, str, str], str] = {}

    def _collect(self) -> tuple[Mapping[str, Any], list[DeviceClass]]:
        inventory: Mapping[str, Any] | None = None
        classes: dict[str, DeviceClass] = {}
        for raw in self.default_classes:
            dc = DeviceClass.from_api(raw)
            classes[dc.name] = dc
        for obj in self.objects:
            kind = obj.get("kind")
            namespace, name = _ns_name(obj)
            if kind not in _SUPPORTED:
                self.result.errors.append(
                    f"{kind} {namespace}/{name}: unsupported kind (simulate reads "
                    f"{', '.join(sorted(_SUPPORTED))})"
                )
                continue
            if kind == "Cluster":
                if obj.get("apiVersion") != INVENTORY_API_VERSION:
                    raise ManifestError(
                        f"Cluster inventory: apiVersion must be {INVENTORY_API_VERSION}"
                    )
                if inventory is not None:
                    raise ManifestError("more than one Cluster inventory given")
                inventory = obj
            elif kind == "DeviceClass":
                try:
                    dc = DeviceClass.from_api(obj)
                except ManifestError as exc:
                    self.result.errors.append(str(exc))
                    continue
                classes[dc.name] = dc
            elif kind == "ResourceClaimTemplate":
                self.templates[(namespace, name)] = dict(obj)
            elif kind == "ResourceClaim":
                raw = _with_uid(obj)
                raw["metadata"]["uid"] = raw["metadata"].get("uid") or stable_uid(
                    "ResourceClaim", namespace, name
                )
                self.claims[(namespace, name)] = raw
                self.claim_order.append((namespace, name))
            elif kind == "Pod":
                self.pods.append(_with_uid(obj))
            else:
                try:
                    self.pods.extend(_with_uid(p) for p in expand_deployment(obj))
                except ManifestError as exc:
                    self.result.unschedulable.append(
                        PodFailure(pod=f"{namespace}/{name} (Deployment)", reason=str(exc))
                    )
        if inventory is None:
            raise ManifestError(
                f"no Cluster inventory (apiVersion: {INVENTORY_API_VERSION}, kind: Cluster) given"
            )
        return inventory, list(classes.values())

    def run(self) -> SimulationResult:
        started = time.perf_counter()
        inventory, classes = self._collect()
        nodes, slices = build_inventory(inventory)
        self.result.node_names = [n.node.name for n in nodes]
        self._uuids = {
            (s.driver, s.pool.name, d.name): str(d.attributes.get("uuid", ""))
            for s in slices
            for d in s.devices
        }
        existing = []
        for key in self.claim_order:
            try:
                claim = ResourceClaim.from_api(self.claims[key])
            except ManifestError as exc:
                self.result.errors.append(str(exc))
                del self.claims[key]
                continue
            if claim.allocation is not None:
                existing.append(claim)
        from driver.structured.snapshot import ClusterSnapshot  # noqa: PLC0415 - keeps import cheap

        snapshot = ClusterSnapshot.build(slices, classes, existing)
        engine = DecisionEngine(snapshot, [n.node for n in nodes], defaults=self.defaults)
        self.result.startup_seconds = time.perf_counter() - started
        for pod in self.pods:
            self._place(engine, pod)
        self._usage(slices)
        self.result.objects = [*self._claim_objects(), *self.placed_pods]
        return self.result

    # ------------------------------------------------------------------ per pod
    def _pod_claims(self, pod: JSON) -> tuple[list[tuple[str, JSON]], list[JSON]]:
        """(pod claim name, claim JSON) in spec order; new template claims listed apart."""
        namespace, name = _ns_name(pod)
        out: list[tuple[str, JSON]] = []
        created: list[JSON] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            if not isinstance(entry, Mapping) or not entry.get("name"):
                raise ManifestError(
                    f"pod {namespace}/{name}: spec.resourceClaims entry without a name"
                )
            claim_name = str(entry["name"])
            if entry.get("resourceClaimName"):
                key = (namespace, str(entry["resourceClaimName"]))
                if key not in self.claims:
                    raise ManifestError(
                        f"pod {namespace}/{name}: resourceclaim {key[0]}/{key[1]} not found"
                    )
                out.append((claim_name, self.claims[key]))
                continue
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name:
                raise ManifestError(
                    f"pod {namespace}/{name}: resourceClaims[{claim_name}] needs "
                    "resourceClaimName or resourceClaimTemplateName"
                )
            template = self.templates.get((namespace, str(template_name)))
            if template is None:
                raise ManifestError(
                    f"pod {namespace}/{name}: resourceclaimtemplate "
                    f"{namespace}/{template_name} not found"
                )
            tspec = template.get("spec") or {}
            generated = (
                f"{name}-{claim_name}-{generated_suffix(pod['metadata']['uid'] + claim_name)}"
            )
            tmeta = tspec.get("metadata") or {}
            claim: JSON = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": generated,
                    "namespace": namespace,
                    "uid": stable_uid("ResourceClaim", namespace, generated),
                    "labels": dict(tmeta.get("labels") or {}),
                    "annotations": {
                        **dict(tmeta.get("annotations") or {}),
                        POD_CLAIM_NAME_ANNOTATION: claim_name,
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": name,
                            "uid": pod["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": copy.deepcopy(tspec.get("spec") or {}),
            }
            if not claim["metadata"]["labels"]:
                del claim["metadata"]["labels"]
            out.append((claim_name, claim))
            created.append(claim)
        return out, created

    def _place(self, engine: DecisionEngine, pod: JSON) -> None:
        namespace, name = _ns_name(pod)
        pod_key = f"{namespace}/{name}"
        try:
            entries, created = self._pod_claims(pod)
            models = [ResourceClaim.from_api(raw) for _, raw in entries]
        except ManifestError as exc:
            self.result.unschedulable.append(PodFailure(pod=pod_key, reason=str(exc)))
            return
        started = time.perf_counter()
        decision = engine.decide(pod, models)
        elapsed = time.perf_counter() - started
        self.result.durations.append(elapsed)
        self.result.decision_seconds += elapsed
        if isinstance(decision, (Unschedulable, PodError)):
            self.result.unschedulable.append(PodFailure(pod=pod_key, reason=decision.message))
            return
        engine.assume(decision, pod)
        self._record(pod, decision, entries, created)

    def _record(
        self,
        pod: JSON,
        placement: Placement,
        entries: list[tuple[str, JSON]],
        created: list[JSON],
    ) -> None:
        namespace, name = _ns_name(pod)
        uid = pod["metadata"]["uid"]
        consumer = {"resource": "pods", "name": name, "uid": uid}
        allocations = {claim.key: allocation for claim, allocation in placement.claims}
        for raw in created:
            created_key = (namespace, str(raw["metadata"]["name"]))
            self.claims[created_key] = raw
            self.claim_order.append(created_key)
        devices: list[JSON] = []
        for _, raw in entries:
            claim_key = f"{raw['metadata']['namespace']}/{raw['metadata']['name']}"
            status = raw.setdefault("status", {})
            allocation = allocations.get(claim_key)
            if allocation is not None:
                status["allocation"] = allocation.to_api()
            reserved = status.setdefault("reservedFor", [])
            if consumer not in reserved:
                reserved.append(consumer)
            if allocation is not None:
                devices.extend(self._device_rows(raw["metadata"]["name"], allocation))
        out_pod = copy.deepcopy(pod)
        out_pod.setdefault("spec", {})["nodeName"] = placement.node
        status = out_pod.setdefault("status", {})
        if entries:
            status["resourceClaimStatuses"] = [
                {"name": claim_name, "resourceClaimName": raw["metadata"]["name"]}
                for claim_name, raw in entries
            ]
        if placement.bridge is not None and placement.bridge_allocation is not None:
            claim_name = f"{name}-extended-resources-{generated_suffix(uid + '/extended')}"
            bridge = copy.deepcopy(placement.bridge.claim)
            bridge["metadata"] = {
                "name": claim_name,
                **bridge["metadata"],
                "uid": stable_uid("ResourceClaim", namespace, claim_name),
            }
            bridge["status"] = {
                "allocation": placement.bridge_allocation.to_api(),
                "reservedFor": [consumer],
            }
            key = (namespace, claim_name)
            self.claims[key] = bridge
            self.claim_order.append(key)
            status["extendedResourceClaimStatus"] = placement.bridge.pod_status(claim_name)
            devices.extend(self._device_rows(claim_name, placement.bridge_allocation))
        self.placed_pods.append(out_pod)
        self.result.placements.append(
            PodPlacement(pod=f"{namespace}/{name}", node=placement.node, devices=tuple(devices))
        )
        self._device_pods.extend(
            (f"{namespace}/{name}", r) for a in placement.all_results for r in a.results
        )

    def _device_rows(self, claim_name: str, allocation: AllocationResult) -> list[JSON]:
        rows = []
        for r in allocation.results:
            row: JSON = {
                "claim": claim_name,
                "request": r.request,
                "device": r.device,
                "uuid": self._uuids.get((r.driver, r.pool, r.device), ""),
            }
            if r.consumed_capacity is not None:
                row["consumedCapacity"] = {
                    k: str(v) for k, v in sorted(r.consumed_capacity.items())
                }
            rows.append(row)
        return rows

    def _claim_objects(self) -> list[JSON]:
        return [self.claims[key] for key in self.claim_order if key in self.claims]

    def _usage(self, slices: Iterable[ResourceSlice]) -> None:
        held: dict[tuple[str, str, str], list[tuple[str, DeviceResult]]] = {}
        for pod, r in self._device_pods:
            held.setdefault((r.driver, r.pool, r.device), []).append((pod, r))
        position = {name: i for i, name in enumerate(self.result.node_names)}
        for s in sorted(slices, key=lambda s: (position.get(s.node_name or "", -1), s.name)):
            for d in s.devices:
                memory = d.capacity["memory"].value.value() if "memory" in d.capacity else 0
                cores = d.capacity["cores"].value.value() if "cores" in d.capacity else 0
                pods: list[tuple[str, int]] = []
                used_memory = used_cores = 0
                for pod, r in held.get((s.driver, s.pool.name, d.name), ()):
                    consumed = r.consumed_capacity
                    share_memory = (
                        consumed["memory"].value() if consumed and "memory" in consumed else memory
                    )
                    share_cores = (
                        consumed["cores"].value() if consumed and "cores" in consumed else 0
                    )
                    if consumed is None:
                        share_cores = cores
                    pods.append((pod, share_memory))
                    used_memory += share_memory
                    used_cores += share_cores
                self.result.gpus.append(
                    GpuUsage(
                        node=str(s.node_name or s.pool.name),
                        device=d.name,
                        uuid=str(d.attributes.get("uuid", "")),
                        product=str(d.attributes.get("productName", "")),
                        memory=memory,
                        memory_used=used_memory,
                        cores=cores,
                        cores_used=used_cores,
                        pods=tuple(pods),
                    )
                )


def simulate(
    objects: Sequence[Mapping[str, Any]],
    *,
    default_classes: Sequence[Mapping[str, Any]] = (),
    defaults: PolicyDefaults | None = None,
) -> SimulationResult:
    """Run the simulation (see the module docstring). Raises ManifestError only for a bad
    inventory; everything about single pods is reported in the result."""
    return _Run(objects, default_classes, defaults or PolicyDefaults()).run()


def project_deviceclasses_dir() -> Path:
    """The project's ``deviceclasses/`` (loaded by default by ``biaxial simulate``): the
    source tree's when running from a checkout, else the copy a wheel installs under
    ``<prefix>/share/biaxial/deviceclasses``. Raises ManifestError when neither exists."""
    candidates = (
        Path(__file__).resolve().parents[2] / "deviceclasses",
        Path(sys.prefix) / "share" / "biaxial" / "deviceclasses",
    )
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise ManifestError(
        "the project's DeviceClasses were not found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); pass DeviceClass manifests as PATH or use --no-default-classes"
    )


__all__ = [
    "INVENTORY_API_VERSION",
    "GpuUsage",
    "PodFailure",
    "PodPlacement",
    "SimulationResult",
    "build_inventory",
    "expand_deployment",
    "project_deviceclasses_dir",
    "simulate",
]

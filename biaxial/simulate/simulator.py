"""The simulator behind ``biaxial simulate``: a whole cluster in memory, the real decision code.

Input is a list of Kubernetes objects (already parsed and checked, see
:mod:`biaxial.simulate.manifests`); what each kind means is the table in
:mod:`biaxial.simulate.kinds`:

* the cluster: a ``Cluster`` inventory (:mod:`biaxial.simulate.cluster`: fake GPUs through
  the real slice builder) and/or the objects ``kubectl get -A -o yaml`` returns: Nodes,
  ResourceSlices, DeviceClasses (added to, and overriding by name, the default classes the
  caller passes), ResourceClaims (an allocated one is cluster state), Namespaces (their
  labels: ``adminAccess`` is admitted only where ``resource.kubernetes.io/admin-access:
  "true"`` is set, as the API server admits it; kept for the affinity rules'
  ``namespaceSelector``), Services (their selectors, for default topology spreading), and Pods
  bound to a node (``spec.nodeName``: running; they count on the node as the controller counts
  every bound pod -- requests, host ports, volumes, labels and affinity terms -- whatever
  their scheduler);
* the volumes: PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes (also from
  the inventory's ``attachLimits``), CSIDrivers, CSIStorageCapacities and VolumeAttachments,
  read by kube-scheduler's volume rules (:mod:`driver.scheduling.volumes`: missing and
  unbound ``Immediate`` claims, PV node affinity and zones, attach limits, ``ReadWriteOncePod``,
  static PV matching and ``WaitForFirstConsumer`` provisioning);
* the work: ResourceClaimTemplates, pending Pods, and the workload kinds, whose missing pods
  are created as their controllers would (:mod:`biaxial.simulate.workloads`).

Pods are treated as the controller treats them: a pod is placed only when it names this
scheduler (``spec.schedulerName``, ``biaxial`` by default), has no scheduling gates and is not
being deleted; other pending pods are reported as *skipped* with the reason; finished pods
count for nothing. Pods are placed highest ``spec.priority`` first, then in input order (as
kube-scheduler's PrioritySort), with :class:`~driver.scheduling.decision.DecisionEngine`; a
pod's priority is resolved from the PriorityClasses given as the API server's admission would
(:mod:`biaxial.simulate.priority`). A pending pod that fits nowhere is also run through the
engine's preemption dry run: ``preemptions`` lists the running pods (``spec.nodeName`` in the
input) it would preempt and where, honouring the PodDisruptionBudgets given; nothing is evicted
or nominated, so the pods after it see the cluster unchanged. The simulator plays the resourceclaim
controller for templates (a pod's claim is ``<pod>-<claim>-<5 characters>``, annotated
``resource.kubernetes.io/pod-claim-name``, unless the pod's status already names it) and the
API server for bridge claims (``<pod>-extended-resources-<5 characters>``). UIDs are UUIDv5 of
the object's identity, so a run is reproducible byte for byte (timings aside). It also plays
the controllers that create PersistentVolumeClaims: the ephemeral volume controller
(``<pod>-<volume>`` from a generic ephemeral volume's template, owned by the pod) and the
StatefulSet controller (``<template>-<pod>`` from ``volumeClaimTemplates``), each only where
the claim does not exist, and the PV controller's first sync for a PV written without a phase
(``Available``, or ``Bound`` when its ``claimRef`` has a UID). Volumes are bound as the
controller binds them before the pod: a PV chosen for a claim gets its ``claimRef``, a claim
to provision ``volume.kubernetes.io/selected-node``; provisioning is assumed to succeed on the
node chosen (which the class's ``allowedTopologies`` allow), so later pods follow the claim
there; a PV's binding is completed as the PV controller completes it before the pod is bound.

Bad input for the run (an unsupported kind, a duplicate object, a malformed claim, class, node
or slice, a pod the API server would refuse, a broken workload, no nodes) raises
:class:`~driver.api.errors.ManifestError`: nothing is simulated. Bad input for one pod's
scheduling (unknown class, invalid CEL, unknown policy or dialect key, impossible request)
becomes an entry in ``unschedulable`` with the specific reason, as the controller reports it
on the pod; the other pods are still placed.

Output (:class:`SimulationResult`): placements with the policies each pod got and every device
it uses (a shared claim's devices on every pod that shares it), unschedulable and skipped pods,
notes (skipped kinds, finished pods), per-GPU use counted from every allocated claim (admin
access is not use; MIG partitions are drawn inside their GPU and a GPU in MIG mode is never
"whole"). **Fragmentation** (``summary.fragmentation``): the share of free memory of whole
(non-MIG) and dynamic-MIG GPUs that sits on GPUs already partly in use, i.e. memory a whole-GPU
request cannot use. 0 means every free byte is on an idle GPU; 1 means no idle GPU is left
although memory is free.

**Dynamic MIG.** A node whose profile declares dynamic MIG (``a100-80gbx8-dynmig``, or
``mig: {enabled: true, dynamic: true}`` in a profile file) publishes each such GPU's counters
and every (profile, placement), as the kubelet plugin would. The placements the decisions take
are the partitions the plugin would create: each GPU lists them (device, profile, start, size,
pods) with its ``memorySlices``, ``freeMemorySlices`` and the largest profile still placeable;
unused placements are not listed. Such a GPU is whole until a partition is taken. Its free
memory is counted in MIG slots (its free memory slices' share of its memory), so fragmentation
covers the slots partitions leave behind; ``summary.mig`` totals them.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from biaxial.simulate.admission import namespace_labels
from biaxial.simulate.cluster import (
    INVENTORY_API_VERSION,
    build_inventory,
    node_from_object,
    slice_from_object,
)
from biaxial.simulate.kinds import classify, object_label
from biaxial.simulate.priority import PriorityClasses, budget_from_api
from biaxial.simulate.workloads import (
    deployment_replicaset,
    expand,
    expand_deployment,
    generated_suffix,
    ns_name,
    owned_by,
    requested_pods,
    stable_uid,
    statefulset_claims,
)
from driver.api.claims import AllocationResult, DeviceClass, ResourceClaim
from driver.api.errors import BiaxialError, ManifestError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import JSON, Device, ResourceSlice
from driver.api.nodes import Node
from driver.cel.formats import is_dns1123_label, is_dns1123_subdomain
from driver.discovery.mig import MEMORY_SLICE_PREFIX
from driver.scheduling.admission import AdmissionScope, admit
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement, PodError, Preemption, Unschedulable
from driver.scheduling.policy import PodPolicies, PolicyDefaults
from driver.scheduling.preemption import DisruptionBudget, pod_priority
from driver.scheduling.storage import (
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_SELECTED_NODE,
    PodVolumes,
    StorageClass,
    default_storage_class,
    with_default_class,
)
from driver.scheduling.topologyspread import DefaultSpreading
from kubeapi import codec

POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
#: The one recipe for a dump of a cluster (docs/simulator.md and docs/migration.md show it).
DUMP_COMMAND: Final = (
    "kubectl get "
    + ",".join(
        (
            "nodes,resourceslices,deviceclasses,resourceclaims,resourceclaimtemplates,pods",
            "namespaces,services,replicasets,statefulsets,poddisruptionbudgets,priorityclasses",
            "pvc,pv,storageclasses,csinodes,csidrivers,csistoragecapacities,volumeattachments",
        )
    )
    + " -A -o yaml"
)
ADMIN_ACCESS_LABEL: Final = "resource.kubernetes.io/admin-access"
DEFAULT_SCHEDULER: Final = "biaxial"
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
MIB: Final = 1024 * 1024


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class PodPlacement:
    pod: str
    node: str
    devices: tuple[JSON, ...]
    policies: PodPolicies = field(default_factory=lambda: PodPolicies("binpack", "binpack"))


@dataclass(frozen=True, slots=True)
class PodFailure:
    pod: str
    reason: str


@dataclass(frozen=True, slots=True)
class PodPreemption:
    """A pending pod that fits nowhere would fit on ``node`` once ``victims`` (running pods,
    most important first) were preempted; nothing is performed."""

    pod: str
    node: str
    victims: tuple[str, ...]
    violations: int  # victims a PodDisruptionBudget protects


@dataclass(frozen=True, slots=True)
class PartitionUsage:
    """A MIG partition: exclusive, so in use or not. On a dynamic-MIG GPU, one the decisions
    took (the plugin would create it), with its first memory slice and size."""

    device: str
    profile: str
    memory: int
    pods: tuple[str, ...]
    start: int | None = None
    size: int = 0


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One physical GPU. A GPU in MIG mode has ``partitions`` (and its memory is theirs)."""

    node: str
    device: str
    uuid: str
    product: str
    memory: int
    memory_used: int
    cores: int
    cores_used: int
    pods: tuple[tuple[str, int], ...]  # (pod, memory bytes), whole-GPU use
    partitions: tuple[PartitionUsage, ...] = ()
    # Dynamic MIG only: the GPU's memory slices, those no partition covers, and the largest
    # profile still placeable.
    memory_slices: int = 0
    free_slices: int = 0
    largest_placeable: str = ""

    @property
    def mig(self) -> bool:
        return bool(self.partitions)

    @property
    def dynamic(self) -> bool:
        return self.memory_slices > 0

    @property
    def free_memory(self) -> int:
        """Free memory; on a cut dynamic-MIG GPU, its free memory slices' share of it."""
        if self.partitions and self.dynamic:
            return self.memory * self.free_slices // self.memory_slices
        return self.memory - self.memory_used

    @property
    def in_use(self) -> bool:
        return bool(self.pods) or any(p.pods for p in self.partitions)

    @property
    def pod_names(self) -> tuple[str, ...]:
        names = [p for p, _ in self.pods] + [p for part in self.partitions for p in part.pods]
        return tuple(dict.fromkeys(names))


@dataclass(slots=True)
class SimulationResult:
    placements: list[PodPlacement] = field(default_factory=list)
    unschedulable: list[PodFailure] = field(default_factory=list)
    skipped: list[PodFailure] = field(default_factory=list)
    preemptions: list[PodPreemption] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: (namespace/name, what the admission step changed), with ``admission`` given
    admissions: list[tuple[str, str]] = field(default_factory=list)
    gpus: list[GpuUsage] = field(default_factory=list)
    node_names: list[str] = field(default_factory=list)
    objects: list[JSON] = field(default_factory=list)
    running: int = 0
    startup_seconds: float = 0.0
    decision_seconds: float = 0.0
    durations: list[float] = field(default_factory=list)
    policies: PolicyDefaults = field(default_factory=PolicyDefaults)

    # ------------------------------------------------------------------ summary
    def policies_used(self) -> dict[str, int]:
        """``"node <policy>, GPU <policy>"`` -> number of placed pods that got it."""
        counts = Counter(f"node {p.policies.node}, GPU {p.policies.gpu}" for p in self.placements)
        return dict(sorted(counts.items()))

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
                    "gpusInUse": sum(1 for g in gpus if g.in_use),
                    "pods": len({p for g in gpus for p in g.pod_names}),
                    "memoryBytes": memory,
                    "memoryUsedBytes": used,
                    "memoryUtilisation": round(used / memory, 4) if memory else 0.0,
                }
            )
        whole = [g for g in self.gpus if not g.mig]
        counted = [g for g in self.gpus if not g.mig or g.dynamic]
        free_total = sum(g.free_memory for g in counted)
        free_partial = sum(g.free_memory for g in counted if g.in_use)
        dynamic = [g for g in self.gpus if g.dynamic]
        decisions = len(self.durations)
        ordered = sorted(self.durations)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
        return {
            "pods": len(self.placements) + len(self.unschedulable),
            "placed": len(self.placements),
            "unschedulable": len(self.unschedulable),
            "skipped": len(self.skipped),
            "running": self.running,
            "nodesUsed": len({p.node for p in self.placements}),
            "gpus": [_gpu_json(g) for g in self.gpus],
            "gpusInUse": sum(1 for g in self.gpus if g.in_use),
            "wholeGpusFree": sum(1 for g in whole if not g.in_use),
            "migPartitionsFree": sum(
                1 for g in self.gpus for part in g.partitions if not part.pods
            ),
            **(
                {
                    "mig": {
                        "dynamicGpus": len(dynamic),
                        "partitions": sum(len(g.partitions) for g in dynamic),
                        "memorySlices": sum(g.memory_slices for g in dynamic),
                        "freeMemorySlices": sum(g.free_slices for g in dynamic),
                        "freeMemorySlicesOnCutGpus": sum(
                            g.free_slices for g in dynamic if g.partitions
                        ),
                    }
                }
                if dynamic
                else {}
            ),
            "fragmentation": round(free_partial / free_total, 4) if free_total else 0.0,
            "policies": {
                "defaults": {"node": self.policies.node, "gpu": self.policies.gpu},
                "used": self.policies_used(),
            },
            "nodes": nodes,
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
        summary = self.summary()
        return {
            "placements": [
                {
                    "pod": p.pod,
                    "node": p.node,
                    "policies": {"node": p.policies.node, "gpu": p.policies.gpu},
                    "devices": [dict(d) for d in p.devices],
                }
                for p in self.placements
            ],
            "unschedulable": [{"pod": f.pod, "reason": f.reason} for f in self.unschedulable],
            "skipped": [{"pod": f.pod, "reason": f.reason} for f in self.skipped],
            "preemptions": [
                {
                    "pod": p.pod,
                    "node": p.node,
                    "victims": list(p.victims),
                    "budgetViolations": p.violations,
                }
                for p in self.preemptions
            ],
            "notes": list(self.notes),
            "admission": [{"pod": pod, "changed": note} for pod, note in self.admissions],
            "summary": summary,
            "objects": codec.copy(self.objects),
        }


def _gpu_json(g: GpuUsage) -> JSON:
    out: JSON = {
        "node": g.node,
        "device": g.device,
        "uuid": g.uuid,
        "productName": g.product,
        "memoryBytes": g.memory,
        "memoryUsedBytes": g.memory_used,
        "coresUsed": g.cores_used,
        "pods": list(g.pod_names),
    }
    if g.dynamic:
        out["memorySlices"] = g.memory_slices
        out["freeMemorySlices"] = g.free_slices
        out["largestPlaceable"] = g.largest_placeable or None
    if g.partitions:
        out["migPartitions"] = [
            {
                "device": p.device,
                "profile": p.profile,
                "memoryBytes": p.memory,
                "pods": list(p.pods),
                **({"start": p.start, "size": p.size} if p.start is not None else {}),
            }
            for p in g.partitions
        ]
    return out


# --------------------------------------------------------------------------- input checks


def check_pod_object(pod: Mapping[str, Any]) -> None:
    """What the API server refuses in a pod that the schema does not express: no containers,
    duplicate container names, a ``spec.resourceClaims`` entry without exactly one source, a
    container's ``resources.claims`` naming a claim the pod does not list."""
    namespace, name = ns_name(pod)
    where = f"Pod {_short(namespace)}/{_short(name)}"
    if not name:
        raise ManifestError("Pod without metadata.name")
    # The API server's ValidatePodName and ValidateNamespaceName (apimachinery's
    # IsDNS1123Subdomain / IsDNS1123Label).
    if is_dns1123_subdomain(name):
        raise ManifestError(f"{where}: metadata.name: {DNS_NAME_RULE}")
    if is_dns1123_label(namespace):
        raise ManifestError(f"{where}: metadata.namespace: {DNS_LABEL_RULE}")
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        raise ManifestError(f"{where}: spec.containers: at least one container is required")
    claims = set()
    for i, entry in enumerate(spec.get("resourceClaims") or ()):
        if not isinstance(entry, Mapping):
            raise ManifestError(f"{where}: spec.resourceClaims[{i}]: must be an object")
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if entry.get(k)]
        if not entry.get("name") or len(sources) != 1:
            raise ManifestError(
                f"{where}: spec.resourceClaims[{i}]: needs a name and exactly one of "
                "resourceClaimName or resourceClaimTemplateName"
            )
        claims.add(entry["name"])
    seen: set[str] = set()
    for field_name in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(field_name) or ()):
            cwhere = f"{where}: spec.{field_name}[{i}]"
            if not isinstance(container, Mapping):
                raise ManifestError(f"{cwhere}: must be an object")
            cname = container.get("name")
            if not cname:
                raise ManifestError(f"{cwhere}.name: required")
            if cname in seen:
                raise ManifestError(f"{cwhere}.name: duplicate container name {cname!r}")
            seen.add(cname)
            for j, ref in enumerate((container.get("resources") or {}).get("claims") or ()):
                name_ref = ref.get("name") if isinstance(ref, Mapping) else None
                if name_ref not in claims:
                    listed = ", ".join(sorted(claims)) or "none"
                    raise ManifestError(
                        f"{cwhere}.resources.claims[{j}].name: {name_ref!r} is not in "
                        f"spec.resourceClaims (the pod lists: {listed})"
                    )


DNS_NAME_RULE: Final = (
    "not a valid name: lowercase letters, digits, '-' and '.', starting and ending with a "
    "letter or digit, at most 253 (RFC 1123)"
)
DNS_LABEL_RULE: Final = (
    "not a valid namespace: lowercase letters, digits and '-', starting and ending with a "
    "letter or digit, at most 63 (RFC 1123)"
)


def _short(text: str, limit: int = 40) -> str:
    """A short prefix of user input, for an error line."""
    return text if len(text) <= limit else f"{text[:limit]}..."


def _claim_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return ns_name(obj)


def _identity(obj: Mapping[str, Any], namespaced: bool) -> tuple[str, str, str]:
    namespace, name = ns_name(obj)
    return (str(obj.get("kind")), namespace if namespaced else "", name)


# --------------------------------------------------------------------------- the run


@dataclass(slots=True)
class _Input:
    """The objects of one run, sorted by role (input order kept within each role)."""

    inventory: tuple[Mapping[str, Any], Path | None] | None = None
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)
    nodes: list[Mapping[str, Any]] = field(default_factory=list)
    slices: list[Mapping[str, Any]] = field(default_factory=list)
    classes: list[Mapping[str, Any]] = field(default_factory=list)
    claims: list[Mapping[str, Any]] = field(default_factory=list)
    templates: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    services: list[Mapping[str, Any]] = field(default_factory=list)
    priority_classes: list[Mapping[str, Any]] = field(default_factory=list)
    budgets: list[Mapping[str, Any]] = field(default_factory=list)
    work: list[Mapping[str, Any]] = field(default_factory=list)  # pods and workloads, in order
    volumes: list[Mapping[str, Any]] = field(default_factory=list)  # the volume rules' kinds
    skipped: Counter[str] = field(default_factory=Counter)


class _Run:
    """One simulation; holds the mutable bookkeeping so :func:`simulate` stays readable."""

    def __init__(
        self,
        objects: Sequence[Mapping[str, Any]],
        default_classes: Sequence[Mapping[str, Any]],
        defaults: PolicyDefaults,
        scheduler_name: str,
        base_dirs: Sequence[Path | None] | None,
        *,
        spreading: DefaultSpreading | None = None,
        admission: AdmissionScope | None = None,
    ) -> None:
        self.result = SimulationResult(policies=defaults)
        self.admission = admission
        self.defaults = defaults
        self.spreading = spreading
        self.scheduler_name = scheduler_name
        self.objects = objects
        self.base_dirs = base_dirs
        self.default_classes = default_classes
        self.claims: dict[tuple[str, str], JSON] = {}
        self.namespaces: dict[str, dict[str, str]] = {}
        self.touched: list[tuple[str, str]] = []
        self.placed_pods: list[JSON] = []
        self.budgets: list[DisruptionBudget] = []
        #: (kind, namespace/name or name) -> object, for every kind the volume rules read
        self.volumes: dict[tuple[str, str], JSON] = {}
        self.touched_volumes: list[tuple[str, str]] = []
        self.default_storage_class: StorageClass | None = None
        self._uuids: dict[tuple[str, str, str], str] = {}

    # ------------------------------------------------------------------ input
    def _collect(self) -> _Input:
        found = _Input()
        seen: set[tuple[str, str, str]] = set()
        for position, obj in enumerate(self.objects):
            spec = classify(obj)
            if spec.role == "skip":
                found.skipped[str(obj.get("kind"))] += 1
                continue
            identity = _identity(obj, spec.namespaced)
            if spec.role != "inventory":
                if not identity[2]:
                    raise ManifestError(f"{obj.get('kind')} without metadata.name")
                if identity in seen:
                    raise ManifestError(f"{object_label(obj)}: given twice")
                seen.add(identity)
            if spec.role == "inventory":
                if found.inventory is not None:
                    raise ManifestError("more than one Cluster inventory given")
                base = self.base_dirs[position] if self.base_dirs is not None else None
                found.inventory = (obj, base)
            elif spec.role == "namespace":
                labels = (obj.get("metadata") or {}).get("labels") or {}
                found.namespaces[identity[2]] = {str(k): str(v) for k, v in labels.items()}
            elif spec.role == "node":
                found.nodes.append(obj)
            elif spec.role == "slice":
                found.slices.append(obj)
            elif spec.role == "class":
                found.classes.append(obj)
            elif spec.role == "claim":
                found.claims.append(obj)
            elif spec.role == "template":
                found.templates[ns_name(obj)] = obj
            elif spec.role == "service":
                found.services.append(obj)
            elif spec.role == "priorityclass":
                found.priority_classes.append(obj)
            elif spec.role == "budget":
                found.budgets.append(obj)
            elif spec.role == "volume":
                found.volumes.append(obj)
            else:  # pod, workload
                found.work.append(obj)
        if not self.objects:
            raise ManifestError("the input holds no objects")
        if found.skipped:
            listed = ", ".join(f"{kind} ({n})" for kind, n in sorted(found.skipped.items()))
            self.result.notes.append(
                f"skipped {sum(found.skipped.values())} object(s) that do not affect "
                f"scheduling: {listed}"
            )
        return found

    def _cluster(self, found: _Input) -> tuple[list[Node], list[ResourceSlice]]:
        nodes: list[Node] = []
        slices: list[ResourceSlice] = []
        csi_nodes: list[JSON] = []
        if found.inventory is not None:
            inventory, base = found.inventory
            if inventory.get("apiVersion") != INVENTORY_API_VERSION:
                raise ManifestError(
                    f"Cluster inventory: apiVersion must be {INVENTORY_API_VERSION}"
                )
            built, built_slices = build_inventory(inventory, base)
            nodes.extend(n.node for n in built)
            slices.extend(built_slices)
            csi_nodes.extend(n.csi_node for n in built if n.csi_node is not None)
        names = {n.name for n in nodes}
        for raw in found.nodes:
            node = node_from_object(raw)
            if node.name in names:
                raise ManifestError(f"Node {node.name}: given twice (inventory and object)")
            names.add(node.name)
            nodes.append(node)
        if not nodes:
            raise ManifestError(
                f"no nodes: give a Cluster inventory (apiVersion: {INVENTORY_API_VERSION}, "
                "kind: Cluster) or the cluster's Node objects"
            )
        slices.extend(slice_from_object(raw) for raw in found.slices)
        # What the DefaultStorageClass admission plugin gives claims without a class.
        self.default_storage_class = default_storage_class(
            StorageClass.from_api(raw) for raw in found.volumes if raw.get("kind") == "StorageClass"
        )
        for raw in csi_nodes:
            self._add_volume_object(raw)
        for raw in found.volumes:
            if self._volume_key(raw) in self.volumes:
                raise ManifestError(f"{object_label(raw)}: given twice (inventory and object)")
            self._add_volume_object(raw)
        return nodes, slices

    @staticmethod
    def _volume_key(raw: Mapping[str, Any]) -> tuple[str, str]:
        kind = str(raw.get("kind"))
        namespace, name = ns_name(raw)
        return (kind, f"{namespace}/{name}" if classify(raw).namespaced else name)

    def _add_volume_object(self, raw: Mapping[str, Any]) -> JSON:
        """Keep a volume kind's object (a copy, with a UID) for the engine. A claim without a
        class and not yet bound gets the default StorageClass, as admission gives it to a new
        claim and the PV controller to an older unbound one (retroactive assignment)."""
        key = self._volume_key(raw)
        spec = raw.get("spec")
        if key[0] == "PersistentVolumeClaim" and not (
            isinstance(spec, Mapping) and spec.get("volumeName")
        ):
            raw = with_default_class(raw, self.default_storage_class)
        if classify(raw).namespaced:
            obj = _with_uid(raw)
        else:
            obj = codec.copy(dict(raw))
            obj["metadata"] = {"uid": stable_uid(key[0], "", key[1]), **obj["metadata"]}
        if key[0] == "PersistentVolume" and not (obj.get("status") or {}).get("phase"):
            # A PV as written, before the PV controller's first sync (syncVolume): Available
            # without a claim or pre-bound to one (no UID yet), else Bound.
            ref = (obj.get("spec") or {}).get("claimRef") or {}
            obj["status"] = {"phase": "Bound" if ref.get("uid") else "Available"}
        self.volumes[key] = obj
        return obj

    @staticmethod
    def _check_admin_access(found: _Input) -> None:
        """The API server admits ``adminAccess: true`` only in namespaces labelled
        ``resource.kubernetes.io/admin-access: "true"`` (checked where the Namespace is
        known)."""
        specs = [(c, (c.get("spec") or {})) for c in found.claims] + [
            (t, ((t.get("spec") or {}).get("spec") or {})) for t in found.templates.values()
        ]
        for obj, spec in specs:
            namespace = ns_name(obj)[0]
            labels = found.namespaces.get(namespace)
            if labels is None or labels.get(ADMIN_ACCESS_LABEL) == "true":
                continue
            for request in (spec.get("devices") or {}).get("requests") or ():
                if ((request or {}).get("exactly") or {}).get("adminAccess") is True:
                    raise ManifestError(
                        f"{object_label(obj)}: request {request.get('name')!r}: adminAccess "
                        f'needs the label {ADMIN_ACCESS_LABEL}: "true" on Namespace '
                        f"{namespace}"
                    )

    def _classes(self, found: _Input) -> dict[str, DeviceClass]:
        classes: dict[str, DeviceClass] = {}
        for raw in [*self.default_classes, *found.classes]:
            dc = DeviceClass.from_api(raw)
            classes[dc.name] = dc
        return classes

    def _pods(self, found: _Input, nodes: Sequence[Node]) -> list[JSON]:
        """Every pod of the run, in input order: given ones, then each workload's missing
        pods at the workload's position."""
        given = [_with_uid(o) for o in found.work if o.get("kind") == "Pod"]
        for pod in given:
            check_pod_object(pod)
        replica_sets = [o for o in found.work if o.get("kind") == "ReplicaSet"]
        room = pod_slots(nodes)
        out: list[JSON] = []
        for obj in found.work:
            kind = obj.get("kind")
            if kind == "Pod":
                out.append(_with_uid(obj))
                continue
            if kind == "ReplicaSet" and any(
                d.get("kind") == "Deployment" and owned_by(obj, d) for d in found.work
            ):
                continue  # its Deployment stands for it
            owners = [obj]
            if kind == "Deployment":
                owners += [rs for rs in replica_sets if owned_by(rs, obj)]
                owners.append(_replicaset_of(obj))
            existing = [
                p
                for p in given
                if any(owned_by(p, o) for o in owners)
                and (p.get("status") or {}).get("phase") not in FINISHED_PHASES
            ]
            wanted = requested_pods(obj) - len(existing)
            if len(out) + wanted > room:
                # Each pod takes one of a node's allocatable pods: more than the cluster has
                # could never all run, and making them all costs memory and time for nothing.
                raise ManifestError(
                    f"{object_label(obj)}: {requested_pods(obj):,} pods are more than the "
                    f"{len(nodes)} node(s) can run ({room:,} allocatable pods in all, "
                    f"{len(out):,} taken by the pods before it); lower its replicas"
                )
            for pod in expand(obj, nodes, existing):
                check_pod_object(pod)
                out.append(_with_uid(pod))
                if kind == "StatefulSet":
                    # The StatefulSet controller creates the claims it does not find.
                    for claim in statefulset_claims(obj, ns_name(pod)[1]):
                        if self._volume_key(claim) not in self.volumes:
                            self._add_volume_object(claim)
        names = [ns_name(p) for p in out]
        duplicate = next((n for n, c in Counter(names).items() if c > 1), None)
        if duplicate is not None:
            raise ManifestError(f"Pod {duplicate[0]}/{duplicate[1]}: given twice")
        return out

    def run(self) -> SimulationResult:
        started = time.perf_counter()
        found = self._collect()
        self._check_admin_access(found)
        self.namespaces = found.namespaces  # for the affinity rules' namespaceSelector
        nodes, slices = self._cluster(found)
        node_names = {str(n.name) for n in nodes}
        self.result.node_names = [n.name for n in nodes]
        self._uuids = {
            (s.driver, s.pool.name, d.name): str(d.attributes.get("uuid", ""))
            for s in slices
            for d in s.devices
        }
        classes = self._classes(found)
        self.templates = found.templates
        existing: list[ResourceClaim] = []
        for raw_claim in found.claims:
            raw = _with_uid(raw_claim)
            claim = ResourceClaim.from_api(raw)
            self.claims[_claim_key(raw)] = raw
            if claim.allocation is not None:
                existing.append(claim)
        running: list[JSON] = []
        pending: list[JSON] = []
        finished = 0
        priorities = PriorityClasses(found.priority_classes)
        for pod in self._pods(found, nodes):
            pod = self._admit(pod, found)  # noqa: PLW2901 - the admitted pod replaces it
            pod = priorities.admit(pod)  # noqa: PLW2901
            pod_priority(pod, f"Pod {'/'.join(ns_name(pod))}")
            verdict = self._triage(pod, node_names)
            if verdict == "finished":
                finished += 1
            elif verdict == "running":
                running.append(pod)
            elif verdict == "pending":
                pending.append(pod)
        if finished:
            self.result.notes.append(f"{finished} finished pod(s) (Succeeded or Failed) ignored")
        self._check_running_claims(running)
        # As kube-scheduler's PrioritySort: higher spec.priority first, then input order.
        pending.sort(key=lambda p: -pod_priority(p))
        self.budgets = [budget_from_api(b, running) for b in found.budgets]
        from driver.structured.snapshot import ClusterSnapshot  # noqa: PLC0415 - keeps import cheap

        snapshot = ClusterSnapshot.build(slices, classes.values(), [])
        engine = DecisionEngine(snapshot, nodes, defaults=self.defaults, spreading=self.spreading)
        for claim in existing:
            # With the pods that reserve it: preemption frees a claim's devices only when
            # every one of them is a victim.
            engine.observe_allocation(
                f"{claim.namespace}/{claim.name}",
                claim.allocation,
                reserved_for=[r.uid for r in claim.reserved_for if r.uid],
            )
        for name, labels in found.namespaces.items():
            engine.observe_namespace(name, labels)
        self._owners(engine, found)
        for (kind, key), obj in self.volumes.items():
            engine.observe_volume(kind, key, obj)
        for pod in running:
            # Every running pod counts: its requests, host ports, volumes, and labels and
            # affinity terms for the rules between pods, whichever scheduler placed it.
            namespace, name = ns_name(pod)
            try:
                volumes = PodVolumes.from_pod(pod)
                engine.observe_pod(
                    pod["metadata"]["uid"],
                    str(pod["spec"]["nodeName"]),
                    volumes=None if volumes.empty else volumes,
                    raw=pod,
                )
            except BiaxialError as exc:
                raise ManifestError(f"Pod {namespace}/{name}: {exc}") from exc
            self.result.running += 1
        self.result.startup_seconds = time.perf_counter() - started
        for pod in pending:
            self._place(engine, pod)
        if not pending:
            self.result.notes.append("no pending pod for this scheduler to place")
        self._usage(slices)
        self.result.objects = [
            *(self.claims[key] for key in dict.fromkeys(self.touched)),
            *(self.volumes[key] for key in dict.fromkeys(self.touched_volumes)),
            *self.placed_pods,
        ]
        return self.result

    def _check_running_claims(self, running: Sequence[JSON]) -> None:
        """Refuse a dump whose running pods use claims it does not hold (``kubectl get`` without
        ``resourceclaims``): their devices would look free and be given again."""
        missing: list[str] = []
        for pod in running:
            namespace, _ = ns_name(pod)
            status = pod.get("status") or {}
            named = [
                entry.get("resourceClaimName")
                for entry in (pod.get("spec") or {}).get("resourceClaims") or ()
                if isinstance(entry, Mapping)
            ]
            named += [
                entry.get("resourceClaimName")
                for entry in status.get("resourceClaimStatuses") or ()
                if isinstance(entry, Mapping)
            ]
            extended = status.get("extendedResourceClaimStatus")
            if isinstance(extended, Mapping):
                named.append(extended.get("resourceClaimName"))
            missing += [
                f"{namespace}/{claim}"
                for claim in named
                if isinstance(claim, str) and claim and (namespace, claim) not in self.claims
            ]
        if missing:
            listed = list(dict.fromkeys(missing))
            more = f" and {len(listed) - 3} more" if len(listed) > 3 else ""
            raise ManifestError(
                f"running pods use ResourceClaims the input does not hold "
                f"({', '.join(listed[:3])}{more}), so their GPUs would look free; add them: "
                "kubectl get resourceclaims -A -o yaml (docs/simulator.md gives the whole "
                "dump command)"
            )

    def _owners(self, engine: DecisionEngine, found: _Input) -> None:
        """The selectors default topology spreading reads: Services, and the ReplicaSets and
        StatefulSets given or standing behind a Deployment's pods."""
        for obj in [*found.services, *found.work]:
            kind = str(obj.get("kind"))
            if kind not in ("Service", "ReplicaSet", "StatefulSet", "Deployment"):
                continue
            namespace, name = ns_name(obj)
            selector = (obj.get("spec") or {}).get("selector")
            try:
                if kind == "Deployment":
                    rs_name, rs_selector = deployment_replicaset(obj)
                    engine.observe_owner("ReplicaSet", namespace, rs_name, rs_selector)
                elif kind != "Service" or selector is not None:
                    engine.observe_owner(kind, namespace, name, selector)
            except BiaxialError as exc:
                raise ManifestError(f"{object_label(obj)}: spec.selector: {exc}") from exc

    def _admit(self, pod: JSON, found: _Input) -> JSON:
        """The chart's admission step (``admission`` given) on a pod being created: one the
        input writes or a workload makes, not one a live cluster already has
        (``creationTimestamp``), which went through admission when it was created."""
        if self.admission is None or (pod.get("metadata") or {}).get("creationTimestamp"):
            return pod
        namespace, name = ns_name(pod)
        labels = namespace_labels(namespace, found.namespaces)
        change = admit(pod, labels, self.admission)
        if change is None:
            return pod
        self.result.admissions.append((f"{namespace}/{name}", change.note()))
        return change.apply(pod)

    def _triage(self, pod: JSON, node_names: set[str]) -> str:
        """``running``, ``finished``, ``pending`` (to place), or ``skipped`` (reported)."""
        namespace, name = ns_name(pod)
        key = f"{namespace}/{name}"
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            return "finished"
        node = spec.get("nodeName")
        if node:
            if node not in node_names and meta.get("deletionTimestamp"):
                # a live cluster's state: the node is gone and the pod, being deleted, waits
                # for kube-controller-manager's pod garbage collector to remove it
                self.result.skipped.append(
                    PodFailure(pod=key, reason=f"being deleted (its node {node} is gone)")
                )
                return "skipped"
            if node not in node_names:
                raise ManifestError(
                    f"Pod {key}: spec.nodeName {node!r} is not a node of the cluster"
                )
            return "running"
        reason = None
        scheduler = spec.get("schedulerName") or "default-scheduler"
        if meta.get("deletionTimestamp"):
            reason = "being deleted"
        elif scheduler != self.scheduler_name:
            reason = (
                f"schedulerName {scheduler}: another scheduler's pod (set schedulerName: "
                f"{self.scheduler_name} to have biaxial place it)"
            )
        elif spec.get("schedulingGates"):
            gates = ", ".join(str(g.get("name")) for g in spec["schedulingGates"])
            reason = f"waiting for its scheduling gates to be removed ({gates})"
        if reason is None:
            return "pending"
        self.result.skipped.append(PodFailure(pod=key, reason=reason))
        return "skipped"

    # ------------------------------------------------------------------ per pod
    def _pod_claims(self, pod: JSON) -> tuple[list[tuple[str, JSON]], list[JSON]]:
        """(pod claim name, claim JSON) in spec order; new template claims listed apart."""
        namespace, name = ns_name(pod)
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
            if isinstance(s, Mapping)
        }
        out: list[tuple[str, JSON]] = []
        created: list[JSON] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            claim_name = str(entry["name"])
            named = entry.get("resourceClaimName") or statuses.get(claim_name)
            if named:
                key = (namespace, str(named))
                if key not in self.claims:
                    raise ManifestError(
                        f"pod {namespace}/{name}: resourceclaim {key[0]}/{key[1]} not found"
                    )
                out.append((claim_name, self.claims[key]))
                continue
            template_name = str(entry["resourceClaimTemplateName"])
            template = self.templates.get((namespace, template_name))
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
                    "ownerReferences": [_owned_by_pod(pod)],
                },
                "spec": codec.copy(tspec.get("spec") or {}),
            }
            if not claim["metadata"]["labels"]:
                del claim["metadata"]["labels"]
            out.append((claim_name, claim))
            created.append(claim)
        return out, created

    def _place(self, engine: DecisionEngine, pod: JSON) -> None:
        namespace, name = ns_name(pod)
        pod_key = f"{namespace}/{name}"
        try:
            entries, created = self._pod_claims(pod)
            models = [ResourceClaim.from_api(raw) for _, raw in entries]
        except ManifestError as exc:
            self.result.unschedulable.append(PodFailure(pod=pod_key, reason=str(exc)))
            return
        for claim in self._ephemeral_claims(pod):
            engine.observe_volume("PersistentVolumeClaim", self._volume_key(claim)[1], claim)
        started = time.perf_counter()
        decision = engine.decide(pod, models)
        elapsed = time.perf_counter() - started
        self.result.durations.append(elapsed)
        self.result.decision_seconds += elapsed
        if isinstance(decision, (Unschedulable, PodError)):
            self.result.unschedulable.append(PodFailure(pod=pod_key, reason=decision.message))
            if isinstance(decision, Unschedulable):
                self._preemption(engine, pod, pod_key, models)
            return
        engine.assume(decision, pod)
        self._record(pod, decision, entries, created)
        self._bind_volumes(engine, decision)

    def _ephemeral_claims(self, pod: JSON) -> list[JSON]:
        """The claims the ephemeral volume controller creates for the pod's generic ephemeral
        volumes and does not find: ``<pod>-<volume>`` with the template's metadata and spec,
        owned (controller) by the pod."""
        namespace, name = ns_name(pod)
        out: list[JSON] = []
        for volume in (pod.get("spec") or {}).get("volumes") or ():
            ephemeral = volume.get("ephemeral") if isinstance(volume, Mapping) else None
            if not isinstance(ephemeral, Mapping):
                continue
            template = ephemeral.get("volumeClaimTemplate") or {}
            claim_name = f"{name}-{volume.get('name')}"
            meta = codec.copy(dict(template.get("metadata") or {}))
            meta.update(
                name=claim_name,
                namespace=namespace,
                ownerReferences=[_owned_by_pod(pod)],
            )
            claim: JSON = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": meta,
                "spec": codec.copy(dict(template.get("spec") or {})),
                "status": {"phase": "Pending"},
            }
            if self._volume_key(claim) not in self.volumes:
                out.append(self._add_volume_object(claim))
        return out

    def _bind_volumes(self, engine: DecisionEngine, placement: Placement) -> None:
        """What the controller writes for the placement's volumes before the pod's binding:
        each chosen PV's ``claimRef``, each claim to provision its selected node. A PV bind is
        then completed as the PV controller completes it before the controller binds the pod
        (the claim's ``volumeName``, both ``Bound``), and the engine sees that, as the
        controller's does: a claim bound to a CSI volume counts under the PV's driver."""
        if placement.volumes is None:
            return
        for claim_key, pv_name in placement.volumes.bind:
            claim = self.volumes[("PersistentVolumeClaim", claim_key)]
            namespace, _, name = claim_key.partition("/")
            volume = self.volumes[("PersistentVolume", pv_name)]
            volume.setdefault("spec", {})["claimRef"] = {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": namespace,
                "name": name,
                "uid": claim["metadata"]["uid"],
            }
            volume["status"] = {"phase": "Bound"}
            claim.setdefault("spec", {})["volumeName"] = pv_name
            claim["metadata"]["annotations"] = {
                **(claim["metadata"].get("annotations") or {}),
                ANN_BIND_COMPLETED: "yes",
                ANN_BOUND_BY_CONTROLLER: "yes",
            }
            claim["status"] = {"phase": "Bound"}
            engine.observe_volume("PersistentVolume", pv_name, volume)
            engine.observe_volume("PersistentVolumeClaim", claim_key, claim)
            self.touched_volumes += [
                ("PersistentVolumeClaim", claim_key),
                ("PersistentVolume", pv_name),
            ]
        for claim_key in placement.volumes.provision:
            key = ("PersistentVolumeClaim", claim_key)
            meta = self.volumes[key]["metadata"]
            meta["annotations"] = {
                **(meta.get("annotations") or {}),
                ANN_SELECTED_NODE: placement.node,
            }
            self.touched_volumes.append(key)

    def _preemption(
        self, engine: DecisionEngine, pod: JSON, pod_key: str, models: list[ResourceClaim]
    ) -> None:
        """Report which running pods ``pod`` would preempt (the engine's dry run); nothing is
        evicted or nominated, so the pods after it see the cluster unchanged."""
        found = engine.preempt(pod, models, self.budgets)
        if isinstance(found, Preemption):
            self.result.preemptions.append(
                PodPreemption(
                    pod=pod_key,
                    node=found.node,
                    victims=tuple(f"{v.namespace}/{v.name}" for v in found.victims),
                    violations=found.violations,
                )
            )

    def _record(
        self,
        pod: JSON,
        placement: Placement,
        entries: list[tuple[str, JSON]],
        created: list[JSON],
    ) -> None:
        namespace, name = ns_name(pod)
        uid = pod["metadata"]["uid"]
        consumer = {"resource": "pods", "name": name, "uid": uid}
        allocations = {claim.key: allocation for claim, allocation in placement.claims}
        for raw in created:
            self.claims[(namespace, str(raw["metadata"]["name"]))] = raw
        devices: list[JSON] = []
        for _, raw in entries:
            key = (str(raw["metadata"]["namespace"]), str(raw["metadata"]["name"]))
            status = raw.setdefault("status", {})
            allocation = allocations.get(f"{key[0]}/{key[1]}")
            if allocation is not None:
                status["allocation"] = allocation.to_api()
            reserved = status.setdefault("reservedFor", [])
            if consumer not in reserved:
                reserved.append(consumer)
            self.touched.append(key)
            current = status.get("allocation")
            if current:  # this pod's allocation, or the one it shares
                devices.extend(
                    self._device_rows(key[1], AllocationResult.from_api(current, key[1]))
                )
        out_pod = codec.copy(pod)
        out_pod.setdefault("spec", {})["nodeName"] = placement.node
        status = out_pod.setdefault("status", {})
        if entries:
            status["resourceClaimStatuses"] = [
                {"name": claim_name, "resourceClaimName": raw["metadata"]["name"]}
                for claim_name, raw in entries
            ]
        if placement.bridge is not None and placement.bridge_allocation is not None:
            claim_name = f"{name}-extended-resources-{generated_suffix(uid + '/extended')}"
            bridge = codec.copy(placement.bridge.claim)
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
            self.touched.append(key)
            status["extendedResourceClaimStatus"] = placement.bridge.pod_status(claim_name)
            devices.extend(self._device_rows(claim_name, placement.bridge_allocation))
        self.placed_pods.append(out_pod)
        self.result.placements.append(
            PodPlacement(
                pod=f"{namespace}/{name}",
                node=placement.node,
                devices=tuple(devices),
                policies=placement.policies,
            )
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
            if r.admin_access:
                row["adminAccess"] = True
            if r.consumed_capacity is not None:
                row["consumedCapacity"] = {
                    k: str(v) for k, v in sorted(r.consumed_capacity.items())
                }
            rows.append(row)
        return rows

    # ------------------------------------------------------------------ use
    def _usage(self, slices: Iterable[ResourceSlice]) -> None:
        """Per physical GPU: what every allocated claim holds (admin access is not use),
        with the pods each claim is reserved for."""
        held: dict[tuple[str, str, str], list[tuple[tuple[str, ...], int | None, int | None]]]
        held = {}
        for (namespace, _), raw in self.claims.items():
            allocation = (raw.get("status") or {}).get("allocation")
            if not allocation:
                continue
            holders = tuple(
                f"{namespace}/{r.get('name')}"
                for r in (raw.get("status") or {}).get("reservedFor") or ()
                if isinstance(r, Mapping) and r.get("resource") == "pods"
            ) or (f"{namespace}/{raw['metadata']['name']} (claim)",)
            for r in AllocationResult.from_api(allocation, "allocation").results:
                if r.admin_access:
                    continue
                consumed = r.consumed_capacity
                memory = consumed["memory"].value() if consumed and "memory" in consumed else None
                cores = consumed["cores"].value() if consumed and "cores" in consumed else None
                held.setdefault((r.driver, r.pool, r.device), []).append((holders, memory, cores))
        position = {name: i for i, name in enumerate(self.result.node_names)}
        migs: dict[tuple[str, str], list[tuple[Device, PartitionUsage]]] = {}
        gpus: list[GpuUsage] = []
        ordered = sorted(slices, key=lambda s: (position.get(s.node_name or "", -1), s.name))
        dynamic = _DynamicMig(ordered, held)
        for s in ordered:
            if s.driver != DEFAULT_DRIVER_NAME:
                continue
            node = str(s.node_name or s.pool.name)
            for d in s.devices:
                if dynamic.is_placement(d):
                    continue  # a possible partition: listed under its GPU once taken
                memory = _capacity(d, "memory")
                cores = _capacity(d, "cores")
                uses = held.get((s.driver, s.pool.name, d.name), [])
                if d.attributes.get("type") == "mig":
                    parent = str(d.attributes.get("parentUUID", ""))
                    part = PartitionUsage(
                        device=d.name,
                        profile=str(d.attributes.get("profile", "")),
                        memory=memory,
                        pods=tuple(p for holders, _, _ in uses for p in holders),
                    )
                    migs.setdefault((node, parent), []).append((d, part))
                    continue
                pods: list[tuple[str, int]] = []
                used_memory = used_cores = 0
                for claim_pods, share_memory, share_cores in uses:
                    amount = memory if share_memory is None else share_memory
                    used_memory += amount
                    used_cores += (
                        cores
                        if share_memory is None and share_cores is None
                        else (share_cores or 0)
                    )
                    pods.extend((p, amount) for p in claim_pods)
                usage = GpuUsage(
                    node=node,
                    device=d.name,
                    uuid=str(d.attributes.get("uuid", "")),
                    product=str(d.attributes.get("productName", "")),
                    memory=memory,
                    memory_used=used_memory,
                    cores=cores,
                    cores_used=used_cores,
                    pods=tuple(pods),
                )
                gpus.append(dynamic.with_partitions(s, d, usage))
        for (node, parent), parts in migs.items():
            first = parts[0][0]
            minor = first.attributes.get("minor", first.attributes.get("index", ""))
            partitions = tuple(p for _, p in sorted(parts, key=lambda x: x[0].name))
            gpus.append(
                GpuUsage(
                    node=node,
                    device=f"gpu-{minor}",
                    uuid=parent,
                    product=str(first.attributes.get("productName", "")),
                    memory=sum(p.memory for p in partitions),
                    memory_used=sum(p.memory for p in partitions if p.pods),
                    cores=100,
                    cores_used=0,
                    pods=(),
                    partitions=partitions,
                )
            )
        self.result.gpus = sorted(
            gpus, key=lambda g: (position.get(g.node, -1), _device_order(g.device))
        )


def _replicaset_of(deployment: Mapping[str, Any]) -> JSON:
    """The ReplicaSet the simulator's Deployment pods name as their controller."""
    namespace, _ = ns_name(deployment)
    name, _ = deployment_replicaset(deployment)
    return {
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": stable_uid("ReplicaSet", namespace, name),
        },
    }


Held = Mapping[tuple[str, str, str], Sequence[tuple[tuple[str, ...], int | None, int | None]]]
"""(driver, pool, device) -> per allocated claim: the pods holding it, memory, cores."""


class _DynamicMig:
    """Dynamic-MIG bookkeeping of a simulated cluster: which devices are placements, which
    were taken (the partitions the plugin would create), and what is left of each GPU's
    counter set."""

    def __init__(self, slices: Sequence[ResourceSlice], held: Held) -> None:
        self.held = held
        self.left: dict[tuple[str, str, str], dict[str, int]] = {}  # (driver, pool, set)
        self.members: dict[tuple[str, str, str], list[tuple[Device, dict[str, int]]]] = {}
        for s in slices:
            for counter_set in s.shared_counters:
                key = (s.driver, s.pool.name, counter_set.name)
                self.left[key] = {k: v.value() for k, v in counter_set.counters.items()}
        for s in slices:
            for d in s.devices:
                for consumption in d.consumes_counters:
                    key = (s.driver, s.pool.name, consumption.name)
                    amounts = {k: v.value() for k, v in consumption.counters.items()}
                    self.members.setdefault(key, []).append((d, amounts))
                    if (s.driver, s.pool.name, d.name) in held and key in self.left:
                        for counter, amount in amounts.items():
                            self.left[key][counter] = self.left[key].get(counter, 0) - amount

    @staticmethod
    def is_placement(device: Device) -> bool:
        return bool(device.consumes_counters) and device.attributes.get("type") == "mig"

    def with_partitions(self, s: ResourceSlice, device: Device, usage: GpuUsage) -> GpuUsage:
        """A dynamic GPU's row with its partitions, free slices and largest placeable."""
        if not device.consumes_counters:
            return usage
        key = (s.driver, s.pool.name, device.consumes_counters[0].name)
        left = self.left.get(key, {})
        slots = sorted(c for c in left if c.startswith(MEMORY_SLICE_PREFIX))
        partitions: list[PartitionUsage] = []
        for member, amounts in self.members.get(key, ()):
            uses = self.held.get((s.driver, s.pool.name, member.name))
            if not self.is_placement(member) or not uses:
                continue
            starts = sorted(
                int(c.removeprefix(MEMORY_SLICE_PREFIX))
                for c in amounts
                if c.startswith(MEMORY_SLICE_PREFIX)
            )
            partitions.append(
                PartitionUsage(
                    device=member.name,
                    profile=str(member.attributes.get("profile", "")),
                    memory=_capacity(member, "memory"),
                    pods=tuple(dict.fromkeys(p for holders, _, _ in uses for p in holders)),
                    start=starts[0] if starts else 0,
                    size=len(starts),
                )
            )
        partitions.sort(key=lambda p: (p.start or 0, p.device))
        placeable = [
            member
            for member, amounts in self.members.get(key, ())
            if self.is_placement(member) and all(left.get(c, 0) >= a for c, a in amounts.items())
        ]
        largest = max(
            placeable,
            key=lambda m: (_capacity(m, "memory"), _capacity(m, "cores")),
            default=None,
        )
        return replace(
            usage,
            memory_used=usage.memory_used + sum(p.memory for p in partitions),
            partitions=tuple(partitions),
            memory_slices=len(slots),
            free_slices=sum(1 for c in slots if left[c] > 0),
            largest_placeable=str(largest.attributes.get("profile", "")) if largest else "",
        )


#: kubelet's default --max-pods, for a Node object that gives no allocatable pods
DEFAULT_MAX_PODS: Final = 110


def pod_slots(nodes: Sequence[Node]) -> int:
    """How many pods the nodes can run at most: their allocatable ``pods`` added up."""
    total = 0
    for node in nodes:
        pods = node.allocatable.get("pods")
        total += pods.value() if pods is not None else DEFAULT_MAX_PODS
    return total


def _capacity(device: Device, name: str) -> int:
    return device.capacity[name].value.value() if name in device.capacity else 0


def _owned_by_pod(pod: Mapping[str, Any]) -> JSON:
    """The controller owner reference a claim created for ``pod`` carries."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": ns_name(pod)[1],
        "uid": pod["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _device_order(name: str) -> tuple[int, str]:
    digits = name.removeprefix("gpu-")
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


def _with_uid(obj: Mapping[str, Any]) -> JSON:
    out: JSON = codec.copy(dict(obj))
    meta = dict(out.get("metadata") or {})
    namespace, name = ns_name(out)
    meta["namespace"] = namespace
    meta.setdefault("uid", stable_uid(str(out.get("kind")), namespace, name))
    out["metadata"] = meta
    return out


def simulate(
    objects: Sequence[Mapping[str, Any]],
    *,
    default_classes: Sequence[Mapping[str, Any]] = (),
    defaults: PolicyDefaults | None = None,
    scheduler_name: str = DEFAULT_SCHEDULER,
    base_dirs: Sequence[Path | None] | None = None,
    spreading: DefaultSpreading | None = None,
    admission: AdmissionScope | None = None,
) -> SimulationResult:
    """Run the simulation (see the module docstring). ``base_dirs`` gives, per object, the
    folder of the file it came from (an inventory's profile paths are relative to it);
    ``spreading``: the default topology spread constraints (kube-scheduler's System defaults
    unless given, as the controller's); ``admission``: the chart's admission step's scope, to
    apply it to the pods being created (:mod:`biaxial.simulate.admission`). Raises
    ManifestError for bad input for the run; everything about single pods is reported in the
    result."""
    return _Run(
        objects,
        default_classes,
        defaults or PolicyDefaults(),
        scheduler_name,
        base_dirs,
        spreading=spreading,
        admission=admission,
    ).run()


def project_deviceclasses() -> list[JSON]:
    """The project's DeviceClasses (:func:`project_deviceclasses_dir`), which ``biaxial
    simulate`` and ``biaxial allocate`` load before their input's own (the input's win by
    name)."""
    from biaxial.simulate.manifests import load_objects  # noqa: PLC0415 - only for the CLI

    directory = project_deviceclasses_dir()
    paths = [str(p) for p in sorted(directory.iterdir()) if p.suffix in (".yaml", ".yml")]
    return [o for o in load_objects(paths) if o.get("kind") == "DeviceClass"]


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
    "PartitionUsage",
    "PodFailure",
    "PodPlacement",
    "SimulationResult",
    "build_inventory",
    "check_pod_object",
    "expand_deployment",
    "project_deviceclasses_dir",
    "simulate",
]

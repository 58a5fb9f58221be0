"""Reading a run's input for ``biaxial simulate``: what the API server refuses in a pod, the
objects sorted by role, the cluster (inventory and Node/ResourceSlice objects), the classes,
the volume kinds, and every pod to place (workloads expanded as their controllers would)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from biaxial.simulate.cluster import (
    INVENTORY_API_VERSION,
    build_inventory,
    node_from_object,
    slice_from_object,
)
from biaxial.simulate.kinds import classify, object_label
from biaxial.simulate.workloads import (
    deployment_replicaset,
    expand,
    ns_name,
    owned_by,
    requested_pods,
    stable_uid,
    statefulset_claims,
)
from driver.api.claims import DeviceClass
from driver.api.errors import ManifestError
from driver.api.model import JSON, ResourceSlice
from driver.api.nodes import Node
from driver.cel.formats import is_dns1123_label, is_dns1123_subdomain
from driver.scheduling.storage import (
    StorageClass,
    default_storage_class,
    with_default_class,
)
from kubeapi import codec

ADMIN_ACCESS_LABEL: Final = "resource.kubernetes.io/admin-access"
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})


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


def _identity(obj: Mapping[str, Any], namespaced: bool) -> tuple[str, str, str]:
    namespace, name = ns_name(obj)
    return (str(obj.get("kind")), namespace if namespaced else "", name)


@dataclass(slots=True)
class Input:
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


class Reading:
    """The input half of a run: the objects sorted by role (:meth:`collect`), the cluster they
    describe (:meth:`cluster`), the classes, and every pod to place (:meth:`pods`: given ones
    and the workloads' missing pods). Keeps the volume kinds' objects the engine will read
    (:attr:`volumes`, with their UIDs and the default StorageClass applied) and the notes the
    result reports."""

    def __init__(
        self,
        objects: Sequence[Mapping[str, Any]],
        default_classes: Sequence[Mapping[str, Any]],
        base_dirs: Sequence[Path | None] | None,
    ) -> None:
        self.objects = objects
        self.default_classes = default_classes
        self.base_dirs = base_dirs
        #: (kind, namespace/name or name) -> object, for every kind the volume rules read
        self.volumes: dict[tuple[str, str], JSON] = {}
        self.default_storage_class: StorageClass | None = None
        self.notes: list[str] = []

    def collect(self) -> Input:
        found = Input()
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
            self.notes.append(
                f"skipped {sum(found.skipped.values())} object(s) that do not affect "
                f"scheduling: {listed}"
            )
        return found

    def cluster(self, found: Input) -> tuple[list[Node], list[ResourceSlice]]:
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
            self.add_volume_object(raw)
        for raw in found.volumes:
            if self.volume_key(raw) in self.volumes:
                raise ManifestError(f"{object_label(raw)}: given twice (inventory and object)")
            self.add_volume_object(raw)
        return nodes, slices

    @staticmethod
    def volume_key(raw: Mapping[str, Any]) -> tuple[str, str]:
        kind = str(raw.get("kind"))
        namespace, name = ns_name(raw)
        return (kind, f"{namespace}/{name}" if classify(raw).namespaced else name)

    def add_volume_object(self, raw: Mapping[str, Any]) -> JSON:
        """Keep a volume kind's object (a copy, with a UID) for the engine. A claim without a
        class and not yet bound gets the default StorageClass, as admission gives it to a new
        claim and the PV controller to an older unbound one (retroactive assignment)."""
        key = self.volume_key(raw)
        spec = raw.get("spec")
        if key[0] == "PersistentVolumeClaim" and not (
            isinstance(spec, Mapping) and spec.get("volumeName")
        ):
            raw = with_default_class(raw, self.default_storage_class)
        if classify(raw).namespaced:
            obj = with_uid(raw)
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
    def check_admin_access(found: Input) -> None:
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

    def classes(self, found: Input) -> dict[str, DeviceClass]:
        classes: dict[str, DeviceClass] = {}
        for raw in [*self.default_classes, *found.classes]:
            dc = DeviceClass.from_api(raw)
            classes[dc.name] = dc
        return classes

    def pods(self, found: Input, nodes: Sequence[Node]) -> list[JSON]:
        """Every pod of the run, in input order: given ones, then each workload's missing
        pods at the workload's position."""
        given = [with_uid(o) for o in found.work if o.get("kind") == "Pod"]
        for pod in given:
            check_pod_object(pod)
        replica_sets = [o for o in found.work if o.get("kind") == "ReplicaSet"]
        room = pod_slots(nodes)
        out: list[JSON] = []
        for obj in found.work:
            kind = obj.get("kind")
            if kind == "Pod":
                out.append(with_uid(obj))
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
                out.append(with_uid(pod))
                if kind == "StatefulSet":
                    # The StatefulSet controller creates the claims it does not find.
                    for claim in statefulset_claims(obj, ns_name(pod)[1]):
                        if self.volume_key(claim) not in self.volumes:
                            self.add_volume_object(claim)
        names = [ns_name(p) for p in out]
        duplicate = next((n for n, c in Counter(names).items() if c > 1), None)
        if duplicate is not None:
            raise ManifestError(f"Pod {duplicate[0]}/{duplicate[1]}: given twice")
        return out


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


#: kubelet's default --max-pods, for a Node object that gives no allocatable pods
DEFAULT_MAX_PODS: Final = 110


def pod_slots(nodes: Sequence[Node]) -> int:
    """How many pods the nodes can run at most: their allocatable ``pods`` added up."""
    total = 0
    for node in nodes:
        pods = node.allocatable.get("pods")
        total += pods.value() if pods is not None else DEFAULT_MAX_PODS
    return total


def with_uid(obj: Mapping[str, Any]) -> JSON:
    out: JSON = codec.copy(dict(obj))
    meta = dict(out.get("metadata") or {})
    namespace, name = ns_name(out)
    meta["namespace"] = namespace
    meta.setdefault("uid", stable_uid(str(out.get("kind")), namespace, name))
    out["metadata"] = meta
    return out

"""The storage model kube-scheduler's volume rules read: PersistentVolumeClaims,
PersistentVolumes, StorageClasses, CSINodes, CSIDrivers, CSIStorageCapacities and
VolumeAttachments as frozen values parsed from their API objects, the volumes of one pod
(:class:`PodVolumes`), the PV controller's annotations and the in-tree plugins' CSI names, and
what a placement writes for its volumes (:class:`VolumeBindings`). The rules themselves, and the
cluster's volume state they read, are :mod:`driver.scheduling.volumes`. Nothing here mutates its
inputs; models are frozen.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from driver.api.errors import ManifestError, QuantityError
from driver.api.nodes import Node, node_selector_matches
from driver.api.quantity import Quantity

# The PV controller's contract (k8s.io/component-helpers/storage/volume).
ANN_SELECTED_NODE: Final = "volume.kubernetes.io/selected-node"
ANN_BIND_COMPLETED: Final = "pv.kubernetes.io/bind-completed"
ANN_BOUND_BY_CONTROLLER: Final = "pv.kubernetes.io/bound-by-controller"
ANN_STORAGE_PROVISIONER: Final = "volume.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_CLASS: Final = "volume.beta.kubernetes.io/storage-class"
ANN_DEFAULT_CLASS: Final = "storageclass.kubernetes.io/is-default-class"
ANN_BETA_DEFAULT_CLASS: Final = "storageclass.beta.kubernetes.io/is-default-class"
ANN_MIGRATED_PLUGINS: Final = "storage.alpha.kubernetes.io/migrated-plugins"
NO_PROVISIONER: Final = "kubernetes.io/no-provisioner"
WAIT_FOR_FIRST_CONSUMER: Final = "WaitForFirstConsumer"
READ_WRITE_ONCE_POD: Final = "ReadWriteOncePod"


_ZONE: Final = "topology.kubernetes.io/zone"
_REGION: Final = "topology.kubernetes.io/region"
_BETA_ZONE: Final = "failure-domain.beta.kubernetes.io/zone"
_BETA_REGION: Final = "failure-domain.beta.kubernetes.io/region"
#: VolumeZone's labels, in upstream's order, and the GA label a beta one falls back to.
TOPOLOGY_LABELS: Final = (_BETA_ZONE, _BETA_REGION, _ZONE, _REGION)
GA_LABEL: Final = {_BETA_ZONE: _ZONE, _BETA_REGION: _REGION}

#: In-tree volume sources counted under a CSI driver when migrated (csi-translation-lib):
#: pod/PV field -> (in-tree plugin, CSI driver, the field naming the volume).
IN_TREE: Final[Mapping[str, tuple[str, str, str]]] = {
    "awsElasticBlockStore": ("kubernetes.io/aws-ebs", "ebs.csi.aws.com", "volumeID"),
    "gcePersistentDisk": ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io", "pdName"),
    "azureDisk": ("kubernetes.io/azure-disk", "disk.csi.azure.com", "diskURI"),
    "azureFile": ("kubernetes.io/azure-file", "file.csi.azure.com", "shareName"),
    "cinder": ("kubernetes.io/cinder", "cinder.csi.openstack.org", "volumeID"),
    "portworxVolume": ("kubernetes.io/portworx-volume", "pxd.portworx.com", "volumeID"),
    "vsphereVolume": ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com", "volumePath"),
}
CSI_OF_PLUGIN: Final = {plugin: driver for plugin, driver, _ in IN_TREE.values()}

#: The kinds the volume rules' state reads (``driver.scheduling.volumes.ClusterVolumes``; all
#: but PersistentVolumeClaim and CSIStorageCapacity are cluster-scoped).
VOLUME_KINDS: Final = frozenset(
    {
        "PersistentVolumeClaim",
        "PersistentVolume",
        "StorageClass",
        "CSINode",
        "CSIDriver",
        "CSIStorageCapacity",
        "VolumeAttachment",
    }
)


# --------------------------------------------------------------------------- small helpers


def metadata_of(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = raw.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def nanos_of(value: Any, where: str) -> int:
    try:
        return Quantity.of(value).nanos
    except QuantityError as exc:
        raise ManifestError(f"{where}: {exc}") from exc


def bytes_of(nanos: int) -> int:
    """A quantity's ``Value()``: whole units, rounded up."""
    return -(-nanos // 10**9)


def zones_of(value: str) -> frozenset[str] | None:
    """The zones a topology label lists (``a__b``: both); None when malformed (an empty
    item), which VolumeZone ignores as upstream's ``LabelZonesToSet`` error."""
    items = [item.strip() for item in value.split("__")]
    if any(not item for item in items):
        return None
    return frozenset(items)


def topology_matches(
    terms: Sequence[Mapping[str, frozenset[str]]], labels: Mapping[str, str]
) -> bool:
    """``MatchTopologySelectorTerms``: no terms match every node; terms are ORed, each term's
    ``matchLabelExpressions`` ANDed (the label present with one of the values)."""
    if not terms:
        return True
    return any(all(labels.get(k) in values for k, values in term.items()) for term in terms)


def _labels_node(labels: Mapping[str, str]) -> Node:
    return Node(name="", labels=labels)  # type: ignore[arg-type]  # labels only, as upstream


def volume_node_affinity_matches(pv: PersistentVolume, labels: Mapping[str, str]) -> bool:
    """``CheckNodeAffinity``: the PV's required node affinity against a node's labels only."""
    if pv.node_affinity is None:
        return True
    return node_selector_matches(
        pv.node_affinity, _labels_node(labels), f"PersistentVolume {pv.name} node affinity"
    )


# --------------------------------------------------------------------------- models


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A PV's ``spec.claimRef`` (uid empty: pre-bound by name)."""

    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class StorageClass:
    """The parts of a ``storage.k8s.io/v1`` StorageClass the rules read."""

    name: str
    provisioner: str = ""
    binding_mode: str | None = "Immediate"  # None: unset (the API server always defaults it)
    #: ``allowedTopologies``: per term, label -> allowed values
    allowed_topologies: tuple[Mapping[str, frozenset[str]], ...] = ()
    default: bool = False
    created: str = ""

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> StorageClass:
        meta = metadata_of(raw)
        name = str(meta.get("name") or "")
        if not name:
            raise ManifestError("StorageClass: metadata.name is required")
        terms: list[Mapping[str, frozenset[str]]] = []
        for term in raw.get("allowedTopologies") or ():
            if not isinstance(term, Mapping):
                raise ManifestError(f"StorageClass {name}: allowedTopologies must hold objects")
            terms.append(
                {
                    str(e.get("key")): frozenset(str(v) for v in e.get("values") or ())
                    for e in term.get("matchLabelExpressions") or ()
                }
            )
        mode = raw.get("volumeBindingMode")
        return cls(
            name=name,
            provisioner=str(raw.get("provisioner") or ""),
            binding_mode=str(mode) if mode is not None else None,
            allowed_topologies=tuple(terms),
            # IsDefaultAnnotation: the GA annotation or its beta twin
            default="true"
            in (
                (meta.get("annotations") or {}).get(ANN_DEFAULT_CLASS),
                (meta.get("annotations") or {}).get(ANN_BETA_DEFAULT_CLASS),
            ),
            created=str(meta.get("creationTimestamp") or ""),
        )

    @property
    def delays_binding(self) -> bool:
        return self.binding_mode == WAIT_FOR_FIRST_CONSUMER


def default_storage_class(classes: Iterable[StorageClass]) -> StorageClass | None:
    """``GetDefaultClass``: of the classes marked default, the newest (creationTimestamp), and
    of equally new ones the first by name; None when none is marked."""
    defaults = sorted((c for c in classes if c.default), key=lambda c: c.name)
    # max() keeps the first of equal keys: the lowest name among the newest
    return max(defaults, key=lambda c: c.created, default=None)


def with_default_class(claim: Mapping[str, Any], default: StorageClass | None) -> dict[str, Any]:
    """The PersistentVolumeClaim as the DefaultStorageClass admission plugin admits it on
    create: a claim with no class at all (``spec.storageClassName`` absent and no beta
    annotation; ``""`` is a class, "none") gets the default class's name. A copy; the input
    is not changed."""
    out = copy.deepcopy(dict(claim))
    annotations = metadata_of(out).get("annotations") or {}
    spec = out.get("spec")
    if default is None or ANN_BETA_STORAGE_CLASS in annotations or not isinstance(spec, dict):
        return out
    if spec.get("storageClassName") is None:
        spec["storageClassName"] = default.name
    return out


def claim_class_of(raw: Mapping[str, Any]) -> str:
    """``GetPersistentVolumeClaimClass`` / ``GetPersistentVolumeClass``: the beta annotation
    first, then ``spec.storageClassName``, else the empty class."""
    annotations = metadata_of(raw).get("annotations") or {}
    if ANN_BETA_STORAGE_CLASS in annotations:
        return str(annotations[ANN_BETA_STORAGE_CLASS])
    return str((raw.get("spec") or {}).get("storageClassName") or "")


@dataclass(frozen=True, slots=True)
class PersistentVolumeClaim:
    """The parts of a v1 PersistentVolumeClaim the rules read (quantities in nano-units)."""

    namespace: str
    name: str
    uid: str = ""
    storage_class: str = ""
    access_modes: frozenset[str] = frozenset()
    request: int = 0
    volume_name: str = ""
    volume_mode: str = "Filesystem"
    selector: Mapping[str, Any] | None = None
    attributes_class: str = ""
    selected_node: str | None = None
    bind_completed: bool = False
    phase: str = ""
    deleting: bool = False
    controller_uid: str = ""  # the owner reference with controller=true

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def fully_bound(self) -> bool:
        """``isPVCFullyBound``: a volume name and the bind-completed annotation."""
        return bool(self.volume_name) and self.bind_completed

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> PersistentVolumeClaim:
        meta = metadata_of(raw)
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        if not name:
            raise ManifestError("PersistentVolumeClaim: metadata.name is required")
        where = f"PersistentVolumeClaim {namespace}/{name}"
        spec = raw.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise ManifestError(f"{where}: spec must be an object")
        annotations = meta.get("annotations") or {}
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
        controller = next(
            (
                str(ref.get("uid") or "")
                for ref in meta.get("ownerReferences") or ()
                if isinstance(ref, Mapping) and ref.get("controller")
            ),
            "",
        )
        selector = spec.get("selector")
        return cls(
            namespace=namespace,
            name=name,
            uid=str(meta.get("uid") or ""),
            storage_class=claim_class_of(raw),
            access_modes=frozenset(str(m) for m in spec.get("accessModes") or ()),
            request=nanos_of(storage, f"{where}: resources.requests.storage")
            if storage is not None
            else 0,
            volume_name=str(spec.get("volumeName") or ""),
            volume_mode=str(spec.get("volumeMode") or "Filesystem"),
            selector=dict(selector) if isinstance(selector, Mapping) else None,
            attributes_class=str(spec.get("volumeAttributesClassName") or ""),
            selected_node=str(annotations[ANN_SELECTED_NODE])
            if ANN_SELECTED_NODE in annotations
            else None,
            bind_completed=ANN_BIND_COMPLETED in annotations,
            phase=str((raw.get("status") or {}).get("phase") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            controller_uid=controller,
        )


def _in_tree_source(spec: Mapping[str, Any]) -> tuple[str, str] | None:
    """(in-tree plugin, volume id) of a migratable in-tree volume source, if it is one."""
    for field_name, (plugin, _, id_field) in IN_TREE.items():
        source = spec.get(field_name)
        if isinstance(source, Mapping):
            return plugin, str(source.get(id_field) or "")
    return None


@dataclass(frozen=True, slots=True)
class PersistentVolume:
    """The parts of a v1 PersistentVolume the rules read (capacity in nano-units)."""

    name: str
    storage_class: str = ""
    capacity: int = 0
    access_modes: frozenset[str] = frozenset()
    volume_mode: str = "Filesystem"
    attributes_class: str = ""
    claim_ref: ClaimRef | None = None
    phase: str = ""
    deleting: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    node_affinity: Mapping[str, Any] | None = None  # spec.nodeAffinity.required
    csi: tuple[str, str] | None = None  # (driver, volume handle)
    in_tree: tuple[str, str] | None = None  # (in-tree plugin, volume id), migratable kinds

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> PersistentVolume:
        meta = metadata_of(raw)
        name = str(meta.get("name") or "")
        if not name:
            raise ManifestError("PersistentVolume: metadata.name is required")
        where = f"PersistentVolume {name}"
        spec = raw.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise ManifestError(f"{where}: spec must be an object")
        ref = spec.get("claimRef")
        claim_ref = None
        if isinstance(ref, Mapping):
            claim_ref = ClaimRef(
                namespace=str(ref.get("namespace") or ""),
                name=str(ref.get("name") or ""),
                uid=str(ref.get("uid") or ""),
            )
        storage = (spec.get("capacity") or {}).get("storage")
        required = (spec.get("nodeAffinity") or {}).get("required")
        csi = spec.get("csi")
        return cls(
            name=name,
            storage_class=claim_class_of(raw),
            capacity=nanos_of(storage, f"{where}: capacity.storage") if storage is not None else 0,
            access_modes=frozenset(str(m) for m in spec.get("accessModes") or ()),
            volume_mode=str(spec.get("volumeMode") or "Filesystem"),
            attributes_class=str(spec.get("volumeAttributesClassName") or ""),
            claim_ref=claim_ref,
            phase=str((raw.get("status") or {}).get("phase") or ""),
            deleting=bool(meta.get("deletionTimestamp")),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            node_affinity=dict(required) if isinstance(required, Mapping) else None,
            csi=(str(csi.get("driver") or ""), str(csi.get("volumeHandle") or ""))
            if isinstance(csi, Mapping)
            else None,
            in_tree=_in_tree_source(spec),
        )

    def bound_to(self, claim: PersistentVolumeClaim) -> bool:
        """``IsVolumeBoundToClaim``: the claimRef names the claim (and its UID, if it has one)."""
        ref = self.claim_ref
        if ref is None or ref.name != claim.name or ref.namespace != claim.namespace:
            return False
        return not ref.uid or ref.uid == claim.uid


@dataclass(frozen=True, slots=True)
class CSINodeInfo:
    """A ``storage.k8s.io/v1`` CSINode: its drivers (with ``allocatable.count``, None when
    unlimited) and the in-tree plugins it runs migrated."""

    name: str
    drivers: Mapping[str, int | None] = field(default_factory=dict)
    migrated: frozenset[str] = frozenset()

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> CSINodeInfo:
        meta = metadata_of(raw)
        name = str(meta.get("name") or "")
        if not name:
            raise ManifestError("CSINode: metadata.name is required")
        drivers: dict[str, int | None] = {}
        for driver in (raw.get("spec") or {}).get("drivers") or ():
            if not isinstance(driver, Mapping) or not driver.get("name"):
                raise ManifestError(f"CSINode {name}: a driver without a name")
            count = (driver.get("allocatable") or {}).get("count")
            drivers[str(driver["name"])] = int(count) if count is not None else None
        migrated = str((meta.get("annotations") or {}).get(ANN_MIGRATED_PLUGINS) or "")
        return cls(
            name=name,
            drivers=drivers,
            migrated=frozenset(p for p in migrated.split(",") if p),
        )


@dataclass(frozen=True, slots=True)
class CSIDriverInfo:
    """A ``storage.k8s.io/v1`` CSIDriver: whether it publishes storage capacity and whether
    nodes that do not report it are refused pods that need it."""

    name: str
    storage_capacity: bool = False
    prevent_if_missing: bool = False

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> CSIDriverInfo:
        name = str(metadata_of(raw).get("name") or "")
        if not name:
            raise ManifestError("CSIDriver: metadata.name is required")
        spec = raw.get("spec") or {}
        return cls(
            name=name,
            storage_capacity=spec.get("storageCapacity") is True,
            prevent_if_missing=spec.get("preventPodSchedulingIfMissing") is True,
        )


@dataclass(frozen=True, slots=True)
class StorageCapacity:
    """A ``storage.k8s.io/v1`` CSIStorageCapacity (sizes in bytes)."""

    key: str
    storage_class: str
    node_topology: Mapping[str, Any] | None = None
    capacity: int | None = None
    maximum_volume_size: int | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> StorageCapacity:
        meta = metadata_of(raw)
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"
        where = f"CSIStorageCapacity {key}"
        topology = raw.get("nodeTopology")
        capacity = raw.get("capacity")
        maximum = raw.get("maximumVolumeSize")
        return cls(
            key=key,
            storage_class=str(raw.get("storageClassName") or ""),
            node_topology=dict(topology) if isinstance(topology, Mapping) else None,
            capacity=bytes_of(nanos_of(capacity, f"{where}: capacity"))
            if capacity is not None
            else None,
            maximum_volume_size=bytes_of(nanos_of(maximum, f"{where}: maximumVolumeSize"))
            if maximum is not None
            else None,
        )

    def limit(self) -> int | None:
        """``volumeLimit``: the maximum volume size where published, else the capacity."""
        return self.maximum_volume_size if self.maximum_volume_size is not None else self.capacity


@dataclass(frozen=True, slots=True)
class VolumeAttachment:
    """A ``storage.k8s.io/v1`` VolumeAttachment: a volume attached (or attaching) to a node."""

    name: str
    node: str
    attacher: str
    pv_name: str | None = None
    inline_handle: str | None = None  # spec.source.inlineVolumeSpec.csi.volumeHandle

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> VolumeAttachment:
        name = str(metadata_of(raw).get("name") or "")
        if not name:
            raise ManifestError("VolumeAttachment: metadata.name is required")
        spec = raw.get("spec") or {}
        source = spec.get("source") or {}
        inline = ((source.get("inlineVolumeSpec") or {}).get("csi") or {}).get("volumeHandle")
        pv_name = source.get("persistentVolumeName")
        return cls(
            name=name,
            node=str(spec.get("nodeName") or ""),
            attacher=str(spec.get("attacher") or ""),
            pv_name=str(pv_name) if pv_name else None,
            inline_handle=str(inline) if inline else None,
        )


# --------------------------------------------------------------------------- pod volumes


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """A pod volume backed by a claim: ``persistentVolumeClaim``, or a generic ephemeral
    volume (its claim is ``<pod>-<volume>``, created by the ephemeral volume controller)."""

    volume: str
    claim: str
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class InlineDisk:
    """An in-line disk VolumeRestrictions checks: ``kind`` gce | ebs | iscsi | rbd."""

    kind: str
    ident: tuple[str, ...]
    read_only: bool = False
    monitors: frozenset[str] = frozenset()  # rbd only

    def conflicts(self, other: InlineDisk) -> bool:
        """``isVolumeConflict``: the same GCE PD unless both read-only; the same EBS volume
        always; the same iSCSI IQN unless both read-only; the same RBD pool and image on an
        overlapping monitor unless both read-only."""
        if self.kind != other.kind or self.ident != other.ident:
            return False
        both_read_only = self.read_only and other.read_only
        if self.kind == "ebs":
            return True
        if self.kind == "rbd":
            return bool(self.monitors & other.monitors) and not both_read_only
        return not both_read_only


def _inline_disk(volume: Mapping[str, Any]) -> InlineDisk | None:
    if isinstance(gce := volume.get("gcePersistentDisk"), Mapping):
        return InlineDisk("gce", (str(gce.get("pdName") or ""),), gce.get("readOnly") is True)
    if isinstance(ebs := volume.get("awsElasticBlockStore"), Mapping):
        return InlineDisk("ebs", (str(ebs.get("volumeID") or ""),), ebs.get("readOnly") is True)
    if isinstance(iscsi := volume.get("iscsi"), Mapping):
        return InlineDisk("iscsi", (str(iscsi.get("iqn") or ""),), iscsi.get("readOnly") is True)
    if isinstance(rbd := volume.get("rbd"), Mapping):
        return InlineDisk(
            "rbd",
            (str(rbd.get("pool") or "rbd"), str(rbd.get("image") or "")),
            rbd.get("readOnly") is True,
            frozenset(str(m) for m in rbd.get("monitors") or ()),
        )
    return None


@dataclass(frozen=True, slots=True)
class PodVolumes:
    """A pod's volumes as the rules see them, parsed once from ``spec.volumes``."""

    namespace: str
    name: str
    uid: str
    claims: tuple[ClaimUse, ...] = ()
    disks: tuple[InlineDisk, ...] = ()
    in_tree: tuple[tuple[str, str], ...] = ()  # migratable in-line volumes: (plugin, id)

    @property
    def empty(self) -> bool:
        return not (self.claims or self.disks or self.in_tree)

    def claim_keys(self) -> Iterable[str]:
        for use in self.claims:
            yield f"{self.namespace}/{use.claim}"

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodVolumes:
        meta = metadata_of(pod)
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        claims: list[ClaimUse] = []
        disks: list[InlineDisk] = []
        in_tree: list[tuple[str, str]] = []
        for i, volume in enumerate((pod.get("spec") or {}).get("volumes") or ()):
            if not isinstance(volume, Mapping):
                raise ManifestError(f"pod {namespace}/{name}: spec.volumes[{i}] must be an object")
            vname = str(volume.get("name") or "")
            pvc = volume.get("persistentVolumeClaim")
            if isinstance(pvc, Mapping):
                claims.append(ClaimUse(vname, str(pvc.get("claimName") or "")))
                continue
            if isinstance(volume.get("ephemeral"), Mapping):
                claims.append(ClaimUse(vname, f"{name}-{vname}", ephemeral=True))
                continue
            disk = _inline_disk(volume)
            if disk is not None:
                disks.append(disk)
            source = _in_tree_source(volume)
            if source is not None:
                in_tree.append(source)
        return cls(
            namespace=namespace,
            name=name,
            uid=str(meta.get("uid") or ""),
            claims=tuple(claims),
            disks=tuple(disks),
            in_tree=tuple(in_tree),
        )


@dataclass(frozen=True, slots=True)
class VolumeBindings:
    """What a placement writes for its volumes before the pod is bound (upstream's
    ``PodVolumes``): PVs to bind to claims, and claims to provision on ``node``."""

    node: str
    bind: tuple[tuple[str, str], ...] = ()  # (claim key, PV name)
    provision: tuple[str, ...] = ()  # claim keys

    @property
    def empty(self) -> bool:
        return not (self.bind or self.provision)

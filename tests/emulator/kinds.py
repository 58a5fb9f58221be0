"""The API resources the emulator serves: one immutable :class:`Kind` per resource.

Each entry carries what routing, discovery, field selectors and the write rules need: group,
version, plural/singular names, scope, subresources, the field-selector table the real API
server accepts for the kind (anything else is a 400), whether the kind has a ``/status``
subresource (main writes keep status; status writes keep the spec, and the metadata too
where the kind's status strategy resets it), whether
``metadata.generation`` is tracked, whether PUT may create, and which spec is immutable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Kind:
    """One served resource (a group/version/plural triple)."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    field_labels: frozenset[str]
    short_names: tuple[str, ...] = ()
    status_subresource: bool = False
    tracks_generation: bool = False
    create_on_update: bool = False
    spec_immutable: bool = False
    #: the status strategy calls ``metav1.ResetObjectMetaForStatus`` (labels, annotations,
    #: finalizers, owner references stay as stored); most kinds let a status write change them
    status_resets_metadata: bool = False
    name_is_dns_label: bool = False
    name_is_path_segment: bool = False
    #: storage shared with another resource (events.k8s.io Events are core Events)
    storage: tuple[str, str] | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """``pods`` or ``resourceslices.resource.k8s.io``, as used in Status messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """``Pod`` or ``ResourceSlice.resource.k8s.io``, as used in Invalid messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def key(self) -> tuple[str, str]:
        """Storage identity (group, plural); shared storage names the owning resource."""
        return self.storage or (self.group, self.plural)


_NAME: Final = frozenset({"metadata.name"})
_NS_NAME: Final = frozenset({"metadata.name", "metadata.namespace"})

NAMESPACE: Final = Kind(
    "",
    "v1",
    "namespaces",
    "namespace",
    "Namespace",
    namespaced=False,
    field_labels=_NAME | {"status.phase"},
    short_names=("ns",),
    status_subresource=True,
    name_is_dns_label=True,
)
NODE: Final = Kind(
    "",
    "v1",
    "nodes",
    "node",
    "Node",
    namespaced=False,
    field_labels=_NAME | {"spec.unschedulable"},
    short_names=("no",),
    status_subresource=True,
)
POD: Final = Kind(
    "",
    "v1",
    "pods",
    "pod",
    "Pod",
    namespaced=True,
    field_labels=_NS_NAME
    | {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    short_names=("po",),
    status_subresource=True,
    tracks_generation=True,
)
EVENT: Final = Kind(
    "",
    "v1",
    "events",
    "event",
    "Event",
    namespaced=True,
    field_labels=_NS_NAME
    | {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
    short_names=("ev",),
    create_on_update=True,
    name_is_path_segment=True,
)
EVENT_V1: Final = Kind(
    "events.k8s.io",
    "v1",
    "events",
    "event",
    "Event",
    namespaced=True,
    field_labels=_NS_NAME,
    short_names=("ev",),
    create_on_update=True,
    name_is_path_segment=True,
    storage=("", "events"),
)
LEASE: Final = Kind(
    "coordination.k8s.io",
    "v1",
    "leases",
    "lease",
    "Lease",
    namespaced=True,
    field_labels=_NS_NAME,
    create_on_update=True,
)
DEVICE_CLASS: Final = Kind(
    "resource.k8s.io",
    "v1",
    "deviceclasses",
    "deviceclass",
    "DeviceClass",
    namespaced=False,
    field_labels=_NAME,
    tracks_generation=True,
)
RESOURCE_SLICE: Final = Kind(
    "resource.k8s.io",
    "v1",
    "resourceslices",
    "resourceslice",
    "ResourceSlice",
    namespaced=False,
    # spec.pool.name since 1.37 (kubernetes/kubernetes#138456)
    field_labels=_NAME | {"spec.nodeName", "spec.driver", "spec.pool.name"},
    tracks_generation=True,
)
RESOURCE_CLAIM: Final = Kind(
    "resource.k8s.io",
    "v1",
    "resourceclaims",
    "resourceclaim",
    "ResourceClaim",
    namespaced=True,
    field_labels=_NS_NAME,
    status_subresource=True,
    tracks_generation=True,
    spec_immutable=True,
    status_resets_metadata=True,
)
RESOURCE_CLAIM_TEMPLATE: Final = Kind(
    "resource.k8s.io",
    "v1",
    "resourceclaimtemplates",
    "resourceclaimtemplate",
    "ResourceClaimTemplate",
    namespaced=True,
    field_labels=_NS_NAME,
    tracks_generation=True,
    spec_immutable=True,
)
# The objects whose selectors kube-scheduler's default topology spreading reads.
SERVICE: Final = Kind(
    "",
    "v1",
    "services",
    "service",
    "Service",
    namespaced=True,
    field_labels=_NS_NAME | {"spec.clusterIP", "spec.type"},
    short_names=("svc",),
    status_subresource=True,
)
REPLICATION_CONTROLLER: Final = Kind(
    "",
    "v1",
    "replicationcontrollers",
    "replicationcontroller",
    "ReplicationController",
    namespaced=True,
    field_labels=_NS_NAME | {"status.replicas"},
    short_names=("rc",),
    status_subresource=True,
    tracks_generation=True,
)
REPLICA_SET: Final = Kind(
    "apps",
    "v1",
    "replicasets",
    "replicaset",
    "ReplicaSet",
    namespaced=True,
    field_labels=_NS_NAME | {"status.replicas"},
    short_names=("rs",),
    status_subresource=True,
    tracks_generation=True,
)
STATEFUL_SET: Final = Kind(
    "apps",
    "v1",
    "statefulsets",
    "statefulset",
    "StatefulSet",
    namespaced=True,
    field_labels=_NS_NAME | {"status.replicas"},
    short_names=("sts",),
    status_subresource=True,
    tracks_generation=True,
)
POD_DISRUPTION_BUDGET: Final = Kind(
    "policy",
    "v1",
    "poddisruptionbudgets",
    "poddisruptionbudget",
    "PodDisruptionBudget",
    namespaced=True,
    field_labels=_NS_NAME,
    short_names=("pdb",),
    status_subresource=True,
    tracks_generation=True,
)

PERSISTENT_VOLUME_CLAIM: Final = Kind(
    "",
    "v1",
    "persistentvolumeclaims",
    "persistentvolumeclaim",
    "PersistentVolumeClaim",
    namespaced=True,
    field_labels=_NS_NAME,
    short_names=("pvc",),
    status_subresource=True,
)
PERSISTENT_VOLUME: Final = Kind(
    "",
    "v1",
    "persistentvolumes",
    "persistentvolume",
    "PersistentVolume",
    namespaced=False,
    field_labels=_NAME,
    short_names=("pv",),
    status_subresource=True,
)
STORAGE_CLASS: Final = Kind(
    "storage.k8s.io",
    "v1",
    "storageclasses",
    "storageclass",
    "StorageClass",
    namespaced=False,
    field_labels=_NAME,
    short_names=("sc",),
)
CSI_NODE: Final = Kind(
    "storage.k8s.io", "v1", "csinodes", "csinode", "CSINode", namespaced=False, field_labels=_NAME
)
CSI_DRIVER: Final = Kind(
    "storage.k8s.io",
    "v1",
    "csidrivers",
    "csidriver",
    "CSIDriver",
    namespaced=False,
    field_labels=_NAME,
)
CSI_STORAGE_CAPACITY: Final = Kind(
    "storage.k8s.io",
    "v1",
    "csistoragecapacities",
    "csistoragecapacity",
    "CSIStorageCapacity",
    namespaced=True,
    field_labels=_NS_NAME,
)
VOLUME_ATTACHMENT: Final = Kind(
    "storage.k8s.io",
    "v1",
    "volumeattachments",
    "volumeattachment",
    "VolumeAttachment",
    namespaced=False,
    field_labels=_NAME,
    status_subresource=True,
    status_resets_metadata=True,
)

ALL_KINDS: Final[tuple[Kind, ...]] = (
    NAMESPACE,
    NODE,
    POD,
    EVENT,
    EVENT_V1,
    LEASE,
    DEVICE_CLASS,
    RESOURCE_SLICE,
    RESOURCE_CLAIM,
    RESOURCE_CLAIM_TEMPLATE,
    SERVICE,
    REPLICATION_CONTROLLER,
    REPLICA_SET,
    STATEFUL_SET,
    POD_DISRUPTION_BUDGET,
    PERSISTENT_VOLUME_CLAIM,
    PERSISTENT_VOLUME,
    STORAGE_CLASS,
    CSI_NODE,
    CSI_DRIVER,
    CSI_STORAGE_CAPACITY,
    VOLUME_ATTACHMENT,
)

#: (group, version) -> plural -> Kind
BY_GROUP_VERSION: Final[dict[tuple[str, str], dict[str, Kind]]] = {}
for _kind in ALL_KINDS:
    BY_GROUP_VERSION.setdefault((_kind.group, _kind.version), {})[_kind.plural] = _kind

#: kind name or plural (any case) -> Kind, for the hooks (``emulator.get("ResourceSlice", ...)``).
_LOOKUP: Final[dict[str, Kind]] = {}
for _kind in ALL_KINDS:
    if _kind is EVENT_V1:
        continue
    for _alias in (_kind.kind, _kind.plural, _kind.singular, *_kind.short_names):
        _LOOKUP[_alias.lower()] = _kind
    _LOOKUP[_kind.group_resource.lower()] = _kind
_LOOKUP["events.events.k8s.io"] = EVENT_V1


def lookup(name: str | Kind) -> Kind:
    """Find a kind by ``Kind``, plural, singular, short name or ``plural.group``."""
    if isinstance(name, Kind):
        return name
    try:
        return _LOOKUP[name.lower()]
    except KeyError:
        raise KeyError(f"the emulator does not serve {name!r}") from None

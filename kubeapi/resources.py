"""API resources as data: where each lives (its URL path) and what it is called.

Pure: no I/O. Names in paths are percent-quoted, so any object name is safe to pass.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

JSON = dict[str, Any]

#: Text that ``urllib.parse.quote(text, safe="")`` returns unchanged (its always-safe set):
#: every valid object name and namespace.
_UNQUOTED: Final = re.compile(r"[A-Za-z0-9_.~-]*")


def _quote(text: str) -> str:
    """``urllib.parse.quote(text, safe="")``; a name that needs no quoting, as every valid
    one, passes one pattern match instead (0.3 us, where quote takes 0.8-1.0 us; a few names
    per request)."""
    return text if _UNQUOTED.fullmatch(text) else urllib.parse.quote(text, safe="")


@dataclass(frozen=True, slots=True)
class Resource:
    """One API resource: where it lives and how it is named."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{_quote(namespace)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{_quote(name)}"
            if subresource is not None:
                base += f"/{subresource}"
        return base


PODS: Final = Resource("", "v1", "pods", "Pod", namespaced=True)
NODES: Final = Resource("", "v1", "nodes", "Node", namespaced=False)
EVENTS: Final = Resource("", "v1", "events", "Event", namespaced=True)
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
DEVICE_CLASSES: Final = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)
RESOURCE_SLICES: Final = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False)
RESOURCE_CLAIMS: Final = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True)
NAMESPACES: Final = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
SERVICES: Final = Resource("", "v1", "services", "Service", namespaced=True)
REPLICATION_CONTROLLERS: Final = Resource(
    "", "v1", "replicationcontrollers", "ReplicationController", namespaced=True
)
REPLICA_SETS: Final = Resource("apps", "v1", "replicasets", "ReplicaSet", namespaced=True)
STATEFUL_SETS: Final = Resource("apps", "v1", "statefulsets", "StatefulSet", namespaced=True)
POD_DISRUPTION_BUDGETS: Final = Resource(
    "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True
)
PERSISTENT_VOLUME_CLAIMS: Final = Resource(
    "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", namespaced=True
)
PERSISTENT_VOLUMES: Final = Resource(
    "", "v1", "persistentvolumes", "PersistentVolume", namespaced=False
)
STORAGE_CLASSES: Final = Resource("storage.k8s.io", "v1", "storageclasses", "StorageClass", False)
CSI_NODES: Final = Resource("storage.k8s.io", "v1", "csinodes", "CSINode", False)
CSI_DRIVERS: Final = Resource("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False)
CSI_STORAGE_CAPACITIES: Final = Resource(
    "storage.k8s.io", "v1", "csistoragecapacities", "CSIStorageCapacity", True
)
VOLUME_ATTACHMENTS: Final = Resource(
    "storage.k8s.io", "v1", "volumeattachments", "VolumeAttachment", False
)
#: What the volume rules read (driver.scheduling.volumes.VOLUME_KINDS), one informer each.
VOLUME_RESOURCES: Final = (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
    CSI_NODES,
    CSI_DRIVERS,
    CSI_STORAGE_CAPACITIES,
    VOLUME_ATTACHMENTS,
)


def meta(obj: Mapping[str, Any]) -> JSON:
    """``obj.metadata`` (empty dict when absent)."""
    m: JSON = obj.get("metadata") or {}
    return m

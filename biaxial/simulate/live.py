"""``biaxial simulate --kubeconfig``: the live cluster's state, read once, read-only.

:func:`read_cluster` lists Namespaces, Nodes, ResourceSlices, DeviceClasses, ResourceClaims,
ResourceClaimTemplates, Services, ReplicaSets, StatefulSets, PodDisruptionBudgets, the kinds
the volume rules read (PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes,
CSIDrivers, CSIStorageCapacities, VolumeAttachments) and Pods from the API server the
kubeconfig names (GET requests only,
following ``continue``; nothing is ever written) and returns them as the objects a
``kubectl get -A -o yaml`` dump holds, so the simulator reads them exactly as it reads a dump:
bound pods are running, allocated claims are state, Services, ReplicaSets and StatefulSets give
default topology spreading its selectors (a ReplicaSet or StatefulSet whose pods are not all
there yet gets its missing ones, as its controller would create them), and the pending pods that
name the scheduler are placed (oldest first, as they would queue), together with any manifests
given. (PriorityClasses are not read: the API server's admission has already written each
pod's ``spec.priority``.)

Errors: a kubeconfig that cannot be loaded is a
:class:`~driver.api.errors.ConfigError`; an API server that cannot be reached or refuses a
list is an :class:`~driver.api.errors.ApiError` with the resource named.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from driver.api.errors import ApiError, NotFoundError
from kubeapi import codec
from kubeapi.client import Client
from kubeapi.endpoint import Endpoint
from kubeapi.resources import (
    DEVICE_CLASSES,
    NAMESPACES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    REPLICA_SETS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SERVICES,
    STATEFUL_SETS,
    VOLUME_RESOURCES,
    Resource,
)

JSON = dict[str, Any]
RESOURCE_CLAIM_TEMPLATES: Final = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
#: What is read, in the order the simulator wants it (the pods last).
READ: Final = (
    NAMESPACES,
    NODES,
    RESOURCE_SLICES,
    DEVICE_CLASSES,
    RESOURCE_CLAIMS,
    RESOURCE_CLAIM_TEMPLATES,
    SERVICES,
    REPLICA_SETS,
    STATEFUL_SETS,
    POD_DISRUPTION_BUDGETS,
    *VOLUME_RESOURCES,
    PODS,
)


class ReadOnlyClient(Client):
    """The API client, for reads only: any other verb is refused before it is sent."""

    default_user_agent = "biaxial-simulate"

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        body: object = None,
        content_type: str = "application/json",
        decode: Callable[[bytes], Any] = codec.loads,
    ) -> JSON:
        if method != "GET":
            raise ApiError(f"{method} {path}: biaxial simulate only reads", status=0)
        return await super().request(
            method, path, params=params, body=body, content_type=content_type, decode=decode
        )


def _age(obj: JSON) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (
        str(meta.get("creationTimestamp") or ""),
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
    )


async def _read(endpoint: Endpoint) -> list[JSON]:
    objects: list[JSON] = []
    async with ReadOnlyClient(endpoint) as client:
        for res in READ:
            try:
                listed = await client.list(res)
            except NotFoundError as exc:
                raise ApiError(
                    f"the API server does not serve {res.api_version} {res.plural} "
                    "(biaxial needs Kubernetes 1.34 or newer)",
                    status=exc.status,
                ) from exc
            except ApiError as exc:
                raise type(exc)(
                    f"listing {res.plural}: {exc}", status=exc.status, reason=exc.reason
                ) from exc
            items = [{"apiVersion": res.api_version, "kind": res.kind, **i} for i in listed.items]
            if res is PODS:
                items.sort(key=_age)
            objects.extend(items)
    return objects


def read_cluster(kubeconfig: str) -> list[JSON]:
    """The cluster's objects (see the module docstring)."""
    endpoint = Endpoint.resolve(kubeconfig)
    return asyncio.run(_read(endpoint))

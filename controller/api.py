"""The controller's access to the Kubernetes API: :class:`Api`, the Protocol the rest of the
controller is written against (so unit tests can substitute a recording fake), and
:class:`KubeApi`, the real one.

:class:`KubeApi` is :class:`kubeapi.Client` (raw JSON, token bucket, error mapping, paginated
list handed over page by page, chunked watch; see :mod:`kubeapi.client` for the contracts) plus
the one call only the scheduler makes, :meth:`KubeApi.bind`. The shared names
(:class:`Resource`, the resource table, :class:`WatchEvent`, :class:`ListResult`,
:func:`meta`, ...) are re-exported from :mod:`kubeapi` so the controller imports them from one
place.

:class:`GuardedApi` wraps another :class:`Api` and calls a hook before every call (and every
watch event): the leader's write fence (:class:`controller.leader.FencedApi`) and the tests'
crash injection are built on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Protocol

from kubeapi import (
    DEVICE_CLASSES,
    EVENTS,
    JSON,
    LEASES,
    NAMESPACES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    REPLICA_SETS,
    REPLICATION_CONTROLLERS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SERVICES,
    STATEFUL_SETS,
    VOLUME_RESOURCES,
    Client,
    Endpoint,
    ListResult,
    PatchType,
    Resource,
    WatchEvent,
    meta,
)

__all__ = [
    "DEVICE_CLASSES",
    "EVENTS",
    "JSON",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "PERSISTENT_VOLUMES",
    "PERSISTENT_VOLUME_CLAIMS",
    "PODS",
    "POD_DISRUPTION_BUDGETS",
    "REPLICATION_CONTROLLERS",
    "REPLICA_SETS",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "SERVICES",
    "STATEFUL_SETS",
    "VOLUME_RESOURCES",
    "Api",
    "Endpoint",
    "GuardedApi",
    "KubeApi",
    "ListResult",
    "PatchType",
    "Resource",
    "WatchEvent",
    "meta",
    "object_key",
    "pod_is_finished",
    "pod_node",
]

FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    m = meta(obj)
    ns = m.get("namespace")
    return f"{ns}/{m.get('name', '')}" if ns else str(m.get("name", ""))


def pod_node(pod: Mapping[str, Any]) -> str:
    """The node a pod is bound to (empty while it is not)."""
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_is_finished(pod: Mapping[str, Any]) -> bool:
    """Whether the pod ended (``Succeeded`` / ``Failed``): its requests no longer count."""
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


class Api(Protocol):
    """What the controller needs from the API server: the generic calls of
    :class:`kubeapi.Client` plus :meth:`bind`. The one spelling of the controller's API
    surface: :class:`KubeApi`, :class:`GuardedApi` (so :class:`controller.leader.FencedApi`)
    and the unit tests' ``FakeApi`` implement it, and mypy checks the first three wherever
    they are handed over as an ``Api``. (The kubelet plugin's ``PluginApi`` has typed
    operations of its own; its ``SliceApi`` and ``EventApi`` are subsets of that, not of
    this. The tests' ``Api`` classes are a raw HTTP harness and a claim source: no protocol.)"""

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON: ...

    def pages(
        self,
        res: Resource,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        typed: type | None = None,
    ) -> AsyncIterator[ListResult]:
        """A list page by page (each page carries the list's resourceVersion); with
        ``typed``, items that decode as it may come as :class:`kubeapi.codec.Typed`
        (:meth:`kubeapi.Client.pages`), the others as JSON data."""
        ...

    def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]: ...

    async def create(self, res: Resource, body: JSON, namespace: str | None = None) -> JSON: ...

    async def replace(
        self, res: Resource, body: JSON, *, subresource: str | None = None
    ) -> JSON: ...

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: PatchType = "merge",
    ) -> JSON: ...

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None: ...

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, *, resource_version: str = ""
    ) -> None: ...


class KubeApi(Client):
    """The real :class:`Api`. Use as ``async with``; pass ``qps`` / ``burst``."""

    default_user_agent = "biaxial-controller"

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, *, resource_version: str = ""
    ) -> None:
        """POST ``pods/{name}/binding`` (the answer is a Status, read as raw JSON). ``uid`` and
        a non-empty ``resource_version`` are preconditions: the API server refuses the binding
        (409) when the pod is another one or changed since (``BindingREST`` checks both)."""
        binding_meta: JSON = {"name": name, "namespace": namespace, "uid": uid}
        if resource_version:
            binding_meta["resourceVersion"] = resource_version
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": binding_meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", PODS.path(namespace, name, "binding"), body=body)


class GuardedApi:
    """An :class:`Api` that delegates to ``inner`` after :meth:`guard` allowed the call.

    Subclasses override :meth:`guard` (raise to refuse; nothing is sent then) and, to stop a
    watch between events, :meth:`guard_event`.
    """

    def __init__(self, inner: Api) -> None:
        self.inner = inner

    def guard(self, method: str, path: str) -> None:
        """Called before every call with its HTTP method and path; raise to refuse it."""

    def guard_event(self) -> None:
        """Called before every watch event is handed on; raise to end the watch."""

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON:
        self.guard("GET", res.path(namespace, name))
        return await self.inner.get(res, name, namespace)

    async def pages(
        self,
        res: Resource,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        typed: type | None = None,
    ) -> AsyncIterator[ListResult]:
        self.guard("GET", res.path())
        async for page in self.inner.pages(
            res, field_selector=field_selector, label_selector=label_selector, typed=typed
        ):
            self.guard("GET", res.path())  # each page is a request of its own
            yield page

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        self.guard("GET", res.path())
        async for event in self.inner.watch(
            res,
            resource_version=resource_version,
            field_selector=field_selector,
            label_selector=label_selector,
            timeout_s=timeout_s,
        ):
            self.guard_event()
            yield event

    async def create(self, res: Resource, body: JSON, namespace: str | None = None) -> JSON:
        self.guard("POST", res.path(namespace or meta(body).get("namespace")))
        return await self.inner.create(res, body, namespace)

    async def replace(self, res: Resource, body: JSON, *, subresource: str | None = None) -> JSON:
        m = meta(body)
        self.guard("PUT", res.path(m.get("namespace"), str(m.get("name")), subresource))
        return await self.inner.replace(res, body, subresource=subresource)

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: PatchType = "merge",
    ) -> JSON:
        self.guard("PATCH", res.path(namespace, name, subresource))
        return await self.inner.patch(
            res, name, body, namespace=namespace, subresource=subresource, patch_type=patch_type
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        self.guard("DELETE", res.path(namespace, name))
        await self.inner.delete(res, name, namespace, uid=uid, resource_version=resource_version)

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, *, resource_version: str = ""
    ) -> None:
        self.guard("POST", PODS.path(namespace, name, "binding"))
        await self.inner.bind(namespace, name, uid, node, resource_version=resource_version)

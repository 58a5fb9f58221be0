"""The kubelet plugin's access to the Kubernetes API: the nine calls it makes, as raw JSON.

:class:`PluginApi` is :class:`kubeapi.Client` (raw JSON over ``aiohttp``, error mapping through
:func:`driver.api.errors.api_error_for_status`, paginated list, chunked watch, the rotating
in-cluster token; see :mod:`kubeapi.client` for the contracts) plus the plugin's operations on
claims, nodes and its ResourceSlices. No client-side rate limit: the plugin's traffic is a
handful of requests per claim and per slice change.

Contracts of the plugin's operations:

* :meth:`PluginApi.get_claim` returns ``None`` for a 404 (the Preparer's contract).
* Updates and deletes carry preconditions (``metadata.resourceVersion`` / ``preconditions``);
  a concurrent change is a :class:`~driver.api.errors.ConflictError`; deleting a slice that is
  already gone counts as done.
* :meth:`PluginApi.watch_slices` yields ``(type, object)`` until the server closes the stream;
  an ``ERROR`` event raises (410 -> :class:`~driver.api.errors.GoneError`: relist).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from driver.api.errors import ApiError
from kubeapi import EVENTS, JSON, NODES, RESOURCE_CLAIMS, RESOURCE_SLICES, Client, Endpoint, meta

__all__ = ["JSON", "Endpoint", "PluginApi"]


class PluginApi(Client):
    """The plugin's API client (see the module docstring). Use as ``async with``."""

    default_user_agent = "biaxial-kubelet-plugin"
    max_connections = 16

    # ----------------------------------------------------------------- claims, nodes

    async def get_claim(self, namespace: str, name: str) -> JSON | None:
        """The ResourceClaim, or None when it does not exist (404)."""
        try:
            return await self.get(RESOURCE_CLAIMS, name, namespace)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def get_node(self, name: str) -> JSON:
        return await self.get(NODES, name)

    async def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> JSON:
        """A JSON merge patch of the Node's ``status`` subresource."""
        return await self.patch(NODES, name, patch, subresource="status")

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        """Record a core/v1 Event (about this node) in ``namespace``."""
        return await self.create(EVENTS, dict(body), namespace)

    # ----------------------------------------------------------------- resource slices

    async def list_slices(self, field_selector: str) -> tuple[list[JSON], str]:
        """Every matching slice (following ``continue``) and the list's resourceVersion."""
        listed = await self.list(RESOURCE_SLICES, field_selector=field_selector)
        return listed.items, listed.resource_version

    async def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int = 300
    ) -> AsyncGenerator[tuple[str, JSON], None]:
        """Watch events ``(ADDED|MODIFIED|DELETED|BOOKMARK, object)`` from ``resource_version``."""
        events = self.watch(
            RESOURCE_SLICES,
            resource_version=resource_version,
            field_selector=field_selector,
            timeout_s=timeout_s,
        )
        async with aclosing(events):
            async for event in events:
                yield event.type, event.object

    async def create_slice(self, body: Mapping[str, Any]) -> JSON:
        return await self.create(RESOURCE_SLICES, dict(body))

    async def update_slice(self, body: Mapping[str, Any]) -> JSON:
        """PUT; ``body.metadata.resourceVersion`` must be set (the precondition)."""
        if not meta(body).get("resourceVersion"):
            raise ValueError(
                f"update of slice {meta(body).get('name')!r} without a resourceVersion precondition"
            )
        return await self.replace(RESOURCE_SLICES, dict(body))

    async def delete_slice(self, name: str, *, uid: str = "", resource_version: str = "") -> None:
        """Delete with uid/resourceVersion preconditions; a 404 counts as done."""
        try:
            await self.delete(
                RESOURCE_SLICES, name, uid=uid or None, resource_version=resource_version or None
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

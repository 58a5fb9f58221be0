"""Events about this node: what the kubelet plugin tells the administrator on the Node object.

:class:`NodeEvents` records core/v1 Events whose ``involvedObject`` is this node's Node (so
``kubectl describe node`` and ``kubectl get events --field-selector involvedObject.kind=Node``
show them) in one namespace, the plugin's own (``--event-namespace``; the chart passes the
release namespace, where its Role allows ``events: create`` and nothing else). The Node's UID
is read once (``nodes: get``, which the plugin has for its slices' owner references) and left
out when it cannot be read. :meth:`NodeEvents.post` only queues (it may be called from any
code on the loop, never blocks); :meth:`NodeEvents.run` (a background task) records them in
order. Recording never fails anything: an API error is logged.

Reasons the plugin records (``docs/operations.md`` has the runbook for each):

* ``CheckpointUnreadable`` (Warning): the checkpoint cannot be read; Prepare is refused,
  Unprepare proceeds, the pod is not ready. Recorded once per distinct error.
* ``CheckpointReadable`` (Normal): it can be read again (after a repair).
* ``StaleClaimReleased`` (Warning): a prepared claim that no longer exists, or is no longer
  allocated to or reserved on this node, was unprepared by reconciliation, freeing its devices.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, Protocol

from driver.api.errors import ApiError, BiaxialError
from kubeapi.events import event_body
from kubeapi.resources import JSON

log = logging.getLogger(f"biaxial.{__name__}")

COMPONENT: Final = "biaxial-kubelet-plugin"
CHECKPOINT_UNREADABLE: Final = "CheckpointUnreadable"
CHECKPOINT_READABLE: Final = "CheckpointReadable"
STALE_CLAIM_RELEASED: Final = "StaleClaimReleased"


class EventApi(Protocol):
    """The part of :class:`kubeletplugin.api.PluginApi` events need: a narrow
    protocol, a true subset of its methods, so a test fake needs only these."""

    async def get_node(self, name: str) -> JSON: ...

    async def create_event(self, namespace: str, body: JSON) -> JSON: ...


class NodeEvents:
    """Records Events about one Node (see the module docstring)."""

    def __init__(self, api: EventApi, *, node_name: str, namespace: str, instance: str) -> None:
        self._api = api
        self._node = node_name
        self._namespace = namespace
        self._instance = instance
        self._node_uid: str | None = None
        self._queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
        self.recorded: list[tuple[str, str]] = []  # (reason, message), for metrics and tests

    async def _involved(self) -> JSON:
        if self._node_uid is None:
            try:
                node = await self._api.get_node(self._node)
                self._node_uid = str((node.get("metadata") or {}).get("uid") or "")
            except BiaxialError as exc:
                log.debug("node %s: UID unknown for its events: %s", self._node, exc)
        involved: JSON = {"apiVersion": "v1", "kind": "Node", "name": self._node}
        if self._node_uid:
            involved["uid"] = self._node_uid
        return involved

    async def record(self, event_type: str, reason: str, message: str) -> None:
        """Record one Event; an API error is logged, never raised."""
        body = event_body(
            await self._involved(),
            namespace=self._namespace,
            event_type=event_type,
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=self._instance,
        )
        try:
            await self._api.create_event(self._namespace, body)
        except ApiError as exc:
            log.warning("node %s: could not record event %s: %s", self._node, reason, exc)
            return
        self.recorded.append((reason, message))

    def post(self, event_type: str, reason: str, message: str) -> None:
        """Queue one Event for :meth:`run` to record."""
        self._queue.put_nowait((event_type, reason, message))

    async def run(self) -> None:
        """Record queued Events, in order, until cancelled."""
        while True:
            event_type, reason, message = await self._queue.get()
            await self.record(event_type, reason, message)

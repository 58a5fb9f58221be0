"""Telling users why a pod is not scheduled: the ``PodScheduled`` condition and an Event.

:class:`Recorder` writes, for a pod that cannot be placed, ``PodScheduled=False`` with reason
``Unschedulable`` (kube-scheduler's condition; ``SchedulerError`` when a placement could not be
completed, e.g. its volumes were not provisioned) and the message, by a strategic-merge patch of
``pods/status`` (conditions merge by type, so other conditions are kept), plus a ``Warning``
Event ``FailedScheduling`` with the same message (core/v1, as kube-scheduler records).

Idempotent and cheap under retries: a pod whose last recorded message is unchanged is not
written again (the memory is per pod UID and forgotten with the pod). Failures are logged and
swallowed: reporting must never stop scheduling.
"""

from __future__ import annotations

import logging
from typing import Final

from controller.api import EVENTS, JSON, PODS, Api
from controller.commit import PodRef
from driver.api.errors import ApiError, NotFoundError
from kubeapi.events import event_body, now_rfc3339

log = logging.getLogger(f"biaxial.{__name__}")

REASON_UNSCHEDULABLE: Final = "Unschedulable"
REASON_ERROR: Final = "SchedulerError"  # kube-scheduler's reason for a failed binding cycle
EVENT_FAILED_SCHEDULING: Final = "FailedScheduling"
EVENT_SCHEDULED: Final = "Scheduled"


__all__ = ["Recorder", "now_rfc3339"]


class Recorder:
    """Writes conditions and events for pods (see the module docstring)."""

    def __init__(self, api: Api, *, component: str, instance: str) -> None:
        self.api = api
        self.component = component
        self.instance = instance
        self._last: dict[str, str] = {}

    def forget(self, pod_uid: str) -> None:
        self._last.pop(pod_uid, None)

    async def unschedulable(
        self, pod: PodRef, message: str, *, reason: str = REASON_UNSCHEDULABLE
    ) -> None:
        """Record that ``pod`` cannot be scheduled now, and why (``reason``: the condition's,
        ``SchedulerError`` when its placement could not be completed)."""
        if self._last.get(pod.uid) == message:
            return
        self._last[pod.uid] = message
        condition: JSON = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }
        try:
            await self.api.patch(
                PODS,
                pod.name,
                {"status": {"conditions": [condition]}},
                namespace=pod.namespace,
                subresource="status",
                patch_type="strategic",
            )
        except NotFoundError:
            self.forget(pod.uid)
            return
        except ApiError as exc:
            self._last.pop(pod.uid, None)
            log.warning("pod %s: could not set PodScheduled=False: %s", pod.key, exc)
            return
        await self.event(pod, "Warning", EVENT_FAILED_SCHEDULING, message)

    async def scheduled(self, pod: PodRef, node: str) -> None:
        self.forget(pod.uid)
        await self.event(
            pod, "Normal", EVENT_SCHEDULED, f"Successfully assigned {pod.key} to {node}"
        )

    async def event(self, pod: PodRef, etype: str, reason: str, message: str) -> None:
        body = event_body(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
            namespace=pod.namespace,
            event_type=etype,
            reason=reason,
            message=message,
            component=self.component,
            instance=self.instance,
        )
        try:
            await self.api.create(EVENTS, body, pod.namespace)
        except ApiError as exc:
            log.warning("pod %s: could not record event %s: %s", pod.key, reason, exc)

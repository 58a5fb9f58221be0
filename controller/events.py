"""Telling users why a pod is not scheduled: the ``PodScheduled`` condition and an Event.

:class:`Recorder` writes, for a pod that cannot be placed, ``PodScheduled=False`` with reason
``Unschedulable`` (kube-scheduler's condition) and the message, by a strategic-merge patch of
``pods/status`` (conditions merge by type, so other conditions are kept), plus a ``Warning``
Event ``FailedScheduling`` with the same message (core/v1, as kube-scheduler records).

Idempotent and cheap under retries: a pod whose last recorded message is unchanged is not
written again (the memory is per pod UID and forgotten with the pod). Failures are logged and
swallowed: reporting must never stop scheduling.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Final

from controller.api import EVENTS, JSON, PODS, Api
from controller.commit import PodRef
from driver.api.errors import ApiError, NotFoundError

log = logging.getLogger(f"biaxial.{__name__}")

REASON_UNSCHEDULABLE: Final = "Unschedulable"
EVENT_FAILED_SCHEDULING: Final = "FailedScheduling"
EVENT_SCHEDULED: Final = "Scheduled"


def now_rfc3339(micro: bool = False) -> str:
    now = dt.datetime.now(dt.UTC)
    if micro:
        return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


class Recorder:
    """Writes conditions and events for pods (see the module docstring)."""

    def __init__(self, api: Api, *, component: str, instance: str) -> None:
        self.api = api
        self.component = component
        self.instance = instance
        self._last: dict[str, str] = {}

    def forget(self, pod_uid: str) -> None:
        self._last.pop(pod_uid, None)

    async def unschedulable(self, pod: PodRef, message: str) -> None:
        """Record that ``pod`` cannot be scheduled now, and why."""
        if self._last.get(pod.uid) == message:
            return
        self._last[pod.uid] = message
        condition: JSON = {
            "type": "PodScheduled",
            "status": "False",
            "reason": REASON_UNSCHEDULABLE,
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
        stamp = now_rfc3339()
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # <pod>.<16 hex>, within the 253 characters of a name
                "name": f"{pod.name[:236]}.{uuid.uuid4().hex[:16]}",
                "namespace": pod.namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": etype,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await self.api.create(EVENTS, body, pod.namespace)
        except ApiError as exc:
            log.warning("pod %s: could not record event %s: %s", pod.key, reason, exc)

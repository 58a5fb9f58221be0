"""Retention: a deleted claim's devices stay in use while a pod that reserved it may run.

A claim's finalizer is what normally keeps its object (and so its allocation) until no pod
uses it, but the finalizer is only metadata: whoever may update the claim may remove it and
delete the claim while the pod it is reserved for keeps running (the kubelet does not stop a
container because its claim went away; it unprepares the claim once the pod ends). Counting
only the claims that exist would then hand the running pod's devices to the next pod at once.

:class:`Retention` closes that gap from the objects the controller already watches (no extra
RBAC): when a claim that was allocated and reserved for pods is deleted while one of those pods
is still present and not finished, its last known state is kept in the claim overlay under a
key of its own (``namespace/name#uid``, which no claim can have, so a new claim of the same
name is a different claim), and the engine keeps counting its devices; a ``Warning`` Event
``ClaimDeletedWhileInUse`` on each such pod says so. Once the last of those pods is gone or
finished, the retained state is dropped, the devices are free, and the pods parked for them
are woken (``on_release``). A pod that wants those devices meanwhile is unschedulable with the
usual message (its claim cannot be allocated), as it would be while the claim existed.

What is retained lives in memory: a controller that restarts while such a pod runs no longer
knows the deleted claim's allocation. The durable layer is the chart's claim-protection
ValidatingAdmissionPolicy: it refuses removing our finalizer from a claim that is still
allocated, so with it on, a claim this controller allocated cannot be deleted from under a
running pod and retention is not needed (docs/operations.md, "A claim deleted while its pod
runs"). The node still refuses to prepare a device prepared for another claim.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from controller.api import JSON, meta, object_key, pod_is_finished
from controller.cache import ClusterCache
from controller.commit import PodRef

log = logging.getLogger(f"biaxial.{__name__}")

EVENT_CLAIM_DELETED_IN_USE: Final = "ClaimDeletedWhileInUse"


def retained_key(claim: Mapping[str, Any]) -> str:
    """The overlay key of a deleted claim's retained state: ``namespace/name#uid``."""
    return f"{object_key(claim)}#{meta(claim).get('uid') or ''}"


def _reserving_pods(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = claim.get("status") or {}
    if not status.get("allocation"):
        return []
    return [
        ref
        for ref in status.get("reservedFor") or ()
        if ref.get("resource") == "pods" and not ref.get("apiGroup") and ref.get("uid")
    ]


class Retention:
    """See the module docstring. ``on_release()`` is called when retained devices are freed;
    ``on_retain(pod, message)`` for each running pod whose claim was deleted under it."""

    def __init__(
        self,
        cache: ClusterCache,
        *,
        on_release: Callable[[], None],
        on_retain: Callable[[PodRef, str], None],
    ) -> None:
        self.cache = cache
        self._on_release = on_release
        self._on_retain = on_retain
        self._waiting_on: dict[str, set[str]] = {}  # retained key -> pod UIDs still running
        cache.subscribe(self._on_event)

    @property
    def retained(self) -> dict[str, frozenset[str]]:
        """Retained key -> the UIDs of the pods it waits for (for tests and logs)."""
        return {key: frozenset(uids) for key, uids in self._waiting_on.items()}

    def _on_event(self, kind: str, _etype: str, old: JSON | None, new: JSON | None) -> None:
        if kind == "ResourceClaim" and new is None and old is not None:
            self._claim_deleted(old)
        elif kind == "Pod":
            obj = new if new is not None else old
            if obj is not None and (new is None or pod_is_finished(new)):
                self._pod_gone(str(meta(obj).get("uid") or ""))

    def _running(self, namespace: str, ref: Mapping[str, Any]) -> bool:
        pod = self.cache.pods.get(f"{namespace}/{ref.get('name')}")
        return (
            pod is not None
            and str(meta(pod).get("uid") or "") == str(ref.get("uid"))
            and not pod_is_finished(pod)
        )

    def _claim_deleted(self, claim: JSON) -> None:
        namespace = str(meta(claim).get("namespace") or "default")
        running = [ref for ref in _reserving_pods(claim) if self._running(namespace, ref)]
        if not running:
            return
        key = retained_key(claim)
        self._waiting_on[key] = {str(ref["uid"]) for ref in running}
        self.cache.overlay.retain(key, claim)
        names = ", ".join(f"{namespace}/{ref.get('name')}" for ref in running)
        log.warning(
            "claim %s was deleted while reserved for running pod(s) %s; its devices stay in "
            "use until they end",
            object_key(claim),
            names,
            extra={"claim": object_key(claim)},
        )
        message = (
            f"ResourceClaim {meta(claim).get('name')} was deleted while this pod uses it; its "
            "devices stay allocated to this pod until it ends"
        )
        for ref in running:
            pod = PodRef(namespace, str(ref.get("name")), str(ref["uid"]))
            self._on_retain(pod, message)

    def _pod_gone(self, uid: str) -> None:
        freed = False
        for key, uids in list(self._waiting_on.items()):
            uids.discard(uid)
            if not uids:
                del self._waiting_on[key]
                self.cache.overlay.release(key)
                log.info("retained devices of deleted claim %s released", key)
                freed = True
        if freed:
            self._on_release()

"""Deallocation: giving devices back when the pods that used them are done.

For every claim this controller allocated or created (it carries our finalizer: allocated
user claims and the KEP-5004 bridge claims), :class:`Deallocator` brings the claim in line
with the pods that exist:

1. a ``reservedFor`` entry whose pod is gone (deleted, or replaced by a pod of the same name
   with another UID) or finished (``Succeeded`` / ``Failed``) is removed;
2. a bridge claim whose owning pod is gone or finished is deleted, deallocated and its
   finalizer removed (in that order); so is a bridge claim of a bound pod that does not link it
   (``pod.status.extendedResourceClaimStatus`` names another claim: an orphan of a failed
   attempt);
3. a claim with our finalizer that nothing reserves has its allocation cleared, then (only
   once no allocation is left) our finalizer removed.

Claims allocated by others are never touched (their devices are still respected: the
snapshot counts every allocated claim). Claims whose placement is being committed right now
(``Committer.locked``) are skipped and retried later, so the deallocator never races the
scheduler's own writes. Work items are claim keys in a queue with backoff; a periodic resync
re-checks every claim this controller owns, so a missed event costs a delay, never a leak.
A pod missing from the cache is confirmed gone by a live GET before anything is released,
unless the watch reported it deleted or finished (a UID is never reused).

Cheap, because every deleted pod passes through here: a few workers (releases do not wait in
line behind each other's round trips); a gone pod's reservation and the allocation dropped in
one status patch when nothing else reserves the claim (kube-controller-manager's release),
without a resourceVersion, so that kube-controller-manager and the garbage collector writing
to the same claim at the same moment cost no conflict (:meth:`Committer.release`: the API
server itself refuses to drop an allocation that is still reserved); the other writes start
from the cached claim with its resourceVersion as precondition (a stale copy costs a 409, and
the claim is worked again when its watch event arrives).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from controller.api import JSON, PODS, Api, meta, object_key
from controller.cache import ClusterCache
from controller.commit import (
    CommitAbortedError,
    Committer,
    StaleClaimError,
    StillReservedError,
    has_finalizer,
    is_bridge,
    pod_claim_keys,
    reserved_uids,
)
from controller.metrics import Metrics
from controller.queue import Outcome, SchedulingQueue
from driver.api.errors import ApiError, NotFoundError

log = logging.getLogger(f"biaxial.{__name__}")

RESYNC_S: Final = 30.0
#: Claims worked on at once.
WORKERS: Final = 4
#: UIDs of pods the watch reported gone, remembered (oldest forgotten first) so that their
#: reservations are released without asking the API server again.
GONE_REMEMBERED: Final = 10_000
_FINISHED: Final = frozenset({"Succeeded", "Failed"})


class Deallocator:
    """See the module docstring."""

    def __init__(
        self,
        api: Api,
        cache: ClusterCache,
        committer: Committer,
        metrics: Metrics,
        *,
        finalizer: str,
        resync_s: float = RESYNC_S,
        workers: int = WORKERS,
    ) -> None:
        self.api = api
        self.cache = cache
        self.committer = committer
        self.metrics = metrics
        self.finalizer = finalizer
        self.queue = SchedulingQueue(backoff_initial_s=0.1, backoff_max_s=5.0, flush_s=resync_s)
        self._resync_s = resync_s
        self._workers = workers
        self._gone: OrderedDict[str, None] = OrderedDict()  # pod UIDs the watch saw go
        self._by_pod: dict[str, set[str]] = {}  # pod uid -> claim keys that reference it
        self._pods: dict[str, str] = {}  # pod uid -> pod key
        cache.subscribe(self._on_event)

    # ------------------------------------------------------------------ events

    def _relevant(self, claim: Mapping[str, Any]) -> bool:
        """Only claims this controller allocated or created (they carry its finalizer)."""
        return has_finalizer(claim, self.finalizer)

    def _on_event(self, kind: str, _etype: str, old: JSON | None, new: JSON | None) -> None:
        if kind == "ResourceClaim":
            self._on_claim(old, new)
        elif kind == "Pod":
            self._on_pod(old, new)

    def _on_claim(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        key = object_key(obj)
        for uid in _pod_uids(old):
            self._by_pod.get(uid, set()).discard(key)
        if new is None:
            self.queue.forget(key)
            return
        for uid in _pod_uids(new):
            self._by_pod.setdefault(uid, set()).add(key)
        if self._relevant(new):
            self.queue.add(key)

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        uid = str(meta(obj).get("uid") or "")
        gone = new is None or (new.get("status") or {}).get("phase") in _FINISHED
        if not gone:
            self._pods[uid] = object_key(obj)
            return
        self._pods.pop(uid, None)
        self._gone[uid] = None
        if len(self._gone) > GONE_REMEMBERED:
            self._gone.popitem(last=False)
        keys = set(self._by_pod.pop(uid, set()))
        keys.update(pod_claim_keys(obj))
        for key in keys:
            self.queue.add(key)

    # ------------------------------------------------------------------ the loop

    def resync(self) -> None:
        for key, claim in list(self.cache.claims.store.items()):
            if self._relevant(claim):
                self.queue.add(key)

    async def run(self) -> None:
        """Work the queue and re-check every claim each ``resync_s`` until cancelled; should
        either fail, both stop and the error reaches the controller's task guard."""
        self.resync()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._resync_loop(), name="deallocator-resync")
            for n in range(1, self._workers):
                group.create_task(self._work(), name=f"deallocator-{n}")
            await self._work()

    async def _work(self) -> None:
        while True:
            key = await self.queue.pop()
            try:
                outcome = await self.process(key)
            except (StaleClaimError, StillReservedError):
                # The claim changed under the cached copy (reserved again, say): its watch
                # event queues it again.
                outcome = Outcome.FORGET
            except (ApiError, CommitAbortedError) as exc:
                log.warning(
                    "claim %s: deallocation failed (%s); retrying",
                    key,
                    exc,
                    extra={"claim": key},
                )
                outcome = Outcome.ERROR
            self.queue.done(key, outcome)

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self._resync_s)
            self.resync()

    async def _pod_state(self, ref: Mapping[str, Any], namespace: str) -> JSON | None:
        """The live pod a reservation or owner reference names (in the claim's namespace:
        consumers always are), or None when it is gone or finished."""
        uid = str(ref.get("uid") or "")
        if uid in self._gone:
            return None
        key = self._pods.get(uid)
        pod = self.cache.pods.get(key) if key else None
        if pod is None:
            try:
                pod = await self.api.get(PODS, str(ref.get("name")), namespace)
            except NotFoundError:
                return None
        if str(meta(pod).get("uid")) != uid:
            return None
        if (pod.get("status") or {}).get("phase") in _FINISHED:
            return None
        return pod

    async def _unreserve(self, key: str, claim: JSON, uid: str) -> JSON | None:
        """Drop a gone pod's reservation, and with it the allocation when nothing else
        reserves the claim (one write, as kube-controller-manager releases its claims); a
        bridge claim is deleted before its allocation is dropped (below)."""
        if not is_bridge(claim) and set(reserved_uids(claim)) <= {uid}:
            try:
                return await self.committer.release(key, uid)
            except StillReservedError:
                pass  # another consumer came meanwhile: only this pod's reservation goes
        return await self.committer.unreserve(key, uid, deallocate=False, cached=True)

    async def process(self, key: str) -> Outcome:
        """Bring one claim in line (see the module docstring)."""
        if key in self.committer.locked:
            return Outcome.ERROR  # a placement is being written: look again shortly
        claim = self.cache.claims.get(key)
        if claim is None or not self._relevant(claim):
            return Outcome.FORGET
        owner = _controller_pod(claim) if is_bridge(claim) else None
        if owner is not None and str(owner.get("uid")) in self.committer.pods_in_flight:
            return Outcome.ERROR  # a bridge claim whose creation is being completed
        namespace = str(meta(claim).get("namespace") or "default")
        status = claim.get("status") or {}
        for ref in status.get("reservedFor") or ():
            if ref.get("resource") != "pods" or ref.get("apiGroup"):
                continue
            pod = await self._pod_state(ref, namespace)
            if pod is None:
                log.info(
                    "claim %s: pod %s is gone or done; unreserving",
                    key,
                    ref.get("name"),
                    extra={"claim": key},
                )
                written = await self._unreserve(key, claim, str(ref.get("uid")))
                self.metrics.deallocations.labels(action="unreserve").inc()
                if written is None:
                    return Outcome.FORGET
                if _allocated(claim) and not _allocated(written):
                    self.metrics.deallocations.labels(action="deallocate").inc()
                claim = written
        if is_bridge(claim):
            pod = await self._pod_state(owner, namespace) if owner else None
            stale = pod is not None and _bound(pod) and _linked_claim(pod) != meta(claim)["name"]
            if pod is None or stale:
                log.info(
                    "claim %s: bridge claim of a gone pod (or an orphan); deleting",
                    key,
                    extra={"claim": key},
                )
                await self.committer.delete_claim(key)
                self.metrics.deallocations.labels(action="delete-bridge").inc()
                return Outcome.FORGET
        status = claim.get("status") or {}
        if status.get("reservedFor"):
            return Outcome.FORGET
        if _allocated(claim):
            log.info("claim %s: nothing reserves it; deallocating", key, extra={"claim": key})
            if await self.committer.release(key, None) is None:
                return Outcome.FORGET
            self.metrics.deallocations.labels(action="deallocate").inc()
        await self.committer.remove_finalizer(key, cached=True)
        return Outcome.FORGET


def _pod_uids(claim: Mapping[str, Any] | None) -> list[str]:
    if claim is None:
        return []
    uids = [
        str(r.get("uid"))
        for r in (claim.get("status") or {}).get("reservedFor") or ()
        if r.get("resource") == "pods"
    ]
    owner = _controller_pod(claim)
    if owner:
        uids.append(str(owner.get("uid")))
    return uids


def _controller_pod(claim: Mapping[str, Any]) -> JSON | None:
    for owner in meta(claim).get("ownerReferences") or ():
        if owner.get("controller") and owner.get("kind") == "Pod":
            return dict(owner)
    return None


def _allocated(claim: Mapping[str, Any]) -> bool:
    return (claim.get("status") or {}).get("allocation") is not None


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _linked_claim(pod: Mapping[str, Any]) -> str:
    ext = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return str(ext.get("resourceClaimName") or "")

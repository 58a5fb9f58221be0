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
   once no allocation is left) our finalizer removed;
4. except a claim marked for deletion that no live pod reserves (a claim generated for a pod
   from a template, or a bridge claim, once the garbage collector followed its deleted pod;
   a user's claim deleted while in use, once its pods are gone): our finalizer is removed
   at once, allocated or not, and the API server deletes the claim with that write
   (:meth:`Committer.let_go`). A claim whose controlling owner is a deleted pod is left
   alone for up to ``GC_GRACE_S`` while the garbage collector marks it, so that it too goes
   in that one write (kube-controller-manager's own release of kube-scheduler's claims
   costs two); then it is released as in 1-3.

Claims allocated by others are never touched (their devices are still respected: the
snapshot counts every allocated claim). Claims whose placement is being committed right now
(``Committer.locked``, and bridge claims whose pod is in ``Committer.pods_in_flight``) are set
aside and worked once those writes are done, so the deallocator never races the scheduler's
own writes. Work items are claim keys in a queue with backoff; a
periodic resync re-checks every claim this controller owns, so a missed event costs a delay,
never a leak.
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
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final, TypeVar

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
from driver.api.multimap import Multimap

log = logging.getLogger(f"biaxial.{__name__}")

RESYNC_S: Final = 30.0
#: Claims worked on at once.
WORKERS: Final = 4
#: UIDs of pods the watch reported gone, remembered (oldest forgotten first) so that their
#: reservations are released without asking the API server again.
GONE_REMEMBERED: Final = 10_000
#: Seconds a claim owned by a deleted pod is left for the garbage collector to mark it for
#: deletion before it is released by the longer path.
GC_GRACE_S: Final = 2.0
_FINISHED: Final = frozenset({"Succeeded", "Failed"})
_V = TypeVar("_V")


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
        gc_grace_s: float = GC_GRACE_S,
    ) -> None:
        self.api = api
        self.cache = cache
        self.committer = committer
        self.metrics = metrics
        self.finalizer = finalizer
        self.queue = SchedulingQueue(backoff_initial_s=0.1, backoff_max_s=5.0, flush_s=resync_s)
        self._resync_s = resync_s
        self._workers = workers
        self._gc_grace_s = gc_grace_s
        #: pod UIDs known gone -> deleted (True) or only finished (False)
        self._gone: OrderedDict[str, bool] = OrderedDict()
        self._awaiting_gc: dict[str, float] = {}  # claim key -> when first left to the GC
        #: UIDs of claims this deallocator's last write deleted: an event about such a claim
        #: that comes before its deletion's brings it back, and it is not written again
        self._deleted: OrderedDict[str, None] = OrderedDict()
        self._may_let_go = True  # until the claim-protection policy refuses it
        self._by_pod: Multimap[str, str] = Multimap()  # pod uid -> claim keys that reference it
        self._pods: dict[str, str] = {}  # pod uid -> pod key
        #: claims to work once the placement writing them is done (Committer.locked)
        self._deferred: set[str] = set()
        cache.subscribe(self._on_event)
        committer.add_unlock_listener(self._unlocked)

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
            self._by_pod.discard(uid, key)
        if new is None:
            self.queue.forget(key)
            self._awaiting_gc.pop(key, None)
            self._deferred.discard(key)
            return
        for uid in _pod_uids(new):
            self._by_pod.add(uid, key)
        if self._relevant(new) and not self._in_line(key, new):
            if self._written_now(new):
                # The event of its creation may come before the commit has the new claim's
                # name to lock: as a locked claim, it is worked once the commit unlocks it (one
                # the commit never locks, the answer to its creation lost, at the resync; the
                # pod's repair deletes it before the pod is tried again).
                self._deferred.add(key)
            else:
                self._add(key)

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        uid = str(meta(obj).get("uid") or "")
        gone = new is None or (new.get("status") or {}).get("phase") in _FINISHED
        if not gone:
            self._pods[uid] = object_key(obj)
            return
        self._pods.pop(uid, None)
        self._remember_gone(uid, deleted=new is None)
        keys = set(self._by_pod.pop(uid))
        keys.update(pod_claim_keys(obj))
        for key in keys:
            self._add(key)

    def _add(self, key: str) -> None:
        """Work ``key``; while a placement writes it, once that is done (its own writes bring
        a claim here several times during a commit, and nothing can be done meanwhile)."""
        if key in self.committer.locked:
            self._deferred.add(key)
        else:
            self.queue.add(key)

    def _unlocked(self, key: str) -> None:
        if key in self._deferred:
            self._deferred.discard(key)
            claim = self.cache.claims.get(key)
            if claim is None or not self._in_line(key, claim):
                self.queue.add(key)

    def _in_line(self, key: str, claim: Mapping[str, Any]) -> bool:
        """Whether :meth:`process` would find nothing to do for ``claim`` as the caches show
        it now: not marked for deletion nor deleted by us, reserved only by pods the pod cache
        shows live, and for a bridge claim, owned by such a pod whose commit is over and that
        is unbound or links this claim. Such a claim is not queued (every claim of a placement
        came here two or three times per pod, each a trip through the queue and a worker to do
        nothing): whatever makes work later (a pod gone or finished, the claim changed) brings
        an event of its own, and the periodic resync checks every claim."""
        if key in self._awaiting_gc:
            return False
        m = meta(claim)
        if m.get("deletionTimestamp") or m.get("uid") in self._deleted:
            return False
        refs = (claim.get("status") or {}).get("reservedFor") or ()
        if not refs:
            return False
        for ref in refs:
            if not _is_pod(ref) or self._live_pod(ref) is None:
                return False
        return not is_bridge(claim) or self._bridge_in_line(claim)

    def _live_pod(self, ref: Mapping[str, Any]) -> JSON | None:
        """The pod a reservation or owner reference names, when the pod cache shows it live
        (as :meth:`_pod_state` would find it without asking the API server); else None."""
        uid = str(ref.get("uid") or "")
        pod_key = self._pods.get(uid) if uid not in self._gone else None
        pod = self.cache.pods.get(pod_key) if pod_key else None
        if (
            pod is None
            or meta(pod).get("uid") != uid
            or (pod.get("status") or {}).get("phase") in _FINISHED
        ):
            return None
        return pod

    def _written_now(self, claim: Mapping[str, Any]) -> bool:
        """Whether ``claim`` is a bridge claim whose owning pod's commit is being written
        (the commit locks the claim, once created, until it ends)."""
        if not is_bridge(claim):
            return False
        owner = _controller_pod(claim)
        return owner is not None and str(owner.get("uid")) in self.committer.pods_in_flight

    def _bridge_in_line(self, claim: Mapping[str, Any]) -> bool:
        """Whether :meth:`process` leaves a bridge claim as it is: its owning pod's commit is
        over (until then it would look again later), the pod is live, and it is unbound or
        links this claim (else the claim is an orphan, deleted)."""
        owner = _controller_pod(claim)
        if owner is None or str(owner.get("uid")) in self.committer.pods_in_flight:
            return False
        pod = self._live_pod(owner)
        return pod is not None and (not _bound(pod) or _linked_claim(pod) == meta(claim)["name"])

    def _remember_gone(self, uid: str, *, deleted: bool) -> None:
        _remember(self._gone, uid, deleted or self._gone.get(uid, False))

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
                pod = None
        if pod is None or str(meta(pod).get("uid")) != uid:
            self._remember_gone(uid, deleted=True)  # a UID is never reused
            return None
        if (pod.get("status") or {}).get("phase") in _FINISHED:
            return None
        return pod

    def _left_to_gc(self, key: str, claim: Mapping[str, Any]) -> bool:
        """Whether to leave a claim whose controlling owner is a deleted pod to the garbage
        collector for now: its mark for deletion (a watch event) brings the claim back, and so
        does a timer once ``gc_grace_s`` is over, after which it is released the longer way."""
        owner = _controller_pod(claim)
        if owner is None or not self._gone.get(str(owner.get("uid"))):
            return False
        now = time.monotonic()
        since = self._awaiting_gc.get(key)
        if since is None:
            self._awaiting_gc[key] = now
            asyncio.get_running_loop().call_later(self._gc_grace_s, self.queue.add, key)
            return True
        return now - since < self._gc_grace_s

    async def _let_go(self, key: str) -> bool:
        """Remove our finalizer from a claim marked for deletion that no live pod reserves
        (:meth:`Committer.let_go`); False when the claim-protection policy refuses it (a
        policy older than this controller), and from then on."""
        try:
            self._note_deleted(key, await self.committer.let_go(key))
        except ApiError as exc:
            if exc.status != 422:
                raise
            self._may_let_go = False
            log.warning(
                "claim %s: removing the finalizer of a claim marked for deletion was refused "
                "(%s); from now on this controller deallocates such claims first, one write "
                "more each: install the claim-protection policy of this controller's chart",
                key,
                exc,
                extra={"claim": key},
            )
            return False
        self._awaiting_gc.pop(key, None)
        self.metrics.deallocations.labels(action="let-go").inc()
        return True

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
            self._deferred.add(key)  # a placement is being written: look again when it is done
            return Outcome.FORGET
        claim = self.cache.claims.get(key)
        if claim is None or not self._relevant(claim) or meta(claim).get("uid") in self._deleted:
            return Outcome.FORGET
        owner = _controller_pod(claim) if is_bridge(claim) else None
        if owner is not None and str(owner.get("uid")) in self.committer.pods_in_flight:
            return Outcome.ERROR  # a bridge claim whose creation is being completed
        namespace = str(meta(claim).get("namespace") or "default")
        refs = (claim.get("status") or {}).get("reservedFor") or ()
        gone = [r for r in refs if _is_pod(r) and await self._pod_state(r, namespace) is None]
        if len(gone) == len(refs) and self._may_let_go:  # no live consumer reserves it
            if meta(claim).get("deletionTimestamp"):
                if await self._let_go(key):
                    return Outcome.FORGET
            elif self._left_to_gc(key, claim):
                return Outcome.FORGET
        self._awaiting_gc.pop(key, None)
        for ref in gone:
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
        self._note_deleted(key, await self.committer.remove_finalizer(key, cached=True))
        return Outcome.FORGET

    def _note_deleted(self, key: str, written: JSON | None) -> None:
        """Remember a claim that our write deleted (its last finalizer removed while it was
        marked for deletion), or found gone."""
        claim = written if written is not None else self.cache.claims.get(key)
        if claim is None:
            return
        m = meta(claim)
        if written is None or (m.get("deletionTimestamp") and not m.get("finalizers")):
            _remember(self._deleted, str(m.get("uid")), None)


def _pod_uids(claim: Mapping[str, Any] | None) -> list[str]:
    if claim is None:
        return []
    uids = [
        str(r.get("uid"))
        for r in (claim.get("status") or {}).get("reservedFor") or ()
        if _is_pod(r)
    ]
    owner = _controller_pod(claim)
    if owner:
        uids.append(str(owner.get("uid")))
    return uids


def _remember(uids: OrderedDict[str, _V], uid: str, value: _V) -> None:
    """Put ``uid`` last in a bounded memory of UIDs, the oldest forgotten past
    ``GONE_REMEMBERED`` (a UID is never reused, so forgetting only costs a read)."""
    uids[uid] = value
    uids.move_to_end(uid)
    if len(uids) > GONE_REMEMBERED:
        uids.popitem(last=False)


def _is_pod(ref: Mapping[str, Any]) -> bool:
    return ref.get("resource") == "pods" and not ref.get("apiGroup")


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

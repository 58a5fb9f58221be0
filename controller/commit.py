"""Writing one placement to the API server in an order that is safe at every crash point.

A :class:`Plan` says: bind pod P to node N, with these claims allocated (or, for claims that
were already allocated, only reserved) and maybe a KEP-5004 bridge claim. :class:`Committer`
writes it in this order:

1. **finalizer**: the controller's own finalizer (``<driver>/allocation``, never the reserved
   ``resource.kubernetes.io/delete-protection``) on every claim this plan allocates, by a
   merge patch carrying the claim's resourceVersion;
2. **allocation**: ``status.allocation`` plus P in ``status.reservedFor``, one PUT of
   ``/status`` per claim with the resourceVersion of the claim we read (a PUT that keeps an
   allocation re-sends its opaque parameters, which the server compares byte for byte: they
   are accepted because :mod:`kubeapi.codec` writes them, and writes them again, in Go's
   form);
3. **bridge**: for legacy ``nvidia.com/gpu`` pods, the special claim is created (KEP-5004
   shape, with our finalizer), its status written as in 2, and linked from
   ``pod.status.extendedResourceClaimStatus``;
4. **volumes** (a pod with claims to bind or provision; :mod:`controller.volumes`): each PV
   chosen for a claim gets its ``claimRef``, each claim to provision the selected node;
5. **the pre-bind wait** (:mod:`controller.prebind`), without holding a write slot (at most
   ``max_concurrent_writes`` placements write at once, and a slow provisioner or device
   attachment must not hold up other pods), in upstream's PreBind order: until the PV
   controller and the provisioner have bound every claim of 4, then (KEP-5007) until the
   ``bindingConditions`` of every allocated device that carries them are met in the claims'
   ``status.devices`` (:mod:`controller.binding`); a failure (provisioning failed, a
   binding failure condition, a timeout) aborts the commit (rolled back below, the pod
   requeued);
6. **binding**: ``POST pods/P/binding`` with P's UID and the resourceVersion the placement
   was decided on (as our own bridge link left it) as preconditions: a pod changed since,
   above all one whose leftover claims another attempt released (:mod:`controller.repair`
   writes to the pod before it releases anything), is not bound (409: the attempt is rolled
   back and retried).

What a crash leaves behind, and who repairs it:

* after 1: a claim with our finalizer and no allocation; the deallocator removes the finalizer;
* after 2 or 3: claims allocated and reserved for a pod that is not bound, maybe a bridge
  claim (with or without its allocation, linked or not); before the pod is tried again the
  scheduler releases the reservations and allocations and deletes the bridge claim (its
  repair step, :mod:`controller.repair`, which first moves the pod's resourceVersion past
  the one a binding of the interrupted attempt would carry); until then their devices count
  as used, so nothing is given twice;
* after 4 (a PV's ``claimRef``, a claim's selected node, or everything bound): as after 3 for
  the device claims; the volumes are bound (or being bound, or provisioned) for the pod's
  claims whatever happens to the pod, as upstream leaves them, and its next attempt follows
  them: a claim bound to a PV goes where the PV is, a claim with a selected node only to that
  node (the provisioner removes it when it cannot provision there);
* during 5: as after 4 (the wait is not resumed after a restart: the pod is tried again from
  the start, so a device whose conditions were never met is released);
* after 6: the pod is bound and every one of its claims is allocated and reserved for it.

While a placement is being written, its claims (and the pod's bridge claim, from its creation)
are locked against the deallocator (:attr:`Committer.locked`, :attr:`Committer.pods_in_flight`)
until the commit ends, rollback included; the pod leaves ``pods_in_flight`` before the claims
are unlocked.

A claim that already shows the pod's reservation (nothing to write) is confirmed by a live
read before the pod is bound on it: the claim informer may not have delivered a release yet.

So no pod is ever bound without its claims allocated and reserved, and a device is never
allocated to two claims by this controller (the decision engine counts every placement from
the moment it is decided until its writes are seen or it fails, and every status write is
conditional on the resourceVersion the decision was based on).

Failures, with one policy for every step (:data:`RETRY`, a :class:`kubeapi.retry.Retry`): 409
re-reads the object and retries at once while the plan still holds (the claim is still
unallocated, or already carries our allocation; each 409 is counted per step by
``on_conflict``); 5xx and transport errors retry after a backoff, re-reading first because the
write may have landed. When the plan no longer holds, or
retries run out, :class:`CommitAbortedError` is raised after a best-effort rollback of what this
attempt wrote (reservations, allocations, finalizers, the bridge claim); anything the rollback
cannot undo is repaired as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from controller.api import JSON, PODS, RESOURCE_CLAIMS, Api, meta, object_key
from controller.binding import BindingWaiter, has_binding_conditions
from controller.cache import ClaimOverlay
from driver.api.errors import ApiError, BiaxialError, ConflictError, NotFoundError, ServerError
from driver.scheduling.bridge import EXTENDED_RESOURCE_CLAIM_ANNOTATION
from driver.scheduling.storage import VolumeBindings
from kubeapi.events import now_rfc3339
from kubeapi.retry import Attempts, Backoff, Retry

log = logging.getLogger(f"biaxial.{__name__}")

#: Every write step: 5 tries; a 409 again at once on a fresh read, a 5xx after 0.05 s * 2**try.
RETRY: Final = Retry(tries=5, backoff=Backoff(0.05, 1.0))
MAX_RESERVED_FOR: Final = 256

#: Called after every write with the step name (``finalizer``, ``allocation``,
#: ``bridge-create``, ``bridge-allocation``, ``bridge-link``, ``volume-binding``,
#: ``selected-node``, ``volumes-bound`` and ``binding-conditions`` (after each wait, before
#: the binding), ``binding``); tests raise from it to simulate a crash between two writes.
StepHook = Callable[[str, str], Awaitable[None]]

#: What :meth:`VolumeSteps.write` wrote: ``(kind, key) -> resourceVersion``.
Written = dict[tuple[str, str], int]


class CommitAbortedError(BiaxialError):
    """The placement could not be written; what this attempt wrote was rolled back."""

    def __init__(self, message: str, *, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict


class StaleClaimError(CommitAbortedError):
    """A write based on the cached claim was refused (409): the cache lags behind a change
    whose watch event is on its way, and brings the claim back to whoever watches it."""


class StillReservedError(CommitAbortedError):
    """A release was refused: another consumer still reserves the claim."""


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def consumer(self) -> JSON:
        """The ``ResourceClaimConsumerReference`` for this pod."""
        return {"resource": "pods", "name": self.name, "uid": self.uid}

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodRef:
        m = meta(pod)
        return cls(str(m.get("namespace") or "default"), str(m["name"]), str(m.get("uid") or ""))


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """One claim of the pod: ``allocation`` to write, or None if it is already allocated."""

    key: str
    allocation: JSON | None


@dataclass(frozen=True, slots=True)
class BridgePlan:
    """The KEP-5004 special claim: its body (``generateName``), allocation and mappings."""

    claim: JSON
    allocation: JSON
    request_mappings: tuple[JSON, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    pod: PodRef
    node: str
    claims: tuple[ClaimPlan, ...] = ()
    bridge: BridgePlan | None = None
    volumes: VolumeBindings | None = None  # PVs to bind and claims to provision, first
    #: The pod's resourceVersion the placement was decided on: the binding's precondition
    #: (with its UID), so that no pod changed since (repaired, above all) is ever bound.
    pod_version: str = ""
    #: How the placement was decided (policies, nodes evaluated, time), for the log line that
    #: says the pod is bound: one INFO line per pod, not one per step.
    decided: str = ""


class VolumeSteps(Protocol):
    """Step 4 (:class:`controller.volumes.VolumeBinder`)."""

    async def write(self, plan: Plan) -> Written: ...

    async def wait(self, plan: Plan, written: Written) -> None: ...


@dataclass(slots=True)
class _Progress:
    """What this attempt wrote, for rollback."""

    finalized: list[str] = field(default_factory=list)
    allocated: list[str] = field(default_factory=list)  # we wrote the allocation
    reserved: list[str] = field(default_factory=list)  # we only added the reservation
    bridge: JSON | None = None
    locked: str | None = None  # the bridge claim's key, locked until the commit ends
    pod_version: str = ""  # the pod's resourceVersion the binding requires (after our writes)


def reserved_uids(claim: Mapping[str, Any]) -> list[str]:
    return [str(r.get("uid")) for r in (claim.get("status") or {}).get("reservedFor") or []]


def has_finalizer(claim: Mapping[str, Any], finalizer: str) -> bool:
    return finalizer in (meta(claim).get("finalizers") or [])


def is_bridge(claim: Mapping[str, Any]) -> bool:
    annotations = meta(claim).get("annotations") or {}
    return annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


async def _noop(_step: str, _key: str) -> None:
    return None


#: The write slot of a committer without a bound on concurrent writes.
_NO_SLOT: Final = contextlib.nullcontext()


class Committer:
    """Writes plans (see the module docstring). One per controller; safe to run concurrently
    for different pods."""

    def __init__(
        self,
        api: Api,
        overlay: ClaimOverlay,
        *,
        finalizer: str,
        on_step: StepHook | None = None,
        on_conflict: Callable[[str], None] | None = None,
        write_slots: asyncio.Semaphore | None = None,
        volumes: VolumeSteps | None = None,
        binding: BindingWaiter | None = None,
        on_waiting: Callable[[Plan], Awaitable[None]] | None = None,
    ) -> None:
        self.api = api
        # The binding-conditions waiter (None: devices' binding conditions not waited for).
        self.binding = binding
        self._on_waiting = on_waiting  # e.g. the pod's BindingConditionsPending event
        self.overlay = overlay
        self.finalizer = finalizer
        self.volumes = volumes
        self._slots = write_slots
        self._on_step = on_step or _noop
        self._on_conflict = on_conflict or (lambda _step: None)
        # Claim keys with writes in progress, counted: two pods sharing a claim may commit at
        # once, and the first to finish must not unlock the other's writes.
        self.locked: Counter[str] = Counter()
        self._unlock_listeners: list[Callable[[str], None]] = []
        self.pods_in_flight: set[str] = set()  # UIDs of pods whose placement is being written

    # ------------------------------------------------------------------ helpers

    def _lock(self, keys: Iterable[str]) -> None:
        self.locked.update(keys)

    def add_unlock_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(key)`` is called when no placement writes claim ``key`` any more."""
        self._unlock_listeners.append(listener)

    def _unlock(self, keys: Iterable[str]) -> None:
        locked = self.locked
        for key in keys:
            left = locked[key] - 1
            if left > 0:
                locked[key] = left
            elif locked.pop(key, None) is not None:
                for listener in self._unlock_listeners:
                    listener(key)

    async def _get_claim(self, key: str) -> JSON:
        namespace, name = _split(key)
        return await RETRY.call(lambda: self.api.get(RESOURCE_CLAIMS, name, namespace))

    async def _base(self, key: str, cached: bool, tried_cache: bool) -> tuple[JSON, bool]:
        """The claim a write step starts from, and whether it is the cached one. With
        ``cached``, the newest state this process knows (the informer's, or what it wrote),
        read live only when there is none: the write carries its resourceVersion, so a stale
        copy is refused, never written over — and then (``tried_cache``) the step ends with
        :class:`StaleClaimError` instead of reading live, since the claim's watch event is
        on its way. Without ``cached``, always read live."""
        if tried_cache:
            raise StaleClaimError(f"claim {key}: the cached copy is stale", conflict=True)
        if cached:
            claim = self.overlay.latest_written(key)
            if claim is not None:
                return claim, True
        return await self._get_claim(key), False

    def _conflict(self, step: str) -> None:
        self._on_conflict(step)

    def _slot(self) -> contextlib.AbstractAsyncContextManager[object]:
        """One of the write slots (placements writing at once), when the committer has them
        (the semaphore itself: a generator-based context manager cost a task step per use)."""
        return self._slots if self._slots is not None else _NO_SLOT

    def _attempts(self, step: str) -> Attempts:
        """The tries of a write step whose 409s count as conflicts of ``step``."""
        return RETRY.attempts(on_conflict=lambda: self._conflict(step))

    # ------------------------------------------------------------------ steps

    async def add_finalizer(self, key: str, claim: JSON) -> JSON:
        """Step 1 for one claim; returns the claim as written (or as it already was)."""
        namespace, name = _split(key)
        async for attempt in self._attempts("finalizer"):
            if has_finalizer(claim, self.finalizer):
                return claim
            m = meta(claim)
            if m.get("deletionTimestamp"):
                raise CommitAbortedError(f"claim {key} is being deleted")
            if (claim.get("status") or {}).get("allocation") is not None:
                raise CommitAbortedError(f"claim {key} was allocated meanwhile", conflict=True)
            body = {
                "metadata": {
                    "resourceVersion": m.get("resourceVersion"),
                    "finalizers": [*(m.get("finalizers") or []), self.finalizer],
                }
            }
            async with attempt:
                return await self.api.patch(RESOURCE_CLAIMS, name, body, namespace=namespace)
            claim = await self._get_claim(key)
        raise CommitAbortedError(f"claim {key}: could not add finalizer", conflict=True)

    async def write_status(
        self, key: str, claim: JSON, allocation: JSON | None, pod: PodRef, step: str
    ) -> JSON:
        """Step 2 for one claim: allocation (unless None) plus the pod's reservation."""
        async for attempt in self._attempts(step):
            status = claim.get("status") or {}
            current = status.get("allocation")
            reserved = list(status.get("reservedFor") or [])
            mine = any(r.get("uid") == pod.uid for r in reserved)
            if current is not None and mine:
                return claim  # already written (e.g. a retried write that had landed)
            if meta(claim).get("deletionTimestamp"):
                raise CommitAbortedError(f"claim {key} is being deleted")
            if allocation is not None and current is not None:
                raise CommitAbortedError(
                    f"claim {key} was allocated by someone else", conflict=True
                )
            if allocation is None and current is None:
                raise CommitAbortedError(f"claim {key} was deallocated meanwhile", conflict=True)
            if allocation is not None and not has_finalizer(claim, self.finalizer):
                # Someone removed it meanwhile (a conflicting cleanup): an allocation must
                # never be written without the finalizer that protects it.
                claim = await self.add_finalizer(key, claim)
                continue
            if len(reserved) >= MAX_RESERVED_FOR:
                raise CommitAbortedError(
                    f"claim {key} is reserved for {MAX_RESERVED_FOR} consumers"
                )
            # Built over the cached objects, not a deep copy of them (1 ms of CPU a claim
            # under the profiler): nothing below changes what it shares with them.
            new_status = {**status, "reservedFor": [*reserved, pod.consumer()]}
            if allocation is not None:
                written = allocation
                if self.binding is not None and has_binding_conditions(allocation):
                    # When the wait began: upstream's bindingTimeout counts from here.
                    written = {**allocation, "allocationTimestamp": now_rfc3339()}
                new_status["allocation"] = written
            body = {**claim, "status": new_status}
            async with attempt:
                return await self.api.replace(RESOURCE_CLAIMS, body, subresource="status")
            claim = await self._get_claim(key)
        raise CommitAbortedError(f"claim {key}: could not write status", conflict=True)

    async def _create_bridge(self, plan: Plan, bridge: BridgePlan) -> JSON:
        # A new top level and metadata over the planned claim, not a deep copy of it (a
        # third of this step's CPU): only the finalizers differ, and nothing below changes
        # what the body shares with the plan.
        body = {
            **bridge.claim,
            "metadata": {**(bridge.claim.get("metadata") or {}), "finalizers": [self.finalizer]},
        }
        # A 409 means the generated name collided: try another. After a server error whether
        # it was created is unknown; an orphan is found by its annotation and owner and
        # deleted before the pod is tried again.
        async for attempt in self._attempts("bridge-create"):
            async with attempt:
                return await self.api.create(RESOURCE_CLAIMS, body, plan.pod.namespace)
        raise CommitAbortedError(f"pod {plan.pod.key}: could not create the bridge claim")

    async def _link_bridge(
        self, plan: Plan, claim_name: str, bridge: BridgePlan, pod_version: str
    ) -> str:
        """Link the bridge claim from the pod, on the condition that the pod is still at
        ``pod_version`` (when given: the binding's chain of preconditions must not skip a
        write by anyone else); returns the pod's new resourceVersion."""
        body: JSON = {
            "status": {
                "extendedResourceClaimStatus": {
                    "resourceClaimName": claim_name,
                    "requestMappings": [dict(m) for m in bridge.request_mappings],
                }
            }
        }
        if pod_version:
            body["metadata"] = {"resourceVersion": pod_version}
        try:
            linked = await RETRY.call(
                lambda: self.api.patch(
                    PODS, plan.pod.name, body, namespace=plan.pod.namespace, subresource="status"
                )
            )
        except NotFoundError as exc:
            raise CommitAbortedError(f"pod {plan.pod.key} is gone") from exc
        except ConflictError as exc:
            self._conflict("bridge-link")
            raise CommitAbortedError(
                f"pod {plan.pod.key} changed since its placement was decided", conflict=True
            ) from exc
        return str(meta(linked).get("resourceVersion") or "")

    async def _bind(self, plan: Plan, pod_version: str) -> None:
        pod = plan.pod
        # A 409 is not retried: the pod is bound already (by an earlier try, or to another
        # node), or it changed since the placement was decided (``pod_version``: a repair of
        # this pod's claims by another attempt writes to the pod first, exactly so that this
        # binding cannot land after it; see :mod:`controller.repair`).
        async for attempt in RETRY.attempts(reraise=True):
            try:
                async with attempt:
                    await self.api.bind(
                        pod.namespace, pod.name, pod.uid, plan.node, resource_version=pod_version
                    )
                    return
            except ConflictError as exc:
                self._conflict("binding")
                if await self._bound_to(pod, plan.node):
                    return  # an earlier attempt landed
                msg = f"pod {pod.key} cannot be bound: {exc}"
                raise CommitAbortedError(msg, conflict=True) from exc
            except NotFoundError as exc:
                raise CommitAbortedError(f"pod {pod.key} is gone") from exc
            with contextlib.suppress(ServerError):  # after a server error: did it land?
                if await self._bound_to(pod, plan.node):
                    return

    async def _bound_to(self, pod: PodRef, node: str) -> bool:
        current = await self.api.get(PODS, pod.name, pod.namespace)
        return bool((current.get("spec") or {}).get("nodeName") == node)

    # ------------------------------------------------------------------ the whole plan

    async def commit(self, plan: Plan) -> None:
        """Write ``plan``; raises CommitAbortedError or ApiError, both after a rollback."""
        start = time.monotonic()
        progress = _Progress(pod_version=plan.pod_version)
        keys = [c.key for c in plan.claims]
        self._lock(keys)
        self.pods_in_flight.add(plan.pod.uid)
        try:
            await self._commit(plan, progress)
        except BaseException as exc:
            if isinstance(exc, (BiaxialError, asyncio.TimeoutError)):
                log.warning(
                    "pod %s: commit failed (%s); rolling back",
                    plan.pod.key,
                    exc,
                    extra={"pod": plan.pod.key, "node": plan.node},
                )
                async with self._slot():
                    await self.rollback(plan, progress)
            raise
        finally:
            # The pod leaves the flight first: an unlock listener (the deallocator) that
            # looks at the pod's claims sees its commit over.
            self.pods_in_flight.discard(plan.pod.uid)
            if progress.locked is not None:
                keys.append(progress.locked)
            self._unlock(keys)
            for claim_plan in plan.claims:  # only what this plan showed as pending
                if claim_plan.allocation is not None:
                    self.overlay.clear_pending(claim_plan.key)
        log.info(
            "pod %s: bound to %s with %d claim(s)%s in %.1f ms%s",
            plan.pod.key,
            plan.node,
            len(plan.claims),
            " and a bridge claim" if plan.bridge else "",
            (time.monotonic() - start) * 1000,
            f" ({plan.decided})" if plan.decided else "",
            extra={"pod": plan.pod.key, "node": plan.node},
        )

    async def _commit(self, plan: Plan, progress: _Progress) -> None:
        async with self._slot():
            written = await self._write_claims(plan, progress)
        # Step 5, no write slot held meanwhile.
        if plan.volumes is not None:
            if self.volumes is None:
                raise CommitAbortedError(f"pod {plan.pod.key}: no volume binder to bind volumes")
            await self.volumes.wait(plan, written)
            await self._on_step("volumes-bound", plan.pod.key)
        if self.binding is not None:
            await self._wait_for_binding_conditions(plan, progress)
        async with self._slot():
            await self._bind(plan, progress.pod_version)
        await self._on_step("binding", plan.pod.key)

    async def _wait_for_binding_conditions(self, plan: Plan, progress: _Progress) -> None:
        """Step 5's wait for the devices' binding conditions."""
        assert self.binding is not None
        keys = [c.key for c in plan.claims]
        if progress.bridge is not None:
            keys.append(object_key(progress.bridge))
        waiting = [
            k
            for k in keys
            if has_binding_conditions(
                ((self.overlay.get(k) or {}).get("status") or {}).get("allocation")
            )
        ]
        if not waiting:
            return
        if self._on_waiting is not None:
            await self._on_waiting(plan)
        waited = await self.binding.wait(waiting)
        log.info(
            "pod %s: binding conditions met after %.1f s",
            plan.pod.key,
            waited,
            extra={"pod": plan.pod.key, "node": plan.node},
        )
        await self._on_step("binding-conditions", plan.pod.key)

    async def _write_claims(self, plan: Plan, progress: _Progress) -> Written:
        """Steps 1 to 4's writes; returns what the volume writes left to wait for."""
        current: dict[str, JSON] = {}
        for claim_plan in plan.claims:
            claim = self.overlay.latest_written(claim_plan.key)
            if claim is None or plan.pod.uid in reserved_uids(claim):
                # A claim that already shows this pod's reservation needs no write, and the
                # pod is bound on the strength of it: that must be the API server's word,
                # never a cache that may lag behind a release (see controller.repair).
                claim = await self._get_claim(claim_plan.key)
            if claim_plan.allocation is not None:
                claim = await self.add_finalizer(claim_plan.key, claim)
                progress.finalized.append(claim_plan.key)
                await self._on_step("finalizer", claim_plan.key)
            current[claim_plan.key] = claim
        for claim_plan in plan.claims:
            written = await self.write_status(
                claim_plan.key,
                current[claim_plan.key],
                claim_plan.allocation,
                plan.pod,
                "allocation",
            )
            (progress.allocated if claim_plan.allocation is not None else progress.reserved).append(
                claim_plan.key
            )
            self.overlay.assume(written)
            await self._on_step("allocation", claim_plan.key)
        if plan.bridge is not None:
            created = await self._create_bridge(plan, plan.bridge)
            progress.bridge = created
            key = object_key(created)
            # Locked until the whole commit ends (commit() unlocks it with the plan's claims,
            # rollback included), not only while it is written: its owner is in flight until
            # then, and the deallocator would only look at it again and again meanwhile.
            self._lock([key])
            progress.locked = key
            try:
                # Until its status is written, the overlay shows the new claim allocated.
                pending = {**created, "status": {"allocation": plan.bridge.allocation}}
                self.overlay.set_pending(key, pending)
                await self._on_step("bridge-create", key)
                written = await self.write_status(
                    key, created, plan.bridge.allocation, plan.pod, "bridge-allocation"
                )
                self.overlay.assume(written)
                await self._on_step("bridge-allocation", key)
                version = await self._link_bridge(
                    plan, str(meta(created)["name"]), plan.bridge, progress.pod_version
                )
                if progress.pod_version:  # the binding expects the pod as this write left it
                    progress.pod_version = version
                await self._on_step("bridge-link", key)
            finally:
                self.overlay.clear_pending(key)
        if plan.volumes is None:
            return {}
        if self.volumes is None:
            raise CommitAbortedError(f"pod {plan.pod.key}: no volume binder to bind volumes")
        return await self.volumes.write(plan)

    # ------------------------------------------------------------------ rollback

    async def rollback(self, plan: Plan, progress: _Progress) -> None:
        """Undo what ``progress`` records, best effort (failures are logged, not raised)."""
        try:
            if progress.bridge is not None:
                await self.delete_claim(object_key(progress.bridge))
            for key in reversed(progress.allocated + progress.reserved):
                await self.unreserve(key, plan.pod.uid, deallocate=key in progress.allocated)
            for key in reversed(progress.finalized):
                await self.remove_finalizer(key)
        except (ApiError, CommitAbortedError) as exc:
            log.warning(
                "pod %s: rollback incomplete (%s); repaired before its next attempt",
                plan.pod.key,
                exc,
            )

    async def _rewrite_status(
        self, key: str, step: str, edit: Callable[[JSON], JSON | None], *, cached: bool = False
    ) -> JSON | None:
        """Read the claim (``cached``: see :meth:`_base`), let ``edit`` compute its new
        status (None: nothing to change), and write it through ``/status`` with the read
        resourceVersion as precondition, retrying conflicts and server errors. Returns the
        claim as written (or as found when there was nothing to do); None when the claim is
        gone."""
        from_cache = False
        async for attempt in self._attempts(step):
            try:
                claim, from_cache = await self._base(key, cached, from_cache)
            except NotFoundError:
                self.overlay.forget(key)
                return None
            new_status = edit(claim.get("status") or {})
            if new_status is None:
                return claim
            body = copy.deepcopy(claim)
            body["status"] = new_status
            try:
                async with attempt:
                    written = await self.api.replace(RESOURCE_CLAIMS, body, subresource="status")
                    self.overlay.forget(key)
                    self.overlay.assume(written)
                    return written
            except NotFoundError:
                self.overlay.forget(key)
                return None
        raise CommitAbortedError(f"claim {key}: could not {step}", conflict=True)

    async def unreserve(
        self, key: str, pod_uid: str, *, deallocate: bool, cached: bool = False
    ) -> JSON | None:
        """Remove ``pod_uid`` from the claim's reservedFor; with ``deallocate`` also clear the
        allocation when nothing else reserves it (only for claims this controller allocated),
        in the same write (as kube-controller-manager releases its claims). Returns the claim
        as written (None when it is gone)."""

        def edit(status: JSON) -> JSON | None:
            before = status.get("reservedFor") or []
            reserved = [r for r in before if r.get("uid") != pod_uid]
            drop = deallocate and not reserved and status.get("allocation") is not None
            if len(reserved) == len(before) and not drop:
                return None
            new_status = copy.deepcopy(status)
            if reserved:
                new_status["reservedFor"] = reserved
            else:
                new_status.pop("reservedFor", None)
            if drop:
                # The devices' status belongs to the allocation (the API server refuses
                # entries for devices not allocated), as upstream's deallocation clears it.
                new_status.pop("allocation", None)
                new_status.pop("devices", None)
            return new_status

        return await self._rewrite_status(key, "unreserve", edit, cached=cached)

    async def release(self, key: str, pod_uid: str | None) -> JSON | None:
        """Drop ``pod_uid``'s reservation (None: none) and the allocation in one
        strategic-merge patch of ``/status`` that carries no resourceVersion, so that
        nobody else's write to the claim meanwhile makes it a conflict (kube-controller-
        manager dropping the same reservation, the garbage collector marking the claim
        deleted). Safe without one: the API server refuses a status whose ``reservedFor``
        is left without an allocation, so the allocation goes only if nothing else reserves
        the claim when the patch is applied, and an allocation is never replaced, only
        dropped. Returns the claim as written; None when it is gone; raises
        :class:`StillReservedError` when another consumer still reserves it."""
        namespace, name = _split(key)
        status: JSON = {"allocation": None, "devices": None}
        if pod_uid is not None:
            status["reservedFor"] = [{"$patch": "delete", "uid": pod_uid}]
        try:
            written = await RETRY.call(
                lambda: self.api.patch(
                    RESOURCE_CLAIMS,
                    name,
                    {"status": status},
                    namespace=namespace,
                    subresource="status",
                    patch_type="strategic",
                )
            )
        except NotFoundError:
            self.overlay.forget(key)
            return None
        except ApiError as exc:
            if exc.status == 422:
                raise StillReservedError(f"claim {key} is still reserved: {exc}") from exc
            raise
        self.overlay.forget(key)
        self.overlay.assume(written)
        return written

    async def deallocate(self, key: str, *, cached: bool = False) -> JSON | None:
        """Clear the allocation of an unreserved claim this controller allocated."""

        def edit(status: JSON) -> JSON | None:
            if status.get("reservedFor") or status.get("allocation") is None:
                return None
            return {
                k: copy.deepcopy(v) for k, v in status.items() if k not in ("allocation", "devices")
            }

        return await self._rewrite_status(key, "deallocate", edit, cached=cached)

    async def remove_finalizer(self, key: str, *, cached: bool = False) -> JSON | None:
        """Remove our finalizer from a claim that has no allocation (never from one that has);
        ``cached``: see :meth:`_base`."""
        namespace, name = _split(key)
        from_cache = False
        async for attempt in self._attempts("finalizer-removal"):
            try:
                claim, from_cache = await self._base(key, cached, from_cache)
            except NotFoundError:
                return None
            if not has_finalizer(claim, self.finalizer):
                return claim
            if (claim.get("status") or {}).get("allocation") is not None:
                return claim  # still allocated: the finalizer must stay
            m = meta(claim)
            body = {
                "metadata": {
                    "resourceVersion": m.get("resourceVersion"),
                    "finalizers": [f for f in m.get("finalizers") or [] if f != self.finalizer],
                }
            }
            try:
                async with attempt:
                    written = await self.api.patch(RESOURCE_CLAIMS, name, body, namespace=namespace)
                    if meta(written).get("deletionTimestamp") and not meta(written).get(
                        "finalizers"
                    ):
                        # The last finalizer of a claim marked for deletion: the server removed
                        # it with this write, and its watch event may have come already, so
                        # nothing would ever clear what was assumed.
                        self.overlay.forget(key)
                        return written
                    # What we wrote is the newest state: dropping it instead would show the
                    # informer's copy, which may still be allocated and reserved (a repaired
                    # pod would then be placed on an allocation that no longer exists).
                    self.overlay.assume(written)
                    return written
            except NotFoundError:
                return None
        raise CommitAbortedError(f"claim {key}: could not remove finalizer", conflict=True)

    async def let_go(self, key: str) -> JSON | None:
        """Remove our finalizer from a claim marked for deletion that no live pod reserves,
        allocated or not: the API server deletes the claim with this write (one write where
        deallocating first takes two), and its devices are free when the deletion's watch
        event arrives. A strategic-merge ``$deleteFromPrimitiveList`` without a
        resourceVersion: safe without one because a claim marked for deletion takes no new
        reservation (the API server refuses: upstream's ``validateResourceClaimStatusUpdate``),
        so what the caller saw unreserved stays unreserved, and nobody else's write meanwhile
        (kube-controller-manager dropping the same reservations) is a conflict. The chart's
        claim-protection policy allows it to an allocator only. Returns the claim as written;
        None when it is gone."""
        namespace, name = _split(key)
        body = {"metadata": {"$deleteFromPrimitiveList/finalizers": [self.finalizer]}}
        try:
            written = await RETRY.call(
                lambda: self.api.patch(
                    RESOURCE_CLAIMS, name, body, namespace=namespace, patch_type="strategic"
                )
            )
        except NotFoundError:
            self.overlay.forget(key)
            return None
        self.overlay.forget(key)
        if meta(written).get("finalizers"):
            self.overlay.assume(written)  # another finalizer holds it: this is its newest state
        return written

    async def delete_claim(self, key: str) -> None:
        """Delete one of our claims (bridge claims): DELETE first, so the claim is marked for
        deletion while our finalizer still holds it, then drop its reservations and
        allocation, then remove the finalizer; an interruption anywhere leaves a claim that
        still carries our finalizer, so the deallocator finishes the job."""
        namespace, name = _split(key)
        # Should every try fail, go on anyway: what is left keeps our finalizer.
        async for attempt in self._attempts("delete"):
            try:
                async with attempt:
                    claim = await self._get_claim(key)
                    uid = meta(claim).get("uid")
                    await self.api.delete(RESOURCE_CLAIMS, name, namespace, uid=uid)
            except NotFoundError:
                self.overlay.forget(key)
                return
        if await self.unreserve_all(key) is not None:
            await self.remove_finalizer(key)
        self.overlay.forget(key)

    async def unreserve_all(self, key: str) -> JSON | None:
        """Drop every reservation and the allocation of one of our claims."""

        def edit(status: JSON) -> JSON | None:
            if not status.get("reservedFor") and status.get("allocation") is None:
                return None
            return {
                k: copy.deepcopy(v)
                for k, v in status.items()
                if k not in ("reservedFor", "allocation", "devices")
            }

        return await self._rewrite_status(key, "deallocate", edit)


def pod_claim_keys(pod: Mapping[str, Any]) -> Iterable[str]:
    """Keys of the claims a pod references that exist by name (template claims resolved
    through ``status.resourceClaimStatuses``; the bridge claim through
    ``status.extendedResourceClaimStatus``)."""
    m = meta(pod)
    namespace = str(m.get("namespace") or "default")
    status = pod.get("status") or {}
    generated = {
        s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
        if name:
            yield f"{namespace}/{name}"
    ext = status.get("extendedResourceClaimStatus") or {}
    if ext.get("resourceClaimName"):
        yield f"{namespace}/{ext['resourceClaimName']}"

"""The scheduling loop: pods with ``spec.schedulerName: <ours>`` in, placements written out.

One decision at a time, as kube-scheduler's scheduling cycle; writes run concurrently (at most
``max_concurrent_writes`` placements at once), as its binding cycle. For each pod:

1. **resolve its claims** (``spec.resourceClaims``; template claims through
   ``pod.status.resourceClaimStatuses``). A claim that does not exist yet parks the pod, not
   counted as an attempt (kube-scheduler's PreEnqueue), until it appears; a named claim that
   does not exist, or a generated one not owned by the pod, is reported on the pod;
2. **repair** what an earlier attempt left (:mod:`controller.repair`): the pod is fenced
   first (a write conditional on the resourceVersion the cache shows), so that the earlier
   attempt's binding, should it still be in flight, can no longer land;
3. **decide** with the decision engine, which the feed (:mod:`controller.feed`) keeps equal to
   the caches plus every placement of this controller still in flight, within the decision
   deadline (``--decision-timeout``, kube-scheduler's DRA filter timeout: a decision that
   passes it is abandoned, reported as ``SchedulerError`` and retried with backoff). A pod equal
   to one found unschedulable while nothing changed gets that answer without a decision
   (:mod:`controller.equivalence`);
4. **commit** (:mod:`controller.commit`; volumes through :mod:`controller.volumes`; the binding is
   conditional on the pod's resourceVersion the decision was made on) or **report**
   (:class:`~controller.events.Recorder`: ``PodScheduled=False`` + an Event, in a background lane),
   then park the pod in the queue with a :class:`~controller.queue.Hint` until a change that may
   help it, as kube-scheduler's queueing hints decide: one of its claims created or changed;
   devices freed that a class it asks for selects (a claim deallocated, or what a deleted claim
   kept for its running pod released: :mod:`controller.retention`); a pod leaving a node, when more
   than devices kept it out; a pod placed or relabelled on a node, when its pod affinity or
   topology spread kept it out; a node, slice, class, namespace or volume object changed. Invalid
   input waits for the pod, its claims, or a node, slice, class or volume object to change;
   everything is retried at its flush time regardless. A commit that fails because its volumes
   could not be bound (provisioning failed, the wait timed out) is reported on the pod the same way
   (reason ``SchedulerError``, as kube-scheduler reports a failed PreBind) and retried with
   backoff.

A placement counts from the moment it is decided (the feed *assumes* it in the engine), so
decisions made while earlier writes are in flight never hand out the same device twice; a
failed commit is *forgotten*. The claims of a placement are also shown as pending in the claim
overlay, for the commit and for other pods sharing a claim. Pods being committed, and pods
bound until the cache shows the binding, are never tried again meanwhile. Commit and reporting
tasks run outside the process's task guard (they are per-pod work, not services); their
failures are logged and the pod is retried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from controller.api import JSON, Api, meta, object_key, pod_is_finished, pod_node
from controller.binding import BindingFailedError, BindingTimeoutError
from controller.cache import ClusterCache
from controller.commit import (
    BridgePlan,
    ClaimPlan,
    CommitAbortedError,
    Committer,
    Plan,
    PodRef,
    pod_claim_keys,
    reserved_uids,
)
from controller.equivalence import UnschedulableMemo, pod_signature
from controller.events import REASON_SCHEDULER_ERROR, REASON_UNSCHEDULABLE, Recorder
from controller.feed import EngineFeed
from controller.metrics import Metrics
from controller.preempt import (
    NOT_ELIGIBLE_RELEASING,
    NOT_ELIGIBLE_TERMINATING,
    Evictor,
    live_pod_uids,
    nominated_node,
    releasing_claims,
    terminating_victims,
)
from controller.queue import ANY as ANY_CHANGE
from controller.queue import ClusterEvent, EventKind, Hint, Outcome, SchedulingQueue
from controller.releases import Releases
from controller.repair import Repairer
from controller.retention import EVENT_CLAIM_DELETED_IN_USE, Retention
from controller.settings import Settings
from controller.volumes import VolumeBindingError
from driver.api.claims import ResourceClaim
from driver.api.errors import ApiError, BiaxialError, DeadlineExceededError, clip
from driver.cel import cost
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.dryrun import NOT_HELPFUL_TAIL
from driver.scheduling.outcome import (
    REASON_CLAIM_NODE,
    REASON_CLAIMS,
    REASON_FREE_GPUS,
    REASON_GPU_CORES,
    REASON_GPU_MEMORY,
    REASON_NO_GPUS,
    NoPreemption,
    Placement,
    PodError,
    Preemption,
    Unschedulable,
)
from driver.scheduling.podaffinity import REASON_AFFINITY
from driver.scheduling.preemption import pod_priority
from driver.scheduling.topologyspread import REASON_SPREAD
from kubeapi.tasks import TaskGuard

log = logging.getLogger(f"biaxial.{__name__}")

REASON_WAITING: Final = "waiting-for-claims"
REASON_RELEASING: Final = "waiting-for-release"  # short of devices that are being released
REASON_INVALID: Final = "invalid"
REASON_TIMEOUT: Final = "timeout"
#: The per-node reasons about devices: a pod that failed only on these is helped by freed
#: devices (and its claims' changes), never by a pod leaving a node.
DEVICE_REASONS: Final = frozenset(
    {
        REASON_NO_GPUS,
        REASON_GPU_MEMORY,
        REASON_GPU_CORES,
        REASON_FREE_GPUS,
        REASON_CLAIMS,
        REASON_CLAIM_NODE,
    }
)


#: The per-node reasons a pod placed on a node may lift: required pod affinity (a pod to be near
#: appears) and topology spread (the least loaded domain gains a pod).
POD_ADDED_REASONS: Final = frozenset({REASON_AFFINITY, REASON_SPREAD})


def _device_set(claim: Mapping[str, Any] | None) -> frozenset[tuple[str, str, str, str]]:
    """The allocated devices of a claim, comparable across API round trips."""
    if claim is None:
        return frozenset()
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return frozenset(
        (
            str(r.get("driver")),
            str(r.get("pool")),
            str(r.get("device")),
            str(r.get("shareID") or ""),
        )
        for r in (allocation.get("devices") or {}).get("results") or ()
    )


def _claim_status_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    if old is None or new is None:
        return False
    return (old.get("status") or {}) != (new.get("status") or {})


def _shown(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The reason and message of the pod's ``PodScheduled=False`` condition, if it has one."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("reason") or ""), str(condition.get("message") or "")
    return None


#: Statuses that refuse a request for what it is (400 BadRequest, 403 Forbidden, 405, 413
#: RequestEntityTooLarge, 415, 422 Invalid): trying the same write again cannot succeed.
_REFUSED_FOR_GOOD: Final = frozenset({400, 403, 405, 413, 415, 422})
#: How much of the API server's message a pod's condition quotes (it may echo user input).
MESSAGE_QUOTE: Final = 256


def refused_for_good(exc: BaseException) -> TypeGuard[ApiError]:
    """Whether ``exc`` is the API server refusing a write permanently (not a conflict, a
    missing object or a server error, which a later attempt may get past)."""
    return isinstance(exc, ApiError) and exc.status in _REFUSED_FOR_GOOD


#: A pod whose placement was refused for good waits for its own change (or the flush).
REFUSED_HINT: Final = Hint(
    cluster=False, claims=frozenset(), device_classes=frozenset(), pod_gone=False, pod_added=False
)


def refusal_message(exc: ApiError) -> str:
    """What a pod's condition says about a write the API server refused for good."""
    return (
        f"the API server refused this pod's placement ({exc.status} {exc.reason or 'error'}); "
        "retried when the pod changes or at the periodic retry of unschedulable pods: "
        f"{clip(str(exc), MESSAGE_QUOTE)}"
    )


def _version(pod: Mapping[str, Any]) -> str:
    """The pod's resourceVersion as the cache shows it (a report's precondition)."""
    return str((pod.get("metadata") or {}).get("resourceVersion") or "")


def _extended_resources(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for an extended resource (``vendor/name``): the KEP-5004 bridge
    may serve it from any DeviceClass that names it."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]
    blocks = [c.get("resources") or {} for c in containers]
    blocks.append(spec.get("resources") or {})
    return any(
        "/" in name
        for block in blocks
        for part in ("requests", "limits")
        for name in block.get(part) or {}
    )


def wanted_classes(
    pod: Mapping[str, Any], claims: Sequence[ResourceClaim]
) -> frozenset[str] | None:
    """The DeviceClasses whose freed devices may help the pod: those its unallocated claims'
    requests name (every alternative); None (any) when it asks for extended resources."""
    if _extended_resources(pod):
        return None
    names: set[str] = set()
    for claim in claims:
        if claim.allocation is not None:
            continue
        for request in claim.requests:
            alternatives = (
                (request.exactly,) if request.exactly is not None else request.first_available
            )
            names.update(alt.device_class_name for alt in alternatives)
    return frozenset(names)


def _relevant_pod_change(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether a pending pod's update can change its scheduling (as kube-scheduler's queueing
    hints: our own condition and event writes must not re-try it at once)."""
    if old is None:
        return True
    if old.get("spec") != new.get("spec"):
        return True
    if (meta(old).get("annotations") or {}) != (meta(new).get("annotations") or {}):
        return True
    if meta(old).get("labels") != meta(new).get("labels"):
        return True
    old_status, new_status = old.get("status") or {}, new.get("status") or {}
    return any(
        old_status.get(field) != new_status.get(field)
        for field in ("resourceClaimStatuses", "extendedResourceClaimStatus")
    )


def _priority(pod: Mapping[str, Any]) -> int:
    """The pod's ``spec.priority`` for the queue (a malformed one orders as 0; the decision
    reports it on the pod)."""
    try:
        return pod_priority(pod)
    except BiaxialError:
        return 0


@dataclass(frozen=True, slots=True)
class Resolved:
    """A pod's claims, by key, in ``spec.resourceClaims`` order."""

    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Waiting:
    """The pod cannot be tried yet; ``report`` says whether to tell the user, ``claims`` which
    claims' creation or change may let it go on."""

    message: str
    report: bool
    claims: frozenset[str] = frozenset()


class Scheduler:
    """See the module docstring."""

    def __init__(
        self,
        settings: Settings,
        api: Api,
        cache: ClusterCache,
        metrics: Metrics,
        *,
        queue: SchedulingQueue,
        committer: Committer,
        recorder: Recorder,
        evictor: Evictor,
        memo: UnschedulableMemo,
        jobs: TaskGuard,
        write_slots: asyncio.Semaphore,
    ) -> None:
        """The collaborators come built (:func:`controller.wiring.build`); ``jobs`` runs the
        placement writes and reports in flight, ``write_slots`` bounds the writes at once
        (the committer takes them too). The feed, the repairer and the retention are built
        here, after this scheduler subscribes to the cache: each subscribes in turn, and the
        order of subscription is the order in which they see an event (the loop's handler
        first: it asks the feed about a pod before the feed forgets it)."""
        self.settings = settings
        self.api = api
        self.cache = cache
        self.metrics = metrics
        # The counter child of every placement, looked up once (labels() takes a lock and
        # a lookup each time: a few us a pod).
        self._scheduled = metrics.decisions.labels(result="scheduled")
        self.queue = queue
        self.committer = committer
        self.recorder = recorder
        self.evictor = evictor
        self.memo = memo
        self._jobs = jobs
        self._writes = write_slots
        self._nominated_at: dict[str, float] = {}  # pod uid -> when this controller nominated it
        self.releases = Releases(self._release_overdue)
        cache.subscribe(self._on_event)
        self.feed = EngineFeed(
            cache,
            settings.policies,
            metrics,
            driver_name=settings.driver_name,
            on_cluster_change=self._cluster_changed,
            spreading=settings.spreading,
        )
        self.repairer = Repairer(api, cache, committer, metrics, finalizer=settings.finalizer)
        self.retention = Retention(
            cache,
            on_release=self._retained_released,
            on_retain=lambda pod, message: self._spawn(
                self.recorder.event(pod, "Warning", EVENT_CLAIM_DELETED_IN_USE, message)
            ),
        )

    # ------------------------------------------------------------------ events

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") == self.settings.scheduler_name

    def _needs_scheduling(self, pod: Mapping[str, Any]) -> bool:
        """Ours, unbound, alive, and not held back by ``spec.schedulingGates`` (as
        kube-scheduler, a gated pod is not tried until its gates are removed)."""
        spec = pod.get("spec") or {}
        return (
            self._ours(pod)
            and not pod_node(pod)
            and not spec.get("schedulingGates")
            and not meta(pod).get("deletionTimestamp")
            and not pod_is_finished(pod)
        )

    def _on_event(self, kind: str, _etype: str, old: JSON | None, new: JSON | None) -> None:
        # Nodes, slices and classes: the feed calls back (a CLUSTER event) when one changed in
        # what scheduling reads.
        if kind == "Pod":
            self._on_pod(old, new)
        elif kind == "ResourceClaim":
            self._on_claim(old, new)

    def _retained_released(self) -> None:
        self.queue.move(ClusterEvent(EventKind.DEVICES_FREED))  # which classes: not known

    def _release_overdue(self, classes: frozenset[str] | None) -> None:
        # The pods waiting for it are tried again, and reported as usual when they fail.
        self.queue.move(ClusterEvent(EventKind.DEVICES_FREED, classes=classes))

    def _cluster_changed(self) -> None:
        self.queue.move(ClusterEvent(EventKind.CLUSTER))

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        key = object_key(obj)
        uid = str(meta(obj).get("uid") or "")
        if new is not None and self._needs_scheduling(new):
            if not self.feed.assumed(uid) and _relevant_pod_change(old, new):
                self.queue.add(key, _priority(new))
            return
        self.queue.forget(key)
        if new is None or pod_is_finished(new):
            self.recorder.forget(uid)
            if pod_node(obj):
                self._expect_releases(obj, uid)
            if pod_node(obj) or self.feed.assumed(uid):
                self.queue.move(ClusterEvent(EventKind.POD_GONE))  # its node has room again
        elif pod_node(new) and (
            old is None or not pod_node(old) or meta(old).get("labels") != meta(new).get("labels")
        ):
            # A pod now counts on a node (any scheduler's), or was relabelled there: a parked
            # pod's affinity or spread may be met now, and a relabelled pod may no longer repel
            # (kube-scheduler's AssignedPodAdd / AssignedPodUpdate for InterPodAffinity and
            # PodTopologySpread).
            if old is not None and pod_node(old):
                self.queue.move(ClusterEvent(EventKind.POD_GONE))
            self.queue.move(ClusterEvent(EventKind.POD_ADDED))

    def _expect_releases(self, pod: Mapping[str, Any], uid: str) -> None:
        """The bound pod ``pod`` went: its allocated claims that no other pod reserves are on
        their way out (:mod:`controller.releases`)."""
        for key in pod_claim_keys(pod):
            claim = self.cache.overlay.latest_written(key)
            if claim is None or (claim.get("status") or {}).get("allocation") is None:
                continue
            if set(reserved_uids(claim)) - {uid}:
                continue  # shared with a pod that stays
            self.releases.expect(key, self._classes(_device_set(claim)))

    def _on_claim(self, old: JSON | None, new: JSON | None) -> None:
        """kube-scheduler's DynamicResources hints: a claim created, or one whose status
        changed, helps the pods that use it; devices freed help the pods that may use them."""
        obj = new if new is not None else old
        assert obj is not None
        key = object_key(obj)
        if new is None or (new.get("status") or {}).get("allocation") is None:
            self.releases.landed(key)
        if not self.queue.listening:
            return
        if old is None or _claim_status_changed(old, new):
            self.queue.move(ClusterEvent(EventKind.CLAIM, claim=key))
        freed = _device_set(old)
        if freed:  # (most events' old claim holds nothing: the new one's set is not needed)
            freed -= _device_set(new)
        if freed:
            self.queue.move(ClusterEvent(EventKind.DEVICES_FREED, classes=self._classes(freed)))

    def _classes(self, devices: frozenset[tuple[str, str, str, str]]) -> frozenset[str] | None:
        """The DeviceClasses that select any of ``devices``; None when one is not known."""
        found: set[str] = set()
        for driver, pool, device, _share in devices:
            classes = self.feed.device_classes(driver, pool, device)
            if classes is None:
                return None
            found.update(classes)
        return frozenset(found)

    # ------------------------------------------------------------------ the loop

    def warm(self) -> None:
        """Build the decision engine from the caches now (rather than at the first pod)."""
        self.feed.engine()

    async def run(self) -> None:
        """Schedule pods until cancelled."""
        for pod in list(self.cache.pods.store.values()):
            if self._needs_scheduling(pod):
                self.queue.add(object_key(pod), _priority(pod))
        while True:  # (the queue depths are sampled each second: controller.app)
            key = await self.queue.pop()
            try:
                await self.schedule_one(key)
            except ApiError as exc:
                log.warning("pod %s: API error while scheduling: %s", key, exc, extra={"pod": key})
                self.queue.done(key, Outcome.ERROR)
                self.metrics.decisions.labels(result="error").inc()
            except Exception as exc:  # one pod hitting a bug must not stop the others
                log.exception("pod %s: unexpected error while scheduling", key, extra={"pod": key})
                self._report_internal_error(key, exc)
            # Let the writes of the placements just decided (and the informers) run before
            # the next decision: a burst of pods must not hold every write back until the
            # whole burst is decided (kube-scheduler's binding cycles run beside it too).
            await asyncio.sleep(0)

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait for the writes in flight; True when all finished within ``timeout_s``."""
        return await self._jobs.drain(timeout_s)

    async def stop(self, grace_s: float) -> None:
        """Let writes in flight finish for up to ``grace_s``, then cancel the rest (which is
        as safe as a crash: see :mod:`controller.commit`)."""
        if not await self.drain(grace_s):
            log.warning(
                "cancelling %d placement write(s) still in flight", self._jobs.jobs_in_flight
            )
            await self._jobs.stop()

    def resolve(self, pod: Mapping[str, Any]) -> Resolved | Waiting:
        """The keys of the pod's claims, or why it must wait."""
        m = meta(pod)
        namespace = str(m.get("namespace") or "default")
        uid = str(m.get("uid") or "")
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        }
        keys: list[str] = []
        for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
            ref_name = ref.get("name")
            if ref.get("resourceClaimName"):
                key = f"{namespace}/{ref['resourceClaimName']}"
                claim = self.cache.overlay.get(key)
                if claim is None:
                    return Waiting(
                        f'pod uses resourceclaim "{ref["resourceClaimName"]}", which does not '
                        "exist",
                        report=True,
                        claims=frozenset({key}),
                    )
            elif ref.get("resourceClaimTemplateName"):
                if ref_name not in statuses:
                    return Waiting(f"waiting for the claim of {ref_name!r} to be created", False)
                generated = statuses[ref_name]
                if not generated:
                    continue  # the resourceclaim controller decided no claim is needed
                key = f"{namespace}/{generated}"
                claim = self.cache.overlay.get(key)
                if claim is None:
                    return Waiting(
                        f"waiting for resourceclaim {generated!r} to appear",
                        report=False,
                        claims=frozenset({key}),
                    )
                owners = meta(claim).get("ownerReferences") or ()
                if not any(o.get("uid") == uid and o.get("controller") for o in owners):
                    return Waiting(
                        f'resourceclaim "{generated}" was not created for this pod',
                        report=True,
                        claims=frozenset({key}),
                    )
            else:
                return Waiting(f"pod claim {ref_name!r} names neither a claim nor a template", True)
            if meta(claim).get("deletionTimestamp"):
                return Waiting(
                    f'resourceclaim "{meta(claim).get("name")}" is being deleted',
                    report=True,
                    claims=frozenset({key}),
                )
            if self.cache.overlay.allocating(key):
                # Another pod's placement allocates this claim and its write has not landed:
                # wait for it and try again on the claim's update (upstream's PreFilter
                # answers the same). Deciding now would build on an allocation that may yet
                # be rolled back. Not reported: it lasts one write.
                return Waiting(
                    f"resource claim {key} is in the process of being allocated",
                    report=False,
                    claims=frozenset({key}),
                )
            keys.append(key)
        return Resolved(tuple(keys))

    async def schedule_one(self, key: str) -> None:
        pod = self.cache.pods.get(key)
        if pod is None or not self._needs_scheduling(pod):
            self.queue.done(key, Outcome.FORGET)
            return
        ref = PodRef.of(pod)
        if self.feed.assumed(ref.uid):
            self.queue.done(key, Outcome.FORGET)
            return
        resolved = self.resolve(pod)
        if isinstance(resolved, Waiting):
            self.metrics.unschedulable.labels(reason=REASON_WAITING).inc()
            hint = Hint(
                cluster=False,
                claims=resolved.claims,
                device_classes=frozenset(),
                pod_gone=False,
                pod_added=False,
            )
            self.queue.done(key, Outcome.WAITING, hint)
            if resolved.report:
                self.recorder.unschedulable(
                    ref, resolved.message, shown=_shown(pod), version=_version(pod)
                )
            else:
                log.debug("pod %s: %s", key, resolved.message)
            return
        pod_version = str(meta(pod).get("resourceVersion") or "")
        if self.repairer.stale(ref, resolved.keys):
            fenced = await self.repairer.repair(ref, resolved.keys, pod_version)
            if fenced is None:
                self.queue.done(key, Outcome.ERROR)
                return
            pod_version = fenced  # the fence wrote the pod's condition: forget ours
            self.recorder.forget(ref.uid)
        raw_claims = [self.cache.overlay.get(k) for k in resolved.keys]
        try:
            claims = [
                self.feed.parsed.claim(k, raw)
                for k, raw in zip(resolved.keys, raw_claims, strict=True)
                if raw is not None
            ]
        except BiaxialError as exc:
            self._report_invalid(key, ref, pod, str(exc), frozenset(resolved.keys))
            return
        decision, seconds = self._decide(key, ref, pod, claims, pod_signature(pod, raw_claims))
        if decision is None:
            return
        if isinstance(decision, PodError):
            self._report_invalid(key, ref, pod, decision.message, frozenset(resolved.keys))
            return
        if isinstance(decision, Unschedulable):
            self.metrics.decisions.labels(result="unschedulable").inc()
            for reason in decision.reasons:
                self.metrics.unschedulable.labels(reason=reason).inc()
            wanted = wanted_classes(pod, claims)
            hint = Hint(
                claims=frozenset(resolved.keys),
                device_classes=wanted,
                pod_gone=any(reason not in DEVICE_REASONS for reason in decision.reasons),
                pod_added=any(reason in POD_ADDED_REASONS for reason in decision.reasons),
            )
            if (
                DEVICE_REASONS.issuperset(decision.reasons)
                and ref.uid not in self._nominated_at  # waits for its victims as preemption says
                and self.releases.pending(wanted)
            ):
                # Short only of devices while some are being released: wait for them, not an
                # attempt and not reported (controller.releases); no victim is needed either.
                self.metrics.unschedulable.labels(reason=REASON_RELEASING).inc()
                log.debug("pod %s: waits for devices being released: %s", key, decision.message)
                self.queue.done(key, Outcome.WAITING, hint)
                return
            log.info("pod %s: unschedulable: %s", key, decision.message, extra={"pod": key})
            found = self._preemption(self.feed.engine(), pod, claims)
            if isinstance(found, PodError):
                self._report_invalid(key, ref, pod, found.message, frozenset(resolved.keys))
                return
            if isinstance(found, Preemption):
                # Held from now on against pods of equal or lower priority; the writes run
                # beside the loop and hand the pod back to the queue when done.
                self.feed.nominate(found, pod)
                self._nominated_at[ref.uid] = time.monotonic()
                self._spawn(self._preempt(key, ref, pod, found, decision.message))
                return
            self.queue.done(key, Outcome.UNSCHEDULABLE, hint)
            message = decision.message
            if not found.message.endswith(NOT_HELPFUL_TAIL):
                message = f"{message} {found.message}"  # (why it may not preempt)
            self.recorder.unschedulable(ref, message, shown=_shown(pod), version=_version(pod))
            return
        self._scheduled.inc()
        nominated = self._nominated_at.pop(ref.uid, None)
        if nominated is not None:
            self.metrics.nomination_age_seconds.observe(time.monotonic() - nominated)
        # The placement counts from now on (assumed in the engine); its claims show as
        # pending in the overlay for the commit and for other pods sharing them.
        self.feed.assume(decision, pod)
        # An earlier failure report still waiting in the lane is obsolete now, and writing it
        # would move the pod's resourceVersion under the conditional binding (a 409, a retry).
        self.recorder.forget(ref.uid)
        plan = self._plan(ref, decision, resolved.keys, pod_version, seconds)
        self._spawn(self._commit(key, plan))

    def _preemption(
        self, engine: DecisionEngine, pod: JSON, claims: list[ResourceClaim]
    ) -> Preemption | NoPreemption | PodError:
        """Whether evicting lower-priority pods would let ``pod`` fit, and which."""
        ref = PodRef.of(pod)
        if terminating_victims(pod, self.cache.pods.store.values()):
            self.metrics.preemption_attempts.labels(result="waiting").inc()
            return NoPreemption(pod=ref.key, message=NOT_ELIGIBLE_TERMINATING)
        if self._releasing_on_nominated(pod):
            self.metrics.preemption_attempts.labels(result="waiting").inc()
            return NoPreemption(pod=ref.key, message=NOT_ELIGIBLE_RELEASING)
        budgets = list(self.cache.budgets.store.values())
        found = engine.preempt(pod, claims, budgets)
        result = {Preemption: "preempting", NoPreemption: "not-helpful", PodError: "invalid"}
        self.metrics.preemption_attempts.labels(result=result[type(found)]).inc()
        return found

    def _releasing_on_nominated(self, pod: JSON) -> bool:
        """Whether claims on the pod's nominated node are still allocated for pods that are
        gone (:func:`controller.preempt.releasing_claims`); the claims' release wakes it."""
        name = nominated_node(pod)
        node = self.cache.nodes.get(name) if name else None
        if node is None:
            return False
        live = live_pod_uids(self.cache.pods.store.values())
        found = releasing_claims(
            node, self.cache.overlay.written().values(), live, self.settings.finalizer
        )
        if found:
            log.info(
                "pod %s: waiting for %s to be released on its nominated node %s",
                object_key(pod),
                ", ".join(found),
                name,
                extra={"pod": object_key(pod), "node": name},
            )
        return bool(found)

    async def _preempt(
        self, key: str, ref: PodRef, pod: JSON, preemption: Preemption, message: str
    ) -> None:
        outcome = Outcome.UNSCHEDULABLE
        try:
            current: dict[str, JSON] = {}
            for victim in preemption.victims:
                raw = self.cache.pods.get(f"{victim.namespace}/{victim.name}")
                if raw is not None and meta(raw).get("uid") == victim.uid:
                    current[victim.uid] = raw
            async with self._writes:
                await self.evictor.preempt(ref, preemption, current)
            self.metrics.preemption_victims.observe(len(preemption.victims))
            self.recorder.unschedulable(ref, message, shown=_shown(pod), version=_version(pod))
        except ApiError as exc:
            log.warning(
                "pod %s: preemption on %s not carried out: %s",
                key,
                preemption.node,
                exc,
                extra={"pod": key, "node": preemption.node},
            )
            self._nominated_at.pop(ref.uid, None)
            self.feed.clear_nomination(ref.uid, pod)
            await self.evictor.clear(ref)
            outcome = Outcome.ERROR
        finally:
            self.queue.done(key, outcome)

    def _decide(
        self,
        key: str,
        ref: PodRef,
        pod: Mapping[str, Any],
        claims: list[ResourceClaim],
        signature: str | None,
    ) -> tuple[Placement | Unschedulable | PodError | None, float]:
        """The engine's decision, within the decision deadline, and the seconds it took; the
        answer given to an equal pod when nothing changed since
        (:mod:`controller.equivalence`). None when the deadline passed (the pod is reported and
        backs off)."""
        engine = self.feed.engine()  # brought up to date outside the deadline
        generation = self.feed.generation
        started = time.perf_counter()
        remembered = self.memo.get(signature, generation, ref.key)
        if remembered is not None:
            self.metrics.decisions_reused.inc()
            seconds = time.perf_counter() - started
            self.metrics.decision_seconds.observe(seconds)
            log.debug("pod %s: decided like an equal pod before it", key, extra={"pod": key})
            return remembered, seconds
        timeout = self.settings.decision_timeout_s
        deadline = time.monotonic() + timeout if timeout > 0 else None
        try:
            with cost.limits(deadline=deadline):
                decision = engine.decide(pod, claims, signature=signature)
        except DeadlineExceededError as exc:
            self.metrics.decision_seconds.observe(time.perf_counter() - started)
            self._report_timeout(key, ref, pod, timeout, str(exc))
            return None, 0.0
        seconds = time.perf_counter() - started
        self.metrics.decision_seconds.observe(seconds)
        if isinstance(decision, Unschedulable):
            self.memo.put(signature, generation, decision)
        return decision, seconds

    def _report_timeout(
        self, key: str, ref: PodRef, pod: Mapping[str, Any], timeout: float, cause: str
    ) -> None:
        """kube-scheduler's DRA filter timeout: an error for the pod, retried with backoff."""
        self.metrics.decisions.labels(result=REASON_TIMEOUT).inc()
        self.metrics.unschedulable.labels(reason=REASON_TIMEOUT).inc()
        message = (
            f"scheduling decision abandoned after its {timeout:g} s deadline (the controller's "
            f"--decision-timeout) while evaluating device selectors; retried with backoff: "
            f"{cause}"
        )
        log.warning("pod %s: %s", key, message, extra={"pod": key})
        self.queue.done(key, Outcome.ERROR)
        self.recorder.unschedulable(
            ref, message, shown=_shown(pod), reason=REASON_SCHEDULER_ERROR, version=_version(pod)
        )

    def _report_internal_error(self, key: str, exc: Exception) -> None:
        """A bug hit while deciding for pod ``key``: whatever was left half done is rebuilt
        from the caches, the pod is retried with backoff, and it says so (never stranded
        silently)."""
        self.queue.done(key, Outcome.ERROR)
        self.metrics.decisions.labels(result="error").inc()
        self.feed.reset()
        pod = self.cache.pods.get(key)
        try:
            ref = PodRef.of(pod) if pod is not None else None
        except Exception:  # noqa: BLE001 - a pod too malformed to name cannot be told either
            log.warning("pod %s: malformed, not reported", key, extra={"pod": key})
            ref = None
        if pod is not None and ref is not None:
            if ref.uid not in self.committer.pods_in_flight:
                self.feed.forget(ref.uid)  # a placement that will not be written
            self.recorder.unschedulable(
                ref,
                f"internal error while scheduling ({type(exc).__name__}); retried with backoff",
                shown=_shown(pod),
                reason=REASON_SCHEDULER_ERROR,
                version=_version(pod),
            )

    def _report_invalid(
        self,
        key: str,
        ref: PodRef,
        pod: Mapping[str, Any],
        message: str,
        claims: frozenset[str],
    ) -> None:
        """Bad input: parked until the pod, one of its claims, or a node, slice or class
        changes (freed devices and pods leaving cannot mend it)."""
        self.metrics.decisions.labels(result=REASON_INVALID).inc()
        self.metrics.unschedulable.labels(reason=REASON_INVALID).inc()
        log.info("pod %s: invalid: %s", key, message, extra={"pod": key})
        hint = Hint(claims=claims, device_classes=frozenset(), pod_gone=False, pod_added=False)
        self.queue.done(key, Outcome.UNSCHEDULABLE, hint)
        self.recorder.unschedulable(
            ref, message, shown=_shown(pod), reason=REASON_UNSCHEDULABLE, version=_version(pod)
        )

    def _plan(
        self,
        ref: PodRef,
        decision: Placement,
        keys: tuple[str, ...],
        pod_version: str,
        seconds: float,
    ) -> Plan:
        """The writes for ``decision`` (made in ``seconds``); its claims' allocations show
        as pending meanwhile."""
        allocations = {c.key: a.to_api() for c, a in decision.claims}
        for claim, decided in decision.claims:  # the write's echo is not parsed again
            self.feed.parsed.decided(claim.key, allocations[claim.key], decided)
        claim_plans: list[ClaimPlan] = []
        for key in keys:
            allocation = allocations.get(key)
            claim_plans.append(ClaimPlan(key=key, allocation=allocation))
            if allocation is not None:
                raw = self.cache.overlay.get(key)
                if raw is not None:
                    pending = dict(raw)
                    pending["status"] = {
                        **(raw.get("status") or {}),
                        "allocation": allocation,
                        "reservedFor": [
                            *((raw.get("status") or {}).get("reservedFor") or []),
                            ref.consumer(),
                        ],
                    }
                    self.cache.overlay.set_pending(key, pending)
        bridge: BridgePlan | None = None
        if decision.bridge is not None and decision.bridge_allocation is not None:
            bridge = BridgePlan(
                claim=decision.bridge.claim,
                allocation=decision.bridge_allocation.to_api(),
                request_mappings=decision.bridge.request_mappings,
            )
        return Plan(
            pod=ref,
            node=decision.node,
            claims=tuple(claim_plans),
            bridge=bridge,
            volumes=decision.volumes,
            pod_version=pod_version,
            decided=(
                f"policies node={decision.policies.node} gpu={decision.policies.gpu}, "
                f"{decision.evaluated} node(s) evaluated, decided in {seconds * 1000:.2f} ms"
            ),
        )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._jobs.spawn(coro)

    async def _commit(self, key: str, plan: Plan) -> None:
        outcome = Outcome.ERROR
        hint = ANY_CHANGE
        try:
            # The committer takes a write slot per step (not while it waits before the
            # binding), so at most max_concurrent_writes placements write at once.
            started = time.perf_counter()
            # A failure report sent just before the pod was decided lands first, never on the
            # bound pod; the binding then carries the version that report moved the pod to.
            await self.recorder.settled(plan.pod.uid)
            version = self.recorder.advanced(plan.pod.uid, plan.pod_version)
            if version != plan.pod_version:
                plan = dataclasses.replace(plan, pod_version=version)
            await self.committer.commit(plan)
            self.metrics.commit_seconds.observe(time.perf_counter() - started)
            outcome = Outcome.SCHEDULED
            self.recorder.scheduled(plan.pod, plan.node)
        except (BindingFailedError, BindingTimeoutError) as exc:
            # Rolled back by the committer; told on the pod, tried again after its backoff.
            log.warning("pod %s: %s", key, exc, extra={"pod": key, "node": plan.node})
            self.feed.forget(plan.pod.uid)
            self.recorder.unschedulable(plan.pod, str(exc))
        except (CommitAbortedError, ApiError) as exc:
            log.warning(
                "pod %s: placement on %s not written: %s",
                key,
                plan.node,
                exc,
                extra={"pod": key, "node": plan.node},
            )
            self.feed.forget(plan.pod.uid)
            if isinstance(exc, VolumeBindingError):
                self.metrics.unschedulable.labels(reason="volume-binding").inc()
                self.recorder.unschedulable(plan.pod, str(exc), reason=REASON_SCHEDULER_ERROR)
            elif refused_for_good(exc):
                # The same write would be refused again: say so on the pod and park it until
                # the pod changes (or the periodic flush of parked pods), instead of retrying
                # it every backoff period for ever. Not on its claims' changes: the rollback
                # writes them itself, and would wake it at once.
                outcome = Outcome.UNSCHEDULABLE
                hint = REFUSED_HINT
                self.metrics.unschedulable.labels(reason="write-refused").inc()
                self.recorder.unschedulable(
                    plan.pod, refusal_message(exc), reason=REASON_SCHEDULER_ERROR
                )
        finally:
            self.queue.done(key, outcome, hint)

    # ------------------------------------------------------------------ introspection

    @property
    def busy(self) -> bool:
        return self._jobs.jobs_in_flight > 0

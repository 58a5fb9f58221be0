"""The scheduling loop: pods with ``spec.schedulerName: <ours>`` in, placements written out.

One decision at a time, as kube-scheduler's scheduling cycle; writes run concurrently (at most
``max_concurrent_writes`` placements at once), as its binding cycle. For each pod:

1. **resolve its claims** (``spec.resourceClaims``; template claims through
   ``pod.status.resourceClaimStatuses``). A template claim not created yet parks the pod until
   it appears; a named claim that does not exist, or a generated one not owned by the pod, is
   reported on the pod;
2. **repair** what an earlier attempt left (a crash or a failed rollback): reservations for
   this unbound pod on claims this controller allocated are released and stale bridge claims
   deleted, after a live GET confirms the pod is still unbound;
3. **decide** with the decision core (:class:`driver.decision.DecisionEngine`) on the cache's
   snapshot with every in-flight decision of this controller assumed;
4. **commit** (:mod:`controller.commit`) or **report**: ``PodScheduled=False`` + an Event,
   then park the pod in the queue until a relevant change (a claim freed, a slice, node or
   class changed) or its flush time.

The engine is rebuilt from the caches only when the cluster changed in a way the engine does
not already know (anything but this controller's own writes landing); otherwise decisions
reuse it and :meth:`DecisionEngine.assume` records each placement. Pods being committed, and
pods bound until the cache shows the binding, are never tried again meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from controller.api import JSON, PODS, Api, meta, object_key
from controller.cache import ClusterCache
from controller.commit import (
    BridgePlan,
    ClaimPlan,
    CommitAbortedError,
    Committer,
    Plan,
    PodRef,
    StepHook,
    has_finalizer,
    is_bridge,
)
from controller.events import Recorder
from controller.metrics import Metrics
from controller.queue import Outcome, SchedulingQueue
from controller.settings import Settings
from driver.bridge import is_bridge_claim
from driver.claims import DeviceClass, ResourceClaim
from driver.decision import DecisionEngine, Placement, PodError, Unschedulable
from driver.errors import ApiError, BiaxialError, NotFoundError
from driver.model import ResourceSlice
from driver.nodefit import NodeUsage, PodSchedulingFacts
from driver.nodes import Node
from driver.snapshot import AllocatedState, ClusterSnapshot

log = logging.getLogger(__name__)

REASON_WAITING: Final = "waiting-for-claims"
REASON_INVALID: Final = "invalid"
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
PENDING_BRIDGE_PREFIX: Final = "<pending-bridge>-"


def pod_is_finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


def pod_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


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


def _reap(task: asyncio.Task[None]) -> None:
    """Log what a background write task raised (nothing may disappear silently)."""
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, Exception):
        log.error("background write failed unexpectedly", exc_info=exc)


@dataclass(frozen=True, slots=True)
class Resolved:
    """A pod's claims, by key, in ``spec.resourceClaims`` order."""

    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Waiting:
    """The pod cannot be tried yet; ``report`` says whether to tell the user."""

    message: str
    report: bool


class _Memo:
    """Parsed models of raw objects, keyed by (key, resourceVersion)."""

    def __init__(self) -> None:
        self.claims: dict[str, tuple[JSON, ResourceClaim | BiaxialError]] = {}
        self.nodes: dict[str, tuple[str, Node | None]] = {}

    def claim(self, key: str, raw: JSON) -> ResourceClaim:
        hit = self.claims.get(key)
        if hit is not None and hit[0] is raw:  # the memo holds raw: identity is safe
            value = hit[1]
        else:
            try:
                value = ResourceClaim.from_api(raw)
            except BiaxialError as exc:
                value = exc
            self.claims[key] = (raw, value)
        if isinstance(value, BiaxialError):
            raise value
        return value

    def node(self, raw: JSON) -> Node | None:
        name = str(meta(raw).get("name"))
        rv = str(meta(raw).get("resourceVersion"))
        hit = self.nodes.get(name)
        if hit is not None and hit[0] == rv:
            return hit[1]
        try:
            node: Node | None = Node.from_api(raw)
        except BiaxialError as exc:
            log.warning("node %s is malformed, skipped: %s", name, exc)
            node = None
        self.nodes[name] = (rv, node)
        return node


class Scheduler:
    """See the module docstring."""

    def __init__(
        self,
        settings: Settings,
        api: Api,
        cache: ClusterCache,
        metrics: Metrics,
        *,
        on_step: StepHook | None = None,
    ) -> None:
        self.settings = settings
        self.api = api
        self.cache = cache
        self.metrics = metrics
        self.queue = SchedulingQueue(
            backoff_initial_s=settings.backoff_initial_s,
            backoff_max_s=settings.backoff_max_s,
            flush_s=settings.unschedulable_flush_s,
        )
        self.committer = Committer(
            api,
            cache.overlay,
            finalizer=settings.finalizer,
            on_step=on_step,
            on_conflict=lambda step: metrics.conflicts.labels(step=step).inc(),
        )
        self.recorder = Recorder(api, component=settings.scheduler_name, instance=settings.identity)
        self._memo = _Memo()
        self._engine: DecisionEngine | None = None
        self._dirty = True
        self._base: ClusterSnapshot | None = None
        self._base_version: tuple[int, int] = (-1, -1)
        self._assumed_pods: dict[str, tuple[str, JSON]] = {}  # uid -> (node, pod)
        self._expected: dict[str, frozenset[tuple[str, str, str, str]]] = {}
        self._bridges: dict[str, set[str]] = {}  # pod uid -> bridge claim keys
        self._writes = asyncio.Semaphore(settings.max_concurrent_writes)
        self._tasks: set[asyncio.Task[None]] = set()
        self.rebuilds = 0
        cache.subscribe(self._on_event)

    # ------------------------------------------------------------------ events

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") == self.settings.scheduler_name

    def _needs_scheduling(self, pod: Mapping[str, Any]) -> bool:
        return (
            self._ours(pod)
            and not pod_node(pod)
            and not meta(pod).get("deletionTimestamp")
            and not pod_is_finished(pod)
        )

    def _on_event(self, kind: str, _etype: str, old: JSON | None, new: JSON | None) -> None:
        if kind == "Pod":
            self._on_pod(old, new)
        elif kind == "ResourceClaim":
            self._on_claim(old, new)
        else:  # Node, DeviceClass, ResourceSlice
            self._dirty = True
            self.queue.move_all()

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        key = object_key(obj)
        uid = str(meta(obj).get("uid") or "")
        if new is not None and self._needs_scheduling(new):
            if uid not in self._assumed_pods and _relevant_pod_change(old, new):
                self.queue.add(key)
            return
        self.queue.forget(key)
        assumed = self._assumed_pods.get(uid)
        if (
            assumed is not None
            and new is not None
            and pod_node(new) == assumed[0]
            and not pod_is_finished(new)
            and not meta(new).get("deletionTimestamp")
        ):
            del self._assumed_pods[uid]  # our binding observed: the engine knows it
            return
        if new is None or pod_is_finished(new):
            self.recorder.forget(uid)
            self._assumed_pods.pop(uid, None)
            self._bridges.pop(uid, None)
        was_bound = old is not None and pod_node(old) and not pod_is_finished(old)
        is_bound = new is not None and pod_node(new) and not pod_is_finished(new)
        if was_bound != is_bound or (is_bound and old is None):
            self._dirty = True  # node usage changed behind the engine's back
            if not is_bound:
                self.queue.move_all()

    def _on_claim(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        key = object_key(obj)
        ours = False
        if is_bridge(obj):
            for owner in meta(obj).get("ownerReferences") or ():
                if owner.get("controller") and owner.get("kind") == "Pod":
                    uid = str(owner.get("uid"))
                    ours = uid in self._assumed_pods
                    if new is None:
                        self._bridges.get(uid, set()).discard(key)
                    else:
                        self._bridges.setdefault(uid, set()).add(key)
        before, after = _device_set(old), _device_set(new)
        if new is None:
            self._expected.pop(key, None)
        if old is None and new is not None:
            self.queue.move_all()  # a template claim may have appeared
        if before == after:
            return
        if after and (ours or self._expected.get(key) == after):
            # Our own write landing: the engine assumed this placement already.
            self._expected.pop(key, None)
            return
        self._dirty = True
        if before - after:
            self.queue.move_all()  # devices freed

    # ------------------------------------------------------------------ engine

    def _engine_now(self) -> DecisionEngine:
        versions = (self.cache.slices.version, self.cache.classes.version)
        if self._engine is not None and not self._dirty:
            return self._engine
        started = time.perf_counter()
        classes = []
        for raw in self.cache.classes.store.values():
            try:
                classes.append(DeviceClass.from_api(raw))
            except BiaxialError as exc:
                log.warning("DeviceClass %s is malformed, skipped: %s", object_key(raw), exc)
        if self._base is None or versions != self._base_version:
            slices = []
            for raw in self.cache.slices.store.values():
                try:
                    slices.append(ResourceSlice.from_api(raw))
                except BiaxialError as exc:
                    log.warning("ResourceSlice %s is malformed, skipped: %s", object_key(raw), exc)
            match_cache = self._base.match_cache if self._base is not None else None
            self._base = ClusterSnapshot.build(slices, classes, (), match_cache=match_cache)
            self._base_version = versions
        claims = []
        for key, raw in self.cache.overlay.view().items():
            if not (raw.get("status") or {}).get("allocation"):
                continue
            try:
                claims.append(self._memo.claim(key, raw))
            except BiaxialError as exc:
                log.warning("ResourceClaim %s is malformed, skipped: %s", key, exc)
        snapshot = self._base.with_state(AllocatedState.from_claims(claims))
        nodes = [n for raw in self.cache.nodes.store.values() if (n := self._memo.node(raw))]
        self._engine = DecisionEngine(
            snapshot,
            nodes,
            defaults=self.settings.policies,
            pods_on_nodes=self._usage(),
        )
        self._dirty = False
        self.rebuilds += 1
        self.metrics.engine_rebuild_seconds.observe(time.perf_counter() - started)
        log.debug(
            "decision engine rebuilt: %d nodes, %d allocated claims in %.1f ms",
            len(nodes),
            len(claims),
            (time.perf_counter() - started) * 1000,
        )
        return self._engine

    def _usage(self) -> dict[str, NodeUsage]:
        usage: dict[str, NodeUsage] = {}
        seen: set[str] = set()
        pods: Iterable[JSON] = list(self.cache.pods.store.values())
        for pod in pods:
            node = pod_node(pod)
            if not node or pod_is_finished(pod):
                continue
            seen.add(str(meta(pod).get("uid")))
            self._add_usage(usage, node, pod)
        for uid, (node, pod) in self._assumed_pods.items():
            if uid not in seen:
                self._add_usage(usage, node, pod)
        return usage

    @staticmethod
    def _add_usage(usage: dict[str, NodeUsage], node: str, pod: JSON) -> None:
        try:
            facts = PodSchedulingFacts.from_pod(pod)
        except BiaxialError:
            return
        usage[node] = usage.get(node, NodeUsage()).plus(facts.requests)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Schedule pods until cancelled."""
        for pod in list(self.cache.pods.store.values()):
            if self._needs_scheduling(pod):
                self.queue.add(object_key(pod))
        while True:
            self.metrics.set_queue_depths(self.queue.depths)
            key = await self.queue.pop()
            try:
                await self.schedule_one(key)
            except ApiError as exc:
                log.warning("pod %s: API error while scheduling: %s", key, exc, extra={"pod": key})
                self.queue.done(key, Outcome.ERROR)
                self.metrics.decisions.labels(result="error").inc()
            except Exception:  # one pod hitting a bug must not stop the others (logged)
                log.exception("pod %s: unexpected error while scheduling", key, extra={"pod": key})
                self.queue.done(key, Outcome.ERROR)
                self.metrics.decisions.labels(result="error").inc()
                self._dirty = True  # whatever was half-assumed is rebuilt from the caches

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait for the writes in flight; True when all finished within ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._tasks:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            await asyncio.wait(list(self._tasks), timeout=remaining)
        return True

    async def stop(self, grace_s: float) -> None:
        """Let writes in flight finish for up to ``grace_s``, then cancel the rest (which is
        as safe as a crash: see :mod:`controller.commit`)."""
        if not await self.drain(grace_s):
            log.warning("cancelling %d placement write(s) still in flight", len(self._tasks))
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

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
                    return Waiting(f"waiting for resourceclaim {generated!r} to appear", False)
                owners = meta(claim).get("ownerReferences") or ()
                if not any(o.get("uid") == uid and o.get("controller") for o in owners):
                    return Waiting(
                        f'resourceclaim "{generated}" was not created for this pod',
                        report=True,
                    )
            else:
                return Waiting(f"pod claim {ref_name!r} names neither a claim nor a template", True)
            if meta(claim).get("deletionTimestamp"):
                return Waiting(f'resourceclaim "{meta(claim).get("name")}" is being deleted', True)
            keys.append(key)
        return Resolved(tuple(keys))

    async def schedule_one(self, key: str) -> None:
        pod = self.cache.pods.get(key)
        if pod is None or not self._needs_scheduling(pod):
            self.queue.done(key, Outcome.FORGET)
            return
        ref = PodRef.of(pod)
        if ref.uid in self._assumed_pods:
            self.queue.done(key, Outcome.FORGET)
            return
        resolved = self.resolve(pod)
        if isinstance(resolved, Waiting):
            self.metrics.unschedulable.labels(reason=REASON_WAITING).inc()
            self.queue.done(key, Outcome.UNSCHEDULABLE)
            if resolved.report:
                self._spawn(self.recorder.unschedulable(ref, resolved.message))
            else:
                log.debug("pod %s: %s", key, resolved.message)
            return
        if self._stale(ref, resolved.keys) and not await self._repair(ref, resolved.keys):
            self.queue.done(key, Outcome.ERROR)
            return
        try:
            claims = [
                self._memo.claim(k, raw)
                for k in resolved.keys
                if (raw := self.cache.overlay.get(k)) is not None
            ]
        except BiaxialError as exc:
            self._report_invalid(key, ref, str(exc))
            return
        engine = self._engine_now()
        started = time.perf_counter()
        decision = engine.decide(pod, claims)
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        if isinstance(decision, PodError):
            self._report_invalid(key, ref, decision.message)
            return
        if isinstance(decision, Unschedulable):
            self.metrics.decisions.labels(result="unschedulable").inc()
            for reason in decision.reasons:
                self.metrics.unschedulable.labels(reason=reason).inc()
            log.info("pod %s: unschedulable: %s", key, decision.message, extra={"pod": key})
            self.queue.done(key, Outcome.UNSCHEDULABLE)
            self._spawn(self.recorder.unschedulable(ref, decision.message))
            return
        self.metrics.decisions.labels(result="scheduled").inc()
        plan = self._plan(ref, decision, resolved.keys)
        engine.assume(decision, pod)
        self._assumed_pods[ref.uid] = (decision.node, pod)
        self._spawn(self._commit(key, plan), track=True)

    def _report_invalid(self, key: str, ref: PodRef, message: str) -> None:
        self.metrics.decisions.labels(result=REASON_INVALID).inc()
        self.metrics.unschedulable.labels(reason=REASON_INVALID).inc()
        log.info("pod %s: invalid: %s", key, message, extra={"pod": key})
        self.queue.done(key, Outcome.UNSCHEDULABLE)
        self._spawn(self.recorder.unschedulable(ref, message))

    def _plan(self, ref: PodRef, decision: Placement, keys: tuple[str, ...]) -> Plan:
        allocations = {c.key: a.to_api() for c, a in decision.claims}
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
                    self._expected[key] = _device_set(pending)
        bridge: BridgePlan | None = None
        if decision.bridge is not None and decision.bridge_allocation is not None:
            allocation = decision.bridge_allocation.to_api()
            pending_key = f"{ref.namespace}/{PENDING_BRIDGE_PREFIX}{ref.uid}"
            bridge = BridgePlan(
                claim=decision.bridge.claim,
                allocation=allocation,
                request_mappings=decision.bridge.request_mappings,
                placeholder_key=pending_key,
            )
            placeholder = {
                **decision.bridge.claim,
                "metadata": {
                    **(decision.bridge.claim.get("metadata") or {}),
                    "name": pending_key.partition("/")[2],
                    "namespace": ref.namespace,
                },
                "status": {"allocation": allocation, "reservedFor": [ref.consumer()]},
            }
            self.cache.overlay.set_pending(pending_key, placeholder)
        return Plan(pod=ref, node=decision.node, claims=tuple(claim_plans), bridge=bridge)

    def _spawn(self, coro: Awaitable[None], *, track: bool = True) -> None:
        async def wrapped() -> None:
            await coro

        task = asyncio.get_running_loop().create_task(wrapped())
        task.add_done_callback(_reap)
        if track:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit(self, key: str, plan: Plan) -> None:
        pending_bridge = f"{plan.pod.namespace}/{PENDING_BRIDGE_PREFIX}{plan.pod.uid}"
        outcome = Outcome.ERROR
        try:
            async with self._writes:
                started = time.perf_counter()
                await self.committer.commit(plan)
                self.metrics.commit_seconds.observe(time.perf_counter() - started)
            outcome = Outcome.SCHEDULED
            await self.recorder.scheduled(plan.pod, plan.node)
        except (CommitAbortedError, ApiError) as exc:
            log.warning(
                "pod %s: placement on %s not written: %s",
                key,
                plan.node,
                exc,
                extra={"pod": key, "node": plan.node},
            )
            self._assumed_pods.pop(plan.pod.uid, None)
            for claim in plan.claims:
                self._expected.pop(claim.key, None)
            self._dirty = True
        finally:
            self.cache.overlay.clear_pending(pending_bridge)
            self.queue.done(key, outcome)
            self.metrics.in_flight_claims.set(self.cache.overlay.in_flight)

    # ------------------------------------------------------------------ repair

    def _stale(self, ref: PodRef, keys: Iterable[str]) -> bool:
        if self._bridges.get(ref.uid):
            return True
        for key in keys:
            claim = self.cache.overlay.get(key)
            if claim is None or not has_finalizer(claim, self.settings.finalizer):
                continue
            if any(
                r.get("uid") == ref.uid
                for r in (claim.get("status") or {}).get("reservedFor") or ()
            ):
                return True
        return False

    async def _repair(self, ref: PodRef, keys: Iterable[str]) -> bool:
        """Release what an earlier attempt left for this unbound pod. False: try later."""
        try:
            live = await self.api.get(PODS, ref.name, ref.namespace)
        except NotFoundError:
            return False
        if str(meta(live).get("uid")) != ref.uid or pod_node(live):
            return False  # the cache is behind: the pod changed or is bound
        log.info(
            "pod %s: releasing what an interrupted attempt left behind",
            ref.key,
            extra={"pod": ref.key},
        )
        try:
            for key in sorted(self._bridges.get(ref.uid, ())):
                claim = self.cache.claims.get(key)
                if claim is None or is_bridge_claim(claim, ref.name, ref.uid):
                    await self.committer.delete_claim(key)
                    self.metrics.deallocations.labels(action="delete-bridge").inc()
            self._bridges.pop(ref.uid, None)
            for key in keys:
                claim = self.cache.overlay.get(key)
                if claim is None or not has_finalizer(claim, self.settings.finalizer):
                    continue
                if await self.committer.unreserve(key, ref.uid, deallocate=True) is not None:
                    await self.committer.remove_finalizer(key)
                    self.metrics.deallocations.labels(action="unreserve").inc()
        except (CommitAbortedError, ApiError) as exc:
            log.warning(
                "pod %s: repair failed (%s); will retry", ref.key, exc, extra={"pod": ref.key}
            )
            return False
        self._dirty = True
        return True

    # ------------------------------------------------------------------ introspection

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

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
3. **decide** with the decision core (:class:`driver.scheduling.decision.DecisionEngine`)
   on the cache's snapshot with every in-flight decision of this controller assumed;
4. **commit** (:mod:`controller.commit`) or **report**: ``PodScheduled=False`` + an Event,
   then park the pod in the queue until a relevant change (a claim freed, a slice, node or
   class changed) or its flush time.

The decision engine is kept equal to the caches without rebuilding it: every change to what a
claim holds (an informer event, or this controller's pending and assumed writes in the claim
overlay) is applied to the engine's snapshot as a delta on that claim's allocation, and pod
requests are recounted per node when pods are bound, finish or go. A full rebuild happens only
when nodes (in what scheduling reads: heartbeats do not count), slices or classes change.
:meth:`Scheduler.consistent` compares the engine with a rebuild (the tests assert it).
A placement counts from the moment it is decided, so decisions made while earlier writes are
in flight never hand out the same device twice. Pods being committed, and pods bound until
the cache shows the binding, are never tried again meanwhile. Commit and reporting tasks run
outside the process's task guard (they are per-pod work, not services); their failures are
logged and the pod is retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable, Mapping
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
from driver.api.claims import AllocationResult, DeviceClass, ResourceClaim
from driver.api.errors import ApiError, BiaxialError, NotFoundError
from driver.api.model import ResourceSlice
from driver.api.nodes import Node
from driver.scheduling.bridge import is_bridge_claim
from driver.scheduling.decision import DecisionEngine, Placement, PodError, Unschedulable
from driver.scheduling.nodefit import NodeUsage, PodSchedulingFacts
from driver.structured.snapshot import AllocatedState, ClusterSnapshot
from kubeapi.tasks import TaskGuard

log = logging.getLogger(f"biaxial.{__name__}")

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
        self._dirty = True  # a full rebuild is due (nodes, slices or classes changed)
        self._base: ClusterSnapshot | None = None
        self._base_version: tuple[int, int] = (-1, -1)
        self._pool_nodes: dict[tuple[str, str], str | None] = {}
        # What the engine counts, kept equal to the caches by incremental updates:
        self._counted: dict[str, AllocationResult] = {}  # claim key -> counted allocation
        self._claims_dirty: set[str] = set()
        self._pod_requests: dict[str, tuple[str, Mapping[str, int]]] = {}  # uid -> node, requests
        self._node_pods: dict[str, set[str]] = {}
        self._nodes_dirty: set[str] = set()  # pod requests changed on these nodes
        self._assumed_pods: dict[str, tuple[str, JSON]] = {}  # uid -> (node, pod), until observed
        self._bridges: dict[str, set[str]] = {}  # pod uid -> bridge claim keys
        self._writes = asyncio.Semaphore(settings.max_concurrent_writes)
        self._jobs = TaskGuard()  # placement writes and events in flight
        self.rebuilds = 0
        self.incremental_updates = 0
        cache.overlay.add_listener(self._claim_touched)
        cache.subscribe(self._on_event)

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
        if kind == "Pod":
            self._on_pod(old, new)
        elif kind == "ResourceClaim":
            self._on_claim(old, new)
        elif kind == "Node":
            self._on_node(old, new)
        else:  # DeviceClass, ResourceSlice
            self._dirty = True
            self.queue.move_all()

    def _on_node(self, old: JSON | None, new: JSON | None) -> None:
        if old is None or new is None:
            self._dirty = True  # a node came or went: rebuild
            self.queue.move_all()
            return
        try:
            before, after = Node.from_api(old), Node.from_api(new)
        except BiaxialError:
            self._dirty = True
            return
        if before == after:
            return  # a heartbeat, or a field scheduling does not read
        self._dirty = True  # labels, taints, allocatable, readiness: rebuild
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
        if new is None or pod_is_finished(new):
            self.recorder.forget(uid)
            self._assumed_pods.pop(uid, None)
            self._bridges.pop(uid, None)
            if uid in self._pod_requests:
                self._track_pod(uid, None, None)
                self.queue.move_all()  # its node has room again
            return
        node = pod_node(new)
        if node:
            assumed = self._assumed_pods.get(uid)
            if assumed is not None and assumed[0] == node:
                del self._assumed_pods[uid]  # our binding observed
            if old is not None and old.get("spec") != new.get("spec"):
                self._track_pod(uid, None, None)  # resized in place: count the new requests
            self._track_pod(uid, node, new)

    def _track_pod(self, uid: str, node: str | None, pod: Mapping[str, Any] | None) -> None:
        """Count (or, with ``node`` None, stop counting) a pod's requests on its node."""
        current = self._pod_requests.get(uid)
        if current is not None and current[0] == node:
            return
        if current is not None:
            self._node_pods.get(current[0], set()).discard(uid)
            del self._pod_requests[uid]
            self._nodes_dirty.add(current[0])
        if node is None or pod is None:
            return
        try:
            requests: Mapping[str, int] = PodSchedulingFacts.from_pod(pod).requests
        except BiaxialError:
            requests = {}
        self._pod_requests[uid] = (node, requests)
        self._node_pods.setdefault(node, set()).add(uid)
        self._nodes_dirty.add(node)

    def _claim_touched(self, key: str) -> None:
        self._claims_dirty.add(key)

    def _on_claim(self, old: JSON | None, new: JSON | None) -> None:
        # What the engine counts follows the overlay (its listener marks the key dirty).
        obj = new if new is not None else old
        assert obj is not None
        key = object_key(obj)
        if is_bridge(obj):
            for owner in meta(obj).get("ownerReferences") or ():
                if owner.get("controller") and owner.get("kind") == "Pod":
                    uid = str(owner.get("uid"))
                    if new is None:
                        self._bridges.get(uid, set()).discard(key)
                    else:
                        self._bridges.setdefault(uid, set()).add(key)
        if old is None and new is not None:
            self.queue.move_all()  # a template claim may have appeared
        elif _device_set(old) - _device_set(new):
            self.queue.move_all()  # devices freed

    # ------------------------------------------------------------------ engine

    def _allocation_of(self, key: str, raw: JSON | None) -> AllocationResult | None:
        if raw is None or not (raw.get("status") or {}).get("allocation"):
            return None
        try:
            return self._memo.claim(key, raw).allocation
        except BiaxialError as exc:
            log.warning("ResourceClaim %s is malformed, not counted: %s", key, exc)
            return None

    def _nodes_of(self, allocation: AllocationResult) -> set[str] | None:
        """The nodes whose devices ``allocation`` holds; None when that is not known (a pool
        that is not node-local, or not published): then only a full rebuild is exact."""
        nodes: set[str] = set()
        for result in allocation.results:
            node = self._pool_nodes.get((result.driver, result.pool))
            if node is None:
                return None
            nodes.add(node)
        return nodes

    def _node_usage(self, node: str) -> NodeUsage:
        usage = NodeUsage()
        for uid in self._node_pods.get(node, ()):
            usage = usage.plus(self._pod_requests[uid][1])
        return usage

    def _all_usage(self) -> dict[str, NodeUsage]:
        return {node: self._node_usage(node) for node, uids in self._node_pods.items() if uids}

    def _engine_now(self) -> DecisionEngine:
        """The engine, brought up to date: incrementally for claims and pods, rebuilt from the
        caches when nodes, slices or classes changed."""
        versions = (self.cache.slices.version, self.cache.classes.version)
        if self._engine is None or self._dirty or versions != self._base_version:
            return self._rebuild(versions)
        engine = self._engine
        if self._claims_dirty and not self._sync_claims(engine):
            return self._rebuild(versions)

        if self._nodes_dirty:
            nodes, self._nodes_dirty = self._nodes_dirty, set()
            for node in nodes:
                if self._node_pods.get(node):
                    engine.usage[node] = self._node_usage(node)
                else:
                    engine.usage.pop(node, None)
        return engine

    def _sync_claims(self, engine: DecisionEngine) -> bool:
        """Apply the changed claims to the engine; False when only a rebuild is exact."""
        keys, self._claims_dirty = self._claims_dirty, set()
        removed: list[AllocationResult] = []
        added: list[AllocationResult] = []
        touched: set[str] = set()
        for key in keys:
            new = self._allocation_of(key, self.cache.overlay.get(key))
            old = self._counted.get(key)
            if new == old:
                continue
            for allocation in (old, new):
                if allocation is None:
                    continue
                nodes = self._nodes_of(allocation)
                if nodes is None:
                    self._dirty = True
                    return False
                touched |= nodes
            if old is not None:
                removed.append(old)
            if new is not None:
                added.append(new)
                self._counted[key] = new
            else:
                del self._counted[key]
        if not removed and not added:
            return True
        snapshot = engine.snapshot
        if removed:
            snapshot = snapshot.without_allocations(removed)
        if added:
            snapshot = snapshot.with_allocations(added)
        engine.snapshot = snapshot
        for name in sorted(touched):
            node = engine.nodes.get(name)
            if node is not None:
                engine.index.refresh(snapshot, node)
        self.incremental_updates += 1
        return True

    def _rebuild(self, versions: tuple[int, int]) -> DecisionEngine:
        started = time.perf_counter()
        classes = []
        for raw in self.cache.classes.store.values():
            try:
                classes.append(DeviceClass.from_api(raw))
            except BiaxialError as exc:
                log.warning("DeviceClass %s is malformed, skipped: %s", object_key(raw), exc)
        if self._base is None or versions != self._base_version:
            slices = []
            pool_nodes: dict[tuple[str, str], str | None] = {}
            for raw in self.cache.slices.store.values():
                try:
                    parsed = ResourceSlice.from_api(raw)
                except BiaxialError as exc:
                    log.warning("ResourceSlice %s is malformed, skipped: %s", object_key(raw), exc)
                    continue
                slices.append(parsed)
                pool_key = (str(parsed.driver), str(parsed.pool.name))
                node_name = str(parsed.node_name) if parsed.node_name else None
                if pool_nodes.get(pool_key, node_name) != node_name:
                    node_name = None  # a pool spread over several nodes
                pool_nodes[pool_key] = node_name
            match_cache = self._base.match_cache if self._base is not None else None
            self._base = ClusterSnapshot.build(slices, classes, (), match_cache=match_cache)
            self._base_version = versions
            self._pool_nodes = pool_nodes
        self._claims_dirty.clear()
        counted: dict[str, AllocationResult] = {}
        for key, raw in self.cache.overlay.view().items():
            allocation = self._allocation_of(key, raw)
            if allocation is not None:
                counted[key] = allocation
        self._counted = counted
        snapshot = self._base.with_state(AllocatedState.empty().with_results(counted.values()))
        nodes = [n for raw in self.cache.nodes.store.values() if (n := self._memo.node(raw))]
        self._nodes_dirty.clear()
        self._engine = DecisionEngine(
            snapshot,
            nodes,
            defaults=self.settings.policies,
            pods_on_nodes=self._all_usage(),
            driver_name=self.settings.driver_name,
        )
        self._dirty = False
        self.rebuilds += 1
        self.metrics.engine_rebuild_seconds.observe(time.perf_counter() - started)
        log.info(
            "decision engine rebuilt: %d nodes, %d allocated claims in %.1f ms",
            len(nodes),
            len(counted),
            (time.perf_counter() - started) * 1000,
        )
        return self._engine

    def consistent(self) -> bool:
        """Whether the incrementally maintained engine equals one rebuilt from the caches now
        (allocated devices and per-node pod requests). For tests; call on the loop."""
        engine = self._engine_now()
        expected = AllocatedState.empty().with_results(
            a
            for key, raw in self.cache.overlay.view().items()
            if (a := self._allocation_of(key, raw)) is not None
        )
        usage = {n: u for n, u in engine.usage.items() if u.pods}
        nodes = {
            n.name: n for raw in self.cache.nodes.store.values() if (n := self._memo.node(raw))
        }
        return (
            engine.snapshot.allocated == expected
            and usage == self._all_usage()
            and dict(engine.nodes) == nodes
        )

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
        # The placement counts from now on: its claims as pending in the overlay (which the
        # engine follows), the pod's requests on its node.
        plan = self._plan(ref, decision, resolved.keys)
        self._assumed_pods[ref.uid] = (decision.node, pod)
        self._track_pod(ref.uid, decision.node, pod)
        self._spawn(self._commit(key, plan))

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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._jobs.spawn(coro)

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
            if self._assumed_pods.pop(plan.pod.uid, None) is not None:
                self._track_pod(plan.pod.uid, None, None)
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
        return True

    # ------------------------------------------------------------------ introspection

    @property
    def busy(self) -> bool:
        return self._jobs.jobs_in_flight > 0

"""The engine's feed: the controller's caches and decisions, told to the decision engine.

As kube-scheduler feeds its DRA manager from informers and its assume cache, :class:`EngineFeed`
turns what the controller sees into calls on the engine's interface
(:class:`~driver.scheduling.decision.DecisionEngine`), and nothing else touches the engine:

=====================================================  ==========================================
what happened                                          what the engine is told
=====================================================  ==========================================
this controller decided a placement                    ``assume(placement, pod)``
its writes failed (rolled back)                        ``forget(pod uid)``
a claim's written state changed: an informer event,    ``observe_allocation(key, allocation)``,
a write of ours returning, a rollback, a deletion      with the owning pod for a bridge claim
a pod was bound, relabelled, resized, began            ``observe_pod(uid, node, raw=pod,
terminating, finished or deleted (any scheduler's)     volumes=...)``
a node, ResourceSlice or DeviceClass changed           ``observe_node`` / ``_slice`` / ``_class``
a PVC, PV, StorageClass, CSINode, CSIDriver,           ``observe_volume(kind, key, object)``
CSIStorageCapacity or VolumeAttachment changed
a pending pod's ``status.nominatedNodeName`` changed   ``observe_nomination(uid, node, pod)``
(any scheduler's), or this controller preempted       (``nominate(preemption, pod)``)
a bound pod's ``status.startTime`` changed             ``observe_start(uid, pod)``
a Namespace's labels changed                           ``observe_namespace(name, labels)``
a Service, ReplicationController, ReplicaSet or        ``observe_owner(kind, namespace, name,
StatefulSet appeared, changed or went                  selector)``
=====================================================  ==========================================

Claims are read with :meth:`~controller.cache.ClaimOverlay.latest_written`: the informer's
object, or the object one of our writes returned until the informer catches up. The pending
state the scheduling loop shows in the overlay for its commit is never read here: the engine
learns this controller's decisions from ``assume`` alone, and recognises them when the written
claims and the binding show up (nothing is counted twice, nothing is taken out and put back).

The engine is built from the caches on first use (the same calls, replayed, then the
placements in flight assumed again) and kept current by events after; nodes, slices and
classes make it rebuild its index before the next decision, claims and pods never do.
:attr:`EngineFeed.generation` moves with every call that may change what the engine counts
(and with every new engine), so an answer taken at one generation holds while it stands
(:mod:`controller.equivalence`); our own writes to pending pods do not move it.
:meth:`EngineFeed.device_classes` names the DeviceClasses that select a device (the
scheduling queue's hints ask which parked pods a freed device can help).
:meth:`EngineFeed.consistent` builds a second engine from the caches and compares the two
(the tests assert it); :meth:`EngineFeed.reset` drops the engine after an unexpected error so
the next decision starts from the caches. Objects that do not parse are logged and left out.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Final, TypeVar

from controller.api import JSON, meta, object_key, pod_is_finished, pod_node
from controller.cache import ClusterCache, Selecting
from controller.metrics import Metrics
from driver.api.claims import AllocationResult, DeviceResult, ResourceClaim, SpecMemo
from driver.api.errors import BiaxialError
from driver.scheduling.bridge import bridge_claim_owner
from driver.scheduling.decision import DecisionEngine, pod_uid
from driver.scheduling.outcome import Placement, Preemption
from driver.scheduling.policy import PolicyDefaults
from driver.scheduling.storage import VOLUME_KINDS, PodVolumes
from driver.scheduling.topologyspread import DefaultSpreading
from kubeapi import codec

log = logging.getLogger(f"biaxial.{__name__}")


class Parsed:
    """The core's models of the claims in the cache, parsed once per object version (nodes,
    slices and classes are stored as models already: :class:`~controller.cache.ClusterCache`).

    Two memos: the whole claim (:meth:`claim`), for the pods being scheduled, and a claim's
    allocation alone (:meth:`allocation`), which is all the engine keeps of a held claim.
    An allocation's strings and its node selector and consumed capacities are shared with
    every other allocation that has equal ones (held claims on one node repeat them), so a
    held claim costs its informer object and one compact allocation, with no second model of
    the whole claim beside them."""

    #: Distinct shared parts kept before the table is started afresh (node churn).
    SHARED_MAX: Final = 200_000
    #: Bridge allocations awaiting their claim kept before the table is started afresh.
    BRIDGES_MAX: Final = 10_000

    def __init__(self) -> None:
        self._claims: dict[str, tuple[JSON, ResourceClaim | BiaxialError]] = {}
        self._specs = SpecMemo()
        self._allocations: dict[str, tuple[JSON, AllocationResult | BiaxialError]] = {}
        # pod uid -> (to_api(), model) of the allocation decided for its bridge claim, whose
        # key is known only once the claim is created (a generated name)
        self._bridges: dict[str, tuple[JSON, AllocationResult]] = {}
        self._shared: dict[Any, Any] = {}

    def claim(self, key: str, raw: JSON) -> ResourceClaim:
        """The claim model of ``raw``; raises the parse error (for the pod to report)."""
        return _memo(self._claims, key, raw, self._parse_claim)

    def _parse_claim(self, raw: JSON) -> ResourceClaim:
        # Claims from one template repeat their spec: it is parsed once (SpecMemo).
        return ResourceClaim.from_api(raw, self._specs)

    def allocation(
        self, key: str, raw: JSON, bridge_of: str | None = None
    ) -> AllocationResult | None:
        """The ``status.allocation`` of claim ``raw`` (None: not allocated); raises the parse
        error. ``bridge_of``: the pod whose bridge claim ``raw`` is, if it is one (see
        :meth:`decided_bridge`)."""
        status = raw.get("status")
        found = status.get("allocation") if isinstance(status, dict) else None
        if not found:
            return None
        if bridge_of is not None and key not in self._allocations:
            seeded = self._bridges.pop(bridge_of, None)
            if seeded is not None:  # (taken only if equal to what the claim carries)
                self._allocations[key] = seeded
        where = f"ResourceClaim {key}: status.allocation"
        return _memo(
            self._allocations,
            key,
            found,
            lambda source: self._compact(AllocationResult.from_api(source, where)),
            equal=True,
        )

    def decided(self, key: str, source: JSON, allocation: AllocationResult) -> None:
        """This controller decided ``allocation`` for claim ``key`` and writes it as ``source``
        (its ``to_api()``): the write and its watch echo carry an equal copy, which
        :meth:`allocation` then answers with this model, not parsed again."""
        self._allocations[key] = (source, self._compact(allocation))

    def decided_bridge(self, pod: str, allocation: AllocationResult) -> None:
        """This controller decided ``allocation`` for the bridge claim of pod ``pod`` (a
        uid), which it creates under a name the API server generates: :meth:`allocation`
        answers the claim with this model when it carries an equal copy, not parsed again
        (its ``to_api()`` and a comparison cost a third of the parse; a third of the pods
        of a mixed cluster have a bridge claim)."""
        bridges = self._bridges
        if len(bridges) >= self.BRIDGES_MAX:
            bridges.clear()  # (bounded: the entries of placements never written)
        bridges[pod] = (allocation.to_api(), self._compact(allocation))

    def forget_bridge(self, pod: str) -> None:
        """Drop what :meth:`decided_bridge` kept for pod ``pod`` (not written, or gone)."""
        self._bridges.pop(pod, None)

    def settled(self, key: str) -> None:
        """The claim's allocation is written: the whole-claim model, read while its pod was
        scheduled, is dropped (parsed again should another pod share the claim)."""
        self._claims.pop(key, None)

    def forget(self, key: str) -> None:
        """Drop the models of a deleted claim."""
        self._claims.pop(key, None)
        self._allocations.pop(key, None)

    def _share(self, key: Any, value: Any) -> Any:
        shared = self._shared
        found = shared.get(key)
        if found is None:
            if len(shared) >= self.SHARED_MAX:
                shared.clear()
            found = shared[key] = value
        return found

    def _compact(self, allocation: AllocationResult) -> AllocationResult:
        """``allocation`` with its parts shared with equal ones (see the class docstring)."""
        results = tuple(self._compact_result(r) for r in allocation.results)
        selector = allocation.node_selector
        if selector is not None:
            selector = self._share(("selector", codec.dumps(selector)), selector)
        if selector is allocation.node_selector and all(
            new is old for new, old in zip(results, allocation.results, strict=True)
        ):
            return allocation
        return replace(allocation, results=results, node_selector=selector)

    def _compact_result(self, result: DeviceResult) -> DeviceResult:
        """One result with its strings interned and its consumed capacities shared; the same
        object when it holds those already (a decided result's names are the slices' own,
        interned when the first allocation of the device was kept)."""
        request = sys.intern(result.request)
        driver = sys.intern(result.driver)
        pool = sys.intern(result.pool)
        device = sys.intern(result.device)
        capacity = result.consumed_capacity
        if capacity is not None:
            capacity = self._share(
                ("capacity", *sorted((k, str(q)) for k, q in capacity.items())), capacity
            )
        if (
            request is result.request
            and driver is result.driver
            and pool is result.pool
            and device is result.device
            and capacity is result.consumed_capacity
        ):
            return result
        return result.renamed(request, driver, pool, device, capacity)


_Parsed = TypeVar("_Parsed")


def _memo(
    table: dict[str, tuple[JSON, _Parsed | BiaxialError]],
    key: str,
    source: JSON,
    parse: Callable[[JSON], _Parsed],
    *,
    equal: bool = False,
) -> _Parsed:
    """``parse(source)``, memoized under ``key`` for this very ``source`` (the memo holds it:
    identity is safe); a parse error is memoized and raised alike. With ``equal``, also for a
    ``source`` equal to the memoized one (the memo then holds the newer): a claim's allocation
    is set once and never changed, and each write of the claim (the reservation, the
    finalizer) and its echo from the watch carry an equal copy, which a comparison tells
    apart at a fraction of a parse."""
    hit = table.get(key)
    if hit is not None and (hit[0] is source or (equal and codec.equal(hit[0], source))):
        value = hit[1]
        if hit[0] is not source:
            table[key] = (source, value)
    else:
        try:
            value = parse(source)
        except BiaxialError as exc:
            value = exc
        table[key] = (source, value)
    if isinstance(value, BiaxialError):
        raise value
    return value


@dataclass(frozen=True, slots=True)
class _Flight:
    """A placement this controller assumed, until its binding is seen (or it fails)."""

    placement: Placement
    pod: JSON


#: The kinds whose ``spec.selector`` default topology spreading reads.
OWNER_KINDS: Final = frozenset({"Service", "ReplicationController", "ReplicaSet", "StatefulSet"})


def _nominated(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("nominatedNodeName") or None


def _start(pod: Mapping[str, Any]) -> Any:
    return (pod.get("status") or {}).get("startTime")


def _reserved_uids(claim: JSON | None) -> tuple[str, ...]:
    """The UIDs in a claim's ``status.reservedFor``."""
    if claim is None:
        return ()
    reserved = (claim.get("status") or {}).get("reservedFor") or ()
    return tuple(str(r.get("uid")) for r in reserved if r.get("uid"))


def _bridge_owner(claim: JSON | None) -> str | None:
    return bridge_claim_owner(claim) if claim is not None else None


def _pod_volumes(pod: Mapping[str, Any]) -> PodVolumes | None:
    try:
        return PodVolumes.from_pod(pod)
    except BiaxialError as exc:
        log.warning("pod %s: volumes not understood, not counted: %s", object_key(pod), exc)
        return None


def observe_volume_object(engine: DecisionEngine, kind: str, key: str, raw: JSON | None) -> None:
    """Tell the engine about one object of a volume kind; a malformed one is logged and left
    out (as if it did not exist)."""
    try:
        engine.observe_volume(kind, key, raw)
    except BiaxialError as exc:
        log.warning("%s %s is malformed, skipped: %s", kind, key, exc)
        engine.observe_volume(kind, key, None)


class EngineFeed:
    """See the module docstring. ``on_cluster_change`` is called when a node, slice or class
    changed in what scheduling reads (the loop then retries parked pods)."""

    def __init__(
        self,
        cache: ClusterCache,
        defaults: PolicyDefaults,
        metrics: Metrics,
        *,
        driver_name: str,
        on_cluster_change: Callable[[], None],
        spreading: DefaultSpreading | None = None,
    ) -> None:
        self.cache = cache
        self.defaults = defaults
        self.spreading = spreading or DefaultSpreading()
        self.driver_name = driver_name
        self.metrics = metrics
        self.parsed = Parsed()
        self.rebuilds = 0  # engines built from the caches, and index rebuilds
        self.generation = 0  # moves whenever what the engine counts may have changed
        self._on_cluster_change = on_cluster_change
        self._engine: DecisionEngine | None = None
        self._flights: dict[str, _Flight] = {}  # pod uid -> placement, until bound or failed
        cache.overlay.add_listener(self._claim_touched, written=True)
        cache.subscribe(self._on_event)

    # ------------------------------------------------------------------ for the loop
    def engine(self) -> DecisionEngine:
        """The engine, up to date with the caches (built from them on first use)."""
        started = time.perf_counter()
        engine = self._engine
        if engine is None:
            engine = self._engine = self._build()
            rebuilt = True
        else:
            rebuilt = engine.sync()
        if rebuilt:
            self.generation += 1
            self.rebuilds += 1
            self.metrics.engine_rebuild_seconds.observe(time.perf_counter() - started)
        return engine

    def assume(self, placement: Placement, pod: JSON) -> None:
        """This controller decided ``placement`` for ``pod``: it counts from now on."""
        self.generation += 1
        # The engine first: a placement it refuses leaves no flight behind (a flight that
        # never lands would make the pod look placed, and every rebuild refuse it again).
        self.engine().assume(placement, pod)
        uid = pod_uid(pod)
        self._flights[uid] = _Flight(placement, pod)
        if placement.bridge_allocation is not None:
            self.parsed.decided_bridge(uid, placement.bridge_allocation)

    def forget(self, uid: str) -> None:
        """The placement of pod ``uid`` was not written (what was written is rolled back)."""
        self.generation += 1
        self._flights.pop(uid, None)
        self.parsed.forget_bridge(uid)
        if self._engine is not None:
            self._engine.forget(uid)

    def nominate(self, preemption: Preemption, pod: JSON) -> None:
        """This controller preempted for ``pod``: hold what it planned on the node."""
        self.generation += 1
        self.engine().nominate(preemption, pod)

    def clear_nomination(self, uid: str, pod: JSON) -> None:
        """The nomination of pod ``uid`` failed (its writes did not land)."""
        self.generation += 1
        if self._engine is not None:
            self._engine.observe_nomination(uid, None, pod)

    def assumed(self, uid: str) -> bool:
        """Whether pod ``uid`` was placed by this controller and its binding not seen yet."""
        return uid in self._flights

    def reset(self) -> None:
        """Forget the engine: the next one is built from the caches (after an unexpected
        error, whatever it left half done is not trusted)."""
        self.generation += 1
        self._engine = None

    def consistent(self) -> bool:
        """Whether the engine kept up to date by events equals one built from the caches now
        (what it counts and how it files the nodes). For tests; call on the loop."""
        return not self.drift()

    def drift(self) -> dict[str, tuple[Any, Any]]:
        """Where the engine kept up to date by events differs from one built from the caches
        now: per part of :class:`~driver.scheduling.decision.EngineState`, the (kept, fresh)
        values (empty: consistent). For tests; call on the loop."""
        kept, fresh = self.engine().state(), self._build().state()
        return {
            part.name: (getattr(kept, part.name), getattr(fresh, part.name))
            for part in fields(kept)
            if getattr(kept, part.name) != getattr(fresh, part.name)
        }

    # ------------------------------------------------------------------ building
    def _build(self) -> DecisionEngine:
        started = time.perf_counter()
        engine = DecisionEngine.empty(
            defaults=self.defaults, driver_name=self.driver_name, spreading=self.spreading
        )
        cache = self.cache
        for namespace in cache.namespaces.store.values():
            engine.observe_namespace(namespace.name, namespace.labels)
        for owners in cache.owners:
            for owner in owners.store.values():
                self._observe_owner(engine, owner, owner.selector)
        for kind, volumes in cache.volumes.items():
            for key, raw_volume in volumes.store.items():
                observe_volume_object(engine, kind, key, raw_volume)
        for key, device_class in cache.classes.store.items():
            engine.observe_class(key, device_class)
        for key, resource_slice in cache.slices.store.items():
            engine.observe_slice(key, resource_slice)
        for key, node in cache.nodes.store.items():
            engine.observe_node(key, node)
        for flight in self._flights.values():
            engine.assume(flight.placement, flight.pod)
        claims = cache.overlay.written()
        for key, raw in claims.items():
            bridge_of = _bridge_owner(raw)
            engine.observe_allocation(
                key,
                self._allocation(key, raw, bridge_of),
                bridge_of=bridge_of,
                reserved_for=_reserved_uids(raw),
            )
        for raw in cache.pods.store.values():
            self._observe_pod(engine, None, raw)
            self._observe_nomination(engine, None, raw)
        engine.sync()
        log.info(
            "decision engine built from the caches: %d nodes, %d claims, %d placement(s) in "
            "flight in %.1f ms",
            len(cache.nodes.store),
            len(claims),
            len(self._flights),
            (time.perf_counter() - started) * 1000,
        )
        return engine

    def _allocation(
        self, key: str, raw: JSON | None, bridge_of: str | None
    ) -> AllocationResult | None:
        if raw is None:
            return None
        try:
            return self.parsed.allocation(key, raw, bridge_of)
        except BiaxialError as exc:
            log.warning("ResourceClaim %s is malformed, not counted: %s", key, exc)
            return None

    # ------------------------------------------------------------------ events
    def _claim_touched(self, key: str) -> None:
        """What the overlay shows as written for ``key`` may have changed (its pending state
        alone is not read here: a placement's claims count through ``assume``)."""
        self.generation += 1
        raw = self.cache.overlay.latest_written(key)
        if raw is None:
            self.parsed.forget(key)
        elif (raw.get("status") or {}).get("allocation"):
            self.parsed.settled(key)
        if self._engine is not None:
            bridge_of = _bridge_owner(raw)
            allocation = self._allocation(key, raw, bridge_of)
            self._engine.observe_allocation(
                key, allocation, bridge_of=bridge_of, reserved_for=_reserved_uids(raw)
            )

    def _on_event(self, kind: str, _etype: str, old: Any, new: Any) -> None:
        if kind == "ResourceClaim":
            return  # followed through the overlay (its listener sees every change)
        if kind == "Pod":
            self._on_pod(old, new)
            return
        engine = self._engine
        if kind in OWNER_KINDS:
            owner = new if new is not None else old
            if engine is not None and owner is not None:
                self.generation += 1
                self._observe_owner(engine, owner, new.selector if new is not None else None)
                if any(c.when_unsatisfiable == "DoNotSchedule" for c in self.spreading.constraints):
                    self._on_cluster_change()  # a configured default filter may now pass
            return  # (System defaults only order nodes: nothing parked becomes schedulable)
        if kind == "Namespace":
            namespace = new if new is not None else old
            if engine is not None and namespace is not None:
                self.generation += 1
                engine.observe_namespace(namespace.name, new.labels if new is not None else None)
            self._on_cluster_change()  # a namespaceSelector may now match
            return
        if engine is None:
            self._on_cluster_change()
            return
        model = new if new is not None else old
        if model is None:
            return  # malformed before and after: the engine never had it
        changed = True
        if kind in VOLUME_KINDS:
            observe_volume_object(engine, kind, object_key(model), new)
        elif kind == "Node":
            changed = engine.observe_node(model.name, new)
        elif kind == "ResourceSlice":
            changed = engine.observe_slice(model.name, new)
        elif kind == "DeviceClass":
            changed = engine.observe_class(model.name, new)
        if changed:
            self.generation += 1
            self._on_cluster_change()

    def _on_pod(self, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        assert obj is not None
        uid = str(meta(obj).get("uid") or "")
        if new is None or pod_is_finished(new):
            self.generation += 1
            self._flights.pop(uid, None)
            self.parsed.forget_bridge(uid)
            if self._engine is not None:
                self._engine.observe_pod(uid, None)
            return
        flight = self._flights.get(uid)
        if flight is not None and flight.placement.node == pod_node(new):
            del self._flights[uid]  # our binding is seen
        if _counts_anew(old, new):
            self.generation += 1
            if self._engine is not None:
                self._observe_pod(self._engine, None, new)
        elif (
            self._engine is not None
            and old is not None
            and pod_node(new)
            and _start(old) != _start(new)
        ):
            self._engine.observe_start(uid, new)
        if self._engine is not None and self._observe_nomination(self._engine, old, new):
            self.generation += 1  # a nomination holds against other pods

    @staticmethod
    def _observe_nomination(engine: DecisionEngine, old: JSON | None, new: JSON) -> bool:
        """A pending pod's ``status.nominatedNodeName`` (any scheduler's), when it changed;
        whether the engine was told."""
        if pod_node(new):
            return False  # bound: observe_pod dropped any nomination
        node = _nominated(new)
        if old is not None and _nominated(old) == node:
            return False
        if node is None and old is None:
            return False
        uid = str(meta(new).get("uid") or "")
        try:
            engine.observe_nomination(uid, node, new)
        except BiaxialError as exc:
            name = f"{meta(new).get('namespace')}/{meta(new).get('name')}"
            log.warning("Pod %s is malformed, its nomination is not held: %s", name, exc)
        return True

    @staticmethod
    def _observe_pod(engine: DecisionEngine, old: JSON | None, new: JSON) -> None:
        """Tell the engine where a live pod counts, when that may have changed: it was bound,
        relabelled, resized in place, or began terminating (parsed only then). A pod that
        does not parse still counts on its node, with no requests."""
        if not _counts_anew(old, new):
            return
        node = pod_node(new)
        uid = str(meta(new).get("uid") or "")
        volumes = _pod_volumes(new)
        try:
            engine.observe_pod(uid, node, volumes=volumes, raw=new)
        except BiaxialError as exc:
            name = f"{meta(new).get('namespace')}/{meta(new).get('name')}"
            log.warning("Pod %s is malformed, counted without its rules: %s", name, exc)
            engine.observe_pod(uid, node, {}, volumes)

    @staticmethod
    def _observe_owner(
        engine: DecisionEngine, owner: Selecting, selector: Mapping[str, Any] | None
    ) -> None:
        kind, namespace, name = owner.kind, owner.namespace, owner.name
        try:
            engine.observe_owner(kind, namespace, name, selector)
        except BiaxialError as exc:
            log.warning(
                "%s %s/%s has a malformed selector, ignored: %s", kind, namespace, name, exc
            )
            engine.observe_owner(kind, namespace, name, None)

    # ------------------------------------------------------------------ queueing hints
    def device_classes(self, driver: str, pool: str, device: str) -> frozenset[str] | None:
        """The DeviceClasses that select device ``driver/pool/device`` now; None when the
        engine does not know it (yet)."""
        return self.engine().device_classes(driver, pool, device)


def _counts_anew(old: JSON | None, new: JSON) -> bool:
    """Whether what the engine counts of a live pod may have changed: it was bound,
    relabelled, resized in place, or began terminating. An unbound pod counts nowhere (ours
    count through their assumption)."""
    node = pod_node(new)
    if not node or pod_is_finished(new):
        return False
    if old is None:
        return True
    old_meta, new_meta = meta(old), meta(new)
    return (
        pod_node(old) != node
        or old.get("spec") != new.get("spec")
        or old_meta.get("labels") != new_meta.get("labels")
        or bool(old_meta.get("deletionTimestamp")) != bool(new_meta.get("deletionTimestamp"))
    )

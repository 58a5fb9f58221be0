"""The decision engine: where does one pod go, and with which devices?

Used by ``biaxial simulate`` and the controller. For one pod (its raw JSON and its
ResourceClaims), :meth:`DecisionEngine.decide`:

1. resolves the pod's policies (annotations, defaults), its legacy extended resources
   (KEP-5004 bridge, with the dialect annotations of :mod:`driver.scheduling.dialects`) and
   its scheduling facts; bad input is a :class:`~driver.scheduling.outcome.PodError` for that
   pod (``_context``), including what :func:`driver.scheduling.checks.check_pod_input` refuses
   and a claim whose ``GpuConfig`` the node would refuse at Prepare
   (:func:`driver.api.config.check_claim_config`), so nothing is allocated for it;
2. filters nodes (:mod:`driver.scheduling.nodefit`, then the volume rules of
   :mod:`driver.scheduling.volumes`), builds the node's variant of the bridge claim,
   allocates *all* the pod's unallocated claims on the node with the allocator, the GPU
   axis ordering devices (:mod:`driver.scheduling.scoring`), and scores the node on the node
   axis (``_evaluate``);
3. picks the best node (ties by name) and returns a
   :class:`~driver.scheduling.outcome.Placement`, or an
   :class:`~driver.scheduling.outcome.Unschedulable` with kube-scheduler's per-node reasons.

**Pruning.** The :mod:`capacity index <driver.scheduling.capacity_index>` files every node in
sorted lists by partition, in one view per set of device kinds a pod may use (its classes and
selectors decide: :mod:`driver.scheduling.classification`). For a pod, the engine computes per
partition of its view an *optimistic bound* of the node score over the devices it can use
(:mod:`driver.scheduling.bounds`; exact for simple pods on one kind of device), walks nodes
best bound first across the lists (a heap merge), evaluates them exactly (index precheck, node
filter, allocator, exact score), and stops as soon as the best bound left cannot beat the best
exact (score, name) found. Partitions that cannot hold the pod are never visited. The result is
identical to evaluating every node (tests compare both on random clusters);
:class:`DecisionEngine` takes ``exhaustive=True`` for that reference. Pruning is switched off
(every node evaluated) where a bound would not hold: slices that are not node-local, ``All`` or
admin-access requests, pods with allocated claims, ``gpumem-percentage``, and legacy resources
some node serves through a device plugin. When nothing fits, every node is evaluated for the
kube-scheduler message. ``docs/scoring.md`` explains the bounds.

**What it counts.** The engine is told about the cluster and about its own decisions only
through its methods, as kube-scheduler's DRA manager is fed from informers and its assume
cache (the bookkeeping is :mod:`driver.scheduling.tracker`):

* :meth:`DecisionEngine.assume` counts a placement before it is written;
  :meth:`~DecisionEngine.forget` drops it when the writes fail. When the cluster later shows
  the written claims and the bound pod, the observation is recognised as the assumed
  placement: nothing moves.
* :meth:`~DecisionEngine.observe_allocation` and :meth:`~DecisionEngine.observe_pod` follow
  allocated claims and pods on nodes (any writer, any scheduler): each is a delta on the
  snapshot and re-files only the nodes whose devices it touches.
* :meth:`~DecisionEngine.observe_node`, :meth:`~DecisionEngine.observe_slice` and
  :meth:`~DecisionEngine.observe_class` change what the index is built from: the engine
  rebuilds it (keeping the CEL cache) before the next decision. A heartbeat changes nothing.
* :meth:`~DecisionEngine.observe_volume` follows what the volume rules read (PVCs, PVs,
  StorageClasses, CSI nodes and drivers, capacities, attachments) and ``observe_pod`` the
  volumes of pods on nodes, both into :class:`~driver.scheduling.volumes.ClusterVolumes`; the
  engine's ``assume`` and ``forget`` pass a placement's volume bindings on to it. A volume rule that
  rules out every node (a missing claim) makes the decision ``Unschedulable`` with upstream's
  message; per node the volume rules are one more filter, applied to the nodes the search
  evaluates (pruning stays exact: a filter only removes nodes).

Updates are cheap and lazy; :meth:`~DecisionEngine.sync` (called by ``decide``) applies them.
:meth:`~DecisionEngine.state` exposes what the engine counts, so tests can compare an engine
kept up to date with one built at once. Decisions never mutate their inputs.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any, Final, NamedTuple, TypeVar

from driver.api.claims import AllocationResult, DeviceClass, ResourceClaim
from driver.api.config import check_claim_config
from driver.api.errors import BiaxialError, InvalidInputError, NodeAllocationError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import ResourceSlice
from driver.api.nodes import Node, node_selector_matches
from driver.scheduling.bounds import (
    Demand,
    ShapeBounds,
    Usable,
    bound_amounts,
    float_score,
    pod_demand,
    precheck,
    shape_bounds,
)
from driver.scheduling.bridge import (
    BridgeClaim,
    ExtendedResourceMap,
    PodLegacyResources,
    build_bridge_claim,
    dra_resources_on_node,
    filter_exempt,
    legacy_resources,
)
from driver.scheduling.capacity_index import (
    CapacityIndex,
    DeviceKind,
    FiledNode,
    FilingEntry,
    NodeShape,
    Variant,
    ViewShape,
)
from driver.scheduling.checks import ClusterFacts, check_pod_input, cluster_facts
from driver.scheduling.classification import DeviceClassifier
from driver.scheduling.nodefit import (
    NodeUsage,
    PodSchedulingFacts,
    filter_node,
    node_allocatable,
    unschedulable_message,
)
from driver.scheduling.outcome import (
    REASON_CLAIM_NODE,
    REASON_CLAIMS,
    REASON_NO_GPUS,
    ClaimAllocation,
    Decision,
    Placement,
    PodError,
    PreFilterRejectedError,
    Unschedulable,
)
from driver.scheduling.policy import PodPolicies, PolicyDefaults, policies_for_pod
from driver.scheduling.scoring import NodeAmounts, gpu_order, node_rank, node_score
from driver.scheduling.tracker import Change, ClusterTracker
from driver.scheduling.volumes import (
    ClusterVolumes,
    PodVolumeContext,
    PodVolumes,
    VolumeBindings,
    VolumeState,
)
from driver.structured.allocator import DEFAULT_SEARCH_BUDGET, SearchStats, allocate
from driver.structured.snapshot import AllocatedState, ClusterSnapshot

log = logging.getLogger(f"biaxial.{__name__}")

BRIDGE_CLAIM_PLACEHOLDER: Final = "<extended-resources>"
_EPSILON: Final = 1e-9  # float bounds closer than this to the best are compared exactly


# --------------------------------------------------------------------------- per-pod context


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's UID (``namespace/name`` for a pod that has none, as in a test)."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    return str(uid) if uid else f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


class _BridgeKey(NamedTuple):
    """What sets one node's variant of the bridge claim apart: the legacy resources DRA
    serves there, and the GPU memory a percentage is taken of."""

    dra_resources: frozenset[str]
    gpu_memory: int | None


class _BridgeVariant(NamedTuple):
    """The bridge claim for one node variant: the KEP-5004 object and its claim model."""

    bridge: BridgeClaim
    claim: ResourceClaim


class _UsableKinds(NamedTuple):
    """The device kinds one request alternative may use (its class selects them and no
    selector rules them out), and whether that holds for every device of those kinds."""

    kinds: frozenset[DeviceKind]
    certain: bool


@dataclass(slots=True)
class _PodContext:
    """Everything about one pod that does not depend on the node (parsed once)."""

    name: str
    pod: Mapping[str, Any]
    facts: PodSchedulingFacts
    policies: PodPolicies
    legacy: PodLegacyResources
    user_claims: tuple[ResourceClaim, ...]
    to_allocate: tuple[ResourceClaim, ...]
    allocated_claims: tuple[ResourceClaim, ...]
    bridge_cache: dict[_BridgeKey, _BridgeVariant | None] = field(default_factory=dict)
    demand: Demand | None = None
    legacy_resources: frozenset[str] = frozenset()
    exempt: frozenset[str] = frozenset()  # resources the node filter leaves to DRA
    kinds: tuple[tuple[_UsableKinds, ...], ...] = ()  # per request, per alternative
    shape_bounds: dict[int, ShapeBounds] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    volumes: PodVolumeContext | None = None  # None: no volume the volume rules look at


@dataclass(frozen=True, slots=True)
class _NodeOutcome:
    score: Fraction
    results: tuple[AllocationResult, ...]
    bridge: _BridgeVariant | None
    volumes: VolumeBindings | None = None


@dataclass(frozen=True, slots=True)
class _Best:
    """The best node found so far: its rank (smaller is better), outcome and node."""

    rank: tuple[Fraction, str]
    outcome: _NodeOutcome
    node: Node


class _Frontier(NamedTuple):
    """A heap entry of the pruned walk: the next node of one partition's list, ordered by its
    float bound (then name; ``serial`` keeps the rest of the entry out of comparisons)."""

    bound: float  # the bound, negated under node binpack so the best pops first
    name: str
    serial: int
    entries: list[FiledNode]
    position: int
    adding: NodeAmounts
    shape: NodeShape


# Built as NamedTuple._make builds (tuple.__new__ on the values): half the cost of the
# keyword-capable constructor, which shows at 5000 nodes (one entry per partition per pod).
_frontier: Callable[
    [tuple[float, str, int, list[FiledNode], int, NodeAmounts, NodeShape]], _Frontier
] = partial(tuple.__new__, _Frontier)


# --------------------------------------------------------------------------- the engine


_T = TypeVar("_T")


def _advertised(nodes: Iterable[Node]) -> frozenset[str]:
    """Extended resources some node advertises (served by a device plugin there)."""
    return frozenset(
        name
        for node in nodes
        for name, quantity in node.allocatable.items()
        if "/" in name and quantity.sign() > 0
    )


def _replace(store: dict[str, _T], name: str, value: _T | None) -> bool:
    """Put ``value`` (None: remove) under ``name``; whether that changed anything."""
    if store.get(name) == value:
        return False
    if value is None:
        del store[name]
    else:
        store[name] = value
    return True


@dataclass(slots=True)
class DecisionStats:
    """Counters across decisions (for benchmarks, tests and metrics)."""

    decisions: int = 0
    nodes_evaluated: int = 0
    allocator_calls: int = 0
    search_steps: int = 0
    seconds: float = 0.0
    rebuilds: int = 0
    rebuild_seconds: float = 0.0
    updates: int = 0  # node and node-local slice changes applied node by node
    landed: int = 0  # observations recognised as an assumed placement's (nothing moved)


@dataclass(frozen=True, slots=True)
class EngineState:
    """What an engine counts and how its index files the nodes, comparable between engines:
    one kept up to date by observations must equal one built from the same cluster at once."""

    allocated: AllocatedState
    usage: Mapping[str, NodeUsage]
    nodes: Mapping[str, Node]
    filing: frozenset[FilingEntry]
    volumes: VolumeState


class DecisionEngine:
    """Decides pods one at a time against a cluster it is told about (see the module
    docstring). ``snapshot`` and ``nodes`` are the cluster to start from; allocations already
    in the snapshot and ``pods_on_nodes`` count for good (they are never observed again)."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        nodes: Sequence[Node],
        *,
        defaults: PolicyDefaults | None = None,
        pods_on_nodes: Mapping[str, NodeUsage] | None = None,
        exhaustive: bool = False,
        budget: int = DEFAULT_SEARCH_BUDGET,
        driver_name: str = DEFAULT_DRIVER_NAME,
    ) -> None:
        self.driver_name = driver_name  # whose opaque config (GpuConfig) the engine checks
        self.defaults = defaults or PolicyDefaults()
        self.budget = budget
        self.stats = DecisionStats()
        self.snapshot = snapshot
        self._nodes: dict[str, Node] = {n.name: n for n in nodes}
        self._exhaustive_asked = exhaustive
        self._baseline = snapshot.allocated
        self._slices = {s.name or f"#{i}": s for i, s in enumerate(snapshot.slices)}
        self._classes = dict(snapshot.classes)
        self._tracker = ClusterTracker(pods_on_nodes)
        self._volumes = ClusterVolumes()  # what the volume rules read
        self._rebuild_due = False  # classes changed, or a change only a rebuild follows
        self._base_changed = False  # slices or classes: the snapshot itself is rebuilt too
        self._stale: set[str] = set()  # nodes whose filed state lags behind the snapshot
        # Changes applied node by node at the next sync: slice name -> the object the
        # snapshot holds (None: it had none), and nodes that came, went or changed.
        self._slice_changes: dict[str, ResourceSlice | None] = {}
        self._node_changes: set[str] = set()
        self._allocatable: dict[str, dict[str, int]] = {}
        self._facts: tuple[tuple[object, int, object], ClusterFacts] | None = None
        self._derive()

    @classmethod
    def empty(
        cls,
        *,
        defaults: PolicyDefaults | None = None,
        budget: int = DEFAULT_SEARCH_BUDGET,
        driver_name: str = DEFAULT_DRIVER_NAME,
    ) -> DecisionEngine:
        """An engine that knows nothing yet, to be told the cluster by ``observe_*``."""
        snapshot = ClusterSnapshot.build((), ())
        return cls(snapshot, (), defaults=defaults, budget=budget, driver_name=driver_name)

    # ------------------------------------------------------------------ deciding
    def decide(self, pod: Mapping[str, Any], claims: Sequence[ResourceClaim] = ()) -> Decision:
        """Decide one pod. ``claims`` are the pod's ResourceClaims (``spec.resourceClaims``
        order), already created from templates by the caller. Inside a
        ``driver.cel.cost.limits(deadline=...)`` block, a deadline that passes while selectors
        are evaluated raises :class:`~driver.api.errors.DeadlineExceededError` (no decision;
        what the engine counts is unchanged)."""
        started = time.perf_counter()
        try:
            self.sync()
            decision = self._decide(pod, claims)
        finally:
            elapsed = time.perf_counter() - started
            self.stats.decisions += 1
            self.stats.seconds += elapsed
        if log.isEnabledFor(logging.INFO):
            if isinstance(decision, Placement):
                log.info(
                    "pod %s: node %s (policies node=%s gpu=%s, %d node(s) evaluated, %.2f ms)",
                    decision.pod,
                    decision.node,
                    decision.policies.node,
                    decision.policies.gpu,
                    decision.evaluated,
                    elapsed * 1000,
                )
            else:
                log.info("pod %s: %s (%.2f ms)", decision.pod, decision.message, elapsed * 1000)
        return decision

    # ------------------------------------------------------------------ its own decisions
    def assume(self, placement: Placement, pod: Mapping[str, Any]) -> None:
        """Count a placement from now on, before its writes: its devices are held and the
        pod's requests count on its node, until the cluster shows them (then nothing moves)
        or :meth:`forget` drops them."""
        uid = pod_uid(pod)
        self._apply(
            self._tracker.assume(
                uid,
                placement.node,
                {claim.key: allocation for claim, allocation in placement.claims},
                placement.bridge_allocation,
                PodSchedulingFacts.from_pod(pod).requests,
            )
        )
        self._volumes.assume(uid, placement.node, PodVolumes.from_pod(pod), placement.volumes)

    def forget(self, pod: str) -> None:
        """The placement assumed for the pod with UID ``pod`` will not be written (or was
        rolled back): drop what the cluster has not shown yet."""
        self._apply(self._tracker.forget(pod))
        self._volumes.forget(pod)

    # ------------------------------------------------------------------ the cluster
    def observe_allocation(
        self, claim: str, allocation: AllocationResult | None, *, bridge_of: str | None = None
    ) -> None:
        """The cluster shows claim ``claim`` (``namespace/name``) with ``allocation`` (None:
        unallocated, or gone). ``bridge_of``: the UID of the pod whose KEP-5004 bridge claim
        it is (so an assumed bridge allocation is recognised when its claim appears)."""
        self._apply(self._tracker.observe_allocation(claim, allocation, bridge_of=bridge_of))

    def observe_pod(
        self,
        pod: str,
        node: str | None,
        requests: Mapping[str, int] | None = None,
        volumes: PodVolumes | None = None,
    ) -> None:
        """The pod with UID ``pod`` counts on ``node`` with ``requests`` and ``volumes`` (node
        None: it is gone or finished). Any pod counts, whichever scheduler placed it."""
        self._apply(self._tracker.observe_pod(pod, node, requests or {}))
        self._volumes.observe_pod(pod, node, volumes)

    def observe_volume(self, kind: str, key: str, raw: Mapping[str, Any] | None) -> None:
        """An object the volume rules read (a kind of
        :data:`~driver.scheduling.volumes.VOLUME_KINDS`, raw API JSON; ``key`` its
        ``namespace/name`` or name) appeared, changed or (None) went. Raises
        :class:`~driver.api.errors.ManifestError` for a malformed one (nothing changes)."""
        self._volumes.observe(kind, key, raw)

    def observe_node(self, name: str, node: Node | None) -> bool:
        """A node appeared, changed or (None) went. Returns whether anything scheduling reads
        changed (a heartbeat does not); the node is re-filed before the next decision."""
        if not _replace(self._nodes, name, node):
            return False
        self._node_changes.add(name)
        return True

    def observe_slice(self, name: str, resource_slice: ResourceSlice | None) -> bool:
        """A ResourceSlice appeared, changed or (None) went; see :meth:`observe_node`. A
        node-local slice re-files its node only; any other change rebuilds the index."""
        held = self._slices.get(name)
        if not _replace(self._slices, name, resource_slice):
            return False
        self._slice_changes.setdefault(name, held)
        return True

    def observe_class(self, name: str, device_class: DeviceClass | None) -> bool:
        """A DeviceClass appeared, changed or (None) went; see :meth:`observe_node`. The
        index is rebuilt (every device's kind may change)."""
        if not _replace(self._classes, name, device_class):
            return False
        self._rebuild_due = self._base_changed = True
        return True

    # ------------------------------------------------------------------ upkeep
    def sync(self) -> bool:
        """Bring the index up to date with what was observed, rebuilding it when nodes,
        slices or classes changed (:meth:`decide` does this itself). True when it rebuilt."""
        if self._rebuild_due or (
            (self._slice_changes or self._node_changes) and not self._update()
        ):
            self._rebuild()
            return True
        if self._stale:
            for name in sorted(self._stale):
                node = self._nodes.get(name)
                if node is not None:
                    self._index.refresh(self.snapshot, node)
            self._stale.clear()
        return False

    def device_classes(self, driver: str, pool: str, device: str) -> frozenset[str] | None:
        """The DeviceClasses whose selectors select device ``driver/pool/device`` (a CEL error
        counts as selecting, as for the index); None when no node sees the device. What a
        scheduler's queueing hints ask: which waiting pods a freed device may help."""
        self.sync()
        for name in self._index.nodes_holding((driver, pool)):
            node = self._nodes.get(name)
            if node is None:
                continue
            for cand in self.snapshot.candidates(node).devices:
                found = cand.device_id
                if found.device == device and found.pool == pool and found.driver == driver:
                    return self._classifier.classes_of(cand)
        return None

    def state(self) -> EngineState:
        """What the engine counts now (see :class:`EngineState`)."""
        self.sync()
        return EngineState(
            allocated=self.snapshot.allocated,
            usage=self._tracker.usages(),
            nodes=dict(self._nodes),
            filing=self._index.filing(),
            volumes=self._volumes.state(),
        )

    def _apply(self, change: Change) -> None:
        if change.landed:
            self.stats.landed += 1
        if self._rebuild_due or not (change.removed or change.added):
            return  # a rebuild reads the tracker
        snapshot = self.snapshot
        if change.removed:
            snapshot = snapshot.without_allocations(change.removed)
        if change.added:
            snapshot = snapshot.with_allocations(change.added)
        self.snapshot = snapshot
        for allocation in (*change.removed, *change.added):
            for result in allocation.results:
                self._stale.update(self._index.nodes_holding((result.driver, result.pool)))

    def _rebuild(self) -> None:
        started = time.perf_counter()
        snapshot = self.snapshot
        if self._base_changed:
            snapshot = ClusterSnapshot.build(
                self._slices.values(), self._classes.values(), match_cache=snapshot.match_cache
            )
        self.snapshot = snapshot.with_state(self._baseline.with_results(self._tracker.counted()))
        self._derive()
        elapsed = time.perf_counter() - started
        self.stats.rebuilds += 1
        self.stats.rebuild_seconds += elapsed
        log.info(
            "decision engine rebuilt: %d nodes, %d slices, %d classes in %.1f ms",
            len(self._nodes),
            len(self._slices),
            len(self._classes),
            elapsed * 1000,
        )

    def _update(self) -> bool:
        """Apply node and node-local slice changes node by node; False when only a rebuild
        can (a slice that is not node-local, or slices spanning the cluster)."""
        snapshot = self.snapshot
        touched = set(self._node_changes)
        if self._slice_changes:
            removed = [held for held in self._slice_changes.values() if held is not None]
            added = [self._slices[name] for name in self._slice_changes if name in self._slices]
            updated = snapshot.with_slices(removed, added)
            if updated is None:
                self._base_changed = True
                return False
            snapshot = updated
            touched |= {s.node_name for s in (*removed, *added) if s.node_name}
        self.snapshot = snapshot
        for name in sorted(touched):
            node = self._nodes.get(name)
            if node is None:
                self._index.remove(name)
                self._allocatable.pop(name, None)
                continue
            self._allocatable[name] = node_allocatable(node)
            self._index.refresh(snapshot, node)
        if self._node_changes:
            self._advertised = _advertised(self._nodes.values())
        self._max_gpu_memory = max((s.max_memory for s in self._index.shapes.values()), default=0)
        self._slice_changes.clear()
        self._node_changes.clear()
        self.stats.updates += 1
        return True

    def _derive(self) -> None:
        """Everything decisions read that follows from the nodes, slices and classes."""
        snapshot = self.snapshot
        self._nodes = dict(sorted(self._nodes.items()))
        self._resource_map = ExtendedResourceMap.from_classes(snapshot.classes.values())
        self._classifier = DeviceClassifier(snapshot.classes)
        self._index = CapacityIndex(snapshot, self._nodes.values(), self._classifier)
        self._usable_kinds: dict[tuple[str, tuple[str, ...], int], _UsableKinds] = {}
        self._no_pruning = self._exhaustive_asked or any(not s.node_name for s in snapshot.slices)
        self._max_gpu_memory = max((s.max_memory for s in self._index.shapes.values()), default=0)
        self._advertised = _advertised(self._nodes.values())
        self._allocatable = {name: node_allocatable(node) for name, node in self._nodes.items()}
        self._rebuild_due = self._base_changed = False
        self._stale.clear()
        self._slice_changes.clear()
        self._node_changes.clear()
        if not self._no_pruning:
            # Each class's own view (what a request with no selectors may use), filed now
            # rather than at the first pod that asks.
            for name in sorted(snapshot.classes):
                self._index.view(self._kinds_for(name, ()).kinds)

    # ------------------------------------------------------------------ per pod
    def _context(self, pod: Mapping[str, Any], claims: Sequence[ResourceClaim]) -> _PodContext:
        facts = PodSchedulingFacts.from_pod(pod)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        policies = policies_for_pod(annotations, self.defaults)
        volumes = self._volumes.pod_context(pod)  # may rule out every node (PreFilter)
        legacy = legacy_resources(
            pod, self._resource_map, max_gpu_memory_bytes=self._max_gpu_memory or None
        )
        check_pod_input(claims, legacy, self.snapshot.classes, self._cluster_facts())
        for claim in claims:
            for request in claim.requests:
                alternatives = (
                    (request.exactly,) if request.exactly is not None else request.first_available
                )
                for alt in alternatives:
                    if alt.device_class_name not in self.snapshot.classes:
                        raise InvalidInputError(
                            f"claim {claim.key}: request {request.name!r}: "
                            f"DeviceClass {alt.device_class_name!r} does not exist"
                        )
            check_claim_config(claim, self.snapshot.classes, self.driver_name)
        return _PodContext(
            name=facts.name,
            pod=pod,
            facts=facts,
            policies=policies,
            legacy=legacy,
            user_claims=tuple(claims),
            to_allocate=tuple(c for c in claims if c.allocation is None),
            allocated_claims=tuple(c for c in claims if c.allocation is not None),
            legacy_resources=legacy.resources,
            exempt=filter_exempt(legacy.resources, legacy.resources),
            volumes=volumes,
        )

    def _cluster_facts(self) -> ClusterFacts:
        """The facts the pod input checks read, kept until the slices or device counts
        change."""
        index = self._index
        key = (index, index.census, self.snapshot.slices)  # compared by identity, then count
        if self._facts is None or self._facts[0] != key:
            facts = cluster_facts(
                self.snapshot.slices,
                self.snapshot.classes,
                self.driver_name,
                index.kind_counts,
                index.kinds,
            )
            self._facts = (key, facts)
        return self._facts[1]

    def _decide(self, pod: Mapping[str, Any], claims: Sequence[ResourceClaim]) -> Decision:
        meta = pod.get("metadata") or {}
        name = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '<unnamed>'}"
        try:
            ctx = self._context(pod, claims)
        except PreFilterRejectedError as exc:
            # kube-scheduler's FitError after a PreFilter rejection: no per-node reasons.
            message = f"0/{len(self._nodes)} nodes are available: {exc}."
            return Unschedulable(pod=name, message=message, reasons={})
        except BiaxialError as exc:
            return PodError(pod=name, message=str(exc))
        try:
            if self._no_pruning:
                return self._exhaustive(ctx)
            return self._pruned(ctx)
        except BiaxialError as exc:
            return PodError(pod=name, message=str(exc))

    # ------------------------------------------------------------------ search
    def _exhaustive(self, ctx: _PodContext) -> Decision:
        reasons: dict[str, int] = {}
        best: _Best | None = None
        evaluated = 0
        for node in self._nodes.values():
            known = ctx.reasons.get(node.name)
            if known is not None:
                reasons[known] = reasons.get(known, 0) + 1
                continue
            outcome = self._evaluate(ctx, node)
            evaluated += 1
            self.stats.nodes_evaluated += 1
            if isinstance(outcome, str):
                reasons[outcome] = reasons.get(outcome, 0) + 1
                continue
            rank = node_rank(ctx.policies.node, outcome.score, node.name)
            if best is None or rank < best.rank:
                best = _Best(rank, outcome, node)
        if best is None:
            return Unschedulable(
                pod=ctx.name,
                message=unschedulable_message(len(self._nodes), reasons),
                reasons=reasons,
            )
        return self._placement(ctx, best, evaluated)

    def _pruned(self, ctx: _PodContext) -> Decision:
        all_claims = list(ctx.to_allocate)
        if ctx.legacy.per_node_memory or (ctx.legacy.resources & self._advertised):
            # Per-node claim variants (percentages, device-plugin nodes): no common bound.
            return self._exhaustive(ctx)
        if ctx.legacy.requests:
            # The bridge claim as it would be on a node where DRA serves everything.
            probe = self._bridge(ctx, frozenset(ctx.legacy.resources), None)
            if probe is not None:
                all_claims.append(probe.claim)
        demand = pod_demand(all_claims)
        if not demand.prunable or not demand.requests or ctx.allocated_claims:
            return self._exhaustive(ctx)
        kinds = self._usable(demand)
        view = self._index.view(
            frozenset().union(*(alt.kinds for alternatives in kinds for alt in alternatives))
        )
        ctx.demand = demand
        ctx.kinds = kinds
        ctx.shape_bounds = {}
        policies = ctx.policies
        policy = policies.node
        sign = -1.0 if policy == "binpack" else 1.0
        states = self._index.states
        by_ident = self._index.by_ident
        heap: list[_Frontier] = []
        serial = 0
        for partition, entries in view.lists[Variant(demand.cores, policy)].items():
            shape_id, level, in_use, group_fresh, _ = partition  # unpacked once: a hot loop
            shape = by_ident[shape_id]
            vshape = view.shapes[shape_id]
            bounds = ctx.shape_bounds.get(shape_id)
            if bounds is None:
                bounds = self._shape_bounds(shape, vshape, demand, kinds)
                ctx.shape_bounds[shape_id] = bounds
            idle = vshape.devices - in_use
            if (
                not bounds.feasible
                or (idle == 0 and level < bounds.level)  # no device takes the smallest request
                or idle < bounds.forced_fresh  # whole devices wanted, fewer idle
                or group_fresh < bounds.group_need  # not enough idle ones side by side
            ):
                continue
            adding = bound_amounts(policies, vshape, partition, bounds)
            name = entries[0].name
            bound = float_score(shape.total, states[name].used, adding, demand.cores)
            heap.append(_frontier((sign * bound, name, serial, entries, 0, adding, shape)))
            serial += 1
        heapq.heapify(heap)
        best: _Best | None = None
        evaluated = 0
        best_key = 0.0
        while heap:
            key, name, _, entries, position, adding, shape = heapq.heappop(heap)
            state = states[name]
            if best is not None and key >= best_key - _EPSILON:
                # Floats order the heap; whether a bound can still win is decided exactly,
                # unless it is clearly worse. Keys pop in order (a list's next bound is no
                # better than its head's) and the best only improves: once one bound is
                # clearly worse, so is every bound left.
                if key > best_key + _EPSILON:
                    break
                exact = node_score(shape.total, state.used, adding, cores=demand.cores)
                if node_rank(policy, exact, name) > best.rank:
                    continue
            node = self._nodes[name]
            evaluated += 1
            self.stats.nodes_evaluated += 1
            # The index's precheck first: it is the cheapest test and fails most often. Its
            # reason is not kept: the filter's reasons come first in kube-scheduler's order.
            if precheck(state, demand, ctx.shape_bounds[shape.ident]) is None:
                outcome = self._evaluate(ctx, node, prechecked=True)
                if isinstance(outcome, str):
                    ctx.reasons[name] = outcome
                else:
                    rank = node_rank(policy, outcome.score, name)
                    if best is None or rank < best.rank:
                        best = _Best(rank, outcome, node)
                        best_key = sign * float(outcome.score)
            if position + 1 < len(entries):
                nxt = entries[position + 1].name
                bound = float_score(shape.total, states[nxt].used, adding, demand.cores)
                heapq.heappush(
                    heap,
                    _frontier((sign * bound, nxt, serial, entries, position + 1, adding, shape)),
                )
                serial += 1
        # Nodes without devices of their own cannot take a device request here (every slice
        # is node-local when pruning is on): they only matter for the failure message.
        if best is None:
            return self._exhaustive(ctx)  # nothing fits: every node's reason is needed
        return self._placement(ctx, best, evaluated)

    def _usable(self, demand: Demand) -> tuple[tuple[_UsableKinds, ...], ...]:
        """Per request alternative, the device kinds it may use (cached per class, selectors
        and what the index knows of the kinds)."""
        index = self._index
        out = []
        for alternatives in demand.requests:
            per_alt = []
            for alt in alternatives:
                key = (alt.device_class, alt.selectors, index.generation)
                found = self._usable_kinds.get(key)
                if found is None:
                    found = self._kinds_for(alt.device_class, alt.selectors)
                    self._usable_kinds[key] = found
                per_alt.append(found)
            out.append(tuple(per_alt))
        return tuple(out)

    def _kinds_for(self, device_class: str, selectors: tuple[str, ...]) -> _UsableKinds:
        index = self._index
        kinds = []
        certain = True
        for kind, facts in index.kinds.items():
            if device_class not in kind.classes:
                continue
            verdicts = [
                self._classifier.verdict(e, kind, facts, index.generation) for e in selectors
            ]
            if False in verdicts:
                continue
            certain = certain and None not in verdicts
            kinds.append(kind)
        return _UsableKinds(frozenset(kinds), certain)

    @staticmethod
    def _shape_bounds(
        shape: NodeShape,
        view: ViewShape,
        demand: Demand,
        kinds: tuple[tuple[_UsableKinds, ...], ...],
    ) -> ShapeBounds:
        usable: Usable = tuple(
            tuple(
                frozenset(i for i, kind in enumerate(shape.kinds) if kind in alt.kinds)
                for alt in alternatives
            )
            for alternatives in kinds
        )
        certain = all(alt.certain for alternatives in kinds for alt in alternatives)
        return shape_bounds(shape, view, demand, usable, certain)

    # ------------------------------------------------------------------ one node
    def _bridge(
        self, ctx: _PodContext, dra: frozenset[str], gpu_memory: int | None
    ) -> _BridgeVariant | None:
        key = _BridgeKey(dra, gpu_memory)
        if key in ctx.bridge_cache:
            return ctx.bridge_cache[key]
        bridge = build_bridge_claim(
            ctx.pod,
            ctx.legacy,
            self._resource_map,
            dra_resources=dra,
            gpu_memory_bytes=gpu_memory,
            driver_name=self.driver_name,
        )
        built: _BridgeVariant | None = None
        if bridge is not None:
            raw = dict(bridge.claim)
            meta = dict(raw["metadata"])
            meta["name"] = BRIDGE_CLAIM_PLACEHOLDER
            meta["uid"] = (
                f"{(ctx.pod.get('metadata') or {}).get('uid') or ctx.name}/extended-resources"
            )
            raw["metadata"] = meta
            built = _BridgeVariant(bridge, ResourceClaim.from_api(raw))
            check_claim_config(built.claim, self.snapshot.classes, self.driver_name)
        ctx.bridge_cache[key] = built
        return built

    def _gpu_memory_for(self, ctx: _PodContext, node: Node) -> int | None:
        if not ctx.legacy.per_node_memory:
            return None
        state = self._index.states.get(node.name)
        if state is None:
            return None
        return min(d.memory for d in state.devices if d.memory > 0) if state.devices else None

    def _evaluate(
        self, ctx: _PodContext, node: Node, *, prechecked: bool = False
    ) -> _NodeOutcome | str:
        """The node's exact outcome for the pod, or the reason it does not fit."""
        outcome = self._outcome(ctx, node, prechecked=prechecked)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "pod %s on node %s: %s",
                ctx.name,
                node.name,
                outcome if isinstance(outcome, str) else f"score {float(outcome.score):.6f}",
            )
        return outcome

    def _outcome(self, ctx: _PodContext, node: Node, *, prechecked: bool) -> _NodeOutcome | str:
        resources = ctx.legacy_resources
        if resources & self._advertised:
            dra = dra_resources_on_node(resources, node.allocatable)
            exempt = filter_exempt(dra, resources)
        else:
            dra, exempt = resources, ctx.exempt
        reason = filter_node(
            ctx.facts,
            node,
            self._tracker.usage(node.name),
            dra_resources=exempt,
            allocatable=self._allocatable[node.name],
        )
        if reason is not None:
            return reason
        volumes: VolumeBindings | None = None
        if ctx.volumes is not None:
            verdict = self._volumes.filter(ctx.volumes, node)
            if isinstance(verdict, str):
                return verdict
            volumes = verdict
        for claim in ctx.allocated_claims:
            selector = claim.allocation.node_selector if claim.allocation else None
            if selector is not None and not node_selector_matches(selector, node):
                return REASON_CLAIM_NODE
        claims = list(ctx.to_allocate)
        bridge = None
        if dra:
            bridge = self._bridge(ctx, frozenset(dra), self._gpu_memory_for(ctx, node))
            if bridge is not None:
                claims.append(bridge.claim)
        state = self._index.states.get(node.name)
        if not claims:
            used = state.used if state else NodeAmounts()
            total = state.shape.total if state else NodeAmounts()
            return _NodeOutcome(
                node_score(total, used, NodeAmounts(), cores=False), (), bridge, volumes
            )
        if (
            state is None
            and not self._no_pruning
            and not self.snapshot.candidates(node).blocked_pools
        ):
            return REASON_NO_GPUS  # (an invalid pool is the allocator's to report, as upstream)
        bounds = ctx.shape_bounds.get(state.shape.ident) if state is not None else None
        if not prechecked and state is not None and bounds is not None and ctx.demand is not None:
            short = precheck(state, ctx.demand, bounds)
            if short is not None:
                return short
        stats = SearchStats()
        self.stats.allocator_calls += 1
        try:
            results = allocate(
                self.snapshot,
                claims,
                node,
                order=gpu_order(ctx.policies.gpu),
                budget=self.budget,
                stats=stats,
            )
        except NodeAllocationError as exc:
            # Upstream's ErrFailedAllocationOnNode (invalid pools on this node): this node is
            # unschedulable with that message; other nodes may still fit.
            return str(exc)
        finally:
            self.stats.search_steps += stats.steps
        if results is None:
            if state is None:
                return REASON_NO_GPUS
            demand = pod_demand(claims)
            if not demand.prunable:
                return REASON_CLAIMS
            view = self._index.view(frozenset())  # the bounds' level is not read here
            bounds = self._shape_bounds(
                state.shape, view.shape(state.shape), demand, self._usable(demand)
            )
            return precheck(state, demand, bounds) or REASON_CLAIMS
        if state is None:
            return _NodeOutcome(Fraction(0), tuple(results), bridge, volumes)
        adding = state.added(results)
        cores = ctx.demand.cores if ctx.demand is not None else pod_demand(claims).cores
        score = node_score(state.shape.total, state.used, adding, cores=cores)
        return _NodeOutcome(score, tuple(results), bridge, volumes)

    def _placement(self, ctx: _PodContext, best: _Best, evaluated: int) -> Placement:
        outcome = best.outcome
        results = list(outcome.results)
        claims = tuple(
            ClaimAllocation(claim, allocation)
            for claim, allocation in zip(
                ctx.to_allocate, results[: len(ctx.to_allocate)], strict=True
            )
        )
        bridge_allocation = results[len(ctx.to_allocate)] if outcome.bridge is not None else None
        return Placement(
            pod=ctx.name,
            node=best.node.name,
            claims=claims,
            bridge=outcome.bridge.bridge if outcome.bridge is not None else None,
            bridge_allocation=bridge_allocation,
            score=outcome.score,
            policies=ctx.policies,
            evaluated=evaluated,
            volumes=outcome.volumes
            if outcome.volumes is not None and not outcome.volumes.empty
            else None,
        )

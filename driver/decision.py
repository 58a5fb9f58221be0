"""The decision core: where does one pod go, and with which devices?

Used by ``biaxial simulate`` now and the live controller later. For one pod (its raw JSON and
its ResourceClaims), :meth:`DecisionEngine.decide`:

1. resolves the pod's policies (annotations, defaults), its legacy extended resources
   (KEP-5004 bridge) and its scheduling facts; bad input is a :class:`PodError` for that pod;
2. filters nodes (:mod:`driver.nodefit`), builds the node's variant of the bridge claim,
   allocates *all* the pod's unallocated claims on the node with the allocator, the GPU axis
   ordering devices (:mod:`driver.scoring`), and scores the node on the node axis;
3. picks the best node (ties by name) and returns a :class:`Placement`, or an
   :class:`Unschedulable` with kube-scheduler's per-node reasons.

**Pruning.** A :class:`CapacityIndex` keeps, per node, its device totals and use, and files
every node in sorted lists by (node shape, free-memory level, devices in use). For a pod, the
engine computes per node shape an *optimistic bound* of the node score (the most the pod can
add under binpack, the least under spread), walks nodes best bound first across the lists
(a heap merge), evaluates them exactly, and stops as soon as no remaining node can beat the
best exact (score, name) found. Nodes whose largest free GPU memory is too small are never
visited. The result is identical to evaluating every node (tests compare both on small
clusters); :class:`DecisionEngine` takes ``exhaustive=True`` for that reference. Pruning is
switched off (exhaustive evaluation) when the cluster has slices that are not node-local or a
pod asks for ``All`` devices, where the bounds would not hold.

The engine holds state (the snapshot, the index, per-node pod requests). :meth:`assume`
records a placement so the next decision sees it; :meth:`forget` reverses it. Decisions never
mutate their inputs.
"""

from __future__ import annotations

import heapq
import logging
import time
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from driver.allocator import DEFAULT_SEARCH_BUDGET, SearchStats, allocate
from driver.bridge import (
    GPU_RESOURCE,
    MODIFIER_RESOURCES,
    BridgeClaim,
    ExtendedResourceMap,
    PodLegacyResources,
    build_bridge_claim,
    dra_resources_on_node,
    legacy_resources,
)
from driver.claims import AllocationResult, DeviceResult, ResourceClaim
from driver.errors import BiaxialError, InvalidInputError
from driver.ids import DeviceID, NodeName
from driver.model import Device
from driver.nodefit import (
    NodeUsage,
    PodSchedulingFacts,
    filter_node,
    unschedulable_message,
)
from driver.nodes import Node, node_selector_matches
from driver.policy import PodPolicies, PolicyDefaults, policies_for_pod
from driver.quantity import NANO, Quantity
from driver.scoring import (
    CORES,
    MEMORY,
    NodeAmounts,
    consumption,
    gpu_order,
    node_dims,
    node_rank,
    node_score,
)
from driver.snapshot import ClusterSnapshot

log = logging.getLogger(__name__)

BRIDGE_CLAIM_PLACEHOLDER: Final = "<extended-resources>"
LEVELS: Final = 4
REASON_NO_GPUS: Final = "node(s) had no GPUs"
REASON_GPU_MEMORY: Final = "insufficient GPU memory"
REASON_GPU_CORES: Final = "insufficient GPU cores"
REASON_FREE_GPUS: Final = "insufficient free GPUs"
REASON_CLAIMS: Final = "cannot allocate all claims"
REASON_CLAIM_NODE: Final = "resourceclaim not available on the node"


# --------------------------------------------------------------------------- outcomes


@dataclass(frozen=True, slots=True)
class Placement:
    """The pod fits: its node, the allocation of each claim (pod claims in order, then the
    bridge claim), and the score that won."""

    pod: str
    node: NodeName
    claims: tuple[tuple[ResourceClaim, AllocationResult], ...]
    bridge: BridgeClaim | None
    bridge_allocation: AllocationResult | None
    score: Fraction
    policies: PodPolicies
    evaluated: int = 0

    @property
    def all_results(self) -> tuple[AllocationResult, ...]:
        out = [a for _, a in self.claims]
        if self.bridge_allocation is not None:
            out.append(self.bridge_allocation)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """No node fits; ``message`` is kube-scheduler's wording, ``reasons`` the histogram."""

    pod: str
    message: str
    reasons: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PodError:
    """The pod's own input is invalid (unknown class, bad CEL, unknown policy, ...)."""

    pod: str
    message: str


Decision = Placement | Unschedulable | PodError


# --------------------------------------------------------------------------- capacity index


def _units(nanos: int) -> int:
    return -(-nanos // NANO)


def _capacity_units(device: Device, name: str) -> int:
    capacity = device.capacity.get(name)
    return capacity.value.value() if capacity is not None else 0


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One node-local device: capacities and what other claims use of it (whole units)."""

    device_id: DeviceID
    device: Device
    memory: int
    cores: int
    used_memory: int
    used_cores: int
    in_use: bool
    shareable: bool

    @property
    def free_memory(self) -> int:
        if not self.shareable and self.in_use:
            return 0
        return self.memory - self.used_memory

    @property
    def free_cores(self) -> int:
        if not self.shareable and self.in_use:
            return 0
        return self.cores - self.used_cores


@dataclass(frozen=True, slots=True)
class NodeShape:
    """Nodes with the same devices (capacities and policies) share a shape, hence bounds."""

    key: tuple[object, ...]
    total: NodeAmounts
    devices: tuple[Device, ...]  # one representative per distinct device kind
    max_memory: int


@dataclass(frozen=True, slots=True)
class NodeState:
    """The index's view of one node."""

    node: Node
    shape: NodeShape
    devices: tuple[DeviceState, ...]
    used: NodeAmounts
    level: int

    def list_key(self, cores: bool) -> int:
        """Σ_d U_d · Π_{e≠d} T_e over the node dims: proportional to the node's current mean
        utilisation, exact, comparable within one shape."""
        total = self.shape.total
        dims = node_dims(total, cores=cores)
        key = 0
        for dim in dims:
            term = getattr(self.used, dim)
            for other in dims:
                if other != dim:
                    term *= getattr(total, other)
            key += term
        return key


def _device_kind(device: Device) -> tuple[object, ...]:
    return (
        device.allow_multiple_allocations,
        tuple(
            sorted(
                (name, cap.value.nanos, repr(cap.request_policy))
                for name, cap in device.capacity.items()
            )
        ),
    )


class CapacityIndex:
    """Per-node device totals and use, filed in sorted lists for bound-ordered walks.

    Lists are keyed by (shape, level, devices in use, cores-dimension?, policy direction) and
    hold ``(±list_key, node name)`` sorted ascending, so the first entry is the best bound.
    ``refresh(node)`` re-files one node in O(devices on the node + log n).
    """

    def __init__(self, snapshot: ClusterSnapshot, nodes: Iterable[Node]) -> None:
        self.snapshot = snapshot
        self.states: dict[str, NodeState] = {}
        self.shapes: dict[tuple[object, ...], NodeShape] = {}
        self.lists: dict[tuple[object, ...], list[tuple[int, str]]] = {}
        self.deviceless: set[str] = set()
        for node in nodes:
            self._file(node)

    # ------------------------------------------------------------------ state
    def _node_devices(self, node: Node) -> list[tuple[DeviceID, Device]]:
        view = self.snapshot.candidates(node)
        return [(c.device_id, c.device) for c in view.devices if c.node_local and c.node_match]

    def _state(self, node: Node) -> NodeState | None:
        devices = self._node_devices(node)
        if not devices:
            return None
        allocated = self.snapshot.allocated
        states = []
        kinds: dict[tuple[object, ...], Device] = {}
        for device_id, device in devices:
            memory = _capacity_units(device, MEMORY)
            cores = _capacity_units(device, CORES)
            shareable = device.allow_multiple_allocations
            usage = allocated.pool(device_id.driver, device_id.pool)
            if device_id.device in usage.exclusive:
                used_memory, used_cores, in_use = memory, cores, True
            elif device_id.device in usage.shares:
                consumed = usage.capacity.get(device_id.device, {})
                used_memory = _units(consumed.get(MEMORY, 0))
                used_cores = _units(consumed.get(CORES, 0))
                in_use = True
            else:
                used_memory = used_cores = 0
                in_use = False
            states.append(
                DeviceState(
                    device_id, device, memory, cores, used_memory, used_cores, in_use, shareable
                )
            )
            kinds.setdefault(_device_kind(device), device)
        key = tuple(_device_kind(d) for _, d in devices)
        shape = self.shapes.get(key)
        if shape is None:
            total = NodeAmounts(
                devices=len(states),
                memory=sum(s.memory for s in states),
                cores=sum(s.cores for s in states),
            )
            shape = NodeShape(
                key=key,
                total=total,
                devices=tuple(kinds.values()),
                max_memory=max(s.memory for s in states),
            )
            self.shapes[key] = shape
        used = NodeAmounts(
            devices=sum(s.in_use for s in states),
            memory=sum(s.used_memory for s in states),
            cores=sum(s.used_cores for s in states),
        )
        max_free = max(s.free_memory for s in states)
        level = (LEVELS * max_free // shape.max_memory) if shape.max_memory > 0 else LEVELS
        return NodeState(node=node, shape=shape, devices=tuple(states), used=used, level=level)

    def _entries(self, state: NodeState) -> Iterator[tuple[tuple[object, ...], tuple[int, str]]]:
        for cores in (False, True):
            key = state.list_key(cores)
            base = (state.shape.key, state.level, state.used.devices, cores)
            yield (*base, "binpack"), (-key, state.node.name)
            yield (*base, "spread"), (key, state.node.name)

    def _file(self, node: Node) -> None:
        state = self._state(node)
        if state is None:
            self.deviceless.add(node.name)
            self.states.pop(node.name, None)
            return
        self.deviceless.discard(node.name)
        self.states[node.name] = state
        for list_id, entry in self._entries(state):
            insort(self.lists.setdefault(list_id, []), entry)

    def _unfile(self, name: str) -> None:
        state = self.states.pop(name, None)
        if state is None:
            self.deviceless.discard(name)
            return
        for list_id, entry in self._entries(state):
            entries = self.lists[list_id]
            at = bisect_left(entries, entry)
            del entries[at]
            if not entries:
                del self.lists[list_id]

    def refresh(self, snapshot: ClusterSnapshot, node: Node) -> None:
        """Re-read one node after its use changed (and adopt the newer snapshot)."""
        self.snapshot = snapshot
        self._unfile(node.name)
        self._file(node)


# --------------------------------------------------------------------------- demand


@dataclass(frozen=True, slots=True)
class _Alternative:
    count: int
    requests: Mapping[str, Quantity]


@dataclass(frozen=True, slots=True)
class _Demand:
    """The pod's device requests, reduced to what bounds and prechecks need."""

    requests: tuple[tuple[_Alternative, ...], ...]  # per request: its alternatives
    cores: bool  # the node score includes the cores dimension
    prunable: bool


def _demand(claims: Sequence[ResourceClaim]) -> _Demand:
    requests: list[tuple[_Alternative, ...]] = []
    prunable = True
    cores = False
    for claim in claims:
        for request in claim.requests:
            alternatives = (
                (request.exactly,) if request.exactly is not None else request.first_available
            )
            alts = []
            for alt in alternatives:
                if alt.allocation_mode != "ExactCount":
                    prunable = False
                    continue
                if alt.admin_access:
                    prunable = False
                want_cores = alt.capacity_requests.get(CORES)
                if want_cores is not None and want_cores.sign() > 0:
                    cores = True
                alts.append(_Alternative(alt.count, alt.capacity_requests))
            if alts:
                requests.append(tuple(alts))
    return _Demand(requests=tuple(requests), cores=cores, prunable=prunable)


@dataclass(frozen=True, slots=True)
class _ShapeBounds:
    """Per node shape: what the pod can add at most / at least, and the level it needs."""

    memory_max: int
    memory_min: int
    cores_max: int
    cores_min: int
    count_total: int
    count_max_single: int
    forced_fresh: int
    level: int
    feasible: bool


def _shape_bounds(shape: NodeShape, demand: _Demand) -> _ShapeBounds:
    memory_max = memory_min = cores_max = cores_min = 0
    count_total = count_max_single = forced = 0
    min_need: int | None = None
    feasible = True
    for alternatives in demand.requests:
        best: list[tuple[int, int, int, int, int, bool, int]] = []
        for alt in alternatives:
            amounts = [consumption(d, alt.requests) for d in shape.devices]
            usable = [(d, a) for d, a in zip(shape.devices, amounts, strict=True) if a is not None]
            if not usable:
                continue
            mems = [a.get(MEMORY, 0) for _, a in usable]
            cores = [a.get(CORES, 0) for _, a in usable]
            whole = all(
                not d.allow_multiple_allocations or a.get(MEMORY, 0) >= _capacity_units(d, MEMORY)
                for d, a in usable
            )
            best.append(
                (
                    alt.count * max(mems),
                    alt.count * min(mems),
                    alt.count * max(cores),
                    alt.count * min(cores),
                    alt.count,
                    whole,
                    min(mems),
                )
            )
        if not best:
            feasible = False
            continue
        memory_max += max(b[0] for b in best)
        memory_min += min(b[1] for b in best)
        cores_max += max(b[2] for b in best)
        cores_min += min(b[3] for b in best)
        count_total += max(b[4] for b in best)
        count_max_single = max(count_max_single, min(b[4] for b in best))
        if all(b[5] for b in best):
            forced += min(b[4] for b in best)
        need = min(b[6] for b in best)
        min_need = need if min_need is None else min(min_need, need)
    level = 0
    if min_need is not None and shape.max_memory > 0:
        level = LEVELS * min_need // shape.max_memory
    return _ShapeBounds(
        memory_max=memory_max,
        memory_min=memory_min,
        cores_max=cores_max,
        cores_min=cores_min,
        count_total=count_total,
        count_max_single=count_max_single,
        forced_fresh=forced,
        level=level,
        feasible=feasible,
    )


def _bound(
    policy: str, shape: NodeShape, used: NodeAmounts, bounds: _ShapeBounds, cores: bool
) -> Fraction:
    total = shape.total
    if policy == "binpack":
        adding = NodeAmounts(
            devices=min(bounds.count_total, total.devices - used.devices),
            memory=bounds.memory_max,
            cores=bounds.cores_max,
        )
    else:
        adding = NodeAmounts(
            devices=max(bounds.forced_fresh, bounds.count_max_single - used.devices, 0),
            memory=bounds.memory_min,
            cores=bounds.cores_min,
        )
    return node_score(total, used, adding, cores=cores)


# --------------------------------------------------------------------------- per-pod context


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
    bridge_cache: dict[
        tuple[frozenset[str], int | None], tuple[BridgeClaim, ResourceClaim] | None
    ] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _NodeOutcome:
    score: Fraction
    results: tuple[AllocationResult, ...]
    bridge: tuple[BridgeClaim, ResourceClaim] | None


# --------------------------------------------------------------------------- the engine


@dataclass(slots=True)
class DecisionStats:
    """Counters across decisions (for benchmarks and tests)."""

    decisions: int = 0
    nodes_evaluated: int = 0
    allocator_calls: int = 0
    search_steps: int = 0
    seconds: float = 0.0
    durations: list[float] = field(default_factory=list)


class DecisionEngine:
    """Decides pods one at a time against a cluster it keeps up to date with :meth:`assume`."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        nodes: Sequence[Node],
        *,
        defaults: PolicyDefaults | None = None,
        pods_on_nodes: Mapping[str, NodeUsage] | None = None,
        exhaustive: bool = False,
        budget: int = DEFAULT_SEARCH_BUDGET,
    ) -> None:
        self.snapshot = snapshot
        self.nodes: dict[str, Node] = {n.name: n for n in sorted(nodes, key=lambda n: n.name)}
        self.defaults = defaults or PolicyDefaults()
        self.usage: dict[str, NodeUsage] = dict(pods_on_nodes or {})
        self.budget = budget
        self.resource_map = ExtendedResourceMap.from_classes(snapshot.classes.values())
        self.index = CapacityIndex(snapshot, self.nodes.values())
        self.exhaustive = exhaustive or any(not s.node_name for s in snapshot.slices)
        self.max_gpu_memory = max((s.max_memory * 1 for s in self.index.shapes.values()), default=0)
        self.advertised = frozenset(
            name
            for node in self.nodes.values()
            for name, quantity in node.allocatable.items()
            if "/" in name and quantity.sign() > 0
        )
        self.stats = DecisionStats()

    # ------------------------------------------------------------------ public
    def decide(self, pod: Mapping[str, Any], claims: Sequence[ResourceClaim] = ()) -> Decision:
        """Decide one pod. ``claims`` are the pod's ResourceClaims (``spec.resourceClaims``
        order), already created from templates by the caller."""
        started = time.perf_counter()
        try:
            decision = self._decide(pod, claims)
        finally:
            elapsed = time.perf_counter() - started
            self.stats.decisions += 1
            self.stats.seconds += elapsed
            self.stats.durations.append(elapsed)
        return decision

    def assume(self, placement: Placement, pod: Mapping[str, Any]) -> None:
        """Record a placement: its devices are held and the pod's requests count on the node."""
        self.snapshot = self.snapshot.with_allocations(placement.all_results)
        facts = PodSchedulingFacts.from_pod(pod)
        self.usage[placement.node] = self.usage.get(placement.node, NodeUsage()).plus(
            facts.requests
        )
        self.index.refresh(self.snapshot, self.nodes[placement.node])

    # ------------------------------------------------------------------ internals
    def _context(self, pod: Mapping[str, Any], claims: Sequence[ResourceClaim]) -> _PodContext:
        facts = PodSchedulingFacts.from_pod(pod)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        policies = policies_for_pod(annotations, self.defaults)
        legacy = legacy_resources(
            pod, self.resource_map, max_gpu_memory_bytes=self.max_gpu_memory or None
        )
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
        return _PodContext(
            name=facts.name,
            pod=pod,
            facts=facts,
            policies=policies,
            legacy=legacy,
            user_claims=tuple(claims),
            to_allocate=tuple(c for c in claims if c.allocation is None),
            allocated_claims=tuple(c for c in claims if c.allocation is not None),
        )

    def _decide(self, pod: Mapping[str, Any], claims: Sequence[ResourceClaim]) -> Decision:
        meta = pod.get("metadata") or {}
        name = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '<unnamed>'}"
        try:
            ctx = self._context(pod, claims)
        except BiaxialError as exc:
            return PodError(pod=name, message=str(exc))
        try:
            if self.exhaustive:
                return self._exhaustive(ctx)
            return self._pruned(ctx)
        except BiaxialError as exc:
            return PodError(pod=name, message=str(exc))

    def _exhaustive(self, ctx: _PodContext) -> Decision:
        reasons: dict[str, int] = {}
        best: tuple[tuple[Fraction, str], _NodeOutcome, Node] | None = None
        evaluated = 0
        for node in self.nodes.values():
            outcome = self._evaluate(ctx, node)
            evaluated += 1
            self.stats.nodes_evaluated += 1
            if isinstance(outcome, str):
                reasons[outcome] = reasons.get(outcome, 0) + 1
                continue
            rank = node_rank(ctx.policies.node, outcome.score, node.name)
            if best is None or rank < best[0]:
                best = (rank, outcome, node)
        if best is None:
            return Unschedulable(
                pod=ctx.name,
                message=unschedulable_message(len(self.nodes), reasons),
                reasons=reasons,
            )
        return self._placement(ctx, best[2], best[1], evaluated)

    def _pruned(self, ctx: _PodContext) -> Decision:
        all_claims = list(ctx.to_allocate)
        if any(r.memory_percent is not None for r in ctx.legacy.requests) or (
            ctx.legacy.resources & self.advertised
        ):
            # Per-node claim variants (percentages, device-plugin nodes): no common bound.
            return self._exhaustive(ctx)
        if ctx.legacy.requests:
            # The bridge claim as it would be on a node where DRA serves everything.
            probe = self._bridge(ctx, frozenset(ctx.legacy.resources), None)
            if probe is not None:
                all_claims.append(probe[1])
        demand = _demand(all_claims)
        if not demand.prunable or not demand.requests or ctx.allocated_claims:
            return self._exhaustive(ctx)
        policy = ctx.policies.node
        heap: list[tuple[tuple[Fraction, str], int, list[tuple[int, str]], int]] = []
        shape_bounds = {
            key: _shape_bounds(shape, demand) for key, shape in self.index.shapes.items()
        }
        serial = 0
        for list_id, entries in self.index.lists.items():
            shape_key, level, _udev, cores, direction = list_id
            if cores != demand.cores or direction != policy:
                continue
            bounds = shape_bounds[shape_key]  # type: ignore[index]
            if not bounds.feasible or level < bounds.level:  # type: ignore[operator]
                continue
            state = self.index.states[entries[0][1]]
            bound = _bound(policy, state.shape, state.used, bounds, demand.cores)
            heap.append((node_rank(policy, bound, entries[0][1]), serial, entries, 0))
            serial += 1
        heapq.heapify(heap)
        best: tuple[tuple[Fraction, str], _NodeOutcome, Node] | None = None
        evaluated = 0
        while heap:
            rank, _, entries, position = heapq.heappop(heap)
            if best is not None and rank > best[0]:
                break
            name = entries[position][1]
            node = self.nodes[name]
            outcome = self._evaluate(ctx, node)
            evaluated += 1
            self.stats.nodes_evaluated += 1
            if not isinstance(outcome, str):
                exact = node_rank(policy, outcome.score, name)
                if best is None or exact < best[0]:
                    best = (exact, outcome, node)
            if position + 1 < len(entries):
                nxt = entries[position + 1][1]
                state = self.index.states[nxt]
                bounds = shape_bounds[state.shape.key]
                bound = _bound(policy, state.shape, state.used, bounds, demand.cores)
                heapq.heappush(heap, (node_rank(policy, bound, nxt), serial, entries, position + 1))
                serial += 1
        for name in sorted(self.index.deviceless):
            outcome = self._evaluate(ctx, self.nodes[name])
            evaluated += 1
            self.stats.nodes_evaluated += 1
            if not isinstance(outcome, str):
                exact = node_rank(policy, outcome.score, name)
                if best is None or exact < best[0]:
                    best = (exact, outcome, self.nodes[name])
        if best is None:
            return self._exhaustive(ctx)  # nothing fits: every node's reason is needed
        return self._placement(ctx, best[2], best[1], evaluated)

    def _bridge(
        self, ctx: _PodContext, dra: frozenset[str], gpu_memory: int | None
    ) -> tuple[BridgeClaim, ResourceClaim] | None:
        key = (dra, gpu_memory)
        if key in ctx.bridge_cache:
            return ctx.bridge_cache[key]
        bridge = build_bridge_claim(
            ctx.pod, ctx.legacy, self.resource_map, dra_resources=dra, gpu_memory_bytes=gpu_memory
        )
        built: tuple[BridgeClaim, ResourceClaim] | None = None
        if bridge is not None:
            raw = dict(bridge.claim)
            meta = dict(raw["metadata"])
            meta["name"] = BRIDGE_CLAIM_PLACEHOLDER
            meta["uid"] = (
                f"{(ctx.pod.get('metadata') or {}).get('uid') or ctx.name}/extended-resources"
            )
            raw["metadata"] = meta
            built = (bridge, ResourceClaim.from_api(raw))
        ctx.bridge_cache[key] = built
        return built

    def _gpu_memory_for(self, ctx: _PodContext, node: Node) -> int | None:
        if not any(r.memory_percent is not None for r in ctx.legacy.requests):
            return None
        state = self.index.states.get(node.name)
        if state is None:
            return None
        return min(d.memory for d in state.devices if d.memory > 0) if state.devices else None

    def _evaluate(self, ctx: _PodContext, node: Node) -> _NodeOutcome | str:
        """The node's exact outcome for the pod, or the reason it does not fit."""
        dra = dra_resources_on_node(ctx.legacy.resources, node.allocatable)
        exempt = set(dra) | (
            set(MODIFIER_RESOURCES) if GPU_RESOURCE in ctx.legacy.resources else set()
        )
        reason = filter_node(
            ctx.facts, node, self.usage.get(node.name, NodeUsage()), dra_resources=exempt
        )
        if reason is not None:
            return reason
        for claim in ctx.allocated_claims:
            selector = claim.allocation.node_selector if claim.allocation else None
            if selector is not None and not node_selector_matches(selector, node):
                return REASON_CLAIM_NODE
        claims = list(ctx.to_allocate)
        bridge = None
        if dra:
            bridge = self._bridge(ctx, frozenset(dra), self._gpu_memory_for(ctx, node))
            if bridge is not None:
                claims.append(bridge[1])
        state = self.index.states.get(node.name)
        if not claims:
            used = state.used if state else NodeAmounts()
            total = state.shape.total if state else NodeAmounts()
            return _NodeOutcome(node_score(total, used, NodeAmounts(), cores=False), (), bridge)
        if state is None and not self.exhaustive:
            return REASON_NO_GPUS
        demand = _demand(claims)
        if state is not None and demand.prunable and not self.exhaustive:
            short = _precheck(state, demand)
            if short is not None:
                return short
        stats = SearchStats()
        self.stats.allocator_calls += 1
        results = allocate(
            self.snapshot,
            claims,
            node,
            order=gpu_order(ctx.policies.gpu),
            budget=self.budget,
            stats=stats,
        )
        self.stats.search_steps += stats.steps
        if results is None:
            if state is None:
                return REASON_NO_GPUS
            return _precheck(state, demand) or REASON_CLAIMS
        if state is None:
            return _NodeOutcome(Fraction(0), tuple(results), bridge)
        adding = _added(state, results)
        score = node_score(state.shape.total, state.used, adding, cores=demand.cores)
        return _NodeOutcome(score, tuple(results), bridge)

    def _placement(
        self, ctx: _PodContext, node: Node, outcome: _NodeOutcome, evaluated: int
    ) -> Placement:
        results = list(outcome.results)
        claims = tuple(zip(ctx.to_allocate, results[: len(ctx.to_allocate)], strict=True))
        bridge_allocation = results[len(ctx.to_allocate)] if outcome.bridge is not None else None
        return Placement(
            pod=ctx.name,
            node=node.name,
            claims=claims,
            bridge=outcome.bridge[0] if outcome.bridge is not None else None,
            bridge_allocation=bridge_allocation,
            score=outcome.score,
            policies=ctx.policies,
            evaluated=evaluated,
        )


def _precheck(state: NodeState, demand: _Demand) -> str | None:
    """A necessary condition from the index: each request has enough devices with room.
    Returns the kube-style reason when it fails."""
    for alternatives in demand.requests:
        ok = False
        reason = REASON_FREE_GPUS
        for alt in alternatives:
            hosts = 0
            memory_short = cores_short = False
            for device in state.devices:
                amounts = consumption(device.device, alt.requests)
                if amounts is None:
                    memory_short = memory_short or MEMORY in alt.requests
                    cores_short = cores_short or MEMORY not in alt.requests
                    continue
                if not device.shareable:
                    if not device.in_use:
                        hosts += 1
                    continue
                need_memory = amounts.get(MEMORY, 0)
                need_cores = amounts.get(CORES, 0)
                if need_memory > device.free_memory:
                    memory_short = True
                    continue
                if need_cores > device.free_cores:
                    cores_short = True
                    continue
                hosts += 1
            if hosts >= alt.count:
                ok = True
                break
            if hosts == 0 and memory_short and not _whole(state, alt):
                reason = REASON_GPU_MEMORY
            elif hosts == 0 and cores_short:
                reason = REASON_GPU_CORES
        if not ok:
            return reason
    return None


def _whole(state: NodeState, alt: _Alternative) -> bool:
    return alt.requests.get(MEMORY) is None and all(d.shareable for d in state.devices)


def _added(state: NodeState, results: Iterable[AllocationResult]) -> NodeAmounts:
    """What a pod's allocation adds to a node's devices/memory/cores use."""
    by_id = {d.device_id: d for d in state.devices}
    fresh: set[DeviceID] = set()
    memory = cores = 0
    for allocation in results:
        for r in allocation.results:
            device = by_id.get(r.device_id)
            if device is None or r.admin_access:
                continue
            if not device.in_use:
                fresh.add(r.device_id)
            if r.consumed_capacity is None:
                memory += device.memory
                cores += device.cores
            else:
                memory += _quantity_units(r.consumed_capacity.get(MEMORY))
                cores += _quantity_units(r.consumed_capacity.get(CORES))
    return NodeAmounts(devices=len(fresh), memory=memory, cores=cores)


def _quantity_units(quantity: Quantity | None) -> int:
    return quantity.value() if quantity is not None else 0


def device_results(placement: Placement) -> list[tuple[str, DeviceResult]]:
    """(claim key, result) for every device of a placement, bridge claim last."""
    out = [(claim.key, r) for claim, allocation in placement.claims for r in allocation.results]
    if placement.bridge_allocation is not None:
        out.extend((BRIDGE_CLAIM_PLACEHOLDER, r) for r in placement.bridge_allocation.results)
    return out

"""The decision core: where does one pod go, and with which devices?

Used by ``biaxial simulate`` now and the live controller later. For one pod (its raw JSON and
its ResourceClaims), :meth:`DecisionEngine.decide`:

1. resolves the pod's policies (annotations, defaults), its legacy extended resources
   (KEP-5004 bridge, with the dialect annotations of :mod:`driver.scheduling.dialects`) and
   its scheduling facts; bad input is a :class:`PodError` for that pod, including what
   :func:`driver.scheduling.checks.check_pod_input` refuses and a claim whose ``GpuConfig``
   the node would refuse at Prepare (:func:`driver.api.config.check_claim_config`), so nothing
   is allocated for it;
2. filters nodes (:mod:`driver.scheduling.nodefit`), builds the node's variant of the bridge claim,
   allocates *all* the pod's unallocated claims on the node with the allocator, the GPU axis
   ordering devices (:mod:`driver.scheduling.scoring`), and scores the node on the node axis;
3. picks the best node (ties by name) and returns a :class:`Placement`, or an
   :class:`Unschedulable` with kube-scheduler's per-node reasons.

**Pruning.** A :class:`CapacityIndex` keeps, per node, its device totals and use, and files
every node in sorted lists by partition (node shape, largest free memory of a shared device,
devices in use, idle devices side by side, a cores-aware fit level). For a pod, the engine
computes per partition an *optimistic bound* of the node score (the most the pod can add under
binpack, the least under spread; exact for simple pods on uniform classes), walks nodes best
bound first across the lists (a heap merge), evaluates them exactly (index precheck, node
filter, allocator, exact score), and drops a list as soon as its head cannot beat the best
exact (score, name) found. Partitions that cannot hold the pod are never visited. The result is
identical to evaluating every node (tests compare both on random clusters);
:class:`DecisionEngine` takes ``exhaustive=True`` for that reference. Pruning is switched off
(every node evaluated) where a bound would not hold: slices that are not node-local, ``All`` or
admin-access requests, pods with allocated claims, ``gpumem-percentage``, and legacy resources
some node serves through a device plugin. When nothing fits, every node is evaluated for the
kube-scheduler message. ``docs/scoring.md`` explains the bounds.

The engine holds state (the snapshot, the index, per-node pod requests). :meth:`assume`
records a placement so the next decision sees it; :meth:`forget` reverses it. Decisions never
mutate their inputs.
"""

from __future__ import annotations

import heapq
import logging
import re
import time
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from driver.api.claims import AllocationResult, ResourceClaim
from driver.api.config import check_claim_config
from driver.api.errors import BiaxialError, InvalidInputError
from driver.api.ids import DEFAULT_DRIVER_NAME, DeviceID, NodeName
from driver.api.model import Device
from driver.api.nodes import Node, node_selector_matches
from driver.api.quantity import NANO, Quantity
from driver.cel.engine import compile_selector
from driver.scheduling.bridge import (
    BridgeClaim,
    ExtendedResourceMap,
    PodLegacyResources,
    build_bridge_claim,
    dra_resources_on_node,
    filter_exempt,
    legacy_resources,
)
from driver.scheduling.checks import check_pod_input
from driver.scheduling.nodefit import (
    NodeUsage,
    PodSchedulingFacts,
    filter_node,
    node_allocatable,
    unschedulable_message,
)
from driver.scheduling.policy import PodPolicies, PolicyDefaults, policies_for_pod
from driver.scheduling.scoring import (
    CORES,
    MEMORY,
    NUMA_NODE,
    PCIE_ROOT,
    NodeAmounts,
    consumption,
    gpu_order,
    node_dims,
    node_rank,
    node_score,
)
from driver.structured.allocator import DEFAULT_SEARCH_BUDGET, SearchStats, allocate
from driver.structured.snapshot import Candidate, ClusterSnapshot

log = logging.getLogger(f"biaxial.{__name__}")

BRIDGE_CLAIM_PLACEHOLDER: Final = "<extended-resources>"
_EPSILON: Final = 1e-9  # float bounds closer than this to the best are compared exactly
LEVELS: Final = 32
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
    return -(-capacity.value.nanos // NANO) if capacity is not None else 0


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One node-local device: capacities and what other claims use of it (whole units)."""

    device_id: DeviceID
    device: Device
    kind: int  # index into the node shape's distinct device kinds
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
    """Nodes with the same devices (capacities and policies, in order) share a shape, hence
    totals and per-pod bounds."""

    key: tuple[object, ...]
    ident: int  # small integer standing for ``key`` in partitions
    total: NodeAmounts
    kinds: tuple[Device, ...]  # one representative per distinct device kind
    positions: tuple[tuple[int, int, int], ...]  # per device: kind index, memory, cores
    max_memory: int
    max_cores: int

    @property
    def homogeneous(self) -> bool:
        return len(self.kinds) == 1


@dataclass(frozen=True, slots=True)
class NodeState:
    """The index's view of one node. ``level`` is the largest free memory of a device already
    in use (shared), in 1/LEVELS of the shape's largest device (0 when none is in use)."""

    node: Node
    shape: NodeShape
    devices: tuple[DeviceState, ...]
    used: NodeAmounts
    level: int
    group_fresh: int  # most idle devices sharing one NUMA node or one PCIe root
    fit_level: int  # like level, for the scarcer of memory and cores on one shared device

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


def _device_kind(candidate: Candidate) -> tuple[object, ...]:
    """Devices of one kind consume and fit alike: same sharing, capacities and policies."""
    return (candidate.multi, candidate.capacities)


Partition = tuple[int, int, int, int, int]
"""(shape id, level, devices in use, idle devices in one locality group, fit level): nodes
whose bound is monotone in their list key."""
Variant = tuple[bool, str]
"""(cores dimension?, policy direction)."""


class CapacityIndex:
    """Per-node device totals and use, filed in sorted lists for bound-ordered walks.

    ``lists[variant][partition]`` holds ``(±list_key, node name)`` sorted ascending, so the
    first entry has the best bound of its partition. ``refresh(node)`` re-files one node in
    O(devices on the node + n) with a memmove-cheap constant.
    """

    def __init__(self, snapshot: ClusterSnapshot, nodes: Iterable[Node]) -> None:
        self.snapshot = snapshot
        self.states: dict[str, NodeState] = {}
        self.shapes: dict[tuple[object, ...], NodeShape] = {}
        self.by_ident: list[NodeShape] = []
        self.lists: dict[Variant, dict[Partition, list[tuple[int, str]]]] = {
            (cores, direction): {} for cores in (False, True) for direction in ("binpack", "spread")
        }
        self.deviceless: set[str] = set()
        for node in nodes:
            self._file(node)

    # ------------------------------------------------------------------ state
    def _state(self, node: Node) -> NodeState | None:
        view = self.snapshot.candidates(node)
        devices = [c for c in view.devices if c.node_local and c.node_match]
        if not devices:
            return None
        key = tuple([_device_kind(c) for c in devices])
        shape = self.shapes.get(key)
        if shape is None:
            shape = self._shape(key, devices)
        allocated = self.snapshot.allocated
        states = []
        max_free = 0
        max_fit = 0
        for cand, (kind, memory, cores) in zip(devices, shape.positions, strict=True):
            device_id, device = cand.device_id, cand.device
            usage = allocated.pool(device_id.driver, device_id.pool)
            if device_id.device in usage.exclusive:
                used_memory, used_cores, in_use = memory, cores, True
            elif device_id.device in usage.shares:
                consumed = usage.capacity.get(device_id.device, {})
                used_memory = _units(consumed.get(MEMORY, 0))
                used_cores = _units(consumed.get(CORES, 0))
                in_use = True
                max_free = max(max_free, memory - used_memory)
                if shape.max_memory > 0 and shape.max_cores > 0:
                    max_fit = max(
                        max_fit,
                        min(
                            LEVELS * (memory - used_memory) // shape.max_memory,
                            LEVELS * (cores - used_cores) // shape.max_cores,
                        ),
                    )
            else:
                used_memory = used_cores = 0
                in_use = False
            states.append(
                DeviceState(
                    device_id,
                    device,
                    kind,
                    memory,
                    cores,
                    used_memory,
                    used_cores,
                    in_use,
                    device.allow_multiple_allocations,
                )
            )
        used = NodeAmounts(
            devices=sum(s.in_use for s in states),
            memory=sum(s.used_memory for s in states),
            cores=sum(s.used_cores for s in states),
        )
        level = LEVELS * max_free // shape.max_memory if shape.max_memory > 0 else 0
        groups: dict[tuple[str, object], int] = {}
        for device_state in states:
            if device_state.in_use:
                continue
            attributes = device_state.device.attributes
            for attribute in (NUMA_NODE, PCIE_ROOT):
                group = (attribute, attributes.get(attribute))
                groups[group] = groups.get(group, 0) + 1
        return NodeState(
            node=node,
            shape=shape,
            devices=tuple(states),
            used=used,
            level=level,
            group_fresh=max(groups.values(), default=0),
            fit_level=max_fit,
        )

    def _shape(self, key: tuple[object, ...], devices: Sequence[Candidate]) -> NodeShape:
        distinct = list(dict.fromkeys(key))
        representatives = {k: c.device for k, c in zip(key, devices, strict=True)}
        memories = [_capacity_units(c.device, MEMORY) for c in devices]
        cores = [_capacity_units(c.device, CORES) for c in devices]
        shape = NodeShape(
            key=key,
            ident=len(self.by_ident),
            total=NodeAmounts(devices=len(devices), memory=sum(memories), cores=sum(cores)),
            kinds=tuple(representatives[k] for k in distinct),
            positions=tuple(
                (distinct.index(k), m, c) for k, m, c in zip(key, memories, cores, strict=True)
            ),
            max_memory=max(memories),
            max_cores=max(cores),
        )
        self.shapes[key] = shape
        self.by_ident.append(shape)
        return shape

    def _entries(self, state: NodeState) -> Iterator[tuple[Variant, Partition, tuple[int, str]]]:
        partition = (
            state.shape.ident,
            state.level,
            state.used.devices,
            state.group_fresh,
            state.fit_level,
        )
        for cores in (False, True):
            key = state.list_key(cores)
            yield (cores, "binpack"), partition, (-key, state.node.name)
            yield (cores, "spread"), partition, (key, state.node.name)

    def _file(self, node: Node) -> None:
        state = self._state(node)
        if state is None:
            self.deviceless.add(node.name)
            self.states.pop(node.name, None)
            return
        self.deviceless.discard(node.name)
        self.states[node.name] = state
        for variant, partition, entry in self._entries(state):
            insort(self.lists[variant].setdefault(partition, []), entry)

    def _unfile(self, name: str) -> None:
        state = self.states.pop(name, None)
        if state is None:
            self.deviceless.discard(name)
            return
        for variant, partition, entry in self._entries(state):
            partitions = self.lists[variant]
            entries = partitions[partition]
            del entries[bisect_left(entries, entry)]
            if not entries:
                del partitions[partition]

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
    """The pod's device requests, reduced to what bounds and prechecks need.

    ``simple``: one claim, one request, one alternative of one device, no constraints, no
    request selectors, no admin access. For such a pod (on a uniform class, see
    :meth:`DecisionEngine._uniform`) the GPU axis's choice on a node is known from the index
    alone, which makes the bound on the devices dimension exact.
    """

    requests: tuple[tuple[_Alternative, ...], ...]  # per request: its alternatives
    grouped: tuple[str | None, ...]  # per request: matchAttribute on NUMA node or PCIe root
    cores: bool  # the node score includes the cores dimension
    prunable: bool
    simple: bool
    classes: frozenset[str]


def _demand(claims: Sequence[ResourceClaim]) -> _Demand:
    requests: list[tuple[_Alternative, ...]] = []
    grouped: list[str | None] = []
    prunable = True
    cores = False
    selectors = False
    classes: set[str] = set()
    for claim in claims:
        local = {
            name: c.match_attribute
            for c in claim.constraints
            if c.match_attribute in (NUMA_NODE, PCIE_ROOT)
            for name in (c.requests or tuple(r.name for r in claim.requests))
        }
        for request in claim.requests:
            alternatives = (
                (request.exactly,) if request.exactly is not None else request.first_available
            )
            alts = []
            for alt in alternatives:
                classes.add(alt.device_class_name)
                selectors = selectors or bool(alt.selectors)
                if alt.allocation_mode != "ExactCount" or alt.admin_access:
                    prunable = False
                    continue
                want_cores = alt.capacity_requests.get(CORES)
                if want_cores is not None and want_cores.sign() > 0:
                    cores = True
                alts.append(_Alternative(alt.count, alt.capacity_requests))
            if alts:
                requests.append(tuple(alts))
                grouped.append(local.get(request.name))
    simple = (
        prunable
        and len(claims) == 1
        and not claims[0].constraints
        and len(requests) == 1
        and len(requests[0]) == 1
        and requests[0][0].count == 1
        and not selectors
    )
    return _Demand(
        requests=tuple(requests),
        grouped=tuple(grouped),
        cores=cores,
        prunable=prunable,
        simple=simple,
        classes=frozenset(classes),
    )


@dataclass(frozen=True, slots=True)
class _ShapeBounds:
    """Per node shape: what the pod can add at most / at least, the level it needs, and the
    consumption of each request alternative on each device kind (for the precheck)."""

    memory_max: int
    memory_min: int
    cores_max: int
    cores_min: int
    count_total: int
    count_max_single: int
    forced_fresh: int
    level: int
    feasible: bool
    amounts: tuple[tuple[tuple[Mapping[str, int] | None, ...], ...], ...]
    tight: bool  # simple pod, homogeneous shape, a fraction of a shareable device
    needs_cores: bool
    fit_need: int  # the fit level a shared device needs to certainly take a simple pod
    group_need: int  # idle devices one locality group must have (whole, grouped requests)


def _shape_bounds(shape: NodeShape, demand: _Demand, uniform: bool) -> _ShapeBounds:
    memory_max = memory_min = cores_max = cores_min = 0
    count_total = count_max_single = forced = 0
    min_need: int | None = None
    feasible = True
    amounts: list[tuple[tuple[Mapping[str, int] | None, ...], ...]] = []
    partial = False
    needs_cores = False
    group_need = 0
    for alternatives, grouped in zip(demand.requests, demand.grouped, strict=True):
        best: list[tuple[int, int, int, int, int, bool, int]] = []
        per_alt = []
        for alt in alternatives:
            by_kind = tuple(consumption(d, alt.requests) for d in shape.kinds)
            per_alt.append(by_kind)
            usable = [(d, a) for d, a in zip(shape.kinds, by_kind, strict=True) if a is not None]
            if not usable:
                continue
            mems = [a.get(MEMORY, 0) for _, a in usable]
            cores = [a.get(CORES, 0) for _, a in usable]
            needs_cores = needs_cores or max(cores) > 0
            whole = all(
                not d.allow_multiple_allocations or a.get(MEMORY, 0) >= _capacity_units(d, MEMORY)
                for d, a in usable
            )
            partial = partial or not whole
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
        amounts.append(tuple(per_alt))
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
            if grouped:
                group_need = max(group_need, min(b[4] for b in best))
        need = min(b[6] for b in best)
        min_need = need if min_need is None else min(min_need, need)
    level = 0
    if min_need is not None and shape.max_memory > 0:
        level = LEVELS * min_need // shape.max_memory
    fit_need = LEVELS + 1
    if len(amounts) == 1 and len(amounts[0]) == 1 and shape.homogeneous:
        single = amounts[0][0][0]
        if single is not None and shape.max_memory > 0 and shape.max_cores > 0:
            fit_need = max(
                LEVELS * single.get(MEMORY, 0) // shape.max_memory,
                LEVELS * single.get(CORES, 0) // shape.max_cores,
            )
    tight = (
        demand.simple
        and uniform
        and shape.homogeneous
        and shape.kinds[0].allow_multiple_allocations
        and partial
        and feasible
    )
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
        amounts=tuple(amounts),
        tight=tight,
        needs_cores=needs_cores,
        fit_need=fit_need,
        group_need=group_need,
    )


def _devices_bound(
    policies: PodPolicies,
    total: int,
    partition: Partition,
    bounds: _ShapeBounds,
) -> int:
    """The most (node binpack) or least (node spread) devices the pod can newly take."""
    _, level, in_use, _, fit_level = partition
    fresh = total - in_use
    if bounds.tight:
        if policies.gpu == "spread":
            # The emptiest fitting GPU comes first: an idle one while there is one.
            return 1 if fresh > 0 else 0
        if policies.gpu == "binpack":
            # The fullest fitting GPU comes first: a shared one when one certainly fits,
            # an idle one when no shared one has the memory.
            if fit_level > bounds.fit_need or (not bounds.needs_cores and level > bounds.level):
                return 0
            if level < bounds.level:
                return 1 if fresh > 0 else 0
    if policies.node == "binpack":
        return min(bounds.count_total, fresh)
    return max(bounds.forced_fresh, bounds.count_max_single - in_use, 0)


def _bound_amounts(
    policies: PodPolicies, shape: NodeShape, partition: Partition, bounds: _ShapeBounds
) -> NodeAmounts:
    binpack = policies.node == "binpack"
    return NodeAmounts(
        devices=_devices_bound(policies, shape.total.devices, partition, bounds),
        memory=bounds.memory_max if binpack else bounds.memory_min,
        cores=bounds.cores_max if binpack else bounds.cores_min,
    )


def _float_score(total: NodeAmounts, used: NodeAmounts, adding: NodeAmounts, cores: bool) -> float:
    """:func:`node_score` in floating point (heap order only; decisions use the exact one)."""
    score = 0.0
    dims = 0
    if total.devices > 0:
        score += (used.devices + adding.devices) / total.devices
        dims += 1
    if total.memory > 0:
        score += (used.memory + adding.memory) / total.memory
        dims += 1
    if cores and total.cores > 0:
        score += (used.cores + adding.cores) / total.cores
        dims += 1
    return score / dims if dims else 0.0


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
    demand: _Demand | None = None
    legacy_resources: frozenset[str] = frozenset()
    exempt: frozenset[str] = frozenset()  # resources the node filter leaves to DRA
    shape_bounds: dict[int, _ShapeBounds] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


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
        driver_name: str = DEFAULT_DRIVER_NAME,
    ) -> None:
        self.snapshot = snapshot
        self.driver_name = driver_name  # whose opaque config (GpuConfig) the engine checks
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
        self._uniform_cache: dict[str, bool] = {}
        self._allocatable = {name: node_allocatable(node) for name, node in self.nodes.items()}
        if not self.exhaustive:
            # The CEL sweep: which classes select every node-local device everywhere (stops
            # at a class's first non-matching device). Results stay in the snapshot's cache.
            self._uniform(frozenset(snapshot.classes))
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

    def assume(self, placement: Placement, pod: Mapping[str, Any]) -> None:
        """Record a placement: its devices are held and the pod's requests count on the node."""
        self.snapshot = self.snapshot.with_allocations(placement.all_results)
        facts = PodSchedulingFacts.from_pod(pod)
        self.usage[placement.node] = self.usage.get(placement.node, NodeUsage()).plus(
            facts.requests
        )
        self.index.refresh(self.snapshot, self.nodes[placement.node])

    def forget(self, placement: Placement, pod: Mapping[str, Any]) -> None:
        """Undo :meth:`assume` (the write failed, or the pod went away before binding)."""
        self.snapshot = self.snapshot.without_allocations(placement.all_results)
        facts = PodSchedulingFacts.from_pod(pod)
        self.usage[placement.node] = self.usage.get(placement.node, NodeUsage()).minus(
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
        check_pod_input(claims, legacy, self.snapshot, self.driver_name)
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
        if ctx.legacy.per_node_memory or (ctx.legacy.resources & self.advertised):
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
        uniform = self._uniform(demand.classes)
        ctx.demand = demand
        ctx.shape_bounds = {
            shape.ident: _shape_bounds(shape, demand, uniform) for shape in self.index.by_ident
        }
        policies = ctx.policies
        policy = policies.node
        sign = -1.0 if policy == "binpack" else 1.0
        states = self.index.states
        heap: list[tuple[float, str, int, list[tuple[int, str]], int, NodeAmounts, NodeShape]] = []
        serial = 0
        for partition, entries in self.index.lists[(demand.cores, policy)].items():
            shape_id, level, in_use, group_fresh, _ = partition
            bounds = ctx.shape_bounds[shape_id]
            shape = self.index.by_ident[shape_id]
            idle = shape.total.devices - in_use
            if (
                not bounds.feasible
                or (idle == 0 and level < bounds.level)  # no device takes the smallest request
                or idle < bounds.forced_fresh  # whole devices wanted, fewer idle
                or group_fresh < bounds.group_need  # not enough idle ones side by side
            ):
                continue
            adding = _bound_amounts(policies, shape, partition, bounds)
            name = entries[0][1]
            bound = _float_score(shape.total, states[name].used, adding, demand.cores)
            heap.append((sign * bound, name, serial, entries, 0, adding, shape))
            serial += 1
        heapq.heapify(heap)
        best: tuple[tuple[Fraction, str], _NodeOutcome, Node] | None = None
        evaluated = 0
        best_key = 0.0
        while heap:
            key, name, _, entries, position, adding, shape = heapq.heappop(heap)
            state = states[name]
            if best is not None and key >= best_key - _EPSILON:
                # Floats order the heap; whether a bound can still win is decided exactly,
                # unless it is clearly worse.
                if key > best_key + _EPSILON:
                    continue  # nothing left in this partition can beat the best
                exact = node_score(shape.total, state.used, adding, cores=demand.cores)
                if node_rank(policy, exact, name) > best[0]:
                    continue
            node = self.nodes[name]
            evaluated += 1
            self.stats.nodes_evaluated += 1
            # The index's precheck first: it is the cheapest test and fails most often. Its
            # reason is not kept: the filter's reasons come first in kube-scheduler's order.
            if _precheck(state, demand, ctx.shape_bounds[shape.ident]) is None:
                outcome = self._evaluate(ctx, node, prechecked=True)
                if isinstance(outcome, str):
                    ctx.reasons[name] = outcome
                else:
                    rank = node_rank(policy, outcome.score, name)
                    if best is None or rank < best[0]:
                        best = (rank, outcome, node)
                        best_key = sign * float(outcome.score)
            if position + 1 < len(entries):
                nxt = entries[position + 1][1]
                bound = _float_score(shape.total, states[nxt].used, adding, demand.cores)
                heapq.heappush(
                    heap, (sign * bound, nxt, serial, entries, position + 1, adding, shape)
                )
                serial += 1
        # Nodes without devices of their own cannot take a device request here (every slice
        # is node-local when pruning is on): they only matter for the failure message.
        if best is None:
            return self._exhaustive(ctx)  # nothing fits: every node's reason is needed
        return self._placement(ctx, best[2], best[1], evaluated)

    def _uniform(self, classes: frozenset[str]) -> bool:
        """Whether every node-local device of every indexed node passes these classes'
        selectors and nothing else (taints, counters) can set one apart; cached per class."""
        uniform = True
        for name in sorted(classes):
            known = self._uniform_cache.get(name)
            if known is None:
                known = self._class_is_uniform(name)
                self._uniform_cache[name] = known
            uniform = uniform and known
        return uniform

    def _class_is_uniform(self, name: str) -> bool:
        device_class = self.snapshot.classes.get(name)
        cache = self.snapshot.match_cache
        if device_class is None or cache is None:
            return False
        try:
            selectors = [compile_selector(e) for e in device_class.selectors]
            names = [referenced_names(s.expression) for s in selectors]
            keys = [_visible_keys(n) if n is not None else None for n in names]
            seen: set[tuple[object, ...]] = set()
            for state in self.index.states.values():
                for cand in self.snapshot.candidates(state.node).devices:
                    if not cand.node_local or not cand.node_match:
                        continue
                    if cand.blocking_taints or cand.consumes:
                        return False
                    for selector, referenced in zip(selectors, keys, strict=True):
                        if referenced is None:
                            ok = cache.matches(
                                selector, cand.device_id, cand.match_generation, cand.device
                            )
                        else:
                            # Devices that agree on everything the expression can read give
                            # the same answer: evaluate one of them.
                            key = (selector.expression, *_visible(cand, referenced))
                            if key in seen:
                                continue
                            ok = selector.matches(cand.device, cand.device_id.driver)
                            seen.add(key)
                        if not ok:
                            return False
        except BiaxialError:
            return False
        return True

    def _bridge(
        self, ctx: _PodContext, dra: frozenset[str], gpu_memory: int | None
    ) -> tuple[BridgeClaim, ResourceClaim] | None:
        key = (dra, gpu_memory)
        if key in ctx.bridge_cache:
            return ctx.bridge_cache[key]
        bridge = build_bridge_claim(
            ctx.pod,
            ctx.legacy,
            self.resource_map,
            dra_resources=dra,
            gpu_memory_bytes=gpu_memory,
            driver_name=self.driver_name,
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
            check_claim_config(built[1], self.snapshot.classes, self.driver_name)
        ctx.bridge_cache[key] = built
        return built

    def _gpu_memory_for(self, ctx: _PodContext, node: Node) -> int | None:
        if not ctx.legacy.per_node_memory:
            return None
        state = self.index.states.get(node.name)
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
        if resources & self.advertised:
            dra = dra_resources_on_node(resources, node.allocatable)
            exempt = filter_exempt(dra, resources)
        else:
            dra, exempt = resources, ctx.exempt
        reason = filter_node(
            ctx.facts,
            node,
            self.usage.get(node.name, NodeUsage()),
            dra_resources=exempt,
            allocatable=self._allocatable[node.name],
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
        bounds = ctx.shape_bounds.get(state.shape.ident) if state is not None else None
        if not prechecked and state is not None and bounds is not None and ctx.demand is not None:
            short = _precheck(state, ctx.demand, bounds)
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
            demand = _demand(claims)
            if not demand.prunable:
                return REASON_CLAIMS
            return _precheck(state, demand, _shape_bounds(state.shape, demand, False)) or (
                REASON_CLAIMS
            )
        if state is None:
            return _NodeOutcome(Fraction(0), tuple(results), bridge)
        adding = _added(state, results)
        cores = ctx.demand.cores if ctx.demand is not None else _demand(claims).cores
        score = node_score(state.shape.total, state.used, adding, cores=cores)
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


def _precheck(state: NodeState, demand: _Demand, bounds: _ShapeBounds) -> str | None:
    """A necessary condition from the index: each request has enough devices with room.
    Returns the kube-style reason when it fails."""
    for alternatives, per_alt, grouped in zip(
        demand.requests, bounds.amounts, demand.grouped, strict=True
    ):
        ok = False
        reason = REASON_FREE_GPUS
        for alt, by_kind in zip(alternatives, per_alt, strict=True):
            hosts = 0
            groups: dict[object, int] = {}
            memory_short = cores_short = False
            for device in state.devices:
                amounts = by_kind[device.kind]
                if amounts is None:
                    memory_short = memory_short or MEMORY in alt.requests
                    cores_short = cores_short or MEMORY not in alt.requests
                    continue
                if not device.shareable:
                    if device.in_use:
                        continue
                elif amounts.get(MEMORY, 0) > device.free_memory:
                    memory_short = True
                    continue
                elif amounts.get(CORES, 0) > device.free_cores:
                    cores_short = True
                    continue
                hosts += 1
                if grouped is not None:
                    value = device.device.attributes.get(grouped)
                    if value is not None:
                        groups[value] = groups.get(value, 0) + 1
            if hosts >= alt.count:
                if grouped is None or max(groups.values(), default=0) >= alt.count:
                    ok = True
                    break
                reason = REASON_CLAIMS  # enough devices, but not side by side
                continue
            whole = alt.requests.get(MEMORY) is None and all(d.shareable for d in state.devices)
            if hosts == 0 and memory_short and not whole:
                reason = REASON_GPU_MEMORY
            elif hosts == 0 and cores_short:
                reason = REASON_GPU_CORES
        if not ok:
            return reason
    return None


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


_DYNAMIC_ACCESS: Final = re.compile(
    r"\b(?:all|exists|exists_one|map|filter|size|has)\s*\(|\bin\b|[?\\@{]"
)
_LITERAL_INDEX: Final = re.compile(r"\[\s*(\"[^\"\\]*\"|'[^'\\]*')\s*\]")
_TOKEN: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def referenced_names(expression: str) -> frozenset[str] | None:
    """Every name a CEL selector can read from a device, or None when it may read names it
    does not spell out (comprehensions, ``size``, ``has``, ``in``, computed or optional
    indexes, escapes). Conservative: a word anywhere in the text, string literals included,
    counts as referenced."""
    if _DYNAMIC_ACCESS.search(expression):
        return None
    if "[" in _LITERAL_INDEX.sub(" ", expression):
        return None
    words = set(_TOKEN.findall(expression))
    for literal in _LITERAL_INDEX.findall(expression):
        words.update(literal.strip("\"'").split("/"))
    return frozenset(words)


def _visible_keys(names: frozenset[str]) -> frozenset[str]:
    """The attribute / capacity keys a selector reading only ``names`` can reach: a name in
    the driver's domain (unqualified key) or in a domain it spells out (``domain/name``)."""
    domains = [n for n in names if "." in n]
    return names | {f"{d}/{n}" for d in domains for n in names}


def _visible(candidate: Candidate, keys: frozenset[str]) -> tuple[object, ...]:
    """What a selector that reads only ``keys`` sees of a device."""
    device = candidate.device
    attributes = device.attributes
    capacity = device.capacity
    return (
        candidate.device_id.driver,
        device.allow_multiple_allocations,
        tuple((k, attributes[k]) for k in sorted(attributes.keys() & keys)),
        tuple((k, capacity[k].value.nanos) for k in sorted(capacity.keys() & keys)),
    )

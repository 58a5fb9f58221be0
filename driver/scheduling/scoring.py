"""The two-axis scorer: GPU order inside a node, and node ranking, for binpack and spread.

Feasibility is the allocator's job; this module only says which of the feasible choices is
better (STYLE 5). Formulas (worked through in ``docs/scoring.md``):

**Utilisation after placement.** For a dimension ``d`` with capacity ``T_d``, current use
``U_d`` and the pending request's use ``A_d``, the utilisation after placement is
``(U_d + A_d) / T_d``. A score is the mean over the dimensions the request consumes.

**GPU axis** (one request, candidates of one node). Per device, the dimensions are ``memory``
(always, for devices that have it: a request that names no memory takes the whole GPU) and
``cores`` (when the request consumes cores). ``A_d`` is what the request would consume on that
device after the capacity request policy (default, validRange rounding, validValues). For a
device that cannot be shared, ``A_d`` is the requested amount (the fit), so binpack means
best-fit. ``binpack`` puts the highest score first (fill the fullest GPU that still fits),
``spread`` the lowest (the emptiest GPU). Ties break by (driver, pool, device name in natural
order). Multi-device requests (``count > 1``) keep their devices together: candidates are
grouped by PCIe root (``resource.kubernetes.io/pcieRoot``), else NUMA node
(``resource.kubernetes.io/numaNode``); the first group that can hold the whole request by
capacity comes first, preferring under binpack the group whose best ``count`` devices score
highest and under spread lowest; the other groups follow. ``first-fit`` returns None: the
allocator keeps upstream's order.

**Partitionable devices** (dynamic MIG: devices consuming a pool's shared counters). Such a
device fits only while its counters are left (after other claims and this attempt). An
exclusive one (a MIG placement) is scored by the utilisation after placement of its counter
set, the mean over the set's counters of ``(used + taken) / total``: binpack fills the GPU
already most cut, spread the least cut (an uncut GPU first). Within a GPU, ties go to the
placement that **keeps the largest profiles placeable**: after the placement, count for every
size class of the set's devices (largest first: by memory capacity, then cores, then the sum
over its counters of ``amount / total``, which puts ``1g.10gb+me`` above ``1g.10gb``) how many
would still fit, and prefer the lexicographically largest counts; then by name.
``docs/scoring.md`` works an example through.

**Node axis** (one pod, its exact allocation on each feasible node). Dimensions: ``devices``
(devices in use on the node, a device counting once however many claims share it),
``memory`` and, when the pod consumes any, ``cores``; totals are over the node's local
devices. The node score is the mean utilisation after placement, an exact
:class:`~fractions.Fraction` so bounds and ties compare exactly. ``binpack`` prefers the
highest score, ``spread`` the lowest; ties break by node name.

Everything is a pure function of its arguments; same input, same output.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, TypeVar

from driver.api.model import Capacity, Device
from driver.api.quantity import NANO, Quantity
from driver.api.records import builder
from driver.scheduling.policy import GpuPolicy, NodePolicy
from driver.structured.allocator import DeviceOrder, OrderContext
from driver.structured.snapshot import Candidate, CapacitySpec, PoolUsage, PoolView

MEMORY: Final = "memory"
CORES: Final = "cores"
PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
NUMA_NODE: Final = "resource.kubernetes.io/numaNode"

_DIGITS: Final = re.compile(r"(\d+)")

T = TypeVar("T")


@functools.lru_cache(maxsize=65536)
def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """``gpu-2`` before ``gpu-10``: digit runs compare as numbers."""
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in _DIGITS.split(name) if p)


# --------------------------------------------------------------------------- consumption


def _ceil_units(nanos: int) -> int:
    return -(-nanos // NANO)


def _policy_amount(capacity: Capacity, requested: Quantity | None) -> int | None:
    """What one capacity consumes under its request policy, in nano-units, or None when the
    request is not allowed (above max, above every valid value, above the capacity)."""
    value = capacity.value.nanos
    policy = capacity.request_policy
    if policy is None:
        if requested is None:
            return value
        return requested.nanos if requested.nanos <= value else None
    if requested is None:
        return policy.default.nanos if policy.default is not None else value
    amount = requested.nanos
    if policy.valid_values:
        for valid in policy.valid_values:
            if valid.nanos >= amount:
                return valid.nanos
        return None
    rng = policy.valid_range
    if rng is not None:
        low = rng.min.nanos
        amount = max(amount, low)
        if rng.step is not None and rng.step.nanos > 0:
            step = rng.step.nanos
            amount = low + -(-(amount - low) // step) * step
        if rng.max is not None and amount > rng.max.nanos:
            return None
    return amount if amount <= value else None


def consumption(device: Device, requests: Mapping[str, Quantity]) -> dict[str, int] | None:
    """What a request with ``capacity.requests`` would take of ``device``, per capacity, in
    whole units (rounded up).

    A shareable device consumes per its request policies; an exclusive one is taken whole
    (its requests only filter). None when the request cannot be placed on the device at all.
    """
    if any(name not in device.capacity for name in requests):
        return None
    out: dict[str, int] = {}
    for name, capacity in device.capacity.items():
        requested = requests.get(name)
        if not device.allow_multiple_allocations:
            if requested is not None and requested.nanos > capacity.value.nanos:
                return None
            out[name] = _ceil_units(capacity.value.nanos)
            continue
        amount = _policy_amount(capacity, requested)
        if amount is None:
            return None
        out[name] = _ceil_units(amount)
    return out


# --------------------------------------------------------------------------- GPU axis


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """A device's use before the pending request: capacities used and whether any claim
    holds it (whole units: bytes of memory, percent of cores)."""

    used: Mapping[str, int]
    in_use: bool


def gpu_score(device: Device, load: DeviceLoad, adding: Mapping[str, int], *, cores: bool) -> float:
    """Mean utilisation after placement over memory (and cores when consumed)."""
    total = 0.0
    dims = 0
    for name in (MEMORY, CORES) if cores else (MEMORY,):
        capacity = device.capacity.get(name)
        if capacity is None:
            continue
        value = _ceil_units(capacity.value.nanos)
        if value <= 0:
            continue
        total += (load.used.get(name, 0) + adding.get(name, 0)) / value
        dims += 1
    if dims == 0:
        return 1.0 if load.in_use else 0.0
    return total / dims


def _fits(device: Device, load: DeviceLoad, adding: Mapping[str, int]) -> bool:
    if not device.allow_multiple_allocations:
        return not load.in_use
    for name, amount in adding.items():
        capacity = device.capacity.get(name)
        if capacity is not None and load.used.get(name, 0) + amount > _ceil_units(
            capacity.value.nanos
        ):
            return False
    return True


def _locality(device: Device, key: str) -> object | None:
    return device.attributes.get(key)


@dataclass(frozen=True, slots=True)
class ScoredDevice:
    """One candidate with its GPU-axis score; ``tiebreak`` (smaller first, whatever the policy:
    for a MIG placement, the smallest profile, then the placement that keeps the largest
    profiles placeable) and then ``key`` break ties."""

    score: float
    fits: bool
    group: tuple[object | None, object | None]
    key: tuple[object, ...]
    tiebreak: tuple[int, ...] = ()


#: Built once per candidate device each time the allocator orders a request's candidates:
#: without the frozen ``__init__`` (:mod:`driver.api.records`).
_new_scored: Final = builder(ScoredDevice)


def score_devices(
    devices: Sequence[Device],
    loads: Sequence[DeviceLoad],
    requests: Mapping[str, Quantity],
    names: Sequence[tuple[str, str, str]],
) -> list[ScoredDevice]:
    """Score each candidate for one request (``names`` = (driver, pool, device))."""
    wants_cores = requests.get(CORES) is not None and requests[CORES].sign() > 0
    out = []
    for device, load, (driver, pool, name) in zip(devices, loads, names, strict=True):
        adding = consumption(device, requests)
        key = (driver, pool, natural_key(name))
        group = (_locality(device, PCIE_ROOT), _locality(device, NUMA_NODE))
        if adding is None:
            out.append(ScoredDevice(score=0.0, fits=False, group=group, key=key))
            continue
        if not device.allow_multiple_allocations:
            # Exclusive: the fit ratio of what was asked (best-fit under binpack).
            shown = {n: _ceil_units(q.nanos) for n, q in requests.items()}
            if not shown:
                shown = adding
            score = gpu_score(device, DeviceLoad(used={}, in_use=False), shown, cores=wants_cores)
        else:
            score = gpu_score(device, load, adding, cores=wants_cores)
        out.append(
            ScoredDevice(score=score, fits=_fits(device, load, adding), group=group, key=key)
        )
    return out


def order_indices(scored: Sequence[ScoredDevice], policy: GpuPolicy, count: int) -> list[int]:
    """Candidate indices in preference order (all of them; feasibility is not decided here)."""
    indices = list(range(len(scored)))
    if policy == "first-fit":
        return indices
    sign = -1.0 if policy == "binpack" else 1.0

    def device_rank(i: int) -> tuple[object, ...]:
        s = scored[i]
        return (not s.fits, sign * s.score, s.tiebreak, s.key)

    indices.sort(key=device_rank)
    if count <= 1:
        return indices
    for level in (0, 1):  # 0: same PCIe root (and NUMA node), 1: same NUMA node
        groups: dict[object, list[int]] = {}
        for i in indices:
            pcie, numa = scored[i].group
            if (pcie if level == 0 else numa) is None:
                continue
            groups.setdefault((pcie, numa) if level == 0 else numa, []).append(i)
        able = [
            members for members in groups.values() if sum(scored[i].fits for i in members) >= count
        ]
        if not able:
            continue

        def group_rank(members: list[int]) -> tuple[object, ...]:
            best = [scored[i].score for i in members if scored[i].fits][:count]
            return (sign * sum(best) / len(best), scored[members[0]].key)

        able.sort(key=group_rank)
        chosen = [i for members in able for i in members]
        taken = set(chosen)
        return chosen + [i for i in indices if i not in taken]
    return indices


def reorder(items: Sequence[T], order: Sequence[int]) -> list[T]:
    return [items[i] for i in order]


# --------------------------------------------------------------------------- node axis


@dataclass(frozen=True, slots=True)
class NodeAmounts:
    """Device count, memory (bytes) and cores (percent units) on a node: totals or use."""

    devices: int = 0
    memory: int = 0
    cores: int = 0

    def plus(self, other: NodeAmounts) -> NodeAmounts:
        return NodeAmounts(
            self.devices + other.devices, self.memory + other.memory, self.cores + other.cores
        )


def node_dims(total: NodeAmounts, *, cores: bool) -> tuple[str, ...]:
    """The dimensions a node score averages over (those with capacity; cores if consumed)."""
    dims = []
    if total.devices > 0:
        dims.append("devices")
    if total.memory > 0:
        dims.append("memory")
    if cores and total.cores > 0:
        dims.append("cores")
    return tuple(dims)


def node_score(
    total: NodeAmounts, used: NodeAmounts, adding: NodeAmounts, *, cores: bool
) -> Fraction:
    """Mean utilisation after placement, exact: the mean of (used + adding) / total over the
    node's dimensions, summed over a common denominator in integers and reduced once (one
    Fraction, not one per dimension and per sum: weighed for every node evaluated)."""
    dims = node_dims(total, cores=cores)
    if not dims:
        return Fraction(0)
    numerator, denominator = 0, 1
    for dim in dims:
        whole = getattr(total, dim)  # (> 0: node_dims keeps dimensions with capacity)
        numerator = numerator * whole + (getattr(used, dim) + getattr(adding, dim)) * denominator
        denominator *= whole
    return Fraction(numerator, denominator * len(dims))


def node_rank(policy: NodePolicy, score: Fraction, name: str) -> tuple[Fraction, str]:
    """Sort key, smaller is better: binpack wants the highest score, spread the lowest; ties
    by node name."""
    return (-score if policy == "binpack" else score, name)


# --------------------------------------------------------------------------- soft rules

#: The weights of the soft rules' penalties (each in [0, 1]) against the node score (weight
#: 1, in [0, 1]): kube-scheduler's default plugin weights, the node score standing where its
#: NodeResourcesFit score (weight 1) stands. docs/scoring.md explains the choice.
WEIGHT_TAINTS: Final = 3  # PreferNoSchedule taints (TaintToleration)
WEIGHT_NODE_AFFINITY: Final = 2  # preferred node affinity (NodeAffinity)
WEIGHT_POD_AFFINITY: Final = 2  # preferred pod (anti-)affinity (InterPodAffinity)
WEIGHT_SPREAD: Final = 2  # ScheduleAnyway spreading (PodTopologySpread)

Rank = tuple[Fraction, Fraction, str]


def total_score(policy: NodePolicy, score: Fraction, penalty: Fraction) -> Fraction:
    """The node score turned so that higher is better (binpack: the score, spread: its
    negation), minus the weighted penalty of the soft rules."""
    return (score if policy == "binpack" else -score) - penalty


def rank(policy: NodePolicy, score: Fraction, penalty: Fraction, tie: Fraction, name: str) -> Rank:
    """Sort key, smaller is better: the highest :func:`total_score`, then the smallest
    tie-break penalty (the System default spreading), then the node name."""
    return (-total_score(policy, score, penalty), tie, name)


def best_node(policy: NodePolicy, scored: Sequence[tuple[Fraction, str]]) -> tuple[Fraction, str]:
    """The winner among (score, node name) pairs."""
    return min(scored, key=lambda pair: node_rank(policy, pair[0], pair[1]))


# --------------------------------------------------------------------------- shared counters


CounterVerdict = tuple[bool, float, tuple[int, ...]]
"""(fits, utilisation of its counter set before placement, tiebreak: its size rank, smallest
first, then minus how many members of each size class, largest first, would still fit after
it) of one device that consumes counters."""

_NO_FIT: Final[CounterVerdict] = (False, 0.0, ())


@dataclass(frozen=True, slots=True)
class CounterGeometry:
    """One counter set and the devices that consume only from it (a dynamic-MIG GPU and its
    placements), as integer vectors over the set's counters in name order."""

    counters: tuple[str, ...]
    totals: tuple[int, ...]
    members: tuple[tuple[int, ...], ...]  # each distinct consumption vector
    classes: tuple[tuple[tuple[int, ...], ...], ...]  # members by size class, largest first
    ranks: tuple[int, ...]  # per member: its size class counted from the smallest (0)

    def utilisation(self, free: tuple[int, ...]) -> float:
        """Mean over the counters of ``used / total`` when ``free`` is what is left."""
        parts = [(t - f) / t for t, f in zip(self.totals, free, strict=True) if t > 0]
        return sum(parts) / len(parts) if parts else 0.0

    def placeable(self, free: tuple[int, ...]) -> tuple[int, ...]:
        """Per size class, largest first: how many members still fit in ``free``."""
        return tuple(
            sum(all(v <= f for v, f in zip(vec, free, strict=True)) for vec in members)
            for members in self.classes
        )

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - geometries are few and live long
    def verdicts(self, free: tuple[int, ...]) -> Mapping[tuple[int, ...], CounterVerdict]:
        """Every member's verdict when ``free`` is left (one table per GPU state, shared by
        every GPU and node of the same model in that state)."""
        out: dict[tuple[int, ...], CounterVerdict] = {}
        cut = self.utilisation(free)
        for vec, rank in zip(self.members, self.ranks, strict=True):
            after = tuple(f - v for f, v in zip(free, vec, strict=True))
            if any(a < 0 for a in after):
                out[vec] = _NO_FIT
            else:
                out[vec] = (True, cut, (rank, *(-n for n in self.placeable(after))))
        return out


Size = tuple[int, int, Fraction]
"""How large a member is: (memory capacity, cores capacity, sum over its counters of
``amount / total``), compared as a tuple."""


@functools.lru_cache(maxsize=256)
def _geometry(
    counters: tuple[str, ...],
    totals: tuple[int, ...],
    members: tuple[tuple[tuple[int, ...], tuple[int, int]], ...],
) -> CounterGeometry:
    """``members``: (consumption vector, (memory, cores) capacity) of each distinct member."""

    def size(vec: tuple[int, ...], capacity: tuple[int, int]) -> Size:
        share = sum((Fraction(v, t) for v, t in zip(vec, totals, strict=True) if t > 0), Fraction())
        return (*capacity, share)

    sized = [(size(vec, capacity), vec) for vec, capacity in members]
    sizes = sorted({s for s, _ in sized}, reverse=True)
    classes = tuple(tuple(vec for s, vec in sized if s == size_) for size_ in sizes)
    rank = {size_: len(sizes) - 1 - i for i, size_ in enumerate(sizes)}
    return CounterGeometry(
        counters,
        totals,
        tuple(vec for _, vec in sized),
        classes,
        tuple(rank[s] for s, _ in sized),
    )


@dataclass(frozen=True, slots=True)
class PoolCounters:
    """A pool's counter sets as geometries, and what each consuming device takes: ``vectors``
    (device -> (set, vector)) for devices taking from exactly one set, ``flat`` (device ->
    [(set index, counter index, amount)]) for all of them."""

    names: tuple[str, ...]
    geometries: tuple[CounterGeometry, ...]
    vectors: Mapping[str, tuple[int, tuple[int, ...]]]
    flat: Mapping[str, tuple[tuple[int, int, int], ...]]


_POOL_COUNTERS: Final[weakref.WeakKeyDictionary[PoolView, PoolCounters]] = (
    weakref.WeakKeyDictionary()
)


#: Pools that publish the same counters (every node of one GPU model and dynamic-MIG setting)
#: share one :class:`PoolCounters`, found by content: comparing is several times cheaper than
#: building, and a node's first visit would otherwise pay the build.
_BY_CONTENT: Final[dict[tuple[object, ...], PoolCounters]] = {}
_MAX_BY_CONTENT: Final = 256


def pool_counters(pool: PoolView) -> PoolCounters:
    """The counter geometries of a pool (cached per pool view, one per node, for as long as
    the view lives; shared by pools with the same content)."""
    cached = _POOL_COUNTERS.get(pool)
    if cached is None:
        key = _content(pool)
        cached = _BY_CONTENT.get(key)
        if cached is None:
            cached = _build_pool_counters(pool)
            if len(_BY_CONTENT) >= _MAX_BY_CONTENT:
                _BY_CONTENT.clear()
            _BY_CONTENT[key] = cached
        _POOL_COUNTERS[pool] = cached
    return cached


def _content(pool: PoolView) -> tuple[object, ...]:
    """Everything :func:`_build_pool_counters` reads of a pool."""
    return (
        tuple((name, tuple(sorted(c.items()))) for name, c in sorted(pool.counter_sets.items())),
        tuple(pool.device_counters.items()),
        tuple(
            (d.name, _capacity_nanos(d, MEMORY), _capacity_nanos(d, CORES))
            for s in pool.slices
            for d in s.devices
            if d.consumes_counters
        ),
    )


def _capacity_nanos(device: Device, name: str) -> int:
    capacity = device.capacity.get(name)
    return capacity.value.nanos if capacity is not None else 0


def _build_pool_counters(pool: PoolView) -> PoolCounters:
    names = tuple(sorted(pool.counter_sets))
    index = {name: i for i, name in enumerate(names)}
    order = [tuple(sorted(pool.counter_sets[name])) for name in names]
    positions = [{c: j for j, c in enumerate(counters)} for counters in order]
    members: list[dict[tuple[int, ...], tuple[int, int]]] = [{} for _ in names]
    vectors: dict[str, tuple[int, tuple[int, ...]]] = {}
    capacity = {
        d.name: (_capacity_nanos(d, MEMORY), _capacity_nanos(d, CORES))
        for s in pool.slices
        for d in s.devices
        if d.consumes_counters
    }
    flat: dict[str, tuple[tuple[int, int, int], ...]] = {}
    for device, consumes in pool.device_counters.items():
        entries = tuple(
            (index[set_name], positions[index[set_name]][counter], nanos)
            for set_name, counter, nanos in consumes
            if set_name in index and counter in positions[index[set_name]]
        )
        flat[device] = entries
        sets = {i for i, _, _ in entries}
        if len(sets) != 1:
            continue  # a device spanning sets is no member of a single geometry
        (i,) = sets
        vec = [0] * len(order[i])
        for _, j, nanos in entries:
            vec[j] += nanos
        vectors[device] = (i, tuple(vec))
        size = capacity.get(device, (0, 0))
        members[i][tuple(vec)] = max(members[i].get(tuple(vec), size), size)
    geometries = tuple(
        _geometry(
            order[i],
            tuple(pool.counter_sets[name][c] for c in order[i]),
            tuple(sorted(members[i].items())),
        )
        for i, name in enumerate(names)
    )
    return PoolCounters(names, geometries, vectors, flat)


def free_counters(
    pool: PoolView, usage: PoolUsage, pending: frozenset[str] = frozenset()
) -> tuple[tuple[int, ...], ...]:
    """What is left of each counter set of ``pool`` (in :attr:`PoolCounters.names` order): its
    totals minus what the devices other claims hold (``usage``) and the devices this attempt
    placed (``pending``) consume. Each device consumes once, however many shares it has
    (upstream's counter rule); only devices in use are visited."""
    known = pool_counters(pool)
    left = [list(g.totals) for g in known.geometries]
    for device in {*usage.exclusive, *usage.shares, *pending}:
        for i, j, nanos in known.flat.get(device, ()):
            left[i][j] -= nanos
    return tuple(tuple(v) for v in left)


class CounterVerdicts:
    """The verdicts of one pool's counter-consuming devices in one state (what other claims
    and this attempt hold); each counter set's table is looked up once."""

    __slots__ = ("_free", "_known", "_tables")

    def __init__(self, pool: PoolView, usage: PoolUsage, pending: frozenset[str]) -> None:
        self._known = pool_counters(pool)
        self._free = free_counters(pool, usage, pending)
        self._tables: dict[int, Mapping[tuple[int, ...], CounterVerdict]] = {}

    def of(self, device: str) -> CounterVerdict | None:
        """The :data:`CounterVerdict` of a device that consumes from exactly one counter set
        of the pool; None for any other device."""
        found = self._known.vectors.get(device)
        if found is None:
            return None
        i, vec = found
        table = self._tables.get(i)
        if table is None:
            table = self._known.geometries[i].verdicts(self._free[i])
            self._tables[i] = table
        return table[vec]


# --------------------------------------------------------------------------- allocator hook


def _spec_amount(spec: CapacitySpec, multi: bool, requested: int | None) -> int | None:
    """Nano-units one capacity takes under its request policy (None: not allowed)."""
    if not multi:
        return None if requested is not None and requested > spec.value else spec.value
    if not spec.has_policy:
        if requested is None:
            return spec.value
        return requested if requested <= spec.value else None
    if requested is None:
        return spec.default if spec.default is not None else spec.value
    amount = requested
    if spec.valid_values:
        for valid in spec.valid_values:
            if valid >= amount:
                return valid
        return None
    if spec.range_min is not None:
        amount = max(amount, spec.range_min)
        if spec.range_step:
            amount = (
                spec.range_min + -(-(amount - spec.range_min) // spec.range_step) * spec.range_step
            )
        if spec.range_max is not None and amount > spec.range_max:
            return None
    return amount if amount <= spec.value else None


_Step = tuple[str, int, int | None, bool]
"""One capacity of a device as :func:`_candidate_scores` reads it: name, value (nano-units),
what the request takes of it (:func:`_spec_amount`; None: not allowed) and whether the score
counts it."""


def _steps(
    specs: tuple[CapacitySpec, ...], multi: bool, requests: Mapping[str, int], dims: tuple[str, ...]
) -> tuple[bool, tuple[_Step, ...], tuple[float, int, bool] | None]:
    """What :func:`_candidate_scores` reads of one device's capacity specs for one request:
    whether they name every capacity requested, each spec's :data:`_Step`, and for a device
    that cannot be shared (whose score does not depend on its use) the score's sum, the count
    it is divided by and whether every capacity allows the request (None: shareable)."""
    covers = not requests or requests.keys() <= {spec.name for spec in specs}
    steps = tuple(
        (
            spec.name,
            spec.value,
            _spec_amount(spec, multi, requests.get(spec.name)),
            spec.name in dims and spec.value > 0,
        )
        for spec in specs
    )
    if multi:
        return covers, steps, None
    total = 0.0
    counted = 0
    allowed = True
    for name, value, amount, scored in steps:
        if amount is None:
            allowed = False
            break
        if scored:  # the fit ratio of what was asked (best-fit under binpack)
            total += requests.get(name, value) / value
            counted += 1
    return covers, steps, (total, counted, allowed)


def _candidate_scores(candidates: Sequence[Candidate], ctx: OrderContext) -> list[ScoredDevice]:
    """:func:`score_devices` for the allocator hook, on the candidates' precomputed capacity
    specs (integer nano-units) and the allocated/pending state."""
    requests = {name: q.nanos for name, q in ctx.capacity_requests.items()}
    wants_cores = requests.get(CORES, 0) > 0
    dims = (MEMORY, CORES) if wants_cores else (MEMORY,)
    out = []
    counters_by_pool: dict[PoolView, CounterVerdicts] = {}
    allocated, all_pending = ctx.allocated, ctx.pending
    # Devices alike share one tuple of capacity specs, and a node's candidates mostly one
    # pool: what the specs say of the request is read once per tuple (by identity: the
    # candidates hold them), the pool's use once per run of candidates of one pool.
    read: dict[tuple[int, bool], tuple[bool, tuple[_Step, ...], tuple[float, int, bool] | None]]
    read = {}
    usage_of: tuple[str, str, PoolUsage] | None = None
    for cand in candidates:
        device_id = cand.device_id
        driver, pool, name = device_id.driver, device_id.pool, device_id.device
        key = (driver, pool, natural_key(name))
        attributes = cand.device.attributes
        group = (attributes.get(PCIE_ROOT), attributes.get(NUMA_NODE))
        by_counters: CounterVerdict | None = None
        if cand.consumes:
            verdicts = counters_by_pool.get(cand.pool)
            if verdicts is None:
                usage = allocated.pool(driver, pool)
                placed = frozenset(
                    d.device for d in all_pending if d.driver == driver and d.pool == pool
                )
                verdicts = CounterVerdicts(cand.pool, usage, placed)
                counters_by_pool[cand.pool] = verdicts
            by_counters = verdicts.of(name)
            if by_counters is not None and not cand.multi:
                # Taken, by other claims or this attempt, means its counters are: no fit.
                fits, score, tiebreak = by_counters
                if fits and requests:
                    values = {spec.name: spec.value for spec in cand.capacities}
                    fits = all(name in values and n <= values[name] for name, n in requests.items())
                out.append(_new_scored(score, fits, group, key, tiebreak))
                continue
        specs, multi = cand.capacities, cand.multi
        found = read.get((id(specs), multi))
        if found is None:
            found = read[(id(specs), multi)] = _steps(specs, multi, requests, dims)
        covers, steps, fixed = found
        if not covers:
            out.append(_new_scored(0.0, False, group, key))
            continue
        if usage_of is None or usage_of[0] != driver or usage_of[1] != pool:
            usage_of = (driver, pool, allocated.pool(driver, pool))
        usage = usage_of[2]
        exclusive = name in usage.exclusive
        in_use = exclusive or name in usage.shares
        pending = all_pending.get(device_id) if all_pending else None
        if pending is not None:
            in_use = True
            exclusive = exclusive or not pending
        fits = not (exclusive or (in_use and not multi))
        if fixed is not None:  # (not shareable: the sum does not depend on its use)
            total, counted, allowed = fixed
            fits = fits and allowed
        else:
            consumed = usage.capacity.get(name) or {}
            total = 0.0
            counted = 0
            for spec_name, value, amount, scored in steps:
                if amount is None:
                    fits = False
                    break
                used = consumed.get(spec_name, 0) + (pending.get(spec_name, 0) if pending else 0)
                if used + amount > value:
                    fits = False
                if scored:
                    total += (used + amount) / value
                    counted += 1
        score = total / counted if counted else (1.0 if in_use else 0.0)
        if by_counters is not None and not by_counters[0] and not in_use:
            fits = False  # its counters are taken (a partition lives on its GPU)
        out.append(_new_scored(score, fits, group, key))
    return out


def _make_order(policy: GpuPolicy) -> DeviceOrder:
    def order(candidates: Sequence[Candidate], ctx: OrderContext) -> Sequence[Candidate]:
        if len(candidates) <= 1:
            return candidates
        scored = _candidate_scores(candidates, ctx)
        return reorder(candidates, order_indices(scored, policy, ctx.count))

    order.__name__ = f"gpu_{policy}_order"
    return order


_ORDERS: Final[Mapping[str, DeviceOrder]] = {
    "binpack": _make_order("binpack"),
    "spread": _make_order("spread"),
}


def gpu_order(policy: GpuPolicy) -> DeviceOrder | None:
    """The allocator's ``order`` argument for a GPU-axis policy (None = upstream first-fit)."""
    return _ORDERS.get(policy)

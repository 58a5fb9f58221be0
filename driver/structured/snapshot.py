"""The immutable cluster snapshot the allocator reads: slices, classes, and what is in use.

Contract:

* :class:`AllocatedState` is an immutable record of what *other* claims hold: the devices
  allocated exclusively, the shares of multi-allocation devices with their consumed capacity.
  Counter consumption follows from it as upstream computes it: a device that is allocated
  (exclusively or shared) consumes its ``consumesCounters`` from its pool's shared counters
  (see :meth:`ClusterSnapshot.available_counters`). :meth:`AllocatedState.with_results` and
  :meth:`AllocatedState.without_results` cost O(devices changed): the state is a persistent
  map keyed by pool, so an update copies one small bucket and one pool record, never the
  cluster.
* :class:`ClusterSnapshot` indexes slices once (:meth:`ClusterSnapshot.build`).
  :meth:`ClusterSnapshot.candidates` gives a node's visible pools and devices in upstream
  first-fit order (pools by driver then name, pools with binding conditions last, slices by
  name, devices in slice order), incomplete and invalid pools marked; the result is cached per
  node and shared by every snapshot derived with :meth:`ClusterSnapshot.with_allocations`.
  Generations follow upstream ``GatherPools``: the node's slices of a pool at their highest
  generation are used when they add up to ``resourceSliceCount``; otherwise all slices of the
  pool decide: a newer generation anywhere makes the pool obsolete (invisible), too few
  slices make it incomplete.
* Nothing here mutates its inputs. Caches are internal and never change an answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Final

from driver.api.claims import (
    AllocationResult,
    DeviceClass,
    DeviceResult,
    ResourceClaim,
    classes_by_name,
)
from driver.api.errors import AllocationError, ManifestError
from driver.api.ids import DeviceID, DeviceName, DriverName, NodeName, PoolName
from driver.api.model import JSON, Capacity, Device, DeviceTaint, ResourceSlice
from driver.api.nodes import Node, node_selector_matches
from driver.api.quantity import Format
from driver.api.records import builder
from driver.cel.matchcache import MatchCache

PoolKey = tuple[str, str]
"""(driver, pool name)."""

_BUCKETS: Final = 256
_BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


# --------------------------------------------------------------------------- allocated state


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """What other claims hold in one pool. Capacity values are nano-units (ints)."""

    exclusive: frozenset[str] = frozenset()
    shares: Mapping[str, int] = field(default_factory=dict)
    capacity: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def allocated(self, device: str) -> bool:
        """Upstream ``IsDeviceAllocated``: exclusively or by at least one share."""
        return device in self.exclusive or device in self.shares

    @property
    def empty(self) -> bool:
        return not self.exclusive and not self.shares


EMPTY_USAGE: Final = PoolUsage()


def _flatten(results: Iterable[AllocationResult | DeviceResult]) -> list[DeviceResult]:
    out: list[DeviceResult] = []
    for item in results:
        if isinstance(item, AllocationResult):
            out.extend(item.results)
        else:
            out.append(item)
    return out


def _group(results: Iterable[DeviceResult]) -> dict[PoolKey, list[DeviceResult]]:
    grouped: dict[PoolKey, list[DeviceResult]] = {}
    for r in results:
        if r.admin_access:
            # Admin access never blocks others (upstream skips these when gathering state).
            continue
        grouped.setdefault((r.driver, r.pool), []).append(r)
    return grouped


def _apply(usage: PoolUsage, results: Sequence[DeviceResult], sign: int) -> PoolUsage:
    exclusive = set(usage.exclusive)
    shares = dict(usage.shares)
    capacity = {k: dict(v) for k, v in usage.capacity.items()}
    for r in results:
        if r.share_id is None:
            if sign > 0:
                exclusive.add(r.device)
            else:
                exclusive.discard(r.device)
            continue
        count = shares.get(r.device, 0) + sign
        if count > 0:
            shares[r.device] = count
        else:
            shares.pop(r.device, None)
        if r.consumed_capacity is not None:
            # As upstream: only a share that reports consumedCapacity makes the device's
            # capacity "in use" (which also skips its counter check for later shares).
            consumed = capacity.setdefault(r.device, {})
            for name, quantity in r.consumed_capacity.items():
                consumed[name] = consumed.get(name, 0) + sign * quantity.nanos
        if count <= 0:
            capacity.pop(r.device, None)
    return PoolUsage(frozenset(exclusive), shares, capacity)


class AllocatedState:
    """Immutable record of the devices, shares and capacity other claims hold.

    A persistent map from pool to :class:`PoolUsage`, split into 256 buckets, so deriving a
    new state touches only the buckets and pools of the devices that changed.
    """

    __slots__ = ("_buckets",)

    _buckets: tuple[Mapping[PoolKey, PoolUsage], ...]

    def __init__(self, buckets: tuple[Mapping[PoolKey, PoolUsage], ...] | None = None) -> None:
        object.__setattr__(self, "_buckets", buckets if buckets is not None else ({},) * _BUCKETS)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("AllocatedState is immutable")

    # ------------------------------------------------------------------ construction
    @classmethod
    def empty(cls) -> AllocatedState:
        return cls()

    @classmethod
    def from_claims(cls, claims: Iterable[ResourceClaim]) -> AllocatedState:
        """The state held by every allocated claim in ``claims`` (others are ignored)."""
        results: list[DeviceResult] = []
        for claim in claims:
            if claim.allocation is not None:
                results.extend(claim.allocation.results)
        return cls().with_results(results)

    def with_results(self, results: Iterable[AllocationResult | DeviceResult]) -> AllocatedState:
        """A new state with ``results`` added (exclusive devices, shares, their capacity)."""
        return self._update(_flatten(results), +1)

    def without_results(self, results: Iterable[AllocationResult | DeviceResult]) -> AllocatedState:
        """A new state with ``results`` removed again (deallocation)."""
        return self._update(_flatten(results), -1)

    def _update(self, results: list[DeviceResult], sign: int) -> AllocatedState:
        grouped = _group(results)
        if not grouped:
            return self
        buckets = list(self._buckets)
        for key, pool_results in grouped.items():
            index = hash(key) % _BUCKETS
            bucket = dict(buckets[index])
            usage = _apply(bucket.get(key, EMPTY_USAGE), pool_results, sign)
            if usage.empty:
                bucket.pop(key, None)
            else:
                bucket[key] = usage
            buckets[index] = bucket
        return AllocatedState(tuple(buckets))

    # ------------------------------------------------------------------ queries
    def pool(self, driver: str, pool: str) -> PoolUsage:
        """What other claims hold in one pool (EMPTY_USAGE when nothing)."""
        key = (driver, pool)
        return self._buckets[hash(key) % _BUCKETS].get(key, EMPTY_USAGE)

    def is_exclusive(self, device: DeviceID) -> bool:
        """Allocated to another claim without sharing."""
        return device.device in self.pool(device.driver, device.pool).exclusive

    def share_count(self, device: DeviceID) -> int:
        """How many shares of a multi-allocation device other claims hold."""
        return self.pool(device.driver, device.pool).shares.get(device.device, 0)

    def consumed_capacity(self, device: DeviceID) -> Mapping[str, int]:
        """Capacity (nano-units) consumed by other claims' shares of a device."""
        return self.pool(device.driver, device.pool).capacity.get(device.device, {})

    def is_allocated(self, device: DeviceID) -> bool:
        return self.pool(device.driver, device.pool).allocated(device.device)

    def exclusive_devices(self) -> frozenset[DeviceID]:
        """Every exclusively allocated device (O(state); for tests and diagnostics)."""
        return frozenset(
            DeviceID(DriverName(d), PoolName(p), DeviceName(name))
            for bucket in self._buckets
            for (d, p), usage in bucket.items()
            for name in usage.exclusive
        )

    def shared_devices(self) -> Mapping[DeviceID, int]:
        """Share counts of every shared device (O(state); for tests and diagnostics)."""
        return {
            DeviceID(DriverName(d), PoolName(p), DeviceName(name)): count
            for bucket in self._buckets
            for (d, p), usage in bucket.items()
            for name, count in usage.shares.items()
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AllocatedState):
            return NotImplemented
        mine = {k: v for b in self._buckets for k, v in b.items()}
        theirs = {k: v for b in other._buckets for k, v in b.items()}
        return mine == theirs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        pools = sum(len(b) for b in self._buckets)
        return f"AllocatedState(pools={pools})"


# --------------------------------------------------------------------------- node view


@dataclass(frozen=True, slots=True)
class CapacitySpec:
    """One device capacity with its request policy, in nano-units for fast integer math."""

    name: str
    value: int
    fmt: Format
    has_policy: bool = False
    default: int | None = None
    default_fmt: Format = "DecimalSI"
    valid_values: tuple[int, ...] = ()
    valid_value_fmts: tuple[Format, ...] = ()
    range_min: int | None = None
    range_min_fmt: Format = "DecimalSI"
    range_max: int | None = None
    range_step: int | None = None
    # The hash, computed on first use: a device kind is hashed by its capacities at every
    # lookup (twice per device while the index is built, 2 specs each).
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        found = self._hash
        if found is None:
            found = hash(
                (
                    self.name,
                    self.value,
                    self.fmt,
                    self.has_policy,
                    self.default,
                    self.default_fmt,
                    self.valid_values,
                    self.valid_value_fmts,
                    self.range_min,
                    self.range_min_fmt,
                    self.range_max,
                    self.range_step,
                )
            )
            object.__setattr__(self, "_hash", found)
        return found

    def __reduce__(self) -> tuple[type[CapacitySpec], tuple[object, ...]]:
        # (the hash is not carried: a string's hash differs between processes)
        return type(self), tuple(getattr(self, f.name) for f in fields(self) if f.init)


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class PoolView:
    """One visible pool on one node: its slices that target the node, sorted by name.
    Weakly referenceable, so derived facts (the scorer's counter geometries) can be cached
    per view without keeping old snapshots alive."""

    driver: DriverName
    name: PoolName
    generation: int
    slices: tuple[ResourceSlice, ...]
    incomplete: bool = False
    invalid_reason: str = ""
    counter_sets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    device_counters: Mapping[str, tuple[tuple[str, str, int], ...]] = field(default_factory=dict)
    has_binding_conditions: bool = False

    @property
    def invalid(self) -> bool:
        return bool(self.invalid_reason)

    @property
    def key(self) -> PoolKey:
        return (self.driver, self.name)

    def __str__(self) -> str:
        return f"{self.driver}/{self.name}"


@dataclass(frozen=True, slots=True, eq=False)
class Candidate:
    """One device the allocator may pick on one node, with what the search needs precomputed.

    ``index`` is the device's position in upstream first-fit order on this node.
    ``match_generation`` changes whenever the device may have changed (slice UID, name,
    metadata.generation, pool generation); CEL results are cached under it. Identity is object
    identity (candidates are built once per node and cached).
    """

    device_id: DeviceID
    device: Device
    slice_name: str
    slice_generation: int
    pool: PoolView
    index: int
    node_match: bool = True
    node_local: bool = False
    node_selector: JSON | None = None
    multi: bool = False
    capacities: tuple[CapacitySpec, ...] = ()
    blocking_taints: tuple[DeviceTaint, ...] = ()
    consumes: tuple[tuple[str, str, int], ...] = ()
    match_generation: int = 0


#: Candidates (and their device IDs) are built one per device and node (88,000 at 10,000 mixed
#: nodes): without the frozen ``__init__`` (:mod:`driver.api.records`).
_new_candidate: Final = builder(Candidate)
_new_device_id: Final = builder(DeviceID)
#: Built one per visible pool and node (10,000 of each at 10,000 mixed nodes).
_new_pool_view: Final = builder(PoolView)


@dataclass(frozen=True, slots=True, eq=False)
class NodeCandidates:
    """A node's visible pools (all of them, in order) and the devices of the usable ones."""

    node: Node
    pools: tuple[PoolView, ...]
    devices: tuple[Candidate, ...]
    # Selector verdicts per selector set (class selectors, "", request selectors), by index.
    verdicts: dict[tuple[str, ...], list[bool | None]] = field(default_factory=dict)
    # The devices a selector set selects, in order, once every verdict of the set is known.
    selected: dict[tuple[str, ...], tuple[Candidate, ...]] = field(default_factory=dict)

    @property
    def blocked_pools(self) -> tuple[PoolView, ...]:
        """Pools that are incomplete or invalid (skipped for ExactCount, fatal for All)."""
        return tuple(p for p in self.pools if p.incomplete or p.invalid)


#: Built one per node at every index build (:mod:`driver.api.records`).
_new_node_candidates: Final = builder(NodeCandidates)


def _capacity_spec(name: str, cap: Capacity) -> CapacitySpec:
    policy = cap.request_policy
    if policy is None:
        return CapacitySpec(name=name, value=cap.value.nanos, fmt=cap.value.format)
    rng = policy.valid_range
    return CapacitySpec(
        name=name,
        value=cap.value.nanos,
        fmt=cap.value.format,
        has_policy=True,
        default=policy.default.nanos if policy.default is not None else None,
        default_fmt=policy.default.format if policy.default is not None else "DecimalSI",
        valid_values=tuple(v.nanos for v in policy.valid_values),
        valid_value_fmts=tuple(v.format for v in policy.valid_values),
        range_min=rng.min.nanos if rng is not None else None,
        range_min_fmt=rng.min.format if rng is not None else "DecimalSI",
        range_max=rng.max.nanos if rng is not None and rng.max is not None else None,
        range_step=rng.step.nanos if rng is not None and rng.step is not None else None,
    )


def _formats(cap: Capacity) -> tuple[Format, ...]:
    """Every quantity format in a capacity (values compare equal across formats)."""
    policy = cap.request_policy
    if policy is None:
        return (cap.value.format,)
    rng = policy.valid_range
    return (
        cap.value.format,
        policy.default.format if policy.default is not None else "DecimalSI",
        *(v.format for v in policy.valid_values),
        rng.min.format if rng is not None else "DecimalSI",
    )


class _SpecCache:
    """Capacity specs shared by every device that publishes the same capacity (thousands of
    identical GPUs): building them dominates the per-node index cost otherwise."""

    __slots__ = ("_by_identity", "_by_map", "_specs")

    #: Capacity maps whose specs are kept by identity (parsed devices alike share one map:
    #: a handful per cluster; maps not shared are read again once this many are kept).
    MAPS: Final = 4096

    def __init__(self) -> None:
        self._specs: dict[tuple[str, Capacity, tuple[Format, ...]], CapacitySpec] = {}
        # Parsed and built devices share their Capacity objects: most lookups are by identity
        # (the object is kept, so its id stays its own).
        self._by_identity: dict[tuple[str, int], tuple[Capacity, CapacitySpec]] = {}
        # The same for a device's whole capacity map (parsed devices alike share it).
        self._by_map: dict[int, tuple[Mapping[str, Capacity], tuple[CapacitySpec, ...]]] = {}

    def specs(self, device: Device) -> tuple[CapacitySpec, ...]:
        capacity = device.capacity
        kept = self._by_map.get(id(capacity))
        if kept is not None:
            return kept[1]
        found = self._specs_of(capacity)
        if len(self._by_map) >= self.MAPS:
            self._by_map.clear()
        self._by_map[id(capacity)] = (capacity, found)
        return found

    def _specs_of(self, capacity: Mapping[str, Capacity]) -> tuple[CapacitySpec, ...]:
        out: list[CapacitySpec] = []
        for name in sorted(capacity):
            cap = capacity[name]
            known = self._by_identity.get((name, id(cap)))
            if known is not None:
                out.append(known[1])
                continue
            key = (name, cap, _formats(cap))
            spec = self._specs.get(key)
            if spec is None:
                spec = _capacity_spec(name, cap)
                self._specs[key] = spec
            self._by_identity[(name, id(cap))] = (cap, spec)
            out.append(spec)
        return tuple(out)


@dataclass(frozen=True, slots=True, eq=False)
class _PoolInfo:
    """Everything about one pool at its highest generation, across all its slices."""

    generation: int
    slices: tuple[ResourceSlice, ...]
    incomplete: bool
    invalid_reason: str
    counter_sets: Mapping[str, Mapping[str, int]]
    device_counters: Mapping[str, tuple[tuple[str, str, int], ...]]
    has_binding_conditions: bool


#: Built one per pool and node at every index build (a node-local pool is its node's alone).
_new_pool_info: Final = builder(_PoolInfo)


def _pool_info(current: Sequence[ResourceSlice], generation: int, incomplete: bool) -> _PoolInfo:
    """Validity, shared counters and counter consumption of one pool's slices at one
    generation (upstream: duplicate device names, duplicate or missing counter sets)."""
    invalid = ""
    names: set[str] = set()
    counter_sets: dict[str, dict[str, int]] = {}
    device_counters: dict[str, tuple[tuple[str, str, int], ...]] = {}
    binding = False
    for s in current:
        for cs in s.shared_counters:
            if cs.name in counter_sets:
                invalid = invalid or f"duplicate counter set {cs.name!r}"
            counter_sets[cs.name] = {k: v.nanos for k, v in cs.counters.items()}
    for s in current:
        for d in s.devices:
            if d.name in names:
                invalid = invalid or f"duplicate device name {d.name!r}"
            names.add(d.name)
            if not d.consumes_counters and not d.binding_conditions:
                continue  # (most devices: nothing more to read)
            binding = binding or bool(d.binding_conditions)
            flat: list[tuple[str, str, int]] = []
            for consumption in d.consumes_counters:
                counters = counter_sets.get(consumption.name)
                if counters is None:
                    invalid = invalid or (
                        f"device {d.name!r} consumes from unknown counter set {consumption.name!r}"
                    )
                    continue
                for counter, quantity in consumption.counters.items():
                    if counter not in counters:
                        invalid = invalid or (
                            f"device {d.name!r} consumes unknown counter {counter!r} "
                            f"of counter set {consumption.name!r}"
                        )
                    flat.append((consumption.name, counter, quantity.nanos))
            if flat:
                device_counters[d.name] = tuple(flat)
    return _new_pool_info(
        generation=generation,
        slices=tuple(current),
        incomplete=incomplete,
        invalid_reason=invalid,
        counter_sets=counter_sets,
        device_counters=device_counters,
        has_binding_conditions=binding,
    )


def _by_name(s: ResourceSlice) -> str:
    return s.name


def _device_matches_node(device: Device, node: Node, where: str) -> bool:
    """Upstream ``NodeMatches`` for per-device node selection."""
    if device.node_name:
        return device.node_name == node.name
    if device.all_nodes:
        return True
    if device.node_selector is not None:
        return node_selector_matches(device.node_selector, node, where)
    return False


def _slice_targets(s: ResourceSlice, node: Node) -> bool:
    if s.node_name:
        return s.node_name == node.name
    if s.all_nodes:
        return True
    where = f"ResourceSlice {s.name!r}"  # (not for a node-local slice: one per node at start)
    if s.node_selector is not None:
        return node_selector_matches(s.node_selector, node, f"{where}: spec.nodeSelector")
    if s.per_device_node_selection:
        return any(
            _device_matches_node(d, node, f"{where}: device {d.name!r} nodeSelector")
            for d in s.devices
        )
    return False  # unknown node selection: skipped, as upstream does


class _Index:
    """Slices indexed once; shared by every snapshot derived from one build()."""

    __slots__ = (
        "by_node",
        "cluster_wide",
        "info_cache",
        "match_cache",
        "node_cache",
        "pool_generation",
        "pool_slices",
        "slices",
        "spec_cache",
    )

    def __init__(self, slices: tuple[ResourceSlice, ...], match_cache: MatchCache | None) -> None:
        self.slices = slices
        self.by_node: dict[str, list[ResourceSlice]] = {}
        self.cluster_wide: list[ResourceSlice] = []
        self.pool_slices: dict[PoolKey, list[ResourceSlice]] = {}
        self.pool_generation: dict[PoolKey, int] = {}
        for s in slices:
            if s.node_name:
                self.by_node.setdefault(s.node_name, []).append(s)
            else:
                self.cluster_wide.append(s)
            key = (s.driver, s.pool.name)
            self.pool_slices.setdefault(key, []).append(s)
            if s.pool.generation > self.pool_generation.get(key, -1):
                self.pool_generation[key] = s.pool.generation
        self.info_cache: dict[tuple[PoolKey, int, bool, tuple[int, ...]], _PoolInfo] = {}
        self.node_cache: dict[str, NodeCandidates] = {}
        self.match_cache = match_cache
        self.spec_cache = _SpecCache()

    def updated(
        self, removed: Sequence[ResourceSlice], added: Sequence[ResourceSlice]
    ) -> _Index | None:
        """This index with node-local slices replaced, sharing everything the change does not
        touch (the other nodes' candidates, pool facts and the caches); None when a changed
        slice is not node-local or slices span the cluster (then build anew)."""
        if self.cluster_wide or any(not s.node_name for s in (*removed, *added)):
            return None
        gone = {id(s) for s in removed}
        nodes = {s.node_name for s in (*removed, *added) if s.node_name}
        pools = {(s.driver, s.pool.name) for s in (*removed, *added)}
        index = _Index.__new__(_Index)
        index.slices = (*(s for s in self.slices if id(s) not in gone), *added)
        index.by_node = dict(self.by_node)
        index.pool_slices = dict(self.pool_slices)
        index.pool_generation = dict(self.pool_generation)
        for node in nodes:
            index.by_node[node] = [s for s in self.by_node.get(node, ()) if id(s) not in gone]
        for pool in pools:
            kept = [s for s in self.pool_slices.get(pool, ()) if id(s) not in gone]
            index.pool_slices[pool] = kept
        for s in added:
            index.by_node[str(s.node_name)].append(s)
            index.pool_slices[(s.driver, s.pool.name)].append(s)
        for node in nodes:
            if not index.by_node[node]:
                del index.by_node[node]
        for pool in pools:
            members = index.pool_slices[pool]
            if members:
                index.pool_generation[pool] = max(m.pool.generation for m in members)
            else:
                del index.pool_slices[pool]
                index.pool_generation.pop(pool, None)
        index.cluster_wide = []
        # Pool facts are keyed by their members' identities: drop the changed pools' (an id
        # can be reused once a slice is gone).
        index.info_cache = {k: v for k, v in self.info_cache.items() if k[0] not in pools}
        # Every node a changed pool's slices target gets its candidates rebuilt.
        touched = nodes | {
            m.node_name for pool in pools for m in self.pool_slices.get(pool, ()) if m.node_name
        }
        index.node_cache = {k: v for k, v in self.node_cache.items() if k not in touched}
        index.match_cache = self.match_cache
        index.spec_cache = self.spec_cache
        return index

    def candidates(self, node: Node) -> NodeCandidates:
        cached = self.node_cache.get(node.name)
        if cached is not None and (
            cached.node is node or (cached.node.labels == node.labels or not self.cluster_wide)
        ):
            return cached
        built = self._build(node)
        self.node_cache[node.name] = built
        return built

    def _build(self, node: Node) -> NodeCandidates:
        relevant: dict[PoolKey, list[ResourceSlice]] = {}
        try:
            for s in (*self.by_node.get(node.name, ()), *self.cluster_wide):
                if _slice_targets(s, node):
                    relevant.setdefault((s.driver, s.pool.name), []).append(s)
        except ManifestError as exc:
            raise AllocationError(f"node {node.name}: gather pool information: {exc}") from exc
        views: list[PoolView] = []
        for key, node_slices in relevant.items():
            found = self._pool(key, node_slices)
            if found is None:
                continue
            current, info = found
            views.append(
                _new_pool_view(
                    driver=DriverName(key[0]),
                    name=PoolName(key[1]),
                    generation=info.generation,
                    slices=current,
                    incomplete=info.incomplete,
                    invalid_reason=info.invalid_reason,
                    counter_sets=info.counter_sets,
                    device_counters=info.device_counters,
                    has_binding_conditions=info.has_binding_conditions,
                )
            )
        views.sort(key=lambda p: (p.has_binding_conditions, p.driver, p.name))
        devices: list[Candidate] = []
        for pool in views:
            if pool.incomplete or pool.invalid:
                continue
            for s in pool.slices:
                self._candidates(node, pool, s, devices)
        return _new_node_candidates(node=node, pools=tuple(views), devices=tuple(devices))

    def _pool(
        self, key: PoolKey, node_slices: list[ResourceSlice]
    ) -> tuple[tuple[ResourceSlice, ...], _PoolInfo] | None:
        """Upstream ``GatherPools`` for one pool: the node's slices at their highest
        generation; when those do not add up to ``resourceSliceCount``, every slice of the pool
        decides (a newer generation anywhere makes the pool obsolete: None; too few slices
        make it incomplete). Returns the node's slices (by name) and the pool's facts."""
        generation = max(s.pool.generation for s in node_slices)
        current = tuple(
            sorted((s for s in node_slices if s.pool.generation == generation), key=_by_name)
        )
        expected = current[0].pool.resource_slice_count
        members = current
        if len(current) != expected:
            if self.pool_generation[key] > generation:
                return None
            members = tuple(
                sorted(
                    (s for s in self.pool_slices[key] if s.pool.generation == generation),
                    key=_by_name,
                )
            )
        incomplete = len(members) != expected
        cache_key = (key, generation, incomplete, tuple(id(s) for s in members))
        info = self.info_cache.get(cache_key)
        if info is None:
            info = _pool_info(members, generation, incomplete)
            self.info_cache[cache_key] = info
        return current, info

    def _candidates(
        self, node: Node, pool: PoolView, s: ResourceSlice, devices: list[Candidate]
    ) -> None:
        """Append the candidates of slice ``s``'s devices to ``devices`` (one loop per slice:
        what the slice decides for all its devices is read once)."""
        generation = hash((s.uid, s.name, s.generation, s.pool.generation))
        driver, pool_name, slice_name, slice_generation = (
            s.driver,
            s.pool.name,
            s.name,
            s.generation,
        )
        per_device = s.per_device_node_selection
        node_match, node_local, selector = True, bool(s.node_name), s.node_selector
        counters, specs = pool.device_counters, self.spec_cache.specs
        for d in s.devices:
            if per_device:
                where = f"ResourceSlice {s.name!r}: device {d.name!r} nodeSelector"
                try:
                    node_match = _device_matches_node(d, node, where)
                except ManifestError as exc:
                    raise AllocationError(f"node {node.name}: {exc}") from exc
                node_local = bool(d.node_name)
                selector = d.node_selector
            devices.append(
                _new_candidate(
                    _new_device_id(driver, pool_name, DeviceName(d.name)),
                    d,
                    slice_name,
                    slice_generation,
                    pool,
                    len(devices),
                    node_match,
                    node_local or d.binds_to_node,
                    selector,
                    d.allow_multiple_allocations,
                    specs(d) if d.capacity else (),
                    tuple([t for t in d.taints if t.effect in _BLOCKING_EFFECTS])
                    if d.taints
                    else (),
                    counters.get(d.name, ()),
                    generation,
                )
            )


class ClusterSnapshot:
    """Slices, classes and allocated state at one instant. Immutable; cheap to derive from."""

    __slots__ = ("_counter_cache", "_index", "allocated", "classes")

    _index: _Index
    classes: Mapping[str, DeviceClass]
    allocated: AllocatedState
    _counter_cache: dict[PoolKey, tuple[PoolUsage, Mapping[str, Mapping[str, int]]]]

    def __init__(
        self, index: _Index, classes: Mapping[str, DeviceClass], allocated: AllocatedState
    ) -> None:
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "classes", classes)
        object.__setattr__(self, "allocated", allocated)
        object.__setattr__(self, "_counter_cache", {})

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ClusterSnapshot is immutable")

    @classmethod
    def build(
        cls,
        slices: Iterable[ResourceSlice],
        classes: Iterable[DeviceClass] | Mapping[str, DeviceClass],
        claims: Iterable[ResourceClaim] = (),
        *,
        match_cache: MatchCache | None = None,
    ) -> ClusterSnapshot:
        """Index ``slices`` and record what the allocated ``claims`` hold.

        ``match_cache`` (``driver.cel.MatchCache``) may be passed to keep CEL results across
        rebuilds; results are keyed by slice generation, so stale entries are never used.
        """
        index = _Index(tuple(slices), match_cache if match_cache is not None else MatchCache())
        cls_map = classes_by_name(classes if isinstance(classes, Mapping) else tuple(classes))
        return cls(index, cls_map, AllocatedState.from_claims(claims))

    def with_slices(
        self, removed: Sequence[ResourceSlice], added: Sequence[ResourceSlice]
    ) -> ClusterSnapshot | None:
        """The same cluster with node-local slices replaced (``removed`` are the objects this
        snapshot holds), sharing every other node's view; None when the change is not
        node-local (then :meth:`build` anew). Allocations stay as they are."""
        index = self._index.updated(removed, added)
        if index is None:
            return None
        return ClusterSnapshot(index, self.classes, self.allocated)

    @property
    def slices(self) -> tuple[ResourceSlice, ...]:
        return self._index.slices

    @property
    def match_cache(self) -> MatchCache | None:
        return self._index.match_cache

    def with_allocations(
        self, results: Iterable[AllocationResult | DeviceResult]
    ) -> ClusterSnapshot:
        """The same cluster with ``results`` held by claims (shares the per-node index)."""
        return ClusterSnapshot(self._index, self.classes, self.allocated.with_results(results))

    def without_allocations(
        self, results: Iterable[AllocationResult | DeviceResult]
    ) -> ClusterSnapshot:
        """The same cluster with ``results`` released again."""
        return ClusterSnapshot(self._index, self.classes, self.allocated.without_results(results))

    def with_state(self, allocated: AllocatedState) -> ClusterSnapshot:
        return ClusterSnapshot(self._index, self.classes, allocated)

    def candidates(self, node: Node) -> NodeCandidates:
        """The node's visible pools and devices in upstream order (cached per node)."""
        return self._index.candidates(node)

    def node_names(self) -> frozenset[NodeName]:
        """Nodes that have node-local slices."""
        return frozenset(NodeName(n) for n in self._index.by_node)

    def available_counters(self, pool: PoolView) -> Mapping[str, Mapping[str, int]]:
        """The pool's shared counters minus what devices allocated to other claims consume
        (may go negative, which upstream treats as nothing available)."""
        usage = self.allocated.pool(pool.driver, pool.name)
        cached = self._counter_cache.get(pool.key)
        if cached is not None and cached[0] is usage:
            return cached[1]
        available = {k: dict(v) for k, v in pool.counter_sets.items()}
        # Only the devices in use consume (each once, however many shares it has).
        for device in {*usage.exclusive, *usage.shares}:
            for set_name, counter, nanos in pool.device_counters.get(device, ()):
                counters = available.get(set_name)
                if counters is not None and counter in counters:
                    counters[counter] -= nanos
        self._counter_cache[pool.key] = (usage, available)
        return available

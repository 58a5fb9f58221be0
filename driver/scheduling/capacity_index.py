"""The capacity index: every node's device totals and use, filed for bound-ordered walks.

Per node, :class:`NodeState` holds its node-local devices (capacities and what other claims
hold of them, in whole units) and the totals and use on the node axis. Devices are grouped in
:class:`DeviceKind` s — same driver, sharing, capacities and policies, the same set of
DeviceClasses selecting them (:mod:`driver.scheduling.classification`), and whether taints or
shared counters can set one apart — and nodes with the same devices share a
:class:`NodeShape` (totals and per-pod bounds are per shape).

A pod can only use the kinds its requests' classes (and selectors) allow, so nodes are filed
per :class:`IndexView`: the index's view for one set of device kinds. Within a view, a node's
:class:`Partition` reads only the view's devices (an idle node's is read once per shape and
device localities: thousands of nodes start alike): its shape, the largest free memory of a shared
device (``level``), a cores-aware "certain fit" level (``fit_level``), both in 1/:data:`LEVELS`
of the largest such device of the shape, the devices in use, and the most idle devices side by
side (``group_fresh``, per NUMA node or PCIe root). Nodes are kept in sorted lists, one per
:class:`Variant` (cores dimension or not, node policy) and partition: within a partition the
bound of the node score is monotone in the list key (the node's whole use), so the first entry
has the best bound. Views are built on first use (a handful per cluster: one per class and
selector mix) and kept up to date with the nodes.

:meth:`CapacityIndex.refresh` re-files one node after its use changed: it re-reads only the
devices whose use (or blocking by shared counters) changed, from the pool use its state was read
from and the new one, reads the node's partition again only in the views those devices belong
to, and moves each list entry once (O(changed devices + views x log n), plus a memmove-cheap
constant), when the view is next read (:meth:`IndexView.settle`: a node changed again in
between moves once); :meth:`CapacityIndex.nodes_holding` says which nodes' states read a pool,
so only those are re-filed when its allocations change.

The index reads the snapshot it is given and never mutates it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from driver.api.claims import AllocationResult, ResourceClaim
from driver.api.ids import DeviceID
from driver.api.model import Device
from driver.api.nodes import Node
from driver.api.quantity import NANO, Quantity
from driver.api.records import builder
from driver.scheduling.classification import DeviceClassifier, KindFacts
from driver.scheduling.policy import NodePolicy
from driver.scheduling.scoring import (
    CORES,
    MEMORY,
    NUMA_NODE,
    PCIE_ROOT,
    NodeAmounts,
    free_counters,
    node_dims,
    pool_counters,
)
from driver.structured.allocator import MAX_CACHED_SELECTOR_SETS
from driver.structured.snapshot import (
    Candidate,
    CapacitySpec,
    ClusterSnapshot,
    NodeCandidates,
    PoolKey,
    PoolUsage,
    PoolView,
)

LEVELS: Final = 32
_CHANGE_LOG: Final = 4096  # partitions a view's change log holds before it starts anew
_DIRECTIONS: Final[tuple[NodePolicy, ...]] = ("binpack", "spread")
_UNKNOWN: Final[Any] = object()  # not looked up yet


def units(nanos: int) -> int:
    """Nano-units rounded up to whole units."""
    return -(-nanos // NANO)


def capacity_units(device: Device, name: str) -> int:
    """One capacity of a device in whole units (0 when the device does not have it)."""
    capacity = device.capacity.get(name)
    return units(capacity.value.nanos) if capacity is not None else 0


def _quantity_units(quantity: Quantity | None) -> int:
    return quantity.value() if quantity is not None else 0


class DeviceKind(NamedTuple):
    """Devices of one kind consume, fit and are selected alike: same driver, sharing,
    capacities and policies, and the same DeviceClasses select them. ``special``: blocking
    taints, shared counters or binding conditions may make one unusable, or not the
    allocator's first choice, whatever its use says. ``counted``: special for its shared
    counters alone, which the index follows (:attr:`DeviceState.blocked`)."""

    driver: str
    multi: bool
    capacities: tuple[CapacitySpec, ...]
    classes: frozenset[str]
    special: bool
    counted: bool = False


class DevicePosition(NamedTuple):
    """One device of a shape: its kind (index into :attr:`NodeShape.kinds`), memory, cores."""

    kind: int
    memory: int
    cores: int


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
    blocked: bool = False  # idle, but other devices hold the shared counters it consumes
    # Its locality groups: (NUMA_NODE, its NUMA node), (PCIE_ROOT, its PCIe root), None
    # where unknown.
    locality: tuple[tuple[str, object], ...] = ()

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
    """Nodes with the same devices (kinds, capacities and policies, in order) share a shape,
    hence totals and per-pod bounds."""

    key: tuple[DeviceKind, ...]
    ident: int  # small integer standing for ``key`` in partitions
    total: NodeAmounts
    kinds: tuple[DeviceKind, ...]  # the distinct device kinds, in first-device order
    representatives: tuple[Device, ...]  # one device per distinct kind
    positions: tuple[DevicePosition, ...]  # per device
    max_memory: int
    max_cores: int


class Source(NamedTuple):
    """What a node's device states were read from, per pool: the pool, its use and its
    devices whose shared counters other devices hold."""

    pool: PoolView
    usage: PoolUsage
    blocked: frozenset[str]


def _list_key(total: NodeAmounts, used: NodeAmounts, cores: bool) -> int:
    """:meth:`NodeState.list_key` of a node with these totals and use."""
    dims = node_dims(total, cores=cores)
    key = 0
    for dim in dims:
        term = getattr(used, dim)
        for other in dims:
            if other != dim:
                term *= getattr(total, other)
        key += term
    return key


@dataclass(frozen=True, slots=True)
class NodeState:
    """The index's view of one node: its devices and its use on the node axis. ``sources``:
    per pool, the use it was read from and the devices blocked then (so a refresh re-reads
    only the devices whose use changed); ``entries``: its list entry per variant, the same in
    every view (:func:`_entries`)."""

    node: Node
    shape: NodeShape
    devices: tuple[DeviceState, ...]
    used: NodeAmounts
    sources: Mapping[PoolKey, Source] = field(default_factory=dict, compare=False)
    entries: tuple[tuple[Variant, FiledNode], ...] = field(default=(), compare=False)
    # Nothing in use or blocked: the number of the devices' localities, in order, among the
    # index's (an idle node's partition in a view follows from its shape and these); -1 not
    # known idle.
    idle_layout: int = field(default=-1, compare=False)

    def list_key(self, cores: bool) -> int:
        """Σ_d U_d · Π_{e≠d} T_e over the node dims: proportional to the node's current mean
        utilisation, exact, comparable within one shape."""
        return _list_key(self.shape.total, self.used, cores)

    def added(self, results: Iterable[AllocationResult]) -> NodeAmounts:
        """What a pod's allocation adds to this node's devices/memory/cores use."""
        picked = [r for allocation in results for r in allocation.results if not r.admin_access]
        # A pod picks a few of a node's devices, which may number hundreds (every placement of
        # a dynamic-MIG GPU): only devices named like a picked one are looked up, by (driver,
        # pool, device) as plain strings (a result's DeviceID is built on each read, and a
        # DeviceID hashes in Python).
        names = {r.device for r in picked}
        by_id: dict[tuple[str, str, str], DeviceState] = {}
        for d in self.devices:
            device_id = d.device_id
            if device_id.device in names:
                by_id[(device_id.driver, device_id.pool, device_id.device)] = d
        fresh: set[tuple[str, str, str]] = set()
        memory = cores = 0
        for r in picked:
            key = (r.driver, r.pool, r.device)
            device = by_id.get(key)
            if device is None:
                continue
            if not device.in_use:
                fresh.add(key)
            if r.consumed_capacity is None:
                memory += device.memory
                cores += device.cores
            else:
                memory += _quantity_units(r.consumed_capacity.get(MEMORY))
                cores += _quantity_units(r.consumed_capacity.get(CORES))
        return NodeAmounts(devices=len(fresh), memory=memory, cores=cores)


class Partition(NamedTuple):
    """Nodes whose bound is monotone in their list key (within one view)."""

    shape: int  # NodeShape.ident
    level: int
    in_use: int  # devices of the view in use
    group_fresh: int  # idle devices of the view in one locality group
    fit_level: int


class Variant(NamedTuple):
    """Which node score a list is sorted by: with the cores dimension or not, per policy."""

    cores: bool
    direction: NodePolicy


class FiledNode(NamedTuple):
    """One list entry: the list key (negated under binpack, so the best comes first)."""

    key: int
    name: str


def score_line(total: NodeAmounts, adding: NodeAmounts, variant: Variant) -> tuple[int, int]:
    """A list's node scores in closed form: with ``adding`` placed, a node of shape totals
    ``total`` filed with list key ``key`` in a ``variant`` list scores ``(key + shift) /
    divisor``, negated under binpack (so smaller is better under both policies) -- exact in
    integers, and one correctly rounded division in floating point (equal scores give equal
    floats, whatever the shape). Returns ``(shift, divisor)``."""
    dims = node_dims(total, cores=variant.cores)
    if not dims:
        return 0, 1  # (no dimension: every key and score is 0)
    product = 1
    for dim in dims:
        product *= getattr(total, dim)
    added = _list_key(total, adding, variant.cores)  # Σ_d A_d · Π_{e≠d} T_e
    return (-added if variant.direction == "binpack" else added), product * len(dims)


class FilingEntry(NamedTuple):
    """What the index knows of one node, comparable between indexes (shape by key, since
    idents differ): for tests, an index kept up to date must equal a fresh one."""

    name: str
    shape: tuple[DeviceKind, ...]
    used: NodeAmounts
    devices: tuple[tuple[str, int, int, bool], ...]  # device, used memory, used cores, in use


@dataclass(frozen=True, slots=True)
class ViewShape:
    """One shape as a view sees it: which of its kinds (by index) belong to the view, and the
    size of the view's devices there."""

    kinds: frozenset[int]
    devices: int
    max_memory: int
    max_cores: int
    positions: tuple[int, ...]  # the view's devices, by position in the node's devices
    position_set: frozenset[int]  # the same, as a set

    @property
    def homogeneous(self) -> bool:
        return len(self.kinds) == 1


def _view_shape(shape: NodeShape, kinds: frozenset[DeviceKind]) -> ViewShape:
    local = frozenset(i for i, kind in enumerate(shape.kinds) if kind in kinds)
    mine = [p for p in shape.positions if p.kind in local]
    positions = tuple(i for i, p in enumerate(shape.positions) if p.kind in local)
    return ViewShape(
        kinds=local,
        devices=len(mine),
        max_memory=max((p.memory for p in mine), default=0),
        max_cores=max((p.cores for p in mine), default=0),
        positions=positions,
        position_set=frozenset(positions),
    )


_KIND_MEMO: Final = 4096  # (driver, sharing, specs tuple, classes, flags) -> kind, kept
_BLOCKED_MEMO: Final = 4096  # (pool geometry, counters left) -> blocked devices, kept


BlockedMemo = dict[tuple[int, tuple[tuple[int, ...], ...]], tuple[object, frozenset[str]]]


def _blocked_in(pool: PoolView, usage: PoolUsage, memo: BlockedMemo) -> frozenset[str]:
    """The devices of ``pool`` whose shared counters other devices hold (they cannot be
    allocated until those are freed). Nodes laid out alike with the same partitions in use
    share one answer: it is kept per (pool geometry, counters left)."""
    if not pool.device_counters or (not usage.exclusive and not usage.shares):
        return frozenset()  # nothing consumes, or nothing in use: nothing blocked
    known = pool_counters(pool)
    left = free_counters(pool, usage)
    key = (id(known), left)
    kept = memo.get(key)
    if kept is not None:
        return kept[1]
    if all(v == g.totals for v, g in zip(left, known.geometries, strict=True)):
        found: frozenset[str] = frozenset()  # nothing consumed: nothing blocked
    else:
        found = frozenset(
            device
            for device, takes in known.flat.items()
            if any(left[i][j] < nanos for i, j, nanos in takes)
        )
    if len(memo) >= _BLOCKED_MEMO:
        memo.clear()
    memo[key] = (known, found)  # (the entry keeps ``known``: its id is not reused)
    return found


def _partition(state: NodeState, view: ViewShape) -> Partition | None:
    """Where a node is filed in a view (None: it has no device of the view). A device whose
    shared counters other devices hold counts as in use: it takes nothing now."""
    if not view.devices:
        return None
    max_free = max_fit = in_use = 0
    # Idle devices per locality group: counted in a plain dict (a Counter costs more to build
    # than the few devices of a node take to count).
    groups: dict[tuple[str, object], int] = {}
    devices = state.devices
    for position in view.positions:
        device = devices[position]
        if device.blocked:
            in_use += 1
            continue
        if not device.in_use:
            for group in device.locality:
                groups[group] = groups.get(group, 0) + 1
            continue
        in_use += 1
        if not device.shareable:
            continue
        free_memory = device.memory - device.used_memory
        max_free = max(max_free, free_memory)
        if view.max_memory > 0 and view.max_cores > 0:
            max_fit = max(
                max_fit,
                min(
                    LEVELS * free_memory // view.max_memory,
                    LEVELS * (device.cores - device.used_cores) // view.max_cores,
                ),
            )
    level = LEVELS * max_free // view.max_memory if view.max_memory > 0 else 0
    return Partition(state.shape.ident, level, in_use, max(groups.values(), default=0), max_fit)


@dataclass(slots=True)
class IndexView:
    """The nodes filed for one set of device kinds (see the module docstring).

    ``lists[variant][partition]`` holds :class:`FiledNode` entries sorted ascending; nodes
    without a device of the view are not filed. ``changes`` logs, in order, each node filed
    into or out of a partition's lists (in every variant alike) since ``epoch`` began, so that
    what a reader derived from the lists can be kept across decisions and brought up to date
    from the changes alone; a new epoch (the log grown past :data:`_CHANGE_LOG`, or every list
    filed anew) means that any list may have changed.

    A change of use is not filed at once (:meth:`refile`): most views are not read before the
    same node changes again (a binpacked node takes pod after pod), so ``pending`` holds, per
    node, the state its entries were filed from and the newest, and :meth:`settle` files each
    node once. ``lists``, ``filed`` and ``changes`` are exact only after :meth:`settle`;
    :meth:`CapacityIndex.view` settles the view it returns.
    """

    kinds: frozenset[DeviceKind]
    shapes: dict[int, ViewShape] = field(default_factory=dict)
    lists: dict[Variant, dict[Partition, list[FiledNode]]] = field(
        default_factory=lambda: {
            Variant(cores, direction): {} for cores in (False, True) for direction in _DIRECTIONS
        }
    )
    filed: dict[str, Partition] = field(default_factory=dict)
    changes: list[tuple[Partition, str]] = field(default_factory=list)
    epoch: int = 0
    # Partitions of idle nodes, by (shape ident, NodeState.idle_layout).
    idle: dict[tuple[int, int], Partition | None] = field(default_factory=dict)
    # Refiles not filed yet, by node (filed here): the state its entries were filed from, the
    # newest state and the positions of the devices changed in between (:meth:`refile`).
    pending: dict[str, tuple[NodeState, NodeState, Collection[int]]] = field(default_factory=dict)

    def _changed(self, partition: Partition, name: str) -> None:
        changes = self.changes
        if len(changes) >= _CHANGE_LOG:
            changes.clear()
            self.epoch += 1
        changes.append((partition, name))

    def shape(self, shape: NodeShape) -> ViewShape:
        found = self.shapes.get(shape.ident)
        if found is None:
            found = _view_shape(shape, self.kinds)
            self.shapes[shape.ident] = found
        return found

    def partition(self, state: NodeState) -> Partition | None:
        """Where ``state`` is filed here (None: it has no device of the view)."""
        layout = state.idle_layout
        if layout < 0:
            return _partition(state, self.shape(state.shape))
        key = (state.shape.ident, layout)
        found = self.idle.get(key, _UNKNOWN)
        if found is _UNKNOWN:
            found = self.idle[key] = _partition(state, self.shape(state.shape))
        return found  # type: ignore[no-any-return]

    def file(self, state: NodeState) -> None:
        partition = self.partition(state)
        if partition is None:
            return
        self.filed[state.node.name] = partition
        for variant, entry in state.entries:
            insort(self.lists[variant].setdefault(partition, []), entry)
        self._changed(partition, state.node.name)

    def file_all(self, states: Iterable[NodeState]) -> None:
        """File many nodes at once (one sort per list instead of one insertion per node)."""
        for state in states:
            partition = self.partition(state)
            if partition is None:
                continue
            self.filed[state.node.name] = partition
            for variant, entry in state.entries:
                self.lists[variant].setdefault(partition, []).append(entry)
        for partitions in self.lists.values():
            for entries in partitions.values():
                entries.sort()
        self.changes.clear()
        self.epoch += 1

    def unfile(self, state: NodeState) -> None:
        """Take out the node of ``state`` (its newest state), as filed here: from the state
        its entries were filed from when a refile of it is pending (dropped)."""
        name = state.node.name
        partition = self.filed.pop(name, None)
        if partition is None:
            return
        deferred = self.pending.pop(name, None)
        if deferred is not None:
            state = deferred[0]
        for variant, entry in state.entries:
            partitions = self.lists[variant]
            entries = partitions[partition]
            del entries[bisect_left(entries, entry)]
            if not entries:
                del partitions[partition]
        self._changed(partition, state.node.name)

    def refile(self, old: NodeState, new: NodeState, changed: Collection[int]) -> None:
        """File ``new`` instead of ``old`` (the node's newest state before, filed here or
        pending), the same node with the same devices whose states at positions ``changed``
        differ (not changed later: it is kept). Deferred to :meth:`settle`, where a node
        refiled again meanwhile is filed once, from the state it was filed from."""
        name = new.node.name
        if name not in self.filed:
            return  # no device of the view: neither is filed
        pending = self.pending
        deferred = pending.get(name)
        if deferred is None:
            pending[name] = (old, new, changed)
        else:
            pending[name] = (deferred[0], new, (*deferred[2], *changed))

    def settle(self) -> None:
        """File the refiles :meth:`refile` deferred, in the order their nodes were first
        refiled: the lists, filing and change log are exact once it returns."""
        pending = self.pending
        if not pending:
            return
        for old, new, changed in pending.values():
            self._move(old, new, changed)
        pending.clear()

    def _move(self, old: NodeState, new: NodeState, changed: Collection[int]) -> None:
        """File ``new`` instead of ``old`` (filed here): the partition is read again only when
        a device of the view is among the positions ``changed``, an entry moves only when its
        key or partition changed."""
        name = new.node.name
        partition = self.filed[name]
        moved: Partition | None = partition
        view = self.shapes[new.shape.ident]
        if not view.position_set.isdisjoint(changed):
            moved = _partition(new, view)
        if moved is None:  # (the view's devices are the same: never here)
            raise ValueError(f"node {name} lost the devices of a view")
        stays = moved == partition
        if stays and old.entries == new.entries:
            return
        self.filed[name] = moved
        lists = self.lists
        for (variant, before), (_, after) in zip(old.entries, new.entries, strict=True):
            partitions = lists[variant]
            entries = partitions[partition]
            at = bisect_left(entries, before)
            if (
                stays
                and (at == 0 or entries[at - 1] < after)
                and (at + 1 == len(entries) or after < entries[at + 1])
            ):
                # Its neighbours do not change: the entry is replaced where it stands (about
                # half the moves within a partition), not taken out and inserted again.
                entries[at] = after
                continue
            del entries[at]
            if not entries and not stays:
                del partitions[partition]
            insort(partitions.setdefault(moved, []), after)
        self._changed(partition, name)
        if not stays:
            self._changed(moved, name)


_VARIANTS: Final = tuple(
    (cores, Variant(cores, "binpack"), Variant(cores, "spread")) for cores in (False, True)
)


def _node_state(
    node: Node,
    shape: NodeShape,
    devices: tuple[DeviceState, ...],
    used: NodeAmounts,
    sources: Mapping[PoolKey, Source],
    *,
    idle_layout: int = -1,
) -> NodeState:
    """A node's state, with its list entry per variant (the list key negated under binpack,
    so the best comes first)."""
    name = node.name
    entries: list[tuple[Variant, FiledNode]] = []
    idle = not (used.devices or used.memory or used.cores)
    for cores, binpack, spread in _VARIANTS:
        key = 0 if idle else _list_key(shape.total, used, cores)  # (a sum of use terms)
        entries.append((binpack, FiledNode(-key, name)))
        entries.append((spread, FiledNode(key, name)))
    return NodeState(node, shape, devices, used, sources, tuple(entries), idle_layout)


def _device_state(cand: Candidate, position: DevicePosition, source: Source) -> DeviceState:
    """One node-local device's state from its pool's use and the pool's blocked devices."""
    _, usage, blocked = source
    kind, memory, cores = position
    device_id, device = cand.device_id, cand.device
    name = device_id.device
    if name in usage.exclusive:
        used_memory, used_cores, in_use = memory, cores, True
    elif name in usage.shares:
        consumed = usage.capacity.get(name, {})
        used_memory = units(consumed.get(MEMORY, 0))
        used_cores = units(consumed.get(CORES, 0))
        in_use = True
    else:
        used_memory = used_cores = 0
        in_use = False
    return _new_device_state(
        device_id,
        device,
        kind,
        memory,
        cores,
        used_memory,
        used_cores,
        in_use,
        device.allow_multiple_allocations,
        bool(cand.consumes) and not in_use and name in blocked,
        _locality(device),
    )


#: Built one per node-local device at every index build (88,000 at 10,000 mixed nodes): without
#: the frozen ``__init__`` (:mod:`driver.api.records`).
_new_device_state: Final = builder(DeviceState)


_LOCALITIES: dict[tuple[object, ...], tuple[tuple[str, object], ...]] = {}
_LOCALITIES_MAX: Final = 4096


def _locality(device: Device) -> tuple[tuple[str, object], ...]:
    """A device's locality groups; one tuple per distinct pair of values (and their types),
    shared by the devices that have it (a node's few NUMA nodes and PCIe roots repeat on
    every node)."""
    attributes = device.attributes
    numa, root = attributes.get(NUMA_NODE), attributes.get(PCIE_ROOT)
    key = (type(numa), numa, type(root), root)
    try:
        found = _LOCALITIES.get(key)
    except TypeError:  # (an unhashable value: its own tuple)
        return ((NUMA_NODE, numa), (PCIE_ROOT, root))
    if found is None:
        if len(_LOCALITIES) >= _LOCALITIES_MAX:
            _LOCALITIES.clear()
        found = _LOCALITIES[key] = ((NUMA_NODE, numa), (PCIE_ROOT, root))
    return found


def _pools(state: NodeState) -> set[PoolKey]:
    return {(d.device_id.driver, d.device_id.pool) for d in state.devices}


class CapacityIndex:
    """Per-node device totals and use, and the views that file them (module docstring)."""

    def __init__(
        self, snapshot: ClusterSnapshot, nodes: Iterable[Node], classifier: DeviceClassifier
    ) -> None:
        self.snapshot = snapshot
        self.classifier = classifier
        self.states: dict[str, NodeState] = {}
        self.shapes: dict[tuple[DeviceKind, ...], NodeShape] = {}
        self.by_ident: list[NodeShape] = []
        self.kinds: dict[DeviceKind, KindFacts] = {}
        self._blocked_memo: BlockedMemo = {}
        self._layouts: dict[tuple[tuple[tuple[str, object], ...], ...], int] = {}
        self._kind_memo: dict[
            tuple[object, ...], tuple[tuple[CapacitySpec, ...], DeviceKind, KindFacts]
        ] = {}
        self.generation = 0  # bumped when what is known of the kinds changes
        # How many filed nodes have each shape (by ident; shapes with none are absent), and a
        # counter bumped whenever that changes (:attr:`kind_counts` follows from them).
        self._shape_counts: Counter[int] = Counter()
        self.census = 0
        self._kind_counts: tuple[int, Counter[DeviceKind]] = (0, Counter())
        self.views: dict[frozenset[DeviceKind], IndexView] = {}
        self.deviceless: set[str] = set()
        self._pool_nodes: dict[PoolKey, set[str]] = {}
        # An open what-if (:meth:`look`): node, snapshot, state and views before it.
        self._looking: (
            tuple[str, ClusterSnapshot, NodeState | None, set[frozenset[DeviceKind]]] | None
        ) = None
        self._node_devices: dict[
            str, tuple[NodeCandidates, tuple[NodeShape, list[Candidate]] | None]
        ] = {}
        # Per node: its node-local devices (as in _node_devices) and the position of each.
        self._where: dict[str, tuple[Sequence[Candidate], Mapping[tuple[PoolKey, str], int]]] = {}
        for node in nodes:
            self._file(node)

    def nodes_holding(self, pool: PoolKey) -> Iterable[str]:
        """The nodes whose filed state reads ``pool`` (to re-file when its use changes)."""
        return self._pool_nodes.get(pool, ())

    def view(self, kinds: frozenset[DeviceKind]) -> IndexView:
        """The nodes filed for these device kinds (built on first use, then kept), settled
        (:meth:`IndexView.settle`: its lists exact)."""
        found = self.views.get(kinds)
        if found is None:
            found = IndexView(kinds)
            found.file_all(self.states.values())
            self.views[kinds] = found
        else:
            found.settle()
        return found

    # ------------------------------------------------------------------ state
    def _kind(self, cand: Candidate, classes: frozenset[str]) -> DeviceKind:
        driver, capacities = cand.device_id.driver, cand.capacities
        special = bool(cand.blocking_taints or cand.consumes or cand.pool.has_binding_conditions)
        counted = bool(
            cand.consumes and not cand.blocking_taints and not cand.pool.has_binding_conditions
        )
        # Devices alike share their capacity specs (one tuple per capacity map): the kind and
        # its facts are found by that tuple's identity (kept, so its id stays its own).
        key = (driver, cand.multi, id(capacities), classes, special, counted)
        kept = self._kind_memo.get(key)
        if kept is not None:
            kind, facts = kept[1], kept[2]
            if facts.add(cand.device):
                self.generation += 1
            return kind
        kind = DeviceKind(driver, cand.multi, capacities, classes, special, counted)
        found = self.kinds.get(kind)
        if found is None:
            found = self.kinds[kind] = KindFacts(cand.device, driver)
            self.generation += 1
        elif found.add(cand.device):
            self.generation += 1
        if len(self._kind_memo) >= _KIND_MEMO:
            self._kind_memo.clear()  # (capacity specs not shared make every key distinct)
        self._kind_memo[key] = (capacities, kind, found)
        return kind

    def _devices(self, node: Node) -> tuple[NodeShape, list[Candidate]] | None:
        """The node's shape and node-local devices; classified once per candidate set (a
        refresh after a change of use finds the same candidates and reuses them)."""
        candidates = self.snapshot.candidates(node)
        cached = self._node_devices.get(node.name)
        if cached is not None and cached[0] is candidates:
            return cached[1]
        if cached is not None and cached[1] is not None:
            self._count(cached[1][0], -1)
        devices = [c for c in candidates.devices if c.node_local and c.node_match]
        found: tuple[NodeShape, list[Candidate]] | None = None
        if devices:
            classified = {c.index: self.classifier.classify(c) for c in devices}
            self.classifier.seed(candidates, classified)
            key = tuple([self._kind(c, classified[c.index].classes) for c in devices])
            shape = self.shapes.get(key)
            if shape is None:
                shape = self._shape(key, devices)
            found = (shape, devices)
            self._count(shape, 1)
        self._node_devices[node.name] = (candidates, found)
        return found

    def seed_selectors(
        self, snapshot: ClusterSnapshot, node: Node, claims: Sequence[ResourceClaim]
    ) -> None:
        """Hand the allocator the verdicts of request selectors that answer for whole device
        kinds on this node of ``snapshot`` (:meth:`DeviceClassifier.verdict`), so it does not
        evaluate them device by device on its first visit (a dynamic-MIG node publishes some
        200 devices: one CEL evaluation each, the p99 of MIG decisions). As the classifier
        seeds class verdicts: once per node and selector set; a device whose kind has no
        certain verdict for every selector of the set is left to the allocator (errors
        included)."""
        found = None
        for claim in claims:
            for request in claim.requests:
                alternatives = (
                    (request.exactly,) if request.exactly is not None else request.first_available
                )
                for alt in alternatives:
                    if not alt.selectors:
                        continue
                    device_class = snapshot.classes.get(alt.device_class_name)
                    if device_class is None:
                        continue  # (the allocator's error to report)
                    if found is None:
                        found = self.device_kinds(node)
                        if found is None or found[0] is not snapshot.candidates(node):
                            return  # (not classified by the index, or not these candidates)
                    self._seed_set(found, tuple(device_class.selectors), alt.selectors)

    def _seed_set(
        self,
        found: tuple[NodeCandidates, Sequence[int], NodeShape],
        class_selectors: tuple[str, ...],
        selectors: tuple[str, ...],
    ) -> None:
        candidates, positions, shape = found
        cache = candidates.verdicts
        key = (*class_selectors, "", *selectors)
        if key in cache or len(cache) >= MAX_CACHED_SELECTOR_SETS - 1:
            return
        by_class = cache.get((*class_selectors, ""))
        if by_class is None:
            return
        per_kind: dict[DeviceKind, bool | None] = {}
        known: list[bool | None] = [None] * len(candidates.devices)
        for position, kind in zip(positions, shape.key, strict=True):
            in_class = by_class[position]
            if in_class is None:
                continue
            if not in_class:
                known[position] = False
                continue
            verdict = per_kind.get(kind, _UNKNOWN)
            if verdict is _UNKNOWN:
                facts = self.kinds.get(kind)
                verdicts = (
                    [self.classifier.verdict(e, kind, facts, self.generation) for e in selectors]
                    if facts is not None
                    else [None]
                )
                verdict = None if None in verdicts else all(verdicts)
                per_kind[kind] = verdict
            if verdict is not None:
                known[position] = verdict and candidates.devices[position].node_match
        if any(v is not None for v in known):
            cache[key] = known

    def device_kinds(self, node: Node) -> tuple[NodeCandidates, Sequence[int], NodeShape] | None:
        """The node's candidates as the index classified them: the candidate index of each
        node-local device and the shape whose ``key`` gives their kinds, in the same order
        (None: no such device, or the node was not read yet)."""
        cached = self._node_devices.get(node.name)
        if cached is None:
            return None
        candidates, found = cached
        if found is None:
            return None
        shape, devices = found
        return candidates, [c.index for c in devices], shape

    def _count(self, shape: NodeShape, sign: int) -> None:
        counts = self._shape_counts
        counts[shape.ident] += sign
        if not counts[shape.ident]:
            del counts[shape.ident]
        self.census += 1

    @property
    def kind_counts(self) -> Counter[DeviceKind]:
        """How many devices of each kind the filed nodes have (kinds with none are absent);
        summed over the shapes when :attr:`census` moved."""
        census, counts = self._kind_counts
        if census != self.census:
            counts = Counter()
            for ident, nodes in self._shape_counts.items():
                for kind in self.by_ident[ident].key:
                    counts[kind] += nodes
            self._kind_counts = (self.census, counts)
        return counts

    def _state(self, node: Node) -> NodeState | None:
        found = self._devices(node)
        if found is None:
            return None
        shape, devices = found
        allocated = self.snapshot.allocated
        sources: dict[PoolKey, Source] = {}
        states = []
        in_use = used_memory = used_cores = blocked = 0
        for cand, position in zip(devices, shape.positions, strict=True):
            device_id = cand.device_id
            pool_key = (device_id.driver, device_id.pool)
            source = sources.get(pool_key)
            if source is None:
                usage = allocated.pool(*pool_key)
                source = Source(cand.pool, usage, _blocked_in(cand.pool, usage, self._blocked_memo))
                sources[pool_key] = source
            state = _device_state(cand, position, source)
            states.append(state)
            if state.in_use:
                in_use += 1
                used_memory += state.used_memory
                used_cores += state.used_cores
            blocked += state.blocked
        used = NodeAmounts(devices=in_use, memory=used_memory, cores=used_cores)
        layout = -1
        if not in_use and not blocked:
            localities = tuple([s.locality for s in states])
            layout = self._layouts.setdefault(localities, len(self._layouts))
        return _node_state(node, shape, tuple(states), used, sources, idle_layout=layout)

    def _restate(self, old: NodeState, node: Node) -> tuple[NodeState, list[int]] | None:
        """The node's state after its use changed, from ``old`` (read from the same candidate
        set): only devices whose use or blocking changed are read again. Returns the state
        and the positions that changed; None when the node's devices changed (read it
        whole)."""
        cached = self._node_devices.get(node.name)
        if (
            cached is None
            or cached[1] is None
            or cached[1][0] is not old.shape
            or cached[0] is not self.snapshot.candidates(node)
        ):
            return None
        devices = cached[1][1]
        allocated = self.snapshot.allocated
        sources = dict(old.sources)
        names: list[tuple[PoolKey, str]] = []
        for pool_key, (pool, was, blocked_was) in old.sources.items():
            usage = allocated.pool(*pool_key)
            if usage is was:
                continue
            touched = set(was.exclusive.symmetric_difference(usage.exclusive))
            for device in was.shares.keys() | usage.shares.keys():
                if was.shares.get(device) != usage.shares.get(device) or was.capacity.get(
                    device
                ) != usage.capacity.get(device):
                    touched.add(device)
            source = Source(pool, usage, _blocked_in(pool, usage, self._blocked_memo))
            touched.update(blocked_was.symmetric_difference(source.blocked))
            sources[pool_key] = source
            names.extend((pool_key, device) for device in touched)
        if not names:
            if node is old.node and all(
                source is old.sources[key] for key, source in sources.items()
            ):
                return old, []
            return (
                _node_state(
                    node, old.shape, old.devices, old.used, sources, idle_layout=old.idle_layout
                ),
                [],
            )
        where = self._positions(node.name, devices)
        states = list(old.devices)
        used_devices, used_memory, used_cores = old.used.devices, old.used.memory, old.used.cores
        changed = []
        for pool_key, device in names:
            position = where.get((pool_key, device))
            if position is None:
                continue  # not a node-local device of this node
            cand = devices[position]
            before = states[position]
            after = _device_state(cand, old.shape.positions[position], sources[pool_key])
            if after == before:
                continue
            states[position] = after
            used_devices += after.in_use - before.in_use
            used_memory += after.used_memory - before.used_memory
            used_cores += after.used_cores - before.used_cores
            changed.append(position)
        used = NodeAmounts(devices=used_devices, memory=used_memory, cores=used_cores)
        return _node_state(node, old.shape, tuple(states), used, sources), changed

    def _positions(
        self, name: str, devices: Sequence[Candidate]
    ) -> Mapping[tuple[PoolKey, str], int]:
        """Where each node-local device of a node is, by (pool, device name) (kept per
        candidate set)."""
        kept = self._where.get(name)
        if kept is not None and kept[0] is devices:
            return kept[1]
        where: dict[tuple[PoolKey, str], int] = {
            ((c.device_id.driver, c.device_id.pool), c.device_id.device): i
            for i, c in enumerate(devices)
        }
        self._where[name] = (devices, where)
        return where

    def _shape(self, key: tuple[DeviceKind, ...], devices: Sequence[Candidate]) -> NodeShape:
        distinct = list(dict.fromkeys(key))
        representatives = {k: c.device for k, c in zip(key, devices, strict=True)}
        memories = [capacity_units(c.device, MEMORY) for c in devices]
        cores = [capacity_units(c.device, CORES) for c in devices]
        shape = NodeShape(
            key=key,
            ident=len(self.by_ident),
            total=NodeAmounts(devices=len(devices), memory=sum(memories), cores=sum(cores)),
            kinds=tuple(distinct),
            representatives=tuple(representatives[k] for k in distinct),
            positions=tuple(
                DevicePosition(distinct.index(k), m, c)
                for k, m, c in zip(key, memories, cores, strict=True)
            ),
            max_memory=max(memories),
            max_cores=max(cores),
        )
        self.shapes[key] = shape
        self.by_ident.append(shape)
        return shape

    def _file(self, node: Node) -> None:
        state = self._state(node)
        if state is None:
            self.deviceless.add(node.name)
            self.states.pop(node.name, None)
            return
        self.deviceless.discard(node.name)
        self.states[node.name] = state
        for pool in _pools(state):
            self._pool_nodes.setdefault(pool, set()).add(node.name)
        for view in self.views.values():
            view.file(state)

    def _unfile(self, name: str) -> None:
        state = self.states.pop(name, None)
        if state is None:
            self.deviceless.discard(name)
            return
        for pool in _pools(state):
            holders = self._pool_nodes[pool]
            holders.discard(name)
            if not holders:
                del self._pool_nodes[pool]
        for view in self.views.values():
            view.unfile(state)

    def filing(self) -> frozenset[FilingEntry]:
        """Every node's filed state (for tests: an index kept up to date must equal a fresh
        one; views derive from these states)."""
        return frozenset(
            FilingEntry(
                name,
                state.shape.key,
                state.used,
                tuple(
                    (str(d.device_id), d.used_memory, d.used_cores, d.in_use) for d in state.devices
                ),
            )
            for name, state in self.states.items()
        )

    def remove(self, name: str) -> None:
        """Forget a node that went away."""
        self._unfile(name)
        self._where.pop(name, None)
        cached = self._node_devices.pop(name, None)
        if cached is not None and cached[1] is not None:
            self._count(cached[1][0], -1)

    def refresh(self, snapshot: ClusterSnapshot, node: Node) -> None:
        """Re-read one node after its use changed (and adopt the newer snapshot): when its
        devices are the same, only the devices whose use changed, and only the views those
        devices belong to read its partition again."""
        self.snapshot = snapshot
        old = self.states.get(node.name)
        found = self._restate(old, node) if old is not None else None
        if old is None or found is None:
            self._unfile(node.name)
            self._file(node)
            return
        state, changed = found
        if state is old:
            return
        self.states[node.name] = state
        for view in self.views.values():
            view.refile(old, state, changed)

    def look(self, snapshot: ClusterSnapshot, node: Node) -> None:
        """For a what-if on ``node``: adopt ``snapshot`` and re-read that node's state, leaving
        the views built before the what-if as they were (a what-if reads states and shapes,
        never the filed lists; views built meanwhile are kept exact). Calls may repeat for
        the same node; :meth:`unlook` puts back what was."""
        if self._looking is None:
            for view in self.views.values():
                view.settle()  # (the views kept are left as they are: exact)
            self._looking = (node.name, self.snapshot, self.states.get(node.name), set(self.views))
        name, _, original, kept = self._looking
        if name != node.name:
            raise ValueError(f"a what-if on node {name} is open; not on {node.name}")
        self.snapshot = snapshot
        if original is None:
            return  # no devices: its state does not depend on the snapshot's allocations
        previous = self.states[name]
        state = self._state(node)
        if state is None:  # (the devices do not depend on allocations: never here)
            raise ValueError(f"node {name} lost its devices in a what-if")
        self.states[name] = state
        self._refile(kept, previous, state)

    def unlook(self) -> None:
        """End the what-if :meth:`look` opened (nothing when none is open)."""
        if self._looking is None:
            return
        name, snapshot, original, kept = self._looking
        self._looking = None
        self.snapshot = snapshot
        if original is not None:
            current = self.states[name]
            self.states[name] = original
            self._refile(kept, current, original)

    def _refile(self, kept: set[frozenset[DeviceKind]], old: NodeState, new: NodeState) -> None:
        """File ``new`` instead of ``old`` in the views not in ``kept``."""
        if old is new:
            return
        for kinds, view in self.views.items():
            if kinds not in kept:
                view.unfile(old)
                view.file(new)

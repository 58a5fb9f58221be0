"""The capacity index: every node's device totals and use, filed for bound-ordered walks.

Per node, :class:`NodeState` holds its node-local devices (capacities and what other claims
hold of them, in whole units), the totals and use on the node axis, and three small levels
the bounds read: the largest free memory of a shared device (``level``), a cores-aware
"certain fit" level (``fit_level``), both in 1/:data:`LEVELS` of the shape's largest device,
and the most idle devices side by side (``group_fresh``, per NUMA node or PCIe root). Nodes
with the same devices share a :class:`NodeShape` (totals and per-pod bounds are per shape).

Nodes are filed in sorted lists, one per :class:`Variant` (cores dimension or not, node
policy) and :class:`Partition` (shape, levels, devices in use): within a partition the
bound of the node score is monotone in the list key, so the first entry has the best bound.
:meth:`CapacityIndex.refresh` re-files one node after its use changed, in O(devices on the
node + n) with a memmove-cheap constant; :meth:`CapacityIndex.nodes_holding` says which
nodes' states read a pool, so only those are re-filed when its allocations change.

The index reads the snapshot it is given and never mutates it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from driver.api.claims import AllocationResult
from driver.api.ids import DeviceID
from driver.api.model import Device
from driver.api.nodes import Node
from driver.api.quantity import NANO, Quantity
from driver.scheduling.policy import NodePolicy
from driver.scheduling.scoring import CORES, MEMORY, NUMA_NODE, PCIE_ROOT, NodeAmounts, node_dims
from driver.structured.snapshot import Candidate, CapacitySpec, ClusterSnapshot, PoolKey

LEVELS: Final = 32
_DIRECTIONS: Final[tuple[NodePolicy, ...]] = ("binpack", "spread")


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
    """Devices of one kind consume and fit alike: same sharing, capacities and policies."""

    multi: bool
    capacities: tuple[CapacitySpec, ...]


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

    key: tuple[DeviceKind, ...]
    ident: int  # small integer standing for ``key`` in partitions
    total: NodeAmounts
    kinds: tuple[Device, ...]  # one representative per distinct device kind
    positions: tuple[DevicePosition, ...]  # per device
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

    def added(self, results: Iterable[AllocationResult]) -> NodeAmounts:
        """What a pod's allocation adds to this node's devices/memory/cores use."""
        by_id = {d.device_id: d for d in self.devices}
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


class Partition(NamedTuple):
    """Nodes whose bound is monotone in their list key."""

    shape: int  # NodeShape.ident
    level: int
    in_use: int  # devices in use
    group_fresh: int  # idle devices in one locality group
    fit_level: int


class Variant(NamedTuple):
    """Which node score a list is sorted by: with the cores dimension or not, per policy."""

    cores: bool
    direction: NodePolicy


class FiledNode(NamedTuple):
    """One list entry: the list key (negated under binpack, so the best comes first)."""

    key: int
    name: str


class FilingEntry(NamedTuple):
    """Where one node is filed, with its shape by key (idents differ between indexes)."""

    variant: Variant
    shape: tuple[DeviceKind, ...]
    level: int
    in_use: int
    group_fresh: int
    fit_level: int
    filed: FiledNode


class _Filed(NamedTuple):
    """One place a node is filed: which list, which partition, which entry."""

    variant: Variant
    partition: Partition
    entry: FiledNode


def _pools(state: NodeState) -> set[PoolKey]:
    return {(d.device_id.driver, d.device_id.pool) for d in state.devices}


class CapacityIndex:
    """Per-node device totals and use, filed in sorted lists (see the module docstring).

    ``lists[variant][partition]`` holds :class:`FiledNode` entries sorted ascending.
    """

    def __init__(self, snapshot: ClusterSnapshot, nodes: Iterable[Node]) -> None:
        self.snapshot = snapshot
        self.states: dict[str, NodeState] = {}
        self.shapes: dict[tuple[DeviceKind, ...], NodeShape] = {}
        self.by_ident: list[NodeShape] = []
        self.lists: dict[Variant, dict[Partition, list[FiledNode]]] = {
            Variant(cores, direction): {} for cores in (False, True) for direction in _DIRECTIONS
        }
        self.deviceless: set[str] = set()
        self._pool_nodes: dict[PoolKey, set[str]] = {}
        for node in nodes:
            self._file(node)

    def nodes_holding(self, pool: PoolKey) -> Iterable[str]:
        """The nodes whose filed state reads ``pool`` (to re-file when its use changes)."""
        return self._pool_nodes.get(pool, ())

    # ------------------------------------------------------------------ state
    def _state(self, node: Node) -> NodeState | None:
        view = self.snapshot.candidates(node)
        devices = [c for c in view.devices if c.node_local and c.node_match]
        if not devices:
            return None
        key = tuple([DeviceKind(c.multi, c.capacities) for c in devices])
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
                used_memory = units(consumed.get(MEMORY, 0))
                used_cores = units(consumed.get(CORES, 0))
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

    def _shape(self, key: tuple[DeviceKind, ...], devices: Sequence[Candidate]) -> NodeShape:
        distinct = list(dict.fromkeys(key))
        representatives = {k: c.device for k, c in zip(key, devices, strict=True)}
        memories = [capacity_units(c.device, MEMORY) for c in devices]
        cores = [capacity_units(c.device, CORES) for c in devices]
        shape = NodeShape(
            key=key,
            ident=len(self.by_ident),
            total=NodeAmounts(devices=len(devices), memory=sum(memories), cores=sum(cores)),
            kinds=tuple(representatives[k] for k in distinct),
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

    def _entries(self, state: NodeState) -> Iterator[_Filed]:
        partition = Partition(
            state.shape.ident,
            state.level,
            state.used.devices,
            state.group_fresh,
            state.fit_level,
        )
        for cores in (False, True):
            key = state.list_key(cores)
            yield _Filed(Variant(cores, "binpack"), partition, FiledNode(-key, state.node.name))
            yield _Filed(Variant(cores, "spread"), partition, FiledNode(key, state.node.name))

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
        for variant, partition, entry in self._entries(state):
            insort(self.lists[variant].setdefault(partition, []), entry)

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
        for variant, partition, entry in self._entries(state):
            partitions = self.lists[variant]
            entries = partitions[partition]
            del entries[bisect_left(entries, entry)]
            if not entries:
                del partitions[partition]

    def filing(self) -> frozenset[FilingEntry]:
        """Every list entry (for tests: an index kept up to date must equal a fresh one)."""
        return frozenset(
            FilingEntry(
                variant,
                self.by_ident[p.shape].key,
                p.level,
                p.in_use,
                p.group_fresh,
                p.fit_level,
                entry,
            )
            for variant, partitions in self.lists.items()
            for p, entries in partitions.items()
            for entry in entries
        )

    def refresh(self, snapshot: ClusterSnapshot, node: Node) -> None:
        """Re-read one node after its use changed (and adopt the newer snapshot)."""
        self.snapshot = snapshot
        self._unfile(node.name)
        self._file(node)

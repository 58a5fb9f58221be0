"""The node's one device table: every device the discovered GPUs make, derived once.

Discovery reports physical GPUs (:class:`~driver.discovery.gpus.GpuInfo`) with their MIG
partitions. Everything on the node that speaks of *devices* — the slice builder (what is
published), Prepare (what a claim may be given, and which physical GPU it is on) and health
(which devices an NVML event on a UUID taints) — reads this table, so they cannot disagree.

Contract:

* :meth:`DeviceTable.from_gpus` derives one :class:`NodeDevice` per device the node has, in
  publishing order: by GPU minor, the whole GPU first, then its MIG partitions by placement
  start. Pure and deterministic; equal input gives an equal (``==``) table.
* Names are the contract's: ``gpu-<minor>`` (:func:`gpu_device_name`) and
  ``gpu-<minor>-mig-<profile without dots>-<start>`` (:func:`mig_device_name`).
* **The MIG-enabled parent question is answered here and only here**
  (:func:`_publishes_whole_gpu`): a GPU in MIG mode is listed (so its partitions have a
  parent and Prepare can tell that they share one physical GPU) but not published; its
  partitions are published instead. An unpublished device is not something a claim can be
  given, and a health event on its UUID applies to its published partitions.
* :meth:`DeviceTable.health_targets` maps every UUID NVML may name (a GPU's or a MIG
  partition's) to the published devices an event on it affects: a GPU's UUID covers every
  published device on that GPU, a partition's UUID covers that partition.

* **Dynamic MIG** (:mod:`driver.discovery.mig`): a GPU the policy makes dynamic is published
  whole *and* as one MIG device per valid (profile, placement), each carrying its
  :class:`~driver.discovery.mig.MigPlacement`; the slice builder turns placements into counter
  consumption. Instances biaxial created (``owned``: placements its checkpoint records) back
  their placement device (``mig``); the whole GPU is backed by the full-size instance when one
  was created for it. An instance biaxial did not create (a static geometry) is listed
  unpublished and makes every placement it overlaps unavailable, the whole GPU included:
  those are not published. Names equal static MIG's, so a placement and the instance created
  for it share one name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from driver.discovery.gpus import GpuInfo, MigInfo
from driver.discovery.mig import DynamicMigPolicy, MigGeometry, MigPlacement, instance_at

DeviceKind = Literal["gpu", "mig"]
OwnedInstance = tuple[str, str, int]
"""(GPU UUID, profile, start) of a MIG instance biaxial created (its checkpoint says so)."""

_NOT_NAME_CHAR: Final = re.compile(r"[^a-z0-9]")


def gpu_device_name(minor: int) -> str:
    """``gpu-<minor>``."""
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, start: int) -> str:
    """``gpu-<minor>-mig-<profile without dots>-<start>``, e.g. ``gpu-0-mig-1g5gb-3``.

    Profile characters other than lower-case letters and digits are dropped (``1g.5gb+me`` ->
    ``1g5gbme``) so the name stays a DNS label.
    """
    compact = _NOT_NAME_CHAR.sub("", profile.lower())
    return f"gpu-{parent_minor}-mig-{compact}-{start}"


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """One device of this node: a whole GPU or a MIG partition of one.

    ``gpu`` is the physical GPU the device is on (the device itself for a whole GPU); ``mig``
    is the MIG instance behind the device: the partition of a static MIG device, the instance
    biaxial created for a dynamic placement, the full-size instance of a dynamic whole GPU
    (``None`` while none exists). ``placement``: the (profile, start) a dynamic device stands
    for (the full profile at 0 for a dynamic whole GPU); ``None`` on static devices.
    ``shareable``: several claims may hold shares of it (``allowMultipleAllocations``).
    ``published``: it is in the node's ResourceSlices, so a claim can be allocated it.
    """

    name: str
    kind: DeviceKind
    gpu: GpuInfo
    published: bool
    shareable: bool
    mig: MigInfo | None = None
    placement: MigPlacement | None = None

    @property
    def is_mig(self) -> bool:
        return self.kind == "mig"

    @property
    def dynamic(self) -> bool:
        """Partitioned on demand: Prepare creates the instance behind it."""
        return self.placement is not None

    @property
    def mig_backed(self) -> bool:
        """A container gets a MIG instance: a MIG device, or a dynamic GPU's whole device
        (its full-size instance)."""
        return self.is_mig or self.mig is not None or self.placement is not None

    @property
    def uuid(self) -> str:
        """``GPU-...`` for a whole GPU, ``MIG-...`` for a partition (``""`` for a dynamic
        placement whose instance does not exist yet)."""
        if not self.is_mig:
            return self.gpu.uuid
        return self.mig.uuid if self.mig is not None else ""

    @property
    def container_uuid(self) -> str:
        """What a container is given: the backing instance's UUID when there is one (always
        for a MIG device, for a dynamic whole GPU once its full-size instance exists), else
        the GPU's."""
        return self.mig.uuid if self.mig is not None else self.gpu.uuid

    @property
    def parent(self) -> str | None:
        """The whole GPU's device name for a MIG partition; ``None`` for a whole GPU."""
        return gpu_device_name(self.gpu.minor) if self.is_mig else None

    @property
    def parent_uuid(self) -> str:
        """The physical GPU's UUID for a MIG partition; ``""`` for a whole GPU."""
        return self.gpu.uuid if self.is_mig else ""

    @property
    def physical_uuid(self) -> str:
        """The UUID of the physical GPU the device is on."""
        return self.gpu.uuid

    @property
    def minor(self) -> int:
        """The (parent) GPU's minor: the device node is ``/dev/nvidia<minor>``."""
        return self.gpu.minor

    @property
    def pci_bus_id(self) -> str | None:
        return self.gpu.pci_bus_id

    @property
    def memory_bytes(self) -> int:
        if self.placement is not None:
            return self.placement.profile.memory_bytes
        return self.mig.memory_bytes if self.mig is not None else self.gpu.memory_bytes

    @property
    def multiprocessors(self) -> int:
        if self.placement is not None:
            return self.placement.profile.multiprocessors
        return self.mig.multiprocessors if self.mig is not None else self.gpu.multiprocessors

    @property
    def profile(self) -> str:
        """The MIG profile of a MIG device (``""`` for a whole GPU)."""
        if not self.is_mig:
            return ""
        if self.placement is not None:
            return self.placement.profile.name
        return self.mig.profile if self.mig is not None else ""


def _publishes_whole_gpu(gpu: GpuInfo) -> bool:
    """The MIG-enabled parent question: a GPU in MIG mode is published as its partitions."""
    return not gpu.mig_enabled


def _derive_dynamic(gpu: GpuInfo, owned: frozenset[OwnedInstance]) -> Iterator[NodeDevice]:
    """A dynamic-MIG GPU: the whole GPU and every placement no foreign instance blocks."""
    geometry = MigGeometry.of(gpu)
    foreign = [m for m in gpu.mig_devices if (gpu.uuid, m.profile, m.start) not in owned]
    whole = geometry.whole()
    yield NodeDevice(
        name=gpu_device_name(gpu.minor),
        kind="gpu",
        gpu=gpu,
        published=not foreign,
        shareable=True,
        mig=instance_at(gpu, whole.profile.name, 0)
        if (gpu.uuid, whole.profile.name, 0) in owned
        else None,
        placement=whole,
    )
    for mig in sorted(foreign, key=lambda m: m.start):
        yield _instance_device(gpu, mig, published=False)
    taken = {(m.profile, m.start) for m in foreign}
    for placement in geometry.placements:
        if (placement.profile.name, placement.start) in taken or any(
            placement.overlaps(m.start, m.size) for m in foreign
        ):
            continue
        name = placement.profile.name
        instance = (
            instance_at(gpu, name, placement.start)
            if (gpu.uuid, name, placement.start) in owned
            else None
        )
        yield NodeDevice(
            name=mig_device_name(gpu.minor, name, placement.start),
            kind="mig",
            gpu=gpu,
            published=True,
            shareable=False,
            mig=instance,
            placement=placement,
        )


def _derive(gpu: GpuInfo) -> Iterator[NodeDevice]:
    whole = _publishes_whole_gpu(gpu)
    yield NodeDevice(
        name=gpu_device_name(gpu.minor), kind="gpu", gpu=gpu, published=whole, shareable=whole
    )
    if whole:
        return
    for mig in sorted(gpu.mig_devices, key=lambda m: m.start):
        yield _instance_device(gpu, mig, published=True)


def _instance_device(gpu: GpuInfo, mig: MigInfo, *, published: bool) -> NodeDevice:
    """An existing MIG instance as a device (of a static geometry, or a foreign one on a
    dynamic-MIG GPU, which is never published)."""
    return NodeDevice(
        name=mig_device_name(gpu.minor, mig.profile, mig.start),
        kind="mig",
        gpu=gpu,
        published=published,
        shareable=False,
        mig=mig,
    )


@dataclass(frozen=True, slots=True)
class DeviceTable:
    """Every device of one node (see the module docstring). Build with :meth:`from_gpus`."""

    devices: tuple[NodeDevice, ...] = ()
    _by_name: Mapping[str, NodeDevice] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {d.name: d for d in self.devices})

    @classmethod
    def from_gpus(
        cls,
        gpus: Iterable[GpuInfo],
        dynamic: DynamicMigPolicy | None = None,
        owned: Iterable[OwnedInstance] = (),
    ) -> DeviceTable:
        """The table of the discovered GPUs (any order; the table is in publishing order).

        ``dynamic``: which GPUs are partitioned on demand (none by default); ``owned``: the
        MIG instances biaxial created, as its checkpoint records them.
        """
        policy = dynamic or DynamicMigPolicy()
        mine = frozenset(owned)
        return cls(
            tuple(
                d
                for gpu in sorted(gpus, key=lambda g: g.minor)
                for d in (_derive_dynamic(gpu, mine) if policy.dynamic(gpu) else _derive(gpu))
            )
        )

    @classmethod
    def of(cls, inventory: DeviceTable | Iterable[GpuInfo]) -> DeviceTable:
        """``inventory`` itself when it is a table, else the table derived from the GPUs."""
        return inventory if isinstance(inventory, DeviceTable) else cls.from_gpus(inventory)

    @property
    def published(self) -> tuple[NodeDevice, ...]:
        """The devices the node's ResourceSlices carry, in publishing order."""
        return tuple(d for d in self.devices if d.published)

    def get(self, name: str) -> NodeDevice | None:
        """Any device of the node by name, published or not."""
        return self._by_name.get(name)

    def published_device(self, name: str) -> NodeDevice | None:
        """A device a claim can have been allocated: published under this name."""
        device = self._by_name.get(name)
        return device if device is not None and device.published else None

    @property
    def dynamic_gpus(self) -> tuple[GpuInfo, ...]:
        """The GPUs partitioned on demand, by minor."""
        return tuple(d.gpu for d in self.devices if d.kind == "gpu" and d.dynamic)

    def health_targets(self) -> dict[str, tuple[str, ...]]:
        """UUID (of a GPU or a MIG partition) -> the published devices an event on it affects.

        A GPU's UUID covers every published device on it; an instance's UUID covers the device
        it backs (a dynamic placement, or a dynamic whole GPU's full-size instance).
        """
        out: dict[str, list[str]] = {}
        for device in self.devices:
            keys = [device.uuid] if device.uuid else []
            if device.mig is not None and device.mig.uuid not in keys:
                keys.append(device.mig.uuid)
            for key in keys:
                out.setdefault(key, [])
            if not device.published:
                continue
            for key in keys:
                out[key].append(device.name)
            if device.is_mig:
                out.setdefault(device.physical_uuid, []).append(device.name)
        return {uuid: tuple(names) for uuid, names in out.items()}

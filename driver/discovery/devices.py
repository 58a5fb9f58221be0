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

Growing it for dynamic MIG (MIG partitions created on demand): a GPU in that mode would be
published whole *and* contribute one MIG entry per valid (profile, placement), each consuming
the GPU's shared counters, without a UUID until Prepare creates the instance. That is one more
branch in :meth:`DeviceTable.from_gpus` (and a counter field on the entry); slices, Prepare and
health keep reading the same table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from driver.discovery.gpus import GpuInfo, MigInfo

DeviceKind = Literal["gpu", "mig"]

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
    is the partition for a MIG device. ``shareable``: several claims may hold shares of it
    (``allowMultipleAllocations``). ``published``: it is in the node's ResourceSlices, so a
    claim can be allocated it.
    """

    name: str
    kind: DeviceKind
    gpu: GpuInfo
    published: bool
    shareable: bool
    mig: MigInfo | None = None

    @property
    def is_mig(self) -> bool:
        return self.kind == "mig"

    @property
    def uuid(self) -> str:
        """``GPU-...`` for a whole GPU, ``MIG-...`` for a partition."""
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
        return self.mig.memory_bytes if self.mig is not None else self.gpu.memory_bytes

    @property
    def multiprocessors(self) -> int:
        return self.mig.multiprocessors if self.mig is not None else self.gpu.multiprocessors


def _publishes_whole_gpu(gpu: GpuInfo) -> bool:
    """The MIG-enabled parent question: a GPU in MIG mode is published as its partitions."""
    return not gpu.mig_enabled


def _derive(gpu: GpuInfo) -> Iterator[NodeDevice]:
    whole = _publishes_whole_gpu(gpu)
    yield NodeDevice(
        name=gpu_device_name(gpu.minor), kind="gpu", gpu=gpu, published=whole, shareable=whole
    )
    if whole:
        return
    for mig in sorted(gpu.mig_devices, key=lambda m: m.start):
        yield NodeDevice(
            name=mig_device_name(gpu.minor, mig.profile, mig.start),
            kind="mig",
            gpu=gpu,
            published=True,
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
    def from_gpus(cls, gpus: Iterable[GpuInfo]) -> DeviceTable:
        """The table of the discovered GPUs (any order; the table is in publishing order)."""
        return cls(tuple(d for gpu in sorted(gpus, key=lambda g: g.minor) for d in _derive(gpu)))

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

    def health_targets(self) -> dict[str, tuple[str, ...]]:
        """UUID (of a GPU or a MIG partition) -> the published devices an event on it affects."""
        out: dict[str, list[str]] = {}
        for device in self.devices:
            out.setdefault(device.uuid, [])
            if device.published:
                out[device.uuid].append(device.name)
                if device.is_mig:
                    out.setdefault(device.physical_uuid, []).append(device.name)
        return {uuid: tuple(names) for uuid, names in out.items()}

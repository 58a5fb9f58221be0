"""What discovery reports: one :class:`GpuInfo` per physical GPU, with its existing MIG
partitions as :class:`MigInfo` children. Frozen values; every backend (real NVML, the fake
profiles) returns these, and everything on the node is derived from them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MigInfo:
    """An existing MIG partition as NVML reports it."""

    uuid: str
    profile: str  # e.g. "1g.5gb"
    start: int  # placement start slice
    size: int  # placement size in slices
    memory_bytes: int
    multiprocessors: int
    parent_uuid: str
    parent_minor: int


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """A physical GPU as discovery (real NVML or the fake backend) reports it."""

    uuid: str
    index: int
    minor: int
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str  # "7.5"
    driver_version: str  # "550.54.15"
    cuda_driver_version: str  # "12.4"
    memory_bytes: int
    multiprocessors: int
    pci_bus_id: str | None = None  # "0000:3b:00.0"
    pcie_root: str | None = None  # "pci0000:3a"
    numa_node: int | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigInfo, ...] = ()

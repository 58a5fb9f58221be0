"""What discovery reports: one :class:`GpuInfo` per physical GPU, with its existing MIG
partitions as :class:`MigInfo` children and, for a MIG-capable GPU, its MIG profile table
(:class:`MigProfile`). Frozen values; every backend (real NVML, the fake profiles) returns
these, and everything on the node is derived from them. A :class:`HealthEvent` is one health
change a backend reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class MigInfo:
    """An existing MIG partition as NVML reports it.

    ``gi_id`` / ``ci_id`` are its GPU and compute instance IDs, ``caps`` the capability device
    nodes (``/dev/nvidia-caps/nvidia-cap<N>``) a container needs to open it (empty when the
    backend could not read them).
    """

    uuid: str
    profile: str  # e.g. "1g.5gb"
    start: int  # placement start slice
    size: int  # placement size in slices
    memory_bytes: int
    multiprocessors: int
    parent_uuid: str
    parent_minor: int
    gi_id: int | None = None
    ci_id: int | None = None
    caps: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile of a MIG-capable GPU, as ``nvidia-smi mig -lgip`` / ``-lgipp``
    print it: what an instance of it gets, and where it may start.

    ``size`` is the placement size in memory slices, ``placements`` the allowed starts,
    ``compute_slices`` the GPU instance's compute slices (the ``<n>g`` of the name). The media
    engines (decoders, encoders, JPEG, OFA) are what an instance takes of the GPU's; profiles
    such as ``1g.10gb+me`` differ from their plain twin only there.
    """

    name: str
    memory_bytes: int
    multiprocessors: int
    size: int
    placements: tuple[int, ...]
    compute_slices: int
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0
    profile_id: int | None = None  # NVML's GPU instance profile ID, where known


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
    mig_profiles: tuple[MigProfile, ...] = ()  # the profile table (MIG-capable GPUs)


HealthEventKind = Literal["xid", "lost", "recovered"]
"""``xid``: NVML reported a critical Xid error on the GPU; ``lost``: the GPU fell off the bus or
stopped answering; ``recovered``: a previously unhealthy GPU is usable again."""


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """One health change of one physical GPU (or of a MIG partition, by its own UUID)."""

    uuid: str
    kind: HealthEventKind
    xid: int | None = None
    message: str = ""

    def describe(self) -> str:
        """A one-line human description, for logs and taint values."""
        if self.kind == "xid":
            text = f"GPU {self.uuid}: Xid {self.xid}"
        elif self.kind == "lost":
            text = f"GPU {self.uuid}: lost"
        else:
            text = f"GPU {self.uuid}: recovered"
        return f"{text} ({self.message})" if self.message else text

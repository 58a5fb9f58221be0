"""The sharing strategies' registry and the daemons a claim's allocations need."""

from __future__ import annotations

from pathlib import Path

from driver.api.config import STRATEGIES
from driver.discovery.devices import DeviceTable, NodeDevice
from kubeletplugin import sharing
from kubeletplugin.mps import MpsDaemon
from kubeletplugin.sharing import DeviceAllocation, SharingPaths
from tests.unit.builders import gpu_info

MIB = 1024 * 1024
PATHS = SharingPaths(
    hami_core_library=Path("/opt/hami/libvgpu.so"),
    hami_lock_dir=Path("/tmp/vgpulock"),
    mps_root=Path("/run/biaxial/mps"),
)


def gpu(minor: int) -> NodeDevice:
    device = DeviceTable.from_gpus([gpu_info(minor, memory_mib=16384)]).published_device(
        f"gpu-{minor}"
    )
    assert device is not None
    return device


def test_every_strategy_of_the_vocabulary_has_its_module() -> None:
    """The GpuConfig vocabulary (``sharing.strategy``) and the registry agree, name by name."""
    assert [sharing.strategy(name).name for name in STRATEGIES] == list(STRATEGIES)
    assert sharing.UNLIMITED == "none"  # exclusive devices: time-slicing, nothing to limit


def test_only_mps_allocations_need_daemons_one_per_gpu_with_summed_limits() -> None:
    allocations = [
        DeviceAllocation("a", gpu(1), "mps", "s1", memory_limit_bytes=1000 * MIB, cores_percent=10),
        DeviceAllocation("a", gpu(1), "mps", "s2", memory_limit_bytes=500 * MIB, cores_percent=5),
        DeviceAllocation("b", gpu(0), "mps"),  # a whole device: no memory limit
        DeviceAllocation("c", gpu(2), "hami-core", "s3", memory_limit_bytes=MIB, cores_percent=1),
        DeviceAllocation("d", gpu(3), "none"),
    ]
    assert sharing.daemons("u1", allocations, PATHS) == (
        MpsDaemon(Path("/run/biaxial/mps/u1/gpu-0"), gpu(0).uuid, None, 0),
        MpsDaemon(Path("/run/biaxial/mps/u1/gpu-1"), gpu(1).uuid, 1500 * MIB, 15),
    )

"""The real NVML backend's logic, run against a small in-memory stand-in for the ``pynvml``
module and a sysfs tree under a temp dir: what it reads, how it normalises, MIG enumeration,
the SM-count fallback, health events, and its errors. (Real hardware: ``tests/gpu/``.)"""

from __future__ import annotations

import ctypes
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from driver.api.errors import DiscoveryError, MigError
from driver.discovery.backend import HealthEvent
from driver.discovery.real import (
    NvmlBackend,
    cores_per_sm,
    mig_caps,
    mig_memory_gb,
    normalize_pci_bus_id,
    pci_topology,
)

MIB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            3: "Not Supported",
            6: "Not Found",
            10: "Timeout",
            12: "NVML Shared Library Not Found",
            15: "GPU is lost",
        }.get(self.value, f"NVML error {self.value}")


def _error(name: str, value: int) -> type[NVMLError]:
    def init(self: NVMLError) -> None:
        NVMLError.__init__(self, value)

    return type(name, (NVMLError,), {"__init__": init})


NotSupported = _error("NVMLError_NotSupported", 3)
NotFound = _error("NVMLError_NotFound", 6)
Timeout = _error("NVMLError_Timeout", 10)
LibraryNotFound = _error("NVMLError_LibraryNotFound", 12)
GpuIsLost = _error("NVMLError_GpuIsLost", 15)


@dataclass
class Mig:
    uuid: str
    gi_id: int
    profile_id: int
    start: int
    size: int
    memory_mib: int
    sms: int
    gi_slices: int
    ci_slices: int
    ci_id: int = 0


@dataclass(frozen=True)
class Row:
    """One GPU instance profile as NVML describes it (A100-40GB numbers)."""

    name: bytes
    slices: int
    size: int
    memory_mib: int
    sms: int
    placements: tuple[int, ...]
    decoders: int = 0
    jpegs: int = 0
    ofas: int = 0


A100_40GB_ROWS = {
    0: Row(b"MIG 1g.5gb", 1, 1, 4864, 14, (0, 1, 2, 3, 4, 5, 6)),
    7: Row(b"MIG 1g.5gb+me", 1, 1, 4864, 14, (0, 1, 2, 3, 4, 5, 6), 1, 1, 1),
    9: Row(b"MIG 3g.20gb", 3, 4, 20096, 42, (0, 4), 2),
    19: Row(b"MIG 7g.40gb", 7, 8, 40448, 98, (0,), 5, 1, 1),
}


class Placement(ctypes.Structure):
    _fields_ = (("start", ctypes.c_uint), ("size", ctypes.c_uint))


@dataclass
class GpuInstance:
    """A GPU instance handle of the stand-in (before and after its compute instance)."""

    gpu: Gpu
    gi_id: int
    profile_id: int
    start: int
    size: int


@dataclass
class Gpu:
    uuid: str
    minor: int
    name: str
    bus_id: bytes
    memory_mib: int
    brand: int = 14
    arch: int = 6
    cc: tuple[int, int] = (7, 5)
    attributes_sms: int | None = None  # None: nvmlDeviceGetAttributes is NOT_SUPPORTED
    cores: int = 2560
    mig_mode: int | None = None  # None: NOT_SUPPORTED
    migs: list[Mig | None] = field(default_factory=list)
    lost: bool = False


class FakePynvml(types.ModuleType):
    """Just enough of pynvml's surface, with the same names and error classes."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NotSupported
    NVMLError_NotFound = NotFound
    NVMLError_Timeout = Timeout
    NVMLError_GpuIsLost = GpuIsLost
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x14
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
    nvmlEventTypeXidCriticalError = 0x8  # noqa: N815 - pynvml spells it so
    c_nvmlGpuInstancePlacement_t = Placement  # noqa: N815 - pynvml spells it so

    def __init__(self, gpus: list[Gpu], *, init_error: NVMLError | None = None) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.init_error = init_error
        self.calls: list[str] = []
        self.events: list[Any] = []
        self.profile_names = {i: row.name for i, row in A100_40GB_ROWS.items()}
        self.next_uuid = 0
        self.fail_compute_instance = False

    # system
    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "535.104.05"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12020

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    # devices (handles are the Gpu / Mig objects themselves)
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Gpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: Gpu | Mig) -> str:
        return handle.uuid

    def nvmlDeviceGetMinorNumber(self, handle: Gpu) -> int:
        return handle.minor

    def nvmlDeviceGetName(self, handle: Gpu) -> bytes:
        return handle.name.encode()

    def nvmlDeviceGetBrand(self, handle: Gpu) -> int:
        return handle.brand

    def nvmlDeviceGetArchitecture(self, handle: Gpu) -> int:
        return handle.arch

    def nvmlDeviceGetCudaComputeCapability(self, handle: Gpu) -> tuple[int, int]:
        return handle.cc

    def nvmlDeviceGetPciInfo(self, handle: Gpu) -> Any:
        return types.SimpleNamespace(busId=handle.bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Gpu) -> Any:
        if handle.lost:
            raise GpuIsLost()
        return types.SimpleNamespace(total=handle.memory_mib * MIB)

    def nvmlDeviceGetAttributes(self, handle: Gpu | Mig) -> Any:
        if isinstance(handle, Mig):
            return types.SimpleNamespace(
                multiprocessorCount=handle.sms,
                gpuInstanceSliceCount=handle.gi_slices,
                computeInstanceSliceCount=handle.ci_slices,
                memorySizeMB=handle.memory_mib,
            )
        if handle.attributes_sms is None:
            raise NotSupported()
        return types.SimpleNamespace(multiprocessorCount=handle.attributes_sms)

    def nvmlDeviceGetNumGpuCores(self, handle: Gpu) -> int:
        if handle.cores == 0:
            raise NotSupported()
        return handle.cores

    def nvmlDeviceGetMigMode(self, handle: Gpu) -> list[int]:
        if handle.mig_mode is None:
            raise NotSupported()
        return [handle.mig_mode, handle.mig_mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Gpu, profile: int) -> Any:
        if profile not in self.profile_names or handle.mig_mode is None:
            raise NotSupported()
        row = A100_40GB_ROWS[profile]
        return types.SimpleNamespace(
            id=profile,
            name=self.profile_names[profile],
            sliceCount=row.slices,
            memorySizeMB=row.memory_mib,
            multiprocessorCount=row.sms,
            decoderCount=row.decoders,
            encoderCount=0,
            jpegCount=row.jpegs,
            ofaCount=row.ofas,
        )

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Gpu, profile_id: int, array: Any, count: Any
    ) -> None:
        row = A100_40GB_ROWS[profile_id]
        for i, start in enumerate(row.placements):
            array[i].start = start
            array[i].size = row.size
        count._obj.value = len(row.placements)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Gpu, profile_id: int, placement: Placement
    ) -> GpuInstance:
        self.calls.append(f"create gi {profile_id}@{placement.start}")
        for mig in handle.migs:
            if (
                mig is not None
                and mig.start < placement.start + placement.size
                and (placement.start < mig.start + mig.size)
            ):
                raise NVMLError(25)  # NVML_ERROR_INSUFFICIENT_RESOURCES
        used = {m.gi_id for m in handle.migs if m is not None}
        gi_id = next(i for i in range(1, 15) if i not in used)
        return GpuInstance(handle, gi_id, profile_id, placement.start, placement.size)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: GpuInstance | Mig, profile: int, engine: int
    ) -> Any:
        slices = {0: 1, 2: 2, 3: 3, 4: 4, 6: 7}
        if profile not in slices:
            raise NotSupported()
        return types.SimpleNamespace(id=profile, sliceCount=slices[profile])

    def nvmlGpuInstanceCreateComputeInstance(self, gi: GpuInstance, ci_profile: int) -> Any:
        self.calls.append(f"create ci {ci_profile}")
        if self.fail_compute_instance:
            raise NVMLError(25)
        row = A100_40GB_ROWS[gi.profile_id]
        self.next_uuid += 1
        gi.gpu.migs.append(
            Mig(
                f"MIG-new-{self.next_uuid}",
                gi_id=gi.gi_id,
                profile_id=gi.profile_id,
                start=gi.start,
                size=gi.size,
                memory_mib=row.memory_mib,
                sms=row.sms,
                gi_slices=row.slices,
                ci_slices=row.slices,
            )
        )
        return gi

    def nvmlGpuInstanceDestroy(self, gi: GpuInstance | Mig) -> None:
        self.calls.append(f"destroy gi {gi.gi_id}")

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: Mig, ci_id: int) -> Mig:
        return gi

    def nvmlComputeInstanceDestroy(self, ci: Mig) -> None:
        self.calls.append(f"destroy ci {ci.uuid}")
        for gpu in self.gpus:
            if ci in gpu.migs:
                gpu.migs.remove(ci)

    def nvmlDeviceGetComputeInstanceId(self, handle: Mig) -> int:
        return handle.ci_id

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Gpu) -> int:
        return len(handle.migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Gpu, index: int) -> Mig:
        mig = handle.migs[index]
        if mig is None:
            raise NotFound()
        return mig

    def nvmlDeviceGetGpuInstanceId(self, handle: Mig) -> int:
        return handle.gi_id

    def nvmlDeviceGetGpuInstanceById(self, handle: Gpu, gi_id: int) -> Mig:
        return next(m for m in handle.migs if m is not None and m.gi_id == gi_id)

    def nvmlGpuInstanceGetInfo(self, gi: Mig | GpuInstance) -> Any:
        return types.SimpleNamespace(
            id=gi.gi_id,
            profileId=gi.profile_id,
            placement=types.SimpleNamespace(start=gi.start, size=gi.size),
        )

    # events
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: Gpu, kinds: int, event_set: str) -> None:
        self.calls.append(f"register {handle.uuid}")

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        if not self.events:
            raise Timeout()
        item = self.events.pop(0)
        if isinstance(item, NVMLError):
            raise item
        return item

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.calls.append("free")


def t4(uuid: str = "GPU-t4", minor: int = 0) -> Gpu:
    return Gpu(
        uuid=uuid, minor=minor, name="Tesla T4", bus_id=b"00000000:3B:00.0", memory_mib=15360
    )


def a100_with_mig() -> Gpu:
    return Gpu(
        uuid="GPU-a100",
        minor=1,
        name="NVIDIA A100-SXM4-40GB",
        bus_id=b"00000000:86:00.0",
        memory_mib=40960,
        brand=14,
        arch=7,
        cc=(8, 0),
        attributes_sms=108,
        mig_mode=1,
        migs=[
            Mig(
                "MIG-b",
                gi_id=2,
                profile_id=9,
                start=4,
                size=4,
                memory_mib=20096,
                sms=42,
                gi_slices=3,
                ci_slices=3,
            ),
            None,
            Mig(
                "MIG-a",
                gi_id=7,
                profile_id=0,
                start=0,
                size=1,
                memory_mib=4864,
                sms=14,
                gi_slices=1,
                ci_slices=1,
            ),
        ],
    )


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    t4_dir = root / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    t4_dir.mkdir(parents=True)
    (t4_dir / "numa_node").write_text("1\n", encoding="ascii")
    (devices / "0000:3b:00.0").symlink_to(t4_dir)
    a100_dir = root / "devices" / "pci0000:85" / "0000:85:01.0" / "0000:86:00.0"
    a100_dir.mkdir(parents=True)
    (a100_dir / "numa_node").write_text("-1\n", encoding="ascii")
    (devices / "0000:86:00.0").symlink_to(a100_dir)
    return root


def install(monkeypatch: pytest.MonkeyPatch, fake: FakePynvml) -> FakePynvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_discovery_reads_and_normalises_everything(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    fake = install(monkeypatch, FakePynvml([a100_with_mig(), t4()]))
    with NvmlBackend(sysfs=sysfs) as backend:
        first, second = backend.discover()
    assert fake.calls == ["init", "shutdown"]
    # sorted by minor, index kept from NVML's enumeration
    assert (first.uuid, first.index, first.minor) == ("GPU-t4", 1, 0)
    assert first.product_name == "Tesla T4"
    assert first.brand == "Nvidia"
    assert first.architecture == "Turing"
    assert first.cuda_compute_capability == "7.5"
    assert first.driver_version == "535.104.05"
    assert first.cuda_driver_version == "12.2"
    assert first.pci_bus_id == "0000:3b:00.0"
    assert first.pcie_root == "pci0000:3a"
    assert first.numa_node == 1
    assert first.memory_bytes == 15360 * MIB
    assert first.multiprocessors == 40  # 2560 CUDA cores / 64 per Turing SM
    assert (first.mig_capable, first.mig_enabled, first.mig_devices) == (False, False, ())
    assert second.architecture == "Ampere"
    assert second.multiprocessors == 108  # from nvmlDeviceGetAttributes
    assert second.pcie_root == "pci0000:85"
    assert second.numa_node is None  # sysfs says -1
    assert (second.mig_capable, second.mig_enabled) == (True, True)
    assert [
        (m.uuid, m.profile, m.start, m.size, m.memory_bytes // MIB, m.multiprocessors)
        for m in second.mig_devices
    ] == [
        ("MIG-a", "1g.5gb", 0, 1, 4864, 14),
        ("MIG-b", "3g.20gb", 4, 4, 20096, 42),
    ]
    assert {(m.parent_uuid, m.parent_minor) for m in second.mig_devices} == {("GPU-a100", 1)}


def test_profile_names_fall_back_to_nvidia_naming(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    fake = install(monkeypatch, FakePynvml([a100_with_mig()]))
    fake.profile_names = {}
    gpu = a100_with_mig()
    shared = Mig(
        "MIG-c",
        gi_id=2,
        profile_id=9,
        start=4,
        size=4,
        memory_mib=20096,
        sms=14,
        gi_slices=3,
        ci_slices=1,
    )
    gpu.migs = [gpu.migs[0], shared]
    fake.gpus = [gpu]
    with NvmlBackend(sysfs=sysfs) as backend:
        (found,) = backend.discover()
    assert [m.profile for m in found.mig_devices] == ["1c.3g.20gb", "3g.20gb"]


def test_missing_sysfs_gives_unknown_topology(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install(monkeypatch, FakePynvml([t4()]))
    with NvmlBackend(sysfs=tmp_path) as backend:
        (gpu,) = backend.discover()
    assert (gpu.pci_bus_id, gpu.pcie_root, gpu.numa_node) == ("0000:3b:00.0", None, None)


def test_no_library_is_a_clear_discovery_error(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakePynvml([], init_error=LibraryNotFound()))
    with pytest.raises(
        DiscoveryError,
        match=r"NVML is not available on this machine: NVML Shared Library Not Found; "
        r"use --fake PROFILE",
    ):
        NvmlBackend()


def test_package_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(DiscoveryError, match="nvidia-ml-py package is not installed"):
        NvmlBackend()


def test_no_gpu_is_a_clear_discovery_error_and_shuts_nvml_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = install(monkeypatch, FakePynvml([]))
    with pytest.raises(DiscoveryError, match="no GPU found"):
        NvmlBackend()
    assert fake.calls == ["init", "shutdown"]


def test_close_is_idempotent_and_closed_backend_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakePynvml([t4()]))
    backend = NvmlBackend()
    backend.close()
    backend.close()
    assert fake.calls == ["init", "shutdown"]
    with pytest.raises(DiscoveryError, match="closed"):
        backend.discover()


def test_nvml_call_failures_name_the_gpu_and_call(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    fake = install(monkeypatch, FakePynvml([t4()]))

    def broken(handle: Gpu) -> Any:
        raise NVMLError(999)

    monkeypatch.setattr(fake, "nvmlDeviceGetMemoryInfo", broken)
    with (
        NvmlBackend(sysfs=sysfs) as backend,
        pytest.raises(DiscoveryError, match=r"NVML memory info failed for GPU 0 \(GPU-t4\)"),
    ):
        backend.discover()


def test_health_events_skip_application_xids_and_find_lost_gpus(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    first, second = t4("GPU-x", 0), t4("GPU-y", 1)
    fake = install(monkeypatch, FakePynvml([first, second]))
    fake.events = [
        types.SimpleNamespace(device=first, eventType=0x8, eventData=13, gpuInstanceId=0xFFFFFFFF),
        types.SimpleNamespace(device=second, eventType=0x8, eventData=79, gpuInstanceId=0xFFFFFFFF),
        GpuIsLost(),
    ]
    with NvmlBackend(sysfs=sysfs) as backend:
        assert backend.wait_health_event(1.0) == HealthEvent(uuid="GPU-y", kind="xid", xid=79)
        second.lost = True
        assert backend.wait_health_event(1.0) == HealthEvent(
            uuid="GPU-y", kind="lost", message="GPU is lost"
        )
        assert backend.wait_health_event(0.01) is None
    assert "register GPU-x" in fake.calls
    assert "register GPU-y" in fake.calls
    assert fake.calls[-2:] == ["free", "shutdown"]


def test_mig_xids_are_reported_per_mig_device(monkeypatch: pytest.MonkeyPatch, sysfs: Path) -> None:
    gpu = a100_with_mig()
    fake = install(monkeypatch, FakePynvml([gpu]))
    fake.events = [types.SimpleNamespace(device=gpu, eventType=0x8, eventData=94, gpuInstanceId=2)]
    with NvmlBackend(sysfs=sysfs) as backend:
        backend.discover()
        assert backend.wait_health_event(1.0) == HealthEvent(
            uuid="MIG-b", kind="xid", xid=94, message="on GPU GPU-a100"
        )


def test_sm_count_falls_back_to_the_product_table(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    l4 = Gpu(
        uuid="GPU-l4",
        minor=0,
        name="NVIDIA L4",
        bus_id=b"00000000:3B:00.0",
        memory_mib=23034,
        cores=0,
    )
    install(monkeypatch, FakePynvml([l4]))
    with NvmlBackend(sysfs=sysfs) as backend:
        assert backend.discover()[0].multiprocessors == 58
    l4.name = "Mystery GPU"
    with (
        NvmlBackend(sysfs=sysfs) as backend,
        pytest.raises(DiscoveryError, match="not in the fallback table"),
    ):
        backend.discover()


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (b"00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:af:00.1", "0000:af:00.1"),
        ("00000001:01:00.0", "0001:01:00.0"),
    ],
)
def test_normalize_pci_bus_id(raw: str | bytes, normal: str) -> None:
    assert normalize_pci_bus_id(raw) == normal


def test_normalize_pci_bus_id_rejects_garbage() -> None:
    with pytest.raises(DiscoveryError, match="unparseable PCI bus ID"):
        normalize_pci_bus_id("not-a-bdf")


def test_pci_topology_of_an_unknown_device(tmp_path: Path) -> None:
    assert pci_topology("0000:01:00.0", tmp_path) == (None, None)


@pytest.mark.parametrize(
    ("memory_mib", "total_mib", "gb"),
    [
        (4864, 40960, 5),
        (9856, 40960, 10),
        (20096, 40960, 20),
        (40448, 40960, 40),
        (9728, 81920, 10),
        (80896, 81920, 80),
        (9984, 81559, 10),
        (20096, 81559, 20),
        (81152, 81559, 80),
    ],
)
def test_mig_memory_gb_follows_nvidia_profile_names(
    memory_mib: int, total_mib: int, gb: int
) -> None:
    assert mig_memory_gb(memory_mib, total_mib * MIB) == gb


def test_cores_per_sm_table() -> None:
    assert cores_per_sm(7, 5) == 64
    assert cores_per_sm(8, 0) == 64
    assert cores_per_sm(8, 6) == 128
    assert cores_per_sm(9, 0) == 128
    assert cores_per_sm(6, 1) == 128
    assert cores_per_sm(2, 0) is None


# --------------------------------------------------------------------------- MIG profiles and
# instances (the stand-in models NVML; real hardware never runs create/destroy in tests)


def test_profile_table_lists_placements_and_media_engines(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    install(monkeypatch, FakePynvml([a100_with_mig(), t4()]))
    with NvmlBackend(sysfs=sysfs) as backend:
        t4_gpu, a100 = backend.discover()
    assert t4_gpu.mig_profiles == ()
    rows = {p.name: p for p in a100.mig_profiles}
    assert sorted(rows) == ["1g.5gb", "1g.5gb+me", "3g.20gb", "7g.40gb"]
    assert rows["1g.5gb"].placements == (0, 1, 2, 3, 4, 5, 6)
    assert (rows["3g.20gb"].size, rows["3g.20gb"].compute_slices) == (4, 3)
    assert (rows["1g.5gb+me"].decoders, rows["1g.5gb+me"].jpegs, rows["1g.5gb+me"].ofas) == (
        1,
        1,
        1,
    )
    assert rows["7g.40gb"].profile_id == 19
    assert rows["7g.40gb"].memory_bytes == 40448 * MIB


def test_mig_devices_carry_instance_ids_and_their_caps_nodes(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path, tmp_path: Path
) -> None:
    proc = tmp_path / "proc"
    gi = proc / "driver" / "nvidia" / "capabilities" / "gpu1" / "mig" / "gi7"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 66\nDeviceFileMode: 292\n", encoding="ascii")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 67\nDeviceFileMode: 292\n")
    install(monkeypatch, FakePynvml([a100_with_mig()]))
    with NvmlBackend(sysfs=sysfs, proc=proc) as backend:
        (gpu,) = backend.discover()
    first, second = gpu.mig_devices
    assert (first.gi_id, first.ci_id) == (7, 0)
    assert first.caps == ("/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67")
    assert second.caps == ()  # procfs says nothing about gi2: no nodes rather than guessed ones


def test_mig_caps_needs_both_access_files(tmp_path: Path) -> None:
    base = tmp_path / "driver" / "nvidia" / "capabilities" / "gpu0" / "mig" / "gi1"
    base.mkdir(parents=True)
    (base / "access").write_text("DeviceFileMinor: 12\n", encoding="ascii")
    assert mig_caps(tmp_path, 0, 1, 0) == ()
    (base / "ci0").mkdir()
    (base / "ci0" / "access").write_text("garbage\n", encoding="ascii")
    assert mig_caps(tmp_path, 0, 1, 0) == ()
    (base / "ci0" / "access").write_text("DeviceFileMinor: 13\n", encoding="ascii")
    assert mig_caps(tmp_path, 0, 1, 0) == (
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    )


def test_create_places_a_gpu_and_a_compute_instance_and_destroy_removes_them(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    gpu = a100_with_mig()
    fake = install(monkeypatch, FakePynvml([gpu]))
    with NvmlBackend(sysfs=sysfs) as backend:
        created = backend.create_mig("GPU-a100", "1g.5gb", 2)
        assert (created.profile, created.start, created.size) == ("1g.5gb", 2, 1)
        assert created.uuid == "MIG-new-1"
        assert created.gi_id == 1  # the lowest free ID: 2 and 7 are taken
        assert "create gi 0@2" in fake.calls
        assert "create ci 0" in fake.calls  # the compute instance spanning 1 slice
        assert any(m.uuid == "MIG-new-1" for m in backend.discover()[0].mig_devices)
        assert backend.destroy_mig("GPU-a100", "MIG-new-1") is True
        assert fake.calls[-2:] == ["destroy ci MIG-new-1", "destroy gi 1"]
        assert backend.destroy_mig("GPU-a100", "MIG-new-1") is False
        assert all(m.uuid != "MIG-new-1" for m in backend.discover()[0].mig_devices)


def test_create_refuses_what_nvml_refuses_and_undoes_a_half_made_instance(
    monkeypatch: pytest.MonkeyPatch, sysfs: Path
) -> None:
    gpu = a100_with_mig()
    fake = install(monkeypatch, FakePynvml([gpu]))
    with NvmlBackend(sysfs=sysfs) as backend:
        with pytest.raises(MigError, match="not a possible placement"):
            backend.create_mig("GPU-a100", "3g.20gb", 2)
        with pytest.raises(MigError, match="no such profile"):
            backend.create_mig("GPU-a100", "9g.1tb", 0)
        with pytest.raises(MigError, match=r"create MIG 3g.20gb at 4 .*NVML: NVML error 25"):
            backend.create_mig("GPU-a100", "3g.20gb", 4)  # MIG-b holds 4-7
        with pytest.raises(MigError, match="GPU GPU-nope is not on this node"):
            backend.create_mig("GPU-nope", "1g.5gb", 0)
        fake.fail_compute_instance = True
        with pytest.raises(MigError, match="compute instance"):
            backend.create_mig("GPU-a100", "1g.5gb", 3)
        assert fake.calls[-1] == "destroy gi 1"  # the GPU instance went again
    assert [m.uuid for m in gpu.migs if m is not None] == ["MIG-b", "MIG-a"]

"""The real GPU backend on NVML (nvidia-ml-py, module ``pynvml``).

This is the only module that imports ``pynvml``, and it does so lazily (in
:func:`_import_pynvml`), so the rest of biaxial runs where the library or the driver is absent.

Contract:

* :class:`NvmlBackend` initialises NVML on construction and shuts it down on :meth:`close`
  (idempotent; also on context exit). A missing library, a missing driver or no GPU raises
  :class:`~driver.api.errors.DiscoveryError` with "NVML is not available on this machine: ...".
* :meth:`NvmlBackend.discover` reads every GPU: identity, product, brand, architecture,
  compute capability, driver and CUDA driver versions, normalised PCI bus ID
  (``0000:3b:00.0``), PCIe root (``pci<domain>:<bus>`` from the sysfs path, ``None`` when
  unknown), NUMA node (``None`` when sysfs says -1 or nothing), memory, SM count, MIG mode,
  the MIG profile table with each profile's possible placements and media engines (MIG-capable
  GPUs), and the existing MIG devices with profile name, placement, memory, SMs, GPU and
  compute instance IDs and their ``/dev/nvidia-caps`` nodes (read from
  ``/proc/driver/nvidia/capabilities``). All of this is read-only. Any NVML failure becomes a
  DiscoveryError naming the GPU and the call.
* :meth:`NvmlBackend.create_mig` / :meth:`NvmlBackend.destroy_mig` are the only calls that
  change anything, and only MIG instances: a GPU instance at an exact placement plus one
  compute instance spanning it, or the destruction of one instance by its UUID. They never
  change a GPU's MIG mode. The kubelet plugin calls them for dynamic MIG only; tests run them
  against the stand-in module, never against real hardware. Failures are
  :class:`~driver.api.errors.MigError`; a compute instance that cannot be created takes its
  new GPU instance down with it.
* :meth:`NvmlBackend.wait_health_event` registers for critical Xid events on first use and
  blocks up to the timeout. An Xid inside a MIG GPU instance is reported once per MIG device of
  that instance (by MIG UUID); other Xids by the GPU's UUID. Xids that signal application
  faults rather than GPU faults (:data:`APPLICATION_XIDS`, the NVIDIA device plugin's default
  skip list) are not reported.
  A GPU that falls off the bus is reported as ``lost``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Self

from driver.api.errors import DiscoveryError, MigError
from driver.discovery.gpus import GpuInfo, HealthEvent, MigInfo, MigProfile

log = logging.getLogger(f"biaxial.{__name__}")

NO_NVML_HINT: Final = "use --fake PROFILE to run without a GPU"

ARCHITECTURES: Final = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
}
"""NVML ``nvmlDeviceArchitecture_t`` values (NVML_DEVICE_ARCH_*) to family names."""

BRANDS: Final = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
"""NVML ``nvmlBrandType_t`` values (NVML_BRAND_*) to names."""

CORES_PER_SM: Final = {
    (3, None): 192,
    (5, None): 128,
    (6, 0): 64,
    (6, None): 128,
    (7, None): 64,
    (8, 0): 64,
    (8, None): 128,
    (9, None): 128,
    (10, None): 128,
    (12, None): 128,
}
"""CUDA cores per SM by compute capability ((major, minor) or (major, None) for the rest of
the family), used only when NVML cannot report the SM count directly."""

KNOWN_MULTIPROCESSORS: Final = (
    ("H100 PCIe", 114),
    ("H100 NVL", 132),
    ("H100", 132),
    ("H200", 132),
    ("H20", 78),
    ("B200", 148),
    ("A100", 108),
    ("A30", 56),
    ("A10G", 80),
    ("A10", 72),
    ("A40", 84),
    ("L40S", 142),
    ("L40", 142),
    ("L4", 58),
    ("T4", 40),
    ("V100", 80),
)
"""Last-resort SM counts by product-name substring (first match wins, so the more specific
names come first), for drivers that expose neither the SM count nor the CUDA core count."""


def known_multiprocessors(product_name: str) -> int | None:
    return next((count for key, count in KNOWN_MULTIPROCESSORS if key in product_name), None)


APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
"""Xids caused by the application (illegal address, page fault, stopped context, ...), not by
the GPU; the NVIDIA device plugin skips the same set by default."""

_PCIE_ROOT: Final = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
_MIG_ENABLED: Final = 1
_INVALID_ID: Final = 0xFFFFFFFF
_MAX_PLACEMENTS: Final = 32
_CAP_MINOR: Final = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)
CAPS_DEVICE_DIR: Final = "/dev/nvidia-caps"


def _import_pynvml() -> ModuleType:
    try:
        import pynvml  # noqa: PLC0415 - the lazy import is this module's contract
    except ImportError as exc:
        raise DiscoveryError(
            f"NVML is not available on this machine: the nvidia-ml-py package is not "
            f"installed ({exc}); {NO_NVML_HINT}"
        ) from exc
    module: ModuleType = pynvml
    return module


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def normalize_pci_bus_id(bus_id: str | bytes) -> str:
    """NVML's ``00000000:3B:00.0`` -> ``0000:3b:00.0`` (4-digit domain, lower case)."""
    text = _text(bus_id).strip().lower()
    match = re.fullmatch(r"([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])", text)
    if match is None:
        raise DiscoveryError(f"NVML reported an unparseable PCI bus ID {text!r}")
    domain, bus, dev, fn = match.groups()
    return f"{int(domain, 16):04x}:{bus}:{dev}.{fn}"


def pci_topology(bus_id: str, sysfs: Path = Path("/sys")) -> tuple[str | None, int | None]:
    """(PCIe root, NUMA node) of a PCI device from sysfs; ``None`` where unknown.

    The root is the ``pci<domain>:<bus>`` component of the device's resolved sysfs path, e.g.
    ``/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0`` -> ``pci0000:3a``.
    """
    device = sysfs / "bus" / "pci" / "devices" / bus_id
    root: str | None = None
    numa: int | None = None
    try:
        resolved = device.resolve(strict=True)
    except OSError:
        return None, None
    root = next((part for part in resolved.parts if _PCIE_ROOT.fullmatch(part)), None)
    try:
        value = int((resolved / "numa_node").read_text(encoding="ascii").strip())
        numa = value if value >= 0 else None
    except (OSError, ValueError):
        numa = None
    return root, numa


def mig_memory_gb(mig_memory_mib: int, total_memory_bytes: int) -> int:
    """The "<n>gb" of a MIG profile name, computed as NVIDIA names profiles: the partition's
    memory fraction rounded up to eighths, times the GPU's memory in whole GiB (rounded up)."""
    if total_memory_bytes <= 0:
        return 0
    gib = 1024**3
    fraction = mig_memory_mib * 1024 * 1024 / total_memory_bytes
    eighths = -(-int(fraction * 8 * 1000) // 1000)  # ceil, tolerant of float noise
    total_gb = -(-total_memory_bytes // gib)
    return round(eighths / 8 * total_gb)


def cores_per_sm(major: int, minor: int) -> int | None:
    return CORES_PER_SM.get((major, minor), CORES_PER_SM.get((major, None)))


def mig_caps(proc: Path, gpu_minor: int, gi_id: int, ci_id: int) -> tuple[str, ...]:
    """The capability device nodes a container needs to use one MIG instance: the GPU
    instance's and the compute instance's ``access`` files under
    ``/proc/driver/nvidia/capabilities/gpu<minor>/mig`` name their ``DeviceFileMinor``, the
    node is ``/dev/nvidia-caps/nvidia-cap<minor>``. Empty when procfs does not say."""
    base = proc / "driver" / "nvidia" / "capabilities" / f"gpu{gpu_minor}" / "mig" / f"gi{gi_id}"
    out: list[str] = []
    for access in (base / "access", base / f"ci{ci_id}" / "access"):
        try:
            match = _CAP_MINOR.search(access.read_text(encoding="ascii"))
        except (OSError, UnicodeDecodeError):
            return ()
        if match is None:
            return ()
        out.append(f"{CAPS_DEVICE_DIR}/nvidia-cap{int(match.group(1))}")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Parent:
    """The GPU whose MIG devices are being read: its handle and what naming them needs."""

    handle: Any
    where: str
    uuid: str
    minor: int
    memory: int
    names: dict[int, str]


def _profile_names(profiles: tuple[MigProfile, ...]) -> dict[int, str]:
    """GPU instance profile ID -> name ("1g.10gb", "1g.10gb+me")."""
    return {p.profile_id: p.name for p in profiles if p.profile_id is not None}


class NvmlBackend:
    """A :class:`~driver.discovery.backend.GpuBackend` on the real NVML library."""

    def __init__(self, *, sysfs: Path = Path("/sys"), proc: Path = Path("/proc")) -> None:
        self._nvml: Any = _import_pynvml()
        self._sysfs = sysfs
        self._proc = proc
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._handles: dict[str, Any] = {}
        self._mig_by_instance: dict[tuple[str, int], list[str]] = {}
        self._pending: collections.deque[HealthEvent] = collections.deque()
        self._lost: set[str] = set()
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise DiscoveryError(
                f"NVML is not available on this machine: {exc}; {NO_NVML_HINT}"
            ) from exc
        self._open = True
        try:
            count = self._nvml.nvmlDeviceGetCount()
        except self._nvml.NVMLError as exc:
            self.close()
            raise DiscoveryError(f"NVML cannot count GPUs: {exc}") from exc
        if count == 0:
            self.close()
            raise DiscoveryError(
                f"NVML is not available on this machine: no GPU found; {NO_NVML_HINT}"
            )

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        with self._lock:
            if not getattr(self, "_open", False):
                return
            self._open = False
            if self._event_set is not None:
                try:
                    self._nvml.nvmlEventSetFree(self._event_set)
                except self._nvml.NVMLError:
                    log.debug("nvmlEventSetFree failed", exc_info=True)
                self._event_set = None
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                log.warning("nvmlShutdown failed", exc_info=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if not self._open:
            raise DiscoveryError("the NVML backend is closed")

    def _call(self, what: str, where: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML {what} failed for {where}: {exc}") from exc

    # ----------------------------------------------------------------- discovery
    def discover(self) -> tuple[GpuInfo, ...]:
        self._check_open()
        nvml = self._nvml
        started = time.monotonic()
        driver_version = _text(
            self._call("driver version", "the system", nvml.nvmlSystemGetDriverVersion)
        )
        cuda = int(
            self._call("CUDA driver version", "the system", nvml.nvmlSystemGetCudaDriverVersion)
        )
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        count = int(self._call("device count", "the system", nvml.nvmlDeviceGetCount))
        self._mig_by_instance = {}
        gpus = [self._gpu(index, driver_version, cuda_version) for index in range(count)]
        log.info("discovered %d GPU(s) with NVML in %.3fs", len(gpus), time.monotonic() - started)
        return tuple(sorted(gpus, key=lambda g: g.minor))

    def _gpu(self, index: int, driver_version: str, cuda_version: str) -> GpuInfo:
        nvml = self._nvml
        where = f"GPU {index}"
        handle = self._call("handle", where, nvml.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(self._call("UUID", where, nvml.nvmlDeviceGetUUID, handle))
        where = f"GPU {index} ({uuid})"
        self._handles[uuid] = handle
        try:
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except nvml.NVMLError_NotSupported:
            minor = index
        name = _text(self._call("name", where, nvml.nvmlDeviceGetName, handle))
        brand = BRANDS.get(
            int(self._call("brand", where, nvml.nvmlDeviceGetBrand, handle)), "Unknown"
        )
        try:
            architecture = ARCHITECTURES.get(int(nvml.nvmlDeviceGetArchitecture(handle)), "Unknown")
        except nvml.NVMLError_NotSupported:
            architecture = "Unknown"
        major, minor_cc = self._call(
            "compute capability", where, nvml.nvmlDeviceGetCudaComputeCapability, handle
        )
        pci = self._call("PCI info", where, nvml.nvmlDeviceGetPciInfo, handle)
        bus_id = normalize_pci_bus_id(pci.busId)
        pcie_root, numa = pci_topology(bus_id, self._sysfs)
        memory = int(self._call("memory info", where, nvml.nvmlDeviceGetMemoryInfo, handle).total)
        sms = self._multiprocessors(handle, where, name, int(major), int(minor_cc))
        mig_capable, mig_enabled = self._mig_mode(handle, where)
        profiles = self._mig_profiles(handle, where) if mig_capable else ()
        parent = _Parent(handle, where, uuid, minor, memory, _profile_names(profiles))
        migs = self._mig_devices(parent) if mig_enabled else ()
        return GpuInfo(
            uuid=uuid,
            index=index,
            minor=minor,
            product_name=name,
            brand=brand,
            architecture=architecture,
            cuda_compute_capability=f"{major}.{minor_cc}",
            driver_version=driver_version,
            cuda_driver_version=cuda_version,
            memory_bytes=memory,
            multiprocessors=sms,
            pci_bus_id=bus_id,
            pcie_root=pcie_root,
            numa_node=numa,
            mig_capable=mig_capable,
            mig_enabled=mig_enabled,
            mig_devices=migs,
            mig_profiles=profiles,
        )

    def _multiprocessors(self, handle: Any, where: str, name: str, major: int, minor: int) -> int:
        """SM count: nvmlDeviceGetAttributes where the driver supports it for full GPUs, else
        CUDA cores (nvmlDeviceGetNumGpuCores) divided by the cores per SM of the architecture,
        else the product table :data:`KNOWN_MULTIPROCESSORS`."""
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount)
            if count > 0:
                return count
        except (nvml.NVMLError, AttributeError):
            log.debug("%s: nvmlDeviceGetAttributes unavailable, using the core count", where)
        per_sm = cores_per_sm(major, minor)
        try:
            cores = int(nvml.nvmlDeviceGetNumGpuCores(handle))
        except (nvml.NVMLError, AttributeError):
            log.debug("%s: nvmlDeviceGetNumGpuCores unavailable, using the product table", where)
            cores = 0
        if per_sm is not None and cores > 0:
            return cores // per_sm
        known = known_multiprocessors(name)
        if known is None:
            raise DiscoveryError(
                f"NVML cannot report the SM count of {where} ({name}, compute capability "
                f"{major}.{minor}) and the product is not in the fallback table"
            )
        return known

    def _mig_mode(self, handle: Any, where: str) -> tuple[bool, bool]:
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError_NotSupported:
            return False, False
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML MIG mode failed for {where}: {exc}") from exc
        return True, int(current) == _MIG_ENABLED

    def _mig_profiles(self, handle: Any, where: str) -> tuple[MigProfile, ...]:
        """The GPU instance profile table with possible placements (read-only queries). A
        profile NVML does not support on this GPU is skipped; a GPU that answers nothing
        (MIG mode off on some drivers) has an empty table."""
        nvml = self._nvml
        profiles: list[MigProfile] = []
        for index in range(int(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except nvml.NVMLError:
                continue
            profile_id = int(info.id)
            starts, size = self._placements(handle, profile_id, where)
            memory_mib = int(getattr(info, "memorySizeMB", 0))
            slices = int(getattr(info, "sliceCount", 0))
            name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
            if not name and slices and memory_mib:
                name = f"{slices}g.{memory_mib * 1024 * 1024 // 1024**3 + 1}gb"
            if not name or not starts or not slices:
                log.debug("%s: MIG profile %d incomplete in NVML, skipped", where, profile_id)
                continue
            profiles.append(
                MigProfile(
                    name=name,
                    memory_bytes=memory_mib * 1024 * 1024,
                    multiprocessors=int(getattr(info, "multiprocessorCount", 0)),
                    size=size,
                    placements=starts,
                    compute_slices=slices,
                    decoders=int(getattr(info, "decoderCount", 0)),
                    encoders=int(getattr(info, "encoderCount", 0)),
                    jpegs=int(getattr(info, "jpegCount", 0)),
                    ofas=int(getattr(info, "ofaCount", 0)),
                    profile_id=profile_id,
                )
            )
        return tuple(sorted(profiles, key=lambda p: (p.size, p.compute_slices, p.name)))

    def _placements(self, handle: Any, profile_id: int, where: str) -> tuple[tuple[int, ...], int]:
        """(possible placement starts, placement size) of one profile; ``((), 0)`` if NVML
        does not say."""
        nvml = self._nvml
        array = (nvml.c_nvmlGpuInstancePlacement_t * _MAX_PLACEMENTS)()
        count = ctypes.c_uint(_MAX_PLACEMENTS)
        try:
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                handle, profile_id, array, ctypes.byref(count)
            )
        except nvml.NVMLError as exc:
            log.debug("%s: placements of MIG profile %d unavailable: %s", where, profile_id, exc)
            return (), 0
        found = [(int(array[i].start), int(array[i].size)) for i in range(int(count.value))]
        if not found:
            return (), 0
        return tuple(sorted({start for start, _ in found})), found[0][1]

    def _mig_devices(self, parent: _Parent) -> tuple[MigInfo, ...]:
        nvml = self._nvml
        devices: list[MigInfo] = []
        where = parent.where
        maximum = int(
            self._call(
                "max MIG device count", where, nvml.nvmlDeviceGetMaxMigDeviceCount, parent.handle
            )
        )
        for slot in range(maximum):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
            except nvml.NVMLError_NotFound:
                continue
            except nvml.NVMLError as exc:
                raise DiscoveryError(f"NVML MIG device {slot} failed for {where}: {exc}") from exc
            devices.append(self._mig_info(mig, f"MIG device {slot} of {where}", parent))
        return tuple(sorted(devices, key=lambda m: (m.start, m.profile, m.uuid)))

    def _mig_info(self, mig: Any, mwhere: str, parent: _Parent) -> MigInfo:
        nvml = self._nvml
        mig_uuid = _text(self._call("UUID", mwhere, nvml.nvmlDeviceGetUUID, mig))
        attrs = self._call("attributes", mwhere, nvml.nvmlDeviceGetAttributes, mig)
        gi_id = int(self._call("GPU instance id", mwhere, nvml.nvmlDeviceGetGpuInstanceId, mig))
        try:
            ci_id: int | None = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
        except (nvml.NVMLError, AttributeError):
            ci_id = None
        self._mig_by_instance.setdefault((parent.uuid, gi_id), []).append(mig_uuid)
        gi = self._call(
            "GPU instance", mwhere, nvml.nvmlDeviceGetGpuInstanceById, parent.handle, gi_id
        )
        info = self._call("GPU instance info", mwhere, nvml.nvmlGpuInstanceGetInfo, gi)
        memory_mib = int(attrs.memorySizeMB)
        gi_slices = int(attrs.gpuInstanceSliceCount)
        ci_slices = int(attrs.computeInstanceSliceCount)
        profile = parent.names.get(int(info.profileId)) or (
            f"{gi_slices}g.{mig_memory_gb(memory_mib, parent.memory)}gb"
        )
        if ci_slices != gi_slices:
            profile = f"{ci_slices}c.{profile}"
        caps = mig_caps(self._proc, parent.minor, gi_id, ci_id) if ci_id is not None else ()
        return MigInfo(
            uuid=mig_uuid,
            profile=profile,
            start=int(info.placement.start),
            size=int(info.placement.size),
            memory_bytes=memory_mib * 1024 * 1024,
            multiprocessors=int(attrs.multiprocessorCount),
            parent_uuid=parent.uuid,
            parent_minor=parent.minor,
            gi_id=gi_id,
            ci_id=ci_id,
            caps=caps,
        )

    # ----------------------------------------------------------------- MIG instances
    def _gpu_handle(self, gpu_uuid: str) -> Any:
        if gpu_uuid not in self._handles:
            self.discover()
        handle = self._handles.get(gpu_uuid)
        if handle is None:
            raise MigError(f"GPU {gpu_uuid} is not on this node")
        return handle

    @contextlib.contextmanager
    def _mig_errors(self, what: str) -> Iterator[None]:
        """NVML errors inside become MigError ``<what>: NVML: <NVML's reason>``."""
        try:
            yield
        except self._nvml.NVMLError as exc:
            raise MigError(f"{what}: NVML: {exc}") from exc

    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigInfo:
        """Create a GPU instance of ``profile`` at ``start`` and one compute instance spanning
        it; returns the new MIG device. Never changes the GPU's MIG mode."""
        self._check_open()
        nvml = self._nvml
        with self._lock:
            handle = self._gpu_handle(gpu_uuid)
            what = f"create MIG {profile} at {start} on GPU {gpu_uuid}"
            with self._mig_errors(what):
                minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
                total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            table = self._mig_profiles(handle, what)
            row = next((p for p in table if p.name == profile), None)
            if row is None or row.profile_id is None:
                raise MigError(f"{what}: NVML lists no such profile on this GPU")
            if start not in row.placements:
                raise MigError(
                    f"{what}: not a possible placement (NVML allows "
                    f"{', '.join(map(str, row.placements))})"
                )
            placement = nvml.c_nvmlGpuInstancePlacement_t()
            placement.start = start
            placement.size = row.size
            with self._mig_errors(what):
                gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, row.profile_id, placement
                )
            try:
                with self._mig_errors(f"{what} (compute instance)"):
                    ci_profile = self._compute_profile(gi, row.compute_slices)
                    nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
                    gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
            except MigError:
                try:
                    nvml.nvmlGpuInstanceDestroy(gi)
                except nvml.NVMLError:
                    log.exception("%s: the new GPU instance could not be destroyed again", what)
                raise
            parent = _Parent(handle, what, gpu_uuid, minor, total, _profile_names(table))
            with self._mig_errors(what):
                for mig in self._mig_handles(handle):
                    if int(nvml.nvmlDeviceGetGpuInstanceId(mig)) == gi_id:
                        created = self._mig_info(mig, what, parent)
                        log.info(
                            "created MIG %s at %s on GPU %s: %s",
                            profile,
                            start,
                            gpu_uuid,
                            created.uuid,
                        )
                        return created
        raise MigError(f"{what}: the new instance does not appear among the MIG devices")

    def _mig_handles(self, handle: Any) -> Iterator[Any]:
        """The handles of the GPU's MIG devices (NVML errors other than an empty slot pass)."""
        nvml = self._nvml
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                yield nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_NotFound:
                continue

    def _compute_profile(self, gi: Any, compute_slices: int) -> int:
        """The compute instance profile ID spanning the whole GPU instance."""
        nvml = self._nvml
        for index in range(int(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
            try:
                info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except nvml.NVMLError:
                continue
            if int(info.sliceCount) == compute_slices:
                return int(info.id)
        raise MigError(f"no compute instance profile of {compute_slices} slice(s)")

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str) -> bool:
        """Destroy the MIG device ``mig_uuid`` (its compute instance, then its GPU instance);
        False when the GPU has no such device."""
        self._check_open()
        nvml = self._nvml
        with self._lock:
            handle = self._gpu_handle(gpu_uuid)
            what = f"destroy MIG {mig_uuid} on GPU {gpu_uuid}"
            with self._mig_errors(what):
                for mig in self._mig_handles(handle):
                    if _text(nvml.nvmlDeviceGetUUID(mig)) != mig_uuid:
                        continue
                    gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
                    ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
                    gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
                    nvml.nvmlComputeInstanceDestroy(
                        nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                    )
                    nvml.nvmlGpuInstanceDestroy(gi)
                    log.info("destroyed MIG %s on GPU %s", mig_uuid, gpu_uuid)
                    return True
        return False

    # ----------------------------------------------------------------- health
    def _register_events(self) -> None:
        nvml = self._nvml
        if not self._handles:
            self.discover()
        self._event_set = self._call("event set", "the system", nvml.nvmlEventSetCreate)
        for uuid, handle in sorted(self._handles.items()):
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                )
            except nvml.NVMLError_NotSupported:
                log.warning("GPU %s does not support Xid events; its health is not watched", uuid)
            except nvml.NVMLError as exc:
                raise DiscoveryError(
                    f"NVML event registration failed for GPU {uuid}: {exc}"
                ) from exc

    def _find_lost(self) -> None:
        nvml = self._nvml
        for uuid, handle in sorted(self._handles.items()):
            if uuid in self._lost:
                continue
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError_GpuIsLost:
                self._lost.add(uuid)
                self._pending.append(HealthEvent(uuid=uuid, kind="lost", message="GPU is lost"))
            except nvml.NVMLError:
                log.debug("GPU %s: probe failed", uuid, exc_info=True)

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        self._check_open()
        nvml = self._nvml
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            if self._event_set is None:
                self._register_events()
        while True:
            if self._pending:
                return self._pending.popleft()
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms < 0:
                return None
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, remaining_ms)
            except nvml.NVMLError_Timeout:
                return None
            except nvml.NVMLError_GpuIsLost:
                self._find_lost()
                continue
            except nvml.NVMLError as exc:
                raise DiscoveryError(f"NVML event wait failed: {exc}") from exc
            if int(data.eventType) != int(nvml.nvmlEventTypeXidCriticalError):
                continue
            xid = int(data.eventData)
            if xid in APPLICATION_XIDS:
                log.debug("ignoring application Xid %d", xid)
                continue
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                uuid = ""
            gi = int(getattr(data, "gpuInstanceId", _INVALID_ID))
            migs = self._mig_by_instance.get((uuid, gi), []) if gi != _INVALID_ID else []
            if not migs:
                detail = f"GPU instance {gi}" if gi != _INVALID_ID else ""
                return HealthEvent(uuid=uuid, kind="xid", xid=xid, message=detail)
            # An Xid inside a GPU instance concerns that instance's MIG devices only.
            self._pending.extend(
                HealthEvent(uuid=mig, kind="xid", xid=xid, message=f"on GPU {uuid}")
                for mig in sorted(migs)
            )


def nvml_library_present() -> bool:
    """Whether libnvidia-ml can be loaded and initialised here (used to skip GPU tests)."""
    try:
        backend = NvmlBackend()
    except DiscoveryError:
        return False
    backend.close()
    return True


__all__ = [
    "APPLICATION_XIDS",
    "ARCHITECTURES",
    "BRANDS",
    "KNOWN_MULTIPROCESSORS",
    "NvmlBackend",
    "cores_per_sm",
    "known_multiprocessors",
    "mig_caps",
    "mig_memory_gb",
    "normalize_pci_bus_id",
    "nvml_library_present",
    "pci_topology",
]

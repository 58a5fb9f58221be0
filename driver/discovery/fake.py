"""The fake GPU backend: deterministic GPUs described by YAML profiles, plus injectable health.

A profile is a YAML mapping (built-in ones live in ``driver/discovery/profiles/<name>.yaml``; any
file path works too; ``docs/simulator.md`` documents it for users)::

    apiVersion: biaxial.dev/v1alpha1    # optional, with kind: FakeGpuProfile
    kind: FakeGpuProfile
    description: 4 x Tesla T4            # free text
    driverVersion: "550.54.15"          # NVML system driver version
    cudaDriverVersion: "12.4"           # "major.minor", as derived from NVML
    model:                              # what every GPU of the node is
      productName: Tesla T4
      brand: Nvidia
      architecture: Turing
      cudaComputeCapability: "7.5"
      memoryMiB: 15360
      multiprocessors: 40
      migCapable: false
    count: 4                            # optional; defaults to len(gpus)
    gpus:                               # optional per-GPU topology and overrides, by index
      - {pciBusId: "0000:3b:00.0", pcieRoot: pci0000:3a, numaNode: 0}
      - {minor: 5, mig: {enabled: true, devices: [{profile: 3g.40gb, start: 4}]}}
    migProfiles:                        # the GPU's MIG profile table (MIG-capable models)
      - {name: 1g.10gb, memoryMiB: 9984, multiprocessors: 16, size: 1, placements: [0, 1]}

A per-GPU entry may also override any ``model`` key (``productName``, ``memoryMiB``, ...).
Unknown keys, wrong types, MIG partitions on a GPU that is not MIG-capable, unknown MIG
profiles, placements the table does not allow and overlapping partitions are all rejected with a
:class:`~driver.api.errors.DiscoveryError` naming the profile and the field.

UUIDs are derived from (node name, profile name, index[, MIG profile, start]) with SHA-256, so
they are stable across runs and differ between fake nodes that share a profile.

Health: :meth:`FakeBackend.inject`, :meth:`mark_lost`, :meth:`inject_xid` and
:meth:`mark_recovered` queue :class:`~driver.discovery.backend.HealthEvent` objects, which
:meth:`wait_health_event` returns in order (thread-safe, so a test thread can inject while the
plugin's event loop waits through ``asyncio.to_thread``). Discovery results do not change when
a GPU is marked lost: like NVML, the device stays enumerated and the health watcher decides.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import queue
import threading
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final, Self

import yaml

from driver.api.errors import DiscoveryError
from driver.api.yamltext import MAX_DEPTH, too_deep
from driver.discovery.backend import HealthEvent
from driver.discovery.gpus import GpuInfo, MigInfo

MIB: Final = 1024 * 1024
_LOADER: Final = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built in
MIG_MEMORY_SLICES: Final = 8  # placement positions on every MIG-capable GPU so far

_TOP_KEYS: Final = frozenset(
    {
        "apiVersion",
        "kind",
        "description",
        "driverVersion",
        "cudaDriverVersion",
        "model",
        "count",
        "gpus",
        "migProfiles",
    }
)
PROFILE_API_VERSION: Final = "biaxial.dev/v1alpha1"
PROFILE_KIND: Final = "FakeGpuProfile"
_MODEL_KEYS: Final = frozenset(
    {
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "memoryMiB",
        "multiprocessors",
        "migCapable",
    }
)
_GPU_KEYS: Final = _MODEL_KEYS | {"minor", "pciBusId", "pcieRoot", "numaNode", "mig"}
_MIG_PROFILE_KEYS: Final = frozenset({"name", "memoryMiB", "multiprocessors", "size", "placements"})
_MAX_FAKE_GPUS: Final = 4096


@functools.lru_cache(maxsize=1)
def builtin_profiles() -> tuple[str, ...]:
    """Names of the profiles shipped with the package, sorted."""
    folder = resources.files("driver.discovery").joinpath("profiles")
    return tuple(
        sorted(
            entry.name.removesuffix(".yaml")
            for entry in folder.iterdir()
            if entry.name.endswith(".yaml")
        )
    )


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One row of a GPU's MIG profile table (``nvidia-smi mig -lgip`` / ``-lgipp``)."""

    name: str
    memory_mib: int
    multiprocessors: int
    size: int  # placement size in memory slices
    placements: tuple[int, ...]  # allowed placement starts


@dataclass(frozen=True, slots=True)
class FakeProfile:
    """A parsed profile: the GPUs it describes and the MIG table they share."""

    name: str
    description: str
    gpus: tuple[GpuInfo, ...]
    mig_profiles: tuple[MigProfile, ...]


class FakeBackend:
    """A :class:`~driver.discovery.backend.GpuBackend` serving a profile's GPUs and injected
    health events."""

    def __init__(self, profile: FakeProfile) -> None:
        self._profile = profile
        self._events: queue.Queue[HealthEvent] = queue.Queue()
        self._lock = threading.Lock()
        self._unhealthy: dict[str, HealthEvent] = {}
        self._closed = False

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_profile(cls, profile: str, *, node_name: str = "") -> FakeBackend:
        """Load a built-in profile by name, or a profile file by path."""
        return cls(load_profile(profile, node_name=node_name))

    @property
    def profile(self) -> FakeProfile:
        return self._profile

    # ----------------------------------------------------------------- GpuBackend
    def discover(self) -> tuple[GpuInfo, ...]:
        self._check_open()
        return self._profile.gpus

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        self._check_open()
        try:
            return self._events.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- health injection
    def inject(self, event: HealthEvent) -> None:
        """Queue a health event for a GPU or MIG device of this backend."""
        self._resolve(event.uuid)
        with self._lock:
            if event.kind == "recovered":
                self._unhealthy.pop(event.uuid, None)
            else:
                self._unhealthy[event.uuid] = event
        self._events.put(event)

    def mark_lost(self, gpu: str | int, message: str = "GPU has fallen off the bus") -> HealthEvent:
        """Report a GPU (by UUID or index) as lost; returns the queued event."""
        event = HealthEvent(uuid=self._resolve(gpu), kind="lost", message=message)
        self.inject(event)
        return event

    def inject_xid(self, gpu: str | int, xid: int, message: str = "") -> HealthEvent:
        """Report a critical Xid error on a GPU (by UUID or index); returns the queued event."""
        if xid <= 0:
            raise DiscoveryError(f"Xid must be a positive integer, got {xid}")
        event = HealthEvent(uuid=self._resolve(gpu), kind="xid", xid=xid, message=message)
        self.inject(event)
        return event

    def mark_recovered(self, gpu: str | int) -> HealthEvent:
        """Report a GPU (by UUID or index) healthy again; returns the queued event."""
        event = HealthEvent(uuid=self._resolve(gpu), kind="recovered")
        self.inject(event)
        return event

    def unhealthy(self) -> Mapping[str, HealthEvent]:
        """The latest non-recovery event per unhealthy UUID (a snapshot copy)."""
        with self._lock:
            return dict(self._unhealthy)

    # ----------------------------------------------------------------- helpers
    def _check_open(self) -> None:
        if self._closed:
            raise DiscoveryError(f"fake GPU backend {self._profile.name!r} is closed")

    def _resolve(self, gpu: str | int) -> str:
        for info in self._profile.gpus:
            if gpu in (info.uuid, info.index):
                return info.uuid
            if any(gpu == mig.uuid for mig in info.mig_devices):
                return str(gpu)
        raise DiscoveryError(
            f"fake GPU backend {self._profile.name!r} has no GPU or MIG device {gpu!r}"
        )


# --------------------------------------------------------------------------- loading


def load_profile(profile: str, *, node_name: str = "") -> FakeProfile:
    """Parse a built-in profile (by name) or a profile file (by path) into GPUs. The same YAML
    text is parsed once per process (a simulated cluster of 5,000 nodes names a handful of
    profiles); only the per-node part (UUIDs) is derived per node."""
    available = builtin_profiles()
    if profile in available:
        text = (
            resources.files("driver.discovery")
            .joinpath("profiles", f"{profile}.yaml")
            .read_text(encoding="utf-8")
        )
        name = profile
    else:
        path = Path(profile)
        looks_like_path = (
            path.suffix in {".yaml", ".yml", ".json"} or "/" in profile or path.exists()
        )
        if not looks_like_path:
            raise DiscoveryError(
                f"unknown fake GPU profile {profile!r}; "
                f"available: {', '.join(available)} (or the path of a profile YAML file)"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DiscoveryError(
                f"cannot read fake GPU profile {profile!r}: {exc.strerror or exc}"
            ) from exc
        except UnicodeDecodeError as exc:
            raise DiscoveryError(
                f"fake GPU profile {profile!r} is not a text (UTF-8 YAML) file"
            ) from exc
        name = path.stem
    return _on_node(_template(profile, name, text), node_name)


@functools.lru_cache(maxsize=64)
def _template(profile: str, name: str, text: str) -> FakeProfile:
    """The profile parsed once per text, as for a node without a name (UUIDs aside, a profile
    is the same on every node)."""
    if too_deep(text):
        raise DiscoveryError(f"fake GPU profile {profile!r} is nested more than {MAX_DEPTH} deep")
    try:
        raw = _parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DiscoveryError(
            f"fake GPU profile {profile!r} is not valid YAML{where}: {problem}"
        ) from exc
    return parse_profile(raw, name=name)


def _on_node(template: FakeProfile, node_name: str) -> FakeProfile:
    """The template's GPUs with the UUIDs :func:`parse_profile` derives for ``node_name``."""
    if not node_name:
        return template
    gpus = []
    for gpu in template.gpus:
        gpu_uuid = _fake_uuid("GPU", node_name, template.name, str(gpu.index))
        migs = tuple(
            dataclasses.replace(
                mig,
                uuid=_fake_uuid(
                    "MIG", node_name, template.name, str(gpu.index), mig.profile, str(mig.start)
                ),
                parent_uuid=gpu_uuid,
            )
            for mig in gpu.mig_devices
        )
        gpus.append(dataclasses.replace(gpu, uuid=gpu_uuid, mig_devices=migs))
    return dataclasses.replace(template, gpus=tuple(gpus))


@functools.lru_cache(maxsize=64)
def _parse_yaml(text: str) -> Any:
    """The parsed document; :func:`parse_profile` never mutates it, so nodes may share it."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (libyaml's when built)


def parse_profile(raw: object, *, name: str, node_name: str = "") -> FakeProfile:
    """Turn a profile mapping into a :class:`FakeProfile`; every error names the field."""
    where = f"fake GPU profile {name!r}"
    top = _mapping(raw, where, _TOP_KEYS)
    if ("apiVersion" in top or "kind" in top) and (
        top.get("apiVersion"),
        top.get("kind"),
    ) != (PROFILE_API_VERSION, PROFILE_KIND):
        raise DiscoveryError(
            f"{where}: apiVersion and kind, when given, are {PROFILE_API_VERSION} and "
            f"{PROFILE_KIND}"
        )
    model = _mapping(top.get("model"), f"{where}: model", _MODEL_KEYS)
    for key in sorted(_MODEL_KEYS):
        if key not in model:
            raise DiscoveryError(f"{where}: model.{key} is required")
    driver_version = _string(top.get("driverVersion"), f"{where}: driverVersion")
    cuda_driver_version = _string(top.get("cudaDriverVersion"), f"{where}: cudaDriverVersion")
    overrides_raw = top.get("gpus", [])
    if not isinstance(overrides_raw, list):
        raise DiscoveryError(f"{where}: gpus must be a list")
    count = top.get("count", len(overrides_raw))
    if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= _MAX_FAKE_GPUS:
        raise DiscoveryError(f"{where}: count must be an integer from 1 to {_MAX_FAKE_GPUS}")
    if len(overrides_raw) > count:
        raise DiscoveryError(
            f"{where}: gpus lists {len(overrides_raw)} entries but count is {count}"
        )
    mig_profiles = tuple(
        _mig_profile(entry, f"{where}: migProfiles[{i}]")
        for i, entry in enumerate(_list(top.get("migProfiles", []), f"{where}: migProfiles"))
    )
    by_name = {p.name: p for p in mig_profiles}
    if len(by_name) != len(mig_profiles):
        raise DiscoveryError(f"{where}: migProfiles has duplicate names")

    gpus: list[GpuInfo] = []
    for index in range(count):
        gwhere = f"{where}: gpus[{index}]"
        entry = (
            _mapping(overrides_raw[index], gwhere, _GPU_KEYS) if index < len(overrides_raw) else {}
        )
        spec = {**model, **{k: v for k, v in entry.items() if k in _MODEL_KEYS}}
        gpu_uuid = _fake_uuid("GPU", node_name, name, str(index))
        minor = _int(entry.get("minor", index), f"{gwhere}.minor", minimum=0)
        mig_capable = _bool(spec["migCapable"], f"{gwhere}.migCapable")
        multiprocessors = _int(spec["multiprocessors"], f"{gwhere}.multiprocessors", minimum=1)
        mig_enabled, mig_devices = _mig_devices(
            entry.get("mig"),
            gwhere,
            capable=mig_capable,
            table=by_name,
            ids=(node_name, name, str(index)),
            parent_uuid=gpu_uuid,
            parent_minor=minor,
        )
        numa = entry.get("numaNode")
        gpus.append(
            GpuInfo(
                uuid=gpu_uuid,
                index=index,
                minor=minor,
                product_name=_string(spec["productName"], f"{gwhere}.productName"),
                brand=_string(spec["brand"], f"{gwhere}.brand"),
                architecture=_string(spec["architecture"], f"{gwhere}.architecture"),
                cuda_compute_capability=_string(
                    spec["cudaComputeCapability"], f"{gwhere}.cudaComputeCapability"
                ),
                driver_version=driver_version,
                cuda_driver_version=cuda_driver_version,
                memory_bytes=_int(spec["memoryMiB"], f"{gwhere}.memoryMiB", minimum=1) * MIB,
                multiprocessors=multiprocessors,
                pci_bus_id=_optional_string(entry.get("pciBusId"), f"{gwhere}.pciBusId"),
                pcie_root=_optional_string(entry.get("pcieRoot"), f"{gwhere}.pcieRoot"),
                numa_node=None if numa is None else _int(numa, f"{gwhere}.numaNode", minimum=0),
                mig_capable=mig_capable,
                mig_enabled=mig_enabled,
                mig_devices=mig_devices,
            )
        )
    minors = [g.minor for g in gpus]
    if len(set(minors)) != len(minors):
        raise DiscoveryError(f"{where}: two GPUs share a minor number")
    description = top.get("description", "")
    return FakeProfile(
        name=name,
        description=description if isinstance(description, str) else "",
        gpus=tuple(sorted(gpus, key=lambda g: g.minor)),
        mig_profiles=mig_profiles,
    )


def _mig_devices(
    raw: object,
    where: str,
    *,
    capable: bool,
    table: Mapping[str, MigProfile],
    ids: tuple[str, str, str],
    parent_uuid: str,
    parent_minor: int,
) -> tuple[bool, tuple[MigInfo, ...]]:
    if raw is None:
        return False, ()
    mig = _mapping(raw, f"{where}.mig", frozenset({"enabled", "devices"}))
    enabled = _bool(mig.get("enabled", False), f"{where}.mig.enabled")
    entries = _list(mig.get("devices", []), f"{where}.mig.devices")
    if enabled and not capable:
        raise DiscoveryError(f"{where}: MIG is enabled but the GPU is not MIG-capable")
    if entries and not enabled:
        raise DiscoveryError(f"{where}: MIG devices are listed but MIG is not enabled")
    used = [False] * MIG_MEMORY_SLICES
    devices: list[MigInfo] = []
    for i, entry_raw in enumerate(entries):
        dwhere = f"{where}.mig.devices[{i}]"
        entry = _mapping(entry_raw, dwhere, frozenset({"profile", "start"}))
        profile_name = _string(entry.get("profile"), f"{dwhere}.profile")
        profile = table.get(profile_name)
        if profile is None:
            known = ", ".join(sorted(table)) or "none"
            raise DiscoveryError(f"{dwhere}: unknown MIG profile {profile_name!r} (known: {known})")
        start = _int(entry.get("start"), f"{dwhere}.start", minimum=0)
        if start not in profile.placements:
            raise DiscoveryError(
                f"{dwhere}: {profile_name} cannot start at {start} "
                f"(allowed: {', '.join(map(str, profile.placements))})"
            )
        span = range(start, start + profile.size)
        if any(used[s] for s in span):
            raise DiscoveryError(f"{dwhere}: {profile_name} at {start} overlaps another partition")
        for s in span:
            used[s] = True
        devices.append(
            MigInfo(
                uuid=_fake_uuid("MIG", *ids, profile_name, str(start)),
                profile=profile_name,
                start=start,
                size=profile.size,
                memory_bytes=profile.memory_mib * MIB,
                multiprocessors=profile.multiprocessors,
                parent_uuid=parent_uuid,
                parent_minor=parent_minor,
            )
        )
    return enabled, tuple(sorted(devices, key=lambda m: m.start))


def _mig_profile(raw: object, where: str) -> MigProfile:
    entry = _mapping(raw, where, _MIG_PROFILE_KEYS)
    size = _int(entry.get("size"), f"{where}.size", minimum=1)
    placements = tuple(
        _int(p, f"{where}.placements[{i}]", minimum=0)
        for i, p in enumerate(_list(entry.get("placements"), f"{where}.placements"))
    )
    if not placements or any(p + size > MIG_MEMORY_SLICES for p in placements):
        raise DiscoveryError(
            f"{where}: placements must be non-empty and fit in {MIG_MEMORY_SLICES} memory slices"
        )
    return MigProfile(
        name=_string(entry.get("name"), f"{where}.name"),
        memory_mib=_int(entry.get("memoryMiB"), f"{where}.memoryMiB", minimum=1),
        multiprocessors=_int(entry.get("multiprocessors"), f"{where}.multiprocessors", minimum=1),
        size=size,
        placements=placements,
    )


def _fake_uuid(prefix: str, *parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return f"{prefix}-{uuidlib.UUID(bytes=digest[:16])}"


# --------------------------------------------------------------------------- typed field access


def _mapping(raw: object, where: str, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise DiscoveryError(f"{where} must be a mapping")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise DiscoveryError(f"{where}: unknown field(s) {', '.join(unknown)}")
    return raw


def _list(raw: object, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise DiscoveryError(f"{where} must be a list")
    return raw


def _string(raw: object, where: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise DiscoveryError(f'{where} must be a non-empty string (quote numbers like "12.4")')
    return raw


def _optional_string(raw: object, where: str) -> str | None:
    return None if raw is None else _string(raw, where)


def _int(raw: object, where: str, *, minimum: int) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < minimum:
        raise DiscoveryError(f"{where} must be an integer >= {minimum}, got {raw!r}")
    return raw


def _bool(raw: object, where: str) -> bool:
    if not isinstance(raw, bool):
        raise DiscoveryError(f"{where} must be true or false, got {raw!r}")
    return raw

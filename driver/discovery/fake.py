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
    mig: {enabled: true, dynamic: true} # optional default for GPUs without their own ``mig``
    gpus:                               # optional per-GPU topology and overrides, by index
      - {pciBusId: "0000:3b:00.0", pcieRoot: pci0000:3a, numaNode: 0}
      - {minor: 5, mig: {enabled: true, devices: [{profile: 3g.40gb, start: 4}]}}
    migProfiles:                        # the GPU's MIG profile table (MIG-capable models)
      - {name: 1g.10gb, memoryMiB: 9984, multiprocessors: 16, size: 1, placements: [0, 1],
         decoders: 1, jpegs: 1}         # optional: computeSlices (else the name's "<n>g"),
                                        # decoders, encoders, jpegs, ofas (media engines)

A per-GPU entry may also override any ``model`` key (``productName``, ``memoryMiB``, ...).
``mig.dynamic: true`` **declares dynamic MIG** on a GPU (it needs ``enabled: true``: MIG mode
is the administrator's): the simulator and a plugin running on the profile partition it on
demand (:attr:`FakeProfile.dynamic_mig`); partitions listed under ``devices`` then stand for
instances biaxial did not create. Unknown keys, wrong types, MIG partitions on a GPU that is
not MIG-capable, unknown MIG profiles, placements the table does not allow and overlapping
partitions are all rejected with a :class:`~driver.api.errors.DiscoveryError` naming the
profile and the field.

MIG instances (:meth:`FakeBackend.create_mig`, :meth:`FakeBackend.destroy_mig`) are modelled as
NVML does: creation needs MIG mode, a profile and start the table allows, no overlap with an
existing instance and enough compute slices and media engines left (else
:class:`~driver.api.errors.MigError`); each new instance gets a fresh random UUID (NVML's are
not reproducible either), the lowest free GPU instance ID and its ``/dev/nvidia-caps`` nodes.
:meth:`FakeBackend.fail_next` injects failures.
With a ``state_file`` the instances outlive the backend object, as NVML's outlive a process:
the state is read at start and written after every change (deleting the file models a
reboot, which destroys every instance but those the profile lists).

UUIDs are derived from (node name, profile name, index[, MIG profile, start]) with SHA-256, so
they are stable across runs and differ between fake nodes that share a profile.

Health: :meth:`FakeBackend.inject`, :meth:`mark_lost`, :meth:`inject_xid` and
:meth:`mark_recovered` queue :class:`~driver.discovery.gpus.HealthEvent` objects, which
:meth:`wait_health_event` returns in order (thread-safe, so a test thread can inject while the
plugin's event loop waits through ``asyncio.to_thread``). Discovery results do not change when
a GPU is marked lost: like NVML, the device stays enumerated and the health watcher decides.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import queue
import re
import tempfile
import threading
import uuid as uuidlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal, Self

import yaml

from driver.api.errors import DiscoveryError, MigError
from driver.api.yamltext import MAX_DEPTH, too_deep
from driver.discovery.gpus import GpuInfo, HealthEvent, MigInfo, MigProfile
from driver.discovery.mig import ENGINE_COUNTERS, MigGeometry, unusable_reason

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
        "mig",
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
_MIG_PROFILE_KEYS: Final = frozenset(
    {
        "name",
        "memoryMiB",
        "multiprocessors",
        "size",
        "placements",
        "computeSlices",
        "decoders",
        "encoders",
        "jpegs",
        "ofas",
    }
)
_MIG_KEYS: Final = frozenset({"enabled", "dynamic", "devices"})
_MAX_FAKE_GPUS: Final = 4096
_COMPUTE_SLICES: Final = re.compile(r"(?:\d+c\.)?(\d+)g\.")
CAPS_DIR: Final = "/dev/nvidia-caps"
MigOperation = Literal["create", "destroy"]


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
class FakeProfile:
    """A parsed profile: the GPUs it describes, the MIG table they share, and the GPUs (by
    UUID) on which it declares dynamic MIG."""

    name: str
    description: str
    gpus: tuple[GpuInfo, ...]
    mig_profiles: tuple[MigProfile, ...]
    dynamic_mig: frozenset[str] = frozenset()


def caps_paths(minor: int, gi_id: int, ci_id: int) -> tuple[str, str]:
    """The fake's ``/dev/nvidia-caps`` nodes of one instance (GPU instance, compute instance);
    the numbers are arbitrary but stable, as the real ones are per boot."""
    gi_cap = 10 + minor * 128 + gi_id * 8
    return (f"{CAPS_DIR}/nvidia-cap{gi_cap}", f"{CAPS_DIR}/nvidia-cap{gi_cap + 1 + ci_id}")


class FakeBackend:
    """A :class:`~driver.discovery.backend.GpuBackend` serving a profile's GPUs, their MIG
    instances and injected health events."""

    def __init__(self, profile: FakeProfile, *, state_file: Path | None = None) -> None:
        self._profile = profile
        self._events: queue.Queue[HealthEvent] = queue.Queue()
        self._lock = threading.Lock()
        self._unhealthy: dict[str, HealthEvent] = {}
        self._closed = False
        self._state_file = state_file
        self._instances: dict[str, tuple[MigInfo, ...]] = {
            g.uuid: g.mig_devices for g in profile.gpus
        }
        self._failures: list[tuple[MigOperation, str]] = []
        #: Called with each new instance once it exists (and is saved); tests use it to
        #: model a process that dies right after NVML created an instance.
        self.after_create: Callable[[MigInfo], None] | None = None
        if state_file is not None:
            self._load_state(state_file)

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_profile(
        cls, profile: str, *, node_name: str = "", state_file: Path | None = None
    ) -> FakeBackend:
        """Load a built-in profile by name, or a profile file by path."""
        return cls(load_profile(profile, node_name=node_name), state_file=state_file)

    @property
    def profile(self) -> FakeProfile:
        return self._profile

    @property
    def dynamic_mig(self) -> frozenset[str]:
        """UUIDs of the GPUs the profile declares dynamic MIG on."""
        return self._profile.dynamic_mig

    # ----------------------------------------------------------------- GpuBackend
    def discover(self) -> tuple[GpuInfo, ...]:
        self._check_open()
        with self._lock:
            return tuple(
                g
                if self._instances[g.uuid] == g.mig_devices
                else dataclasses.replace(g, mig_devices=self._instances[g.uuid])
                for g in self._profile.gpus
            )

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

    # ----------------------------------------------------------------- MIG instances
    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigInfo:
        """Create a GPU instance + compute instance of ``profile`` at ``start`` on a GPU."""
        self._check_open()
        with self._lock:
            self._take_failure("create", f"create {profile} at {start} on GPU {gpu_uuid}")
            gpu = self._gpu(gpu_uuid)
            where = f"GPU {gpu.minor} ({gpu_uuid})"
            if not gpu.mig_enabled:
                raise MigError(f"{where}: MIG mode is disabled; cannot create {profile}")
            row = next((p for p in gpu.mig_profiles if p.name == profile), None)
            if row is None:
                raise MigError(f"{where}: no MIG profile {profile!r}")
            if start not in row.placements:
                raise MigError(
                    f"{where}: {profile} cannot start at {start} "
                    f"(allowed: {', '.join(map(str, row.placements))})"
                )
            current = self._instances[gpu_uuid]
            clash = next(
                (m for m in current if m.start < start + row.size and start < m.start + m.size),
                None,
            )
            if clash is not None:
                raise MigError(
                    f"{where}: placement {start}+{row.size} of {profile} is taken by instance "
                    f"{clash.uuid} ({clash.profile} at {clash.start})"
                )
            self._check_resources(gpu, row, current, where)
            used = {m.gi_id for m in current}
            gi_id = next(i for i in range(1, len(current) + 2) if i not in used)
            # Random UUID, as NVML's: an instance re-created after a reboot is a new one.
            instance = _instance(
                f"MIG-{uuidlib.uuid4()}",
                row,
                start,
                parent_uuid=gpu_uuid,
                parent_minor=gpu.minor,
                gi_id=gi_id,
            )
            self._instances[gpu_uuid] = tuple(
                sorted((*current, instance), key=lambda m: (m.start, m.profile))
            )
            self._save_state()
        if self.after_create is not None:
            self.after_create(instance)
        return instance

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str) -> bool:
        """Destroy the instance ``mig_uuid`` of a GPU; False when there is none."""
        self._check_open()
        with self._lock:
            self._take_failure("destroy", f"destroy {mig_uuid} on GPU {gpu_uuid}")
            self._gpu(gpu_uuid)
            current = self._instances[gpu_uuid]
            remaining = tuple(m for m in current if m.uuid != mig_uuid)
            if remaining == current:
                return False
            self._instances[gpu_uuid] = remaining
            self._save_state()
            return True

    def fail_next(self, operation: MigOperation, message: str = "injected failure") -> None:
        """Make the next ``create`` or ``destroy`` fail with ``message`` (queued in order)."""
        with self._lock:
            self._failures.append((operation, message))

    def reset_instances(self) -> None:
        """Model a reboot: every instance is gone but those the profile lists."""
        with self._lock:
            self._instances = {g.uuid: g.mig_devices for g in self._profile.gpus}
            self._save_state()

    def _take_failure(self, operation: MigOperation, what: str) -> None:
        for i, (op, message) in enumerate(self._failures):
            if op == operation:
                del self._failures[i]
                raise MigError(f"NVML failed to {what}: {message}")

    def _gpu(self, gpu_uuid: str) -> GpuInfo:
        for gpu in self._profile.gpus:
            if gpu.uuid == gpu_uuid:
                return gpu
        raise MigError(f"fake GPU backend {self._profile.name!r} has no GPU {gpu_uuid!r}")

    @staticmethod
    def _check_resources(
        gpu: GpuInfo, row: MigProfile, current: tuple[MigInfo, ...], where: str
    ) -> None:
        """Compute slices and media engines: what the existing instances hold plus the new one
        must stay within the GPU's (the full profile's)."""
        if unusable_reason(gpu) is not None:
            return  # no full profile to measure against: placement rules only
        geometry = MigGeometry.of(gpu)
        rows = {p.name: p for p in gpu.mig_profiles}
        held = [rows[m.profile] for m in current if m.profile in rows]
        checks = [("compute slices", "compute_slices")] + [
            (counter, attr) for counter, attr in ENGINE_COUNTERS
        ]
        for what, attr in checks:
            total = getattr(geometry.full, attr)
            used = sum(getattr(p, attr) for p in held) + getattr(row, attr)
            if getattr(row, attr) and used > total:
                raise MigError(
                    f"{where}: not enough {what} left for {row.name} ({used} of {total} needed)"
                )

    # ----------------------------------------------------------------- persistence
    def _load_state(self, path: Path) -> None:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise DiscoveryError(f"fake MIG state {path}: unreadable ({exc})") from exc
        try:
            for gpu_uuid, entries in raw["instances"].items():
                self._gpu(gpu_uuid)
                self._instances[gpu_uuid] = tuple(
                    MigInfo(**{**e, "caps": tuple(e.get("caps") or ())}) for e in entries
                )
        except (KeyError, TypeError, ValueError, MigError) as exc:
            raise DiscoveryError(f"fake MIG state {path}: malformed ({exc})") from exc

    def _save_state(self) -> None:
        path = self._state_file
        if path is None:
            return
        data = {
            "instances": {
                uuid: [dataclasses.asdict(m) for m in migs]
                for uuid, migs in sorted(self._instances.items())
            },
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).replace(path)

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
            with self._lock:
                instances = self._instances[info.uuid]
            if any(gpu == mig.uuid for mig in instances):
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
    """The template's GPUs with the UUIDs :func:`parse_profile` derives for ``node_name`` (and
    the set of those declared dynamic-MIG renamed with them)."""
    if not node_name:
        return template
    gpus = []
    dynamic = set()
    for gpu in template.gpus:
        gpu_uuid = _fake_uuid("GPU", node_name, template.name, str(gpu.index))
        if gpu.uuid in template.dynamic_mig:
            dynamic.add(gpu_uuid)
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
    return dataclasses.replace(template, gpus=tuple(gpus), dynamic_mig=frozenset(dynamic))


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
    mig_profiles = _mig_table(top, where)
    default_mig = top.get("mig")
    if default_mig is not None:
        default_mig = _mapping(default_mig, f"{where}: mig", frozenset({"enabled", "dynamic"}))
    common = _ProfileCommon(
        model=model,
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        mig_profiles=mig_profiles,
        default_mig=default_mig,
    )
    gpus: list[GpuInfo] = []
    dynamic: set[str] = set()
    for index in range(count):
        gwhere = f"{where}: gpus[{index}]"
        entry = (
            _mapping(overrides_raw[index], gwhere, _GPU_KEYS) if index < len(overrides_raw) else {}
        )
        gpu, mig_dynamic = _gpu(common, entry, gwhere, index=index, ids=(node_name, name))
        gpus.append(gpu)
        if mig_dynamic:
            dynamic.add(gpu.uuid)
    minors = [g.minor for g in gpus]
    if len(set(minors)) != len(minors):
        raise DiscoveryError(f"{where}: two GPUs share a minor number")
    description = top.get("description", "")
    ordered = tuple(sorted(gpus, key=lambda g: g.minor))
    for gpu in ordered:
        if gpu.uuid in dynamic:
            problem = unusable_reason(gpu)
            if problem is not None:
                raise DiscoveryError(f"{where}: dynamic MIG declared but {problem}")
    return FakeProfile(
        name=name,
        description=description if isinstance(description, str) else "",
        gpus=ordered,
        mig_profiles=mig_profiles,
        dynamic_mig=frozenset(dynamic),
    )


@dataclass(frozen=True, slots=True)
class _ProfileCommon:
    """What a profile gives every GPU: the model (each GPU may override its fields), the
    driver versions, the MIG profile table and the default MIG settings."""

    model: Mapping[str, object]
    driver_version: str
    cuda_driver_version: str
    mig_profiles: tuple[MigProfile, ...]
    default_mig: object


def _mig_table(top: Mapping[str, object], where: str) -> tuple[MigProfile, ...]:
    """The profile's ``migProfiles``, each name once."""
    entries = _list(top.get("migProfiles", []), f"{where}: migProfiles")
    profiles = tuple(
        _mig_profile(entry, f"{where}: migProfiles[{i}]") for i, entry in enumerate(entries)
    )
    if len({p.name for p in profiles}) != len(profiles):
        raise DiscoveryError(f"{where}: migProfiles has duplicate names")
    return profiles


def _gpu(
    common: _ProfileCommon,
    entry: Mapping[str, object],
    gwhere: str,
    *,
    index: int,
    ids: tuple[str, str],
) -> tuple[GpuInfo, bool]:
    """The GPU at ``index`` (``entry`` its overrides, maybe empty), and whether its MIG is
    dynamic."""
    spec = {**common.model, **{k: v for k, v in entry.items() if k in _MODEL_KEYS}}
    gpu_uuid = _fake_uuid("GPU", *ids, str(index))
    minor = _int(entry.get("minor", index), f"{gwhere}.minor", minimum=0)
    mig_capable = _bool(spec["migCapable"], f"{gwhere}.migCapable")
    multiprocessors = _int(spec["multiprocessors"], f"{gwhere}.multiprocessors", minimum=1)
    mig_enabled, mig_dynamic, mig_devices = _mig_devices(
        entry.get("mig", common.default_mig),
        gwhere,
        capable=mig_capable,
        table={p.name: p for p in common.mig_profiles},
        ids=(*ids, str(index)),
        parent_uuid=gpu_uuid,
        parent_minor=minor,
    )
    if mig_dynamic and not common.mig_profiles:
        raise DiscoveryError(f"{gwhere}: dynamic MIG needs a migProfiles table")
    numa = entry.get("numaNode")
    gpu = GpuInfo(
        uuid=gpu_uuid,
        index=index,
        minor=minor,
        product_name=_string(spec["productName"], f"{gwhere}.productName"),
        brand=_string(spec["brand"], f"{gwhere}.brand"),
        architecture=_string(spec["architecture"], f"{gwhere}.architecture"),
        cuda_compute_capability=_string(
            spec["cudaComputeCapability"], f"{gwhere}.cudaComputeCapability"
        ),
        driver_version=common.driver_version,
        cuda_driver_version=common.cuda_driver_version,
        memory_bytes=_int(spec["memoryMiB"], f"{gwhere}.memoryMiB", minimum=1) * MIB,
        multiprocessors=multiprocessors,
        pci_bus_id=_optional_string(entry.get("pciBusId"), f"{gwhere}.pciBusId"),
        pcie_root=_optional_string(entry.get("pcieRoot"), f"{gwhere}.pcieRoot"),
        numa_node=None if numa is None else _int(numa, f"{gwhere}.numaNode", minimum=0),
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        mig_devices=mig_devices,
        mig_profiles=common.mig_profiles if mig_capable else (),
    )
    return gpu, mig_dynamic


def _mig_devices(
    raw: object,
    where: str,
    *,
    capable: bool,
    table: Mapping[str, MigProfile],
    ids: tuple[str, str, str],
    parent_uuid: str,
    parent_minor: int,
) -> tuple[bool, bool, tuple[MigInfo, ...]]:
    if raw is None:
        return False, False, ()
    mig = _mapping(raw, f"{where}.mig", _MIG_KEYS)
    enabled = _bool(mig.get("enabled", False), f"{where}.mig.enabled")
    dynamic = _bool(mig.get("dynamic", False), f"{where}.mig.dynamic")
    entries = _list(mig.get("devices", []), f"{where}.mig.devices")
    if enabled and not capable:
        raise DiscoveryError(f"{where}: MIG is enabled but the GPU is not MIG-capable")
    if entries and not enabled:
        raise DiscoveryError(f"{where}: MIG devices are listed but MIG is not enabled")
    if dynamic and not enabled:
        raise DiscoveryError(
            f"{where}: dynamic MIG needs mig.enabled: true (MIG mode is the administrator's; "
            "biaxial never changes it)"
        )
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
        uuid = _fake_uuid("MIG", *ids, profile_name, str(start))
        devices.append(
            _instance(
                uuid,
                profile,
                start,
                parent_uuid=parent_uuid,
                parent_minor=parent_minor,
                gi_id=len(devices) + 1,
            )
        )
    return enabled, dynamic, tuple(sorted(devices, key=lambda m: m.start))


def _instance(
    uuid: str, profile: MigProfile, start: int, *, parent_uuid: str, parent_minor: int, gi_id: int
) -> MigInfo:
    """A MIG device of ``profile`` at ``start``: GPU instance ``gi_id``, one compute instance
    (ID 0) spanning it, as biaxial and ``nvidia-smi mig -cgi ... -C`` create them."""
    return MigInfo(
        uuid=uuid,
        profile=profile.name,
        start=start,
        size=profile.size,
        memory_bytes=profile.memory_bytes,
        multiprocessors=profile.multiprocessors,
        parent_uuid=parent_uuid,
        parent_minor=parent_minor,
        gi_id=gi_id,
        ci_id=0,
        caps=caps_paths(parent_minor, gi_id, 0),
    )


def _mig_profile(raw: object, where: str) -> MigProfile:
    entry = _mapping(raw, where, _MIG_PROFILE_KEYS)
    name = _string(entry.get("name"), f"{where}.name")
    size = _int(entry.get("size"), f"{where}.size", minimum=1)
    if "computeSlices" in entry:
        compute = _int(entry["computeSlices"], f"{where}.computeSlices", minimum=1)
    else:
        match = _COMPUTE_SLICES.match(name)
        if match is None:
            raise DiscoveryError(
                f"{where}.computeSlices is required: the name {name!r} does not say it "
                '("<n>g.<memory>")'
            )
        compute = int(match.group(1))
    placements = tuple(
        _int(p, f"{where}.placements[{i}]", minimum=0)
        for i, p in enumerate(_list(entry.get("placements"), f"{where}.placements"))
    )
    if not placements or any(p + size > MIG_MEMORY_SLICES for p in placements):
        raise DiscoveryError(
            f"{where}: placements must be non-empty and fit in {MIG_MEMORY_SLICES} memory slices"
        )
    engines = {
        key: _int(entry.get(key, 0), f"{where}.{key}", minimum=0)
        for key in ("decoders", "encoders", "jpegs", "ofas")
    }
    return MigProfile(
        name=name,
        memory_bytes=_int(entry.get("memoryMiB"), f"{where}.memoryMiB", minimum=1) * MIB,
        multiprocessors=_int(entry.get("multiprocessors"), f"{where}.multiprocessors", minimum=1),
        size=size,
        placements=placements,
        compute_slices=compute,
        **engines,
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

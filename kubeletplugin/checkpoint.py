"""The kubelet plugin's checkpoint: which claims are prepared on this node, and how.

Contract:

* One JSON file (``<state_dir>/checkpoint.json``)::

      {"version": 4, "checksum": "<sha256 hex of the canonical data>", "data": {...}}

  The checksum covers the canonical form of ``data`` (``json.dumps(sort_keys=True,
  separators=(",", ":"))``), so formatting changes never break it and any edit of the content
  does.
* Versioned, with one migration per old version (:data:`MIGRATIONS`). Version 1 was a flat
  ``preparedClaims`` map without states, boot ID or sharing; version 2 added the two-phase
  state, the boot ID, the computed CDI spec, share capacity and the GPUs whose (shared,
  per-GPU) MPS daemon a claim used; version 3 records each claim's own MPS daemons (directory,
  GPU, limits) and which devices were allocated for admin access; version 4 (current) adds the
  MIG instances biaxial created for a claim (dynamic MIG), so a plugin that cannot read them
  refuses the file instead of losing track of them.
* Written atomically (temp file, fsync, rename, fsync directory) by :meth:`CheckpointStore.save`.
  Readers and writers serialize on :meth:`CheckpointStore.lock` (a ``filelock`` on
  ``<state_dir>/serialize.lock``, shared with any other plugin instance on the node).
* Two-phase: a claim is recorded ``PrepareStarted`` with everything needed to undo it before
  any side effect, and ``PrepareCompleted`` after. A MIG instance to create is recorded as an
  intent (:class:`MigRecord` with an empty ``uuid``: its GPU, profile and placement) before
  NVML is asked, and with its UUID right after, so a crash in between leaves enough to find
  the instance and finish or remove it.
* A missing file is an empty checkpoint. An unreadable, truncated, checksum-mismatched or
  unknown-version file raises :class:`~driver.api.errors.CheckpointError` naming the file and the
  problem; the file is left in place (it may describe live claims) and a copy is kept as
  ``checkpoint.json.corrupt-<timestamp>`` for inspection. Nothing is ever silently discarded.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from filelock import FileLock, Timeout

from driver.api.config import STRATEGIES, SharingStrategy
from driver.api.errors import CheckpointError
from kubeletplugin.cdi import atomic_write
from kubeletplugin.mps import MpsDaemon
from kubeletplugin.sharing.mps import MPS_CONTAINER_PIPE_DIR

JSON = dict[str, Any]

CURRENT_VERSION: Final = 4
CHECKPOINT_FILE: Final = "checkpoint.json"
LOCK_FILE: Final = "serialize.lock"

ClaimState = Literal["PrepareStarted", "PrepareCompleted"]
PREPARE_STARTED: Final[ClaimState] = "PrepareStarted"
PREPARE_COMPLETED: Final[ClaimState] = "PrepareCompleted"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim as the kubelet is told it (the DRA ``Device`` message)."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None

    @property
    def pool_name(self) -> str:
        """``pool``, as the DRA gRPC ``Device`` message names it."""
        return self.pool

    @property
    def device_name(self) -> str:
        """``device``, as the DRA gRPC ``Device`` message names it."""
        return self.device


@dataclass(frozen=True, slots=True)
class DeviceRecord(PreparedDevice):
    """One prepared allocation result: what the kubelet was told (the :class:`PreparedDevice`
    it is) and what the node holds for it. The one record of a device on the Prepare path:
    planned once, checkpointed, and answered to the kubelet (:meth:`prepared`)."""

    gpu_uuid: str  # the device's UUID (MIG UUID for a MIG device)
    exclusive: bool  # True: the whole device; False: a share of a shareable GPU
    memory_bytes: int  # reserved memory (the whole device's when exclusive)
    cores: int  # reserved compute percent (100 when exclusive)
    strategy: SharingStrategy
    # Allocated for administrative access: it neither blocks other claims nor is blocked by
    # them, and takes no share of the device's capacity (upstream's adminAccess).
    admin_access: bool = False

    def prepared(self) -> PreparedDevice:
        """The kubelet's part of the record."""
        return PreparedDevice(
            self.request_names, self.pool, self.device, self.cdi_device_ids, self.share_id
        )

    def to_json(self) -> JSON:
        return {
            "requestNames": list(self.request_names),
            "pool": self.pool,
            "device": self.device,
            "cdiDeviceIds": list(self.cdi_device_ids),
            "shareId": self.share_id,
            "gpuUuid": self.gpu_uuid,
            "exclusive": self.exclusive,
            "memoryBytes": self.memory_bytes,
            "cores": self.cores,
            "strategy": self.strategy,
            "adminAccess": self.admin_access,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DeviceRecord:
        strategy = raw["strategy"]
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}")
        share_id = raw.get("shareId")
        return cls(
            request_names=tuple(str(r) for r in raw["requestNames"]),
            pool=str(raw["pool"]),
            device=str(raw["device"]),
            cdi_device_ids=tuple(str(i) for i in raw["cdiDeviceIds"]),
            share_id=str(share_id) if share_id is not None else None,
            gpu_uuid=str(raw["gpuUuid"]),
            exclusive=bool(raw["exclusive"]),
            memory_bytes=int(raw["memoryBytes"]),
            cores=int(raw["cores"]),
            strategy=strategy,
            admin_access=bool(raw.get("adminAccess", False)),
        )


def daemon_to_json(daemon: MpsDaemon) -> JSON:
    return {
        "dir": str(daemon.directory),
        "gpuUuid": daemon.gpu_uuid,
        "memoryBytes": daemon.memory_bytes,
        "cores": daemon.cores,
    }


def daemon_from_json(raw: Mapping[str, Any]) -> MpsDaemon:
    directory = Path(str(raw["dir"]))
    if not directory.is_absolute() or ".." in directory.parts:
        raise ValueError(f"MPS daemon directory {str(directory)!r} is not a plain absolute path")
    memory = raw.get("memoryBytes")
    return MpsDaemon(
        directory=directory,
        gpu_uuid=str(raw["gpuUuid"]),
        memory_bytes=int(memory) if memory is not None else None,
        cores=int(raw.get("cores") or 0),
    )


@dataclass(frozen=True, slots=True)
class MigRecord:
    """A MIG instance biaxial created (or is creating) for a device of a claim (dynamic MIG).

    ``uuid`` is empty while it is only an intent (recorded before NVML was asked). Several
    claims sharing a dynamic GPU's whole device record the same instance (its full-size one);
    it is destroyed when the last of them goes.
    """

    device: str
    gpu_uuid: str
    profile: str
    start: int
    uuid: str = ""

    @property
    def placement(self) -> tuple[str, str, int]:
        """(GPU UUID, profile, start): what the device table calls an owned instance."""
        return (self.gpu_uuid, self.profile, self.start)

    def to_json(self) -> JSON:
        return {
            "device": self.device,
            "gpuUuid": self.gpu_uuid,
            "profile": self.profile,
            "start": self.start,
            "uuid": self.uuid,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> MigRecord:
        start = raw["start"]
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ValueError(f"MIG start {start!r} is not a placement")
        return cls(
            device=str(raw["device"]),
            gpu_uuid=str(raw["gpuUuid"]),
            profile=str(raw["profile"]),
            start=start,
            uuid=str(raw.get("uuid") or ""),
        )


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A claim in the checkpoint, with everything needed to unprepare it after the claim is
    deleted and to re-prepare it after a reboot (the exact CDI spec)."""

    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[DeviceRecord, ...]
    cdi_spec_file: str
    cdi_spec: Mapping[str, Any] = field(default_factory=dict)
    # The MPS control daemons this claim's containers use (its own; a record migrated from
    # version 2 names the per-GPU daemon it shared with other claims).
    mps_daemons: tuple[MpsDaemon, ...] = ()
    mig: tuple[MigRecord, ...] = ()  # MIG instances created for this claim's devices

    def to_json(self) -> JSON:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": self.state,
            "devices": [d.to_json() for d in self.devices],
            "cdiSpecFile": self.cdi_spec_file,
            "cdiSpec": dict(self.cdi_spec),
            "mpsDaemons": [daemon_to_json(d) for d in self.mps_daemons],
            "mig": [m.to_json() for m in self.mig],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ClaimRecord:
        state = raw["state"]
        if state not in (PREPARE_STARTED, PREPARE_COMPLETED):
            raise ValueError(f"unknown claim state {state!r}")
        spec = raw.get("cdiSpec") or {}
        if not isinstance(spec, Mapping):
            raise TypeError("cdiSpec is not an object")
        spec_file = str(raw["cdiSpecFile"])
        if "/" in spec_file or spec_file.startswith("."):
            raise ValueError(f"cdiSpecFile {spec_file!r} is not a plain file name")
        return cls(
            uid=str(raw["uid"]),
            namespace=str(raw["namespace"]),
            name=str(raw["name"]),
            state=state,
            devices=tuple(DeviceRecord.from_json(d) for d in raw["devices"]),
            cdi_spec_file=spec_file,
            cdi_spec=dict(spec),
            mps_daemons=tuple(daemon_from_json(d) for d in raw.get("mpsDaemons") or ()),
            mig=tuple(MigRecord.from_json(m) for m in raw["mig"]),
        )


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The whole checkpoint. ``boot_id`` ``None``: written before boot IDs were recorded."""

    boot_id: str | None = None
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)

    def with_claim(self, record: ClaimRecord) -> Checkpoint:
        return Checkpoint(boot_id=self.boot_id, claims={**self.claims, record.uid: record})

    def without_claim(self, uid: str) -> Checkpoint:
        return Checkpoint(
            boot_id=self.boot_id, claims={k: v for k, v in self.claims.items() if k != uid}
        )

    def with_boot_id(self, boot_id: str) -> Checkpoint:
        return Checkpoint(boot_id=boot_id, claims=self.claims)

    def mig_records(self, *, excluding: str = "") -> tuple[MigRecord, ...]:
        """Every MIG instance record of every claim (but ``excluding``'s)."""
        return tuple(m for uid, r in self.claims.items() if uid != excluding for m in r.mig)

    def owned_instances(self) -> frozenset[tuple[str, str, int]]:
        """(GPU UUID, profile, start) of every instance biaxial created or is creating."""
        return frozenset(m.placement for m in self.mig_records())

    def to_data(self) -> JSON:
        return {
            "bootId": self.boot_id,
            "claims": {uid: rec.to_json() for uid, rec in sorted(self.claims.items())},
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Checkpoint:
        boot_id = data.get("bootId")
        claims = {}
        for uid, raw in data["claims"].items():
            record = ClaimRecord.from_json(raw)
            if record.uid != uid:
                raise ValueError(f"claim entry {uid!r} holds uid {record.uid!r}")
            claims[uid] = record
        return cls(boot_id=str(boot_id) if boot_id is not None else None, claims=claims)


# --------------------------------------------------------------------------- encoding


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def checksum(data: Any) -> str:
    return hashlib.sha256(canonical(data)).hexdigest()


def encode(checkpoint: Checkpoint) -> bytes:
    """The file content of ``checkpoint`` at the current version."""
    data = checkpoint.to_data()
    envelope = {"version": CURRENT_VERSION, "checksum": checksum(data), "data": data}
    return (json.dumps(envelope, indent=1, sort_keys=True) + "\n").encode()


def _migrate_v1(data: Mapping[str, Any]) -> JSON:
    """v1 -> v2. v1 data: ``{"preparedClaims": {uid: {"namespace", "name", "devices": [{
    "requestNames", "pool", "device", "cdiDeviceIds"}], "cdiSpecFile"}}}``. v1 knew neither
    the two phases (every entry was complete), nor boot IDs, nor sharing (every device was
    exclusive, strategy none). Capacity of an exclusive device is recorded as unknown-large
    (it blocks any share, which is what exclusive means)."""
    claims: JSON = {}
    for uid, entry in data["preparedClaims"].items():
        claims[uid] = {
            "uid": uid,
            "namespace": entry["namespace"],
            "name": entry["name"],
            "state": PREPARE_COMPLETED,
            "devices": [
                {
                    "requestNames": list(d.get("requestNames") or ()),
                    "pool": d["pool"],
                    "device": d["device"],
                    "cdiDeviceIds": list(d.get("cdiDeviceIds") or ()),
                    "shareId": None,
                    "gpuUuid": d.get("uuid", ""),
                    "exclusive": True,
                    "memoryBytes": 0,
                    "cores": 100,
                    "strategy": "none",
                }
                for d in entry["devices"]
            ],
            "cdiSpecFile": entry.get("cdiSpecFile", ""),
            "cdiSpec": {},
            "mpsGpus": [],
        }
    return {"bootId": None, "claims": claims}


def _v2_daemon_dir(spec: Mapping[str, Any], gpu_uuid: str) -> str | None:
    """The host directory of the per-GPU daemon a version 2 claim's spec mounts for a GPU
    (``<mps root>/<GPU UUID>/pipe`` at the container's MPS pipe path)."""
    for device in spec.get("devices") or ():
        for mount in (device.get("containerEdits") or {}).get("mounts") or ():
            host = Path(str(mount.get("hostPath", "")))
            if (
                mount.get("containerPath") == MPS_CONTAINER_PIPE_DIR
                and host.name == "pipe"
                and host.parent.name == gpu_uuid
            ):
                return str(host.parent)
    return None


def _migrate_v2(data: Mapping[str, Any]) -> JSON:
    """v2 -> v3. v2 recorded ``mpsGpus``: GPUs whose one per-GPU daemon (``<mps root>/<GPU
    UUID>``, shared by every claim on the GPU, without limits of its own) the claim used. Each
    becomes an ``mpsDaemons`` entry for that directory, found in the claim's CDI spec, with no
    limits; the daemon keeps serving the claims prepared with it and stops with the last of
    them. Devices gain ``adminAccess: false`` (v2 did not record admin access)."""
    claims: JSON = {}
    for uid, entry in data["claims"].items():
        spec = entry.get("cdiSpec") or {}
        daemons = []
        for gpu in entry.get("mpsGpus") or ():
            directory = _v2_daemon_dir(spec, str(gpu))
            if directory is None:
                raise ValueError(f"claim {uid}: no MPS pipe mount for GPU {gpu} in its CDI spec")
            daemons.append({"dir": directory, "gpuUuid": gpu, "memoryBytes": None, "cores": 0})
        migrated = {k: v for k, v in entry.items() if k != "mpsGpus"}
        migrated["mpsDaemons"] = daemons
        migrated["devices"] = [{**d, "adminAccess": False} for d in entry["devices"]]
        claims[uid] = migrated
    return {"bootId": data.get("bootId"), "claims": claims}


def _migrate_v3(data: Mapping[str, Any]) -> JSON:
    """v3 -> v4. v3 did not know dynamic MIG: no claim had an instance biaxial created."""
    return {
        "bootId": data.get("bootId"),
        "claims": {uid: {**claim, "mig": []} for uid, claim in data["claims"].items()},
    }


#: ``MIGRATIONS[v]`` turns version ``v`` data into version ``v + 1`` data.
MIGRATIONS: Final[Mapping[int, Callable[[Mapping[str, Any]], JSON]]] = {
    1: _migrate_v1,
    2: _migrate_v2,
    3: _migrate_v3,
}


def decode(content: bytes, path: Path) -> Checkpoint:
    """Parse, verify and migrate file content; :class:`CheckpointError` on any problem (a file
    nested deeper than Python's parser or encoder recurses included: never a crash)."""
    try:
        return _decode(content, path)
    except RecursionError as exc:
        raise CheckpointError(
            f"checkpoint {path}: nested too deeply to read; not a checkpoint this plugin wrote"
        ) from exc


def _decode(content: bytes, path: Path) -> Checkpoint:
    try:
        envelope = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: not valid JSON ({exc}); truncated or damaged file"
        ) from exc

    if not isinstance(envelope, dict) or not {"version", "checksum", "data"} <= set(envelope):
        raise CheckpointError(
            f"checkpoint {path}: not a checkpoint (expected version, checksum and data)"
        )
    version = envelope["version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise CheckpointError(f"checkpoint {path}: version {version!r} is not an integer")
    if version > CURRENT_VERSION or (version < CURRENT_VERSION and version not in MIGRATIONS):
        raise CheckpointError(
            f"checkpoint {path}: unsupported version {version} (this plugin reads 1 to "
            f"{CURRENT_VERSION}); a newer plugin wrote it, downgrade is not supported"
        )
    data = envelope["data"]
    if envelope["checksum"] != checksum(data):
        raise CheckpointError(
            f"checkpoint {path}: checksum mismatch (stored {str(envelope['checksum'])[:12]}..., "
            f"content {checksum(data)[:12]}...); the file was modified or damaged"
        )
    try:
        while version < CURRENT_VERSION:
            data = MIGRATIONS[version](data)
            version += 1
        return Checkpoint.from_data(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: malformed content for version {envelope['version']} "
            f"({type(exc).__name__}: {exc})"
        ) from exc


# --------------------------------------------------------------------------- store


class CheckpointStore:
    """The checkpoint file of one state directory. Blocking; call from a worker thread."""

    def __init__(self, state_dir: Path, *, lock_timeout_s: float = 60.0) -> None:
        self.state_dir = state_dir
        self.path = state_dir / CHECKPOINT_FILE
        self.lock_path = state_dir / LOCK_FILE
        self._lock_timeout_s = lock_timeout_s

    def lock(self) -> FileLock:
        """The node-wide serialization lock (use as a context manager)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(self.lock_path, timeout=self._lock_timeout_s, thread_local=False)

    def load(self) -> Checkpoint:
        """Read the checkpoint (empty if none). Hold :meth:`lock` around load-modify-save."""
        try:
            content = self.path.read_bytes()
        except FileNotFoundError:
            return Checkpoint()
        except OSError as exc:
            raise CheckpointError(f"checkpoint {self.path}: cannot read ({exc})") from exc
        try:
            return decode(content, self.path)
        except CheckpointError as exc:
            aside = self._keep_aside(content)
            raise CheckpointError(
                f"{exc}. The file is left in place (it may describe claims in use) and a copy "
                f"is kept as {aside}; Prepare is refused because devices cannot be proven free. "
                f"Check which pods use GPUs on this node, then repair or remove {self.path}"
            ) from exc

    def save(self, checkpoint: Checkpoint) -> None:
        atomic_write(self.path, encode(checkpoint), mode=0o600)

    def _keep_aside(self, content: bytes) -> Path:
        """Copy the corrupt content next to the checkpoint, once per distinct content."""
        for existing in sorted(self.state_dir.glob(f"{CHECKPOINT_FILE}.corrupt-*")):
            try:
                if existing.read_bytes() == content:
                    return existing
            except OSError:
                continue
        aside = (
            self.state_dir
            / f"{CHECKPOINT_FILE}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        )
        if aside.exists():
            aside = aside.with_name(f"{aside.name}-{time.monotonic_ns()}")
        atomic_write(aside, content, mode=0o600)
        return aside


__all__ = [
    "CHECKPOINT_FILE",
    "CURRENT_VERSION",
    "LOCK_FILE",
    "MIGRATIONS",
    "PREPARE_COMPLETED",
    "PREPARE_STARTED",
    "Checkpoint",
    "CheckpointStore",
    "ClaimRecord",
    "ClaimState",
    "DeviceRecord",
    "MigRecord",
    "PreparedDevice",
    "Timeout",
    "decode",
    "encode",
]

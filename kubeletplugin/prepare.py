"""NodePrepareResources / NodeUnprepareResources: pure planning plus a thin transactional shell.

The gRPC handlers call :class:`Preparer`. Contract:

* **Per claim.** Every claim of a call appears in the result; one bad claim never fails its
  neighbours (its :class:`PrepareResult` carries ``error``). Errors name the claim, the
  request and the device, and never another tenant's objects: a device held by another claim
  is "prepared for another claim" (the holder is named in the node's log only).
* **Idempotent.** Preparing a prepared claim returns the same devices (healing a missing CDI
  spec or MPS daemon); unpreparing an unknown or deleted claim succeeds, using what the
  checkpoint cached (the API is not consulted).
* **Pure planning** (:func:`plan_claim`, :func:`find_conflict`): claim JSON + this node's
  device table (:class:`~driver.discovery.devices.DeviceTable`) + settings -> devices, CDI
  spec, MPS daemons; or a :class:`~driver.api.errors.PrepareError` /
  :class:`~driver.api.errors.ConfigError` (or the claim model's
  :class:`~driver.api.errors.ManifestError` for a malformed claim). The claim is read only
  through the core's claim model (:class:`~driver.api.claims.ResourceClaim`) and its
  ``GpuConfig`` entries through :mod:`driver.api.config`. Refused: UID mismatch, not
  allocated, results for another node's pool, devices the table does not publish, a device
  prepared for another claim (unless both are shares of a shareable GPU and the summed
  ``consumedCapacity`` stays within its memory and cores), a full GPU while one of its MIG
  partitions is prepared (and the reverse). Admin-access devices are exempt from the
  conflict rules in both directions, as upstream's allocator exempts them.
* The device table is the one the plugin derives per discovery; :meth:`Preparer.observe_inventory`
  replaces it. One call plans and checks against one table.
* **Transactional shell**, under the node-wide file lock ``<state_dir>/serialize.lock`` (two
  plugin pods overlap during a rolling update): load the checkpoint; recover (a
  ``PrepareStarted`` entry seen under the lock is a crashed Prepare: it is rolled back, and a
  retried Prepare redoes it; a changed boot ID rewrites every prepared claim's CDI spec and
  restarts its MPS daemons); mark claims ``PrepareStarted``; write CDI specs and start the
  claim's own MPS daemons (:mod:`kubeletplugin.mps`: one per claim and GPU, limits set on the
  daemon); mark ``PrepareCompleted``. Unprepare stops the claim's daemons; :meth:`Preparer.recover`
  (at start) also stops every daemon no prepared claim uses. Blocking work runs in
  ``asyncio.to_thread``.
* **Dynamic MIG.** A device of a dynamic-MIG GPU (a placement, or the whole GPU, which stands
  for its full-size instance) gets its MIG instance at Prepare: the claim is recorded
  ``PrepareStarted`` with the instance as an intent (GPU, profile, placement), the backend
  creates it, its UUID is recorded at once, then the CDI spec is computed for the real
  instance. The whole GPU's instance is shared by every claim holding a share of it (created
  for the first, destroyed after the last). Unprepare, reconciliation's release of a stale
  claim, and the rollback of a failed or crashed Prepare destroy what no other claim records;
  a crash between creation and the record is undone by finding the instance at the intent's
  placement. :meth:`Preparer.recover` (start-up) and a changed boot ID re-create the missing
  instances of prepared claims and rewrite their CDI specs. Instances biaxial did not create
  are never touched (only recorded UUIDs, or an intent's own placement, are ever destroyed).
  Shares of a dynamic GPU default to ``none`` (time-slicing): hami-core and MPS do not run on
  MIG instances.
* A corrupt checkpoint refuses every Prepare with its :class:`~driver.api.errors.CheckpointError`
  text (devices cannot be proven free); Unprepare proceeds: it removes the claim's CDI spec and
  stops its MPS daemons (both found by the claim's UID) and succeeds, so pods can finish
  terminating. Every read of the checkpoint reports its state to ``on_checkpoint`` (the app
  turns it into readiness and a node Event), so a repaired file is noticed at the next read.
* **Reconciliation support** (:mod:`kubeletplugin.reconcile` decides what is stale):
  :meth:`Preparer.snapshot` reads the checkpoint, :meth:`Preparer.release_stale` unprepares
  one completed claim unless the kubelet asked to prepare it since it first looked stale.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Protocol

from driver.api.claims import DeviceResult, ResourceClaim
from driver.api.config import GpuConfig, SharingStrategy, node_policy_error, resolve_configs
from driver.api.errors import BiaxialError, CheckpointError, ConfigError, MigError, PrepareError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.discovery.devices import DeviceTable, NodeDevice
from driver.discovery.gpus import GpuInfo, MigInfo
from driver.discovery.mig import MigGeometry, instance_at
from driver.discovery.slices import CAPACITY_CORES, CAPACITY_MEMORY
from kubeletplugin import cdi, sharing
from kubeletplugin.cdi import ClaimSpec
from kubeletplugin.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    DeviceRecord,
    MigRecord,
    PreparedDevice,
    Timeout,
)
from kubeletplugin.mps import MpsDaemon, MpsManager, MpsSettings
from kubeletplugin.sharing import DeviceAllocation, SharingPaths

log = logging.getLogger(f"biaxial.{__name__}")

BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
FULL_CORES: Final = 100


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet sends for a claim."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim this node has prepared (``completed``) or is preparing."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    completed: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PrepareSettings:
    """Settings of the Prepare core (built from the plugin's flags)."""

    driver_name: str = DEFAULT_DRIVER_NAME
    node_name: str
    state_dir: Path
    cdi_dir: Path = Path("/var/run/cdi")
    hami_core_library_path: Path | None = None  # host path of libvgpu.so for hami-core
    hami_lock_dir: Path = Path("/tmp/vgpulock")  # noqa: S108 - HAMi-core's node-wide lock dir
    mps_root: Path = Path("/run/biaxial/mps")
    mps_control_binary: str = "nvidia-cuda-mps-control"
    # Test-only, with a fake GPU profile: stand-in device nodes (see SharingPaths.device_dir).
    fake_device_dir: Path | None = None
    # Strategy for a *share* of a GPU when no GpuConfig names one. Exclusive devices default to
    # "none" (nothing to limit). "hami-core" refuses rather than run a share unlimited when the
    # library is not configured; set "none" to allow unlimited time-slicing by default.
    default_sharing_strategy: SharingStrategy = "hami-core"
    # The node's sharing policy: the strategies a share of a GPU may use here, whatever its
    # class or claim says (``--share-strategies``). Without "none", no share runs unlimited.
    share_strategies: tuple[SharingStrategy, ...] = ("hami-core", "mps")
    # The node's share cap (published as each shareable GPU's ``shares`` capacity); None: none.
    max_shares_per_gpu: int | None = None
    lock_timeout_s: float = 60.0


ClaimGetter = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
#: At most this many claim GETs in flight at once, across Prepare calls (a call naming hundreds
#: of claims must not open hundreds of requests to the API server at once).
MAX_CLAIM_READS: Final = 8
#: Told the checkpoint's state after every read: ``None`` readable, else the error's text.
#: Called from the worker thread that read it, only when the state changed.
CheckpointObserver = Callable[[str | None], None]


class MigBackend(Protocol):
    """What dynamic MIG needs of the GPU backend (both backends provide it)."""

    def discover(self) -> tuple[GpuInfo, ...]: ...

    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigInfo: ...

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str) -> bool: ...


# --------------------------------------------------------------------------- pure planning


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """Everything Prepare will do for one claim, computed without side effects.

    ``mig`` lists the MIG instances the claim's dynamic devices need (intents until created);
    while any is unknown, ``spec`` was computed for stand-ins and is recomputed by
    :meth:`realize` once the instances exist.
    """

    ref: ClaimRef
    devices: tuple[DeviceRecord, ...]
    spec: ClaimSpec
    mps_daemons: tuple[MpsDaemon, ...]
    allocations: tuple[DeviceAllocation, ...] = ()
    mig: tuple[MigRecord, ...] = ()
    driver: str = ""
    paths: SharingPaths | None = None

    def record(self, state: str) -> ClaimRecord:
        return ClaimRecord(
            uid=self.ref.uid,
            namespace=self.ref.namespace,
            name=self.ref.name,
            state=PREPARE_COMPLETED if state == PREPARE_COMPLETED else PREPARE_STARTED,
            devices=self.devices,
            cdi_spec_file=self.spec.file_name,
            cdi_spec=self.spec.spec,
            mps_daemons=self.mps_daemons,
            mig=self.mig,
        )

    def realize(self, instances: Mapping[str, MigInfo]) -> ClaimPlan:
        """The plan with each dynamic device backed by its instance (device name ->
        instance): the CDI spec computed for them, the device records naming them."""
        allocations = _backed(self.allocations, instances)
        assert self.paths is not None
        try:
            spec = cdi.build_claim_spec(self.driver, self.ref.uid, allocations, self.paths)
        except PrepareError as exc:
            raise PrepareError(f"claim {self.ref}: {exc}") from exc
        return replace(
            self, devices=_rebind(self.devices, allocations), spec=spec, allocations=allocations
        )


def _backed(
    allocations: Sequence[DeviceAllocation], instances: Mapping[str, MigInfo]
) -> tuple[DeviceAllocation, ...]:
    """``allocations`` with each dynamic target backed by its instance (by device name)."""
    return tuple(
        replace(a, target=replace(a.target, mig=instances[a.target.name]))
        if a.target.name in instances
        else a
        for a in allocations
    )


def _rebind(
    records: Sequence[DeviceRecord], allocations: Sequence[DeviceAllocation]
) -> tuple[DeviceRecord, ...]:
    """The records naming what the containers of each (realized) allocation are given."""
    return tuple(
        replace(r, gpu_uuid=a.target.container_uuid)
        for r, a in zip(records, allocations, strict=True)
    )


def device_record(
    alloc: DeviceAllocation, pool: str, cdi_device_ids: tuple[str, ...]
) -> DeviceRecord:
    """The record of one allocation result: the only place a :class:`DeviceRecord` is
    built on the Prepare path. A share records what it consumes; an exclusive device the
    whole device's memory and cores."""
    target = alloc.target
    exclusive = not alloc.share_id
    return DeviceRecord(
        request_names=(alloc.request,),
        pool=pool,
        device=target.name,
        cdi_device_ids=cdi_device_ids,
        share_id=alloc.share_id,
        gpu_uuid=target.uuid,
        exclusive=exclusive,
        memory_bytes=target.memory_bytes if exclusive else alloc.memory_limit_bytes or 0,
        cores=FULL_CORES if exclusive else alloc.cores_percent or 0,
        strategy=alloc.strategy,
        admin_access=alloc.admin_access,
    )


def _stand_in(target: NodeDevice) -> NodeDevice:
    """A dynamic device's target as it will be once its instance exists, for checking what
    the CDI spec would say before anything is created."""
    if target.placement is None:
        return target
    placement = target.placement
    instance = MigInfo(
        uuid=f"MIG-pending-{target.name}",
        profile=placement.profile.name,
        start=placement.start,
        size=placement.profile.size,
        memory_bytes=placement.profile.memory_bytes,
        multiprocessors=placement.profile.multiprocessors,
        parent_uuid=target.gpu.uuid,
        parent_minor=target.gpu.minor,
        caps=("/dev/nvidia-caps/pending",),
    )
    return replace(target, mig=instance)


def _strategy(
    config: GpuConfig | None, share_id: str | None, target: NodeDevice, settings: PrepareSettings
) -> SharingStrategy:
    """The sharing strategy of one allocation result."""
    if config is not None and config.sharing.strategy is not None:
        return config.sharing.strategy
    if share_id and not target.dynamic:
        return settings.default_sharing_strategy
    return sharing.UNLIMITED  # exclusive, or a share of a dynamic GPU's MIG instance


def _targets(
    ref: ClaimRef, results: Sequence[DeviceResult], settings: PrepareSettings, devices: DeviceTable
) -> list[NodeDevice]:
    """The device of each result, from this node's table."""
    targets: list[NodeDevice] = []
    for result in results:
        where = f"claim {ref} request {result.request!r}"
        if result.pool != settings.node_name:
            raise PrepareError(
                f"{where}: device {result.pool}/{result.device} is in pool "
                f"{result.pool!r}, not this node's pool {settings.node_name!r}"
            )
        target = devices.published_device(result.device)
        if target is None:
            names = ", ".join(sorted(d.name for d in devices.published))
            raise PrepareError(
                f"{where}: unknown device {result.device!r} (this node has {names or 'no devices'})"
            )
        targets.append(target)
    return targets


def _allocation(
    ref: ClaimRef,
    result: DeviceResult,
    target: NodeDevice,
    config: GpuConfig | None,
    settings: PrepareSettings,
) -> DeviceAllocation:
    """One result's allocation: its strategy and, for a share, the capacity it consumes."""
    request = result.request
    where = f"claim {ref} request {request!r} device {result.device!r}"
    share_id = result.share_id
    strategy = _strategy(config, share_id, target, settings)
    admin = bool(result.admin_access)
    if not share_id:
        return DeviceAllocation(
            request=request, target=target, strategy=strategy, admin_access=admin
        )
    if not target.shareable:
        raise PrepareError(f"{where}: has shareID {share_id} but is not shareable")
    if not target.dynamic and strategy not in settings.share_strategies:
        refusal = node_policy_error(strategy, settings.node_name, settings.share_strategies)
        raise ConfigError(f"{where}: {refusal}")
    memory_q = result.consumed(CAPACITY_MEMORY)
    cores_q = result.consumed(CAPACITY_CORES)
    # A share that names no memory reserves the whole GPU's (the published default).
    memory = target.memory_bytes if memory_q is None else memory_q.value()
    cores = 0 if cores_q is None else cores_q.value()
    if memory <= 0 or memory > target.memory_bytes or not 0 <= cores <= FULL_CORES:
        raise PrepareError(
            f"{where}: consumedCapacity out of range (memory {memory} of "
            f"{target.memory_bytes} bytes, cores {cores} of {FULL_CORES})"
        )
    return DeviceAllocation(
        request=request,
        target=target,
        strategy=strategy,
        share_id=share_id,
        memory_limit_bytes=memory,
        cores_percent=cores,
        admin_access=admin,
    )


def plan_claim(
    ref: ClaimRef,
    raw_claim: Mapping[str, Any],
    settings: PrepareSettings,
    devices: DeviceTable,
) -> ClaimPlan:
    """Plan the preparation of one claim from its API JSON. Pure; raises
    :class:`PrepareError`, :class:`ConfigError` or (malformed claim)
    :class:`~driver.api.errors.ManifestError` with a message naming the problem."""
    driver = settings.driver_name
    claim = ResourceClaim.from_api(raw_claim)
    if claim.uid != ref.uid:
        raise PrepareError(
            f"claim {ref.namespace}/{ref.name}: UID mismatch, the kubelet asked for {ref.uid} "
            f"but the API has {claim.uid or None} (the claim was deleted and recreated)"
        )
    allocation = claim.allocation
    if allocation is None:
        raise PrepareError(f"claim {ref}: not allocated (status.allocation is empty)")
    results = allocation.results_of(driver)
    if not results:
        raise PrepareError(f"claim {ref}: no devices of driver {driver} in its allocation")
    targets = _targets(ref, results, settings, devices)
    try:
        configs = resolve_configs(allocation.config, driver, [r.request for r in results])
    except ConfigError as exc:
        raise ConfigError(f"claim {ref}: {exc}") from exc
    allocations = tuple(
        _allocation(ref, result, target, configs.get(result.request), settings)
        for result, target in zip(results, targets, strict=True)
    )
    paths = sharing_paths(settings)
    mig = tuple(
        MigRecord(
            device=t.name,
            gpu_uuid=t.gpu.uuid,
            profile=t.placement.profile.name,
            start=t.placement.start,
        )
        for t in dict.fromkeys(targets)
        if t.placement is not None
    )
    checked = [replace(a, target=_stand_in(a.target)) for a in allocations]
    try:
        spec = cdi.build_claim_spec(driver, ref.uid, checked, paths)
    except PrepareError as exc:
        raise PrepareError(f"claim {ref}: {exc}") from exc
    return ClaimPlan(
        ref=ref,
        devices=tuple(
            device_record(a, settings.node_name, ids)
            for a, ids in zip(allocations, spec.cdi_device_ids, strict=True)
        ),
        spec=spec,
        mps_daemons=sharing.daemons(ref.uid, allocations, paths),
        allocations=allocations,
        mig=mig,
        driver=driver,
        paths=paths,
    )


def sharing_paths(settings: PrepareSettings) -> SharingPaths:
    return SharingPaths(
        hami_core_library=settings.hami_core_library_path,
        hami_lock_dir=settings.hami_lock_dir,
        mps_root=settings.mps_root,
        device_dir=settings.fake_device_dir,
    )


def _physical(device: str, devices: DeviceTable) -> str:
    known = devices.get(device)
    return device if known is None else known.physical_uuid


def _is_mig(device: str, devices: DeviceTable) -> bool:
    known = devices.get(device)
    return known is not None and known.is_mig


@dataclass(frozen=True, slots=True)
class Conflict:
    """Why a plan cannot be prepared next to the claims already prepared. ``message`` is for
    the claim's owner and names only the claim's own objects; ``holder`` (another tenant's
    claim, when one is in the way) is for the node's log."""

    message: str
    holder: ClaimRecord | None = None


def find_conflict(
    plan: ClaimPlan,
    checkpoint: Checkpoint,
    devices: DeviceTable,
    max_shares: int | None = None,
) -> Conflict | None:
    """The first reason ``plan`` cannot join the claims held in ``checkpoint`` (any state), or
    ``None``. ``devices`` is the table the plan was made with; ``max_shares`` the node's share
    cap (at most that many shares of one GPU are prepared, as the published ``shares``
    capacity allows). Pure.

    Admin access (upstream's ``adminAccess``: "ignore all ordinary claims to the device") is
    never blocked and never blocks: an admin-access device of either side is skipped, and
    admin-access shares count towards no capacity.
    """
    others = [
        (rec, dev)
        for rec in checkpoint.claims.values()
        if rec.uid != plan.ref.uid
        for dev in rec.devices
        if not dev.admin_access
    ]
    for mine in plan.devices:
        if mine.admin_access:
            continue
        physical = _physical(mine.device, devices)
        for rec, dev in others:
            if dev.device == mine.device:
                if dev.exclusive or mine.exclusive:
                    return Conflict(
                        f"claim {plan.ref}: device {mine.device} is already prepared for "
                        "another claim"
                        + (
                            ""
                            if dev.exclusive
                            else " as a share; an exclusive allocation cannot join it"
                        ),
                        rec,
                    )
            elif _physical(dev.device, devices) == physical and not (
                _is_mig(mine.device, devices) and _is_mig(dev.device, devices)
            ):
                # A full GPU and a MIG partition of it; distinct MIG partitions never overlap.
                return Conflict(
                    f"claim {plan.ref}: device {mine.device} overlaps {dev.device} on the same "
                    "GPU, which is prepared for another claim",
                    rec,
                )
    dynamic = _dynamic_conflict(plan, others, devices)
    if dynamic is not None:
        return dynamic
    # Capacity of each shared device: every prepared share plus this claim's.
    for device in sorted(
        {d.device for d in plan.devices if not d.exclusive and not d.admin_access}
    ):
        target = devices.get(device)
        if target is None:  # the plan was made with another table: plan again
            return Conflict(f"claim {plan.ref}: device {device} is not on this node")
        shares = [dev for _, dev in others if dev.device == device] + [
            d for d in plan.devices if d.device == device and not d.admin_access
        ]
        memory = sum(d.memory_bytes for d in shares)
        cores = sum(d.cores for d in shares)
        if memory > target.memory_bytes or cores > FULL_CORES:
            return Conflict(
                f"claim {plan.ref}: shares of device {device} would exceed its capacity "
                f"(memory {memory} of {target.memory_bytes} bytes, cores {cores} of "
                f"{FULL_CORES}) with the {len(shares) - 1} share(s) already prepared"
            )
        # Each allocation result is one share (the published ``shares`` capacity).
        if max_shares is not None and len(shares) > max_shares:
            return Conflict(
                f"claim {plan.ref}: device {device} would have {len(shares)} shares prepared; "
                f"this node allows at most {max_shares} per GPU (its published shares capacity)"
            )
    return None


def _dynamic_conflict(
    plan: ClaimPlan, others: Sequence[tuple[ClaimRecord, DeviceRecord]], devices: DeviceTable
) -> Conflict | None:
    """Dynamic devices of one GPU prepared together must fit its counter set (each device
    counted once, however many shares it has): another claim never gets an overlapping
    placement, a placement beside the whole GPU, or an engine already taken. ``others`` holds
    the other claims' devices, admin access left out."""
    mine = sorted({d.device for d in plan.devices if not d.admin_access})
    for name in mine:
        target = devices.get(name)
        if target is None or target.placement is None:
            continue
        held: dict[str, ClaimRecord] = {}  # other claims' dynamic devices on this GPU
        for rec, dev in others:
            if _on_gpu(devices, dev.device, target):
                held.setdefault(dev.device, rec)
        if name in held:
            continue  # a share of the same whole device: its counters are taken once
        totals = MigGeometry.of(target.gpu).totals
        together = [*held, *(n for n in mine if n not in held and _on_gpu(devices, n, target))]
        used = {c: sum(_consumes(devices, n).get(c, 0) for n in together) for c in totals}
        if all(used[c] <= total for c, total in totals.items()):
            continue
        mine_amounts = _consumes(devices, name)
        clash = next(
            (
                n
                for n in sorted(held)
                if any(
                    mine_amounts.get(c, 0) + _consumes(devices, n).get(c, 0) > total
                    for c, total in totals.items()
                )
            ),
            min(held, default=""),
        )
        if not clash:
            return Conflict(
                f"claim {plan.ref}: its devices on GPU {target.gpu.minor} exceed the GPU's MIG "
                "resources together"
            )
        return Conflict(
            f"claim {plan.ref}: device {name} overlaps {clash} on the same GPU, which is "
            "prepared for another claim",
            held[clash],
        )
    return None


def _on_gpu(devices: DeviceTable, name: str, target: NodeDevice) -> bool:
    device = devices.get(name)
    return (
        device is not None and device.placement is not None and device.gpu.uuid == target.gpu.uuid
    )


def _consumes(devices: DeviceTable, name: str) -> Mapping[str, int]:
    device = devices.get(name)
    if device is None or device.placement is None:
        return {}
    geometry = MigGeometry.of(device.gpu)
    return geometry.totals if not device.is_mig else geometry.consumes(device.placement)


def check_conflicts(
    plan: ClaimPlan, checkpoint: Checkpoint, devices: DeviceTable, max_shares: int | None = None
) -> None:
    """:func:`find_conflict` as an exception: raises :class:`PrepareError` with its message."""
    conflict = find_conflict(plan, checkpoint, devices, max_shares)
    if conflict is not None:
        raise PrepareError(conflict.message)


def prepared_devices(record: ClaimRecord) -> tuple[PreparedDevice, ...]:
    """What the kubelet is told of a prepared claim's devices."""
    return tuple(d.prepared() for d in record.devices)


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise PrepareError(f"cannot read the boot ID from {path}: {exc}") from exc


# --------------------------------------------------------------------------- the shell


class Preparer:
    """Prepares and unprepares claims on this node (see the module docstring)."""

    def __init__(
        self,
        settings: PrepareSettings,
        inventory: DeviceTable | Iterable[GpuInfo],
        get_claim: ClaimGetter,
        *,
        boot_id: str | None = None,
        on_checkpoint: CheckpointObserver | None = None,
        mig: MigBackend | None = None,
        on_mig_change: Callable[[], None] | None = None,
    ) -> None:
        self._settings = settings
        self._devices = DeviceTable.of(inventory)
        self._get_claim = get_claim
        self._on_checkpoint = on_checkpoint
        self._checkpoint_error: str | None = None
        self._swept = False
        # Claim UID -> monotonic time of the last Prepare call that named it (reconciliation
        # never releases a claim the kubelet has asked for since it first looked stale).
        self._asked: dict[str, float] = {}
        self._boot_id = boot_id if boot_id is not None else read_boot_id()
        self._store = CheckpointStore(settings.state_dir, lock_timeout_s=settings.lock_timeout_s)
        self._mps = MpsManager(
            MpsSettings(root=settings.mps_root, control_binary=settings.mps_control_binary)
        )
        self._mig = mig
        self._on_mig_change = on_mig_change
        self._lock = asyncio.Lock()
        self._reads = asyncio.Semaphore(MAX_CLAIM_READS)
        self._prepared: tuple[PreparedClaim, ...] = ()
        self._owned: frozenset[tuple[str, str, int]] = frozenset()

    # ----------------------------------------------------------------- public API

    def observe_inventory(self, inventory: DeviceTable | Iterable[GpuInfo]) -> None:
        """A new discovery result: later calls prepare against its device table."""
        self._devices = DeviceTable.of(inventory)

    def prepared_claims(self) -> tuple[PreparedClaim, ...]:
        """Claims in the checkpoint as of the last call (for metrics and health)."""
        return self._prepared

    @property
    def checkpoint_error(self) -> str | None:
        """Why the checkpoint could not be read the last time it was, or ``None``."""
        return self._checkpoint_error

    def owned_instances(self) -> frozenset[tuple[str, str, int]]:
        """(GPU UUID, profile, start) of the MIG instances biaxial created or is creating, as
        of the last call: what the device table must not take for foreign instances."""
        return self._owned

    async def recover(self) -> None:
        """Finish crash/reboot recovery now instead of at the first call (call at start-up),
        and re-create the missing MIG instances of prepared claims (instances of claims the API
        no longer has go when reconciliation releases them). Raises :class:`CheckpointError`
        if the checkpoint is corrupt."""
        async with self._lock:
            await asyncio.to_thread(self._recover_sync)

    async def snapshot(self) -> Checkpoint:
        """The checkpoint as it is now, recovered (crashed Prepares rolled back, a reboot
        re-applied). Raises :class:`CheckpointError` if it cannot be read."""
        async with self._lock:
            return await asyncio.to_thread(self._snapshot_sync)

    async def release_stale(self, uid: str, reason: str, stale_since: float) -> ClaimRecord | None:
        """Unprepare the completed claim ``uid`` on reconciliation's word that it is stale
        (``reason``, first seen at monotonic ``stale_since``); the released record, or ``None``
        when it is no longer there, not completed, or a Prepare named it since."""
        async with self._lock:
            return await asyncio.to_thread(self._release_stale_sync, uid, reason, stale_since)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        started = time.monotonic()
        devices = self._devices  # one table for the whole call
        fetched = await asyncio.gather(*(self._plan(ref, devices) for ref in claims))
        plans = dict(zip((ref.uid for ref in claims), fetched, strict=True))
        async with self._lock:
            results = await asyncio.to_thread(self._prepare_sync, list(claims), plans, devices)
        failed = sum(1 for r in results.values() if r.error)
        log.info(
            "prepare: %d claim(s), %d failed, in %.1f ms",
            len(claims),
            failed,
            (time.monotonic() - started) * 1000,
        )
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        started = time.monotonic()
        async with self._lock:
            results = await asyncio.to_thread(self._unprepare_sync, list(claims))
        log.info(
            "unprepare: %d claim(s), %d failed, in %.1f ms",
            len(claims),
            sum(1 for e in results.values() if e),
            (time.monotonic() - started) * 1000,
        )
        return results

    # ----------------------------------------------------------------- planning (async part)

    async def _plan(self, ref: ClaimRef, devices: DeviceTable) -> ClaimPlan | str:
        try:
            async with self._reads:
                claim = await self._get_claim(ref.namespace, ref.name)
        except BiaxialError as exc:
            return f"claim {ref}: cannot read it from the API: {exc}"
        except Exception as exc:  # noqa: BLE001 - the getter is the caller's code; its failure
            # must stay an error of this claim, never of its neighbours.
            return f"claim {ref}: cannot read it from the API: {type(exc).__name__}: {exc}"
        if claim is None:
            return f"claim {ref}: not found in the API (deleted?)"
        try:
            return plan_claim(ref, claim, self._settings, devices)
        except BiaxialError as exc:
            return str(exc)

    # ----------------------------------------------------------------- transactions (threads)

    def _publish(self, checkpoint: Checkpoint) -> None:
        self._prepared = tuple(
            PreparedClaim(
                ref=ClaimRef(namespace=r.namespace, uid=r.uid, name=r.name),
                devices=prepared_devices(r),
                completed=r.state == PREPARE_COMPLETED,
            )
            for _, r in sorted(checkpoint.claims.items())
        )
        self._owned = checkpoint.owned_instances()

    def _report(self, error: str | None) -> None:
        if error == self._checkpoint_error:
            return
        self._checkpoint_error = error
        if self._on_checkpoint is not None:
            self._on_checkpoint(error)

    def _load(self, *, reconcile: bool = False) -> Checkpoint:
        """Read and recover the checkpoint (the caller holds the file lock) and report its
        state; ``reconcile`` as for :meth:`_recover`. The first successful read of the process
        also stops the MPS daemons no prepared claim uses (released while the plugin was down,
        or the per-GPU daemons of an older plugin no claim needs any more)."""
        try:
            checkpoint = self._recover(self._store.load(), reconcile=reconcile)
        except CheckpointError as exc:
            self._report(str(exc))
            raise
        self._report(None)
        if not self._swept:
            self._mps.sweep(self._mps_users(checkpoint))
            self._swept = True
        return checkpoint

    def _recover_sync(self) -> None:
        with self._store.lock():
            self._publish(self._load(reconcile=True))

    def _snapshot_sync(self) -> Checkpoint:
        with self._store.lock():
            checkpoint = self._load()
            self._publish(checkpoint)
            return checkpoint

    def _release_stale_sync(self, uid: str, reason: str, stale_since: float) -> ClaimRecord | None:
        with self._store.lock():
            checkpoint = self._load()
            record = checkpoint.claims.get(uid)
            if record is None or record.state != PREPARE_COMPLETED:
                return None
            if self._asked.get(uid, float("-inf")) >= stale_since:
                return None  # the kubelet asked for it after it first looked stale
            checkpoint, error = self._release(checkpoint, record)
            self._store.save(checkpoint)
            self._publish(checkpoint)
            self._asked.pop(uid, None)
        if error:
            log.warning("%s; retried at the next call", error)
        log.warning(
            "claim %s/%s (%s): unprepared by reconciliation (%s); freed %s",
            record.namespace,
            record.name,
            record.uid,
            reason,
            ", ".join(d.device for d in record.devices),
        )
        return record

    def _mps_users(self, checkpoint: Checkpoint) -> set[Path]:
        return {d.directory for r in checkpoint.claims.values() for d in r.mps_daemons}

    def _release(self, checkpoint: Checkpoint, record: ClaimRecord) -> tuple[Checkpoint, str]:
        """Undo a claim's side effects and drop it; stop MPS daemons nobody uses any more and
        destroy MIG instances no other claim records. When an instance cannot be destroyed the
        claim stays (``PrepareStarted``, with what is left) so a later call retries; the error
        is returned. The caller saves the returned checkpoint."""
        cdi.remove_spec(self._settings.cdi_dir, record.cdi_spec_file)
        remaining = checkpoint.without_claim(record.uid)
        left, error = self._destroy_instances(record, remaining)
        if left:
            return remaining.with_claim(replace(record, state=PREPARE_STARTED, mig=left)), error
        still_used = self._mps_users(remaining)
        for daemon in record.mps_daemons:
            if daemon.directory in still_used:
                continue  # a version-2 daemon still shared with another claim
            try:
                self._mps.stop(daemon.directory)
            except PrepareError as exc:
                log.warning(
                    "claim %s/%s: MPS daemon %s not stopped (%s); the next plugin start "
                    "stops what is left under the MPS root",
                    record.namespace,
                    record.name,
                    daemon.directory,
                    exc,
                )
        return remaining, ""

    def _destroy_instances(
        self, record: ClaimRecord, remaining: Checkpoint
    ) -> tuple[tuple[MigRecord, ...], str]:
        """Destroy the claim's MIG instances that no claim of ``remaining`` records. An intent
        without a UUID stands for an instance a crash may have left unrecorded: the one at its
        exact placement that no record names. Returns the records whose instance could not be
        destroyed, and the error."""
        if not record.mig or self._mig is None:
            return (), ""
        others = remaining.mig_records()
        named = {m.uuid for m in others if m.uuid}
        gpus = {g.uuid: g for g in self._mig.discover()}
        left: list[MigRecord] = []
        errors: list[str] = []
        changed = False
        for mig in record.mig:
            gpu = gpus.get(mig.gpu_uuid)
            if gpu is None:
                continue  # the GPU is gone, and its instances with it
            uuid = mig.uuid
            if not uuid:
                found = instance_at(gpu, mig.profile, mig.start)
                uuid = found.uuid if found is not None and found.uuid not in named else ""
            if not uuid or uuid in named or all(m.uuid != uuid for m in gpu.mig_devices):
                continue
            try:
                self._mig.destroy_mig(mig.gpu_uuid, uuid)
                changed = True
                log.info(
                    "claim %s/%s: destroyed MIG %s at %d (%s) on GPU %s",
                    record.namespace,
                    record.name,
                    mig.profile,
                    mig.start,
                    uuid,
                    mig.gpu_uuid,
                )
            except MigError as exc:
                errors.append(str(exc))
                left.append(replace(mig, uuid=uuid))
        if changed:
            self._mig_changed()
        error = ""
        if errors:
            error = (
                f"claim {record.namespace}/{record.name} ({record.uid}): cannot destroy its MIG "
                f"instance(s) yet: {'; '.join(errors)}"
            )
        return tuple(left), error

    def _mig_changed(self) -> None:
        if self._on_mig_change is not None:
            self._on_mig_change()

    def _recover(self, checkpoint: Checkpoint, *, reconcile: bool = False) -> Checkpoint:
        """Roll back crashed Prepares and re-apply specs after a reboot; with ``reconcile``
        (start-up) or after a reboot, also re-create missing MIG instances. Saves if it
        changed anything. Called with the file lock held."""
        changed = False
        for record in list(checkpoint.claims.values()):
            if record.state == PREPARE_STARTED:
                log.warning(
                    "claim %s/%s (%s): rolling back a Prepare interrupted before completion",
                    record.namespace,
                    record.name,
                    record.uid,
                )
                checkpoint, error = self._release(checkpoint, record)
                if error:
                    log.warning("%s; retried at the next call", error)
                changed = True
        rebooted = checkpoint.boot_id != self._boot_id
        if reconcile or rebooted:
            reconciled = self._reconcile_mig(checkpoint)
            changed = changed or reconciled is not checkpoint
            checkpoint = reconciled
        if rebooted:
            if checkpoint.claims:
                log.info(
                    "boot ID changed (%s -> %s): re-preparing %d claim(s)",
                    checkpoint.boot_id,
                    self._boot_id,
                    len(checkpoint.claims),
                )
            for record in checkpoint.claims.values():
                self._heal(record)
            checkpoint = checkpoint.with_boot_id(self._boot_id)
            changed = True
        if changed:
            self._store.save(checkpoint)
        return checkpoint

    def _reconcile_mig(self, checkpoint: Checkpoint) -> Checkpoint:
        """Re-create the missing MIG instances of prepared claims (after a reboot or a GPU
        reset every instance is gone) and rewrite their CDI specs. An instance that cannot be
        re-created leaves its claim as it is, logged; Prepare of it reports the reason."""
        wanted = [r for r in checkpoint.claims.values() if r.state == PREPARE_COMPLETED and r.mig]
        if not wanted or self._mig is None:
            return checkpoint
        gpus = {g.uuid: g for g in self._mig.discover()}
        live = {m.uuid: m for g in gpus.values() for m in g.mig_devices}
        remade: dict[tuple[str, str, int], MigInfo] = {}
        for record in wanted:
            missing = [m for m in record.mig if m.uuid not in live]
            if not missing:
                continue
            instances: dict[str, MigInfo] = {
                m.device: live[m.uuid] for m in record.mig if m.uuid in live
            }
            try:
                for mig in missing:
                    info = remade.get(mig.placement)
                    if info is None:
                        info = self._mig.create_mig(mig.gpu_uuid, mig.profile, mig.start)
                        remade[mig.placement] = info
                        self._mig_changed()
                        log.info(
                            "claim %s/%s: re-created MIG %s at %d on GPU %s: %s",
                            record.namespace,
                            record.name,
                            mig.profile,
                            mig.start,
                            mig.gpu_uuid,
                            info.uuid,
                        )
                    instances[mig.device] = info
                updated = self._respec(record, instances)
            except (MigError, PrepareError) as exc:
                log.error(  # noqa: TRY400 - the reason is the message
                    "claim %s/%s: cannot re-create its MIG instance(s): %s",
                    record.namespace,
                    record.name,
                    exc,
                )
                continue
            cdi.write_spec(
                self._settings.cdi_dir,
                ClaimSpec(
                    file_name=updated.cdi_spec_file, spec=dict(updated.cdi_spec), cdi_device_ids=()
                ),
            )
            checkpoint = checkpoint.with_claim(updated)
            self._store.save(checkpoint)
        return checkpoint

    def _respec(self, record: ClaimRecord, instances: Mapping[str, MigInfo]) -> ClaimRecord:
        """The record with its MIG instances replaced and its CDI spec recomputed."""
        allocations = []
        for device in record.devices:
            target = self._devices.get(device.device)
            if target is None:
                raise PrepareError(f"device {device.device} is not in this node's device table")
            allocations.append(
                DeviceAllocation(
                    request=device.request_names[0] if device.request_names else "",
                    target=target,
                    strategy=device.strategy,
                    share_id=device.share_id,
                    memory_limit_bytes=None if device.exclusive else device.memory_bytes,
                    cores_percent=None if device.exclusive else device.cores,
                    admin_access=device.admin_access,
                )
            )
        realized = _backed(allocations, instances)
        spec = cdi.build_claim_spec(
            self._settings.driver_name, record.uid, realized, sharing_paths(self._settings)
        )
        return replace(
            record,
            devices=_rebind(record.devices, realized),
            cdi_spec=spec.spec,
            mig=tuple(
                replace(m, uuid=instances[m.device].uuid) if m.device in instances else m
                for m in record.mig
            ),
        )

    def _heal(self, record: ClaimRecord) -> str:
        """Make a completed claim's side effects present again. Returns an error or ""."""
        try:
            self._check_instances(record)
            if record.cdi_spec and not cdi.spec_present(
                self._settings.cdi_dir, record.cdi_spec_file, record.cdi_spec
            ):
                cdi.write_spec(
                    self._settings.cdi_dir,
                    ClaimSpec(
                        file_name=record.cdi_spec_file,
                        spec=dict(record.cdi_spec),
                        cdi_device_ids=(),
                    ),
                )
            for daemon in record.mps_daemons:
                self._mps.ensure_running(daemon)
        except (OSError, PrepareError) as exc:
            log.warning("claim %s/%s: re-prepare failed: %s", record.namespace, record.name, exc)
            return f"claim {record.namespace}/{record.name} ({record.uid}): {exc}"
        return ""

    def _check_instances(self, record: ClaimRecord) -> None:
        """Raise PrepareError when a MIG instance the claim holds is gone from NVML."""
        if not record.mig or self._mig is None:
            return
        live = {m.uuid for g in self._mig.discover() for m in g.mig_devices}
        lost = [m.uuid for m in record.mig if m.uuid not in live]
        if lost:
            raise PrepareError(
                f"its MIG instance(s) {', '.join(lost)} are gone and could not be re-created "
                "(see the plugin log)"
            )

    def _prepare_sync(
        self, refs: list[ClaimRef], plans: Mapping[str, ClaimPlan | str], devices: DeviceTable
    ) -> dict[str, PrepareResult]:
        try:
            return self._prepare_locked(refs, plans, devices)
        except (Timeout, OSError) as exc:
            # Node-level trouble (lock held too long, state directory unwritable): every claim
            # of the call fails with the reason; the kubelet retries. A checkpoint left with
            # PrepareStarted entries is rolled back by the next call.
            error = self._node_error(exc)
            return {ref.uid: PrepareResult(error=error) for ref in refs}

    def _node_error(self, exc: Exception) -> str:
        if isinstance(exc, Timeout):
            return (
                f"another Prepare/Unprepare held {self._store.lock_path} for more than "
                f"{self._settings.lock_timeout_s:g} s; retry"
            )
        return f"checkpoint or CDI file operation failed: {exc}"

    def _prepare_locked(
        self, refs: list[ClaimRef], plans: Mapping[str, ClaimPlan | str], devices: DeviceTable
    ) -> dict[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        with self._store.lock():
            now = time.monotonic()
            for ref in refs:
                self._asked[ref.uid] = now
            try:
                checkpoint = self._load()
            except CheckpointError as exc:
                return {ref.uid: PrepareResult(error=str(exc)) for ref in refs}
            # Phase 1: already prepared, refused, or marked started.
            todo: list[ClaimPlan] = []
            for ref in refs:
                if ref.uid in results or any(p.ref.uid == ref.uid for p in todo):
                    continue
                record = checkpoint.claims.get(ref.uid)
                if record is not None and record.state == PREPARE_COMPLETED and record.cdi_spec:
                    error = self._heal(record)
                    results[ref.uid] = PrepareResult(
                        devices=() if error else prepared_devices(record), error=error
                    )
                    continue
                if record is not None and record.mig:
                    # A rollback that could not destroy its instance yet (the next load of
                    # the checkpoint retries it).
                    results[ref.uid] = PrepareResult(
                        error=f"claim {ref}: an earlier attempt left MIG instance(s) that could "
                        "not be destroyed yet; retry later"
                    )
                    continue
                plan = plans[ref.uid]
                if isinstance(plan, str):
                    results[ref.uid] = PrepareResult(error=plan)
                    continue
                if plan.mig and self._mig is None:
                    results[ref.uid] = PrepareResult(
                        error=f"claim {ref}: dynamic MIG devices need the GPU backend, which this "
                        "plugin was started without"
                    )
                    continue
                conflict = find_conflict(
                    plan, checkpoint, devices, self._settings.max_shares_per_gpu
                )
                if conflict is not None:
                    if conflict.holder is not None:
                        holder = conflict.holder
                        log.warning(
                            "%s (held by claim %s/%s (%s))",
                            conflict.message,
                            holder.namespace,
                            holder.name,
                            holder.uid,
                        )
                    results[ref.uid] = PrepareResult(error=conflict.message)
                    continue
                checkpoint = checkpoint.with_claim(plan.record(PREPARE_STARTED))
                todo.append(plan)
            if not todo:
                self._publish(checkpoint)
                return {ref.uid: results[ref.uid] for ref in refs}
            self._store.save(checkpoint)
            # Phase 2: side effects, each claim on its own.
            for planned in todo:
                begun = time.monotonic()
                plan = planned
                try:
                    if plan.mig:
                        plan, checkpoint = self._create_instances(plan, checkpoint)
                    for directory in plan.spec.host_dirs:
                        Path(directory).mkdir(parents=True, exist_ok=True)
                    cdi.write_spec(self._settings.cdi_dir, plan.spec)
                    for daemon in plan.mps_daemons:
                        self._mps.ensure_running(daemon)
                except (OSError, PrepareError, MigError) as exc:
                    checkpoint, undo_error = self._release(
                        checkpoint, checkpoint.claims[plan.ref.uid]
                    )
                    error = f"claim {plan.ref}: {exc}"
                    if undo_error:
                        error = f"{error}; {undo_error}"
                    results[plan.ref.uid] = PrepareResult(error=error)
                    continue
                record = plan.record(PREPARE_COMPLETED)
                checkpoint = checkpoint.with_claim(record)
                results[plan.ref.uid] = PrepareResult(devices=prepared_devices(record))
                log.info(
                    "claim %s: prepared %s in %.1f ms",
                    plan.ref,
                    ", ".join(d.device for d in plan.devices),
                    (time.monotonic() - begun) * 1000,
                )
            # Phase 3: completed.
            self._store.save(checkpoint)
            self._publish(checkpoint)
        return {ref.uid: results[ref.uid] for ref in refs}

    def _create_instances(
        self, plan: ClaimPlan, checkpoint: Checkpoint
    ) -> tuple[ClaimPlan, Checkpoint]:
        """Give each dynamic device of the plan its MIG instance: the one another claim
        already records at the same placement (a shared whole GPU), else a new one; each new
        UUID is saved in the checkpoint as soon as NVML returns it. Returns the realized plan
        and the checkpoint (saved)."""
        assert self._mig is not None
        live = {m.uuid: m for g in self._mig.discover() for m in g.mig_devices}
        instances: dict[str, MigInfo] = {}
        done: list[MigRecord] = []
        for index, mig in enumerate(plan.mig):
            shared = next(
                (
                    o
                    for o in checkpoint.mig_records(excluding=plan.ref.uid)
                    if o.placement == mig.placement and o.uuid
                ),
                None,
            )
            if shared is not None:
                info = live.get(shared.uuid)
                if info is None:
                    raise PrepareError(
                        f"MIG instance {shared.uuid} of device {mig.device} is gone; it is "
                        "re-created when the plugin restarts"
                    )
            else:
                info = self._mig.create_mig(mig.gpu_uuid, mig.profile, mig.start)
                self._mig_changed()
                log.info(
                    "claim %s: created MIG %s at %d on GPU %s: %s",
                    plan.ref,
                    mig.profile,
                    mig.start,
                    mig.gpu_uuid,
                    info.uuid,
                )
            instances[mig.device] = info
            done.append(replace(mig, uuid=info.uuid))
            recorded = replace(plan, mig=(*done, *plan.mig[index + 1 :]))
            checkpoint = checkpoint.with_claim(recorded.record(PREPARE_STARTED))
            self._store.save(checkpoint)
        realized = replace(plan.realize(instances), mig=tuple(done))
        checkpoint = checkpoint.with_claim(realized.record(PREPARE_STARTED))
        return realized, checkpoint

    def _unprepare_unrecorded(self, refs: list[ClaimRef], exc: CheckpointError) -> dict[str, str]:
        """Unprepare with an unreadable checkpoint: what can be undone without it is (the
        claim's CDI spec, its own MPS daemons, both named after its UID), and the claim is
        reported unprepared so its pod can finish terminating. The checkpoint still lists it
        until repaired; reconciliation then finds it stale and releases it (destroying its
        dynamic MIG instances, which only the checkpoint names)."""
        results: dict[str, str] = {}
        for ref in refs:
            try:
                cdi.remove_spec(
                    self._settings.cdi_dir, cdi.spec_file_name(self._settings.driver_name, ref.uid)
                )
                self._mps.stop_claim(ref.uid)
            except (OSError, PrepareError) as err:
                results[ref.uid] = f"claim {ref}: cannot undo its preparation: {err}"
                continue
            log.warning(
                "claim %s: unprepared without the checkpoint (CDI spec removed, MPS daemons "
                "stopped); the checkpoint cannot be read: %s",
                ref,
                exc,
            )
            results[ref.uid] = ""
        return results

    def _unprepare_sync(self, refs: list[ClaimRef]) -> dict[str, str]:
        try:
            return self._unprepare_locked(refs)
        except (Timeout, OSError) as exc:
            error = self._node_error(exc)
            return {ref.uid: error for ref in refs}

    def _unprepare_locked(self, refs: list[ClaimRef]) -> dict[str, str]:
        results: dict[str, str] = {}
        with self._store.lock():
            for ref in refs:
                self._asked.pop(ref.uid, None)
            try:
                checkpoint = self._load()
            except CheckpointError as exc:
                return self._unprepare_unrecorded(refs, exc)
            changed = False
            for ref in refs:
                record = checkpoint.claims.get(ref.uid)
                try:
                    if record is None:
                        # Unknown here (already unprepared, or never prepared): make sure no
                        # spec is left behind, and succeed.
                        cdi.remove_spec(
                            self._settings.cdi_dir,
                            cdi.spec_file_name(self._settings.driver_name, ref.uid),
                        )
                    else:
                        checkpoint, error = self._release(checkpoint, record)
                        changed = True
                        if error:
                            results[ref.uid] = error
                            continue
                        log.info("claim %s: unprepared", ref)
                except OSError as exc:
                    results[ref.uid] = f"claim {ref}: cannot remove its CDI spec: {exc}"
                    continue
                results[ref.uid] = ""
            if changed:
                self._store.save(checkpoint)
            self._publish(checkpoint)
        return results

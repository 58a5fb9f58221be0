"""Prepare's pure half: what preparing one claim on this node means, computed without side effects.

Contract:

* :func:`plan_claim`: claim JSON + this node's device table
  (:class:`~driver.discovery.devices.DeviceTable`) + settings -> a :class:`ClaimPlan` (the
  claim's device records, CDI spec, MPS daemons, MIG intents), or a
  :class:`~driver.api.errors.PrepareError` / :class:`~driver.api.errors.ConfigError` (or the
  claim model's :class:`~driver.api.errors.ManifestError` for a malformed claim) naming the
  claim, the request and the device. The claim is read only through the core's claim model
  (:class:`~driver.api.claims.ResourceClaim`) and its ``GpuConfig`` entries through
  :mod:`driver.api.config`. Refused: UID mismatch, not allocated, results for another node's
  pool, devices the table does not publish, a shareID on a device that is not shareable, a
  share's strategy outside the node's policy, consumed capacity out of range, and whatever
  the CDI spec cannot express (:func:`kubeletplugin.cdi.build_claim_spec`, the sharing
  strategies' own checks).
* Each allocation result's sharing strategy: the ``GpuConfig``'s, else the node's default for
  a share of a whole GPU, else ``none`` (an exclusive device, or a share of a dynamic-MIG
  GPU's instance). Its limits and daemons come from the strategy's module
  (:mod:`kubeletplugin.sharing`).
* The device records (:class:`~kubeletplugin.checkpoint.DeviceRecord`) are built once per
  plan (:func:`device_record`); a dynamic device's MIG instance, once created, only rebinds
  the records to the instance's UUID (:meth:`ClaimPlan.realize`, :func:`respec`).
* Same input, same output; inputs are never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from driver.api.claims import DeviceResult, ResourceClaim
from driver.api.config import GpuConfig, SharingStrategy, node_policy_error, resolve_configs
from driver.api.errors import ConfigError, PrepareError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.discovery.devices import DeviceTable, NodeDevice
from driver.discovery.gpus import MigInfo
from driver.discovery.slices import CAPACITY_CORES, CAPACITY_MEMORY
from kubeletplugin import cdi, sharing
from kubeletplugin.cdi import ClaimSpec
from kubeletplugin.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    ClaimRecord,
    DeviceRecord,
    MigRecord,
)
from kubeletplugin.mps import MpsDaemon
from kubeletplugin.sharing import DeviceAllocation, SharingPaths
from kubeletplugin.sharing.base import FULL_CORES


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet sends for a claim."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


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


def sharing_paths(settings: PrepareSettings) -> SharingPaths:
    return SharingPaths(
        hami_core_library=settings.hami_core_library_path,
        hami_lock_dir=settings.hami_lock_dir,
        mps_root=settings.mps_root,
        device_dir=settings.fake_device_dir,
    )


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


def respec(
    record: ClaimRecord,
    devices: DeviceTable,
    instances: Mapping[str, MigInfo],
    settings: PrepareSettings,
) -> ClaimRecord:
    """A prepared claim's record with its MIG instances replaced (device name -> instance)
    and its CDI spec recomputed for them. Raises :class:`PrepareError` when a device is
    gone from the table or the spec cannot be built."""
    allocations = []
    for device in record.devices:
        target = devices.get(device.device)
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
    spec = cdi.build_claim_spec(settings.driver_name, record.uid, realized, sharing_paths(settings))
    return replace(
        record,
        devices=_rebind(record.devices, realized),
        cdi_spec=spec.spec,
        mig=tuple(
            replace(m, uuid=instances[m.device].uuid) if m.device in instances else m
            for m in record.mig
        ),
    )

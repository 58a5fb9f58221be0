"""NodePrepareResources / NodeUnprepareResources: the Prepare transaction, and the front door.

The gRPC handlers call :class:`Preparer`. Prepare is pure planning plus a thin transactional
shell; the concepts have their own modules, re-exported here:

* :mod:`kubeletplugin.planning` — claim JSON + this node's device table + settings -> a
  :class:`~kubeletplugin.planning.ClaimPlan` (device records, CDI spec, MPS daemons, MIG
  intents), or the error naming the claim, request and device (:func:`plan_claim`);
* :mod:`kubeletplugin.conflicts` — may the plan join the claims already prepared here
  (:func:`find_conflict`);
* :mod:`kubeletplugin.sharing` — one module per sharing strategy (env, mounts, daemons);
* :mod:`kubeletplugin.miginstances` — the dynamic-MIG instances and their bookkeeping;
* :mod:`kubeletplugin.checkpoint`, :mod:`kubeletplugin.cdi`, :mod:`kubeletplugin.mps` — the
  files and daemons the transaction writes and runs.

Contract of the :class:`Preparer`:

* **Per claim.** Every claim of a call appears in the result; one bad claim never fails its
  neighbours (its :class:`PrepareResult` carries ``error``). Errors name the claim, the
  request and the device, and never another tenant's objects: a device held by another claim
  is "prepared for another claim" (the holder is named in the node's log only).
* **Idempotent.** Preparing a prepared claim returns the same devices (healing a missing CDI
  spec or MPS daemon); unpreparing an unknown or deleted claim succeeds, using what the
  checkpoint cached (the API is not consulted).
* The device table is the one the plugin derives per discovery; :meth:`Preparer.observe_inventory`
  replaces it. One call plans and checks against one table.
* **Transactional shell**, under the node-wide file lock ``<state_dir>/serialize.lock`` (two
  plugin pods overlap during a rolling update): load the checkpoint; recover (a
  ``PrepareStarted`` entry seen under the lock is a crashed Prepare: it is rolled back, and a
  retried Prepare redoes it; a changed boot ID rewrites every prepared claim's CDI spec and
  restarts its MPS daemons); check conflicts and mark claims ``PrepareStarted``; create their
  MIG instances, write CDI specs and start the claim's own MPS daemons (one per claim and GPU,
  limits set on the daemon); mark ``PrepareCompleted``. Unprepare stops the claim's daemons and
  destroys the MIG instances no other claim records; :meth:`Preparer.recover` (at start) also
  stops every daemon no prepared claim uses and re-creates the missing MIG instances of
  prepared claims. Blocking work runs in ``asyncio.to_thread``.
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
from typing import Any, Final

from driver.api.errors import BiaxialError, CheckpointError, MigError, PrepareError
from driver.discovery.devices import DeviceTable
from driver.discovery.gpus import GpuInfo
from kubeletplugin import cdi
from kubeletplugin.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    PreparedDevice,
    Timeout,
)
from kubeletplugin.conflicts import Conflict, check_conflicts, find_conflict
from kubeletplugin.miginstances import MigBackend, MigInstances
from kubeletplugin.mps import MpsManager, MpsSettings
from kubeletplugin.planning import (
    ClaimPlan,
    ClaimRef,
    PrepareSettings,
    plan_claim,
    sharing_paths,
)

log = logging.getLogger(f"biaxial.{__name__}")

BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")


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


ClaimGetter = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
#: At most this many claim GETs in flight at once, across Prepare calls (a call naming hundreds
#: of claims must not open hundreds of requests to the API server at once).
MAX_CLAIM_READS: Final = 8
#: Told the checkpoint's state after every read: ``None`` readable, else the error's text.
#: Called from the worker thread that read it, only when the state changed.
CheckpointObserver = Callable[[str | None], None]


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
        self._instances = MigInstances(mig, settings, self._store, on_mig_change)
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
        left, error = self._instances.destroy(record, remaining)
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
            reconciled = self._instances.recreate_missing(checkpoint, self._devices)
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

    def _heal(self, record: ClaimRecord) -> str:
        """Make a completed claim's side effects present again. Returns an error or ""."""
        try:
            self._instances.check_present(record)
            if record.cdi_spec and not cdi.spec_present(
                self._settings.cdi_dir, record.cdi_spec_file, record.cdi_spec
            ):
                cdi.rewrite_spec(self._settings.cdi_dir, record.cdi_spec_file, record.cdi_spec)
            for daemon in record.mps_daemons:
                self._mps.ensure_running(daemon)
        except (OSError, PrepareError) as exc:
            log.warning("claim %s/%s: re-prepare failed: %s", record.namespace, record.name, exc)
            return f"claim {record.namespace}/{record.name} ({record.uid}): {exc}"
        return ""

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
                admitted = self._admit(ref, plans[ref.uid], checkpoint, devices)
                if isinstance(admitted, PrepareResult):
                    results[ref.uid] = admitted
                    continue
                checkpoint = checkpoint.with_claim(admitted.record(PREPARE_STARTED))
                todo.append(admitted)
            if not todo:
                self._publish(checkpoint)
                return {ref.uid: results[ref.uid] for ref in refs}
            self._store.save(checkpoint)
            # Phase 2: side effects, each claim on its own.
            for plan in todo:
                checkpoint, results[plan.ref.uid] = self._apply(plan, checkpoint)
            # Phase 3: completed.
            self._store.save(checkpoint)
            self._publish(checkpoint)
        return {ref.uid: results[ref.uid] for ref in refs}

    def _admit(
        self,
        ref: ClaimRef,
        plan: ClaimPlan | str,
        checkpoint: Checkpoint,
        devices: DeviceTable,
    ) -> ClaimPlan | PrepareResult:
        """The plan to carry out for ``ref``, or the claim's answer without side effects:
        already prepared (healed), refused, or left over from an earlier attempt."""
        record = checkpoint.claims.get(ref.uid)
        if record is not None and record.state == PREPARE_COMPLETED and record.cdi_spec:
            error = self._heal(record)
            return PrepareResult(devices=() if error else prepared_devices(record), error=error)
        if record is not None and record.mig:
            # A rollback that could not destroy its instance yet (the next load of the
            # checkpoint retries it).
            return PrepareResult(
                error=f"claim {ref}: an earlier attempt left MIG instance(s) that could not be "
                "destroyed yet; retry later"
            )
        if isinstance(plan, str):
            return PrepareResult(error=plan)
        if plan.mig and not self._instances.available:
            return PrepareResult(
                error=f"claim {ref}: dynamic MIG devices need the GPU backend, which this "
                "plugin was started without"
            )
        conflict = find_conflict(plan, checkpoint, devices, self._settings.max_shares_per_gpu)
        if conflict is None:
            return plan
        if conflict.holder is not None:
            holder = conflict.holder
            log.warning(
                "%s (held by claim %s/%s (%s))",
                conflict.message,
                holder.namespace,
                holder.name,
                holder.uid,
            )
        return PrepareResult(error=conflict.message)

    def _apply(self, plan: ClaimPlan, checkpoint: Checkpoint) -> tuple[Checkpoint, PrepareResult]:
        """Carry out one admitted plan (recorded ``PrepareStarted``): its MIG instances, CDI
        spec and MPS daemons; on failure roll it back. Returns the checkpoint (the caller
        saves it) and the claim's answer."""
        begun = time.monotonic()
        try:
            if plan.mig:
                plan, checkpoint = self._instances.create(plan, checkpoint)
            for directory in plan.spec.host_dirs:
                Path(directory).mkdir(parents=True, exist_ok=True)
            cdi.write_spec(self._settings.cdi_dir, plan.spec)
            for daemon in plan.mps_daemons:
                self._mps.ensure_running(daemon)
        except (OSError, PrepareError, MigError) as exc:
            checkpoint, undo_error = self._release(checkpoint, checkpoint.claims[plan.ref.uid])
            error = f"claim {plan.ref}: {exc}"
            if undo_error:
                error = f"{error}; {undo_error}"
            return checkpoint, PrepareResult(error=error)
        record = plan.record(PREPARE_COMPLETED)
        log.info(
            "claim %s: prepared %s in %.1f ms",
            plan.ref,
            ", ".join(d.device for d in plan.devices),
            (time.monotonic() - begun) * 1000,
        )
        return checkpoint.with_claim(record), PrepareResult(devices=prepared_devices(record))

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


__all__ = [
    "BOOT_ID_PATH",
    "MAX_CLAIM_READS",
    "CheckpointObserver",
    "ClaimGetter",
    "ClaimPlan",
    "ClaimRef",
    "Conflict",
    "MigBackend",
    "PrepareResult",
    "PrepareSettings",
    "PreparedClaim",
    "PreparedDevice",
    "Preparer",
    "check_conflicts",
    "find_conflict",
    "plan_claim",
    "prepared_devices",
    "read_boot_id",
    "sharing_paths",
]

"""Dynamic MIG: the MIG instances biaxial creates for prepared claims, and their bookkeeping.

Contract (blocking; called by the Preparer with the node-wide file lock held):

* A device of a dynamic-MIG GPU (a placement, or the whole GPU, which stands for its
  full-size instance) gets its MIG instance at Prepare (:meth:`MigInstances.create`): the
  claim is already recorded ``PrepareStarted`` with the instance as an intent (GPU, profile,
  placement); the backend creates it and its UUID is saved in the checkpoint at once, then the
  plan is realized (CDI spec for the real instance). The whole GPU's instance is shared by
  every claim holding a share of it: the one another claim records at the same placement is
  adopted (created for the first claim, destroyed after the last).
* :meth:`MigInstances.destroy` (Unprepare, reconciliation's release of a stale claim, the
  rollback of a failed or crashed Prepare) destroys the claim's instances that no other claim
  records; a crash between creation and the record is undone by finding the instance at the
  intent's placement. An instance that cannot be destroyed is returned so the claim is kept
  and a later call retries.
* :meth:`MigInstances.recreate_missing` (start-up, a changed boot ID) re-creates the missing
  instances of prepared claims and rewrites their CDI specs; one that cannot be re-created is
  logged and its claim left as it is. :meth:`MigInstances.check_present` tells a re-Prepare
  that an instance is gone.
* Instances biaxial did not create are never touched: only recorded UUIDs, or an intent's
  own placement, are ever destroyed. biaxial never changes a GPU's MIG mode.
* Every creation or destruction calls ``on_change`` (the app rediscovers the device table).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from driver.api.errors import MigError, PrepareError
from driver.discovery.devices import DeviceTable
from driver.discovery.gpus import GpuInfo, MigInfo
from driver.discovery.mig import instance_at
from kubeletplugin import cdi
from kubeletplugin.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    MigRecord,
)
from kubeletplugin.planning import ClaimPlan, PrepareSettings, respec

log = logging.getLogger(f"biaxial.{__name__}")


class MigBackend(Protocol):
    """What dynamic MIG needs of the GPU backend (both backends provide it)."""

    def discover(self) -> tuple[GpuInfo, ...]: ...

    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigInfo: ...

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str) -> bool: ...


class MigInstances:
    """Creates, adopts, destroys and re-creates the MIG instances of prepared claims."""

    def __init__(
        self,
        backend: MigBackend | None,
        settings: PrepareSettings,
        store: CheckpointStore,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._backend = backend
        self._settings = settings
        self._store = store
        self._on_change = on_change

    @property
    def available(self) -> bool:
        """Whether the plugin was started with a GPU backend that can create instances."""
        return self._backend is not None

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def create(self, plan: ClaimPlan, checkpoint: Checkpoint) -> tuple[ClaimPlan, Checkpoint]:
        """Give each dynamic device of the plan its MIG instance: the one another claim
        already records at the same placement (a shared whole GPU), else a new one; each new
        UUID is saved in the checkpoint as soon as NVML returns it. Returns the realized plan
        and the checkpoint (saved)."""
        assert self._backend is not None
        live = {m.uuid: m for g in self._backend.discover() for m in g.mig_devices}
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
                info = self._backend.create_mig(mig.gpu_uuid, mig.profile, mig.start)
                self._changed()
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

    def destroy(
        self, record: ClaimRecord, remaining: Checkpoint
    ) -> tuple[tuple[MigRecord, ...], str]:
        """Destroy the claim's MIG instances that no claim of ``remaining`` records. An intent
        without a UUID stands for an instance a crash may have left unrecorded: the one at its
        exact placement that no record names. Returns the records whose instance could not be
        destroyed, and the error."""
        if not record.mig or self._backend is None:
            return (), ""
        others = remaining.mig_records()
        named = {m.uuid for m in others if m.uuid}
        gpus = {g.uuid: g for g in self._backend.discover()}
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
                self._backend.destroy_mig(mig.gpu_uuid, uuid)
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
            self._changed()
        error = ""
        if errors:
            error = (
                f"claim {record.namespace}/{record.name} ({record.uid}): cannot destroy its MIG "
                f"instance(s) yet: {'; '.join(errors)}"
            )
        return tuple(left), error

    def recreate_missing(self, checkpoint: Checkpoint, devices: DeviceTable) -> Checkpoint:
        """Re-create the missing MIG instances of prepared claims (after a reboot or a GPU
        reset every instance is gone) and rewrite their CDI specs. An instance that cannot be
        re-created leaves its claim as it is, logged; Prepare of it reports the reason."""
        wanted = [r for r in checkpoint.claims.values() if r.state == PREPARE_COMPLETED and r.mig]
        if not wanted or self._backend is None:
            return checkpoint
        gpus = {g.uuid: g for g in self._backend.discover()}
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
                        info = self._backend.create_mig(mig.gpu_uuid, mig.profile, mig.start)
                        remade[mig.placement] = info
                        self._changed()
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
                updated = respec(record, devices, instances, self._settings)
            except (MigError, PrepareError) as exc:
                log.error(  # noqa: TRY400 - the reason is the message
                    "claim %s/%s: cannot re-create its MIG instance(s): %s",
                    record.namespace,
                    record.name,
                    exc,
                )
                continue
            cdi.rewrite_spec(self._settings.cdi_dir, updated.cdi_spec_file, updated.cdi_spec)
            checkpoint = checkpoint.with_claim(updated)
            self._store.save(checkpoint)
        return checkpoint

    def check_present(self, record: ClaimRecord) -> None:
        """Raise PrepareError when a MIG instance the claim holds is gone from NVML."""
        if not record.mig or self._backend is None:
            return
        live = {m.uuid for g in self._backend.discover() for m in g.mig_devices}
        lost = [m.uuid for m in record.mig if m.uuid not in live]
        if lost:
            raise PrepareError(
                f"its MIG instance(s) {', '.join(lost)} are gone and could not be re-created "
                "(see the plugin log)"
            )

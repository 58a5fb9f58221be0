"""Reconciliation: the checkpoint against the API, so a node heals its own state.

The checkpoint never forgets on its own: a claim deleted (or deallocated) without the kubelet's
NodeUnprepareResources would hold its devices on this node forever. Every ``period_s`` the
:class:`Reconciler` reads the checkpoint and GETs each completed claim by name (the plugin's
RBAC is ``get`` on claims: no list, no watch), and :func:`stale_reason` decides, purely,
whether the claim still needs its preparation here. A claim is **stale** when

* it no longer exists (404), or a claim of the same name has another UID (deleted and
  recreated);
* it is no longer allocated, or its allocation has no device of this driver in this node's
  pool;
* it is reserved for nothing (``status.reservedFor`` empty: no pod may use it).

A claim found stale is released only when it is still stale ``grace_s`` later (default 300 s,
beyond the kubelet's own retries of Unprepare and the moment between two pods of a shared
claim), and only if the kubelet has not asked to prepare it since it first looked stale
(:meth:`~kubeletplugin.prepare.Preparer.release_stale`); it is then unprepared exactly as by
the kubelet (CDI spec, MPS daemons, dynamic MIG instances, checkpoint entry), its devices are
free, and a ``StaleClaimReleased`` node Event says so. What an API error leaves unknown is
never evidence: the claim keeps its state and is asked again next time. An unreadable
checkpoint is skipped (the Preparer reports it; the loop reads it again next period, which is
how a repaired file is noticed).

"No longer exists" is trusted without asking whether the claim's pods still run (which would
need ``get`` on every pod of the cluster: RBAC cannot narrow a ServiceAccount to its node's
pods): with the chart's claim-protection policy, a claim holding this driver's devices leaves
the API only after its allocator deallocated it, which the allocators do only once no pod
reserves it, and a reservation goes only once its pod is gone or finished. Without the policy
the grace period is the bound (docs/operations.md, "A claim deleted while its pod runs").

Two overlapping plugin instances may both reconcile: releases go through the checkpoint lock,
so the second finds nothing left to release.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from driver.api.claims import ResourceClaim
from driver.api.errors import BiaxialError, CheckpointError
from kubeapi.tasks import wait_at_most
from kubeletplugin.checkpoint import PREPARE_COMPLETED, Checkpoint, ClaimRecord

log = logging.getLogger(f"biaxial.{__name__}")

DEFAULT_PERIOD_S: Final = 60.0
DEFAULT_GRACE_S: Final = 300.0

ClaimGetter = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]


def stale_reason(
    record: ClaimRecord, claim: Mapping[str, Any] | None, *, node_name: str, driver: str
) -> str | None:
    """Why the prepared ``record`` is no longer needed on this node, given what the API has
    under its namespace and name (``None``: nothing); ``None`` when it is still needed. Pure.
    A claim the core's model cannot read is not judged (``None``): only a clear answer frees
    devices."""
    if claim is None:
        return "the claim no longer exists"
    metadata = claim.get("metadata") or {}
    uid = str(metadata.get("uid") or "")
    if uid != record.uid:
        return f"the claim was deleted (its name now belongs to a claim with UID {uid or None})"
    try:
        model = ResourceClaim.from_api(claim)
    except BiaxialError:
        return None
    if model.allocation is None:
        return "the claim is no longer allocated"
    if not any(r.pool == node_name for r in model.allocation.results_of(driver)):
        return f"the claim is no longer allocated devices of {driver} on node {node_name}"
    status = claim.get("status") or {}
    if not status.get("reservedFor"):
        return "the claim is reserved for no pod"
    return None


class StalePreparer(Protocol):
    """What reconciliation needs from :class:`~kubeletplugin.prepare.Preparer`."""

    async def snapshot(self) -> Checkpoint: ...

    async def release_stale(
        self, uid: str, reason: str, stale_since: float
    ) -> ClaimRecord | None: ...


@dataclass(frozen=True, slots=True)
class Released:
    """One claim reconciliation unprepared."""

    record: ClaimRecord
    reason: str

    def message(self) -> str:
        r = self.record
        devices = ", ".join(d.device for d in r.devices) or "no devices"
        return (
            f"claim {r.namespace}/{r.name} ({r.uid}) was prepared on this node but {self.reason};"
            f" unprepared without the kubelet's NodeUnprepareResources, freeing {devices}"
        )


class Reconciler:
    """The periodic reconciliation of the checkpoint against the API (module docstring)."""

    def __init__(
        self,
        preparer: StalePreparer,
        get_claim: ClaimGetter,
        *,
        node_name: str,
        driver_name: str,
        grace_s: float = DEFAULT_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._preparer = preparer
        self._get_claim = get_claim
        self._node = node_name
        self._driver = driver_name
        self._grace_s = grace_s
        self._clock = clock
        self._stale_since: dict[str, tuple[float, str]] = {}  # uid -> (first seen, reason)

    @property
    def suspects(self) -> dict[str, str]:
        """Claims seen stale and not yet released: UID -> reason."""
        return {uid: reason for uid, (_, reason) in self._stale_since.items()}

    async def _judge(self, record: ClaimRecord) -> tuple[bool, str | None]:
        """``(known, stale reason or None)``; not known when the API could not be asked."""
        try:
            claim = await self._get_claim(record.namespace, record.name)
        except BiaxialError as exc:
            log.info(
                "reconcile: claim %s/%s (%s) not checked this time: %s",
                record.namespace,
                record.name,
                record.uid,
                exc,
            )
            return False, None
        return True, stale_reason(record, claim, node_name=self._node, driver=self._driver)

    async def run_once(self) -> list[Released]:
        """One pass: judge every completed claim, release those stale for the grace period."""
        try:
            checkpoint = await self._preparer.snapshot()
        except CheckpointError as exc:
            log.debug("reconcile: checkpoint unreadable, nothing judged: %s", exc)
            return []
        records = [r for r in checkpoint.claims.values() if r.state == PREPARE_COMPLETED]
        verdicts = await asyncio.gather(*(self._judge(r) for r in records))
        present = {r.uid for r in records}
        for uid in list(self._stale_since):
            if uid not in present:
                del self._stale_since[uid]  # unprepared meanwhile
        released: list[Released] = []
        now = self._clock()
        for record, (known, verdict) in zip(records, verdicts, strict=True):
            if not known:
                continue
            if verdict is None:
                self._stale_since.pop(record.uid, None)
                continue
            first = self._stale_since.setdefault(record.uid, (now, verdict))[0]
            if now - first < self._grace_s:
                if first == now:
                    log.info(
                        "reconcile: claim %s/%s (%s) looks stale (%s); released in %g s "
                        "unless that changes",
                        record.namespace,
                        record.name,
                        record.uid,
                        verdict,
                        self._grace_s,
                    )
                continue
            done = await self._preparer.release_stale(record.uid, verdict, first)
            del self._stale_since[record.uid]
            if done is not None:
                released.append(Released(done, verdict))
        return released

    async def run(
        self,
        period_s: float,
        on_release: Callable[[Released], Awaitable[None]],
        wake: asyncio.Event | None = None,
    ) -> None:
        """Reconcile every ``period_s`` (or when ``wake`` is set) until cancelled."""
        wake = wake or asyncio.Event()
        while True:
            await wait_at_most(wake.wait(), period_s)
            wake.clear()
            for released in await self.run_once():
                await on_release(released)

"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection.

Only the leader schedules and deallocates; standbys keep their caches warm and wait.

* A candidate acquires the Lease when it does not exist, is held by nobody, or its holder
  has not renewed it for ``lease_duration`` as *observed on this candidate's clock* (the time
  this candidate last saw the record change, never the remote ``renewTime``, so clock skew
  between machines does not matter).
* Every write is a PUT carrying the Lease's resourceVersion (or a create), so two
  candidates can never both win the same round: the loser gets 409.
* The leader renews every ``retry_period``; if it cannot renew for ``renew_deadline`` it
  stops leading (:meth:`LeaderElector.hold` returns) and the process must stop its work. Since
  ``renew_deadline < lease_duration``, the old leader stops before a standby can take over.
* On graceful shutdown the leader releases the Lease (empty holder, duration 1 s), so a
  standby takes over at once instead of after the lease duration.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import Any

from controller.api import JSON, LEASES, Api, meta
from controller.events import now_rfc3339
from controller.metrics import Metrics
from controller.settings import Settings
from driver.api.errors import ApiError, ConflictError, NotFoundError

log = logging.getLogger(f"biaxial.{__name__}")


class LeaderElector:
    """See the module docstring."""

    def __init__(self, api: Api, settings: Settings, metrics: Metrics) -> None:
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.identity = settings.identity
        self.is_leader = False
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._lease: JSON | None = None

    def _spec(self, transitions: int, acquire_time: str) -> JSON:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_duration_s)),
            "acquireTime": acquire_time,
            "renewTime": now_rfc3339(micro=True),
            "leaseTransitions": transitions,
        }

    def _observe(self, lease: JSON) -> None:
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"))
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()
        self._lease = lease

    async def try_acquire_or_renew(self) -> bool:
        """One round; True when this candidate holds the Lease afterwards."""
        namespace, name = self.settings.lease_namespace, self.settings.lease_name
        try:
            lease = await self.api.get(LEASES, name, namespace)
        except NotFoundError:
            now = now_rfc3339(micro=True)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": self._spec(0, now),
            }
            try:
                created = await self.api.create(LEASES, body, namespace)
            except ApiError as exc:
                log.debug("lease %s/%s: create failed: %s", namespace, name, exc)
                return False
            self._observe(created)
            return True
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_duration_s)
        held_by_other = holder not in ("", self.identity)
        if held_by_other and time.monotonic() < self._observed_at + duration:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire_time = spec.get("acquireTime") or now_rfc3339(micro=True)
        if holder != self.identity:
            transitions += 1
            acquire_time = now_rfc3339(micro=True)
        body = copy.deepcopy(lease)
        body["spec"] = self._spec(transitions, acquire_time)
        try:
            written = await self.api.replace(LEASES, body)
        except ConflictError:
            return False
        except ApiError as exc:
            log.debug("lease %s/%s: update failed: %s", namespace, name, exc)
            return False
        self._observe(written)
        if holder != self.identity:
            log.info(
                "became leader (lease %s/%s, previous holder %r)", namespace, name, holder or None
            )
        return True

    async def acquire(self) -> None:
        """Wait until this candidate leads."""
        log.info(
            "waiting for leadership (lease %s/%s, identity %s)",
            self.settings.lease_namespace,
            self.settings.lease_name,
            self.identity,
        )
        acquired = await self.try_acquire_or_renew()
        while not acquired:
            await asyncio.sleep(self.settings.retry_period_s)
            acquired = await self.try_acquire_or_renew()
        self.is_leader = True
        self.metrics.leader.set(1)

    async def hold(self) -> None:
        """Renew until a renewal cannot succeed within the renew deadline; then return."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.retry_period_s)
            if await self.try_acquire_or_renew():
                last = time.monotonic()
                continue
            if time.monotonic() - last >= self.settings.renew_deadline_s:
                break
        self.is_leader = False
        self.metrics.leader.set(0)
        log.error("lost leadership (no renewal for %.1fs)", self.settings.renew_deadline_s)

    async def release(self) -> None:
        """Give the Lease up (graceful shutdown); best effort."""
        if not self.is_leader or self._lease is None:
            return
        self.is_leader = False
        self.metrics.leader.set(0)
        body = copy.deepcopy(self._lease)
        spec = body.setdefault("spec", {})
        if spec.get("holderIdentity") != self.identity:
            return
        spec["holderIdentity"] = ""
        spec["leaseDurationSeconds"] = 1
        spec["renewTime"] = now_rfc3339(micro=True)
        try:
            await self.api.replace(LEASES, body)
            log.info("released the lease %s", meta(body).get("name"))
        except ApiError as exc:
            log.warning("could not release the lease: %s", exc)

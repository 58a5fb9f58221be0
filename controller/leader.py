"""Leader election on a ``coordination.k8s.io/v1`` Lease with client-go's semantics, and the
write fence that keeps a process which does not hold the Lease from writing anything else.

Only the leader schedules and deallocates; standbys keep their caches warm and wait.

Election (the rules of client-go's ``tools/leaderelection``):

* Each candidate decides on its own clock only. A Lease held by another candidate is respected
  until its record has not changed for the record's ``leaseDurationSeconds``, counted from the
  moment *this* candidate saw it change (the observed time), never from the record's
  ``renewTime``: clock offsets between machines do not matter, and a clock *rate* difference
  is tolerated up to the ratio lease duration / renew deadline.
* Every write is conditional (a PUT carrying the resourceVersion that was read, or a create),
  so two candidates never win the same round: the loser gets 409.
* A standby tries every ``retry_period`` stretched by a random jitter of up to 1.2 times
  (client-go's ``JitterFactor``), forever. Every failed attempt is logged with its reason (API
  errors at WARNING; a new holder once at INFO); an API error never ends the process.
* The leader renews every ``retry_period``: first by writing the record it last wrote (the
  optimistic path), and on any failure by reading the Lease and writing it again. API errors
  (409, 429, 5xx, timeouts) are retried every ``retry_period`` until the **renew deadline**:
  ``renew_deadline`` after the moment the last successful renewal was *sent*. When the deadline
  passes, or the leader reads a record it did not write (held by another candidate, or taken
  and released again while this one was paused), it stops leading at once:
  the fence is revoked, :meth:`LeaderElector.hold` returns and the process exits non-zero, as
  client-go's ``OnStoppedLeading`` does, so the Deployment restarts it as a fresh candidate.
* On graceful shutdown the leader revokes the fence, then releases the Lease (empty holder,
  ``leaseDurationSeconds: 1``), so a standby takes over at once.

The write fence (:class:`WriteFence`):

* It is open only while the Lease this process holds is known to be valid: until
  ``renew_deadline`` after the last successful renewal was sent, on the monotonic clock (which
  keeps counting while the process is stopped). It is checked immediately before each mutating
  request: by :class:`FencedApi`, the :class:`~controller.api.Api` the scheduler, committer and
  deallocator write through, and, in the real client, once more after the client-side rate
  limiter (``kubeapi.Client(write_fence=...)``), so a write that waited for a token, or for a
  stopped process to be resumed, is refused too. A refused write raises
  :class:`NotLeaderError` and nothing is sent; the callers treat it as any API error (the
  placement is rolled back or retried later).
* So a leader paused (SIGSTOP, a long GC pause, a blocked event loop) past its renew deadline
  writes nothing after it resumes until a renewal succeeds. A renewal is a conditional PUT: it
  succeeds only if nobody took the Lease meanwhile; if somebody did, the fence is revoked for
  good and the process exits.
* Why this is safe: a standby takes over only ``lease_duration`` after it *observed* the
  leader's last renewal, which it cannot observe before the leader sent it; the leader's fence
  closes ``renew_deadline`` after sending it. The difference (5 s with the defaults 15/10/2)
  covers a write between the fence check and the API server. What no client-side fence can
  cover, since the API server has no fencing tokens across objects, is a write held up longer
  than that difference between the check and the server (a network stall, a pause in exactly
  that window); client-go shares this limit. The one such write that could break an invariant,
  a binding landing after the next leader released its pod's claims, is refused by the API
  server itself (see :mod:`controller.repair`).

The Lease requests go through their own client (``lease_api``), never through the fence, and
with their own rate limit, so a busy scheduler never delays a renewal.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.api import JSON, LEASES, Api, GuardedApi
from controller.events import now_rfc3339
from controller.metrics import Metrics
from controller.settings import LEADER_JITTER_FACTOR, Settings
from driver.api.errors import ApiError, ConflictError, NotFoundError

log = logging.getLogger(f"biaxial.{__name__}")

Clock = Callable[[], float]


class NotLeaderError(ApiError):
    """A write refused before it was sent: this process does not hold the leader Lease (it
    lost it, never had it, or has not confirmed it since its renew deadline passed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=0, reason="NotLeader")


class WriteFence:
    """Open while the leader Lease is known valid (see the module docstring).

    ``clock`` is the monotonic clock (tests pass a fake one); :meth:`check` raises
    :class:`NotLeaderError` when closed.
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock
        self._confirmed_at: float | None = None  # when the last good renewal was sent
        self._open_until = -math.inf
        self._revoked: str | None = None
        self._warned = False
        self.refused = 0  # writes refused so far

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.monotonic()

    @property
    def open_until(self) -> float:
        return self._open_until

    @property
    def is_open(self) -> bool:
        return self._revoked is None and self._now() < self._open_until

    @property
    def revoked(self) -> bool:
        return self._revoked is not None

    def confirm(self, sent_at: float, valid_for: float) -> None:
        """A renewal sent at ``sent_at`` succeeded: writes may go out until ``sent_at +
        valid_for``. No effect once revoked."""
        if self._revoked is not None:
            return
        if sent_at + valid_for > self._open_until:
            self._confirmed_at = sent_at
            self._open_until = sent_at + valid_for
        self._warned = False

    def revoke(self, reason: str) -> None:
        """Close for good (leadership lost, or the Lease released)."""
        if self._revoked is None:
            self._revoked = reason
        self._open_until = -math.inf

    def check(self, method: str, path: str) -> None:
        """Raise :class:`NotLeaderError` unless a write may be sent now."""
        if self._revoked is not None:
            reason = self._revoked
        else:
            now = self._now()
            if now < self._open_until:
                return
            if self._confirmed_at is None:
                reason = "this process does not hold the leader lease"
            else:
                reason = (
                    f"the leader lease was last confirmed {now - self._confirmed_at:.1f}s ago, "
                    "past the renew deadline; no write until it is renewed"
                )
        self.refused += 1
        if not self._warned:
            self._warned = True
            log.warning("write fence closed, refusing writes: %s", reason)
        raise NotLeaderError(f"{method} {path} not sent: {reason}")


class FencedApi(GuardedApi):
    """An :class:`~controller.api.Api` whose writes are checked against a :class:`WriteFence`
    first; reads and watches pass through unchanged."""

    def __init__(self, inner: Api, fence: WriteFence) -> None:
        super().__init__(inner)
        self.fence = fence

    def guard(self, method: str, path: str) -> None:
        if method not in {"GET", "HEAD"}:
            self.fence.check(method, path)


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one acquire-or-renew round."""

    ok: bool
    why: str = ""  # why not, for the log
    api_error: bool = False  # the API server (or the network) failed the request
    lost: bool = False  # this leader saw the Lease held by another candidate


class LeaderElector:
    """See the module docstring. ``api`` is the Lease client; it must not be fenced."""

    def __init__(
        self,
        api: Api,
        settings: Settings,
        metrics: Metrics,
        fence: WriteFence | None = None,
        *,
        clock: Clock | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self.identity = settings.identity
        self.fence = fence if fence is not None else WriteFence(clock=clock)
        self.is_leader = False
        self.holder: str | None = None  # the holder last observed
        self._clock = clock
        self._rng = rng or random.Random().random  # noqa: S311 - jitter, not security
        self._observed: JSON | None = None  # the Lease spec as last observed
        self._observed_at = 0.0
        self._lease: JSON | None = None  # the Lease as last read or written

    # ------------------------------------------------------------------ helpers

    def _now(self) -> float:
        return self._clock() if self._clock is not None else time.monotonic()

    @property
    def _where(self) -> str:
        return f"{self.settings.lease_namespace}/{self.settings.lease_name}"

    def _record(self, transitions: int, acquire_time: str) -> JSON:
        return {
            "holderIdentity": self.identity,
            # Rounded up: others wait at least as long as this candidate assumes they do.
            "leaseDurationSeconds": max(1, math.ceil(self.settings.lease_duration_s)),
            "acquireTime": acquire_time,
            "renewTime": now_rfc3339(micro=True),
            "leaseTransitions": transitions,
        }

    def _duration(self, spec: JSON) -> float:
        return float(spec.get("leaseDurationSeconds") or self.settings.lease_duration_s)

    def _observe(self, lease: JSON) -> None:
        """Remember the record and, when it changed, the local time it was seen to change."""
        spec: JSON = lease.get("spec") or {}
        if spec != self._observed:
            self._observed = copy.deepcopy(spec)
            self._observed_at = self._now()
        self.holder = spec.get("holderIdentity") or None
        self._lease = lease

    def _won(self, written: JSON, sent_at: float, previous: str | None) -> Attempt:
        self._observe(written)
        self.fence.confirm(sent_at, self.settings.renew_deadline_s)
        if not self.is_leader:
            self.is_leader = True
            self.metrics.leader.set(1)
            log.info(
                "became leader (lease %s, identity %s, previous holder %s)",
                self._where,
                self.identity,
                previous or "none",
            )
        return Attempt(ok=True)

    # ------------------------------------------------------------------ one round

    async def try_acquire_or_renew(self) -> bool:
        """One round; True when this candidate holds the Lease afterwards."""
        return (await self._attempt()).ok

    async def _attempt(self) -> Attempt:
        """One round (see the module docstring); never raises :class:`ApiError`."""
        if self.is_leader and self._lease is not None:
            body = copy.deepcopy(self._lease)
            spec = body.get("spec") or {}
            body["spec"] = self._record(
                int(spec.get("leaseTransitions") or 0),
                spec.get("acquireTime") or now_rfc3339(micro=True),
            )
            sent_at = self._now()
            try:
                written = await self.api.replace(LEASES, body)
            except ApiError as exc:
                log.debug("lease %s: optimistic renewal failed (%s); re-reading", self._where, exc)
            else:
                return self._won(written, sent_at, self.identity)
        namespace, name = self.settings.lease_namespace, self.settings.lease_name
        try:
            lease = await self.api.get(LEASES, name, namespace)
        except NotFoundError:
            return await self._create()
        except ApiError as exc:
            return Attempt(ok=False, why=f"could not read the lease: {exc}", api_error=True)
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        if self.is_leader and holder != self.identity:
            # Someone else wrote the record since this leader's last renewal (took it, or took
            # it and released it): another process may have led meanwhile, so this one stops.
            now_held = f"held by {holder}" if holder else "released by another process"
            return Attempt(ok=False, why=f"the lease is now {now_held}", lost=True)
        if (
            holder
            and holder != self.identity
            and self._now() < self._observed_at + self._duration(spec)
        ):
            return Attempt(ok=False, why=f"the lease is held by {holder}")
        transitions = int(spec.get("leaseTransitions") or 0)
        acquire_time = spec.get("acquireTime") or now_rfc3339(micro=True)
        if holder != self.identity:
            transitions += 1
            acquire_time = now_rfc3339(micro=True)
        body = copy.deepcopy(lease)
        body["spec"] = self._record(transitions, acquire_time)
        sent_at = self._now()
        try:
            written = await self.api.replace(LEASES, body)
        except ConflictError:
            return Attempt(ok=False, why="another candidate wrote the lease first (409)")
        except ApiError as exc:
            return Attempt(ok=False, why=f"could not write the lease: {exc}", api_error=True)
        return self._won(written, sent_at, holder or None)

    async def _create(self) -> Attempt:
        namespace, name = self.settings.lease_namespace, self.settings.lease_name
        now = now_rfc3339(micro=True)
        body: JSON = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": self._record(0, now),
        }
        sent_at = self._now()
        try:
            created = await self.api.create(LEASES, body, namespace)
        except ConflictError:
            return Attempt(ok=False, why="another candidate created the lease first (409)")
        except ApiError as exc:
            return Attempt(ok=False, why=f"could not create the lease: {exc}", api_error=True)
        return self._won(created, sent_at, None)

    async def _bounded(self, timeout_s: float) -> Attempt:
        """One round that gives up after ``timeout_s`` (client-go bounds it by the renew
        deadline's context)."""
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can lose the caller's
            # cancellation when the attempt ends at that moment (kubeapi.tasks.wait_at_most).
            async with asyncio.timeout(timeout_s):
                return await self._attempt()
        except TimeoutError:
            return Attempt(
                ok=False, why=f"the lease request took longer than {timeout_s:.1f}s", api_error=True
            )

    # ------------------------------------------------------------------ the loops

    def retry_delay(self) -> float:
        """``retry_period`` plus client-go's jitter (up to 1.2 times more)."""
        period = self.settings.retry_period_s
        return period * (1.0 + self._rng() * LEADER_JITTER_FACTOR)

    async def acquire(self) -> None:
        """Try until this candidate leads; never gives up, logs why each attempt failed."""
        log.info("waiting for leadership (lease %s, identity %s)", self._where, self.identity)
        last_why = ""
        while True:
            attempt = await self._bounded(self.settings.renew_deadline_s)
            if attempt.ok:
                return
            if attempt.api_error:
                log.warning("lease %s not acquired: %s; retrying", self._where, attempt.why)
            elif attempt.why != last_why:
                log.info("lease %s not acquired: %s; retrying", self._where, attempt.why)
            last_why = attempt.why
            await asyncio.sleep(self.retry_delay())

    async def hold(self) -> None:
        """Renew until leadership is lost; then revoke the fence and return (the caller
        stops the process)."""
        retry = self.settings.retry_period_s
        failures = 0
        while True:
            await asyncio.sleep(retry)
            remaining = self.fence.open_until - self._now()
            attempt = await self._bounded(max(remaining, retry))
            if attempt.ok:
                if failures:
                    log.info("lease %s renewed after %d failed attempt(s)", self._where, failures)
                failures = 0
                continue
            failures += 1
            if attempt.lost:
                reason = attempt.why
                break
            if not self.fence.is_open:
                reason = (
                    f"no renewal within the renew deadline ({self.settings.renew_deadline_s:g}s); "
                    f"last attempt: {attempt.why}"
                )
                break
            log.warning(
                "lease %s renewal failed (%s); retrying until the renew deadline in %.1fs",
                self._where,
                attempt.why,
                self.fence.open_until - self._now(),
            )
        self._stop_leading(reason)

    def _stop_leading(self, reason: str) -> None:
        self.fence.revoke(f"leadership lost: {reason}")
        self.is_leader = False
        self.metrics.leader.set(0)
        log.error("stopped leading (lease %s): %s", self._where, reason)

    async def release(self) -> None:
        """Give the Lease up (graceful shutdown); best effort. Writes are fenced first."""
        self.fence.revoke("the leader lease was released (shutting down)")
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
            log.info("released the lease %s", self._where)
        except ApiError as exc:
            log.warning("could not release the lease %s: %s", self._where, exc)

"""Lease-based leader election (controller.leader) against the fake API, with client-go's
semantics (k8s.io/client-go/tools/leaderelection): create, renew, a held lease is respected
until it has not changed for its duration (on the candidate's own clock), two candidates never
both win a round, release hands over at once; API errors during renewal are retried until the
renew deadline, standbys retry forever and log why, a leader that loses the lease (or cannot
renew in time, or was paused past its lease) sends no write until it has renewed, and clock
skew between machines changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable

import pytest

from controller import leader as leader_module
from controller.api import LEASES, PODS
from controller.leader import FencedApi, LeaderElector, NotLeaderError, WriteFence
from controller.metrics import Metrics
from controller.settings import Settings
from driver.api.errors import ConfigError, ConflictError, ServerError
from tests.unit.controller_fakes import FakeApi


def settings(identity: str) -> Settings:
    return Settings(
        identity=identity,
        lease_namespace="kube-system",
        lease_duration_s=1.0,
        renew_deadline_s=0.5,
        retry_period_s=0.05,
    ).validate()


def holder(api: FakeApi) -> str | None:
    lease = api.stored(LEASES, "biaxial-controller", "kube-system")
    return None if lease is None else lease["spec"].get("holderIdentity")


def test_create_renew_and_respect_a_held_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeApi()
    a = LeaderElector(api, settings("a"), Metrics())
    b = LeaderElector(api, settings("b"), Metrics())

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        assert holder(api) == "a"
        assert not await b.try_acquire_or_renew(), "b took a lease a holds"
        assert await a.try_acquire_or_renew()  # renew
        lease = api.stored(LEASES, "biaxial-controller", "kube-system")
        assert lease is not None
        assert lease["spec"]["leaseTransitions"] == 0
        # a stops renewing; b must wait a full lease duration on its own clock
        now = time.monotonic()
        monkeypatch.setattr("controller.leader.time.monotonic", lambda: now + 0.5)
        assert not await b.try_acquire_or_renew()
        monkeypatch.setattr("controller.leader.time.monotonic", lambda: now + 2.5)
        assert await b.try_acquire_or_renew()
        assert holder(api) == "b"
        lease = api.stored(LEASES, "biaxial-controller", "kube-system")
        assert lease is not None
        assert lease["spec"]["leaseTransitions"] == 1

    asyncio.run(scenario())


def test_two_candidates_never_both_win_a_round() -> None:
    api = FakeApi()
    first = LeaderElector(api, settings("a"), Metrics())

    async def scenario() -> list[bool]:
        await first.acquire()
        await first.release()  # an empty holder: anyone may take it
        candidates = [LeaderElector(api, settings(n), Metrics()) for n in ("x", "y", "z")]
        return list(await asyncio.gather(*(c.try_acquire_or_renew() for c in candidates)))

    results = asyncio.run(scenario())
    assert results.count(True) == 1
    assert holder(api) in {"x", "y", "z"}


def test_release_empties_the_holder() -> None:
    api = FakeApi()
    a = LeaderElector(api, settings("a"), Metrics())

    async def scenario() -> None:
        await a.acquire()
        assert a.is_leader
        await a.release()

    asyncio.run(scenario())
    assert not a.is_leader
    assert holder(api) in (None, "")
    lease = api.stored(LEASES, "biaxial-controller", "kube-system")
    assert lease is not None
    assert lease["spec"]["leaseDurationSeconds"] == 1


# --------------------------------------------------------------------------- helpers


class Clock:
    """A monotonic clock the test moves by hand (a pause is a jump)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lease(api: FakeApi) -> dict[str, object]:
    stored = api.stored(LEASES, "biaxial-controller", "kube-system")
    assert stored is not None
    spec: dict[str, object] = stored["spec"]
    return spec


def server_error(status: int) -> ServerError:
    return ServerError(f"injected {status}", status=status)


def pod_body(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {}}


async def until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` on the loop for up to 5 s (the fake API has no events to wait on)."""
    async with asyncio.timeout(5):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on but the state
            await asyncio.sleep(0.01)


def writes(api: FakeApi) -> list[tuple[str, str, str | None]]:
    return [v for v in api.verbs() if v[0] not in {"get", "list", "watch"} and v[1] != "leases"]


# --------------------------------------------------------------------------- settings


def test_renew_deadline_must_exceed_jittered_retry_period() -> None:
    # client-go NewLeaderElector: renewDeadline must be greater than retryPeriod*JitterFactor
    with pytest.raises(ConfigError, match=r"renew deadline > 1.2 x retry period"):
        Settings(lease_duration_s=3, renew_deadline_s=1.1, retry_period_s=1).validate()
    Settings(lease_duration_s=3, renew_deadline_s=1.3, retry_period_s=1).validate()


def test_retry_delay_is_the_retry_period_with_client_go_jitter() -> None:
    # client-go acquire: wait.JitterUntil(..., RetryPeriod, JitterFactor=1.2, ...)
    low = LeaderElector(FakeApi(), settings("a"), Metrics(), rng=lambda: 0.0)
    high = LeaderElector(FakeApi(), settings("a"), Metrics(), rng=lambda: 1.0)
    assert low.retry_delay() == pytest.approx(0.05)
    assert high.retry_delay() == pytest.approx(0.05 * 2.2)


def test_the_lease_duration_is_never_advertised_shorter_than_assumed() -> None:
    api = FakeApi()
    s = Settings(
        identity="a",
        lease_namespace="kube-system",
        lease_duration_s=2.4,
        renew_deadline_s=2.2,
        retry_period_s=0.5,
    ).validate()
    assert asyncio.run(LeaderElector(api, s, Metrics()).try_acquire_or_renew())
    assert lease(api)["leaseDurationSeconds"] == 3  # others wait >= 2.4 s > renew deadline


# --------------------------------------------------------------------------- API errors


def test_transient_errors_on_renewal_are_retried_until_the_renew_deadline() -> None:
    """Measured before: one 429/5xx on the Lease read ended the leader. Now a few in a row
    (fewer than fit in the renew deadline) leave it leading with the fence open."""
    api = FakeApi()
    a = LeaderElector(api, settings("a"), Metrics())

    async def scenario() -> None:
        await a.acquire()
        holding = asyncio.ensure_future(a.hold())
        for status in (429, 500, 503):
            api.fail("replace", "leases", server_error(status))
            api.fail("get", "leases", server_error(status))
        # 3 failed rounds take 3 retry periods (0.15 s), well inside the 0.5 s deadline
        await until(lambda: not api._faults)
        renewed = lease(api)["renewTime"]
        await until(lambda: lease(api)["renewTime"] != renewed)
        assert not holding.done(), "the leader gave up on transient errors"
        assert a.is_leader
        assert a.fence.is_open
        holding.cancel()
        await asyncio.gather(holding, return_exceptions=True)

    asyncio.run(scenario())


def test_renewal_failing_past_the_deadline_stops_every_write() -> None:
    api = FakeApi()
    a = LeaderElector(api, settings("a"), Metrics())
    writer = FencedApi(api, a.fence)

    async def scenario() -> float:
        await a.acquire()
        await writer.create(PODS, pod_body("before"))  # the leader writes
        api.fail("replace", "leases", server_error(503), count=1000)
        api.fail("get", "leases", server_error(503), count=1000)
        start = time.monotonic()
        await asyncio.wait_for(a.hold(), 10)  # returns: leadership lost
        elapsed = time.monotonic() - start
        with pytest.raises(NotLeaderError, match="leadership lost: no renewal within"):
            await writer.create(PODS, pod_body("after"))
        return elapsed

    elapsed = asyncio.run(scenario())
    assert elapsed >= 0.5 - 0.05  # it kept trying for the whole renew deadline
    assert not a.is_leader
    assert a.fence.revoked
    assert [w for w in writes(api) if w[2] is None] == [("create", "pods", None)]
    assert [c.name for c in api.calls if c.verb == "create" and c.plural == "pods"] == ["before"]


def test_standby_retries_forever_and_logs_why(caplog: pytest.LogCaptureFixture) -> None:
    """Measured before: a standby that hit one 429 exited with status 0 and logged nothing."""
    api = FakeApi()
    b = LeaderElector(api, settings("b"), Metrics())
    api.fail("get", "leases", server_error(429), count=2)
    api.fail("get", "leases", server_error(500))
    api.fail("create", "leases", server_error(503))

    async def scenario() -> None:
        await asyncio.wait_for(b.acquire(), 10)

    with caplog.at_level(logging.INFO, logger="biaxial.controller.leader"):
        asyncio.run(scenario())
    assert b.is_leader
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4
    assert sum("could not read the lease: injected 429" in w for w in warnings) == 2
    assert any("could not read the lease: injected 500" in w for w in warnings)
    assert any("could not create the lease: injected 503" in w for w in warnings)


def test_a_standby_logs_the_holder_once_and_waits() -> None:
    api = FakeApi()
    a = LeaderElector(api, settings("a"), Metrics())
    b = LeaderElector(api, settings("b"), Metrics())

    async def scenario() -> None:
        await a.acquire()
        renewing = asyncio.ensure_future(a.hold())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(b.acquire(), 1.5)  # 1.5 lease durations: a keeps renewing
        assert a.is_leader
        assert not b.is_leader
        renewing.cancel()
        await asyncio.gather(renewing, return_exceptions=True)

    asyncio.run(scenario())


# --------------------------------------------------------------------------- the fence


def test_the_fence_is_closed_until_the_lease_is_held_and_reads_always_pass() -> None:
    api = FakeApi()
    api.seed(PODS, pod_body("p"))
    a = LeaderElector(api, settings("a"), Metrics())
    writer = FencedApi(api, a.fence)

    async def scenario() -> None:
        with pytest.raises(NotLeaderError, match="does not hold the leader lease"):
            await writer.patch(PODS, "p", {"metadata": {"labels": {"x": "y"}}}, namespace="default")
        with pytest.raises(NotLeaderError):
            await writer.bind("default", "p", "uid", "node-1")
        assert (await writer.get(PODS, "p", "default"))["metadata"]["name"] == "p"
        assert [len(page.items) async for page in writer.pages(PODS)] == [1]
        await a.acquire()
        await writer.patch(PODS, "p", {"metadata": {"labels": {"x": "y"}}}, namespace="default")
        await a.release()
        with pytest.raises(NotLeaderError, match="released"):
            await writer.delete(PODS, "p", "default")

    asyncio.run(scenario())
    assert writes(api) == [("patch", "pods", None)]
    assert a.fence.refused == 3


def test_a_leader_paused_past_its_lease_writes_nothing_after_it_resumes() -> None:
    """SIGSTOP or a GC pause longer than the lease: the standby takes over; the old leader's
    writes queued during the pause are refused, its renewal finds the lease taken, and it stops
    leading without having sent anything."""
    api = FakeApi()
    clock = Clock()
    a = LeaderElector(api, settings("a"), Metrics(), clock=clock)
    b = LeaderElector(api, settings("b"), Metrics(), clock=clock)
    writer = FencedApi(api, a.fence)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        await writer.create(PODS, pod_body("before"))
        assert not await b.try_acquire_or_renew()  # b observes a's record now
        clock.now += 3.0  # a is paused 3 s: past its 0.5 s renew deadline and the 1 s lease
        with pytest.raises(NotLeaderError, match=r"last confirmed 3\.0s ago"):
            await writer.create(PODS, pod_body("queued-during-pause"))
        assert await b.try_acquire_or_renew()  # b's own clock: a's record is 3 s old
        attempt = await a._attempt()  # a resumes and tries to renew
        assert attempt.lost
        assert "held by b" in attempt.why
        a._stop_leading(attempt.why)
        with pytest.raises(NotLeaderError, match="leadership lost"):
            await writer.create(PODS, pod_body("after"))

    asyncio.run(scenario())
    assert [c.name for c in api.calls if c.verb == "create" and c.plural == "pods"] == ["before"]
    assert lease(api)["holderIdentity"] == "b"


def test_a_paused_leader_whose_lease_nobody_took_resumes_after_renewing() -> None:
    api = FakeApi()
    clock = Clock()
    a = LeaderElector(api, settings("a"), Metrics(), clock=clock)
    writer = FencedApi(api, a.fence)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        clock.now += 3.0
        with pytest.raises(NotLeaderError):
            await writer.create(PODS, pod_body("stale"))
        assert await a.try_acquire_or_renew()  # conditional PUT: nobody wrote the lease
        await writer.create(PODS, pod_body("fresh"))

    asyncio.run(scenario())
    assert [c.name for c in api.calls if c.verb == "create" and c.plural == "pods"] == ["fresh"]


def test_a_slow_renewal_answer_does_not_extend_the_fence() -> None:
    """The fence is anchored at the time the renewal was *sent*: a slow answer cannot extend
    the leader's writes past what the standbys assume."""
    api = FakeApi()
    clock = Clock()
    a = LeaderElector(api, settings("a"), Metrics(), clock=clock)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        sent = clock.now

        original = api.replace

        async def slow_replace(*args: object, **kwargs: object) -> dict[str, object]:
            written = await original(*args, **kwargs)  # type: ignore[arg-type]
            clock.now += 0.4  # the answer took 0.4 s
            return written

        api.replace = slow_replace  # type: ignore[method-assign]
        assert await a.try_acquire_or_renew()
        assert a.fence.open_until == pytest.approx(sent + 0.5)

    asyncio.run(scenario())


def test_a_conflicting_writer_on_the_lease_ends_leadership_at_the_next_round() -> None:
    api = FakeApi()
    a = LeaderElector(api, settings("a"), Metrics())

    async def scenario() -> float:
        await a.acquire()
        stored = api.stored(LEASES, "biaxial-controller", "kube-system")
        assert stored is not None
        stored["spec"]["holderIdentity"] = "intruder"
        api.objects[("leases", "kube-system", "biaxial-controller")] = stored
        api._next_rv()
        stored["metadata"]["resourceVersion"] = str(api.last_rv)
        start = time.monotonic()
        await asyncio.wait_for(a.hold(), 10)
        return time.monotonic() - start

    elapsed = asyncio.run(scenario())
    assert elapsed < 0.5, "stopped at the first round, not at the renew deadline"
    assert a.fence.revoked
    assert not a.is_leader


# --------------------------------------------------------------------------- clock skew


def test_clock_skew_between_machines_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader whose wall clock is an hour behind writes renewTimes that look expired; a
    standby judges only by when it saw the record change, on its own clock."""
    api = FakeApi()
    clock = Clock()
    a = LeaderElector(api, settings("a"), Metrics(), clock=clock)
    b = LeaderElector(api, settings("b"), Metrics(), clock=clock)

    def skewed(hours: float) -> Callable[..., str]:
        def now(micro: bool = False) -> str:
            at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=hours)
            return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        return now

    async def scenario() -> None:
        monkeypatch.setattr(leader_module, "now_rfc3339", skewed(-1))
        assert await a.try_acquire_or_renew()  # renewTime an hour ago: expired by wall time
        assert not await b.try_acquire_or_renew()
        for _ in range(5):  # a renews every 0.4 s; each renewal is a change b observes
            clock.now += 0.4
            assert await a.try_acquire_or_renew()
            assert not await b.try_acquire_or_renew(), "b took a live lease by wall time"
        monkeypatch.setattr(leader_module, "now_rfc3339", skewed(+1))
        assert await a.try_acquire_or_renew()  # renewTime an hour ahead: changes nothing
        assert not await b.try_acquire_or_renew()  # b sees that renewal now
        clock.now += 0.99
        assert not await b.try_acquire_or_renew()
        clock.now += 0.02  # a stopped renewing 1.01 s ago on b's clock: b takes over
        assert await b.try_acquire_or_renew()

    asyncio.run(scenario())
    assert lease(api)["holderIdentity"] == "b"


def test_a_409_on_acquisition_means_another_candidate_won() -> None:
    api = FakeApi()
    b = LeaderElector(api, settings("b"), Metrics())
    api.fail("create", "leases", ConflictError("exists", status=409, reason="AlreadyExists"))
    assert not asyncio.run(b.try_acquire_or_renew())
    assert not b.is_leader
    assert not b.fence.is_open


def test_write_fence_message_and_count() -> None:
    clock = Clock()
    fence = WriteFence(clock=clock)
    with pytest.raises(NotLeaderError) as info:
        fence.check("PUT", "/x")
    assert str(info.value) == "PUT /x not sent: this process does not hold the leader lease"
    fence.confirm(clock.now, 2.0)
    fence.check("PUT", "/x")
    clock.now += 2.0
    assert not fence.is_open
    fence.confirm(clock.now - 1.0, 2.0)  # a renewal sent 1 s ago succeeded
    assert fence.is_open
    fence.revoke("gone")
    fence.confirm(clock.now, 2.0)  # revoked for good
    with pytest.raises(NotLeaderError, match="not sent: gone"):
        fence.check("DELETE", "/y")
    assert fence.refused == 2


def test_a_candidate_that_crashes_while_waiting_does_not_exit_quietly() -> None:
    """Measured before: a standby whose election loop ended exited with status 0, silently.
    API errors no longer end it (above); anything else is a bug and surfaces as one."""
    from controller.app import Controller

    controller = Controller(dataclasses.replace(settings("a"), metrics_port=0), FakeApi())
    assert controller.elector is not None

    async def broken() -> None:
        raise RuntimeError("bug in the election loop")

    controller.elector.acquire = broken  # type: ignore[method-assign]
    assert asyncio.run(controller.run()) == 1
    assert "crashed: RuntimeError: bug in the election loop" in controller.guard.reason


def test_a_leader_whose_lease_was_taken_and_released_while_it_was_paused_stops() -> None:
    """Another process led while this one was paused, then released the Lease: the old leader
    finds a record it did not write and stops, rather than take the Lease again with a stale
    view (stricter than client-go, which would re-acquire)."""
    api = FakeApi()
    clock = Clock()
    a = LeaderElector(api, settings("a"), Metrics(), clock=clock)
    b = LeaderElector(api, settings("b"), Metrics(), clock=clock)

    async def scenario() -> None:
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        clock.now += 3.0
        assert await b.try_acquire_or_renew()
        await b.release()
        attempt = await a._attempt()
        assert attempt.lost
        assert attempt.why == "the lease is now released by another process"

    asyncio.run(scenario())

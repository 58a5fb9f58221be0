"""Lease-based leader election (controller.leader) against the fake API: create, renew, a
held lease is respected until it has not changed for its duration (on the candidate's own
clock), two candidates never both win a round, release hands over at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from controller.api import LEASES
from controller.leader import LeaderElector
from controller.metrics import Metrics
from controller.settings import Settings
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

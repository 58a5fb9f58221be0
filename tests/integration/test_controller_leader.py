"""Leader election with two controller instances on one Lease: one schedules, the other
waits; a killed leader is replaced within the lease duration, a stopped one at once."""

from __future__ import annotations

import time

from controller.settings import Settings
from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    fast_settings,
    pod,
    seed_cluster,
)


def _elected(name: str) -> Settings:
    return fast_settings(leader_elect=True, identity=name, lease_namespace="kube-system")


def _holder(cluster: Emulator) -> str | None:
    lease = cluster.get("leases", "biaxial-controller", "kube-system") or {}
    return (lease.get("spec") or {}).get("holderIdentity") or None


def _leading(c: ControllerThread) -> bool:
    return c.controller is not None and c.controller.leading.is_set()


def test_standby_takes_over_from_a_killed_leader(
    emulator: Emulator, claim_controller: ResourceClaimController
) -> None:
    seed_cluster(emulator)
    a = ControllerThread(emulator, _elected("a")).start()
    emulator.wait_until(lambda: _holder(emulator) == "a", timeout=10)
    b = ControllerThread(emulator, _elected("b")).start()
    try:
        emulator.create(pod("one", legacy_gpus=1))
        emulator.wait_until(lambda: "one" in bound_pods(emulator), timeout=10)
        time.sleep(0.5)
        assert _leading(a)
        assert not _leading(b), "two leaders"
        killed_at = time.monotonic()
        a.kill()
        emulator.wait_until(lambda: _holder(emulator) == "b", timeout=10)
        takeover = time.monotonic() - killed_at
        settings = _elected("b")
        assert takeover <= settings.lease_duration_s + 2 * settings.retry_period_s + 0.5
        emulator.create(pod("two", legacy_gpus=1))
        emulator.wait_until(lambda: "two" in bound_pods(emulator), timeout=10)
        assert check_invariants(emulator) == []
    finally:
        a.stop()
        b.stop()
    assert b.error is None


def test_a_stopped_leader_releases_the_lease(
    emulator: Emulator, claim_controller: ResourceClaimController
) -> None:
    seed_cluster(emulator)
    a = ControllerThread(emulator, _elected("a")).start()
    emulator.wait_until(lambda: _holder(emulator) == "a", timeout=10)
    b = ControllerThread(emulator, _elected("b")).start()
    try:
        time.sleep(0.3)
        stopped_at = time.monotonic()
        a.stop()
        assert a.exit_code == 0
        emulator.wait_until(lambda: _holder(emulator) == "b", timeout=10)
        assert time.monotonic() - stopped_at < 1.5, "the standby waited for the lease to expire"
    finally:
        b.stop()

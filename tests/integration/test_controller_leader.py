"""Leader election with two controller instances on one Lease: one schedules, the other
waits; a killed leader is replaced within the lease duration, a stopped one at once; transient
Lease errors stop neither, and only the holder of the Lease writes."""

from __future__ import annotations

import re
import threading
import time

from controller.settings import LEADER_JITTER_FACTOR, Settings
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
        # client-go's bound: the standby counts the lease from when it *observed* the last
        # renewal (up to one jittered retry period after it), and notices expiry at its next
        # jittered retry: retry periods are stretched by up to JitterFactor 1.2
        # (leaderelection.go, wait.JitterUntil), so two of them take up to 2 x 2.2 x retry.
        longest_retry = settings.retry_period_s * (1 + LEADER_JITTER_FACTOR)
        assert takeover <= settings.lease_duration_s + 2 * longest_retry + 0.5
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


def _holder_checker(cluster: Emulator) -> list[str]:
    """Record, at the instant each write is applied, any write from a controller that is not
    the Lease's holder then (the leader-election client's own Lease writes excluded)."""
    violations: list[str] = []
    lock = threading.Lock()

    def observe(agent: str, verb: str, resource: str) -> None:
        found = re.search(r"biaxial-controller \(([^)]*)\)", agent)
        if found is None or resource.startswith("leases"):
            return
        holder = _holder(cluster)
        if holder != found.group(1):
            with lock:
                violations.append(f"{verb} {resource} from {found.group(1)}, holder {holder}")

    cluster.observe_writes(observe)
    return violations


def test_transient_lease_errors_stop_neither_replica(
    emulator: Emulator, claim_controller: ResourceClaimController
) -> None:
    """Measured before: two injected 503s on the Lease stopped both replicas within 3 s."""
    seed_cluster(emulator)
    violations = _holder_checker(emulator)
    a = ControllerThread(emulator, _elected("a")).start()
    emulator.wait_until(lambda: _holder(emulator) == "a", timeout=10)
    b = ControllerThread(emulator, _elected("b")).start()
    try:
        for round_ in range(3):
            emulator.fail_next(503, resource="leases", count=2)
            emulator.fail_next(429, verbs="get", resource="leases")
            emulator.create(pod(f"p{round_}", legacy_gpus=1, gpumem=3000))
            emulator.wait_until(lambda r=round_: f"p{r}" in bound_pods(emulator), timeout=10)
            time.sleep(0.5)
        assert a.alive
        assert b.alive
        assert _leading(a)
        assert not _leading(b)
        assert _holder(emulator) == "a"
        lease = emulator.get("leases", "biaxial-controller", "kube-system")
        assert lease is not None
        assert lease["spec"].get("leaseTransitions", 0) == 0, "leadership changed hands"
        assert check_invariants(emulator) == []
    finally:
        a.stop()
        b.stop()
    assert a.error is None
    assert b.error is None
    assert (a.exit_code, b.exit_code) == (0, 0)
    assert violations == []

"""A pod that comes while the devices it needs are being released (a full node, one of its
pods just deleted, its claim not yet deallocated) waits for them: it is not reported
unschedulable, counts no attempt, and binds when the claim is released. On a full cluster
with a steady stream of pods this was every pod: a failure, a backoff, a FailedScheduling
condition and event each, and newer pods taking the device first."""

from __future__ import annotations

import pytest

from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    claim_template,
    pod,
    pod_condition,
    pod_events,
    seed_cluster,
)

NODE = "gpu-t4"


@pytest.fixture
def cluster(emulator: Emulator, claim_controller: ResourceClaimController) -> Emulator:
    seed_cluster(emulator, {NODE: "t4x4"})
    emulator.create(claim_template("one"))
    return emulator


def full_node_releasing_one(cluster: Emulator) -> None:
    """The node's four GPUs taken, then one of their pods deleted while every claim write
    takes 2 s (its release is on its way for a while)."""
    full = [f"full-{i}" for i in range(4)]
    for name in full:
        cluster.create(pod(name, template="one"))
    cluster.wait_until(lambda: len(bound_pods(cluster, full)) == 4, timeout=30)
    cluster.add_latency(2.0, verbs={"update", "patch"}, resource="resourceclaims")
    cluster.delete("pods", "full-0", "default", {"gracePeriodSeconds": 0})
    cluster.finish_pod_deletions()


def test_a_pod_waits_for_a_release_in_flight_without_a_failure_report(
    cluster: Emulator, controller: ControllerThread
) -> None:
    full_node_releasing_one(cluster)
    cluster.create(pod("next", template="one"))
    cluster.wait_until(lambda: "next" in bound_pods(cluster), timeout=30, message="never bound")
    reports = [
        r.path
        for r in cluster.requests_for(method="PATCH", resource="pods")
        if r.path.endswith("/pods/next/status")
    ]
    assert reports == [], "reported unschedulable while it waited"
    assert (pod_condition(cluster, "next") or {}).get("status") == "True"
    cluster.wait_until(lambda: bool(pod_events(cluster, "next")), timeout=10)
    assert [r for r, _ in pod_events(cluster, "next")] == ["Scheduled"]
    assert controller.controller is not None
    metrics = controller.controller.scheduler.metrics
    waited = metrics.unschedulable.labels(reason="waiting-for-release")
    assert waited._value.get() >= 1  # type: ignore[attr-defined]
    cluster.faults.clear()
    assert check_invariants(cluster) == []


def test_a_pod_that_a_release_cannot_help_is_reported_at_once(
    cluster: Emulator, controller: ControllerThread
) -> None:
    """Only a shortage of devices waits: a pod that asks for more than the node has is
    reported as before, whatever is being released."""
    full_node_releasing_one(cluster)
    cluster.create(claim_template("five", count=5))
    cluster.create(pod("big", template="five"))
    cluster.wait_until(lambda: pod_condition(cluster, "big") is not None, timeout=20)
    cluster.faults.clear()

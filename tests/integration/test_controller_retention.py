"""A deleted claim's devices stay in use while the pod that reserved it runs
(:mod:`controller.retention`), against the API emulator.

The kubelet does not stop a running container because its claim object went away; it
unprepares the claim when the pod ends (kubelet ``pkg/kubelet/cm/dra``: NodeUnprepareResources
is driven by the pod's termination and the kubelet's own claim cache, not by the claim
object). So a tenant who strips its claim's finalizers and deletes it must not free the
devices its pod still runs with."""

from __future__ import annotations

import pytest

from controller.retention import EVENT_CLAIM_DELETED_IN_USE
from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    pod,
    pod_condition,
    pod_events,
    resource_claim,
    seed_cluster,
)


@pytest.fixture
def cluster(emulator: Emulator, claim_controller: ResourceClaimController) -> Emulator:
    seed_cluster(emulator, {"gpu-t4": "t4x4"})
    return emulator


def test_a_deleted_claim_keeps_its_devices_until_its_pod_ends(
    cluster: Emulator, controller: ControllerThread
) -> None:
    every_gpu = resource_claim("a-claim", namespace="default")
    every_gpu["spec"]["devices"]["requests"][0]["exactly"]["count"] = 4
    cluster.create(every_gpu)
    cluster.create(pod("a", claim="a-claim"))
    cluster.wait_until(lambda: "a" in bound_pods(cluster), timeout=20)

    # Tenant A strips the finalizer of its in-use claim and deletes it; pod a keeps running.
    stripped = {"metadata": {"finalizers": None}}
    cluster.patch("resourceclaims", "a-claim", stripped, namespace="default")
    cluster.delete("resourceclaims", "a-claim", "default")
    assert cluster.get("resourceclaims", "a-claim", "default") is None
    cluster.wait_until(
        lambda: any(r == EVENT_CLAIM_DELETED_IN_USE for r, _ in pod_events(cluster, "a")),
        timeout=10,
    )

    # Tenant B's pod waits, with the scheduler's reason on it, while pod a runs.
    cluster.create(resource_claim("b-claim"))
    cluster.create(pod("b", claim="b-claim"))

    def waiting() -> bool:
        # the pod may first be reported before its claim reaches the controller's cache ("…
        # which does not exist"): wait for the report that counts the deleted claim's devices
        condition = pod_condition(cluster, "b") or {}
        return (
            condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
            and "insufficient free GPUs" in condition.get("message", "")
        )

    cluster.wait_until(waiting, timeout=20)
    condition = pod_condition(cluster, "b")
    assert condition is not None
    assert "insufficient free GPUs" in condition["message"]
    assert "b" not in bound_pods(cluster)
    assert [key.partition("#")[0] for key in _retained(controller)] == ["default/a-claim"]

    # Pod a ends: the devices are free, and b runs.
    cluster.delete("pods", "a", "default")
    cluster.finish_pod_deletions()
    cluster.wait_until(lambda: "b" in bound_pods(cluster), timeout=20)
    assert _retained(controller) == {}
    assert check_invariants(cluster) == []


def _retained(running: ControllerThread) -> dict[str, frozenset[str]]:
    controller = running.controller
    assert controller is not None
    return running.on_loop(lambda: controller.scheduler.retention.retained)

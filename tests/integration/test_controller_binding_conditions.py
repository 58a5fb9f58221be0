"""Device binding conditions (KEP-5007) with the live controller against the API emulator.

Upstream rules (kube-scheduler's DynamicResources plugin): PreBind writes the allocation and
reservation (with ``allocationTimestamp``), emits ``BindingConditionsPending`` and waits until
every ``bindingConditions`` type of each allocated device is True in the claim's
``status.devices`` (``isClaimReadyForBinding``); a True ``bindingFailureConditions`` type, or
``allocationTimestamp + bindingTimeout`` passed, makes the claim unavailable and PostFilter
deallocates it (reservedFor, allocation and devices cleared) so the pod is tried again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.emulator import Emulator, ResourceClaimController
from tests.emulator.errors import ApiStatusError
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    checked_controller,
    fast_settings,
    pod,
    pod_condition,
    pod_events,
    resource_claim,
    seed_cluster,
)

JSON = dict[str, Any]
NODE = "gpu-t4"
READY = "Attached"
FAILED = "AttachFailed"


@pytest.fixture
def cluster(emulator: Emulator, claim_controller: ResourceClaimController) -> Emulator:
    """One T4 node whose GPUs must be attached before use (binding conditions on each)."""
    seed_cluster(emulator, {NODE: "t4x4"})
    for resource_slice in emulator.list("resourceslices"):
        for device in resource_slice["spec"]["devices"]:
            device["bindingConditions"] = [READY]
            device["bindingFailureConditions"] = [FAILED]
        emulator.replace(resource_slice)
    return emulator


def run_controller(cluster: Emulator, **settings: Any) -> Iterator[ControllerThread]:
    with checked_controller(cluster, fast_settings(**settings)) as running:
        yield running


@pytest.fixture
def controller(cluster: Emulator) -> Iterator[ControllerThread]:
    yield from run_controller(cluster)


def claim_status(cluster: Emulator, name: str) -> JSON:
    return (cluster.get("resourceclaims", name, "default") or {}).get("status") or {}


def report(cluster: Emulator, claim: str, condition: str, value: str = "True") -> None:
    """What the attaching controller does: a condition per allocated device (again on a
    conflict, or while the claim is between two attempts)."""
    cluster.wait_until(lambda: _report(cluster, claim, condition, value), timeout=20)


def _report(cluster: Emulator, claim: str, condition: str, value: str) -> bool:
    current = cluster.get("resourceclaims", claim, "default")
    allocation = ((current or {}).get("status") or {}).get("allocation")
    if current is None or allocation is None:
        return False
    results = allocation["devices"]["results"]
    devices = [
        {
            "driver": r["driver"],
            "pool": r["pool"],
            "device": r["device"],
            "conditions": [
                {
                    "type": condition,
                    "status": value,
                    "reason": "Test",
                    "message": f"{condition} by the test",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
        for r in results
    ]
    current["status"]["devices"] = devices
    try:
        cluster.replace(current, subresource="status")
    except ApiStatusError:
        return False
    return True


def start(cluster: Emulator, name: str) -> None:
    cluster.create(resource_claim(f"{name}-gpu"))
    cluster.create(pod(name, claim=f"{name}-gpu"))
    cluster.wait_until(
        lambda: bool(claim_status(cluster, f"{name}-gpu").get("reservedFor")),
        timeout=20,
        message=f"{name}: allocated and reserved, then waiting",
    )


def test_conditions_met_then_bound(cluster: Emulator, controller: ControllerThread) -> None:
    start(cluster, "attach")
    allocation = claim_status(cluster, "attach-gpu")["allocation"]
    assert allocation["devices"]["results"][0]["bindingConditions"] == [READY]
    assert allocation.get("allocationTimestamp"), "the wait's start is recorded"
    cluster.wait_until(
        lambda: (
            (
                "BindingConditionsPending",
                f"waiting for binding conditions for device on node {NODE}",
            )
            in pod_events(cluster, "attach")
        ),
        timeout=10,
    )
    # Waiting blocks no other pod: a second one is written and waits beside it.
    start(cluster, "other")
    assert "attach" not in bound_pods(cluster), "not bound before its conditions are met"
    report(cluster, "attach-gpu", READY, "False")
    report(cluster, "attach-gpu", READY)
    cluster.wait_until(lambda: bound_pods(cluster).get("attach") == NODE, timeout=20)
    assert "other" not in bound_pods(cluster)
    report(cluster, "other-gpu", READY)
    cluster.wait_until(lambda: bound_pods(cluster).get("other") == NODE, timeout=20)
    assert check_invariants(cluster) == []


def test_a_failure_condition_rolls_back_and_requeues(
    cluster: Emulator, controller: ControllerThread
) -> None:
    start(cluster, "broken")
    first = claim_status(cluster, "broken-gpu")["allocation"]["devices"]["results"][0]["device"]
    report(cluster, "broken-gpu", FAILED)
    cluster.wait_until(
        lambda: (
            "binding of device" in ((pod_condition(cluster, "broken") or {}).get("message") or "")
        ),
        timeout=20,
        message=f"condition: {pod_condition(cluster, 'broken')}",
    )
    message = (pod_condition(cluster, "broken") or {})["message"]
    assert f"{FAILED} (reason=Test, message='{FAILED} by the test')" in message
    # Rolled back (the devices' status with the allocation) and tried again: allocated anew,
    # waiting again, never bound meanwhile.
    cluster.wait_until(
        lambda: (
            (s := claim_status(cluster, "broken-gpu")).get("reservedFor") and not s.get("devices")
        ),
        timeout=20,
    )
    assert "broken" not in bound_pods(cluster)
    assert first  # the retry may pick the same device: the attaching controller decides

    # Reported as the attaching controller does, for every allocation it sees: the failure
    # report of the first attempt may be written after the second was decided (the reporting
    # lane yields to placements), so that the pod's resourceVersion its binding carries is
    # stale; that attempt is rolled back too, and the next one waits for its own report.
    def bound_once_reported() -> bool:
        if bound_pods(cluster).get("broken") == NODE:
            return True
        if not claim_status(cluster, "broken-gpu").get("devices"):
            _report(cluster, "broken-gpu", READY, "True")
        return False

    cluster.wait_until(bound_once_reported, timeout=30)
    assert check_invariants(cluster) == []


@pytest.fixture
def impatient(cluster: Emulator) -> Iterator[ControllerThread]:
    yield from run_controller(cluster, binding_timeout_s=1.0)


def test_timed_out_then_rolled_back_and_requeued(
    cluster: Emulator, impatient: ControllerThread
) -> None:
    requests_before = len(cluster.requests_for(method="PUT", resource="resourceclaims"))
    start(cluster, "slow")
    cluster.wait_until(
        lambda: (
            "not met within 1 s" in ((pod_condition(cluster, "slow") or {}).get("message") or "")
        ),
        timeout=20,
        message=f"condition: {pod_condition(cluster, 'slow')}",
    )
    # Each attempt writes the allocation and rolls it back; the pod is tried again.
    cluster.wait_until(
        lambda: (
            len(cluster.requests_for(method="PUT", resource="resourceclaims"))
            >= requests_before + 4
        ),
        timeout=20,
    )
    assert "slow" not in bound_pods(cluster)
    cluster.wait_until(
        lambda: bool(claim_status(cluster, "slow-gpu").get("reservedFor")), timeout=20
    )
    report(cluster, "slow-gpu", READY)
    cluster.wait_until(lambda: bound_pods(cluster).get("slow") == NODE, timeout=20)
    assert check_invariants(cluster) == []

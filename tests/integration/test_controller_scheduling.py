"""The controller against the API emulator: pods with claims from templates, named claims and
legacy ``nvidia.com/gpu`` pods are placed, their claims allocated and reserved, the pods bound;
unschedulable and invalid pods are reported; everything is released after the pods go."""

from __future__ import annotations

import pytest

from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    claim_template,
    delete_all_pods,
    leftovers,
    pod,
    pod_condition,
    pod_events,
    resource_claim,
    seed_cluster,
)
from tests.unit.builders import device_class, gpu_config


@pytest.fixture
def cluster(emulator: Emulator, claim_controller: ResourceClaimController) -> Emulator:
    seed_cluster(emulator)
    return emulator


def test_pods_with_template_claims_are_bound(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(claim_template("half", memory="7500Mi"))
    names = [f"p{i}" for i in range(4)]
    for name in names:
        cluster.create(
            pod(name, template="half", annotations={"biaxial.dev/node-policy": "binpack"})
        )
    cluster.wait_until(lambda: len(bound_pods(cluster, names)) == 4, timeout=20)
    assert check_invariants(cluster) == []
    # Each placement reached the engine once, by assume; its claim write and its binding were
    # recognised when they showed up (nothing was taken out and counted again).
    assert controller.controller is not None
    engine = controller.on_loop(controller.controller.scheduler.feed.engine)
    cluster.wait_until(
        lambda: controller.on_loop(lambda: engine.stats.landed) == 2 * len(names),
        timeout=10,
        message=f"landed: {engine.stats.landed}",
    )
    delete_all_pods(cluster)
    cluster.wait_until(lambda: not leftovers(cluster), timeout=20, message=str(leftovers(cluster)))


def test_unschedulable_pod_gets_condition_and_event(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(claim_template("five", count=5))
    cluster.create(pod("big", template="five"))
    cluster.wait_until(lambda: pod_condition(cluster, "big") is not None, timeout=20)
    condition = pod_condition(cluster, "big")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert condition["message"].startswith("0/2 nodes are available: ")
    cluster.wait_until(lambda: bool(pod_events(cluster, "big")), timeout=10)
    assert pod_events(cluster, "big") == [("FailedScheduling", condition["message"])]
    assert not bound_pods(cluster)
    assert check_invariants(cluster) == []


def test_invalid_input_is_reported_and_blocks_no_one(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(resource_claim("nowhere", device_class="no-such-class"))
    cluster.create(pod("bad-class", claim="nowhere"))
    cluster.create(
        pod("bad-policy", legacy_gpus=1, annotations={"biaxial.dev/gpu-policy": "tight"})
    )
    cluster.create(pod("missing-claim", claim="does-not-exist"))
    cluster.create(pod("good", legacy_gpus=1))
    cluster.wait_until(lambda: "good" in bound_pods(cluster), timeout=20)
    for name in ("bad-class", "bad-policy", "missing-claim"):
        cluster.wait_until(lambda n=name: pod_condition(cluster, n) is not None, timeout=10)
    messages = {
        n: pod_condition(cluster, n)["message"]
        for n in ("bad-class", "bad-policy", "missing-claim")
    }  # type: ignore[index]
    assert "DeviceClass 'no-such-class' does not exist" in messages["bad-class"]
    assert "biaxial.dev/gpu-policy" in messages["bad-policy"]
    assert "tight" in messages["bad-policy"]
    assert 'resourceclaim "does-not-exist", which does not exist' in messages["missing-claim"]
    assert set(bound_pods(cluster)) == {"good"}
    assert check_invariants(cluster) == []


def test_a_gpu_config_the_node_would_refuse_is_reported_and_nothing_allocated(
    cluster: Emulator, controller: ControllerThread
) -> None:
    bogus = gpu_config("bogus")["opaque"]["parameters"]
    cluster.create(device_class("shared.gpu.biaxial.dev", config=[bogus]))
    cluster.create(resource_claim("via-class", device_class="shared.gpu.biaxial.dev"))
    own = resource_claim("via-claim", memory="1Gi")
    own["spec"]["devices"]["config"] = [gpu_config("timeslicing")]
    cluster.create(own)
    cluster.create(pod("through-class", claim="via-class"))
    cluster.create(pod("through-claim", claim="via-claim"))
    cluster.create(pod("good", legacy_gpus=1))
    cluster.wait_until(lambda: "good" in bound_pods(cluster), timeout=20)
    expected = {
        "through-class": "claim default/via-class: DeviceClass shared.gpu.biaxial.dev: "
        'spec.config[0] opaque.parameters: sharing.strategy: unknown value "bogus", '
        'expected one of "hami-core", "mps", "none"',
        "through-claim": "claim default/via-claim: spec.devices.config[0] opaque.parameters: "
        'sharing.strategy: unknown value "timeslicing", '
        'expected one of "hami-core", "mps", "none"',
    }
    for name, message in expected.items():
        cluster.wait_until(lambda n=name: pod_condition(cluster, n) is not None, timeout=10)
        condition = pod_condition(cluster, name)
        assert condition is not None
        assert (condition["status"], condition["reason"], condition["message"]) == (
            "False",
            "Unschedulable",
            message,
        )
        cluster.wait_until(lambda n=name: bool(pod_events(cluster, n)), timeout=10)
        assert pod_events(cluster, name) == [("FailedScheduling", message)]
    # Nothing was written to the refused claims: no allocation, no reservation, no finalizer.
    for claim_name in ("via-class", "via-claim"):
        stored = cluster.get("resourceclaims", claim_name, "default") or {}
        assert not (stored.get("status") or {}).get("allocation"), stored
        assert not (stored.get("status") or {}).get("reservedFor"), stored
        assert not stored["metadata"].get("finalizers"), stored
    assert set(bound_pods(cluster)) == {"good"}
    assert check_invariants(cluster) == []


def test_foreign_allocations_are_respected_and_left_alone(
    cluster: Emulator, controller: ControllerThread
) -> None:
    # Someone else (another scheduler) holds every GPU of gpu-t4.
    foreign = cluster.create(resource_claim("foreign"))
    results = [
        {"request": "gpu", "driver": "gpu.biaxial.dev", "pool": "gpu-t4", "device": f"gpu-{i}"}
        for i in range(4)
    ]
    foreign["status"] = {"allocation": {"devices": {"results": results}}}
    cluster.replace(foreign, subresource="status")
    names = [f"w{i}" for i in range(4)]
    for name in names:
        cluster.create(pod(name, legacy_gpus=1))
    cluster.wait_until(lambda: len(bound_pods(cluster, names)) == 4, timeout=20)
    assert set(bound_pods(cluster, names).values()) == {"gpu-a10g"}
    assert check_invariants(cluster) == []
    # A foreign pod bound by another scheduler and the foreign allocation released: the
    # engine follows incrementally, with no rebuild from the caches.
    assert controller.controller is not None
    scheduler = controller.controller.scheduler
    rebuilds = controller.on_loop(lambda: scheduler.feed.rebuilds)
    cluster.create(pod("other", scheduler="default-scheduler"))
    cluster.bind("other", "gpu-t4")
    cluster.update_status("resourceclaims", "foreign", {}, "default")
    cluster.create(pod("after", legacy_gpus=1))
    cluster.wait_until(lambda: bound_pods(cluster).get("after") == "gpu-t4", timeout=20)
    assert controller.on_loop(lambda: scheduler.feed.rebuilds) == rebuilds
    # A node heartbeat changes nothing scheduling reads: no rebuild either.
    node = cluster.get("nodes", "gpu-t4")
    assert node is not None
    heartbeat = {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-23T00:00:00Z"}
    cluster.update_status("nodes", "gpu-t4", {**node["status"], "conditions": [heartbeat]})
    cluster.create(pod("later", legacy_gpus=1))
    cluster.wait_until(lambda: "later" in bound_pods(cluster), timeout=20)
    assert controller.on_loop(lambda: scheduler.feed.rebuilds) == rebuilds
    controller.assert_engine_settles()
    delete_all_pods(cluster)
    cluster.wait_until(lambda: not leftovers(cluster), timeout=20)
    after = cluster.get("resourceclaims", "foreign", "default")
    assert after is not None
    assert not after["metadata"].get("finalizers")  # never touched by us


def test_freed_devices_requeue_a_waiting_pod(
    cluster: Emulator, controller: ControllerThread
) -> None:
    names = [f"f{i}" for i in range(8)]
    for name in names:
        cluster.create(pod(name, legacy_gpus=1))
    cluster.wait_until(lambda: len(bound_pods(cluster, names)) == 8, timeout=20)
    cluster.create(pod("waiting", legacy_gpus=1))
    cluster.wait_until(lambda: pod_condition(cluster, "waiting") is not None, timeout=10)
    assert "waiting" not in bound_pods(cluster)
    cluster.delete("pods", "f0", "default")
    cluster.finish_pod_deletions()
    cluster.wait_until(lambda: "waiting" in bound_pods(cluster), timeout=20)
    assert check_invariants(cluster) == []


def test_finished_pods_release_their_devices(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(resource_claim("job-claim"))
    cluster.create(pod("job", claim="job-claim"))
    cluster.wait_until(lambda: "job" in bound_pods(cluster), timeout=20)
    job = cluster.get("pods", "job", "default")
    assert job is not None
    cluster.update_status("pods", "job", {**job.get("status", {}), "phase": "Succeeded"}, "default")

    def released() -> bool:
        c = cluster.get("resourceclaims", "job-claim", "default") or {}
        return not (c.get("status") or {}).get("allocation") and not c["metadata"].get("finalizers")

    cluster.wait_until(released, timeout=20)
    assert check_invariants(cluster) == []


def test_a_bug_on_one_pod_does_not_stop_the_others(
    cluster: Emulator, controller: ControllerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    from driver.scheduling.decision import DecisionEngine

    original = DecisionEngine.decide
    calls: list[str] = []

    def decide(self: DecisionEngine, pod: dict, claims: object = (), **kw: object) -> object:
        calls.append(pod["metadata"]["name"])
        if pod["metadata"]["name"] == "boom":
            raise RuntimeError("a bug in the decision core")
        return original(self, pod, claims, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(DecisionEngine, "decide", decide)
    cluster.create(pod("boom", legacy_gpus=1))
    cluster.create(pod("fine", legacy_gpus=1))
    cluster.wait_until(lambda: "fine" in bound_pods(cluster), timeout=20)
    cluster.wait_until(lambda: calls.count("boom") >= 2, timeout=10)  # retried with backoff
    assert controller.alive
    assert "boom" not in bound_pods(cluster)
    assert check_invariants(cluster) == []


def test_the_invariant_checker_catches_violations(cluster: Emulator) -> None:
    """The checker the other tests rely on reports double allocation, exceeded capacity and
    a bound pod whose claim is not reserved for it."""
    whole = {"request": "gpu", "driver": "gpu.biaxial.dev", "pool": "gpu-t4", "device": "gpu-0"}

    def share(uid: str) -> dict[str, object]:
        memory = {"memory": "10Gi", "cores": "0"}  # two of them exceed a 15360 MiB T4
        return {**whole, "device": "gpu-1", "shareID": uid, "consumedCapacity": memory}

    results = {
        "a": whole,
        "b": whole,
        "c": share("7f6c3c1e-0000-4000-8000-000000000001"),
        "d": share("7f6c3c1e-0000-4000-8000-000000000002"),
    }
    for name, result in results.items():
        claim = cluster.create(resource_claim(name))
        claim["status"] = {"allocation": {"devices": {"results": [result]}}}
        cluster.replace(claim, subresource="status")
    cluster.create(pod("bound", claim="a"))
    cluster.bind("bound", "gpu-t4")
    problems = check_invariants(cluster)
    assert any("allocated twice" in p for p in problems)
    assert any("of memory allocated" in p for p in problems)
    assert any("not reserved for it" in p for p in problems)


def test_gated_pods_wait_for_their_gates(cluster: Emulator, controller: ControllerThread) -> None:
    gated = pod("gated", legacy_gpus=1)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    cluster.create(gated)
    cluster.create(pod("free", legacy_gpus=1))
    cluster.wait_until(lambda: "free" in bound_pods(cluster), timeout=20)
    assert "gated" not in bound_pods(cluster)
    cluster.patch(
        "pods", "gated", [{"op": "remove", "path": "/spec/schedulingGates"}], namespace="default"
    )
    cluster.wait_until(lambda: "gated" in bound_pods(cluster), timeout=20)
    assert check_invariants(cluster) == []

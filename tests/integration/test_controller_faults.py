"""The controller under API faults (409s, 5xx, dropped watches, 410 Gone) and killed between
any two commit writes (volume writes included: a PV's claimRef, a claim's selected node, all
claims bound), then restarted: afterwards every pod is bound, no device is over-allocated,
every bound pod's claims are allocated and reserved for it, its volume claims are bound to PVs
on its node and no claim's selected node is one its pod does not use, and nothing is left once
the pods are deleted."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.emulator import Emulator, ResourceClaimController, VolumeController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    claim_template,
    delete_all_pods,
    fast_settings,
    leftovers,
    pod,
    pod_claim_keys,
    seed_cluster,
    volume_problems,
)
from tests.unit.builders import pv, pvc, storage_class

STEPS = [
    "finalizer",
    "allocation",
    "bridge-create",
    "bridge-allocation",
    "bridge-link",
    "volume-binding",
    "selected-node",
    "volumes-bound",
    "binding",
]


def _created(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].pop("uid", None)
    out.pop("status", None)
    return out


def _workload(cluster: Emulator) -> list[str]:
    cluster.create(claim_template("half", memory="7500Mi"))
    names = []
    for i in range(3):
        cluster.create(pod(f"t{i}", template="half"))
        names.append(f"t{i}")
    for i in range(2):
        cluster.create(pod(f"legacy{i}", legacy_gpus=1, gpumem=5000))
        names.append(f"legacy{i}")
    # Volumes: one claim provisioned where its pod goes, one bound to a local PV.
    cluster.create(storage_class("wffc"))
    cluster.create(storage_class("local", provisioner="kubernetes.io/no-provisioner"))
    cluster.create(_created(pv("local-t4", cls="local", hostname="gpu-t4")))
    for name, cls in (("cache", "wffc"), ("dataset", "local")):
        cluster.create(_created(pvc(name, cls=cls)))
        with_volume = pod(f"mounts-{name}", template="half")
        with_volume["spec"]["volumes"] = [
            {"name": "v", "persistentVolumeClaim": {"claimName": name}}
        ]
        cluster.create(with_volume)
        names.append(f"mounts-{name}")
    return names


def _settle(cluster: Emulator, names: list[str]) -> None:
    cluster.wait_until(
        lambda: len(bound_pods(cluster, names)) == len(names),
        timeout=30,
        message=f"bound: {bound_pods(cluster, names)}",
    )
    assert check_invariants(cluster) == []
    assert volume_problems(cluster) == []
    assert bound_pods(cluster, ["mounts-dataset"]) == {"mounts-dataset": "gpu-t4"}


def _teardown(cluster: Emulator) -> None:
    delete_all_pods(cluster)
    cluster.wait_until(lambda: not leftovers(cluster), timeout=30, message=str(leftovers(cluster)))


def test_api_faults_are_survived(
    emulator: Emulator,
    claim_controller: ResourceClaimController,
    volume_controller: VolumeController,
) -> None:
    seed_cluster(emulator)
    controller = ControllerThread(emulator).start()
    try:
        emulator.wait_for_watches(5)
        emulator.fail_next_write(409, resource="resourceclaims", count=3)
        emulator.fail_next(500, verbs="create", resource="pods/binding", count=2)
        emulator.fail_next(503, verbs={"update", "patch"}, resource="resourceclaims", count=2)
        emulator.expire_next_watch(resource="resourceclaims")
        emulator.drop_watches()  # abruptly: resume from the last resourceVersion (then a 410)
        names = _workload(emulator)
        _settle(emulator, names)
        emulator.drop_watches(expire=True)  # 410 on every open watch: relist
        emulator.drop_watches(clean=True)
        _teardown(emulator)
        # once the watches delivered what the teardown caused (checked_controller's rule)
        controller.assert_engine_settles()
        assert controller.controller is not None
        stats = [i.stats for i in controller.controller.cache.informers]
        assert sum(s.relists_on_gone for s in stats) >= 1
        assert controller.alive
    finally:
        controller.stop()
    assert controller.error is None


@pytest.mark.parametrize("step", STEPS)
def test_killed_between_commit_steps_then_restarted(
    emulator: Emulator,
    claim_controller: ResourceClaimController,
    volume_controller: VolumeController,
    step: str,
) -> None:
    seed_cluster(emulator)
    first = ControllerThread(emulator, crash_at=lambda s, _k: s == step).start()
    names = _workload(emulator)
    try:
        emulator.wait_until(lambda: first.crashed_at is not None, timeout=20)
    finally:
        first.kill()
    assert first.crashed_at is not None
    assert first.crashed_at[0] == step
    assert check_invariants(emulator) == []  # even the state a kill leaves is consistent
    second = ControllerThread(emulator, fast_settings(identity="second")).start()
    try:
        _settle(emulator, names)
        second.assert_engine_settles()
        _teardown(emulator)
        # once the watches delivered what the teardown caused (checked_controller's rule)
        second.assert_engine_settles()
    finally:
        second.stop()
    assert second.error is None


def test_pods_deleted_while_the_controller_is_down_are_released_on_start(
    emulator: Emulator,
    claim_controller: ResourceClaimController,
    volume_controller: VolumeController,
) -> None:
    seed_cluster(emulator)
    first = ControllerThread(emulator).start()
    try:
        names = _workload(emulator)
        _settle(emulator, names)
    finally:
        first.kill()
    delete_all_pods(emulator)
    assert leftovers(emulator), "nothing to release: the test would prove nothing"
    second = ControllerThread(emulator, fast_settings(identity="second")).start()
    try:
        emulator.wait_until(
            lambda: not leftovers(emulator), timeout=30, message=str(leftovers(emulator))
        )
        second.assert_engine_settles()
    finally:
        second.stop()
    assert second.error is None


def test_a_killed_controllers_binding_landing_after_the_repair_is_refused(
    emulator: Emulator, claim_controller: ResourceClaimController
) -> None:
    """Upstream's rule: a pod is bound only once its claims are allocated and reserved for it,
    and an allocation is never removed while a bound pod reserves it (kube-scheduler's
    DynamicResources plugin writes both in PreBind, before the binding; the resourceclaim
    controller drops a reservation only once its pod is gone or done).

    A killed controller's binding can still be in flight: a real API server applies a request
    whose client died. Here the first controller's binding of p reaches the server and is
    held there; the controller is killed; the second releases the claim that attempt left and
    places p on the other node (the first one is cordoned); only then is the held binding
    served. It must be refused (its resourceVersion precondition; the repair wrote to the pod
    first), and the invariants hold in every state the cluster passes through."""
    seed_cluster(emulator)
    seen: list[str] = []
    emulator.observe_writes(lambda _agent, _verb, _res: seen.extend(check_invariants(emulator)))
    late = emulator.hold_next(verbs="create", resource="pods/binding")
    first = ControllerThread(emulator).start()
    try:
        emulator.create(claim_template("half", memory="7500Mi"))
        emulator.create(pod("p", template="half"))
        assert late.arrived.wait(20), "the first controller never sent its binding"
    finally:
        first.kill()
    (key,) = pod_claim_keys(emulator.get("pods", "p") or {})

    def allocated_on() -> list[str]:
        claim = emulator.get("resourceclaims", key.split("/")[1]) or {}
        selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector")
        terms = (selector or {}).get("nodeSelectorTerms") or []
        return [v for t in terms for f in t.get("matchFields") or [] for v in f["values"]]

    (node,) = allocated_on()  # the attempt's allocation, reserved for p, p unbound
    emulator.patch("nodes", node, {"spec": {"unschedulable": True}})
    second = ControllerThread(emulator, fast_settings(identity="second")).start()
    try:
        emulator.wait_until(lambda: node not in allocated_on(), timeout=20)  # released
        late.release()
        assert late.served.wait(20)
        emulator.wait_until(lambda: bound_pods(emulator, ["p"]), timeout=20)
        assert bound_pods(emulator, ["p"]) != {"p": node}
        assert check_invariants(emulator) == []
        assert seen == []
        second.assert_engine_settles()
        _teardown(emulator)
    finally:
        second.stop()
    assert second.error is None

"""The controller with pods that mount volumes, against the API emulator and its storage
stand-in (PV controller, external-provisioner, ephemeral volume controller): WaitForFirstConsumer
provisioning through ``volume.kubernetes.io/selected-node``, static PVs bound before the pod,
upstream's messages for pods that cannot be placed, provisioning failures and timeouts rolled
back and retried, and a slow provisioner that holds up no other pod."""

from __future__ import annotations

import copy
from collections.abc import Sequence
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
    pod_condition,
    pod_events,
    seed_cluster,
    volume_problems,
)
from tests.unit.builders import csi_node, pv, pvc, storage_class

JSON = dict[str, Any]
ZONE = "topology.kubernetes.io/zone"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
ZONES = {"gpu-t4": {ZONE: "zone-a"}, "gpu-a10g": {ZONE: "zone-b"}}


def created(obj: JSON) -> JSON:
    """A builder's object as a client sends it (no UID, no status)."""
    out = copy.deepcopy(obj)
    out["metadata"].pop("uid", None)
    out.pop("status", None)
    return out


def volume_pod(
    name: str,
    claims: Sequence[str] = (),
    *,
    ephemeral: Sequence[str] = (),
    template: str | None = "half",
) -> JSON:
    """A GPU pod (a claim from ``template``) mounting ``claims`` and generic ephemeral volumes
    of the WaitForFirstConsumer class."""
    out = pod(name, template=template)
    volumes: list[JSON] = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
    ]
    volumes.extend(
        {
            "name": e,
            "ephemeral": {
                "volumeClaimTemplate": {
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "wffc",
                        "resources": {"requests": {"storage": "1Gi"}},
                    }
                }
            },
        }
        for e in ephemeral
    )
    out["spec"]["volumes"] = volumes
    return out


def claim(emulator: Emulator, name: str) -> JSON:
    found = emulator.get("persistentvolumeclaims", name, "default")
    assert found is not None
    return found


def unschedulable_message(emulator: Emulator, name: str) -> str:
    emulator.wait_until(lambda: pod_condition(emulator, name) is not None, timeout=20)
    condition = pod_condition(emulator, name)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    emulator.wait_until(lambda: bool(pod_events(emulator, name)), timeout=10)
    assert pod_events(emulator, name) == [("FailedScheduling", condition["message"])]
    return str(condition["message"])


def settle(emulator: Emulator, names: Sequence[str]) -> dict[str, str]:
    emulator.wait_until(
        lambda: len(bound_pods(emulator, names)) == len(names),
        timeout=30,
        message=f"bound: {bound_pods(emulator, names)}",
    )
    assert check_invariants(emulator) == []
    assert volume_problems(emulator) == []
    return bound_pods(emulator, names)


@pytest.fixture
def cluster(
    emulator: Emulator,
    claim_controller: ResourceClaimController,
    volume_controller: VolumeController,
) -> Emulator:
    seed_cluster(emulator, labels=ZONES)
    emulator.create(claim_template("half", memory="7500Mi"))
    emulator.create(storage_class("wffc"))
    return emulator


def teardown(emulator: Emulator) -> None:
    delete_all_pods(emulator)
    emulator.wait_until(
        lambda: not leftovers(emulator), timeout=30, message=str(leftovers(emulator))
    )


# --------------------------------------------------------------------------- placed


def test_wait_for_first_consumer_claim_is_provisioned_where_the_pod_goes(
    cluster: Emulator, controller: ControllerThread, volume_controller: VolumeController
) -> None:
    cluster.create(storage_class("zonal", allowed={ZONE: ["zone-b"]}))
    cluster.create(created(pvc("data", cls="zonal")))
    cluster.create(volume_pod("trainer", ["data"]))
    placed = settle(cluster, ["trainer"])
    assert placed == {"trainer": "gpu-a10g"}  # the only node the class's topology allows
    data = claim(cluster, "data")
    assert data["metadata"]["annotations"][SELECTED_NODE] == "gpu-a10g"
    assert volume_controller.provisioned == ["default/data"]
    volume = cluster.get("persistentvolumes", data["spec"]["volumeName"])
    assert volume is not None
    term = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0] == {"key": ZONE, "operator": "In", "values": ["zone-b"]}
    # The claim was bound before the pod: the binding is the last write for the pod.
    writes = [r for r in cluster.requests if r.method in ("PATCH", "POST", "PUT")]
    annotate = next(i for i, r in enumerate(writes) if "persistentvolumeclaims/data" in r.path)
    binding = next(i for i, r in enumerate(writes) if r.path.endswith("trainer/binding"))
    assert annotate < binding
    teardown(cluster)


def test_static_local_pv_takes_the_pod_to_its_node(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(storage_class("local", provisioner="kubernetes.io/no-provisioner"))
    cluster.create(created(pv("small-a10g", cls="local", size="10Gi", hostname="gpu-a10g")))
    cluster.create(created(pv("local-a10g", cls="local", size="100Gi", hostname="gpu-a10g")))
    cluster.create(created(pv("huge-a10g", cls="local", size="500Gi", hostname="gpu-a10g")))
    cluster.create(created(pvc("dataset", cls="local", size="50Gi")))
    cluster.create(volume_pod("reader", ["dataset"]))
    # The only node with a PV that fits is gpu-a10g (binpack alone would choose gpu-t4): the
    # pod goes there, and its claim binds to the smallest PV that fits.
    assert settle(cluster, ["reader"]) == {"reader": "gpu-a10g"}
    assert claim(cluster, "dataset")["spec"]["volumeName"] == "local-a10g"
    volume = cluster.get("persistentvolumes", "local-a10g")
    assert volume is not None
    assert volume["spec"]["claimRef"]["name"] == "dataset"
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"] == "yes"
    teardown(cluster)


def test_generic_ephemeral_volume_through_its_claim(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(volume_pod("scratchy", ephemeral=["scratch"]))
    settle(cluster, ["scratchy"])
    owned = claim(cluster, "scratchy-scratch")
    assert owned["metadata"]["ownerReferences"][0]["name"] == "scratchy"
    node = bound_pods(cluster, ["scratchy"])["scratchy"]
    assert owned["metadata"]["annotations"][SELECTED_NODE] == node
    teardown(cluster)
    cluster.wait_until(
        lambda: cluster.get("persistentvolumeclaims", "scratchy-scratch", "default") is None,
        timeout=10,
    )


# --------------------------------------------------------------------------- not placed


def test_missing_claim_keeps_the_pod_pending_until_it_exists(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(volume_pod("orphan", ["nope"]))
    message = unschedulable_message(cluster, "orphan")
    assert message == '0/2 nodes are available: persistentvolumeclaim "nope" not found.'
    assert not bound_pods(cluster, ["orphan"])
    cluster.create(created(pvc("nope")))
    settle(cluster, ["orphan"])
    teardown(cluster)


def test_unbound_immediate_claim_keeps_the_pod_pending(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(
        storage_class("elsewhere", provisioner="other.csi.example.com", mode="Immediate")
    )
    cluster.create(created(pvc("later", cls="elsewhere")))
    cluster.create(volume_pod("waiter", ["later"]))
    message = unschedulable_message(cluster, "waiter")
    assert message == "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    teardown(cluster)


def test_read_write_once_pod_claim_admits_one_pod(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(created(pvc("solo", modes=("ReadWriteOncePod",))))
    cluster.create(volume_pod("first", ["solo"]))
    settle(cluster, ["first"])
    cluster.create(volume_pod("second", ["solo"]))
    message = unschedulable_message(cluster, "second")
    assert message == (
        "0/2 nodes are available: 2 node has pod using PersistentVolumeClaim with the same "
        "name and ReadWriteOncePod access mode."
    )
    assert "second" not in bound_pods(cluster)
    teardown(cluster)


def test_attach_limit_reached(cluster: Emulator, controller: ControllerThread) -> None:
    driver = "csi.test.biaxial.dev"
    for name in ("gpu-t4", "gpu-a10g"):
        cluster.create(csi_node(name, {driver: 1}))
    for name in ("a", "b", "c"):
        cluster.create(created(pvc(name)))
    cluster.create(volume_pod("p-a", ["a"]))
    cluster.create(volume_pod("p-b", ["b"]))
    placed = settle(cluster, ["p-a", "p-b"])
    assert set(placed.values()) == {"gpu-t4", "gpu-a10g"}  # one volume per node
    cluster.create(volume_pod("p-c", ["c"]))
    message = unschedulable_message(cluster, "p-c")
    assert message == "0/2 nodes are available: 2 node(s) exceed max volume count."
    teardown(cluster)


# --------------------------------------------------------------------------- failures


def test_provisioning_failure_is_rolled_back_reported_and_retried(
    cluster: Emulator, controller: ControllerThread, volume_controller: VolumeController
) -> None:
    cluster.create(created(pvc("flaky")))
    volume_controller.fail("default/flaky")  # the first provisioning attempt fails
    cluster.create(volume_pod("retry", ["flaky"]))
    settle(cluster, ["retry"])
    assert volume_controller.rescheduled == ["default/flaky"]
    failed = [m for reason, m in pod_events(cluster, "retry") if reason == "FailedScheduling"]
    prebind = 'running PreBind plugin "VolumeBinding": binding volumes: '
    assert failed == [f'{prebind}provisioning failed for PVC "flaky"']
    teardown(cluster)


def _with_a_held_claim(emulator: Emulator, volume_controller: VolumeController) -> None:
    """The cluster, a GPU template, and the claim ``slow`` the provisioner leaves alone."""
    seed_cluster(emulator, labels=ZONES)
    emulator.create(claim_template("half", memory="7500Mi"))
    emulator.create(storage_class("wffc"))
    emulator.create(created(pvc("slow")))
    volume_controller.hold("default/slow")


def test_bind_timeout_rolls_back_and_the_pod_is_retried(
    emulator: Emulator,
    claim_controller: ResourceClaimController,
    volume_controller: VolumeController,
) -> None:
    _with_a_held_claim(emulator, volume_controller)
    running = ControllerThread(emulator, fast_settings(volume_bind_timeout_s=0.5)).start()
    try:
        emulator.create(volume_pod("patient", ["slow"]))
        emulator.wait_until(lambda: pod_condition(emulator, "patient") is not None, timeout=20)
        condition = pod_condition(emulator, "patient")
        assert condition is not None
        assert condition["reason"] == "SchedulerError"
        assert condition["message"] == (
            'running PreBind plugin "VolumeBinding": binding volumes: context deadline exceeded '
            "(claims not bound after 0.5s: default/slow)"
        )
        # Rolled back: the pod's device claim holds nothing while it waits for a retry.
        emulator.wait_until(
            lambda: (
                not any(
                    (c.get("status") or {}).get("allocation")
                    for c in emulator.list("resourceclaims")
                )
            ),
            timeout=10,
        )
        assert not bound_pods(emulator, ["patient"])
        volume_controller.release("default/slow")
        settle(emulator, ["patient"])
        running.assert_engine_settles()
        teardown(emulator)
    finally:
        running.stop()
    assert running.error is None


def test_a_slow_provisioner_holds_up_no_other_pod(
    emulator: Emulator,
    claim_controller: ResourceClaimController,
    volume_controller: VolumeController,
) -> None:
    _with_a_held_claim(emulator, volume_controller)
    # One write slot: the pod waiting for its volume must not keep it.
    running = ControllerThread(emulator, fast_settings(max_concurrent_writes=1)).start()
    try:
        emulator.create(volume_pod("waiting", ["slow"]))
        emulator.wait_until(
            lambda: SELECTED_NODE in (claim(emulator, "slow")["metadata"].get("annotations") or {}),
            timeout=20,
        )
        names = [f"quick{i}" for i in range(3)]
        for name in names:
            emulator.create(pod(name, template="half"))
        emulator.wait_until(lambda: len(bound_pods(emulator, names)) == 3, timeout=20)
        assert not bound_pods(emulator, ["waiting"])
        volume_controller.release("default/slow")
        settle(emulator, ["waiting", *names])
        teardown(emulator)
    finally:
        running.stop()
    assert running.error is None

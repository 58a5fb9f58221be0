"""The rules between pods with the live controller against the API emulator: anti-affine
replicas one per node and the extra one pending with kube-scheduler's reason (condition and
event), a zone spread over three zones (pods created at once: placements in flight count), a
pod bound by another scheduler counting for ports and symmetry, and ``biaxial simulate``
placing the documented rule examples exactly as the controller does."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from biaxial.simulate.manifests import load_objects, objects_of_kind
from biaxial.simulate.simulator import build_inventory, expand_deployment, simulate
from biaxial.simulate.workloads import deployment_replicaset
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from tests.emulator import Emulator
from tests.integration.controller_env import (
    DRIVER,
    ControllerThread,
    bound_pods,
    check_invariants,
    checked_controller,
    device_classes,
    fast_settings,
    node_object,
    pod_condition,
    pod_events,
)
from tests.unit.pods import HOSTNAME, ZONE, pod

ROOT = Path(__file__).resolve().parents[2]
JSON = dict[str, Any]


def seed_zones(
    emulator: Emulator, zones: dict[str, str], controller: ControllerThread | None = None
) -> None:
    """T4 nodes (``{node: zone}``) with their slices, and the project's DeviceClasses; with a
    running ``controller``, returns once its caches hold them all (each kind is a watch stream
    of its own: a pod created next could otherwise be heard before the slices, and be
    reported short of GPUs)."""
    for name, zone in zones.items():
        body = node_object(name)
        body["metadata"]["labels"][ZONE] = zone
        created = emulator.create(body)
        emulator.update_status("nodes", name, body["status"])
        with open_backend("t4x4", node_name=name) as backend:
            gpus = backend.discover()
        for resource_slice in build_slices(
            gpus, node_name=name, driver_name=DRIVER, node_uid=created["metadata"]["uid"]
        ):
            emulator.create(resource_slice.to_api())
    for dc in device_classes():
        emulator.create(dc)
    if controller is not None:
        for kind in ("nodes", "resourceslices", "deviceclasses"):
            count = len(emulator.list(kind))
            emulator.wait_until(
                lambda kind=kind, count=count: controller.cached(kind) == count,
                timeout=20,
                message=f"the controller never held the {count} {kind}",
            )


def live(emulator: Emulator, raw: JSON) -> None:
    body = copy.deepcopy(raw)
    body["metadata"].pop("uid", None)
    emulator.create(body)


@pytest.fixture
def controller(emulator: Emulator) -> Iterator[ControllerThread]:
    with checked_controller(emulator) as running:
        yield running


def test_anti_affine_replicas_one_per_node_and_the_fourth_pending(
    emulator: Emulator, controller: ControllerThread
) -> None:
    seed_zones(emulator, {"n1": "a", "n2": "b", "n3": "c"}, controller)
    names = [f"web-{i}" for i in range(4)]
    for name in names:
        live(
            emulator, pod(name).labels(app="web").anti(HOSTNAME, app="web").gpu(gpumem=3000).json()
        )
    emulator.wait_until(lambda: len(bound_pods(emulator, names)) == 3, timeout=20)
    bound = bound_pods(emulator, names)
    assert sorted(bound.values()) == ["n1", "n2", "n3"]
    (pending,) = set(names) - set(bound)
    emulator.wait_until(lambda: pod_condition(emulator, pending) is not None, timeout=20)
    condition = pod_condition(emulator, pending)
    assert condition is not None
    message = "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "Unschedulable",
        message,
    )
    emulator.wait_until(lambda: bool(pod_events(emulator, pending)), timeout=10)
    assert ("FailedScheduling", message) in pod_events(emulator, pending)
    assert check_invariants(emulator) == []


def test_a_zone_spread_over_three_zones(emulator: Emulator, controller: ControllerThread) -> None:
    """Six replicas created at once with DoNotSchedule maxSkew 1 on the zone: two per zone,
    so each decision counted the placements still being written."""
    seed_zones(
        emulator, {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c", "c2": "c"}, controller
    )
    names = [f"s-{i}" for i in range(6)]
    for name in names:
        live(emulator, pod(name).labels(app="s").spread(ZONE, 1, app="s").gpu(gpumem=3000).json())
    emulator.wait_until(lambda: len(bound_pods(emulator, names)) == 6, timeout=30)
    zones = sorted(node[0] for node in bound_pods(emulator, names).values())
    assert zones == ["a", "a", "b", "b", "c", "c"]
    assert check_invariants(emulator) == []


def test_a_pod_bound_by_another_scheduler_counts(
    emulator: Emulator, controller: ControllerThread
) -> None:
    """Its host port and its anti-affinity keep our pods off its node."""
    seed_zones(emulator, {"n1": "a", "n2": "a"}, controller)
    theirs = (
        pod("theirs")
        .scheduler("default-scheduler")
        .labels(app="legacy")
        .anti(HOSTNAME, app="web")
        .port(8080)
        .on("n1")
    )
    live(emulator, theirs.json())
    live(emulator, pod("ported").port(8080).gpu(gpumem=3000).json())
    live(emulator, pod("web").labels(app="web").gpu(gpumem=3000).json())
    emulator.wait_until(lambda: len(bound_pods(emulator, ["ported", "web"])) == 2, timeout=20)
    assert bound_pods(emulator, ["ported", "web"]) == {"ported": "n2", "web": "n2"}
    assert check_invariants(emulator) == []


def test_a_pod_bound_elsewhere_wakes_a_pod_waiting_for_it(emulator: Emulator) -> None:
    """A pod parked for its required affinity is tried again as soon as a matching pod is bound
    by another scheduler, not at the periodic flush (kube-scheduler requeues pods rejected by
    InterPodAffinity on an assigned pod's add or label update: the plugin's EventsToRegister)."""
    # The cluster first: a controller listing it sees every node's slices before any pod (one
    # started earlier could hear the pod before the slices, and report no GPUs at all).
    seed_zones(emulator, {"a1": "a", "b1": "b"})
    running = ControllerThread(emulator, fast_settings(unschedulable_flush_s=300.0)).start()
    try:
        live(emulator, pod("api").affinity(ZONE, app="db").gpu(gpumem=3000).json())
        emulator.wait_until(lambda: pod_condition(emulator, "api") is not None, timeout=20)
        condition = pod_condition(emulator, "api")
        assert condition is not None
        assert condition["message"] == (
            "0/2 nodes are available: 2 node(s) didn't match pod affinity rules."
        )
        live(emulator, pod("db").scheduler("default-scheduler").labels(app="db").on("b1").json())
        emulator.wait_until(lambda: bool(bound_pods(emulator, ["api"])), timeout=20)
        assert bound_pods(emulator, ["api"]) == {"api": "b1"}
        running.assert_engine_settles()
    finally:
        running.stop()
    assert running.error is None


# --------------------------------------------------------------------------- simulate == live

SCENARIOS = sorted((ROOT / "examples" / "rules").glob("*.yaml"))
SCENARIOS = [p for p in SCENARIOS if p.name != "cluster.yaml"]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_simulate_places_the_rule_examples_as_the_controller_does(
    emulator: Emulator, scenario: Path
) -> None:
    """Pods are created in the simulator's order, each once the previous one is bound or
    reported unschedulable; Deployments' pods name their ReplicaSet, which the cluster shows
    (so default spreading sees the same selector on both sides)."""
    objects = load_objects([str(ROOT / "examples" / "rules" / "cluster.yaml"), str(scenario)])
    classes = device_classes()
    simulated = simulate(objects, default_classes=classes)
    expected_bound = {p.pod.removeprefix("default/"): p.node for p in simulated.placements}
    expected_pending = {f.pod.removeprefix("default/"): f.reason for f in simulated.unschedulable}

    nodes, slices = build_inventory(objects_of_kind(objects, "Cluster")[0])
    for node in nodes:
        meta = {k: v for k, v in node.raw["metadata"].items() if k != "uid"}
        emulator.create({**node.raw, "metadata": meta})
        emulator.update_status("nodes", node.node.name, node.raw["status"])
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in emulator.list("nodes")}
    for resource_slice in slices:
        body = resource_slice.to_api()
        for owner in body["metadata"].get("ownerReferences") or []:
            owner["uid"] = uids[owner["name"]]
        emulator.create(body)
    for dc in classes:
        emulator.create(dc)

    pods: list[JSON] = list(objects_of_kind(objects, "Pod"))
    for deployment in objects_of_kind(objects, "Deployment"):
        rs_name, rs_selector = deployment_replicaset(deployment)
        template = copy.deepcopy(deployment["spec"]["template"])
        template["metadata"]["labels"].update(rs_selector["matchLabels"])
        replica_set = emulator.create(
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": rs_name, "namespace": "default"},
                "spec": {"replicas": 0, "selector": rs_selector, "template": template},
            }
        )
        for replica in expand_deployment(deployment):
            replica["metadata"]["ownerReferences"][0]["uid"] = replica_set["metadata"]["uid"]
            pods.append(replica)

    controller = ControllerThread(emulator).start()
    try:
        for raw in pods:
            live(emulator, raw)
            name = raw["metadata"]["name"]
            emulator.wait_until(
                lambda n=name: (
                    bool(bound_pods(emulator, [n])) or pod_condition(emulator, n) is not None
                ),
                timeout=20,
            )
        controller.assert_engine_settles()
    finally:
        controller.stop()
    assert controller.error is None
    assert bound_pods(emulator) == expected_bound
    pending = {
        name: (pod_condition(emulator, name) or {}).get("message") for name in expected_pending
    }
    assert pending == expected_pending
    assert check_invariants(emulator) == []

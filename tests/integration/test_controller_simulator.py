"""The live controller and ``biaxial simulate`` give the same placements for the same inputs:
the four two-axis patterns on the reference cluster, and a HAMi-style legacy deployment.

Both use the same decision core; here the controller runs against the API emulator seeded with
the simulator's own inventory (nodes and the slices the real slice builder publishes), and the
pods are created in the simulator's order, each once the previous one is bound (the simulator
places pods in input order, one decision after the other). With volumes too: claims, PVs,
classes and the inventory's attach limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from biaxial.simulate.manifests import load_objects, objects_of_kind
from biaxial.simulate.simulator import build_inventory, expand_deployment, simulate
from tests.emulator import Emulator, VolumeController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    device_classes,
    volume_problems,
)
from tests.unit.builders import CSI_DRIVER, pv, pvc, storage_class, volume_pod

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = [
    *sorted((ROOT / "examples" / "four-patterns").glob("*.yaml")),
    ROOT / "examples" / "hami" / "vllm-deployment.yaml",
]


def _created(obj: dict) -> dict:
    out = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}
    out.pop("status", None)
    return out


def _seed_inventory(cluster: Emulator, inventory: dict) -> None:
    """The simulator's inventory as the API holds it: Nodes (with status), their CSINodes
    (attach limits) and the slices the real slice builder publishes."""
    nodes, slices = build_inventory(inventory)
    for node in nodes:
        cluster.create(
            {**node.raw, "metadata": {k: v for k, v in node.raw["metadata"].items() if k != "uid"}}
        )
        cluster.update_status("nodes", node.node.name, node.raw["status"])
        if node.csi_node is not None:
            cluster.create(node.csi_node)
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in cluster.list("nodes")}
    for resource_slice in slices:
        body = resource_slice.to_api()
        for owner in body["metadata"].get("ownerReferences") or []:
            owner["uid"] = uids[owner["name"]]
        cluster.create(body)


def _scheduled(cluster: Emulator, name: str) -> dict | None:
    """The pod's PodScheduled condition, once it has one."""
    pod = cluster.get("pods", name, "default") or {}
    return next(
        (
            c
            for c in (pod.get("status") or {}).get("conditions") or ()
            if c["type"] == "PodScheduled"
        ),
        None,
    )


def _live_devices(cluster: Emulator, pod: dict) -> list[tuple[str, str]]:
    namespace = pod["metadata"]["namespace"]
    ext = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    names = [ext["resourceClaimName"]] if ext.get("resourceClaimName") else []
    generated = {
        s["name"]: s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names.extend(
        ref.get("resourceClaimName") or generated[ref["name"]]
        for ref in pod["spec"].get("resourceClaims") or []
    )
    out = []
    for name in names:
        claim = cluster.get("resourceclaims", name, namespace)
        assert claim is not None
        out.extend(
            (r["device"], (r.get("consumedCapacity") or {}).get("memory", ""))
            for r in claim["status"]["allocation"]["devices"]["results"]
        )
    return sorted(out)


@pytest.mark.parametrize("burst", [False, True], ids=["one-by-one", "burst"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_live_controller_matches_the_simulator(
    emulator: Emulator, scenario: Path, burst: bool
) -> None:
    """One by one: each pod is created once the previous is bound. Burst: all at once, so
    later decisions must see the earlier ones while their writes are still in flight."""
    objects = load_objects([str(ROOT / "examples" / "reference-cluster.yaml"), str(scenario)])
    classes = device_classes()
    simulated = simulate(objects, default_classes=classes)
    assert not simulated.unschedulable
    expected = {
        p.pod: (
            p.node,
            sorted(
                (d["device"], d.get("consumedCapacity", {}).get("memory", "")) for d in p.devices
            ),
        )
        for p in simulated.placements
    }

    _seed_inventory(emulator, objects_of_kind(objects, "Cluster")[0])
    for dc in classes:
        emulator.create(dc)

    pods = [p for d in objects_of_kind(objects, "Deployment") for p in expand_deployment(d)]
    pods += objects_of_kind(objects, "Pod")
    controller = ControllerThread(emulator).start()
    try:
        for template in pods:
            # As HAMi's webhook would, the pods are handed to our scheduler.
            pod = {
                **template,
                "metadata": {
                    k: v for k, v in template["metadata"].items() if k != "ownerReferences"
                },
                "spec": {"schedulerName": "biaxial", **template["spec"]},
            }
            emulator.create(pod)
            if burst:
                continue
            name = pod["metadata"]["name"]
            emulator.wait_until(
                lambda n=name: bool(
                    (emulator.get("pods", n, "default") or {}).get("spec", {}).get("nodeName")
                ),
                timeout=20,
            )
        emulator.wait_until(
            lambda: all(p["spec"].get("nodeName") for p in emulator.list("pods")), timeout=20
        )
    finally:
        controller.stop()
    live = {}
    for pod in emulator.list("pods"):
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        live[key] = (pod["spec"]["nodeName"], _live_devices(emulator, pod))
    assert live == expected
    assert check_invariants(emulator) == []


def test_live_controller_matches_the_simulator_with_volumes(
    emulator: Emulator, volume_controller: VolumeController
) -> None:
    """The volume rules decide alike in both: a zonal WaitForFirstConsumer class, a local PV,
    claims the class may provision anywhere and an attach limit from the inventory (the last
    pod finds gpu-b's GPUs taken and gpu-a at its limit); the emulator's provisioner stands in
    for the real one where the simulator assumes success."""
    zone = "topology.kubernetes.io/zone"
    inventory: dict = {
        "apiVersion": "biaxial.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [
            {
                "name": "gpu-a",
                "gpus": "t4x4",
                "labels": {zone: "a"},
                "attachLimits": {CSI_DRIVER: 1},
            },
            {"name": "gpu-b", "gpus": "a10gx4", "labels": {zone: "b"}},
        ],
    }
    volumes = [
        storage_class("zonal", allowed={zone: ["b"]}),
        storage_class("any"),
        storage_class("local", provisioner="kubernetes.io/no-provisioner"),
        _created(pv("disk-a", cls="local", hostname="gpu-a")),
        *(
            _created(pvc(name, cls=cls))
            for name, cls in (
                ("cache", "zonal"),
                ("dataset", "local"),
                ("s1", "any"),
                ("s2", "any"),
                ("s3", "any"),
            )
        ),
    ]
    pods = []
    for name, claim in (
        ("p-cache", "cache"),
        ("p-cache-2", "cache"),
        ("p-dataset", "dataset"),
        ("p-s1", "s1"),
        ("p-s2", "s2"),
        ("p-s3", "s3"),
    ):
        pod = volume_pod(name, [claim])
        del pod["metadata"]["uid"]
        pod["spec"]["schedulerName"] = "biaxial"
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
        pods.append(pod)
    classes = device_classes()
    simulated = simulate([inventory, *volumes, *pods], default_classes=classes)
    expected = {p.pod.split("/")[1]: p.node for p in simulated.placements}
    assert expected["p-cache"] == expected["p-cache-2"] == "gpu-b"
    assert expected["p-dataset"] == "gpu-a"
    refused = {f.pod.split("/")[1]: f.reason for f in simulated.unschedulable}
    assert list(refused) == ["p-s3"]
    assert "1 node(s) exceed max volume count" in refused["p-s3"]

    _seed_inventory(emulator, inventory)
    for obj in [*classes, *volumes]:
        emulator.create(obj)
    controller = ControllerThread(emulator).start()
    try:
        for pod in pods:
            emulator.create(pod)
            name = pod["metadata"]["name"]
            if name in refused:
                emulator.wait_until(lambda n=name: _scheduled(emulator, n) is not None, timeout=20)
            else:
                emulator.wait_until(lambda n=name: n in bound_pods(emulator), timeout=20)
    finally:
        controller.stop()
    assert bound_pods(emulator) == expected
    condition = _scheduled(emulator, "p-s3")
    assert condition is not None
    assert (condition["reason"], condition["message"]) == ("Unschedulable", refused["p-s3"])
    assert check_invariants(emulator) == []
    assert volume_problems(emulator) == []

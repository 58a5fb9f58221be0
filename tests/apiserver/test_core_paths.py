"""biaxial's core paths on the real control plane (issue 22): the controller and the kubelet
plugin run as the chart runs them, each under its own ServiceAccount token and nothing but the
chart's RBAC; kube-controller-manager's resourceclaim, garbage-collector and PV-binder
controllers do their real work; kwok plays the kubelet's pod lifecycle and the fake kubelet
calls the plugin's Prepare/Unprepare as the kubelet's DRA manager would.

One plugin (node ``core-a``, 4 fake T4s) serves the module; each test starts its own
controller and leaves no pod or allocation behind.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver.components import (
    DRIVER,
    FINALIZER,
    RESOURCE,
    ControllerProcess,
    claims_path,
    create,
    delete,
    ensure_kwok,
    generated_claim,
    get,
    gpu_node,
    items,
    plugin_process,
    pod_path,
    sa_user,
    wait_for,
    writers,
)
from tests.apiserver.conftest import ChartInstall
from tests.cluster.controlplane import ControlPlane
from tests.integration.controller_env import claim_template, pod
from tests.integration.fake_kubelet import FakeKubelet, PluginProcess, scratch_dir

JSON = dict[str, Any]
NODE = "core-a"
NS = "core"
KIND = "k8s.gpu.biaxial.dev/gpu"


@dataclass
class Core:
    install: ChartInstall
    plugin: PluginProcess
    kubelet: FakeKubelet
    root: Path

    @property
    def plane(self) -> ControlPlane:
        return self.install.plane


@pytest.fixture(scope="module")
def core(chart_install: ChartInstall) -> Iterator[Core]:
    plane = chart_install.plane
    ensure_kwok(plane)
    gpu_node(plane, NODE)
    if get(plane, f"/api/v1/namespaces/{NS}") is None:
        create(plane, "/api/v1/namespaces", {"metadata": {"name": NS}})
    with scratch_dir("bxc") as root:
        plugin = plugin_process(chart_install, root, NODE).start()
        try:
            wait_for(lambda: node_slices(plane), what="the plugin's slices")
            with FakeKubelet(plugin.registration_socket) as kubelet:
                kubelet.notify(registered=True)
                yield Core(chart_install, plugin, kubelet, root)
        finally:
            code = plugin.stop()
            assert code == 0, plugin.log()


@pytest.fixture
def controller(core: Core, request: pytest.FixtureRequest) -> Iterator[ControllerProcess]:
    """One controller for the test (leading its Lease); afterwards every pod of the namespace
    is deleted and every claim must be released, then it stops cleanly."""
    running = ControllerProcess(core.install, core.root, f"ctl-{request.node.name[5:30]}")
    running.start()
    try:
        wait_for(running.leading, what="leadership")
        yield running
        clean_up(core.plane)
    finally:
        code = running.stop()
        print(running.log()[-20000:])  # shown when the test failed
        print(core.plugin.log()[-5000:])
    log = running.log()
    assert code == 0, log
    assert "Traceback" not in log, log


def clean_up(plane: ControlPlane) -> None:
    for p in items(plane, pod_path(NS)):
        delete(plane, pod_path(NS, p["metadata"]["name"]))
    wait_for(lambda: not items(plane, pod_path(NS)), what="every pod gone")
    wait_for(lambda: not allocated(plane), timeout=30, what="every claim released")


def allocated(plane: ControlPlane) -> list[str]:
    return [
        c["metadata"]["name"]
        for c in items(plane, claims_path(NS))
        if (c.get("status") or {}).get("allocation")
    ]


def node_slices(plane: ControlPlane) -> list[JSON]:
    return [
        s for s in items(plane, f"{RESOURCE}/resourceslices") if s["spec"].get("nodeName") == NODE
    ]


def device(plane: ControlPlane, name: str) -> JSON:
    """A device as the plugin published it."""
    for s in node_slices(plane):
        for d in s["spec"].get("devices") or []:
            if d["name"] == name:
                return dict(d)
    raise AssertionError(f"device {name} not published")


def pinned(body: JSON) -> JSON:
    """The pod on ``core-a`` only (other tests of the session leave slices of other nodes)."""
    body["metadata"]["namespace"] = NS
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    return body


def running_pod(plane: ControlPlane, name: str, timeout: float = 30.0) -> JSON:
    def check() -> JSON | None:
        p = get(plane, pod_path(NS, name)) or {}
        return p if (p.get("status") or {}).get("phase") == "Running" else None

    return wait_for(check, timeout, what=f"pod {name} running")


def claim(plane: ControlPlane, name: str) -> JSON:
    stored = get(plane, claims_path(NS, name))
    assert stored is not None, name
    return stored


def claim_ref(stored: JSON) -> tuple[str, str, str]:
    meta = stored["metadata"]
    return (meta["namespace"], meta["uid"], meta["name"])


# --------------------------------------------------------------------------- 1. whole GPU


def test_whole_gpu_by_template(core: Core, controller: ControllerProcess) -> None:
    plane = core.plane
    create(
        plane,
        f"{RESOURCE}/namespaces/{NS}/resourceclaimtemplates",
        claim_template("whole", namespace=NS),
    )
    created = create(plane, pod_path(NS), pinned(pod("whole", template="whole")))
    name = wait_for(lambda: generated_claim(plane, NS, "whole"), what="the template's claim")
    stored = running_pod(plane, "whole")
    assert stored["spec"]["nodeName"] == NODE

    c = claim(plane, name)
    owner = c["metadata"]["ownerReferences"]
    assert owner == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "whole",
            "uid": created["metadata"]["uid"],
            "controller": True,
        }
    ], "kube-controller-manager 1.37 sets no blockOwnerDeletion (the emulator does)"
    assert c["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    assert FINALIZER in c["metadata"]["finalizers"]
    (result,) = c["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (DRIVER, NODE, "gpu")
    # the published GPUs allow shares: a whole GPU is one allocation of all of its memory
    assert uuid.UUID(result["shareID"])
    memory = device(plane, result["device"])["capacity"]["memory"]["value"]
    assert result["consumedCapacity"]["memory"] == memory
    terms = c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert NODE in json.dumps(terms)
    assert c["status"]["reservedFor"] == [
        {"resource": "pods", "name": "whole", "uid": created["metadata"]["uid"]}
    ]
    # the real resourceclaim controller made it; biaxial's controller allocated and bound
    managers = {(f["manager"], f["operation"]) for f in c["metadata"]["managedFields"]}
    assert ("kube-controller-manager", "Update") in managers, managers
    who = writers(plane, "resourceclaims", name, NS)
    controller_user = sa_user(core.install, "controller")
    assert (controller_user, "update", "status") in who or (
        controller_user,
        "patch",
        "status",
    ) in who
    assert (controller_user, "create", "binding") in writers(plane, "pods", "whole", NS)

    out = core.kubelet.dra("v1").prepare([claim_ref(c)])
    prepared = out[c["metadata"]["uid"]]
    assert prepared.error == ""
    (dev,) = prepared.devices
    assert (dev.pool_name, dev.device_name) == (NODE, result["device"])
    spec_file = core.plugin.cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{c['metadata']['uid']}.json"
    spec = json.loads(spec_file.read_text())
    assert spec["kind"] == KIND
    assert [d["name"] for d in spec["devices"]] == [f"{c['metadata']['uid']}-{result['device']}"]
    assert core.kubelet.dra("v1").unprepare([claim_ref(c)]) == {c["metadata"]["uid"]: ""}
    assert not spec_file.exists()

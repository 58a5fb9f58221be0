"""biaxial's core paths on the real control plane (issue 22): the controller and the kubelet
plugin run as the chart runs them, each under its own ServiceAccount token and nothing but the
chart's RBAC; kube-controller-manager's resourceclaim, garbage-collector and PV-binder
controllers do their real work; kwok plays the kubelet's pod lifecycle and the fake kubelet
calls the plugin's Prepare/Unprepare as the kubelet's DRA manager would.

One plugin (node ``core-a``, 4 fake T4s) serves the module; each test starts its own
controller and leaves no pod or allocation behind.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
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
    merge_patch,
    plugin_process,
    pod_path,
    sa_user,
    writers,
)
from tests.apiserver.conftest import ChartInstall
from tests.cluster.controlplane import ControlPlane
from tests.integration.controller_env import claim_template, pod, resource_claim
from tests.integration.fake_kubelet import FakeKubelet, PluginProcess, scratch_dir, wait
from tests.unit.builders import pv, pvc, storage_class

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
            wait(lambda: node_slices(plane), what="the plugin's slices")
            with FakeKubelet(plugin.registration_socket) as kubelet:
                kubelet.notify(registered=True)
                yield Core(chart_install, plugin, kubelet, root)
        finally:
            code = plugin.stop()
            assert code == 0, plugin.log()


@contextlib.contextmanager
def running_controller(core: Core, identity: str) -> Iterator[ControllerProcess]:
    """A controller process for the block; it must exit 0 on SIGTERM, without a traceback."""
    running = ControllerProcess(core.install, core.root, identity).start()
    try:
        yield running
    finally:
        code = running.stop()
        print(running.log()[-20000:])  # shown when the test failed
    log = running.log()
    assert code == 0, log
    assert "Traceback" not in log, log


@pytest.fixture
def controller(core: Core, request: pytest.FixtureRequest) -> Iterator[ControllerProcess]:
    """One controller for the test (leading the chart's Lease); afterwards every pod of the
    namespace is deleted and every claim must be released, then it stops cleanly."""
    with running_controller(core, f"ctl-{request.node.name[5:30]}") as running:
        wait(running.leading, what="leadership")
        yield running
        clean_up(core.plane)


def clean_up(plane: ControlPlane) -> None:
    for p in items(plane, pod_path(NS)):
        delete(plane, pod_path(NS, p["metadata"]["name"]))
    wait(lambda: not items(plane, pod_path(NS)), what="every pod gone")
    wait(lambda: not allocated(plane), timeout_s=30, what="every claim released")


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


def pinned(body: JSON, node: str = NODE) -> JSON:
    """The pod in the test namespace, on ``node`` only (other tests of the session leave
    slices of other nodes)."""
    body["metadata"]["namespace"] = NS
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def running_pod(plane: ControlPlane, name: str, timeout: float = 30.0) -> JSON:
    def check() -> JSON | None:
        p = get(plane, pod_path(NS, name)) or {}
        return p if (p.get("status") or {}).get("phase") == "Running" else None

    return wait(check, timeout, what=f"pod {name} running")


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
    name = wait(lambda: generated_claim(plane, NS, "whole"), what="the template's claim")
    stored = running_pod(plane, "whole")
    assert stored["spec"]["nodeName"] == NODE

    c = claim(plane, name)
    owner = c["metadata"]["ownerReferences"]
    expected = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "whole",
        "uid": created["metadata"]["uid"],
        "controller": True,
    }
    if plane.release.minor == "1.34":  # measured: v1.34.4 sets it, v1.37.2 no longer does
        expected["blockOwnerDeletion"] = True
    assert owner == [expected]
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


def template(name: str, **kwargs: Any) -> JSON:
    return claim_template(name, namespace=NS, **kwargs)


def templates_path() -> str:
    return f"{RESOURCE}/namespaces/{NS}/resourceclaimtemplates"


def allocation_of(plane: ControlPlane, pod_name: str) -> tuple[JSON, JSON]:
    """The pod's template claim once the pod runs, and the claim's one device result."""
    running_pod(plane, pod_name)
    name = generated_claim(plane, NS, pod_name)
    assert name is not None
    c = claim(plane, name)
    (result,) = c["status"]["allocation"]["devices"]["results"]
    return c, result


# --------------------------------------------------------------------------- 2. a share


def test_share_consumed_capacity_as_the_server_stores_it(
    core: Core, controller: ControllerProcess
) -> None:
    plane = core.plane
    create(plane, templates_path(), template("quarter", memory="4Gi"))
    for name in ("share-a", "share-b"):
        create(plane, pod_path(NS), pinned(pod(name, template="quarter")))
    (claim_a, a), (claim_b, b) = (allocation_of(plane, n) for n in ("share-a", "share-b"))
    # binpack puts both on one GPU; each allocation its own shareID and exactly its request
    assert a["device"] == b["device"]
    assert a["shareID"] != b["shareID"]
    for result in (a, b):
        assert uuid.UUID(result["shareID"])
        assert result["consumedCapacity"] == {"cores": "0", "memory": "4Gi", "shares": "1"}
    dra = core.kubelet.dra("v1")
    out = dra.prepare([claim_ref(claim_a), claim_ref(claim_b)])
    for c, result in ((claim_a, a), (claim_b, b)):
        prepared = out[c["metadata"]["uid"]]
        assert prepared.error == ""
        (dev,) = prepared.devices
        assert dev.device_name == result["device"]
        assert dev.share_id == result["shareID"]
    assert dra.unprepare([claim_ref(claim_a), claim_ref(claim_b)]) == {
        claim_a["metadata"]["uid"]: "",
        claim_b["metadata"]["uid"]: "",
    }


# --------------------------------------------------------------------------- 3. bridge pod


def test_bridge_pod_by_extended_resource(core: Core, controller: ControllerProcess) -> None:
    """``nvidia.com/gpu: 1`` and no claim: the class's ``extendedResourceName`` maps it to a
    special claim (KEP-5004), which the real server stores and the plugin prepares."""
    plane = core.plane
    created = create(plane, pod_path(NS), pinned(pod("bridge", legacy_gpus=1)))
    stored = running_pod(plane, "bridge")
    ext = stored["status"]["extendedResourceClaimStatus"]
    assert ext["requestMappings"] == [
        {
            "containerName": "main",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-0-request-0",
        }
    ]
    c = claim(plane, ext["resourceClaimName"])
    assert c["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    (owner,) = c["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "Pod",
        created["metadata"]["uid"],
        True,
    )
    (request,) = c["spec"]["devices"]["requests"]
    assert request["name"] == "container-0-request-0"
    assert request["exactly"]["deviceClassName"] == DRIVER
    (result,) = c["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["request"]) == (NODE, "container-0-request-0")
    assert c["status"]["reservedFor"][0]["uid"] == created["metadata"]["uid"]
    out = core.kubelet.dra("v1").prepare([claim_ref(c)])
    prepared = out[c["metadata"]["uid"]]
    assert prepared.error == ""
    assert [list(d.request_names) for d in prepared.devices] == [["container-0-request-0"]]
    assert core.kubelet.dra("v1").unprepare([claim_ref(c)]) == {c["metadata"]["uid"]: ""}


# --------------------------------------------------------------------------- 4. volumes


def test_wait_for_first_consumer_volume_bound_by_the_pv_controller(
    core: Core, controller: ControllerProcess
) -> None:
    plane = core.plane
    plane.apply([storage_class("core-local", provisioner="kubernetes.io/no-provisioner")])
    local = pv("core-data", cls="core-local", size="10Gi", hostname=NODE, source=LOCAL)
    plane.apply([created_as_client(local)])
    claim_body = created_as_client(pvc("data", cls="core-local", size="5Gi", namespace=NS))
    create(plane, f"/api/v1/namespaces/{NS}/persistentvolumeclaims", claim_body)
    create(plane, templates_path(), template("vol-gpu"))
    body = pinned(pod("reader", template="vol-gpu"))
    body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    try:
        create(plane, pod_path(NS), body)
        assert running_pod(plane, "reader")["spec"]["nodeName"] == NODE
        bound = wait(
            lambda: (pvc_of(plane, "data").get("status") or {}).get("phase") == "Bound",
            what="the claim bound",
        )
        assert bound
        stored = pvc_of(plane, "data")
        assert stored["spec"]["volumeName"] == "core-data"
        annotations = stored["metadata"]["annotations"]
        assert annotations["pv.kubernetes.io/bind-completed"] == "yes"
        volume = get(plane, "/api/v1/persistentvolumes/core-data")
        assert volume is not None
        assert volume["spec"]["claimRef"]["name"] == "data"
        assert volume["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"] == "yes"
    finally:
        clean_up(plane)
        delete(plane, f"/api/v1/namespaces/{NS}/persistentvolumeclaims/data")
        delete(plane, "/api/v1/persistentvolumes/core-data")


LOCAL: Final = {"local": {"path": "/mnt/core-data"}}


def created_as_client(obj: JSON) -> JSON:
    """A builder's object as a client sends it (no UID, no status)."""
    out = copy.deepcopy(obj)
    out["metadata"].pop("uid", None)
    out.pop("status", None)
    return out


def pvc_of(plane: ControlPlane, name: str) -> JSON:
    return get(plane, f"/api/v1/namespaces/{NS}/persistentvolumeclaims/{name}") or {}


# --------------------------------------------------------------------------- 5. preemption


def test_preemption_spares_the_budget_protected_pods(
    core: Core, controller: ControllerProcess
) -> None:
    """Four priority-0 pods fill the node's four GPUs, three of them under a
    PodDisruptionBudget the real disruption controller keeps; a pod of a higher
    PriorityClass (spec.priority set by the Priority admission plugin) preempts exactly the
    unprotected one, and binds once kwok has finished the victim's graceful deletion."""
    plane = core.plane
    plane.apply([priority_class("core-low", 0), priority_class("core-urgent", 1_000_000)])
    low = {"a-web": "web", "z-db-0": "db", "z-db-1": "db", "z-db-2": "db"}
    for name, app in low.items():
        body = pinned(pod(name, legacy_gpus=1))
        body["metadata"]["labels"] = {"app": app}
        body["spec"]["priorityClassName"] = "core-low"
        create(plane, pod_path(NS), body)
    for name in low:
        running_pod(plane, name)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": NS},
        "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "db"}}},
    }
    create(plane, f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", budget)
    wait(
        lambda: budget_status(plane).get("currentHealthy") == 3,
        what="the disruption controller's budget status",
    )
    assert budget_status(plane)["disruptionsAllowed"] == 0
    urgent = pinned(pod("urgent", legacy_gpus=1))
    urgent["spec"]["priorityClassName"] = "core-urgent"
    stored = create(plane, pod_path(NS), urgent)
    assert stored["spec"]["priority"] == 1_000_000, "the Priority admission plugin resolves it"
    assert running_pod(plane, "urgent")["spec"]["nodeName"] == NODE
    remaining = {p["metadata"]["name"] for p in items(plane, pod_path(NS))}
    assert remaining == {"urgent", "z-db-0", "z-db-1", "z-db-2"}
    audit = writers(plane, "pods", "a-web", NS)
    controller_user = sa_user(core.install, "controller")
    assert (controller_user, "delete", "") in audit
    assert (controller_user, "patch", "status") in audit, "DisruptionTarget, before the delete"


def priority_class(name: str, value: int) -> JSON:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def budget_status(plane: ControlPlane) -> JSON:
    stored = get(plane, f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/db") or {}
    return dict(stored.get("status") or {})


# --------------------------------------------------------------------------- 6. binding conditions

BC_NODE: Final = "core-bc"
READY: Final = "Attached"


@contextlib.contextmanager
def attachable_gpus(plane: ControlPlane) -> Iterator[None]:
    """Node ``core-bc`` with 4 fake T4s that must be attached first: each device carries
    ``bindingConditions`` (and a failure condition); the test plays the attaching driver.
    Pods and claims are released and the slice removed afterwards."""
    node = gpu_node(plane, BC_NODE)
    with open_backend("t4x4", node_name=BC_NODE) as backend:
        gpus = backend.discover()
    (published,) = build_slices(
        gpus, node_name=BC_NODE, driver_name=DRIVER, node_uid=node["metadata"]["uid"]
    )
    body = published.to_api()
    for dev in body["spec"]["devices"]:
        dev["bindingConditions"] = [READY]
        dev["bindingFailureConditions"] = ["AttachFailed"]
    stored_slice = create(plane, f"{RESOURCE}/resourceslices", body)
    try:
        yield
    finally:
        clean_up(plane)
        delete(plane, f"{RESOURCE}/resourceslices/{stored_slice['metadata']['name']}")


def test_binding_conditions_hold_the_pod_until_the_driver_reports(
    core: Core, controller: ControllerProcess
) -> None:
    """Devices that must be attached first (``bindingConditions``): the claim is allocated
    and reserved, the pod waits unbound; once the test, as the attaching driver, reports the
    condition True in the claim's ``status.devices``, the pod is bound."""
    plane = core.plane
    with attachable_gpus(plane):
        create(plane, claims_path(NS), resource_claim("attach-gpu", namespace=NS))
        create(plane, pod_path(NS), pinned(pod("attach", claim="attach-gpu"), BC_NODE))
        result = reserved_unattached(plane, "attach-gpu")
        assert not (get(plane, pod_path(NS, "attach")) or {})["spec"].get("nodeName")
        report_attached(plane, "attach-gpu", result)
        assert running_pod(plane, "attach")["spec"]["nodeName"] == BC_NODE


def test_an_attached_claim_shared_by_two_pods(core: Core, controller: ControllerProcess) -> None:
    """A claim with ``bindingConditions`` referenced by two pods: the second is reserved on
    the allocated claim and bound (its conditions already met), one is unreserved when
    deleted, and the claim is deallocated when both are gone: status writes that keep, or
    clear, an allocation with opaque config the real server compares byte for byte."""
    plane = core.plane
    with attachable_gpus(plane):
        create(plane, claims_path(NS), resource_claim("attach-shared", namespace=NS))
        create(plane, pod_path(NS), pinned(pod("attach-1", claim="attach-shared"), BC_NODE))
        report_attached(plane, "attach-shared", reserved_unattached(plane, "attach-shared"))
        uids = [running_pod(plane, "attach-1")["metadata"]["uid"]]
        allocation = claim(plane, "attach-shared")["status"]["allocation"]
        assert allocation["devices"]["config"], "opaque config from the class"
        create(plane, pod_path(NS), pinned(pod("attach-2", claim="attach-shared"), BC_NODE))
        uids.append(running_pod(plane, "attach-2")["metadata"]["uid"])
        shared = claim(plane, "attach-shared")["status"]
        assert sorted(r["uid"] for r in shared["reservedFor"]) == sorted(uids)
        assert shared["allocation"] == allocation
        delete(plane, pod_path(NS, "attach-1"))
        wait(
            lambda: reserved_for(plane, "attach-shared") == uids[1:],
            what="reserved for the second alone",
        )
        assert claim(plane, "attach-shared")["status"]["allocation"] == allocation
        delete(plane, pod_path(NS, "attach-2"))
        wait(
            lambda: not (claim(plane, "attach-shared").get("status") or {}).get("allocation"),
            what="deallocated",
        )
        assert not claim(plane, "attach-shared")["status"].get("devices")
        delete(plane, claims_path(NS, "attach-shared"))


def test_deleting_an_attached_claim(core: Core, controller: ControllerProcess) -> None:
    """A claim with ``bindingConditions``, attached and in use, deleted: it stays (the
    controller's finalizer) while its pod runs; once the pod is gone the controller
    unreserves and deallocates it and removes the finalizer, and the claim is gone."""
    plane = core.plane
    with attachable_gpus(plane):
        create(plane, claims_path(NS), resource_claim("attach-gone", namespace=NS))
        create(plane, pod_path(NS), pinned(pod("attach-user", claim="attach-gone"), BC_NODE))
        report_attached(plane, "attach-gone", reserved_unattached(plane, "attach-gone"))
        running_pod(plane, "attach-user")
        delete(plane, claims_path(NS, "attach-gone"))
        held = claim(plane, "attach-gone")
        assert held["metadata"].get("deletionTimestamp")
        assert held["status"]["allocation"]
        delete(plane, pod_path(NS, "attach-user"))
        wait(lambda: get(plane, claims_path(NS, "attach-gone")) is None, what="the claim gone")


def reserved_unattached(plane: ControlPlane, name: str) -> JSON:
    """Wait until the claim is allocated and reserved; its one result, which the real server
    keeps with its binding conditions, not yet met."""
    wait(
        lambda: (claim(plane, name).get("status") or {}).get("reservedFor"),
        what="allocated and reserved",
    )
    allocation = claim(plane, name)["status"]["allocation"]
    (result,) = allocation["devices"]["results"]
    assert result["bindingConditions"] == [READY], "the real server keeps them"
    assert result["bindingFailureConditions"] == ["AttachFailed"]
    assert allocation["allocationTimestamp"]
    return dict(result)


def reserved_for(plane: ControlPlane, name: str) -> list[str]:
    return [r["uid"] for r in claim(plane, name)["status"].get("reservedFor") or []]


def report_attached(plane: ControlPlane, name: str, result: JSON) -> None:
    """What the attaching driver does: the condition True on the allocated device."""
    devices = [
        {
            "driver": result["driver"],
            "pool": result["pool"],
            "device": result["device"],
            **({"shareID": result["shareID"]} if result.get("shareID") else {}),
            "conditions": [
                {
                    "type": READY,
                    "status": "True",
                    "reason": "Attached",
                    "message": "attached by the test",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        }
    ]
    path = claims_path(NS, name) + "/status"
    status, body = merge_patch(plane, path, {"status": {"devices": devices}})
    assert status == 200, body.get("message")


# --------------------------------------------------------------------------- 7. leader election


def test_leader_election_on_a_real_lease(core: Core) -> None:
    """Two controllers with the chart's Lease settings: one leads and schedules, the other
    waits; when the leader stops it releases the Lease and the other takes over."""
    plane = core.plane
    with (
        running_controller(core, "ctl-first") as first,
        running_controller(core, "ctl-second") as second,
    ):
        wait(lambda: first.leading() or second.leading(), what="a leader")
        leader, follower = (first, second) if first.leading() else (second, first)
        assert lease_holder(plane) == leader.identity
        assert not follower.leading()
        create(plane, pod_path(NS), pinned(pod("before", legacy_gpus=1)))
        running_pod(plane, "before")
        assert leader.stop() == 0
        assert "released the lease" in leader.log()
        wait(follower.leading, timeout_s=20, what="the follower leading")
        assert lease_holder(plane) == follower.identity
        lease = get(plane, LEASE)
        assert lease is not None
        assert lease["spec"]["leaseTransitions"] >= 1
        create(plane, pod_path(NS), pinned(pod("after", legacy_gpus=1)))
        running_pod(plane, "after")
        assert "pod core/after: bound" in follower.log()
        assert "pod core/after" not in leader.log()
        clean_up(plane)


LEASE: Final = "/apis/coordination.k8s.io/v1/namespaces/biaxial-system/leases/biaxial-controller"


def lease_holder(plane: ControlPlane) -> str:
    lease = get(plane, LEASE)
    assert lease is not None
    return str(lease["spec"].get("holderIdentity") or "")


# --------------------------------------------------------------------------- 8. deletion


def test_deletion_deallocates_and_the_template_claim_is_collected(
    core: Core, controller: ControllerProcess
) -> None:
    """A pod with a template's claim and a shared standalone claim: once deleted (kwok ends
    its graceful deletion), biaxial releases both claims; the template's claim is then
    deleted by kube-controller-manager, the standalone one stays, deallocated, and the plugin
    unprepares both."""
    plane = core.plane
    create(plane, templates_path(), template("gone"))
    create(plane, claims_path(NS), resource_claim("kept", namespace=NS))
    body = pinned(pod("leaving", template="gone"))
    body["spec"]["resourceClaims"].append({"name": "kept", "resourceClaimName": "kept"})
    body["spec"]["containers"][0]["resources"]["claims"].append({"name": "kept"})
    create(plane, pod_path(NS), body)
    generated, _ = allocation_of(plane, "leaving")
    kept = claim(plane, "kept")
    assert kept["status"]["allocation"]
    refs = [claim_ref(generated), claim_ref(kept)]
    dra = core.kubelet.dra("v1")
    out = dra.prepare(refs)
    assert [out[r[1]].error for r in refs] == ["", ""]
    specs = [core.plugin.cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{r[1]}.json" for r in refs]
    assert all(spec.exists() for spec in specs)

    delete(plane, pod_path(NS, "leaving"))
    wait(lambda: get(plane, pod_path(NS, "leaving")) is None, what="the pod gone")
    assert dra.unprepare(refs) == {r[1]: "" for r in refs}
    assert not any(spec.exists() for spec in specs)
    wait(
        lambda: get(plane, claims_path(NS, generated["metadata"]["name"])) is None,
        what="the template's claim deleted",
    )
    wait(
        lambda: not (claim(plane, "kept").get("status") or {}).get("allocation"),
        what="the standalone claim deallocated",
    )
    released = claim(plane, "kept")
    assert not (released.get("status") or {}).get("reservedFor")
    assert FINALIZER not in (released["metadata"].get("finalizers") or [])
    delete(plane, claims_path(NS, "kept"))


def test_a_claim_shared_by_two_pods(core: Core, controller: ControllerProcess) -> None:
    """One standalone claim referenced by two pods: allocated once, reserved for the first,
    then for both (a status write that keeps the allocation); released when both are gone."""
    plane = core.plane
    create(plane, claims_path(NS), resource_claim("together", namespace=NS))
    uids = []
    for name in ("first", "second"):
        uids.append(
            create(plane, pod_path(NS), pinned(pod(name, claim="together")))["metadata"]["uid"]
        )
        running_pod(plane, name)
    shared = claim(plane, "together")
    assert sorted(r["uid"] for r in shared["status"]["reservedFor"]) == sorted(uids)
    delete(plane, pod_path(NS, "first"))
    wait(
        lambda: (
            [r["uid"] for r in claim(plane, "together")["status"].get("reservedFor") or []]
            == uids[1:]
        ),
        what="reserved for the second alone",
    )
    assert claim(plane, "together")["status"]["allocation"] == shared["status"]["allocation"]
    delete(plane, pod_path(NS, "second"))
    wait(
        lambda: not (claim(plane, "together").get("status") or {}).get("allocation"),
        what="deallocated",
    )
    delete(plane, claims_path(NS, "together"))


def test_a_burst_on_one_claim_and_a_deep_claim_stop_nothing(
    core: Core, controller: ControllerProcess
) -> None:
    """Issue 29 on the real server: ten pods created in one burst on one claim are all bound
    and reserved on its one allocation (none stranded while the allocation is in flight), and a
    claim whose opaque parameters nest 1,000 deep — which the real API server accepts (its JSON
    decoder allows 10,000 levels) — is that pod's error while the controller keeps scheduling."""
    plane = core.plane
    create(plane, claims_path(NS), resource_claim("burst", namespace=NS, memory="1Gi"))
    names = [f"burst-{i}" for i in range(10)]
    for name in names:
        create(plane, pod_path(NS), pinned(pod(name, claim="burst")))
    for name in names:
        running_pod(plane, name, timeout=60)
    reserved = {r["name"] for r in claim(plane, "burst")["status"]["reservedFor"]}
    assert reserved == set(names)

    nested: Any = []
    for _ in range(999):
        nested = [nested]
    deep = resource_claim("deep", namespace=NS)
    deep["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "other.example.com", "parameters": {"p": nested}}}
    ]
    create(plane, claims_path(NS), deep)
    create(plane, pod_path(NS), pinned(pod("deep-pod", claim="deep")))

    def reported() -> str | None:
        stored = get(plane, pod_path(NS, "deep-pod")) or {}
        for condition in (stored.get("status") or {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and "nest deeper" in condition["message"]:
                return str(condition["message"])
        return None

    assert "opaque parameters nest deeper than 64 levels" in wait(reported, what="its report")
    create(plane, claims_path(NS), resource_claim("after", namespace=NS, memory="1Gi"))
    create(plane, pod_path(NS), pinned(pod("after", claim="after")))
    running_pod(plane, "after")
    assert controller.leading()
    # the session's other tests read the whole cluster (simulate refuses the deep claim)
    delete(plane, pod_path(NS, "deep-pod"))
    delete(plane, claims_path(NS, "deep"))

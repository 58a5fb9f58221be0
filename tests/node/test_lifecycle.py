"""Restarts and health on the real node: the plugin killed while its pods run, the kubelet
restarted, the controller failed over, and a GPU's fatal Xid as the kubelet reports it."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.apiserver.components import ControllerProcess, create, get, pod_path
from tests.cluster.build import release
from tests.cluster.node import wait_until
from tests.node.conftest import Cluster
from tests.node.workloads import (
    RESOURCE,
    cdi_specs,
    claim_of,
    container,
    delete_and_wait,
    namespace,
    pod,
    report,
    request,
    running,
    slice_devices,
    template,
)

JSON = dict[str, Any]


def _gpu_pod(cluster: Cluster, ns: str, name: str) -> JSON:
    plane = cluster.plane
    if get(plane, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates/one") is None:
        create(plane, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
               template("one", ns, [request("gpu")]))  # fmt: skip
    create(plane, f"/api/v1/namespaces/{ns}/pods",
           pod(name, ns, [container(claims=["gpu"])],
               claims={"gpu": {"resourceClaimTemplateName": "one"}}))  # fmt: skip
    running(plane, ns, name)
    report(cluster.node, ns, name)
    return claim_of(plane, ns, name, "gpu")


def _prepared(cluster: Cluster, uid: str) -> bool:
    return any(uid in n for n in cdi_specs(cluster.node.cdi_dir))


def _registrations(cluster: Cluster) -> int:
    """How often the kubelet's plugin manager has started registering a plugin (its log, across
    kubelet restarts: the log file is appended to)."""
    return cluster.node.kubelet().log.read_text().count("OperationExecutor.RegisterPlugin started")


def _restarts(cluster: Cluster, ns: str, name: str) -> int:
    stored = get(cluster.plane, pod_path(ns, name)) or {}
    return sum(s.get("restartCount", 0) for s in stored["status"].get("containerStatuses", []))


def test_the_plugin_killed_while_its_pod_runs(cluster: Cluster) -> None:
    """SIGKILL the plugin: the pod keeps running (its container does not need the plugin);
    the restarted plugin registers again with the kubelet (a new registration socket), and the
    kubelet's later NodeUnprepareResources reaches it: the claim's CDI spec goes."""
    plane = cluster.plane
    ns = namespace(plane, "plugin-restart")
    uid = _gpu_pod(cluster, ns, "survivor")["metadata"]["uid"]
    assert cluster.plugin.proc is not None
    before = _registrations(cluster)
    cluster.plugin.proc.send_signal(signal.SIGKILL)
    cluster.plugin.proc.wait(10)
    cluster.plugin.start(timeout_s=30)
    wait_until(lambda: _registrations(cluster) > before, 30,
               "the kubelet registered the plugin again")  # fmt: skip
    assert (get(plane, pod_path(ns, "survivor")) or {})["status"]["phase"] == "Running"
    assert _restarts(cluster, ns, "survivor") == 0
    assert _prepared(cluster, uid)
    delete_and_wait(plane, ns, "survivor")
    wait_until(lambda: not _prepared(cluster, uid), 30, "unprepared by the new plugin")


def test_the_kubelet_restarted_recovers_its_claims(cluster: Cluster) -> None:
    """Restart the kubelet while a pod runs: the container keeps running (no restart), the
    kubelet rebuilds its claim cache from its checkpoint (dra_manager_state) and, when the
    pod is deleted later, still unprepares the claim it prepared before the restart."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "kubelet-restart")
    uid = _gpu_pod(cluster, ns, "steady")["metadata"]["uid"]
    assert (node.kubelet_dir / "dra_manager_state").is_file()
    before = _registrations(cluster)
    node.restart_kubelet()
    wait_until(lambda: _registrations(cluster) > before, 30,
               "the plugin registered with the new kubelet")  # fmt: skip
    assert (get(plane, pod_path(ns, "steady")) or {})["status"]["phase"] == "Running"
    assert _restarts(cluster, ns, "steady") == 0
    delete_and_wait(plane, ns, "steady")
    wait_until(lambda: not _prepared(cluster, uid), 30, "unprepared after the kubelet restart")


def test_the_controller_fails_over(cluster: Cluster) -> None:
    """A second controller waits on the lease; the first stops (SIGTERM releases the lease);
    the second leads and schedules the next pod, which really runs."""
    plane = cluster.plane
    ns = namespace(plane, "failover")
    standby = ControllerProcess(cluster.install, cluster.node.root, "controller-1")
    standby.log_path = cluster.node.root / "logs" / "controller-1.log"
    standby.start()
    try:
        assert not standby.leading()
        assert cluster.controller.stop() == 0
        wait_until(standby.leading, 30, "the standby leads")
    except BaseException:
        standby.stop()
        raise
    cluster.controller = standby
    uid = _gpu_pod(cluster, ns, "after")["metadata"]["uid"]
    delete_and_wait(plane, ns, "after")
    wait_until(lambda: not _prepared(cluster, uid), 30, "unprepared")


@pytest.mark.skipif(
    release().minor in ("1.34", "1.35"),
    reason="pod allocatedResourcesStatus needs ResourceHealthStatus (alpha and off before 1.36)",
)
def test_a_fatal_xid_taints_the_device_and_the_kubelet_reports_it(cluster: Cluster) -> None:
    """A fatal Xid (79, fallen off the bus) on the pod's GPU: the plugin taints the device in
    its ResourceSlice (NoExecute, KEP-5055) and reports it Unhealthy on the kubelet's
    DRAResourceHealth stream; the kubelet shows it in the container's
    ``allocatedResourcesStatus`` (KEP-4680, beta in 1.36). Recovery clears both."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "health")
    claim = _gpu_pod(cluster, ns, "sick")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = result["device"]
    cluster.plugin.inject("xid", int(device.split("-")[1]), xid=79)

    def taints() -> list[JSON]:
        return list(slice_devices(plane, node.name)[device].get("taints") or [])

    found = wait_until(taints, 30, "the device tainted")
    print(f"\n[health] taints on {device}: {found}")

    def health() -> list[JSON]:
        stored = get(plane, pod_path(ns, "sick")) or {}
        out = []
        for status in stored["status"].get("containerStatuses", []):
            out += status.get("allocatedResourcesStatus") or []
        return (
            out
            if any(r.get("health") == "Unhealthy" for s in out for r in s.get("resources", []))
            else []
        )

    reported = wait_until(health, 60, "the kubelet's allocatedResourcesStatus Unhealthy")
    print(f"[health] allocatedResourcesStatus: {reported}")
    cluster.plugin.inject("recovered", int(device.split("-")[1]))
    wait_until(lambda: not taints(), 30, "the taint lifted after recovery")
    delete_and_wait(plane, ns, "sick")

"""Pods that really run on the real node with their GPUs injected through CDI (issue 23): the
real kubelet calls the biaxial plugin's NodePrepareResources before the container starts and
NodeUnprepareResources after it stops (KEP-4381's DRA manager), containerd reads the plugin's
CDI spec and runc creates the device nodes in the container. Each test reads what the container
itself saw: its environment, its ``/dev``, its mounts, printed to its log.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.apiserver.components import claims_path, create, get
from tests.cluster.node import wait_until
from tests.node.conftest import Cluster
from tests.node.workloads import (
    RESOURCE,
    cdi_specs,
    claim,
    claim_of,
    container,
    delete_and_wait,
    env_of,
    gpu_lines,
    namespace,
    pod,
    report,
    request,
    running,
    slice_devices,
    template,
)

JSON = dict[str, Any]
CONTROL = ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]


@pytest.fixture(scope="module", autouse=True)
def slices_published(cluster: Cluster) -> None:
    wait_until(lambda: len(slice_devices(cluster.plane, cluster.node.name)) >= 4, 60, "4 GPUs")


def _show(title: str, sections: dict[str, list[str]]) -> None:
    """Print the container's env and /dev lines (the closing note quotes them)."""
    env = [line for line in sections["env"] if "CUDA" in line or "NVIDIA" in line]
    print(f"\n[{title}] env: {env}\n[{title}] /dev: {sections['dev']}")


def _minor(device_name: str) -> int:
    return int(device_name.split("-")[1])


def test_whole_gpu_from_a_template(cluster: Cluster) -> None:
    """One whole GPU through a ResourceClaimTemplate: the container sees exactly that GPU's
    node (plus the control nodes) and its UUID; the claim is allocated, reserved for the pod
    and prepared (CDI spec, checkpoint); deleting the pod unprepares and the claim goes."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "whole")
    create(plane, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
           template("one-gpu", ns, [request("gpu")]))  # fmt: skip
    started = time.monotonic()
    create(
        plane,
        f"/api/v1/namespaces/{ns}/pods",
        pod("whole", ns, [container(claims=["gpu"])],
            claims={"gpu": {"resourceClaimTemplateName": "one-gpu"}}),
    )  # fmt: skip
    stored = running(plane, ns, "whole")
    print(f"\n[whole] Running after {time.monotonic() - started:.1f} s")
    claim = claim_of(plane, ns, "whole", "gpu")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1
    device = results[0]["device"]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [stored["metadata"]["uid"]]
    uuid = slice_devices(plane, node.name)[device]["attributes"]["uuid"]["string"]

    sections = report(node, ns, "whole")
    _show("whole", sections)
    env = env_of(sections)
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert gpu_lines(sections) == sorted([f"nvidia{_minor(device)}", *CONTROL])
    specs = cdi_specs(node.cdi_dir)
    assert any(claim["metadata"]["uid"] in name for name in specs), specs
    assert _checkpoint_mentions(node, claim["metadata"]["uid"])

    delete_and_wait(plane, ns, "whole")
    # KEP-4381: the kubelet unprepares once the pod's containers are gone; then the
    # resourceclaim controller deletes the generated claim (owned by the pod)
    wait_until(lambda: not any(claim["metadata"]["uid"] in n for n in cdi_specs(node.cdi_dir)),
               30, "CDI spec removed")  # fmt: skip
    wait_until(lambda: not _checkpoint_mentions(node, claim["metadata"]["uid"]), 30,
               "checkpoint clean")  # fmt: skip
    wait_until(lambda: get(plane, claims_path(ns, claim["metadata"]["name"])) is None, 30,
               "generated claim deleted")  # fmt: skip


def _checkpoint_mentions(node: Any, uid: str) -> bool:
    return any(uid in p.read_text(errors="replace")
               for p in (node.root / "biaxial-state").glob("*.json"))  # fmt: skip


def test_two_hami_core_shares_on_one_gpu_see_their_own_limits(cluster: Cluster) -> None:
    """Two memory + cores shares under hami-core (the class's sharing policy): binpack puts
    both on one GPU; each container sees HAMi-core's limits for its device index 0 (its only
    device), the library preloaded and mounted, and the same GPU."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "share")
    shares = {"small": ("4Gi", 30, 4096), "large": ("6Gi", 50, 6144)}
    for name, (memory, cores, _) in shares.items():
        create(plane, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
               template(name, ns, [request("gpu", capacity={"requests": {
                   "memory": memory, "cores": str(cores)}})]))  # fmt: skip
        create(plane, f"/api/v1/namespaces/{ns}/pods",
               pod(name, ns, [container(claims=["gpu"])],
                   claims={"gpu": {"resourceClaimTemplateName": name}}))  # fmt: skip
    seen = {}
    for name, (_, cores, mib) in shares.items():
        running(plane, ns, name)
        claim = claim_of(plane, ns, name, "gpu")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        sections = report(node, ns, name)
        _show(f"share {name}", sections)
        env = env_of(sections)
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{mib}m"
        assert env["CUDA_DEVICE_SM_LIMIT_0"] == str(cores)
        assert env["LD_PRELOAD"].endswith("libvgpu.so")
        assert any(env["LD_PRELOAD"] in line.split() for line in sections["mounts"])
        assert gpu_lines(sections) == sorted([f"nvidia{_minor(result['device'])}", *CONTROL])
        seen[name] = (result["device"], env["NVIDIA_VISIBLE_DEVICES"])
    assert seen["small"] == seen["large"], "binpack: both shares on one GPU"
    for name in shares:
        delete_and_wait(plane, ns, name)


def test_a_device_plugin_pod_runs_through_the_bridge(cluster: Cluster) -> None:
    """A pod written for the device plugin (``nvidia.com/gpu: 1``, no claim): the controller
    makes the KEP-5004 bridge claim and records it in pod.status.extendedResourceClaimStatus;
    the real kubelet admits the pod although the node advertises no nvidia.com/gpu, prepares
    that claim and gives its CDI devices to the container named in the request mapping."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "bridge")
    create(plane, f"/api/v1/namespaces/{ns}/pods",
           pod("legacy", ns, [container(limits={"nvidia.com/gpu": "1"})]))  # fmt: skip
    stored = running(plane, ns, "legacy")
    status = stored["status"]["extendedResourceClaimStatus"]
    assert status["requestMappings"] == [
        {
            "containerName": "main",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-0-request-0",
        }
    ]
    claim = get(plane, claims_path(ns, status["resourceClaimName"]))
    assert claim is not None
    assert (
        claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
    )
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    sections = report(node, ns, "legacy")
    _show("bridge", sections)
    env = env_of(sections)
    uuid = slice_devices(plane, node.name)[result["device"]]["attributes"]["uuid"]["string"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert gpu_lines(sections) == sorted([f"nvidia{_minor(result['device'])}", *CONTROL])
    delete_and_wait(plane, ns, "legacy")
    wait_until(lambda: get(plane, claims_path(ns, status["resourceClaimName"])) is None, 30,
               "bridge claim deleted with its pod")  # fmt: skip


def test_two_pods_share_one_claim(cluster: Cluster) -> None:
    """One ResourceClaim in two pods: both run on its one GPU and are in reservedFor; the
    claim stays prepared while either runs, and is unprepared once both are gone."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "shared")
    create(plane, claims_path(ns), claim("shared", ns, [request("gpu")]))
    pods = ("first", "second")
    for name in pods:
        create(plane, f"/api/v1/namespaces/{ns}/pods",
               pod(name, ns, [container(claims=["gpu"])],
                   claims={"gpu": {"resourceClaimName": "shared"}}))  # fmt: skip
    uids = {running(plane, ns, name)["metadata"]["uid"] for name in pods}
    stored = get(plane, claims_path(ns, "shared"))
    assert stored is not None
    assert {r["uid"] for r in stored["status"]["reservedFor"]} == uids
    (result,) = stored["status"]["allocation"]["devices"]["results"]
    visible = {env_of(report(node, ns, name))["NVIDIA_VISIBLE_DEVICES"] for name in pods}
    assert len(visible) == 1
    uid = stored["metadata"]["uid"]
    delete_and_wait(plane, ns, "first")
    assert _checkpoint_mentions(node, uid), "still prepared for the second pod"
    assert any(uid in n for n in cdi_specs(node.cdi_dir))
    delete_and_wait(plane, ns, "second")
    wait_until(lambda: not any(uid in n for n in cdi_specs(node.cdi_dir)), 30, "unprepared")

    def released() -> bool:
        now = get(plane, claims_path(ns, "shared")) or {}
        return not now.get("status", {}).get("reservedFor")

    wait_until(released, 30, "no longer reserved")
    print(f"\n[shared] {result['device']} for both pods: {sorted(visible)}")


def test_two_containers_each_get_only_their_own_request(cluster: Cluster) -> None:
    """A claim with two requests, each container naming one (KEP-3063
    ``resources.claims[].request``): each container sees only its own GPU."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "two")
    create(plane, f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
           template("pair", ns, [request("a"), request("b")]))  # fmt: skip
    create(
        plane,
        f"/api/v1/namespaces/{ns}/pods",
        pod("pair", ns, [container("left", claims=["gpu/a"]), container("right", claims=["gpu/b"])],
            claims={"gpu": {"resourceClaimTemplateName": "pair"}}),
    )  # fmt: skip
    running(plane, ns, "pair")
    results = {
        r["request"]: r["device"]
        for r in claim_of(plane, ns, "pair", "gpu")["status"]["allocation"]["devices"]["results"]
    }
    assert len(set(results.values())) == 2
    devices = slice_devices(plane, node.name)
    for name, req in (("left", "a"), ("right", "b")):
        sections = report(node, ns, "pair", name)
        _show(f"two containers: {name}", sections)
        env = env_of(sections)
        assert (
            env["NVIDIA_VISIBLE_DEVICES"] == devices[results[req]]["attributes"]["uuid"]["string"]
        )
        assert gpu_lines(sections) == sorted([f"nvidia{_minor(results[req])}", *CONTROL])
    delete_and_wait(plane, ns, "pair")

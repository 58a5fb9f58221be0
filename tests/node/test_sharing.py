"""Sharing strategies beyond hami-core on the real node, and a configuration Prepare refuses."""

from __future__ import annotations

from typing import Any

from tests.apiserver.components import claims_path, create, get, pod_path
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
    gpu_config,
    namespace,
    pod,
    report,
    request,
    running,
    template,
)

JSON = dict[str, Any]


def test_an_mps_share_gets_its_own_control_daemon(cluster: Cluster) -> None:
    """A share whose claim chooses MPS: Prepare starts a control daemon for the claim's GPU
    (the stand-in nvidia-cuda-mps-control), the container sees the MPS limits and the daemon's
    pipe directory; after the pod the daemon is stopped and its directory removed."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "mps")
    create(
        plane,
        f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
        template("mps", ns,
                 [request("gpu", capacity={"requests": {"memory": "2Gi", "cores": "25"}})],
                 [gpu_config("mps")]),
    )  # fmt: skip
    create(plane, f"/api/v1/namespaces/{ns}/pods",
           pod("mps", ns, [container(claims=["gpu"])],
               claims={"gpu": {"resourceClaimTemplateName": "mps"}}))  # fmt: skip
    running(plane, ns, "mps")
    uid = claim_of(plane, ns, "mps", "gpu")["metadata"]["uid"]
    sections = report(node, ns, "mps")
    env = env_of(sections)
    print(f"\n[mps] env: {[e for e in sections['env'] if 'MPS' in e or 'NVIDIA' in e]}")
    print(f"[mps] pipe directory: {sections['mps']}")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "daemon" in sections["mps"], "the stand-in daemon's file in the mounted pipe dir"
    daemons = node.root / "mps" / uid
    assert daemons.is_dir()
    delete_and_wait(plane, ns, "mps")
    wait_until(lambda: not daemons.exists(), 30, "MPS daemon stopped and removed")


def test_a_configuration_prepare_refuses_leaves_nothing_behind(cluster: Cluster) -> None:
    """A claim allocated outside biaxial's controller (another scheduler's allocation, written
    as status) with a configuration the node refuses: MPS across two GPUs. The real kubelet
    calls NodePrepareResources, the plugin refuses with the reason, the kubelet records it as
    the pod's FailedPrepareDynamicResources event and never starts the container; no CDI spec
    and no checkpoint entry is left."""
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "badconfig")
    bad = claim("bad", ns, [request("gpu", count=2)], [gpu_config("mps")])
    bad["metadata"]["finalizers"] = ["example.com/test"]  # kept until the test removes it
    stored = create(plane, claims_path(ns), bad)
    spec = pod("bad", ns, [container(claims=["gpu"])], claims={"gpu": {"resourceClaimName": "bad"}})
    spec["spec"]["nodeName"] = node.name  # no scheduler: the node runs it as it is
    spec["spec"].pop("schedulerName")
    created = create(plane, f"/api/v1/namespaces/{ns}/pods", spec)
    stored["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.biaxial.dev", "pool": node.name,
                     "device": f"gpu-{i}"}
                    for i in (2, 3)
                ],
                "config": [{"source": "FromClaim", "requests": ["gpu"],
                            "opaque": gpu_config("mps")["opaque"]}],
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node.name]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": "bad", "uid": created["metadata"]["uid"]}],
    }  # fmt: skip
    status, body = plane.request("PUT", claims_path(ns, "bad") + "/status", stored)
    assert status == 200, body

    messages: list[str] = []

    def refused() -> str | None:
        # until the status write lands the kubelet reports the pod "not allowed to use" the
        # claim (not in reservedFor); then the plugin's refusal
        _, events = plane.request("GET", f"/api/v1/namespaces/{ns}/events")
        messages[:] = [
            str(e["message"])
            for e in events["items"]
            if e["involvedObject"]["name"] == "bad"
            and e["reason"].startswith("FailedPrepareDynamicResources")
        ]
        return next((m for m in messages if "mps" in m.lower()), None)

    try:
        message = wait_until(refused, 60, "the plugin's refusal as the pod's event")
    except TimeoutError as err:
        raise AssertionError(f"{err}; events: {messages}") from err
    print(f"\n[bad config] event: {message}")
    pod_now = get(plane, pod_path(ns, "bad")) or {}
    assert not any(
        s.get("state", {}).get("running") for s in pod_now["status"].get("containerStatuses", [])
    )
    assert not any(stored["metadata"]["uid"] in n for n in cdi_specs(node.cdi_dir))
    assert not any(
        stored["metadata"]["uid"] in p.read_text()
        for p in (node.root / "biaxial-state").glob("*.json")
    )
    delete_and_wait(plane, ns, "bad")
    final = get(plane, claims_path(ns, "bad")) or {}
    final["metadata"]["finalizers"] = []
    plane.request("PUT", claims_path(ns, "bad"), final)

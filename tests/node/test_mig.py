"""Dynamic MIG on the real node (fake backend): the partition is created at Prepare, its device
nodes are in the container, and it is destroyed once the pod is gone."""

from __future__ import annotations

import json

import pytest

from tests.apiserver.components import create
from tests.cluster.build import release
from tests.cluster.node import wait_until
from tests.node.conftest import NO_DYNAMIC_MIG, Cluster
from tests.node.workloads import (
    RESOURCE,
    claim_of,
    container,
    delete_and_wait,
    env_of,
    gpu_lines,
    namespace,
    pod,
    report,
    running,
    template,
)


def _instances(cluster: Cluster) -> str:
    state = cluster.node.root / "biaxial-state" / "fake-nvml-mig.json"
    return state.read_text() if state.exists() else ""


@pytest.mark.skipif(
    release().minor in NO_DYNAMIC_MIG,
    reason="1.34's API server refuses the plugin's dynamic-MIG pool (counter sets in a slice "
    "of their own); see tests/node/conftest.py",
)
def test_a_dynamic_mig_partition_lives_as_long_as_its_pod(cluster: Cluster) -> None:
    plane, node = cluster.plane, cluster.node
    ns = namespace(plane, "mig")
    create(
        plane,
        f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates",
        template(
            "slice",
            ns,
            [{"name": "mig", "exactly": {"deviceClassName": "mig-1g.10gb.biaxial.dev"}}],
        ),
    )
    create(plane, f"/api/v1/namespaces/{ns}/pods",
           pod("mig", ns, [container(claims=["mig"])],
               claims={"mig": {"resourceClaimTemplateName": "slice"}}))  # fmt: skip
    running(plane, ns, "mig")
    (result,) = claim_of(plane, ns, "mig", "mig")["status"]["allocation"]["devices"]["results"]
    assert result["device"].startswith("gpu-4-mig-1g10gb-")
    created = json.loads(_instances(cluster) or "{}")
    print(f"\n[mig] {result['device']}; fake NVML instances: {created}")
    assert "1g.10gb" in json.dumps(created)
    sections = report(node, ns, "mig")
    env = env_of(sections)
    print(f"[mig] env: {[e for e in sections['env'] if 'NVIDIA' in e or 'CUDA' in e]}")
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
    assert "nvidia4" in gpu_lines(sections)
    print(f"[mig] /dev: {gpu_lines(sections)}, /dev/nvidia-caps: {sections['caps']}")
    (instance,) = next(i for i in created["instances"].values() if i)
    assert sorted(sections["caps"]) == sorted(c.rsplit("/", 1)[1] for c in instance["caps"])
    delete_and_wait(plane, ns, "mig")
    wait_until(lambda: "1g.10gb" not in _instances(cluster), 30, "the MIG instance destroyed")

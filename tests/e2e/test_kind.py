"""biaxial on a real cluster (kind with fake GPUs, deploy/kind/up.sh): the chart's workloads
come up, every labelled node publishes its GPUs, and the four two-axis patterns land as
DESIGN.md "The two axes" says, one pattern at a time on an otherwise idle cluster.

Skipped with the reason unless the cluster is there (see conftest.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import NAMESPACE, Kubectl

ROOT = Path(__file__).resolve().parents[2]
PATTERNS = ROOT / "examples" / "four-patterns"
DRIVER = "gpu.biaxial.dev"


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(2)


def test_components_are_ready(kubectl: Kubectl) -> None:
    ds = kubectl.get("-n", NAMESPACE, "daemonset", "biaxial-kubelet-plugin")
    assert ds["status"].get("numberReady", 0) == ds["status"]["desiredNumberScheduled"] > 0
    deploy = kubectl.get("-n", NAMESPACE, "deployment", "biaxial-controller")
    assert deploy["status"].get("readyReplicas", 0) == deploy["spec"]["replicas"] == 2
    lease = kubectl.get("-n", NAMESPACE, "lease", "biaxial-controller")
    assert lease["spec"]["holderIdentity"].startswith("biaxial-controller-")


def test_every_fake_gpu_node_publishes_four_gpus(kubectl: Kubectl) -> None:
    nodes = kubectl.get("nodes", "-l", "biaxial.dev/fake-gpus=true")["items"]
    assert nodes, "no node is labelled biaxial.dev/fake-gpus=true"
    slices = [s for s in kubectl.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER]
    for node in nodes:
        name = node["metadata"]["name"]
        devices = [
            d["name"]
            for s in slices
            if s["spec"].get("nodeName") == name
            for d in s["spec"].get("devices", [])
        ]
        assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], name


# pattern file -> (distinct nodes, distinct GPUs, most pods on one GPU) for 2 x (4 x T4)
EXPECTED = {
    "a-binpack-binpack.yaml": (1, 2, 2),
    "b-spread-binpack.yaml": (2, 2, 2),
    "c-binpack-spread.yaml": (1, 4, 1),
    "d-spread-spread.yaml": (2, 4, 1),
}


@pytest.fixture
def applied(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """Apply one pattern file; yield its name; delete it and wait for its pods to go."""
    path = PATTERNS / request.param
    app = f"pattern-{request.param[0]}"
    kubectl.run("apply", "-f", str(path))
    try:
        yield request.param
    finally:
        kubectl.run("delete", "-f", str(path), "--wait=true", check=False)
        _wait(
            f"{app} pods gone",
            lambda: not kubectl.get("pods", "-l", f"app={app}")["items"],
        )


@pytest.mark.parametrize("applied", sorted(EXPECTED), indirect=True)
def test_four_patterns_place_as_designed(kubectl: Kubectl, applied: str) -> None:
    app = f"pattern-{applied[0]}"

    def placed() -> bool:
        pods = kubectl.get("pods", "-l", f"app={app}")["items"]
        return len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods)

    _wait(f"4 {app} pods bound", placed)
    pods = kubectl.get("pods", "-l", f"app={app}")["items"]
    per_gpu: dict[tuple[str, str], int] = {}
    for pod in pods:
        statuses = pod["status"].get("extendedResourceClaimStatus") or {}
        claim_name = statuses.get("resourceClaimName")
        assert claim_name, f"{pod['metadata']['name']}: no bridge claim in status"
        claim = kubectl.get("-n", pod["metadata"]["namespace"], "resourceclaim", claim_name)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 1
        key = (pod["spec"]["nodeName"], results[0]["device"])
        per_gpu[key] = per_gpu.get(key, 0) + 1
    nodes = {node for node, _ in per_gpu}
    assert (len(nodes), len(per_gpu), max(per_gpu.values())) == EXPECTED[applied]

"""The controller speaks the dialects as the simulator does: HAMi, Volcano and KAI hints are
honoured on the bridge claim it writes, and what it cannot honour is a ``FailedScheduling``
event plus ``PodScheduled=False`` on the pod, with nothing allocated for it.

(The vocabulary and the rules cited for it: ``tests/unit/test_dialects.py``.)
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    pod,
    pod_condition,
    pod_events,
    seed_cluster,
)


@pytest.fixture
def cluster(emulator: Emulator, claim_controller: ResourceClaimController) -> Emulator:
    seed_cluster(emulator)  # gpu-t4 (4 x T4), gpu-a10g (4 x A10G)
    return emulator


def _bridge_claim(cluster: Emulator, name: str) -> dict[str, Any]:
    p = cluster.get("pods", name, "default") or {}
    claim_name = p["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = cluster.get("resourceclaims", claim_name, "default")
    assert claim is not None
    return claim


def test_hami_and_volcano_hints_are_on_the_claims_the_controller_writes(
    cluster: Emulator, controller: ControllerThread
) -> None:
    # Node binpack would put a 3000 MiB share on a T4 (the larger share); the HAMi type filter
    # keeps it on an A10G.
    cluster.create(
        pod(
            "hami-a10g",
            legacy_gpus=1,
            gpumem=3000,
            annotations={"nvidia.com/use-gputype": "A10G", "nvidia.com/vgpu-mode": "hami-core"},
        )
    )
    numa = pod(
        "numa",
        legacy_gpus=2,
        annotations={"nvidia.com/numa-bind": "true", "nvidia.com/nouse-gputype": "T4"},
    )
    cluster.create(numa)
    volcano = pod("volcano", annotations={"volcano.sh/vgpu-mode": "mps"})
    volcano["spec"]["containers"][0]["resources"] = {
        "limits": {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "2000"}
    }
    cluster.create(volcano)
    cluster.wait_until(
        lambda: len(bound_pods(cluster, ["hami-a10g", "volcano", "numa"])) == 3, timeout=20
    )
    assert bound_pods(cluster)["hami-a10g"] == "gpu-a10g"
    assert bound_pods(cluster)["numa"] == "gpu-a10g"
    numa_claim = _bridge_claim(cluster, "numa")["spec"]["devices"]
    assert numa_claim["constraints"] == [
        {"requests": ["container-0-request-0"], "matchAttribute": "resource.kubernetes.io/numaNode"}
    ]
    assert numa_claim["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"].startswith(
        '!(["T4"].exists(t,'
    )
    hami = _bridge_claim(cluster, "hami-a10g")["spec"]["devices"]
    assert (
        '["A10G"].exists(t,' in hami["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    )
    assert hami["config"][0]["opaque"]["parameters"]["sharing"] == {"strategy": "hami-core"}
    vol = _bridge_claim(cluster, "volcano")
    assert vol["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": "2000Mi"}
    }
    assert vol["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"] == {
        "strategy": "mps"
    }
    mapping = cluster.get("pods", "volcano", "default")["status"]["extendedResourceClaimStatus"]
    assert mapping["requestMappings"][0]["resourceName"] == "volcano.sh/vgpu-number"
    assert check_invariants(cluster) == []


def test_hints_biaxial_cannot_honour_are_events_and_conditions(
    cluster: Emulator, controller: ControllerThread
) -> None:
    kai_pod = pod("kai", annotations={"gpu-fraction": "0.5"})
    cluster.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "compute-share", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.biaxial.dev",
                                "capacity": {"requests": {"compute": "20"}},
                            },
                        }
                    ]
                }
            },
        }
    )
    cases = {
        "ghost-uuid": (
            pod("ghost-uuid", legacy_gpus=1, annotations={"nvidia.com/use-gpuuuid": "GPU-0000"}),
            "annotation nvidia.com/use-gpuuuid: no GPU in the cluster has UUID GPU-0000",
        ),
        "typo": (
            pod("typo", legacy_gpus=1, annotations={"biaxial.dev/node-polciy": "spread"}),
            (
                "annotation biaxial.dev/node-polciy: unknown biaxial.dev annotation; did you mean "
                "biaxial.dev/node-policy? (biaxial reads biaxial.dev/gpu-policy, "
                "biaxial.dev/node-policy)"
            ),
        ),
        "kai": (
            kai_pod,
            (
                "pod default/kai container main: annotation gpu-fraction: add nvidia.com/gpu: 1 to "
                "this container's resources.limits"
            ),
        ),
        "mig-nowhere": (
            pod("mig-nowhere", legacy_gpus=1, annotations={"nvidia.com/vgpu-mode": "mig"}),
            "annotation nvidia.com/vgpu-mode: mig, but no GPU in the cluster has MIG partitions",
        ),
        "cpu-only": (
            pod("cpu-only", annotations={"nvidia.com/nouse-gputype": "T4"}),
            "pod default/cpu-only: annotation nvidia.com/nouse-gputype: shapes nvidia.com/gpu",
        ),
        "example-driver": (
            pod("example-driver", claim="compute-share"),
            (
                "claim default/compute-share: request 'gpu': GPU devices have no capacity "
                "'compute' (they have cores, memory)"
            ),
        ),
    }
    for obj, _ in cases.values():
        cluster.create(obj)
    cluster.create(pod("good", legacy_gpus=1))
    cluster.wait_until(lambda: "good" in bound_pods(cluster), timeout=20)
    for name, (_, message) in cases.items():
        cluster.wait_until(lambda n=name: pod_condition(cluster, n) is not None, timeout=10)
        condition = pod_condition(cluster, name)
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
        assert condition["message"].startswith(message), condition["message"]
        cluster.wait_until(lambda n=name: bool(pod_events(cluster, n)), timeout=10)
        assert pod_events(cluster, name) == [("FailedScheduling", condition["message"])]
    assert set(bound_pods(cluster)) == {"good"}
    allocated = [
        c["metadata"]["name"]
        for c in cluster.list("resourceclaims")
        if (c.get("status") or {}).get("allocation")
    ]
    assert len(allocated) == 1, allocated  # only the good pod's bridge claim
    assert check_invariants(cluster) == []

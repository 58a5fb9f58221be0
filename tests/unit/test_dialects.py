"""Every dialect a migrating user brings is honoured on the bridge claim or refused with a
specific message, never dropped: HAMi's GPU type/UUID filters, numa-bind and vgpu-mode,
Volcano's vGPU resources and annotations, KAI's fractions, misspelt keys.

The manifests are written for these tests in the style of each project's public examples
(HAMi ``examples/nvidia``, Volcano's vGPU user guide, KAI Scheduler ``docs/gpu-sharing``); the
rules they pin are cited where each test starts. They run through ``simulate`` (the real
decision engine, as the controller uses it); ``tests/integration/test_controller_dialects.py``
shows the same refusals as pod events and conditions.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.simulate.manifests import load_objects
from biaxial.simulate.simulator import SimulationResult, simulate
from driver.api.errors import ManifestError
from driver.discovery.backend import open_backend
from driver.scheduling.dialects import (
    GpuInventory,
    check_against_cluster,
    hami_type,
    pod_hints,
    type_matches,
)

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    o for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for o in load_objects([str(p)])
]
REFERENCE = load_objects([str(ROOT / "examples" / "reference-cluster.yaml")])  # T4 + A10G
H100 = load_objects([str(ROOT / "examples" / "requesting-gpus" / "cluster.yaml")])  # T4 + H100
MIG_MEMORY_MIB = {"1g10gb": 9984, "2g20gb": 20096, "3g40gb": 40448}  # h100-80gbx8 profile


def run(manifests: str, cluster: list[dict[str, Any]] | None = None) -> SimulationResult:
    objects = [d for d in yaml.safe_load_all(manifests) if d]
    return simulate([*(cluster or REFERENCE), *objects], default_classes=CLASSES)


def placed(result: SimulationResult) -> dict[str, tuple[str, list[str]]]:
    return {
        p.pod.split("/")[1]: (p.node, [str(d["device"]) for d in p.devices])
        for p in result.placements
    }


def refused(result: SimulationResult) -> dict[str, str]:
    return {f.pod.split("/")[1]: f.reason for f in result.unschedulable}


def bridge_claim(result: SimulationResult, pod: str) -> dict[str, Any]:
    for obj in result.to_json()["objects"]:
        meta = obj["metadata"]
        if obj["kind"] == "ResourceClaim" and meta["name"].startswith(f"{pod}-extended-resources-"):
            return obj
    raise AssertionError(f"no bridge claim for {pod}")


def uuids(node: str, profile: str) -> dict[str, str]:
    """device name -> UUID, as the simulator's fake GPUs get them."""
    with open_backend(profile, node_name=node) as backend:
        return {f"gpu-{g.minor}": g.uuid for g in backend.discover()}


# --------------------------------------------------------------------------- HAMi
# HAMi: pkg/device/nvidia/device.go (GPUInUse = "nvidia.com/use-gputype", GPUNoUse,
# GPUUseUUID, GPUNoUseUUID, NumaBind, AllocateMode = "nvidia.com/vgpu-mode" with "hami-core",
# "mps", "mig"); pkg/device/devices.go CheckType: an item matches when the upper-cased card
# type contains it, empty value = no constraint; CheckUUID: exact, trimmed comma list.

HAMI_PINNED = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm-a10g
spec:
  replicas: 2
  selector:
    matchLabels: {app: vllm-a10g}
  template:
    metadata:
      labels: {app: vllm-a10g}
      annotations:
        nvidia.com/use-gputype: "a10g"
    spec:
      schedulerName: biaxial
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.6.3
          resources:
            limits:
              nvidia.com/gpu: 1
              nvidia.com/gpumem: 4000
"""


def test_use_gputype_pins_the_gpu_model_and_shows_on_the_claim() -> None:
    # The HAMi demo's case: without the annotation, node binpack puts both replicas on the
    # T4s (4000 MiB is a larger share of a T4); the annotation keeps them on the A10Gs.
    baseline = run(HAMI_PINNED.replace('nvidia.com/use-gputype: "a10g"', "{}"))
    assert {n for n, _ in placed(baseline).values()} == {"gpu-t4"}
    result = run(HAMI_PINNED)
    assert {n for n, _ in placed(result).values()} == {"gpu-a10g"}
    selectors = bridge_claim(result, "vllm-a10g-0")["spec"]["devices"]["requests"][0]["exactly"][
        "selectors"
    ]
    assert len(selectors) == 1
    assert '["A10G"].exists(t,' in selectors[0]["cel"]["expression"]


def test_nouse_gputype_excludes_the_model() -> None:
    result = run(
        HAMI_PINNED.replace("nvidia.com/use-gputype", "nvidia.com/nouse-gputype").replace(
            '"a10g"', '"T4, V100"'
        )
    )
    assert {n for n, _ in placed(result).values()} == {"gpu-a10g"}


def test_hami_card_types_follow_checktype() -> None:
    # The HAMi type of a "Tesla T4" is "NVIDIA-Tesla T4" (device plugin register.go).
    assert hami_type("Tesla T4") == "NVIDIA-Tesla T4"
    assert hami_type("NVIDIA A10G") == "NVIDIA A10G"
    assert type_matches("Tesla T4", ["nvidia-tesla"])
    assert type_matches("NVIDIA H100 80GB HBM3", ["h100"])
    assert not type_matches("NVIDIA A10G", ["A100", "V100"])
    assert (
        pod_hints({"metadata": {"annotations": {"nvidia.com/use-gputype": " , "}}}).use_types == ()
    )


def test_use_gputype_matching_no_gpu_is_refused() -> None:
    result = run(HAMI_PINNED.replace('"a10g"', '"A100,V100"'))
    reason = refused(result)["vllm-a10g-0"]
    assert reason == (
        "annotation nvidia.com/use-gputype: no GPU in the cluster is of type A100, V100 "
        "(the cluster's GPU types: NVIDIA A10G, NVIDIA-Tesla T4)"
    )


UUID_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: pinned
  annotations:
    {key}: "{value}"
spec:
  schedulerName: biaxial
  containers:
    - name: cuda
      image: nvidia/cuda:12.4.1-base-ubuntu22.04
      command: ["sleep", "infinity"]
      resources:
        limits:
          nvidia.com/gpu: 1
"""


@pytest.mark.parametrize("key", ["nvidia.com/use-gpuuuid", "volcano.sh/vgpu-use-gpuuuid"])
def test_use_gpuuuid_pins_the_gpu(key: str) -> None:
    wanted = uuids("gpu-t4", "t4x4")["gpu-2"]
    result = run(UUID_POD.format(key=key, value=wanted))
    assert placed(result)["pinned"] == ("gpu-t4", ["gpu-2"])
    expression = bridge_claim(result, "pinned")["spec"]["devices"]["requests"][0]["exactly"][
        "selectors"
    ][0]["cel"]["expression"]
    assert expression == f'device.attributes[device.driver].uuid in ["{wanted}"]'


def test_nouse_gpuuuid_excludes_the_gpu() -> None:
    avoid = uuids("gpu-a10g", "a10gx4")["gpu-0"]
    result = run(UUID_POD.format(key="nvidia.com/nouse-gpuuuid", value=avoid))
    assert placed(result)["pinned"] == ("gpu-a10g", ["gpu-1"])


@pytest.mark.parametrize("key", ["nvidia.com/use-gpuuuid", "volcano.sh/vgpu-use-gpuuuid"])
def test_an_allow_list_of_uuids_no_gpu_has_is_refused(key: str) -> None:
    result = run(UUID_POD.format(key=key, value="GPU-03f69c50-207a-2038-9b45-23cac89cb67d"))
    assert refused(result)["pinned"] == (
        f"annotation {key}: no GPU in the cluster has UUID GPU-03f69c50-207a-2038-9b45-23cac89cb67d"
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("nvidia.com/nouse-gpuuuid", "GPU-03f69c50-207a-2038-9b45-23cac89cb67d"),
        ("volcano.sh/vgpu-nouse-gpuuuid", "GPU-03f69c50-207a-2038-9b45-23cac89cb67d"),
        ("nvidia.com/nouse-gputype", "V100"),
    ],
)
def test_a_deny_list_of_absent_gpus_excludes_nothing(key: str, value: str) -> None:
    # HAMi's and Volcano's device checks (CheckUUID, CheckType) only drop the devices a
    # deny-list names; naming a GPU that is not there leaves every GPU usable, and the pod is
    # placed. Before, biaxial refused it: "no GPU in the cluster has UUID ...".
    result = run(UUID_POD.format(key=key, value=value))
    assert "pinned" in placed(result)
    assert not refused(result)


H100_ONLY = [
    {
        "apiVersion": "biaxial.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [{"name": "gpu-h100", "gpus": "h100-80gbx8"}],
    }
]
# GPUs 0-3 are on NUMA node 0, 4-5 on NUMA node 1 (6 and 7 are in MIG mode).
NUMA_PODS = """
apiVersion: v1
kind: Pod
metadata:
  name: first
spec:
  schedulerName: biaxial
  containers:
    - name: main
      image: busybox
      resources:
        limits:
          nvidia.com/gpu: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  annotations:
    nvidia.com/numa-bind: "{value}"
spec:
  schedulerName: biaxial
  containers:
    - name: train
      image: pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime
      resources:
        limits:
          nvidia.com/gpu: {count}
"""


def test_numa_bind_keeps_a_containers_gpus_on_one_numa_node() -> None:
    # gpu-0 is taken: three GPUs fit on NUMA node 0, four only across both.
    result = run(NUMA_PODS.format(value="true", count=3), H100_ONLY)
    assert placed(result)["trainer"] == ("gpu-h100", ["gpu-1", "gpu-2", "gpu-3"])
    assert bridge_claim(result, "trainer")["spec"]["devices"]["constraints"] == [
        {"requests": ["container-0-request-0"], "matchAttribute": "resource.kubernetes.io/numaNode"}
    ]
    assert placed(run(NUMA_PODS.format(value="false", count=4), H100_ONLY))["trainer"] == (
        "gpu-h100",
        ["gpu-1", "gpu-2", "gpu-3", "gpu-4"],
    )
    assert "trainer" in refused(run(NUMA_PODS.format(value="true", count=4), H100_ONLY))


def test_numa_bind_that_is_not_a_boolean_is_refused() -> None:
    # HAMi parses it with strconv.ParseBool and treats anything else as false, silently.
    assert refused(run(NUMA_PODS.format(value="yes", count=2), H100_ONLY))["trainer"] == (
        "annotation nvidia.com/numa-bind: 'yes' is not a boolean (true or false)"
    )


MODE_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: shared
  annotations:
    nvidia.com/vgpu-mode: "{mode}"
spec:
  schedulerName: biaxial
  containers:
    - name: infer
      image: vllm/vllm-openai:v0.6.3
      resources:
        limits:
          nvidia.com/gpu: {count}
          nvidia.com/gpumem: 9000
"""


@pytest.mark.parametrize("mode", ["hami-core", "mps"])
def test_vgpu_mode_becomes_the_sharing_strategy_on_the_claim(mode: str) -> None:
    result = run(MODE_POD.format(mode=mode, count=1))
    assert "shared" in placed(result)
    assert bridge_claim(result, "shared")["spec"]["devices"]["config"] == [
        {
            "requests": ["container-0-request-0"],
            "opaque": {
                "driver": "gpu.biaxial.dev",
                "parameters": {
                    "apiVersion": "gpu.biaxial.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": mode},
                },
            },
        }
    ]


def test_vgpu_mode_mps_on_two_gpus_is_refused_as_prepare_would() -> None:
    reason = refused(run(MODE_POD.format(mode="mps", count=2)))["shared"]
    assert "sharing.strategy mps serves one GPU per container" in reason


def test_vgpu_mode_mig_takes_an_existing_partition_that_fits() -> None:
    result = run(MODE_POD.format(mode="mig", count=1), H100)
    node, devices = placed(result)["shared"]
    assert node == "gpu-h100"
    profile = devices[0].split("-mig-")[1].rsplit("-", 1)[0]
    assert MIG_MEMORY_MIB[profile] >= 9000
    exactly = bridge_claim(result, "shared")["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.biaxial.dev"
    assert "capacity" not in exactly
    memory = 'device.capacity[device.driver].memory.compareTo(quantity("9000Mi")) >= 0'
    assert exactly["selectors"] == [{"cel": {"expression": memory}}]


def test_vgpu_mode_mig_without_mig_partitions_is_refused() -> None:
    # The issue: "mig becomes a memory share on a non-MIG GPU".
    assert refused(run(MODE_POD.format(mode="mig", count=1)))["shared"] == (
        "annotation nvidia.com/vgpu-mode: mig, but no GPU in the cluster has MIG partitions "
        "(biaxial allocates existing partitions; ask for a share with nvidia.com/gpumem instead)"
    )


def test_vgpu_mode_mig_with_a_percentage_is_refused() -> None:
    manifest = MODE_POD.format(mode="mig", count=1).replace(
        "nvidia.com/gpumem: 9000", "nvidia.com/gpumem-percentage: 20"
    )
    assert "cannot choose a MIG partition" in refused(run(manifest, H100))["shared"]


def test_unknown_vgpu_mode_is_refused() -> None:
    assert refused(run(MODE_POD.format(mode="time-slicing", count=1)))["shared"] == (
        "annotation nvidia.com/vgpu-mode: unknown mode 'time-slicing' "
        "(allowed: hami-core, mps, mig)"
    )


def test_device_hints_on_a_pod_without_gpu_requests_are_refused() -> None:
    manifest = """
apiVersion: v1
kind: Pod
metadata:
  name: cpu-only
  annotations:
    nvidia.com/use-gputype: A10G
spec:
  schedulerName: biaxial
  containers:
    - name: app
      image: busybox
"""
    assert refused(run(manifest))["cpu-only"].startswith(
        "pod default/cpu-only: annotation nvidia.com/use-gputype: shapes nvidia.com/gpu"
    )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            "biaxial.dev/gpu-polcy",
            (
                "annotation biaxial.dev/gpu-polcy: unknown biaxial.dev annotation; did you mean "
                "biaxial.dev/gpu-policy? (biaxial reads biaxial.dev/gpu-policy, "
                "biaxial.dev/node-policy)"
            ),
        ),
        (
            "biaxial.dev/priority",
            (
                "annotation biaxial.dev/priority: unknown biaxial.dev annotation (biaxial reads "
                "biaxial.dev/gpu-policy, biaxial.dev/node-policy)"
            ),
        ),
        (
            "nvidia.com/use-gpu-type",
            (
                "annotation nvidia.com/use-gpu-type: not a key biaxial knows; did you mean "
                "nvidia.com/use-gputype?"
            ),
        ),
        (
            "hami.io/gpu-scheduler-polcy",
            (
                "annotation hami.io/gpu-scheduler-polcy: not a key biaxial knows; did you mean "
                "hami.io/gpu-scheduler-policy?"
            ),
        ),
        (
            "gpu-fractions",
            "annotation gpu-fractions: not a key biaxial knows; did you mean gpu-fraction?",
        ),
        ("hami.io/device-scoring-weights", "HAMi's per-pod scoring weights are not supported"),
        ("volcano.sh/vgpu-podgroup-policy", "Volcano's pod-group GPU spread"),
    ],
)
def test_unknown_and_unsupported_keys_are_refused(key: str, message: str) -> None:
    manifest = UUID_POD.format(key=key, value="spread")
    reason = refused(run(manifest))["pinned"]
    assert message in reason


def test_other_schedulers_bookkeeping_and_foreign_keys_are_not_requests() -> None:
    # Volcano writes volcano.sh/vgpu-node on pods it placed: close to vgpu-mode, not a typo.
    for key in (
        "volcano.sh/vgpu-node",
        "example.com/use-gputype",
        "kubectl.kubernetes.io/restartedAt",
    ):
        assert "pinned" in placed(run(UUID_POD.format(key=key, value="x")))


# --------------------------------------------------------------------------- Volcano
# Volcano: pkg/scheduler/api/devices/nvidia/vgpu/type.go (GPUModeAnnotation =
# "volcano.sh/vgpu-mode", VGPUUseUUIDAnnotation = "volcano.sh/vgpu-use-gpuuuid",
# VGPUPodGroupPolicyAnnotation); the device plugin config's resource names
# volcano.sh/vgpu-number, vgpu-memory (MiB), vgpu-memory-percentage, vgpu-cores.

VOLCANO_JOB_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: vgpu-pod
  annotations:
    volcano.sh/vgpu-mode: "hami-core"
spec:
  schedulerName: biaxial
  restartPolicy: OnFailure
  containers:
    - name: cuda-container
      image: nvidia/cuda:12.4.1-base-ubuntu22.04
      command: ["sleep", "100000"]
      resources:
        limits:
          volcano.sh/vgpu-number: 2
          volcano.sh/vgpu-memory: 3000
          volcano.sh/vgpu-cores: 50
"""


def test_volcano_vgpu_resources_are_bridged_like_hamis() -> None:
    result = run(VOLCANO_JOB_POD)
    _node, devices = placed(result)["vgpu-pod"]
    assert len(devices) == 2
    claim = bridge_claim(result, "vgpu-pod")
    request = claim["spec"]["devices"]["requests"][0]
    # sorted keys: vgpu-cores (0), vgpu-memory (1), vgpu-number (2)
    assert request == {
        "name": "container-0-request-2",
        "exactly": {
            "deviceClassName": "gpu.biaxial.dev",
            "allocationMode": "ExactCount",
            "count": 2,
            "capacity": {"requests": {"memory": "3000Mi", "cores": "50"}},
        },
    }
    assert claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"] == {
        "strategy": "hami-core"
    }
    pod = next(o for o in result.to_json()["objects"] if o["kind"] == "Pod")
    assert pod["status"]["extendedResourceClaimStatus"]["requestMappings"] == [
        {
            "containerName": "cuda-container",
            "resourceName": "volcano.sh/vgpu-number",
            "requestName": "container-0-request-2",
        }
    ]


def test_volcano_memory_percentage_is_a_share_of_each_gpu() -> None:
    manifest = VOLCANO_JOB_POD.replace(
        "volcano.sh/vgpu-memory: 3000", "volcano.sh/vgpu-memory-percentage: 50"
    )
    result = run(manifest)
    node, _ = placed(result)["vgpu-pod"]
    memory = {"gpu-t4": 15360, "gpu-a10g": 23028}[node] // 2
    request = bridge_claim(result, "vgpu-pod")["spec"]["devices"]["requests"][0]
    assert request["exactly"]["capacity"]["requests"]["memory"] == f"{memory}Mi"


def test_mixing_hami_and_volcano_names_in_a_container_is_refused() -> None:
    manifest = VOLCANO_JOB_POD.replace("volcano.sh/vgpu-cores", "nvidia.com/gpucores")
    assert "mixes HAMi (nvidia.com/gpu, ...) and Volcano" in refused(run(manifest))["vgpu-pod"]


def test_volcano_and_hami_modes_that_disagree_are_refused() -> None:
    manifest = VOLCANO_JOB_POD.replace(
        '    volcano.sh/vgpu-mode: "hami-core"',
        '    volcano.sh/vgpu-mode: "hami-core"\n    nvidia.com/vgpu-mode: "mps"',
    )
    assert "disagree" in refused(run(manifest))["vgpu-pod"]


# --------------------------------------------------------------------------- KAI
# KAI Scheduler: pkg/common/constants/constants.go (GpuFraction = "gpu-fraction",
# GpuFractionContainerName, GpuMemory = "gpu-memory", GpuFractionsNumDevices, MpsAnnotation);
# pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go (0 < fraction < 1,
# gpu-memory a positive integer, not both); pkg/binder/common/gpu_access.go (the target
# container: gpu-fraction-container-name, else the first container). The kubelet gives a
# container the devices of a bridge-claim request only for an extended resource the container
# requests (kubernetes pkg/kubelet/cm/dra/manager.go, GetResources), so the target container
# names nvidia.com/gpu too.

KAI_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: gpu-sharing
  labels:
    kai.scheduler/queue: team-a
  annotations:
{annotations}
spec:
  schedulerName: biaxial
  containers:
    - name: sidecar
      image: busybox
    - name: gpu-workload
      image: nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0
      resources:
        limits:
          nvidia.com/gpu: {gpus}
"""


def kai(annotations: dict[str, str], gpus: int = 1) -> str:
    text = "\n".join(f'    {k}: "{v}"' for k, v in annotations.items())
    return KAI_POD.format(annotations=text, gpus=gpus)


def test_kai_fraction_is_a_share_of_the_target_containers_gpu() -> None:
    result = run(kai({"gpu-fraction": "0.5", "gpu-fraction-container-name": "gpu-workload"}))
    node, _ = placed(result)["gpu-sharing"]
    memory = {"gpu-t4": 15360, "gpu-a10g": 23028}[node] // 2
    request = bridge_claim(result, "gpu-sharing")["spec"]["devices"]["requests"][0]
    assert request["name"] == "container-1-request-0"
    assert request["exactly"]["capacity"] == {"requests": {"memory": f"{memory}Mi"}}


def test_kai_gpu_memory_is_mib() -> None:
    result = run(kai({"gpu-memory": "2000", "gpu-fraction-container-name": "gpu-workload"}))
    request = bridge_claim(result, "gpu-sharing")["spec"]["devices"]["requests"][0]
    assert request["exactly"]["capacity"] == {"requests": {"memory": "2000Mi"}}


def test_kai_num_devices_and_mps() -> None:
    result = run(
        kai(
            {
                "gpu-fraction": "0.25",
                "gpu-fraction-num-devices": "2",
                "gpu-fraction-container-name": "gpu-workload",
            },
            gpus=2,
        )
    )
    assert len(placed(result)["gpu-sharing"][1]) == 2
    result = run(
        kai({"gpu-memory": "1000", "mps": "true", "gpu-fraction-container-name": "gpu-workload"})
    )
    sharing = bridge_claim(result, "gpu-sharing")["spec"]["devices"]["config"][0]["opaque"]
    assert sharing["parameters"]["sharing"] == {"strategy": "mps"}


@pytest.mark.parametrize(
    ("annotations", "gpus", "message"),
    [
        (
            {"gpu-fraction": "0.5"},
            1,
            (
                "pod default/gpu-sharing container sidecar: annotation gpu-fraction: add "
                "nvidia.com/gpu: 1 to this container's resources.limits"
            ),
        ),
        ({"gpu-fraction": "1.5"}, 1, "must be a number greater than 0 and smaller than 1"),
        ({"gpu-fraction": "half"}, 1, "must be a number greater than 0 and smaller than 1"),
        ({"gpu-memory": "2Gi"}, 1, "must be a positive whole number of MiB"),
        ({"gpu-fraction": "0.5", "gpu-memory": "100"}, 1, "give one or the other"),
        (
            {"gpu-fraction-num-devices": "2"},
            1,
            "annotation gpu-fraction-num-devices: given without gpu-fraction or gpu-memory",
        ),
        (
            {
                "gpu-fraction": "0.5",
                "gpu-fraction-num-devices": "2",
                "gpu-fraction-container-name": "gpu-workload",
            },
            1,
            "gpu-fraction-num-devices is 2, but the container asks for 1 GPU(s)",
        ),
        (
            {"gpu-fraction": "0.5", "gpu-fraction-container-name": "trainer"},
            1,
            "no container named 'trainer' (containers: sidecar, gpu-workload)",
        ),
        ({"mps": "true"}, 1, "KAI's MPS switch needs gpu-fraction or gpu-memory"),
    ],
)
def test_kai_requests_biaxial_cannot_honour_are_refused(
    annotations: dict[str, str], gpus: int, message: str
) -> None:
    reason = refused(run(kai(annotations, gpus)))["gpu-sharing"]
    assert message in reason


def test_kai_fraction_parses_like_go_floats() -> None:
    hints = pod_hints(
        {
            "metadata": {"annotations": {"gpu-fraction": ".25"}},
            "spec": {"containers": [{"name": "a"}]},
        }
    )
    assert hints.kai is not None
    assert hints.kai.memory_fraction == Fraction(1, 4)


# --------------------------------------------------------------------------- units


def test_cluster_checks_name_the_annotation() -> None:
    inventory = GpuInventory(
        uuids=frozenset({"GPU-a"}), product_names=frozenset({"Tesla T4"}), mig_parents=frozenset()
    )
    with pytest.raises(ManifestError, match=r"volcano\.sh/vgpu-use-gpuuuid: no GPU"):
        check_against_cluster(
            pod_hints({"metadata": {"annotations": {"volcano.sh/vgpu-use-gpuuuid": "GPU-b"}}}),
            inventory,
        )
    check_against_cluster(
        pod_hints({"metadata": {"annotations": {"nvidia.com/use-gpuuuid": "GPU-a"}}}), inventory
    )


@pytest.mark.parametrize(
    ("annotations", "reads"),
    [
        ({}, False),
        ({"nvidia.com/nouse-gpuuuid": "GPU-x"}, False),
        ({"nvidia.com/nouse-gputype": "A100"}, False),
        ({"volcano.sh/vgpu-nouse-gpuuuid": "GPU-x"}, False),
        ({"nvidia.com/numa-bind": "true"}, False),
        ({"nvidia.com/vgpu-mode": "hami-core"}, False),
        ({"nvidia.com/use-gpuuuid": "GPU-x"}, True),
        ({"volcano.sh/vgpu-use-gpuuuid": "GPU-x"}, True),
        ({"nvidia.com/use-gputype": "A100"}, True),
        ({"nvidia.com/vgpu-mode": "mig"}, True),
        ({"volcano.sh/vgpu-mode": "mig"}, True),
    ],
)
def test_hints_that_do_not_read_the_inventory_are_never_refused_by_it(
    annotations: dict[str, str], reads: bool
) -> None:
    """The engine reads the cluster's GPU inventory only for hints that ask for it:
    ``reads_inventory`` false means the cluster check refuses nothing, whatever the GPUs."""
    hints = pod_hints({"metadata": {"annotations": annotations}})
    assert hints.reads_inventory is reads
    if reads:
        with pytest.raises(ManifestError):
            check_against_cluster(hints, GpuInventory())
    else:
        check_against_cluster(hints, GpuInventory())


def test_gpumem_with_a_unit_says_it_is_mib() -> None:
    manifest = UUID_POD.format(key="example.com/x", value="y").replace(
        "nvidia.com/gpu: 1", "nvidia.com/gpu: 1\n          nvidia.com/gpumem: 4Gi"
    )
    assert refused(run(manifest))["pinned"].endswith(
        "(nvidia.com/gpumem is a number of MiB, so 4Gi reads as 4294967296 MiB; for 4Gi write 4096)"
    )


def test_a_gpu_count_beyond_int64_is_too_large_not_fractional() -> None:
    manifest = UUID_POD.format(key="example.com/x", value="y").replace(
        "nvidia.com/gpu: 1", "nvidia.com/gpu: 99999999999999999999999"
    )
    assert "is too large (at most 9223372036854775807)" in refused(run(manifest))["pinned"]


def test_hamis_own_gpu_policies_are_named_as_unsupported() -> None:
    # HAMi pkg/util/types.go: GPUSchedulerPolicyTopology "topology-aware", Mutex "mutex", Numa
    # "numa", chained in comma lists (util.PolicyContains).
    manifest = UUID_POD.format(key="hami.io/gpu-scheduler-policy", value="spread,mutex")
    assert refused(run(manifest))["pinned"] == (
        "annotation hami.io/gpu-scheduler-policy: unknown policy 'spread,mutex' (allowed: "
        "binpack, spread; HAMi's mutex, numa, topology-aware GPU policies (and lists of them) "
        "are not supported)"
    )


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("nvidia.com/gpumem", "3000", '"3000"'),
        ("volcano.sh/vgpu-memory", "3000", '"3000"'),
        ("nvidia.com/gpucores", "50", '"50"'),
        ("nvidia.com/mig-3g.20gb", "1", '"1"'),
        ("volcano.sh/gpu-number", "1" * 30, '"' + "1" * 20 + '..."'),
    ],
)
def test_a_resource_written_as_an_annotation_is_sent_to_resources_limits(
    key: str, value: str, shown: str
) -> None:
    # Before: "annotation nvidia.com/gpumem: not a key biaxial knows; did you mean
    # nvidia.com/vgpu-mode?" (volcano.sh/vgpu-memory: "... did you mean volcano.sh/vgpu-mode?").
    reason = refused(run(UUID_POD.format(key=key, value=value)))["pinned"]
    assert reason == (
        f"annotation {key}: a resource, not an annotation; write {key}: {shown} under the "
        "container's resources.limits"
    )


def test_every_bridge_resource_is_known_as_a_resource_name() -> None:
    from driver.scheduling.bridge import LEGACY_RESOURCES
    from driver.scheduling.dialects import RESOURCE_NAMES

    assert LEGACY_RESOURCES <= RESOURCE_NAMES

"""Claims written for other DRA drivers, and capacity requests no device can honour, are
refused with the reason before any node is tried (``driver.scheduling.checks``).

The manifests are written for these tests in the style of the NVIDIA DRA driver's
``demo/specs/quickstart`` and the DRA example driver's ``demo/examples``: the NVIDIA driver's
classes are ``gpu.nvidia.com`` / ``mig.nvidia.com`` and its config ``GpuConfig`` of
``resource.nvidia.com/v1beta1`` (``sharing.strategy`` TimeSlicing | MPS); the example driver's
GPUs have the capacities ``memory`` and ``compute`` (``internal/profiles/gpu/gpu.go``).
Upstream's allocator refuses a negative capacity request ("has negative requested quantity")
and lets a device without the capacity simply not match; biaxial names both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.simulate.manifests import load_objects
from biaxial.simulate.simulator import simulate

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    o for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for o in load_objects([str(p)])
]
CLUSTER = load_objects([str(ROOT / "examples" / "requesting-gpus" / "cluster.yaml")])


def reasons(manifests: str) -> dict[str, str]:
    objects = [d for d in yaml.safe_load_all(manifests) if d]
    result = simulate([*CLUSTER, *objects], default_classes=CLASSES)
    return {f.pod.split("/")[1]: f.reason for f in result.unschedulable} | {
        p.pod.split("/")[1]: "placed" for p in result.placements
    }


def claim_pod(devices: dict[str, Any], name: str = "test-pod") -> str:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {"spec": {"devices": devices}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedulerName": "biaxial",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [
                {
                    "name": "ctr0",
                    "image": "ubuntu:22.04",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    return yaml.safe_dump_all([template, pod])


def exactly(**fields: Any) -> dict[str, Any]:
    return {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.biaxial.dev", **fields}}]
    }


def test_another_drivers_class_names_biaxials() -> None:
    reason = reasons(claim_pod(exactly(deviceClassName="gpu.nvidia.com")))["test-pod"]
    assert reason == (
        "claim default/test-pod-gpu-"
        + reason.split("test-pod-gpu-")[1].split(":")[0]
        + ": request 'gpu': DeviceClass 'gpu.nvidia.com' does not exist (gpu.nvidia.com is the "
        "NVIDIA DRA driver's class; biaxial's is gpu.biaxial.dev)"
    )
    assert (
        "mig.nvidia.com is the NVIDIA DRA driver's class; biaxial's is mig.biaxial.dev"
        in (reasons(claim_pod(exactly(deviceClassName="mig.nvidia.com")))["test-pod"])
    )
    assert (
        "DeviceClass 'gpu.biaxal.dev' does not exist; did you mean gpu.biaxial.dev?"
        in (reasons(claim_pod(exactly(deviceClassName="gpu.biaxal.dev")))["test-pod"])
    )


def test_the_example_drivers_compute_capacity_is_named_not_insufficient_memory() -> None:
    reason = reasons(claim_pod(exactly(capacity={"requests": {"compute": "10"}})))["test-pod"]
    assert reason.endswith(
        "request 'gpu': GPU devices have no capacity 'compute' (they have cores, memory)"
    )


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ({"memory": "-1Gi"}, "capacity.requests['memory']: -1Gi is negative"),
        ({"cores": "-5"}, "capacity.requests['cores']: -5 is negative"),
        (
            {"memory": "0"},
            "capacity.requests['memory']: 0 is below the smallest share the devices allow (1Mi)",
        ),
        (
            {"memory": "6"},
            (
                "capacity.requests['memory']: 6 is below the smallest share the devices allow "
                "(1Mi) (memory is in bytes: did you mean 6Mi or 6Gi?)"
            ),
        ),
    ],
)
def test_capacity_amounts_no_device_honours_are_refused(
    requests: dict[str, str], message: str
) -> None:
    assert reasons(claim_pod(exactly(capacity={"requests": requests})))["test-pod"].endswith(
        message
    )


def test_zero_cores_is_the_documented_default_and_fine() -> None:
    assert (
        reasons(claim_pod(exactly(capacity={"requests": {"memory": "1Gi", "cores": "0"}})))[
            "test-pod"
        ]
        == "placed"
    )


def test_another_drivers_config_is_refused_with_the_translation() -> None:
    devices = exactly()
    devices["config"] = [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": "gpu.nvidia.com",
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS"},
                },
            },
        }
    ]
    reason = reasons(claim_pod(devices))["test-pod"]
    assert (
        "spec.devices.config[0]: configuration for the NVIDIA DRA driver, which publishes no "
        in reason
    )
    assert "sharing.strategy none (for TimeSlicing), mps (for MPS) or hami-core" in reason


def test_another_drivers_config_relabelled_as_ours_is_refused_at_scheduling() -> None:
    devices = exactly()
    devices["config"] = [
        {
            "opaque": {
                "driver": "gpu.biaxial.dev",
                "parameters": {
                    "apiVersion": "gpu.resource.example.com/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing"},
                },
            }
        }
    ]
    reason = reasons(claim_pod(devices))["test-pod"]
    assert "spec.devices.config[0] opaque.parameters: apiVersion: expected" in reason


def test_a_selector_in_another_drivers_domain_is_refused() -> None:
    selector = {
        "cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'Tesla T4'"}
    }
    reason = reasons(claim_pod(exactly(selectors=[selector])))["test-pod"]
    assert (
        "the selector names gpu.nvidia.com, the NVIDIA DRA driver, which publishes no device"
        in reason
    )
    assert "with the same attribute names" in reason


def legacy_pod(limits: dict[str, Any], name: str = "test-pod") -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "schedulerName": "biaxial",
                "containers": [
                    {"name": "ctr0", "image": "ubuntu:22.04", "resources": {"limits": limits}}
                ],
            },
        }
    )


def test_a_mig_profile_no_node_has_is_named_with_the_request() -> None:
    # Before: "0/2 nodes are available: 2 cannot allocate all claims." and nothing else.
    # The h100-80gbx8 node has MIG partitions, none of them 3g.20gb (an A100 40GB profile).
    reason = reasons(legacy_pod({"nvidia.com/mig-3g.20gb": 1}))["test-pod"]
    assert reason == (
        "0/2 nodes are available: 2 cannot allocate all claims. pod default/test-pod container "
        "ctr0: nvidia.com/mig-3g.20gb: 1: no node has a MIG 3g.20gb partition; the selectors of "
        "DeviceClass 'mig-3g.20gb.biaxial.dev' match no device in the cluster"
    )
    assert reasons(legacy_pod({"nvidia.com/mig-3g.40gb": 1}))["test-pod"] == "placed"


def test_a_class_whose_selectors_match_no_device_says_so() -> None:
    # Before: "0/2 nodes are available: 2 cannot allocate all claims."
    a100 = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "a100.example.com"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": 'device.driver == "gpu.biaxial.dev" && '
                        'device.attributes["gpu.biaxial.dev"].productName.startsWith("NVIDIA A100")'
                    }
                }
            ]
        },
    }
    pod = claim_pod(exactly(deviceClassName="a100.example.com"))
    reason = reasons(yaml.safe_dump(a100) + "---\n" + pod)["test-pod"]
    claim = reason.split("claim ")[1].split(":")[0]
    assert reason == (
        f"0/2 nodes are available: 2 cannot allocate all claims. claim {claim}: request 'gpu': "
        "the selectors of DeviceClass 'a100.example.com' match no device in the cluster"
    )
    # A firstAvailable request is served by any alternative that matches.
    either = {
        "requests": [
            {
                "name": "gpu",
                "firstAvailable": [
                    {"name": "a100", "deviceClassName": "a100.example.com"},
                    {"name": "any", "deviceClassName": "gpu.biaxial.dev"},
                ],
            }
        ]
    }
    assert reasons(yaml.safe_dump(a100) + "---\n" + claim_pod(either))["test-pod"] == "placed"


def test_a_passthrough_class_is_said_to_be_unsupported() -> None:
    # Before: "... DeviceClass 'vfio.gpu.nvidia.com' does not exist".
    reason = reasons(claim_pod(exactly(deviceClassName="vfio.gpu.nvidia.com")))["test-pod"]
    assert reason.endswith(
        "DeviceClass 'vfio.gpu.nvidia.com' does not exist; vfio.gpu.nvidia.com asks for GPU "
        "passthrough (vfio-pci, whole GPUs handed to virtual machines), which biaxial does not "
        "offer: its devices are GPUs and MIG partitions for containers"
    )


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"volcano.sh/gpu-memory": 3000},
            (
                "pod default/test-pod: volcano.sh/gpu-memory (MiB of one shared GPU) is Volcano's "
                "GPU-share resource, deprecated since Volcano 1.9 and served by no node here; "
                "write volcano.sh/vgpu-number: 1 with volcano.sh/vgpu-memory: <MiB>"
            ),
        ),
        (
            {"volcano.sh/gpu-number": 1},
            (
                "pod default/test-pod: volcano.sh/gpu-number (whole GPUs) is Volcano's GPU-share "
                "resource, deprecated since Volcano 1.9 and served by no node here; write "
                "volcano.sh/vgpu-number: <GPUs>"
            ),
        ),
    ],
)
def test_volcanos_deprecated_gpu_share_resources_point_to_vgpu(
    limits: dict[str, Any], message: str
) -> None:
    # Before: "0/2 nodes are available: 2 Insufficient volcano.sh/gpu-memory." (gpu-number alike)
    assert reasons(legacy_pod(limits))["test-pod"] == message

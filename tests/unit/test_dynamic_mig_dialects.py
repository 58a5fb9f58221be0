"""Legacy and dialect requests on dynamic MIG: ``nvidia.com/mig-<profile>`` through a class per
profile, and HAMi's / Volcano's ``vgpu-mode: mig`` with a memory request, which gets the
smallest profile that holds it (the GPU axis ranks a request's MIG placements smallest profile
first, under either GPU policy; docs/scoring.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from biaxial.simulate.manifests import load_objects
from biaxial.simulate.simulator import SimulationResult, simulate
from driver.scheduling.policy import GpuPolicy, PolicyDefaults

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    o for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for o in load_objects([str(p)])
]
INVENTORY = {
    "apiVersion": "biaxial.dev/v1alpha1",
    "kind": "Cluster",
    "nodes": [{"name": "a", "gpus": "a100-80gbx8-dynmig"}],
}


def pod(name: str, limits: dict[str, int], annotations: dict[str, str] | None = None) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "schedulerName": "biaxial",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
        },
    }


def run(pods: list[Any], gpu: GpuPolicy = "binpack") -> SimulationResult:
    result = simulate([INVENTORY, *pods], default_classes=CLASSES, defaults=PolicyDefaults(gpu=gpu))
    assert not result.unschedulable, result.unschedulable
    return result


def devices(result: SimulationResult) -> dict[str, str]:
    return {p.pod.split("/")[1]: str(p.devices[0]["device"]) for p in result.placements}


def test_legacy_mig_resources_work_on_dynamic_mig() -> None:
    pods = [
        pod(f"legacy-{i}", {f"nvidia.com/mig-{profile}": 1})
        for i, profile in enumerate(("1g.10gb", "3g.40gb", "7g.80gb"))
    ]
    assert devices(run(pods)) == {
        "legacy-0": "gpu-0-mig-1g10gb-6",
        "legacy-1": "gpu-0-mig-3g40gb-0",
        "legacy-2": "gpu-1-mig-7g80gb-0",
    }


# memory asked (MiB) -> the smallest A100-80GB profile holding it (1g.10gb: 9728 MiB,
# 1g.20gb / 2g.20gb: 19968, 3g.40gb / 4g.40gb: 40192, 7g.80gb: 80896; at equal memory the one
# with fewer compute slices is smaller).
SMALLEST = {5000: "1g.10gb", 9728: "1g.10gb", 15000: "1g.20gb", 25000: "3g.40gb", 45000: "7g.80gb"}


@pytest.mark.parametrize("gpu", ["binpack", "spread"])
@pytest.mark.parametrize(
    ("mode", "count", "memory"),
    [
        ("nvidia.com/vgpu-mode", "nvidia.com/gpu", "nvidia.com/gpumem"),
        ("volcano.sh/vgpu-mode", "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory"),
    ],
)
def test_vgpu_mode_mig_gets_the_smallest_profile_that_fits(
    gpu: GpuPolicy, mode: str, count: str, memory: str
) -> None:
    pods = [
        pod(f"p{i}-{mib}", {count: 1, memory: mib}, {mode: "mig"}) for i, mib in enumerate(SMALLEST)
    ]
    got = devices(run(pods, gpu))
    profiles = {name: device.split("-mig-")[1].rsplit("-", 1)[0] for name, device in got.items()}
    expected = {
        f"p{i}-{mib}": profile.replace(".", "") for i, (mib, profile) in enumerate(SMALLEST.items())
    }
    assert profiles == expected


def test_the_smallest_profile_wins_on_a_cut_gpu_too() -> None:
    # Binpack keeps filling gpu-0; each request still gets the smallest profile that fits
    # what is left there, never a larger one that happens to fit.
    pods = [
        pod(
            f"p{i}",
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 9000},
            {"nvidia.com/vgpu-mode": "mig"},
        )
        for i in range(7)
    ]
    got = devices(run(pods))
    assert sorted(got.values()) == [f"gpu-0-mig-1g10gb-{s}" for s in range(7)]

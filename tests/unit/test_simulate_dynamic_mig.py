"""``biaxial simulate`` with dynamic MIG: what fits, where, and what the run reports.

Acceptance (A100-80GB and H100-80GB): seven ``1g.10gb`` claims fit a GPU and an eighth does
not; a ``7g.80gb`` claim fits only on an uncut GPU; binpack leaves room for a ``4g`` and a
``3g`` where first-fit does not; whole-GPU and share claims never land on a GPU with a live
partition. (The arrivals-and-deletions sequence is pinned at the decision engine in
``tests/unit/test_scoring_mig.py``: the simulator has no deletions.)"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from biaxial.commands.simulate import render_table
from biaxial.simulate.manifests import load_objects
from biaxial.simulate.plot import plot
from biaxial.simulate.simulator import SimulationResult, simulate
from driver.discovery.fake import builtin_profiles
from driver.scheduling.policy import GpuPolicy, PolicyDefaults

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    o for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for o in load_objects([str(p)])
]
PROFILES = ROOT / "driver" / "discovery" / "profiles"


def profile_file(tmp_path: Path, name: str, gpus: int) -> str:
    """A built-in dynamic profile cut down to ``gpus`` GPUs, as a profile file."""
    assert name in builtin_profiles()
    text = (PROFILES / f"{name}.yaml").read_text()
    head, _, rest = text.partition("gpus:\n")
    rows = [line for line in rest.splitlines() if line.startswith("  - ")]
    tail = rest[rest.index("migProfiles:") :]
    path = tmp_path / f"{name}-{gpus}.yaml"
    path.write_text(head + "gpus:\n" + "\n".join(rows[:gpus]) + "\n" + tail)
    return str(path)


def cluster(*nodes: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "biaxial.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [{"name": name, "gpus": profile} for name, profile in nodes],
    }


def mig_template(profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"mig-{profile.replace('.', '-').replace('+', '-')}"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "mig",
                            "exactly": {
                                "deviceClassName": "mig.biaxial.dev",
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": 'device.attributes["gpu.biaxial.dev"]'
                                            f'.profile == "{profile}"'
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }


def mig_pod(name: str, profile: str) -> dict[str, Any]:
    template = mig_template(profile)["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "biaxial",
            "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": template}],
            "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "mig"}]}}],
        },
    }


def legacy_pod(name: str, memory_mib: int | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": 1}
    if memory_mib is not None:
        limits["nvidia.com/gpumem"] = memory_mib
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "biaxial",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
        },
    }


def run(
    nodes: list[tuple[str, str]], pods: list[dict[str, Any]], gpu: GpuPolicy = "binpack"
) -> SimulationResult:
    profiles = {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me"}
    objects = [cluster(*nodes), *(mig_template(p) for p in sorted(profiles)), *pods]
    return simulate(objects, default_classes=CLASSES, defaults=PolicyDefaults(gpu=gpu))


def placed(result: SimulationResult) -> dict[str, str]:
    return {p.pod.split("/")[1]: str(p.devices[0]["device"]) for p in result.placements}


def refused(result: SimulationResult) -> set[str]:
    return {f.pod.split("/")[1] for f in result.unschedulable}


@pytest.mark.parametrize("name", ["a100-80gbx8-dynmig", "h100-80gbx8-dynmig"])
def test_seven_1g_partitions_fit_one_gpu_and_an_eighth_does_not(tmp_path: Path, name: str) -> None:
    result = run(
        [("one-gpu", profile_file(tmp_path, name, 1))],
        [mig_pod(f"nb-{i}", "1g.10gb") for i in range(8)],
    )
    assert sorted(placed(result).values()) == [f"gpu-0-mig-1g10gb-{s}" for s in range(7)]
    assert refused(result) == {"nb-7"}
    (row,) = result.gpus
    assert (row.memory_slices, row.free_slices, row.largest_placeable) == (8, 1, "")
    assert len(row.partitions) == 7


@pytest.mark.parametrize("name", ["a100-80gbx8-dynmig", "h100-80gbx8-dynmig"])
def test_a_7g_partition_fits_only_on_an_uncut_gpu(tmp_path: Path, name: str) -> None:
    result = run(
        [("two-gpus", profile_file(tmp_path, name, 2))],
        [mig_pod("small", "1g.10gb"), mig_pod("big", "7g.80gb"), mig_pod("bigger", "7g.80gb")],
    )
    assert placed(result) == {"small": "gpu-0-mig-1g10gb-6", "big": "gpu-1-mig-7g80gb-0"}
    assert refused(result) == {"bigger"}


# Arrivals only (the simulator places pods in input order): binpack cuts one GPU, first-fit
# cuts both, so only binpack still has room for a 4g.40gb and a 3g.40gb afterwards.
ARRIVALS = [
    ("a", "1g.20gb"),
    ("b", "2g.20gb"),
    ("c", "1g.10gb"),
    ("d", "2g.20gb"),
    ("e", "1g.10gb"),
]


def test_binpack_keeps_room_for_a_4g_and_a_3g_that_first_fit_loses(tmp_path: Path) -> None:
    two = profile_file(tmp_path, "a100-80gbx8-dynmig", 2)
    pods = [*(mig_pod(n, p) for n, p in ARRIVALS), mig_pod("four", "4g.40gb")]
    pods.append(mig_pod("three", "3g.40gb"))
    packed = run([("n", two)], pods, "binpack")
    assert not packed.unschedulable
    assert placed(packed)["four"] == "gpu-1-mig-4g40gb-0"
    naive = run([("n", two)], pods, "first-fit")
    assert refused(naive) == {"four"}


def test_whole_gpu_and_share_claims_never_land_beside_a_partition(tmp_path: Path) -> None:
    two = profile_file(tmp_path, "h100-80gbx8-dynmig", 2)
    result = run(
        [("n", two)],
        [
            mig_pod("part", "2g.20gb"),
            legacy_pod("whole"),
            legacy_pod("share", 10000),
            mig_pod("late-part", "1g.10gb"),
        ],
    )
    assert placed(result) == {
        "part": "gpu-0-mig-2g20gb-4",
        "whole": "gpu-1",
        "late-part": "gpu-0-mig-1g10gb-6",
    }
    assert refused(result) == {"share"}  # gpu-0 is cut, gpu-1 taken whole


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_mixes_keep_partitions_and_whole_or_shared_use_apart(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    two = profile_file(tmp_path, "a100-80gbx8-dynmig", 3)
    kinds = ["1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "whole", "share"]
    pods = []
    for i in range(30):
        kind = rng.choice(kinds)
        if kind == "whole":
            pods.append(legacy_pod(f"p{i}"))
        elif kind == "share":
            pods.append(legacy_pod(f"p{i}", rng.choice((5000, 20000, 40000))))
        else:
            pods.append(mig_pod(f"p{i}", kind))
    result = run([("n", two), ("m", two)], pods, rng.choice(("binpack", "spread")))
    assert result.placements
    for row in result.gpus:
        partition_pods = {pod for p in row.partitions for pod in p.pods}
        other_pods = {p for p, _ in row.pods} - partition_pods
        assert not (partition_pods and other_pods), row
        assert all(p.start is not None for p in row.partitions), row
        slots = [s for p in row.partitions for s in range(p.start or 0, (p.start or 0) + p.size)]
        assert len(slots) == len(set(slots)), row
        assert sum(p.profile.endswith("+me") for p in row.partitions) <= 1


def test_the_run_reports_partitions_slots_and_fragmentation(tmp_path: Path) -> None:
    two = profile_file(tmp_path, "a100-80gbx8-dynmig", 2)
    result = run([("n", two)], [mig_pod("a", "3g.40gb"), legacy_pod("s", 20000)])
    summary = result.summary()
    cut, shared = summary["gpus"]
    assert cut["migPartitions"] == [
        {
            "device": "gpu-0-mig-3g40gb-4",
            "profile": "3g.40gb",
            "memoryBytes": 40192 * 2**20,  # the profile table's 3g.40gb
            "pods": ["default/a"],
            "start": 4,
            "size": 4,
        }
    ]
    assert (cut["memorySlices"], cut["freeMemorySlices"], cut["largestPlaceable"]) == (
        8,
        4,
        "4g.40gb",
    )
    assert shared["freeMemorySlices"] == 0
    assert "migPartitions" not in shared
    assert summary["mig"] == {
        "dynamicGpus": 2,
        "partitions": 1,
        "memorySlices": 16,
        "freeMemorySlices": 4,
        "freeMemorySlicesOnCutGpus": 4,
    }
    # Free memory in MIG slots: half of the cut GPU, and what the share leaves on the other;
    # both are on GPUs in use, so all of it is fragmented.
    assert summary["fragmentation"] == 1.0
    assert summary["wholeGpusFree"] == 0
    table = render_table(result)
    assert re.search(r"gpu-0 .* MIG +4/8 \(4g\.40gb\)", table)  # free slices, largest
    assert re.search(r"\n +gpu-0-mig-3g40gb-4 +3g\.40gb .* default/a", table)  # under its GPU
    assert re.search(r"gpu-1 .* default/s +0/8 \(none placeable\)", table)


def test_plot_draws_partitions_inside_their_gpu(tmp_path: Path) -> None:
    two = profile_file(tmp_path, "a100-80gbx8-dynmig", 2)
    result = run([("n", two)], [mig_pod("a", "3g.40gb"), mig_pod("b", "1g.10gb")])
    out = tmp_path / "mig.png"
    plot(result, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

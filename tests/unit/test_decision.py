"""The decision core: placements, per-node reasons, per-pod errors, and pruning == exhaustive."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from driver.scheduling.capacity_index import CapacityIndex
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement, PodError, Unschedulable
from driver.scheduling.policy import PolicyDefaults
from driver.scheduling.uniformity import ClassUniformity, referenced_names
from tests.unit.builders import (
    GPU_CLASS,
    claim,
    device_class,
    gpu,
    node,
    slice_,
    snapshot,
    taint,
    to_node,
)

GPU_CLASS_JSON = device_class(GPU_CLASS, extended_resource_name="nvidia.com/gpu")
NUMA = "resource.kubernetes.io/numaNode"


def legacy_pod(
    name: str,
    *,
    gpus: int = 1,
    gpumem: int | None = None,
    node_policy: str | None = None,
    gpu_policy: str | None = None,
) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus}
    if gpumem is not None:
        limits["nvidia.com/gpumem"] = str(gpumem)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {
                key: value
                for key, value in (
                    ("biaxial.dev/node-policy", node_policy),
                    ("biaxial.dev/gpu-policy", gpu_policy),
                )
                if value is not None
            },
        },
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def claim_pod(name: str, **policies: str) -> dict[str, Any]:
    pod = legacy_pod(name, **policies)
    pod["spec"]["containers"][0]["resources"] = {}
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    return pod


def gpu_node(
    name: str, count: int, memory: str = "16Gi", *, numa_split: bool = False, **kwargs: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    devices = [
        gpu(i, memory=memory, shared=True, numa=(i * 2 // count if numa_split else None))
        for i in range(count)
    ]
    return node(name, **kwargs), slice_(f"{name}-slice", node=name, devices=devices)


def engine(
    nodes: list[tuple[dict[str, Any], dict[str, Any]]], *, exhaustive: bool = False, **kwargs: Any
) -> DecisionEngine:
    snap = snapshot([s for _, s in nodes], classes=[GPU_CLASS_JSON])
    return DecisionEngine(snap, [to_node(n) for n, _ in nodes], exhaustive=exhaustive, **kwargs)


def place(eng: DecisionEngine, pod: dict[str, Any], claims: tuple[Any, ...] = ()) -> Any:
    before = copy.deepcopy(pod)
    decision = eng.decide(pod, claims)
    assert pod == before, "decide must not mutate the pod"
    if isinstance(decision, Placement):
        eng.assume(decision, pod)
    return decision


def devices_of(decision: Placement) -> list[str]:
    return [r.device for a in decision.all_results for r in a.results]


# --------------------------------------------------------------------------- the four patterns

PATTERNS = [
    (
        "binpack",
        "binpack",
        [("gpu-t4", "gpu-0"), ("gpu-t4", "gpu-0"), ("gpu-t4", "gpu-1"), ("gpu-t4", "gpu-1")],
    ),
    (
        "spread",
        "binpack",
        [("gpu-a10g", "gpu-0"), ("gpu-t4", "gpu-0"), ("gpu-a10g", "gpu-0"), ("gpu-t4", "gpu-0")],
    ),
    (
        "binpack",
        "spread",
        [("gpu-t4", "gpu-0"), ("gpu-t4", "gpu-1"), ("gpu-t4", "gpu-2"), ("gpu-t4", "gpu-3")],
    ),
    (
        "spread",
        "spread",
        [("gpu-a10g", "gpu-0"), ("gpu-t4", "gpu-0"), ("gpu-a10g", "gpu-1"), ("gpu-t4", "gpu-1")],
    ),
]


@pytest.mark.parametrize(("node_policy", "gpu_policy", "expected"), PATTERNS)
@pytest.mark.parametrize("exhaustive", [False, True])
def test_four_patterns_on_the_reference_cluster(
    node_policy: str, gpu_policy: str, expected: list[tuple[str, str]], exhaustive: bool
) -> None:
    eng = engine(
        [gpu_node("gpu-t4", 4, "15360Mi"), gpu_node("gpu-a10g", 4, "23028Mi")],
        exhaustive=exhaustive,
    )
    placed = []
    for i in range(4):
        pod = legacy_pod(
            f"p{i}",
            gpumem=7500,
            node_policy=node_policy,
            gpu_policy=gpu_policy,
        )
        decision = place(eng, pod)
        assert isinstance(decision, Placement), decision
        placed.append((decision.node, devices_of(decision)[0]))
    assert placed == expected


# --------------------------------------------------------------------------- reasons and errors


def test_unschedulable_reasons_read_like_kube_scheduler() -> None:
    eng = engine(
        [
            gpu_node("small", 1, "8Gi"),
            gpu_node("tainted", 2, "24Gi", taints=[taint("dedicated", value="infra")]),
            gpu_node("cordoned", 2, "24Gi", unschedulable=True),
        ]
    )
    decision = place(eng, legacy_pod("big", gpumem=12000))
    assert isinstance(decision, Unschedulable)
    assert decision.message == (
        "0/3 nodes are available: 1 insufficient GPU memory, "
        "1 node(s) had untolerated taint {dedicated: infra}, 1 node(s) were unschedulable."
    )


def test_whole_gpus_and_claim_reasons() -> None:
    eng = engine([gpu_node("a", 2)])
    assert isinstance(place(eng, legacy_pod("p0", gpus=2)), Placement)
    decision = place(eng, legacy_pod("p1"))
    assert isinstance(decision, Unschedulable)
    assert decision.message == "0/1 nodes are available: 1 insufficient free GPUs."


@pytest.mark.parametrize(
    ("pod_claim", "annotations", "message"),
    [
        (
            claim("c", uid="u").request("r", cls="no-such-class"),
            {},
            "DeviceClass 'no-such-class' does not exist",
        ),
        (claim("c", uid="u").request("r", selectors=["device.attributes[ 1"]), {}, "r"),
        (
            claim("c", uid="u").request("r"),
            {"biaxial.dev/gpu-policy": "tight"},
            "unknown policy 'tight'",
        ),
    ],
)
def test_bad_input_is_an_error_for_that_pod_only(
    pod_claim: Any, annotations: dict[str, str], message: str
) -> None:
    eng = engine([gpu_node("a", 2)])
    pod = claim_pod("bad")
    pod["metadata"]["annotations"] = annotations
    decision = place(eng, pod, (pod_claim.model(),))
    assert isinstance(decision, PodError)
    assert message in decision.message
    assert isinstance(place(eng, legacy_pod("good")), Placement)


def test_impossible_gpumem_is_an_error() -> None:
    eng = engine([gpu_node("a", 2, "16Gi")])
    decision = place(eng, legacy_pod("huge", gpumem=40000))
    assert isinstance(decision, PodError)
    assert "larger than every GPU in the cluster (largest: 16384 MiB)" in decision.message


def test_cel_runtime_error_is_an_error_not_a_mismatch() -> None:
    eng = engine([gpu_node("a", 2)])
    bad = claim("c", uid="u").request(
        "r", selectors=['device.attributes["gpu.biaxial.dev"].nosuch == 1']
    )
    decision = place(eng, claim_pod("p"), (bad.model(),))
    assert isinstance(decision, PodError), decision


def test_cpu_and_pod_fit() -> None:
    eng = engine([gpu_node("a", 2, allocatable={"cpu": "1", "memory": "1Gi", "pods": "1"})])
    pod = legacy_pod("p0")
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    decision = place(eng, pod)
    assert isinstance(decision, Unschedulable)
    assert decision.message == "0/1 nodes are available: 1 Insufficient cpu."
    assert isinstance(place(eng, legacy_pod("p1")), Placement)
    decision = place(eng, legacy_pod("p2"))
    assert isinstance(decision, Unschedulable)
    assert decision.message == "0/1 nodes are available: 1 Too many pods."


def test_multi_gpu_claim_with_numa_constraint() -> None:
    eng = engine([gpu_node("a", 4, numa_split=True)])
    two = (
        claim("p-gpu", uid="u2")
        .request("r", count=2, capacity={"memory": "4Gi"})
        .constraint(match=NUMA)
    )
    decision = place(eng, claim_pod("p"), (two.model(),))
    assert isinstance(decision, Placement)
    assert devices_of(decision) == ["gpu-0", "gpu-1"]


# --------------------------------------------------------------------------- pruning == exhaustive


def random_cluster(rng: random.Random) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    nodes = []
    for i in range(rng.randint(3, 7)):
        memory = rng.choice(["16Gi", "24Gi"])
        count = rng.choice([2, 4])
        taints = [taint("t", value="v")] if rng.random() < 0.15 else []
        nodes.append(gpu_node(f"n{i}", count, memory, numa_split=rng.random() < 0.5, taints=taints))
    if rng.random() < 0.5:
        nodes.append((node("cpu-only"), slice_("cpu-only-empty", node="cpu-only", devices=[])))
    return nodes


def random_pod(rng: random.Random, i: int) -> tuple[dict[str, Any], tuple[Any, ...]]:
    node_policy = rng.choice(["binpack", "spread"])
    gpu_policy = rng.choice(["binpack", "spread"])
    kind = rng.random()
    if kind < 0.5:
        pod = legacy_pod(
            f"p{i}",
            gpus=rng.choice([1, 1, 2]),
            gpumem=rng.choice([None, 2000, 6000, 12000]),
            node_policy=node_policy,
            gpu_policy=gpu_policy,
        )
        return pod, ()
    pod = claim_pod(f"p{i}", node_policy=node_policy, gpu_policy=gpu_policy)
    builder = claim(f"p{i}-gpu", uid=f"uid-c{i}")
    count = rng.choice([1, 2])
    capacity = rng.choice(
        [
            None,
            {"memory": "3Gi"},
            {"memory": "5Gi", "cores": "25"},
            {"memory": "2Gi", "cores": "60"},
        ]
    )
    builder.request("r", count=count, capacity=capacity)
    if count > 1 and rng.random() < 0.5:
        builder.constraint(match=NUMA)
    return pod, (builder.model(),)


@pytest.mark.parametrize("seed", range(12))
def test_pruned_equals_exhaustive(seed: int) -> None:
    rng = random.Random(seed)
    nodes = random_cluster(rng)
    pruned = engine(nodes)
    reference = engine(nodes, exhaustive=True)
    for i in range(30):
        pod, claims = random_pod(rng, i)
        got = place(pruned, pod, claims)
        want = place(reference, pod, claims)
        assert type(got) is type(want), (i, got, want)
        if isinstance(want, Placement):
            assert isinstance(got, Placement)
            assert (got.node, got.all_results) == (want.node, want.all_results), i
            assert got.score == want.score
        else:
            assert got == want
    assert pruned.stats.allocator_calls <= reference.stats.allocator_calls


def test_pruning_visits_few_nodes() -> None:
    nodes = [gpu_node(f"n{i:03d}", 8) for i in range(200)]
    eng = engine(nodes, defaults=PolicyDefaults(node="binpack", gpu="binpack"))
    for i in range(20):
        assert isinstance(place(eng, legacy_pod(f"p{i}", gpumem=3000)), Placement)
    assert eng.stats.nodes_evaluated <= 20 * 3
    spread = engine(nodes, defaults=PolicyDefaults(node="spread", gpu="spread"))
    for i in range(20):
        assert isinstance(place(spread, legacy_pod(f"p{i}", gpumem=3000)), Placement)
    assert spread.stats.nodes_evaluated <= 20 * 3


# --------------------------------------------------------------------------- CEL uniformity


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ('device.driver == "gpu.biaxial.dev"', {"device", "driver"}),
        ('device.attributes["gpu.biaxial.dev"].uuid.startsWith("GPU-1")', {"uuid", "startsWith"}),
        ('device.attributes["a" + "b"].x == 1', None),
        ('size(device.attributes["gpu.biaxial.dev"]) > 3', None),
        ('device.attributes["gpu.biaxial.dev"].exists(k, k == "uuid")', None),
        ('has(device.attributes["gpu.biaxial.dev"].uuid)', None),
        ('"x" in device.attributes["gpu.biaxial.dev"]', None),
        ('device.attributes[?"gpu.biaxial.dev"].uuid == "a"', None),
        ('device.attributes["gpu\\x2ebiaxial.dev"].uuid == "a"', None),
    ],
)
def test_referenced_names_are_conservative(expression: str, names: set[str] | None) -> None:
    found = referenced_names(expression)
    if names is None:
        assert found is None
    else:
        assert found is not None
        assert names <= found


@pytest.mark.parametrize(
    ("selector", "uniform"),
    [
        ('device.driver == "gpu.biaxial.dev"', True),
        ('device.attributes["gpu.biaxial.dev"].uuid != "GPU-00000003"', False),
        ('device.attributes["gpu.biaxial.dev"].index < 3', False),
        ('device.attributes["gpu.biaxial.dev"].productName == "Tesla T4"', True),
        ('device.attributes["gpu.biaxial.dev"].exists(k, k == "index")', True),
    ],
)
def test_class_uniformity_matches_a_full_sweep(selector: str, uniform: bool) -> None:
    nodes = [gpu_node("a", 2), gpu_node("b", 4)]
    snap = snapshot(
        [s for _, s in nodes],
        classes=[device_class("picky", selectors=[selector])],
    )
    index = CapacityIndex(snap, [to_node(n) for n, _ in nodes])
    assert ClassUniformity(snap, index).uniform(frozenset({"picky"})) is uniform


def test_forget_undoes_assume() -> None:
    eng = engine([gpu_node("a", 1)])
    pod = legacy_pod("p0")
    first = place(eng, pod)
    assert isinstance(first, Placement)
    assert isinstance(place(eng, legacy_pod("p1")), Unschedulable)
    eng.forget(first, pod)
    again = place(eng, legacy_pod("p1"))
    assert isinstance(again, Placement)
    assert devices_of(again) == ["gpu-0"]


def test_device_plugin_nodes_skip_the_bridge() -> None:
    plugin_node = node(
        "plugin", allocatable={"cpu": "8", "memory": "8Gi", "pods": "10", "nvidia.com/gpu": "2"}
    )
    eng = engine([gpu_node("dra", 2), (plugin_node, slice_("empty", node="other", devices=[]))])
    placements = [place(eng, legacy_pod(f"p{i}", gpus=2)) for i in range(3)]
    assert [type(p).__name__ for p in placements] == ["Placement", "Placement", "Unschedulable"]
    by_node = {p.node: p for p in placements if isinstance(p, Placement)}
    assert by_node["plugin"].bridge is None
    assert by_node["plugin"].all_results == ()
    assert by_node["dra"].bridge is not None
    last = placements[2]
    assert isinstance(last, Unschedulable)
    assert last.message == (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 insufficient free GPUs."
    )

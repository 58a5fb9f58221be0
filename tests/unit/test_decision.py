"""The decision core: placements, per-node reasons, per-pod errors, and pruning == exhaustive."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from biaxial.simulate.manifests import load_objects
from driver.api.claims import AllocationResult, DeviceClass, ResourceClaim, SpecMemo
from driver.api.errors import DeadlineExceededError
from driver.api.ids import DeviceID, DeviceName, DriverName, PoolName
from driver.api.model import Device, ResourceSlice
from driver.cel.engine import compile_selector
from driver.cel.reads import referenced_names
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from driver.scheduling.classification import DeviceClassifier, KindFacts
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement, PodError, Unschedulable
from driver.scheduling.policy import PolicyDefaults
from tests.unit.builders import (
    DRIVER,
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
ROOT = Path(__file__).resolve().parents[2]


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


GPU_CONFIG = {"apiVersion": "gpu.biaxial.dev/v1alpha1", "kind": "GpuConfig"}


def config_engine(*class_config: dict[str, Any]) -> DecisionEngine:
    gpu_class = device_class(
        GPU_CLASS, extended_resource_name="nvidia.com/gpu", config=class_config
    )
    a, slice_a = gpu_node("a", 2)
    return DecisionEngine(snapshot([slice_a], classes=[gpu_class]), [to_node(a)])


@pytest.mark.parametrize(
    ("class_config", "claim_config", "message"),
    [
        (
            {**GPU_CONFIG, "sharing": {"strategy": "bogus"}},
            None,
            (
                f"claim default/bad-gpu: DeviceClass {GPU_CLASS}: spec.config[0] "
                'opaque.parameters: sharing.strategy: unknown value "bogus"'
            ),
        ),
        (
            None,
            {**GPU_CONFIG, "sharing": {"strategy": "bogus"}},
            (
                "claim default/bad-gpu: spec.devices.config[0] opaque.parameters: "
                'sharing.strategy: unknown value "bogus"'
            ),
        ),
        (
            None,
            {**GPU_CONFIG, "sharing": {"strategy": "none", "limit": 1}},
            "spec.devices.config[0] opaque.parameters: sharing.limit: unknown field",
        ),
    ],
    ids=["class-config", "claim-config", "unknown-field"],
)
def test_a_config_the_node_would_refuse_is_a_pod_error_before_allocation(
    class_config: dict[str, Any] | None, claim_config: dict[str, Any] | None, message: str
) -> None:
    eng = config_engine(*([class_config] if class_config else []))
    built = claim("bad-gpu", uid="u").request("gpu")
    if claim_config:
        built = built.config(claim_config)
    before = eng.snapshot
    decision = place(eng, claim_pod("bad"), (built.model(),))
    assert isinstance(decision, PodError), decision
    assert message in decision.message
    assert eng.snapshot is before  # nothing was allocated or assumed
    good = place(eng, claim_pod("good"), (claim("good-gpu", uid="g").request("gpu").model(),))
    if class_config is None:
        assert isinstance(good, Placement)  # only the claim with the bad config is refused
    else:
        assert isinstance(good, PodError)  # every claim of a class the node would refuse is


def test_claims_sharing_a_spec_are_checked_against_the_classes_of_each_decision() -> None:
    """Claims of one template (parsed with one SpecMemo) share their spec's models, and a
    spec that passed its checks is not checked again: until the classes change. A spec that
    fails is refused for every claim, each refusal naming its claim."""
    specs = SpecMemo()
    eng = config_engine()

    def decide(name: str, cls: str = GPU_CLASS) -> Any:
        model = ResourceClaim.from_api(claim(name, uid=name).request("gpu", cls=cls).json(), specs)
        decision = eng.decide(claim_pod(name), (model,))
        if isinstance(decision, Placement):
            eng.forget(name)  # (nothing assumed: the node stays free)
        return decision

    assert isinstance(decide("c0"), Placement)
    assert isinstance(decide("c1"), Placement)
    bad = {**GPU_CONFIG, "sharing": {"strategy": "bogus"}}
    refused = device_class(GPU_CLASS, extended_resource_name="nvidia.com/gpu", config=[bad])
    eng.observe_class(GPU_CLASS, DeviceClass.from_api(refused))
    for name in ("c2", "c3"):
        decision = decide(name)
        assert isinstance(decision, PodError), decision
        assert f"claim default/{name}: DeviceClass {GPU_CLASS}: spec.config[0]" in decision.message
    for name in ("m0", "m1"):
        decision = decide(name, cls="no-such-class")
        assert isinstance(decision, PodError), decision
        assert f"claim default/{name}: request 'gpu'" in decision.message


def test_a_legacy_pod_is_refused_when_its_class_config_would_be() -> None:
    # The bridge claim asks the class for two GPUs in one request; mps serves one per container.
    eng = config_engine({**GPU_CONFIG, "sharing": {"strategy": "mps"}})
    decision = place(eng, legacy_pod("two", gpus=2))
    assert isinstance(decision, PodError), decision
    assert "request 'container-0-request-0': sharing.strategy mps serves one GPU" in (
        decision.message
    )
    assert isinstance(place(eng, legacy_pod("one")), Placement)


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


def test_a_passed_deadline_ends_the_decision_and_caches_nothing() -> None:
    # kube-scheduler's DRA filter timeout (DynamicResourcesArgs.filterTimeout): the decision is
    # abandoned, not answered with a verdict on the pod's input. Nothing that absorbs CEL
    # errors (classification, the allocator, the match cache) may keep the cancellation.
    from driver.cel import cost

    eng = engine([gpu_node("a", 2), gpu_node("b", 2)])
    selector = 'device.attributes["gpu.biaxial.dev"].index >= 0'
    picky = claim("c", uid="u").request("r", selectors=[selector])
    before = eng.state()
    with cost.limits(deadline=0.0), pytest.raises(DeadlineExceededError, match="deadline"):
        eng.decide(claim_pod("p"), (picky.model(),))
    assert eng.state() == before
    decision = place(eng, claim_pod("p"), (picky.model(),))
    assert isinstance(decision, Placement), decision


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


MIXED_CLASSES = [
    GPU_CLASS_JSON,
    device_class(
        "whole.example.com",
        selectors=[f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'],
    ),
    device_class(
        "mig.example.com",
        selectors=[f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig"'],
    ),
    device_class(
        "a10.example.com",
        selectors=[f'device.attributes["{DRIVER}"].productName == "NVIDIA A10"'],
    ),
]
SELECTORS = [
    f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA")',
    f'device.attributes["{DRIVER}"].productName == "Tesla T4"',
    f'device.attributes["{DRIVER}"].index >= 1',  # varies inside a kind: never certain
    f'device.attributes["{DRIVER}"].uuid != "GPU-00000001"',
    f'device.capacity["{DRIVER}"].memory.compareTo(quantity("20Gi")) >= 0',
]


def mixed_cluster(rng: random.Random) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Nodes of three products whose memory can be equal, some with MIG-like exclusive
    partitions beside shared GPUs, some tainted devices: the kinds the bounds must tell
    apart."""
    nodes = []
    for i in range(rng.randint(3, 8)):
        product, memory = rng.choice(
            [("Tesla T4", "16Gi"), ("NVIDIA A10", "24Gi"), ("NVIDIA A10", "16Gi"), ("Z", "24Gi")]
        )
        devices = []
        for g in range(rng.choice([2, 4])):
            kwargs: dict[str, Any] = {}
            if rng.random() < 0.1:
                kwargs["taints"] = [taint("t", value="v")]
            devices.append(
                gpu(g, memory=memory, product=product, shared=True, numa=g % 2, **kwargs)
            )
        devices.extend(
            gpu(10 + m, memory=rng.choice(["5Gi", "10Gi"]), product=product, extra={"type": "mig"})
            for m in range(rng.choice([0, 0, 2, 3]))
        )
        nodes.append((node(f"n{i}"), slice_(f"n{i}-slice", node=f"n{i}", devices=devices)))
    return nodes


def mixed_pod(rng: random.Random, i: int) -> tuple[dict[str, Any], tuple[Any, ...]]:
    if rng.random() < 0.25:
        return random_pod(rng, i)
    pod = claim_pod(
        f"p{i}",
        node_policy=rng.choice(["binpack", "spread"]),
        gpu_policy=rng.choice(["binpack", "spread"]),
    )
    builder = claim(f"p{i}-gpu", uid=f"uid-c{i}")
    cls = rng.choice([c["metadata"]["name"] for c in MIXED_CLASSES])
    selectors = [rng.choice(SELECTORS)] if rng.random() < 0.4 else []
    capacity = None
    if cls != "mig.example.com":
        capacity = rng.choice([None, {"memory": "3Gi"}, {"memory": "5Gi", "cores": "25"}])
    count = rng.choice([1, 1, 2])
    builder.request("r", cls=cls, count=count, capacity=capacity, selectors=selectors)
    if count > 1 and rng.random() < 0.5:
        builder.constraint(match=NUMA)
    return pod, (builder.model(),)


@pytest.mark.parametrize("seed", range(16))
def test_pruned_equals_exhaustive_on_mixed_device_kinds(seed: int) -> None:
    rng = random.Random(1000 + seed)
    nodes = mixed_cluster(rng)
    snap = snapshot([s for _, s in nodes], classes=MIXED_CLASSES)
    pruned = DecisionEngine(snap, [to_node(n) for n, _ in nodes])
    reference = DecisionEngine(snap, [to_node(n) for n, _ in nodes], exhaustive=True)
    for i in range(40):
        pod, claims = mixed_pod(rng, i)
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
    "selector",
    [
        'device.driver == "gpu.biaxial.dev"',
        'device.attributes["gpu.biaxial.dev"].uuid != "GPU-00000003"',
        'device.attributes["gpu.biaxial.dev"].index < 3',
        'device.attributes["gpu.biaxial.dev"].productName == "Tesla T4"',
        (
            'device.attributes["gpu.biaxial.dev"].productName == "Tesla T4" && '
            'device.attributes["gpu.biaxial.dev"].index < 2'
        ),
        'device.attributes["gpu.biaxial.dev"].exists(k, k == "index")',
        'device.capacity["gpu.biaxial.dev"].memory.compareTo(quantity("20Gi")) > 0',
    ],
)
def test_class_membership_equals_evaluating_every_device(selector: str) -> None:
    """The classifier evaluates a class once per group of devices that look alike to it; its
    answer must equal evaluating the selector on every device."""
    nodes = [gpu_node("a", 2), gpu_node("b", 4, "24Gi"), gpu_node("c", 3)]
    picky = device_class("picky", selectors=[selector])
    snap = snapshot([s for _, s in nodes], classes=[picky])
    classifier = DeviceClassifier(snap.classes)
    compiled = compile_selector(selector)
    for n, _ in nodes:
        for cand in snap.candidates(to_node(n)).devices:
            expected = compiled.matches(cand.device, cand.device_id.driver)
            assert ("picky" in classifier.classes_of(cand)) is expected, cand.device_id


def test_kind_facts_find_every_key_that_varies() -> None:
    """KindFacts' fast check (the representative's fixed keys read, its varying ones found,
    the sizes equal) must say what comparing the maps key by key says: the varying keys are
    exactly those whose values (or presence) differ from the representative's somewhere."""
    rng = random.Random(7)
    pool = {"a": [1, 2], "b": ["x", "y"], "c": [True], "d": [3], "e": ["z", "w"]}
    for _ in range(300):
        maps = []
        for _ in range(rng.randint(1, 6)):
            keys = rng.sample(sorted(pool), rng.randint(0, len(pool)))
            maps.append({k: rng.choice(pool[k]) for k in keys})
        first = Device(name="d0", attributes=maps[0])
        facts = KindFacts(first, "gpu.biaxial.dev")
        expected: set[str] = set()
        for n, attributes in enumerate(maps[1:], 1):
            grew = facts.add(Device(name=f"d{n}", attributes=attributes))
            before = set(expected)
            expected |= {
                k
                for k in maps[0].keys() | attributes.keys()
                if maps[0].get(k, "-") != attributes.get(k, "-")
            }
            assert grew is (expected != before), (maps, n)
            assert facts.varying == expected, (maps, n)


def test_forget_undoes_assume() -> None:
    eng = engine([gpu_node("a", 1)])
    pod = legacy_pod("p0")
    first = place(eng, pod)
    assert isinstance(first, Placement)
    assert isinstance(place(eng, legacy_pod("p1")), Unschedulable)
    eng.forget("uid-p0")
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


# --------------------------------------------------------------------------- told, not built


def observed_engine(nodes: list[tuple[dict[str, Any], dict[str, Any]]]) -> DecisionEngine:
    """An engine told the cluster through ``observe_*`` only, as the controller's feed does."""
    eng = DecisionEngine.empty()
    eng.observe_class(GPU_CLASS, DeviceClass.from_api(GPU_CLASS_JSON))
    for raw_node, raw_slice in nodes:
        eng.observe_node(raw_node["metadata"]["name"], to_node(raw_node))
        eng.observe_slice(raw_slice["metadata"]["name"], ResourceSlice.from_api(raw_slice))
    return eng


def same(got: Any, want: Any) -> bool:
    if isinstance(want, Placement):
        return isinstance(got, Placement) and (got.node, got.all_results, got.score) == (
            want.node,
            want.all_results,
            want.score,
        )
    return bool(got == want)


def round_trip(allocation: AllocationResult) -> AllocationResult:
    """The allocation as the API server gives it back after our write."""
    return AllocationResult.from_api(json.loads(json.dumps(allocation.to_api())))


@pytest.mark.parametrize("seed", range(4))
def test_an_engine_told_by_observations_decides_like_one_built_at_once(seed: int) -> None:
    rng = random.Random(seed)
    nodes = random_cluster(rng)
    built, told = engine(nodes), observed_engine(nodes)
    for i in range(25):
        pod, claims = random_pod(rng, i)
        want = place(built, pod, claims)
        assert same(place(told, pod, claims), want), i
    assert told.state() == built.state()


@dataclass
class Books:
    """What the cluster shows, kept by the test: a fresh engine is built from it."""

    nodes: dict[str, dict[str, Any]]
    slices: list[dict[str, Any]]
    in_flight: dict[str, tuple[Placement, dict[str, Any]]] = field(default_factory=dict)
    allocations: dict[str, tuple[AllocationResult, str | None]] = field(default_factory=dict)
    pods: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # uid -> node, pod
    claims_of: dict[str, list[str]] = field(default_factory=dict)  # pod uid -> its claim keys

    def fresh(self) -> DecisionEngine:
        eng = observed_engine(
            [(n, s) for n, s in zip(self.nodes.values(), self.slices, strict=True)]
        )
        for placement, pod in self.in_flight.values():
            eng.assume(placement, pod)
        for key, (allocation, owner) in self.allocations.items():
            eng.observe_allocation(key, allocation, bridge_of=owner)
        for uid, (node_name, pod) in self.pods.items():
            eng.observe_pod(uid, node_name, raw=pod)
        return eng


def land(eng: DecisionEngine, books: Books, uid: str) -> None:
    """The cluster shows the placement written: its claims, its bridge claim, the binding."""
    placement, pod = books.in_flight.pop(uid)
    keys = books.claims_of.setdefault(uid, [])
    for claim_model, allocation in placement.claims:
        books.allocations[claim_model.key] = (round_trip(allocation), None)
        keys.append(claim_model.key)
        eng.observe_allocation(claim_model.key, round_trip(allocation))
    if placement.bridge_allocation is not None:
        key = f"default/{pod['metadata']['name']}-extended-resources-x"
        books.allocations[key] = (round_trip(placement.bridge_allocation), uid)
        keys.append(key)
        eng.observe_allocation(key, round_trip(placement.bridge_allocation), bridge_of=uid)
    books.pods[uid] = (placement.node, pod)
    eng.observe_pod(uid, placement.node, raw=pod)


@pytest.mark.parametrize("seed", range(6))
def test_incremental_updates_equal_an_engine_built_from_the_same_cluster(seed: int) -> None:
    """Placements assumed, landed, forgotten and finished, foreign allocations appearing and
    going, nodes tainted: the engine kept up to date by those calls always equals one built
    from scratch from what the cluster then shows (what it counts, how it files the nodes,
    and what it decides)."""
    rng = random.Random(seed)
    cluster = [gpu_node(f"n{i}", rng.choice([2, 4]), numa_split=True) for i in range(5)]
    books = Books(
        nodes={n["metadata"]["name"]: n for n, _ in cluster}, slices=[s for _, s in cluster]
    )
    eng = books.fresh()
    for step in range(60):
        action = rng.random()
        if action < 0.45:
            pod, claims = random_pod(rng, step)
            decision = eng.decide(pod, claims)
            if isinstance(decision, Placement):
                eng.assume(decision, pod)
                books.in_flight[pod["metadata"]["uid"]] = (decision, pod)
        elif action < 0.65 and books.in_flight:
            land(eng, books, rng.choice(sorted(books.in_flight)))
        elif action < 0.72 and books.in_flight:
            uid = rng.choice(sorted(books.in_flight))
            del books.in_flight[uid]
            eng.forget(uid)
        elif action < 0.82 and books.pods:
            uid = rng.choice(sorted(books.pods))  # the pod finished: its claims are released
            del books.pods[uid]
            eng.observe_pod(uid, None)
            for key in books.claims_of.pop(uid, ()):
                del books.allocations[key]
                eng.observe_allocation(key, None)
        elif action < 0.92:
            name = rng.choice(sorted(books.nodes))
            free = [
                f"gpu-{i}"
                for i in range(4)
                if not eng.snapshot.allocated.is_allocated(
                    DeviceID(DriverName(DRIVER), PoolName(name), DeviceName(f"gpu-{i}"))
                )
            ]
            if free:
                held = claim(f"foreign-{step}").holding(free[0], pool=name).model().allocation
                assert held is not None
                books.allocations[f"default/foreign-{step}"] = (held, None)
                eng.observe_allocation(f"default/foreign-{step}", held)
        else:
            name = rng.choice(sorted(books.nodes))
            tainted = gpu_node(name, 1, taints=[taint("t", value=str(step))])[0]
            books.nodes[name] = tainted
            eng.observe_node(name, to_node(tainted))
        if step % 5 == 4:
            fresh = books.fresh()
            assert eng.state() == fresh.state(), step
            probe, claims = random_pod(rng, 1000 + step)
            assert same(eng.decide(probe, claims), fresh.decide(probe, claims)), step
    assert eng.stats.landed > 0


def test_the_cluster_showing_an_assumed_placement_moves_nothing() -> None:
    eng = observed_engine([gpu_node("a", 2), gpu_node("b", 2)])
    books = Books(nodes={}, slices=[])
    pod, claims = claim_pod("p"), (claim("p-gpu", uid="c").request("r", count=2).model(),)
    legacy = legacy_pod("q", gpumem=3000)
    for one, its_claims in ((pod, claims), (legacy, ())):
        decision = eng.decide(one, its_claims)
        assert isinstance(decision, Placement)
        eng.assume(decision, one)
        books.in_flight[one["metadata"]["uid"]] = (decision, one)
    before = eng.state()
    counted = eng.snapshot
    land(eng, books, "uid-p")
    land(eng, books, "uid-q")
    assert eng.snapshot is counted, "an observation equal to the assumption changes nothing"
    assert eng.stats.landed == 4  # the claim, the bridge claim, two bindings
    assert eng.state() == before
    eng.forget("uid-p")  # too late: what the cluster shows stays counted
    assert eng.state() == before


def test_a_claim_shown_with_another_allocation_replaces_the_assumed_one() -> None:
    """A claim holds one allocation: what the cluster shows wins (our write will fail)."""
    eng = observed_engine([gpu_node("a", 2)])
    pod, claims = claim_pod("p"), (claim("p-gpu", uid="c").request("r").model(),)
    decision = eng.decide(pod, claims)
    assert isinstance(decision, Placement)
    eng.assume(decision, pod)
    theirs = claim("p-gpu").holding("gpu-1", pool="a").model().allocation
    assert theirs is not None
    eng.observe_allocation("default/p-gpu", theirs)
    assert eng.snapshot.allocated.exclusive_devices() == {
        DeviceID(DriverName(DRIVER), PoolName("a"), DeviceName("gpu-1"))
    }
    assert eng.stats.landed == 0


def test_node_and_slice_changes_refile_their_node_class_changes_rebuild() -> None:
    raw_node, raw_slice = gpu_node("a", 2)
    eng = observed_engine([(raw_node, raw_slice), gpu_node("b", 1)])
    assert isinstance(place(eng, legacy_pod("p0")), Placement)
    rebuilds, updates = eng.stats.rebuilds, eng.stats.updates
    heartbeat = copy.deepcopy(raw_node)
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    assert eng.observe_node("a", to_node(heartbeat)) is False
    assert (
        eng.observe_slice(raw_slice["metadata"]["name"], ResourceSlice.from_api(raw_slice)) is False
    )
    eng.observe_allocation(
        "default/foreign", claim("foreign").holding("gpu-1", pool="a").model().allocation
    )
    eng.observe_pod("uid-other", "a", {"cpu": 1000})
    assert isinstance(place(eng, legacy_pod("p1")), Placement)
    assert (eng.stats.rebuilds, eng.stats.updates) == (rebuilds, updates)
    cordoned = gpu_node("a", 2, unschedulable=True)[0]
    assert eng.observe_node("a", to_node(cordoned)) is True
    assert eng.observe_node("b", to_node(gpu_node("b", 1, unschedulable=True)[0])) is True
    decision = place(eng, legacy_pod("p2"))
    assert isinstance(decision, Unschedulable)
    assert "were unschedulable" in decision.message
    assert (eng.stats.rebuilds, eng.stats.updates) == (rebuilds, updates + 1)
    grown = gpu_node("c", 4)
    eng.observe_node("c", to_node(grown[0]))
    eng.observe_slice(grown[1]["metadata"]["name"], ResourceSlice.from_api(grown[1]))
    assert place(eng, legacy_pod("p3")).node == "c"
    assert (eng.stats.rebuilds, eng.stats.updates) == (rebuilds, updates + 2)
    picky = device_class(GPU_CLASS, selectors=['device.attributes["gpu.biaxial.dev"].index > 0'])
    assert eng.observe_class(GPU_CLASS, DeviceClass.from_api(picky)) is True
    place(eng, legacy_pod("p4"))
    assert eng.stats.rebuilds == rebuilds + 1


@pytest.mark.parametrize("seed", range(10))
def test_node_and_slice_churn_equals_an_engine_built_from_the_same_cluster(seed: int) -> None:
    """Slices republished with other devices, nodes added, removed, relabelled and tainted,
    while placements are assumed: the engine that applied each change node by node equals
    one built from scratch from what the cluster then shows, and decides alike."""
    rng = random.Random(seed)
    cluster = {f"n{i}": gpu_node(f"n{i}", rng.choice([2, 4])) for i in range(5)}
    eng = observed_engine(list(cluster.values()))
    in_flight: list[tuple[Placement, dict[str, Any]]] = []
    for step in range(40):
        action = rng.random()
        if action < 0.4:
            pod, claims = random_pod(rng, step)
            decision = eng.decide(pod, claims)
            if isinstance(decision, Placement):
                eng.assume(decision, pod)
                in_flight.append((decision, pod))
        elif action < 0.6:
            name = rng.choice(sorted(cluster))
            raw_node = cluster[name][0]
            republished = gpu_node(name, rng.choice([1, 2, 4]), rng.choice(["16Gi", "24Gi"]))
            republished[1]["spec"]["pool"]["generation"] = step + 2
            cluster[name] = (raw_node, republished[1])
            eng.observe_slice(
                republished[1]["metadata"]["name"], ResourceSlice.from_api(republished[1])
            )
        elif action < 0.7:
            name = f"x{step}"
            cluster[name] = gpu_node(name, rng.choice([2, 4]))
            eng.observe_node(name, to_node(cluster[name][0]))
            eng.observe_slice(
                cluster[name][1]["metadata"]["name"], ResourceSlice.from_api(cluster[name][1])
            )
        elif action < 0.8 and len(cluster) > 2:
            name = rng.choice(sorted(cluster))
            raw_node, raw_slice = cluster.pop(name)
            eng.observe_slice(raw_slice["metadata"]["name"], None)
            eng.observe_node(name, None)
        else:
            name = rng.choice(sorted(cluster))
            changed = copy.deepcopy(cluster[name][0])
            if rng.random() < 0.5:
                changed["metadata"]["labels"]["zone"] = f"z{step % 3}"
            else:
                changed["spec"]["taints"] = [taint("t", value=str(step))]
            cluster[name] = (changed, cluster[name][1])
            eng.observe_node(name, to_node(changed))
        if step % 4 == 3:
            fresh = observed_engine(list(cluster.values()))
            for placement, pod in in_flight:
                fresh.assume(placement, pod)
            assert eng.state() == fresh.state(), step
            probe, claims = random_pod(rng, 1000 + step)
            assert same(eng.decide(probe, claims), fresh.decide(probe, claims)), step
    assert eng.stats.updates > 0
    assert eng.stats.rebuilds == 1  # the first decision's: every later change was node by node


# --------------------------------------------------------------------------- invalid pools


def test_an_invalid_pool_makes_its_node_unschedulable_not_the_pod() -> None:
    """Upstream's allocator returns ErrFailedAllocationOnNode ("invalid resource pools were
    encountered") for a node whose pool is invalid when nothing fits there; the scheduler
    records it as that node's reason and keeps looking (dynamicresources Filter returns it
    as the node's status, not an error for the pod)."""
    bad_devices = [gpu(0, shared=True), gpu(0, shared=True)]  # duplicate names: invalid
    nodes = [
        (node("bad"), slice_("bad-slice", node="bad", devices=bad_devices)),
        gpu_node("good", 1),
    ]
    for exhaustive in (False, True):
        decision = place(engine(nodes, exhaustive=exhaustive), legacy_pod("p"))
        assert isinstance(decision, Placement), decision
        assert decision.node == "good"
    alone = engine(nodes[:1])
    decision = place(alone, legacy_pod("q"))
    assert isinstance(decision, Unschedulable), decision
    assert "invalid resource pools were encountered" in decision.message


# --------------------------------------------------------------------------- no cliff


def _fake_cluster(profiles: dict[str, int]) -> tuple[DecisionEngine, int]:
    """Nodes from the fake profiles (MIG partitions on the H100s' GPUs 6-7), with the
    project's DeviceClasses (whole GPUs, MIG, an A100-80GB product class)."""
    slices, nodes = [], []
    for profile, count in profiles.items():
        with open_backend(fake=profile, node_name="template") as backend:
            gpus = backend.discover()
        for i in range(count):
            name = f"{profile}-{i:03d}"
            node_json = node(name)
            nodes.append(to_node(node_json))
            renamed = [dataclasses.replace(g, uuid=f"GPU-{name}-{g.index}") for g in gpus]
            slices.extend(s.to_api() for s in build_slices(renamed, node_name=name))
    classes = load_objects(sorted(str(p) for p in (ROOT / "deviceclasses").glob("*.yaml")))
    return DecisionEngine(snapshot(slices, classes=classes), nodes), len(nodes)


@pytest.mark.parametrize(
    ("name", "make"),
    [
        # whole GPUs under node spread: every MIG-carrying node used to be evaluated per pod
        ("whole-spread", lambda i: legacy_pod(f"w{i}", node_policy="spread")),
        ("share-binpack", lambda i: legacy_pod(f"s{i}", gpumem=4000, node_policy="binpack")),
        ("two-spread", lambda i: legacy_pod(f"t{i}", gpus=2, node_policy="spread")),
    ],
)
def test_decisions_examine_few_nodes_on_a_mig_carrying_cluster(name: str, make: Any) -> None:
    """The former cliff (issue: bounds computed over devices a pod can never use): on a
    cluster where a third of the nodes carry MIG partitions, each decision examines a small
    constant number of nodes, not a share of the cluster. Counts, not time."""
    eng, _ = _fake_cluster({"h100-80gbx8": 30, "a100-80gbx8": 30, "t4x4": 30})
    for i in range(60):
        assert isinstance(place(eng, make(i)), Placement), (name, i)
    assert eng.stats.nodes_evaluated <= 60 * 2, (name, eng.stats.nodes_evaluated)
    assert eng.stats.allocator_calls <= 60 * 2, (name, eng.stats.allocator_calls)


@pytest.mark.parametrize("node_policy", ["binpack", "spread"])
def test_product_class_and_selector_pods_examine_few_nodes(node_policy: str) -> None:
    """A product class (A100-80GB only) and an H100 request selector: nodes of other products
    are never examined, whichever policy."""
    eng, _ = _fake_cluster({"h100-80gbx8": 30, "a100-80gbx8": 30, "t4x4": 30})
    h100 = f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA H100")'
    for i in range(40):
        product = claim_pod(f"a{i}", node_policy=node_policy)
        builder = claim(f"a{i}-gpu", uid=f"uid-a{i}").request(
            "r", cls="a100-80gb.gpu.biaxial.dev", capacity={"memory": "20Gi"}
        )
        assert isinstance(place(eng, product, (builder.model(),)), Placement)
        selected = claim_pod(f"h{i}", node_policy=node_policy)
        selected["spec"]["resourceClaims"][0]["resourceClaimName"] = f"h{i}-gpu"
        builder = claim(f"h{i}-gpu", uid=f"uid-h{i}").request(
            "r", selectors=[h100], capacity={"memory": "10Gi"}
        )
        decision = place(eng, selected, (builder.model(),))
        assert isinstance(decision, Placement)
        assert decision.node.startswith("h100"), decision.node
    assert eng.stats.nodes_evaluated <= 80 * 2, eng.stats.nodes_evaluated

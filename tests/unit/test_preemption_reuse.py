"""Victim searches shared between equivalent nodes: the same answers as searching every node.

kube-scheduler's DefaultPreemption runs ``SelectVictimsOnNode`` on every sampled candidate
node (``DryRunPreemption``); a dry run on a full cluster of identical nodes repeats the same
search on each. The engine runs it once per set of nodes whose searches read exactly the same
things and tells the others the verdict by positions; these tests compare it with an engine
that searches every node (``reuse_verdicts=False``): the same choice (node, victims, budget
violations, devices) on random clusters, on nodes that differ in one thing a search reads
(another reserver of a victim's claim, a budget, a higher-priority pod's GPU, a nomination,
allocatable cpu, numa-bind), and a bounded number of fit checks per preemption on identical
full nodes, whatever their number.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from driver.api.claims import AllocationResult, DeviceResult
from driver.api.labels import LabelSelector
from driver.api.quantity import Quantity
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement, PodError, Preemption, Unschedulable
from driver.scheduling.preemption import DisruptionBudget, candidate_count
from tests.unit.builders import (
    DRIVER,
    GPU_CLASS,
    device_class,
    gpu,
    node,
    slice_,
    snapshot,
    to_node,
)
from tests.unit.test_decision import engine, gpu_node, legacy_pod
from tests.unit.test_preemption_engine import prio

JSON = dict[str, Any]
GPUS = 4


class Cluster:
    """One engine and what the test told it, so that victims can be evicted."""

    def __init__(self, nodes: list[tuple[JSON, JSON]], *, reuse: bool) -> None:
        self.engine = engine(nodes, reuse_verdicts=reuse)
        self.claims: dict[str, str] = {}  # pod UID -> its bridge claim's key

    def run(self, pod: JSON, *, also_reserved_by: tuple[str, ...] = ()) -> Placement | None:
        """Place ``pod`` if it fits and let the cluster show it bound, its bridge claim
        allocated and reserved (by ``also_reserved_by`` too)."""
        eng = self.engine
        decision = eng.decide(pod)
        if not isinstance(decision, Placement):
            return None
        eng.assume(decision, pod)
        uid = pod["metadata"]["uid"]
        key = f"default/{pod['metadata']['name']}-extended-resources-x"
        self.claims[uid] = key
        eng.observe_allocation(
            key, decision.bridge_allocation, bridge_of=uid, reserved_for=(uid, *also_reserved_by)
        )
        eng.observe_pod(
            uid, decision.node, raw={**pod, "spec": {**pod["spec"], "nodeName": decision.node}}
        )
        return decision

    def preempt(self, pod: JSON, budgets: tuple[DisruptionBudget, ...]) -> Any:
        """The dry run (which changes nothing), or None when the pod fits as it is."""
        eng = self.engine
        if not isinstance(eng.decide(pod), Unschedulable):
            return None
        before = eng.state()
        found = eng.preempt(pod, (), budgets)
        assert eng.state() == before, "a dry run changes nothing"
        return found

    def act(self, found: Preemption, pod: JSON) -> None:
        """Nominate, evict the victims, place the preemptor."""
        eng = self.engine
        eng.nominate(found, pod)
        for victim in found.victims:
            eng.observe_pod(victim.uid, None)
            eng.observe_allocation(self.claims.pop(victim.uid), None)
        placed = self.run(pod)
        assert placed is not None
        assert placed.node == found.node


def summary(found: Any) -> Any:
    """Everything a preemption answer says."""
    if isinstance(found, Preemption):
        return (
            found.node,
            [v.uid for v in found.victims],
            found.violations,
            found.candidates,
            [(r.pool, r.device) for a in found.placement.all_results for r in a.results],
        )
    return found


def both(
    nodes: list[tuple[JSON, JSON]],
) -> tuple[Cluster, Cluster]:
    return Cluster(nodes, reuse=True), Cluster(nodes, reuse=False)


def same_answers(
    pair: tuple[Cluster, Cluster],
    pod: JSON,
    budgets: tuple[DisruptionBudget, ...] = (),
    *,
    act: bool = True,
) -> Any:
    """The dry run on both engines: the same answer; acted upon in both when ``act``."""
    reusing, plain = pair
    found = reusing.preempt(pod, budgets)
    assert summary(found) == summary(plain.preempt(pod, budgets)), pod["metadata"]["name"]
    if act and isinstance(found, Preemption):
        reusing.act(found, pod)
        plain.act(plain.engine.preempt(pod, (), budgets), pod)  # type: ignore[arg-type]
    return found


def fill(pair: tuple[Cluster, Cluster], pods: list[tuple[JSON, tuple[str, ...]]]) -> None:
    for pod, reserved in pods:
        placed = [c.run(pod, also_reserved_by=reserved) for c in pair]
        assert summary_of(placed[0]) == summary_of(placed[1])


def summary_of(placement: Placement | None) -> Any:
    if placement is None:
        return None
    return placement.node, [r.device for a in placement.all_results for r in a.results]


def second(n: int) -> str:
    """``status.startTime`` ``n`` seconds into the day."""
    return f"2026-01-01T{n // 3600:02d}:{n // 60 % 60:02d}:{n % 60:02d}Z"


def test_fit_checks_per_preemption_are_bounded_on_identical_full_nodes() -> None:
    """110 identical full nodes (4 GPUs, one priority-0 pod per GPU, each its own start):
    upstream samples 100 candidates; their searches read the same things, so one search
    (all 4 removed, then 4 reprieve checks) answers all 100, for a 1-GPU and a 4-GPU pod."""
    nodes = [gpu_node(f"n{i:03d}", GPUS) for i in range(110)]
    pair = both(nodes)
    fill(
        pair,
        [(prio(legacy_pod(f"low-{i:03d}"), 0, start=second(i)), ()) for i in range(110 * GPUS)],
    )
    reusing, plain = pair
    for name, gpus in (("one", 1), ("four", GPUS)):
        pod = prio(legacy_pod(name, gpus=gpus), 1000)
        eng = reusing.engine
        eng.stats.victim_checks = eng.stats.verdicts_reused = 0
        plain.engine.stats.victim_checks = 0
        found = same_answers(pair, pod, act=False)
        assert isinstance(found, Preemption)
        assert len(found.victims) == gpus
        assert found.candidates == candidate_count(110) == 100
        assert eng.stats.victim_checks == GPUS + 1, "one search for all 100 candidates"
        assert eng.stats.verdicts_reused == 99
        assert plain.engine.stats.victim_checks == 100 * (GPUS + 1)


def pinned(name: str, node: str, priority: int, start: int | None, **kwargs: Any) -> JSON:
    """A pod that only ``node`` takes (by hostname), with ``cpu`` requested when given."""
    cpu = kwargs.pop("cpu", None)
    app = kwargs.pop("app", "web")
    pod = legacy_pod(name, **kwargs)
    prio(pod, priority, start=second(start) if start is not None else None, app=app)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    if cpu is not None:
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    return pod


def two_nodes(
    difference: str,
) -> tuple[tuple[Cluster, Cluster], JSON, tuple[DisruptionBudget, ...]]:
    """Nodes ``a`` and ``b`` (2 GPUs each, two priority-0 pods on them, ``v0`` started first)
    alike but for ``difference``, on which the searches for the preemptor returned give
    different victims (or a candidate on one node only): the clusters and the preemptor."""
    cpu = {"cpu": "3", "memory": "64Gi", "pods": "110"}
    budgets: tuple[DisruptionBudget, ...] = ()
    preemptor = prio(legacy_pod("p"), 1000)
    if difference == "numa":  # the GPUs of a NUMA node side by side on a, interleaved on b
        nodes = []
        for name, numa in (("a", (0, 0, 1, 1)), ("b", (0, 1, 0, 1))):
            devices = [gpu(i, shared=True, numa=n) for i, n in enumerate(numa)]
            nodes.append((node(name), slice_(f"{name}-slice", node=name, devices=devices)))
    elif difference == "victim devices":  # a 16 GiB and a 24 GiB GPU
        devices = [gpu(0, shared=True), gpu(1, memory="24Gi", shared=True)]
        nodes = [(node(n), slice_(f"{n}-slice", node=n, devices=devices)) for n in "ab"]
    elif difference == "exclusive use":
        nodes = [gpu_node(name, 3) for name in "ab"]
    else:
        allocatable = {
            "victim cpu": (cpu, cpu),
            "other cpu": (cpu, cpu),
            "allocatable": ({**cpu, "cpu": "2"}, None),
            "pod count": ({**cpu, "pods": "2"}, {**cpu, "pods": "2"}),
        }.get(difference, (None, None))
        nodes = [gpu_node(name, 2, allocatable=allocatable[n]) for n, name in enumerate("ab")]
    pair = both(nodes)
    if difference == "exclusive use":  # GPU 2 taken whole by a claim without a pod, on a only
        for name in "ab":
            orphan = AllocationResult((DeviceResult("r", DRIVER, name, "gpu-2"),))
            for cluster in pair:
                cluster.engine.observe_allocation(f"default/orphan-{name}", orphan)
    pods: list[tuple[JSON, tuple[str, ...]]] = []
    count = 4 if difference == "numa" else 2
    for i in range(count):
        for name in ("a", "b"):
            later = "a" if difference == "nomination" else "b"
            start = 2 * i + (name == later)
            if difference == "victim devices" and name == "b":
                start = 2 * (1 - i) + 1  # b-v1 (on the other GPU) started first
            pod = pinned(f"{name}-v{i}", name, 0, start)
            reserved: tuple[str, ...] = ()
            if difference == "victim cpu":  # the same sum, spread differently
                pod["spec"]["containers"][0]["resources"]["requests"] = {
                    "cpu": str([[1, 2], [2, 1]][name == "b"][i])
                }
            if difference == "allocatable":
                pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}
            if difference == "budget" and name == "a" and i == 1:
                pod["metadata"]["labels"] = {"app": "db"}
            if difference == "reserver" and name == "a" and i == 1:
                reserved = ("uid-elsewhere",)
            if difference == "device use" and i == 1:
                # a share on GPU 1 whose pod is gone (its claim stays allocated)
                pod = pinned(f"{name}-share", name, 0, None, gpumem=10000 if name == "a" else 6000)
            pods.append((pod, reserved))
    if difference == "other cpu":  # a higher-priority pod's cpu on a only
        pods.append((pinned("a-keep", "a", 100_000, None, gpus=0, cpu="2"), ()))
        pods.append((pinned("b-keep", "b", 100_000, None, gpus=0), ()))
    fill(pair, pods)
    if difference == "exclusive use":
        for cluster in pair:
            cluster.engine.observe_allocation("default/orphan-b", None)
        preemptor = prio(legacy_pod("p", gpus=2), 1000)
    if difference == "victim devices":
        preemptor = prio(legacy_pod("p", gpumem=20000), 1000)
    if difference == "pod count":  # a pod without requests on a, beyond its pod limit
        keep = pinned("a-keep", "a", 100_000, None, gpus=0)
        for cluster in pair:
            bound = {**keep, "spec": {**keep["spec"], "nodeName": "a"}}
            cluster.engine.observe_pod("uid-a-keep", "a", raw=bound)
    if difference == "device use":
        for cluster in pair:
            for name in ("a", "b"):
                cluster.engine.observe_pod(f"uid-{name}-share", None)
        preemptor = prio(legacy_pod("p", gpus=2, gpumem=8000), 1000)
    if difference in ("victim cpu", "other cpu", "allocatable"):
        preemptor["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    if difference == "budget":
        budgets = (DisruptionBudget("default", "db", LabelSelector.from_labels({"app": "db"}), 0),)
    if difference == "numa":
        preemptor = prio(legacy_pod("p", gpus=2), 1000)
        preemptor["metadata"]["annotations"]["nvidia.com/numa-bind"] = "true"
    if difference == "nomination":  # a pod of priority 2000 holds GPU 1 of a (a-v1's)
        held = prio(legacy_pod("held"), 2000)
        for cluster in pair:
            found = cluster.preempt(held, ())
            assert isinstance(found, Preemption)
            assert [v.name for v in found.victims] == ["a-v1"]
            cluster.engine.nominate(found, held)
    return pair, preemptor, budgets


@pytest.mark.parametrize(
    "difference",
    [
        "none",
        "victim cpu",
        "other cpu",
        "allocatable",
        "pod count",
        "device use",
        "exclusive use",
        "victim devices",
        "budget",
        "reserver",
        "numa",
        "nomination",
    ],
)
def test_nodes_that_differ_in_what_a_search_reads_never_share_a_verdict(
    difference: str,
) -> None:
    """Two nodes alike but for one thing a victim search reads (each victim's requests, the
    other pods' requests and number, allocatable, the devices other claims use, a budget, another
    reserver of a victim's claim, the NUMA attributes numa-bind matches, a nomination holding
    a GPU): their searches both run, and every dry run (preemptors starting at either node)
    answers as searching every node does. Alike in everything, one search answers both."""
    pair, preemptor, budgets = two_nodes(difference)
    reusing = pair[0].engine
    for k in range(6):  # different UIDs: the sample starts at a, or at b
        pod = {
            **preemptor,
            "metadata": {**preemptor["metadata"], "name": f"p{k}", "uid": f"uid-p{k}"},
        }
        reusing.stats.verdicts_reused = 0
        found = same_answers(pair, pod, budgets, act=False)
        assert isinstance(found, Preemption), found
        assert reusing.stats.verdicts_reused == (1 if difference == "none" else 0)


def _layout(rng: random.Random) -> list[JSON]:
    """A random set of pods for one node (what each replica of the node gets)."""
    return [
        {
            "gpus": rng.choice([1, 1, 1, 2]),
            "gpumem": rng.choice([None, None, 6000, 10000]),
            "priority": rng.choice([0, 0, 0, 1, 7, 2000]),
            "app": rng.choice(["db", "web", "web"]),
            "cpu": rng.choice([None, None, "1", "2"]),
            "start": rng.random() < 0.9,
        }
        for _ in range(rng.randrange(2, 6))
    ]


def _perturbed(rng: random.Random, layout: list[JSON]) -> tuple[list[JSON], str | None]:
    """The layout with one random thing changed (or none), and a pod UID that also reserves
    the last pod's claim (or None)."""
    pods = [dict(p) for p in layout]
    change = rng.choice(["none", "none", "priority", "gpumem", "app", "cpu", "drop", "reserve"])
    victim = rng.randrange(len(pods))
    if change == "priority":
        pods[victim]["priority"] = rng.choice([0, 1, 7, 2000])
    elif change == "gpumem":
        pods[victim]["gpumem"] = rng.choice([None, 6000, 10000])
    elif change == "app":
        pods[victim]["app"] = "db" if pods[victim]["app"] == "web" else "web"
    elif change == "cpu":
        pods[victim]["cpu"] = rng.choice([None, "1", "3"])
    elif change == "drop" and len(pods) > 1:
        del pods[victim]
    return pods, ("uid-elsewhere" if change == "reserve" else None)


def _pods_for(rng: random.Random, nodes: list[str]) -> list[tuple[JSON, tuple[str, ...]]]:
    """Per node kind a layout; each node gets it (pinned by hostname), some with one thing
    changed; start times follow the layout's order on every node, so that equal layouts list
    their victims alike. Placed round-robin over the nodes."""
    layouts: dict[str, list[JSON]] = {}
    per_node = []
    for name in nodes:
        kind = name.split("-")[0]
        if kind not in layouts:
            layouts[kind] = _layout(rng)
        per_node.append((name, *_perturbed(rng, layouts[kind])))
    out: list[tuple[JSON, tuple[str, ...]]] = []
    for position in range(max(len(pods) for _, pods, _ in per_node)):
        for name, pods, elsewhere in per_node:
            if position >= len(pods):
                continue
            spec = pods[position]
            pod = legacy_pod(f"{name}-{position}", gpus=spec["gpus"], gpumem=spec["gpumem"])
            start = second(position) if spec["start"] else None
            prio(pod, spec["priority"], start=start, app=spec["app"])
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": name}
            if spec["cpu"] is not None:
                pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": spec["cpu"]}
            last = position == len(pods) - 1
            out.append((pod, (elsewhere,) if elsewhere and last else ()))
    return out


@pytest.mark.parametrize("seed", range(16))
def test_shared_verdicts_equal_searching_every_node(seed: int) -> None:
    """Random clusters (a few node kinds, each node of a kind with the kind's pods, some with
    one thing changed: a priority, a fraction, a label a budget selects, cpu, a pod fewer, a
    claim another pod reserves; the GPUs left topped up with whole-GPU pods; budgets,
    nominations, numa-bind): every dry run answers as searching every node does, and the
    cluster evolves the same way."""
    rng = random.Random(seed)
    small = {"cpu": "4", "memory": "64Gi", "pods": "110"}
    kinds = {
        "a": lambda name: gpu_node(name, 2),
        "b": lambda name: gpu_node(name, 2, allocatable=small),
        "c": lambda name: gpu_node(name, 4, numa_split=True),
    }
    names = sorted(f"{rng.choice('abc')}-{i:02d}" for i in range(rng.randrange(6, 14)))
    pair = both([kinds[name[0]](name) for name in names])
    fill(pair, _pods_for(rng, names))
    for i in range(4 * len(names)):  # whole GPUs with priority 0 where any is free
        pod = prio(legacy_pod(f"top-{i:02d}"), 0, start=second(100 + i), app="web")
        if not isinstance(pair[1].engine.decide(pod), Placement):
            break
        fill(pair, [(pod, ())])
    budgets = tuple(
        DisruptionBudget("default", app, LabelSelector.from_labels({"app": app}), allowed)
        for app, allowed in (("db", rng.choice([0, 1])), ("web", rng.choice([0, 2, 5])))
        if rng.random() < 0.6
    )
    preempted = 0
    for k in range(8):
        pod = legacy_pod(
            f"h{k}", gpus=rng.choice([1, 1, 2, 3]), gpumem=rng.choice([None, None, 8000])
        )
        prio(pod, rng.choice([5, 1000]))
        if rng.random() < 0.3:
            pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
        if rng.random() < 0.2:
            pod["metadata"]["annotations"]["nvidia.com/numa-bind"] = "true"
        act = rng.random() < 0.7
        found = same_answers(pair, pod, budgets, act=act)
        preempted += isinstance(found, Preemption)
        if not act and isinstance(found, Preemption) and rng.random() < 0.5:
            for cluster in pair:  # nominated, victims not gone yet: its devices hold there
                cluster.engine.nominate(found, pod)
    assert preempted, "the cluster is full: some pod preempts"


def test_a_class_selector_error_on_some_devices_is_met_as_searching_every_node_meets_it() -> None:
    """A class whose selector fails at run time on node b's GPUs (an attribute they lack)
    counts as selecting them (the index files them as a's kind; the allocator meets the
    error): upstream reports a CEL runtime error for the pod. A dry run asked directly
    answers that error whichever node its sample starts at, never a verdict of a's."""
    selector = 'device.attributes["gpu.biaxial.dev"].extra == "x"'
    classes = [
        device_class(
            GPU_CLASS,
            selectors=[f'device.driver == "{DRIVER}"', selector],
            extended_resource_name="nvidia.com/gpu",
        )
    ]
    slices = [
        slice_("a-slice", node="a", devices=[gpu(0, shared=True, extra={"extra": "x"})]),
        slice_("b-slice", node="b", devices=[gpu(0, shared=True)]),
    ]
    engines = [
        DecisionEngine(snapshot(slices, classes), [to_node(node("a"))], reuse_verdicts=reuse)
        for reuse in (True, False)
    ]
    for eng in engines:
        eng.observe_node("b", to_node(node("b")))
        # The same pod on each node, holding its GPU (placed on b by another scheduler).
        for name in "ab":  # (a's started later: a wins without a tie-break evaluating b)
            pod = prio(legacy_pod(f"low-{name}"), 0, start=second(9 if name == "a" else 0))
            bound = {**pod, "spec": {**pod["spec"], "nodeName": name}}
            eng.observe_pod(f"uid-low-{name}", name, raw=bound)
            share = DeviceResult(
                "container-0-request-0",
                DRIVER,
                name,
                "gpu-0",
                share_id=f"share-{name}",
                consumed_capacity={"memory": Quantity.parse("16Gi"), "cores": Quantity.parse("0")},
            )
            eng.observe_allocation(
                f"default/low-{name}-x",
                AllocationResult((share,)),
                reserved_for=(f"uid-low-{name}",),
            )
    for k in range(6):
        pod = prio(legacy_pod(f"p{k}"), 1000)
        found = [eng.preempt(pod) for eng in engines]
        assert isinstance(found[1], PodError), found[1]
        assert "extra" in found[1].message
        assert found[0] == found[1]

"""The rules between pods and the soft rules inside the decision engine: placements, reasons,
every pod counting (observed from any scheduler or assumed), the four patterns unchanged, and
the pruned node search equal to evaluating every node for pods carrying every rule."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from driver.api.errors import ManifestError
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement, Unschedulable
from driver.scheduling.topologyspread import DefaultSpreading
from tests.unit.builders import snapshot, taint, to_node
from tests.unit.pods import HOSTNAME, ZONE, pod, selector, zoned_node
from tests.unit.rules_env import environment, rules_for
from tests.unit.rules_env import nodes as rule_nodes
from tests.unit.test_decision import (
    GPU_CLASS_JSON,
    PATTERNS,
    devices_of,
    gpu_node,
    legacy_pod,
    place,
)

JSON = dict[str, Any]


def engine(
    nodes: list[tuple[JSON, JSON]],
    running: list[JSON] = (),  # type: ignore[assignment]
    *,
    exhaustive: bool = False,
    spreading: DefaultSpreading | None = None,
) -> DecisionEngine:
    snap = snapshot([s for _, s in nodes], classes=[GPU_CLASS_JSON])
    eng = DecisionEngine(
        snap, [to_node(n) for n, _ in nodes], exhaustive=exhaustive, spreading=spreading
    )
    for raw in running:
        eng.observe_pod(raw["metadata"]["uid"], raw["spec"]["nodeName"], raw=raw)
    return eng


def three_zones(per_zone: int = 1, gpus: int = 2) -> list[tuple[JSON, JSON]]:
    return [zoned_node(f"{zone}{i}", zone, gpus=gpus) for zone in "abc" for i in range(per_zone)]


def replica(name: str) -> Any:
    return pod(name).labels(app="web").anti(HOSTNAME, app="web").gpu(gpumem=2000)


@pytest.mark.parametrize("exhaustive", [False, True])
def test_anti_affine_replicas_take_one_node_each_and_the_fourth_waits(exhaustive: bool) -> None:
    """The issue's first measurement: required anti-affinity on the hostname."""
    eng = engine(three_zones(), exhaustive=exhaustive)
    placed = [place(eng, replica(f"web-{i}").json()) for i in range(4)]
    assert [type(p).__name__ for p in placed] == ["Placement"] * 3 + ["Unschedulable"]
    assert len({p.node for p in placed[:3]}) == 3
    assert placed[3].message == (
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
    )


def test_a_pod_of_another_scheduler_counts_for_symmetry_and_ports() -> None:
    """Everything counts everyone: a running pod bound by the default scheduler repels through
    its anti-affinity and holds its host port."""
    running = [
        pod("theirs")
        .scheduler("default-scheduler")
        .labels(app="web")
        .anti(HOSTNAME, app="web")
        .port(8080)
        .on("a0")
        .json(),
    ]
    eng = engine(three_zones(), running)
    decision = place(eng, pod("mine").labels(app="web").gpu().json())
    assert isinstance(decision, Placement)
    assert decision.node != "a0"
    ports = engine([zoned_node("a0", "a")], running)
    blocked = place(ports, pod("web").port(8080).gpu().json())
    assert isinstance(blocked, Unschedulable)
    assert blocked.message == (
        "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
    )


def test_two_pods_with_the_same_host_port_never_share_a_node() -> None:
    eng = engine(three_zones())
    nodes = [place(eng, pod(f"p{i}").port(8080).gpu().json()) for i in range(4)]
    assert len({p.node for p in nodes[:3]}) == 3
    assert isinstance(nodes[3], Unschedulable)


def test_zone_spread_places_two_per_zone() -> None:
    eng = engine(three_zones(per_zone=2, gpus=4))
    zones = []
    for i in range(6):
        decision = place(eng, pod(f"s{i}").labels(app="s").spread(ZONE, 1, app="s").gpu().json())
        assert isinstance(decision, Placement)
        zones.append(decision.node[0])
    assert sorted(zones) == ["a", "a", "b", "b", "c", "c"]
    # under node binpack each new zone's pod joins the fuller node of that zone
    assert len(set(zones[:3])) == 3


def test_required_affinity_follows_the_database_into_its_zone() -> None:
    running = [pod("db").labels(app="db").on("b1").json()]
    eng = engine(three_zones(per_zone=2), running)
    for i in range(3):
        decision = place(eng, pod(f"api{i}").affinity(ZONE, app="db").gpu().json())
        assert isinstance(decision, Placement)
        assert decision.node.startswith("b")


def test_pod_level_cpu_is_counted() -> None:
    eng = engine([zoned_node("a0", "a", allocatable={"cpu": "8", "memory": "32Gi", "pods": "10"})])
    decision = place(eng, pod("big").pod_resources(requests={"cpu": "9"}).gpu().json())
    assert isinstance(decision, Unschedulable)
    assert decision.message == "0/1 nodes are available: 1 Insufficient cpu."


def test_soft_anti_affinity_outweighs_node_binpack() -> None:
    """A Helm chart's preferred anti-affinity spreads replicas although node binpack prefers
    the node already in use (docs/scoring.md: weight 2 against the node score's 1)."""
    eng = engine([zoned_node("a0", "a"), zoned_node("b0", "b")])
    nodes = []
    for i in range(2):
        raw = pod(f"h{i}").labels(app="h").anti(HOSTNAME, weight=100, app="h").gpu(gpumem=2000)
        decision = place(eng, raw.json())
        assert isinstance(decision, Placement)
        nodes.append(decision.node)
    assert sorted(nodes) == ["a0", "b0"]


def test_prefer_no_schedule_is_avoided_while_another_node_fits() -> None:
    tainted = zoned_node("a0", "a", taints=[taint("spot", "PreferNoSchedule")])
    eng = engine([tainted, zoned_node("b0", "b")])
    first = place(eng, pod("p0").gpu(gpumem=2000).json())
    assert isinstance(first, Placement)
    assert first.node == "b0"
    fill = [place(eng, pod(f"f{i}").gpu().json()) for i in range(2)]  # b0's GPUs are taken
    assert all(isinstance(f, Placement) for f in fill)
    assert isinstance(place(eng, pod("p1").gpu().json()), Placement)


@pytest.mark.parametrize(
    ("policy", "expected"), [("binpack", ["a0", "a0"]), ("spread", ["a0", "b0"])]
)
def test_pods_without_devices_follow_the_node_policy_on_cpu_and_memory(
    policy: str, expected: list[str]
) -> None:
    """The issue's last measurement: a pod without GPU requests used to score 0 everywhere."""
    eng = engine([zoned_node("b0", "b"), zoned_node("a0", "a")])
    busy = place(eng, pod("busy").requests(cpu="4").json())  # ties by name: a0
    assert isinstance(busy, Placement)
    placed = [busy.node]
    decision = place(eng, pod("next").policy(node=policy).requests(cpu="1").json())
    assert isinstance(decision, Placement)
    placed.append(decision.node)
    assert placed == expected


@pytest.mark.parametrize(("node_policy", "gpu_policy", "expected"), PATTERNS)
def test_the_four_patterns_keep_their_placements_as_replicaset_pods(
    node_policy: str, gpu_policy: str, expected: list[tuple[str, str]]
) -> None:
    """System default spreading applies to the replicas of a ReplicaSet, but only orders nodes
    whose scores are equal: the two-axis patterns keep their placements."""
    eng = engine([gpu_node("gpu-t4", 4, "15360Mi"), gpu_node("gpu-a10g", 4, "23028Mi")])
    eng.observe_owner("ReplicaSet", "default", "pattern", selector(app="pattern"))
    placed = []
    for i in range(4):
        raw = legacy_pod(f"p{i}", gpumem=7500, node_policy=node_policy, gpu_policy=gpu_policy)
        raw["metadata"]["labels"] = {"app": "pattern"}
        raw["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "pattern",
                "uid": "u",
                "controller": True,
            }
        ]
        decision = place(eng, raw)
        assert isinstance(decision, Placement), decision
        placed.append((decision.node, devices_of(decision)[0]))
    assert placed == expected


def test_system_default_spreading_breaks_ties_between_equal_nodes() -> None:
    """Two identical nodes, a replica (requesting nothing) already on a0: equal scores, so the
    next replica goes where upstream's default spreading sends it, b0 -- by name alone it would
    go to a0."""
    idle = pod("r0").labels(app="web").owned("ReplicaSet", "web").requests(cpu="0", memory="0")
    eng = engine([zoned_node("a0", "z"), zoned_node("b0", "z")], [idle.on("a0").json()])
    eng.observe_owner("ReplicaSet", "default", "web", selector(app="web"))
    replica = pod("r1").labels(app="web").owned("ReplicaSet", "web").requests(cpu="0", memory="0")
    decision = place(eng, replica.json())
    assert isinstance(decision, Placement)
    assert decision.node == "b0"
    other = place(eng, pod("other").requests(cpu="0", memory="0").json())
    assert isinstance(other, Placement)
    assert other.node == "a0"  # no owner, no default spreading: the name decides


def test_a_rule_excluding_most_nodes_costs_no_allocator_calls() -> None:
    """The walk skips excluded nodes before any heap work or allocation: a pod whose affinity
    rules out two zones of three is allocated on the nodes of one zone only."""
    nodes = three_zones(per_zone=10)
    running = [pod("db").labels(app="db").on("c0").json()]
    eng = engine(nodes, running)
    for i in range(5):
        assert isinstance(
            place(eng, pod(f"api{i}").affinity(ZONE, app="db").gpu(gpumem=1000).json()), Placement
        )
    assert eng.stats.allocator_calls <= 5 * 2


# --------------------------------------------------------------------------- pruned == exhaustive


def random_rule_cluster(rng: random.Random) -> list[tuple[JSON, JSON]]:
    nodes = []
    for i in range(rng.randint(4, 9)):
        taints = [taint("spot", "PreferNoSchedule")] if rng.random() < 0.2 else []
        labels = {"tier": rng.choice(["gold", "silver"])}
        zone = rng.choice(["a", "b", "c", None]) if rng.random() < 0.9 else None
        nodes.append(
            zoned_node(
                f"n{i}",
                zone,
                gpus=rng.choice([2, 4]),
                memory=rng.choice(["16Gi", "24Gi"]),
                labels=labels,
                taints=taints,
            )
        )
    return nodes


APPS = ("a", "b", "c")


def random_rule_pod(rng: random.Random, name: str) -> JSON:
    app = rng.choice(APPS)
    builder = (
        pod(name)
        .labels(app=app)
        .policy(
            node=rng.choice(["binpack", "spread"]), gpu_policy=rng.choice(["binpack", "spread"])
        )
    )
    key = rng.choice([HOSTNAME, ZONE])
    roll = rng.random
    if roll() < 0.25:
        builder.anti(key, app=rng.choice(APPS))
    if roll() < 0.15:
        builder.affinity(ZONE, app=rng.choice(APPS))
    if roll() < 0.25:
        builder.spread(key, rng.choice([1, 2]), app=app, min_domains=rng.choice([None, 3]))
    if roll() < 0.3:
        builder.spread(key, rng.choice([1, 3]), when="ScheduleAnyway", app=app)
    if roll() < 0.3:
        builder.anti(key, weight=rng.randint(1, 100), app=rng.choice(APPS))
    if roll() < 0.2:
        builder.affinity(key, weight=rng.randint(1, 100), app=rng.choice(APPS))
    if roll() < 0.2:
        builder.prefer_node(rng.randint(1, 100), "tier", "gold")
    if roll() < 0.15:
        builder.port(rng.choice([80, 443]))
    if roll() < 0.2:
        builder.tolerate("spot", "PreferNoSchedule")
    builder.gpu(rng.choice([1, 1, 2]), rng.choice([None, 2000, 6000]))
    if roll() < 0.3:
        builder.owned("ReplicaSet", f"rs-{app}")
    return builder.json()


def same(got: Any, want: Any) -> bool:
    if isinstance(want, Placement):
        return isinstance(got, Placement) and (got.node, got.all_results, got.score) == (
            want.node,
            want.all_results,
            want.score,
        )
    return bool(got == want)


@pytest.mark.parametrize("seed", range(16))
def test_pruned_equals_exhaustive_with_every_rule(seed: int) -> None:
    rng = random.Random(seed)
    nodes = random_rule_cluster(rng)
    names = [n["metadata"]["name"] for n, _ in nodes]
    running = [
        pod(f"run{i}")
        .labels(app=rng.choice(APPS))
        .anti(HOSTNAME, app=rng.choice(APPS))
        .on(rng.choice(names))
        .json()
        if rng.random() < 0.3
        else pod(f"run{i}").labels(app=rng.choice(APPS)).on(rng.choice(names)).json()
        for i in range(rng.randint(0, 6))
    ]
    pruned = engine(nodes, running)
    reference = engine(nodes, running, exhaustive=True)
    for eng in (pruned, reference):
        for app in APPS:
            eng.observe_owner("ReplicaSet", "default", f"rs-{app}", selector(app=app))
    for i in range(30):
        raw = random_rule_pod(rng, f"p{i}")
        want = place(reference, raw)
        got = place(pruned, raw)
        assert same(got, want), (i, got, want)
    assert pruned.stats.allocator_calls <= reference.stats.allocator_calls


@pytest.mark.parametrize("seed", range(8))
def test_the_node_search_estimate_is_the_exact_penalty(seed: int) -> None:
    """The walk orders its heap by the float estimate and stops on it when a node is clearly
    worse: it must be the exact penalty up to rounding, on every node and for every rule."""
    rng = random.Random(seed)
    cluster = [to_node(raw) for raw, _ in random_rule_cluster(rng)]
    names = [n.name for n in cluster]
    running = [
        pod(f"run{i}")
        .labels(app=rng.choice(APPS))
        .anti(HOSTNAME, weight=rng.randint(1, 100), app=rng.choice(APPS))
        .on(rng.choice(names))
        .json()
        for i in range(rng.randint(0, 8))
    ]
    env = environment(cluster, running)
    for i in range(20):
        rules = rules_for(env, random_rule_pod(rng, f"p{i}"))
        if rules is None or not rules.soft:
            continue
        estimate = rules.estimator()
        for n in cluster:
            assert estimate(n) == pytest.approx(float(rules.penalty(n)), abs=1e-9), (i, n.name)


@pytest.mark.parametrize("seed", range(8))
def test_the_nodes_the_search_passes_over_in_runs_pay_at_least_the_floor(seed: int) -> None:
    """The walk bounds a run of "certainly penalised" nodes by one floor: each such node's
    estimate (and exact penalty) must be at least it, and the floor above 0."""
    rng = random.Random(seed)
    cluster = [to_node(raw) for raw, _ in random_rule_cluster(rng)]
    names = [n.name for n in cluster]
    running = [
        pod(f"run{i}").labels(app=rng.choice(APPS)).on(rng.choice(names)).json()
        for i in range(rng.randint(0, 12))
    ]
    env = environment(cluster, running)
    seen = 0
    for i in range(30):
        rules = rules_for(env, random_rule_pod(rng, f"p{i}"))
        if rules is None or not rules.soft:
            continue
        found = rules.penalised()
        if found is None:
            continue
        penalised, floor = found
        assert floor > 0
        estimate = rules.estimator()
        for n in cluster:
            if penalised(n.name):
                seen += 1
                assert estimate(n) >= floor, (i, n.name)
                assert float(rules.penalty(n)) >= floor, (i, n.name)
    assert seen


def placed_alike(
    pruned: DecisionEngine, reference: DecisionEngine, raw: JSON, placed: list[str], step: int
) -> None:
    """The pruned engine answers ``raw`` as the exhaustive one; its UID joins ``placed`` when
    it is placed."""
    want = place(reference, raw)
    got = place(pruned, raw)
    assert same(got, want), (step, got, want)
    if isinstance(want, Placement):
        placed.append(raw["metadata"]["uid"])


def churned(
    rng: random.Random,
    roll: float,
    nodes: list[tuple[JSON, JSON]],
    placed: list[str],
    engines: tuple[DecisionEngine, ...],
    *,
    forget: float,
    move: float,
) -> bool:
    """A stream's step other than a placement, or False: with ``roll`` below ``forget``, one
    of the ``placed`` pods (their UIDs) goes; below ``move``, a node moves to a random zone."""
    if placed and roll < forget:
        uid = placed.pop(rng.randrange(len(placed)))
        for eng in engines:
            eng.forget(uid)
        return True
    if roll < move:
        raw, _ = rng.choice(nodes)
        moved = copy.deepcopy(raw)
        moved["metadata"]["labels"][ZONE] = rng.choice("abcd")
        for eng in engines:
            eng.observe_node(moved["metadata"]["name"], to_node(moved))
        return True
    return False


@pytest.mark.parametrize("seed", range(8))
def test_pruned_equals_exhaustive_while_excluded_nodes_come_and_go(seed: int) -> None:
    """The node search keeps across decisions where each list's first node that an
    anti-affinity exclusion allows was found, and its lists' heads: placements of pods it
    does not exclude (filed in front of that node), pods going (a zone no longer excluded)
    and nodes changing zones must not make it answer otherwise than evaluating every node."""
    rng = random.Random(seed)
    nodes = [
        zoned_node(f"n{i:02d}", rng.choice("abcdef"), gpus=4) for i in range(rng.randint(12, 20))
    ]
    pruned = engine(nodes)
    reference = engine(nodes, exhaustive=True)
    placed: list[str] = []
    for i in range(80):
        roll = rng.random()
        if churned(rng, roll, nodes, placed, (pruned, reference), forget=0.2, move=0.25):
            continue
        kind = rng.choice(["web", "db", "db", "filler"])
        builder = pod(f"p{i}").labels(app=kind)
        if kind == "web":
            builder.anti(HOSTNAME, app="web")
        elif kind == "db":
            builder.anti(ZONE, app="db").policy(node="spread")
        placed_alike(
            pruned, reference, builder.gpu(gpumem=rng.choice([2000, 6000])).json(), placed, i
        )
    assert pruned.stats.allocator_calls <= reference.stats.allocator_calls


@pytest.mark.parametrize("seed", range(12))
def test_pruned_equals_exhaustive_while_penalised_runs_come_and_go(seed: int) -> None:
    """The node search keeps across decisions where the runs of nodes that preferred
    spreading certainly penalises end in each list, and the heap it starts from with the
    lists' penalised heads lowered by the penalty's floor: placements (a node joins the runs,
    or a node the rule does not penalise is filed into one), pods of another scheduler
    coming and going (a node penalised, or no longer, without any list changing), our pods
    going and nodes changing zones must not make it answer otherwise than evaluating every
    node."""
    rng = random.Random(seed)
    nodes = [zoned_node(f"n{i:02d}", rng.choice("abc"), gpus=4) for i in range(rng.randint(12, 20))]
    names = [raw["metadata"]["name"] for raw, _ in nodes]
    keys = [(HOSTNAME, ZONE), (ZONE,), (HOSTNAME,)][seed % 3]  # (one deployment's rule)
    skew = rng.choice([1, 2, 5])
    pruned = engine(nodes)
    reference = engine(nodes, exhaustive=True)
    placed: list[str] = []
    theirs: list[str] = []
    for i in range(120):
        roll = rng.random()
        if churned(rng, roll, nodes, placed, (pruned, reference), forget=0.1, move=0.15):
            continue
        if theirs and roll < 0.22:
            uid = theirs.pop(rng.randrange(len(theirs)))
            for eng in (pruned, reference):
                eng.observe_pod(uid, None)
            continue
        if roll < 0.3:
            other = pod(f"t{i}").scheduler("default-scheduler").labels(app="web")
            raw = other.on(rng.choice(names)).json()
            for eng in (pruned, reference):
                eng.observe_pod(raw["metadata"]["uid"], raw["spec"]["nodeName"], raw=raw)
            theirs.append(raw["metadata"]["uid"])
            continue
        builder = pod(f"p{i}").labels(app=rng.choice(["web", "web", "db"]))
        for key in keys:
            builder.spread(key, skew, when="ScheduleAnyway", app="web")
        if rng.random() < 0.2:
            builder.policy(node="spread")
        placed_alike(
            pruned, reference, builder.gpu(gpumem=rng.choice([2000, 6000])).json(), placed, i
        )
    assert pruned.stats.allocator_calls <= reference.stats.allocator_calls


def test_a_workloads_spread_constraints_are_parsed_once_and_match_label_keys_apart() -> None:
    """The rule environment keeps a pod's own spread constraints parsed per distinct list:
    replicas share the parse, a pod's labels count where matchLabelKeys reads them, and a
    malformed list still raises for every pod that carries it."""
    env = environment(rule_nodes(("a0", {ZONE: "a"})))

    def spread(name: str, version: str, *keys: str) -> JSON:
        builder = pod(name).labels(app="web", version=version)
        return builder.spread(ZONE, 2, match_keys=keys, app="web").json()

    first = env.own_constraints(spread("p0", "1"), "pod p0")
    assert env.own_constraints(spread("p1", "2"), "pod p1") is first
    keyed = env.own_constraints(spread("p2", "1", "version"), "pod p2")
    other = env.own_constraints(spread("p3", "2", "version"), "pod p3")
    assert keyed[0].selector != other[0].selector
    assert keyed[0].selector.matches({"app": "web", "version": "1"})
    assert not keyed[0].selector.matches({"app": "web", "version": "2"})
    assert env.own_constraints(spread("p4", "1", "version"), "pod p4") is keyed
    bad = spread("p5", "1")
    bad["spec"]["topologySpreadConstraints"][0]["maxSkew"] = 0
    for _ in range(2):
        with pytest.raises(ManifestError, match="maxSkew"):
            env.own_constraints(bad, "pod p5")

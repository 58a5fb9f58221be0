"""The victim search (driver.scheduling.preemption), table-driven.

Each case cites the upstream rule it pins: kube-scheduler's
``pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go``
(``SelectVictimsOnNode``, ``filterPodsWithPDBViolation``, ``calculateNumCandidates``,
``PodEligibleToPreemptOthers``) and ``pkg/scheduler/framework/preemption/preemption.go``
(``pickOneNodeForPreemption``). ``fits`` is a node model here: GPUs per pod and a node
capacity, with claims shared between pods (a shared claim's devices stay held while any pod
that reserves it remains), so the table can state what a victim frees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest

from driver.api.errors import ManifestError
from driver.api.labels import LabelSelector
from driver.scheduling.preemption import (
    NOT_STARTED,
    DisruptionBudget,
    NodeVictims,
    PodOnNode,
    budget_violations,
    candidate_count,
    candidate_offset,
    may_preempt,
    pick_one,
    pod_priority,
    select_victims,
)


def on(name: str, priority: int, start: float = 0.0, **labels: str) -> PodOnNode:
    return PodOnNode(
        uid=f"uid-{name}", namespace="ns", name=name, priority=priority, start=start, labels=labels
    )


def gpu_node(
    claims: Mapping[str, tuple[int, Sequence[str]]], want: int
) -> Callable[[frozenset[str]], bool]:
    """A full node: ``claims`` (claim -> (GPUs, names of the pods reserving it)) hold all its
    GPUs. The pod wanting ``want`` GPUs fits when the claims still reserved by a remaining pod
    leave enough."""
    capacity = sum(gpus for gpus, _ in claims.values())

    def fits(removed: frozenset[str]) -> bool:
        held = sum(
            gpus for gpus, users in claims.values() if any(f"uid-{u}" not in removed for u in users)
        )
        return capacity - held >= want

    return fits


def names(found: NodeVictims | None) -> list[str] | None:
    return None if found is None else [v.name for v in found.victims]


Claims = dict[str, tuple[int, Sequence[str]]]
SELECT: list[tuple[str, int, list[PodOnNode], Claims, int, list[str] | None]] = [
    (
        # SelectVictimsOnNode: only pods of strictly lower priority are potential victims
        # (isPreemptionAllowed: PodPriority(victim) < PodPriority(preemptor)).
        "equal priority is never a victim",
        10,
        [on("a", 10), on("b", 10)],
        {"ca": (1, ["a"]), "cb": (1, ["b"])},
        1,
        None,
    ),
    (
        "higher priority is never a victim",
        10,
        [on("a", 20), on("b", 5)],
        {"ca": (1, ["a"]), "cb": (1, ["b"])},
        2,
        None,  # removing b alone frees one GPU: not enough, and a may not go
    ),
    (
        # Reprieve most important first: the least important pod (lowest priority, then the
        # latest start) is the one that goes.
        "exactly one victim on a full node: the least important",
        100,
        [on("a", 0, 1.0), on("b", 0, 2.0), on("c", 0, 3.0), on("d", 0, 0.5)],
        {f"c{n}": (1, [n]) for n in "abcd"},
        1,
        ["c"],
    ),
    (
        "lower priority goes before an earlier start",
        100,
        [on("old", 1, 0.0), on("young", 5, 9.0), on("mid", 1, 5.0)],
        {"c1": (1, ["old"]), "c2": (1, ["young"]), "c3": (1, ["mid"])},
        2,
        ["old", "mid"],
    ),
    (
        "each reprieve keeps a pod while the others free enough: the 2-GPU pod alone goes",
        100,
        [on("big", 0, 3.0), on("s1", 0, 1.0), on("s2", 0, 2.0)],
        {"cbig": (2, ["big"]), "c1": (1, ["s1"]), "c2": (1, ["s2"])},
        2,
        ["big"],
    ),
    (
        # A shared claim frees its devices only when no remaining pod reserves it.
        "a shared claim does not count as freed while another pod uses it",
        100,
        [on("solo", 0, 1.0), on("share1", 0, 2.0), on("share2", 5, 0.0)],
        {"shared": (1, ["share1", "share2"]), "own": (1, ["solo"])},
        1,
        ["solo"],
    ),
    (
        "a shared claim is freed when all its users are victims",
        100,
        [on("share1", 0, 1.0), on("share2", 0, 2.0)],
        {"shared": (2, ["share1", "share2"])},
        2,
        ["share1", "share2"],
    ),
    (
        "the pod does not fit even without every lower-priority pod: no candidate",
        100,
        [on("a", 0), on("b", 200)],
        {"ca": (1, ["a"]), "cb": (3, ["b"])},
        2,
        None,
    ),
    (
        # DryRunPreemption: a node where the pod fits without victims is no candidate.
        "fits without any victim: no candidate",
        100,
        [on("a", 0)],
        {"ca": (1, ["a"]), "free": (1, [])},
        1,
        None,
    ),
    (
        "no lower-priority pod at all: no candidate",
        0,
        [on("a", 0)],
        {"ca": (4, ["a"])},
        1,
        None,
    ),
]


@pytest.mark.parametrize(
    ("priority", "pods", "claims", "want", "expected"),
    [case[1:] for case in SELECT],
    ids=[case[0] for case in SELECT],
)
def test_select_victims(
    priority: int,
    pods: list[PodOnNode],
    claims: dict[str, tuple[int, Sequence[str]]],
    want: int,
    expected: list[str] | None,
) -> None:
    found = select_victims("n1", priority, pods, (), gpu_node(claims, want))
    assert names(found) == expected


def test_select_victims_reprieves_budget_protected_pods_first() -> None:
    """SelectVictimsOnNode: PDB-violating potential victims are reprieved first, so a pod a
    budget protects stays whenever evicting an unprotected one is enough."""
    protected = on("protected", 0, 9.0, app="db")  # least important by start time
    other = on("other", 0, 1.0, app="web")
    budget = DisruptionBudget("ns", "db", LabelSelector.from_labels({"app": "db"}), allowed=0)
    claims = {"c1": (1, ["protected"]), "c2": (1, ["other"])}
    found = select_victims("n1", 10, [protected, other], [budget], gpu_node(claims, 1))
    assert found is not None
    assert names(found) == ["other"]
    assert found.violations == 0
    # Without the budget the least important (the later start) goes.
    found = select_victims("n1", 10, [protected, other], [], gpu_node(claims, 1))
    assert names(found) == ["protected"]
    # When both must go, the violation is counted.
    found = select_victims("n1", 10, [protected, other], [budget], gpu_node(claims, 2))
    assert found is not None
    assert found.violations == 1
    assert names(found) == ["other", "protected"], "victims stay sorted most important first"


def test_budget_violations_follow_upstream_counting() -> None:
    """filterPodsWithPDBViolation: each matching budget's disruptionsAllowed is decremented
    per pod, in order; a pod in disruptedPods is not counted; an empty selector, another
    namespace or a pod without labels matches nothing."""
    selector = LabelSelector.from_labels({"app": "x"})
    budget = DisruptionBudget("ns", "b", selector, allowed=1, disrupted=frozenset({"gone"}))
    pods = [on("p1", 0, app="x"), on("gone", 0, app="x"), on("p2", 0, app="x"), on("p3", 0)]
    violating, fine = budget_violations(pods, [budget])
    assert [p.name for p in violating] == ["p2"]
    assert [p.name for p in fine] == ["p1", "gone", "p3"]
    empty = DisruptionBudget("ns", "e", LabelSelector.from_api({}, "t"), allowed=0)
    elsewhere = DisruptionBudget("other", "o", selector, allowed=0)
    assert budget_violations(pods, [empty, elsewhere]) == ([], pods)


def test_budget_from_api() -> None:
    raw = {
        "metadata": {"name": "b", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "minAvailable": 1},
        "status": {"disruptionsAllowed": 2, "disruptedPods": {"p": "2024-01-01T00:00:00Z"}},
    }
    budget = DisruptionBudget.from_api(raw)
    assert budget.allowed == 2
    assert budget.disrupted == frozenset({"p"})
    assert budget.selector is not None
    assert budget.selector.matches({"app": "x"})
    bad = {**raw, "spec": {"selector": {"matchExpressions": [{"key": "a", "operator": "Nope"}]}}}
    assert DisruptionBudget.from_api(bad).selector is None  # an invalid selector matches nothing


def cand(node: str, *victims: PodOnNode, violations: int = 0) -> NodeVictims:
    return NodeVictims(node, tuple(victims), violations)


PICK: list[tuple[str, list[NodeVictims], str]] = [
    # pickOneNodeForPreemption, criteria in order.
    (
        "1. fewest PDB violations",
        [cand("a", on("x", 0), violations=1), cand("b", on("y", 5), on("z", 5))],
        "b",
    ),
    (
        "2. lowest highest-victim priority",
        [cand("a", on("x", 7)), cand("b", on("y", 3), on("z", 3), on("w", 3))],
        "b",
    ),
    (
        "3. smallest sum of priorities (negative priorities count as MaxInt32+1 more)",
        [cand("a", on("x", -5), on("y", -5)), cand("b", on("z", -5))],
        "b",
    ),
    (
        "3. smallest sum of priorities",
        [cand("a", on("x", 5), on("y", 4)), cand("b", on("z", 5), on("w", 1))],
        "b",
    ),
    (
        "4. fewest victims",
        [cand("a", on("x", 0), on("y", 0)), cand("b", on("z", 0))],
        "b",
    ),
    (
        "5. latest start of the highest-priority victims",
        [cand("a", on("x", 0, 10.0)), cand("b", on("y", 0, 20.0))],
        "b",
    ),
    (
        "5. a victim that has not started counts as starting now",
        [cand("a", on("x", 0, 10.0)), cand("b", on("y", 0, NOT_STARTED))],
        "b",
    ),
    (
        "6. then the name",
        [cand("b", on("x", 0, 1.0)), cand("a", on("y", 0, 1.0))],
        "a",
    ),
]


@pytest.mark.parametrize(
    ("candidates", "expected"), [c[1:] for c in PICK], ids=[c[0] for c in PICK]
)
def test_pick_one(candidates: list[NodeVictims], expected: str) -> None:
    found = pick_one(candidates)
    assert found is not None
    assert found.node == expected


def test_pick_one_ties_go_to_the_callers_rank() -> None:
    tied = [cand("a", on("x", 0, 1.0)), cand("b", on("y", 0, 1.0))]
    found = pick_one(tied, tie=lambda node: {"a": 2, "b": 1}[node])
    assert found is not None
    assert found.node == "b"
    assert pick_one([]) is None


@pytest.mark.parametrize(
    ("nodes", "expected"), [(0, 0), (5, 5), (100, 100), (500, 100), (1000, 100), (5000, 500)]
)
def test_candidate_count(nodes: int, expected: int) -> None:
    """calculateNumCandidates: 10 % of the nodes, at least 100, never more than the nodes."""
    assert candidate_count(nodes) == expected


def test_candidate_offset_is_stable_and_in_range() -> None:
    offsets = {candidate_offset(f"uid-{i}", 50) for i in range(200)}
    assert offsets <= set(range(50))
    assert len(offsets) > 10
    assert candidate_offset("same", 50) == candidate_offset("same", 50)
    assert candidate_offset("any", 0) == 0


def test_pod_priority_and_policy() -> None:
    assert pod_priority({"spec": {}}) == 0
    assert pod_priority({"spec": {"priority": -7}}) == -7
    with pytest.raises(ManifestError, match=r"spec\.priority"):
        pod_priority({"spec": {"priority": "high"}})
    assert may_preempt({"spec": {"preemptionPolicy": "PreemptLowerPriority"}})
    assert may_preempt({"spec": {}})
    assert not may_preempt({"spec": {"preemptionPolicy": "Never"}})

"""Preemption inside the decision engine: what victims free (whole GPUs, exactly a fraction's
share, shared claims only when no remaining pod reserves them), PodDisruptionBudgets,
``preemptionPolicy: Never``, nominations holding devices against equal or lower priority,
the other rules kept true, and the engine left exactly as it was by a dry run.

Upstream rules cited per test: kube-scheduler's DefaultPreemption
(``SelectVictimsOnNode``, ``PodEligibleToPreemptOthers``, ``pickOneNodeForPreemption``) and
``RunFilterPluginsWithNominatedPods`` (nominated pods of equal or higher priority count on
their node).
"""

from __future__ import annotations

from typing import Any

from driver.api.labels import LabelSelector
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import NoPreemption, Placement, Preemption, Unschedulable
from driver.scheduling.preemption import DisruptionBudget
from tests.unit.pods import HOSTNAME
from tests.unit.test_decision import engine, gpu_node, legacy_pod

JSON = dict[str, Any]


def prio(pod: JSON, priority: int, *, start: str | None = None, **labels: str) -> JSON:
    pod["spec"]["priority"] = priority
    if labels:
        pod["metadata"]["labels"] = labels
    if start is not None:
        pod["status"] = {"startTime": start}
    return pod


def run(eng: DecisionEngine, pod: JSON, *, also_reserved_by: tuple[str, ...] = ()) -> Placement:
    """Place ``pod`` and let the cluster show it bound and its bridge claim allocated and
    reserved (for ``also_reserved_by`` too)."""
    decision = eng.decide(pod)
    assert isinstance(decision, Placement), decision
    eng.assume(decision, pod)
    uid = pod["metadata"]["uid"]
    assert decision.bridge_allocation is not None
    eng.observe_allocation(
        f"default/{pod['metadata']['name']}-extended-resources-x",
        decision.bridge_allocation,
        bridge_of=uid,
        reserved_for=(uid, *also_reserved_by),
    )
    bound = {**pod, "spec": {**pod["spec"], "nodeName": decision.node}}
    eng.observe_pod(uid, decision.node, raw=bound)
    return decision


def preempt(eng: DecisionEngine, pod: JSON, budgets: tuple[DisruptionBudget, ...] = ()) -> Any:
    assert isinstance(eng.decide(pod), Unschedulable)
    before = eng.state()
    found = eng.preempt(pod, (), budgets)
    assert eng.state() == before, "a dry run changes nothing"
    return found


def victims(found: Any) -> list[str]:
    assert isinstance(found, Preemption), found
    return [v.name for v in found.victims]


def test_exactly_one_low_priority_victim_on_the_full_node() -> None:
    """The issue's scenario: 4 GPUs held by priority-0 pods; a priority-1,000,000 pod preempts
    the least important one (SelectVictimsOnNode reprieves the most important first) and would
    take the GPU it frees."""
    eng = engine([gpu_node("n1", 4)])
    placed = [
        run(eng, prio(legacy_pod(f"low-{i}"), 0, start=f"2026-01-01T00:00:0{i}Z")) for i in range(4)
    ]
    found = preempt(eng, prio(legacy_pod("high"), 1_000_000))
    assert victims(found) == ["low-3"]  # the latest start
    assert found.node == "n1"
    assert found.violations == 0
    allocation = found.placement.bridge_allocation
    assert allocation is not None
    assert [r.device for r in allocation.results] == [
        r.device for r in placed[3].all_results[0].results
    ], "it would take exactly the GPU its victim frees"


def test_equal_priority_and_never_do_not_preempt() -> None:
    """isPreemptionAllowed: only strictly lower priority; PodEligibleToPreemptOthers:
    ``preemptionPolicy: Never`` waits."""
    eng = engine([gpu_node("n1", 2)])
    for i in range(2):
        run(eng, prio(legacy_pod(f"p-{i}"), 10))
    same = preempt(eng, prio(legacy_pod("same"), 10))
    assert isinstance(same, NoPreemption)
    assert "not helpful" in same.message
    never = prio(legacy_pod("never"), 1000)
    never["spec"]["preemptionPolicy"] = "Never"
    found = preempt(eng, never)
    assert isinstance(found, NoPreemption)
    assert found.message == "preemption: not eligible due to preemptionPolicy=Never."


def test_a_fractional_victim_frees_exactly_its_share() -> None:
    """One 16 GiB GPU shared by a 10000 MiB pod (earlier) and a 6000 MiB pod (later): a pod
    wanting 6000 MiB evicts the later one; one wanting 7000 MiB needs the larger share, and
    the smaller pod is reprieved."""

    def cluster() -> DecisionEngine:
        eng = engine([gpu_node("n1", 1)])
        run(eng, prio(legacy_pod("big", gpumem=10000), 0, start="2026-01-01T00:00:00Z"))
        run(eng, prio(legacy_pod("small", gpumem=6000), 0, start="2026-01-01T00:00:09Z"))
        return eng

    assert victims(preempt(cluster(), prio(legacy_pod("h6", gpumem=6000), 5))) == ["small"]
    assert victims(preempt(cluster(), prio(legacy_pod("h7", gpumem=7000), 5))) == ["big"]


def test_a_shared_claim_frees_its_gpu_only_with_every_user_gone() -> None:
    """A claim reserved by a pod that stays keeps its devices: the victim search does not
    count its GPU as freed."""
    eng = engine([gpu_node("n1", 1)])
    helper = prio(legacy_pod("helper"), 500)
    helper["spec"]["containers"][0]["resources"] = {}
    bound = {**helper, "spec": {**helper["spec"], "nodeName": "n1"}}
    eng.observe_pod("uid-helper", "n1", raw=bound)
    run(eng, prio(legacy_pod("user"), 0), also_reserved_by=("uid-helper",))
    found = preempt(eng, prio(legacy_pod("high"), 100))
    assert isinstance(found, NoPreemption), "the helper (priority 500) keeps the claim"
    # When the other user may go too, both are victims.
    eng2 = engine([gpu_node("n1", 1)])
    low_helper = prio(legacy_pod("helper"), 0)
    low_helper["spec"]["containers"][0]["resources"] = {}
    eng2.observe_pod(
        "uid-helper", "n1", raw={**low_helper, "spec": {**low_helper["spec"], "nodeName": "n1"}}
    )
    run(eng2, prio(legacy_pod("user"), 0), also_reserved_by=("uid-helper",))
    assert sorted(victims(preempt(eng2, prio(legacy_pod("high"), 100)))) == ["helper", "user"]


def test_a_budget_protected_victim_is_avoided_when_another_exists() -> None:
    """pickOneNodeForPreemption: the node with the fewest PDB violations wins, whatever
    else (here n1's victim started later, which would otherwise win)."""
    eng = engine([gpu_node("n1", 1), gpu_node("n2", 1)])
    a = prio(legacy_pod("db"), 0, start="2026-01-01T00:00:09Z", app="db")
    b = prio(legacy_pod("web"), 0, start="2026-01-01T00:00:00Z", app="web")
    nodes = {run(eng, a).node: "db", run(eng, b).node: "web"}
    budget = DisruptionBudget("default", "db", LabelSelector.from_labels({"app": "db"}), 0)
    found = preempt(eng, prio(legacy_pod("high"), 100), (budget,))
    assert victims(found) == ["web"]
    assert found.violations == 0
    assert nodes[found.node] == "web"
    without = preempt(eng, prio(legacy_pod("high2"), 100))
    assert victims(without) == ["db"], "without the budget the later start goes"


def test_rules_stay_true_anti_affinity_to_a_higher_priority_pod_is_not_resolved() -> None:
    """Victims are only lower-priority pods, so a rule that a higher-priority pod breaks
    stays broken: no candidate."""
    eng = engine([gpu_node("n1", 2)])
    guard = prio(legacy_pod("guard"), 1000, app="guard")
    guard["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "high"}}, "topologyKey": HOSTNAME}
            ]
        }
    }
    run(eng, guard)
    run(eng, prio(legacy_pod("low"), 0))
    found = preempt(eng, prio(legacy_pod("high"), 100, app="high"))
    assert isinstance(found, NoPreemption)


def test_an_anti_affinity_victim_is_removed_for_the_rule() -> None:
    """A lower-priority pod whose anti-affinity repels the preemptor is a victim whose removal
    makes the rule true (RemovePod updates InterPodAffinity's state)."""
    eng = engine([gpu_node("n1", 2)])
    repel = prio(legacy_pod("repel"), 0, app="repel")
    repel["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "high"}}, "topologyKey": HOSTNAME}
            ]
        }
    }
    run(eng, repel)
    found = preempt(eng, prio(legacy_pod("high"), 100, app="high"))
    assert victims(found) == ["repel"]


def test_a_nomination_holds_its_devices_against_equal_or_lower_priority() -> None:
    """RunFilterPluginsWithNominatedPods: pods nominated to a node with equal or higher
    priority count there first. Once the victim is gone, the freed GPU is held for the
    nominated pod: an equal-priority pod does not get it, a higher one does, and the
    nominated pod itself does."""
    eng = engine([gpu_node("n1", 2)])
    for i in range(2):
        run(eng, prio(legacy_pod(f"low-{i}"), 0, start=f"2026-01-01T00:00:0{i}Z"))
    high = prio(legacy_pod("high"), 100)
    found = preempt(eng, high)
    assert isinstance(found, Preemption)
    eng.nominate(found, high)
    for victim in found.victims:
        eng.observe_pod(victim.uid, None)
        eng.observe_allocation(f"default/{victim.name}-extended-resources-x", None)
    assert isinstance(eng.decide(prio(legacy_pod("equal"), 100)), Unschedulable)
    assert isinstance(eng.decide(prio(legacy_pod("lower"), 5)), Unschedulable)
    assert isinstance(eng.decide(prio(legacy_pod("higher"), 101)), Placement)
    placed = eng.decide(high)
    assert isinstance(placed, Placement)
    assert placed.node == "n1"
    eng.assume(placed, high)
    assert eng.nomination("uid-high") is None, "placed: the nomination is dropped"


def test_a_foreign_nomination_holds_requests() -> None:
    """A pod kube-scheduler nominated holds its cpu there against lower priority."""
    eng = engine([gpu_node("n1", 1, allocatable={"cpu": "4", "memory": "8Gi", "pods": "110"})])
    theirs = prio(legacy_pod("theirs"), 50)
    theirs["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "3"}}
    eng.observe_nomination("uid-theirs", "n1", theirs)
    mine = prio(legacy_pod("mine"), 10)
    mine["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2"}
    assert isinstance(eng.decide(mine), Unschedulable)
    eng.observe_nomination("uid-theirs", None, theirs)
    assert isinstance(eng.decide(mine), Placement)

"""``biaxial simulate`` with priorities and disruption budgets: pods are ordered by priority
(kube-scheduler's PrioritySort), PriorityClasses resolve ``spec.priority`` as the Priority
admission plugin does (class by name, else the ``globalDefault`` class, else 0; a missing class
is refused), and a pending pod that fits nowhere reports the running pods it would preempt
(DefaultPreemption's dry run, PodDisruptionBudgets honoured) without anything performed."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from biaxial.simulate.priority import PriorityClasses, budget_from_api
from driver.api.errors import ManifestError
from tests.unit.test_simulator import pod, run, template, with_claim

JSON = dict[str, Any]
WHOLE = template("whole", count=1)


def priority_class(name: str, value: int, *, default: bool = False, **extra: Any) -> JSON:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": default,
        **extra,
    }


def gpu_pod(name: str, **spec: Any) -> JSON:
    return with_claim(pod(name, **spec), "whole")


def running_cluster(count: int) -> list[JSON]:
    """``count`` priority-0 one-GPU pods as a cluster dump shows them: bound, claims allocated."""
    first = run(WHOLE, *(gpu_pod(f"low-{i}") for i in range(count)))
    assert len(first.placements) == count
    return copy.deepcopy(first.objects)


def test_pending_pods_are_placed_highest_priority_first() -> None:
    state = running_cluster(7)  # one GPU of eight left
    result = run(
        WHOLE,
        *state,
        priority_class("high", 1000),
        gpu_pod("a-first"),
        gpu_pod("b-important", priorityClassName="high"),
    )
    placed = {p.pod for p in result.placements}
    assert placed == {"default/b-important"}, "the later but higher-priority pod gets the GPU"
    assert [f.pod for f in result.unschedulable] == ["default/a-first"]
    assert result.preemptions == [], "priority 0 preempts no priority-0 pod"


def test_a_pod_that_fits_nowhere_reports_its_victims_without_evicting() -> None:
    state = running_cluster(8)
    result = run(
        WHOLE, *state, priority_class("high", 1000), gpu_pod("urgent", priorityClassName="high")
    )
    assert [f.pod for f in result.unschedulable] == ["default/urgent"]
    (report,) = result.preemptions
    assert report.pod == "default/urgent"
    assert len(report.victims) == 1, "the fewest victims: one GPU is enough"
    assert report.violations == 0
    assert len(result.placements) == 0, "nothing performed"
    assert result.to_json()["preemptions"][0]["victims"] == list(report.victims)


def test_a_budget_protected_node_is_avoided() -> None:
    state = running_cluster(8)
    t4 = set()
    for obj in state:
        if obj["kind"] == "Pod" and obj["spec"]["nodeName"] == "gpu-t4":
            obj["metadata"]["labels"] = {"app": "db"}
            t4.add(f"default/{obj['metadata']['name']}")
    assert len(t4) == 4
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "db"}}},
    }
    result = run(
        WHOLE, *state, budget, priority_class("high", 10), gpu_pod("u", priorityClassName="high")
    )
    (report,) = result.preemptions
    assert report.node == "gpu-a10g", "fewest budget violations first (pickOneNodeForPreemption)"
    assert not set(report.victims) & t4


def test_preemption_policy_never_reports_nothing() -> None:
    state = running_cluster(8)
    result = run(
        WHOLE,
        *state,
        priority_class("polite", 1000, preemptionPolicy="Never"),
        gpu_pod("waits", priorityClassName="polite"),
    )
    assert [f.pod for f in result.unschedulable] == ["default/waits"]
    assert result.preemptions == []


def test_admission_of_priorities() -> None:
    classes = PriorityClasses(
        [priority_class("low", 5, default=True), priority_class("lower", 1, default=True)]
    )
    defaulted = classes.admit(pod("x"))
    # Several global defaults: the lowest value, as the Priority admission plugin.
    assert defaulted["spec"]["priority"] == 1
    assert defaulted["spec"]["priorityClassName"] == "lower"
    assert defaulted["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    admitted = pod("y", priorityClassName="gone", priority=7)
    assert classes.admit(admitted) is admitted, "an admitted pod keeps its spec.priority"
    assert (
        classes.admit(pod("z", priorityClassName="system-node-critical"))["spec"]["priority"]
        == 2_000_001_000
    )
    with pytest.raises(ManifestError, match="no PriorityClass with name gone was found"):
        classes.admit(pod("w", priorityClassName="gone"))
    assert PriorityClasses([]).admit(pod("v"))["spec"]["priority"] == 0


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ({"minAvailable": 2}, 1),
        ({"minAvailable": "50%"}, 1),  # 1.5 rounded up to 2 desired
        ({"maxUnavailable": 1}, 1),
        ({"maxUnavailable": "10%"}, 1),  # rounded up
        ({"minAvailable": 5}, 0),
    ],
)
def test_a_budget_without_status_gets_it_computed(spec: JSON, allowed: int) -> None:
    running = [
        {"metadata": {"name": f"p{i}", "namespace": "default", "labels": {"app": "db"}}}
        for i in range(3)
    ]
    raw = {
        "metadata": {"name": "b", "namespace": "default"},
        "spec": {**spec, "selector": {"matchLabels": {"app": "db"}}},
    }
    assert budget_from_api(raw, running).allowed == allowed
    given = {**raw, "status": {"disruptionsAllowed": 9}}
    assert budget_from_api(given, running).allowed == 9, "a dump's status is read as it is"

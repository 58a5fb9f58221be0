"""Priority and preemption with the live controller against the API emulator: the issue's
scenario (a priority-1,000,000 pod on a node full of priority-0 pods preempts exactly one,
is nominated and binds once its victim is gone), PodDisruptionBudgets, ``preemptionPolicy:
Never`` waiting and then served before earlier lower-priority pods, a shared claim that does not
count as freed, a fractional victim freeing exactly its share, and a controller killed in the
middle of a preemption converging without deleting a victim twice.

Upstream rules: kube-scheduler's PrioritySort and DefaultPreemption (``SelectVictimsOnNode``,
``PreemptPod``: the ``DisruptionTarget`` condition with reason ``PreemptionByScheduler``, then
delete; the ``Preempted`` event; ``PodEligibleToPreemptOthers``; ``pickOneNodeForPreemption``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    checked_controller,
    fast_settings,
    pod,
    pod_condition,
    pod_events,
    resource_claim,
    seed_cluster,
)

JSON = dict[str, Any]
NODE = "gpu-t4"


@pytest.fixture
def cluster(emulator: Emulator, claim_controller: ResourceClaimController) -> Emulator:
    seed_cluster(emulator, {NODE: "t4x4"})
    return emulator


@pytest.fixture
def controller(cluster: Emulator) -> Iterator[ControllerThread]:
    with checked_controller(cluster) as running:
        yield running


def prioritised(body: JSON, priority: int, **labels: str) -> JSON:
    """A pod as the Priority admission plugin leaves it: its class name and spec.priority."""
    body["spec"]["priorityClassName"] = f"p{priority}"
    body["spec"]["priority"] = priority
    if labels:
        body["metadata"]["labels"] = labels
    return body


def status(emulator: Emulator, name: str) -> JSON:
    return (emulator.get("pods", name, "default") or {}).get("status") or {}


def terminating(emulator: Emulator) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in emulator.list("pods")
        if p["metadata"].get("deletionTimestamp")
    )


def fill(emulator: Emulator, names: list[str], **kwargs: Any) -> None:
    for name in names:
        emulator.create(prioritised(pod(name, **kwargs), 0))
    emulator.wait_until(lambda: len(bound_pods(emulator, names)) == len(names), timeout=30)


def test_the_issue_scenario_one_victim_nomination_and_binding(
    cluster: Emulator, controller: ControllerThread
) -> None:
    low = [f"low-{i}" for i in range(4)]
    fill(cluster, low, legacy_gpus=1)
    cluster.create(prioritised(pod("urgent", legacy_gpus=1), 1_000_000))
    cluster.wait_until(
        lambda: status(cluster, "urgent").get("nominatedNodeName") == NODE and terminating(cluster),
        timeout=20,
        message=f"urgent: {status(cluster, 'urgent')}",
    )
    victims = terminating(cluster)
    assert len(victims) == 1, "exactly one victim on the full node"
    victim = victims[0]
    condition = next(
        c for c in status(cluster, victim)["conditions"] if c["type"] == "DisruptionTarget"
    )
    assert condition["status"] == "True"
    assert condition["reason"] == "PreemptionByScheduler"
    assert condition["message"] == "biaxial: preempting to accommodate a higher priority pod"
    victim_obj = cluster.get("pods", victim, "default")
    assert victim_obj is not None
    assert victim_obj["metadata"]["deletionGracePeriodSeconds"] == 30, "its own grace period"
    urgent_uid = cluster.get("pods", "urgent", "default")["metadata"]["uid"]  # type: ignore[index]
    preempted = ("Preempted", f"Preempted by pod {urgent_uid} on node {NODE}")
    cluster.wait_until(lambda: preempted in pod_events(cluster, victim), timeout=10)
    cluster.wait_until(
        lambda: any(r == "Preempting" for r, _ in pod_events(cluster, "urgent")), timeout=10
    )
    assert "urgent" not in bound_pods(cluster), "bound only once the victim is gone"
    cluster.finish_pod_deletions()
    cluster.wait_until(lambda: bound_pods(cluster).get("urgent") == NODE, timeout=20)
    assert "nominatedNodeName" not in status(cluster, "urgent"), "the binding clears it"
    assert sorted(bound_pods(cluster, low)) == sorted(set(low) - {victim})
    assert check_invariants(cluster) == []


def test_a_budget_protected_victim_is_avoided(
    cluster: Emulator, controller: ControllerThread
) -> None:
    """Victims that a PodDisruptionBudget protects are reprieved first: the unprotected pod
    goes although, by importance alone, a protected one would."""
    for name in ("a-web", "z-db-0", "z-db-1", "z-db-2"):
        app = "web" if name == "a-web" else "db"
        cluster.create(prioritised(pod(name, legacy_gpus=1), 0, app=app))
    cluster.wait_until(lambda: len(bound_pods(cluster)) == 4, timeout=30)
    cluster.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "db"}}},
        }
    )
    cluster.update_status(
        "poddisruptionbudgets",
        "db",
        {
            "disruptionsAllowed": 0,
            "currentHealthy": 3,
            "desiredHealthy": 3,
            "expectedPods": 3,
            "observedGeneration": 1,
        },
        "default",
    )
    controller.on_loop(lambda: None)  # the controller's loop has run since
    cluster.wait_until(
        lambda: len(controller.on_loop(lambda: controller.controller.cache.budgets.store)) == 1,  # type: ignore[union-attr]
        timeout=10,
    )
    cluster.create(prioritised(pod("urgent", legacy_gpus=1), 100))
    cluster.wait_until(lambda: bool(terminating(cluster)), timeout=20)
    assert terminating(cluster) == ["a-web"]
    cluster.finish_pod_deletions()
    cluster.wait_until(lambda: "urgent" in bound_pods(cluster), timeout=20)
    assert check_invariants(cluster) == []


def test_never_waits_and_is_then_served_before_earlier_lower_priority_pods(
    cluster: Emulator,
) -> None:
    """``preemptionPolicy: Never`` evicts nothing (PodEligibleToPreemptOthers); when a GPU is
    freed, the waiting pod of higher priority gets it before a lower one that waited longer
    (PrioritySort). Backoff still applies as before (a pod backing off is not in the active
    queue), so it is set to 1 ms here: both pods are ready when the GPU is freed."""
    running = ControllerThread(
        cluster, fast_settings(backoff_initial_s=0.001, backoff_max_s=0.001)
    ).start()
    try:
        _never_then_priority(cluster)
        running.assert_engine_settles()
    finally:
        running.stop()
    assert running.error is None


def _never_then_priority(cluster: Emulator) -> None:
    low = [f"low-{i}" for i in range(4)]
    fill(cluster, low, legacy_gpus=1)
    cluster.create(prioritised(pod("early-low", legacy_gpus=1), 0))
    cluster.wait_until(lambda: pod_condition(cluster, "early-low") is not None, timeout=10)
    polite = prioritised(pod("polite", legacy_gpus=1), 1_000_000)
    polite["spec"]["preemptionPolicy"] = "Never"
    cluster.create(polite)
    cluster.wait_until(lambda: pod_condition(cluster, "polite") is not None, timeout=10)
    condition = pod_condition(cluster, "polite")
    assert condition is not None
    assert condition["message"].endswith("preemption: not eligible due to preemptionPolicy=Never.")
    assert terminating(cluster) == []
    assert not status(cluster, "polite").get("nominatedNodeName")
    cluster.delete("pods", "low-0", "default")
    cluster.finish_pod_deletions()
    cluster.wait_until(
        lambda: "polite" in bound_pods(cluster),
        timeout=20,
        message=f"bound: {bound_pods(cluster)}; polite: {pod_condition(cluster, 'polite')}",
    )
    assert "early-low" not in bound_pods(cluster)
    assert check_invariants(cluster) == []


def test_a_shared_claim_victim_does_not_free_its_gpu(
    cluster: Emulator, controller: ControllerThread
) -> None:
    """A claim reserved by a pod that stays keeps its device: the victim search evicts a pod
    whose removal frees a GPU, although the shared claim's other user is less important."""
    fill(cluster, ["a-0", "a-1", "a-2"], legacy_gpus=1)
    cluster.create(resource_claim("shared"))
    cluster.create(prioritised(pod("z-shared-user", claim="shared"), 0))
    cluster.create(prioritised(pod("keeper", claim="shared"), 500))
    cluster.wait_until(lambda: len(bound_pods(cluster)) == 5, timeout=30)
    cluster.create(prioritised(pod("urgent", legacy_gpus=1), 100))
    cluster.wait_until(lambda: bool(terminating(cluster)), timeout=20)
    assert terminating(cluster) == ["a-2"]
    cluster.finish_pod_deletions()
    cluster.wait_until(lambda: "urgent" in bound_pods(cluster), timeout=20)
    assert "z-shared-user" in bound_pods(cluster)
    assert check_invariants(cluster) == []


def test_a_fractional_victim_frees_exactly_its_share(
    cluster: Emulator, controller: ControllerThread
) -> None:
    """Four T4s (15360 MiB) each shared by a 10000 MiB and a 5000 MiB pod: a 6000 MiB pod
    needs a larger share than a small victim frees (5360 MiB), so one large pod goes and
    every small one stays."""
    big = [f"a-big-{i}" for i in range(4)]
    small = [f"z-small-{i}" for i in range(4)]
    fill(cluster, big, legacy_gpus=1, gpumem=10000)
    fill(cluster, small, legacy_gpus=1, gpumem=5000)
    cluster.create(prioritised(pod("urgent", legacy_gpus=1, gpumem=6000), 100))
    cluster.wait_until(lambda: bool(terminating(cluster)), timeout=20)
    assert terminating(cluster) == ["a-big-3"]
    cluster.finish_pod_deletions()
    cluster.wait_until(lambda: "urgent" in bound_pods(cluster), timeout=20)
    assert set(small) <= set(bound_pods(cluster))
    assert check_invariants(cluster) == []


def test_killed_mid_preemption_converges_without_deleting_a_victim_twice(
    cluster: Emulator,
) -> None:
    """Killed right after the first of two evictions: the restarted controller reads the
    nomination back, waits while that victim terminates (PodEligibleToPreemptOthers), then
    preempts again only what is still needed; every victim is deleted once."""
    first = ControllerThread(cluster, crash_at=lambda step, _key: step == "evict").start()
    try:
        fill(cluster, [f"low-{i}" for i in range(4)], legacy_gpus=1)
        cluster.create(prioritised(pod("urgent", legacy_gpus=2), 100))
        cluster.wait_until(lambda: first.crashed_at is not None, timeout=20)
    finally:
        first.kill()
    assert len(terminating(cluster)) == 1
    assert status(cluster, "urgent").get("nominatedNodeName") == NODE
    assert check_invariants(cluster) == []
    second = ControllerThread(cluster, fast_settings(identity="second")).start()
    try:
        cluster.wait_until(
            lambda: (
                second.on_loop(
                    lambda: second.controller.scheduler.feed.engine().nomination(  # type: ignore[union-attr]
                        cluster.get("pods", "urgent", "default")["metadata"]["uid"]  # type: ignore[index]
                    )
                )
                == NODE
            ),
            timeout=10,
        )
        assert len(terminating(cluster)) == 1, "no new victim while one still terminates"
        cluster.finish_pod_deletions()
        cluster.wait_until(lambda: len(terminating(cluster)) == 1, timeout=20)
        cluster.finish_pod_deletions()
        cluster.wait_until(lambda: bound_pods(cluster).get("urgent") == NODE, timeout=20)
        second.assert_engine_settles()
    finally:
        second.stop()
    assert second.error is None
    deletes = [r.path for r in cluster.requests_for(method="DELETE", resource="pods")]
    assert len(deletes) == 2
    assert len(set(deletes)) == 2, f"a victim deleted twice: {deletes}"
    assert len(bound_pods(cluster)) == 3
    assert check_invariants(cluster) == []


def test_no_new_victims_while_the_gone_victims_devices_are_being_released(
    cluster: Emulator, controller: ControllerThread
) -> None:
    """The victims are gone but the deallocator has not yet released their claims (their
    writes are slowed down here): the nominated pod is retried meanwhile (a pod deletion and
    the flush wake it), finds its devices still taken and must not preempt again. Upstream's
    ``PodEligibleToPreemptOthers``: a pod does not preempt again while what its earlier
    preemption freed on its nominated node is still on its way; here the victims' devices
    are on their way until their claims are deallocated. Two victims, each deleted once."""
    fill(cluster, [f"low-{i}" for i in range(4)], legacy_gpus=1)
    cluster.create(prioritised(pod("urgent", legacy_gpus=2), 100))
    cluster.wait_until(lambda: len(terminating(cluster)) == 2, timeout=20)
    assert status(cluster, "urgent").get("nominatedNodeName") == NODE
    waiting = controller.controller.scheduler.metrics.preemption_attempts.labels(  # type: ignore[union-attr]
        result="waiting"
    )

    def allocated() -> int:
        return sum(
            1 for c in cluster.list("resourceclaims") if (c.get("status") or {}).get("allocation")
        )

    assert allocated() == 4
    # Every claim write waits 3 s: longer than the flush (2 s) that retries the pod.
    cluster.add_latency(3.0, verbs={"update", "patch", "delete"}, resource="resourceclaims")
    cluster.finish_pod_deletions()
    before = waiting._value.get()
    cluster.wait_until(
        lambda: waiting._value.get() > before, timeout=10, message="no retry while releasing"
    )
    assert allocated() == 4, "the retry came while the victims' devices were on their way"
    assert terminating(cluster) == [], "no new victim"
    cluster.faults.clear()
    cluster.wait_until(lambda: bound_pods(cluster).get("urgent") == NODE, timeout=30)
    deletes = [r.path for r in cluster.requests_for(method="DELETE", resource="pods")]
    assert len(deletes) == 2, deletes
    assert len(bound_pods(cluster)) == 3
    assert check_invariants(cluster) == []

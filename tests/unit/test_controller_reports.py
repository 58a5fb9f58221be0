"""Unschedulable reports (controller.events) and equal pods' answers (controller.equivalence):
the condition only when it changes, events counted and spam-filtered as client-go's recorder
does, one report per pod waiting in the lane, and one engine run for a thousand replicas."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Coroutine
from typing import Any

from controller.api import EVENTS, PODS
from controller.commit import PodRef
from controller.equivalence import UnschedulableMemo, pod_signature
from controller.events import SPAM_BURST, SPAM_REFILL_S, Recorder
from driver.api.errors import NotFoundError
from driver.scheduling.outcome import Unschedulable
from tests.unit.controller_fakes import FakeApi

POD = PodRef(namespace="default", name="p", uid="uid-p")


class Lane:
    """The recorder's writer jobs, run to completion on demand."""

    def __init__(self) -> None:
        self.jobs: list[Coroutine[Any, Any, None]] = []

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.jobs.append(coro)

    async def run(self) -> None:
        while self.jobs:
            await self.jobs.pop(0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def recorder(api: FakeApi, lane: Lane, clock: Clock | None = None) -> Recorder:
    return Recorder(
        api, component="biaxial", instance="test", spawn=lane.spawn, clock=clock or Clock()
    )


def seed_pod(api: FakeApi) -> None:
    api.seed(PODS, {"metadata": {"name": "p", "uid": "uid-p"}, "spec": {}})


def events(api: FakeApi) -> list[dict[str, Any]]:
    return [obj for (plural, _, _), obj in api.objects.items() if plural == EVENTS.plural]


def writes(api: FakeApi) -> list[tuple[str, str, str | None]]:
    return [v for v in api.verbs() if v[0] in ("create", "patch")]


def test_the_same_message_twice_writes_the_condition_once_and_counts_the_event() -> None:
    # client-go tools/record: an event equal to one recorded before is patched (count + 1,
    # lastTimestamp), not created again; kube-scheduler writes PodScheduled only on a change.
    api, lane = FakeApi(), Lane()
    seed_pod(api)
    rec = recorder(api, lane)

    async def scenario() -> None:
        rec.unschedulable(POD, "0/2 nodes are available: 2 Insufficient cpu.")
        await lane.run()
        rec.unschedulable(POD, "0/2 nodes are available: 2 Insufficient cpu.")
        await lane.run()

    asyncio.run(scenario())
    assert writes(api) == [
        ("patch", "pods", "status"),
        ("create", "events", None),
        ("patch", "events", None),
    ]
    (event,) = events(api)
    assert event["count"] == 2
    assert event["reason"] == "FailedScheduling"
    conditions = api.stored(PODS, "p")["status"]["conditions"]  # type: ignore[index]
    assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [
        ("PodScheduled", "False", "Unschedulable")
    ]


def test_a_condition_the_pod_already_shows_is_not_written_again() -> None:
    api, lane = FakeApi(), Lane()
    seed_pod(api)
    rec = recorder(api, lane)
    message = "0/2 nodes are available: 2 Insufficient cpu."
    rec.unschedulable(POD, message, shown=("Unschedulable", message))  # after a restart
    asyncio.run(lane.run())
    assert writes(api) == [("create", "events", None)]


def test_a_new_message_or_reason_is_written() -> None:
    api, lane = FakeApi(), Lane()
    seed_pod(api)
    rec = recorder(api, lane)

    async def scenario() -> None:
        rec.unschedulable(POD, "first", shown=("Unschedulable", "older"))
        await lane.run()
        rec.unschedulable(POD, "first", reason="SchedulerError")
        await lane.run()

    asyncio.run(scenario())
    assert [w for w in writes(api) if w[0] == "patch" and w[1] == "pods"] == [
        ("patch", "pods", "status"),
        ("patch", "pods", "status"),
    ]
    assert len(events(api)) == 1  # the event is the same: counted


def test_reports_waiting_in_the_lane_are_one_per_pod_and_dropped_once_it_is_placed() -> None:
    api, lane = FakeApi(), Lane()
    seed_pod(api)
    rec = recorder(api, lane)
    for _ in range(3):
        rec.unschedulable(POD, "same")
    assert rec.pending == 1
    asyncio.run(lane.run())
    (event,) = events(api)
    assert event["count"] == 3  # three attempts, one event write
    rec.unschedulable(POD, "later")
    rec.scheduled(POD, "node-a")  # placed before the report was written
    asyncio.run(lane.run())
    assert [e["reason"] for e in events(api)] == ["FailedScheduling", "Scheduled"]
    assert all(e["message"] != "later" for e in events(api))


def test_the_spam_filter_holds_back_events_beyond_the_burst() -> None:
    api, lane, clock = FakeApi(), Lane(), Clock()
    seed_pod(api)
    rec = recorder(api, lane, clock)

    async def scenario() -> None:
        for i in range(SPAM_BURST + 5):
            rec.unschedulable(POD, f"message {i}")
            await lane.run()
        clock.now += SPAM_REFILL_S
        rec.unschedulable(POD, "after five minutes")
        await lane.run()

    asyncio.run(scenario())
    assert len(events(api)) == SPAM_BURST + 1
    assert events(api)[-1]["message"] == "after five minutes"


def test_an_event_gone_from_the_server_is_recorded_afresh() -> None:
    api, lane = FakeApi(), Lane()
    seed_pod(api)
    rec = recorder(api, lane)

    async def scenario() -> None:
        rec.unschedulable(POD, "same")
        await lane.run()
        api.fail("patch", "events", NotFoundError("gone", status=404))
        rec.unschedulable(POD, "same")
        await lane.run()

    asyncio.run(scenario())
    assert [w for w in writes(api) if w[1] == "events"] == [
        ("create", "events", None),
        ("patch", "events", None),  # answered 404
        ("create", "events", None),
    ]


class SlowPodWrites(FakeApi):
    """Each pod status patch waits its turn: ``release()`` lets the oldest waiting one land.
    What a busy API server may do to two requests in flight: answer the later one first."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: list[asyncio.Event] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def patch(self, res: Any, name: str, body: Any, **kwargs: Any) -> Any:
        if res is not PODS:
            return await super().patch(res, name, body, **kwargs)
        gate = asyncio.Event()
        self.gates.append(gate)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await gate.wait()
            return await super().patch(res, name, body, **kwargs)
        finally:
            self.in_flight -= 1

    async def land_newest_first(self) -> None:
        """Let every patch in flight land, the newest first, until none is left."""
        while True:
            for _ in range(10):
                await asyncio.sleep(0)
            waiting = [g for g in self.gates if not g.is_set()]
            if not waiting:
                return
            waiting[-1].set()


def test_one_pods_reports_are_written_one_after_the_other_so_the_newest_stays_shown() -> None:
    # A pod reported as waiting for its claim, then (the claim arrived) refused for a CEL
    # runtime error, is parked and not reported again: had the two patches been in flight at
    # once and the older answered last, the pod would show the older message for good.
    api = SlowPodWrites()
    seed_pod(api)

    async def scenario() -> Recorder:
        rec = Recorder(api, component="biaxial", instance="test", spawn=asyncio.ensure_future)
        rec.unschedulable(POD, 'pod uses resourceclaim "c", which does not exist')
        await asyncio.sleep(0)  # its write is in flight
        rec.unschedulable(POD, "claim default/c: selector #0: CEL runtime error")
        await api.land_newest_first()
        return rec

    rec = asyncio.run(scenario())
    assert api.most_in_flight == 1
    (condition,) = api.stored(PODS, "p")["status"]["conditions"]  # type: ignore[index]
    assert condition["message"] == "claim default/c: selector #0: CEL runtime error"
    assert [e["message"] for e in events(api)][-1] == condition["message"]
    assert rec.pending == 0


def test_a_placed_pods_binding_waits_for_its_failure_report_in_flight() -> None:
    api = SlowPodWrites()
    seed_pod(api)
    order: list[str] = []

    async def scenario() -> None:
        rec = Recorder(api, component="biaxial", instance="test", spawn=asyncio.ensure_future)
        rec.unschedulable(POD, "0/2 nodes are available: 2 Insufficient cpu.")
        await asyncio.sleep(0)  # its write is in flight
        rec.forget(POD.uid)  # decided: placed (what waited is dropped, not what is in flight)

        async def bind() -> None:
            await rec.settled(POD.uid)
            order.append("bind")

        binding = asyncio.ensure_future(bind())
        for _ in range(10):
            await asyncio.sleep(0)
        order.append("report lands")
        await api.land_newest_first()
        await binding
        await rec.settled("uid-of-a-pod-never-reported")  # returns at once

    asyncio.run(scenario())
    assert order == ["report lands", "bind"]


def test_a_binding_decided_before_a_report_landed_carries_the_version_it_moved_the_pod_to() -> None:
    # The report is written on the condition that the pod is at the version the cache showed;
    # the pod then changed only by it, so the binding (conditional on the version the decision
    # saw, against a crashed attempt's repair) may carry the newer one: no 409, no retry.
    api, lane = FakeApi(), Lane()
    seed_pod(api)
    rec = recorder(api, lane)
    seen = api.stored(PODS, "p")["metadata"]["resourceVersion"]  # type: ignore[index]
    rec.unschedulable(POD, 'pod uses resourceclaim "c", which does not exist', version=seen)
    asyncio.run(lane.run())
    now = api.stored(PODS, "p")["metadata"]["resourceVersion"]  # type: ignore[index]
    assert now != seen
    assert rec.advanced(POD.uid, seen) == now
    assert rec.advanced(POD.uid, seen) == seen  # told once, to the one binding


def test_a_report_on_a_pod_that_changed_meanwhile_is_written_and_advances_nothing() -> None:
    api, lane = FakeApi(), Lane()
    seed_pod(api)
    rec = recorder(api, lane)
    seen = api.stored(PODS, "p")["metadata"]["resourceVersion"]  # type: ignore[index]
    asyncio.run(api.patch(PODS, "p", {"metadata": {"labels": {"a": "b"}}}, namespace="default"))
    rec.unschedulable(POD, "0/2 nodes are available: 2 Insufficient cpu.", version=seen)
    asyncio.run(lane.run())
    (condition,) = api.stored(PODS, "p")["status"]["conditions"]  # type: ignore[index]
    assert condition["message"] == "0/2 nodes are available: 2 Insufficient cpu."
    assert rec.advanced(POD.uid, seen) == seen  # someone else changed it: the binding must see


# --------------------------------------------------------------------------- equivalence


def replica(name: str, claim: str, **extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": {"a": "b"}},
        "spec": {
            "schedulerName": "biaxial",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "message": name}],
        },
    }
    for key, value in extra.items():
        pod["spec"][key] = value
    return pod


def gpu_claim(name: str, device_class: str = "gpu.biaxial.dev") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
    }


def test_replicas_share_a_signature_whatever_their_names() -> None:
    one = pod_signature(replica("p-1", "p-1-gpu"), [gpu_claim("p-1-gpu")])
    two = pod_signature(replica("p-2", "p-2-gpu"), [gpu_claim("p-2-gpu")])
    assert one is not None
    assert one == two


def test_what_a_decision_reads_sets_signatures_apart() -> None:
    base = pod_signature(replica("p", "c"), [gpu_claim("c")])
    relabelled = replica("p", "c")
    relabelled["metadata"]["labels"] = {"a": "c"}
    other_ns = replica("p", "c")
    other_ns["metadata"]["namespace"] = "other"
    different = [
        pod_signature(relabelled, [gpu_claim("c")]),
        pod_signature(other_ns, [gpu_claim("c")]),
        pod_signature(replica("p", "c", nodeSelector={"zone": "a"}), [gpu_claim("c")]),
        pod_signature(replica("p", "c"), [gpu_claim("c", "a100-80gb.gpu.biaxial.dev")]),
    ]
    assert base not in different
    assert len(set(different)) == len(different)


def test_a_pod_nested_past_the_recursion_limit_still_has_a_signature() -> None:
    # The API server stores objects nested far deeper than Python's default recursion limit
    # (found by the hostile-objects test: a Pod with a 1,000-deep field); the signature is
    # computed at any depth and still sets the pod apart from its shallow twin.
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(1_000):
        inner["x"] = {}
        inner = inner["x"]
    pod = replica("p", "c")
    pod["metadata"]["annotations"] = {"deep": deep}
    signature = pod_signature(pod, [gpu_claim("c")])
    assert signature is not None
    assert signature != pod_signature(replica("p", "c"), [gpu_claim("c")])


def test_pods_that_depend_on_state_outside_the_engine_feed_are_decided_alone() -> None:
    allocated = gpu_claim("c")
    allocated["status"] = {"allocation": {"devices": {"results": []}}}
    reserved = gpu_claim("c")
    reserved["status"] = {"reservedFor": [{"resource": "pods", "name": "x", "uid": "u"}]}
    deleting = gpu_claim("c")
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    with_pvc = replica(
        "p", "c", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]
    )
    with_bridge = replica("p", "c")
    with_bridge["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "b"}
    assert pod_signature(replica("p", "c"), [allocated]) is None
    assert pod_signature(replica("p", "c"), [reserved]) is None
    assert pod_signature(replica("p", "c"), [deleting]) is None
    assert pod_signature(replica("p", "c"), [None]) is None
    assert pod_signature(with_pvc, [gpu_claim("c")]) is None
    assert pod_signature(with_bridge, [gpu_claim("c")]) is None


def test_the_memo_answers_only_within_one_generation() -> None:
    memo = UnschedulableMemo()
    answer = Unschedulable(pod="ml/p-1", message="0/2 nodes are available", reasons={"x": 2})
    memo.put("sig", 7, answer)
    again = memo.get("sig", 7, "ml/p-2")
    assert again == Unschedulable(pod="ml/p-2", message=answer.message, reasons=answer.reasons)
    assert memo.get("sig", 8, "ml/p-3") is None  # something changed
    assert memo.get("other", 7, "ml/p-3") is None
    assert memo.get(None, 7, "ml/p-3") is None
    memo.put("sig2", 8, copy.copy(answer))
    assert memo.get("sig", 8, "ml/p-3") is None  # the older generation's answers are gone
    assert memo.hits == 1

"""The scheduling queue (controller.queue) on a fake clock: order, backoff, parking of
unschedulable pods, moves during an attempt, flushing, dirty re-adds and forgetting."""

from __future__ import annotations

import asyncio

import pytest

from controller.queue import ANY, ClusterEvent, EventKind, Hint, Outcome, SchedulingQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock) -> SchedulingQueue:
    return SchedulingQueue(backoff_initial_s=1.0, backoff_max_s=8.0, flush_s=60.0, clock=clock)


def test_fifo_and_each_key_once() -> None:
    q = make(Clock())
    for key in ("a", "b", "a", "c"):
        q.add(key)
    assert [q.pop_nowait() for _ in range(4)] == ["a", "b", "c", None]


def test_backoff_doubles_up_to_the_cap() -> None:
    clock = Clock()
    q = make(clock)
    assert [q.backoff_s(n) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0]
    q.add("a")
    for attempt, wait in enumerate([1.0, 2.0, 4.0, 8.0, 8.0], start=1):
        assert q.pop_nowait() == "a"
        q.done("a", Outcome.ERROR)
        assert q.attempts("a") == attempt
        clock.now += wait - 0.01
        assert q.pop_nowait() is None, f"released before {wait}s"
        clock.now += 0.01
    assert q.pop_nowait() == "a"
    q.done("a", Outcome.SCHEDULED)
    assert q.attempts("a") == 0
    assert len(q) == 0


def test_unschedulable_pods_wait_for_a_move() -> None:
    clock = Clock()
    q = make(clock)
    q.add("a")
    assert q.pop_nowait() == "a"
    q.done("a", Outcome.UNSCHEDULABLE)
    clock.now += 30  # well past the backoff, but parked
    assert q.pop_nowait() is None
    assert q.depths == {"active": 0, "backoff": 0, "unschedulable": 1}
    q.move_all()
    assert q.pop_nowait() == "a"


def test_a_move_honours_the_backoff() -> None:
    clock = Clock()
    q = make(clock)
    q.add("a")
    q.pop_nowait()
    q.done("a", Outcome.UNSCHEDULABLE)
    q.move_all()  # immediately: still within the 1 s backoff
    assert q.pop_nowait() is None
    clock.now += 1.0
    assert q.pop_nowait() == "a"


def test_a_move_during_the_attempt_is_not_lost() -> None:
    clock = Clock()
    q = make(clock)
    q.add("a")
    assert q.pop_nowait() == "a"
    q.move_all()  # e.g. a claim was freed while "a" was being decided
    q.done("a", Outcome.UNSCHEDULABLE)
    clock.now += 1.0
    assert q.pop_nowait() == "a", "parked although the cluster changed during its attempt"


def test_parked_pods_are_flushed_eventually() -> None:
    clock = Clock()
    q = make(clock)
    q.add("a")
    q.pop_nowait()
    q.done("a", Outcome.UNSCHEDULABLE)
    clock.now += 59.9
    assert q.pop_nowait() is None
    clock.now += 0.2
    assert q.pop_nowait() == "a"


def test_add_while_processing_requeues_after_done() -> None:
    clock = Clock()
    q = make(clock)
    q.add("a")
    assert q.pop_nowait() == "a"
    q.add("a")  # the pod changed while being tried
    assert q.pop_nowait() is None, "a key must never be handed out twice at once"
    q.done("a", Outcome.UNSCHEDULABLE)
    clock.now += 1.0
    assert q.pop_nowait() == "a"


def test_a_change_during_an_attempt_that_found_nothing_to_do_is_tried_at_once() -> None:
    # The deallocator's case: it looked at a claim (nothing to release yet, FORGET) while the
    # pod that held it finished; that pod's event must not be lost until the next resync
    # (test_finished_pods_release_their_devices timed out so under load).
    q = make(Clock())
    q.add("a")
    assert q.pop_nowait() == "a"
    q.add("a")
    q.done("a", Outcome.FORGET)
    assert q.pop_nowait() == "a"
    q.done("a", Outcome.FORGET)
    assert q.pop_nowait() is None


def test_add_does_not_skip_a_running_backoff() -> None:
    clock = Clock()
    q = make(clock)
    q.add("a")
    q.pop_nowait()
    q.done("a", Outcome.ERROR)
    q.add("a")
    assert q.pop_nowait() is None
    clock.now += 1.0
    assert q.pop_nowait() == "a"


def test_forget_drops_every_trace() -> None:
    q = make(Clock())
    q.add("a")
    q.add("b")
    q.forget("a")
    assert q.pop_nowait() == "b"
    q.done("b", Outcome.UNSCHEDULABLE)
    q.forget("b")
    assert len(q) == 0
    assert q.attempts("b") == 0


def test_pop_waits_for_an_add_and_for_a_backoff() -> None:
    async def scenario() -> list[str]:
        q = SchedulingQueue(backoff_initial_s=0.05, backoff_max_s=0.05, flush_s=60.0)
        got: list[str] = []
        waiter = asyncio.create_task(q.pop())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        q.add("a")
        got.append(await asyncio.wait_for(waiter, 1))
        q.done("a", Outcome.ERROR)
        got.append(await asyncio.wait_for(q.pop(), 1))  # released by the timer, no event
        q.close()
        with pytest.raises(EOFError):
            await q.pop()
        return got

    assert asyncio.run(scenario()) == ["a", "a"]


GPU = "gpu.biaxial.dev"
A100 = "a100-80gb.gpu.biaxial.dev"
EVENTS = [
    ClusterEvent(EventKind.CLUSTER),
    ClusterEvent(EventKind.CLAIM, claim="ns/mine"),
    ClusterEvent(EventKind.CLAIM, claim="ns/other"),
    ClusterEvent(EventKind.DEVICES_FREED, classes=frozenset({GPU})),
    ClusterEvent(EventKind.DEVICES_FREED, classes=frozenset({GPU, A100})),
    ClusterEvent(EventKind.DEVICES_FREED, classes=None),
    ClusterEvent(EventKind.POD_GONE),
    ClusterEvent(EventKind.POD_ADDED),
]
HINTS = [
    ANY,
    Hint(
        claims=frozenset({"ns/mine"}),
        device_classes=frozenset({A100}),
        pod_gone=False,
        pod_added=False,
    ),
    Hint(claims=frozenset(), device_classes=frozenset(), pod_gone=False, pod_added=False),
    Hint(
        cluster=False,
        claims=frozenset({"ns/mine"}),
        device_classes=frozenset(),
        pod_gone=False,
        pod_added=False,
    ),
    Hint(claims=frozenset(), device_classes=frozenset(), pod_gone=True, pod_added=True),
]


# What each hint lets through, in EVENTS order. kube-scheduler's DynamicResources plugin queues
# a pod on a claim deallocation, on a change of one of its own claims and on slice, class and
# node changes; NodeResourcesFit, InterPodAffinity, PodTopologySpread and NodePorts on a pod
# deletion; InterPodAffinity and PodTopologySpread on an assigned pod's add or label update.
# biaxial narrows a freed device down to the classes that select it.
@pytest.mark.parametrize(
    ("hint", "wakes"),
    [
        (HINTS[0], [True, True, True, True, True, True, True, True]),
        # asks for an A100 class: a freed T4 (selected only by the gpu class) cannot help
        (HINTS[1], [True, True, False, False, True, True, False, False]),
        # an invalid pod: only a node, slice or class change (or its own update) may fix it
        (HINTS[2], [True, False, False, False, False, False, False, False]),
        # waiting for its claim to be created
        (HINTS[3], [False, True, False, False, False, False, False, False]),
        # kept out by its required pod affinity: a pod placed or leaving may help
        (HINTS[4], [True, False, False, False, False, False, True, True]),
    ],
)
def test_a_parked_pod_leaves_only_on_a_change_its_hint_names(hint: Hint, wakes: list[bool]) -> None:
    for event, expected in zip(EVENTS, wakes, strict=True):
        clock = Clock()
        q = make(clock)
        q.add("a")
        assert q.pop_nowait() == "a"
        q.done("a", Outcome.UNSCHEDULABLE, hint)
        assert q.hint("a") == hint
        clock.now += 5
        assert q.move(event) == int(expected), event
        assert (q.pop_nowait() == "a") is expected, event


def test_a_matching_change_during_the_attempt_is_not_lost_a_foreign_one_is_ignored() -> None:
    clock = Clock()
    q = make(clock)
    hint_a = HINTS[1]
    hint_b = Hint(claims=frozenset({"ns/b"}), device_classes=frozenset({A100}), pod_gone=False)
    for key in ("a", "b"):
        q.add(key)
    assert q.pop_nowait() == "a"
    assert q.pop_nowait() == "b"
    q.move(ClusterEvent(EventKind.DEVICES_FREED, classes=frozenset({GPU})))  # helps neither
    q.done("a", Outcome.UNSCHEDULABLE, hint_a)
    q.move(ClusterEvent(EventKind.CLAIM, claim="ns/b"))  # while "b" is still being tried
    q.done("b", Outcome.UNSCHEDULABLE, hint_b)
    assert q.depths == {"active": 0, "backoff": 1, "unschedulable": 1}
    assert q.hint("a") == hint_a
    clock.now += 1.0
    assert q.pop_nowait() == "b"


def test_a_flood_of_parked_pods_is_not_woken_by_changes_that_cannot_help() -> None:
    clock = Clock()
    q = make(clock)
    flood = [f"f{i}" for i in range(1000)]
    for key in flood:
        q.add(key)
    for key in flood:
        assert q.pop_nowait() == key
        q.done(key, Outcome.UNSCHEDULABLE, HINTS[1])
    for _ in range(50):
        assert q.move(ClusterEvent(EventKind.DEVICES_FREED, classes=frozenset({GPU}))) == 0
        assert q.move(ClusterEvent(EventKind.POD_GONE)) == 0
    q.add("ordinary")
    assert q.pop_nowait() == "ordinary"
    assert q.depths["unschedulable"] == 1000


def test_a_waiting_pod_was_not_tried_so_it_skips_the_backoff_when_woken() -> None:
    # kube-scheduler's PreEnqueue: a pod whose claim does not exist yet is not attempted.
    clock = Clock()
    q = make(clock)
    q.add("a")
    assert q.pop_nowait() == "a"
    q.done("a", Outcome.WAITING, HINTS[3])
    assert q.attempts("a") == 0
    assert q.move(ClusterEvent(EventKind.CLAIM, claim="ns/other")) == 0
    assert q.move(ClusterEvent(EventKind.CLAIM, claim="ns/mine")) == 1
    assert q.pop_nowait() == "a"  # at once, no backoff


def test_higher_priority_first_then_arrival_order() -> None:
    priorities = {"low1": 0, "high": 100, "low2": 0, "mid": 10}
    q = SchedulingQueue(clock=Clock(), priority=priorities.__getitem__)
    for key in priorities:
        q.add(key)
    assert [q.pop_nowait() for _ in range(5)] == ["high", "mid", "low1", "low2", None]


def test_random_operations_keep_the_queue_invariants() -> None:
    """Random adds, pops, outcomes, moves, forgets and clock steps: a key is never handed out
    twice at once nor before its backoff, sits in one set at most, and once the clock is past
    every backoff and flush, every key still pending is handed out."""
    import random

    rng = random.Random(7)
    clock = Clock()
    q = make(clock)
    keys = [f"p{i}" for i in range(40)]
    not_before: dict[str, float] = {}
    processing: set[str] = set()
    pending: set[str] = set()
    for _ in range(4000):
        op = rng.random()
        key = rng.choice(keys)
        if op < 0.3:
            q.add(key)
            pending.add(key)
        elif op < 0.55:
            got = q.pop_nowait()
            if got is not None:
                assert got not in processing, "handed out twice"
                assert clock.now >= not_before.get(got, 0.0) - 1e-9, "handed out during backoff"
                processing.add(got)
        elif op < 0.75 and processing:
            done = rng.choice(sorted(processing))
            processing.discard(done)
            outcome = rng.choice([Outcome.SCHEDULED, Outcome.UNSCHEDULABLE, Outcome.ERROR])
            q.done(done, outcome, rng.choice(HINTS))
            if outcome is Outcome.SCHEDULED:
                pending.discard(done)
                not_before.pop(done, None)
            else:
                not_before[done] = clock.now + q.backoff_s(q.attempts(done))
        elif op < 0.77:
            q.move_all()
        elif op < 0.8:
            q.move(rng.choice(EVENTS))
        elif op < 0.85:
            q.forget(key)
            if key not in processing:
                pending.discard(key)
                not_before.pop(key, None)
        else:
            clock.now += rng.choice([0.1, 0.5, 1.0, 3.0])
        sets = [set(q._active), q._backoff, set(q._parked)]
        assert sum(len(s) for s in sets) == len(set().union(*sets)), "a key in two sets"
    for key in list(processing):
        q.done(key, Outcome.SCHEDULED)
        pending.discard(key)
    queued = {k for k in keys if q.is_queued(k)}
    assert queued == pending, "a pending key was lost, or a finished one kept"
    clock.now += 1000.0
    drained = set()
    while (got := q.pop_nowait()) is not None:
        drained.add(got)
        q.done(got, Outcome.SCHEDULED)
    assert drained == queued
    assert len(q) == 0


def test_higher_priority_first_then_arrival() -> None:
    """kube-scheduler's PrioritySort (pkg/scheduler/framework/plugins/queuesort): ``Less``
    orders by ``spec.priority``, higher first, then by the time the pod entered the queue."""
    q = make(Clock())
    q.add("low-early", priority=0)
    q.add("high-late", priority=1_000_000)
    q.add("mid", priority=10)
    q.add("low-late", priority=0)
    q.add("negative", priority=-5)
    order = [q.pop_nowait() for _ in range(6)]
    assert order == ["high-late", "mid", "low-early", "low-late", "negative", None]


def test_priority_order_holds_after_backoff_and_parking() -> None:
    """Backoff is unchanged by priority: a high-priority pod in backoff waits its time, and a
    lower one that is ready meanwhile is tried; once both are ready, priority decides again."""
    clock = Clock()
    q = make(clock)
    q.add("high", priority=100)
    assert q.pop_nowait() == "high"
    q.done("high", Outcome.ERROR)  # backoff 1 s
    q.add("low", priority=1)
    assert q.pop_nowait() == "low", "a ready lower-priority pod waits for no backoff"
    q.done("low", Outcome.UNSCHEDULABLE)
    clock.now += 5
    q.move_all()
    assert [q.pop_nowait(), q.pop_nowait(), q.pop_nowait()] == ["high", "low", None]


def test_forgotten_and_re_added_pods_leave_no_stale_order() -> None:
    q = make(Clock())
    q.add("a", priority=5)
    q.add("b", priority=1)
    q.forget("a")
    q.add("c", priority=3)
    q.add("a", priority=0)
    assert [q.pop_nowait() for _ in range(4)] == ["c", "b", "a", None]


def test_a_move_wakes_exactly_the_parked_pods_whose_hint_says_so() -> None:
    """The parked pods are filed by what can wake them; for random hints and events a move
    takes out exactly those for which Hint.wakes answers yes, and the index forgets the pods
    that leave (by a move, an add, a forget or the flush)."""
    import random

    rng = random.Random(11)
    claims = [f"ns/c{i}" for i in range(4)]
    classes = [GPU, A100, "other.biaxial.dev"]

    def some(names: list[str]) -> frozenset[str] | None:
        return None if rng.random() < 0.3 else frozenset(rng.sample(names, rng.randint(0, 2)))

    def hint() -> Hint:
        return Hint(
            cluster=rng.random() < 0.5,
            claims=some(claims),
            device_classes=some(classes),
            pod_gone=rng.random() < 0.5,
            pod_added=rng.random() < 0.5,
        )

    def event() -> ClusterEvent:
        kind = rng.choice(list(EventKind))
        if kind is EventKind.CLAIM:
            return ClusterEvent(kind, claim=rng.choice(claims))
        if kind is EventKind.DEVICES_FREED:
            return ClusterEvent(kind, classes=some(classes))
        return ClusterEvent(kind)

    clock = Clock()
    q = make(clock)
    keys = [f"p{i}" for i in range(30)]
    for _ in range(3000):
        key = rng.choice(keys)
        op = rng.random()
        if op < 0.4:
            q.add(key)
            if q.pop_nowait() is not None:
                clock.now += 0.001
        elif op < 0.6:
            got = q.pop_nowait()
            if got is not None:
                q.done(got, rng.choice([Outcome.UNSCHEDULABLE, Outcome.WAITING]), hint())
        elif op < 0.9:
            change = event()
            expected = {k for k in keys if (h := q.hint(k)) is not None and h.wakes(change)}
            assert q.move(change) == len(expected), change
            assert not any(q.hint(k) is not None for k in expected)
        elif op < 0.95:
            q.forget(key)
        else:
            clock.now += rng.choice([1.0, 30.0, 61.0])
    while (got := q.pop_nowait()) is not None:
        q.done(got, Outcome.UNSCHEDULABLE, hint())
    for _ in range(50):
        change = event()
        expected = {k for k in keys if (h := q.hint(k)) is not None and h.wakes(change)}
        assert q.move(change) == len(expected)
    q.move_all()
    wakers = q._wakers
    assert not any(wakers.by_kind.values())
    assert not wakers.any_claim
    assert not wakers.by_claim
    assert not wakers.any_freed
    assert not wakers.some_freed
    assert not wakers.by_class


def test_a_pod_back_from_a_failure_goes_before_pods_that_came_after_it() -> None:
    """PrioritySort orders equal priorities by the queue timestamp, which a failed attempt
    refreshes (kube-scheduler's ``QueuedPodInfo.Timestamp``, set in
    ``AddUnschedulableIfNotPresent``): not by the moment a pod re-entered the active queue."""
    clock = Clock()
    q = make(clock)
    q.add("old")
    assert q.pop_nowait() == "old"
    q.done("old", Outcome.UNSCHEDULABLE)  # failed first
    q.add("new")  # arrived after that failure; not tried yet
    clock.now += 5
    q.move_all()  # "old" leaves its (expired) backoff after "new" entered active
    assert [q.pop_nowait(), q.pop_nowait()] == ["old", "new"]


def test_a_pod_that_waited_keeps_its_place_one_that_failed_does_not() -> None:
    """WAITING is not an attempt (kube-scheduler's PreEnqueue): the pod keeps its timestamp;
    a failure refreshes it, so the pods that waited longest go first."""
    clock = Clock()
    q = make(clock)
    for key in ("a", "b", "c"):
        q.add(key)
    popped = [q.pop_nowait() for _ in range(3)]
    assert popped == ["a", "b", "c"]
    q.done("c", Outcome.WAITING, Hint(cluster=True))
    q.done("a", Outcome.UNSCHEDULABLE)  # failed: its timestamp is now the newest
    q.done("b", Outcome.WAITING, Hint(cluster=True))
    clock.now += 5
    q.move_all()
    assert [q.pop_nowait() for _ in range(3)] == ["b", "c", "a"]

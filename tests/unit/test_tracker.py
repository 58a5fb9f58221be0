"""The engine's bookkeeping (driver.scheduling.tracker): observations replace what was known,
an observation equal to an assumption moves nothing, nothing is counted twice or dropped while
it may still be held, and pod usage is summed exactly."""

from __future__ import annotations

from collections import Counter

import pytest

from driver.api.claims import AllocationResult
from driver.scheduling.nodefit import NodeUsage
from driver.scheduling.podindex import ScheduledPod
from driver.scheduling.tracker import LANDED, NO_CHANGE, Change, ClusterTracker
from tests.unit.builders import claim


def holding(*devices: str, pool: str = "n0") -> AllocationResult:
    allocation = claim("c").holding(*devices, pool=pool).model().allocation
    assert allocation is not None
    return allocation


A, B, C = holding("gpu-0"), holding("gpu-1"), holding("gpu-2")
CPU = {"cpu": 500}


def pod(uid: str, requests: dict[str, int] | None = None) -> ScheduledPod:
    return ScheduledPod(uid=uid, requests=requests or {})


def counted(tracker: ClusterTracker) -> Counter[AllocationResult]:
    return Counter(tracker.counted())


def test_an_assumed_placement_lands_when_the_cluster_shows_it() -> None:
    tracker = ClusterTracker()
    change = tracker.assume("p", "n0", {"ns/c": A}, B, pod("p", CPU))
    assert change == Change((), (A, B), ("n0",))
    assert tracker.observe_allocation("ns/c", None) is NO_CHANGE  # not written yet
    assert tracker.observe_allocation("ns/c", A) is LANDED
    assert tracker.observe_allocation("ns/bridge", B, bridge_of="p") is LANDED
    assert tracker.observe_pod("p", "n0", pod("p", CPU)) is LANDED
    assert not tracker.in_flight("p")
    assert counted(tracker) == Counter([A, B])
    assert tracker.usage("n0") == NodeUsage().plus(CPU)
    assert tracker.forget("p") is NO_CHANGE  # too late: what the cluster shows stays


def test_forget_drops_only_what_has_not_landed() -> None:
    tracker = ClusterTracker()
    tracker.assume("p", "n0", {"ns/c": A, "ns/d": C}, B, pod("p", CPU))
    tracker.observe_allocation("ns/c", A)
    change = tracker.forget("p")
    assert change == Change((C, B), (), ("n0",))
    assert counted(tracker) == Counter([A])
    assert tracker.usages() == {}
    assert tracker.forget("p") is NO_CHANGE  # idempotent
    assert tracker.observe_allocation("ns/c", None) == Change((A,), ())  # the rollback lands


def test_the_observed_allocation_of_a_claim_replaces_the_assumed_one() -> None:
    tracker = ClusterTracker()
    tracker.assume("p", "n0", {"ns/c": A}, None, pod("p", CPU))
    assert tracker.observe_allocation("ns/c", C) == Change((A,), (C,))
    assert counted(tracker) == Counter([C])
    assert tracker.forget("p") == Change((), (), ("n0",))  # only the pod's requests remain


def test_a_bridge_claim_lands_only_on_an_equal_allocation() -> None:
    """Another bridge claim of the same pod (an orphan of an earlier attempt) is counted on its
    own: taking it for the assumed one would count the assumed devices nowhere."""
    tracker = ClusterTracker()
    tracker.assume("p", "n0", {}, B, pod("p", {}))
    assert tracker.observe_allocation("ns/old-bridge", C, bridge_of="p") == Change((), (C,))
    assert counted(tracker) == Counter([B, C])
    assert tracker.observe_allocation("ns/new-bridge", B, bridge_of="p") is LANDED
    assert tracker.observe_allocation("ns/old-bridge", None) == Change((C,), ())
    assert counted(tracker) == Counter([B])


def test_observations_are_idempotent_and_replace() -> None:
    tracker = ClusterTracker()
    assert tracker.observe_allocation("ns/x", A) == Change((), (A,))
    assert tracker.observe_allocation("ns/x", A) is NO_CHANGE
    assert tracker.observe_allocation("ns/x", B) == Change((A,), (B,))
    assert tracker.observe_allocation("ns/x", None) == Change((B,), ())
    assert tracker.observe_allocation("ns/x", None) is NO_CHANGE
    assert tracker.observe_pod("q", "n1", pod("q", CPU)) == Change(nodes=("n1",))
    assert tracker.observe_pod("q", "n1", pod("q", CPU)) is NO_CHANGE
    assert tracker.observe_pod("q", "n1", pod("q", {"cpu": 700})) == Change(
        nodes=("n1",)
    )  # resized
    assert tracker.usage("n1") == NodeUsage().plus({"cpu": 700})
    assert tracker.observe_pod("q", None, None) == Change(nodes=("n1",))
    assert tracker.observe_pod("q", None, None) is NO_CHANGE


def test_usage_is_summed_again_never_subtracted() -> None:
    """``NodeUsage.minus`` clamps at zero and leaves zero entries behind; a recount from the
    pods on the node equals what a fresh tracker computes."""
    baseline = {"n0": NodeUsage().plus({"cpu": 100})}
    tracker = ClusterTracker(baseline)
    tracker.observe_pod("a", "n0", pod("a", {"cpu": 200, "nvidia.com/gpu": 1}))
    tracker.observe_pod("b", "n0", pod("b", {"memory": 5}))
    tracker.observe_pod("a", None, None)
    fresh = ClusterTracker(baseline)
    fresh.observe_pod("b", "n0", pod("b", {"memory": 5}))
    assert tracker.usages() == fresh.usages()
    assert tracker.usage("n0").requested == {"cpu": 100, "memory": 5}
    tracker.observe_pod("b", None, None)
    assert tracker.usage("n0") == baseline["n0"]  # pods counted from the start stay


def test_a_pod_or_claim_cannot_be_in_flight_twice() -> None:
    tracker = ClusterTracker()
    tracker.assume("p", "n0", {"ns/c": A}, None, pod("p", {}))
    with pytest.raises(ValueError, match="already has a placement"):
        tracker.assume("p", "n0", {}, None, pod("p", {}))
    with pytest.raises(ValueError, match="ns/c is already in flight"):
        tracker.assume("q", "n0", {"ns/c": B}, None, pod("q", {}))

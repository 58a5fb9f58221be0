"""The allocator's search contract: step counting, the budget, device-order callbacks,
shareIDs, and folding results into snapshots."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest

from driver.api.errors import AllocationError
from driver.api.ids import DeviceID, DeviceName, DriverName, PoolName
from driver.structured.allocator import (
    DEFAULT_SEARCH_BUDGET,
    Candidate,
    OrderContext,
    SearchStats,
    allocate,
)
from tests.unit.builders import (
    DRIVER,
    claim,
    device_class,
    gpu,
    node,
    node_gpus,
    slice_,
    snapshot,
    to_claim,
    to_node,
)

NUMA = "resource.kubernetes.io/numaNode"
NODE = to_node(node("node-0"))


def _devices(results: Sequence[object]) -> list[list[str]]:
    return [[r.device for r in a.results] for a in results]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- steps and budget


def test_steps_pin_simple_claim() -> None:
    """One claim, one request, one device: four allocateOne steps (device, end of request,
    end of claim, end of claims), however many devices the node has."""
    for count in (1, 8, 64):
        stats = SearchStats()
        snap = snapshot([node_gpus("node-0", count)])
        assert allocate(snap, [to_claim(claim("c").request("r0"))], NODE, stats=stats)
        assert (stats.steps, stats.calls) == (4, 1)


def test_steps_pin_matched_multi_gpu_claim() -> None:
    stats = SearchStats()
    snap = snapshot([node_gpus("node-0", 8, numa=0)])
    c = claim("c").request("r0", count=4).constraint(match=NUMA)
    assert allocate(snap, [to_claim(c)], NODE, stats=stats)
    assert stats.steps == 4 + 3


def test_stats_accumulate_over_calls() -> None:
    stats = SearchStats()
    snap = snapshot([node_gpus("node-0", 2)])
    for _ in range(3):
        allocate(snap, [to_claim(claim("c").request("r0"))], NODE, stats=stats)
    assert (stats.steps, stats.calls) == (12, 3)


def _pathological() -> tuple[object, object]:
    # 16 devices, r0 takes 4 of any, r1 wants a device that does not exist: every one of the
    # C(16, 4) = 1820 combinations for r0 is tried before giving up.
    snap = snapshot([node_gpus("node-0", 16)])
    c = (
        claim("c")
        .request("r0", count=4)
        .request("r1", selectors=[f'device.attributes["{DRIVER}"].index == 99'])
    )
    return snap, to_claim(c)


def test_budget_stops_pathological_search_with_clear_error() -> None:
    snap, c = _pathological()
    stats = SearchStats()
    with pytest.raises(AllocationError, match=r"gave up after 1000 steps for claims default/c"):
        allocate(snap, [c], NODE, budget=1000, stats=stats)  # type: ignore[arg-type, list-item]
    assert stats.steps == 1001


def test_default_budget_is_enough_for_the_exhaustive_answer() -> None:
    snap, c = _pathological()
    stats = SearchStats()
    assert allocate(snap, [c], NODE, stats=stats) is None  # type: ignore[arg-type, list-item]
    assert 1820 < stats.steps < DEFAULT_SEARCH_BUDGET


def test_cel_runtime_error_is_an_error_not_a_non_match() -> None:
    snap = snapshot(
        [slice_("s", devices=[gpu(0, extra={"mode": "x"}), gpu(1)])],
    )
    c = claim("c").request("r0", selectors=[f'device.attributes["{DRIVER}"].mode == "y"'])
    with pytest.raises(AllocationError, match=r"selector #0 on device .*gpu-1: CEL runtime error"):
        allocate(snap, [to_claim(c)], NODE)


def test_cel_error_guarded_by_has_is_fine() -> None:
    snap = snapshot([slice_("s", devices=[gpu(0), gpu(1, extra={"mode": "y"})])])
    expr = f'has(device.attributes["{DRIVER}"].mode) && device.attributes["{DRIVER}"].mode == "y"'
    result = allocate(snap, [to_claim(claim("c").request("r0", selectors=[expr]))], NODE)
    assert result is not None
    assert _devices(result) == [["gpu-1"]]


# --------------------------------------------------------------------------- device order


def _reverse(cands: Sequence[Candidate], ctx: OrderContext) -> Sequence[Candidate]:
    return list(reversed(cands))


def test_order_callback_reorders_within_node() -> None:
    snap = snapshot([node_gpus("node-0", 4)])
    result = allocate(snap, [to_claim(claim("c").request("r0", count=2))], NODE, order=_reverse)
    assert result is not None
    assert _devices(result) == [["gpu-3", "gpu-2"]]


def test_order_callback_sees_request_and_state() -> None:
    seen: list[OrderContext] = []
    given: list[list[str]] = []

    def spy(cands: Sequence[Candidate], ctx: OrderContext) -> Sequence[Candidate]:
        seen.append(ctx)
        given.append([c.device_id.device for c in cands])
        return cands

    snap = snapshot(
        [node_gpus("node-0", 3, shared=True)],
        claims=[],
    )
    first = allocate(snap, [to_claim(claim("a").request("r0", capacity={"memory": "4Gi"}))], NODE)
    assert first is not None
    snap = snap.with_allocations(first)
    c = (
        claim("c")
        .request("r0", capacity={"memory": "2Gi"})
        .request("r1", count=2, selectors=[f'device.attributes["{DRIVER}"].index > 0'])
    )
    result = allocate(snap, [to_claim(c)], NODE, order=spy)
    assert result is not None
    assert [ctx.request for ctx in seen] == ["r0", "r1"]
    assert seen[0].count == 1
    assert str(seen[0].capacity_requests["memory"]) == "2Gi"
    assert seen[0].allocated is snap.allocated
    assert seen[0].pending == {}
    gpu0 = DeviceID(DriverName(DRIVER), PoolName("node-0"), DeviceName("gpu-0"))
    assert seen[0].allocated.share_count(gpu0) == 1
    # While r1 is placed, r0's share on gpu-0 is pending in this attempt.
    assert set(seen[1].pending) == {gpu0}
    assert seen[1].pending[gpu0]["memory"] == 2 * 2**30 * 10**9
    # Only selectable candidates are offered: r1's selector excludes gpu-0.
    assert given == [["gpu-0", "gpu-1", "gpu-2"], ["gpu-1", "gpu-2"]]


def test_order_callback_cannot_change_feasibility() -> None:
    def drop(cands: Sequence[Candidate], ctx: OrderContext) -> Sequence[Candidate]:
        return list(cands)[1:]

    snap = snapshot([node_gpus("node-0", 2)])
    with pytest.raises(AllocationError, match="not a permutation"):
        allocate(snap, [to_claim(claim("c").request("r0"))], NODE, order=drop)


def test_order_callback_results_still_pass_every_check() -> None:
    """Whatever order the scorer proposes, held devices, taints and constraints hold."""
    snap = snapshot(
        [
            slice_(
                "s",
                devices=[
                    gpu(0, numa=0),
                    gpu(1, numa=1, taints=[{"key": "bad", "effect": "NoSchedule"}]),
                    gpu(2, numa=1),
                    gpu(3, numa=0),
                    gpu(4, numa=1),
                ],
            )
        ],
        claims=[claim("h").holding("gpu-4")],
    )
    c = claim("c").request("r0", count=2).constraint(match=NUMA)
    result = allocate(snap, [to_claim(c)], NODE, order=_reverse)
    assert result is not None
    assert _devices(result) == [["gpu-3", "gpu-0"]]


# --------------------------------------------------------------------------- results, state


def test_share_ids_are_deterministic_uuids() -> None:
    snap = snapshot([node_gpus("node-0", 1, shared=True)])
    c = to_claim(claim("c", uid="u-1").request("r0", count=1, capacity={"memory": "1Gi"}))
    first = allocate(snap, [c], NODE)
    second = allocate(snapshot([node_gpus("node-0", 1, shared=True)]), [c], NODE)
    assert first is not None
    assert second is not None
    share = first[0].results[0].share_id
    assert share == second[0].results[0].share_id
    assert share is not None
    assert uuid.UUID(share).version == 5


def test_with_allocations_shares_index_and_blocks_devices() -> None:
    snap = snapshot([node_gpus("node-0", 2)])
    before = snap.candidates(NODE)
    result = allocate(snap, [to_claim(claim("a").request("r0"))], NODE)
    assert result is not None
    after = snap.with_allocations(result)
    assert after.candidates(NODE) is before
    assert snap.allocated.exclusive_devices() == frozenset()
    second = allocate(after, [to_claim(claim("b").request("r0"))], NODE)
    assert second is not None
    assert _devices(second) == [["gpu-1"]]
    assert (
        allocate(after.with_allocations(second), [to_claim(claim("c").request("r0"))], NODE) is None
    )
    # Releasing gives the device back.
    released = after.without_allocations(result)
    assert released.allocated == snap.allocated


def test_claims_in_one_call_see_each_other() -> None:
    snap = snapshot([node_gpus("node-0", 4, shared=True)])
    claims = [to_claim(claim(f"c{i}").request("r0", capacity={"memory": "10Gi"})) for i in range(3)]
    result = allocate(snap, claims, NODE)
    assert result is not None
    # 16Gi per GPU: two 10Gi shares never land on one GPU.
    assert _devices(result) == [["gpu-0"], ["gpu-1"], ["gpu-2"]]


def test_unknown_class_in_later_claim_is_fatal_even_if_first_fits() -> None:
    snap = snapshot([node_gpus("node-0", 2)], classes=[device_class()])
    claims = [to_claim(claim("a").request("r0")), to_claim(claim("b").request("r0", cls="nope"))]
    with pytest.raises(
        AllocationError, match="claim default/b, request r0: could not retrieve device class nope"
    ):
        allocate(snap, claims, NODE)


def test_cel_errors_are_reported_on_every_call_and_cache_is_shared() -> None:
    from driver.api.claims import DeviceClass
    from driver.api.model import ResourceSlice
    from driver.cel.matchcache import MatchCache
    from driver.structured.snapshot import ClusterSnapshot

    cache = MatchCache()
    slices = [ResourceSlice.from_api(slice_("s", devices=[gpu(0), gpu(1, extra={"mode": "y"})]))]
    classes = [DeviceClass.from_api(device_class())]
    snap = ClusterSnapshot.build(slices, classes, [], match_cache=cache)
    bad = to_claim(
        claim("c").request("r0", selectors=[f'device.attributes["{DRIVER}"].mode == "y"'])
    )
    for _ in range(2):
        with pytest.raises(AllocationError, match="CEL runtime error"):
            allocate(snap, [bad], NODE)
    good = to_claim(
        claim("g").request("r0", selectors=[f'device.attributes["{DRIVER}"].index == 1'])
    )
    assert allocate(snap, [good], NODE) is not None
    before = cache.hits
    # A rebuilt snapshot over the same slices reuses the CEL results.
    again = ClusterSnapshot.build(slices, classes, [], match_cache=cache)
    assert allocate(again, [good], NODE) is not None
    assert cache.hits > before


def test_a_cel_bomb_is_an_allocation_error_with_the_cost_limit() -> None:
    # Upstream stops the evaluation at CELSelectorExpressionMaxCost; the allocator returns
    # that error for the pod (a CEL runtime error is never "does not match").
    bomb = (
        "cel.bind(s0, 'xxxxxxxxxxxxxxxx', "
        + "".join(f"cel.bind(s{i}, s{i - 1} + s{i - 1}, " for i in range(1, 29))
        + "s28.size() > 0"
        + ")" * 29
    )
    snap = snapshot([node_gpus("node-0", 2)], classes=[device_class()])
    claims = [to_claim(claim("a").request("r0", selectors=[bomb]))]
    with pytest.raises(AllocationError, match="actual cost limit exceeded"):
        allocate(snap, claims, NODE)

"""Cluster snapshot: allocated state (persistent, O(changed)), per-node candidates in upstream
order, pool generation/completeness/validity, counters."""

from __future__ import annotations

from driver.api.claims import AllocationResult, DeviceResult
from driver.api.ids import DeviceID, DeviceName, DriverName, PoolName
from driver.api.quantity import Quantity
from driver.structured.snapshot import AllocatedState
from tests.unit.builders import (
    DRIVER,
    claim,
    device,
    gpu,
    label_term,
    node,
    node_gpus,
    node_selector,
    slice_,
    snapshot,
    to_claim,
    to_node,
)


def did(name: str, pool: str = "node-0") -> DeviceID:
    return DeviceID(DriverName(DRIVER), PoolName(pool), DeviceName(name))


def shared(name: str, memory: str, share: str, pool: str = "node-0") -> DeviceResult:
    return DeviceResult(
        request="r",
        driver=DRIVER,
        pool=pool,
        device=name,
        share_id=share,
        consumed_capacity={"memory": Quantity.parse(memory)},
    )


def exclusive(name: str, pool: str = "node-0", admin: bool | None = None) -> DeviceResult:
    return DeviceResult(request="r", driver=DRIVER, pool=pool, device=name, admin_access=admin)


def test_allocated_state_from_claims() -> None:
    claims = [
        to_claim(claim("a").holding("gpu-0")),
        to_claim(claim("b").request("r0")),  # not allocated: ignored
        to_claim(
            claim("c").allocated(
                AllocationResult(
                    results=(shared("gpu-1", "4Gi", "s1"), exclusive("gpu-2", admin=True))
                ).to_api()
            )
        ),
    ]
    state = AllocatedState.from_claims(claims)
    assert state.exclusive_devices() == {did("gpu-0")}
    assert state.is_exclusive(did("gpu-0"))
    assert not state.is_exclusive(did("gpu-2"))  # admin access never blocks others
    assert state.share_count(did("gpu-1")) == 1
    assert state.consumed_capacity(did("gpu-1")) == {"memory": 4 * 2**30 * 10**9}
    assert state.is_allocated(did("gpu-1"))
    assert not state.is_allocated(did("gpu-3"))


def test_with_and_without_results_are_persistent() -> None:
    empty = AllocatedState.empty()
    one = empty.with_results([shared("gpu-0", "4Gi", "s1")])
    two = one.with_results([AllocationResult(results=(shared("gpu-0", "2Gi", "s2"),))])
    assert empty.shared_devices() == {}
    assert one.share_count(did("gpu-0")) == 1
    assert two.share_count(did("gpu-0")) == 2
    assert two.consumed_capacity(did("gpu-0")) == {"memory": 6 * 2**30 * 10**9}
    back = two.without_results([shared("gpu-0", "2Gi", "s2")])
    assert back == one
    assert back.without_results([shared("gpu-0", "4Gi", "s1")]) == empty
    assert empty.with_results([]) is empty


def test_with_results_touches_only_changed_buckets() -> None:
    state = AllocatedState.empty().with_results(
        [exclusive("gpu-0", pool=f"node-{i}") for i in range(2000)]
    )
    updated = state.with_results([exclusive("gpu-1", pool="node-7")])
    same = sum(a is b for a, b in zip(state._buckets, updated._buckets, strict=True))
    assert same == len(state._buckets) - 1
    assert updated.is_exclusive(did("gpu-1", "node-7"))
    assert not state.is_exclusive(did("gpu-1", "node-7"))


def test_candidates_order_generation_and_flags() -> None:
    snap = snapshot(
        [
            slice_("z-slice", pool="b", devices=[gpu(0), gpu(1)], count=2),
            slice_("a-slice", pool="b", devices=[gpu(2)], count=2),
            slice_("old", pool="a", devices=[gpu(9)], generation=1),
            slice_("new", pool="a", devices=[gpu(8)], generation=2),
            slice_("inc", pool="c", devices=[gpu(7)], count=2),
            slice_("dup1", pool="d", devices=[gpu(6)], count=2),
            slice_("dup2", pool="d", devices=[gpu(6)], count=2),
            node_gpus("node-1", 2),
        ]
    )
    n = to_node(node("node-0"))
    nc = snap.candidates(n)
    assert [str(p) for p in nc.pools] == [f"{DRIVER}/{p}" for p in ("a", "b", "c", "d")]
    assert [(p.incomplete, p.invalid) for p in nc.pools] == [
        (False, False),
        (False, False),
        (True, False),
        (False, True),
    ]
    assert "duplicate device name 'gpu-6'" in nc.pools[3].invalid_reason
    assert [str(c.device_id) for c in nc.devices] == [
        f"{DRIVER}/a/gpu-8",
        f"{DRIVER}/b/gpu-2",
        f"{DRIVER}/b/gpu-0",
        f"{DRIVER}/b/gpu-1",
    ]
    assert [c.index for c in nc.devices] == [0, 1, 2, 3]
    assert snap.candidates(n) is nc  # cached per node
    assert [p.name for p in nc.blocked_pools] == ["c", "d"]


def test_candidates_rebuilt_when_labels_change_for_selector_slices() -> None:
    snap = snapshot(
        [
            slice_(
                "rack",
                node=None,
                node_selector=node_selector(label_term("rack", values=["r1"])),
                devices=[gpu(0)],
            )
        ]
    )
    assert len(snap.candidates(to_node(node("node-0", labels={"rack": "r1"}))).devices) == 1
    assert len(snap.candidates(to_node(node("node-0", labels={"rack": "r2"}))).devices) == 0


def test_available_counters_subtract_allocated_devices() -> None:
    slices = [
        slice_("c", shared_counters={"g": {"mem": "40Gi"}}, count=2),
        slice_(
            "d",
            count=2,
            devices=[
                device("p1", consumes={"g": {"mem": "10Gi"}}),
                device("p2", consumes={"g": {"mem": "20Gi"}}),
            ],
        ),
    ]
    snap = snapshot(slices, claims=[claim("h").holding("p2")])
    pool = snap.candidates(to_node(node("node-0"))).pools[0]
    assert snap.available_counters(pool) == {"g": {"mem": 20 * 2**30 * 10**9}}
    freed = snap.without_allocations([exclusive("p2")])
    assert freed.available_counters(pool) == {"g": {"mem": 40 * 2**30 * 10**9}}


def test_counter_only_slice_elsewhere_still_counts() -> None:
    """Counter sets published in a slice of the pool count even though it has no devices."""
    slices = [
        slice_("a-counters", shared_counters={"g": {"mem": "8Gi"}}, count=2),
        slice_("b-devs", count=2, devices=[device("p", consumes={"g": {"mem": "8Gi"}})]),
    ]
    snap = snapshot(slices)
    nc = snap.candidates(to_node(node("node-0")))
    assert not nc.pools[0].invalid
    assert nc.devices[0].consumes == (("g", "mem", 8 * 2**30 * 10**9),)

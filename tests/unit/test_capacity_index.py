"""The capacity index kept up to date equals one built afresh.

A refresh re-reads only the devices whose use changed and reads a node's partition again only
in the views those devices belong to (:meth:`CapacityIndex.refresh`), when the view is next
read (:meth:`IndexView.settle`). On random clusters (uniform and mixed, static and dynamic MIG)
and random mixes of every pod shape, placements are assumed and some forgotten again; after
each step every node's filed state, and every view's filing and sorted lists once settled,
must equal those of an index built from the same snapshot -- also when a node goes away, or a
what-if opens, while refiles of it wait.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import Any

import pytest

from driver.api.claims import AllocationResult, DeviceResult
from driver.api.quantity import Quantity
from driver.scheduling.capacity_index import (
    CapacityIndex,
    IndexView,
    NodeState,
    _quantity_units,
)
from driver.scheduling.decision import DecisionEngine, pod_uid
from driver.scheduling.outcome import Placement
from driver.scheduling.scoring import NodeAmounts
from tests.unit.test_decision_mixes import _engine, _stream, random_case


def _comparable(index: CapacityIndex, view: IndexView) -> tuple[Any, ...]:
    """A view's filing and lists with shape idents replaced by shape keys (idents are the
    order in which an index met its shapes)."""

    def partition(p: Any) -> Any:
        return (index.by_ident[p.shape].key, *p[1:])

    filed = {name: partition(p) for name, p in view.filed.items()}
    lists = {
        variant: {partition(p): list(entries) for p, entries in partitions.items()}
        for variant, partitions in view.lists.items()
    }
    return filed, lists


def _assert_fresh(eng: DecisionEngine) -> None:
    eng.sync()
    kept = eng._index
    fresh = CapacityIndex(eng.snapshot, list(eng._nodes.values()), eng._classifier)
    assert kept.filing() == fresh.filing()
    for kinds in list(kept.views):
        view = kept.view(kinds)  # (settled)
        assert not view.pending
        assert _comparable(kept, view) == _comparable(fresh, fresh.view(kinds)), sorted(
            {k.classes for k in kinds}, key=sorted
        )


def _step(
    eng: DecisionEngine,
    rng: random.Random,
    placed: list[dict[str, Any]],
    pod: dict[str, Any],
    claims: Any,
) -> None:
    """Decide ``pod`` (assumed where placed), and now and then forget a placed pod."""
    decision = eng.decide(pod, claims)
    if isinstance(decision, Placement):
        eng.assume(decision, pod)
        placed.append(pod)
    if placed and rng.random() < 0.2:
        eng.forget(pod_uid(placed.pop(rng.randrange(len(placed)))))


@pytest.mark.parametrize("seed", range(6))
def test_an_index_kept_up_to_date_equals_a_fresh_one(seed: int) -> None:
    rng, cluster, mix = random_case(3100 + seed, 8, 14)
    eng = _engine(cluster, mix)
    placed: list[dict[str, Any]] = []
    for step, (pod, claims) in enumerate(_stream(rng, mix)):
        _step(eng, rng, placed, pod, claims)
        if step % 5 == 0:
            _assert_fresh(eng)
    _assert_fresh(eng)


def _lists(view: IndexView) -> dict[Any, dict[Any, list[Any]]]:
    return {
        variant: {p: list(entries) for p, entries in partitions.items()}
        for variant, partitions in view.lists.items()
    }


@pytest.mark.parametrize("seed", range(4))
def test_every_list_change_is_in_its_views_change_log(seed: int) -> None:
    """Readers keep what they derived from a view's lists across decisions and read again
    only what its change log names since (the node search's starting heap and first allowed
    nodes): each node filed into or out of a list must be named there with its partition once
    the view is settled, unless a new epoch began."""
    rng, cluster, mix = random_case(3200 + seed, 8, 14)
    eng = _engine(cluster, mix)
    placed: list[dict[str, Any]] = []
    checked = 0
    for pod, claims in _stream(rng, mix):
        eng.sync()
        index = eng._index
        before = {
            kinds: (view.epoch, len(view.changes), _lists(view))
            for kinds, view in ((kinds, index.view(kinds)) for kinds in list(index.views))
        }
        _step(eng, rng, placed, pod, claims)
        eng.sync()
        if eng._index is not index:
            continue  # (rebuilt: new views)
        for kinds in list(index.views):
            view = index.view(kinds)
            if kinds not in before or view.epoch != before[kinds][0]:
                continue
            _, seen, lists = before[kinds]
            logged = set(view.changes[seen:])
            for variant, partitions in _lists(view).items():
                was = lists[variant]
                for partition in partitions.keys() | was.keys():
                    moved = set(partitions.get(partition, [])) ^ set(was.get(partition, []))
                    for entry in moved:
                        assert (partition, entry.name) in logged, (partition, entry)
                        checked += 1
    assert checked


@pytest.mark.parametrize("seed", range(4))
def test_pending_refiles_survive_a_node_going_and_a_what_if(seed: int) -> None:
    """Refiles wait in each view until it is read (:meth:`IndexView.settle`). A node taken
    out meanwhile leaves no entry of the state it was filed from, one put back is filed from
    its newest state, and a what-if on a node with refiles waiting leaves every view as an
    index built afresh files it."""
    rng, cluster, mix = random_case(3300 + seed, 8, 14)
    eng = _engine(cluster, mix)
    placed: list[dict[str, Any]] = []
    waited = 0
    for step, (pod, claims) in enumerate(_stream(rng, mix)):
        _step(eng, rng, placed, pod, claims)
        eng.sync()  # (refreshes the nodes whose use changed; no view is read)
        index = eng._index
        waiting = sorted({name for view in index.views.values() for name in view.pending})
        if not waiting:
            continue
        waited += 1
        name = rng.choice(waiting)
        node = eng._nodes[name]
        if step % 2:
            index.look(eng.snapshot, node)
            assert not any(view.pending for view in index.views.values())
            index.unlook()
        else:
            eng.observe_node(name, None)
            eng.sync()
            assert eng._index is index  # (taken out, not rebuilt)
            assert all(name not in view.pending for view in index.views.values())
            _assert_fresh(eng)
            eng.observe_node(name, node)
        _assert_fresh(eng)
    assert waited


def _added_by_device_id(state: NodeState, results: list[AllocationResult]) -> NodeAmounts:
    """:meth:`NodeState.added` as first written, each picked device looked up by its
    DeviceID: the slow path the string-keyed lookup must agree with."""
    picked = [r for allocation in results for r in allocation.results if not r.admin_access]
    by_id = {d.device_id: d for d in state.devices}
    fresh = set()
    memory = cores = 0
    for r in picked:
        device = by_id.get(r.device_id)
        if device is None:
            continue
        if not device.in_use:
            fresh.add(r.device_id)
        if r.consumed_capacity is None:
            memory += device.memory
            cores += device.cores
        else:
            memory += _quantity_units(r.consumed_capacity.get("memory"))
            cores += _quantity_units(r.consumed_capacity.get("cores"))
    return NodeAmounts(devices=len(fresh), memory=memory, cores=cores)


@pytest.mark.parametrize("seed", range(4))
def test_added_agrees_with_looking_up_device_ids(seed: int) -> None:
    """What a pod's allocation adds to a node, found by (driver, pool, device) strings, equals
    looking each picked device up by its DeviceID: on random nodes in use and random results
    naming the node's devices, devices of no pool of the node, a device name of the node in
    another pool or driver, admin access, shares with and without consumed capacity, and the
    same device picked twice."""
    rng, cluster, mix = random_case(3500 + seed, 8, 14)
    eng = _engine(cluster, mix)
    placed: list[dict[str, Any]] = []
    for pod, claims in _stream(rng, mix)[:20]:
        _step(eng, rng, placed, pod, claims)
    eng.sync()
    amounts = [None, {"memory": Quantity.of("1Gi")}, {"cores": Quantity.of("30")}, {}]
    for state in eng._index.states.values():
        for _ in range(10):
            results = []
            for _ in range(rng.randint(0, 4)):
                device = rng.choice(state.devices).device_id
                driver, pool, name = device.driver, device.pool, device.device
                odd = rng.random()
                if odd < 0.1:
                    pool = "elsewhere"
                elif odd < 0.2:
                    driver = "other.example.com"
                elif odd < 0.3:
                    name = "no-such-device"
                results.append(
                    DeviceResult(
                        "r0",
                        driver,
                        pool,
                        name,
                        admin_access=rng.random() < 0.1 or None,
                        consumed_capacity=rng.choice(amounts),
                    )
                )
            allocations = [
                AllocationResult(tuple(results[:2])),
                AllocationResult(tuple(results[2:])),
            ]
            assert state.added(allocations) == _added_by_device_id(state, allocations)


@pytest.mark.parametrize(
    "text", ["0", "1", "1500m", "-1500m", "1n", "-1n", "81559Mi", "0.5", "-0.5", "2e3", "1Ki", "-3"]
)
def test_quantity_units_is_value(text: str) -> None:
    """The index's units are Quantity.value(), whose integer rounding agrees with rounding the
    exact Fraction away from zero (upstream's RoundUp), negative and fractional values
    included; milli_value() likewise."""
    quantity = Quantity.of(text)
    assert _quantity_units(quantity) == quantity.value()
    assert _quantity_units(None) == 0

    def away_from_zero(value: Fraction) -> int:
        return math.ceil(value) if value >= 0 else math.floor(value)

    assert quantity.value() == away_from_zero(quantity.exact)
    assert quantity.milli_value() == away_from_zero(quantity.exact * 1000)

"""Hypothesis properties of the allocator.

* Pods allocated one after another, each result folded into the snapshot: no device is given
  twice unless it allows multiple allocations, no capacity and no counter is exceeded, every
  selector holds on the chosen devices, and the same input gives the same output.
* ``order=None`` equals upstream first-fit, checked against a deliberately naive reference
  implementation written here from the upstream rules (pools by driver then name, highest
  generation, complete pools only, slices by name, devices in slice order, combinations in
  lexicographic order, claims then requests in order, first complete solution wins).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.api.claims import AllocationResult, DeviceClass, ResourceClaim
from driver.api.model import ResourceSlice
from driver.api.nodes import Node
from driver.structured.allocator import Candidate, OrderContext, allocate
from driver.structured.snapshot import ClusterSnapshot
from tests.unit.builders import (
    DRIVER,
    JSON,
    cap,
    claim,
    device,
    device_class,
    node,
    slice_,
)

NUMA = "resource.kubernetes.io/numaNode"
PRODUCTS = ("T4", "A10G")
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# A selector as (CEL text, Python predicate over the device JSON's attributes).
SELECTORS: dict[str, tuple[str, Any]] = {
    "any": ("", lambda attrs: True),
    "t4": (
        f'device.attributes["{DRIVER}"].productName == "T4"',
        lambda attrs: attrs["productName"]["string"] == "T4",
    ),
    "numa1": (
        'device.attributes["resource.kubernetes.io"].numaNode == 1',
        lambda attrs: attrs[NUMA]["int"] == 1,
    ),
    "even": (
        f'device.attributes["{DRIVER}"].index % 2 == 0',
        lambda attrs: attrs["index"]["int"] % 2 == 0,
    ),
}


def _attrs(index: int, product: str, numa: int) -> dict[str, Any]:
    return {"index": index, "productName": product, NUMA: numa, "uuid": f"GPU-{index}"}


# --------------------------------------------------------------------------- strategies


@dataclass
class Cluster:
    slices: list[JSON]
    held: list[JSON]


@st.composite
def exclusive_clusters(draw: st.DrawFn) -> Cluster:
    """Several pools on node-0 (some split over slices, some stale or incomplete), a pool on
    another node, plain exclusive devices, some held by other claims."""
    slices: list[JSON] = []
    index = 0
    n_pools = draw(st.integers(1, 3))
    pool_names = draw(
        st.lists(
            st.sampled_from(["pa", "pb", "pc", "pd"]),
            min_size=n_pools,
            max_size=n_pools,
            unique=True,
        )
    )
    all_devices: list[tuple[str, str]] = []
    for pool in pool_names:
        n_slices = draw(st.integers(1, 2))
        generation = draw(st.integers(1, 3))
        incomplete = draw(st.booleans()) and draw(st.booleans())
        count = n_slices + (1 if incomplete else 0)
        if draw(st.booleans()):
            # A stale slice of an older generation, which must be ignored.
            slices.append(
                slice_(
                    f"{pool}-old",
                    pool=pool,
                    generation=generation - 1 if generation > 1 else 0,
                    devices=[device("stale", attrs=_attrs(99, "T4", 0))],
                )
            )
        for s in range(n_slices):
            devices = []
            for _ in range(draw(st.integers(0, 3))):
                name = f"d{index}"
                devices.append(
                    device(
                        name,
                        attrs=_attrs(
                            index, draw(st.sampled_from(PRODUCTS)), draw(st.integers(0, 1))
                        ),
                    )
                )
                all_devices.append((pool, name))
                index += 1
            slice_name = draw(st.sampled_from(["a", "b", "c", "z"])) + f"-{pool}-{s}"
            slices.append(
                slice_(slice_name, pool=pool, devices=devices, generation=generation, count=count)
            )
    slices.append(
        slice_(
            "elsewhere",
            pool="other",
            node="node-1",
            devices=[device("x", attrs=_attrs(50, "T4", 0))],
        )
    )
    held_devices = draw(st.lists(st.sampled_from(all_devices), unique=True)) if all_devices else []
    held = [
        claim(f"held-{i}").holding(name, pool=pool).json()
        for i, (pool, name) in enumerate(held_devices)
    ]
    return Cluster(slices, held)


@dataclass
class ReqSpec:
    name: str
    count: int
    selector: str


@dataclass
class ClaimSpec:
    name: str
    requests: list[ReqSpec]
    match_numa: bool

    def json(self) -> JSON:
        builder = claim(self.name)
        for r in self.requests:
            cel = SELECTORS[r.selector][0]
            builder.request(r.name, count=r.count, selectors=[cel] if cel else [])
        if self.match_numa:
            builder.constraint(match=NUMA)
        return builder.json()


@st.composite
def claim_specs(draw: st.DrawFn, prefix: str = "c") -> list[ClaimSpec]:
    out = []
    for i in range(draw(st.integers(1, 2))):
        requests = [
            ReqSpec(f"r{j}", draw(st.integers(1, 3)), draw(st.sampled_from(sorted(SELECTORS))))
            for j in range(draw(st.integers(1, 2)))
        ]
        out.append(ClaimSpec(f"{prefix}{i}", requests, draw(st.booleans())))
    return out


# --------------------------------------------------------------------------- the reference


def reference_first_fit(
    slices: Sequence[JSON], held: Sequence[JSON], claims: Sequence[ClaimSpec], node_name: str
) -> list[list[str]] | None:
    """Upstream first-fit, naively: build the ordered device list, then search combinations in
    lexicographic order per request, claims and requests in order; first complete solution."""
    by_pool: dict[tuple[str, str], list[JSON]] = {}
    for s in slices:
        spec = s["spec"]
        by_pool.setdefault((spec["driver"], spec["pool"]["name"]), []).append(s)
    ordered: list[tuple[str, JSON]] = []  # (pool, device json)
    for key in sorted(by_pool):
        group = by_pool[key]
        top = max(s["spec"]["pool"]["generation"] for s in group)
        current = [s for s in group if s["spec"]["pool"]["generation"] == top]
        if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
            continue  # incomplete: skipped for ExactCount
        mine = [s for s in current if s["spec"].get("nodeName") == node_name]
        for s in sorted(mine, key=lambda s: s["metadata"]["name"]):
            ordered.extend((key[1], d) for d in s["spec"].get("devices", []))
    taken = {
        (r["pool"], r["device"])
        for h in held
        for r in h["status"]["allocation"]["devices"]["results"]
    }
    usable = [i for i, (pool, d) in enumerate(ordered) if (pool, d["name"]) not in taken]
    slots = [(ci, r) for ci, c in enumerate(claims) for r in c.requests]

    def numa_ok(chosen: list[list[int]]) -> bool:
        for ci, c in enumerate(claims):
            if not c.match_numa:
                continue
            values = {ordered[i][1]["attributes"][NUMA]["int"] for i in chosen[ci]}
            if len(values) > 1:
                return False
        return True

    def search(k: int, used: set[int], chosen: list[list[int]]) -> list[list[int]] | None:
        if not numa_ok(chosen):
            return None
        if k == len(slots):
            return chosen
        ci, req = slots[k]
        predicate = SELECTORS[req.selector][1]
        pool = [i for i in usable if i not in used and predicate(ordered[i][1]["attributes"])]
        for combo in itertools.combinations(pool, req.count):
            nxt = [list(x) for x in chosen]
            nxt[ci].extend(combo)
            found = search(k + 1, used | set(combo), nxt)
            if found is not None:
                return found
        return None

    solution = search(0, set(), [[] for _ in claims])
    if solution is None:
        return None
    out: list[list[str]] = []
    for ci, c in enumerate(claims):
        names: list[str] = []
        position = 0
        for r in c.requests:
            for i in solution[ci][position : position + r.count]:
                pool, d = ordered[i]
                names.append(f"{r.name}:{pool}/{d['name']}")
            position += r.count
        out.append(names)
    return out


def _build(
    slices: Sequence[JSON], classes: Sequence[JSON], held: Sequence[JSON]
) -> ClusterSnapshot:
    return ClusterSnapshot.build(
        [ResourceSlice.from_api(s) for s in slices],
        [DeviceClass.from_api(c) for c in classes],
        [ResourceClaim.from_api(h) for h in held],
    )


def _compact(results: list[AllocationResult] | None) -> list[list[str]] | None:
    if results is None:
        return None
    return [[f"{r.request}:{r.pool}/{r.device}" for r in a.results] for a in results]


@SETTINGS
@given(cluster=exclusive_clusters(), claims=claim_specs())
def test_first_fit_equals_upstream_reference(cluster: Cluster, claims: list[ClaimSpec]) -> None:
    snap = _build(cluster.slices, [device_class()], cluster.held)
    the_node = Node.from_api(node("node-0"))
    got = allocate(snap, [ResourceClaim.from_api(c.json()) for c in claims], the_node)
    assert _compact(got) == reference_first_fit(cluster.slices, cluster.held, claims, "node-0")


# --------------------------------------------------------------------------- invariants


@st.composite
def shared_clusters(draw: st.DrawFn) -> list[JSON]:
    """node-0 with shared GPUs (consumable memory/cores), exclusive GPUs, and a partitionable
    GPU whose partitions consume shared counters."""
    devices: list[JSON] = []
    for i in range(draw(st.integers(1, 3))):
        memory = draw(st.sampled_from(["8Gi", "16Gi"]))
        devices.append(
            device(
                f"shared-{i}",
                multi=True,
                attrs=_attrs(i, draw(st.sampled_from(PRODUCTS)), i % 2),
                capacity={
                    "memory": cap(memory, default=memory, min="1Gi", step="1Gi"),
                    "cores": cap("100", default="0", min="0", step="1"),
                },
            )
        )
    devices.extend(
        device(
            f"whole-{i}",
            attrs=_attrs(10 + i, draw(st.sampled_from(PRODUCTS)), 0),
            capacity={"memory": "16Gi", "cores": "100"},
        )
        for i in range(draw(st.integers(0, 2)))
    )
    parts = [
        device(
            "part-full",
            attrs=_attrs(20, "A10G", 1),
            consumes={"gpu-p": {"memory": "40Gi", "slices": "7"}},
        )
    ]
    parts.extend(
        device(
            f"part-{i}",
            attrs=_attrs(21 + i, "A10G", 1),
            consumes={"gpu-p": {"memory": "20Gi", "slices": draw(st.sampled_from(["2", "3"]))}},
        )
        for i in range(draw(st.integers(1, 4)))
    )
    return [
        slice_(
            "s0-counters", shared_counters={"gpu-p": {"memory": "40Gi", "slices": "7"}}, count=3
        ),
        slice_("s1-devices", devices=devices, count=3),
        slice_("s2-parts", devices=parts, count=3),
    ]


@st.composite
def pods(draw: st.DrawFn) -> list[JSON]:
    out: list[JSON] = []
    for i in range(draw(st.integers(1, 8))):
        builder = claim(f"pod-{i}")
        for j in range(draw(st.integers(1, 2))):
            selector = draw(st.sampled_from(sorted(SELECTORS)))
            cel = SELECTORS[selector][0]
            capacity = draw(
                st.sampled_from([None, {"memory": "3Gi"}, {"memory": "5Gi", "cores": "30"}])
            )
            builder.request(
                f"r{j}",
                cls="any",
                count=draw(st.integers(1, 2)),
                selectors=[cel] if cel else [],
                capacity=capacity,
            )
        if draw(st.booleans()):
            builder.constraint(match=NUMA)
        out.append(builder.json())
    return out


def _quantity_nanos(text: str) -> int:
    from driver.api.quantity import Quantity

    return Quantity.parse(text).nanos


@SETTINGS
@given(slices=shared_clusters(), claims=pods())
def test_sequential_allocation_never_overcommits(slices: list[JSON], claims: list[JSON]) -> None:
    classes = [device_class("any", selectors=["true"])]
    snap = _build(slices, classes, [])
    the_node = Node.from_api(node("node-0"))
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
    placed: list[tuple[JSON, AllocationResult]] = []
    first_run: list[list[AllocationResult] | None] = []
    for raw in claims:
        model = ResourceClaim.from_api(raw)
        result = allocate(snap, [model], the_node)
        first_run.append(result)
        if result is None:
            continue
        placed.append((raw, result[0]))
        snap = snap.with_allocations(result)

    # Same input, same output: replaying from scratch gives identical results.
    replay = _build(slices, classes, [])
    for raw, expected in zip(claims, first_run, strict=True):
        result = allocate(replay, [ResourceClaim.from_api(raw)], the_node)
        assert result == expected
        if result is not None:
            replay = replay.with_allocations(result)

    exclusive: list[str] = []
    shares: dict[str, int] = {}
    consumed: dict[tuple[str, str], int] = {}
    for raw, result in placed:
        requests = {r["name"]: r["exactly"] for r in raw["spec"]["devices"]["requests"]}
        for r in result.results:
            dev = devices[r.device]
            # Every selector holds on the chosen device.
            for sel in requests[r.request].get("selectors", []):
                expression = sel["cel"]["expression"]
                (predicate,) = [p for cel, p in SELECTORS.values() if cel == expression]
                assert predicate(dev["attributes"]), (r.device, expression)
            if dev.get("allowMultipleAllocations"):
                assert r.share_id is not None
                assert r.consumed_capacity is not None
                shares[r.device] = shares.get(r.device, 0) + 1
                for name, quantity in r.consumed_capacity.items():
                    consumed[(r.device, name)] = consumed.get((r.device, name), 0) + quantity.nanos
            else:
                assert r.share_id is None
                assert r.consumed_capacity is None
                exclusive.append(r.device)
    # No device twice unless shareable; never both exclusive and shared.
    assert len(exclusive) == len(set(exclusive))
    assert not set(exclusive) & set(shares)
    # No capacity exceeded.
    for (name, capacity_name), total in consumed.items():
        assert total <= _quantity_nanos(devices[name]["capacity"][capacity_name]["value"])
    # No counter exceeded.
    used: dict[str, int] = {}
    for name in set(exclusive) | set(shares):
        for consumption in devices[name].get("consumesCounters", []):
            for counter, value in consumption["counters"].items():
                used[counter] = used.get(counter, 0) + _quantity_nanos(value["value"])
    assert used.get("memory", 0) <= _quantity_nanos("40Gi")
    assert used.get("slices", 0) <= _quantity_nanos("7")
    # The folded state agrees with what was placed.
    assert {d.device for d in snap.allocated.exclusive_devices()} == set(exclusive)
    assert {d.device: n for d, n in snap.allocated.shared_devices().items()} == shares


@SETTINGS
@given(cluster=exclusive_clusters(), claims=claim_specs(), seed=st.integers(0, 2**16))
def test_any_device_order_keeps_feasibility_and_validity(
    cluster: Cluster, claims: list[ClaimSpec], seed: int
) -> None:
    """A scorer only reorders: whether the claims fit is unchanged, and whatever it picks
    still passes every check (not held, not given twice, selectors and constraints hold)."""

    def shuffle(cands: Sequence[Candidate], ctx: OrderContext) -> Sequence[Candidate]:
        shuffled = list(cands)
        random.Random(f"{seed}/{ctx.claim.name}/{ctx.request}").shuffle(shuffled)
        return shuffled

    snap = _build(cluster.slices, [device_class()], cluster.held)
    the_node = Node.from_api(node("node-0"))
    models = [ResourceClaim.from_api(c.json()) for c in claims]
    got = allocate(snap, models, the_node, order=shuffle)
    reference = reference_first_fit(cluster.slices, cluster.held, claims, "node-0")
    assert (got is None) == (reference is None)
    if got is None:
        return
    held = {
        (r["pool"], r["device"])
        for h in cluster.held
        for r in h["status"]["allocation"]["devices"]["results"]
    }
    devices = {
        (s["spec"]["pool"]["name"], d["name"]): d
        for s in cluster.slices
        for d in s["spec"].get("devices", [])
        if s["spec"].get("nodeName") == "node-0"
    }
    chosen = [(r.pool, r.device) for a in got for r in a.results]
    assert len(chosen) == len(set(chosen))
    assert not set(chosen) & held
    for spec, allocation in zip(claims, got, strict=True):
        numa = set()
        for r in allocation.results:
            attrs = devices[(r.pool, r.device)]["attributes"]
            (req,) = [q for q in spec.requests if q.name == r.request]
            assert SELECTORS[req.selector][1](attrs)
            numa.add(attrs[NUMA]["int"])
        if spec.match_numa:
            assert len(numa) == 1

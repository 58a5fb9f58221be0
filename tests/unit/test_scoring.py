"""The two-axis scorer, table-driven: consumption, GPU order, topology, node scores, policies."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import pytest

from driver.api.errors import PolicyError
from driver.api.ids import DeviceID
from driver.api.model import Device
from driver.api.quantity import Quantity
from driver.scheduling.policy import PolicyDefaults, policies_for_pod
from driver.scheduling.scoring import (
    NUMA_NODE,
    PCIE_ROOT,
    DeviceLoad,
    NodeAmounts,
    ScoredDevice,
    _candidate_scores,
    _spec_amount,
    best_node,
    consumption,
    gpu_order,
    natural_key,
    node_score,
    order_indices,
    score_devices,
)
from driver.structured.allocator import OrderContext, allocate
from driver.structured.snapshot import AllocatedState, Candidate, PoolUsage
from tests.unit.builders import (
    DRIVER,
    cap,
    claim,
    device,
    gpu,
    node,
    slice_,
    snapshot,
    to_node,
)

MI = 1024 * 1024
GI = 1024 * MI


def shared_gpu(index: int, memory: str = "16Gi", **extra: Any) -> Device:
    return Device.from_api(gpu(index, memory=memory, shared=True, **extra))


def q(requests: dict[str, str]) -> dict[str, Quantity]:
    return {k: Quantity.of(v) for k, v in requests.items()}


# --------------------------------------------------------------------------- consumption

CONSUMPTION = [
    ("no request takes the whole GPU", shared_gpu(0), {}, {"memory": 16 * GI, "cores": 0}),
    ("memory request", shared_gpu(0), {"memory": "7500Mi"}, {"memory": 7500 * MI, "cores": 0}),
    ("cores request", shared_gpu(0), {"cores": "30"}, {"memory": 16 * GI, "cores": 30}),
    ("rounds up to the step", shared_gpu(0), {"memory": "1000000"}, {"memory": MI, "cores": 0}),
    ("above capacity", shared_gpu(0), {"memory": "17Gi"}, None),
    ("unknown capacity", shared_gpu(0), {"bandwidth": "1"}, None),
    (
        "valid values round up",
        Device.from_api(
            device(
                "d",
                capacity={"memory": cap("8Gi", default="8Gi", values=["2Gi", "4Gi", "8Gi"])},
                multi=True,
            )
        ),
        {"memory": "3Gi"},
        {"memory": 4 * GI},
    ),
    (
        "exclusive device taken whole",
        Device.from_api(gpu(0)),
        {"memory": "1Gi"},
        {"memory": 16 * GI, "cores": 100},
    ),
    ("exclusive device too small", Device.from_api(gpu(0)), {"memory": "20Gi"}, None),
]


@pytest.mark.parametrize(
    ("case", "dev", "requests", "expected"), CONSUMPTION, ids=[c[0] for c in CONSUMPTION]
)
def test_consumption(
    case: str, dev: Device, requests: dict[str, str], expected: dict[str, int] | None
) -> None:
    assert consumption(dev, q(requests)) == expected, case


# --------------------------------------------------------------------------- GPU axis


def names(order: list[int], devices: list[Device]) -> list[str]:
    return [devices[i].name for i in order]


GPU_ORDER = [
    # (case, used memory GiB per GPU, request, policy, count, expected order)
    (
        "binpack prefers the fullest GPU that fits",
        [0, 8, 4, 0],
        {"memory": "4Gi"},
        "binpack",
        1,
        ["gpu-1", "gpu-2", "gpu-0", "gpu-3"],
    ),
    (
        "binpack puts GPUs without room last",
        [0, 14, 4, 0],
        {"memory": "4Gi"},
        "binpack",
        1,
        ["gpu-2", "gpu-0", "gpu-3", "gpu-1"],
    ),
    (
        "spread prefers the emptiest GPU",
        [0, 8, 4, 0],
        {"memory": "4Gi"},
        "spread",
        1,
        ["gpu-0", "gpu-3", "gpu-2", "gpu-1"],
    ),
    (
        "first-fit keeps upstream order",
        [0, 8, 4, 0],
        {"memory": "4Gi"},
        "first-fit",
        1,
        ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
    ),
    (
        "ties break by device name",
        [0, 0, 0, 0],
        {"memory": "4Gi"},
        "binpack",
        1,
        ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
    ),
    (
        "whole GPU only fits idle ones",
        [0, 1, 0, 2],
        {},
        "binpack",
        1,
        ["gpu-0", "gpu-2", "gpu-3", "gpu-1"],
    ),
]


@pytest.mark.parametrize("row", GPU_ORDER, ids=[c[0] for c in GPU_ORDER])
def test_gpu_order(row: tuple[Any, ...]) -> None:
    case, used, requests, policy, count, expected = row
    devices = [shared_gpu(i) for i in range(len(used))]
    loads = [DeviceLoad(used={"memory": u * GI}, in_use=u > 0) for u in used]
    scored = score_devices(devices, loads, q(requests), [("d", "p", d.name) for d in devices])
    assert names(order_indices(scored, policy, count), devices) == expected, case


def test_multi_gpu_request_stays_on_one_numa_node() -> None:
    # gpu-1 (NUMA 0) is the fullest, but NUMA 0 has only one GPU with room for the second
    # device; NUMA 1 holds both devices, so both come first.
    devices = [shared_gpu(i, numa=0 if i < 2 else 1) for i in range(4)]
    loads = [DeviceLoad(used={"memory": u * GI}, in_use=u > 0) for u in (14, 8, 2, 1)]
    scored = score_devices(
        devices, loads, q({"memory": "4Gi"}), [("d", "p", d.name) for d in devices]
    )
    assert names(order_indices(scored, "binpack", 2), devices) == [
        "gpu-2",
        "gpu-3",
        "gpu-1",
        "gpu-0",
    ]
    assert names(order_indices(scored, "binpack", 1), devices)[0] == "gpu-1"


def test_natural_device_order() -> None:
    assert sorted(["gpu-10", "gpu-2", "gpu-1"], key=natural_key) == ["gpu-1", "gpu-2", "gpu-10"]


def test_gpu_order_plugs_into_the_allocator() -> None:
    slices = [slice_("s", devices=[gpu(i, shared=True) for i in range(3)])]
    held = claim("held", uid="u-held").allocated(
        {
            "devices": {
                "results": [
                    {
                        "request": "r0",
                        "driver": "gpu.biaxial.dev",
                        "pool": "node-0",
                        "device": "gpu-1",
                        "shareID": "5a0c5ab4-2a3b-4bbb-9c1d-8c1f0e2f6f01",
                        "consumedCapacity": {"memory": "8Gi", "cores": "0"},
                    }
                ]
            }
        }
    )
    snap = snapshot(slices, claims=[held])
    pending = claim("new", uid="u-new").request("r0", count=1, capacity={"memory": "4Gi"}).model()
    chosen = {}
    for policy in ("binpack", "spread", "first-fit"):
        results = allocate(snap, [pending], to_node(node()), order=gpu_order(policy))  # type: ignore[arg-type]
        assert results is not None
        chosen[policy] = results[0].results[0].device
    assert chosen == {"binpack": "gpu-1", "spread": "gpu-0", "first-fit": "gpu-0"}
    assert gpu_order("first-fit") is None


def _order_context(
    requests: dict[str, str],
    allocated: AllocatedState,
    pending: Mapping[DeviceID, Mapping[str, int]] | None = None,
) -> OrderContext:
    """What the allocator tells its order hook for one request of one device on node-0."""
    return OrderContext(
        node=to_node(node()),
        claim=claim("c").request("r0", count=1).model(),
        request="r0",
        count=1,
        capacity_requests=q(requests),
        admin_access=False,
        allocated=allocated,
        pending=pending or {},
    )


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        # A device without a requested capacity cannot take the request: it comes last.
        ({"memory": "4Gi"}, ["gpu-0", "bare"]),
        ({"memory": "4Gi", "bandwidth": "1"}, ["bare", "gpu-0"]),  # neither fits: by name
        # With no capacity asked, neither is set apart: binpack puts the whole-GPU share first.
        ({}, ["gpu-0", "bare"]),
    ],
)
def test_gpu_order_sets_apart_devices_without_a_requested_capacity(
    requests: dict[str, str], expected: list[str]
) -> None:
    slices = [slice_("s", devices=[gpu(0, shared=True), device("bare", multi=True)])]
    snap = snapshot(slices)
    candidates = snap.candidates(to_node(node())).devices
    ctx = _order_context(requests, snap.allocated)
    order = gpu_order("binpack")
    assert order is not None
    assert [c.device_id.device for c in order(candidates, ctx)] == expected


# --------------------------------------------------------------------------- node axis

NODE_SCORES = [
    # (case, total, used, adding, cores, expected)
    (
        "empty T4 node, one 7500Mi pod",
        NodeAmounts(4, 4 * 15360, 400),
        NodeAmounts(),
        NodeAmounts(1, 7500, 0),
        False,
        (Fraction(1, 4) + Fraction(7500, 61440)) / 2,
    ),
    (
        "cores counted when consumed",
        NodeAmounts(2, 100, 200),
        NodeAmounts(1, 50, 50),
        NodeAmounts(0, 10, 50),
        True,
        (Fraction(1, 2) + Fraction(60, 100) + Fraction(100, 200)) / 3,
    ),
    (
        "cores ignored otherwise",
        NodeAmounts(2, 100, 200),
        NodeAmounts(1, 50, 50),
        NodeAmounts(0, 10, 0),
        False,
        (Fraction(1, 2) + Fraction(60, 100)) / 2,
    ),
    ("no devices, no score", NodeAmounts(), NodeAmounts(), NodeAmounts(), False, Fraction(0)),
]


@pytest.mark.parametrize("row", NODE_SCORES, ids=[c[0] for c in NODE_SCORES])
def test_node_score(row: tuple[Any, ...]) -> None:
    case, total, used, adding, cores, expected = row
    assert node_score(total, used, adding, cores=cores) == expected, case


@pytest.mark.parametrize(
    ("policy", "scored", "winner"),
    [
        ("binpack", [(Fraction(1, 2), "b"), (Fraction(3, 4), "c"), (Fraction(3, 4), "a")], "a"),
        ("spread", [(Fraction(1, 2), "b"), (Fraction(3, 4), "c"), (Fraction(1, 2), "a")], "a"),
        ("spread", [(Fraction(1, 3), "z"), (Fraction(1, 2), "a")], "z"),
    ],
)
def test_best_node_ties_by_name(
    policy: Any, scored: list[tuple[Fraction, str]], winner: str
) -> None:
    assert best_node(policy, scored)[1] == winner


# --------------------------------------------------------------------------- policies

POLICIES = [
    ({}, ("binpack", "binpack")),
    ({"biaxial.dev/node-policy": "spread"}, ("spread", "binpack")),
    (
        {"hami.io/node-scheduler-policy": "spread", "hami.io/gpu-scheduler-policy": "spread"},
        ("spread", "spread"),
    ),
    (
        {"hami.io/gpu-scheduler-policy": "spread", "biaxial.dev/gpu-policy": "binpack"},
        ("binpack", "binpack"),
    ),
]


@pytest.mark.parametrize(("annotations", "expected"), POLICIES)
def test_policy_annotations(annotations: dict[str, str], expected: tuple[str, str]) -> None:
    resolved = policies_for_pod(annotations, PolicyDefaults())
    assert (resolved.node, resolved.gpu) == expected


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"biaxial.dev/node-policy": "pack"},
            "annotation biaxial.dev/node-policy: unknown policy 'pack'",
        ),
        (
            {"hami.io/gpu-scheduler-policy": "topology-aware"},
            "hami.io/gpu-scheduler-policy: unknown policy",
        ),
        ({"biaxial.dev/gpu-policy": "first-fit"}, "allowed: binpack, spread"),
    ],
)
def test_unknown_policy_is_an_error(annotations: dict[str, str], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        policies_for_pod(annotations, PolicyDefaults())


def test_defaults_are_validated() -> None:
    assert PolicyDefaults.parse("spread", "first-fit") == PolicyDefaults(
        node="spread", gpu="first-fit"
    )
    with pytest.raises(PolicyError, match="GPU policy: unknown policy 'best'"):
        PolicyDefaults.parse("binpack", "best")


@pytest.mark.parametrize("cores", [False, True])
@pytest.mark.parametrize(
    ("total", "used", "adding"),
    [
        (NodeAmounts(8, 80 * GI, 800), NodeAmounts(3, 17 * GI, 250), NodeAmounts(1, 3 * GI, 30)),
        (NodeAmounts(8, 80 * GI, 0), NodeAmounts(0, 0, 0), NodeAmounts(0, 0, 0)),
        (NodeAmounts(0, 0, 0), NodeAmounts(0, 0, 0), NodeAmounts(1, 1, 1)),
        (NodeAmounts(7, 0, 300), NodeAmounts(9, 0, 301), NodeAmounts(0, 0, 0)),  # overfull
        (NodeAmounts(3, 5, 7), NodeAmounts(-1, 2, 3), NodeAmounts(1, 1, 1)),
    ],
)
def test_node_score_is_the_mean_of_the_dimension_fractions(
    total: NodeAmounts, used: NodeAmounts, adding: NodeAmounts, cores: bool
) -> None:
    """One Fraction over a common denominator equals the mean of one Fraction per dimension."""
    dims = [
        d
        for d in ("devices", "memory", "cores")
        if getattr(total, d) > 0 and (cores or d != "cores")
    ]
    expected = (
        sum(
            (Fraction(getattr(used, d) + getattr(adding, d), getattr(total, d)) for d in dims),
            Fraction(0),
        )
        / len(dims)
        if dims
        else Fraction(0)
    )
    assert node_score(total, used, adding, cores=cores) == expected


# --------------------------------------------------------------------------- allocator hook


def _reference_scores(candidates: Sequence[Candidate], ctx: OrderContext) -> list[ScoredDevice]:
    """The allocator hook's scores as first written (every spec read for every device): the
    slow path :func:`_candidate_scores` must agree with, for devices without shared
    counters."""
    requests = {name: q.nanos for name, q in ctx.capacity_requests.items()}
    dims = ("memory", "cores") if requests.get("cores", 0) > 0 else ("memory",)
    out = []
    for cand in candidates:
        device_id = cand.device_id
        key = (device_id.driver, device_id.pool, natural_key(device_id.device))
        attributes = cand.device.attributes
        group = (attributes.get(PCIE_ROOT), attributes.get(NUMA_NODE))
        specs = cand.capacities
        if requests and not requests.keys() <= {spec.name for spec in specs}:
            out.append(ScoredDevice(0.0, False, group, key))
            continue
        usage = ctx.allocated.pool(device_id.driver, device_id.pool)
        exclusive = device_id.device in usage.exclusive
        consumed = usage.capacity.get(device_id.device) or {}
        in_use = exclusive or device_id.device in usage.shares
        pending = ctx.pending.get(device_id)
        if pending is not None:
            in_use = True
            exclusive = exclusive or not pending
        fits = not (exclusive or (in_use and not cand.multi))
        total = 0.0
        counted = 0
        for spec in specs:
            amount = _spec_amount(spec, cand.multi, requests.get(spec.name))
            if amount is None:
                fits = False
                break
            used = consumed.get(spec.name, 0) + (pending.get(spec.name, 0) if pending else 0)
            if cand.multi and used + amount > spec.value:
                fits = False
            if spec.name in dims and spec.value > 0:
                if cand.multi:
                    total += (used + amount) / spec.value
                else:
                    total += requests.get(spec.name, spec.value) / spec.value
                counted += 1
        score = total / counted if counted else (1.0 if in_use else 0.0)
        out.append(ScoredDevice(score, fits, group, key))
    return out


class _Allocated:
    """What other claims hold, per pool (an AllocatedState's ``pool`` alone)."""

    def __init__(self, usages: dict[tuple[str, str], PoolUsage]) -> None:
        self.usages = usages

    def pool(self, driver: str, pool: str) -> PoolUsage:
        return self.usages.get((driver, pool), PoolUsage())


@pytest.mark.parametrize("seed", range(40))
def test_candidate_scores_agree_with_reading_every_spec(seed: int) -> None:
    """The allocator hook reads each tuple of capacity specs once per call and a pool's use
    once per run of its candidates: on random devices (whole, shared with every request
    policy, without memory, with zero capacities, in two pools, alike and not), random use
    (exclusive, shares, this attempt's pending) and random requests (none, within, beyond,
    naming a capacity no device has, zero and negative amounts), its scores equal reading
    every spec of every device."""
    rng = random.Random(seed)
    policies: list[dict[str, Any]] = [
        {},
        {"default": "4Gi", "values": ["2Gi", "4Gi", "8Gi"]},
        {"default": "1Gi", "min": "1Gi", "max": "8Gi", "step": "1Gi"},
        {"min": "512Mi"},
    ]
    made = []
    for i in range(rng.randint(1, 10)):
        memory = rng.choice(["8Gi", "16Gi", "0"])
        kind = rng.randrange(4)
        capacity: dict[str, Any]
        if kind == 0:
            made.append(gpu(i, memory=memory, numa=rng.choice([None, 0, 1])))
            continue
        if kind == 1:
            made.append(gpu(i, memory=memory, shared=True))
            continue
        if kind == 2:
            capacity = {"memory": cap(memory, **rng.choice(policies)), "cores": "100"}
        else:
            capacity = {"cores": rng.choice(["100", "0"])}
        made.append(device(f"dev-{i}", capacity=capacity, multi=rng.random() < 0.7))
    slices = [
        slice_("a", pool="p0", devices=made[::2]),
        slice_("b", pool="p1", devices=made[1::2]),
    ]
    candidates = list(snapshot(slices).candidates(to_node(node())).devices)
    rng.shuffle(candidates)  # (runs of one pool broken up)
    usages: dict[tuple[str, str], PoolUsage] = {}
    pending: dict[DeviceID, dict[str, int]] = {}
    for pool in ("p0", "p1"):
        names = [c.device_id.device for c in candidates if c.device_id.pool == pool]
        exclusive = frozenset(n for n in names if rng.random() < 0.2)
        shared = [n for n in names if n not in exclusive and rng.random() < 0.4]
        usages[(DRIVER, pool)] = PoolUsage(
            exclusive=exclusive,
            shares={n: rng.randint(1, 3) for n in shared},
            capacity={n: {"memory": rng.randint(0, 20) * GI, "cores": 10} for n in shared},
        )
    for cand in candidates:
        if rng.random() < 0.2:
            pending[cand.device_id] = rng.choice([{}, {"memory": GI}, {"cores": 5}])
    requests = rng.choice(
        [
            {},
            {"memory": "1Gi"},
            {"memory": "3Gi", "cores": "20"},
            {"memory": "64Gi"},
            {"cores": "0"},
            {"memory": "-1"},
            {"bandwidth": "1"},
        ]
    )
    ctx = _order_context(requests, _Allocated(usages), pending)  # type: ignore[arg-type]
    assert _candidate_scores(candidates, ctx) == _reference_scores(candidates, ctx)

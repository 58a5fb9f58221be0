"""The GPU axis on partitionable devices (dynamic MIG): which GPU and which placement.

Rules (``docs/scoring.md``, "Dynamic MIG"): a placement is scored by the utilisation of its
GPU's counter set after placement (binpack fills the GPU already most cut, spread the least);
within a GPU the placement that keeps the largest profiles placeable wins; a device whose
counters are taken (a whole GPU beside a partition) is tried last.
"""

from __future__ import annotations

from typing import Any

import pytest

from driver.api.claims import DeviceClass, ResourceClaim
from driver.api.nodes import Node
from driver.discovery.devices import DeviceTable
from driver.discovery.fake import FakeBackend
from driver.discovery.mig import DynamicMigPolicy
from driver.discovery.slices import build_slices
from driver.scheduling.decision import DecisionEngine, pod_uid
from driver.scheduling.outcome import Placement
from driver.scheduling.policy import GpuPolicy, PolicyDefaults
from driver.scheduling.scoring import free_counters, gpu_order, pool_counters
from driver.structured.allocator import OrderContext, allocate
from driver.structured.snapshot import AllocatedState, ClusterSnapshot
from tests.unit.builders import DRIVER, claim, device_class, node

NODE = "dyn-0"
MIG = device_class(
    "mig", selectors=[f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig"']
)
WHOLE = device_class(
    "gpu", selectors=[f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"']
)


def profile_is(name: str) -> list[str]:
    return [f'device.attributes["{DRIVER}"].profile == "{name}"']


class Gpus:
    """A dynamic-MIG node with ``count`` A100-80GB GPUs; claims placed with a GPU policy."""

    def __init__(self, count: int, policy: GpuPolicy, profile: str = "a100-80gbx8-dynmig") -> None:
        backend = FakeBackend.from_profile(profile, node_name=NODE)
        policy_ = DynamicMigPolicy(gpus=backend.dynamic_mig)
        table = DeviceTable.from_gpus(backend.discover()[:count], policy_)
        self.slices = build_slices(table, node_name=NODE)
        self.classes = [DeviceClass.from_api(c) for c in (MIG, WHOLE)]
        self.node = Node.from_api(node(NODE))
        self.policy = policy
        self.held: list[ResourceClaim] = []
        self.serial = 0

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot.build(self.slices, self.classes, self.held)

    def place(self, cls: str = "mig", profile: str | None = None, **kw: Any) -> str | None:
        self.serial += 1
        built = claim(f"c{self.serial}").request(
            "r0", cls=cls, selectors=profile_is(profile) if profile else [], **kw
        )
        got = allocate(self.snapshot(), [built.model()], self.node, order=gpu_order(self.policy))
        if got is None:
            return None
        self.held.append(ResourceClaim.from_api(built.allocated(got[0].to_api()).json()))
        return got[0].results[0].device

    def release(self, device: str) -> None:
        self.held = [
            c for c in self.held if c.allocation and c.allocation.results[0].device != device
        ]


# --------------------------------------------------------------------------- within one GPU


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_small_partitions_go_where_the_large_profiles_stay_placeable(policy: GpuPolicy) -> None:
    gpu = Gpus(1, policy)
    # The first 1g goes to slot 6: 4g (slots 0-3), 3g at 0 and every 2g stay possible.
    assert gpu.place(profile="1g.10gb") == "gpu-0-mig-1g10gb-6"
    placed = [gpu.place(profile="1g.10gb") for _ in range(2)]
    assert placed == ["gpu-0-mig-1g10gb-4", "gpu-0-mig-1g10gb-5"]
    assert gpu.place(profile="4g.40gb") == "gpu-0-mig-4g40gb-0"  # still room for it


def test_first_fit_cuts_from_slot_0_and_loses_the_4g() -> None:
    gpu = Gpus(1, "first-fit")
    assert [gpu.place(profile="1g.10gb") for _ in range(3)] == [
        f"gpu-0-mig-1g10gb-{s}" for s in range(3)
    ]
    assert gpu.place(profile="4g.40gb") is None


def test_a_2g_keeps_the_4g_free_too() -> None:
    gpu = Gpus(1, "binpack")
    assert gpu.place(profile="2g.20gb") == "gpu-0-mig-2g20gb-4"
    assert gpu.place(profile="4g.40gb") == "gpu-0-mig-4g40gb-0"


# --------------------------------------------------------------------------- across GPUs


def test_binpack_fills_the_gpu_already_cut_and_spread_prefers_uncut_ones() -> None:
    packed = Gpus(3, "binpack")
    spread = Gpus(3, "spread")
    assert [packed.place(profile="1g.10gb") for _ in range(3)] == [
        "gpu-0-mig-1g10gb-6",
        "gpu-0-mig-1g10gb-4",
        "gpu-0-mig-1g10gb-5",
    ]
    assert [spread.place(profile="1g.10gb") for _ in range(4)] == [
        "gpu-0-mig-1g10gb-6",
        "gpu-1-mig-1g10gb-6",
        "gpu-2-mig-1g10gb-6",
        "gpu-0-mig-1g10gb-4",
    ]


def test_a_cut_gpu_is_tried_last_for_a_whole_or_shared_claim() -> None:
    gpus = Gpus(2, "binpack")
    assert gpus.place(profile="1g.10gb") == "gpu-0-mig-1g10gb-6"
    snap = gpus.snapshot()
    candidates = [
        c for c in snap.candidates(gpus.node).devices if c.device.attributes["type"] == "gpu"
    ]
    ctx = OrderContext(
        node=gpus.node,
        claim=claim("x").request("r0", cls="gpu").model(),
        request="r0",
        count=1,
        capacity_requests={},
        admin_access=False,
        allocated=snap.allocated,
        pending={},
    )
    for policy in ("binpack", "spread"):
        order = gpu_order(policy)
        assert order is not None
        assert [c.device_id.device for c in order(candidates, ctx)] == ["gpu-1", "gpu-0"]
    assert gpus.place("gpu", capacity={"memory": "8Gi"}) == "gpu-1"


def test_free_counters_count_each_device_once_and_what_this_attempt_placed() -> None:
    gpus = Gpus(1, "binpack")
    assert gpus.place("gpu", capacity={"memory": "8Gi"}) == "gpu-0"
    assert gpus.place("gpu", capacity={"memory": "8Gi"}) == "gpu-0"  # a second share
    snap = gpus.snapshot()
    (pool,) = snap.candidates(gpus.node).pools
    usage = snap.allocated.pool(DRIVER, NODE)
    (left,) = free_counters(pool, usage)
    assert set(left) == {0}  # the whole GPU took every counter once, not twice
    (fresh,) = free_counters(pool, AllocatedState.empty().pool(DRIVER, NODE), frozenset())
    geometry = pool_counters(pool).geometries[0]
    assert fresh == geometry.totals
    (after,) = free_counters(
        pool, AllocatedState.empty().pool(DRIVER, NODE), frozenset({"gpu-0-mig-3g40gb-4"})
    )
    # Nano-units: four slots, three compute slices, two decoders.
    assert sum(fresh) - sum(after) == (4 + 3 + 2) * 10**9


def _pool(profile: str, node_name: str, count: int = 2) -> Any:
    backend = FakeBackend.from_profile(profile, node_name=node_name)
    table = DeviceTable.from_gpus(
        backend.discover()[:count], DynamicMigPolicy(gpus=backend.dynamic_mig)
    )
    snap = ClusterSnapshot.build(build_slices(table, node_name=node_name), [])
    (pool,) = snap.candidates(Node.from_api(node(node_name))).pools
    return pool


def test_pools_that_publish_the_same_counters_share_their_geometry() -> None:
    """Nodes of one model build their counter geometry once; a pool that differs in anything
    the geometry reads (another model, another GPU count) gets its own."""
    a, b = _pool("a100-80gbx8-dynmig", "dyn-a"), _pool("a100-80gbx8-dynmig", "dyn-b")
    assert a is not b
    assert pool_counters(a) is pool_counters(b)
    h100 = pool_counters(_pool("h100-80gbx8-dynmig", "dyn-c"))
    assert h100 != pool_counters(a)
    three = pool_counters(_pool("a100-80gbx8-dynmig", "dyn-d", count=3))
    assert len(three.geometries) == 3
    assert len(pool_counters(a).geometries) == 2


# --------------------------------------------------------------------------- a pinned sequence


def _engine(policy: GpuPolicy) -> DecisionEngine:
    gpus = Gpus(2, policy)
    snapshot = ClusterSnapshot.build(gpus.slices, gpus.classes)
    return DecisionEngine(
        snapshot, [gpus.node], defaults=PolicyDefaults(node="binpack", gpu=policy)
    )


def _pod(name: str, profile: str) -> tuple[dict[str, Any], list[ResourceClaim]]:
    built = claim(f"{name}-claim").request("r0", cls="mig", selectors=profile_is(profile))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "c", "image": "cuda"}],
            "resourceClaims": [{"name": "mig", "resourceClaimName": f"{name}-claim"}],
        },
    }
    return pod, [built.model()]


# Arrivals (+) and deletions (-) on a node with two dynamic A100-80GB GPUs.
SEQUENCE = (
    ("+", "a", "2g.20gb"),
    ("+", "b", "1g.20gb"),
    ("+", "c", "1g.10gb"),
    ("+", "d", "1g.10gb"),
    ("-", "d", ""),
    ("-", "c", ""),
    ("+", "e", "1g.10gb"),
    ("+", "f", "2g.20gb"),
)


def _replay(policy: GpuPolicy) -> tuple[DecisionEngine, dict[str, str]]:
    engine = _engine(policy)
    live: dict[str, tuple[Placement, dict[str, Any]]] = {}
    for op, name, profile in SEQUENCE:
        if op == "-":
            _, pod = live.pop(name)
            engine.forget(pod_uid(pod))  # deleted before the cluster showed it: gone
            continue
        pod, claims = _pod(name, profile)
        decision = engine.decide(pod, claims)
        assert isinstance(decision, Placement), decision
        engine.assume(decision, pod)
        live[name] = (decision, pod)
    devices = {name: p.claims[0][1].results[0].device for name, (p, _) in sorted(live.items())}
    return engine, devices


def _room_for_4g_and_3g(engine: DecisionEngine) -> bool:
    for name, profile in (("big4", "4g.40gb"), ("big3", "3g.40gb")):
        pod, claims = _pod(name, profile)
        decision = engine.decide(pod, claims)
        if not isinstance(decision, Placement):
            return False
        engine.assume(decision, pod)
    return True


def test_binpack_leaves_room_for_a_4g_and_a_3g_where_first_fit_does_not() -> None:
    packed, devices = _replay("binpack")
    assert devices == {
        "a": "gpu-0-mig-2g20gb-4",
        "b": "gpu-0-mig-1g20gb-6",
        "e": "gpu-0-mig-1g10gb-0",
        "f": "gpu-0-mig-2g20gb-2",
    }  # one GPU cut, the other whole
    assert _room_for_4g_and_3g(packed)
    naive, devices = _replay("first-fit")
    assert devices == {
        "a": "gpu-0-mig-2g20gb-0",
        "b": "gpu-0-mig-1g20gb-2",
        "e": "gpu-0-mig-1g10gb-4",
        "f": "gpu-1-mig-2g20gb-0",
    }  # both GPUs cut: no 4g anywhere
    assert not _room_for_4g_and_3g(naive)

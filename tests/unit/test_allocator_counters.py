"""Allocator conformance for partitionable devices (KEP-4815 shared counters), and its answers on
the slices a dynamic-MIG node publishes.

The first table ports upstream's cases from k8s.io/dynamic-resource-allocation
``structured/internal/allocatortesting/allocator_testing.go`` (commit 3d036712, the
``partitionable-devices-*`` entries, ``all-devices-with-consumed-counters`` and
``allow-multiple-allocations-with-partitionable-device``): same slices, claims and allocated
devices, same expected results, each case named after its upstream twin. Upstream's rules they
pin (``allocator_incubating.go``: ``checkAvailableCounters``, ``GatherPools``):

* a device that consumes counters fits only while, for every counter it names, what allocated
  devices of the pool consume plus what it consumes stays within the counter set's value;
* counter sets are per pool, across every slice of the pool (even on other nodes), and never
  shared between pools;
* a device consuming from a set or counter the pool does not define, or a set defined twice,
  makes the pool invalid ("invalid resource pools were encountered");
* a multi-allocation device consumes its counters once, with its first share.

The second table runs the allocator on the real slice builder's dynamic-MIG output (an
A100-80GB and an H100 node): MIG, whole-GPU and share use of one GPU exclude each other through
counters alone.
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
from driver.structured.allocator import allocate
from driver.structured.snapshot import ClusterSnapshot
from tests.unit.builders import DRIVER, JSON, cap, claim, device, device_class, node, slice_, sub
from tests.unit.test_allocator import INVALID_POOLS, Case, run_case

ANY = [device_class("any", selectors=["true"])]


def mem_at_least(gib: int) -> str:
    return f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{gib}Gi")) >= 0'


def part(name: str, memory: str, *, sets: dict[str, dict[str, str]] | None = None) -> JSON:
    """A device whose memory capacity equals what it consumes of ``set1`` (upstream's
    ``device(name, fromCounters, nil).withDeviceCounterConsumption(...)``)."""
    return device(name, capacity={"memory": memory}, consumes=sets or {"set1": {"memory": memory}})


CASES: list[Case] = [
    Case(
        "partitionable-devices-single-device",
        [
            slice_("s1", count=2, devices=[device("d1", consumes={"set1": {"memory": "4Gi"}})]),
            slice_("s2", count=2, shared_counters={"set1": {"memory": "8Gi"}}),
        ],
        [claim("c0").request("r0", cls="any")],
        [["r0:node-0/d1"]],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-prioritized-list",
        [
            slice_(
                "s1", count=2, devices=[part("d1", "4Gi"), part("d2", "6Gi"), part("d3", "4Gi")]
            ),
            slice_("s2", count=2, shared_counters={"set1": {"memory": "8Gi"}}),
        ],
        [
            claim("c0")
            .request("r0", cls="any")
            .first_available(
                "r1",
                sub("s0", cls="any", selectors=[mem_at_least(6)]),
                sub("s1", cls="any", selectors=[mem_at_least(4)]),
            )
        ],
        [["r0:node-0/d1", "r1/s1:node-0/d3"]],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-multiple-devices",
        [
            slice_(
                "s1", count=2, devices=[part("d1", "4Gi"), part("d2", "6Gi"), part("d3", "4Gi")]
            ),
            slice_("s2", count=2, shared_counters={"set1": {"memory": "8Gi"}}),
        ],
        [claim("c0").request("r0", cls="any").request("r1", cls="any")],
        [["r0:node-0/d1", "r1:node-0/d3"]],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-multiple-capacity-pools",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    part("d1", "4Gi", sets={"set1": {"memory": "4Gi"}, "set2": {"cpus": "4"}}),
                    part("d2", "6Gi", sets={"set1": {"memory": "6Gi"}, "set2": {"cpus": "6"}}),
                    part("d3", "4Gi", sets={"set1": {"memory": "4Gi"}, "set2": {"cpus": "4"}}),
                ],
            ),
            slice_(
                "s2",
                count=2,
                shared_counters={"set1": {"memory": "18Gi"}, "set2": {"cpus": "8"}},
            ),
        ],
        [
            claim("c0")
            .request("r0", cls="any")
            .first_available(
                "r1",
                sub("s0", cls="any", selectors=[mem_at_least(6)]),
                sub("s1", cls="any", selectors=[mem_at_least(4)]),
            )
        ],
        [["r0:node-0/d1", "r1/s1:node-0/d3"]],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-multiple-counters",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device(
                        "d1",
                        consumes={
                            "set1": {"memory": "4Gi", "cpus": "6"},
                            "set2": {"cpus": "4", "memory": "2Gi"},
                        },
                    ),
                    device(
                        "d2",
                        consumes={
                            "set1": {"memory": "6Gi", "cpus": "4"},
                            "set2": {"cpus": "6", "memory": "6Gi"},
                        },
                    ),
                    device(
                        "d3",
                        consumes={
                            "set1": {"memory": "4Gi", "cpus": "4"},
                            "set2": {"cpus": "4", "memory": "4Gi"},
                        },
                    ),
                ],
            ),
            slice_(
                "s2",
                count=2,
                shared_counters={
                    "set1": {"cpus": "8", "memory": "18Gi"},
                    "set2": {"cpus": "12", "memory": "18Gi"},
                },
            ),
        ],
        [claim("c0").request("r0", cls="any").request("r1", cls="any")],
        [["r0:node-0/d2", "r1:node-0/d3"]],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-multiple-pools",
        [
            slice_(
                "s1",
                pool="pool1",
                count=2,
                devices=[
                    device("d1", consumes={"set1": {"cpus": "6", "memory": "4Gi"}}),
                    device("d2", consumes={"set1": {"cpus": "4", "memory": "6Gi"}}),
                    device("d3", consumes={"set1": {"cpus": "4", "memory": "4Gi"}}),
                ],
            ),
            slice_(
                "s2",
                pool="pool1",
                count=2,
                shared_counters={"set1": {"cpus": "8", "memory": "18Gi"}},
            ),
            slice_(
                "s3",
                pool="pool2",
                count=2,
                devices=[
                    device("d1", consumes={"set1": {"cpus": "6", "memory": "4Gi"}}),
                    device("d2", consumes={"set1": {"cpus": "1", "memory": "7Gi"}}),
                    device("d3", consumes={"set1": {"cpus": "1", "memory": "7Gi"}}),
                ],
            ),
            slice_(
                "s4",
                pool="pool2",
                count=2,
                shared_counters={"set1": {"cpus": "8", "memory": "18Gi"}},
            ),
        ],
        [claim("c0").request("r0", cls="any").request("r1", cls="any")],
        [["r0:pool2/d2", "r1:pool2/d3"]],
        held=[
            claim("h1").holding("d2", "d3", pool="pool1"),
            claim("h2").holding("d1", pool="pool2"),
        ],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-unused-counters-in-counter-set",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device("d1", consumes={"set1": {"memory": "5Gi"}}),
                    device("d2", consumes={"set1": {"memory": "4Gi"}}),
                    device("d3", consumes={"set1": {"memory": "4Gi"}}),
                ],
            ),
            slice_("s2", count=2, shared_counters={"set1": {"memory": "8Gi", "unused": "1Gi"}}),
        ],
        [claim("c0").request("r0", cls="any", count=2)],
        [["r0:node-0/d2", "r0:node-0/d3"]],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-no-capacity-available",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device("d1", consumes={"set1": {"memory": "4Gi"}}),
                    device("d2", consumes={"set1": {"memory": "16Gi"}}),
                ],
            ),
            slice_("s2", count=2, shared_counters={"set1": {"memory": "18Gi"}}),
        ],
        [claim("c0").request("r0", cls="any")],
        None,
        held=[claim("h").holding("d2")],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-overallocated-capacity-pool",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device("d1", consumes={"set1": {"memory": "4Gi"}}),
                    device("d2", consumes={"set1": {"memory": "20Gi"}}),
                ],
            ),
            slice_("s2", count=2, shared_counters={"set1": {"memory": "18Gi"}}),
        ],
        [claim("c0").request("r0", cls="any")],
        None,  # what is left is negative: nothing fits, not an error
        held=[claim("h").holding("d2")],
        classes=ANY,
    ),
    Case(
        "all-devices-with-consumed-counters",
        [
            slice_("s1", count=2, devices=[device("d1", consumes={"set1": {"memory": "4Gi"}})]),
            slice_("s2", count=2, shared_counters={"set1": {"memory": "8Gi"}}),
        ],
        [claim("c0").request("r0", cls="any", mode="All")],
        [["r0:node-0/d1"]],
        classes=ANY,
    ),
    Case(
        "allow-multiple-allocations-with-partitionable-device",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device(
                        name,
                        capacity={"memory": cap(memory, default=memory)},
                        multi=True,
                        consumes={"set1": {"memory": memory}},
                    )
                    for name, memory in (("d1", "4Gi"), ("d2", "6Gi"), ("d3", "4Gi"))
                ],
            ),
            slice_("s2", count=2, shared_counters={"set1": {"memory": "8Gi"}}),
        ],
        [
            claim("c0")
            .request("r0", cls="any")
            .first_available(
                "r1",
                sub("s0", cls="any", selectors=[mem_at_least(6)]),
                sub("s1", cls="any", selectors=[mem_at_least(4)]),
            )
        ],
        [["r0:node-0/d1", "r1/s1:node-0/d3"]],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-same-counter-set-name-in-different-resource-slices",
        [
            slice_("s1", count=4, devices=[device("d1")]),
            slice_("s2", count=4, shared_counters={"set1": {"c": "1"}}),
            slice_("s3", count=4, devices=[device("d2")]),
            slice_("s4", count=4, shared_counters={"set1": {"c": "1"}}),
        ],
        [claim("c0").request("r0", cls="any")],
        INVALID_POOLS,
        classes=ANY,
    ),
    Case(
        "partitionable-devices-device-counter-consumption-references-unknown-counter-set",
        [
            slice_("s1", count=2, devices=[device("d1", consumes={"set2": {"c": "1"}})]),
            slice_("s2", count=2, shared_counters={"set1": {"c": "1"}}),
        ],
        [claim("c0").request("r0", cls="any")],
        INVALID_POOLS,
        classes=ANY,
    ),
    Case(
        "partitionable-devices-device-counter-consumption-references-unknown-counter-in-counter-set",
        [
            slice_("s1", count=2, devices=[device("d1", consumes={"set1": {"memory": "8Gi"}})]),
            slice_("s2", count=2, shared_counters={"set1": {"other-memory": "8Gi"}}),
        ],
        [claim("c0").request("r0", cls="any")],
        INVALID_POOLS,
        classes=ANY,
    ),
    Case(
        "partitionable-devices-device-counter-consumption-references-counter-set-in-other-pool",
        [
            slice_(
                "s1", pool="pool1", devices=[device("d1", consumes={"set1": {"memory": "8Gi"}})]
            ),
            slice_("s2", pool="pool2", shared_counters={"set1": {"memory": "8Gi"}}),
        ],
        [claim("c0").request("r0", cls="any")],
        INVALID_POOLS,
        classes=ANY,
    ),
    Case(
        "partitionable-devices-devices-on-different-nodes-consume-same-counter-set",
        [
            slice_("s1", pool="pool1", count=3, shared_counters={"set1": {"memory": "8Gi"}}),
            slice_("s2", pool="pool1", count=3, devices=[part("d1", "6Gi"), part("d2", "2Gi")]),
            slice_("s3", pool="pool1", node="node-1", count=3, devices=[part("d3", "6Gi")]),
        ],
        [
            claim("c0").first_available(
                "r0",
                sub("s0", cls="any", selectors=[mem_at_least(6)]),
                sub("s1", cls="any", selectors=[mem_at_least(2)]),
            )
        ],
        [["r0/s1:pool1/d2"]],
        held=[claim("h").holding("d3", pool="pool1")],
        classes=ANY,
    ),
    Case(
        "partitionable-devices-devices-consume-counter-set-in-different-nodes",
        [
            slice_("s1", pool="pool1", count=3, shared_counters={"set1": {"memory": "8Gi"}}),
            slice_("s2", pool="pool1", count=3, devices=[part("d1", "6Gi")]),
            slice_(
                "s3",
                pool="pool1",
                node="node-1",
                count=3,
                devices=[part("d2", "6Gi"), part("d3", "2Gi")],
            ),
        ],
        [claim("c0").request("r0", cls="any")],
        [["r0:pool1/d3"]],
        held=[claim("h").holding("d1", pool="pool1")],
        node=node("node-1"),
        classes=ANY,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_upstream_partitionable_device_case(case: Case) -> None:
    run_case(case)


# --------------------------------------------------------------------------- dynamic MIG slices

NODE = "dyn-0"
MIG_CLASS = device_class(
    "mig", selectors=[f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "mig"']
)
GPU_CLASS_JSON = device_class(
    "gpu", selectors=[f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"']
)


class DynamicNode:
    """One dynamic-MIG node's published pool, and claims allocated on it one by one."""

    def __init__(self, profile: str, gpus: int = 8) -> None:
        backend = FakeBackend.from_profile(profile, node_name=NODE)
        found = backend.discover()[:gpus]
        policy = DynamicMigPolicy(gpus=backend.dynamic_mig)
        self.slices = build_slices(DeviceTable.from_gpus(found, policy), node_name=NODE)
        self.classes = [DeviceClass.from_api(c) for c in (MIG_CLASS, GPU_CLASS_JSON)]
        self.node = Node.from_api(node(NODE))
        self.held: list[ResourceClaim] = []
        self.counter = 0

    def place(self, cls: str, *, selectors: list[str] | None = None, **kw: Any) -> list[str] | None:
        """Allocate one claim; on success keep it held and return its devices."""
        self.counter += 1
        built = claim(f"c{self.counter}").request("r0", cls=cls, selectors=selectors or [], **kw)
        model = ResourceClaim.from_api(built.json())
        snap = ClusterSnapshot.build(self.slices, self.classes, self.held)
        got = allocate(snap, [model], self.node)
        if got is None:
            return None
        raw = built.allocated(got[0].to_api()).json()
        self.held.append(ResourceClaim.from_api(raw))
        return [r.device for r in got[0].results]

    def release(self, device_name: str) -> None:
        self.held = [
            c
            for c in self.held
            if c.allocation is None or all(r.device != device_name for r in c.allocation.results)
        ]


def profile_is(name: str) -> list[str]:
    return [f'device.attributes["{DRIVER}"].profile == "{name}"']


@pytest.mark.parametrize("profile", ["a100-80gbx8-dynmig", "h100-80gbx8-dynmig"])
def test_seven_1g_partitions_fit_one_gpu_and_an_eighth_does_not(profile: str) -> None:
    gpu = DynamicNode(profile, gpus=1)
    placed = [gpu.place("mig", selectors=profile_is("1g.10gb")) for _ in range(7)]
    assert sorted(d for p in placed for d in p or ()) == [f"gpu-0-mig-1g10gb-{s}" for s in range(7)]
    assert gpu.place("mig", selectors=profile_is("1g.10gb")) is None
    assert gpu.place("mig", selectors=profile_is("1g.10gb+me")) is None  # no slice left either


@pytest.mark.parametrize("profile", ["a100-80gbx8-dynmig", "h100-80gbx8-dynmig"])
def test_a_7g_partition_needs_an_uncut_gpu(profile: str) -> None:
    gpus = DynamicNode(profile, gpus=2)
    assert gpus.place("mig", selectors=profile_is("1g.10gb")) == ["gpu-0-mig-1g10gb-0"]
    assert gpus.place("mig", selectors=profile_is("7g.80gb")) == ["gpu-1-mig-7g80gb-0"]
    assert gpus.place("mig", selectors=profile_is("7g.80gb")) is None
    gpus.release("gpu-0-mig-1g10gb-0")
    assert gpus.place("mig", selectors=profile_is("7g.80gb")) == ["gpu-0-mig-7g80gb-0"]


def test_whole_gpu_share_and_mig_use_exclude_each_other_through_counters() -> None:
    gpus = DynamicNode("a100-80gbx8-dynmig", gpus=2)
    assert gpus.place("mig", selectors=profile_is("3g.40gb")) == ["gpu-0-mig-3g40gb-0"]
    # A share and a whole GPU both go to the uncut GPU; after that, nothing is left whole.
    assert gpus.place("gpu", capacity={"memory": "10Gi"}) == ["gpu-1"]
    assert gpus.place("gpu", capacity={"memory": "10Gi"}) == ["gpu-1"]  # a second share
    assert gpus.place("gpu") is None  # whole: gpu-0 is cut, gpu-1 is shared
    # The shared GPU takes no partition while a share lives on it.
    assert gpus.place("mig", selectors=['device.attributes["gpu.biaxial.dev"].minor == 1']) is None
    assert gpus.place("mig", selectors=profile_is("4g.40gb")) is None  # 3g holds slots 0-3
    assert gpus.place("mig", selectors=profile_is("3g.40gb")) == ["gpu-0-mig-3g40gb-4"]


def test_only_one_plus_me_instance_per_gpu() -> None:
    gpu = DynamicNode("a100-80gbx8-dynmig", gpus=1)
    assert gpu.place("mig", selectors=profile_is("1g.10gb+me")) == ["gpu-0-mig-1g10gbme-0"]
    assert gpu.place("mig", selectors=profile_is("1g.10gb+me")) is None  # one JPEG/OFA engine
    assert gpu.place("mig", selectors=profile_is("1g.10gb")) == ["gpu-0-mig-1g10gb-1"]

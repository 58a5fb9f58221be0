"""Table-driven allocator cases written from upstream's structured-allocator semantics.

Each case builds a cluster from raw API JSON, allocates its claims on one node and compares
the result, compactly, as ``"request:pool/device"`` per claim (``None`` = does not fit, or
:class:`Fails` with part of the AllocationError message). Every case also checks that neither
the JSON inputs nor the model objects were mutated.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from driver.api.claims import AllocationResult, DeviceClass, ResourceClaim
from driver.api.errors import AllocationError, NodeAllocationError
from driver.api.model import ResourceSlice
from driver.api.nodes import Node
from driver.structured.allocator import SHARE_ID_NAMESPACE, SearchStats, allocate, make_share_id
from driver.structured.snapshot import ClusterSnapshot
from tests.unit.builders import (
    DRIVER,
    JSON,
    UUID_ATTR,
    ClaimBuilder,
    cap,
    claim,
    device,
    device_class,
    gpu,
    label_term,
    node,
    node_gpus,
    node_selector,
    slice_,
    sub,
    taint,
    toleration,
    ver,
)

NUMA = "resource.kubernetes.io/numaNode"
PRODUCT = f"{DRIVER}/productName"


@dataclass(frozen=True)
class Fails:
    """The allocation raises AllocationError (``error``: that subclass) containing ``message``."""

    message: str
    error: type[AllocationError] = AllocationError


# Upstream (allocator_incubating.go, allocatortesting "invalid-pool..." cases): when nothing
# could be allocated and a pool was invalid, Allocate returns "invalid resource pools were
# encountered" wrapped in ErrFailedAllocationOnNode -- an error for this node, not "no fit".
INVALID_POOLS = Fails("invalid resource pools were encountered", NodeAllocationError)


Expected = list[list[str]] | None | Fails


@dataclass
class Case:
    id: str
    slices: list[JSON]
    claims: list[ClaimBuilder]
    expect: Expected
    held: list[ClaimBuilder] = field(default_factory=list)
    classes: list[JSON] | None = None
    node: JSON = field(default_factory=lambda: node("node-0"))
    admin_namespaces: Sequence[str] | None = None
    check: Callable[[list[AllocationResult]], bool] | None = None
    stats: Callable[[SearchStats], bool] | None = None


def _compact(results: list[AllocationResult]) -> list[list[str]]:
    return [[f"{r.request}:{r.pool}/{r.device}" for r in a.results] for a in results]


def run_case(case: Case) -> None:
    slices_json = [copy.deepcopy(s) for s in case.slices]
    classes_json = copy.deepcopy(case.classes if case.classes is not None else [device_class()])
    claims_json = [c.json() for c in case.claims]
    held_json = [c.json() for c in case.held]
    node_json = copy.deepcopy(case.node)
    before = copy.deepcopy((slices_json, classes_json, claims_json, held_json, node_json))

    slices = [ResourceSlice.from_api(s) for s in slices_json]
    classes = [DeviceClass.from_api(c) for c in classes_json]
    claims = [ResourceClaim.from_api(c) for c in claims_json]
    held = [ResourceClaim.from_api(c) for c in held_json]
    the_node = Node.from_api(node_json)
    models_before = copy.deepcopy((slices, classes, claims, held, the_node))

    snap = ClusterSnapshot.build(slices, classes, held)
    state_before = snap.allocated
    stats = SearchStats()
    if isinstance(case.expect, Fails):
        with pytest.raises(case.expect.error, match=case.expect.message):
            allocate(snap, claims, the_node, stats=stats, admin_namespaces=case.admin_namespaces)
    else:
        got = allocate(snap, claims, the_node, stats=stats, admin_namespaces=case.admin_namespaces)
        if case.expect is None:
            assert got is None
        else:
            assert got is not None
            assert _compact(got) == case.expect
            assert len(got) == len(claims)
            if case.check is not None:
                assert case.check(got), _api(got)
            # Same input, same output.
            again = allocate(snap, claims, the_node, admin_namespaces=case.admin_namespaces)
            assert again == got
    if case.stats is not None:
        assert case.stats(stats), stats
    assert (slices_json, classes_json, claims_json, held_json, node_json) == before
    assert (slices, classes, claims, held, the_node) == models_before
    assert snap.allocated is state_before


def gpus(n: int, **kwargs: Any) -> list[JSON]:
    return [node_gpus("node-0", n, **kwargs)]


def one(name: str = "c0", **kwargs: Any) -> ClaimBuilder:
    return claim(name).request("r0", **kwargs)


def _api(results: list[AllocationResult]) -> list[JSON]:
    return [r.to_api() for r in results]


def _expect_api(expected: list[JSON]) -> Callable[[list[AllocationResult]], bool]:
    def check(results: list[AllocationResult]) -> bool:
        return _api(results) == expected

    return check


LOCAL = {
    "nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}
    ]
}


def _consumed(results: list[AllocationResult], name: str) -> str:
    consumed = results[0].results[0].consumed_capacity
    assert consumed is not None
    return str(consumed[name])


def _shared_checks(results: list[AllocationResult]) -> bool:
    return all(
        r.share_id is not None and r.consumed_capacity is not None
        for a in results
        for r in a.results
    )


# --------------------------------------------------------------------------- the table

CASES: list[Case] = [
    # ----------------------------------------------------------------- basics
    Case("one-device", gpus(2), [one()], [["r0:node-0/gpu-0"]]),
    Case("count-two", gpus(4), [one(count=2)], [["r0:node-0/gpu-0", "r0:node-0/gpu-1"]]),
    Case("count-too-large", gpus(2), [one(count=3)], None),
    Case(
        "two-claims-in-order",
        gpus(2),
        [one("c0"), one("c1")],
        [["r0:node-0/gpu-0"], ["r0:node-0/gpu-1"]],
    ),
    Case("two-claims-too-many", gpus(1), [one("c0"), one("c1")], None),
    Case(
        "two-requests",
        gpus(3),
        [claim("c0").request("a").request("b", count=2)],
        [["a:node-0/gpu-0", "b:node-0/gpu-1", "b:node-0/gpu-2"]],
    ),
    Case("no-devices-on-node", [], [one()], None),
    Case(
        "other-nodes-slices-invisible",
        [node_gpus("node-1", 4)],
        [one()],
        None,
    ),
    Case(
        "full-result-node-local",
        gpus(1),
        [one()],
        [["r0:node-0/gpu-0"]],
        check=_expect_api(
            [
                {
                    "devices": {
                        "results": [
                            {"request": "r0", "driver": DRIVER, "pool": "node-0", "device": "gpu-0"}
                        ]
                    },
                    "nodeSelector": LOCAL,
                }
            ]
        ),
    ),
    # ----------------------------------------------------------------- in use
    Case(
        "held-exclusive-skipped",
        gpus(2),
        [one()],
        [["r0:node-0/gpu-1"]],
        held=[claim("h").holding("gpu-0")],
    ),
    Case("all-held", gpus(2), [one()], None, held=[claim("h").holding("gpu-0", "gpu-1")]),
    Case(
        "held-in-other-pool-irrelevant",
        gpus(1),
        [one()],
        [["r0:node-0/gpu-0"]],
        held=[claim("h").holding("gpu-0", pool="node-9")],
    ),
    Case(
        "held-admin-access-does-not-block",
        gpus(1),
        [one()],
        [["r0:node-0/gpu-0"]],
        held=[
            claim("h").allocated(
                {
                    "devices": {
                        "results": [
                            {
                                "request": "r0",
                                "driver": DRIVER,
                                "pool": "node-0",
                                "device": "gpu-0",
                                "adminAccess": True,
                            }
                        ]
                    }
                }
            )
        ],
    ),
    # ----------------------------------------------------------------- selectors
    Case(
        "request-selector",
        gpus(4),
        [one(selectors=[f'device.attributes["{DRIVER}"].index == 3'])],
        [["r0:node-0/gpu-3"]],
    ),
    Case(
        "class-selector",
        [
            slice_(
                "s",
                devices=[gpu(0), gpu(1, product="NVIDIA A10G"), gpu(2, product="NVIDIA A10G")],
            )
        ],
        [one(cls="a10g", count=2)],
        [["r0:node-0/gpu-1", "r0:node-0/gpu-2"]],
        classes=[
            device_class(
                "a10g",
                selectors=[
                    f'device.driver == "{DRIVER}"',
                    f'device.attributes["{DRIVER}"].productName == "NVIDIA A10G"',
                ],
            )
        ],
    ),
    Case(
        "class-and-request-selectors-both-hold",
        [slice_("s", devices=[gpu(0), gpu(1, product="NVIDIA A10G"), gpu(2, product="A10G")])],
        [one(cls="a10g", selectors=[f'device.attributes["{DRIVER}"].index > 1'])],
        [["r0:node-0/gpu-2"]],
        classes=[
            device_class(
                "a10g", selectors=[f'device.attributes["{DRIVER}"].productName.contains("A10G")']
            )
        ],
    ),
    Case(
        "selector-on-capacity",
        [slice_("s", devices=[gpu(0, memory="15Gi"), gpu(1, memory="24Gi")])],
        [one(selectors=[f'device.capacity["{DRIVER}"].memory.compareTo(quantity("20Gi")) >= 0'])],
        [["r0:node-0/gpu-1"]],
    ),
    # allocatortesting "unknown-class": "could not retrieve device class unknown-class".
    Case(
        "unknown-class",
        gpus(1),
        [one(cls="nope")],
        Fails('could not retrieve device class nope: deviceclass.resource.k8s.io "nope" not found'),
    ),
    Case(
        "cel-runtime-error-is-fatal",
        gpus(2),
        [one(selectors=[f'device.attributes["{DRIVER}"].nosuchattribute == 1'])],
        Fails("CEL runtime error"),
    ),
    Case(
        "cel-compile-error-is-fatal",
        gpus(1),
        [one(selectors=["device.driver =="])],
        Fails("CEL compile error"),
    ),
    Case(
        "class-cel-compile-error-names-class",
        gpus(1),
        [one(cls="broken")],
        Fails("class broken: selector #0"),
        classes=[device_class("broken", selectors=["device.driver + 1"])],
    ),
    Case(
        "cel-error-not-reached-on-held-device",
        gpus(2, extra=None),
        [one(selectors=[f'device.attributes["{DRIVER}"].index == 1'])],
        [["r0:node-0/gpu-1"]],
        held=[claim("h").holding("gpu-0")],
    ),
    # ----------------------------------------------------------------- All mode
    Case(
        "all-mode",
        gpus(3),
        [one(mode="All")],
        [["r0:node-0/gpu-0", "r0:node-0/gpu-1", "r0:node-0/gpu-2"]],
    ),
    Case(
        "all-mode-with-selector",
        gpus(4),
        [one(mode="All", selectors=[f'device.attributes["{DRIVER}"].index % 2 == 1'])],
        [["r0:node-0/gpu-1", "r0:node-0/gpu-3"]],
    ),
    Case(
        "all-mode-one-held-fails",
        gpus(2),
        [one(mode="All")],
        None,
        held=[claim("h").holding("gpu-1")],
    ),
    Case(
        "all-mode-admin-ignores-held",
        gpus(2),
        [one(mode="All", admin=True)],
        [["r0:node-0/gpu-0", "r0:node-0/gpu-1"]],
        held=[claim("h").holding("gpu-1")],
        check=lambda rs: [r.admin_access for r in rs[0].results] == [True, True],
    ),
    Case(
        "all-mode-no-matching-device",
        gpus(2),
        [one(mode="All", selectors=['device.driver == "other"'])],
        None,
    ),
    Case(
        "all-mode-incomplete-pool-is-fatal",
        [slice_("s0", devices=[gpu(0)], count=2)],
        [one(mode="All")],
        Fails("is currently being updated"),
    ),
    Case(
        "all-mode-invalid-pool-is-fatal",
        [slice_("s0", devices=[gpu(0)], count=2), slice_("s1", devices=[gpu(0)], count=2)],
        [one(mode="All")],
        Fails("is currently invalid"),
    ),
    Case(
        "all-mode-plus-exact-in-same-claim",
        gpus(3),
        [
            claim("c0")
            .request("a", selectors=[f'device.attributes["{DRIVER}"].index == 0'])
            .request("b", mode="All", selectors=[f'device.attributes["{DRIVER}"].index > 0'])
        ],
        [["a:node-0/gpu-0", "b:node-0/gpu-1", "b:node-0/gpu-2"]],
    ),
    # ----------------------------------------------------------------- pools, slices, order
    Case(
        "incomplete-pool-skipped-for-exact-count",
        [
            slice_("a-0", pool="a", devices=[gpu(0)], count=2),
            slice_("b-0", pool="b", devices=[gpu(0)]),
        ],
        [one()],
        [["r0:b/gpu-0"]],
        stats=lambda s: s.incomplete_pools == [] and s.steps == 4,
    ),
    Case(
        "invalid-pool-skipped-and-reported",
        [
            slice_("a-0", pool="a", devices=[gpu(0), gpu(0)]),
        ],
        [one()],
        INVALID_POOLS,
        stats=lambda s: s.invalid_pools == [f"{DRIVER}/a"],
    ),
    Case(
        "highest-generation-only",
        [
            slice_("old", devices=[gpu(0), gpu(1), gpu(2)], generation=1),
            slice_("new", devices=[gpu(5), gpu(6)], generation=2),
        ],
        [one(count=2)],
        [["r0:node-0/gpu-5", "r0:node-0/gpu-6"]],
    ),
    Case(
        "highest-generation-only-not-enough",
        [
            slice_("old", devices=[gpu(0), gpu(1), gpu(2)], generation=1),
            slice_("new", devices=[gpu(5), gpu(6)], generation=2),
        ],
        [one(count=3)],
        None,
    ),
    # Upstream looks beyond the node's own slices only when they do not add up: a complete
    # set of node-local slices is used even if a newer generation exists on another node
    # (upstream's "multi-host-resource-pool-complete-update-from-node-1-to-node-2").
    Case(
        "node-complete-pool-ignores-newer-generation-elsewhere",
        [
            slice_("here", pool="p", devices=[gpu(0)], generation=1),
            slice_("there", pool="p", node="node-1", devices=[gpu(1)], generation=2),
        ],
        [one()],
        [["r0:p/gpu-0"]],
    ),
    Case(
        "obsolete-pool-stale-slice-for-this-node",
        [
            slice_("here", pool="p", devices=[gpu(0)], generation=1, count=2),
            slice_("there", pool="p", node="node-1", devices=[gpu(1)], generation=2, count=2),
        ],
        [one()],
        None,
    ),
    Case(
        "multi-host-pool-complete-across-nodes",
        [
            slice_("a", pool="p", devices=[gpu(0)], count=2),
            slice_("b", pool="p", node="node-1", devices=[gpu(1)], count=2),
        ],
        [one(mode="All")],
        [["r0:p/gpu-0"]],
    ),
    Case(
        "multi-host-pool-incomplete-across-nodes",
        [
            slice_("a", pool="p", devices=[gpu(0)], count=3),
            slice_("b", pool="p", node="node-1", devices=[gpu(1)], count=3),
        ],
        [one()],
        None,
        stats=lambda s: s.incomplete_pools == [f"{DRIVER}/p"],
    ),
    Case(
        "pools-sorted-by-name",
        [slice_("s1", pool="b", devices=[gpu(0)]), slice_("s2", pool="a", devices=[gpu(0)])],
        [one()],
        [["r0:a/gpu-0"]],
    ),
    Case(
        "pools-sorted-by-driver-first",
        [
            slice_("s1", pool="a", devices=[gpu(0)]),
            slice_("s2", pool="z", driver="a.example.com", devices=[gpu(0)]),
        ],
        [one(cls="any")],
        [["r0:z/gpu-0"]],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "slices-sorted-by-name-devices-in-order",
        [
            slice_("s-b", devices=[gpu(0)], count=2),
            slice_("s-a", devices=[gpu(7), gpu(3)], count=2),
        ],
        [one(count=3)],
        [["r0:node-0/gpu-7", "r0:node-0/gpu-3", "r0:node-0/gpu-0"]],
    ),
    Case(
        "binding-conditions-pool-last",
        [
            slice_("s1", pool="a", devices=[gpu(0, binding_conditions=["Attached"])]),
            slice_("s2", pool="b", devices=[gpu(0)]),
        ],
        [one(count=2)],
        [["r0:b/gpu-0", "r0:a/gpu-0"]],
        check=lambda rs: rs[0].results[1].binding_conditions == ("Attached",),
    ),
    Case(
        "all-nodes-slice-has-no-node-selector",
        [slice_("net", all_nodes=True, node=None, devices=[gpu(0)])],
        [one()],
        [["r0:net/gpu-0"]],
        check=lambda rs: rs[0].node_selector is None,
    ),
    Case(
        "node-selector-slice-matches",
        [
            slice_(
                "rack",
                node=None,
                node_selector=node_selector(label_term("rack", values=["r1"])),
                devices=[gpu(0)],
            )
        ],
        [one()],
        [["r0:rack/gpu-0"]],
        node=node("node-0", labels={"rack": "r1"}),
        check=_expect_api(
            [
                {
                    "devices": {
                        "results": [
                            {"request": "r0", "driver": DRIVER, "pool": "rack", "device": "gpu-0"}
                        ]
                    },
                    "nodeSelector": node_selector(label_term("rack", values=["r1"])),
                }
            ]
        ),
    ),
    Case(
        "node-selector-slice-does-not-match",
        [
            slice_(
                "rack",
                node=None,
                node_selector=node_selector(label_term("rack", values=["r1"])),
                devices=[gpu(0)],
            )
        ],
        [one()],
        None,
        node=node("node-0", labels={"rack": "r2"}),
    ),
    Case(
        "two-cluster-wide-selectors-combined",
        [
            slice_(
                "a",
                node=None,
                node_selector=node_selector(label_term("rack", values=["r1"])),
                devices=[gpu(0)],
            ),
            slice_(
                "b",
                node=None,
                node_selector=node_selector(label_term("zone", "Exists")),
                devices=[gpu(0)],
            ),
        ],
        [one(count=2)],
        [["r0:a/gpu-0", "r0:b/gpu-0"]],
        node=node("node-0", labels={"rack": "r1", "zone": "z"}),
        check=lambda rs: (
            rs[0].node_selector
            == {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "rack", "operator": "In", "values": ["r1"]},
                            {"key": "zone", "operator": "Exists"},
                        ]
                    }
                ]
            }
        ),
    ),
    Case(
        "node-local-wins-over-cluster-wide",
        [slice_("net", all_nodes=True, node=None, devices=[gpu(0)]), *gpus(1)],
        [one(count=2)],
        [["r0:net/gpu-0", "r0:node-0/gpu-0"]],
        check=lambda rs: rs[0].node_selector == LOCAL,
    ),
    Case(
        "per-device-node-selection",
        [
            slice_(
                "pd",
                node=None,
                per_device=True,
                devices=[
                    gpu(0, node_name="node-1"),
                    gpu(1, node_name="node-0"),
                    gpu(2, all_nodes=True),
                ],
            )
        ],
        [one(count=2)],
        [["r0:pd/gpu-1", "r0:pd/gpu-2"]],
        check=lambda rs: rs[0].node_selector == LOCAL,
    ),
    Case(
        "per-device-all-nodes-no-selector",
        [slice_("pd", node=None, per_device=True, devices=[gpu(0, all_nodes=True)])],
        [one()],
        [["r0:pd/gpu-0"]],
        check=lambda rs: rs[0].node_selector is None,
    ),
    Case(
        "binds-to-node-pins-selector",
        [slice_("net", all_nodes=True, node=None, devices=[gpu(0, binds_to_node=True)])],
        [one()],
        [["r0:net/gpu-0"]],
        check=lambda rs: rs[0].node_selector == LOCAL,
    ),
    # ----------------------------------------------------------------- firstAvailable
    Case(
        "first-available-first-fits",
        gpus(4),
        [claim("c0").first_available("r0", sub("big", count=2), sub("small", count=1))],
        [["r0/big:node-0/gpu-0", "r0/big:node-0/gpu-1"]],
    ),
    Case(
        "first-available-falls-back",
        gpus(1),
        [claim("c0").first_available("r0", sub("big", count=2), sub("small", count=1))],
        [["r0/small:node-0/gpu-0"]],
    ),
    Case(
        "first-available-none-fits",
        gpus(1),
        [claim("c0").first_available("r0", sub("a", count=2), sub("b", count=3))],
        None,
    ),
    Case(
        "first-available-needs-complete-solution",
        gpus(3),
        [
            claim("c0")
            .first_available("r0", sub("two", count=2), sub("one", count=1))
            .request("r1", count=2)
        ],
        [["r0/one:node-0/gpu-0", "r1:node-0/gpu-1", "r1:node-0/gpu-2"]],
    ),
    Case(
        "first-available-later-claim-forces-fallback",
        gpus(2),
        [
            claim("c0").first_available("r0", sub("two", count=2), sub("one", count=1)),
            one("c1"),
        ],
        [["r0/one:node-0/gpu-0"], ["r0:node-0/gpu-1"]],
    ),
    Case(
        "first-available-max-size-jumps-to-cheaper",
        gpus(8),
        [claim("c0").first_available("r0", sub("huge", count=33), sub("one", count=1))],
        [["r0/one:node-0/gpu-0"]],
    ),
    Case(
        "claim-limit-32-is-fatal",
        gpus(2),
        [one(count=33)],
        Fails("exceeds the claim limit of 32"),
    ),
    # ----------------------------------------------------------------- constraints
    Case(
        "match-attribute",
        [slice_("s", devices=[gpu(i, numa=i % 2) for i in range(6)])],
        [one(count=3).constraint(match=NUMA)],
        [["r0:node-0/gpu-0", "r0:node-0/gpu-2", "r0:node-0/gpu-4"]],
    ),
    Case(
        "match-attribute-unsatisfiable",
        [slice_("s", devices=[gpu(i, numa=i % 2) for i in range(4)])],
        [one(count=3).constraint(match=NUMA)],
        None,
    ),
    Case(
        "match-attribute-backtracks-over-held",
        [slice_("s", devices=[gpu(i, numa=0 if i < 2 else 1) for i in range(4)])],
        [one(count=2).constraint(match=NUMA)],
        [["r0:node-0/gpu-2", "r0:node-0/gpu-3"]],
        held=[claim("h").holding("gpu-1")],
    ),
    Case(
        "match-attribute-driver-domain-fallback",
        [slice_("s", devices=[gpu(0), gpu(1, product="A10G"), gpu(2, product="A10G")])],
        [
            claim("c0")
            .request("a", selectors=['device.attributes["gpu.biaxial.dev"].index == 1'])
            .request("b")
            .constraint(match=PRODUCT)
        ],
        [["a:node-0/gpu-1", "b:node-0/gpu-2"]],
    ),
    Case(
        "match-attribute-other-domain-no-fallback",
        gpus(2),
        [one(count=2).constraint(match="other.example.com/productName")],
        None,
    ),
    Case(
        "match-attribute-missing-on-device-skips-it",
        [slice_("s", devices=[device("plain"), gpu(1, numa=0), gpu(2, numa=0)])],
        [one(count=2).constraint(match=NUMA)],
        [["r0:node-0/gpu-1", "r0:node-0/gpu-2"]],
    ),
    Case(
        "match-attribute-limited-to-requests",
        [slice_("s", devices=[gpu(i, numa=i % 2) for i in range(4)])],
        [
            claim("c0")
            .request("a")
            .request("b")
            .request("c")
            .constraint(match=NUMA, requests=["a", "c"])
        ],
        [["a:node-0/gpu-0", "b:node-0/gpu-1", "c:node-0/gpu-2"]],
    ),
    Case(
        "match-attribute-on-subrequest-name",
        [slice_("s", devices=[gpu(i, numa=i % 2) for i in range(4)])],
        [
            claim("c0")
            .request("a")
            .first_available("b", sub("x"))
            .constraint(match=NUMA, requests=["a", "b/x"])
        ],
        [["a:node-0/gpu-0", "b/x:node-0/gpu-2"]],
    ),
    Case(
        "match-attribute-version",
        [
            slice_(
                "s",
                devices=[
                    gpu(0, extra={"driverVersion": ver("550.1.0")}),
                    gpu(1, extra={"driverVersion": ver("560.2.0")}),
                    gpu(2, extra={"driverVersion": ver("560.2.0")}),
                ],
            )
        ],
        [one(count=2).constraint(match=f"{DRIVER}/driverVersion")],
        [["r0:node-0/gpu-1", "r0:node-0/gpu-2"]],
    ),
    Case(
        "match-attribute-list-intersection",
        [
            slice_(
                "s",
                devices=[
                    gpu(0, extra={"links": ["a", "b"]}),
                    gpu(1, extra={"links": ["c"]}),
                    gpu(2, extra={"links": ["b", "c"]}),
                ],
            )
        ],
        [one(count=2).constraint(match=f"{DRIVER}/links")],
        [["r0:node-0/gpu-0", "r0:node-0/gpu-2"]],
    ),
    Case(
        "match-attribute-bool-is-not-int",
        [
            slice_(
                "s",
                devices=[gpu(0, extra={"flag": True}), gpu(1, extra={"flag": 1})],
            )
        ],
        [one(count=2).constraint(match=f"{DRIVER}/flag")],
        None,
    ),
    Case(
        "distinct-attribute",
        [slice_("s", devices=[gpu(i, numa=i // 2) for i in range(4)])],
        [one(count=2).constraint(distinct=NUMA)],
        [["r0:node-0/gpu-0", "r0:node-0/gpu-2"]],
    ),
    Case(
        "shared-device-reused-across-requests",
        gpus(2, shared=True),
        [
            claim("c0")
            .request("a", capacity={"memory": "1Gi"})
            .request("b", capacity={"memory": "1Gi"})
        ],
        [["a:node-0/gpu-0", "b:node-0/gpu-0"]],
        check=_shared_checks,
    ),
    Case(
        "distinct-attribute-keeps-shared-requests-apart",
        gpus(2, shared=True),
        [
            claim("c0")
            .request("a", capacity={"memory": "1Gi"})
            .request("b", capacity={"memory": "1Gi"})
            .constraint(distinct=UUID_ATTR)
        ],
        [["a:node-0/gpu-0", "b:node-0/gpu-1"]],
    ),
    # ----------------------------------------------------------------- consumable capacity
    Case(
        "consumable-fraction-full-result",
        gpus(1, shared=True),
        [one(capacity={"memory": "4Gi"})],
        [["r0:node-0/gpu-0"]],
        check=lambda rs: (
            rs[0].to_api()["devices"]["results"][0]["consumedCapacity"]
            == {"cores": "0", "memory": "4Gi"}
        ),
    ),
    Case(
        "consumable-default-takes-whole-gpu",
        gpus(2, shared=True),
        [one("c0"), one("c1", capacity={"memory": "1Gi"})],
        [["r0:node-0/gpu-0"], ["r0:node-0/gpu-1"]],
        check=lambda rs: (
            rs[0].results[0].consumed_capacity is not None
            and str(rs[0].results[0].consumed_capacity["memory"]) == "16Gi"
        ),
    ),
    Case(
        "consumable-two-claims-share",
        gpus(2, shared=True),
        [one("c0", capacity={"memory": "8Gi"}), one("c1", capacity={"memory": "8Gi"})],
        [["r0:node-0/gpu-0"], ["r0:node-0/gpu-0"]],
        check=lambda rs: rs[0].results[0].share_id != rs[1].results[0].share_id,
    ),
    Case(
        "consumable-held-share-counts",
        gpus(2, shared=True),
        [one(capacity={"memory": "8Gi"})],
        [["r0:node-0/gpu-1"]],
        held=[
            claim("h").allocated(
                {
                    "devices": {
                        "results": [
                            {
                                "request": "r0",
                                "driver": DRIVER,
                                "pool": "node-0",
                                "device": "gpu-0",
                                "shareID": "11111111-1111-1111-1111-111111111111",
                                "consumedCapacity": {"memory": "12Gi", "cores": "0"},
                            }
                        ]
                    }
                }
            )
        ],
    ),
    Case(
        "consumable-cores-exhausted",
        gpus(1, shared=True),
        [
            one("c0", capacity={"memory": "1Gi", "cores": "60"}),
            one("c1", capacity={"memory": "1Gi", "cores": "50"}),
        ],
        None,
    ),
    Case(
        "consumable-range-step-rounds-up",
        [
            slice_(
                "s",
                devices=[
                    device(
                        "d",
                        multi=True,
                        capacity={"memory": cap("16Gi", default="1Gi", min="1Gi", step="1Gi")},
                    )
                ],
            )
        ],
        [one(cls="any", capacity={"memory": "1500Mi"})],
        [["r0:node-0/d"]],
        classes=[device_class("any", selectors=["true"])],
        check=lambda rs: _consumed(rs, "memory") == "2Gi",
    ),
    Case(
        "consumable-below-min-becomes-min",
        [
            slice_(
                "s",
                devices=[
                    device(
                        "d", multi=True, capacity={"memory": cap("16Gi", default="2Gi", min="2Gi")}
                    )
                ],
            )
        ],
        [one(cls="any", capacity={"memory": "1Mi"})],
        [["r0:node-0/d"]],
        classes=[device_class("any", selectors=["true"])],
        check=lambda rs: _consumed(rs, "memory") == "2Gi",
    ),
    Case(
        "consumable-above-max-rejected",
        [
            slice_(
                "s",
                devices=[
                    device(
                        "d",
                        multi=True,
                        capacity={"memory": cap("16Gi", default="1Gi", min="1Gi", max="8Gi")},
                    )
                ],
            )
        ],
        [one(cls="any", capacity={"memory": "9Gi"})],
        None,
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "consumable-valid-values-round-up",
        [
            slice_(
                "s",
                devices=[
                    device(
                        "d",
                        multi=True,
                        capacity={
                            "memory": cap("16Gi", default="4Gi", values=["4Gi", "8Gi", "16Gi"])
                        },
                    )
                ],
            )
        ],
        [one(cls="any", capacity={"memory": "5Gi"})],
        [["r0:node-0/d"]],
        classes=[device_class("any", selectors=["true"])],
        check=lambda rs: _consumed(rs, "memory") == "8Gi",
    ),
    Case(
        "consumable-valid-values-above-largest-rejected",
        [
            slice_(
                "s",
                devices=[
                    device(
                        "d",
                        multi=True,
                        capacity={"memory": cap("32Gi", default="4Gi", values=["4Gi", "8Gi"])},
                    )
                ],
            )
        ],
        [one(cls="any", capacity={"memory": "9Gi"})],
        None,
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "capacity-named-but-absent-skips-device",
        [slice_("s", devices=[device("nocap"), gpu(1, shared=True)])],
        [one(cls="any", capacity={"memory": "1Gi"})],
        [["r0:node-0/gpu-1"]],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "capacity-on-exclusive-device-filters",
        [slice_("s", devices=[gpu(0, memory="8Gi"), gpu(1, memory="24Gi")])],
        [one(capacity={"memory": "10Gi"})],
        [["r0:node-0/gpu-1"]],
        check=lambda rs: (
            rs[0].results[0].consumed_capacity is None and rs[0].results[0].share_id is None
        ),
    ),
    Case(
        "capacity-on-exclusive-device-too-big",
        gpus(2),
        [one(capacity={"memory": "17Gi"})],
        None,
    ),
    Case(
        "multi-without-policy-omitted-request-takes-all",
        [slice_("s", devices=[device("d", multi=True, capacity={"slots": "4"})])],
        [one("c0", cls="any"), one("c1", cls="any", capacity={"slots": "1"})],
        None,
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "multi-without-policy-explicit-requests-share",
        [slice_("s", devices=[device("d", multi=True, capacity={"slots": "4"})])],
        [
            one("c0", cls="any", capacity={"slots": "3"}),
            one("c1", cls="any", capacity={"slots": "1"}),
        ],
        [["r0:node-0/d"], ["r0:node-0/d"]],
        classes=[device_class("any", selectors=["true"])],
    ),
    # ----------------------------------------------------------------- counters
    Case(
        "counters-partitions-exhaust-parent",
        [
            slice_("a-counters", shared_counters={"gpu-0": {"memory": "40Gi"}}, count=2),
            slice_(
                "b-devices",
                count=2,
                devices=[
                    device("gpu-0", consumes={"gpu-0": {"memory": "40Gi"}}),
                    device("gpu-0-mig-a", consumes={"gpu-0": {"memory": "20Gi"}}),
                    device("gpu-0-mig-b", consumes={"gpu-0": {"memory": "20Gi"}}),
                ],
            ),
        ],
        [one("c0", cls="any", selectors=['device.driver == "gpu.biaxial.dev"'])],
        [["r0:node-0/gpu-0"]],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "counters-block-whole-after-partition",
        [
            slice_("a-counters", shared_counters={"gpu-0": {"memory": "40Gi"}}, count=2),
            slice_(
                "b-devices",
                count=2,
                devices=[
                    device("gpu-0", consumes={"gpu-0": {"memory": "40Gi"}}),
                    device("gpu-0-mig-a", consumes={"gpu-0": {"memory": "20Gi"}}),
                    device("gpu-0-mig-b", consumes={"gpu-0": {"memory": "20Gi"}}),
                ],
            ),
        ],
        [one("c0", cls="any", count=2)],
        [["r0:node-0/gpu-0-mig-a", "r0:node-0/gpu-0-mig-b"]],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "counters-consumed-by-held-claims",
        [
            slice_("a-counters", shared_counters={"gpu-0": {"memory": "40Gi"}}, count=2),
            slice_(
                "b-devices",
                count=2,
                devices=[
                    device("gpu-0", consumes={"gpu-0": {"memory": "40Gi"}}),
                    device("gpu-0-mig-a", consumes={"gpu-0": {"memory": "20Gi"}}),
                    device("gpu-0-mig-b", consumes={"gpu-0": {"memory": "20Gi"}}),
                ],
            ),
        ],
        [one("c0", cls="any", count=1)],
        [["r0:node-0/gpu-0-mig-b"]],
        held=[claim("h").holding("gpu-0-mig-a")],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "counters-unknown-set-makes-pool-invalid",
        [slice_("s", devices=[device("d", consumes={"missing": {"memory": "1"}})])],
        [one(cls="any")],
        INVALID_POOLS,
        classes=[device_class("any", selectors=["true"])],
        stats=lambda s: s.invalid_pools == [f"{DRIVER}/node-0"],
    ),
    # ----------------------------------------------------------------- taints
    Case(
        "taint-no-schedule-blocks",
        [slice_("s", devices=[gpu(0, taints=[taint("bad")]), gpu(1)])],
        [one()],
        [["r0:node-0/gpu-1"]],
    ),
    Case(
        "taint-no-execute-blocks",
        [slice_("s", devices=[gpu(0, taints=[taint("bad", "NoExecute")])])],
        [one()],
        None,
    ),
    Case(
        "taint-effect-none-ignored",
        [slice_("s", devices=[gpu(0, taints=[taint("info", "None")])])],
        [one()],
        [["r0:node-0/gpu-0"]],
    ),
    Case(
        "taint-unknown-effect-ignored",
        [slice_("s", devices=[gpu(0, taints=[taint("info", "SomeFutureEffect")])])],
        [one()],
        [["r0:node-0/gpu-0"]],
    ),
    Case(
        "toleration-exists",
        [slice_("s", devices=[gpu(0, taints=[taint("bad", "NoExecute")])])],
        [one(tolerations=[toleration("bad", "Exists")])],
        [["r0:node-0/gpu-0"]],
        check=lambda rs: (
            rs[0].to_api()["devices"]["results"][0]["tolerations"]
            == [{"key": "bad", "operator": "Exists"}]
        ),
    ),
    Case(
        "toleration-equal-value-mismatch",
        [slice_("s", devices=[gpu(0, taints=[taint("bad", value="x")])])],
        [one(tolerations=[toleration("bad", value="y")])],
        None,
    ),
    Case(
        "toleration-equal-value-match-effect-scoped",
        [slice_("s", devices=[gpu(0, taints=[taint("bad", "NoSchedule", value="x")])])],
        [one(tolerations=[toleration("bad", value="x", effect="NoSchedule")])],
        [["r0:node-0/gpu-0"]],
    ),
    Case(
        "toleration-wrong-effect",
        [slice_("s", devices=[gpu(0, taints=[taint("bad", "NoExecute")])])],
        [one(tolerations=[toleration("bad", "Exists", effect="NoSchedule")])],
        None,
    ),
    Case(
        "toleration-empty-key-exists-tolerates-all",
        [slice_("s", devices=[gpu(0, taints=[taint("a"), taint("b", "NoExecute")])])],
        [one(tolerations=[toleration(operator="Exists")])],
        [["r0:node-0/gpu-0"]],
    ),
    # ----------------------------------------------------------------- admin access
    Case(
        "admin-access-ignores-held",
        gpus(1),
        [one(admin=True)],
        [["r0:node-0/gpu-0"]],
        held=[claim("h").holding("gpu-0")],
        check=lambda rs: rs[0].to_api()["devices"]["results"][0]["adminAccess"] is True,
    ),
    Case(
        "admin-access-not-twice-in-same-claim",
        gpus(2),
        [claim("c0").request("a", admin=True).request("b", admin=True)],
        [["a:node-0/gpu-0", "b:node-0/gpu-1"]],
    ),
    Case(
        "admin-access-namespace-not-allowed",
        gpus(1),
        [one(admin=True)],
        Fails("admin access is requested"),
        admin_namespaces=["kube-system"],
    ),
    Case(
        "admin-access-namespace-allowed",
        gpus(1),
        [one(admin=True)],
        [["r0:node-0/gpu-0"]],
        admin_namespaces=["default"],
    ),
    # ----------------------------------------------------------------- config
    Case(
        "config-class-first-then-claim",
        gpus(2),
        [
            claim("c0")
            .request("a")
            .request("b", cls="other")
            .config({"sharing": "mps"}, requests=["b"])
            .config({"all": True})
        ],
        [["a:node-0/gpu-0", "b:node-0/gpu-1"]],
        classes=[
            device_class(config=[{"from": "class"}]),
            device_class("other", config=[{"from": "other"}]),
        ],
        check=lambda rs: (
            rs[0].to_api()["devices"]["config"]
            == [
                {
                    "source": "FromClass",
                    "requests": ["a"],
                    "opaque": {"driver": DRIVER, "parameters": {"from": "class"}},
                },
                {
                    "source": "FromClass",
                    "requests": ["b"],
                    "opaque": {"driver": DRIVER, "parameters": {"from": "other"}},
                },
                {
                    "source": "FromClaim",
                    "requests": ["b"],
                    "opaque": {"driver": DRIVER, "parameters": {"sharing": "mps"}},
                },
                {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {"all": True}}},
            ]
        ),
    ),
    Case(
        "config-class-once-for-all-requests-means-all",
        gpus(2),
        [claim("c0").request("a").request("b")],
        [["a:node-0/gpu-0", "b:node-0/gpu-1"]],
        classes=[device_class(config=[{"x": 1}])],
        check=lambda rs: (
            rs[0].to_api()["devices"]["config"]
            == [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"x": 1}}}]
        ),
    ),
    Case(
        "config-for-unchosen-subrequest-dropped",
        gpus(1),
        [
            claim("c0")
            .first_available("r0", sub("two", count=2), sub("one"))
            .config({"p": 1}, requests=["r0/two"])
            .config({"p": 2}, requests=["r0/one"])
        ],
        [["r0/one:node-0/gpu-0"]],
        check=lambda rs: (
            [c.opaque.parameters for c in rs[0].config] == [{"p": 2}]
            and rs[0].config[0].requests == ()
        ),
    ),
    # ----------------------------------------------------------------- more upstream scenarios
    Case(
        "all-mode-after-admin-request-in-same-claim",
        gpus(2),
        [claim("c0").request("a", admin=True).request("b", admin=True, mode="All")],
        None,
    ),
    Case(
        "admin-access-shares-device-across-claims",
        gpus(2),
        [one("c0"), one("c1", admin=True), one("c2", admin=True)],
        [["r0:node-0/gpu-0"], ["r0:node-0/gpu-0"], ["r0:node-0/gpu-0"]],
    ),
    Case(
        "all-mode-constraint-violation-is-fatal",
        [slice_("s", devices=[gpu(0, numa=0), gpu(1, numa=1)])],
        [one(mode="All").constraint(match=NUMA)],
        Fails("cannot add device gpu.biaxial.dev/node-0/gpu-1 because a claim constraint"),
    ),
    Case(
        "all-mode-empty-falls-back-to-next-subrequest",
        [slice_("empty", pool="a"), slice_("s", pool="b", devices=[gpu(0)])],
        [
            claim("c0").first_available(
                "r0",
                sub("all", mode="All", selectors=['device.driver == "nobody"']),
                sub("one"),
            )
        ],
        [["r0/one:b/gpu-0"]],
    ),
    Case(
        "constraints-backtrack-across-requests",
        [
            slice_(
                "s",
                devices=[
                    gpu(0, extra={"v": ver("1.0.0"), "s": "a"}),
                    gpu(1, extra={"v": ver("2.0.0"), "s": "b"}),
                    gpu(2, extra={"v": ver("3.0.0"), "s": "b"}),
                ],
            )
        ],
        [
            claim("c0")
            .request("a")
            .request("b")
            .constraint(match=f"{DRIVER}/v", requests=["a"])
            .constraint(match=f"{DRIVER}/s")
        ],
        [["a:node-0/gpu-1", "b:node-0/gpu-2"]],
    ),
    Case(
        "too-many-devices-total-is-fatal",
        gpus(2),
        [claim("c0").request("a", count=32).request("b")],
        Fails("number of requested devices 33 exceeds the claim limit of 32"),
    ),
    Case(
        "network-attached-union-with-match-fields",
        [
            slice_(
                "s1",
                pool="p1",
                node=None,
                node_selector=node_selector(label_term("region", values=["r1"])),
                devices=[gpu(0)],
            ),
            slice_("s1", pool="p2", node=None, all_nodes=True, devices=[gpu(0)]),
            slice_(
                "s1",
                pool="p3",
                node=None,
                node_selector=node_selector(
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-0"]}
                        ]
                    }
                ),
                devices=[gpu(0)],
            ),
        ],
        [one(count=3)],
        [["r0:p1/gpu-0", "r0:p2/gpu-0", "r0:p3/gpu-0"]],
        node=node("node-0", labels={"region": "r1"}),
        check=lambda rs: (
            rs[0].node_selector
            == {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [{"key": "region", "operator": "In", "values": ["r1"]}],
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-0"]}
                        ],
                    }
                ]
            }
        ),
    ),
    Case(
        "class-config-lists-every-request-of-the-class",
        [slice_("s", devices=[gpu(0), gpu(1), gpu(2)])],
        [claim("c0").request("a").request("b").request("c", cls="other")],
        [["a:node-0/gpu-0", "b:node-0/gpu-1", "c:node-0/gpu-2"]],
        classes=[device_class(config=[{"k": "A"}]), device_class("other", config=[{"k": "B"}])],
        check=lambda rs: (
            [(c.source, c.requests) for c in rs[0].config]
            == [("FromClass", ("a", "b")), ("FromClass", ("c",))]
        ),
    ),
    Case(
        "claim-config-covering-every-request-via-subrequest-is-cleared",
        gpus(2),
        [
            claim("c0")
            .first_available("r0", sub("x"), sub("y"))
            .request("r1")
            .config({"all": 1}, requests=["r0/x", "r1"])
            .config({"scoped": 1}, requests=["r0/x", "r0/y"])
        ],
        [["r0/x:node-0/gpu-0", "r1:node-0/gpu-1"]],
        check=lambda rs: (
            [(dict(c.opaque.parameters), c.requests) for c in rs[0].config]
            == [({"all": 1}, ()), ({"scoped": 1}, ("r0/x", "r0/y"))]
        ),
    ),
    Case(
        "subrequest-selectors-with-capacity-expressions",
        [
            slice_(
                "s",
                devices=[gpu(1, memory="2Gi"), gpu(2, memory="2Gi"), gpu(3, memory="1Gi")],
            )
        ],
        [
            claim("c0")
            .request(
                "r0",
                selectors=[f'device.capacity["{DRIVER}"].memory.compareTo(quantity("1Gi")) >= 0'],
            )
            .first_available(
                "r1",
                sub(
                    "big",
                    selectors=[
                        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("4Gi")) >= 0'
                    ],
                ),
                sub(
                    "two",
                    count=2,
                    selectors=[
                        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("2Gi")) >= 0'
                    ],
                ),
            )
        ],
        [["r0:node-0/gpu-3", "r1/two:node-0/gpu-1", "r1/two:node-0/gpu-2"]],
    ),
    Case(
        "partitionable-shared-devices-with-two-counter-sets-and-subrequests",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device(
                        f"device{i}",
                        multi=True,
                        capacity={
                            "c0": c0,
                            "c1": cap("4", default="2", min="2", step="2", max="4"),
                        },
                        consumes={"set1": {"c0": c0}, "set2": {"c1": "4"}},
                    )
                    for i, c0 in ((1, "2"), (2, "4"), (3, "2"))
                ],
            ),
            slice_("s2", count=2, shared_counters={"set1": {"c0": "4"}, "set2": {"c1": "8"}}),
        ],
        [
            claim("c0")
            .request("req0", cls="any", capacity={"c0": "1"})
            .request("req2", cls="any", capacity={"c0": "2"})
            .first_available(
                "req1",
                sub(
                    "sub0",
                    cls="any",
                    capacity={"c0": "1"},
                    selectors=[f'device.capacity["{DRIVER}"].c0.compareTo(quantity("4")) >= 0'],
                ),
                sub(
                    "sub1",
                    cls="any",
                    capacity={"c0": "1"},
                    selectors=[f'device.capacity["{DRIVER}"].c0.compareTo(quantity("2")) >= 0'],
                ),
            )
        ],
        [
            [
                "req0:node-0/device1",
                "req2:node-0/device3",
                "req1/sub1:node-0/device1",
            ]
        ],
        classes=[device_class("any", selectors=["true"])],
        check=lambda rs: (
            [{k: str(v) for k, v in (r.consumed_capacity or {}).items()} for r in rs[0].results]
            == [{"c0": "1", "c1": "2"}, {"c0": "2", "c1": "2"}, {"c0": "1", "c1": "2"}]
        ),
    ),
    Case(
        "shared-device-counters-taken-by-other-claims-share",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device(
                        f"d{i}",
                        multi=True,
                        attrs={"mode": mode},
                        capacity={"c0": "1"},
                        consumes={"set1": {"c0": "1"}},
                    )
                    for i, mode in ((1, "a"), (2, "b"))
                ],
            ),
            slice_("s2", count=2, shared_counters={"set1": {"c0": "1"}}),
        ],
        [
            one(
                cls="any",
                capacity={"c0": "1"},
                selectors=[f'device.attributes["{DRIVER}"].mode == "b"'],
            )
        ],
        None,
        held=[
            claim("h").allocated(
                {
                    "devices": {
                        "results": [
                            {
                                "request": "r0",
                                "driver": DRIVER,
                                "pool": "node-0",
                                "device": "d1",
                                "shareID": "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa",
                                "consumedCapacity": {"c0": "1"},
                            }
                        ]
                    }
                }
            )
        ],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "distinct-constraint-with-subrequests-scoped",
        [
            slice_(
                "s",
                devices=[
                    device("device1", multi=True, attrs={"flag": True}),
                    device("device2", multi=True, attrs={"flag": False}),
                ],
            )
        ],
        [
            claim("c0")
            .first_available(
                "req0",
                sub("sub0", cls="any", selectors=[f'device.attributes["{DRIVER}"].flag']),
                sub("sub1", cls="any"),
            )
            .first_available(
                "req1",
                sub("sub0", cls="any", selectors=[f'device.attributes["{DRIVER}"].flag']),
                sub("sub1", cls="any"),
            )
            .first_available(
                "req2",
                sub("sub0", cls="any", selectors=[f'device.attributes["{DRIVER}"].flag']),
                sub("sub1", cls="any"),
            )
            .constraint(distinct=f"{DRIVER}/flag", requests=["req0", "req1"])
        ],
        [["req0/sub0:node-0/device1", "req1/sub1:node-0/device2", "req2/sub0:node-0/device1"]],
        classes=[device_class("any", selectors=["true"])],
        check=lambda rs: all(r.share_id and r.consumed_capacity is None for r in rs[0].results),
    ),
    Case(
        "dedicated-device-still-holding-shared-capacity",
        [
            slice_(
                "s",
                devices=[
                    device("d1", capacity={"c0": cap("2", default="2", min="2", step="2", max="4")})
                ],
            )
        ],
        [one(cls="any", capacity={"c0": "1"})],
        None,
        held=[
            claim("h").allocated(
                {
                    "devices": {
                        "results": [
                            {
                                "request": "r0",
                                "driver": DRIVER,
                                "pool": "node-0",
                                "device": "d1",
                                "shareID": "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa",
                                "consumedCapacity": {"c0": "1"},
                            }
                        ]
                    }
                }
            )
        ],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "all-mode-capacity-rejection-rolls-back-constraints",
        [
            slice_(
                "s",
                devices=[
                    device("device1", multi=True, attrs={"s": "cap"}, capacity={"c0": "2"}),
                    device("device2", attrs={"s": "fb"}),
                ],
            )
        ],
        [
            one(
                "c0",
                cls="any",
                capacity={"c0": "2"},
                selectors=[f'device.attributes["{DRIVER}"].s == "cap"'],
            ),
            claim("c1")
            .first_available(
                "r0",
                sub(
                    "all",
                    cls="any",
                    mode="All",
                    capacity={"c0": "2"},
                    selectors=[f'device.attributes["{DRIVER}"].s == "cap"'],
                ),
                sub("fb", cls="any", selectors=[f'device.attributes["{DRIVER}"].s == "fb"']),
            )
            .constraint(match=f"{DRIVER}/s"),
        ],
        [["r0:node-0/device1"], ["r0/fb:node-0/device2"]],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "shared-counter-ownership-survives-backtracking",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device(
                        "device1",
                        multi=True,
                        attrs={"kind": "shared", "s": "red"},
                        consumes={"set1": {"c": "1"}},
                    ),
                    device("device2", attrs={"kind": "fallback", "s": "blue"}),
                    device("device3", attrs={"kind": "gate", "s": "blue"}),
                ],
            ),
            slice_("s2", count=2, shared_counters={"set1": {"c": "1"}}),
        ],
        [
            one("c0", cls="any", selectors=[f'device.attributes["{DRIVER}"].kind == "shared"']),
            claim("c1")
            .request(
                "req1",
                cls="any",
                selectors=[
                    (
                        f'device.attributes["{DRIVER}"].kind == "shared" || '
                        f'device.attributes["{DRIVER}"].kind == "fallback"'
                    )
                ],
            )
            .request("req2", cls="any", selectors=[f'device.attributes["{DRIVER}"].kind == "gate"'])
            .request(
                "req3", cls="any", selectors=[f'device.attributes["{DRIVER}"].kind == "shared"']
            )
            .constraint(match=f"{DRIVER}/s", requests=["req1", "req2"]),
        ],
        [
            ["r0:node-0/device1"],
            ["req1:node-0/device2", "req2:node-0/device3", "req3:node-0/device1"],
        ],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "counter-reservation-released-on-backtrack",
        [
            slice_(
                "s1",
                count=2,
                devices=[
                    device(
                        "device1",
                        multi=True,
                        attrs={"kind": "shared"},
                        consumes={"set1": {"c": "1"}},
                    ),
                    device("device2", attrs={"kind": "shared"}),
                    device("device3", attrs={"kind": "counteronly"}, consumes={"set1": {"c": "1"}}),
                ],
            ),
            slice_("s2", count=2, shared_counters={"set1": {"c": "1"}}),
        ],
        [
            claim("c0")
            .request(
                "req0", cls="any", selectors=[f'device.attributes["{DRIVER}"].kind == "shared"']
            )
            .request(
                "req1",
                cls="any",
                selectors=[f'device.attributes["{DRIVER}"].kind == "counteronly"'],
            )
        ],
        [["req0:node-0/device2", "req1:node-0/device3"]],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "counters-consumed-on-another-node-count",
        [
            slice_("s1", pool="p", count=3, shared_counters={"set1": {"memory": "8Gi"}}),
            slice_(
                "s2",
                pool="p",
                count=3,
                devices=[
                    device(
                        "device1", capacity={"memory": "6Gi"}, consumes={"set1": {"memory": "6Gi"}}
                    ),
                    device(
                        "device2", capacity={"memory": "2Gi"}, consumes={"set1": {"memory": "2Gi"}}
                    ),
                ],
            ),
            slice_(
                "s3",
                pool="p",
                node="node-1",
                count=3,
                devices=[device("device3", consumes={"set1": {"memory": "6Gi"}})],
            ),
        ],
        [
            claim("c0").first_available(
                "r0",
                sub(
                    "big",
                    cls="any",
                    selectors=[
                        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("6Gi")) >= 0'
                    ],
                ),
                sub(
                    "small",
                    cls="any",
                    selectors=[
                        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("2Gi")) >= 0'
                    ],
                ),
            )
        ],
        [["r0/small:p/device2"]],
        held=[claim("h").holding("device3", pool="p")],
        classes=[device_class("any", selectors=["true"])],
    ),
    Case(
        "counter-set-defined-twice-in-pool-is-invalid",
        [
            slice_("s1", count=4, devices=[device("device1")]),
            slice_("s2", count=4, shared_counters={"set1": {"c": "1"}}),
            slice_("s3", count=4, devices=[device("device2")]),
            slice_("s4", count=4, shared_counters={"set1": {"c": "1"}}),
        ],
        [one(cls="any")],
        INVALID_POOLS,
        classes=[device_class("any", selectors=["true"])],
        stats=lambda s: s.invalid_pools == [f"{DRIVER}/node-0"],
    ),
    Case(
        "invalid-slice-on-other-node-invalidates-pool",
        [
            slice_("s1", pool="p", count=3, shared_counters={"set1": {"memory": "8Gi"}}),
            slice_(
                "s2",
                pool="p",
                count=3,
                devices=[device("device1", consumes={"set1": {"memory": "6Gi"}})],
            ),
            slice_(
                "s3",
                pool="p",
                node="node-1",
                count=3,
                devices=[device("device3", consumes={"set2": {"memory": "6Gi"}})],
            ),
        ],
        [one(cls="any")],
        INVALID_POOLS,
        classes=[device_class("any", selectors=["true"])],
        stats=lambda s: s.invalid_pools == [f"{DRIVER}/p"],
    ),
    Case(
        "combinations-not-permutations-steps",
        [
            slice_("s1", pool="p", count=2, devices=[device("d1"), device("d2")]),
            slice_("s2", pool="p", count=2, devices=[device("d3"), device("d4")]),
        ],
        [one(cls="any", count=5)],
        None,
        classes=[device_class("any", selectors=["true"])],
        # Upstream pins 16 allocateOne invocations: every subset of 4 devices, once.
        stats=lambda s: s.steps == 16,
    ),
    Case(
        "taints-apply-to-admin-access",
        [slice_("s", devices=[gpu(0, taints=[taint("bad")])])],
        [one(admin=True)],
        None,
        held=[claim("h").holding("gpu-0")],
    ),
    Case(
        "first-available-all-mode-blocked-by-held-device",
        gpus(2),
        [claim("c0").first_available("r0", sub("all", mode="All"), sub("one"))],
        [["r0/one:node-0/gpu-0"]],
        held=[claim("h").holding("gpu-1")],
    ),
    Case(
        "taint-tolerated-only-on-subrequest",
        [
            slice_(
                "s",
                devices=[
                    gpu(0, taints=[taint("a")]),
                    gpu(1, taints=[taint("b", "NoExecute")]),
                ],
            )
        ],
        [
            claim("c0").first_available(
                "r0",
                sub("plain"),
                sub("tolerant", tolerations=[toleration("b", "Exists", effect="NoExecute")]),
            )
        ],
        [["r0/tolerant:node-0/gpu-1"]],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_allocator_case(case: Case) -> None:
    run_case(case)


def test_case_count_meets_acceptance() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    "name",
    ["", "uid-0/r0/0", "default/pod-7-gpu/gpu/31", "ünïcødé/ř/0", "x" * 1000, "a\x00b"],
)
def test_share_ids_are_uuid5_of_claim_request_and_index(name: str) -> None:
    assert make_share_id(name) == str(uuid.uuid5(SHARE_ID_NAMESPACE, name))


def test_share_id_of_a_name_that_is_not_utf8_fails_as_uuid5_does() -> None:
    with pytest.raises(UnicodeEncodeError):
        uuid.uuid5(SHARE_ID_NAMESPACE, "\ud800")
    with pytest.raises(UnicodeEncodeError):
        make_share_id("\ud800")

"""A request's selectors after its class's: verdicts the node already knows for the class
selectors alone are reused, never evaluated again, and never change an answer.

Upstream (k8s.io/dynamic-resource-allocation ``structured/internal/incubating/allocator.go``,
``isSelectable``) evaluates the class's selectors, then the request's, and stops at the first
that does not select the device: a request selector that would fail with a runtime error on a
device the class already left out is never run there. A node keeps the class-only verdicts once
they are known (a request without selectors of its own, or the decision engine's class sweep);
a request with selectors of its own starts from them.
"""

from __future__ import annotations

import pytest

from driver.api.errors import AllocationError
from driver.structured.allocator import allocate
from tests.unit.builders import DRIVER, claim, device, device_class, node, slice_, snapshot, to_node

GPU_ONLY = device_class("gpu-only", selectors=[f'device.attributes["{DRIVER}"].type == "gpu"'])
# Fails with a runtime error on a device without the attribute "tier" (the MIG device).
NEEDS_TIER = f'device.attributes["{DRIVER}"].tier == "gold"'


def _snapshot():  # type: ignore[no-untyped-def]
    return snapshot(
        [
            slice_(
                "s",
                devices=[
                    device("mig-0", attrs={"type": "mig"}),
                    device("gpu-0", attrs={"type": "gpu", "tier": "gold"}),
                    device("gpu-1", attrs={"type": "gpu", "tier": "silver"}),
                ],
            )
        ],
        [GPU_ONLY],
    )


def test_known_class_verdicts_are_not_evaluated_again() -> None:
    snap = _snapshot()
    here = to_node(node("node-0"))
    everything = claim("all").request("r", cls="gpu-only", mode="All").model()
    got = allocate(snap, [everything], here)
    assert got is not None
    assert sorted(r.device for r in got[0].results) == ["gpu-0", "gpu-1"]
    cache = snap.match_cache
    assert cache is not None
    hits, misses = cache.hits, cache.misses
    gold = claim("gold").request("r", cls="gpu-only", mode="All", selectors=[NEEDS_TIER]).model()
    got = allocate(snap, [gold], here)
    assert got is not None
    assert [r.device for r in got[0].results] == ["gpu-0"]
    # Only the request's selector ran, once per device the class selects: never the class's
    # again, never on the MIG device (where it would have failed).
    assert (cache.hits, cache.misses - misses) == (hits, 2)


def test_a_request_selector_error_still_names_the_request_and_its_selector() -> None:
    snap = _snapshot()
    here = to_node(node("node-0"))
    everything = claim("all").request("r", cls="gpu-only", mode="All").model()
    assert allocate(snap, [everything], here) is not None
    typo = f'device.attributes["{DRIVER}"].color == "red"'
    bad = claim("bad").request("r", cls="gpu-only", selectors=[NEEDS_TIER, typo]).model()
    with pytest.raises(AllocationError, match=r"claim default/bad: selector #1 on device"):
        allocate(snap, [bad], here)


def test_without_known_class_verdicts_the_answer_is_the_same() -> None:
    snap = _snapshot()
    here = to_node(node("node-0"))
    gold = claim("gold").request("r", cls="gpu-only", mode="All", selectors=[NEEDS_TIER]).model()
    got = allocate(snap, [gold], here)
    assert got is not None
    assert [r.device for r in got[0].results] == ["gpu-0"]

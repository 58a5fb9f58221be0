"""Node model and core/v1 NodeSelector matching."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from driver.api.errors import ManifestError
from driver.api.nodes import Node, NodeTaint, node_local_selector, node_selector_matches
from tests.unit.builders import node


def test_node_from_api() -> None:
    raw = node(
        "n1",
        labels={"zone": "a"},
        taints=[{"key": "gpu", "effect": "NoSchedule", "value": "yes"}],
        allocatable={"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "0"},
        unschedulable=True,
        ready=False,
    )
    before = copy.deepcopy(raw)
    n = Node.from_api(raw)
    assert raw == before
    assert n.name == "n1"
    assert n.labels["zone"] == "a"
    assert n.taints == (NodeTaint("gpu", "NoSchedule", "yes"),)
    assert str(n.allocatable["memory"]) == "32Gi"
    assert n.unschedulable
    assert not n.ready


def test_node_without_conditions_is_ready_and_errors_are_clear() -> None:
    assert Node.from_api({"metadata": {"name": "n"}}).ready
    with pytest.raises(ManifestError, match=r"metadata\.name is required"):
        Node.from_api({"metadata": {}})
    with pytest.raises(ManifestError, match="Node n: malformed"):
        Node.from_api({"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "lots"}}})


N = Node.from_api(node("node-a", labels={"zone": "z1", "gen": "5", "ssd": ""}))


def req(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


def sel(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": list(terms)}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (sel({"matchExpressions": [req("zone", "In", "z1", "z2")]}), True),
        (sel({"matchExpressions": [req("zone", "In", "z2")]}), False),
        (sel({"matchExpressions": [req("zone", "NotIn", "z2")]}), True),
        (sel({"matchExpressions": [req("missing", "NotIn", "z2")]}), True),
        (sel({"matchExpressions": [req("ssd", "Exists")]}), True),
        (sel({"matchExpressions": [req("missing", "Exists")]}), False),
        (sel({"matchExpressions": [req("missing", "DoesNotExist")]}), True),
        (sel({"matchExpressions": [req("gen", "Gt", "4")]}), True),
        (sel({"matchExpressions": [req("gen", "Gt", "5")]}), False),
        (sel({"matchExpressions": [req("gen", "Lt", "6")]}), True),
        (sel({"matchExpressions": [req("zone", "Gt", "1")]}), False),  # not an integer
        (sel({"matchFields": [req("metadata.name", "In", "node-a")]}), True),
        (sel({"matchFields": [req("metadata.name", "NotIn", "node-a")]}), False),
        # ANDed within a term, ORed across terms.
        (
            sel({"matchExpressions": [req("zone", "In", "z1"), req("gen", "Lt", "5")]}),
            False,
        ),
        (
            sel(
                {"matchExpressions": [req("zone", "In", "z9")]},
                {"matchFields": [req("metadata.name", "In", "node-a")]},
            ),
            True,
        ),
        (sel({}), False),  # an empty term matches nothing
        (sel(), False),  # no terms match nothing
    ],
)
def test_node_selector_matches(selector: dict[str, Any], matches: bool) -> None:
    assert node_selector_matches(selector, N) is matches


def test_node_selector_errors() -> None:
    with pytest.raises(ManifestError, match="unsupported node selector operator 'Near'"):
        node_selector_matches(sel({"matchExpressions": [req("zone", "Near")]}), N)
    with pytest.raises(ManifestError, match="unsupported matchFields key"):
        node_selector_matches(sel({"matchFields": [req("metadata.uid", "In", "x")]}), N)
    with pytest.raises(ManifestError, match="supports In and NotIn"):
        node_selector_matches(sel({"matchFields": [req("metadata.name", "Exists")]}), N)


def test_node_local_selector_selects_only_that_node() -> None:
    selector = node_local_selector("node-a")
    assert node_selector_matches(selector, N)
    assert not node_selector_matches(selector, Node.from_api(node("node-b")))

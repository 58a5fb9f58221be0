"""Label selectors (driver.api.labels) as apimachinery's LabelSelectorAsSelector reads
them: null selects nothing, {} everything; matchLabels and matchExpressions ANDed; NotIn and
DoesNotExist hold for a missing label; operators' value counts are checked."""

from __future__ import annotations

from typing import Any

import pytest

from driver.api.errors import ManifestError
from driver.api.labels import NOTHING, LabelSelector, Requirement

CASES: list[tuple[Any, dict[str, str], bool]] = [
    (None, {"a": "1"}, False),
    ({}, {}, True),
    ({}, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    (
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
        {"a": "2"},
        True,
    ),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    (
        {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
        {"a": "1"},
        False,
    ),
]


@pytest.mark.parametrize(("raw", "labels", "expected"), CASES)
def test_matches(raw: Any, labels: dict[str, str], expected: bool) -> None:
    assert LabelSelector.from_api(raw, "test").matches(labels) is expected


def test_selectors_are_canonical_keys() -> None:
    """Order and repetition do not matter, so merging a requirement twice (matchLabelKeys
    merged by the API server and again here) gives the same selector."""
    one = LabelSelector.from_api({"matchLabels": {"a": "1", "b": "2"}}, "x")
    two = LabelSelector.from_api(
        {
            "matchExpressions": [{"key": "b", "operator": "In", "values": ["2"]}],
            "matchLabels": {"a": "1"},
        },
        "x",
    )
    assert one == two
    assert hash(one) == hash(two)
    assert one.merged([Requirement("a", "In", ("1",))]) == one
    assert NOTHING.merged([Requirement("a", "In", ("1",))]) is NOTHING
    assert one.anchor == ("a", "1")
    assert LabelSelector.from_api({}, "x").empty
    assert not NOTHING.empty


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
            "unknown label selector operator 'Gt'",
        ),
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "needs at least one value"),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["1"]}]},
            "takes no values",
        ),
        ({"matchLabels": ["a"]}, "matchLabels must be an object"),
    ],
)
def test_bad_selectors(raw: Any, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        LabelSelector.from_api(raw, "pod p")

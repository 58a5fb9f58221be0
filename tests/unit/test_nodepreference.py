"""Soft node rules (driver.scheduling.nodepreference): kube-scheduler's NodeAffinity score
(the weights of the preferred terms a node matches; an empty term matches nothing) and
TaintToleration score (PreferNoSchedule taints not tolerated by the tolerations whose effect is
empty or PreferNoSchedule), each normalised by a fixed maximum (docs/scoring.md)."""

from __future__ import annotations

from fractions import Fraction

from driver.scheduling.scoring import WEIGHT_NODE_AFFINITY, WEIGHT_TAINTS
from tests.unit.builders import taint
from tests.unit.pods import pod
from tests.unit.rules_env import environment, nodes, penalties


def test_preferred_node_affinity() -> None:
    cluster = nodes(("a100", {"gpu": "a100", "fast": "yes"}), ("t4", {"gpu": "t4"}), ("bare", {}))
    incoming = pod("p").prefer_node(80, "gpu", "a100").prefer_node(20, "fast", "yes").json()
    got = penalties(environment(cluster), incoming)
    assert got == {
        "a100": Fraction(0),
        "t4": WEIGHT_NODE_AFFINITY * Fraction(1),
        "bare": WEIGHT_NODE_AFFINITY * Fraction(1),
    }
    partly = pod("p").prefer_node(80, "gpu", "t4").prefer_node(20, "fast", "yes").json()
    assert penalties(environment(cluster), partly)["a100"] == WEIGHT_NODE_AFFINITY * Fraction(
        80, 100
    )


def test_an_empty_preferred_term_matches_nothing() -> None:
    cluster = nodes(("n1", {}))
    raw = pod("p").json()
    raw["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "preference": {}}]
        }
    }
    assert penalties(environment(cluster), raw) == {"n1": WEIGHT_NODE_AFFINITY * Fraction(1)}


def test_prefer_no_schedule_taints() -> None:
    cluster = [
        *nodes(("clean", {})),
        *nodes(("one", {}), taints=[taint("spot", "PreferNoSchedule")]),
        *nodes(
            ("two", {}),
            taints=[taint("spot", "PreferNoSchedule"), taint("old", "PreferNoSchedule")],
        ),
    ]
    got = penalties(environment(cluster), pod("p").json())
    assert got == {
        "clean": Fraction(0),
        "one": WEIGHT_TAINTS * Fraction(1, 2),
        "two": WEIGHT_TAINTS * Fraction(1),
    }
    tolerant = pod("p").tolerate("spot", "PreferNoSchedule").json()
    assert penalties(environment(cluster), tolerant)["one"] == Fraction(0)
    # a NoSchedule toleration does not tolerate a PreferNoSchedule taint
    strict = pod("p").tolerate("spot", "NoSchedule").json()
    assert penalties(environment(cluster), strict)["one"] == WEIGHT_TAINTS * Fraction(1, 2)

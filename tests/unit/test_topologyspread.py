"""PodTopologySpread (driver.scheduling.topologyspread through driver.scheduling.rules),
table-driven.

Each case cites the upstream rule it pins: kube-scheduler's
``pkg/scheduler/framework/plugins/podtopologyspread`` -- filtering.go (``calPreFilterState``:
eligible nodes carry every constraint's key and pass ``matchNodeInclusionPolicies``; the global
minimum is 0 below ``minDomains``; Filter: ``matchNum + selfMatchNum - minMatchNum > maxSkew``,
``ErrReasonNodeLabelNotMatch`` for a node without the key), common.go
(``countPodsMatchSelector``: same namespace, terminating pods skipped, an empty selector counts
nothing; ``filterTopologySpreadConstraints``: matchLabelKeys; ``buildDefaultConstraints``) and
helper.DefaultSelector, with the scenarios of filtering_test.go (TestSingleConstraint,
TestMultipleConstraints).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from driver.api.errors import ConfigError, ManifestError
from driver.api.labels import LabelSelector
from driver.scheduling.topologyspread import (
    REASON_SPREAD,
    REASON_SPREAD_LABEL,
    DefaultConstraint,
    DefaultSpreading,
    pod_constraints,
)
from tests.unit.builders import taint
from tests.unit.pods import HOSTNAME, ZONE, pod, selector
from tests.unit.rules_env import environment, nodes, penalties, reasons, rules_for

FOUR = nodes(
    ("node-a", {ZONE: "zone1"}),
    ("node-b", {ZONE: "zone1"}),
    ("node-x", {ZONE: "zone2"}),
    ("node-y", {ZONE: "zone2"}),
)


def spread_pods(**per_node: int) -> list[Any]:
    return [
        pod(f"{name}-{i}").labels(foo="").on(name)
        for name, count in per_node.items()
        for i in range(count)
    ]


def selector_of(**labels: str) -> LabelSelector:
    return LabelSelector.from_labels(labels)


def web(name: str = "p") -> Any:
    return pod(name).labels(foo="")


FILTER: list[tuple[str, Any, list[Any], Any, dict[str, str | None]]] = [
    (
        # upstream: "no existing pods"
        "no pods: every node fits",
        web().spread(
            ZONE, label_selector={"matchExpressions": [{"key": "foo", "operator": "Exists"}]}
        ),
        [],
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"]),
    ),
    (
        # upstream: "no existing pods, incoming pod doesn't match itself"
        "the incoming pod does not match its own selector",
        pod("p").spread(ZONE, foo="bar"),
        spread_pods(**{"node-a": 1}),
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"]),
    ),
    (
        # upstream: "existing pods in a different namespace do not count"
        "pods of another namespace do not count",
        web().spread(ZONE, foo=""),
        [
            pod("other", "ns2").labels(foo="").on("node-a"),
            pod("o2", "ns2").labels(foo="").on("node-b"),
        ],
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"]),
    ),
    (
        # upstream: "pods spread across zones as 3/3, all nodes fit"
        "zones 3/3: every node fits",
        web().spread(ZONE, foo=""),
        spread_pods(**{"node-a": 2, "node-b": 1, "node-x": 1, "node-y": 2}),
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"]),
    ),
    (
        # upstream: "pods spread across zones as 1/2 due to absence of label 'zone' on node-b"
        "a node without the key fails with the missing-label reason",
        web().spread(ZONE, foo=""),
        spread_pods(**{"node-a": 1, "node-x": 1, "node-y": 1}),
        [
            *nodes(
                ("node-a", {ZONE: "zone1"}),
                ("node-x", {ZONE: "zone2"}),
                ("node-y", {ZONE: "zone2"}),
            ),
            *nodes(("node-b", {})),
        ],
        {
            "node-a": None,
            "node-b": REASON_SPREAD_LABEL,
            "node-x": REASON_SPREAD,
            "node-y": REASON_SPREAD,
        },
    ),
    (
        # upstream: "pod cannot be scheduled as all nodes don't have label 'rack'"
        "no node has the key",
        web().spread("rack", foo=""),
        [],
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"], REASON_SPREAD_LABEL),
    ),
    (
        # upstream: "pods spread across nodes as 2/1/0/3, only node-x fits"
        "hostname 2/1/0/3: only the empty node fits",
        web().spread(HOSTNAME, foo=""),
        spread_pods(**{"node-a": 2, "node-b": 1, "node-y": 3}),
        FOUR,
        {"node-a": REASON_SPREAD, "node-b": REASON_SPREAD, "node-x": None, "node-y": REASON_SPREAD},
    ),
    (
        # upstream: "pods spread across nodes as 2/1/0/3, maxSkew is 2, node-b and node-x fit"
        "hostname 2/1/0/3 with maxSkew 2",
        web().spread(HOSTNAME, 2, foo=""),
        spread_pods(**{"node-a": 2, "node-b": 1, "node-y": 3}),
        FOUR,
        {"node-a": REASON_SPREAD, "node-b": None, "node-x": None, "node-y": REASON_SPREAD},
    ),
    (
        # upstream: countPodsMatchSelector skips terminating pods
        "terminating pods do not count",
        web().spread(HOSTNAME, foo=""),
        [pod("t").labels(foo="").terminating().on("node-a")],
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"]),
    ),
    (
        # upstream: countPodsMatchSelector returns 0 for an empty selector
        "an empty selector counts nothing",
        web().spread(HOSTNAME, label_selector={}),
        spread_pods(**{"node-a": 3}),
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"]),
    ),
    (
        # upstream: minMatchNum is 0 while there are fewer eligible domains than minDomains
        "minDomains above the domains: the minimum counts as 0",
        web().spread(ZONE, min_domains=3, foo=""),
        spread_pods(**{"node-a": 1, "node-x": 1}),
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"], REASON_SPREAD),
    ),
    (
        "minDomains met: the usual minimum",
        web().spread(ZONE, min_domains=2, foo=""),
        spread_pods(**{"node-a": 1, "node-x": 1}),
        FOUR,
        dict.fromkeys(["node-a", "node-b", "node-x", "node-y"]),
    ),
    (
        # upstream: filterTopologySpreadConstraints merges matchLabelKeys into the selector
        "matchLabelKeys: only pods of the same revision count",
        pod("p").labels(foo="", rev="2").spread(HOSTNAME, foo="", match_keys=("rev",)),
        [
            pod("old").labels(foo="", rev="1").on("node-a"),
            pod("new").labels(foo="", rev="2").on("node-b"),
        ],
        FOUR,
        {"node-a": None, "node-b": REASON_SPREAD, "node-x": None, "node-y": None},
    ),
    (
        # upstream TestMultipleConstraints: both constraints must hold
        "two constraints: zone and hostname",
        web().spread(ZONE, foo="").spread(HOSTNAME, foo=""),
        spread_pods(**{"node-a": 1, "node-b": 1, "node-x": 1}),
        FOUR,
        {"node-a": REASON_SPREAD, "node-b": REASON_SPREAD, "node-x": REASON_SPREAD, "node-y": None},
    ),
]


@pytest.mark.parametrize(
    ("incoming", "running", "cluster", "expected"),
    [case[1:] for case in FILTER],
    ids=[case[0] for case in FILTER],
)
def test_filter(incoming: Any, running: list[Any], cluster: Any, expected: Any) -> None:
    env = environment(cluster, [p.json() for p in running])
    assert reasons(env, incoming.json()) == expected


def test_node_affinity_policy() -> None:
    """nodeAffinityPolicy Honor (the default): only nodes matching the pod's node affinity /
    selector are domains and count pods; Ignore: every node does."""
    cluster = nodes(
        ("n1", {ZONE: "a", "gpu": "t4"}),
        ("n2", {ZONE: "b", "gpu": "t4"}),
        ("n3", {ZONE: "c", "gpu": "a10"}),
    )
    running = [p.json() for p in spread_pods(n1=1, n2=1)]
    honoured = web().node_selector(gpu="t4").spread(ZONE, foo="")
    env = environment(cluster, running)
    # zone c is not a domain for this pod: the minimum is 1, every t4 node fits
    assert reasons(env, honoured.json()) == {"n1": None, "n2": None, "n3": None}
    ignored = web().node_selector(gpu="t4").spread(ZONE, foo="", affinity_policy="Ignore")
    # zone c (no pods) is a domain: the minimum is 0, both t4 nodes are over the skew
    assert reasons(env, ignored.json()) == {"n1": REASON_SPREAD, "n2": REASON_SPREAD, "n3": None}


def test_node_taints_policy() -> None:
    """nodeTaintsPolicy Honor: nodes whose NoSchedule taints the pod does not tolerate are not
    domains; Ignore (the default): they are."""
    cluster = [
        *nodes(("n1", {ZONE: "a"}), ("n2", {ZONE: "b"})),
        *nodes(("n3", {ZONE: "c"}), taints=[taint("dedicated")]),
    ]
    running = [p.json() for p in spread_pods(n1=1, n2=1)]
    env = environment(cluster, running)
    ignored = web().spread(ZONE, foo="")
    assert reasons(env, ignored.json()) == {"n1": REASON_SPREAD, "n2": REASON_SPREAD, "n3": None}
    honoured = web().spread(ZONE, foo="", taints_policy="Honor")
    assert reasons(env, honoured.json()) == {"n1": None, "n2": None, "n3": None}
    tolerating = web().tolerate("dedicated").spread(ZONE, foo="", taints_policy="Honor")
    assert reasons(env, tolerating.json()) == {"n1": REASON_SPREAD, "n2": REASON_SPREAD, "n3": None}


# --------------------------------------------------------------------------- defaults


def test_system_defaults_apply_to_pods_of_a_replicaset_and_only_break_ties() -> None:
    """buildDefaultConstraints: for a pod without constraints, the System defaults with the
    selector of its ReplicaSet (DefaultSelector); biaxial orders equal scores with them."""
    cluster = nodes(("n1", {ZONE: "a"}), ("n2", {ZONE: "a"}), ("n3", {ZONE: "b"}))
    running = [pod(f"r{i}").labels(app="web").on("n1").json() for i in range(2)]
    owners = [("ReplicaSet", "default", "web-1", selector(app="web"))]
    env = environment(cluster, running, spreading=DefaultSpreading(), owners=owners)
    owned = pod("p").labels(app="web").owned("ReplicaSet", "web-1").json()
    rules = rules_for(env, owned)
    assert rules is not None
    assert rules.ties
    assert not rules.soft
    assert not rules.filters
    ties = {n.name: rules.tie_break(n) for n in cluster}
    assert ties["n3"] < ties["n2"] < ties["n1"]
    # a bare pod, or one whose ReplicaSet the cluster does not show, gets none
    assert rules_for(env, pod("q").labels(app="web").json()) is None
    unknown = pod("q").labels(app="web").owned("ReplicaSet", "gone").json()
    assert rules_for(env, unknown) is None
    # a Deployment is not an owner DefaultSelector reads (its ReplicaSet is)
    assert rules_for(env, pod("q").labels(app="web").owned("Deployment", "web").json()) is None


def test_services_contribute_to_the_default_selector() -> None:
    """DefaultSelector merges the selectors of the Services in the pod's namespace that select
    it; a Service of another namespace, or one that does not select the pod, adds nothing."""
    cluster = nodes(("n1", {}), ("n2", {}))
    owners = [
        ("Service", "default", "web", {"app": "web"}),
        ("Service", "other", "web", {"app": "web"}),
        ("Service", "default", "db", {"app": "db"}),
    ]
    env = environment(cluster, [], spreading=DefaultSpreading(), owners=owners)
    rules = rules_for(env, pod("p").labels(app="web", tier="x").json())
    assert rules is not None
    assert {s.constraint.selector for s in rules.tie_spread} == {selector_of(app="web")}


def test_a_configured_list_weighs_like_the_pods_own_constraints() -> None:
    """A configured default list (PodTopologySpreadArgs defaultConstraints) is the operator's
    rule: DoNotSchedule filters, ScheduleAnyway scores with the spread weight, and nodes must
    carry every key (requireAllTopologies)."""
    cluster = nodes(("n1", {ZONE: "a"}), ("n2", {ZONE: "b"}), ("n3", {}))
    running = [pod("r0").labels(app="web").on("n1").json()]
    owners = [("ReplicaSet", "default", "web-1", selector(app="web"))]
    listed = DefaultSpreading.parse(f"{ZONE}:1:ScheduleAnyway")
    env = environment(cluster, running, spreading=listed, owners=owners)
    owned = pod("p").labels(app="web").owned("ReplicaSet", "web-1").json()
    assert penalties(env, owned) == {"n1": Fraction(1), "n2": Fraction(0), "n3": Fraction(2)}
    hard = DefaultSpreading.parse(f"{ZONE}:1:DoNotSchedule")
    env = environment(cluster, running, spreading=hard, owners=owners)
    assert reasons(env, owned) == {"n1": REASON_SPREAD, "n2": None, "n3": REASON_SPREAD_LABEL}
    # the pod's own constraints replace the defaults
    own = pod("p").labels(app="web").owned("ReplicaSet", "web-1").spread(HOSTNAME, 5, app="web")
    assert reasons(env, own.json()) == {"n1": None, "n2": None, "n3": None}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("system", DefaultSpreading()),
        ("none", DefaultSpreading((), system=False)),
        (
            f"{HOSTNAME}:2:ScheduleAnyway,{ZONE}:1:DoNotSchedule",
            DefaultSpreading(
                (
                    DefaultConstraint(2, HOSTNAME, "ScheduleAnyway"),
                    DefaultConstraint(1, ZONE, "DoNotSchedule"),
                ),
                system=False,
            ),
        ),
    ],
)
def test_default_spreading_parses(text: str, expected: DefaultSpreading) -> None:
    assert DefaultSpreading.parse(text) == expected
    assert DefaultSpreading.parse(expected.describe()) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("zone", "is not TOPOLOGY_KEY:MAX_SKEW"),
        (f"{ZONE}:0:DoNotSchedule", "maxSkew must be an integer >= 1"),
        (f"{ZONE}:1:Sometimes", "'Sometimes' is not DoNotSchedule or ScheduleAnyway"),
        (f"{ZONE}:1:DoNotSchedule,{ZONE}:2:DoNotSchedule", "listed twice"),
    ],
)
def test_default_spreading_refuses_bad_text(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DefaultSpreading.parse(text)


# --------------------------------------------------------------------------- score


def test_schedule_anyway_penalty_grows_with_the_excess_softened_by_max_skew() -> None:
    """Per constraint e / (e + maxSkew) with e = count - minimum; a node without the key gets
    the full penalty (upstream ignores such nodes when scoring: they score 0)."""
    cluster = [
        *nodes(("n1", {ZONE: "a"}), ("n2", {ZONE: "b"}), ("n3", {ZONE: "c"})),
        *nodes(("n4", {})),
    ]
    running = [p.json() for p in spread_pods(n1=3, n2=1)]
    env = environment(cluster, running)
    soft = web().spread(ZONE, 1, when="ScheduleAnyway", foo="")
    assert penalties(env, soft.json()) == {
        "n1": 2 * Fraction(3, 4),
        "n2": 2 * Fraction(1, 2),
        "n3": Fraction(0),
        "n4": Fraction(2),
    }
    softer = web().spread(ZONE, 3, when="ScheduleAnyway", foo="")
    assert penalties(env, softer.json())["n1"] == 2 * Fraction(3, 6)


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (
            {"topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"},
            "maxSkew must be an integer >= 1",
        ),
        (
            {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "Never"},
            "'Never' is not one of",
        ),
        (
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "ScheduleAnyway",
                "minDomains": 2,
            },
            "only allowed with whenUnsatisfiable DoNotSchedule",
        ),
        (
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "nodeTaintsPolicy": "Maybe",
            },
            "nodeTaintsPolicy: 'Maybe' is not one of Honor, Ignore",
        ),
    ],
)
def test_malformed_constraints_are_refused(constraint: dict[str, Any], message: str) -> None:
    raw = pod("p").json()
    raw["spec"]["topologySpreadConstraints"] = [constraint]
    with pytest.raises(ManifestError, match=message):
        pod_constraints(raw, "pod default/p")

"""InterPodAffinity (driver.scheduling.podaffinity through driver.scheduling.rules), table-driven.

Each case cites the upstream rule it pins: kube-scheduler's
``pkg/scheduler/framework/plugins/interpodaffinity`` (filtering.go: ``satisfyPodAffinity``,
``satisfyPodAntiAffinity``, ``satisfyExistingPodsAntiAffinity``; scoring.go: ``processTerm``,
``processExistingPod``, NormalizeScore) and ``framework.AffinityTerm.Matches``, with the
scenarios of its filtering_test.go (TestRequiredAffinitySingleNode / MultipleNodes).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from driver.api.errors import ManifestError
from driver.scheduling.podaffinity import (
    NO_AFFINITY,
    REASON_AFFINITY,
    REASON_ANTI_AFFINITY,
    REASON_EXISTING_ANTI_AFFINITY,
    pod_affinity,
)
from tests.unit.pods import HOSTNAME, ZONE, pod, selector
from tests.unit.rules_env import environment, nodes, penalties, reasons

ONE = nodes(("n1", {ZONE: "a"}))
TWO_ZONES = nodes(("n1", {ZONE: "a"}), ("n2", {ZONE: "a"}), ("n3", {ZONE: "b"}))

# (name, incoming pod, running pods, nodes, expected reason per node)
FILTER: list[tuple[str, Any, list[Any], Any, dict[str, str | None]]] = [
    (
        # upstream: "A pod that has no required pod affinity scheduling rules can schedule
        # onto a node with no existing pods"
        "no rules, no pods",
        pod("p"),
        [],
        ONE,
        {"n1": None},
    ),
    (
        # upstream: "satisfies with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity
        # using In operator that matches the existing pod"
        "affinity matched by an existing pod",
        pod("p").affinity(HOSTNAME, service="securityscan"),
        [pod("e").labels(service="securityscan").on("n1")],
        ONE,
        {"n1": None},
    ),
    (
        # upstream: "Does not satisfy the PodAffinity with labelSelector because of diff
        # Namespace" -- a term selects the pod's own namespace unless it names others
        "affinity: the matching pod is in another namespace",
        pod("p").affinity(HOSTNAME, service="securityscan"),
        [pod("e", "other").labels(service="securityscan").on("n1")],
        ONE,
        {"n1": REASON_AFFINITY},
    ),
    (
        "affinity: namespaces lists the other namespace",
        pod("p").affinity(HOSTNAME, service="securityscan", namespaces=["other"]),
        [pod("e", "other").labels(service="securityscan").on("n1")],
        ONE,
        {"n1": None},
    ),
    (
        # upstream: an empty namespaceSelector ({}) selects every namespace
        "affinity: namespaceSelector {} selects every namespace",
        pod("p").affinity(HOSTNAME, service="securityscan", namespace_selector={}),
        [pod("e", "other").labels(service="securityscan").on("n1")],
        ONE,
        {"n1": None},
    ),
    (
        # upstream: "Does not satisfy the PodAffinity because of mismatch in operator"
        "affinity: nothing matches, and the pod does not match itself",
        pod("p").affinity(HOSTNAME, service="securityscan"),
        [pod("e").labels(service="other").on("n1")],
        ONE,
        {"n1": REASON_AFFINITY},
    ),
    (
        # upstream: "The first pod of the collection that should be scheduled onto the same
        # node... should be allowed to schedule" (the pod matches its own terms and no pod in
        # the cluster matches them)
        "self-affinity: the first pod of a group passes on any node with the key",
        pod("p").labels(app="db").affinity(ZONE, app="db"),
        [],
        TWO_ZONES,
        {"n1": None, "n2": None, "n3": None},
    ),
    (
        "self-affinity: the second pod of the group must join the first one's zone",
        pod("p").labels(app="db").affinity(ZONE, app="db"),
        [pod("e").labels(app="db").on("n1")],
        TWO_ZONES,
        {"n1": None, "n2": None, "n3": REASON_AFFINITY},
    ),
    (
        # upstream satisfyPodAffinity: "All topology labels must exist on the node", even for
        # the first pod of a group
        "affinity: a node without the topology key fails",
        pod("p").labels(app="db").affinity("rack", app="db"),
        [],
        nodes(("n1", {"rack": "r1"}), ("n2", {})),
        {"n1": None, "n2": REASON_AFFINITY},
    ),
    (
        # upstream: podMatchesAllAffinityTerms -- a pod counts for the affinity only if it
        # matches every term
        "affinity: two terms, the existing pod matches only one",
        pod("p").affinity(HOSTNAME, app="db").affinity(ZONE, tier="cache"),
        [pod("e").labels(app="db").on("n1")],
        TWO_ZONES,
        {"n1": REASON_AFFINITY, "n2": REASON_AFFINITY, "n3": REASON_AFFINITY},
    ),
    (
        "affinity: two terms matched by one pod: its node and its zone",
        pod("p").affinity(ZONE, app="db").affinity(ZONE, tier="cache"),
        [pod("e").labels(app="db", tier="cache").on("n2")],
        TWO_ZONES,
        {"n1": None, "n2": None, "n3": REASON_AFFINITY},
    ),
    (
        # upstream: "satisfies the PodAntiAffinity with existing pod but doesn't match
        # PodAntiAffinity" / anti-affinity over a zone
        "anti-affinity over the zone",
        pod("p").anti(ZONE, app="web"),
        [pod("e").labels(app="web").on("n1")],
        TWO_ZONES,
        {"n1": REASON_ANTI_AFFINITY, "n2": REASON_ANTI_AFFINITY, "n3": None},
    ),
    (
        # upstream: "verify that PodAntiAffinity from existing pod is respected when pod has no
        # AntiAffinity constraints" -- symmetry
        "symmetry: an existing pod's anti-affinity keeps the incoming pod away",
        pod("p").labels(app="web"),
        [pod("e").anti(HOSTNAME, app="web").on("n1")],
        TWO_ZONES,
        {"n1": REASON_EXISTING_ANTI_AFFINITY, "n2": None, "n3": None},
    ),
    (
        "symmetry reads the existing pod's namespace scope",
        pod("p", "other").labels(app="web"),
        [pod("e").anti(HOSTNAME, app="web").on("n1")],
        TWO_ZONES,
        {"n1": None, "n2": None, "n3": None},
    ),
    (
        # upstream Filter order: affinity, then anti-affinity, then existing anti-affinity
        "affinity is reported before anti-affinity",
        pod("p").labels(app="web").affinity(HOSTNAME, app="db").anti(HOSTNAME, app="web"),
        [pod("e").labels(app="web").on("n1")],
        ONE,
        {"n1": REASON_AFFINITY},
    ),
    (
        "anti-affinity is reported before the existing pods' anti-affinity",
        pod("p").labels(app="web").anti(HOSTNAME, app="web"),
        [pod("e").labels(app="web").anti(HOSTNAME, app="web").on("n1")],
        ONE,
        {"n1": REASON_ANTI_AFFINITY},
    ),
    (
        # matchLabelKeys: key In (the pod's value), merged as the API server merges it
        "matchLabelKeys: only pods of the same version repel",
        pod("p").labels(app="web", version="v2").anti(HOSTNAME, app="web", match_keys=("version",)),
        [
            pod("e1").labels(app="web", version="v1").on("n1"),
            pod("e2").labels(app="web", version="v2").on("n2"),
        ],
        TWO_ZONES,
        {"n1": None, "n2": REASON_ANTI_AFFINITY, "n3": None},
    ),
    (
        "mismatchLabelKeys: only pods of another tenant repel",
        pod("p").labels(tenant="t1").anti(HOSTNAME, label_selector={}, mismatch_keys=("tenant",)),
        [
            pod("e1").labels(tenant="t1").on("n1"),
            pod("e2").labels(tenant="t2").on("n2"),
        ],
        TWO_ZONES,
        {"n1": None, "n2": REASON_ANTI_AFFINITY, "n3": None},
    ),
    (
        # a null labelSelector selects nothing (LabelSelectorAsSelector(nil) is Nothing)
        "a term without a labelSelector selects nothing",
        pod("p").anti(HOSTNAME),
        [pod("e").labels(app="web").on("n1")],
        ONE,
        {"n1": None},
    ),
    (
        # terminating pods still count for pod affinity (only spreading skips them)
        "a terminating pod still repels",
        pod("p").anti(HOSTNAME, app="web"),
        [pod("e").labels(app="web").terminating().on("n1")],
        ONE,
        {"n1": REASON_ANTI_AFFINITY},
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


def test_namespace_selector_reads_namespace_labels() -> None:
    """``namespaceSelector`` matches the labels of the existing pod's namespace (and, for an
    existing pod's term, of the incoming pod's namespace); a namespace the engine was not told
    about still carries ``kubernetes.io/metadata.name``."""
    running = [pod("e", "team-a").labels(app="web").on("n1").json()]
    cluster = nodes(("n1", {}), ("n2", {}))
    by_label = pod("p").anti(HOSTNAME, app="web", namespace_selector=selector(team="a"))
    env = environment(cluster, running, namespaces={"team-a": {"team": "a"}})
    assert reasons(env, by_label.json()) == {"n1": REASON_ANTI_AFFINITY, "n2": None}
    env = environment(cluster, running)  # the namespace's labels are not known
    assert reasons(env, by_label.json()) == {"n1": None, "n2": None}
    by_name = pod("p").anti(
        HOSTNAME,
        app="web",
        namespace_selector=selector(**{"kubernetes.io/metadata.name": "team-a"}),
    )
    assert reasons(env, by_name.json())["n1"] == REASON_ANTI_AFFINITY
    # symmetry: the existing pod's term reads the incoming pod's namespace labels
    existing = [
        pod("e").anti(HOSTNAME, app="web", namespace_selector=selector(team="b")).on("n1").json()
    ]
    env = environment(cluster, existing, namespaces={"team-b": {"team": "b"}})
    incoming = pod("p", "team-b").labels(app="web").json()
    assert reasons(env, incoming) == {"n1": REASON_EXISTING_ANTI_AFFINITY, "n2": None}


def test_counts_follow_pods_added_and_removed() -> None:
    """PreFilter's counts are kept up to date (AddPod/RemovePod): the index's counters follow
    every pod, so a decision after a removal sees the node free again."""
    cluster = nodes(("n1", {}), ("n2", {}))
    env = environment(cluster, [pod("e").labels(app="web").on("n1").json()])
    incoming = pod("p").anti(HOSTNAME, app="web").json()
    assert reasons(env, incoming)["n1"] == REASON_ANTI_AFFINITY
    env.index.remove("uid-e")
    assert reasons(env, incoming)["n1"] is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}},
            "topologyKey",
        ),
        (
            {
                "podAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 0, "podAffinityTerm": {"topologyKey": HOSTNAME}}
                    ]
                }
            },
            "weight must be an integer in 1..100",
        ),
        (
            {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "topologyKey": HOSTNAME,
                            "labelSelector": {
                                "matchExpressions": [
                                    {"key": "a", "operator": "Gt", "values": ["1"]}
                                ]
                            },
                        }
                    ]
                }
            },
            "unknown label selector operator 'Gt'",
        ),
    ],
)
def test_malformed_terms_are_refused_with_the_field(spec: dict[str, Any], message: str) -> None:
    raw = pod("p").json()
    raw["spec"]["affinity"] = spec
    with pytest.raises(ManifestError, match=message):
        pod_affinity(raw, "pod default/p")


@pytest.mark.parametrize(
    "spec",
    [
        None,
        {},
        {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
        {"podAffinity": None, "podAntiAffinity": {}},
        {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
        {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": None}},
    ],
)
def test_a_pod_without_pod_affinity_terms_has_none(spec: dict[str, Any] | None) -> None:
    raw = pod("p").labels(app="web").json()
    raw["spec"]["affinity"] = spec
    assert pod_affinity(raw, "pod default/p") is NO_AFFINITY


@pytest.mark.parametrize("spec", ["x", [1], {"podAffinity": 1}, {"podAntiAffinity": "x"}])
def test_a_malformed_affinity_without_terms_is_refused(spec: Any) -> None:
    raw = pod("p").json()
    raw["spec"]["affinity"] = spec
    with pytest.raises(ManifestError, match="must be an object"):
        pod_affinity(raw, "pod default/p")


# --------------------------------------------------------------------------- score


def test_preferred_anti_affinity_prefers_domains_without_matches() -> None:
    """scoring.go processTerm: -weight per matching pod in the domain; normalised between the
    extremes: 0 penalty where no pod matches, the full weight on the most crowded domain."""
    cluster = nodes(("n1", {}), ("n2", {}), ("n3", {}))
    running = [
        pod("e1").labels(app="web").on("n1").json(),
        pod("e2").labels(app="web").on("n1").json(),
        pod("e3").labels(app="web").on("n2").json(),
    ]
    env = environment(cluster, running)
    got = penalties(env, pod("p").anti(HOSTNAME, weight=100, app="web").json())
    assert got == {"n1": Fraction(2), "n2": Fraction(1), "n3": Fraction(0)}  # weight 2 x [0, 1]


def test_preferred_affinity_and_existing_pods_preferences_add_up() -> None:
    """processExistingPod: an existing pod's required affinity term that matches the incoming
    pod adds hardPodAffinityWeight (1), its preferred terms add (anti: subtract) their weight;
    the incoming pod's preferred affinity adds its weight per matching pod."""
    cluster = nodes(("n1", {ZONE: "a"}), ("n2", {ZONE: "b"}), ("n3", {ZONE: "c"}))
    running = [
        pod("db").labels(app="db").on("n1").json(),
        pod("fan").affinity(ZONE, app="web").on("n2").json(),  # required, towards app=web
        pod("shy").anti(ZONE, weight=10, app="web").on("n3").json(),
    ]
    env = environment(cluster, running)
    incoming = pod("p").labels(app="web").affinity(ZONE, weight=4, app="db").json()
    # raw per zone: a +4 (db), b +1 (fan's required term), c -10 (shy): high 4, low -10
    got = penalties(env, incoming)
    assert got == {"n1": Fraction(0), "n2": 2 * Fraction(4 - 1, 14), "n3": Fraction(2)}

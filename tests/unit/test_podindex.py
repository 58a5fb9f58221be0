"""The pod index (driver.scheduling.podindex): counters registered once and kept up to date by
every add and remove equal counters registered afresh; term carriers follow the pods that carry
a term; node label changes re-derive the domains; namespace label changes drop the counters that
select namespaces by label."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from driver.api.labels import LabelSelector
from driver.scheduling.podaffinity import PodMatcher
from driver.scheduling.podindex import (
    MAX_COUNTERS,
    MatchKey,
    PodIndex,
    ScheduledPod,
    same_view,
)
from tests.unit.pods import HOSTNAME, ZONE, pod

NODES = {f"n{i}": {HOSTNAME: f"n{i}", ZONE: "ab"[i % 2]} for i in range(4)}


def key(**labels: str) -> MatchKey:
    return MatchKey((PodMatcher(LabelSelector.from_labels(labels), frozenset({"default"})),))


def scheduled(name: str, **labels: str) -> ScheduledPod:
    return ScheduledPod.from_pod(pod(name).labels(**labels).json(), f"uid-{name}")


def test_counters_follow_adds_and_removes() -> None:
    rng = random.Random(7)
    index = PodIndex()
    index.set_nodes(NODES)
    keys = [key(app="a"), key(app="b"), key(app="a", tier="x")]
    for k in keys:
        index.counter(k).domains(ZONE)  # registered early: kept up to date from here on
    placed: dict[str, str] = {}
    for step in range(200):
        if placed and rng.random() < 0.4:
            uid = rng.choice(sorted(placed))
            index.remove(uid)
            del placed[uid]
        else:
            name = f"p{step}"
            labels = {"app": rng.choice("ab")}
            if rng.random() < 0.5:
                labels["tier"] = "x"
            node = rng.choice(sorted(NODES))
            index.add(f"uid-{name}", node, scheduled(name, **labels))
            placed[f"uid-{name}"] = node
    fresh = PodIndex()
    fresh.set_nodes(NODES)
    for uid, (node, one) in index.pods().items():
        fresh.add(uid, node, one)
    for k in keys:
        kept, new = index.counter(k), fresh.counter(k)
        assert kept.per_node == new.per_node
        assert kept.domains(ZONE) == new.domains(ZONE)
        assert kept.domains(HOSTNAME) == new.domains(HOSTNAME)


def test_carriers_count_the_pods_that_carry_a_term() -> None:
    index = PodIndex()
    index.set_nodes(NODES)
    for i, node in enumerate(("n0", "n0", "n1")):
        raw = pod(f"w{i}").labels(app="web").anti(HOSTNAME, app="web").on(node).json()
        index.add(f"uid-w{i}", node, ScheduledPod.from_pod(raw, f"uid-w{i}"))
    (carrier,) = index.carriers("required_anti")
    assert carrier.domains == {"n0": 2, "n1": 1}
    for i in range(3):
        index.remove(f"uid-w{i}")
    assert list(index.carriers("required_anti")) == []


def test_node_labels_re_derive_domains() -> None:
    index = PodIndex()
    index.set_nodes(NODES)
    index.add("uid-p", "n0", scheduled("p", app="a"))
    index.add("uid-q", "gone", scheduled("q", app="a"))  # a node not known yet counts nowhere
    counter = index.counter(key(app="a"))
    assert counter.domains(ZONE) == {"a": 1}
    index.set_nodes({**NODES, "n0": {ZONE: "c"}, "gone": {ZONE: "a"}})
    assert counter.domains(ZONE) == {"c": 1, "a": 1}


def test_namespace_labels_drop_counters_that_select_namespaces_by_label() -> None:
    index = PodIndex()
    index.set_nodes(NODES)
    index.add(
        "uid-p", "n0", ScheduledPod.from_pod(pod("p", "team").labels(app="a").json(), "uid-p")
    )
    by_label = MatchKey(
        (
            PodMatcher(
                LabelSelector.from_labels({"app": "a"}),
                frozenset(),
                LabelSelector.from_labels({"t": "1"}),
            ),
        )
    )
    assert index.counter(by_label).per_node == {}
    assert index.set_namespace("team", {"t": "1"})
    assert index.counter(by_label).per_node == {"n0": 1}
    assert not index.set_namespace("team", {"t": "1"})


def test_counters_past_the_limit_are_dropped_least_recently_used_first() -> None:
    index = PodIndex()
    first = key(app="first")
    index.counter(first)
    for i in range(MAX_COUNTERS):
        index.counter(key(app=f"x{i}"))
    index.add("uid-p", "n0", scheduled("p", app="first"))
    assert index.counter(first).per_node == {"n0": 1}  # registered again, with a scan


def test_one_node_relabelled_moves_its_pods_between_domains() -> None:
    """A node's zone changing moves its pods' counts as re-deriving every domain would."""
    index, fresh = PodIndex(), PodIndex()
    index.set_nodes(NODES)
    counter = index.counter(key(app="a"))
    for i, node in enumerate(("n0", "n0", "n1")):
        index.add(f"uid-p{i}", node, scheduled(f"p{i}", app="a"))
        raw = pod(f"w{i}").labels(app="a").anti(ZONE, app="a").on(node).json()
        index.add(f"uid-w{i}", node, ScheduledPod.from_pod(raw, f"uid-w{i}"))
    assert counter.domains(ZONE) == {"a": 4, "b": 2}
    index.set_node_labels("n0", {HOSTNAME: "n0", ZONE: "c"})
    index.set_node_labels("n3", None)
    relabelled = {**NODES, "n0": {HOSTNAME: "n0", ZONE: "c"}}
    del relabelled["n3"]
    fresh.set_nodes(relabelled)
    for uid, (node, one) in index.pods().items():
        fresh.add(uid, node, one)
    assert counter.domains(ZONE) == fresh.counter(key(app="a")).domains(ZONE) == {"c": 4, "b": 2}
    (kept,) = index.carriers("required_anti")
    (new,) = fresh.carriers("required_anti")
    assert kept.domains == new.domains == {"c": 2, "b": 1}


def _over(
    domains: dict[str, int], nodes: dict[str, dict[str, str]], key: str, more: int
) -> set[str]:
    """The nodes whose domain of ``key`` holds more than ``more`` pods, from scratch."""
    return {n for n, labels in nodes.items() if domains.get(labels.get(key, ""), 0) > more}


def test_node_sets_over_a_threshold_follow_adds_removes_and_relabels() -> None:
    """The nodes a counter or a carrier keeps as over a threshold (what anti-affinity excludes,
    what spreading penalises) always equal those its domain counts give, from registration on:
    through adds, removes, a node relabelled, a node gone, and the nodes replaced."""
    rng = random.Random(11)
    nodes = {f"n{i}": {HOSTNAME: f"n{i}", ZONE: "abc"[i % 3]} for i in range(9)}
    index = PodIndex()
    index.set_nodes(nodes)
    counter = index.counter(key(app="a"))
    counter.over(HOSTNAME, 0)  # registered early: kept up to date from here on
    counter.over(ZONE, 1)
    placed: list[str] = []
    for step in range(300):
        if step == 150:
            nodes = {**nodes, "n0": {HOSTNAME: "n0", ZONE: "c"}}
            index.set_node_labels("n0", nodes["n0"])
        if step == 200:
            nodes = {**nodes, "n9": {HOSTNAME: "n9", ZONE: "a"}}
            index.set_node_labels("n9", nodes["n9"])
        if step == 250:
            index.set_nodes(nodes)
        if placed and rng.random() < 0.4:
            index.remove(placed.pop(rng.randrange(len(placed))))
        else:
            node = rng.choice(sorted(nodes))
            raw = pod(f"p{step}").labels(app="a").anti(HOSTNAME, app="a").on(node).json()
            index.add(f"uid-p{step}", node, ScheduledPod.from_pod(raw, f"uid-p{step}"))
            placed.append(f"uid-p{step}")
        carriers = list(index.carriers("required_anti"))
        for topology_key, more in ((HOSTNAME, 0), (ZONE, 1), (ZONE, 0)):
            domains = dict(counter.domains(topology_key))
            assert counter.over(topology_key, more) == _over(domains, nodes, topology_key, more)
        for carrier in carriers:
            assert carrier.over() == _over(carrier.domains, nodes, HOSTNAME, 0)


def _bound(raw: dict[str, Any]) -> dict[str, Any]:
    bound = copy.deepcopy(raw)
    bound["spec"]["nodeName"] = "n1"
    bound["status"] = {"conditions": [{"type": "PodScheduled", "status": "True"}]}
    return bound


def _relabel(raw: dict[str, Any]) -> None:
    raw["metadata"]["labels"]["app"] = "b"


def _rename(raw: dict[str, Any]) -> None:
    raw["metadata"]["name"] = "other"


def _terminate(raw: dict[str, Any]) -> None:
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"


def _resize(raw: dict[str, Any]) -> None:
    raw["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}


def _priority(raw: dict[str, Any]) -> None:
    raw["spec"]["priority"] = 7


def _no_spec(raw: dict[str, Any]) -> None:
    raw["spec"] = []


@pytest.mark.parametrize(
    ("change", "same"),
    [
        (None, True),
        (_relabel, False),
        (_rename, False),
        (_terminate, False),
        (_resize, False),
        (_priority, False),
        (_no_spec, False),
    ],
)
def test_same_view_is_true_only_where_from_pod_reads_the_same(change: Any, same: bool) -> None:
    raw = pod("p").labels(app="a").anti(HOSTNAME, app="a").json()
    raw["spec"].setdefault("containers", [{"name": "c"}])
    bound = _bound(raw)
    if change is not None:
        change(bound)
    assert same_view(raw, bound) is same
    if same:
        assert ScheduledPod.from_pod(raw, "u") == ScheduledPod.from_pod(bound, "u")

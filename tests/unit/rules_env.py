"""Rule-level test harness: a pod's :class:`~driver.scheduling.rules.PodRules` against a set of
nodes and running pods, as the engine builds them (PreFilter), read per node (Filter/Score)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from driver.api.nodes import Node
from driver.scheduling.nodefit import PodSchedulingFacts
from driver.scheduling.podindex import PodIndex, ScheduledPod
from driver.scheduling.rules import PodRules, RuleEnvironment, pod_rules
from driver.scheduling.topologyspread import DefaultSpreading
from tests.unit.builders import node, to_node

JSON = dict[str, Any]


def nodes(*specs: tuple[str, Mapping[str, str]], **kwargs: Any) -> list[Node]:
    """Nodes by (name, labels); every node gets its hostname label."""
    return [to_node(node(name, labels=dict(labels), **kwargs)) for name, labels in specs]


def environment(
    cluster: Iterable[Node],
    running: Iterable[JSON] = (),
    *,
    spreading: DefaultSpreading | None = None,
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    owners: Iterable[tuple[str, str, str, Any]] = (),
) -> RuleEnvironment:
    index = PodIndex()
    env = RuleEnvironment(index, spreading or DefaultSpreading((), system=False))
    env.set_nodes({n.name: n for n in cluster})
    for name, labels in (namespaces or {}).items():
        index.set_namespace(name, labels)
    for kind, namespace, name, owner_selector in owners:
        env.owners.observe(kind, namespace, name, owner_selector)
    for raw in running:
        uid = raw["metadata"]["uid"]
        index.add(uid, raw["spec"]["nodeName"], ScheduledPod.from_pod(raw, uid))
    return env


def rules_for(env: RuleEnvironment, raw: JSON) -> PodRules | None:
    uid = raw["metadata"]["uid"]
    return pod_rules(env, raw, ScheduledPod.from_pod(raw, uid), PodSchedulingFacts.from_pod(raw))


def reasons(env: RuleEnvironment, raw: JSON) -> dict[str, str | None]:
    """Each node's filter reason for the pod (None: it passes)."""
    rules = rules_for(env, raw)
    return {name: (rules.reason(n) if rules is not None else None) for name, n in env.nodes.items()}


def penalties(env: RuleEnvironment, raw: JSON) -> dict[str, Fraction]:
    """Each node's weighted soft penalty for the pod."""
    rules = rules_for(env, raw)
    return {
        name: (rules.penalty(n) if rules is not None else Fraction(0))
        for name, n in env.nodes.items()
    }

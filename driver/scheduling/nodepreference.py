"""The node-only soft rules: preferred node affinity (kube-scheduler's NodeAffinity score) and
``PreferNoSchedule`` taints (its TaintToleration score).

* **Preferred node affinity**: each ``preferredDuringSchedulingIgnoredDuringExecution`` term
  (weight 1..100, a node selector term: ``matchExpressions`` and ``matchFields``) adds its
  weight on the nodes it matches; an empty term matches nothing (upstream). Upstream divides by
  the largest sum over the nodes that passed the filters; biaxial by the sum of all the pod's
  weights, so a node's score does not depend on the others: the penalty is
  ``1 - matched / total``.
* **PreferNoSchedule taints**: a node's count of ``PreferNoSchedule`` taints the pod does not
  tolerate, counting only tolerations whose effect is empty or ``PreferNoSchedule``
  (``getAllTolerationPreferNoSchedule``). Upstream divides by the largest count over the
  filtered nodes; biaxial by the largest count of such taints on any node of the cluster: the
  penalty is ``count / largest``.

Both penalties lie in [0, 1]; ``docs/scoring.md`` gives their weights. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final

from driver.api.errors import ManifestError
from driver.api.nodes import Node, node_selector_matches
from driver.scheduling.nodefit import PodToleration

PREFER_NO_SCHEDULE: Final = "PreferNoSchedule"


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    """One preferred scheduling term: its weight and its node selector term (raw JSON)."""

    weight: int
    selector: Mapping[str, Any]  # a NodeSelector with the one term, for node_selector_matches


def preferred_node_terms(pod: Mapping[str, Any], where: str = "pod") -> tuple[PreferredTerm, ...]:
    """The pod's preferred node affinity terms (weight-0 terms are skipped, as upstream)."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    raw = affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    field_name = (
        f"{where}: spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    )
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise ManifestError(f"{field_name} must be a list")
    out = []
    for i, term in enumerate(raw):
        if not isinstance(term, Mapping):
            raise ManifestError(f"{field_name}[{i}] must be an object")
        weight = term.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 100:
            raise ManifestError(f"{field_name}[{i}].weight must be an integer in 1..100")
        preference = term.get("preference") or {}
        if not isinstance(preference, Mapping):
            raise ManifestError(f"{field_name}[{i}].preference must be an object")
        if weight:
            out.append(PreferredTerm(weight, {"nodeSelectorTerms": [dict(preference)]}))
    return tuple(out)


def node_affinity_penalty(terms: Sequence[PreferredTerm], node: Node, where: str) -> Fraction:
    """``1 - (weights of the terms the node matches) / (all weights)`` (0 without terms)."""
    total = sum(t.weight for t in terms)
    if not total:
        return Fraction(0)
    matched = sum(t.weight for t in terms if node_selector_matches(t.selector, node, where))
    return Fraction(total - matched, total)


def soft_tolerations(tolerations: Iterable[PodToleration]) -> tuple[PodToleration, ...]:
    """The tolerations that can tolerate a PreferNoSchedule taint."""
    return tuple(t for t in tolerations if t.effect in ("", PREFER_NO_SCHEDULE))


def intolerable_soft_taints(tolerations: Sequence[PodToleration], node: Node) -> int:
    """How many of the node's PreferNoSchedule taints none of ``tolerations`` tolerates."""
    return sum(
        1
        for taint in node.taints
        if taint.effect == PREFER_NO_SCHEDULE
        and not any(t.tolerates(taint.key, taint.value, taint.effect) for t in tolerations)
    )


def soft_taint_count(node: Node) -> int:
    """The node's PreferNoSchedule taints (the cluster's largest count scales the penalty)."""
    return sum(1 for taint in node.taints if taint.effect == PREFER_NO_SCHEDULE)


def taint_penalty(count: int, largest: int) -> Fraction:
    """``count / largest`` (0 when no node of the cluster has such a taint)."""
    return Fraction(count, largest) if largest else Fraction(0)

"""Preemption: which lower-priority pods to remove, and on which node, so that a pod fits.

kube-scheduler's ``DefaultPreemption`` (``pkg/scheduler/framework/preemption`` and
``plugins/defaultpreemption``), as pure functions over what the decision engine knows:

* :func:`may_preempt`: a pod with ``preemptionPolicy: Never`` never preempts;
* :func:`candidate_count` and :func:`candidate_offset`: how many candidate nodes the dry run
  collects (``MinCandidateNodesPercentage`` 10 % of the nodes, at least
  ``MinCandidateNodesAbsolute`` 100, at most all) and where in the node list it starts
  (upstream draws a random offset; here it is derived from the pod's UID, so the same cluster
  and pod always give the same answer while different pods still start in different places);
* :func:`select_victims`: on one node, the minimal set of victims. Every pod of strictly lower
  priority is a potential victim (pods of equal or higher priority never are); all are removed
  and the pod must then fit (else the node is no candidate); then, most important first
  (:func:`more_important`: higher priority, then earlier start), the potential victims whose
  eviction would violate a PodDisruptionBudget are put back one at a time, then the others,
  each staying when the pod still fits with it (*reprieved*), becoming a victim otherwise.
  ``fits`` answers "does the pod fit on the node with these pods removed?" and is where the
  engine counts what victims free: their cpu, memory and ports, their place in the rules
  between pods, and the devices of claims that no remaining pod reserves;
* :class:`Verdict`: one node's answer told by positions in its potential victims (most
  important first), so that the engine can give the same answer to a node whose victim search
  would read exactly the same things (:func:`verdict_of` and :func:`victims_by`; which nodes
  those are is the engine's to say);
* :func:`budget_violations`: which potential victims a PodDisruptionBudget protects, counted
  as upstream's ``filterPodsWithPDBViolation`` (each matching budget's
  ``status.disruptionsAllowed`` is decremented per pod in order; a pod already in its
  ``status.disruptedPods`` is not counted; a budget with an empty selector matches nothing);
* :func:`pick_one`: among candidates, upstream's ``pickOneNodeForPreemption`` order (fewest
  budget violations, lowest highest-victim priority, smallest sum of priorities, fewest
  victims, latest start of the highest-priority victims), then the caller's tie-break (the
  pod's two-axis rank on the node), then the node name.

Nothing here mutates its inputs; ``fits`` is called with the set of removed pods and may keep
state between calls (the engine applies only the difference).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from driver.api.errors import ManifestError
from driver.api.labels import LabelSelector

MIN_CANDIDATE_NODES_PERCENTAGE: Final = 10
MIN_CANDIDATE_NODES_ABSOLUTE: Final = 100
_INT32_SHIFT: Final = 2**31  # upstream adds MaxInt32+1 so that every priority counts >= 0
#: A pod without ``status.startTime`` counts as started now (upstream ``GetPodStartTime``):
#: later than any pod that has one.
NOT_STARTED: Final = math.inf


def pod_priority(pod: Mapping[str, Any], where: str = "pod") -> int:
    """``spec.priority`` as the API server admitted it (0 when absent, as upstream's
    ``corev1helpers.PodPriority``); a priority class that is missing later changes nothing.
    ManifestError naming ``where`` when it is not an integer."""
    value = (pod.get("spec") or {}).get("priority")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(f"{where}: spec.priority must be an integer, not {value!r}")
    return value


def may_preempt(pod: Mapping[str, Any]) -> bool:
    """Whether the pod may preempt others (``preemptionPolicy`` is not ``Never``)."""
    return (pod.get("spec") or {}).get("preemptionPolicy") != "Never"


@dataclass(frozen=True, slots=True)
class PodOnNode:
    """A pod running on a node, as the victim search reads it."""

    uid: str
    namespace: str
    name: str
    priority: int
    start: float = NOT_STARTED  # status.startTime, seconds since the epoch
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A PodDisruptionBudget as preemption reads it."""

    namespace: str
    name: str
    selector: LabelSelector | None  # None: the budget's selector is missing or invalid
    allowed: int  # status.disruptionsAllowed
    disrupted: frozenset[str] = frozenset()  # status.disruptedPods (pod names)

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> DisruptionBudget:
        meta = raw.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        status = raw.get("status") or {}
        selector: LabelSelector | None = None
        spec_selector = (raw.get("spec") or {}).get("selector")
        if spec_selector is not None:
            try:
                selector = LabelSelector.from_api(spec_selector, f"pdb {namespace}/{name}")
            except ManifestError:
                selector = None  # upstream: an invalid selector matches no pod
        return cls(
            namespace=namespace,
            name=name,
            selector=selector,
            allowed=int(status.get("disruptionsAllowed") or 0),
            disrupted=frozenset(str(k) for k in (status.get("disruptedPods") or {})),
        )


@dataclass(frozen=True, slots=True)
class NodeVictims:
    """One candidate: the node, its victims (most important first) and how many of them
    violate a PodDisruptionBudget."""

    node: str
    victims: tuple[PodOnNode, ...]
    violations: int


def importance(pod: PodOnNode) -> tuple[float, float, str, str]:
    """Sort key, most important first: higher priority, then earlier start (upstream
    ``MoreImportantPod``), then namespace/name so the order is total."""
    return (-pod.priority, pod.start, pod.namespace, pod.name)


def more_important(a: PodOnNode, b: PodOnNode) -> bool:
    return importance(a) < importance(b)


def candidate_count(nodes: int) -> int:
    """How many candidates the dry run collects (upstream ``calculateNumCandidates``)."""
    wanted = max(nodes * MIN_CANDIDATE_NODES_PERCENTAGE // 100, MIN_CANDIDATE_NODES_ABSOLUTE)
    return min(wanted, nodes)


def candidate_offset(uid: str, nodes: int) -> int:
    """Where the dry run starts in the node list: stable per pod (see the module
    docstring)."""
    if nodes <= 0:
        return 0
    return zlib.crc32(uid.encode()) % nodes


def _budget_matches(budget: DisruptionBudget, pod: PodOnNode) -> bool:
    if budget.namespace != pod.namespace or budget.selector is None:
        return False
    if budget.selector.empty:
        return False  # a budget with an empty selector matches nothing (upstream)
    return budget.selector.matches(pod.labels)


def budget_violations(
    pods: Sequence[PodOnNode], budgets: Sequence[DisruptionBudget]
) -> tuple[list[PodOnNode], list[PodOnNode]]:
    """``pods`` split into (violating, not violating), order kept (upstream
    ``filterPodsWithPDBViolation``)."""
    allowed = [b.allowed for b in budgets]
    violating: list[PodOnNode] = []
    fine: list[PodOnNode] = []
    for pod in pods:
        violated = False
        if pod.labels:  # a pod without labels matches no budget
            for i, budget in enumerate(budgets):
                if not _budget_matches(budget, pod) or pod.name in budget.disrupted:
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        (violating if violated else fine).append(pod)
    return violating, fine


def potential_victims(priority: int, pods: Sequence[PodOnNode]) -> list[PodOnNode]:
    """The pods that a pod of ``priority`` may evict: strictly lower priority, most important
    first (the order the reprieve loop of :func:`select_victims` follows)."""
    return sorted((p for p in pods if p.priority < priority), key=importance)


def select_victims(
    node: str,
    priority: int,
    pods: Sequence[PodOnNode],
    budgets: Sequence[DisruptionBudget],
    fits: Callable[[frozenset[str]], bool],
) -> NodeVictims | None:
    """The minimal victims on ``node`` for a pod of ``priority`` (see the module docstring);
    None when no lower-priority pod is there, the pod does not fit even without all of them,
    or it fits with none removed. ``fits(removed)``: whether the pod fits with the pods whose
    UIDs are ``removed`` gone."""
    potential = potential_victims(priority, pods)
    if not potential:
        return None
    removed = {p.uid for p in potential}
    if not fits(frozenset(removed)):
        return None
    violating, fine = budget_violations(potential, budgets)
    victims: list[PodOnNode] = []
    violations = 0
    for group, counts in ((violating, True), (fine, False)):
        for pod in group:
            removed.discard(pod.uid)
            if fits(frozenset(removed)):
                continue  # reprieved
            removed.add(pod.uid)
            victims.append(pod)
            violations += counts
    if not victims:
        return None  # it fits without preemption (upstream: not a candidate)
    victims.sort(key=importance)
    return NodeVictims(node, tuple(victims), violations)


@dataclass(frozen=True, slots=True)
class Verdict:
    """:func:`select_victims`' answer on one node as positions in its potential victims
    (:func:`potential_victims`' order): the victims' positions, most important first, and how
    many of them violate a budget."""

    positions: tuple[int, ...]
    violations: int


def verdict_of(found: NodeVictims | None, potential: Sequence[PodOnNode]) -> Verdict | None:
    """``found`` (an answer for the node whose potential victims are ``potential``) by
    positions; None stays None."""
    if found is None:
        return None
    at = {p.uid: i for i, p in enumerate(potential)}
    return Verdict(tuple(at[v.uid] for v in found.victims), found.violations)


def victims_by(
    node: str, potential: Sequence[PodOnNode], verdict: Verdict | None
) -> NodeVictims | None:
    """The answer on ``node`` (potential victims ``potential``) that ``verdict`` tells."""
    if verdict is None:
        return None
    return NodeVictims(node, tuple(potential[i] for i in verdict.positions), verdict.violations)


def _earliest_top_start(candidate: NodeVictims) -> float:
    """The earliest start among the candidate's highest-priority victims (upstream
    ``GetEarliestPodStartTime``)."""
    top = candidate.victims[0].priority
    return min(v.start for v in candidate.victims if v.priority == top)


def preference(candidate: NodeVictims) -> tuple[int, int, int, int, float]:
    """Upstream's ``pickOneNodeForPreemption`` criteria as one key (smaller is better)."""
    victims = candidate.victims
    return (
        candidate.violations,
        victims[0].priority,
        sum(v.priority + _INT32_SHIFT for v in victims),
        len(victims),
        -_earliest_top_start(candidate),
    )


def pick_one(
    candidates: Sequence[NodeVictims],
    tie: Callable[[str], Any] | None = None,
) -> NodeVictims | None:
    """The best candidate (see the module docstring); ``tie(node)`` orders the candidates
    that upstream's criteria leave equal (smaller is better), then the node name."""
    if not candidates:
        return None
    best_key = min(preference(c) for c in candidates)
    tied = [c for c in candidates if preference(c) == best_key]
    if len(tied) == 1 or tie is None:
        return min(tied, key=lambda c: c.node)
    return min(tied, key=lambda c: (tie(c.node), c.node))

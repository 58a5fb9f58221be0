"""The rules between a pod and the pods already placed, and every soft rule, for one decision:
kube-scheduler's PreFilter/PreScore state, computed once per pod from the
:class:`~driver.scheduling.podindex.PodIndex` and read per node.

:func:`pod_rules` builds a :class:`PodRules` for the pod being placed:

* **filters**, in kube-scheduler's order after the node filter
  (:mod:`driver.scheduling.nodefit`, which has NodePorts): PodTopologySpread's
  ``DoNotSchedule`` constraints (the pod's own, else the configured default ones), then
  InterPodAffinity (:mod:`driver.scheduling.podaffinity`). :meth:`PodRules.reason` is
  O(constraints + terms) per node;
* **score terms**, each a penalty in [0, 1] (0 best), weighted as ``docs/scoring.md``
  documents (:mod:`driver.scheduling.scoring`): preferred node affinity and ``PreferNoSchedule``
  taints (:mod:`driver.scheduling.nodepreference`), ``ScheduleAnyway`` spreading (the pod's own
  or a configured default list), preferred pod (anti-)affinity both ways.
  :meth:`PodRules.penalty` is their weighted sum for one node;
* the **tie-break** of kube-scheduler's System default spreading (:meth:`PodRules.tie_break`):
  it orders nodes whose scores are equal.

:class:`RuleEnvironment` is what rules read besides the pod and stays with the engine: the
nodes, the pod index, the owners' selectors, the default spreading, and a cache of the node
sets a spread constraint counts over (per inclusion policy and topology keys; dropped when the
nodes change). Counts come from the index's counters; nothing iterates over every pod. Pure
otherwise: nothing here mutates the pod or the index's pods.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from driver.api.nodes import Node, node_selector_matches
from driver.scheduling.nodefit import PodSchedulingFacts, PodToleration
from driver.scheduling.nodepreference import (
    PreferredTerm,
    intolerable_soft_taints,
    node_affinity_penalty,
    preferred_node_terms,
    soft_taint_count,
    soft_tolerations,
    taint_penalty,
)
from driver.scheduling.podaffinity import (
    HARD_POD_AFFINITY_WEIGHT,
    AffinityFilter,
    AffinityScore,
    DomainCounts,
    PodMatcher,
    add_scores,
    matches_all,
)
from driver.scheduling.podindex import MatchCounter, MatchKey, NodeSet, PodIndex, ScheduledPod
from driver.scheduling.scoring import (
    WEIGHT_NODE_AFFINITY,
    WEIGHT_POD_AFFINITY,
    WEIGHT_SPREAD,
    WEIGHT_TAINTS,
)
from driver.scheduling.topologyspread import (
    DefaultSpreading,
    OwnerSelectors,
    SpreadConstraint,
    SpreadCounts,
    default_constraints,
    global_minimum,
    pod_constraints,
    spread_estimator,
    spread_penalties,
    spread_penalty,
    spread_reason,
)

_MAX_NODE_SETS: Final = 64
_MAX_PARSED: Final = 256  # pods' own spread constraints kept parsed (per distinct list)
_FEW_DOMAINS: Final = 64  # a key with at most this many domains is read by value, not node
_FILTERING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True, slots=True)
class _NodeSet:
    """The nodes a spread constraint counts over, and per topology key their domains."""

    names: frozenset[str] | None  # None: every node with the keys (no policy restricts)
    domains: Mapping[str, int]  # per key: how many distinct values
    complete: bool  # every node of the cluster is in the set


class RuleEnvironment:
    """What the rules read besides the pod (see the module docstring)."""

    def __init__(
        self,
        index: PodIndex,
        spreading: DefaultSpreading | None = None,
        owners: OwnerSelectors | None = None,
    ) -> None:
        self.index = index
        self.spreading = spreading or DefaultSpreading()
        self.owners = owners or OwnerSelectors()
        self.nodes: Mapping[str, Node] = {}
        self.soft_taints = 0  # the most PreferNoSchedule taints of any node
        self.generation = 0  # counts the changes to the nodes (their labels)
        # The pods' own spread constraints, parsed, by their text (and the pod's labels
        # where matchLabelKeys reads them): the replicas of a workload share one list.
        self._parsed: dict[str, tuple[SpreadConstraint, ...]] = {}
        self._node_sets: OrderedDict[tuple[Any, ...], _NodeSet] = OrderedDict()

    def set_nodes(self, nodes: Mapping[str, Node]) -> None:
        """The cluster's nodes changed (the engine rebuilt): relabel and drop node sets."""
        self.nodes = nodes
        self.index.set_nodes({name: node.labels for name, node in nodes.items()})
        self.soft_taints = max((soft_taint_count(n) for n in nodes.values()), default=0)
        self._node_sets.clear()
        self.generation += 1

    def node_changed(self, name: str, node: Node | None) -> None:
        """One node came, changed or (None) went (``nodes`` already shows it)."""
        self.index.set_node_labels(name, node.labels if node is not None else None)
        self.soft_taints = max((soft_taint_count(n) for n in self.nodes.values()), default=0)
        self._node_sets.clear()
        self.generation += 1

    def own_constraints(self, raw: Mapping[str, Any], where: str) -> tuple[SpreadConstraint, ...]:
        """:func:`~driver.scheduling.topologyspread.pod_constraints` of the pod ``raw``,
        parsed once per distinct list (ManifestError, as it raises, is never kept)."""
        listed = (raw.get("spec") or {}).get("topologySpreadConstraints")
        if not listed:
            return pod_constraints(raw, where)
        key = repr(listed)
        if "matchLabelKeys" in key:
            key += repr(sorted(((raw.get("metadata") or {}).get("labels") or {}).items()))
        found = self._parsed.get(key)
        if found is None:
            found = pod_constraints(raw, where)
            if len(self._parsed) >= _MAX_PARSED:
                self._parsed.clear()
            self._parsed[key] = found
        return found

    def node_set(
        self,
        keys: tuple[str, ...],
        facts: PodSchedulingFacts | None,
        tolerations: tuple[PodToleration, ...] | None,
    ) -> _NodeSet:
        """The nodes that carry every key in ``keys``, match the pod's required node affinity
        (``facts``; None: not honoured) and whose NoSchedule/NoExecute taints the pod
        tolerates (``tolerations``; None: not honoured). Cached per signature."""
        affinity = None
        if facts is not None and (facts.node_selector or facts.required_affinity):
            affinity = (tuple(sorted(facts.node_selector.items())), repr(facts.required_affinity))
        else:
            facts = None
        signature = (keys, affinity, tolerations)
        found = self._node_sets.get(signature)
        if found is not None:
            self._node_sets.move_to_end(signature)
            return found
        restricted = facts is not None or tolerations is not None
        names: set[str] = set()
        values: dict[str, set[str]] = {key: set() for key in keys}
        for name, node in self.nodes.items():
            labels = node.labels
            if any(key not in labels for key in keys):
                continue
            if facts is not None and not _matches_affinity(facts, node):
                continue
            if tolerations is not None and not _tolerates(tolerations, node):
                continue
            names.add(name)
            for key in keys:
                values[key].add(labels[key])
        found = _NodeSet(
            None if not restricted else frozenset(names),
            {key: len(v) for key, v in values.items()},
            len(names) == len(self.nodes),
        )
        self._node_sets[signature] = found
        while len(self._node_sets) > _MAX_NODE_SETS:
            self._node_sets.popitem(last=False)
        return found


def _matches_affinity(facts: PodSchedulingFacts, node: Node) -> bool:
    if any(node.labels.get(k) != v for k, v in facts.node_selector.items()):
        return False
    return facts.required_affinity is None or node_selector_matches(
        facts.required_affinity, node, f"pod {facts.name} node affinity"
    )


def _tolerates(tolerations: Sequence[PodToleration], node: Node) -> bool:
    """The pod tolerates the node's NoSchedule/NoExecute taints (its spec taints, as
    upstream's node inclusion policy reads them)."""
    return all(
        any(t.tolerates(taint.key, taint.value, taint.effect) for t in tolerations)
        for taint in node.taints
        if taint.effect in _FILTERING_EFFECTS
    )


@dataclass(slots=True)
class PodRules:
    """One pod's rules for one decision (see the module docstring)."""

    nodes: Mapping[str, Node]
    spread: tuple[SpreadCounts, ...] = ()
    affinity: AffinityFilter = field(default_factory=AffinityFilter)
    node_terms: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[PodToleration, ...] = ()
    soft_taints: int = 0
    affinity_score: AffinityScore | None = None
    soft_spread: tuple[SpreadCounts, ...] = ()
    soft_spread_all: bool = True  # nodes without a key get the full penalty
    tie_spread: tuple[SpreadCounts, ...] = ()
    where: str = "pod"
    generation: int = 0  # the environment's, when built (its nodes' labels)
    # (:meth:`_penalised_parts`, once computed: the walk asks for them twice)
    _parts: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def filters(self) -> bool:
        return bool(self.spread or self.affinity)

    @property
    def soft(self) -> bool:
        return bool(self.node_terms or self.soft_taints or self.affinity_score or self.soft_spread)

    @property
    def ties(self) -> bool:
        return bool(self.tie_spread)

    def reason(self, node: Node) -> str | None:
        """PodTopologySpread, then InterPodAffinity: None, or the first reason."""
        labels = node.labels
        if self.spread:
            reason = spread_reason(self.spread, labels)
            if reason is not None:
                return reason
        if self.affinity:
            return self.affinity.reason(labels)
        return None

    def exclusion(self) -> Callable[[str], bool]:
        """A test for "node ``name`` fails a rule", compiled for this pod: the node search
        calls it for every node it passes over, so it reads each rule's topology key and
        count table directly (the same answers as :meth:`reason`, without the words)."""
        nodes = self.nodes
        if self.affinity.required:
            return lambda name: self.reason(nodes[name]) is not None
        sets = self.exclusion_sets()
        if sets is not None:
            # Anti-affinity alone: the nodes it excludes, as the pod index keeps them (a set
            # lookup per node passed over; the same answers as the count tables).
            return _member_of(sets)
        # (key, counts, the count a domain may hold at most): spread constraints, then
        # anti-affinity terms and the placed pods' anti-affinity (at most 0 matching pods).
        limits: list[tuple[str, Mapping[str, int], int]] = []
        for state in self.spread:
            if state.minimum is None:
                limits.append((state.constraint.topology_key, {}, 0))  # only the key matters
                continue
            allowed = state.constraint.max_skew - state.self_match + state.minimum
            limits.append((state.constraint.topology_key, state.counts, allowed))
        spread_keys = len(limits)
        for term, counts in zip(self.affinity.required_anti, self.affinity.anti, strict=True):
            limits.append((term.topology_key, counts, 0))
        limits.extend((key, counts, 0) for key, counts in self.affinity.existing.items())
        if len(limits) == 1:
            # One rule (the common case: one anti-affinity term, or one spread constraint):
            # a closure without the loop, called for every node a list walk passes over.
            only_key, only_counts, only_allowed = limits[0]
            missing = spread_keys == 1  # a spread constraint's key must be on the node
            get = only_counts.get

            def excluded_by_one(name: str) -> bool:
                value = nodes[name].labels.get(only_key)
                if value is None:
                    return missing
                return get(value, 0) > only_allowed

            return excluded_by_one

        def excluded(name: str) -> bool:
            labels = nodes[name].labels
            for i, (key, counts, allowed) in enumerate(limits):
                value = labels.get(key)
                if value is None:
                    if i < spread_keys:
                        return True  # a spread constraint's key is missing
                    continue
                if counts.get(value, 0) > allowed:
                    return True
            return False

        return excluded

    def exclusion_sets(self) -> tuple[NodeSet, ...] | None:
        """Where :meth:`exclusion` is membership in node sets the pod index keeps
        (anti-affinity alone), those sets (the non-empty ones); None where it is not."""
        sets = self.affinity.excluded_nodes
        if self.affinity.required or self.spread or sets is None:
            return None
        kept = tuple(s for s in sets if isinstance(s, NodeSet) and s)
        if len(kept) != sum(1 for s in sets if s):
            return None  # (sets the index does not keep: never from pod_rules)
        return kept

    def penalised(self) -> tuple[Callable[[str], bool], float] | None:
        """A test for "the soft rules certainly cost node ``name`` a penalty", and a floor of
        that penalty's estimate (> 0: :meth:`estimator` gives each such node at least that).
        Such nodes are those in a domain above the global minimum of a ``ScheduleAnyway``
        constraint: as the index keeps them (:attr:`SpreadCounts.over`), or by domain where
        the key has few. None: none known. The node search passes them over in runs, each
        bounded once by the floor."""
        found = self._penalised_parts()
        if found is None:
            return None
        sets, keyed, floor = found
        if not keyed:
            return _member_of(sets), floor
        nodes = self.nodes
        if len(sets) == 1 and len(keyed) == 1:  # hostname and zone: the common case
            (only_set,), ((key, values),) = sets, keyed
            return (lambda name: name in only_set or nodes[name].labels.get(key) in values), floor

        def penalised(name: str) -> bool:
            if any(name in s for s in sets):
                return True
            labels = nodes[name].labels
            return any(labels.get(key) in values for key, values in keyed)

        return penalised, floor

    def penalised_key(self) -> tuple[tuple[NodeSet, ...], tuple[object, ...]] | None:
        """What :meth:`penalised`'s test reads, for a reader that keeps its answers across
        decisions: the node sets the pod index keeps (a node in one stays penalised while
        the set's ``removals`` stay), and a key naming the rest (the domains penalised by
        value, the node labels' :attr:`generation`, and the floor). None: no test, or one that reads
        sets the index does not keep (never from :func:`pod_rules`)."""
        found = self._penalised_parts()
        if found is None:
            return None
        sets, keyed, floor = found
        kept = tuple(s for s in sets if isinstance(s, NodeSet))
        if len(kept) != len(sets):
            return None
        return kept, (self.generation, keyed, floor)

    def _penalised_parts(
        self,
    ) -> tuple[tuple[Set[str], ...], tuple[tuple[str, frozenset[str]], ...], float] | None:
        """:meth:`penalised`'s node sets, its penalised domains by value (topology key, the
        values) and its floor; None: none known."""
        if self._parts is None:
            self._parts = (self._penalised_read(),)
        found: tuple[tuple[Set[str], ...], tuple[tuple[str, frozenset[str]], ...], float] | None
        (found,) = self._parts
        return found

    def _penalised_read(
        self,
    ) -> tuple[tuple[Set[str], ...], tuple[tuple[str, frozenset[str]], ...], float] | None:
        if not self.soft_spread:
            return None
        share = 1.0 / len(self.soft_spread)
        sets: list[Set[str]] = []
        keyed: list[tuple[str, frozenset[str]]] = []
        floor: float | None = None
        for state in self.soft_spread:
            constraint = state.constraint
            if state.over is not None:
                if state.over:
                    sets.append(state.over)
            elif len(state.counts) <= _FEW_DOMAINS:
                threshold = state.minimum or 0
                values = frozenset(v for v, n in state.counts.items() if n > threshold)
                if values:
                    keyed.append((constraint.topology_key, values))
            else:
                continue
            # As the estimator computes it (each step rounds monotonically): an excess of
            # at least 1 costs at least 1 / (1 + maxSkew).
            least = WEIGHT_SPREAD * ((1 / (1 + constraint.max_skew)) * share)
            floor = least if floor is None else min(floor, least)
        if floor is None or not (sets or keyed):
            return None
        return tuple(sets), tuple(keyed), floor * (1 - 1e-9)  # (a hair lower still)

    def penalty(self, node: Node) -> Fraction:
        """The weighted sum of the soft rules' penalties on ``node`` (0: nothing to lose)."""
        total = Fraction(0)
        labels = node.labels
        if self.soft_taints:
            count = intolerable_soft_taints(self.tolerations, node)
            if count:
                total += WEIGHT_TAINTS * taint_penalty(count, self.soft_taints)
        if self.node_terms:
            total += WEIGHT_NODE_AFFINITY * node_affinity_penalty(
                self.node_terms, node, f"{self.where} preferred node affinity"
            )
        if self.soft_spread:
            total += WEIGHT_SPREAD * spread_penalty(
                self.soft_spread, labels, require_all=self.soft_spread_all
            )
        if self.affinity_score:
            total += WEIGHT_POD_AFFINITY * self.affinity_score.penalty(labels)
        return total

    def estimator(self) -> Callable[[Node], float]:
        """:meth:`penalty` in floating point, compiled for this pod: the node search orders
        its heap by it for every node it passes (and decides with the exact value)."""
        spread = (
            spread_estimator(self.soft_spread, require_all=self.soft_spread_all)
            if self.soft_spread
            else None
        )
        if spread is not None and not (self.soft_taints or self.node_terms or self.affinity_score):
            return lambda node: WEIGHT_SPREAD * spread(node.labels)  # the common case

        def estimate(node: Node) -> float:
            total = 0.0
            labels = node.labels
            if self.soft_taints and node.taints:
                count = intolerable_soft_taints(self.tolerations, node)
                if count:
                    total += WEIGHT_TAINTS * count / self.soft_taints
            if self.node_terms:
                total += WEIGHT_NODE_AFFINITY * float(
                    node_affinity_penalty(
                        self.node_terms, node, f"{self.where} preferred node affinity"
                    )
                )
            if spread is not None:
                total += WEIGHT_SPREAD * spread(labels)
            if self.affinity_score:
                total += WEIGHT_POD_AFFINITY * self.affinity_score.penalty_estimate(labels)
            return total

        return estimate

    def tie_breaker(self) -> Callable[[str], Fraction]:
        """:meth:`tie_break` by node name, compiled for this pod (exact, computed once per
        distinct count of matching pods): the node search asks it for every node of a tied
        run."""
        spread = spread_penalties(self.tie_spread, require_all=False)
        nodes = self.nodes
        return lambda name: spread(nodes[name].labels)

    def tie_break(self, node: Node) -> Fraction:
        """The System default spreading's penalty on ``node`` (compared only on ties)."""
        if not self.tie_spread:
            return Fraction(0)
        return spread_penalty(self.tie_spread, node.labels, require_all=False)


# --------------------------------------------------------------------------- building


def _member_of(sets: tuple[Set[str], ...]) -> Callable[[str], bool]:
    """A test for "``name`` is in one of ``sets``"."""
    if not sets:
        return lambda _name: False
    if len(sets) == 1:
        return sets[0].__contains__
    if len(sets) == 2:
        first, second = sets
        return lambda name: name in first or name in second
    return lambda name: any(name in s for s in sets)


def _spread_counts(
    env: RuleEnvironment,
    pod: ScheduledPod,
    constraints: Sequence[SpreadConstraint],
    facts: PodSchedulingFacts,
    require_all: bool,
    *,
    penalised: bool = False,
) -> tuple[SpreadCounts, ...]:
    """Each constraint's counts. ``penalised``: keep, where the counts are the index's own
    and the key's domains are mostly single nodes (hostname-like), the nodes above the
    minimum (:attr:`SpreadCounts.over`)."""
    index = env.index
    all_keys = tuple(sorted({c.topology_key for c in constraints}))
    out = []
    for c in constraints:
        keys = all_keys if require_all else (c.topology_key,)
        node_set = env.node_set(
            keys,
            facts if c.node_affinity_policy == "Honor" else None,
            facts.tolerations if c.node_taints_policy == "Honor" else None,
        )
        counts: DomainCounts
        counter: MatchCounter | None = None
        if c.selector.empty or c.selector.nothing:
            counts = {}  # an empty selector counts nothing (countPodsMatchSelector)
        else:
            counter = index.counter(
                MatchKey((_spread_matcher(c, pod.namespace),), skip_terminating=True)
            )
            if node_set.complete or (node_set.names is None and len(keys) == 1):
                # Every node counts (or every node with the one key): the counter's own
                # per-domain counts, kept up to date with each pod.
                counts = counter.domains(c.topology_key)
            else:
                summed: dict[str, int] = {}
                names = node_set.names
                for node, count in counter.per_node.items():
                    if names is not None and node not in names:
                        continue
                    labels = index.node_labels(node)
                    if any(k not in labels for k in keys):
                        continue
                    value = labels[c.topology_key]
                    summed[value] = summed.get(value, 0) + count
                counts = summed
                counter = None  # (not the index's counts: no node set kept for them)
        domains = node_set.domains[c.topology_key]
        minimum = global_minimum(counts, domains, c.min_domains)
        over = None
        if penalised and counter is not None and 2 * domains >= len(env.nodes):
            over = counter.over(c.topology_key, minimum or 0)
        out.append(SpreadCounts(c, counts, minimum, int(c.selector.matches(pod.labels)), over))
    return tuple(out)


def _spread_matcher(c: SpreadConstraint, namespace: str) -> PodMatcher:
    """Spread counts pods of the incoming pod's namespace that match the selector."""
    return PodMatcher(c.selector, frozenset({namespace}))


def _affinity_filter(env: RuleEnvironment, pod: ScheduledPod) -> AffinityFilter:
    index = env.index
    ns_labels = index.namespace_labels
    affinity = pod.affinity
    required = affinity.required
    affinity_counts: tuple[DomainCounts, ...] = ()
    matched_anywhere = False
    self_match = False
    if required:
        counter = index.counter(MatchKey(tuple(t.matcher for t in required)))
        affinity_counts = tuple(counter.domains(t.topology_key) for t in required)
        matched_anywhere = any(affinity_counts)
        self_match = matches_all(required, pod.namespace, pod.labels, ns_labels)
    anti_counters = [index.counter(MatchKey((t.matcher,))) for t in affinity.required_anti]
    anti_counts = tuple(
        counter.domains(t.topology_key)
        for counter, t in zip(anti_counters, affinity.required_anti, strict=True)
    )
    # The nodes each table excludes, as the index keeps them (updated with its counts).
    excluded = [
        counter.over(t.topology_key, 0)
        for counter, t in zip(anti_counters, affinity.required_anti, strict=True)
    ]
    existing: dict[str, list[Mapping[str, int]]] = {}
    for carrier in index.carriers("required_anti"):
        if carrier.domains and carrier.term.matcher.matches(pod.namespace, pod.labels, ns_labels):
            existing.setdefault(carrier.term.topology_key, []).append(carrier.domains)
            excluded.append(carrier.over())
    return AffinityFilter(
        required=required,
        affinity=affinity_counts,
        required_anti=affinity.required_anti,
        anti=anti_counts,
        existing={key: _Union(tuple(maps)) for key, maps in existing.items()},
        self_match=self_match,
        matched_anywhere=matched_anywhere,
        excluded_nodes=tuple(excluded),
    )


class _Union(Mapping[str, int]):
    """Several domain counts read as one (their sum), without copying them."""

    __slots__ = ("_maps",)

    def __init__(self, maps: tuple[Mapping[str, int], ...]) -> None:
        self._maps = maps

    def __getitem__(self, key: str) -> int:
        total = sum(m.get(key, 0) for m in self._maps)
        if not total:
            raise KeyError(key)
        return total

    def get(self, key: str, default: Any = None) -> Any:
        # (Mapping.get goes through __getitem__ and a KeyError for every domain without
        # pods: the node search asks for thousands of those per decision.)
        total = 0
        for m in self._maps:
            total += m.get(key, 0)
        return total or default

    def __contains__(self, key: object) -> bool:
        return any(key in m for m in self._maps)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for m in self._maps:
            for key in m:
                if key not in seen:
                    seen.add(key)
                    yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _affinity_score(env: RuleEnvironment, pod: ScheduledPod) -> AffinityScore | None:
    index = env.index
    ns_labels = index.namespace_labels
    scores: dict[str, dict[str, int]] = {}
    affinity = pod.affinity
    for weighted in affinity.preferred:
        term = weighted.term
        counts = index.counter(MatchKey((term.matcher,))).domains(term.topology_key)
        add_scores(scores, term.topology_key, counts, weighted.weight)
    for weighted in affinity.preferred_anti:
        term = weighted.term
        counts = index.counter(MatchKey((term.matcher,))).domains(term.topology_key)
        add_scores(scores, term.topology_key, counts, -weighted.weight)
    for kind, sign in (("required", 1), ("preferred", 1), ("preferred_anti", -1)):
        for carrier in index.carriers(kind):  # type: ignore[arg-type]
            if carrier.domains and carrier.term.matcher.matches(
                pod.namespace, pod.labels, ns_labels
            ):
                weight = HARD_POD_AFFINITY_WEIGHT if kind == "required" else carrier.weight
                add_scores(scores, carrier.term.topology_key, carrier.domains, sign * weight)
    found = AffinityScore.of(scores)
    return found or None


def pod_rules(
    env: RuleEnvironment,
    raw: Mapping[str, Any],
    pod: ScheduledPod,
    facts: PodSchedulingFacts,
) -> PodRules | None:
    """The pod's rules for this decision (None: it has none that could set nodes apart).
    ``raw`` is the pod's JSON (constraints, preferred node terms, owners); ``pod`` its parsed
    view; ``facts`` its node filter facts. Raises ManifestError for malformed rules."""
    where = f"pod {pod.namespace}/{pod.name}"
    own = env.own_constraints(raw, where)
    spreading = env.spreading
    defaults: tuple[SpreadConstraint, ...] = ()
    if not own and spreading.constraints:
        defaults = default_constraints(spreading, env.owners.default_selector(raw))
    constraints = own or defaults
    hard = [c for c in constraints if c.when_unsatisfiable == "DoNotSchedule"]
    soft = [c for c in constraints if c.when_unsatisfiable == "ScheduleAnyway"]
    rules = PodRules(nodes=env.nodes, where=where, generation=env.generation)
    if hard:
        rules.spread = _spread_counts(env, pod, hard, facts, require_all=True)
    if soft:
        # Upstream requires every key on a node unless the constraints are the System
        # defaults; those only break ties here (docs/scoring.md).
        system = not own and spreading.system
        counted = _spread_counts(
            env, pod, soft, facts, require_all=not system, penalised=not system
        )
        if system:
            rules.tie_spread = counted
        else:
            rules.soft_spread = counted
    if pod.affinity.required or pod.affinity.required_anti or _any(env, "required_anti"):
        rules.affinity = _affinity_filter(env, pod)
    if (
        pod.affinity.preferred
        or pod.affinity.preferred_anti
        or any(_any(env, kind) for kind in ("required", "preferred", "preferred_anti"))
    ):
        rules.affinity_score = _affinity_score(env, pod)
    rules.node_terms = preferred_node_terms(raw, where)
    if env.soft_taints:
        rules.soft_taints = env.soft_taints
        rules.tolerations = soft_tolerations(facts.tolerations)
    if not (rules.filters or rules.soft or rules.ties):
        return None
    return rules


def _any(env: RuleEnvironment, kind: str) -> bool:
    return any(True for _ in env.index.carriers(kind))  # type: ignore[arg-type]

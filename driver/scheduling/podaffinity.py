"""InterPodAffinity: required and preferred pod affinity and anti-affinity, as kube-scheduler's
plugin of that name (``pkg/scheduler/framework/plugins/interpodaffinity``).

**Terms** (:func:`pod_affinity`). A ``podAffinityTerm`` selects pods by label
(:mod:`driver.api.labels`) in a set of namespaces: the ``namespaces`` listed plus those
whose labels match ``namespaceSelector`` (``{}``: every namespace); with neither, the pod's own
namespace. ``matchLabelKeys`` / ``mismatchLabelKeys`` add ``key In (the pod's value)`` /
``key NotIn (the pod's value)`` for each key the pod carries, as the API server merges them
into the selector at creation (merging again changes nothing: the selector is canonical);
with a null ``labelSelector`` they add nothing.

**Filter** (:class:`AffinityFilter`, kube-scheduler's order and words; the engine builds the
counts from :class:`~driver.scheduling.podindex.PodIndex` once per decision, PreFilter):

1. required affinity: the node must carry every term's topology key, and each term's domain
   (key, the node's value) must hold a pod that matches *all* the terms -- ``node(s) didn't
   match pod affinity rules``. The first pod of a group whose terms match itself passes on any
   node with the keys when no pod in the cluster matches all the terms yet;
2. required anti-affinity: no term's domain may hold a pod the term matches -- ``node(s) didn't
   match pod anti-affinity rules``;
3. symmetry: no pod already placed may have a required anti-affinity term that matches the
   incoming pod with the node in that term's domain -- ``node(s) didn't satisfy existing pods
   anti-affinity rules``.

**Score** (:class:`AffinityScore`). Per topology domain, the raw score adds, for every pod
already placed there: each preferred affinity term of the incoming pod it matches (+weight),
each preferred anti-affinity term it matches (-weight); each of *its* required affinity terms
the incoming pod matches (+1, kube-scheduler's default ``hardPodAffinityWeight``), its
preferred affinity terms (+weight) and preferred anti-affinity terms (-weight) that match the
incoming pod. A node's raw score sums its domains. Upstream normalises raw scores between the
smallest and largest over the nodes that passed the filters; biaxial uses the smallest and
largest any node can reach (the per-key extremes), so a node's score does not depend on which
others were examined and the pruned node search stays exact (``docs/scoring.md``): the
penalty is ``(high - raw) / (high - low)`` in [0, 1], 0 on the most preferred domains.

Pure: the counts are passed in; nothing here mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from driver.api.errors import ManifestError
from driver.api.labels import NOTHING, LabelSelector, requirement

REASON_AFFINITY: Final = "node(s) didn't match pod affinity rules"
REASON_ANTI_AFFINITY: Final = "node(s) didn't match pod anti-affinity rules"
REASON_EXISTING_ANTI_AFFINITY: Final = "node(s) didn't satisfy existing pods anti-affinity rules"
HARD_POD_AFFINITY_WEIGHT: Final = 1  # kube-scheduler's InterPodAffinityArgs default

NamespaceLabels = Callable[[str], Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class PodMatcher:
    """Which pods a term selects: by label, in these namespaces or those its namespace
    selector matches (``AffinityTerm.Matches``)."""

    selector: LabelSelector
    namespaces: frozenset[str]
    namespace_selector: LabelSelector = NOTHING

    def matches(
        self, namespace: str, labels: Mapping[str, str], namespace_labels: NamespaceLabels
    ) -> bool:
        if namespace in self.namespaces or (
            not self.namespace_selector.nothing
            and self.namespace_selector.matches(namespace_labels(namespace))
        ):
            return self.selector.matches(labels)
        return False


@dataclass(frozen=True, slots=True)
class AffinityTerm:
    """A parsed ``podAffinityTerm``."""

    matcher: PodMatcher
    topology_key: str


@dataclass(frozen=True, slots=True)
class WeightedTerm:
    """A parsed ``weightedPodAffinityTerm`` (weight 1..100)."""

    weight: int
    term: AffinityTerm


@dataclass(frozen=True, slots=True)
class PodAffinity:
    """A pod's four lists of pod (anti-)affinity terms."""

    required: tuple[AffinityTerm, ...] = ()
    required_anti: tuple[AffinityTerm, ...] = ()
    preferred: tuple[WeightedTerm, ...] = ()
    preferred_anti: tuple[WeightedTerm, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.required or self.required_anti or self.preferred or self.preferred_anti)


NO_AFFINITY: Final = PodAffinity()


def _label_keys(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise ManifestError(f"{where} must be a list of label keys")
    return tuple(str(k) for k in raw)


def affinity_term(raw: Any, namespace: str, labels: Mapping[str, str], where: str) -> AffinityTerm:
    """Parse one ``podAffinityTerm`` of a pod in ``namespace`` with ``labels``."""
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where} must be an object")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise ManifestError(f"{where}: topologyKey is required")
    selector = LabelSelector.from_api(raw.get("labelSelector"), f"{where}.labelSelector")
    extra = [
        requirement(label_key, operator, (labels[label_key],), where)
        for name, operator in (("matchLabelKeys", "In"), ("mismatchLabelKeys", "NotIn"))
        for label_key in _label_keys(raw.get(name), f"{where}.{name}")
        if label_key in labels
    ]
    selector = selector.merged(extra)
    listed = raw.get("namespaces") or ()
    if isinstance(listed, str) or not isinstance(listed, Sequence):
        raise ManifestError(f"{where}.namespaces must be a list")
    raw_ns_selector = raw.get("namespaceSelector")
    ns_selector = (
        LabelSelector.from_api(raw_ns_selector, f"{where}.namespaceSelector")
        if raw_ns_selector is not None
        else NOTHING
    )
    namespaces = frozenset(str(n) for n in listed)
    if not namespaces and raw_ns_selector is None:
        namespaces = frozenset({namespace})
    return AffinityTerm(PodMatcher(selector, namespaces, ns_selector), key)


def _weighted(raw: Any, namespace: str, labels: Mapping[str, str], where: str) -> WeightedTerm:
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where} must be an object")
    weight = raw.get("weight")
    if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
        raise ManifestError(f"{where}.weight must be an integer in 1..100, got {weight!r}")
    term = affinity_term(raw.get("podAffinityTerm"), namespace, labels, f"{where}.podAffinityTerm")
    return WeightedTerm(weight, term)


def _list(raw: Any, where: str) -> Sequence[Any]:
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise ManifestError(f"{where} must be a list")
    return raw


def pod_affinity(pod: Mapping[str, Any], where: str = "pod") -> PodAffinity:
    """The pod's parsed ``spec.affinity.podAffinity`` and ``podAntiAffinity``."""
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    if not isinstance(affinity, Mapping):
        raise ManifestError(f"{where}: spec.affinity must be an object")
    if not affinity.get("podAffinity") and not affinity.get("podAntiAffinity"):
        return NO_AFFINITY  # (most pods: what the terms would read is not needed)
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    lists: dict[str, tuple[Any, ...]] = {}
    for field_name in ("podAffinity", "podAntiAffinity"):
        section = affinity.get(field_name) or {}
        if not isinstance(section, Mapping):
            raise ManifestError(f"{where}: spec.affinity.{field_name} must be an object")
        base = f"{where}: spec.affinity.{field_name}"
        required_field = f"{base}.requiredDuringSchedulingIgnoredDuringExecution"
        preferred_field = f"{base}.preferredDuringSchedulingIgnoredDuringExecution"
        lists[f"{field_name}/required"] = tuple(
            affinity_term(raw, namespace, labels, f"{required_field}[{i}]")
            for i, raw in enumerate(
                _list(section.get("requiredDuringSchedulingIgnoredDuringExecution"), required_field)
            )
        )
        lists[f"{field_name}/preferred"] = tuple(
            _weighted(raw, namespace, labels, f"{preferred_field}[{i}]")
            for i, raw in enumerate(
                _list(
                    section.get("preferredDuringSchedulingIgnoredDuringExecution"),
                    preferred_field,
                )
            )
        )
    found = PodAffinity(
        required=lists["podAffinity/required"],
        required_anti=lists["podAntiAffinity/required"],
        preferred=lists["podAffinity/preferred"],
        preferred_anti=lists["podAntiAffinity/preferred"],
    )
    return found or NO_AFFINITY


def matches_all(
    terms: Iterable[AffinityTerm],
    namespace: str,
    labels: Mapping[str, str],
    namespace_labels: NamespaceLabels,
) -> bool:
    """Whether a pod matches every term (``podMatchesAllAffinityTerms``; no terms: False)."""
    any_term = False
    for term in terms:
        any_term = True
        if not term.matcher.matches(namespace, labels, namespace_labels):
            return False
    return any_term


# --------------------------------------------------------------------------- filter


DomainCounts = Mapping[str, int]
"""Per value of one topology key: how many pods in that domain match."""


@dataclass(frozen=True, slots=True)
class AffinityFilter:
    """The incoming pod's InterPodAffinity state for the filter (PreFilter's result).

    ``affinity[i]``: per domain of ``required[i]``'s key, the pods matching *all* required
    terms; ``anti[i]``: per domain of ``required_anti[i]``'s key, the pods matching that term;
    ``existing``: per topology key, per domain, the placed pods whose required anti-affinity
    term with that key matches the incoming pod; ``self_match``: the pod matches all its
    required affinity terms itself; ``matched_anywhere``: some placed pod matches all of them
    (on a node with one of the keys); ``excluded_nodes``, when the index keeps them: per table
    of ``anti`` and ``existing``, the nodes in a domain it counts a pod in (their union is
    what the anti-affinity rules exclude).
    """

    required: tuple[AffinityTerm, ...] = ()
    affinity: tuple[DomainCounts, ...] = ()
    required_anti: tuple[AffinityTerm, ...] = ()
    anti: tuple[DomainCounts, ...] = ()
    existing: Mapping[str, DomainCounts] = field(default_factory=dict)
    self_match: bool = False
    matched_anywhere: bool = False
    excluded_nodes: tuple[Set[str], ...] | None = None

    def __bool__(self) -> bool:
        return bool(self.required or self.required_anti or self.existing)

    def reason(self, labels: Mapping[str, str]) -> str | None:
        """None if a node with ``labels`` passes, else kube-scheduler's reason."""
        if self.required:
            found = True
            for term, counts in zip(self.required, self.affinity, strict=True):
                value = labels.get(term.topology_key)
                if value is None:
                    return REASON_AFFINITY  # every topology key must be on the node
                if counts.get(value, 0) <= 0:
                    found = False
            if not found and (self.matched_anywhere or not self.self_match):
                return REASON_AFFINITY
        for term, counts in zip(self.required_anti, self.anti, strict=True):
            value = labels.get(term.topology_key)
            if value is not None and counts.get(value, 0) > 0:
                return REASON_ANTI_AFFINITY
        for key, counts in self.existing.items():
            value = labels.get(key)
            if value is not None and counts.get(value, 0) > 0:
                return REASON_EXISTING_ANTI_AFFINITY
        return None


# --------------------------------------------------------------------------- score


@dataclass(frozen=True, slots=True)
class AffinityScore:
    """The incoming pod's InterPodAffinity raw scores per domain (PreScore's result) and the
    extremes any node can reach; :meth:`penalty` is its score term for one node."""

    scores: Mapping[str, Mapping[str, int]]  # topology key -> value -> raw score
    high: int
    low: int

    @classmethod
    def of(cls, scores: Mapping[str, Mapping[str, int]]) -> AffinityScore:
        high = low = 0
        for values in scores.values():
            if values:
                high += max(0, *values.values())
                low += min(0, *values.values())
        return cls(scores, high, low)

    def __bool__(self) -> bool:
        return self.high != self.low

    def raw(self, labels: Mapping[str, str]) -> int:
        total = 0
        for key, values in self.scores.items():
            value = labels.get(key)
            if value is not None:
                total += values.get(value, 0)
        return total

    def penalty(self, labels: Mapping[str, str]) -> Fraction:
        """``(high - raw) / (high - low)``: 0 on the best domains, 1 on the worst."""
        if self.high == self.low:
            return Fraction(0)
        return Fraction(self.high - self.raw(labels), self.high - self.low)

    def penalty_estimate(self, labels: Mapping[str, str]) -> float:
        """:meth:`penalty` in floating point (the node search's heap order only)."""
        if self.high == self.low:
            return 0.0
        return (self.high - self.raw(labels)) / (self.high - self.low)


def add_scores(
    into: dict[str, dict[str, int]], key: str, counts: DomainCounts, weight: int
) -> None:
    """Add ``weight`` x each domain's count to the raw scores of ``key``."""
    if not counts or weight == 0:
        return
    values = into.setdefault(key, {})
    for value, count in counts.items():
        if count:
            values[value] = values.get(value, 0) + weight * count

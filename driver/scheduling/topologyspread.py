"""PodTopologySpread: ``topologySpreadConstraints`` and the cluster's default spreading, as
kube-scheduler's plugin of that name (``pkg/scheduler/framework/plugins/podtopologyspread``).

**Constraints** (:func:`pod_constraints`): ``maxSkew``, ``topologyKey``, ``whenUnsatisfiable``
(``DoNotSchedule`` filters, ``ScheduleAnyway`` scores), ``labelSelector`` with
``matchLabelKeys`` merged in (``key In (the pod's value)`` for each key the pod carries; a null
selector stays null), ``minDomains`` (default 1), ``nodeAffinityPolicy`` (default ``Honor``) and
``nodeTaintsPolicy`` (default ``Ignore``).

**Counting** (the engine does it, :mod:`driver.scheduling.rules`): for each constraint, the
pods in the incoming pod's namespace that match its selector and are not terminating, summed
per domain over the *eligible* nodes: nodes that carry every constraint's topology key and
pass the constraint's inclusion policies (``Honor``: the pod's required node affinity and node
selector match the node; ``Honor`` taints: the pod tolerates the node's NoSchedule/NoExecute
taints). An empty selector (``{}``) counts nothing (``countPodsMatchSelector``). The global
minimum is over the eligible domains (0 when there are fewer than ``minDomains``).

**Filter** (:func:`spread_reason`): a node without a constraint's topology key fails with
``node(s) didn't match pod topology spread constraints (missing required label)``; otherwise
``count(domain) + (1 if the pod matches the selector itself) - minimum`` above ``maxSkew``
fails with ``node(s) didn't match pod topology spread constraints``.

**Score** (:func:`spread_penalty`): per ``ScheduleAnyway`` constraint, with ``e = count(domain)
- minimum``, the penalty ``e / (e + maxSkew)``: 0 on the least loaded domains and growing with
the excess, softened by ``maxSkew`` as upstream's ``maxSkew - 1`` term softens its score; the
mean over the constraints. A node without a key gets 1 for the pod's own constraints (upstream
scores such nodes 0) and nothing for the default ones (upstream counts only the keys a node
has). ``docs/scoring.md`` gives the weights.

**Default spreading** (:class:`DefaultSpreading`): for a pod without constraints of its own,
kube-scheduler's "System" defaults (``kubernetes.io/hostname`` maxSkew 3 and
``topology.kubernetes.io/zone`` maxSkew 5, both ``ScheduleAnyway``) or a configured list. They
apply only with a non-empty *default selector* (:class:`OwnerSelectors`, upstream's
``DefaultSelector``): the selectors of the Services in the pod's namespace that select it,
merged, plus the selector of its controller when that is a ReplicationController, ReplicaSet
or StatefulSet the cluster shows.

Pure: counts are passed in; nothing here mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, Literal

from driver.api.errors import ConfigError, ManifestError
from driver.api.labels import LabelSelector, Requirement

REASON_SPREAD: Final = "node(s) didn't match pod topology spread constraints"
REASON_SPREAD_LABEL: Final = f"{REASON_SPREAD} (missing required label)"
HOSTNAME: Final = "kubernetes.io/hostname"
ZONE: Final = "topology.kubernetes.io/zone"
DO_NOT_SCHEDULE: Final = "DoNotSchedule"
SCHEDULE_ANYWAY: Final = "ScheduleAnyway"

Unsatisfiable = Literal["DoNotSchedule", "ScheduleAnyway"]
Policy = Literal["Honor", "Ignore"]
_POLICIES: Final = ("Honor", "Ignore")
#: The owners whose selector upstream's DefaultSelector reads: (apiVersion, kind).
OWNER_KINDS: Final = frozenset(
    {("v1", "ReplicationController"), ("apps/v1", "ReplicaSet"), ("apps/v1", "StatefulSet")}
)


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """A parsed topology spread constraint."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: Unsatisfiable
    selector: LabelSelector
    min_domains: int = 1
    node_affinity_policy: Policy = "Honor"
    node_taints_policy: Policy = "Ignore"


def _int(raw: Mapping[str, Any], key: str, default: int | None, where: str, low: int) -> int:
    value = raw.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ManifestError(f"{where}.{key} must be an integer >= {low}, got {value!r}")
    return value


def _policy(raw: Mapping[str, Any], key: str, default: Policy, where: str) -> Policy:
    value = raw.get(key) or default
    if value == "Honor":
        return "Honor"
    if value == "Ignore":
        return "Ignore"
    raise ManifestError(f"{where}.{key}: {value!r} is not one of {', '.join(_POLICIES)}")


def _unsatisfiable(value: Any, where: str) -> Unsatisfiable:
    if value == DO_NOT_SCHEDULE:
        return "DoNotSchedule"
    if value == SCHEDULE_ANYWAY:
        return "ScheduleAnyway"
    raise ManifestError(
        f"{where}.whenUnsatisfiable: {value!r} is not one of {DO_NOT_SCHEDULE}, {SCHEDULE_ANYWAY}"
    )


def spread_constraint(raw: Any, labels: Mapping[str, str], where: str) -> SpreadConstraint:
    """Parse one ``topologySpreadConstraint`` of a pod with ``labels``."""
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where} must be an object")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise ManifestError(f"{where}: topologyKey is required")
    when = _unsatisfiable(raw.get("whenUnsatisfiable"), where)
    selector = LabelSelector.from_api(raw.get("labelSelector"), f"{where}.labelSelector")
    keys = raw.get("matchLabelKeys") or ()
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise ManifestError(f"{where}.matchLabelKeys must be a list of label keys")
    selector = selector.merged(
        Requirement(str(k), "In", (labels[str(k)],)) for k in keys if str(k) in labels
    )
    min_domains = _int(raw, "minDomains", 1, where, 1)
    if "minDomains" in raw and raw["minDomains"] is not None and when != DO_NOT_SCHEDULE:
        raise ManifestError(
            f"{where}.minDomains: only allowed with whenUnsatisfiable DoNotSchedule"
        )
    return SpreadConstraint(
        max_skew=_int(raw, "maxSkew", None, where, 1),
        topology_key=key,
        when_unsatisfiable=when,
        selector=selector,
        min_domains=min_domains,
        node_affinity_policy=_policy(raw, "nodeAffinityPolicy", "Honor", where),
        node_taints_policy=_policy(raw, "nodeTaintsPolicy", "Ignore", where),
    )


def pod_constraints(pod: Mapping[str, Any], where: str = "pod") -> tuple[SpreadConstraint, ...]:
    """The pod's own ``spec.topologySpreadConstraints``, parsed."""
    raw = (pod.get("spec") or {}).get("topologySpreadConstraints") or ()
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise ManifestError(f"{where}: spec.topologySpreadConstraints must be a list")
    labels = {str(k): str(v) for k, v in ((pod.get("metadata") or {}).get("labels") or {}).items()}
    return tuple(
        spread_constraint(c, labels, f"{where}: spec.topologySpreadConstraints[{i}]")
        for i, c in enumerate(raw)
    )


# --------------------------------------------------------------------------- defaults


@dataclass(frozen=True, slots=True)
class DefaultConstraint:
    """One default constraint (a selector comes from the pod's owners)."""

    max_skew: int
    topology_key: str
    when_unsatisfiable: Unsatisfiable


SYSTEM_DEFAULTS: Final = (
    DefaultConstraint(3, HOSTNAME, "ScheduleAnyway"),
    DefaultConstraint(5, ZONE, "ScheduleAnyway"),
)


@dataclass(frozen=True, slots=True)
class DefaultSpreading:
    """The cluster's default spread constraints: kube-scheduler's System defaulting
    (``system``), a configured list, or none. ``docs/scoring.md`` says how much each weighs."""

    constraints: tuple[DefaultConstraint, ...] = SYSTEM_DEFAULTS
    system: bool = True

    @classmethod
    def parse(cls, text: str) -> DefaultSpreading:
        """``system``, ``none``, or ``KEY:MAXSKEW:WHEN[,...]`` (WHEN is DoNotSchedule or
        ScheduleAnyway). ConfigError naming what is wrong."""
        text = text.strip()
        if text == "system":
            return cls()
        if text in ("none", ""):
            return cls((), system=False)
        out = []
        for item in text.split(","):
            parts = item.strip().split(":")
            if len(parts) != 3 or not parts[0]:
                raise ConfigError(
                    f"--default-spread-constraints: {item.strip()!r} is not "
                    "TOPOLOGY_KEY:MAX_SKEW:DoNotSchedule|ScheduleAnyway (or use system / none)"
                )
            key, skew, when = parts
            try:
                max_skew = int(skew)
            except ValueError:
                max_skew = 0
            if max_skew < 1:
                raise ConfigError(
                    f"--default-spread-constraints: {item.strip()!r}: maxSkew must be an "
                    "integer >= 1"
                )
            if when not in (DO_NOT_SCHEDULE, SCHEDULE_ANYWAY):
                raise ConfigError(
                    f"--default-spread-constraints: {item.strip()!r}: {when!r} is not "
                    f"{DO_NOT_SCHEDULE} or {SCHEDULE_ANYWAY}"
                )
            out.append(DefaultConstraint(max_skew, key, when))  # type: ignore[arg-type]
        keys = [(c.topology_key, c.when_unsatisfiable) for c in out]
        if len(set(keys)) != len(keys):
            raise ConfigError(
                "--default-spread-constraints: a topology key is listed twice for the same "
                "whenUnsatisfiable"
            )
        return cls(tuple(out), system=False)

    def describe(self) -> str:
        if self.system:
            return "system"
        if not self.constraints:
            return "none"
        return ",".join(
            f"{c.topology_key}:{c.max_skew}:{c.when_unsatisfiable}" for c in self.constraints
        )


@dataclass(slots=True)
class OwnerSelectors:
    """The selectors upstream's ``DefaultSelector`` reads: Services per namespace, and the
    ReplicationControllers, ReplicaSets and StatefulSets the cluster shows."""

    services: dict[str, dict[str, Mapping[str, str]]] = field(default_factory=dict)
    workloads: dict[tuple[str, str, str], LabelSelector] = field(default_factory=dict)

    def observe(
        self, kind: str, namespace: str, name: str, selector: Mapping[str, Any] | None
    ) -> None:
        """A Service, ReplicationController, ReplicaSet or StatefulSet appeared, changed or
        (None) went; ``selector`` is its ``spec.selector`` as the API shows it. A malformed
        selector raises ManifestError (and the object counts as gone)."""
        if kind == "Service":
            found = self.services.setdefault(namespace, {})
            if selector is None:
                found.pop(name, None)
            else:
                found[name] = {str(k): str(v) for k, v in selector.items()}
            if not found:
                del self.services[namespace]
            return
        if kind not in {k for _, k in OWNER_KINDS}:
            raise ValueError(f"not a kind default spreading reads: {kind}")
        key = (kind, namespace, name)
        if selector is None:
            self.workloads.pop(key, None)
            return
        self.workloads.pop(key, None)
        if kind == "ReplicationController":
            parsed = LabelSelector.from_labels({str(k): str(v) for k, v in selector.items()})
        else:
            parsed = LabelSelector.from_api(selector, f"{kind} {namespace}/{name} spec.selector")
        self.workloads[key] = parsed

    def default_selector(self, pod: Mapping[str, Any]) -> LabelSelector:
        """The selector default constraints get for ``pod`` (upstream's DefaultSelector);
        an empty one means no default spreading for the pod."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        merged: dict[str, str] = {}
        for selector in self.services.get(namespace, {}).values():
            if all(labels.get(k) == v for k, v in selector.items()):
                merged.update(selector)
        requirements = list(LabelSelector.from_labels(merged).requirements)
        owner = controller_of(meta)
        if owner is not None:
            found = self.workloads.get((owner[1], namespace, owner[2]))
            if found is not None and not found.nothing:
                requirements.extend(found.requirements)
        return LabelSelector.of(requirements)


def controller_of(meta: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(apiVersion, kind, name) of the pod's controller when default spreading reads its
    kind (ReplicationController, ReplicaSet, StatefulSet), else None."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            kind = (str(ref.get("apiVersion")), str(ref.get("kind")))
            if kind in OWNER_KINDS:
                return kind[0], kind[1], str(ref.get("name"))
            return None
    return None


def default_constraints(
    spreading: DefaultSpreading, selector: LabelSelector
) -> tuple[SpreadConstraint, ...]:
    """The default constraints for a pod whose default selector is ``selector`` (none when
    it is empty, as upstream)."""
    if selector.empty or selector.nothing:
        return ()
    return tuple(
        SpreadConstraint(c.max_skew, c.topology_key, c.when_unsatisfiable, selector)
        for c in spreading.constraints
    )


# --------------------------------------------------------------------------- filter / score


@dataclass(frozen=True, slots=True)
class SpreadCounts:
    """One constraint's state for the incoming pod: matching pods per eligible domain, the
    global minimum (None: no eligible domain) and whether the pod matches its own selector;
    ``over``, when known: the nodes whose domain holds more than the minimum (or 0)."""

    constraint: SpreadConstraint
    counts: Mapping[str, int]
    minimum: int | None
    self_match: int
    over: Set[str] | None = None


def global_minimum(counts: Mapping[str, int], domains: int, min_domains: int) -> int | None:
    """The minimum over ``domains`` eligible domains (``counts`` holds the domains with
    matching pods; the others hold 0); 0 when there are fewer than ``min_domains``; None when
    there is none."""
    if domains == 0:
        return None
    if domains < min_domains or len(counts) < domains:
        return 0
    return min(counts.values())


def spread_reason(states: Sequence[SpreadCounts], labels: Mapping[str, str]) -> str | None:
    """None if a node with ``labels`` satisfies every DoNotSchedule constraint."""
    for state in states:
        constraint = state.constraint
        value = labels.get(constraint.topology_key)
        if value is None:
            return REASON_SPREAD_LABEL
        if state.minimum is None:
            continue  # no eligible domain: the skew cannot exceed (upstream's MaxInt32)
        skew = state.counts.get(value, 0) + state.self_match - state.minimum
        if skew > constraint.max_skew:
            return REASON_SPREAD
    return None


def spread_penalty(
    states: Sequence[SpreadCounts], labels: Mapping[str, str], *, require_all: bool
) -> Fraction:
    """The mean over ScheduleAnyway constraints of ``e / (e + maxSkew)`` (module docstring).
    ``require_all``: a node missing a key gets 1 (the pod's own constraints); otherwise the
    constraint adds nothing for it (the default ones)."""
    if not states:
        return Fraction(0)
    total = Fraction(0)
    for state in states:
        constraint = state.constraint
        value = labels.get(constraint.topology_key)
        if value is None:
            if require_all:
                return Fraction(1)
            continue
        excess = state.counts.get(value, 0) - (state.minimum or 0)
        if excess > 0:
            total += Fraction(excess, excess + constraint.max_skew)
    return total / len(states)


def spread_penalties(
    states: Sequence[SpreadCounts], *, require_all: bool
) -> Callable[[Mapping[str, str]], Fraction]:
    """:func:`spread_penalty` compiled for one pod's constraints, exact: a node's labels to its
    penalty, computed once per distinct set of counts the node's domains hold (the node search
    asks it for runs of nodes that mostly hold the same counts). The System defaults' two
    constraints (hostname, zone) have a path of their own: one call per node."""
    tables = tuple((s.constraint.topology_key, s.counts) for s in states)
    memo: dict[object, Fraction] = {}

    def computed(signature: object, labels: Mapping[str, str]) -> Fraction:
        found = memo[signature] = spread_penalty(states, labels, require_all=require_all)
        return found

    if len(tables) == 2:  # the System defaults
        (key0, counts0), (key1, counts1) = tables

        def pair(labels: Mapping[str, str]) -> Fraction:
            value0 = labels.get(key0)
            value1 = labels.get(key1)
            signature = (
                None if value0 is None else counts0.get(value0, 0),
                None if value1 is None else counts1.get(value1, 0),
            )
            found = memo.get(signature)
            return computed(signature, labels) if found is None else found

        return pair

    def penalty(labels: Mapping[str, str]) -> Fraction:
        signature = tuple(
            None if (value := labels.get(key)) is None else counts.get(value, 0)
            for key, counts in tables
        )
        found = memo.get(signature)
        return computed(signature, labels) if found is None else found

    return penalty


def spread_estimator(
    states: Sequence[SpreadCounts], *, require_all: bool
) -> Callable[[Mapping[str, str]], float]:
    """:func:`spread_penalty` in floating point, compiled for one pod's constraints: a node's
    labels to the estimate (the node search orders its heap by it, once per node it passes)."""
    if not states:
        return lambda _labels: 0.0
    tables = tuple(
        (s.constraint.topology_key, s.counts, s.minimum or 0, s.constraint.max_skew) for s in states
    )
    share = 1.0 / len(states)

    def estimate(labels: Mapping[str, str]) -> float:
        total = 0.0
        for key, counts, minimum, max_skew in tables:
            value = labels.get(key)
            if value is None:
                if require_all:
                    return 1.0
                continue
            excess = counts.get(value, 0) - minimum
            if excess > 0:
                total += excess / (excess + max_skew)
        return total * share

    return estimate

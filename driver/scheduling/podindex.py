"""The pods on the nodes, as the rules between pods need them: who runs where, with which
labels, host ports and affinity terms -- counted incrementally, never by iterating every pod
per decision.

:class:`ScheduledPod` is what the index keeps of one pod (parsed once: namespace, labels,
requests, host ports, pod (anti-)affinity terms, whether it is terminating). The decision
engine feeds :class:`PodIndex` with every pod that counts on a node -- bound by any scheduler,
or assumed by this one -- through :meth:`PodIndex.add` and :meth:`PodIndex.remove` (the same
two calls serve a "what if these pods were gone" question: remove, ask, add back).

What the index maintains, updated on every add and remove:

* per node: its pods and the host ports they hold (a
  :class:`~driver.scheduling.nodeports.PortSet`);
* **match counters** (:meth:`PodIndex.counter`), registered on first use for a
  :class:`MatchKey` -- the pods that match every one of some
  :class:`~driver.scheduling.podaffinity.PodMatcher` (an affinity term's or a spread
  constraint's selector and namespaces) -- and kept from then
  on: the matching pods per node, and per topology key the matching pods per domain (a key's
  value on the node). Registering scans the pods once; afterwards a pod add or remove tests
  only the counters whose selector names one of its labels (:attr:`LabelSelector.anchor`)
  and those that name none. The least recently used counters are dropped past
  :data:`MAX_COUNTERS`. On request (:meth:`MatchCounter.over`), a counter also keeps the
  nodes whose domain of a key holds more than a given number of matching pods -- the nodes a
  required anti-affinity term excludes, or those a spread constraint penalises -- updated
  with the domain counts (a pod add or remove moves at most one domain's nodes);
* **term carriers** (:meth:`PodIndex.carriers`): for each distinct affinity term of the pods
  placed (by kind: required / required anti / preferred / preferred anti, and weight), how many
  pods carry it per node and per domain of its topology key -- what the symmetric rules
  (existing pods' anti-affinity, their preferences towards the incoming pod) read.

Node labels come from :meth:`PodIndex.set_nodes` (domains are recomputed from the per-node
counts when they change); namespace labels from :meth:`PodIndex.set_namespace` (a namespace
the index was not told about has the label the API server gives every namespace,
``kubernetes.io/metadata.name``). Pods on a node the index does not know count on that node
but in no domain until the node appears.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

from driver.scheduling.nodefit import pod_requests
from driver.scheduling.nodeports import HostPort, PortSet, host_ports
from driver.scheduling.podaffinity import (
    NO_AFFINITY,
    AffinityTerm,
    PodAffinity,
    PodMatcher,
    pod_affinity,
)
from driver.scheduling.preemption import pod_priority

NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
MAX_COUNTERS: Final = 4096
MAX_THRESHOLDS: Final = 4  # node sets kept per counter (a spread minimum changes the threshold)

CarrierKind = Literal["required", "required_anti", "preferred", "preferred_anti"]
CARRIER_KINDS: Final[tuple[CarrierKind, ...]] = (
    "required",
    "required_anti",
    "preferred",
    "preferred_anti",
)


@dataclass(frozen=True, slots=True)
class ScheduledPod:
    """What the index keeps of a pod that counts on a node."""

    uid: str
    namespace: str = "default"
    name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    requests: Mapping[str, int] = field(default_factory=dict)
    ports: tuple[HostPort, ...] = ()
    affinity: PodAffinity = NO_AFFINITY
    terminating: bool = False
    priority: int = 0  # spec.priority (what preemption compares)

    @classmethod
    def from_pod(
        cls,
        pod: Mapping[str, Any],
        uid: str,
        *,
        requests: Mapping[str, int] | None = None,
        ports: tuple[HostPort, ...] | None = None,
    ) -> ScheduledPod:
        """Parse a pod (ManifestError naming it when something does not parse); ``requests``
        and ``ports``: already parsed (the node filter's facts), not parsed again."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        where = f"pod {namespace}/{name}"
        return cls(
            uid=uid,
            namespace=namespace,
            name=name,
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            requests=pod_requests(pod, where) if requests is None else requests,
            ports=host_ports(pod, where) if ports is None else ports,
            affinity=pod_affinity(pod, where),
            terminating=bool(meta.get("deletionTimestamp")),
            priority=pod_priority(pod, where),
        )

    def named(self, uid: str, name: str, *, terminating: bool) -> ScheduledPod:
        """The same pod view for another pod whose namespace, labels and spec are the same
        (a replica), with its own UID, name and deletion state; the parsed parts are shared,
        as nothing changes them."""
        return ScheduledPod(
            uid,
            self.namespace,
            name,
            self.labels,
            self.requests,
            self.ports,
            self.affinity,
            terminating,
            self.priority,
        )


def same_view(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether :meth:`ScheduledPod.from_pod` reads the same of ``new`` as of ``old`` (with the
    same UID): the namespace, name, labels, deletion state and spec but ``spec.nodeName``
    (what binding a pod changes) are equal. False for anything that is not JSON objects."""
    old_meta, new_meta = old.get("metadata"), new.get("metadata")
    old_spec, new_spec = old.get("spec"), new.get("spec")
    if not (
        type(old_meta) is dict
        and type(new_meta) is dict
        and type(old_spec) is dict
        and type(new_spec) is dict
    ):
        return False
    return (
        old_meta.get("namespace") == new_meta.get("namespace")
        and old_meta.get("name") == new_meta.get("name")
        and old_meta.get("labels") == new_meta.get("labels")
        and bool(old_meta.get("deletionTimestamp")) == bool(new_meta.get("deletionTimestamp"))
        and {**old_spec, "nodeName": None} == {**new_spec, "nodeName": None}
    )


Members = Callable[[str], Mapping[str, Set[str]]]
"""A topology key to the nodes of each of its values (the index's label index)."""


class NodeSet(set[str]):
    """Node names the index keeps up to date (:meth:`MatchCounter.over`), with a count of
    the updates that took nodes out (``removals``): what a reader derived from the set stays
    true of a set only added to since, which it tells by that count."""

    __slots__ = ("removals",)

    def __init__(self) -> None:
        super().__init__()
        self.removals = 0


class _Over:
    """Nodes whose domain holds more than some number of pods, per (topology key, that
    number): derived from a domain table, updated with it (:meth:`moved`), rebuilt on demand
    after a relabel (dropped)."""

    __slots__ = ("_members", "sets")

    def __init__(self, members: Members) -> None:
        self._members = members
        self.sets: dict[tuple[str, int], NodeSet] = {}

    def get(self, key: str, threshold: int, domains: Mapping[str, int]) -> NodeSet:
        found = self.sets.pop((key, threshold), None)
        if found is None:
            members = self._members(key)
            found = NodeSet()
            for value, count in domains.items():
                if count > threshold:
                    found.update(members.get(value, ()))
            while len(self.sets) >= MAX_THRESHOLDS:
                del self.sets[next(iter(self.sets))]
        self.sets[key, threshold] = found  # (the most recently used last)
        return found

    def moved(self, key: str, value: str, before: int, after: int) -> None:
        """The domain ``value`` of ``key`` went from ``before`` to ``after`` pods."""
        for (set_key, threshold), nodes in self.sets.items():
            if set_key != key:
                continue
            if before <= threshold < after:
                nodes.update(self._members(key).get(value, ()))
            elif after <= threshold < before:
                nodes.difference_update(self._members(key).get(value, ()))
                nodes.removals += 1


class MatchKey(NamedTuple):
    """Which pods a counter counts: those matching every matcher (terminating ones too,
    unless ``skip_terminating``: topology spread skips them, pod affinity does not)."""

    matchers: tuple[PodMatcher, ...]
    skip_terminating: bool = False


class MatchCounter:
    """Pods matching one :class:`MatchKey`: per node, and per domain of each topology key
    asked for (:meth:`domains`; values without a matching pod are absent)."""

    __slots__ = ("_domains", "_labels", "_over", "key", "per_node")

    def __init__(
        self, key: MatchKey, labels: Mapping[str, Mapping[str, str]], members: Members
    ) -> None:
        self.key = key
        self.per_node: dict[str, int] = {}
        self._domains: dict[str, dict[str, int]] = {}
        self._labels = labels
        self._over = _Over(members)

    def domains(self, topology_key: str) -> Mapping[str, int]:
        found = self._domains.get(topology_key)
        if found is None:
            found = {}
            for node, count in self.per_node.items():
                value = self._labels.get(node, {}).get(topology_key)
                if value is not None:
                    found[value] = found.get(value, 0) + count
            self._domains[topology_key] = found
        return found

    def over(self, topology_key: str, threshold: int) -> NodeSet:
        """The nodes whose domain of ``topology_key`` holds more than ``threshold`` matching
        pods (read-only, kept up to date with every add and remove from now on)."""
        return self._over.get(topology_key, threshold, self.domains(topology_key))

    def _count(self, node: str, delta: int) -> None:
        count = self.per_node.get(node, 0) + delta
        if count > 0:
            self.per_node[node] = count
        else:
            self.per_node.pop(node, None)
        labels = self._labels.get(node)
        if labels is None:
            return
        over = self._over if self._over.sets else None
        for topology_key, domains in self._domains.items():
            value = labels.get(topology_key)
            if value is not None:
                before = domains.get(value, 0)
                count = before + delta
                if count > 0:
                    domains[value] = count
                else:
                    domains.pop(value, None)
                if over is not None:
                    over.moved(topology_key, value, before, count)

    def _relabel(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        self._labels = labels
        self._domains.clear()
        self._over.sets.clear()

    def _move(
        self, count: int, old: Mapping[str, str] | None, new: Mapping[str, str] | None
    ) -> None:
        """A node with ``count`` matching pods changed labels from ``old`` to ``new``."""
        for topology_key, domains in self._domains.items():
            _shift(domains, old, new, topology_key, count)


class TermCarrier:
    """The pods that carry one affinity term (of one kind, with one weight): per node, and
    per domain of the term's topology key."""

    __slots__ = ("_over", "domains", "kind", "per_node", "term", "weight")

    def __init__(
        self, kind: CarrierKind, term: AffinityTerm, weight: int, members: Members
    ) -> None:
        self.kind = kind
        self.term = term
        self.weight = weight
        self.per_node: dict[str, int] = {}
        self.domains: dict[str, int] = {}
        self._over = _Over(members)

    def over(self) -> NodeSet:
        """The nodes in the term's domains that hold a carrier (read-only, kept up to date)."""
        return self._over.get(self.term.topology_key, 0, self.domains)

    def _count(self, node: str, labels: Mapping[str, str] | None, delta: int) -> None:
        count = self.per_node.get(node, 0) + delta
        if count > 0:
            self.per_node[node] = count
        else:
            self.per_node.pop(node, None)
        value = labels.get(self.term.topology_key) if labels is not None else None
        if value is not None:
            before = self.domains.get(value, 0)
            count = before + delta
            if count > 0:
                self.domains[value] = count
            else:
                self.domains.pop(value, None)
            if self._over.sets:
                self._over.moved(self.term.topology_key, value, before, count)

    def _move(
        self, count: int, old: Mapping[str, str] | None, new: Mapping[str, str] | None
    ) -> None:
        _shift(self.domains, old, new, self.term.topology_key, count)

    def _relabel(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        self._over.sets.clear()
        self.domains = {}
        key = self.term.topology_key
        for node, count in self.per_node.items():
            value = labels.get(node, {}).get(key)
            if value is not None:
                self.domains[value] = self.domains.get(value, 0) + count


def _shift(
    domains: dict[str, int],
    old: Mapping[str, str] | None,
    new: Mapping[str, str] | None,
    key: str,
    count: int,
) -> None:
    """Move ``count`` pods from the node's old domain of ``key`` to its new one."""
    before = old.get(key) if old is not None else None
    after = new.get(key) if new is not None else None
    if before == after:
        return
    if before is not None:
        left = domains.get(before, 0) - count
        if left > 0:
            domains[before] = left
        else:
            domains.pop(before, None)
    if after is not None:
        domains[after] = domains.get(after, 0) + count


def _carried(pod: ScheduledPod) -> Iterator[tuple[CarrierKind, AffinityTerm, int]]:
    affinity = pod.affinity
    for term in affinity.required:
        yield "required", term, 1
    for term in affinity.required_anti:
        yield "required_anti", term, 1
    for weighted in affinity.preferred:
        yield "preferred", weighted.term, weighted.weight
    for weighted in affinity.preferred_anti:
        yield "preferred_anti", weighted.term, weighted.weight


class PodIndex:
    """See the module docstring."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[str, ScheduledPod]] = {}
        self._node_pods: dict[str, set[str]] = {}
        self._ports: dict[str, PortSet] = {}
        self._labels: dict[str, Mapping[str, str]] = {}
        self._namespaces: dict[str, Mapping[str, str]] = {}
        self._counters: OrderedDict[MatchKey, MatchCounter] = OrderedDict()
        self._anchored: dict[tuple[str, str], set[MatchKey]] = {}
        self._unanchored: set[MatchKey] = set()
        self._carriers: dict[CarrierKind, dict[tuple[AffinityTerm, int], TermCarrier]] = {
            kind: {} for kind in CARRIER_KINDS
        }
        # topology key -> value -> the nodes with it (built per key on first use)
        self._members: dict[str, dict[str, set[str]]] = {}

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self._pods)

    def get(self, uid: str) -> tuple[str, ScheduledPod] | None:
        """Where pod ``uid`` counts and what is known of it."""
        return self._pods.get(uid)

    def pods(self) -> Mapping[str, tuple[str, ScheduledPod]]:
        """Every pod counted: uid -> (node, pod). Read-only."""
        return self._pods

    def pods_on(self, node: str) -> Iterator[ScheduledPod]:
        for uid in sorted(self._node_pods.get(node, ())):
            yield self._pods[uid][1]

    def ports(self, node: str) -> PortSet | None:
        """The host ports the pods on ``node`` hold (None: none)."""
        return self._ports.get(node)

    def node_labels(self, node: str) -> Mapping[str, str]:
        return self._labels.get(node, {})

    def members(self, key: str) -> Mapping[str, Set[str]]:
        """Per value of the label ``key``, the nodes that carry it (read-only)."""
        found = self._members.get(key)
        if found is None:
            found = self._members[key] = {}
            for node, labels in self._labels.items():
                value = labels.get(key)
                if value is not None:
                    found.setdefault(value, set()).add(node)
        return found

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        found = self._namespaces.get(namespace)
        return found if found is not None else {NAMESPACE_NAME_LABEL: namespace}

    def carriers(self, kind: CarrierKind) -> Iterable[TermCarrier]:
        """The distinct terms of ``kind`` the placed pods carry."""
        return self._carriers[kind].values()

    # ------------------------------------------------------------------ counting
    def counter(self, key: MatchKey) -> MatchCounter:
        """The counter for ``key``, registered (one scan of the pods) on first use."""
        found = self._counters.get(key)
        if found is not None:
            self._counters.move_to_end(key)
            return found
        found = MatchCounter(key, self._labels, self.members)
        for node, pod in self._pods.values():
            if self._matches(key, pod):
                found.per_node[node] = found.per_node.get(node, 0) + 1
        self._counters[key] = found
        anchor = key.matchers[0].selector.anchor if key.matchers else None
        if anchor is None:
            self._unanchored.add(key)
        else:
            self._anchored.setdefault(anchor, set()).add(key)
        while len(self._counters) > MAX_COUNTERS:
            self._drop(next(iter(self._counters)))
        return found

    def _drop(self, key: MatchKey) -> None:
        del self._counters[key]
        anchor = key.matchers[0].selector.anchor if key.matchers else None
        if anchor is None:
            self._unanchored.discard(key)
        else:
            keys = self._anchored[anchor]
            keys.discard(key)
            if not keys:
                del self._anchored[anchor]

    def _matches(self, key: MatchKey, pod: ScheduledPod) -> bool:
        if key.skip_terminating and pod.terminating:
            return False
        namespace, labels = pod.namespace, pod.labels
        for matcher in key.matchers:
            if not matcher.matches(namespace, labels, self.namespace_labels):
                return False
        return bool(key.matchers)

    def _candidates(self, pod: ScheduledPod) -> Iterator[MatchCounter]:
        seen: set[MatchKey] = set()
        for item in pod.labels.items():
            for key in self._anchored.get(item, ()):
                if key not in seen:
                    seen.add(key)
                    yield self._counters[key]
        for key in self._unanchored:
            yield self._counters[key]

    # ------------------------------------------------------------------ updates
    def add(self, uid: str, node: str, pod: ScheduledPod) -> None:
        """Count ``pod`` on ``node`` (replacing what was counted for ``uid``)."""
        if uid in self._pods:
            self.remove(uid)
        self._pods[uid] = (node, pod)
        self._node_pods.setdefault(node, set()).add(uid)
        if pod.ports:
            self._ports.setdefault(node, PortSet()).add(pod.ports)
        self._update(node, pod, 1)

    def remove(self, uid: str) -> None:
        """Stop counting pod ``uid`` (nothing if it is not counted)."""
        found = self._pods.pop(uid, None)
        if found is None:
            return
        node, pod = found
        pods = self._node_pods[node]
        pods.discard(uid)
        if not pods:
            del self._node_pods[node]
        if pod.ports:
            ports = self._ports[node]
            ports.remove(pod.ports)
            if not ports:
                del self._ports[node]
        self._update(node, pod, -1)

    def _update(self, node: str, pod: ScheduledPod, delta: int) -> None:
        for counter in list(self._candidates(pod)):
            if self._matches(counter.key, pod):
                counter._count(node, delta)
        if not pod.affinity:
            return
        labels = self._labels.get(node)
        for kind, term, weight in _carried(pod):
            carriers = self._carriers[kind]
            carrier = carriers.get((term, weight))
            if carrier is None:
                if delta < 0:
                    continue
                carrier = carriers[term, weight] = TermCarrier(kind, term, weight, self.members)
            carrier._count(node, labels, delta)
            if not carrier.per_node:
                del carriers[term, weight]

    def set_nodes(self, labels: Mapping[str, Mapping[str, str]]) -> None:
        """The nodes and their labels (domains are recomputed from the per-node counts)."""
        self._labels = dict(labels)
        self._members.clear()
        for counter in self._counters.values():
            counter._relabel(self._labels)
        for carriers in self._carriers.values():
            for carrier in carriers.values():
                carrier._relabel(self._labels)

    def set_node_labels(self, name: str, labels: Mapping[str, str] | None) -> None:
        """One node's labels changed (None: the node went); its pods move between domains."""
        old = self._labels.get(name)
        if old == labels:
            return
        if labels is None:
            del self._labels[name]
        else:
            self._labels[name] = labels
        # (Rare: the label index and every node set over a threshold are dropped, and rebuilt
        # on their next use; a node without matching pods may enter or leave such a set too.)
        self._members.clear()
        for counter in self._counters.values():
            counter._over.sets.clear()
            count = counter.per_node.get(name)
            if count:
                counter._move(count, old, labels)
        for carriers in self._carriers.values():
            for carrier in carriers.values():
                carrier._over.sets.clear()
                count = carrier.per_node.get(name)
                if count:
                    carrier._move(count, old, labels)

    def set_namespace(self, name: str, labels: Mapping[str, str] | None) -> bool:
        """A namespace's labels (None: it went). Counters whose terms select namespaces by
        label are dropped when they change (registered again on next use). Returns whether
        anything changed."""
        current = self._namespaces.get(name)
        new = dict(labels) if labels is not None else None
        if current == new:
            return False
        if new is None:
            del self._namespaces[name]
        else:
            self._namespaces[name] = new
        for key in [
            k for k in self._counters if any(not m.namespace_selector.nothing for m in k.matchers)
        ]:
            self._drop(key)
        return True

    def namespaces(self) -> Mapping[str, Mapping[str, str]]:
        return self._namespaces

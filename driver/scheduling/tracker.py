"""What the decision engine counts: allocated claims and pods on nodes, as observed in the
cluster, plus the engine's own placements in flight.

This is the engine's bookkeeping, as kube-scheduler's DRA manager keeps it: the devices that
allocated claims hold (followed from the claim informer and the writes the scheduler made
itself) plus its in-flight allocations (decided, not yet written). :class:`ClusterTracker`
keys everything, so an observation replaces what was known before instead of adding to it:

* :meth:`~ClusterTracker.assume` records a placement in flight: its claims' allocations (by
  claim key), its KEP-5004 bridge allocation (the bridge claim has no name yet) and the pod's
  requests on its node;
* :meth:`~ClusterTracker.observe_allocation` records a claim's allocation as the cluster shows
  it (appearing, changing, disappearing). A claim holds one allocation, so the observed one
  replaces the allocation in flight for that claim; when they are equal (the controller's own
  write seen again) nothing moves. A bridge claim's allocation *lands* on its pod's in-flight
  bridge allocation only when equal (anything else is another claim, counted on its own);
* :meth:`~ClusterTracker.observe_pod` records a pod on its node (or its going): its requests
  and what the rules between pods read of it (a
  :class:`~driver.scheduling.podindex.ScheduledPod`); it replaces what the pod was assumed
  with;
* :meth:`~ClusterTracker.forget` drops what a failed placement has not landed.

Every update returns a :class:`Change`: the allocation results to remove, then to add, and
the nodes whose pod usage changed. The engine applies it to its snapshot and index; a rebuild
reads :meth:`~ClusterTracker.counted` instead. The pods counted are also kept in
:attr:`ClusterTracker.pods` (a :class:`~driver.scheduling.podindex.PodIndex`), updated with every
change. Updates are idempotent where the cluster can repeat itself (the same observation twice
changes nothing), and nothing is ever counted twice or dropped while it may still be held.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

from driver.api.claims import AllocationResult
from driver.scheduling.nodefit import NodeUsage
from driver.scheduling.podindex import PodIndex, ScheduledPod


class Change(NamedTuple):
    """What one update did to the counted state."""

    removed: tuple[AllocationResult, ...] = ()
    added: tuple[AllocationResult, ...] = ()
    nodes: tuple[str, ...] = ()  # nodes whose pod usage changed
    landed: bool = False  # an observation recognised as what was assumed


NO_CHANGE: Final = Change()
LANDED: Final = Change(landed=True)
_NO_USAGE: Final = NodeUsage()


@dataclass(slots=True)
class _InFlight:
    """What a placement in flight still holds that the cluster has not shown yet."""

    node: str
    claims: dict[str, AllocationResult]
    bridge: AllocationResult | None


@dataclass(frozen=True, slots=True)
class _PodEntry:
    node: str
    pod: ScheduledPod
    assumed: bool  # counted because this engine placed it; not seen on the node yet


def _net(removed: list[AllocationResult], added: list[AllocationResult], landed: bool) -> Change:
    """Removals and additions with equal results cancelled out."""
    for result in list(removed):
        if result in added:
            added.remove(result)
            removed.remove(result)
    if not removed and not added:
        return LANDED if landed else NO_CHANGE
    return Change(tuple(removed), tuple(added))


class ClusterTracker:
    """See the module docstring. ``pods_on_nodes`` is usage counted from the start and never
    observed pod by pod (the simulator's and the benchmark's running pods)."""

    def __init__(self, pods_on_nodes: Mapping[str, NodeUsage] | None = None) -> None:
        self._baseline: dict[str, NodeUsage] = dict(pods_on_nodes or {})
        self._usage: dict[str, NodeUsage] = dict(self._baseline)
        self._held: dict[str, AllocationResult] = {}  # claim key -> observed allocation
        self._in_flight: dict[str, _InFlight] = {}  # pod uid -> what has not landed
        self._claim_pods: dict[str, str] = {}  # claim key in flight -> pod uid
        self._pods: dict[str, _PodEntry] = {}  # pod uid -> where it counts
        self._node_pods: dict[str, set[str]] = {}
        self.pods = PodIndex()  # the same pods, for the rules between pods

    # ------------------------------------------------------------------ reading
    def usage(self, node: str) -> NodeUsage:
        """What the pods on ``node`` request."""
        return self._usage.get(node, _NO_USAGE)

    def usages(self) -> dict[str, NodeUsage]:
        """Every node's usage that has a pod on it."""
        return {node: usage for node, usage in self._usage.items() if usage.pods}

    def counted(self) -> Iterator[AllocationResult]:
        """Every allocation counted: observed ones, then those in flight."""
        yield from self._held.values()
        for flight in self._in_flight.values():
            yield from flight.claims.values()
            if flight.bridge is not None:
                yield flight.bridge

    def in_flight(self, pod: str) -> bool:
        """Whether a placement of ``pod`` still holds something the cluster has not shown."""
        return pod in self._in_flight

    def held(self, claim: str) -> AllocationResult | None:
        """The allocation the cluster shows for ``claim`` (None: none)."""
        return self._held.get(claim)

    def observed_on(self, node: str) -> list[ScheduledPod]:
        """The pods seen on ``node`` (not those this engine placed and has not seen yet)."""
        pods = self._pods
        return [
            pods[uid].pod for uid in sorted(self._node_pods.get(node, ())) if not pods[uid].assumed
        ]

    def counts(self, pod: str) -> bool:
        """Whether ``pod`` counts on some node."""
        return pod in self._pods

    # ------------------------------------------------------------------ what-if
    def lift(self, pod: str) -> tuple[str, ScheduledPod, bool] | None:
        """Take ``pod`` off its node for a what-if; :meth:`drop_in` puts it back. Returns
        (node, pod, assumed), or None when it counts nowhere."""
        entry = self._pods.get(pod)
        if entry is None:
            return None
        self._set_pod(pod, None)
        return entry.node, entry.pod, entry.assumed

    def drop_in(self, pod: str, node: str, scheduled: ScheduledPod, assumed: bool) -> None:
        """Count ``pod`` on ``node`` as ``scheduled`` (undoes :meth:`lift`, or places a pod
        for a what-if, ``assumed`` then True; lift it again afterwards)."""
        self._set_pod(pod, _PodEntry(node, scheduled, assumed))

    # ------------------------------------------------------------------ updates
    def assume(
        self,
        pod: str,
        node: str,
        claims: Mapping[str, AllocationResult],
        bridge: AllocationResult | None,
        scheduled: ScheduledPod,
    ) -> Change:
        """A placement of ``pod`` (its UID) decided and not yet written."""
        if pod in self._in_flight:
            raise ValueError(f"pod {pod} already has a placement in flight")
        taken = [key for key in claims if key in self._claim_pods]
        if taken:
            raise ValueError(f"claim {taken[0]} is already in flight for another pod")
        self._in_flight[pod] = _InFlight(node, dict(claims), bridge)
        for key in claims:
            self._claim_pods[key] = pod
        added = (*claims.values(), *((bridge,) if bridge is not None else ()))
        nodes = self._set_pod(pod, _PodEntry(node, scheduled, assumed=True))
        return Change((), added, nodes)

    def forget(self, pod: str) -> Change:
        """The placement of ``pod`` will not be written: drop what has not landed."""
        removed: tuple[AllocationResult, ...] = ()
        flight = self._in_flight.pop(pod, None)
        if flight is not None:
            for key in flight.claims:
                del self._claim_pods[key]
            removed = tuple(self._results(flight))
        nodes: tuple[str, ...] = ()
        entry = self._pods.get(pod)
        if entry is not None and entry.assumed:
            nodes = self._set_pod(pod, None)
        if not removed and not nodes:
            return NO_CHANGE
        return Change(removed, (), nodes)

    def observe_allocation(
        self, claim: str, allocation: AllocationResult | None, *, bridge_of: str | None = None
    ) -> Change:
        """The cluster shows ``claim`` (its key) with ``allocation`` (None: unallocated or
        gone). ``bridge_of`` is the UID of the pod whose KEP-5004 bridge claim it is."""
        old = self._held.get(claim)
        landed: AllocationResult | None = None
        if allocation is not None:
            pod = self._claim_pods.pop(claim, None)
            if pod is not None:
                landed = self._in_flight[pod].claims.pop(claim)
                self._settle(pod)
            elif bridge_of is not None and old is None:
                flight = self._in_flight.get(bridge_of)
                if flight is not None and flight.bridge == allocation:
                    landed, flight.bridge = allocation, None
                    self._settle(bridge_of)
            self._held[claim] = allocation
        elif old is not None:
            del self._held[claim]
        if old == allocation and landed is None:
            return NO_CHANGE
        removed = [a for a in (old, landed) if a is not None]
        added = [allocation] if allocation is not None else []
        return _net(removed, added, landed is not None)

    def observe_pod(self, pod: str, node: str | None, scheduled: ScheduledPod | None) -> Change:
        """The cluster shows ``pod`` (its UID) counting on ``node`` as ``scheduled`` (node
        None: the pod is gone or finished and counts nowhere)."""
        entry = self._pods.get(pod)
        if node is None or scheduled is None:
            return Change(nodes=self._set_pod(pod, None)) if entry is not None else NO_CHANGE
        observed = _PodEntry(node, scheduled, assumed=False)
        if entry is not None and entry.node == node and entry.pod == scheduled:
            if entry.assumed:
                self._pods[pod] = observed  # our placement seen on its node: it lands
                return LANDED
            return NO_CHANGE
        return Change(nodes=self._set_pod(pod, observed))

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _results(flight: _InFlight) -> Iterator[AllocationResult]:
        yield from flight.claims.values()
        if flight.bridge is not None:
            yield flight.bridge

    def _settle(self, pod: str) -> None:
        flight = self._in_flight[pod]
        if not flight.claims and flight.bridge is None:
            del self._in_flight[pod]

    def _set_pod(self, pod: str, entry: _PodEntry | None) -> tuple[str, ...]:
        """Count ``pod`` as ``entry`` (None: nowhere); returns the nodes whose usage changed."""
        nodes: list[str] = []
        current = self._pods.pop(pod, None)
        if current is not None:
            self._node_pods[current.node].discard(pod)
            nodes.append(current.node)
            self.pods.remove(pod)
        if entry is not None:
            self._pods[pod] = entry
            self._node_pods.setdefault(entry.node, set()).add(pod)
            self.pods.add(pod, entry.node, entry.pod)
            if entry.node not in nodes:
                nodes.append(entry.node)
        for node in nodes:
            self._recount(node)
        return tuple(nodes)

    def _recount(self, node: str) -> None:
        """Sum the node's usage again (never by subtraction: the sum stays exact)."""
        usage = self._baseline.get(node)
        pods = self._node_pods.get(node)
        if pods:
            entries = self._pods
            usage = (usage or _NO_USAGE).plus_all(entries[pod].pod.requests for pod in pods)
        elif pods is not None:
            del self._node_pods[node]
        if usage is None:
            self._usage.pop(node, None)
        else:
            self._usage[node] = usage

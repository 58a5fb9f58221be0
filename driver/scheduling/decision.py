"""The decision engine: where does one pod go, and with which devices?

Used by ``biaxial simulate`` and the controller. For one pod (its raw JSON and its
ResourceClaims), :meth:`DecisionEngine.decide`:

1. resolves the pod's policies (annotations, defaults), its legacy extended resources
   (KEP-5004 bridge, with the dialect annotations of :mod:`driver.scheduling.dialects`) and
   its scheduling facts; bad input is a :class:`~driver.scheduling.outcome.PodError` for that
   pod (``_context``), including what :func:`driver.scheduling.checks.check_pod_input` refuses
   and a claim whose ``GpuConfig`` the node would refuse at Prepare
   (:func:`driver.api.config.check_claim_config`), so nothing is allocated for it;
2. computes the pod's rules between pods and soft rules once (:mod:`driver.scheduling.rules`,
   kube-scheduler's PreFilter/PreScore: topology spread, pod (anti-)affinity, preferred node
   affinity, ``PreferNoSchedule`` taints) from the pods it counts;
3. filters nodes in kube-scheduler's order (:mod:`driver.scheduling.nodefit` with NodePorts and
   pod-level resources, the volume rules of :mod:`driver.scheduling.volumes`, then the pod's
   rules), builds the node's variant of the bridge claim, allocates *all* the pod's
   unallocated claims on the node with the allocator, the GPU axis ordering devices
   (:mod:`driver.scheduling.scoring`), scores the node on the node axis (cpu and memory for a
   pod without devices) and subtracts the soft rules' weighted penalty (``_evaluate``);
4. picks the best node (highest total; ties by the System default spreading, then by name)
   and returns a
   :class:`~driver.scheduling.outcome.Placement`, or an
   :class:`~driver.scheduling.outcome.Unschedulable` with kube-scheduler's per-node reasons.

**Pruning.** For a pod whose bounds hold, the engine computes per partition of the capacity
index's view of the kinds it may use an optimistic bound of the node score and walks nodes
best bound first (:mod:`driver.scheduling.search`, where the walk and its exactness are told).
The result is identical to evaluating every node; :class:`DecisionEngine` takes
``exhaustive=True`` for that reference. Pruning is switched off (every node evaluated) where a
bound would not hold: slices that are not node-local, ``All`` or admin-access requests, pods
with allocated claims, ``gpumem-percentage``, and legacy resources some node serves through a
device plugin. When nothing fits, every node is evaluated for the kube-scheduler message.

**Preemption.** :meth:`DecisionEngine.preempt` runs the dry run of
:mod:`driver.scheduling.dryrun`, which asks the engine only through its what-if interface
(:meth:`~DecisionEngine.what_if` and the methods beside it): pods on a node, and views of a
node with some pods gone (:class:`WhatIf`) in which the pod's fit is asked.

**What it counts.** The engine is told about the cluster and about its own decisions only
through its methods, as kube-scheduler's DRA manager is fed from informers and its assume
cache (the bookkeeping is :mod:`driver.scheduling.tracker`):

* :meth:`DecisionEngine.assume` counts a placement before it is written;
  :meth:`~DecisionEngine.forget` drops it when the writes fail. When the cluster later shows
  the written claims and the bound pod, the observation is recognised as the assumed
  placement: nothing moves.
* :meth:`~DecisionEngine.observe_allocation` and :meth:`~DecisionEngine.observe_pod` follow
  allocated claims and pods on nodes (any writer, any scheduler): each is a delta on the
  snapshot and re-files only the nodes whose devices it touches; a pod also updates the pod
  index the rules between pods count with (:mod:`driver.scheduling.podindex`).
* :meth:`~DecisionEngine.observe_namespace` and :meth:`~DecisionEngine.observe_owner` give
  namespace labels (``namespaceSelector``) and the selectors of Services, ReplicationControllers,
  ReplicaSets and StatefulSets (default topology spreading).
* :meth:`~DecisionEngine.observe_node`, :meth:`~DecisionEngine.observe_slice` and
  :meth:`~DecisionEngine.observe_class` change what the index is built from: the engine
  rebuilds it (keeping the CEL cache) before the next decision. A heartbeat changes nothing.
* :meth:`~DecisionEngine.observe_volume` follows what the volume rules read (PVCs, PVs,
  StorageClasses, CSI nodes and drivers, capacities, attachments) and ``observe_pod`` the
  volumes of pods on nodes, both into :class:`~driver.scheduling.volumes.ClusterVolumes`; the
  engine's ``assume`` and ``forget`` pass a placement's volume bindings on to it. A volume rule that
  rules out every node (a missing claim) makes the decision ``Unschedulable`` with upstream's
  message; per node the volume rules are one more filter, applied to the nodes the search
  evaluates (pruning stays exact: a filter only removes nodes).

Updates are cheap and lazy; :meth:`~DecisionEngine.sync` (called by ``decide``) applies them.
:meth:`~DecisionEngine.state` exposes what the engine counts, so tests can compare an engine
kept up to date with one built at once. Decisions never mutate their inputs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from fractions import Fraction
from typing import Any, Final, TypeVar

from driver.api.claims import AllocationResult, DeviceClass, ResourceClaim
from driver.api.config import check_claim_config
from driver.api.errors import BiaxialError, InvalidInputError, NodeAllocationError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import ResourceSlice
from driver.api.multimap import Multimap
from driver.api.nodes import Node, node_selector_matches
from driver.scheduling.bounds import (
    Demand,
    ShapeBounds,
    Usable,
    pod_demand,
    precheck,
    shape_bounds,
)
from driver.scheduling.bridge import (
    BridgeMemo,
    ExtendedResourceMap,
    PodLegacyResources,
    dra_resources_on_node,
    filter_exempt,
    pod_name,
)
from driver.scheduling.capacity_index import (
    CapacityIndex,
    FilingEntry,
    NodeShape,
    Variant,
    ViewShape,
)
from driver.scheduling.checks import (
    ClusterFacts,
    check_deprecated,
    check_pod_input,
    cluster_facts,
    unserved,
)
from driver.scheduling.classification import DeviceClassifier
from driver.scheduling.dryrun import NEVER, NOT_HELPFUL, dry_run
from driver.scheduling.nodefit import (
    NodeUsage,
    PodSchedulingFacts,
    filter_node,
    node_allocatable,
    resource_utilisation,
    unschedulable_message,
)
from driver.scheduling.outcome import (
    REASON_CLAIM_NODE,
    REASON_CLAIMS,
    REASON_NO_GPUS,
    ClaimAllocation,
    Decision,
    NoPreemption,
    Placement,
    PodError,
    Preemption,
    PreFilterRejectedError,
    Unschedulable,
)
from driver.scheduling.podcontext import (
    ZERO,
    Best,
    BridgeKey,
    BridgeVariant,
    DecisionStats,
    NodeOutcome,
    PodContext,
    UsableKinds,
)
from driver.scheduling.podindex import ScheduledPod, same_view
from driver.scheduling.policy import PodPolicies, PolicyDefaults, policies_for_pod
from driver.scheduling.preemption import NOT_STARTED, DisruptionBudget, may_preempt
from driver.scheduling.rules import RuleEnvironment, pod_rules
from driver.scheduling.scoring import (
    NUMA_NODE,
    PCIE_ROOT,
    gpu_order,
    node_score,
    rank,
)
from driver.scheduling.search import WalkStarts, best_first
from driver.scheduling.storage import PodVolumes, VolumeBindings
from driver.scheduling.topologyspread import DefaultSpreading, OwnerSelectors
from driver.scheduling.tracker import Change, ClusterTracker
from driver.scheduling.volumes import ClusterVolumes, VolumeState
from driver.structured.allocator import (
    DEFAULT_SEARCH_BUDGET,
    SearchStats,
    allocate,
)
from driver.structured.snapshot import AllocatedState, ClusterSnapshot

log = logging.getLogger(f"biaxial.{__name__}")

BRIDGE_CLAIM_PLACEHOLDER: Final = "<extended-resources>"
_NO_USAGE: Final = NodeUsage()


# --------------------------------------------------------------------------- per-pod context


def pod_uid(pod: Mapping[str, Any]) -> str:
    """The pod's UID (``namespace/name`` for a pod that has none, as in a test)."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    return str(uid) if uid else f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


# --------------------------------------------------------------------------- the engine


_T = TypeVar("_T")


def _advertised(nodes: Iterable[Node]) -> frozenset[str]:
    """Extended resources some node advertises (served by a device plugin there)."""
    return frozenset(
        name
        for node in nodes
        for name, quantity in node.allocatable.items()
        if "/" in name and quantity.sign() > 0
    )


def _replace(store: dict[str, _T], name: str, value: _T | None) -> bool:
    """Put ``value`` (None: remove) under ``name``; whether that changed anything."""
    if store.get(name) == value:
        return False
    if value is None:
        del store[name]
    else:
        store[name] = value
    return True


@dataclass(frozen=True, slots=True)
class _PodShape:
    """What :meth:`DecisionEngine._context` parsed of a pod that did not depend on its name,
    UID or deletion state (each part is re-named for an equal pod), with the engine state the
    parts were built against: the DeviceClasses' resource map (``bridge``, one per rebuild),
    the largest GPU memory and the policy defaults. A pod with volumes the rules read has no
    shape (their PreFilter reads the cluster's volumes)."""

    facts: PodSchedulingFacts
    scheduled: ScheduledPod
    policies: PodPolicies
    legacy: PodLegacyResources
    bridge: BridgeMemo
    max_gpu_memory: int
    defaults: PolicyDefaults


@dataclass(frozen=True, slots=True)
class _Nomination:
    """A pod nominated to a node (``status.nominatedNodeName``): what it holds there against
    pods of equal or lower priority until it is placed: its requests and ports, and the
    devices this engine planned for it when it preempted (``results``; none for a foreign
    nomination, whose devices only upstream's own rules know)."""

    node: str
    pod: ScheduledPod
    results: tuple[AllocationResult, ...] = ()


def _start_time(pod: Mapping[str, Any]) -> float:
    """``status.startTime`` in seconds (:data:`NOT_STARTED` when absent or unreadable)."""
    text = (pod.get("status") or {}).get("startTime")
    if not text:
        return NOT_STARTED
    try:
        return datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return NOT_STARTED


@dataclass(frozen=True, slots=True)
class EngineState:
    """What an engine counts and how its index files the nodes, comparable between engines:
    one kept up to date by observations must equal one built from the same cluster at once."""

    allocated: AllocatedState
    usage: Mapping[str, NodeUsage]
    nodes: Mapping[str, Node]
    filing: frozenset[FilingEntry]
    pods: Mapping[str, tuple[str, ScheduledPod]]  # what the rules between pods count
    namespaces: Mapping[str, Mapping[str, str]]
    volumes: VolumeState


class DecisionEngine:
    """Decides pods one at a time against a cluster it is told about (see the module
    docstring). ``snapshot`` and ``nodes`` are the cluster to start from; allocations already
    in the snapshot and ``pods_on_nodes`` count for good (they are never observed again; pods
    the rules between pods should see are told with :meth:`observe_pod`). ``spreading``: the
    default topology spread constraints (kube-scheduler's System defaults unless given).
    ``reuse_verdicts=False`` runs every victim search of :meth:`preempt` in full (the reference
    the shared verdicts are compared with; ``exhaustive=True`` implies it)."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        nodes: Sequence[Node],
        *,
        defaults: PolicyDefaults | None = None,
        pods_on_nodes: Mapping[str, NodeUsage] | None = None,
        exhaustive: bool = False,
        budget: int = DEFAULT_SEARCH_BUDGET,
        driver_name: str = DEFAULT_DRIVER_NAME,
        spreading: DefaultSpreading | None = None,
        reuse_verdicts: bool = True,
    ) -> None:
        self.driver_name = driver_name  # whose opaque config (GpuConfig) the engine checks
        self.defaults = defaults or PolicyDefaults()
        self.budget = budget
        self.stats = DecisionStats()
        self.snapshot = snapshot
        self._nodes: dict[str, Node] = {n.name: n for n in nodes}
        self._exhaustive_asked = exhaustive
        self._reuse_verdicts = reuse_verdicts
        self._baseline = snapshot.allocated
        self._slices = {s.name or f"#{i}": s for i, s in enumerate(snapshot.slices)}
        self._classes = dict(snapshot.classes)
        self._tracker = ClusterTracker(pods_on_nodes)
        self._rules = RuleEnvironment(self._tracker.pods, spreading, OwnerSelectors())
        # What preemption reads besides the pods: start times, who reserves each allocated
        # claim, and the nominations that hold resources on their nodes.
        self._started: dict[str, float] = {}
        self._reservers: dict[str, tuple[str, ...]] = {}  # claim -> pod UIDs, sorted
        self._claims_of: Multimap[str, str] = Multimap()  # pod UID -> claims it reserves
        self._nominations: dict[str, _Nomination] = {}
        self._nominated: dict[str, set[str]] = {}  # node -> nominated pod UIDs
        # The pod of the last decision and what the pod index would keep of it (assume reads
        # it instead of parsing the pod again).
        self._decided: tuple[Mapping[str, Any] | None, ScheduledPod] = (None, ScheduledPod(""))
        # Per pod assumed and not seen since, the pod as assumed and its view: observe_pod
        # takes the view for the bound pod when nothing the view reads has changed.
        self._assumed_views: dict[str, tuple[Mapping[str, Any], ScheduledPod]] = {}
        self._volumes = ClusterVolumes()  # what the volume rules read
        self._rebuild_due = False  # classes changed, or a change only a rebuild follows
        self._base_changed = False  # slices or classes: the snapshot itself is rebuilt too
        self._stale: set[str] = set()  # nodes whose filed state lags behind the snapshot
        # Changes applied node by node at the next sync: slice name -> the object the
        # snapshot holds (None: it had none), and nodes that came, went or changed.
        self._slice_changes: dict[str, ResourceSlice | None] = {}
        self._node_changes: set[str] = set()
        self._allocatable: dict[str, dict[str, int]] = {}
        self._facts: tuple[tuple[object, int, object], ClusterFacts] | None = None
        # Claim specs (requests, config) that passed _check_spec, with the classes they
        # passed against.
        self._specs_passed: dict[tuple[int, int], tuple[object, object, object]] = {}
        # Per-shape bounds of earlier pods alike (same requests and usable kinds), by view
        # shape: pods of one Deployment share them (kept until the index is rebuilt).
        self._bounds_memo: dict[tuple[object, ...], tuple[ViewShape, ShapeBounds]] = {}
        # Per pod signature (decide's argument), what _context parsed of an earlier pod alike:
        # the replicas of a Deployment are parsed once.
        self._shapes: dict[str, _PodShape] = {}
        self._starts = WalkStarts()  # the node search's starting heaps (they read the index)
        self._derive()

    @classmethod
    def empty(
        cls,
        *,
        defaults: PolicyDefaults | None = None,
        budget: int = DEFAULT_SEARCH_BUDGET,
        driver_name: str = DEFAULT_DRIVER_NAME,
        spreading: DefaultSpreading | None = None,
    ) -> DecisionEngine:
        """An engine that knows nothing yet, to be told the cluster by ``observe_*``."""
        snapshot = ClusterSnapshot.build((), ())
        return cls(
            snapshot,
            (),
            defaults=defaults,
            budget=budget,
            driver_name=driver_name,
            spreading=spreading,
        )

    # ------------------------------------------------------------------ deciding
    def decide(
        self,
        pod: Mapping[str, Any],
        claims: Sequence[ResourceClaim] = (),
        *,
        signature: str | None = None,
    ) -> Decision:
        """Decide one pod. ``claims`` are the pod's ResourceClaims (``spec.resourceClaims``
        order), already created from templates by the caller. ``signature``, when given, must
        be equal for two pods only when everything the engine reads of them but their name,
        UID, deletion time, owners and claims' names is equal: namespace, labels, annotations,
        spec and status (what :func:`controller.equivalence.pod_signature` gives). The second
        pod's parsing is then taken from the first's and named for it; the answer is the same
        as without. Inside a
        ``driver.cel.cost.limits(deadline=...)`` block, a deadline that passes while selectors
        are evaluated raises :class:`~driver.api.errors.DeadlineExceededError` (no decision;
        what the engine counts is unchanged)."""
        started = time.perf_counter()
        try:
            self.sync()
            decision = self._decide(pod, claims, signature)
        finally:
            elapsed = time.perf_counter() - started
            self.stats.decisions += 1
            self.stats.seconds += elapsed
        # DEBUG: a caller logs the outcome its own way, once (the controller's line when the
        # pod is bound carries the policies, nodes evaluated and time; a line per pod costs).
        if log.isEnabledFor(logging.DEBUG):
            if isinstance(decision, Placement):
                log.debug(
                    "pod %s: node %s (policies node=%s gpu=%s, %d node(s) evaluated, %.2f ms)",
                    decision.pod,
                    decision.node,
                    decision.policies.node,
                    decision.policies.gpu,
                    decision.evaluated,
                    elapsed * 1000,
                )
            else:
                log.debug("pod %s: %s (%.2f ms)", decision.pod, decision.message, elapsed * 1000)
        return decision

    # ------------------------------------------------------------------ its own decisions
    def assume(self, placement: Placement, pod: Mapping[str, Any]) -> None:
        """Count a placement from now on, before its writes: its devices are held and the
        pod counts on its node (requests, host ports, labels for the rules between pods),
        until the cluster shows them (then nothing moves) or :meth:`forget` drops them.
        ``pod`` is not changed afterwards (the pod the cluster shows is compared with it)."""
        uid = pod_uid(pod)
        self._set_nomination(uid, None)  # placed: it holds what it was given instead
        decided, scheduled = self._decided
        if decided is not pod or scheduled.uid != uid:  # not the pod just decided: parse it
            scheduled = ScheduledPod.from_pod(pod, uid)
        self._apply(
            self._tracker.assume(
                uid,
                placement.node,
                {claim.key: allocation for claim, allocation in placement.claims},
                placement.bridge_allocation,
                scheduled,
            )
        )
        if len(self._assumed_views) >= _ASSUMED_VIEWS:
            self._assumed_views.clear()
        self._assumed_views[uid] = (pod, scheduled)
        self._volumes.assume(uid, placement.node, PodVolumes.from_pod(pod), placement.volumes)

    def forget(self, pod: str) -> None:
        """The placement assumed for the pod with UID ``pod`` will not be written (or was
        rolled back): drop what the cluster has not shown yet."""
        self._assumed_views.pop(pod, None)
        self._apply(self._tracker.forget(pod))
        self._volumes.forget(pod)

    # ------------------------------------------------------------------ the cluster
    def observe_allocation(
        self,
        claim: str,
        allocation: AllocationResult | None,
        *,
        bridge_of: str | None = None,
        reserved_for: Iterable[str] = (),
    ) -> None:
        """The cluster shows claim ``claim`` (``namespace/name``) with ``allocation`` (None:
        unallocated, or gone). ``bridge_of``: the UID of the pod whose KEP-5004 bridge claim
        it is (so an assumed bridge allocation is recognised when its claim appears).
        ``reserved_for``: the UIDs in its ``status.reservedFor`` (preemption frees a claim's
        devices only when every pod reserving it is a victim)."""
        self._apply(self._tracker.observe_allocation(claim, allocation, bridge_of=bridge_of))
        users = tuple(sorted(set(reserved_for))) if allocation is not None else ()
        old = self._reservers.get(claim, ())
        if users == old:
            return
        for uid in old:
            if uid not in users:
                self._claims_of.discard(uid, claim)
        for uid in users:
            self._claims_of.add(uid, claim)
        if users:
            self._reservers[claim] = users
        else:
            self._reservers.pop(claim, None)

    def observe_pod(
        self,
        pod: str,
        node: str | None,
        requests: Mapping[str, int] | None = None,
        volumes: PodVolumes | None = None,
        *,
        raw: Mapping[str, Any] | None = None,
    ) -> None:
        """The pod with UID ``pod`` counts on ``node`` (None: it is gone or finished) with
        ``volumes``. Any pod counts, whichever scheduler placed it. ``raw``: the pod's JSON,
        from which its requests, labels, host ports and affinity terms are read (ManifestError
        when it does not parse; nothing changes then); without it, only ``requests`` count."""
        scheduled: ScheduledPod | None = None
        assumed = self._assumed_views.pop(pod, None)
        if node is not None:
            if raw is not None:
                if assumed is not None and same_view(assumed[0], raw):
                    scheduled = assumed[1]  # our placement, bound: what it was assumed as
                else:
                    scheduled = ScheduledPod.from_pod(raw, pod)
                if requests is not None:
                    scheduled = replace(scheduled, requests=dict(requests))
                self._started[pod] = _start_time(raw)
            else:
                scheduled = ScheduledPod(uid=pod, requests=dict(requests or {}))
            self._set_nomination(pod, None)  # bound: a nomination no longer holds
        else:
            self._started.pop(pod, None)
            self._set_nomination(pod, None)
        self._apply(self._tracker.observe_pod(pod, node, scheduled))
        self._volumes.observe_pod(pod, node, volumes)

    def observe_volume(self, kind: str, key: str, raw: Mapping[str, Any] | None) -> None:
        """An object the volume rules read (a kind of
        :data:`~driver.scheduling.volumes.VOLUME_KINDS`, raw API JSON; ``key`` its
        ``namespace/name`` or name) appeared, changed or (None) went. Raises
        :class:`~driver.api.errors.ManifestError` for a malformed one (nothing changes)."""
        self._volumes.observe(kind, key, raw)

    def observe_start(self, pod: str, raw: Mapping[str, Any]) -> None:
        """A bound pod's ``status.startTime`` (preemption prefers victims that started
        later)."""
        if self._tracker.counts(pod):
            self._started[pod] = _start_time(raw)

    # ------------------------------------------------------------------ nominations
    def nominate(self, preemption: Preemption, pod: Mapping[str, Any]) -> None:
        """Hold what ``preemption`` planned on its node for ``pod`` (its requests, ports and
        planned devices) against pods of equal or lower priority, until the pod is placed,
        bound, gone, or its nomination changes (:meth:`observe_nomination`)."""
        uid = pod_uid(pod)
        scheduled = ScheduledPod.from_pod(pod, uid)
        results = preemption.placement.all_results
        self._set_nomination(uid, _Nomination(preemption.node, scheduled, results))

    def observe_nomination(self, pod: str, node: str | None, raw: Mapping[str, Any]) -> None:
        """The cluster shows pending pod ``pod`` (UID) with ``status.nominatedNodeName``
        ``node`` (None: none): any scheduler's nomination holds the pod's requests and ports
        there against pods of equal or lower priority (the devices of a nomination this engine
        made stay held too). ManifestError when the pod does not parse (nothing changes)."""
        if not node:
            self._set_nomination(pod, None)
            return
        current = self._nominations.get(pod)
        if current is not None and current.node == node:
            return  # (ours, with its planned devices, or already known)
        self._set_nomination(pod, _Nomination(node, ScheduledPod.from_pod(raw, pod)))

    def nomination(self, pod: str) -> str | None:
        """The node pod ``pod`` (UID) is nominated to, as this engine counts it."""
        found = self._nominations.get(pod)
        return found.node if found is not None else None

    def _set_nomination(self, pod: str, nomination: _Nomination | None) -> None:
        old = self._nominations.pop(pod, None)
        if old is not None:
            on = self._nominated.get(old.node)
            if on is not None:
                on.discard(pod)
                if not on:
                    del self._nominated[old.node]
        if nomination is not None:
            self._nominations[pod] = nomination
            self._nominated.setdefault(nomination.node, set()).add(pod)

    def observe_namespace(self, name: str, labels: Mapping[str, str] | None) -> None:
        """A namespace's labels (None: it went), for affinity terms' ``namespaceSelector``."""
        self._tracker.pods.set_namespace(name, labels)

    def observe_owner(
        self, kind: str, namespace: str, name: str, selector: Mapping[str, Any] | None
    ) -> None:
        """The ``spec.selector`` of a Service, ReplicationController, ReplicaSet or
        StatefulSet (None: it went): the default spreading's selector for the pods they own
        or select. ManifestError for a malformed selector (the object then counts as gone)."""
        self._rules.owners.observe(kind, namespace, name, selector)

    def observe_node(self, name: str, node: Node | None) -> bool:
        """A node appeared, changed or (None) went. Returns whether anything scheduling reads
        changed (a heartbeat does not); the node is re-filed before the next decision."""
        if not _replace(self._nodes, name, node):
            return False
        self._node_changes.add(name)
        return True

    def observe_slice(self, name: str, resource_slice: ResourceSlice | None) -> bool:
        """A ResourceSlice appeared, changed or (None) went; see :meth:`observe_node`. A
        node-local slice re-files its node only; any other change rebuilds the index."""
        held = self._slices.get(name)
        if not _replace(self._slices, name, resource_slice):
            return False
        self._slice_changes.setdefault(name, held)
        return True

    def observe_class(self, name: str, device_class: DeviceClass | None) -> bool:
        """A DeviceClass appeared, changed or (None) went; see :meth:`observe_node`. The
        index is rebuilt (every device's kind may change)."""
        if not _replace(self._classes, name, device_class):
            return False
        self._rebuild_due = self._base_changed = True
        return True

    # ------------------------------------------------------------------ upkeep
    def sync(self) -> bool:
        """Bring the index up to date with what was observed, rebuilding it when nodes,
        slices or classes changed (:meth:`decide` does this itself). True when it rebuilt."""
        if self._rebuild_due or (
            (self._slice_changes or self._node_changes) and not self._update()
        ):
            self._rebuild()
            return True
        if self._stale:
            for name in sorted(self._stale):
                node = self._nodes.get(name)
                if node is not None:
                    self._index.refresh(self.snapshot, node)
            self._stale.clear()
        return False

    def device_classes(self, driver: str, pool: str, device: str) -> frozenset[str] | None:
        """The DeviceClasses whose selectors select device ``driver/pool/device`` (a CEL error
        counts as selecting, as for the index); None when no node sees the device. What a
        scheduler's queueing hints ask: which waiting pods a freed device may help."""
        self.sync()
        for name in self._index.nodes_holding((driver, pool)):
            node = self._nodes.get(name)
            if node is None:
                continue
            for cand in self.snapshot.candidates(node).devices:
                found = cand.device_id
                if found.device == device and found.pool == pool and found.driver == driver:
                    return self._classifier.classes_of(cand)
        return None

    def state(self) -> EngineState:
        """What the engine counts now (see :class:`EngineState`)."""
        self.sync()
        return EngineState(
            allocated=self.snapshot.allocated,
            usage=self._tracker.usages(),
            nodes=dict(self._nodes),
            filing=self._index.filing(),
            pods=dict(self._tracker.pods.pods()),
            namespaces=dict(self._tracker.pods.namespaces()),
            volumes=self._volumes.state(),
        )

    def _apply(self, change: Change) -> None:
        if change.landed:
            self.stats.landed += 1
        if self._rebuild_due or not (change.removed or change.added):
            return  # a rebuild reads the tracker
        snapshot = self.snapshot
        if change.removed:
            snapshot = snapshot.without_allocations(change.removed)
        if change.added:
            snapshot = snapshot.with_allocations(change.added)
        self.snapshot = snapshot
        for allocation in (*change.removed, *change.added):
            for result in allocation.results:
                self._stale.update(self._index.nodes_holding((result.driver, result.pool)))

    def _rebuild(self) -> None:
        started = time.perf_counter()
        snapshot = self.snapshot
        if self._base_changed:
            snapshot = ClusterSnapshot.build(
                self._slices.values(), self._classes.values(), match_cache=snapshot.match_cache
            )
        self.snapshot = snapshot.with_state(self._baseline.with_results(self._tracker.counted()))
        self._derive()
        elapsed = time.perf_counter() - started
        self.stats.rebuilds += 1
        self.stats.rebuild_seconds += elapsed
        log.info(
            "decision engine rebuilt: %d nodes, %d slices, %d classes in %.1f ms",
            len(self._nodes),
            len(self._slices),
            len(self._classes),
            elapsed * 1000,
        )

    def _update(self) -> bool:
        """Apply node and node-local slice changes node by node; False when only a rebuild
        can (a slice that is not node-local, or slices spanning the cluster)."""
        snapshot = self.snapshot
        touched = set(self._node_changes)
        if self._slice_changes:
            removed = [held for held in self._slice_changes.values() if held is not None]
            added = [self._slices[name] for name in self._slice_changes if name in self._slices]
            updated = snapshot.with_slices(removed, added)
            if updated is None:
                self._base_changed = True
                return False
            snapshot = updated
            touched |= {s.node_name for s in (*removed, *added) if s.node_name}
        self.snapshot = snapshot
        for name in sorted(touched):
            node = self._nodes.get(name)
            if node is None:
                self._index.remove(name)
                self._allocatable.pop(name, None)
                continue
            self._allocatable[name] = node_allocatable(node)
            self._index.refresh(snapshot, node)
        if self._node_changes:
            self._advertised = _advertised(self._nodes.values())
            for name in sorted(self._node_changes):
                self._rules.node_changed(name, self._nodes.get(name))
        self._max_gpu_memory = max((s.max_memory for s in self._index.shapes.values()), default=0)
        self._slice_changes.clear()
        self._node_changes.clear()
        self.stats.updates += 1
        return True

    def _derive(self) -> None:
        """Everything decisions read that follows from the nodes, slices and classes."""
        snapshot = self.snapshot
        self._nodes = dict(sorted(self._nodes.items()))
        self._resource_map = ExtendedResourceMap.from_classes(snapshot.classes.values())
        self._bridge_memo = BridgeMemo(
            self._resource_map,
            self.driver_name,
            lambda claim: check_claim_config(claim, self.snapshot.classes, self.driver_name),
        )
        self._classifier = DeviceClassifier(snapshot.classes)
        self._index = CapacityIndex(snapshot, self._nodes.values(), self._classifier)
        self._usable_kinds: dict[tuple[str, tuple[str, ...], int], UsableKinds] = {}
        self._bounds_memo.clear()
        self._starts.clear()
        self._no_pruning = self._exhaustive_asked or any(not s.node_name for s in snapshot.slices)
        self._max_gpu_memory = max((s.max_memory for s in self._index.shapes.values()), default=0)
        self._advertised = _advertised(self._nodes.values())
        self._allocatable = {name: node_allocatable(node) for name, node in self._nodes.items()}
        self._rules.set_nodes(self._nodes)
        self._rebuild_due = self._base_changed = False
        self._stale.clear()
        self._slice_changes.clear()
        self._node_changes.clear()
        if not self._no_pruning:
            # Each class's own view (what a request with no selectors may use), filed now
            # rather than at the first pod that asks.
            for name in sorted(snapshot.classes):
                self._index.view(self._kinds_for(name, ()).kinds)

    # ------------------------------------------------------------------ per pod
    def _context(
        self,
        pod: Mapping[str, Any],
        claims: Sequence[ResourceClaim],
        signature: str | None = None,
    ) -> PodContext:
        """The pod's context for one decision (see :meth:`decide` for ``signature``). Raises
        what the pod's parsing and checks raise, naming the pod."""
        shape = self._shapes.get(signature) if signature is not None else None
        if (
            shape is not None
            and shape.bridge is self._bridge_memo
            and shape.max_gpu_memory == self._max_gpu_memory
            and shape.defaults is self.defaults
        ):
            meta = pod.get("metadata") or {}
            facts = shape.facts.named(pod_name(pod))  # (as PodSchedulingFacts.from_pod does)
            scheduled = shape.scheduled.named(
                pod_uid(pod),
                str(meta.get("name") or ""),
                terminating=bool(meta.get("deletionTimestamp")),
            )
            self._decided = (pod, scheduled)
            policies = shape.policies
            volumes = None  # a shape is kept only for a pod without volumes the rules read
            legacy = shape.legacy.named(facts.name)
        else:
            facts = PodSchedulingFacts.from_pod(pod)
            scheduled = ScheduledPod.from_pod(
                pod, pod_uid(pod), requests=facts.requests, ports=facts.host_ports
            )
            self._decided = (pod, scheduled)
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            policies = policies_for_pod(annotations, self.defaults)
            volumes = self._volumes.pod_context(pod)  # may rule out every node (PreFilter)
            legacy = self._bridge_memo.resources(
                pod, max_gpu_memory_bytes=self._max_gpu_memory or None
            )
            if (
                signature is not None
                and len(signature) <= _SHAPE_SIGNATURE
                and volumes is None
                and PodVolumes.from_pod(pod).empty
            ):
                if len(self._shapes) >= _SHAPES:
                    self._shapes.clear()
                self._shapes[signature] = _PodShape(
                    facts,
                    scheduled,
                    policies,
                    legacy,
                    self._bridge_memo,
                    self._max_gpu_memory,
                    self.defaults,
                )
        check_pod_input(claims, legacy, self.snapshot.classes, self._cluster_facts())
        check_deprecated(legacy, facts.requests, self._advertised)
        for claim in claims:
            self._check_spec(claim)
        return PodContext(
            name=facts.name,
            pod=pod,
            facts=facts,
            scheduled=scheduled,
            rules=pod_rules(self._rules, pod, scheduled, facts),
            policies=policies,
            legacy=legacy,
            user_claims=tuple(claims),
            to_allocate=tuple(c for c in claims if c.allocation is None),
            allocated_claims=tuple(c for c in claims if c.allocation is not None),
            legacy_resources=legacy.resources,
            exempt=filter_exempt(legacy.resources, legacy.resources),
            volumes=volumes,
        )

    def _check_spec(self, claim: ResourceClaim) -> None:
        """Refuse a claim whose requests name a DeviceClass that does not exist, or whose
        config the node would refuse. A claim to allocate that passed is remembered by its
        spec's models (claims parsed with one ``SpecMemo`` share them: a template's claims
        are checked once per set of classes); an error is raised anew each time (it names
        the claim)."""
        classes = self.snapshot.classes
        key = (id(claim.requests), id(claim.config))
        if claim.allocation is None:
            passed = self._specs_passed.get(key)
            if (
                passed is not None
                and passed[0] is claim.requests
                and passed[1] is claim.config
                and passed[2] is classes
            ):
                return
        for request in claim.requests:
            alternatives = (
                (request.exactly,) if request.exactly is not None else request.first_available
            )
            for alt in alternatives:
                if alt.device_class_name not in classes:
                    raise InvalidInputError(
                        f"claim {claim.key}: request {request.name!r}: "
                        f"DeviceClass {alt.device_class_name!r} does not exist"
                    )
        check_claim_config(claim, classes, self.driver_name)
        if claim.allocation is None:
            if len(self._specs_passed) >= _SPECS_PASSED:
                self._specs_passed.clear()
            # Holds the models, so their ids are not reused while the entry stands.
            self._specs_passed[key] = (claim.requests, claim.config, classes)

    def _cluster_facts(self) -> ClusterFacts:
        """The facts the pod input checks read, kept until the slices or device counts
        change."""
        index = self._index
        key = (index, index.census, self.snapshot.slices)  # compared by identity, then count
        if self._facts is None or self._facts[0] != key:
            facts = cluster_facts(
                self.snapshot.slices,
                self.snapshot.classes,
                self.driver_name,
                index.kind_counts,
                index.kinds,
            )
            self._facts = (key, facts)
        return self._facts[1]

    def _decide(
        self, pod: Mapping[str, Any], claims: Sequence[ResourceClaim], signature: str | None
    ) -> Decision:
        name = pod_name(pod)
        try:
            ctx = self._context(pod, claims, signature)
        except PreFilterRejectedError as exc:
            # kube-scheduler's FitError after a PreFilter rejection: no per-node reasons.
            message = f"0/{len(self._nodes)} nodes are available: {exc}."
            return Unschedulable(pod=name, message=message, reasons={})
        except BiaxialError as exc:
            return PodError(pod=name, message=str(exc))
        try:
            decision = self._exhaustive(ctx) if self._no_pruning else self._pruned(ctx)
        except BiaxialError as exc:
            return PodError(pod=name, message=str(exc))
        if isinstance(decision, Unschedulable) and REASON_CLAIMS in decision.reasons:
            why = unserved(
                ctx.to_allocate,
                ctx.legacy,
                self._resource_map,
                self._cluster_facts(),
                self._advertised,
            )
            if why is not None:
                message = f"{decision.message} {why}"
                return Unschedulable(pod=name, message=message, reasons=decision.reasons)
        return decision

    # ------------------------------------------------------------------ search
    def _exhaustive(self, ctx: PodContext) -> Decision:
        reasons: dict[str, int] = {}
        best: Best | None = None
        evaluated = 0
        for node in self._nodes.values():
            known = ctx.reasons.get(node.name)
            if known is not None:
                reasons[known] = reasons.get(known, 0) + 1
                continue
            outcome = self._evaluate(ctx, node)
            evaluated += 1
            self.stats.nodes_evaluated += 1
            if isinstance(outcome, str):
                reasons[outcome] = reasons.get(outcome, 0) + 1
                continue
            found = rank(ctx.policies.node, outcome.score, outcome.penalty, outcome.tie, node.name)
            if best is None or found < best.rank:
                best = Best(found, outcome, node)
        if best is None:
            return Unschedulable(
                pod=ctx.name,
                message=unschedulable_message(len(self._nodes), reasons),
                reasons=reasons,
            )
        return self._placement(ctx, best, evaluated)

    def _pruned(self, ctx: PodContext) -> Decision:
        self._bound(ctx)
        demand, kinds = ctx.demand, ctx.kinds
        if demand is None:
            return self._exhaustive(ctx)
        view = self._index.view(
            frozenset().union(*(alt.kinds for alternatives in kinds for alt in alternatives))
        )
        ctx.shape_bounds = {}
        policy = ctx.policies.node
        alike = _bounds_key(demand, kinds)

        def evaluate(node: Node) -> Best | None:
            outcome = self._evaluate(ctx, node, prechecked=True, ruled=True)
            if isinstance(outcome, str):
                ctx.reasons[node.name] = outcome
                return None
            found = rank(policy, outcome.score, outcome.penalty, outcome.tie, node.name)
            return Best(found, outcome, node)

        best, evaluated = best_first(
            view,
            Variant(demand.cores, policy),
            self._index.by_ident,
            self._index.states,
            self._nodes,
            starts=self._starts,
            policies=ctx.policies,
            demand=demand,
            rules=ctx.rules,
            bounds=ctx.shape_bounds,
            bounds_for=lambda shape, vshape: self._memo_bounds(alike, shape, vshape, demand, kinds),
            evaluate=evaluate,
            stats=self.stats,
        )
        # Nodes without devices of their own cannot take a device request here (every slice
        # is node-local when pruning is on): they only matter for the failure message.
        if best is None:
            return self._exhaustive(ctx)  # nothing fits: every node's reason is needed
        return self._placement(ctx, best, evaluated)

    def _usable(self, demand: Demand) -> tuple[tuple[UsableKinds, ...], ...]:
        """Per request alternative, the device kinds it may use (cached per class, selectors
        and what the index knows of the kinds)."""
        index = self._index
        out = []
        for alternatives in demand.requests:
            per_alt = []
            for alt in alternatives:
                key = (alt.device_class, alt.selectors, index.generation)
                found = self._usable_kinds.get(key)
                if found is None:
                    found = self._kinds_for(alt.device_class, alt.selectors)
                    self._usable_kinds[key] = found
                per_alt.append(found)
            out.append(tuple(per_alt))
        return tuple(out)

    def _kinds_for(self, device_class: str, selectors: tuple[str, ...]) -> UsableKinds:
        index = self._index
        kinds = []
        certain = True
        for kind, facts in index.kinds.items():
            if device_class not in kind.classes:
                continue
            verdicts = [
                self._classifier.verdict(e, kind, facts, index.generation) for e in selectors
            ]
            if False in verdicts:
                continue
            certain = certain and None not in verdicts
            kinds.append(kind)
        return UsableKinds(frozenset(kinds), certain)

    def _memo_bounds(
        self,
        alike: tuple[object, ...],
        shape: NodeShape,
        view: ViewShape,
        demand: Demand,
        kinds: tuple[tuple[UsableKinds, ...], ...],
    ) -> ShapeBounds:
        """:meth:`_shape_bounds`, kept for later pods alike (``alike``: :func:`_bounds_key`)."""
        key = (alike, shape.ident, id(view))
        kept = self._bounds_memo.get(key)
        if kept is not None and kept[0] is view:
            return kept[1]
        bounds = self._shape_bounds(shape, view, demand, kinds)
        if len(self._bounds_memo) >= _BOUNDS_MEMO:
            self._bounds_memo.clear()
        self._bounds_memo[key] = (view, bounds)
        return bounds

    @staticmethod
    def _shape_bounds(
        shape: NodeShape,
        view: ViewShape,
        demand: Demand,
        kinds: tuple[tuple[UsableKinds, ...], ...],
    ) -> ShapeBounds:
        usable: Usable = tuple(
            tuple(
                frozenset(i for i, kind in enumerate(shape.kinds) if kind in alt.kinds)
                for alt in alternatives
            )
            for alternatives in kinds
        )
        certain = all(alt.certain for alternatives in kinds for alt in alternatives)
        return shape_bounds(shape, view, demand, usable, certain)

    # ------------------------------------------------------------------ one node
    def _bridge(
        self, ctx: PodContext, dra: frozenset[str], gpu_memory: int | None
    ) -> BridgeVariant | None:
        key = BridgeKey(dra, gpu_memory)
        if key in ctx.bridge_cache:
            return ctx.bridge_cache[key]
        made = self._bridge_memo.claim(
            ctx.pod,
            ctx.legacy,
            dra_resources=dra,
            gpu_memory_bytes=gpu_memory,
            name=BRIDGE_CLAIM_PLACEHOLDER,
            uid=f"{(ctx.pod.get('metadata') or {}).get('uid') or ctx.name}/extended-resources",
        )
        built = BridgeVariant(*made) if made is not None else None
        ctx.bridge_cache[key] = built
        return built

    def _gpu_memory_for(self, ctx: PodContext, node: Node) -> int | None:
        if not ctx.legacy.per_node_memory:
            return None
        state = self._index.states.get(node.name)
        if state is None:
            return None
        return min(d.memory for d in state.devices if d.memory > 0) if state.devices else None

    def _evaluate(
        self,
        ctx: PodContext,
        node: Node,
        *,
        prechecked: bool = False,
        ruled: bool = False,
        penalty: Fraction | None = None,
    ) -> NodeOutcome | str:
        """The node's exact outcome for the pod, or the reason it does not fit.
        ``prechecked``: the index precheck passed; ``ruled``: the pod's rules passed;
        ``penalty``: the soft rules' penalty, when known. On a node where pods of equal or
        higher priority are nominated, their holds count first (upstream's
        ``RunFilterPluginsWithNominatedPods``)."""
        holds = self._holds(ctx, node.name)
        if holds:
            with self._what_if(ctx, node, added=holds):
                return self._evaluate_now(ctx, node, prechecked=False, ruled=False, penalty=None)
        return self._evaluate_now(ctx, node, prechecked=prechecked, ruled=ruled, penalty=penalty)

    def _evaluate_now(
        self,
        ctx: PodContext,
        node: Node,
        *,
        prechecked: bool,
        ruled: bool,
        penalty: Fraction | None,
    ) -> NodeOutcome | str:
        outcome = self._outcome(ctx, node, prechecked=prechecked, ruled=ruled)
        if not isinstance(outcome, str) and ctx.rules is not None:
            rules = ctx.rules
            if penalty is None:
                penalty = rules.penalty(node) if rules.soft else ZERO
            tie = rules.tie_break(node) if rules.ties else ZERO
            if penalty or tie:
                outcome = replace(outcome, penalty=penalty, tie=tie)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "pod %s on node %s: %s",
                ctx.name,
                node.name,
                outcome if isinstance(outcome, str) else f"score {float(outcome.score):.6f}",
            )
        return outcome

    def _outcome(
        self, ctx: PodContext, node: Node, *, prechecked: bool, ruled: bool
    ) -> NodeOutcome | str:
        resources = ctx.legacy_resources
        if resources & self._advertised:
            dra = dra_resources_on_node(resources, node.allocatable)
            exempt = filter_exempt(dra, resources)
        else:
            dra, exempt = resources, ctx.exempt
        usage = self._tracker.usage(node.name)
        reason = filter_node(
            ctx.facts,
            node,
            usage,
            dra_resources=exempt,
            allocatable=self._allocatable[node.name],
            ports=self._tracker.pods.ports(node.name),
        )
        if reason is not None:
            return reason
        volumes: VolumeBindings | None = None
        if ctx.volumes is not None:
            verdict = self._volumes.filter(ctx.volumes, node)
            if isinstance(verdict, str):
                return verdict
            volumes = verdict
        if ctx.rules is not None and not ruled:
            reason = ctx.rules.reason(node)
            if reason is not None:
                return reason
        for claim in ctx.allocated_claims:
            selector = claim.allocation.node_selector if claim.allocation else None
            if selector is not None and not node_selector_matches(selector, node):
                return REASON_CLAIM_NODE
        claims = list(ctx.to_allocate)
        bridge = None
        if dra:
            bridge = self._bridge(ctx, frozenset(dra), self._gpu_memory_for(ctx, node))
            if bridge is not None:
                claims.append(bridge.claim)
        state = self._index.states.get(node.name)
        if not claims:
            # No devices: the node axis reads cpu and memory (kube-scheduler's resource score).
            score = resource_utilisation(self._allocatable[node.name], usage, ctx.facts.requests)
            return NodeOutcome(score, (), bridge, volumes)
        if (
            state is None
            and not self._no_pruning
            and not self.snapshot.candidates(node).blocked_pools
        ):
            return REASON_NO_GPUS  # (an invalid pool is the allocator's to report, as upstream)
        bounds = ctx.shape_bounds.get(state.shape.ident) if state is not None else None
        if bounds is None and state is not None and ctx.demand is not None and ctx.kinds:
            view = self._index.view(frozenset())  # the bounds' level is not read here
            bounds = self._shape_bounds(state.shape, view.shape(state.shape), ctx.demand, ctx.kinds)
            ctx.shape_bounds[state.shape.ident] = bounds
        if not prechecked and state is not None and bounds is not None and ctx.demand is not None:
            short = precheck(state, ctx.demand, bounds)
            if short is not None:
                return short
        self._index.seed_selectors(self.snapshot, node, claims)
        stats = SearchStats()
        self.stats.allocator_calls += 1
        try:
            results = allocate(
                self.snapshot,
                claims,
                node,
                order=gpu_order(ctx.policies.gpu),
                budget=self.budget,
                stats=stats,
            )
        except NodeAllocationError as exc:
            # Upstream's ErrFailedAllocationOnNode (invalid pools on this node): this node is
            # unschedulable with that message; other nodes may still fit.
            return str(exc)
        finally:
            self.stats.search_steps += stats.steps
        if results is None:
            if state is None:
                return REASON_NO_GPUS
            demand = pod_demand(claims)
            if not demand.prunable:
                return REASON_CLAIMS
            view = self._index.view(frozenset())  # the bounds' level is not read here
            bounds = self._shape_bounds(
                state.shape, view.shape(state.shape), demand, self._usable(demand)
            )
            return precheck(state, demand, bounds) or REASON_CLAIMS
        if state is None:
            return NodeOutcome(Fraction(0), tuple(results), bridge, volumes)
        adding = state.added(results)
        cores = ctx.demand.cores if ctx.demand is not None else pod_demand(claims).cores
        score = node_score(state.shape.total, state.used, adding, cores=cores)
        return NodeOutcome(score, tuple(results), bridge, volumes)

    def _placement(self, ctx: PodContext, best: Best, evaluated: int) -> Placement:
        outcome = best.outcome
        results = list(outcome.results)
        claims = tuple(
            ClaimAllocation(claim, allocation)
            for claim, allocation in zip(
                ctx.to_allocate, results[: len(ctx.to_allocate)], strict=True
            )
        )
        bridge_allocation = results[len(ctx.to_allocate)] if outcome.bridge is not None else None
        return Placement(
            pod=ctx.name,
            node=best.node.name,
            claims=claims,
            bridge=outcome.bridge.bridge if outcome.bridge is not None else None,
            bridge_allocation=bridge_allocation,
            score=outcome.score,
            policies=ctx.policies,
            evaluated=evaluated,
            volumes=outcome.volumes
            if outcome.volumes is not None and not outcome.volumes.empty
            else None,
        )

    # ------------------------------------------------------------------ preemption
    def preempt(
        self,
        pod: Mapping[str, Any],
        claims: Sequence[ResourceClaim] = (),
        budgets: Sequence[DisruptionBudget] = (),
    ) -> Preemption | NoPreemption | PodError:
        """For a pod that fits nowhere: where would it fit by evicting lower-priority pods,
        and which (:func:`driver.scheduling.dryrun.dry_run`, asking this engine through its
        what-if interface below). Nothing changes: the caller evicts and calls
        :meth:`nominate`."""
        started = time.perf_counter()
        try:
            self.sync()
            name = pod_name(pod)
            try:
                ctx = self._context(pod, claims)
            except PreFilterRejectedError:
                # Every node is UnschedulableAndUnresolvable: removing pods cannot help.
                return NoPreemption(pod=name, message=NOT_HELPFUL.format(nodes=len(self._nodes)))
            except BiaxialError as exc:
                return PodError(pod=name, message=str(exc))
            if not may_preempt(pod):
                return NoPreemption(pod=name, message=NEVER)
            self._bound(ctx)
            try:
                return dry_run(self, ctx, budgets, share_verdicts=self._reuse_verdicts)
            except BiaxialError as exc:
                return PodError(pod=name, message=str(exc))
        finally:
            self.stats.preemptions += 1
            self.stats.preemption_seconds += time.perf_counter() - started

    def _bound(self, ctx: PodContext) -> None:
        """Give ``ctx`` its demand and usable kinds where bounds hold for the pod (so that
        the search can prune, and fit checks run the index's precheck before the
        allocator); leave them unset where they do not."""
        if ctx.legacy.per_node_memory or (ctx.legacy.resources & self._advertised):
            return  # per-node claim variants (percentages, device-plugin nodes)
        demand = pod_demand(self._claims_everywhere(ctx))
        if demand.prunable and demand.requests and not ctx.allocated_claims:
            ctx.demand = demand
            ctx.kinds = self._usable(demand)

    def _claims_everywhere(self, ctx: PodContext) -> list[ResourceClaim]:
        """The claims to allocate for the pod, with its bridge claim as it would be on a node
        where DRA serves every legacy resource."""
        claims = list(ctx.to_allocate)
        if ctx.legacy.requests:
            probe = self._bridge(ctx, frozenset(ctx.legacy.resources), None)
            if probe is not None:
                claims.append(probe.claim)
        return claims

    # ------------------------------------------------------------------ what-if interface
    # What the preemption dry run asks (driver.scheduling.dryrun.WhatIfs).
    def node_names(self) -> Sequence[str]:
        """Every node, by name."""
        return list(self._nodes)

    def pods_below(self, node: str, priority: int) -> Mapping[str, ScheduledPod]:
        """Pods seen on ``node`` with a priority below ``priority``, by UID."""
        return {p.uid: p for p in self._tracker.observed_on(node) if p.priority < priority}

    def start_time(self, pod: str) -> float:
        """The pod's ``status.startTime`` in seconds (NOT_STARTED when unknown)."""
        return self._started.get(pod, NOT_STARTED)

    def might_help(self, ctx: PodContext, node: str) -> bool:
        """Whether removing pods could make the node fit: the node filter passes on an empty
        node (taints, node affinity, ``unschedulable``, allocatable too small are
        upstream's UnschedulableAndUnresolvable)."""
        found = self._nodes[node]
        resources = ctx.legacy_resources
        exempt = ctx.exempt
        if resources & self._advertised:
            exempt = filter_exempt(dra_resources_on_node(resources, found.allocatable), resources)
        reason = filter_node(
            ctx.facts,
            found,
            _NO_USAGE,
            dra_resources=exempt,
            allocatable=self._allocatable[node],
            ports=None,
        )
        return reason is None

    def held(self, ctx: PodContext, node: str) -> bool:
        """Whether nominations of other pods hold against the pod on ``node``."""
        return bool(self._holds(ctx, node))

    def what_if(
        self, ctx: PodContext, node: str, removed: frozenset[str] = frozenset()
    ) -> AbstractContextManager[WhatIf]:
        """The engine as if the pods ``removed`` were gone from ``node`` and the nominations
        that hold against the pod there were placed (:class:`WhatIf`)."""
        return self._what_if(ctx, self._nodes[node], removed=removed, added=self._holds(ctx, node))

    def placement(self, ctx: PodContext, best: Best) -> Placement:
        """The placement of the pod on ``best``'s node (one node evaluated)."""
        return self._placement(ctx, best, 1)

    def reads(self, ctx: PodContext) -> tuple[str, ...] | None:
        """Whether this pod's fit checks read the same on alike nodes (so that victim
        searches may share verdicts between nodes), and if so the device attributes (by
        name, any domain) they read; None when they may not.

        A fit check reads, per node: the node filter (its static parts are the same for every
        removal, and passed; what changes is the pods' requests against allocatable), the
        volume rules, the rules between pods, the allocator on the node's devices with their
        use (what the victims' claims free included) and the GPU order. The verdicts are
        shared only where everything but the last two reads the same on every node: no host
        ports, no volume the volume rules look at, no rule between pods that filters (removing
        pods can only drop filters: a placed pod's anti-affinity), the same claims on every
        node (no per-node bridge variant, no allocated claim) whose device classes and
        selectors answer for whole device kinds (:mod:`driver.scheduling.classification`), and
        node-local slices only. The key (:meth:`what_if_key`) then holds the rest; the
        attribute keys returned are those the GPU order and the claims' constraints look up."""
        if self._no_pruning:
            return None
        if ctx.demand is None or ctx.allocated_claims or ctx.volumes is not None:
            return None  # (_bound leaves demand None for per-node bridge variants)
        if ctx.facts.host_ports or (ctx.rules is not None and ctx.rules.filters):
            return None
        if not all(alt.certain for alternatives in ctx.kinds for alt in alternatives):
            return None
        if not self._classifier.answered(ctx.demand.classes):
            return None  # (a kind counts a class error as "selects": not one answer per kind)
        read = {NUMA_NODE, PCIE_ROOT}  # the GPU order's groups
        for claim in self._claims_everywhere(ctx):
            for constraint in claim.constraints:
                read.update(
                    a for a in (constraint.match_attribute, constraint.distinct_attribute) if a
                )
        # The keys those names are looked up under: as written, and without their domain
        # (the allocator's lookup in the device's own driver domain).
        keys = read | {name.partition("/")[2] for name in read}
        return tuple(sorted(key for key in keys if key))

    def what_if_key(
        self, reads: tuple[str, ...], node: str, removable: Sequence[ScheduledPod]
    ) -> Hashable | None:
        """Everything a fit check on ``node`` reads with any of the pods ``removable`` gone,
        once :meth:`reads` gave ``reads``, with the node's own names and the pods' identities
        left out: two nodes with equal keys answer every removal alike (told by positions in
        ``removable``). None when the node cannot be keyed (devices that taints, shared
        counters or binding conditions may set apart, several pools, pools the allocator
        skips).

        The key: the node's allocatable and what its pods request; per device in the
        allocator's order its name, kind, use by other claims and the attributes ``reads``;
        per removable pod (in order) its requests; per claim a removable pod reserves, what it
        holds on the node and which removable pods reserve it (and whether any other pod
        does)."""
        state = self._index.states.get(node)
        if state is None or any(kind.special for kind in state.shape.kinds):
            return None
        candidates = self.snapshot.candidates(self._nodes[node])
        devices = candidates.devices
        if candidates.blocked_pools or len(devices) != len(state.devices):
            return None  # (every device node-local and on this node: the index's ones)
        pool = devices[0].device_id.pool
        driver = devices[0].device_id.driver
        usage = self.snapshot.allocated.pool(driver, pool)
        exclusive, shares, capacity = usage.exclusive, usage.shares, usage.capacity
        device_key = []
        for cand in devices:
            device_id = cand.device_id
            if device_id.pool != pool or device_id.driver != driver:
                return None
            name = device_id.device
            attrs = cand.device.attributes
            consumed = capacity.get(name)
            device_key.append(
                (
                    name,
                    name in exclusive,
                    shares.get(name, 0),
                    tuple(sorted(consumed.items())) if consumed else (),
                    tuple([attrs.get(key) for key in reads]),
                )
            )
        at = {p.uid: i for i, p in enumerate(removable)}
        pod_key = tuple(tuple(sorted(p.requests.items())) for p in removable)
        claims: set[str] = set()
        for p in removable:
            claims.update(self._claims_of.get(p.uid))
        claim_key = []
        for claim in claims:
            allocation = self._tracker.held(claim)
            if allocation is None:
                continue
            held = sorted(
                (
                    r.device,
                    r.share_id is None,
                    tuple(sorted((k, q.nanos) for k, q in r.consumed_capacity.items()))
                    if r.consumed_capacity
                    else (),
                )
                for r in allocation.results
                if r.pool == pool and r.driver == driver and not r.admin_access
            )
            reservers = self._reservers.get(claim, ())
            claim_key.append(
                (
                    tuple(held),
                    tuple(sorted(at[r] for r in reservers if r in at)),
                    any(r not in at for r in reservers),
                )
            )
        claim_key.sort()
        pods_usage = self._tracker.usage(node)
        return (
            tuple(sorted(self._allocatable[node].items())),
            tuple(sorted(pods_usage.requested.items())),
            pods_usage.pods,
            state.shape.key,
            tuple(device_key),
            pod_key,
            tuple(claim_key),
        )

    def _fits_now(self, ctx: PodContext, node: Node) -> bool:
        """Whether the pod fits on ``node`` as the engine stands (inside a :class:`WhatIf`)."""
        return not isinstance(self._outcome(ctx, node, prechecked=False, ruled=False), str)

    def _best_now(self, ctx: PodContext, node: Node) -> Best | None:
        """The pod's exact outcome on ``node`` as the engine stands (inside a
        :class:`WhatIf`), with its rank; None when it does not fit."""
        outcome = self._evaluate_now(ctx, node, prechecked=False, ruled=False, penalty=None)
        if isinstance(outcome, str):
            return None
        return Best(
            rank(ctx.policies.node, outcome.score, outcome.penalty, outcome.tie, node.name),
            outcome,
            node,
        )

    def _holds(self, ctx: PodContext, node: str) -> tuple[_Nomination, ...]:
        """Nominations on ``node`` that hold against the pod: other pods of equal or higher
        priority."""
        uids = self._nominated.get(node)
        if not uids:
            return ()
        me = ctx.scheduled
        found = []
        for uid in sorted(uids):
            nomination = self._nominations[uid]
            if uid != me.uid and nomination.pod.priority >= me.priority:
                found.append(nomination)
        return tuple(found)

    @contextmanager
    def _what_if(
        self,
        ctx: PodContext,
        node: Node,
        *,
        removed: frozenset[str] = frozenset(),
        added: Sequence[_Nomination] = (),
    ) -> Iterator[WhatIf]:
        """The engine as if the pods ``removed`` were gone from ``node`` (with the devices of
        every claim no remaining pod reserves) and the nominations ``added`` were placed
        there; everything is put back on exit. The pod's rules are recomputed for it. The
        :class:`WhatIf` yielded moves to another set of removed pods in place (a victim
        search changes one pod at a time)."""
        what_if = WhatIf(self, ctx, node, added)
        try:
            what_if.remove(removed)
            yield what_if
        finally:
            what_if.close()

    def _freed(self, removed: frozenset[str]) -> list[AllocationResult]:
        """The allocations of claims whose every reserving pod is in ``removed``."""
        claims: set[str] = set()
        for uid in removed:
            claims.update(self._claims_of.get(uid))
        freed = []
        for claim in sorted(claims):
            if removed.issuperset(self._reservers.get(claim, ())):
                allocation = self._tracker.held(claim)
                if allocation is not None:
                    freed.append(allocation)
        return freed


_BOUNDS_MEMO: Final = 4096  # per-shape bounds kept for pods alike
_SPECS_PASSED: Final = 1024  # claim specs kept as checked (a few per claim template)
_ASSUMED_VIEWS: Final = 4096  # placements in flight whose views are kept for their echo
_SHAPES: Final = 256  # pod shapes kept by signature (one per Deployment revision alive)
# The longest signature a shape is kept for: the memo holds at most 16 MiB of keys, however
# large the pods an API server lets through.
_SHAPE_SIGNATURE: Final = 64 * 1024


def _bounds_key(demand: Demand, kinds: tuple[tuple[UsableKinds, ...], ...]) -> tuple[object, ...]:
    """What :func:`~driver.scheduling.bounds.shape_bounds` reads of a pod besides the shape:
    per request alternative its count and capacity requests (by value), the locality
    constraints, whether the pod is simple, and the kinds each alternative may use."""
    requests = tuple(
        tuple((alt.count, tuple(sorted(alt.requests.items()))) for alt in alternatives)
        for alternatives in demand.requests
    )
    return (requests, demand.grouped, demand.simple, kinds)


class WhatIf:
    """An open what-if on one node (see :meth:`DecisionEngine._what_if`): :meth:`remove` takes
    the given pods off the node (putting back those taken before and not given now), with
    the devices their claims free; :meth:`close` restores the engine. Only the difference
    between two calls touches the tracker, and the capacity index re-reads only the node's
    state, so a victim search pays for each fit check the pod it changes, not all of them.
    :meth:`fits` and :meth:`best` are what the preemption dry run asks of it
    (:class:`driver.scheduling.dryrun.WhatIfView`)."""

    def __init__(
        self,
        engine: DecisionEngine,
        ctx: PodContext,
        node: Node,
        added: Sequence[_Nomination],
    ) -> None:
        self._engine = engine
        self._ctx = ctx
        self._node = node
        self._rules = ctx.rules
        self._base = engine.snapshot
        self._held = [r for nomination in added for r in nomination.results]
        self._lifted: dict[str, tuple[str, ScheduledPod, bool]] = {}
        self._dropped: list[str] = []
        self._ever_lifted = False
        self._freed: list[AllocationResult] | None = None
        self._looked = False
        tracker = engine._tracker
        for nomination in added:
            if not tracker.counts(nomination.pod.uid):
                tracker.drop_in(nomination.pod.uid, node.name, nomination.pod, True)
                self._dropped.append(nomination.pod.uid)

    def fits(self, removed: frozenset[str]) -> bool:
        """Whether the pod fits on the node with the pods ``removed`` gone instead."""
        self._engine.stats.victim_checks += 1
        self.remove(removed)
        return self._engine._fits_now(self._ctx, self._node)

    def best(self) -> Best | None:
        """The pod's exact outcome on the node as the what-if stands."""
        return self._engine._best_now(self._ctx, self._node)

    def remove(self, removed: frozenset[str]) -> None:
        engine = self._engine
        tracker = engine._tracker
        changed = self._freed is None and bool(self._dropped)
        for uid in sorted(set(self._lifted) - removed):
            on, pod, assumed = self._lifted.pop(uid)
            tracker.drop_in(uid, on, pod, assumed)
            changed = True
        for uid in sorted(removed - set(self._lifted)):
            entry = tracker.lift(uid)
            if entry is not None:
                self._lifted[uid] = entry
                self._ever_lifted = changed = True
        freed = engine._freed(removed)
        if freed != self._freed:
            self._freed = freed
            snapshot = self._base
            if freed:
                snapshot = snapshot.without_allocations(freed)
            if self._held:
                snapshot = snapshot.with_allocations(self._held)
            if snapshot is not self._base or self._looked:
                engine.snapshot = snapshot
                engine._index.look(snapshot, self._node)
                self._looked = True
        if changed:
            ctx = self._ctx
            # Rules read the index's counts in place; a pod taken out and put back may be
            # filed anew, so the rules are computed again rather than restored.
            ctx.rules = (
                pod_rules(engine._rules, ctx.pod, ctx.scheduled, ctx.facts)
                if self._lifted or self._dropped or self._ever_lifted
                else self._rules
            )

    def close(self) -> None:
        engine = self._engine
        tracker = engine._tracker
        ctx = self._ctx
        try:
            for uid in self._dropped:
                tracker.lift(uid)
            for uid, (on, pod, assumed) in self._lifted.items():
                tracker.drop_in(uid, on, pod, assumed)
            ctx.rules = (
                pod_rules(engine._rules, ctx.pod, ctx.scheduled, ctx.facts)
                if self._ever_lifted
                else self._rules
            )
        finally:
            engine.snapshot = self._base
            engine._index.unlook()

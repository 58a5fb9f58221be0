"""The pruned node search: nodes walked best bound first, stopped once no bound can win.

The :mod:`capacity index <driver.scheduling.capacity_index>` files every node in sorted lists
by partition, in one view per set of device kinds a pod may use. For a pod, the engine gives
:func:`best_first` its view's lists for the pod's variant and, per partition, an *optimistic
bound* of the node score over the devices the pod can use (:mod:`driver.scheduling.bounds`;
exact for simple pods on one kind of device). The walk merges the lists through a heap, best
bound first; each node it pops goes through the index precheck and then the engine's exact
evaluation (node filter, allocator, exact score), and it stops as soon as the best bound
left cannot beat the best exact (score, name) found.

A node's float bound is its list's closed form, ``(list key + shift) / divisor`` per
partition (:func:`~driver.scheduling.capacity_index.score_line`): no lookup of the node's
state, and equal scores give equal floats. Partitions that cannot hold the pod are never
visited. What a walk starts from -- per partition that can hold the pod, its head bounded --
is kept across decisions per lists and pod amounts (:class:`WalkStarts`; what the pod adds
per partition is :func:`~driver.scheduling.bounds.amounts_memo`'s, keyed by all it reads)
and brought up to date from the view's change log, which names the lists placements changed.
Nodes a rule between pods excludes are skipped inside their lists, and only once a list's
head pops (a list whose bound cannot win is never walked through its excluded nodes; the
anti-affinity rules' test is a lookup in node sets the pod index keeps, and where in each
list the first node they allow was found is kept across decisions while those sets are only
added to); a node whose soft rules cost a penalty goes back into the heap with its bound
lowered by it, and a run of a list's nodes that the soft rules certainly penalise
(:meth:`~driver.scheduling.rules.PodRules.penalised`) goes back as one entry, lowered by the
penalty's floor and split node by node only while it may win (where those runs end, and the
starting heap with each list's penalised head replaced by its lowered run, are kept across
decisions while the nodes penalised are only added to: :class:`_Runs`); where the bound only equals
the best, a node can win on the System default spreading's tie-break alone, so its own
tie-break decides. The result is identical to evaluating every node (tests compare both on
random clusters, with every rule, and on streams of placements and removals);
``docs/scoring.md`` explains the bounds.

:func:`best_first` reads the index and the rules and never changes them; what it evaluates is
the engine's (the ``evaluate`` callback, which may record per-node reasons).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from functools import partial
from itertools import islice, takewhile
from operator import itemgetter
from typing import Final, NamedTuple

from driver.api.nodes import Node
from driver.scheduling.bounds import (
    Demand,
    ShapeBounds,
    amounts_memo,
    partition_amounts,
    precheck,
)
from driver.scheduling.capacity_index import (
    FiledNode,
    IndexView,
    NodeShape,
    NodeState,
    Partition,
    Variant,
    ViewShape,
    score_line,
)
from driver.scheduling.podcontext import ZERO, Best, DecisionStats
from driver.scheduling.podindex import NodeSet
from driver.scheduling.policy import NodePolicy, PodPolicies
from driver.scheduling.rules import PodRules
from driver.scheduling.scoring import NodeAmounts, node_score, rank

_EPSILON: Final = 1e-9  # float bounds closer than this to the best are compared exactly
_UNSEEN: Final = NodeAmounts(-1, -1, -1)  # a partition the amounts memo has no answer for yet
_STARTS: Final = 64  # walks' starting heaps kept (one per view variant and pod kind)
_SKIPS: Final = 8  # exclusions whose first allowed nodes a start keeps
_RUNS: Final = 8  # penalised tests whose runs' ends a start keeps
_RUN_ENDS: Final = 64  # runs' ends kept per list (more: forgotten, found again)


class _Lane(NamedTuple):
    """One partition's list as a walk reads it, with what the pod adds on its nodes and the
    list's scores in closed form (:func:`~driver.scheduling.capacity_index.score_line`): the
    float bound of the node at ``entries[i]`` is ``(entries[i].key + shift) / divisor``, one
    division and no lookup of the node's state."""

    entries: list[FiledNode]
    partition: Partition
    adding: NodeAmounts
    shape: NodeShape
    shift: int
    divisor: int


class _Frontier(NamedTuple):
    """A heap entry of the pruned walk, ordered by its float bound (then name; ``serial``
    keeps the rest of the entry out of comparisons): the next node of one partition's list
    (``penalty`` None, bounded by the node score alone), a node taken from its list whose
    soft rules' penalty is known (its bound lowered by the estimate ``penalty``; decisions
    compute the exact penalty), or a run of a list's nodes that the soft rules certainly
    penalise (``run``: where it ends; bounded by its first node's score lowered by the
    penalty's floor, which bounds every node of the run)."""

    bound: float  # minus the bound of the total score, so the best pops first
    name: str
    serial: int
    lane: _Lane
    position: int
    penalty: float | None
    run: int  # not 0: the nodes from ``position`` to this one (excluded) are a penalised run


# Built as NamedTuple._make builds (tuple.__new__ on the values): half the cost of the
# keyword-capable constructor, which shows at 5000 nodes.
_frontier: Callable[
    [tuple[float, str, int, _Lane, int, float | None, int]],
    _Frontier,
] = partial(tuple.__new__, _Frontier)


_NAME: Final = itemgetter(1)  # a FiledNode's name


def _allowed(entries: list[FiledNode], start: int, excluded: Callable[[str], bool]) -> int:
    """The first position from ``start`` whose node no rule excludes (len: none)."""
    if start >= len(entries) or not excluded(entries[start].name):
        return start
    # A run of excluded nodes (anti-affinity's: the nodes in use, where binpack looks
    # first), counted without a Python loop: the test is mostly a set's own lookup.
    skipped = takewhile(excluded, map(_NAME, islice(entries, start + 1, None)))
    return start + 1 + len(list(skipped))


class _Start:
    """The heap a walk starts from, kept across decisions for the pods that read the same
    lists (one variant of one view) with the same amounts per partition (the same
    :func:`~driver.scheduling.bounds.amounts_memo` per shape, hence the same policies and
    shape bounds): per partition that can hold the pod its lane and its head's entry.
    Brought up to date from the view's change log, so that a decision reads again only the
    lists that changed since the last one (at 5000 nodes ~160 partitions a pod, of which a
    placement changes two)."""

    __slots__ = (
        "bounds",
        "by_ident",
        "epoch",
        "heads",
        "heap",
        "lanes",
        "lists",
        "memos",
        "policies",
        "runs",
        "seen",
        "serial",
        "skips",
        "variant",
        "view",
    )

    def __init__(
        self,
        view: IndexView,
        variant: Variant,
        *,
        by_ident: Sequence[NodeShape],
        policies: PodPolicies,
        memos: dict[int, dict[Partition, NodeAmounts | None]],
        bounds: Mapping[int, ShapeBounds],
    ) -> None:
        self.view = view
        self.variant = variant
        self.lists = view.lists[variant]
        self.by_ident = by_ident
        self.policies = policies
        self.memos = memos  # (kept: the key of this start holds their ids)
        self.bounds = dict(bounds)
        self.epoch = -1  # the view's epoch read (-1: none yet)
        self.seen = 0  # how much of that epoch's change log is read
        self.lanes: dict[Partition, _Lane] = {}
        self.heads: dict[Partition, _Frontier] = {}
        self.heap: list[_Frontier] | None = None  # the heads as a heap (None: to build)
        self.serial = 0
        self.skips: dict[tuple[tuple[int, int], ...], _Skips] = {}
        self.runs: dict[tuple[object, ...], _Runs] = {}

    def update(self) -> None:
        """The heads, the view's lists read again where they changed."""
        view = self.view
        if self.epoch != view.epoch:
            self.lanes.clear()
            self.heads.clear()
            changed: Iterable[Partition] = list(self.lists)
            self.epoch = view.epoch
        else:
            changed = dict.fromkeys(partition for partition, _ in view.changes[self.seen :])
        self.seen = len(view.changes)
        for partition in changed:
            self._read(partition)
            self.heap = None

    def heads_heap(self) -> list[_Frontier]:
        """The heads as a heap (shared: copy it before changing it), up to date after
        :meth:`update`."""
        if self.heap is None:
            self.heap = list(self.heads.values())
            heapq.heapify(self.heap)
        return self.heap

    def skips_for(self, sets: tuple[NodeSet, ...]) -> _Skips:
        """The kept first allowed nodes for the exclusion by ``sets``, up to date."""
        key = tuple((id(s), s.removals) for s in sets)
        found = self.skips.get(key)
        if found is None:
            if len(self.skips) >= _SKIPS:
                self.skips.clear()
            found = self.skips[key] = _Skips(sets)
        found.sync(self.view)
        return found

    def runs_for(self, sets: tuple[NodeSet, ...], rest: tuple[object, ...], floor: float) -> _Runs:
        """The kept runs of the nodes a penalised test (:meth:`PodRules.penalised_key`: ``sets``
        and ``rest``, which holds ``floor``) names, up to date."""
        key = (tuple((id(s), s.removals) for s in sets), rest)
        found = self.runs.get(key)
        if found is None:
            if len(self.runs) >= _RUNS:
                self.runs.clear()
            found = self.runs[key] = _Runs(sets, floor)
        found.sync(self.view)
        return found

    def _read(self, partition: Partition) -> None:
        """One partition's lane and head, read again (none: the partition has no node, or
        cannot hold the pod)."""
        entries = self.lists.get(partition)
        lane = self.lanes.get(partition)
        if not entries:
            self.lanes.pop(partition, None)
            self.heads.pop(partition, None)
            return
        if lane is None or lane.entries is not entries:
            shape_id = partition[0]
            memo = self.memos[shape_id]
            adding = memo.get(partition, _UNSEEN)
            if adding is _UNSEEN:
                adding = memo[partition] = partition_amounts(
                    self.policies, self.view.shapes[shape_id], partition, self.bounds[shape_id]
                )
            if adding is None:
                return  # (it cannot hold the pod)
            shape = self.by_ident[shape_id]
            lane = self.lanes[partition] = _Lane(
                entries, partition, adding, shape, *score_line(shape.total, adding, self.variant)
            )
        key, name = entries[0]
        # The head goes in even if a rule excludes it: its bound is the list's best, so the
        # list's first allowed node is looked for only once the head pops (lists whose
        # bound cannot win are never walked through their excluded nodes).
        self.heads[partition] = _frontier(
            ((key + lane.shift) / lane.divisor, name, self.serial, lane, 0, None, 0)
        )
        self.serial += 1


class _Kept:
    """What a walk keeps of one view's lists across decisions for one test of nodes (its
    node sets, kept alive: the key it is found by holds their ids), and how far it read the
    view's change log: per list it keeps something for, the nodes filed into or out of the
    list since (``pending``)."""

    __slots__ = ("epoch", "pending", "seen", "sets")

    def __init__(self, sets: tuple[NodeSet, ...]) -> None:
        self.sets = sets
        self.epoch = -1  # the view's epoch read (-1: none yet)
        self.seen = 0  # how much of that epoch's change log is read
        self.pending: dict[Partition, list[str]] = {}  # nodes filed in or out since

    def _changes(
        self, view: IndexView, kept: Container[Partition]
    ) -> list[tuple[Partition, str]] | None:
        """The view's changes since the last walk, those to the lists in ``kept`` noted in
        ``pending``; None: a new epoch (any list may have changed; nothing is pending)."""
        if self.epoch != view.epoch:
            self.pending.clear()
            self.epoch = view.epoch
            self.seen = len(view.changes)
            return None
        changes = view.changes[self.seen :]
        self.seen = len(view.changes)
        pending = self.pending
        for partition, name in changes:
            if partition in kept:
                pending.setdefault(partition, []).append(name)
        return changes

    def _filed_in(
        self,
        partition: Partition,
        named: Callable[[str], bool],
        view: IndexView,
        states: Mapping[str, NodeState],
        variant: Variant,
    ) -> Iterator[FiledNode]:
        """The entries of the nodes filed into the partition's list since the last walk that
        ``named`` does not name (their ``pending`` notes are read)."""
        names = self.pending.pop(partition, None)
        if not names:
            return
        filed = view.filed
        for name in names:
            if filed.get(name) != partition or named(name):
                continue  # (gone from the list, or named: it changes nothing kept)
            yield next(e for v, e in states[name].entries if v == variant)


class _Skips(_Kept):
    """Where each list's first node that one exclusion allows was found (its entry; None:
    none is), kept across decisions for an exclusion that is membership in node sets the pod
    index keeps (anti-affinity), while those sets are only added to (their ``removals`` are
    part of the key): the nodes in front of it stay excluded, so a later walk resumes there,
    but for the nodes filed into the list since (the view's change log names them), looked
    at one by one. Anti-affinity at 5000 nodes passed over ~960 excluded nodes a pod before;
    a placement changes two lists and excludes one node."""

    __slots__ = ("hints",)

    def __init__(self, sets: tuple[NodeSet, ...]) -> None:
        super().__init__(sets)
        self.hints: dict[Partition, FiledNode | None] = {}

    def sync(self, view: IndexView) -> None:
        """Note the nodes filed into or out of the lists with a hint since the last walk."""
        if self._changes(view, self.hints) is None:
            self.hints.clear()

    def first(
        self,
        lane: _Lane,
        excluded: Callable[[str], bool],
        view: IndexView,
        states: Mapping[str, NodeState],
        variant: Variant,
    ) -> int:
        """The first position of the lane's list whose node ``excluded`` allows (len: none),
        its head being excluded."""
        partition, entries = lane.partition, lane.entries
        hints = self.hints
        start = 1
        if partition in hints:
            hint = hints[partition]
            # (The nodes excluded since are in front or not: they change nothing.)
            for entry in self._filed_in(partition, excluded, view, states, variant):
                if hint is None or entry < hint:
                    hint = entry
            start = len(entries) if hint is None else bisect_left(entries, hint)
        at = _allowed(entries, start, excluded)
        hints[partition] = entries[at] if at < len(entries) else None
        return at


class _Runs(_Kept):
    """Where the runs of nodes one penalised test (:meth:`PodRules.penalised
    <driver.scheduling.rules.PodRules.penalised>`) names end in each list, and the heap a walk
    under that test starts from, kept across decisions while the test only gains nodes (its
    node sets' ``removals``, its domains penalised by value, its floor and the nodes' labels
    are part of the key).

    The runs' ends: per list, a run's first entry to the entry past its end (None: the
    list's end). A node filed into a list since (the view's change log names it) that the
    test does not penalise breaks the runs it lands in (they are forgotten); a node filed out
    leaves the rest of a run penalised. A later walk resumes the scan at the kept end, which
    a node penalised since may extend. Preferred spreading at 5000 nodes scanned ~490 nodes a
    pod in ~15 runs before; a placement changes two lists.

    The heap: the start's heads (:meth:`_Start.update`), each head the test penalises
    replaced by its run, bounded by the head's bound lowered by the floor, and the list's
    first node after the run (unlowered); read again for the lists the change log names. A
    head penalised since it was read stays unlowered (a weaker bound, still a bound: the walk
    finds its penalty). Preferred spreading at 5000 nodes popped ~54 penalised heads a pod
    before the first node it evaluated, each estimated and pushed back."""

    __slots__ = ("ends", "floor", "heads", "heap", "stale")

    def __init__(self, sets: tuple[NodeSet, ...], floor: float) -> None:
        super().__init__(sets)
        self.floor = floor
        self.ends: dict[Partition, dict[FiledNode, FiledNode | None]] = {}
        self.heads: dict[Partition, tuple[_Frontier, ...]] = {}
        self.heap: list[_Frontier] | None = None  # the heads as a heap (None: to build)
        self.stale: set[Partition] | None = None  # lists changed since (None: every list)

    def sync(self, view: IndexView) -> None:
        """Note the nodes filed into or out of the lists since the last walk."""
        changes = self._changes(view, self.ends)
        if changes is None:
            self.ends.clear()
            self.heads.clear()
            self.heap = self.stale = None
        elif self.stale is not None:
            self.stale.update(partition for partition, _ in changes)

    def start_heap(
        self,
        start: _Start,
        penalised: Callable[[str], bool],
        states: Mapping[str, NodeState],
    ) -> list[_Frontier]:
        """The heap a walk starts from (shared: copy it before changing it), ``start``'s heads
        being up to date."""
        stale: Iterable[Partition] | None = self.stale
        if stale is None:
            self.heads.clear()
            stale = list(start.heads)
        heads, floor, view, variant = self.heads, self.floor, start.view, start.variant
        for partition in stale:
            head = start.heads.get(partition)
            self.heap = None
            if head is None:
                heads.pop(partition, None)
                continue
            key, name, _, lane, _, _, _ = head
            if not penalised(name):
                heads[partition] = (head,)
                continue
            end = self.end(lane, 0, penalised, view=view, states=states, variant=variant)
            run = _frontier((key + floor, name, start.serial, lane, 0, None, end))
            start.serial += 1
            if end == len(lane.entries):
                heads[partition] = (run,)
                continue
            after = _frontier(
                (_bound(lane, end), lane.entries[end].name, start.serial, lane, end, None, 0)
            )
            start.serial += 1
            heads[partition] = (run, after)
        self.stale = set()
        if self.heap is None:
            self.heap = [entry for found in heads.values() for entry in found]
            heapq.heapify(self.heap)
        return self.heap

    def end(
        self,
        lane: _Lane,
        at: int,
        penalised: Callable[[str], bool],
        *,
        view: IndexView,
        states: Mapping[str, NodeState],
        variant: Variant,
    ) -> int:
        """The first position after ``at`` (a penalised node's) of the lane's list whose node
        ``penalised`` does not name (len: none)."""
        partition, entries = lane.partition, lane.entries
        ends = self.ends.get(partition)
        if ends is None:
            ends = self.ends[partition] = {}
        else:
            # (The nodes penalised since break no run.)
            for entry in self._filed_in(partition, penalised, view, states, variant):
                for first, last in list(ends.items()):
                    if first < entry and (last is None or entry < last):
                        del ends[first]
        first = entries[at]
        size = len(entries)
        known = ends.get(first, first)
        if known is first:
            # A run not seen yet, scanned without a Python loop (islice passes over the run's
            # start in C; the test is mostly a set's own lookup).
            end = at + 1
            end += len(list(takewhile(penalised, map(_NAME, islice(entries, end, None)))))
            if len(ends) >= _RUN_ENDS:
                ends.clear()
        else:
            # The kept end, moved on past the nodes penalised since (mostly none).
            end = size if known is None else bisect_left(entries, known)
            while end < size and penalised(entries[end].name):
                end += 1
        ends[first] = entries[end] if end < size else None
        return end


class WalkStarts:
    """The walks' starting heaps (:class:`_Start`), kept per lists and pod amounts for the
    engine that owns the index (cleared with it: they hold its lists)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[tuple[object, ...], _Start] = {}

    def clear(self) -> None:
        self._kept.clear()

    def start(
        self,
        view: IndexView,
        variant: Variant,
        by_ident: Sequence[NodeShape],
        policies: PodPolicies,
        *,
        bounds: dict[int, ShapeBounds],
        bounds_for: Callable[[NodeShape, ViewShape], ShapeBounds],
    ) -> _Start:
        """The kept start for the pod's lists and amounts (made on first use). Fills
        ``bounds`` for every shape the view files."""
        lists = view.lists[variant]
        memos: dict[int, dict[Partition, NodeAmounts | None]] = {}
        for shape_id, shape in view.shapes.items():
            if not shape.devices:
                continue  # (never filed in this view)
            shape_bounds = bounds.get(shape_id)
            if shape_bounds is None:
                shape_bounds = bounds[shape_id] = bounds_for(by_ident[shape_id], shape)
            memos[shape_id] = amounts_memo(policies, shape, shape_bounds)
        # (A kept start holds the lists and the memos: their ids are not reused meanwhile.)
        key = (id(lists), *[(shape_id, id(memo)) for shape_id, memo in memos.items()])
        start = self._kept.get(key)
        if start is None:
            if len(self._kept) >= _STARTS:
                self._kept.clear()
            start = self._kept[key] = _Start(
                view, variant, by_ident=by_ident, policies=policies, memos=memos, bounds=bounds
            )
        return start


def _tie_contender(
    entries: list[FiledNode],
    position: int,
    best: Best,
    tie_break: Callable[[str], Fraction],
    excluded: Callable[[str], bool] | None,
) -> int | None:
    """From ``position`` on, within the run of ``entries`` with its list key (one bound,
    which equals the best's total score), the first node whose tie-break may still beat the
    best's (a smaller penalty, or an equal one and a smaller name); None when there is none."""
    _, best_tie, best_name = best.rank
    run_key = entries[position].key
    # The tie-breaker hands out one memoised Fraction per distinct penalty, and a run holds
    # few: each is compared with the best's once (exact comparisons cost microseconds).
    # id of a penalty -> (the penalty, kept alive so that its id stays its own; -1, 0, 1:
    # below, equal to, above the best's)
    compared: dict[int, tuple[Fraction, int]] = {}
    for at in range(position, len(entries)):
        key, name = entries[at]
        if key != run_key:
            return None  # a worse bound: no later node of the list can win
        if excluded is not None and excluded(name):
            continue
        tie = tie_break(name)
        seen = compared.get(id(tie))
        if seen is None:
            seen = compared[id(tie)] = (tie, (tie > best_tie) - (tie < best_tie))
        order = seen[1]
        if order < 0 or (order == 0 and name < best_name):
            return at
    return None


def _bound(lane: _Lane, position: int) -> float:
    """The float bound of the node at ``position`` of the lane's list (its score alone)."""
    return (lane.entries[position].key + lane.shift) / lane.divisor


def best_first(
    view: IndexView,
    variant: Variant,
    by_ident: Sequence[NodeShape],
    states: Mapping[str, NodeState],
    nodes: Mapping[str, Node],
    *,
    starts: WalkStarts,
    policies: PodPolicies,
    demand: Demand,
    rules: PodRules | None,
    bounds: dict[int, ShapeBounds],
    bounds_for: Callable[[NodeShape, ViewShape], ShapeBounds],
    evaluate: Callable[[Node], Best | None],
    stats: DecisionStats,
) -> tuple[Best | None, int]:
    """The best node of the ``variant`` lists of ``view`` (the pod's) and how many nodes were
    evaluated (counted in ``stats`` too). ``starts`` keeps the heap of the lists' heads
    across decisions; ``bounds`` holds the pod's bounds per shape, and the walk adds those
    ``bounds_for`` computes; ``evaluate`` is the exact evaluation of a node the precheck
    passed (None: it does not fit). None when no node of the lists fits."""
    walk = _Walk(states, nodes, policies.node, demand, rules)
    start = starts.start(view, variant, by_ident, policies, bounds=bounds, bounds_for=bounds_for)
    start.update()
    heap: list[_Frontier] | None = None
    sets = rules.exclusion_sets() if walk.excluded is not None and rules is not None else None
    if sets:
        walk.skips = start.skips_for(sets)
    if walk.penalised is not None and walk.excluded is None and rules is not None:
        # (Runs that an exclusion cuts short are scanned afresh: not kept.)
        penalised = rules.penalised_key()
        if penalised is not None:
            walk.runs = start.runs_for(*penalised, walk.floor)
            heap = walk.runs.start_heap(start, walk.penalised, states)
    walk.heap = list(heap if heap is not None else start.heads_heap())
    walk.serial = start.serial
    walk.where = (view, variant)
    return walk.run(bounds, evaluate, stats)


class _Walk:
    """One pod's walk (see :func:`best_first`): the heap, the best so far and what the walk
    reads, so that its steps can be told apart without passing a dozen values around."""

    def __init__(
        self,
        states: Mapping[str, NodeState],
        nodes: Mapping[str, Node],
        policy: NodePolicy,
        demand: Demand,
        rules: PodRules | None,
    ) -> None:
        self.states = states
        self.nodes = nodes
        self.policy = policy
        self.demand = demand
        self.cores = demand.cores
        self.rules = rules
        # Nodes a rule excludes are skipped before any heap work; the soft rules' penalty
        # lowers a node's bound once its list hands it over (docs/scoring.md).
        self.excluded = rules.exclusion() if rules is not None and rules.filters else None
        self.estimate = rules.estimator() if rules is not None and rules.soft else None
        self.ties = rules.tie_breaker() if rules is not None and rules.ties else None
        # Nodes the soft rules certainly penalise, and the least penalty any of them gets:
        # a list's runs of them take one heap entry each, split only while they may win.
        penalised = rules.penalised() if self.estimate is not None and rules is not None else None
        self.penalised: Callable[[str], bool] | None = None
        self.floor = 0.0
        if penalised is not None:
            self.penalised, self.floor = penalised
        self.heap: list[_Frontier] = []
        self.serial = 0
        # Where the exclusion's first allowed nodes are kept, and the view and variant of
        # the lists (None: not kept; see _Skips).
        self.skips: _Skips | None = None
        # Where the ends of the runs of penalised nodes are kept (None: not kept; see _Runs).
        self.runs: _Runs | None = None
        self.where: tuple[IndexView, Variant] | None = None
        self.best: Best | None = None
        self.best_key = 0.0

    def run(
        self,
        bounds: Mapping[int, ShapeBounds],
        evaluate: Callable[[Node], Best | None],
        stats: DecisionStats,
    ) -> tuple[Best | None, int]:
        """Pop nodes best bound first until no bound left can win; evaluate each."""
        heap, states, nodes, demand = self.heap, self.states, self.nodes, self.demand
        excluded = self.excluded
        evaluated = 0
        while heap:
            entry = heapq.heappop(heap)
            key, name, _, lane, _, penalty, run_end = entry
            best = self.best
            # Floats order the heap; whether a bound can still win is decided exactly, unless
            # it is clearly worse. Keys pop in order (a list's next bound is no better than
            # its head's, a penalty only raises a key) and the best only improves: once one
            # bound is clearly worse, so is every bound left.
            if best is not None and key > self.best_key + _EPSILON:
                break
            if run_end:
                self._split(entry)
                continue
            if excluded is not None and penalty is None and excluded(name):
                self._next_allowed(entry)  # a list's head that a rule excludes
                continue
            state = states[name]
            if (
                best is not None
                and key >= self.best_key - _EPSILON
                and not self._may_win(entry, state, best)
            ):
                continue
            if penalty is None and self._hand_over(entry) > 0.0:
                continue  # (the head went back with its penalty)
            evaluated += 1
            stats.nodes_evaluated += 1
            # The index's precheck first: it is the cheapest test and fails most often. Its
            # reason is not kept: the filter's reasons come first in kube-scheduler's order.
            if precheck(state, demand, bounds[lane.shape.ident]) is None:
                found = evaluate(nodes[name])
                if found is not None and (best is None or found.rank < best.rank):
                    self.best = found
                    self.best_key = float(found.rank[0])
        return self.best, evaluated

    def _next_allowed(self, entry: _Frontier) -> None:
        """Its list's first node after ``entry`` that no rule excludes joins the heap (unless
        none is left, or its bound cannot win)."""
        _, _, _, lane, position, _, _ = entry
        assert self.excluded is not None
        entries = lane.entries
        if self.skips is not None and self.where is not None and position == 0:
            at = self.skips.first(lane, self.excluded, self.where[0], self.states, self.where[1])
        else:
            at = _allowed(entries, position + 1, self.excluded)
        if at == len(entries):
            return
        key = _bound(lane, at)
        if self.best is not None and key > self.best_key + _EPSILON:
            return
        self._push(key, entries[at].name, lane, at)

    def _may_win(self, entry: _Frontier, state: NodeState, best: Best) -> bool:
        """For a node whose bound is within a float's error of the best: whether it may still
        beat it, decided exactly (False: its list's later nodes cannot either, or the next
        one that can went back into the heap)."""
        _, name, _, lane, position, penalty, _ = entry
        rules = self.rules
        exact = node_score(lane.shape.total, state.used, lane.adding, cores=self.cores)
        lowered = rules.penalty(self.nodes[name]) if penalty and rules is not None else ZERO
        bounded = rank(self.policy, exact, lowered, ZERO, name)
        if bounded > best.rank:
            return False  # (a list's later nodes are no better: it is dropped whole)
        if self.ties is None or penalty is not None or bounded[0] != best.rank[0]:
            return True
        # The bound only equals the best: the node can win on the tie-break alone, so its own
        # tie-break decides (not an optimistic 0), and so do its list's next nodes of the same
        # key (the same bound): the first that may win goes back into the heap, the others are
        # passed over. Without this, a best with a tie-break penalty made every node of its
        # score an allocator call (issue 28's cliff: 48 nodes per pod).
        entries = lane.entries
        after = _tie_contender(entries, position, best, self.ties, self.excluded)
        if after is None:
            return False
        if after == position:
            return True
        self._push(_bound(lane, after), entries[after].name, lane, after)
        return False

    def _split(self, run: _Frontier) -> None:
        """A penalised run may still win: its first node goes back lowered by its own
        penalty, the rest as a shorter run (each only if it may still win)."""
        _, name, _, lane, position, _, run_end = run
        assert self.estimate is not None
        best, limit = self.best, self.best_key + _EPSILON
        penalty = self.estimate(self.nodes[name])
        key = _bound(lane, position)
        if best is None or key + penalty <= limit:
            self._push(key + penalty, name, lane, position, penalty=penalty)
        position += 1
        if position < run_end:
            key = _bound(lane, position)
            if best is None or key + self.floor <= limit:
                self._push(
                    key + self.floor, lane.entries[position].name, lane, position, run_end=run_end
                )

    def _push(
        self,
        key: float,
        name: str,
        lane: _Lane,
        position: int,
        *,
        penalty: float | None = None,
        run_end: int = 0,
    ) -> None:
        heapq.heappush(
            self.heap, _frontier((key, name, self.serial, lane, position, penalty, run_end))
        )
        self.serial += 1

    def _hand_over(self, entry: _Frontier) -> float:
        """A list's head was popped. With soft rules, it and the list's next nodes while they
        would pop next anyway are handled here, without a heap round trip: each with a
        penalty goes back lowered by it (or nowhere, once it cannot win), and a run of nodes
        the soft rules certainly penalise goes back as one entry. The first node without a
        penalty, or past the heap's top, joins the heap unlowered. Returns the head's penalty
        (0.0: it is evaluated now)."""
        key, name, _, lane, position, _, _ = entry
        heap, nodes = self.heap, self.nodes
        estimate, excluded, best = self.estimate, self.excluded, self.best
        penalised, floor = self.penalised, self.floor
        runs, where = self.runs, self.where
        best_key = self.best_key
        entries, shift, divisor = lane.entries, lane.shift, lane.divisor
        head_penalty = 0.0
        at, at_name, at_key = position, name, key
        end = len(entries)
        estimating = True
        while estimating:
            ahead = estimate(nodes[at_name]) if estimate is not None else 0.0
            if at == position:
                head_penalty = ahead
            if ahead > 0.0:
                lowered_key = at_key + ahead
                if best is None or lowered_key <= best_key + _EPSILON:
                    self._push(lowered_key, at_name, lane, at, penalty=ahead)
            elif at != position:
                break  # (pushed unlowered below)
            while True:  # the next node, past the runs of penalised nodes
                at += 1
                if excluded is not None:
                    at = _allowed(entries, at, excluded)
                if at >= end:
                    at = -1
                    break
                at_list_key, at_name = entries[at]
                at_key = (at_list_key + shift) / divisor
                if estimate is None or (heap and at_key > heap[0][0]):
                    estimating = False
                    break  # (pushed unlowered below)
                if best is not None and at_key > best_key + _EPSILON:
                    at = -1
                    break  # this list cannot win any more
                if penalised is None or not penalised(at_name):
                    break  # (its penalty is estimated above)
                if runs is not None and where is not None:
                    run_end = runs.end(
                        lane, at, penalised, view=where[0], states=self.states, variant=where[1]
                    )
                else:
                    run_end = at + 1
                    while run_end < end:
                        after = entries[run_end].name
                        if not penalised(after) or (excluded is not None and excluded(after)):
                            break
                        run_end += 1
                if best is None or at_key + floor <= best_key + _EPSILON:
                    self._push(at_key + floor, at_name, lane, at, run_end=run_end)
                at = run_end - 1
            if at < 0:
                break
        if at >= 0:
            self._push(at_key, at_name, lane, at)
        return head_penalty

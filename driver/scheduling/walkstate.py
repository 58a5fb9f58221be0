"""What the pruned node search (:mod:`driver.scheduling.search`) keeps across decisions,
apart from the walk itself: the lists as a walk reads them (:class:`Lane`), its heap entries
(:class:`Frontier`), and the state it starts from, brought up to date from each view's change
log (:attr:`~driver.scheduling.capacity_index.IndexView.changes`, which names the lists
placements changed; a new epoch means any list may have changed).

* :class:`WalkStarts` keeps a :class:`WalkStart` per lists and pod amounts (what the pod adds
  per partition is :func:`~driver.scheduling.bounds.amounts_memo`'s, keyed by all it reads):
  per partition that can hold the pod, its lane and its head, bounded; a decision reads again
  only the lists that changed since the last one.
* :class:`Skips`, per exclusion that is membership in node sets the pod index keeps
  (anti-affinity): where in each list the first node it allows was found, while those sets
  are only added to.
* :class:`Runs`, per test of the nodes the soft rules certainly penalise: where the runs of
  such nodes end in each list, and the starting heap with each list's penalised head
  replaced by its run lowered by the penalty's floor, while the nodes penalised are only
  added to.

Everything kept holds what its key names by id (lists, memos, node sets), so those ids are
not reused while it lives; the engine clears it with its index. The tests that compare the
pruned search with evaluating every node run streams of placements, removals and relabels
against it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from functools import partial
from itertools import islice, takewhile
from operator import itemgetter
from typing import Final, NamedTuple

from driver.scheduling.bounds import ShapeBounds, amounts_memo, partition_amounts
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
from driver.scheduling.podindex import NodeSet
from driver.scheduling.policy import PodPolicies
from driver.scheduling.scoring import NodeAmounts

_UNSEEN: Final = NodeAmounts(-1, -1, -1)  # a partition the amounts memo has no answer for yet
_STARTS: Final = 64  # walks' starting heaps kept (one per view variant and pod kind)
_SKIPS: Final = 8  # exclusions whose first allowed nodes a start keeps
_RUNS: Final = 8  # penalised tests whose runs' ends a start keeps
_RUN_ENDS: Final = 64  # runs' ends kept per list (more: forgotten, found again)


class Lane(NamedTuple):
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


class Frontier(NamedTuple):
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
    lane: Lane
    position: int
    penalty: float | None
    run: int  # not 0: the nodes from ``position`` to this one (excluded) are a penalised run


# Built as NamedTuple._make builds (tuple.__new__ on the values): half the cost of the
# keyword-capable constructor, which shows at 5000 nodes.
frontier: Callable[
    [tuple[float, str, int, Lane, int, float | None, int]],
    Frontier,
] = partial(tuple.__new__, Frontier)


_NAME: Final = itemgetter(1)  # a FiledNode's name


def first_allowed(entries: list[FiledNode], start: int, excluded: Callable[[str], bool]) -> int:
    """The first position from ``start`` whose node no rule excludes (len: none)."""
    if start >= len(entries) or not excluded(entries[start].name):
        return start
    # A run of excluded nodes (anti-affinity's: the nodes in use, where binpack looks
    # first), counted without a Python loop: the test is mostly a set's own lookup.
    skipped = takewhile(excluded, map(_NAME, islice(entries, start + 1, None)))
    return start + 1 + len(list(skipped))


def lane_bound(lane: Lane, position: int) -> float:
    """The float bound of the node at ``position`` of the lane's list (its score alone)."""
    return (lane.entries[position].key + lane.shift) / lane.divisor


class WalkStart:
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
        self.lanes: dict[Partition, Lane] = {}
        self.heads: dict[Partition, Frontier] = {}
        self.heap: list[Frontier] | None = None  # the heads as a heap (None: to build)
        self.serial = 0
        self.skips: dict[tuple[tuple[int, int], ...], Skips] = {}
        self.runs: dict[tuple[object, ...], Runs] = {}

    def update(self) -> None:
        """The heads, the view's lists read again where they changed (settled first)."""
        view = self.view
        view.settle()
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

    def heads_heap(self) -> list[Frontier]:
        """The heads as a heap (shared: copy it before changing it), up to date after
        :meth:`update`."""
        if self.heap is None:
            self.heap = list(self.heads.values())
            heapq.heapify(self.heap)
        return self.heap

    def skips_for(self, sets: tuple[NodeSet, ...]) -> Skips:
        """The kept first allowed nodes for the exclusion by ``sets``, up to date."""
        key = tuple((id(s), s.removals) for s in sets)
        found = self.skips.get(key)
        if found is None:
            if len(self.skips) >= _SKIPS:
                self.skips.clear()
            found = self.skips[key] = Skips(sets)
        found.sync(self.view)
        return found

    def runs_for(self, sets: tuple[NodeSet, ...], rest: tuple[object, ...], floor: float) -> Runs:
        """The kept runs of the nodes a penalised test (:meth:`PodRules.penalised_key`: ``sets``
        and ``rest``, which holds ``floor``) names, up to date."""
        key = (tuple((id(s), s.removals) for s in sets), rest)
        found = self.runs.get(key)
        if found is None:
            if len(self.runs) >= _RUNS:
                self.runs.clear()
            found = self.runs[key] = Runs(sets, floor)
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
            lane = self.lanes[partition] = Lane(
                entries, partition, adding, shape, *score_line(shape.total, adding, self.variant)
            )
        key, name = entries[0]
        # The head goes in even if a rule excludes it: its bound is the list's best, so the
        # list's first allowed node is looked for only once the head pops (lists whose
        # bound cannot win are never walked through their excluded nodes).
        self.heads[partition] = frontier(
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
        """The view's changes since the last walk (settled first), those to the lists in
        ``kept`` noted in ``pending``; None: a new epoch (any list may have changed; nothing is
        pending)."""
        view.settle()
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


class Skips(_Kept):
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
        lane: Lane,
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
        at = first_allowed(entries, start, excluded)
        hints[partition] = entries[at] if at < len(entries) else None
        return at


class Runs(_Kept):
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

    The heap: the start's heads (:meth:`WalkStart.update`), each head the test penalises
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
        self.heads: dict[Partition, tuple[Frontier, ...]] = {}
        self.heap: list[Frontier] | None = None  # the heads as a heap (None: to build)
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
        start: WalkStart,
        penalised: Callable[[str], bool],
        states: Mapping[str, NodeState],
    ) -> list[Frontier]:
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
            run = frontier((key + floor, name, start.serial, lane, 0, None, end))
            start.serial += 1
            if end == len(lane.entries):
                heads[partition] = (run,)
                continue
            after = frontier(
                (lane_bound(lane, end), lane.entries[end].name, start.serial, lane, end, None, 0)
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
        lane: Lane,
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
    """The walks' starting heaps (:class:`WalkStart`), kept per lists and pod amounts for the
    engine that owns the index (cleared with it: they hold its lists)."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[tuple[object, ...], WalkStart] = {}

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
    ) -> WalkStart:
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
            start = self._kept[key] = WalkStart(
                view, variant, by_ident=by_ident, policies=policies, memos=memos, bounds=bounds
            )
        return start

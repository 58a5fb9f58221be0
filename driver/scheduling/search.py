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
is kept across decisions (:mod:`driver.scheduling.walkstate`, which says what else is kept
and how it is brought up to date). Nodes a rule between pods excludes are skipped inside
their lists, and only once a list's head pops (a list whose bound cannot win is never walked
through its excluded nodes); a node whose soft rules cost a penalty goes back into the heap
with its bound lowered by it, and a run of a list's nodes that the soft rules certainly
penalise (:meth:`~driver.scheduling.rules.PodRules.penalised`) goes back as one entry,
lowered by the penalty's floor and split node by node only while it may win; where the bound
only equals the best, a node can win on the System default spreading's tie-break alone, so
its own tie-break decides. The result is identical to evaluating every node (tests compare
both on random clusters, with every rule, and on streams of placements and removals);
``docs/scoring.md`` explains the bounds.

:func:`best_first` reads the index and the rules and never changes them; what it evaluates is
the engine's (the ``evaluate`` callback, which may record per-node reasons).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Final

from driver.api.nodes import Node
from driver.scheduling.bounds import Demand, ShapeBounds, precheck
from driver.scheduling.capacity_index import (
    FiledNode,
    IndexView,
    NodeShape,
    NodeState,
    Variant,
    ViewShape,
)
from driver.scheduling.podcontext import ZERO, Best, DecisionStats
from driver.scheduling.policy import NodePolicy, PodPolicies
from driver.scheduling.rules import PodRules
from driver.scheduling.scoring import node_score, rank
from driver.scheduling.walkstate import (
    Frontier,
    Lane,
    Runs,
    Skips,
    WalkStarts,
    first_allowed,
    frontier,
    lane_bound,
)

__all__ = ["WalkStarts", "best_first"]  # (the engine keeps the walks' starts it passes in)

_EPSILON: Final = 1e-9  # float bounds closer than this to the best are compared exactly


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
    heap: list[Frontier] | None = None
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
        self.heap: list[Frontier] = []
        self.serial = 0
        # Where the exclusion's first allowed nodes are kept, and the view and variant of
        # the lists (None: not kept; see Skips).
        self.skips: Skips | None = None
        # Where the ends of the runs of penalised nodes are kept (None: not kept; see Runs).
        self.runs: Runs | None = None
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

    def _next_allowed(self, entry: Frontier) -> None:
        """Its list's first node after ``entry`` that no rule excludes joins the heap (unless
        none is left, or its bound cannot win)."""
        _, _, _, lane, position, _, _ = entry
        assert self.excluded is not None
        entries = lane.entries
        if self.skips is not None and self.where is not None and position == 0:
            at = self.skips.first(lane, self.excluded, self.where[0], self.states, self.where[1])
        else:
            at = first_allowed(entries, position + 1, self.excluded)
        if at == len(entries):
            return
        key = lane_bound(lane, at)
        if self.best is not None and key > self.best_key + _EPSILON:
            return
        self._push(key, entries[at].name, lane, at)

    def _may_win(self, entry: Frontier, state: NodeState, best: Best) -> bool:
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
        self._push(lane_bound(lane, after), entries[after].name, lane, after)
        return False

    def _split(self, run: Frontier) -> None:
        """A penalised run may still win: its first node goes back lowered by its own
        penalty, the rest as a shorter run (each only if it may still win)."""
        _, name, _, lane, position, _, run_end = run
        assert self.estimate is not None
        best, limit = self.best, self.best_key + _EPSILON
        penalty = self.estimate(self.nodes[name])
        key = lane_bound(lane, position)
        if best is None or key + penalty <= limit:
            self._push(key + penalty, name, lane, position, penalty=penalty)
        position += 1
        if position < run_end:
            key = lane_bound(lane, position)
            if best is None or key + self.floor <= limit:
                self._push(
                    key + self.floor, lane.entries[position].name, lane, position, run_end=run_end
                )

    def _push(
        self,
        key: float,
        name: str,
        lane: Lane,
        position: int,
        *,
        penalty: float | None = None,
        run_end: int = 0,
    ) -> None:
        heapq.heappush(
            self.heap, frontier((key, name, self.serial, lane, position, penalty, run_end))
        )
        self.serial += 1

    def _hand_over(self, entry: Frontier) -> float:
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
                    at = first_allowed(entries, at, excluded)
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

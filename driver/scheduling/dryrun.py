"""The preemption dry run: where would a pod that fits nowhere fit by evicting lower-priority
pods, and which.

kube-scheduler's preemption ``Evaluator`` (``pkg/scheduler/framework/preemption``:
``findCandidates``, ``DryRunPreemption``, ``SelectCandidate``) over the rules of
:mod:`driver.scheduling.preemption` (the ``defaultpreemption`` plugin's: candidates sampled
from a stable offset, the minimal victims per node, upstream's choice among candidates), then
the pod's own rank on the node as the last tie-break. It asks the decision engine only
through the engine's what-if interface (:class:`WhatIfs`), as upstream's evaluator asks the
framework to run its filters on a cloned NodeInfo: which pods are on a node, whether removing
pods could help there, and, in a :class:`WhatIfView` where a set of pods is gone from one node
(and the nominations that hold against the pod are placed), whether the pod fits and how well.

Candidates whose victim searches would read exactly the same things share one search: the
engine says what a fit check on a node reads besides the pods removed
(:meth:`WhatIfs.reads`, :meth:`WhatIfs.what_if_key`), and the dry run adds what the victim
search reads of the potential victims (priority, budget protection). Equal keys get the same
verdict (:class:`~driver.scheduling.preemption.Verdict`): the same answer as searching each,
at the cost of one search per set of alike nodes. Nothing here changes the engine; the views
put back what they change.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Final, Protocol

from driver.scheduling.outcome import NoPreemption, Placement, Preemption
from driver.scheduling.podcontext import Best, DecisionStats, PodContext
from driver.scheduling.podindex import ScheduledPod
from driver.scheduling.preemption import (
    DisruptionBudget,
    NodeVictims,
    PodOnNode,
    Verdict,
    budget_violations,
    candidate_count,
    candidate_offset,
    pick_one,
    potential_victims,
    select_victims,
    verdict_of,
    victims_by,
)
from driver.scheduling.scoring import Rank

log = logging.getLogger(f"biaxial.{__name__}")

NOT_HELPFUL_TAIL: Final = "Preemption is not helpful for scheduling."
NOT_HELPFUL: Final = "preemption: 0/{nodes} nodes are available: " + NOT_HELPFUL_TAIL
NEVER: Final = "preemption: not eligible due to preemptionPolicy=Never."


class WhatIfView(Protocol):
    """One node as if some pods were gone from it (and the nominations that hold against the
    pod placed there), until the view is closed."""

    def fits(self, removed: frozenset[str]) -> bool:
        """Whether the pod fits with the pods ``removed`` (UIDs) gone instead."""
        ...

    def best(self) -> Best | None:
        """The pod's exact outcome on the node as the view stands (None: it does not fit)."""
        ...


class WhatIfs(Protocol):
    """What the dry run asks of the decision engine, for the pod of a :class:`PodContext`
    the engine built."""

    stats: DecisionStats

    def node_names(self) -> Sequence[str]:
        """Every node, in the engine's order (by name)."""
        ...

    def pods_below(self, node: str, priority: int) -> Mapping[str, ScheduledPod]:
        """Pods seen on ``node`` with a priority below ``priority``, by UID."""
        ...

    def start_time(self, pod: str) -> float:
        """The pod's ``status.startTime`` in seconds (NOT_STARTED when unknown)."""
        ...

    def might_help(self, ctx: PodContext, node: str) -> bool:
        """Whether removing pods could make ``node`` fit (its filter passes when empty)."""
        ...

    def held(self, ctx: PodContext, node: str) -> bool:
        """Whether nominations of other pods hold against the pod on ``node``."""
        ...

    def reads(self, ctx: PodContext) -> tuple[str, ...] | None:
        """Whether fit checks of this pod read the same on alike nodes, and if so the device
        attributes they read; None when they may not be shared."""
        ...

    def what_if_key(
        self, reads: tuple[str, ...], node: str, removable: Sequence[ScheduledPod]
    ) -> Hashable | None:
        """Everything a fit check on ``node`` reads with any of ``removable`` (in this order)
        removed, the node's own names and the pods' identities left out; None when the node
        cannot be keyed."""
        ...

    def what_if(
        self, ctx: PodContext, node: str, removed: frozenset[str] = frozenset()
    ) -> AbstractContextManager[WhatIfView]:
        """A view of ``node`` with the pods ``removed`` gone."""
        ...

    def placement(self, ctx: PodContext, best: Best) -> Placement:
        """The placement the pod's outcome on a node makes."""
        ...


def _potential(host: WhatIfs, lower: Mapping[str, ScheduledPod], priority: int) -> list[PodOnNode]:
    """The victim search's view of the pods ``lower``, most important first."""
    return potential_victims(
        priority,
        [
            PodOnNode(
                uid=p.uid,
                namespace=p.namespace,
                name=p.name,
                priority=p.priority,
                start=host.start_time(p.uid),
                labels=p.labels,
            )
            for p in lower.values()
        ],
    )


def _search_key(
    host: WhatIfs,
    reads: tuple[str, ...],
    node: str,
    lower: Mapping[str, ScheduledPod],
    potential: Sequence[PodOnNode],
    *,
    budgets: Sequence[DisruptionBudget],
) -> Hashable | None:
    """Everything the victim search on ``node`` reads: what the engine's fit checks read
    there (:meth:`WhatIfs.what_if_key`, with the potential victims most important first), and
    per potential victim its priority and whether a budget protects it. Two nodes with equal
    keys get the same verdict, told by positions in ``potential``."""
    fit = host.what_if_key(reads, node, [lower[p.uid] for p in potential])
    if fit is None:
        return None
    protected: set[str] = set()
    if budgets:
        violating, _ = budget_violations(potential, budgets)
        protected = {p.uid for p in violating}
    return fit, tuple((p.priority, p.uid in protected) for p in potential)


def _best_without(host: WhatIfs, ctx: PodContext, node: str, victims: NodeVictims) -> Best | None:
    """The pod's exact outcome on ``node`` once ``victims`` are gone (its rank breaks ties
    between candidates; its allocation is what a nomination holds)."""
    removed = frozenset(v.uid for v in victims.victims)
    with host.what_if(ctx, node, removed) as view:
        return view.best()


def dry_run(
    host: WhatIfs,
    ctx: PodContext,
    budgets: Sequence[DisruptionBudget],
    *,
    share_verdicts: bool = True,
) -> Preemption | NoPreemption:
    """For the pod of ``ctx`` (which may preempt): the node and victims, or why none. Pods
    the engine placed and has not seen bound yet are never victims (they are not seen on
    any node). ``share_verdicts=False`` runs every victim search in full. Errors the engine
    raises (:class:`~driver.api.errors.BiaxialError`) pass through."""
    priority = ctx.scheduled.priority
    names = host.node_names()
    total = len(names)
    offset = candidate_offset(ctx.scheduled.uid, total)
    wanted = candidate_count(total)
    fine: list[NodeVictims] = []
    violating: list[NodeVictims] = []
    reads = host.reads(ctx) if share_verdicts else None
    verdicts: dict[Hashable, Verdict | None] = {}
    for i in range(total):
        node = names[(offset + i) % total]
        lower = host.pods_below(node, priority)
        if not lower or not host.might_help(ctx, node):
            continue
        pods = _potential(host, lower, priority)
        key = (
            _search_key(host, reads, node, lower, pods, budgets=budgets)
            if reads is not None and not host.held(ctx, node)
            else None
        )
        if key is not None and key in verdicts:
            host.stats.verdicts_reused += 1
            found = victims_by(node, pods, verdicts[key])
        else:
            with host.what_if(ctx, node) as view:
                found = select_victims(node, priority, pods, budgets, view.fits)
            if key is not None:
                verdicts[key] = verdict_of(found, pods)
        if found is not None:
            (violating if found.violations else fine).append(found)
            if fine and len(fine) + len(violating) >= wanted:
                break
    candidates = fine + violating
    by_node = {c.node: c for c in candidates}
    ranks: dict[str, Rank | None] = {}

    def tie(node: str) -> tuple[int, Rank | None]:
        if node not in ranks:
            best = _best_without(host, ctx, node, by_node[node])
            ranks[node] = best.rank if best is not None else None
        found = ranks[node]
        return (0, found) if found is not None else (1, None)

    chosen = pick_one(candidates, tie)
    if chosen is None:
        return NoPreemption(pod=ctx.name, message=NOT_HELPFUL.format(nodes=total))
    best = _best_without(host, ctx, chosen.node, chosen)
    if best is None:  # (fits said yes: only a bug gets here)
        return NoPreemption(pod=ctx.name, message=NOT_HELPFUL.format(nodes=total))
    placement = host.placement(ctx, best)
    log.info(
        "pod %s: preempting %d pod(s) on node %s (%d candidate(s))",
        ctx.name,
        len(chosen.victims),
        chosen.node,
        len(candidates),
    )
    return Preemption(
        pod=ctx.name,
        node=chosen.node,
        victims=chosen.victims,
        violations=chosen.violations,
        placement=placement,
        candidates=len(candidates),
    )

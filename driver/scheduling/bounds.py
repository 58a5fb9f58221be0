"""What a pod can add to a node, known from the capacity index alone: its demand, the
per-shape bounds of the node score, and the precheck.

* :func:`pod_demand` reduces the pod's claims to what bounds need (per request its
  alternatives, the locality constraint, whether cores count, whether pruning may be used).
* :func:`shape_bounds` gives, per :class:`~driver.scheduling.capacity_index.NodeShape`, the
  most and least memory, cores and devices the pod can take there, the level a shared device
  needs, and each alternative's consumption per device kind — over the kinds the alternative
  can use only (its class selects them, its selectors do not exclude them), so a MIG partition,
  another product or a device a selector rules out never loosens the bound.
* :func:`bound_amounts` turns those into the optimistic amounts for one partition — the most
  the pod can add under node binpack, the least under spread (the score they give a list's
  nodes is :func:`~driver.scheduling.capacity_index.score_line`'s).
* :func:`precheck` is a necessary condition on one node: each request has enough devices
  with room. It returns kube-scheduler's reason when it fails, None when the node may fit.

All functions are pure; a bound is never tighter than the truth (``docs/scoring.md``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from driver.api.claims import ResourceClaim
from driver.api.model import Device
from driver.api.quantity import Quantity
from driver.scheduling.capacity_index import (
    LEVELS,
    DeviceKind,
    NodeShape,
    NodeState,
    Partition,
    ViewShape,
    capacity_units,
)
from driver.scheduling.outcome import (
    REASON_CLAIMS,
    REASON_FREE_GPUS,
    REASON_GPU_CORES,
    REASON_GPU_MEMORY,
)
from driver.scheduling.policy import PodPolicies
from driver.scheduling.scoring import CORES, MEMORY, NUMA_NODE, PCIE_ROOT, NodeAmounts, consumption

_NO_FIT: Final = LEVELS + 1  # a fit level no shared device reaches

KindAmounts = tuple[Mapping[str, int] | None, ...]
"""Per device kind of a shape: what one device of the alternative consumes there (None: it
does not fit that kind, or the kind is excluded)."""


@dataclass(frozen=True, slots=True)
class AltAmounts:
    """One alternative on one shape: consumption per kind, and the kinds it cannot use at all
    (class or selector: not a shortage of memory or cores)."""

    by_kind: KindAmounts
    excluded: frozenset[int]


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to satisfy a request: this many devices of this class, passing these request
    selectors, with these capacity requests."""

    count: int
    requests: Mapping[str, Quantity]
    device_class: str
    selectors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Demand:
    """The pod's device requests, reduced to what bounds and prechecks need.

    ``simple``: one claim, one request, one alternative of one device, no constraints, no
    admin access. For such a pod, on a shape where it can use exactly one kind of device and
    knows for sure that it can use every device of that kind (its selectors, if any, answer
    for the whole kind: :mod:`driver.scheduling.classification`), the GPU axis's choice on a
    node is known from the index alone, which makes the bound on the devices dimension exact.
    """

    requests: tuple[tuple[Alternative, ...], ...]  # per request: its alternatives
    grouped: tuple[str | None, ...]  # per request: matchAttribute on NUMA node or PCIe root
    cores: bool  # the node score includes the cores dimension
    prunable: bool
    simple: bool
    classes: frozenset[str]


def pod_demand(claims: Sequence[ResourceClaim]) -> Demand:
    requests: list[tuple[Alternative, ...]] = []
    grouped: list[str | None] = []
    prunable = True
    cores = False
    classes: set[str] = set()
    for claim in claims:
        local = {
            name: c.match_attribute
            for c in claim.constraints
            if c.match_attribute in (NUMA_NODE, PCIE_ROOT)
            for name in (c.requests or tuple(r.name for r in claim.requests))
        }
        for request in claim.requests:
            alternatives = (
                (request.exactly,) if request.exactly is not None else request.first_available
            )
            alts = []
            for alt in alternatives:
                classes.add(alt.device_class_name)
                if alt.allocation_mode != "ExactCount" or alt.admin_access:
                    prunable = False
                    continue
                want_cores = alt.capacity_requests.get(CORES)
                if want_cores is not None and want_cores.sign() > 0:
                    cores = True
                alts.append(
                    Alternative(
                        alt.count, alt.capacity_requests, alt.device_class_name, alt.selectors
                    )
                )
            if alts:
                requests.append(tuple(alts))
                grouped.append(local.get(request.name))
    simple = (
        prunable
        and len(claims) == 1
        and not claims[0].constraints
        and len(requests) == 1
        and len(requests[0]) == 1
        and requests[0][0].count == 1
    )
    return Demand(
        requests=tuple(requests),
        grouped=tuple(grouped),
        cores=cores,
        prunable=prunable,
        simple=simple,
        classes=frozenset(classes),
    )


@dataclass(frozen=True, slots=True)
class AlternativeBounds:
    """One alternative of a request on one shape, over the device kinds it fits."""

    memory_max: int
    memory_min: int
    cores_max: int
    cores_min: int
    count: int
    whole: bool  # takes whole devices (cannot share, or asks for all the memory)
    device_memory_min: int  # the least memory one of its devices takes


@dataclass(frozen=True, slots=True)
class ShapeBounds:
    """Per node shape: what the pod can add at most / at least, the level it needs, and the
    consumption of each request alternative on each device kind (for the precheck)."""

    memory_max: int
    memory_min: int
    cores_max: int
    cores_min: int
    count_total: int
    count_max_single: int
    forced_fresh: int
    level: int
    feasible: bool
    amounts: tuple[tuple[AltAmounts, ...], ...]  # per request, per alternative
    tight: bool  # simple pod, one certain kind in the view, a fraction of a shareable device
    needs_cores: bool
    fit_need: int  # the fit level a shared device needs to certainly take a simple pod
    group_need: int  # idle devices one locality group must have (whole, grouped requests)


Usable = tuple[tuple[frozenset[int], ...], ...]
"""Per request, per alternative: the kinds of a shape (indexes into ``NodeShape.kinds``) the
alternative may use — its class selects them and no selector of it rules them out."""


def shape_bounds(
    shape: NodeShape, view: ViewShape, demand: Demand, usable: Usable, certain: bool
) -> ShapeBounds:
    """The pod's bounds on one shape. ``view``: the shape as the pod's index view sees it;
    ``certain``: every device of a usable kind is usable (no selector verdict is unknown)."""
    memory_max = memory_min = cores_max = cores_min = 0
    count_total = count_max_single = forced = 0
    min_need: int | None = None
    feasible = True
    amounts: list[tuple[AltAmounts, ...]] = []
    partial = False
    needs_cores = False
    group_need = 0
    kinds = shape.representatives
    for alternatives, grouped, usable_kinds in zip(
        demand.requests, demand.grouped, usable, strict=True
    ):
        best: list[AlternativeBounds] = []
        per_alt = []
        for alt, allowed in zip(alternatives, usable_kinds, strict=True):
            alt_amounts, bounds = _alternative(alt.requests, alt.count, allowed, kinds)
            per_alt.append(alt_amounts)
            if bounds is not None:
                best.append(bounds)
                needs_cores = needs_cores or bounds.cores_max > 0
                partial = partial or not bounds.whole
        amounts.append(tuple(per_alt))
        if not best:
            feasible = False
            continue
        memory_max += max(b.memory_max for b in best)
        memory_min += min(b.memory_min for b in best)
        cores_max += max(b.cores_max for b in best)
        cores_min += min(b.cores_min for b in best)
        count_total += max(b.count for b in best)
        count_max_single = max(count_max_single, min(b.count for b in best))
        if all(b.whole for b in best):
            forced += min(b.count for b in best)
            if grouped:
                group_need = max(group_need, min(b.count for b in best))
        need = min(b.device_memory_min for b in best)
        min_need = need if min_need is None else min(min_need, need)
    level = 0
    if min_need is not None and view.max_memory > 0:
        level = LEVELS * min_need // view.max_memory
    fit_need = _NO_FIT
    single_kind = (
        len(amounts) == 1
        and len(amounts[0]) == 1
        and view.homogeneous
        and usable[0][0] == view.kinds
    )
    if single_kind:
        single = amounts[0][0].by_kind[next(iter(view.kinds))]
        if single is not None and view.max_memory > 0 and view.max_cores > 0:
            fit_need = max(
                LEVELS * single.get(MEMORY, 0) // view.max_memory,
                LEVELS * single.get(CORES, 0) // view.max_cores,
            )
    tight = (
        demand.simple
        and certain
        and single_kind
        and _followed(shape.kinds[next(iter(view.kinds))])
        and shape.kinds[next(iter(view.kinds))].multi
        and partial
        and feasible
    )
    return ShapeBounds(
        memory_max=memory_max,
        memory_min=memory_min,
        cores_max=cores_max,
        cores_min=cores_min,
        count_total=count_total,
        count_max_single=count_max_single,
        forced_fresh=forced,
        level=level,
        feasible=feasible,
        amounts=tuple(amounts),
        tight=tight,
        needs_cores=needs_cores,
        fit_need=fit_need,
        group_need=group_need,
    )


def _alternative(
    requests: Mapping[str, Quantity],
    count: int,
    allowed: Collection[int],
    kinds: Sequence[Device],
) -> tuple[AltAmounts, AlternativeBounds | None]:
    """One request alternative on a shape's device kinds (``kinds``: one device of each):
    what one device of each allowed kind gives it (None where the kind cannot serve it), and
    its bounds (None: no kind can)."""
    by_kind = tuple(consumption(d, requests) if i in allowed else None for i, d in enumerate(kinds))
    amounts = AltAmounts(by_kind, frozenset(i for i in range(len(kinds)) if i not in allowed))
    fitting = [(d, a) for d, a in zip(kinds, by_kind, strict=True) if a is not None]
    if not fitting:
        return amounts, None
    mems = [a.get(MEMORY, 0) for _, a in fitting]
    cores = [a.get(CORES, 0) for _, a in fitting]
    whole = all(
        not d.allow_multiple_allocations or a.get(MEMORY, 0) >= capacity_units(d, MEMORY)
        for d, a in fitting
    )
    bounds = AlternativeBounds(
        memory_max=count * max(mems),
        memory_min=count * min(mems),
        cores_max=count * max(cores),
        cores_min=count * min(cores),
        count=count,
        whole=whole,
        device_memory_min=min(mems),
    )
    return amounts, bounds


def _followed(kind: DeviceKind) -> bool:
    """Whether the index's partition tells every device of the kind that can take a pod: not
    special, or special for shared counters alone (blocked devices count as in use)."""
    return not kind.special or kind.counted


def _devices_bound(
    policies: PodPolicies, total: int, partition: Partition, bounds: ShapeBounds
) -> int:
    """The most (node binpack) or least (node spread) devices the pod can newly take; ``total``
    and the partition count the view's devices only."""
    _, level, in_use, _, fit_level = partition  # unpacked once: called per partition
    fresh = total - in_use
    if bounds.tight:
        if policies.gpu == "spread":
            # The emptiest fitting GPU comes first: an idle one while there is one.
            return 1 if fresh > 0 else 0
        if policies.gpu == "binpack":
            # The fullest fitting GPU comes first: a shared one when one certainly fits,
            # an idle one when no shared one has the memory.
            if fit_level > bounds.fit_need or (not bounds.needs_cores and level > bounds.level):
                return 0
            if level < bounds.level:
                return 1 if fresh > 0 else 0
    if policies.node == "binpack":
        return min(bounds.count_total, fresh)
    return max(bounds.forced_fresh, bounds.count_max_single - in_use, 0)


def bound_amounts(
    policies: PodPolicies, view: ViewShape, partition: Partition, bounds: ShapeBounds
) -> NodeAmounts:
    """The optimistic amounts the pod adds to any node of ``partition``."""
    binpack = policies.node == "binpack"
    return NodeAmounts(
        devices=_devices_bound(policies, view.devices, partition, bounds),
        memory=bounds.memory_max if binpack else bounds.memory_min,
        cores=bounds.cores_max if binpack else bounds.cores_min,
    )


def partition_amounts(
    policies: PodPolicies, view: ViewShape, partition: Partition, bounds: ShapeBounds
) -> NodeAmounts | None:
    """:func:`bound_amounts` for a partition that can hold the pod; None where it cannot (no
    device takes the smallest share, fewer idle devices than whole ones wanted, not enough
    idle ones side by side)."""
    _, level, in_use, group_fresh, _ = partition
    idle = view.devices - in_use
    if (
        not bounds.feasible
        or (idle == 0 and level < bounds.level)
        or idle < bounds.forced_fresh
        or group_fresh < bounds.group_need
    ):
        return None
    return bound_amounts(policies, view, partition, bounds)


_AMOUNTS_MEMO: Final = 256  # pod kinds whose partition amounts are kept
_amounts_memo: dict[tuple[object, ...], dict[Partition, NodeAmounts | None]] = {}


def amounts_memo(
    policies: PodPolicies, view: ViewShape, bounds: ShapeBounds
) -> dict[Partition, NodeAmounts | None]:
    """Where :func:`partition_amounts` is kept per partition, across decisions, for pods with
    these policies and these bounds on this view shape: keyed by all it reads (pods of one
    kind come in streams, and every decision asks for every partition). The caller fills it."""
    key = (
        policies.node,
        policies.gpu,
        view,
        bounds.memory_max,
        bounds.memory_min,
        bounds.cores_max,
        bounds.cores_min,
        bounds.count_total,
        bounds.count_max_single,
        bounds.forced_fresh,
        bounds.level,
        bounds.feasible,
        bounds.tight,
        bounds.needs_cores,
        bounds.fit_need,
        bounds.group_need,
    )
    found = _amounts_memo.get(key)
    if found is None:
        if len(_amounts_memo) >= _AMOUNTS_MEMO:
            _amounts_memo.clear()
        found = _amounts_memo[key] = {}
    return found


def precheck(state: NodeState, demand: Demand, bounds: ShapeBounds) -> str | None:
    """A necessary condition from the index: each request has enough devices with room.
    Returns the kube-style reason when it fails."""
    for alternatives, per_alt, grouped in zip(
        demand.requests, bounds.amounts, demand.grouped, strict=True
    ):
        ok = False
        reason = REASON_FREE_GPUS
        for alt, alt_amounts in zip(alternatives, per_alt, strict=True):
            by_kind, excluded = alt_amounts.by_kind, alt_amounts.excluded
            hosts = 0
            groups: dict[object, int] = {}
            memory_short = cores_short = False
            candidates = False
            for device in state.devices:
                if device.kind in excluded:
                    continue  # not a device this request can have: no shortage either
                candidates = True
                amounts = by_kind[device.kind]
                if amounts is None:
                    memory_short = memory_short or MEMORY in alt.requests
                    cores_short = cores_short or MEMORY not in alt.requests
                    continue
                if not device.shareable:
                    if device.in_use:
                        continue
                elif amounts.get(MEMORY, 0) > device.free_memory:
                    memory_short = True
                    continue
                elif amounts.get(CORES, 0) > device.free_cores:
                    cores_short = True
                    continue
                hosts += 1
                if grouped is not None:
                    value = device.device.attributes.get(grouped)
                    if value is not None:
                        groups[value] = groups.get(value, 0) + 1
            if hosts >= alt.count:
                if grouped is None or max(groups.values(), default=0) >= alt.count:
                    ok = True
                    break
                reason = REASON_CLAIMS  # enough devices, but not side by side
                continue
            if not candidates:
                reason = REASON_CLAIMS  # no device of its class (or selectors) here at all
                continue
            whole = alt.requests.get(MEMORY) is None and all(
                d.shareable for d in state.devices if d.kind not in excluded
            )
            if hosts == 0 and memory_short and not whole:
                reason = REASON_GPU_MEMORY
            elif hosts == 0 and cores_short:
                reason = REASON_GPU_CORES
        if not ok:
            return reason
    return None

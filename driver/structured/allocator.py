"""Structured-parameter allocation with upstream semantics, as a pure function of a snapshot.

``allocate(snapshot, claims, node)`` returns one :class:`~driver.api.claims.AllocationResult` per
claim (in claim order) when all claims fit on ``node`` together, ``None`` when they do not,
raises :class:`~driver.api.errors.NodeAllocationError` when they do not and the node has an
invalid pool (upstream's ``ErrFailedAllocationOnNode``, "invalid resource pools were
encountered": an unschedulable node with that message, not a fatal error), and raises
:class:`~driver.api.errors.AllocationError` for fatal errors: an unknown class ("could not
retrieve device class ..."), a CEL compile or runtime error, ``All`` mode on an incomplete or
invalid pool, more than 32 devices in a claim, admin access where the caller forbids it, or an
exhausted search budget. It never
mutates its inputs; the same inputs always give the same output (``shareID`` is a UUIDv5 of
claim UID, request and result index).

Semantics follow kube-scheduler's structured allocator (k8s.io/dynamic-resource-allocation,
``structured``): claims in order, requests in order, ``firstAvailable`` subrequests in order
(the first one that leads to a complete solution wins); for each device a depth-first search
over *combinations* in candidate order, with these checks per candidate, in order:

1. in use (by another claim, or earlier in this attempt; admin access ignores other claims'
   use but not its own claim's);
2. class selectors, then request selectors (CEL), then per-device node selection;
3. consumable capacity (request policy rounding and validation, remaining capacity);
4. shared counters (skipped for a multi-allocation device that already has a share);
5. taints against the request's tolerations (``NoSchedule`` / ``NoExecute`` block);
6. claim constraints (``matchAttribute`` / ``distinctAttribute``).

(``All`` mode fixes its devices up front from checks 2 and 3 against other claims' use, then
places them in order with checks 1, 4, 5, 6 and 3 again; any failure means no solution, and a
constraint violation there is an error, as upstream.)

Device order: ``order=None`` is upstream first-fit (pools by driver then name, pools with
binding conditions last, slices by name, devices in slice order). A :data:`DeviceOrder`
callback is called each time a request starts placing devices, with the node's candidates
that pass check 2 (in first-fit order) and an :class:`OrderContext`; it returns them in the
order to try. What the allocator guarantees:

* only the order of the search changes, never feasibility: the search is exhaustive over the
  same candidates, so (within the budget) claims fit with a callback exactly when they fit
  without one, and every result passes every check above whatever the callback returns;
* a callback that drops, adds or repeats candidates is an AllocationError;
* within one request devices are still tried as combinations, in the callback's order (the
  k-th device is taken from after the (k-1)-th in that order).

With a callback, selectors are evaluated for every candidate of the node before the search
(first-fit evaluates them lazily, as upstream), so a CEL runtime error on any visible device is
reported even where first-fit would have stopped before reaching it.

Cost: every call counts its ``allocateOne``-like steps in :class:`SearchStats` and stops with
an AllocationError after ``budget`` steps.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from driver.api.claims import (
    ALLOCATION_RESULTS_MAX_SIZE,
    AllocationConfig,
    AllocationResult,
    ConfigSource,
    DeviceClass,
    DeviceRequest,
    DeviceResult,
    OpaqueConfig,
    ResourceClaim,
    SubRequest,
    Toleration,
)
from driver.api.errors import (
    AllocationError,
    CELCompileError,
    CELEvaluationError,
    NodeAllocationError,
)
from driver.api.ids import DeviceID
from driver.api.model import JSON, AttributeValue, Version
from driver.api.nodes import Node, node_local_selector
from driver.api.quantity import Format, Quantity
from driver.api.records import builder
from driver.cel.engine import Selector, compile_selector
from driver.structured.snapshot import (
    AllocatedState,
    Candidate,
    CapacitySpec,
    ClusterSnapshot,
    NodeCandidates,
    PoolUsage,
    PoolView,
)

__all__ = [
    "DEFAULT_SEARCH_BUDGET",
    "SHARE_ID_NAMESPACE",
    "Candidate",
    "DeviceOrder",
    "OrderContext",
    "SearchStats",
    "allocate",
    "make_share_id",
]

#: Steps (allocateOne invocations) one ``allocate`` call may take before it gives up. A
#: simple claim takes a handful; a pathological one (many devices, constraints that fail
#: late) could take exponentially many.
DEFAULT_SEARCH_BUDGET: Final = 100_000

#: Namespace of the deterministic shareIDs (uuid5 of "<claim uid>/<request>/<result index>").
SHARE_ID_NAMESPACE: Final = uuid.UUID("6d1f3c52-8a0e-5b7a-9f43-2c1b0e5d7a91")
_SHARE_ID_PREFIX: Final = SHARE_ID_NAMESPACE.bytes


#: Each result of a successful search is built without the frozen ``__init__``
#: (:mod:`driver.api.records`): a DeviceResult has ten fields.
_new_device_result: Final = builder(DeviceResult)
_new_allocation_result: Final = builder(AllocationResult)


def make_share_id(name: str) -> str:
    """``str(uuid.uuid5(SHARE_ID_NAMESPACE, name))``, without building a ``UUID`` (RFC 4122:
    SHA-1 of namespace and name, version 5 in the high nibble of byte 6, variant ``10`` in the
    top bits of byte 8), in less than half the time."""
    sha1 = hashlib.sha1(_SHARE_ID_PREFIX + name.encode(), usedforsecurity=False)
    digest = bytearray(sha1.digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    x = digest.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


@dataclass(frozen=True, slots=True)
class OrderContext:
    """What a :data:`DeviceOrder` callback knows about the request being placed.

    ``pending`` holds what this attempt already placed, per device: the consumed capacity
    (nano-units) of each share of a multi-allocation device summed, or an empty mapping for a
    device taken whole. ``allocated`` is what other claims hold.
    """

    node: Node
    claim: ResourceClaim
    request: str
    count: int
    capacity_requests: Mapping[str, Quantity]
    admin_access: bool
    allocated: AllocatedState
    pending: Mapping[DeviceID, Mapping[str, int]]


DeviceOrder = Callable[[Sequence[Candidate], OrderContext], Sequence[Candidate]]
"""Reorders a request's selectable candidates (must return a permutation of its input)."""


@dataclass(slots=True)
class SearchStats:
    """Counters one or more ``allocate`` calls add to (pass the same object to accumulate).

    ``steps`` counts ``allocateOne``-like invocations (upstream's
    ``numAllocateOneInvocations``). When a call finds no solution, the invalid and incomplete
    pools it had to skip on that node are appended (``driver/pool``), so callers can say
    "invalid resource pools were encountered" as upstream does.
    """

    steps: int = 0
    calls: int = 0
    invalid_pools: list[str] = field(default_factory=list)
    incomplete_pools: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- compiled requests

#: A node keeps selector verdicts for at most this many distinct selector sets.
MAX_CACHED_SELECTOR_SETS: Final = 256


def _compile(expression: str, where: str) -> Selector:
    try:
        return compile_selector(expression)
    except CELCompileError as exc:
        raise AllocationError(f"{where}: CEL compile error: {exc}") from exc


class _Req:
    """One request or subrequest, validated and compiled for one allocate call."""

    __slots__ = (
        "admin",
        "all_devices",
        "base_name",
        "cap_requests",
        "capacity_requests",
        "claim_index",
        "class_verdicts",
        "count",
        "device_class",
        "mode",
        "name",
        "selector_key",
        "selectors",
        "sub_name",
        "tolerations",
        "verdicts",
    )

    def __init__(
        self,
        claim: ResourceClaim,
        claim_index: int,
        request: DeviceRequest,
        sub: SubRequest | None,
        classes: Mapping[str, DeviceClass],
    ) -> None:
        spec = sub if sub is not None else request.exactly
        assert spec is not None
        self.claim_index = claim_index
        self.base_name = request.name
        self.sub_name = sub.name if sub is not None else ""
        self.name = f"{request.name}/{sub.name}" if sub is not None else request.name
        where = f"claim {claim.key}, request {self.name}"
        device_class = classes.get(spec.device_class_name)
        if device_class is None:
            # Upstream's wording (allocator_incubating.go), with the lister's NotFound text.
            raise AllocationError(
                f"{where}: could not retrieve device class {spec.device_class_name}: "
                f'deviceclass.resource.k8s.io "{spec.device_class_name}" not found'
            )
        self.device_class = device_class
        selectors: list[tuple[Selector, str]] = [
            (_compile(e, f"class {device_class.name}: selector #{i}"), f"class {device_class.name}")
            for i, e in enumerate(device_class.selectors)
        ]
        selectors += [
            (_compile(e, f"{where}: selector #{i}"), f"claim {claim.key}")
            for i, e in enumerate(spec.selectors)
        ]
        self.selectors = tuple(selectors)
        # Class selectors, a separator no expression can equal, then request selectors.
        self.selector_key = (*device_class.selectors, "", *spec.selectors)
        self.verdicts: list[bool | None] = []
        # The node's verdicts of the class selectors alone, when the request has selectors of
        # its own and they are known (seeded by the caller or left by a request without
        # selectors): a device they answered need not run them again.
        self.class_verdicts: list[bool | None] | None = None
        self.mode = spec.allocation_mode
        self.count = spec.count
        self.admin = spec.admin_access
        self.tolerations: tuple[Toleration, ...] = spec.tolerations
        self.capacity_requests: Mapping[str, Quantity] = spec.capacity_requests
        self.cap_requests: dict[str, tuple[int, Format]] = {
            k: (v.nanos, v.format) for k, v in spec.capacity_requests.items()
        }
        self.all_devices: list[Candidate] = []


class _Entry:
    """One request of a claim: either a plain request or its subrequests."""

    __slots__ = ("request", "selected", "subs")

    def __init__(self, request: DeviceRequest, subs: list[_Req]) -> None:
        self.request = request
        self.subs = subs
        self.selected = 0


class _Placed:
    __slots__ = ("cand", "consumed", "counters", "marked", "req", "shared")

    def __init__(
        self,
        req: _Req,
        cand: Candidate,
        consumed: dict[str, tuple[int, Format]] | None,
    ) -> None:
        self.req = req
        self.cand = cand
        self.consumed = consumed
        self.counters = False
        self.marked = False
        self.shared = False


_EMPTY: Final[Mapping[str, int]] = {}


class _BudgetExhaustedError(Exception):
    pass


class _MaxSizeExceededError(Exception):
    """Upstream's errAllocationResultMaxSizeExceeded: more aggressive backtracking."""


# --------------------------------------------------------------------------- capacity


def _consume(spec: CapacitySpec, requested: tuple[int, Format] | None) -> tuple[int, Format]:
    """Upstream ``calculateConsumedCapacity``: the amount a request consumes of a capacity."""
    if requested is None:
        if spec.default is not None:
            return spec.default, spec.default_fmt
        return spec.value, spec.fmt
    if not spec.has_policy:
        return requested
    value = requested[0]
    if spec.range_min is not None:
        if value < spec.range_min:
            return spec.range_min, spec.range_min_fmt
        if spec.range_step is None or spec.range_step <= 0:
            return requested
        steps = -((spec.range_min - value) // spec.range_step)
        return spec.range_min + steps * spec.range_step, "BinarySI"
    for valid, fmt in zip(spec.valid_values, spec.valid_value_fmts, strict=True):
        if value <= valid:
            return valid, fmt
    return requested


def _violates(spec: CapacitySpec, value: int) -> bool:
    """Upstream ``violatesPolicy``."""
    if not spec.has_policy:
        return False
    if spec.default is not None and value == spec.default:
        return False
    if spec.range_min is not None:
        if spec.range_max is not None and value > spec.range_max:
            return True
        if spec.range_step is not None and spec.range_step > 0:
            return (value - spec.range_min) % spec.range_step != 0
        return False
    if spec.valid_values:
        return value not in spec.valid_values
    return False


# --------------------------------------------------------------------------- constraints


def _lookup(cand: Candidate, name: str) -> AttributeValue | None:
    attrs = cand.device.attributes
    found = attrs.get(name)
    if found is not None:
        return found
    domain, _, ident = name.partition("/")
    if domain != cand.device_id.driver or not ident:
        return None
    return attrs.get(ident)


def _as_set(value: AttributeValue) -> tuple[str, frozenset[object]]:
    """An attribute as (type, set of values): scalars are one-element sets."""
    items: tuple[object, ...] = value if isinstance(value, tuple) else (value,)
    first = items[0] if items else None
    kind = (
        "bool"
        if isinstance(first, bool)
        else "int"
        if isinstance(first, int)
        else "version"
        if isinstance(first, Version)
        else "string"
    )
    return kind, frozenset(v.text if isinstance(v, Version) else v for v in items)


class _Constraint:
    __slots__ = ("attribute", "distinct", "requests", "stack")

    def __init__(self, requests: tuple[str, ...], attribute: str, distinct: bool) -> None:
        self.requests = frozenset(requests)
        self.attribute = attribute
        self.distinct = distinct
        self.stack: list[tuple[str, frozenset[object]]] = []

    def applies(self, req: _Req) -> bool:
        if not self.requests:
            return True
        return req.base_name in self.requests or (bool(req.sub_name) and req.name in self.requests)

    def add(self, req: _Req, cand: Candidate) -> bool:
        """Try to add a device; True when the constraint still holds (and it was recorded)."""
        value = _lookup(cand, self.attribute)
        if value is None:
            return False
        kind, values = _as_set(value)
        if self.distinct:
            for other_kind, other in self.stack:
                if other_kind == kind and not values.isdisjoint(other):
                    return False
            self.stack.append((kind, values))
            return True
        if self.stack:
            current_kind, current = self.stack[-1]
            if current_kind != kind:
                return False
            values = current & values
            if not values:
                return False
        self.stack.append((kind, values))
        return True

    def remove(self) -> None:
        self.stack.pop()


# --------------------------------------------------------------------------- the search


class _Search:
    """State of one allocate call (upstream's ``allocator``)."""

    def __init__(
        self,
        *,
        snapshot: ClusterSnapshot,
        claims: Sequence[ResourceClaim],
        node: Node,
        nc: NodeCandidates,
        order: DeviceOrder | None,
        budget: int,
        admin_namespaces: Container[str] | None,
    ) -> None:
        self.snapshot = snapshot
        self.allocated = snapshot.allocated
        self.claims = claims
        self.node = node
        self.nc = nc
        self.order = order
        self.budget = budget
        self.steps = 0
        self.match_cache = snapshot.match_cache
        self.usage: dict[PoolView, PoolUsage] = {}
        # Devices taken whole in this attempt -> the claims (indices) taking them.
        self.allocating: dict[Candidate, set[int]] = {}
        # Shares placed in this attempt on multi-allocation devices: capacity consumed, count.
        self.allocating_capacity: dict[Candidate, dict[str, int]] = {}
        self.allocating_shares: dict[Candidate, int] = {}
        self.consumed_counters: dict[PoolView, dict[str, dict[str, int]]] = {}
        self.results: list[list[_Placed]] = [[] for _ in claims]
        self.ordered: dict[tuple[int, int, int], Sequence[Candidate]] = {}
        self.entries: list[list[_Entry]] = []
        self.constraints: list[list[_Constraint]] = []
        for ci, claim in enumerate(claims):
            self._prepare_claim(ci, claim, admin_namespaces)

    # ------------------------------------------------------------------ preparation
    def _prepare_claim(
        self, ci: int, claim: ResourceClaim, admin_namespaces: Container[str] | None
    ) -> None:
        classes = self.snapshot.classes
        entries: list[_Entry] = []
        min_devices = 0
        for request in claim.requests:
            if request.exactly is not None:
                if (
                    request.exactly.admin_access
                    and admin_namespaces is not None
                    and claim.namespace not in admin_namespaces
                ):
                    raise AllocationError(
                        f"claim {claim.key}, request {request.name}: admin access is requested, "
                        f"but namespace {claim.namespace} is not labelled "
                        "resource.kubernetes.io/admin-access=true"
                    )
                req = _Req(claim, ci, request, None, classes)
                self._attach_verdicts(req)
                self._validate(req, claim)
                entries.append(_Entry(request, [req]))
                min_devices += req.count
            else:
                subs = [_Req(claim, ci, request, s, classes) for s in request.first_available]
                for sub in subs:
                    self._attach_verdicts(sub)
                    self._validate(sub, claim)
                entries.append(_Entry(request, subs))
                min_devices += min(s.count for s in subs)
        if min_devices > ALLOCATION_RESULTS_MAX_SIZE:
            raise AllocationError(
                f"claim {claim.key}: number of requested devices {min_devices} exceeds the "
                f"claim limit of {ALLOCATION_RESULTS_MAX_SIZE}"
            )
        self.entries.append(entries)
        self.constraints.append(
            [
                _Constraint(
                    c.requests,
                    c.match_attribute or c.distinct_attribute or "",
                    c.distinct_attribute is not None,
                )
                for c in claim.constraints
            ]
        )

    def _attach_verdicts(self, req: _Req) -> None:
        req.verdicts = self._verdicts(req.selector_key)
        n_class = len(req.device_class.selectors)
        if len(req.selectors) > n_class:
            req.class_verdicts = self.nc.verdicts.get(req.selector_key[: n_class + 1])

    def _verdicts(self, key: tuple[str, ...]) -> list[bool | None]:
        """The node's cached selector verdicts for one selector set (None = not evaluated)."""
        cache = self.nc.verdicts
        verdicts = cache.get(key)
        if verdicts is None:
            if len(cache) >= MAX_CACHED_SELECTOR_SETS:
                cache.clear()
                self.nc.selected.clear()
            verdicts = [None] * len(self.nc.devices)
            cache[key] = verdicts
        return verdicts

    def _validate(self, req: _Req, claim: ResourceClaim) -> None:
        """Upstream ``validateDeviceRequest``: for All mode, find out how much "all" is."""
        if req.mode != "All":
            return
        for pool in self.nc.pools:
            if pool.incomplete:
                raise AllocationError(
                    f"claim {claim.key}, request {req.name}: asks for all devices, but resource "
                    f"pool {pool} is currently being updated"
                )
            if pool.invalid:
                raise AllocationError(
                    f"claim {claim.key}, request {req.name}: asks for all devices, but resource "
                    f"pool {pool} is currently invalid ({pool.invalid_reason})"
                )
        for cand in self.nc.devices:
            if self._selectable(req, cand) and self._capacity(req, cand) is not None:
                req.all_devices.append(cand)
        req.count = len(req.all_devices)

    # ------------------------------------------------------------------ checks
    def _pool_usage(self, pool: PoolView) -> PoolUsage:
        usage = self.usage.get(pool)
        if usage is None:
            usage = self.allocated.pool(pool.driver, pool.name)
            self.usage[pool] = usage
        return usage

    def _in_use(self, req: _Req, cand: Candidate) -> bool:
        if req.admin:
            claims = self.allocating.get(cand)
            return claims is not None and req.claim_index in claims
        if self.allocating.get(cand):
            return True
        return cand.device_id.device in self._pool_usage(cand.pool).exclusive

    def _selectable(self, req: _Req, cand: Candidate) -> bool:
        verdicts = req.verdicts
        verdict = verdicts[cand.index]
        if verdict is None:
            verdict = self._evaluate(req, cand)
            verdicts[cand.index] = verdict
        return verdict

    def _evaluate(self, req: _Req, cand: Candidate) -> bool:
        cache = self.match_cache
        device = cand.device
        start = 0
        if req.class_verdicts is not None:
            known = req.class_verdicts[cand.index]
            if known is False:
                return False  # upstream stops at the first false selector: no error after it
            if known:
                start = len(req.device_class.selectors)  # they all held on this device
        for i, (selector, owner) in enumerate(req.selectors[start:], start):
            try:
                if cache is not None:
                    ok = cache.matches(selector, cand.device_id, cand.match_generation, device)
                else:
                    ok = selector.matches(device, cand.device_id.driver)
            except CELEvaluationError as exc:
                n = i if owner.startswith("class ") else i - len(req.device_class.selectors)
                raise AllocationError(
                    f"{owner}: selector #{n} on device {cand.device_id}: CEL runtime error: {exc}"
                ) from exc
            if not ok:
                return False
        return cand.node_match

    def _capacity(self, req: _Req, cand: Candidate) -> dict[str, tuple[int, Format]] | None:
        """Upstream ``CmpRequestOverCapacity``: the consumption when the device fits."""
        requests = req.cap_requests
        capacities = cand.capacities
        if not capacities:
            return None if requests else {}
        if requests:
            names = {c.name for c in capacities}
            if any(name not in names for name in requests):
                return None
        # As upstream, capacity other claims' shares consumed counts even if the device no
        # longer allows multiple allocations (it was republished): it is still in use.
        held = self._pool_usage(cand.pool).capacity.get(cand.device_id.device, _EMPTY)
        pending = self.allocating_capacity.get(cand, _EMPTY)
        consumed: dict[str, tuple[int, Format]] = {}
        for spec in capacities:
            amount = _consume(spec, requests.get(spec.name))
            if _violates(spec, amount[0]):
                return None
            if amount[0] + held.get(spec.name, 0) + pending.get(spec.name, 0) > spec.value:
                return None
            consumed[spec.name] = amount
        return consumed

    def _counters(self, cand: Candidate) -> bool:
        """Reserve the device's counters if the pool has enough (upstream
        ``checkAvailableCounters``); False (and nothing reserved) otherwise."""
        pool = cand.pool
        available = self.snapshot.available_counters(pool)
        consumed = self.consumed_counters.setdefault(pool, {})
        for set_name, counter, nanos in cand.consumes:
            per_set = consumed.setdefault(set_name, {})
            per_set[counter] = per_set.get(counter, 0) + nanos
        for set_name, counters in available.items():
            used = consumed.get(set_name)
            if not used:
                continue
            for counter, left in counters.items():
                if used.get(counter, 0) > left:
                    self._release_counters(cand)
                    return False
        return True

    def _release_counters(self, cand: Candidate) -> None:
        consumed = self.consumed_counters[cand.pool]
        for set_name, counter, nanos in cand.consumes:
            consumed[set_name][counter] -= nanos

    def _tolerated(self, req: _Req, cand: Candidate) -> bool:
        for taint in cand.blocking_taints:
            if not any(t.tolerates(taint) for t in req.tolerations):
                return False
        return True

    # ------------------------------------------------------------------ place / undo
    def _place(
        self,
        req: _Req,
        cand: Candidate,
        consumed: dict[str, tuple[int, Format]] | None,
        must: bool,
    ) -> _Placed | None:
        """Upstream ``allocateDevice``: in use, counters, taints, constraints, capacity, then
        record. ``consumed`` is the capacity check's answer when the caller already made it
        (the ExactCount search does, as upstream's ``allocateOne``); for ``All`` mode it is
        checked here, after the constraints, so a constraint violation is reported first."""
        ci = req.claim_index
        multi = cand.multi
        if not multi and req.admin:
            claims = self.allocating.get(cand)
            if claims is not None and ci in claims:
                return None
        if not req.admin and self._in_use(req, cand):
            return None
        placed = _Placed(req, cand, None)
        if cand.consumes:
            device = cand.device_id.device
            # Upstream skips the counter check for a multi-allocation device whose capacity
            # is already in use (by other claims or earlier in this attempt): its counters
            # were taken by the first share.
            skip = multi and (
                device in self._pool_usage(cand.pool).capacity or cand in self.allocating_capacity
            )
            if not skip:
                if not self._counters(cand):
                    return None
                placed.counters = True
        if cand.blocking_taints and not self._tolerated(req, cand):
            self._undo(placed, 0)
            return None
        constraints = self.constraints[ci]
        added = 0
        for constraint in constraints:
            if constraint.applies(req):
                if not constraint.add(req, cand):
                    self._undo(placed, added)
                    if must:
                        raise AllocationError(
                            f"claim {self.claims[ci].key}, request {req.name}: cannot add device "
                            f"{cand.device_id} because a claim constraint would not be satisfied"
                        )
                    return None
                added += 1
        if consumed is None:
            consumed = self._capacity(req, cand)
            if consumed is None:
                self._undo(placed, added)
                return None
        if multi:
            placed.consumed = consumed
        if not multi:
            self.allocating.setdefault(cand, set()).add(ci)
            placed.marked = True
        else:
            pending = self.allocating_capacity.setdefault(cand, {})
            for name, (nanos, _fmt) in consumed.items():
                pending[name] = pending.get(name, 0) + nanos
            self.allocating_shares[cand] = self.allocating_shares.get(cand, 0) + 1
            placed.shared = True
        self.results[ci].append(placed)
        return placed

    def _undo(self, placed: _Placed, constraints_added: int | None = None) -> None:
        req, cand = placed.req, placed.cand
        ci = req.claim_index
        if constraints_added is None:
            # A fully placed device: drop its result and every constraint it joined.
            self.results[ci].pop()
            constraints_added = sum(1 for c in self.constraints[ci] if c.applies(req))
        if placed.shared:
            pending = self.allocating_capacity[cand]
            for name, (nanos, _fmt) in (placed.consumed or {}).items():
                pending[name] -= nanos
            count = self.allocating_shares[cand] - 1
            if count:
                self.allocating_shares[cand] = count
            else:
                del self.allocating_shares[cand]
                del self.allocating_capacity[cand]
        if placed.marked:
            self.allocating[cand].discard(ci)
        if constraints_added:
            applied = [c for c in self.constraints[ci] if c.applies(req)]
            for constraint in reversed(applied[:constraints_added]):
                constraint.remove()
        if placed.counters:
            self._release_counters(cand)

    # ------------------------------------------------------------------ allocateOne
    def run(self) -> bool:
        return self._one(0, 0, 0, 0, False, 0)

    def _candidates_for(self, req: _Req, key: tuple[int, int, int]) -> Sequence[Candidate]:
        if self.order is None:
            return self.nc.devices
        selectable = self.nc.selected.get(req.selector_key)
        if selectable is None:
            # Every verdict of the set is known afterwards (or a CEL error was raised): the
            # filtered list is the same for every later request with these selectors.
            selectable = tuple(c for c in self.nc.devices if self._selectable(req, c))
            self.nc.selected[req.selector_key] = selectable
        pending: dict[DeviceID, Mapping[str, int]] = {}
        for cand in self.allocating:
            if self.allocating[cand]:
                pending[cand.device_id] = {}
        for cand, consumed in self.allocating_capacity.items():
            pending[cand.device_id] = dict(consumed)
        ctx = OrderContext(
            node=self.node,
            claim=self.claims[req.claim_index],
            request=req.name,
            count=req.count,
            capacity_requests=req.capacity_requests,
            admin_access=req.admin,
            allocated=self.allocated,
            pending=pending,
        )
        ordered = self.order(selectable, ctx)
        if ordered is not selectable and (
            len(ordered) != len(selectable) or set(map(id, ordered)) != set(map(id, selectable))
        ):
            raise AllocationError(
                f"device order for request {req.name} on node {self.node.name} returned "
                f"{len(ordered)} candidates that are not a permutation of the "
                f"{len(selectable)} it was given"
            )
        self.ordered[key] = ordered
        return ordered

    # The hot recursive step: positional ints mirror upstream's deviceIndices + startLocation
    # (keyword passing or a tuple per call would cost measurably here).
    def _one(  # noqa: PLR0917
        self, ci: int, ri: int, si: int, di: int, in_sub: bool, start: int
    ) -> bool:
        self.steps += 1
        if self.steps > self.budget:
            raise _BudgetExhaustedError
        if ci >= len(self.claims):
            return True
        entries = self.entries[ci]
        if ri >= len(entries):
            try:
                return self._one(ci + 1, 0, 0, 0, False, 0)
            except _MaxSizeExceededError:
                return False
        entry = entries[ri]
        if not in_sub and entry.request.exactly is None:
            all_exceeded = True
            for index in range(len(entry.subs)):
                try:
                    ok = self._one(ci, ri, index, 0, True, 0)
                except _MaxSizeExceededError:
                    continue
                all_exceeded = False
                if ok:
                    entry.selected = index
                    return True
            if all_exceeded:
                raise _MaxSizeExceededError
            return False
        req = entry.subs[si]
        doing_all = req.mode == "All"
        if doing_all and not req.all_devices:
            return False
        if di >= req.count:
            return self._one(ci, ri + 1, 0, 0, False, 0)
        if len(self.results[ci]) + req.count - di > ALLOCATION_RESULTS_MAX_SIZE:
            raise _MaxSizeExceededError
        if doing_all:
            cand = req.all_devices[di]
            placed = self._place(req, cand, None, must=True)
            if placed is None:
                return False
            try:
                ok = self._one(ci, ri, si, di + 1, in_sub, 0)
            except BaseException:
                self._undo(placed)
                raise
            if not ok:
                self._undo(placed)
            return ok

        key = (ci, ri, si)
        if di == 0:
            candidates = self._candidates_for(req, key)
        else:
            candidates = self.ordered.get(key, self.nc.devices)
        lazy = self.order is None
        for pos in range(start, len(candidates)):
            cand = candidates[pos]
            if self._in_use(req, cand):
                continue
            if lazy and not self._selectable(req, cand):
                continue
            consumed = self._capacity(req, cand)
            if consumed is None:
                continue
            placed = self._place(req, cand, consumed, must=False)
            if placed is None:
                continue
            try:
                ok = self._one(ci, ri, si, di + 1, in_sub, pos + 1)
            except BaseException:
                self._undo(placed)
                raise
            if ok:
                return True
            self._undo(placed)
        return False

    # ------------------------------------------------------------------ results
    def build_results(self) -> list[AllocationResult]:
        return [self._result(ci, claim) for ci, claim in enumerate(self.claims)]

    def _result(self, ci: int, claim: ResourceClaim) -> AllocationResult:
        devices: list[DeviceResult] = []
        owner = claim.uid or claim.key
        for index, placed in enumerate(self.results[ci]):
            req, cand = placed.req, placed.cand
            consumed: dict[str, Quantity] | None = None
            share_id: str | None = None
            if cand.multi:
                share_id = make_share_id(f"{owner}/{req.name}/{index}")
                if placed.consumed:
                    consumed = {k: Quantity(n, f) for k, (n, f) in placed.consumed.items()}
            devices.append(
                _new_device_result(
                    request=req.name,
                    driver=cand.device_id.driver,
                    pool=cand.device_id.pool,
                    device=cand.device_id.device,
                    admin_access=True if req.admin else None,
                    tolerations=req.tolerations,
                    share_id=share_id,
                    consumed_capacity=consumed,
                    binding_conditions=cand.device.binding_conditions,
                    binding_failure_conditions=cand.device.binding_failure_conditions,
                )
            )
        return _new_allocation_result(
            results=tuple(devices),
            config=self._config(ci, claim),
            node_selector=self._node_selector(ci, claim),
        )

    def _chosen(self, ci: int) -> list[tuple[DeviceRequest, _Req]]:
        return [(e.request, e.subs[e.selected]) for e in self.entries[ci]]

    def _config(self, ci: int, claim: ResourceClaim) -> tuple[AllocationConfig, ...]:
        """Upstream's config population: class configs first (each class once, listing every
        request that uses it), then claim configs that apply to a chosen (sub)request; a
        config that applies to every request gets an empty ``requests`` ("all")."""
        chosen = self._chosen(ci)
        configs: list[tuple[ConfigSource, list[str], OpaqueConfig]] = []
        class_ranges: dict[str, tuple[int, int]] = {}
        for _request, req in chosen:
            cls = req.device_class
            if cls.name in class_ranges:
                begin, end = class_ranges[cls.name]
                for i in range(begin, end):
                    configs[i][1].append(req.name)
                continue
            begin = len(configs)
            configs.extend(("FromClass", [req.name], opaque) for opaque in cls.config)
            class_ranges[cls.name] = (begin, len(configs))
        for config in claim.config:
            if not config.requests:
                configs.append(("FromClaim", [], config.opaque))
                continue
            for request, req in chosen:
                if request.name in config.requests or (
                    req.sub_name and req.name in config.requests
                ):
                    configs.append(("FromClaim", list(config.requests), config.opaque))
                    break
        out: list[AllocationConfig] = []
        for source, requests, opaque in configs:
            applies_to_all = bool(requests) and all(
                request.name in requests or (bool(req.sub_name) and req.name in requests)
                for request, req in chosen
            )
            out.append(
                AllocationConfig(
                    source=source,
                    requests=() if applies_to_all else tuple(requests),
                    opaque=opaque,
                )
            )
        return tuple(out)

    def _node_selector(self, ci: int, claim: ResourceClaim) -> JSON | None:
        fields: list[JSON] = []
        expressions: list[JSON] = []
        for placed in self.results[ci]:
            cand = placed.cand
            if cand.node_local:
                return node_local_selector(self.node.name)
            selector = cand.node_selector
            if selector is None:
                continue
            terms = selector.get("nodeSelectorTerms") or []
            if len(terms) > 1:
                raise AllocationError(
                    f"claim {claim.key}: create NodeSelector: unsupported ResourceSlice "
                    f"nodeSelector with {len(terms)} terms"
                )
            if not terms:
                continue
            for requirement in terms[0].get("matchFields") or ():
                if requirement not in fields:
                    fields.append(requirement)
            for requirement in terms[0].get("matchExpressions") or ():
                if requirement not in expressions:
                    expressions.append(requirement)
        if not fields and not expressions:
            return None
        term: JSON = {}
        if expressions:
            term["matchExpressions"] = [dict(r) for r in expressions]
        if fields:
            term["matchFields"] = [dict(r) for r in fields]
        return {"nodeSelectorTerms": [term]}


def allocate(
    snapshot: ClusterSnapshot,
    claims: Sequence[ResourceClaim],
    node: Node,
    *,
    order: DeviceOrder | None = None,
    budget: int = DEFAULT_SEARCH_BUDGET,
    stats: SearchStats | None = None,
    admin_namespaces: Container[str] | None = None,
) -> list[AllocationResult] | None:
    """Allocate ``claims`` together on ``node``; see the module docstring for the contract.

    ``admin_namespaces``: namespaces labelled ``resource.kubernetes.io/admin-access=true``;
    ``None`` means the caller has already checked (admin access is allowed everywhere).
    """
    nc = snapshot.candidates(node)
    search = _Search(
        snapshot=snapshot,
        claims=claims,
        node=node,
        nc=nc,
        order=order,
        budget=budget,
        admin_namespaces=admin_namespaces,
    )
    try:
        done = search.run()
    except _BudgetExhaustedError:
        raise AllocationError(
            f"node {node.name}: allocation search gave up after {budget} steps for claims "
            f"{', '.join(c.key for c in claims)} (too many combinations of devices and "
            "constraints)"
        ) from None
    except _MaxSizeExceededError:
        done = False
    finally:
        if stats is not None:
            stats.steps += search.steps
            stats.calls += 1
    if not done:
        invalid = [p for p in nc.pools if p.invalid]
        if stats is not None:
            stats.invalid_pools.extend(str(p) for p in invalid)
            stats.incomplete_pools.extend(str(p) for p in nc.pools if p.incomplete)
        if invalid:
            # Upstream: no solution and an invalid pool seen -> an error for this node only
            # (ErrFailedAllocationOnNode), not "does not fit".
            raise NodeAllocationError(
                "invalid resource pools were encountered: "
                + ", ".join(f"{p} ({p.invalid_reason})" for p in invalid)
            )
        return None
    return search.build_results()

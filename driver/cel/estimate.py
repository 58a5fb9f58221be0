"""Upstream's static cost estimate of a checked CEL expression: cel-go's ``checker.Cost``
(``checker/cost.go``) with Kubernetes' ``library.CostEstimator`` (``apiserver/pkg/cel/library/
cost.go``), the cost estimators of cel-go's lists (version 3) and sets extensions, and DRA's
size estimator and ``includes`` estimator (``dynamic-resource-allocation/cel/compile.go``).

What the API server computes when a selector is written, node by node as cel-go does:

* a constant costs 0, an identifier or a field selection 1 (a presence test ``has()`` 0), a list
  literal 10, a map literal 30, a message 40, a call 1 plus its arguments unless the function
  has its own estimate (size-dependent: 0.1 per character walked, string x pattern for regular
  expressions, ...); ``&&`` / ``||`` cost their left operand at least and both at most, a
  conditional its condition and the dearer branch; a comprehension its range, its accumulator's
  start and result, and the range's size times one iteration (condition + step).
* Sizes (of strings, bytes, lists, maps) come from literals, from how functions grow them,
  and, for data the expression reads, from a *size estimator* keyed by the path from the
  variable (``device.attributes.@values.<id>``): DRA's gives the API's bounds (a driver name
  63 characters, at most 32 domains and 32 attributes each, a domain name 63 and an id 32
  characters, an attribute value 64 characters or elements); anything else is unbounded
  (``UNBOUNDED`` = 2^64 - 1), and costs saturate there, as upstream's do.

``device`` is four variables here (``device.driver`` ...), which upstream reads as an identifier
and a field selection: each costs 2 and has upstream's path. :func:`estimate` also computes a
second figure, the *work* estimate, which charges list concatenation and
``cel.@mapInsert`` by the size of what they copy (cel-cpp copies lists and the runtime helper
copies maps where cel-go shares them); the engine meters an evaluation whenever either figure
could pass the limit. Pure module.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from driver.cel import checked

UNBOUNDED: Final = 2**64 - 1  # math.MaxUint64: upstream's "no bound"
STRING_TRAVERSAL_FACTOR: Final = 0.1  # cel-go common.StringTraversalCostFactor
REGEX_LENGTH_FACTOR: Final = 0.25  # cel-go common.RegexStringLengthCostFactor
LIST_CREATE_COST: Final = 10
MAP_CREATE_COST: Final = 30
STRUCT_CREATE_COST: Final = 40
INCLUDES_BOUND: Final = 48  # ResourceSliceMaxAttributeValuesPerDevice
NAMED_FORMAT_REGEX_SIZE: Final = 128  # apiserver cel.MaxNameFormatRegexSize
NAMED_FORMAT_SIZE: Final = 64  # apiserver cel.MaxFormatSize

Span = tuple[int, int]  # (min, max), as cel-go's CostEstimate / SizeEstimate
UNKNOWN: Final[Span] = (0, UNBOUNDED)

# --------------------------------------------------------------------------- arithmetic


def _sat(value: int) -> int:
    return min(UNBOUNDED, value)


def add(a: Span, b: Span) -> Span:
    return _sat(a[0] + b[0]), _sat(a[1] + b[1])


def mul(a: Span, b: Span) -> Span:
    return _sat(a[0] * b[0]), _sat(a[1] * b[1])


def factor(a: Span, per_unit: float) -> Span:
    """cel-go's MultiplyByCostFactor: each bound times *per_unit*, rounded up, saturating."""
    return _scale(a[0], per_unit), _scale(a[1], per_unit)


def _scale(x: int, per_unit: float) -> int:
    value = float(x)
    if value > 0 and per_unit > 0 and value > UNBOUNDED / per_unit:
        return UNBOUNDED
    scaled = math.ceil(value * per_unit)
    return UNBOUNDED if scaled >= 2**64 else scaled


def union(a: Span, b: Span) -> Span:
    return min(a[0], b[0]), max(a[1], b[1])


def fixed(n: int) -> Span:
    return n, n


# --------------------------------------------------------------------------- types


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """The checked type of a node, as far as the estimate needs it."""

    kind: str  # bool int uint double string bytes list map struct opaque dyn ... or ""
    name: str = ""  # message or abstract type name
    params: tuple[TypeInfo, ...] = ()


_PRIMITIVE_KINDS: Final = {1: "bool", 2: "int", 3: "uint", 4: "double", 5: "string", 6: "bytes"}
_WELL_KNOWN_KINDS: Final = {1: "any", 2: "timestamp", 3: "duration"}
_SCALARS: Final = frozenset({"bool", "double", "duration", "int", "timestamp", "uint"})
_NO_TYPE: Final = TypeInfo("")


def type_info(t: Any) -> TypeInfo:
    """A ``cel.expr.Type`` as a :class:`TypeInfo`."""
    if t is None:
        return _NO_TYPE
    kind = t.WhichOneof("type_kind")
    if kind == "primitive":
        return TypeInfo(_PRIMITIVE_KINDS.get(t.primitive, ""))
    if kind == "well_known":
        return TypeInfo(_WELL_KNOWN_KINDS.get(t.well_known, ""))
    if kind == "list_type":
        return TypeInfo("list", params=(type_info(t.list_type.elem_type),))
    if kind == "map_type":
        return TypeInfo(
            "map", params=(type_info(t.map_type.key_type), type_info(t.map_type.value_type))
        )
    if kind == "message_type":
        return TypeInfo("struct", name=str(t.message_type))
    if kind == "abstract_type":
        params = tuple(type_info(p) for p in t.abstract_type.parameter_types)
        return TypeInfo("opaque", name=str(t.abstract_type.name), params=params)
    if kind == "wrapper":
        return TypeInfo(_PRIMITIVE_KINDS.get(t.wrapper, ""))
    return TypeInfo(str(kind or ""))


def _is_scalar(t: TypeInfo) -> bool:
    if t.kind in _SCALARS:
        return True
    return (
        t.kind == "opaque"
        and t.name == "optional_type"
        and bool(t.params)
        and (_is_scalar(t.params[0]))
    )


# --------------------------------------------------------------------------- size estimators

Path = tuple[str, ...]
#: Upstream's SizeEstimator.EstimateSize: the size bound of data at a path (or of a type).
SizeEstimator = Callable[[Path | None, TypeInfo], Span | None]


@dataclass(frozen=True, slots=True, eq=False)
class _Decl:
    """A node of upstream's declared device type: its MaxElements and what it contains."""

    max_elements: int
    fields: dict[str, _Decl] = field(default_factory=dict)
    key: _Decl | None = None
    elem: _Decl | None = None


_ATTRIBUTE: Final = _Decl(64)  # max(DeviceAttributeMaxValueLength, ...MaxAttributeValues...)
_DOMAIN: Final = _Decl(63)  # DeviceMaxDomainLength
_ID: Final = _Decl(32)  # DeviceMaxIDLength
_QUANTITY: Final = _Decl(0)  # apiservercel.QuantityDeclType has no MaxElements
_DEVICE: Final = _Decl(
    0,
    fields={
        "driver": _Decl(63),  # DriverNameMaxLength
        "allowMultipleAllocations": _Decl(1),
        "attributes": _Decl(32, key=_DOMAIN, elem=_Decl(32, key=_ID, elem=_ATTRIBUTE)),
        "capacity": _Decl(32, key=_DOMAIN, elem=_Decl(32, key=_ID, elem=_QUANTITY)),
    },
)


def dra_sizes(path: Path | None, _type: TypeInfo) -> Span | None:
    """DRA's size estimator: the declared bound of the device data at *path*."""
    if not path or path[0] != "device":
        return None
    node: _Decl | None = _DEVICE
    for name in path[1:]:
        assert node is not None
        if name in ("@items", "@values"):
            node = node.elem
        elif name == "@keys":
            node = node.key
        else:
            found = node.fields.get(name)
            if found is None:
                # Every attribute of a domain has the same bound, whatever its name.
                if node.elem is _ATTRIBUTE:
                    node = _ATTRIBUTE
                    continue
                return None
            node = found
        if node is None:
            return None
    return (0, node.max_elements) if node is not None else None


def library_test_sizes(_path: Path | None, t: TypeInfo) -> Span | None:
    """The size estimator of Kubernetes' library cost tests (``cost_test.go``
    testCostEstimator): any string or bytes value of unknown size is 0..12."""
    return (0, 12) if t.kind in ("string", "bytes") else None


# --------------------------------------------------------------------------- the estimate


def estimate(checked_expr: Any, sizes: SizeEstimator = dra_sizes, *, work: bool = False) -> Span:
    """Upstream's cost estimate (min, max) of the expression; with *work*, the engine's
    own work estimate (list concatenation and map inserts charged by what they copy)."""
    return _Coster(checked_expr, sizes, work).cost(checked_expr.expr)


@dataclass(slots=True)
class _Entry:
    """Sizes of a list's elements (key: 1) or a map's keys and values."""

    container: str  # "list" or "map"
    key: Span
    val: Span

    def union(self, other: _Entry | None) -> _Entry | None:
        if other is None:
            return None
        return _Entry(self.container, union(self.key, other.key), union(self.val, other.val))


@dataclass(slots=True)
class _Local:
    path: Path | None
    size: Span | None
    entry: _Entry | None


@dataclass(frozen=True, slots=True)
class _Node:
    """cel-go's AstNode: an expression with its path, type and computed size."""

    expr: Any
    path: Path | None
    type: TypeInfo
    size: Span | None


_ACCUMULATORS: Final = frozenset({"__result__", "@result"})
_STRING_COMPARISONS: Final = frozenset(
    f"{op}_{kind}"
    for op in ("less", "greater", "less_equals", "greater_equals")
    for kind in ("string", "bytes")
) | {"equals", "not_equals"}
_DEVICE_FIELDS: Final = frozenset(
    {"device.driver", "device.attributes", "device.capacity", "device.allowMultipleAllocations"}
)
_UNIT_FUNCTIONS: Final = frozenset(
    {
        "sign", "asInteger", "isInteger", "asApproximateFloat", "isGreaterThan", "isLessThan",
        "compareTo", "add", "sub", "major", "minor", "patch", "getScheme", "getHostname",
        "getHost", "getPort", "getEscapedPath", "getQuery", "masked", "prefixLength", "family",
        "isUnspecified", "isLoopback", "isLinkLocalMulticast", "isLinkLocalUnicast",
        "isGlobalUnicast", "format.named",
    }
)  # fmt: skip
_UNIT_EQUALITY: Final = frozenset(
    {"kubernetes.Quantity", "kubernetes.Semver", "net.IP", "net.CIDR"}
)
_LIST_ESTIMATED: Final = frozenset(
    {"slice", "flatten", "lists.range", "reverse", "distinct", "sort", "@sortByAssociatedKeys"}
)
_SETS: Final = {"sets.contains": 1.0, "sets.intersects": 1.0, "sets.equivalent": 2.0}


class _Coster:
    """One estimate over one checked expression (cel-go's ``coster``)."""

    def __init__(self, checked_expr: Any, sizes: SizeEstimator, work: bool) -> None:
        self.ce = checked_expr
        self.sizes = sizes
        self.work = work
        self.paths: dict[int, Path] = {}
        self.known: dict[int, Span] = {}
        self.entries: dict[int, _Entry] = {}
        self.scopes: dict[str, list[_Local]] = {}

    # ------------------------------------------------------------------ bookkeeping

    def type_of(self, e: Any) -> TypeInfo:
        return type_info(self.ce.type_map.get(e.id))

    def local(self, name: str) -> _Local | None:
        stack = self.scopes.get(name)
        return stack[-1] if stack else None

    def push(self, name: str, var: _Local) -> None:
        self.scopes.setdefault(name, []).append(var)

    def pop(self, name: str) -> None:
        self.scopes[name].pop()

    def path(self, e: Any) -> Path | None:
        if e.WhichOneof("expr_kind") == "ident_expr":
            var = self.local(e.ident_expr.name)
            if var is not None:
                return var.path
        return self.paths.get(e.id)

    def node(self, e: Any) -> _Node:
        path = self.path(e)
        if path and path[0] in _ACCUMULATORS:
            path = None  # only paths from root variables
        return _Node(e, path, self.type_of(e), self.size(e))

    def size(self, e: Any) -> Span | None:
        """cel-go's computeSize."""
        if e.id in self.known:
            return self.known[e.id]
        literal = _literal_size(e)
        if literal is not None:
            return literal
        estimated = self.sizes(self.path(e), self.type_of(e))
        if estimated is not None:
            self.known[e.id] = estimated
            return estimated
        if _is_scalar(self.type_of(e)):
            return (1, 1)
        if e.WhichOneof("expr_kind") == "ident_expr":
            var = self.local(e.ident_expr.name)
            if var is not None and var.size is not None:
                return var.size
        return None

    def size_or_unknown(self, e: Any) -> Span:
        found = self.size(e)
        return found if found is not None else UNKNOWN

    def node_size(self, n: _Node) -> Span:
        """Kubernetes' sizeEstimate / the extensions' estimateSize of an AstNode."""
        if n.size is not None:
            return n.size
        found = self.sizes(n.path, n.type)
        return found if found is not None else UNKNOWN

    @staticmethod
    def computed(n: _Node) -> Span:
        """cel-go's sizeOrUnknown of an AstNode: its computed size only."""
        return n.size if n.size is not None else UNKNOWN

    def entry(self, e: Any) -> _Entry | None:
        if e.id in self.entries:
            return self.entries[e.id]
        if e.WhichOneof("expr_kind") == "ident_expr":
            var = self.local(e.ident_expr.name)
            if var is not None:
                return var.entry
        return None

    def set_size(self, e: Any, size: Span | None) -> None:
        if size is not None:
            self.known[e.id] = size

    def set_entry(self, e: Any, entry: _Entry | None) -> None:
        if entry is not None:
            self.entries[e.id] = entry

    # ------------------------------------------------------------------ expressions

    def cost(self, e: Any) -> Span:
        kind = e.WhichOneof("expr_kind")
        if kind == "const_expr":
            return (0, 0)
        if kind == "ident_expr":
            return self.ident(e)
        if kind == "select_expr":
            return self.select(e)
        if kind == "call_expr":
            return self.call(e)
        if kind == "list_expr":
            return self.create_list(e)
        if kind == "struct_expr":
            return self.create_struct(e)
        if kind == "comprehension_expr":
            if _is_bind(e.comprehension_expr):
                return self.bind(e)
            return self.comprehension(e)
        return (0, 0)

    def ident(self, e: Any) -> Span:
        name = e.ident_expr.name
        var = self.local(name)
        if var is not None:
            if var.path is not None:
                self.paths[e.id] = var.path
            return (1, 1)
        if name in _DEVICE_FIELDS:
            # upstream: the identifier ``device`` and a field selection
            self.paths[e.id] = tuple(name.split(".", 1))
            return (2, 2)
        self.paths[e.id] = (name,)
        return (1, 1)

    def select(self, e: Any) -> Span:
        sel = e.select_expr
        if sel.test_only:
            return self.cost(sel.operand)  # PresenceTestHasCost(false): has() adds nothing
        total = self.cost(sel.operand)
        if self.type_of(sel.operand).kind in ("map", "struct", "type_param"):
            total = add(total, (1, 1))
        self.paths[e.id] = (*(self.path(sel.operand) or ()), sel.field)
        return total

    def create_list(self, e: Any) -> Span:
        total: Span = (0, 0)
        elements = list(e.list_expr.elements)
        item: Span = (0 if not elements else UNBOUNDED, 0)
        for element in elements:
            total = add(total, self.cost(element))
            item = union(item, self.size_or_unknown(element))
        self.set_entry(e, _Entry("list", (1, 1), item))
        return add(total, fixed(LIST_CREATE_COST))

    def create_struct(self, e: Any) -> Span:
        struct = e.struct_expr
        total: Span = (0, 0)
        if struct.message_name:
            for entry in struct.entries:
                total = add(total, self.cost(entry.value))
            return add(total, fixed(STRUCT_CREATE_COST))
        entries = list(struct.entries)
        key: Span = (0 if not entries else UNBOUNDED, 0)
        val: Span = key
        for entry in entries:
            total = add(total, self.cost(entry.map_key))
            total = add(total, self.cost(entry.value))
            key = union(key, self.size_or_unknown(entry.map_key))
            val = union(val, self.size_or_unknown(entry.value))
        self.set_entry(e, _Entry("map", key, val))
        return add(total, fixed(MAP_CREATE_COST))

    def comprehension(self, e: Any) -> Span:
        c = e.comprehension_expr
        total = add(self.cost(c.iter_range), self.cost(c.accu_init))
        accumulator = self.local_of(c.accu_init)
        if self.work and c.accu_init.WhichOneof("expr_kind") in ("list_expr", "struct_expr"):
            # the engine copies a list or map accumulator as it grows, up to the range's size
            count = self.size_or_unknown(c.iter_range)
            accumulator = _Local(accumulator.path, (0, count[1]), accumulator.entry)
        self.push(c.accu_var, accumulator)
        if c.iter_var2:
            self.push(c.iter_var, self.iter_var(c.iter_range, key=True))
            self.push(c.iter_var2, self.iter_var(c.iter_range, key=False))
        else:
            self.push(c.iter_var, self.iter_var(c.iter_range, key=None))
        per_iteration = add(self.cost(c.loop_condition), self.cost(c.loop_step))
        self.pop(c.iter_var)
        if c.iter_var2:
            self.pop(c.iter_var2)
        total = add(total, self.cost(c.result))
        self.pop(c.accu_var)
        count = self.size_or_unknown(c.iter_range)
        total = add(total, mul(count, per_iteration))
        init_kind = c.accu_init.WhichOneof("expr_kind")
        if init_kind == "const_expr":
            self.set_size(e, self.size(c.accu_init))
        elif init_kind in ("list_expr", "struct_expr"):
            self.set_size(e, count)
            self.set_entry(e, self.entry(c.loop_step))
        return total

    def bind(self, e: Any) -> Span:
        c = e.comprehension_expr
        total = add(self.cost(c.iter_range), self.cost(c.accu_init))  # the empty range: 10
        self.push(c.accu_var, self.local_of(c.accu_init))
        total = add(total, self.cost(c.result))
        self.pop(c.accu_var)
        self.set_size(e, self.size(c.result))
        self.set_entry(e, self.entry(c.result))
        return total

    def local_of(self, e: Any) -> _Local:
        return _Local(self.path(e), self.size(e), self.entry(e))

    def iter_var(self, rng: Any, *, key: bool | None) -> _Local:
        """The iteration variable over *rng*: an element of a list, a key of a map (*key*
        None: one variable; True / False: the first / second of two)."""
        entry = self.entry(rng)
        container = entry.container if entry is not None else self.type_of(rng).kind
        base = self.path(rng) or ()
        if key is None:
            if container == "list":
                return _Local((*base, "@items"), entry.val if entry else None, None)
            return _Local((*base, "@keys"), entry.key if entry else None, None)
        if key:
            sub = "@indices" if container == "list" else "@keys"
            return _Local((*base, sub), entry.key if entry else None, None)
        sub = "@items" if container == "list" else "@values"
        return _Local((*base, sub), entry.val if entry else None, None)

    # ------------------------------------------------------------------ calls

    def call(self, e: Any) -> Span:
        call = e.call_expr
        if call.function == "dyn" and len(call.args) == 1:
            arg = call.args[0]
            total = add((1, 1), self.cost(arg))
            self.set_size(e, self.size(arg))
            self.set_entry(e, self.entry(arg))
            return total
        args = list(call.args)
        arg_costs = []
        arg_nodes = []
        for arg in args:
            arg_costs.append(self.cost(arg))
            arg_nodes.append(self.node(arg))
        overload_ids = checked.overloads(self.ce, e)
        if not overload_ids:
            return (0, 0)
        total = (0, 0)
        target = None
        if call.HasField("target"):
            total = self.cost(call.target)
            target = self.node(call.target)
        function_cost: Span = (UNBOUNDED, 0)
        result_size: Span | None = None
        for oid in overload_ids:
            cost, size = self.function_cost(e, call.function, oid, target, arg_nodes, arg_costs)
            function_cost = union(function_cost, cost)
            if size is not None:
                result_size = size if result_size is None else union(result_size, size)
            if oid in ("index_list", "index_map") and args:
                found = self.entry(args[0])
                result_size = found.val if found is not None else None
                sub = "@items" if oid == "index_list" else "@values"
                self.paths[e.id] = (*(self.path(args[0]) or ()), sub)
            if result_size is None:
                result_size = self.size(e)
        self.set_size(e, result_size)
        return add(total, function_cost)

    def function_cost(  # noqa: PLR0917 - cel-go's functionCost, argument for argument
        self,
        e: Any,
        function: str,
        oid: str,
        target: _Node | None,
        args: list[_Node],
        arg_costs: list[Span],
    ) -> tuple[Span, Span | None]:
        arg_sum: Span = (0, 0)
        for cost in arg_costs:
            arg_sum = add(arg_sum, cost)
        found = self.extension_estimate(function, oid, target, args)
        if found is None:
            found = self.kubernetes_estimate(function, oid, target, args)
        if found is not None:
            return add(found[0], arg_sum), found[1]
        return self.builtin_estimate(e, oid, target, args, arg_costs, arg_sum)

    def extension_estimate(
        self, function: str, oid: str, target: _Node | None, args: list[_Node]
    ) -> tuple[Span, Span | None] | None:
        """cel-go's lists (version 3) and sets extensions' own estimators."""
        if function in _SETS and len(args) == 2:
            product = mul(self.node_size(args[0]), self.node_size(args[1]))
            return add(factor(product, _SETS[function]), (1, 1)), None
        if function not in _LIST_ESTIMATED or not oid.startswith("list"):
            return None
        if function == "lists.range":
            if target is not None or len(args) != 1:
                return None
            return _allocating(1.0, fixed(_int_literal(args[0], UNBOUNDED)))
        if target is None:
            if function == "@sortByAssociatedKeys" and len(args) == 2:
                return self.sort_estimate(args[1])
            return None
        size = self.node_size(target)
        if function == "slice" and len(args) == 2:
            start = _int_literal(args[0], 0)
            end = _int_literal(args[1], size[1])
            return _allocating(1.0, fixed((end - start) % 2**64))
        if function == "reverse" and not args:
            return _allocating(1.0, size)
        if function == "flatten" and len(args) <= 1:
            depth = _int_literal(args[0], UNBOUNDED) if args else 1
            return _allocating(float(depth), size)
        if function == "distinct" and not args:
            return _allocating(2.0, mul(size, size))
        if function == "sort" and not args:
            return self.sort_estimate(target)
        if function == "@sortByAssociatedKeys" and len(args) == 1:
            return self.sort_estimate(args[0])
        return None

    def sort_estimate(self, keys: _Node) -> tuple[Span, Span | None]:
        size = self.node_size(keys)
        element = keys.type.params[0].kind if keys.type.params else ""
        per = 2.0 + (STRING_TRAVERSAL_FACTOR if element in ("string", "bytes") else 0.0)
        return _allocating(per, mul(size, size))

    def kubernetes_estimate(
        self, function: str, oid: str, target: _Node | None, args: list[_Node]
    ) -> tuple[Span, Span | None] | None:
        """DRA's ``includes`` estimator, then Kubernetes' library.CostEstimator."""
        if function == "includes" and target is not None:
            return (0, INCLUDES_BOUND), None
        if function in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf"):
            if target is None:
                return None
            element = self.element_node(target)
            if element is None:  # a string target (indexOf, lastIndexOf)
                return factor(self.node_size(target), STRING_TRAVERSAL_FACTOR), None
            per: Span = (1, 1)
            if element.type.kind in ("string", "bytes"):
                per = add(per, factor(self.node_size(element), STRING_TRAVERSAL_FACTOR))
            return mul(self.node_size(target), per), None
        if function == "url" and len(args) == 1:
            size = self.node_size(args[0])
            return factor(size, STRING_TRAVERSAL_FACTOR), size
        if function in ("lowerAscii", "upperAscii", "substring", "trim") and target is not None:
            size = self.node_size(target)
            return factor(size, STRING_TRAVERSAL_FACTOR), size
        if function == "replace" and target is not None and len(args) >= 2:
            return self.replace_estimate(target, args)
        if function == "split" and target is not None:
            size = self.node_size(target)
            most = size[1]
            if len(args) > 1 and _literal_int(args[1].expr) is not None:
                most = _literal_int(args[1].expr) % 2**64  # type: ignore[operator]
            return factor(size, 2 * STRING_TRAVERSAL_FACTOR), (0, most)
        if function == "join" and target is not None:
            return self.join_estimate(target, args)
        if function in ("find", "findAll") and target is not None and args:
            size = self.node_size(target)
            text = factor(add(size, (1, 1)), STRING_TRAVERSAL_FACTOR)
            pattern = factor(self.node_size(args[0]), REGEX_LENGTH_FACTOR)
            return mul(text, pattern), (0, size[1])
        if function in ("cidr", "isIP", "isCIDR") and args:
            return factor(self.node_size(args[0]), STRING_TRAVERSAL_FACTOR), None
        if function == "ip":
            if oid == "cidr_ip":
                return (1, 1), None
            if args:
                return factor(self.node_size(args[0]), STRING_TRAVERSAL_FACTOR), None
        if function == "ip.isCanonical" and args:
            return factor(self.node_size(args[0]), 2 * STRING_TRAVERSAL_FACTOR), None
        if function in ("containsIP", "containsCIDR") and args:
            address: Span = (4, 16)
            cost = factor(add(address, address), STRING_TRAVERSAL_FACTOR)
            if function == "containsCIDR":
                cost = add(add(cost, factor(address, STRING_TRAVERSAL_FACTOR)), (1, 1))
            if oid.endswith("_string"):
                cost = add(cost, factor(self.node_size(args[0]), STRING_TRAVERSAL_FACTOR))
            return cost, None
        if function in ("quantity", "isQuantity", "semver", "isSemver") and args:
            return factor(self.node_size(args[0]), STRING_TRAVERSAL_FACTOR), None
        if function == "validate" and args:
            walked = factor(self.node_size(args[0]), STRING_TRAVERSAL_FACTOR)
            return factor(walked, NAMED_FORMAT_REGEX_SIZE * REGEX_LENGTH_FACTOR), None
        if function in _UNIT_FUNCTIONS:
            return (1, 1), None
        if function == "_==_" and len(args) == 2:
            return self.library_equality(args[0], args[1])
        return None

    def element_node(self, target: _Node) -> _Node | None:
        """Kubernetes' listElementNode: the first type parameter (a list's element, a map's
        key) with the path ``<target>.@items``; None for a string."""
        if not target.type.params:
            return None
        path = (*target.path, "@items") if target.path is not None else None
        return _Node(None, path, target.type.params[0], None)

    def replace_estimate(self, target: _Node, args: list[_Node]) -> tuple[Span, Span | None]:
        size = self.node_size(target)
        old = self.node_size(args[0])
        new = self.node_size(args[1])
        if old[0] == 0:
            count_max = size[1] + 1 if size[1] < UNBOUNDED else size[1]
            kept_max = size[1]
        elif new[1] <= old[0]:
            count_max, kept_max = 0, size[1]
        else:
            count_max, kept_max = math.ceil(size[1] / old[0]), 0
        if old[1] == 0:
            count_min = size[0] + 1 if size[0] < UNBOUNDED else size[0]
            kept_min = size[0]
        elif old[1] <= new[0]:
            count_min, kept_min = 0, size[0]
        else:
            count_min, kept_min = math.ceil(size[0] / old[1]), 0
        result = add(mul((count_min, count_max), new), (kept_min, kept_max))
        return factor(size, 2 * STRING_TRAVERSAL_FACTOR), result

    def join_estimate(self, target: _Node, args: list[_Node]) -> tuple[Span, Span | None]:
        count = self.node_size(target)
        result: Span = (0, 0)
        element = self.element_node(target)
        if element is not None:
            result = mul(count, self.node_size(element))
        if args:
            separators = (max(count[0], 1) - 1, max(count[1], 1) - 1)
            result = add(result, mul(self.node_size(args[0]), separators))
        return factor(result, STRING_TRAVERSAL_FACTOR), result

    def library_equality(self, lhs: _Node, rhs: _Node) -> tuple[Span, Span | None] | None:
        if lhs.type != rhs.type:
            return None
        name = lhs.type.name
        if name in _UNIT_EQUALITY:
            return (1, 1), None
        if name == "kubernetes.NamedFormat":
            return factor((1, NAMED_FORMAT_SIZE), STRING_TRAVERSAL_FACTOR), None
        if name == "kubernetes.URL":
            size: Span = (1, 1)
            if rhs.size is not None:  # upstream reads the right-hand size for both sides
                size = union(rhs.size, rhs.size)
            return factor((1, size[1]), STRING_TRAVERSAL_FACTOR), None
        return None

    def builtin_estimate(  # noqa: PLR0917 - cel-go's switch over its own overloads
        self,
        e: Any,
        oid: str,
        target: _Node | None,
        args: list[_Node],
        arg_costs: list[Span],
        arg_sum: Span,
    ) -> tuple[Span, Span | None]:
        if oid == "string_format" and target is not None:
            return add(factor(self.computed(target), STRING_TRAVERSAL_FACTOR), arg_sum), None
        if oid in ("string_to_bytes", "bytes_to_string", "strings_quote") and len(args) == 1:
            size = self.computed(args[0])
            cost = add(factor(size, STRING_TRAVERSAL_FACTOR), arg_sum)
            if oid == "string_to_bytes":
                return cost, (size[0], _sat(size[1] * 4))
            if oid == "bytes_to_string":
                return cost, (size[0] // 4, size[1])
            return cost, (_sat(size[0] + 2), _sat(size[1] * 2 + 2))
        if oid in ("starts_with_string", "ends_with_string") and len(args) == 1:
            return add(factor(self.computed(args[0]), STRING_TRAVERSAL_FACTOR), arg_sum), None
        if oid == "in_list" and len(args) == 2:
            return add(self.computed(args[1]), arg_sum), None
        if oid == "matches_string" and target is not None and len(args) == 1:
            text = factor(add(self.computed(target), (1, 1)), STRING_TRAVERSAL_FACTOR)
            pattern = factor(self.computed(args[0]), REGEX_LENGTH_FACTOR)
            return add(mul(text, pattern), arg_sum), None
        if oid == "contains_string" and target is not None and len(args) == 1:
            text = factor(self.computed(target), STRING_TRAVERSAL_FACTOR)
            sub = factor(self.computed(args[0]), STRING_TRAVERSAL_FACTOR)
            return add(mul(text, sub), arg_sum), None
        if oid in ("logical_or", "logical_and"):
            lhs, rhs = arg_costs[0], arg_costs[1]
            return (lhs[0], add(lhs, rhs)[1]), None
        if oid == "conditional":
            size = union(self.computed(args[1]), self.computed(args[2]))
            yes = self.entry(args[1].expr)
            no = self.entry(args[2].expr)
            self.set_entry(e, yes.union(no) if yes is not None else None)
            return add(arg_costs[0], union(arg_costs[1], arg_costs[2])), size
        if oid in ("add_string", "add_bytes", "add_list") and len(args) == 2:
            result = add(self.computed(args[0]), self.computed(args[1]))
            left = self.entry(args[0].expr)
            merged = left.union(self.entry(args[1].expr)) if left is not None else None
            self.set_entry(e, merged)
            if oid == "add_list":
                own = result if self.work else (1, 1)
                return add(own, arg_sum), result
            return add(factor(result, STRING_TRAVERSAL_FACTOR), arg_sum), result
        if oid in _STRING_COMPARISONS and len(args) == 2:
            smallest = min(self.computed(args[0])[1], self.computed(args[1])[1])
            cost = factor((1 if smallest > 0 else 0, smallest), STRING_TRAVERSAL_FACTOR)
            return add(cost, arg_sum), None
        if self.work and oid.startswith("@mapInsert") and args:
            return add(self.computed(args[0]), arg_sum), None
        return add((1, 1), arg_sum), None


def _allocating(per: float, size: Span) -> tuple[Span, Span | None]:
    """cel-go's estimateAllocatingListCall: size x per, plus the call and a new list."""
    return add(factor(size, per), fixed(1 + LIST_CREATE_COST)), size


def _is_bind(c: Any) -> bool:
    """cel.bind's comprehension: an empty range, a constant false condition, its own
    accumulator name."""
    return (
        c.iter_range.WhichOneof("expr_kind") == "list_expr"
        and not c.iter_range.list_expr.elements
        and c.loop_condition.WhichOneof("expr_kind") == "const_expr"
        and c.loop_condition.const_expr.WhichOneof("constant_kind") == "bool_value"
        and not c.loop_condition.const_expr.bool_value
        and c.accu_var not in _ACCUMULATORS
    )


def is_bind(c: Any) -> bool:
    return _is_bind(c)


def _literal_size(e: Any) -> Span | None:
    """cel-go's computeExprSize: the exact size of a literal."""
    kind = e.WhichOneof("expr_kind")
    if kind == "const_expr":
        const = e.const_expr
        which = const.WhichOneof("constant_kind")
        if which == "string_value":
            return fixed(len(const.string_value))
        if which == "bytes_value":
            return fixed(len(const.bytes_value))
        return (1, 1)
    if kind == "list_expr":
        return fixed(len(e.list_expr.elements))
    if kind == "struct_expr" and not e.struct_expr.message_name:
        return fixed(len(e.struct_expr.entries))
    return None


def _literal_int(e: Any) -> int | None:
    if e is not None and e.WhichOneof("expr_kind") == "const_expr":
        const = e.const_expr
        if const.WhichOneof("constant_kind") == "int64_value":
            return int(const.int64_value)
    return None


def _int_literal(node: _Node, default: int) -> int:
    """cel-go's nodeAsIntValue: a literal int argument (negative: 0), else *default*."""
    value = _literal_int(node.expr)
    if value is None:
        return default
    return max(0, value)

"""Instrument a checked CEL expression so that evaluating it counts upstream's *actual* cost
(cel-go's runtime cost tracker with Kubernetes' ``library.CostEstimator.CallCost``) into the
running evaluation's meter (``driver.cel.cost``).

cel-go charges every node it evaluates: 0 for a constant, 1 for an identifier, a field
selection or an index, 10 for a list literal, 30 for a map literal, 1 for a call unless the
function has its own cost (size-dependent ones by the sizes of their actual arguments), nothing
for ``&&``, ``||`` and ``?:`` themselves. Which nodes are evaluated depends on the data
(short-circuits, branches, comprehension iterations), so the instrumented expression charges:

* at each *region* entry -- the whole expression, the right operand of ``&&`` / ``||``, a
  branch of ``?:`` (less its base identifier when the branch is an attribute, which cel-go
  resolves past its cost observer), a comprehension's condition or step in each iteration, a
  ``cel.bind`` value when it is first read -- the fixed cost of the nodes the region always
  evaluates (``@biaxial.tick(n)``, a bool ``true``);
* at each size-dependent function of the engine's own -- string concatenation and comparison,
  ``contains``, ``matches``, ``startsWith``, list membership, the lists and sets extensions --
  its cost from the actual sizes of its operands (``@biaxial.charge(rule, [operands])``), the
  operands being bound once with the lazy ``cel.bind`` comprehension so they are evaluated
  exactly once, in order;
* the functions biaxial implements in Python charge their own cost (``driver.cel.cost``).

List concatenation and ``cel.@mapInsert`` also count *work*: the elements the engine copies
(cel-go shares them), bounded separately by ``driver.cel.cost``. Pure module.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, Final

from driver.cel import checked, estimate

TICK_FUNCTION: Final = "@biaxial.tick"
CHARGE_FUNCTION: Final = "@biaxial.charge"

# Charge rules: how @biaxial.charge turns its operands into cost (see charge_amount).
RULE_TRAVERSE: Final = 0  # ceil(0.1 |a|): startsWith, endsWith, bytes(s), string(b)
RULE_IN_LIST: Final = 1  # |list|
RULE_COMPARE: Final = 2  # ceil(0.1 min(|a|, |b|)): ==, !=, ordering of strings and bytes
RULE_CONCAT: Final = 3  # ceil(0.1 (|a| + |b|)): string and bytes concatenation
RULE_CONCAT_LIST: Final = 4  # 1, and |a| + |b| elements copied
RULE_MATCHES: Final = 5  # ceil(0.1 (1 + |s|)) x ceil(0.25 |p|)
RULE_CONTAINS: Final = 6  # ceil(0.1 |s|) x ceil(0.1 |t|)
RULE_LIST_OUTPUT: Final = 7  # |result| + 11: slice, reverse, lists.range
RULE_FLATTEN: Final = 8  # int(|a| x depth) + 11
RULE_SELF_COMPARE: Final = 9  # int(|a|^2 x (2 or 2.1 for strings)) + 11: distinct, sort, sortBy
RULE_SETS: Final = 10  # 1 + |a| x |b|
RULE_SETS_EQUIVALENT: Final = 11  # 1 + 2 |a| x |b|
RULE_EQUALS: Final = 12  # as RULE_COMPARE (Kubernetes' own types: size 1, so 1, its CallCost)

_DEVICE_FIELDS: Final = frozenset(
    {"device.driver", "device.attributes", "device.capacity", "device.allowMultipleAllocations"}
)
_SIZED: Final = frozenset({"string", "bytes", "list", "map"})
_UNSIZED: Final = frozenset({"bool", "int", "uint", "double", "null", "timestamp", "duration"})
_UNCONVERTIBLE: Final = frozenset({"opaque", "type"})


def actual_size(value: Any) -> int:
    """cel-go's actualSize: the size of a string (code points), bytes, list or map, of an IP
    (its bytes) or a CIDR (the bytes of its prefix); 1 for anything else."""
    if isinstance(value, str | bytes | bytearray | list | dict):
        return len(value)
    descriptor = getattr(value, "DESCRIPTOR", None)
    if descriptor is not None and descriptor.full_name == "net.IP":
        return 16 if ":" in value.value else 4
    if descriptor is not None and descriptor.full_name == "net.CIDR":
        return -(-int(value.value.rpartition("/")[2]) // 8)
    return 1


SIZE_FLAGS: Final = 16  # rule + SIZE_FLAGS x mask: bit i set = operand i is given as its size


def charge_amount(code: int, operands: list[Any]) -> tuple[int, int]:
    """(cost, work) of one @biaxial.charge call: upstream's runtime cost formulas. *code* is
    the rule, plus SIZE_FLAGS times a mask of the operands given as their sizes (lists, maps,
    strings and bytes need not travel to Python whole)."""
    rule, mask = code % SIZE_FLAGS, code // SIZE_FLAGS
    sizes = [v if mask >> i & 1 else actual_size(v) for i, v in enumerate(operands)]
    a = sizes[0] if sizes else 0
    b = sizes[1] if len(sizes) > 1 else 0
    if rule == RULE_TRAVERSE:
        return math.ceil(a * estimate.STRING_TRAVERSAL_FACTOR), 0
    if rule == RULE_IN_LIST:
        return b, 0
    if rule in (RULE_COMPARE, RULE_EQUALS):
        return math.ceil(min(a, b) * estimate.STRING_TRAVERSAL_FACTOR), 0
    if rule == RULE_CONCAT:
        return math.ceil((a + b) * estimate.STRING_TRAVERSAL_FACTOR), 0
    if rule == RULE_CONCAT_LIST:
        return 1, a + b
    if rule == RULE_MATCHES:
        text = math.ceil((1 + a) * estimate.STRING_TRAVERSAL_FACTOR)
        return text * math.ceil(b * estimate.REGEX_LENGTH_FACTOR), 0
    if rule == RULE_CONTAINS:
        factor = estimate.STRING_TRAVERSAL_FACTOR
        return math.ceil(a * factor) * math.ceil(b * factor), 0
    if rule == RULE_LIST_OUTPUT:
        return _list_output(operands, sizes, mask) + 1 + estimate.LIST_CREATE_COST, 0
    if rule == RULE_FLATTEN:
        depth = operands[1] if len(operands) > 1 else 1
        return int(a * float(depth)) + 1 + estimate.LIST_CREATE_COST, 0
    if rule == RULE_SELF_COMPARE:
        # The last operand: the compared list's size, negative for strings or bytes.
        n = abs(sizes[-1])
        per = 2.0 + (estimate.STRING_TRAVERSAL_FACTOR if sizes[-1] < 0 else 0.0)
        return int(float(n * n) * per) + 1 + estimate.LIST_CREATE_COST, 0
    if rule == RULE_SETS:
        return 1 + a * b, 0
    return 1 + int(float(a * b) * 2.0), 0


def _list_output(operands: list[Any], sizes: list[int], mask: int) -> int:
    """The size of the list slice / reverse / lists.range will return (charged before the
    call, so lists.range(10^9) stops before allocating)."""
    if len(operands) == 3:  # slice(start, end)
        return max(0, int(operands[2]) - int(operands[1]))
    if not mask & 1 and isinstance(operands[0], int):  # lists.range(n)
        return max(0, operands[0])
    return sizes[0]  # reverse


def instrument(checked_expr: Any, self_charging: Callable[[list[str]], bool]) -> Any:
    """A copy of the expression that charges its actual cost while it runs; *self_charging*
    tells calls whose implementations charge their own cost (by overload ids)."""
    out = copy.deepcopy(checked_expr)
    _Instrumenter(out, self_charging).run()
    return out


def _unobserved(branch: Any) -> int:
    """What cel-go does not charge when a ``?:`` branch runs: a branch that is an attribute (an
    identifier, perhaps with selections and indexes) is resolved by the conditional itself,
    past the cost observer, so its base identifier costs nothing (its qualifiers still cost 1
    each)."""
    node = branch
    while True:
        kind = node.WhichOneof("expr_kind")
        if kind == "ident_expr":
            return 1
        if kind == "select_expr" and not node.select_expr.test_only:
            node = node.select_expr.operand
        elif kind == "call_expr" and node.call_expr.function in ("_[_]", "_[?_]", "_?._"):
            node = node.call_expr.args[0]
        else:
            return 0


class _Instrumenter:
    def __init__(self, checked_expr: Any, self_charging: Callable[[list[str]], bool]) -> None:
        self.ce = checked_expr
        self.self_charging = self_charging
        self.new = checked.NodeFactory(checked_expr)

    def run(self) -> None:
        root = self.ce.expr
        self.gate(root, self.fixed(root))

    # ------------------------------------------------------------------ fixed costs

    def fixed(self, node: Any) -> int:
        """Instrument *node*'s conditional parts in place and return the cost of what it
        always evaluates."""
        kind = node.WhichOneof("expr_kind")
        if kind == "const_expr":
            return 0
        if kind == "ident_expr":
            return 2 if node.ident_expr.name in _DEVICE_FIELDS else 1
        if kind == "select_expr":
            own = 0 if node.select_expr.test_only else 1
            return own + self.fixed(node.select_expr.operand)
        if kind == "list_expr":
            return estimate.LIST_CREATE_COST + sum(self.fixed(e) for e in node.list_expr.elements)
        if kind == "struct_expr":
            struct = node.struct_expr
            total = estimate.STRUCT_CREATE_COST if struct.message_name else estimate.MAP_CREATE_COST
            for entry in struct.entries:
                if entry.HasField("map_key"):
                    total += self.fixed(entry.map_key)
                total += self.fixed(entry.value)
            return total
        if kind == "comprehension_expr":
            return self.comprehension(node.comprehension_expr)
        if kind == "call_expr":
            return self.call(node)
        return 0

    def comprehension(self, c: Any) -> int:
        total = self.fixed(c.iter_range) + self.fixed(c.result)
        if estimate.is_bind(c):
            self.gate(c.accu_init, self.fixed(c.accu_init))  # read lazily, maybe never
            return total
        total += self.fixed(c.accu_init)
        self.gate_bool(c.loop_condition, self.fixed(c.loop_condition))
        self.gate(c.loop_step, self.fixed(c.loop_step))
        return total

    def call(self, node: Any) -> int:
        call = node.call_expr
        operands = ([call.target] if call.HasField("target") else []) + list(call.args)
        ids = checked.overloads(self.ce, node)
        if call.function in ("_&&_", "_||_") and len(operands) == 2:
            left = self.fixed(operands[0])
            self.gate_bool(operands[1], self.fixed(operands[1]))
            return left
        if call.function == "_?_:_" and len(operands) == 3:
            condition = self.fixed(operands[0])
            for branch in operands[1:]:
                self.gate(branch, self.fixed(branch) - _unobserved(branch))
            return condition
        total = sum(self.fixed(o) for o in operands)
        if ids and self.self_charging(ids):
            return total
        rule = self.rule(call, ids, operands)
        if rule is None:
            return total + 1
        self.wrap_charge(node, rule)
        return total

    def rule(self, call: Any, ids: list[str], operands: list[Any]) -> int | None:
        oid = ids[0] if len(ids) == 1 else ""
        function = call.function
        if oid in ("starts_with_string", "ends_with_string", "string_to_bytes", "bytes_to_string"):
            return RULE_TRAVERSE
        if oid == "in_list":
            return RULE_IN_LIST
        if function in ("_==_", "_!=_"):
            kinds = {self.kind(o) for o in operands}
            if (
                kinds <= _UNSIZED
                or (function == "_==_" and self.kind(operands[0]) == "struct")
                or kinds & _UNCONVERTIBLE
            ):
                # 1, as upstream: sizeless values (and Kubernetes' own types: its CallCost).
                # An optional or a type never travels to Python: cel-expr-python cannot
                # convert one inside a list (its size is 1 anyway).
                return None
            return RULE_EQUALS if function == "_==_" else RULE_COMPARE
        if oid.startswith(("less_", "greater_")) and oid.endswith(("_string", "_bytes")):
            return RULE_COMPARE
        if oid in ("add_string", "add_bytes"):
            return RULE_CONCAT
        if oid == "add_list":
            return RULE_CONCAT_LIST
        if oid == "matches_string":
            return RULE_MATCHES
        if oid == "contains_string":
            return RULE_CONTAINS
        if function in ("slice", "reverse", "lists.range") and oid.startswith("list"):
            return RULE_LIST_OUTPUT
        if function == "flatten" and oid.startswith("list"):
            return RULE_FLATTEN
        if function in ("distinct", "sort", "@sortByAssociatedKeys") and oid.startswith("list"):
            return RULE_SELF_COMPARE
        if function in ("sets.contains", "sets.intersects"):
            return RULE_SETS
        if function == "sets.equivalent":
            return RULE_SETS_EQUIVALENT
        return None

    def kind(self, node: Any) -> str:
        return estimate.type_info(self.ce.type_map.get(node.id)).kind

    # ------------------------------------------------------------------ rewriting

    def tick(self, amount: int) -> Any:
        return self.new.call(TICK_FUNCTION, [self.new.int_node(min(amount, 2**62))])

    def gate(self, node: Any, amount: int) -> None:
        """node := tick(amount) ? node : null (any type)."""
        if amount <= 0:
            return
        inner = copy.deepcopy(node)
        node.CopyFrom(self.new.call("_?_:_", [self.tick(amount), inner, self.new.null()]))

    def gate_bool(self, node: Any, amount: int) -> None:
        """node := tick(amount) && node (a logical operand, a loop condition)."""
        if amount <= 0:
            return
        inner = copy.deepcopy(node)
        node.CopyFrom(self.new.call("_&&_", [self.tick(amount), inner]))

    def type_is(self, value: Any, names: tuple[str, ...]) -> Any:
        """``type(value) == names[0] || ...`` (type names resolved by reference)."""
        tests = []
        for name in names:
            literal = self.new.ident(name)
            self.ce.reference_map[literal.id].name = name
            tests.append(self.new.call("_==_", [self.new.call("type", [value]), literal]))
        out = tests[0]
        for test in tests[1:]:
            out = self.new.call("_||_", [out, test])
        return out

    def safe_size(self, name: str) -> Any:
        """The actual size of a value of any type, computed in CEL: nothing reaches Python
        but an int (cel-expr-python cannot convert an optional inside a list)."""
        sized = self.type_is(self.new.ident(name), ("string", "bytes", "list", "map"))
        size = self.new.call("size", [self.new.ident(name)])
        return self.new.call("_?_:_", [sized, size, self.new.int_node(1)])

    def self_compare_size(self, name: str) -> Any:
        """For distinct / sort / sortBy: the list's size, negative where its elements are
        strings or bytes (each comparison then costs more)."""
        size = self.new.call("size", [self.new.ident(name)])
        first = self.new.call("_[_]", [self.new.ident(name), self.new.int_node(0)])
        negative = self.new.call("-_", [self.new.call("size", [self.new.ident(name)])])
        stringy = self.new.call(
            "_?_:_",
            [
                self.type_is(first, ("string", "bytes")),
                negative,
                self.new.call("size", [self.new.ident(name)]),
            ],
        )
        empty = self.new.call("_==_", [size, self.new.int_node(0)])
        return self.new.call("_?_:_", [empty, self.new.int_node(0), stringy])

    def wrap_charge(self, node: Any, rule: int) -> None:
        """node := cel.bind(@o1, operand1, ... charge(rule, [@o1, ...]) ? node' : null) where
        node' reads the bound operands (each evaluated once, in order)."""
        inner = copy.deepcopy(node)
        call = inner.call_expr
        operands = ([call.target] if call.HasField("target") else []) + list(call.args)
        binds: list[tuple[str, Any]] = []
        refs = []
        mask = 0
        for i, operand in enumerate(operands):
            name = f"@o{self.new.fresh()}"
            kind = self.kind(operand)
            binds.append((name, copy.deepcopy(operand)))
            operand.CopyFrom(self.new.ident(name))
            if rule == RULE_SELF_COMPARE and i == len(operands) - 1:
                refs.append(self.self_compare_size(name))  # the list whose elements compare
            elif kind in _SIZED and rule != RULE_SELF_COMPARE:
                refs.append(self.new.call("size", [self.new.ident(name)]))
            elif kind in _UNSIZED:
                refs.append(self.new.ident(name))  # a number the rule reads (slice, depth)
                continue
            else:  # dyn, an optional, a message: its size, worked out in CEL
                refs.append(self.safe_size(name))
            mask |= 1 << i
        code = self.new.int_node(rule + SIZE_FLAGS * mask)
        gate = self.new.call(CHARGE_FUNCTION, [code, self.new.list_node(refs)])
        body = self.new.call("_?_:_", [gate, inner, self.new.null()])
        for name, value in reversed(binds):
            body = self.new.bind(name, value, body)
        node.CopyFrom(body)

"""Reads the checked CEL AST that cel-expr-python serialises, for the two analyses the engine
binding needs and the engine does not offer: the attribute/capacity **domains** an expression
names literally, and a **worst-case cost estimate**.

``Expression.serialize()`` returns a ``google.protobuf.Any`` holding a ``cel.expr.CheckedExpr``
(cel-spec ``proto/cel/expr/checked.proto`` / ``syntax.proto``). The message classes are built
here from a minimal descriptor with the published field numbers; fields this module does not
need are skipped by the protobuf parser as unknown fields.

Cost model (an approximation of cel-go's ``EstimateCost`` with upstream DRA's size bounds, used
because cel-expr-python has no cost tracking): every node costs 1 (constants 0, list literals
10, map literals 30), a string/list function costs 1 + 0.1 x the size it walks (a set operation:
the product of its lists' sizes), and a comprehension costs its range plus *n* x (condition +
step) where *n* is the maximum size of the range. Sizes come from literals, or from DRA's API
bounds for device data: a device has at most 32 attributes and capacities, a string attribute at
most 64 characters, a list attribute at most 64 elements. A value neither bounds (a
comprehension variable, a selected field) is taken as large as the largest literal in the
expression, at least :data:`UNKNOWN_SIZE`; list concatenation adds sizes. Comprehension results
that grow faster than their range (a ``map`` whose step builds lists) can exceed that bound; no
DRA selector needs one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory

ATTRIBUTES_PER_DEVICE: Final = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
ATTRIBUTE_VALUE_SIZE: Final = 64  # DeviceAttributeMaxValueLength (strings, list elements)
UNKNOWN_SIZE: Final = 64
# Functions whose work grows with the size of their arguments (strings walked, lists scanned).
_LINEAR_FUNCTIONS: Final = frozenset(
    {
        "contains", "startsWith", "endsWith", "matches", "split", "replace", "lowerAscii",
        "upperAscii", "trim", "substring", "indexOf", "lastIndexOf", "join", "charAt", "reverse",
        "format", "_+_", "_==_", "_!=_", "@in", "string", "includes", "isSorted", "sum", "min",
        "max",
    }
)  # fmt: skip
# Set operations compare every element of one list with every element of the other.
_QUADRATIC_FUNCTIONS: Final = frozenset({"sets.contains", "sets.equivalent", "sets.intersects"})

_F = descriptor_pb2.FieldDescriptorProto


def _build_classes() -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="biaxial/cel_expr_subset.proto", package="cel.expr", syntax="proto3"
    )

    def message(name: str, fields: list[tuple[str, int, int, str, bool]]) -> None:
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, type_name, repeated in fields:
            field = msg.field.add(
                name=fname,
                number=number,
                type=ftype,
                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
            )
            if type_name:
                field.type_name = type_name

    msg, s, b, i64 = _F.TYPE_MESSAGE, _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_INT64
    message(
        "Constant",
        [
            ("bool_value", 2, b, "", False),
            ("int64_value", 3, i64, "", False),
            ("uint64_value", 4, _F.TYPE_UINT64, "", False),
            ("double_value", 5, _F.TYPE_DOUBLE, "", False),
            ("string_value", 6, s, "", False),
            ("bytes_value", 7, _F.TYPE_BYTES, "", False),
        ],
    )
    constant = fdp.message_type[-1]
    constant.oneof_decl.add(name="constant_kind")
    for field in constant.field:
        field.oneof_index = 0
    message("Ident", [("name", 1, s, "", False)])
    message(
        "Select",
        [
            ("operand", 1, msg, ".cel.expr.Expr", False),
            ("field", 2, s, "", False),
            ("test_only", 3, b, "", False),
        ],
    )
    message(
        "Call",
        [
            ("target", 1, msg, ".cel.expr.Expr", False),
            ("function", 2, s, "", False),
            ("args", 3, msg, ".cel.expr.Expr", True),
        ],
    )
    message("CreateList", [("elements", 1, msg, ".cel.expr.Expr", True)])
    message(
        "Entry",
        [("map_key", 3, msg, ".cel.expr.Expr", False), ("value", 4, msg, ".cel.expr.Expr", False)],
    )
    message("CreateStruct", [("entries", 2, msg, ".cel.expr.Entry", True)])
    message(
        "Comprehension",
        [
            ("iter_var", 1, s, "", False),
            ("iter_range", 2, msg, ".cel.expr.Expr", False),
            ("accu_var", 3, s, "", False),
            ("accu_init", 4, msg, ".cel.expr.Expr", False),
            ("loop_condition", 5, msg, ".cel.expr.Expr", False),
            ("loop_step", 6, msg, ".cel.expr.Expr", False),
            ("result", 7, msg, ".cel.expr.Expr", False),
            ("iter_var2", 8, s, "", False),
        ],
    )
    message(
        "Expr",
        [
            ("id", 2, i64, "", False),
            ("const_expr", 3, msg, ".cel.expr.Constant", False),
            ("ident_expr", 4, msg, ".cel.expr.Ident", False),
            ("select_expr", 5, msg, ".cel.expr.Select", False),
            ("call_expr", 6, msg, ".cel.expr.Call", False),
            ("list_expr", 7, msg, ".cel.expr.CreateList", False),
            ("struct_expr", 8, msg, ".cel.expr.CreateStruct", False),
            ("comprehension_expr", 9, msg, ".cel.expr.Comprehension", False),
        ],
    )
    # oneof expr_kind over fields 3..9, so WhichOneof() tells the node kind.
    expr = fdp.message_type[-1]
    expr.oneof_decl.add(name="expr_kind")
    for field in expr.field[1:]:
        field.oneof_index = 0
    message("CheckedExpr", [("expr", 4, msg, ".cel.expr.Expr", False)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"cel.expr.{name}"))
        for name in ("CheckedExpr", "Expr")
    }


_CLASSES: Final = _build_classes()


def parse_checked(serialized: bytes) -> Any:
    """The root ``cel.expr.Expr`` of a serialised checked expression."""
    wrapper = any_pb2.Any.FromString(serialized)
    return _CLASSES["CheckedExpr"].FromString(wrapper.value).expr


def _children(node: Any) -> Iterator[Any]:
    kind = node.WhichOneof("expr_kind")
    if kind == "select_expr":
        yield node.select_expr.operand
    elif kind == "call_expr":
        if node.call_expr.HasField("target"):
            yield node.call_expr.target
        yield from node.call_expr.args
    elif kind == "list_expr":
        yield from node.list_expr.elements
    elif kind == "struct_expr":
        for entry in node.struct_expr.entries:
            yield entry.map_key
            yield entry.value
    elif kind == "comprehension_expr":
        c = node.comprehension_expr
        yield from (c.iter_range, c.accu_init, c.loop_condition, c.loop_step, c.result)


def _device_map_name(node: Any) -> str | None:
    """``attributes`` / ``capacity`` when *node* is ``device.attributes`` / ``device.capacity``."""
    kind = node.WhichOneof("expr_kind")
    if kind == "select_expr" and not node.select_expr.test_only:
        operand = node.select_expr.operand
        if operand.WhichOneof("expr_kind") == "ident_expr" and operand.ident_expr.name == "device":
            field = node.select_expr.field
            return field if field in ("attributes", "capacity") else None
    if kind == "ident_expr" and node.ident_expr.name in ("device.attributes", "device.capacity"):
        return str(node.ident_expr.name).split(".", 1)[1]
    return None


def literal_domains(root: Any) -> frozenset[str]:
    """Domains the expression looks up literally: ``device.attributes["x.io"]`` (also ``[?]``)
    and ``device.capacity.x``."""
    found: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(_children(node))
        kind = node.WhichOneof("expr_kind")
        if kind == "call_expr" and node.call_expr.function in ("_[_]", "_[?_]"):
            args = node.call_expr.args
            if (
                len(args) == 2
                and _device_map_name(args[0]) is not None
                and args[1].WhichOneof("expr_kind") == "const_expr"
                and args[1].const_expr.WhichOneof("constant_kind") == "string_value"
            ):
                found.add(args[1].const_expr.string_value)
        elif (
            kind == "select_expr"
            and _device_map_name(node.select_expr.operand) is not None
            and not node.select_expr.test_only
        ):
            found.add(node.select_expr.field)
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class _Estimate:
    cost: int
    size: int  # maximum size (elements or characters) of the value


def _device_size(node: Any) -> int | None:
    """Size bound of device data: the two maps, a domain map, or one attribute value."""
    if _device_map_name(node) is not None:
        return ATTRIBUTES_PER_DEVICE
    kind = node.WhichOneof("expr_kind")
    inner = None
    if kind == "call_expr" and node.call_expr.function in ("_[_]", "_[?_]"):
        inner = node.call_expr.args[0]
    elif kind == "select_expr":
        inner = node.select_expr.operand
    if inner is None:
        return None
    if _device_map_name(inner) is not None:
        return ATTRIBUTES_PER_DEVICE  # a domain's map
    if _device_size(inner) == ATTRIBUTES_PER_DEVICE:
        return ATTRIBUTE_VALUE_SIZE  # one attribute value
    return None


def _largest_literal(root: Any) -> int:
    """The largest list, map or string literal in the expression."""
    largest = 0
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(_children(node))
        kind = node.WhichOneof("expr_kind")
        if kind == "list_expr":
            largest = max(largest, len(node.list_expr.elements))
        elif kind == "struct_expr":
            largest = max(largest, len(node.struct_expr.entries))
        elif kind == "const_expr":
            const = node.const_expr
            largest = max(largest, len(const.string_value), len(const.bytes_value))
    return largest


def estimate_cost(root: Any) -> int:
    """Worst-case cost of evaluating the expression (see the module docstring)."""
    model = _CostModel(unknown=max(UNKNOWN_SIZE, _largest_literal(root)))
    return model.estimate(root, {}).cost


@dataclass(frozen=True, slots=True)
class _CostModel:
    unknown: int  # size bound of a value neither a literal nor the API bounds more tightly

    def estimate(self, node: Any, scope: Mapping[str, int]) -> _Estimate:
        kind = node.WhichOneof("expr_kind")
        if kind == "const_expr":
            const = node.const_expr
            return _Estimate(0, max(1, len(const.string_value), len(const.bytes_value)))
        if kind == "ident_expr":
            bound = _device_size(node)
            default = bound if bound is not None else self.unknown
            return _Estimate(1, scope.get(node.ident_expr.name, default))
        if kind == "select_expr":
            operand = self.estimate(node.select_expr.operand, scope)
            bound = _device_size(node)
            return _Estimate(operand.cost + 1, bound if bound is not None else self.unknown)
        if kind == "list_expr":
            parts = [self.estimate(e, scope) for e in node.list_expr.elements]
            return _Estimate(10 + sum(p.cost for p in parts), len(parts))
        if kind == "struct_expr":
            cost = 30
            for entry in node.struct_expr.entries:
                cost += self.estimate(entry.map_key, scope).cost
                cost += self.estimate(entry.value, scope).cost
            return _Estimate(cost, len(node.struct_expr.entries))
        if kind == "call_expr":
            return self._call(node, scope)
        if kind == "comprehension_expr":
            return self._comprehension(node.comprehension_expr, scope)
        return _Estimate(1, self.unknown)

    def _comprehension(self, c: Any, scope: Mapping[str, int]) -> _Estimate:
        rng = self.estimate(c.iter_range, scope)
        init = self.estimate(c.accu_init, scope)
        inner = dict(scope)
        inner[c.iter_var] = self.unknown
        if c.iter_var2:
            inner[c.iter_var2] = self.unknown
        accumulated = max(rng.size, init.size)
        inner[c.accu_var] = accumulated
        per_iteration = (
            self.estimate(c.loop_condition, inner).cost + self.estimate(c.loop_step, inner).cost
        )
        result = self.estimate(c.result, inner)
        return _Estimate(
            rng.cost + init.cost + rng.size * (per_iteration + 1) + result.cost,
            max(accumulated, result.size),
        )

    def _call(self, node: Any, scope: Mapping[str, int]) -> _Estimate:
        call = node.call_expr
        parts = [self.estimate(a, scope) for a in call.args]
        target = self.estimate(call.target, scope) if call.HasField("target") else None
        if target is not None:
            parts.insert(0, target)
        cost = 1 + sum(p.cost for p in parts)
        size = max((p.size for p in parts), default=1)
        function = call.function
        if function in _LINEAR_FUNCTIONS:
            walked = sum(p.size for p in parts)
            cost += math.ceil(0.1 * walked)
            if function == "_+_":
                size = walked
        elif function in _QUADRATIC_FUNCTIONS:
            cost += math.prod(p.size for p in parts)
            size = 1
        if function in ("_[_]", "_[?_]"):
            bound = _device_size(node)
            size = bound if bound is not None else self.unknown
        elif function == "split":
            size = (target.size if target is not None else self.unknown) + 1
        return _Estimate(cost, size)

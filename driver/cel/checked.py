"""Reads, checks and rewrites the checked CEL AST that cel-expr-python serialises, for what the
engine binding needs and the engine does not offer:

* the attribute/capacity **domains** an expression names literally (:func:`literal_domains`);
* upstream's **compile-time rules** the engine lacks (:func:`validate`): homogeneous aggregate
  literals (``cel.ValidateHomogeneousAggregateLiterals``), constant regular expressions
  (``cel.ValidateRegexLiterals``), and the list members cel-cpp's lists extension has but
  upstream's version does not (``first``, ``last``);
* **renaming** library calls to the private names their implementations run under
  (:func:`rename_calls`);
* upstream's **static cost estimate** (:func:`estimate_cost`): cel-go's ``EstimateCost`` with
  Kubernetes' cost estimator and DRA's size bounds -- 1 per identifier, selection and call, 0
  per constant, 10 per list and 30 per map literal, size-dependent functions by the sizes of
  their arguments (0.1 per character walked, string x pattern for regular expressions, ...),
  comprehensions by their range's size times their body. Sizes come from literals, from DRA's
  API bounds for device data (a domain name at most 63 characters, an attribute or capacity
  name 32, at most 32 attributes and capacities, a string attribute 64 characters, a list
  attribute 64 elements), and from how functions grow them; a size nothing bounds is
  unbounded (2^64 - 1) and costs saturate there, as upstream's do;
* **instrumenting** an expression for metered evaluation (:func:`instrument`): every
  comprehension iteration and every size-dependent operation of the engine's own charges the
  running evaluation's meter (``driver.cel.cost``).

``Expression.serialize()`` returns a ``google.protobuf.Any`` holding a ``cel.expr.CheckedExpr``
(cel-spec ``proto/cel/expr/checked.proto`` / ``syntax.proto``). The message classes are built
here from a minimal descriptor with the published field numbers; fields this module does not
model are kept as unknown fields, so a rewritten expression round-trips through
:func:`serialize_checked` and the engine's ``deserialize``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, empty_pb2, message_factory

ATTRIBUTES_PER_DEVICE: Final = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
ATTRIBUTE_VALUE_SIZE: Final = 64  # DeviceAttributeMaxValueLength (strings, list elements)
DOMAIN_SIZE: Final = 63  # DeviceMaxDomainLength
ID_SIZE: Final = 32  # DeviceMaxIDLength
DRIVER_SIZE: Final = 63  # DriverNameMaxLength
UNBOUNDED: Final = 2**64 - 1  # math.MaxUint64: upstream's "no bound"

TICK_FUNCTION: Final = "@biaxial.tick"
CHARGE_FUNCTION: Final = "@biaxial.charge"

_F = descriptor_pb2.FieldDescriptorProto


def _build_classes() -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="biaxial/cel_expr_subset.proto", package="cel.expr", syntax="proto3"
    )

    def message(
        name: str, fields: list[tuple[str, int, int, str, bool]], parent: Any = None
    ) -> Any:
        msg = (parent.nested_type if parent is not None else fdp.message_type).add(name=name)
        for fname, number, ftype, type_name, repeated in fields:
            field = msg.field.add(
                name=fname,
                number=number,
                type=ftype,
                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
            )
            if type_name:
                field.type_name = type_name
        return msg

    def oneof(msg: Any, name: str, numbers: set[int]) -> None:
        index = len(msg.oneof_decl)
        msg.oneof_decl.add(name=name)
        for field in msg.field:
            if field.number in numbers:
                field.oneof_index = index

    def map_field(msg: Any, name: str, number: int, value_type: str) -> None:
        entry = message(
            f"{name.title().replace('_', '')}Entry",
            [("key", 1, _F.TYPE_INT64, "", False), ("value", 2, msg_t, value_type, False)],
            parent=msg,
        )
        entry.options.map_entry = True
        field = msg.field.add(name=name, number=number, type=msg_t, label=_F.LABEL_REPEATED)
        field.type_name = f".cel.expr.{msg.name}.{entry.name}"

    msg_t, s, b, i64 = _F.TYPE_MESSAGE, _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_INT64
    constant = message(
        "Constant",
        [
            ("null_value", 1, _F.TYPE_INT32, "", False),
            ("bool_value", 2, b, "", False),
            ("int64_value", 3, i64, "", False),
            ("uint64_value", 4, _F.TYPE_UINT64, "", False),
            ("double_value", 5, _F.TYPE_DOUBLE, "", False),
            ("string_value", 6, s, "", False),
            ("bytes_value", 7, _F.TYPE_BYTES, "", False),
        ],
    )
    oneof(constant, "constant_kind", {1, 2, 3, 4, 5, 6, 7})
    message("Ident", [("name", 1, s, "", False)])
    message(
        "Select",
        [
            ("operand", 1, msg_t, ".cel.expr.Expr", False),
            ("field", 2, s, "", False),
            ("test_only", 3, b, "", False),
        ],
    )
    message(
        "Call",
        [
            ("target", 1, msg_t, ".cel.expr.Expr", False),
            ("function", 2, s, "", False),
            ("args", 3, msg_t, ".cel.expr.Expr", True),
        ],
    )
    message(
        "CreateList",
        [
            ("elements", 1, msg_t, ".cel.expr.Expr", True),
            ("optional_indices", 2, _F.TYPE_INT32, "", True),
        ],
    )
    message(
        "Entry",
        [
            ("id", 1, i64, "", False),
            ("field_key", 2, s, "", False),
            ("map_key", 3, msg_t, ".cel.expr.Expr", False),
            ("value", 4, msg_t, ".cel.expr.Expr", False),
            ("optional_entry", 5, b, "", False),
        ],
    )
    message(
        "CreateStruct",
        [("message_name", 1, s, "", False), ("entries", 2, msg_t, ".cel.expr.Entry", True)],
    )
    message(
        "Comprehension",
        [
            ("iter_var", 1, s, "", False),
            ("iter_range", 2, msg_t, ".cel.expr.Expr", False),
            ("accu_var", 3, s, "", False),
            ("accu_init", 4, msg_t, ".cel.expr.Expr", False),
            ("loop_condition", 5, msg_t, ".cel.expr.Expr", False),
            ("loop_step", 6, msg_t, ".cel.expr.Expr", False),
            ("result", 7, msg_t, ".cel.expr.Expr", False),
            ("iter_var2", 8, s, "", False),
        ],
    )
    expr = message(
        "Expr",
        [
            ("id", 2, i64, "", False),
            ("const_expr", 3, msg_t, ".cel.expr.Constant", False),
            ("ident_expr", 4, msg_t, ".cel.expr.Ident", False),
            ("select_expr", 5, msg_t, ".cel.expr.Select", False),
            ("call_expr", 6, msg_t, ".cel.expr.Call", False),
            ("list_expr", 7, msg_t, ".cel.expr.CreateList", False),
            ("struct_expr", 8, msg_t, ".cel.expr.CreateStruct", False),
            ("comprehension_expr", 9, msg_t, ".cel.expr.Comprehension", False),
        ],
    )
    oneof(expr, "expr_kind", {3, 4, 5, 6, 7, 8, 9})
    message(
        "Reference",
        [
            ("name", 1, s, "", False),
            ("overload_id", 3, s, "", True),
            ("value", 4, msg_t, ".cel.expr.Constant", False),
        ],
    )
    # cel.expr.Type, the kinds the analyses read (others stay unknown fields).
    type_msg = message(
        "Type",
        [
            ("dyn", 1, msg_t, ".google.protobuf.Empty", False),
            ("null", 2, _F.TYPE_INT32, "", False),
            ("primitive", 3, _F.TYPE_INT32, "", False),
            ("wrapper", 4, _F.TYPE_INT32, "", False),
            ("well_known", 5, _F.TYPE_INT32, "", False),
            ("list_type", 6, msg_t, ".cel.expr.Type.ListType", False),
            ("map_type", 7, msg_t, ".cel.expr.Type.MapType", False),
            ("message_type", 9, s, "", False),
            ("type_param", 10, s, "", False),
            ("type", 11, msg_t, ".cel.expr.Type", False),
            ("error", 12, msg_t, ".google.protobuf.Empty", False),
            ("abstract_type", 14, msg_t, ".cel.expr.Type.AbstractType", False),
        ],
    )
    message("ListType", [("elem_type", 1, msg_t, ".cel.expr.Type", False)], parent=type_msg)
    message(
        "MapType",
        [
            ("key_type", 1, msg_t, ".cel.expr.Type", False),
            ("value_type", 2, msg_t, ".cel.expr.Type", False),
        ],
        parent=type_msg,
    )
    message(
        "AbstractType",
        [("name", 1, s, "", False), ("parameter_types", 2, msg_t, ".cel.expr.Type", True)],
        parent=type_msg,
    )
    oneof(type_msg, "type_kind", {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14})
    checked_msg = message("CheckedExpr", [("expr", 4, msg_t, ".cel.expr.Expr", False)])
    map_field(checked_msg, "reference_map", 2, ".cel.expr.Reference")
    map_field(checked_msg, "type_map", 3, ".cel.expr.Type")
    fdp.dependency.append("google/protobuf/empty.proto")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(empty_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"cel.expr.{name}"))
        for name in ("CheckedExpr", "Expr", "Type")
    }


_CLASSES: Final = _build_classes()


def parse_checked(serialized: bytes) -> Any:
    """The root ``cel.expr.Expr`` of a serialised checked expression."""
    return parse_checked_expr(serialized).expr


def parse_checked_expr(serialized: bytes) -> Any:
    """The whole ``cel.expr.CheckedExpr`` (expression, reference map, type map) of a
    serialised checked expression; fields this module does not model are kept as unknown
    fields, so :func:`serialize_checked` round-trips it."""
    wrapper = any_pb2.Any.FromString(serialized)
    return _CLASSES["CheckedExpr"].FromString(wrapper.value)


def serialize_checked(checked_expr: Any) -> bytes:
    """The ``google.protobuf.Any`` bytes the engine's ``deserialize`` reads."""
    wrapper = any_pb2.Any()
    wrapper.type_url = "type.googleapis.com/cel.expr.CheckedExpr"
    wrapper.value = checked_expr.SerializeToString()
    return wrapper.SerializeToString()


def new_expr() -> Any:
    """An empty ``cel.expr.Expr`` node."""
    return _CLASSES["Expr"]()


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


# --------------------------------------------------------------------------- walking


def _walk(root: Any) -> Iterator[Any]:
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(_children(node))


def _overloads(checked_expr: Any, node: Any) -> list[str]:
    ref = checked_expr.reference_map.get(node.id)
    return list(ref.overload_id) if ref is not None else []


def _type_name(checked_expr: Any, node: Any) -> str:
    """A coarse name of the node's checked type: int, uint, double, bool, string, bytes,
    list, map, dyn, null, timestamp, duration, a message name, or "" when unknown."""
    t = checked_expr.type_map.get(node.id)
    if t is None:
        return ""
    return _describe(t)


_PRIMITIVES: Final = {1: "bool", 2: "int", 3: "uint", 4: "double", 5: "string", 6: "bytes"}
_WELL_KNOWN: Final = {1: "any", 2: "timestamp", 3: "duration"}


def _describe(t: Any) -> str:
    kind = t.WhichOneof("type_kind")
    if kind == "primitive":
        return _PRIMITIVES.get(t.primitive, "")
    if kind == "well_known":
        return _WELL_KNOWN.get(t.well_known, "")
    if kind == "list_type":
        return f"list({_describe(t.list_type.elem_type)})"
    if kind == "map_type":
        return f"map({_describe(t.map_type.key_type)}, {_describe(t.map_type.value_type)})"
    if kind == "message_type":
        return str(t.message_type)
    if kind == "abstract_type":
        params = ", ".join(_describe(p) for p in t.abstract_type.parameter_types)
        return f"{t.abstract_type.name}({params})"
    if kind == "wrapper":
        return "wrapper(" + _PRIMITIVES.get(t.wrapper, "") + ")"
    if kind in ("dyn", "null", "type_param", "error", "type"):
        return str(kind)
    return ""


# --------------------------------------------------------------------------- compile-time rules


def validate(checked_expr: Any, regex_problem: Callable[[str], str | None]) -> str | None:
    """The first of upstream's compile-time rules the expression breaks, or None."""
    for node in _walk(checked_expr.expr):
        kind = node.WhichOneof("expr_kind")
        if kind == "list_expr":
            problem = _homogeneous(
                checked_expr,
                [
                    e
                    for i, e in enumerate(node.list_expr.elements)
                    if i not in set(node.list_expr.optional_indices)
                ],
                "list",
            )
            if problem:
                return problem
        elif kind == "struct_expr" and not node.struct_expr.message_name:
            entries = node.struct_expr.entries
            problem = _homogeneous(checked_expr, [e.map_key for e in entries], "map key") or (
                _homogeneous(
                    checked_expr, [e.value for e in entries if not e.optional_entry], "map value"
                )
            )
            if problem:
                return problem
        elif kind == "call_expr":
            call = node.call_expr
            ids = _overloads(checked_expr, node)
            if call.function in ("first", "last") and any(i.startswith("list_") for i in ids):
                return f"undeclared reference to '{call.function}' (in container '')"
            if call.function in ("matches", "find", "findAll"):
                args = list(call.args)
                pattern = args[0] if call.HasField("target") else args[1] if len(args) > 1 else None
                if (
                    pattern is not None
                    and pattern.WhichOneof("expr_kind") == "const_expr"
                    and pattern.const_expr.WhichOneof("constant_kind") == "string_value"
                ):
                    problem = regex_problem(pattern.const_expr.string_value)
                    if problem:
                        return problem
    return None


def _homogeneous(checked_expr: Any, elements: list[Any], what: str) -> str | None:
    """cel-go's homogeneous aggregate literal rule: every element has the first one's type
    (an explicit ``dyn(...)`` element is allowed to differ)."""
    first = ""
    for element in elements:
        if element.WhichOneof("expr_kind") == "call_expr" and element.call_expr.function == "dyn":
            continue
        name = _type_name(checked_expr, element)
        if not first:
            first = name
        elif name != first:
            return f"expected type '{first}' but found '{name}' in {what} literal"
    return None


# --------------------------------------------------------------------------- renaming


def rename_calls(
    checked_expr: Any, resolve: Callable[[str, list[str], int, bool], str | None]
) -> bool:
    """Rename every call *resolve* maps (function, overload ids, arity, member) to a private
    name; True if anything changed."""
    changed = False
    for node in _walk(checked_expr.expr):
        if node.WhichOneof("expr_kind") != "call_expr":
            continue
        call = node.call_expr
        member = call.HasField("target")
        arity = len(call.args) + (1 if member else 0)
        name = resolve(call.function, _overloads(checked_expr, node), arity, member)
        if name is not None and name != call.function:
            call.function = name
            changed = True
    return changed


# --------------------------------------------------------------------------- cost estimate


@dataclass(frozen=True, slots=True)
class Estimate:
    """Cost and size ranges of one node, saturating at UNBOUNDED like cel-go's."""

    cost_min: int
    cost_max: int
    size_min: int = 0
    size_max: int = 1


def _sat(value: float) -> int:
    return UNBOUNDED if value >= UNBOUNDED else max(0, math.ceil(value))


def _add(*values: int) -> int:
    return _sat(sum(values))


def _mul(a: int, b: int) -> int:
    return _sat(a * b)


def _factor(size: int, factor: float) -> int:
    return _sat(size * factor)


def estimate_cost(checked_expr: Any) -> int:
    """Upstream's worst-case cost estimate of the expression (see the module docstring)."""
    return _CostModel(checked_expr).estimate(checked_expr.expr, {}).cost_max


def estimate_range(checked_expr: Any, node: Any) -> Estimate:
    return _CostModel(checked_expr).estimate(node, {})


_STRING_FACTOR: Final = 0.1
_REGEX_FACTOR: Final = 0.25


class _CostModel:
    """cel-go's checker cost estimator (checker/cost.go) with Kubernetes' CostEstimator
    (apiserver library/cost.go) and DRA's size estimator, over the checked AST."""

    def __init__(self, checked_expr: Any) -> None:
        self.ce = checked_expr

    def estimate(self, node: Any, scope: dict[str, Estimate]) -> Estimate:
        kind = node.WhichOneof("expr_kind")
        if kind == "const_expr":
            const = node.const_expr
            n = len(const.string_value) or len(const.bytes_value) or 1
            return Estimate(0, 0, n, n)
        if kind == "ident_expr":
            name = node.ident_expr.name
            if name in scope:
                bound = scope[name]
                return Estimate(1, 1, bound.size_min, bound.size_max)
            return Estimate(1, 1, 0, _device_bound(node, self.ce))
        if kind == "select_expr":
            sel = node.select_expr
            operand = self.estimate(sel.operand, scope)
            own = 0 if sel.test_only else 1  # PresenceTestHasCost(false)
            return Estimate(
                _add(operand.cost_min, own),
                _add(operand.cost_max, own),
                0,
                1 if sel.test_only else _device_bound(node, self.ce),
            )
        if kind == "list_expr":
            parts = [self.estimate(e, scope) for e in node.list_expr.elements]
            n = len(parts)
            return Estimate(
                _add(10, *(p.cost_min for p in parts)),
                _add(10, *(p.cost_max for p in parts)),
                n,
                n,
            )
        if kind == "struct_expr":
            lo = hi = 30 if not node.struct_expr.message_name else 40
            for entry in node.struct_expr.entries:
                for part in (entry.map_key, entry.value):
                    if part.ByteSize():
                        est = self.estimate(part, scope)
                        lo, hi = _add(lo, est.cost_min), _add(hi, est.cost_max)
            n = len(node.struct_expr.entries)
            return Estimate(lo, hi, n, n)
        if kind == "call_expr":
            return self._call(node, scope)
        if kind == "comprehension_expr":
            return self._comprehension(node.comprehension_expr, scope)
        return Estimate(1, 1, 0, UNBOUNDED)

    def _comprehension(self, c: Any, scope: dict[str, Estimate]) -> Estimate:
        rng = self.estimate(c.iter_range, scope)
        init = self.estimate(c.accu_init, scope)
        inner = dict(scope)
        element = _element_bound(c.iter_range, self.ce, scope)
        if c.iter_var2:
            inner[c.iter_var] = Estimate(
                0, 0, 0, 1 if _is_list(c.iter_range, self.ce) else element.size_max
            )
            inner[c.iter_var2] = element
        else:
            inner[c.iter_var] = element
        # The accumulator of a map/filter grows by an element per iteration.
        grown = _mul(rng.size_max, max(1, element.size_max))
        inner[c.accu_var] = Estimate(0, 0, init.size_min, max(init.size_max, grown))
        cond = self.estimate(c.loop_condition, inner)
        step = self.estimate(c.loop_step, inner)
        result = self.estimate(c.result, inner)
        per_lo = _add(cond.cost_min, step.cost_min)
        per_hi = _add(cond.cost_max, step.cost_max)
        lo = _add(rng.cost_min, init.cost_min, _mul(rng.size_min, per_lo), result.cost_min)
        hi = _add(rng.cost_max, init.cost_max, _mul(rng.size_max, per_hi), result.cost_max)
        size_max = max(result.size_max, _mul(rng.size_max, max(1, step.size_max)))
        return Estimate(lo, hi, 0, size_max)

    def _call(self, node: Any, scope: dict[str, Estimate]) -> Estimate:
        call = node.call_expr
        function = call.function
        args = list(call.args)
        target = call.target if call.HasField("target") else None
        parts = [self.estimate(a, scope) for a in args]
        tgt = self.estimate(target, scope) if target is not None else None
        everything = ([tgt] if tgt is not None else []) + parts
        if function in ("_&&_", "_||_"):
            return Estimate(
                parts[0].cost_min,
                _add(*(p.cost_max for p in parts)),
                1,
                1,
            )
        if function == "_?_:_":
            cond, yes, no = parts
            return Estimate(
                _add(cond.cost_min, min(yes.cost_min, no.cost_min)),
                _add(cond.cost_max, max(yes.cost_max, no.cost_max)),
                min(yes.size_min, no.size_min),
                max(yes.size_max, no.size_max),
            )
        base_lo = _add(*(p.cost_min for p in everything))
        base_hi = _add(*(p.cost_max for p in everything))
        ids = _overloads(self.ce, node)
        own, size = self._function(function, ids, node, target, tgt, args, parts)
        return Estimate(_add(base_lo, own[0]), _add(base_hi, own[1]), size[0], size[1])

    def _function(  # noqa: PLR0917 - the parts of one call, positionally as cel-go's
        self,
        function: str,
        ids: list[str],
        node: Any,
        target: Any,
        tgt: Estimate | None,
        args: list[Any],
        parts: list[Estimate],
    ) -> tuple[tuple[int, int], tuple[int, int]]:
        """(call cost range, result size range) of one function call."""
        one = ((1, 1), (0, 1))
        first = tgt if tgt is not None else (parts[0] if parts else None)
        if function in ("_[_]", "_[?_]"):
            return (1, 1), (0, _device_bound(node, self.ce))
        if function == "_+_" and first is not None and len(parts) >= 1:
            a = first
            b = parts[-1]
            kind = _type_name(self.ce, node)
            if kind in ("string", "bytes") or kind.startswith("list"):
                size = (_add(a.size_min, b.size_min), _add(a.size_max, b.size_max))
                if kind.startswith("list"):
                    return (1, 1), size
                return (
                    (_factor(size[0], _STRING_FACTOR), _factor(size[1], _STRING_FACTOR)),
                    size,
                )
            return one
        if function in ("_==_", "_!=_") and len(parts) == 2:
            lo = min(parts[0].size_min, parts[1].size_min)
            hi = min(parts[0].size_max, parts[1].size_max)
            types = {_type_name(self.ce, a) for a in args}
            if types & {
                "kubernetes.Quantity",
                "kubernetes.Semver",
                "net.IP",
                "net.CIDR",
                "kubernetes.URL",
            }:
                return (1, 1), (0, 1)
            return (_factor(lo, _STRING_FACTOR) or 1, _factor(hi, _STRING_FACTOR) or 1), (0, 1)
        if function in ("_<_", "_<=_", "_>_", "_>=_"):
            lo = min(parts[0].size_min, parts[1].size_min)
            hi = min(parts[0].size_max, parts[1].size_max)
            if {_type_name(self.ce, a) for a in args} & {"string", "bytes"}:
                return (_factor(lo, _STRING_FACTOR) or 1, _factor(hi, _STRING_FACTOR) or 1), (0, 1)
            return one
        if function == "@in" and len(parts) == 2:
            if _type_name(self.ce, args[1]).startswith("list"):
                return (parts[1].size_min or 1, parts[1].size_max or 1), (0, 1)
            return one
        if function in ("startsWith", "endsWith") and tgt is not None:
            return (_factor(tgt.size_min, _STRING_FACTOR), _factor(tgt.size_max, _STRING_FACTOR)), (
                0,
                1,
            )
        if function == "contains" and tgt is not None and parts:
            return (
                _mul(
                    _factor(tgt.size_min, _STRING_FACTOR),
                    _factor(parts[0].size_min, _STRING_FACTOR),
                ),
                _mul(
                    _factor(tgt.size_max, _STRING_FACTOR),
                    _factor(parts[0].size_max, _STRING_FACTOR),
                ),
            ), (0, 1)
        if function in ("matches", "find", "findAll", "@string_find_string") or (
            ids and ids[0].startswith("string_find")
        ):
            text = tgt if tgt is not None else parts[0]
            pattern = parts[0] if tgt is not None else parts[1]
            lo = _mul(
                _factor(1 + text.size_min, _STRING_FACTOR), _factor(pattern.size_min, _REGEX_FACTOR)
            )
            hi = _mul(
                _factor(1 + text.size_max, _STRING_FACTOR), _factor(pattern.size_max, _REGEX_FACTOR)
            )
            size = (0, 1) if function == "matches" else (0, text.size_max)
            return (lo, hi), size
        if function == "size":
            return one
        if (
            function in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf", "includes")
            and tgt is not None
        ):
            if _type_name(self.ce, target) == "string":
                return (
                    _factor(tgt.size_min, _STRING_FACTOR),
                    _factor(tgt.size_max, _STRING_FACTOR),
                ), (0, 1)
            element = _element_bound(target, self.ce, {})
            per = 1
            if _type_name(self.ce, target) in ("list(string)", "list(bytes)"):
                per = _add(1, _factor(element.size_max, _STRING_FACTOR))
            if function == "includes":
                return (1, _mul(64, per)), (0, 1)
            return (_mul(tgt.size_min, 1), _mul(tgt.size_max, per)), (0, element.size_max)
        if (
            function in ("lowerAscii", "upperAscii", "substring", "trim", "charAt", "reverse")
            and tgt is not None
        ):
            return (_factor(tgt.size_min, _STRING_FACTOR), _factor(tgt.size_max, _STRING_FACTOR)), (
                tgt.size_min,
                tgt.size_max,
            )
        if function == "replace" and tgt is not None and len(parts) >= 2:
            old, new = parts[0], parts[1]
            if old.size_min == 0:
                count = _add(tgt.size_max, 1)
            elif new.size_max <= old.size_min:
                count = 0
            else:
                count = _sat(math.ceil(tgt.size_max / old.size_min))
            size_max = _add(_mul(count, new.size_max), tgt.size_max)
            return (
                _factor(tgt.size_min, 2 * _STRING_FACTOR),
                _factor(tgt.size_max, 2 * _STRING_FACTOR),
            ), (0, size_max)
        if function == "split" and tgt is not None:
            return (
                _factor(tgt.size_min, 2 * _STRING_FACTOR),
                _factor(tgt.size_max, 2 * _STRING_FACTOR),
            ), (0, tgt.size_max)
        if function == "join" and tgt is not None:
            element = _element_bound(target, self.ce, {})
            joined = _mul(tgt.size_max, element.size_max)
            if parts:
                joined = _add(joined, _mul(max(tgt.size_max, 1) - 1, parts[0].size_max))
            return (0, _factor(joined, 2 * _STRING_FACTOR)), (0, joined)
        if function == "format" and tgt is not None:
            return (
                _factor(tgt.size_min, _STRING_FACTOR),
                UNBOUNDED if parts and parts[0].size_max else _factor(tgt.size_max, _STRING_FACTOR),
            ), (0, UNBOUNDED)
        if function == "strings.quote" and parts:
            return (
                _factor(parts[0].size_min, _STRING_FACTOR),
                _factor(parts[0].size_max, _STRING_FACTOR),
            ), (0, _add(_mul(parts[0].size_max, 2), 2))
        if (
            function
            in (
                "quantity",
                "isQuantity",
                "semver",
                "isSemver",
                "url",
                "isURL",
                "ip",
                "cidr",
                "isIP",
                "isCIDR",
            )
            and not tgt
            and parts
        ):
            return (
                _factor(parts[0].size_min, _STRING_FACTOR),
                _factor(parts[0].size_max, _STRING_FACTOR),
            ), (0, 1)
        if function == "ip.isCanonical" and parts:
            return (
                _factor(parts[0].size_min, 2 * _STRING_FACTOR),
                _factor(parts[0].size_max, 2 * _STRING_FACTOR),
            ), (0, 1)
        if function in ("containsIP", "containsCIDR") and tgt is not None and parts:
            c = _factor(2 * tgt.size_max, _STRING_FACTOR)
            if function == "containsCIDR":
                c = _add(c, _factor(tgt.size_max, _STRING_FACTOR), 1)
            if _type_name(self.ce, args[0]) == "string":
                c = _add(c, _factor(parts[0].size_max, _STRING_FACTOR))
            return (1, c), (0, 1)
        if function in ("sets.contains", "sets.equivalent", "sets.intersects") and len(parts) == 2:
            return (
                _mul(parts[0].size_min, parts[1].size_min),
                _mul(parts[0].size_max, parts[1].size_max),
            ), (0, 1)
        if function == "lists.range" and parts:
            return (1, _add(1, _max_literal_int(args[0]))), (0, _max_literal_int(args[0]))
        if (
            function in ("slice", "reverse", "distinct", "flatten", "sort", "@sortByAssociatedKeys")
            and tgt is not None
        ):
            per = (
                1
                if function not in ("distinct", "sort", "@sortByAssociatedKeys")
                else max(1, tgt.size_max)
            )
            grown = tgt.size_max if function != "flatten" else UNBOUNDED
            return (_mul(tgt.size_min, 1), _mul(tgt.size_max, per)), (0, grown)
        if function in ("string", "bytes") and parts:
            return (
                _factor(parts[0].size_min, _STRING_FACTOR),
                _factor(parts[0].size_max, _STRING_FACTOR),
            ), (parts[0].size_min, parts[0].size_max)
        return one


def _max_literal_int(node: Any) -> int:
    if node.WhichOneof("expr_kind") == "const_expr":
        const = node.const_expr
        if const.WhichOneof("constant_kind") == "int64_value":
            return max(0, int(const.int64_value))
    return UNBOUNDED


def _is_list(node: Any, checked_expr: Any) -> bool:
    return (
        _type_name(checked_expr, node).startswith("list")
        or node.WhichOneof("expr_kind") == "list_expr"
    )


def _device_bound(node: Any, checked_expr: Any) -> int:
    """Size bound of device data reached by *node* (UNBOUNDED for anything else)."""
    name = _device_map_name(node)
    if name is not None:
        return ATTRIBUTES_PER_DEVICE
    kind = node.WhichOneof("expr_kind")
    if kind == "ident_expr" and node.ident_expr.name == "device.driver":
        return DRIVER_SIZE
    if kind == "ident_expr" and node.ident_expr.name == "device.allowMultipleAllocations":
        return 1
    inner = None
    if kind == "call_expr" and node.call_expr.function in ("_[_]", "_[?_]"):
        inner = node.call_expr.args[0]
    elif kind == "select_expr":
        inner = node.select_expr.operand
    if inner is None:
        return UNBOUNDED
    if _device_map_name(inner) is not None:
        return ATTRIBUTES_PER_DEVICE  # a domain's map
    inner_map = _device_map_name_of_domain(inner)
    if inner_map == "attributes":
        return ATTRIBUTE_VALUE_SIZE  # one attribute value: a string or a list
    if inner_map == "capacity":
        return 1
    return UNBOUNDED


def _device_map_name_of_domain(node: Any) -> str | None:
    kind = node.WhichOneof("expr_kind")
    inner = None
    if kind == "call_expr" and node.call_expr.function in ("_[_]", "_[?_]"):
        inner = node.call_expr.args[0]
    elif kind == "select_expr" and not node.select_expr.test_only:
        inner = node.select_expr.operand
    return _device_map_name(inner) if inner is not None else None


def _element_bound(rng: Any, checked_expr: Any, scope: dict[str, Estimate]) -> Estimate:
    """Size of one element (list) or key (map) of a comprehension range."""
    kind = rng.WhichOneof("expr_kind")
    if kind == "list_expr":
        if not rng.list_expr.elements:
            return Estimate(0, 0, 0, 0)
        sizes = [_CostModel(checked_expr).estimate(e, scope) for e in rng.list_expr.elements]
        return Estimate(0, 0, min(s.size_min for s in sizes), max(s.size_max for s in sizes))
    if _device_map_name(rng) is not None:
        return Estimate(0, 0, 0, DOMAIN_SIZE)
    if _device_map_name_of_domain(rng) is not None:
        return Estimate(0, 0, 0, ID_SIZE)
    inner_map = _device_map_name_of_domain(
        rng.call_expr.args[0]
        if kind == "call_expr" and rng.call_expr.function in ("_[_]", "_[?_]")
        else rng.select_expr.operand
        if kind == "select_expr"
        else rng
    )
    if inner_map == "attributes":
        return Estimate(0, 0, 0, ATTRIBUTE_VALUE_SIZE)  # an element of a list attribute
    if kind == "ident_expr" and rng.ident_expr.name in scope:
        return Estimate(0, 0, 0, scope[rng.ident_expr.name].size_max)
    return Estimate(0, 0, 0, UNBOUNDED)


# --------------------------------------------------------------------------- instrumentation

#: How a CHARGE_FUNCTION call turns its two numbers into cost (driver.cel.cost's units).
CHARGE_SUM: Final = 0  # 0.1 x (a + b): concatenation, traversals
CHARGE_PRODUCT: Final = 1  # ceil(0.1 a) x ceil(0.1 b): contains
CHARGE_REGEX: Final = 2  # ceil(0.1 (1 + a)) x ceil(0.25 b): matches
CHARGE_ELEMENTS: Final = 3  # a: list membership, list functions, lists.range
CHARGE_MIN: Final = 4  # 0.1 x min(a, b): equality, ordering of strings and lists
CHARGE_PAIRS: Final = 5  # a x b: set operations


def charge_amount(rule: int, a: int, b: int) -> int:
    """The cost a CHARGE_FUNCTION call adds (upstream's runtime cost formulas)."""
    a, b = max(a, 0), max(b, 0)
    if rule == CHARGE_SUM:
        return math.ceil((a + b) * _STRING_FACTOR)
    if rule == CHARGE_PRODUCT:
        return math.ceil(a * _STRING_FACTOR) * math.ceil(b * _STRING_FACTOR)
    if rule == CHARGE_REGEX:
        return math.ceil((1 + a) * _STRING_FACTOR) * math.ceil(b * _REGEX_FACTOR)
    if rule == CHARGE_ELEMENTS:
        return a
    if rule == CHARGE_MIN:
        return max(1, math.ceil(min(a, b) * _STRING_FACTOR))
    return a * b


_SIZED: Final = ("string", "bytes", "list", "map")


def instrument(checked_expr: Any) -> Any:
    """A copy of the expression that charges the running meter: each comprehension
    iteration its body's minimum cost, and each size-dependent operation of the engine's
    own its cost from the actual sizes."""
    out = copy.deepcopy(checked_expr)
    model = _CostModel(checked_expr)
    counter = [0]
    _instrument(out, out.expr, model, counter)
    return out


def _instrument(ce: Any, node: Any, model: _CostModel, counter: list[int]) -> None:
    kind = node.WhichOneof("expr_kind")
    rule = _charge_rule(ce, node) if kind == "call_expr" else None
    for child in list(_children(node)):
        _instrument(ce, child, model, counter)
    if kind == "comprehension_expr":
        c = node.comprehension_expr
        if (
            c.iter_range.WhichOneof("expr_kind") == "list_expr"
            and not c.iter_range.list_expr.elements
        ):
            return  # cel.bind: no iterations
        per = max(
            1,
            _add(
                model.estimate(c.loop_condition, {}).cost_min,
                model.estimate(c.loop_step, {}).cost_min,
            ),
        )
        cond = copy.deepcopy(c.loop_condition)
        c.loop_condition.Clear()
        c.loop_condition.id = _fresh(counter)
        c.loop_condition.call_expr.function = "_&&_"
        c.loop_condition.call_expr.args.add().CopyFrom(
            _call(counter, TICK_FUNCTION, [_int(counter, per)])
        )
        c.loop_condition.call_expr.args.add().CopyFrom(cond)
        return
    if rule is None:
        return
    rule_id, sized = rule
    _wrap_charge(node, counter, rule_id, sized)


def _charge_rule(ce: Any, node: Any) -> tuple[int, list[tuple[int, bool]]] | None:
    """(rule, [(operand index, take size() of it?)]) for the engine's size-dependent calls;
    operand 0 is the target of a member call."""
    call = node.call_expr
    ids = _overloads(ce, node)
    oid = ids[0] if len(ids) == 1 else ""
    operands = ([call.target] if call.HasField("target") else []) + list(call.args)

    def sized(i: int) -> bool:
        return _type_name(ce, operands[i]).split("(")[0] in _SIZED

    if oid in ("add_string", "add_bytes", "add_list"):
        return CHARGE_SUM, [(0, True), (1, True)]
    if oid == "contains_string":
        return CHARGE_PRODUCT, [(0, True), (1, True)]
    if oid in ("starts_with_string", "ends_with_string", "string_to_bytes", "bytes_to_string"):
        return CHARGE_SUM, [(0, True)]
    if oid in ("matches_string", "matches"):
        return CHARGE_REGEX, [(0, True), (1, True)]
    if call.function == "@in" and len(operands) == 2 and sized(1):
        return CHARGE_ELEMENTS, [(1, True)]
    if call.function in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_") and all(
        sized(i) for i in (0, 1)
    ):
        return CHARGE_MIN, [(0, True), (1, True)]
    if call.function in ("sets.contains", "sets.equivalent", "sets.intersects"):
        return CHARGE_PAIRS, [(0, True), (1, True)]
    if call.function == "lists.range":
        return CHARGE_ELEMENTS, [(0, False)]
    if (
        call.function
        in ("slice", "reverse", "distinct", "sort", "@sortByAssociatedKeys", "flatten")
        and operands
        and sized(0)
    ):
        return CHARGE_ELEMENTS, [(0, True)]
    return None


def _fresh(counter: list[int]) -> int:
    counter[0] += 1
    return 1_000_000_000 + counter[0]


def _int(counter: list[int], value: int) -> Any:
    e = new_expr()
    e.id = _fresh(counter)
    e.const_expr.int64_value = min(value, 2**62)
    return e


def _ident(counter: list[int], name: str) -> Any:
    e = new_expr()
    e.id = _fresh(counter)
    e.ident_expr.name = name
    return e


def _call(counter: list[int], function: str, args: list[Any]) -> Any:
    e = new_expr()
    e.id = _fresh(counter)
    e.call_expr.function = function
    for a in args:
        e.call_expr.args.add().CopyFrom(a)
    return e


def _wrap_charge(
    node: Any, counter: list[int], rule: int, operands: list[tuple[int, bool]]
) -> None:
    """node := cel.bind(@o0, operand0, ... charge(rule, size(@o0), ...) ? node' : null)
    where node' reads the bound operands (each evaluated once)."""
    call = node.call_expr
    inner = copy.deepcopy(node)
    inner.id = _fresh(counter)
    inner_call = inner.call_expr
    refs: list[Any] = []
    binds: list[tuple[str, Any]] = []
    originals = ([inner_call.target] if inner_call.HasField("target") else []) + list(
        inner_call.args
    )
    for index, take_size in operands:
        operand = originals[index]
        name = f"@o{_fresh(counter)}"
        binds.append((name, copy.deepcopy(operand)))
        operand.Clear()
        operand.id = _fresh(counter)
        operand.ident_expr.name = name
        ref = _ident(counter, name)
        refs.append(_call(counter, "size", [ref]) if take_size else ref)
    while len(refs) < 2:
        refs.append(_int(counter, 0))
    gate = _call(counter, CHARGE_FUNCTION, [_int(counter, rule), refs[0], refs[1]])
    null = new_expr()
    null.id = _fresh(counter)
    null.const_expr.null_value = 0
    body = _call(counter, "_?_:_", [gate, inner, null])
    for name, value in reversed(binds):
        body = _bind(counter, name, value, body)
    del call  # the node is replaced in place
    node.CopyFrom(body)


def _bind(counter: list[int], name: str, value: Any, body: Any) -> Any:
    """cel.bind(name, value, body) as the comprehension the macro expands to."""
    e = new_expr()
    e.id = _fresh(counter)
    c = e.comprehension_expr
    c.iter_var = "#unused"
    c.iter_range.id = _fresh(counter)
    c.iter_range.list_expr.SetInParent()
    c.accu_var = name
    c.accu_init.CopyFrom(value)
    c.loop_condition.id = _fresh(counter)
    c.loop_condition.const_expr.bool_value = False
    c.loop_step.CopyFrom(_ident(counter, name))
    c.result.CopyFrom(body)
    return e

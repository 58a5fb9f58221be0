"""Rewrites of a checked expression that make cel-cpp answer as cel-go: optional results of the
named formats, and equality on Kubernetes' types (an error against another type)."""

from __future__ import annotations

import copy
from typing import Any, Final

from driver.cel import (
    checked,
    estimate,
)
from driver.cel.values import (
    CIDR_TYPE_NAME,
    FORMAT_TYPE_NAME,
    IP_TYPE_NAME,
    QUANTITY_TYPE_NAME,
    SEMVER_TYPE_NAME,
    URL_TYPE_NAME,
)

_OPTIONAL_RESULTS: Final = {"format-named", "format-validate"}


def fix_optional_types(checked_expr: Any) -> None:
    """Give the named-format calls (declared dyn) upstream's optional types in the checked
    AST, and ``value()`` / ``orValue()`` of them the type inside, for the cost estimate and
    the result-type check."""
    named = checked.optional_type(checked.message_type(FORMAT_TYPE_NAME))
    errors = checked.optional_type(checked.list_type(checked.string_type()))
    for node, _ in checked.post_order(checked_expr.expr):
        if node.WhichOneof("expr_kind") != "call_expr":
            continue
        ids = checked.overloads(checked_expr, node)
        call = node.call_expr
        if "format-named" in ids:
            checked_expr.type_map[node.id].CopyFrom(named)
        elif "format-validate" in ids:
            checked_expr.type_map[node.id].CopyFrom(errors)
        elif call.function in ("value", "orValue") and call.HasField("target"):
            held = checked_expr.type_map.get(call.target.id)
            if (
                held is not None
                and held.WhichOneof("type_kind") == "abstract_type"
                and held.abstract_type.name == "optional_type"
            ):
                inner = held.abstract_type.parameter_types[0]
                checked_expr.type_map[node.id].CopyFrom(inner)


def rewrite_optionals(checked_expr: Any) -> bool:
    """Wrap each named-format call: ``format.named(k)`` returns the format or null,
    ``f.validate(s)`` the list of errors; upstream returns optionals, built here in CEL:
    ``cel.bind(@r, call, @r == null ? optional.none() : optional.of(@r))`` (for validate:
    ``size(@r) == 0``)."""
    targets = [
        node
        for node, _ in checked.post_order(checked_expr.expr)
        if node.WhichOneof("expr_kind") == "call_expr"
        and _OPTIONAL_RESULTS & set(checked.overloads(checked_expr, node))
    ]
    new = checked.NodeFactory(checked_expr)
    for node in targets:
        validate = "format-validate" in checked.overloads(checked_expr, node)
        inner = copy.deepcopy(node)
        name = f"@r{new.fresh()}"
        if validate:
            empty = new.call("_==_", [new.call("size", [new.ident(name)]), new.int_node(0)])
        else:
            empty = new.call("_==_", [new.ident(name), new.null()])
        body = new.call(
            "_?_:_",
            [empty, new.call("optional.none", []), new.call("optional.of", [new.ident(name)])],
        )
        node.CopyFrom(new.bind(name, inner, body))
    return bool(targets)


# Kubernetes' own types, whose Equal upstream fails with "no such overload" on any other type.
_LIBRARY_TYPES: Final = (
    SEMVER_TYPE_NAME, QUANTITY_TYPE_NAME, IP_TYPE_NAME, CIDR_TYPE_NAME, URL_TYPE_NAME,
    FORMAT_TYPE_NAME,
)  # fmt: skip
NO_SUCH_OVERLOAD_FUNCTION: Final = "@biaxial.no_such_overload"
_MAY_HOLD_LIBRARY_VALUE: Final = frozenset({"dyn", "type_param", ""})


def rewrite_library_equality(checked_expr: Any) -> bool:
    """``L == R`` / ``L != R`` as cel-go evaluates them when L may be one of Kubernetes' types
    at run time (statically dyn, or such a type against a dyn R): ``L.Equal(R)`` is an error
    ("no such overload") unless R is of L's type or null, where cel-cpp's heterogeneous
    equality says false. Written in CEL, so that the usual case stays native::

        cel.bind(@l, L, cel.bind(@r, R,
            type(@l) in [<the types>] && type(@r) != type(@l) && type(@r) != null_type
                ? @biaxial.no_such_overload(@l, @r) : @l == @r))

    (lazy binds: L, then R, each evaluated once, as before; R's own error comes first, as
    upstream's). Only the comparison itself: a list's or map's equality and ``in`` ignore an
    element's error upstream, as cel-cpp does."""
    types = checked_expr.type_map
    targets = []
    for node, _ in checked.post_order(checked_expr.expr):
        call = node.call_expr
        if (
            node.WhichOneof("expr_kind") != "call_expr"
            or call.function not in ("_==_", "_!=_")
            or call.HasField("target")
            or len(call.args) != 2
        ):
            continue
        left, right = (estimate.type_info(types.get(a.id)) for a in call.args)
        left_library = left.kind == "struct" and left.name in _LIBRARY_TYPES
        if not (left_library or left.kind in _MAY_HOLD_LIBRARY_VALUE):
            continue
        if right.kind == "null" or call.args[1].const_expr.HasField("null_value"):
            continue
        if left_library and right.kind == "struct" and right.name == left.name:
            continue
        targets.append(node)
    new = checked.NodeFactory(checked_expr)
    for node in targets:
        call = node.call_expr
        l_name, r_name = f"@l{new.fresh()}", f"@r{new.fresh()}"
        left, right = copy.deepcopy(call.args[0]), copy.deepcopy(call.args[1])
        library = new.list_node([_type_ident(checked_expr, new, n) for n in _LIBRARY_TYPES])
        type_l = new.call("type", [new.ident(l_name)])
        condition = new.call("@in", [type_l, library])
        constant = right.WhichOneof("expr_kind") == "const_expr"
        if constant:  # a literal (not null): never of L's type, never an error
            r_value = right
        else:
            r_value = new.ident(r_name)
            type_r = new.call("type", [new.ident(r_name)])
            null_type = _type_ident(checked_expr, new, "null_type")
            condition = new.call(
                "_&&_",
                [
                    new.call(
                        "_&&_", [condition, new.call("_!=_", [type_r, copy.deepcopy(type_l)])]
                    ),
                    new.call("_!=_", [copy.deepcopy(type_r), null_type]),
                ],
            )
        compare = new.call(call.function, [new.ident(l_name), copy.deepcopy(r_value)])
        error = new.call(NO_SUCH_OVERLOAD_FUNCTION, [new.ident(l_name), copy.deepcopy(r_value)])
        body = new.call("_?_:_", [condition, error, compare])
        if not constant:
            body = new.bind(r_name, right, body)
        node.CopyFrom(new.bind(l_name, left, body))
    return bool(targets)


def _type_ident(checked_expr: Any, new: checked.NodeFactory, name: str) -> Any:
    """A type named as a value (``kubernetes.Semver``, ``null_type``), resolved by reference."""
    node = new.ident(name)
    checked_expr.reference_map[node.id].name = name
    return node

"""Reads, checks and rewrites the checked CEL AST that cel-expr-python serialises, for what the
engine binding needs and the engine does not offer:

* the attribute/capacity **domains** an expression names literally (:func:`literal_domains`);
* upstream's **compile-time rules** the engine lacks (:func:`validate`): homogeneous aggregate
  literals (``cel.ValidateHomogeneousAggregateLiterals``), constant regular expressions
  (``cel.ValidateRegexLiterals``), and the list members cel-cpp's lists extension has but
  upstream's version does not (``first``, ``last``);
* **renaming** library calls to the private names their implementations run under
  (:func:`rename_calls`);
* the **type** of a node as a coarse name (:func:`type_name`); the cost estimate
  (``driver.cel.estimate``) and the instrumentation (``driver.cel.instrument``) walk the same
  AST.

``Expression.serialize()`` returns a ``google.protobuf.Any`` holding a ``cel.expr.CheckedExpr``
(cel-spec ``proto/cel/expr/checked.proto`` / ``syntax.proto``). The message classes are built
here from a minimal descriptor with the published field numbers; fields this module does not
model are kept as unknown fields, so a rewritten expression round-trips through
:func:`serialize_checked` and the engine's ``deserialize``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, empty_pb2, message_factory

from driver.cel import strings as _strings

_F = descriptor_pb2.FieldDescriptorProto


# The subset of cel-spec's checked.proto / syntax.proto this module reads, with the published
# field numbers: (message, its parent or "", fields, oneofs). A field is (name, number, type,
# message type or "", repeated); a message type ".X" is ".cel.expr.X". cel.expr.Type keeps only
# the kinds the analyses read (the others stay unknown fields).
_FieldSpec = tuple[str, int, int, str, bool]
_MSG, _STR, _BOOL, _I64 = _F.TYPE_MESSAGE, _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_INT64
_I32, _U64, _DBL, _BYTES = _F.TYPE_INT32, _F.TYPE_UINT64, _F.TYPE_DOUBLE, _F.TYPE_BYTES
_EXPR, _EMPTY = ".Expr", ".google.protobuf.Empty"


def _scalar(name: str, number: int, kind: int, *, repeated: bool = False) -> _FieldSpec:
    return (name, number, kind, "", repeated)


def _message(name: str, number: int, type_name: str, *, repeated: bool = False) -> _FieldSpec:
    return (name, number, _MSG, type_name, repeated)


_SCHEMA: Final[tuple[tuple[str, str, tuple[_FieldSpec, ...], dict[str, set[int]]], ...]] = (
    (
        "Constant",
        "",
        (
            _scalar("null_value", 1, _I32),
            _scalar("bool_value", 2, _BOOL),
            _scalar("int64_value", 3, _I64),
            _scalar("uint64_value", 4, _U64),
            _scalar("double_value", 5, _DBL),
            _scalar("string_value", 6, _STR),
            _scalar("bytes_value", 7, _BYTES),
        ),
        {"constant_kind": {1, 2, 3, 4, 5, 6, 7}},
    ),
    ("Ident", "", (_scalar("name", 1, _STR),), {}),
    (
        "Select",
        "",
        (_message("operand", 1, _EXPR), _scalar("field", 2, _STR), _scalar("test_only", 3, _BOOL)),
        {},
    ),
    (
        "Call",
        "",
        (
            _message("target", 1, _EXPR),
            _scalar("function", 2, _STR),
            _message("args", 3, _EXPR, repeated=True),
        ),
        {},
    ),
    (
        "CreateList",
        "",
        (
            _message("elements", 1, _EXPR, repeated=True),
            _scalar("optional_indices", 2, _I32, repeated=True),
        ),
        {},
    ),
    (
        "Entry",
        "",
        (
            _scalar("id", 1, _I64),
            _scalar("field_key", 2, _STR),
            _message("map_key", 3, _EXPR),
            _message("value", 4, _EXPR),
            _scalar("optional_entry", 5, _BOOL),
        ),
        {},
    ),
    (
        "CreateStruct",
        "",
        (_scalar("message_name", 1, _STR), _message("entries", 2, ".Entry", repeated=True)),
        {},
    ),
    (
        "Comprehension",
        "",
        (
            _scalar("iter_var", 1, _STR),
            _message("iter_range", 2, _EXPR),
            _scalar("accu_var", 3, _STR),
            _message("accu_init", 4, _EXPR),
            _message("loop_condition", 5, _EXPR),
            _message("loop_step", 6, _EXPR),
            _message("result", 7, _EXPR),
            _scalar("iter_var2", 8, _STR),
        ),
        {},
    ),
    (
        "Expr",
        "",
        (
            _scalar("id", 2, _I64),
            _message("const_expr", 3, ".Constant"),
            _message("ident_expr", 4, ".Ident"),
            _message("select_expr", 5, ".Select"),
            _message("call_expr", 6, ".Call"),
            _message("list_expr", 7, ".CreateList"),
            _message("struct_expr", 8, ".CreateStruct"),
            _message("comprehension_expr", 9, ".Comprehension"),
        ),
        {"expr_kind": {3, 4, 5, 6, 7, 8, 9}},
    ),
    (
        "Reference",
        "",
        (
            _scalar("name", 1, _STR),
            _scalar("overload_id", 3, _STR, repeated=True),
            _message("value", 4, ".Constant"),
        ),
        {},
    ),
    (
        "Type",
        "",
        (
            _message("dyn", 1, _EMPTY),
            _scalar("null", 2, _I32),
            _scalar("primitive", 3, _I32),
            _scalar("wrapper", 4, _I32),
            _scalar("well_known", 5, _I32),
            _message("list_type", 6, ".Type.ListType"),
            _message("map_type", 7, ".Type.MapType"),
            _scalar("message_type", 9, _STR),
            _scalar("type_param", 10, _STR),
            _message("type", 11, ".Type"),
            _message("error", 12, _EMPTY),
            _message("abstract_type", 14, ".Type.AbstractType"),
        ),
        {"type_kind": {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 14}},
    ),
    ("ListType", "Type", (_message("elem_type", 1, ".Type"),), {}),
    ("MapType", "Type", (_message("key_type", 1, ".Type"), _message("value_type", 2, ".Type")), {}),
    (
        "AbstractType",
        "Type",
        (_scalar("name", 1, _STR), _message("parameter_types", 2, ".Type", repeated=True)),
        {},
    ),
    ("CheckedExpr", "", (_message("expr", 4, _EXPR),), {}),
)
# CheckedExpr's two maps: (field, number, value type), each keyed by int64 expression id.
_CHECKED_MAPS: Final = (("reference_map", 2, ".Reference"), ("type_map", 3, ".Type"))


def _add_fields(msg: Any, fields: tuple[_FieldSpec, ...]) -> None:
    for name, number, kind, type_name, repeated in fields:
        field = msg.field.add(
            name=name,
            number=number,
            type=kind,
            label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
        )
        if type_name:
            field.type_name = type_name if type_name == _EMPTY else f".cel.expr{type_name}"


def _build_classes() -> dict[str, Any]:
    """Message classes for CheckedExpr, Expr and Type, from :data:`_SCHEMA`."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="biaxial/cel_expr_subset.proto", package="cel.expr", syntax="proto3"
    )
    built: dict[str, Any] = {}
    for name, parent, fields, oneofs in _SCHEMA:
        msg = (built[parent].nested_type if parent else fdp.message_type).add(name=name)
        _add_fields(msg, fields)
        for oneof, numbers in oneofs.items():
            index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=oneof)
            for field in msg.field:
                if field.number in numbers:
                    field.oneof_index = index
        built[name] = msg
    checked = built["CheckedExpr"]
    for name, number, value_type in _CHECKED_MAPS:
        entry = checked.nested_type.add(name=f"{name.title().replace('_', '')}Entry")
        _add_fields(entry, (_scalar("key", 1, _I64), _message("value", 2, value_type)))
        entry.options.map_entry = True
        field = checked.field.add(name=name, number=number, type=_MSG, label=_F.LABEL_REPEATED)
        field.type_name = f".cel.expr.CheckedExpr.{entry.name}"
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


# Nested protobuf messages a parser accepts (upb's and the C++ runtime's default limit is 100).
TYPE_DEPTH_LIMIT: Final = 80


def flatten_deep_types(serialized: bytes) -> bytes:
    """*serialized* (an ``Any`` holding a checked expression) with every type in its type map
    that nests deeper than protobuf parsers accept (a list of lists ... 40 levels deep) written
    as ``dyn``: the expression itself can be hoisted shallow (driver.cel.deep), its types
    cannot. Works on the wire format, which has no depth limit."""
    wrapper = any_pb2.Any.FromString(serialized)
    checked_descriptor = _CLASSES["CheckedExpr"].DESCRIPTOR
    type_map = checked_descriptor.fields_by_name["type_map"]
    entry = type_map.message_type
    value_field = entry.fields_by_name["value"].number
    dyn = _CLASSES["Type"]()
    dyn.dyn.SetInParent()
    out = bytearray()
    changed = False
    for number, wire, start, end, body in _fields(wrapper.value):
        if number == type_map.number and wire == 2:
            parts = list(_fields(body))
            value = next((b for n, w, _, _, b in parts if n == value_field and w == 2), b"")
            if _depth(value, entry.fields_by_name["value"].message_type) > TYPE_DEPTH_LIMIT:
                kept = b"".join(
                    body[s:e] for n, _, s, e, _ in parts if n != value_field
                ) + _field_bytes(value_field, dyn.SerializeToString())
                out += _field_bytes(number, kept)
                changed = True
                continue
        out += wrapper.value[start:end]
    if not changed:
        return serialized
    wrapper.value = bytes(out)
    return wrapper.SerializeToString()


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(field number, wire type, start, end, payload of a length-delimited field) of each
    field of a serialised message."""
    at = 0
    while at < len(data):
        start = at
        tag, at = _varint(data, at)
        wire = tag & 7
        body = b""
        if wire == 0:
            _, at = _varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            size, at = _varint(data, at)
            body = data[at : at + size]
            at += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield tag >> 3, wire, start, at, body


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _depth(data: bytes, descriptor: Any) -> int:
    """How deeply the messages in *data* (a *descriptor* message) nest: 1 for a flat one."""
    deepest = 1
    stack = [(data, descriptor, 1)]
    while stack:
        body, message, level = stack.pop()
        deepest = max(deepest, level)
        for number, wire, _, _, payload in _fields(body):
            field = message.fields_by_number.get(number)
            if wire == 2 and field is not None and field.message_type is not None:
                stack.append((payload, field.message_type, level + 1))
    return deepest


def serialize_checked(checked_expr: Any) -> bytes:
    """The ``google.protobuf.Any`` bytes the engine's ``deserialize`` reads."""
    wrapper = any_pb2.Any()
    wrapper.type_url = "type.googleapis.com/cel.expr.CheckedExpr"
    wrapper.value = checked_expr.SerializeToString()
    return wrapper.SerializeToString()


def new_expr() -> Any:
    """An empty ``cel.expr.Expr`` node."""
    return _CLASSES["Expr"]()


def message_type(name: str) -> Any:
    """A ``cel.expr.Type`` for a message type."""
    t = _CLASSES["Type"]()
    t.message_type = name
    return t


def list_type(element: Any) -> Any:
    t = _CLASSES["Type"]()
    t.list_type.elem_type.CopyFrom(element)
    return t


def string_type() -> Any:
    t = _CLASSES["Type"]()
    t.primitive = 5  # STRING
    return t


def optional_type(inner: Any) -> Any:
    """``optional_type(inner)``, as cel-cpp's checker writes it."""
    t = _CLASSES["Type"]()
    t.abstract_type.name = "optional_type"
    t.abstract_type.parameter_types.add().CopyFrom(inner)
    return t


class NodeFactory:
    """Builds new nodes for a rewritten expression, with ids above every id in it. A new
    node has no entry in the reference map, so the runtime resolves it by name."""

    def __init__(self, checked_expr: Any) -> None:
        self.next_id = max((n.id for n in walk(checked_expr.expr)), default=0)

    def fresh(self) -> int:
        self.next_id += 1
        return self.next_id

    def node(self) -> Any:
        e = new_expr()
        e.id = self.fresh()
        return e

    def ident(self, name: str) -> Any:
        e = self.node()
        e.ident_expr.name = name
        return e

    def int_node(self, value: int) -> Any:
        e = self.node()
        e.const_expr.int64_value = value
        return e

    def null(self) -> Any:
        e = self.node()
        e.const_expr.null_value = 0
        return e

    def call(self, function: str, args: list[Any]) -> Any:
        e = self.node()
        e.call_expr.function = function
        for a in args:
            e.call_expr.args.add().CopyFrom(a)
        return e

    def list_node(self, elements: list[Any]) -> Any:
        e = self.node()
        e.list_expr.SetInParent()
        for element in elements:
            e.list_expr.elements.add().CopyFrom(element)
        return e

    def bind(self, name: str, value: Any, body: Any) -> Any:
        """cel.bind(name, value, body) as the comprehension the macro expands to (lazy)."""
        e = self.node()
        c = e.comprehension_expr
        c.iter_var = "#unused"
        c.iter_range.CopyFrom(self.list_node([]))
        c.accu_var = name
        c.accu_init.CopyFrom(value)
        c.loop_condition.id = self.fresh()
        c.loop_condition.const_expr.bool_value = False
        c.loop_step.CopyFrom(self.ident(name))
        c.result.CopyFrom(body)
        return e


def children(node: Any) -> Iterator[Any]:
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
        stack.extend(children(node))
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


def walk(root: Any) -> Iterator[Any]:
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


def overloads(checked_expr: Any, node: Any) -> list[str]:
    ref = checked_expr.reference_map.get(node.id)
    return list(ref.overload_id) if ref is not None else []


def type_name(checked_expr: Any, node: Any) -> str:
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


def validate(checked_expr: Any, regex_problem: Callable[[str, str], str | None]) -> str | None:
    """The first of upstream's compile-time rules the expression breaks (innermost first, as
    cel-go's checker reports them), or None."""
    for node, exempt in post_order(checked_expr.expr):
        kind = node.WhichOneof("expr_kind")
        if kind == "list_expr" and not exempt:
            optional = set(node.list_expr.optional_indices)
            problem = _homogeneous(
                checked_expr,
                [(e, i in optional) for i, e in enumerate(node.list_expr.elements)],
            )
            if problem:
                return problem
        elif kind == "struct_expr" and not node.struct_expr.message_name and not exempt:
            entries = node.struct_expr.entries
            problem = _homogeneous(checked_expr, [(e.map_key, False) for e in entries]) or (
                _homogeneous(checked_expr, [(e.value, e.optional_entry) for e in entries])
            )
            if problem:
                return problem
        elif kind == "call_expr":
            call = node.call_expr
            ids = overloads(checked_expr, node)
            if "string_format" in ids:
                problem = _format_problem(checked_expr, call)
                if problem:
                    return problem
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
                    problem = regex_problem(call.function, pattern.const_expr.string_value)
                    if problem:
                        return problem
    return None


# What each string.format clause accepts, by the kind of the argument's checked type (cel-go's
# stringFormatChecker; a dyn argument passes).
_FORMAT_KINDS: Final = {
    "d": ("int", "uint"),
    "f": ("double", "string"),
    "e": ("double", "string"),
    "b": ("int", "uint", "bool"),
    "x": ("int", "uint", "string", "bytes"),
    "X": ("int", "uint", "string", "bytes"),
    "o": ("int", "uint"),
}
_FORMAT_ERRORS: Final = {
    "s": "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists,"
    " types, durations, and timestamps",
    "d": "decimal clause can only be used on integers",
    "f": "fixed-point clause can only be used on doubles",
    "e": "scientific clause can only be used on doubles",
    "b": "only integers and bools can be formatted as binary",
    "x": "only integers, byte buffers, and strings can be formatted as hex",
    "X": "only integers, byte buffers, and strings can be formatted as hex",
    "o": "octal clause can only be used on integers",
}
_STRING_KINDS: Final = frozenset(
    {"list", "map", "int", "uint", "double", "bool", "string", "timestamp", "bytes", "duration",
     "type", "null", "dyn"}
)  # fmt: skip


def _format_problem(checked_expr: Any, call: Any) -> str | None:
    """cel-go's stringFormatValidator (strings extension, version 1 and up): a constant
    format string applied to a list literal is checked when the expression is compiled."""
    target = call.target
    if (
        target.WhichOneof("expr_kind") != "const_expr"
        or target.const_expr.WhichOneof("constant_kind") != "string_value"
        or len(call.args) != 1
        or call.args[0].WhichOneof("expr_kind") != "list_expr"
    ):
        return None
    args = list(call.args[0].list_expr.elements)

    def clause(verb: str, precision: int | None, index: int) -> str:
        del precision
        bad = _bad_format_arg(checked_expr, args[index], verb)
        if bad is not None:
            raise _strings.FormatError(
                f"error during formatting: {_FORMAT_ERRORS[verb]}, was given {bad}"
            )
        return ""

    used = [0]

    def counting(verb: str, precision: int | None, index: int) -> str:
        used[0] = index + 1
        return clause(verb, precision, index)

    try:
        _strings.parse_format(target.const_expr.string_value, counting, len(args), checking=True)
    except _strings.FormatError as exc:
        return str(exc)
    if len(args) > used[0]:
        return f"too many arguments supplied to string.format (expected {used[0]}, got {len(args)})"
    return None


def _bad_format_arg(checked_expr: Any, node: Any, verb: str) -> str | None:
    """The cel-go type name of *node* when the clause cannot take it, else None."""
    kind = _kind(checked_expr, node)
    if kind == "dyn":
        return None
    if verb != "s":
        return None if kind in _FORMAT_KINDS[verb] else _go_type_name(checked_expr, node)
    if kind not in _STRING_KINDS:
        return _go_type_name(checked_expr, node)
    element_kind = node.WhichOneof("expr_kind")
    if element_kind == "list_expr":
        for element in node.list_expr.elements:
            bad = _bad_format_arg(checked_expr, element, "s")
            if bad is not None:
                return bad
    elif element_kind == "struct_expr" and not node.struct_expr.message_name:
        for entry in node.struct_expr.entries:
            for part in (entry.map_key, entry.value):
                bad = _bad_format_arg(checked_expr, part, "s")
                if bad is not None:
                    return bad
    return None


def _kind(checked_expr: Any, node: Any) -> str:
    name = type_name(checked_expr, node)
    return name.split("(", 1)[0] if "(" in name else name


def _go_type_name(checked_expr: Any, node: Any) -> str:
    kind = _kind(checked_expr, node)
    return {
        "null": "null_type",
        "duration": "google.protobuf.Duration",
        "timestamp": "google.protobuf.Timestamp",
    }.get(kind, kind)


# Calls whose literal arguments the homogeneous-literal rule exempts (cel-go's strings
# extension exempts ``format``; ``cel.@block`` is cel-go's own).
_EXEMPT_FROM_HOMOGENEOUS: Final = frozenset({"format", "cel.@block"})


def post_order(root: Any) -> Iterator[tuple[Any, bool]]:
    """Every node after its children, left to right, with whether an enclosing call exempts
    it from the homogeneous-literal rule."""
    stack: list[tuple[Any, bool, bool]] = [(root, False, False)]
    while stack:
        node, exempt, expanded = stack.pop()
        if expanded:
            yield node, exempt
            continue
        stack.append((node, exempt, True))
        inner = exempt or (
            node.WhichOneof("expr_kind") == "call_expr"
            and node.call_expr.function in _EXEMPT_FROM_HOMOGENEOUS
        )
        stack.extend((child, inner, False) for child in reversed(list(children(node))))


def _homogeneous(checked_expr: Any, elements: list[tuple[Any, bool]]) -> str | None:
    """cel-go's homogeneous aggregate literal rule: every element has a type equivalent to the
    first one's (an optional element counts with the type it holds)."""
    first = ""
    for element, optional in elements:
        explicit_dyn = (
            element.WhichOneof("expr_kind") == "call_expr" and element.call_expr.function == "dyn"
        )
        name = "dyn" if explicit_dyn else type_name(checked_expr, element)
        if optional and name.startswith("optional_type(") and name.endswith(")"):
            name = name[len("optional_type(") : -1]
        if not first:
            first = name
        elif name != first:
            return f"expected type '{first}' but found '{name}'"
    return None


# --------------------------------------------------------------------------- renaming


def rename_calls(
    checked_expr: Any, resolve: Callable[[str, list[str], int, bool], str | None]
) -> bool:
    """Rename every call *resolve* maps (function, overload ids, arity, member) to a private
    name; True if anything changed."""
    changed = False
    for node in walk(checked_expr.expr):
        if node.WhichOneof("expr_kind") != "call_expr":
            continue
        call = node.call_expr
        member = call.HasField("target")
        arity = len(call.args) + (1 if member else 0)
        name = resolve(call.function, overloads(checked_expr, node), arity, member)
        if name is not None and name != call.function:
            call.function = name
            changed = True
    return changed

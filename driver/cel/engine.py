"""The DRA CEL engine: device selectors with upstream semantics
(k8s.io/dynamic-resource-allocation/cel, the newest environment version), on cel-expr-python
(Google's C++ CEL).

Contract
--------
* :func:`compile_selector` compiles once per expression string (LRU cache) and raises
  :class:`~driver.api.errors.CELCompileError` for syntax and type errors (with the position, e.g.
  ``<input>:1:8: Syntax error: ...``), for expressions longer than
  :data:`MAX_EXPRESSION_LENGTH` bytes, when the result type is statically known not to be
  bool, and for upstream's compile-time rules: mixed-type list or map literals (homogeneous
  aggregate literals), an invalid constant regular expression, a ``string.format`` whose
  constant format does not fit its arguments, nesting past upstream's parser limit (250).
  :attr:`Selector.max_cost` is the static cost estimate in upstream's units
  (``driver.cel.estimate``): what the API server checks when a selector is written
  (the API emulator does the same); evaluation does not refuse on it.
* :meth:`Selector.matches` evaluates against one device and returns the bool result. Every
  runtime problem (no such key, no matching overload, a non-bool result, an invalid version
  attribute, the actual-cost limit, any engine failure) raises
  :class:`~driver.api.errors.CELEvaluationError` naming the expression and the device:
  upstream treats these as errors for the pod, never as "does not match".
* Runtime bound: an evaluation whose static estimate (and the engine's own work estimate,
  ``driver.cel.estimate``) is within :data:`COST_LIMIT` runs as is (its actual cost cannot pass
  the limit). Any other runs *metered*: instrumented (``driver.cel.instrument``) to count
  upstream's actual cost exactly as it runs, cancelled at :data:`COST_LIMIT` ("operation
  cancelled: actual cost limit exceeded", as upstream), at the engine's work limit
  (``driver.cel.cost``), or at the deadline (below). Where cel-cpp's budget of 10,000
  comprehension iterations per evaluation stops an evaluation, it runs again with its
  comprehensions driven from Python in chunks (``driver.cel.drive``), so only the cost
  bounds it, as upstream. :func:`measure` reports the estimate and the actual cost of one
  evaluation.
* Deadline: inside a ``driver.cel.cost.limits(deadline=...)`` block an evaluation that starts
  after the deadline, or a metered one that is running when it passes, raises
  :class:`~driver.api.errors.DeadlineExceededError`, which is not a CELEvaluationError: it is
  never cached and ends the caller's whole operation. Selectors estimated above
  :data:`DEADLINE_METERING_FROM` run instrumented while a deadline is set (for the deadline
  only, when their cost cannot pass the limit), so a long one stops within one step of the
  deadline; cheaper ones are checked before they start.
* :class:`MatchCache` caches results and errors per (expression, device, slice generation) and
  builds each device's CEL input once; a deadline is not cached (it passes through).
  Everything else here is pure and immutable.

The ``device`` variable
-----------------------
``device.driver`` (string), ``device.attributes`` (map domain -> map id -> value),
``device.capacity`` (map domain -> map id -> quantity), ``device.allowMultipleAllocations``
(bool). Unqualified keys live under the driver name's domain; ``a.io/b`` under ``a.io``.
Attribute values: int, bool, string, version -> ``kubernetes.Semver``, lists -> CEL lists.

The environment
---------------
As upstream's newest: the standard library with cross-type numeric comparisons (``1.5 > 1``),
optional types, ``cel.bind``, two-variable comprehensions (``all``, ``exists``, ``existsOne``,
``transformList``, ``transformMap``, ``transformMapEntry``), cel-go's lists extension at
version 3 (``slice``, ``flatten``, ``lists.range``, ``distinct``, ``reverse``, ``sort``,
``sortBy``), the sets extension, the strings extension at version 2 (``driver.cel.strings``),
and Kubernetes' libraries: quantity, semver, lists (``isSorted``, ``sum``, ``min``, ``max``,
``indexOf``, ``lastIndexOf``, ``includes``), regex (``find``, ``findAll``), IP, CIDR and URL
(``driver.cel.network``).

Where cel-expr-python cannot express something natively, and the differences that remain
----------------------------------------------------------------------------------------
* **Object type.** Upstream declares ``device`` as the object type ``kubernetes.DRADevice``.
  Here its four fields are four variables with dotted names (``device.driver`` ...), which CEL
  name resolution reads exactly like field selections, fully typed: ``device.driver + 1`` and
  ``device.nosuchfield`` are compile errors as upstream. A bare ``device`` (not a field of it)
  does not resolve, and ``has(device.driver)`` yields the variable rather than ``true``
  (a compile error for the string fields, the value for ``allowMultipleAllocations``).
* **Library value types.** The engine has no opaque runtime types, so quantities, versions,
  IPs, CIDRs, URLs and named formats are protobuf messages (upstream's type names
  ``kubernetes.Quantity``, ``kubernetes.Semver``, ``net.IP``, ``net.CIDR``, ``kubernetes.URL``,
  ``kubernetes.NamedFormat``) from a private descriptor pool, carrying the exact value, so
  ``==`` means equal value as upstream. Their one field is visible to field selection, which
  upstream does not offer. ``L == R`` / ``L != R`` where L may hold one of them at run time
  (dyn, or the type against a dyn) is rewritten in CEL to fail with "no such overload" when R
  is of another type and not null, as their ``Equal`` does upstream
  (:func:`_rewrite_library_equality`); a list's or map's equality, which upstream counts as
  equal where an element comparison errs, is false here.
* **Library functions** run in Python. The runtime keeps one implementation per name and
  argument kinds, so every overload of a library function is renamed in the checked expression
  to a private name with its own implementation and return type (``_RUNTIME_NAMES``).
* **Unknown domains.** Upstream returns an empty map for any domain the device does not have.
  The C++ maps cannot default, so every domain the expression names *literally*
  (``device.attributes["x.io"]``, ``.?x``, ``cel.bind`` of it) that the device lacks is added
  as an empty map to that evaluation's input. A domain computed at run time
  (``device.attributes["x" + ".io"]``) that the device lacks is a "no such key" error, and a
  literally named missing domain shows up in ``in``, ``size()`` and iteration over
  ``device.attributes``, where upstream would not list it.
* **Parser nesting.** cel-cpp's parser stops at 32 levels (no option for it), upstream's at 250.
  An expression past 32 is parsed by biaxial (``driver.cel.syntax``, upstream's two depth
  measures and errors past 250), hoisted into lazy ``cel.bind`` values for cel-cpp to check,
  inlined back, and hoisted again where too deep for cel-expr-python to load
  (``driver.cel.deep``): same value, order, errors and costs. What remains: a compile error in
  such an expression has no position; types nested past protobuf's limit (lists of lists
  about 40 deep) are read as dyn, so a homogeneous-literal mismatch that deep goes unseen;
  a metered expression with comprehensions nested about 15 deep cannot be loaded (a compile
  error).
* **Comprehensions past 10,000 iterations** run driven from Python (``driver.cel.drive``): the
  values a loop carries pass through Python, so a uint there becomes an int, and an optional
  or a type cannot pass (an evaluation error).
* **Regular expressions.** ``matches`` runs cel-cpp's RE2 and ``find`` / ``findAll`` the same
  RE2 through its Python binding (google-re2): RE2 syntax and linear time, as Go's regexp
  upstream. RE2's error wording is mapped to Go's.
* **Named formats** (``format.named``, ``format.dns1123Label()`` ... ``.validate()``) return
  optionals as upstream: the Python functions return the format or null, the error list or
  an empty one, and :func:`_rewrite_optionals` wraps each call in CEL.
* **Messages.** cel-cpp words some compile errors its own way: a call with a wrong number of
  arguments is an "undeclared reference", a two-variable macro's misuse is "all() second
  variable must be different from the first variable" and the like (the conformance cases
  assert cel-cpp's words).
* **Copies.** cel-cpp copies a list when it concatenates one (and a comprehension's list
  accumulator as it grows) and the runtime helper of ``transformMap`` copies the map, where
  cel-go shares them: such an evaluation is metered and cancelled after 5,000,000 copied
  elements ("evaluation work limit exceeded"), so a list-doubling expression upstream accepts
  at a small cost, or a ``map`` over thousands of elements, can be cancelled here.
* The ``first()`` / ``last()`` list members of cel-cpp's lists extension, which upstream's
  version lacks, are compile errors.

Where the result differs from upstream's, the conformance table (``tests/unit/cel_cases/``)
has a case with an ``upstream`` note; cel-python's outcome there is asserted too.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

from cel_expr_python import cel
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from driver.api.errors import CELCompileError, CELEvaluationError, DeadlineExceededError
from driver.api.ids import DeviceID
from driver.api.model import AttributeValue, Device, Version
from driver.api.quantity import Quantity
from driver.cel import (
    checked,
    cost,
    deep,
    drive,
    estimate,
    formats,
    instrument,
    library,
    network,
    strings,
    syntax,
)
from driver.cel.reads import readable_keys, visible

MAX_EXPRESSION_LENGTH: Final = 10 * 1024  # bytes, upstream CELSelectorExpressionMaxLength
COST_LIMIT: Final = cost.COST_LIMIT  # upstream CELSelectorExpressionMaxCost
#: A selector estimated above this also gets an instrumented program, run while a deadline is
#: set, so the deadline stops it within one step rather than one evaluation.
DEADLINE_METERING_FROM: Final = 10_000
COMPILE_CACHE_SIZE: Final = 1024

QUANTITY_TYPE_NAME: Final = "kubernetes.Quantity"
SEMVER_TYPE_NAME: Final = "kubernetes.Semver"
IP_TYPE_NAME: Final = "net.IP"
CIDR_TYPE_NAME: Final = "net.CIDR"
URL_TYPE_NAME: Final = "kubernetes.URL"
FORMAT_TYPE_NAME: Final = "kubernetes.NamedFormat"

# --------------------------------------------------------------------------- value types


def _build_value_types() -> tuple[Any, dict[str, type[Any]]]:
    string = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    pool = descriptor_pool.DescriptorPool()
    layout = {
        "kubernetes": (
            ("Quantity", "nanos"),
            ("Semver", "version"),
            ("URL", "value"),
            ("NamedFormat", "name"),
        ),
        "net": (("IP", "value"), ("CIDR", "value")),
    }
    for package, messages in layout.items():
        fdp = descriptor_pb2.FileDescriptorProto(
            name=f"biaxial/{package}_cel_types.proto", package=package, syntax="proto3"
        )
        for name, field_name in messages:
            msg = fdp.message_type.add(name=name)
            msg.field.add(name=field_name, number=1, type=string, label=optional)
        pool.Add(fdp)
    classes = {
        full: message_factory.GetMessageClass(pool.FindMessageTypeByName(full))
        for full in (
            QUANTITY_TYPE_NAME,
            SEMVER_TYPE_NAME,
            IP_TYPE_NAME,
            CIDR_TYPE_NAME,
            URL_TYPE_NAME,
            FORMAT_TYPE_NAME,
        )
    }
    return pool, classes


_POOL, _CLASSES = _build_value_types()
_QuantityMsg = _CLASSES[QUANTITY_TYPE_NAME]
_SemverMsg = _CLASSES[SEMVER_TYPE_NAME]
_IPMsg = _CLASSES[IP_TYPE_NAME]
_CIDRMsg = _CLASSES[CIDR_TYPE_NAME]
_URLMsg = _CLASSES[URL_TYPE_NAME]
_FormatMsg = _CLASSES[FORMAT_TYPE_NAME]


def quantity_value(quantity: Quantity) -> Any:
    """A quantity as the CEL engine's ``kubernetes.Quantity`` value."""
    return _QuantityMsg(nanos=str(quantity.nanos))


def _semver_value(version: library.Semver) -> Any:
    return _SemverMsg(version=version.precedence_text)


@lru_cache(maxsize=4096)
def _quantity_literal(text: str) -> Any:
    """``quantity(s)``; memoised (selectors call it with the same literal on every device).
    The engine copies the message, so sharing one is safe."""
    return quantity_value(library.parse_quantity(text))


def _quantity_of(text: str) -> Any:
    cost.charge_traversal(len(text))
    return _quantity_literal(text)


@lru_cache(maxsize=4096)
def _semver_literal(text: str, normalize: bool = False) -> Any:
    """``semver(s[, normalize])``; memoised like :func:`_quantity_literal`."""
    return _semver_value(library.parse_semver(text, normalize))


def _semver_of(text: str, normalize: bool = False) -> Any:
    cost.charge_traversal(len(text))
    return _semver_literal(text, normalize)


def _type_name(value: Any) -> str:
    for name, cls in _CLASSES.items():
        if isinstance(value, cls):
            return name
    return type(value).__name__


def _to_quantity(msg: Any) -> Quantity:
    # Attribute values are dyn, so a Semver can reach a quantity member at run time.
    if not isinstance(msg, _QuantityMsg):
        raise library.CELFunctionError(f"no such overload: {_type_name(msg)} is not a quantity")
    return Quantity(int(msg.nanos))


def _to_semver(msg: Any) -> library.Semver:
    if not isinstance(msg, _SemverMsg):
        raise library.CELFunctionError(f"no such overload: {_type_name(msg)} is not a semver")
    return library.parse_semver(msg.version)


# --------------------------------------------------------------------------- library bindings


def _compare(receiver: Any, other: Any) -> int:
    """``compareTo`` of two quantities or two versions."""
    cost.charge(1)
    if isinstance(receiver, _QuantityMsg) and isinstance(other, _QuantityMsg):
        return _to_quantity(receiver).compare(_to_quantity(other))
    if isinstance(receiver, _SemverMsg) and isinstance(other, _SemverMsg):
        return _to_semver(receiver).compare(_to_semver(other))
    raise library.CELFunctionError(
        f"no such overload: {_type_name(receiver)} compared with {_type_name(other)}"
    )


def _add(receiver: Any, other: Any) -> Any:
    cost.charge(1)
    if isinstance(other, int):
        return quantity_value(library.quantity_add_int(_to_quantity(receiver), other))
    return quantity_value(_to_quantity(receiver) + _to_quantity(other))


def _sub(receiver: Any, other: Any) -> Any:
    cost.charge(1)
    if isinstance(other, int):
        return quantity_value(library.quantity_sub_int(_to_quantity(receiver), other))
    return quantity_value(_to_quantity(receiver) - _to_quantity(other))


def _equal(a: Any, b: Any) -> bool:
    """CEL equality of two library values (same message type and text) or plain values."""
    if type(a) is not type(b) and not (isinstance(a, int | float) and isinstance(b, int | float)):
        return False
    return bool(a == b)


def _includes(receiver: Any, value: Any) -> bool:
    """``includes()``: membership for a list attribute, equality for a scalar one, so one
    selector works whether a driver publishes a value or a list (DRAListTypeAttributes)."""
    cost.charge(1)  # upstream's runtime charges includes as any call
    if isinstance(receiver, list):
        if len(receiver) > estimate.INCLUDES_BOUND:  # ResourceSliceMaxAttributeValuesPerDevice
            raise library.CELFunctionError(
                "'includes' function cannot be applied to lists longer than "
                f"{estimate.INCLUDES_BOUND} values"
            )
        return any(_equal(item, value) for item in receiver)
    return _equal(receiver, value)


def _comparable(items: list[Any], function: str) -> list[Any]:
    kinds = {type(i) for i in items}
    if len(kinds) > 1 and not kinds <= {int, float}:
        raise library.CELFunctionError(f"no such overload: {function} on mixed element types")
    if any(isinstance(i, dict | list) or hasattr(i, "DESCRIPTOR") for i in items):
        raise library.CELFunctionError(f"no such overload: {function} on incomparable values")
    return items


def _is_sorted(items: list[Any]) -> bool:
    cost.charge(library.traversal_cost(items))
    values = _comparable(items, "isSorted")
    return all(a <= b for a, b in itertools.pairwise(values))


def _sum(kind: str, zero: Any) -> Callable[[list[Any]], Any]:
    def total(items: list[Any]) -> Any:
        cost.charge(library.traversal_cost(items))
        result = sum(items, zero)
        if kind == "int":
            library.check_int64(result)
        elif kind == "uint" and not 0 <= result < 2**64:
            raise library.CELFunctionError("unsigned integer overflow")
        return result

    return total


def _min_max(function: str, pick: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    def extreme(items: list[Any]) -> Any:
        cost.charge(library.traversal_cost(items))
        if not items:
            raise library.CELFunctionError(f"{function} called on empty list")
        return pick(_comparable(items, function))

    return extreme


def _list_index_of(items: list[Any], value: Any) -> int:
    cost.charge(library.traversal_cost(items))
    return next((i for i, item in enumerate(items) if _equal(item, value)), -1)


def _list_last_index_of(items: list[Any], value: Any) -> int:
    cost.charge(library.traversal_cost(items))
    for i in range(len(items) - 1, -1, -1):
        if _equal(items[i], value):
            return i
    return -1


def _map_insert(mapping: dict[Any, Any], key: Any, value: Any = None) -> dict[Any, Any]:
    """``cel.@mapInsert`` of two-variable comprehensions (``transformMap`` ...), which
    cel-expr-python's runtime lacks: a new map with the entry (or the other map) added."""
    out = dict(mapping)
    extra = key if value is None and isinstance(key, dict) else {key: value}
    for k, v in extra.items():
        if k in out:
            raise library.CELFunctionError(f"insert failed: key {k!r} already exists")
        out[k] = v
    cost.charge(1)
    # The map crosses into Python and back, entry by entry; cel-go updates it in place.
    cost.charge_work(10 * len(out))
    return out


def _ip_text(msg: Any) -> str:
    if not isinstance(msg, _IPMsg):
        raise library.CELFunctionError(f"no such overload: {_type_name(msg)} is not an IP")
    return str(msg.value)


def _cidr_text(msg: Any) -> str:
    if not isinstance(msg, _CIDRMsg):
        raise library.CELFunctionError(f"no such overload: {_type_name(msg)} is not a CIDR")
    return str(msg.value)


def _url_text(msg: Any) -> str:
    if not isinstance(msg, _URLMsg):
        raise library.CELFunctionError(f"no such overload: {_type_name(msg)} is not a URL")
    return str(msg.value)


@dataclass(frozen=True, slots=True)
class _Overload:
    """One overload of a library function: declared for the checker under ``function``, run
    under a private name (``@`` + overload id) so each overload keeps its own implementation
    and return type."""

    function: str
    overload_id: str
    result: Any
    params: tuple[Any, ...]
    member: bool
    impl: Callable[..., Any]

    @property
    def runtime_name(self) -> str:
        return "@" + self.overload_id


def _library() -> list[_Overload]:
    t = cel.Type
    q, s = t(QUANTITY_TYPE_NAME), t(SEMVER_TYPE_NAME)
    ip, cidr, url = t(IP_TYPE_NAME), t(CIDR_TYPE_NAME), t(URL_TYPE_NAME)
    dyn_list = t.List(t.DYN)
    out: list[_Overload] = []

    def member(name: str, oid: str, result: Any, params: list[Any], impl: Any) -> None:
        out.append(_Overload(name, oid, result, tuple(params), True, impl))

    def free(name: str, oid: str, result: Any, params: list[Any], impl: Any) -> None:
        out.append(_Overload(name, oid, result, tuple(params), False, impl))

    # quantity (k8s.io/apiserver/pkg/cel/library/quantity.go)
    free("quantity", "string_to_quantity", q, [t.STRING], _quantity_of)
    free("isQuantity", "is_quantity_string", t.BOOL, [t.STRING], _is(library.is_quantity))
    member("sign", "quantity_sign", t.INT, [q], _one(lambda x: _to_quantity(x).sign()))
    member(
        "isInteger",
        "quantity_is_integer",
        t.BOOL,
        [q],
        _one(lambda x: _to_quantity(x).is_integer()),
    )
    member(
        "asInteger",
        "quantity_get_integer",
        t.INT,
        [q],
        _one(lambda x: library.quantity_as_integer(_to_quantity(x))),
    )
    member(
        "asApproximateFloat",
        "quantity_get_float",
        t.DOUBLE,
        [q],
        _one(lambda x: _to_quantity(x).as_approximate_float()),
    )
    member("add", "quantity_add", q, [q, q], _add)
    member("add", "quantity_add_int", q, [q, t.INT], _add)
    member("sub", "quantity_sub", q, [q, q], _sub)
    member("sub", "quantity_sub_int", q, [q, t.INT], _sub)
    member("compareTo", "quantity_compare_to", t.INT, [q, q], _compare)
    member("isGreaterThan", "quantity_greater", t.BOOL, [q, q], lambda a, b: _compare(a, b) > 0)
    member("isLessThan", "quantity_less", t.BOOL, [q, q], lambda a, b: _compare(a, b) < 0)
    # semver (semverlib.go, version 1)
    free("semver", "string_to_semver", s, [t.STRING], _semver_of)
    free("semver", "string_bool_to_semver", s, [t.STRING, t.BOOL], _semver_of)
    free("isSemver", "is_semver_string", t.BOOL, [t.STRING], _is(library.is_semver))
    free("isSemver", "is_semver_string_bool", t.BOOL, [t.STRING, t.BOOL], _is(library.is_semver))
    member("compareTo", "semver_compare_to", t.INT, [s, s], _compare)
    member("isGreaterThan", "semver_greater", t.BOOL, [s, s], lambda a, b: _compare(a, b) > 0)
    member("isLessThan", "semver_less", t.BOOL, [s, s], lambda a, b: _compare(a, b) < 0)
    for name, pick in (("major", "major"), ("minor", "minor"), ("patch", "patch")):
        member(name, f"semver_{name}", t.INT, [s], _one(_component(pick)))
    # lists (lists.go, version 1) and DRA's includes
    comparable = (
        ("int", t.INT), ("uint", t.UINT), ("double", t.DOUBLE), ("bool", t.BOOL),
        ("duration", t.DURATION), ("timestamp", t.TIMESTAMP), ("string", t.STRING),
        ("bytes", t.BYTES),
    )  # fmt: skip
    for kind, kt in comparable:
        member("isSorted", f"list_{kind}_is_sorted_bool", t.BOOL, [t.List(kt)], _is_sorted)
        member("min", f"list_{kind}_min_{kind}", kt, [t.List(kt)], _min_max("min", min))
        member("max", f"list_{kind}_max_{kind}", kt, [t.List(kt)], _min_max("max", max))
    for kind, kt, zero in (
        ("int", t.INT, 0), ("uint", t.UINT, 0), ("double", t.DOUBLE, 0.0),
        ("duration", t.DURATION, dt.timedelta(0)),
    ):  # fmt: skip
        member("sum", f"list_{kind}_sum_{kind}", kt, [t.List(kt)], _sum(kind, zero))
    member("indexOf", "list_a_index_of_int", t.INT, [dyn_list, t.DYN], _list_index_of)
    member("lastIndexOf", "list_a_last_index_of_int", t.INT, [dyn_list, t.DYN], _list_last_index_of)
    member("includes", "dra_includes_dyn_dyn", t.BOOL, [t.DYN, t.DYN], _includes)
    # strings extension, version 2 (driver.cel.strings)
    member("charAt", "string_char_at_int", t.STRING, [t.STRING, t.INT], _fn(strings.char_at))
    member("indexOf", "string_index_of_string", t.INT, [t.STRING, t.STRING], _fn(strings.index_of))
    member(
        "indexOf",
        "string_index_of_string_int",
        t.INT,
        [t.STRING, t.STRING, t.INT],
        _fn(strings.index_of),
    )
    member(
        "lastIndexOf",
        "string_last_index_of_string",
        t.INT,
        [t.STRING, t.STRING],
        _fn(strings.last_index_of),
    )
    member(
        "lastIndexOf",
        "string_last_index_of_string_int",
        t.INT,
        [t.STRING, t.STRING, t.INT],
        _fn(strings.last_index_of),
    )
    member("lowerAscii", "string_lower_ascii", t.STRING, [t.STRING], _fn(strings.lower_ascii))
    member("upperAscii", "string_upper_ascii", t.STRING, [t.STRING], _fn(strings.upper_ascii))
    member(
        "replace", "string_replace_string_string", t.STRING, [t.STRING] * 3, _fn(strings.replace)
    )
    member(
        "replace",
        "string_replace_string_string_int",
        t.STRING,
        [t.STRING] * 3 + [t.INT],
        _fn(strings.replace),
    )
    member(
        "split", "string_split_string", t.List(t.STRING), [t.STRING, t.STRING], _fn(strings.split)
    )
    member(
        "split",
        "string_split_string_int",
        t.List(t.STRING),
        [t.STRING, t.STRING, t.INT],
        _fn(strings.split),
    )
    member("substring", "string_substring_int", t.STRING, [t.STRING, t.INT], _fn(strings.substring))
    member(
        "substring",
        "string_substring_int_int",
        t.STRING,
        [t.STRING, t.INT, t.INT],
        _fn(strings.substring),
    )
    member("trim", "string_trim", t.STRING, [t.STRING], _fn(strings.trim))
    member("join", "list_join", t.STRING, [t.List(t.STRING)], _fn(strings.join))
    member("join", "list_join_string", t.STRING, [t.List(t.STRING), t.STRING], _fn(strings.join))
    member("format", "string_format", t.STRING, [t.STRING, dyn_list], _fn(strings.format_string))
    free("strings.quote", "strings_quote", t.STRING, [t.STRING], _fn(strings.quote))
    # regex (regex.go)
    member("find", "string_find_string", t.STRING, [t.STRING, t.STRING], _fn(strings.find))
    member(
        "findAll",
        "string_find_all_string",
        t.List(t.STRING),
        [t.STRING, t.STRING],
        _fn(strings.find_all),
    )
    member(
        "findAll",
        "string_find_all_string_int",
        t.List(t.STRING),
        [t.STRING, t.STRING, t.INT],
        _fn(strings.find_all),
    )
    # IP and CIDR (ip.go, cidr.go)
    free("ip", "string_to_ip", ip, [t.STRING], lambda x: _IPMsg(value=network.ip(x)))
    free("isIP", "is_ip", t.BOOL, [t.STRING], _fn(network.is_ip))
    free("ip.isCanonical", "ip_is_canonical", t.BOOL, [t.STRING], _fn(network.is_canonical))
    member("family", "ip_family", t.INT, [ip], lambda x: network.family(_ip_text(x)))
    for name, fn in (
        ("isUnspecified", network.is_unspecified), ("isLoopback", network.is_loopback),
        ("isLinkLocalMulticast", network.is_link_local_multicast),
        ("isLinkLocalUnicast", network.is_link_local_unicast),
        ("isGlobalUnicast", network.is_global_unicast),
    ):  # fmt: skip
        member(name, f"ip_{name.lower()}", t.BOOL, [ip], _on(fn, _ip_text))
    free("cidr", "string_to_cidr", cidr, [t.STRING], lambda x: _CIDRMsg(value=network.cidr(x)))
    free("isCIDR", "is_cidr", t.BOOL, [t.STRING], _fn(network.is_cidr))
    member(
        "containsIP",
        "cidr_contains_ip_ip",
        t.BOOL,
        [cidr, ip],
        lambda c, i: network.contains_ip(_cidr_text(c), _ip_text(i)),
    )
    member(
        "containsIP",
        "cidr_contains_ip_string",
        t.BOOL,
        [cidr, t.STRING],
        lambda c, i: network.contains_ip(_cidr_text(c), i, parse=True),
    )
    member(
        "containsCIDR",
        "cidr_contains_cidr",
        t.BOOL,
        [cidr, cidr],
        lambda c, o: network.contains_cidr(_cidr_text(c), _cidr_text(o)),
    )
    member(
        "containsCIDR",
        "cidr_contains_cidr_string",
        t.BOOL,
        [cidr, t.STRING],
        lambda c, o: network.contains_cidr(_cidr_text(c), o, parse=True),
    )
    member("ip", "cidr_ip", ip, [cidr], lambda c: _IPMsg(value=network.cidr_ip(_cidr_text(c))))
    member(
        "masked",
        "cidr_masked",
        cidr,
        [cidr],
        lambda c: _CIDRMsg(value=network.masked(_cidr_text(c))),
    )
    member(
        "prefixLength",
        "cidr_prefix_length",
        t.INT,
        [cidr],
        lambda c: network.prefix_length(_cidr_text(c)),
    )
    free("string", "ip_to_string", t.STRING, [ip], _ip_text)
    free("string", "cidr_to_string", t.STRING, [cidr], _cidr_text)
    # URL (urls.go)
    free("url", "string_to_url", url, [t.STRING], lambda x: _URLMsg(value=network.url(x)))
    free("isURL", "is_url_string", t.BOOL, [t.STRING], _fn(network.is_url))
    for name, getter in (
        ("getScheme", network.get_scheme), ("getHost", network.get_host),
        ("getHostname", network.get_hostname), ("getPort", network.get_port),
        ("getEscapedPath", network.get_escaped_path),
    ):  # fmt: skip
        member(name, f"url_{name.lower()}", t.STRING, [url], _on(getter, _url_text))
    member(
        "getQuery",
        "url_get_query",
        t.Map(t.STRING, t.List(t.STRING)),
        [url],
        _on(network.get_query, _url_text),
    )
    # named formats (format.go): format.named and validate return optionals, which Python
    # functions cannot build; they return the format or null, the errors or [], and the
    # expression is rewritten to wrap them (_rewrite_optionals). Declared dyn for the checker;
    # the checked AST gets upstream's types back (_fix_optional_types).
    nf = t(FORMAT_TYPE_NAME)
    free("format.named", "format-named", t.DYN, [t.STRING], _format_named)
    for key in formats.FORMATS:
        free(f"format.{key}", f"format.{key}", nf, [], _format_constant(key))
    member("validate", "format-validate", t.DYN, [nf, t.STRING], _format_errors)
    # two-variable comprehensions: the runtime half cel-expr-python lacks
    m = t.Map(t.DYN, t.DYN)
    free("cel.@mapInsert", "@mapInsert_map_key_value", m, [m, t.DYN, t.DYN], _map_insert)
    free("cel.@mapInsert", "@mapInsert_map_map", m, [m, m], _map_insert)
    return out


def _format_named(key: str) -> Any:
    cost.charge(1)
    found = formats.named(key)
    return None if found is None else _FormatMsg(name=found.name)


def _format_constant(key: str) -> Callable[[], Any]:
    value = formats.FORMATS[key]

    def constant() -> Any:
        cost.charge(1)
        return _FormatMsg(name=value.name)

    return constant


def _format_errors(msg: Any, text: str) -> list[str]:
    """``validate``: the errors (upstream: optional.of(errors), or none when valid)."""
    if not isinstance(msg, _FormatMsg):
        raise library.CELFunctionError(f"no such overload: {_type_name(msg)} is not a format")
    found = formats.of(msg.name)
    size = math.ceil(found.max_regex_size * estimate.REGEX_LENGTH_FACTOR)
    cost.charge(math.ceil((1 + len(text)) * estimate.STRING_TRAVERSAL_FACTOR) * size)
    return found.validate(text)


def _fn(impl: Callable[..., Any]) -> Callable[..., Any]:
    return impl


def _one(impl: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def charged(x: Any) -> Any:
        cost.charge(1)
        return impl(x)

    return charged


def _is(check: Callable[..., bool]) -> Callable[..., bool]:
    def charged(text: str, *rest: Any) -> bool:
        cost.charge_traversal(len(text))
        return check(text, *rest)

    return charged


def _on(fn: Callable[[str], Any], unwrap: Callable[[Any], str]) -> Callable[[Any], Any]:
    return lambda x: fn(unwrap(x))


def _component(name: str) -> Callable[[Any], int]:
    return lambda msg: library.semver_int(getattr(_to_semver(msg), name))


# Standard-library functions redeclared (and so excluded from cel-cpp's declarations): the
# comparisons, to add upstream's cross-type numeric overloads; ``string``, to add IP and CIDR.
# The runtime keeps cel-cpp's own implementations for every overload but the added ones.
_COMPARISONS: Final = {
    "_<_": "less",
    "_<=_": "less_equals",
    "_>_": "greater",
    "_>=_": "greater_equals",
}


def _standard_redeclarations(library_overloads: list[_Overload]) -> list[Any]:
    t = cel.Type
    decls = []
    same = {
        "bool": t.BOOL, "int64": t.INT, "uint64": t.UINT, "double": t.DOUBLE,
        "string": t.STRING, "bytes": t.BYTES, "timestamp": t.TIMESTAMP, "duration": t.DURATION,
    }  # fmt: skip
    cross = (("int64", "uint64"), ("int64", "double"), ("uint64", "int64"),
             ("uint64", "double"), ("double", "int64"), ("double", "uint64"))  # fmt: skip
    for op, prefix in _COMPARISONS.items():
        overloads = [cel.Overload(f"{prefix}_{k}", t.BOOL, [v, v]) for k, v in same.items()]
        overloads += [
            cel.Overload(f"{prefix}_{a}_{b}", t.BOOL, [same[a], same[b]]) for a, b in cross
        ]
        decls.append(cel.FunctionDecl(op, overloads))
    conversions = [
        cel.Overload(f"{k}_to_string", t.STRING, [v]) for k, v in same.items() if k != "string"
    ]
    conversions.append(cel.Overload("string_to_string", t.STRING, [t.STRING]))
    conversions += [
        cel.Overload(o.overload_id, o.result, list(o.params))
        for o in library_overloads
        if o.function == "string"
    ]
    decls.append(cel.FunctionDecl("string", conversions))
    return decls


_LIBRARY: Final = _library()

# --------------------------------------------------------------------------- dyn dispatch
#
# Where the checker cannot pick one overload (a dyn attribute value as receiver: a version's
# ``compareTo``, a list attribute's ``sum``), the call runs under a dispatcher that picks the
# overload from the values at run time, as cel-go's runtime does.


def _accepts(type_name: str, value: Any) -> bool:
    if type_name == "DYN":
        return True
    if type_name in ("INT", "UINT"):
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "DOUBLE":
        return isinstance(value, float)
    if type_name == "BOOL":
        return isinstance(value, bool)
    if type_name == "STRING":
        return isinstance(value, str)
    if type_name == "BYTES":
        return isinstance(value, bytes | bytearray)
    if type_name == "DURATION":
        return isinstance(value, dt.timedelta)
    if type_name == "TIMESTAMP":
        return isinstance(value, dt.datetime)
    if type_name == "NULL":
        return value is None
    if type_name.startswith("LIST<"):
        inner = type_name[5:-1]
        return isinstance(value, list) and all(_accepts(inner, v) for v in value)
    if type_name.startswith("MAP<"):
        return isinstance(value, dict)
    cls = _CLASSES.get(type_name)
    return cls is not None and isinstance(value, cls)


_DISPATCH_KINDS: Final = (
    "INT", "UINT", "DOUBLE", "BOOL", "STRING", "BYTES", "LIST<DYN>", "MAP<DYN, DYN>",
    "DURATION", "TIMESTAMP", "NULL", *_CLASSES,
)  # fmt: skip


def _kind_type(name: str) -> Any:
    t = cel.Type
    simple = {
        "INT": t.INT, "UINT": t.UINT, "DOUBLE": t.DOUBLE, "BOOL": t.BOOL, "STRING": t.STRING,
        "BYTES": t.BYTES, "LIST<DYN>": t.List(t.DYN), "MAP<DYN, DYN>": t.Map(t.DYN, t.DYN),
        "DURATION": t.DURATION, "TIMESTAMP": t.TIMESTAMP, "NULL": t.NULL,
    }  # fmt: skip
    return simple.get(name) or t(name)


_MESSAGE_KIND: Final = QUANTITY_TYPE_NAME  # the runtime has one kind for every message type


def _position_kinds(type_name: str) -> list[str]:
    if type_name == "DYN":
        return [k for k in _DISPATCH_KINDS if k not in _CLASSES] + [_MESSAGE_KIND]
    if type_name in _CLASSES:
        return [_MESSAGE_KIND]
    if type_name.startswith("LIST<"):
        return ["LIST<DYN>"]
    if type_name.startswith("MAP<"):
        return ["MAP<DYN, DYN>"]
    return [type_name]


def _dispatcher(candidates: list[_Overload]) -> Callable[..., Any]:
    names = [[p.name() for p in o.params] for o in candidates]

    def dispatch(*args: Any) -> Any:
        for overload, params in zip(candidates, names, strict=True):
            if all(_accepts(p, a) for p, a in zip(params, args, strict=True)):
                return overload.impl(*args)
        kinds = ", ".join(_type_name(a) for a in args)
        raise library.CELFunctionError(f"no such overload: {candidates[0].function}({kinds})")

    return dispatch


def _dispatchers() -> tuple[dict[tuple[str, int, bool], str], list[Any]]:
    groups: dict[tuple[str, int, bool], list[_Overload]] = {}
    for o in _LIBRARY:
        groups.setdefault((o.function, len(o.params), o.member), []).append(o)
    names: dict[tuple[str, int, bool], str] = {}
    decls = []
    for key, candidates in groups.items():
        if len(candidates) < 2:
            continue
        name = f"@dyn.{key[0]}.{key[1]}"
        names[key] = name
        impl = _dispatcher(candidates)
        per_position: list[set[str]] = [set() for _ in range(key[1])]
        for o in candidates:
            for i, p in enumerate(o.params):
                per_position[i].update(_position_kinds(p.name()))
        overloads = [
            cel.Overload(
                f"{name}#{'/'.join(combo)}",
                cel.Type.DYN,
                [_kind_type(k) for k in combo],
                is_member=key[2],
                impl=impl,
            )
            for combo in itertools.product(*(sorted(k) for k in per_position))
        ]
        decls.append(cel.FunctionDecl(name, overloads))
    return names, decls


_DISPATCH_NAMES, _DISPATCH_DECLS = _dispatchers()
_OVERLOADS: Final = {o.overload_id: o for o in _LIBRARY}


def _runtime_name(function: str, overload_ids: list[str], arity: int, member: bool) -> str | None:
    """The private name a library call runs under, or None for the engine's own functions."""
    if not overload_ids or any(i not in _OVERLOADS for i in overload_ids):
        return None
    if len(overload_ids) == 1:
        return _OVERLOADS[overload_ids[0]].runtime_name
    return _DISPATCH_NAMES.get((function, arity, member))


def _functions() -> list[Any]:
    by_name: dict[str, list[Any]] = {}
    runtime = []
    for o in _LIBRARY:
        if o.function != "string" and not o.function.startswith("cel.@"):
            # (``string`` is redeclared whole below; cel.@mapInsert is declared by cel-cpp)
            by_name.setdefault(o.function, []).append(
                cel.Overload(o.overload_id, o.result, list(o.params), is_member=o.member)
            )
        # The runtime matches arguments by kind and a dyn parameter matches none: one
        # implementation per kind there.
        kinds = [_position_kinds("DYN") if p.name() == "DYN" else [p.name()] for p in o.params]
        runtime.append(
            cel.FunctionDecl(
                o.runtime_name,
                [
                    cel.Overload(
                        f"{o.runtime_name}#{'/'.join(combo)}",
                        o.result,
                        [
                            p if p.name() != "DYN" else _kind_type(k)
                            for p, k in zip(o.params, combo, strict=True)
                        ],
                        is_member=o.member,
                        impl=o.impl,
                    )
                    for combo in itertools.product(*kinds)
                ],
            )
        )
    t = cel.Type
    meter = [
        cel.FunctionDecl(
            instrument.TICK_FUNCTION,
            [cel.Overload(instrument.TICK_FUNCTION, t.BOOL, [t.INT], impl=_tick)],
        ),
        cel.FunctionDecl(
            drive.LOOP_FUNCTION,
            [cel.Overload(drive.LOOP_FUNCTION, t.DYN, [t.INT, t.List(t.DYN)], impl=_loop)],
        ),
        cel.FunctionDecl(
            drive.ACCUMULATOR_FUNCTION,
            [cel.Overload(drive.ACCUMULATOR_FUNCTION, t.DYN, [], impl=_accumulator)],
        ),
        cel.FunctionDecl(
            drive.OBSERVE_FUNCTION,
            [cel.Overload(drive.OBSERVE_FUNCTION, t.BOOL, [t.BOOL], impl=_observe)],
        ),
        cel.FunctionDecl(
            NO_SUCH_OVERLOAD_FUNCTION,
            [
                cel.Overload(
                    f"{NO_SUCH_OVERLOAD_FUNCTION}#{kind}",
                    t.BOOL,
                    [_kind_type(_MESSAGE_KIND), _kind_type(kind)],
                    impl=_no_such_overload,
                )
                for kind in _position_kinds("DYN")
            ],
        ),
        cel.FunctionDecl(
            instrument.CHARGE_FUNCTION,
            [
                cel.Overload(
                    instrument.CHARGE_FUNCTION, t.BOOL, [t.INT, t.List(t.DYN)], impl=_charge
                )
            ],
        ),
    ]
    declared = [cel.FunctionDecl(name, overloads) for name, overloads in by_name.items()]
    return declared + runtime + _DISPATCH_DECLS + meter + _standard_redeclarations(_LIBRARY)


def _tick(amount: int) -> bool:
    """The fixed cost of a region of a metered evaluation (driver.cel.instrument)."""
    cost.charge(amount)
    return True


def _charge(rule: int, operands: list[Any]) -> bool:
    """A size-dependent function of the engine's own, in a metered evaluation."""
    amount, work = instrument.charge_amount(rule, operands)
    cost.charge(amount)
    if work:
        cost.charge_work(work)
    return True


# --------------------------------------------------------------------------- driven loops


@dataclass(frozen=True, slots=True)
class _DrivenLoop:
    chunk: Any  # program
    result: Any | None  # program
    spec: drive.Loop


@dataclass(frozen=True, slots=True)
class _Driven:
    """An expression whose comprehensions run from Python in chunks (driver.cel.drive)."""

    main: Any
    loops: tuple[_DrivenLoop, ...]


class _AccumulatorError:
    """An accumulator that is an error value, carried from one chunk to the next."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


@dataclass(slots=True)
class _DriveState:
    """The driven evaluation running in this thread: its programs and the device's variables,
    and a stack of the chunks running (the accumulator each starts from, and the last value
    of its loop condition)."""

    driven: _Driven
    variables: Mapping[str, Any]
    accumulators: list[Any] = field(default_factory=list)
    conditions: list[bool | None] = field(default_factory=list)


_DRIVE = threading.local()


def _drive_state() -> _DriveState:
    state: _DriveState | None = getattr(_DRIVE, "state", None)
    if state is None:
        raise library.CELFunctionError("internal error: a driven loop outside its evaluation")
    return state


def _accumulator() -> Any:
    value = _drive_state().accumulators[-1]
    if isinstance(value, _AccumulatorError):
        raise library.CELFunctionError(value.message)
    return value


def _observe(condition: bool) -> bool:
    _drive_state().conditions[-1] = condition
    return condition


def _run_with_accumulator(state: _DriveState, program: Any, data: dict[str, Any], accu: Any) -> Any:
    """Evaluate one part of a driven loop; the accumulator it returns (or carries as an
    error)."""
    state.accumulators.append(accu)
    state.conditions.append(None)
    try:
        result = program.eval(data=data)
    finally:
        state.accumulators.pop()
    if result.type() == cel.Type.ERROR:
        return _AccumulatorError(_engine_message(str(result.value())))
    return result.plain_value()


def _loop(index: int, operands: list[Any]) -> Any:
    """``@biaxial.loop``: comprehension *index* over its range, in chunks (driver.cel.drive)."""
    state = _drive_state()
    loop = state.driven.loops[index]
    rng, accu, *free = operands
    base = {**state.variables, **dict(zip(loop.spec.free, free, strict=True))}
    if isinstance(rng, dict):
        items: list[Any] = list(rng.items())
    elif isinstance(rng, list):
        items = rng
    else:
        raise library.CELFunctionError(
            "expected iterable type: the range of a comprehension must be a list or a map,"
            f" got {_type_name(rng)}"
        )
    for start in range(0, len(items), drive.CHUNK):
        part = items[start : start + drive.CHUNK]
        data = {
            **base,
            drive.RANGE_NAME: dict(part) if isinstance(rng, dict) else part,
            drive.OFFSET_NAME: start,
        }
        accu = _run_with_accumulator(state, loop.chunk, data, accu)
        stopped = state.conditions.pop() is False
        if stopped:
            break
    if loop.result is not None:
        accu = _run_with_accumulator(state, loop.result, base, accu)
        state.conditions.pop()
    if isinstance(accu, _AccumulatorError):
        raise library.CELFunctionError(accu.message)
    return accu


@lru_cache(maxsize=64)
def _driven(expression: str, metered: bool) -> _Driven:
    """The driven form of a compiled expression (metered: of its instrumented form)."""
    compiled = _compile(expression)
    source = (
        instrument.instrument(compiled.checked, _self_charging)
        if metered
        else copy.deepcopy(compiled.checked)
    )
    _rewrite_library_equality(source)
    _rewrite_optionals(source)
    plan = drive.drive(source)

    def program(checked_expr: Any) -> Any:
        renamed = copy.deepcopy(checked_expr)
        checked.rename_calls(renamed, _runtime_name)
        return _load(renamed, strict=metered)

    loops = tuple(
        _DrivenLoop(
            program(loop.chunk),
            program(loop.result) if loop.result is not None else None,
            loop,
        )
        for loop in plan.loops
    )
    return _Driven(program(plan.main), loops)


def _eval_driven(driven: _Driven, variables: Mapping[str, Any]) -> Any:
    """Evaluate a driven expression against the device's (padded) variables."""
    previous = getattr(_DRIVE, "state", None)
    _DRIVE.state = _DriveState(driven, variables)
    try:
        return driven.main.eval(data=dict(variables))
    finally:
        _DRIVE.state = previous


_ENV_CONFIG: Final = """
extensions:
  - name: "bindings"
  - name: "optional"
  - name: "lists"
    version: 2
  - name: "sets"
  - name: "two-var-comprehensions"
stdlib:
  exclude_functions:
""" + "".join(f'    - name: "{name}"\n' for name in (*_COMPARISONS, "string"))

_ENV_LOCK = threading.Lock()
_ENV: Any = None


def _env() -> Any:
    """The one CEL environment, built on first use (thread-safe)."""
    global _ENV  # noqa: PLW0603 - a lazily built process-wide singleton
    with _ENV_LOCK:
        if _ENV is None:
            t = cel.Type
            _ENV = cel.NewEnv(
                _POOL,
                config=cel.NewEnvConfigFromYaml(_ENV_CONFIG),
                variables={
                    "device.driver": t.STRING,
                    "device.attributes": t.Map(t.STRING, t.Map(t.STRING, t.DYN)),
                    "device.capacity": t.Map(t.STRING, t.Map(t.STRING, t(QUANTITY_TYPE_NAME))),
                    "device.allowMultipleAllocations": t.BOOL,
                },
                functions=_functions(),
            )
        return _ENV


# --------------------------------------------------------------------------- messages

_STATUS_PREFIX: Final = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX: Final = re.compile(r"\s*\[[A-Z_]+\]$")
_RUNTIME_REWRITES: Final = (
    (
        re.compile(r"^No matching overloads found : <iter_range>$"),
        "expected iterable type: the range of a comprehension must be a list or a map",
    ),
    (re.compile(r"^Key not found in map : (.*)$", re.DOTALL), r"no such key: \1"),
    (re.compile(r"^No matching overloads found : (.*)$", re.DOTALL), r"no such overload: \1"),
)


def _engine_message(text: str) -> str:
    """Strip absl status decorations (``INVALID_ARGUMENT: ... [INVALID_ARGUMENT]``)."""
    text = _STATUS_SUFFIX.sub("", _STATUS_PREFIX.sub("", text.strip()))
    return text.replace("ERROR: ", "")


_NO_SUCH_KEY_HINT: Final = (
    " (a device may lack an attribute or capacity: check with has() or use .?name.orValue(...))"
)


def _runtime_message(text: str) -> str:
    text = _engine_message(text)
    for pattern, replacement in _RUNTIME_REWRITES:
        text = pattern.sub(replacement, text)
    if text.startswith(strings.RE2_PREFIX):
        text = strings.go_regexp_error(text)
    if text.startswith("no such key:"):
        text += _NO_SUCH_KEY_HINT  # upstream's allocator adds such a hint too (kubernetes#136709)
    return text


# --------------------------------------------------------------------------- device input


def _attribute_value(value: AttributeValue) -> Any:
    if isinstance(value, Version):
        return _semver_value(library.parse_semver(value.text))
    if isinstance(value, tuple):
        return [_attribute_value(v) for v in value]
    return value


def split_qualified_name(name: str, driver_name: str) -> tuple[str, str]:
    """``a.io/b`` -> (``a.io``, ``b``); an unqualified ``b`` -> (driver name, ``b``)."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver_name, name)


@dataclass(frozen=True, slots=True)
class DeviceInput:
    """A device as CEL input: the variables, and the domains it has (for empty-map padding)."""

    variables: Mapping[str, Any]
    attribute_domains: frozenset[str]
    capacity_domains: frozenset[str]
    activation: Any = field(repr=False, compare=False)
    _padded: dict[frozenset[str], Any] = field(repr=False, compare=False, default_factory=dict)

    def padded(self, domains: frozenset[str]) -> Any:
        """An activation where every domain in *domains* exists (empty if the device lacks it),
        or the shared one when nothing is missing. Memoised per domain set."""
        cached = self._padded.get(domains)
        if cached is not None:
            return cached
        missing_attr = domains - self.attribute_domains
        missing_cap = domains - self.capacity_domains
        if not missing_attr and not missing_cap:
            self._padded[domains] = self.activation
            return self.activation
        activation = _env().Activation(self.padded_variables(domains))
        self._padded[domains] = activation
        return activation

    def padded_variables(self, domains: frozenset[str]) -> Mapping[str, Any]:
        """The variables of :meth:`padded`, as Python values."""
        missing_attr = domains - self.attribute_domains
        missing_cap = domains - self.capacity_domains
        if not missing_attr and not missing_cap:
            return self.variables
        variables = dict(self.variables)
        variables["device.attributes"] = {
            **variables["device.attributes"],
            **{domain: {} for domain in missing_attr},
        }
        variables["device.capacity"] = {
            **variables["device.capacity"],
            **{domain: {} for domain in missing_cap},
        }
        return variables


def device_input(device: Device, driver_name: str) -> DeviceInput:
    """Build the CEL input for one device. Raises CELEvaluationError for a version attribute
    that is not valid semver (upstream fails the evaluation the same way); selectors add the
    expression and the device name to that message."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.attributes.items():
        domain, ident = split_qualified_name(name, driver_name)
        try:
            attributes.setdefault(domain, {})[ident] = _attribute_value(value)
        except library.CELFunctionError as exc:
            raise CELEvaluationError(f"attribute {name}: parse semantic version: {exc}") from exc
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in device.capacity.items():
        domain, ident = split_qualified_name(name, driver_name)
        capacity.setdefault(domain, {})[ident] = quantity_value(cap.value)
    variables = {
        "device.driver": driver_name,
        "device.attributes": attributes,
        "device.capacity": capacity,
        "device.allowMultipleAllocations": device.allow_multiple_allocations,
    }
    return DeviceInput(
        variables=variables,
        attribute_domains=frozenset(attributes),
        capacity_domains=frozenset(capacity),
        activation=_env().Activation(variables),
    )


# --------------------------------------------------------------------------- selectors


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector; build it with :func:`compile_selector`. Equal selectors have equal
    expressions. A ``Selector(expression)`` built directly compiles on first use (cached).

    ``max_cost`` is the static worst-case cost estimate in upstream's units; ``metered`` says
    whether evaluations count their actual cost (the estimate could pass the limit). A
    selector estimated above :data:`DEADLINE_METERING_FROM` has its instrumented program
    (``_metered``) even when it is not metered, for a deadline."""

    expression: str
    _program: Any = field(repr=False, compare=False, default=None)
    domains: frozenset[str] = field(repr=False, compare=False, default=frozenset())
    max_cost: int = field(repr=False, compare=False, default=0)
    _metered: Any = field(repr=False, compare=False, default=None)
    _needs_meter: bool = field(repr=False, compare=False, default=False)

    @property
    def metered(self) -> bool:
        return self._needs_meter

    def matches(self, device: Device, driver_name: str) -> bool:
        """Evaluate against one device; CELEvaluationError on any runtime error."""
        try:
            prepared = device_input(device, driver_name)
        except CELEvaluationError as exc:
            raise self.input_error(device.name, exc) from exc
        return self.evaluate(prepared, device.name)

    def input_error(self, device_name: str, error: CELEvaluationError) -> CELEvaluationError:
        """The error for this selector when the device itself cannot be turned into CEL input."""
        return self._error(device_name, str(error))

    def evaluate(self, device: DeviceInput, device_name: str) -> bool:
        """Evaluate against a prepared :class:`DeviceInput` (see :class:`MatchCache`)."""
        if self._program is None:
            return compile_selector(self.expression).evaluate(device, device_name)
        try:
            result, meter = _run(self, device, device_name)
        except RuntimeError as exc:  # the engine's own failures
            raise self._error(device_name, _runtime_message(str(exc))) from exc
        except (MemoryError, RecursionError) as exc:
            raise self._error(device_name, f"evaluation failed: {type(exc).__name__}") from exc
        except CELCompileError as exc:  # a driven form (driver.cel.drive) that cannot load
            raise self._error(device_name, str(exc)) from exc
        if meter is not None and meter.timed_out:
            raise self._timed_out(device_name)
        if meter is not None and meter.exceeded:
            raise self._error(device_name, meter.reason)
        kind = result.type()
        try:
            value = result.value()
        except TypeError:  # a value with no Python form (an optional)
            raise self._error(
                device_name, "must evaluate to bool, got a value of another type (an optional)"
            ) from None
        if value is True or value is False:  # only a BOOL result converts to a Python bool
            return value
        if kind == cel.Type.ERROR:
            raise self._error(device_name, _runtime_message(str(value)))
        raise self._error(
            device_name, f"must evaluate to bool, got a value of type {kind.name().lower()}"
        )

    def _error(self, device_name: str, message: str) -> CELEvaluationError:
        return CELEvaluationError(
            f"CEL selector {shorten(self.expression)!r} on device {device_name!r}: {message}"
        )

    def _timed_out(self, device_name: str) -> DeadlineExceededError:
        return DeadlineExceededError(
            f"CEL selector {shorten(self.expression)!r} on device {device_name!r}: "
            f"{cost.DEADLINE_MESSAGE}"
        )


def _run(
    selector: Selector, device: DeviceInput, device_name: str = "-"
) -> tuple[Any, cost.Meter | None]:
    """One evaluation (metered when the selector is, or for a deadline); where cel-cpp's
    iteration budget stops it, again with its comprehensions driven from Python
    (driver.cel.drive). An unmetered one checks the deadline before it starts."""
    bounds = cost.current_limits()
    metered = selector._metered is not None and (selector.metered or bounds.deadline is not None)
    if metered and not selector.metered:  # for the deadline alone: its cost cannot pass
        bounds = cost.Limits(cost=cost.NO_LIMIT, deadline=bounds.deadline)
    if not metered and cost.deadline_passed():
        raise selector._timed_out(device_name)
    try:
        if not metered:
            return selector._program.eval(device.padded(selector.domains)), None
        meter = cost.Meter(bounds)
        with cost.metering(meter):
            return selector._metered.eval(device.padded(selector.domains)), meter
    except RuntimeError as exc:
        if not _budget_exceeded(exc):
            raise
    driven = _driven(selector.expression, metered)
    fresh = cost.Meter(bounds) if metered else None
    with cost.metering(fresh):
        return _eval_driven(driven, device.padded_variables(selector.domains)), fresh


def _budget_exceeded(exc: RuntimeError) -> bool:
    return "Iteration budget exceeded" in str(exc)


def shorten(expression: str, limit: int = 120) -> str:
    """An expression cut to *limit* characters for messages (10 KiB ones stay readable)."""
    return expression if len(expression) <= limit else expression[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class _Compiled:
    """An expression checked against upstream's compile-time rules, with its estimates."""

    checked: Any  # the checked AST, library calls under their declared names
    program: Any  # the runnable program (library calls renamed)
    output: str  # the result type (checked.type_name)
    cost: estimate.Span  # upstream's static estimate
    work: estimate.Span  # the engine's own worst case (driver.cel.estimate)

    @property
    def needs_meter(self) -> bool:
        return max(self.cost[1], self.work[1]) > COST_LIMIT


def _compile(expression: str) -> _Compiled:
    size = len(expression.encode())
    if size > MAX_EXPRESSION_LENGTH:
        raise CELCompileError(
            f"CEL expression is too long: {size} bytes, the limit is {MAX_EXPRESSION_LENGTH}"
        )
    source = syntax.two_variable_exists_one(expression)
    program, checked_expr = _check(expression, source)
    _fix_optional_types(checked_expr)
    problem = checked.validate(checked_expr, _regex_problem)
    if problem is not None:
        raise CELCompileError(f"compilation failed: {problem}")
    upstream = estimate.estimate(checked_expr)
    work = estimate.estimate(checked_expr, work=True)
    runnable = _runnable(checked_expr, rewritten=program is None)
    if runnable is not None:
        program = runnable
    output = checked.type_name(checked_expr, checked_expr.expr)
    return _Compiled(checked_expr, program, output, upstream, work)


def _check(expression: str, source: str) -> tuple[Any, Any]:
    """cel-cpp's program of *source* (None where it cannot run as compiled) and its checked
    AST; an expression nested deeper than cel-cpp parses is checked hoisted
    (driver.cel.deep) and its checked AST given back as written."""
    env = _env()
    try:
        program = env.compile(source)
    except RuntimeError as exc:
        message = _engine_message(str(exc))
        if _TOO_DEEP.search(message):
            return None, _check_deep(source)
        if source != expression:  # the message quotes the source cel-cpp read
            message = message.replace("existsOne (", "exists_one(")
        raise CELCompileError(f"compilation failed: {message}") from exc
    except RecursionError as exc:
        raise CELCompileError("compilation failed: expression nested too deeply") from exc
    return program, checked.parse_checked_expr(program.serialize())


# cel-cpp's two parse errors for nesting past its limit of 32.
_TOO_DEEP: Final = re.compile(r"recursion (limit|depth) (exceeded|of \d+ when parsing)")
DEEP_PIECES: Final = (24, 20, 16, 12, 8)  # the piece heights to try, largest first


def _check_deep(source: str) -> Any:
    """The checked AST of an expression nested past cel-cpp's limit but within upstream's
    (250): checked with its deep parts hoisted into binds, then inlined back."""
    try:
        parsed = syntax.parse(source)
    except syntax.CELSyntaxError as exc:
        raise CELCompileError(f"compilation failed: {exc}") from exc
    problem = parsed.upstream_problem
    if problem is not None:
        raise CELCompileError(f"compilation failed: {problem}")
    env = _env()
    for piece in DEEP_PIECES:
        hoisted = deep.hoist_source(source, parsed, piece)
        try:
            program = env.compile(hoisted.text)
        except RuntimeError as exc:
            message = _engine_message(str(exc))
            if _TOO_DEEP.search(message):
                continue
            raise CELCompileError(f"compilation failed: {deep.drop_locations(message)}") from exc
        try:
            checked_expr = checked.parse_checked_expr(
                checked.flatten_deep_types(program.serialize())
            )
        except DecodeError as exc:  # cannot happen: the types were flattened
            raise CELCompileError(f"compilation failed: {_TOO_DEEP_TO_LOAD}") from exc
        deep.inline(checked_expr, hoisted.prefix)
        return checked_expr
    raise CELCompileError(
        "compilation failed: expression nested too deeply for cel-cpp even with its deep parts"
        " hoisted"
    )


def _runnable(checked_expr: Any, *, rewritten: bool = False, strict: bool = False) -> Any | None:
    """The program for a checked expression: named-format calls wrapped in optionals and
    library calls renamed to their implementations; None when nothing needed changing and
    the caller did not rewrite it itself (the engine's own program of it runs as is)."""
    out = copy.deepcopy(checked_expr)
    changed = _rewrite_library_equality(out)
    changed = _rewrite_optionals(out) or changed
    changed = checked.rename_calls(out, _runtime_name) or changed
    if not changed and not rewritten:
        return None
    return _load(out, strict=strict)


def _load(checked_expr: Any, *, strict: bool = False) -> Any:
    """cel-expr-python's program of a checked AST (hoisted if too deep to load as it is;
    *strict* for an instrumented one, see driver.cel.deep.shallow)."""
    try:
        shallow = deep.shallow(checked_expr, strict=strict)
        return _env().deserialize(checked.serialize_checked(shallow))
    except RuntimeError as exc:
        raise CELCompileError(f"compilation failed: {_TOO_DEEP_TO_LOAD}") from exc


_TOO_DEEP_TO_LOAD: Final = "expression nested too deeply for cel-expr-python to load"


_OPTIONAL_RESULTS: Final = {"format-named", "format-validate"}


def _fix_optional_types(checked_expr: Any) -> None:
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


def _rewrite_optionals(checked_expr: Any) -> bool:
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


def _rewrite_library_equality(checked_expr: Any) -> bool:
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


def _no_such_overload(*_: Any) -> Any:
    raise library.CELFunctionError("no such overload")


def _self_charging(overload_ids: list[str]) -> bool:
    """Whether a call's implementation (biaxial's, in Python) charges its own cost."""
    return all(i in _OVERLOADS for i in overload_ids)


def _instrumented(compiled: _Compiled) -> Any:
    """The program that counts its actual cost (driver.cel.instrument)."""
    return _runnable(
        instrument.instrument(compiled.checked, _self_charging), rewritten=True, strict=True
    )


@lru_cache(maxsize=COMPILE_CACHE_SIZE)
def compile_selector(expression: str) -> Selector:
    """Compile a selector once (LRU-cached per expression string); see the module docstring."""
    compiled = _compile(expression)
    if compiled.output not in ("bool", "dyn"):
        raise CELCompileError(
            f"compilation failed: must evaluate to bool or the unknown type, not {compiled.output}"
        )
    bounded_but_long = max(compiled.cost[1], compiled.work[1]) > DEADLINE_METERING_FROM
    return Selector(
        expression=expression,
        _program=compiled.program,
        domains=checked.literal_domains(compiled.checked.expr),
        max_cost=compiled.cost[1],
        _metered=_instrumented(compiled) if compiled.needs_meter or bounded_but_long else None,
        _needs_meter=compiled.needs_meter,
    )


@dataclass(frozen=True, slots=True)
class Measurement:
    """What :func:`measure` found: upstream's estimate, and the actual cost and result of one
    evaluation (the value, or the error message)."""

    estimate: estimate.Span
    actual: int
    value: Any = None
    error: str = ""


def measure(
    expression: str,
    device: Device | None = None,
    driver_name: str = "",
    *,
    sizes: estimate.SizeEstimator = estimate.dra_sizes,
    limit: int = COST_LIMIT,
) -> Measurement:
    """Compile *expression* (any result type) in the DRA environment and evaluate it once
    with its actual cost counted (cancelled past *limit*): for conformance tests against
    upstream's cost tables and for ``bench``. *sizes* replaces DRA's size estimator
    (upstream's library cost tests use their own). Raises CELCompileError."""
    compiled = _compile(expression)
    selector = Selector(
        expression=expression,
        _program=compiled.program,
        domains=checked.literal_domains(compiled.checked.expr),
        max_cost=compiled.cost[1],
        _metered=_instrumented(compiled),
        _needs_meter=True,  # always counted here
    )
    span = estimate.estimate(compiled.checked, sizes)
    try:
        prepared = device_input(device or Device(name="-"), driver_name)
    except CELEvaluationError as exc:
        return Measurement(span, 0, error=str(exc))
    with cost.limits(cost=limit):
        try:
            result, meter = _run(selector, prepared)
        except RuntimeError as exc:
            return Measurement(span, 0, error=_runtime_message(str(exc)))
    assert meter is not None
    if meter.exceeded:
        return Measurement(span, meter.cost, error=meter.reason)
    try:
        value = result.plain_value()
    except TypeError:  # a value with no Python form (an optional)
        return Measurement(span, meter.cost, value=None)
    if result.type() == cel.Type.ERROR:
        return Measurement(span, meter.cost, error=_runtime_message(str(value)))
    return Measurement(span, meter.cost, value=value)


def _regex_problem(function: str, pattern: str) -> str | None:
    """Why a constant pattern is not a valid RE2 expression (cel-cpp's RE2 decides, as Go's
    regexp does upstream), or not one ``find`` can run; worded as Kubernetes reports it
    (cel-go's regex-literal validator for ``matches``, program instantiation for the regex
    library's ``find`` / ``findAll``)."""
    probe = _env().compile(f"''.matches({strings.quote_plain(pattern)})").eval()
    if probe.type() == cel.Type.ERROR:
        reason = strings.go_regexp_error(_engine_message(str(probe.value())))
    else:
        problem = strings.check_regex(pattern)
        if problem is None:
            return None
        reason = strings.go_regexp_error(problem)
    if function == "matches":
        return f"invalid matches argument: {reason}"
    return f"program instantiation failed: {reason}"


# --------------------------------------------------------------------------- match cache


@dataclass(slots=True)
class _DeviceEntry:
    generation: int
    prepared: DeviceInput | CELEvaluationError | None  # None: not built yet
    results: dict[str, bool | CELEvaluationError]


class MatchCache:
    """Results (and errors) per (expression, device, slice generation), plus one CEL input per
    (device, slice generation), built once however many selectors run on the device. A device
    seen at another slice generation starts afresh (its old entries are dropped).

    A boolean result is also shared by every device that looks the same to the expression
    (:mod:`driver.cel.reads`: same driver, sharing flag and values of every attribute and
    capacity the expression can name), so a selector runs once per kind of device, not once
    per device: thousands of identical GPUs, or every placement of one MIG profile, cost one
    evaluation. Errors are never shared (their message names the device). Thread-safe; never
    mutates its inputs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: dict[DeviceID, _DeviceEntry] = {}
        self._shared: dict[tuple[object, ...], bool] = {}
        self.hits = 0
        self.misses = 0

    def matches(
        self, selector: Selector, device_id: DeviceID, slice_generation: int, device: Device
    ) -> bool:
        """Like :meth:`Selector.matches`, cached. ``device_id.driver`` is the driver name."""
        with self._lock:
            entry = self._devices.get(device_id)
            if entry is not None and entry.generation == slice_generation:
                cached = entry.results.get(selector.expression)
                if cached is not None:
                    self.hits += 1
                    if isinstance(cached, CELEvaluationError):
                        raise cached
                    return cached
        keys = readable_keys(selector.expression)
        look = (
            (selector.expression, *visible(device, device_id.driver, keys))
            if keys is not None
            else None
        )
        with self._lock:
            if entry is None or entry.generation != slice_generation:
                entry = _DeviceEntry(slice_generation, None, {})
                self._devices[device_id] = entry
            shared = self._shared.get(look) if look is not None else None
            if shared is not None:
                self.hits += 1
                entry.results[selector.expression] = shared
                return shared
            self.misses += 1
        if entry.prepared is None:
            try:
                entry.prepared = device_input(device, device_id.driver)
            except CELEvaluationError as exc:
                entry.prepared = exc
        outcome: bool | CELEvaluationError
        if isinstance(entry.prepared, CELEvaluationError):
            outcome = selector.input_error(device.name, entry.prepared)
        else:
            try:
                outcome = selector.evaluate(entry.prepared, device.name)
            except CELEvaluationError as exc:
                outcome = exc
        with self._lock:
            entry.results[selector.expression] = outcome
            if look is not None and not isinstance(outcome, CELEvaluationError):
                self._shared[look] = outcome
        if isinstance(outcome, CELEvaluationError):
            raise outcome
        return outcome

    def __len__(self) -> int:
        """The number of cached results."""
        with self._lock:
            return sum(len(e.results) for e in self._devices.values())

    def discard(self, device_id: DeviceID) -> None:
        """Forget a device (its slice was deleted)."""
        with self._lock:
            self._devices.pop(device_id, None)

    def clear(self) -> None:
        with self._lock:
            self._devices.clear()
            self._shared.clear()

"""The library bindings: every overload of Kubernetes' CEL libraries (quantity, semver, lists,
regex, IP, CIDR, URL, named formats), the strings extension and the runtime half of the
two-variable comprehensions, each declared for the checker and bound to its Python
implementation (``driver.cel.library``, ``strings``, ``network``, ``formats``), which charges
upstream's cost as it runs. To add a library: its functions in a module of its own, its
overloads in :func:`_library` under upstream's overload ids."""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cel_expr_python import cel

from driver.cel import (
    cost,
    estimate,
    formats,
    library,
    network,
    strings,
)
from driver.cel.values import (
    CIDR_TYPE_NAME,
    FORMAT_TYPE_NAME,
    IP_TYPE_NAME,
    QUANTITY_TYPE_NAME,
    SEMVER_TYPE_NAME,
    URL_TYPE_NAME,
    CIDRMsg,
    FormatMsg,
    IPMsg,
    QuantityMsg,
    SemverMsg,
    URLMsg,
    cidr_text,
    ip_text,
    quantity_of,
    quantity_value,
    semver_of,
    to_quantity,
    to_semver,
    url_text,
    value_type_name,
)

# --------------------------------------------------------------------------- library bindings


def _compare(receiver: Any, other: Any) -> int:
    """``compareTo`` of two quantities or two versions."""
    cost.charge(1)
    if isinstance(receiver, QuantityMsg) and isinstance(other, QuantityMsg):
        return to_quantity(receiver).compare(to_quantity(other))
    if isinstance(receiver, SemverMsg) and isinstance(other, SemverMsg):
        return to_semver(receiver).compare(to_semver(other))
    raise library.CELFunctionError(
        f"no such overload: {value_type_name(receiver)} compared with {value_type_name(other)}"
    )


def _add(receiver: Any, other: Any) -> Any:
    cost.charge(1)
    if isinstance(other, int):
        return quantity_value(library.quantity_add_int(to_quantity(receiver), other))
    return quantity_value(to_quantity(receiver) + to_quantity(other))


def _sub(receiver: Any, other: Any) -> Any:
    cost.charge(1)
    if isinstance(other, int):
        return quantity_value(library.quantity_sub_int(to_quantity(receiver), other))
    return quantity_value(to_quantity(receiver) - to_quantity(other))


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


@dataclass(frozen=True, slots=True)
class Overload:
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


class _Overloads(list[Overload]):
    """The overloads being declared: ``member`` for receiver-style calls, ``free`` for global
    functions."""

    def member(self, name: str, oid: str, result: Any, params: list[Any], impl: Any) -> None:
        self.append(Overload(name, oid, result, tuple(params), True, impl))

    def free(self, name: str, oid: str, result: Any, params: list[Any], impl: Any) -> None:
        self.append(Overload(name, oid, result, tuple(params), False, impl))


def _library() -> list[Overload]:
    """Every library's overloads, one function per library as upstream keeps one file each."""
    out = _Overloads()
    for declare in (
        _quantity,
        _semver,
        _lists,
        _strings_extension,
        _regex,
        _ip_and_cidr,
        _url,
        _named_formats,
        _comprehensions,
    ):
        declare(out)
    return list(out)


def _quantity(out: _Overloads) -> None:
    """Quantity (k8s.io/apiserver/pkg/cel/library/quantity.go)."""
    member = out.member
    free = out.free
    t = cel.Type
    q = cel.Type(QUANTITY_TYPE_NAME)
    free("quantity", "string_to_quantity", q, [t.STRING], quantity_of)
    free("isQuantity", "is_quantity_string", t.BOOL, [t.STRING], _is(library.is_quantity))
    member("sign", "quantity_sign", t.INT, [q], _one(lambda x: to_quantity(x).sign()))
    member(
        "isInteger",
        "quantity_is_integer",
        t.BOOL,
        [q],
        _one(lambda x: to_quantity(x).is_integer()),
    )
    member(
        "asInteger",
        "quantity_get_integer",
        t.INT,
        [q],
        _one(lambda x: library.quantity_as_integer(to_quantity(x))),
    )
    member(
        "asApproximateFloat",
        "quantity_get_float",
        t.DOUBLE,
        [q],
        _one(lambda x: to_quantity(x).as_approximate_float()),
    )
    member("add", "quantity_add", q, [q, q], _add)
    member("add", "quantity_add_int", q, [q, t.INT], _add)
    member("sub", "quantity_sub", q, [q, q], _sub)
    member("sub", "quantity_sub_int", q, [q, t.INT], _sub)
    member("compareTo", "quantity_compare_to", t.INT, [q, q], _compare)
    member("isGreaterThan", "quantity_greater", t.BOOL, [q, q], lambda a, b: _compare(a, b) > 0)
    member("isLessThan", "quantity_less", t.BOOL, [q, q], lambda a, b: _compare(a, b) < 0)


def _semver(out: _Overloads) -> None:
    """Semver (semverlib.go, version 1)."""
    member = out.member
    free = out.free
    t = cel.Type
    s = cel.Type(SEMVER_TYPE_NAME)
    free("semver", "string_to_semver", s, [t.STRING], semver_of)
    free("semver", "string_bool_to_semver", s, [t.STRING, t.BOOL], semver_of)
    free("isSemver", "is_semver_string", t.BOOL, [t.STRING], _is(library.is_semver))
    free("isSemver", "is_semver_string_bool", t.BOOL, [t.STRING, t.BOOL], _is(library.is_semver))
    member("compareTo", "semver_compare_to", t.INT, [s, s], _compare)
    member("isGreaterThan", "semver_greater", t.BOOL, [s, s], lambda a, b: _compare(a, b) > 0)
    member("isLessThan", "semver_less", t.BOOL, [s, s], lambda a, b: _compare(a, b) < 0)
    for name, pick in (("major", "major"), ("minor", "minor"), ("patch", "patch")):
        member(name, f"semver_{name}", t.INT, [s], _one(_component(pick)))


def _lists(out: _Overloads) -> None:
    """Lists (lists.go, version 1) and DRA's includes."""
    member = out.member
    t = cel.Type
    dyn_list = cel.Type.List(cel.Type.DYN)
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


def _strings_extension(out: _Overloads) -> None:
    """Strings extension, version 2 (driver.cel.strings)."""
    member = out.member
    free = out.free
    t = cel.Type
    dyn_list = cel.Type.List(cel.Type.DYN)
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


def _regex(out: _Overloads) -> None:
    """Regex (regex.go)."""
    member = out.member
    t = cel.Type
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


def _ip_and_cidr(out: _Overloads) -> None:
    """IP and CIDR (ip.go, cidr.go)."""
    member = out.member
    free = out.free
    t = cel.Type
    ip = cel.Type(IP_TYPE_NAME)
    cidr = cel.Type(CIDR_TYPE_NAME)
    free("ip", "string_to_ip", ip, [t.STRING], lambda x: IPMsg(value=network.ip(x)))
    free("isIP", "is_ip", t.BOOL, [t.STRING], _fn(network.is_ip))
    free("ip.isCanonical", "ip_is_canonical", t.BOOL, [t.STRING], _fn(network.is_canonical))
    member("family", "ip_family", t.INT, [ip], lambda x: network.family(ip_text(x)))
    for name, fn in (
        ("isUnspecified", network.is_unspecified), ("isLoopback", network.is_loopback),
        ("isLinkLocalMulticast", network.is_link_local_multicast),
        ("isLinkLocalUnicast", network.is_link_local_unicast),
        ("isGlobalUnicast", network.is_global_unicast),
    ):  # fmt: skip
        member(name, f"ip_{name.lower()}", t.BOOL, [ip], _on(fn, ip_text))
    free("cidr", "string_to_cidr", cidr, [t.STRING], lambda x: CIDRMsg(value=network.cidr(x)))
    free("isCIDR", "is_cidr", t.BOOL, [t.STRING], _fn(network.is_cidr))
    member(
        "containsIP",
        "cidr_contains_ip_ip",
        t.BOOL,
        [cidr, ip],
        lambda c, i: network.contains_ip(cidr_text(c), ip_text(i)),
    )
    member(
        "containsIP",
        "cidr_contains_ip_string",
        t.BOOL,
        [cidr, t.STRING],
        lambda c, i: network.contains_ip(cidr_text(c), i, parse=True),
    )
    member(
        "containsCIDR",
        "cidr_contains_cidr",
        t.BOOL,
        [cidr, cidr],
        lambda c, o: network.contains_cidr(cidr_text(c), cidr_text(o)),
    )
    member(
        "containsCIDR",
        "cidr_contains_cidr_string",
        t.BOOL,
        [cidr, t.STRING],
        lambda c, o: network.contains_cidr(cidr_text(c), o, parse=True),
    )
    member("ip", "cidr_ip", ip, [cidr], lambda c: IPMsg(value=network.cidr_ip(cidr_text(c))))
    member(
        "masked",
        "cidr_masked",
        cidr,
        [cidr],
        lambda c: CIDRMsg(value=network.masked(cidr_text(c))),
    )
    member(
        "prefixLength",
        "cidr_prefix_length",
        t.INT,
        [cidr],
        lambda c: network.prefix_length(cidr_text(c)),
    )
    free("string", "ip_to_string", t.STRING, [ip], ip_text)
    free("string", "cidr_to_string", t.STRING, [cidr], cidr_text)


def _url(out: _Overloads) -> None:
    """URL (urls.go)."""
    member = out.member
    free = out.free
    t = cel.Type
    url = cel.Type(URL_TYPE_NAME)
    free("url", "string_to_url", url, [t.STRING], lambda x: URLMsg(value=network.url(x)))
    free("isURL", "is_url_string", t.BOOL, [t.STRING], _fn(network.is_url))
    for name, getter in (
        ("getScheme", network.get_scheme), ("getHost", network.get_host),
        ("getHostname", network.get_hostname), ("getPort", network.get_port),
        ("getEscapedPath", network.get_escaped_path),
    ):  # fmt: skip
        member(name, f"url_{name.lower()}", t.STRING, [url], _on(getter, url_text))
    member(
        "getQuery",
        "url_get_query",
        t.Map(t.STRING, t.List(t.STRING)),
        [url],
        _on(network.get_query, url_text),
    )


def _named_formats(out: _Overloads) -> None:
    """Named formats (format.go): ``format.named`` and ``validate`` return optionals, which
    Python functions cannot build; they return the format or null, the errors or [], and the
    expression is rewritten to wrap them (``driver.cel.rewrites``). Declared dyn for the
    checker; the checked AST gets upstream's types back (``fix_optional_types``)."""
    member = out.member
    free = out.free
    t = cel.Type
    nf = t(FORMAT_TYPE_NAME)
    free("format.named", "format-named", t.DYN, [t.STRING], _format_named)
    for key in formats.FORMATS:
        free(f"format.{key}", f"format.{key}", nf, [], _format_constant(key))
    member("validate", "format-validate", t.DYN, [nf, t.STRING], _format_errors)


def _comprehensions(out: _Overloads) -> None:
    """Two-variable comprehensions: the runtime half cel-expr-python lacks."""
    free = out.free
    t = cel.Type
    m = t.Map(t.DYN, t.DYN)
    free("cel.@mapInsert", "@mapInsert_map_key_value", m, [m, t.DYN, t.DYN], _map_insert)
    free("cel.@mapInsert", "@mapInsert_map_map", m, [m, m], _map_insert)


def _format_named(key: str) -> Any:
    cost.charge(1)
    found = formats.named(key)
    return None if found is None else FormatMsg(name=found.name)


def _format_constant(key: str) -> Callable[[], Any]:
    value = formats.FORMATS[key]

    def constant() -> Any:
        cost.charge(1)
        return FormatMsg(name=value.name)

    return constant


def _format_errors(msg: Any, text: str) -> list[str]:
    """``validate``: the errors (upstream: optional.of(errors), or none when valid)."""
    if not isinstance(msg, FormatMsg):
        raise library.CELFunctionError(f"no such overload: {value_type_name(msg)} is not a format")
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
    return lambda msg: library.semver_int(getattr(to_semver(msg), name))


# Standard-library functions redeclared (and so excluded from cel-cpp's declarations): the
# comparisons, to add upstream's cross-type numeric overloads; ``string``, to add IP and CIDR.
# The runtime keeps cel-cpp's own implementations for every overload but the added ones.
COMPARISONS: Final = {
    "_<_": "less",
    "_<=_": "less_equals",
    "_>_": "greater",
    "_>=_": "greater_equals",
}


def standard_redeclarations(library_overloads: list[Overload]) -> list[Any]:
    t = cel.Type
    decls = []
    same = {
        "bool": t.BOOL, "int64": t.INT, "uint64": t.UINT, "double": t.DOUBLE,
        "string": t.STRING, "bytes": t.BYTES, "timestamp": t.TIMESTAMP, "duration": t.DURATION,
    }  # fmt: skip
    cross = (("int64", "uint64"), ("int64", "double"), ("uint64", "int64"),
             ("uint64", "double"), ("double", "int64"), ("double", "uint64"))  # fmt: skip
    for op, prefix in COMPARISONS.items():
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


LIBRARY: Final = _library()

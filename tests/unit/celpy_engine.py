"""Test-only second implementation of the DRA CEL environment on cel-python (``celpy``), with
the same ``compile(expression) -> selector``, ``selector.matches(device, driver_name)`` shape
as ``driver.cel.engine``, so the conformance table runs on both engines.

The libraries are not re-implemented: quantity and semver (``driver.cel.library``), the
strings extension and regex (``driver.cel.strings``), IP, CIDR and URL (``driver.cel.network``)
are the plain-Python implementations driver.cel.engine binds, here bound to celpy's function
table; the lists and sets extensions, which cel-cpp implements natively, are written here.
celpy reads ``sets.contains(a, b)`` (and ``lists.range``, ``strings.quote``,
``ip.isCanonical``) as a member call on a variable, so those names are bound to namespace
values the functions dispatch on. The ``device`` variable is a celpy map whose
``attributes`` / ``capacity`` return an empty map for an unknown domain, exactly upstream's
behaviour. celpy has no type checker and no cost model: static type errors surface at run time
(the table records each such case as a celpy deviation), and where ``driver.cel.engine``'s
actual-cost meter cancels an evaluation celpy reports the same cancellation, borrowed, instead
of running unbounded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from driver.api.errors import CELCompileError, CELEvaluationError
from driver.api.model import AttributeValue, Device, Version
from driver.api.quantity import Quantity
from driver.cel import engine as dra_cel
from driver.cel import estimate, formats, network
from driver.cel import library as cel_types
from driver.cel import strings as cel_strings


def _library_equal(value: Any, other: object, same: Callable[[Any], bool]) -> bool:
    """Kubernetes' types' Equal: false against null, an error ("no such overload") against a
    value of another type (k8s.io/apiserver/pkg/cel/semver.go and the others)."""
    if other is None:
        return False
    if type(other) is not type(value):
        raise TypeError("no such overload")
    return same(other)


@dataclass(frozen=True, slots=True, eq=False)
class QuantityValue:
    """A ``kubernetes.Quantity`` in celpy: equal by value."""

    value: Quantity

    def __eq__(self, other: object) -> bool:
        return _library_equal(self, other, lambda o: bool(self.value == o.value))

    def __hash__(self) -> int:
        return hash(self.value)


@dataclass(frozen=True, slots=True)
class SemverValue:
    """A ``kubernetes.Semver`` in celpy: equal by precedence."""

    value: cel_types.Semver

    def __eq__(self, other: object) -> bool:
        return _library_equal(self, other, lambda o: self.value.compare(o.value) == 0)

    def __hash__(self) -> int:
        return hash(self.value.precedence_text)


class DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a library error or a wrong argument type into a CEL error value."""

    def wrapper(*args: Any) -> Any:
        try:
            return fn(*args)
        except cel_types.CELFunctionError as exc:
            return CELEvalError(str(exc), type(exc), None)
        except (TypeError, AttributeError) as exc:
            return CELEvalError(f"no such overload: {exc}", type(exc), None)

    return wrapper


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, QuantityValue) and isinstance(b, QuantityValue):
        return a.value.compare(b.value)
    if isinstance(a, SemverValue) and isinstance(b, SemverValue):
        return a.value.compare(b.value)
    raise TypeError(f"compareTo({type(a).__name__}, {type(b).__name__})")


def _quantity(x: Any) -> Quantity:
    if not isinstance(x, QuantityValue):
        raise TypeError(type(x).__name__)
    return x.value


def _semver(x: Any) -> cel_types.Semver:
    if not isinstance(x, SemverValue):
        raise TypeError(type(x).__name__)
    return x.value


def _add(a: Any, b: Any) -> QuantityValue:
    if isinstance(b, celtypes.IntType):
        return QuantityValue(cel_types.quantity_add_int(_quantity(a), int(b)))
    return QuantityValue(_quantity(a) + _quantity(b))


def _sub(a: Any, b: Any) -> QuantityValue:
    if isinstance(b, celtypes.IntType):
        return QuantityValue(cel_types.quantity_sub_int(_quantity(a), int(b)))
    return QuantityValue(_quantity(a) - _quantity(b))


def _str(x: Any) -> str:
    if not isinstance(x, celtypes.StringType):
        raise TypeError(type(x).__name__)
    return str(x)


def _int(x: Any) -> int:
    if not isinstance(x, celtypes.IntType) or isinstance(x, celtypes.BoolType):
        raise TypeError(type(x).__name__)
    return int(x)


def _list(x: Any) -> list[Any]:
    if not isinstance(x, celtypes.ListType):
        raise TypeError(type(x).__name__)
    return list(x)


def _cel(value: Any) -> Any:
    """A Python result of a shared library function as a celpy value."""
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list):
        return celtypes.ListType([_cel(v) for v in value])
    if isinstance(value, dict):
        return celtypes.MapType({_cel(k): _cel(v) for k, v in value.items()})
    return value


def _plain(value: Any) -> Any:
    """A celpy value as the plain Python the shared library functions take."""
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.ListType):
        return [_plain(v) for v in value]
    if isinstance(value, celtypes.MapType):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True, eq=False)
class _TextValue:
    """One of Kubernetes' types held as its text: equal by the text, to its own type only."""

    text: str

    def __eq__(self, other: object) -> bool:
        return _library_equal(self, other, lambda o: self.text == o.text)

    def __hash__(self) -> int:
        return hash(self.text)


class IPValue(_TextValue):
    """A ``net.IP``: its canonical text."""

    __slots__ = ()


class CIDRValue(_TextValue):
    """A ``net.CIDR``: ``address/bits`` as written."""

    __slots__ = ()


class URLValue(_TextValue):
    """A ``kubernetes.URL``: the text it was parsed from."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Namespace:
    """A namespace of qualified function names (``sets``, ``lists``, ``strings``, ``ip``):
    celpy reads ``sets.contains(a, b)`` as the member call ``contains`` on a variable
    ``sets``, which is bound to one of these."""

    name: str


SETS = Namespace("sets")
FORMAT = Namespace("format")
OPTIONAL = Namespace("optional")
LISTS = Namespace("lists")
STRINGS = Namespace("strings")
IP = Namespace("ip")
NET = celtypes.MapType({celtypes.StringType("IP"): IPValue, celtypes.StringType("CIDR"): CIDRValue})


def _on(
    namespace: Namespace, qualified: Callable[..., Any], plain: Callable[..., Any] | None
) -> Callable[..., Any]:
    """One function name shared by a namespace's function and a plain one."""

    def dispatch(first: Any, *rest: Any) -> Any:
        if first is namespace:
            return qualified(*rest)
        if plain is None:
            raise TypeError(f"no such function on {type(first).__name__}")
        return plain(first, *rest)

    return dispatch


def _builtin(name: str) -> Callable[..., Any]:
    function: Callable[..., Any] = celpy.evaluation.base_functions[name]
    return function


# --------------------------------------------------------------------------- strings, regex


def _strings(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A shared strings-extension function on celpy values."""
    return lambda *args: _cel(fn(*(_plain(a) for a in args)))


def _string_member(fn: Callable[..., Any], *params: Callable[[Any], Any]) -> Callable[..., Any]:
    """A shared function on a string receiver whose arguments are of *params*' types (each a
    checker: ``_str`` or ``_int``), trailing ones optional, as the overloads declare."""

    def call(receiver: Any, *args: Any) -> Any:
        if len(args) > len(params):
            raise TypeError(f"{len(args)} arguments")
        return _cel(fn(_str(receiver), *(check(a) for check, a in zip(params, args, strict=False))))

    return call


def _index_of(target: Any, value: Any, *offset: Any) -> Any:
    if isinstance(target, celtypes.StringType):
        return _cel(cel_strings.index_of(str(target), _str(value), *map(_int, offset)))
    items = _list(target)
    return celtypes.IntType(next((i for i, v in enumerate(items) if v == value), -1))


def _last_index_of(target: Any, value: Any, *offset: Any) -> Any:
    if isinstance(target, celtypes.StringType):
        return _cel(cel_strings.last_index_of(str(target), _str(value), *map(_int, offset)))
    found = [i for i, v in enumerate(_list(target)) if v == value]
    return celtypes.IntType(found[-1] if found else -1)


# --------------------------------------------------------------------------- lists, sets


def _includes(target: Any, value: Any) -> celtypes.BoolType:
    """DRA's includes: membership in a list attribute (at most 48 values), equality with a
    scalar one."""
    if isinstance(target, list):
        if len(target) > estimate.INCLUDES_BOUND:
            raise cel_types.CELFunctionError(
                "'includes' function cannot be applied to lists longer than "
                f"{estimate.INCLUDES_BOUND} values"
            )
        return celtypes.BoolType(value in target)
    return celtypes.BoolType(target == value)


def _sum(items: Any) -> Any:
    values = _list(items)
    if not values:
        return celtypes.IntType(0)
    if all(isinstance(v, celtypes.IntType) for v in values):
        return celtypes.IntType(cel_types.check_int64(sum(int(v) for v in values)))
    if all(isinstance(v, celtypes.DoubleType) for v in values):
        return celtypes.DoubleType(sum(float(v) for v in values))
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


def _extreme(pick: Callable[..., Any], name: str) -> Callable[[Any], Any]:
    def extreme(items: Any) -> Any:
        values = _list(items)
        if not values:
            raise cel_types.CELFunctionError(f"{name} called on empty list")
        return pick(values)

    return extreme


def _flatten(items: Any, depth: Any = None) -> Any:
    level = 1 if depth is None else _int(depth)
    if level < 0:
        raise cel_types.CELFunctionError("level must be non-negative")
    out = _list(items)
    for _ in range(level):
        flat: list[Any] = []
        for v in out:
            flat.extend(v if isinstance(v, celtypes.ListType) else [v])
        out = flat
    return celtypes.ListType(out)


def _slice(items: Any, start: Any, end: Any) -> Any:
    values, lo, hi = _list(items), _int(start), _int(end)
    if lo < 0 or hi < 0:
        raise cel_types.CELFunctionError(
            f"cannot slice({lo}, {hi}), negative indexes not supported"
        )
    if lo > hi:
        raise cel_types.CELFunctionError(
            f"cannot slice({lo}, {hi}), start index must be less than or equal to end index"
        )
    if hi > len(values):
        raise cel_types.CELFunctionError(f"cannot slice({lo}, {hi}), list is length {len(values)}")
    return celtypes.ListType(values[lo:hi])


def _distinct(items: Any) -> Any:
    out: list[Any] = []
    for v in _list(items):
        if not any(v == seen for seen in out):
            out.append(v)
    return celtypes.ListType(out)


def _contains_all(a: Any, b: Any) -> bool:
    return all(any(x == y for y in _list(a)) for x in _list(b))


def _set_contains(a: Any, b: Any) -> Any:
    return celtypes.BoolType(_contains_all(a, b))


def _set_equivalent(a: Any, b: Any) -> Any:
    return celtypes.BoolType(_contains_all(a, b) and _contains_all(b, a))


def _set_intersects(a: Any, b: Any) -> Any:
    return celtypes.BoolType(any(x == y for x in _list(a) for y in _list(b)))


def _range(n: Any) -> Any:
    return celtypes.ListType(celtypes.IntType(i) for i in range(_int(n)))


# --------------------------------------------------------------------------- IP, CIDR, URL


def _ip(value: Any) -> Any:
    if isinstance(value, CIDRValue):  # cidr.ip()
        return IPValue(network.cidr_ip(value.text))
    return IPValue(network.ip(_str(value)))


def _ip_text(value: Any) -> str:
    if not isinstance(value, IPValue):
        raise TypeError(type(value).__name__)
    return value.text


def _cidr_text(value: Any) -> str:
    if not isinstance(value, CIDRValue):
        raise TypeError(type(value).__name__)
    return value.text


def _url_text(value: Any) -> str:
    if not isinstance(value, URLValue):
        raise TypeError(type(value).__name__)
    return value.text


def _contains_ip(c: Any, other: Any) -> Any:
    if isinstance(other, IPValue):
        return celtypes.BoolType(network.contains_ip(_cidr_text(c), other.text))
    return celtypes.BoolType(network.contains_ip(_cidr_text(c), _str(other), parse=True))


def _contains_cidr(c: Any, other: Any) -> Any:
    if isinstance(other, CIDRValue):
        return celtypes.BoolType(network.contains_cidr(_cidr_text(c), other.text))
    return celtypes.BoolType(network.contains_cidr(_cidr_text(c), _str(other), parse=True))


def _string(value: Any) -> Any:
    if isinstance(value, IPValue | CIDRValue):
        return celtypes.StringType(value.text)
    return _builtin("string")(value)


def _contains(target: Any, *rest: Any) -> Any:
    if target == SETS:
        return _set_contains(*rest)
    return _builtin("contains")(target, *rest)


def _url_getter(getter: Callable[[str], Any]) -> Callable[[Any], Any]:
    return lambda u: _cel(getter(_url_text(u)))


def _ip_check(check: Callable[[str], bool]) -> Callable[[Any], Any]:
    return lambda v: celtypes.BoolType(check(_ip_text(v)))


# --------------------------------------------------------------------------- optionals, formats


@dataclass(frozen=True, slots=True)
class OptionalValue:
    """An optional (``optional.of(v)`` / ``optional.none()``), as far as the named formats
    need it: celpy 0.5 has no optional type, and its parser no ``.?`` syntax."""

    present: bool
    value: Any = None


NONE = OptionalValue(False)


@dataclass(frozen=True, slots=True, eq=False)
class FormatValue:
    """A ``kubernetes.NamedFormat``: equal by upstream's Name."""

    format: formats.NamedFormat

    def __eq__(self, other: object) -> bool:
        return _library_equal(self, other, lambda o: self.format.name == o.format.name)

    def __hash__(self) -> int:
        return hash(self.format.name)


def _optional_value(o: Any) -> Any:
    if not isinstance(o, OptionalValue):
        raise TypeError(type(o).__name__)
    if not o.present:
        raise CELEvalError("optional.none() dereference")
    return o.value


def _validate(f: Any, text: Any) -> OptionalValue:
    if not isinstance(f, FormatValue):
        raise TypeError(type(f).__name__)
    errors = f.format.validate(_str(text))
    return OptionalValue(True, _cel(errors)) if errors else NONE


def _named(name: Any) -> OptionalValue:
    found = formats.named(_str(name))
    return NONE if found is None else OptionalValue(True, FormatValue(found))


def _constant_format(key: str) -> Callable[..., Any]:
    return _on(FORMAT, lambda: FormatValue(formats.FORMATS[key]), None)


_OPTIONALS: dict[str, Callable[..., Any]] = {
    "none": _on(OPTIONAL, lambda: NONE, None),
    "of": _on(OPTIONAL, lambda v: OptionalValue(True, v), None),
    "hasValue": lambda o: celtypes.BoolType(isinstance(o, OptionalValue) and o.present),
    "value": _optional_value,
    "orValue": lambda o, other: o.value if _optional_value_or(o) else other,
    "named": _on(FORMAT, _named, None),
    "validate": _validate,
    **{key: _constant_format(key) for key in formats.FORMATS},
}


def _optional_value_or(o: Any) -> bool:
    if not isinstance(o, OptionalValue):
        raise TypeError(type(o).__name__)
    return o.present


_LIBRARY: dict[str, Callable[..., Any]] = {
    # quantity, semver (driver.cel.library)
    "quantity": lambda s: QuantityValue(cel_types.parse_quantity(_str(s))),
    "isQuantity": lambda s: celtypes.BoolType(cel_types.is_quantity(_str(s))),
    "sign": lambda q: celtypes.IntType(_quantity(q).sign()),
    "isInteger": lambda q: celtypes.BoolType(_quantity(q).is_integer()),
    "asInteger": lambda q: celtypes.IntType(cel_types.quantity_as_integer(_quantity(q))),
    "asApproximateFloat": lambda q: celtypes.DoubleType(_quantity(q).as_approximate_float()),
    "add": _add,
    "sub": _sub,
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "semver": lambda s, n=False: SemverValue(cel_types.parse_semver(_str(s), bool(n))),
    "isSemver": lambda s, n=False: celtypes.BoolType(cel_types.is_semver(_str(s), bool(n))),
    "major": lambda v: celtypes.IntType(cel_types.semver_int(_semver(v).major)),
    "minor": lambda v: celtypes.IntType(cel_types.semver_int(_semver(v).minor)),
    "patch": lambda v: celtypes.IntType(cel_types.semver_int(_semver(v).patch)),
    # strings extension, version 2, and regex (driver.cel.strings)
    "charAt": _string_member(cel_strings.char_at, _int),
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": _string_member(cel_strings.lower_ascii),
    "upperAscii": _string_member(cel_strings.upper_ascii),
    "replace": _string_member(cel_strings.replace, _str, _str, _int),
    "split": _string_member(cel_strings.split, _str, _int),
    "substring": _string_member(cel_strings.substring, _int, _int),
    "trim": _string_member(cel_strings.trim),
    "join": lambda items, *sep: _cel(
        cel_strings.join([_plain(v) for v in _list(items)], *map(_str, sep))
    ),
    "format": lambda text, args: _cel(
        cel_strings.format_string(_str(text), [_plain(v) for v in _list(args)])
    ),
    "quote": _on(STRINGS, _strings(cel_strings.quote), None),
    "find": _string_member(cel_strings.find, _str),
    "findAll": _string_member(cel_strings.find_all, _str, _int),
    # Kubernetes lists, DRA's includes
    "includes": _includes,
    "isSorted": lambda items: celtypes.BoolType(_list(items) == sorted(_list(items))),
    "sum": _sum,
    "max": _extreme(max, "max"),
    # lists extension, version 3
    "flatten": _flatten,
    "slice": _slice,
    "reverse": lambda items: celtypes.ListType(list(reversed(_list(items)))),
    "sort": lambda items: celtypes.ListType(sorted(_list(items))),
    "distinct": _distinct,
    "range": _on(LISTS, _range, None),
    # sets extension
    "contains": _contains,
    "equivalent": _on(SETS, _set_equivalent, None),
    "intersects": _on(SETS, _set_intersects, None),
    # IP, CIDR, URL (driver.cel.network)
    "ip": _ip,
    "isIP": lambda s: celtypes.BoolType(network.is_ip(_str(s))),
    "isCanonical": _on(IP, lambda s: celtypes.BoolType(network.is_canonical(_str(s))), None),
    "family": lambda v: celtypes.IntType(network.family(_ip_text(v))),
    "isUnspecified": _ip_check(network.is_unspecified),
    "isLoopback": _ip_check(network.is_loopback),
    "isLinkLocalMulticast": _ip_check(network.is_link_local_multicast),
    "isLinkLocalUnicast": _ip_check(network.is_link_local_unicast),
    "isGlobalUnicast": _ip_check(network.is_global_unicast),
    "cidr": lambda s: CIDRValue(network.cidr(_str(s))),
    "isCIDR": lambda s: celtypes.BoolType(network.is_cidr(_str(s))),
    "containsIP": _contains_ip,
    "containsCIDR": _contains_cidr,
    "masked": lambda c: CIDRValue(network.masked(_cidr_text(c))),
    "prefixLength": lambda c: celtypes.IntType(network.prefix_length(_cidr_text(c))),
    "string": _string,
    "url": lambda s: URLValue(network.url(_str(s))),
    "isURL": lambda s: celtypes.BoolType(network.is_url(_str(s))),
    "getScheme": _url_getter(network.get_scheme),
    "getHost": _url_getter(network.get_host),
    "getHostname": _url_getter(network.get_hostname),
    "getPort": _url_getter(network.get_port),
    "getEscapedPath": _url_getter(network.get_escaped_path),
    "getQuery": _url_getter(network.get_query),
    **_OPTIONALS,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {name: _guard(fn) for name, fn in _LIBRARY.items()}


def _attribute(value: AttributeValue) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, Version):
        return SemverValue(cel_types.parse_semver(value.text))
    return celtypes.ListType([_attribute(v) for v in value])


def device_value(device: Device, driver_name: str) -> celtypes.MapType:
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device.attributes.items():
        domain, ident = dra_cel.split_qualified_name(name, driver_name)
        try:
            attributes.setdefault(domain, {})[ident] = _attribute(value)
        except cel_types.CELFunctionError as exc:
            raise CELEvaluationError(
                f"device {device.name!r}: attribute {name}: parse semantic version: {exc}"
            ) from exc
    capacity: dict[str, dict[str, Any]] = {}
    for name, cap in device.capacity.items():
        domain, ident = dra_cel.split_qualified_name(name, driver_name)
        capacity.setdefault(domain, {})[ident] = QuantityValue(cap.value)

    def domains(tree: dict[str, dict[str, Any]]) -> DomainMap:
        return DomainMap(
            {
                celtypes.StringType(d): celtypes.MapType(
                    {celtypes.StringType(k): v for k, v in ids.items()}
                )
                for d, ids in tree.items()
            }
        )

    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver_name),
            celtypes.StringType("attributes"): domains(attributes),
            celtypes.StringType("capacity"): domains(capacity),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
                device.allow_multiple_allocations
            ),
        }
    )


@dataclass(frozen=True, slots=True)
class CelpySelector:
    expression: str
    program: Any
    metered: Any  # driver.cel.engine's selector when it meters the expression, else None

    def matches(self, device: Device, driver_name: str) -> bool:
        if self.metered is not None:
            _borrowed_cancellation(self.metered, device, driver_name)
        try:
            result = self.program.evaluate(
                {"device": device_value(device, driver_name), **_NAMESPACES}
            )
        except CELEvalError as exc:
            raise CELEvaluationError(f"on device {device.name!r}: {_message(exc)}") from exc
        except RecursionError as exc:
            raise CELEvaluationError(f"on device {device.name!r}: nested too deeply") from exc
        except TypeError as exc:  # celpy lets some type errors escape as Python exceptions
            raise CELEvaluationError(f"on device {device.name!r}: {exc}") from exc
        except ValueError as exc:  # a macro called with more arguments than celpy's take
            raise CELEvaluationError(f"on device {device.name!r}: {exc}") from exc
        if not isinstance(result, celtypes.BoolType):
            raise CELEvaluationError(
                f"on device {device.name!r}: must evaluate to bool, got {type(result).__name__}"
            )
        return bool(result)


_MESSAGES = (
    ("no such member in mapping", "no such key"),
    ("found no matching overload", "no such overload"),
)


def _message(exc: CELEvalError) -> str:
    """celpy's wording mapped onto upstream's for the messages the table checks."""
    text = str(exc.args[0])
    for theirs, ours in _MESSAGES:
        text = text.replace(theirs, ours)
    return text


_NAMESPACES: dict[str, Any] = {
    "sets": SETS,
    "format": FORMAT,
    "optional": OPTIONAL,
    "lists": LISTS,
    "strings": STRINGS,
    "ip": IP,
    "net": NET,
}
_ENV = celpy.Environment()


def _metered(expression: str) -> Any:
    """driver.cel.engine's selector for an expression it meters (its estimate could pass the
    cost limit), else None: celpy has no cost model of its own."""
    try:
        selector = dra_cel.compile_selector(expression)
    except CELCompileError:
        return None  # nothing to guard: it does not compile upstream either
    return selector if selector.metered else None


def _borrowed_cancellation(selector: Any, device: Device, driver_name: str) -> None:
    """Where driver.cel.engine's actual-cost meter cancels the evaluation, celpy reports the
    same cancellation instead of running (it would run unbounded)."""
    try:
        selector.matches(device, driver_name)
    except CELEvaluationError as exc:
        if "operation cancelled" in str(exc):
            raise CELEvaluationError(
                f"on device {device.name!r}: {str(exc).rsplit(': ', 1)[-1]} (borrowed)"
            ) from exc


def compile(expression: str) -> CelpySelector:  # noqa: A001 - the engine-neutral name
    if len(expression.encode()) > dra_cel.MAX_EXPRESSION_LENGTH:
        raise CELCompileError(f"CEL expression is too long: {len(expression.encode())} bytes")
    try:
        ast = _ENV.compile(expression)
    except CELParseError as exc:
        raise CELCompileError(f"compilation failed: {exc}") from exc
    except RecursionError as exc:
        raise CELCompileError("compilation failed: nested too deeply") from exc
    return CelpySelector(expression, _ENV.program(ast, functions=_FUNCTIONS), _metered(expression))

"""Test-only second implementation of the DRA CEL environment on cel-python (``celpy``), with
the same ``compile(expression) -> selector``, ``selector.matches(device, driver_name)`` shape
as ``driver.cel.engine``, so the conformance table runs on both engines.

The Kubernetes libraries are not re-implemented: quantity and semver come from
``driver.cel.library`` (plain Python), bound to celpy's function table; the strings-extension
functions celpy lacks are added here. The ``device`` variable is a celpy map whose
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
from driver.cel import library as cel_types


@dataclass(frozen=True, slots=True)
class QuantityValue:
    """A ``kubernetes.Quantity`` in celpy: equal by value."""

    value: Quantity


@dataclass(frozen=True, slots=True)
class SemverValue:
    """A ``kubernetes.Semver`` in celpy: equal by precedence."""

    value: cel_types.Semver

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SemverValue) and self.value.compare(other.value) == 0

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


def _substring(s: Any, start: Any, end: Any = None) -> celtypes.StringType:
    text = _str(s)
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        raise cel_types.CELFunctionError(f"substring: index out of range: {int(start)}, {stop}")
    return celtypes.StringType(text[int(start) : stop])


def _index_of(s: Any, sub: Any) -> celtypes.IntType:
    return celtypes.IntType(_str(s).find(_str(sub)))


def _split(s: Any, sep: Any) -> celtypes.ListType:
    return celtypes.ListType([celtypes.StringType(p) for p in _str(s).split(_str(sep))])


def _join(items: Any, sep: Any = None) -> celtypes.StringType:
    return celtypes.StringType(("" if sep is None else _str(sep)).join(_str(i) for i in items))


def _includes(target: Any, value: Any) -> celtypes.BoolType:
    """DRA's includes: membership in a list attribute (at most 48 values), equality with a
    scalar one."""
    if isinstance(target, list):
        if len(target) > dra_cel.estimate.INCLUDES_BOUND:
            raise cel_types.CELFunctionError(
                "'includes' function cannot be applied to lists longer than "
                f"{dra_cel.estimate.INCLUDES_BOUND} values"
            )
        return celtypes.BoolType(value in target)
    return celtypes.BoolType(target == value)


_LIBRARY: dict[str, Callable[..., Any]] = {
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
    "major": lambda v: celtypes.IntType(_semver(v).major),
    "minor": lambda v: celtypes.IntType(_semver(v).minor),
    "patch": lambda v: celtypes.IntType(_semver(v).patch),
    "lowerAscii": lambda s: celtypes.StringType(_str(s).lower()),
    "upperAscii": lambda s: celtypes.StringType(_str(s).upper()),
    "trim": lambda s: celtypes.StringType(_str(s).strip()),
    "replace": lambda s, a, b: celtypes.StringType(_str(s).replace(_str(a), _str(b))),
    "substring": _substring,
    "indexOf": _index_of,
    "lastIndexOf": lambda s, sub: celtypes.IntType(_str(s).rfind(_str(sub))),
    "charAt": lambda s, i: celtypes.StringType(_str(s)[int(i) : int(i) + 1]),
    "split": _split,
    "join": _join,
    "includes": _includes,
    "isSorted": lambda items: celtypes.BoolType(list(items) == sorted(items)),
    "sum": lambda items: celtypes.IntType(cel_types.check_int64(sum(int(i) for i in items))),
    "min": min,
    "max": max,
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
            result = self.program.evaluate({"device": device_value(device, driver_name)})
        except CELEvalError as exc:
            raise CELEvaluationError(f"on device {device.name!r}: {_message(exc)}") from exc
        except RecursionError as exc:
            raise CELEvaluationError(f"on device {device.name!r}: nested too deeply") from exc
        except TypeError as exc:  # celpy lets some type errors escape as Python exceptions
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

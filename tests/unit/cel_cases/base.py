"""The model of the DRA CEL conformance table: :class:`Case`, :class:`Deviation`, the devices
cases run against, and the reasons cel-python (the second engine) differs.

A case names its expression and device, the expected result or the expected error class with
a fragment of the message, and where it comes from (``cites``: the upstream test by file and
test name). Where upstream pins a cost, the case carries it: ``cost`` is upstream's static
estimate (the maximum, or (min, max)), ``actual`` its actual cost; both are asserted on
``driver.cel.engine``, and the actual cost never passes the estimate (as upstream's TestCEL
checks). ``celpy`` says what cel-python does instead of upstream, and why; ``upstream`` marks a
case where ``driver.cel.engine`` knowingly differs from upstream (the expectation is then
biaxial's behaviour, the note says upstream's, and driver.cel's docstring lists it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from driver.api.errors import CELCompileError, CELEvaluationError
from driver.api.model import AttributeValue, Capacity, Device, Version
from driver.api.quantity import Quantity

# Upstream's test repositories, at the versions the DRA selector environment pins
# (k8s.io/dynamic-resource-allocation go.mod: k8s.io/apiserver c9f9cf747e61, cel-go v0.27.0).
DRA_TESTS = "kubernetes/dynamic-resource-allocation cel/compile_test.go"
APISERVER_LIBRARY = "kubernetes/apiserver pkg/cel/library"
APIEXTENSIONS_TESTS = (
    "kubernetes/apiextensions-apiserver pkg/apiserver/schema/cel/validation_test.go"
)
CEL_GO_EXT = "google/cel-go@v0.27.0 ext"


@dataclass(frozen=True, slots=True)
class Deviation:
    """What cel-python does instead of upstream, and why."""

    reason: str
    result: bool | None = None
    error: type[Exception] | None = None
    fragment: str = ""


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    expression: str
    result: bool | None = None
    error: type[Exception] | None = None
    fragment: str = ""
    device: Device = field(default_factory=lambda: EMPTY)
    driver: str = ""
    celpy: Deviation | None = None
    upstream: str = ""
    cites: str = ""
    cost: int | tuple[int, int] | None = None
    actual: int | None = None


def ok(name: str, expression: str, result: bool = True, **kw: Any) -> Case:
    return Case(name, expression, result=result, **kw)


def runtime(name: str, expression: str, fragment: str = "", **kw: Any) -> Case:
    return Case(name, expression, error=CELEvaluationError, fragment=fragment, **kw)


def compile_error(name: str, expression: str, fragment: str = "", **kw: Any) -> Case:
    return Case(name, expression, error=CELCompileError, fragment=fragment, **kw)


def scoped(
    cites: str,
    *,
    collapse: bool = False,
    celpy: Callable[[str], Deviation] | None = None,
) -> tuple[Callable[..., Case], Callable[..., Case], Callable[..., Case]]:
    """``ok``, ``runtime`` and ``compile_error`` for the cases of one upstream test: each named
    ``"<cites>: <expression>"`` (its whitespace collapsed with *collapse*) and citing it. A
    case's cel-python deviation defaults to *celpy*'s for its expression, or else, for a compile
    error, to :func:`celpy_compile` (celpy has no checker)."""

    def name(expression: str) -> str:
        return f"{cites}: {' '.join(expression.split()) if collapse else expression}"

    def deviation(kw: dict[str, Any], expression: str, compile_time: bool) -> dict[str, Any]:
        if celpy is not None:
            kw.setdefault("celpy", celpy(expression))
        elif compile_time:
            kw.setdefault("celpy", celpy_compile())
        return kw

    def scoped_ok(expression: str, result: bool = True, **kw: Any) -> Case:
        kw = deviation(kw, expression, False)
        return ok(name(expression), expression, result, cites=cites, **kw)

    def scoped_runtime(expression: str, fragment: str, **kw: Any) -> Case:
        kw = deviation(kw, expression, False)
        return runtime(name(expression), expression, fragment, cites=cites, **kw)

    def scoped_compile_error(expression: str, fragment: str, **kw: Any) -> Case:
        kw = deviation(kw, expression, True)
        return compile_error(name(expression), expression, fragment, cites=cites, **kw)

    return scoped_ok, scoped_runtime, scoped_compile_error


def cited(cites: str, cases: tuple[Case, ...] | list[Case]) -> tuple[Case, ...]:
    """*cases* with *cites* filled in where a case names no source of its own."""
    return tuple(c if c.cites else replace(c, cites=cites) for c in cases)


def device(
    driver: str,
    attributes: Mapping[str, AttributeValue] | None = None,
    capacity: Mapping[str, str] | None = None,
    *,
    multi: bool = False,
    name: str = "dev-0",
) -> Device:
    """A device of *driver* with the given attributes and capacities (quantity strings)."""
    del driver  # the driver is the case's; kept in the call for readability
    return Device(
        name=name,
        attributes=dict(attributes or {}),
        capacity={k: Capacity(Quantity.parse(v)) for k, v in (capacity or {}).items()},
        allow_multiple_allocations=multi,
    )


EMPTY = Device(name="dev-0")

# --------------------------------------------------------------------------- celpy reasons

NO_TYPE_CHECKER = "celpy has no type checker: the static type error surfaces at run time"
NO_TYPE_CHECKER_BOOL = "celpy has no type checker: the non-bool result surfaces at run time"
NO_OPTIONAL = "celpy 0.5 does not parse optional-type syntax (.?, optional.of)"
NO_BIND = "celpy 0.5 has no cel.bind extension"
NO_TWO_VARIABLE = (
    "celpy 0.5's macros take one variable: two-variable comprehensions (all(k, v, p), "
    "transformList, transformMap, ...) are not macros there"
)
NO_SORT_BY = "celpy 0.5 has no sortBy macro: the key expression's variable is unbound"
NO_MAP_FILTER = "celpy 0.5's map macro takes one expression, not map(x, filter, expr)"
CELPY_IS_UPSTREAM = (
    "celpy gives upstream's answer here; driver.cel.engine deviates (see `upstream`)"
)
HETEROGENEOUS_EQ = (
    "celpy raises 'no matching overload' for == between different types; cel-spec (and cel-go,"
    " cel-cpp) define heterogeneous equality as false"
)
CELPY_COST = (
    "celpy has no cost model: it reports the cancellation of driver.cel.engine's actual-cost"
    " meter instead of running unbounded"
)
CELPY_MESSAGE = "celpy reports this error in its own words"


def celpy_compile(reason: str = NO_TYPE_CHECKER, fragment: str = "") -> Deviation:
    """celpy finds at run time what the checker finds at compile time."""
    return Deviation(reason, error=CELEvaluationError, fragment=fragment)


def celpy_error(reason: str, fragment: str = "") -> Deviation:
    return Deviation(reason, error=CELEvaluationError, fragment=fragment)


def celpy_syntax(reason: str, fragment: str = "") -> Deviation:
    return Deviation(reason, error=CELCompileError, fragment=fragment)


def version(text: str) -> Version:
    return Version(text)

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
* :class:`~driver.cel.matchcache.MatchCache` caches results and errors per (expression,
  device, slice generation) and builds each device's CEL input once; a deadline is not cached
  (it passes through). Everything else here is pure and immutable.

The rooms
---------
This module is the selectors' front door (compile, evaluate, measure). Behind it, each concept
in a module of its own, lowest first: ``values`` (Kubernetes' types as CEL values),
``bindings`` (every library overload and its Python implementation), ``dispatch`` (runtime
names, dyn dispatch), ``loops`` (comprehensions driven from Python), ``messages`` (error
wording), ``environment`` (the one CEL environment), ``rewrites`` (checked-AST rewrites for
cel-go's semantics), ``compiler`` (checking, compile-time rules, programs); ``matchcache``
caches results per device. The plain-Python libraries they bind are ``library``, ``strings``,
``network`` and ``formats``; the cost model is ``cost``, ``estimate`` and ``instrument``; deep
expressions are ``syntax`` and ``deep``.

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
  (``driver.cel.rewrites``); a list's or map's equality, which upstream counts as
  equal where an element comparison errs, is false here.
* **Library functions** run in Python. The runtime keeps one implementation per name and
  argument kinds, so every overload of a library function is renamed in the checked expression
  to a private name with its own implementation and return type (``driver.cel.dispatch``).
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
  an empty one, and ``driver.cel.rewrites`` wraps each call in CEL.
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

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

from cel_expr_python import cel

from driver.api.errors import CELCompileError, CELEvaluationError, DeadlineExceededError
from driver.api.model import Device
from driver.cel import (
    checked,
    cost,
    estimate,
    library,
)
from driver.cel.compiler import (
    COST_LIMIT,
    MAX_EXPRESSION_LENGTH,
    compile_expression,
    driven_form,
    instrumented_program,
)
from driver.cel.environment import cel_env
from driver.cel.loops import eval_driven
from driver.cel.messages import runtime_message
from driver.cel.values import attribute_value, quantity_value

__all__ = [
    "COMPILE_CACHE_SIZE",
    "COST_LIMIT",
    "DEADLINE_METERING_FROM",
    "MAX_EXPRESSION_LENGTH",
    "DeviceInput",
    "Measurement",
    "Selector",
    "compile_selector",
    "device_input",
    "measure",
    "shorten",
    "split_qualified_name",
]

#: A selector estimated above this also gets an instrumented program, run while a deadline is
#: set, so the deadline stops it within one step rather than one evaluation.
DEADLINE_METERING_FROM: Final = 10_000
COMPILE_CACHE_SIZE: Final = 1024


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
        activation = cel_env().Activation(self.padded_variables(domains))
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
            attributes.setdefault(domain, {})[ident] = attribute_value(value)
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
        activation=cel_env().Activation(variables),
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
        """Evaluate against a prepared :class:`DeviceInput` (see
        :class:`~driver.cel.matchcache.MatchCache`)."""
        if self._program is None:
            return compile_selector(self.expression).evaluate(device, device_name)
        try:
            result, meter = _run(self, device, device_name)
        except RuntimeError as exc:  # the engine's own failures
            raise self._error(device_name, runtime_message(str(exc))) from exc
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
            raise self._error(device_name, runtime_message(str(value)))
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
    driven = driven_form(selector.expression, metered)
    fresh = cost.Meter(bounds) if metered else None
    with cost.metering(fresh):
        return eval_driven(driven, device.padded_variables(selector.domains)), fresh


def _budget_exceeded(exc: RuntimeError) -> bool:
    return "Iteration budget exceeded" in str(exc)


def shorten(expression: str, limit: int = 120) -> str:
    """An expression cut to *limit* characters for messages (10 KiB ones stay readable)."""
    return expression if len(expression) <= limit else expression[: limit - 3] + "..."


@lru_cache(maxsize=COMPILE_CACHE_SIZE)
def compile_selector(expression: str) -> Selector:
    """Compile a selector once (LRU-cached per expression string); see the module docstring."""
    compiled = compile_expression(expression)
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
        _metered=instrumented_program(compiled)
        if compiled.needs_meter or bounded_but_long
        else None,
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
    compiled = compile_expression(expression)
    selector = Selector(
        expression=expression,
        _program=compiled.program,
        domains=checked.literal_domains(compiled.checked.expr),
        max_cost=compiled.cost[1],
        _metered=instrumented_program(compiled),
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
            return Measurement(span, 0, error=runtime_message(str(exc)))
    assert meter is not None
    if meter.exceeded:
        return Measurement(span, meter.cost, error=meter.reason)
    try:
        value = result.plain_value()
    except TypeError:  # a value with no Python form (an optional)
        return Measurement(span, meter.cost, value=None)
    if result.type() == cel.Type.ERROR:
        return Measurement(span, meter.cost, error=runtime_message(str(value)))
    return Measurement(span, meter.cost, value=value)

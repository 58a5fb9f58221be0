"""The DRA CEL engine: device selectors with upstream semantics
(k8s.io/dynamic-resource-allocation/cel), on cel-expr-python (Google's C++ CEL).

Contract
--------
* :func:`compile_selector` compiles once per expression string (LRU cache) and raises
  :class:`~driver.api.errors.CELCompileError` for syntax and type errors (with the position, e.g.
  ``<input>:1:8: Syntax error: ...``), for expressions longer than
  :data:`MAX_EXPRESSION_LENGTH` bytes, and when the result type is statically known not to be
  bool.
* :meth:`Selector.matches` evaluates against one device and returns the bool result. Every
  runtime problem (no such key, no matching overload, a non-bool result, an invalid version
  attribute, the cost limit) raises :class:`~driver.api.errors.CELEvaluationError` naming the
  expression and the device: upstream treats these as errors for the pod, never as "does not
  match".
* :class:`MatchCache` caches results and errors per (expression, device, slice generation) and
  builds each device's CEL input once. Everything else here is pure and immutable.

The ``device`` variable
-----------------------
``device.driver`` (string), ``device.attributes`` (map domain -> map id -> value),
``device.capacity`` (map domain -> map id -> quantity), ``device.allowMultipleAllocations``
(bool). Unqualified keys live under the driver name's domain; ``a.io/b`` under ``a.io``.
Attribute values: int, bool, string, version -> ``kubernetes.Semver``, lists -> CEL lists.

Faithful representations of what cel-expr-python cannot express natively, and the
deviations they leave:

* **Object type.** Upstream declares ``device`` as the object type ``kubernetes.DRADevice``.
  Here its four fields are four variables with dotted names (``device.driver`` ...), which CEL
  name resolution reads exactly like field selections, fully typed: ``device.driver + 1`` and
  ``device.nosuchfield`` are compile errors as upstream. A bare ``device`` (not a field of it)
  does not resolve, and ``has(device.driver)`` yields the variable rather than ``true``
  (a compile error for the string fields, the value for ``allowMultipleAllocations``).
* **Quantity and Semver.** The engine has no opaque runtime types, so these are protobuf
  messages ``kubernetes.Quantity`` / ``kubernetes.Semver`` (upstream's type names) from a
  private descriptor pool, carrying the exact value (nano-units, or the version without build
  metadata), so ``==`` means equal value / equal precedence as upstream. Their fields
  (``nanos``, ``version``) are visible to field selection, which upstream does not offer.
  The library functions run in Python (``driver.cel.library``); the runtime registers one
  implementation per member name, which dispatches on the receiver.
* **Unknown domains.** Upstream returns an empty map for any domain the device does not have.
  The C++ maps cannot default, so every domain the expression names *literally*
  (``device.attributes["x.io"]``, ``.?x``, ``cel.bind`` of it) that the device lacks is added
  as an empty map to that evaluation's input. A domain computed at run time
  (``device.attributes["x" + ".io"]``) that the device lacks is a "no such key" error, and a
  literally named missing domain shows up in ``in``, ``size()`` and iteration over
  ``device.attributes``, where upstream would not list it.
* **Cost.** The engine has no cost tracking. The worst-case cost is estimated once at compile
  time over the checked AST with upstream's size bounds (``driver.cel.checked``); an expression
  whose estimate exceeds :data:`COST_LIMIT` fails every evaluation with a cost-limit error
  before it runs (upstream rejects such expressions when they are written, and stops them at
  run time).
* **Libraries.** Kubernetes' quantity and semver libraries, the strings extension, optional
  types (``.?``, ``orValue``), ``cel.bind``, the list-attribute helper ``includes()``
  (membership on a list, equality on a scalar), the sets library (``sets.contains``,
  ``sets.equivalent``, ``sets.intersects``) and, of the lists library, ``isSorted()`` and
  ``sum()``/``min()``/``max()`` of int lists are available (the last ones in Python: the
  runtime keeps one implementation, and one return type, per receiver kind). The rest of the
  lists library (``indexOf`` would clash with the strings extension's), regex ``find``, the
  URL and IP/CIDR libraries and two-variable comprehensions are not; they are compile errors
  ("undeclared reference").

Where the result differs from upstream's (the object-type and unknown-domain notes above), the
conformance table has a case with an ``upstream`` note, and cel-python, which gives upstream's
answer there, is asserted to do so.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from driver.api.errors import CELCompileError, CELEvaluationError
from driver.api.ids import DeviceID
from driver.api.model import AttributeValue, Device, Version
from driver.api.quantity import Quantity
from driver.cel import checked, library

MAX_EXPRESSION_LENGTH: Final = 10 * 1024  # bytes, upstream CELSelectorExpressionMaxLength
COST_LIMIT: Final = 1_000_000  # upstream CELSelectorExpressionMaxCost
COMPILE_CACHE_SIZE: Final = 1024

QUANTITY_TYPE_NAME: Final = "kubernetes.Quantity"
SEMVER_TYPE_NAME: Final = "kubernetes.Semver"

# --------------------------------------------------------------------------- value types


def _build_value_types() -> tuple[Any, type[Any], type[Any]]:
    string = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    fdp = descriptor_pb2.FileDescriptorProto(
        name="biaxial/kubernetes_cel_types.proto", package="kubernetes", syntax="proto3"
    )
    for name, field_name in (("Quantity", "nanos"), ("Semver", "version")):
        msg = fdp.message_type.add(name=name)
        msg.field.add(name=field_name, number=1, type=string, label=optional)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    quantity_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(QUANTITY_TYPE_NAME))
    semver_cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(SEMVER_TYPE_NAME))
    return pool, quantity_cls, semver_cls


_POOL, _QuantityMsg, _SemverMsg = _build_value_types()


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


@lru_cache(maxsize=4096)
def _semver_literal(text: str, normalize: bool = False) -> Any:
    """``semver(s[, normalize])``; memoised like :func:`_quantity_literal`."""
    return _semver_value(library.parse_semver(text, normalize))


def _type_name(value: Any) -> str:
    if isinstance(value, _QuantityMsg):
        return QUANTITY_TYPE_NAME
    if isinstance(value, _SemverMsg):
        return SEMVER_TYPE_NAME
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
    """``compareTo`` of two quantities or two versions (one runtime implementation for both)."""
    if isinstance(receiver, _QuantityMsg) and isinstance(other, _QuantityMsg):
        return _to_quantity(receiver).compare(_to_quantity(other))
    if isinstance(receiver, _SemverMsg) and isinstance(other, _SemverMsg):
        return _to_semver(receiver).compare(_to_semver(other))
    raise library.CELFunctionError(
        f"no such overload: {_type_name(receiver)} compared with {_type_name(other)}"
    )


def _add(receiver: Any, other: Any) -> Any:
    if isinstance(other, int):
        return quantity_value(library.quantity_add_int(_to_quantity(receiver), other))
    return quantity_value(_to_quantity(receiver) + _to_quantity(other))


def _sub(receiver: Any, other: Any) -> Any:
    if isinstance(other, int):
        return quantity_value(library.quantity_sub_int(_to_quantity(receiver), other))
    return quantity_value(_to_quantity(receiver) - _to_quantity(other))


def _includes(receiver: Any, value: Any) -> bool:
    """``includes()``: membership for a list attribute, equality for a scalar one, so one
    selector works whether a driver publishes a value or a list (DRAListTypeAttributes)."""
    if isinstance(receiver, list):
        return value in receiver
    return bool(receiver == value)


def _is_sorted(items: list[Any]) -> bool:
    try:
        return all(a <= b for a, b in itertools.pairwise(items))
    except TypeError as exc:  # mixed element types in a dyn list, or versions
        raise library.CELFunctionError(f"no such overload: isSorted on {items!r}") from exc


def _int_list(items: list[Any], function: str) -> list[int]:
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise library.CELFunctionError(f"no such overload: {function}() needs a list of ints")
    return items


def _min_max(items: list[Any], function: str, pick: Callable[[list[int]], int]) -> int:
    values = _int_list(items, function)
    if not values:
        raise library.CELFunctionError(f"{function}() of an empty list")
    return pick(values)


def _semver_component(pick: Callable[[library.Semver], int]) -> Callable[[Any], int]:
    return lambda msg: library.semver_int(pick(_to_semver(msg)))


def _functions() -> list[Any]:
    t = cel.Type
    q, s = t(QUANTITY_TYPE_NAME), t(SEMVER_TYPE_NAME)

    def decl(name: str, *overloads: Any) -> Any:
        return cel.FunctionDecl(name, list(overloads))

    def member(oid: str, ret: Any, params: list[Any], impl: Any = None) -> Any:
        # The runtime keys implementations by (name, argument kinds), and both message types
        # share one kind: the first overload of a name carries the dispatching implementation.
        if impl is None:
            return cel.Overload(oid, ret, params, is_member=True)
        return cel.Overload(oid, ret, params, is_member=True, impl=impl)

    def free(oid: str, ret: Any, params: list[Any], impl: Any) -> Any:
        return cel.Overload(oid, ret, params, impl=impl)

    return [
        decl(
            "quantity",
            free(
                "string_to_quantity",
                q,
                [t.STRING],
                _quantity_literal,
            ),
        ),
        decl("isQuantity", free("is_quantity_string", t.BOOL, [t.STRING], library.is_quantity)),
        decl("sign", member("quantity_sign", t.INT, [q], lambda x: _to_quantity(x).sign())),
        decl(
            "isInteger",
            member("quantity_is_integer", t.BOOL, [q], lambda x: _to_quantity(x).is_integer()),
        ),
        decl(
            "asInteger",
            member(
                "quantity_get_integer",
                t.INT,
                [q],
                lambda x: library.quantity_as_integer(_to_quantity(x)),
            ),
        ),
        decl(
            "asApproximateFloat",
            member(
                "quantity_get_float",
                t.DOUBLE,
                [q],
                lambda x: _to_quantity(x).as_approximate_float(),
            ),
        ),
        decl(
            "add",
            member("quantity_add", q, [q, q], _add),
            member("quantity_add_int", q, [q, t.INT], _add),
        ),
        decl(
            "sub",
            member("quantity_sub", q, [q, q], _sub),
            member("quantity_sub_int", q, [q, t.INT], _sub),
        ),
        decl(
            "compareTo",
            member("quantity_compare_to", t.INT, [q, q], _compare),
            member("semver_compare_to", t.INT, [s, s]),
        ),
        decl(
            "isGreaterThan",
            member("quantity_greater", t.BOOL, [q, q], lambda a, b: _compare(a, b) > 0),
            member("semver_greater", t.BOOL, [s, s]),
        ),
        decl(
            "isLessThan",
            member("quantity_less", t.BOOL, [q, q], lambda a, b: _compare(a, b) < 0),
            member("semver_less", t.BOOL, [s, s]),
        ),
        decl(
            "semver",
            free(
                "string_to_semver",
                s,
                [t.STRING],
                _semver_literal,
            ),
            free(
                "string_bool_to_semver",
                s,
                [t.STRING, t.BOOL],
                _semver_literal,
            ),
        ),
        decl(
            "isSemver",
            free("is_semver_string", t.BOOL, [t.STRING], library.is_semver),
            free("is_semver_string_bool", t.BOOL, [t.STRING, t.BOOL], library.is_semver),
        ),
        # Kubernetes' sets library (cel-go ext.Sets) and, of its lists library, what list
        # attributes (ints, strings, bools, versions) need: isSorted, and sum/min/max of ints.
        decl(
            "sets.contains",
            free(
                "list_sets_contains_list",
                t.BOOL,
                [t.List(t.DYN), t.List(t.DYN)],
                lambda a, b: all(x in a for x in b),
            ),
        ),
        decl(
            "sets.equivalent",
            free(
                "list_sets_equivalent_list",
                t.BOOL,
                [t.List(t.DYN), t.List(t.DYN)],
                lambda a, b: all(x in a for x in b) and all(x in b for x in a),
            ),
        ),
        decl(
            "sets.intersects",
            free(
                "list_sets_intersects_list",
                t.BOOL,
                [t.List(t.DYN), t.List(t.DYN)],
                lambda a, b: any(x in a for x in b),
            ),
        ),
        decl("isSorted", member("list_is_sorted", t.BOOL, [t.List(t.DYN)], _is_sorted)),
        decl(
            "sum",
            member(
                "list_int_sum",
                t.INT,
                [t.List(t.INT)],
                lambda items: library.check_int64(sum(_int_list(items, "sum"))),
            ),
        ),
        decl(
            "min", member("list_int_min", t.INT, [t.List(t.INT)], lambda i: _min_max(i, "min", min))
        ),
        decl(
            "max", member("list_int_max", t.INT, [t.List(t.INT)], lambda i: _min_max(i, "max", max))
        ),
        decl(
            "includes",
            *(
                member(f"list_{name}_includes", t.BOOL, [t.List(kind), kind], _includes)
                for name, kind in (("int", t.INT), ("string", t.STRING), ("bool", t.BOOL))
            ),
            member("list_semver_includes", t.BOOL, [t.List(s), s], _includes),
            *(
                member(f"{name}_includes", t.BOOL, [kind, kind], _includes)
                for name, kind in (("int", t.INT), ("string", t.STRING), ("bool", t.BOOL))
            ),
            member("semver_includes", t.BOOL, [s, s], _includes),
        ),
        decl("major", member("semver_major", t.INT, [s], _semver_component(lambda v: v.major))),
        decl("minor", member("semver_minor", t.INT, [s], _semver_component(lambda v: v.minor))),
        decl("patch", member("semver_patch", t.INT, [s], _semver_component(lambda v: v.patch))),
    ]


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
                variables={
                    "device.driver": t.STRING,
                    "device.attributes": t.Map(t.STRING, t.Map(t.STRING, t.DYN)),
                    "device.capacity": t.Map(t.STRING, t.Map(t.STRING, t(QUANTITY_TYPE_NAME))),
                    "device.allowMultipleAllocations": t.BOOL,
                },
                extensions=[
                    ext_strings.ExtStrings(),
                    ext_optional.ExtOptional(),
                    ext_bindings.ExtBindings(),
                ],
                functions=_functions(),
            )
        return _ENV


# --------------------------------------------------------------------------- messages

_STATUS_PREFIX: Final = re.compile(r"^[A-Z_]+: ")
_STATUS_SUFFIX: Final = re.compile(r"\s*\[[A-Z_]+\]$")
_RUNTIME_REWRITES: Final = (
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
        variables = dict(self.variables)
        variables["device.attributes"] = {
            **variables["device.attributes"],
            **{domain: {} for domain in missing_attr},
        }
        variables["device.capacity"] = {
            **variables["device.capacity"],
            **{domain: {} for domain in missing_cap},
        }
        activation = _env().Activation(variables)
        self._padded[domains] = activation
        return activation


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
    expressions. A ``Selector(expression)`` built directly compiles on first use (cached)."""

    expression: str
    _program: Any = field(repr=False, compare=False, default=None)
    domains: frozenset[str] = field(repr=False, compare=False, default=frozenset())
    max_cost: int = field(repr=False, compare=False, default=0)

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
        if self.max_cost > COST_LIMIT:
            raise self._error(
                device_name,
                f"operation cancelled: actual cost limit exceeded (estimated worst-case cost "
                f"{self.max_cost} > limit {COST_LIMIT})",
            )
        result = self._program.eval(device.padded(self.domains))
        value = result.value()
        if value is True or value is False:  # only a BOOL result converts to a Python bool
            return value
        kind = result.type()
        if kind == cel.Type.ERROR:
            raise self._error(device_name, _runtime_message(str(result.value())))
        raise self._error(
            device_name, f"must evaluate to bool, got a value of type {kind.name().lower()}"
        )

    def _error(self, device_name: str, message: str) -> CELEvaluationError:
        return CELEvaluationError(
            f"CEL selector {shorten(self.expression)!r} on device {device_name!r}: {message}"
        )


def shorten(expression: str, limit: int = 120) -> str:
    """An expression cut to *limit* characters for messages (10 KiB ones stay readable)."""
    return expression if len(expression) <= limit else expression[: limit - 3] + "..."


@lru_cache(maxsize=COMPILE_CACHE_SIZE)
def compile_selector(expression: str) -> Selector:
    """Compile a selector once (LRU-cached per expression string); see the module docstring."""
    size = len(expression.encode())
    if size > MAX_EXPRESSION_LENGTH:
        raise CELCompileError(
            f"CEL expression is too long: {size} bytes, the limit is {MAX_EXPRESSION_LENGTH}"
        )
    try:
        program = _env().compile(expression)
    except RuntimeError as exc:
        raise CELCompileError(f"compilation failed: {_engine_message(str(exc))}") from exc
    output = program.return_type()
    if output not in (cel.Type.BOOL, cel.Type.DYN):
        raise CELCompileError(
            f"compilation failed: must evaluate to bool or the unknown type, "
            f"not {output.name().lower()}"
        )
    root = checked.parse_checked(program.serialize())
    return Selector(
        expression=expression,
        _program=program,
        domains=checked.literal_domains(root),
        max_cost=checked.estimate_cost(root),
    )


# --------------------------------------------------------------------------- match cache


@dataclass(slots=True)
class _DeviceEntry:
    generation: int
    prepared: DeviceInput | CELEvaluationError
    results: dict[str, bool | CELEvaluationError]


class MatchCache:
    """Results (and errors) per (expression, device, slice generation), plus one CEL input per
    (device, slice generation), built once however many selectors run on the device. A device
    seen at another slice generation starts afresh (its old entries are dropped). Thread-safe;
    never mutates its inputs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: dict[DeviceID, _DeviceEntry] = {}
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
            self.misses += 1
        if entry is None or entry.generation != slice_generation:
            prepared: DeviceInput | CELEvaluationError
            try:
                prepared = device_input(device, device_id.driver)
            except CELEvaluationError as exc:
                prepared = exc
            entry = _DeviceEntry(slice_generation, prepared, {})
            with self._lock:
                self._devices[device_id] = entry
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

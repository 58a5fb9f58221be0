"""Cases from DRA's own selector tests: ``TestCEL`` in k8s.io/dynamic-resource-allocation
``cel/compile_test.go`` -- each scenario's expression, device, expected result, error and
static cost estimate (``expectCost``, asserted exactly), run in the stored-expressions
environment with every feature (the scheduler's).

Two scenarios are not carried: ``includes-function-compilation-error`` and
``allow_multiple_allocations_disabled`` compile in the *new-expressions* environment with a
feature gate off, which the API server uses for new writes; biaxial has the one environment
the scheduler evaluates stored selectors in, where both compile (the neighbouring scenarios
``includes-function-compilation-and-eval-success`` and ``allow_multiple_allocations_*`` are
carried).
"""

from __future__ import annotations

from typing import Any

from tests.unit.cel_cases.base import (
    CELPY_COST,
    CELPY_MESSAGE,
    DRA_TESTS,
    NO_BIND,
    NO_TYPE_CHECKER_BOOL,
    Case,
    Deviation,
    celpy_compile,
    celpy_error,
    celpy_syntax,
    device,
    version,
)
from tests.unit.cel_cases.base import compile_error as _compile_error
from tests.unit.cel_cases.base import ok as _ok
from tests.unit.cel_cases.base import runtime as _runtime

DRA = "dra.example.com"
D = f'device.attributes["{DRA}"]'
C = f'device.capacity["{DRA}"]'
LIST_ELEMENTS = 64  # max(DeviceAttributeMaxValueLength, ResourceSliceMaxAttributeValuesPerDevice)
MAX_VALUES = 48  # ResourceSliceMaxAttributeValuesPerDevice


def _cite(name: str, kw: dict[str, Any]) -> dict[str, Any]:
    kw.setdefault("cites", f"{DRA_TESTS} TestCEL/{name}")
    kw.setdefault("driver", DRA)
    return kw


def ok(name: str, expression: str, result: bool = True, **kw: Any) -> Case:
    return _ok(f"TestCEL/{name}", expression, result, **_cite(name, kw))


def runtime(name: str, expression: str, fragment: str = "", **kw: Any) -> Case:
    return _runtime(f"TestCEL/{name}", expression, fragment, **_cite(name, kw))


def compile_error(name: str, expression: str, fragment: str = "", **kw: Any) -> Case:
    return _compile_error(f"TestCEL/{name}", expression, fragment, **_cite(name, kw))


def attrs(**values: Any) -> Any:
    return device(DRA, values)


def _long_list(n: int) -> Any:
    return device(DRA, {"name": tuple(f"value-{i}" for i in range(n))})


def _expensive_device() -> Any:
    # 32 attributes whose names have the maximum length (the worst case of the estimate)
    attributes = {}
    for i in range(32):
        suffix = f"-{i}"
        attributes[f"{DRA}/" + "x" * (32 - len(suffix)) + suffix] = "abc"
    return device(DRA, attributes)


_EXPENSIVE = (
    "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, "
    "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z2, "
    "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z4, "
    "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(z5, int('1'.find('[0-9]*')) < 100)))))))"
)
_ALL = f"""
{C}.quantity.isGreaterThan(quantity("1Ki")) &&
{D}.bool &&
{D}.int > 0 &&
{D}.string == "fish" &&
{D}.version.isGreaterThan(semver("0.0.1")) &&
{C}["quantity"].isGreaterThan(quantity("1Ki")) &&
{D}["bool"] &&
{D}["int"] > 0 &&
{D}["string"] == "fish" &&
{D}["version"].isGreaterThan(semver("0.0.1"))
"""


def _not_iterable(kind: str) -> Deviation:
    return celpy_error(f"{CELPY_MESSAGE}: a {kind} is not iterable")


def _includes(name: str, expression: str, result: bool, value: Any, cost: int = 4 + 48) -> Case:
    return ok(name, expression, result, device=attrs(name=value), cost=cost)


CASES: tuple[Case, ...] = (
    ok("true", "true", cost=0),
    ok("false", "false", False, cost=0),
    compile_error(
        "syntax-error", "?!", "Syntax error", celpy=celpy_syntax("celpy's parser, own words")
    ),
    compile_error(
        "type-error",
        "1",
        "must evaluate to bool or the unknown type, not int",
        celpy=celpy_compile(NO_TYPE_CHECKER_BOOL, "must evaluate to bool"),
    ),
    runtime(
        "runtime-error-lookup-identifier",
        'device.attributes["no-such-domain"].noSuchAttr.isGreaterThan(quantity("0"))',
        "no such key",
        cost=6,
    ),
    runtime(
        "runtime-error-lookup-map",
        'device.attributes["no-such-domain"]["noSuchAttr"].isGreaterThan(quantity("0"))',
        "no such key",
        cost=6,
    ),
    ok("domain-check-negative", '"no-such-domain" in device.attributes', False, cost=3),
    ok(
        "domain-check-positive",
        '"dra.example.com" in device.attributes',
        device=device(DRA, {"dra.example.com/something": True}),
        driver="",
        cost=3,
    ),
    ok("empty-driver-name", 'device.driver == ""', driver="", cost=2),
    ok("real-driver-name", 'device.driver == "dra.example.com"', cost=4),
    ok("driver-name-qualifier", f"{D}.name", device=attrs(name=True), cost=4),
    ok("driver-name-qualifier-map-lookup", f'{D}["name"]', device=attrs(name=True), cost=4),
    ok(
        "bind",
        f"cel.bind(dra, {D}, dra.name)",
        device=attrs(name=True),
        cost=15,
        celpy=celpy_error(NO_BIND),
    ),
    ok(
        "qualified-attribute-name",
        'device.attributes["other.example.com"].name',
        device=device(DRA, {"other.example.com/name": True}),
        cost=4,
    ),
    ok("bool", f"{D}.name", device=attrs(name=True), cost=4),
    ok("int", f"{D}.name > 0", device=attrs(name=1), cost=5),
    ok("string", f'{D}.name == "fish"', device=attrs(name="fish"), cost=5),
    runtime(
        "macro-exists-on-int",
        f"{D}.name.exists(x, x > 0)",
        "expected iterable type",
        device=attrs(name=1),
        cost=5 + (3 + 3) * LIST_ELEMENTS,
        celpy=_not_iterable("number"),
    ),
    runtime(
        "macro-exists-on-bool",
        f"{D}.name.exists(x, x == true)",
        "expected iterable type",
        device=attrs(name=True),
        cost=5 + (3 + 3) * LIST_ELEMENTS,
        celpy=_not_iterable("bool"),
    ),
    runtime(
        "macro-exists-on-string",
        f'{D}.name.exists(x, x == "fish")',
        "expected iterable type",
        device=attrs(name="fish"),
        cost=5 + (3 + 3) * LIST_ELEMENTS,
        celpy=Deviation("celpy iterates over the characters of a string", result=False),
    ),
    runtime(
        "list-result-type-causes-match-error",
        f"{D}.names",
        "must evaluate to bool, got a value of type list",
        device=attrs(names=("fish", "bird")),
        cost=4,
        celpy=celpy_error(CELPY_MESSAGE, "must evaluate to bool"),
    ),
    _includes(
        "includes-function-can-evaluate", f'{D}.name.includes("fish")', True, ("fish", "bird")
    ),
    ok("list-of-bool", f"{D}.names.size() == 2", device=attrs(names=(True, False)), cost=6),
    ok("list-of-int", f"{D}.names.size() == 2", device=attrs(names=(1, 2)), cost=6),
    ok("list-of-string", f"{D}.names.size() == 2", device=attrs(names=("fish", "bird")), cost=6),
    ok(
        "list-of-semver",
        f"{D}.names.size() == 2",
        device=attrs(names=(version("1.0.0"), version("2.0.0"))),
        cost=6,
    ),
    ok(
        "macro-on-list-of-int",
        f"{D}.names.exists(x, x > 0)",
        device=attrs(names=(1, 2)),
        cost=5 + (3 + 3) * LIST_ELEMENTS,
    ),
    ok(
        "macro-on-list-of-string",
        f'{D}.names.all(x, x != "")',
        device=attrs(names=("fish", "bird")),
        cost=5 + (2 + 2) * LIST_ELEMENTS,
    ),
    ok(
        "macro-on-list-of-semver",
        f'{D}.names.all(x, x.isGreaterThan(semver("0.0.1")))',
        device=attrs(names=(version("1.0.0"), version("2.0.0"))),
        cost=5 + (2 + 4) * LIST_ELEMENTS,
    ),
    ok(
        "includes-function-compilation-and-eval-success",
        f'{D}.attr.includes("fish")',
        device=attrs(attr="fish"),
        cost=4 + 48,
    ),
    _includes("includes-function-on-bool-scalar-positive", f"{D}.name.includes(true)", True, True),
    _includes(
        "includes-function-on-bool-scalar-negative", f"{D}.name.includes(true)", False, False
    ),
    _includes(
        "includes-function-on-bool-list-positive", f"{D}.name.includes(true)", True, (True, False)
    ),
    _includes(
        "includes-function-on-bool-list-negative", f"{D}.name.includes(false)", False, (True, True)
    ),
    _includes("includes-function-on-int-scalar-positive", f"{D}.name.includes(1)", True, 1),
    _includes("includes-function-on-int-scalar-negative", f"{D}.name.includes(1)", False, 2),
    _includes("includes-function-on-int-list-positive", f"{D}.name.includes(1)", True, (1, 2)),
    _includes("includes-function-on-int-list-negative", f"{D}.name.includes(3)", False, (1, 2)),
    _includes(
        "includes-function-on-string-scalar-positive", f'{D}.name.includes("fish")', True, "fish"
    ),
    _includes(
        "includes-function-on-string-scalar-negative", f'{D}.name.includes("bird")', False, "fish"
    ),
    _includes(
        "includes-function-on-string-list-positive",
        f'{D}.name.includes("fish")',
        True,
        ("fish", "bird"),
    ),
    _includes(
        "includes-function-on-string-list-negative",
        f'{D}.name.includes("cat")',
        False,
        ("fish", "bird"),
    ),
    _includes(
        "includes-function-on-semver-scalar-positive",
        f'{D}.name.includes(semver("1.0.0"))',
        True,
        version("1.0.0"),
        cost=4 + 48 + 1,
    ),
    _includes(
        "includes-function-on-semver-scalar-negative",
        f'{D}.name.includes(semver("2.0.0"))',
        False,
        version("1.0.0"),
        cost=4 + 48 + 1,
    ),
    _includes(
        "includes-function-on-semver-list-positive",
        f'{D}.name.includes(semver("1.0.0"))',
        True,
        (version("1.0.0"), version("2.0.0")),
        cost=4 + 48 + 1,
    ),
    _includes(
        "includes-function-on-semver-list-negative",
        f'{D}.name.includes(semver("3.0.0"))',
        False,
        (version("1.0.0"), version("2.0.0")),
        cost=4 + 48 + 1,
    ),
    ok(
        "includes-function-on-very-long-list-positive",
        f'{D}.name.includes("value-{MAX_VALUES}")',
        False,
        device=_long_list(MAX_VALUES),
        cost=4 + 48,
    ),
    runtime(
        "includes-function-on-very-long-list-runtime-error",
        f'{D}.name.includes("value-{MAX_VALUES + 1}")',
        f"'includes' function cannot be applied to lists longer than {MAX_VALUES} values",
        device=_long_list(MAX_VALUES + 1),
        cost=4 + 48,
    ),
    ok(
        "in-operator-on-list",
        f"1 in {D}.names",
        device=attrs(names=(1, 2, 3)),
        cost=4 + LIST_ELEMENTS,
    ),
    ok(
        "version",
        f'{D}.name.isGreaterThan(semver("0.0.1"))',
        device=attrs(name=version("1.0.0")),
        cost=6,
    ),
    ok(
        "version_v",
        f'{D}.name.isGreaterThan(semver("v0.0.1", true)) && isSemver("v1.0.0", true)',
        device=attrs(name=version("1.0.0")),
        cost=7,
    ),
    runtime(
        "macro-exists-on-version",
        f'{D}.name.exists(x, x.isGreaterThan(semver("0.0.1")))',
        "expected iterable type",
        device=attrs(name=version("1.0.0")),
        cost=5 + (3 + 4) * LIST_ELEMENTS,
        celpy=_not_iterable("version"),
    ),
    ok(
        "quantity",
        f'{C}.name.isGreaterThan(quantity("1Ki"))',
        device=device(DRA, capacity={"name": "1Mi"}),
        cost=6,
    ),
    ok(
        "check-positive",
        f'"name" in {C} && {C}.name.isGreaterThan(quantity("1Ki"))',
        device=device(DRA, capacity={"name": "1Mi"}),
        cost=10,
    ),
    ok(
        "check-negative",
        f'!("name" in {C}) || {C}.name.isGreaterThan(quantity("1Ki"))',
        driver="",
        cost=11,
    ),
    ok(
        "all",
        _ALL,
        device=device(
            DRA,
            {"bool": True, "int": 1, "string": "fish", "version": version("1.0.0")},
            {"quantity": "1Mi"},
        ),
        cost=52,
    ),
    ok("many", f"{D}.a && {D}.b && {D}.c", device=attrs(a=True, b=True, c=True), cost=12),
    ok(
        "check_attribute_domains",
        'device.attributes.exists_one(x, x == "dra.example.com")',
        device=attrs(services="some_example_value"),
        cost=164,
    ),
    ok(
        "check_attribute_ids",
        f'{D}.exists_one(x, x == "services")',
        device=attrs(services="some_example_value"),
        cost=133,
    ),
    ok(
        "split_attribute",
        f'{D}.services.split("example").size() >= 2',
        device=attrs(services="some_example_value"),
        cost=19,
    ),
    ok(
        "regexp_attribute",
        f'{D}.services.matches("[^a]?sym")',
        device=attrs(services="asymetric"),
        cost=18,
    ),
    ok(
        "check_capacity_domains",
        'device.capacity.exists_one(x, x == "dra.example.com")',
        device=device(DRA, capacity={"memory": "1Mi"}),
        cost=164,
    ),
    ok(
        "check_capacity_ids",
        f'{C}.exists_one(x, x == "memory")',
        device=device(DRA, capacity={"memory": "1Mi"}),
        cost=133,
    ),
    runtime(
        "expensive",
        _EXPENSIVE,
        "actual cost limit exceeded",
        device=_expensive_device(),
        cost=85555551,
        celpy=celpy_error(CELPY_COST, "(borrowed)"),
    ),
    ok(
        "allow_multiple_allocations",
        "device.allowMultipleAllocations == true",
        device=device(DRA, multi=True),
        cost=3,
    ),
    ok(
        "allow_multiple_allocations_default",
        "device.allowMultipleAllocations == false",
        cost=3,
    ),
    ok(
        "allow_multiple_allocations_false",
        "device.allowMultipleAllocations == false",
        device=device(DRA, multi=False),
        cost=3,
    ),
)

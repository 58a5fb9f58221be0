"""biaxial's own conformance cases: selectors on realistic GPU devices, written from upstream
semantics (k8s.io/dynamic-resource-allocation/cel, the Kubernetes libraries, cel-spec), and the
engine's documented differences. The cases taken from upstream's own test tables live in the
sibling modules, each citing its test.
"""

from __future__ import annotations

from typing import Any

from driver.api.errors import CELCompileError, CELEvaluationError
from driver.api.model import Capacity, Device, Version
from driver.api.quantity import Quantity
from tests.unit.cel_cases import base
from tests.unit.cel_cases.base import (
    CELPY_COST,
    CELPY_IS_UPSTREAM,
    HETEROGENEOUS_EQ,
    NO_BIND,
    NO_OPTIONAL,
    NO_TYPE_CHECKER,
    NO_TYPE_CHECKER_BOOL,
    Case,
    Deviation,
)

DRIVER = "gpu.biaxial.dev"
D = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'
STD = 'device.attributes["resource.kubernetes.io"]'

T4 = Device(
    name="gpu-0",
    attributes={
        "type": "gpu",
        "uuid": "GPU-4a2c7f1e-0d3b-4c55-9e0a-1b2c3d4e5f60",
        "index": 0,
        "minor": 0,
        "productName": "Tesla T4",
        "brand": "Nvidia",
        "architecture": "Turing",
        "cudaComputeCapability": Version("7.5.0"),
        "driverVersion": Version("550.54.15"),
        "cudaDriverVersion": Version("12.4.0"),
        "multiprocessors": 40,
        "resource.kubernetes.io/pciBusID": "0000:3b:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:3a",
        "resource.kubernetes.io/numaNode": 0,
    },
    capacity={
        "memory": Capacity(Quantity.parse("15360Mi")),
        "cores": Capacity(Quantity.from_int(100)),
    },
    allow_multiple_allocations=True,
)

A100_MIG = Device(
    name="gpu-1-mig-1g5gb-0",
    attributes={
        "type": "mig",
        "uuid": "MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        "index": 1,
        "minor": 1,
        "productName": "NVIDIA A100-SXM4-40GB",
        "brand": "Nvidia",
        "architecture": "Ampere",
        "cudaComputeCapability": Version("8.0.0"),
        "driverVersion": Version("535.161.8-rc.1+build.7"),
        "multiprocessors": 14,
        "profile": "1g.5gb",
        "parentUUID": "GPU-11111111-2222-3333-4444-555555555555",
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
        "resource.kubernetes.io/numaNode": 1,
    },
    capacity={"memory": Capacity(Quantity.parse("4864Mi"))},
)

OTHER = Device(
    name="nic-0",
    attributes={"model": "ConnectX-7", "example.com/speed": 400},
    capacity={"bandwidth": Capacity(Quantity.parse("400G"))},
)

LISTS = Device(
    name="gpu-2",
    attributes={
        "type": "gpu",
        "tags": ("inference", "shared"),
        "ports": (8000, 8001, 8002),
        "resource.kubernetes.io/numaNode": (0, 1),
    },
)

BAD_VERSION = Device(name="gpu-3", attributes={"driverVersion": Version("550.54")})


_BIG = "[" + ",".join(str(i) for i in range(101)) + "]"


def ok(name: str, expression: str, result: bool = True, **kw: Any) -> Case:
    """A case on the T4 device of biaxial's driver unless it names another."""
    return base.ok(name, expression, result, **_on_t4(kw))


def runtime(name: str, expression: str, fragment: str = "", **kw: Any) -> Case:
    return base.runtime(name, expression, fragment, **_on_t4(kw))


def compile_error(name: str, expression: str, fragment: str = "", **kw: Any) -> Case:
    return base.compile_error(name, expression, fragment, **_on_t4(kw))


def _on_t4(kw: dict[str, Any]) -> dict[str, Any]:
    kw.setdefault("device", T4)
    kw.setdefault("driver", DRIVER)
    kw.setdefault("cites", "biaxial")
    return kw


CASES: tuple[Case, ...] = (
    # --- driver check first --------------------------------------------------------------
    ok("driver matches", f'device.driver == "{DRIVER}"'),
    ok("driver mismatch", 'device.driver == "other.example.com"', False),
    ok(
        "driver check guards a foreign device",
        f'device.driver == "{DRIVER}" && {D}.type == "gpu"',
        False,
        device=OTHER,
        driver="nic.example.com",
    ),
    runtime(
        "no driver check: foreign device errors",
        f'{D}.type == "gpu"',
        "no such key",
        device=OTHER,
        driver="nic.example.com",
    ),
    ok("driver in list", f'device.driver in ["{DRIVER}", "gpu.nvidia.com"]'),
    ok("allowMultipleAllocations true", "device.allowMultipleAllocations"),
    ok("allowMultipleAllocations false", "device.allowMultipleAllocations", False, device=A100_MIG),
    # --- attribute lookup ----------------------------------------------------------------
    ok("unqualified string attribute", f'{D}.type == "gpu"'),
    ok("unqualified int attribute", f"{D}.index == 0"),
    ok("int attribute comparison", f"{D}.multiprocessors >= 40"),
    ok("productName", f'{D}.productName == "Tesla T4"'),
    ok("select via index syntax", f'{D}["architecture"] == "Turing"'),
    ok("mig type", f'{D}.type == "mig" && {D}.profile == "1g.5gb"', device=A100_MIG),
    ok("standard domain string", f'{STD}.pcieRoot == "pci0000:3a"'),
    ok("standard domain pciBusID", f'{STD}.pciBusID.startsWith("0000:3b")'),
    ok("standard domain int", f"{STD}.numaNode == 0"),
    ok(
        "qualified key of another domain",
        'device.attributes["example.com"].speed == 400',
        device=OTHER,
        driver="nic.example.com",
    ),
    ok(
        "unqualified key under that device's driver",
        'device.attributes["nic.example.com"].model == "ConnectX-7"',
        device=OTHER,
        driver="nic.example.com",
    ),
    ok("same pcieRoot on both", f'{STD}.pcieRoot.startsWith("pci0000:")', device=A100_MIG),
    ok("domain map size", f"{D}.size() == 11"),
    ok(
        "cel.bind a domain",
        f'cel.bind(gpu, {D}, gpu.type == "gpu" && gpu.index == 0)',
        celpy=Deviation(NO_BIND, error=CELEvaluationError, fragment="bind"),
    ),
    # --- unknown domain, missing keys, has() ---------------------------------------------
    ok("has on unknown domain", 'has(device.attributes["x.example.com"].foo)', False),
    runtime(
        "field of unknown domain", 'device.attributes["x.example.com"].foo == 1', "no such key"
    ),
    ok("unknown domain is an empty map", 'device.attributes["x.example.com"].size() == 0'),
    ok("unknown capacity domain is an empty map", 'device.capacity["x.example.com"].size() == 0'),
    runtime("missing field in known domain", f'{D}.nosuch == "x"', "no such key"),
    runtime("missing capacity", f'{C}.nosuch.isGreaterThan(quantity("1"))', "no such key"),
    ok("has on present attribute", f"has({D}.uuid)"),
    ok("has on missing attribute", f"has({D}.profile)", False),
    ok("has guards a missing attribute", f'has({D}.profile) && {D}.profile == "1g.5gb"', False),
    ok("has on present capacity", f"has({C}.cores)"),
    ok("has on missing capacity", f"has({C}.cores)", False, device=A100_MIG),
    ok("in on domain map", f'"uuid" in {D}'),
    ok("in on unknown domain's map", '"foo" in device.attributes["x.example.com"]', False),
    ok(
        "optional select with default",
        f'{D}.?profile.orValue("none") == "none"',
        celpy=Deviation(NO_OPTIONAL, error=CELCompileError),
    ),
    ok(
        "optional select present",
        f'{D}.?type.orValue("none") == "gpu"',
        celpy=Deviation(NO_OPTIONAL, error=CELCompileError),
    ),
    ok(
        "optional index on unknown domain",
        'device.attributes[?"x.example.com"].hasValue()',
        celpy=Deviation(NO_OPTIONAL, error=CELCompileError),
    ),
    compile_error(
        "unknown device field",
        "device.vendor == 'nvidia'",
        "undeclared reference",
        celpy=Deviation(
            "celpy resolves fields at run time: no such member",
            error=CELEvaluationError,
            fragment="vendor",
        ),
    ),
    # --- documented deviations of driver.cel.engine from upstream ---------------------------------
    compile_error(
        "has() on a device field",
        "has(device.driver)",
        "must evaluate to bool",
        upstream="true: device is an object whose fields are always set; here the fields are"
        " variables and cel-cpp resolves has(device.driver) to the variable itself",
        celpy=Deviation(CELPY_IS_UPSTREAM, result=True),
    ),
    ok(
        "has() on allowMultipleAllocations",
        "has(device.allowMultipleAllocations)",
        False,
        device=A100_MIG,
        upstream="true (the field is set); here has() yields the variable's value",
        celpy=Deviation(CELPY_IS_UPSTREAM, result=True),
    ),
    runtime(
        "computed domain name",
        'device.attributes["x.example" + ".com"].size() == 0',
        "no such key",
        upstream="true: every unknown domain is an empty map; here only literal domain names"
        " are padded with empty maps",
        celpy=Deviation(CELPY_IS_UPSTREAM, result=True),
    ),
    ok(
        "in sees a padded literal domain",
        '"x.example.com" in device.attributes && device.attributes["x.example.com"].size() == 0',
        upstream="false: `in` sees only the device's real domains; here the literally named"
        " missing domain is present as an empty map",
        celpy=Deviation(CELPY_IS_UPSTREAM, result=False),
    ),
    # --- capacity and quantities ---------------------------------------------------------
    ok(
        "capacity compareTo >= (upstream's capacity check)",
        f'{C}.memory.compareTo(quantity("10Gi")) >= 0',
    ),
    ok("capacity compareTo too big", f'{C}.memory.compareTo(quantity("16Gi")) >= 0', False),
    ok("capacity isGreaterThan", f'{C}.memory.isGreaterThan(quantity("15Gi"))', False),
    ok("capacity equal value other format", f'{C}.memory == quantity("15Gi")'),
    ok("capacity isLessThan", f'{C}.memory.isLessThan(quantity("16106127361"))'),
    ok("capacity cores", f'{C}.cores.compareTo(quantity("100")) == 0'),
    ok("capacity asInteger", f"{C}.memory.asInteger() == 16106127360"),
    ok("capacity add quantity", f'{C}.memory.add(quantity("1Gi")) == quantity("16Gi")'),
    ok("capacity sub int", f'{C}.cores.sub(50) == quantity("50")'),
    ok("capacity add int", f"{C}.cores.add(1).isGreaterThan({C}.cores)"),
    ok("capacity sign", f"{C}.memory.sign() == 1"),
    ok("quantity 1Ki equals 1024", 'quantity("1Ki") == quantity("1024")'),
    ok("quantity milli compare", 'quantity("1500m").isGreaterThan(quantity("1"))'),
    ok("quantity isInteger false", '!quantity("1500m").isInteger()'),
    ok("quantity isInteger true", 'quantity("2k").isInteger()'),
    ok("quantity asApproximateFloat", 'quantity("1500m").asApproximateFloat() == 1.5'),
    ok("quantity negative sign", 'quantity("-1").sign() == -1'),
    ok("quantity zero sign", 'quantity("0").sign() == 0'),
    ok("quantity exponent", 'quantity("1e3") == quantity("1k")'),
    ok("quantity sub to negative", 'quantity("1").sub(quantity("2")).sign() == -1'),
    ok("isQuantity valid", 'isQuantity("40Gi")'),
    ok("isQuantity invalid", 'isQuantity("40GiB")', False),
    runtime("quantity of malformed string", 'quantity("40GiB").sign() == 1', "invalid quantity"),
    runtime(
        "asInteger of fraction",
        'quantity("1500m").asInteger() == 1',
        "cannot convert value to integer",
    ),
    runtime(
        "asInteger beyond int64",
        'quantity("10E").asInteger() > 0',
        "cannot convert value to integer",
    ),
    ok(
        "binary quantity capped at int64 max",
        'quantity("10Ei").asInteger() == 9223372036854775807',
    ),
    compile_error(
        "quantity compared to int",
        f"{C}.memory > 10",
        "no matching overload",
        celpy=Deviation(NO_TYPE_CHECKER, error=CELEvaluationError),
    ),
    compile_error(
        "quantity isGreaterThan semver",
        'quantity("1").isGreaterThan(semver("1.0.0"))',
        "no matching overload",
        celpy=Deviation(NO_TYPE_CHECKER, error=CELEvaluationError, fragment="no such overload"),
    ),
    runtime(
        "quantity member on a version attribute",
        f"{D}.driverVersion.sign() == 1",
        "no such overload",
    ),
    runtime(
        "version compared with a quantity at run time",
        f'{D}.driverVersion.compareTo(quantity("1")) == 0',
        "no such overload",
    ),
    runtime("quantity member on an int attribute", f"{D}.index.add(1).sign() == 1", "overload"),
    # --- versions -----------------------------------------------------------------------
    ok("version isGreaterThan", f'{D}.cudaComputeCapability.isGreaterThan(semver("7.0.0"))'),
    ok("version isLessThan", f'{D}.cudaComputeCapability.isLessThan(semver("8.0.0"))'),
    ok("version compareTo equal", f'{D}.cudaComputeCapability.compareTo(semver("7.5.0")) == 0'),
    ok("version major", f"{D}.driverVersion.major() == 550"),
    ok(
        "version minor and patch",
        f"{D}.driverVersion.minor() == 54 && {D}.driverVersion.patch() == 15",
    ),
    ok("version equality", f'{D}.cudaComputeCapability == semver("7.5.0")'),
    ok(
        "prerelease sorts before release",
        f'{D}.driverVersion.isLessThan(semver("535.161.8"))',
        device=A100_MIG,
    ),
    ok(
        "build metadata ignored",
        f'{D}.driverVersion.compareTo(semver("535.161.8-rc.1")) == 0',
        device=A100_MIG,
    ),
    ok("numeric prerelease ordering", 'semver("1.0.0-rc.2").isLessThan(semver("1.0.0-rc.10"))'),
    ok("semver normalize", 'semver("v7.5", true) == semver("7.5.0")'),
    ok("isSemver strict", 'isSemver("7.5")', False),
    ok("isSemver normalize", 'isSemver("v7.5", true)'),
    ok("semver normalize strips leading zeros", 'semver("v07.05.00", true) == semver("7.5.0")'),
    ok("isSemver normalize rejects a short prerelease", 'isSemver("7.5-rc.1", true)', False),
    runtime(
        "semver strict rejects short",
        'semver("7.5").major() == 7',
        "No Major.Minor.Patch elements found",
    ),
    runtime(
        "invalid version attribute",
        f"{D}.driverVersion.major() == 550",
        "semantic version",
        device=BAD_VERSION,
    ),
    compile_error(
        "version compared with <",
        f'{D}.cudaComputeCapability < semver("8.0.0")',
        "no matching overload",
        celpy=Deviation(NO_TYPE_CHECKER, error=CELEvaluationError),
    ),
    # --- type errors ------------------------------------------------------------------
    ok(
        "int attribute equals string is false",
        f'{D}.index == "0"',
        False,
        celpy=Deviation(HETEROGENEOUS_EQ, error=CELEvaluationError, fragment="overload"),
    ),
    runtime("int attribute plus string", f'{D}.index + "a" == "0a"', "no such overload"),
    runtime("string attribute ordered against int", f"{D}.productName > 3", "no such overload"),
    compile_error(
        "driver plus int",
        "device.driver + 1 == 2",
        "no matching overload",
        celpy=Deviation(NO_TYPE_CHECKER, error=CELEvaluationError),
    ),
    compile_error(
        "int literal vs string literal",
        '1 == "1"',
        "no matching overload",
        celpy=Deviation(NO_TYPE_CHECKER, error=CELEvaluationError),
    ),
    runtime(
        "string method on int attribute",
        f'{D}.index.startsWith("0")',
        "no such overload",
        celpy=Deviation(
            "celpy reports the missing overload in its own words", error=CELEvaluationError
        ),
    ),
    # --- non-bool results ----------------------------------------------------------------
    compile_error(
        "int literal result",
        "1 + 1",
        "must evaluate to bool",
        celpy=Deviation(
            NO_TYPE_CHECKER_BOOL, error=CELEvaluationError, fragment="must evaluate to bool"
        ),
    ),
    compile_error(
        "string result",
        "device.driver",
        "must evaluate to bool",
        celpy=Deviation(
            NO_TYPE_CHECKER_BOOL, error=CELEvaluationError, fragment="must evaluate to bool"
        ),
    ),
    compile_error(
        "quantity result",
        f'{C}.memory.add(quantity("1"))',
        "must evaluate to bool",
        celpy=Deviation(
            NO_TYPE_CHECKER_BOOL, error=CELEvaluationError, fragment="must evaluate to bool"
        ),
    ),
    runtime("dyn attribute result is int", f"{D}.index", "must evaluate to bool"),
    runtime("dyn attribute result is string", f"{D}.type", "must evaluate to bool"),
    ok("dyn attribute result is bool", f"{D}.size() > 0 && device.allowMultipleAllocations"),
    # --- syntax errors --------------------------------------------------------------------
    compile_error(
        "trailing operator",
        "device.driver ==",
        "<input>:1:17: Syntax error",
        celpy=Deviation("celpy's parser reports in its own format", error=CELCompileError),
    ),
    compile_error(
        "unbalanced parenthesis",
        f'({D}.type == "gpu"',
        "Syntax error",
        celpy=Deviation("celpy's parser reports in its own format", error=CELCompileError),
    ),
    compile_error(
        "single equals",
        'device.driver = "x"',
        "<input>:1:15",
        celpy=Deviation("celpy's parser reports in its own format", error=CELCompileError),
    ),
    compile_error(
        "unknown function",
        "device.driver.frobnicate()",
        "undeclared reference",
        celpy=Deviation(
            "celpy resolves functions at run time", error=CELEvaluationError, fragment="frobnicate"
        ),
    ),
    compile_error(
        "empty expression",
        "",
        "Syntax error",
        celpy=Deviation("celpy's parser reports in its own format", error=CELCompileError),
    ),
    compile_error(
        "unterminated string",
        'device.driver == "gpu',
        "<input>:1:",
        celpy=Deviation("celpy's parser reports in its own format", error=CELCompileError),
    ),
    # --- limits ----------------------------------------------------------------------------
    compile_error("expression longer than 10 KiB", "true || " * 1400 + "true", "too long"),
    ok(
        "expression just under 10 KiB",
        "true || " * 1270 + "true",
        celpy=Deviation(
            "celpy's recursive evaluator nests one level per ||: Python's recursion"
            " limit; cel-go and cel-cpp balance long &&/|| chains",
            error=CELEvaluationError,
            fragment="nested too deeply",
        ),
    ),
    runtime(
        "cost limit: nested comprehension",
        f"{_BIG}.all(a, {_BIG}.all(b, {_BIG}.all(c, a + b + c >= 0)))",
        "operation cancelled: actual cost limit exceeded",
        celpy=Deviation(CELPY_COST, error=CELEvaluationError, fragment="(borrowed)"),
    ),
    ok("small comprehension within cost", f"{_BIG}.exists(i, i == 100)"),
    runtime(
        "cost limit: comprehension over a nested literal",
        f"[{_BIG}].all(x, x.all(y, {_BIG}.all(z, {_BIG}.all(w, true))))",
        "operation cancelled: actual cost limit exceeded",
        celpy=Deviation(CELPY_COST, error=CELEvaluationError, fragment="(borrowed)"),
    ),
    ok("comprehension over device attributes within cost", f"{D}.all(k, k.size() > 0)"),
    # --- && / || error absorption -------------------------------------------------------
    ok("false && error", f"false && {D}.nosuch == 1", False),
    ok("error && false", f"{D}.nosuch == 1 && false", False),
    ok("true || error", f"true || {D}.nosuch == 1"),
    ok("error || true", f"{D}.nosuch == 1 || true"),
    runtime("true && error", f"true && {D}.nosuch == 1", "no such key"),
    runtime("error || false", f"{D}.nosuch == 1 || false", "no such key"),
    ok("error absorbed through has()", f'!has({D}.profile) || {D}.profile == "x"'),
    ok("ternary avoids the error branch", f'has({D}.profile) ? {D}.profile == "x" : true'),
    # --- strings extension -----------------------------------------------------------------
    ok("lowerAscii", f'{D}.productName.lowerAscii() == "tesla t4"'),
    ok("upperAscii", f'{D}.architecture.upperAscii() == "TURING"'),
    ok("split", f'{D}.productName.split(" ")[1] == "T4"'),
    ok("join", '["a", "b"].join("-") == "a-b"'),
    ok("replace", f'{D}.productName.replace("Tesla ", "") == "T4"'),
    ok("substring", f'{D}.uuid.substring(0, 4) == "GPU-"'),
    ok("indexOf", f'{D}.productName.indexOf("T4") == 6'),
    ok("trim", '"  t4 ".trim() == "t4"'),
    ok("startsWith", f'{D}.productName.startsWith("Tesla")'),
    ok("endsWith", f'{D}.productName.endsWith("T4")'),
    ok("contains", f'{D}.productName.contains("sla")'),
    ok("matches regex", f'{D}.productName.matches("^(Tesla|NVIDIA) [A-Z][0-9]+$")'),
    ok("size of string", f"{D}.productName.size() == 8"),
    runtime(
        "substring out of range",
        f"{D}.productName.substring(4, 99) == 'x'",
        "index out of range: 99",
    ),
    # --- lists, macros ----------------------------------------------------------------------
    ok("list attribute membership", f'"shared" in {D}.tags', device=LISTS),
    ok("list attribute size", f"{D}.ports.size() == 3", device=LISTS),
    ok("list attribute exists", f"{D}.ports.exists(p, p == 8001)", device=LISTS),
    ok("list attribute all", f"{D}.ports.all(p, p >= 8000)", device=LISTS),
    ok("standard int-list attribute", f"1 in {STD}.numaNode", device=LISTS),
    ok("map macro", f"{D}.ports.map(p, p - 8000) == [0, 1, 2]", device=LISTS),
    ok("filter macro", f"{D}.ports.filter(p, p > 8000).size() == 2", device=LISTS),
    ok("exists_one macro", "[1, 2, 3].exists_one(x, x > 2)"),
    ok("includes on an int-list attribute", f"{STD}.numaNode.includes(1)", device=LISTS),
    ok("includes on a scalar attribute is equality", f"{STD}.numaNode.includes(0)"),
    ok("includes on a scalar attribute, other value", f"{STD}.numaNode.includes(1)", False),
    ok("includes on a string list", f'{D}.tags.includes("shared")', device=LISTS),
    ok("includes on a version", f'{D}.cudaComputeCapability.includes(semver("7.5.0"))'),
    ok("sets.contains", f'sets.contains({D}.tags, ["shared"])', device=LISTS),
    ok(
        "sets.contains is false for a missing element",
        f'sets.contains({D}.tags, ["shared", "training"])',
        False,
        device=LISTS,
    ),
    ok(
        "sets.equivalent ignores order",
        f'sets.equivalent({D}.tags, ["shared", "inference"])',
        device=LISTS,
    ),
    ok("sets.intersects", f"sets.intersects({D}.ports, [1, 8002])", device=LISTS),
    ok("isSorted", f"{D}.ports.isSorted()", device=LISTS),
    ok("isSorted false", "[3, 1, 2].isSorted()", False),
    ok("sum of an int list", f"{D}.ports.sum() == 24003", device=LISTS),
    ok(
        "min and max of an int list",
        f"{D}.ports.min() == 8000 && {D}.ports.max() == 8002",
        device=LISTS,
    ),
    runtime("sum overflows", "[9223372036854775807, 1].sum() > 0", "overflow"),
    # dynamic-resource-allocation cel/compile.go includesFunc: target.Equal(arg), and a
    # string is never equal to an int.
    ok(
        "includes with a mismatched type",
        f"{D}.type.includes(1)",
        False,
        celpy=Deviation(HETEROGENEOUS_EQ, error=CELEvaluationError, fragment="overload"),
    ),
    ok("index out of range is absorbed", f"false && {D}.ports[9] == 1", False, device=LISTS),
    runtime(
        "index out of range",
        f"{D}.ports[9] == 1",
        "ndex",
        device=LISTS,
        celpy=Deviation(
            "celpy reports an index error as 'invalid_argument'",
            error=CELEvaluationError,
            fragment="invalid_argument",
        ),
    ),
    runtime("integer overflow", f"{D}.index + 9223372036854775807 + 1 > 0", "overflow"),
    runtime("division by zero", f"10 / {D}.index == 1", "divi"),
)

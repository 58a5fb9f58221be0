"""Upstream's cost tables: Kubernetes' library cost tests (``apiserver pkg/cel/library/
cost_test.go``), each expression with its estimated cost range and actual cost, asserted
exactly on ``driver.cel.engine`` (``measure``) with the size estimator those tests use (any
string or bytes value of unknown size is 0..12 characters).

The expressions are values, not selectors, and run in DRA's environment: where it refuses one
that the tests' plainer environment accepts -- a mixed-type list literal, which DRA's
homogeneous-literal rule makes a compile error -- the case expects that error. Cases of
libraries DRA's environment does not have (the authorizer, ``jsonpatch``) are not carried.
celpy has no cost model; these run on ``driver.cel.engine`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.unit.cel_cases.base import APISERVER_LIBRARY

COST_TESTS = f"{APISERVER_LIBRARY}/cost_test.go"


@dataclass(frozen=True, slots=True)
class CostCase:
    name: str
    expression: str
    cost: tuple[int, int] | None  # upstream's estimated (min, max)
    actual: int | None  # upstream's actual cost
    cites: str
    compile_error: str = ""  # DRA's environment refuses the expression with this fragment


def _case(test: str, expression: str, cost: tuple[int, int], actual: int) -> CostCase:
    return CostCase(f"{test}/{expression}", expression, cost, actual, f"{COST_TESTS} {test}")


def _mixed(test: str, expression: str, fragment: str) -> CostCase:
    """A case whose literal mixes element types: a compile error in DRA's environment."""
    return CostCase(
        f"{test}/{expression}", expression, None, None, f"{COST_TESTS} {test}", fragment
    )


LITERALS = {
    "int": "[1, 2, 3, 4, 5]",
    "uint": "[uint(1), uint(2), uint(3), uint(4), uint(5)]",
    "double": "[1.0, 2.0, 3.0, 4.0, 5.0]",
    "bool": "[false, true, false, true, false]",
    "string": "['012345678901', '012345678901', '012345678901', '012345678901', '012345678901']",
    "bytes": "[bytes('012345678901'), bytes('012345678901'), bytes('012345678901'), "
    "bytes('012345678901'), bytes('012345678901')]",
    "duration": "[duration('1s'), duration('2s'), duration('3s'), duration('4s'), duration('5s')]",
    "timestamp": "[timestamp('2011-01-01T00:00:00.000+01:00'), "
    "timestamp('2011-01-02T00:00:00.000+01:00'), timestamp('2011-01-03T00:00:00.000+01:00'), "
    "timestamp('2011-01-04T00:00:00.000+01:00'), timestamp('2011-01-05T00:00:00.000+01:00')]",
}
STRING_50 = "'01234567890123456789012345678901234567890123456789'"


def _lists() -> list[CostCase]:
    out = [
        _case("TestListsCost", LITERALS[kind] + ".sum()", (cost, cost), cost)
        for kind, cost in (("int", 15), ("uint", 20), ("double", 15), ("duration", 20))
    ]
    comparable = {
        "int": ((15, 15), 15),
        "uint": ((20, 20), 20),
        "double": ((15, 15), 15),
        "bool": ((15, 15), 15),
        "string": ((15, 25), 15),
        "bytes": ((25, 35), 25),
        "duration": ((20, 20), 20),
        "timestamp": ((20, 20), 20),
    }
    for op in (".isSorted()", ".max()", ".min()"):
        out += [
            _case("TestListsCost", LITERALS[kind] + op, cost, actual)
            for kind, (cost, actual) in comparable.items()
        ]
    params = {
        "int": ("3", (15, 15), 15),
        "uint": ("uint(3)", (21, 21), 21),
        "double": ("3.0", (15, 15), 15),
        "bool": ("true", (15, 15), 15),
        "string": ("'x'", (15, 25), 15),
        "bytes": ("bytes('x')", (26, 36), 26),
        "duration": ("duration('3s')", (21, 21), 21),
        "timestamp": ("timestamp('2011-01-03T00:00:00.000+01:00')", (21, 21), 21),
    }
    for op in ("indexOf", "lastIndexOf"):
        out += [
            _case("TestIndexOfCost", f"{LITERALS[kind]}.{op}({param})", cost, actual)
            for kind, (param, cost, actual) in params.items()
        ]
        out.append(_case("TestIndexOfCost", f"{STRING_50}.{op}('123')", (5, 5), 5))
    return out


def _urls() -> list[CostCase]:
    url = "url('https:://kubernetes.io/')"
    getters = ("getScheme", "getHostname", "getHost", "getPort", "getEscapedPath", "getQuery")
    out = [_case("TestURLsCost", f"{url}.{g}()", (4, 4), 4) for g in getters]
    out.append(_case("TestURLsCost", f"{url} == url('https:://kubernetes.io/')", (7, 9), 7))
    out.append(_case("TestURLsCost", f"{url} == url('http://x.b')", (5, 5), 5))
    return out


def _ips() -> list[CostCase]:
    out = []
    members = (
        "family", "isUnspecified", "isLoopback", "isLinkLocalMulticast", "isLinkLocalUnicast",
        "isGlobalUnicast",
    )  # fmt: skip
    for ip, base in (("ip('192.168.0.1')", 2), ("ip('2001:db8:3333:4444:5555:6666:7777:8888')", 4)):
        out.append(_case("TestIPCost", ip, (base, base), base))
        out += [_case("TestIPCost", f"{ip}.{m}()", (base + 1, base + 1), base + 1) for m in members]
        out.append(
            _case("TestIPCost", f"{ip} == ip('192.168.0.1')", (base + 3, base + 3), base + 3)
        )
    canonical = (
        ("192.168.0.1", 3),
        ("2001:db8:3333:4444:5555:6666:7777:8888", 8),
        ("2001:db8::abcd", 3),
    )
    out += [
        _case("TestIPIsCanonicalCost", f"ip.isCanonical('{text}')", (c, c), c)
        for text, c in canonical
    ]
    return out


def _cidrs() -> list[CostCase]:
    out = []
    v4, v6 = "cidr('192.168.0.0/16')", "cidr('2001:db8::/32')"
    for cidr in (v4, v6):
        out.append(_case("TestCIDRCost", cidr, (2, 2), 2))
        out += [
            _case("TestCIDRCost", f"{cidr}.{m}()", (3, 3), 3)
            for m in ("ip", "prefixLength", "masked")
        ]
        out.append(_case("TestCIDRCost", f"{cidr} == cidr('2001:db8::/32')", (5, 5), 5))
    # (operation, estimate added to the base's 2, actual added)
    v4_ops = (
        ("containsCIDR(cidr('192.0.0.0/30'))", (5, 9), 5),
        ("containsCIDR(cidr('192.168.0.0/16'))", (5, 9), 5),
        ("containsCIDR('192.0.0.0/30')", (5, 9), 5),
        ("containsCIDR('192.168.0.0/16')", (5, 9), 5),
        ("containsIP(ip('192.0.0.1'))", (2, 5), 2),
        ("containsIP(ip('192.169.0.1'))", (3, 6), 3),
        ("containsIP(ip('192.169.169.250'))", (3, 6), 3),
        ("containsIP('192.0.0.1')", (2, 5), 2),
        ("containsIP('192.169.0.1')", (3, 6), 3),
    )
    v6_ops = (
        ("containsCIDR(cidr('2001:db8::/126'))", (5, 9), 5),
        ("containsCIDR(cidr('2001:db8::/32'))", (5, 9), 5),
        ("containsCIDR('2001:db8::/126')", (5, 9), 5),
        ("containsCIDR('2001:db8::/32')", (5, 9), 5),
        ("containsIP(ip('2001:db8:3333:4444:5555:6666:7777:8888'))", (5, 8), 5),
        ("containsIP(ip('2001:db8::1'))", (3, 6), 3),
        ("containsIP('2001:db8:3333:4444:5555:6666:7777:8888')", (5, 8), 5),
        ("containsIP('2001:db8::1')", (3, 6), 3),
    )
    for cidr, ops in ((v4, v4_ops), (v6, v6_ops)):
        out += [
            _case("TestCIDRCost", f"{cidr}.{op}", (2 + lo, 2 + hi), 2 + actual)
            for op, (lo, hi), actual in ops
        ]
    return out


_STRINGS = (
    ("'ABCDEFGHIJ abcdefghij'.lowerAscii()", (3, 3), 3),
    ("'ABCDEFGHIJ abcdefghij'.lowerAscii() == 'abcdefghij ABCDEFGHIJ'.lowerAscii()", (7, 9), 9),
    ("'ABCDEFGHIJ abcdefghij'.upperAscii()", (3, 3), 3),
    ("'ABCDEFGHIJ abcdefghij'.upperAscii() == 'abcdefghij ABCDEFGHIJ'.upperAscii()", (7, 9), 9),
    ("strings.quote('ABCDEFGHIJ abcdefghij')", (3, 3), 3),
    (
        "strings.quote('ABCDEFGHIJ abcdefghij') == strings.quote('ABCDEFGHIJ abcdefghij')",
        (7, 11),
        9,
    ),
    ("'abc 123 def 123'.replace('123', '456')", (3, 3), 3),
    ("'abc 123 def 123'.replace('', 'x')", (3, 3), 3),
    ("'abc 123 def 123'.replace('123', '')", (3, 3), 3),
    ("'abc 123 def 123'.replace('123', '456', 1)", (3, 3), 3),
    ("'abc 123 def 123'.split(' ')", (3, 3), 3),
    ("'abc 123 def 123'.split(' ', 1)", (3, 3), 3),
    ("'abc 123 def 123'.substring(5)", (2, 2), 2),
    ("'abc 123 def 123'.substring(5, 8)", (2, 2), 2),
    ("'  abc 123 def 123  '.trim()", (2, 2), 2),
    ("['aa', 'bb', 'cc', 'd', 'e', 'f', 'g', 'h', 'i', 'j'].join(' ')", (11, 23), 15),
    ("['aa', 'bb', 'cc', 'd', 'e', 'f', 'g', 'h', 'i', 'j'].join()", (10, 22), 13),
    ("'abc 123 def 123'.find('123')", (2, 2), 2),
    ("'abc 123 def 123'.findAll('123')", (2, 2), 2),
    ("'abc 123 def 123'.findAll('123', 1)", (2, 2), 2),
)

_QUANTITIES = (
    ('quantity("12Mi")', (1, 1), 1),
    ('isQuantity("20")', (1, 1), 1),
    ('isQuantity("20M")', (1, 1), 1),
    ('quantity("200M") == quantity("200M")', (3, 3), 3),
    ('quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")', (3, 6), 6),
    (
        (
            'quantity("2M") == quantity("0.002G") && quantity("2000k") == quantity("2M") && '
            'quantity("0.002G") == quantity("2000k")'
        ),
        (3, 9),
        9,
    ),
    ('quantity("50M").isLessThan(quantity("50Mi"))', (3, 3), 3),
    ('quantity("50Mi").isGreaterThan(quantity("50M"))', (3, 3), 3),
    ('quantity("200M").compareTo(quantity("0.2G")) > 0', (4, 4), 4),
    ('quantity("50k").add(quantity("20")) == quantity("50.02k")', (5, 5), 5),
    ('quantity("50k").sub(quantity("20")) == quantity("49.98k")', (5, 5), 5),
    ('quantity("50k").sub(20) == quantity("49980")', (4, 4), 4),
    ('quantity("50k").add(20).sub(quantity("100k")).asInteger() > 0', (6, 6), 6),
    ('quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() > 0', (7, 7), 7),
    ('quantity("50k").asInteger() > 0', (3, 3), 3),
    ('quantity("50").isInteger()', (2, 2), 2),
    ('quantity("50.703k").asApproximateFloat() > 0.0', (3, 3), 3),
)

_NAMED_FORMATS = (
    ('format.named("dns1123subdomain")', (1, 1), 1),
    ('format.named("dns1123Subdomain").value().validate("my-name")', (34, 34), 17),
    ('format.named("dns1123Label").value().validate("my-name")', (34, 34), 10),
    (
        'format.named("dns1123Label").value() == format.named("dns1123Label").value()',
        (5, 11),
        5,
    ),
)

SETS = (
    ("sets.contains([], [])", (21, 21), 21),
    ("sets.contains([1], [])", (21, 21), 21),
    ("sets.contains([1], [1])", (22, 22), 22),
    ("sets.contains([1], [1, 1])", (23, 23), 23),
    ("sets.contains([1, 1], [1])", (23, 23), 23),
    ("sets.contains([2, 1], [1])", (23, 23), 23),
    ("sets.contains([1, 2, 3, 4], [2, 3])", (29, 29), 29),
    ("!sets.contains([1], [2])", (23, 23), 23),
    ("!sets.contains([1], [1, 2])", (24, 24), 24),
    ("sets.equivalent([], [])", (21, 21), 21),
    ("sets.equivalent([1], [1])", (23, 23), 23),
    ("sets.equivalent([1], [1, 1])", (25, 25), 25),
    ("sets.equivalent([1, 1], [1])", (25, 25), 25),
    ("!sets.equivalent([2, 1], [1])", (26, 26), 26),
    ("!sets.equivalent([1], [1, 2])", (26, 26), 26),
    ("sets.intersects([1], [1])", (22, 22), 22),
    ("sets.intersects([1], [1, 1])", (23, 23), 23),
    ("sets.intersects([1, 1], [1])", (23, 23), 23),
    ("sets.intersects([2, 1], [1])", (23, 23), 23),
    ("sets.intersects([1], [1, 2])", (23, 23), 23),
    ("!sets.intersects([], [])", (22, 22), 22),
    ("!sets.intersects([1], [])", (22, 22), 22),
    ("!sets.intersects([1], [2])", (23, 23), 23),
)
# Mixed element types in one literal: DRA's homogeneous-literal rule refuses them.
MIXED_SETS = (
    ("sets.contains([1], [1.0, 1])", "expected type 'double' but found 'int'"),
    ("sets.contains([1, 2], [2u, 2.0])", "expected type 'uint' but found 'double'"),
    ("sets.contains([1, 2u], [2, 2.0])", "expected type 'int' but found 'uint'"),
    ("sets.contains([1, 2.0, 3u], [1.0, 2u, 3])", "expected type 'int' but found 'double'"),
    ("sets.contains([[1], [2, 3]], [[2, 3.0]])", "expected type 'int' but found 'double'"),
    ('!sets.contains([1], ["1", 1])', "expected type 'string' but found 'int'"),
    ("!sets.contains([1], [1.1, 1u])", "expected type 'double' but found 'uint'"),
    ("sets.equivalent([1], [1u, 1.0])", "expected type 'uint' but found 'double'"),
    ("sets.equivalent([1, 2, 3], [3u, 2.0, 1])", "expected type 'uint' but found 'double'"),
    (
        "sets.equivalent([[1.0], [2, 3]], [[1], [2, 3.0]])",
        "expected type 'list(double)' but found 'list(int)'",
    ),
    ("!sets.equivalent([1, 2], [2u, 2, 2.0])", "expected type 'uint' but found 'int'"),
    ("!sets.equivalent([1, 2], [1u, 2, 2.3])", "expected type 'uint' but found 'int'"),
    ("sets.intersects([1], [1.0, 2])", "expected type 'double' but found 'int'"),
    ("sets.intersects([1, 2], [2u, 2, 2.0])", "expected type 'uint' but found 'int'"),
    ("sets.intersects([1, 2], [1u, 2, 2.3])", "expected type 'uint' but found 'int'"),
    (
        "sets.intersects([[1], [2, 3]], [[1, 2], [2, 3.0]])",
        "expected type 'int' but found 'double'",
    ),
    ('!sets.intersects([1], ["1", 2])', "expected type 'string' but found 'int'"),
    ("!sets.intersects([1], [1.1, 2u])", "expected type 'double' but found 'uint'"),
)

_SEMVERS = (
    ('semver("1.0.0")', (1, 1), 1),
    ('semver("1234.56789012345.67890123456789")', (4, 4), 4),
    ('isSemver("1.0.0")', (1, 1), 1),
    ('isSemver("1234.56789012345.67890123456789")', (4, 4), 4),
    ('semver("1.2.3").major()', (2, 2), 2),
    ('semver("1.2.3").minor()', (2, 2), 2),
    ('semver("1.2.3").patch()', (2, 2), 2),
    ('semver("1.0.0").isLessThan(semver("1.1.0"))', (3, 3), 3),
    ('semver("1.1.0").isGreaterThan(semver("1.0.0"))', (3, 3), 3),
    ('semver("1.0.0").compareTo(semver("1.2.3"))', (3, 3), 3),
)

_TWO_VARIABLE = (
    ("{'a': 1, 'b': 2}.all(k, v, v > 0)", (37, 41), 41),
    ("{'a': 1, 'b': 2}.exists(k, v, v > 0)", (39, 43), 40),
    ("{'a': 1, 'b': 2}.existsOne(k, v, v > 0)", (38, 40), 40),
    ("{'a': 1, 'b': 2}.transformMap(k, v, v + 1)", (71, 71), 71),
    ("{'a': 1, 'b': 2}.transformMap(k, v, v < 5, v + 1)", (67, 75), 75),
    ("{'a': 1, 'b': 2}.transformMapEntry(k, v, {k: v + 1})", (131, 131), 131),
    ("{'a': 1, 'b': 2}.transformMapEntry(k, v, v < 5, {k: v + 1})", (67, 135), 135),
    ("[1, 2].all(i, v, v > 0)", (17, 21), 21),
    ("[1, 2].exists(i, v, v > 0)", (19, 23), 20),
    ("[1, 2].existsOne(i, v, v > 0)", (18, 20), 20),
    ("[1, 2].transformList(i, v, v + 1)", (49, 49), 49),
    ("[1, 2].transformList(i, v, v < 5, v + 1)", (27, 53), 53),
)


def _table(test: str, rows: tuple[tuple[str, tuple[int, int], int], ...]) -> list[CostCase]:
    return [_case(test, expression, cost, actual) for expression, cost, actual in rows]


COST_CASES: tuple[CostCase, ...] = tuple(
    _lists()
    + _urls()
    + _ips()
    + _cidrs()
    + _table("TestStringLibrary", _STRINGS)
    + _table("TestQuantityCost", _QUANTITIES)
    + _table("TestNameFormatCost", _NAMED_FORMATS)
    + _table("TestSetsCost", SETS)
    + [_mixed("TestSetsCost", expression, fragment) for expression, fragment in MIXED_SETS]
    + _table("TestSemverCost", _SEMVERS)
    + _table("TestTwoVariableComprehensionCost", _TWO_VARIABLE)
)

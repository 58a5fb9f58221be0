"""Cases from Kubernetes' IP, CIDR and URL libraries: ``apiserver pkg/cel/library/ip_test.go``
TestIP and ``cidr_test.go`` TestCIDR (values, Go's exact parse errors), and the "IP and CIDR"
and "URL parsing" scenarios of apiextensions-apiserver's TestValidationExpressions (there on a
custom resource's ``self``; here the same values as literals). A non-bool upstream result is
compared with the expected value."""

from __future__ import annotations

from typing import Any

from tests.unit.cel_cases.base import (
    APIEXTENSIONS_TESTS,
    APISERVER_LIBRARY,
    Case,
    celpy_compile,
)
from tests.unit.cel_cases.base import compile_error as _compile_error
from tests.unit.cel_cases.base import ok as _ok
from tests.unit.cel_cases.base import runtime as _runtime

IP_TEST = f"{APISERVER_LIBRARY}/ip_test.go TestIP"
CIDR_TEST = f"{APISERVER_LIBRARY}/cidr_test.go TestCIDR"


def _maker(test: str, label: str) -> tuple[Any, Any]:
    def ok(name: str, expression: str, result: bool = True, **kw: Any) -> Case:
        return _ok(f"{label}/{name}", expression, result, cites=f"{test}/{name}", **kw)

    def runtime(name: str, expression: str, fragment: str, **kw: Any) -> Case:
        return _runtime(f"{label}/{name}", expression, fragment, cites=f"{test}/{name}", **kw)

    return ok, runtime


ip_ok, ip_error = _maker(IP_TEST, "TestIP")
cidr_ok, cidr_error = _maker(CIDR_TEST, "TestCIDR")

IP_CASES: tuple[Case, ...] = (
    ip_ok(
        "parse ipv4",
        'ip("192.168.0.1") == ip("192.168.0.1") && string(ip("192.168.0.1")) == "192.168.0.1"',
    ),
    ip_error(
        "parse invalid ipv4",
        'ip("192.168.0.1.0").family() == 4',
        'IP Address "192.168.0.1.0" parse error during conversion from string: '
        'ParseAddr("192.168.0.1.0"): IPv4 address too long',
    ),
    ip_ok("isIP valid ipv4", 'isIP("192.168.0.1")'),
    ip_ok("isIP invalid ipv4", 'isIP("192.168.0.1.0")', False),
    ip_ok("ip.isCanonical valid ipv4", 'ip.isCanonical("127.0.0.1")'),
    ip_error(
        "ip.isCanonical invalid ipv4",
        'ip.isCanonical("127.0.0.1.0")',
        'IP Address "127.0.0.1.0" parse error during conversion from string: '
        'ParseAddr("127.0.0.1.0"): IPv4 address too long',
    ),
    ip_ok("ipv4 family", 'ip("192.168.0.1").family() == 4'),
    ip_ok("ipv4 isUnspecified true", 'ip("0.0.0.0").isUnspecified()'),
    ip_ok("ipv4 isUnspecified false", 'ip("127.0.0.1").isUnspecified()', False),
    ip_ok("ipv4 isLoopback true", 'ip("127.0.0.1").isLoopback()'),
    ip_ok("ipv4 isLoopback false", 'ip("1.2.3.4").isLoopback()', False),
    ip_ok("ipv4 isLinkLocalMulticast true", 'ip("224.0.0.1").isLinkLocalMulticast()'),
    ip_ok("ipv4 isLinkLocalMulticast false", 'ip("224.0.1.1").isLinkLocalMulticast()', False),
    ip_ok("ipv4 isLinkLocalUnicast true", 'ip("169.254.169.254").isLinkLocalUnicast()'),
    ip_ok("ipv4 isLinkLocalUnicast false", 'ip("192.168.0.1").isLinkLocalUnicast()', False),
    ip_ok("ipv4 isGlobalUnicast true", 'ip("192.168.0.1").isGlobalUnicast()'),
    ip_ok("ipv4 isGlobalUnicast false", 'ip("255.255.255.255").isGlobalUnicast()', False),
    ip_ok("parse ipv6", 'string(ip("2001:db8::68")) == "2001:db8::68"'),
    ip_error(
        "parse invalid ipv6",
        'ip("2001:db8:::68").family() == 6',
        'IP Address "2001:db8:::68" parse error during conversion from string: '
        'ParseAddr("2001:db8:::68"): each colon-separated field must have at least one digit '
        '(at ":68")',
    ),
    ip_ok("isIP valid ipv6", 'isIP("2001:db8::68")'),
    ip_ok("isIP invalid ipv6", 'isIP("2001:db8:::68")', False),
    ip_ok("ip.isCanonical valid ipv6", 'ip.isCanonical("2001:db8::68")'),
    ip_ok("ip.isCanonical non-canonical ipv6", 'ip.isCanonical("2001:DB8::68")', False),
    ip_error(
        "ip.isCanonical invalid ipv6",
        'ip.isCanonical("2001:db8:::68")',
        'ParseAddr("2001:db8:::68"): each colon-separated field must have at least one digit',
    ),
    ip_ok("ipv6 family", 'ip("2001:db8::68").family() == 6'),
    ip_ok("ipv6 isUnspecified true", 'ip("::").isUnspecified()'),
    ip_ok("ipv6 isUnspecified false", 'ip("::1").isUnspecified()', False),
    ip_ok("ipv6 isLoopback true", 'ip("::1").isLoopback()'),
    ip_ok("ipv6 isLoopback false", 'ip("2001:db8::abcd").isLoopback()', False),
    ip_ok("ipv6 isLinkLocalMulticast true", 'ip("ff02::1").isLinkLocalMulticast()'),
    ip_ok("ipv6 isLinkLocalMulticast false", 'ip("fd00::1").isLinkLocalMulticast()', False),
    ip_ok("ipv6 isLinkLocalUnicast true", 'ip("fe80::1").isLinkLocalUnicast()'),
    ip_ok("ipv6 isLinkLocalUnicast false", 'ip("fd80::1").isLinkLocalUnicast()', False),
    ip_ok("ipv6 isGlobalUnicast true", 'ip("2001:db8::abcd").isGlobalUnicast()'),
    ip_ok("ipv6 isGlobalUnicast false", 'ip("ff00::1").isGlobalUnicast()', False),
    _compile_error(
        "TestIP/passing cidr into isIP returns compile error",
        'isIP(cidr("192.168.0.0/24"))',
        "found no matching overload for 'isIP' applied to '(net.CIDR)'",
        cites=f"{IP_TEST}/passing cidr into isIP returns compile error",
        celpy=celpy_compile(),
    ),
    ip_ok("converting an IP address to a string", 'string(ip("192.168.0.1")) == "192.168.0.1"'),
    ip_ok("type of IP is net.IP", 'type(ip("192.168.0.1")) == net.IP'),
)

_BAD_BITS = (
    "network address parse error during conversion from string: network address parse error "
    'during conversion from string: netip.ParsePrefix({0}): bad bits after slash: ""'
)

CIDR_CASES: tuple[Case, ...] = (
    cidr_ok("parse ipv4", 'string(cidr("192.168.0.0/24")) == "192.168.0.0/24"'),
    cidr_error(
        "parse invalid ipv4",
        'cidr("192.168.0.0/").prefixLength() == 0',
        _BAD_BITS.format('"192.168.0.0/"'),
    ),
    cidr_ok("contains IP ipv4 (IP)", 'cidr("192.168.0.0/24").containsIP(ip("192.168.0.1"))'),
    cidr_ok(
        "does not contain IP ipv4 (IP)",
        'cidr("192.168.0.0/24").containsIP(ip("192.168.1.1"))',
        False,
    ),
    cidr_ok("contains IP ipv4 (string)", 'cidr("192.168.0.0/24").containsIP("192.168.0.1")'),
    cidr_ok(
        "does not contain IP ipv4 (string)",
        'cidr("192.168.0.0/24").containsIP("192.168.1.1")',
        False,
    ),
    cidr_ok(
        "contains CIDR ipv4 (CIDR)", 'cidr("192.168.0.0/24").containsCIDR(cidr("192.168.0.0/25"))'
    ),
    cidr_ok(
        "contains CIDR ipv4 (CIDR) (/32)",
        'cidr("192.168.0.0/24").containsCIDR(cidr("192.168.0.1/32"))',
    ),
    cidr_ok(
        "does not contain IP ipv4 (CIDR)",
        'cidr("192.168.0.0/24").containsCIDR(cidr("192.168.0.0/23"))',
        False,
    ),
    cidr_ok(
        "does not contain IP ipv4 (CIDR) (/32)",
        'cidr("192.168.0.0/24").containsCIDR(cidr("192.169.0.1/32"))',
        False,
    ),
    cidr_ok("contains CIDR ipv4 (string)", 'cidr("192.168.0.0/24").containsCIDR("192.168.0.0/25")'),
    cidr_ok(
        "does not contain CIDR ipv4 (string)",
        'cidr("192.168.0.0/24").containsCIDR("192.168.0.0/23")',
        False,
    ),
    cidr_ok("returns IP ipv4", 'cidr("192.168.0.0/24").ip() == ip("192.168.0.0")'),
    cidr_ok("masks masked ipv4", 'cidr("192.168.0.0/24").masked() == cidr("192.168.0.0/24")'),
    cidr_ok("masks unmasked ipv4", 'cidr("192.168.0.1/24").masked() == cidr("192.168.0.0/24")'),
    cidr_ok("returns prefix length ipv4", 'cidr("192.168.0.0/24").prefixLength() == 24'),
    cidr_ok("parse ipv6", 'string(cidr("2001:db8::/32")) == "2001:db8::/32"'),
    cidr_error(
        "parse invalid ipv6",
        'cidr("2001:db8::/").prefixLength() == 0',
        _BAD_BITS.format('"2001:db8::/"'),
    ),
    cidr_ok("contains IP ipv6 (IP)", 'cidr("2001:db8::/32").containsIP(ip("2001:db8::1"))'),
    cidr_ok(
        "does not contain IP ipv6 (IP)",
        'cidr("2001:db8::/32").containsIP(ip("2001:dc8::1"))',
        False,
    ),
    cidr_ok("contains IP ipv6 (string)", 'cidr("2001:db8::/32").containsIP("2001:db8::1")'),
    cidr_ok(
        "does not contain IP ipv6 (string)",
        'cidr("2001:db8::/32").containsIP("2001:dc8::1")',
        False,
    ),
    cidr_ok(
        "contains CIDR ipv6 (CIDR)", 'cidr("2001:db8::/32").containsCIDR(cidr("2001:db8::/33"))'
    ),
    cidr_ok(
        "does not contain IP ipv6 (CIDR)",
        'cidr("2001:db8::/32").containsCIDR(cidr("2001:db8::/31"))',
        False,
    ),
    cidr_ok("contains CIDR ipv6 (string)", 'cidr("2001:db8::/32").containsCIDR("2001:db8::/33")'),
    cidr_ok(
        "does not contain CIDR ipv6 (string)",
        'cidr("2001:db8::/32").containsCIDR("2001:db8::/31")',
        False,
    ),
    cidr_ok("returns IP ipv6", 'cidr("2001:db8::/32").ip() == ip("2001:db8::")'),
    cidr_ok("masks masked ipv6", 'cidr("2001:db8::/32").masked() == cidr("2001:db8::/32")'),
    cidr_ok("masks unmasked ipv6", 'cidr("2001:db8:1::/32").masked() == cidr("2001:db8::/32")'),
    cidr_ok("returns prefix length ipv6", 'cidr("2001:db8::/32").prefixLength() == 32'),
    cidr_ok("converting a CIDR to a string", 'string(cidr("192.168.0.0/24")) == "192.168.0.0/24"'),
    cidr_ok("type of CIDR is net.CIDR", 'type(cidr("192.168.0.0/24")) == net.CIDR'),
)

_IP_AND_CIDR = (
    'isIP("192.168.0.1")',
    'ip.isCanonical("127.0.0.1")',
    'ip("192.168.0.1").family() > 0',
    'ip("0.0.0.0").isUnspecified()',
    'ip("127.0.0.1").isLoopback()',
    'ip("224.0.0.1").isLinkLocalMulticast()',
    'ip("192.168.0.1").isGlobalUnicast()',
    'type(ip("192.168.0.1")) == net.IP',
    'cidr("192.168.0.0/24").containsIP(ip("192.168.0.1"))',
    'cidr("192.168.0.0/24").containsCIDR("192.168.0.0/25")',
    'cidr("2001:db8::/32").containsCIDR(cidr("2001:db8::/33"))',
    'type(cidr("2001:db8::/32").ip()) == net.IP',
    "cidr('192.168.0.0/24') == cidr('192.168.0.0/24').masked()",
    "cidr('192.168.0.0/16').prefixLength() == 16",
    "cidr('::1/128').ip().family() == 6",
)

_URL = "'https://user:pass@kubernetes.io:80/docs/home?k1=a&k2=b&k2=c#anchor'"
_URL_PARSING = (
    "url('/path').getScheme() == ''",
    "url('https://example.com/').getScheme() == 'https'",
    "url('https://example.com:80/').getHost() == 'example.com:80'",
    "url('https://example.com/').getHost() == 'example.com'",
    "url('https://[::1]:80/').getHost() == '[::1]:80'",
    "url('https://[::1]/').getHost() == '[::1]'",
    "url('/path').getHost() == ''",
    "url('https://example.com:80/').getHostname() == 'example.com'",
    "url('https://127.0.0.1/').getHostname() == '127.0.0.1'",
    "url('https://[::1]/').getHostname() == '::1'",
    "url('/path').getHostname() == ''",
    "url('https://example.com:80/').getPort() == '80'",
    "url('https://example.com/').getPort() == ''",
    "url('/path').getPort() == ''",
    "url('https://example.com/path').getEscapedPath() == '/path'",
    "url('https://example.com/with space/').getEscapedPath() == '/with%20space/'",
    "url('https://example.com').getEscapedPath() == ''",
    "url('https://example.com/path?k1=a&k2=b&k2=c').getQuery() == { 'k1': ['a'], 'k2': ['b', 'c']}",
    (
        "url('https://example.com/path?key with spaces=value with spaces').getQuery() == "
        "{ 'key with spaces': ['value with spaces']}"
    ),
    "url('https://example.com/path?').getQuery() == {}",
    "url('https://example.com/path').getQuery() == {}",
    f"url({_URL}).getScheme() == 'https'",
    f"url({_URL}).getHost() == 'kubernetes.io:80'",
    f"url({_URL}).getHostname() == 'kubernetes.io'",
    f"url({_URL}).getPort() == '80'",
    f"url({_URL}).getEscapedPath() == '/docs/home'",
    f"url({_URL}).getQuery() == {{'k1': ['a'], 'k2': ['b', 'c']}}",
    "isURL('https://user:pass@example.com:80/path?query=val#fragment')",
    "isURL('/path') == true",
    "isURL('https://a:b:c/') == false",
    "isURL('../relative-path') == false",
)


def _valid(section: str, expressions: tuple[str, ...]) -> tuple[Case, ...]:
    return tuple(
        _ok(
            f"TestValidationExpressions/{section}/{e}",
            e,
            cites=f"{APIEXTENSIONS_TESTS} TestValidationExpressions/{section}",
        )
        for e in expressions
    )


CASES: tuple[Case, ...] = (
    IP_CASES
    + CIDR_CASES
    + _valid("IP and CIDR", _IP_AND_CIDR)
    + _valid("URL parsing", _URL_PARSING)
)

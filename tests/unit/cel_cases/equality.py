"""Cases of ``==`` and ``!=`` between Kubernetes' own types (version, quantity, IP, CIDR, URL,
named format) and other values: cel-go evaluates ``L == R`` as ``L.Equal(R)`` (after a null on
either side, which compares as null), and each of Kubernetes' types answers "no such overload"
for a value of another type (``k8s.io/apiserver/pkg/cel``: semver.go, quantity.go, ip.go,
cidr.go, url.go, format.go, each type's ``Equal``). A string (or any CEL value) on the left
answers false instead. Statically the checker refuses such a comparison outright; at run time
it happens where one side is dyn -- a device attribute, above all (a version attribute
compared with a string).

cel-go's list and map equality ignore an element's error (only a ``false`` decides), so a list
holding a version equals a list holding the same text there; cel-cpp says false
(``upstream``).
"""

from __future__ import annotations

from typing import Any

from tests.unit.cel_cases.base import (
    NO_OPTIONAL,
    Case,
    celpy_error,
    device,
    version,
)
from tests.unit.cel_cases.base import ok as _ok
from tests.unit.cel_cases.base import runtime as _runtime

APISERVER = "kubernetes/apiserver pkg/cel"
CEL_GO = "google/cel-go@v0.27.0 common/types/equal.go Equal; common/types/list.go baseList.Equal"
DRA = "dra.example.com"
A = f'device.attributes["{DRA}"]'
DEVICE = device(DRA, {"version": version("1.0.0"), "model": "a100", "count": 2})
NO_SUCH = "no such overload"
CELPY_REFLECTED = celpy_error(
    "Python reflects a string's == to the version on its right, whose Equal errs",
    NO_SUCH,
)
CELPY_IN = celpy_error(
    "celpy's `in` compares with Python's ==, which errs where cel-go's Contains skips", NO_SUCH
)


def _case(make: Any, cites: str, name: str, expression: str, *args: Any, **kw: Any) -> Case:
    kw.setdefault("device", DEVICE)
    kw.setdefault("driver", DRA)
    return make(f"equality: {name}", expression, *args, cites=cites, **kw)


def ok(cites: str, name: str, expression: str, result: bool = True, **kw: Any) -> Case:
    return _case(_ok, f"{APISERVER}/{cites}", name, expression, result, **kw)


def error(cites: str, name: str, expression: str, **kw: Any) -> Case:
    return _case(_runtime, f"{APISERVER}/{cites}", name, expression, NO_SUCH, **kw)


CASES: tuple[Case, ...] = (
    error("semver.go Semver.Equal", "a version attribute == a string", f'{A}.version == "1.0.0"'),
    error("semver.go Semver.Equal", "a version attribute != a string", f'{A}.version != "1.0.0"'),
    error("semver.go Semver.Equal", "a version attribute == an int", f"{A}.version == 1"),
    ok("semver.go Semver.Equal", "a version attribute == a version",
       f'{A}.version == semver("1.0.0")'),
    ok("semver.go Semver.Equal", "a version attribute == null", f"{A}.version == null", False),
    ok("semver.go Semver.Equal", "a string attribute == a version (String.Equal: false)",
       f'{A}.model == semver("1.0.0")', False, celpy=CELPY_REFLECTED),
    ok("semver.go Semver.Equal", "a string attribute == a string", f'{A}.model == "a100"'),
    ok("semver.go Semver.Equal", "an int attribute == an int", f"{A}.count == 2"),
    error("semver.go Semver.Equal", "a version == a dyn string",
          'semver("1.0.0") == dyn("1.0.0")'),
    error("semver.go Semver.Equal", "a dyn version == a dyn quantity",
          'dyn(semver("1.0.0")) == dyn(quantity("1"))'),
    ok("semver.go Semver.Equal", "a dyn version in a list of strings (no error: false)",
       'dyn(semver("1.0.0")) in ["1.0.0"]', False, celpy=CELPY_IN),
    error("quantity.go Quantity.Equal", "a dyn quantity == an int", 'dyn(quantity("1")) == 1'),
    ok("quantity.go Quantity.Equal", "equal quantities", 'quantity("1") == quantity("1000m")'),
    error("ip.go IP.Equal", "a dyn IP == a string", 'dyn(ip("1.2.3.4")) == "1.2.3.4"'),
    ok("ip.go IP.Equal", "equal IPs", 'ip("1.2.3.4") == ip("1.2.3.4")'),
    error("cidr.go CIDR.Equal", "a dyn CIDR == an int", 'dyn(cidr("1.2.3.0/24")) == 1'),
    error("url.go URL.Equal", "a dyn URL == a string", 'dyn(url("https://x")) == "https://x"'),
    error("format.go Format.Equal", "a named format == an int",
          'format.named("dns1123Label").value() == dyn(1)',
          celpy=celpy_error(NO_OPTIONAL)),
    _case(
        _ok,
        CEL_GO,
        "a list holding a version == a list holding its text",
        '[dyn(semver("1.0.0"))] == ["1.0.0"]',
        False,
        upstream="true: cel-go's list equality skips an element comparison that errs; cel-cpp's"
        " heterogeneous equality of the elements is false",
        celpy=celpy_error(
            "celpy's list equality compares with Python's ==, which errs on the elements",
            NO_SUCH,
        ),
    ),
)  # fmt: skip

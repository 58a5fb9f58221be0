"""Cases from Kubernetes' quantity library test (``apiserver pkg/cel/library/quantity_test.go``
TestQuantity): each expression with its expected value, runtime error or compile error. A case
whose upstream result is not a bool compares it with the expected value."""

from __future__ import annotations

from typing import Any

from tests.unit.cel_cases.base import APISERVER_LIBRARY, Case, celpy_compile, cited
from tests.unit.cel_cases.base import compile_error as _compile_error
from tests.unit.cel_cases.base import ok as _ok
from tests.unit.cel_cases.base import runtime as _runtime

TEST = f"{APISERVER_LIBRARY}/quantity_test.go TestQuantity"


def ok(name: str, expression: str, result: bool = True, **kw: Any) -> Case:
    return _ok(f"TestQuantity/{name}", expression, result, cites=f"{TEST}/{name}", **kw)


def runtime(name: str, expression: str, fragment: str, **kw: Any) -> Case:
    return _runtime(f"TestQuantity/{name}", expression, fragment, cites=f"{TEST}/{name}", **kw)


def compile_error(name: str, expression: str, fragment: str, **kw: Any) -> Case:
    return _compile_error(
        f"TestQuantity/{name}", expression, fragment, cites=f"{TEST}/{name}", **kw
    )


CASES: tuple[Case, ...] = cited(
    TEST,
    [
        ok("parse", 'quantity("12Mi") == quantity("12582912")'),
        runtime(
            "parseInvalidSuffix",
            'quantity("10Mo").sign() == 1',
            "quantities must match the regular expression",
        ),
        runtime(
            "parseInvalidSuffixPassesRegex",
            'quantity("10Mm").sign() == 1',
            "unable to parse quantity's suffix",
        ),
        ok("isQuantity", 'isQuantity("20")'),
        ok("isQuantity_megabytes", 'isQuantity("20M")'),
        ok("isQuantity_mebibytes", 'isQuantity("20Mi")'),
        ok("isQuantity_invalidSuffix", 'isQuantity("20Mo")', False),
        ok("isQuantity_passingRegex", 'isQuantity("10Mm")', False),
        compile_error(
            "isQuantity_noOverload",
            "isQuantity([1, 2, 3])",
            "found no matching overload for 'isQuantity' applied to",
            celpy=celpy_compile(),
        ),
        ok("equality_reflexivity", 'quantity("200M") == quantity("200M")'),
        ok(
            "equality_symmetry",
            'quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")',
        ),
        ok(
            "equality_transitivity",
            'quantity("2M") == quantity("0.002G") && quantity("2000k") == quantity("2M") && '
            'quantity("0.002G") == quantity("2000k")',
        ),
        ok("inequality", 'quantity("200M") == quantity("0.3G")', False),
        ok("quantity_less", 'quantity("50M").isLessThan(quantity("50Mi"))'),
        ok("quantity_less_obvious", 'quantity("50M").isLessThan(quantity("100M"))'),
        ok("quantity_less_false", 'quantity("100M").isLessThan(quantity("50M"))', False),
        ok("quantity_greater", 'quantity("50Mi").isGreaterThan(quantity("50M"))'),
        ok("quantity_greater_obvious", 'quantity("150Mi").isGreaterThan(quantity("100Mi"))'),
        ok("quantity_greater_false", 'quantity("50M").isGreaterThan(quantity("100M"))', False),
        ok("compare_equal", 'quantity("200M").compareTo(quantity("0.2G")) == 0'),
        ok("compare_less", 'quantity("50M").compareTo(quantity("50Mi")) == -1'),
        ok("compare_greater", 'quantity("50Mi").compareTo(quantity("50M")) == 1'),
        ok("add_quantity", 'quantity("50k").add(quantity("20")) == quantity("50.02k")'),
        ok("add_int", 'quantity("50k").add(20).isLessThan(quantity("50020"))', False),
        ok("sub_quantity", 'quantity("50k").sub(quantity("20")) == quantity("49.98k")'),
        ok("sub_int", 'quantity("50k").sub(20) == quantity("49980")'),
        ok(
            "arith_chain_1",
            'quantity("50k").add(20).sub(quantity("100k")).asInteger() == -49980',
        ),
        ok(
            "arith_chain",
            'quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() == 20',
        ),
        ok("as_integer", 'quantity("50k").asInteger() == 50000'),
        runtime(
            "as_integer_error",
            'quantity("9999999999999999999999999999999999999G").asInteger() == 0',
            "cannot convert value to integer",
        ),
        ok(
            "is_integer (huge)",
            'quantity("9999999999999999999999999999999999999G").isInteger()',
            False,
        ),
        ok("is_integer", 'quantity("50").isInteger()'),
        ok("as_float", 'quantity("50.703k").asApproximateFloat() == 50703.0'),
    ],
)

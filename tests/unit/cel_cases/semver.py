"""Cases from Kubernetes' semver library test (``apiserver pkg/cel/library/semver_test.go``
TestSemver, library version 1: ``semver(s, true)`` normalises): each expression with its
expected value, runtime error or compile error; a non-bool value is compared with the
expected one."""

from __future__ import annotations

from typing import Any

from tests.unit.cel_cases.base import APISERVER_LIBRARY, Case, celpy_compile
from tests.unit.cel_cases.base import compile_error as _compile_error
from tests.unit.cel_cases.base import ok as _ok
from tests.unit.cel_cases.base import runtime as _runtime

TEST = f"{APISERVER_LIBRARY}/semver_test.go TestSemver"


def ok(name: str, expression: str, result: bool = True, **kw: Any) -> Case:
    return _ok(f"TestSemver/{name}", expression, result, cites=f"{TEST}/{name}", **kw)


CASES: tuple[Case, ...] = (
    ok("parse", 'semver("1.2.3") == semver("1.2.3+build")'),
    _runtime(
        "TestSemver/parseInvalidVersion",
        'semver("v1.0").major() == 1',
        "No Major.Minor.Patch elements found",
        cites=f"{TEST}/parseInvalidVersion",
    ),
    ok("isSemver", 'isSemver("1.2.3-beta.1+build.1")'),
    ok("isSemver_empty_false", 'isSemver("")', False),
    ok("isSemver_v_prefix_false", 'isSemver("v1.0.0")', False),
    ok("isSemver_v_leading_whitespace_false", 'isSemver(" 1.0.0")', False),
    ok("isSemver_v_contains_whitespace_false", 'isSemver("1. 0.0")', False),
    ok("isSemver_v_trailing_whitespace_false", 'isSemver("1.0.0 ")', False),
    ok("isSemver_leading_zeros_false", 'isSemver("01.01.01")', False),
    ok("isSemver_major_only_false", 'isSemver("1")', False),
    ok("isSemver_major_minor_only_false", 'isSemver("1.1")', False),
    ok("isSemver_empty_normalize_false", 'isSemver("", true)', False),
    ok("isSemver_v_leading_whitespace_normalize_false", 'isSemver(" 1.0.0", true)', False),
    ok("isSemver_v_contains_whitespace_normalize_false", 'isSemver("1. 0.0", true)', False),
    ok("isSemver_v_trailing_whitespace_normalize_false", 'isSemver("1.0.0 ", true)', False),
    ok("isSemver_v_prefix_normalize_true", 'isSemver("v1.0.0", true)'),
    ok("isSemver_leading_zeros_normalize_true", 'isSemver("01.01.01", true)'),
    ok("isSemver_major_only_normalize_true", 'isSemver("1", true)'),
    ok("isSemver_major_minor_only_normalize_true", 'isSemver("1.1", true)'),
    _compile_error(
        "TestSemver/isSemver_noOverload",
        "isSemver([1, 2, 3])",
        "found no matching overload for 'isSemver' applied to",
        cites=f"{TEST}/isSemver_noOverload",
        celpy=celpy_compile(),
    ),
    ok("equality_normalize", 'semver("v01.01", true) == semver("1.1.0")'),
    ok("equality_reflexivity", 'semver("1.2.3") == semver("1.2.3")'),
    ok("inequality", 'semver("1.2.3") == semver("1.0.0")', False),
    ok("semver_less", 'semver("1.0.0").isLessThan(semver("1.2.3"))'),
    ok("semver_less_false", 'semver("1.0.0").isLessThan(semver("1.0.0"))', False),
    ok("semver_greater", 'semver("1.2.3").isGreaterThan(semver("1.0.0"))'),
    ok("semver_greater_false", 'semver("1.0.0").isGreaterThan(semver("1.0.0"))', False),
    ok("compare_equal", 'semver("1.2.3").compareTo(semver("1.2.3")) == 0'),
    ok("compare_less", 'semver("1.0.0").compareTo(semver("1.2.3")) == -1'),
    ok("compare_greater", 'semver("1.2.3").compareTo(semver("1.0.0")) == 1'),
    ok("major", 'semver("1.2.3").major() == 1'),
    ok("minor", 'semver("1.2.3").minor() == 2'),
    ok("patch", 'semver("1.2.3").patch() == 3'),
)

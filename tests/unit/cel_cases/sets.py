"""Cases of cel-go's sets extension: ``ext/sets_test.go`` TestSets at v0.27.0, each expression
with its estimated and actual cost (the same table Kubernetes' TestSetsCost repeats), on both
engines. The cases whose literals mix element types (``[1.0, 1]``) are compile errors in DRA's
environment, which enables homogeneous aggregate literals; the sets' numeric equality across
int, uint and double is covered by the dyn-element variants after them."""

from __future__ import annotations

from tests.unit.cel_cases.base import CEL_GO_EXT, NO_TYPE_CHECKER, Case, celpy_error
from tests.unit.cel_cases.base import compile_error as _compile_error
from tests.unit.cel_cases.base import ok as _ok
from tests.unit.cel_cases.costs import MIXED_SETS, SETS

TEST = f"{CEL_GO_EXT}/sets_test.go TestSets"
CELPY_MIXED = celpy_error(
    f"{NO_TYPE_CHECKER} (DRA's homogeneous literals); celpy fails comparing across numeric types"
)
CELPY_NUMERIC = celpy_error("celpy fails comparing an int with a double or a uint (CEL: equal)")


CASES: tuple[Case, ...] = (
    tuple(
        _ok(
            f"TestSets/{expression}",
            expression,
            cites=TEST,
            cost=cost,
            actual=actual,
        )
        for expression, cost, actual in SETS
    )
    + tuple(
        _compile_error(
            f"TestSets/{expression}", expression, fragment, cites=TEST, celpy=CELPY_MIXED
        )
        for expression, fragment in MIXED_SETS
        if not expression.startswith('!sets.contains([1], ["1"')
        and not expression.startswith('!sets.intersects([1], ["1"')
    )
    + (
        _compile_error(
            'TestSets/!sets.contains([1], ["1", 1])',
            '!sets.contains([1], ["1", 1])',
            "expected type 'string' but found 'int'",
            cites=TEST,
            celpy=celpy_error(f"{NO_TYPE_CHECKER} (DRA's homogeneous literals)"),
        ),
        _compile_error(
            'TestSets/!sets.intersects([1], ["1", 2])',
            '!sets.intersects([1], ["1", 2])',
            "expected type 'string' but found 'int'",
            cites=TEST,
            celpy=celpy_error(f"{NO_TYPE_CHECKER} (DRA's homogeneous literals)"),
        ),
        # the mixed sets with dyn elements, which DRA's environment accepts
        _ok(
            "TestSets/sets.contains([1], [dyn(1.0), dyn(1)])",
            "sets.contains([1], [dyn(1.0), dyn(1)])",
            cites=TEST,
            celpy=CELPY_NUMERIC,
        ),
        _ok(
            "TestSets/sets.equivalent([1, 2, 3], [dyn(3u), dyn(2.0), dyn(1)])",
            "sets.equivalent([1, 2, 3], [dyn(3u), dyn(2.0), dyn(1)])",
            cites=TEST,
            celpy=CELPY_NUMERIC,
        ),
        _ok(
            "TestSets/!sets.intersects([1], [dyn(1.1), dyn(2u)])",
            "!sets.intersects([1], [dyn(1.1), dyn(2u)])",
            cites=TEST,
            celpy=CELPY_NUMERIC,
        ),
    )
)

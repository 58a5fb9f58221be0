"""The DRA CEL conformance table, run on both engines by tests/unit/test_cel_conformance.py:
biaxial's own cases (:mod:`.core`) and cases written from upstream's test tables, one module
per library, each case citing its upstream test (see :mod:`.base` for the model)."""

from __future__ import annotations

from tests.unit.cel_cases import (
    comprehensions,
    dra,
    equality,
    formats,
    lists,
    nesting,
    net,
    quantity,
    semver,
    sets,
    strings,
)
from tests.unit.cel_cases.base import Case, Deviation
from tests.unit.cel_cases.core import CASES as CORE
from tests.unit.cel_cases.core import DRIVER, T4

CASES: tuple[Case, ...] = (
    CORE
    + dra.CASES
    + quantity.CASES
    + semver.CASES
    + net.CASES
    + lists.CASES
    + sets.CASES
    + strings.CASES
    + comprehensions.CASES
    + nesting.CASES
    + equality.CASES
    + formats.CASES
)

__all__ = ["CASES", "DRIVER", "T4", "Case", "Deviation"]

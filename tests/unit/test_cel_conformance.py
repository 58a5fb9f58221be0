"""The conformance table (tests/unit/cel_cases/) on both engines, plus the engine contract:
compile cache, message shape, and MatchCache behaviour."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest

from driver.api.errors import CELCompileError, CELEvaluationError, DeadlineExceededError
from driver.api.ids import DeviceID, DeviceName, DriverName, PoolName
from driver.api.model import Device, Version
from driver.cel import engine as cel
from driver.cel import estimate, syntax
from driver.cel.matchcache import MatchCache
from tests.unit import celpy_engine
from tests.unit.cel_cases import CASES, DRIVER, T4, Case, nesting, strings
from tests.unit.cel_cases.base import DRA_TESTS
from tests.unit.cel_cases.costs import COST_CASES, CostCase


def _outcome(compile_fn: Callable[[str], Any], case: Case) -> bool | Exception:
    try:
        return bool(compile_fn(case.expression).matches(case.device, case.driver))
    except (CELCompileError, CELEvaluationError) as exc:
        return exc


def _check(
    outcome: bool | Exception, result: bool | None, error: type | None, fragment: str
) -> None:
    if error is None:
        assert outcome is result, f"expected {result}, got {outcome!r}"
        return
    assert isinstance(outcome, error), f"expected {error.__name__}, got {outcome!r}"
    assert fragment in str(outcome), f"{fragment!r} not in {str(outcome)!r}"


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 80
    assert len({c.name for c in CASES}) == len(CASES), "case names must be unique"


# Each of these is a difference listed in driver.cel.engine's docstring and docs/cel.md.
KNOWN_DEVIATIONS = {
    "has() on a device field",  # object type
    "has() on allowMultipleAllocations",  # object type
    "computed domain name",  # unknown domains
    "in sees a padded literal domain",  # unknown domains
    "equality: a list holding a version == a list holding its text",  # element errors
}


def test_driver_deviations_from_upstream_are_few_and_documented() -> None:
    deviations = [c for c in CASES if c.upstream]
    assert {c.name for c in deviations} == KNOWN_DEVIATIONS
    for case in deviations:
        # celpy's outcome is asserted too (upstream's, where celpy can give it).
        assert case.celpy is not None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cel_expr_python(case: Case) -> None:
    _check(_outcome(cel.compile_selector, case), case.result, case.error, case.fragment)


COSTED = [c for c in CASES if c.cost is not None or c.actual is not None]


@pytest.mark.parametrize("case", COSTED, ids=lambda c: c.name)
def test_cost_is_upstreams(case: Case) -> None:
    """Upstream's static estimate and actual cost where its test pins them."""
    measured = cel.measure(case.expression, case.device, case.driver)
    if isinstance(case.cost, tuple):
        assert measured.estimate == case.cost
    elif case.cost is not None:
        assert measured.estimate[1] == case.cost
    if case.actual is not None:
        assert measured.actual == case.actual


TESTCEL = [c for c in CASES if c.cites.startswith(DRA_TESTS) and c.error is not CELCompileError]


@pytest.mark.parametrize("case", TESTCEL, ids=lambda c: c.name)
def test_actual_cost_stays_within_the_estimate(case: Case) -> None:
    """As upstream's TestCEL checks for its scenarios: the estimate bounds the actual cost.
    (Not for every expression: cel-go's own estimate of startsWith reads the prefix's size
    where its runtime charges the string's, so ``s.startsWith("ab")`` can cost more than
    estimated, upstream as here.)"""
    measured = cel.measure(case.expression, case.device, case.driver)
    assert measured.actual <= measured.estimate[1], measured


@pytest.mark.parametrize("case", COST_CASES + strings.COST_CASES, ids=lambda c: c.name)
def test_library_cost_tables(case: CostCase) -> None:
    """Kubernetes' library cost tests: estimate range and actual cost, exactly."""
    if case.compile_error:
        with pytest.raises(CELCompileError, match=re.escape(case.compile_error)):
            cel.measure(case.expression, sizes=estimate.library_test_sizes)
        return
    measured = cel.measure(case.expression, sizes=estimate.library_test_sizes)
    assert not measured.error, measured
    assert measured.estimate == case.cost
    assert measured.actual == case.actual


@pytest.mark.parametrize("case", nesting.PARSER_LIMIT_32, ids=lambda c: c.name)
def test_nesting_depth_is_measured_as_upstream(case: nesting.DepthCase) -> None:
    """cel-go's parser tests at their limit of 32: driver.cel.syntax finds the same error."""
    problem = syntax.parse(case.expression, limit=32).upstream_problem
    if case.error is None:
        assert problem is None
    else:
        assert problem is not None
        assert problem.startswith(case.error), problem


def test_every_case_cites_its_source() -> None:
    assert all(c.cites for c in CASES), [c.name for c in CASES if not c.cites]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_celpy(case: Case) -> None:
    outcome = _outcome(celpy_engine.compile, case)
    if case.celpy is None:
        _check(outcome, case.result, case.error, case.fragment)
    else:
        dev = case.celpy
        assert dev.reason
        _check(outcome, dev.result, dev.error, dev.fragment)


# --------------------------------------------------------------------------- contract


def test_compile_is_cached_per_expression() -> None:
    a = cel.compile_selector('device.driver == "x"')
    b = cel.compile_selector('device.driver == "x"')
    assert a is b
    assert a == cel.Selector('device.driver == "x"')


def test_directly_built_selector_compiles_on_first_use() -> None:
    assert cel.Selector('device.driver == "x"').matches(T4, "x") is True
    with pytest.raises(CELCompileError):
        cel.Selector("device.").matches(T4, "x")


def test_compile_error_has_position() -> None:
    with pytest.raises(CELCompileError, match=r"<input>:1:8: Syntax error"):
        cel.compile_selector("device.")


def test_runtime_error_names_expression_and_device() -> None:
    selector = cel.compile_selector(f'device.attributes["{DRIVER}"].nosuch == 1')
    with pytest.raises(CELEvaluationError) as info:
        selector.matches(T4, DRIVER)
    message = str(info.value)
    assert "nosuch == 1" in message
    assert "'gpu-0'" in message
    assert 'no such key: "nosuch"' in message
    assert "has()" in message  # the hint


def test_long_expression_is_shortened_in_messages() -> None:
    expression = "[" + ",".join(["1"] * 200) + "].size() == 'x'"
    with pytest.raises(CELCompileError):
        cel.compile_selector(expression)
    assert cel.shorten(expression).endswith("...")
    assert len(cel.shorten(expression)) == 120


def test_cost_estimate_grows_with_nesting() -> None:
    big = "[" + ",".join(str(i) for i in range(50)) + "]"
    one = cel.compile_selector(f"{big}.all(a, a >= 0)").max_cost
    two = cel.compile_selector(f"{big}.all(a, {big}.all(b, a + b >= 0))").max_cost
    assert 50 <= one < 1000
    assert two > 40 * one
    assert two < cel.COST_LIMIT


def test_device_data_has_upstream_size_bounds() -> None:
    # 32 attributes x 64-element lists per comprehension level: three levels stay under the
    # limit, four nested ones over the domains cannot.
    d = f'device.attributes["{DRIVER}"]'
    three = f"{d}.all(a, {d}.all(b, {d}.all(c, true)))"
    four = f"{d}.all(a, {d}.all(b, {d}.all(c, {d}.all(e, true))))"
    assert cel.compile_selector(three).max_cost < cel.COST_LIMIT
    assert cel.compile_selector(four).max_cost > cel.COST_LIMIT


def test_literal_domains_are_collected() -> None:
    selector = cel.compile_selector(
        'device.attributes["a.io"].x == 1 || device.capacity["b.io"].y.sign() == 1 '
        '|| has(device.attributes["c.io"].z) || "d.io" == device.driver'
    )
    assert selector.domains == frozenset({"a.io", "b.io", "c.io"})


def test_computed_domain_is_a_documented_deviation() -> None:
    # Upstream would give an empty map; without a literal the engine cannot pad the input.
    selector = cel.compile_selector('device.attributes["x" + ".io"].size() == 0')
    with pytest.raises(CELEvaluationError, match="no such key"):
        selector.matches(T4, DRIVER)


def test_matches_does_not_mutate_the_device() -> None:
    before = T4.to_api()
    cel.compile_selector('device.attributes["x.io"].size() == 0').matches(T4, DRIVER)
    assert T4.to_api() == before


# --------------------------------------------------------------------------- MatchCache


def _id(device: str = "gpu-0") -> DeviceID:
    return DeviceID(DriverName(DRIVER), PoolName("node-a"), DeviceName(device))


def test_match_cache_caches_results() -> None:
    cache = MatchCache()
    selector = cel.compile_selector(f'device.attributes["{DRIVER}"].type == "gpu"')
    assert cache.matches(selector, _id(), 1, T4) is True
    assert (cache.hits, cache.misses) == (0, 1)
    assert cache.matches(selector, _id(), 1, T4) is True
    assert (cache.hits, cache.misses) == (1, 1)
    assert len(cache) == 1


def test_match_cache_keys_on_device_and_selector() -> None:
    cache = MatchCache()
    gpu = cel.compile_selector(f'device.attributes["{DRIVER}"].type == "gpu"')
    mig = cel.compile_selector(f'device.attributes["{DRIVER}"].type == "mig"')
    assert cache.matches(gpu, _id("gpu-0"), 1, T4) is True
    assert cache.matches(mig, _id("gpu-0"), 1, T4) is False
    other = Device(name="gpu-1", attributes={"type": "mig"})
    assert cache.matches(gpu, _id("gpu-1"), 1, other) is False
    assert cache.misses == 3
    assert len(cache) == 3


def test_match_cache_new_generation_reevaluates() -> None:
    cache = MatchCache()
    selector = cel.compile_selector(f'device.attributes["{DRIVER}"].type == "gpu"')
    assert cache.matches(selector, _id(), 1, T4) is True
    changed = Device(name="gpu-0", attributes={"type": "mig"})
    # Same generation: the cached answer stands (the slice did not change as far as we know).
    assert cache.matches(selector, _id(), 1, changed) is True
    assert cache.matches(selector, _id(), 2, changed) is False
    assert cache.misses == 2
    assert len(cache) == 1  # the old generation's entries are gone


def test_match_cache_caches_errors() -> None:
    cache = MatchCache()
    selector = cel.compile_selector(f'device.attributes["{DRIVER}"].nosuch == 1')
    for _ in range(2):
        with pytest.raises(CELEvaluationError, match="no such key"):
            cache.matches(selector, _id(), 1, T4)
    assert (cache.hits, cache.misses) == (1, 1)


def test_match_cache_caches_device_input_errors() -> None:
    cache = MatchCache()
    bad = Device(name="gpu-0", attributes={"driverVersion": Version("1.2")})
    first = cel.compile_selector("device.allowMultipleAllocations == false")
    second = cel.compile_selector('device.driver == "x"')
    for selector in (first, second, first):
        with pytest.raises(CELEvaluationError, match="semantic version") as info:
            cache.matches(selector, _id(), 1, bad)
        assert selector.expression in str(info.value)
        assert "'gpu-0'" in str(info.value)
    assert (cache.hits, cache.misses) == (1, 2)


def test_match_cache_shares_input_across_selectors_and_pads_domains() -> None:
    cache = MatchCache()
    first = cel.compile_selector('device.attributes["x.io"].size() == 0')
    second = cel.compile_selector(f'device.attributes["{DRIVER}"].index == 0')
    assert cache.matches(first, _id(), 1, T4) is True
    assert cache.matches(second, _id(), 1, T4) is True
    cache.clear()
    assert len(cache) == 0


def test_match_cache_discard_forgets_a_device() -> None:
    cache = MatchCache()
    selector = cel.compile_selector("device.allowMultipleAllocations")
    assert cache.matches(selector, _id("gpu-0"), 1, T4) is True
    assert cache.matches(selector, _id("gpu-1"), 1, T4) is True
    cache.discard(_id("gpu-0"))
    cache.discard(_id("never-seen"))
    assert len(cache) == 1
    assert cache.matches(selector, _id("gpu-0"), 1, T4) is True
    # gpu-1 and the re-added gpu-0 look the same to the selector: they share its verdict.
    assert (cache.hits, cache.misses) == (2, 1)
    assert len(cache) == 2


def test_match_cache_shares_a_verdict_between_devices_that_look_alike() -> None:
    cache = MatchCache()
    selector = cel.compile_selector(f'device.attributes["{DRIVER}"].type == "gpu"')
    twin = dataclasses.replace(T4, name="gpu-1", attributes={**T4.attributes, "uuid": "GPU-o"})
    assert cache.matches(selector, _id("gpu-0"), 1, T4) is True
    assert cache.matches(selector, _id("gpu-1"), 1, twin) is True  # uuid is not read
    assert (cache.hits, cache.misses) == (1, 1)
    other = dataclasses.replace(T4, name="gpu-2", attributes={**T4.attributes, "type": "mig"})
    assert cache.matches(selector, _id("gpu-2"), 1, other) is False
    assert cache.misses == 2
    # A selector that may read anything (a comprehension) is evaluated per device.
    wide = cel.compile_selector(f'device.attributes["{DRIVER}"].exists(k, k == "uuid")')
    assert cache.matches(wide, _id("gpu-0"), 1, T4) is True
    assert cache.matches(wide, _id("gpu-1"), 1, twin) is True
    assert cache.misses == 4
    # Two domain maps compared whole read every name in them: evaluated per device too.
    whole = cel.compile_selector(f'device.attributes["{DRIVER}"] == device.attributes["{DRIVER}"]')
    assert cache.matches(whole, _id("gpu-0"), 1, T4) is True
    assert cache.matches(whole, _id("gpu-1"), 1, twin) is True
    assert cache.misses == 6
    # Errors name their device: never shared.
    broken = cel.compile_selector(f'device.attributes["{DRIVER}"].nosuch == 1')
    for name, device in (("gpu-0", T4), ("gpu-1", twin)):
        with pytest.raises(CELEvaluationError, match=f"'{name}'"):
            cache.matches(broken, _id(name), 1, device)


# --------------------------------------------------------------------------- semver precedence

SEMVER_ORDER = (  # semver.org 2.0.0, section 11
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "2.0.0",
    "2.1.0",
    "2.1.1",
)


@pytest.mark.parametrize("index", range(len(SEMVER_ORDER) - 1))
def test_semver_precedence_follows_the_spec(index: int) -> None:
    lower, higher = SEMVER_ORDER[index], SEMVER_ORDER[index + 1]
    expression = (
        f'semver("{lower}").isLessThan(semver("{higher}")) && '
        f'semver("{higher}").isGreaterThan(semver("{lower}")) && '
        f'semver("{lower}").compareTo(semver("{higher}")) == -1'
    )
    assert cel.compile_selector(expression).matches(T4, DRIVER) is True
    assert celpy_engine.compile(expression).matches(T4, DRIVER) is True


@pytest.mark.parametrize(
    "text", ["1.2", "1.2.3.4", "01.2.3", "1.2.3-", "1.2.3-01", "1.2.3+", "v1.2.3", "1.2.3 "]
)
def test_strict_semver_rejects(text: str) -> None:
    selector = cel.compile_selector(f'isSemver("{text}")')
    assert selector.matches(T4, DRIVER) is False


# --------------------------------------------------------------------------- runtime bound


def _doubling(levels: int) -> str:
    return (
        "cel.bind(s0, 'xxxxxxxxxxxxxxxx', "
        + "".join(f"cel.bind(s{i}, s{i - 1} + s{i - 1}, " for i in range(1, levels + 1))
        + f"s{levels}.size() > 0"
        + ")" * (levels + 1)
    )


def test_growth_bomb_is_stopped_at_the_actual_cost_limit() -> None:
    # Upstream's estimate (16 x 2^28 characters concatenated) passes the limit, and its
    # evaluator stops at 1,000,000.
    selector = cel.compile_selector(_doubling(28))
    assert selector.max_cost > cel.COST_LIMIT
    assert selector.metered
    with pytest.raises(CELEvaluationError, match="operation cancelled: actual cost limit exceeded"):
        selector.matches(T4, DRIVER)


CHEAP_BUT_UNBOUNDED = (
    f'device.attributes["{DRIVER}"].productName.split("").join("-") == "T-e-s-l-a- -T-4"'
)


def test_metered_evaluation_accepts_what_stays_within_the_limit() -> None:
    # The joined elements have no static size bound (upstream's estimate saturates at 2^64),
    # but the actual cost is tiny: upstream runs it, and so does biaxial, metered.
    selector = cel.compile_selector(CHEAP_BUT_UNBOUNDED)
    assert selector.max_cost > 10**18
    assert selector.metered
    assert selector.matches(T4, DRIVER) is True


def test_a_deadline_cancels_a_metered_evaluation() -> None:
    from driver.cel import cost

    selector = cel.compile_selector(CHEAP_BUT_UNBOUNDED)
    assert selector.metered
    with (
        cost.limits(deadline=0.0),
        pytest.raises(DeadlineExceededError, match="evaluation deadline exceeded"),
    ):
        selector.matches(T4, DRIVER)


def test_a_deadline_stops_an_unmetered_evaluation_before_it_starts() -> None:
    # An expression within the cost limit is not metered, but a decision made of many of them
    # must still stop at its deadline (kube-scheduler's DRA filter timeout).
    from driver.cel import cost

    selector = cel.compile_selector(f'device.driver == "{DRIVER}"')
    assert not selector.metered
    with cost.limits(deadline=0.0), pytest.raises(DeadlineExceededError, match=DRIVER):
        selector.matches(T4, DRIVER)
    assert selector.matches(T4, DRIVER) is True  # outside the block: no deadline


LONG_BUT_ADMITTED = (
    f'lists.range(9999).exists(i, device.attributes["{DRIVER}"].productName'
    f".matches('.*Z.*[0-9]$'))"
)


def test_a_long_selector_is_stopped_by_a_deadline_that_passes_while_it_runs() -> None:
    # Within the cost limit (the API server admits it), but slow: a decision's deadline must
    # not wait for the evaluation to finish.
    import time

    from driver.cel import cost

    selector = cel.compile_selector(LONG_BUT_ADMITTED)
    assert selector.max_cost <= cel.COST_LIMIT
    assert not selector.metered  # no actual-cost limit to enforce
    assert selector.matches(T4, DRIVER) is False  # all 9,999 iterations: no "Z" in "Tesla T4"
    with (
        cost.limits(deadline=time.monotonic() + 0.02),
        pytest.raises(DeadlineExceededError),
    ):
        selector.matches(T4, DRIVER)


def test_a_deadline_is_not_an_evaluation_error_and_is_never_cached() -> None:
    from driver.cel import cost

    assert not issubclass(DeadlineExceededError, CELEvaluationError)
    cache = MatchCache()
    selector = cel.compile_selector(f'device.driver == "{DRIVER}"')
    device_id = DeviceID(DriverName(DRIVER), PoolName("node-a"), DeviceName(T4.name))
    with cost.limits(deadline=0.0), pytest.raises(DeadlineExceededError):
        cache.matches(selector, device_id, 1, T4)
    assert len(cache) == 0
    assert cache.matches(selector, device_id, 1, T4) is True


def test_a_cancelled_evaluation_is_not_hidden_by_or() -> None:
    selector = cel.compile_selector(f"{_doubling(26)} || true")
    with pytest.raises(CELEvaluationError, match="actual cost limit exceeded"):
        selector.matches(T4, DRIVER)


def test_typical_selector_is_not_metered() -> None:
    selector = cel.compile_selector(
        f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].productName'
        '.startsWith("Tesla") && device.capacity["gpu.biaxial.dev"].memory'
        '.compareTo(quantity("10Gi")) >= 0'
    )
    assert not selector.metered
    assert selector.max_cost < 100

"""The one retry policy (kubeapi.retry): which errors are retried, how long each waits, what
ends the loop; and the backoff the long-lived loops share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from driver.api.errors import ApiError, ConflictError, NotFoundError, ServerError
from kubeapi.retry import Backoff, Retry

RETRY = Retry(tries=4, backoff=Backoff(0.05, 0.15))


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every wait the policy asks for, in order (the wait itself is skipped)."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        recorded.append(round(delay, 6))
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return recorded


def failing(*errors: ApiError) -> tuple[Callable[[], Coroutine[Any, Any, str]], list[int]]:
    """A call that raises ``errors`` in turn, then answers "ok"; and its call count."""
    calls: list[int] = []

    async def call() -> str:
        calls.append(len(calls))
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return call, calls


def conflict() -> ConflictError:
    return ConflictError("stale", status=409)


def unavailable() -> ServerError:
    return ServerError("503", status=503)


def test_backoff_doubles_up_to_its_maximum_and_resets() -> None:
    backoff = Backoff(0.2, 1.0)
    assert [backoff.delay(n) for n in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert [backoff.next() for _ in range(3)] == [0.2, 0.4, 0.8]
    backoff.reset()
    assert backoff.next() == 0.2
    assert backoff.delay(10_000) == 1.0  # no overflow however long it failed


def test_jitter_draws_each_delay_from_the_upper_half_of_its_step() -> None:
    backoff = Backoff(1.0, 8.0, jitter=0.5)
    for n, full in enumerate([1.0, 2.0, 4.0, 8.0, 8.0]):
        drawn = {backoff.delay(n) for _ in range(50)}
        assert all(full / 2 <= d <= full for d in drawn)
        assert len(drawn) > 1


@pytest.mark.parametrize(
    ("initial", "maximum", "jitter"), [(0.0, 1.0, 0.0), (2.0, 1.0, 0.0), (1.0, 2.0, 1.5)]
)
def test_a_nonsensical_backoff_is_refused(initial: float, maximum: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="bad backoff"):
        Backoff(initial, maximum, jitter=jitter)
    with pytest.raises(ValueError, match="at least one try"):
        Retry(tries=0, backoff=Backoff(1.0, 1.0))


def test_conflicts_are_counted_and_retried_at_once_server_errors_after_the_backoff(
    waits: list[float],
) -> None:
    conflicts: list[str] = []
    call, calls = failing(unavailable(), conflict(), unavailable())

    async def step() -> str:
        async for attempt in RETRY.attempts(on_conflict=lambda: conflicts.append("x")):
            async with attempt:
                return await call()
        raise AssertionError("ran out")

    assert asyncio.run(step()) == "ok"
    assert len(calls) == 4
    assert conflicts == ["x"]
    assert waits == [0.05, 0.15]  # after try 0 and try 2 (0.2 capped); none after the 409


def test_a_conflict_is_not_retried_unless_the_step_counts_it(waits: list[float]) -> None:
    call, calls = failing(conflict())
    with pytest.raises(ConflictError):
        asyncio.run(RETRY.call(call))
    assert (len(calls), waits) == (1, [])


@pytest.mark.parametrize("error", [NotFoundError("gone", status=404), ApiError("no", status=422)])
def test_other_errors_end_the_step_at_once(error: ApiError, waits: list[float]) -> None:
    call, calls = failing(error)

    async def step() -> str:
        async for attempt in RETRY.attempts(on_conflict=lambda: None):
            async with attempt:
                return await call()
        raise AssertionError("ran out")

    with pytest.raises(type(error)):
        asyncio.run(step())
    assert (len(calls), waits) == (1, [])


def test_out_of_tries_the_last_error_is_raised_or_the_loop_ends(waits: list[float]) -> None:
    call, calls = failing(*[unavailable()] * 10)
    with pytest.raises(ServerError):
        asyncio.run(RETRY.call(call))
    assert len(calls) == 4
    assert waits == [0.05, 0.1, 0.15]  # no wait before raising

    waits.clear()
    call, calls = failing(*[conflict()] * 3, unavailable())
    after_failures: list[int] = []

    async def step() -> str:
        async for attempt in RETRY.attempts(on_conflict=lambda: None):
            async with attempt:
                return await call()
            after_failures.append(attempt.number)  # e.g. read again
        return "gave up"

    assert asyncio.run(step()) == "gave up"
    assert len(calls) == 4
    assert after_failures == [0, 1, 2, 3]
    assert waits == [0.15]  # the server error of the last try still waits


def test_a_successful_body_ends_the_loop_and_a_skipped_try_is_spent_without_a_wait(
    waits: list[float],
) -> None:
    seen: list[int] = []

    async def step() -> None:
        async for attempt in RETRY.attempts(on_conflict=lambda: None):
            seen.append(attempt.number)
            if attempt.number == 0:
                continue  # e.g. another write first, then decide again
            async with attempt:
                pass  # succeeded without returning

    asyncio.run(step())
    assert seen == [0, 1]
    assert waits == []

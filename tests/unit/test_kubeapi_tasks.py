"""The one task guard of the long-running programs (kubeapi.tasks): services trip it when they
end, jobs only log; stop cancels newest first; until() races work against stop and a trip."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from kubeapi.tasks import TaskGuard, wait_at_most

LOGGER = "biaxial.kubeapi.tasks"


async def forever() -> None:
    await asyncio.Event().wait()


def test_a_service_that_ends_or_crashes_trips_the_guard_and_keeps_the_first_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: list[tuple[str, str]] = []

    async def scenario() -> TaskGuard:
        both = asyncio.Event()

        def failed(name: str, reason: str) -> None:
            failures.append((name, reason))
            if len(failures) == 2:
                both.set()

        guard = TaskGuard(on_failure=failed)

        async def returns() -> None:
            return None

        async def crashes() -> None:
            await asyncio.sleep(0)
            raise ValueError("bad watch")

        guard.start("informer", returns())
        guard.start("scheduler", crashes())
        guard.start("healthy", forever())
        await asyncio.wait_for(both.wait(), 1)
        assert guard.tripped.is_set()
        await guard.stop(1)
        return guard

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        guard = asyncio.run(scenario())
    assert failures == [
        ("informer", "ended unexpectedly"),
        ("scheduler", "crashed: ValueError: bad watch"),
    ]
    assert guard.reason == "task informer: ended unexpectedly"
    assert "background task informer ended unexpectedly" in caplog.text
    assert "background task scheduler crashed" in caplog.text
    assert "bad watch" in caplog.text  # with its traceback


def test_a_failed_job_is_logged_without_tripping_and_drain_waits_for_jobs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    finished: list[str] = []

    async def scenario() -> TaskGuard:
        guard = TaskGuard()
        release = asyncio.Event()

        async def write(name: str) -> None:
            await release.wait()
            finished.append(name)

        async def broken() -> None:
            raise RuntimeError("event write failed")

        guard.spawn(write("a"))
        failing = guard.spawn(broken(), name="event")
        assert guard.jobs_in_flight == 2
        await asyncio.wait({failing})
        assert guard.jobs_in_flight == 1  # the broken one ended
        assert not await guard.drain(0.01)  # "a" is still waiting
        release.set()
        assert await guard.drain(1)
        assert guard.jobs_in_flight == 0
        return guard

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        guard = asyncio.run(scenario())
    assert finished == ["a"]
    assert not guard.tripped.is_set()
    assert "task event failed" in caplog.text
    assert "event write failed" in caplog.text


def test_stop_cancels_newest_first_awaiting_each_and_reports_what_happens_while_stopping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped: list[str] = []

    async def scenario() -> TaskGuard:
        guard = TaskGuard(on_failure=lambda name, reason: stopped.append(f"crash {name}"))

        async def service(name: str, *, fail: bool = False, linger: bool = False) -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if linger:  # ignores the first cancellation for a while
                    await asyncio.sleep(0.5)
                raise
            finally:
                stopped.append(name)
                if fail:
                    raise RuntimeError(f"{name} cleanup failed")

        guard.start("first", service("first"))
        guard.start("slow", service("slow", linger=True))
        guard.spawn(service("job"), name="job")
        guard.start("failing", service("failing", fail=True))
        await asyncio.sleep(0)
        await guard.stop(0.1)
        await asyncio.sleep(0.6)  # let the lingering one end
        return guard

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        guard = asyncio.run(scenario())
    assert stopped[:3] == ["failing", "job", "first"]
    assert stopped[3:] == ["slow"]  # it went on past its timeout, and stop did not wait
    assert not guard.tripped.is_set()  # stopping is not a crash
    assert "task failing failed while stopping" in caplog.text
    assert "task slow did not stop within 0.1 s" in caplog.text


def test_until_returns_whether_the_work_finished_before_a_stop_or_a_trip() -> None:
    async def scenario() -> list[bool]:
        guard = TaskGuard()
        stop = asyncio.Event()
        results = [await guard.until(stop, asyncio.sleep(0))]

        async def failing() -> None:
            raise RuntimeError("boom")

        broken = TaskGuard()  # failing work trips its guard: use another one for it
        results.append(await broken.until(stop, failing()))
        assert broken.tripped.is_set()
        assert "crashed: RuntimeError: boom" in broken.reason
        asyncio.get_running_loop().call_soon(stop.set)
        results.append(await guard.until(stop, forever()))
        stop.clear()

        async def ends() -> None:
            return None

        guard.start("service", ends())
        results.append(await guard.until(stop, forever()))
        results.append(await guard.until(stop))  # tripped already: returns at once
        return results

    assert asyncio.run(scenario()) == [True, False, False, False, False]


def test_a_service_whose_helper_task_fails_is_reported_by_the_helper_error() -> None:
    """A service may run helpers in a TaskGroup (the deallocator's resync): the failure of one
    ends the service, and the reason names the helper's error, not the group."""
    failures: list[str] = []

    async def scenario() -> TaskGuard:
        guard = TaskGuard(on_failure=lambda _name, reason: failures.append(reason))

        async def helper() -> None:
            await asyncio.sleep(0)
            raise KeyError("claim")

        async def service() -> None:
            async with asyncio.TaskGroup() as group:
                group.create_task(helper())
                await forever()

        guard.start("deallocator", service())
        await asyncio.wait_for(guard.tripped.wait(), 1)
        return guard

    guard = asyncio.run(scenario())
    assert failures == ["crashed: KeyError: 'claim'"]
    assert guard.reason == "task deallocator: crashed: KeyError: 'claim'"


# --------------------------------------------------------------------------- wait_at_most


def _loop_until_cancelled(wait: Callable[[asyncio.Event], Awaitable[object]]) -> bool:
    """A service loop around a bounded wait; the event fires in the same loop step as the
    cancellation (as a shutdown racing a wake-up does). Whether the loop stopped."""

    async def scenario() -> bool:
        event = asyncio.Event()

        async def service() -> None:
            while True:
                await wait(event)
                event.clear()

        task = asyncio.create_task(service())
        await asyncio.sleep(0)  # the service waits now
        event.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1.0)
        if not done:
            task.cancel()  # once more, to end the demonstration
            await asyncio.gather(task, return_exceptions=True)
        return bool(done) and task.cancelled()

    return asyncio.run(scenario())


def test_a_bounded_wait_never_loses_the_cancellation_of_its_caller() -> None:
    # asyncio.wait_for on Python 3.11 returns the inner result when the inner task finished
    # in the same step as the caller's cancellation (CPython gh-86296): the service loop
    # above then never stops. wait_at_most runs under asyncio.timeout in the caller's task.
    assert _loop_until_cancelled(lambda event: wait_at_most(event.wait(), 10.0))


def test_a_bounded_wait_says_whether_it_finished_or_timed_out() -> None:
    async def scenario() -> tuple[bool, bool]:
        event = asyncio.Event()
        event.set()
        finished = await wait_at_most(event.wait(), 1.0)
        timed_out = await wait_at_most(asyncio.Event().wait(), 0.01)
        return finished, timed_out

    assert asyncio.run(scenario()) == (True, False)

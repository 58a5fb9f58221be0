"""kubeapi.deadlines: asyncio.timeout's contract for many waits on one timer."""

from __future__ import annotations

import asyncio

import pytest

from kubeapi.deadlines import Deadlines


def test_a_wait_past_its_deadline_raises_timeout_error_and_the_task_goes_on() -> None:
    async def scenario() -> None:
        deadlines = Deadlines(0.05)
        never = asyncio.Event()
        with pytest.raises(TimeoutError) as info, deadlines.within():
            await never.wait()
        assert isinstance(info.value.__cause__, asyncio.CancelledError)
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0  # the cancellation was taken back
        await asyncio.sleep(0)  # and nothing is left pending for the task
        assert deadlines.waiting == 0

    asyncio.run(scenario())


def test_a_wait_that_ended_in_time_is_never_cancelled_later() -> None:
    async def scenario() -> None:
        deadlines = Deadlines(0.05)
        with deadlines.within():
            pass  # ends before the loop runs its timer
        await asyncio.sleep(0.2)  # its deadline passes meanwhile: no cancellation

    asyncio.run(scenario())


def test_each_overdue_wait_times_out_and_the_others_go_on() -> None:
    async def scenario() -> None:
        deadlines = Deadlines(0.1)
        release = asyncio.Event()
        never = asyncio.Event()

        async def quick() -> str:
            with deadlines.within():
                await release.wait()
            return "done"

        async def stuck() -> str:
            with deadlines.within():
                await never.wait()
            return "not reached"

        tasks = [asyncio.create_task(f()) for f in (stuck, quick, stuck, quick)]
        await asyncio.sleep(0)
        assert deadlines.waiting == 4
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["TimeoutError", "str", "TimeoutError", "str"]
        assert deadlines.waiting == 0
        # The timer is armed again for waits that begin later.
        with pytest.raises(TimeoutError):
            await stuck()

    asyncio.run(scenario())


def test_a_cancellation_from_elsewhere_passes_through_unchanged() -> None:
    async def scenario() -> None:
        deadlines = Deadlines(30.0)
        entered = asyncio.Event()

        async def waiter() -> None:
            with deadlines.within():
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(waiter())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert deadlines.waiting == 0

    asyncio.run(scenario())


def test_outside_a_task_or_without_a_positive_timeout_it_refuses() -> None:
    with pytest.raises(ValueError, match="positive"):
        Deadlines(0)
    with pytest.raises(RuntimeError), Deadlines(1.0).within():  # no loop, no task
        pass

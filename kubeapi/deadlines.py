"""One timeout for many waits, on one timer: ``asyncio.timeout`` without a timer per wait.

Decision: every API request the controller sends is bounded by the client's request timeout,
and ``asyncio.timeout`` schedules (and cancels) a timer for each one: a handle built, pushed
on the loop's timer heap and compared there in Python (``TimerHandle.__lt__``), about 10 us a
request, a twentieth of the CPU a request costs. All of a client's requests share one
duration, so their deadlines expire in the order the requests began: :class:`Deadlines`
keeps them in a queue and arms a single loop timer for the oldest one still running; when it
fires, every wait past its deadline is cancelled and the timer is set again for the next.
A wait that ends in time only marks its entry done (entries leave the queue from its front).

Contract (:meth:`Deadlines.within`, a ``with`` block inside a task): as ``asyncio.timeout``
with ``timeout_s`` -- when the block runs past its deadline, the task is cancelled and the
block raises :class:`TimeoutError` (chained to the ``CancelledError``); a cancellation from
anyone else passes through unchanged. The deadline is measured on the loop's clock from the
block's start. A :class:`Deadlines` belongs to the loop it is first used on while it has
waits in flight.
"""

from __future__ import annotations

import asyncio
import collections
from types import TracebackType
from typing import Final


class _Wait:
    """One block's deadline (a context manager: see :meth:`Deadlines.within`)."""

    __slots__ = ("_owner", "cancelling", "done", "expired", "task", "when")

    def __init__(self, owner: Deadlines) -> None:
        self._owner = owner
        self.task: asyncio.Task[object] | None = None
        self.when = 0.0
        self.cancelling = 0
        self.done = False
        self.expired = False

    def __enter__(self) -> None:
        self._owner._enter(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        task, self.task = self.task, None  # a finished wait keeps no task alive
        self.done = True
        # As asyncio.timeout: the cancellation this deadline asked for is taken back, and
        # when it is the one the block ended with, the block raises TimeoutError instead.
        if (
            self.expired
            and task is not None
            and task.uncancel() <= self.cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc


class Deadlines:
    """Waits of ``timeout_s`` each, on one timer (see the module docstring)."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout must be positive, not {timeout_s}")
        self.timeout_s: Final = timeout_s
        self._waits: collections.deque[_Wait] = collections.deque()  # by deadline
        self._timer: asyncio.TimerHandle | None = None

    def within(self) -> _Wait:
        """A ``with`` block that raises ``TimeoutError`` past ``timeout_s`` (module docstring)."""
        return _Wait(self)

    @property
    def waiting(self) -> int:
        """Blocks running now (for tests)."""
        return sum(1 for w in self._waits if not w.done)

    def _enter(self, wait: _Wait) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.within() must be used inside a task")
        loop = task.get_loop()
        wait.task = task
        wait.cancelling = task.cancelling()
        wait.when = loop.time() + self.timeout_s
        waits = self._waits
        while waits and waits[0].done:
            waits.popleft()
        waits.append(wait)
        if self._timer is None:
            self._timer = loop.call_at(wait.when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        waits = self._waits
        if not waits:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        while waits and (waits[0].done or waits[0].when <= now):
            wait = waits.popleft()
            if not wait.done and wait.task is not None:
                wait.expired = True
                wait.task.cancel()
        if waits:
            self._timer = loop.call_at(waits[0].when, self._fire)

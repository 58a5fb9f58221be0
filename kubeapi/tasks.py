"""The one guard for the background tasks of a long-running process (the kubelet plugin, the
controller); every task either program starts goes through a :class:`TaskGuard`.

Two kinds of task:

* **services** (:meth:`TaskGuard.start`) run until they are cancelled: informers, the
  scheduler and deallocator loops, leader renewal, the slice publisher, health, registration.
  One that crashes, or returns (a service never should), is logged with its traceback,
  reported to ``on_failure(name, reason)`` (metrics, the health endpoint) and **trips** the
  guard: :attr:`TaskGuard.tripped` is set and :attr:`TaskGuard.reason` keeps the first
  failure, so the process stops and exits non-zero (its Deployment or DaemonSet restarts it).
* **jobs** (:meth:`TaskGuard.spawn`) do one piece of work each (a placement write, an event).
  Ending is normal; a job that raises is logged with its traceback and does not trip the
  guard, so one pod's failure does not stop the others. :meth:`TaskGuard.drain` waits for the
  jobs in flight.

:meth:`TaskGuard.stop` cancels the tasks still running in reverse start order (the last started
stops first: the kubelet registration before the services it announces), awaiting each before
the next, for at most ``timeout_s`` each; a task that fails while stopping is logged and is not
a crash. :meth:`TaskGuard.until` awaits some work unless a stop is asked for or the guard trips
first. A guard belongs to the loop it was first used on.

:func:`wait_at_most` is the bounded wait every loop uses (never ``asyncio.wait_for``, which
on Python 3.11 can lose a cancellation).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(f"biaxial.{__name__}")

#: ``on_failure(task name, reason)``: called for every service that crashed or ended.
FailureHook = Callable[[str, str], None]


class TaskGuard:
    """Starts, watches and stops a process's background tasks (see the module docstring)."""

    def __init__(self, on_failure: FailureHook | None = None) -> None:
        self._on_failure = on_failure
        # Running tasks in start order; the value says whether it is a service. Done tasks
        # leave at once, so the jobs of a long-lived guard do not pile up.
        self._running: dict[asyncio.Task[None], bool] = {}
        self.tripped = asyncio.Event()
        self.reason = ""

    # ------------------------------------------------------------------ starting

    def start(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a service: it runs until cancelled; its end trips the guard."""
        return self._create(name, coro, service=True)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str | None = None) -> asyncio.Task[None]:
        """Start a job: its end is normal; an exception is logged (see the module docstring)."""
        label = name if name is not None else str(getattr(coro, "__qualname__", "job"))
        return self._create(label, coro, service=False)

    def _create(
        self, name: str, coro: Coroutine[Any, Any, None], *, service: bool
    ) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._running[task] = service
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        service = self._running.pop(task, False)
        if task.cancelled():
            return
        exc = task.exception()
        name = task.get_name()
        if not service:
            if exc is not None:
                log.error("task %s failed", name, exc_info=exc)
            return
        if exc is None:
            log.error("background task %s ended unexpectedly", name)
            reason = "ended unexpectedly"
        else:
            log.error("background task %s crashed", name, exc_info=exc)
            cause = _cause(exc)
            reason = f"crashed: {type(cause).__name__}: {cause}"
        self.reason = self.reason or f"task {name}: {reason}"
        if self._on_failure is not None:
            self._on_failure(name, reason)
        self.tripped.set()

    # ------------------------------------------------------------------ waiting

    @property
    def jobs_in_flight(self) -> int:
        """How many jobs are still running."""
        return sum(not service for service in self._running.values())

    async def drain(self, timeout_s: float | None = None) -> bool:
        """Wait for the jobs in flight (and those they start); True when none is left within
        ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while jobs := [t for t, service in self._running.items() if not service]:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            await asyncio.wait(jobs, timeout=remaining)
        return True

    async def until(self, stop: asyncio.Event, work: Awaitable[Any] | None = None) -> bool:
        """Await ``work`` (without work: wait) unless ``stop`` is set or the guard trips first;
        True when the work finished without an error. Unfinished work is cancelled; work that
        raised is logged and trips the guard, as a crashed service does (the process exits
        non-zero, never silently)."""
        label = str(getattr(work, "__qualname__", "work"))
        pending = asyncio.ensure_future(work if work is not None else asyncio.Event().wait())
        stopped = asyncio.ensure_future(stop.wait())
        tripped = asyncio.ensure_future(self.tripped.wait())
        try:
            await asyncio.wait({pending, stopped, tripped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (pending, stopped, tripped):
                fut.cancel()
            await asyncio.gather(pending, stopped, tripped, return_exceptions=True)
        if pending.cancelled():
            return False
        if (exc := pending.exception()) is not None:
            log.error("%s failed", label, exc_info=exc)
            cause = _cause(exc)
            self.reason = self.reason or f"{label}: crashed: {type(cause).__name__}: {cause}"
            if self._on_failure is not None:
                self._on_failure(label, f"crashed: {type(cause).__name__}: {cause}")
            self.tripped.set()
            return False
        return True

    # ------------------------------------------------------------------ stopping

    async def stop(self, timeout_s: float | None = None) -> None:
        """Cancel every running task, newest first, each awaited (up to ``timeout_s``) before
        the next; what happens to a task while it stops is logged, never a crash."""
        for task in reversed(list(self._running)):
            if task.done():
                continue  # ended on its own: _ended reports it
            self._running.pop(task, None)
            task.remove_done_callback(self._ended)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
            if not done:
                log.warning("task %s did not stop within %.1f s", task.get_name(), timeout_s)
            elif not task.cancelled() and task.exception() is not None:
                log.error(
                    "task %s failed while stopping", task.get_name(), exc_info=task.exception()
                )


def _cause(exc: BaseException) -> BaseException:
    """The error a task group wrapped alone (a service's own helper task failed), else
    ``exc``: the reason then names what actually went wrong."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def wait_at_most(awaitable: Awaitable[object], timeout_s: float) -> bool:
    """Await ``awaitable`` for at most ``timeout_s``: True when it finished, False when the
    time ran out. It runs in the caller's task under :func:`asyncio.timeout`. On Python 3.11
    ``asyncio.wait_for`` runs it as a task of its own and, when that task finishes at the
    moment the caller is cancelled, returns its result and loses the cancellation
    (CPython gh-86296, fixed in 3.12): a loop around it then never stops, and a shutdown or a
    caller's own timeout waits forever."""
    try:
        async with asyncio.timeout(timeout_s):
            await awaitable
    except TimeoutError:
        return False
    return True

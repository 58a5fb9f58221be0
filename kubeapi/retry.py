"""How the long-running components retry API calls: one backoff, one retry loop for a step.

:class:`Backoff` is the one exponential backoff: ``initial_s * 2**n`` seconds, at most
``maximum_s``, with optional jitter (each delay drawn uniformly from
``[(1 - jitter) * d, d]``, so writers that failed together do not come back together). The
long-lived loops (the slice publisher, the controller's informers) wait with it between failed
rounds: :meth:`Backoff.next` after a failure, :meth:`Backoff.reset` after a success.

:class:`Retry` is the policy for one step that writes with optimistic concurrency (the
controller's claim-status loops in :mod:`controller.commit`):

* at most ``tries`` tries;
* a **409 Conflict** means the object changed since it was read: the step counts it
  (``on_conflict``) and tries again at once, on a fresh read. A step that passes no
  ``on_conflict`` does not retry a 409: it is the step's to handle;
* a **5xx or transport failure** (:class:`~driver.api.errors.ServerError`) may or may not have
  been applied: the step tries again after ``backoff.delay(try)``, re-reading first where that
  matters;
* any other error (404, 410, other 4xx, the step's own abort) ends the step at once;
* when the tries run out, the last error is raised (``reraise=True``) or the loop simply ends
  and the code after it says what that means (abort, or go on).

Use::

    async for attempt in RETRY.attempts(on_conflict=count):
        ...                      # read, check, decide: nothing here is retried
        async with attempt:      # the call; a retryable error is swallowed (after the wait)
            return await api.replace(...)
        ...                      # only after a swallowed error: read again, ...
    raise Aborted(...)           # every try failed

An attempt whose body ends without an error ends the loop; an attempt the body skips
(``continue`` before ``async with``) is spent without a wait. :meth:`Retry.call` is the loop for
a single call.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from driver.api.errors import ConflictError, ServerError

T = TypeVar("T")


class Backoff:
    """Exponential backoff with optional jitter (see the module docstring)."""

    def __init__(self, initial_s: float, maximum_s: float, *, jitter: float = 0.0) -> None:
        if not 0 < initial_s <= maximum_s or not 0 <= jitter <= 1:
            raise ValueError(f"bad backoff {initial_s}..{maximum_s} s, jitter {jitter}")
        self.initial_s = initial_s
        self.maximum_s = maximum_s
        self.jitter = jitter
        self._failures = 0

    def delay(self, n: int) -> float:
        """The wait after the ``n``-th failure in a row (0-based)."""
        full = min(self.maximum_s, self.initial_s * 2.0 ** min(n, 64))
        if not self.jitter:
            return full
        return random.uniform(full * (1 - self.jitter), full)  # noqa: S311 - jitter, not crypto

    def next(self) -> float:
        """The wait after one more failure in a row."""
        delay = self.delay(self._failures)
        self._failures += 1
        return delay

    def reset(self) -> None:
        """A success: the next failure waits ``initial_s`` again."""
        self._failures = 0


@dataclass(frozen=True, slots=True)
class Retry:
    """At most ``tries`` tries of one step, waiting ``backoff`` after a server error."""

    tries: int
    backoff: Backoff

    def __post_init__(self) -> None:
        if self.tries < 1:
            raise ValueError(f"a step needs at least one try, got {self.tries}")

    def attempts(
        self, *, on_conflict: Callable[[], None] | None = None, reraise: bool = False
    ) -> Attempts:
        """The tries of one step (see the module docstring)."""
        return Attempts(self, on_conflict, reraise=reraise)

    async def call(
        self, fn: Callable[[], Awaitable[T]], *, on_conflict: Callable[[], None] | None = None
    ) -> T:
        """``await fn()`` until it succeeds; when every try failed, the last error is raised."""
        async for attempt in self.attempts(on_conflict=on_conflict, reraise=True):
            async with attempt:
                return await fn()
        raise AssertionError("unreachable: the last try re-raises")  # pragma: no cover


class Attempts:
    """The async iterator of one step's tries (:meth:`Retry.attempts`)."""

    __slots__ = ("_finished", "_next", "_on_conflict", "_reraise", "_retry")

    def __init__(
        self, retry: Retry, on_conflict: Callable[[], None] | None, *, reraise: bool
    ) -> None:
        self._retry = retry
        self._on_conflict = on_conflict
        self._reraise = reraise
        self._next = 0
        self._finished = False

    def __aiter__(self) -> Attempts:
        return self

    async def __anext__(self) -> Attempt:
        if self._finished or self._next >= self._retry.tries:
            raise StopAsyncIteration
        attempt = Attempt(self, self._next)
        self._next += 1
        return attempt

    async def _ended(self, attempt: Attempt, exc: BaseException | None) -> bool:
        """Whether the error ``exc`` that ended ``attempt`` is swallowed (retried)."""
        if exc is None:
            self._finished = True
            return False
        if isinstance(exc, ConflictError) and self._on_conflict is not None:
            self._on_conflict()
            wait = False
        elif isinstance(exc, ServerError):
            wait = True
        else:
            return False
        if self._reraise and attempt.number == self._retry.tries - 1:
            return False
        if wait:
            await asyncio.sleep(self._retry.backoff.delay(attempt.number))
        return True


class Attempt:
    """One try: ``async with attempt:`` around the call (see the module docstring)."""

    __slots__ = ("_owner", "number")

    def __init__(self, owner: Attempts, number: int) -> None:
        self._owner = owner
        self.number = number  # 0-based

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return await self._owner._ended(self, exc)

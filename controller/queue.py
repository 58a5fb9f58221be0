"""The scheduling queue: which pod to try next, and when to try a failed one again.

Modelled on kube-scheduler's queue with its default ``PrioritySort`` order:

* ``active``: pods ready to be tried, each at most once, the highest ``spec.priority`` first
  and, among equal priorities, the one that became ready first (PrioritySort's ``Less``:
  priority, then the time the pod entered the active queue);
* ``backoff``: pods that failed, waiting ``initial * 2**(attempts-1)`` seconds (capped);
* ``unschedulable``: pods that did not fit; they stay parked until a relevant cluster change
  (:meth:`SchedulingQueue.move_all`: a claim freed, a slice or node changed) or until they have
  waited ``flush_s``; then they go through backoff as usual.

A pod handed out by :meth:`pop` is *processing* until :meth:`done`; adding it meanwhile marks it
dirty, and it is re-queued after ``done``. A move request that arrives while a pod is being tried
sends that pod to backoff instead of parking it, so a change that happened during its attempt
is never missed. Every key is in at most one of the three sets. Single-threaded (asyncio) use.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass


class Outcome(enum.Enum):
    SCHEDULED = "scheduled"
    UNSCHEDULABLE = "unschedulable"
    ERROR = "error"
    FORGET = "forget"


@dataclass(slots=True)
class _Entry:
    attempts: int = 0
    ready_at: float = 0.0
    parked_at: float = 0.0
    priority: int = 0


class SchedulingQueue:
    """See the module docstring."""

    def __init__(
        self,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 10.0,
        flush_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._initial = backoff_initial_s
        self._max = backoff_max_s
        self._flush = flush_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._active: set[str] = set()
        # (-priority, arrival, key): the next pod to try on top; stale items (a key popped,
        # forgotten or re-activated since) are skipped when they surface.
        self._active_heap: list[tuple[int, int, str]] = []
        self._arrivals = 0
        self._active_seq: dict[str, int] = {}
        self._backoff: set[str] = set()
        self._unschedulable: set[str] = set()
        # (time, key) heaps over the two sets; stale items are skipped when popped, so due
        # pods are found in O(log n) however many pods wait.
        self._backoff_heap: list[tuple[float, str]] = []
        self._parked_heap: list[tuple[float, str]] = []
        self._processing: dict[str, int] = {}  # key -> move sequence at pop
        self._dirty: set[str] = set()
        self._move_seq = 0
        self._wakeup = asyncio.Event()
        self._closed = False

    # ------------------------------------------------------------------ introspection

    def __len__(self) -> int:
        return len(self._active) + len(self._backoff) + len(self._unschedulable)

    @property
    def depths(self) -> dict[str, int]:
        return {
            "active": len(self._active),
            "backoff": len(self._backoff),
            "unschedulable": len(self._unschedulable),
        }

    def attempts(self, key: str) -> int:
        entry = self._entries.get(key)
        return entry.attempts if entry else 0

    def backoff_s(self, attempts: int) -> float:
        if attempts <= 0:
            return 0.0
        return float(min(self._max, self._initial * 2.0 ** min(attempts - 1, 30)))

    def is_queued(self, key: str) -> bool:
        return key in self._active or key in self._backoff or key in self._unschedulable

    # ------------------------------------------------------------------ producers

    def _activate(self, key: str, entry: _Entry) -> None:
        self._arrivals += 1
        self._active.add(key)
        self._active_seq[key] = self._arrivals
        heapq.heappush(self._active_heap, (-entry.priority, self._arrivals, key))

    def add(self, key: str, priority: int = 0) -> None:
        """A new or changed pod: try it (respecting a running backoff). ``priority`` is its
        ``spec.priority`` (the API server's admission resolved it from its class)."""
        entry = self._entries.get(key)
        if entry is not None and entry.priority != priority:
            entry.priority = priority
            if key in self._active:
                self._activate(key, entry)  # its older heap item is now stale
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._active or key in self._backoff:
            return
        entry = self._entries.setdefault(key, _Entry(priority=priority))
        self._unschedulable.discard(key)
        if entry.ready_at > self._clock():
            self._to_backoff(key, entry)
        else:
            self._activate(key, entry)
        self._wakeup.set()

    def _to_backoff(self, key: str, entry: _Entry) -> None:
        self._backoff.add(key)
        heapq.heappush(self._backoff_heap, (entry.ready_at, key))

    def _park(self, key: str, entry: _Entry) -> None:
        self._unschedulable.add(key)
        heapq.heappush(self._parked_heap, (entry.parked_at + self._flush, key))

    def move_all(self) -> None:
        """A relevant cluster change: parked pods become eligible (after their backoff)."""
        self._move_seq += 1
        for key in list(self._unschedulable):
            self._unschedulable.discard(key)
            self._to_backoff(key, self._entries[key])
        self._parked_heap.clear()
        self._wakeup.set()

    def forget(self, key: str) -> None:
        """The pod is gone or no longer ours: drop every trace of it."""
        self._active.discard(key)
        self._active_seq.pop(key, None)
        self._backoff.discard(key)
        self._unschedulable.discard(key)
        self._dirty.discard(key)
        if key not in self._processing:
            self._entries.pop(key, None)

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()

    # ------------------------------------------------------------------ consumer

    def _promote(self, now: float) -> float | None:
        """Move due pods to active; return the next deadline (or None)."""
        parked = self._parked_heap
        while parked and parked[0][0] <= now:
            _, key = heapq.heappop(parked)
            entry = self._entries.get(key)
            if key not in self._unschedulable or entry is None:
                continue  # stale: moved or forgotten meanwhile
            if entry.parked_at + self._flush > now:
                continue  # stale: parked again later (its newer item is in the heap)
            self._unschedulable.discard(key)
            self._to_backoff(key, entry)
        waiting = self._backoff_heap
        while waiting and waiting[0][0] <= now:
            _, key = heapq.heappop(waiting)
            entry = self._entries.get(key)
            if key not in self._backoff or entry is None or entry.ready_at > now:
                continue  # stale
            self._backoff.discard(key)
            self._activate(key, entry)
        heads = [h[0][0] for h in (parked, waiting) if h]
        return min(heads) if heads else None

    def pop_nowait(self) -> str | None:
        """The next ready pod, or None (used by tests and by :meth:`pop`)."""
        self._promote(self._clock())
        heap = self._active_heap
        while heap:
            _, seq, key = heapq.heappop(heap)
            if key in self._active and self._active_seq.get(key) == seq:
                break
        else:
            return None
        self._active.discard(key)
        del self._active_seq[key]
        self._processing[key] = self._move_seq
        return key

    async def pop(self) -> str:
        """Wait for the next ready pod. Raises CancelledError-free ``EOFError`` once closed."""
        while True:
            if self._closed:
                raise EOFError("scheduling queue closed")
            key = self.pop_nowait()
            if key is not None:
                return key
            deadline = self._promote(self._clock())
            timeout = None if deadline is None else max(0.0, deadline - self._clock())
            self._wakeup.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that races with the event being set, and the loop would never end.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()

    def done(self, key: str, outcome: Outcome) -> None:
        """Report the result of trying ``key`` (obtained from :meth:`pop`)."""
        popped_seq = self._processing.pop(key, None)
        dirty = key in self._dirty
        self._dirty.discard(key)
        if outcome in (Outcome.SCHEDULED, Outcome.FORGET):
            self._entries.pop(key, None)
            return
        now = self._clock()
        entry = self._entries.setdefault(key, _Entry())
        entry.attempts += 1
        entry.ready_at = now + self.backoff_s(entry.attempts)
        moved = popped_seq is not None and popped_seq != self._move_seq
        if outcome is Outcome.UNSCHEDULABLE and not dirty and not moved:
            entry.parked_at = now
            self._park(key, entry)
        else:
            self._to_backoff(key, entry)
        self._wakeup.set()

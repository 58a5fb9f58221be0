"""The scheduling queue: which pod to try next, and when to try a failed one again.

Modelled on kube-scheduler's queue:

* ``active``: pods ready to be tried, each at most once, in kube-scheduler's default
  ``PrioritySort`` order: the highest ``spec.priority`` first (given with :meth:`add`, else
  read from a function given to the queue; neither: all equal) and, among equal priorities,
  the one queued first (PrioritySort's ``Less``: priority, then the pod's queue timestamp —
  when it was added, refreshed when an attempt fails, as kube-scheduler's
  ``QueuedPodInfo.Timestamp``; so a pod that failed and comes back from backoff or a hint goes
  before the pods that arrived after its failure, instead of behind them);
* ``backoff``: pods that failed, waiting ``initial * 2**(attempts-1)`` seconds (capped);
* ``unschedulable``: pods that did not fit, *parked* with a :class:`Hint` that says which
  cluster changes may help them (kube-scheduler's queueing hints). A change is reported as a
  :class:`ClusterEvent` (:meth:`SchedulingQueue.move`); only the parked pods whose hint it
  matches leave, the others stay. Every parked pod leaves after ``flush_s`` regardless (a
  missed hint costs a delay, never a pod). Leaving goes through backoff as usual; a pod that
  was parked *waiting* (not tried: a claim it needs does not exist yet, as kube-scheduler's
  PreEnqueue gate) did not count as an attempt, so it goes straight to active.

A pod handed out by :meth:`pop` is *processing* until :meth:`done`; adding it meanwhile marks it
dirty, and it is re-queued after ``done``. The events that arrive while a pod is being tried
are kept, and ``done`` checks the pod's hint against them: a change that may help it sends it
to backoff instead of parking it, so a change that happened during its attempt is never
missed. Every key is in at most one of the three sets. Single-threaded (asyncio) use.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final


class Outcome(enum.Enum):
    SCHEDULED = "scheduled"
    UNSCHEDULABLE = "unschedulable"
    WAITING = "waiting"  # not tried: something it needs is missing (kube-scheduler's PreEnqueue)
    ERROR = "error"
    FORGET = "forget"


class EventKind(enum.Enum):
    """What changed in the cluster (kube-scheduler's ClusterEvent resource and action)."""

    CLUSTER = "cluster"  # a Node, ResourceSlice, DeviceClass or volume object changed (for us)
    CLAIM = "claim"  # a ResourceClaim was created, or its status changed
    DEVICES_FREED = "devices-freed"  # a claim's allocation was cleared (or it was deleted)
    POD_GONE = "pod-gone"  # a pod bound to a node was deleted or finished
    POD_ADDED = "pod-added"  # a pod now counts on a node (bound, by any scheduler), or relabelled


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One change, with what the hints compare: the claim (``CLAIM``), the DeviceClasses that
    select the freed devices (``DEVICES_FREED``; None when they are not known)."""

    kind: EventKind
    claim: str = ""
    classes: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Hint:
    """Which changes may make a parked pod schedulable. ``None`` means "any": ``claims`` are
    the claim keys whose creation or status change may help, ``device_classes`` the classes
    whose freed devices may help (empty: no freed device helps), ``pod_gone`` whether a pod
    leaving a node may help (node resources, ports, pod affinity), ``pod_added`` whether a pod
    placed on a node may (required pod affinity, topology spread), ``cluster`` whether a node,
    slice or class change may (it may, for every pod that failed on what they publish)."""

    cluster: bool = True
    claims: frozenset[str] | None = None
    device_classes: frozenset[str] | None = None
    pod_gone: bool = True
    pod_added: bool = True

    def wakes(self, event: ClusterEvent) -> bool:
        kind = event.kind
        if kind is EventKind.CLUSTER:
            return self.cluster
        if kind is EventKind.CLAIM:
            return self.claims is None or event.claim in self.claims
        if kind is EventKind.POD_GONE:
            return self.pod_gone
        if kind is EventKind.POD_ADDED:
            return self.pod_added
        if self.device_classes is None or event.classes is None:
            return self.device_classes is None or bool(self.device_classes)
        return not self.device_classes.isdisjoint(event.classes)


#: The hint of a pod nothing is known about: every change may help it.
ANY: Final = Hint()


class _Wakers:
    """The parked pods filed by what can wake them, so that an event reads only the pods its
    kind (and claim, or DeviceClasses) may wake, not every parked pod's hint: the same
    answers as :meth:`Hint.wakes` (a 3,000-pod burst called it 1.8 million times otherwise)."""

    __slots__ = ("any_claim", "any_freed", "by_claim", "by_class", "by_kind", "some_freed")

    def __init__(self) -> None:
        #: CLUSTER, POD_GONE, POD_ADDED: the pods whose hint says yes
        self.by_kind: dict[EventKind, set[str]] = {
            EventKind.CLUSTER: set(),
            EventKind.POD_GONE: set(),
            EventKind.POD_ADDED: set(),
        }
        self.any_claim: set[str] = set()  # claims None: any claim event
        self.by_claim: dict[str, set[str]] = {}
        self.any_freed: set[str] = set()  # device_classes None: any freed device
        self.some_freed: set[str] = set()  # device_classes not empty: freed of unknown classes
        self.by_class: dict[str, set[str]] = {}

    def file(self, key: str, hint: Hint) -> None:
        for kind, wakes in (
            (EventKind.CLUSTER, hint.cluster),
            (EventKind.POD_GONE, hint.pod_gone),
            (EventKind.POD_ADDED, hint.pod_added),
        ):
            if wakes:
                self.by_kind[kind].add(key)
        if hint.claims is None:
            self.any_claim.add(key)
        else:
            for claim in hint.claims:
                self.by_claim.setdefault(claim, set()).add(key)
        if hint.device_classes is None:
            self.any_freed.add(key)
        elif hint.device_classes:
            self.some_freed.add(key)
            for name in hint.device_classes:
                self.by_class.setdefault(name, set()).add(key)

    def unfile(self, key: str, hint: Hint) -> None:
        for keys in self.by_kind.values():
            keys.discard(key)
        self.any_claim.discard(key)
        self.any_freed.discard(key)
        self.some_freed.discard(key)
        for claim in hint.claims or ():
            _discard(self.by_claim, claim, key)
        for name in hint.device_classes or ():
            _discard(self.by_class, name, key)

    def woken(self, event: ClusterEvent) -> set[str]:
        """The parked pods whose hint ``event`` wakes (a set the caller may not change)."""
        kind = event.kind
        if kind is EventKind.CLAIM:
            named = self.by_claim.get(event.claim)
            return self.any_claim | named if named else self.any_claim
        if kind is EventKind.DEVICES_FREED:
            if event.classes is None:
                return self.any_freed | self.some_freed
            out = set(self.any_freed)
            for name in event.classes:
                out.update(self.by_class.get(name, ()))
            return out
        return self.by_kind[kind]


def _discard(index: dict[str, set[str]], name: str, key: str) -> None:
    keys = index.get(name)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[name]


@dataclass(slots=True)
class _Entry:
    attempts: int = 0
    stamp: int = 0  # the queue timestamp (a sequence number): added, or last failed
    ready_at: float = 0.0
    parked_at: float = 0.0
    priority: int | None = None  # spec.priority as given to add (None: ask the function)


class SchedulingQueue:
    """See the module docstring."""

    def __init__(
        self,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 10.0,
        flush_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        priority: Callable[[str], int] | None = None,
    ) -> None:
        self._initial = backoff_initial_s
        self._max = backoff_max_s
        self._flush = flush_s
        self._clock = clock
        self._priority = priority
        self._entries: dict[str, _Entry] = {}
        # active: key -> serial of its heap item; the heap orders (-priority, stamp, serial,
        # key). Items of keys that left (or re-entered) are stale and skipped when popped.
        self._active: dict[str, int] = {}
        self._active_heap: list[tuple[int, int, int, str]] = []
        self._serial = itertools.count()
        self._stamps = itertools.count()
        self._backoff: set[str] = set()
        self._parked: dict[str, Hint] = {}
        self._wakers = _Wakers()  # the parked pods by what can wake them
        # (time, key) heaps over backoff and parked pods; stale items are skipped when popped,
        # so due pods are found in O(log n) however many pods wait.
        self._backoff_heap: list[tuple[float, str]] = []
        self._parked_heap: list[tuple[float, str]] = []
        self._processing: dict[str, int] = {}  # key -> event sequence at pop
        # (sequence at pop, key) for each pod processing, oldest first: the oldest is found
        # without reading every pod in flight; items of pods done since are skipped (stale)
        self._popped: list[tuple[int, str]] = []
        # while pods are processing: (sequence, event), oldest first; pruned from the left
        self._events: collections.deque[tuple[int, ClusterEvent | None]] = collections.deque()
        self._event_seq = 0
        self._dirty: set[str] = set()
        self._wakeup = asyncio.Event()
        self._closed = False

    # ------------------------------------------------------------------ introspection

    def __len__(self) -> int:
        return len(self._active) + len(self._backoff) + len(self._parked)

    @property
    def depths(self) -> dict[str, int]:
        return {
            "active": len(self._active),
            "backoff": len(self._backoff),
            "unschedulable": len(self._parked),
        }

    def attempts(self, key: str) -> int:
        entry = self._entries.get(key)
        return entry.attempts if entry else 0

    def backoff_s(self, attempts: int) -> float:
        if attempts <= 0:
            return 0.0
        return float(min(self._max, self._initial * 2.0 ** min(attempts - 1, 30)))

    def is_queued(self, key: str) -> bool:
        return key in self._active or key in self._backoff or key in self._parked

    @property
    def listening(self) -> bool:
        """Whether a :meth:`move` could change anything: pods are parked or being tried."""
        return bool(self._parked or self._processing)

    def hint(self, key: str) -> Hint | None:
        """The hint a parked pod waits with (None when it is not parked)."""
        return self._parked.get(key)

    # ------------------------------------------------------------------ producers

    def add(self, key: str, priority: int | None = None) -> None:
        """A new or changed pod: try it (respecting a running backoff). ``priority`` is its
        ``spec.priority`` (the API server's admission resolved it from its class)."""
        entry = self._entries.get(key)
        if entry is not None and priority is not None and entry.priority != priority:
            entry.priority = priority
            if key in self._active:
                self._to_active(key)  # its older heap item is now stale
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._active or key in self._backoff:
            return
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(stamp=next(self._stamps), priority=priority)
        self._unpark(key)
        if entry.ready_at > self._clock():
            self._to_backoff(key, entry)
        else:
            self._to_active(key)
        self._wakeup.set()

    def _to_active(self, key: str) -> None:
        serial = next(self._serial)
        self._active[key] = serial
        entry = self._entries.get(key)
        if entry is not None and entry.priority is not None:
            order = -entry.priority
        else:
            order = -self._priority(key) if self._priority is not None else 0
        stamp = entry.stamp if entry is not None else serial
        heapq.heappush(self._active_heap, (order, stamp, serial, key))

    def _to_backoff(self, key: str, entry: _Entry) -> None:
        self._backoff.add(key)
        heapq.heappush(self._backoff_heap, (entry.ready_at, key))

    def _park(self, key: str, entry: _Entry, hint: Hint) -> None:
        self._unpark(key)
        self._parked[key] = hint
        self._wakers.file(key, hint)
        heapq.heappush(self._parked_heap, (entry.parked_at + self._flush, key))

    def _unpark(self, key: str) -> bool:
        """Take ``key`` out of the parked pods (whether it was parked)."""
        hint = self._parked.pop(key, None)
        if hint is None:
            return False
        self._wakers.unfile(key, hint)
        return True

    def move(self, event: ClusterEvent) -> int:
        """A cluster change: the parked pods whose hint it matches become eligible (after their
        backoff). Returns how many left."""
        return self._move(event)

    def move_all(self) -> int:
        """Every parked pod becomes eligible (after its backoff), whatever its hint."""
        return self._move(None)

    def _move(self, event: ClusterEvent | None) -> int:
        if self._processing:
            self._event_seq += 1
            self._events.append((self._event_seq, event))
        if not self._parked:
            self._parked_heap.clear()
            return 0
        moved = list(self._parked) if event is None else list(self._wakers.woken(event))
        for key in moved:
            self._unpark(key)
            self._to_backoff(key, self._entries[key])
        if not self._parked:
            self._parked_heap.clear()
        if moved:
            self._wakeup.set()
        return len(moved)

    def forget(self, key: str) -> None:
        """The pod is gone or no longer ours: drop every trace of it."""
        self._active.pop(key, None)
        self._backoff.discard(key)
        self._unpark(key)
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
            if key not in self._parked or entry is None:
                continue  # stale: moved or forgotten meanwhile
            if entry.parked_at + self._flush > now:
                continue  # stale: parked again later (its newer item is in the heap)
            self._unpark(key)
            self._to_backoff(key, entry)
        waiting = self._backoff_heap
        while waiting and waiting[0][0] <= now:
            _, key = heapq.heappop(waiting)
            entry = self._entries.get(key)
            if key not in self._backoff or entry is None or entry.ready_at > now:
                continue  # stale
            self._backoff.discard(key)
            self._to_active(key)
        heads = [h[0][0] for h in (parked, waiting) if h]
        return min(heads) if heads else None

    def pop_nowait(self) -> str | None:
        """The next ready pod, or None (used by tests and by :meth:`pop`)."""
        self._promote(self._clock())
        heap = self._active_heap
        while heap:
            _, _, serial, key = heapq.heappop(heap)
            if self._active.get(key) != serial:
                continue  # stale: forgotten, or queued again under a newer item
            del self._active[key]
            self._processing[key] = self._event_seq
            heapq.heappush(self._popped, (self._event_seq, key))
            return key
        return None

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
            if timeout is None:
                await self._wakeup.wait()
                continue
            # The next due pod wakes it like a new one (a plain timer: neither wait_for, which
            # on 3.11 can swallow a cancellation that races with the event being set, nor a
            # timeout block, which costs twice as much per wait).
            timer = asyncio.get_running_loop().call_later(timeout, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                timer.cancel()

    def done(self, key: str, outcome: Outcome, hint: Hint = ANY) -> None:
        """Report the result of trying ``key`` (obtained from :meth:`pop`); an unschedulable
        or waiting pod is parked with ``hint`` (a waiting one without counting an attempt)."""
        popped_at = self._processing.pop(key, None)
        parks = outcome in (Outcome.UNSCHEDULABLE, Outcome.WAITING)
        missed = self._missed(popped_at, hint) if parks else False
        self._prune_events()
        dirty = key in self._dirty
        self._dirty.discard(key)
        if outcome in (Outcome.SCHEDULED, Outcome.FORGET):
            self._entries.pop(key, None)
            if dirty and outcome is Outcome.FORGET:
                # It changed while being looked at and nothing was done: the look may have
                # come before the change (the deallocator's claim whose pod finished meanwhile)
                self.add(key)
            return
        now = self._clock()
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(stamp=next(self._stamps))
        if outcome is not Outcome.WAITING:
            # A failed attempt refreshes the queue timestamp (kube-scheduler's
            # AddUnschedulableIfNotPresent); a pod that waited was not tried: it keeps its place.
            entry.attempts += 1
            entry.stamp = next(self._stamps)
            entry.ready_at = now + self.backoff_s(entry.attempts)
        if parks and not dirty and not missed:
            entry.parked_at = now
            self._park(key, entry, hint)
        else:
            self._to_backoff(key, entry)
        self._wakeup.set()

    def _missed(self, popped_at: int | None, hint: Hint) -> bool:
        """Whether a change that may help the pod arrived while it was being tried."""
        if popped_at is None:
            return False
        # Newest first, down to the pod's pop: the work is the events of its own attempt.
        for seq, event in reversed(self._events):
            if seq <= popped_at:
                return False
            if event is None or hint.wakes(event):
                return True
        return False

    def _prune_events(self) -> None:
        """Drop the events no pod still processing can have missed. Called on every
        :meth:`done`: dropping from the left keeps it proportional to what is dropped (a list
        rebuilt per call was a quarter of the controller's CPU in a 3,000-pod burst), and the
        oldest pod processing is the head of a heap (a ``min`` over the hundreds of pods whose
        writes are in flight was 1.4 % of the controller's CPU per bound pod)."""
        processing = self._processing
        popped = self._popped
        if not processing:
            self._events.clear()
            popped.clear()
            return
        if len(popped) > 2 * len(processing) + 64:  # stale items below the head: compact
            popped[:] = [(seq, key) for key, seq in processing.items()]
            heapq.heapify(popped)
        while processing.get(popped[0][1]) != popped[0][0]:
            heapq.heappop(popped)  # stale: done since (every pod processing has its item)
        oldest = popped[0][0]
        events = self._events
        while events and events[0][0] <= oldest:
            events.popleft()

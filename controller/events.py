"""Telling users why a pod is not scheduled: the ``PodScheduled`` condition and an Event.

For a pod that cannot be placed, :class:`Recorder` writes ``PodScheduled=False`` with reason
``Unschedulable`` (``SchedulerError`` when the attempt itself failed, as kube-scheduler: the
decision passed its deadline, or a placement could not be completed, e.g. its volumes were
not provisioned) and the message, by a strategic-merge patch of ``pods/status`` (conditions
merge by type, so other conditions are kept), plus a ``Warning`` Event ``FailedScheduling``
with the same message (core/v1, as kube-scheduler records). For a pod it placed, a ``Normal``
Event ``Scheduled``.

Cheap, and never in the way of placements:

* **a lane of its own**: reports are queued (one per pod: a newer report replaces the one
  waiting, and a pod that is placed or gone drops its own) and written by a few workers whose
  requests are background requests (:func:`kubeapi.client.background`): they yield every
  token of the client's rate limit to the writes that place pods;
* **one pod's writes in the order they were reported**: a worker never takes a pod whose
  previous report is still being written (two patches of one pod in flight at once may land
  in either order, and an older message would then stay on the pod: a parked pod is not
  tried, so not reported, again), and a placement's binding waits for the pod's write in
  flight (:meth:`Recorder.settled`) so that no failure report lands on a bound pod;
* **a report does not cost the placement after it a retry**: the condition is written on the
  condition that the pod is still at the resourceVersion the report was based on (the
  cache's), and what it moved the pod to is remembered (:meth:`Recorder.advanced`): a binding
  decided on the older version may then carry the newer one, since nothing but this condition
  changed in between. (When the pod changed meanwhile, the condition is written without the
  precondition and nothing is remembered: the binding sees the change, a 409, a retry.)
* **the condition only when it changes**: not when the pod already shows the same reason and
  message (as its cached object says, or as this process last wrote it);
* **events counted as client-go's event recorder counts them**: an event equal to one recorded
  before (same object, type, reason, message, source) is not created again; the first one's
  ``count`` and ``lastTimestamp`` are patched instead (an LRU of 4096 events, as client-go's
  ``eventLogger``), and each object gets at most 25 events at once, then one per five minutes
  (client-go's spam filter); what the filter holds back is dropped, as there.

Failures are logged and swallowed: reporting must never stop scheduling. The memories are per
pod UID and forgotten with the pod (the event LRU is bounded instead).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from controller.api import EVENTS, JSON, PODS, Api, meta
from controller.commit import PodRef
from driver.api.errors import ApiError, ConflictError, NotFoundError, clip
from kubeapi import background
from kubeapi.events import MAX_MESSAGE, event_body, now_rfc3339

log = logging.getLogger(f"biaxial.{__name__}")

REASON_UNSCHEDULABLE: Final = "Unschedulable"
#: The longest message a condition or event carries (events.k8s.io's ``note`` limit, 1 KiB):
#: a message that quotes user input at length is cut there, whatever produced it.
MESSAGE_LIMIT: Final = 1024
REASON_SCHEDULER_ERROR: Final = "SchedulerError"  # kube-scheduler's, for a failed attempt
EVENT_FAILED_SCHEDULING: Final = "FailedScheduling"
EVENT_SCHEDULED: Final = "Scheduled"

#: client-go's ``maxLruCacheEntries`` (tools/record): events remembered for counting.
EVENT_CACHE_SIZE: Final = 4096
#: client-go's spam filter defaults: 25 events per object at once, then one per 5 minutes.
SPAM_BURST: Final = 25
SPAM_REFILL_S: Final = 300.0
REPORT_WORKERS: Final = 4

__all__ = ["Recorder", "now_rfc3339"]


@dataclass(slots=True)
class _Report:
    """What is waiting to be written about one pod."""

    pod: PodRef
    event_type: str
    event_reason: str
    message: str
    condition_reason: str | None  # None: no condition (a Scheduled event)
    times: int = 1  # attempts it stands for (coalesced reports add up in the event count)
    version: str = ""  # the pod's resourceVersion the report was based on ("": unknown)


@dataclass(slots=True)
class _Seen:
    """An event already recorded, for counting the next equal one."""

    name: str
    count: int


@dataclass(slots=True)
class _Budget:
    """One object's spam-filter bucket."""

    tokens: float
    last: float


class Recorder:
    """Writes conditions and events for pods (see the module docstring). ``spawn`` starts a
    writer job (the scheduler's job guard, so shutdown drains or cancels it)."""

    def __init__(
        self,
        api: Api,
        *,
        component: str,
        instance: str,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        workers: int = REPORT_WORKERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.component = component
        self.instance = instance
        self._spawn = spawn
        self._max_workers = workers
        self._workers = 0
        self._clock = clock
        self._pending: dict[str, _Report] = {}  # pod uid -> report, oldest first
        self._writing: dict[str, asyncio.Event] = {}  # pod uid -> set when its write is done
        # pod uid -> {resourceVersion: the one our condition write alone moved it to}
        self._advanced: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._shown: dict[str, tuple[str, str]] = {}  # pod uid -> (reason, message) it shows
        self._events: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        self._budgets: OrderedDict[str, _Budget] = OrderedDict()
        self.written = 0  # condition and event writes sent (for tests and benchmarks)

    # ------------------------------------------------------------------ producers

    def unschedulable(
        self,
        pod: PodRef,
        message: str,
        *,
        shown: tuple[str, str] | None = None,
        reason: str = REASON_UNSCHEDULABLE,
        version: str = "",
    ) -> None:
        """Report that ``pod`` cannot be scheduled now, and why. ``shown`` is the
        ``(reason, message)`` of the ``PodScheduled=False`` condition the pod already carries
        (from the cache), if any; ``version`` the pod's resourceVersion there."""
        if shown is not None and pod.uid not in self._shown:
            self._shown[pod.uid] = shown
        message = clip(message, MESSAGE_LIMIT)
        waiting = self._pending.get(pod.uid)
        if waiting is not None and waiting.message == message:
            waiting.times += 1
            return
        self._submit(
            _Report(
                pod,
                "Warning",
                EVENT_FAILED_SCHEDULING,
                message,
                condition_reason=reason,
                version=version,
            )
        )

    def scheduled(self, pod: PodRef, node: str) -> None:
        """Report that ``pod`` was bound to ``node`` (what waited about it is dropped)."""
        self.forget(pod.uid)
        self._submit(
            _Report(
                pod,
                "Normal",
                EVENT_SCHEDULED,
                f"Successfully assigned {pod.key} to {node}",
                condition_reason=None,
            )
        )

    async def binding_pending(self, pod: PodRef, node: str) -> None:
        """The pod waits for its devices' binding conditions on ``node`` (an Event)."""
        await self.event(
            pod,
            "Normal",
            "BindingConditionsPending",
            f"waiting for binding conditions for device on node {node}",
        )

    async def event(self, pod: PodRef, etype: str, reason: str, message: str) -> None:
        """Write one Event about ``pod`` now, outside the lane (preemption's ``Preempting`` and
        ``Preempted``, and ``BindingConditionsPending``: rare, and none may replace another
        waiting for the same pod). Failures are logged."""
        body = self._body(
            _Report(pod, etype, reason, clip(message, MESSAGE_LIMIT), condition_reason=None)
        )
        try:
            self.written += 1
            await self.api.create(EVENTS, body, pod.namespace)
        except ApiError as exc:
            log.warning("pod %s: could not record event %s: %s", pod.key, reason, exc)

    async def settled(self, pod_uid: str) -> None:
        """Return once no report about the pod is being written (what :meth:`forget` dropped
        is never written; one already sent must land before the pod is bound)."""
        writing = self._writing.get(pod_uid)
        if writing is not None:
            await writing.wait()

    def advanced(self, pod_uid: str, version: str) -> str:
        """The pod's resourceVersion after the condition writes of ours that followed
        ``version`` with nothing else in between (``version`` itself when there were none)."""
        chain = self._advanced.pop(pod_uid, {})
        while version in chain:
            version = chain.pop(version)
        return version

    def forget(self, pod_uid: str) -> None:
        """The pod is placed or gone: nothing more is written about its failures."""
        self._pending.pop(pod_uid, None)
        self._shown.pop(pod_uid, None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _submit(self, report: _Report) -> None:
        self._pending[report.pod.uid] = report
        if self._workers < self._max_workers:
            self._workers += 1
            self._spawn(self._work())

    # ------------------------------------------------------------------ the lane

    async def _work(self) -> None:
        try:
            with background():
                while (uid := self._next_unwritten()) is not None:
                    done = self._writing[uid] = asyncio.Event()
                    try:
                        await self._write(self._pending.pop(uid))
                    finally:
                        del self._writing[uid]
                        done.set()
        finally:
            self._workers -= 1

    def _next_unwritten(self) -> str | None:
        """The pod whose report waits longest and that has no write in flight (the worker
        writing one takes its next report when it is done)."""
        return next((uid for uid in self._pending if uid not in self._writing), None)

    async def _write(self, report: _Report) -> None:
        pod = report.pod
        if report.condition_reason is not None:
            state = (report.condition_reason, report.message)
            if self._shown.get(pod.uid) != state:
                if not await self._condition(pod, *state, report.version):
                    return
                self._shown[pod.uid] = state
        await self._event(report)

    async def _condition(self, pod: PodRef, reason: str, message: str, version: str) -> bool:
        condition: JSON = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }
        body: JSON = {"status": {"conditions": [condition]}}
        if version:
            body["metadata"] = {"resourceVersion": version}
        try:
            self.written += 1
            try:
                written = await self._patch_status(pod, body)
            except ConflictError:
                if not version:
                    raise
                del body["metadata"]  # changed meanwhile: say it all the same
                self.written += 1
                await self._patch_status(pod, body)
            else:
                if version:
                    self._remember(pod.uid, version, str(meta(written).get("resourceVersion")))
        except NotFoundError:
            self.forget(pod.uid)
            return False
        except ApiError as exc:
            self._shown.pop(pod.uid, None)
            log.warning("pod %s: could not set PodScheduled=False: %s", pod.key, exc)
            return False
        return True

    async def _patch_status(self, pod: PodRef, body: JSON) -> JSON:
        return await self.api.patch(
            PODS,
            pod.name,
            body,
            namespace=pod.namespace,
            subresource="status",
            patch_type="strategic",
        )

    def _remember(self, pod_uid: str, before: str, after: str) -> None:
        if not after:
            return
        self._advanced.setdefault(pod_uid, {})[before] = after
        self._advanced.move_to_end(pod_uid)
        while len(self._advanced) > EVENT_CACHE_SIZE:
            self._advanced.popitem(last=False)

    async def _event(self, report: _Report) -> None:
        pod = report.pod
        if not self._allowed(pod.uid):
            log.debug("pod %s: event %s held back by the spam filter", pod.key, report.event_reason)
            return
        key = (
            pod.namespace,
            pod.name,
            pod.uid,
            report.event_type,
            report.event_reason,
            report.message[:MAX_MESSAGE],
        )
        seen = self._events.get(key)
        try:
            if seen is not None:
                self._events.move_to_end(key)
                if await self._count(seen, report):
                    return
                del self._events[key]  # expired on the server: record it afresh
            body = self._body(report)
            self.written += 1
            created = await self.api.create(EVENTS, body, pod.namespace)
        except ApiError as exc:
            log.warning("pod %s: could not record event %s: %s", pod.key, report.event_reason, exc)
            return
        name = str((created.get("metadata") or {}).get("name") or body["metadata"]["name"])
        self._events[key] = _Seen(name, int(body["count"]))
        while len(self._events) > EVENT_CACHE_SIZE:
            self._events.popitem(last=False)

    async def _count(self, seen: _Seen, report: _Report) -> bool:
        """Add the report's occurrences to an event recorded before; False when the server no
        longer has that event."""
        seen.count += report.times
        self.written += 1
        try:
            await self.api.patch(
                EVENTS,
                seen.name,
                {"count": seen.count, "lastTimestamp": now_rfc3339()},
                namespace=report.pod.namespace,
            )
        except NotFoundError:
            return False
        return True

    def _body(self, report: _Report) -> JSON:
        pod = report.pod
        body = event_body(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
            namespace=pod.namespace,
            event_type=report.event_type,
            reason=report.event_reason,
            message=report.message,
            component=self.component,
            instance=self.instance,
        )
        body["count"] = report.times
        return body

    def _allowed(self, uid: str) -> bool:
        """client-go's spam filter: a token bucket per object (burst 25, one per 5 minutes)."""
        now = self._clock()
        budget = self._budgets.get(uid)
        if budget is None:
            budget = self._budgets[uid] = _Budget(float(SPAM_BURST), now)
        else:
            self._budgets.move_to_end(uid)
            budget.tokens = min(
                float(SPAM_BURST), budget.tokens + (now - budget.last) / SPAM_REFILL_S
            )
            budget.last = now
        while len(self._budgets) > EVENT_CACHE_SIZE:
            self._budgets.popitem(last=False)
        if budget.tokens < 1.0:
            return False
        budget.tokens -= 1.0
        return True

"""Devices about to come free: what a pod that finds none waits for, instead of failing.

When a bound pod is deleted or finishes, the devices of its claims come free a moment later,
once its reservation is dropped and the claim deallocated (by kube-controller-manager and
:mod:`controller.deallocate`). A pod tried in that moment finds no device and would fail: an
attempt counted, a backoff of a second or more, a ``FailedScheduling`` condition and event —
and, when the release lands, a newer pod that needs no backoff takes the device first (on a
full cluster in a steady stream of pods, the same pod lost again and again: a 15 s p99 where
kube-scheduler, whose claims kube-controller-manager releases before it creates the next
pod's, had 2 s). So the scheduler tells :class:`Releases` which claims are on their way out
(:meth:`Releases.expect`), and a pod short only of devices while one is (of a DeviceClass it
asks for) *waits* for it: parked without counting an attempt and without a report, woken when
the devices are freed, and then tried in its place in the queue (the oldest first).

Bounded: a release that has not landed ``wait_s`` after its pod went is no longer waited for,
and the pods parked on it are woken (``on_overdue``) to be tried and reported as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

#: How long a release is waited for (kube-scheduler's longest backoff).
WAIT_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class _Release:
    deadline: float
    classes: frozenset[str] | None  # the DeviceClasses that select its devices (None: unknown)


class Releases:
    """See the module docstring."""

    def __init__(
        self,
        on_overdue: Callable[[frozenset[str] | None], None],
        *,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_overdue = on_overdue
        self._wait_s = wait_s
        self._clock = clock
        self._pending: dict[str, _Release] = {}  # claim key -> its release

    def __len__(self) -> int:
        return len(self._pending)

    def expect(self, key: str, classes: frozenset[str] | None) -> None:
        """The allocated claim ``key`` is on its way out; ``classes`` select its devices."""
        release = _Release(self._clock() + self._wait_s, classes)
        self._pending[key] = release
        with contextlib.suppress(RuntimeError):  # no running loop (a unit test): lazily
            asyncio.get_running_loop().call_later(self._wait_s, self._overdue, key, release)

    def landed(self, key: str) -> None:
        """The claim's devices are free (its allocation cleared, or the claim is gone)."""
        self._pending.pop(key, None)

    def pending(self, wanted: frozenset[str] | None) -> bool:
        """Whether a release is due that frees devices of a class in ``wanted`` (None: any)."""
        now = self._clock()
        for key, release in list(self._pending.items()):
            if release.deadline <= now:
                del self._pending[key]
                continue
            if wanted is None or release.classes is None or not wanted.isdisjoint(release.classes):
                return True
        return False

    def _overdue(self, key: str, release: _Release) -> None:
        if self._pending.get(key) is release:
            del self._pending[key]
            self._on_overdue(release.classes)

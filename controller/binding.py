"""Waiting for device binding conditions (KEP-5007) before a pod is bound.

A device published with ``bindingConditions`` (e.g. a fabric-attached GPU that must first be
attached to the node) is only usable once some controller reports those conditions ``True`` in
the claim's ``status.devices``. kube-scheduler's DynamicResources plugin therefore waits in
PreBind, after the allocation and reservation are written and before the binding, as this
module does for biaxial (:meth:`BindingWaiter.wait`):

* a claim is ready when, for every allocation result that carries ``bindingConditions``, the
  ``status.devices`` entry with the same driver, pool and device (the share ID is not compared,
  as upstream's ``getAllocatedDeviceStatus``) has every one of them ``True``; a missing entry is
  "not ready yet" (upstream ``isClaimReadyForBinding``);
* a result's ``bindingFailureConditions`` entry that is ``True`` fails the wait at once, with
  the condition's reason and message (:class:`BindingFailedError`);
* the wait is bounded by the binding timeout (upstream ``DynamicResourcesArgs.bindingTimeout``,
  default 600 s; flag ``--binding-timeout``); past it, :class:`BindingTimeoutError`.

Either error is a :class:`controller.commit.CommitAbortedError`: the committer rolls back what
the attempt wrote (reservation, allocation, the devices' status, finalizers) and the scheduler
requeues the pod, which is what upstream reaches through Filter (claim "unavailable" on a
failure condition or past ``allocationTimestamp + bindingTimeout``) and PostFilter
(deallocation). The wait reads the claim cache and wakes on each change of a claim it waits
for (:meth:`BindingWaiter.changed`), not on a 5 s poll; it holds no write slot, so other pods'
placements go on meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controller.prebind import wait_until_ready
from driver.api.errors import BiaxialError

log = logging.getLogger(f"biaxial.{__name__}")

JSON = dict[str, Any]

#: kube-scheduler's ``DynamicResourcesArgs.bindingTimeout`` default.
DEFAULT_BINDING_TIMEOUT_S = 600.0


class BindingFailedError(BiaxialError):
    """A device's binding failure condition is True."""


class BindingTimeoutError(BiaxialError):
    """The binding conditions were not all met within the binding timeout."""


def has_binding_conditions(allocation: Mapping[str, Any] | None) -> bool:
    """Whether any result of ``allocation`` (``status.allocation`` JSON) must be waited for."""
    results = ((allocation or {}).get("devices") or {}).get("results") or ()
    return any(r.get("bindingConditions") for r in results)


def _condition(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def binding_state(claim: Mapping[str, Any]) -> bool:
    """True when ``claim`` is ready for binding, False when not yet; raises
    :class:`BindingFailedError` when a failure condition is True (upstream
    ``isClaimReadyForBinding``)."""
    status = claim.get("status") or {}
    allocation = status.get("allocation")
    if allocation is None:
        return False
    name = (claim.get("metadata") or {}).get("name")
    devices = status.get("devices") or ()
    for result in (allocation.get("devices") or {}).get("results") or ():
        wanted = result.get("bindingConditions") or ()
        if not wanted:
            continue
        entry = next(
            (
                d
                for d in devices
                if d.get("driver") == result.get("driver")
                and d.get("pool") == result.get("pool")
                and d.get("device") == result.get("device")
            ),
            None,
        )
        if entry is None:
            return False
        conditions = entry.get("conditions") or ()
        for kind in result.get("bindingFailureConditions") or ():
            failed = _condition(conditions, kind)
            if failed is not None and failed.get("status") == "True":
                raise BindingFailedError(
                    f"claim {name}: binding of device {result.get('device')} failed: "
                    f"{kind} (reason={failed.get('reason') or ''}, "
                    f"message={failed.get('message') or ''!r})"
                )
        for kind in wanted:
            met = _condition(conditions, kind)
            if met is None or met.get("status") != "True":
                return False
    return True


class BindingWaiter:
    """Waits until claims are ready for binding (see the module docstring). ``read(key)``
    gives the newest known state of a claim; :meth:`changed` is called on every change."""

    def __init__(
        self, read: Callable[[str], Mapping[str, Any] | None], *, timeout_s: float
    ) -> None:
        self._read = read
        self.timeout_s = timeout_s
        self._waiting: dict[str, set[asyncio.Event]] = {}

    def changed(self, key: str) -> None:
        for event in self._waiting.get(key, ()):
            event.set()

    def _pending(self, keys: Iterable[str]) -> list[str]:
        """The keys not ready yet; raises on a failure condition or a vanished claim."""
        pending = []
        for key in keys:
            claim = self._read(key)
            if claim is None:
                raise BindingFailedError(f"claim {key} is gone")
            if not binding_state(claim):
                pending.append(key)
        return pending

    async def wait(self, keys: Iterable[str]) -> float:
        """Wait for every claim of ``keys`` to be ready; returns the seconds waited
        (:func:`controller.prebind.wait_until_ready`)."""
        keys = list(keys)
        event = asyncio.Event()
        for key in keys:
            self._waiting.setdefault(key, set()).add(event)
        try:
            return await wait_until_ready(
                lambda: self._pending(keys),
                event,
                timeout_s=self.timeout_s,
                timed_out=lambda pending: BindingTimeoutError(
                    f"binding conditions of claim(s) {', '.join(pending)} not met within "
                    f"{self.timeout_s:g} s"
                ),
            )
        finally:
            for key in keys:
                waiters = self._waiting.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiting[key]

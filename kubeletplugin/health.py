"""Device health: NVML events in, device taints and the kubelet's health stream out.

:class:`HealthTracker` is the pure state machine (time is passed in; no I/O):

* ``lost`` (GPU fell off the bus / stopped answering) -> the GPU's devices are unhealthy with
  a ``NoExecute`` taint (running pods cannot use it either).
* ``xid`` with a fatal Xid (:data:`FATAL_XIDS`: the GPU needs a reset or replacement) ->
  unhealthy, ``NoExecute``. Any other critical Xid the backend reports -> unhealthy,
  ``NoSchedule`` (new pods stay away; running ones keep going).
* Recovery rule. A non-fatal Xid clears by itself after ``quiet_s`` seconds without another
  Xid on that GPU. Fatal Xids and ``lost`` need evidence that the GPU was reset: an explicit
  ``recovered`` event from the backend, or the GPU dropping out of discovery and appearing
  again (:meth:`HealthTracker.observe_inventory` forgets a vanished GPU's devices). A plugin
  restart starts healthy (NVML reports a still-broken GPU again).
* Which devices an event affects is the device table's answer
  (:meth:`driver.discovery.devices.DeviceTable.health_targets`): an event for a whole GPU
  applies to every published device on it (its MIG partitions when MIG is enabled); an event
  naming a MIG UUID applies to that partition only. Unknown UUIDs are ignored.
* :meth:`HealthTracker.taints` gives the ``gpu.biaxial.dev/unhealthy`` taint per unhealthy
  device, ``timeAdded`` fixed at the moment it became unhealthy, so republishing is stable.
* :meth:`HealthTracker.version` increases on every visible change, for waiters.

:class:`HealthBroadcaster` wakes NodeWatchResources streams on change and is the place the
server reads the complete list from.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Final, Literal

from driver.api.model import DeviceTaint
from driver.discovery.backend import HealthEvent
from driver.discovery.devices import DeviceTable
from driver.discovery.gpus import GpuInfo
from kubeapi.tasks import wait_at_most

log = logging.getLogger(f"biaxial.{__name__}")

TAINT_KEY: Final = "gpu.biaxial.dev/unhealthy"
FATAL_XIDS: Final = frozenset({48, 62, 64, 74, 79, 92, 94, 95, 119, 120})
"""Xids after which the GPU must be reset or drained (double-bit ECC, micro-controller halt,
ECC page retirement failure, NVLink, fallen off the bus, ECC rate / contained / uncontained
ECC, GSP RPC timeout / GSP error)."""
MAX_MESSAGE: Final = 1024

Effect = Literal["NoSchedule", "NoExecute"]


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """The health of one published device."""

    device: str
    healthy: bool
    message: str = ""
    effect: Effect | None = None
    reason: str = ""  # taint value: "lost", "xid-79"
    since: float = 0.0  # wall-clock seconds when it became unhealthy
    clear_at: float | None = None  # monotonic deadline of a non-fatal Xid; None: needs a reset


def _rfc3339(wall: float) -> str:
    return datetime.fromtimestamp(int(wall), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def truncate_message(text: str) -> str:
    """At most 1024 characters, as the health API requires (1021 + "...")."""
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


class HealthTracker:
    """Per-device health state (see the module docstring). Not thread-safe: one event loop."""

    def __init__(
        self, inventory: DeviceTable | Iterable[GpuInfo] = (), *, quiet_s: float = 300.0
    ) -> None:
        self._quiet_s = quiet_s
        self._uuids: dict[str, tuple[str, ...]] = {}
        self._state: dict[str, DeviceHealth] = {}
        self.version = 0
        self.observe_inventory(inventory)

    # ----------------------------------------------------------------- inputs

    def observe_inventory(self, inventory: DeviceTable | Iterable[GpuInfo]) -> None:
        """A new discovery result (the node's device table, or the GPUs it is derived from).
        Devices of GPUs that left discovery are forgotten, so a GPU that comes back (after a
        reset or re-attach) starts healthy; new devices start healthy."""
        uuids = DeviceTable.of(inventory).health_targets()
        devices = {d for names in uuids.values() for d in names}
        changed = uuids != self._uuids
        state = {d: h for d, h in self._state.items() if d in devices}
        for device in devices:
            state.setdefault(device, DeviceHealth(device=device, healthy=True))
        self._uuids = uuids
        self._state = state
        if changed:
            self.version += 1

    def _unhealthy_uuid(self, uuid: str) -> bool:
        return any(
            not self._state[d].healthy for d in self._uuids.get(uuid, ()) if d in self._state
        )

    def apply(self, event: HealthEvent, *, wall: float, monotonic: float) -> bool:
        """Apply one backend event; True when any device's health changed."""
        devices = self._uuids.get(event.uuid)
        if not devices:
            log.warning("health event for unknown GPU %s ignored: %s", event.uuid, event.describe())
            return False
        changed = False
        for device in devices:
            old = self._state.get(device, DeviceHealth(device=device, healthy=True))
            new = self._next(old, event, wall=wall, monotonic=monotonic)
            if new != old:
                self._state[device] = new
                changed = changed or (new.healthy, new.effect, new.reason) != (
                    old.healthy,
                    old.effect,
                    old.reason,
                )
        if changed:
            self.version += 1
            log.warning("%s -> devices %s", event.describe(), ", ".join(devices))
        return changed

    def _next(
        self, old: DeviceHealth, event: HealthEvent, *, wall: float, monotonic: float
    ) -> DeviceHealth:
        if event.kind == "recovered":
            return DeviceHealth(device=old.device, healthy=True)
        if event.kind == "lost":
            effect: Effect = "NoExecute"
            reason = "lost"
            clear_at: float | None = None
        else:
            fatal = event.xid in FATAL_XIDS
            effect = "NoExecute" if fatal else "NoSchedule"
            reason = f"xid-{event.xid}"
            clear_at = None if fatal else monotonic + self._quiet_s
            if not old.healthy and old.effect == "NoExecute" and not fatal:
                # A fatal state is never downgraded by a later, milder Xid.
                return old
        since = old.since if not old.healthy else wall
        return DeviceHealth(
            device=old.device,
            healthy=False,
            message=truncate_message(event.describe()),
            effect=effect,
            reason=reason,
            since=since,
            clear_at=clear_at,
        )

    def tick(self, monotonic: float) -> bool:
        """Clear non-fatal Xid states whose quiet period ended; True when anything changed."""
        changed = False
        for device, health in list(self._state.items()):
            if not health.healthy and health.clear_at is not None and monotonic >= health.clear_at:
                log.info("device %s: no Xid for %.0f s; healthy again", device, self._quiet_s)
                self._state[device] = replace(
                    health, healthy=True, message="", effect=None, reason="", clear_at=None
                )
                changed = True
        if changed:
            self.version += 1
        return changed

    def next_deadline(self) -> float | None:
        """The earliest monotonic time at which :meth:`tick` will change something."""
        deadlines = [
            h.clear_at for h in self._state.values() if h.clear_at is not None and not h.healthy
        ]
        return min(deadlines) if deadlines else None

    # ----------------------------------------------------------------- outputs

    def devices(self) -> tuple[DeviceHealth, ...]:
        """Every known device, sorted by name."""
        return tuple(self._state[name] for name in sorted(self._state))

    def unhealthy(self) -> tuple[DeviceHealth, ...]:
        return tuple(h for h in self.devices() if not h.healthy)

    def unhealthy_gpus(self) -> frozenset[str]:
        """UUIDs of physical GPUs with at least one unhealthy device."""
        return frozenset(u for u in self._uuids if self._unhealthy_uuid(u))

    def taints(self) -> Mapping[str, tuple[DeviceTaint, ...]]:
        """The ``gpu.biaxial.dev/unhealthy`` taint per unhealthy device."""
        return {
            h.device: (
                DeviceTaint(
                    key=TAINT_KEY,
                    value=_taint_value(h.reason),
                    effect=h.effect or "NoSchedule",
                    time_added=_rfc3339(h.since),
                ),
            )
            for h in self.unhealthy()
        }


def _taint_value(reason: str) -> str:
    value = re.sub(r"[^A-Za-z0-9_.-]", "-", reason)[:63].strip("-_.")
    return value or "unhealthy"


class HealthBroadcaster:
    """Wakes health streams when the tracker's version moves (one per process)."""

    def __init__(self, tracker: HealthTracker) -> None:
        self.tracker = tracker
        self._changed = asyncio.Condition()
        self.closed = False

    async def notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def close(self) -> None:
        """End every stream (at shutdown, so the gRPC server need not wait for them)."""
        self.closed = True
        await self.notify()

    async def wait_change(self, seen_version: int, timeout_s: float) -> int:
        """Wait until the version differs from ``seen_version`` or the timeout passes."""
        async with self._changed:
            await wait_at_most(
                self._changed.wait_for(lambda: self.closed or self.tracker.version != seen_version),
                timeout_s,
            )
        return self.tracker.version

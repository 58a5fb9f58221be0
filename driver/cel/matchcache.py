"""Selector results cached per device and slice generation, and shared by devices that look the
same to the expression (``driver.cel.reads``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from driver.api.errors import CELEvaluationError
from driver.api.ids import DeviceID
from driver.api.model import Device
from driver.cel.engine import DeviceInput, Selector, device_input
from driver.cel.reads import readable_keys, visible

# --------------------------------------------------------------------------- match cache


@dataclass(slots=True)
class _DeviceEntry:
    generation: int
    prepared: DeviceInput | CELEvaluationError | None  # None: not built yet
    results: dict[str, bool | CELEvaluationError]


class MatchCache:
    """Results (and errors) per (expression, device, slice generation), plus one CEL input per
    (device, slice generation), built once however many selectors run on the device. A device
    seen at another slice generation starts afresh (its old entries are dropped).

    A boolean result is also shared by every device that looks the same to the expression
    (:mod:`driver.cel.reads`: same driver, sharing flag and values of every attribute and
    capacity the expression can name), so a selector runs once per kind of device, not once
    per device: thousands of identical GPUs, or every placement of one MIG profile, cost one
    evaluation. Errors are never shared (their message names the device). Thread-safe; never
    mutates its inputs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: dict[DeviceID, _DeviceEntry] = {}
        self._shared: dict[tuple[object, ...], bool] = {}
        self.hits = 0
        self.misses = 0

    def matches(
        self, selector: Selector, device_id: DeviceID, slice_generation: int, device: Device
    ) -> bool:
        """Like :meth:`Selector.matches`, cached. ``device_id.driver`` is the driver name."""
        with self._lock:
            entry = self._devices.get(device_id)
            if entry is not None and entry.generation == slice_generation:
                cached = entry.results.get(selector.expression)
                if cached is not None:
                    self.hits += 1
                    if isinstance(cached, CELEvaluationError):
                        raise cached
                    return cached
        keys = readable_keys(selector.expression)
        look = (
            (selector.expression, *visible(device, device_id.driver, keys))
            if keys is not None
            else None
        )
        with self._lock:
            if entry is None or entry.generation != slice_generation:
                entry = _DeviceEntry(slice_generation, None, {})
                self._devices[device_id] = entry
            shared = self._shared.get(look) if look is not None else None
            if shared is not None:
                self.hits += 1
                entry.results[selector.expression] = shared
                return shared
            self.misses += 1
        if entry.prepared is None:
            try:
                entry.prepared = device_input(device, device_id.driver)
            except CELEvaluationError as exc:
                entry.prepared = exc
        outcome: bool | CELEvaluationError
        if isinstance(entry.prepared, CELEvaluationError):
            outcome = selector.input_error(device.name, entry.prepared)
        else:
            try:
                outcome = selector.evaluate(entry.prepared, device.name)
            except CELEvaluationError as exc:
                outcome = exc
        with self._lock:
            entry.results[selector.expression] = outcome
            if look is not None and not isinstance(outcome, CELEvaluationError):
                self._shared[look] = outcome
        if isinstance(outcome, CELEvaluationError):
            raise outcome
        return outcome

    def __len__(self) -> int:
        """The number of cached results."""
        with self._lock:
            return sum(len(e.results) for e in self._devices.values())

    def discard(self, device_id: DeviceID) -> None:
        """Forget a device (its slice was deleted)."""
        with self._lock:
            self._devices.pop(device_id, None)

    def clear(self) -> None:
        with self._lock:
            self._devices.clear()
            self._shared.clear()

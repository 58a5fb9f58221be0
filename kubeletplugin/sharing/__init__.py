"""Sharing strategies: one module per ``sharing.strategy``, behind one interface.

The registry (:func:`strategy`) maps each name of the ``GpuConfig`` vocabulary
(:data:`driver.api.config.STRATEGIES`) to its implementation; it is the only place that
switches on a strategy's name. The interface and what it is given are in
:mod:`kubeletplugin.sharing.base`:

* ``hami-core`` — :mod:`kubeletplugin.sharing.hami_core` (HAMi-core, preloaded library);
* ``mps`` — :mod:`kubeletplugin.sharing.mps` (a CUDA MPS control daemon per claim and GPU;
  the daemons themselves are run by :mod:`kubeletplugin.mps`);
* ``none`` — :mod:`kubeletplugin.sharing.timeslicing` (time-slicing, no limits; the strategy
  of every exclusive device: :data:`UNLIMITED`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from driver.api.config import SharingStrategy
from kubeletplugin.mps import MpsDaemon
from kubeletplugin.sharing.base import (
    ContainerSet,
    DeviceAllocation,
    Edits,
    SharingPaths,
    Strategy,
    summed_limits,
)
from kubeletplugin.sharing.hami_core import HamiCore
from kubeletplugin.sharing.mps import Mps
from kubeletplugin.sharing.timeslicing import TimeSlicing

#: The strategy that sets no limits: that of an exclusive device, and the fallback of a
#: share of a dynamic-MIG GPU (its instance is the isolation).
UNLIMITED: Final[SharingStrategy] = TimeSlicing().name

_REGISTRY: Final[Mapping[SharingStrategy, Strategy]] = {
    s.name: s for s in (HamiCore(), Mps(), TimeSlicing())
}


def strategy(name: SharingStrategy) -> Strategy:
    """The implementation of ``sharing.strategy`` ``name``."""
    return _REGISTRY[name]


def daemons(
    claim_uid: str, allocations: Sequence[DeviceAllocation], paths: SharingPaths
) -> tuple[MpsDaemon, ...]:
    """Every daemon a claim's allocations need, each strategy asked for its own, sorted by
    directory."""
    by_strategy: dict[SharingStrategy, list[DeviceAllocation]] = {}
    for alloc in allocations:
        by_strategy.setdefault(alloc.strategy, []).append(alloc)
    found = (
        d
        for name, group in by_strategy.items()
        for d in strategy(name).daemons(claim_uid, group, paths)
    )
    return tuple(sorted(found, key=lambda d: str(d.directory)))


__all__ = [
    "UNLIMITED",
    "ContainerSet",
    "DeviceAllocation",
    "Edits",
    "SharingPaths",
    "Strategy",
    "daemons",
    "strategy",
    "summed_limits",
]

"""The ``none`` strategy: time-slicing, no limits.

The containers get their GPUs and nothing else: the GPU's own time-slicing shares it, nothing
bounds memory or compute. The strategy of every exclusive device and of every share of a
dynamic-MIG GPU (its MIG instance is the isolation); a share of a whole GPU uses it only where
the node's sharing policy (``--share-strategies``) allows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from driver.api.config import SharingStrategy
from kubeletplugin.mps import MpsDaemon
from kubeletplugin.sharing.base import ContainerSet, DeviceAllocation, Edits, SharingPaths

NAME: Final[SharingStrategy] = "none"


class TimeSlicing:
    """No limits: nothing to check, nothing to add, no daemon."""

    @property
    def name(self) -> SharingStrategy:
        return NAME

    def check(self, shares: ContainerSet, paths: SharingPaths) -> None:
        return None

    def edits(self, shares: ContainerSet, paths: SharingPaths) -> Edits:
        return Edits()

    def daemons(
        self, claim_uid: str, allocations: Sequence[DeviceAllocation], paths: SharingPaths
    ) -> tuple[MpsDaemon, ...]:
        return ()

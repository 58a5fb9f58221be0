"""Identifier types shared by every layer. ``NewType`` keeps names from being mixed up."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, NewType

DEFAULT_DRIVER_NAME: Final = "gpu.biaxial.dev"
"""The DRA driver name (a flag can change it); also the domain of unqualified attributes."""

UID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
"""What a Kubernetes object UID may look like here (a UUID in practice): a name part for files
and directories named after it, never a path."""

NodeName = NewType("NodeName", str)
DriverName = NewType("DriverName", str)
PoolName = NewType("PoolName", str)
DeviceName = NewType("DeviceName", str)
ClaimUID = NewType("ClaimUID", str)
PodUID = NewType("PodUID", str)


@dataclass(frozen=True, slots=True, order=True)
class DeviceID:
    """A device's cluster-wide identity: (driver, pool, device), ordered as upstream sorts."""

    driver: DriverName
    pool: PoolName
    device: DeviceName

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"

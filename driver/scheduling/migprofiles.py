"""MIG profiles by size: "the smallest profile that fits" a memory request, as claim requests.

HAMi's and Volcano's ``vgpu-mode: mig`` ask for a GPU memory amount, and expect the smallest
MIG partition that holds it. This module turns such an amount into a ``firstAvailable`` list of
subrequests, smallest profile first, for the bridge (or any dialect) to put in a claim:

* :class:`MigCatalog` lists the MIG profiles the cluster publishes (static partitions and
  dynamic-MIG placements alike: devices of the driver with ``type == "mig"``), each with the
  smallest and largest memory any device of that profile has (a profile name means slightly
  different memory on different GPU models) and its cores.
* :meth:`MigCatalog.fitting` gives the profiles at least one device of which holds the amount,
  smallest first (by memory, then cores, then name), at most 8 (the API's limit on
  ``firstAvailable``).
* :func:`smallest_profile_subrequests` builds the subrequests: class ``mig.biaxial.dev``, a
  selector on the profile and ``capacity.requests.memory`` set to the amount, which on an
  exclusive MIG device only filters (the device must have at least that much). The allocator
  takes the first subrequest that fits the node (upstream's ``firstAvailable`` rule), so each
  node gets its smallest fitting profile that it can still place; with dynamic MIG the scorer
  then picks the placement.

Pure: same input, same output; nothing is mutated. An amount no profile holds raises
:class:`~driver.api.errors.ManifestError` naming the largest profile.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from driver.api.errors import ManifestError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import ResourceSlice

MIG_CLASS: Final = "mig.biaxial.dev"
MAX_SUBREQUESTS: Final = 8  # firstAvailable limit (DeviceRequest)
MIB: Final = 1024 * 1024
_NOT_NAME: Final = re.compile(r"[^a-z0-9]")


@dataclass(frozen=True, slots=True)
class MigProfileSize:
    """One profile as the cluster publishes it."""

    name: str
    min_memory: int  # bytes, over every device of the profile
    max_memory: int
    cores: int  # percent of the GPU (the largest seen)


@dataclass(frozen=True, slots=True)
class MigCatalog:
    """The MIG profiles of the cluster, smallest first."""

    profiles: tuple[MigProfileSize, ...]

    @classmethod
    def from_slices(
        cls, slices: Iterable[ResourceSlice], driver: str = DEFAULT_DRIVER_NAME
    ) -> MigCatalog:
        seen: dict[str, tuple[int, int, int]] = {}
        for s in slices:
            if s.driver != driver:
                continue
            for device in s.devices:
                if device.attributes.get("type") != "mig":
                    continue
                profile = device.attributes.get("profile")
                memory = device.capacity.get("memory")
                if not isinstance(profile, str) or memory is None:
                    continue
                cores_cap = device.capacity.get("cores")
                cores = cores_cap.value.value() if cores_cap is not None else 0
                amount = memory.value.value()
                low, high, most = seen.get(profile, (amount, amount, cores))
                seen[profile] = (min(low, amount), max(high, amount), max(most, cores))
        profiles = (MigProfileSize(n, lo, hi, c) for n, (lo, hi, c) in seen.items())
        return cls(tuple(sorted(profiles, key=lambda p: (p.min_memory, p.cores, p.name))))

    def fitting(self, memory_bytes: int) -> tuple[MigProfileSize, ...]:
        """The profiles some device of which holds ``memory_bytes``, smallest first, at most
        :data:`MAX_SUBREQUESTS`."""
        return tuple(p for p in self.profiles if p.max_memory >= memory_bytes)[:MAX_SUBREQUESTS]


def smallest_profile_subrequests(
    memory_bytes: int,
    catalog: MigCatalog,
    *,
    driver: str = DEFAULT_DRIVER_NAME,
    device_class: str = MIG_CLASS,
    where: str = "",
) -> list[dict[str, Any]]:
    """``firstAvailable`` subrequests (API JSON) for "the smallest MIG profile holding
    ``memory_bytes``". Raises ManifestError (prefixed with ``where``) when none does."""
    if memory_bytes <= 0:
        raise ManifestError(f"{where}a MIG memory request must be positive, got {memory_bytes}")
    choices = catalog.fitting(memory_bytes)
    if not choices:
        largest = max(catalog.profiles, key=lambda p: p.max_memory, default=None)
        biggest = (
            f"the largest, {largest.name}, has {largest.max_memory // MIB} MiB"
            if largest is not None
            else "the cluster publishes no MIG devices"
        )
        raise ManifestError(
            f"{where}no MIG profile holds {memory_bytes // MIB} MiB of GPU memory ({biggest})"
        )
    mebibytes = -(-memory_bytes // MIB)
    return [
        {
            "name": f"mig-{_NOT_NAME.sub('', p.name.lower())}",
            "deviceClassName": device_class,
            "selectors": [
                {"cel": {"expression": f'device.attributes["{driver}"].profile == "{p.name}"'}}
            ],
            "capacity": {"requests": {"memory": f"{mebibytes}Mi"}},
        }
        for p in choices
    ]


__all__ = [
    "MAX_SUBREQUESTS",
    "MIG_CLASS",
    "MigCatalog",
    "MigProfileSize",
    "smallest_profile_subrequests",
]

"""Dynamic MIG geometry: which GPUs are partitioned on demand, and what each placement of a
MIG profile consumes of its GPU.

On a GPU where dynamic MIG is on, the node publishes every valid (profile, placement) as a
device, plus the whole GPU, and the GPU's MIG resources as a counter set they consume from
(DRA partitionable devices, KEP-4815); the allocator's counter rules then keep overlapping
choices apart. This module is the pure arithmetic of that; the device table, the slice
builder, Prepare and the scorer read it.

Contract:

* :class:`DynamicMigPolicy` says which GPUs the node *wants* dynamic (a plugin setting: off,
  every GPU, or GPU models by product name; a fake profile may declare GPUs by UUID).
  :func:`unusable_reason` says why a selected GPU cannot be: not MIG-capable, **MIG mode
  disabled** (biaxial never changes a GPU's MIG mode; the administrator enables it), no
  profile table, or no profile covering the whole GPU. :meth:`DynamicMigPolicy.dynamic` is
  true exactly when the GPU is selected and usable.
* :class:`MigGeometry` (``MigGeometry.of(gpu)``, cached) holds the counter set of one GPU:
  ``memory-slice-<i>`` (value 1 each, one per placement position), ``compute-slices`` (the
  full profile's compute slices) and one counter per media engine the GPU has and some
  profile takes (``decoders``, ``encoders``, ``jpeg-engines``, ``ofa-engines``; this is what
  keeps two ``+me`` instances apart). A placement consumes exactly its memory slices, its
  profile's compute slices and its engines; the whole GPU consumes everything.
* :func:`placements` lists every valid (profile, start) of a GPU in publishing order: by
  start, larger profiles first, then by name; :func:`still_placeable` those that still fit
  beside some taken ones, :func:`free_slices` the memory slices nothing covers (what the
  simulator's fragmentation and the plugin's metrics report).
* Everything is pure and deterministic; nothing here talks to NVML.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from driver.api.errors import ConfigError
from driver.discovery.gpus import GpuInfo, MigInfo, MigProfile

COUNTER_COMPUTE: Final = "compute-slices"
MEMORY_SLICE_PREFIX: Final = "memory-slice-"
ENGINE_COUNTERS: Final = (
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpeg-engines", "jpegs"),
    ("ofa-engines", "ofas"),
)
"""(counter name, :class:`MigProfile` field) of the media engines."""
MAX_COUNTERS: Final = 32  # counters per counter set and per consumption (API limit)
POLICY_OFF: Final = "off"
POLICY_ALL: Final = "all"


def memory_slice_counter(index: int) -> str:
    """``memory-slice-<i>``: placement position ``i`` of the GPU's memory."""
    return f"{MEMORY_SLICE_PREFIX}{index}"


def counter_set_name(minor: int) -> str:
    """The counter set of GPU ``minor``: ``gpu-<minor>-mig``."""
    return f"gpu-{minor}-mig"


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class DynamicMigPolicy:
    """Which GPUs the node partitions on demand (see the module docstring).

    ``everywhere``: every usable GPU; ``models``: GPUs whose product name is listed;
    ``gpus``: GPUs by UUID (what a fake profile declares).
    """

    everywhere: bool = False
    models: frozenset[str] = frozenset()
    gpus: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> DynamicMigPolicy:
        """``off`` (or empty), ``all``, or a comma-separated list of product names, e.g.
        ``NVIDIA A100-SXM4-80GB,NVIDIA H100 80GB HBM3``. Raises ConfigError on an empty
        model name."""
        value = text.strip()
        if value in ("", POLICY_OFF):
            return cls()
        if value == POLICY_ALL:
            return cls(everywhere=True)
        models = [m.strip() for m in value.split(",")]
        if any(not m for m in models):
            raise ConfigError(
                f"--dynamic-mig {text!r}: expected off, all, or a comma-separated list of GPU "
                "product names (as nvidia-smi -L prints them), without empty entries"
            )
        return cls(models=frozenset(models))

    @property
    def off(self) -> bool:
        return not (self.everywhere or self.models or self.gpus)

    def with_gpus(self, uuids: Iterable[str]) -> DynamicMigPolicy:
        """This policy plus the GPUs with these UUIDs."""
        return DynamicMigPolicy(self.everywhere, self.models, self.gpus | frozenset(uuids))

    def selects(self, gpu: GpuInfo) -> bool:
        """The node asks for dynamic MIG on this GPU (usable or not)."""
        return self.everywhere or gpu.product_name in self.models or gpu.uuid in self.gpus

    def dynamic(self, gpu: GpuInfo) -> bool:
        """Selected and usable: the GPU is published as counters and placements."""
        return self.selects(gpu) and unusable_reason(gpu) is None

    def describe(self) -> str:
        if self.off:
            return POLICY_OFF
        parts = ["all"] if self.everywhere else sorted(self.models)
        parts += [f"GPU {u}" for u in sorted(self.gpus)]
        return ", ".join(parts)


def unusable_reason(gpu: GpuInfo) -> str | None:
    """Why dynamic MIG cannot run on ``gpu`` (None when it can)."""
    if not gpu.mig_capable:
        return f"GPU {gpu.minor} ({gpu.product_name}) is not MIG-capable"
    if not gpu.mig_enabled:
        return (
            f"GPU {gpu.minor} ({gpu.product_name}) has MIG mode disabled; biaxial never changes "
            f"a GPU's MIG mode: enable it with `nvidia-smi -i {gpu.index} -mig 1` (a reset may "
            "be needed) to partition it on demand"
        )
    if not gpu.mig_profiles:
        return f"GPU {gpu.minor} ({gpu.product_name}): NVML reported no MIG profiles"
    geometry_problem = _full_profile(gpu.mig_profiles)
    if isinstance(geometry_problem, str):
        return f"GPU {gpu.minor} ({gpu.product_name}): {geometry_problem}"
    return None


# --------------------------------------------------------------------------- geometry


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """One valid (profile, start) of a GPU."""

    profile: MigProfile
    start: int

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.profile.size)

    def overlaps(self, start: int, size: int) -> bool:
        return self.start < start + size and start < self.start + self.profile.size


def _full_profile(profiles: Iterable[MigProfile]) -> MigProfile | str:
    """The profile that covers every memory slice from 0 (``7g.80gb``), or the problem."""
    table = list(profiles)
    span = max((p + prof.size for prof in table for p in prof.placements), default=0)
    full = [p for p in table if 0 in p.placements and p.size == span]
    if not full:
        return "the MIG profile table has no profile covering the whole GPU"
    return max(full, key=lambda p: (p.compute_slices, p.memory_bytes, p.name))


@dataclass(frozen=True, slots=True)
class MigGeometry:
    """The counter set of one dynamic-MIG GPU and what each placement consumes of it."""

    memory_slices: int
    full: MigProfile
    totals: Mapping[str, int]
    placements: tuple[MigPlacement, ...]
    _engines: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @staticmethod
    def of(gpu: GpuInfo) -> MigGeometry:
        """The geometry of a GPU with a usable profile table (ValueError otherwise)."""
        return MigGeometry.from_profiles(gpu.mig_profiles)

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def from_profiles(profiles: tuple[MigProfile, ...]) -> MigGeometry:
        """The geometry of a profile table (cached: every GPU of a model shares one)."""
        full = _full_profile(profiles)
        if isinstance(full, str):
            raise ValueError(full)  # noqa: TRY004 - a bad table (value), not a bad type
        engines = tuple(
            (counter, attr)
            for counter, attr in ENGINE_COUNTERS
            if getattr(full, attr) > 0 and any(getattr(p, attr) > 0 for p in profiles)
        )
        memory_slices = full.size
        if memory_slices + 1 + len(engines) > MAX_COUNTERS:
            raise ValueError(f"{memory_slices} memory slices do not fit a counter set")
        totals = {memory_slice_counter(i): 1 for i in range(memory_slices)}
        totals[COUNTER_COMPUTE] = full.compute_slices
        for counter, attr in engines:
            totals[counter] = getattr(full, attr)
        placements = sorted(
            (MigPlacement(p, s) for p in profiles for s in p.placements),
            key=lambda m: (m.start, -m.profile.size, -m.profile.compute_slices, m.profile.name),
        )
        return MigGeometry(
            memory_slices=memory_slices,
            full=full,
            totals=totals,
            placements=tuple(placements),
            _engines=engines,
        )

    def consumes(self, placement: MigPlacement) -> dict[str, int]:
        """What one placement takes of the counter set (the full one takes everything)."""
        out = {memory_slice_counter(i): 1 for i in placement.slices}
        out[COUNTER_COMPUTE] = placement.profile.compute_slices
        for counter, attr in self._engines:
            amount = getattr(placement.profile, attr)
            if amount:
                out[counter] = amount
        return out

    def whole(self) -> MigPlacement:
        """The full profile at placement 0: what backs the whole GPU on a dynamic GPU."""
        return MigPlacement(self.full, 0)


def still_placeable(
    geometry: MigGeometry, taken: Iterable[MigPlacement]
) -> tuple[MigPlacement, ...]:
    """The placements of ``geometry`` that still fit beside ``taken`` (counters: slots,
    compute slices, media engines), in publishing order."""
    left = dict(geometry.totals)
    for placement in taken:
        for counter, amount in geometry.consumes(placement).items():
            left[counter] -= amount
    return tuple(
        p
        for p in geometry.placements
        if all(left.get(c, 0) >= a for c, a in geometry.consumes(p).items())
    )


def free_slices(geometry: MigGeometry, taken: Iterable[MigPlacement]) -> int:
    """Memory slices no ``taken`` placement covers."""
    used = {s for p in taken for s in p.slices}
    return geometry.memory_slices - len(used)


def placements(gpu: GpuInfo) -> tuple[MigPlacement, ...]:
    """Every valid (profile, start) of a GPU, in publishing order (see the module docstring)."""
    return MigGeometry.of(gpu).placements


def instance_at(gpu: GpuInfo, profile: str, start: int) -> MigInfo | None:
    """The existing MIG instance of ``gpu`` at exactly this placement, if any."""
    for mig in gpu.mig_devices:
        if mig.start == start and mig.profile == profile:
            return mig
    return None


__all__ = [
    "COUNTER_COMPUTE",
    "MEMORY_SLICE_PREFIX",
    "DynamicMigPolicy",
    "MigGeometry",
    "MigPlacement",
    "counter_set_name",
    "free_slices",
    "instance_at",
    "memory_slice_counter",
    "placements",
    "still_placeable",
    "unusable_reason",
]

"""The interface of :mod:`kubeletplugin.sharing`: what every sharing strategy is given and gives.

A sharing strategy (``GpuConfig`` ``sharing.strategy``) decides how the containers of one
request (one *container set*: what the kubelet hands one container) are limited on the GPUs
they get. Each strategy is one module implementing :class:`Strategy`:

* :meth:`Strategy.check` refuses a container set the strategy cannot serve correctly (a MIG
  device, more GPUs than it serves per container, a node setting it needs and lacks) with a
  :class:`~driver.api.errors.PrepareError` naming the request;
* :meth:`Strategy.edits` is what it adds to every CDI device of the set: environment, mounts,
  and the writable host directories those mounts need to exist;
* :meth:`Strategy.daemons` is the MPS control daemons the claim needs for the allocations
  that use it (recorded in the checkpoint; the Preparer starts and stops them).

All three are pure (no I/O) and deterministic. The limits of a GPU are the sum of the claim's
shares on it (:func:`summed_limits`); which strategy an allocation uses was resolved before
(``GpuConfig``, the node's default, the node's policy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from driver.api.config import SharingStrategy
from driver.discovery.devices import NodeDevice
from kubeletplugin.mps import MpsDaemon

JSON = dict[str, Any]

MIB: Final = 1024 * 1024
FULL_CORES: Final = 100
DYNAMIC_HINT: Final = (
    " (on a dynamic-MIG GPU every device is a MIG instance; use sharing.strategy none)"
)


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """One allocation result of a claim on this node, with its sharing decision."""

    request: str  # "req" or "req/sub"
    target: NodeDevice  # from the node's device table
    strategy: SharingStrategy
    share_id: str | None = None
    memory_limit_bytes: int | None = None  # None: no memory limit (whole device)
    cores_percent: int | None = None  # None or 0: no compute limit
    admin_access: bool = False  # allocated for administrative access (upstream's adminAccess)


@dataclass(frozen=True, slots=True)
class SharingPaths:
    """Host paths the sharing edits mount into containers."""

    hami_core_library: Path | None
    hami_lock_dir: Path
    mps_root: Path
    # Test-only (with a fake GPU profile): the host directory holding stand-in device nodes
    # (``nvidia0``, ``nvidiactl``, ``nvidia-caps/...``); each CDI device node then names its
    # stand-in as ``hostPath`` (CDI 0.5.0), the container still sees ``/dev/...``.
    device_dir: Path | None = None


def summed_limits(
    allocations: Sequence[DeviceAllocation], memory_bytes: int
) -> tuple[int | None, int]:
    """The limits of several allocations on one GPU together: memory (``None`` when one of
    them is unlimited, else the sum, at most the GPU's ``memory_bytes``) and cores percent
    (the sum, at most 100)."""
    memory: int | None = None
    if all(a.memory_limit_bytes is not None for a in allocations):
        memory = min(sum(a.memory_limit_bytes or 0 for a in allocations), memory_bytes)
    cores = min(sum(a.cores_percent or 0 for a in allocations), FULL_CORES)
    return memory, cores


@dataclass(frozen=True, slots=True)
class ContainerSet:
    """The devices of one request of a claim, as one container sees them.

    ``targets`` holds one device per in-container GPU, in the in-container order (index ``i``
    is ``CUDA_VISIBLE_DEVICES`` ``i``); ``shares`` maps each target's container UUID to the
    claim's allocations on it (two shares of one GPU add up).
    """

    request: str
    claim_uid: str
    targets: tuple[NodeDevice, ...]
    shares: Mapping[str, tuple[DeviceAllocation, ...]]

    def limits(self, target: NodeDevice) -> tuple[int | None, int]:
        """(memory bytes or ``None``, cores percent) the set holds on ``target``."""
        return summed_limits(self.shares[target.container_uuid], target.memory_bytes)


@dataclass(frozen=True, slots=True)
class Edits:
    """What a strategy adds to each CDI device of a container set."""

    env: tuple[str, ...] = ()
    mounts: tuple[JSON, ...] = ()
    host_dirs: tuple[str, ...] = ()  # writable host directories the mounts need to exist


class Strategy(Protocol):
    """One sharing strategy (one module of :mod:`kubeletplugin.sharing`)."""

    @property
    def name(self) -> SharingStrategy:
        """The ``sharing.strategy`` value that selects it."""
        ...

    def check(self, shares: ContainerSet, paths: SharingPaths) -> None:
        """Raise :class:`~driver.api.errors.PrepareError` when the set cannot be served."""
        ...

    def edits(self, shares: ContainerSet, paths: SharingPaths) -> Edits:
        """Environment and mounts for each device of a checked set."""
        ...

    def daemons(
        self, claim_uid: str, allocations: Sequence[DeviceAllocation], paths: SharingPaths
    ) -> tuple[MpsDaemon, ...]:
        """The daemons the claim needs for ``allocations`` (those of this strategy)."""
        ...

"""The ``mps`` strategy: a CUDA MPS control daemon per claim and GPU, limits set on the daemon.

A container set under ``mps`` has exactly one GPU (one daemon serves one GPU per container)
and no MIG device. Its containers get ``CUDA_MPS_PIPE_DIRECTORY`` (the claim's own daemon's
pipe directory, mounted at :data:`MPS_CONTAINER_PIPE_DIR`), and, as client-side limits,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; the
same limits are set on the daemon itself (:class:`~kubeletplugin.mps.MpsDaemon`), which
:mod:`kubeletplugin.mps` starts, checks and stops for the Preparer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from driver.api.config import SharingStrategy, mps_device_count_error
from driver.api.errors import PrepareError
from kubeletplugin.mps import MpsDaemon, daemon_dir, pipe_dir
from kubeletplugin.sharing.base import (
    DYNAMIC_HINT,
    FULL_CORES,
    MIB,
    ContainerSet,
    DeviceAllocation,
    Edits,
    SharingPaths,
    summed_limits,
)

NAME: Final[SharingStrategy] = "mps"
MPS_CONTAINER_PIPE_DIR: Final = "/tmp/nvidia-mps"  # noqa: S108 - the path inside the container


class Mps:
    """CUDA MPS: one control daemon per claim and GPU."""

    @property
    def name(self) -> SharingStrategy:
        return NAME

    def check(self, shares: ContainerSet, paths: SharingPaths) -> None:
        if len(shares.targets) != 1:
            raise PrepareError(mps_device_count_error(shares.request, len(shares.targets)))
        (target,) = shares.targets
        if target.mig_backed:
            raise PrepareError(
                f"request {shares.request!r}: sharing.strategy mps is not supported on MIG "
                f"device {target.name!r}" + DYNAMIC_HINT * target.dynamic
            )

    def edits(self, shares: ContainerSet, paths: SharingPaths) -> Edits:
        (target,) = shares.targets
        memory, cores = shares.limits(target)
        env = [f"CUDA_MPS_PIPE_DIRECTORY={MPS_CONTAINER_PIPE_DIR}"]
        if memory is not None:
            env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={max(memory // MIB, 1)}M")
        if 0 < cores < FULL_CORES:
            env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={cores}")
        pipe = pipe_dir(daemon_dir(paths.mps_root, shares.claim_uid, target.name))
        mount = {
            "hostPath": str(pipe),
            "containerPath": MPS_CONTAINER_PIPE_DIR,
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
        return Edits(env=tuple(env), mounts=(mount,))

    def daemons(
        self, claim_uid: str, allocations: Sequence[DeviceAllocation], paths: SharingPaths
    ) -> tuple[MpsDaemon, ...]:
        """The claim's own daemons: one per GPU it shares with ``mps``, limited to what the
        claim reserved on that GPU (all its ``mps`` shares there together; a whole device
        under ``mps`` sets no memory limit). Sorted by directory."""
        by_gpu: dict[str, list[DeviceAllocation]] = {}
        for alloc in allocations:
            by_gpu.setdefault(alloc.target.uuid, []).append(alloc)
        daemons = []
        for uuid, group in by_gpu.items():
            target = group[0].target
            memory, cores = summed_limits(group, target.memory_bytes)
            daemons.append(
                MpsDaemon(
                    directory=daemon_dir(paths.mps_root, claim_uid, target.name),
                    gpu_uuid=uuid,
                    memory_bytes=memory,
                    cores=cores,
                )
            )
        return tuple(sorted(daemons, key=lambda d: str(d.directory)))

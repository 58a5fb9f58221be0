"""The ``hami-core`` strategy: HAMi-core (``libvgpu.so``, preloaded) limits each container GPU.

Per in-container GPU ``i``: ``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` when the set holds a
memory limit on it and ``CUDA_DEVICE_SM_LIMIT_<i>=<percent>`` when it holds 1..99 % of its
cores; with any limit, ``LD_PRELOAD`` of the library mounted read-only from the node and
HAMi-core's node-wide lock directory mounted writable (it must exist on the host). A set with
no limit gets nothing. Refused: MIG devices (the library limits whole GPUs), and limits when
the node has no library configured (a share never runs unlimited by mistake).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from driver.api.config import SharingStrategy
from driver.api.errors import PrepareError
from kubeletplugin.mps import MpsDaemon
from kubeletplugin.sharing.base import (
    DYNAMIC_HINT,
    FULL_CORES,
    MIB,
    ContainerSet,
    DeviceAllocation,
    Edits,
    SharingPaths,
)

NAME: Final[SharingStrategy] = "hami-core"
HAMI_CONTAINER_LIBRARY: Final = "/usr/local/vgpu/libvgpu.so"
HAMI_CONTAINER_LOCK_DIR: Final = "/tmp/vgpulock"  # noqa: S108 - HAMi-core's fixed lock path


def _limit_env(shares: ContainerSet) -> list[str]:
    out: list[str] = []
    for index, target in enumerate(shares.targets):
        memory, cores = shares.limits(target)
        if memory is not None:
            out.append(f"CUDA_DEVICE_MEMORY_LIMIT_{index}={max(memory // MIB, 1)}m")
        if 0 < cores < FULL_CORES:
            out.append(f"CUDA_DEVICE_SM_LIMIT_{index}={cores}")
    return out


class HamiCore:
    """HAMi-core: limits enforced inside the CUDA process by the preloaded library."""

    @property
    def name(self) -> SharingStrategy:
        return NAME

    def check(self, shares: ContainerSet, paths: SharingPaths) -> None:
        if any(t.mig_backed for t in shares.targets):
            raise PrepareError(
                f"request {shares.request!r}: sharing.strategy hami-core is not supported on "
                "MIG devices" + DYNAMIC_HINT * any(t.dynamic for t in shares.targets)
            )
        if paths.hami_core_library is None and _limit_env(shares):
            raise PrepareError(
                f"request {shares.request!r}: sharing.strategy hami-core needs the HAMi-core "
                "library, and no host path for libvgpu.so is configured on this node, or "
                "none was there when the kubelet plugin started (kubelet plugin setting "
                "hami_core_library_path; the chart installs it unless "
                "kubeletPlugin.installHamiCore is false)"
            )

    def edits(self, shares: ContainerSet, paths: SharingPaths) -> Edits:
        limit_env = _limit_env(shares)
        if not limit_env:
            return Edits()
        return Edits(
            env=(*limit_env, f"LD_PRELOAD={HAMI_CONTAINER_LIBRARY}"),
            mounts=(
                {
                    "hostPath": str(paths.hami_core_library),
                    "containerPath": HAMI_CONTAINER_LIBRARY,
                    "options": ["ro", "nosuid", "nodev", "bind"],
                },
                {
                    "hostPath": str(paths.hami_lock_dir),
                    "containerPath": HAMI_CONTAINER_LOCK_DIR,
                    "options": ["rw", "nosuid", "nodev", "bind"],
                },
            ),
            host_dirs=(str(paths.hami_lock_dir),),
        )

    def daemons(
        self, claim_uid: str, allocations: Sequence[DeviceAllocation], paths: SharingPaths
    ) -> tuple[MpsDaemon, ...]:
        return ()

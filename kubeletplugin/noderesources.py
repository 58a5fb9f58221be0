"""Legacy node resources (``--advertise-legacy-resources``): HAMi-style extended resources on
the Node, so schedulers and dashboards that only know ``nvidia.com/gpumem`` /
``nvidia.com/gpucores`` still see this node's GPUs.

Contract: :func:`legacy_resources` (pure) gives ``status.capacity`` for every discovered GPU
and ``status.allocatable`` for the healthy ones: ``nvidia.com/gpumem`` in MiB (whole MiB per
GPU, summed) and ``nvidia.com/gpucores`` 100 per GPU (MIG-enabled GPUs count with their whole
memory and cores). :func:`node_status_patch` wraps them in a JSON merge patch of the Node's
``status``; applying it twice is a no-op, so the plugin re-applies it on every inventory change
and periodically (the kubelet may rewrite node status on restart).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, Final

from driver.model import GpuInfo

GPUMEM: Final = "nvidia.com/gpumem"
GPUCORES: Final = "nvidia.com/gpucores"
CORES_PER_GPU: Final = 100
MIB: Final = 1024 * 1024


def _totals(gpus: Iterable[GpuInfo]) -> dict[str, str]:
    gpus = list(gpus)
    return {
        GPUMEM: str(sum(g.memory_bytes // MIB for g in gpus)),
        GPUCORES: str(CORES_PER_GPU * len(gpus)),
    }


def legacy_resources(
    gpus: Iterable[GpuInfo], unhealthy: Collection[str] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    """``(capacity, allocatable)``; ``unhealthy`` holds GPU UUIDs left out of allocatable."""
    gpus = list(gpus)
    return _totals(gpus), _totals(g for g in gpus if g.uuid not in unhealthy)


def node_status_patch(gpus: Iterable[GpuInfo], unhealthy: Collection[str] = ()) -> dict[str, Any]:
    capacity, allocatable = legacy_resources(gpus, unhealthy)
    return {"status": {"capacity": capacity, "allocatable": allocatable}}

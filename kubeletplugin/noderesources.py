"""Legacy node resources (``--advertise-legacy-resources``): HAMi-style extended resources on
the Node, so schedulers and dashboards that only know ``nvidia.com/gpumem`` /
``nvidia.com/gpucores`` still see this node's GPUs.

Contract: :func:`legacy_resources` (pure) gives, for the *healthy* discovered GPUs,
``nvidia.com/gpumem`` in MiB (whole MiB per GPU, summed) and ``nvidia.com/gpucores`` 100 per
GPU (a MIG-enabled GPU counts with its whole memory and cores). :func:`node_status_patch` puts
the same values in ``status.capacity`` and ``status.allocatable`` (JSON merge patch): the
kubelet recomputes allocatable as capacity for extended resources on its own status updates
(kubernetes/kubernetes#115190), so an unhealthy GPU has to leave capacity too, or the kubelet
would put it back. Applying the patch twice is a no-op; the plugin re-applies it on every
inventory or health change and periodically.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, Final

from driver.discovery.gpus import GpuInfo

GPUMEM: Final = "nvidia.com/gpumem"
GPUCORES: Final = "nvidia.com/gpucores"
CORES_PER_GPU: Final = 100
MIB: Final = 1024 * 1024


def legacy_resources(gpus: Iterable[GpuInfo], unhealthy: Collection[str] = ()) -> dict[str, str]:
    """The extended resources of the GPUs whose UUID is not in ``unhealthy``."""
    healthy = [g for g in gpus if g.uuid not in unhealthy]
    return {
        GPUMEM: str(sum(g.memory_bytes // MIB for g in healthy)),
        GPUCORES: str(CORES_PER_GPU * len(healthy)),
    }


def node_status_patch(gpus: Iterable[GpuInfo], unhealthy: Collection[str] = ()) -> dict[str, Any]:
    resources = legacy_resources(gpus, unhealthy)
    return {"status": {"capacity": resources, "allocatable": dict(resources)}}

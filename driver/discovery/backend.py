"""GPU discovery behind one Protocol, with a real (NVML) and a data-driven fake backend.

Contract:

* :func:`open_backend` returns a :class:`GpuBackend`. ``fake=None`` opens the real backend
  (``driver.discovery.real``, the only module that imports ``pynvml``, lazily); any other
  value names a built-in fake profile (``t4x4``, ``a10gx4``, ``a100-40gbx8``, ``a100-80gbx8``,
  ``h100-80gbx8``, and ``a100-80gbx8-dynmig`` / ``h100-80gbx8-dynmig``, which declare dynamic
  MIG) or the path of a profile YAML file.
* :meth:`GpuBackend.discover` returns every physical GPU as a
  :class:`driver.discovery.gpus.GpuInfo`, sorted by minor number, with its existing MIG
  partitions as :class:`driver.discovery.gpus.MigInfo` children sorted by placement start. It
  is a pure read: calling it twice gives equal results unless the hardware changed.
* :meth:`GpuBackend.wait_health_event` blocks for at most ``timeout_s`` seconds and returns the
  next :class:`HealthEvent`, or ``None`` on timeout. It is blocking on purpose (NVML's event
  wait is); async callers run it with ``asyncio.to_thread`` (:func:`next_health_event` does).
* :meth:`GpuBackend.create_mig` creates a MIG instance (GPU instance + compute instance) of a
  profile at an exact placement and returns it; :meth:`GpuBackend.destroy_mig` destroys one
  instance by UUID (False when it does not exist). Neither ever changes a GPU's MIG mode;
  failures are :class:`driver.api.errors.MigError`. Only the kubelet plugin's dynamic MIG
  calls them, and only for instances biaxial creates.
* :meth:`GpuBackend.close` releases the backend (NVML shutdown); it is idempotent. Backends
  are context managers.
* Every failure is a :class:`driver.api.errors.DiscoveryError` with a message that says what is
  wrong and what to do (for instance "use --fake PROFILE" on a machine without NVML).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol, Self, runtime_checkable

from driver.discovery.gpus import GpuInfo, HealthEvent, HealthEventKind, MigInfo

__all__ = [
    "GpuBackend",
    "HealthEvent",
    "HealthEventKind",
    "next_health_event",
    "open_backend",
]


@runtime_checkable
class GpuBackend(Protocol):
    """What the slice builder and the kubelet plugin need from GPU discovery."""

    def discover(self) -> tuple[GpuInfo, ...]:
        """Every physical GPU, sorted by minor number, with its MIG partitions."""
        ...

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        """Block up to ``timeout_s`` seconds for the next health event; ``None`` on timeout."""
        ...

    def create_mig(self, gpu_uuid: str, profile: str, start: int) -> MigInfo:
        """Create an instance of ``profile`` at placement ``start`` on a GPU in MIG mode."""
        ...

    def destroy_mig(self, gpu_uuid: str, mig_uuid: str) -> bool:
        """Destroy one instance by UUID; False when the GPU has no such instance."""
        ...

    def close(self) -> None:
        """Release the backend; idempotent."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...


async def next_health_event(backend: GpuBackend, timeout_s: float) -> HealthEvent | None:
    """Await the backend's next health event without blocking the event loop."""
    return await asyncio.to_thread(backend.wait_health_event, timeout_s)


def open_backend(
    fake: str | None = None, *, node_name: str = "", mig_state: Path | None = None
) -> GpuBackend:
    """Open the real NVML backend (``fake=None``) or a fake one from a profile name or file.

    ``node_name`` seeds the fake backend's deterministic UUIDs, so two fake nodes with the same
    profile still get different GPU UUIDs. ``mig_state``: the file the fake keeps its MIG
    instances in, so they outlive the process as NVML's do. The real backend ignores both.
    """
    if fake is None:
        from driver.discovery.real import NvmlBackend  # noqa: PLC0415 - keeps pynvml optional

        return NvmlBackend()
    from driver.discovery.fake import FakeBackend  # noqa: PLC0415 - symmetric with the real one

    return FakeBackend.from_profile(fake, node_name=node_name, state_file=mig_state)

"""Tests in ``tests/gpu/`` need a real NVIDIA GPU with NVML. Every one of them carries the
``gpu`` marker (added here if a test forgot it) and is skipped, with the reason NVML gave,
where no usable GPU exists: never a silent pass."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from driver.api.errors import DiscoveryError

HERE = Path(__file__).parent


@functools.cache
def nvml_unavailable_reason() -> str | None:
    """None when NVML initialises and reports at least one GPU, else why not."""
    from driver.discovery.real import NvmlBackend

    try:
        backend = NvmlBackend()
    except DiscoveryError as exc:
        return f"needs a real NVIDIA GPU with NVML: {exc}"
    backend.close()
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session", autouse=True)
def _require_gpu() -> None:
    """Session-scoped so it runs before any module-scoped fixture that opens NVML."""
    reason = nvml_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)

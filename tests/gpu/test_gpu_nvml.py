"""The real NVML backend on a real GPU: what it discovers is well-formed and consistent with
itself, the slices built from it validate strictly, and ``biaxial discover`` works without
``--fake``. Run on a GPU machine with ``pytest -m gpu tests/gpu``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from driver.discovery.backend import GpuBackend, open_backend
from driver.discovery.devices import DeviceTable
from driver.discovery.gpus import GpuInfo
from driver.discovery.mig import DynamicMigPolicy, unusable_reason
from driver.discovery.real import ARCHITECTURES, BRANDS, NvmlBackend
from driver.discovery.slices import build_slices, normalize_version
from tests.validate_manifests import validate_object

pytestmark = pytest.mark.gpu

BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@pytest.fixture(scope="module")
def gpus() -> tuple[GpuInfo, ...]:
    with open_backend(None) as backend:
        assert isinstance(backend, GpuBackend)
        return backend.discover()


def test_discovers_well_formed_gpus(gpus: tuple[GpuInfo, ...]) -> None:
    assert gpus
    assert [g.minor for g in gpus] == sorted(g.minor for g in gpus)
    assert sorted(g.index for g in gpus) == list(range(len(gpus)))
    assert len({g.uuid for g in gpus}) == len(gpus)
    for gpu in gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.product_name
        assert gpu.brand in BRANDS.values()
        assert gpu.architecture in {*ARCHITECTURES.values(), "Unknown"}
        assert re.fullmatch(r"\d+\.\d+", gpu.cuda_compute_capability)
        assert re.fullmatch(r"\d+\.\d+", gpu.cuda_driver_version)
        normalize_version(gpu.driver_version)  # publishable as semver
        assert gpu.memory_bytes > 1024**3
        assert gpu.multiprocessors > 0
        assert gpu.pci_bus_id is not None
        assert BDF.fullmatch(gpu.pci_bus_id)
        if gpu.pcie_root is not None:
            assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", gpu.pcie_root)
        assert gpu.numa_node is None or gpu.numa_node >= 0
        assert gpu.mig_capable or not gpu.mig_enabled


def test_mig_partitions_are_consistent(gpus: tuple[GpuInfo, ...]) -> None:
    for gpu in gpus:
        if not gpu.mig_enabled:
            assert gpu.mig_devices == ()
            continue
        placements: set[tuple[int, int]] = set()
        for mig in gpu.mig_devices:
            assert mig.uuid.startswith("MIG-")
            assert mig.parent_uuid == gpu.uuid
            assert mig.parent_minor == gpu.minor
            assert re.fullmatch(r"(\d+c\.)?\d+g\.\d+gb(\+me)?", mig.profile), mig.profile
            assert 0 < mig.memory_bytes < gpu.memory_bytes
            assert 0 < mig.multiprocessors <= gpu.multiprocessors
            placements.add((mig.start, mig.size))
        # Compute instances of one GPU instance share its placement; distinct GPU instances
        # never overlap.
        for a_start, a_size in placements:
            for b_start, b_size in placements - {(a_start, a_size)}:
                assert a_start + a_size <= b_start or b_start + b_size <= a_start


def test_mig_profile_tables_are_consistent_and_publishable(gpus: tuple[GpuInfo, ...]) -> None:
    """Read-only: the profile table NVML reports (MIG creation is tested with the fake backend
    only; nothing here changes a GPU)."""
    for gpu in gpus:
        if not gpu.mig_capable:
            assert gpu.mig_profiles == ()
            continue
        for profile in gpu.mig_profiles:
            assert profile.profile_id is not None
            assert profile.placements
            assert 0 < profile.memory_bytes <= gpu.memory_bytes
            assert 0 < profile.multiprocessors <= gpu.multiprocessors
            assert profile.compute_slices > 0
        if gpu.mig_enabled and unusable_reason(gpu) is None:
            # What dynamic MIG would publish for it validates like everything else.
            table = DeviceTable.from_gpus([gpu], DynamicMigPolicy(gpus=frozenset({gpu.uuid})))
            for resource_slice in build_slices(table, node_name="gpu-node", node_uid="uid"):
                for version in ("1.34", "1.37"):
                    assert validate_object(resource_slice.to_api(), version) == []


def test_discovery_is_stable(gpus: tuple[GpuInfo, ...]) -> None:
    with NvmlBackend() as backend:
        assert backend.discover() == gpus


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_real_slices_validate_strictly(gpus: tuple[GpuInfo, ...], version: str) -> None:
    for resource_slice in build_slices(gpus, node_name="gpu-node", node_uid="uid"):
        assert validate_object(resource_slice.to_api(), version) == []


def test_health_wait_times_out_quietly() -> None:
    with NvmlBackend() as backend:
        started = time.monotonic()
        event = backend.wait_health_event(0.2)
        assert time.monotonic() - started < 5
        assert event is None or event.uuid.startswith(("GPU-", "MIG-", ""))


def test_close_is_idempotent() -> None:
    backend = NvmlBackend()
    backend.close()
    backend.close()


def test_discover_command_uses_nvml() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "biaxial", "discover", "--node", "gpu-node", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    items = json.loads(run.stdout)["items"]
    assert items
    assert items[0]["spec"]["nodeName"] == "gpu-node"

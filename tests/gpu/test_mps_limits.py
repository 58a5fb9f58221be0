"""MPS limits on a real GPU: a claim prepared with ``sharing.strategy: mps`` and a memory share
gives its process a hard pinned-memory limit. A tiny CUDA driver-API program (ctypes on
libcuda, no framework) allocates within the share (succeeds) and beyond it (fails), and the
same program without the claim's environment allocates the larger block (so the failure is
the limit's doing). The limit is the claim's own daemon's: a client of that daemon that drops
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` from its environment is limited all the same. Skipped,
with the reason, where there is no GPU or no MPS control binary."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.discovery.backend import open_backend
from driver.discovery.gpus import GpuInfo
from kubeletplugin.mps import MpsManager, MpsSettings, daemon_dir
from kubeletplugin.prepare import ClaimRef, Preparer, PrepareSettings
from kubeletplugin.sharing.mps import MPS_CONTAINER_PIPE_DIR

pytestmark = pytest.mark.gpu

MIB = 1024 * 1024
SHARE_MIB = 512
SMALL_MIB = 128
BIG_MIB = 1024

# Allocates SMALL then BIG MiB on device 0 and prints the CUresult codes as JSON.
ALLOCATOR = """
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
small, big = (int(a) * 1024 * 1024 for a in sys.argv[1:3])
out = {"init": cuda.cuInit(0)}
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
out["device"] = cuda.cuDeviceGet(ctypes.byref(dev), 0)
out["context"] = cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
p1, p2 = ctypes.c_uint64(), ctypes.c_uint64()
out["small"] = cuda.cuMemAlloc_v2(ctypes.byref(p1), ctypes.c_size_t(small))
out["big"] = cuda.cuMemAlloc_v2(ctypes.byref(p2), ctypes.c_size_t(big))
print(json.dumps(out))
"""


def run_allocator(env: dict[str, str]) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-c", ALLOCATOR, str(SMALL_MIB), str(BIG_MIB)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def control_binary() -> str:
    path = shutil.which("nvidia-cuda-mps-control")
    if path is None:
        pytest.skip("needs nvidia-cuda-mps-control (the NVIDIA driver's MPS tools) on PATH")
    return path


@pytest.fixture
def gpu() -> GpuInfo:
    with open_backend() as backend:
        gpus = [g for g in backend.discover() if not g.mig_enabled]
    if not gpus:
        pytest.skip("needs a GPU without MIG enabled")
    return gpus[0]


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bx-mps-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_mps_pinned_memory_limit_is_enforced(gpu: GpuInfo, control_binary: str, root: Path) -> None:
    node = "gpu-node"
    claim: dict[str, Any] = {
        "metadata": {"namespace": "default", "name": "mps", "uid": "uid-mps"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.biaxial.dev",
                            "pool": node,
                            "device": f"gpu-{gpu.minor}",
                            "shareID": "share-1",
                            "consumedCapacity": {"memory": f"{SHARE_MIB}Mi", "cores": "50"},
                        }
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "opaque": {
                                "driver": "gpu.biaxial.dev",
                                "parameters": {
                                    "apiVersion": "gpu.biaxial.dev/v1alpha1",
                                    "kind": "GpuConfig",
                                    "sharing": {"strategy": "mps"},
                                },
                            },
                        }
                    ],
                }
            }
        },
    }

    async def get_claim(namespace: str, name: str) -> dict[str, Any]:
        return claim

    base_env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu.uuid}
    unlimited = run_allocator(base_env)
    assert unlimited == {"init": 0, "device": 0, "context": 0, "small": 0, "big": 0}, unlimited

    settings = PrepareSettings(
        node_name=node,
        state_dir=root / "state",
        cdi_dir=root / "cdi",
        mps_root=root / "mps",
        mps_control_binary=control_binary,
    )
    preparer = Preparer(settings, [gpu], get_claim)
    ref = ClaimRef(namespace="default", uid="uid-mps", name="mps")
    mps = MpsManager(MpsSettings(root=settings.mps_root, control_binary=control_binary))
    directory = daemon_dir(settings.mps_root, "uid-mps", f"gpu-{gpu.minor}")
    out = asyncio.run(preparer.prepare([ref]))
    try:
        assert out[ref.uid].error == ""
        assert mps.is_running(directory)
        spec = json.loads((settings.cdi_dir / "k8s.gpu.biaxial.dev-gpu_uid-mps.json").read_text())
        claim_env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        assert claim_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={SHARE_MIB}M"
        # Outside a container: the pipe directory is the mount's host side, and the GPU is
        # named by UUID instead of its in-container index.
        (mount,) = spec["devices"][0]["containerEdits"]["mounts"]
        assert claim_env["CUDA_MPS_PIPE_DIRECTORY"] == MPS_CONTAINER_PIPE_DIR
        limited = run_allocator(
            {
                **base_env,
                **claim_env,
                "CUDA_MPS_PIPE_DIRECTORY": mount["hostPath"],
                "CUDA_VISIBLE_DEVICES": gpu.uuid,
            }
        )
        assert limited["small"] == 0, limited
        assert limited["big"] != 0, f"allocating {BIG_MIB} MiB under a {SHARE_MIB} MiB limit"
        # The daemon sets the limit: a client that removes it from its environment keeps it.
        unset = {k: v for k, v in claim_env.items() if k != "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"}
        evading = run_allocator(
            {
                **base_env,
                **unset,
                "CUDA_MPS_PIPE_DIRECTORY": mount["hostPath"],
                "CUDA_VISIBLE_DEVICES": gpu.uuid,
            }
        )
        assert evading["small"] == 0, evading
        assert evading["big"] != 0, "the daemon's limit did not hold without the client's"
    finally:
        assert asyncio.run(preparer.unprepare([ref])) == {ref.uid: ""}
    assert not mps.is_running(directory)

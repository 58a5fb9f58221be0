"""Pure CDI spec computation (names, env, indices, device nodes, mounts, version) and the
atomic spec file writes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from driver.api.errors import PrepareError
from driver.discovery.devices import DeviceTable, NodeDevice
from kubeletplugin import cdi
from kubeletplugin.cdi import build_claim_spec, minimum_cdi_version
from kubeletplugin.sharing import DeviceAllocation, SharingPaths
from tests.unit.builders import gpu_info

DRIVER = "gpu.biaxial.dev"
UID = "a1b2c3d4-0000-4000-8000-000000000001"
MIB = 1024 * 1024
PATHS = SharingPaths(
    hami_core_library=Path("/opt/hami/libvgpu.so"),
    hami_lock_dir=Path("/tmp/vgpulock"),
    mps_root=Path("/run/biaxial/mps"),
)


def gpu(minor: int, pci: str = "") -> NodeDevice:
    """A whole GPU, as the node's device table has it."""
    device = DeviceTable.from_gpus([gpu_info(minor, pci=pci, memory_mib=16384)]).published_device(
        f"gpu-{minor}"
    )
    assert device is not None
    return device


MIG = DeviceTable.from_gpus([gpu_info(0, mig_starts=(0,))]).published[0]


def alloc(
    target: NodeDevice,
    request: str = "r0",
    *,
    strategy: Any = "none",
    memory_mib: int | None = None,
    cores: int | None = None,
    share: str | None = None,
) -> DeviceAllocation:
    return DeviceAllocation(
        request=request,
        target=target,
        strategy=strategy,
        share_id=share or ("s-" + target.name if memory_mib is not None else None),
        memory_limit_bytes=None if memory_mib is None else memory_mib * MIB,
        cores_percent=cores,
    )


def env_of(spec: dict[str, Any], index: int = 0) -> dict[str, str]:
    entries = spec["devices"][index]["containerEdits"]["env"]
    return dict(e.split("=", 1) for e in entries)


def test_names_kind_file_and_ids() -> None:
    result = build_claim_spec(DRIVER, UID, [alloc(gpu(0)), alloc(gpu(3))], PATHS)
    assert result.file_name == f"k8s.gpu.biaxial.dev-gpu_{UID}.json"
    assert result.spec["kind"] == "k8s.gpu.biaxial.dev/gpu"
    assert [d["name"] for d in result.spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-3"]
    assert result.cdi_device_ids == (
        (f"k8s.gpu.biaxial.dev/gpu={UID}-gpu-0",),
        (f"k8s.gpu.biaxial.dev/gpu={UID}-gpu-3",),
    )


def test_stand_in_device_nodes_are_host_paths_under_the_fake_device_dir() -> None:
    """--fake-device-dir (tests on a real node): each node names its stand-in as hostPath, the
    container path stays /dev/...; hostPath needs CDI 0.5.0."""
    paths = dataclasses.replace(PATHS, device_dir=Path("/tmp/n/dev"))
    spec = build_claim_spec(DRIVER, UID, [alloc(gpu(2)), alloc(MIG, request="r1")], paths).spec
    assert spec["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidiactl",
        "hostPath": "/tmp/n/dev/nvidiactl",
    }
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia2", "hostPath": "/tmp/n/dev/nvidia2"}
    ]
    caps = spec["devices"][1]["containerEdits"]["deviceNodes"][1]
    assert caps["hostPath"] == "/tmp/n/dev/" + caps["path"].removeprefix("/dev/")
    assert spec["cdiVersion"] == "0.5.0"


def test_device_nodes_per_device_and_control_nodes_spec_wide() -> None:
    spec = build_claim_spec(DRIVER, UID, [alloc(gpu(2)), alloc(MIG, request="r1")], PATHS).spec
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl"},
        {"path": "/dev/nvidia-uvm"},
        {"path": "/dev/nvidia-uvm-tools"},
    ]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia2"}]
    # A MIG partition uses its parent's device node and its GPU and compute instances'
    # capability nodes, without which the container cannot open it.
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0"},
        {"path": "/dev/nvidia-caps/nvidia-cap10"},
        {"path": "/dev/nvidia-caps/nvidia-cap11"},
    ]


def test_a_mig_device_without_known_capability_nodes_is_refused() -> None:
    assert MIG.mig is not None
    blind = dataclasses.replace(MIG, mig=dataclasses.replace(MIG.mig, caps=()))
    with pytest.raises(PrepareError, match=r"/dev/nvidia-caps nodes are unknown"):
        build_claim_spec(DRIVER, UID, [alloc(blind)], PATHS)


@pytest.mark.parametrize(
    ("targets", "visible", "cuda"),
    [
        ([gpu(0)], "GPU-0", "0"),
        # In-container order is PCI bus order, whatever the allocation order.
        ([gpu(1, "0000:81:00.0"), gpu(0, "0000:3b:00.0")], "GPU-0,GPU-1", "0,1"),
        ([gpu(5), gpu(2), gpu(7)], "GPU-2,GPU-5,GPU-7", "0,1,2"),
        ([MIG], "MIG-0-0", "0"),
    ],
)
def test_visible_devices_and_indices(targets: list[NodeDevice], visible: str, cuda: str) -> None:
    spec = build_claim_spec(DRIVER, UID, [alloc(t) for t in targets], PATHS).spec
    for index in range(len(targets)):
        env = env_of(spec, index)
        assert env["NVIDIA_VISIBLE_DEVICES"] == visible
        assert env["CUDA_VISIBLE_DEVICES"] == cuda
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_each_request_is_its_own_container_set() -> None:
    spec = build_claim_spec(
        DRIVER, UID, [alloc(gpu(0), "a"), alloc(gpu(1), "b"), alloc(gpu(2), "a")], PATHS
    ).spec
    assert env_of(spec, 0)["NVIDIA_VISIBLE_DEVICES"] == "GPU-0,GPU-2"
    assert env_of(spec, 1)["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert env_of(spec, 2) == env_of(spec, 0)


def test_subrequests_group_under_their_request() -> None:
    spec = build_claim_spec(
        DRIVER, UID, [alloc(gpu(0), "a/small"), alloc(gpu(1), "a/small")], PATHS
    ).spec
    assert env_of(spec, 1)["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_hami_core_limits_indexed_by_container_order_with_library_mount() -> None:
    allocations = [
        alloc(gpu(3), strategy="hami-core", memory_mib=4096, cores=30),
        alloc(gpu(1), strategy="hami-core", memory_mib=8000, cores=0),
    ]
    result = build_claim_spec(DRIVER, UID, allocations, PATHS)
    assert result.host_dirs == ("/tmp/vgpulock",)
    spec = result.spec
    env = env_of(spec)
    # gpu-1 sorts first by PCI bus ID, so it is index 0.
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "4096m"
    assert env["CUDA_DEVICE_SM_LIMIT_1"] == "30"
    assert "CUDA_DEVICE_SM_LIMIT_0" not in env  # 0 cores reserved: no throttling
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    assert spec["devices"][0]["containerEdits"]["mounts"] == [
        {
            "hostPath": "/opt/hami/libvgpu.so",
            "containerPath": "/usr/local/vgpu/libvgpu.so",
            "options": ["ro", "nosuid", "nodev", "bind"],
        },
        {
            "hostPath": "/tmp/vgpulock",
            "containerPath": "/tmp/vgpulock",
            "options": ["rw", "nosuid", "nodev", "bind"],
        },
    ]


def test_two_shares_of_one_gpu_in_one_request_add_up() -> None:
    allocations = [
        alloc(gpu(0), strategy="hami-core", memory_mib=1000, cores=10, share="s1"),
        alloc(gpu(0), strategy="hami-core", memory_mib=2000, cores=20, share="s2"),
    ]
    result = build_claim_spec(DRIVER, UID, allocations, PATHS)
    env = env_of(result.spec)
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_DEVICE_SM_LIMIT_0"] == "30"
    assert [d["name"] for d in result.spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-0-1"]


def test_hami_core_on_a_whole_gpu_sets_no_limits_and_needs_no_library() -> None:
    paths = SharingPaths(None, PATHS.hami_lock_dir, PATHS.mps_root)
    spec = build_claim_spec(DRIVER, UID, [alloc(gpu(0), strategy="hami-core")], paths).spec
    assert "LD_PRELOAD" not in env_of(spec)
    assert "mounts" not in spec["devices"][0]["containerEdits"]


def test_hami_core_share_without_library_is_refused() -> None:
    paths = SharingPaths(None, PATHS.hami_lock_dir, PATHS.mps_root)
    with pytest.raises(PrepareError, match=r"no host path for libvgpu\.so"):
        build_claim_spec(DRIVER, UID, [alloc(gpu(0), strategy="hami-core", memory_mib=100)], paths)


def test_mps_env_and_pipe_mount() -> None:
    spec = build_claim_spec(
        DRIVER, UID, [alloc(gpu(2), strategy="mps", memory_mib=6000, cores=25)], PATHS
    ).spec
    env = env_of(spec)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6000M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert spec["devices"][0]["containerEdits"]["mounts"] == [
        {
            # The claim's own daemon, under its UID: never another claim's pipe.
            "hostPath": f"/run/biaxial/mps/{UID}/gpu-2/pipe",
            "containerPath": "/tmp/nvidia-mps",
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
    ]


def test_mps_whole_gpu_has_no_limits() -> None:
    env = env_of(build_claim_spec(DRIVER, UID, [alloc(gpu(2), strategy="mps")], PATHS).spec)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"


@pytest.mark.parametrize(
    ("allocations", "message"),
    [
        ([alloc(gpu(0), strategy="mps"), alloc(gpu(1), strategy="mps")], "one GPU per container"),
        ([alloc(MIG, strategy="mps")], "not supported on MIG device"),
        ([alloc(MIG, strategy="hami-core")], "hami-core is not supported on MIG"),
        ([alloc(gpu(0), strategy="mps"), alloc(gpu(1))], "different sharing strategies"),
        ([], "no devices"),
    ],
)
def test_refused_combinations(allocations: list[DeviceAllocation], message: str) -> None:
    with pytest.raises(PrepareError, match=message):
        build_claim_spec(DRIVER, UID, allocations, PATHS)


def test_none_strategy_sets_no_limits() -> None:
    env = env_of(build_claim_spec(DRIVER, UID, [alloc(gpu(0), memory_mib=100)], PATHS).spec)
    assert set(env) == {"NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES"}


@pytest.mark.parametrize(
    ("uid", "version"),
    [("a1b2c3d4-0000-4000-8000-000000000001", "0.3.0"), ("1b2c3d4e-0000", "0.5.0")],
)
def test_cdi_version_is_the_minimum_the_content_needs(uid: str, version: str) -> None:
    assert build_claim_spec(DRIVER, uid, [alloc(gpu(0))], PATHS).spec["cdiVersion"] == version


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        ({"devices": [{"name": "a", "containerEdits": {}}]}, "0.3.0"),
        ({"devices": [{"name": "a", "containerEdits": {"mounts": [{"type": "x"}]}}]}, "0.4.0"),
        (
            {"devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"hostPath": "/x"}]}}]},
            "0.5.0",
        ),
        ({"annotations": {"a": "b"}, "devices": [{"name": "a"}]}, "0.6.0"),
        ({"devices": [{"name": "a", "containerEdits": {"additionalGids": [5]}}]}, "0.7.0"),
        ({"containerEdits": {"netDevices": [{"name": "n"}]}, "devices": [{"name": "a"}]}, "1.1.0"),
    ],
)
def test_minimum_cdi_version_table(spec: dict[str, Any], version: str) -> None:
    assert minimum_cdi_version(spec) == version


def test_pure_same_input_same_output() -> None:
    allocations = [alloc(gpu(1), "a", strategy="hami-core", memory_mib=10), alloc(gpu(0), "b")]
    assert build_claim_spec(DRIVER, UID, allocations, PATHS) == build_claim_spec(
        DRIVER, UID, allocations, PATHS
    )


def test_write_and_remove_spec_are_atomic_and_idempotent(tmp_path: Path) -> None:
    claim_spec = build_claim_spec(DRIVER, UID, [alloc(gpu(0))], PATHS)
    path = cdi.write_spec(tmp_path, claim_spec)
    assert json.loads(path.read_text()) == claim_spec.spec
    assert cdi.spec_present(tmp_path, claim_spec.file_name, claim_spec.spec)
    cdi.write_spec(tmp_path, claim_spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == [claim_spec.file_name]
    assert cdi.remove_spec(tmp_path, claim_spec.file_name)
    assert not cdi.remove_spec(tmp_path, claim_spec.file_name)
    assert not cdi.spec_present(tmp_path, claim_spec.file_name, claim_spec.spec)


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "spec.json"
    cdi.atomic_write(target, b"old")

    def crash(self: Path, other: Path) -> Path:
        raise OSError("disk gone")

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        cdi.atomic_write(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]

"""The Preparer against real files in a short temp dir, a fake MPS control program and an
in-memory claim getter: the transactional shell end to end."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.api.claims import DeviceClass, ResourceClaim
from driver.api.config import check_claim_config
from driver.api.errors import ConfigError, PrepareError
from driver.discovery.devices import DeviceTable
from driver.discovery.gpus import GpuInfo, MigInfo
from kubeletplugin import cdi
from kubeletplugin.checkpoint import Checkpoint, CheckpointStore, checksum
from kubeletplugin.mps import MpsDaemon, MpsManager, MpsSettings, daemon_dir
from kubeletplugin.prepare import (
    MAX_CLAIM_READS,
    ClaimRef,
    PreparedDevice,
    Preparer,
    PrepareResult,
    PrepareSettings,
    check_conflicts,
    plan_claim,
)
from tests import fake_mps

DRIVER = "gpu.biaxial.dev"
NODE = "gpu-t4"
MIB = 1024 * 1024
T4_MEMORY = 15360 * MIB
KIND = "k8s.gpu.biaxial.dev/gpu"


def t4(minor: int) -> GpuInfo:
    return GpuInfo(
        uuid=f"GPU-t4-{minor}",
        index=minor,
        minor=minor,
        product_name="Tesla T4",
        brand="Nvidia",
        architecture="Turing",
        cuda_compute_capability="7.5",
        driver_version="550.54.15",
        cuda_driver_version="12.4",
        memory_bytes=T4_MEMORY,
        multiprocessors=40,
        pci_bus_id=f"0000:{0x3B + minor:02x}:00.0",
    )


A100_MIG = GpuInfo(
    uuid="GPU-a100-4",
    index=4,
    minor=4,
    product_name="NVIDIA A100-SXM4-40GB",
    brand="Nvidia",
    architecture="Ampere",
    cuda_compute_capability="8.0",
    driver_version="550.54.15",
    cuda_driver_version="12.4",
    memory_bytes=40960 * MIB,
    multiprocessors=108,
    pci_bus_id="0000:90:00.0",
    mig_capable=True,
    mig_enabled=True,
    mig_devices=tuple(
        MigInfo(
            uuid=f"MIG-a100-{start}",
            profile="1g.5gb",
            start=start,
            size=1,
            memory_bytes=4864 * MIB,
            multiprocessors=14,
            parent_uuid="GPU-a100-4",
            parent_minor=4,
            gi_id=start + 1,
            ci_id=0,
            caps=(
                f"/dev/nvidia-caps/nvidia-cap{start * 2 + 1}",
                f"/dev/nvidia-caps/nvidia-cap{start * 2 + 2}",
            ),
        )
        for start in (0, 1)
    ),
)
GPUS = [t4(0), t4(1), t4(2), t4(3), A100_MIG]


class FakeApi:
    """Claims by (namespace, name), as the API would return them."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.failing: set[str] = set()
        self.gets = 0

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets += 1
        if name in self.failing:
            raise ConnectionError("connection refused")
        return self.claims.get((namespace, name))

    def add(
        self,
        name: str,
        results: list[dict[str, Any]],
        *,
        config: list[dict[str, Any]] | None = None,
        allocated: bool = True,
        namespace: str = "default",
    ) -> ClaimRef:
        uid = f"uid-{name}"
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {},
        }
        if allocated:
            claim["status"]["allocation"] = {
                "devices": {"results": results, "config": config or []}
            }
        self.claims[(namespace, name)] = claim
        return ClaimRef(namespace=namespace, uid=uid, name=name)


def result(
    device: str,
    request: str = "gpu",
    *,
    memory_mib: int | None = None,
    cores: int = 0,
    share: str | None = None,
    pool: str = NODE,
    driver: str = DRIVER,
    admin: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if admin:
        out["adminAccess"] = True
    if memory_mib is not None:
        out["shareID"] = share or f"share-{device}-{memory_mib}-{cores}"
        out["consumedCapacity"] = {"memory": f"{memory_mib}Mi", "cores": str(cores)}
    return out


def gpu_config(strategy: str, requests: list[str] | None = None) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": requests or [],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.biaxial.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": strategy},
            },
        },
    }


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        control = fake_mps.install(root)
        library = root / "libvgpu.so"
        library.write_bytes(b"\x7fELF")
        self.settings = PrepareSettings(
            driver_name=DRIVER,
            node_name=NODE,
            state_dir=root / "state",
            cdi_dir=root / "cdi",
            hami_core_library_path=library,
            hami_lock_dir=root / "vgpulock",
            mps_root=root / "mps",
            mps_control_binary=str(control),
            lock_timeout_s=10,
        )
        self.api = FakeApi()

    def preparer(self, boot_id: str = "boot-1", **overrides: Any) -> Preparer:
        settings = self.settings
        if overrides:
            settings = PrepareSettings(**{**_fields(settings), **overrides})
        return Preparer(settings, GPUS, self.api.get, boot_id=boot_id)

    def spec(self, ref: ClaimRef) -> dict[str, Any]:
        path = self.settings.cdi_dir / cdi.spec_file_name(DRIVER, ref.uid)
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded

    def spec_exists(self, ref: ClaimRef) -> bool:
        return (self.settings.cdi_dir / cdi.spec_file_name(DRIVER, ref.uid)).exists()

    def mps_dir(self, ref: ClaimRef, device: str = "gpu-0") -> Path:
        """The claim's own MPS daemon directory on one GPU."""
        return self.settings.mps_root / ref.uid / device

    def mps_running(self, ref: ClaimRef, device: str = "gpu-0") -> bool:
        return (self.mps_dir(ref, device) / "pipe" / "daemon").exists()

    def mps_calls(self, ref: ClaimRef, device: str = "gpu-0") -> list[str]:
        return fake_mps.calls(self.mps_dir(ref, device))


def _fields(settings: PrepareSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in PrepareSettings.__dataclass_fields__}


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="bx-", dir="/tmp"))
    try:
        yield Node(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def env(spec: dict[str, Any], index: int = 0) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["devices"][index]["containerEdits"]["env"])


# --------------------------------------------------------------------------- lifecycle


def test_prepare_spec_unprepare(node: Node) -> None:
    ref = node.api.add("train", [result("gpu-1", "a"), result("gpu-0", "a"), result("gpu-3", "b")])
    preparer = node.preparer()
    out = run(preparer.prepare([ref]))
    assert out == {
        ref.uid: PrepareResult(
            devices=(
                PreparedDevice(("a",), NODE, "gpu-1", (f"{KIND}={ref.uid}-gpu-1",), None),
                PreparedDevice(("a",), NODE, "gpu-0", (f"{KIND}={ref.uid}-gpu-0",), None),
                PreparedDevice(("b",), NODE, "gpu-3", (f"{KIND}={ref.uid}-gpu-3",), None),
            )
        )
    }
    spec = node.spec(ref)
    assert spec["kind"] == KIND
    assert spec["cdiVersion"] == "0.3.0"
    assert [d["name"] for d in spec["devices"]] == [
        f"{ref.uid}-gpu-1",
        f"{ref.uid}-gpu-0",
        f"{ref.uid}-gpu-3",
    ]
    assert env(spec, 0)["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-0,GPU-t4-1"
    assert env(spec, 0)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env(spec, 2)["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-3"
    assert spec["devices"][2]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia3"}]
    (prepared,) = preparer.prepared_claims()
    assert prepared.ref == ref
    assert prepared.completed

    assert run(preparer.unprepare([ref])) == {ref.uid: ""}
    assert not node.spec_exists(ref)
    assert preparer.prepared_claims() == ()
    assert CheckpointStore(node.settings.state_dir).load().claims == {}


def test_idempotent_prepare_and_unprepare(node: Node) -> None:
    ref = node.api.add("c", [result("gpu-2")])
    preparer = node.preparer()
    first = run(preparer.prepare([ref]))
    gets = node.api.gets
    assert run(preparer.prepare([ref])) == first
    assert node.api.gets == gets + 1
    # The spec vanished (someone cleaned /var/run/cdi): the next Prepare heals it.
    (node.settings.cdi_dir / cdi.spec_file_name(DRIVER, ref.uid)).unlink()
    assert run(preparer.prepare([ref])) == first
    assert node.spec_exists(ref)
    # The claim is gone from the API: a prepared claim still answers from the checkpoint.
    node.api.claims.clear()
    assert run(preparer.prepare([ref])) == first
    assert run(preparer.unprepare([ref])) == {ref.uid: ""}
    assert run(preparer.unprepare([ref])) == {ref.uid: ""}


def test_unprepare_of_an_unknown_claim_succeeds(node: Node) -> None:
    ref = ClaimRef(namespace="x", uid="never-seen", name="ghost")
    assert run(node.preparer().unprepare([ref])) == {"never-seen": ""}


def test_same_claim_twice_in_one_call(node: Node) -> None:
    ref = node.api.add("c", [result("gpu-0")])
    out = run(node.preparer().prepare([ref, ref]))
    assert list(out) == [ref.uid]
    assert not out[ref.uid].error


# --------------------------------------------------------------------------- per-claim errors


def test_per_claim_errors_do_not_fail_neighbours(node: Node) -> None:
    good = node.api.add("good", [result("gpu-0")])
    stale = node.api.add("stale", [result("gpu-1")])
    node.api.claims[("default", "stale")]["metadata"]["uid"] = "uid-recreated"
    other_pool = node.api.add("elsewhere", [result("gpu-1", pool="gpu-a10g")])
    unknown = node.api.add("unknown", [result("gpu-9")])
    pending = node.api.add("pending", [], allocated=False)
    foreign = node.api.add("foreign", [result("gpu-1", driver="other.example.com")])
    missing = ClaimRef(namespace="default", uid="uid-missing", name="missing")
    flaky = node.api.add("flaky", [result("gpu-1")])
    node.api.failing.add("flaky")
    bad_config = node.api.add("badcfg", [result("gpu-1")], config=[gpu_config("foo")])
    named = {
        "good": good,
        "stale": stale,
        "other": other_pool,
        "unknown": unknown,
        "pending": pending,
        "foreign": foreign,
        "missing": missing,
        "flaky": flaky,
        "cfg": bad_config,
    }
    out = run(node.preparer().prepare(list(named.values())))
    assert list(out) == [r.uid for r in named.values()]
    errors = {name: out[ref.uid].error for name, ref in named.items()}
    assert errors["good"] == ""
    assert out[good.uid].devices[0].device_name == "gpu-0"
    assert "UID mismatch" in errors["stale"]
    assert "uid-recreated" in errors["stale"]
    assert "pool 'gpu-a10g', not this node's pool 'gpu-t4'" in errors["other"]
    assert "unknown device 'gpu-9'" in errors["unknown"]
    assert "not allocated" in errors["pending"]
    assert "no devices of driver gpu.biaxial.dev" in errors["foreign"]
    assert "not found in the API" in errors["missing"]
    assert "ConnectionError: connection refused" in errors["flaky"]
    assert 'sharing.strategy: unknown value "foo"' in errors["cfg"]
    assert all(out[ref.uid].devices == () for name, ref in named.items() if name != "good")
    assert [p.name for p in node.settings.cdi_dir.iterdir()] == [
        cdi.spec_file_name(DRIVER, good.uid)
    ]


def test_malformed_allocations_get_a_clear_error_from_the_claim_model(node: Node) -> None:
    no_pool = node.api.add("nopool", [{"request": "gpu", "driver": DRIVER, "device": "gpu-0"}])
    bad_capacity = node.api.add(
        "badcap", [{**result("gpu-1", memory_mib=10), "consumedCapacity": {"memory": "lots"}}]
    )
    bad_config = node.api.add(
        "badcfg", [result("gpu-2")], config=[{"source": "FromClaim", "opaque": {"driver": ""}}]
    )
    good = node.api.add("good", [result("gpu-3")])
    out = run(node.preparer().prepare([no_pool, bad_capacity, bad_config, good]))
    assert "ResourceClaim default/nopool: status.allocation: devices.results[0]" in (
        out[no_pool.uid].error
    )
    assert "missing field 'pool'" in out[no_pool.uid].error
    assert "ResourceClaim default/badcap: status.allocation: devices.results[0]" in (
        out[bad_capacity.uid].error
    )
    assert "lots" in out[bad_capacity.uid].error
    assert "devices.config[0]: opaque config without a driver" in out[bad_config.uid].error
    assert out[good.uid].error == ""


def test_a_gpu_found_by_rediscovery_can_be_prepared(node: Node) -> None:
    ref = node.api.add("late", [result("gpu-3")])
    preparer = Preparer(node.settings, GPUS[:3], node.api.get, boot_id="boot-1")
    assert "unknown device 'gpu-3'" in run(preparer.prepare([ref]))[ref.uid].error
    preparer.observe_inventory(DeviceTable.from_gpus(GPUS))
    assert run(preparer.prepare([ref]))[ref.uid].error == ""


# --------------------------------------------------------------------------- device conflicts


def test_exclusive_device_held_by_another_claim_is_refused(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    first = node.api.add("first", [result("gpu-0")], namespace="team-a")
    second = node.api.add("second", [result("gpu-0")], namespace="team-b")
    preparer = node.preparer()
    assert not run(preparer.prepare([first]))[first.uid].error
    with caplog.at_level(logging.WARNING, logger="biaxial.kubeletplugin.prepare"):
        error = run(preparer.prepare([second]))[second.uid].error
    assert error == (
        "claim team-b/second (uid-second): device gpu-0 is already prepared for another claim"
    )
    # The error reaches team-b's pod events: it names none of team-a's objects. The node's
    # log (the administrator's) names the holder.
    assert "first" not in error
    assert "team-a" not in error
    assert "held by claim team-a/first (uid-first)" in caplog.text
    assert not node.spec_exists(second)
    # Once the holder is unprepared the device is free.
    run(preparer.unprepare([first]))
    assert not run(preparer.prepare([second]))[second.uid].error


def test_shares_within_capacity_are_accepted_and_over_capacity_refused(node: Node) -> None:
    preparer = node.preparer()
    a = node.api.add("a", [result("gpu-1", memory_mib=7500, cores=50)])
    b = node.api.add("b", [result("gpu-1", memory_mib=7500, cores=40)])
    c = node.api.add("c", [result("gpu-1", memory_mib=1000, cores=0)])
    d = node.api.add("d", [result("gpu-1", memory_mib=100, cores=20)])
    exclusive = node.api.add("whole", [result("gpu-1")])
    out = run(preparer.prepare([a, b, c, d, exclusive]))
    assert out[a.uid].error == out[b.uid].error == ""
    assert out[a.uid].devices[0].share_id == "share-gpu-1-7500-50"
    assert "would exceed its capacity (memory" in out[c.uid].error
    assert "cores 110 of 100" in out[d.uid].error
    assert "as a share; an exclusive allocation cannot join it" in out[exclusive.uid].error
    # Default for a share without config: hami-core limits.
    spec_env = env(node.spec(a))
    assert spec_env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "7500m"
    assert spec_env["CUDA_DEVICE_SM_LIMIT_0"] == "50"
    assert spec_env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    assert (node.root / "vgpulock").is_dir()  # the lock mount's host side exists
    # A share joining an exclusively held device is refused too.
    holder = node.api.add("holder", [result("gpu-2")])
    share = node.api.add("share", [result("gpu-2", memory_mib=10)])
    out = run(preparer.prepare([holder, share]))
    assert "device gpu-2 is already prepared for another claim" in out[share.uid].error
    assert "holder" not in out[share.uid].error


def test_admin_access_is_neither_blocked_nor_blocking(node: Node) -> None:
    """Upstream: a request with adminAccess "ignores all ordinary claims to the device with
    respect to access modes and any resource allocations" (DeviceRequest.adminAccess, and
    allocateDevice skips deviceInUse for it); kube-scheduler therefore allocates a busy device
    to a monitoring claim, and the node must prepare it rather than refuse it."""
    preparer = node.preparer()
    held = node.api.add("held", [result("gpu-0")], namespace="team-a")
    monitor = node.api.add("monitor", [result("gpu-0", admin=True)], namespace="ops")
    assert run(preparer.prepare([held]))[held.uid].error == ""
    assert run(preparer.prepare([monitor]))[monitor.uid].error == ""
    assert env(node.spec(monitor))["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-0"
    # Prepared first, an admin-access claim blocks nobody: an exclusive claim and shares join.
    watcher = node.api.add("watcher", [result("gpu-1", admin=True)], namespace="ops")
    whole = node.api.add("whole", [result("gpu-1")])
    assert run(preparer.prepare([watcher, whole]))[whole.uid].error == ""
    spy = node.api.add("spy", [result("gpu-2", memory_mib=15360, admin=True)], namespace="ops")
    share = node.api.add("share", [result("gpu-2", memory_mib=15360, cores=100)])
    out = run(preparer.prepare([spy, share]))
    assert out[spy.uid].error == out[share.uid].error == ""  # its capacity is not counted
    # Ordinary claims still conflict with each other.
    late = node.api.add("late", [result("gpu-1")])
    assert "already prepared for another claim" in run(preparer.prepare([late]))[late.uid].error
    run(preparer.unprepare([held, monitor, watcher, whole, spy, share]))
    assert CheckpointStore(node.settings.state_dir).load().claims == {}


def test_full_gpu_and_its_mig_partitions(node: Node) -> None:
    preparer = node.preparer()
    mig0 = node.api.add("mig0", [result("gpu-4-mig-1g5gb-0")])
    mig1 = node.api.add("mig1", [result("gpu-4-mig-1g5gb-1")])
    whole = node.api.add("whole", [result("gpu-4")])
    out = run(preparer.prepare([mig0, mig1, whole]))
    assert out[mig0.uid].error == out[mig1.uid].error == ""
    # A GPU in MIG mode is published as its partitions only (the device table): its whole
    # device is nobody's to prepare.
    assert "unknown device 'gpu-4'" in out[whole.uid].error
    spec = node.spec(mig1)
    assert env(spec)["NVIDIA_VISIBLE_DEVICES"] == "MIG-a100-1"
    # The parent's node and the partition's GPU and compute instance capability nodes.
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia4"},
        {"path": "/dev/nvidia-caps/nvidia-cap3"},
        {"path": "/dev/nvidia-caps/nvidia-cap4"},
    ]
    mps_on_mig = node.api.add("mpsmig", [result("gpu-4-mig-1g5gb-0")], config=[gpu_config("mps")])
    run(preparer.unprepare([mig0]))
    assert (
        "not supported on MIG device" in run(preparer.prepare([mps_on_mig]))[mps_on_mig.uid].error
    )


def test_a_partition_overlapping_a_whole_gpu_prepared_before_mig_mode_is_refused(
    node: Node,
) -> None:
    # The whole GPU was prepared while MIG was off; the plugin restarts after MIG was enabled.
    before_mig = dataclasses.replace(A100_MIG, mig_enabled=False, mig_devices=())
    whole = node.api.add("whole", [result("gpu-4")])
    earlier = Preparer(node.settings, [*GPUS[:4], before_mig], node.api.get, boot_id="boot-1")
    assert run(earlier.prepare([whole]))[whole.uid].error == ""
    mig0 = node.api.add("mig0", [result("gpu-4-mig-1g5gb-0")])
    error = run(node.preparer().prepare([mig0]))[mig0.uid].error
    assert "device gpu-4-mig-1g5gb-0 overlaps gpu-4 on the same GPU" in error
    assert error.endswith("which is prepared for another claim")
    assert "whole" not in error


def test_two_plugin_instances_never_prepare_one_device_twice(node: Node) -> None:
    refs = [node.api.add(f"c{i}", [result("gpu-3")]) for i in range(6)]

    async def both() -> list[dict[str, PrepareResult]]:
        first, second = node.preparer(), node.preparer()
        return list(
            await asyncio.gather(
                *((first if i % 2 else second).prepare([ref]) for i, ref in enumerate(refs))
            )
        )

    outcomes = [o for out in run(both()) for o in out.values()]
    assert sum(1 for o in outcomes if not o.error) == 1
    assert sum(1 for o in outcomes if "already prepared" in o.error) == 5


# --------------------------------------------------------------------------- sharing


def test_each_mps_claim_has_its_own_daemon_with_its_limits_set_on_the_daemon(
    node: Node,
) -> None:
    """Measured before: limits came only from the client's own environment, and one control
    pipe per GPU was writable by every tenant on it. NVIDIA's DRA driver runs a control daemon
    per claim with the limits set on the daemon; so does biaxial now."""
    preparer = node.preparer()
    cfg = [gpu_config("mps")]
    a = node.api.add("a", [result("gpu-0", memory_mib=4000, cores=30)], config=cfg)
    b = node.api.add("b", [result("gpu-0", memory_mib=2000, cores=0)], config=cfg)
    two = node.api.add(  # two shares of gpu-0 in one claim: one daemon, their sum
        "two",
        [result("gpu-0", "x", memory_mib=1000, cores=10), result("gpu-0", "y", memory_mib=500)],
        config=cfg,
    )
    out = run(preparer.prepare([a, b, two]))
    assert [out[r.uid].error for r in (a, b, two)] == ["", "", ""]
    for ref in (a, b, two):
        assert node.mps_running(ref)
        mount = node.spec(ref)["devices"][0]["containerEdits"]["mounts"][0]
        assert mount["hostPath"] == str(node.mps_dir(ref) / "pipe")  # its own pipe only
    assert node.mps_calls(a) == [
        "-d",
        "set_default_device_pinned_mem_limit GPU-t4-0 4000M",
        "set_default_active_thread_percentage 30",
    ]
    assert node.mps_calls(b) == ["-d", "set_default_device_pinned_mem_limit GPU-t4-0 2000M"]
    assert node.mps_calls(two) == [
        "-d",
        "set_default_device_pinned_mem_limit GPU-t4-0 1500M",
        "set_default_active_thread_percentage 10",
    ]
    spec_env = env(node.spec(a))  # the client's environment still carries them too
    assert spec_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4000M"
    assert spec_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    stored = CheckpointStore(node.settings.state_dir).load().claims[a.uid].mps_daemons
    assert [(d.directory, d.memory_bytes, d.cores) for d in stored] == [
        (node.mps_dir(a), 4000 * MIB, 30)
    ]
    # Unprepare stops the claim's daemon and removes its pipes; the others keep theirs.
    run(preparer.unprepare([a]))
    assert not node.mps_dir(a).exists()
    assert not (node.settings.mps_root / a.uid).exists()
    assert node.mps_running(b)
    run(preparer.unprepare([b, two]))
    assert list(node.settings.mps_root.iterdir()) == []


def test_start_stops_mps_daemons_no_prepared_claim_uses(node: Node) -> None:
    """Cleaned up at start: a daemon whose claim was released while the plugin was down (or
    whose record is gone), and an older plugin's per-GPU daemon no claim uses any more. A
    per-GPU daemon a migrated claim still uses is kept."""
    preparer = node.preparer()
    kept = node.api.add("kept", [result("gpu-1", memory_mib=100)], config=[gpu_config("mps")])
    assert run(preparer.prepare([kept]))[kept.uid].error == ""
    manager = MpsManager(
        MpsSettings(root=node.settings.mps_root, control_binary=node.settings.mps_control_binary)
    )
    orphan = MpsDaemon(directory=daemon_dir(node.settings.mps_root, "uid-gone", "gpu-2"),
                       gpu_uuid="GPU-t4-2")  # fmt: skip
    legacy = MpsDaemon(directory=node.settings.mps_root / "GPU-t4-3", gpu_uuid="GPU-t4-3")
    for daemon in (orphan, legacy):
        manager.ensure_running(daemon)
    run(node.preparer().recover())
    assert node.mps_running(kept, "gpu-1")
    assert not orphan.directory.parent.exists()
    assert not legacy.directory.exists()


def test_failed_mps_start_rolls_the_claim_back(node: Node) -> None:
    preparer = node.preparer(mps_control_binary=str(node.root / "absent"))
    ref = node.api.add("a", [result("gpu-0", memory_mib=10)], config=[gpu_config("mps")])
    error = run(preparer.prepare([ref]))[ref.uid].error
    assert "control binary" in error
    assert "not found" in error
    assert not node.spec_exists(ref)
    assert CheckpointStore(node.settings.state_dir).load().claims == {}


def test_share_default_without_hami_library_is_refused_unless_default_is_none(
    node: Node,
) -> None:
    ref = node.api.add("a", [result("gpu-0", memory_mib=10)])
    refused = node.preparer(hami_core_library_path=None)
    assert "no host path for libvgpu.so" in run(refused.prepare([ref]))[ref.uid].error
    allowed = node.preparer(
        hami_core_library_path=None,
        default_sharing_strategy="none",
        share_strategies=("hami-core", "mps", "none"),
    )
    assert not run(allowed.prepare([ref]))[ref.uid].error
    assert "LD_PRELOAD" not in env(node.spec(ref))


def test_claim_reads_are_bounded(node: Node) -> None:
    """Measured before (issue 29, item 7): one GET per claim, all at once, however many claims
    a call names. Now at most MAX_CLAIM_READS are in flight, and every claim is still read."""
    refs = [node.api.add(f"c{i}", [result(f"gpu-{i % 4}", memory_mib=10)]) for i in range(40)]
    in_flight, most = 0, 0

    async def get(namespace: str, name: str) -> dict[str, Any] | None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        for _ in range(3):
            await asyncio.sleep(0)  # a yield (no time passes): let the other reads start
        in_flight -= 1
        return await node.api.get(namespace, name)

    preparer = Preparer(node.settings, GPUS, get, boot_id="boot-1")
    run(preparer.prepare(refs))
    assert most == MAX_CLAIM_READS
    assert node.api.gets == len(refs)


def test_the_nodes_sharing_policy_holds_whatever_the_class_allows(node: Node) -> None:
    """Measured before (issue 29, item 5): a share under a class with no policy, or one that
    allows ``none``, ran without limits. The node refuses any strategy outside
    ``--share-strategies`` for a share (default: hami-core, mps), nothing written; a whole
    GPU is not a share and is prepared."""
    lax = {**gpu_config("none"), "source": "FromClass"}
    lax["opaque"]["parameters"]["sharing"]["allowedStrategies"] = ["hami-core", "none"]
    share = node.api.add("share", [result("gpu-0", memory_mib=1024)], config=[lax])
    unconfigured = node.api.add(
        "plain", [result("gpu-1", memory_mib=1024)], config=[gpu_config("none")]
    )
    whole = node.api.add("whole", [result("gpu-2")], config=[lax])
    out = run(node.preparer().prepare([share, unconfigured, whole]))
    for ref, device in ((share, "gpu-0"), (unconfigured, "gpu-1")):
        assert out[ref.uid].error == (
            f"claim default/{ref.name} ({ref.uid}) request 'gpu' device '{device}': "
            'sharing.strategy "none" is not allowed for a GPU share on node gpu-t4 by the '
            """node's sharing policy (--share-strategies: "hami-core", "mps")"""
        )
        assert not node.spec_exists(ref)
    assert out[whole.uid].error == ""
    assert sorted(CheckpointStore(node.settings.state_dir).load().claims) == [whole.uid]
    time_slicing = node.preparer(share_strategies=("hami-core", "mps", "none"))
    assert run(time_slicing.prepare([share]))[share.uid].error == ""


def test_class_config_applies_and_claim_config_overrides(node: Node) -> None:
    class_cfg = {**gpu_config("none"), "source": "FromClass"}
    ref = node.api.add(
        "a",
        [result("gpu-0", "x", memory_mib=100), result("gpu-1", "y", memory_mib=100)],
        config=[class_cfg, gpu_config("hami-core", ["y"])],
    )
    run(node.preparer(share_strategies=("hami-core", "none")).prepare([ref]))
    spec = node.spec(ref)
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env(spec, 0)
    assert env(spec, 1)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "100m"


def test_the_class_sharing_policy_holds_against_the_claims_own_config(node: Node) -> None:
    """The administrator's class fixes hami-core for shares: a claim asking for none on a
    1 Gi share is refused (nothing written), one naming no strategy gets hami-core's limits,
    in the words the scheduler uses before allocating."""
    policy = {**gpu_config("hami-core"), "source": "FromClass"}
    policy["opaque"]["parameters"]["sharing"]["allowedStrategies"] = ["hami-core"]
    weakened = node.api.add(
        "weak", [result("gpu-0", memory_mib=1024)], config=[policy, gpu_config("none")]
    )
    plain = node.api.add("plain", [result("gpu-0", memory_mib=1024)], config=[policy])
    out = run(node.preparer().prepare([weakened, plain]))
    error = out[weakened.uid].error
    assert error == (
        "claim default/weak (uid-weak): allocation.devices.config[1] (FromClaim) "
        "opaque.parameters: sharing.strategy: \"none\" is not allowed for request 'gpu' by "
        'the DeviceClass\'s sharing policy (sharing.allowedStrategies: "hami-core")'
    )
    assert not node.spec_exists(weakened)
    assert out[plain.uid].error == ""
    assert env(node.spec(plain))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
    # The scheduler refuses the same claim before allocating, in the same words.
    raw = node.api.claims[("default", "weak")]
    raw["spec"]["devices"] = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
        "config": [{"opaque": gpu_config("none")["opaque"]}],
    }
    del raw["status"]
    gpu_class = DeviceClass.from_api(
        {
            "metadata": {"name": DRIVER},
            "spec": {"config": [{"opaque": policy["opaque"]}]},
        }
    )
    with pytest.raises(ConfigError) as info:
        check_claim_config(ResourceClaim.from_api(raw), {DRIVER: gpu_class}, DRIVER)
    words = "sharing.strategy: "
    assert error[error.index(words) :] == str(info.value)[str(info.value).index(words) :]


# --------------------------------------------------------------------------- crashes, reboots


class Crash(BaseException):
    """The process dies here (nothing below this frame runs)."""


def test_crash_between_the_phases_is_rolled_back_then_redone(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = node.api.add("a", [result("gpu-0", memory_mib=4000)], config=[gpu_config("mps")])

    def die(*_: object) -> None:
        raise Crash

    monkeypatch.setattr(cdi, "write_spec", die)
    with pytest.raises(Crash):
        run(node.preparer().prepare([ref]))
    monkeypatch.undo()
    stored = CheckpointStore(node.settings.state_dir).load()
    assert stored.claims[ref.uid].state == "PrepareStarted"

    # A new plugin process: its first call (for another claim) rolls the crashed one back.
    other = node.api.add("b", [result("gpu-0")])
    out = run(node.preparer().prepare([other]))
    assert not out[other.uid].error  # gpu-0 is free again
    assert ref.uid not in CheckpointStore(node.settings.state_dir).load().claims
    run(node.preparer().unprepare([other]))

    # The kubelet retries the crashed claim: it is prepared from scratch.
    out = run(node.preparer().prepare([ref]))
    assert not out[ref.uid].error
    assert node.spec_exists(ref)
    assert node.mps_running(ref)


def test_crash_after_cdi_write_cleans_the_spec_on_rollback(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = node.api.add("a", [result("gpu-0")])
    real_write = cdi.write_spec

    def write_then_die(cdi_dir: Path, claim_spec: cdi.ClaimSpec) -> Path:
        real_write(cdi_dir, claim_spec)
        raise Crash

    monkeypatch.setattr(cdi, "write_spec", write_then_die)
    with pytest.raises(Crash):
        run(node.preparer().prepare([ref]))
    monkeypatch.undo()
    assert node.spec_exists(ref)
    run(node.preparer().recover())
    assert not node.spec_exists(ref)
    assert CheckpointStore(node.settings.state_dir).load().claims == {}


def test_reboot_reprepares_from_the_checkpoint(node: Node) -> None:
    cfg = [gpu_config("mps")]
    ref = node.api.add("a", [result("gpu-2", memory_mib=2048, cores=10)], config=cfg)
    first = run(node.preparer(boot_id="boot-1").prepare([ref]))
    before = node.spec(ref)
    # Reboot: /var/run/cdi and the MPS daemons are gone; the API is unreachable.
    shutil.rmtree(node.settings.cdi_dir)
    (node.mps_dir(ref, "gpu-2") / "pipe" / "daemon").unlink()
    node.api.claims.clear()
    rebooted = node.preparer(boot_id="boot-2")
    run(rebooted.recover())
    assert node.spec(ref) == before
    assert node.mps_running(ref, "gpu-2")
    # Restarted with its limits set again.
    assert (
        node.mps_calls(ref, "gpu-2").count("set_default_device_pinned_mem_limit GPU-t4-2 2048M")
        == 2
    )
    assert CheckpointStore(node.settings.state_dir).load().boot_id == "boot-2"
    assert run(rebooted.prepare([ref])) == first


# --------------------------------------------------------------------------- corrupt checkpoint


def test_corrupt_checkpoint_refuses_prepare_lets_unprepare_proceed_and_keeps_the_file(
    node: Node,
) -> None:
    """Measured before: a corrupt checkpoint refused Unprepare too, so pods could not finish
    terminating. Now Prepare stays refused (devices cannot be proven free), Unprepare undoes
    what it can without the file and succeeds, and the file's state is reported on every
    read, so a repair is noticed."""
    held = node.api.add("held", [result("gpu-0", memory_mib=100)], config=[gpu_config("mps")])
    run(node.preparer().prepare([held]))
    assert node.mps_running(held)
    path = node.settings.state_dir / "checkpoint.json"
    content = path.read_bytes()[:-30]
    path.write_bytes(content)
    states: list[str | None] = []
    newcomer = node.api.add("new", [result("gpu-1")])
    preparer = Preparer(
        node.settings, GPUS, node.api.get, boot_id="boot-1", on_checkpoint=states.append
    )
    error = run(preparer.prepare([newcomer]))[newcomer.uid].error
    assert str(path) in error
    assert "devices cannot be proven free" in error
    assert path.read_bytes() == content
    assert list(node.settings.state_dir.glob("checkpoint.json.corrupt-*"))
    assert preparer.checkpoint_error == error
    assert states == [error]  # reported once, however often it is read
    # Unprepare proceeds: the spec and the claim's own MPS daemon are gone, the pod can end.
    assert run(preparer.unprepare([held])) == {held.uid: ""}
    assert not node.spec_exists(held)
    assert not node.mps_dir(held).exists()
    assert states == [error]
    # The administrator removes the file (no GPU pod left on the node): the next read says
    # so, and Prepare works again.
    path.unlink()
    assert run(preparer.prepare([newcomer]))[newcomer.uid].error == ""
    assert states == [error, None]
    assert preparer.checkpoint_error is None


def test_release_stale_keeps_a_claim_the_kubelet_asked_for_since(node: Node) -> None:
    preparer = node.preparer()
    ref = node.api.add("a", [result("gpu-0")])
    assert run(preparer.prepare([ref]))[ref.uid].error == ""
    looked_stale = time.monotonic()
    assert run(preparer.prepare([ref]))[ref.uid].error == ""  # the kubelet asks again
    assert run(preparer.release_stale(ref.uid, "gone", looked_stale)) is None
    assert node.spec_exists(ref)
    released = run(preparer.release_stale(ref.uid, "gone", time.monotonic()))
    assert released is not None
    assert released.uid == ref.uid
    assert not node.spec_exists(ref)
    assert CheckpointStore(node.settings.state_dir).load().claims == {}
    assert run(preparer.release_stale(ref.uid, "gone", time.monotonic())) is None  # done


# --------------------------------------------------------------------------- over HTTP


def http_claim_getter(api_client: Any) -> Any:
    """A ClaimGetter that reads raw claim JSON over HTTP, as the plugin does."""
    from kubernetes.client import ResourceV1Api
    from kubernetes.client.exceptions import ApiException

    resource = ResourceV1Api(api_client)

    def read(namespace: str, name: str) -> dict[str, Any] | None:
        try:
            response = resource.read_namespaced_resource_claim(
                name, namespace, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        loaded: dict[str, Any] = json.loads(response.data)
        return loaded

    async def get(namespace: str, name: str) -> dict[str, Any] | None:
        return await asyncio.to_thread(read, namespace, name)

    return get


def api_claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.biaxial.dev"}}]
            }
        },
    }


def allocation(device: str) -> dict[str, Any]:
    return {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    }


def test_claims_read_over_http_from_the_api_emulator(
    node: Node, emulator: Any, api_client: Any
) -> None:
    created = emulator.create(api_claim("web"))
    emulator.update_status("ResourceClaim", "web", allocation("gpu-1"), namespace="default")
    ref = ClaimRef(namespace="default", uid=created["metadata"]["uid"], name="web")
    unallocated = emulator.create(api_claim("idle"))
    idle = ClaimRef(namespace="default", uid=unallocated["metadata"]["uid"], name="idle")
    preparer = Preparer(node.settings, GPUS, http_claim_getter(api_client), boot_id="b")

    out = run(preparer.prepare([ref, idle]))
    assert out[ref.uid].error == ""
    assert out[ref.uid].devices[0].cdi_device_ids == (f"{KIND}={ref.uid}-gpu-1",)
    assert "not allocated" in out[idle.uid].error
    assert env(node.spec(ref))["NVIDIA_VISIBLE_DEVICES"] == "GPU-t4-1"

    # Deleted and recreated under the same name: the kubelet's stale UID is refused...
    emulator.delete("ResourceClaim", "web", namespace="default")
    emulator.create(api_claim("web"))
    emulator.update_status("ResourceClaim", "web", allocation("gpu-2"), namespace="default")
    stale = ClaimRef(namespace="default", uid="not-" + ref.uid, name="web")
    assert "UID mismatch" in run(preparer.prepare([stale]))[stale.uid].error
    # ...and the old claim, gone from the API, still unprepares from the checkpoint.
    assert run(preparer.unprepare([ref])) == {ref.uid: ""}
    assert not node.spec_exists(ref)


def test_lock_held_too_long_fails_every_claim_with_the_reason(node: Node) -> None:
    from filelock import FileLock

    ref = node.api.add("a", [result("gpu-0")])
    other = node.api.add("b", [result("gpu-1")])
    preparer = node.preparer(lock_timeout_s=0.2)
    node.settings.state_dir.mkdir(parents=True)
    with FileLock(node.settings.state_dir / "serialize.lock", thread_local=False):
        out = run(preparer.prepare([ref, other]))
        assert list(out) == [ref.uid, other.uid]
        assert all("held" in r.error and "serialize.lock" in r.error for r in out.values())
        assert "retry" in run(preparer.unprepare([ref]))[ref.uid]
    assert not run(preparer.prepare([ref]))[ref.uid].error


def test_claims_from_a_v1_checkpoint_are_reprepared_and_unprepared(node: Node) -> None:
    def v1_entry(name: str, device: str, spec_file: str | None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "namespace": "default",
            "name": name,
            "devices": [{"requestNames": ["gpu"], "pool": NODE, "device": device}],
        }
        if spec_file is not None:
            entry["cdiSpecFile"] = spec_file
        return entry

    kept = node.api.add("kept", [result("gpu-0")])
    spec_file = cdi.spec_file_name(DRIVER, kept.uid)
    data = {
        "preparedClaims": {
            kept.uid: v1_entry("kept", "gpu-0", spec_file),
            "uid-old": v1_entry("old", "gpu-1", None),
        }
    }
    node.settings.state_dir.mkdir(parents=True)
    (node.settings.state_dir / "checkpoint.json").write_text(
        json.dumps({"version": 1, "checksum": checksum(data), "data": data})
    )
    preparer = node.preparer()
    # gpu-1 is held by the migrated claim: refused until it is unprepared.
    blocked = node.api.add("new", [result("gpu-1")])
    assert (
        "already prepared for another claim" in run(preparer.prepare([blocked]))[blocked.uid].error
    )
    # The v1 record has no spec content: Prepare plans it again from the API.
    out = run(preparer.prepare([kept]))
    assert out[kept.uid].error == ""
    assert node.spec_exists(kept)
    old = ClaimRef(namespace="default", uid="uid-old", name="old")
    assert run(preparer.unprepare([old])) == {"uid-old": ""}
    assert not run(preparer.prepare([blocked]))[blocked.uid].error
    stored = CheckpointStore(node.settings.state_dir).load()
    assert sorted(stored.claims) == sorted([kept.uid, blocked.uid])


KILLED_CHILD = """
import asyncio, json, sys, time
from pathlib import Path
from driver.discovery.gpus import GpuInfo
from kubeletplugin import cdi
from kubeletplugin.prepare import ClaimRef, Preparer, PrepareSettings

root, claim = Path(sys.argv[1]), json.loads(sys.argv[2])
real_write = cdi.write_spec

def write_then_hang(cdi_dir, spec):
    real_write(cdi_dir, spec)
    print("spec written", flush=True)
    time.sleep(60)  # killed here, before PrepareCompleted

cdi.write_spec = write_then_hang

async def get(namespace, name):
    return claim

settings = PrepareSettings(
    node_name="gpu-t4", state_dir=root / "state", cdi_dir=root / "cdi", mps_root=root / "mps"
)
gpu = GpuInfo(uuid="GPU-t4-0", index=0, minor=0, product_name="Tesla T4", brand="Nvidia",
              architecture="Turing", cuda_compute_capability="7.5", driver_version="550.54.15",
              cuda_driver_version="12.4", memory_bytes=15360 << 20, multiprocessors=40)
ref = ClaimRef(namespace="default", uid=claim["metadata"]["uid"], name="a")
asyncio.run(Preparer(settings, [gpu], get, boot_id="boot-1").prepare([ref]))
"""


def test_process_killed_between_the_phases(node: Node) -> None:
    ref = node.api.add("a", [result("gpu-0")])
    claim = node.api.claims[("default", "a")]
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_CHILD, str(node.root), json.dumps(claim)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "spec written"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
    assert node.spec_exists(ref)
    stored = CheckpointStore(node.settings.state_dir).load()
    assert stored.claims[ref.uid].state == "PrepareStarted"
    # The restarted plugin finishes the job: the crashed attempt is rolled back, the kubelet's
    # retry prepares the claim again, and the result is complete.
    restarted = node.preparer()
    run(restarted.recover())
    assert not node.spec_exists(ref)
    out = run(restarted.prepare([ref]))
    assert out[ref.uid].error == ""
    assert node.spec_exists(ref)
    assert CheckpointStore(node.settings.state_dir).load().claims[ref.uid].state == (
        "PrepareCompleted"
    )


# --------------------------------------------------------------------------- invariants

_ALLOCS = st.lists(
    st.tuples(
        st.sampled_from(["gpu-0", "gpu-1"]),
        st.one_of(st.none(), st.integers(1, 16000)),  # None: exclusive; else MiB of a share
        st.integers(0, 100),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(allocs=_ALLOCS, release=st.lists(st.integers(0, 11), max_size=4))
def test_accepted_plans_never_double_book_or_exceed_capacity(
    allocs: list[tuple[str, int | None, int]], release: list[int]
) -> None:
    prep_settings = PrepareSettings(
        node_name=NODE,
        state_dir=Path("/nonexistent"),
        default_sharing_strategy="none",
        share_strategies=("none",),
    )
    targets = DeviceTable.from_gpus(GPUS)
    checkpoint = Checkpoint()
    for i, (device, memory_mib, cores) in enumerate(allocs):
        if i in release and checkpoint.claims:
            checkpoint = checkpoint.without_claim(min(checkpoint.claims))
        res = result(device, memory_mib=memory_mib, cores=cores if memory_mib else 0)
        claim = {
            "metadata": {"name": f"c{i}", "namespace": "default", "uid": f"u{i}"},
            "status": {"allocation": {"devices": {"results": [res]}}},
        }
        ref = ClaimRef(namespace="default", uid=f"u{i}", name=f"c{i}")
        try:
            plan = plan_claim(ref, claim, prep_settings, targets)  # refuses > 15360 MiB
            check_conflicts(plan, checkpoint, targets)
        except PrepareError:
            continue  # refused: nothing recorded
        checkpoint = checkpoint.with_claim(plan.record("PrepareCompleted"))
        for name in ("gpu-0", "gpu-1"):
            held = [d for r in checkpoint.claims.values() for d in r.devices if d.device == name]
            if any(d.exclusive for d in held):
                assert len(held) == 1
            assert sum(d.memory_bytes for d in held) <= T4_MEMORY
            assert sum(d.cores for d in held if not d.exclusive) <= 100


# ----------------------------------------------------------------- same words as the scheduler


@pytest.mark.parametrize(
    ("results", "config", "count", "words"),
    [
        ([result("gpu-0", memory_mib=10)], gpu_config("bogus"), 1, "sharing.strategy: "),
        (
            [result("gpu-0", memory_mib=10), result("gpu-1", memory_mib=10)],
            gpu_config("mps", ["gpu"]),
            2,
            "request 'gpu': sharing.strategy mps",
        ),
    ],
    ids=["bad-strategy", "mps-on-two-gpus"],
)
def test_the_scheduler_refuses_in_prepares_words(
    node: Node, results: list[dict[str, Any]], config: dict[str, Any], count: int, words: str
) -> None:
    ref = node.api.add("c", results, config=[config])
    refused = run(node.preparer().prepare([ref]))[ref.uid].error
    # The same claim before allocation, as the scheduler sees it.
    raw = node.api.claims[("default", "c")]
    raw["spec"]["devices"] = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": count}}],
        "config": [{k: v for k, v in config.items() if k != "source"}],
    }
    del raw["status"]
    with pytest.raises(ConfigError) as info:
        check_claim_config(ResourceClaim.from_api(raw), {}, DRIVER)
    scheduler = str(info.value)
    assert words in refused
    assert refused[refused.index(words) :] == scheduler[scheduler.index(words) :]


def test_the_node_holds_its_share_cap_against_any_allocator(node: Node) -> None:
    """The scheduler respects the published ``shares`` capacity; the node checks the same cap
    at Prepare, for allocations written by anything."""
    preparer = node.preparer(max_shares_per_gpu=2)
    refs = [node.api.add(f"s{i}", [result("gpu-0", memory_mib=100)]) for i in range(3)]
    out = run(preparer.prepare(refs))
    assert out[refs[0].uid].error == out[refs[1].uid].error == ""
    assert out[refs[2].uid].error == (
        "claim default/s2 (uid-s2): device gpu-0 would have 3 shares prepared; this node "
        "allows at most 2 per GPU (its published shares capacity)"
    )
    # Two shares of one claim count twice, as the allocator counts them.
    double = node.api.add(
        "double", [result("gpu-1", "a", memory_mib=10), result("gpu-1", "b", memory_mib=10)]
    )
    assert run(preparer.prepare([double]))[double.uid].error == ""
    third = node.api.add("third", [result("gpu-1", memory_mib=10)])
    assert "would have 3 shares" in run(preparer.prepare([third]))[third.uid].error
    run(preparer.unprepare([refs[0]]))
    assert run(preparer.prepare([refs[2]]))[refs[2].uid].error == ""

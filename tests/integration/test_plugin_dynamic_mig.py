"""Dynamic MIG in the live plugin: the real ``biaxial kubelet-plugin`` process with the fake
NVML backend (``--fake-gpus a100-80gbx8-dynmig``) against the API emulator, driven by a fake
kubelet. The fake's MIG instances live in ``<state-dir>/fake-nvml-mig.json``, so they outlive
the process as NVML's outlive a plugin restart; the tests read that file to see what exists.

Acceptance: Prepare creates and Unprepare destroys; a crash between creation and the checkpoint
converges without a leaked instance; a restart re-creates missing instances of prepared
claims; foreign instances are never touched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from driver.discovery.fake import FakeBackend
from tests.emulator.server import Emulator
from tests.integration.fake_kubelet import (
    FakeKubelet,
    PluginProcess,
    allocated_claim,
    node_cluster,
    scratch_dir,
    wait,
)
from tests.validate_manifests import DEFAULT_VERSIONS, validate_object

NODE = "node-mig"
DRIVER = "gpu.biaxial.dev"
PROFILE = "a100-80gbx8-dynmig"


@pytest.fixture
def root() -> Iterator[Path]:
    with scratch_dir("bxm") as path:
        yield path


@pytest.fixture
def cluster(root: Path) -> Iterator[tuple[Emulator, Path]]:
    with node_cluster(root, NODE) as running:
        yield running


def start(root: Path, kubeconfig: Path) -> PluginProcess:
    return PluginProcess(root, kubeconfig, node=NODE, profile=PROFILE).start()


def nvml(plugin: PluginProcess) -> dict[str, list[dict[str, Any]]]:
    """The fake NVML's instances per GPU UUID (empty before the first change)."""
    path = plugin.state_dir / "fake-nvml-mig.json"
    if not path.exists():
        return {}
    instances: dict[str, list[dict[str, Any]]] = json.loads(path.read_text())["instances"]
    return instances


def live(plugin: PluginProcess) -> list[tuple[int, str, int, str]]:
    """(GPU minor, profile, start, UUID) of every instance."""
    return sorted(
        (m["parent_minor"], m["profile"], m["start"], m["uuid"])
        for migs in nvml(plugin).values()
        for m in migs
    )


def recorded(plugin: PluginProcess) -> set[str]:
    checkpoint = json.loads((plugin.state_dir / "checkpoint.json").read_text())
    return {m["uuid"] for c in checkpoint["data"]["claims"].values() for m in c["mig"]}


def result(device: str) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}


def spec_env(plugin: PluginProcess, uid: str) -> dict[str, str]:
    spec = json.loads((plugin.cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{uid}.json").read_text())
    return dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])


def published(emulator: Emulator) -> list[dict[str, Any]]:
    """The node's pool once every slice of its generation is there (else empty)."""
    slices = sorted(
        (s for s in emulator.list("resourceslices") if s["spec"]["nodeName"] == NODE),
        key=lambda s: s["metadata"]["name"],
    )
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    if len(counts) != 1 or len(generations) != 1 or counts != {len(slices)}:
        return []
    return slices


def test_the_pool_publishes_counters_and_every_placement(
    root: Path, cluster: tuple[Emulator, Path]
) -> None:
    emulator, kubeconfig = cluster
    plugin = start(root, kubeconfig)
    try:
        slices = wait(lambda: published(emulator), what="the pool")
        names = [d["name"] for s in slices for d in s["spec"].get("devices") or ()]
        assert len(names) == 8 * 26
        assert "gpu-3-mig-1g10gbme-5" in names
        sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters") or ()]
        assert sets == [f"gpu-{i}-mig" for i in range(8)]
        for item in slices:
            for version in DEFAULT_VERSIONS:
                assert validate_object(item, version) == []
    finally:
        assert plugin.stop() == 0, plugin.log()


def test_prepare_creates_unprepare_destroys_and_restarts_recreate(
    root: Path, cluster: tuple[Emulator, Path]
) -> None:
    emulator, kubeconfig = cluster
    plugin = start(root, kubeconfig)
    try:
        with FakeKubelet(plugin.registration_socket) as kubelet:
            kubelet.notify(registered=True)
            dra = kubelet.dra()
            claim = allocated_claim(emulator, "nb", [result("gpu-2-mig-3g40gb-4")])
            out = dra.prepare([claim])[claim[1]]
            assert out.error == "", plugin.log()
            ((minor, profile, start_, uuid),) = live(plugin)
            assert (minor, profile, start_) == (2, "3g.40gb", 4)
            assert spec_env(plugin, claim[1])["NVIDIA_VISIBLE_DEVICES"] == uuid
            assert recorded(plugin) == {uuid}
        assert plugin.stop() == 0, plugin.log()
        # A GPU reset took the instance away while the plugin was down.
        (plugin.state_dir / "fake-nvml-mig.json").unlink()
        plugin = start(root, kubeconfig)
        ((_, _, _, remade),) = wait(lambda: live(plugin), what="the instance re-created")
        assert remade != uuid
        assert spec_env(plugin, claim[1])["NVIDIA_VISIBLE_DEVICES"] == remade
        with FakeKubelet(plugin.registration_socket) as kubelet:
            kubelet.notify(registered=True)
            dra = kubelet.dra()
            assert dra.prepare([claim])[claim[1]].error == ""
            assert dra.unprepare([claim]) == {claim[1]: ""}
        assert live(plugin) == []
    finally:
        plugin.stop()


def test_a_crash_between_creation_and_checkpoint_leaks_nothing(
    root: Path, cluster: tuple[Emulator, Path]
) -> None:
    emulator, kubeconfig = cluster
    plugin = start(root, kubeconfig)
    try:
        with FakeKubelet(plugin.registration_socket) as kubelet:
            kubelet.notify(registered=True)
            claim = allocated_claim(emulator, "crash", [result("gpu-5-mig-2g20gb-4")])
            plugin.inject("mig-crash", 0)
            wait(lambda: not list((plugin.state_dir / "fake-inject").glob("*.json")))
            with pytest.raises(grpc.RpcError):  # the process died mid-call
                kubelet.dra().prepare([claim])
        assert plugin.proc is not None
        assert plugin.proc.wait(10) == 137
        ((_, profile, _, orphan),) = live(plugin)  # created, never recorded
        assert profile == "2g.20gb"
        assert orphan not in recorded(plugin)
        plugin = start(root, kubeconfig)  # the DaemonSet restarts it
        wait(lambda: not live(plugin), what="the orphan destroyed at start-up")
        with FakeKubelet(plugin.registration_socket) as kubelet:
            kubelet.notify(registered=True)
            assert kubelet.dra().prepare([claim])[claim[1]].error == ""  # the kubelet retries
            ((_, _, _, made),) = live(plugin)
            assert made != orphan
            assert recorded(plugin) == {made}
    finally:
        plugin.stop()


def test_foreign_instances_are_untouched_and_block_their_placements(
    root: Path, cluster: tuple[Emulator, Path]
) -> None:
    emulator, kubeconfig = cluster
    # An administrator's static partition on GPU 1, made before the plugin starts.
    plugin = PluginProcess(root, kubeconfig, node=NODE, profile=PROFILE)
    admin = FakeBackend.from_profile(
        PROFILE, node_name=NODE, state_file=plugin.state_dir / "fake-nvml-mig.json"
    )
    foreign = admin.create_mig(admin.discover()[1].uuid, "4g.40gb", 0)
    plugin.start()
    try:
        slices = wait(lambda: published(emulator), what="the pool")
        names = {d["name"] for s in slices for d in s["spec"].get("devices") or ()}
        assert "gpu-1" not in names
        assert "gpu-1-mig-4g40gb-0" not in names
        assert "gpu-1-mig-3g40gb-4" in names
        with FakeKubelet(plugin.registration_socket) as kubelet:
            kubelet.notify(registered=True)
            dra = kubelet.dra()
            claim = allocated_claim(emulator, "beside", [result("gpu-1-mig-3g40gb-4")])
            assert dra.prepare([claim])[claim[1]].error == ""
            plugin.inject("mig-fail", 0, operation="destroy", message="busy")
            wait(lambda: not list((plugin.state_dir / "fake-inject").glob("*.json")))
            assert "busy" in dra.unprepare([claim])[claim[1]]
            assert dra.unprepare([claim]) == {claim[1]: ""}  # the kubelet retries
        assert [u for *_, u in live(plugin)] == [foreign.uuid]
    finally:
        assert plugin.stop() == 0, plugin.log()
    assert [u for *_, u in live(plugin)] == [foreign.uuid]

"""The plugin process on real NVML (no ``--fake-gpus``): publishes what ``biaxial discover``
sees and prepares a real GPU. Marked ``gpu``; skipped with NVML's reason where no GPU exists."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.api.errors import DiscoveryError
from tests.emulator.server import Emulator
from tests.integration.fake_kubelet import REPO, FakeKubelet, PluginProcess, wait
from tests.validate_manifests import DEFAULT_VERSIONS, validate_object

pytestmark = pytest.mark.gpu

NODE = "gpu-node"
DRIVER = "gpu.biaxial.dev"


@pytest.fixture(scope="module")
def nvml() -> None:
    from driver.discovery.real import NvmlBackend

    try:
        NvmlBackend().close()
    except DiscoveryError as exc:
        pytest.skip(f"needs a real NVIDIA GPU with NVML: {exc}")


@pytest.fixture
def cluster(nvml: None) -> Iterator[tuple[Emulator, Path]]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="bxg"))
    emulator = Emulator().start()
    emulator.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        yield emulator, emulator.write_kubeconfig(root / "kubeconfig")
    finally:
        emulator.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_real_gpus_are_published_and_prepared(cluster: tuple[Emulator, Path]) -> None:
    emulator, kubeconfig = cluster
    plugin = PluginProcess(kubeconfig.parent, kubeconfig, node=NODE, profile=None).start()
    try:
        published = wait(lambda: emulator.list("resourceslices"), what="slices published")
        for item in published:
            for version in DEFAULT_VERSIONS:
                assert validate_object(item, version) == []
        discovered = subprocess.run(
            [sys.executable, "-m", "biaxial", "discover", "--node", NODE, "-o", "json"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        )
        expected = json.loads(discovered.stdout)["items"]
        assert [d["name"] for s in published for d in s["spec"]["devices"]] == [
            d["name"] for s in expected for d in s["spec"]["devices"]
        ]
        first = published[0]["spec"]["devices"][0]
        created = emulator.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "real", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                },
            }
        )
        result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": first["name"]}
        emulator.update_status(
            "ResourceClaim",
            "real",
            {"allocation": {"devices": {"results": [result]}}},
            namespace="default",
        )
        ref = ("default", created["metadata"]["uid"], "real")
        with FakeKubelet(plugin.registration_socket) as kubelet:
            out = kubelet.dra("v1").prepare([ref])
            assert out[ref[1]].error == ""
            spec_file = plugin.cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{ref[1]}.json"
            spec = json.loads(spec_file.read_text())
            env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
            assert env["NVIDIA_VISIBLE_DEVICES"] == first["attributes"]["uuid"]["string"]
            assert kubelet.dra("v1").unprepare([ref]) == {ref[1]: ""}
            assert not spec_file.exists()
    finally:
        assert plugin.stop() == 0, plugin.log()

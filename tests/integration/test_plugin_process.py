"""The real ``biaxial kubelet-plugin`` process against the API emulator, driven by a fake
kubelet over its unix sockets. One plugin process is shared by the module (tests use their own
claims and GPUs, so they stay independent)."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.emulator.server import Emulator
from tests.integration.fake_kubelet import (
    REPO,
    FakeKubelet,
    PluginProcess,
    allocated_claim,
    wait,
)
from tests.validate_manifests import DEFAULT_VERSIONS, validate_object

NODE = "node-a"
DRIVER = "gpu.biaxial.dev"
KIND = "k8s.gpu.biaxial.dev/gpu"
TAINT = "gpu.biaxial.dev/unhealthy"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Emulator, Path]]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="bxp"))
    emulator = Emulator().start()
    emulator.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        yield emulator, emulator.write_kubeconfig(root / "kubeconfig")
    finally:
        emulator.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def plugin(cluster: tuple[Emulator, Path]) -> Iterator[PluginProcess]:
    _, kubeconfig = cluster
    root = kubeconfig.parent
    process = PluginProcess(
        root, kubeconfig, extra=["--xid-quiet-seconds", "1", "--health-resend-seconds", "0.5"]
    ).start()
    try:
        yield process
    finally:
        code = process.stop()
        assert code == 0, process.log()


@pytest.fixture(scope="module")
def kubelet(plugin: PluginProcess) -> Iterator[FakeKubelet]:
    with FakeKubelet(plugin.registration_socket) as client:
        client.notify(registered=True)
        yield client


def slices(emulator: Emulator) -> list[dict[str, Any]]:
    return sorted(
        (s for s in emulator.list("resourceslices") if s["spec"]["nodeName"] == NODE),
        key=lambda s: s["metadata"]["name"],
    )


def device(emulator: Emulator, name: str) -> dict[str, Any]:
    for item in slices(emulator):
        for dev in item["spec"].get("devices") or []:
            if dev["name"] == name:
                return dict(dev)
    raise AssertionError(f"device {name} not published")


def result(dev: str, pool: str = NODE) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": pool, "device": dev}


# --------------------------------------------------------------------------- registration


def test_registration_info_names_both_versions_and_the_dra_socket(
    plugin: PluginProcess, kubelet: FakeKubelet
) -> None:
    info = kubelet.get_info()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugin.plugin_dir / DRIVER / "dra.sock")
    assert Path(info.endpoint).is_socket()
    # Set explicitly (issue 29, item 7): under the usual umask 022 they were 0755, under 0 0777.
    for socket in (Path(info.endpoint), plugin.registration_socket):
        assert stat.S_IMODE(socket.stat().st_mode) == 0o600, socket
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
        "v1.DRAResourceHealth",
    ]


# --------------------------------------------------------------------------- prepare


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_writes_the_cdi_spec_and_unprepare_removes_it(
    cluster: tuple[Emulator, Path], plugin: PluginProcess, kubelet: FakeKubelet, version: str
) -> None:
    emulator, _ = cluster
    gpu = "gpu-0" if version == "v1" else "gpu-1"
    ref = allocated_claim(emulator, f"one-{version}", [result(gpu)])
    uid = ref[1]
    dra = kubelet.dra(version)

    out = dra.prepare([ref])
    assert list(out) == [uid]
    assert out[uid].error == ""
    (dev,) = out[uid].devices
    assert (dev.pool_name, dev.device_name) == (NODE, gpu)
    assert list(dev.request_names) == ["gpu"]
    assert list(dev.cdi_device_ids) == [f"{KIND}={uid}-{gpu}"]
    spec_file = plugin.cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{uid}.json"
    spec = json.loads(spec_file.read_text())
    assert spec["kind"] == KIND
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-{gpu}"]
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == device(emulator, gpu)["attributes"]["uuid"]["string"]

    again = dra.prepare([ref])  # idempotent: same answer, same file
    assert again[uid] == out[uid]
    assert json.loads(spec_file.read_text()) == spec

    assert dra.unprepare([ref]) == {uid: ""}
    assert not spec_file.exists()
    assert dra.unprepare([ref]) == {uid: ""}  # idempotent


def test_per_claim_errors_leave_the_good_claim_prepared(
    cluster: tuple[Emulator, Path], kubelet: FakeKubelet
) -> None:
    emulator, _ = cluster
    good = allocated_claim(emulator, "good", [result("gpu-2")])
    foreign = allocated_claim(emulator, "foreign", [result("gpu-0", pool="node-b")])
    unknown = allocated_claim(emulator, "unknown", [result("gpu-9")])
    stale = ("default", str(uuid.uuid4()), "good")  # the name exists, under another UID
    missing = ("default", str(uuid.uuid4()), "never-created")
    dra = kubelet.dra("v1")

    out = dra.prepare([good, foreign, unknown, stale, missing])
    assert set(out) == {good[1], foreign[1], unknown[1], stale[1], missing[1]}
    assert out[good[1]].error == ""
    assert "not this node's pool" in out[foreign[1]].error
    assert "unknown device 'gpu-9'" in out[unknown[1]].error
    assert "UID mismatch" in out[stale[1]].error
    assert "not found" in out[missing[1]].error

    # gpu-2 is exclusively held by "good"
    thief = allocated_claim(emulator, "thief", [result("gpu-2")])
    taken = dra.prepare([thief])
    assert "already prepared for" in taken[thief[1]].error
    assert dra.unprepare([good, thief]) == {good[1]: "", thief[1]: ""}


def test_a_claim_without_uid_fails_the_whole_call(kubelet: FakeKubelet) -> None:
    with pytest.raises(grpc.RpcError) as info:
        kubelet.dra("v1").prepare([("default", "", "nameless")])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_uid_that_is_not_a_uid_is_a_per_claim_error(
    cluster: tuple[Emulator, Path], kubelet: FakeKubelet
) -> None:
    """Measured before (issue 29, item 7): Unprepare with UID ``a/b`` answered gRPC UNKNOWN
    (a ValueError from the file name built of it), failing its neighbours too. Now that claim
    alone gets an invalid-argument error, nothing is done for it, and the others go on."""
    emulator, _ = cluster
    good = allocated_claim(emulator, "neighbour", [result("gpu-3")])
    dra = kubelet.dra("v1")
    for bad in ("a/b", "../../etc", "x" * 65):
        ref = ("default", bad, "bad")
        expected = f"invalid argument: claim default/bad: UID {bad[:64]!r} is not a Kubernetes UID"
        assert dra.unprepare([ref, good]) == {bad: expected, good[1]: ""}
        out = dra.prepare([ref, good])
        assert out[bad].error == expected
        assert out[good[1]].error == ""
    assert dra.unprepare([good]) == {good[1]: ""}


# --------------------------------------------------------------------------- slices


def test_published_pool_validates_and_equals_biaxial_discover(
    cluster: tuple[Emulator, Path], plugin: PluginProcess
) -> None:
    emulator, _ = cluster
    published = wait(lambda: slices(emulator), what="slices published")
    node_uid = emulator.get("nodes", NODE)["metadata"]["uid"]  # type: ignore[index]
    for item in published:
        for version in DEFAULT_VERSIONS:
            assert validate_object(item, version) == []
        assert item["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
        ]
        assert item["spec"]["pool"]["resourceSliceCount"] == len(published)
    discovered = subprocess.run(
        [
            sys.executable,
            "-m",
            "biaxial",
            "discover",
            "--fake",
            "t4x4",
            "--node",
            NODE,
            "-o",
            "json",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    expected = json.loads(discovered.stdout)["items"]

    def comparable(item: dict[str, Any]) -> dict[str, Any]:
        spec = json.loads(json.dumps(item["spec"]))
        spec["pool"].pop("generation")
        for dev in spec.get("devices") or []:
            dev.pop("taints", None)  # health may taint a device of the shared process
        return {"name": item["metadata"]["name"], "spec": spec}

    assert [comparable(s) for s in published] == [comparable(s) for s in expected]


# --------------------------------------------------------------------------- health


def health_of(message: Any) -> dict[str, tuple[int, str]]:
    return {d.device.device_name: (d.health, d.message) for d in message.devices}


def test_fatal_xid_taints_noexecute_until_recovered(
    cluster: tuple[Emulator, Path], plugin: PluginProcess, kubelet: FakeKubelet
) -> None:
    emulator, _ = cluster
    wait(lambda: slices(emulator), what="slices published")
    with kubelet.health_stream("v1") as stream:
        first = next(stream)
        assert len(first.devices) == 4
        assert all(d.health == 1 and d.health_check_timeout_seconds == 30 for d in first.devices)
        assert {d.device.pool_name for d in first.devices} == {NODE}

        plugin.inject("xid", 3, xid=79)
        taint = wait(lambda: device(emulator, "gpu-3").get("taints"), what="gpu-3 tainted")
        assert taint[0]["key"] == TAINT
        assert taint[0]["effect"] == "NoExecute"
        assert taint[0]["value"] == "xid-79"
        assert "timeAdded" in taint[0]
        for message in stream:
            status, text = health_of(message)["gpu-3"]
            if status == 2:
                assert "Xid 79" in text
                break
        assert health_of(message)["gpu-2"][0] == 1

        plugin.inject("recovered", 3)
        wait(lambda: "taints" not in device(emulator, "gpu-3"), what="gpu-3 untainted")
        for message in stream:
            if health_of(message)["gpu-3"][0] == 1:
                break
    for item in slices(emulator):
        for version in DEFAULT_VERSIONS:
            assert validate_object(item, version) == []


def test_non_fatal_xid_taints_noschedule_and_clears_itself(
    cluster: tuple[Emulator, Path], plugin: PluginProcess
) -> None:
    emulator, _ = cluster
    wait(lambda: slices(emulator), what="slices published")
    plugin.inject("xid", 2, xid=31 + 1000)  # an Xid outside the fatal list
    taint = wait(lambda: device(emulator, "gpu-2").get("taints"), what="gpu-2 tainted")
    assert taint[0]["effect"] == "NoSchedule"
    # --xid-quiet-seconds 1: no further Xid for a second -> healthy again, taint removed
    wait(lambda: "taints" not in device(emulator, "gpu-2"), timeout_s=10, what="taint cleared")


def test_health_stream_v1alpha1_is_served_too(kubelet: FakeKubelet) -> None:
    with kubelet.health_stream("v1alpha1") as stream:
        message = next(stream)
    assert sorted(d.device.device_name for d in message.devices) == [
        "gpu-0",
        "gpu-1",
        "gpu-2",
        "gpu-3",
    ]

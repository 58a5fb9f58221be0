"""A node that heals its own state, with the real plugin process against the API emulator and
a fake kubelet (issue 15, items 4-6 and 8):

* a claim deleted without NodeUnprepareResources stops holding its GPU after the grace period
  (and the Node gets a ``StaleClaimReleased`` Event);
* an unreadable checkpoint keeps Prepare refused but lets Unprepare proceed, fails readiness
  and never liveness, is recorded on the Node, and heals when the file is repaired;
* the plugin needs no capability at all: a whole lifecycle (publish with the share cap,
  register, prepare two MPS claims with their own daemons, unprepare) runs with every
  capability dropped.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubeletplugin.checkpoint import CheckpointStore
from tests import fake_mps
from tests.emulator.server import Emulator
from tests.integration.fake_kubelet import (
    FakeKubelet,
    PluginProcess,
    allocated_claim,
    effective_capabilities,
    free_port,
    http_get,
    wait,
)

NODE = "node-a"
DRIVER = "gpu.biaxial.dev"
EVENTS_NS = "gpu-system"


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="bxh"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster(root: Path) -> Iterator[tuple[Emulator, Path]]:
    emulator = Emulator().start()
    emulator.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": EVENTS_NS}})
    try:
        yield emulator, emulator.write_kubeconfig(root / "kubeconfig")
    finally:
        emulator.stop()


def node_events(emulator: Emulator, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in emulator.list("events", namespace=EVENTS_NS)
        if e["involvedObject"]["kind"] == "Node"
        and e["involvedObject"]["name"] == NODE
        and e["reason"] == reason
    ]


def plugin(root: Path, kubeconfig: Path, port: int, *extra: str, **kwargs: Any) -> PluginProcess:
    return PluginProcess(
        root,
        kubeconfig,
        extra=[
            "--metrics-port", str(port), "--metrics-address", "127.0.0.1",
            "--event-namespace", EVENTS_NS, "--mps-root", str(root / "mps"), *extra,
        ],
        **kwargs,
    )  # fmt: skip


def on(device: str, **share: str) -> dict[str, Any]:
    out: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if share:
        out["shareID"] = f"share-{device}-{share.get('memory', '')}"
        out["consumedCapacity"] = share
    return out


def reserve(emulator: Emulator, name: str) -> None:
    claim = emulator.get("resourceclaims", name, namespace="default") or {}
    status = {**claim["status"], "reservedFor": [{"resource": "pods", "name": name, "uid": "p"}]}
    emulator.update_status("ResourceClaim", name, status, namespace="default")


def test_a_claim_deleted_without_unprepare_frees_its_gpu_after_the_grace_period(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    """Measured before: the checkpoint never forgot, and a claim deleted without Unprepare
    blocked its GPU on that node forever."""
    emulator, kubeconfig = cluster
    port = free_port()
    proc = plugin(
        root, kubeconfig, port, "--reconcile-seconds", "0.2", "--release-grace-seconds", "1"
    ).start()
    try:
        with FakeKubelet(proc.registration_socket) as kubelet:
            dra = kubelet.dra("v1")
            lost = allocated_claim(emulator, "lost", [on("gpu-0")])
            kept = allocated_claim(emulator, "kept", [on("gpu-1")])
            reserve(emulator, "lost")
            reserve(emulator, "kept")
            prepared = dra.prepare([lost, kept])
            assert prepared[lost[1]].error == prepared[kept[1]].error == ""
            # The pod is force-deleted and its claim with it; the kubelet never unprepares.
            emulator.delete("ResourceClaim", "lost", namespace="default")
            newcomer = allocated_claim(emulator, "newcomer", [on("gpu-0")])
            refused = dra.prepare([newcomer])[newcomer[1]].error
            assert "device gpu-0 is already prepared for another claim" in refused
            (event,) = wait(
                lambda: node_events(emulator, "StaleClaimReleased"), timeout_s=20,
                what="the stale claim released",
            )  # fmt: skip
            assert event["type"] == "Warning"
            assert event["message"] == (
                f"claim default/lost ({lost[1]}) was prepared on this node but the claim no "
                "longer exists; unprepared without the kubelet's NodeUnprepareResources, "
                "freeing gpu-0"
            )
            assert event["involvedObject"]["uid"] == emulator.get("nodes", NODE)["metadata"]["uid"]
            claims = CheckpointStore(proc.state_dir).load().claims
            assert sorted(claims) == [kept[1]]  # the claim still in use is kept
            assert not (proc.cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{lost[1]}.json").exists()
            assert dra.prepare([newcomer])[newcomer[1]].error == ""
        metrics = http_get(f"http://127.0.0.1:{port}/metrics")[1]
        assert "biaxial_plugin_stale_claims_released_total 1.0" in metrics
    finally:
        assert proc.stop() == 0, proc.log()


def test_an_unreadable_checkpoint_fails_readiness_not_liveness_and_heals(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    """Measured before: Unprepare was refused too (pods could not finish terminating), and
    the liveness probe restarted the plugin every ~30 s, which never mends the file."""
    emulator, kubeconfig = cluster
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = plugin(
        root, kubeconfig, port, "--reconcile-seconds", "0.2", "--release-grace-seconds", "0.5"
    ).start()
    try:
        with FakeKubelet(proc.registration_socket) as kubelet:
            dra = kubelet.dra("v1")
            held = allocated_claim(emulator, "held", [on("gpu-0")])
            reserve(emulator, "held")
            assert dra.prepare([held])[held[1]].error == ""
            wait(lambda: http_get(f"{base}/readyz")[0] == 200, what="ready")
            checkpoint = proc.state_dir / "checkpoint.json"
            good = checkpoint.read_bytes()
            checkpoint.write_bytes(good[:-40])  # a torn write

            _, text = wait(
                lambda: (r := http_get(f"{base}/readyz"))[0] == 503 and r, what="not ready"
            )
            assert "checksum" in text or "not valid JSON" in text
            assert http_get(f"{base}/healthz") == (200, "ok")  # no restart loop
            (event,) = wait(lambda: node_events(emulator, "CheckpointUnreadable"))
            assert event["type"] == "Warning"
            assert str(checkpoint) in event["message"]
            assert "Prepare is refused on this node" in event["message"]
            metrics = http_get(f"{base}/metrics")[1]
            assert "biaxial_plugin_checkpoint_readable 0.0" in metrics

            newcomer = allocated_claim(emulator, "newcomer", [on("gpu-1")])
            reserve(emulator, "newcomer")
            refused = dra.prepare([newcomer])[newcomer[1]].error
            assert "devices cannot be proven free" in refused
            # The held claim's pod ends: Unprepare proceeds and succeeds.
            assert dra.unprepare([held]) == {held[1]: ""}
            assert not (proc.cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{held[1]}.json").exists()

            # The administrator restores the file (runbook): readiness heals on its own.
            checkpoint.write_bytes(good)
            wait(lambda: http_get(f"{base}/readyz")[0] == 200, what="ready again")
            wait(lambda: node_events(emulator, "CheckpointReadable"), what="healed event")
            assert len(node_events(emulator, "CheckpointUnreadable")) == 1  # once per error
            assert dra.prepare([newcomer])[newcomer[1]].error == ""
            # The restored file still lists the held claim, unprepared meanwhile. Once its
            # pod is gone from reservedFor, reconciliation releases it (runbook, step 4).
            assert held[1] in CheckpointStore(proc.state_dir).load().claims
            claim = emulator.get("resourceclaims", "held", namespace="default") or {}
            status = {k: v for k, v in claim["status"].items() if k != "reservedFor"}
            emulator.update_status("ResourceClaim", "held", status, namespace="default")
            wait(
                lambda: held[1] not in CheckpointStore(proc.state_dir).load().claims,
                what="the held claim released",
            )
            # The Event is written after the release: wait for it (CI: it was read too early).
            (released,) = wait(
                lambda: node_events(emulator, "StaleClaimReleased"), what="the release event"
            )
            assert "the claim is reserved for no pod" in released["message"]
    finally:
        assert proc.stop() == 0, proc.log()


def test_the_plugin_needs_no_capability(cluster: tuple[Emulator, Path], root: Path) -> None:
    """The chart runs the plugin as root with every capability dropped and no privilege
    escalation; nothing in the plugin's own code may need more. Run it exactly so through a
    whole lifecycle, MPS daemons and the share cap included."""
    emulator, kubeconfig = cluster
    bin_dir = root / "bin"
    bin_dir.mkdir()
    fake_mps.install(bin_dir)
    port = free_port()
    proc = plugin(
        root,
        kubeconfig,
        port,
        "--max-shares-per-gpu",
        "2",
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        unprivileged=True,
    ).start()
    try:
        assert proc.proc is not None
        assert effective_capabilities(proc.proc.pid) == 0
        wait(
            lambda: [
                d for s in emulator.list("resourceslices") for d in s["spec"].get("devices") or []
            ],
            what="pool published",
        )
        for resource_slice in emulator.list("resourceslices"):
            for device in resource_slice["spec"]["devices"]:
                assert device["capacity"]["shares"] == {
                    "value": "2",
                    "requestPolicy": {"default": "1", "validValues": ["1"]},
                }
        config = [
            {
                "source": "FromClaim",
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": "gpu.biaxial.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "mps"},
                    },
                },
            }
        ]
        share = on("gpu-2", memory="1Gi", cores="20", shares="1")
        refs = [
            allocated_claim(emulator, name, [share], config=config)
            for name in ("mps-a", "mps-b", "mps-c")
        ]
        with FakeKubelet(proc.registration_socket) as kubelet:
            assert kubelet.get_info().name == DRIVER
            kubelet.notify(registered=True)
            dra = kubelet.dra("v1")
            out = dra.prepare(refs)
            assert [out[r[1]].error for r in refs[:2]] == ["", ""]
            assert "this node allows at most 2 per GPU" in out[refs[2][1]].error
            pipes = set()
            for ref in refs[:2]:
                spec = json.loads(
                    (proc.cdi_dir / f"k8s.gpu.biaxial.dev-gpu_{ref[1]}.json").read_text()
                )
                (mount,) = spec["devices"][0]["containerEdits"]["mounts"]
                pipes.add(mount["hostPath"])
                calls = (Path(mount["hostPath"]).parent / "calls.log").read_text().splitlines()
                assert "set_default_device_pinned_mem_limit GPU-" in calls[-2]
                assert calls[-2].endswith(" 1024M")
                assert calls[-1] == "set_default_active_thread_percentage 20"
            assert len(pipes) == 2  # a daemon per claim
            assert dra.unprepare(refs) == {r[1]: "" for r in refs}
            assert not any((root / "mps").iterdir())
        assert effective_capabilities(proc.proc.pid) == 0
    finally:
        assert proc.stop() == 0, proc.log()

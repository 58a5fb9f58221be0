"""Plugin process lifecycle against the API emulator: restarts, discovery changes, API faults,
two overlapping instances, registration failure, legacy node resources, bad flags. Each test
runs its own process(es) because each changes process-wide state."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.emulator.server import Emulator
from tests.integration.fake_kubelet import (
    REPO,
    FakeKubelet,
    PluginProcess,
    allocated_claim,
    free_port,
    http_get,
    wait,
)

NODE = "node-a"
DRIVER = "gpu.biaxial.dev"
SLICE_WRITES = {"create", "update", "delete", "patch"}


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="bxl"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cluster(root: Path) -> Iterator[tuple[Emulator, Path]]:
    emulator = Emulator().start()
    emulator.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    try:
        yield emulator, emulator.write_kubeconfig(root / "kubeconfig")
    finally:
        emulator.stop()


def pool(emulator: Emulator) -> list[dict[str, Any]]:
    return sorted(
        (s for s in emulator.list("resourceslices") if s["spec"]["nodeName"] == NODE),
        key=lambda s: s["metadata"]["name"],
    )


def devices(emulator: Emulator) -> list[str]:
    return [d["name"] for s in pool(emulator) for d in s["spec"].get("devices") or []]


def consistent(emulator: Emulator, expected: list[str]) -> bool:
    """The pool holds exactly ``expected`` devices, every slice at the same generation and
    with the right resourceSliceCount."""
    slices = pool(emulator)
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
    return devices(emulator) == expected and len(generations) == 1 and counts == {len(slices)}


def slice_writes(emulator: Emulator) -> list[str]:
    return [
        r.verb for r in emulator.requests_for(resource="resourceslices") if r.verb in SLICE_WRITES
    ]


ALL = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_restart_republishes_nothing_and_remove_on_exit_deletes_the_pool(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    emulator, kubeconfig = cluster
    first = PluginProcess(root, kubeconfig).start()
    wait(lambda: consistent(emulator, ALL), what="pool published")
    before = pool(emulator)
    assert first.stop() == 0
    assert pool(emulator) == before  # kept on exit unless asked

    emulator.clear_requests()
    second = PluginProcess(root, kubeconfig, extra=["--remove-slices-on-exit"]).start()
    wait(lambda: emulator.requests_for(resource="resourceslices", verb="watch"), what="watching")
    assert slice_writes(emulator) == []  # same pool: no writes after a restart
    assert pool(emulator) == before
    assert second.stop() == 0
    assert pool(emulator) == []


def test_gpu_disappearing_and_returning_updates_the_pool_and_prepare(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    emulator, kubeconfig = cluster
    plugin = PluginProcess(root, kubeconfig).start()
    try:
        wait(lambda: consistent(emulator, ALL), what="pool published")
        generation = pool(emulator)[0]["spec"]["pool"]["generation"]
        on_gpu_1 = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}
        ref = allocated_claim(emulator, "on-gpu-1", [on_gpu_1])
        with FakeKubelet(plugin.registration_socket) as kubelet:
            plugin.inject("remove", 1)
            wait(lambda: consistent(emulator, ["gpu-0", "gpu-2", "gpu-3"]), what="gpu-1 gone")
            # One slice changed: the generation is kept (upstream's rule).
            assert pool(emulator)[0]["spec"]["pool"]["generation"] == generation
            # Prepare reads the same device table as the publisher.
            error = kubelet.dra("v1").prepare([ref])[ref[1]].error
            assert "unknown device 'gpu-1' (this node has gpu-0, gpu-2, gpu-3)" in error
            plugin.inject("restore", 1)
            wait(lambda: consistent(emulator, ALL), what="gpu-1 back")
            assert kubelet.dra("v1").prepare([ref])[ref[1]].error == ""
            assert kubelet.dra("v1").unprepare([ref]) == {ref[1]: ""}
    finally:
        assert plugin.stop() == 0, plugin.log()


def test_publisher_survives_conflicts_server_errors_and_watch_faults(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    emulator, kubeconfig = cluster
    emulator.fail_next(500, resource="resourceslices", count=3)  # first lists fail: backoff
    plugin = PluginProcess(root, kubeconfig, extra=["--resync-seconds", "30"]).start()
    try:
        wait(lambda: consistent(emulator, ALL), what="pool published after 5xx")

        # Someone deletes our slice: the watch sees it and we re-create it.
        emulator.wait_for_watches(kind="resourceslices")
        name = pool(emulator)[0]["metadata"]["name"]
        emulator.delete("resourceslices", name)
        wait(lambda: consistent(emulator, ALL), what="deleted slice re-created")

        # Someone edits it: restored (the update carries a resourceVersion precondition).
        emulator.wait_for_watches(kind="resourceslices")
        edited = pool(emulator)[0]
        edited["spec"]["devices"] = edited["spec"]["devices"][:1]
        emulator.replace(edited)
        wait(lambda: consistent(emulator, ALL), what="edited slice restored")

        # A conflicting write, then a change: the 409 is retried after a re-list.
        emulator.wait_for_watches(kind="resourceslices")
        emulator.fail_next_write(409, resource="resourceslices")
        plugin.inject("remove", 0)
        wait(lambda: consistent(emulator, ["gpu-1", "gpu-2", "gpu-3"]), what="after 409")

        # A dropped watch: the plugin re-lists and opens a new one.
        def watches() -> int:
            return len(emulator.requests_for(resource="resourceslices", verb="watch"))

        emulator.wait_for_watches(kind="resourceslices")
        opened = watches()
        emulator.drop_watches("resourceslices")
        wait(lambda: watches() > opened, what="a new watch after a drop")
        # An expired resourceVersion (410) on the next watch: re-list, watch again, keep going.
        emulator.wait_for_watches(kind="resourceslices")
        opened = watches()
        emulator.expire_next_watch(resource="resourceslices")
        emulator.drop_watches("resourceslices", clean=True)
        wait(lambda: watches() >= opened + 2, what="a watch after the 410")
        plugin.inject("restore", 0)
        wait(lambda: consistent(emulator, ALL), what="after dropped watches")
        log = plugin.log()
        assert "sync failed" in log  # the 5xx path (backoff)
        assert "conflict" in log  # the 409 path (re-list)
        assert "watch ended" in log  # the 410
        assert "Expired" in log or "410" in log
    finally:
        assert plugin.stop() == 0, plugin.log()


def test_two_overlapping_instances_serve_and_serialize_prepare(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    emulator, kubeconfig = cluster
    old = PluginProcess(root, kubeconfig, name="old", pod_uid="pod-old").start()
    new = PluginProcess(root, kubeconfig, name="new", pod_uid="pod-new").start()
    try:
        with (
            FakeKubelet(old.registration_socket) as k_old,
            FakeKubelet(new.registration_socket) as k_new,
        ):
            assert k_old.get_info().endpoint.endswith("dra-pod-old.sock")
            assert k_new.get_info().endpoint.endswith("dra-pod-new.sock")
            on_gpu_0 = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]
            refs = [allocated_claim(emulator, name, on_gpu_0) for name in ("first", "second")]
            answers: dict[str, str] = {}

            def call(kubelet: FakeKubelet, ref: tuple[str, str, str]) -> None:
                answers[ref[1]] = kubelet.dra("v1").prepare([ref])[ref[1]].error

            threads = [
                threading.Thread(target=call, args=(k_old, refs[0])),
                threading.Thread(target=call, args=(k_new, refs[1])),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            # Both instances share the checkpoint under one lock: gpu-0 goes to exactly one.
            errors = sorted(answers.values())
            assert errors[0] == ""
            assert "already prepared for" in errors[1]
            # Unprepare works on either instance (rolling update).
            assert k_new.dra("v1").unprepare(refs) == {refs[0][1]: "", refs[1][1]: ""}
    finally:
        assert new.stop() == 0
        assert old.stop() == 0
    assert consistent(emulator, ALL)


def test_failed_registration_recreates_the_socket_and_is_reported(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    emulator, kubeconfig = cluster
    port = free_port()
    plugin = PluginProcess(
        root,
        kubeconfig,
        extra=["--metrics-port", str(port), "--metrics-address", "127.0.0.1",
               "--advertise-legacy-resources"],
    ).start()  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait(lambda: http_get(f"{base}/healthz")[0] == 200, what="healthz")
        before = plugin.registration_socket.stat().st_ctime_ns
        with FakeKubelet(plugin.registration_socket) as kubelet:
            kubelet.notify(registered=False, error="version mismatch")
        _, text = wait(lambda: (r := http_get(f"{base}/healthz"))[0] == 503 and r, what="unhealthy")
        assert "version mismatch" in text
        wait(
            lambda: (
                plugin.registration_socket.exists()
                and plugin.registration_socket.stat().st_ctime_ns != before
            ),
            what="socket re-created",
        )
        with FakeKubelet(plugin.registration_socket) as kubelet:
            kubelet.notify(registered=True)
        wait(lambda: http_get(f"{base}/healthz")[0] == 200, what="healthy again")
        metrics = http_get(f"{base}/metrics")[1]
        assert "biaxial_plugin_registration_failures_total 1.0" in metrics
        assert "biaxial_plugin_published_devices 4.0" in metrics

        def node_resources() -> Any:
            node = emulator.get("nodes", NODE) or {}
            return (node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpumem")

        assert wait(node_resources, what="legacy resources") == str(4 * 15360)
        node = emulator.get("nodes", NODE) or {}
        assert node["status"]["capacity"]["nvidia.com/gpucores"] == "400"
        plugin.inject("lost", 0)
        wait(lambda: node_resources() == str(3 * 15360), what="lost GPU leaves allocatable")
        node = emulator.get("nodes", NODE) or {}
        assert node["status"]["capacity"]["nvidia.com/gpucores"] == "300"
        wait(lambda: "biaxial_plugin_unhealthy_devices 1.0" in http_get(f"{base}/metrics")[1])
    finally:
        assert plugin.stop() == 0, plugin.log()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--metrics-port", "abc"],
            (
                "--metrics-port: 'abc' is not an integer "
                "(from the flag; environment twin $BIAXIAL_METRICS_PORT)"
            ),
        ),
        (["--driver-name", "Not_A_Name"], "--driver-name 'Not_A_Name' must be a DNS subdomain"),
        (["--registry-dir", "/tmp/" + "x" * 100], "unix socket paths must be shorter than 108"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig /nonexistent/kubeconfig"),
        (
            ["--kubeconfig", __file__, "--fake-gpus", "t4x4"],  # a file, not a kubeconfig
            f"cannot load Kubernetes config from {__file__}",
        ),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "biaxial", "kubelet-plugin", "--node-name", NODE, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("biaxial kubelet-plugin: error: ")
    assert message in lines[0]


def test_environment_problems_are_one_line_and_exit_2(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    _, kubeconfig = cluster
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    (root / "file").write_text("")
    cases = [
        (["--metrics-port", str(port), "--metrics-address", "127.0.0.1"], f"--metrics-port {port}"),
        (["--registry-dir", str(root / "file" / "reg")], "--registry-dir: cannot create"),
    ]
    try:
        for args, message in cases:
            proc = subprocess.run(
                [sys.executable, "-m", "biaxial", "kubelet-plugin", "--node-name", NODE,
                 "--fake-gpus", "t4x4", "--kubeconfig", str(kubeconfig),
                 "--plugin-dir", str(root / "plug"), "--cdi-dir", str(root / "cdi"),
                 "--state-dir", str(root / "state"), "--registry-dir", str(root / "reg"), *args],
                cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert proc.returncode == 2, proc.stderr
            errors = [line for line in proc.stderr.splitlines() if "error:" in line]
            assert len(errors) == 1, proc.stderr
            assert message in errors[0]
            assert "Traceback" not in proc.stderr
    finally:
        busy.close()


def test_node_name_is_required() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "biaxial", "kubelet-plugin"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert proc.returncode == 2
    assert "--node-name is required" in proc.stderr


def test_sigterm_ends_open_health_streams_and_exits_promptly(
    cluster: tuple[Emulator, Path], root: Path
) -> None:
    _, kubeconfig = cluster
    plugin = PluginProcess(root, kubeconfig).start()
    with FakeKubelet(plugin.registration_socket) as kubelet, kubelet.health_stream("v1") as stream:
        assert len(next(stream).devices) == 4
        started = time.monotonic()
        assert plugin.stop() == 0
        remaining = list(stream)  # ends cleanly (status OK), no RpcError
        assert all(len(m.devices) == 4 for m in remaining)
    assert time.monotonic() - started < 3.0, plugin.log()  # no 5 s grace wait on the stream
    assert not plugin.registration_socket.exists()
    assert not (plugin.plugin_dir / DRIVER / "dra.sock").exists()

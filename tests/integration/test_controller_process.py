"""``biaxial controller`` as a real process against the emulator: it serves /healthz, /readyz
and /metrics, schedules a pod, leads through its Lease, and exits 0 on SIGTERM after
releasing the Lease."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    bound_pods,
    check_invariants,
    claim_template,
    delete_all_pods,
    leftovers,
    pod,
    seed_cluster,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_http(url: str, status: int, timeout: float = 15.0, *, needle: str = "") -> str:
    deadline = time.monotonic() + timeout
    last: tuple[int, str] | None = None
    while time.monotonic() < deadline:
        try:
            last = _get(url)
        except OSError:
            last = None
        if last is not None and last[0] == status and needle in last[1]:
            return last[1]
        time.sleep(0.1)
    raise TimeoutError(f"{url}: wanted {status}, last {last}")


def test_controller_process_end_to_end(
    emulator: Emulator, claim_controller: ResourceClaimController, kubeconfig: Path
) -> None:
    seed_cluster(emulator)
    port = _free_port()
    env = {**os.environ, "BIAXIAL_QPS": "500", "BIAXIAL_LEASE_NAMESPACE": "kube-system"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "biaxial",
            "-v",
            "controller",
            "--kubeconfig",
            str(kubeconfig),
            "--metrics-port",
            str(port),
            "--identity",
            "proc-1",
            "--lease-duration",
            "3",
            "--renew-deadline",
            "2",
            "--retry-period",
            "0.5",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        assert _wait_http(f"{base}/healthz", 200) == "ok\n"
        assert _wait_http(f"{base}/readyz", 200).startswith("ok")
        emulator.create(pod("proc-pod", legacy_gpus=1, gpumem=4000))
        emulator.wait_until(lambda: "proc-pod" in bound_pods(emulator), timeout=15)
        assert check_invariants(emulator) == []
        lease = emulator.get("leases", "biaxial-controller", "kube-system")
        assert lease is not None
        assert lease["spec"]["holderIdentity"] == "proc-1"
        metrics = _wait_http(
            f"{base}/metrics", 200, needle="biaxial_controller_commit_seconds_count 1.0"
        )
        assert 'biaxial_controller_decisions_total{result="scheduled"} 1.0' in metrics
        assert "biaxial_controller_leader 1.0" in metrics
        assert "biaxial_controller_api_requests_total " in metrics
        assert "biaxial_controller_commit_seconds_count 1.0" in metrics
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    assert "Traceback" not in output, output
    released = emulator.get("leases", "biaxial-controller", "kube-system")
    assert released is not None
    assert not released["spec"].get("holderIdentity")


def test_bad_kubeconfig_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    result = subprocess.run(
        [sys.executable, "-m", "biaxial", "controller", "--kubeconfig", str(broken)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        f"biaxial controller: error: cannot load Kubernetes config from {broken}: "
    )


def _start(kubeconfig: Path, port: int, identity: str) -> subprocess.Popen[str]:
    argv = [
        sys.executable, "-m", "biaxial", "controller",
        "--kubeconfig", str(kubeconfig),
        "--metrics-port", str(port),
        "--identity", identity,
        "--lease-namespace", "kube-system",
        "--lease-duration", "2", "--renew-deadline", "1.5", "--retry-period", "0.2",
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_mid_flight_then_a_new_process_finishes(
    emulator: Emulator, claim_controller: ResourceClaimController, kubeconfig: Path
) -> None:
    seed_cluster(emulator)
    emulator.create(claim_template("slice", memory="3000Mi"))
    names = []
    for i in range(6):
        emulator.create(pod(f"t{i}", template="slice"))
        emulator.create(pod(f"l{i}", legacy_gpus=1, gpumem=3000))
        names += [f"t{i}", f"l{i}"]
    port = _free_port()
    first = _start(kubeconfig, port, "first")
    try:
        emulator.wait_until(lambda: len(bound_pods(emulator)) >= 3, timeout=20)
    finally:
        first.kill()  # SIGKILL: whatever write was in flight lands or not
        first.communicate(timeout=15)
    assert check_invariants(emulator) == []
    second = _start(kubeconfig, _free_port(), "second")
    try:
        emulator.wait_until(
            lambda: len(bound_pods(emulator, names)) == len(names),
            timeout=30,
            message=f"bound: {bound_pods(emulator)}",
        )
        assert check_invariants(emulator) == []
        delete_all_pods(emulator)
        emulator.wait_until(
            lambda: not leftovers(emulator), timeout=30, message=str(leftovers(emulator))
        )
        second.send_signal(signal.SIGTERM)
        output, _ = second.communicate(timeout=15)
    finally:
        if second.poll() is None:
            second.kill()
            second.communicate()
    assert second.returncode == 0, output

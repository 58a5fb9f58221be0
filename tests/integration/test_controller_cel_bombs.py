"""CEL bombs against the real ``biaxial controller`` process (issue 15's acceptance): a pod
whose selector explodes, or merely runs long, is refused with a clear message on the pod; the
controller stays up, a pod created right after it is placed, and the controller's peak memory
stays under the chart's limit.

Two bombs, each reaching the scheduler the way a real one would:

* the ``cel.bind`` / ``map`` / ``join`` growth bomb: today's cost estimate (biaxial's and the
  API server's) refuses it when written, so it comes from a DeviceClass an older API server
  stored (validation does not check a stored expression again); the actual-cost limit stops
  it at run time;
* a selector the API server admits (its estimate is within the limit) that takes a few hundred
  milliseconds per device: only the decision deadline (``--decision-timeout``, kube-scheduler's
  DRA filter timeout) stops it.

The timings of the same runs at full size are ``python -m bench.badinput``'s to report; here
the bounds only catch a hang or a lost deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.badinput import LONG_SELECTOR
from bench.cel import growth_bomb
from bench.processes import controller_argv
from tests.emulator import Emulator
from tests.integration.controller_env import (
    DRIVER,
    ROOT,
    bound_pods,
    pod,
    pod_condition,
    pod_events,
    resource_claim,
    seed_cluster,
)
from tests.integration.fake_kubelet import free_port, http_get

DEADLINE_S = 1.0
BOMB_CLASS = "bomb.example.com"

#: The deadline test's extra node: 16 more devices for bench.badinput's LONG_SELECTOR (within
#: the cost limit, about 0.13 s per device) to go through: 3 s over 24 devices, well past the
#: deadline, yet several devices settled per attempt even on a loaded machine.
EXTRA_NODES = {"gpu-h100": "h100-80gbx8"}


def memory_limit_bytes() -> int:
    values = yaml.safe_load((ROOT / "deploy/helm/biaxial/values.yaml").read_text())
    text = str(values["controller"]["resources"]["limits"]["memory"])
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", text).groups()  # type: ignore[union-attr]
    return int(number) * {"Mi": 2**20, "Gi": 2**30}[unit]


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc")


@pytest.fixture
def controller(emulator: Emulator, kubeconfig: Path) -> Iterator[subprocess.Popen[bytes]]:
    seed_cluster(emulator)
    port = free_port()
    proc = subprocess.Popen(
        controller_argv(
            kubeconfig,
            port,
            "--no-leader-elect",
            "--decision-timeout",
            str(DEADLINE_S),
            "--qps",
            "500",
            "--burst",
            "500",
        ),
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            raise TimeoutError("the controller did not become ready")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    assert code == 0


def _wait_condition(emulator: Emulator, name: str, needle: str, timeout: float) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def check() -> bool:
        condition = pod_condition(emulator, name)
        if condition and condition["status"] == "False" and needle in condition["message"]:
            found.append(condition)
            return True
        return False

    emulator.wait_until(check, timeout, message=f"{name}: {pod_condition(emulator, name)}")
    return found[-1]


def _wait_event(emulator: Emulator, name: str, message: str) -> None:
    emulator.wait_until(
        lambda: ("FailedScheduling", message) in pod_events(emulator, name),
        10,
        message=f"{name}: events {pod_events(emulator, name)}",
    )


def _ordinary_pod_is_placed(emulator: Emulator, name: str) -> None:
    emulator.create(resource_claim(name, memory="1Gi"))
    emulator.create(pod(name, claim=name))
    emulator.wait_until(lambda: name in bound_pods(emulator, [name]), 10, message=name)


def test_a_growth_bomb_stored_in_a_class_is_refused_and_the_controller_goes_on(
    emulator: Emulator, controller: subprocess.Popen[bytes]
) -> None:
    emulator.create_stored(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": BOMB_CLASS},
            "spec": {
                "selectors": [
                    {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                    {"cel": {"expression": growth_bomb(8)}},
                ]
            },
        }
    )
    emulator.create(resource_claim("bomb", device_class=BOMB_CLASS))
    started = time.monotonic()
    emulator.create(pod("bomb", claim="bomb"))
    condition = _wait_condition(emulator, "bomb", "actual cost limit exceeded", 10)
    assert time.monotonic() - started < 3 * DEADLINE_S + 5  # the cost limit, not a hang
    assert condition["reason"] == "Unschedulable"
    assert "CEL runtime error" in condition["message"]
    _wait_event(emulator, "bomb", condition["message"])
    _ordinary_pod_is_placed(emulator, "after-growth")
    assert controller.poll() is None
    assert peak_rss_bytes(controller.pid) < memory_limit_bytes()
    assert not (emulator.get("resourceclaims", "bomb") or {}).get("status")  # nothing changed


def test_a_selector_only_the_deadline_stops_is_refused_and_retried(
    emulator: Emulator, controller: subprocess.Popen[bytes]
) -> None:
    seed_cluster(emulator, EXTRA_NODES, classes=False)
    # The controller has the extra node's devices once a pod pinned to it is placed there.
    emulator.create(resource_claim("pinned", memory="1Gi"))
    pinned = pod("pinned", claim="pinned")
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": next(iter(EXTRA_NODES))}
    emulator.create(pinned)
    emulator.wait_until(lambda: "pinned" in bound_pods(emulator, ["pinned"]), 10, message="pinned")
    # Admitted like any claim: its estimated cost is within the limit.
    claim = resource_claim("long")
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": LONG_SELECTOR}}
    ]
    emulator.create(claim)
    started = time.monotonic()
    emulator.create(pod("long", claim="long"))
    condition = _wait_condition(emulator, "long", "deadline", 10 * DEADLINE_S + 10)
    assert time.monotonic() - started < 3 * DEADLINE_S + 5
    assert condition["reason"] == "SchedulerError"
    assert f"{DEADLINE_S:g} s deadline" in condition["message"]
    assert "--decision-timeout" in condition["message"]
    assert "operation cancelled: evaluation deadline exceeded" in condition["message"]
    _wait_event(emulator, "long", condition["message"])
    _ordinary_pod_is_placed(emulator, "after-long")
    # Retried with backoff; the devices it evaluated are remembered, so it ends up decided.
    _wait_condition(emulator, "long", "0/3 nodes are available", 180)
    assert controller.poll() is None
    assert peak_rss_bytes(controller.pid) < memory_limit_bytes()

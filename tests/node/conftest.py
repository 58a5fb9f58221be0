"""A real one-node cluster for the tests here (marker ``node``; ``make e2e-node``).

``cluster`` starts, once per session: upstream's control plane (etcd, kube-apiserver,
kube-controller-manager, tests/cluster/controlplane.py) with a static token for the node's
kubelet; the node (containerd, runc, CNI, kubelet, tests/cluster/node.py); what the rendered
Helm chart gives the API server (namespace, ServiceAccounts, RBAC, policies, DeviceClasses);
the biaxial controller and the biaxial kubelet plugin as the chart runs them (the chart's
arguments, each under its own ServiceAccount's token), the plugin with the fake ``t4x4``
backend, its registration and DRA sockets under the kubelet's root directory, and the CDI specs
in the directory containerd reads. Everything is stopped and removed at the end of the session,
after a failure too.

These tests run only when asked for: ``pytest -m node`` or ``BIAXIAL_E2E_NODE=1``; the normal
suite skips them at collection (they need root and minutes of builds).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import fake_mps
from tests.apiserver.components import ControllerProcess, plugin_process
from tests.apiserver.conftest import ChartInstall
from tests.cluster.build import release
from tests.cluster.controlplane import ControlPlane
from tests.cluster.node import Node
from tests.integration.fake_kubelet import PluginProcess
from tests.render_chart import NAMESPACE, render_objects

NODE_NAME = "node-real"
HERE = Path(__file__).parent
# 4 x T4 (minors 0-3) and an A100 with dynamic MIG (minor 4)
GPUS = HERE / "gpus.yaml"
# Kubernetes 1.34's API server refuses the plugin's dynamic-MIG pool: it wants every counter
# set a device consumes in the device's own ResourceSlice ("must reference a counterSet
# defined in the ResourceSlice sharedCounters"), and the plugin publishes them in a slice of
# their own as 1.35+ allows. There the node has the 4 T4s alone and the MIG test is skipped.
NO_DYNAMIC_MIG = ("1.34",)


def gpu_profile() -> str:
    return "t4x4" if release().minor in NO_DYNAMIC_MIG else str(GPUS)


def _wanted(config: pytest.Config) -> bool:
    return (
        os.environ.get("BIAXIAL_E2E_NODE") == "1"
        or (config.option.markexpr or "").strip() == "node"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="a real node: `make e2e-node` (or pytest -m node as root)")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.node)
            if not _wanted(config):
                item.add_marker(skip)


@dataclass
class Cluster:
    plane: ControlPlane
    node: Node
    install: ChartInstall
    plugin: PluginProcess
    controller: ControllerProcess
    timings: dict[str, float] = field(default_factory=dict)

    def stop(self) -> None:
        for stop in (self.controller.stop, self.plugin.stop):
            with contextlib.suppress(Exception):  # the node and plane must stop regardless
                stop()
        self.node.stop()
        self.plane.stop()


def start_plugin(install: ChartInstall, node: Node) -> PluginProcess:
    """The plugin as the chart runs it, its host directories those of the real node."""
    plugin = plugin_process(install, node.root, node.name)
    overrides = {
        "--registry-dir": node.registry_dir,
        "--plugin-dir": node.plugins_dir,
        "--cdi-dir": node.cdi_dir,
        "--state-dir": node.root / "biaxial-state",
        "--fake-device-dir": node.device_dir,
        "--fake-gpus": gpu_profile(),
    }
    for flag, value in overrides.items():
        plugin.args += [flag, str(value)]
    plugin.registry_dir = node.registry_dir
    plugin.plugin_dir = node.plugins_dir
    plugin.cdi_dir = node.cdi_dir
    plugin.state_dir = node.root / "biaxial-state"
    plugin.registration_socket = node.registry_dir / plugin.registration_socket.name
    node.registry_dir.mkdir(parents=True, exist_ok=True)
    plugin.log_path = node.root / "logs" / "plugin.log"  # kept with BIAXIAL_NODE_LOGS
    plugin.unprivileged = True  # the chart's securityContext: uid 0, every capability dropped
    # MPS without a GPU: a stand-in nvidia-cuda-mps-control on the plugin's PATH
    fake_bin = node.root / "fake-bin"
    fake_bin.mkdir(exist_ok=True)
    fake_mps.install(fake_bin)
    plugin.env["PATH"] = f"{fake_bin}:{plugin.env.get('PATH', '/usr/bin:/bin')}"
    return plugin.start(timeout_s=30)


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    # SIGTERM (a CI timeout, `kill`) becomes an interruption, so the finalizers below still
    # stop the node; after a SIGKILL the next run's Node.start clears what was left
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        yield from _cluster()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _cluster() -> Iterator[Cluster]:
    rel = release()
    node_token = os.urandom(16).hex()
    plane = ControlPlane(rel, node_tokens={NODE_NAME: node_token})
    mig = rel.minor not in NO_DYNAMIC_MIG
    node = Node(plane, rel, name=NODE_NAME, token=node_token, gpus=5 if mig else 4,
                mig_minors=(4,) if mig else ())  # fmt: skip
    atexit.register(node.stop)
    atexit.register(plane.stop)
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        plane.start()
        timings["control plane"] = round(time.monotonic() - started, 1)
        node.start()
        timings.update({f"node: {k}": v for k, v in node.timings.items()})
        mark = time.monotonic()
        objects = [r.obj for r in render_objects() if r.kind not in ("Deployment", "DaemonSet")]
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        plane.apply([namespace, *objects])
        install = ChartInstall(plane, objects)
        install.wait_for_policies()
        plugin = start_plugin(install, node)
        controller = ControllerProcess(install, node.root, "controller-0")
        controller.log_path = node.root / "logs" / "controller-0.log"
        controller.start()
        timings["chart, plugin, controller"] = round(time.monotonic() - mark, 1)
    except BaseException:
        node.stop()
        plane.stop()
        raise
    timings["total"] = round(time.monotonic() - started, 1)
    print(f"\nnode start-up: {timings}")
    cluster = Cluster(plane, node, install, plugin, controller, timings)
    try:
        yield cluster
    finally:
        cluster.stop()

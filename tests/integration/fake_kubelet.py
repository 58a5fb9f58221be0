"""A fake kubelet: the gRPC client side of plugin registration, DRA and resource health.

It speaks to a plugin over its unix sockets exactly as the kubelet does (same service and
method names, generated from the same protos), with synchronous calls so tests stay simple:

    kubelet = FakeKubelet(registration_socket)
    info = kubelet.get_info()                      # PluginInfo
    kubelet.notify(registered=True)
    dra = kubelet.dra(version="v1")                # endpoint from GetInfo
    dra.prepare([("default", uid, "claim")])       # {uid: NodePrepareResourceResponse}
    dra.unprepare([...])                           # {uid: error string}
    with kubelet.health_stream("v1") as stream:    # NodeWatchResourcesResponse iterator
        first = next(stream)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from kubeletplugin.proto.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from tests.emulator.server import Emulator

_DRA: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
_HEALTH: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1": (health_v1_pb2, health_v1_pb2_grpc),
    "v1alpha1": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}
TIMEOUT_S = 45.0  # the kubelet's per-call default
DRIVER = "gpu.biaxial.dev"

ClaimTuple = tuple[str, str, str]  # namespace, uid, name


def allocated_claim(
    emulator: Emulator,
    name: str,
    results: list[dict[str, Any]],
    *,
    device_class: str = DRIVER,
    config: list[dict[str, Any]] | None = None,
) -> ClaimTuple:
    """Create claim ``default/<name>`` with ``results`` (and ``config``) in its
    ``status.allocation``, as a scheduler would have written it; returns what the kubelet
    would send for it."""
    created = emulator.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                }
            },
        }
    )
    devices: dict[str, Any] = {"results": results}
    if config:
        devices["config"] = config
    emulator.update_status(
        "ResourceClaim", name, {"allocation": {"devices": devices}}, namespace="default"
    )
    return ("default", created["metadata"]["uid"], name)


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory directly under /tmp, removed afterwards: a plugin's unix sockets live
    below it, and socket paths are limited to 107 bytes (pytest's tmp_path is too deep)."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def node_cluster(root: Path, node: str) -> Iterator[tuple[Emulator, Path]]:
    """A running API emulator with Node ``node``, and a kubeconfig for it under ``root``."""
    emulator = Emulator().start()
    emulator.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        yield emulator, emulator.write_kubeconfig(root / "kubeconfig")
    finally:
        emulator.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (for a plugin's metrics)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def queued_connections(listener: socket.socket, n: int) -> int:
    """How many of ``n`` connections opened at once wait in the listen queue of ``listener``
    (a server's socket, bound and listening, not accepting): the kernel drops a SYN that finds
    the queue full, and its client sends it again only after a second, so a connection not
    queued within half a second was dropped."""
    clients = [socket.socket() for _ in range(n)]
    accepted: list[socket.socket] = []
    try:
        for client in clients:
            client.setblocking(False)
            client.connect_ex(listener.getsockname())
        listener.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            while len(accepted) < n:
                accepted.append(listener.accept()[0])
        return len(accepted)
    finally:
        for sock in (*clients, *accepted):
            sock.close()


def http_get(url: str) -> tuple[int, str]:
    """Status and body of a GET (an HTTP error status is returned, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class DraClient:
    """NodePrepareResources / NodeUnprepareResources of one API version."""

    def __init__(self, channel: grpc.Channel, version: str) -> None:
        self.pb, grpc_mod = _DRA[version]
        self.version = version
        self._stub = grpc_mod.DRAPluginStub(channel)

    def _claims(self, claims: Sequence[ClaimTuple]) -> list[Any]:
        return [self.pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]

    def prepare(self, claims: Sequence[ClaimTuple]) -> dict[str, Any]:
        request = self.pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        response = self._stub.NodePrepareResources(request, timeout=TIMEOUT_S)
        return dict(response.claims)

    def unprepare(self, claims: Sequence[ClaimTuple]) -> dict[str, str]:
        request = self.pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        response = self._stub.NodeUnprepareResources(request, timeout=TIMEOUT_S)
        return {uid: entry.error for uid, entry in response.claims.items()}


class FakeKubelet:
    """One fake kubelet talking to one plugin (close it, or use it as a context manager)."""

    def __init__(self, registration_socket: Path) -> None:
        self._reg_channel = grpc.insecure_channel(f"unix://{registration_socket}")
        self._reg = pluginregistration_pb2_grpc.RegistrationStub(self._reg_channel)
        self._channels: list[grpc.Channel] = [self._reg_channel]
        self._endpoint: str | None = None

    def __enter__(self) -> FakeKubelet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def get_info(self) -> Any:
        info = self._reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=TIMEOUT_S)
        self._endpoint = info.endpoint
        return info

    def notify(self, *, registered: bool, error: str = "") -> None:
        self._reg.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error),
            timeout=TIMEOUT_S,
        )

    def _channel(self) -> grpc.Channel:
        if self._endpoint is None:
            self.get_info()
        channel = grpc.insecure_channel(f"unix://{self._endpoint}")
        self._channels.append(channel)
        return channel

    def dra(self, version: str = "v1") -> DraClient:
        return DraClient(self._channel(), version)

    @contextlib.contextmanager
    def health_stream(self, version: str = "v1") -> Iterator[Iterator[Any]]:
        pb, grpc_mod = _HEALTH[version]
        stub = grpc_mod.DRAResourceHealthStub(self._channel())
        call = stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=60)
        try:
            yield call
        finally:
            call.cancel()


# --------------------------------------------------------------------------- the plugin process

REPO = Path(__file__).resolve().parents[2]


_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_all_capabilities() -> None:
    """``preexec_fn``: the child keeps its user (root in CI, as the chart's plugin) but holds no
    capability at all, bounding set included, and can gain none (``no_new_privs``): what the
    chart's ``capabilities: {drop: [ALL]}, allowPrivilegeEscalation: false`` leaves a
    container. A no-op where the caller has no capabilities to drop."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for cap in range(64):  # EINVAL past the kernel's last capability: ignored
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def effective_capabilities(pid: int) -> int:
    """The ``CapEff`` mask of a running process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise RuntimeError(f"no CapEff for pid {pid}")


class PluginProcess:
    """A real ``biaxial kubelet-plugin`` subprocess with its directories under ``root``.

    ``root`` must be short (``tempfile.mkdtemp(dir="/tmp")``): unix socket paths < 108 bytes.
    stdout/stderr go to ``<root>/<name>.log`` (shown by :meth:`log` when a test fails).
    ``env`` adds to the inherited environment; ``unprivileged`` starts it without any
    capability (:func:`drop_all_capabilities`).
    """

    def __init__(
        self,
        root: Path,
        kubeconfig: Path,
        *,
        node: str = "node-a",
        profile: str | None = "t4x4",
        name: str = "plugin",
        extra: Sequence[str] = (),
        pod_uid: str = "",
        env: dict[str, str] | None = None,
        unprivileged: bool = False,
    ) -> None:
        self.root = root
        self.env = {**os.environ, **(env or {})}
        self.unprivileged = unprivileged
        self.node = node
        self.name = name
        self.registry_dir = root / "reg"
        self.plugin_dir = root / "plug"
        self.cdi_dir = root / "cdi"
        self.state_dir = root / "state"
        self.args = [
            sys.executable, "-m", "biaxial", "kubelet-plugin",
            "--kubeconfig", str(kubeconfig),
            "--node-name", node,
            *(["--fake-gpus", profile] if profile else []),
            "--registry-dir", str(self.registry_dir),
            "--plugin-dir", str(self.plugin_dir),
            "--cdi-dir", str(self.cdi_dir),
            "--state-dir", str(self.state_dir),
            *(["--pod-uid", pod_uid] if pod_uid else []),
            *extra,
        ]  # fmt: skip
        suffix = f"-{pod_uid}-reg.sock" if pod_uid else "-reg.sock"
        self.registration_socket = self.registry_dir / f"gpu.biaxial.dev{suffix}"
        self.log_path = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> PluginProcess:
        self.registration_socket.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                cwd=REPO,
                stdout=log,
                stderr=log,
                env=self.env,
                preexec_fn=drop_all_capabilities if self.unprivileged else None,  # noqa: PLW1509
            )
        deadline = time.monotonic() + timeout_s
        while not self.registration_socket.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"plugin exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"plugin did not come up:\n{self.log()}")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def inject(self, action: str, gpu: int | str, **extra: Any) -> None:
        """Test-only fault injection through ``<state-dir>/fake-inject`` (see kubeletplugin.app)."""
        folder = self.state_dir / "fake-inject"
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{time.monotonic_ns():020d}"
        tmp = folder / f"{stem}.tmp"
        tmp.write_text(json.dumps({"action": action, "gpu": gpu, **extra}))
        tmp.rename(folder / f"{stem}.json")


def wait(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; that value is returned."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.05)

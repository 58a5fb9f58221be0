"""biaxial's controller and kubelet plugin as the chart runs them, against the real control
plane: real ``biaxial controller`` and ``biaxial kubelet-plugin`` processes with the rendered
chart's arguments (only ports and host directories replaced by the test's own), each with a
kubeconfig holding a token of its own ServiceAccount, so the chart's RBAC and ResourceSlice
policy are all that authorizes them.

Also the small API helpers the real-server tests share: GPU nodes that kwok keeps Ready (and
on which it runs and gracefully deletes pods, as a kubelet would), API reads and writes as the
administrator, and the audit log's account of who wrote what.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from tests.apiserver.conftest import ChartInstall
from tests.cluster.controlplane import ControlPlane, ControlPlaneError, free_port
from tests.integration.controller_env import node_object
from tests.integration.fake_kubelet import PluginProcess, http_get, wait
from tests.render_chart import render_objects

JSON = dict[str, Any]
DRIVER: Final = "gpu.biaxial.dev"
FINALIZER: Final = f"{DRIVER}/allocation"
KWOK_ANNOTATION: Final = {"kwok.x-k8s.io/node": "fake"}
RESOURCE: Final = "/apis/resource.k8s.io/v1"
# Flags naming host directories: the plugin's test harness passes its own under a short root.
_HOST_DIRS: Final = ("--registry-dir", "--plugin-dir", "--cdi-dir", "--state-dir")


def get(plane: ControlPlane, path: str) -> JSON | None:
    """The object at ``path`` as the administrator sees it, None when it does not exist."""
    status, body = plane.request("GET", path)
    if status == 404:
        return None
    if status != 200:
        raise ControlPlaneError(f"GET {path}: {status} {body}")
    return dict(body)


def create(plane: ControlPlane, path: str, body: Mapping[str, Any]) -> JSON:
    status, stored = plane.request("POST", path, body)
    if status != 201:
        raise ControlPlaneError(f"POST {path}: {status} {stored}")
    return dict(stored)


def merge_patch(plane: ControlPlane, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
    """A JSON merge patch as the administrator: (status, parsed body)."""
    return plane.request("PATCH", path, body, content_type="application/merge-patch+json")


def items(plane: ControlPlane, path: str) -> list[JSON]:
    status, body = plane.request("GET", path)
    if status != 200:
        raise ControlPlaneError(f"GET {path}: {status} {body}")
    return list(body["items"])


# --------------------------------------------------------------------------- nodes and kwok


def ensure_kwok(plane: ControlPlane) -> None:
    """kwok, once per control plane (it plays the kubelet of every node it manages)."""
    if not any(p.name == "kwok" and p.popen.poll() is None for p in plane.processes):
        plane.start_kwok()


def gpu_node(plane: ControlPlane, name: str, **labels: str) -> JSON:
    """A Node with allocatable CPU, memory and pods, managed by kwok (Ready, runs its pods);
    created when missing."""
    existing = get(plane, f"/api/v1/nodes/{name}")
    if existing is not None:
        return existing
    body = node_object(name, labels=labels)
    body["metadata"]["annotations"] = dict(KWOK_ANNOTATION)
    stored = create(plane, "/api/v1/nodes", body)
    stored["status"] = body["status"]  # a kubelet reports it; kwok keeps what it finds
    status, updated = plane.request("PUT", f"/api/v1/nodes/{name}/status", stored)
    if status != 200:
        raise ControlPlaneError(f"node {name} status: {status} {updated}")
    # The TaintNodesByCondition admission plugin taints every new Node not-ready; the node
    # lifecycle controller (not run here: kwok keeps no heartbeat) lifts it once it is Ready.
    taints = updated["spec"].get("taints") or []
    updated["spec"]["taints"] = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
    status, untainted = plane.request("PUT", f"/api/v1/nodes/{name}", updated)
    if status != 200:
        raise ControlPlaneError(f"node {name} taints: {status} {untainted}")
    return dict(untainted)


# --------------------------------------------------------------------------- the chart's args


@functools.cache
def _rendered_workloads() -> tuple[JSON, ...]:
    return tuple(r.obj for r in render_objects() if r.kind in ("Deployment", "DaemonSet"))


def chart_args(component: str) -> list[str]:
    """The container arguments the rendered chart (default values) gives ``component``
    (``controller`` or ``kubelet-plugin``), the subcommand first."""
    for obj in _rendered_workloads():
        if obj["metadata"]["labels"].get("app.kubernetes.io/component") == component:
            containers = obj["spec"]["template"]["spec"]["containers"]
            return [str(a) for a in containers[0]["args"]]
    raise LookupError(f"the chart renders no workload for {component}")


def replaced(
    args: Sequence[str], values: Mapping[str, str], *, drop: Sequence[str] = ()
) -> list[str]:
    """``args`` (``--flag=value`` each) with the values of the flags in ``values`` replaced
    and the flags in ``drop`` left out; every flag named must be there."""
    out = []
    seen = set()
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in drop:
            seen.add(flag)
            continue
        if flag in values:
            seen.add(flag)
        out.append(f"{flag}={values[flag]}" if flag in values else arg)
    missing = (set(values) | set(drop)) - seen
    if missing:
        raise LookupError(f"the chart no longer passes {sorted(missing)}")
    return out


# --------------------------------------------------------------------------- the controller


class ControllerProcess:
    """``biaxial controller`` with the chart's arguments, under the controller's own
    ServiceAccount token; output in ``<root>/<identity>.log``."""

    def __init__(self, install: ChartInstall, root: Path, identity: str) -> None:
        self.identity = identity
        self.health_port = free_port()
        self.metrics_port = free_port()
        kubeconfig = install.plane.kubeconfig(
            root / f"{identity}.kubeconfig", token=install.controller_token()
        )
        args = replaced(
            chart_args("controller")[1:],
            {"--metrics-port": str(self.metrics_port), "--health-port": str(self.health_port)},
        )
        self.argv = [
            sys.executable, "-m", "biaxial", "controller",
            "--kubeconfig", str(kubeconfig), *args, "--identity", identity,
        ]  # fmt: skip
        self.log_path = root / f"{identity}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ControllerProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        wait(lambda: self._probe("/healthz") == 200 or self._exited(), what="controller up")
        return self

    def _exited(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"controller exited with {self.proc.returncode}:\n{self.log()}")
        return False

    def _probe(self, path: str) -> int:
        try:
            return http_get(f"http://127.0.0.1:{self.health_port}{path}")[0]
        except OSError:  # not listening yet
            return 0

    def metrics(self) -> str:
        return http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")[1]

    def leading(self) -> bool:
        return "biaxial_controller_leader 1.0" in self.metrics()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, as the kubelet stops a pod; the exit code (killed after ``timeout``)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


# --------------------------------------------------------------------------- the plugin


def plugin_process(install: ChartInstall, root: Path, node: str) -> PluginProcess:
    """``biaxial kubelet-plugin`` for ``node`` with the chart's arguments (host directories,
    ports and the MPS root under ``root``; 4 fake T4s), under a plugin token bound to the
    chart's plugin pod on ``node``; the HAMi-core library is a placeholder file where the
    chart's init container would have installed it. Not started."""
    token = install.plugin_token(node)
    kubeconfig = install.plane.kubeconfig(root / "plugin.kubeconfig", token=token)
    pod = get(
        install.plane,
        f"/api/v1/namespaces/{install.namespace}/pods/biaxial-kubelet-plugin-{node}",
    )
    assert pod is not None
    library = root / "hami" / "libvgpu.so"
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(b"")
    args = replaced(
        chart_args("kubelet-plugin")[1:],
        {
            "--mps-root": str(root / "mps"),
            "--hami-core-library": str(library),
            "--metrics-port": str(free_port()),
            "--health-port": str(free_port()),
        },
        drop=_HOST_DIRS,
    )
    return PluginProcess(
        root, kubeconfig, node=node, extra=args, pod_uid=pod["metadata"]["uid"],
        env={"POD_NAMESPACE": install.namespace},
    )  # fmt: skip


# --------------------------------------------------------------------------- objects


def claims_path(namespace: str, name: str = "") -> str:
    return f"{RESOURCE}/namespaces/{namespace}/resourceclaims" + (f"/{name}" if name else "")


def pod_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def generated_claim(plane: ControlPlane, namespace: str, pod: str, ref: str = "gpu") -> str | None:
    """The name of the claim the resourceclaim controller made for the pod's ``ref``."""
    stored = get(plane, pod_path(namespace, pod)) or {}
    for entry in (stored.get("status") or {}).get("resourceClaimStatuses") or []:
        if entry["name"] == ref and entry.get("resourceClaimName"):
            return str(entry["resourceClaimName"])
    return None


def delete(plane: ControlPlane, path: str) -> None:
    status, body = plane.request("DELETE", path)
    if status not in (200, 202, 404):
        raise ControlPlaneError(f"DELETE {path}: {status} {body}")


# --------------------------------------------------------------------------- audit


def audit_events(plane: ControlPlane) -> Iterator[JSON]:
    with plane.audit_log.open() as log:
        for line in log:
            if line.strip():
                yield json.loads(line)


def writers(
    plane: ControlPlane, resource: str, name: str, namespace: str
) -> set[tuple[str, str, str]]:
    """(user, verb, subresource) of every successful write the audit log records for one
    object (``resource`` plural, e.g. ``resourceclaims``)."""
    out = set()
    for event in audit_events(plane):
        ref = event.get("objectRef") or {}
        if event.get("verb") in ("get", "list", "watch"):
            continue
        if ref.get("resource") != resource or ref.get("namespace") != namespace:
            continue
        if ref.get("name") != name or (event.get("responseStatus") or {}).get("code", 0) >= 300:
            continue
        out.add((event["user"]["username"], event["verb"], ref.get("subresource", "")))
    return out


def sa_user(install: ChartInstall, component: str) -> str:
    account = install.controller_account if component == "controller" else install.plugin_account
    return f"system:serviceaccount:{install.namespace}:{account}"

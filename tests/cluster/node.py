"""A real Kubernetes node on this machine for the tests (marker ``node``): containerd (CRI, CDI
on), runc, the CNI bridge and a kubelet, built from source by :mod:`tests.cluster.build`, joined
to a :class:`~tests.cluster.controlplane.ControlPlane`.

Everything lives under one short temporary directory (unix socket paths stay below 108 bytes):
containerd's root and state, its CDI spec directory, the CNI configuration and IP store, the
kubelet's root directory (its plugin registry and plugins directories included) and pod logs,
and the stand-in GPU device nodes (``mknod``). Pods run in their own cgroup subtree
(``cgroupRoot`` ``/biaxial-<id>``, cgroupfs driver) and their own bridge (``bx<id>``), so two
nodes on one machine do not meet.

:meth:`Node.stop` runs even after a failure: it stops the kubelet, kills and removes every
container through containerd, stops containerd, kills what is left of its shims and of every
process in the node's cgroups, unmounts every mount under the directory (overlay roots, network
namespaces, shm), removes the bridge, the cgroups and the directory. Each child is also told
by the kernel to die with the test process (``PR_SET_PDEATHSIG``); containerd's shims and the
containers outlive a SIGKILLed test process, and the next :meth:`Node.start` clears them
(:func:`sweep_stale`).

Machine settings it relies on: root (checked when it starts); cgroup v1 controllers (the
kubelet then needs ``failCgroupV1: false``; what this machine has) or cgroup v2 (not tried);
overlayfs; ``mknod``; no ``CAP_SYS_RESOURCE`` needed (containerd's
``restrict_oom_score_adj``).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from tests.cluster.build import Release, build_node
from tests.cluster.controlplane import (
    FEATURE_GATES,
    ControlPlane,
    ControlPlaneError,
    Process,
    free_port,
    spawn,
)
from tests.cluster.images import build_all

NAMESPACE_K8S: Final = "k8s.io"  # containerd's namespace for the CRI
CGROUP_V1: Final = Path("/sys/fs/cgroup")
_MNT_DETACH: Final = 2
DEVICE_PLUGIN_SOCKET: Final = Path("/var/lib/kubelet/device-plugins/kubelet.sock")

# The stand-in device nodes: a character device per GPU minor and the control nodes, with the
# NVIDIA driver's majors (195 for nvidia*, nvidia-uvm's is dynamic: 511 stands in for it).
CONTROL_NODES: Final = {
    "nvidiactl": (195, 255),
    "nvidia-uvm": (511, 0),
    "nvidia-uvm-tools": (511, 1),
}


class NodeError(ControlPlaneError):
    """The node did not start; the message carries the tail of the component's log."""


def cgroup_version() -> int:
    """2 on a pure cgroup v2 machine, else 1 (v1 controllers, perhaps a hybrid v2 mount)."""
    return 2 if (CGROUP_V1 / "cgroup.controllers").is_file() else 1


def cgroup_hierarchies() -> list[Path]:
    """Where a node's cgroup subtree lives: every v1 hierarchy and the hybrid cgroup2 mount
    (``unified``, where runc also creates the containers' cgroups), or the v2 root."""
    if cgroup_version() == 2:
        return [CGROUP_V1]
    return [p for p in CGROUP_V1.iterdir() if p.is_dir() and not p.is_symlink()]


def sweep_stale(tmp: Path = Path("/tmp")) -> list[Path]:
    """Clear the residue of every node whose owning test process is gone (killed without its
    finalizers); returns their directories."""
    cleared = []
    for root in sorted(tmp.glob("bxn-*")):
        owner = root / "owner"
        try:
            pid, ident = owner.read_text().split()
        except (OSError, ValueError):
            continue
        if Path(f"/proc/{pid}").exists():
            continue
        Residue(root, ident).clear()
        cleared.append(root)
    return cleared


def wait_until(check: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    """Poll ``check`` until it returns something true; that value, else TimeoutError."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except (OSError, ControlPlaneError) as err:
            last_error, value = err, None
        if value:
            return value
        time.sleep(step)
    raise TimeoutError(
        f"{what}: not after {timeout:.0f} s" + (f" ({last_error})" if last_error else "")
    )


@dataclass
class Node:
    """One node of ``plane``: :meth:`start`, then :meth:`stop`."""

    plane: ControlPlane
    release: Release
    name: str = "node-real"
    gpus: int = 4
    # GPUs partitioned into MIG instances: stand-ins for their /dev/nvidia-caps nodes too
    mig_minors: tuple[int, ...] = ()
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bxn-", dir="/tmp")))
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    processes: list[Process] = field(default_factory=list)
    ident: str = field(default_factory=lambda: secrets.token_hex(3))
    bins: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    # ----------------------------------------------------------------- paths

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_dir / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def device_dir(self) -> Path:
        """The stand-in device nodes (``nvidia0`` ... and the control nodes)."""
        return self.root / "dev"

    @property
    def pod_logs_dir(self) -> Path:
        return self.root / "pod-logs"

    @property
    def cgroup_root(self) -> str:
        return f"/biaxial-{self.ident}"

    @property
    def bridge(self) -> str:
        return f"bx{self.ident}"

    # ----------------------------------------------------------------- start

    def start(self) -> Node:
        if os.geteuid() != 0:
            raise NodeError("a real node needs root (mounts, cgroups, network namespaces)")
        started = time.monotonic()
        sweep_stale(self.root.parent)
        (self.root / "owner").write_text(f"{os.getpid()} {self.ident}\n")
        try:
            self.bins = build_node(self.release, log=False)
            self._make_devices()
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = round(time.monotonic() - started, 1)
        return self

    def _bin(self, name: str) -> str:
        assert self.bins is not None
        return str(self.bins / name)

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        proc = spawn(self.root, name, args, env)
        self.processes.append(proc)
        return proc

    def _wait(self, proc: Process, ready: Callable[[], Any], timeout: float) -> None:
        def check() -> Any:
            if proc.popen.poll() is not None:
                raise NodeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
            return ready()

        try:
            wait_until(check, timeout, f"{proc.name} ready")
        except TimeoutError as err:
            raise NodeError(f"{err}:\n{proc.tail()}") from err

    def _make_devices(self) -> None:
        self.device_dir.mkdir(parents=True)
        nodes = {f"nvidia{minor}": (195, minor) for minor in range(self.gpus)}
        for name, (major, minor) in {**nodes, **CONTROL_NODES}.items():
            os.mknod(self.device_dir / name, 0o666 | 0o020000, os.makedev(major, minor))
        caps = self.device_dir / "nvidia-caps"
        caps.mkdir()
        # the fake backend's capability numbers (driver.discovery.fake.caps_paths): 128 per GPU
        for minor in self.mig_minors:
            for cap in range(10 + minor * 128, 10 + (minor + 1) * 128):
                os.mknod(caps / f"nvidia-cap{cap}", 0o444 | 0o020000, os.makedev(508, cap))

    def _containerd_config(self) -> Path:
        base = self.root / "containerd"
        cni = self.root / "cni"
        (cni / "net.d").mkdir(parents=True)
        (cni / "bin").mkdir()
        for plugin in ("bridge", "host-local", "loopback", "portmap"):
            (cni / "bin" / plugin).symlink_to(self._bin(plugin))
        subnet = f"10.{200 + int(self.ident[:2], 16) % 50}.{int(self.ident[2:4], 16)}.0/24"
        (cni / "net.d" / "10-biaxial.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": f"biaxial-{self.ident}",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": self.bridge,
                            "isGateway": True,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": subnet}]],
                                "dataDir": str(cni / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=2,
            )
        )
        config = f"""version = 3
root = "{base / "root"}"
state = "{base / "state"}"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{base / "containerd.sock.ttrpc"}"

[plugins.'io.containerd.internal.v1.opt']
  path = "{base / "opt"}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "biaxial.test/pause:local"

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  # no CAP_SYS_RESOURCE here: never lower a container's OOM score below containerd's own
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["{self.cdi_dir}"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{self._bin("runc")}"
        Root = "{base / "runc"}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni / "bin"}"]
    conf_dir = "{cni / "net.d"}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        path = base / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        return path

    def _path_env(self) -> dict[str, str]:
        assert self.bins is not None
        return {**os.environ, "PATH": f"{self.bins}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def _start_containerd(self) -> None:
        started = time.monotonic()
        config = self._containerd_config()
        proc = self._spawn(
            "containerd",
            [self._bin("containerd"), "--config", str(config), "--log-level", "info"],
            env=self._path_env(),
        )
        self._wait(proc, lambda: self.ctr("version", check=False).returncode == 0, 60)
        self.timings["containerd"] = round(time.monotonic() - started, 1)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                self._bin("ctr"),
                "--address",
                str(self.containerd_socket),
                "-n",
                NAMESPACE_K8S,
                *args,
            ],
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def _import_images(self) -> None:
        started = time.monotonic()
        for archive in build_all(self.root / "images"):
            self.ctr("images", "import", "--no-unpack", str(archive))
        self.timings["images"] = round(time.monotonic() - started, 1)

    def _kubelet_config(self) -> Path:
        kubeconfig = self.plane.kubeconfig(self.root / "kubelet.kubeconfig", token=self.token)
        for hierarchy in cgroup_hierarchies():
            (hierarchy / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        self._healthz_port = free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self._healthz_port,
            "podLogsDir": str(self.pod_logs_dir),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "imageGCHighThresholdPercent": 100,
            "imageMinimumGCAge": "24h",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "serializeImagePulls": False,
            "syncFrequency": "2s",
            "fileCheckFrequency": "2s",
            "nodeStatusUpdateFrequency": "2s",
            "shutdownGracePeriod": "0s",
            # the release's DRA gates, as the control plane runs with them (1.37: none)
            "featureGates": {
                gate: on
                for gate, on in FEATURE_GATES.get(self.release.minor, {}).items()
                if gate.startswith("DRA")
            },
        }  # fmt: skip
        path = self.root / "kubelet-config.yaml"
        path.write_text(yaml.safe_dump(config))
        self._kubeconfig = kubeconfig
        return path

    def _start_kubelet(self) -> None:
        started = time.monotonic()
        config = self._kubelet_config()
        proc = self._spawn(
            "kubelet",
            [
                self._bin("kubelet"),
                f"--config={config}",
                f"--kubeconfig={self._kubeconfig}",
                f"--root-dir={self.kubelet_dir}",
                f"--cert-dir={self.kubelet_dir / 'pki'}",  # not under --root-dir by default
                f"--hostname-override={self.name}",
                "--v=2",
            ],
            env=self._path_env(),
        )
        self._wait(proc, self._ready, 120)
        self._untaint()
        self.timings["kubelet"] = round(time.monotonic() - started, 1)

    def _ready(self) -> bool:
        status, node = self.plane.request("GET", f"/api/v1/nodes/{self.name}")
        if status != 200:
            return False
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True"

    def _untaint(self) -> None:
        """The TaintNodesByCondition admission plugin gives a new Node the not-ready taint; the
        node lifecycle controller (not run by the test control plane) lifts it once the node is
        Ready. Lift it as that controller would."""
        for _ in range(10):
            _, node = self.plane.request("GET", f"/api/v1/nodes/{self.name}")
            taints = node["spec"].get("taints") or []
            kept = [t for t in taints if not t["key"].startswith("node.kubernetes.io/not-ready")]
            if kept == taints:
                return
            node["spec"]["taints"] = kept
            status, _ = self.plane.request("PUT", f"/api/v1/nodes/{self.name}", node)
            if status == 200:
                return
        raise NodeError(f"could not lift the not-ready taint of {self.name}")

    def kubelet(self) -> Process:
        return next(p for p in self.processes if p.name == "kubelet")

    def restart_kubelet(self) -> None:
        old = self.kubelet()
        old.stop()
        self.processes.remove(old)
        self._start_kubelet()

    # ----------------------------------------------------------------- what tests read

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What the container printed (stdout and stderr), from the kubelet's CRI log file."""
        lines: list[str] = []
        for folder in sorted(self.pod_logs_dir.glob(f"{namespace}_{pod}_*/{container}")):
            for log in sorted(folder.glob("*.log")):
                for line in log.read_text(errors="replace").splitlines():
                    parts = line.split(" ", 3)  # <time> <stream> <P|F> <text>
                    if len(parts) == 4:
                        lines.append(parts[3])
        return "\n".join(lines)

    # ----------------------------------------------------------------- stop

    def stop(self) -> None:
        """Stop and remove everything (safe to call twice, and after a failed start)."""
        # the shims, while their command lines still name the node (a shim exits by itself
        # once its containers are deleted, and an exiting process's command line is empty)
        shims = Residue(self.root, self.ident).processes()
        kubelet = [p for p in self.processes if p.name == "kubelet"]
        for proc in kubelet:
            proc.stop()
        if any(p.name == "containerd" and p.popen.poll() is None for p in self.processes):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._remove_containers()
        while self.processes:
            self.processes.pop().stop()
        Residue(self.root, self.ident).clear(keep_logs=os.environ.get("BIAXIAL_NODE_LOGS"))
        wait_gone(shims)

    def _remove_containers(self) -> None:
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        for task in tasks:
            self.ctr("tasks", "delete", "-f", task, check=False)
        containers = self.ctr("containers", "ls", "-q", check=False).stdout.split()
        if containers:
            self.ctr("containers", "delete", *containers, check=False)

    def mounts(self) -> list[str]:
        """Every mount point under the node's directory, deepest first."""
        return mounts_under(self.root)


@dataclass(frozen=True)
class Residue:
    """What a node leaves on the machine once its kubelet and containerd are gone: containerd
    shims (in their own sessions), container processes, mounts under its directory, its
    bridge, cgroups and log links, and the directory. :meth:`clear` removes all of it; it works
    from the directory and the node's id alone, so a node whose test process was killed
    (SIGKILL: no finalizer ran) is cleared by the next run (:func:`sweep_stale`)."""

    root: Path
    ident: str

    def clear(self, keep_logs: str | None = None) -> None:
        self._kill_leftovers()
        self._unmount_all()
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                ["ip", "link", "del", f"bx{self.ident}"],
                capture_output=True,
                check=False,
                timeout=10,
            )
        self._remove_cgroups()
        self._remove_log_links()
        if not any(_comm(pid) == "kubelet" for pid in _pids()):
            # the kubelet's device-plugin socket is a fixed path, left when it stops
            DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
        if keep_logs and (self.root / "logs").is_dir():
            shutil.copytree(
                self.root / "logs", Path(keep_logs) / self.root.name, dirs_exist_ok=True
            )
        shutil.rmtree(self.root, ignore_errors=True)

    def _tops(self) -> list[Path]:
        return [h / f"biaxial-{self.ident}" for h in cgroup_hierarchies()]

    def _remove_log_links(self) -> None:
        """The kubelet links each container's log into ``/var/log/containers`` (a fixed path,
        not under its root directory); remove the links into this node's directory."""
        links = Path("/var/log/containers")
        if not links.is_dir():
            return
        for link in links.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and str(link.readlink()).startswith(str(self.root) + "/"):
                    link.unlink()

    def _kill_leftovers(self) -> None:
        """Kill the containerd shims of this node (they live in their own sessions) and every
        process still in the node's cgroups (containers whose shim died first)."""
        killed = self.processes()
        for pid, cmdline in killed.items():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                if b"containerd-shim" in cmdline:
                    _shim_socket(cmdline).unlink(missing_ok=True)
        wait_gone(killed)
        for _ in range(50):
            pids = self._cgroup_pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def processes(self) -> dict[int, bytes]:
        """The node's processes outside its cgroups, by their command lines: the shims, and
        after a SIGKILLed run also the biaxial plugin and controllers (their arguments name
        files under the node's directory)."""
        marker = str(self.root).encode() + b"/"
        found: dict[int, bytes] = {}
        for pid in _pids():
            if pid == os.getpid():
                continue
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if marker in cmdline:
                    found[pid] = cmdline
        return found

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for top in self._tops():
            if top.is_dir():
                for procs in top.rglob("cgroup.procs"):
                    with contextlib.suppress(OSError):
                        pids |= {int(p) for p in procs.read_text().split()}
        return pids

    def _remove_cgroups(self) -> None:
        for top in self._tops():
            if not top.is_dir():
                continue
            for folder in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def _unmount_all(self) -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        for _ in range(5):
            points = mounts_under(self.root)
            if not points:
                return
            for point in points:
                libc.umount2(point.encode(), _MNT_DETACH)


def wait_gone(pids: Iterable[int], timeout: float = 10.0) -> None:
    """Wait (at most ``timeout``) until none of ``pids`` exists: processes that are not our
    children (a shim lives in its own session, reparented to init once containerd stops) are
    gone only once init has reaped them, and until then ``ps`` still lists them (CI once found
    a shim right after the suite)."""
    pending = list(pids)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if Path(f"/proc/{p}").exists()]
        if pending:
            time.sleep(0.05)


def _shim_socket(cmdline: bytes) -> Path:
    """The socket a killed shim leaves in containerd's fixed ``/run/containerd/s``: named by
    the SHA-256 of ``<address>/<namespace>/<id>`` (containerd's ``shim.SocketAddress``)."""
    args = cmdline.decode(errors="replace").split("\0")
    value = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("-")}
    key = str(Path(value.get("-address", "/")) / value.get("-namespace", "") / value.get("-id", ""))
    return Path("/run/containerd/s") / hashlib.sha256(key.encode()).hexdigest()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _pids() -> Iterable[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4].replace("\\040", " ")
        if point.startswith(prefix) or point == str(root):
            points.append(point)
    return sorted(set(points), key=lambda p: -p.count("/"))

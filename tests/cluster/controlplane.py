"""Run upstream's real control plane on this machine for the tests: etcd, kube-apiserver,
kube-controller-manager, and on request kube-scheduler and kwok.

Everything listens on 127.0.0.1 only, lives in one temporary directory (etcd's data on
``/dev/shm`` where there is one) and is stopped and removed by :meth:`ControlPlane.stop`, which
the fixtures call even after a failed test or Ctrl-C. Each child runs in its own session and is
told by the kernel to die with its parent (``PR_SET_PDEATHSIG``), so not even a ``kill -9`` of
the test process leaves one behind.

The API server runs as a cluster's would for biaxial: RBAC and Node authorization,
NodeRestriction admission, a serving certificate from the run's own CA (clients verify it; no
``insecure-skip-tls-verify``), a service-account signing key so tests mint real ServiceAccount
tokens through the TokenRequest API, an audit log (every request, metadata level) so a test can
prove what a component did or did not do, and the DRA feature gates of its release
(:data:`FEATURE_GATES`). The administrator's and the controller manager's credentials are
static tokens in ``system:masters``.

The ``ServiceAccount`` admission plugin is off, as in controller-runtime's envtest: tests create
a namespace and at once a pod in it, before the service-account controller could have created
the namespace's ``default`` account, and no test pod mounts an account token.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from kubeapi import codec
from tests.cluster.build import Release, binaries

# Feature gates per release minor: DRA's alpha features biaxial uses are switched on where
# they are alpha, and MutatingAdmissionPolicy (the chart's admission step) where it is beta and
# off; nothing is passed to a release that has the gate on by default or locked (a
# gate a release does not know, or a locked gate set to false, stops the component).
FEATURE_GATES: Final[Mapping[str, Mapping[str, bool]]] = {
    "1.34": {
        "DRAExtendedResource": True,
        "DRAConsumableCapacity": True,
        "DRAPartitionableDevices": True,
        "DRADeviceTaints": True,
        "DRADeviceBindingConditions": True,
        "MutatingAdmissionPolicy": True,
    },
    "1.35": {
        "DRAExtendedResource": True,
        "DRAConsumableCapacity": True,
        "DRAPartitionableDevices": True,
        "DRADeviceTaints": True,
        "DRADeviceBindingConditions": True,
        "MutatingAdmissionPolicy": True,
    },
    "1.36": {},
    "1.37": {},
}
# API versions a release serves only when asked (--runtime-config): MutatingAdmissionPolicy is
# beta and off in 1.34 and 1.35 (admissionregistration.k8s.io/v1beta1, with its gate above), GA
# and served as v1 from 1.36.
RUNTIME_CONFIG: Final[Mapping[str, tuple[str, ...]]] = {
    "1.34": ("admissionregistration.k8s.io/v1beta1=true",),
    "1.35": ("admissionregistration.k8s.io/v1beta1=true",),
}
KCM_CONTROLLERS: Final = (
    "resourceclaim-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "ephemeral-volume-controller",
    "persistentvolume-binder-controller",
    "serviceaccount-controller",
    "disruption-controller",
    "root-ca-certificate-publisher-controller",
)
ADMIN_TOKEN_USER: Final = "biaxial-test-admin"
KWOK_STAGES: Final = Path(__file__).with_name("kwok-stages.yaml")
_PR_SET_PDEATHSIG: Final = 1


class ControlPlaneError(Exception):
    """A component did not start; the message carries the tail of its log."""


def _die_with_parent() -> None:
    # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- PKI


@dataclass(frozen=True, slots=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path


def make_pki(directory: Path) -> Pki:
    """A CA, a serving certificate for 127.0.0.1/localhost (and the in-cluster service names)
    signed by it, and an RSA key for service-account tokens."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def write_key(path: Path, key: Any) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "biaxial-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    serving_key = ec.generate_private_key(ec.SECP256R1())
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in names]
                + [
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "serving.crt",
        serving_key=directory / "serving.key",
        sa_key=directory / "sa.key",
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    write_key(pki.serving_key, serving_key)
    write_key(pki.sa_key, rsa.generate_private_key(public_exponent=65537, key_size=2048))
    return pki


# --------------------------------------------------------------------------- processes


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=timeout)


def spawn(root: Path, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
    """Start ``args`` in its own session, dying with this process, output in
    ``<root>/logs/<name>.log`` (appended to: a restart keeps the earlier output)."""
    log = root / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, no locks taken
        )
    return Process(name, popen, log)


@dataclass
class ControlPlane:
    """One control plane in a temporary directory. :meth:`start`, then :meth:`stop`."""

    release: Release
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="biaxial-cp-")))
    audit: bool = True
    processes: list[Process] = field(default_factory=list)
    port: int = 0
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    # node name -> static token of its kubelet (user system:node:<name>, group system:nodes,
    # as the Node authorizer and NodeRestriction expect); set before start()
    node_tokens: dict[str, str] = field(default_factory=dict)
    _etcd_dir: Path | None = None
    _tokens: dict[str, str] = field(default_factory=dict)

    # ----------------------------------------------------------------- what clients need

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def pki(self) -> Pki:
        d = self.root / "pki"
        return Pki(d / "ca.crt", d / "serving.crt", d / "serving.key", d / "sa.key")

    @property
    def audit_log(self) -> Path:
        return self.root / "audit.log"

    def kubeconfig(self, path: Path | None = None, *, token: str | None = None) -> Path:
        """A kubeconfig for ``token`` (the administrator's when None), verifying the CA."""
        name = "admin" if token is None else f"user-{secrets.token_hex(4)}"
        path = path or self.root / f"{name}.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.pki.ca_cert)},
                }
            ],
            "users": [{"name": name, "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def client_configuration(self, token: str | None = None) -> Any:
        """A ``kubernetes.client.Configuration`` for ``token`` (the administrator's when None)."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        config.ssl_ca_cert = str(self.pki.ca_cert)
        config.api_key = {"authorization": f"Bearer {token or self.admin_token}"}
        return config

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki.ca_cert))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One raw request as ``token`` (the administrator when None): (status, parsed JSON).
        ``content_type`` names a patch's kind (``application/merge-patch+json``, ...)."""
        data = None if body is None else codec.dumps(body)
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {token or self.admin_token}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=30) as resp:
                return resp.status, _parsed(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _parsed(err.read())

    def apply(self, objects: Iterable[Mapping[str, Any]]) -> None:
        """Server-side apply each object as the administrator (a rerun changes nothing)."""
        for obj in objects:
            status, body = self._apply_one(obj)
            if status >= 300:
                raise ControlPlaneError(f"applying {obj['kind']} {obj['metadata']['name']}: {body}")

    def _apply_one(self, obj: Mapping[str, Any]) -> tuple[int, Any]:
        data = codec.dumps(obj)
        req = urllib.request.Request(
            self.url + object_path(obj) + "?fieldManager=biaxial-test&force=true",
            data=data,
            method="PATCH",
            headers={
                "Authorization": f"Bearer {self.admin_token}",
                "Content-Type": "application/apply-patch+yaml",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=30) as resp:
                return resp.status, codec.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        seconds: int = 3600,
        create: bool = True,
        bound_pod: Mapping[str, Any] | None = None,
    ) -> str:
        """A real token for ServiceAccount ``namespace/name`` (created when missing), minted by
        the API server's TokenRequest API and signed with the run's service-account key.

        With ``bound_pod`` (a stored Pod of that account) the token is bound to the pod, and
        the API server adds the pod's node to the user's extra fields
        (``authentication.kubernetes.io/node-name``), as for a pod's projected token."""
        if create:
            self._ensure(f"/api/v1/namespaces/{namespace}", "Namespace", namespace, None)
            self._ensure(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}",
                "ServiceAccount",
                name,
                namespace,
            )
        bound: dict[str, Any] = {}
        if bound_pod is not None:
            meta = bound_pod["metadata"]
            ref = {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}
            bound = {"boundObjectRef": ref}
        status, body = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds, **bound},
            },
        )
        if status != 201:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name}: {status} {body}")
        return str(body["status"]["token"])

    def _ensure(self, path: str, kind: str, name: str, namespace: str | None) -> None:
        if self.request("GET", path)[0] == 200:
            return
        collection = path.rsplit("/", 1)[0]
        meta: dict[str, Any] = {"name": name}
        if namespace:
            meta["namespace"] = namespace
        status, body = self.request(
            "POST", collection, {"apiVersion": "v1", "kind": kind, "metadata": meta}
        )
        if status not in (201, 409):
            raise ControlPlaneError(f"creating {kind} {name}: {status} {body}")

    # ----------------------------------------------------------------- life cycle

    def _spawn(self, name: str, args: list[str]) -> Process:
        proc = spawn(self.root, name, args)
        self.processes.append(proc)
        return proc

    def _wait(self, proc: Process, ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise ControlPlaneError(
                    f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}"
                )
            with contextlib.suppress(OSError, ssl.SSLError, ValueError):
                if ready():
                    return
            time.sleep(0.1)
        raise ControlPlaneError(f"{proc.name} not ready after {timeout:.0f} s:\n{proc.tail()}")

    def _gates(self) -> list[str]:
        gates = FEATURE_GATES.get(self.release.minor, {})
        if not gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items())]

    def start(
        self,
        *,
        scheduler: bool = False,
        kwok: bool = False,
        extra_apiserver_args: Iterable[str] = (),
    ) -> ControlPlane:
        needed = ["etcd", "kube-apiserver", "kube-controller-manager"]
        needed += ["kube-scheduler"] if scheduler else []
        needed += ["kwok"] if kwok else []
        found = binaries(self.release, tuple(needed))
        missing = [n for n in needed if n not in found]
        if missing:
            raise FileNotFoundError(
                f"no {', '.join(missing)} binary for Kubernetes {self.release.kubernetes}: run "
                "`make control-plane`, or point KUBEBUILDER_ASSETS / TEST_ASSET_<NAME> at yours"
            )
        try:
            make_pki(self.root / "pki")
            self._start_etcd(found["etcd"])
            self._start_apiserver(found["kube-apiserver"], list(extra_apiserver_args))
            self._start_controller_manager(found["kube-controller-manager"])
            if scheduler:
                self.start_scheduler(found["kube-scheduler"])
            if kwok:
                self.start_kwok(found["kwok"])
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self, binary: Path) -> None:
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.root
        self._etcd_dir = Path(tempfile.mkdtemp(prefix="biaxial-etcd-", dir=base))
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = self._spawn(
            "etcd",
            [
                str(binary),
                f"--data-dir={self._etcd_dir}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")

        self._wait(proc, healthy, 30)

    def _start_apiserver(self, binary: Path, extra: list[str]) -> None:
        self.port = free_port()
        pki = self.pki
        tokens = self.root / "tokens.csv"
        self._tokens = {
            "admin": self.admin_token,
            "kcm": secrets.token_hex(16),
            "scheduler": secrets.token_hex(16),
            "kwok": secrets.token_hex(16),
        }
        tokens.write_text(
            "\n".join(
                [
                    f'{self._tokens["admin"]},{ADMIN_TOKEN_USER},uid-admin,"system:masters"',
                    f'{self._tokens["kcm"]},system:kube-controller-manager,uid-kcm,"system:masters"',
                    f'{self._tokens["scheduler"]},system:kube-scheduler,uid-sched,"system:masters"',
                    f'{self._tokens["kwok"]},kwok-controller,uid-kwok,"system:masters"',
                    *(
                        f'{token},system:node:{node},uid-node-{node},"system:nodes"'
                        for node, token in self.node_tokens.items()
                    ),
                ]
            )
            + "\n"
        )
        tokens.chmod(0o600)
        args = [
            str(binary),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={pki.sa_key}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--token-auth-file={tokens}",
            "--enable-admission-plugins=NodeRestriction",
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.root / 'pki'}",
            *self._gates(),
            *(
                [f"--runtime-config={','.join(RUNTIME_CONFIG[self.release.minor])}"]
                if self.release.minor in RUNTIME_CONFIG
                else []
            ),
            *extra,
        ]
        if self.audit:
            policy = self.root / "audit-policy.yaml"
            policy.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "audit.k8s.io/v1",
                        "kind": "Policy",
                        "omitStages": ["RequestReceived"],
                        "rules": [{"level": "Metadata"}],
                    }
                )
            )
            args += [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
            ]
        proc = self._spawn("kube-apiserver", args)
        self._wait(proc, lambda: self.request("GET", "/readyz")[0] == 200, 120)

    def _component_kubeconfig(self, who: str) -> Path:
        return self.kubeconfig(self.root / f"{who}.kubeconfig", token=self._tokens[who])

    def _healthz(self, port: int) -> bool:
        url = f"https://127.0.0.1:{port}/healthz"
        with urllib.request.urlopen(url, context=self.ssl_context(), timeout=2) as resp:
            return bool(resp.status == 200)

    def _start_controller_manager(self, binary: Path) -> None:
        port = free_port()
        kc = self._component_kubeconfig("kcm")
        proc = self._spawn(
            "kube-controller-manager",
            [
                str(binary),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--controllers={','.join(KCM_CONTROLLERS)}",
                f"--root-ca-file={self.pki.ca_cert}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                "--kube-api-qps=5000",
                "--kube-api-burst=5000",
                *self._gates(),
            ],
        )
        self._wait(proc, lambda: self._healthz(port), 60)

    def start_scheduler(
        self, binary: Path | None = None, *, qps: int = 5000, burst: int = 5000
    ) -> Process:
        """kube-scheduler with its default profile, DRA on, the given client limits."""
        binary = binary or binaries(self.release, ("kube-scheduler",))["kube-scheduler"]
        port = free_port()
        kc = self._component_kubeconfig("scheduler")
        config = self.root / "scheduler-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(kc), "qps": qps, "burst": burst},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        proc = self._spawn(
            "kube-scheduler",
            [
                str(binary),
                f"--config={config}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                *self._gates(),
            ],
        )
        self._wait(proc, lambda: self._healthz(port), 60)
        return proc

    def start_kwok(self, binary: Path | None = None) -> Process:
        """kwok managing the nodes annotated ``kwok.x-k8s.io/node: fake``, with kwok's own
        "fast" stages (:data:`KWOK_STAGES`): the binary has none of its own."""
        binary = binary or binaries(self.release, ("kwok",))["kwok"]
        port = free_port()
        proc = self._spawn(
            "kwok",
            [
                str(binary),
                f"--kubeconfig={self._component_kubeconfig('kwok')}",
                f"--config={KWOK_STAGES}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--server-address=127.0.0.1:{port}",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)

        self._wait(proc, healthy, 60)
        return proc

    def stop(self) -> None:
        """Stop every process (newest first) and remove every file; safe to call twice."""
        while self.processes:
            self.processes.pop().stop()
        if self._etcd_dir is not None:
            shutil.rmtree(self._etcd_dir, ignore_errors=True)
            self._etcd_dir = None
        shutil.rmtree(self.root, ignore_errors=True)


def _parsed(raw: bytes) -> Any:
    """A body as JSON, or as text where it is not JSON (``/readyz`` answers ``ok``)."""
    if not raw:
        return None
    try:
        return codec.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def object_path(obj: Mapping[str, Any]) -> str:
    """The REST path of a built-in object (English plurals, as every built-in kind has)."""
    api_version = str(obj["apiVersion"])
    kind = str(obj["kind"])
    meta = obj["metadata"]
    lower = kind.lower()
    plural = (
        lower + "es"
        if lower.endswith("s")
        else lower[:-1] + "ies"
        if lower.endswith("y")
        else lower + "s"
    )
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind in _CLUSTER_SCOPED:
        return f"{base}/{plural}/{meta['name']}"
    return f"{base}/namespaces/{meta.get('namespace', 'default')}/{plural}/{meta['name']}"


_CLUSTER_SCOPED: Final = {
    "Namespace",
    "Node",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ResourceSlice",
    "PriorityClass",
    "StorageClass",
    "PersistentVolume",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "CSIDriver",
    "CSINode",
    "VolumeAttachment",
    "RuntimeClass",
}

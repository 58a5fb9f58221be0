"""The kubelet plugin's settings: one frozen :class:`Settings`, validated once at start.

Built by ``biaxial kubelet-plugin`` from flags, each with an environment twin (flag wins;
``BIAXIAL_<FLAG>`` and the conventional ``NODE_NAME`` / ``KUBECONFIG``). :meth:`Settings.validate`
raises :class:`~driver.api.errors.ConfigError` with one line naming the flag; nothing else in the
plugin re-checks them. Socket paths are derived here:

* registration ``<registry_dir>/<driver>-reg.sock`` (``<driver>-<pod-uid>-reg.sock`` when a
  pod UID is given, as the Go helper's rolling-update mode; hashed when that gets too long);
* DRA service ``<plugin_dir>/<driver>/dra.sock`` (``dra-<pod-uid>.sock`` with a pod UID).

Unix socket paths must be shorter than 108 bytes (``sun_path``); longer ones are refused with
the path in the message.

HAMi-core's ``libvgpu.so`` is looked for at :data:`DEFAULT_HAMI_CORE_LIBRARY` unless
``--hami-core-library`` says otherwise (``none`` = no library), where the chart's init container
installs it; :func:`with_installed_hami_core` drops a configured path that holds no file when
the plugin starts, so shares under hami-core are refused with a message instead of being given
a mount the container runtime cannot make.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from driver.api.config import SharingStrategy, parse_strategies
from driver.api.errors import ConfigError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.discovery.fake import builtin_profiles
from driver.discovery.mig import DynamicMigPolicy
from kubeletplugin.prepare import PrepareSettings

log = logging.getLogger(f"biaxial.{__name__}")

MAX_SOCKET_PATH: Final = 107  # bytes; sun_path is 108 including the terminating NUL
_DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_UID: Final = re.compile(r"[A-Za-z0-9-]{1,64}")
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MAX_REG_NAME: Final = 80
#: Where the chart installs HAMi-core's libvgpu.so on each node (a host path; the plugin pod
#: sees its directory read-only at the same path).
DEFAULT_HAMI_CORE_LIBRARY: Final = Path("/var/lib/biaxial/hami-core/libvgpu.so")
#: ``--mps-root`` bound: a claim's daemon sockets live in ``<root>/<claim UID (36)>/gpu-<minor>/
#: pipe/``, and their names take up to 18 bytes; the whole path must fit a unix socket's 107.
MAX_MPS_ROOT: Final = 38


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything the plugin process is configured with (see the module docstring)."""

    node_name: str
    kubeconfig: Path | None = None
    fake_gpus: str | None = None
    # with fake_gpus: the host directory of stand-in device nodes the CDI specs point at
    fake_device_dir: Path | None = None
    driver_name: str = DEFAULT_DRIVER_NAME
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugin_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = Path("/var/lib/biaxial")
    pod_uid: str = ""
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"  # /metrics stays in the pod unless told otherwise
    health_port: int = 0  # the probes alone, for the kubelet (0 = off)
    health_address: str = "0.0.0.0"  # noqa: S104 - the kubelet probes the pod's IP
    remove_slices_on_exit: bool = False
    advertise_legacy_resources: bool = False
    hami_core_library_path: Path | None = DEFAULT_HAMI_CORE_LIBRARY
    mps_root: Path = Path("/run/biaxial/mps")
    # GPUs partitioned on demand (off by default); GPUs a fake profile declares are added.
    dynamic_mig: DynamicMigPolicy = field(default_factory=DynamicMigPolicy)
    max_shares_per_gpu: int = 0  # 0: no cap
    # The node's sharing policy: strategies a GPU share may use here (no "none": no share runs
    # without limits).
    share_strategies: tuple[SharingStrategy, ...] = ("hami-core", "mps")
    health_check_timeout_s: int = 30
    health_resend_s: float = 10.0
    xid_quiet_s: float = 300.0
    rediscover_s: float = 60.0
    resync_s: float = 60.0
    reconcile_s: float = 60.0
    release_grace_s: float = 300.0
    event_namespace: str = "default"
    grace_s: float = 5.0

    # ----------------------------------------------------------------- derived

    @property
    def registration_socket(self) -> Path:
        if not self.pod_uid:
            return self.registry_dir / f"{self.driver_name}-reg.sock"
        name = f"{self.driver_name}-{self.pod_uid}-reg.sock"
        if len(name) > _MAX_REG_NAME:
            digest = base64.urlsafe_b64encode(hashlib.sha256(self.pod_uid.encode()).digest())
            name = f"{self.driver_name}-{digest.decode()[:8]}-reg.sock"
        return self.registry_dir / name

    @property
    def dra_socket(self) -> Path:
        base = self.plugin_dir / self.driver_name
        return base / (f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock")

    @property
    def fake_mig_state(self) -> Path:
        """Test-only: where the fake backend keeps its MIG instances, so they outlive the
        process as NVML's do."""
        return self.state_dir / "fake-nvml-mig.json"

    @property
    def inject_dir(self) -> Path:
        """Test-only: where the fake backend takes injected health/discovery events from."""
        return self.state_dir / "fake-inject"

    def prepare_settings(self) -> PrepareSettings:
        return PrepareSettings(
            driver_name=self.driver_name,
            node_name=self.node_name,
            state_dir=self.state_dir,
            cdi_dir=self.cdi_dir,
            hami_core_library_path=self.hami_core_library_path,
            mps_root=self.mps_root,
            fake_device_dir=self.fake_device_dir,
            max_shares_per_gpu=self.max_shares,
            share_strategies=self.share_strategies,
        )

    @property
    def max_shares(self) -> int | None:
        """The share cap per GPU, ``None`` for no cap."""
        return self.max_shares_per_gpu or None

    # ----------------------------------------------------------------- validation

    def validate(self) -> Settings:
        """Return self when every setting is usable, else raise one clear ConfigError."""
        if not self.node_name:
            raise ConfigError("--node-name is required (or set NODE_NAME / BIAXIAL_NODE_NAME)")
        if len(self.node_name) > 253 or not _DNS_SUBDOMAIN.fullmatch(self.node_name):
            raise ConfigError(f"--node-name {self.node_name!r} is not a valid node name")
        if len(self.driver_name) > 63 or not _DNS_SUBDOMAIN.fullmatch(self.driver_name):
            raise ConfigError(
                f"--driver-name {self.driver_name!r} must be a DNS subdomain of at most 63 "
                "characters"
            )
        if self.pod_uid and not _UID.fullmatch(self.pod_uid):
            raise ConfigError(f"--pod-uid {self.pod_uid!r} is not a UID")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port {self.metrics_port} is not 0 (off) or a port")
        if not 0 <= self.health_port <= 65535:
            raise ConfigError(f"--health-port {self.health_port} is not 0 (off) or a port")
        if self.health_port and self.health_port == self.metrics_port:
            raise ConfigError(f"--health-port and --metrics-port are both {self.health_port}")
        if (
            self.fake_gpus is not None
            and self.fake_gpus not in builtin_profiles()
            and not Path(self.fake_gpus).is_file()
        ):
            raise ConfigError(
                f"--fake-gpus {self.fake_gpus!r} is neither a built-in profile "
                f"({', '.join(builtin_profiles())}) nor a profile file"
            )
        if self.fake_device_dir is not None:
            if self.fake_gpus is None:
                raise ConfigError("--fake-device-dir needs --fake-gpus (stand-ins for fake GPUs)")
            if not self.fake_device_dir.is_absolute() or not self.fake_device_dir.is_dir():
                raise ConfigError(
                    f"--fake-device-dir {self.fake_device_dir} must be an existing absolute "
                    "directory"
                )
        if self.kubeconfig is not None and not self.kubeconfig.is_file():
            raise ConfigError(f"--kubeconfig {self.kubeconfig}: no such file")
        for flag, value in (
            ("--health-resend-seconds", self.health_resend_s),
            ("--xid-quiet-seconds", self.xid_quiet_s),
            ("--rediscover-seconds", self.rediscover_s),
            ("--resync-seconds", self.resync_s),
            ("--reconcile-seconds", self.reconcile_s),
        ):
            if value <= 0:
                raise ConfigError(f"{flag} must be positive, got {value}")
        if self.max_shares_per_gpu < 0:
            raise ConfigError(
                f"--max-shares-per-gpu must be 0 (no cap) or positive, got "
                f"{self.max_shares_per_gpu}"
            )
        parse_strategies(list(self.share_strategies), "--share-strategies")
        if self.release_grace_s < 0:
            raise ConfigError(
                f"--release-grace-seconds must be 0 or positive, got {self.release_grace_s}"
            )
        if len(self.event_namespace) > 63 or not _DNS_LABEL.fullmatch(self.event_namespace):
            raise ConfigError(f"--event-namespace {self.event_namespace!r} is not a namespace name")
        if self.health_check_timeout_s <= 0:
            raise ConfigError("--health-check-timeout-seconds must be positive")
        for flag, path in (
            ("--registry-dir", self.registry_dir),
            ("--plugin-dir", self.plugin_dir),
            ("--cdi-dir", self.cdi_dir),
            ("--state-dir", self.state_dir),
        ):
            if not path.is_absolute():
                raise ConfigError(f"{flag} {path} must be an absolute path")
        hami = self.hami_core_library_path
        if hami is not None and not hami.is_absolute():
            raise ConfigError(f"--hami-core-library {hami} must be an absolute path (or none)")
        if not self.mps_root.is_absolute() or len(str(self.mps_root).encode()) > MAX_MPS_ROOT:
            raise ConfigError(
                f"--mps-root {self.mps_root} must be an absolute path of at most {MAX_MPS_ROOT} "
                "bytes (MPS daemon sockets live below it, and unix socket paths are limited to "
                "107 bytes)"
            )
        for what, sock in (
            ("registration socket", self.registration_socket),
            ("DRA socket", self.dra_socket),
        ):
            size = len(str(sock).encode())
            if size > MAX_SOCKET_PATH:
                raise ConfigError(
                    f"{what} path {sock} is {size} bytes; unix socket paths must be shorter "
                    f"than {MAX_SOCKET_PATH + 1} bytes (use a shorter directory)"
                )
        return self


def with_installed_hami_core(prepare: PrepareSettings) -> PrepareSettings:
    """``prepare``, without its HAMi-core library path when no file is there (logged once, at
    start): shares under hami-core are then refused with a message until the library is
    installed and the plugin restarted."""
    path = prepare.hami_core_library_path
    if path is None:
        log.info("no HAMi-core library configured: GPU shares under hami-core are refused")
        return prepare
    if path.is_file():
        version = path.with_name("VERSION")
        about = "version unknown"
        if version.is_file():
            about = version.read_text(encoding="utf-8").strip()
        log.info("HAMi-core library %s (%s)", path, about)
        return prepare
    log.warning(
        "HAMi-core library %s not found: GPU shares under the hami-core sharing strategy are "
        "refused until it is installed and the plugin restarted (docs/sharing.md)",
        path,
    )
    return dataclasses.replace(prepare, hami_core_library_path=None)

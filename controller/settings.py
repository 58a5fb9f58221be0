"""The controller's settings: one frozen :class:`Settings`, built from flags (with environment
twins) by the CLI, validated once at start and passed down explicitly.

Contract: :meth:`Settings.validate` raises :class:`~driver.api.errors.ConfigError` (or
:class:`~driver.api.errors.PolicyError` for a policy) naming the offending setting; a Settings
object that passed validation is never changed afterwards (it is frozen).
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from dataclasses import dataclass, field
from typing import Final, Literal

from controller.logs import LOG_FORMATS, LogFormat
from driver.api.errors import ConfigError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.scheduling.policy import PolicyDefaults
from driver.scheduling.topologyspread import DefaultSpreading
from kubeapi.serving import is_loopback

DEFAULT_SCHEDULER_NAME: Final = "biaxial"
DEFAULT_LEASE_NAME: Final = "biaxial-controller"
DEFAULT_LEASE_NAMESPACE: Final = "kube-system"
FIELD_MANAGER: Final = "biaxial-controller"
#: client-go's leaderelection ``JitterFactor``: a candidate waits retry period x (1 + up to
#: this), and the renew deadline must exceed retry period x this.
LEADER_JITTER_FACTOR: Final = 1.2

_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
#: ``none``: /metrics as plain HTTP, on a loopback address only; ``delegated``: HTTPS, and
#: only for callers the API server authenticates and authorizes (kube-scheduler's way)
MetricsAuth = Literal["none", "delegated"]
METRICS_AUTH: Final[tuple[MetricsAuth, ...]] = ("none", "delegated")
#: the chart's default admission.schedulers
DEFAULT_ADMISSION_SCHEDULERS: Final = (
    "default-scheduler",
    "hami-scheduler",
    "volcano",
    "kai-scheduler",
)
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the controller process needs to know, validated by :meth:`validate`."""

    kubeconfig: str | None = None
    policies: PolicyDefaults = field(default_factory=PolicyDefaults)
    spreading: DefaultSpreading = field(default_factory=DefaultSpreading)
    qps: float = 100.0
    burst: int = 200
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    driver_name: str = DEFAULT_DRIVER_NAME
    leader_elect: bool = True
    lease_namespace: str = DEFAULT_LEASE_NAMESPACE
    lease_name: str = DEFAULT_LEASE_NAME
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    identity: str = field(default_factory=_default_identity)
    #: /metrics (and the probes) listen here; a non-loopback address needs delegated auth
    metrics_bind_address: str = "127.0.0.1"
    metrics_port: int = 8080  # 0 disables the metrics listener
    metrics_auth: MetricsAuth = "none"
    tls_cert_file: str | None = None  # the serving certificate of /metrics with delegated auth
    tls_private_key_file: str | None = None
    #: the probes alone (/healthz, /livez, /readyz), for the kubelet: 0 disables the listener
    health_bind_address: str = "0.0.0.0"  # noqa: S104 - the kubelet probes the pod's IP
    health_port: int = 0
    #: the admission webhook (POST /mutate-pods over TLS; controller.webhook): 0 = not served
    admission_webhook_port: int = 0
    admission_webhook_bind_address: str = "0.0.0.0"  # noqa: S104 - the Service reaches the pod
    admission_tls_cert_file: str | None = None
    admission_tls_private_key_file: str | None = None
    #: the scheduler names admission takes over (the chart's admission.schedulers)
    admission_schedulers: tuple[str, ...] = DEFAULT_ADMISSION_SCHEDULERS
    max_concurrent_writes: int = 16
    binding_timeout_s: float = 600.0  # kube-scheduler's DynamicResourcesArgs.bindingTimeout
    #: How long a placement waits for its claims to be bound (static PVs by the PV controller,
    #: new volumes by the provisioner) before it is rolled back and the pod retried.
    volume_bind_timeout_s: float = 120.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 10.0
    unschedulable_flush_s: float = 60.0
    #: kube-scheduler's DynamicResources ``filterTimeout``: the most one pod's decision may
    #: spend evaluating CEL selectors before it is abandoned (0 = no deadline)
    decision_timeout_s: float = 10.0
    watch_timeout_s: int = 300
    request_timeout_s: float = 30.0
    shutdown_grace_s: float = 10.0
    log_format: LogFormat = "text"

    @property
    def finalizer(self) -> str:
        """The controller's own claim finalizer (never the reserved built-in one)."""
        return f"{self.driver_name}/allocation"

    def validate(self) -> Settings:
        """Check every field; returns self so ``Settings(...).validate()`` reads naturally."""
        if self.kubeconfig is not None and not os.path.isfile(self.kubeconfig):  # noqa: PTH113
            raise ConfigError(f"--kubeconfig: no such file: {self.kubeconfig}")
        if not self.qps > 0:
            raise ConfigError(f"--qps must be > 0, got {self.qps}")
        if self.burst < 1:
            raise ConfigError(f"--burst must be >= 1, got {self.burst}")
        if not _DNS_SUBDOMAIN.match(self.driver_name) or len(self.driver_name) > 63:
            raise ConfigError(
                f"--driver-name: {self.driver_name!r} is not a DNS subdomain "
                "of at most 63 characters"
            )
        if not _DNS_SUBDOMAIN.match(self.scheduler_name) or len(self.scheduler_name) > 253:
            raise ConfigError(f"--scheduler-name: {self.scheduler_name!r} is not a DNS subdomain")
        if not _DNS_LABEL.match(self.lease_namespace) or len(self.lease_namespace) > 63:
            raise ConfigError(f"--lease-namespace: {self.lease_namespace!r} is not a DNS label")
        if not _DNS_SUBDOMAIN.match(self.lease_name):
            raise ConfigError(f"--lease-name: {self.lease_name!r} is not a DNS subdomain")
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ConfigError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s} / {self.renew_deadline_s} / {self.lease_duration_s} s"
            )
        if self.renew_deadline_s <= LEADER_JITTER_FACTOR * self.retry_period_s:
            raise ConfigError(
                f"leader election needs renew deadline > {LEADER_JITTER_FACTOR} x retry period "
                f"(as client-go), got {self.renew_deadline_s} and {self.retry_period_s} s"
            )
        self._validate_endpoints()
        if self.max_concurrent_writes < 1:
            raise ConfigError(
                f"--max-concurrent-writes must be >= 1, got {self.max_concurrent_writes}"
            )
        if self.binding_timeout_s < 1:
            raise ConfigError(
                f"--binding-timeout must be >= 1 second (as kube-scheduler's bindingTimeout), "
                f"got {self.binding_timeout_s:g}"
            )
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ConfigError(
                "backoff needs 0 < initial <= max, got "
                f"{self.backoff_initial_s} / {self.backoff_max_s} s"
            )
        if not self.volume_bind_timeout_s > 0:
            raise ConfigError(
                f"--volume-bind-timeout must be > 0 seconds, got {self.volume_bind_timeout_s}"
            )
        if self.unschedulable_flush_s <= 0:
            raise ConfigError("the unschedulable flush interval must be > 0")
        if not 0 <= self.decision_timeout_s < float("inf"):
            raise ConfigError(
                f"--decision-timeout must be a number of seconds >= 0 (0: none), got "
                f"{self.decision_timeout_s}"
            )
        if self.watch_timeout_s < 1 or self.request_timeout_s <= 0:
            raise ConfigError("watch and request timeouts must be positive")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"--log-format: {self.log_format!r} is not one of {', '.join(LOG_FORMATS)}"
            )
        if not self.identity:
            raise ConfigError("--identity must not be empty")
        return self

    def _validate_webhook(self) -> None:
        port = self.admission_webhook_port
        if not 0 <= port <= 65535:
            raise ConfigError(f"--admission-webhook-port must be in 0..65535, got {port}")
        if not port:
            return
        for flag, other in (
            ("--metrics-port", self.metrics_port),
            ("--health-port", self.health_port),
        ):
            if port == other:
                raise ConfigError(f"--admission-webhook-port and {flag} are both {port}")
        for flag, path in (
            ("--admission-tls-cert-file", self.admission_tls_cert_file),
            ("--admission-tls-private-key-file", self.admission_tls_private_key_file),
        ):
            if not path or not os.path.isfile(path):  # noqa: PTH113
                raise ConfigError(
                    f"{flag}: the admission webhook is served over HTTPS only (the API server "
                    f"calls webhooks over TLS) and needs a serving certificate and key (got "
                    f"{path or 'none'})"
                )
        if not self.admission_schedulers:
            raise ConfigError("--admission-schedulers: name at least one scheduler to take over")
        for name in self.admission_schedulers:
            if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
                raise ConfigError(f"--admission-schedulers: {name!r} is not a scheduler name")

    def _validate_endpoints(self) -> None:
        for flag, port in (
            ("--metrics-port", self.metrics_port),
            ("--health-port", self.health_port),
        ):
            if not 0 <= port <= 65535:
                raise ConfigError(f"{flag} must be in 0..65535, got {port}")
        if self.metrics_port and self.metrics_port == self.health_port:
            raise ConfigError(f"--health-port and --metrics-port are both {self.metrics_port}")
        self._validate_webhook()
        if self.metrics_auth not in METRICS_AUTH:
            raise ConfigError(
                f"--metrics-auth: {self.metrics_auth!r} is not one of {', '.join(METRICS_AUTH)}"
            )
        if self.metrics_auth == "delegated":
            for flag, path in (
                ("--tls-cert-file", self.tls_cert_file),
                ("--tls-private-key-file", self.tls_private_key_file),
            ):
                if not path or not os.path.isfile(path):  # noqa: PTH113
                    raise ConfigError(
                        f"{flag}: --metrics-auth=delegated serves /metrics over HTTPS and needs "
                        f"a serving certificate and key (got {path or 'none'})"
                    )
        elif self.metrics_port and not is_loopback(self.metrics_bind_address):
            raise ConfigError(
                f"--metrics-bind-address {self.metrics_bind_address} is not a loopback address: "
                "/metrics beyond the pod needs --metrics-auth=delegated (HTTPS, TokenReview and "
                "SubjectAccessReview against the API server)"
            )

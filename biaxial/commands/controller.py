"""``biaxial controller``: the scheduler for pods with ``spec.schedulerName: biaxial``.

Settings come from flags with environment twins (:mod:`biaxial.flags`: the flag, then
``BIAXIAL_<FLAG>``, e.g. ``BIAXIAL_QPS``, then ``$KUBECONFIG`` for the kubeconfig, then the
default), parsed and validated into one frozen :class:`controller.settings.Settings` before
anything starts; a bad value is one line on stderr and exit code 2. The process logs at INFO
unless ``-vv``, and runs until SIGTERM/SIGINT (exit 0) or until a background task fails or
leadership is lost (exit 1).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from biaxial.flags import INTEGER, NUMBER, SWITCH, Flag, Flags, daemon_logging
from driver.api.ids import DEFAULT_DRIVER_NAME

if TYPE_CHECKING:
    from controller.settings import Settings

NAME = "controller"
HELP = "run the DRA scheduler for GPU pods (allocates claims with node x GPU binpack/spread)"
ORDER = 60

FLAGS = Flags(
    Flag(
        "kubeconfig",
        "kubeconfig file (none: in-cluster)",
        field="kubeconfig",
        metavar="FILE",
        conventional_env=("KUBECONFIG",),
    ),
    Flag("node-policy", "default node-axis policy: binpack | spread", default="binpack"),
    Flag("gpu-policy", "default GPU-axis policy: binpack | spread | first-fit", default="binpack"),
    Flag(
        "default-spread-constraints",
        "topology spread for pods without constraints of their own: system (kube-scheduler's "
        "defaults) | none | TOPOLOGY_KEY:MAX_SKEW:DoNotSchedule|ScheduleAnyway,...",
        metavar="LIST",
        default="system",
    ),
    Flag(
        "qps",
        "client requests per second towards the API server (Events: a budget of their own of "
        "the same size)",
        field="qps",
        kind=NUMBER,
        default="100",
    ),
    Flag(
        "burst",
        "client request burst (Events: the same, on their own)",
        field="burst",
        kind=INTEGER,
        default="200",
    ),
    Flag(
        "scheduler-name", "spec.schedulerName to serve", field="scheduler_name", default="biaxial"
    ),
    Flag("driver-name", "DRA driver name", field="driver_name", default=DEFAULT_DRIVER_NAME),
    Flag("leader-elect", "use leader election", field="leader_elect", kind=SWITCH, default="true"),
    Flag(
        "lease-namespace",
        "namespace of the leader Lease",
        field="lease_namespace",
        default="kube-system",
    ),
    Flag(
        "lease-name", "name of the leader Lease", field="lease_name", default="biaxial-controller"
    ),
    Flag(
        "lease-duration",
        "leader lease duration, seconds",
        field="lease_duration_s",
        kind=NUMBER,
        default="15",
    ),
    Flag(
        "renew-deadline",
        "leader renew deadline, seconds",
        field="renew_deadline_s",
        kind=NUMBER,
        default="10",
    ),
    Flag(
        "retry-period",
        "leader election retry period, seconds",
        field="retry_period_s",
        kind=NUMBER,
        default="2",
    ),
    Flag("identity", "leader election identity (default: host name + random)", field="identity"),
    Flag(
        "metrics-port",
        "port of /metrics (and the probes /healthz /livez /readyz); 0 = off",
        field="metrics_port",
        kind=INTEGER,
        default="8080",
    ),
    Flag(
        "metrics-bind-address",
        "address of /metrics; one beyond loopback needs --metrics-auth=delegated",
        field="metrics_bind_address",
        default="127.0.0.1",
        metavar="ADDR",
    ),
    Flag(
        "metrics-auth",
        "none (plain HTTP, loopback only) | delegated (HTTPS; TokenReview and "
        "SubjectAccessReview for get on /metrics, as kube-scheduler)",
        field="metrics_auth",
        default="none",
    ),
    Flag(
        "tls-cert-file",
        "serving certificate (PEM) of /metrics with --metrics-auth=delegated",
        field="tls_cert_file",
        metavar="FILE",
    ),
    Flag(
        "tls-private-key-file",
        "its private key (PEM)",
        field="tls_private_key_file",
        metavar="FILE",
    ),
    Flag(
        "health-port",
        "port of the probes alone (/healthz /livez /readyz, no credentials); 0 = off",
        field="health_port",
        kind=INTEGER,
        default="0",
    ),
    Flag(
        "health-bind-address",
        "address of the probes",
        field="health_bind_address",
        default="0.0.0.0",  # noqa: S104 - the kubelet probes the pod's IP
        metavar="ADDR",
    ),
    Flag(
        "admission-webhook-port",
        "port of the admission webhook (POST /mutate-pods, HTTPS; the chart's "
        "admission.mechanism=webhook); 0 = off",
        field="admission_webhook_port",
        kind=INTEGER,
        default="0",
    ),
    Flag(
        "admission-webhook-bind-address",
        "address of the admission webhook",
        field="admission_webhook_bind_address",
        default="0.0.0.0",  # noqa: S104 - the API server reaches it through the Service
        metavar="ADDR",
    ),
    Flag(
        "admission-tls-cert-file",
        "serving certificate (PEM) of the admission webhook; reloaded when the file changes",
        field="admission_tls_cert_file",
        metavar="FILE",
    ),
    Flag(
        "admission-tls-private-key-file",
        "its private key (PEM)",
        field="admission_tls_private_key_file",
        metavar="FILE",
    ),
    Flag(
        "admission-schedulers",
        "scheduler names the admission webhook takes over, comma-separated",
        metavar="LIST",
        default="default-scheduler,hami-scheduler,volcano,kai-scheduler",
    ),
    Flag("log-format", "log line format: text | json", field="log_format", default="text"),
    Flag(
        "decision-timeout",
        "seconds one pod's decision may spend evaluating CEL selectors before it is abandoned "
        "and retried with backoff; 0 = no limit (kube-scheduler's DRA filterTimeout)",
        field="decision_timeout_s",
        kind=NUMBER,
        default="10",
    ),
    Flag(
        "max-concurrent-writes",
        "placements written at the same time",
        field="max_concurrent_writes",
        kind=INTEGER,
        default="16",
    ),
    Flag(
        "binding-timeout",
        "seconds to wait for devices' binding conditions before a placement is rolled back",
        field="binding_timeout_s",
        kind=NUMBER,
        default="600",
    ),
    Flag(
        "volume-bind-timeout",
        "seconds a placement waits for its volumes to be bound or provisioned",
        field="volume_bind_timeout_s",
        kind=NUMBER,
        default="120",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    FLAGS.add_to(parser)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Flags, then their environment twins, then defaults; validated."""
    from controller.settings import Settings  # noqa: PLC0415 - keep `biaxial --help` fast
    from driver.scheduling.policy import (  # noqa: PLC0415
        PolicyDefaults,
        parse_gpu_policy,
        parse_node_policy,
    )
    from driver.scheduling.topologyspread import DefaultSpreading  # noqa: PLC0415

    given = FLAGS.read(args)

    def make(fields: dict[str, Any]) -> Settings:
        fields["policies"] = PolicyDefaults(
            node=parse_node_policy(given.text("node-policy"), "--node-policy"),
            gpu=parse_gpu_policy(given.text("gpu-policy"), "--gpu-policy"),
        )
        fields["spreading"] = DefaultSpreading.parse(given.text("default-spread-constraints"))
        fields["admission_schedulers"] = tuple(
            name.strip() for name in given.text("admission-schedulers").split(",") if name.strip()
        )
        return Settings(**fields).validate()

    return given.build(make)


def run(args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415
    import gc  # noqa: PLC0415

    # The controller's modules are imported without the garbage collector, as its caches are
    # loaded (controller.app): nothing they build is garbage, and the collections over it
    # were a seventh of the imports' CPU time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        from controller import app, logs  # noqa: PLC0415
    finally:
        if collecting:
            gc.enable()

    settings = settings_from_args(args)
    daemon_logging(args.verbose)
    logs.configure(settings.log_format)
    return asyncio.run(app.run(settings))

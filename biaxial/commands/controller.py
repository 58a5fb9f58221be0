"""``biaxial controller``: the scheduler for pods with ``spec.schedulerName: biaxial``.

Every flag has an environment twin (``BIAXIAL_<FLAG>``, e.g. ``BIAXIAL_QPS``; the kubeconfig
also falls back to ``$KUBECONFIG``); a flag beats its twin. Values are parsed and validated
into one frozen :class:`controller.settings.Settings` before anything starts; a bad value is
one line on stderr and exit code 2. The process runs until SIGTERM/SIGINT (exit 0) or until a
background task fails or leadership is lost (exit 1).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from driver.api.errors import ConfigError

if TYPE_CHECKING:
    from controller.settings import Settings

NAME = "controller"
HELP = "run the DRA scheduler for GPU pods (allocates claims with node x GPU binpack/spread)"
ORDER = 60

T = TypeVar("T")

# flag (without --) -> (environment twin, help)
_FLAGS: dict[str, tuple[str, str]] = {
    "kubeconfig": ("BIAXIAL_KUBECONFIG", "kubeconfig file (default: $KUBECONFIG, in-cluster)"),
    "node-policy": ("BIAXIAL_NODE_POLICY", "default node-axis policy: binpack | spread"),
    "gpu-policy": ("BIAXIAL_GPU_POLICY", "default GPU-axis policy: binpack | spread | first-fit"),
    "qps": ("BIAXIAL_QPS", "client requests per second towards the API server (default 100)"),
    "burst": ("BIAXIAL_BURST", "client request burst (default 200)"),
    "scheduler-name": ("BIAXIAL_SCHEDULER_NAME", "spec.schedulerName to serve (default biaxial)"),
    "driver-name": ("BIAXIAL_DRIVER_NAME", "DRA driver name (default gpu.biaxial.dev)"),
    "lease-namespace": ("BIAXIAL_LEASE_NAMESPACE", "namespace of the leader Lease (kube-system)"),
    "lease-name": ("BIAXIAL_LEASE_NAME", "name of the leader Lease (biaxial-controller)"),
    "lease-duration": ("BIAXIAL_LEASE_DURATION", "leader lease duration in seconds (15)"),
    "renew-deadline": ("BIAXIAL_RENEW_DEADLINE", "leader renew deadline in seconds (10)"),
    "retry-period": ("BIAXIAL_RETRY_PERIOD", "leader election retry period in seconds (2)"),
    "identity": ("BIAXIAL_IDENTITY", "leader election identity (default: host name + random)"),
    "metrics-port": ("BIAXIAL_METRICS_PORT", "port of /healthz /readyz /metrics; 0 = off (8080)"),
    "log-format": ("BIAXIAL_LOG_FORMAT", "log line format: text | json (text)"),
    "max-concurrent-writes": (
        "BIAXIAL_MAX_CONCURRENT_WRITES",
        "placements written at the same time (16)",
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, (env, text) in _FLAGS.items():
        parser.add_argument(f"--{flag}", metavar="VALUE", default=None, help=f"{text} [${env}]")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--leader-elect",
        dest="leader_elect",
        action="store_const",
        const=True,
        default=None,
        help="use leader election (default) [$BIAXIAL_LEADER_ELECT=true|false]",
    )
    group.add_argument("--no-leader-elect", dest="leader_elect", action="store_const", const=False)


def _value(args: argparse.Namespace, flag: str) -> str | None:
    given = getattr(args, flag.replace("-", "_"))
    if given is not None:
        return str(given)
    env = os.environ.get(_FLAGS[flag][0])
    if env is not None and env.strip():
        return env.strip()
    return None


def _convert(flag: str, text: str, kind: Callable[[str], T], what: str) -> T:
    try:
        return kind(text)
    except ValueError as exc:
        raise ConfigError(f"--{flag}: {text!r} is not {what}") from exc


def _bool(flag: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"--{flag}: {text!r} is not a boolean (true or false)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Flags, then their environment twins, then defaults; validated."""
    from controller.settings import Settings  # noqa: PLC0415 - keep `biaxial --help` fast
    from driver.scheduling.policy import PolicyDefaults  # noqa: PLC0415

    fields: dict[str, object] = {}
    kubeconfig = _value(args, "kubeconfig") or os.environ.get("KUBECONFIG") or None
    if kubeconfig:
        fields["kubeconfig"] = kubeconfig
    defaults = PolicyDefaults()
    fields["policies"] = PolicyDefaults.parse(
        _value(args, "node-policy") or defaults.node, _value(args, "gpu-policy") or defaults.gpu
    )
    floats = {
        "qps": "qps",
        "lease-duration": "lease_duration_s",
        "renew-deadline": "renew_deadline_s",
        "retry-period": "retry_period_s",
    }
    for flag, name in floats.items():
        if (text := _value(args, flag)) is not None:
            fields[name] = _convert(flag, text, float, "a number")
    ints = {
        "burst": "burst",
        "metrics-port": "metrics_port",
        "max-concurrent-writes": "max_concurrent_writes",
    }
    for flag, name in ints.items():
        if (text := _value(args, flag)) is not None:
            fields[name] = _convert(flag, text, int, "an integer")
    strings = {
        "scheduler-name": "scheduler_name",
        "driver-name": "driver_name",
        "lease-namespace": "lease_namespace",
        "lease-name": "lease_name",
        "identity": "identity",
        "log-format": "log_format",
    }
    for flag, name in strings.items():
        if (text := _value(args, flag)) is not None:
            fields[name] = text
    leader = args.leader_elect
    if leader is None and (env := os.environ.get("BIAXIAL_LEADER_ELECT", "").strip()):
        leader = _bool("leader-elect", env)
    if leader is not None:
        fields["leader_elect"] = leader
    # Each value above was converted for its field by name; mypy cannot follow ``**``.
    return Settings(**fields).validate()  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415

    from controller import app, logs  # noqa: PLC0415

    settings = settings_from_args(args)
    logs.configure(settings.log_format)
    return asyncio.run(app.run(settings))

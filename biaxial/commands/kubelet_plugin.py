"""``biaxial kubelet-plugin``: run the DRA kubelet plugin on this node.

Every flag has an environment twin, ``BIAXIAL_<FLAG IN UPPER SNAKE CASE>`` (for instance
``BIAXIAL_FAKE_GPUS``); the node name also reads ``NODE_NAME`` and the kubeconfig
``KUBECONFIG``. A flag wins over its twin. Without a kubeconfig the in-cluster service account
is used. Invalid settings are one line on stderr and exit code 2; SIGTERM stops the plugin
gracefully (exit 0); a crashed background task exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from kubeletplugin.settings import Settings

NAME = "kubelet-plugin"
HELP = "run the DRA kubelet plugin (gRPC services, ResourceSlice publisher, health)"
ORDER = 10

T = TypeVar("T")

_FLAGS: list[tuple[str, str, str, str]] = [
    # flag, metavar, help, default (shown)
    ("--kubeconfig", "FILE", "kubeconfig file (default: $KUBECONFIG, else in-cluster)", ""),
    ("--node-name", "NODE", "this node's name (default: $NODE_NAME)", ""),
    ("--fake-gpus", "PROFILE", "use a fake GPU profile (t4x4, ...) instead of NVML", ""),
    ("--driver-name", "NAME", "DRA driver name", "gpu.biaxial.dev"),
    ("--registry-dir", "DIR", "kubelet plugin registry dir", "/var/lib/kubelet/plugins_registry"),
    ("--plugin-dir", "DIR", "kubelet plugins dir (DRA socket parent)", "/var/lib/kubelet/plugins"),
    ("--cdi-dir", "DIR", "CDI spec dir", "/var/run/cdi"),
    ("--state-dir", "DIR", "checkpoint and lock dir", "/var/lib/biaxial"),
    ("--pod-uid", "UID", "this pod's UID: per-pod socket names (rolling updates)", ""),
    ("--metrics-port", "N", "port for /metrics and /healthz (0 = off)", "0"),
    ("--metrics-address", "ADDR", "address for /metrics and /healthz", "0.0.0.0"),  # noqa: S104
    (
        "--hami-core-library",
        "PATH",
        "host path of HAMi-core libvgpu.so for the hami-core sharing strategy; none = no library",
        "/var/lib/biaxial/hami-core/libvgpu.so",
    ),
    ("--mps-root", "DIR", "MPS pipe/log root", "/run/biaxial/mps"),
    ("--health-resend-seconds", "S", "re-send the health list this often", "10"),
    ("--health-check-timeout-seconds", "S", "health timeout told to the kubelet", "30"),
    ("--xid-quiet-seconds", "S", "non-fatal Xid clears after this long without another", "300"),
    ("--rediscover-seconds", "S", "re-run discovery this often", "60"),
    ("--resync-seconds", "S", "full slice re-list period", "60"),
]
_SWITCHES: list[tuple[str, str]] = [
    ("--remove-slices-on-exit", "delete this node's ResourceSlices on a clean shutdown"),
    ("--advertise-legacy-resources", "patch nvidia.com/gpumem and gpucores into Node status"),
]


def _env_name(flag: str) -> str:
    return "BIAXIAL_" + flag.removeprefix("--").replace("-", "_").upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, metavar, text, default in _FLAGS:
        shown = f" [env {_env_name(flag)}" + (f"; default {default}]" if default else "]")
        parser.add_argument(flag, metavar=metavar, default=None, help=text + shown)
    for flag, text in _SWITCHES:
        parser.add_argument(
            flag, action="store_true", default=None, help=f"{text} [env {_env_name(flag)}]"
        )


def _value(args: argparse.Namespace, flag: str, *extra_env: str) -> str:
    explicit = getattr(args, flag.removeprefix("--").replace("-", "_"))
    if explicit is not None:
        return str(explicit)
    for env in (_env_name(flag), *extra_env):
        found = os.environ.get(env, "").strip()
        if found:
            return found
    return next(d for f, _, _, d in _FLAGS if f == flag)


def _switch(args: argparse.Namespace, flag: str) -> bool:
    if getattr(args, flag.removeprefix("--").replace("-", "_")):
        return True
    return os.environ.get(_env_name(flag), "").strip().lower() in {"1", "true", "yes", "on"}


def _typed(args: argparse.Namespace, flag: str, kind: Callable[[str], T]) -> T:
    from driver.api.errors import ConfigError  # noqa: PLC0415

    text = _value(args, flag)
    try:
        return kind(text)
    except ValueError as exc:
        raise ConfigError(f"{flag} {text!r}: not a valid {kind.__name__}") from exc


def build_settings(args: argparse.Namespace) -> Settings:
    """Flags + environment -> validated :class:`kubeletplugin.settings.Settings`."""
    from kubeletplugin.settings import Settings  # noqa: PLC0415 - heavy imports inside run

    kubeconfig = _value(args, "--kubeconfig", "KUBECONFIG")
    hami = _value(args, "--hami-core-library")
    return Settings(
        node_name=_value(args, "--node-name", "NODE_NAME"),
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        fake_gpus=_value(args, "--fake-gpus") or None,
        driver_name=_value(args, "--driver-name"),
        registry_dir=Path(_value(args, "--registry-dir")),
        plugin_dir=Path(_value(args, "--plugin-dir")),
        cdi_dir=Path(_value(args, "--cdi-dir")),
        state_dir=Path(_value(args, "--state-dir")),
        pod_uid=_value(args, "--pod-uid", "POD_UID"),
        metrics_port=_typed(args, "--metrics-port", int),
        metrics_address=_value(args, "--metrics-address"),
        remove_slices_on_exit=_switch(args, "--remove-slices-on-exit"),
        advertise_legacy_resources=_switch(args, "--advertise-legacy-resources"),
        hami_core_library_path=Path(hami) if hami and hami != "none" else None,
        mps_root=Path(_value(args, "--mps-root")),
        health_resend_s=_typed(args, "--health-resend-seconds", float),
        health_check_timeout_s=_typed(args, "--health-check-timeout-seconds", int),
        xid_quiet_s=_typed(args, "--xid-quiet-seconds", float),
        rediscover_s=_typed(args, "--rediscover-seconds", float),
        resync_s=_typed(args, "--resync-seconds", float),
    ).validate()


def run(args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415

    from kubeletplugin import app  # noqa: PLC0415

    settings = build_settings(args)
    if args.verbose == 0:  # a daemon logs its lifecycle by default
        logging.getLogger("biaxial").setLevel(logging.INFO)
    code: int = asyncio.run(app.run(settings))
    return code

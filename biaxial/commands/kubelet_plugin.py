"""``biaxial kubelet-plugin``: run the DRA kubelet plugin on this node.

Settings come from flags with environment twins (:mod:`biaxial.flags`: the flag, then
``BIAXIAL_<FLAG>``, e.g. ``BIAXIAL_FAKE_GPUS``, then the conventional ``NODE_NAME``,
``POD_UID`` and ``KUBECONFIG``, then the default). Without a kubeconfig the in-cluster service
account is used. Invalid settings are one line on stderr and exit code 2. The plugin logs at
INFO unless ``-vv``; SIGTERM stops it gracefully (exit 0); a crashed background task exits 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from biaxial.flags import INTEGER, NUMBER, PATH, SWITCH, Flag, Flags, Kind, daemon_logging
from driver.api.ids import DEFAULT_DRIVER_NAME

if TYPE_CHECKING:
    from kubeletplugin.settings import Settings

NAME = "kubelet-plugin"
HELP = "run the DRA kubelet plugin (gRPC services, ResourceSlice publisher, health)"
ORDER = 10

#: A path, or ``none`` for no path at all (a blank value means "not set": the default).
PATH_OR_NONE = Kind(
    "a path or none", lambda text: None if text.strip().lower() == "none" else Path(text)
)


def _dynamic_mig(text: str) -> Any:
    from driver.api.errors import ConfigError  # noqa: PLC0415
    from driver.discovery.mig import DynamicMigPolicy  # noqa: PLC0415

    try:
        return DynamicMigPolicy.parse(text)
    except ConfigError as exc:
        raise ValueError(text) from exc


#: ``off``, ``all``, or GPU product names (comma-separated, none empty).
DYNAMIC_MIG = Kind("off, all, or a comma-separated list of GPU product names", _dynamic_mig)


def _strategies(text: str) -> Any:
    from driver.api.config import parse_strategies  # noqa: PLC0415
    from driver.api.errors import ConfigError  # noqa: PLC0415

    try:
        return parse_strategies([s.strip() for s in text.split(",")], "--share-strategies")
    except ConfigError as exc:
        raise ValueError(text) from exc


#: Sharing strategies, comma-separated, each once.
STRATEGIES = Kind("a comma-separated list of hami-core, mps, none (each once)", _strategies)

FLAGS = Flags(
    Flag(
        "kubeconfig",
        "kubeconfig file (none: in-cluster)",
        field="kubeconfig",
        kind=PATH,
        metavar="FILE",
        conventional_env=("KUBECONFIG",),
    ),
    Flag(
        "node-name",
        "this node's name",
        field="node_name",
        default="",
        metavar="NODE",
        conventional_env=("NODE_NAME",),
    ),
    Flag(
        "fake-gpus",
        "use a fake GPU profile (t4x4, ...) instead of NVML",
        field="fake_gpus",
        metavar="PROFILE",
    ),
    Flag(
        "fake-device-dir",
        "with --fake-gpus: a host directory of stand-in device nodes (nvidia0, nvidiactl, "
        "...) that the CDI specs name as each /dev node's host path (tests on a real node)",
        field="fake_device_dir",
        kind=PATH,
        metavar="DIR",
    ),
    Flag(
        "driver-name",
        "DRA driver name",
        field="driver_name",
        default=DEFAULT_DRIVER_NAME,
        metavar="NAME",
    ),
    Flag(
        "registry-dir",
        "kubelet plugin registry dir",
        field="registry_dir",
        kind=PATH,
        default="/var/lib/kubelet/plugins_registry",
        metavar="DIR",
    ),
    Flag(
        "plugin-dir",
        "kubelet plugins dir (DRA socket parent)",
        field="plugin_dir",
        kind=PATH,
        default="/var/lib/kubelet/plugins",
        metavar="DIR",
    ),
    Flag(
        "cdi-dir", "CDI spec dir", field="cdi_dir", kind=PATH, default="/var/run/cdi", metavar="DIR"
    ),
    Flag(
        "state-dir",
        "checkpoint and lock dir",
        field="state_dir",
        kind=PATH,
        default="/var/lib/biaxial",
        metavar="DIR",
    ),
    Flag(
        "pod-uid",
        "this pod's UID: per-pod socket names (rolling updates)",
        field="pod_uid",
        default="",
        metavar="UID",
        conventional_env=("POD_UID",),
    ),
    Flag(
        "metrics-port",
        "port for /metrics, /healthz and /readyz (0 = off)",
        field="metrics_port",
        kind=INTEGER,
        default="0",
    ),
    Flag(
        "metrics-address",
        "address for /metrics, /healthz and /readyz (0.0.0.0: anyone who reaches the pod "
        "reads the node's metrics)",
        field="metrics_address",
        default="127.0.0.1",
        metavar="ADDR",
    ),
    Flag(
        "health-port",
        "port for /healthz and /readyz alone, for the kubelet's probes (0 = off)",
        field="health_port",
        kind=INTEGER,
        default="0",
    ),
    Flag(
        "health-address",
        "address for the probes",
        field="health_address",
        default="0.0.0.0",  # noqa: S104 - the kubelet probes the pod's IP
        metavar="ADDR",
    ),
    Flag(
        "remove-slices-on-exit",
        "delete this node's ResourceSlices on a clean shutdown",
        field="remove_slices_on_exit",
        kind=SWITCH,
        default="false",
    ),
    Flag(
        "advertise-legacy-resources",
        "patch nvidia.com/gpumem and gpucores into Node status",
        field="advertise_legacy_resources",
        kind=SWITCH,
        default="false",
    ),
    Flag(
        "hami-core-library",
        "host path of HAMi-core libvgpu.so for the hami-core sharing strategy; none = no library",
        field="hami_core_library_path",
        kind=PATH_OR_NONE,
        default="/var/lib/biaxial/hami-core/libvgpu.so",  # kubeletplugin.settings' default
        metavar="PATH",
    ),
    Flag(
        "mps-root",
        "MPS pipe/log root",
        field="mps_root",
        kind=PATH,
        default="/run/biaxial/mps",
        metavar="DIR",
    ),
    Flag(
        "dynamic-mig",
        "partition GPUs on demand: off, all, or comma-separated product names; only GPUs "
        "whose MIG mode is already on (biaxial never changes it)",
        field="dynamic_mig",
        kind=DYNAMIC_MIG,
        default="off",
        metavar="GPUS",
    ),
    Flag(
        "max-shares-per-gpu",
        "at most this many claims share one GPU, published as its shares capacity (0 = no cap)",
        field="max_shares_per_gpu",
        kind=INTEGER,
        default="0",
        metavar="N",
    ),
    Flag(
        "share-strategies",
        "the sharing strategies a GPU share may use on this node, whatever its class says "
        "(comma-separated: hami-core, mps, none); add none to let shares run without limits",
        field="share_strategies",
        kind=STRATEGIES,
        default="hami-core,mps",
        metavar="LIST",
    ),
    Flag(
        "health-resend-seconds",
        "re-send the health list this often",
        field="health_resend_s",
        kind=NUMBER,
        default="10",
        metavar="S",
    ),
    Flag(
        "health-check-timeout-seconds",
        "health timeout told to the kubelet",
        field="health_check_timeout_s",
        kind=INTEGER,
        default="30",
        metavar="S",
    ),
    Flag(
        "xid-quiet-seconds",
        "non-fatal Xid clears after this long without another",
        field="xid_quiet_s",
        kind=NUMBER,
        default="300",
        metavar="S",
    ),
    Flag(
        "rediscover-seconds",
        "re-run discovery this often",
        field="rediscover_s",
        kind=NUMBER,
        default="60",
        metavar="S",
    ),
    Flag(
        "resync-seconds",
        "full slice re-list period",
        field="resync_s",
        kind=NUMBER,
        default="60",
        metavar="S",
    ),
    Flag(
        "reconcile-seconds",
        "check the checkpoint's claims against the API this often",
        field="reconcile_s",
        kind=NUMBER,
        default="60",
        metavar="S",
    ),
    Flag(
        "release-grace-seconds",
        "unprepare a claim the API no longer needs once it has been so this long",
        field="release_grace_s",
        kind=NUMBER,
        default="300",
        metavar="S",
    ),
    Flag(
        "event-namespace",
        "namespace of the Events recorded about this node",
        field="event_namespace",
        default="default",
        metavar="NS",
        conventional_env=("POD_NAMESPACE",),
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    FLAGS.add_to(parser)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Flags, then their environment twins, then defaults; validated."""
    from kubeletplugin.settings import Settings  # noqa: PLC0415 - heavy imports inside run

    def make(fields: dict[str, Any]) -> Settings:
        return Settings(**fields).validate()

    return FLAGS.read(args).build(make)


def run(args: argparse.Namespace) -> int:
    import asyncio  # noqa: PLC0415

    from kubeletplugin import app  # noqa: PLC0415

    settings = settings_from_args(args)
    daemon_logging(args.verbose)
    code: int = asyncio.run(app.run(settings))
    return code

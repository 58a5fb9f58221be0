"""``biaxial discover``: print the ResourceSlices this node would publish.

Without ``--fake`` the GPUs come from NVML; with it, from a fake profile (a built-in name or a
profile file). ``--dynamic-mig`` takes the kubelet plugin's setting (``off``, ``all`` or GPU
product names); GPUs a fake profile declares dynamic are dynamic anyway. Only read-only NVML
queries run: MIG instances that exist are shown as the plugin shows instances it did not
create (their placements unavailable), since this command does not read the plugin's
checkpoint. ``-o json`` prints a ``v1`` ``List``; ``-o yaml`` (the default) one YAML document
per slice. The node name defaults to ``$NODE_NAME``, then the host name. Errors (no NVML, an
unknown profile, an unreadable file, an invalid node name) are one line and a non-zero exit: 1 when
NVML fails, 2 for bad input (a fake profile that is unknown, unreadable or invalid, a bad flag).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

NAME = "discover"
EPILOG = """\
exit codes:
  0  the slices were printed
  1  GPU discovery failed (no NVML, no driver)
  2  bad input: an unknown, unreadable or invalid fake profile, an invalid node name
"""
HELP = "print the ResourceSlices this node would publish (--fake PROFILE works without a GPU)"
ORDER = 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fake",
        metavar="PROFILE",
        help="use a fake GPU profile instead of NVML: t4x4, a10gx4, a100-40gbx8, a100-80gbx8, "
        "h100-80gbx8, a100-80gbx8-dynmig, h100-80gbx8-dynmig, or the path of a profile YAML file",
    )
    parser.add_argument(
        "--dynamic-mig",
        metavar="GPUS",
        default="off",
        help="as the kubelet plugin's --dynamic-mig: off (default), all, or product names",
    )
    parser.add_argument(
        "--node",
        metavar="NAME",
        default=None,
        help="node (and pool) name; default: $NODE_NAME, then the host name",
    )
    parser.add_argument(
        "--driver",
        metavar="NAME",
        default=None,
        help="DRA driver name (default gpu.biaxial.dev)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        default="yaml",
        help="output format: yaml (one document per slice) or json (a v1 List)",
    )


def _node_name(explicit: str | None) -> str:
    if explicit:
        return explicit
    from_env = os.environ.get("NODE_NAME", "").strip()
    return from_env or socket.gethostname().lower()


def run(args: argparse.Namespace) -> int:
    import yaml  # noqa: PLC0415 - heavy imports inside run keep `biaxial --help` fast

    from driver.api.errors import DiscoveryError, ManifestError  # noqa: PLC0415
    from driver.api.ids import DEFAULT_DRIVER_NAME  # noqa: PLC0415
    from driver.discovery.backend import open_backend  # noqa: PLC0415
    from driver.discovery.devices import DeviceTable  # noqa: PLC0415
    from driver.discovery.fake import FakeBackend  # noqa: PLC0415
    from driver.discovery.mig import DynamicMigPolicy  # noqa: PLC0415
    from driver.discovery.slices import build_slices  # noqa: PLC0415

    node = _node_name(args.node)
    policy = DynamicMigPolicy.parse(args.dynamic_mig)
    try:
        with open_backend(args.fake, node_name=node) as backend:
            gpus = backend.discover()
            if isinstance(backend, FakeBackend):
                policy = policy.with_gpus(backend.dynamic_mig)
    except DiscoveryError as exc:
        if args.fake is None:
            raise
        raise ManifestError(str(exc)) from exc  # a bad profile is bad input (exit 2)
    slices = build_slices(
        DeviceTable.from_gpus(gpus, policy),
        node_name=node,
        driver_name=args.driver or DEFAULT_DRIVER_NAME,
    )
    items = [s.to_api() for s in slices]
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        yaml.safe_dump_all(items, sys.stdout, sort_keys=False, explicit_start=True)
    return 0

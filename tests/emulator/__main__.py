"""Run the emulator as a process: ``python -m tests.emulator --port PORT --kubeconfig FILE``.

Binds 127.0.0.1:PORT (``--port 0`` picks a free port), writes a kubeconfig pointing at it,
prints ``listening on http://127.0.0.1:PORT`` (flushed, so a parent can wait for the line)
and serves until SIGTERM or SIGINT, then ends open watches and exits 0 (with
``--request-counts FILE``, after writing how many requests it served, by user agent, verb and
resource, as JSON: ``{"biaxial-controller": {"patch persistentvolumeclaims": 3, ...}}``).

What it stores lives long and holds no reference cycles (JSON objects), so the main loop
freezes it out of the cyclic collector's way every second (``gc.freeze``; refcounting still
frees what is replaced or deleted): otherwise a full collection over 5,000 nodes' objects
stalls a request for ~0.3 s, where a real API server's collector runs beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from tests.emulator.claims import ResourceClaimController
from tests.emulator.server import Emulator
from tests.emulator.validation import DEFAULT_SCHEMA_VERSION, SchemaMissingError
from tests.emulator.volumes import DEFAULT_PROVISIONER, VolumeController


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.emulator", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: pick a free one)"
    )
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for this server here")
    parser.add_argument(
        "--namespace", default="default", help="namespace of the kubeconfig context"
    )
    parser.add_argument(
        "--schema-version",
        default=DEFAULT_SCHEMA_VERSION,
        help="Kubernetes version of the validation schemas (default %(default)s)",
    )
    parser.add_argument(
        "--node-identity", help="refuse ResourceSlice list/watch without spec.nodeName=<this>"
    )
    parser.add_argument("--history-size", type=int, default=10_000, help="watch history length")
    parser.add_argument(
        "--bookmark-interval", type=float, default=1.0, help="seconds between BOOKMARKs"
    )
    parser.add_argument(
        "--resourceclaim-controller",
        action="store_true",
        help="also run the resourceclaim controller stand-in (claims from templates)",
    )
    parser.add_argument(
        "--volume-controller",
        action="store_true",
        help="also run the storage stand-in (PV controller, external-provisioner for "
        f"{DEFAULT_PROVISIONER}, ephemeral volume controller)",
    )
    parser.add_argument(
        "--request-counts",
        metavar="FILE",
        help="on exit, write the requests served by user agent, verb and resource (JSON)",
    )
    parser.add_argument(
        "--no-graceful-pod-deletion",
        action="store_true",
        help="delete bound pods at once (no kubelet will confirm the deletion)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        emulator = Emulator(
            port=args.port,
            schema_version=args.schema_version,
            node_identity=args.node_identity,
            history_size=args.history_size,
            bookmark_interval=args.bookmark_interval,
            pod_graceful_deletion=not args.no_graceful_pod_deletion,
        ).start()
    except (SchemaMissingError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    controller = (
        ResourceClaimController(emulator).start() if args.resourceclaim_controller else None
    )
    volumes = VolumeController(emulator).start() if args.volume_controller else None
    try:
        if args.kubeconfig:
            emulator.write_kubeconfig(args.kubeconfig, namespace=args.namespace)
        print(f"listening on {emulator.url}", flush=True)
        ticks = 0
        while not stop.wait(0.2):
            ticks += 1
            if ticks % 5 == 0:
                gc.freeze()
    finally:
        if controller is not None:
            controller.stop()
        if volumes is not None:
            volumes.stop()
        if args.request_counts:
            counts: dict[str, dict[str, int]] = {}
            for record in list(emulator.requests):
                per_agent = counts.setdefault(record.user_agent, {})
                key = f"{record.verb} {record.resource}"
                per_agent[key] = per_agent.get(key, 0) + 1
            Path(args.request_counts).write_text(json.dumps(counts, indent=1, sort_keys=True))
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``biaxial cel``: evaluate one DRA CEL selector against every device in ResourceSlice files.

Reads YAML or JSON files (single objects, multi-document YAML, ``v1`` ``List``; objects that
are not ``resource.k8s.io`` ResourceSlices are ignored) and prints one JSON object::

    {"expression": "...", "compileError": null | "message",
     "results": [{"pool": "...", "device": "...", "result": true | false}
                 | {"pool": "...", "device": "...", "error": "message"}]}

Results follow file order, then device order within each slice. Each device is evaluated with
its slice's ``spec.driver`` as the driver name (the domain of unqualified attributes).

Exit codes: 0 when the expression compiled (whatever the per-device results), 1 on a compile
error (the JSON is still printed, with empty results), 2 on unreadable or malformed input or
input without any ResourceSlice (one line on stderr, nothing on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

NAME = "cel"
HELP = "evaluate a DRA CEL selector against every device in ResourceSlice files"
ORDER = 40

EXIT_COMPILE_ERROR = 1
EPILOG = """\
exit codes:
  0  the expression compiled (whatever each device's result)
  1  the expression does not compile (the JSON report is still printed)
  2  bad input: an unreadable or invalid file, or no ResourceSlice in the files (one line on
     stderr, nothing on stdout)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-e",
        "--expression",
        required=True,
        metavar="EXPR",
        help="the selector, e.g. 'device.driver == \"gpu.biaxial.dev\"'",
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="YAML or JSON files with ResourceSlices (single, multi-document or List); - for stdin",
    )


def run(args: argparse.Namespace) -> int:
    from biaxial.simulate.manifests import load_objects, objects_of_kind  # noqa: PLC0415
    from driver.api.errors import CELCompileError, CELEvaluationError, ManifestError  # noqa: PLC0415
    from driver.api.model import API_GROUP, ResourceSlice  # noqa: PLC0415
    from driver.cel.engine import compile_selector  # noqa: PLC0415 - keep `biaxial --help` fast

    slices: list[ResourceSlice] = []
    inventory = False
    for path in args.files:
        objects = load_objects([path])
        inventory = inventory or any(o.get("kind") == "Cluster" for o in objects)
        for obj in objects_of_kind(objects, "ResourceSlice", API_GROUP):
            try:
                slices.append(ResourceSlice.from_api(obj))
            except ManifestError as exc:
                raise ManifestError(f"{path}: {exc}") from exc
    if not slices:
        what = " (a Cluster inventory holds GPU profiles, not slices)" if inventory else ""
        raise ManifestError(
            f"no ResourceSlice was read from {', '.join(args.files)}{what}; "
            "'biaxial discover --fake PROFILE' prints the slices a node with that profile "
            "publishes, 'kubectl get resourceslices -o yaml' a cluster's"
        )
    report: dict[str, Any] = {"expression": args.expression, "compileError": None, "results": []}
    try:
        selector = compile_selector(args.expression)
    except CELCompileError as exc:
        report["compileError"] = str(exc)
        _print(report)
        return EXIT_COMPILE_ERROR
    results: list[dict[str, Any]] = report["results"]
    for resource_slice in slices:
        for device in resource_slice.devices:
            entry: dict[str, Any] = {"pool": resource_slice.pool.name, "device": device.name}
            try:
                entry["result"] = selector.matches(device, resource_slice.driver)
            except CELEvaluationError as exc:
                entry["error"] = str(exc)
            results.append(entry)
    _print(report)
    return 0


def _print(report: dict[str, Any]) -> None:
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")

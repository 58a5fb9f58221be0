"""``biaxial simulate PATH...``: place pods on a simulated cluster with the real decision code.

PATHs are manifest files or directories (their ``*.yaml``, ``*.yml`` and ``*.json`` files, in
name order). They hold one cluster inventory (``biaxial.dev/v1alpha1`` ``Cluster``) plus
ordinary objects: DeviceClass, ResourceClaimTemplate, ResourceClaim, Pod, Deployment. The
project's ``deviceclasses/`` are loaded first unless ``--no-default-classes``.

Output: ``-o table`` (default) prints the placements, per-node and per-GPU utilisation (with
dynamic MIG, each GPU's free memory slices and the partitions biaxial would create), whole GPUs
left free, fragmentation and timing; ``-o json`` / ``-o yaml`` print
``{placements, unschedulable, errors, summary, objects}``. ``--plot FILE.png`` draws nodes x
GPUs with each GPU's memory filled by pod, and a dynamic-MIG GPU's partitions at their memory
slices inside it (matplotlib, imported only then). A pod that cannot
be placed or is invalid is listed with its reason; the exit code is 0 whenever the simulation
ran, 2 for unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from biaxial.simulate.simulator import SimulationResult

NAME = "simulate"
HELP = "place pods on a simulated cluster (inventory + manifests) with the real scheduler core"
ORDER = 20

_SUFFIXES = (".yaml", ".yml", ".json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="manifest files or directories")
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "yaml"), default="table", help="output format"
    )
    parser.add_argument(
        "--node-policy", choices=("binpack", "spread"), help="default node-axis policy"
    )
    parser.add_argument(
        "--gpu-policy", choices=("binpack", "spread", "first-fit"), help="default GPU-axis policy"
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw nodes x GPUs to a PNG file")
    parser.add_argument(
        "--no-default-classes",
        action="store_true",
        help="do not load the project's deviceclasses/ first",
    )


def expand_paths(paths: list[str]) -> list[str]:
    """Files as given; directories become their manifest files in name order."""
    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if raw != "-" and path.is_dir():
            out.extend(
                str(p) for p in sorted(path.iterdir()) if p.is_file() and p.suffix in _SUFFIXES
            )
        else:
            out.append(raw)
    return out


def run(args: argparse.Namespace) -> int:
    import yaml  # noqa: PLC0415 - heavy imports inside run keep `biaxial --help` fast

    from biaxial.simulate.manifests import load_objects  # noqa: PLC0415
    from biaxial.simulate.simulator import project_deviceclasses_dir, simulate  # noqa: PLC0415
    from driver.scheduling.policy import PolicyDefaults  # noqa: PLC0415

    objects = load_objects(expand_paths(args.paths))
    defaults = PolicyDefaults()
    defaults = PolicyDefaults.parse(
        args.node_policy or defaults.node, args.gpu_policy or defaults.gpu
    )
    default_classes: list[dict[str, Any]] = []
    if not args.no_default_classes:
        classes_dir = project_deviceclasses_dir()
        default_classes = [
            o
            for o in load_objects(expand_paths([str(classes_dir)]))
            if o.get("kind") == "DeviceClass"
        ]
    result = simulate(objects, default_classes=default_classes, defaults=defaults)
    if args.plot:
        from biaxial.simulate.plot import plot  # noqa: PLC0415

        plot(result, args.plot)
    if args.output == "json":
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output == "yaml":
        yaml.safe_dump(result.to_json(), sys.stdout, sort_keys=False)
    else:
        sys.stdout.write(render_table(result))
    return 0


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.extend(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )
    return lines


def _mib(value: int) -> str:
    return f"{value // (1024 * 1024)}Mi"


def render_table(result: SimulationResult) -> str:
    """The human-readable report."""
    summary = result.summary()
    lines: list[str] = []
    rows = []
    for p in result.placements:
        memory = []
        cores = []
        for d in p.devices:
            consumed = d.get("consumedCapacity") or {}
            memory.append(str(consumed.get("memory", "whole")))
            cores.append(str(consumed.get("cores", "-")))
        rows.append(
            [
                p.pod,
                p.node,
                ",".join(str(d["device"]) for d in p.devices) or "-",
                ",".join(str(d["uuid"]) for d in p.devices) or "-",
                ",".join(memory) or "-",
                ",".join(cores) or "-",
            ]
        )
    lines.extend(_table(["POD", "NODE", "GPUS", "UUIDS", "MEMORY", "CORES"], rows))
    if result.unschedulable:
        lines.append("")
        lines.extend(
            _table(
                ["UNSCHEDULABLE", "REASON"],
                [[f.pod, " ".join(f.reason.split())] for f in result.unschedulable],
            )
        )
    if result.errors:
        lines.append("")
        lines.extend(f"error: {e}" for e in result.errors)
    lines.append("")
    lines.extend(
        _table(
            ["NODE", "GPUS", "IN USE", "PODS", "MEMORY USED"],
            [
                [
                    n["node"],
                    str(n["gpus"]),
                    str(n["gpusInUse"]),
                    str(n["pods"]),
                    (
                        f"{_mib(n['memoryUsedBytes'])}/{_mib(n['memoryBytes'])} "
                        f"({100 * n['memoryUtilisation']:.1f}%)"
                    ),
                ]
                for n in summary["nodes"]
            ],
        )
    )
    lines.append("")
    dynamic = any(g.memory_slices for g in result.gpus)
    lines.extend(
        _table(
            ["NODE", "GPU", "PRODUCT", "MEMORY USED", "CORES", "PODS"]
            + (["MIG SLICES FREE", "PARTITIONS (profile@start)"] if dynamic else []),
            [
                [
                    g.node,
                    g.device,
                    g.product,
                    f"{_mib(g.memory_used)}/{_mib(g.memory)}",
                    f"{g.cores_used}/{g.cores}",
                    ",".join(p for p, _ in g.pods) or "-",
                ]
                + (
                    [
                        f"{g.free_slices}/{g.memory_slices}" if g.memory_slices else "-",
                        ",".join(f"{p.profile}@{p.start}" for p in g.partitions) or "-",
                    ]
                    if dynamic
                    else []
                )
                for g in result.gpus
            ],
        )
    )
    timing = summary["timing"]
    lines.append("")
    lines.append(
        f"placed {summary['placed']}/{summary['pods']} pods on {summary['nodesUsed']} node(s), "
        f"{summary['gpusInUse']} GPU(s) in use, {summary['wholeGpusFree']} whole GPU(s) free, "
        f"fragmentation {summary['fragmentation']:.2f} "
        f"(default policies: node {summary['policies']['node']}, GPU {summary['policies']['gpu']})"
    )
    lines.append(
        f"startup {timing['startupSeconds']:.3f}s, decisions {timing['decisionSeconds']:.3f}s "
        f"({timing['podsPerSecond']} pods/s, p99 {timing['p99DecisionMs']} ms)"
    )
    return "\n".join(lines) + "\n"

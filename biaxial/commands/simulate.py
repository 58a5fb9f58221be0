"""``biaxial simulate PATH...``: place pods on a simulated cluster with the real decision code.

PATHs are manifest files or directories (their ``*.yaml``, ``*.yml`` and ``*.json`` files, in
name order), ``-`` for standard input. They hold the cluster, as a ``Cluster`` inventory with
fake GPU profiles or as the objects ``kubectl get -A -o yaml`` returns, and the work: Pods and
the workload kinds (see :mod:`biaxial.simulate.simulator` and :mod:`biaxial.simulate.kinds`).
With ``--kubeconfig`` the cluster is read from a live API server instead, read-only
(:mod:`biaxial.simulate.live`), and PATHs are optional: without them the cluster's own pending
pods are placed. The project's ``deviceclasses/`` are loaded first unless
``--no-default-classes`` (or ``--kubeconfig``: the cluster's classes count there).

``--admission`` (or ``--admission-values FILE``, the chart's values) applies the chart's
admission step to the pods being created (:mod:`biaxial.simulate.admission`) and lists what it
changed on each, so unchanged HAMi, Volcano, KAI and device-plugin manifests answer as the
cluster would.

Output: ``-o table`` (default) prints the placements with the policies each pod got, what
admission changed per pod (with ``--admission``), the unschedulable and skipped pods with
their reasons, notes, per-node and per-GPU use (MIG partitions under their GPU; with dynamic
MIG, the partitions biaxial would create and each GPU's free memory slices), whole GPUs left
free, fragmentation and timing; ``-o json`` /
``-o yaml`` print ``{placements, unschedulable, skipped, preemptions, notes, admission,
summary, objects}``.
``--plot FILE`` draws the cluster (:mod:`biaxial.simulate.plot`).

Exit codes: 0 when the simulation ran (pods placed or reported), 1 with
``--fail-on-unschedulable`` when some pod could not be placed, 2 for bad input (one line on
stderr, nothing simulated).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from biaxial.simulate.results import GpuUsage, SimulationResult

NAME = "simulate"
HELP = "place pods on a simulated cluster (inventory + manifests) with the real scheduler core"
ORDER = 20
EPILOG = """\
exit codes:
  0  the simulation ran: every pod placed, or reported unschedulable or skipped
  1  some pod is unschedulable (only with --fail-on-unschedulable)
  2  bad input (an unreadable or invalid manifest, an unsupported kind): nothing simulated
"""

_SUFFIXES = (".yaml", ".yml", ".json")
PLOT_FORMATS = (".png", ".svg", ".pdf")
EXIT_UNSCHEDULABLE = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="manifest files or directories (- for stdin); optional with --kubeconfig",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "yaml"), default="table", help="output format"
    )
    parser.add_argument(
        "--node-policy", choices=("binpack", "spread"), help="default node-axis policy"
    )
    parser.add_argument(
        "--gpu-policy", choices=("binpack", "spread", "first-fit"), help="default GPU-axis policy"
    )
    parser.add_argument(
        "--scheduler-name",
        default="biaxial",
        metavar="NAME",
        help="the scheduler whose pods are placed (default biaxial); others are skipped",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help=f"draw the cluster to a {', '.join(s.lstrip('.') for s in PLOT_FORMATS)} file",
    )
    parser.add_argument(
        "--fail-on-unschedulable",
        action="store_true",
        help=f"exit {EXIT_UNSCHEDULABLE} when some pod cannot be placed",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="read the cluster from this kubeconfig's API server (read-only what-if)",
    )
    parser.add_argument(
        "--admission",
        action="store_true",
        help="apply the chart's admission step (default values, every namespace) to the pods "
        "being created, and say what it changed",
    )
    parser.add_argument(
        "--admission-values",
        metavar="FILE",
        help="the same, scoped as the chart is with this Helm values file (implies --admission)",
    )
    parser.add_argument(
        "--no-default-classes",
        action="store_true",
        help="do not load the project's deviceclasses/ first",
    )


def expand_paths(paths: list[str]) -> list[str]:
    """Files as given; directories become their manifest files in name order (a directory
    without any is refused: nothing would be read)."""
    from driver.api.errors import ManifestError  # noqa: PLC0415

    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if raw != "-" and path.is_dir():
            found = [
                str(p) for p in sorted(path.iterdir()) if p.is_file() and p.suffix in _SUFFIXES
            ]
            if not found:
                raise ManifestError(
                    f"{raw}: a directory without {', '.join(_SUFFIXES)} files; nothing was read "
                    "from it"
                )
            out.extend(found)
        else:
            out.append(raw)
    return out


def run(args: argparse.Namespace) -> int:
    import yaml  # noqa: PLC0415 - heavy imports inside run keep `biaxial --help` fast

    from biaxial.simulate.manifests import load_documents  # noqa: PLC0415
    from biaxial.simulate.simulator import project_deviceclasses, simulate  # noqa: PLC0415
    from driver.api.errors import ManifestError  # noqa: PLC0415
    from driver.scheduling.policy import PolicyDefaults  # noqa: PLC0415

    # A one-shot run whose objects all live until it exits: the cyclic collector would only
    # walk them again and again (at 5000 nodes that was half the start-up). Reference
    # counting still frees everything temporary.
    gc.disable()
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_FORMATS:
        raise ManifestError(
            f"--plot {args.plot}: the file name must end in {', '.join(PLOT_FORMATS)}"
        )
    if not args.paths and not args.kubeconfig:
        raise ManifestError("give manifest PATHs, or --kubeconfig FILE to read a live cluster")
    loaded = load_documents(expand_paths(args.paths))
    if args.paths and not loaded and not args.kubeconfig:
        raise ManifestError(f"no objects in {', '.join(args.paths)}")
    objects: list[dict[str, Any]] = [obj for obj, _ in loaded]
    base_dirs: list[Path | None] = [
        None if path == "-" else Path(path).resolve().parent for _, path in loaded
    ]
    defaults = PolicyDefaults()
    defaults = PolicyDefaults.parse(
        args.node_policy or defaults.node, args.gpu_policy or defaults.gpu
    )
    if args.kubeconfig:
        from biaxial.simulate.live import read_cluster  # noqa: PLC0415

        live = read_cluster(args.kubeconfig)
        objects = [*live, *objects]
        base_dirs = [*(None for _ in live), *base_dirs]
    default_classes: list[dict[str, Any]] = []
    if not args.no_default_classes and not args.kubeconfig:
        default_classes = project_deviceclasses()
    admission = None
    if args.admission_values:
        from biaxial.simulate import admission as step  # noqa: PLC0415

        admission = step.from_values(step.load_values(args.admission_values))
    elif args.admission:
        from biaxial.simulate import admission as step  # noqa: PLC0415

        admission = step.everywhere()
    result = simulate(
        objects,
        default_classes=default_classes,
        defaults=defaults,
        scheduler_name=args.scheduler_name,
        base_dirs=base_dirs,
        admission=admission,
    )
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
    if args.fail_on_unschedulable and result.unschedulable:
        return EXIT_UNSCHEDULABLE
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


def _slices_free(g: GpuUsage) -> str:
    """``free/total (largest profile still placeable)`` of a dynamic-MIG GPU, else ``-``."""
    if not g.dynamic:
        return "-"
    return f"{g.free_slices}/{g.memory_slices} ({g.largest_placeable or 'none placeable'})"


def render_table(result: SimulationResult) -> str:
    """The human-readable report: placements, what was changed or left out, then the
    nodes, the GPUs and the summary lines, one section after another."""
    summary = result.summary()
    sections = [
        _placements(result),
        *_exceptions(result),
        _node_usage(summary),
        _gpu_usage(result),
        _summary_lines(result, summary),
    ]
    return "\n\n".join("\n".join(section) for section in sections if section) + "\n"


def _placements(result: SimulationResult) -> list[str]:
    rows = []
    for p in result.placements:
        consumed = [d.get("consumedCapacity") or {} for d in p.devices]
        rows.append(
            [
                p.pod,
                p.node,
                ",".join(str(d["device"]) for d in p.devices) or "-",
                ",".join(str(d["uuid"]) for d in p.devices) or "-",
                ",".join(str(c.get("memory", "whole")) for c in consumed) or "-",
                ",".join(str(c.get("cores", "-")) for c in consumed) or "-",
                f"{p.policies.node}/{p.policies.gpu}",
            ]
        )
    return _table(["POD", "NODE", "GPUS", "UUIDS", "MEMORY", "CORES", "POLICIES"], rows)


def _exceptions(result: SimulationResult) -> list[list[str]]:
    """The sections for what admission changed, what did not fit or was skipped, what
    would be preempted, and the notes (each only when it has something)."""
    out = []
    if result.admissions:
        out.append(_table(["ADMISSION CHANGED", "WHAT"], [list(a) for a in result.admissions]))
    for title, entries in (("UNSCHEDULABLE", result.unschedulable), ("SKIPPED", result.skipped)):
        if entries:
            rows = [[f.pod, " ".join(f.reason.split())] for f in entries]
            out.append(_table([title, "REASON"], rows))
    if result.preemptions:
        rows = [[p.pod, p.node, ",".join(p.victims)] for p in result.preemptions]
        out.append(_table(["WOULD PREEMPT FOR", "NODE", "VICTIMS"], rows))
    if result.notes:
        out.append([f"note: {n}" for n in result.notes])
    return out


def _node_usage(summary: Mapping[str, Any]) -> list[str]:
    rows = [
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
    ]
    return _table(["NODE", "GPUS", "IN USE", "PODS", "MEMORY USED"], rows)


def _gpu_usage(result: SimulationResult) -> list[str]:
    """One row per GPU, one per MIG partition under it; with dynamic MIG, a column for each
    GPU's free memory slices and largest placeable profile."""
    dynamic = any(g.dynamic for g in result.gpus)
    rows = []
    for g in result.gpus:
        rows.append(
            [
                g.node,
                g.device,
                g.product,
                f"{_mib(g.memory_used)}/{_mib(g.memory)}",
                "MIG" if g.mig else f"{g.cores_used}/{g.cores}",
                ",".join(p for p, _ in g.pods) or ("-" if not g.mig else ""),
            ]
            + ([_slices_free(g)] if dynamic else [])
        )
        rows.extend(
            [
                "",
                f"  {part.device}",
                part.profile,
                f"{_mib(part.memory if part.pods else 0)}/{_mib(part.memory)}",
                "",
                ",".join(part.pods) or "-",
            ]
            + ([""] if dynamic else [])
            for part in g.partitions
        )
    headers = ["NODE", "GPU", "PRODUCT", "MEMORY USED", "CORES", "PODS"]
    return _table(headers + (["MIG SLICES FREE"] if dynamic else []), rows)


def _summary_lines(result: SimulationResult, summary: Mapping[str, Any]) -> list[str]:
    timing = summary["timing"]
    used = result.policies_used()
    policies = (
        "; ".join(
            f"{name} ({count} pod{'s' if count != 1 else ''})" for name, count in used.items()
        )
        if used
        else f"defaults node {result.policies.node}, GPU {result.policies.gpu}"
    )
    mig_free = summary["migPartitionsFree"]
    return [
        f"placed {summary['placed']}/{summary['pods']} pods on {summary['nodesUsed']} node(s), "
        f"{summary['gpusInUse']} GPU(s) in use, {summary['wholeGpusFree']} whole GPU(s) free"
        + (f", {mig_free} MIG partition(s) free" if mig_free else "")
        + f", fragmentation {summary['fragmentation']:.2f}"
        + (f", {summary['skipped']} skipped" if summary["skipped"] else "")
        + (f", {summary['running']} running" if summary["running"] else ""),
        f"policies: {policies}",
        (
            f"startup {timing['startupSeconds']:.3f}s, decisions {timing['decisionSeconds']:.3f}s "
            f"({timing['podsPerSecond']} pods/s, p99 {timing['p99DecisionMs']} ms)"
        ),
    ]

"""The head-to-head's tables: one per workload, a metric per row, a column per (scheduler,
client QPS), repeated runs side by side in one cell; the four patterns' placements; upstream's
scheduler_perf figures measured here."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from bench.h2h.workloads import JSON, PATTERNS, STEADY, STEADY_IN_FLIGHT
from bench.report import table_lines

_ROWS: Final[tuple[tuple[str, Callable[[JSON], str]], ...]] = (
    ("pods bound", lambda r: f"{r['bound']}/{r['pods']}"),
    ("seconds", lambda r: f"{r['seconds']:.1f}"),
    ("pods/s average", lambda r: f"{r['pods_per_s']:.1f}"),
    (
        "pods/s p50 / p90 / p99",
        lambda r: (
            f"{r['pods_per_s_p50']:.0f} / {r['pods_per_s_p90']:.0f} / {r['pods_per_s_p99']:.0f}"
        ),
    ),
    ("created->bound p50 ms", lambda r: f"{r['p50_ms']:.0f}"),
    ("created->bound p99 ms", lambda r: f"{r['p99_ms']:.0f}"),
    ("API requests / bound pod", lambda r: f"{r['requests_per_pod']:.2f}"),
    ("scheduler CPU s", lambda r: f"{r['cpu_s']:.1f}"),
    ("scheduler CPU ms / pod", lambda r: f"{1000 * r['cpu_s_per_pod']:.1f}"),
    ("scheduler peak RSS MB", lambda r: f"{r['rss_mb']:.0f}"),
    ("load average (1 min)", lambda r: f"{r['load_avg']:.2f}"),
    ("driver's pod watch re-listed", lambda r: str(r["watch_relists"])),
    ("bindings the watch missed", lambda r: str(r.get("watch_missed", 0))),
)
_CHURN_ROWS: Final[tuple[tuple[str, Callable[[JSON], str]], ...]] = (
    ("whole GPUs free before the wave", lambda r: str(r["whole_gpus_free"])),
    ("GPUs with stranded memory before", lambda r: str(r["stranded_gpus"])),
    (
        "stranded GiB (fragmentation)",
        lambda r: f"{r['stranded_gib']:.0f} ({r['fragmentation']:.2f})",
    ),
    ("training pods placed", lambda r: f"{r['training_placed']}/{r['training_pods']}"),
    ("pods left pending", lambda r: str(r["pending"])),
)


def _title(first: JSON) -> str:
    workload = first["workload"]
    if workload == "churn":
        return (
            f"churn: {first['nodes']} nodes x {first['devices']}, {first['pods']} pods "
            f"({first['training_pods']} of them the training wave)"
        )
    title = f"{workload}: {first['nodes']} nodes x {first['devices']}, {first['pods']} pods"
    if workload in STEADY:
        title += (
            f" streamed {STEADY_IN_FLIGHT} at a time (each deleted once bound), "
            f"{first['held_devices']} devices held before"
        )
    return title


def _size(run: JSON) -> tuple[str, int, int, int]:
    return run["workload"], run["nodes"], run["pods"], run.get("held_devices", 0)


def tables(runs: Sequence[JSON]) -> list[str]:
    """One table per workload and size: a metric per row, a column per (scheduler, client
    QPS). Repeated runs of one column share it, each cell ``run 1; run 2; ...``."""
    out: list[str] = []
    for size in dict.fromkeys(_size(r) for r in runs):
        mine = [r for r in runs if _size(r) == size]
        columns: dict[str, list[JSON]] = {}
        for r in mine:
            columns.setdefault(f"{r['scheduler']} @{r['qps']}/{r['burst']}", []).append(r)
        out.append(_title(mine[0]))
        headers = [
            "",
            *(f"{h} ({len(c)} runs)" if len(c) > 1 else h for h, c in columns.items()),
        ]
        rows = _ROWS + (_CHURN_ROWS if size[0] == "churn" else ())
        body = [
            [label, *("; ".join(fmt(r) for r in c) for c in columns.values())]
            for label, fmt in rows
        ]
        out.extend(table_lines(headers, body))
        out.append("")
        if size[0] == "four-patterns":
            out.extend(pattern_lines(mine))
    return out


def pattern_summary(placements: Sequence[JSON]) -> tuple[int, int]:
    """(nodes used, GPUs used) by one pattern's pods."""
    nodes = {p["node"] for p in placements if p["node"]}
    gpus = {d for p in placements for d in p["device"].split(",") if d}
    return len(nodes), len(gpus)


def _short(device: str) -> str:
    """``gpu-t4/gpu-2`` as ``t4/gpu-2``: the node without its ``gpu-`` prefix."""
    pool, _, name = device.partition("/")
    return f"{pool.removeprefix('gpu-')}/{name}"


def pattern_lines(runs: Sequence[JSON]) -> list[str]:
    """Per pattern and scheduler: nodes and GPUs used, and where each replica went."""
    headers = ["pattern (node x GPU policy)", "scheduler", "nodes", "GPUs", "placement"]
    body: list[list[str]] = []
    for pattern, (node_policy, gpu_policy) in PATTERNS.items():
        for r in runs:
            placed = r["placements"][pattern]
            nodes, gpus = pattern_summary(placed)
            where = " ".join(_short(p["device"]) if p["device"] else "pending" for p in placed)
            label = f"{pattern} ({node_policy} x {gpu_policy})"
            body.append([label, f"{r['scheduler']} @{r['qps']}", str(nodes), str(gpus), where])
    return [*table_lines(headers, body), ""]


def upstream_lines(items: Sequence[JSON]) -> list[str]:
    """Upstream's scheduler_perf figures measured on this machine."""
    if not items:
        return []
    headers = [
        "scheduler_perf workload (upstream, this machine)",
        "pods/s average",
        "p50 / p90 / p99",
    ]
    body = [
        [
            i["workload"],
            f"{i['pods_per_s']:.1f}",
            f"{i.get('perc50', 0):.0f} / {i.get('perc90', 0):.0f} / {i.get('perc99', 0):.0f}",
        ]
        for i in items
    ]
    return [*table_lines(headers, body), ""]


def read_json(paths: Sequence[Path]) -> tuple[list[JSON], list[JSON]]:
    """The runs and upstream's figures of earlier ``--json`` files, in the files' order."""
    runs: list[JSON] = []
    upstream: list[JSON] = []
    for path in paths:
        document = json.loads(path.read_text())
        runs.extend(document.get("runs") or ())
        upstream.extend(document.get("upstream_scheduler_perf") or ())
    return runs, upstream


def write_json(path: Path, runs: Sequence[JSON], upstream: Sequence[JSON] = ()) -> None:
    path.write_text(
        json.dumps({"runs": list(runs), "upstream_scheduler_perf": list(upstream)}, indent=2) + "\n"
    )

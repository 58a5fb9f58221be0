"""What the benchmarks share: the timed placement loop, percentiles of its timings, peak
memory, a right-aligned table, and a measurement run in a fresh interpreter (so peak memory
is the measurement's own)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from driver.api.claims import ResourceClaim
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def table_lines(headers: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    """A header, a rule and the rows, each column right-aligned to its widest cell."""
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines.extend(" | ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body)
    return lines


def run_child(module: str, directory: str) -> dict[str, Any]:
    """``python -m <module> --child <directory>``; its stdout is one JSON object."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--child", directory],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def place_stream(
    engine: DecisionEngine, inputs: Sequence[tuple[Any, Sequence[ResourceClaim]]]
) -> dict[str, Any]:
    """Decide (and assume) each ``(pod, claims)`` in order, timing every decision: pods placed,
    pods/s, p50/p99 and mean wall ms, and CPU ms per pod."""
    durations: list[float] = []
    placed = 0
    started = time.perf_counter()
    cpu_started = time.process_time()
    for pod, claims in inputs:
        t0 = time.perf_counter()
        decision = engine.decide(pod, claims)
        if isinstance(decision, Placement):
            engine.assume(decision, pod)
            placed += 1
        durations.append(time.perf_counter() - t0)
    total = time.perf_counter() - started
    total_cpu = time.process_time() - cpu_started
    return {
        "pods": len(inputs),
        "placed": placed,
        "podsPerSecond": len(inputs) / total,
        "p50Ms": 1000 * percentile(durations, 0.50),
        "p99Ms": 1000 * percentile(durations, 0.99),
        "meanMs": 1000 * total / len(inputs),
        "cpuMsPerPod": 1000 * total_cpu / len(inputs),
    }


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited across exec from the
    parent that generated the scenario)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

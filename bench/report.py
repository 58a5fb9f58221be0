"""What the benchmarks share: a scenario stored as one JSON list per kind (as a controller
lists them) and parsed back into the core's models, the timed placement loop, percentiles of
its timings, peak memory, a right-aligned table, and a measurement run in a fresh interpreter
(so peak memory is the measurement's own)."""

from __future__ import annotations

import contextlib
import cProfile
import hashlib
import json
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from driver.api.claims import DeviceClass, ResourceClaim
from driver.api.model import ResourceSlice
from driver.api.nodes import Node
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Decision, Placement

_T = TypeVar("_T")


def store_lists(folder: Path, lists: Mapping[str, Any]) -> None:
    """Write each list to ``folder/<kind>.json``."""
    for kind, items in lists.items():
        (folder / f"{kind}.json").write_text(json.dumps(items), encoding="utf-8")


def listed(folder: Path, kind: str) -> Any:
    """The list :func:`store_lists` wrote for ``kind``."""
    with (folder / f"{kind}.json").open(encoding="utf-8") as handle:
        return json.load(handle)


def parse_cluster(
    folder: Path,
) -> tuple[list[Node], list[ResourceSlice], list[DeviceClass], list[ResourceClaim]]:
    """The stored nodes, slices, classes and claims as the core's models."""
    return (
        [Node.from_api(n) for n in listed(folder, "nodes")],
        [ResourceSlice.from_api(s) for s in listed(folder, "slices")],
        [DeviceClass.from_api(c) for c in listed(folder, "classes")],
        [ResourceClaim.from_api(c) for c in listed(folder, "claims")],
    )


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


@contextlib.contextmanager
def stored(write: Callable[[Path], None]) -> Iterator[Path]:
    """A fresh folder with what ``write`` put there (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="biaxial-bench-") as tmp:
        write(Path(tmp))
        yield Path(tmp)


def measured_apart(module: str, write: Callable[[Path], None]) -> dict[str, Any]:
    """``write`` a scenario into a fresh folder and measure it with :func:`run_child`."""
    with stored(write) as folder:
        return run_child(module, str(folder))


def profiled(run: Callable[[], _T], lines: int) -> _T:
    """``run()`` under cProfile in this process; prints the ``lines`` costliest calls by
    cumulative time and returns what it returned."""
    profiler = cProfile.Profile()
    profiler.enable()
    result = run()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(lines)
    return result


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
    pods/s, p50/p99 and mean wall ms, and CPU ms per pod and its p99 (each decision's own CPU
    time: what a shared machine's load does not inflate), and a digest of the answers (so a
    change meant to be faster only can be checked to answer exactly as before)."""
    durations: list[float] = []
    cpu_durations: list[float] = []
    decisions: list[Decision] = []
    placed = 0
    started = time.perf_counter()
    cpu_started = time.process_time()
    for pod, claims in inputs:
        t0 = time.perf_counter()
        c0 = time.process_time()
        decision = engine.decide(pod, claims)
        if isinstance(decision, Placement):
            engine.assume(decision, pod)
            placed += 1
        decisions.append(decision)
        durations.append(time.perf_counter() - t0)
        cpu_durations.append(time.process_time() - c0)
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
        "cpuP99Ms": 1000 * percentile(cpu_durations, 0.99),
        "digest": answers_digest(decisions),
    }


def answers_digest(decisions: Sequence[Decision]) -> str:
    """A short hash of every decision's answer, in order: pod, node, score and the devices
    of each allocation result (a decision that places nothing: pod and message)."""
    digest = hashlib.sha256()
    for decision in decisions:
        if isinstance(decision, Placement):
            results = [r.to_api() for r in decision.all_results]
            answer: Any = [decision.pod, decision.node, str(decision.score), results]
        else:
            answer = [decision.pod, type(decision).__name__, decision.message]
        digest.update(json.dumps(answer, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited across exec from the
    parent that generated the scenario)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

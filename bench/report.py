"""What the benchmarks share: percentiles of their timings, a right-aligned table, and a
measurement run in a fresh interpreter (so peak memory is the measurement's own)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any


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

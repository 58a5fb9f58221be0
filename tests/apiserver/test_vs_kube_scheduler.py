"""``bench.vs_kube_scheduler`` end to end at a tiny size: both schedulers, each on a fresh real
control plane, bind every pod, and the JSON has the shape issue 24 asks for."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import vs_kube_scheduler
from tests.cluster.build import binaries, release

NEEDED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
FIELDS = {
    "workload": str,
    "nodes": int,
    "scheduler": str,
    "pods": int,
    "bound": int,
    "pods_per_s": float,
    "p50_ms": float,
    "p99_ms": float,
    "requests_per_pod": float,
    "cpu_s_per_pod": float,
    "rss_mb": float,
    "qps": int,
}


def _need_control_plane() -> None:
    missing = set(NEEDED) - set(binaries(release(), NEEDED))
    if missing:
        reason = f"no {', '.join(sorted(missing))}: run `make control-plane`"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.mark.timeout(90)
def test_both_schedulers_bind_every_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _need_control_plane()
    out = tmp_path / "runs.json"
    argv = ["--nodes", "5", "--pods", "20", "--workloads", "claim-template", "--json", str(out)]
    assert vs_kube_scheduler.main(argv) == 0

    report = json.loads(out.read_text())
    assert report["upstream_scheduler_perf"] == []
    runs = report["runs"]
    assert [r["scheduler"] for r in runs] == ["kube-scheduler", "biaxial"]
    for run in runs:
        for name, kind in FIELDS.items():
            assert isinstance(run[name], kind), (name, run[name])
        assert (run["workload"], run["nodes"], run["pods"], run["qps"]) == (
            "claim-template",
            5,
            20,
            5000,
        )
        assert run["bound"] == 20, run
        assert run["requests_per_pod"] > 0, run
    table = capsys.readouterr().out
    assert "kube-scheduler @5000/5000" in table
    assert "biaxial @5000/5000" in table


@pytest.mark.timeout(120)
def test_steady_state_and_four_patterns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A full cluster streamed to the end (every pod bound, each deleted once bound, so the
    held devices and the freed ones are both honoured), and the four patterns placed by both."""
    _need_control_plane()
    out = tmp_path / "runs.json"
    argv = ["--nodes", "2", "--stream-pods", "15", "--json", str(out)]
    argv += ["--workloads", "claim-template-full,four-patterns"]
    assert vs_kube_scheduler.main(argv) == 0

    runs = json.loads(out.read_text())["runs"]
    assert [(r["workload"], r["scheduler"]) for r in runs] == [
        ("claim-template-full", "kube-scheduler"),
        ("claim-template-full", "biaxial"),
        ("four-patterns", "kube-scheduler"),
        ("four-patterns", "biaxial"),
    ]
    for run in runs[:2]:
        assert (run["bound"], run["held_devices"]) == (15, 10), run
    for run in runs[2:]:
        assert run["bound"] == 16, run
        assert sorted(run["placements"]) == ["A", "B", "C", "D"]
    # biaxial's node binpack keeps pattern A on one node, its GPU spread gives C four GPUs
    biaxial = runs[3]["placements"]
    assert len({p["node"] for p in biaxial["A"]}) == 1
    assert len({p["device"] for p in biaxial["C"]}) == 4
    assert "pattern (node x GPU policy)" in capsys.readouterr().out

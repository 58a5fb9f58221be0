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


@pytest.mark.timeout(90)
def test_both_schedulers_bind_every_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = set(NEEDED) - set(binaries(release(), NEEDED))
    if missing:
        reason = f"no {', '.join(sorted(missing))}: run `make control-plane`"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
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

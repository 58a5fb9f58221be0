"""Upstream's own benchmark on this machine: scheduler_perf's DRA binary (``dra.test``, built
by ``python -m tests.cluster.build --scheduler-perf`` from the same ``k8s.io/kubernetes``),
its ``SchedulingWithResourceClaimTemplate`` workloads labelled ``performance`` (500 nodes:
the 5000-pod burst, the steady states empty / half / full, with a CEL selector, with
``matchAttribute``), and their ``SchedulingThroughput`` read from the data-items JSON file it
writes (average and the percentiles of its one-second samples, pods/s).

scheduler_perf runs kube-scheduler in process against an in-process kube-apiserver with a
real etcd (the control plane's, put on ``PATH``), client QPS 5000; its steady states stream
pods for 10 seconds where ours stream a fixed count."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from bench.h2h.workloads import JSON
from tests.cluster.build import BuildError, binaries, build_scheduler_perf, release

BENCH: Final = "^BenchmarkPerfScheduling$/^SchedulingWithResourceClaimTemplate$"
TIMEOUT_S: Final = 1800


def parse_data_items(document: JSON) -> list[JSON]:
    """The ``SchedulingThroughput`` items of a scheduler_perf data-items file as
    ``{"workload", "pods_per_s", "perc50", "perc90", "perc99"}``: ``<test case>/<workload>``,
    the average and percentiles of its one-second throughput samples. A workload too short to
    sample has no such item."""
    out: list[JSON] = []
    for item in document.get("dataItems") or ():
        labels = item.get("labels") or {}
        if labels.get("Metric") != "SchedulingThroughput":
            continue
        # BenchmarkPerfScheduling/<test case>/<workload>/<namespace or "test">
        parts = str(labels.get("Name", "")).split("/")
        if parts and parts[0].startswith("BenchmarkPerfScheduling"):
            parts = parts[1:]
        workload = "/".join(parts[:2])
        data = item.get("data") or {}
        out.append(
            {
                "workload": workload,
                "pods_per_s": float(data.get("Average", 0.0)),
                "perc50": float(data.get("Perc50", 0.0)),
                "perc90": float(data.get("Perc90", 0.0)),
                "perc99": float(data.get("Perc99", 0.0)),
            }
        )
    return out


def _module_cache() -> str:
    """Go's module cache, where ``k8s.io/kubernetes`` (and its test data) was downloaded."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        found = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if found:
            return found
    return str(Path.home() / "go" / "pkg" / "mod")


def run(workloads: str = "", *, log_to: Path | None = None) -> list[JSON]:
    """Build (or reuse) ``dra.test`` and run the benchmark; ``workloads`` narrows it (a regular
    expression for scheduler_perf's third level, ``5000pods_500nodes`` ...). Raises
    :class:`BuildError` where the build cannot go on and RuntimeError where the run fails."""
    rel = release()
    config = build_scheduler_perf(rel)
    etcd = binaries(rel, ("etcd",)).get("etcd")
    if etcd is None:
        raise BuildError("no etcd: run `make control-plane`")
    pattern = BENCH + (f"/^{workloads}$" if workloads else "")
    with tempfile.TemporaryDirectory(prefix="scheduler-perf-") as tmp:
        env = {
            **os.environ,
            "PATH": f"{etcd.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "ARTIFACTS": tmp,  # per-test logs go there, not to stderr
        }
        # an etcd already listening on the default 2379 would be used as is; point it at a
        # URL nothing listens on so the benchmark starts its own
        env.setdefault("KUBE_INTEGRATION_ETCD_URL", "http://127.0.0.1:1")
        # the in-process kube-apiserver finds its test certificates from its source path, which
        # -trimpath made relative; its bazel escape hatch roots it in the module cache
        env.update(TEST_SRCDIR=_module_cache(), TEST_WORKSPACE=".")
        argv = [
            str(config.parent / "bin" / "dra.test"),
            "-test.run=^$",
            f"-test.bench={pattern}",
            "-test.benchtime=1ns",
            f"-test.timeout={TIMEOUT_S}s",
            "-perf-scheduling-label-filter=performance",
            f"-data-items-dir={tmp}",
        ]
        print(f"running upstream's scheduler_perf: {' '.join(argv[1:])}", file=sys.stderr)
        with Path(log_to or os.devnull).open("w") as log:
            proc = subprocess.run(
                argv, cwd=config, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
            )
        files = sorted(Path(tmp).glob("BenchmarkPerfScheduling*.json"))
        where = f" (its output: {log_to})" if log_to else ""
        if not files:
            raise RuntimeError(f"scheduler_perf exited {proc.returncode} with no data{where}")
        if proc.returncode != 0:
            # a workload below upstream's threshold fails the benchmark, its figures are
            # written all the same: on a small or busy machine that is the usual case
            print(
                f"scheduler_perf exited {proc.returncode}: a workload failed or missed "
                f"upstream's threshold{where}",
                file=sys.stderr,
            )
        return parse_data_items(json.loads(files[-1].read_text()))

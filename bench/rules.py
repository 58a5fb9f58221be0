"""Scheduler-rule benchmark: pods that carry a rule between pods, and a GPU request.

Modelled on kube-scheduler's scheduler_perf workloads of the same names
(``test/integration/scheduler_perf/config/performance-config.yaml``): a set of *init* pods is
placed first (not timed), then the *measured* pods, every one carrying the rule:

=========================  ================================================================
workload                   every pod
=========================  ================================================================
pod-anti-affinity          ``color: green``, required anti-affinity to ``color: green`` on
                           ``kubernetes.io/hostname`` (upstream SchedulingPodAntiAffinity)
pod-affinity               ``foo: bar``, required affinity to ``foo: bar`` on the zone
                           (SchedulingPodAffinity; the first pod matches itself)
topology-spreading         ``DoNotSchedule`` spread of ``foo: bar`` on hostname and zone,
                           maxSkew 5 (TopologySpreading; the init pods carry no rule)
preferred-spreading        the same, ``ScheduleAnyway`` (PreferredTopologySpreading)
=========================  ================================================================

The cluster is :func:`bench.scenarios.generate`'s (N nodes x 8 A100-80GB, part of each
node's GPU memory already held (up to half), with the nodes spread over three zones. Each pod asks
for a 10000 MiB share of one GPU (legacy ``nvidia.com/gpu: 1`` + ``nvidia.com/gpumem``) under the
default policies (node and GPU binpack: the nodes in use come first in the node search, which
is where a rule excluding them costs most). Sizes follow upstream: 500 nodes (100 init + 400
measured pods; the anti-affinity workload then fills every node) and 5000 nodes (1000 + 1000).

For each workload and size a fresh child process builds the engine, places the init pods,
then times each measured decision. One table per workload (pods/s, p50/p99, nodes evaluated
and allocator calls per pod, and a digest of the answers: equal before and after a change
meant to be faster only), with the targets: >= 300 pods/s at 500 nodes, >= 150 at 5000,
p99 <= 20 ms; beside the wall-clock figures, the CPU time per pod, which a shared machine's
load inflates far less (compare runs by it when the machine is busy). ``--workload`` and
``--nodes`` pick, ``--profile`` profiles one size.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import (
    listed,
    measured_apart,
    parse_cluster,
    peak_rss_mb,
    place_stream,
    profiled,
    store_lists,
    stored,
    table_lines,
)
from bench.scenarios import generate
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement
from driver.structured.snapshot import ClusterSnapshot

JSON = dict[str, Any]
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
ZONES = ("zone-1", "zone-2", "zone-3")
WORKLOADS = ("pod-anti-affinity", "pod-affinity", "topology-spreading", "preferred-spreading")
#: nodes -> (init pods, measured pods), as upstream's sizes
SIZES: dict[int, tuple[int, int]] = {500: (100, 400), 5000: (1000, 1000)}
TARGETS = {500: 300.0, 5000: 150.0}
P99_TARGET_MS = 20.0


def _pod(name: str, labels: JSON, spec: JSON, limits: JSON) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "labels": labels},
        "spec": {
            **spec,
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": limits},
                }
            ],
        },
    }


def _spread(when: str) -> JSON:
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": 5,
                "topologyKey": key,
                "whenUnsatisfiable": when,
                "labelSelector": {"matchLabels": {"foo": "bar"}},
            }
            for key in (HOSTNAME, ZONE)
        ]
    }


def workload_pods(workload: str, count: int, *, measured: bool) -> list[JSON]:
    """The pods of one workload (init pods when not ``measured``)."""
    prefix = "measured" if measured else "init"
    share = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "10000"}
    out = []
    for i in range(count):
        name = f"{prefix}-{i:05d}"
        if workload == "pod-anti-affinity":
            term = {
                "labelSelector": {"matchLabels": {"color": "green"}},
                "topologyKey": HOSTNAME,
            }
            spec = {
                "affinity": {
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
                }
            }
            out.append(_pod(name, {"color": "green"}, spec, share))
        elif workload == "pod-affinity":
            term = {"labelSelector": {"matchLabels": {"foo": "bar"}}, "topologyKey": ZONE}
            spec = {
                "affinity": {
                    "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
                }
            }
            out.append(_pod(name, {"foo": "bar"}, spec, share))
        else:
            when = "DoNotSchedule" if workload == "topology-spreading" else "ScheduleAnyway"
            spec = _spread(when) if measured else {}
            out.append(_pod(name, {"foo": "bar"}, spec, share))
    return out


def write_scenario(folder: Path, workload: str, nodes: int, seed: int) -> None:
    init, measured = SIZES.get(nodes, (nodes // 5, nodes // 5 * 4))
    scenario = generate(nodes, 0, seed=seed, max_fill=0.5)
    rng = random.Random(seed)
    for node in scenario.nodes:
        node["metadata"]["labels"][ZONE] = rng.choice(ZONES)
    lists = {
        "nodes": scenario.nodes,
        "slices": scenario.slices,
        "classes": scenario.classes,
        "claims": scenario.claims,
        "init": workload_pods(workload, init, measured=False),
        "measured": workload_pods(workload, measured, measured=True),
    }
    store_lists(folder, lists)


def measure(folder: Path) -> dict[str, Any]:
    """One workload at one size, in this process."""
    gc.collect()
    gc.disable()
    nodes, slices, classes, claims = parse_cluster(folder)
    snapshot = ClusterSnapshot.build(slices, classes, claims)
    engine = DecisionEngine(snapshot, nodes)
    del slices, claims
    gc.freeze()
    gc.enable()
    init_placed = 0
    for pod in listed(folder, "init"):
        decision = engine.decide(pod, ())
        if isinstance(decision, Placement):
            engine.assume(decision, pod)
            init_placed += 1
    engine.stats.nodes_evaluated = engine.stats.allocator_calls = 0
    measured = listed(folder, "measured")
    stream = place_stream(engine, [(pod, ()) for pod in measured])
    return {
        "nodes": len(nodes),
        "init": init_placed,
        **stream,
        "nodesEvaluated": engine.stats.nodes_evaluated,
        "allocatorCalls": engine.stats.allocator_calls,
        "peakRssMb": peak_rss_mb(),
    }


def _writer(workload: str, nodes: int, seed: int) -> Callable[[Path], None]:
    return lambda folder: write_scenario(folder, workload, nodes, seed)


def table(rows: list[dict[str, Any]]) -> str:
    headers = [
        "nodes",
        "init pods",
        "pods",
        "placed",
        "pods/s",
        "target",
        "p50 ms",
        "p99 ms",
        "CPU ms/pod",
        "CPU p99 ms",
        "nodes evaluated/pod",
        "allocator calls/pod",
        "peak RSS MB",
        "digest",
    ]
    body = []
    for r in rows:
        target = TARGETS.get(r["nodes"])
        ok = target is None or (r["podsPerSecond"] >= target and r["p99Ms"] <= P99_TARGET_MS)
        body.append(
            [
                str(r["nodes"]),
                str(r["init"]),
                str(r["pods"]),
                str(r["placed"]),
                f"{r['podsPerSecond']:.0f}",
                (f">= {target:.0f}, p99 <= {P99_TARGET_MS:.0f} " + ("ok" if ok else "MISSED"))
                if target
                else "-",
                f"{r['p50Ms']:.2f}",
                f"{r['p99Ms']:.2f}",
                f"{r['cpuMsPerPod']:.2f}",
                f"{r['cpuP99Ms']:.2f}",
                f"{r['nodesEvaluated'] / r['pods']:.1f}",
                f"{r['allocatorCalls'] / r['pods']:.1f}",
                f"{r['peakRssMb']:.0f}",
                r["digest"],
            ]
        )
    return "\n".join(table_lines(headers, body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rules", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workload", choices=WORKLOADS, action="append", help="default: all")
    parser.add_argument("--nodes", type=int, action="append", help="default: 500 and 5000")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--child", metavar="SCENARIO", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="cProfile one size in-process")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(Path(args.child))))
        return 0
    workloads = args.workload or list(WORKLOADS)
    sizes = args.nodes or sorted(SIZES)
    if args.profile:
        with stored(_writer(workloads[0], sizes[0], args.seed)) as folder:
            result = profiled(lambda: measure(folder), 40)
        print(table([result]))
        return 0
    for workload in workloads:
        rows = []
        for nodes in sizes:
            rows.append(measured_apart("bench.rules", _writer(workload, nodes, args.seed)))
            print(f"  {workload}: {nodes} nodes done", file=sys.stderr)
        print(f"\n== {workload}")
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Decision-core benchmark (``make bench``): throughput, latency, cold start and memory.

Two families of scenarios (:mod:`bench.scenarios`):

* ``uniform``: 100, 500, 1000, 5000 nodes x 8 A100-80GB, 1,000 pods (whole, shares, multi-GPU);
* ``mixed``, ``mig-heavy``, ``selector-heavy``: the realistic mixed cluster (4 x T4, 4 x A10G,
  8 x A100-80GB, 8 x H100-80GB with MIG on two GPUs) at 500 and 5000 nodes, 2,000 pods in
  Deployments of every pod shape (legacy and HAMi resources, shares, NUMA / PCIe groups, MIG,
  a product class, an H100 selector), each Deployment with its own policies.
* ``dynamic-mig``: 500 nodes x 8 A100-80GB / H100-80GB, dynamic MIG on half of them (every
  placement of every profile published, counters shared), 2,000 MIG and share pods; targets
  >= 300 pods/s and p99 <= 10 ms.
* ``mix-<name>``: fixed mixes of Deployments (:data:`bench.scenarios.MIXES`) on empty uniform
  clusters at 500 and 5000 nodes, their pods owned by ReplicaSets (so the System default
  spreading applies, as in a cluster) and interleaved as from rollouts at once; each mix's
  parts are scenarios too (``mix-plugin``, ``mix-hami``), so a mix slower than its parts
  shows. ``mix-plugin-hami`` is issue 28's cliff: 900 whole GPUs packed, 800 HAMi 20000 MiB
  shares spread (scaled to ``--pods``).

For each scenario and size a fresh child process

1. generates the scenario (not timed);
2. measures the **cold start**: parse the listed JSON (Nodes, ResourceSlices, DeviceClasses,
   allocated ResourceClaims) into models, build the cluster snapshot, sweep every class
   selector over every device (CEL, results cached for the allocator), and build the decision
   engine's capacity index;
3. places the pods one by one with the real decision core (``decide`` then ``assume``; no API
   writes) and records each decision's wall time;
4. reports pods/s, p50/p99 decision time and the process's peak RSS; beside the wall-clock
   figures, the CPU time per pod, each decision's CPU p99 and the cold start's CPU, which a
   shared machine's load inflates far less (compare runs by those when the machine is busy),
   and a digest of the answers (pod, node, score, devices), equal before and after a change
   that should only be faster.

One table per scenario is printed, with the targets of the mixed cluster (>= 300 pods/s at
500 nodes, >= 200 at 5000, p99 <= 10 ms, per-pod cost growth <= 3x). ``--scenario``,
``--nodes`` / ``--pods`` run one scenario at other sizes; ``--profile`` runs one size under
cProfile and prints the top functions.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
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
from bench.scenarios import MIXES, VARIANTS, Scenario, generate, generate_mix, generate_mixed
from driver.api.claims import ResourceClaim
from driver.scheduling.decision import DecisionEngine
from driver.structured.snapshot import ClusterSnapshot

#: scenario -> (sizes, pods per size)
DEFAULTS: dict[str, tuple[tuple[int, ...], int]] = {
    "uniform": ((100, 500, 1000, 5000), 1000),
    **dict.fromkeys(VARIANTS, ((500, 5000), 2000)),
    # 500 nodes x 8 GPUs, dynamic MIG on half: about 55,000 published devices (26 per
    # dynamic GPU: every placement of every profile, and the whole GPU).
    "dynamic-mig": ((500,), 2000),
    # Fixed mixes of Deployments (bench.scenarios.MIXES): no mix slower than its parts.
    **{f"mix-{name}": ((500, 5000), 1700) for name in MIXES},
}
SCENARIOS = tuple(DEFAULTS)


def build(name: str, nodes: int, pods: int, seed: int) -> Scenario:
    if name == "uniform":
        return generate(nodes, pods, seed=seed)
    if name.startswith("mix-"):
        return generate_mix(nodes, pods, mix=name.removeprefix("mix-"), seed=seed)
    return generate_mixed(nodes, pods, variant=name, seed=seed)


def write_scenario(folder: Path, name: str, nodes: int, pods: int, seed: int) -> None:
    """Generate a scenario and store one JSON list per kind, as a controller lists them."""
    scenario = build(name, nodes, pods, seed)
    lists: dict[str, Any] = {
        "nodes": scenario.nodes,
        "slices": scenario.slices,
        "classes": scenario.classes,
        "claims": scenario.claims,
        "pods": [[pod, claims] for pod, claims in scenario.pods],
        "owners": [list(owner) for owner in scenario.owners],
    }
    store_lists(folder, lists)


def measure(folder: Path) -> dict[str, Any]:
    """One size, in this process, from a stored scenario."""
    # A long-running scheduler keeps its startup objects forever: collect nothing while
    # loading them, then freeze them out of the collector's way (gc.freeze), so full
    # collections stay short during decisions. The controller does the same.
    gc.collect()
    gc.disable()
    started = time.perf_counter()
    cpu_started = time.process_time()
    phases: dict[str, float] = {}
    node_models, slices, classes, claims = parse_cluster(folder)
    phases["list+parse"] = time.perf_counter() - started
    snapshot = ClusterSnapshot.build(slices, classes, claims)
    for node in node_models:
        snapshot.candidates(node)
    phases["snapshot"] = time.perf_counter() - started - phases["list+parse"]
    engine = DecisionEngine(snapshot, node_models)
    for kind, namespace, name, selector in listed(folder, "owners"):
        engine.observe_owner(kind, namespace, name, selector)
    cold = time.perf_counter() - started
    cold_cpu = time.process_time() - cpu_started
    phases["cel+index"] = cold - phases["list+parse"] - phases["snapshot"]
    devices = sum(len(s.devices) for s in slices)
    preheld = len(claims)
    del slices, claims
    gc.freeze()
    gc.enable()
    scenario_pods = listed(folder, "pods")

    pod_inputs = [
        (pod, [ResourceClaim.from_api(c) for c in pod_claims]) for pod, pod_claims in scenario_pods
    ]
    stream = place_stream(engine, pod_inputs)
    return {
        "nodes": len(node_models),
        "gpus": devices,
        "preheld": preheld,
        **stream,
        "coldStartSeconds": cold,
        "coldStartCpuSeconds": cold_cpu,
        "coldStartPhases": phases,
        "nodesEvaluated": engine.stats.nodes_evaluated,
        "allocatorCalls": engine.stats.allocator_calls,
        "peakRssMb": peak_rss_mb(),
    }


def _writer(name: str, nodes: int, pods: int, seed: int) -> Callable[[Path], None]:
    return lambda folder: write_scenario(folder, name, nodes, pods, seed)


def table(rows: list[dict[str, Any]]) -> str:
    headers = [
        "nodes",
        "devices",
        "pods",
        "placed",
        "pods/s",
        "p50 ms",
        "p99 ms",
        "CPU ms/pod",
        "CPU p99 ms",
        "cold start s",
        "cold CPU s",
        "peak RSS MB",
        "nodes evaluated/pod",
        "allocator calls/pod",
        "digest",
    ]
    lines = []
    body = [
        [
            str(r["nodes"]),
            str(r["gpus"]),
            str(r["pods"]),
            str(r["placed"]),
            f"{r['podsPerSecond']:.0f}",
            f"{r['p50Ms']:.2f}",
            f"{r['p99Ms']:.2f}",
            f"{r['cpuMsPerPod']:.2f}",
            f"{r['cpuP99Ms']:.2f}",
            f"{r['coldStartSeconds']:.2f}",
            f"{r['coldStartCpuSeconds']:.2f}",
            f"{r['peakRssMb']:.0f}",
            f"{r['nodesEvaluated'] / r['pods']:.1f}",
            f"{r['allocatorCalls'] / r['pods']:.1f}",
            r["digest"],
        ]
        for r in rows
    ]
    lines.extend(table_lines(headers, body))
    if len(rows) >= 2:
        small = next((r for r in rows if r["nodes"] == 500), rows[0])
        large = rows[-1]
        ratio = large["meanMs"] / small["meanMs"]
        lines.append("")
        lines.append(
            f"per-pod cost at {large['nodes']} nodes = {ratio:.2f} x that at {small['nodes']} nodes"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.decisions", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        action="append",
        help="scenario(s) to run; default all",
    )
    parser.add_argument("--nodes", type=int, action="append", help="cluster size(s)")
    parser.add_argument("--pods", type=int, help="pods to place per size")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--child", metavar="SCENARIO", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="cProfile one size in-process")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(Path(args.child))))
        return 0
    scenarios = args.scenario or list(SCENARIOS)
    if args.profile:
        sizes, pods = DEFAULTS[scenarios[0]]
        write = _writer(scenarios[0], (args.nodes or sizes)[0], args.pods or pods, args.seed)
        with stored(write) as folder:
            result = profiled(lambda: measure(folder), 35)
        print(table([result]))
        return 0
    for name in scenarios:
        sizes, pods = DEFAULTS[name]
        rows = []
        for nodes in args.nodes or sizes:
            write = _writer(name, nodes, args.pods or pods, args.seed)
            rows.append(measured_apart("bench.decisions", write))
            print(f"  {name}: {nodes} nodes done", file=sys.stderr)
        print(f"\n== {name}")
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Head to head with kube-scheduler (issue 24): the same real control plane, the same cluster,
the same pods, scheduled once by upstream's kube-scheduler and once by the biaxial controller.

Each run gets a **fresh control plane** (etcd, kube-apiserver, kube-controller-manager with its
resourceclaim controller at client QPS 5000, audit off, priority and fairness off and no
in-flight limit), is seeded with the same inventory (Nodes, ResourceSlices, the DeviceClass,
the ResourceClaimTemplate), then one scheduler is started (never both) with the given client
QPS/burst, and the pods are created in a burst while a watch records each binding. So the two
schedulers never share devices and neither inherits the other's state.

Workloads (``--workloads``, comma separated):

* ``claim-template``: upstream scheduler_perf's DRA shape (``SchedulingWithResourceClaimTemplate``):
  N nodes x 10 devices of a simple driver (one ResourceSlice per node, no attributes used), every
  pod with a claim from one ResourceClaimTemplate asking for one device;
* ``match-attribute``: the same nodes, devices in pairs (attribute ``group``), each pod asking
  for 2 devices with ``matchAttribute`` on the pair; half as many pods, so both fill the same
  number of devices;
* ``claim-template-empty|half|full`` and ``match-attribute-empty|half|full``: scheduler_perf's
  steady states (``SchedulingWithResourceClaimTemplate/empty|half|full_500nodes``): the same
  cluster with none, half, or all but room for 10 pods of its devices held by allocated claims
  before the scheduler starts; ``--stream-pods`` pods streamed 10 at a time, each deleted as
  soon as it is seen bound and the next created (upstream streams for 10 s instead);
* ``churn``: placement quality under churn. N nodes x 8 A100-80GB from the project's slice
  builder (every GPU shareable by ``memory``, consumable capacity), a deterministic stream of
  ``--pods`` arrivals in 5 rounds (3 in 4 a share of 10/20/40 GiB, 1 in 4 a whole GPU); after
  each round 40 % of the pods alive leave (deleted at once) and the run waits until their
  claims are gone; then a wave of N/4 8-GPU and 2N 1-GPU training pods. Reported besides the
  rest: whole GPUs free before the wave (held by no claim, whole or share), GPUs with stranded
  memory before it (partly held by shares, the rest out of reach of whole-GPU pods; its GiB and
  the fragmentation as ``biaxial simulate`` reports it), training pods placed, pods left
  pending. ``--pods`` scales the stream: 15 arrivals a node (300 at 20 nodes, 7500 at 500)
  keep the same fill at any size. kube-scheduler allocates first fit; biaxial with its defaults
  (node and GPU binpack). Its seconds include the waits between rounds, so its pods/s is not a
  throughput figure;
* ``mixed``: the project's mixed cluster (``bench.scenarios`` mixed: T4, A10G, A100, H100
  nodes) and its Deployments, restricted to what kube-scheduler can express (claims, classes,
  CEL selectors, ``matchAttribute``, consumable-capacity shares, ``nvidia.com/gpu`` through the
  bridge class; no HAMi ``gpumem``, no MIG, no per-pod policy), ``--pods`` pods in a burst;
* ``four-patterns``: the reference cluster (``gpu-t4`` 4 x T4, ``gpu-a10g`` 4 x A10G) and the
  four Deployments of the two axes (4 replicas, each a 7500 MiB share of one GPU as a claim,
  with biaxial's node x GPU policy annotations, which kube-scheduler ignores), one after the
  other; reported: nodes and GPUs each pattern used and where each replica went.

``--upstream-scheduler-perf`` also runs upstream's own scheduler_perf DRA benchmark on this
machine (``bench.h2h.upstream``; the binary is built on first use, about 10 minutes) and
prints its pods/s beside ours.

Metrics per run: bound pods per second (the count sampled once a second from the watch:
average over the run, p50/p90/p99 of the per-second samples, as scheduler_perf's throughput
collector), created-to-bound latency p50/p99 (creation timed when this driver sends the POST),
API requests per bound pod during the pod phase **from the scheduler's own client metrics**
(kube-scheduler's ``rest_client_requests_total``, biaxial's
``biaxial_controller_api_requests_total``; the API server's ``apiserver_request_total`` has no
user agent), the scheduler process's CPU seconds during the pod phase and peak RSS (VmHWM) from
``/proc``, and the 1-minute load average sampled during the run.

``python -m bench.vs_kube_scheduler --nodes 500 --pods 5000 --qps 5000/5000`` (the defaults).
``--tables A.json B.json`` prints the tables of earlier runs again, a run of the same workload,
size, scheduler and QPS in both files side by side in one cell (``run 1; run 2``).
The code: ``bench.h2h.workloads`` (the shapes, pure), ``bench.h2h.run`` (one run),
``bench.h2h.report`` (tables, JSON), ``bench.h2h.upstream`` (scheduler_perf).
Loopback only; every process is stopped when the run ends.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.h2h import upstream
from bench.h2h.report import read_json, tables, upstream_lines, write_json
from bench.h2h.run import SCHEDULERS, run_one
from bench.h2h.workloads import JSON, STEADY, WORKLOADS, shape
from tests.cluster.build import BuildError


def _qps_pair(text: str) -> tuple[int, int]:
    qps, _, burst = text.partition("/")
    return int(qps), int(burst or qps)


def _upstream(workloads: str, log: Path | None) -> list[JSON]:
    try:
        return upstream.run(workloads, log_to=log)
    except (BuildError, RuntimeError) as err:
        print(f"upstream scheduler_perf: {err}", file=sys.stderr)
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vs_kube_scheduler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=5000, help="pods of a burst workload")
    parser.add_argument(
        "--stream-pods", type=int, default=1000, help="pods of a steady-state workload"
    )
    parser.add_argument(
        "--workloads", default="claim-template", help=f"comma separated, of: {', '.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--qps",
        default="5000/5000",
        help="client QPS/BURST of both schedulers; comma separated for several runs",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="FILE")
    parser.add_argument(
        "--upstream-scheduler-perf",
        action="store_true",
        help="also run upstream's scheduler_perf DRA benchmark on this machine",
    )
    parser.add_argument(
        "--upstream-workloads",
        default="",
        metavar="REGEX",
        help="scheduler_perf's workloads (e.g. 5000pods_500nodes); all of `performance` if empty",
    )
    parser.add_argument(
        "--upstream-log", type=Path, default=None, metavar="FILE", help="scheduler_perf's output"
    )
    parser.add_argument(
        "--tables",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="print the tables of earlier --json files (repeated runs side by side: run 1; "
        "run 2) and exit; runs nothing",
    )
    args = parser.parse_args(argv)
    if args.tables:
        earlier, theirs = read_json(args.tables)
        print("\n".join(tables(earlier) + upstream_lines(theirs)))
        return 0
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")
    limits = [_qps_pair(q) for q in args.qps.split(",") if q]
    runs: list[JSON] = []
    ours: list[JSON] = []
    for workload in workloads:
        pods = args.stream_pods if workload in STEADY else args.pods
        inventory = shape(workload, args.nodes, pods)
        for qps, burst in limits:
            for which in SCHEDULERS:
                print(
                    f"running {workload} with {which} at {qps}/{burst} ...",
                    file=sys.stderr,
                    flush=True,
                )
                runs.append(run_one(inventory, which, qps, burst))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # a long run's progress
                if args.json is not None:
                    write_json(args.json, runs)
    if args.upstream_scheduler_perf:
        ours = _upstream(args.upstream_workloads, args.upstream_log)
        if args.json is not None:
            write_json(args.json, runs, ours)
    print("\n".join(tables(runs) + upstream_lines(ours)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A flood of unschedulable pods against schedulable ones (``make bench-queueing``).

The real ``biaxial controller`` process schedules against an in-process API emulator (loopback
only) holding ``--nodes`` nodes of 4 x Tesla T4, with the client QPS and burst it ships with
(``--qps``, ``--burst`` change them). Per row:

1. **fill**: ``--fill`` of the GPUs are taken whole by filler pods (one named claim each), and
   bound before anything is timed;
2. **flood**: ``--flood`` pods that cannot be placed, all created at once: by default each asks
   for an A100 80GB (``a100-80gb.gpu.biaxial.dev``), which no node has (``--flood-kind
   size``: five whole GPUs on four-GPU nodes instead);
3. **probes**: right after the flood, an ordinary pod (a 1 GiB share of a GPU, which always
   fits) every ``--probe-interval`` seconds, ``--probes`` of them; each one's time from
   creation to binding is recorded;
4. **churn** meanwhile: every ``--churn-interval`` seconds a filler pod is deleted (the
   controller deallocates its claim: a GPU is freed) and another created.

Printed: per row, the first probe's time to binding (the pod created right after the flood),
the probes' p50 / p99 / max, how many decisions the controller made and how many API writes
it sent for pods it could not place (PodScheduled conditions and events), and the API
requests in all. A row without a flood is the reference. ``--seed`` fixes every random choice.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.processes import (
    DRIVER,
    child,
    controller_argv,
    free_port,
    scrape,
    seed_nodes,
    wait_ready,
)
from tests.emulator import Emulator, lookup

NAMESPACE = "bench"
A100_CLASS = "a100-80gb.gpu.biaxial.dev"
JSON = dict[str, Any]
POD_KIND = lookup("pods")
_REPORT_WRITES = {("pods/status", "PATCH"), ("events", "POST"), ("events", "PATCH")}


def claim(name: str, *, device_class: str = DRIVER, count: int = 1, memory: str = "") -> JSON:
    exactly: JSON = {"deviceClassName": device_class}
    if count != 1:
        exactly["count"] = count
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod(name: str, claim_name: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "biaxial",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }


@dataclass
class Row:
    flood: int
    first_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    unbound: int = 0
    decisions: dict[str, float] = field(default_factory=dict)
    report_writes: int = 0
    requests: float = 0.0
    reused: float = 0.0
    freed: int = 0


class Churn(threading.Thread):
    """Deletes one filler pod (and its claim) and creates another, every ``interval`` s."""

    def __init__(self, emulator: Emulator, fillers: list[str], interval: float, seed: int) -> None:
        super().__init__(name="churn", daemon=True)
        self.emulator = emulator
        self.fillers = fillers
        self.interval = interval
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.freed = 0
        self._serial = len(fillers)

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            bound = [n for n in self.fillers if _node_of(self.emulator, n)]
            if not bound:
                continue
            victim = self.rng.choice(bound)
            self.fillers.remove(victim)
            self.emulator.delete("pods", victim, NAMESPACE)
            self.emulator.delete("resourceclaims", victim, NAMESPACE)
            self.freed += 1
            name = f"fill-{self._serial}"
            self._serial += 1
            self.emulator.create(claim(name))
            self.emulator.create(pod(name, name))
            self.fillers.append(name)


def _node_of(emulator: Emulator, name: str) -> str:
    found = emulator.store.try_get(POD_KIND, NAMESPACE, name)
    return str(((found or {}).get("spec") or {}).get("nodeName") or "")


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def run_row(args: argparse.Namespace, flood: int) -> Row:
    row = Row(flood=flood)
    nodes = {f"t4-{i:03d}": "t4x4" for i in range(args.nodes)}
    with (
        tempfile.TemporaryDirectory(prefix="bxq") as tmp,
        Emulator(history_size=200_000, pod_graceful_deletion=False) as emulator,
    ):
        seed_nodes(emulator, nodes, namespaces=[NAMESPACE])
        kubeconfig = emulator.write_kubeconfig(Path(tmp) / "kubeconfig")
        fillers = [f"fill-{i}" for i in range(int(args.nodes * 4 * args.fill))]
        for name in fillers:
            emulator.create(claim(name))
            emulator.create(pod(name, name))
        port = free_port()
        argv = controller_argv(
            kubeconfig,
            port,
            "--no-leader-elect",
            "--qps",
            str(args.qps),
            "--burst",
            str(args.burst),
        )
        with child(argv, log=Path(tmp) / "controller.log"):
            wait_ready(port)
            _wait(
                lambda: all(_node_of(emulator, n) for n in fillers),
                120,
                "the filler pods were not all bound",
            )
            before = scrape(port)
            writes_before = _report_writes(emulator)
            for i in range(flood):
                name = f"flood-{i}"
                if args.flood_kind == "model":
                    emulator.create(claim(name, device_class=A100_CLASS))
                else:
                    emulator.create(claim(name, count=5))
                emulator.create(pod(name, name))
            churn = Churn(emulator, fillers, args.churn_interval, args.seed)
            churn.start()
            created: dict[str, float] = {}
            bound: dict[str, float] = {}
            watcher = threading.Thread(
                target=_watch_bindings, args=(emulator, created, bound), daemon=True
            )
            watcher.start()
            for i in range(args.probes):
                name = f"probe-{i}"
                emulator.create(claim(name, memory="1Gi"))
                created[name] = time.monotonic()
                emulator.create(pod(name, name))
                time.sleep(args.probe_interval)
            deadline = time.monotonic() + args.timeout
            while len(bound) < len(created) and time.monotonic() < deadline:
                time.sleep(0.05)
            churn.stop.set()
            churn.join()
            after = scrape(port)
        row.freed = churn.freed
        row.latencies = sorted(bound[n] - created[n] for n in bound)
        row.first_s = bound["probe-0"] - created["probe-0"] if "probe-0" in bound else float("inf")
        row.unbound = len(created) - len(bound)
        for result in ("scheduled", "unschedulable", "invalid", "error"):
            key = f'biaxial_controller_decisions_total{{result="{result}"}}'
            row.decisions[result] = after.get(key, 0.0) - before.get(key, 0.0)
        reused = "biaxial_controller_decisions_reused_total"
        row.reused = after.get(reused, 0.0) - before.get(reused, 0.0)
        row.requests = after.get("biaxial_controller_api_requests_total", 0.0) - before.get(
            "biaxial_controller_api_requests_total", 0.0
        )
        row.report_writes = _report_writes(emulator) - writes_before
    return row


def _report_writes(emulator: Emulator) -> int:
    """Writes the controller sent about pods it could not place: PodScheduled=False condition
    patches, and FailedScheduling events (each creation, and each count it added later)."""
    conditions = sum(
        1
        for r in list(emulator.requests)
        if r.user_agent.startswith("biaxial-controller")
        and (r.resource, r.method) == ("pods/status", "PATCH")
    )
    events = sum(1 for e in emulator.list("events") if e.get("reason") == "FailedScheduling")
    counted = sum(
        1
        for r in list(emulator.requests)
        if r.user_agent.startswith("biaxial-controller")
        and (r.resource, r.method) == ("events", "PATCH")
    )
    return conditions + events + counted


def _watch_bindings(emulator: Emulator, created: dict[str, float], bound: dict[str, float]) -> None:
    while True:
        for name in list(created):
            if name not in bound and _node_of(emulator, name):
                bound[name] = time.monotonic()
        time.sleep(0.005)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("inf")
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.queueing", description=__doc__)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--fill", type=float, default=0.75, help="share of GPUs taken whole")
    parser.add_argument("--flood", type=int, default=1000)
    parser.add_argument("--flood-kind", choices=("model", "size"), default="model")
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--probe-interval", type=float, default=0.5)
    parser.add_argument("--churn-interval", type=float, default=0.2)
    parser.add_argument("--qps", type=float, default=100.0)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    print(
        f"{args.nodes} nodes x 4 T4, {args.fill:.0%} taken whole, churn every "
        f"{args.churn_interval} s, flood: {args.flood_kind}, qps {args.qps:g} burst {args.burst}"
    )
    print(
        "| flood | first probe s | p50 s | p99 s | max s | unbound | decisions (sched/unsched/"
        "invalid) | reused | report writes | API requests | GPUs freed |"
    )
    print("|---:" * 11 + "|")
    for flood in (0, args.flood):
        row = run_row(args, flood)
        d = row.decisions
        print(
            f"| {row.flood} | {row.first_s:.2f} | {statistics.median(row.latencies or [0]):.2f} "
            f"| {_pct(row.latencies, 0.99):.2f} | {max(row.latencies or [0]):.2f} "
            f"| {row.unbound} | {d['scheduled']:.0f}/{d['unschedulable']:.0f}/{d['invalid']:.0f} "
            f"| {row.reused:.0f} | {row.report_writes} | {row.requests:.0f} | {row.freed} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

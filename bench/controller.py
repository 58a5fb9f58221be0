"""End-to-end controller benchmark: pods/s from creation to binding through the API emulator.

Three processes, as in a cluster: the API emulator (``python -m tests.emulator``), the
controller (``biaxial controller``, the real binary with the given ``--qps`` / ``--burst``),
and this driver. The driver

1. seeds a :mod:`bench.scenarios` cluster over HTTP (``--scenario uniform``: N nodes x 8
   A100-80GB, claims already holding 0-70 % of each node; ``mixed``: the realistic mixed
   cluster with its Deployments of every pod shape) with the ResourceSlices, DeviceClasses and
   the ResourceClaims of the pods to come; with ``--volumes wffc`` also a WaitForFirstConsumer
   StorageClass and a PersistentVolumeClaim per pod (the emulator then runs its storage
   stand-in, which provisions a PV where the claim's selected node is and binds it); not timed;
2. starts the controller and waits until ``/readyz`` answers (the controller builds its
   decision engine before it says ready): the time to ready is reported, and the CPU seconds
   the controller spent until then (what a loaded machine does not inflate); the project's
   modules are compiled to bytecode first, as in the image
   (:func:`bench.processes.compile_bytecode`), so start-up is measured as a cluster runs it;
3. creates the pods (``spec.schedulerName: biaxial``) as fast as the emulator takes them, while
   a watch records when each pod is bound, and waits until every pod is bound or nothing more
   was bound for a while;
4. prints one table: pods bound, wall time from the first creation to the last binding,
   pods/s, creation-to-binding latency p50/p99, the client QPS/burst the controller used,
   from the controller's metrics the decision-engine rebuilds, the mean decision time and the
   API requests the controller sent per bound pod (all of them, list/watch included), the
   controller's RSS once ready and at the end, and each process's CPU share (CPU seconds over
   wall seconds, so 1.0 is one core busy) during the pod phase — the process near 1.0 is the
   bottleneck; and, counted by the emulator, the API writes (create, update, patch, delete)
   the controller sent per bound pod, by verb and resource (``--volumes none`` and ``wffc``
   compared: what a pod's volume costs).

With ``--scrape-flood N``, N threads of this driver fetch the controller's ``/metrics`` back
to back for the whole pod phase (a misconfigured or hostile scraper); the table then also says
how many scrapes were served. Binding latency p90 with and without a flood shows what the
endpoints cost the scheduler (they are served off its event loop: docs/operations.md, "Health
and metrics"); the comparison is a benchmark, never a timed test.

With ``--profile FILE``, the controller runs under :mod:`cProfile` (on a CPU clock), switched on
once it is ready and off when the pod phase ends (SIGUSR1, SIGUSR2): ``FILE`` holds the pod
phase's profile alone (read it with ``python -m pstats FILE``); the CPU figures then include the
profiler's cost. With ``--profile-start FILE``, the start-up instead: from the process's start
until ``/readyz`` answers.

``python -m bench.controller --nodes 500 --pods 1000 --qps 1000 --burst 1000`` (the defaults)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.processes import (
    child,
    compile_bytecode,
    controller_argv,
    cpu_seconds,
    free_port,
    gather_bounded,
    scrape,
    strip,
    wait_ready,
)
from bench.scenarios import Scenario, generate, generate_mixed
from controller.api import (
    DEVICE_CLASSES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Endpoint,
    KubeApi,
    Resource,
)
from kubeapi.resources import STORAGE_CLASSES
from tests.emulator.volumes import DEFAULT_PROVISIONER

JSON = dict[str, Any]
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
STORAGE_CLASS = "bench-wffc"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
SEED_CONCURRENCY = 32
STALL_S = 30.0  # nothing bound for this long: the rest is unschedulable (or stuck)

# ``python -c`` prologue for --profile: the real ``python -m biaxial``, its profiler switched on
# by SIGUSR1 (or from the start when argv[2] is "start") and written to argv[1] by SIGUSR2. It
# counts CPU time, not wall time: on a loaded machine a send that wakes the API server is
# often preempted, and wall time would charge the wait to it.
_PROFILED = """
import cProfile, runpy, signal, sys, time
out = sys.argv.pop(1)
prof = cProfile.Profile(time.process_time)
if sys.argv.pop(1) == "start":
    prof.enable()
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
def _dump(*_):
    prof.disable()
    prof.dump_stats(out)
signal.signal(signal.SIGUSR2, _dump)
sys.argv[0] = "biaxial"
runpy.run_module("biaxial", run_name="__main__", alter_sys=True)
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _claim_name(pod: JSON) -> str:
    return f"{pod['metadata']['name']}-data"


async def _seed_volumes(api: KubeApi, scenario: Scenario) -> None:
    """A WaitForFirstConsumer class of the emulator's provisioner and a claim per pod."""
    await api.create(
        STORAGE_CLASSES,
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": DEFAULT_PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )

    async def claim(pod: JSON) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": _claim_name(pod), "namespace": pod["metadata"]["namespace"]},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": STORAGE_CLASS,
                "resources": {"requests": {"storage": "10Gi"}},
            },
        }
        await api.create(PERSISTENT_VOLUME_CLAIMS, body)

    await gather_bounded([lambda p=p: claim(p) for p, _ in scenario.pods], SEED_CONCURRENCY)


async def _seed(api: KubeApi, scenario: Scenario) -> None:
    claims = list(scenario.claims) + [c for _, cs in scenario.pods for c in cs]
    namespaces = {"bench"} | {c["metadata"]["namespace"] for c in claims}
    for namespace in sorted(namespaces):
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        await api.create(NAMESPACES, body)

    async def node(obj: JSON) -> None:
        created = await api.create(NODES, strip(obj))
        created["status"] = obj["status"]
        await api.replace(NODES, created, subresource="status")

    await gather_bounded([lambda o=o: node(o) for o in scenario.nodes], SEED_CONCURRENCY)
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in (await api.list(NODES)).items}

    async def resource_slice(obj: JSON) -> None:
        body = strip(obj)
        for owner in body["metadata"].get("ownerReferences") or []:
            owner["uid"] = uids[owner["name"]]
        await api.create(RESOURCE_SLICES, body)

    await gather_bounded([lambda o=o: resource_slice(o) for o in scenario.slices], SEED_CONCURRENCY)
    for dc in scenario.classes:
        await api.create(DEVICE_CLASSES, strip(dc))

    async def claim(obj: JSON) -> None:
        created = await api.create(RESOURCE_CLAIMS, strip(obj))
        if obj.get("status"):
            created["status"] = obj["status"]
            await api.replace(RESOURCE_CLAIMS, created, subresource="status")

    await gather_bounded([lambda o=o: claim(o) for o in claims], SEED_CONCURRENCY)


async def _drive(
    api: KubeApi, scenario: Scenario, timeout_s: float, volumes: bool
) -> tuple[float, list[float], int]:
    """Create the pods and wait for their bindings; (wall seconds, latencies, bound)."""
    listed = await api.list(PODS)
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    total = len(scenario.pods)
    done = asyncio.Event()

    refused: set[str] = set()  # reported unschedulable (PodScheduled=False)

    async def watch() -> None:
        async for event in api.watch(PODS, resource_version=listed.resource_version, timeout_s=600):
            obj = event.object
            name = (obj.get("metadata") or {}).get("name")
            if not name:
                continue
            if (obj.get("spec") or {}).get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
                refused.discard(name)
            elif any(
                c.get("type") == "PodScheduled" and c.get("status") == "False"
                for c in (obj.get("status") or {}).get("conditions") or ()
            ):
                refused.add(name)
            if len(bound) + len(refused) == total:
                done.set()
                return

    watcher = asyncio.create_task(watch())
    started = time.monotonic()

    async def create(pod: JSON) -> None:
        body = strip(pod)
        body["spec"] = {**body["spec"], "schedulerName": "biaxial"}
        if volumes:
            mount = {"name": "data", "persistentVolumeClaim": {"claimName": _claim_name(pod)}}
            body["spec"]["volumes"] = [*(body["spec"].get("volumes") or ()), mount]
        created[body["metadata"]["name"]] = time.monotonic()
        await api.create(PODS, body)

    await gather_bounded([lambda p=p: create(p) for p, _ in scenario.pods], 16)
    deadline = time.monotonic() + timeout_s
    while not done.is_set() and time.monotonic() < deadline:
        progress = len(bound)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STALL_S):
                await done.wait()
        if len(bound) == progress:
            break  # nothing bound for STALL_S: the rest is unschedulable (or stuck)
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    last = max(bound.values(), default=started)
    latencies = [bound[n] - created[n] for n in bound]
    for pod, _ in scenario.pods:
        name = pod["metadata"]["name"]
        if name not in bound:
            live = await api.get(PODS, name, "bench")
            conditions = (live.get("status") or {}).get("conditions") or []
            print(f"not bound: {name}: {[c.get('message') for c in conditions]}", file=sys.stderr)
    return last - started, latencies, len(bound)


async def _run_async(
    url: str, scenario: Scenario, timeout_s: float, phase: str, volumes: bool
) -> Any:
    endpoint = Endpoint(host=url, headers={}, ssl_context=None)
    async with KubeApi(
        endpoint, qps=5000, burst=5000, request_timeout_s=120, user_agent="biaxial-bench"
    ) as api:
        if phase == "seed":
            await _seed(api, scenario)
            if volumes:
                await _seed_volumes(api, scenario)
            return None
        return await _drive(api, scenario, timeout_s, volumes)


def run(
    nodes: int,
    pods: int,
    qps: float,
    burst: int,
    writes: int,
    *,
    scenario_name: str = "uniform",
    volumes: bool = False,
    scrape_flood: int = 0,
    profile: Path | None = None,
    profile_start: Path | None = None,
) -> dict[str, Any]:
    if scenario_name == "uniform":
        scenario = generate(nodes, pods)
    else:
        scenario = generate_mixed(nodes, pods, variant=scenario_name)
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        emulator_argv = [
            sys.executable,
            "-m",
            "tests.emulator",
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
            "--history-size",
            "200000",
            "--request-counts",
            str(counts_file := Path(tmp) / "requests.json"),
            *(["--volume-controller"] if volumes else []),
        ]
        with child(emulator_argv, wait_for="listening on") as (line, emulator):
            url = line.split("listening on", 1)[1].strip()
            seeded = time.monotonic()
            asyncio.run(_run_async(url, scenario, 0, "seed", volumes))
            seed_s = time.monotonic() - seeded
            port = free_port()
            argv = controller_argv(
                kubeconfig,
                port,
                "--no-leader-elect",
                "--qps",
                str(qps),
                "--burst",
                str(burst),
                "--max-concurrent-writes",
                str(writes),
            )
            if profile is not None or profile_start is not None:
                out, when = (profile, "pods") if profile is not None else (profile_start, "start")
                assert out is not None
                argv[1:3] = ["-c", _PROFILED, str(out.resolve()), when]
            compile_bytecode()
            with child(argv) as (_, controller):
                ready_s = wait_ready(port, timeout=600.0)
                if profile_start is not None:
                    os.kill(controller.pid, signal.SIGUSR2)
                ready_rss = _rss_mb(controller.pid)
                ready_cpu = cpu_seconds(controller.pid)
                cpu = {p: cpu_seconds(proc.pid) for p, proc in (("e", emulator), ("c", controller))}
                driver_cpu = time.process_time()
                if profile is not None:
                    os.kill(controller.pid, signal.SIGUSR1)
                phase_started = time.monotonic()
                with _ScrapeFlood(port, scrape_flood) as flood:
                    wall, latencies, bound = asyncio.run(
                        _run_async(url, scenario, 1800, "drive", volumes)
                    )
                phase = time.monotonic() - phase_started
                if profile is not None:
                    os.kill(controller.pid, signal.SIGUSR2)
                spent = {
                    "emulator": cpu_seconds(emulator.pid) - cpu["e"],
                    "controller": cpu_seconds(controller.pid) - cpu["c"],
                }
                shares = {
                    "emulator": (cpu_seconds(emulator.pid) - cpu["e"]) / phase,
                    "controller": (cpu_seconds(controller.pid) - cpu["c"]) / phase,
                    "driver": (time.process_time() - driver_cpu) / phase,
                }
                end_rss = _rss_mb(controller.pid)
                metrics = scrape(port)
        served = json.loads(counts_file.read_text())
    controller_writes: dict[str, int] = {}
    for agent, per_key in served.items():
        if not agent.startswith("biaxial-controller"):  # "biaxial-controller (identity)"
            continue
        for key, count in per_key.items():
            if key.split(" ", 1)[0] in WRITE_VERBS:
                controller_writes[key] = controller_writes.get(key, 0) + count
    latencies.sort()
    return {
        "scenario": scenario_name,
        "volumes": "wffc" if volumes else "none",
        "writes_per_pod": sum(controller_writes.values()) / max(1, bound),
        "writes_by_kind": {k: v / max(1, bound) for k, v in sorted(controller_writes.items())},
        "nodes": nodes,
        "gpus": sum(len((s.get("spec") or {}).get("devices") or ()) for s in scenario.slices),
        "pods": pods,
        "bound": bound,
        "seconds": wall,
        "pods_per_s": bound / wall if wall > 0 else 0.0,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else 0.0,
        "p90_ms": 1000 * latencies[int(0.90 * (len(latencies) - 1))] if latencies else 0.0,
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0,
        "scrape_flood": scrape_flood,
        "scrapes": flood.served,
        "qps": qps,
        "burst": burst,
        "writes": writes,
        "seed_s": seed_s,
        "ready_s": ready_s,
        "ready_rss_mb": ready_rss,
        "ready_cpu_s": ready_cpu,
        "end_rss_mb": end_rss,
        "cpu": shares,
        "cpu_ms_per_pod": {k: 1000 * v / max(1, bound) for k, v in spent.items()},
        "rebuilds": int(metrics.get("biaxial_controller_engine_rebuild_seconds_count", 0)),
        "rebuild_ms": 1000
        * metrics.get("biaxial_controller_engine_rebuild_seconds_sum", 0.0)
        / max(1.0, metrics.get("biaxial_controller_engine_rebuild_seconds_count", 0.0)),
        "requests_per_pod": metrics.get("biaxial_controller_api_requests_total", 0.0)
        / max(1, bound),
        "decision_ms": 1000
        * metrics.get("biaxial_controller_decision_seconds_sum", 0.0)
        / max(1.0, metrics.get("biaxial_controller_decision_seconds_count", 0.0)),
    }


class _ScrapeFlood:
    """``threads`` threads fetching ``/metrics`` back to back until the block ends."""

    def __init__(self, port: int, threads: int) -> None:
        self._url = f"http://127.0.0.1:{port}/metrics"
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._scrape, daemon=True) for _ in range(threads)]
        self._lock = threading.Lock()
        self.served = 0

    def _scrape(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self._url, timeout=5) as resp:  # noqa: S310
                    resp.read()
                with self._lock:
                    self.served += 1

    def __enter__(self) -> _ScrapeFlood:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controller", description=__doc__)
    parser.add_argument("--scenario", choices=("uniform", "mixed"), default="uniform")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--qps", type=float, default=1000.0)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--max-concurrent-writes", type=int, default=32)
    parser.add_argument(
        "--volumes",
        choices=("none", "wffc"),
        default="none",
        help="wffc: every pod mounts its own WaitForFirstConsumer PersistentVolumeClaim",
    )
    parser.add_argument(
        "--scrape-flood",
        type=int,
        default=0,
        metavar="N",
        help="N threads fetch /metrics back to back during the pod phase",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="profile the controller during the pod phase (cProfile) into FILE",
    )
    parser.add_argument(
        "--profile-start",
        type=Path,
        metavar="FILE",
        help="profile the controller from its start until /readyz answers into FILE",
    )
    args = parser.parse_args(argv)
    row = run(
        args.nodes,
        args.pods,
        args.qps,
        args.burst,
        args.max_concurrent_writes,
        scenario_name=args.scenario,
        volumes=args.volumes == "wffc",
        scrape_flood=args.scrape_flood,
        profile=args.profile,
        profile_start=args.profile_start,
    )
    cpu = row["cpu"]
    print(
        "| scenario | volumes | nodes | GPUs | pods | bound | seconds | pods/s | p50 ms | p90 ms "
        "| p99 ms | scrape threads | scrapes "
        "| qps | burst | writes | ready s | ready CPU s | RSS ready MB | RSS end MB | rebuilds "
        "| decision ms | requests/pod | API writes/pod | CPU emulator | CPU controller "
        "| CPU driver | controller CPU ms/pod | emulator CPU ms/pod |"
    )
    print("|---|---" + "|---:" * 27 + "|")
    print(
        f"| {row['scenario']} | {row['volumes']} | {row['nodes']} | {row['gpus']} | {row['pods']} "
        f"| {row['bound']} "
        f"| {row['seconds']:.2f} | {row['pods_per_s']:.1f} | {row['p50_ms']:.0f} "
        f"| {row['p90_ms']:.0f} | {row['p99_ms']:.0f} | {row['scrape_flood']} | {row['scrapes']} "
        f"| {row['qps']:.0f} | {row['burst']} | {row['writes']} "
        f"| {row['ready_s']:.1f} | {row['ready_cpu_s']:.1f} | {row['ready_rss_mb']:.0f} "
        f"| {row['end_rss_mb']:.0f} "
        f"| {row['rebuilds']} | {row['decision_ms']:.2f} | {row['requests_per_pod']:.1f} "
        f"| {row['writes_per_pod']:.2f} "
        f"| {cpu['emulator']:.2f} | {cpu['controller']:.2f} | {cpu['driver']:.2f} "
        f"| {row['cpu_ms_per_pod']['controller']:.2f} | {row['cpu_ms_per_pod']['emulator']:.2f} |"
    )
    print()
    print("| controller's API writes per bound pod | count |")
    print("|---|---:|")
    for key, per_pod in row["writes_by_kind"].items():
        print(f"| {key} | {per_pod:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

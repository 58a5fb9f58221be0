"""End-to-end controller benchmark: pods/s from creation to binding through the API emulator.

Three processes, as in a cluster: the API emulator (``python -m tests.emulator``), the
controller (``biaxial controller``, the real binary with the given ``--qps`` / ``--burst``),
and this driver. The driver

1. seeds a :mod:`bench.scenarios` cluster over HTTP (N nodes x 8 A100-80GB with their
   ResourceSlices, the DeviceClasses, claims already holding 0-70 % of each node, and the
   ResourceClaims of the pods to come); not timed;
2. starts the controller and waits until ``/readyz`` answers;
3. creates the pods (``spec.schedulerName: biaxial``) as fast as the emulator takes them, while
   a watch records when each pod is bound;
4. prints one table: pods bound, wall time from the first creation to the last binding,
   pods/s, creation-to-binding latency p50/p99, the client QPS/burst the controller used, and
   from the controller's metrics: decision-engine rebuilds (count, mean ms), the mean
   decision time, and the API requests the controller sent per bound pod (all of them,
   list/watch included).

``python -m bench.controller --nodes 500 --pods 1000 --qps 1000 --burst 1000`` (the defaults)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.processes import (
    child,
    controller_argv,
    free_port,
    gather_bounded,
    scrape,
    strip,
    wait_ready,
)
from bench.scenarios import Scenario, generate
from controller.api import (
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Endpoint,
    KubeApi,
    Resource,
)

JSON = dict[str, Any]
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
SEED_CONCURRENCY = 32
STALL_S = 10.0


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
    api: KubeApi, scenario: Scenario, timeout_s: float
) -> tuple[float, list[float], int]:
    """Create the pods and wait for their bindings; (wall seconds, latencies, bound)."""
    listed = await api.list(PODS)
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    total = len(scenario.pods)
    done = asyncio.Event()

    async def watch() -> None:
        async for event in api.watch(PODS, resource_version=listed.resource_version, timeout_s=600):
            obj = event.object
            name = (obj.get("metadata") or {}).get("name")
            if name and (obj.get("spec") or {}).get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
                if len(bound) == total:
                    done.set()
                    return

    watcher = asyncio.create_task(watch())
    started = time.monotonic()

    async def create(pod: JSON) -> None:
        body = strip(pod)
        body["spec"] = {**body["spec"], "schedulerName": "biaxial"}
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


async def _run_async(url: str, scenario: Scenario, timeout_s: float, phase: str) -> Any:
    endpoint = Endpoint(host=url, headers={}, ssl_context=None)
    async with KubeApi(endpoint, qps=5000, burst=5000, request_timeout_s=120) as api:
        if phase == "seed":
            await _seed(api, scenario)
            return None
        return await _drive(api, scenario, timeout_s)


def _read_url(kubeconfig: Path) -> str:
    """The server the emulator's kubeconfig points at (written before it says it listens)."""
    return str(json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])


def run(nodes: int, pods: int, qps: float, burst: int, writes: int) -> dict[str, Any]:
    scenario = generate(nodes, pods)
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
        ]
        with child(emulator_argv, wait_for="listening on"):
            url = _read_url(kubeconfig)
            seeded = time.monotonic()
            asyncio.run(_run_async(url, scenario, 0, "seed"))
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
            with child(argv):
                ready_s = wait_ready(port)
                wall, latencies, bound = asyncio.run(_run_async(url, scenario, 300, "drive"))
                metrics = scrape(port)
    latencies.sort()
    return {
        "nodes": nodes,
        "gpus": nodes * 8,
        "pods": pods,
        "bound": bound,
        "seconds": wall,
        "pods_per_s": bound / wall if wall > 0 else 0.0,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else 0.0,
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0,
        "qps": qps,
        "burst": burst,
        "writes": writes,
        "seed_s": seed_s,
        "ready_s": ready_s,
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.controller", description=__doc__)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--qps", type=float, default=1000.0)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--max-concurrent-writes", type=int, default=32)
    args = parser.parse_args(argv)
    row = run(args.nodes, args.pods, args.qps, args.burst, args.max_concurrent_writes)
    print(
        "| nodes | GPUs | pods | bound | seconds | pods/s | p50 ms | p99 ms | qps | burst "
        "| writes | seed s | ready s | rebuilds | rebuild ms | decision ms | requests/pod |"
    )
    print("|---:" * 17 + "|")
    print(
        f"| {row['nodes']} | {row['gpus']} | {row['pods']} | {row['bound']} "
        f"| {row['seconds']:.2f} | {row['pods_per_s']:.1f} | {row['p50_ms']:.0f} "
        f"| {row['p99_ms']:.0f} | {row['qps']:.0f} | {row['burst']} | {row['writes']} "
        f"| {row['seed_s']:.1f} | {row['ready_s']:.1f} | {row['rebuilds']} "
        f"| {row['rebuild_ms']:.0f} | {row['decision_ms']:.2f} | {row['requests_per_pod']:.1f} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

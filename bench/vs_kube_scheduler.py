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
  number of devices.

Metrics per run: bound pods per second (the count sampled once a second from the watch:
average over the run, p50/p90/p99 of the per-second samples, as scheduler_perf's throughput
collector), created-to-bound latency p50/p99 (creation timed when this driver sends the POST),
API requests per bound pod during the pod phase **from the scheduler's own client metrics**
(kube-scheduler's ``rest_client_requests_total``, biaxial's
``biaxial_controller_api_requests_total``; the API server's ``apiserver_request_total`` has no
user agent), the scheduler process's CPU seconds during the pod phase and peak RSS (VmHWM) from
``/proc``, and the 1-minute load average sampled during the run.

``python -m bench.vs_kube_scheduler --nodes 500 --pods 5000 --qps 5000/5000`` (the defaults).
Loopback only; every process is stopped when the run ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from bench.processes import (
    child,
    controller_argv,
    cpu_seconds,
    free_port,
    gather_bounded,
    peak_rss_mib,
    scrape,
    wait_ready,
)
from bench.report import percentile, table_lines
from kubeapi.client import Client
from kubeapi.endpoint import Endpoint
from kubeapi.resources import (
    DEVICE_CLASSES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_SLICES,
    Resource,
)
from kubeapi.serving import RENDER_TTL_S
from tests.cluster.build import release
from tests.cluster.controlplane import ControlPlane

JSON = dict[str, Any]
Scheduler = Literal["kube-scheduler", "biaxial"]
SCHEDULERS: Final[tuple[Scheduler, ...]] = ("kube-scheduler", "biaxial")
SCHEDULER_NAME: Final[dict[Scheduler, str]] = {
    "kube-scheduler": "default-scheduler",
    "biaxial": "biaxial",
}
TEMPLATES: Final = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True
)
DRIVER: Final = "test-driver.cdi.k8s.io"
CLASS: Final = "test-class"
NAMESPACE: Final = "bench"
DEVICES_PER_NODE: Final = 10
APISERVER_ARGS: Final = (
    "--enable-priority-and-fairness=false",
    "--max-requests-inflight=0",
    "--max-mutating-requests-inflight=0",
)
CREATE_CONCURRENCY: Final = 32
STALL_S: Final = 30.0  # nothing bound for this long: the rest is unschedulable (or stuck)
WORKLOADS: Final = ("claim-template", "match-attribute")


# --------------------------------------------------------------------------- inventory


@dataclass(frozen=True, slots=True)
class Inventory:
    """What one run starts from: cluster-scoped objects, the template, the pods to create."""

    workload: str
    nodes: list[JSON]
    slices: list[JSON]
    classes: list[JSON]
    templates: list[JSON]
    pods: list[JSON]


def _node(name: str) -> JSON:
    allocatable = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _simple_slice(node: str) -> JSON:
    """One pool per node of ``DEVICES_PER_NODE`` plain devices, paired by ``group``."""
    devices = [
        {"name": f"device-{i}", "attributes": {f"{DRIVER}/group": {"int": i // 2}}}
        for i in range(DEVICES_PER_NODE)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _pod(name: str, template: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {
                    "name": "pause",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "devices"}]},
                }
            ],
            "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
        },
    }


def upstream_shape(workload: str, nodes: int, pods: int) -> Inventory:
    """scheduler_perf's DRA shape; ``match-attribute`` asks for a pair per pod (half the pods)."""
    names = [f"node-{i:05d}" for i in range(nodes)]
    request: JSON = {"name": "devices", "exactly": {"deviceClassName": CLASS}}
    spec: JSON = {"requests": [request]}
    if workload == "match-attribute":
        request["exactly"]["count"] = 2
        spec["constraints"] = [{"requests": ["devices"], "matchAttribute": f"{DRIVER}/group"}]
        pods //= 2
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "claim-template", "namespace": NAMESPACE},
        "spec": {"spec": {"devices": spec}},
    }
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }
    return Inventory(
        workload=workload,
        nodes=[_node(n) for n in names],
        slices=[_simple_slice(n) for n in names],
        classes=[device_class],
        templates=[template],
        pods=[_pod(f"pod-{i:05d}", "claim-template") for i in range(pods)],
    )


# --------------------------------------------------------------------------- one run


class _Api(Client):
    default_user_agent = "biaxial-bench-driver"


async def _seed(api: _Api, inventory: Inventory) -> None:
    await api.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )

    async def node(obj: JSON) -> None:
        # the TaintNodesByCondition admission gives a new Node the not-ready taint, which the
        # node lifecycle controller (not running here) would lift once the node is Ready
        created = await api.create(NODES, obj)
        created["status"] = obj["status"]
        ready = await api.replace(NODES, created, subresource="status")
        ready["spec"]["taints"] = []
        await api.replace(NODES, ready)

    await gather_bounded([lambda o=o: node(o) for o in inventory.nodes], CREATE_CONCURRENCY)
    await gather_bounded(
        [lambda o=o: api.create(RESOURCE_SLICES, o) for o in inventory.slices], CREATE_CONCURRENCY
    )
    for obj in inventory.classes:
        await api.create(DEVICE_CLASSES, obj)
    for obj in inventory.templates:
        await api.create(TEMPLATES, obj)


@dataclass
class _Watched:
    created: dict[str, float]
    bound: dict[str, float]
    samples: list[int]  # pods bound in each one-second interval
    loads: list[float]  # 1-minute load average, once a second
    started: float
    finished: float


async def _drive(
    api: _Api, inventory: Inventory, scheduler_name: str, timeout_s: float
) -> _Watched:
    """Create the pods in a burst and watch them until every one is bound (or none for
    ``STALL_S``)."""
    listed = await api.list(PODS)
    created: dict[str, float] = {}
    bound: dict[str, float] = {}
    total = len(inventory.pods)
    done = asyncio.Event()

    async def watch() -> None:
        async for event in api.watch(
            PODS, resource_version=listed.resource_version, timeout_s=3600
        ):
            obj = event.object
            name = (obj.get("metadata") or {}).get("name")
            if name and (obj.get("spec") or {}).get("nodeName") and name not in bound:
                bound[name] = time.monotonic()
                if len(bound) == total:
                    done.set()
                    return

    samples: list[int] = []
    loads: list[float] = []

    async def sample() -> None:
        last = 0
        while True:
            await asyncio.sleep(1.0)
            now = len(bound)
            samples.append(now - last)
            loads.append(os.getloadavg()[0])
            last = now

    watcher = asyncio.create_task(watch())
    sampler = asyncio.create_task(sample())
    started = time.monotonic()

    async def create(pod: JSON) -> None:
        body = {**pod, "spec": {**pod["spec"], "schedulerName": scheduler_name}}
        created[pod["metadata"]["name"]] = time.monotonic()
        await api.create(PODS, body)

    await gather_bounded([lambda p=p: create(p) for p in inventory.pods], CREATE_CONCURRENCY)
    deadline = time.monotonic() + timeout_s
    while not done.is_set() and time.monotonic() < deadline:
        progress = len(bound)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STALL_S):
                await done.wait()
        if len(bound) == progress:
            break
    sampler.cancel()
    watcher.cancel()
    await asyncio.gather(watcher, sampler, return_exceptions=True)
    finished = max(bound.values(), default=started)
    return _Watched(created, bound, samples, loads, started, finished)


def _kube_scheduler_requests(plane: ControlPlane, port: int) -> float:
    """The sum of kube-scheduler's ``rest_client_requests_total`` (every request its client
    sent, any verb and code)."""
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}/metrics",
        headers={"Authorization": f"Bearer {plane.admin_token}"},
    )
    context: ssl.SSLContext = plane.ssl_context()
    with urllib.request.urlopen(req, context=context, timeout=10) as resp:  # noqa: S310
        text = resp.read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("rest_client_requests_total{")
    )


@dataclass
class _Running:
    """A started scheduler: its pid and how to read its client's request count."""

    pid: int
    requests: Callable[[], float]


@contextlib.contextmanager
def _scheduler(
    plane: ControlPlane, which: Scheduler, qps: int, burst: int, log: Path
) -> Iterator[_Running]:
    if which == "kube-scheduler":
        proc = plane.start_scheduler(qps=qps, burst=burst)
        flag = "--secure-port="
        args = [str(a) for a in proc.popen.args]  # type: ignore[union-attr]  # a list here
        port = next(int(a.removeprefix(flag)) for a in args if a.startswith(flag))
        try:
            yield _Running(proc.popen.pid, lambda: _kube_scheduler_requests(plane, port))
        finally:
            proc.stop()
        return
    port = free_port()
    argv = controller_argv(
        plane.kubeconfig(), port, "--no-leader-elect", "--qps", str(qps), "--burst", str(burst)
    )
    with child(argv, log=log) as (_, controller):
        wait_ready(port, timeout=300.0)
        yield _Running(
            controller.pid, lambda: scrape(port).get("biaxial_controller_api_requests_total", 0.0)
        )


def run_one(inventory: Inventory, which: Scheduler, qps: int, burst: int) -> JSON:
    """One workload, one scheduler, on a fresh control plane."""
    plane = ControlPlane(release(), audit=False)
    try:
        plane.start(extra_apiserver_args=APISERVER_ARGS)
        endpoint = Endpoint.resolve(plane.kubeconfig())

        async def seed() -> None:
            async with _Api(endpoint, request_timeout_s=120) as api:
                await _seed(api, inventory)

        asyncio.run(seed())
        with _scheduler(plane, which, qps, burst, plane.root / "biaxial.log") as running:
            cpu0 = cpu_seconds(running.pid)
            requests0 = running.requests()

            async def drive() -> _Watched:
                async with _Api(endpoint, request_timeout_s=120) as api:
                    return await _drive(api, inventory, SCHEDULER_NAME[which], 1800)

            watched = asyncio.run(drive())
            cpu = cpu_seconds(running.pid) - cpu0
            time.sleep(RENDER_TTL_S + 0.1)  # biaxial's /metrics is rendered at most once a second
            requests = running.requests() - requests0
            rss = peak_rss_mib(running.pid)
    finally:
        plane.stop()
    return _row(
        inventory,
        which=which,
        qps=qps,
        burst=burst,
        watched=watched,
        cpu=cpu,
        requests=requests,
        rss=rss,
    )


def _row(
    inventory: Inventory,
    *,
    which: Scheduler,
    qps: int,
    burst: int,
    watched: _Watched,
    cpu: float,
    requests: float,
    rss: float,
) -> JSON:
    bound = len(watched.bound)
    wall = watched.finished - watched.started
    latencies = sorted(watched.bound[n] - watched.created[n] for n in watched.bound)
    # the samples up to the last binding (the trailing idle seconds are not throughput)
    samples = watched.samples[: max(1, int(wall) + 1)] or [0]
    return {
        "workload": inventory.workload,
        "nodes": len(inventory.nodes),
        "scheduler": which,
        "pods": len(inventory.pods),
        "bound": bound,
        "seconds": wall,
        "pods_per_s": bound / wall if wall > 0 else 0.0,
        "pods_per_s_p50": float(percentile(samples, 0.50)),
        "pods_per_s_p90": float(percentile(samples, 0.90)),
        "pods_per_s_p99": float(percentile(samples, 0.99)),
        "p50_ms": 1000 * statistics.median(latencies) if latencies else 0.0,
        "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else 0.0,
        "requests_per_pod": requests / max(1, bound),
        "cpu_s": cpu,
        "cpu_s_per_pod": cpu / max(1, bound),
        "rss_mb": rss,
        "load_avg": statistics.mean(watched.loads) if watched.loads else os.getloadavg()[0],
        "qps": qps,
        "burst": burst,
    }


# --------------------------------------------------------------------------- output


_ROWS: Final[tuple[tuple[str, Callable[[JSON], str]], ...]] = (
    ("pods bound", lambda r: f"{r['bound']}/{r['pods']}"),
    ("seconds", lambda r: f"{r['seconds']:.1f}"),
    ("pods/s average", lambda r: f"{r['pods_per_s']:.1f}"),
    (
        "pods/s p50 / p90 / p99",
        lambda r: (
            f"{r['pods_per_s_p50']:.0f} / {r['pods_per_s_p90']:.0f} / {r['pods_per_s_p99']:.0f}"
        ),
    ),
    ("created->bound p50 ms", lambda r: f"{r['p50_ms']:.0f}"),
    ("created->bound p99 ms", lambda r: f"{r['p99_ms']:.0f}"),
    ("API requests / bound pod", lambda r: f"{r['requests_per_pod']:.2f}"),
    ("scheduler CPU s", lambda r: f"{r['cpu_s']:.1f}"),
    ("scheduler CPU ms / pod", lambda r: f"{1000 * r['cpu_s_per_pod']:.1f}"),
    ("scheduler peak RSS MB", lambda r: f"{r['rss_mb']:.0f}"),
    ("load average (1 min)", lambda r: f"{r['load_avg']:.2f}"),
)


def tables(runs: Sequence[JSON]) -> list[str]:
    """One table per workload: a metric per row, a column per (scheduler, client QPS)."""
    out: list[str] = []
    for workload in dict.fromkeys(r["workload"] for r in runs):
        mine = [r for r in runs if r["workload"] == workload]
        first = mine[0]
        out.append(
            f"{workload}: {first['nodes']} nodes x {DEVICES_PER_NODE} devices, {first['pods']} pods"
        )
        headers = ["", *(f"{r['scheduler']} @{r['qps']}/{r['burst']}" for r in mine)]
        body = [[label, *(fmt(r) for r in mine)] for label, fmt in _ROWS]
        out.extend(table_lines(headers, body))
        out.append("")
    return out


def _qps_pair(text: str) -> tuple[int, int]:
    qps, _, burst = text.partition("/")
    return int(qps), int(burst or qps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vs_kube_scheduler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument(
        "--workloads", default="claim-template", help=f"comma separated, of: {', '.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--qps",
        default="5000/5000",
        help="client QPS/BURST of both schedulers; comma separated for several runs",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="FILE")
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(unknown)}")
    limits = [_qps_pair(q) for q in args.qps.split(",") if q]
    runs: list[JSON] = []
    for workload in workloads:
        inventory = upstream_shape(workload, args.nodes, args.pods)
        for qps, burst in limits:
            for which in SCHEDULERS:
                print(
                    f"running {workload} with {which} at {qps}/{burst} ...",
                    file=sys.stderr,
                    flush=True,
                )
                runs.append(run_one(inventory, which, qps, burst))
    print("\n".join(tables(runs)))
    if args.json is not None:
        args.json.write_text(
            json.dumps({"runs": runs, "upstream_scheduler_perf": []}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

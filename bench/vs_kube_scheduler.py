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
* ``churn``: placement quality under churn. N nodes x 8 A100-80GB from the project's slice
  builder (every GPU shareable by ``memory``, consumable capacity), a deterministic stream of
  ``--pods`` arrivals in 5 rounds (3 in 4 a share of 10/20/40 GiB, 1 in 4 a whole GPU); after
  each round 40 % of the pods alive leave (deleted at once) and the run waits until their
  claims are gone; then a wave of N/4 8-GPU and 2N 1-GPU training pods. Reported besides the
  rest: whole GPUs free before the wave (held by no claim, whole or share), training pods
  placed, pods left pending. kube-scheduler allocates first fit; biaxial with its defaults
  (node and GPU binpack). Its seconds include the waits between rounds, so its pods/s is not a
  throughput figure.

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
import dataclasses
import json
import os
import random
import ssl
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import aiohttp

from bench.processes import (
    ROOT,
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
from biaxial.simulate.manifests import load_objects
from driver.api.errors import ApiError
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from kubeapi.client import Client
from kubeapi.endpoint import Endpoint
from kubeapi.resources import (
    DEVICE_CLASSES,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
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
WORKLOADS: Final = ("claim-template", "match-attribute", "churn")
GPU_PROFILE: Final = "a100-80gbx8"
GPU_CLASS: Final = "gpu.biaxial.dev"
SHARES_GIB: Final = (10, 20, 40)
CHURN_ROUNDS: Final = 5
CHURN_DEPARTURES: Final = 0.4  # of the pods alive, after each round
CHURN_STALL_S: Final = 5.0


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
    churn: Churn | None = None


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
    if workload == "match-attribute":
        pair = {"requests": ["devices"], "matchAttribute": f"{DRIVER}/group"}
        template = _template("claim-template", CLASS, {"count": 2}, [pair])
        pods //= 2
    else:
        template = _template("claim-template", CLASS, {})
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


@dataclass(frozen=True, slots=True)
class Churn:
    """The churn workload's schedule: rounds of (arrivals, departures), then the wave."""

    rounds: list[tuple[list[JSON], list[str]]]
    wave: list[JSON]
    gpus: int


def _gpu_pod(name: str, template: str) -> JSON:
    pod = _pod(name, template)
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m", "memory": "256Mi"}
    return pod


def churn_shape(nodes: int, pods: int, *, seed: int = 24) -> Inventory:
    """A shared-GPU cluster (``nodes`` x 8 A100-80GB from the project's slice builder, every
    GPU shareable by memory), ``pods`` arrivals in ``CHURN_ROUNDS`` rounds (3 in 4 a share of
    10, 20 or 40 GiB, 1 in 4 a whole GPU), after each round ``CHURN_DEPARTURES`` of the pods
    alive leave; then the wave: ``nodes // 4`` 8-GPU and ``2 * nodes`` 1-GPU training pods."""
    rng = random.Random(seed)
    with open_backend(fake=GPU_PROFILE, node_name="template") as backend:
        template = backend.discover()
    names = [f"node-{i:05d}" for i in range(nodes)]
    slices: list[JSON] = []
    for name in names:
        gpus = [dataclasses.replace(g, uuid=f"GPU-{name}-{g.index}") for g in template]
        slices.extend(built.to_api() for built in build_slices(gpus, node_name=name))
    templates = [
        _template(f"share-{gib}", GPU_CLASS, {"capacity": {"requests": {"memory": f"{gib}Gi"}}})
        for gib in SHARES_GIB
    ] + [_template("whole-1", GPU_CLASS, {}), _template("train-8", GPU_CLASS, {"count": 8})]
    rounds: list[tuple[list[JSON], list[str]]] = []
    alive: list[str] = []
    per_round = max(1, pods // CHURN_ROUNDS)
    for r in range(CHURN_ROUNDS):
        arrivals = []
        for i in range(per_round):
            name = f"job-{r}-{i:05d}"
            shape = f"share-{rng.choice(SHARES_GIB)}" if rng.random() < 0.75 else "whole-1"
            arrivals.append(_gpu_pod(name, shape))
        alive += [p["metadata"]["name"] for p in arrivals]
        leaving = sorted(rng.sample(alive, int(CHURN_DEPARTURES * len(alive))))
        alive = [n for n in alive if n not in set(leaving)]
        rounds.append((arrivals, leaving))
    wave = [_gpu_pod(f"train8-{i:05d}", "train-8") for i in range(nodes // 4)]
    wave += [_gpu_pod(f"train1-{i:05d}", "whole-1") for i in range(2 * nodes)]
    return Inventory(
        workload="churn",
        nodes=[_node(n) for n in names],
        slices=slices,
        classes=load_objects([str(ROOT / "deviceclasses" / "gpu.biaxial.dev.yaml")]),
        templates=templates,
        pods=[p for arrivals, _ in rounds for p in arrivals] + wave,
        churn=Churn(rounds=rounds, wave=wave, gpus=nodes * len(template)),
    )


def _template(
    name: str, device_class: str, exactly: JSON, constraints: Sequence[JSON] = ()
) -> JSON:
    """A ResourceClaimTemplate of one request ``devices`` (``exactly``, of ``device_class``)."""
    devices: JSON = {
        "requests": [{"name": "devices", "exactly": {"deviceClassName": device_class, **exactly}}]
    }
    if constraints:
        devices["constraints"] = list(constraints)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": devices}},
    }


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
    extra: dict[str, int] = field(default_factory=dict)  # the churn workload's counts


class _Tracker:
    """Creates and deletes the run's pods and watches them: when each was created and bound,
    the bindings per second and the load."""

    def __init__(self, api: _Api, scheduler_name: str) -> None:
        self.api = api
        self.scheduler_name = scheduler_name
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.deleted: set[str] = set()
        self.samples: list[int] = []
        self.loads: list[float] = []
        self.started = 0.0
        self.relists = 0  # the watch ended or broke and the pods were listed again
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> _Tracker:
        resource_version = (await self.api.list(PODS)).resource_version
        self._tasks = [
            asyncio.create_task(self._watch(resource_version)),
            asyncio.create_task(self._sample()),
        ]
        self.started = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _seen(self, obj: JSON) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name and (obj.get("spec") or {}).get("nodeName") and name not in self.bound:
            self.bound[name] = time.monotonic()

    async def _watch(self, resource_version: str) -> None:
        """Follow the pods; where the stream ends or breaks, list again and go on watching."""
        while True:
            try:
                async for event in self.api.watch(
                    PODS, resource_version=resource_version, timeout_s=300
                ):
                    self._seen(event.object)
                    resource_version = (
                        (event.object.get("metadata") or {}).get("resourceVersion")
                    ) or resource_version
            except (ApiError, aiohttp.ClientError, TimeoutError) as err:
                print(f"pod watch broke ({err!r}); listing again", file=sys.stderr)
            self.relists += 1
            listed = await self.api.list(PODS)
            for obj in listed.items:
                self._seen(obj)
            resource_version = listed.resource_version

    async def _sample(self) -> None:
        last = 0
        while True:
            await asyncio.sleep(1.0)
            now = len(self.bound)
            self.samples.append(now - last)
            self.loads.append(os.getloadavg()[0])
            last = now

    async def create(self, pods: Sequence[JSON]) -> None:
        """Create ``pods`` (``CREATE_CONCURRENCY`` at a time) for this run's scheduler."""

        async def one(pod: JSON) -> None:
            body = {**pod, "spec": {**pod["spec"], "schedulerName": self.scheduler_name}}
            self.created[pod["metadata"]["name"]] = time.monotonic()
            await self.api.create(PODS, body)

        await gather_bounded([lambda p=p: one(p) for p in pods], CREATE_CONCURRENCY)

    async def delete(self, names: Sequence[str]) -> None:
        """Delete pods at once (no kubelet runs to finish a graceful deletion)."""
        now: JSON = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}

        async def one(name: str) -> None:
            await self.api.request("DELETE", PODS.path(NAMESPACE, name), body=now)
            self.deleted.add(name)

        await gather_bounded([lambda n=n: one(n) for n in names], CREATE_CONCURRENCY)

    async def settle(self, names: Sequence[str], *, stall_s: float, timeout_s: float) -> None:
        """Wait until every one of ``names`` is bound, or nothing was bound for ``stall_s``."""
        deadline = time.monotonic() + timeout_s
        seen, progressed = len(self.bound), time.monotonic()
        while any(n not in self.bound for n in names):
            await asyncio.sleep(0.2)
            now = time.monotonic()
            if len(self.bound) != seen:
                seen, progressed = len(self.bound), now
            elif now - progressed >= stall_s or now >= deadline:
                return

    def watched(self, names: Sequence[str] | None = None) -> _Watched:
        """The figures of ``names`` (every pod when None)."""
        keep = set(self.created if names is None else names)
        created = {n: t for n, t in self.created.items() if n in keep}
        bound = {n: t for n, t in self.bound.items() if n in keep}
        started = min(created.values(), default=self.started)
        finished = max(bound.values(), default=started)
        return _Watched(created, bound, list(self.samples), list(self.loads), started, finished)


async def _burst(api: _Api, inventory: Inventory, scheduler_name: str) -> _Watched:
    """Create the pods in a burst; wait until every one is bound (or none for ``STALL_S``)."""
    names = [p["metadata"]["name"] for p in inventory.pods]
    async with _Tracker(api, scheduler_name) as tracker:
        await tracker.create(inventory.pods)
        await tracker.settle(names, stall_s=STALL_S, timeout_s=1800)
        watched = tracker.watched()
        watched.extra["watch_relists"] = tracker.relists
        return watched


async def _churn(api: _Api, inventory: Inventory, scheduler_name: str) -> _Watched:
    """Play the rounds (arrivals settle, then the departures leave and their claims are
    released), count the whole GPUs free, then create the wave and let it settle."""
    churn = inventory.churn
    if churn is None:
        raise ValueError(f"{inventory.workload} has no churn schedule")
    async with _Tracker(api, scheduler_name) as tracker:
        for arrivals, departures in churn.rounds:
            await tracker.create(arrivals)
            names = [p["metadata"]["name"] for p in arrivals]
            await tracker.settle(names, stall_s=CHURN_STALL_S, timeout_s=600)
            await tracker.delete(departures)
            await _released(api, tracker.deleted)
        free = churn.gpus - len(await _allocated_gpus(api))
        wave = [p["metadata"]["name"] for p in churn.wave]
        await tracker.create(churn.wave)
        await tracker.settle(wave, stall_s=CHURN_STALL_S, timeout_s=600)
        watched = tracker.watched()
        live = set(tracker.created) - tracker.deleted
        watched.extra = {
            "whole_gpus_free": free,
            "training_placed": sum(n in tracker.bound for n in wave),
            "training_pods": len(wave),
            "pending": sum(n not in tracker.bound for n in live),
            "watch_relists": tracker.relists,
        }
        return watched


async def _claims(api: _Api) -> list[JSON]:
    return list((await api.list(RESOURCE_CLAIMS)).items)


async def _released(api: _Api, deleted: set[str], timeout_s: float = 120.0) -> None:
    """Wait until no claim of a deleted pod is left (deallocated and removed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        owners = {
            ref.get("name")
            for claim in await _claims(api)
            for ref in claim["metadata"].get("ownerReferences") or ()
        }
        if not owners & deleted:
            return
        await asyncio.sleep(0.2)


async def _allocated_gpus(api: _Api) -> set[tuple[str, str]]:
    """Every (pool, device) some claim holds, whole or a share."""
    return {
        (result["pool"], result["device"])
        for claim in await _claims(api)
        for result in (
            ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        ).get("results")
        or ()
    }


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
                    drive = _burst if inventory.churn is None else _churn
                    return await drive(api, inventory, SCHEDULER_NAME[which])

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
        **watched.extra,
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
    ("driver's pod watch re-listed", lambda r: str(r["watch_relists"])),
)


_CHURN_ROWS: Final[tuple[tuple[str, Callable[[JSON], str]], ...]] = (
    ("whole GPUs free before the wave", lambda r: str(r["whole_gpus_free"])),
    ("training pods placed", lambda r: f"{r['training_placed']}/{r['training_pods']}"),
    ("pods left pending", lambda r: str(r["pending"])),
)


def tables(runs: Sequence[JSON]) -> list[str]:
    """One table per workload: a metric per row, a column per (scheduler, client QPS)."""
    out: list[str] = []
    for workload in dict.fromkeys(r["workload"] for r in runs):
        mine = [r for r in runs if r["workload"] == workload]
        first = mine[0]
        if workload == "churn":
            out.append(
                f"churn: {first['nodes']} nodes x 8 A100-80GB (shareable), {first['pods']} pods "
                f"({first['training_pods']} of them the training wave)"
            )
        else:
            out.append(
                f"{workload}: {first['nodes']} nodes x {DEVICES_PER_NODE} devices, "
                f"{first['pods']} pods"
            )
        headers = ["", *(f"{r['scheduler']} @{r['qps']}/{r['burst']}" for r in mine)]
        rows = _ROWS + (_CHURN_ROWS if workload == "churn" else ())
        body = [[label, *(fmt(r) for r in mine)] for label, fmt in rows]
        out.extend(table_lines(headers, body))
        out.append("")
    return out


def _qps_pair(text: str) -> tuple[int, int]:
    qps, _, burst = text.partition("/")
    return int(qps), int(burst or qps)


def _write_json(path: Path, runs: Sequence[JSON]) -> None:
    path.write_text(
        json.dumps({"runs": list(runs), "upstream_scheduler_perf": []}, indent=2) + "\n"
    )


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
        inventory = (
            churn_shape(args.nodes, args.pods)
            if workload == "churn"
            else upstream_shape(workload, args.nodes, args.pods)
        )
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
                    _write_json(args.json, runs)
    print("\n".join(tables(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

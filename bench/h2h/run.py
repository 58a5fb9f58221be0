"""One run of the head-to-head: a fresh control plane, the inventory seeded, one scheduler
started, the pods driven (a burst, a steady stream, the churn rounds or the four patterns one
after the other) while a watch records each binding, and the run's figures as one JSON row."""

from __future__ import annotations

import asyncio
import contextlib
import os
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

from bench.h2h.workloads import INIT_NAMESPACE, JSON, NAMESPACE, Inventory, gpu_fill
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
from bench.report import percentile
from driver.api.errors import ApiError
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

Scheduler = Literal["kube-scheduler", "biaxial"]
SCHEDULERS: Final[tuple[Scheduler, ...]] = ("kube-scheduler", "biaxial")
SCHEDULER_NAME: Final[dict[Scheduler, str]] = {
    "kube-scheduler": "default-scheduler",
    "biaxial": "biaxial",
}
TEMPLATES: Final = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True
)
APISERVER_ARGS: Final = (
    "--enable-priority-and-fairness=false",
    "--max-requests-inflight=0",
    "--max-mutating-requests-inflight=0",
)
CREATE_CONCURRENCY: Final = 32
STALL_S: Final = 30.0  # nothing bound for this long: the rest is unschedulable (or stuck)
CHURN_STALL_S: Final = 5.0


class _Api(Client):
    default_user_agent = "biaxial-bench-driver"


async def _seed(api: _Api, inventory: Inventory) -> None:
    for namespace in (NAMESPACE, INIT_NAMESPACE):
        await api.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )

    async def node(obj: JSON) -> None:
        # the TaintNodesByCondition admission gives a new Node the not-ready taint, which the
        # node lifecycle controller (not running here) would lift once the node is Ready
        created = await api.create(NODES, obj)
        created["status"] = obj["status"]
        ready = await api.replace(NODES, created, subresource="status")
        ready["spec"]["taints"] = []
        await api.replace(NODES, ready)

    async def held(obj: JSON) -> None:
        created = await api.create(RESOURCE_CLAIMS, {k: v for k, v in obj.items() if k != "status"})
        created["status"] = obj["status"]
        await api.replace(RESOURCE_CLAIMS, created, subresource="status")

    await gather_bounded([lambda o=o: node(o) for o in inventory.nodes], CREATE_CONCURRENCY)
    await gather_bounded(
        [lambda o=o: api.create(RESOURCE_SLICES, o) for o in inventory.slices], CREATE_CONCURRENCY
    )
    for obj in inventory.classes:
        await api.create(DEVICE_CLASSES, obj)
    for obj in inventory.templates:
        await api.create(TEMPLATES, obj)
    await gather_bounded([lambda o=o: held(o) for o in inventory.held], CREATE_CONCURRENCY)


@dataclass
class Watched:
    created: dict[str, float]
    bound: dict[str, float]
    samples: list[int]  # pods bound in each one-second interval
    loads: list[float]  # 1-minute load average, once a second
    started: float
    finished: float
    extra: dict[str, Any] = field(default_factory=dict)  # the workload's own figures


class _Tracker:
    """Creates and deletes the run's pods and watches them: when each was created and bound,
    the bindings per second and the load."""

    def __init__(self, api: _Api, scheduler_name: str, claims: dict[str, list[JSON]]) -> None:
        self.api = api
        self.scheduler_name = scheduler_name
        self.claims = claims
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.nodes: dict[str, str] = {}  # pod -> node
        self.unschedulable: set[str] = set()  # seen with PodScheduled=False, Unschedulable
        self.deleted: set[str] = set()
        self.samples: list[int] = []
        self.loads: list[float] = []
        self.started = 0.0
        self.relists = 0  # the watch ended or broke and the pods were listed again
        self.missed = 0  # bindings the watch had not delivered when a stall was checked
        self.newly_bound: asyncio.Queue[str] = asyncio.Queue()
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
        node = (obj.get("spec") or {}).get("nodeName")
        if name and not node and _unschedulable(obj):
            self.unschedulable.add(name)
        if name and node and name not in self.bound:
            self.bound[name] = time.monotonic()
            self.nodes[name] = node
            self.newly_bound.put_nowait(name)

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

    def watch_figures(self) -> dict[str, int]:
        """How the driver's own pod watch fared (the table's last rows)."""
        return {"watch_relists": self.relists, "watch_missed": self.missed}

    async def stalled(self) -> bool:
        """Whether nothing was bound indeed, checked with a list of the pods before a run is
        stopped for a stall: a watch that stopped delivering events without ending (once seen
        here, at load 6, with kube-scheduler still binding) is restarted from that list, and
        what it missed is counted (their binding times are when the list saw them, so the
        run's figures are then late; the table says so)."""
        before = len(self.bound)
        listed = await self.api.list(PODS)
        for obj in listed.items:
            self._seen(obj)
        missed = len(self.bound) - before
        if not missed:
            return True
        self.missed += missed
        print(
            f"the pod watch had not delivered {missed} binding(s) for {STALL_S:.0f} s; "
            "watching again from a list",
            file=sys.stderr,
        )
        self._tasks[0].cancel()
        self._tasks[0] = asyncio.create_task(self._watch(listed.resource_version))
        return False

    async def _sample(self) -> None:
        last = 0
        while True:
            await asyncio.sleep(1.0)
            now = len(self.bound)
            self.samples.append(now - last)
            self.loads.append(os.getloadavg()[0])
            last = now

    async def create_one(self, pod: JSON) -> None:
        """Create the pod's own claims (if any), then the pod, for this run's scheduler."""
        name = pod["metadata"]["name"]
        for claim in self.claims.get(name, ()):
            await self.api.create(RESOURCE_CLAIMS, claim)
        body = {**pod, "spec": {**pod["spec"], "schedulerName": self.scheduler_name}}
        self.created[name] = time.monotonic()
        await self.api.create(PODS, body)

    async def create(self, pods: Sequence[JSON]) -> None:
        """Create ``pods`` (``CREATE_CONCURRENCY`` at a time)."""
        await gather_bounded([lambda p=p: self.create_one(p) for p in pods], CREATE_CONCURRENCY)

    async def delete_one(self, name: str) -> None:
        """Delete a pod at once (no kubelet runs to finish a graceful deletion)."""
        now: JSON = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        await self.api.request("DELETE", PODS.path(NAMESPACE, name), body=now)
        self.deleted.add(name)

    async def delete(self, names: Sequence[str]) -> None:
        await gather_bounded([lambda n=n: self.delete_one(n) for n in names], CREATE_CONCURRENCY)

    async def settle(
        self, names: Sequence[str], *, stall_s: float, timeout_s: float, tried: bool = False
    ) -> None:
        """Wait until every one of ``names`` is bound, or nothing was bound for ``stall_s``.
        ``tried``: the ``stall_s`` only counts once every pod not bound was reported
        unschedulable (a scheduler that takes seconds per failing pod on a large cluster is
        not stalled while it still has pods it never tried)."""
        deadline = time.monotonic() + timeout_s
        seen, progressed = len(self.bound), time.monotonic()
        while waiting := [n for n in names if n not in self.bound]:
            await asyncio.sleep(0.2)
            now = time.monotonic()
            untried = tried and any(n not in self.unschedulable for n in waiting)
            if now >= deadline:
                return
            if len(self.bound) != seen or untried:
                seen, progressed = len(self.bound), now
            elif now - progressed >= stall_s:
                if await self.stalled():
                    return
                seen, progressed = len(self.bound), time.monotonic()

    def watched(self, names: Sequence[str] | None = None) -> Watched:
        """The figures of ``names`` (every pod when None)."""
        keep = set(self.created if names is None else names)
        created = {n: t for n, t in self.created.items() if n in keep}
        bound = {n: t for n, t in self.bound.items() if n in keep}
        started = min(created.values(), default=self.started)
        finished = max(bound.values(), default=started)
        return Watched(created, bound, list(self.samples), list(self.loads), started, finished)


async def _burst(api: _Api, inventory: Inventory, scheduler_name: str) -> Watched:
    """Create the pods in a burst; wait until every one is bound (or none for ``STALL_S``)."""
    names = [p["metadata"]["name"] for p in inventory.pods]
    async with _Tracker(api, scheduler_name, inventory.claims) as tracker:
        await tracker.create(inventory.pods)
        await tracker.settle(names, stall_s=STALL_S, timeout_s=1800)
        watched = tracker.watched()
        watched.extra.update(tracker.watch_figures())
        return watched


async def _steady(api: _Api, inventory: Inventory, scheduler_name: str) -> Watched:
    """scheduler_perf's steady state for a fixed count: ``in_flight`` pods waiting; each pod
    seen bound is deleted and the next one created, until every pod was created and bound (or
    none was bound for ``STALL_S``)."""
    in_flight = inventory.in_flight or 1
    todo = list(inventory.pods)
    async with _Tracker(api, scheduler_name, inventory.claims) as tracker:
        await tracker.create(todo[:in_flight])
        following = in_flight
        jobs: set[asyncio.Task[None]] = set()

        async def replace(bound: str, nxt: JSON | None) -> None:
            await tracker.delete_one(bound)
            if nxt is not None:
                await tracker.create_one(nxt)

        while len(tracker.bound) < len(todo):
            try:
                bound = await asyncio.wait_for(tracker.newly_bound.get(), timeout=STALL_S)
            except TimeoutError:
                if await tracker.stalled():
                    break
                continue
            nxt = todo[following] if following < len(todo) else None
            following += 1
            job = asyncio.create_task(replace(bound, nxt))
            jobs.add(job)
            job.add_done_callback(jobs.discard)
        await asyncio.gather(*jobs)
        watched = tracker.watched()
        watched.extra.update(tracker.watch_figures())
        return watched


async def _churn(api: _Api, inventory: Inventory, scheduler_name: str) -> Watched:
    """Play the rounds (arrivals settle, then the departures leave and their claims are
    released), count the whole GPUs free and the GPUs with stranded memory
    (:func:`~bench.h2h.workloads.gpu_fill`), then create the wave and let it settle."""
    churn = inventory.churn
    if churn is None:
        raise ValueError(f"{inventory.workload} has no churn schedule")
    async with _Tracker(api, scheduler_name, inventory.claims) as tracker:
        for arrivals, departures in churn.rounds:
            await tracker.create(arrivals)
            names = [p["metadata"]["name"] for p in arrivals]
            await tracker.settle(names, stall_s=CHURN_STALL_S, timeout_s=900, tried=True)
            await tracker.delete(departures)
            await _released(api, tracker.deleted)
        # the GPUs as the wave finds them: from every claim's allocation and the slices
        fill = gpu_fill(await _claims(api), (await api.list(RESOURCE_SLICES)).items)
        wave = [p["metadata"]["name"] for p in churn.wave]
        await tracker.create(churn.wave)
        await tracker.settle(wave, stall_s=CHURN_STALL_S, timeout_s=900, tried=True)
        watched = tracker.watched()
        live = set(tracker.created) - tracker.deleted
        watched.extra = {
            **fill,
            "gpus": churn.gpus,
            "training_placed": sum(n in tracker.bound for n in wave),
            "training_pods": len(wave),
            "pending": sum(n not in tracker.bound for n in live),
            **tracker.watch_figures(),
        }
        return watched


async def _patterns(api: _Api, inventory: Inventory, scheduler_name: str) -> Watched:
    """Each pattern's Deployment alone on the cluster: its pods settle, their placements are
    read from their claims (node, device), then they are deleted and their claims released."""
    placements: dict[str, list[dict[str, str]]] = {}
    async with _Tracker(api, scheduler_name, inventory.claims) as tracker:
        for pattern, pods in inventory.patterns.items():
            names = [p["metadata"]["name"] for p in pods]
            await tracker.create(pods)
            await tracker.settle(names, stall_s=CHURN_STALL_S, timeout_s=120)
            devices = await _devices_by_owner(api)
            placements[pattern] = [
                {
                    "pod": n,
                    "node": tracker.nodes.get(n, ""),
                    "device": ",".join(sorted(devices.get(n, ()))),
                }
                for n in names
            ]
            await tracker.delete(names)
            await _released(api, tracker.deleted)
        watched = tracker.watched()
        watched.extra = {
            "placements": placements,
            "pending": sum(1 for p in placements.values() for one in p if not one["node"]),
            **tracker.watch_figures(),
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


def _unschedulable(pod: JSON) -> bool:
    """The pod carries ``PodScheduled=False`` with reason ``Unschedulable`` (both schedulers
    set it when a pod fits nowhere)."""
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


def _results(claim: JSON) -> list[JSON]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or ())


async def _devices_by_owner(api: _Api) -> dict[str, set[str]]:
    """The devices (``pool/device``) each pod's claims hold, by the pod that owns them."""
    held: dict[str, set[str]] = {}
    for claim in await _claims(api):
        for ref in claim["metadata"].get("ownerReferences") or ():
            held.setdefault(ref.get("name", ""), set()).update(
                f"{r['pool']}/{r['device']}" for r in _results(claim)
            )
    return held


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


def _driver(inventory: Inventory) -> Callable[[_Api, Inventory, str], Any]:
    if inventory.churn is not None:
        return _churn
    if inventory.patterns:
        return _patterns
    if inventory.in_flight is not None:
        return _steady
    return _burst


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

            async def drive() -> Watched:
                async with _Api(endpoint, request_timeout_s=120) as api:
                    watched: Watched = await _driver(inventory)(
                        api, inventory, SCHEDULER_NAME[which]
                    )
                    return watched

            watched = asyncio.run(drive())
            cpu = cpu_seconds(running.pid) - cpu0
            time.sleep(RENDER_TTL_S + 0.1)  # biaxial's /metrics is rendered at most once a second
            requests = running.requests() - requests0
            rss = peak_rss_mib(running.pid)
    finally:
        plane.stop()
    return row(
        inventory,
        which=which,
        qps=qps,
        burst=burst,
        watched=watched,
        cpu=cpu,
        requests=requests,
        rss=rss,
    )


def row(
    inventory: Inventory,
    *,
    which: Scheduler,
    qps: int,
    burst: int,
    watched: Watched,
    cpu: float,
    requests: float,
    rss: float,
) -> JSON:
    """The run's JSON object (issue 24's fields, then the rest)."""
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
        "pods_per_s": bound / wall if wall > 0 else 0.0,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else 0.0,
        "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else 0.0,
        "requests_per_pod": requests / max(1, bound),
        "cpu_s_per_pod": cpu / max(1, bound),
        "rss_mb": rss,
        "qps": qps,
        "burst": burst,
        "seconds": wall,
        "pods_per_s_p50": float(percentile(samples, 0.50)),
        "pods_per_s_p90": float(percentile(samples, 0.90)),
        "pods_per_s_p99": float(percentile(samples, 0.99)),
        "cpu_s": cpu,
        "load_avg": statistics.mean(watched.loads) if watched.loads else os.getloadavg()[0],
        "devices": inventory.devices,
        "held_devices": len(inventory.held),
        **watched.extra,
    }

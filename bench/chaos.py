"""The fault run (``make bench-chaos``): many pods through the real processes while the API
misbehaves and processes die, then the books are checked.

Loopback only, bounded, reproducible from ``--seed`` (the schedule of pods, faults, kills and
pauses; process timing still varies). In this process: the API emulator (in-process, so faults
can be injected), the resourceclaim controller stand-in (claims from templates), and a
*kubelet* that prepares the claims of every pod bound to a node through that node's plugin
(gRPC, as the kubelet) and, when a pod is deleted, unprepares them before the pod goes. As
child processes: ``--controllers`` ``biaxial controller`` replicas with leader election (lease
3 s, renew deadline 2 s, retry 0.4 s), and one ``biaxial kubelet-plugin`` per node (fake GPUs:
T4 and A10G nodes, four GPUs each).

Pods (``--pods`` in all, about ``--alive`` at a time, each deleted a while after it runs): a
whole GPU from a claim template, a share of one (2-8 GiB), or a legacy ``nvidia.com/gpu: 1``
with ``nvidia.com/gpumem`` (the KEP-5004 bridge). Meanwhile, chaos:

* API faults, one every ``--fault-interval`` s, of each kind: 409 Conflict on the next write,
  429 TooManyRequests, 5xx (500/503/504, also on the leader Lease), an abruptly dropped watch,
  410 Gone (watches expired), added latency;
* SIGKILL of a controller or a plugin every ``--kill-interval`` s (a killed or exited
  controller is restarted after a moment, as its Deployment would; a plugin, as its DaemonSet);
* the leader stopped (SIGSTOP) for longer than its lease every ``--pause-interval`` s, then
  resumed: it must notice, write nothing, and exit non-zero.

Every half second the invariant checker of the test suite runs over what the API holds
(``tests.integration.controller_env.check_invariants``: no device given twice, no capacity
exceeded, every bound pod's claims allocated and reserved for it). Once every pod was created
(and at least ``--min-seconds`` passed) the chaos stops and the run converges: pods go on
ending after their lifetime (no new ones) until every pod created has been bound and
prepared (a pod that never was is stuck); then every pod is deleted and the run converges
again: nothing allocated, reserved or finalized, no bridge claim left, no claim prepared in
any plugin's checkpoint.

Printed: pods, faults by kind (fired; for dropped and expired watches, the watches ended),
kills, pauses, double allocations (invariant violations seen), leaks after deletion
(allocations, prepared claims), stuck pods, the time each convergence took, and each
process's peak memory.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.processes import ROOT, peak_rss_mib, seed_nodes
from tests.emulator import Emulator, ResourceClaimController, lookup
from tests.integration.controller_env import (
    check_invariants,
    claim_template,
    leftovers,
    pod,
    pod_claim_keys,
)
from tests.integration.fake_kubelet import FakeKubelet, PluginProcess

JSON = dict[str, Any]
NAMESPACE = "chaos"
LEASE_NS = "kube-system"
LEASE = "biaxial-controller"
TIMING = (3.0, 2.0, 0.4)  # lease duration, renew deadline, retry period (client-go's / 5)
PROFILES = ("t4x4", "a10gx4")
POD_KIND = lookup("pods")
CLAIM_KIND = lookup("resourceclaims")
FAULT_KINDS = ("409", "429", "5xx", "5xx-lease", "dropped-watch", "410-gone", "latency")


@dataclass
class Tally:
    """What happened, for the report."""

    created: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    scheduled: collections.Counter[str] = field(default_factory=collections.Counter)
    kills: collections.Counter[str] = field(default_factory=collections.Counter)
    pauses: int = 0
    violations: list[str] = field(default_factory=list)
    checks: int = 0
    prepare_errors: int = 0
    controller_exits: collections.Counter[int] = field(default_factory=collections.Counter)


# --------------------------------------------------------------------------- the processes


class Controller:
    """One ``biaxial controller`` replica (restartable under the same identity)."""

    def __init__(self, root: Path, kubeconfig: Path, identity: str) -> None:
        self.identity = identity
        self.kubeconfig = kubeconfig
        self.log = root / f"{identity}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_mib = 0.0
        self.starts = 0

    def start(self) -> None:
        lease, renew, retry = TIMING
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "biaxial", "controller",
                    "--kubeconfig", str(self.kubeconfig),
                    "--identity", self.identity,
                    "--lease-namespace", LEASE_NS,
                    "--lease-duration", str(lease),
                    "--renew-deadline", str(renew),
                    "--retry-period", str(retry),
                    "--metrics-port", "0",
                    "--qps", "300",
                    "--burst", "600",
                ],
                cwd=ROOT,
                stdout=log,
                stderr=log,
            )  # fmt: skip
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sample(self) -> None:
        if self.alive and self.proc is not None:
            self.peak_mib = max(self.peak_mib, peak_rss_mib(self.proc.pid))

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Plugin:
    """One node's ``biaxial kubelet-plugin`` and the kubelet's gRPC client for it."""

    def __init__(self, root: Path, kubeconfig: Path, node: str, profile: str, lib: Path) -> None:
        self.node = node
        self.process = PluginProcess(
            root,
            kubeconfig,
            node=node,
            profile=profile,
            name="plugin",
            extra=[
                "--hami-core-library", str(lib),
                "--metrics-port", "0",
                "--reconcile-seconds", "5",
                "--release-grace-seconds", "10",
            ],
        )  # fmt: skip
        self.kubelet: FakeKubelet | None = None
        self.dra: Any = None
        self.lock = threading.Lock()
        self.peak_mib = 0.0
        self.starts = 0

    def start(self) -> None:
        with self.lock:
            self.process.start(timeout_s=60)
            kubelet = FakeKubelet(self.process.registration_socket)
            kubelet.notify(registered=True)
            self.kubelet, self.dra = kubelet, kubelet.dra("v1")
            self.starts += 1

    def kill(self) -> None:
        with self.lock:
            if self.kubelet is not None:
                self.kubelet.close()
            self.kubelet = self.dra = None
            proc = self.process.proc
            if proc is not None and proc.poll() is None:
                self.peak_mib = max(self.peak_mib, peak_rss_mib(proc.pid))
                proc.kill()
                proc.wait()

    @property
    def alive(self) -> bool:
        proc = self.process.proc
        return self.dra is not None and proc is not None and proc.poll() is None

    def sample(self) -> None:
        proc = self.process.proc
        if proc is not None and proc.poll() is None:
            self.peak_mib = max(self.peak_mib, peak_rss_mib(proc.pid))

    def call(self, verb: str, claims: list[tuple[str, str, str]]) -> dict[str, str] | None:
        """Prepare or unprepare; {uid: error} ("" = done), None when the plugin is down."""
        with self.lock:
            dra = self.dra
        if dra is None:
            return None
        try:
            if verb == "prepare":
                return {uid: r.error for uid, r in dra.prepare(claims).items()}
            return dict(dra.unprepare(claims))
        except grpc.RpcError:
            return None

    def prepared(self) -> int:
        """Claims in the plugin's checkpoint (what the node still holds)."""
        path = self.process.state_dir / "checkpoint.json"
        if not path.exists():
            return 0
        return len(json.loads(path.read_text())["data"]["claims"])

    def stop(self) -> None:
        with self.lock:
            if self.kubelet is not None:
                self.kubelet.close()
            self.kubelet = self.dra = None
        with contextlib.suppress(Exception):
            self.process.stop()


# --------------------------------------------------------------------------- the kubelet


class Kubelet(threading.Thread):
    """Prepares the claims of pods bound to a node; unprepares them before a deleted pod
    goes (and only then lets it go), retrying while the node's plugin is down, as the kubelet
    does."""

    def __init__(self, emulator: Emulator, plugins: dict[str, Plugin], tally: Tally) -> None:
        super().__init__(name="kubelet", daemon=True)
        self.emulator = emulator
        self.plugins = plugins
        self.tally = tally
        self.running: dict[str, float] = {}  # pod uid -> when its claims were prepared
        self.ran: set[str] = set()  # every pod uid whose claims were ever prepared
        self.prepared: dict[str, tuple[str, list[tuple[str, str, str]]]] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.05):
            self.tick()

    def _claims(self, p: JSON) -> list[tuple[str, str, str]] | None:
        out = []
        for key in pod_claim_keys(p):
            namespace, name = key.split("/", 1)
            claim = self.emulator.store.try_get(CLAIM_KIND, namespace, name)
            if claim is None or not (claim.get("status") or {}).get("allocation"):
                return None  # not there, or not allocated yet: the kubelet waits
            out.append((namespace, str(claim["metadata"]["uid"]), name))
        return out

    def tick(self) -> None:
        for p in self.emulator.list("pods", NAMESPACE):
            node = (p.get("spec") or {}).get("nodeName")
            if not node:
                continue
            meta = p["metadata"]
            uid = meta["uid"]
            plugin = self.plugins[node]
            if meta.get("deletionTimestamp"):
                held = self.prepared.get(uid)
                if held is not None:
                    answer = plugin.call("unprepare", held[1])
                    if answer is None or any(answer.values()):
                        continue  # retried next tick
                    del self.prepared[uid]
                self.running.pop(uid, None)
                with contextlib.suppress(Exception):
                    self.emulator.delete("pods", meta["name"], NAMESPACE, {"gracePeriodSeconds": 0})
                continue
            if uid in self.prepared:
                continue
            claims = self._claims(p)
            if claims is None:
                continue
            answer = plugin.call("prepare", claims)
            if answer is None:
                continue
            if any(answer.values()):
                self.tally.prepare_errors += 1
                continue
            self.prepared[uid] = (node, claims)
            self.running[uid] = time.monotonic()
            self.ran.add(uid)


# --------------------------------------------------------------------------- chaos


class Chaos(threading.Thread):
    """Injects faults, kills and pauses on a seeded schedule; restarts what died."""

    def __init__(
        self,
        args: argparse.Namespace,
        emulator: Emulator,
        controllers: list[Controller],
        plugins: dict[str, Plugin],
        tally: Tally,
    ) -> None:
        super().__init__(name="chaos", daemon=True)
        self.args = args
        self.rng = random.Random(args.seed + 1)
        self.emulator = emulator
        self.controllers = controllers
        self.plugins = plugins
        self.tally = tally
        self.stop_event = threading.Event()
        self.latency_rules = 0

    def run(self) -> None:
        now = time.monotonic()
        next_fault = now + self.args.fault_interval
        next_kill = now + self.args.kill_interval
        next_pause = now + self.args.pause_interval
        while not self.stop_event.wait(0.05):
            now = time.monotonic()
            if now >= next_fault:
                self.fault()
                next_fault = now + self.args.fault_interval * self.rng.uniform(0.5, 1.5)
            if now >= next_kill:
                self.kill()
                next_kill = now + self.args.kill_interval * self.rng.uniform(0.5, 1.5)
            if now >= next_pause:
                self.pause()
                next_pause = time.monotonic() + self.args.pause_interval
        self.emulator.faults.clear()

    def fault(self) -> None:
        kind = self.rng.choice(FAULT_KINDS)
        em = self.emulator
        self.tally.scheduled[kind] += 1
        if kind == "409":
            em.fail_next_write(409, resource=self.rng.choice(["resourceclaims", "pods", None]))
        elif kind == "429":
            em.fail_next(429, verbs=self.rng.choice(["get", "list", "write", None]), count=1)
        elif kind == "5xx":
            status = self.rng.choice([500, 503, 504])
            em.fail_next(status, verbs=self.rng.choice(["get", "list", "write", None]))
        elif kind == "5xx-lease":
            em.fail_next(self.rng.choice([500, 503, 504]), resource="leases")
        elif kind == "dropped-watch":
            self.tally.faults[kind] += em.drop_watches()
        elif kind == "410-gone":
            self.tally.faults[kind] += em.drop_watches(expire=True)
        elif kind == "latency":
            count = self.rng.randint(2, 6)
            em.add_latency(self.rng.uniform(0.1, 1.0), count=count)
            self.latency_rules += count

    def kill(self) -> None:
        if self.rng.random() < 0.5:
            victim = self.rng.choice(self.controllers)
            if victim.alive:
                victim.sample()
                victim.signal(signal.SIGKILL)
                self.tally.kills["controller"] += 1
        else:
            plugin = self.plugins[self.rng.choice(sorted(self.plugins))]
            if plugin.alive:
                plugin.kill()
                self.tally.kills["plugin"] += 1
                time.sleep(self.rng.uniform(0.2, 1.5))
                plugin.start()

    def pause(self) -> None:
        holder = _leader(self.emulator)
        leader = next((c for c in self.controllers if c.identity == holder and c.alive), None)
        if leader is None:
            return
        leader.signal(signal.SIGSTOP)
        self.tally.pauses += 1
        self.stop_event.wait(TIMING[0] + 1.5)
        leader.signal(signal.SIGCONT)


def _leader(emulator: Emulator) -> str:
    lease = emulator.get("leases", LEASE, LEASE_NS) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


class Supervisor(threading.Thread):
    """Restarts controllers that exited (a Deployment); samples memory; runs the checker."""

    def __init__(
        self,
        emulator: Emulator,
        controllers: list[Controller],
        plugins: dict[str, Plugin],
        tally: Tally,
    ) -> None:
        super().__init__(name="supervisor", daemon=True)
        self.emulator = emulator
        self.controllers = controllers
        self.plugins = plugins
        self.tally = tally
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            for c in self.controllers:
                c.sample()
                if c.proc is not None and c.proc.poll() is not None:
                    self.tally.controller_exits[c.proc.returncode] += 1
                    c.start()
            for p in self.plugins.values():
                p.sample()
            self.check()

    def check(self) -> None:
        self.tally.checks += 1
        for problem in check_invariants(self.emulator):
            if problem not in self.tally.violations:
                self.tally.violations.append(problem)


# --------------------------------------------------------------------------- the workload


def _pod_for(rng: random.Random, i: int) -> list[JSON]:
    name = f"p{i:05d}"
    shape = rng.random()
    if shape < 0.4:
        return [pod(name, template="whole", namespace=NAMESPACE)]
    if shape < 0.8:
        size = rng.choice(["2Gi", "4Gi", "6Gi", "8Gi"])
        return [pod(name, template=f"share-{size.lower()}", namespace=NAMESPACE)]
    return [pod(name, legacy_gpus=1, gpumem=3000, namespace=NAMESPACE)]


def _wait(predicate: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``predicate()`` held, None when it did not within ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.1)
    return None


def _live_pods(emulator: Emulator) -> list[JSON]:
    return emulator.list("pods", NAMESPACE)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tally = Tally()
    root = Path(tempfile.mkdtemp(prefix="bxc", dir="/tmp"))
    nodes = {f"n{i}": PROFILES[i % len(PROFILES)] for i in range(args.nodes)}
    lib = root / "libvgpu.so"
    lib.write_bytes(b"")  # the plugin only checks that the library is there
    emulator = Emulator(history_size=500_000).start()
    claims = ResourceClaimController(emulator).start()
    controllers: list[Controller] = []
    plugins: dict[str, Plugin] = {}
    threads: list[Any] = []
    report: dict[str, Any] = {}
    try:
        seed_nodes(emulator, nodes, namespaces=[NAMESPACE], slices=False)
        emulator.create(claim_template("whole", namespace=NAMESPACE))
        for size in ("2Gi", "4Gi", "6Gi", "8Gi"):
            emulator.create(
                claim_template(f"share-{size.lower()}", memory=size, namespace=NAMESPACE)
            )
        kubeconfig = emulator.write_kubeconfig(root / "kubeconfig")
        for node, profile in nodes.items():
            (root / node).mkdir()
            plugins[node] = Plugin(root / node, kubeconfig, node, profile, lib)
            plugins[node].start()
        controllers = [Controller(root, kubeconfig, f"c{i}") for i in range(args.controllers)]
        for c in controllers:
            c.start()
        kubelet = Kubelet(emulator, plugins, tally)
        supervisor = Supervisor(emulator, controllers, plugins, tally)
        chaos = Chaos(args, emulator, controllers, plugins, tally)
        threads = [kubelet, supervisor, chaos]
        for t in threads:
            t.start()
        started = time.monotonic()
        deleting: dict[str, float] = {}
        created = 0

        def step(create: bool) -> list[JSON]:
            """Delete the pods whose lifetime is over; create new ones up to ``--alive``.
            Returns the live pods that never ran."""
            nonlocal created
            live = [p for p in _live_pods(emulator) if not p["metadata"].get("deletionTimestamp")]
            now = time.monotonic()
            for p in live:
                uid = p["metadata"]["uid"]
                ran = kubelet.running.get(uid)
                if ran is not None and uid not in deleting:
                    deleting[uid] = ran + rng.uniform(*args.lifetime)
                due = deleting.get(uid)
                if due is not None and due <= now:
                    with contextlib.suppress(Exception):
                        emulator.delete("pods", p["metadata"]["name"], NAMESPACE)
            while create and len(live) < args.alive and created < args.pods:
                live.extend(emulator.create(obj) for obj in _pod_for(rng, created))
                created += 1
            return [p for p in live if p["metadata"]["uid"] not in kubelet.ran]

        while (
            created < args.pods or time.monotonic() - started < args.min_seconds
        ) and time.monotonic() - started < args.max_seconds:
            step(create=True)
            time.sleep(0.1)
        tally.created = created
        chaos.stop_event.set()
        chaos.join()
        chaos_s = time.monotonic() - started
        for c in controllers:
            if c.proc is not None and c.proc.poll() is None:
                c.signal(signal.SIGCONT)
        # Convergence 1: every pod created has run. Pods go on ending after their lifetime
        # (no new ones), so the last ones get the room they wait for.
        waiting: list[JSON] = []

        def all_ran() -> bool:
            waiting[:] = step(create=False)
            return not waiting

        bound_s = _wait(all_ran, args.settle)
        stuck = [p["metadata"]["name"] for p in waiting]
        # Convergence 2: every pod deleted, nothing left behind.
        for p in _live_pods(emulator):
            with contextlib.suppress(Exception):
                emulator.delete("pods", p["metadata"]["name"], NAMESPACE)

        def clean() -> bool:
            return (
                not _live_pods(emulator)
                and not leftovers(emulator)
                and all(pl.prepared() == 0 for pl in plugins.values())
            )

        released_s = _wait(clean, args.settle)
        supervisor.check()
        report = {
            "seed": args.seed,
            "pods": tally.created,
            "chaos_s": chaos_s,
            "faults": _fired(emulator, tally, chaos),
            "kills": dict(tally.kills),
            "pauses": tally.pauses,
            "controller_exits": dict(tally.controller_exits),
            "invariant_checks": tally.checks,
            "double_allocations": tally.violations,
            "stuck_pods": stuck,
            "leaks": leftovers(emulator),
            "prepared_left": {n: pl.prepared() for n, pl in plugins.items()},
            "converged_bound_s": bound_s,
            "converged_released_s": released_s,
            "prepare_errors_retried": tally.prepare_errors,
            "peak_rss_mib": {
                **{c.identity: round(c.peak_mib) for c in controllers},
                **{f"plugin-{n}": round(pl.peak_mib) for n, pl in plugins.items()},
            },
            "restarts": {
                **{c.identity: c.starts - 1 for c in controllers},
                **{f"plugin-{n}": pl.starts - 1 for n, pl in plugins.items()},
            },
        }
    finally:
        for t in threads:
            t.stop_event.set()
        for t in threads:
            t.join(10)
        for c in controllers:
            c.sample()
            c.stop()
        for pl in plugins.values():
            pl.sample()
            pl.stop()
        claims.stop()
        emulator.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"logs kept in {root}", file=sys.stderr)
    return report


def _fired(emulator: Emulator, tally: Tally, chaos: Chaos) -> dict[str, int]:
    """Faults that took effect: injected error rules consumed, watches ended, delayed calls."""
    pending = collections.Counter[str]()
    for rule in emulator.pending_faults():
        if rule.status == 409:
            pending["409"] += rule.remaining
        elif rule.status == 429:
            pending["429"] += rule.remaining
        elif rule.resource == "leases":
            pending["5xx-lease"] += rule.remaining
        elif rule.status >= 500:
            pending["5xx"] += rule.remaining
        elif rule.latency:
            pending["latency"] += rule.remaining
    fired = dict(tally.faults)
    for kind in ("409", "429", "5xx", "5xx-lease"):
        fired[kind] = tally.scheduled[kind] - pending[kind]
    fired["latency"] = chaos.latency_rules - pending["latency"]
    fired["total"] = sum(fired.values())
    return fired


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--pods", type=int, default=1800)
    parser.add_argument("--alive", type=int, default=40, help="pods alive at a time")
    parser.add_argument("--nodes", type=int, default=3, help="plugin processes (>= 2)")
    parser.add_argument("--controllers", type=int, default=2)
    parser.add_argument("--lifetime", type=float, nargs=2, default=(0.5, 3.0))
    parser.add_argument("--fault-interval", type=float, default=0.3)
    parser.add_argument("--kill-interval", type=float, default=8.0)
    parser.add_argument("--pause-interval", type=float, default=25.0)
    parser.add_argument("--settle", type=float, default=120.0, help="convergence limit, s")
    parser.add_argument("--max-seconds", type=float, default=1200.0, help="cap on the run")
    parser.add_argument(
        "--min-seconds", type=float, default=0.0, help="chaos lasts at least this long"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args(argv)
    if args.nodes < 2:
        parser.error("--nodes: at least 2 plugin processes")
    return args


def passed(report: dict[str, Any]) -> bool:
    """No double allocation, no stuck pod, nothing leaked, and the run converged."""
    return (
        not report["double_allocations"]
        and not report["stuck_pods"]
        and not report["leaks"]
        and not any(report["prepared_left"].values())
        and report["converged_bound_s"] is not None
        and report["converged_released_s"] is not None
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print(report)
    return 0 if passed(report) else 1


def _print(report: dict[str, Any]) -> None:
    faults = report["faults"]
    print(f"| seed | {report['seed']} |")
    print("|---|---|")
    rows = [
        ("pods", report["pods"]),
        ("chaos phase", f"{report['chaos_s']:.0f} s"),
        (
            "faults fired (watch kinds: watches ended)",
            ", ".join(f"{k} {v}" for k, v in faults.items()),
        ),
        ("kills (SIGKILL)", ", ".join(f"{k} {v}" for k, v in report["kills"].items())),
        ("leader pauses > lease", report["pauses"]),
        ("controller exits by code", report["controller_exits"]),
        ("invariant checks", report["invariant_checks"]),
        ("double allocations", len(report["double_allocations"])),
        ("stuck pods", len(report["stuck_pods"])),
        ("leaked allocations after deletion", len(report["leaks"])),
        ("prepared claims left", sum(report["prepared_left"].values())),
        ("converged: every pod ran", _seconds(report["converged_bound_s"])),
        ("converged: all released", _seconds(report["converged_released_s"])),
        ("prepare errors (retried)", report["prepare_errors_retried"]),
        ("peak RSS MiB", report["peak_rss_mib"]),
        ("restarts", report["restarts"]),
    ]
    for name, value in rows:
        print(f"| {name} | {value} |")
    for problem in report["double_allocations"][:10]:
        print(f"violation: {problem}")
    for name in report["stuck_pods"][:10]:
        print(f"stuck: {name}")
    for leak in report["leaks"][:10]:
        print(f"leak: {leak}")


def _seconds(value: float | None) -> str:
    return "did not converge" if value is None else f"{value:.1f} s"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())

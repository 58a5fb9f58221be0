"""Two ``biaxial controller`` processes against the API emulator, with faults on their Lease:

* Lease errors (409, 429, 500, 503, 504, and latency) injected every 1.5-3.5 s for a minute,
  while pods keep arriving and leaving: a leader exists at least 99 % of the time, the standby
  never exits, and no write is applied while its sender does not hold the Lease;
* the leader stopped with SIGSTOP for longer than its lease, then resumed: the standby takes
  over, the old leader sends no write after it resumes (the ones it had queued are refused by
  its fence), and it exits non-zero so its Deployment restarts it.

"No write from a process that has lost the lease" is checked by the emulator itself: a write
observer runs under the store lock at the instant each write is applied and compares the
sender (the User-Agent names the replica) with the Lease's holder at that instant.

Both tests are slow (a minute, and about twenty seconds); they use loopback only.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import bound_pods, check_invariants, pod, seed_cluster

pytestmark = pytest.mark.slow

LEASE_NS = "kube-system"
LEASE = "biaxial-controller"
# Lease duration / renew deadline / retry period, in seconds: client-go's 15/10/2 scaled down.
TIMING = (3.0, 2.0, 0.4)
_AGENT = re.compile(r"biaxial-controller \(([^)]*)\)")


@dataclass
class Replica:
    identity: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@dataclass
class WriteAudit:
    """Every controller write as it was applied: who sent it, who held the Lease then."""

    writes: list[tuple[float, str, str, str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def violations(self) -> list[str]:
        with self.lock:
            return [
                f"{verb} {resource} from {sender} while {holder or 'nobody'} held the lease"
                for _, sender, verb, resource, holder in self.writes
                if holder != sender
            ]

    def by(self, identity: str, since: float = 0.0) -> list[str]:
        with self.lock:
            return [f"{v} {r}" for t, s, v, r, _ in self.writes if s == identity and t >= since]


def _lease_spec(cluster: Emulator) -> dict[str, object]:
    lease = cluster.get("leases", LEASE, LEASE_NS) or {}
    spec: dict[str, object] = lease.get("spec") or {}
    return spec


def _holder(cluster: Emulator) -> str | None:
    return str(_lease_spec(cluster).get("holderIdentity") or "") or None


def _audit(cluster: Emulator) -> WriteAudit:
    audit = WriteAudit()

    def observe(agent: str, verb: str, resource: str) -> None:
        found = _AGENT.search(agent)
        if found is None or resource.startswith("leases"):
            return  # not a controller, or the leader election's own Lease writes
        entry = (time.monotonic(), found.group(1), verb, resource, _holder(cluster))
        with audit.lock:
            audit.writes.append(entry)

    cluster.observe_writes(observe)
    return audit


@pytest.fixture
def replicas(kubeconfig: Path, tmp_path: Path) -> Iterator[Callable[..., Replica]]:
    """Starts replicas on demand (``start(identity, *extra)``); kills what is left at the end."""
    started: dict[str, Replica] = {}

    def start(identity: str, *extra: str) -> Replica:
        duration, deadline, retry = TIMING
        log = tmp_path / f"{identity}.log"
        argv = [
            sys.executable, "-m", "biaxial", "-v", "controller",
            "--kubeconfig", str(kubeconfig),
            "--identity", identity,
            "--metrics-port", "0",
            "--lease-namespace", LEASE_NS,
            "--lease-duration", str(duration),
            "--renew-deadline", str(deadline),
            "--retry-period", str(retry),
            *extra,
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        started[identity] = Replica(identity, proc, log)
        return started[identity]

    yield start
    for replica in started.values():
        if replica.alive:
            replica.proc.kill()
        replica.proc.wait(timeout=15)


def _stop(replica: Replica) -> int:
    replica.proc.send_signal(signal.SIGTERM)
    return replica.proc.wait(timeout=20)


# --------------------------------------------------------------------------- Lease errors


def test_lease_errors_for_a_minute_keep_a_leader_and_no_write_from_a_non_holder(
    emulator: Emulator, claim_controller: ResourceClaimController, replicas: Callable[..., Replica]
) -> None:
    start = replicas
    seed_cluster(emulator)
    audit = _audit(emulator)
    r1 = start("r1")
    emulator.wait_until(lambda: _holder(emulator) == "r1", timeout=30, message=r1.output())
    r2 = start("r2")
    pair = {"r1": r1, "r2": r2}
    _, renew_deadline, _ = TIMING

    stop = threading.Event()
    samples: list[bool] = []
    faults: dict[str, int] = {}
    bound_total = [0]

    def sample() -> None:
        """A leader exists when the Lease's holder is a live replica whose fence is open, i.e.
        within the renew deadline of the renewTime it last wrote (one machine, one clock)."""
        while not stop.wait(0.02):
            spec = _lease_spec(emulator)
            holder = str(spec.get("holderIdentity") or "")
            renewed = dt.datetime.fromisoformat(str(spec.get("renewTime")))
            fresh = dt.datetime.now(dt.UTC) - renewed < dt.timedelta(seconds=renew_deadline)
            samples.append(holder in pair and pair[holder].alive and fresh)

    def inject() -> None:
        rng = random.Random(15)
        while not stop.wait(rng.uniform(1.5, 3.5)):
            kind = rng.choice(["429", "500", "503", "504", "409", "latency"])
            count = rng.randint(1, 3)
            if kind == "409":
                emulator.fail_next_write(409, resource="leases", count=count)
            elif kind == "latency":
                emulator.add_latency(0.3, resource="leases", count=count)
            else:
                verbs = rng.choice(["get", "update", None])
                emulator.fail_next(int(kind), verbs=verbs, resource="leases", count=count)
            faults[kind] = faults.get(kind, 0) + count

    def workload() -> None:
        """Pods keep arriving and leaving, so the leader writes all the time."""
        wave = 0
        while not stop.is_set():
            names = [f"w{wave}-{i}" for i in range(4)]
            for name in names:
                emulator.create(pod(name, legacy_gpus=1, gpumem=3000))
            deadline = time.monotonic() + 10
            while len(bound_pods(emulator, names)) < len(names) and time.monotonic() < deadline:
                if stop.wait(0.1):
                    break
            bound_total[0] += len(bound_pods(emulator, names))
            for name in names:
                emulator.delete("pods", name, "default")
            emulator.finish_pod_deletions()
            wave += 1

    threads = [threading.Thread(target=f, daemon=True) for f in (sample, inject, workload)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        time.sleep(60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=20)
    elapsed = time.monotonic() - began
    emulator.faults.clear()
    availability = sum(samples) / len(samples)
    lease = _lease_spec(emulator)
    print(
        f"\nleader fault run: {elapsed:.0f} s, {sum(faults.values())} Lease faults "
        f"{dict(sorted(faults.items()))}, leader present {availability:.2%} of "
        f"{len(samples)} samples, leader transitions {lease.get('leaseTransitions')}, "
        f"{len(audit.writes)} controller writes audited, {len(audit.violations())} from a "
        f"non-holder, {bound_total[0]} pods bound, replicas alive {r1.alive}/{r2.alive}"
    )
    assert r1.alive, r1.output()
    assert r2.alive, r2.output()
    assert audit.violations() == []
    assert availability >= 0.99
    assert sum(faults.values()) >= 20
    assert audit.writes, "the leader wrote nothing: the check would be empty"
    assert bound_total[0] >= 20
    assert check_invariants(emulator) == []
    assert "could not" in r1.output() + r2.output(), "the API errors were not logged"
    assert (_stop(r1), _stop(r2)) == (0, 0)


# --------------------------------------------------------------------------- a paused leader


def test_a_leader_paused_past_its_lease_sends_nothing_after_it_resumes(
    emulator: Emulator, claim_controller: ResourceClaimController, replicas: Callable[..., Replica]
) -> None:
    start = replicas
    seed_cluster(emulator)
    audit = _audit(emulator)
    # A slow client (5 requests/s) keeps writes queued behind the rate limiter at all times.
    r1 = start("r1", "--qps", "5", "--burst", "1")
    emulator.wait_until(lambda: _holder(emulator) == "r1", timeout=30, message=r1.output())
    r2 = start("r2")
    names = [f"p{i}" for i in range(16)]
    for name in names:
        emulator.create(pod(name, legacy_gpus=1, gpumem=2000))
    emulator.wait_until(lambda: len(bound_pods(emulator)) >= 2, timeout=30, message=r1.output())
    assert len(bound_pods(emulator)) < len(names), "r1 finished before it could be paused"

    r1.proc.send_signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    emulator.wait_until(lambda: _holder(emulator) == "r2", timeout=20, message=r2.output())
    took_over_at = time.monotonic()
    time.sleep(1.0)
    r1.proc.send_signal(signal.SIGCONT)
    resumed_at = time.monotonic()
    code = r1.proc.wait(timeout=20)
    emulator.wait_until(
        lambda: len(bound_pods(emulator, names)) == len(names),
        timeout=60,
        message=f"bound: {bound_pods(emulator)}",
    )
    print(
        f"\npaused leader: paused {resumed_at - paused_at:.1f} s, standby took over after "
        f"{took_over_at - paused_at:.1f} s, old leader exited {code} "
        f"{time.monotonic() - resumed_at:.1f} s after resuming, its writes after the takeover: "
        f"{len(audit.by('r1', since=took_over_at))}"
    )
    assert code == 1, r1.output()
    output = r1.output()
    assert "stopped leading" in output
    assert "refusing writes" in output, "no queued write met the fence"
    assert audit.by("r1", since=took_over_at) == []
    assert audit.violations() == []
    assert r2.alive
    assert check_invariants(emulator) == []
    assert _stop(r2) == 0

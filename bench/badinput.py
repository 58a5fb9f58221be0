"""The bad-input run (``make bench-badinput``): each kind of bad input, sent to the real
processes, gets its clear message where the user looks, and changes nothing else.

Loopback only, bounded. In this process: the API emulator (it validates and refuses at
admission as the API server does) and a *kubelet* (gRPC, as the kubelet). As child
processes: one ``biaxial controller`` (``--decision-timeout``, default 1 s here so the
deadline case is short) and one ``biaxial kubelet-plugin`` on its own node (fake T4 GPUs), next
to two nodes whose slices are written directly.

Each case sends its bad input and waits for the message where a user would look for it: the
API's answer (what ``kubectl apply`` prints), the pod's ``PodScheduled`` condition and its
``FailedScheduling`` Event, the kubelet's Prepare error, the plugin's readiness and its Node
Event. An ordinary pod (a 1 GiB share) is created right after the bad pod (queued behind
it), or right after the refusal, and must bind; what the bad input touched is checked
unchanged: no claim of a refused pod allocated, reserved or finalized, no object
stored that the API refused, the controller still running. At the end: the invariant checker
of the test suite, and the controller's peak memory against the chart's limit.

Printed: per case, where the message appeared, how long it took, the message (shortened), the
ordinary pod's time to binding after it, and whether anything else changed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.cel import growth_bomb
from bench.processes import ROOT, controller_argv, free_port, peak_rss_mib, wait_ready
from tests.emulator import Emulator
from tests.emulator.errors import ApiStatusError
from tests.integration.controller_env import (
    DRIVER,
    check_invariants,
    node_object,
    pod,
    pod_condition,
    pod_events,
    resource_claim,
    seed_cluster,
)
from tests.integration.fake_kubelet import FakeKubelet, PluginProcess, http_get, wait
from tests.unit.builders import gpu_config

JSON = dict[str, Any]
PLUGIN_NODE = "gpu-plugin"
#: Nodes whose slices are written directly: 24 devices, so the selector that only the
#: deadline stops (about 0.13 s per device) runs well past a 1 s deadline.
NODES = {"gpu-t4": "t4x4", "gpu-a10g": "a10gx4", "gpu-h100": "h100-80gbx8"}
EVENTS_NS = "gpu-system"
D = f'device.attributes["{DRIVER}"]'


@dataclass
class Outcome:
    case: str
    where: str
    seconds: float
    message: str
    ordinary_s: float | None = None
    unchanged: bool = True
    notes: list[str] = field(default_factory=list)


class Run:
    """The processes and the cases' shared steps."""

    def __init__(self, emulator: Emulator, controller: subprocess.Popen[bytes], args: Any) -> None:
        self.emulator = emulator
        self.controller = controller
        self.args = args
        self.serial = 0
        self.refused_claims: list[str] = []

    def api_refusal(self, obj: JSON) -> str:
        """The API's answer to creating ``obj`` (it must be refused, nothing stored)."""
        try:
            self.emulator.create(obj)
        except ApiStatusError as exc:
            name = obj["metadata"]["name"]
            stored = self.emulator.get(obj["kind"], name, obj["metadata"].get("namespace"))
            if stored is not None:
                raise AssertionError(f"{name} was refused but stored") from exc
            return str(exc)
        raise AssertionError(f"{obj['metadata']['name']} was admitted")

    def pod_refusal(self, name: str, needle: str, timeout: float = 30.0) -> str:
        """The pod's PodScheduled=False message once it contains ``needle``; its Event must
        carry the same message."""

        def condition() -> str | None:
            c = pod_condition(self.emulator, name)
            if c and c["status"] == "False" and needle in c["message"]:
                return str(c["message"])
            return None

        message = wait(condition, timeout, f"pod {name}'s condition with {needle!r}")
        wait(
            lambda: ("FailedScheduling", message) in pod_events(self.emulator, name),
            10,
            f"pod {name}'s FailedScheduling event",
        )
        return str(message)

    def ordinary_pod(self) -> float:
        """Seconds from creating an ordinary pod (a 1 GiB share) to its binding."""
        self.serial += 1
        name = f"ordinary-{self.serial}"
        self.emulator.create(resource_claim(name, memory="1Gi"))
        started = time.monotonic()
        self.emulator.create(pod(name, claim=name))
        wait(
            lambda: (self.emulator.get("pods", name, "default") or {})["spec"].get("nodeName"),
            30,
            f"{name} bound",
        )
        return time.monotonic() - started

    def claim_untouched(self, name: str) -> bool:
        claim = self.emulator.get("resourceclaims", name, "default") or {}
        status = claim.get("status") or {}
        finalizers = (claim.get("metadata") or {}).get("finalizers") or []
        return not status.get("allocation") and not status.get("reservedFor") and not finalizers


# --------------------------------------------------------------------------- the cases


def claim_with(name: str, **exactly: Any) -> JSON:
    claim = resource_claim(name)
    claim["spec"]["devices"]["requests"][0]["exactly"].update(exactly)
    return claim


def pod_case(run: Run, case: str, claim: JSON | None, p: JSON, needle: str) -> Outcome:
    if claim is not None:
        run.emulator.create(claim)
        run.refused_claims.append(claim["metadata"]["name"])
    started = time.monotonic()
    run.emulator.create(p)
    ordinary_s = run.ordinary_pod()  # created right after the bad pod, queued behind it
    timeout = 10 * run.args.decision_timeout + 20
    message = run.pod_refusal(p["metadata"]["name"], needle, timeout)
    outcome = Outcome(case, "pod condition + event", time.monotonic() - started, message)
    outcome.ordinary_s = ordinary_s
    return outcome


def api_case(run: Run, case: str, obj: JSON, needle: str) -> Outcome:
    started = time.monotonic()
    message = run.api_refusal(obj)
    if needle not in message:
        raise AssertionError(f"{case}: {needle!r} not in {message!r}")
    return Outcome(case, "API error (kubectl)", time.monotonic() - started, message)


#: Within the cost limit (its estimate ~290,000), but 9,999 regular-expression matches per
#: device (about 0.13 s): only the deadline stops it over many devices.
LONG_SELECTOR = f"lists.range(9999).exists(i, {D}.productName.matches('.*Z.*[0-9]$'))"


def cases(run: Run) -> Iterator[tuple[str, Callable[[], Outcome]]]:
    """(name, run it): refused by the API (the object, a word of the message), then refused
    on the pod (its claim or None, the pod, a phrase of the message), then the rest."""
    refused_by_api: list[tuple[str, JSON, str]] = [
        ("invalid CEL in a claim", _selecting("bad-cel", f"{D}.index >"), "compil"),
        ("selector over the cost limit", _selecting("bomb-admitted", growth_bomb(8)), "cost"),
        ("malformed claim (count: -1)", claim_with("negative", count=-1), "count"),
        ("malformed pod (gpumem: lots)", _legacy_pod("lots", gpumem="lots"), "gpumem"),
    ]
    for name, obj, needle in refused_by_api:
        yield name, functools.partial(api_case, run, name, obj, needle)
    refused_on_pod: list[tuple[str, JSON | None, JSON, str]] = [
        (
            "unknown DeviceClass",
            resource_claim("no-class", device_class="no-such-class"),
            pod("no-class", claim="no-class"),
            "DeviceClass 'no-such-class' does not exist",
        ),
        ("missing claim", None, pod("no-claim", claim="does-not-exist"), "does not exist"),
        (
            "unknown policy",
            None,
            pod("bad-policy", legacy_gpus=1, annotations={"biaxial.dev/gpu-policy": "tight"}),
            "biaxial.dev/gpu-policy",
        ),
        (
            "unknown annotation (typo)",
            None,
            pod("typo", legacy_gpus=1, annotations={"biaxial.dev/node-polciy": "spread"}),
            "did you mean",
        ),
        (
            "unknown sharing strategy",
            _with_config(resource_claim("bogus-sharing", memory="1Gi"), "timeslicing"),
            pod("bogus-sharing", claim="bogus-sharing"),
            'unknown value "timeslicing"',
        ),
        (
            "a share weakening the class policy",
            _with_config(resource_claim("unlimited", memory="4Gi"), "none"),
            pod("unlimited", claim="unlimited"),
            "is not allowed for request 'gpu' by the DeviceClass's sharing policy",
        ),
        (
            "impossible request (33 GPUs)",
            claim_with("many", count=33),
            pod("many", claim="many"),
            "nodes are available",
        ),
        (
            "impossible gpumem",
            None,
            pod("huge", legacy_gpus=1, gpumem=400_000),
            "larger than every GPU",
        ),
        (
            "CEL runtime error",
            _selecting("no-attr", f"{D}.nosuch == 1"),
            pod("no-attr", claim="no-attr"),
            "CEL",
        ),
        (
            "CEL selector only the deadline stops",
            _selecting("long", LONG_SELECTOR),
            pod("long", claim="long"),
            "deadline",
        ),
    ]
    refused_on_pod += [
        (
            "claim nested 5,000 deep (accepted by the API)",
            _deep_claim("deep", 5_000),
            pod("deep", claim="deep"),
            "nest deeper than 64 levels",
        ),
        (
            "200 KB annotation value",
            None,
            pod("huge-note", legacy_gpus=1, annotations={"biaxial.dev/gpu-policy": "x" * 200_000}),
            "(200000 characters)",
        ),
    ]
    for name, claim, p, needle in refused_on_pod:
        yield name, functools.partial(pod_case, run, name, claim, p, needle)
    yield "commit refused for good (422)", functools.partial(_refused_commit, run)
    yield "10 pods on one claim in one burst", functools.partial(_shared_burst, run, 10)
    yield "CEL growth bomb (stored class)", functools.partial(_stored_bomb, run)
    yield "corrupt checkpoint", functools.partial(_corrupt_checkpoint, run)


def _selecting(name: str, expression: str) -> JSON:
    return claim_with(name, selectors=[{"cel": {"expression": expression}}])


def _legacy_pod(name: str, *, gpumem: str) -> JSON:
    p = pod(name, legacy_gpus=1)
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = gpumem
    return p


def _with_config(claim: JSON, strategy: str) -> JSON:
    claim["spec"]["devices"]["config"] = [{"requests": ["gpu"], **gpu_config(strategy)}]
    return claim


def _deep_claim(name: str, levels: int) -> JSON:
    """A claim whose opaque parameters nest ``levels`` deep (``[[...]]``: 2 bytes a level,
    within the API's 10 KiB): the API server accepts it; before, it stopped the controller."""
    nested: Any = []
    for _ in range(levels - 1):
        nested = [nested]
    claim = resource_claim(name)
    claim["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "other.example.com", "parameters": {"p": nested}}}
    ]
    return claim


def _refused_commit(run: Run) -> Outcome:
    """The API server refuses the claim's status write for good (422): the pod says so and is
    parked (not retried every backoff period); the claim is left as it was.

    The fault answers the next claim update, whoever sends it: the ordinary pod is created only
    once the refused pod has reported, so that the write refused is this pod's (created at
    once, the ordinary pod's write could come first under load and be the one refused)."""
    name = "refused-write"
    case = "commit refused for good (422)"
    run.emulator.fail_next(
        422,
        verbs="update",
        resource="resourceclaims",
        reason="Invalid",
        message=f'ResourceClaim.resource.k8s.io "{name}" is invalid: status: Invalid value',
    )
    run.emulator.create(resource_claim(name, memory="1Gi"))
    run.refused_claims.append(name)
    started = time.monotonic()
    run.emulator.create(pod(name, claim=name))
    timeout = 10 * run.args.decision_timeout + 20
    message = run.pod_refusal(name, "refused this pod's placement (422 Invalid)", timeout)
    outcome = Outcome(case, "pod condition + event", time.monotonic() - started, message)
    writes = len(run.emulator.requests_for(method="PUT", resource="resourceclaims"))
    outcome.ordinary_s = run.ordinary_pod()  # time passes with other work: not sent again
    again = len(run.emulator.requests_for(method="PUT", resource="resourceclaims")) - writes - 1
    outcome.notes.append(f"status writes for the refused pod after its report: {again}")
    outcome.unchanged = outcome.unchanged and again == 0
    return outcome


def _shared_burst(run: Run, count: int) -> Outcome:
    """A claim, then ``count`` pods that share it, created in one burst: all bound, on the
    claim's one device, all reserved (before, one pod stayed Pending with no condition)."""
    claim = f"shared-{count}"
    run.emulator.create(resource_claim(claim, memory="1Gi"))
    names = [f"{claim}-p{i}" for i in range(count)]
    started = time.monotonic()
    for name in names:
        run.emulator.create(pod(name, claim=claim))

    def placed() -> set[str] | None:
        nodes = {
            (run.emulator.get("pods", n, "default") or {}).get("spec", {}).get("nodeName")
            for n in names
        }
        return None if None in nodes else nodes

    nodes = wait(placed, 60, f"{count} pods on {claim} bound")
    seconds = time.monotonic() - started
    stored = run.emulator.get("resourceclaims", claim, "default") or {}
    reserved = {r["name"] for r in (stored.get("status") or {}).get("reservedFor") or ()}
    unchanged = reserved == set(names) and len(nodes) == 1
    message = f"{count}/{count} bound on one node, all reserved on the one allocation"
    return Outcome(f"{count} pods on one claim in one burst", "all bound", seconds, message,
                   unchanged=unchanged)  # fmt: skip


def _stored_bomb(run: Run) -> Outcome:
    """The growth bomb in a DeviceClass an older API server stored (today's estimate refuses
    it when written): the actual-cost limit stops it at run time."""
    run.emulator.create_stored(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "bomb.example.com"},
            "spec": {"selectors": [{"cel": {"expression": growth_bomb(8)}}]},
        }
    )
    return pod_case(
        run,
        "CEL growth bomb (stored class)",
        resource_claim("bomb", device_class="bomb.example.com"),
        pod("bomb", claim="bomb"),
        "actual cost limit exceeded",
    )


def _corrupt_checkpoint(run: Run) -> Outcome:
    """A torn checkpoint on the plugin's node: readiness fails (not liveness), a Node Event
    says so, Prepare is refused with the reason, Unprepare of a held claim still proceeds."""
    plugin: PluginProcess = run.args.plugin
    kubelet: FakeKubelet = run.args.kubelet
    dra = kubelet.dra("v1")
    base = f"http://127.0.0.1:{run.args.plugin_port}"
    held = _placed(run, "held")
    newcomer = _placed(run, "newcomer")
    if dra.prepare([held])[held[1]].error:
        raise AssertionError("held claim not prepared")
    checkpoint = plugin.state_dir / "checkpoint.json"
    good = checkpoint.read_bytes()
    checkpoint.write_bytes(good[:-40])
    started = time.monotonic()
    status, text = wait(
        lambda: (r := http_get(f"{base}/readyz"))[0] == 503 and r, 30, "plugin not ready"
    )
    ready_s = time.monotonic() - started
    event = wait(lambda: _node_event(run.emulator, "CheckpointUnreadable"), 30, "node event")
    refused = dra.prepare([newcomer])[newcomer[1]].error
    notes = [f"readyz {status} after {ready_s:.2f} s", f"Node event: {event['message']}"]
    notes.append(f"Prepare refused: {refused}")
    unprepared = dra.unprepare([held]) == {held[1]: ""}
    notes.append(f"Unprepare of the held claim: {'done' if unprepared else 'REFUSED'}")
    healthy = http_get(f"{base}/healthz")[0] == 200
    notes.append(f"liveness: {'ok' if healthy else 'FAILING'}")
    checkpoint.write_bytes(good)  # the runbook's repair
    wait(lambda: http_get(f"{base}/readyz")[0] == 200, 30, "plugin ready again")
    outcome = Outcome(
        "corrupt checkpoint",
        "readiness + Node event + Prepare error",
        time.monotonic() - started,
        str(event["message"]),
        notes=notes,
    )
    outcome.unchanged = (
        unprepared and healthy and "devices cannot be proven free" in refused and text != ""
    )
    return outcome


def _placed(run: Run, name: str) -> tuple[str, str, str]:
    """A whole-GPU claim for a pod pinned to the plugin's node, placed by the controller;
    what the kubelet sends for it."""
    claim = run.emulator.create(resource_claim(name))
    pinned = pod(name, claim=name)
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": PLUGIN_NODE}
    run.emulator.create(pinned)
    wait(
        lambda: (run.emulator.get("pods", name, "default") or {})["spec"].get("nodeName"),
        30,
        f"{name} bound",
    )
    return ("default", str(claim["metadata"]["uid"]), name)


def _node_event(emulator: Emulator, reason: str) -> JSON | None:
    for e in emulator.list("events", namespace=EVENTS_NS):
        involved = e["involvedObject"]
        if involved["kind"] == "Node" and involved["name"] == PLUGIN_NODE and e["reason"] == reason:
            return dict(e)
    return None


# --------------------------------------------------------------------------- the run


def memory_limit_mib() -> float:
    values = yaml.safe_load((ROOT / "deploy/helm/biaxial/values.yaml").read_text())
    text = str(values["controller"]["resources"]["limits"]["memory"])
    match = re.fullmatch(r"(\d+)(Mi|Gi)", text)
    assert match is not None, text
    return int(match[1]) * {"Mi": 1, "Gi": 1024}[match[2]]


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bxb", dir="/tmp"))
    emulator = Emulator().start()
    outcomes: list[Outcome] = []
    controller: subprocess.Popen[bytes] | None = None
    plugin: PluginProcess | None = None
    kubelet: FakeKubelet | None = None
    peak = 0.0
    try:
        seed_cluster(emulator, NODES)  # nodes, their slices, the shipped classes
        emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": EVENTS_NS}})
        emulator.create(node_object(PLUGIN_NODE))
        kubeconfig = emulator.write_kubeconfig(root / "kubeconfig")
        args.plugin_port = free_port()
        lib = root / "libvgpu.so"
        lib.write_bytes(b"")
        plugin = args.plugin = PluginProcess(
            root,
            kubeconfig,
            node=PLUGIN_NODE,
            extra=[
                "--metrics-port", str(args.plugin_port), "--metrics-address", "127.0.0.1",
                "--event-namespace", EVENTS_NS, "--hami-core-library", str(lib),
                "--reconcile-seconds", "0.5",
            ],
        ).start(timeout_s=60)  # fmt: skip
        kubelet = args.kubelet = FakeKubelet(plugin.registration_socket)
        kubelet.notify(registered=True)
        port = free_port()
        with (root / "controller.log").open("ab") as log:
            controller = subprocess.Popen(
                controller_argv(
                    kubeconfig, port, "--no-leader-elect",
                    "--decision-timeout", str(args.decision_timeout),
                ),
                cwd=ROOT,
                stdout=log,
                stderr=log,
            )  # fmt: skip
        wait_ready(port)
        run = Run(emulator, controller, args)
        run.ordinary_pod()  # warm: the engine is built
        for name, case in cases(run):
            try:
                outcome = case()
            except (AssertionError, TimeoutError) as exc:
                outcome = Outcome(name, "NOT SEEN", 0.0, str(exc), unchanged=False)
            if outcome.ordinary_s is None:
                outcome.ordinary_s = run.ordinary_pod()
            if controller.poll() is not None:
                outcome.unchanged = False
                outcome.notes.append(f"controller exited with {controller.returncode}")
            peak = max(peak, peak_rss_mib(controller.pid))
            outcomes.append(outcome)
            print(f"... {name}: {outcome.where}, {outcome.seconds:.2f} s", file=sys.stderr)
        touched = [c for c in run.refused_claims if not run.claim_untouched(c)]
        violations = check_invariants(emulator)
        peak = max(peak, peak_rss_mib(controller.pid))
        return {
            "decision_timeout_s": args.decision_timeout,
            "cases": [o.__dict__ for o in outcomes],
            "refused_claims_touched": touched,
            "invariant_violations": violations,
            "controller_alive": controller.poll() is None,
            "controller_peak_rss_mib": round(peak),
            "controller_memory_limit_mib": memory_limit_mib(),
        }
    finally:
        if kubelet is not None:
            kubelet.close()
        if controller is not None and controller.poll() is None:
            controller.send_signal(signal.SIGTERM)
            try:
                controller.wait(20)
            except subprocess.TimeoutExpired:
                controller.kill()
        if plugin is not None:
            with contextlib.suppress(Exception):
                plugin.stop()
        emulator.stop()
        if args.keep:
            print(f"logs kept in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.badinput", description=__doc__)
    parser.add_argument("--decision-timeout", type=float, default=1.0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args(argv)
    report = run_all(args)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print(report)
    ok = (
        all(c["unchanged"] and c["where"] != "NOT SEEN" for c in report["cases"])
        and not report["refused_claims_touched"]
        and not report["invariant_violations"]
        and report["controller_alive"]
        and report["controller_peak_rss_mib"] < report["controller_memory_limit_mib"]
    )
    return 0 if ok else 1


def _print(report: dict[str, Any]) -> None:
    print(f"decision deadline: {report['decision_timeout_s']:g} s (--decision-timeout)")
    print("| bad input | where the user sees it | s to message | message | ordinary pod created "
          "right after: s to binding | nothing else changed |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for c in report["cases"]:
        message = c["message"].replace("|", "/").replace("\n", " ")
        if len(message) > 140:
            message = message[:137] + "..."
        ordinary = "-" if c["ordinary_s"] is None else f"{c['ordinary_s']:.2f}"
        print(
            f"| {c['case']} | {c['where']} | {c['seconds']:.2f} | {message} | {ordinary} "
            f"| {'yes' if c['unchanged'] else 'NO'} |"
        )
        for note in c["notes"]:
            print(f"|  | {note[:160]} |  |  |  |  |")
    print(f"refused pods' claims touched: {len(report['refused_claims_touched'])}")
    print(f"invariant violations: {len(report['invariant_violations'])}")
    print(
        f"controller alive: {report['controller_alive']}; peak RSS "
        f"{report['controller_peak_rss_mib']} MiB (limit {report['controller_memory_limit_mib']:g} "
        "MiB)"
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""The engine's feed (controller.feed): cache events and this controller's decisions reach the
decision engine through its interface only. Our decisions are assumed, never re-read from the
pending JSON the loop shows for its commit; when the written claims and the binding show up
they are recognised (nothing moves); a failed write is forgotten; only nodes, slices and
classes make the engine rebuild, and an engine kept up to date equals one built from the
caches."""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest

from controller.cache import ClusterCache
from controller.feed import EngineFeed
from controller.metrics import Metrics
from driver.api.claims import AllocationResult
from driver.api.ids import DeviceID, DeviceName, DriverName, PoolName
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement
from driver.scheduling.policy import PolicyDefaults
from tests.unit.builders import DRIVER, GPU_CLASS, claim, device_class, gpu, node, slice_, taint
from tests.unit.controller_fakes import FakeApi

JSON = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]


def versioned(obj: JSON, rv: int, **meta: Any) -> JSON:
    out = copy.deepcopy(obj)
    out["metadata"] = {**out["metadata"], "resourceVersion": str(rv), **meta}
    return out


def pod(name: str, *, claim_name: str | None = None, gpus: int = 0) -> JSON:
    container: JSON = {"name": "c", "resources": {"requests": {"cpu": "1"}}}
    if gpus:
        container["resources"]["limits"] = {"nvidia.com/gpu": gpus, "nvidia.com/gpumem": "3000"}
    spec: JSON = {"schedulerName": "biaxial", "containers": [container]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    meta = {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Setup:
    def __init__(self) -> None:
        self.cache = ClusterCache(FakeApi())
        self.changes = 0
        self.feed = EngineFeed(
            self.cache,
            PolicyDefaults(),
            Metrics(),
            driver_name=DRIVER,
            on_cluster_change=self._changed,
        )
        self.cache.classes.apply(
            "ADDED",
            versioned(device_class(GPU_CLASS, extended_resource_name="nvidia.com/gpu"), 1),
        )
        for name in ("a", "b"):
            self.cache.nodes.apply("ADDED", versioned(node(name), 1))
            devices = [gpu(i, shared=True) for i in range(2)]
            self.cache.slices.apply(
                "ADDED", versioned(slice_(f"{name}-gpus", node=name, devices=devices), 1)
            )

    def _changed(self) -> None:
        self.changes += 1

    def decide(self, p: JSON, keys: tuple[str, ...] = ()) -> Placement:
        claims = [self.feed.parsed.claim(k, raw) for k in keys if (raw := self.cache.claims.get(k))]
        decision = self.feed.engine().decide(p, claims)
        assert isinstance(decision, Placement), decision
        return decision

    def held(self) -> set[str]:
        allocated = self.feed.engine().state().allocated
        return {
            f"{pool}/{device}"
            for pool in ("a", "b")
            for device in ("gpu-0", "gpu-1")
            if allocated.is_allocated(
                DeviceID(DriverName(DRIVER), PoolName(pool), DeviceName(device))
            )
        }


def with_allocation(raw: JSON, allocation: AllocationResult, rv: int) -> JSON:
    out = versioned(raw, rv)
    out["status"] = {"allocation": allocation.to_api()}
    return out


def test_our_decision_is_assumed_and_recognised_when_written() -> None:
    s = Setup()
    raw_claim = versioned(
        claim("p-gpu", uid="c1").request("r", capacity={"memory": "1Gi"}).json(), 1
    )
    s.cache.claims.apply("ADDED", raw_claim)
    p = pod("p", claim_name="p-gpu")
    s.cache.pods.apply("ADDED", p)
    engine = s.feed.engine()
    decision = s.decide(p, ("default/p-gpu",))
    s.feed.assume(decision, p)
    assert s.feed.assumed("uid-p")
    before = engine.state()
    assert len(s.held()) == 1
    # The loop shows the claim as pending for its commit: the engine never reads that JSON
    # (here deliberately holding other devices).
    bogus = claim("p-gpu").holding("gpu-0", "gpu-1", pool="b").json()
    s.cache.overlay.set_pending("default/p-gpu", versioned(bogus, 1))
    assert engine.state() == before
    # Our write returns, then the informer shows it, then the binding: nothing moves.
    counted = engine.snapshot
    written = with_allocation(raw_claim, decision.claims[0].allocation, 2)
    s.cache.overlay.assume(written)
    s.cache.claims.apply("MODIFIED", written)
    s.cache.pods.apply("MODIFIED", versioned(p, 2) | {"spec": {**p["spec"], "nodeName": "a"}})
    assert engine.stats.landed == 2
    assert s.feed.engine().snapshot is counted
    assert engine.state() == before
    assert not s.feed.assumed("uid-p")
    assert s.feed.consistent()
    assert s.feed.rebuilds == 1


def test_a_failed_write_is_forgotten() -> None:
    s = Setup()
    p = pod("p", gpus=1)
    s.cache.pods.apply("ADDED", p)
    s.feed.assume(s.decide(p), p)
    assert len(s.held()) == 1
    s.feed.forget("uid-p")
    assert s.held() == set()
    assert s.feed.engine().state().usage == {}
    assert s.feed.consistent()


def assume_legacy_pod(s: Setup, name: str) -> tuple[JSON, AllocationResult]:
    """Decide and assume a pod asking for ``nvidia.com/gpu``: its bridge claim as the
    placement has it, and the allocation decided for it."""
    p = pod(name, gpus=1)
    s.cache.pods.apply("ADDED", p)
    decision = s.decide(p)
    assert decision.bridge is not None
    assert decision.bridge_allocation is not None
    s.feed.assume(decision, p)
    return decision.bridge.claim, decision.bridge_allocation


def test_the_bridge_claim_is_recognised_when_it_is_created_and_written() -> None:
    s = Setup()
    bridge, allocation = assume_legacy_pod(s, "legacy")
    engine = s.feed.engine()
    before = engine.state()
    created = versioned(bridge, 5, name="legacy-extended-resources-x", uid="b1")
    s.cache.claims.apply("ADDED", created)
    assert s.feed.consistent()
    s.cache.overlay.assume(with_allocation(created, allocation, 6))
    assert engine.stats.landed == 1
    assert engine.state() == before
    assert s.feed.consistent()


def test_the_bridge_claims_allocation_is_not_parsed_from_its_echo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model the decision made for a pod's bridge claim (whose name the API server
    generates) serves the claim's echo when it carries an equal copy; an echo that differs is
    parsed (and a placement that was not written leaves nothing behind)."""
    parses: list[JSON] = []
    parse = AllocationResult.from_api

    def counting(source: JSON, *args: Any) -> AllocationResult:
        parses.append(source)
        return parse(source, *args)

    s = Setup()
    bridge, allocation = assume_legacy_pod(s, "legacy")
    monkeypatch.setattr(AllocationResult, "from_api", staticmethod(counting))
    created = versioned(bridge, 5, name="legacy-extended-resources-x", uid="b1")
    written = with_allocation(created, allocation, 6)
    s.cache.claims.apply("MODIFIED", written)
    assert parses == []
    found = s.feed.parsed.allocation("default/legacy-extended-resources-x", written)
    assert found == allocation == parse(written["status"]["allocation"])
    assert s.feed.consistent()
    # Another pod's bridge claim, written with an allocation other than the one decided:
    # parsed, not taken from the decision.
    bridge, allocation = assume_legacy_pod(s, "other")
    claim_q = versioned(bridge, 7, name="other-extended-resources-y", uid="b2")
    changed = with_allocation(claim_q, allocation, 8)
    result = changed["status"]["allocation"]["devices"]["results"][0]
    result["device"] = "gpu-1" if result["device"] == "gpu-0" else "gpu-0"
    s.cache.claims.apply("MODIFIED", changed)
    assert len(parses) == 1
    assert s.feed.parsed.allocation("default/other-extended-resources-y", changed) == parse(
        changed["status"]["allocation"]
    )
    # A placement forgotten (its writes failed) keeps nothing for its bridge claim.
    assume_legacy_pod(s, "failed")
    s.feed.forget("uid-failed")
    assert s.feed.parsed._bridges == {}


def test_the_cluster_reaches_the_engine_and_only_class_changes_rebuild() -> None:
    s = Setup()
    s.feed.engine()
    changes, rebuilds = s.changes, s.feed.rebuilds
    foreign = versioned(claim("foreign").holding("gpu-0", pool="b").json(), 3)
    s.cache.claims.apply("ADDED", foreign)
    assert s.held() == {"b/gpu-0"}
    other = versioned(pod("other"), 4) | {"spec": {"nodeName": "b", "containers": []}}
    s.cache.pods.apply("ADDED", other)
    assert s.feed.engine().state().usage["b"].pods == 1
    heartbeat = versioned(node("b"), 5)
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    s.cache.nodes.apply("MODIFIED", heartbeat)
    assert s.feed.consistent()
    s.cache.claims.apply("DELETED", foreign)
    s.cache.pods.apply("DELETED", other)
    assert s.held() == set()
    assert (s.changes, s.feed.rebuilds) == (changes, rebuilds)
    s.cache.nodes.apply("MODIFIED", versioned(node("b", taints=[taint("t", value="v")]), 6))
    assert s.changes == changes + 1
    s.feed.engine()
    assert s.feed.rebuilds == rebuilds  # a node change re-files that node only
    assert s.feed.consistent()


def test_nothing_in_the_controller_touches_the_engines_internals() -> None:
    """The controller reaches the decision engine through its public interface only: every
    attribute it uses on an engine is one of these methods (none is assigned)."""
    interface = {
        name
        for name, value in vars(DecisionEngine).items()
        if not name.startswith("_") and callable(getattr(value, "__func__", value))
    }
    assert {"decide", "assume", "forget", "observe_allocation", "observe_pod"} <= interface
    used: dict[str, set[str]] = {}
    for path in sorted((ROOT / "controller").glob("*.py")):
        for found in ast.walk(ast.parse(path.read_text())):
            if isinstance(found, ast.Attribute) and ast.unparse(found.value).split(".")[-1] in {
                "engine",
                "_engine",
                "engine()",
                "DecisionEngine",
            }:
                used.setdefault(found.attr, set()).add(path.name)
    assert used, "the check would prove nothing"
    assert set(used) <= interface, {a: f for a, f in used.items() if a not in interface}
    internal = ("capacity_index", "tracker", "bounds", "classification")
    for path in sorted((ROOT / "controller").glob("*.py")):
        text = path.read_text()
        assert not any(f"driver.scheduling.{m}" in text for m in internal), path.name


def test_an_equal_allocation_is_parsed_once() -> None:
    """Each write of a held claim and its watch echo carry an equal copy of the allocation:
    the model parsed for the first serves them all; a different one is parsed afresh."""
    from controller.feed import Parsed
    from kubeapi import codec

    result = {"request": "gpu", "driver": "d", "pool": "p", "device": "gpu-0"}
    claim = {
        "metadata": {"name": "c"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    parsed = Parsed()
    first = parsed.allocation("ns/c", claim)
    assert first is not None
    assert parsed.allocation("ns/c", codec.loads(codec.dumps(claim))) is first
    other = codec.loads(codec.dumps(claim))
    other["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"
    changed = parsed.allocation("ns/c", other)
    assert changed is not None
    assert changed is not first
    assert changed.results[0].device == "gpu-1"


def test_an_allocation_this_controller_decided_is_not_parsed_from_its_echo() -> None:
    """The model the decision made serves the write's echo (an equal copy of its to_api());
    it equals what parsing the echo gives. An echo that differs is parsed."""
    from controller.feed import Parsed
    from driver.api.claims import AllocationResult
    from kubeapi import codec

    result = {
        "request": "gpu",
        "driver": "d",
        "pool": "p",
        "device": "gpu-0",
        "consumedCapacity": {"memory": "20Gi"},
    }
    selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "values": ["n"]}]}]}
    decided = AllocationResult.from_api(
        {"devices": {"results": [result]}, "nodeSelector": selector}
    )
    source = decided.to_api()
    parsed = Parsed()
    parsed.decided("ns/c", source, decided)
    echo = {"metadata": {"name": "c"}, "status": {"allocation": codec.loads(codec.dumps(source))}}
    found = parsed.allocation("ns/c", echo)
    assert found == decided
    assert found == AllocationResult.from_api(echo["status"]["allocation"])
    assert parsed.allocation("ns/c", echo) is found
    # A second decision equal to the first keeps the shared parts: strings interned, the
    # consumed capacities and node selector the first one's.
    again = AllocationResult.from_api(codec.loads(codec.dumps(source)))
    parsed.decided("ns/d", source, again)
    kept = parsed.allocation("ns/d", {"status": {"allocation": source}})
    assert kept == again
    assert kept is not None
    assert kept.results[0].device is found.results[0].device
    assert kept.results[0].consumed_capacity is found.results[0].consumed_capacity
    assert kept.node_selector is found.node_selector
    parsed.decided("ns/e", source, kept)  # all its parts shared already: kept as it is
    assert parsed.allocation("ns/e", {"status": {"allocation": source}}) is kept
    stamped_source = {**source, "allocationTimestamp": "2026-01-01T00:00:00Z"}
    stamped = parsed.allocation("ns/c", {"status": {"allocation": stamped_source}})
    assert stamped is not None
    assert stamped.allocation_timestamp == "2026-01-01T00:00:00Z"

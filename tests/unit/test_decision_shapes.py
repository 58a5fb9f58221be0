"""A pod's parsing taken from an equal pod's (``DecisionEngine.decide(signature=...)``), and a
bound pod's view taken from its assumption (``observe_pod``).

Replicas of one Deployment differ only in their names, UIDs and generated claims: the engine
keeps what it parsed of the first (scheduling facts, pod view, policies, legacy resources) by
the controller's pod signature (:func:`controller.equivalence.pod_signature`) and names it for
the next. These tests pin that a kept shape gives exactly what parsing gives: contexts field
by field, refusals in each pod's own words, engine changes that must not be crossed, and the
answers of the mixed benchmark's replica stream decided both ways. The pod this engine placed
comes back bound: it counts as what it was assumed as unless something the view reads changed.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench.report import answers_digest
from bench.scenarios import generate_mixed
from controller.equivalence import pod_signature
from driver.api.claims import DeviceClass, ResourceClaim
from driver.api.model import ResourceSlice
from driver.api.nodes import Node
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Decision, Placement, PodError
from driver.scheduling.podindex import ScheduledPod
from driver.structured.snapshot import ClusterSnapshot
from tests.unit.test_decision import engine, gpu_node, legacy_pod


def replica(name: str, **kwargs: Any) -> dict[str, Any]:
    pod = legacy_pod(name, **kwargs)
    pod["metadata"]["labels"] = {"app": "web"}
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "controller": True}
    ]
    pod["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "500m"}
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    return pod


def context_fields(eng: DecisionEngine, pod: dict[str, Any], signature: str | None) -> Any:
    ctx = eng._context(pod, (), signature)
    decided = eng._decided
    assert decided[0] is pod
    assert decided[1] == ctx.scheduled
    return (
        ctx.name,
        ctx.facts,
        ctx.scheduled,
        ctx.policies,
        ctx.legacy,
        ctx.legacy_resources,
        ctx.exempt,
        ctx.volumes,
        ctx.rules,
    )


def test_a_replica_gets_the_context_parsing_gives_it() -> None:
    eng = engine([gpu_node("a", 2), gpu_node("b", 2)])
    first, second = replica("web-x"), replica("web-y")
    second["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    signature = pod_signature(first, [])
    assert signature is not None
    assert signature == pod_signature(second, [])
    context_fields(eng, first, signature)  # kept
    assert len(eng._shapes) == 1
    got = context_fields(eng, second, signature)
    want = context_fields(eng, second, None)
    assert got == want
    assert got[0] == "default/web-y"
    assert got[4].pod_name == "default/web-y"
    assert got[2].uid == "uid-web-y"
    assert got[2].name == "web-y"
    assert got[2].terminating


def test_pods_that_differ_get_their_own_context() -> None:
    eng = engine([gpu_node("a", 2)])
    first = replica("web-x", node_policy="binpack")
    other = replica("web-y", node_policy="spread")
    for pod in (first, other):
        context_fields(eng, pod, pod_signature(pod, []))
    assert len(eng._shapes) == 2
    got = context_fields(eng, other, pod_signature(other, []))
    assert got == context_fields(eng, other, None)
    assert got[3] != context_fields(eng, first, None)[3]


def test_a_kept_shape_is_not_used_across_a_change_of_classes_or_gpu_memory() -> None:
    eng = engine([gpu_node("a", 2)])
    pod = replica("web-x", gpumem=8000)
    signature = pod_signature(pod, [])
    context_fields(eng, pod, signature)
    kept = eng._shapes[signature]
    # A bigger GPU moves the largest GPU memory the legacy parsing checks gpumem against.
    n, s = gpu_node("b", 2, memory="80Gi")
    eng.observe_node("b", Node.from_api(n))
    eng.observe_slice("b-slice", ResourceSlice.from_api(s))
    eng.sync()
    assert eng._shapes[signature].max_gpu_memory != eng._max_gpu_memory
    later = replica("web-y", gpumem=8000)
    assert context_fields(eng, later, signature) == context_fields(eng, later, None)
    assert eng._shapes[signature] is not kept


def test_no_shape_is_kept_for_volumes_the_rules_read_or_an_outsized_signature() -> None:
    eng = engine([gpu_node("a", 2)])
    disk = replica("web-x")
    disk["spec"]["volumes"] = [{"name": "d", "gcePersistentDisk": {"pdName": "pd"}}]
    plain = replica("web-y")
    plain["metadata"]["annotations"]["note"] = "x" * (64 * 1024)
    for pod in (disk, plain):
        signature = pod_signature(pod, [])
        assert signature is not None
        assert context_fields(eng, pod, signature) == context_fields(eng, pod, None)
    assert not eng._shapes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["spec"].__setitem__("tolerations", [{"operator": "Nope"}]), "operator"),
        (
            lambda p: p["metadata"]["annotations"].__setitem__("biaxial.dev/gpu-policy", "x"),
            "unknown policy 'x'",
        ),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["limits"].__setitem__(
                "nvidia.com/gpumem", "999999999"
            ),
            "gpumem",
        ),
    ],
)
def test_malformed_replicas_are_refused_each_in_its_own_words(change: Any, message: str) -> None:
    eng = engine([gpu_node("a", 2)])
    pods = [replica(f"web-{i}") for i in range(3)]
    for pod in pods:
        change(pod)
    signature = pod_signature(pods[0], [])
    for pod in pods:
        decision = eng.decide(pod, (), signature=signature)
        assert isinstance(decision, PodError)
        assert message in decision.message
        assert decision.message == eng.decide(copy.deepcopy(pod)).message
        assert decision.pod == f"default/{pod['metadata']['name']}"
    assert not eng._shapes  # refusals are not kept


def _engine(scenario: Any) -> DecisionEngine:
    snap = ClusterSnapshot.build(
        [ResourceSlice.from_api(s) for s in scenario.slices],
        [DeviceClass.from_api(c) for c in scenario.classes],
        [ResourceClaim.from_api(c) for c in scenario.claims],
    )
    eng = DecisionEngine(snap, [Node.from_api(n) for n in scenario.nodes])
    for kind, namespace, name, selector in scenario.owners:
        eng.observe_owner(kind, namespace, name, selector)
    return eng


def _stream(eng: DecisionEngine, scenario: Any, signed: bool) -> list[Decision]:
    decisions: list[Decision] = []
    for pod, raw_claims in scenario.pods:
        claims = [ResourceClaim.from_api(c) for c in raw_claims]
        signature = pod_signature(pod, raw_claims) if signed else None
        decision = eng.decide(pod, claims, signature=signature)
        if isinstance(decision, Placement):
            eng.assume(decision, pod)
        decisions.append(decision)
    return decisions


def test_the_mixed_replica_stream_is_decided_alike_with_and_without_signatures() -> None:
    scenario = generate_mixed(60, 400, seed=7)
    plain = _stream(_engine(scenario), scenario, signed=False)
    signed_engine = _engine(scenario)
    signed = _stream(signed_engine, scenario, signed=True)
    assert 0 < len(signed_engine._shapes) < len(scenario.pods) / 4  # replicas shared shapes
    assert sum(isinstance(d, Placement) for d in plain) > len(plain) / 2
    assert signed == plain
    assert answers_digest(signed) == answers_digest(plain)


@pytest.mark.parametrize("relabelled", [False, True])
def test_a_bound_pod_counts_as_assumed_unless_its_view_changed(relabelled: bool) -> None:
    eng = engine([gpu_node("a", 2)])
    pod = replica("web-x")
    decision = eng.decide(pod)
    assert isinstance(decision, Placement)
    eng.assume(decision, pod)
    assumed = eng._tracker._pods["uid-web-x"].pod
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = decision.node
    if relabelled:
        bound["metadata"]["labels"] = {"app": "api"}
    eng.observe_pod("uid-web-x", decision.node, raw=bound)
    entry = eng._tracker._pods["uid-web-x"]
    assert entry.pod == ScheduledPod.from_pod(bound, "uid-web-x")
    assert (entry.pod is assumed) is not relabelled
    assert not entry.assumed
    assert not eng._assumed_views


def test_a_forgotten_or_gone_placement_keeps_no_view() -> None:
    eng = engine([gpu_node("a", 2)])
    for name, end in (("web-x", "forget"), ("web-y", "gone")):
        pod = replica(name)
        decision = eng.decide(pod)
        assert isinstance(decision, Placement)
        eng.assume(decision, pod)
        if end == "forget":
            eng.forget(f"uid-{name}")
        else:
            eng.observe_pod(f"uid-{name}", None)
    assert not eng._assumed_views

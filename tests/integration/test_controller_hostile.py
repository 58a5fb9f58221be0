"""The controller's edges under hostile or unlucky input (issue 29): pods sharing one claim in a
burst, a bug hit while deciding, a write the API server refuses for good, a huge annotation.

Shared claims in a burst. A claim is created, then several pods that reference it in one
burst. The first placement allocates the claim; while that allocation is in flight the others
wait for it and are retried when the claim changes, as upstream's DynamicResources PreFilter
does (``resource claim <namespace>/<name> is in the process of being allocated``, and a requeue
on the claim's update); then all land on the claim's device. Before, one pod stayed Pending
with no condition: a reservation-only commit cleared the allocating pod's pending state, a
third placement allocated the claim again, the engine refused to assume it, and the pod was
dropped.

A bug hit while deciding for a pod never strands it silently: the pod gets
``PodScheduled=False`` with reason ``SchedulerError`` (kube-scheduler's for a failed attempt)
and a ``FailedScheduling`` event, and it is retried.

A write the API server refuses permanently (422 Invalid, 400, 403...) cannot succeed by being
sent again: the pod gets ``SchedulerError`` and an event naming the refusal, and it is parked
until the pod changes (or the periodic retry of parked pods), instead of being retried every
backoff period for ever (its own rollback's claim write must not wake it). A 200 KB
annotation value is quoted by its first characters and its length, never whole: every
condition and event write would otherwise carry it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.api.claims import MAX_PARAMETER_DEPTH
from driver.api.errors import QUOTE_LIMIT
from tests.emulator import Emulator
from tests.integration.controller_env import (
    JSON,
    ControllerThread,
    bound_pods,
    check_invariants,
    checked_controller,
    pod,
    pod_condition,
    pod_events,
    resource_claim,
    seed_cluster,
)


@pytest.fixture
def controller(emulator: Emulator) -> Iterator[ControllerThread]:
    seed_cluster(emulator)
    with checked_controller(emulator) as running:
        yield running


@pytest.mark.parametrize("pods", [2, 3, 10])
def test_a_burst_of_pods_sharing_one_claim_is_all_bound(
    emulator: Emulator, controller: ControllerThread, pods: int
) -> None:
    for round_ in range(3):
        claim = f"shared-{round_}"
        emulator.create(resource_claim(claim))
        names = [f"{claim}-p{i}" for i in range(pods)]
        for name in names:
            emulator.create(pod(name, claim=claim))
        emulator.wait_until(
            lambda names=names: len(bound_pods(emulator, names)) == pods,  # type: ignore[misc]
            timeout=30,
            message=f"round {round_}: bound {sorted(bound_pods(emulator, names))}",
        )
        stored = emulator.get("resourceclaims", claim, "default")
        assert stored is not None
        reserved = {r["name"] for r in stored["status"]["reservedFor"]}
        assert reserved == set(names)
        assert len(set(bound_pods(emulator, names).values())) == 1  # one device, one node
    assert check_invariants(emulator) == []


def test_an_internal_error_is_reported_on_the_pod_and_retried(
    emulator: Emulator, controller: ControllerThread
) -> None:
    assert controller.controller is not None
    scheduler = controller.controller.scheduler
    decide = scheduler._decide
    failures: list[str] = []

    def failing_once(key: str, *args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(key)
            raise RuntimeError("a bug")
        return decide(key, *args, **kwargs)

    controller.on_loop(lambda: setattr(scheduler, "_decide", failing_once))
    emulator.create(resource_claim("c"))
    emulator.create(pod("p", claim="c"))
    emulator.wait_until(lambda: bound_pods(emulator, ["p"]), timeout=30)
    assert failures == ["default/p"]
    reported = [m for reason, m in pod_events(emulator, "p") if reason == "FailedScheduling"]
    assert reported == ["internal error while scheduling (RuntimeError); retried with backoff"]
    assert check_invariants(emulator) == []


def _claim_writes(emulator: Emulator) -> int:
    return len(emulator.requests_for(method="PUT", resource="resourceclaims"))


def test_a_write_refused_for_good_is_reported_and_not_hammered(
    emulator: Emulator, controller: ControllerThread
) -> None:
    assert controller.controller is not None
    queue = controller.controller.scheduler.queue
    emulator.create(resource_claim("c"))
    emulator.fail_next(
        422,
        verbs="update",
        resource="resourceclaims",
        reason="Invalid",
        message='ResourceClaim.resource.k8s.io "c" is invalid: status: Invalid value',
    )
    emulator.create(pod("p", claim="c"))

    def reported() -> bool:
        condition = pod_condition(emulator, "p") or {}
        events = [text for reason, text in pod_events(emulator, "p") if "422 Invalid" in text]
        return condition.get("reason") == "SchedulerError" and bool(events)

    emulator.wait_until(reported, timeout=20, message=f"condition: {pod_condition(emulator, 'p')}")
    message = (pod_condition(emulator, "p") or {})["message"]
    assert message.startswith("the API server refused this pod's placement (422 Invalid)")
    # Parked, not in backoff: nothing is sent again until the pod or its claim changes.
    emulator.wait_until(
        lambda: controller.on_loop(lambda: queue.depths["unschedulable"]) == 1, timeout=10
    )
    writes = _claim_writes(emulator)
    assert not bound_pods(emulator, ["p"])
    assert _claim_writes(emulator) == writes
    # Its own rollback wrote the claim (the finalizer removed): that did not wake it. A
    # change to the pod does: it is tried again and placed.
    emulator.patch("pods", "p", {"metadata": {"labels": {"fixed": "yes"}}}, namespace="default")
    emulator.wait_until(lambda: bound_pods(emulator, ["p"]), timeout=20)
    assert check_invariants(emulator) == []


def test_a_huge_annotation_is_quoted_by_a_short_prefix(
    emulator: Emulator, controller: ControllerThread
) -> None:
    huge = "x" * 200_000
    emulator.create(pod("p", annotations={"biaxial.dev/node-policy": huge}))
    emulator.wait_until(
        lambda: pod_condition(emulator, "p") is not None,
        timeout=20,
    )
    message = (pod_condition(emulator, "p") or {})["message"]
    assert "unknown policy" in message
    assert "(200000 characters)" in message
    assert len(message) < 2 * QUOTE_LIMIT + 200
    for _reason, text in pod_events(emulator, "p"):
        assert len(text) < 2 * QUOTE_LIMIT + 200


# --------------------------------------------------------------------------- hostile objects

#: Every kind the controller watches: (apiVersion, kind, namespaced).
WATCHED: Final = (
    ("v1", "Node", False),
    ("v1", "Pod", True),
    ("resource.k8s.io/v1", "DeviceClass", False),
    ("resource.k8s.io/v1", "ResourceSlice", False),
    ("resource.k8s.io/v1", "ResourceClaim", True),
    ("v1", "Namespace", False),
    ("v1", "Service", True),
    ("v1", "ReplicationController", True),
    ("apps/v1", "ReplicaSet", True),
    ("apps/v1", "StatefulSet", True),
    ("policy/v1", "PodDisruptionBudget", True),
    ("v1", "PersistentVolumeClaim", True),
    ("v1", "PersistentVolume", False),
    ("storage.k8s.io/v1", "StorageClass", False),
    ("storage.k8s.io/v1", "CSINode", False),
    ("storage.k8s.io/v1", "CSIDriver", False),
    ("storage.k8s.io/v1", "CSIStorageCapacity", True),
    ("storage.k8s.io/v1", "VolumeAttachment", False),
)


def _deep(levels: int) -> Any:
    value: Any = {}
    for n in range(levels):
        value = {"a": value} if n % 2 else [value]
    return value


#: How a hostile value is built from a size: deep (as the API server accepts in opaque
#: fields, and deeper), wide (an object or a list of many members), or given as it is.
SHAPES: Final[dict[str, Callable[[Any], Any]]] = {
    "deep": _deep,
    "wide-object": lambda n: {f"k{i}": str(i) for i in range(n)},
    "wide-list": lambda n: list(range(n)),
    "mistyped": lambda value: value,
}
_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
#: (shape, argument): built by the test, so that a failing example prints small.
_recipes: st.SearchStrategy[tuple[str, Any]] = st.one_of(
    st.tuples(st.just("deep"), st.integers(1_000, 6_000)),
    st.tuples(st.sampled_from(["wide-object", "wide-list"]), st.integers(1_000, 20_000)),
    st.tuples(st.just("mistyped"), _json),
)
#: Where the value goes: the envelope every reader relies on (a mistyped one no API server
#: serves; the informers leave such an object out), and fields readers must pass over however
#: deep or wide (an unknown spec field, annotations, a claim's or class's opaque parameters).
_fields: st.SearchStrategy[tuple[str, ...]] = st.sampled_from(
    [
        ("spec",),
        ("status",),
        ("metadata", "labels"),
        ("metadata", "annotations"),
        ("metadata", "ownerReferences"),
        ("metadata", "finalizers"),
        ("metadata", "deletionTimestamp"),
        ("spec", "extra"),
        ("status", "extra"),
        ("spec", "devices", "config"),
        ("spec", "config"),
    ]
)
_serial = itertools.count()


def hostile_object(kind: tuple[str, str, bool], field: tuple[str, ...], value: Any) -> JSON:
    api_version, kind_name, _namespaced = kind
    obj: JSON = {
        "apiVersion": api_version,
        "kind": kind_name,
        "metadata": {"name": f"hostile-{next(_serial)}"},
        "spec": {"schedulerName": "biaxial"} if kind_name == "Pod" else {},
    }
    if field[-1] == "config":  # opaque parameters, as a claim or class carries them
        value = [{"opaque": {"driver": "other.example.com", "parameters": {"p": value}}}]
    parent = obj
    for part in field[:-1]:
        parent = parent.setdefault(part, {})
    parent[field[-1]] = value
    return obj


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(kind=st.sampled_from(WATCHED), field=_fields, recipe=_recipes)
def test_hostile_objects_of_every_watched_kind_never_stop_scheduling(
    emulator: Emulator,
    controller: ControllerThread,
    kind: tuple[str, str, bool],
    field: tuple[str, ...],
    recipe: tuple[str, Any],
) -> None:
    """Deep, wide and mistyped objects of every watched kind, served through the informers
    (stored unvalidated: some no API server would accept, the harder case): each is that
    object's problem alone; the controller stays up and places the next pod."""
    shape, argument = recipe
    hostile = emulator.inject(hostile_object(kind, field, SHAPES[shape](argument)))
    name = f"after-{hostile['metadata']['name']}"
    emulator.create(pod(name))
    emulator.wait_until(lambda: bound_pods(emulator, [name]), timeout=30, message=name)
    assert controller.alive


def test_a_claim_nested_deeper_than_biaxial_reads_is_that_pods_error(
    emulator: Emulator, controller: ControllerThread
) -> None:
    """A claim the API server accepts, its opaque parameters nested 5,000 deep (10 KiB):
    before, the controller's informer died on it (RecursionError), and the standby with it."""
    levels = 5_000
    parameters: Any = []
    for _ in range(levels - 1):
        parameters = [parameters]
    claim = resource_claim("deep")
    claim["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "other.example.com", "parameters": {"p": parameters}}}
    ]
    emulator.create(claim)
    emulator.create(pod("uses-deep", claim="deep"))
    emulator.create(pod("next", claim=None, legacy_gpus=1))
    emulator.wait_until(lambda: bound_pods(emulator, ["next"]), timeout=30)
    emulator.wait_until(lambda: pod_condition(emulator, "uses-deep") is not None, timeout=30)
    message = (pod_condition(emulator, "uses-deep") or {})["message"]
    assert f"nest deeper than {MAX_PARAMETER_DEPTH} levels" in message
    assert controller.alive
    assert check_invariants(emulator) == []

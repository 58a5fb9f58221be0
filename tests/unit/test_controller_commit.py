"""The crash-safe commit order (controller.commit) against a recording fake API: the order of
writes, conflicts and lost answers, rollback, and a crash injected after every write."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from controller.api import PODS, RESOURCE_CLAIMS
from controller.cache import ClaimOverlay, Informer, slim
from controller.commit import (
    BridgePlan,
    ClaimPlan,
    CommitAbortedError,
    Committer,
    Plan,
    PodRef,
    StaleClaimError,
    pod_claim_keys,
)
from driver.api.errors import ConflictError, NotFoundError, ServerError
from tests.unit.controller_fakes import FakeApi

FIN = "gpu.biaxial.dev/allocation"
JSON = dict[str, Any]


def allocation(device: str = "gpu-0", node: str = "n1") -> JSON:
    return {
        "devices": {
            "results": [
                {"request": "gpu", "driver": "gpu.biaxial.dev", "pool": node, "device": device}
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def claim(name: str) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    }


def pod(name: str = "p") -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "biaxial", "containers": [{"name": "c", "image": "i"}]},
    }


class Crash(BaseException):
    pass


def setup(*claims: str) -> tuple[FakeApi, Committer, PodRef]:
    api = FakeApi()
    for name in claims:
        api.seed(RESOURCE_CLAIMS, claim(name))
    ref = PodRef.of(api.seed(PODS, pod()))
    overlay = ClaimOverlay(Informer(api, RESOURCE_CLAIMS, transform=slim))
    return api, Committer(api, overlay, finalizer=FIN), ref


def bridge_plan(ref: PodRef) -> BridgePlan:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": "p-extended-resources-",
            "namespace": "default",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": ref.uid, "controller": True}
            ],
        },
        "spec": {"devices": {"requests": []}},
    }
    mapping = {"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "r"}
    return BridgePlan(claim=body, allocation=allocation("gpu-1"), request_mappings=(mapping,))


def stored_claim(api: FakeApi, name: str) -> JSON:
    found = api.stored(RESOURCE_CLAIMS, name)
    assert found is not None
    return found


def test_writes_in_the_safe_order() -> None:
    api, committer, ref = setup("c0", "c1")
    plan = Plan(
        pod=ref,
        node="n1",
        claims=(
            ClaimPlan("default/c0", allocation("gpu-0")),
            ClaimPlan("default/c1", allocation("gpu-1")),
        ),
        bridge=bridge_plan(ref),
    )
    assert plan.bridge is not None
    planned = copy.deepcopy(plan.bridge.claim)
    asyncio.run(committer.commit(plan))
    assert plan.bridge.claim == planned  # the bridge claim's body is built over it, untouched
    writes = [v for v in api.verbs() if v[0] not in ("get", "list")]
    assert writes == [
        ("patch", "resourceclaims", None),  # finalizer c0
        ("patch", "resourceclaims", None),  # finalizer c1
        ("replace", "resourceclaims", "status"),  # allocation + reservedFor c0
        ("replace", "resourceclaims", "status"),  # c1
        ("create", "resourceclaims", None),  # bridge claim, finalizer included
        ("replace", "resourceclaims", "status"),  # bridge allocation
        ("patch", "pods", "status"),  # extendedResourceClaimStatus
        ("bind", "pods", "binding"),
    ]
    for name in ("c0", "c1"):
        c = stored_claim(api, name)
        assert c["metadata"]["finalizers"] == [FIN]
        assert c["status"]["reservedFor"] == [ref.consumer()]
    bridge = next(o for (p, _, n), o in api.objects.items() if n.startswith("p-extended"))
    assert bridge["metadata"]["finalizers"] == [FIN]
    assert bridge["status"]["allocation"] == allocation("gpu-1")
    bound = api.stored(PODS, "p")
    assert bound is not None
    assert bound["spec"]["nodeName"] == "n1"
    ext = bound["status"]["extendedResourceClaimStatus"]
    assert ext["resourceClaimName"] == bridge["metadata"]["name"]
    assert sorted(pod_claim_keys(bound)) == [f"default/{bridge['metadata']['name']}"]
    assert not committer.locked


@pytest.mark.parametrize("fails", [False, True])
def test_the_bridge_claim_stays_locked_until_the_commit_ends(fails: bool) -> None:
    """Locked from its creation to the end of the commit (rollback included), and unlocked
    once the pod is out of flight: the deallocator then sees the pod's commit over."""
    api, committer, ref = setup("c0")
    if fails:
        api.fail("bind", "pods", NotFoundError("gone", status=404))
    steps: list[tuple[str, bool]] = []
    unlocked: list[tuple[str, bool]] = []

    async def on_step(step: str, _key: str) -> None:
        bridged = any(k.startswith("default/p-extended") for k in committer.locked)
        steps.append((step, bridged))

    committer._on_step = on_step
    committer.add_unlock_listener(
        lambda key: unlocked.append((key, ref.uid in committer.pods_in_flight))
    )
    plan = Plan(
        pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),), bridge=bridge_plan(ref)
    )
    if fails:
        with pytest.raises(CommitAbortedError):
            asyncio.run(committer.commit(plan))
    else:
        asyncio.run(committer.commit(plan))
    after_create = steps[[s for s, _ in steps].index("bridge-create") :]
    assert after_create
    assert all(bridged for _, bridged in after_create)
    assert [key.startswith("default/p-extended") for key, _ in unlocked] == [False, True]
    assert not any(in_flight for _, in_flight in unlocked)
    assert not committer.locked


def test_an_allocated_claim_is_only_reserved() -> None:
    api, committer, ref = setup("shared")
    other = {"resource": "pods", "name": "other", "uid": "u-other"}
    c = stored_claim(api, "shared")
    c["metadata"]["finalizers"] = [FIN]
    c["status"] = {"allocation": allocation(), "reservedFor": [other]}
    api.seed(RESOURCE_CLAIMS, c)
    asyncio.run(
        committer.commit(Plan(pod=ref, node="n1", claims=(ClaimPlan("default/shared", None),)))
    )
    after = stored_claim(api, "shared")
    assert after["status"]["reservedFor"] == [other, ref.consumer()]
    assert after["status"]["allocation"] == allocation()
    assert ("patch", "resourceclaims", None) not in api.verbs()


def test_conflicts_are_retried_on_a_fresh_read_and_counted_per_step() -> None:
    api, committer, ref = setup("c0")
    api.fail("patch", "resourceclaims", ConflictError("stale", status=409))
    api.fail("replace", "resourceclaims", ConflictError("stale", status=409))
    api.fail("create", "resourceclaims", ConflictError("name taken", status=409))
    conflicts: list[str] = []
    committer._on_conflict = conflicts.append
    plan = Plan(
        pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),), bridge=bridge_plan(ref)
    )
    asyncio.run(committer.commit(plan))
    assert conflicts == ["finalizer", "allocation", "bridge-create"]
    assert stored_claim(api, "c0")["status"]["reservedFor"] == [ref.consumer()]
    bridge = next(n for (_, _, n) in api.objects if n.startswith("p-extended"))
    api.fail("delete", "resourceclaims", ConflictError("uid precondition", status=409))
    asyncio.run(committer.delete_claim(f"default/{bridge}"))
    assert conflicts[3:] == ["delete"]
    assert not [n for (_, _, n) in api.objects if n.startswith("p-extended")]


@pytest.mark.parametrize(("bound_to", "landed"), [("n1", True), ("n2", False)])
def test_a_binding_conflict_is_not_retried_but_read(bound_to: str, landed: bool) -> None:
    api, committer, ref = setup("c0")
    p = api.stored(PODS, "p")
    assert p is not None
    p["spec"]["nodeName"] = bound_to
    api.seed(PODS, p)
    api.fail("bind", "pods", ConflictError("already bound", status=409))
    conflicts: list[str] = []
    committer._on_conflict = conflicts.append
    plan = Plan(pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),))
    if landed:
        asyncio.run(committer.commit(plan))
    else:
        with pytest.raises(CommitAbortedError, match="cannot be bound") as info:
            asyncio.run(committer.commit(plan))
        assert info.value.conflict
        assert not (stored_claim(api, "c0").get("status") or {}).get("allocation")  # rolled back
    assert conflicts == ["binding"]
    assert [v for v in api.verbs() if v[0] == "bind"] == [("bind", "pods", "binding")]


def test_a_lost_answer_is_not_written_twice() -> None:
    api, committer, ref = setup("c0")
    api.lose_answer("replace", "resourceclaims")
    api.lose_answer("bind", "pods")
    plan = Plan(pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),))
    asyncio.run(committer.commit(plan))
    c = stored_claim(api, "c0")
    assert c["status"]["reservedFor"] == [ref.consumer()]
    assert [v for v in api.verbs() if v == ("replace", "resourceclaims", "status")] == [
        ("replace", "resourceclaims", "status")
    ]
    assert api.stored(PODS, "p")["spec"]["nodeName"] == "n1"  # type: ignore[index]


def test_claim_allocated_by_someone_else_aborts_and_rolls_back() -> None:
    api, committer, ref = setup("c0", "c1")
    taken = stored_claim(api, "c1")
    taken["status"] = {
        "allocation": allocation("gpu-7"),
        "reservedFor": [{"resource": "pods", "name": "x", "uid": "x"}],
    }
    api.seed(RESOURCE_CLAIMS, taken)
    plan = Plan(
        pod=ref,
        node="n1",
        claims=(
            ClaimPlan("default/c0", allocation("gpu-0")),
            ClaimPlan("default/c1", allocation("gpu-1")),
        ),
    )
    with pytest.raises(CommitAbortedError) as info:
        asyncio.run(committer.commit(plan))
    assert info.value.conflict
    c0 = stored_claim(api, "c0")
    assert "allocation" not in (c0.get("status") or {})
    assert not c0["metadata"].get("finalizers")
    assert stored_claim(api, "c1")["status"]["allocation"] == allocation("gpu-7")  # untouched
    assert not api.stored(PODS, "p")["spec"].get("nodeName")  # type: ignore[index]
    assert not committer.locked


def test_pod_deleted_before_binding_rolls_everything_back() -> None:
    api, committer, ref = setup("c0")
    api.fail("bind", "pods", NotFoundError("gone", status=404))
    plan = Plan(
        pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),), bridge=bridge_plan(ref)
    )
    with pytest.raises(CommitAbortedError):
        asyncio.run(committer.commit(plan))
    c0 = stored_claim(api, "c0")
    assert not (c0.get("status") or {}).get("allocation")
    assert not (c0.get("status") or {}).get("reservedFor")
    assert not c0["metadata"].get("finalizers")
    assert not [n for (_, _, n) in api.objects if n.startswith("p-extended")]  # bridge deleted


def test_server_errors_exhaust_retries_then_roll_back() -> None:
    api, committer, ref = setup("c0")
    api.fail("bind", "pods", ServerError("503", status=503), count=10)
    plan = Plan(pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),))
    with pytest.raises(ServerError):
        asyncio.run(committer.commit(plan))
    c0 = stored_claim(api, "c0")
    assert not (c0.get("status") or {}).get("allocation")
    assert not c0["metadata"].get("finalizers")


STEPS = ["finalizer", "allocation", "bridge-create", "bridge-allocation", "bridge-link", "binding"]


@pytest.mark.parametrize("crash_step", STEPS)
def test_a_crash_after_any_write_leaves_a_safe_state(crash_step: str) -> None:
    api, committer, ref = setup("c0")

    async def on_step(step: str, _key: str) -> None:
        if step == crash_step:
            raise Crash

    committer._on_step = on_step
    plan = Plan(
        pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),), bridge=bridge_plan(ref)
    )
    with pytest.raises(Crash):
        asyncio.run(committer.commit(plan))
    bound = bool(api.stored(PODS, "p")["spec"].get("nodeName"))  # type: ignore[index]
    claims = [o for (p, _, _), o in api.objects.items() if p == "resourceclaims"]
    for c in claims:
        status = c.get("status") or {}
        if status.get("allocation"):
            assert FIN in c["metadata"]["finalizers"], "allocated without our finalizer"
    if bound:
        # Binding is the last write: every claim is allocated and reserved for the pod.
        assert crash_step == "binding"
        for c in claims:
            assert c["status"]["allocation"]
            assert c["status"]["reservedFor"] == [ref.consumer()]
    # The repair a restarted controller performs for the unbound pod releases everything.
    if not bound:

        async def repair() -> None:
            for c in copy.deepcopy(claims):
                key = f"default/{c['metadata']['name']}"
                if c["metadata"].get("annotations"):
                    await committer.delete_claim(key)
                else:
                    await committer.unreserve(key, ref.uid, deallocate=True)
                    await committer.remove_finalizer(key)

        asyncio.run(repair())
        left = [o for (p, _, _), o in api.objects.items() if p == "resourceclaims"]
        assert [o["metadata"]["name"] for o in left] == ["c0"]
        assert not (left[0].get("status") or {}).get("allocation")
        assert not left[0]["metadata"].get("finalizers")


def test_finalizer_is_never_removed_while_allocated() -> None:
    api, committer, _ = setup("c0")
    c = stored_claim(api, "c0")
    c["metadata"]["finalizers"] = [FIN, "other/keep"]
    c["status"] = {"allocation": allocation()}
    api.seed(RESOURCE_CLAIMS, c)
    asyncio.run(committer.remove_finalizer("default/c0"))
    assert stored_claim(api, "c0")["metadata"]["finalizers"] == [FIN, "other/keep"]
    asyncio.run(committer.deallocate("default/c0"))
    asyncio.run(committer.remove_finalizer("default/c0"))
    after = stored_claim(api, "c0")
    assert after["metadata"]["finalizers"] == ["other/keep"]
    assert "allocation" not in after["status"]


def test_pod_claim_keys_resolves_every_kind_of_reference() -> None:
    p = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "named"},
                {"name": "b", "resourceClaimTemplateName": "t"},
                {"name": "c", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": {
            "resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x"}],
            "extendedResourceClaimStatus": {"resourceClaimName": "p-ext"},
        },
    }
    assert list(pod_claim_keys(p)) == ["ns/named", "ns/p-b-x", "ns/p-ext"]


def test_a_repaired_pod_is_not_bound_on_a_claim_cache_that_lags_behind() -> None:
    """Upstream's rule: a pod is bound only once its claims are allocated and reserved for it
    (kube-scheduler's DynamicResources plugin writes allocation and reservation in PreBind,
    before the binding), and an allocation is never removed while a bound pod reserves it.

    The interleaving this pins (a flake of the killed-between-commit-steps test under load):
    an interrupted attempt left c0 allocated and reserved for p; before p's next attempt the
    controller released it (reservation and allocation, then our finalizer); the claim
    informer has delivered none of those writes yet, so its copy still shows c0 allocated and
    reserved for p. The overlay must show what was written, and a plan that reuses the
    allocation (no write needed) must still not bind p on the cache's word."""
    api, committer, ref = setup("c0")
    leftover = stored_claim(api, "c0")
    leftover["metadata"]["finalizers"] = [FIN]
    leftover["status"] = {"allocation": allocation(), "reservedFor": [ref.consumer()]}
    leftover = api.seed(RESOURCE_CLAIMS, leftover)
    informer = committer.overlay._informer
    informer.store["default/c0"] = copy.deepcopy(leftover)  # the cache, frozen from now on

    async def release() -> None:  # what the repair does (controller.repair.Repairer.repair)
        assert await committer.unreserve("default/c0", ref.uid, deallocate=True) is not None
        await committer.remove_finalizer("default/c0")

    asyncio.run(release())
    shown = committer.overlay.get("default/c0")
    assert shown is not None
    assert not (shown.get("status") or {}).get("allocation")
    assert not shown["metadata"].get("finalizers")

    # A decision made on the stale copy reuses the allocation: nothing to write, then bind.
    committer.overlay.forget("default/c0")  # even with nothing assumed over the stale copy
    plan = Plan(pod=ref, node="n1", claims=(ClaimPlan("default/c0", None),))
    with pytest.raises(CommitAbortedError, match="deallocated meanwhile"):
        asyncio.run(committer.commit(plan))
    assert not api.stored(PODS, "p")["spec"].get("nodeName")  # type: ignore[index]


def test_a_release_from_the_cache_is_two_writes_and_no_read() -> None:
    """The deallocator's path (``cached``): the reservation of a gone pod and the allocation
    dropped in one status write (as kube-controller-manager releases its claims), then the
    finalizer; both start from the claim this process last wrote, not from a GET."""
    api, committer, ref = setup("c0")
    asyncio.run(
        committer.commit(Plan(pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),)))
    )
    api.calls.clear()
    written = asyncio.run(committer.unreserve("default/c0", ref.uid, deallocate=True, cached=True))
    assert written is not None
    asyncio.run(committer.remove_finalizer("default/c0", cached=True))
    assert api.verbs() == [
        ("replace", "resourceclaims", "status"),
        ("patch", "resourceclaims", None),
    ]
    released = stored_claim(api, "c0")
    assert "allocation" not in released["status"]
    assert "reservedFor" not in released["status"]
    assert FIN not in (released["metadata"].get("finalizers") or [])


def test_a_stale_cached_copy_is_refused_and_not_read_again() -> None:
    """A write from the cache carries the cached resourceVersion: a 409 ends the step (the
    claim's watch event brings it back to the deallocator) instead of a GET and a retry."""
    api, committer, ref = setup("c0")
    asyncio.run(
        committer.commit(Plan(pod=ref, node="n1", claims=(ClaimPlan("default/c0", allocation()),)))
    )
    api.calls.clear()
    api.fail("replace", "resourceclaims", ConflictError("stale", status=409))
    with pytest.raises(StaleClaimError):
        asyncio.run(committer.unreserve("default/c0", ref.uid, deallocate=True, cached=True))
    assert api.verbs() == [("replace", "resourceclaims", "status")]
    assert stored_claim(api, "c0")["status"]["reservedFor"] == [ref.consumer()]  # unchanged
    # Not cached (the repair path): the conflict is retried on a live read.
    api.calls.clear()
    api.fail("replace", "resourceclaims", ConflictError("stale", status=409))
    asyncio.run(committer.unreserve("default/c0", ref.uid, deallocate=True))
    assert [v[0] for v in api.verbs()] == ["get", "replace", "get", "replace"]
    assert "allocation" not in stored_claim(api, "c0")["status"]

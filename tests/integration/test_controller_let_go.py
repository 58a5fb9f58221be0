"""A claim marked for deletion that no live pod reserves goes in one write: the controller
removes its finalizer, allocated and reserved as the claim is, and the API server deletes it
(``Committer.let_go``). That is every claim generated for a pod once the pod is deleted (the
garbage collector marks it), every bridge claim likewise, and a user's claim deleted while in
use once its pods are gone. Releasing first (the status write dropping the reservation and
the allocation, then the finalizer's removal) costs two writes per pod; kube-scheduler's
claims cost it none, because kube-controller-manager releases them.

Safe without a resourceVersion because a claim marked for deletion takes no new reservation
(upstream's ``validateResourceClaimStatusUpdate``; pinned for the emulator and the real API
server in ``tests/contract/test_patch_status.py``)."""

from __future__ import annotations

import time

import pytest

from tests.emulator import Emulator, RequestRecord, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    claim_template,
    pod,
    resource_claim,
    seed_cluster,
)

NODE = "gpu-t4"


@pytest.fixture
def cluster(emulator: Emulator) -> Emulator:
    seed_cluster(emulator, {NODE: "t4x4"})
    emulator.create(claim_template("one"))
    return emulator


def _claim_writes(cluster: Emulator) -> list[tuple[str, str, int]]:
    """The claim writes sent over HTTP (the controller's: the emulator's stand-in for
    kube-controller-manager and the garbage collector writes to the store directly)."""
    records: list[RequestRecord] = cluster.requests_for(resource="resourceclaims")
    return [(r.method, r.resource, r.status) for r in records if r.method != "GET"]


def _claim_names(cluster: Emulator) -> set[str]:
    return {c["metadata"]["name"] for c in cluster.list("resourceclaims", "default")}


def _let_go_count(controller: ControllerThread) -> float:
    assert controller.controller is not None
    counter = controller.controller.scheduler.metrics.deallocations.labels(action="let-go")
    return float(counter._value.get())  # type: ignore[attr-defined]


def _bind(cluster: Emulator, name: str, **kwargs: object) -> None:
    cluster.create(pod(name, **kwargs))  # type: ignore[arg-type]
    cluster.wait_until(lambda: name in bound_pods(cluster), timeout=30, message=f"{name} unbound")


def _delete_pod(
    cluster: Emulator,
    name: str,
    heard_by: ControllerThread | None = None,
    pausing: ResourceClaimController | None = None,
) -> None:
    """Delete pod ``name``; with ``heard_by`` and ``pausing``, the stand-in for
    kube-controller-manager writes nothing until the controller has heard the deletion.

    The stand-in drops the gone pod's reservation, then the garbage collector marks the claim.
    The pod and claim watches are two streams: a controller that hears the claim unreserved
    while its owner still looks alive releases it the longer way (two writes, correct too),
    which the tests counting the one-write let-go's writes do not expect."""
    if pausing is not None:
        pausing.stop()
    cluster.delete("pods", name, "default", {"gracePeriodSeconds": 0})
    cluster.finish_pod_deletions()
    if heard_by is not None:
        key = f"default/{name}"
        cluster.wait_until(
            lambda: heard_by.on_loop(lambda: heard_by.controller.cache.pods.get(key)) is None,
            timeout=10,
            message=f"the controller never heard pod {key} go",
        )
    if pausing is not None:
        pausing.start()


@pytest.mark.parametrize(
    "shape", [{"template": "one"}, {"legacy_gpus": 1}], ids=["template", "bridge"]
)
def test_a_deleted_pods_claim_goes_in_one_write(
    cluster: Emulator,
    claim_controller: ResourceClaimController,
    controller: ControllerThread,
    shape: dict[str, object],
) -> None:
    _bind(cluster, "job", **shape)
    assert len(_claim_names(cluster)) == 1
    cluster.clear_requests()
    _delete_pod(cluster, "job", controller, claim_controller)
    cluster.wait_until(lambda: not _claim_names(cluster), timeout=20, message="claim left")
    assert _claim_writes(cluster) == [("PATCH", "resourceclaims", 200)]
    cluster.wait_until(lambda: _let_go_count(controller) == 1, timeout=10)
    # its device is free again: the next pod takes it
    _bind(cluster, "next", **shape)
    assert check_invariants(cluster) == []


def test_a_claim_deleted_while_in_use_goes_with_its_last_pod(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(resource_claim("shared"))
    _bind(cluster, "a", claim="shared")
    _bind(cluster, "b", claim="shared")
    cluster.delete("resourceclaims", "shared", "default")
    _delete_pod(cluster, "a")
    time.sleep(0.5)  # the controller is given the moment it would need to get it wrong
    kept = cluster.get("resourceclaims", "shared", "default")
    assert kept is not None
    assert kept["metadata"]["deletionTimestamp"]
    assert kept["status"]["allocation"], "dropped while pod b still uses it"
    cluster.clear_requests()
    _delete_pod(cluster, "b")
    cluster.wait_until(lambda: "shared" not in _claim_names(cluster), timeout=20)
    assert _claim_writes(cluster) == [("PATCH", "resourceclaims", 200)]
    assert check_invariants(cluster) == []


def test_without_a_garbage_collector_a_deleted_pods_claim_is_released_after_a_grace(
    cluster: Emulator, controller: ControllerThread
) -> None:
    """A claim whose owner pod was deleted is left to the garbage collector for a moment;
    when nothing marks it (no garbage collector, or the pod deleted with orphan propagation),
    it is released as any other: allocation dropped, then the finalizer."""
    from controller.deallocate import GC_GRACE_S

    cluster.create(resource_claim("owned"))
    _bind(cluster, "owner", claim="owned")
    owner = cluster.get("pods", "owner", "default")
    assert owner is not None
    uid = owner["metadata"]["uid"]
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": uid, "controller": True}
    owned = {"metadata": {"ownerReferences": [ref]}}
    cluster.patch("resourceclaims", "owned", owned, namespace="default")

    def owner_seen() -> bool:
        # The pod and claim watches are two streams: a deletion heard before the patch
        # would show a claim no pod owns, released at once (in a cluster the owner is set
        # when the claim is made, long before its pod goes).
        claim = controller.on_loop(lambda: controller.controller.cache.claims.get("default/owned"))
        return bool(claim and claim["metadata"].get("ownerReferences"))

    cluster.wait_until(owner_seen, timeout=10, message="the controller never saw the owner")
    cluster.clear_requests()
    deleted_at = time.monotonic()
    _delete_pod(cluster, "owner")

    def released() -> bool:
        left = cluster.get("resourceclaims", "owned", "default")
        return left is not None and not left["metadata"].get("finalizers")

    cluster.wait_until(released, timeout=20, message="never released")
    assert time.monotonic() - deleted_at >= GC_GRACE_S
    left = cluster.get("resourceclaims", "owned", "default")
    assert left is not None
    assert "allocation" not in left.get("status", {})
    writes = _claim_writes(cluster)
    assert writes == [("PATCH", "resourceclaims/status", 200), ("PATCH", "resourceclaims", 200)]
    assert check_invariants(cluster) == []


def test_refused_by_an_older_claim_protection_policy_the_claim_is_released_first(
    cluster: Emulator, claim_controller: ResourceClaimController, controller: ControllerThread
) -> None:
    """A policy from before this controller refuses the one-write let-go: the claim is then
    released the longer way, and so is every claim after it (one refusal, not one per claim)."""
    _bind(cluster, "first", template="one")
    cluster.clear_requests()
    cluster.faults.add_error(
        422,
        verbs={"patch"},
        resource="resourceclaims",
        count=1,
        reason="Invalid",
        message="ValidatingAdmissionPolicy 'biaxial-claim-protection' denied request",
    )
    _delete_pod(cluster, "first", controller, claim_controller)
    cluster.wait_until(lambda: not _claim_names(cluster), timeout=20, message="claim left")
    # (the finalizer's removal is written on the version read: the stand-in for
    # kube-controller-manager dropping the same reservation may cost it a 409 and a retry,
    # and a later event seen before the claim's deletion a 404)
    writes = _claim_writes(cluster)
    assert writes[:2] == [("PATCH", "resourceclaims", 422), ("PATCH", "resourceclaims/status", 200)]
    assert ("PATCH", "resourceclaims", 200) in writes[2:]
    _bind(cluster, "second", template="one")
    cluster.clear_requests()
    _delete_pod(cluster, "second", controller, claim_controller)
    cluster.wait_until(lambda: not _claim_names(cluster), timeout=20, message="claim left")
    writes = _claim_writes(cluster)
    assert writes[0] == ("PATCH", "resourceclaims/status", 200)
    assert ("PATCH", "resourceclaims", 200) in writes[1:]
    assert ("PATCH", "resourceclaims", 422) not in writes
    assert _let_go_count(controller) == 0

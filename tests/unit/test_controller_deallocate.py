"""The deallocator's fast path (``Deallocator._in_line``) against its slow path
(``Deallocator.process``): a claim it keeps out of the queue is one that ``process`` would
leave as it is, without a request, for bridge claims and malformed ones alike."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from controller.api import PODS, RESOURCE_CLAIMS
from controller.cache import ClaimOverlay, ClusterCache
from controller.commit import Committer
from controller.deallocate import Deallocator
from controller.metrics import Metrics
from controller.queue import Outcome
from driver.scheduling.bridge import EXTENDED_RESOURCE_CLAIM_ANNOTATION
from tests.unit.controller_fakes import FakeApi

FIN = "gpu.biaxial.dev/allocation"
JSON = dict[str, Any]
POD_UID = "pod-uid-1"
CLAIM = "p-extended-resources-abcde"


def pod(*, node: str = "", linked: str | None = None, phase: str = "Pending") -> JSON:
    body: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "uid": POD_UID},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase},
    }
    if node:
        body["spec"]["nodeName"] = node
    if linked is not None:
        body["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": linked}
    return body


def bridge_claim(**meta_changes: Any) -> JSON:
    body: JSON = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": CLAIM,
            "namespace": "default",
            "uid": "claim-uid-1",
            "finalizers": [FIN],
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": POD_UID, "controller": True}
            ],
        },
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": []}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": POD_UID}],
        },
    }
    body["metadata"].update(meta_changes)
    return body


def _unowned() -> JSON:
    return bridge_claim(ownerReferences=[])


def _owner_without_uid() -> JSON:
    return bridge_claim(ownerReferences=[{"kind": "Pod", "name": "p", "controller": True}])


def _owner_not_a_pod() -> JSON:
    owner = {"kind": "ReplicaSet", "name": "p", "uid": POD_UID, "controller": True}
    return bridge_claim(ownerReferences=[owner])


def _reserved_by_another_resource() -> JSON:
    claim = bridge_claim()
    claim["status"]["reservedFor"] = [{"resource": "jobs", "apiGroup": "batch", "uid": POD_UID}]
    return claim


def _deleting() -> JSON:
    return bridge_claim(deletionTimestamp="2026-01-01T00:00:00Z")


def _unreserved() -> JSON:
    claim = bridge_claim()
    del claim["status"]["reservedFor"]
    return claim


def _not_a_bridge() -> JSON:
    return bridge_claim(annotations={}, ownerReferences=[])


#: (case, the claim, the owning pod in the cache (None: not there), its commit in flight,
#: whether the fast path keeps the claim out of the queue)
CASES = [
    ("unbound owner", bridge_claim(), pod(), False, True),
    ("bound owner linking it", bridge_claim(), pod(node="n1", linked=CLAIM), False, True),
    ("bound owner linking another", bridge_claim(), pod(node="n1", linked="other"), False, False),
    ("bound owner linking none", bridge_claim(), pod(node="n1"), False, False),
    ("owner in flight", bridge_claim(), pod(), True, False),
    ("owner not cached", bridge_claim(), None, False, False),
    ("owner finished", bridge_claim(), pod(phase="Succeeded"), False, False),
    ("no owner", _unowned(), pod(), False, False),
    ("owner without uid", _owner_without_uid(), pod(), False, False),
    ("owner not a pod", _owner_not_a_pod(), pod(), False, False),
    ("reserved by a non-pod", _reserved_by_another_resource(), pod(), False, False),
    ("marked for deletion", _deleting(), pod(), False, False),
    ("unreserved", _unreserved(), pod(), False, False),
    ("a user's claim", _not_a_bridge(), pod(), False, True),
]


@pytest.mark.parametrize(
    ("claim", "owner", "in_flight", "in_line"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_fast_path_agrees_with_process(
    claim: JSON, owner: JSON | None, in_flight: bool, in_line: bool
) -> None:
    api = FakeApi()
    if owner is not None:
        api.seed(PODS, owner)
    api.seed(RESOURCE_CLAIMS, claim)
    cache = ClusterCache(FakeApi())
    committer = Committer(api, ClaimOverlay(cache.claims), finalizer=FIN)
    deallocator = Deallocator(api, cache, committer, Metrics(), finalizer=FIN)
    if owner is not None:
        cache.pods.apply("ADDED", copy.deepcopy(owner))
    cache.claims.apply("ADDED", copy.deepcopy(claim))
    if in_flight:
        committer.pods_in_flight.add(POD_UID)
    key = f"default/{CLAIM}"
    cached = cache.claims.get(key)
    assert cached is not None

    assert deallocator._in_line(key, cached) is in_line
    if in_line:
        outcome = asyncio.run(deallocator.process(key))
        assert outcome is Outcome.FORGET
        assert api.verbs() == []  # nothing read live, nothing written


@pytest.mark.parametrize("owner_stays", [True, False])
def test_a_bridge_claim_heard_while_its_commit_runs_waits_for_the_commit(
    owner_stays: bool,
) -> None:
    """Its creation's event may come before the commit locks the new claim: it is set aside
    as a locked claim is, and looked at when the commit unlocks it (queued only when there is
    something to do then: its pod gone)."""
    api = FakeApi()
    cache = ClusterCache(FakeApi())
    committer = Committer(api, ClaimOverlay(cache.claims), finalizer=FIN)
    deallocator = Deallocator(api, cache, committer, Metrics(), finalizer=FIN)
    cache.pods.apply("ADDED", pod())
    committer.pods_in_flight.add(POD_UID)
    created = bridge_claim()
    del created["status"]  # as created: the commit writes its status next
    cache.claims.apply("ADDED", created)
    key = f"default/{CLAIM}"
    assert not deallocator.queue.is_queued(key)
    cache.claims.apply("MODIFIED", bridge_claim())
    if not owner_stays:
        cache.pods.apply("DELETED", pod())
    committer._lock([key])  # what the commit does once the create answered
    committer.pods_in_flight.discard(POD_UID)
    committer._unlock([key])  # and at its end
    assert deallocator.queue.is_queued(key) is not owner_stays

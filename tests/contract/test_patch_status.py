"""Contract: patch types with strategic merge by key, and the status subresource rules
(must-have items 5 and 6)."""

from __future__ import annotations

import json
from typing import Any

from tests.contract.conftest import Api, claim, needs_emulator, pod

SMP = "application/strategic-merge-patch+json"


def _allocation() -> dict[str, Any]:
    return {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": "gpu.contract.example.com",
                    "pool": "node-a",
                    "device": "gpu-0",
                }
            ]
        }
    }


def _ref(name: str, uid: str) -> dict[str, str]:
    return {"resource": "pods", "name": name, "uid": uid}


def test_strategic_merge_reserved_for_by_uid(api: Api) -> None:
    # reservations name pods that exist: kube-controller-manager's resourceclaim controller
    # drops a reservation whose pod is gone (pkg/controller/resourceclaim, syncClaim)
    first, second = (
        _ref(name, api.ok(api.post(api.pods(), pod(name)), 201)["metadata"]["uid"])
        for name in ("a", "b")
    )
    api.ok(api.post(api.claims(), claim("c")), 201)
    api.ok(api.patch(api.claims("c") + "/status", {"status": {"allocation": _allocation()}}))
    api.ok(api.patch(api.claims("c") + "/status", {"status": {"reservedFor": [first]}}, SMP))
    merged = api.ok(
        api.patch(api.claims("c") + "/status", {"status": {"reservedFor": [second]}}, SMP)
    )
    # merged by uid; strategicpatch.normalizeElementOrder puts the patch's new entry first
    assert [r["uid"] for r in merged["status"]["reservedFor"]] == [second["uid"], first["uid"]]
    removed = api.ok(
        api.patch(
            api.claims("c") + "/status",
            {"status": {"reservedFor": [{"uid": first["uid"], "$patch": "delete"}]}},
            SMP,
        )
    )
    assert [r["uid"] for r in removed["status"]["reservedFor"]] == [second["uid"]]
    # a merge patch replaces the whole list
    replaced = api.ok(api.patch(api.claims("c") + "/status", {"status": {"reservedFor": [first]}}))
    assert [r["uid"] for r in replaced["status"]["reservedFor"]] == [first["uid"]]


def test_an_allocation_is_dropped_only_with_the_last_reservation(api: Api) -> None:
    """What the controller's one-write release (``Committer.release``) relies on: a status
    whose ``reservedFor`` is left without an allocation is refused (upstream's
    ``validateResourceClaimStatusUpdate``: "may not be specified when `allocated` is not
    set"), so a patch that drops one pod's reservation and the allocation, with no
    resourceVersion, lands only when no other consumer reserves the claim."""
    first, second = (
        _ref(name, api.ok(api.post(api.pods(), pod(name)), 201)["metadata"]["uid"])
        for name in ("a", "b")
    )
    api.ok(api.post(api.claims(), claim("c")), 201)
    api.ok(api.patch(api.claims("c") + "/status", {"status": {"allocation": _allocation()}}))
    api.ok(api.patch(api.claims("c") + "/status", {"status": {"reservedFor": [first, second]}}))

    def release(uid: str) -> Any:
        body = {
            "status": {
                "reservedFor": [{"$patch": "delete", "uid": uid}],
                "allocation": None,
                "devices": None,
            }
        }
        return api.patch(api.claims("c") + "/status", body, SMP)

    refused = release(first["uid"])
    assert refused.status == 422, refused
    assert "may not be specified when `allocated` is not set" in json.dumps(refused.body)
    kept = api.ok(api.get(api.claims("c")))["status"]
    assert [r["uid"] for r in kept["reservedFor"]] == [first["uid"], second["uid"]]
    assert kept["allocation"] == _allocation()
    api.ok(
        api.patch(
            api.claims("c") + "/status",
            {"status": {"reservedFor": [{"$patch": "delete", "uid": second["uid"]}]}},
            SMP,
        )
    )
    released = api.ok(release(first["uid"]))["status"]
    assert "allocation" not in released
    assert not released.get("reservedFor")


def test_a_claim_marked_for_deletion_takes_no_new_reservation(api: Api) -> None:
    """What the controller's one-write let-go (``Committer.let_go``) relies on: once a claim is
    marked for deletion, a status write that adds a consumer to ``reservedFor`` is refused
    (upstream's ``validateResourceClaimStatusUpdate``: "new entries may not be added while
    `deallocationRequested` or `deletionTimestamp` are set"), so the reservations seen on a
    marked claim can only shrink; and removing its last finalizer without a resourceVersion
    deletes it, allocated and reserved as it is."""
    first, second = (
        _ref(name, api.ok(api.post(api.pods(), pod(name)), 201)["metadata"]["uid"])
        for name in ("a", "b")
    )
    finalizer = "gpu.contract.example.com/allocation"
    body = claim("c")
    body["metadata"]["finalizers"] = [finalizer]
    api.ok(api.post(api.claims(), body), 201)
    status = {"allocation": _allocation(), "reservedFor": [first]}
    api.ok(api.patch(api.claims("c") + "/status", {"status": status}))
    marked = api.ok(api.delete(api.claims("c")))
    assert marked["metadata"]["deletionTimestamp"]

    added = api.patch(api.claims("c") + "/status", {"status": {"reservedFor": [second]}}, SMP)
    assert added.status == 422, added
    assert "new entries may not be added" in json.dumps(added.body)
    kept = api.ok(api.get(api.claims("c")))["status"]
    assert [r["uid"] for r in kept["reservedFor"]] == [first["uid"]]

    let_go = {"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}}
    api.ok(api.patch(api.claims("c"), let_go, SMP))
    assert api.get(api.claims("c")).status == 404


def test_strategic_merge_conditions_by_type(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("p")), 201)
    ready = {"type": "Ready", "status": "False"}
    custom = {"type": "example.com/Custom", "status": "True"}
    api.ok(api.patch(api.pods("p") + "/status", {"status": {"conditions": [ready]}}, SMP))
    both = api.ok(api.patch(api.pods("p") + "/status", {"status": {"conditions": [custom]}}, SMP))
    assert {c["type"] for c in both["status"]["conditions"]} == {"Ready", "example.com/Custom"}
    flipped = api.ok(
        api.patch(
            api.pods("p") + "/status",
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            SMP,
        )
    )
    by_type = {c["type"]: c["status"] for c in flipped["status"]["conditions"]}
    assert by_type == {"Ready": "True", "example.com/Custom": "True"}


def test_strategic_merge_finalizers_as_a_set(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("p")), 201)
    api.ok(api.patch(api.pods("p"), {"metadata": {"finalizers": ["example.com/a"]}}, SMP))
    both = api.ok(
        api.patch(
            api.pods("p"), {"metadata": {"finalizers": ["example.com/b", "example.com/a"]}}, SMP
        )
    )
    assert sorted(both["metadata"]["finalizers"]) == ["example.com/a", "example.com/b"]
    left = api.ok(
        api.patch(
            api.pods("p"),
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a"]}},
            SMP,
        )
    )
    assert left["metadata"]["finalizers"] == ["example.com/b"]
    api.ok(api.patch(api.pods("p"), {"metadata": {"finalizers": None}}))


def test_json_and_merge_patch(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("p")), 201)
    merged = api.ok(api.patch(api.pods("p"), {"metadata": {"labels": {"a": "1", "b": "2"}}}))
    assert merged["metadata"]["labels"] == {"a": "1", "b": "2"}
    dropped = api.ok(api.patch(api.pods("p"), {"metadata": {"labels": {"a": None}}}))
    assert dropped["metadata"]["labels"] == {"b": "2"}
    ops = [{"op": "replace", "path": "/metadata/labels/b", "value": "3"}]
    assert api.ok(api.patch(api.pods("p"), ops, "application/json-patch+json"))["metadata"][
        "labels"
    ] == {"b": "3"}
    bad = api.patch(
        api.pods("p"),
        [{"op": "remove", "path": "/metadata/labels/nope"}],
        "application/json-patch+json",
    )
    assert bad.status == 422
    malformed = api.patch(api.pods("p"), b"[{", "application/json-patch+json")
    assert malformed.status == 400


def test_main_resource_writes_keep_status(api: Api) -> None:
    api.ok(api.post(api.claims(), claim("c")), 201)
    allocated = api.ok(
        api.patch(api.claims("c") + "/status", {"status": {"allocation": _allocation()}})
    )
    body = dict(allocated)
    body["status"] = {}
    body["metadata"] = {**allocated["metadata"], "labels": {"x": "y"}}
    kept = api.ok(api.put(api.claims("c"), body))
    assert kept["status"] == allocated["status"]
    assert kept["metadata"]["labels"] == {"x": "y"}
    patched = api.ok(
        api.patch(api.claims("c"), {"status": None, "metadata": {"labels": {"x": "z"}}})
    )
    assert patched["status"] == allocated["status"]


def test_status_writes_keep_spec_and_metadata(api: Api) -> None:
    """A status write never changes the spec. Metadata depends on the kind's status strategy:
    podStatusStrategy lets labels, annotations and finalizers through (only owner references
    and the deletion timestamp stay), the ResourceClaim one calls
    metav1.ResetObjectMetaForStatus (pkg/registry/*/strategy.go, PrepareForUpdate)."""
    created = api.ok(api.post(api.pods(), pod("p")), 201)
    body = dict(created)
    body["metadata"] = {
        **created["metadata"],
        "labels": {"through": "yes"},
        "annotations": {"a": "b"},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": created["metadata"]["uid"]}
        ],
    }
    body["spec"] = {**created["spec"], "activeDeadlineSeconds": 5}
    body["status"] = {**created["status"], "phase": "Running"}
    written = api.ok(api.put(api.pods("p") + "/status", body))
    assert written["status"]["phase"] == "Running"
    assert written["metadata"]["labels"] == {"through": "yes"}
    assert written["metadata"]["annotations"] == {"a": "b"}
    assert "ownerReferences" not in written["metadata"]
    assert "activeDeadlineSeconds" not in written["spec"]
    assert int(written["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    stale = api.put(api.pods("p") + "/status", body)
    assert stale.status == 409

    held = claim("c")
    held["metadata"]["labels"] = {"kept": "yes"}
    stored = api.ok(api.post(api.claims(), held), 201)
    status_body = dict(stored)
    status_body["metadata"] = {
        **stored["metadata"],
        "labels": {"sneaky": "yes"},
        "annotations": {"a": "b"},
        "finalizers": ["example.com/f"],
    }
    status_body["status"] = {"allocation": _allocation()}
    allocated = api.ok(api.put(api.claims("c") + "/status", status_body))
    assert allocated["status"]["allocation"] == _allocation()
    assert allocated["metadata"]["labels"] == {"kept": "yes"}
    assert "annotations" not in allocated["metadata"]
    assert "finalizers" not in allocated["metadata"]


def test_claim_status_dropped_on_create_and_spec_immutable(api: Api) -> None:
    body = claim("c")
    body["status"] = {"allocation": _allocation()}
    created = api.ok(api.post(api.claims(), body), 201)
    assert "status" not in created or not created["status"].get("allocation")
    assert created["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] == "ExactCount"
    changed = dict(created)
    changed["spec"] = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": "gpu.contract.example.com", "count": 2},
                }
            ]
        }
    }
    response = api.put(api.claims("c"), changed)
    assert response.status == 422
    assert response.reason == "Invalid"
    assert any(c["field"] == "spec" for c in response.body["details"]["causes"])
    patched = api.patch(
        api.claims("c"),
        {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "other",
                            "exactly": {"deviceClassName": "gpu.contract.example.com"},
                        }
                    ]
                }
            }
        },
    )
    assert patched.status == 422
    # unchanged spec (the defaults spelled out or not) is accepted
    same = dict(created)
    same["metadata"] = {**created["metadata"], "labels": {"ok": "yes"}}
    assert api.ok(api.put(api.claims("c"), same))["metadata"]["labels"] == {"ok": "yes"}


def test_apply_patch_is_unsupported_media_type(api: Api) -> None:
    needs_emulator(api)
    api.ok(api.post(api.pods(), pod("p")), 201)
    response = api.patch(api.pods("p"), b"{}", "application/apply-patch+yaml")
    assert response.status == 415
    assert response.reason == "UnsupportedMediaType"


def _configured(parameters: dict[str, Any]) -> dict[str, Any]:
    allocation = _allocation()
    opaque = {"driver": "gpu.contract.example.com", "parameters": parameters}
    allocation["devices"]["config"] = [{"source": "FromClaim", "opaque": opaque}]
    return allocation


def _allocated(api: Api, name: str, parameters: dict[str, Any]) -> list[dict[str, str]]:
    """Claim ``name`` allocated with ``parameters`` (as the client encodes them) and reserved
    for a pod; returns that reservation and a second pod's."""
    refs = [
        _ref(n, api.ok(api.post(api.pods(), pod(n)), 201)["metadata"]["uid"])
        for n in (f"{name}-a", f"{name}-b")
    ]
    stored = api.ok(api.post(api.claims(), claim(name)), 201)
    stored["status"] = {"allocation": _configured(parameters), "reservedFor": refs[:1]}
    api.ok(api.put(api.claims(name) + "/status", stored))
    return refs


def test_opaque_parameters_survive_status_writes_in_go_form(api: Api) -> None:
    """The client encodes as Go writes a map (keys sorted, ``<>&`` escaped, UTF-8): the
    server's byte-for-byte comparison of the allocation's opaque parameters then holds for a
    PUT of what was read back and for every kind of patch of the status."""
    parameters = {"zeta": "a&b<c>é", "alpha": [1, 2.5], "kind": "GpuConfig"}
    first, second = _allocated(api, "go-form", parameters)
    path = api.claims("go-form") + "/status"
    read = api.ok(api.get(api.claims("go-form")))
    read["status"]["reservedFor"].append(second)
    written = api.ok(api.put(path, read))
    assert written["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] == (
        parameters
    )
    api.ok(api.patch(path, {"status": {"reservedFor": [first]}}))
    api.ok(api.patch(path, {"status": {"reservedFor": [second]}}, SMP))
    patch = [{"op": "remove", "path": "/status/reservedFor/1"}]
    api.ok(api.patch(path, patch, "application/json-patch+json"))


def test_opaque_parameters_in_other_bytes_freeze_the_status(api: Api) -> None:
    """Parameters written in other bytes than Go's (spaces, keys unsorted): a PUT of the
    same values in Go's form, and a patch (the server re-encodes the stored bytes), modify
    ``status.allocation`` and are refused; only deallocation is still possible."""
    parameters = {"kind": "GpuConfig", "apiVersion": "v1"}
    first = _ref("spaced-a", api.ok(api.post(api.pods(), pod("spaced-a")), 201)["metadata"]["uid"])
    stored = api.ok(api.post(api.claims(), claim("spaced")), 201)
    stored["status"] = {"allocation": _configured(parameters), "reservedFor": [first]}
    path = api.claims("spaced") + "/status"
    api.ok(api.request("PUT", path, json.dumps(stored).encode()))
    read = api.ok(api.get(api.claims("spaced")))
    refused = api.put(path, read)
    assert refused.status == 422, refused
    assert "status.allocation: Invalid value: null: field cannot be modified once set" in str(
        refused.body
    )
    for content_type in ("application/merge-patch+json", SMP):
        patched = api.patch(path, {"status": {"reservedFor": [first]}}, content_type)
        assert patched.status == 422, (content_type, patched)
    released = api.ok(api.patch(path, {"status": {"reservedFor": None, "allocation": None}}))
    assert "allocation" not in released["status"]

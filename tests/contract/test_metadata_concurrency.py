"""Contract: metadata ownership, the global resourceVersion, no-op updates and optimistic
concurrency (must-have items 3 and 4)."""

from __future__ import annotations

import re

from tests.contract.conftest import Api, claim, pod, resource_slice


def test_create_sets_server_metadata(api: Api) -> None:
    created = api.ok(api.post(api.pods(), pod("p")), 201)
    meta = created["metadata"]
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["namespace"] == api.namespace
    assert int(meta["resourceVersion"]) > 0
    assert created["kind"] == "Pod"
    assert created["apiVersion"] == "v1"


def test_generate_name(api: Api) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "worker-"}
    first = api.ok(api.post(api.pods(), body), 201)
    second = api.ok(api.post(api.pods(), body), 201)
    assert re.fullmatch(r"worker-[a-z0-9]{5}", first["metadata"]["name"])
    assert first["metadata"]["name"] != second["metadata"]["name"]
    assert first["metadata"]["generateName"] == "worker-"
    nameless = pod("")
    nameless["metadata"] = {}
    response = api.post(api.pods(), nameless)
    assert response.status == 422
    assert response.body["details"]["causes"][0]["field"] == "metadata.name"


def test_namespace_defaulting_and_mismatch(api: Api) -> None:
    body = pod("p")
    assert "namespace" not in body["metadata"]
    assert api.ok(api.post(api.pods(), body), 201)["metadata"]["namespace"] == api.namespace
    other = pod("q")
    other["metadata"]["namespace"] = "default"
    response = api.post(api.pods(), other)
    assert response.status == 400
    assert response.reason == "BadRequest"
    assert "namespace" in response.body["message"]
    missing = api.post("/api/v1/namespaces/no-such-ns-here/pods", pod("z"))
    assert missing.status == 404
    assert missing.body["details"]["kind"] == "namespaces"


def test_generation_tracks_spec_changes_only(api: Api) -> None:
    name = api.name("gen")
    created = api.ok(api.post(api.slices(), resource_slice(name, name)), 201)
    assert created["metadata"]["generation"] == 1
    labelled = api.ok(api.patch(api.slices(name), {"metadata": {"labels": {"x": "y"}}}))
    assert labelled["metadata"]["generation"] == 1
    changed = api.ok(api.patch(api.slices(name), {"spec": {"pool": {"generation": 2}}}))
    assert changed["metadata"]["generation"] == 2


def test_one_global_monotonic_resource_version(api: Api) -> None:
    first = api.ok(api.post(api.pods(), pod("p")), 201)
    second = api.ok(api.post(api.claims(), claim("c")), 201)
    name = api.name("rv")
    third = api.ok(api.post(api.slices(), resource_slice(name, name)), 201)
    rvs = [int(o["metadata"]["resourceVersion"]) for o in (first, second, third)]
    assert rvs == sorted(rvs)
    assert len(set(rvs)) == 3
    listed = api.ok(api.get(api.pods()))
    assert int(listed["metadata"]["resourceVersion"]) >= rvs[-1]
    updated = api.ok(api.patch(api.pods("p"), {"metadata": {"labels": {"a": "b"}}}))
    assert int(updated["metadata"]["resourceVersion"]) > rvs[-1]


def test_noop_update_keeps_resource_version_and_sends_no_event(api: Api) -> None:
    created = api.ok(api.post(api.pods(), pod("p", terminationGracePeriodSeconds=0)), 201)
    rv = created["metadata"]["resourceVersion"]
    stream = api.watch(api.pods(), resourceVersion=rv, timeoutSeconds="1")
    same = api.ok(api.put(api.pods("p"), created))
    assert same["metadata"]["resourceVersion"] == rv
    patched = api.ok(api.patch(api.pods("p"), {"metadata": {"labels": None}}))
    assert patched["metadata"]["resourceVersion"] == rv
    assert stream.rest() == []


def test_stale_put_conflicts_and_unconditional_put_wins(api: Api) -> None:
    created = api.ok(api.post(api.pods(), pod("p")), 201)
    api.ok(api.patch(api.pods("p"), {"metadata": {"labels": {"v": "1"}}}))
    stale = dict(created)
    stale["metadata"] = {**created["metadata"], "labels": {"v": "stale"}}
    response = api.put(api.pods("p"), stale)
    assert response.status == 409
    assert response.reason == "Conflict"
    assert "the object has been modified" in response.body["message"]
    unconditional = dict(stale)
    unconditional["metadata"] = {
        k: v for k, v in stale["metadata"].items() if k != "resourceVersion"
    }
    assert api.ok(api.put(api.pods("p"), unconditional))["metadata"]["labels"] == {"v": "stale"}


def test_patch_with_stale_resource_version_conflicts(api: Api) -> None:
    created = api.ok(api.post(api.pods(), pod("p")), 201)
    rv = created["metadata"]["resourceVersion"]
    api.ok(api.patch(api.pods("p"), {"metadata": {"labels": {"v": "1"}}}))
    stale = api.patch(api.pods("p"), {"metadata": {"resourceVersion": rv, "labels": {"v": "2"}}})
    assert stale.status == 409
    strategic = api.patch(
        api.pods("p"),
        {"metadata": {"resourceVersion": rv, "labels": {"v": "2"}}},
        content_type="application/strategic-merge-patch+json",
    )
    assert strategic.status == 409
    # without resourceVersion a merge patch is unconditional
    assert (
        api.ok(api.patch(api.pods("p"), {"metadata": {"labels": {"v": "3"}}}))["metadata"][
            "labels"
        ]["v"]
        == "3"
    )


def test_json_patch_test_operation_on_resource_version(api: Api) -> None:
    created = api.ok(api.post(api.pods(), pod("p")), 201)
    rv = created["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
    ]
    assert api.ok(api.patch(api.pods("p"), ops, "application/json-patch+json"))["metadata"][
        "labels"
    ] == {"a": "b"}
    again = api.patch(api.pods("p"), ops, "application/json-patch+json")
    assert again.status == 422
    assert api.ok(api.get(api.pods("p")))["metadata"]["labels"] == {"a": "b"}


def test_delete_preconditions(api: Api) -> None:
    created = api.ok(api.post(api.pods(), pod("p")), 201)
    wrong_uid = api.delete(
        api.pods("p"),
        {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"},
        },
    )
    # rest.BeforeDelete checks the preconditions and names the object by its Kind
    assert wrong_uid.status == 409
    assert wrong_uid.reason == "Conflict"
    assert wrong_uid.body["message"].startswith('Operation cannot be fulfilled on Pod "p": ')
    assert "the UID in the precondition" in wrong_uid.body["message"]
    api.ok(api.patch(api.pods("p"), {"metadata": {"labels": {"a": "b"}}}))
    wrong_rv = api.delete(
        api.pods("p"),
        {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": created["metadata"]["resourceVersion"]},
        },
    )
    assert wrong_rv.status == 409
    assert "the ResourceVersion in the precondition" in wrong_rv.body["message"]
    assert api.get(api.pods("p")).status == 200
    deleted = api.delete(
        api.pods("p"),
        {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": created["metadata"]["uid"]},
        },
    )
    assert deleted.status == 200

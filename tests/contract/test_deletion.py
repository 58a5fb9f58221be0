"""Contract: deletion, finalizers and deletionTimestamp (must-have item 10)."""

from __future__ import annotations

from tests.contract.conftest import Api, claim, pod


def test_delete_without_finalizers_returns_the_object(api: Api) -> None:
    created = api.ok(api.post(api.claims(), claim("c")), 201)
    stream = api.watch(api.claims(), resourceVersion=created["metadata"]["resourceVersion"])
    deleted = api.ok(api.delete(api.claims("c")))
    assert deleted["metadata"]["name"] == "c"
    assert deleted["metadata"]["uid"] == created["metadata"]["uid"]
    assert api.get(api.claims("c")).status == 404
    events = stream.take(1)
    assert events[0]["type"] == "DELETED"
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    assert api.delete(api.claims("c")).status == 404


def test_finalizers_hold_the_object_until_removed(api: Api) -> None:
    body = claim("c")
    body["metadata"]["finalizers"] = ["example.com/one", "example.com/two"]
    created = api.ok(api.post(api.claims(), body), 201)
    stream = api.watch(api.claims(), resourceVersion=created["metadata"]["resourceVersion"])
    pending = api.ok(api.delete(api.claims("c")))
    assert pending["metadata"]["deletionTimestamp"]
    assert api.ok(api.get(api.claims("c")))["metadata"]["deletionTimestamp"]
    marked = stream.take(1)
    assert marked[0]["type"] == "MODIFIED"
    assert marked[0]["object"]["metadata"]["deletionTimestamp"]
    again = api.ok(api.delete(api.claims("c")))
    assert again["metadata"]["resourceVersion"] == pending["metadata"]["resourceVersion"]
    refused = api.patch(
        api.claims("c"),
        {"metadata": {"finalizers": ["example.com/one", "example.com/two", "example.com/three"]}},
    )
    assert refused.status == 422
    api.ok(api.patch(api.claims("c"), {"metadata": {"finalizers": ["example.com/two"]}}))
    assert stream.take(1)[0]["type"] == "MODIFIED"
    assert api.get(api.claims("c")).status == 200
    api.ok(api.patch(api.claims("c"), {"metadata": {"finalizers": None}}))
    gone = stream.take(1)
    assert gone[0]["type"] == "DELETED"
    assert api.get(api.claims("c")).status == 404


def test_unscheduled_pod_is_deleted_at_once_bound_pod_gracefully(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("free")), 201)
    api.ok(api.delete(api.pods("free")))
    assert api.get(api.pods("free")).status == 404
    api.ok(api.post(api.pods(), pod("bound")), 201)
    api.ok(
        api.post(
            api.pods("bound") + "/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "bound"},
                "target": {"kind": "Node", "name": "node-gone"},
            },
        ),
        201,
    )
    terminating = api.ok(api.delete(api.pods("bound")))
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    assert api.get(api.pods("bound")).status == 200
    api.ok(api.request("DELETE", api.pods("bound"), query={"gracePeriodSeconds": "0"}))
    assert api.get(api.pods("bound")).status == 404

"""Contract: watch semantics (must-have item 9)."""

from __future__ import annotations

import pytest

from tests.contract.conftest import Api, needs_emulator, pod


def _labelled(name: str, **labels: str) -> dict:
    body = pod(name)
    body["metadata"]["labels"] = labels
    return body


def test_watch_without_rv_sends_synthetic_added_then_live_events(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("a")), 201)
    api.ok(api.post(api.pods(), pod("b")), 201)
    stream = api.watch(api.pods())
    initial = stream.take(2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in initial] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
    ]
    assert initial[0]["object"]["kind"] == "Pod"
    api.ok(api.patch(api.pods("a"), {"metadata": {"labels": {"x": "y"}}}))
    api.ok(api.post(api.pods(), pod("c")), 201)
    live = stream.take(2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in live] == [
        ("MODIFIED", "a"),
        ("ADDED", "c"),
    ]


def test_watch_from_rv_zero_sends_current_state(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("a")), 201)
    stream = api.watch(api.pods(), resourceVersion="0")
    assert [e["type"] for e in stream.take(1)] == ["ADDED"]


def test_watch_from_rv_replays_exactly_the_later_events(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("a")), 201)
    rv = api.ok(api.get(api.pods()))["metadata"]["resourceVersion"]
    api.ok(api.post(api.pods(), pod("b", terminationGracePeriodSeconds=0)), 201)
    api.ok(api.patch(api.pods("a"), {"metadata": {"labels": {"x": "y"}}}))
    api.ok(api.delete(api.pods("b")))
    stream = api.watch(api.pods(), resourceVersion=rv)
    events = stream.take(4)
    # a pod's delete is graceful even at 0 s: the store writes deletionTimestamp first (one
    # MODIFIED), then deletes (apiserver generic/registry/store.go,
    # updateForGracefulDeletionAndFinalizers; the pod is unscheduled, so the period is 0)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("MODIFIED", "b"),
        ("DELETED", "b"),
    ]
    deleting = events[2]["object"]["metadata"]
    assert deleting["deletionTimestamp"]
    assert deleting["deletionGracePeriodSeconds"] == 0
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs)
    assert rvs[0] > int(rv)


def test_watch_from_a_compacted_rv_is_an_error_410(api: Api) -> None:
    emulator = needs_emulator(api)
    created = api.ok(api.post(api.pods(), pod("a")), 201)
    api.ok(api.patch(api.pods("a"), {"metadata": {"labels": {"x": "y"}}}))
    emulator.compact()
    stream = api.watch(api.pods(), resourceVersion=created["metadata"]["resourceVersion"])
    events = stream.rest()
    assert len(events) == 1
    assert events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["kind"] == "Status"
    assert status["code"] == 410
    assert status["reason"] == "Expired"


def test_timeout_seconds_ends_the_stream(api: Api) -> None:
    import time

    start = time.monotonic()
    stream = api.watch(api.pods(), timeoutSeconds="1")
    assert stream.rest(timeout=10) == []
    assert 0.5 <= time.monotonic() - start < 5


@pytest.mark.emulator(bookmark_interval=0.2)
def test_bookmarks_carry_the_current_resource_version(api: Api) -> None:
    needs_emulator(api)
    rv = api.ok(api.get(api.pods()))["metadata"]["resourceVersion"]
    stream = api.watch(
        api.pods(), resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds="1"
    )
    api.ok(api.post("/api/v1/namespaces/default/pods", pod(api.name("elsewhere"))), 201)
    events = stream.rest()
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks
    assert int(bookmarks[-1]["object"]["metadata"]["resourceVersion"]) > int(rv)
    assert bookmarks[-1]["object"]["kind"] == "Pod"
    assert all(e["type"] == "BOOKMARK" for e in events)
    api.delete(f"/api/v1/namespaces/default/pods/{api.name('elsewhere')}")


def test_no_bookmarks_unless_asked(api: Api) -> None:
    stream = api.watch(api.pods(), timeoutSeconds="1")
    assert all(e["type"] != "BOOKMARK" for e in stream.rest())


def test_selector_transitions(api: Api) -> None:
    api.ok(api.post(api.pods(), _labelled("a", tier="gpu")), 201)
    stream = api.watch(api.pods(), labelSelector="tier=gpu")
    assert [e["type"] for e in stream.take(1)] == ["ADDED"]
    api.ok(api.patch(api.pods("a"), {"metadata": {"labels": {"tier": "cpu"}}}))
    left = stream.take(1)
    assert left[0]["type"] == "DELETED"
    assert left[0]["object"]["metadata"]["name"] == "a"
    api.ok(api.patch(api.pods("a"), {"metadata": {"labels": {"note": "x"}}}))
    api.ok(api.patch(api.pods("a"), {"metadata": {"labels": {"tier": "gpu"}}}))
    back = stream.take(1)
    assert back[0]["type"] == "ADDED"
    assert back[0]["object"]["metadata"]["labels"]["tier"] == "gpu"


def test_field_selector_watch_and_namespace_scoping(api: Api) -> None:
    stream = api.watch(api.pods(), fieldSelector="spec.nodeName=node-w")
    api.ok(api.post(api.pods(), pod("a")), 201)
    api.ok(api.post(api.pods(), pod("b")), 201)
    api.ok(
        api.post(
            api.pods("b") + "/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "b"},
                "target": {"kind": "Node", "name": "node-w"},
            },
        ),
        201,
    )
    events = stream.take(1)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]

"""Watch caches (controller.cache) against a fake API: list then watch, resume from the last
resourceVersion (bookmarks included), relist on 410 with the gap reported, retry on 5xx;
the claim overlay's pending and assumed state."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.api import NODES, RESOURCE_CLAIMS, ListResult, WatchEvent
from controller.cache import ClaimOverlay, Informer, slim
from driver.api.errors import GoneError, ServerError
from tests.unit.controller_fakes import FakeApi

JSON = dict[str, Any]


def node(name: str, rv: int) -> JSON:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}}


def claim(name: str, rv: int, *, allocated: bool = False) -> JSON:
    obj: JSON = {"metadata": {"name": name, "namespace": "default", "resourceVersion": str(rv)}}
    if allocated:
        obj["status"] = {"allocation": {"devices": {"results": []}}}
    return obj


async def until(predicate: Any, limit_s: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def test_list_then_watch_then_resume_then_relist_on_gone() -> None:
    events: list[tuple[str, str]] = []

    async def scenario() -> None:
        api = FakeApi()
        api.lists = [
            ListResult(items=[node("a", 5), node("b", 6)], resource_version="10"),
            ListResult(items=[node("b", 30), node("c", 31)], resource_version="40"),
        ]
        informer = Informer(api, NODES, transform=slim, retry_initial_s=0.01)
        informer.add_handler(
            lambda _k, t, o, n: events.append((t, (n or o or {})["metadata"]["name"]))
        )
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(informer.synced.wait(), 1)
        assert set(informer.store) == {"a", "b"}
        await until(lambda: api.watch_calls == [("nodes", "10")])
        api.push_event("nodes", WatchEvent("MODIFIED", node("a", 11)))
        api.push_event("nodes", WatchEvent("BOOKMARK", node("", 15)))
        api.end_watch("nodes")  # the server ends the stream: resume from the bookmark
        await until(lambda: len(api.watch_calls) == 2)
        assert api.watch_calls[1] == ("nodes", "15")
        api.push_event("nodes", WatchEvent("DELETED", node("a", 16)))
        api.push_event("nodes", ServerError("connection reset", status=0))
        await until(lambda: len(api.watch_calls) == 3)
        assert api.watch_calls[2] == ("nodes", "16"), "a transport error resumes, no relist"
        api.push_event("nodes", GoneError("too old", status=410))
        await until(lambda: informer.stats.relists_on_gone == 1 and len(api.watch_calls) == 4)
        assert api.watch_calls[3] == ("nodes", "40")
        assert set(informer.store) == {"b", "c"}
        assert informer.stats.lists == 2
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert events == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
        ("MODIFIED", "b"),  # seen again after the relist, with a newer resourceVersion
        ("ADDED", "c"),
    ]


def test_relist_reports_objects_that_vanished_during_the_gap() -> None:
    events: list[tuple[str, str]] = []

    async def scenario() -> None:
        api = FakeApi()
        api.lists = [
            ListResult(items=[node("a", 5)], resource_version="5"),
            ListResult(items=[], resource_version="9"),
        ]
        informer = Informer(api, NODES, transform=slim)
        informer.add_handler(
            lambda _k, t, o, n: events.append((t, (n or o or {})["metadata"]["name"]))
        )
        await informer.relist()
        await informer.relist()

    asyncio.run(scenario())
    assert events == [("ADDED", "a"), ("DELETED", "a")]


def test_a_list_item_that_is_not_an_object_is_left_out_not_the_relist() -> None:
    """A page's item that is no object at all (a string, null, a list) is left out and counted,
    as a malformed object is: the relist stores the rest rather than failing on it (it once
    raised AttributeError naming the item for the warning)."""
    events: list[tuple[str, str]] = []

    async def scenario() -> Informer:
        api = FakeApi()
        items: list[Any] = [node("a", 5), "x", None, [], 7, node("b", 6)]
        api.lists = [ListResult(items=items, resource_version="9")]
        informer = Informer(api, NODES, transform=slim)
        informer.add_handler(
            lambda _k, t, o, n: events.append((t, (n or o or {})["metadata"]["name"]))
        )
        await informer.relist()
        return informer

    informer = asyncio.run(scenario())
    assert set(informer.store) == {"a", "b"}
    assert informer.stats.malformed == 4
    assert events == [("ADDED", "a"), ("ADDED", "b")]


def test_overlay_shows_pending_and_assumed_until_the_informer_catches_up() -> None:
    informer = Informer(FakeApi(), RESOURCE_CLAIMS, transform=slim)
    informer.store["default/c"] = claim("c", 10)
    overlay = ClaimOverlay(informer)
    overlay.set_pending("default/c", claim("c", 10, allocated=True))
    assert overlay.get("default/c")["status"]  # type: ignore[index]
    assert overlay.latest_written("default/c") == claim("c", 10)
    written = claim("c", 12, allocated=True)
    overlay.assume(written)
    assert overlay.get("default/c") == written
    overlay.observe("default/c", claim("c", 11))  # older than the write: keep assuming
    informer.store["default/c"] = claim("c", 11)
    assert overlay.view()["default/c"] == written
    informer.store["default/c"] = claim("c", 12, allocated=True)
    overlay.observe("default/c", informer.store["default/c"])
    assert overlay.in_flight == 0
    assert overlay.view()["default/c"] is informer.store["default/c"]


def test_written_listeners_hear_only_what_may_change_the_written_state() -> None:
    """The pending state alone, and an informer event older than an assumed write, leave
    what latest_written answers as it was: only the other listeners hear of them."""
    informer = Informer(FakeApi(), RESOURCE_CLAIMS, transform=slim)
    informer.store["default/c"] = claim("c", 10)
    overlay = ClaimOverlay(informer)
    every: list[str] = []
    written: list[object] = []
    overlay.add_listener(every.append)
    overlay.add_listener(lambda key: written.append(overlay.latest_written(key)), written=True)
    overlay.set_pending("default/c", claim("c", 10, allocated=True))
    assert (len(every), written) == (1, [])
    write = claim("c", 12, allocated=True)
    overlay.assume(write)
    assert (len(every), written) == (2, [write])
    informer.store["default/c"] = claim("c", 11)
    overlay.observe("default/c", informer.store["default/c"])  # older: the write still shows
    assert (len(every), written) == (3, [write])
    assert overlay.latest_written("default/c") is write
    informer.store["default/c"] = claim("c", 12, allocated=True)
    overlay.observe("default/c", informer.store["default/c"])
    assert (len(every), written) == (4, [write, informer.store["default/c"]])
    overlay.set_pending("default/c", claim("c", 12, allocated=True))
    overlay.clear_pending("default/c")
    assert (len(every), len(written)) == (6, 2)


def test_overlay_keeps_no_write_the_informer_has_caught_up_with_already() -> None:
    """A write whose watch event came before its answer is not held: nothing would show it,
    and no later event would drop it."""
    informer = Informer(FakeApi(), RESOURCE_CLAIMS, transform=slim)
    informer.store["default/c"] = claim("c", 12, allocated=True)
    overlay = ClaimOverlay(informer)
    overlay.set_pending("default/c", claim("c", 11, allocated=True))
    touched: list[str] = []
    overlay.add_listener(touched.append)
    overlay.assume(claim("c", 12, allocated=True))
    assert overlay.in_flight == 0
    assert touched == ["default/c"]
    assert overlay.get("default/c") is informer.store["default/c"]
    assert overlay.latest_written("default/c") is informer.store["default/c"]
    assert overlay.written()["default/c"] is informer.store["default/c"]


def test_overlay_forget_and_pending_only_keys() -> None:
    informer = Informer(FakeApi(), RESOURCE_CLAIMS, transform=slim)
    overlay = ClaimOverlay(informer)
    overlay.set_pending("default/<pending-bridge>-u", claim("x", 0, allocated=True))
    assert "default/<pending-bridge>-u" in overlay.view()
    overlay.clear_pending("default/<pending-bridge>-u")
    assert overlay.view() == {}
    overlay.assume(claim("d", 3))
    overlay.forget("default/d")
    assert overlay.in_flight == 0


def test_the_cache_keeps_one_representation_of_each_object() -> None:
    """What scheduling reads of nodes, slices and classes is stored as the core's model (no
    raw JSON beside it); pods and claims stay JSON without managedFields; a relist keeps the
    stored object of an unchanged resourceVersion; a malformed object is stored as None."""
    from controller.cache import ClusterCache
    from driver.api.claims import DeviceClass
    from driver.api.model import ResourceSlice
    from driver.api.nodes import Node
    from tests.unit.builders import device_class, gpu, slice_

    cache = ClusterCache(FakeApi())
    managed = {"managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]}
    raw_node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "a", "resourceVersion": "1", **managed},
        "status": {"allocatable": {"cpu": "8"}},
    }
    cache.nodes.apply("ADDED", raw_node)
    assert isinstance(cache.nodes.get("a"), Node)
    raw_slice = slice_("a-slice", node="a", devices=[gpu(0)])
    raw_slice["metadata"]["resourceVersion"] = "2"
    cache.slices.apply("ADDED", raw_slice)
    assert isinstance(cache.slices.get("a-slice"), ResourceSlice)
    raw_class = device_class()
    raw_class["metadata"]["resourceVersion"] = "3"
    cache.classes.apply("ADDED", raw_class)
    assert isinstance(cache.classes.get(raw_class["metadata"]["name"]), DeviceClass)
    raw_pod = {"metadata": {"name": "p", "namespace": "default", "resourceVersion": "4", **managed}}
    cache.pods.apply("ADDED", raw_pod)
    stored = cache.pods.get("default/p")
    assert stored is not None
    assert "managedFields" not in stored["metadata"]
    assert "managedFields" in raw_pod["metadata"]  # the input is never mutated
    broken = {"metadata": {"name": "b", "resourceVersion": "5"}, "spec": {"taints": "nope"}}
    cache.nodes.apply("ADDED", broken)
    assert "b" in cache.nodes.store
    assert cache.nodes.get("b") is None

    async def relist() -> None:
        api = FakeApi()
        api.lists = [ListResult(items=[raw_node], resource_version="9")]
        informer: Informer[Node | None] = Informer(api, NODES, transform=Node.from_api)
        informer.apply("ADDED", raw_node)
        before = informer.get("a")
        await informer.relist()
        assert informer.get("a") is before  # unchanged resourceVersion: nothing re-parsed

    asyncio.run(relist())


def test_a_held_claims_next_version_keeps_the_stored_parts_that_did_not_change() -> None:
    """The claim cache rebuilds an allocated claim once (strings interned, parts shared); its
    next version (a reservation added) takes the stored spec and allocation as they are, and
    rebuilds only what changed; a claim that is not allocated yet is stored as it came."""
    from controller.cache import ClusterCache
    from kubeapi import codec

    cache = ClusterCache(FakeApi())
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}}
    raw: JSON = {"metadata": {"name": "c", "namespace": "ns", "resourceVersion": "1"}}
    raw["spec"] = spec
    cache.claims.apply("ADDED", raw)
    assert cache.claims.get("ns/c") == raw
    allocated = codec.loads(codec.dumps(raw))
    allocated["metadata"]["resourceVersion"] = "2"
    allocated["status"] = {
        "allocation": {"devices": {"results": [{"request": "gpu", "device": "gpu-0"}]}}
    }
    cache.claims.apply("MODIFIED", allocated)
    first = cache.claims.get("ns/c")
    assert first == allocated
    assert first is not allocated
    reserved = codec.loads(codec.dumps(allocated))
    reserved["metadata"]["resourceVersion"] = "3"
    reserved["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u"}]
    cache.claims.apply("MODIFIED", reserved)
    second = cache.claims.get("ns/c")
    assert second == reserved
    assert first is not None
    assert second is not None
    assert second["spec"] is first["spec"]
    assert second["status"]["allocation"] is first["status"]["allocation"]
    assert second["metadata"]["resourceVersion"] == "3"


def test_held_claims_share_equal_specs_and_keep_unique_strings_out_of_the_intern_table() -> None:
    """Two held claims with equal specs and configurations store one of each; their UIDs,
    resourceVersions and share IDs are kept as decoded (never interned), and the stored
    objects equal what came."""
    import sys

    from controller.cache import ClusterCache
    from kubeapi import codec

    cache = ClusterCache(FakeApi())
    stored = []
    for n in range(2):
        result = {"request": "gpu", "driver": "d", "pool": "p", "device": "gpu-0"}
        raw: JSON = {
            "metadata": {
                "name": f"c{n}",
                "namespace": "ns",
                "resourceVersion": f"{n + 1}000001",
                "uid": f"uid-{n}-not-interned-0000000000000000",
            },
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{**result, "shareID": f"share-{n}-x"}],
                        "config": [{"source": "FromClass", "opaque": {"driver": "d"}}],
                    }
                }
            },
        }
        decoded = codec.loads(codec.dumps(raw))
        cache.claims.apply("ADDED", decoded)
        claim = cache.claims.get(f"ns/c{n}")
        assert claim == raw
        stored.append(claim)
    first, second = stored
    assert second["spec"] is first["spec"]
    config = [c["status"]["allocation"]["devices"]["config"] for c in stored]
    assert config[1] is config[0]  # (the class's configuration, copied into each allocation)
    for claim in stored:
        uid = claim["metadata"]["uid"]
        assert sys.intern(str(uid + " ")[:-1]) is not uid
        share = claim["status"]["allocation"]["devices"]["results"][0]["shareID"]
        assert sys.intern(str(share + " ")[:-1]) is not share


def test_a_shared_part_found_under_the_same_hash_but_unequal_is_not_taken() -> None:
    from controller import cache as cache_module
    from kubeapi import codec

    part = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "values": ["n"]}]}]}
    other = {"nodeSelectorTerms": []}
    key = hash(codec.dumps(part))
    saved = dict(cache_module._shared)
    try:
        cache_module._shared[key] = other  # as if ``other`` had collided with ``part``
        assert cache_module._share(part) is part
        del cache_module._shared[key]
        first = cache_module._share(part)
        assert first is part
        assert cache_module._share(codec.loads(codec.dumps(part))) is part
    finally:
        cache_module._shared.clear()
        cache_module._shared.update(saved)


class _Map(dict[str, Any]):
    """A mapping that is a dict subclass: the envelope check takes it as an object."""


def _meta(**fields: Any) -> JSON:
    return {"metadata": {"name": "n", **fields}}


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        ({"metadata": {"name": "n"}}, None),
        (
            {
                "metadata": {
                    "name": "n",
                    "namespace": "ns",
                    "resourceVersion": "7",
                    "uid": "u",
                    "deletionTimestamp": None,
                    "labels": {"app": "web"},
                    "annotations": {},
                    "ownerReferences": [{"kind": "ReplicaSet"}],
                    "finalizers": ["f"],
                },
                "spec": {},
                "status": None,
            },
            None,
        ),
        (_Map(metadata=_Map(name="n", labels=_Map(a="b")), spec=_Map()), None),
        ([], "not an object (list)"),
        (None, "not an object (NoneType)"),
        ({}, "metadata.name missing or not a string"),
        ({"metadata": []}, "metadata.name missing or not a string"),
        ({"metadata": {"name": ""}}, "metadata.name missing or not a string"),
        ({"metadata": {"name": 1}}, "metadata.name missing or not a string"),
        (_meta(namespace=1), "metadata.namespace is not a string"),
        (_meta(resourceVersion=7), "metadata.resourceVersion is not a string"),
        (_meta(uid=["u"]), "metadata.uid is not a string"),
        (_meta(deletionTimestamp={}), "metadata.deletionTimestamp is not a string"),
        (_meta(labels=["a"]), "metadata.labels is not a map of strings"),
        (_meta(labels={"a": 1}), "metadata.labels is not a map of strings"),
        (_meta(labels={"a": "b", "c": None}), "metadata.labels is not a map of strings"),
        (_meta(annotations={1: "a"}), "metadata.annotations is not a map of strings"),
        (_meta(ownerReferences={}), "metadata.ownerReferences is not a list of objects"),
        (_meta(ownerReferences=[{}, "o"]), "metadata.ownerReferences is not a list of objects"),
        (_meta(finalizers="f"), "metadata.finalizers is not a list of strings"),
        (_meta(finalizers=["f", 2]), "metadata.finalizers is not a list of strings"),
        ({**_meta(), "spec": []}, "spec is not an object"),
        ({**_meta(), "status": "Running"}, "status is not an object"),
        ({**_meta(), "spec": 1, "status": 2}, "spec is not an object"),
    ],
)
def test_envelope_problem_names_the_first_thing_wrong(obj: Any, problem: str | None) -> None:
    from controller.cache import envelope_problem

    assert envelope_problem(obj) == problem

"""The slice publisher: pure sync planning (table-driven) and the reconcile loop against an
in-memory API that keeps resourceVersions, honours preconditions and injects faults."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from driver.api.errors import ConflictError, NotFoundError, ServerError
from driver.api.model import DeviceTaint, ResourceSlice
from driver.discovery.gpus import GpuInfo
from driver.discovery.slices import build_slices
from kubeletplugin.publisher import Publisher, fingerprint, plan_sync

NODE = "node-a"
DRIVER = "gpu.biaxial.dev"


def gpu(minor: int) -> GpuInfo:
    return GpuInfo(
        uuid=f"GPU-{minor:04d}",
        index=minor,
        minor=minor,
        product_name="Tesla T4",
        brand="Nvidia",
        architecture="Turing",
        cuda_compute_capability="7.5",
        driver_version="550.54.15",
        cuda_driver_version="12.4",
        memory_bytes=16 * 1024**3,
        multiprocessors=40,
    )


def desired(count: int, **kwargs: Any) -> list[ResourceSlice]:
    return build_slices(
        [gpu(i) for i in range(count)], node_name=NODE, driver_name=DRIVER, node_uid="u1", **kwargs
    )


def stored(slices: list[ResourceSlice], generation: int = 1) -> list[dict[str, Any]]:
    """What the API would hold after publishing ``slices`` at ``generation``."""
    out = []
    for rv, item in enumerate(slices, start=10):
        body = item.to_api()
        body["spec"]["pool"]["generation"] = generation
        body["metadata"].update(resourceVersion=str(rv), uid=f"uid-{rv}")
        out.append(body)
    return out


# --------------------------------------------------------------------------- plan_sync


def test_nothing_published_creates_every_slice_at_generation_one() -> None:
    plan = plan_sync([], desired(130))  # 130 devices -> two slices
    assert plan.generation == 1
    assert (plan.delete, plan.update) == ((), ())
    assert [b["metadata"]["name"] for b in plan.create] == [
        f"{NODE}-{DRIVER}-00",
        f"{NODE}-{DRIVER}-01",
    ]
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in plan.create} == {2}


def test_an_equal_pool_needs_no_write_and_keeps_its_generation() -> None:
    plan = plan_sync(stored(desired(4), generation=7), desired(4))
    assert plan.empty
    assert plan.generation == 7


def test_one_changed_slice_is_updated_in_place_with_its_resource_version() -> None:
    existing = stored(desired(4), generation=3)
    taints = {"gpu-1": (DeviceTaint(key="k", effect="NoSchedule"),)}
    plan = plan_sync(existing, desired(4, taints=taints))
    assert plan.generation == 3  # one slice changes: the generation is kept
    (update,) = plan.update
    assert update["metadata"]["resourceVersion"] == "10"
    assert update["spec"]["devices"][1]["taints"] == [{"key": "k", "effect": "NoSchedule"}]
    assert (plan.create, plan.delete) == ((), ())


def test_a_count_change_bumps_the_generation_and_rewrites_every_slice() -> None:
    existing = stored(desired(130), generation=4)
    plan = plan_sync(existing, desired(4))
    assert plan.generation == 5
    assert [o["metadata"]["name"] for o in plan.delete] == [f"{NODE}-{DRIVER}-01"]
    (update,) = plan.update
    assert update["spec"]["pool"] == {"name": NODE, "generation": 5, "resourceSliceCount": 1}
    assert plan.create == ()


def test_growing_bumps_and_rewrites_the_kept_slice_too() -> None:
    plan = plan_sync(stored(desired(4), generation=2), desired(130))
    assert plan.generation == 3
    assert len(plan.update) == 1
    assert len(plan.create) == 1
    assert {b["spec"]["pool"]["generation"] for b in plan.update + plan.create} == {3}
    assert {b["spec"]["pool"]["resourceSliceCount"] for b in plan.update + plan.create} == {2}


def test_a_slice_left_at_an_older_generation_is_rewritten() -> None:
    existing = stored(desired(130), generation=6)
    existing[1]["spec"]["pool"]["generation"] = 5  # a crash between two updates
    plan = plan_sync(existing, desired(130))
    assert plan.generation == 6
    assert [b["metadata"]["name"] for b in plan.update] == [f"{NODE}-{DRIVER}-01"]


def test_foreign_owner_or_garbage_counts_as_changed() -> None:
    existing = stored(desired(4))
    existing[0]["metadata"]["ownerReferences"][0]["uid"] = "old-node-uid"
    assert len(plan_sync(existing, desired(4)).update) == 1
    broken = stored(desired(4))
    broken[0]["spec"]["devices"] = [{"attributes": {}}]  # no name: unparsable
    assert len(plan_sync(broken, desired(4)).update) == 1


def test_plan_sync_does_not_mutate_its_inputs() -> None:
    existing = stored(desired(130), generation=2)
    wanted = desired(4)
    before = (copy.deepcopy(existing), list(wanted))
    plan_sync(existing, wanted)
    assert (existing, wanted) == before


# --------------------------------------------------------------------------- the loop


class MemoryApi:
    """Resource slices in memory with resourceVersions, preconditions and a fault queue."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = itertools.count(100)
        self.faults: list[Exception] = []
        self.writes: list[str] = []
        self.changed = asyncio.Event()
        self.drop_taints = False

    def _fault(self) -> None:
        if self.faults:
            raise self.faults.pop(0)

    async def get_node(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": "u1"}}

    async def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        assert field_selector == f"spec.nodeName={NODE},spec.driver={DRIVER}"
        self._fault()
        return [copy.deepcopy(o) for o in self.objects.values()], str(next(self.rv))

    async def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await self.changed.wait()
        self.changed.clear()
        yield "MODIFIED", {}

    def _store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        if self.drop_taints:  # as an API server with DRADeviceTaints off does
            for dev in obj["spec"].get("devices") or []:
                dev.pop("taints", None)
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
        self.objects[obj["metadata"]["name"]] = obj
        return obj

    async def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._fault()
        if body["metadata"]["name"] in self.objects:
            raise ConflictError("exists", status=409)
        self.writes.append("create")
        return self._store(body)

    async def update_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._fault()
        current = self.objects.get(body["metadata"]["name"])
        if current is None:
            raise NotFoundError("gone", status=404)
        if current["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ConflictError("stale", status=409)
        self.writes.append("update")
        return self._store(body)

    async def delete_slice(self, name: str, *, uid: str = "", resource_version: str = "") -> None:
        self._fault()
        self.writes.append("delete")
        self.objects.pop(name, None)

    def pool(self) -> tuple[list[str], set[tuple[int, int]]]:
        devices = [
            d["name"]
            for name in sorted(self.objects)
            for d in self.objects[name]["spec"].get("devices") or []
        ]
        pools = {
            (o["spec"]["pool"]["generation"], o["spec"]["pool"]["resourceSliceCount"])
            for o in self.objects.values()
        }
        return devices, pools


async def converge(api: MemoryApi, publisher: Publisher) -> None:
    publisher.synced.clear()
    await asyncio.wait_for(publisher.synced.wait(), 10)


def test_the_loop_publishes_follows_changes_and_survives_faults() -> None:
    async def scenario() -> None:
        api = MemoryApi()
        publisher = Publisher(api, node_name=NODE, driver_name=DRIVER, resync_s=30)
        publisher.set_inventory([gpu(i) for i in range(4)], {})
        task = asyncio.create_task(publisher.run())
        try:
            await converge(api, publisher)
            assert api.pool() == ([f"gpu-{i}" for i in range(4)], {(1, 1)})
            assert publisher.published_devices == 4

            # A stale write (409) and two server errors on the way to the next state.
            api.faults = [
                ServerError("boom", status=503),
                ConflictError("stale", status=409),
                ServerError("boom", status=500),
            ]
            publisher.set_inventory([gpu(i) for i in range(130)], {})
            await converge(api, publisher)
            devices, pools = api.pool()
            assert len(devices) == 130
            assert pools == {(2, 2)}

            # Someone deletes a slice: the watch wakes the loop, the slice comes back.
            api.objects.pop(f"{NODE}-{DRIVER}-01")
            api.changed.set()
            await converge(api, publisher)
            assert len(api.pool()[0]) == 130
            assert len(api.pool()[1]) == 1

            api.writes.clear()
            publisher.set_inventory([gpu(i) for i in range(130)], {})  # same inventory
            await asyncio.sleep(0.05)
            assert api.writes == []

            assert await publisher.remove_all() == 2
            assert api.objects == {}
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(scenario())


def test_fields_dropped_by_the_server_are_written_once_not_forever(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> MemoryApi:
        api = MemoryApi()
        api.drop_taints = True
        publisher = Publisher(api, node_name=NODE, driver_name=DRIVER, resync_s=30)
        taint = DeviceTaint(key="gpu.biaxial.dev/unhealthy", effect="NoSchedule")
        publisher.set_inventory([gpu(i) for i in range(4)], {"gpu-1": (taint,)})
        task = asyncio.create_task(publisher.run())
        try:
            await converge(api, publisher)
            api.writes.clear()
            api.changed.set()  # an external event: re-list, nothing to write
            await converge(api, publisher)
            assert api.writes == []
            return api
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    api = asyncio.run(scenario())
    assert all("taints" not in d for o in api.objects.values() for d in o["spec"]["devices"])
    assert "dropped or changed fields" in caplog.text


def test_a_slice_changed_by_someone_else_is_rewritten_despite_the_write_record() -> None:
    wanted = desired(4)
    existing = stored(wanted)
    written = {wanted[0].name: ("10", fingerprint(wanted[0]))}
    assert plan_sync(existing, wanted, written).empty
    existing[0]["metadata"]["resourceVersion"] = "11"  # edited since our write
    existing[0]["spec"]["devices"] = existing[0]["spec"]["devices"][:1]
    assert len(plan_sync(existing, wanted, written).update) == 1

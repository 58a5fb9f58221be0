"""The plugin's API calls (kubeletplugin.api.PluginApi) against the in-process API emulator:
claims (404 -> None), nodes, slices with preconditions, slice watches (410 -> GoneError). The
shared client underneath (status mapping, transport failures, kubeconfig errors) is tested in
test_kubeapi.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from driver.api.errors import ConflictError, GoneError
from kubeletplugin.api import Endpoint, PluginApi

NODE = "n1"
SELECTOR = f"spec.nodeName={NODE},spec.driver=gpu.biaxial.dev"


def body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.biaxial.dev",
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "nodeName": NODE,
        },
    }


def run(kubeconfig: Path, scenario: Callable[[PluginApi], Awaitable[None]]) -> None:
    async def main() -> None:
        async with PluginApi(Endpoint.resolve(kubeconfig)) as api:
            await scenario(api)

    asyncio.run(main())


def test_claims_nodes_and_slices(emulator: Any, kubeconfig: Path) -> None:
    emulator.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})

    async def scenario(api: PluginApi) -> None:
        assert await api.get_claim("default", "missing") is None
        assert (await api.get_node(NODE))["metadata"]["name"] == NODE
        patched = await api.patch_node_status(NODE, {"status": {"capacity": {"x.io/y": "1"}}})
        assert patched["status"]["capacity"]["x.io/y"] == "1"

        created = await api.create_slice(body("s0"))
        with pytest.raises(ConflictError):
            await api.create_slice(body("s0"))  # AlreadyExists
        items, rv = await api.list_slices(SELECTOR)
        assert [i["metadata"]["name"] for i in items] == ["s0"]
        assert rv
        changed = {**created, "spec": {**created["spec"], "pool": {**created["spec"]["pool"]}}}
        changed["spec"]["pool"]["generation"] = 2
        updated = await api.update_slice(changed)
        assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
        with pytest.raises(ConflictError):
            await api.update_slice(changed)  # stale resourceVersion
        with pytest.raises(ValueError, match="without a resourceVersion"):
            await api.update_slice(body("s0"))
        with pytest.raises(ConflictError):
            await api.delete_slice("s0", resource_version=created["metadata"]["resourceVersion"])
        await api.delete_slice("s0", uid=updated["metadata"]["uid"])
        await api.delete_slice("s0")  # already gone: fine
        assert (await api.list_slices(SELECTOR))[0] == []

    run(kubeconfig, scenario)


def test_watch_yields_events_and_maps_expiry_to_gone(emulator: Any, kubeconfig: Path) -> None:
    async def scenario(api: PluginApi) -> None:
        _, rv = await api.list_slices(SELECTOR)
        stream = api.watch_slices(SELECTOR, rv, timeout_s=5)
        await api.create_slice(body("s1"))
        etype, obj = await anext(stream)
        assert (etype, obj["metadata"]["name"]) == ("ADDED", "s1")
        await stream.aclose()
        emulator.expire_next_watch(resource="resourceslices")
        with pytest.raises(GoneError):
            async for _ in api.watch_slices(SELECTOR, rv, timeout_s=5):
                pass

    run(kubeconfig, scenario)

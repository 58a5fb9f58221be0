"""The raw-JSON API client (controller.api) against a tiny local HTTP server: status codes map
to the error hierarchy with the server's reason, watch streams split into events (a 410 ERROR
event becomes GoneError), pagination follows ``continue``, and a rotating service-account
token is re-read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controller import api as api_module
from controller.api import NODES, PODS, Endpoint, KubeApi
from driver.errors import ConflictError, GoneError, NotFoundError, ServerError


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.json_response(body, status=code)


async def _with_server(handler: Any, scenario: Any, token_file: str | None = None) -> Any:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    endpoint = Endpoint(
        host=f"http://127.0.0.1:{port}", headers={}, ssl_context=None, token_file=token_file
    )
    try:
        async with KubeApi(endpoint, qps=1000, burst=1000) as client:
            return await scenario(client)
    finally:
        await runner.cleanup()


def test_status_codes_map_to_errors_with_reason() -> None:
    async def handler(request: web.Request) -> web.Response:
        name = request.path.rsplit("/", 1)[1]
        if name == "missing":
            return _status(404, "NotFound", 'pods "missing" not found')
        if name == "stale":
            return _status(409, "Conflict", "the object has been modified")
        if name == "broken":
            return web.Response(status=503, text="upstream gone")
        return web.json_response({"metadata": {"name": name}})

    async def scenario(client: KubeApi) -> None:
        assert (await client.get(PODS, "ok", "default"))["metadata"]["name"] == "ok"
        with pytest.raises(NotFoundError) as missing:
            await client.get(PODS, "missing", "default")
        assert missing.value.reason == "NotFound"
        assert 'pods "missing" not found' in str(missing.value)
        with pytest.raises(ConflictError):
            await client.get(PODS, "stale", "default")
        with pytest.raises(ServerError) as broken:
            await client.get(PODS, "broken", "default")
        assert broken.value.status == 503

    asyncio.run(_with_server(handler, scenario))


def test_transport_failure_is_a_retryable_server_error() -> None:
    async def scenario() -> None:
        endpoint = Endpoint(host="http://127.0.0.1:9", headers={}, ssl_context=None)
        async with KubeApi(endpoint, qps=10, burst=10, request_timeout_s=2) as client:
            with pytest.raises(ServerError) as info:
                await client.get(NODES, "n")
            assert info.value.status == 0

    asyncio.run(scenario())


def test_list_follows_continue_and_watch_splits_events() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            added = {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "7"}}}
            await resp.write(json.dumps(added).encode() + b"\n")
            gone = {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "code": 410,
                    "reason": "Expired",
                    "message": "too old",
                },
            }
            half = json.dumps(gone).encode() + b"\n"
            await resp.write(half[:10])  # an event split across chunks
            await resp.write(half[10:])
            return resp
        if request.query.get("continue") == "page2":
            return web.json_response(
                {"items": [{"metadata": {"name": "b"}}], "metadata": {"resourceVersion": "6"}}
            )
        return web.json_response(
            {
                "items": [{"metadata": {"name": "a"}}],
                "metadata": {"resourceVersion": "5", "continue": "page2"},
            }
        )

    async def scenario(client: KubeApi) -> None:
        listed = await client.list(NODES)
        assert [o["metadata"]["name"] for o in listed.items] == ["a", "b"]
        assert listed.resource_version == "6"
        events: list[tuple[str, str]] = []

        async def consume() -> None:
            async for event in client.watch(NODES, resource_version="6"):
                events.append((event.type, event.object["metadata"]["name"]))  # noqa: PERF401 - kept up to the error

        with pytest.raises(GoneError):
            await consume()
        assert events == [("ADDED", "a")]

    asyncio.run(_with_server(handler, scenario))


def test_rotating_token_is_reread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    seen: list[str] = []
    monkeypatch.setattr(api_module, "TOKEN_REFRESH_S", 0.0)

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({})

    async def scenario(client: KubeApi) -> None:
        await client.get(NODES, "n")
        token.write_text("second\n")
        await client.get(NODES, "n")

    asyncio.run(_with_server(handler, scenario, token_file=str(token)))
    assert seen == ["Bearer first", "Bearer second"]

"""The shared raw-JSON API client (kubeapi) against a tiny local HTTP server: status codes map
to the error hierarchy with the server's reason, transport failures are retryable, watch
streams split into events (a 410 ERROR event becomes GoneError), pagination follows
``continue``, a rotating service-account token is re-read, the token bucket holds requests to
``qps``, and a kubeconfig that cannot be loaded is a one-line ConfigError."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.parse
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from driver.api.errors import ConfigError, ConflictError, GoneError, NotFoundError, ServerError
from kubeapi import EVENTS, NODES, PODS, Client, Endpoint, Resource, TokenBucket
from kubeapi import client as client_module
from tests.unit.local_api import with_server


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.json_response(body, status=code)


def test_resource_paths_quote_names() -> None:
    assert PODS.path("default", "p/0", "binding") == "/api/v1/namespaces/default/pods/p%2F0/binding"
    assert NODES.path("ignored", "n1") == "/api/v1/nodes/n1"
    assert Resource("x.io", "v1", "things", "Thing", namespaced=False).api_version == "x.io/v1"


@pytest.mark.parametrize(
    "text", ["", "p-0.a_b~c", "p/0", "p 0", "p?x=1#f", "%2F", "ünï", "a\nb", "..", "p\x00", "A-Z"]
)
def test_names_are_quoted_as_urllib_quotes_them(text: str) -> None:
    quoted = urllib.parse.quote(text, safe="")
    assert PODS.path(text, text) == f"/api/v1/namespaces/{quoted}/pods/{quoted}"


@given(st.text())
def test_any_name_is_quoted_as_urllib_quotes_it(text: str) -> None:
    quoted = urllib.parse.quote(text, safe="")
    assert PODS.path(text, text, "status") == f"/api/v1/namespaces/{quoted}/pods/{quoted}/status"


def test_status_codes_map_to_errors_with_reason() -> None:
    async def handler(request: web.Request) -> web.Response:
        name = request.path.rsplit("/", 1)[1]
        if name == "missing":
            return _status(404, "NotFound", 'pods "missing" not found')
        if name == "stale":
            return _status(409, "Conflict", "the object has been modified")
        if name == "broken":
            return web.Response(status=503, text="upstream gone")
        if name == "garbled":
            return web.Response(status=200, text="[1, 2]")
        return web.json_response({"metadata": {"name": name}})

    async def scenario(client: Client) -> None:
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
        with pytest.raises(ServerError, match="not a JSON object"):
            await client.get(PODS, "garbled", "default")
        assert client.requests == 5

    asyncio.run(with_server(handler, scenario, Client))


def test_transport_failure_is_a_retryable_server_error() -> None:
    async def scenario() -> None:
        endpoint = Endpoint(host="http://127.0.0.1:9", headers={}, ssl_context=None)
        async with Client(endpoint, request_timeout_s=2) as client:
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

    async def scenario(client: Client) -> None:
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

    asyncio.run(with_server(handler, scenario, Client))


def test_a_watch_line_decodes_alike_on_the_typed_path_and_the_general_one() -> None:
    """A line the typed decoder takes and one only the general path reads (no ``type``, an
    integer past 64 bits, nesting past the recursion limit) give the same kind of event;
    what is not an event is a malformed-event ServerError."""
    event = client_module._watch_event("/p", b'{"type":"ADDED","object":{"a":[1,"x"]}}')
    assert event == client_module.WatchEvent("ADDED", {"a": [1, "x"]})
    assert client_module._watch_event("/p", b'{"object":{}}') == client_module.WatchEvent("", {})
    big = client_module._watch_event("/p", b'{"type":"MODIFIED","object":{"n":%d}}' % (1 << 70))
    assert big.object == {"n": 1 << 70}
    deep = b'{"type":"ADDED","object":{"x":' + b"[" * 5000 + b"]" * 5000 + b"}}"
    assert client_module._watch_event("/p", deep).type == "ADDED"
    for line in (b"[1]", b'{"type":"ADDED","object":[1]}', b"{not json"):
        with pytest.raises(ServerError, match="malformed event"):
            client_module._watch_event("/p", line)
    with pytest.raises(GoneError):
        client_module._watch_event("/p", b'{"type":"ERROR","object":{"code":410}}')


def test_pages_asks_for_the_next_page_before_the_caller_has_read_this_one() -> None:
    # The server prepares page k+1 while the caller parses page k (the informer's relist
    # yields to the loop while it reads a page); a caller that stops early leaves no request
    # behind it waiting to be read.
    asked: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        page = int(request.query.get("continue") or 0)
        asked.append(f"page {page}")
        more = {"continue": str(page + 1)} if page < 2 else {}
        return web.json_response(
            {
                "items": [{"metadata": {"name": f"n{page}"}}],
                "metadata": {"resourceVersion": "7", **more},
            }
        )

    async def scenario(client: Client) -> None:
        read: list[str] = []
        async for page in client.pages(NODES, page_size=1):
            for _ in range(20):  # reading the page, yielding to the loop as the relist does
                await asyncio.sleep(0.001)
            asked.append(f"read {page.items[0]['metadata']['name']}")
            read.append(page.resource_version)
        assert read == ["7", "7", "7"]
        assert asked == ["page 0", "page 1", "read n0", "page 2", "read n1", "read n2"]
        asked.clear()
        async for _page in client.pages(NODES, page_size=1):
            break  # stopped after the first page: the second, asked for, is dropped
        await asyncio.sleep(0.05)
        assert asked[0] == "page 0"

    asyncio.run(with_server(handler, scenario, Client))


def test_delete_sends_preconditions_only_when_given() -> None:
    bodies: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.json_response({})

    async def scenario(client: Client) -> None:
        await client.delete(NODES, "n")
        await client.delete(NODES, "n", uid="u1", resource_version="7")

    asyncio.run(with_server(handler, scenario, Client))
    assert bodies[0] == b""
    assert json.loads(bodies[1])["preconditions"] == {"uid": "u1", "resourceVersion": "7"}


def test_rotating_token_is_reread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    seen: list[str] = []
    monkeypatch.setattr(client_module, "TOKEN_REFRESH_S", 0.0)

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({})

    async def scenario(client: Client) -> None:
        await client.get(NODES, "n")
        token.write_text("second\n")
        await client.get(NODES, "n")

    asyncio.run(with_server(handler, scenario, Client, token_file=token))
    assert seen == ["Bearer first", "Bearer second"]


def test_token_bucket_allows_a_burst_then_holds_to_qps() -> None:
    async def scenario() -> tuple[float, float]:
        bucket = TokenBucket(qps=20, burst=2)
        start = time.monotonic()
        for _ in range(2):
            await bucket.acquire()
        burst = time.monotonic() - start
        for _ in range(2):
            await bucket.acquire()
        return burst, time.monotonic() - start

    burst, total = asyncio.run(scenario())
    assert burst < 0.05
    assert total >= 0.08  # two more tokens at 20 per second


def test_a_token_is_taken_at_once_only_where_acquire_would_not_wait() -> None:
    """take_now (the client's path without a coroutine) takes what acquire's fast path takes,
    and refuses, leaving the bucket as it was, where acquire would wait or queue."""

    async def scenario() -> list[tuple[str, bool, float]]:
        bucket = TokenBucket(qps=0.001, burst=2)
        seen = [("background", bucket.take_now(background=True), bucket._tokens)]
        seen.append(("foreground", bucket.take_now(), bucket._tokens))
        waiter = asyncio.create_task(bucket.acquire())  # takes the last token, no wait
        await waiter
        seen.append(("empty", bucket.take_now(), bucket._tokens))
        blocked = asyncio.create_task(bucket.acquire())  # waits for a token
        await asyncio.sleep(0)
        bucket._tokens = 5.0  # a token there, and a caller waiting before this one
        seen.append(("behind a waiter", bucket.take_now(), bucket._tokens))
        blocked.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await blocked
        return seen

    seen = asyncio.run(scenario())
    assert [(case, taken) for case, taken, _ in seen] == [
        ("background", False),
        ("foreground", True),
        ("empty", False),
        ("behind a waiter", False),
    ]
    assert seen[0][2] == pytest.approx(2.0, abs=0.01)
    assert seen[1][2] == pytest.approx(1.0, abs=0.01)
    assert seen[2][2] == pytest.approx(0.0, abs=0.01)
    assert seen[3][2] == pytest.approx(5.0, abs=0.01)


def test_background_callers_yield_every_token_to_the_others() -> None:
    """A thousand queued reports must not delay a placement's writes: a foreground caller
    waits for at most the one token a background caller was already waiting for."""

    async def scenario() -> tuple[list[str], float]:
        bucket = TokenBucket(qps=100, burst=1)
        order: list[str] = []

        async def take(name: str, background: bool) -> None:
            await bucket.acquire(background=background)
            order.append(name)

        reports = [asyncio.create_task(take(f"r{i}", True)) for i in range(20)]
        await asyncio.sleep(0.025)  # the burst token and about two more went to reports
        start = time.monotonic()
        await asyncio.gather(take("w0", False), take("w1", False), take("w2", False))
        waited = time.monotonic() - start
        await asyncio.gather(*reports)
        return order, waited

    order, waited = asyncio.run(scenario())
    writes = [order.index(w) for w in ("w0", "w1", "w2")]
    assert writes == sorted(writes)
    assert writes[-1] - writes[0] == 2, f"reports got tokens between the writes: {order}"
    assert writes[0] <= 5, order
    assert waited < 0.1  # three tokens at 100 per second, plus at most one report's


def test_requests_inside_background_are_marked_for_the_bucket() -> None:
    from kubeapi.client import _BACKGROUND, background

    assert _BACKGROUND.get() is False
    with background():
        assert _BACKGROUND.get() is True
    assert _BACKGROUND.get() is False

    def nested_then_fail() -> None:
        with background():
            with background():
                assert _BACKGROUND.get() is True
            assert _BACKGROUND.get() is True
            raise KeyError

    with pytest.raises(KeyError):
        nested_then_fail()
    assert _BACKGROUND.get() is False


def test_events_take_their_tokens_from_a_bucket_of_their_own() -> None:
    """kube-scheduler records Events through a clientset of its own, and client-go's token
    bucket is per clientset (cmd/kube-scheduler/app/options: createClients): an Event never
    waits for a token the binding writes need, nor they for its."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        return web.json_response({"metadata": {"name": "n"}})

    def slow_client(endpoint: Endpoint, **_: object) -> Client:
        return Client(endpoint, qps=1, burst=1)

    async def scenario(client: Client) -> None:
        await client.patch(PODS, "p", {"metadata": {"labels": {"a": "b"}}}, namespace="ns")
        waiting = asyncio.ensure_future(client.get(PODS, "p", "ns"))  # a token in ~1 s
        await asyncio.sleep(0)
        await client.create(EVENTS, {"metadata": {"name": "e"}}, "ns")  # its own burst token
        await waiting

    asyncio.run(with_server(handler, scenario, slow_client))  # type: ignore[arg-type]
    assert seen == [
        "PATCH /api/v1/namespaces/ns/pods/p",
        "POST /api/v1/namespaces/ns/events",
        "GET /api/v1/namespaces/ns/pods/p",
    ]


@pytest.mark.parametrize(
    ("path", "event"),
    [
        ("/api/v1/namespaces/ns/events", True),
        ("/api/v1/namespaces/ns/events/e.1", True),
        ("/apis/events.k8s.io/v1/namespaces/ns/events", True),
        ("/api/v1/events", True),
        ("/api/v1/namespaces/ns/pods/events", False),  # a pod named "events"
        ("/api/v1/namespaces/events/pods/p", False),  # a namespace named "events"
        ("/api/v1/namespaces/ns/events/e/status", False),
        ("/apis/example.com/v1/namespaces/ns/events", False),
        ("/api/v1/namespaces/ns/pods/p/binding", False),
        ("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status", False),
        ("/api/v1/namespaces/ns/eventsx", False),
        ("", False),
    ],
)
def test_what_counts_as_an_event_request(path: str, event: bool) -> None:
    from kubeapi.client import _EVENT_PATH, _is_event_path

    assert bool(_EVENT_PATH.fullmatch(path)) is event
    assert _is_event_path(path) is event


def test_an_unreadable_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("not: [a kubeconfig")
    with pytest.raises(ConfigError, match="cannot load Kubernetes config from") as info:
        Endpoint.resolve(bad)
    assert "\n" not in str(info.value)


def test_write_fence_is_checked_after_the_rate_limiter_and_sends_nothing_when_closed() -> None:
    """A write that waited for a token is checked against the fence when the token comes, not
    before: the fence closed meanwhile, so it is refused and never reaches the server."""
    seen: list[str] = []
    fence_open = [True]
    checked: list[tuple[str, str]] = []

    def fence(method: str, path: str) -> None:
        checked.append((method, path))
        if not fence_open[0]:
            raise ServerError(f"{method} {path}: fenced", status=0)

    async def handler(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        return web.json_response({"metadata": {"name": "n"}})

    def fenced_client(endpoint: Endpoint, **_: object) -> Client:
        return Client(endpoint, qps=5, burst=1, write_fence=fence)

    async def scenario(client: Client) -> None:
        await client.patch(NODES, "n", {"metadata": {"labels": {"a": "b"}}})  # the burst token
        waiting = asyncio.ensure_future(client.delete(NODES, "n"))  # waits ~0.2 s for a token
        await asyncio.sleep(0.05)
        assert not waiting.done()
        fence_open[0] = False
        with pytest.raises(ServerError, match="fenced"):
            await waiting
        assert (await client.get(NODES, "n"))["metadata"]["name"] == "n"  # reads never fenced

    asyncio.run(with_server(handler, scenario, fenced_client))  # type: ignore[arg-type]
    assert seen == ["PATCH /api/v1/nodes/n", "GET /api/v1/nodes/n"]
    assert checked == [("PATCH", "/api/v1/nodes/n"), ("DELETE", "/api/v1/nodes/n")]

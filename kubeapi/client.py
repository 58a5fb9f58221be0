"""The request core: raw JSON over HTTP, one client per process and loop.

Decision: ``kubernetes.aio`` returns models (or raw responses to decode by hand) and its watch
helper deserializes events into models; parsing models costs ~10x on hot paths. So requests
and watches go over HTTP directly and return plain ``dict`` JSON: requests through
:class:`kubeapi.transport.Pool` (kept-alive HTTP/1.1 connections, a fraction of ``aiohttp``'s
CPU per request), watches through ``aiohttp`` (a few long streams).

Contracts:

* every non-2xx answer and every transport failure raises an :class:`~driver.api.errors.ApiError`
  subclass built by :func:`driver.api.errors.api_error_for_status` (the only status mapping) with
  the API server's ``reason`` and ``message``, chained with ``raise ... from``; transport
  failures, timeouts and malformed answers are ``ServerError`` with status 0 (retryable);
* writes that must be conditional carry ``metadata.resourceVersion`` (PUT, or a merge patch
  that includes it) or delete ``preconditions``: the API server answers 409 when the object
  changed meanwhile;
* with ``qps`` set, every request passes a client-side token bucket (``qps`` / ``burst``, as
  client-go's); requests sent inside :func:`background` yield to all others there; Events
  (core and ``events.k8s.io``) pass a second bucket of the same size, as kube-scheduler's and
  the kubelet's event clients are clientsets of their own, each with its own bucket;
* with ``write_fence`` set, it is called with the method and path of every mutating request
  (POST, PUT, PATCH, DELETE) after the token bucket, immediately before the request is sent;
  what it raises is raised to the caller and nothing is sent (the controller's leader fence,
  :mod:`controller.leader`);
* :meth:`Client.pages` hands a list over page by page (following ``continue``), asking for the
  next page before it hands over the current one, so that the server prepares it while the
  caller reads; :meth:`Client.list` gathers them;
* :meth:`Client.watch` yields :class:`WatchEvent` until the server ends the stream; an
  ``ERROR`` event becomes the matching ``ApiError`` (a 410 becomes ``GoneError``: relist);
* answers and watch events decode at any nesting depth the API server accepts
  (:mod:`kubeapi.codec`): no object can make a read fail;
* a rotating service-account token file is re-read every :data:`TOKEN_REFRESH_S` seconds.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import re
import sys
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal, Self

import aiohttp
import msgspec

from driver.api.errors import ApiError, ServerError, api_error_for_status
from kubeapi import codec
from kubeapi.deadlines import Deadlines
from kubeapi.endpoint import Endpoint
from kubeapi.resources import JSON, Resource, meta
from kubeapi.transport import Pool, TransportError

log = logging.getLogger(f"biaxial.{__name__}")

JSON_TYPE: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
PatchType = Literal["merge", "json", "strategic"]
TOKEN_REFRESH_S: Final = 60.0
#: Whether this Python leaves a TLS connection's socket open when the connection is closed
#: before its shutdown handshake completes (cpython#118960, fixed in 3.12.8 and 3.13.1; a
#: watch cancelled mid-stream is such a close). aiohttp then aborts the connections it closed
#: when the session closes (``enable_cleanup_closed``), which it refuses on fixed versions.
_SSL_CLOSE_LEAKS: Final = sys.version_info < (3, 12, 8) or sys.version_info[:3] == (3, 13, 0)
_READ_METHODS: Final = frozenset({"GET", "HEAD"})
#: A line feed as ``bytes.__contains__`` finds it at once (given ``b"\n"``, it first tries to
#: read it as an integer, and clears that error: 0.15 us a search).
_NEWLINE: Final = ord("\n")
#: what an Event request's path looks like, core or events.k8s.io (a namespace is quoted, so
#: it holds no "/")
_EVENT_PATH: Final = re.compile(
    r"/(?:api/v1|apis/events\.k8s\.io/v1)(?:/namespaces/[^/]+)?/events(?:/[^/]+)?"
)
_PATCH_TYPES: Final[Mapping[str, str]] = {
    "merge": MERGE_PATCH,
    "json": JSON_PATCH,
    "strategic": STRATEGIC_PATCH,
}


def _is_event_path(path: str) -> bool:
    """Whether ``path`` is an Event request's (:data:`_EVENT_PATH`). Every such path holds
    ``/events``: the substring test first spares the pattern on the other paths, four of
    every five requests (0.2-0.4 us each)."""
    return "/events" in path and _EVENT_PATH.fullmatch(path) is not None


def _retrieved(task: asyncio.Future[JSON]) -> None:
    """Consume the outcome of a request nobody waits for any more (no "never retrieved")."""
    if not task.cancelled():
        task.exception()


class WatchEvent(msgspec.Struct, frozen=True):
    """One watch event: ``ADDED`` | ``MODIFIED`` | ``DELETED`` | ``BOOKMARK`` and the object.

    A watch line decodes straight into it (:data:`_WATCH_LINE`): no dict for the line's
    envelope, read and copied out again (a claim's event 5.7-5.9 -> 4.4-4.5 us CPU, best of 5)."""

    type: str
    object: JSON


#: A watch line as the API server writes it; what it refuses (a line without ``type``, an
#: object that is not one, text only :func:`kubeapi.codec.loads` decodes) takes the general
#: path (:func:`_watch_event`).
_WATCH_LINE: Final = msgspec.json.Decoder(WatchEvent)


@dataclass(frozen=True, slots=True)
class ListResult:
    """A list, or one page of it (every page carries the list's resourceVersion)."""

    items: list[JSON]
    resource_version: str


class TokenBucket:
    """client-go's flowcontrol token bucket: ``qps`` tokens per second, at most ``burst``.

    Background callers (``acquire(background=True)``) take a token only while no other caller
    waits for one, so reports and events never delay the writes that place pods by more than
    the one token a background caller may be waiting for already."""

    def __init__(self, qps: float, burst: int) -> None:
        self._qps = qps
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()
        self._foreground = 0  # callers that are not background, waiting or taking a token
        self._clear = asyncio.Event()  # set while _foreground is 0
        self._clear.set()

    def take_now(self, *, background: bool = False) -> bool:
        """Take a token at once if :meth:`acquire` would, without waiting: a caller that is
        not background, no caller waiting for a token or taking one, and a token there. False
        leaves the bucket as it was (the caller then awaits :meth:`acquire`). Not a coroutine:
        most requests find a token, and awaiting one costs a coroutine per request."""
        if (
            not background
            and not self._foreground
            and not self._lock.locked()
            and self._refill() >= 1.0
        ):
            self._tokens -= 1.0
            return True
        return False

    async def acquire(self, *, background: bool = False) -> None:
        if self.take_now(background=background):
            return
        if not background:
            self._foreground += 1
            self._clear.clear()
            try:
                async with self._lock:
                    await self._take()
            finally:
                self._foreground -= 1
                if not self._foreground:
                    self._clear.set()
            return
        while True:
            await self._clear.wait()
            async with self._lock:
                if self._foreground:
                    continue  # someone else arrived meanwhile: after them
                await self._take()
                return

    def _refill(self) -> float:
        """The tokens now, the time since the last refill added."""
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
        self._last = now
        return self._tokens

    async def _take(self) -> None:
        if self._refill() < 1.0:
            wait = (1.0 - self._tokens) / self._qps
            await asyncio.sleep(wait)
            self._tokens += wait * self._qps
            self._last = time.monotonic()
        self._tokens -= 1.0


_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "biaxial_background_requests", default=False
)


class background:  # noqa: N801 - used as a function: ``with background():``
    """Requests sent inside the block (in this task, and tasks it starts) are background work:
    they yield to every other request at the client's token bucket (see :class:`TokenBucket`).
    For writes nobody waits on, such as reports and events. (A class, not a generator-based
    context manager: the Event lane enters one per Event, and the generator's machinery cost
    three times the context variable's set and reset.)"""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _BACKGROUND.set(True)

    def __exit__(self, *exc: object) -> None:
        _BACKGROUND.reset(self._token)


class Client:
    """The API client (see the module docstring). Use as ``async with``.

    Components subclass it for their own operations and defaults (``default_user_agent``,
    ``max_connections``); without ``qps`` there is no client-side rate limit.
    """

    default_user_agent: ClassVar[str] = "biaxial"
    max_connections: ClassVar[int] = 64

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        qps: float | None = None,
        burst: int = 1,
        request_timeout_s: float = 30.0,
        user_agent: str | None = None,
        on_request: Callable[[], object] | None = None,
        write_fence: Callable[[str, str], None] | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._write_fence = write_fence
        self._bucket = TokenBucket(qps, burst) if qps is not None else None
        # Events have a budget of their own, of the same size: kube-scheduler and the kubelet
        # record them through a clientset of their own, and client-go's token bucket is per
        # clientset (one Event per bound pod would otherwise take a quarter of the budget
        # that binds pods).
        self._event_bucket = TokenBucket(qps, burst) if qps is not None else None
        self._deadlines = Deadlines(request_timeout_s)  # the request timeout, on one timer
        self._headers = {
            **endpoint.headers,
            "User-Agent": user_agent or self.default_user_agent,
            "Accept": JSON_TYPE,
        }
        self._session: aiohttp.ClientSession | None = None
        self._pool: Pool | None = None
        self._token: tuple[float, str] | None = None
        self._on_request = on_request
        self.requests = 0  # number of requests sent

    async def __aenter__(self) -> Self:
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            ssl=self._endpoint.ssl_context or False,
            enable_cleanup_closed=_SSL_CLOSE_LEAKS,
        )
        self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        self._pool = Pool(
            self._endpoint.host,
            self._headers,
            ssl_context=self._endpoint.ssl_context,
            limit=self.max_connections,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None
            # The connections the session aborts finish closing in a callback of the loop's
            # next turn; give it that turn, so a caller ending its loop right after
            # (asyncio.run) leaves no socket open.
            await asyncio.sleep(0)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError(f"{type(self).__name__} used outside 'async with'")
        return self._session

    # ----------------------------------------------------------------- plumbing

    async def _start(self, method: str = "GET", path: str = "") -> None:
        """Every request and watch: wait for a token, pass the write fence, count it."""
        bucket = self._waits_at(path)
        if bucket is not None:
            await bucket.acquire(background=_BACKGROUND.get())
        self._admit(method, path)

    def _waits_at(self, path: str) -> TokenBucket | None:
        """The token bucket a request for ``path`` must wait at; None when it took a token at
        once (most do) or there is no bucket. Not a coroutine: :meth:`request` awaits only
        when it must (a coroutine per request cost ~0.3 us)."""
        bucket = self._event_bucket if _is_event_path(path) else self._bucket
        if bucket is None or bucket.take_now(background=_BACKGROUND.get()):
            return None
        return bucket

    def _admit(self, method: str, path: str) -> None:
        """After the token: pass the write fence, count the request."""
        if self._write_fence is not None and method not in _READ_METHODS:
            self._write_fence(method, path)
        self.requests += 1
        if self._on_request is not None:
            self._on_request()

    def _auth(self) -> dict[str, str]:
        """A fresh ``Authorization`` for a rotating token file (re-read each minute)."""
        path = self._endpoint.token_file
        if path is None:
            return {}
        now = time.monotonic()
        if self._token is None or now - self._token[0] > TOKEN_REFRESH_S:
            try:
                self._token = (now, path.read_text(encoding="utf-8").strip())
            except OSError as exc:
                if self._token is None:
                    raise ServerError(f"service account token {path}: {exc}", status=0) from exc
                log.warning("could not re-read the service account token %s: %s", path, exc)
                self._token = (now, self._token[1])
        return {"Authorization": f"Bearer {self._token[1]}"}

    def _url(self, path: str, params: Mapping[str, str] | None = None) -> str:
        return self._endpoint.host + _target(path, params)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = JSON_TYPE,
        decode: Callable[[bytes], Any] = codec.loads,
    ) -> JSON:
        """One request; the decoded JSON object (``{}`` for an empty answer), or the mapped
        :class:`~driver.api.errors.ApiError`. ``decode`` reads the answer's text (it raises
        ``ValueError`` for text that is not JSON, as :func:`kubeapi.codec.loads` does)."""
        if self._pool is None:
            raise RuntimeError(f"{type(self).__name__} used outside 'async with'")
        bucket = self._waits_at(path)  # as _start, without its coroutine
        if bucket is not None:
            await bucket.acquire(background=_BACKGROUND.get())
        self._admit(method, path)
        data = None if body is None else codec.dumps(body)
        headers = self._auth()
        if data is not None:
            headers["Content-Type"] = content_type
        try:
            with self._deadlines.within():
                status, raw = await self._pool.request(method, _target(path, params), headers, data)
        except (TransportError, TimeoutError) as exc:
            raise ServerError(f"{method} {path}: {exc or type(exc).__name__}", status=0) from exc
        if status >= 300:
            raise _error_from_body(method, path, status, raw)
        try:
            decoded = decode(raw) if raw else {}
        except ValueError as exc:
            raise ServerError(f"{method} {path}: answer is not JSON", status=0) from exc
        if not isinstance(decoded, dict):
            raise ServerError(f"{method} {path}: answer is not a JSON object", status=0)
        return decoded

    # ----------------------------------------------------------------- reads

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON:
        return await self.request("GET", res.path(namespace, name))

    async def pages(
        self,
        res: Resource,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
        typed: type | None = None,
    ) -> AsyncGenerator[ListResult, None]:
        """Every matching object, one page at a time (following ``continue``). The next page
        is requested before this one is handed over: a caller that yields to the loop while it
        reads a page (a few ``await asyncio.sleep(0)``) lets the request go out, and the server
        prepares that page meanwhile. With ``typed`` (a ``msgspec`` type), each item that
        decodes as it comes as a :class:`kubeapi.codec.Typed` (:func:`kubeapi.codec.loads_list`);
        the others as JSON data."""
        params = _selectors({"limit": str(page_size)}, field_selector, label_selector)
        path = res.path()
        decode: Callable[[bytes], Any] = (
            codec.loads if typed is None else functools.partial(codec.loads_list, item_type=typed)
        )
        fetching: asyncio.Future[JSON] | None = asyncio.ensure_future(
            self.request("GET", path, params=dict(params), decode=decode)
        )
        try:
            while fetching is not None:
                page = await fetching
                fetching = None
                lmeta = page.get("metadata") or {}
                cont = lmeta.get("continue")
                if cont:
                    params["continue"] = str(cont)
                    fetching = asyncio.ensure_future(
                        self.request("GET", path, params=dict(params), decode=decode)
                    )
                items = page.get("items") or []
                yield ListResult(
                    items=items, resource_version=str(lmeta.get("resourceVersion", ""))
                )
        finally:
            if fetching is not None:  # the caller stopped early: drop the page asked for
                fetching.cancel()
                fetching.add_done_callback(_retrieved)

    async def list(
        self,
        res: Resource,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> ListResult:
        """Every matching object (following ``continue``) and the list's resourceVersion."""
        items: list[JSON] = []
        resource_version = ""
        async for page in self.pages(
            res, field_selector=field_selector, label_selector=label_selector, page_size=page_size
        ):
            items.extend(page.items)
            resource_version = page.resource_version
        return ListResult(items=items, resource_version=resource_version)

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Events from ``resource_version`` until the server ends the stream."""
        params = _selectors(
            {
                "watch": "1",
                "allowWatchBookmarks": "true",
                "resourceVersion": resource_version,
                "timeoutSeconds": str(timeout_s),
            },
            field_selector,
            label_selector,
        )
        path = res.path()
        await self._start()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30)
        try:
            async with self.session.get(
                self._url(path, params), timeout=timeout, headers=self._auth()
            ) as resp:
                if resp.status >= 300:
                    raise _error_from_body("WATCH", path, resp.status, await resp.read())
                buffer = b""
                async for chunk in resp.content.iter_any():
                    if _NEWLINE not in chunk:
                        buffer += chunk
                        continue
                    # Every complete line of the chunk at once (one split, not one per line:
                    # a chunk may carry dozens of events).
                    lines = (buffer + chunk).split(b"\n")
                    buffer = lines.pop()
                    for line in lines:
                        if line.strip():
                            yield _watch_event(path, line)
                if buffer.strip():
                    yield _watch_event(path, buffer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerError(f"WATCH {path}: {exc or type(exc).__name__}", status=0) from exc

    # ----------------------------------------------------------------- writes

    async def create(self, res: Resource, body: JSON, namespace: str | None = None) -> JSON:
        ns = namespace if namespace is not None else meta(body).get("namespace")
        return await self.request("POST", res.path(ns), body=body)

    async def replace(self, res: Resource, body: JSON, *, subresource: str | None = None) -> JSON:
        """PUT the object named by ``body.metadata``; its resourceVersion is the precondition."""
        m = meta(body)
        path = res.path(m.get("namespace"), str(m["name"]), subresource)
        return await self.request("PUT", path, body=body)

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: PatchType = "merge",
    ) -> JSON:
        return await self.request(
            "PATCH",
            res.path(namespace, name, subresource),
            body=body,
            content_type=_PATCH_TYPES[patch_type],
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        """DELETE, with ``uid`` / ``resourceVersion`` preconditions when given."""
        body: JSON | None = None
        if uid is not None or resource_version is not None:
            pre: JSON = {}
            if uid is not None:
                pre["uid"] = uid
            if resource_version is not None:
                pre["resourceVersion"] = resource_version
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": pre}
        await self.request("DELETE", res.path(namespace, name), body=body)


def _target(path: str, params: Mapping[str, str] | None) -> str:
    """The request target: the path, and the query when there are parameters."""
    return f"{path}?{urllib.parse.urlencode(params)}" if params else path


def _selectors(
    params: dict[str, str], field_selector: str | None, label_selector: str | None
) -> dict[str, str]:
    if field_selector:
        params["fieldSelector"] = field_selector
    if label_selector:
        params["labelSelector"] = label_selector
    return params


def _error_from_body(method: str, path: str, status: int, raw: bytes) -> ApiError:
    message = raw.decode(errors="replace")[:500]
    reason = ""
    try:
        body = codec.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        message = str(body.get("message") or message)
        reason = str(body.get("reason") or "")
    return api_error_for_status(status, f"{method} {path}: {status} {reason}: {message}", reason)


def _watch_event(path: str, line: bytes) -> WatchEvent:
    try:
        typed = _WATCH_LINE.decode(line)
    except (msgspec.DecodeError, RecursionError, UnicodeError):
        pass  # the general path below decides (and says what is wrong)
    else:
        if typed.type != "ERROR":
            return typed
    try:
        event = codec.loads(line)
    except ValueError as exc:
        raise ServerError(f"WATCH {path}: malformed event", status=0) from exc
    obj = event.get("object") if isinstance(event, dict) else None
    if not isinstance(obj, dict):
        raise ServerError(f"WATCH {path}: malformed event (no object)", status=0)
    etype = str(event.get("type", ""))
    if etype == "ERROR":
        code = int(obj.get("code") or 500)
        raise api_error_for_status(
            code,
            f"WATCH {path}: {code} {obj.get('reason', '')}: {obj.get('message', '')}",
            str(obj.get("reason") or ""),
        )
    return WatchEvent(type=etype, object=obj)

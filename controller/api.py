"""Thin async access to the Kubernetes API with raw JSON.

One :class:`KubeApi` per process, on the process's one asyncio loop (aiohttp, which the
``kubernetes`` client distribution already depends on). The official client is used only to
*resolve* a kubeconfig (contexts, certificates, tokens); requests and watches go over HTTP
directly and return plain ``dict`` JSON, because parsing models costs ~10x on hot paths.

Contracts:

* every non-2xx answer and every transport failure raises an :class:`~driver.errors.ApiError`
  subclass built by :func:`driver.errors.api_error_for_status` (the only status mapping),
  chained with ``raise ... from``; transport failures and timeouts are ``ServerError``
  (status 0, retryable);
* writes that must be conditional carry ``metadata.resourceVersion`` (PUT, or a merge patch
  that includes it): the API server answers 409 when the object changed meanwhile;
* all requests pass a client-side token bucket (``qps`` / ``burst``, as client-go's);
* :meth:`KubeApi.watch` yields :class:`WatchEvent` until the server ends the stream; an
  ``ERROR`` event becomes the matching ``ApiError`` (a 410 becomes ``GoneError``).

:class:`Api` is the Protocol the rest of the controller is written against, so unit tests can
substitute a recording fake.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import aiohttp

from driver.errors import ApiError, ConfigError, ServerError, api_error_for_status

JSON = dict[str, Any]
log = logging.getLogger(__name__)

JSON_TYPE: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_PATCH: Final = "application/strategic-merge-patch+json"
PatchType = Literal["merge", "json", "strategic"]
TOKEN_REFRESH_S: Final = 60.0
_PATCH_TYPES: Final[Mapping[str, str]] = {
    "merge": MERGE_PATCH,
    "json": JSON_PATCH,
    "strategic": STRATEGIC_PATCH,
}


@dataclass(frozen=True, slots=True)
class Resource:
    """One API resource: where it lives and how it is named."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{urllib.parse.quote(name, safe='')}"
            if subresource is not None:
                base += f"/{subresource}"
        return base


PODS: Final = Resource("", "v1", "pods", "Pod", namespaced=True)
NODES: Final = Resource("", "v1", "nodes", "Node", namespaced=False)
EVENTS: Final = Resource("", "v1", "events", "Event", namespaced=True)
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
DEVICE_CLASSES: Final = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)
RESOURCE_SLICES: Final = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False)
RESOURCE_CLAIMS: Final = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: ``ADDED`` | ``MODIFIED`` | ``DELETED`` | ``BOOKMARK`` and the object."""

    type: str
    object: JSON


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[JSON]
    resource_version: str


def meta(obj: Mapping[str, Any]) -> JSON:
    """``obj.metadata`` (empty dict when absent)."""
    m: JSON = obj.get("metadata") or {}
    return m


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    m = meta(obj)
    ns = m.get("namespace")
    return f"{ns}/{m.get('name', '')}" if ns else str(m.get("name", ""))


class Api(Protocol):
    """What the controller needs from the API server (``KubeApi``, or a fake in tests)."""

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON: ...

    async def list(
        self,
        res: Resource,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> ListResult: ...

    def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]: ...

    async def create(self, res: Resource, body: JSON, namespace: str | None = None) -> JSON: ...

    async def replace(
        self, res: Resource, body: JSON, *, subresource: str | None = None
    ) -> JSON: ...

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: PatchType = "merge",
    ) -> JSON: ...

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None: ...

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class TokenBucket:
    """client-go's flowcontrol token bucket: ``qps`` tokens per second, at most ``burst``."""

    def __init__(self, qps: float, burst: int) -> None:
        self._qps = qps
        self._burst = float(burst)
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._qps)
            self._last = now
            if self._tokens < 1.0:
                wait = (1.0 - self._tokens) / self._qps
                await asyncio.sleep(wait)
                self._tokens += wait * self._qps
                self._last = time.monotonic()
            self._tokens -= 1.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API server is and how to authenticate, resolved from a kubeconfig."""

    host: str
    headers: Mapping[str, str]
    ssl_context: ssl.SSLContext | None
    token_file: str | None = None  # re-read periodically: projected tokens rotate

    @classmethod
    def from_kubeconfig(cls, path: str | None) -> Endpoint:
        """Resolve a kubeconfig file with the official loader; without one, the in-cluster
        service account when running in a pod, else ``~/.kube/config``. A bad file is a
        ConfigError. (Tokens from exec plugins are fetched once, at start.)"""
        from kubernetes import client, config  # noqa: PLC0415 - heavy; CLI start only
        from kubernetes.config.incluster_config import (  # noqa: PLC0415
            SERVICE_TOKEN_FILENAME,
        )

        cfg = client.Configuration()
        token_file: str | None = None
        try:
            if path is None:
                try:
                    config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                    token_file = SERVICE_TOKEN_FILENAME
                except config.ConfigException:
                    config.load_kube_config(  # type: ignore[no-untyped-call]
                        client_configuration=cfg, persist_config=False
                    )
            else:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=path, client_configuration=cfg, persist_config=False
                )
        except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"kubeconfig {path or '(default)'}: {exc}") from exc
        headers: dict[str, str] = {}
        token = cfg.get_api_key_with_prefix("authorization")
        if token:
            headers["Authorization"] = str(token)
        elif cfg.username and cfg.password:
            headers["Authorization"] = str(cfg.get_basic_auth_token())
        ctx: ssl.SSLContext | None = None
        host = str(cfg.host).rstrip("/")
        if host.startswith("https://"):
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
            if not cfg.verify_ssl:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        return cls(host=host, headers=headers, ssl_context=ctx, token_file=token_file)


class KubeApi:
    """The real API client (see the module docstring). Use as ``async with``."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        qps: float,
        burst: int,
        request_timeout_s: float = 30.0,
        user_agent: str = "biaxial-controller",
        on_request: Callable[[], object] | None = None,
    ) -> None:
        self._endpoint = endpoint
        self._bucket = TokenBucket(qps, burst)
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._headers = {**endpoint.headers, "User-Agent": user_agent, "Accept": JSON_TYPE}
        self._session: aiohttp.ClientSession | None = None
        self._token: tuple[float, str] | None = None
        self._on_request = on_request
        self.requests = 0  # number of requests sent

    def _count(self) -> None:
        self.requests += 1
        if self._on_request is not None:
            self._on_request()

    def _auth(self) -> dict[str, str] | None:
        """Fresh ``Authorization`` for a rotating token file (re-read each minute)."""
        path = self._endpoint.token_file
        if path is None:
            return None
        now = time.monotonic()
        if self._token is None or now - self._token[0] > TOKEN_REFRESH_S:
            try:
                self._token = (now, Path(path).read_text(encoding="utf-8").strip())
            except OSError as exc:
                if self._token is None:
                    raise ServerError(f"service account token {path}: {exc}", status=0) from exc
                log.warning("could not re-read the service account token: %s", exc)
                self._token = (now, self._token[1])
        return {"Authorization": f"Bearer {self._token[1]}"}

    async def __aenter__(self) -> KubeApi:
        connector = aiohttp.TCPConnector(limit=64, ssl=self._endpoint.ssl_context or False)
        self._session = aiohttp.ClientSession(
            base_url=None, connector=connector, headers=self._headers
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, path: str, params: Mapping[str, str] | None = None) -> str:
        url = self._endpoint.host + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        return url

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("KubeApi used outside 'async with'")
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON_TYPE,
    ) -> JSON:
        await self._bucket.acquire()
        self._count()
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = self._auth() or {}
        if data is not None:
            headers["Content-Type"] = content_type
        try:
            async with self.session.request(
                method, self._url(path, params), data=data, headers=headers, timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerError(f"{method} {path}: {exc or type(exc).__name__}", status=0) from exc
        if status >= 300:
            raise _error_from_body(method, path, status, raw)
        if not raw:
            return {}
        try:
            parsed: JSON = json.loads(raw)
        except ValueError as exc:
            raise ServerError(f"{method} {path}: answer is not JSON", status=status) from exc
        return parsed

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON:
        return await self.request("GET", res.path(namespace, name))

    async def list(
        self,
        res: Resource,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> ListResult:
        items: list[JSON] = []
        params: dict[str, str] = {"limit": str(page_size)}
        if field_selector:
            params["fieldSelector"] = field_selector
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            page = await self.request("GET", res.path(), params=params)
            items.extend(page.get("items") or [])
            lmeta = page.get("metadata") or {}
            cont = lmeta.get("continue")
            if not cont:
                rv = str(lmeta.get("resourceVersion", ""))
                return ListResult(items=items, resource_version=rv)
            params["continue"] = str(cont)

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
        }
        if field_selector:
            params["fieldSelector"] = field_selector
        if label_selector:
            params["labelSelector"] = label_selector
        path = res.path()
        await self._bucket.acquire()
        self._count()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30)
        try:
            async with self.session.get(
                self._url(path, params), timeout=timeout, headers=self._auth()
            ) as resp:
                if resp.status >= 300:
                    raise _error_from_body("WATCH", path, resp.status, await resp.read())
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            yield _watch_event(path, line)
                if buffer.strip():
                    yield _watch_event(path, buffer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerError(f"WATCH {path}: {exc or type(exc).__name__}", status=0) from exc

    async def create(self, res: Resource, body: JSON, namespace: str | None = None) -> JSON:
        ns = namespace if namespace is not None else meta(body).get("namespace")
        return await self.request("POST", res.path(ns), body=body)

    async def replace(self, res: Resource, body: JSON, *, subresource: str | None = None) -> JSON:
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
        body: JSON | None = None
        if uid is not None or resource_version is not None:
            pre: JSON = {}
            if uid is not None:
                pre["uid"] = uid
            if resource_version is not None:
                pre["resourceVersion"] = resource_version
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": pre}
        await self.request("DELETE", res.path(namespace, name), body=body)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST ``pods/{name}/binding`` (the answer is a Status, read as raw JSON)."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", PODS.path(namespace, name, "binding"), body=body)


def _error_from_body(method: str, path: str, status: int, raw: bytes) -> ApiError:
    message = raw.decode(errors="replace")[:500]
    reason = ""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        message = str(body.get("message") or message)
        reason = str(body.get("reason") or "")
    return api_error_for_status(status, f"{method} {path}: {status} {reason}: {message}", reason)


def _watch_event(path: str, line: bytes) -> WatchEvent:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise ServerError(f"WATCH {path}: malformed event", status=0) from exc
    etype = str(event.get("type", ""))
    obj: JSON = event.get("object") or {}
    if etype == "ERROR":
        code = int(obj.get("code") or 500)
        raise api_error_for_status(
            code,
            f"WATCH {path}: {code} {obj.get('reason', '')}: {obj.get('message', '')}",
            str(obj.get("reason") or ""),
        )
    return WatchEvent(type=etype, object=obj)

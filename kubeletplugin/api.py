"""The kubelet plugin's thin async access to the Kubernetes API, as raw JSON.

Decision: ``kubernetes.aio`` (37.x) is a generated async copy of the model-based client on
``aiohttp`` + ``aiohttp_retry``; its calls return models unless one uses the
``*_without_preload_content`` variants (raw responses to decode by hand) and its watch helper
deserializes events into models. The plugin needs eight calls, so it talks HTTP itself over
``aiohttp`` (already a dependency of the ``kubernetes`` distribution), on the process's one
asyncio loop, and uses the official package only to *resolve* a kubeconfig or the in-cluster
service account. Everything returned is plain ``dict`` JSON.

Contracts:

* Every non-2xx answer becomes the :class:`~driver.errors.ApiError` subclass chosen by
  :func:`driver.errors.api_error_for_status` (the only status mapping), with the API server's
  ``reason`` and ``message``; transport failures and timeouts are
  :class:`~driver.errors.ServerError` with status 0 (retryable). Always ``raise ... from``.
* :meth:`PluginApi.get_claim` returns ``None`` for a 404 (the Preparer's contract).
* Updates and deletes carry preconditions (``metadata.resourceVersion`` / ``preconditions``);
  a concurrent change is a :class:`~driver.errors.ConflictError`.
* :meth:`PluginApi.watch_slices` yields ``(type, object)`` until the server closes the stream;
  an ``ERROR`` event raises (410 -> :class:`~driver.errors.GoneError`: relist).
* The in-cluster service-account token is re-read every minute (it is rotated on disk).
"""

from __future__ import annotations

import json
import logging
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp

from driver.errors import ApiError, ConfigError, ServerError, api_error_for_status

JSON = dict[str, Any]
logger = logging.getLogger(__name__)

JSON_TYPE: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
SLICES_PATH: Final = "/apis/resource.k8s.io/v1/resourceslices"
_TOKEN_REFRESH_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API server is and how to authenticate."""

    host: str
    headers: Mapping[str, str]
    ssl_context: ssl.SSLContext | None
    token_file: Path | None = None  # re-read periodically (in-cluster, rotated tokens)

    @classmethod
    def resolve(cls, kubeconfig: Path | None) -> Endpoint:
        """A kubeconfig file, or the in-cluster service account when ``kubeconfig`` is None."""
        import yaml  # noqa: PLC0415 - the kubeconfig loader's parser
        from kubernetes import client, config  # noqa: PLC0415 - heavy; process start only

        cfg = client.Configuration()
        token_file: Path | None = None
        try:
            if kubeconfig is None:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                token_file = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
            else:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(kubeconfig), client_configuration=cfg, persist_config=False
                )
        except (
            config.ConfigException,
            yaml.YAMLError,
            OSError,
            ValueError,
            TypeError,
            KeyError,
        ) as exc:
            where = kubeconfig or "in-cluster configuration (no --kubeconfig given)"
            detail = " ".join(str(exc).split())  # YAML errors span lines; errors are one line
            raise ConfigError(f"cannot load Kubernetes config from {where}: {detail}") from exc
        headers: dict[str, str] = {}
        token = cfg.get_api_key_with_prefix("authorization")
        if token:
            headers["Authorization"] = str(token)
        elif cfg.username and cfg.password:
            headers["Authorization"] = str(cfg.get_basic_auth_token())
        host = str(cfg.host).rstrip("/")
        ctx: ssl.SSLContext | None = None
        if host.startswith("https://"):
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
            if not cfg.verify_ssl:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        return cls(host=host, headers=headers, ssl_context=ctx, token_file=token_file)


def _error(method: str, path: str, status: int, raw: bytes) -> ApiError:
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


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class PluginApi:
    """The plugin's API client (see the module docstring). Use as ``async with``."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        request_timeout_s: float = 30.0,
        user_agent: str = "biaxial-kubelet-plugin",
    ) -> None:
        self._endpoint = endpoint
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._headers = {**endpoint.headers, "User-Agent": user_agent, "Accept": JSON_TYPE}
        self._token_read_at = time.monotonic()
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0

    async def __aenter__(self) -> PluginApi:
        connector = aiohttp.TCPConnector(limit=16, ssl=self._endpoint.ssl_context or False)
        self._session = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ----------------------------------------------------------------- plumbing

    def _session_or_raise(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("PluginApi used outside 'async with'")
        return self._session

    def _auth_headers(self) -> dict[str, str]:
        token_file = self._endpoint.token_file
        if token_file and time.monotonic() - self._token_read_at > _TOKEN_REFRESH_S:
            self._token_read_at = time.monotonic()
            try:
                self._headers["Authorization"] = f"Bearer {token_file.read_text().strip()}"
            except OSError as exc:
                logger.warning("cannot re-read the service-account token %s: %s", token_file, exc)
        return self._headers

    def _url(self, path: str, params: Mapping[str, str] | None) -> str:
        url = self._endpoint.host + path
        return f"{url}?{urllib.parse.urlencode(params)}" if params else url

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = JSON_TYPE,
    ) -> JSON:
        """One request; the decoded JSON body, or the mapped :class:`ApiError`."""
        self.requests += 1
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = dict(self._auth_headers())
        if data is not None:
            headers["Content-Type"] = content_type
        try:
            async with self._session_or_raise().request(
                method, self._url(path, params), data=data, headers=headers, timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerError(f"{method} {path}: {exc or type(exc).__name__}", status=0) from exc
        if status >= 300:
            raise _error(method, path, status, raw)
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ServerError(f"{method} {path}: malformed JSON answer", status=0) from exc
        if not isinstance(decoded, dict):
            raise ServerError(f"{method} {path}: answer is not an object", status=0)
        return decoded

    # ----------------------------------------------------------------- claims, nodes

    async def get_claim(self, namespace: str, name: str) -> JSON | None:
        """The ResourceClaim, or None when it does not exist (404)."""
        path = (
            f"/apis/resource.k8s.io/v1/namespaces/{_quote(namespace)}/resourceclaims/{_quote(name)}"
        )
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def get_node(self, name: str) -> JSON:
        return await self.request("GET", f"/api/v1/nodes/{_quote(name)}")

    async def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> JSON:
        """A JSON merge patch of the Node's ``status`` subresource."""
        return await self.request(
            "PATCH", f"/api/v1/nodes/{_quote(name)}/status", body=patch, content_type=MERGE_PATCH
        )

    # ----------------------------------------------------------------- resource slices

    async def list_slices(self, field_selector: str) -> tuple[list[JSON], str]:
        """Every matching slice (following ``continue``) and the list's resourceVersion."""
        params = {"fieldSelector": field_selector, "limit": "500"}
        items: list[JSON] = []
        while True:
            page = await self.request("GET", SLICES_PATH, params=params)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                return items, str(meta.get("resourceVersion", ""))
            params = {**params, "continue": str(cont)}

    async def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, JSON]]:
        """Watch events ``(ADDED|MODIFIED|DELETED|BOOKMARK, object)`` from ``resource_version``."""
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_s),
            "fieldSelector": field_selector,
        }
        self.requests += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30)
        try:
            async with self._session_or_raise().get(
                self._url(SLICES_PATH, params), headers=self._auth_headers(), timeout=timeout
            ) as resp:
                if resp.status >= 300:
                    raise _error("WATCH", SLICES_PATH, resp.status, await resp.read())
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            yield _watch_event(line)
                if buffer.strip():
                    yield _watch_event(buffer)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ServerError(
                f"WATCH {SLICES_PATH}: {exc or type(exc).__name__}", status=0
            ) from exc

    async def create_slice(self, body: Mapping[str, Any]) -> JSON:
        return await self.request("POST", SLICES_PATH, body=body)

    async def update_slice(self, body: Mapping[str, Any]) -> JSON:
        """PUT; ``body.metadata.resourceVersion`` must be set (the precondition)."""
        name = body["metadata"]["name"]
        if not body["metadata"].get("resourceVersion"):
            raise ValueError(f"update of slice {name!r} without a resourceVersion precondition")
        return await self.request("PUT", f"{SLICES_PATH}/{_quote(name)}", body=body)

    async def delete_slice(self, name: str, *, uid: str = "", resource_version: str = "") -> None:
        """Delete with uid/resourceVersion preconditions; a 404 counts as done."""
        preconditions: dict[str, str] = {}
        if uid:
            preconditions["uid"] = uid
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if preconditions:
            body["preconditions"] = preconditions
        try:
            await self.request("DELETE", f"{SLICES_PATH}/{_quote(name)}", body=body)
        except ApiError as exc:
            if exc.status != 404:
                raise


def _watch_event(line: bytes) -> tuple[str, JSON]:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise ServerError(f"WATCH {SLICES_PATH}: malformed event", status=0) from exc
    etype = str(event.get("type", ""))
    obj: JSON = event.get("object") or {}
    if etype == "ERROR":
        code = int(obj.get("code") or 500)
        raise api_error_for_status(
            code,
            f"WATCH {SLICES_PATH}: {code} {obj.get('reason', '')}: {obj.get('message', '')}",
            str(obj.get("reason") or ""),
        )
    return etype, obj

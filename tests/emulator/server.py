"""The HTTP/1.1 front end and the :class:`Emulator` facade.

The server is the standard library's ``ThreadingHTTPServer`` with ``TCP_NODELAY`` (without it
every call costs ~44 ms of Nagle/delayed-ACK), keep-alive and chunked watch streams, bound to
127.0.0.1. Routing covers the core group (``/api/v1``) and ``/apis/<group>/<version>``,
namespaced and cluster-scoped paths, ``/status``, ``pods/{name}/binding`` and
``namespaces/{ns}/bindings``, discovery (``/api``, ``/apis``, ``/apis/<group>``,
``/api/v1``, ``/apis/<group>/<version>``), ``/version`` and health endpoints. ``/openapi/*``
answers 404 as a server without OpenAPI would.

:class:`Emulator` owns a :class:`~tests.emulator.storage.Store`, the server thread, the request
log and the fault rules; it is the object tests use (``start()``/``stop()``, context manager,
hooks to seed, inspect and wait without HTTP). ``stop()`` ends open watches and closes every
connection before it returns.
"""

from __future__ import annotations

import builtins
import contextlib
import http.client
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

import yaml

from kubeapi import codec
from kubeapi.serving import listen_backlog
from tests.emulator import errors
from tests.emulator.errors import ApiStatusError
from tests.emulator.faults import WRITE_VERBS, FaultRule, Faults, Hold, RequestRecord
from tests.emulator.kinds import (
    ALL_KINDS,
    BY_GROUP_VERSION,
    EVENT_V1,
    NAMESPACE,
    POD,
    RESOURCE_SLICE,
    Kind,
    lookup,
)
from tests.emulator.patch import APPLY_PATCH
from tests.emulator.reviews import ACCESS_REVIEWS, TOKEN_REVIEWS, Reviews
from tests.emulator.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)
from tests.emulator.storage import Obj, Store, Watcher
from tests.emulator.validation import DEFAULT_SCHEMA_VERSION, SchemaValidators, stored_expressions

_VERBS: Final = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_DEFAULT_WATCH_TIMEOUT: Final = 1800.0
_JSON: Final = "application/json"
_COMPACT: Final = (",", ":")
_FIELD_VALIDATION: Final = frozenset({"Ignore", "Strict", "Warn"})
#: an answer's head and body up to this size go in one write
_ONE_WRITE: Final = 1 << 16
#: the options kind whose validation (apimachinery meta/v1/validation) checks fieldValidation
_WRITE_OPTIONS: Final = {
    "create": "CreateOptions",
    "update": "UpdateOptions",
    "patch": "PatchOptions",
}


def _group_versions() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for kind in ALL_KINDS:
        if kind.group:
            groups.setdefault(kind.group, [])
            if kind.version not in groups[kind.group]:
                groups[kind.group].append(kind.version)
    return groups


def _resource_list(group: str, version: str) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for kind in BY_GROUP_VERSION[(group, version)].values():
        entry: dict[str, Any] = {
            "name": kind.plural,
            "singularName": kind.singular,
            "namespaced": kind.namespaced,
            "kind": kind.kind,
            "verbs": _VERBS,
        }
        if kind.short_names:
            entry["shortNames"] = list(kind.short_names)
        resources.append(entry)
        if kind.status_subresource:
            resources.append(
                {
                    "name": f"{kind.plural}/status",
                    "singularName": "",
                    "namespaced": kind.namespaced,
                    "kind": kind.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if kind is POD:
            resources.append(
                {
                    "name": "pods/binding",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "Binding",
                    "verbs": ["create"],
                }
            )
    if group == "" and version == "v1":
        resources.append(
            {
                "name": "bindings",
                "singularName": "binding",
                "namespaced": True,
                "kind": "Binding",
                "verbs": ["create"],
            }
        )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def _api_group(group: str, versions: list[str]) -> dict[str, Any]:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": gvs,
        "preferredVersion": gvs[0],
    }


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _openapi_gv(segments: list[str]) -> tuple[str, str] | None:
    for group, version in BY_GROUP_VERSION:
        if "/".join(segments) == _gv_path(group, version):
            return group, version
    return None


def _openapi_v3(group: str, version: str) -> dict[str, Any]:
    """A minimal OpenAPI v3 document: paths and PATCH operations only, no schemas.

    It tells kubectl that the server validates fields itself (the ``fieldValidation`` query
    parameter), so ``kubectl apply/create`` send ``fieldValidation=Strict`` instead of
    downloading schemas for client-side validation. Without schemas kubectl computes apply
    patches from its compiled-in types, as it does against a server without OpenAPI.
    """
    paths: dict[str, Any] = {}
    for kind in BY_GROUP_VERSION[(group, version)].values():
        prefix = f"/{_gv_path(group, version)}"
        scope = "/namespaces/{namespace}" if kind.namespaced else ""
        gvk = {"group": group, "version": version, "kind": kind.kind}
        paths[f"{prefix}{scope}/{kind.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{kind.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                    {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (biaxial API emulator)", "version": "v1.37.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }


class _Request:
    """A parsed resource request."""

    __slots__ = ("kind", "name", "namespace", "query", "subresource", "verb")

    def __init__(
        self,
        kind: Kind,
        namespace: str | None,
        name: str | None,
        subresource: str | None,
        query: dict[str, str],
    ) -> None:
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.subresource = subresource
        self.query = query
        self.verb = ""

    @property
    def resource(self) -> str:
        return f"{self.kind.plural}/{self.subresource}" if self.subresource else self.kind.plural


class _Headers:
    """A request's header fields by lower-cased name, read as ``email.message.Message.get``
    reads them (case-insensitive, the first of repeated fields)."""

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._fields.get(name.lower(), default)


_DATE: list[tuple[int, str]] = [(0, "")]
#: an answer's status line and Server header by status code, up to the Date header's value
_STATUS_LINES: dict[int, str] = {}


def _http_date() -> str:
    """The ``Date`` header's value (``BaseHTTPRequestHandler.date_time_string``), formatted
    once a second."""
    second = int(time.time())
    cached = _DATE[0]
    if cached[0] != second:
        cached = (second, formatdate(second, usegmt=True))
        _DATE[0] = cached
    return cached[1]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    emulator: Emulator

    def __init__(self, address: tuple[str, int], emulator: Emulator) -> None:
        self.emulator = emulator
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        self.request_queue_size = listen_backlog()  # an API server's (see the function)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.conn_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.conn_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request is normal; anything else is an emulator bug."""
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        if exc is not None:
            self.emulator.internal_errors.append(exc)
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.conn_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server
    _path = ""
    _query: dict[str, str] = {}  # noqa: RUF012 - read only; each request sets its own

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silence the per-request stderr line; the emulator keeps its own request log."""

    # ------------------------------------------------------------------ plumbing
    def parse_request(self) -> bool:
        """The standard library's request parsing, with an HTTP/1.1 request's header block
        read here: ``http.client.parse_headers`` runs the ``email`` package's parser, about a
        tenth of the emulator's CPU per request. The same limits (65,536 bytes a line, 100
        headers) and answers (431); the first of repeated fields counts, as
        ``email.message.Message.get`` gives it. Any other request line (HTTP/1.0, HTTP/0.9,
        malformed) is the standard library's to parse and answer."""
        requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = requestline.split()
        if len(words) != 3 or words[2] != "HTTP/1.1":
            return super().parse_request()
        self.requestline = requestline
        self.command, path, self.request_version = words
        self.path = "/" + path.lstrip("/") if path.startswith("//") else path
        self.close_connection = False
        fields: dict[str, str] = {}
        last = ""
        for count in range(http.client._MAXHEADERS + 2):  # type: ignore[attr-defined]
            line = self.rfile.readline(http.client._MAXLINE + 1)  # type: ignore[attr-defined]
            if len(line) > http.client._MAXLINE:  # type: ignore[attr-defined]
                err: http.client.HTTPException = http.client.LineTooLong("header line")
                self.send_error(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long", str(err)
                )
                return False
            if count > http.client._MAXHEADERS:  # type: ignore[attr-defined]
                err = http.client.HTTPException(
                    f"got more than {http.client._MAXHEADERS} headers"  # type: ignore[attr-defined]
                )
                self.send_error(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers", str(err)
                )
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            text = str(line, "iso-8859-1").rstrip("\r\n")
            if text[:1] in (" ", "\t"):  # an obsolete folded continuation
                if last:
                    fields[last] += text
                continue
            name, colon, value = text.partition(":")
            if colon:
                last = name.lower()
                fields.setdefault(last, value.lstrip(" \t"))
        self.headers = _Headers(fields)  # type: ignore[assignment]
        connection = fields.get("connection", "").lower()
        if connection == "close":
            self.close_connection = True
        if fields.get("expect", "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _record(self, req: _Request | None, status: int) -> None:
        self.server.emulator._log(
            RequestRecord(
                self.command,
                self._path,
                dict(self._query),
                (self.headers.get("Content-Type") or "").split(";")[0].strip(),
                req.verb if req else "",
                req.resource if req else "",
                status,
                self.headers.get("User-Agent") or "",
            )
        )

    def _send(
        self,
        code: int,
        payload: Any,
        req: _Request | None = None,
        warnings: list[str] | None = None,
    ) -> None:
        data = payload if isinstance(payload, bytes) else codec.dumps(payload)
        self._record(req, code)
        status = _STATUS_LINES.get(code)
        if status is None:
            status = _STATUS_LINES[code] = (
                f"{self.protocol_version} {code} {self.responses[code][0]}\r\n"
                f"Server: {self.version_string()}\r\nDate: "
            )
        warned = "".join(f"Warning: {warning_header(w)}\r\n" for w in warnings) if warnings else ""
        # One write (one send, one segment) for the head and a small body: with TCP_NODELAY
        # the standard library's head-then-body is two segments the client wakes up for.
        header = (
            f"{status}{_http_date()}\r\n{warned}Content-Type: {_JSON}\r\n"
            f"Cache-Control: no-cache, private\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode("latin-1")
        if self.command == "HEAD":
            self.wfile.write(header)
        elif len(data) <= _ONE_WRITE:
            self.wfile.write(header + data)
        else:
            self.wfile.write(header)
            self.wfile.write(data)

    def _send_object(
        self,
        code: int,
        obj: Obj,
        req: _Request,
        warnings: list[str] | None = None,
        *,
        stored: bool = True,
    ) -> None:
        """``_send`` of an API object, encoded once (``stored``: a stored object, whose
        encoding the watch events of the same write reuse)."""
        self._send(code, self.server.emulator.encoded.whole(obj, keep=stored), req, warnings)

    def _send_error(self, exc: ApiStatusError, req: _Request | None = None) -> None:
        self._send(exc.code, exc.to_status(), req)

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        emulator = self.server.emulator
        req: _Request | None = None
        try:
            parts = urlsplit(self.path)
            self._path = parts.path
            self._query = query = dict(parse_qsl(parts.query, keep_blank_values=True))
            body = self._body()
            segments = [s for s in parts.path.split("/") if s]
            if not self._discovery(segments, emulator) and not self._review(segments, body):
                req = self._route(segments, query)
                self._resource(req, body, emulator)
        except ApiStatusError as exc:
            self._send_error(exc, req)
        except OSError:  # the client hung up (or stop() closed the socket)
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - any bug becomes a 500 Status, not a hung client
            emulator.internal_errors.append(exc)
            self._send_error(errors.internal(f"emulator bug: {type(exc).__name__}: {exc}"), req)

    # ------------------------------------------------------------------ discovery
    def _discovery(self, segments: list[str], emulator: Emulator) -> bool:
        if self.command not in {"GET", "HEAD"}:
            return False
        n = len(segments)
        if n == 0:
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]
            paths += [f"/apis/{g}" for g in _group_versions()]
            paths += [f"/apis/{g}/{v}" for g, vs in _group_versions().items() for v in vs]
            self._send(200, {"paths": sorted(paths)})
        elif segments == ["version"]:
            self._send(
                200,
                {
                    "major": "1",
                    "minor": emulator.schema_version.split(".")[1],
                    "gitVersion": f"v{emulator.schema_version}.0-biaxial-emulator",
                    "gitCommit": "0000000000000000000000000000000000000000",
                    "gitTreeState": "clean",
                    "buildDate": "2026-01-01T00:00:00Z",
                    "goVersion": "go1.25",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        elif n == 1 and segments[0] in {"healthz", "livez", "readyz"}:
            data = b"ok"
            self._record(None, 200)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif segments == ["api"]:
            self._send(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{emulator.port}"}
                    ],
                },
            )
        elif segments == ["openapi", "v3"]:
            self._send(
                200,
                {
                    "paths": {
                        _gv_path(g, v): {
                            "serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash=emulator"
                        }
                        for g, v in BY_GROUP_VERSION
                    }
                },
            )
        elif segments[:2] == ["openapi", "v3"] and _openapi_gv(segments[2:]) is not None:
            group, version = _openapi_gv(segments[2:]) or ("", "")
            self._send(200, _openapi_v3(group, version))
        elif segments == ["api", "v1"]:
            self._send(200, _resource_list("", "v1"))
        elif segments == ["apis"]:
            groups = [_api_group(g, vs) for g, vs in _group_versions().items()]
            self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        elif n == 2 and segments[0] == "apis" and segments[1] in _group_versions():
            self._send(200, _api_group(segments[1], _group_versions()[segments[1]]))
        elif n == 3 and segments[0] == "apis" and (segments[1], segments[2]) in BY_GROUP_VERSION:
            self._send(200, _resource_list(segments[1], segments[2]))
        else:
            return False
        return True

    # ------------------------------------------------------------------ reviews
    def _review(self, segments: list[str], body: bytes) -> bool:
        """TokenReview and SubjectAccessReview (``tests.emulator.reviews``): POST only."""
        where = tuple(segments[1:])
        if segments[:1] != ["apis"] or where not in {TOKEN_REVIEWS, ACCESS_REVIEWS}:
            return False
        if self.command != "POST":
            raise errors.method_not_allowed()
        request = _json(self._normalize_body(body))
        if not isinstance(request, dict):
            raise errors.bad_request("the request body is not an object")
        reviews = self.server.emulator.reviews
        if where == TOKEN_REVIEWS:
            self._send(201, reviews.token_review(request))
        else:
            self._send(201, reviews.access_review(request))
        return True

    # ------------------------------------------------------------------ routing
    def _route(self, segments: list[str], query: dict[str, str]) -> _Request:
        not_found = ApiStatusError(
            404, "NotFound", "the server could not find the requested resource", {}
        )
        if segments[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segments[2:]
        elif len(segments) >= 3 and segments[0] == "apis":
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            raise not_found
        kinds = BY_GROUP_VERSION.get((group, version))
        if kinds is None or not rest:
            raise not_found
        if rest[0] == "watch":
            query = {**query, "watch": "true"}
            rest = rest[1:]
        namespace: str | None = None
        namespace_subresource = group == "" and len(rest) == 3 and rest[2] in {"status", "finalize"}
        if len(rest) >= 3 and rest[0] == "namespaces" and not namespace_subresource:
            namespace, rest = rest[1], rest[2:]
        if group == "" and namespace is not None and rest == ["bindings"]:
            return _Request(POD, namespace, None, "binding", query)
        kind = kinds.get(rest[0])
        if kind is None or len(rest) > 3:
            raise not_found
        if kind.namespaced != (namespace is not None) and not (kind.namespaced and len(rest) == 1):
            raise not_found
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        if sub is not None and not (
            (sub == "status" and kind.status_subresource) or (sub == "binding" and kind is POD)
        ):
            raise not_found
        return _Request(kind, namespace, name, sub, query)

    # ------------------------------------------------------------------ resources
    def _resource(self, req: _Request, body: bytes, emulator: Emulator) -> None:
        method = self.command
        q = req.query
        watch = q.get("watch") in {"true", "1"}
        if req.name is None and req.subresource is None:
            req.verb = {
                "GET": "watch" if watch else "list",
                "HEAD": "list",
                "POST": "create",
                "DELETE": "deletecollection",
            }.get(method, "")
        elif req.subresource == "binding":
            req.verb = "create" if method == "POST" else ""
        else:
            req.verb = {
                "GET": "get",
                "HEAD": "get",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete",
            }.get(method, "")
        if not req.verb:
            raise errors.method_not_allowed()
        hold = emulator.faults.hold_for(req.verb, req.resource)
        if hold is None:
            self._serve(req, body, emulator)
            return
        hold.wait()
        try:
            self._serve(req, body, emulator)
        finally:
            hold.served.set()

    def _serve(self, req: _Request, body: bytes, emulator: Emulator) -> None:
        """Serve a request past its holds: latency, injected errors, then the request."""
        delay = emulator.faults.latency_for(req.verb, req.resource)
        if delay:
            time.sleep(delay)
        injected = emulator.faults.error_for(req.verb, req.resource)
        if injected is not None:
            raise injected
        self._authorize(req, emulator)
        if req.verb in WRITE_VERBS and emulator.write_observers:
            # The observers see exactly the state this write is applied to.
            with emulator.store.lock:
                agent = self.headers.get("User-Agent") or ""
                for observe in list(emulator.write_observers):
                    observe(agent, req.verb, req.resource)
                self._apply(req, body, emulator)
            return
        self._apply(req, body, emulator)

    def _apply(self, req: _Request, body: bytes, emulator: Emulator) -> None:
        """Serve an authorized resource request."""
        q = req.query
        body = self._normalize_body(body)
        store = emulator.store
        dry_run = q.get("dryRun") == "All"
        if "dryRun" in q and not dry_run:
            raise errors.bad_request(
                f'dryRun: Unsupported value: "{q["dryRun"]}": supported values: "All"'
            )
        kind = req.kind
        if req.subresource == "binding":
            name = req.name or str((_json(body).get("metadata") or {}).get("name") or "")
            binding = _json(body)
            problems = emulator.validators.check_raw(
                "v1",
                "Binding",
                "binding-v1.json",
                {"apiVersion": "v1", "kind": "Binding", **binding},
            )
            if problems:
                raise errors.bad_request(
                    'Binding in version "v1" cannot be handled as a Binding: ' + "; ".join(problems)
                )
            if not dry_run:
                store.bind(req.namespace or "", name, binding)
            self._send(
                201,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "code": 201,
                },
                req,
            )
            return
        if req.verb in {"list", "watch", "deletecollection"}:
            labels = parse_label_selector(q["labelSelector"]) if q.get("labelSelector") else None
            fields = (
                parse_field_selector(q["fieldSelector"], kind) if q.get("fieldSelector") else None
            )
            if req.verb == "watch":
                self._watch(req, labels, fields, emulator)
                return
            if req.verb == "deletecollection":
                deleted = store.delete_collection(
                    kind,
                    req.namespace,
                    labels=labels,
                    fields=fields,
                    options=_json(body, allow_empty=True),
                )
                head = _list_body(kind, store.rv, None, None)
                self._send(200, emulator.encoded.list_bytes(head, deleted, keep=False), req)
                return
            limit = _int_param(q, "limit")
            result = store.list(
                kind,
                req.namespace,
                labels=labels,
                fields=fields,
                limit=limit,
                continue_token=q.get("continue") or None,
                resource_version=q.get("resourceVersion"),
                resource_version_match=q.get("resourceVersionMatch") or None,
            )
            head = _list_body(
                kind, result.resource_version, result.continue_token, result.remaining
            )
            # events.k8s.io/v1 shows each stored Event as a new object: nothing to keep.
            stored = kind is not EVENT_V1
            self._send(200, emulator.encoded.list_bytes(head, result.items, keep=stored), req)
            return
        warnings: list[str] = []
        validation = q.get("fieldValidation") or emulator.field_validation
        if validation not in _FIELD_VALIDATION and req.verb in _WRITE_OPTIONS:
            raise errors.invalid_options(
                _WRITE_OPTIONS[req.verb],
                [
                    errors.FieldError(
                        "fieldValidation",
                        "Unsupported value",
                        'supported values: "", "Ignore", "Strict", "Warn"',
                        validation,
                    )
                ],
            )
        # what a write or get answers is the stored object (not when a dry run, or an
        # events.k8s.io/v1 view of a stored core Event): its encoding is kept for its events
        stored = not dry_run and kind is not EVENT_V1
        if req.verb == "create":
            obj = store.create(
                kind,
                req.namespace,
                _json(body),
                dry_run=dry_run,
                field_validation=validation,
                warnings=warnings,
                owned=True,  # decoded for this request alone
            )
            # a list then cuts the object's item out of this encoding (EncodedObjects.item)
            self._send_object(201, obj, req, warnings, stored=stored)
            return
        assert req.name is not None
        if req.verb == "get":
            self._send_object(200, store.get(kind, req.namespace, req.name), req, stored=stored)
        elif req.verb == "update":
            # only a kind created by an update can answer 201; any other answers 200 or fails
            existed = (
                not kind.create_on_update
                or req.subresource is not None
                or store.try_get(kind, req.namespace, req.name) is not None
            )
            self._send_object(
                200 if existed else 201,
                store.replace(
                    kind,
                    req.namespace,
                    req.name,
                    _json(body),
                    subresource=req.subresource,
                    dry_run=dry_run,
                    field_validation=validation,
                    warnings=warnings,
                    raw_body=body,
                    owned=True,  # decoded for this request alone
                ),
                req,
                warnings,
                stored=stored,
            )
        elif req.verb == "patch":
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if content_type == APPLY_PATCH:
                raise errors.unsupported_media_type(content_type)
            self._send_object(
                200,
                store.patch(
                    kind,
                    req.namespace,
                    req.name,
                    content_type,
                    body,
                    subresource=req.subresource,
                    dry_run=dry_run,
                    field_validation=validation,
                    warnings=warnings,
                ),
                req,
                warnings,
                stored=stored,
            )
        elif req.verb == "delete":
            if req.subresource is not None:
                raise errors.method_not_allowed()
            options = _json(body, allow_empty=True)
            if "gracePeriodSeconds" in q:
                options = {**options, "gracePeriodSeconds": _int_param(q, "gracePeriodSeconds")}
            self._send_object(
                200,
                store.delete(kind, req.namespace, req.name, options, dry_run=dry_run),
                req,
                stored=stored,
            )

    def _normalize_body(self, body: bytes) -> bytes:
        """POST/PUT/DELETE bodies may be JSON (also without Content-Type) or YAML; protobuf
        is not emulated (415)."""
        if self.command == "PATCH" or not body.strip():
            return body
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type in {"application/yaml", "application/x-yaml", "text/yaml"}:
            try:
                return json.dumps(yaml.safe_load(body)).encode()
            except yaml.YAMLError as exc:
                raise errors.bad_request(
                    f"the body of the request could not be decoded as YAML: {exc}"
                ) from exc
        if content_type.startswith("application/vnd.kubernetes.protobuf"):
            raise errors.unsupported_media_type(content_type)
        return body

    def _authorize(self, req: _Request, emulator: Emulator) -> None:
        node = emulator.node_identity
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer system:node:"):
            node = auth.removeprefix("Bearer system:node:")
        if (
            node is None
            or req.kind is not RESOURCE_SLICE
            or req.verb not in {"list", "watch", "deletecollection"}
        ):
            return
        selector = req.query.get("fieldSelector") or ""
        wanted = f"spec.nodeName={node}"
        if wanted not in [t.strip() for t in selector.split(",")]:
            raise errors.forbidden(
                req.kind,
                "",
                f'resourceslices.resource.k8s.io is forbidden: User "system:node:{node}" cannot '
                f'{req.verb} resource "resourceslices" in API group "resource.k8s.io" at the '
                "cluster "
                f"scope: can only {req.verb} resourceslices with a spec.nodeName={node} field "
                "selector",
            )

    # ------------------------------------------------------------------ watch
    def _watch(
        self,
        req: _Request,
        labels: LabelSelector | None,
        fields: FieldSelector | None,
        emulator: Emulator,
    ) -> None:
        q = req.query
        rv = q.get("resourceVersion")
        timeout = float(_int_param(q, "timeoutSeconds") or _DEFAULT_WATCH_TIMEOUT)
        bookmarks = q.get("allowWatchBookmarks") in {"true", "1"}
        send_initial = q.get("sendInitialEvents") in {"true", "1"}
        if send_initial and not (bookmarks and q.get("resourceVersionMatch") == "NotOlderThan"):
            raise errors.invalid(
                req.kind,
                "",
                [
                    errors.FieldError(
                        "sendInitialEvents",
                        "Forbidden",
                        "sendInitialEvents is forbidden for watch unless the WatchList "
                        "feature gate is "
                        "enabled and resourceVersionMatch is NotOlderThan and "
                        "allowWatchBookmarks is true",
                    )
                ],
            )
        early: ApiStatusError | None = None
        watcher: Watcher | None = None
        if rv not in (None, "", "0") and emulator.faults.gone_for(req.kind.plural):
            early = errors.too_old(int(rv) if str(rv).isdigit() else 0)
        else:
            try:
                watcher = emulator.store.watch(
                    req.kind,
                    req.namespace,
                    labels=labels,
                    fields=fields,
                    resource_version=rv,
                    send_initial_events=send_initial,
                )
            except ApiStatusError as exc:
                if exc.code != 410:
                    raise
                early = exc
        self._record(req, 200)
        self.send_response(200)
        self.send_header("Content-Type", _JSON)
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if early is not None:
            self._chunk({"type": "ERROR", "object": early.to_status()})
            self._end_stream()
            return
        assert watcher is not None
        emulator._watch_opened(watcher)
        encoded = emulator.encoded
        # the events carry stored objects (their encodings shared with the writes' answers and
        # other watches), but an events.k8s.io/v1 watch's are views made for it
        keep = req.kind is not EVENT_V1
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + emulator.bookmark_interval
        abrupt = False

        def encode(payload: tuple[str, Obj]) -> bytes:
            type_, obj = payload
            if type_ == "BOOKMARK" and not bookmarks:
                return b""
            return _event_chunk(type_, encoded.whole(obj, keep=keep))

        def direct(payload: tuple[str, Obj]) -> bytes:
            """Send an event from the writer's thread, without blocking; what did not go."""
            data = encode(payload)
            try:
                sent = self.connection.send(data, socket.MSG_DONTWAIT) if data else 0
            except OSError:  # the buffer is full, or the client left: the watch's thread sees
                return data
            return data[sent:]

        with watcher.cond:
            watcher.direct = direct
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(left, max(0.0, next_bookmark - time.monotonic())) if bookmarks else left
                batch = watcher.take(wait)
                if batch is None:
                    if bookmarks and time.monotonic() >= next_bookmark and watcher.claim():
                        try:
                            self._chunk(
                                {
                                    "type": "BOOKMARK",
                                    "object": {
                                        "kind": req.kind.kind,
                                        "apiVersion": req.kind.api_version,
                                        "metadata": {"resourceVersion": str(emulator.store.rv)},
                                    },
                                }
                            )
                        finally:
                            watcher.idle()
                        next_bookmark = time.monotonic() + emulator.bookmark_interval
                    continue
                # what queued meanwhile goes out together, in one write
                chunks: list[bytes] = []
                closing: tuple[str, Any] | None = None
                try:
                    for tag, payload in batch:
                        if tag == "CLOSE":
                            closing = (tag, payload)
                            break
                        chunks.append(payload if tag == "RAW" else encode(payload))
                    if chunks:
                        self.wfile.write(b"".join(chunks))
                    if closing is not None:
                        if closing[1] == "DROP":
                            abrupt = True
                        elif isinstance(closing[1], ApiStatusError):
                            self._chunk({"type": "ERROR", "object": closing[1].to_status()})
                        break
                finally:
                    if closing is None:
                        watcher.idle()
        except (BrokenPipeError, ConnectionResetError, OSError):
            abrupt = True
        finally:
            watcher.end()
            emulator.store.unwatch(watcher)
            emulator._watch_closed(watcher)
        if abrupt:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._end_stream()

    def _chunk(self, event: dict[str, Any]) -> None:
        data = codec.dumps(event) + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()


def _event_chunk(type_: str, obj: bytes) -> bytes:
    """A watch event as one chunk of the stream: ``codec.dumps({"type": ..., "object": ...})``
    plus a newline, around the object's encoding (keys sorted: ``object`` before ``type``)."""
    data = b'{"object":' + obj + b',"type":"' + type_.encode() + b'"}\n'
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def warning_header(text: str) -> str:
    """An RFC 7234 ``Warning`` value as apimachinery's ``NewWarningHeader`` writes it: code
    299, agent ``-``, the text quoted with ``\\`` and ``"`` escaped."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{quoted}"'


def _json(body: bytes, *, allow_empty: bool = False) -> Any:
    if not body.strip():
        if allow_empty:
            return {}
        raise errors.bad_request("the body of the request was empty")
    try:
        return codec.loads(body)
    except ValueError as exc:
        raise errors.bad_request(
            f"the body of the request could not be decoded as JSON: {exc}"
        ) from exc


def _int_param(query: dict[str, str], name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        raise errors.bad_request(f'{name}: Invalid value: "{value}": must be an integer') from None


class EncodedObjects:
    """Each stored object's JSON as a list item, encoded once (the API server's watch cache
    keeps objects' serializations too): a list of 5,000 ResourceSlices is then joined from
    cached bytes instead of encoded afresh on every page. Stored objects are never changed in
    place (a write stores a new object), so an object's identity is its cache key; the entry
    holds the object, so the identity cannot be reused meanwhile. Bounded: cleared when full."""

    LIMIT: Final = 100_000

    def __init__(self) -> None:
        self._items: dict[int, tuple[Obj, bytes]] = {}
        self._wholes: dict[int, tuple[Obj, bytes]] = {}

    def whole(self, obj: Obj, *, keep: bool = True) -> bytes:
        """``obj``'s JSON as a get, a write's answer or a watch event carries it (with its
        kind and apiVersion): a write answers the object its watch events then carry to every
        watcher, encoded once for all (``keep``: ``obj`` is stored, never changed)."""
        found = self._wholes.get(id(obj))
        if found is not None and found[0] is obj:
            return found[1]
        data = codec.dumps(obj)
        if keep:
            if len(self._wholes) >= self.LIMIT:
                self._wholes.clear()
            self._wholes[id(obj)] = (obj, data)
        return data

    def item(self, obj: Obj, *, keep: bool = True) -> bytes:
        """``obj``'s JSON as a list item (without its kind and apiVersion): cut out of its
        :meth:`whole` encoding where one is kept (keys are sorted, so a stored object's begins
        with exactly its apiVersion and kind), else encoded."""
        found = self._items.get(id(obj))
        if found is not None and found[0] is obj:
            return found[1]
        whole = self._wholes.get(id(obj))
        data = _without_type(whole[1], obj) if whole is not None and whole[0] is obj else None
        if data is None:
            data = codec.dumps({k: v for k, v in obj.items() if k not in {"kind", "apiVersion"}})
        if not keep:
            return data
        if len(self._items) >= self.LIMIT:
            self._items.clear()
        self._items[id(obj)] = (obj, data)
        return data

    def list_bytes(self, head: dict[str, Any], items: Iterable[Obj], *, keep: bool) -> bytes:
        """``head`` (a list body with no items) with ``items`` in it, as JSON; ``keep``: the
        items are stored objects (their encodings are kept)."""
        encoded = json.dumps(head, separators=_COMPACT).encode()
        assert encoded.endswith(b'"items":[]}'), encoded
        return encoded[:-2] + b",".join(self.item(o, keep=keep) for o in items) + b"]}"


def _without_type(whole: bytes, obj: Obj) -> bytes | None:
    """``whole`` (``codec.dumps(obj)``) without its leading ``apiVersion`` and ``kind``
    members: the bytes ``codec.dumps`` gives for ``obj`` without them; None when ``whole``
    does not begin with exactly those two (a key that sorts before them, a value that is not
    a plain string)."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if type(api_version) is not str or type(kind) is not str:
        return None
    head = codec.dumps({"apiVersion": api_version, "kind": kind})[:-1]  # without its "}"
    if not whole.startswith(head):
        return None
    rest = whole[len(head) :]
    if rest == b"}":
        return b"{}"
    return b"{" + rest[1:] if rest[:1] == b"," else None


def _list_body(kind: Kind, rv: int, token: str | None, remaining: int | None) -> dict[str, Any]:
    """A list answer without its items (:meth:`EncodedObjects.list_bytes` adds them)."""
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if token:
        meta["continue"] = token
    if remaining is not None:
        meta["remainingItemCount"] = remaining
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": meta,
        "items": [],
    }


class Emulator:
    """An in-process Kubernetes API server for tests. Use as a context manager or start/stop.

    Hooks (no HTTP): :meth:`create`, :meth:`get`, :meth:`list`, :meth:`update_status`,
    :meth:`patch`, :meth:`delete`, :meth:`wait_until`, :meth:`wait_for`; request log in
    :attr:`requests`; faults via :meth:`fail_next`, :meth:`fail_next_write`,
    :meth:`add_latency`, :meth:`hold_next`, :meth:`expire_next_watch`, :meth:`drop_watches`,
    :meth:`compact`.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        schema_version: str = DEFAULT_SCHEMA_VERSION,
        history_size: int = 10_000,
        bookmark_interval: float = 1.0,
        node_identity: str | None = None,
        pod_graceful_deletion: bool = True,
        require_namespaces: bool = True,
        validators: SchemaValidators | None = None,
        field_validation: str = "Strict",
    ) -> None:
        self.schema_version = schema_version
        self.validators = validators or _shared_validators(schema_version)
        self.store = Store(
            self.validators,
            history_size=history_size,
            pod_graceful_deletion=pod_graceful_deletion,
            require_namespaces=require_namespaces,
        )
        self.bookmark_interval = bookmark_interval
        self.node_identity = node_identity
        #: used when a request names no ``fieldValidation``; a real server's default is "Warn"
        self.field_validation = field_validation
        self.faults = Faults()
        #: what TokenReview and SubjectAccessReview answer from (tests register tokens, grants)
        self.reviews = Reviews()
        self.requests: list[RequestRecord] = []
        #: ``fn(user_agent, verb, resource)`` for every write request, called under the store
        #: lock right before the write is applied (see :meth:`observe_writes`)
        self.write_observers: list[Callable[[str, str, str], None]] = []
        self.internal_errors: list[BaseException] = []
        self.encoded = EncodedObjects()
        self._requested_port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._open_watches: set[Watcher] = set()
        self._watch_lock = threading.Condition()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Emulator:
        if self._server is not None:
            return self
        self._server = _Server(("127.0.0.1", self._requested_port), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"emulator:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """End every open watch, stop serving and close every connection."""
        server, self._server = self._server, None
        if server is None:
            return
        self.store.close_watchers()
        with self._watch_lock:
            self._watch_lock.wait_for(lambda: not self._open_watches, timeout=2.0)
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        deadline = time.monotonic() + 2.0
        while server.connections and time.monotonic() < deadline:
            time.sleep(0.01)

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the emulator is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(
        self, path: str | Path, *, namespace: str = "default", token: str | None = None
    ) -> Path:
        """Write a kubeconfig pointing at this emulator (``token`` e.g. ``system:node:n1``)."""
        return write_kubeconfig(path, self.url, namespace=namespace, token=token)

    def client_configuration(self) -> Any:
        """A ``kubernetes.client.Configuration`` for this emulator."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return config

    # ------------------------------------------------------------------ request log
    def _log(self, record: RequestRecord) -> None:
        self.requests.append(record)

    def requests_for(
        self, *, method: str | None = None, resource: str | None = None, verb: str | None = None
    ) -> list[RequestRecord]:
        return [
            r
            for r in list(self.requests)
            if (method is None or r.method == method)
            and (verb is None or r.verb == verb)
            and (resource is None or r.resource == resource or r.resource.split("/")[0] == resource)
        ]

    def clear_requests(self) -> None:
        self.requests.clear()

    def observe_writes(self, observer: Callable[[str, str, str], None]) -> None:
        """Call ``observer(user_agent, verb, resource)`` for every write request (create,
        update, patch, delete, deletecollection, pod binding) that passed fault injection,
        under the store lock and right before the write is applied, so it sees exactly the
        state the write lands on (e.g. who holds a Lease at that instant). It must not block
        and must not write through HTTP."""
        self.write_observers.append(observer)

    # ------------------------------------------------------------------ faults
    def fail_next(
        self,
        status: int = 500,
        *,
        verbs: str | set[str] | None = None,
        resource: str | None = None,
        count: int = 1,
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests with an error Status."""
        self.faults.add_error(
            status, verbs=verbs, resource=resource, count=count, reason=reason, message=message
        )

    def fail_next_write(
        self,
        status: int = 409,
        *,
        resource: str | None = None,
        verb: str | None = None,
        count: int = 1,
    ) -> None:
        """The next write (create/update/patch/delete, or only ``verb``) answers ``status``;
        a 409 is a Conflict with the real "object has been modified" message."""
        message = None
        reason = None
        if status == 409:
            reason = "Conflict"
            message = f"Operation cannot be fulfilled on {resource or 'object'}: {errors.STALE}"
        self.faults.add_error(
            status,
            verbs=verb or "write",
            resource=resource,
            count=count,
            reason=reason,
            message=message,
        )

    def add_latency(
        self,
        seconds: float,
        *,
        verbs: str | set[str] | None = None,
        resource: str | None = None,
        count: int | None = None,
    ) -> None:
        """Delay matching requests by ``seconds`` (every one, or the next ``count``)."""
        self.faults.add_latency(seconds, verbs=verbs, resource=resource, count=count or 10**12)

    def pending_faults(self) -> list[FaultRule]:
        """The fault rules not used up yet (what was injected but did not fire)."""
        return self.faults.pending()

    def hold_next(
        self,
        *,
        verbs: str | set[str] | None = None,
        resource: str | None = None,
        timeout: float = 60.0,
    ) -> Hold:
        """Keep the next matching request waiting, before it is served, until the returned
        :class:`~tests.emulator.faults.Hold` is released (or ``timeout`` passes)."""
        return self.faults.add_hold(verbs=verbs, resource=resource, timeout=timeout)

    def expire_next_watch(self, *, resource: str | None = None, count: int = 1) -> None:
        """The next watch that asks for a resourceVersion gets an ERROR 410 Expired event."""
        self.faults.add_gone(resource=resource, count=count)

    def drop_watches(
        self, kind: str | Kind | None = None, *, clean: bool = False, expire: bool = False
    ) -> int:
        """End open watches: abruptly (connection closed mid-stream), cleanly (stream end),
        or with an ERROR 410 event (``expire=True``). Returns how many were ended."""
        payload: Any = "DROP"
        if clean:
            payload = None
        if expire:
            payload = errors.too_old(self.store.rv)
        kinds = [lookup(kind)] if kind is not None else None
        return self.store.close_watchers(payload, kinds)

    def compact(self) -> None:
        """Forget the watch history: watches and continue tokens from older RVs get 410."""
        self.store.compact()

    def _watch_opened(self, watcher: Watcher) -> None:
        with self._watch_lock:
            self._open_watches.add(watcher)
            self._watch_lock.notify_all()

    def _watch_closed(self, watcher: Watcher) -> None:
        with self._watch_lock:
            self._open_watches.discard(watcher)
            self._watch_lock.notify_all()

    def open_watches(self, kind: str | Kind | None = None) -> int:
        with self._watch_lock:
            return sum(
                1 for w in self._open_watches if kind is None or w.kind.key == lookup(kind).key
            )

    def wait_for_watches(
        self, count: int = 1, *, kind: str | Kind | None = None, timeout: float = 5.0
    ) -> None:
        """Block until at least ``count`` watches (of ``kind``) are open."""
        with self._watch_lock:
            if not self._watch_lock.wait_for(
                lambda: self.open_watches(kind) >= count, timeout=timeout
            ):
                raise TimeoutError(f"{self.open_watches(kind)} watches open, wanted {count}")

    # ------------------------------------------------------------------ state hooks
    def create(self, obj: Obj, *, namespace: str | None = None) -> Obj:
        """Create ``obj`` (kind taken from ``obj['kind']``) through the full write path."""
        kind = self._kind_of(obj)
        ns = namespace or (obj.get("metadata") or {}).get("namespace") if kind.namespaced else None
        return codec.copy(
            self.store.create(kind, ns or ("default" if kind.namespaced else None), obj)
        )

    def seed(self, objects: Iterable[Obj]) -> list[Obj]:
        return [self.create(obj) for obj in objects]

    def create_stored(self, obj: Obj) -> Obj:
        """Create ``obj`` as if an older API server had stored it: its CEL selectors are not
        checked again (see :func:`tests.emulator.validation.stored_expressions`)."""
        with stored_expressions():
            return self.create(obj)

    def inject(self, obj: Obj) -> Obj:
        """Store ``obj`` unvalidated (kind from ``obj['kind']``; see ``Store.inject``)."""
        kind = self._kind_of(obj)
        namespace = (obj.get("metadata") or {}).get("namespace") or "default"
        return codec.copy(self.store.inject(kind, namespace if kind.namespaced else None, obj))

    def get(self, kind: str | Kind, name: str, namespace: str | None = None) -> Obj | None:
        k = lookup(kind)
        found = self.store.try_get(k, (namespace or "default") if k.namespaced else None, name)
        return codec.copy(found) if found is not None else None

    def list(self, kind: str | Kind, namespace: str | None = None) -> list[Obj]:
        """Deep copies of every stored object of ``kind`` (in ``namespace`` if given)."""
        return codec.copy(self.store.all(lookup(kind), namespace))

    def replace(self, obj: Obj, *, subresource: str | None = None) -> Obj:
        kind = self._kind_of(obj)
        meta = obj.get("metadata") or {}
        return codec.copy(
            self.store.replace(
                kind, meta.get("namespace"), str(meta.get("name")), obj, subresource=subresource
            )
        )

    def update_status(
        self, kind: str | Kind, name: str, status: dict[str, Any], namespace: str | None = None
    ) -> Obj:
        """Replace ``status`` unconditionally (as a ``/status`` PUT without resourceVersion)."""
        k = lookup(kind)
        current = self.store.get(k, namespace, name)
        body = {**current, "status": status, "metadata": {**current["metadata"]}}
        body["metadata"].pop("resourceVersion", None)
        return codec.copy(self.store.replace(k, namespace, name, body, subresource="status"))

    def patch(
        self,
        kind: str | Kind,
        name: str,
        patch: dict[str, Any] | builtins.list[Any],
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        content_type: str | None = None,
    ) -> Obj:
        k = lookup(kind)
        ctype = content_type or (
            "application/json-patch+json"
            if isinstance(patch, list)
            else "application/merge-patch+json"
        )
        return codec.copy(
            self.store.patch(
                k, namespace, name, ctype, json.dumps(patch).encode(), subresource=subresource
            )
        )

    def delete(
        self,
        kind: str | Kind,
        name: str,
        namespace: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> Obj:
        return codec.copy(self.store.delete(lookup(kind), namespace, name, options))

    def bind(self, pod: str, node: str, namespace: str = "default") -> None:
        self.store.bind(
            namespace, pod, {"metadata": {"name": pod}, "target": {"kind": "Node", "name": node}}
        )

    def finish_pod_deletions(self, node: str | None = None) -> int:
        """Play the kubelet for pods in graceful deletion: remove them now."""
        return self.store.finish_pod_deletions(node)

    @property
    def resource_version(self) -> int:
        return self.store.rv

    def wait_until(
        self, predicate: Callable[[], bool], timeout: float = 5.0, *, message: str = ""
    ) -> None:
        """Block until ``predicate()`` is true (re-checked after every change).

        Raises TimeoutError when it is still false after ``timeout`` seconds."""
        if not self.store.wait(predicate, timeout):
            raise TimeoutError(message or f"condition not met within {timeout}s")

    def wait_for(
        self,
        kind: str | Kind,
        name: str,
        predicate: Callable[[Obj], bool] | None = None,
        *,
        namespace: str | None = None,
        timeout: float = 5.0,
    ) -> Obj:
        """Wait until the object exists (and satisfies ``predicate``); returns it."""
        found: builtins.list[Obj] = []

        def check() -> bool:
            obj = self.get(kind, name, namespace)
            if obj is not None and (predicate is None or predicate(obj)):
                found.append(obj)
                return True
            return False

        self.wait_until(
            check,
            timeout,
            message=f"{kind} {namespace or ''}/{name} not as expected within {timeout}s",
        )
        return found[-1]

    def wait_for_deletion(
        self, kind: str | Kind, name: str, *, namespace: str | None = None, timeout: float = 5.0
    ) -> None:
        self.wait_until(
            lambda: self.get(kind, name, namespace) is None,
            timeout,
            message=f"{kind} {namespace or ''}/{name} still exists after {timeout}s",
        )

    @staticmethod
    def _kind_of(obj: Obj) -> Kind:
        api_version, kind_name = obj.get("apiVersion"), obj.get("kind")
        for kind in ALL_KINDS:
            if kind.kind == kind_name and kind.api_version == api_version:
                return kind
        raise KeyError(f"the emulator does not serve {api_version}/{kind_name}")


_VALIDATORS: dict[str, SchemaValidators] = {}
_VALIDATORS_LOCK = threading.Lock()


def _shared_validators(version: str) -> SchemaValidators:
    """Validators are immutable once built: share them across emulator instances."""
    with _VALIDATORS_LOCK:
        if version not in _VALIDATORS:
            _VALIDATORS[version] = SchemaValidators(version)
        return _VALIDATORS[version]


def write_kubeconfig(
    path: str | Path, server: str, *, namespace: str = "default", token: str | None = None
) -> Path:
    user: dict[str, Any] = {"token": token} if token else {}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "emulator", "user": user}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
    }
    target = Path(path)
    target.write_text(json.dumps(config, indent=2) + "\n")
    return target


__all__ = ["NAMESPACE", "Emulator", "write_kubeconfig"]

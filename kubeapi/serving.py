"""The HTTP endpoints of a long-running component (``/metrics``, ``/healthz``, ``/readyz``,
``/livez``), served **off its event loop** and, where asked, **behind delegated
authentication and authorization** as kube-scheduler serves them (component-base's secure
serving with ``--authentication-kubeconfig`` / ``--authorization-kubeconfig``).

* :class:`Board`: the probe answers, published by the loop and read by the server thread.
  The loop calls :meth:`Board.publish` when something changes; a request only reads the last
  published :class:`Probe` (one attribute read under a lock), never the loop's own state.
* :class:`EndpointServer`: the standard library's ``ThreadingHTTPServer`` in a thread of its
  own (and one per connection), optionally over TLS (a serving certificate and key the
  operator provides). Nothing it does runs on the event loop, so a scrape flood costs the
  scheduler CPU time only, never a turn of its loop. The probes (``/healthz``, ``/livez``,
  ``/readyz``) are always allowed, as kube-scheduler's ``--authorization-always-allow-paths``
  (the kubelet's probes carry no credentials); ``/metrics`` is rendered by the caller's
  ``render`` function from registries that are themselves thread-safe, at most once per
  :data:`RENDER_TTL_S` (a flood of scrapes shares one rendering).
* POST endpoints (``post``: path -> handler), each answered in the connection's thread: the
  controller's admission webhook (``/mutate-pods``, :mod:`controller.webhook`). A body over
  :data:`MAX_POST_BODY` is 413 unread, one without ``Content-Length`` 411.
* :class:`DelegatedAuth`: ``/metrics`` only for a caller whose bearer token the API server
  authenticates (a ``TokenReview``) and who may ``get`` the non-resource URL ``/metrics`` (a
  ``SubjectAccessReview``): no token is 401, a token the API server does not accept is 401, a
  user it does not authorize is 403. Verdicts are cached for 10 s, kube-apiserver's webhook
  defaults (``--authentication-token-webhook-cache-ttl``,
  ``--authorization-webhook-cache-authorized-ttl`` / ``-unauthorized-ttl``), so a flood of
  scrapes with one token costs the API server one review pair per 10 s. The reviews are plain
  blocking HTTP calls from the server thread (the component's own API identity, read from its
  :class:`~kubeapi.endpoint.Endpoint`): they never wait for, or load, the event loop. A review
  that fails (the API server unreachable) is a 500 for that request and is not cached.

Contract: :meth:`EndpointServer.start` raises :class:`~driver.api.errors.ConfigError` when the
address cannot be bound or the certificate cannot be loaded; :meth:`EndpointServer.close`
stops accepting, ends the open connections (kept-alive clients included) and the thread, and
returns once it has.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from driver.api.errors import ConfigError
from kubeapi.endpoint import Endpoint

log = logging.getLogger(f"biaxial.{__name__}")

#: The probe paths, served to anyone (kube-scheduler's always-allow paths).
PROBE_PATHS: Final = frozenset({"/healthz", "/livez", "/readyz"})
METRICS_PATH: Final = "/metrics"
#: kube-apiserver's webhook authentication and authorization cache TTLs.
VERDICT_TTL_S: Final = 10.0
REVIEW_TIMEOUT_S: Final = 5.0
#: how long one rendering of /metrics answers scrapes (far below any scrape interval)
RENDER_TTL_S: Final = 1.0
_MAX_CACHED: Final = 1024
#: what the kernel allows a listen queue (:func:`listen_backlog`)
SOMAXCONN_FILE: Final = Path("/proc/sys/net/core/somaxconn")
#: the largest POST body read (the API server's own request limit is 3 MiB)
MAX_POST_BODY: Final = 3 * 1024 * 1024 + 64 * 1024
#: a POST endpoint: the request body in; status, body and content type out. It runs in the
#: connection's thread and must not raise.
PostHandler = Callable[[bytes], tuple[int, bytes, str]]
_TEXT: Final = "text/plain; charset=utf-8"


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP or ``localhost``) only reaches this host."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------------- probes


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe's answer: 200 with ``detail`` (the body, as is) when ``ok``, 503 (or 500)
    with it otherwise."""

    ok: bool
    detail: str = "ok\n"
    status_when_failing: int = 503


class Board:
    """Probe answers by path, written by the event loop and read by the server thread."""

    def __init__(self, initial: Mapping[str, Probe] | None = None) -> None:
        self._lock = threading.Lock()
        self._probes: dict[str, Probe] = dict(initial or {})

    def publish(self, path: str, probe: Probe) -> None:
        with self._lock:
            self._probes[path] = probe

    def read(self, path: str) -> Probe | None:
        with self._lock:
            return self._probes.get(path)


# ---------------------------------------------------------------------- delegated auth


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the server answers a request for ``/metrics``: 200, 401, 403 or 500."""

    status: int
    reason: str = ""


class DelegatedAuth:
    """TokenReview + SubjectAccessReview against the API server, cached (see the module
    docstring). Thread-safe; blocking: call it from the server thread, never the loop."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        ttl_s: float = VERDICT_TTL_S,
        timeout_s: float = REVIEW_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._endpoint = endpoint
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, Verdict]] = {}
        self.reviews = 0  # review requests sent (tests and the bench read it)

    def check(self, authorization: str | None, path: str, verb: str = "get") -> Verdict:
        """The verdict for a request carrying ``authorization`` (its header) on ``path``."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Verdict(401, "no bearer token")
        key = (hashlib.sha256(token.strip().encode()).hexdigest(), f"{verb} {path}")
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            verdict = self._review(token.strip(), path, verb)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("delegated authentication of a %s request failed: %s", path, exc)
            return Verdict(500, "the API server could not review the request")
        with self._lock:
            if len(self._cache) >= _MAX_CACHED:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) >= _MAX_CACHED:
                    self._cache.clear()
            self._cache[key] = (now + self._ttl_s, verdict)
        return verdict

    def _review(self, token: str, path: str, verb: str) -> Verdict:
        review = self._post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Verdict(401, "the token was not accepted")
        user = status.get("user") or {}
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = self._post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
        )
        if (access.get("status") or {}).get("allowed"):
            return Verdict(200)
        name = str(spec["user"])[:64]
        return Verdict(403, f'forbidden: User "{name}" cannot {verb} path "{path}"')

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.reviews += 1
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        headers.update(self._endpoint.headers)
        if self._endpoint.token_file is not None:
            token = self._endpoint.token_file.read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(  # noqa: S310 - the API server's own https URL
            self._endpoint.host + path, data=json.dumps(body).encode(), headers=headers
        )
        with urllib.request.urlopen(  # noqa: S310
            request, timeout=self._timeout_s, context=self._endpoint.ssl_context
        ) as response:
            answer = json.loads(response.read())
        if not isinstance(answer, dict):
            raise TypeError(f"{path} answered {type(answer).__name__}, not an object")
        return answer


# ---------------------------------------------------------------------- the server


def listen_backlog() -> int:
    """The listen queue a server asks for: the kernel's ``net.core.somaxconn`` (at most
    65,535), as Go's net package asks for it (kube-apiserver and kube-scheduler listen so),
    else ``socket.SOMAXCONN``. The standard library's servers ask for 5: a burst of
    connections past that (an API server calling the admission webhook for many pods at once,
    a controller's informers starting together) overflows the queue, the kernel drops their
    SYNs, and each client waits a second, then three, then seven, before it is heard."""
    try:
        return max(1, min(int(SOMAXCONN_FILE.read_text(encoding="ascii")), 65_535))
    except (OSError, ValueError):
        return socket.SOMAXCONN


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(  # noqa: PLR0917 - one private call site
        self,
        address: tuple[str, int],
        board: Board,
        render: Callable[[], bytes] | None,
        auth: DelegatedAuth | None,
        tls: ssl.SSLContext | None,
        post: Mapping[str, PostHandler],
    ) -> None:
        self.request_queue_size = listen_backlog()
        super().__init__(address, _Handler)
        self.board = board
        self.render = render
        self.auth = auth
        self.tls = tls
        self.post = post
        self.handler_threads: set[str] = set()  # names of the threads that served (tests)
        self.connections: set[Any] = set()  # open connections, ended by close()
        self._connections_lock = threading.Lock()
        self._body_lock = threading.Lock()
        self._body: tuple[float, bytes] | None = None

    def metrics_body(self) -> bytes:
        """The rendered metrics, at most :data:`RENDER_TTL_S` old: a flood of scrapes costs
        one rendering per interval, not one per request."""
        assert self.render is not None
        with self._body_lock:
            now = time.monotonic()
            if self._body is None or self._body[0] <= now:
                self._body = (now + RENDER_TTL_S, self.render())
            return self._body[1]

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        if self.tls is not None:
            # The handshake happens in the connection's own thread, on its first read.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        with self._connections_lock:
            self.connections.add(sock)
        return sock, address

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def end_connections(self) -> None:
        """End every open connection (a kept-alive client would otherwise still be served
        by its connection's thread after the listener closed)."""
        with self._connections_lock:
            open_now = list(self.connections)
            self.connections.clear()
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # (a client that hung up, a failed TLS handshake: that connection's business only)
        log.debug("endpoint connection from %s failed: %s", client_address, sys.exc_info()[1])


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that sends nothing does not hold its thread forever

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return

    def do_GET(self) -> None:
        server = self.server
        server.handler_threads.add(threading.current_thread().name)
        path = self.path.split("?", 1)[0]
        if path in PROBE_PATHS:
            probe = server.board.read("/healthz" if path == "/livez" else path)
            if probe is None:
                self._answer(404, "not served here\n")
            else:
                self._answer(200 if probe.ok else probe.status_when_failing, probe.detail)
            return
        if path != METRICS_PATH or server.render is None:
            self._answer(404, "404 page not found\n")
            return
        if server.auth is not None:
            verdict = server.auth.check(self.headers.get("Authorization"), path)
            if verdict.status != 200:
                self._answer(verdict.status, verdict.reason + "\n")
                return
        self._answer(200, server.metrics_body(), "text/plain; version=0.0.4; charset=utf-8")

    def do_POST(self) -> None:
        server = self.server
        server.handler_threads.add(threading.current_thread().name)
        handler = server.post.get(self.path.split("?", 1)[0])
        if handler is None:
            self._answer(404, "404 page not found\n")
            return
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._answer(411, "a POST needs a Content-Length\n")
            self.close_connection = True
            return
        if not 0 <= length <= MAX_POST_BODY:
            self._answer(413, f"the body must be at most {MAX_POST_BODY} bytes\n")
            self.close_connection = True
            return
        status, body, content_type = handler(self.rfile.read(length))
        self._answer(status, body, content_type)

    def _answer(self, status: int, body: str | bytes, content_type: str = _TEXT) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="biaxial"')
        self.end_headers()
        self.wfile.write(data)


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server-side TLS context from a serving certificate and key (PEM files)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--tls-cert-file / --tls-private-key-file: {exc}") from exc
    return ctx


def reloading_tls_context(cert_file: str, key_file: str, flag: str) -> ssl.SSLContext:
    """:func:`tls_context` that picks up a renewed certificate (cert-manager, a Secret volume
    updated in place): each handshake stats both files and, when either changed, serves the
    new pair from then on (an unreadable new pair is logged and the old one kept).
    ``ConfigError`` (naming ``flag``) when the first pair cannot be loaded."""
    try:
        base = tls_context(cert_file, key_file)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc
    lock = threading.Lock()
    state: dict[str, Any] = {"stamp": _stamp(cert_file, key_file), "context": base}

    def on_hello(sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: Any) -> None:
        stamp = _stamp(cert_file, key_file)
        with lock:
            if stamp != state["stamp"]:
                state["stamp"] = stamp
                try:
                    state["context"] = tls_context(cert_file, key_file)
                    log.info("%s: reloaded the serving certificate", flag)
                except ConfigError as exc:
                    log.warning("%s: keeping the previous certificate: %s", flag, exc)
            context = state["context"]
        if context is not base:
            sock.context = context

    base.sni_callback = on_hello
    return base


def _stamp(*paths: str) -> tuple[int, ...]:
    out = []
    for path in paths:
        try:
            out.append(os.stat(path).st_mtime_ns)  # noqa: PTH116
        except OSError:
            out.append(-1)
    return tuple(out)


class EndpointServer:
    """One listener in a thread of its own (see the module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        board: Board,
        *,
        render: Callable[[], bytes] | None = None,
        auth: DelegatedAuth | None = None,
        tls: ssl.SSLContext | None = None,
        post: Mapping[str, PostHandler] | None = None,
        name: str = "endpoints",
        flag: str = "--metrics-port",
    ) -> None:
        self._address = (host, port)
        self._args = (board, render, auth, tls, dict(post or {}))
        self._name = name
        self._flag = flag
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one the system chose for 0)."""
        return int(self._server.server_address[1]) if self._server else self._address[1]

    @property
    def handler_threads(self) -> frozenset[str]:
        return frozenset(self._server.handler_threads) if self._server else frozenset()

    def start(self) -> EndpointServer:
        host, port = self._address
        try:
            self._server = _Server(self._address, *self._args)
        except OSError as exc:
            raise ConfigError(
                f"{self._flag} {port}: cannot listen on {host}:{port}: {exc}"
            ) from exc
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"{self._name}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        server.shutdown()
        server.server_close()
        server.end_connections()
        thread.join()

"""HTTP/1.1 requests over kept-alive connections: the client's request path, without ``aiohttp``.

Decision: on the controller's hot path every pod costs about four requests, and ``aiohttp``
spent ~0.5 ms of CPU on each (its request and response objects, header multidicts, URL
parsing, timers, tracing hooks): as much as the scheduling decision itself. An API request
needs none of that: a request line, a few fixed headers, a body, and an answer read to its
end. :class:`Pool` does exactly that on asyncio protocols, and keeps the connections open for
the next request (at most ``limit`` at once, as the ``aiohttp`` connector did). Watches stay on
``aiohttp`` (:meth:`kubeapi.client.Client.watch`): a few long streams, where the per-request
cost does not matter.

Contracts:

* :meth:`Pool.request` sends one request and returns ``(status, body)`` once the whole answer
  is read (``Content-Length``, chunked, or up to the server's close); the connection goes back
  to the pool unless the server or the answer says ``close`` or the request failed;
* any transport failure (refused, reset, closed mid-answer, malformed answer) raises
  :class:`TransportError`; the deadline raises ``TimeoutError``; the caller maps both (the
  client makes them retryable ``ServerError``). A read (GET) that fails on a connection
  reused from the pool before any byte of the answer came (the server closed it while it was
  idle) is sent once more on a new connection; a write never is (it may have landed);
* ``https`` uses the given TLS context (none: not verified, as ``aiohttp`` with ``ssl=False``);
  a path in the server URL prefixes every request path (an API server behind a proxy path);
* no compression is asked for (no ``Accept-Encoding``), so none is answered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Final

#: Answers larger than this are refused (the API server's own limit on a list page is far
#: below; a runaway stream must not take the process's memory).
MAX_BODY: Final = 1 << 31
_MAX_HEAD: Final = 1 << 20
_READS: Final = frozenset({"GET", "HEAD"})


#: Fields an answer's head often has, spelled as the API server (and the emulator) writes
#: them, that :meth:`_Connection._head` need not read: a set lookup instead of stripping and
#: lowercasing each name (four of an answer's five fields).
_OTHER_FIELDS: Final = frozenset(
    {
        b"Audit-Id",
        b"Cache-Control",
        b"Content-Type",
        b"Date",
        b"Server",
        b"Warning",
        b"X-Kubernetes-Pf-Flowschema-Uid",
        b"X-Kubernetes-Pf-Prioritylevel-Uid",
    }
)


class TransportError(Exception):
    """The request failed below HTTP: no complete answer came."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, its answer parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False  # the last answer left the connection open for another
        self.received = False  # a byte of the current answer came
        self._buffer = bytearray()
        self._answer: asyncio.Future[tuple[int, bytes]] | None = None
        self._head_only = False
        self._status = 0
        self._length: int | None = -1  # -1: head not read yet; None: up to close; else bytes
        self._chunked = False
        self._keep_alive = True
        self._body = bytearray()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        answer = self._answer
        if answer is None or answer.done():
            return
        if self._length is None and self._status:  # the answer runs up to the close
            self._finish(bytes(self._buffer))
            return
        answer.set_exception(TransportError(f"connection closed mid-answer ({exc or 'EOF'})"))

    def eof_received(self) -> bool | None:
        return False  # close our side too: connection_lost decides

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.done():
            self._fail_transport()  # nothing asked for: the connection is out of step
            return
        self.received = True
        try:
            if self._length == -1 and not self._buffer and self._whole(data):
                return
            self._buffer += data
            self._parse()
        except TransportError as exc:
            answer.set_exception(exc)
            self._fail_transport()

    # the request
    def send(self, data: bytes, head_only: bool) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._head_only = head_only
        self._status, self._length, self._chunked, self._keep_alive = 0, -1, False, True
        self.received = self.reusable = False
        if self._buffer:
            self._buffer = bytearray()
        if self._body:
            self._body = bytearray()
        self.transport.write(data)
        return self._answer

    def abort(self) -> None:
        self.reusable = False
        self._fail_transport()

    def _fail_transport(self) -> None:
        self.closed = True
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def _finish(self, body: bytes) -> None:
        # The buffers go with the answer: an idle connection holds no copy of a list page
        # (nor does its answer's future, which would keep the body until the next request).
        self._buffer = bytearray()
        self._body = bytearray()
        answer, self._answer = self._answer, None
        self.reusable = self._keep_alive and not self.closed
        if answer is not None and not answer.done():
            answer.set_result((self._status, body))

    def _whole(self, data: bytes) -> bool:
        """Finish the answer when ``data``, the first bytes of it, is all of it: the head and
        a body of its ``Content-Length`` (most answers arrive so). False, with nothing read,
        otherwise: :meth:`_parse` reads ``data`` then. Spares the buffer's copies of the
        answer (about a tenth of an answer's CPU)."""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return False
        self._head(data[:end])
        length = self._length
        if (
            self._chunked
            or length is None
            or self._head_only
            or self._status in (204, 304)
            or 100 <= self._status < 200
            or len(data) != end + 4 + length
        ):
            # Not that simple: read from the start again (the head sets what it reads).
            self._status, self._length, self._chunked, self._keep_alive = 0, -1, False, True
            return False
        self._finish(data[end + 4 :])
        return True

    def _parse(self) -> None:
        buffer = self._buffer
        if self._length == -1:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD:
                    raise TransportError("answer head too large")
                return
            self._head(bytes(buffer[:end]))
            del buffer[: end + 4]
            if self._head_only or self._status in (204, 304) or 100 <= self._status < 200:
                if 100 <= self._status < 200:
                    raise TransportError(f"unexpected informational answer {self._status}")
                self._finish(b"")
                return
        if self._chunked:
            self._parse_chunks()
        elif self._length is None:
            if len(buffer) > MAX_BODY:
                raise TransportError("answer too large")
        elif len(buffer) >= self._length:
            if len(buffer) > self._length:
                raise TransportError("more bytes than the answer's Content-Length")
            self._finish(bytes(buffer))

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise TransportError(f"malformed status line {lines[0][:80]!r}")
        self._status = int(parts[1])
        self._keep_alive = parts[0] != b"HTTP/1.0"
        length: int | None = None
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise TransportError(f"malformed header {line[:80]!r}")
            if name in _OTHER_FIELDS:
                continue  # a field that does not frame the answer, as servers spell it
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit() or int(value) > MAX_BODY:
                    raise TransportError(f"bad Content-Length {value[:40]!r}")
                length = int(value)
            elif name == b"transfer-encoding":
                self._chunked = value.lower().endswith(b"chunked")
            elif name == b"connection":
                tokens = value.lower()
                if b"close" in tokens:
                    self._keep_alive = False
                elif b"keep-alive" in tokens:
                    self._keep_alive = True
        if self._chunked:
            length = 0
        elif length is None:
            self._keep_alive = False  # the body runs up to the close
        self._length = length

    def _parse_chunks(self) -> None:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD:
                    raise TransportError("malformed chunk")
                return
            size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise TransportError(f"malformed chunk size {size_text[:20]!r}") from exc
            if size == 0:
                # The last chunk, then trailers up to an empty line.
                trailers = buffer.find(b"\r\n\r\n", end)
                if trailers < 0:
                    return
                del buffer[: trailers + 4]
                self._finish(bytes(self._body))
                return
            if len(buffer) < end + 2 + size + 2:
                return
            start = end + 2
            if buffer[start + size : start + size + 2] != b"\r\n":
                raise TransportError("malformed chunk end")
            self._body += buffer[start : start + size]
            if len(self._body) > MAX_BODY:
                raise TransportError("answer too large")
            del buffer[: start + size + 2]


class _Slots:
    """At most ``limit`` holders at once, first come first served: ``asyncio.Semaphore``
    without its cost per acquire on Python 3.11, where every ``acquire`` scans the whole
    list of waiters (``locked()``): with writes queued for a connection that scan was 1.8 %
    of the controller's CPU per bound pod. A slot given up while others wait is handed to
    the first of them directly; a waiter cancelled after it was handed one passes it on."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take_now(self) -> bool:
        """Take a free slot at once if there is one (free slots only while nobody waits:
        :meth:`release` hands them over). Not a coroutine: most requests find one."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> None:
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot, then cancelled: the next one takes it
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class Pool:
    """Kept-alive connections to one server (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        ssl_context: ssl.SSLContext | None,
        limit: int,
    ) -> None:
        split = urllib.parse.urlsplit(base_url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = split.hostname
        self._port = split.port or (443 if split.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = None
        if split.scheme == "https":
            self._ssl = ssl_context if ssl_context is not None else _unverified()
        self.prefix = split.path.rstrip("/")
        netloc = split.netloc.rpartition("@")[2]  # never credentials in a Host header
        fixed = {"Host": netloc, **headers}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: collections.deque[_Connection] = collections.deque()
        self._slots = _Slots(limit)
        self._open: set[_Connection] = set()

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
    ) -> tuple[int, bytes]:
        """``(status, body)`` of one request; ``target`` is the path and query (see the module
        docstring for failures). The caller bounds the time."""
        head = f"{method} {self.prefix}{target} HTTP/1.1\r\n{self._fixed}"
        if headers:
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if body is not None:
            head += f"Content-Length: {len(body)}\r\n\r\n"
            data = head.encode("latin-1") + body
        else:
            data = (head + "\r\n").encode("latin-1")
        if not self._slots.take_now():
            await self._slots.acquire()
        try:
            while True:
                conn = self._idle_connection()
                reused = conn is not None
                if conn is None:
                    conn = await self._connect()
                try:
                    answer = conn.send(data, head_only=method == "HEAD")
                    status, payload = await answer
                except TransportError:
                    self._drop(conn)
                    if not conn.closed:
                        conn.abort()  # a malformed answer: the connection is out of step
                    if reused and not conn.received and method in _READS:
                        continue  # closed by the server while idle: once more, afresh
                    raise
                except BaseException:
                    conn.abort()  # cancelled or timed out mid-answer: out of step
                    self._drop(conn)
                    raise
                if conn.reusable:
                    self._idle.append(conn)
                else:
                    self._drop(conn)
                    if not conn.closed:
                        conn.abort()
                return status, payload
        finally:
            self._slots.release()

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()  # the most recently used: least likely closed meanwhile
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
            self._drop(conn)
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                _Connection,
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._host if self._ssl is not None else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"cannot connect to {self._host}:{self._port}: {exc}") from exc
        self._open.add(conn)
        return conn

    def _drop(self, conn: _Connection) -> None:
        self._open.discard(conn)

    async def close(self) -> None:
        """Close every connection: aborted, idle ones too (a TLS connection's orderly close
        waits for the server's answer, up to half a minute, and a caller ending its loop right
        after, as ``asyncio.run`` does, would leave the socket open); the sockets close on
        the loop's next turn, which this waits for."""
        self._idle.clear()
        for conn in list(self._open):
            conn.abort()
        self._open.clear()
        await asyncio.sleep(0)


def _unverified() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx

"""kubeapi.transport against a raw local TCP server that writes exact bytes: answers framed by
Content-Length, chunked (with trailers, split anywhere) and by the server's close are read
whole; a kept-alive connection serves the next request; a connection the server closed while
idle is replaced for a read and never for a write; a malformed or truncated answer is a
TransportError; a path in the server URL prefixes every request; https verifies the server
against the given CA."""

from __future__ import annotations

import asyncio
import gc
import queue
import ssl
import threading
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeapi.transport import Pool, TransportError, _Connection, _Slots
from tests.cluster.controlplane import make_pki

#: (request head and body as received) -> the raw answer and whether to close afterwards
Answer = Callable[[bytes], tuple[list[bytes], bool]]


async def _serve(
    answer: Answer, tls: ssl.SSLContext | None = None
) -> tuple[asyncio.Server, list[bytes], list[int]]:
    """A server that answers each request on a connection with ``answer``; it records each
    request and how many connections it accepted."""
    requests: list[bytes] = []
    connections = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                requests.append(request)
                parts, close = answer(request)
                for part in parts:
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0)
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    return server, requests, connections


def _run(
    answer: Answer, scenario: Callable[[Pool, list[bytes], list[int]], Awaitable[None]]
) -> None:
    async def main() -> None:
        server, requests, connections = await _serve(answer)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(
            f"http://127.0.0.1:{port}/prefix/", {"User-Agent": "t"}, ssl_context=None, limit=4
        )
        try:
            await asyncio.wait_for(scenario(pool, requests, connections), 10)
        finally:
            await pool.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_content_length_answers_reuse_one_connection_and_the_prefix_is_sent() -> None:
    def answer(_request: bytes) -> tuple[list[bytes], bool]:
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n", b'{"a":1}'], False

    async def scenario(pool: Pool, requests: list[bytes], connections: list[int]) -> None:
        for _ in range(3):
            assert await pool.request("GET", "/api/v1/x?y=1", {}, None) == (200, b'{"a":1}')
        status, body = await pool.request("POST", "/api/v1/x", {"Content-Type": "j"}, b"{}")
        assert (status, body) == (200, b'{"a":1}')
        assert connections == [1]
        assert requests[0].startswith(b"GET /prefix/api/v1/x?y=1 HTTP/1.1\r\n")
        assert b"\r\nUser-Agent: t\r\n" in requests[0]
        assert b"\r\nHost: 127.0.0.1:" in requests[0]
        assert requests[3].endswith(b"Content-Type: j\r\nContent-Length: 2\r\n\r\n{}")

    _run(answer, scenario)


def test_an_idle_connection_keeps_no_reference_to_the_last_answer() -> None:
    """A list page's body is the caller's alone once answered (the pooled connection and its
    answer's future held it until the next request)."""
    page = b'{"items":[' + b"0," * 50_000 + b"0]}"

    def answer(_request: bytes) -> tuple[list[bytes], bool]:
        return [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(page), page], False

    async def scenario(pool: Pool, _requests: list[bytes], _connections: list[int]) -> None:
        status, body = await pool.request("GET", "/api/v1/x", {}, None)
        assert (status, body) == (200, page)
        await asyncio.sleep(0)  # the step that delivered the answer is over
        assert not [r for r in gc.get_referrers(body) if type(r) is tuple]

    _run(answer, scenario)


def test_chunked_answers_split_anywhere_with_trailers() -> None:
    wire = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nabcd\r\n3;x=y\r\nefg\r\n0\r\nT: 1\r\n\r\n"
    )

    def answer(_request: bytes) -> tuple[list[bytes], bool]:
        return [wire[i : i + 5] for i in range(0, len(wire), 5)], False

    async def scenario(pool: Pool, _requests: list[bytes], connections: list[int]) -> None:
        assert await pool.request("GET", "/a", {}, None) == (201, b"abcdefg")
        assert await pool.request("GET", "/b", {}, None) == (201, b"abcdefg")
        assert connections == [1]

    _run(answer, scenario)


def test_an_answer_framed_by_the_close_is_read_to_the_end() -> None:
    def answer(_request: bytes) -> tuple[list[bytes], bool]:
        return [b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n", b"gone"], True

    async def scenario(pool: Pool, _requests: list[bytes], connections: list[int]) -> None:
        assert await pool.request("GET", "/a", {}, None) == (404, b"gone")
        assert await pool.request("GET", "/a", {}, None) == (404, b"gone")
        assert connections == [2]

    _run(answer, scenario)


def test_a_connection_closed_while_idle_is_replaced_for_a_read_not_a_write() -> None:
    def answer(request: bytes) -> tuple[list[bytes], bool]:
        # Every answer is the connection's last, but says nothing: the pool keeps it.
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"], True

    async def scenario(pool: Pool, _requests: list[bytes], connections: list[int]) -> None:
        assert await pool.request("GET", "/a", {}, None) == (200, b"ok")
        await asyncio.sleep(0.05)  # the server's close arrives while the connection is idle
        assert await pool.request("GET", "/a", {}, None) == (200, b"ok")
        assert connections == [2]

    _run(answer, scenario)


def test_a_write_on_a_connection_that_dies_is_not_sent_again() -> None:
    served = [0]

    def answer(_request: bytes) -> tuple[list[bytes], bool]:
        served[0] += 1
        if served[0] == 2:
            return [], True  # the write's connection dies with no answer
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"], False

    async def scenario(pool: Pool, requests: list[bytes], _connections: list[int]) -> None:
        assert await pool.request("GET", "/a", {}, None) == (200, b"ok")
        with pytest.raises(TransportError):
            await pool.request("POST", "/a", {}, b"{}")
        assert len(requests) == 2
        assert await pool.request("GET", "/a", {}, None) == (200, b"ok")

    _run(answer, scenario)


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # then closed
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
    ],
)
def test_malformed_or_truncated_answers_are_transport_errors(wire: bytes) -> None:
    def answer(_request: bytes) -> tuple[list[bytes], bool]:
        return [wire], True

    async def scenario(pool: Pool, _requests: list[bytes], _connections: list[int]) -> None:
        with pytest.raises(TransportError):
            await pool.request("POST", "/a", {}, b"")

    _run(answer, scenario)


def test_nothing_listening_is_a_transport_error() -> None:
    async def main() -> None:
        pool = Pool("http://127.0.0.1:9", {}, ssl_context=None, limit=1)
        with pytest.raises(TransportError):
            await pool.request("GET", "/", {}, None)
        await pool.close()

    asyncio.run(main())


def test_https_verifies_the_server_against_the_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))

    def answer(_request: bytes) -> tuple[list[bytes], bool]:
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"], False

    async def main() -> None:
        server, _requests, connections = await _serve(answer, serving)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        trusting = Pool(
            url, {}, ssl_context=ssl.create_default_context(cafile=str(pki.ca_cert)), limit=2
        )
        stranger = Pool(url, {}, ssl_context=ssl.create_default_context(), limit=2)
        try:
            for _ in range(2):
                assert await trusting.request("GET", "/a", {}, None) == (200, b"ok")
            assert connections == [1]
            with pytest.raises(TransportError):
                await stranger.request("GET", "/a", {}, None)
        finally:
            await trusting.close()
            await stranger.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_closing_leaves_no_socket_open_when_the_loop_ends_at_once(tmp_path: Path) -> None:
    """``close`` then the end of the loop (``asyncio.run``), with a TLS server that stays up
    (another loop: it does not close the connection itself): every socket is closed, none is
    left for the garbage collector to warn about (a TLS connection's orderly close waits for
    the server's answer, so closing must not wait for it)."""
    pki = make_pki(tmp_path / "pki")
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(str(pki.serving_cert), str(pki.serving_key))
    ready: queue.Queue[int] = queue.Queue()
    server_loop = asyncio.new_event_loop()

    def answer(_request: bytes) -> tuple[list[bytes], bool]:
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"], False

    async def serve() -> None:
        server, _requests, _connections = await _serve(answer, serving)
        ready.put(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    thread = threading.Thread(target=lambda: server_loop.run_until_complete(serve()), daemon=True)
    thread.start()
    port = ready.get(timeout=10)

    async def main() -> None:
        context = ssl.create_default_context(cafile=str(pki.ca_cert))
        pool = Pool(f"https://127.0.0.1:{port}", {}, ssl_context=context, limit=2)
        assert await pool.request("GET", "/a", {}, None) == (200, b"ok")
        await pool.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(main())
        gc.collect()
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


def test_connection_slots_are_first_come_first_served_and_a_cancelled_waiter_passes_its_on() -> (
    None
):
    async def scenario() -> list[str]:
        slots = _Slots(1)
        order: list[str] = []

        async def hold(name: str, release: asyncio.Event) -> None:
            await slots.acquire()
            order.append(name)
            try:
                await release.wait()
            finally:
                slots.release()

        first = asyncio.Event()
        a = asyncio.create_task(hold("a", first))
        await asyncio.sleep(0)
        b_release, c_release, d_release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        b = asyncio.create_task(hold("b", b_release))  # waits; cancelled while waiting
        c = asyncio.create_task(hold("c", c_release))  # waits; handed a slot, then cancelled
        d = asyncio.create_task(hold("d", d_release))
        await asyncio.sleep(0)
        b.cancel()
        await asyncio.sleep(0)
        first.set()
        await asyncio.sleep(0)  # a lets go: c is handed the slot before it runs again
        c.cancel()
        d_release.set()
        await asyncio.gather(a, d, return_exceptions=False)
        for task in (b, c):
            with pytest.raises(asyncio.CancelledError):
                await task
        await slots.acquire()  # the slot came back
        return order

    assert asyncio.run(scenario()) == ["a", "d"]


def test_a_slot_is_taken_at_once_only_while_one_is_free_and_nobody_waits() -> None:
    async def scenario() -> None:
        slots = _Slots(1)
        assert slots.take_now()
        assert not slots.take_now()
        waiter = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        slots.release()  # handed to the waiter, not freed
        assert not slots.take_now()
        await waiter
        slots.release()
        assert slots.take_now()

    asyncio.run(scenario())


# ------------------------------------------------------------------ an answer in one read

#: Answers as they may arrive in one read: the plain ones the shortcut takes, and every kind
#: it hands to the general parse (framing of every sort, heads it refuses, hostile bytes).
_ONE_READ_ANSWERS = [
    (
        b"HTTP/1.1 201 Created\r\nServer: x\r\nDate: d\r\nContent-Type: application/json\r\n"
        b"Cache-Control: no-cache, private\r\nContent-Length: 2\r\n\r\n{}"
    ),
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length :  3 \r\nConnection: close\r\n\r\nabc",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\nok\r\n0\r\n",
    b"HTTP/1.1 200 OK\r\n\r\nup to the close",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nDate\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
    b"SMTP ready\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2",
    b"\r\n\r\n",
]


def _one_read(wire: bytes, *, head_only: bool, shortcut: bool) -> tuple[object, ...]:
    """What a connection makes of ``wire`` arriving in one read (then the server's close),
    with or without the whole-answer shortcut."""

    class _Wire(asyncio.Transport):
        def write(self, data: bytes | bytearray | memoryview) -> None:
            pass

        def abort(self) -> None:
            pass

    async def main() -> tuple[object, ...]:
        conn = _Connection()
        conn.connection_made(_Wire())
        if not shortcut:
            conn._whole = lambda _data: False  # type: ignore[method-assign]
        answer = conn.send(b"GET / HTTP/1.1\r\n\r\n", head_only)
        conn.data_received(wire)
        if not answer.done():
            conn.connection_lost(None)
        try:
            status, body = answer.result()
        except TransportError as exc:
            return ("error", str(exc), conn.closed)
        return (status, body, conn.reusable, conn.closed)

    return asyncio.run(main())


@pytest.mark.parametrize("head_only", [False, True])
@pytest.mark.parametrize("wire", _ONE_READ_ANSWERS)
def test_an_answer_in_one_read_is_read_as_by_the_general_parse(
    wire: bytes, head_only: bool
) -> None:
    assert _one_read(wire, head_only=head_only, shortcut=True) == _one_read(
        wire, head_only=head_only, shortcut=False
    )


@settings(max_examples=300, deadline=None)
@given(
    head=st.lists(
        st.sampled_from(
            [
                b"Content-Length: 2",
                b"Content-Length: 3",
                b"Content-Length:x",
                b"Transfer-Encoding: chunked",
                b"Connection: close",
                b"Connection: keep-alive",
                b"Date: Mon, 07 Dec 2026 06:00:00 GMT",
                b"Server",
                b" Content-Length : 2",
            ]
        ),
        max_size=4,
    ),
    status=st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 201", b"HTTP/1.1 204 x", b"HTTP/2 200"]),
    body=st.binary(max_size=8),
    head_only=st.booleans(),
)
def test_any_answer_in_one_read_is_read_as_by_the_general_parse(
    head: list[bytes], status: bytes, body: bytes, head_only: bool
) -> None:
    wire = b"\r\n".join([status, *head]) + b"\r\n\r\n" + body
    assert _one_read(wire, head_only=head_only, shortcut=True) == _one_read(
        wire, head_only=head_only, shortcut=False
    )


def test_a_plain_answer_in_one_read_takes_the_shortcut() -> None:
    taken: list[bool] = []
    original = _Connection._whole

    def spy(self: _Connection, data: bytes) -> bool:
        taken.append(original(self, data))
        return taken[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Connection, "_whole", spy)
        assert _one_read(_ONE_READ_ANSWERS[0], head_only=False, shortcut=True)[:2] == (201, b"{}")
        assert _one_read(_ONE_READ_ANSWERS[10], head_only=False, shortcut=True)[:2] == (200, b"ok")
    assert taken == [True, False]

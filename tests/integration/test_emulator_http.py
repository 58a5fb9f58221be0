"""The emulator's HTTP/1.1 layer on a raw socket: request heads as the standard library's
server reads them (the emulator parses an HTTP/1.1 head itself), and a watch stream that its
reader leaves unread while writes land (events then wait in the server's queue, some sent
in part) still carries every event once, in order, in well-formed chunks; a burst of
connections waits in the listen queue, as at an API server; and a list item cut out of an
object's kept encoding is the bytes its own encoding gives."""

from __future__ import annotations

import json
import socket
from typing import Any

from kubeapi import codec
from tests.emulator import Emulator
from tests.emulator.server import EncodedObjects, _Server
from tests.integration.fake_kubelet import queued_connections


def _exchange(emulator: Emulator, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", emulator.port), timeout=10) as sock:
        sock.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data or not _complete(data):
            more = sock.recv(65536)
            if not more:
                break
            data += more
        return data


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return True


def test_header_names_are_case_insensitive_and_the_first_of_repeated_fields_counts(
    emulator: Emulator,
) -> None:
    answer = _exchange(
        emulator,
        b"GET /api/v1/namespaces/default HTTP/1.1\r\nHost: x\r\nuser-AGENT: first\r\n"
        b"User-Agent: second\r\nConnection: close\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert json.loads(body)["metadata"]["name"] == "default"
    assert b"Date: " in head
    assert b"Content-Type: application/json" in head
    assert emulator.requests[-1].user_agent == "first"


def test_an_http_1_0_request_is_answered_and_closed(emulator: Emulator) -> None:
    answer = _exchange(emulator, b"GET /api/v1/namespaces/default HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["metadata"]["name"] == "default"


def test_more_than_100_headers_is_a_431(emulator: Emulator) -> None:
    fields = b"".join(b"X-Field-%d: v\r\n" % i for i in range(101))
    answer = _exchange(emulator, b"GET /version HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b"got more than 100 headers" in answer


def test_expect_100_continue_is_answered_before_the_body(emulator: Emulator) -> None:
    body = json.dumps({"metadata": {"name": "expect"}}).encode()
    with socket.create_connection(("127.0.0.1", emulator.port), timeout=10) as sock:
        sock.sendall(
            b"POST /api/v1/namespaces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 201 Created\r\n")
    assert emulator.get("namespaces", "expect") is not None


def test_a_burst_of_connections_waits_in_the_listen_queue() -> None:
    """A controller's informers connect together (eighteen lists and watches at start-up): the
    listen queue holds them until the server accepts them. With the standard library's queue
    of 5 the kernel dropped the rest, and a watch then opened a second or more late: a CI run
    saw the controller miss a pod's binding and deletion for over five seconds."""
    server = _Server(("127.0.0.1", 0), Emulator())  # never accepts
    try:
        assert queued_connections(server.socket, 64) == 64
    finally:
        server.server_close()


def _events(stream: bytes) -> list[dict[str, Any]]:
    """The JSON events of a chunked body (each chunk one event line)."""
    events = []
    while stream:
        size_line, _, rest = stream.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunk, crlf, stream = rest[:size], rest[size : size + 2], rest[size + 2 :]
        assert crlf == b"\r\n"
        assert chunk.endswith(b"\n")
        events.append(json.loads(chunk))
    return events


def test_a_watch_read_late_gets_every_event_once_in_order(emulator: Emulator) -> None:
    emulator.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "slow"}},
    )
    start = emulator.resource_version
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the server's sends fill up
    sock.settimeout(10)
    sock.connect(("127.0.0.1", emulator.port))
    sock.sendall(
        b"GET /apis/coordination.k8s.io/v1/namespaces/slow/leases?watch=true&resourceVersion="
        + str(start).encode()
        + b"&timeoutSeconds=60 HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    emulator.wait_for_watches(1, kind="leases")
    filler = "x" * 30_000
    count = 150
    for i in range(count):  # 4.5 MB of events nobody reads yet
        emulator.create(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": f"l{i}", "namespace": "slow", "annotations": {"f": filler}},
                "spec": {"leaseTransitions": i},
            }
        )
    assert emulator.drop_watches("leases", clean=True) == 1  # the stream ends after them
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        more = sock.recv(1 << 20)
        assert more, "the stream ended before its last chunk"
        data += more
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"Transfer-Encoding: chunked" in head
    events = _events(body)
    assert [e["type"] for e in events] == ["ADDED"] * count
    assert [e["object"]["spec"]["leaseTransitions"] for e in events] == list(range(count))
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs)
    assert len(set(rvs)) == count


def test_a_list_item_cut_from_a_kept_encoding_is_its_own_encoding() -> None:
    """EncodedObjects.item cuts an object's apiVersion and kind out of its kept whole
    encoding (sorted keys put them first): the same bytes as encoding the object without
    them, also where a key sorts before apiVersion (a core Event's ``action``), where they
    are all there is, where a value needs Go's escapes, or where they are not strings."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p<&>"}, "spec": {}},
        {"action": "Binding", "apiVersion": "v1", "kind": "Event", "metadata": {}},
        {"apiVersion": "v1", "kind": "Pod"},
        {"apiVersion": "v1", "kind": 7, "metadata": {}},
        {"apiVersion": "a\u2028", "kind": "K", "z": 1},
        {"kind": "Pod", "metadata": {}},
    ]
    for obj in objects:
        encoded = EncodedObjects()
        assert encoded.whole(obj) == codec.dumps(obj)
        want = codec.dumps({k: v for k, v in obj.items() if k not in {"kind", "apiVersion"}})
        assert encoded.item(obj) == want, obj
        assert encoded.item(obj) == want, obj  # kept

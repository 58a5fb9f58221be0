"""API emulator benchmark (``make bench-emulator``): calls per second for create, get, patch,
list and watch delivery, through the official ``kubernetes`` client over real HTTP.

The emulator runs in a child process (``python -m tests.emulator``), as the kubelet plugin and
controller processes use it, so client and server do not share one GIL. Each row is N calls
on one keep-alive connection: ResourceClaim create, get, merge patch of a label, list of the
namespace's claims (``--objects`` items, raw JSON as hot paths read it), and watch delivery
(time from the first create to the last ADDED event seen by an open watch). ``--in-process``
runs the server as a thread of this process instead.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.emulator import Emulator

ROOT = Path(__file__).resolve().parents[1]


def _claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
    }


@contextmanager
def _server(in_process: bool) -> Iterator[str]:
    if in_process:
        with Emulator() as emulator:
            yield emulator.url
        return
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.emulator", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the emulator did not start: {line!r}")
        yield line.removeprefix("listening on ")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def _timed(count: int, call: Callable[[int], Any]) -> tuple[float, list[float]]:
    """Time ``count`` raw-response calls; each body is read and its connection released."""
    samples: list[float] = []
    start = time.perf_counter()
    for i in range(count):
        t0 = time.perf_counter()
        response = call(i)
        json.loads(response.data)
        response.release_conn()
        samples.append(time.perf_counter() - t0)
    return time.perf_counter() - start, samples


def _watch_delivery(
    api: client.ResourceV1Api, namespace: str, count: int
) -> tuple[float, list[float]]:
    """Create ``count`` claims while a watch is open; time until every ADDED has arrived."""
    created_at: dict[str, float] = {}
    latencies: list[float] = []
    done = threading.Event()
    ready = threading.Event()
    rv = api.list_namespaced_resource_claim(namespace, limit=1).metadata.resource_version

    def reader() -> None:
        response = api.list_namespaced_resource_claim(
            namespace, watch=True, resource_version=rv, _preload_content=False
        )
        ready.set()
        buffer = b""
        seen = 0
        for chunk in response.stream(65536, decode_content=False):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                event = json.loads(line)
                name = event["object"]["metadata"]["name"]
                if event["type"] == "ADDED" and name in created_at:
                    latencies.append(time.perf_counter() - created_at[name])
                    seen += 1
            if seen >= count:
                break
        response.release_conn()
        done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.05)
    start = time.perf_counter()
    for i in range(count):
        name = f"w-{i}"
        created_at[name] = time.perf_counter()
        response = api.create_namespaced_resource_claim(
            namespace, _claim(name), _preload_content=False
        )
        response.data  # noqa: B018 - read the body so the connection goes back to the pool
        response.release_conn()
    done.wait(60)
    elapsed = time.perf_counter() - start
    thread.join(5)
    return elapsed, latencies


def run(count: int, objects: int, in_process: bool) -> list[tuple[str, int, float, list[float]]]:
    rows: list[tuple[str, int, float, list[float]]] = []
    with _server(in_process) as url:
        configuration = client.Configuration()
        configuration.host = url
        with client.ApiClient(configuration) as api_client:
            resource = client.ResourceV1Api(api_client)
            core = client.CoreV1Api(api_client)
            core.create_namespace({"metadata": {"name": "bench"}})
            core.create_namespace({"metadata": {"name": "bench-list"}})
            for i in range(objects):
                resource.create_namespaced_resource_claim("bench-list", _claim(f"l-{i}"))
            raw = {"_preload_content": False}
            elapsed, samples = _timed(
                count,
                lambda i: resource.create_namespaced_resource_claim(
                    "bench", _claim(f"c-{i}"), **raw
                ),
            )
            rows.append(("create", count, elapsed, samples))
            elapsed, samples = _timed(
                count, lambda i: resource.read_namespaced_resource_claim(f"c-{i}", "bench", **raw)
            )
            rows.append(("get", count, elapsed, samples))
            elapsed, samples = _timed(
                count,
                lambda i: resource.patch_namespaced_resource_claim(
                    f"c-{i}", "bench", {"metadata": {"labels": {"n": str(i)}}}, **raw
                ),
            )
            rows.append(("patch (strategic merge)", count, elapsed, samples))
            list_count = max(1, count // 10)
            elapsed, samples = _timed(
                list_count,
                lambda i: resource.list_namespaced_resource_claim("bench-list", **raw),
            )
            rows.append((f"list ({objects} claims, raw JSON)", list_count, elapsed, samples))
            core.create_namespace({"metadata": {"name": "bench-watch"}})
            elapsed, samples = _watch_delivery(resource, "bench-watch", count)
            rows.append(("watch delivery (create -> ADDED)", len(samples), elapsed, samples))
    return rows


def _table(rows: list[tuple[str, int, float, list[float]]], where: str) -> str:
    header = f"{'operation':36} {'calls':>6} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
    lines = [
        f"API emulator ({where}), official kubernetes client over HTTP/1.1 keep-alive",
        header,
        "-" * len(header),
    ]
    for name, calls, elapsed, samples in rows:
        ordered = sorted(samples)
        p50 = statistics.median(ordered) * 1000 if ordered else 0.0
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000 if ordered else 0.0
        rate = calls / elapsed if elapsed else 0.0
        lines.append(f"{name:36} {calls:6d} {rate:9.0f} {p50:8.2f} {p99:8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.emulator", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "-n", "--count", type=int, default=500, help="calls per operation (default 500)"
    )
    parser.add_argument("--objects", type=int, default=200, help="claims in the listed namespace")
    parser.add_argument("--in-process", action="store_true", help="run the emulator as a thread")
    args = parser.parse_args(argv)
    rows = run(args.count, args.objects, args.in_process)
    print(_table(rows, "thread in this process" if args.in_process else "child process"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the end-to-end benchmarks share: child processes, the controller's endpoints, and a
cluster seeded straight into an in-process API emulator.

* :func:`child` runs a command for the length of a ``with`` block (optionally until it prints
  a line), its output to a log file or discarded, and ends it with SIGTERM (SIGKILL after
  15 s);
* :func:`controller_argv` is the real ``biaxial controller`` command line against a
  kubeconfig; :func:`compile_bytecode` compiles the project's modules first, as installing
  the image does; :func:`wait_ready` polls its ``/readyz``, :func:`scrape` reads its
  ``/metrics`` (labelled samples included); :func:`cpu_seconds` and :func:`peak_rss_mib` are
  a process's CPU time and peak resident memory;
* :func:`seed_nodes` puts Nodes with their ResourceSlices (from the real slice builder on a
  fake GPU profile) and the project's DeviceClasses into an in-process emulator, without HTTP.

Loopback only; nothing here reaches outside the machine.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tests.integration.controller_env import seed_cluster

JSON = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent
DRIVER = "gpu.biaxial.dev"


@contextlib.contextmanager
def child(
    argv: Sequence[str],
    *,
    wait_for: str | None = None,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Run ``argv`` during the block; yields the first output line containing ``wait_for``
    ("" without it) and the process. With ``wait_for``, the block starts once that line was
    printed (the output is then read on, so the child never blocks on a full pipe)."""
    sink: IO[str] | int = subprocess.DEVNULL
    if log is not None:
        sink = log.open("a", encoding="utf-8")
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE if wait_for else sink,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
    try:
        found = ""
        if wait_for is not None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if not isinstance(sink, int):
                    sink.write(line)
                if wait_for in line:
                    found = line.strip()
                    break
            else:
                raise RuntimeError(f"{' '.join(argv[:4])} exited before printing {wait_for!r}")
            threading.Thread(target=_drain, args=(proc.stdout, sink), daemon=True).start()
        yield found, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not isinstance(sink, int):
            sink.close()


def _drain(stream: IO[str], sink: IO[str] | int) -> None:
    with contextlib.suppress(ValueError, OSError):
        for line in stream:
            if not isinstance(sink, int):
                sink.write(line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def controller_argv(kubeconfig: Path, metrics_port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "biaxial",
        "controller",
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-port",
        str(metrics_port),
        *extra,
    ]


#: The project's packages the controller imports.
PACKAGES = ("biaxial", "controller", "driver", "kubeapi")


def compile_bytecode() -> None:
    """Compile the project's modules to bytecode (``__pycache__``, ignored by git), as the
    image's ``pip install`` of the wheel does: a controller started from this checkout then
    imports what it would in a cluster. Without it, where ``PYTHONDONTWRITEBYTECODE`` is set
    (the image sets it, so do some development shells) every start compiles each module from
    source again: about 0.3 s of CPU a start counted in its time to ready that the product
    does not spend."""
    for package in PACKAGES:
        compileall.compile_dir(ROOT / package, quiet=1)


def wait_ready(port: int, timeout: float = 120.0) -> float:
    """Seconds until ``/readyz`` answered 200."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp,
        ):
            if resp.status == 200:
                return time.monotonic() - started
        time.sleep(0.1)
    raise TimeoutError(f"nothing ready on port {port} within {timeout} s")


def scrape(port: int) -> dict[str, float]:
    """Every sample of ``/metrics``, labelled ones under their full text (``a{b="c"}``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (``VmHWM``), MiB; 0 once it is gone."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def gather_bounded(calls: Sequence[Any], limit: int) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(call: Any) -> None:
        async with sem:
            await call()

    await asyncio.gather(*(one(c) for c in calls))


def strip(obj: JSON) -> JSON:
    """``obj`` without the server-set uid and resourceVersion (to create it elsewhere)."""
    metadata = {k: v for k, v in obj["metadata"].items() if k not in ("uid", "resourceVersion")}
    return {**obj, "metadata": metadata}


def seed_nodes(
    emulator: Any,
    nodes: Mapping[str, str],
    *,
    namespaces: Sequence[str] = (),
    slices: bool = True,
    classes: bool = True,
) -> None:
    """``{node: fake GPU profile}``: the namespaces, each Node, its ResourceSlices (unless a
    plugin will publish them) and the DeviceClasses, written straight into an in-process
    emulator (:func:`tests.integration.controller_env.seed_cluster`)."""
    for namespace in namespaces:
        emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    seed_cluster(emulator, nodes, classes=classes, slices=slices)

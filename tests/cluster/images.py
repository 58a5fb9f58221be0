"""The two container images the real node runs, built locally as OCI image archives: nothing is
pulled from a registry (the machines reach none).

- ``biaxial.test/pause:local``: the pod sandbox. A tiny ``pause`` compiled here from C
  (:data:`PAUSE_C`, the behaviour of upstream's ``build/pause/linux/pause.c``: sleep until
  SIGINT/SIGTERM, reap zombies), linked statically.
- ``biaxial.test/busybox:local``: the workload image, Debian's ``busybox-static`` binary and a
  link per applet (``sh``, ``env``, ``ls``, ``cat``, ``sleep`` ...).

Each archive is an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/...``) in a
tar, the form ``ctr images import`` reads; the index names the image
(``io.containerd.image.name``), so the import needs no flag. The layer is built with fixed
times and owners, so the same inputs give the same digests.

Needs ``gcc`` with a static libc (``libc6-dev``) and ``/bin/busybox`` from ``busybox-static``
(``apt-get install busybox-static``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Final

PAUSE_IMAGE: Final = "biaxial.test/pause:local"
BUSYBOX_IMAGE: Final = "biaxial.test/busybox:local"
BUSYBOX: Final = Path("/bin/busybox")
APPLETS: Final = (
    "sh", "env", "ls", "cat", "sleep", "echo", "mount", "grep", "test", "true", "false",
    "stat", "find", "head", "tail", "sort", "touch", "wc", "id", "ps", "kill", "date",
)  # fmt: skip

PAUSE_C: Final = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction term = {.sa_handler = stop}, child = {.sa_handler = reap,
                                                         .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &term, NULL);
  sigaction(SIGTERM, &term, NULL);
  sigaction(SIGCHLD, &child, NULL);
  for (;;) pause();
  return 1;
}
"""


class ImageError(Exception):
    """An image cannot be built; the message says what is missing."""


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def _layer(files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> tuple[bytes, str]:
    """A gzip'd tar layer of ``files`` (path -> (content, mode)) and symlinks; (blob, diff id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *links]} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for path, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(content), mode, 0
            tar.addfile(info, io.BytesIO(content))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
            tar.addfile(info)
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    return gzip.compress(raw.getvalue(), mtime=0), diff_id


def oci_archive(
    path: Path, name: str, layer: tuple[bytes, str], entrypoint: list[str], cmd: list[str]
) -> Path:
    """Write an OCI image layout tar holding one image ``name`` of one layer."""
    blobs: dict[str, bytes] = {}
    layer_desc = _blob(blobs, layer[0])
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer[1]]},
        "created": "1970-01-01T00:00:00Z",
    }
    config_desc = _blob(blobs, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
    }
    manifest_desc = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **manifest_desc,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        **{f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for entry, data in entries.items():
            info = tarfile.TarInfo(entry)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def pause_archive(path: Path) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ImageError("no gcc: the pause image's binary is compiled here (apt-get install gcc)")
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "pause.c", Path(tmp) / "pause"
        source.write_text(PAUSE_C)
        proc = subprocess.run(
            [gcc, "-static", "-Os", "-s", "-o", str(binary), str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ImageError(f"compiling pause failed (needs libc6-dev):\n{proc.stderr}")
        layer = _layer({"pause": (binary.read_bytes(), 0o755)}, {})
    return oci_archive(path, PAUSE_IMAGE, layer, ["/pause"], [])


def busybox_archive(path: Path) -> Path:
    if not BUSYBOX.is_file():
        raise ImageError(f"no {BUSYBOX}: apt-get install busybox-static")
    files = {"bin/busybox": (BUSYBOX.read_bytes(), 0o755)}
    links = {f"bin/{applet}": "busybox" for applet in APPLETS}
    return oci_archive(path, BUSYBOX_IMAGE, _layer(files, links), [], ["sh"])


def build_all(directory: Path) -> list[Path]:
    """Both archives into ``directory``; returns their paths."""
    return [
        pause_archive(directory / "pause.oci.tar"),
        busybox_archive(directory / "busybox.oci.tar"),
    ]

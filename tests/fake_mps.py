"""A fake ``nvidia-cuda-mps-control`` for the tests that start MPS daemons without a GPU.

It behaves like the real control program for what the plugin uses: ``-d`` starts a daemon for
``$CUDA_MPS_PIPE_DIRECTORY`` (a ``daemon`` file in it), ``get_server_list`` fails when none
runs, ``quit`` stops it, the ``set_default_*`` commands need a running daemon. Every call is
logged next to the pipe directory, in ``calls.log``: ``-d <GPU> <log dir>`` for a start, the
command itself otherwise. Environment switches make it misbehave: ``FAKE_MPS_FAIL_START``
(the start fails with that text, also written to the daemon's ``control.log``),
``FAKE_MPS_IGNORE_QUIT``, ``FAKE_MPS_REFUSE_LIMITS``.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Final

SCRIPT: Final = """#!/bin/sh
pipe="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = "-d" ]; then
    echo "-d $CUDA_VISIBLE_DEVICES $CUDA_MPS_LOG_DIRECTORY" >> "$pipe/../calls.log"
    [ -n "$FAKE_MPS_FAIL_START" ] && {
        echo "[Control] $FAKE_MPS_FAIL_START" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
        echo "cannot start: $FAKE_MPS_FAIL_START" >&2; exit 3; }
    : > "$pipe/daemon"; exit 0
fi
read -r cmd
echo "$cmd" >> "$pipe/../calls.log"
case "$cmd" in
    get_server_list)
        [ -f "$pipe/daemon" ] || { echo "Cannot find MPS control daemon" >&2; exit 1; } ;;
    quit) [ -n "$FAKE_MPS_IGNORE_QUIT" ] || rm -f "$pipe/daemon" ;;
    set_default_*)
        [ -n "$FAKE_MPS_REFUSE_LIMITS" ] && { echo "unknown command" >&2; exit 4; }
        [ -f "$pipe/daemon" ] || exit 1 ;;
esac
"""


def install(directory: Path) -> Path:
    """Write the fake as ``<directory>/nvidia-cuda-mps-control`` (executable); its path."""
    path = directory / "nvidia-cuda-mps-control"
    path.write_text(SCRIPT)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def calls(daemon_dir: Path) -> list[str]:
    """What the daemon in ``daemon_dir`` was asked, in order, liveness checks left out; a
    start is ``-d``."""
    log = daemon_dir / "calls.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split()[0] if line.startswith("-d") else line for line in lines
            if line != "get_server_list"]  # fmt: skip

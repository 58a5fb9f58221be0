"""The MPS control daemon manager, driven through a fake ``nvidia-cuda-mps-control``."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from driver.api.errors import PrepareError
from kubeletplugin.mps import MpsManager, MpsSettings

# Behaves like the real control program for what the manager uses: `-d` starts a daemon for
# $CUDA_MPS_PIPE_DIRECTORY, `get_server_list` fails when none runs, `quit` stops it. Every
# call is logged with the GPU it was made for.
FAKE_CONTROL = """#!/bin/sh
pipe="$CUDA_MPS_PIPE_DIRECTORY"
echo "${1:-client} $CUDA_VISIBLE_DEVICES $CUDA_MPS_LOG_DIRECTORY" >> "$pipe/../calls.log"
if [ "$1" = "-d" ]; then
    [ -n "$FAKE_MPS_FAIL_START" ] && { echo "cannot start: $FAKE_MPS_FAIL_START" >&2; exit 3; }
    : > "$pipe/daemon"; exit 0
fi
read -r cmd
case "$cmd" in
    get_server_list)
        [ -f "$pipe/daemon" ] || { echo "Cannot find MPS control daemon" >&2; exit 1; } ;;
    quit) [ -n "$FAKE_MPS_IGNORE_QUIT" ] || rm -f "$pipe/daemon" ;;
esac
"""


def fake_control(directory: Path) -> Path:
    path = directory / "nvidia-cuda-mps-control"
    path.write_text(FAKE_CONTROL)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def manager(tmp_path: Path) -> MpsManager:
    return MpsManager(
        MpsSettings(root=tmp_path / "mps", control_binary=str(fake_control(tmp_path)))
    )


def calls(root: Path, gpu: str) -> list[str]:
    log = root / gpu / "calls.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def test_start_is_idempotent_and_per_gpu(manager: MpsManager, tmp_path: Path) -> None:
    root = tmp_path / "mps"
    assert not manager.is_running("GPU-a")
    manager.ensure_running("GPU-a")
    manager.ensure_running("GPU-a")
    assert manager.is_running("GPU-a")
    assert not manager.is_running("GPU-b")
    assert calls(root, "GPU-a").count("-d") == 1
    line = (root / "GPU-a" / "calls.log").read_text().splitlines()[0].split()
    assert line[1:] == ["GPU-a", str(root / "GPU-a" / "log")]  # daemon sees only its GPU
    assert manager.pipe_dir("GPU-a") == root / "GPU-a" / "pipe"


def test_stop(manager: MpsManager) -> None:
    manager.stop("GPU-a")  # nothing running: a no-op
    manager.ensure_running("GPU-a")
    manager.stop("GPU-a")
    assert not manager.is_running("GPU-a")


def test_restarts_a_daemon_that_died(manager: MpsManager) -> None:
    manager.ensure_running("GPU-a")
    (manager.pipe_dir("GPU-a") / "daemon").unlink()  # killed behind our back
    manager.ensure_running("GPU-a")
    assert manager.is_running("GPU-a")


def test_start_failure_reports_the_output(
    manager: MpsManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL_START", "exclusive mode")
    with pytest.raises(
        PrepareError, match=r"did not start \(exit 3: cannot start: exclusive mode\)"
    ):
        manager.ensure_running("GPU-a")


def test_stop_that_is_ignored_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = MpsManager(
        MpsSettings(
            root=tmp_path / "mps",
            control_binary=str(fake_control(tmp_path)),
            stop_timeout_s=0.2,
        )
    )
    manager.ensure_running("GPU-a")
    monkeypatch.setenv("FAKE_MPS_IGNORE_QUIT", "1")
    with pytest.raises(PrepareError, match="still answers"):
        manager.stop("GPU-a")


def test_missing_binary(tmp_path: Path) -> None:
    manager = MpsManager(MpsSettings(root=tmp_path, control_binary=str(tmp_path / "absent")))
    (tmp_path / "GPU-a" / "pipe").mkdir(parents=True)
    with pytest.raises(PrepareError, match="not found"):
        manager.ensure_running("GPU-a")

"""The per-claim MPS control daemons, driven through a fake ``nvidia-cuda-mps-control``."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.api.errors import PrepareError
from kubeletplugin.mps import MpsDaemon, MpsManager, MpsSettings, daemon_dir
from tests.fake_mps import install as fake_control


@pytest.fixture
def manager(tmp_path: Path) -> MpsManager:
    return MpsManager(
        MpsSettings(root=tmp_path / "mps", control_binary=str(fake_control(tmp_path)))
    )


def daemon(manager: MpsManager, claim: str = "uid-a", **limits: int) -> MpsDaemon:
    return MpsDaemon(
        directory=daemon_dir(manager.root, claim, "gpu-0"),
        gpu_uuid="GPU-a",
        memory_bytes=limits.get("memory_mib", 4096) * 1024 * 1024,
        cores=limits.get("cores", 30),
    )


def calls(d: MpsDaemon) -> list[str]:
    log = d.directory / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_each_claim_gets_its_own_daemon_with_its_limits_on_the_daemon(
    manager: MpsManager,
) -> None:
    a = daemon(manager, "uid-a", memory_mib=4096, cores=30)
    b = daemon(manager, "uid-b", memory_mib=1024, cores=100)
    manager.ensure_running(a)
    manager.ensure_running(b)
    assert a.pipe == manager.root / "uid-a" / "gpu-0" / "pipe"
    assert a.pipe != b.pipe  # no pipe is shared across claims
    assert manager.is_running(a.directory)
    assert manager.is_running(b.directory)
    start = calls(a)[0].split()
    assert start == ["-d", "GPU-a", str(a.logs)]  # the daemon sees only its GPU
    assert [c for c in calls(a) if c != "get_server_list"][1:] == [
        "set_default_device_pinned_mem_limit GPU-a 4096M",
        "set_default_active_thread_percentage 30",
    ]
    # 100 cores is the whole GPU: no thread limit; the memory limit is always set.
    assert [c for c in calls(b) if c.startswith("set_")] == [
        "set_default_device_pinned_mem_limit GPU-a 1024M"
    ]


def test_start_is_idempotent_and_the_limits_are_reapplied_to_an_adopted_daemon(
    manager: MpsManager,
) -> None:
    a = daemon(manager)
    manager.ensure_running(a)
    manager.ensure_running(a)  # a new plugin process finds it running: adopted
    assert [c.split()[0] for c in calls(a)].count("-d") == 1
    assert calls(a).count("set_default_device_pinned_mem_limit GPU-a 4096M") == 2


def test_stop_removes_the_directory_and_the_empty_claim_directory(manager: MpsManager) -> None:
    manager.stop(manager.root / "uid-x" / "gpu-0")  # nothing there: a no-op
    a = daemon(manager)
    manager.ensure_running(a)
    manager.stop(a.directory)
    assert not manager.is_running(a.directory)
    assert not a.directory.exists()
    assert not (manager.root / "uid-a").exists()


def test_restarts_a_daemon_that_died(manager: MpsManager) -> None:
    a = daemon(manager)
    manager.ensure_running(a)
    (a.pipe / "daemon").unlink()  # killed behind our back
    manager.ensure_running(a)
    assert manager.is_running(a.directory)


def test_sweep_stops_every_daemon_it_is_not_told_to_keep(manager: MpsManager) -> None:
    kept = daemon(manager, "uid-kept")
    gone = daemon(manager, "uid-gone")
    legacy = MpsDaemon(directory=manager.root / "GPU-a", gpu_uuid="GPU-a")  # a per-GPU one
    for d in (kept, gone, legacy):
        manager.ensure_running(d)
    assert manager.daemon_dirs() == sorted([kept.directory, gone.directory, legacy.directory])
    assert manager.sweep({kept.directory}) == sorted([legacy.directory, gone.directory])
    assert manager.is_running(kept.directory)
    assert not gone.directory.parent.exists()
    assert not legacy.directory.exists()
    assert manager.sweep({kept.directory}) == []


def test_stop_claim_needs_no_record(manager: MpsManager) -> None:
    a = daemon(manager, "uid-a")
    manager.ensure_running(a)
    other = daemon(manager, "uid-b")
    manager.ensure_running(other)
    manager.stop_claim("uid-a")
    assert not (manager.root / "uid-a").exists()
    assert manager.is_running(other.directory)
    manager.stop_claim("..")  # not a UID: nothing outside the claim's directory is touched
    manager.stop_claim("uid-never")
    assert manager.is_running(other.directory)


def test_start_failure_reports_the_output_and_the_daemon_log(
    manager: MpsManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL_START", "exclusive mode")
    with pytest.raises(PrepareError) as info:
        manager.ensure_running(daemon(manager))
    message = str(info.value)
    assert "did not start (exit 3: cannot start: exclusive mode)" in message
    assert "its log ends: [Control] exclusive mode" in message


def test_a_limit_the_daemon_refuses_fails_the_start(
    manager: MpsManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_REFUSE_LIMITS", "1")
    with pytest.raises(PrepareError, match="set_default_device_pinned_mem_limit GPU-a 4096M"):
        manager.ensure_running(daemon(manager))


def test_stop_that_is_ignored_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = MpsManager(
        MpsSettings(
            root=tmp_path / "mps",
            control_binary=str(fake_control(tmp_path)),
            stop_timeout_s=0.2,
        )
    )
    a = daemon(manager)
    manager.ensure_running(a)
    monkeypatch.setenv("FAKE_MPS_IGNORE_QUIT", "1")
    with pytest.raises(PrepareError, match="still answers"):
        manager.stop(a.directory)
    assert manager.sweep(()) == []  # left for the next sweep, logged
    assert manager.is_running(a.directory)


def test_missing_binary(tmp_path: Path) -> None:
    manager = MpsManager(MpsSettings(root=tmp_path, control_binary=str(tmp_path / "absent")))
    d = daemon(manager)
    d.pipe.mkdir(parents=True)
    with pytest.raises(PrepareError, match="not found"):
        manager.ensure_running(d)


def test_nothing_outside_the_root_is_touched(manager: MpsManager, tmp_path: Path) -> None:
    """Measured before (issue 29, item 7): a checkpoint with a valid checksum naming an MPS
    directory outside --mps-root got that directory removed at Unprepare."""
    outside = tmp_path / "precious"
    (outside / "pipe").mkdir(parents=True)
    (outside / "data").write_text("keep me")
    for directory in (outside, manager.root, manager.root / "uid-a" / ".." / ".." / "precious"):
        with pytest.raises(PrepareError, match="is outside the MPS root"):
            manager.stop(directory)
        stray = MpsDaemon(directory=directory, gpu_uuid="GPU-a", memory_bytes=None, cores=0)
        with pytest.raises(PrepareError, match="is outside the MPS root"):
            manager.ensure_running(stray)
    assert (outside / "data").read_text() == "keep me"
    assert (outside / "pipe").is_dir()

"""MPS (CUDA Multi-Process Service) control daemons, one per claim and GPU, owned by the plugin.

Contract:

* A claim using the ``mps`` strategy gets its **own** control daemon on each GPU it shares that
  way (as NVIDIA's DRA driver runs one per claim), in its own directory
  ``<root>/<claim UID>/<device>`` (:func:`daemon_dir`) holding ``pipe/`` and ``log/``. It is
  started with ``nvidia-cuda-mps-control -d`` and the environment
  ``CUDA_VISIBLE_DEVICES=<GPU UUID>``, ``CUDA_MPS_PIPE_DIRECTORY=<dir>/pipe``,
  ``CUDA_MPS_LOG_DIRECTORY=<dir>/log``. Only that claim's containers get the pipe directory
  (mounted by the claim's CDI spec), so no tenant can reach another claim's daemon.
* **Limits live on the daemon**, not only in the client's environment: right after the start,
  and again whenever the daemon is found running, the manager sends
  ``set_default_device_pinned_mem_limit <GPU UUID> <MiB>M`` (the claim's memory on that GPU)
  and ``set_default_active_thread_percentage <percent>`` (its cores, when 1..99). They apply
  to every MPS server the daemon starts, so a client that drops
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` from its environment is limited all the same.
* The manager keeps no state in memory: the caller (the Preparer) records every daemon
  (:class:`MpsDaemon`) in the checkpoint, and a directory is stopped when no prepared claim
  lists it any more. :meth:`MpsManager.sweep` stops and removes every daemon directory under
  the root that the caller does not name (run at start: daemons of claims released while the
  plugin was down, and the per-GPU daemons of plugin versions before per-claim daemons).
* Liveness is asked of the daemon itself (``get_server_list`` through the control client),
  so a daemon left by a previous plugin process is adopted, and one that died is restarted.
* Every call is idempotent and blocking (run it in a worker thread). Failures raise
  :class:`~driver.api.errors.PrepareError` with the binary's output and the tail of the
  daemon's log.
* The binary path is a setting so tests run a fake control program.
* Nothing outside the root is touched: a daemon directory that is not strictly below it
  (a checkpoint can name any path) is refused before anything is run, created or removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from driver.api.errors import PrepareError
from driver.api.ids import UID_PATTERN

log = logging.getLogger(f"biaxial.{__name__}")

MIB: Final = 1024 * 1024
FULL_CORES: Final = 100
LOG_TAIL_LINES: Final = 5


def daemon_dir(root: Path, claim_uid: str, device: str) -> Path:
    """The directory of a claim's MPS daemon on one GPU: ``<root>/<claim UID>/<device>``."""
    return root / claim_uid / device


def pipe_dir(directory: Path) -> Path:
    """The pipe directory of the daemon in ``directory`` (what containers mount)."""
    return directory / "pipe"


@dataclass(frozen=True, slots=True)
class MpsDaemon:
    """One control daemon: where it lives, the GPU it serves and the limits it sets.

    ``memory_bytes`` ``None``: no pinned-memory limit; ``cores`` 0 or 100: no thread limit.
    """

    directory: Path
    gpu_uuid: str
    memory_bytes: int | None = None
    cores: int = 0

    @property
    def pipe(self) -> Path:
        return pipe_dir(self.directory)

    @property
    def logs(self) -> Path:
        return self.directory / "log"

    def limit_commands(self) -> tuple[str, ...]:
        """The control commands that set this daemon's limits for the servers it starts."""
        out = []
        if self.memory_bytes is not None:
            out.append(
                f"set_default_device_pinned_mem_limit {self.gpu_uuid} "
                f"{max(self.memory_bytes // MIB, 1)}M"
            )
        if 0 < self.cores < FULL_CORES:
            out.append(f"set_default_active_thread_percentage {self.cores}")
        return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class MpsSettings:
    root: Path  # host directory holding <claim UID>/<device>/{pipe,log}
    control_binary: str = "nvidia-cuda-mps-control"
    command_timeout_s: float = 10.0  # one control command
    stop_timeout_s: float = 10.0  # how long a quit may take to be observed


class MpsManager:
    """Starts, checks, limits and stops the per-claim MPS control daemons."""

    def __init__(self, settings: MpsSettings) -> None:
        self._settings = settings

    @property
    def root(self) -> Path:
        return self._settings.root

    def _env(self, directory: Path, gpu_uuid: str | None) -> dict[str, str]:
        env = {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir(directory)),
            "CUDA_MPS_LOG_DIRECTORY": str(directory / "log"),
        }
        if gpu_uuid is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
        return env

    def _run(
        self, directory: Path, gpu_uuid: str | None, args: list[str], stdin: str
    ) -> subprocess.CompletedProcess[str]:
        what = f"MPS daemon {directory}"
        try:
            return subprocess.run(
                [self._settings.control_binary, *args],
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env(directory, gpu_uuid),
                timeout=self._settings.command_timeout_s,
                check=False,
            )
        except FileNotFoundError as exc:
            raise PrepareError(
                f"{what}: control binary {self._settings.control_binary!r} not found; install "
                "the NVIDIA driver's MPS tools or do not use sharing.strategy mps"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            command = " ".join(args) or stdin.strip()
            raise PrepareError(
                f"{what}: {self._settings.control_binary} {command} did not finish within "
                f"{self._settings.command_timeout_s:g} s"
            ) from exc

    def _log_tail(self, directory: Path) -> str:
        try:
            lines = (directory / "log" / "control.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-LOG_TAIL_LINES:])

    def owns(self, directory: Path) -> bool:
        """Whether ``directory`` is strictly below the root, with no ``..``: the only places
        this manager creates, stops or removes anything (a checkpoint naming another path,
        checksum or not, is never acted on)."""
        return (
            directory.is_absolute()
            and ".." not in directory.parts
            and directory != self.root
            and directory.is_relative_to(self.root)
        )

    def _check_owned(self, directory: Path) -> None:
        if not self.owns(directory):
            raise PrepareError(
                f"MPS daemon directory {str(directory)[:200]!r} is outside the MPS root "
                f"{self.root} (--mps-root); left untouched"
            )

    def is_running(self, directory: Path) -> bool:
        """True when the daemon of ``directory`` answers on its pipe directory."""
        if not pipe_dir(directory).is_dir():
            return False
        return self._run(directory, None, [], "get_server_list\n").returncode == 0

    def ensure_running(self, daemon: MpsDaemon) -> None:
        """Start the daemon unless it already answers, then (re)apply its limits."""
        self._check_owned(daemon.directory)
        if not self.is_running(daemon.directory):
            daemon.pipe.mkdir(parents=True, exist_ok=True)
            daemon.logs.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            proc = self._run(daemon.directory, daemon.gpu_uuid, ["-d"], "")
            if proc.returncode != 0 or not self.is_running(daemon.directory):
                output = (proc.stderr or proc.stdout).strip() or "no output"
                tail = self._log_tail(daemon.directory)
                raise PrepareError(
                    f"MPS daemon for GPU {daemon.gpu_uuid}: did not start (exit "
                    f"{proc.returncode}: {output})" + (f"; its log ends: {tail}" if tail else "")
                )
            log.info(
                "MPS control daemon started for GPU %s in %.0f ms (pipe %s)",
                daemon.gpu_uuid,
                (time.monotonic() - started) * 1000,
                daemon.pipe,
            )
        for command in daemon.limit_commands():
            proc = self._run(daemon.directory, daemon.gpu_uuid, [], f"{command}\n")
            if proc.returncode != 0:
                output = (proc.stderr or proc.stdout).strip() or "no output"
                raise PrepareError(
                    f"MPS daemon for GPU {daemon.gpu_uuid}: {command!r} failed (exit "
                    f"{proc.returncode}: {output})"
                )

    def stop(self, directory: Path) -> None:
        """Ask the daemon of ``directory`` to quit, wait until it no longer answers, and
        remove the directory (its pipes and logs). A directory outside the root is refused
        (:class:`PrepareError`) before anything is run or removed."""
        self._check_owned(directory)
        if self.is_running(directory):
            proc = self._run(directory, None, [], "quit\n")
            deadline = time.monotonic() + self._settings.stop_timeout_s
            while self.is_running(directory):
                if time.monotonic() > deadline:
                    output = (proc.stderr or proc.stdout).strip() or "no output"
                    raise PrepareError(
                        f"MPS daemon {directory}: still answers "
                        f"{self._settings.stop_timeout_s:g} s after quit ({output})"
                    )
                time.sleep(0.05)
            log.info("MPS control daemon %s stopped", directory)
        shutil.rmtree(directory, ignore_errors=True)
        parent = directory.parent
        if parent != self.root and parent.is_relative_to(self.root):
            with contextlib.suppress(OSError):  # not empty: another daemon of the claim
                parent.rmdir()  # the claim's directory, once its last daemon is gone

    def daemon_dirs(self) -> list[Path]:
        """Every daemon directory under the root: ``<claim UID>/<device>`` (and the per-GPU
        ``<GPU UUID>`` of plugin versions before per-claim daemons), sorted."""
        found = []
        try:
            first = sorted(p for p in self.root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []
        for entry in first:
            if pipe_dir(entry).is_dir():
                found.append(entry)
                continue
            found.extend(
                sub for sub in sorted(entry.iterdir()) if sub.is_dir() and pipe_dir(sub).is_dir()
            )
        return found

    def sweep(self, keep: Collection[Path]) -> list[Path]:
        """Stop and remove every daemon directory not in ``keep``; returns those removed. A
        daemon that does not stop is logged and left for the next sweep."""
        removed = []
        for directory in self.daemon_dirs():
            if directory in keep:
                continue
            try:
                self.stop(directory)
            except PrepareError:
                log.warning("MPS daemon %s left over; it did not stop", directory, exc_info=True)
                continue
            log.info("MPS daemon %s belonged to no prepared claim: removed", directory)
            removed.append(directory)
        return removed

    def stop_claim(self, claim_uid: str) -> None:
        """Stop every daemon of one claim (``<root>/<claim UID>/*``), with no checkpoint to
        say which: what Unprepare can still do when the checkpoint is unreadable."""
        if not UID_PATTERN.fullmatch(claim_uid):
            return  # not a UID: nothing of ours can be named by it
        base = self.root / claim_uid
        if not base.is_dir():
            return
        for directory in sorted(p for p in base.iterdir() if p.is_dir()):
            self.stop(directory)
        shutil.rmtree(base, ignore_errors=True)

"""MPS (CUDA Multi-Process Service) control daemons, one per GPU, owned by the kubelet plugin.

Contract:

* Each GPU gets its own daemon, started with ``nvidia-cuda-mps-control -d`` and the environment
  ``CUDA_VISIBLE_DEVICES=<GPU UUID>``, ``CUDA_MPS_PIPE_DIRECTORY=<root>/<uuid>/pipe`` and
  ``CUDA_MPS_LOG_DIRECTORY=<root>/<uuid>/log``. Containers reach it through the pipe directory
  (mounted by the claim's CDI spec).
* The manager keeps no counts in memory: the caller (the Preparer) derives "which GPUs still
  have MPS users" from the checkpoint and calls :meth:`MpsManager.ensure_running` /
  :meth:`MpsManager.stop`, so reference counts survive plugin restarts and are shared by two
  overlapping plugin instances.
* Liveness is asked of the daemon itself (``get_server_list`` through the control client),
  so a daemon left by a previous plugin process is adopted, and one that died is restarted.
* Both calls are idempotent and blocking (run them in a worker thread). Failures raise
  :class:`~driver.api.errors.PrepareError` with the binary's output.
* The binary path is a setting so tests run a fake control program.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from driver.api.errors import PrepareError
from kubeletplugin.cdi import mps_pipe_dir

log = logging.getLogger(f"biaxial.{__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MpsSettings:
    root: Path  # host directory holding <uuid>/pipe and <uuid>/log
    control_binary: str = "nvidia-cuda-mps-control"
    command_timeout_s: float = 10.0  # one control command
    stop_timeout_s: float = 10.0  # how long a quit may take to be observed


class MpsManager:
    """Starts, checks and stops the per-GPU MPS control daemons."""

    def __init__(self, settings: MpsSettings) -> None:
        self._settings = settings

    def pipe_dir(self, gpu_uuid: str) -> Path:
        return mps_pipe_dir(self._settings.root, gpu_uuid)

    def log_dir(self, gpu_uuid: str) -> Path:
        return self._settings.root / gpu_uuid / "log"

    def _env(self, gpu_uuid: str) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu_uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(gpu_uuid)),
        }

    def _run(self, gpu_uuid: str, args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [self._settings.control_binary, *args],
                input=stdin,
                capture_output=True,
                text=True,
                env=self._env(gpu_uuid),
                timeout=self._settings.command_timeout_s,
                check=False,
            )
        except FileNotFoundError as exc:
            raise PrepareError(
                f"MPS for GPU {gpu_uuid}: control binary {self._settings.control_binary!r} not "
                "found; install the NVIDIA driver's MPS tools or do not use sharing.strategy mps"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise PrepareError(
                f"MPS for GPU {gpu_uuid}: {self._settings.control_binary} {' '.join(args)} did "
                f"not finish within {self._settings.command_timeout_s:g} s"
            ) from exc

    def is_running(self, gpu_uuid: str) -> bool:
        """True when the GPU's control daemon answers on its pipe directory."""
        if not self.pipe_dir(gpu_uuid).is_dir():
            return False
        return self._run(gpu_uuid, [], "get_server_list\n").returncode == 0

    def ensure_running(self, gpu_uuid: str) -> None:
        """Start the GPU's daemon unless it is already answering."""
        if self.is_running(gpu_uuid):
            return
        self.pipe_dir(gpu_uuid).mkdir(parents=True, exist_ok=True)
        self.log_dir(gpu_uuid).mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        proc = self._run(gpu_uuid, ["-d"], "")
        if proc.returncode != 0 or not self.is_running(gpu_uuid):
            output = (proc.stderr or proc.stdout).strip() or "no output"
            raise PrepareError(
                f"MPS for GPU {gpu_uuid}: control daemon did not start (exit {proc.returncode}: "
                f"{output}); logs in {self.log_dir(gpu_uuid)}"
            )
        log.info(
            "MPS control daemon started for GPU %s in %.0f ms (pipe %s)",
            gpu_uuid,
            (time.monotonic() - started) * 1000,
            self.pipe_dir(gpu_uuid),
        )

    def stop(self, gpu_uuid: str) -> None:
        """Ask the GPU's daemon to quit and wait until it no longer answers."""
        if not self.is_running(gpu_uuid):
            return
        proc = self._run(gpu_uuid, [], "quit\n")
        deadline = time.monotonic() + self._settings.stop_timeout_s
        while self.is_running(gpu_uuid):
            if time.monotonic() > deadline:
                output = (proc.stderr or proc.stdout).strip() or "no output"
                raise PrepareError(
                    f"MPS for GPU {gpu_uuid}: control daemon still answers "
                    f"{self._settings.stop_timeout_s:g} s after quit ({output})"
                )
            time.sleep(0.05)
        log.info("MPS control daemon stopped for GPU %s", gpu_uuid)

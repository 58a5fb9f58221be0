"""The plugin's task guard (the shared :class:`kubeapi.tasks.TaskGuard`, wired to the plugin's
metrics and health): crashes are logged, counted and reported; shutdown cancels newest first
and survives a task that fails while stopping."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kubeapi.tasks import TaskGuard
from kubeletplugin.app import task_guard
from kubeletplugin.metrics import HealthState, Metrics


def test_a_crash_is_logged_counted_and_makes_the_process_unhealthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[Metrics, HealthState, TaskGuard]:
        metrics, health = Metrics(), HealthState()
        guard = task_guard(metrics, health)

        async def broken() -> None:
            raise RuntimeError("nvml went away")

        guard.start("health", broken())
        await asyncio.wait_for(guard.tripped.wait(), 1)
        await guard.stop(1)
        return metrics, health, guard

    with caplog.at_level(logging.ERROR, logger="biaxial.kubeapi.tasks"):
        metrics, health, _ = asyncio.run(scenario())
    assert "background task health crashed" in caplog.text
    assert "nvml went away" in caplog.text  # the traceback is logged
    assert not health.healthy
    assert health.describe() == "task health: crashed: RuntimeError: nvml went away"
    assert 'biaxial_plugin_task_crashes_total{task="health"} 1.0' in metrics.render().decode()


def test_stop_cancels_newest_first_and_a_failure_while_stopping_is_not_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped: list[str] = []

    async def scenario() -> HealthState:
        health = HealthState()
        guard = task_guard(Metrics(), health)

        async def service(name: str, fail_on_stop: bool = False) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                stopped.append(name)
                if fail_on_stop:
                    raise RuntimeError(f"{name} cleanup failed")

        for name in ("dra", "publisher", "registration"):
            guard.start(name, service(name, fail_on_stop=name == "publisher"))
        await asyncio.sleep(0)
        await guard.stop(1)
        assert not guard.tripped.is_set()
        return health

    with caplog.at_level(logging.ERROR, logger="biaxial.kubeapi.tasks"):
        health = asyncio.run(scenario())
    assert stopped == ["registration", "publisher", "dra"]
    assert "task publisher failed while stopping" in caplog.text
    assert health.healthy  # stopping is not a crash

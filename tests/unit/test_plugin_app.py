"""The plugin's task guard (the shared :class:`kubeapi.tasks.TaskGuard`, wired to the plugin's
metrics and health): crashes are logged, counted and reported; shutdown cancels newest first
and survives a task that fails while stopping."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from driver.discovery.fake import FakeBackend
from driver.discovery.mig import DynamicMigPolicy
from kubeapi.tasks import TaskGuard
from kubeletplugin.app import Plugin, task_guard
from kubeletplugin.metrics import HealthState, Metrics
from kubeletplugin.settings import Settings


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


def test_the_device_table_follows_owned_instances_and_the_metrics_count_mig_slots(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(node_name="n1", fake_gpus="a100-80gbx8-dynmig", state_dir=tmp_path)
    backend = FakeBackend.from_profile("a100-80gbx8-dynmig", node_name="n1")
    plugin = Plugin(settings, backend, backend.discover())
    assert plugin.rebuild(backend.discover())
    assert not plugin.rebuild(backend.discover())  # nothing changed
    gpu = backend.discover()[0]
    made = backend.create_mig(gpu.uuid, "1g.10gb", 6)
    # Not owned yet (no checkpoint says so): a foreign instance, its placements unpublished.
    assert plugin.rebuild(backend.discover())
    assert plugin.devices.published_device("gpu-0") is None
    plugin.owned = lambda: frozenset({(gpu.uuid, "1g.10gb", 6)})
    assert plugin.rebuild(backend.discover())
    assert plugin.devices.published_device("gpu-0") is not None
    assert plugin.devices.health_targets()[made.uuid] == ("gpu-0-mig-1g10gb-6",)
    text = plugin.metrics.render().decode()
    assert "biaxial_plugin_mig_instances 1.0" in text
    assert 'biaxial_plugin_mig_free_memory_slices{gpu="0"} 7.0' in text
    assert 'biaxial_plugin_mig_largest_placeable_slices{gpu="0"} 4.0' in text  # the 4g at 0
    assert 'biaxial_plugin_mig_largest_placeable_slices{gpu="1"} 8.0' in text
    with caplog.at_level(logging.INFO, logger="biaxial"):
        plugin.report_dynamic_mig()
    assert "GPU 0 (NVIDIA A100-SXM4-80GB): dynamic MIG" in caplog.text


def test_a_gpu_selected_for_dynamic_mig_without_mig_mode_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(
        node_name="n1",
        fake_gpus="a100-80gbx8",
        state_dir=tmp_path,
        dynamic_mig=DynamicMigPolicy.parse("all"),
    )
    backend = FakeBackend.from_profile("a100-80gbx8", node_name="n1")
    plugin = Plugin(settings, backend, backend.discover())
    with caplog.at_level(logging.WARNING, logger="biaxial"):
        plugin.report_dynamic_mig()
    assert "has MIG mode disabled; biaxial never changes a GPU's MIG mode" in caplog.text
    assert plugin.rebuild(backend.discover())
    assert not plugin.devices.dynamic_gpus  # published whole, as without the setting

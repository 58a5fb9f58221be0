"""Health state machine (taints, recovery rule), health stream snapshots, legacy resources."""

from __future__ import annotations

import asyncio

import pytest

from driver.discovery.backend import HealthEvent
from kubeletplugin.health import (
    FATAL_XIDS,
    TAINT_KEY,
    HealthBroadcaster,
    HealthTracker,
    truncate_message,
)
from kubeletplugin.noderesources import legacy_resources, node_status_patch
from kubeletplugin.proto.gen import health_v1_pb2, health_v1alpha1_pb2
from kubeletplugin.server import HealthService
from tests.unit.builders import gpu_info

GPUS = (gpu_info(0), gpu_info(1, mig_starts=(0, 1)))  # GPU 1 in MIG mode: MIG-1-0, MIG-1-1


def test_the_fatal_xid_list_is_the_documented_one() -> None:
    assert frozenset({48, 62, 64, 74, 79, 92, 94, 95, 119, 120}) == FATAL_XIDS


@pytest.mark.parametrize(
    ("event", "effect", "reason"),
    [
        (HealthEvent(uuid="GPU-0", kind="lost"), "NoExecute", "lost"),
        (HealthEvent(uuid="GPU-0", kind="xid", xid=79), "NoExecute", "xid-79"),
        (HealthEvent(uuid="GPU-0", kind="xid", xid=63), "NoSchedule", "xid-63"),
    ],
)
def test_events_taint_the_device(event: HealthEvent, effect: str, reason: str) -> None:
    tracker = HealthTracker(GPUS, quiet_s=60)
    assert tracker.apply(event, wall=1_700_000_000, monotonic=5.0)
    (taint,) = tracker.taints()["gpu-0"]
    assert (taint.key, taint.effect, taint.value) == (TAINT_KEY, effect, reason)
    assert taint.time_added == "2023-11-14T22:13:20Z"
    assert tracker.unhealthy_gpus() == {"GPU-0"}
    assert [h.device for h in tracker.unhealthy()] == ["gpu-0"]


def test_non_fatal_xid_clears_after_the_quiet_period_and_a_new_xid_extends_it() -> None:
    tracker = HealthTracker(GPUS, quiet_s=60)
    tracker.apply(HealthEvent(uuid="GPU-0", kind="xid", xid=63), wall=100, monotonic=0)
    tracker.apply(HealthEvent(uuid="GPU-0", kind="xid", xid=63), wall=130, monotonic=30)
    assert tracker.next_deadline() == 90
    assert not tracker.tick(89)
    assert tracker.taints()["gpu-0"][0].time_added == "1970-01-01T00:01:40Z"  # first one kept
    assert tracker.tick(90)
    assert tracker.taints() == {}


def test_fatal_states_need_a_reset_and_are_not_downgraded() -> None:
    tracker = HealthTracker(GPUS, quiet_s=1)
    tracker.apply(HealthEvent(uuid="GPU-0", kind="xid", xid=48), wall=1, monotonic=0)
    tracker.apply(HealthEvent(uuid="GPU-0", kind="xid", xid=63), wall=2, monotonic=1)
    assert not tracker.tick(1_000)
    assert tracker.taints()["gpu-0"][0].effect == "NoExecute"
    # The GPU leaves discovery and comes back (reset): healthy.
    tracker.observe_inventory(GPUS[1:])
    tracker.observe_inventory(GPUS)
    assert tracker.taints() == {}
    # Or the backend says so.
    tracker.apply(HealthEvent(uuid="GPU-0", kind="lost"), wall=3, monotonic=2)
    assert tracker.apply(HealthEvent(uuid="GPU-0", kind="recovered"), wall=4, monotonic=3)
    assert tracker.taints() == {}


def test_gpu_events_cover_its_mig_devices_and_mig_events_only_their_own() -> None:
    tracker = HealthTracker(GPUS)
    tracker.apply(HealthEvent(uuid="MIG-1-1", kind="xid", xid=63), wall=1, monotonic=0)
    assert sorted(tracker.taints()) == ["gpu-1-mig-1g5gb-1"]
    tracker.apply(HealthEvent(uuid="GPU-1", kind="lost"), wall=1, monotonic=0)
    assert sorted(tracker.taints()) == ["gpu-1-mig-1g5gb-0", "gpu-1-mig-1g5gb-1"]
    assert not tracker.apply(HealthEvent(uuid="GPU-9", kind="lost"), wall=1, monotonic=0)


def test_version_moves_only_on_visible_changes() -> None:
    tracker = HealthTracker(GPUS)
    start = tracker.version
    tracker.observe_inventory(GPUS)
    assert tracker.version == start
    tracker.apply(HealthEvent(uuid="GPU-0", kind="lost"), wall=1, monotonic=0)
    assert tracker.version == start + 1
    tracker.apply(HealthEvent(uuid="GPU-0", kind="lost"), wall=2, monotonic=1)
    assert tracker.version == start + 1


def test_messages_are_truncated_to_the_api_limit() -> None:
    assert truncate_message("x" * 1024) == "x" * 1024
    assert truncate_message("x" * 2000) == "x" * 1021 + "..."


@pytest.mark.parametrize("pb", [health_v1_pb2, health_v1alpha1_pb2])
def test_health_snapshot_lists_every_device(pb: object) -> None:
    tracker = HealthTracker(GPUS)
    tracker.apply(
        HealthEvent(uuid="GPU-0", kind="lost", message="off the bus"), wall=1, monotonic=0
    )
    service = HealthService(
        HealthBroadcaster(tracker), pool_name="n1", resend_s=10, check_timeout_s=30
    )
    message = service.snapshot(pb)  # type: ignore[arg-type]
    by_name = {d.device.device_name: d for d in message.devices}
    assert sorted(by_name) == ["gpu-0", "gpu-1-mig-1g5gb-0", "gpu-1-mig-1g5gb-1"]
    assert by_name["gpu-0"].health == 2
    assert "off the bus" in by_name["gpu-0"].message
    assert by_name["gpu-1-mig-1g5gb-0"].health == 1
    assert {d.device.pool_name for d in message.devices} == {"n1"}
    assert {d.health_check_timeout_seconds for d in message.devices} == {30}
    assert all(d.last_updated_time > 0 for d in message.devices)


def test_broadcaster_wakes_waiters_on_change_and_on_close() -> None:
    async def scenario() -> None:
        tracker = HealthTracker(GPUS)
        broadcaster = HealthBroadcaster(tracker)
        seen = tracker.version
        waiter = asyncio.create_task(broadcaster.wait_change(seen, 5))
        await asyncio.sleep(0)
        tracker.apply(HealthEvent(uuid="GPU-0", kind="lost"), wall=1, monotonic=0)
        await broadcaster.notify()
        assert await asyncio.wait_for(waiter, 1) == seen + 1
        assert await broadcaster.wait_change(seen + 1, 0.01) == seen + 1  # timeout
        closing = asyncio.create_task(broadcaster.wait_change(seen + 1, 5))
        await asyncio.sleep(0)
        await broadcaster.close()
        await asyncio.wait_for(closing, 1)
        assert broadcaster.closed

    asyncio.run(scenario())


def test_legacy_resources_count_healthy_gpus_in_capacity_and_allocatable() -> None:
    assert legacy_resources(GPUS) == {
        "nvidia.com/gpumem": str(2 * 40960),
        "nvidia.com/gpucores": "200",
    }
    healthy_only = {"nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "100"}
    assert node_status_patch(GPUS, unhealthy={"GPU-1"}) == {
        "status": {"capacity": healthy_only, "allocatable": healthy_only}
    }
    assert legacy_resources([]) == {"nvidia.com/gpumem": "0", "nvidia.com/gpucores": "0"}

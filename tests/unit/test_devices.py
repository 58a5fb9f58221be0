"""The node's one device table: names, order, the MIG-enabled parent, health targets; and the
pin that the slice builder, Prepare and health treat a MIG-enabled parent GPU alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from driver.api.errors import PrepareError
from driver.discovery.backend import HealthEvent
from driver.discovery.devices import DeviceTable, gpu_device_name, mig_device_name
from driver.discovery.gpus import GpuInfo
from driver.discovery.slices import build_slices
from kubeletplugin.health import HealthTracker
from kubeletplugin.prepare import ClaimRef, PrepareSettings, plan_claim
from tests.unit.builders import gpu_info

MIB = 1024 * 1024
NODE = "gpu-node"
DRIVER = "gpu.biaxial.dev"


def gpu(minor: int, *, mig_starts: tuple[int, ...] | None = None) -> GpuInfo:
    return gpu_info(minor, mig_starts=mig_starts)


# GPU 1 is in MIG mode (partitions at 3 and 0, out of order); GPUs 0 and 2 are whole.
GPUS = (gpu(2), gpu(1, mig_starts=(3, 0)), gpu(0))
PARENT = "gpu-1"
PARTITIONS = ("gpu-1-mig-1g5gb-0", "gpu-1-mig-1g5gb-3")


def test_every_device_in_publishing_order_with_the_contract_names() -> None:
    table = DeviceTable.from_gpus(GPUS)
    assert [(d.name, d.kind, d.published, d.shareable) for d in table.devices] == [
        ("gpu-0", "gpu", True, True),
        ("gpu-1", "gpu", False, False),
        ("gpu-1-mig-1g5gb-0", "mig", True, False),
        ("gpu-1-mig-1g5gb-3", "mig", True, False),
        ("gpu-2", "gpu", True, True),
    ]
    assert gpu_device_name(7) == "gpu-7"
    assert mig_device_name(1, "1g.5gb", 3) == "gpu-1-mig-1g5gb-3"


def test_a_partition_knows_its_parent_and_physical_gpu() -> None:
    table = DeviceTable.from_gpus(GPUS)
    part = table.get("gpu-1-mig-1g5gb-3")
    assert part is not None
    assert (part.uuid, part.parent, part.parent_uuid, part.physical_uuid) == (
        "MIG-1-3",
        PARENT,
        "GPU-1",
        "GPU-1",
    )
    assert (part.minor, part.pci_bus_id, part.memory_bytes, part.multiprocessors) == (
        1,
        "0000:11:00.0",
        4864 * MIB,
        14,
    )
    whole = table.get("gpu-2")
    assert whole is not None
    assert (whole.uuid, whole.parent, whole.parent_uuid, whole.memory_bytes) == (
        "GPU-2",
        None,
        "",
        40960 * MIB,
    )


def test_the_unpublished_parent_is_known_but_not_a_device_to_give() -> None:
    table = DeviceTable.from_gpus(GPUS)
    assert table.get(PARENT) is not None
    assert table.published_device(PARENT) is None
    assert table.published_device(PARTITIONS[0]) is not None
    assert table.published_device("gpu-9") is None


def test_health_targets_map_a_gpu_to_its_published_devices() -> None:
    assert DeviceTable.from_gpus(GPUS).health_targets() == {
        "GPU-0": ("gpu-0",),
        "GPU-1": PARTITIONS,
        "MIG-1-0": (PARTITIONS[0],),
        "MIG-1-3": (PARTITIONS[1],),
        "GPU-2": ("gpu-2",),
    }


def test_same_gpus_in_any_order_give_an_equal_table() -> None:
    assert DeviceTable.from_gpus(GPUS) == DeviceTable.from_gpus(reversed(GPUS))
    assert DeviceTable.of(DeviceTable.from_gpus(GPUS)) == DeviceTable.of(GPUS)
    assert DeviceTable.from_gpus(GPUS) != DeviceTable.from_gpus(GPUS[:2])


def test_a_mig_enabled_gpu_without_partitions_publishes_nothing() -> None:
    table = DeviceTable.from_gpus([gpu(0, mig_starts=())])
    assert table.published == ()
    assert table.health_targets() == {"GPU-0": ()}


# ------------------------------------------------------------------ one answer, three readers


def _claim(device: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "default", "uid": "uid-c"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                    ]
                }
            }
        },
    }


@pytest.mark.parametrize("inventory", ["gpus", "table"])
def test_a_mig_enabled_parent_is_treated_alike_by_slices_prepare_and_health(
    inventory: str,
) -> None:
    table = DeviceTable.from_gpus(GPUS)
    given: DeviceTable | tuple[GpuInfo, ...] = table if inventory == "table" else GPUS
    # Slices: the parent is not published, its partitions are.
    published = [d.name for s in build_slices(given, node_name=NODE) for d in s.devices]
    assert PARENT not in published
    assert set(PARTITIONS) <= set(published)
    assert published == [d.name for d in table.published]
    # Prepare: not published, so not a prepare target; its partitions are.
    settings = PrepareSettings(node_name=NODE, state_dir=Path("/nonexistent"))
    ref = ClaimRef(namespace="default", uid="uid-c", name="c")
    with pytest.raises(PrepareError, match=f"unknown device '{PARENT}'"):
        plan_claim(ref, _claim(PARENT), settings, table)
    plan = plan_claim(ref, _claim(PARTITIONS[1]), settings, table)
    assert [(d.device, d.gpu_uuid, d.exclusive) for d in plan.devices] == [
        (PARTITIONS[1], "MIG-1-3", True)
    ]
    # Health: an event on the parent's UUID taints exactly its published partitions, and the
    # taints name devices the slice builder publishes.
    tracker = HealthTracker(given)
    assert tracker.apply(HealthEvent(uuid="GPU-1", kind="lost"), wall=1.0, monotonic=1.0)
    assert [h.device for h in tracker.unhealthy()] == list(PARTITIONS)
    tainted = build_slices(given, node_name=NODE, taints=tracker.taints())
    assert {d.name for s in tainted for d in s.devices if d.taints} == set(PARTITIONS)


def test_turning_mig_on_moves_every_reader_from_the_gpu_to_its_partitions() -> None:
    whole = DeviceTable.from_gpus([gpu(1)])
    split = DeviceTable.from_gpus([gpu(1, mig_starts=(0, 3))])
    tracker = HealthTracker(whole)
    tracker.observe_inventory(split)
    assert [h.device for h in tracker.devices()] == list(PARTITIONS)
    assert [d.name for d in split.published] == list(PARTITIONS)
    assert [d.name for s in build_slices(split, node_name=NODE) for d in s.devices] == list(
        PARTITIONS
    )

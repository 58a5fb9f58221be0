"""Dynamic MIG on the node side: the policy, the geometry, the device table's dynamic branch and
the published pool (counters, limits, names equal to static MIG's, strict validation)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from driver.api.errors import ConfigError, ValidationError
from driver.api.model import CounterSet, Device, Pool, ResourceSlice
from driver.api.quantity import Quantity
from driver.api.validation import validate_pool
from driver.discovery.backend import open_backend
from driver.discovery.devices import DeviceTable
from driver.discovery.fake import FakeBackend
from driver.discovery.mig import (
    DynamicMigPolicy,
    MigGeometry,
    counter_set_name,
    placements,
    unusable_reason,
)
from driver.discovery.slices import build_slices
from tests.emulator.kinds import RESOURCE_SLICE
from tests.emulator.validation import semantic_check
from tests.validate_manifests import validate_object

NODE = "dyn-node"


def dynamic(profile: str = "a100-80gbx8-dynmig") -> tuple[FakeBackend, DynamicMigPolicy]:
    backend = FakeBackend.from_profile(profile, node_name=NODE)
    return backend, DynamicMigPolicy(gpus=backend.dynamic_mig)


def table(profile: str = "a100-80gbx8-dynmig", **kw: object) -> DeviceTable:
    backend, policy = dynamic(profile)
    return DeviceTable.from_gpus(backend.discover(), policy, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- policy


@pytest.mark.parametrize(
    ("text", "everywhere", "models"),
    [
        ("", False, frozenset()),
        ("off", False, frozenset()),
        ("all", True, frozenset()),
        (
            "NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3",
            False,
            frozenset({"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"}),
        ),
    ],
)
def test_the_setting_is_off_all_or_models(text: str, everywhere: bool, models: object) -> None:
    policy = DynamicMigPolicy.parse(text)
    assert (policy.everywhere, policy.models) == (everywhere, models)


def test_an_empty_model_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="without empty entries"):
        DynamicMigPolicy.parse("NVIDIA A100-SXM4-80GB,,")


def test_a_gpu_must_be_in_mig_mode_already() -> None:
    plain = open_backend("a100-80gbx8").discover()[0]
    assert DynamicMigPolicy.parse("all").selects(plain)
    assert not DynamicMigPolicy.parse("all").dynamic(plain)
    reason = unusable_reason(plain)
    assert reason is not None
    assert "biaxial never changes a GPU's MIG mode" in reason
    assert "nvidia-smi -i 0 -mig 1" in reason
    t4 = open_backend("t4x4").discover()[0]
    assert unusable_reason(t4) == "GPU 0 (Tesla T4) is not MIG-capable"


def test_models_select_by_product_name() -> None:
    backend, _ = dynamic()
    gpu = backend.discover()[0]
    assert DynamicMigPolicy.parse("NVIDIA A100-SXM4-80GB").dynamic(gpu)
    assert not DynamicMigPolicy.parse("NVIDIA H100 80GB HBM3").dynamic(gpu)


# --------------------------------------------------------------------------- geometry


def test_a100_geometry_counts_slots_compute_and_engines() -> None:
    backend, _ = dynamic()
    geometry = MigGeometry.of(backend.discover()[0])
    assert geometry.full.name == "7g.80gb"
    assert geometry.totals == {
        **{f"memory-slice-{i}": 1 for i in range(8)},
        "compute-slices": 7,
        "decoders": 5,
        "jpeg-engines": 1,
        "ofa-engines": 1,
    }
    by_name = {(p.profile.name, p.start): p for p in geometry.placements}
    assert geometry.consumes(by_name[("3g.40gb", 4)]) == {
        "memory-slice-4": 1,
        "memory-slice-5": 1,
        "memory-slice-6": 1,
        "memory-slice-7": 1,
        "compute-slices": 3,
        "decoders": 2,
    }
    # The +me twin takes the engines only one instance can have.
    assert geometry.consumes(by_name[("1g.10gb+me", 2)]) == {
        "memory-slice-2": 1,
        "compute-slices": 1,
        "decoders": 1,
        "jpeg-engines": 1,
        "ofa-engines": 1,
    }
    assert geometry.consumes(by_name[("1g.10gb", 2)]) == {"memory-slice-2": 1, "compute-slices": 1}


def test_every_valid_placement_once_in_publishing_order() -> None:
    backend, _ = dynamic()
    found = [(p.profile.name, p.start) for p in placements(backend.discover()[0])]
    assert len(found) == 7 + 7 + 4 + 3 + 2 + 1 + 1
    assert found[:7] == [
        ("7g.80gb", 0),
        ("4g.40gb", 0),
        ("3g.40gb", 0),
        ("2g.20gb", 0),
        ("1g.20gb", 0),
        ("1g.10gb", 0),
        ("1g.10gb+me", 0),
    ]
    assert [s for _, s in found] == sorted(s for _, s in found)


# --------------------------------------------------------------------------- device table


def test_a_dynamic_gpu_is_whole_plus_every_placement_with_static_names() -> None:
    devices = table()
    gpu0 = [d for d in devices.devices if d.gpu.minor == 0]
    assert len(gpu0) == 26
    whole = gpu0[0]
    assert (whole.name, whole.kind, whole.published, whole.shareable) == ("gpu-0", "gpu", 1, 1)
    assert whole.placement is not None
    assert whole.placement.profile.name == "7g.80gb"
    assert whole.memory_bytes == 80896 * 1024 * 1024  # the full-size instance that backs it
    names = {d.name for d in gpu0}
    assert {"gpu-0-mig-1g10gb-6", "gpu-0-mig-1g10gbme-0", "gpu-0-mig-7g80gb-0"} <= names
    mig = devices.published_device("gpu-0-mig-3g40gb-4")
    assert mig is not None
    assert mig.dynamic
    assert mig.mig is None
    assert (mig.uuid, mig.profile, mig.parent_uuid) == ("", "3g.40gb", whole.gpu.uuid)
    assert devices.dynamic_gpus == tuple(d.gpu for d in devices.devices if d.kind == "gpu")


def test_the_same_gpus_without_the_policy_stay_static() -> None:
    backend, _ = dynamic()
    devices = DeviceTable.from_gpus(backend.discover())
    assert not devices.published  # MIG mode, no partitions, not dynamic: nothing to give
    assert not devices.dynamic_gpus


def test_an_instance_biaxial_created_backs_its_placement() -> None:
    backend, policy = dynamic()
    gpu = backend.discover()[0]
    made = backend.create_mig(gpu.uuid, "2g.20gb", 2)
    owned = [(gpu.uuid, "2g.20gb", 2)]
    devices = DeviceTable.from_gpus(backend.discover(), policy, owned)
    device = devices.published_device("gpu-0-mig-2g20gb-2")
    assert device is not None
    assert device.mig == made
    assert device.uuid == device.container_uuid == made.uuid
    assert devices.published_device("gpu-0") is not None  # counters keep them apart
    assert devices.health_targets()[made.uuid] == ("gpu-0-mig-2g20gb-2",)


def test_a_foreign_instance_makes_every_overlapping_placement_unavailable() -> None:
    backend, policy = dynamic()
    gpu = backend.discover()[0]
    foreign = backend.create_mig(gpu.uuid, "2g.20gb", 2)  # not in the checkpoint: not ours
    devices = DeviceTable.from_gpus(backend.discover(), policy)
    published = {d.name for d in devices.published if d.gpu.minor == 0}
    assert "gpu-0" not in published
    assert not any(n.endswith(("-2", "-3")) for n in published)  # slots 2 and 3
    assert "gpu-0-mig-4g40gb-0" not in published
    assert "gpu-0-mig-7g80gb-0" not in published
    assert {"gpu-0-mig-1g10gb-1", "gpu-0-mig-3g40gb-4", "gpu-0-mig-2g20gb-4"} <= published
    listed = devices.get("gpu-0-mig-2g20gb-2")
    assert listed is not None
    assert listed.mig == foreign
    assert not listed.published
    # A GPU's event still reaches every published device on it; the foreign one's reaches none.
    assert devices.health_targets()[foreign.uuid] == ()


def test_the_whole_gpu_knows_its_full_instance_once_created() -> None:
    backend, policy = dynamic()
    gpu = backend.discover()[0]
    full = backend.create_mig(gpu.uuid, "7g.80gb", 0)
    devices = DeviceTable.from_gpus(backend.discover(), policy, [(gpu.uuid, "7g.80gb", 0)])
    whole = devices.published_device("gpu-0")
    assert whole is not None
    assert whole.mig == full
    assert (whole.uuid, whole.container_uuid) == (gpu.uuid, full.uuid)
    # The full-size instance is also what the 7g.80gb placement stands for: one hardware thing.
    assert devices.health_targets()[full.uuid] == ("gpu-0", "gpu-0-mig-7g80gb-0")


# --------------------------------------------------------------------------- the pool


@pytest.mark.parametrize("profile", ["a100-80gbx8-dynmig", "h100-80gbx8-dynmig"])
def test_an_8_gpu_dynamic_node_stays_within_the_api_limits(profile: str) -> None:
    slices = build_slices(table(profile), node_name=NODE, node_uid="uid-1")
    device_slices = [s for s in slices if s.devices]
    counter_slices = [s for s in slices if s.shared_counters]
    assert all(not (s.devices and s.shared_counters) for s in slices)
    assert all(len(s.devices) <= 64 for s in device_slices)
    assert all(len(s.shared_counters) <= 8 for s in counter_slices)
    assert sum(len(s.devices) for s in slices) == 8 * 26
    assert [c.name for s in counter_slices for c in s.shared_counters] == [
        counter_set_name(i) for i in range(8)
    ]
    for s in slices:
        for device in s.devices:
            assert len(device.consumes_counters) == 1
            assert all(len(c.counters) <= 32 for c in device.consumes_counters)
    assert {s.pool.resource_slice_count for s in slices} == {len(slices)}


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_dynamic_slices_validate_strictly_and_pass_the_api_servers_checks(version: str) -> None:
    for resource_slice in build_slices(table(), node_name=NODE, node_uid="uid-1"):
        body = resource_slice.to_api()
        assert validate_object(body, version) == []
        semantic_check(RESOURCE_SLICE, body)


def test_sixteen_dynamic_gpus_need_two_counter_slices() -> None:
    backend, _ = dynamic()
    base = backend.discover()
    gpus = [
        replace(g, uuid=f"{g.uuid}-{k}", minor=g.minor + 8 * k, index=g.index + 8 * k)
        for k in (0, 1)
        for g in base
    ]
    policy = DynamicMigPolicy(gpus=frozenset(g.uuid for g in gpus))
    slices = build_slices(DeviceTable.from_gpus(gpus, policy), node_name=NODE)
    assert [len(s.shared_counters) for s in slices if s.shared_counters] == [8, 8]
    validate_pool(slices)


def test_placement_devices_look_like_static_mig_but_for_the_uuid() -> None:
    backend = open_backend("h100-80gbx8", node_name=NODE)
    static_gpu = backend.discover()[7]  # 3g.40gb at 0, 2g.20gb at 4, 1g.10gb at 6
    static = {
        d.name: d for s in build_slices(backend.discover(), node_name=NODE) for d in s.devices
    }
    dyn_backend, policy = dynamic("h100-80gbx8-dynmig")
    dyn_gpu = replace(dyn_backend.discover()[7], uuid=static_gpu.uuid)
    published = {
        d.name: d
        for s in build_slices(
            DeviceTable.from_gpus([dyn_gpu], DynamicMigPolicy(gpus=frozenset({dyn_gpu.uuid}))),
            node_name=NODE,
        )
        for d in s.devices
    }
    for name in ("gpu-7-mig-3g40gb-0", "gpu-7-mig-2g20gb-4", "gpu-7-mig-1g10gb-6"):
        mine, theirs = published[name], static[name]
        assert {k: v for k, v in theirs.attributes.items() if k != "uuid"} == {
            k: v for k, v in mine.attributes.items() if k != "dynamicMig"
        }
        assert mine.attributes["dynamicMig"] is True
        assert mine.capacity == theirs.capacity
        assert not mine.allow_multiple_allocations
    assert policy.gpus  # the profile declared its GPUs


def _pool_with(device: Device, counters: tuple[CounterSet, ...]) -> list[ResourceSlice]:
    pool = Pool(name="p", generation=1, resource_slice_count=2)
    return [
        ResourceSlice(
            name="s0", driver="d.example.com", pool=pool, devices=(device,), node_name="n"
        ),  # type: ignore[arg-type]
        ResourceSlice(
            name="s1", driver="d.example.com", pool=pool, shared_counters=counters, node_name="n"
        ),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(
    ("consumes", "message"),
    [
        (CounterSet("nope", {"a": Quantity.from_int(1)}), "which no slice of the pool defines"),
        (CounterSet("set", {"b": Quantity.from_int(1)}), "counter set 'set' lacks"),
    ],
)
def test_the_pool_must_define_what_devices_consume(consumes: CounterSet, message: str) -> None:
    device = Device(name="dev", consumes_counters=(consumes,))
    with pytest.raises(ValidationError, match=message):
        validate_pool(_pool_with(device, (CounterSet("set", {"a": Quantity.from_int(1)}),)))


def test_a_counter_set_name_is_unique_in_the_pool() -> None:
    pool = Pool(name="p", generation=1, resource_slice_count=2)
    sets = (CounterSet("set", {"a": Quantity.from_int(1)}),)
    slices = [
        ResourceSlice(
            name=f"s{i}", driver="d.example.com", pool=pool, shared_counters=sets, node_name="n"
        )  # type: ignore[arg-type]
        for i in (0, 1)
    ]
    with pytest.raises(ValidationError, match="counter set 'set' appears twice"):
        validate_pool(slices)


def test_a_gpu_with_foreign_instances_publishes_its_counter_set_for_the_rest() -> None:
    backend, policy = dynamic()
    gpus = backend.discover()
    backend.create_mig(gpus[0].uuid, "7g.80gb", 0)  # the whole GPU, not ours: nothing left
    backend.create_mig(gpus[1].uuid, "1g.10gb", 0)
    slices = build_slices(DeviceTable.from_gpus(backend.discover(), policy), node_name=NODE)
    sets = [c.name for s in slices for c in s.shared_counters]
    assert sets == [counter_set_name(i) for i in range(1, 8)]  # GPU 0 publishes nothing
    names = {d.name for s in slices for d in s.devices}
    assert not any(n.startswith("gpu-0") for n in names)
    validate_pool(slices)

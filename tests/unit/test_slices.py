"""The ResourceSlice builder: contract attributes and capacities value by value, MIG devices,
slice splitting, determinism, strict schema validity, and the semantic API-limit checks."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.api.claims import AllocationResult, DeviceClass
from driver.api.errors import QuantityError, ValidationError
from driver.api.ids import DriverName, PoolName
from driver.api.model import (
    Capacity,
    CounterSet,
    Device,
    DeviceTaint,
    Pool,
    RequestPolicy,
    ResourceSlice,
    ValidRange,
    Version,
)
from driver.api.nodes import Node
from driver.api.quantity import Quantity
from driver.api.validation import validate_pool, validate_slice
from driver.discovery.backend import open_backend
from driver.discovery.devices import mig_device_name
from driver.discovery.fake import builtin_profiles, parse_profile
from driver.discovery.gpus import GpuInfo
from driver.discovery.slices import build_slices, normalize_version, slice_name
from driver.structured.allocator import allocate
from driver.structured.snapshot import ClusterSnapshot
from tests.unit.builders import ClaimBuilder, claim
from tests.validate_manifests import validate_object

MIB = 1024 * 1024
GPU_CLASS_FILE = Path(__file__).parents[2] / "deviceclasses" / "gpu.biaxial.dev.yaml"


def gpus_of(profile: str, node: str = "node-a") -> tuple[GpuInfo, ...]:
    return open_backend(profile, node_name=node).discover()


def synthetic(count: int, **model: object) -> tuple[GpuInfo, ...]:
    raw = {
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4",
        "model": {
            "productName": "Tesla T4",
            "brand": "Nvidia",
            "architecture": "Turing",
            "cudaComputeCapability": "7.5",
            "memoryMiB": 15360,
            "multiprocessors": 40,
            "migCapable": False,
            **model,
        },
        "count": count,
    }
    return parse_profile(raw, name="synthetic", node_name="big").gpus


# --------------------------------------------------------------------------- contract values


def test_t4_node_publishes_the_contract_value_by_value() -> None:
    gpus = gpus_of("t4x4", "gpu-t4")
    (resource_slice,) = build_slices(gpus, node_name="gpu-t4", node_uid="uid-1")
    api = resource_slice.to_api()
    assert api["apiVersion"] == "resource.k8s.io/v1"
    assert api["kind"] == "ResourceSlice"
    assert api["metadata"] == {
        "name": "gpu-t4-gpu.biaxial.dev-00",
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": "gpu-t4",
                "uid": "uid-1",
                "controller": True,
            }
        ],
    }
    spec = api["spec"]
    assert spec["driver"] == "gpu.biaxial.dev"
    assert spec["pool"] == {"name": "gpu-t4", "generation": 1, "resourceSliceCount": 1}
    assert spec["nodeName"] == "gpu-t4"
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    for i, (device, gpu) in enumerate(zip(spec["devices"], gpus, strict=True)):
        assert device["attributes"] == {
            "architecture": {"string": "Turing"},
            "brand": {"string": "Nvidia"},
            "cudaComputeCapability": {"version": "7.5.0"},
            "cudaDriverVersion": {"version": "12.4.0"},
            "driverVersion": {"version": "550.54.15"},
            "index": {"int": i},
            "minor": {"int": i},
            "multiprocessors": {"int": 40},
            "productName": {"string": "Tesla T4"},
            "resource.kubernetes.io/numaNode": {"int": 0},
            "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
        }
        assert device["capacity"] == {
            "cores": {
                "value": "100",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "1"},
                },
            },
            "memory": {
                "value": "15Gi",
                "requestPolicy": {
                    "default": "15Gi",
                    "validRange": {"min": "1Mi", "max": "15Gi", "step": "1Mi"},
                },
            },
        }
        assert device["allowMultipleAllocations"] is True
        assert "taints" not in device


def test_the_share_cap_is_a_third_capacity_each_allocation_consumes_one_of() -> None:
    (resource_slice,) = build_slices(gpus_of("t4x4"), node_name="gpu-t4", max_shares=10)
    for device in resource_slice.to_api()["spec"]["devices"]:
        assert device["capacity"]["shares"] == {
            "value": "10",
            "requestPolicy": {"default": "1", "validValues": ["1"]},
        }
        # memory and cores keep their meaning
        assert device["capacity"]["memory"]["value"] == "15Gi"
        assert device["capacity"]["cores"]["value"] == "100"
    # MIG partitions are exclusive: no shares to count.
    mig = [d for s in build_slices(gpus_of("h100-80gbx8"), node_name="n", max_shares=4)
           for d in s.devices if not d.allow_multiple_allocations]  # fmt: skip
    assert mig
    assert all("shares" not in d.capacity for d in mig)
    with pytest.raises(ValidationError, match="share cap must be at least 1, got 0"):
        build_slices(gpus_of("t4x4"), node_name="gpu-t4", max_shares=0)


def _allocate_shares(
    max_shares: int | None, claims: list[ClaimBuilder], held: list[ClaimBuilder] = ()
) -> list[AllocationResult] | None:
    gpus = synthetic(1)
    slices = build_slices(gpus, node_name="big", max_shares=max_shares)
    gpu_class = DeviceClass.from_api(yaml.safe_load(GPU_CLASS_FILE.read_text(encoding="utf-8")))
    snapshot = ClusterSnapshot.build(slices, [gpu_class], [c.model() for c in held])
    node = Node.from_api({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "big"}})
    return allocate(snapshot, [c.model() for c in claims], node)


def _share(name: str, **capacity: str) -> ClaimBuilder:
    return claim(name).request("gpu", cls="gpu.biaxial.dev", capacity={"memory": "1Gi", **capacity})


def test_any_consumable_capacity_allocator_stops_at_the_published_cap() -> None:
    """The cap needs nothing biaxial-specific from the scheduler: upstream's allocator
    (KEP-5075, ``calculateConsumedCapacity``) consumes a capacity's ``requestPolicy.default``
    when the request names none, rejects a device when allocated + allocating + consumed
    exceeds the capacity's value (``CmpRequestOverCapacity``), and rejects a request outside
    ``validValues`` (``violatesPolicy``); biaxial's allocator implements those same rules."""
    three = [_share("c0"), _share("c1"), _share("c2")]
    assert _allocate_shares(None, three) is not None  # no cap: 3 x 1Gi fit on 15Gi
    assert _allocate_shares(2, three) is None
    placed = _allocate_shares(2, three[:2])
    assert placed is not None
    assert [str(r.results[0].consumed_capacity["shares"]) for r in placed] == ["1", "1"]
    held = [_share(f"c{i}").allocated(result.to_api()) for i, result in enumerate(placed)]
    assert _allocate_shares(2, [_share("late")], held) is None
    assert _allocate_shares(3, [_share("late")], held) is not None
    # A claim cannot take several shares at once, nor dodge the count with zero.
    assert _allocate_shares(10, [_share("greedy", shares="2")]) is None
    zero = _allocate_shares(10, [_share("zero", shares="0")])
    assert zero is not None
    assert str(zero[0].results[0].consumed_capacity["shares"]) == "1"


def test_a10g_memory_and_versions() -> None:
    (resource_slice,) = build_slices(gpus_of("a10gx4"), node_name="gpu-a10g")
    device = resource_slice.devices[0]
    assert str(device.capacity["memory"].value) == "23028Mi"
    assert device.capacity["memory"].value.value() == 23028 * MIB
    assert device.attributes["driverVersion"] == Version("535.104.5")
    assert device.attributes["cudaDriverVersion"] == Version("12.2.0")
    assert device.attributes["cudaComputeCapability"] == Version("8.6.0")
    assert resource_slice.owner_references == ()


def test_attributes_missing_topology_are_left_out() -> None:
    (resource_slice,) = build_slices(synthetic(1), node_name="n")
    attrs = resource_slice.devices[0].attributes
    assert not {k for k in attrs if k.startswith("resource.kubernetes.io/")}


def test_devices_publishing_equal_capacities_share_one_parsed_map() -> None:
    policy = {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}
    published = {"cores": {"value": "100", "requestPolicy": policy}, "memory": {"value": "15Gi"}}
    first = Device.from_api({"name": "gpu-0", "capacity": published})
    again = Device.from_api({"name": "gpu-1", "capacity": json.loads(json.dumps(published))})
    other = Device.from_api(
        {"name": "gpu-2", "capacity": {**published, "memory": {"value": "16Gi"}}}
    )
    assert again.capacity is first.capacity
    assert other.capacity is not first.capacity
    assert other.capacity["memory"].value == Quantity.parse("16Gi")


@pytest.mark.parametrize(
    "capacity",
    [
        {"memory": {"value": True}},
        {"memory": {"value": "1", "requestPolicy": {"default": True}}},
        {"memory": {"value": "1", "requestPolicy": {"validValues": [True]}}},
    ],
)
def test_a_boolean_capacity_is_refused_after_an_equal_number_was_parsed(
    capacity: dict[str, Any],
) -> None:
    for number in (
        {"memory": {"value": 1}},
        {"memory": {"value": "1", "requestPolicy": {"default": 1}}},
        {"memory": {"value": "1", "requestPolicy": {"validValues": [1]}}},
    ):
        Device.from_api({"name": "gpu-0", "capacity": number})  # (True == 1 in Python)
    with pytest.raises(QuantityError, match="a boolean is not a quantity"):
        Device.from_api({"name": "gpu-1", "capacity": capacity})


def test_memory_is_published_in_whole_mib() -> None:
    gpu = dataclasses.replace(synthetic(1)[0], memory_bytes=15360 * MIB + 12345)
    (resource_slice,) = build_slices([gpu], node_name="n")
    assert str(resource_slice.devices[0].capacity["memory"].value) == "15Gi"


@pytest.mark.parametrize(
    ("raw", "semver"),
    [
        ("12.4", "12.4.0"),
        ("535.104.05", "535.104.5"),
        ("550.54.15", "550.54.15"),
        ("7.5", "7.5.0"),
        ("12", "12.0.0"),
        ("v1.2.3", "1.2.3"),
        ("1.2.3.4", "1.2.3+4"),
        ("1.0.0-rc.1", "1.0.0-rc.1"),
        ("570.00.007", "570.0.7"),
    ],
)
def test_normalize_version(raw: str, semver: str) -> None:
    assert normalize_version(raw) == semver


@pytest.mark.parametrize("raw", ["", "abc", "1..2", "1.2.x"])
def test_normalize_version_rejects_non_versions(raw: str) -> None:
    with pytest.raises(ValidationError, match="semver"):
        normalize_version(raw)


# --------------------------------------------------------------------------- MIG


def test_mig_partitions_replace_their_parent() -> None:
    gpus = gpus_of("h100-80gbx8")
    (resource_slice,) = build_slices(gpus, node_name="dgx")
    names = [d.name for d in resource_slice.devices]
    assert names[:6] == [f"gpu-{i}" for i in range(6)]
    assert "gpu-6" not in names
    assert "gpu-7" not in names
    assert names[6:] == [f"gpu-6-mig-1g10gb-{s}" for s in range(7)] + [
        "gpu-7-mig-3g40gb-0",
        "gpu-7-mig-2g20gb-4",
        "gpu-7-mig-1g10gb-6",
    ]
    by_name = {d.name: d for d in resource_slice.devices}
    mig = by_name["gpu-7-mig-3g40gb-0"]
    parent = gpus[7]
    assert not mig.allow_multiple_allocations
    assert mig.attributes["type"] == "mig"
    assert mig.attributes["profile"] == "3g.40gb"
    assert mig.attributes["parentUUID"] == parent.uuid
    assert mig.attributes["uuid"] == parent.mig_devices[0].uuid
    assert mig.attributes["multiprocessors"] == 60
    assert mig.attributes["minor"] == 7
    assert mig.attributes["index"] == 7
    assert mig.attributes["resource.kubernetes.io/pciBusID"] == parent.pci_bus_id
    assert mig.capacity == {
        "memory": Capacity(value=Quantity.parse("40448Mi")),
        "cores": Capacity(value=Quantity.from_int(45)),  # 100 * 60 // 132
    }
    assert by_name["gpu-7-mig-2g20gb-4"].capacity["cores"].value == Quantity.from_int(24)
    assert by_name["gpu-6-mig-1g10gb-3"].capacity["cores"].value == Quantity.from_int(12)


def test_mig_device_name_drops_every_non_alphanumeric() -> None:
    assert mig_device_name(0, "1g.5gb", 3) == "gpu-0-mig-1g5gb-3"
    assert mig_device_name(2, "1g.10gb+me", 0) == "gpu-2-mig-1g10gbme-0"
    assert mig_device_name(1, "1c.3g.20gb", 4) == "gpu-1-mig-1c3g20gb-4"


# --------------------------------------------------------------------------- splitting


def test_150_gpus_split_into_two_slices_of_one_pool() -> None:
    slices = build_slices(synthetic(150), node_name="big", generation=3)
    assert [len(s.devices) for s in slices] == [128, 22]
    assert [s.name for s in slices] == ["big-gpu.biaxial.dev-00", "big-gpu.biaxial.dev-01"]
    assert {s.pool for s in slices} == {Pool(name="big", generation=3, resource_slice_count=2)}
    names = [d.name for s in slices for d in s.devices]
    assert names == [f"gpu-{i}" for i in range(150)]
    assert sorted(slices, key=lambda s: s.name) == slices


def test_taints_lower_the_limit_to_64_devices_per_slice() -> None:
    taint = DeviceTaint(key="gpu.biaxial.dev/unhealthy", value="xid-79", effect="NoSchedule")
    slices = build_slices(synthetic(150), node_name="big", taints={"gpu-7": (taint,)})
    assert [len(s.devices) for s in slices] == [64, 64, 22]
    assert {s.pool.resource_slice_count for s in slices} == {3}
    tainted = [d for s in slices for d in s.devices if d.taints]
    assert [(d.name, d.taints) for d in tainted] == [("gpu-7", (taint,))]
    assert slices[0].to_api()["spec"]["devices"][7]["taints"] == [
        {"key": "gpu.biaxial.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ]


def test_many_mig_devices_split_too() -> None:
    raw = {
        "driverVersion": "570.124.06",
        "cudaDriverVersion": "12.8",
        "model": {
            "productName": "NVIDIA H100 80GB HBM3",
            "brand": "Nvidia",
            "architecture": "Hopper",
            "cudaComputeCapability": "9.0",
            "memoryMiB": 81559,
            "multiprocessors": 132,
            "migCapable": True,
        },
        "count": 20,
        "gpus": [
            {
                "mig": {
                    "enabled": True,
                    "devices": [{"profile": "1g.10gb", "start": s} for s in range(7)],
                }
            }
        ]
        * 20,
        "migProfiles": [
            {
                "name": "1g.10gb",
                "memoryMiB": 9984,
                "multiprocessors": 16,
                "size": 1,
                "placements": list(range(7)),
            }
        ],
    }
    gpus = parse_profile(raw, name="migs", node_name="m").gpus
    slices = build_slices(gpus, node_name="m")
    assert [len(s.devices) for s in slices] == [128, 12]
    assert slices[1].devices[-1].name == "gpu-19-mig-1g10gb-6"


def test_more_than_256_slices_widen_the_index() -> None:
    assert slice_name("n", "gpu.biaxial.dev", 10) == "n-gpu.biaxial.dev-0a"
    assert slice_name("n", "gpu.biaxial.dev", 10, width=3) == "n-gpu.biaxial.dev-00a"


def test_long_node_names_get_a_shortened_slice_name() -> None:
    node = ".".join(["a" * 60] * 4)  # 243 characters, a valid node name
    slices = build_slices(synthetic(1), node_name=node)
    assert len(slices[0].name) <= 253
    assert slices[0].name.endswith("-gpu.biaxial.dev-00")
    assert slices[0].pool.name == node
    validate_slice(slices[0])


def test_node_without_gpus_publishes_one_empty_slice() -> None:
    (resource_slice,) = build_slices([], node_name="cpu-only")
    assert resource_slice.devices == ()
    assert resource_slice.pool.resource_slice_count == 1


def test_same_input_gives_the_same_bytes() -> None:
    def render() -> str:
        slices = build_slices(gpus_of("h100-80gbx8", "x"), node_name="x", node_uid="u")
        return json.dumps([s.to_api() for s in slices])

    assert render() == render()


def test_custom_driver_name() -> None:
    (resource_slice,) = build_slices(gpus_of("t4x4"), node_name="n", driver_name="gpu.example.com")
    assert resource_slice.driver == "gpu.example.com"
    assert resource_slice.name == "n-gpu.example.com-00"


@pytest.mark.parametrize("profile", builtin_profiles())
@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_every_builtin_profile_validates_strictly(profile: str, version: str) -> None:
    for resource_slice in build_slices(gpus_of(profile), node_name="node-a", node_uid="u-1"):
        assert validate_object(resource_slice.to_api(), version) == []


@pytest.mark.parametrize("version", ["1.34", "1.37"])
def test_split_and_tainted_slices_validate_strictly(version: str) -> None:
    taint = DeviceTaint(
        key="gpu.biaxial.dev/unhealthy", effect="NoExecute", time_added="2026-01-01T00:00:00Z"
    )
    for resource_slice in build_slices(synthetic(150), node_name="big", taints={"gpu-0": (taint,)}):
        assert validate_object(resource_slice.to_api(), version) == []


# --------------------------------------------------------------------------- builder errors


def test_bad_names_are_rejected() -> None:
    with pytest.raises(ValidationError, match="node name 'Bad_Node'"):
        build_slices(synthetic(1), node_name="Bad_Node")
    with pytest.raises(ValidationError, match="driver name"):
        build_slices(synthetic(1), node_name="n", driver_name="x" * 64)
    with pytest.raises(ValidationError, match="generation"):
        build_slices(synthetic(1), node_name="n", generation=-1)


def test_taints_for_unknown_devices_are_rejected() -> None:
    taint = DeviceTaint(key="k", effect="NoSchedule")
    with pytest.raises(ValidationError, match="gpu-9"):
        build_slices(synthetic(1), node_name="n", taints={"gpu-9": (taint,)})


def test_long_product_names_are_rejected() -> None:
    with pytest.raises(ValidationError, match="longer than 64"):
        build_slices(synthetic(1, productName="X" * 65), node_name="n")


# --------------------------------------------------------------------------- validate_slice


def base_slice(*devices: Device, **changes: Any) -> ResourceSlice:
    resource_slice = ResourceSlice(
        name="n-gpu.biaxial.dev-00",
        driver="gpu.biaxial.dev",  # type: ignore[arg-type]
        pool=Pool(name="n", generation=1, resource_slice_count=1),  # type: ignore[arg-type]
        devices=devices or (Device(name="gpu-0"),),
        node_name="n",  # type: ignore[arg-type]
    )
    return dataclasses.replace(resource_slice, **changes)


def device(**changes: Any) -> Device:
    return dataclasses.replace(Device(name="gpu-0", attributes={"type": "gpu"}), **changes)


SHARED = RequestPolicy(
    default=Quantity.from_int(4),
    valid_range=ValidRange(min=Quantity.from_int(2), step=Quantity.from_int(2)),
)

INVALID: list[tuple[str, Callable[[], ResourceSlice], str]] = [
    (
        "33 attributes and capacities",
        lambda: base_slice(
            device(
                attributes={f"a{i}": i for i in range(31)},
                capacity={"m": Capacity(Quantity.from_int(1)), "c": Capacity(Quantity.from_int(1))},
            )
        ),
        "33 attributes and capacities",
    ),
    (
        "attribute id > 32",
        lambda: base_slice(device(attributes={"a" * 33: 1})),
        "C identifier of at most 32",
    ),
    ("attribute id not C", lambda: base_slice(device(attributes={"1abc": 1})), "C identifier"),
    (
        "domain > 63",
        lambda: base_slice(device(attributes={("d" * 64) + ".io/x": 1})),
        "DNS subdomain of at most 63",
    ),
    (
        "domain not DNS",
        lambda: base_slice(device(attributes={"Bad_Domain/x": 1})),
        "domain 'Bad_Domain'",
    ),
    (
        "string > 64",
        lambda: base_slice(device(attributes={"s": "x" * 65})),
        "string longer than 64",
    ),
    ("bad version", lambda: base_slice(device(attributes={"v": Version("12.4")})), "not semver"),
    (
        "long version",
        lambda: base_slice(device(attributes={"v": Version("1.2.3-" + "a" * 60)})),
        "version longer",
    ),
    (
        "too many list values",
        lambda: base_slice(device(attributes={"l": tuple(range(49))})),
        "49 attribute values",
    ),
    ("device name not a label", lambda: base_slice(device(name="GPU_0")), "DNS label"),
    ("duplicate device names", lambda: base_slice(device(), device()), "used twice"),
    (
        "17 taints",
        lambda: base_slice(
            device(taints=tuple(DeviceTaint(key=f"k{i}", effect="NoSchedule") for i in range(17)))
        ),
        "17 taints",
    ),
    (
        "bad taint effect",
        lambda: base_slice(device(taints=(DeviceTaint(key="k", effect="PreferNoSchedule"),))),
        "taint effect",
    ),
    (
        "bad taint key",
        lambda: base_slice(device(taints=(DeviceTaint(key="bad key", effect="None"),))),
        "taint key",
    ),
    (
        "bad taint value",
        lambda: base_slice(device(taints=(DeviceTaint(key="k", value="-x-", effect="None"),))),
        "taint value",
    ),
    (
        "3 counter sets",
        lambda: base_slice(
            device(consumes_counters=tuple(CounterSet(name=f"s{i}", counters={}) for i in range(3)))
        ),
        "3 counter sets",
    ),
    ("driver name", lambda: base_slice(driver="Gpu.Biaxial.Dev"), "driver"),
    (
        "pool name",
        lambda: base_slice(pool=Pool(name="a//b", generation=1, resource_slice_count=1)),
        "pool name",
    ),  # type: ignore[arg-type]
    (
        "slice count",
        lambda: base_slice(pool=Pool(name="n", generation=1, resource_slice_count=0)),
        "resourceSliceCount",
    ),  # type: ignore[arg-type]
    ("slice name", lambda: base_slice(name="UPPER"), "name 'UPPER'"),
    ("no node selection", lambda: base_slice(node_name=None), r"exactly one of .* \(0 are\)"),
    ("two node selections", lambda: base_slice(all_nodes=True), r"\(2 are\)"),
    (
        "devices and counters",
        lambda: base_slice(shared_counters=(CounterSet(name="c", counters={}),)),
        "never both",
    ),
    (
        "129 devices",
        lambda: base_slice(*(device(name=f"gpu-{i}") for i in range(129))),
        "129 devices, at most 128",
    ),
    (
        "65 tainted devices",
        lambda: base_slice(
            *(
                device(
                    name=f"gpu-{i}", taints=(DeviceTaint(key="k", effect="None"),) if i == 0 else ()
                )
                for i in range(65)
            )
        ),
        "65 devices, at most 64 are allowed when a device uses taints",
    ),
    (
        "per-device node selection without the slice flag",
        lambda: base_slice(device(node_name="n")),
        "does not set perDeviceNodeSelection",
    ),
    (
        "request policy without allowMultipleAllocations",
        lambda: base_slice(device(capacity={"m": Capacity(Quantity.from_int(8), SHARED)})),
        "does not set allowMultipleAllocations",
    ),
    (
        "default not on the step grid",
        lambda: base_slice(
            device(
                allow_multiple_allocations=True,
                capacity={
                    "m": Capacity(
                        Quantity.from_int(8),
                        dataclasses.replace(SHARED, default=Quantity.from_int(5)),
                    )
                },
            )
        ),
        "default is not min plus a multiple of step",
    ),
    (
        "default above the capacity",
        lambda: base_slice(
            device(
                allow_multiple_allocations=True,
                capacity={
                    "m": Capacity(Quantity.from_int(8), RequestPolicy(default=Quantity.from_int(9)))
                },
            )
        ),
        "default exceeds the capacity",
    ),
    (
        "validValues not ascending",
        lambda: base_slice(
            device(
                allow_multiple_allocations=True,
                capacity={
                    "m": Capacity(
                        Quantity.from_int(8),
                        RequestPolicy(valid_values=(Quantity.from_int(4), Quantity.from_int(2))),
                    )
                },
            )
        ),
        "strictly ascending",
    ),
    (
        "validRange.max above the capacity",
        lambda: base_slice(
            device(
                allow_multiple_allocations=True,
                capacity={
                    "m": Capacity(
                        Quantity.from_int(8),
                        RequestPolicy(
                            valid_range=ValidRange(
                                min=Quantity.from_int(0), max=Quantity.from_int(9)
                            )
                        ),
                    )
                },
            )
        ),
        "validRange.max must be min..value",
    ),
]


@pytest.mark.parametrize(("case", "make", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_validate_slice_rejects(case: str, make: Callable[[], ResourceSlice], message: str) -> None:
    resource_slice = make()
    with pytest.raises(ValidationError, match=message):
        validate_slice(resource_slice)


def test_validate_slice_accepts_a_valid_shared_device() -> None:
    validate_slice(
        base_slice(
            device(
                allow_multiple_allocations=True,
                capacity={"m": Capacity(Quantity.from_int(8), SHARED)},
            )
        )
    )


def test_validate_slice_accepts_exactly_32_entries_and_64_tainted_devices() -> None:
    validate_slice(
        base_slice(
            device(
                attributes={f"a{i}": i for i in range(30)},
                capacity={"m": Capacity(Quantity.from_int(1)), "c": Capacity(Quantity.from_int(1))},
            )
        )
    )
    taint = (DeviceTaint(key="k", effect="None"),)
    validate_slice(base_slice(*(device(name=f"gpu-{i}", taints=taint) for i in range(64))))


def test_validate_pool_checks_counts_and_cross_slice_names() -> None:
    two = Pool(name="n", generation=1, resource_slice_count=2)  # type: ignore[arg-type]
    first = base_slice(device(name="gpu-0"), pool=two)
    second = base_slice(device(name="gpu-0"), pool=two, name="n-gpu.biaxial.dev-01")
    with pytest.raises(ValidationError, match="appears in two slices"):
        validate_pool([first, second])
    with pytest.raises(ValidationError, match="resourceSliceCount is 2 but 1 slices"):
        validate_pool([first])
    other = base_slice(
        device(name="gpu-1"), pool=Pool(name="n", generation=2, resource_slice_count=2)
    )  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="must match the pool's other slices"):
        validate_pool([first, other])
    with pytest.raises(ValidationError, match="two slices share a name"):
        validate_pool([first, base_slice(device(name="gpu-1"), pool=two)])
    with pytest.raises(ValidationError, match="at least one"):
        validate_pool([])
    validate_pool([first, dataclasses.replace(second, devices=(device(name="gpu-1"),))])


def test_validation_does_not_mutate_its_input() -> None:
    slices = build_slices(gpus_of("h100-80gbx8"), node_name="n")
    before = json.dumps([s.to_api() for s in slices])
    validate_pool(slices)
    assert json.dumps([s.to_api() for s in slices]) == before


@pytest.mark.parametrize("terms", [[], [{"matchFields": []}, {"matchFields": []}]])
def test_slice_node_selector_needs_exactly_one_term(terms: list[dict[str, Any]]) -> None:
    selector = {"nodeSelectorTerms": terms}
    resource_slice = ResourceSlice(
        name="s",
        driver=DriverName("gpu.biaxial.dev"),
        pool=Pool(name=PoolName("p"), generation=1, resource_slice_count=1),
        node_selector=selector,
    )
    with pytest.raises(ValidationError, match="exactly one nodeSelectorTerm"):
        validate_slice(resource_slice)

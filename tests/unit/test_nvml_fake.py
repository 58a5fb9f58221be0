"""The fake GPU backend: built-in profiles, profile files, deterministic UUIDs, validation of
profile data, and health-event injection."""

from __future__ import annotations

import asyncio
import re
import threading
from importlib import resources
from pathlib import Path

import pytest
import yaml

from driver.api.errors import DiscoveryError, MigError
from driver.discovery.backend import GpuBackend, HealthEvent, next_health_event, open_backend
from driver.discovery.fake import FakeBackend, builtin_profiles, load_profile, parse_profile

MIB = 1024 * 1024
UUID_RE = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
MIG_UUID_RE = re.compile(r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

BUILTINS = (
    "a100-40gbx8",
    "a100-80gbx8",
    "a100-80gbx8-dynmig",
    "a10gx4",
    "h100-80gbx8",
    "h100-80gbx8-dynmig",
    "t4x4",
)

MINIMAL_MODEL = {
    "productName": "Test GPU",
    "brand": "Nvidia",
    "architecture": "Ampere",
    "cudaComputeCapability": "8.0",
    "memoryMiB": 1024,
    "multiprocessors": 10,
    "migCapable": True,
}
MIG_TABLE = [
    {"name": "1g.5gb", "memoryMiB": 128, "multiprocessors": 1, "size": 1, "placements": [0, 1, 2]},
    {"name": "3g.20gb", "memoryMiB": 512, "multiprocessors": 4, "size": 4, "placements": [0, 4]},
]


def profile(**overrides: object) -> dict[str, object]:
    raw: dict[str, object] = {
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4",
        "model": dict(MINIMAL_MODEL),
        "count": 2,
        "migProfiles": MIG_TABLE,
    }
    raw.update(overrides)
    return raw


# --------------------------------------------------------------------------- built-in profiles


def test_builtin_profiles_are_the_documented_seven() -> None:
    assert builtin_profiles() == BUILTINS


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_profile_loads_and_satisfies_the_protocol(name: str) -> None:
    with open_backend(name, node_name="node-a") as backend:
        assert isinstance(backend, GpuBackend)
        gpus = backend.discover()
    assert [g.minor for g in gpus] == sorted(g.minor for g in gpus)
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert all(UUID_RE.fullmatch(g.uuid) for g in gpus)
    assert len({g.uuid for g in gpus}) == len(gpus)


def test_t4x4_matches_the_reference_node() -> None:
    gpus = open_backend("t4x4", node_name="gpu-t4").discover()
    assert len(gpus) == 4
    for i, gpu in enumerate(gpus):
        assert gpu.product_name == "Tesla T4"
        assert gpu.architecture == "Turing"
        assert gpu.cuda_compute_capability == "7.5"
        assert gpu.memory_bytes == 15360 * MIB
        assert gpu.multiprocessors == 40
        assert gpu.minor == i
        assert gpu.numa_node == 0
        assert gpu.pcie_root == "pci0000:00"
        assert not gpu.mig_capable
        assert not gpu.mig_enabled
    assert [g.pci_bus_id for g in gpus] == [
        "0000:00:1b.0",
        "0000:00:1c.0",
        "0000:00:1d.0",
        "0000:00:1e.0",
    ]


def test_a10gx4_matches_the_reference_node() -> None:
    gpus = open_backend("a10gx4", node_name="gpu-a10g").discover()
    assert len(gpus) == 4
    assert {g.product_name for g in gpus} == {"NVIDIA A10G"}
    assert {g.memory_bytes for g in gpus} == {23028 * MIB}
    assert {g.multiprocessors for g in gpus} == {80}
    assert {g.architecture for g in gpus} == {"Ampere"}
    assert {g.cuda_compute_capability for g in gpus} == {"8.6"}
    assert {g.driver_version for g in gpus} == {"535.104.05"}


@pytest.mark.parametrize(
    ("name", "product", "memory_mib", "sms"),
    [
        ("a100-40gbx8", "NVIDIA A100-SXM4-40GB", 40960, 108),
        ("a100-80gbx8", "NVIDIA A100-SXM4-80GB", 81920, 108),
        ("a100-80gbx8-dynmig", "NVIDIA A100-SXM4-80GB", 81920, 108),
        ("h100-80gbx8", "NVIDIA H100 80GB HBM3", 81559, 132),
        ("h100-80gbx8-dynmig", "NVIDIA H100 80GB HBM3", 81559, 132),
    ],
)
def test_eight_gpu_profiles_have_two_numa_nodes_and_two_pcie_roots(
    name: str, product: str, memory_mib: int, sms: int
) -> None:
    gpus = open_backend(name).discover()
    assert len(gpus) == 8
    assert {g.product_name for g in gpus} == {product}
    assert {g.memory_bytes for g in gpus} == {memory_mib * MIB}
    assert {g.multiprocessors for g in gpus} == {sms}
    assert all(g.mig_capable for g in gpus)
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.pcie_root for g in gpus] == ["pci0000:00"] * 4 + ["pci0000:80"] * 4


def test_h100_profile_has_existing_mig_partitions_on_gpus_6_and_7() -> None:
    gpus = open_backend("h100-80gbx8", node_name="n").discover()
    assert [g.mig_enabled for g in gpus] == [False] * 6 + [True, True]
    six, seven = gpus[6], gpus[7]
    assert [(m.profile, m.start, m.size) for m in six.mig_devices] == [
        ("1g.10gb", s, 1) for s in range(7)
    ]
    assert [
        (m.profile, m.start, m.size, m.memory_bytes // MIB, m.multiprocessors)
        for m in seven.mig_devices
    ] == [
        ("3g.40gb", 0, 4, 40448, 60),
        ("2g.20gb", 4, 2, 20096, 32),
        ("1g.10gb", 6, 1, 9984, 16),
    ]
    for gpu in (six, seven):
        for mig in gpu.mig_devices:
            assert MIG_UUID_RE.fullmatch(mig.uuid)
            assert mig.parent_uuid == gpu.uuid
            assert mig.parent_minor == gpu.minor


# --------------------------------------------------------------------------- UUIDs


def test_uuids_are_deterministic_per_node_and_differ_between_nodes() -> None:
    first = open_backend("t4x4", node_name="gpu-t4").discover()
    again = open_backend("t4x4", node_name="gpu-t4").discover()
    other = open_backend("t4x4", node_name="gpu-t4-b").discover()
    assert [g.uuid for g in first] == [g.uuid for g in again]
    assert not {g.uuid for g in first} & {g.uuid for g in other}


def test_mig_uuids_differ_between_nodes() -> None:
    a = open_backend("h100-80gbx8", node_name="a").discover()[7].mig_devices
    b = open_backend("h100-80gbx8", node_name="b").discover()[7].mig_devices
    assert not {m.uuid for m in a} & {m.uuid for m in b}


# --------------------------------------------------------------------------- profile files


def test_profile_file_with_count_and_overrides(tmp_path: Path) -> None:
    raw = profile(
        count=150,
        gpus=[
            {"minor": 200, "memoryMiB": 2048, "numaNode": 1, "pcieRoot": "pci0000:80"},
            {"mig": {"enabled": True, "devices": [{"profile": "3g.20gb", "start": 4}]}},
        ],
    )
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    gpus = open_backend(str(path), node_name="big").discover()
    assert len(gpus) == 150
    assert gpus[-1].minor == 200  # sorted by minor; index 0 got minor 200
    assert gpus[-1].index == 0
    assert gpus[-1].memory_bytes == 2048 * MIB
    assert gpus[-1].numa_node == 1
    assert gpus[0].index == 1
    assert gpus[0].mig_enabled
    assert [(m.profile, m.start) for m in gpus[0].mig_devices] == [("3g.20gb", 4)]
    assert gpus[1].pci_bus_id is None
    assert gpus[1].numa_node is None


def test_unknown_profile_names_the_available_ones() -> None:
    with pytest.raises(DiscoveryError, match=r"unknown fake GPU profile 'v100x2'.*t4x4"):
        open_backend("v100x2")


def test_unreadable_profile_file(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match=r"cannot read fake GPU profile .*missing\.yaml"):
        open_backend(str(tmp_path / "missing.yaml"))


def test_profile_file_that_is_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("model: [unclosed\n", encoding="utf-8")
    with pytest.raises(DiscoveryError, match="not valid YAML"):
        open_backend(str(path))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "must be a mapping"),
        (profile(colour="green"), r"unknown field\(s\) colour"),
        (profile(model={**MINIMAL_MODEL, "memoryMiB": "lots"}), r"memoryMiB must be an integer"),
        (
            profile(model={k: v for k, v in MINIMAL_MODEL.items() if k != "brand"}),
            "model.brand is required",
        ),
        (profile(driverVersion=550), "driverVersion must be a non-empty string"),
        (profile(count=0), "count must be an integer"),
        (profile(count=1, gpus=[{}, {}]), "gpus lists 2 entries but count is 1"),
        (profile(gpus=[{"minor": 1}, {"minor": 1}]), "share a minor number"),
        (profile(gpus=[{"numaNode": -1}]), r"numaNode must be an integer >= 0"),
        (
            profile(
                model={**MINIMAL_MODEL, "migCapable": False}, gpus=[{"mig": {"enabled": True}}]
            ),
            "not MIG-capable",
        ),
        (
            profile(
                gpus=[{"mig": {"enabled": False, "devices": [{"profile": "1g.5gb", "start": 0}]}}]
            ),
            "MIG is not enabled",
        ),
        (
            profile(
                gpus=[{"mig": {"enabled": True, "devices": [{"profile": "9g.1tb", "start": 0}]}}]
            ),
            r"unknown MIG profile '9g.1tb' \(known: 1g.5gb, 3g.20gb\)",
        ),
        (
            profile(
                gpus=[{"mig": {"enabled": True, "devices": [{"profile": "3g.20gb", "start": 2}]}}]
            ),
            r"cannot start at 2 \(allowed: 0, 4\)",
        ),
        (
            profile(
                gpus=[
                    {
                        "mig": {
                            "enabled": True,
                            "devices": [
                                {"profile": "3g.20gb", "start": 0},
                                {"profile": "1g.5gb", "start": 2},
                            ],
                        }
                    }
                ]
            ),
            "overlaps another partition",
        ),
        (
            profile(migProfiles=[{**MIG_TABLE[0], "placements": [7], "size": 2}]),
            "fit in 8 memory slices",
        ),
        (profile(migProfiles=[MIG_TABLE[0], MIG_TABLE[0]]), "duplicate names"),
    ],
)
def test_invalid_profiles_are_rejected_with_the_field(raw: object, message: str) -> None:
    with pytest.raises(DiscoveryError, match=message):
        parse_profile(raw, name="synthetic")


# --------------------------------------------------------------------------- health events


def test_wait_health_event_times_out_with_none() -> None:
    backend = FakeBackend.from_profile("t4x4")
    assert backend.wait_health_event(0.01) is None


def test_injected_events_come_back_in_order_and_track_unhealthy() -> None:
    backend = FakeBackend.from_profile("t4x4", node_name="gpu-t4")
    gpus = backend.discover()
    xid = backend.inject_xid(1, 79, "fell off the bus")
    lost = backend.mark_lost(gpus[2].uuid)
    assert xid == HealthEvent(uuid=gpus[1].uuid, kind="xid", xid=79, message="fell off the bus")
    assert backend.unhealthy() == {gpus[1].uuid: xid, gpus[2].uuid: lost}
    recovered = backend.mark_recovered(1)
    assert backend.wait_health_event(0) == xid
    assert backend.wait_health_event(0) == lost
    assert backend.wait_health_event(0) == recovered
    assert backend.wait_health_event(0) is None
    assert backend.unhealthy() == {gpus[2].uuid: lost}
    assert "Xid 79" in xid.describe()
    assert lost.describe().endswith("lost (GPU has fallen off the bus)")


def test_events_for_mig_devices_use_the_mig_uuid() -> None:
    backend = FakeBackend.from_profile("h100-80gbx8")
    mig = backend.discover()[7].mig_devices[0]
    event = backend.inject_xid(mig.uuid, 94)
    assert event.uuid == mig.uuid


def test_events_for_unknown_gpus_and_bad_xids_are_rejected() -> None:
    backend = FakeBackend.from_profile("t4x4")
    with pytest.raises(DiscoveryError, match="has no GPU or MIG device 9"):
        backend.mark_lost(9)
    with pytest.raises(DiscoveryError, match="Xid must be a positive integer"):
        backend.inject_xid(0, 0)


def test_next_health_event_does_not_block_the_loop() -> None:
    backend = FakeBackend.from_profile("t4x4")

    async def scenario() -> HealthEvent | None:
        timer = threading.Timer(0.05, backend.inject_xid, args=(3, 48))
        timer.start()
        try:
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.005)

            task = asyncio.create_task(ticker())
            event = await next_health_event(backend, 2.0)
            task.cancel()
            assert ticks > 1  # the loop kept running while we waited
            return event
        finally:
            timer.cancel()

    event = asyncio.run(scenario())
    assert event is not None
    assert event.xid == 48


def test_closed_backend_refuses_work() -> None:
    backend = FakeBackend.from_profile("t4x4")
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(DiscoveryError, match="closed"):
        backend.discover()
    with pytest.raises(DiscoveryError, match="closed"):
        backend.wait_health_event(0)


# --------------------------------------------------------------------------- dynamic MIG


WHOLE_TABLE = [
    *MIG_TABLE,
    {"name": "7g.40gb", "memoryMiB": 1000, "multiprocessors": 9, "size": 8, "placements": [0]},
    {
        "name": "1g.5gb+me",
        "memoryMiB": 128,
        "multiprocessors": 1,
        "size": 1,
        "placements": [0, 1, 2],
        "jpegs": 1,
    },
]


@pytest.mark.parametrize("name", ["a100-80gbx8-dynmig", "h100-80gbx8-dynmig"])
def test_dynamic_profiles_declare_every_gpu_in_mig_mode_without_partitions(name: str) -> None:
    backend = FakeBackend.from_profile(name, node_name="n")
    gpus = backend.discover()
    assert backend.dynamic_mig == frozenset(g.uuid for g in gpus)
    assert all(g.mig_enabled and not g.mig_devices for g in gpus)
    names = [p.name for p in gpus[0].mig_profiles]
    assert "1g.10gb+me" in names
    assert "7g.80gb" in names
    assert next(p for p in gpus[0].mig_profiles if p.name == "4g.40gb").compute_slices == 4


def test_static_profiles_declare_nothing_dynamic() -> None:
    assert FakeBackend.from_profile("h100-80gbx8").dynamic_mig == frozenset()


def test_a_profile_default_mig_and_per_gpu_override() -> None:
    raw = profile(
        migProfiles=WHOLE_TABLE,
        mig={"enabled": True, "dynamic": True},
        gpus=[{}, {"mig": {"enabled": True, "devices": [{"profile": "3g.20gb", "start": 4}]}}],
    )
    parsed = parse_profile(raw, name="mixed", node_name="n")
    first, second = parsed.gpus
    assert parsed.dynamic_mig == frozenset({first.uuid})
    assert second.mig_devices[0].gi_id == 1
    assert second.mig_devices[0].caps  # fake /dev/nvidia-caps nodes for the container


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (profile(gpus=[{"mig": {"dynamic": True}}]), "dynamic MIG needs mig.enabled: true"),
        (
            profile(migProfiles=[MIG_TABLE[0]], gpus=[{"mig": {"enabled": True, "dynamic": True}}]),
            "no profile covering the whole GPU",
        ),
        (
            profile(migProfiles=[{**MIG_TABLE[0], "name": "odd"}]),
            r"computeSlices is required: the name 'odd' does not say it",
        ),
        (profile(mig={"enabled": True, "devices": []}), r"unknown field\(s\) devices"),
    ],
)
def test_bad_dynamic_declarations_are_named(raw: dict[str, object], message: str) -> None:
    with pytest.raises(DiscoveryError, match=message):
        parse_profile(raw, name="synthetic")


def dynamic_backend(tmp_path: Path | None = None) -> FakeBackend:
    raw = profile(
        migProfiles=[
            {**row, "jpegs": 1} if row["name"] == "7g.40gb" else row for row in WHOLE_TABLE
        ],
        mig={"enabled": True, "dynamic": True},
        count=1,
    )
    state = tmp_path / "mig.json" if tmp_path is not None else None
    return FakeBackend(parse_profile(raw, name="dyn", node_name="n"), state_file=state)


def test_create_and_destroy_instances_as_nvml_does() -> None:
    backend = dynamic_backend()
    gpu = backend.discover()[0].uuid
    first = backend.create_mig(gpu, "1g.5gb", 2)
    assert MIG_UUID_RE.fullmatch(first.uuid)
    assert (first.gi_id, first.ci_id, first.size) == (1, 0, 1)
    assert first.caps
    assert all(c.startswith("/dev/nvidia-caps/nvidia-cap") for c in first.caps)
    assert backend.discover()[0].mig_devices == (first,)
    with pytest.raises(MigError, match=r"placement 0\+4 of 3g.20gb is taken by instance"):
        backend.create_mig(gpu, "3g.20gb", 0)
    with pytest.raises(MigError, match="cannot start at 3"):
        backend.create_mig(gpu, "3g.20gb", 3)
    with pytest.raises(MigError, match=r"no MIG profile '9g.9gb'"):
        backend.create_mig(gpu, "9g.9gb", 0)
    assert backend.destroy_mig(gpu, first.uuid) is True
    assert backend.destroy_mig(gpu, first.uuid) is False
    again = backend.create_mig(gpu, "1g.5gb", 2)
    assert again.uuid != first.uuid  # a re-created instance gets a new UUID, as in NVML


def test_media_engines_limit_instances_like_the_hardware() -> None:
    backend = dynamic_backend()
    gpu = backend.discover()[0].uuid
    backend.create_mig(gpu, "1g.5gb+me", 0)
    with pytest.raises(MigError, match=r"not enough jpeg-engines left for 1g.5gb\+me"):
        backend.create_mig(gpu, "1g.5gb+me", 1)


def test_mig_mode_is_required_and_never_changed() -> None:
    backend = FakeBackend(parse_profile(profile(count=1), name="off", node_name="n"))
    gpu = backend.discover()[0]
    with pytest.raises(MigError, match="MIG mode is disabled"):
        backend.create_mig(gpu.uuid, "1g.5gb", 0)
    assert not backend.discover()[0].mig_enabled


def test_injected_failures_come_in_order_and_only_for_their_operation() -> None:
    backend = dynamic_backend()
    gpu = backend.discover()[0].uuid
    backend.fail_next("destroy", "device busy")
    backend.fail_next("create", "out of resources")
    with pytest.raises(MigError, match=r"NVML failed to create 1g.5gb at 0 .*: out of resources"):
        backend.create_mig(gpu, "1g.5gb", 0)
    made = backend.create_mig(gpu, "1g.5gb", 0)
    with pytest.raises(MigError, match="device busy"):
        backend.destroy_mig(gpu, made.uuid)
    assert backend.destroy_mig(gpu, made.uuid) is True


def test_instances_outlive_the_backend_through_its_state_file(tmp_path: Path) -> None:
    first = dynamic_backend(tmp_path)
    gpu = first.discover()[0].uuid
    made = first.create_mig(gpu, "3g.20gb", 4)
    seen: list[str] = []
    first.after_create = lambda info: seen.append(info.uuid)
    other = first.create_mig(gpu, "1g.5gb", 0)
    assert seen == [other.uuid]
    restarted = dynamic_backend(tmp_path)  # a new process, same NVML state
    assert restarted.discover()[0].mig_devices == (other, made)
    assert restarted.create_mig(gpu, "1g.5gb", 1).uuid not in {made.uuid, other.uuid}
    restarted.reset_instances()  # a reboot
    assert dynamic_backend(tmp_path).discover()[0].mig_devices == ()
    (tmp_path / "mig.json").write_text("{")
    with pytest.raises(DiscoveryError, match=r"fake MIG state .* unreadable"):
        dynamic_backend(tmp_path)


def test_events_name_created_instances_too() -> None:
    backend = dynamic_backend()
    gpu = backend.discover()[0].uuid
    made = backend.create_mig(gpu, "1g.5gb", 0)
    assert backend.inject_xid(made.uuid, 31).uuid == made.uuid


@pytest.mark.parametrize("profile", builtin_profiles())
def test_a_profile_parsed_once_gives_each_node_what_parsing_it_for_that_node_gives(
    profile: str,
) -> None:
    """load_profile parses a profile's YAML once and derives each node's UUIDs; the result must
    equal parsing the profile for that node directly (GPU and MIG UUIDs, parents, all fields)."""
    text = (resources.files("driver.discovery") / "profiles" / f"{profile}.yaml").read_text()
    raw = yaml.safe_load(text)
    for node_name in ("", "node-a", "node-b"):
        assert load_profile(profile, node_name=node_name) == parse_profile(
            raw, name=profile, node_name=node_name
        )
    assert load_profile(profile, node_name="node-a") != load_profile(profile, node_name="node-b")

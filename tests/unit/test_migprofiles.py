"""The smallest MIG profile that fits a memory request (HAMi / Volcano ``vgpu-mode: mig``), and
the ``nvidia.com/mig-<profile>`` classes, on dynamic MIG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from biaxial.simulate.manifests import load_objects
from biaxial.simulate.simulator import simulate
from driver.api.claims import DeviceClass, ResourceClaim
from driver.api.errors import ManifestError
from driver.api.nodes import Node
from driver.discovery.devices import DeviceTable
from driver.discovery.fake import FakeBackend
from driver.discovery.mig import DynamicMigPolicy
from driver.discovery.slices import build_slices
from driver.scheduling.migprofiles import MigCatalog, smallest_profile_subrequests
from driver.structured.allocator import allocate
from driver.structured.snapshot import ClusterSnapshot
from tests.unit.builders import node

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    o for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for o in load_objects([str(p)])
]
MIB = 1024 * 1024


def dynamic_slices(profile: str, node_name: str, gpus: int = 8) -> list[Any]:
    backend = FakeBackend.from_profile(profile, node_name=node_name)
    table = DeviceTable.from_gpus(
        backend.discover()[:gpus], DynamicMigPolicy(gpus=backend.dynamic_mig)
    )
    return build_slices(table, node_name=node_name)


def test_the_catalog_lists_profiles_smallest_first_with_their_memory_range() -> None:
    catalog = MigCatalog.from_slices(
        [*dynamic_slices("a100-80gbx8-dynmig", "a"), *dynamic_slices("h100-80gbx8-dynmig", "h")]
    )
    names = [p.name for p in catalog.profiles]
    assert names[:3] == ["1g.10gb", "1g.10gb+me", "1g.20gb"]
    assert names[-1] == "7g.80gb"
    ten = catalog.profiles[0]
    assert (ten.min_memory, ten.max_memory) == (9728 * MIB, 9984 * MIB)  # A100, H100


def test_static_partitions_count_too() -> None:
    backend = FakeBackend.from_profile("h100-80gbx8", node_name="s")
    catalog = MigCatalog.from_slices(build_slices(backend.discover(), node_name="s"))
    assert [p.name for p in catalog.profiles] == ["1g.10gb", "2g.20gb", "3g.40gb"]


def test_subrequests_name_the_fitting_profiles_smallest_first() -> None:
    catalog = MigCatalog.from_slices(dynamic_slices("a100-80gbx8-dynmig", "a"))
    subs = smallest_profile_subrequests(9000 * MIB, catalog)
    assert [s["name"] for s in subs] == [
        "mig-1g10gb",
        "mig-1g10gbme",
        "mig-1g20gb",
        "mig-2g20gb",
        "mig-3g40gb",
        "mig-4g40gb",
        "mig-7g80gb",
    ]
    assert subs[0] == {
        "name": "mig-1g10gb",
        "deviceClassName": "mig.biaxial.dev",
        "selectors": [
            {"cel": {"expression": 'device.attributes["gpu.biaxial.dev"].profile == "1g.10gb"'}}
        ],
        "capacity": {"requests": {"memory": "9000Mi"}},
    }
    assert [s["name"] for s in smallest_profile_subrequests(30000 * MIB, catalog)] == [
        "mig-3g40gb",
        "mig-4g40gb",
        "mig-7g80gb",
    ]


def test_an_amount_no_profile_holds_is_refused_by_name() -> None:
    catalog = MigCatalog.from_slices(dynamic_slices("a100-80gbx8-dynmig", "a"))
    with pytest.raises(ManifestError, match=r"pod p: no MIG profile holds 90000 MiB .*7g\.80gb"):
        smallest_profile_subrequests(90000 * MIB, catalog, where="pod p: ")
    with pytest.raises(ManifestError, match="publishes no MIG devices"):
        smallest_profile_subrequests(MIB, MigCatalog(()))
    with pytest.raises(ManifestError, match="must be positive"):
        smallest_profile_subrequests(0, catalog)


def test_each_claim_gets_the_smallest_profile_its_node_can_still_place() -> None:
    slices = dynamic_slices("a100-80gbx8-dynmig", "a", gpus=1)
    catalog = MigCatalog.from_slices(slices)
    classes = [DeviceClass.from_api(c) for c in CLASSES]
    the_node = Node.from_api(node("a"))
    held: list[ResourceClaim] = []
    chosen = []
    for i in range(6):
        raw = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": "default", "uid": f"u{i}"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "mig",
                            "firstAvailable": smallest_profile_subrequests(15000 * MIB, catalog),
                        }
                    ]
                }
            },
        }
        snap = ClusterSnapshot.build(slices, classes, held)
        got = allocate(snap, [ResourceClaim.from_api(raw)], the_node)
        if got is None:
            chosen.append(None)
            continue
        chosen.append(got[0].results[0].device)
        raw["status"] = {"allocation": got[0].to_api()}
        held.append(ResourceClaim.from_api(raw))
    # 15000 MiB: 1g.20gb (four placements) first, then the 2g.20gb left, then nothing.
    assert chosen == [
        "gpu-0-mig-1g20gb-0",
        "gpu-0-mig-1g20gb-2",
        "gpu-0-mig-1g20gb-4",
        "gpu-0-mig-1g20gb-6",
        None,
        None,
    ]


def test_legacy_mig_resources_work_on_dynamic_mig(tmp_path: Path) -> None:
    inventory = {
        "apiVersion": "biaxial.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [{"name": "a", "gpus": "a100-80gbx8-dynmig"}],
    }
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"legacy-{i}"},
            "spec": {
                "schedulerName": "biaxial",
                "containers": [
                    {
                        "name": "c",
                        "image": "x",
                        "resources": {"limits": {f"nvidia.com/mig-{profile}": 1}},
                    }
                ],
            },
        }
        for i, profile in enumerate(("1g.10gb", "3g.40gb", "7g.80gb"))
    ]
    result = simulate([inventory, *pods], default_classes=CLASSES)
    assert not result.unschedulable
    devices = {p.pod.split("/")[1]: p.devices[0]["device"] for p in result.placements}
    assert devices == {
        "legacy-0": "gpu-0-mig-1g10gb-6",
        "legacy-1": "gpu-0-mig-3g40gb-0",
        "legacy-2": "gpu-1-mig-7g80gb-0",
    }

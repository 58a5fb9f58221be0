"""The protos match the kubelet's wire contract (package, service and field numbers) and the
generated code is fresh."""

from __future__ import annotations

import pytest

from kubeletplugin.proto import generate
from kubeletplugin.proto.gen import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_pb2,
)


def fields(message: object) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_generated_code_is_fresh() -> None:
    assert generate.check() == []


def test_registration_service() -> None:
    service = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert fields(pluginregistration_pb2.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert fields(pluginregistration_pb2.RegistrationStatus) == {
        "plugin_registered": 1,
        "error": 2,
    }


@pytest.mark.parametrize(("pb", "version"), [(dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")])
def test_dra_service(pb: object, version: str) -> None:
    descriptor = pb.DESCRIPTOR  # type: ignore[attr-defined]
    assert descriptor.services_by_name["DRAPlugin"].full_name == (
        f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    )
    device = fields(pb.Device)  # type: ignore[attr-defined]
    expected = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    if version == "v1":
        expected["share_id"] = 5
        assert pb.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence  # type: ignore[attr-defined]
    assert device == expected
    assert fields(pb.Claim) == {"namespace": 1, "uid": 2, "name": 3}  # type: ignore[attr-defined]
    assert fields(pb.NodePrepareResourceResponse) == {"devices": 1, "error": 2}  # type: ignore[attr-defined]
    assert fields(pb.NodeUnprepareResourceResponse) == {"error": 1}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("pb", "package"), [(health_v1_pb2, "v1"), (health_v1alpha1_pb2, "v1alpha1")]
)
def test_health_service(pb: object, package: str) -> None:
    descriptor = pb.DESCRIPTOR  # type: ignore[attr-defined]
    method = descriptor.services_by_name["DRAResourceHealth"].methods_by_name["NodeWatchResources"]
    assert method.full_name == f"{package}.DRAResourceHealth.NodeWatchResources"
    assert method.server_streaming
    assert fields(pb.DeviceHealth) == {  # type: ignore[attr-defined]
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert (pb.UNKNOWN, pb.HEALTHY, pb.UNHEALTHY) == (0, 1, 2)  # type: ignore[attr-defined]


def test_generated_code_comes_from_the_locked_generator() -> None:
    """A fresh machine installs requirements/dev.lock, so the checked-in code must be what that
    lock's grpcio-tools writes (a newer patch release changes the version line it stamps)."""
    from tests.check_lock import LOCKS, read_lock

    lock = next(path for path in LOCKS if path.name == "dev.lock")
    pinned = {pin.name: str(pin.version) for pin in read_lock(lock)}
    stamped = {
        line.split("=", 1)[1].strip().strip("'\"")
        for path in generate.GEN_DIR.glob("*_grpc.py")
        for line in path.read_text().splitlines()
        if line.startswith("GRPC_GENERATED_VERSION")
    }
    assert stamped == {pinned["grpcio-tools"]}

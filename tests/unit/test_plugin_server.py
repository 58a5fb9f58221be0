"""The DRA gRPC handlers on a real ``grpc.aio`` unix-socket server, with a fake Preparer:
every claim answered, whole-request failures as gRPC errors, ``share_id`` on v1 only, metrics."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from grpc import aio

from driver.api.errors import CheckpointError
from kubeletplugin.metrics import Metrics
from kubeletplugin.prepare import ClaimRef, PreparedDevice, PrepareResult
from kubeletplugin.proto.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from kubeletplugin.server import DraService, unix_server

DEVICE = PreparedDevice(
    request_names=("gpu",),
    pool="n1",
    device="gpu-0",
    cdi_device_ids=("k8s.gpu.biaxial.dev/gpu=u1-gpu-0",),
    share_id="share-1",
)


class FakePreparer:
    """Prepares "good-*" claims, fails others per claim, drops "lost-*" from its answer and
    raises for "boom"."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        self.calls.append([c.uid for c in claims])
        if any(c.uid == "boom" for c in claims):
            raise CheckpointError("checkpoint corrupt")
        return {
            c.uid: PrepareResult(devices=(DEVICE,))
            if c.uid.startswith("good")
            else PrepareResult(error=f"claim {c}: refused")
            for c in claims
            if not c.uid.startswith("lost")
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return {c.uid: "" for c in claims if not c.uid.startswith("lost")}


async def serve(metrics: Metrics, preparer: FakePreparer) -> tuple[aio.Server, Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="bxs"))
    socket = root / "d" / "dra.sock"
    socket.parent.mkdir()
    socket.write_text("stale")  # left over by a previous run: removed before binding
    server = unix_server(socket)
    server.add_generic_rpc_handlers(tuple(DraService(preparer, metrics).handlers()))
    await server.start()
    return server, socket


def test_every_claim_is_answered_and_share_id_is_v1_only() -> None:
    async def scenario() -> None:
        metrics = Metrics()
        server, socket = await serve(metrics, FakePreparer())
        try:
            async with aio.insecure_channel(f"unix://{socket}") as channel:
                v1 = dra_v1_pb2_grpc.DRAPluginStub(channel)
                claims = [
                    dra_v1_pb2.Claim(namespace="ns", uid=uid, name=uid)
                    for uid in ("good-1", "bad-1", "lost-1")
                ]
                out = await v1.NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(claims=claims)
                )
                assert set(out.claims) == {"good-1", "bad-1", "lost-1"}
                (device,) = out.claims["good-1"].devices
                assert device.share_id == "share-1"
                assert list(device.cdi_device_ids) == list(DEVICE.cdi_device_ids)
                assert out.claims["bad-1"].error == "claim ns/bad-1 (bad-1): refused"
                assert "no result" in out.claims["lost-1"].error

                beta = dra_v1beta1_pb2_grpc.DRAPluginStub(channel)
                answer = await beta.NodePrepareResources(
                    dra_v1beta1_pb2.NodePrepareResourcesRequest(
                        claims=[dra_v1beta1_pb2.Claim(namespace="ns", uid="good-2", name="g")]
                    )
                )
                assert answer.claims["good-2"].devices[0].device_name == "gpu-0"
                assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name

                gone = await v1.NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims)
                )
                assert {k: v.error for k, v in gone.claims.items()} == {
                    "good-1": "",
                    "bad-1": "",
                    "lost-1": "claim ns/lost-1 (lost-1): no result (internal error)",
                }
        finally:
            await server.stop(None)
            shutil.rmtree(socket.parent.parent, ignore_errors=True)
        rendered = metrics.render().decode()
        assert 'biaxial_plugin_claims_total{operation="prepare",outcome="ok"} 2.0' in rendered
        assert 'biaxial_plugin_claims_total{operation="prepare",outcome="error"} 2.0' in rendered
        assert 'biaxial_plugin_request_duration_seconds_count{operation="prepare"} 2.0' in rendered

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("uid", "code"),
    [("", grpc.StatusCode.INVALID_ARGUMENT), ("boom", grpc.StatusCode.INTERNAL)],
)
def test_whole_request_failures_are_grpc_errors(uid: str, code: grpc.StatusCode) -> None:
    async def scenario() -> None:
        server, socket = await serve(Metrics(), FakePreparer())
        try:
            async with aio.insecure_channel(f"unix://{socket}") as channel:
                stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
                request = dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="ns", uid=uid, name="c")]
                )
                with pytest.raises(aio.AioRpcError) as info:
                    await stub.NodePrepareResources(request)
                assert info.value.code() == code
        finally:
            await server.stop(None)
            shutil.rmtree(socket.parent.parent, ignore_errors=True)

    asyncio.run(scenario())

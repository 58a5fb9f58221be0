"""A fake kubelet: the gRPC client side of plugin registration, DRA and resource health.

It speaks to a plugin over its unix sockets exactly as the kubelet does (same service and
method names, generated from the same protos), with synchronous calls so tests stay simple:

    kubelet = FakeKubelet(registration_socket)
    info = kubelet.get_info()                      # PluginInfo
    kubelet.notify(registered=True)
    dra = kubelet.dra(version="v1")                # endpoint from GetInfo
    dra.prepare([("default", uid, "claim")])       # {uid: NodePrepareResourceResponse}
    dra.unprepare([...])                           # {uid: error string}
    with kubelet.health_stream("v1") as stream:    # NodeWatchResourcesResponse iterator
        first = next(stream)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from kubeletplugin.proto.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

_DRA: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
_HEALTH: dict[str, tuple[ModuleType, ModuleType]] = {
    "v1": (health_v1_pb2, health_v1_pb2_grpc),
    "v1alpha1": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc),
}
TIMEOUT_S = 45.0  # the kubelet's per-call default

ClaimTuple = tuple[str, str, str]  # namespace, uid, name


class DraClient:
    """NodePrepareResources / NodeUnprepareResources of one API version."""

    def __init__(self, channel: grpc.Channel, version: str) -> None:
        self.pb, grpc_mod = _DRA[version]
        self.version = version
        self._stub = grpc_mod.DRAPluginStub(channel)

    def _claims(self, claims: Sequence[ClaimTuple]) -> list[Any]:
        return [self.pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]

    def prepare(self, claims: Sequence[ClaimTuple]) -> dict[str, Any]:
        request = self.pb.NodePrepareResourcesRequest(claims=self._claims(claims))
        response = self._stub.NodePrepareResources(request, timeout=TIMEOUT_S)
        return dict(response.claims)

    def unprepare(self, claims: Sequence[ClaimTuple]) -> dict[str, str]:
        request = self.pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))
        response = self._stub.NodeUnprepareResources(request, timeout=TIMEOUT_S)
        return {uid: entry.error for uid, entry in response.claims.items()}


class FakeKubelet:
    """One fake kubelet talking to one plugin (close it, or use it as a context manager)."""

    def __init__(self, registration_socket: Path) -> None:
        self._reg_channel = grpc.insecure_channel(f"unix://{registration_socket}")
        self._reg = pluginregistration_pb2_grpc.RegistrationStub(self._reg_channel)
        self._channels: list[grpc.Channel] = [self._reg_channel]
        self._endpoint: str | None = None

    def __enter__(self) -> FakeKubelet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def get_info(self) -> Any:
        info = self._reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=TIMEOUT_S)
        self._endpoint = info.endpoint
        return info

    def notify(self, *, registered: bool, error: str = "") -> None:
        self._reg.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error),
            timeout=TIMEOUT_S,
        )

    def _channel(self) -> grpc.Channel:
        if self._endpoint is None:
            self.get_info()
        channel = grpc.insecure_channel(f"unix://{self._endpoint}")
        self._channels.append(channel)
        return channel

    def dra(self, version: str = "v1") -> DraClient:
        return DraClient(self._channel(), version)

    @contextlib.contextmanager
    def health_stream(self, version: str = "v1") -> Iterator[Iterator[Any]]:
        pb, grpc_mod = _HEALTH[version]
        stub = grpc_mod.DRAResourceHealthStub(self._channel())
        call = stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=60)
        try:
            yield call
        finally:
            call.cancel()

"""Kubelet plugin registration (``pluginregistration.Registration``) on the registration socket.

Contract:

* ``GetInfo`` answers type ``DRAPlugin``, the driver name, the absolute DRA socket path as
  endpoint and :data:`SUPPORTED_VERSIONS` (both DRA API versions and both health versions).
* ``NotifyRegistrationStatus`` is logged. A failed registration (``plugin_registered`` false)
  is counted in the metrics, makes ``/healthz`` unhealthy, and makes :meth:`Registrar.run`
  re-create the socket (stop the server, remove the file, bind again) so the kubelet's plugin
  watcher sees a new socket and retries. A later success clears the health problem.
* :meth:`Registrar.run` serves until cancelled, then stops the server gracefully and removes
  its socket (the kubelet then deregisters the plugin).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from kubeletplugin.metrics import HealthState, Metrics
from kubeletplugin.proto.gen import pluginregistration_pb2 as pb
from kubeletplugin.server import unix_server

log = logging.getLogger(f"biaxial.{__name__}")

PLUGIN_TYPE: Final = "DRAPlugin"
SUPPORTED_VERSIONS: Final = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
    "v1.DRAResourceHealth",
)
SERVICE: Final = "pluginregistration.Registration"
_HEALTH_KEY: Final = "registration"


class Registrar:
    """Serves the registration socket (see the module docstring)."""

    def __init__(
        self,
        *,
        driver_name: str,
        socket_path: Path,
        endpoint: Path,
        metrics: Metrics,
        health: HealthState,
        grace_s: float = 5.0,
    ) -> None:
        self._driver = driver_name
        self._socket = socket_path
        self._endpoint = endpoint
        self._metrics = metrics
        self._health = health
        self._grace_s = grace_s
        self._failed = asyncio.Event()
        self.registered = asyncio.Event()
        self.serving = asyncio.Event()

    async def get_info(self, _request: Any, _context: aio.ServicerContext[Any, Any]) -> Any:
        log.info("kubelet asked for plugin info")
        return pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=str(self._endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def notify(self, request: Any, _context: aio.ServicerContext[Any, Any]) -> Any:
        if request.plugin_registered:
            log.info("kubelet registered plugin %s", self._driver)
            self._health.clear(_HEALTH_KEY)
            self.registered.set()
        else:
            log.error(
                "kubelet failed to register plugin %s: %s; re-creating %s",
                self._driver,
                request.error or "(no reason given)",
                self._socket,
            )
            self._metrics.registration_failures.inc()
            self._health.set_problem(_HEALTH_KEY, f"kubelet registration failed: {request.error}")
            self.registered.clear()
            self._failed.set()
        return pb.RegistrationStatusResponse()

    def _handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "GetInfo": grpc.unary_unary_rpc_method_handler(
                    self.get_info,
                    request_deserializer=pb.InfoRequest.FromString,
                    response_serializer=pb.PluginInfo.SerializeToString,
                ),
                "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                    self.notify,
                    request_deserializer=pb.RegistrationStatus.FromString,
                    response_serializer=pb.RegistrationStatusResponse.SerializeToString,
                ),
            },
        )

    async def _start(self) -> aio.Server:
        server = unix_server(self._socket)
        server.add_generic_rpc_handlers((self._handler(),))
        await server.start()
        log.info("registration socket %s serving", self._socket)
        return server

    async def _stop(self, server: aio.Server) -> None:
        await server.stop(self._grace_s)
        self._socket.unlink(missing_ok=True)

    async def run(self) -> None:
        server = await self._start()
        self.serving.set()
        try:
            while True:
                await self._failed.wait()
                self._failed.clear()
                await self._stop(server)
                server = await self._start()
        finally:
            self.serving.clear()
            await asyncio.shield(self._stop(server))

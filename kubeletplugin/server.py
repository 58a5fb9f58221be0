"""The gRPC services the kubelet calls on the DRA socket, on ``grpc.aio``.

* ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` and ``...v1beta1.DRAPlugin``: the same two
  handlers (:class:`DraService`), calling the :class:`~kubeletplugin.prepare.Preparer`. Every
  claim of a request is in the response map, with its devices or its ``error``. A gRPC error
  is returned only when the whole request is unusable (a claim without UID:
  ``INVALID_ARGUMENT``) or the Preparer itself failed (``INTERNAL``); the kubelet then retries
  the whole call. ``share_id`` is set on v1 only (v1beta1 has no such field).
* ``v1alpha1.DRAResourceHealth`` and ``v1.DRAResourceHealth``: ``NodeWatchResources`` streams
  the complete device list (HEALTHY / UNHEALTHY, ``last_updated_time``,
  ``health_check_timeout_seconds``, ``message``) at once, on every change and every
  ``resend_s`` seconds, until the kubelet ends the stream or the plugin closes the
  broadcaster (shutdown).

Handlers are registered as generic method handlers (no generated servicer base classes), so
one implementation serves both API versions. :func:`unix_server` binds a ``grpc.aio`` server to
a unix socket after removing a stale socket file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Protocol, TypeVar

import grpc
from grpc import aio

from driver.api.errors import BiaxialError, ConfigError
from driver.api.ids import UID_PATTERN
from kubeletplugin.health import HealthBroadcaster
from kubeletplugin.metrics import Metrics
from kubeletplugin.prepare import ClaimRef, PrepareResult
from kubeletplugin.proto.gen import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
)

log = logging.getLogger(f"biaxial.{__name__}")

DRA_SERVICES: Final[dict[str, ModuleType]] = {
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": dra_v1_pb2,
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin": dra_v1beta1_pb2,
}
HEALTH_SERVICES: Final[dict[str, ModuleType]] = {
    "v1alpha1.DRAResourceHealth": health_v1alpha1_pb2,
    "v1.DRAResourceHealth": health_v1_pb2,
}


#: The mode of the plugin's sockets: the kubelet (root, as the plugin) alone may connect,
#: whatever the process's umask (which decides a new socket's mode).
SOCKET_MODE: Final = 0o600


def unix_server(path: Path) -> aio.Server:
    """A ``grpc.aio`` server bound to the unix socket ``path`` (stale socket removed first),
    with mode :data:`SOCKET_MODE`. A socket that cannot be created is a
    :class:`~driver.api.errors.ConfigError` naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        server = aio.server()
        server.add_insecure_port(f"unix://{path}")  # binds: the socket exists from here
        path.chmod(SOCKET_MODE)
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"cannot listen on unix socket {path}: {exc}") from exc
    return server


_R = TypeVar("_R")


def _claim_refs(claims: Sequence[Any]) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


class ClaimPreparer(Protocol):
    """What the DRA handlers need from :class:`~kubeletplugin.prepare.Preparer`."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]: ...


class DraService:
    """NodePrepareResources / NodeUnprepareResources for both API versions."""

    def __init__(self, preparer: ClaimPreparer, metrics: Metrics) -> None:
        self._preparer = preparer
        self._metrics = metrics

    async def _check(
        self, refs: Sequence[ClaimRef], context: aio.ServicerContext[Any, Any]
    ) -> None:
        missing = [str(r) for r in refs if not r.uid]
        if missing:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"claims without a UID: {', '.join(missing)}"
            )

    @staticmethod
    def _split(refs: Sequence[ClaimRef]) -> tuple[list[ClaimRef], dict[str, str]]:
        """The claims whose UID can name a file (a UID, never a path), and a per-claim
        invalid-argument error for each of the others: nothing is done for those."""
        good: list[ClaimRef] = []
        bad: dict[str, str] = {}
        for ref in refs:
            if UID_PATTERN.fullmatch(ref.uid):
                good.append(ref)
            else:
                bad[ref.uid] = (
                    f"invalid argument: claim {ref.namespace[:63]}/{ref.name[:253]}: UID "
                    f"{ref.uid[:64]!r} is not a Kubernetes UID"
                )
        return good, bad

    def _count(self, operation: str, errors: Sequence[str]) -> None:
        failed = sum(1 for e in errors if e)
        if failed:
            self._metrics.requests.labels(operation, "error").inc(failed)
        if len(errors) - failed:
            self._metrics.requests.labels(operation, "ok").inc(len(errors) - failed)

    async def _call(
        self,
        operation: str,
        call: Callable[[Sequence[ClaimRef]], Awaitable[_R]],
        request: Any,
        context: aio.ServicerContext[Any, Any],
    ) -> tuple[list[ClaimRef], _R]:
        """Check the request's claims, run the Preparer on all of them, time it; a failure of
        the whole call (never of one claim) aborts the RPC with INTERNAL."""
        refs = _claim_refs(request.claims)
        await self._check(refs, context)
        started = time.monotonic()
        good, _ = self._split(refs)
        try:
            return refs, await call(good)
        except BiaxialError as exc:
            log.exception("Node%sResources failed as a whole", operation.capitalize())
            await context.abort(grpc.StatusCode.INTERNAL, f"{operation} failed: {exc}")
        finally:
            self._metrics.latency.labels(operation).observe(time.monotonic() - started)

    async def prepare(
        self, pb: ModuleType, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> Any:
        refs, results = await self._call("prepare", self._preparer.prepare, request, context)
        response = pb.NodePrepareResourcesResponse()
        errors = []
        has_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name
        invalid = self._split(refs)[1]
        for ref in refs:
            result = results.get(ref.uid) or PrepareResult(
                error=f"claim {ref}: the Preparer returned no result (internal error)"
            )
            if ref.uid in invalid:
                result = PrepareResult(error=invalid[ref.uid])
            entry = response.claims[ref.uid]
            errors.append(result.error)
            if result.error:
                entry.error = result.error
                log.warning("prepare claim %s: %s", ref, result.error)
                continue
            for device in result.devices:
                out = entry.devices.add(
                    request_names=list(device.request_names),
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=list(device.cdi_device_ids),
                )
                if device.share_id and has_share_id:
                    out.share_id = device.share_id
        self._count("prepare", errors)
        return response

    async def unprepare(
        self, pb: ModuleType, request: Any, context: aio.ServicerContext[Any, Any]
    ) -> Any:
        refs, results = await self._call("unprepare", self._preparer.unprepare, request, context)
        response = pb.NodeUnprepareResourcesResponse()
        errors = []
        invalid = self._split(refs)[1]
        for ref in refs:
            error = invalid.get(ref.uid) or results.get(
                ref.uid, f"claim {ref}: no result (internal error)"
            )
            errors.append(error)
            entry = response.claims[ref.uid]
            if error:
                entry.error = error
                log.warning("unprepare claim %s: %s", ref, error)
        self._count("unprepare", errors)
        return response

    def handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        out: list[grpc.GenericRpcHandler[Any, Any]] = []
        for service, pb in DRA_SERVICES.items():
            out.append(
                grpc.method_handlers_generic_handler(
                    service,
                    {
                        "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                            _bind(self.prepare, pb),
                            request_deserializer=pb.NodePrepareResourcesRequest.FromString,
                            response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
                        ),
                        "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                            _bind(self.unprepare, pb),
                            request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
                            response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString,
                        ),
                    },
                )
            )
        return out


def _bind(method: Callable[..., Any], pb: ModuleType) -> Callable[..., Any]:
    async def handler(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await method(pb, request, context)

    return handler


class HealthService:
    """NodeWatchResources for both API versions."""

    def __init__(
        self,
        broadcaster: HealthBroadcaster,
        *,
        pool_name: str,
        resend_s: float,
        check_timeout_s: int,
    ) -> None:
        self._broadcaster = broadcaster
        self._pool = pool_name
        self._resend_s = resend_s
        self._timeout_s = check_timeout_s

    def snapshot(self, pb: ModuleType) -> Any:
        """The complete device list as one ``NodeWatchResourcesResponse``."""
        now = int(time.time())
        response = pb.NodeWatchResourcesResponse()
        for health in self._broadcaster.tracker.devices():
            response.devices.add(
                device=pb.DeviceIdentifier(pool_name=self._pool, device_name=health.device),
                health=pb.HEALTHY if health.healthy else pb.UNHEALTHY,
                last_updated_time=now,
                health_check_timeout_seconds=self._timeout_s,
                message=health.message,
            )
        return response

    async def watch(
        self, pb: ModuleType, _request: Any, _context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        log.info("kubelet opened a %s health stream", pb.DESCRIPTOR.package)
        while not self._broadcaster.closed:
            version = self._broadcaster.tracker.version
            yield self.snapshot(pb)
            await self._broadcaster.wait_change(version, self._resend_s)

    def handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        out: list[grpc.GenericRpcHandler[Any, Any]] = []
        for service, pb in HEALTH_SERVICES.items():
            out.append(
                grpc.method_handlers_generic_handler(
                    service,
                    {
                        "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
                            _bind_stream(self.watch, pb),
                            request_deserializer=pb.NodeWatchResourcesRequest.FromString,
                            response_serializer=pb.NodeWatchResourcesResponse.SerializeToString,
                        )
                    },
                )
            )
        return out


def _bind_stream(method: Callable[..., AsyncIterator[Any]], pb: ModuleType) -> Callable[..., Any]:
    async def handler(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        async for item in method(pb, request, context):
            yield item

    return handler

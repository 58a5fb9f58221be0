"""Prometheus metrics and ``/healthz`` for the kubelet plugin.

One :class:`Metrics` per process, on its own ``CollectorRegistry`` (never the global one, so
tests can build several). Two :class:`HealthState` sets of reasons:

* **liveness** (``/healthz``, the liveness probe): what a restart mends (failed registration,
  a crashed background task);
* **readiness** (``/readyz``, the readiness probe): what a restart does not mend and an
  administrator must (an unreadable checkpoint). A restart loop would only hide it, so it
  never fails liveness. ``/readyz`` also fails while liveness does.

Each endpoint answers 200 ``ok`` when it has no reasons and 503 with them otherwise.
:func:`serve` runs the endpoints on an ``aiohttp`` server inside the process's event loop;
port 0 disables it; a port that cannot be bound is a :class:`~driver.api.errors.ConfigError`.
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from driver.api.errors import ConfigError

log = logging.getLogger(f"biaxial.{__name__}")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class HealthState:
    """Named reasons for being unhealthy; empty means healthy."""

    def __init__(self) -> None:
        self._problems: dict[str, str] = {}

    def set_problem(self, key: str, message: str) -> None:
        self._problems[key] = message

    def clear(self, key: str) -> None:
        self._problems.pop(key, None)

    @property
    def healthy(self) -> bool:
        return not self._problems

    def describe(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in sorted(self._problems.items())) or "ok"


class Metrics:
    """Every metric the plugin exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "biaxial_plugin_claims_total",
            "Claims handled by NodePrepareResources / NodeUnprepareResources, by outcome.",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "biaxial_plugin_request_duration_seconds",
            "Duration of NodePrepareResources / NodeUnprepareResources calls.",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.published_devices = Gauge(
            "biaxial_plugin_published_devices",
            "Devices in this node's published ResourceSlice pool.",
            registry=self.registry,
        )
        self.unhealthy_devices = Gauge(
            "biaxial_plugin_unhealthy_devices",
            "Published devices currently tainted unhealthy.",
            registry=self.registry,
        )
        self.pool_generation = Gauge(
            "biaxial_plugin_pool_generation",
            "Generation of this node's published pool.",
            registry=self.registry,
        )
        self.registration_failures = Counter(
            "biaxial_plugin_registration_failures_total",
            "Times the kubelet reported a failed plugin registration.",
            registry=self.registry,
        )
        self.mig_instances = Gauge(
            "biaxial_plugin_mig_instances",
            "MIG instances biaxial created for prepared claims (dynamic MIG).",
            registry=self.registry,
        )
        self.mig_free_slices = Gauge(
            "biaxial_plugin_mig_free_memory_slices",
            "Memory slices of a dynamic-MIG GPU that no instance covers.",
            ["gpu"],
            registry=self.registry,
        )
        self.mig_largest_free = Gauge(
            "biaxial_plugin_mig_largest_placeable_slices",
            "Memory slices of the largest profile still placeable on a dynamic-MIG GPU (0 when "
            "none is): low values beside many free slices mean fragmentation.",
            ["gpu"],
            registry=self.registry,
        )
        self.checkpoint_readable = Gauge(
            "biaxial_plugin_checkpoint_readable",
            "1 when the checkpoint could be read the last time it was, 0 otherwise.",
            registry=self.registry,
        )
        self.checkpoint_readable.set(1)
        self.stale_claims_released = Counter(
            "biaxial_plugin_stale_claims_released_total",
            "Prepared claims reconciliation unprepared because the API no longer needs them.",
            registry=self.registry,
        )
        self.task_crashes = Counter(
            "biaxial_plugin_task_crashes_total",
            "Background tasks that ended with an unexpected exception.",
            ["task"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def serve(
    metrics: Metrics, health: HealthState, host: str, port: int, ready: HealthState | None = None
) -> web.AppRunner:
    """Start ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port``; the caller cleans the
    runner up. ``ready``: the readiness reasons (``/readyz`` reports liveness's too)."""
    readiness = ready if ready is not None else HealthState()

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz_handler(_: web.Request) -> web.Response:
        return web.Response(text=health.describe(), status=200 if health.healthy else 503)

    async def readyz_handler(_: web.Request) -> web.Response:
        if health.healthy and readiness.healthy:
            return web.Response(text="ok", status=200)
        reasons = [h.describe() for h in (health, readiness) if not h.healthy]
        return web.Response(text="; ".join(reasons), status=503)

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz_handler)
    app.router.add_get("/readyz", readyz_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"--metrics-port {port}: cannot listen on {host}:{port}: {exc}") from exc
    log.info("metrics, /healthz and /readyz on %s:%d", host, port)
    return runner

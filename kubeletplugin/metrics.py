"""Prometheus metrics and ``/healthz`` for the kubelet plugin.

One :class:`Metrics` per process, on its own ``CollectorRegistry`` (never the global one, so
tests can build several). Two :class:`HealthState` sets of reasons:

* **liveness** (``/healthz``, the liveness probe): what a restart mends (failed registration,
  a crashed background task);
* **readiness** (``/readyz``, the readiness probe): what a restart does not mend and an
  administrator must (an unreadable checkpoint). A restart loop would only hide it, so it
  never fails liveness. ``/readyz`` also fails while liveness does.

Each endpoint answers 200 ``ok`` when it has no reasons and 503 with them otherwise.
:func:`serve` runs the endpoints off the event loop (:mod:`kubeapi.serving`: a thread per
listener; the states publish their answers when they change); ``/metrics`` listens on
``--metrics-address`` (127.0.0.1 by default: the node's metrics stay in the pod unless the
administrator says otherwise), the probes alone also on ``--health-port`` for the kubelet.
Port 0 disables a listener; a port that cannot be bound is a
:class:`~driver.api.errors.ConfigError`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from driver.api.errors import ConfigError
from kubeapi.serving import Board, EndpointServer, Probe

log = logging.getLogger(f"biaxial.{__name__}")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class HealthState:
    """Named reasons for being unhealthy; empty means healthy. Thread-safe; ``on_change`` (the
    endpoints' publisher) is called after every change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._problems: dict[str, str] = {}
        self.on_change: Callable[[], None] | None = None

    def set_problem(self, key: str, message: str) -> None:
        with self._lock:
            self._problems[key] = message
        self._changed()

    def clear(self, key: str) -> None:
        with self._lock:
            removed = self._problems.pop(key, None) is not None
        if removed:
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    @property
    def healthy(self) -> bool:
        with self._lock:
            return not self._problems

    def snapshot(self) -> list[str]:
        """The reasons, ``key: message``, sorted."""
        with self._lock:
            return [f"{k}: {v}" for k, v in sorted(self._problems.items())]

    def describe(self) -> str:
        return "; ".join(self.snapshot()) or "ok"


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


class Endpoints:
    """The plugin's listeners (kubeapi.serving), each in a thread of its own: ``/metrics``
    with the probes on ``metrics_address:metrics_port``, the probes alone on
    ``health_address:health_port`` (either port 0: that listener is off)."""

    def __init__(self, servers: list[EndpointServer]) -> None:
        self.servers = servers

    def close(self) -> None:
        for server in reversed(self.servers):
            server.close()


def serve(
    metrics: Metrics,
    health: HealthState,
    host: str,
    port: int,
    ready: HealthState | None = None,
    *,
    health_host: str = "0.0.0.0",  # noqa: S104 - the kubelet probes the pod's IP
    health_port: int = 0,
) -> Endpoints:
    """Start the listeners; the caller closes them. ``ready``: the readiness reasons
    (``/readyz`` reports liveness's too). The probes' answers are published to the listeners'
    board whenever either state changes; a request reads only that."""
    readiness = ready if ready is not None else HealthState()
    board = Board()

    def publish() -> None:
        live = health.snapshot()
        board.publish("/healthz", Probe(not live, "; ".join(live) or "ok"))  # (no newline)
        reasons = [r for r in (health.describe(), readiness.describe()) if r != "ok"]
        board.publish("/readyz", Probe(not reasons, "; ".join(reasons) or "ok"))

    health.on_change = readiness.on_change = publish
    publish()
    servers: list[EndpointServer] = []
    try:
        if port:
            servers.append(
                EndpointServer(host, port, board, render=metrics.render, name="metrics").start()
            )
            log.info("metrics, /healthz and /readyz on %s:%d", host, port)
        if health_port:
            servers.append(
                EndpointServer(
                    health_host, health_port, board, name="health", flag="--health-port"
                ).start()
            )
            log.info("/healthz and /readyz on %s:%d", health_host, health_port)
    except ConfigError:
        Endpoints(servers).close()
        raise
    return Endpoints(servers)

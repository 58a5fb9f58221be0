"""Prometheus metrics of the controller, on a registry of its own (never the global one, so
several controllers can live in one test process).

Names (all prefixed ``biaxial_controller_``):

* ``queue_depth{queue}`` gauge: pods in the active / backoff / unschedulable sets;
* ``decisions_total{result}`` counter: scheduled | unschedulable | invalid | timeout | error
  (decisions per second is ``rate(decisions_total[1m])``);
* ``decision_seconds`` histogram: one pod through the decision core;
* ``decisions_reused_total`` counter: unschedulable answers given to a pod equal to one decided
  before while nothing changed (``controller.equivalence``), without running the engine;
* ``commit_seconds`` histogram: all writes of one placement, finalizers to binding;
* ``conflicts_total{step}`` counter: 409s met while committing or deallocating;
* ``unschedulable_total{reason}`` counter: unschedulable pods by first reason;
* ``deallocations_total{action}`` counter: unreserve | deallocate | delete-bridge | let-go
  (a claim marked for deletion let go in one write);
* ``in_flight_claims`` gauge: claims whose writes are not yet observed;
* ``leader`` gauge: 1 while this instance leads;
* ``api_requests_total`` counter: requests this process sent to the API server (watches
  included), as the client-side QPS limit counts them (the clients' own counts, read at
  scrape time: :class:`RequestCount`);
* ``engine_rebuild_seconds`` histogram: building the decision engine from the caches (at
  start, after an unexpected error) or rebuilding its index after a node, slice or class
  changed; claims and pods are followed without one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

_PREFIX = "biaxial_controller_"
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def _registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


class RequestCount(Collector):
    """``api_requests_total``: the sum of the request counts of the clients it follows
    (:meth:`follow`), read when the registry is scraped, exposed as a counter is (with its
    ``_created`` sample). Decision: a ``Counter`` incremented per request cost its lock and
    checks, ~0.5 us of every request, for a number the client counts anyway."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._created = time.time()
        self._sources: list[Callable[[], int]] = []
        registry.register(self)

    def follow(self, count: Callable[[], int]) -> None:
        """Add ``count()`` (a client's requests so far, never decreasing) to the total."""
        self._sources.append(count)

    @property
    def value(self) -> int:
        return sum(count() for count in self._sources)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._documentation)
        family.add_metric([], self.value, created=self._created)
        yield family


@dataclass(slots=True)
class Metrics:
    """All controller metrics; ``render()`` gives the text exposition format."""

    registry: CollectorRegistry = field(default_factory=_registry)
    queue_depth: Gauge = field(init=False)
    decisions: Counter = field(init=False)
    decision_seconds: Histogram = field(init=False)
    decisions_reused: Counter = field(init=False)
    commit_seconds: Histogram = field(init=False)
    conflicts: Counter = field(init=False)
    unschedulable: Counter = field(init=False)
    deallocations: Counter = field(init=False)
    in_flight_claims: Gauge = field(init=False)
    leader: Gauge = field(init=False)
    engine_rebuild_seconds: Histogram = field(init=False)
    api_requests: RequestCount = field(init=False)
    preemption_attempts: Counter = field(init=False)
    preemption_victims: Histogram = field(init=False)
    nomination_age_seconds: Histogram = field(init=False)

    def __post_init__(self) -> None:
        reg = self.registry
        self.queue_depth = Gauge(
            _PREFIX + "queue_depth", "Pods waiting in the scheduling queue", ["queue"], registry=reg
        )
        self.decisions = Counter(
            _PREFIX + "decisions", "Scheduling decisions by result", ["result"], registry=reg
        )
        self.decision_seconds = Histogram(
            _PREFIX + "decision_seconds",
            "Time to decide one pod",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.decisions_reused = Counter(
            _PREFIX + "decisions_reused",
            "Unschedulable answers reused for an equal pod while nothing changed",
            registry=reg,
        )
        self.commit_seconds = Histogram(
            _PREFIX + "commit_seconds",
            "Time to write one placement (finalizers to binding)",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.conflicts = Counter(
            _PREFIX + "conflicts", "409 Conflict answers met, by step", ["step"], registry=reg
        )
        self.unschedulable = Counter(
            _PREFIX + "unschedulable", "Unschedulable pods by reason", ["reason"], registry=reg
        )
        self.deallocations = Counter(
            _PREFIX + "deallocations", "Deallocation actions", ["action"], registry=reg
        )
        self.in_flight_claims = Gauge(
            _PREFIX + "in_flight_claims", "Claims with unobserved writes", registry=reg
        )
        self.leader = Gauge(_PREFIX + "leader", "1 while this instance is the leader", registry=reg)
        self.api_requests = RequestCount(
            _PREFIX + "api_requests", "Requests sent to the API server", reg
        )
        self.engine_rebuild_seconds = Histogram(
            _PREFIX + "engine_rebuild_seconds",
            "Time to build the decision engine or rebuild its index",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self._add_preemption_metrics()

    def _add_preemption_metrics(self) -> None:
        reg = self.registry
        self.preemption_attempts = Counter(
            _PREFIX + "preemption_attempts",
            "Preemption dry runs for pods that fit nowhere, by result",
            ["result"],
            registry=reg,
        )
        self.preemption_victims = Histogram(
            _PREFIX + "preemption_victims",
            "Victims evicted per preemption",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=reg,
        )
        self.nomination_age_seconds = Histogram(
            _PREFIX + "nomination_age_seconds",
            "Time from a nomination to the pod's placement (or the nomination's end)",
            buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 300, 600),
            registry=reg,
        )

    def set_queue_depths(self, depths: dict[str, int]) -> None:
        for name, value in depths.items():
            self.queue_depth.labels(queue=name).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

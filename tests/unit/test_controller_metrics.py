"""controller.metrics: the API request count, read from the clients at scrape time, is
exposed exactly as a Prometheus counter incremented per request would be."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from controller.metrics import Metrics


def _samples(text: bytes) -> list[str]:
    """The api_requests lines, without the value of the ``_created`` sample (a clock)."""
    lines = [line for line in text.decode().splitlines() if "api_requests" in line]
    return [
        line.rsplit(" ", 1)[0]
        if line.startswith("biaxial_controller_api_requests_created")
        else line
        for line in lines
    ]


def test_the_request_count_is_the_clients_sum_exposed_as_a_counter() -> None:
    counts = [3, 0]
    metrics = Metrics()
    metrics.api_requests.follow(lambda: counts[0])
    metrics.api_requests.follow(lambda: counts[1])
    counts[1] = 4  # read when scraped, not when followed
    reference = CollectorRegistry()
    Counter(
        "biaxial_controller_api_requests", "Requests sent to the API server", registry=reference
    ).inc(7)
    assert metrics.api_requests.value == 7
    assert _samples(metrics.render()) == _samples(generate_latest(reference))
    assert "biaxial_controller_api_requests_total 7.0" in _samples(metrics.render())


def test_a_process_without_clients_counts_none() -> None:
    assert "biaxial_controller_api_requests_total 0.0" in _samples(Metrics().render())

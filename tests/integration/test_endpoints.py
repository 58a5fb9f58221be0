"""The components' HTTP endpoints (kubeapi.serving) and the controller's use of them: served
from threads of their own, never the event loop; ``/metrics`` on loopback unless delegated
authentication is on; with it, HTTPS and only for callers the API server (the emulator's
TokenReview and SubjectAccessReview) authenticates and authorizes; the probes always open.

Whether a scrape flood slows scheduling is a benchmark (``python -m bench.endpoints``), not a
timed test: these tests pin the structure that makes it not.
"""

from __future__ import annotations

import dataclasses
import shutil
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.settings import Settings
from driver.api.errors import ConfigError
from kubeapi import serving
from kubeapi.endpoint import Endpoint
from kubeapi.serving import (
    Board,
    DelegatedAuth,
    EndpointServer,
    Probe,
    listen_backlog,
    tls_context,
)
from kubeletplugin.metrics import HealthState, serve
from kubeletplugin.metrics import Metrics as PluginMetrics
from kubeletplugin.settings import Settings as PluginSettings
from tests.emulator import Emulator
from tests.integration.controller_env import ControllerThread, fast_settings
from tests.integration.fake_kubelet import free_port, http_get, queued_connections, wait

PROBES = ("/healthz", "/livez", "/readyz")


@pytest.fixture(scope="module")
def serving_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed serving certificate for 127.0.0.1, made by the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command makes the test's serving certificate; not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-days", "1", "-subj", "/CN=biaxial-test", "-keyout", str(key)),
            *("-out", str(cert), "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def https_get(url: str, token: str | None = None) -> tuple[int, str]:
    """Status and body over HTTPS without verifying the test's self-signed certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5, context=ctx) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def status_of(url: str) -> int:
    """The status of a GET over HTTP or HTTPS; 0 while nothing listens."""
    try:
        return (https_get if url.startswith("https") else http_get)(url)[0]
    except OSError:
        return 0


def reviews(emulator: Emulator) -> int:
    return sum(1 for r in emulator.requests if r.path.endswith(("tokenreviews", "accessreviews")))


@pytest.fixture
def cluster() -> Iterator[Emulator]:
    with Emulator() as emulator:
        emulator.reviews.add_token("prom-token", "system:serviceaccount:monitoring:prom", "prom")
        emulator.reviews.add_token("nosy-token", "system:serviceaccount:tenant:nosy")
        emulator.reviews.allow("group:prom", "get", "/metrics")
        yield emulator


# --------------------------------------------------------------------------- settings


def test_metrics_listen_on_loopback_by_default_and_elsewhere_only_with_delegated_auth(
    tmp_path: Path,
) -> None:
    default = Settings().validate()
    assert (default.metrics_bind_address, default.metrics_auth) == ("127.0.0.1", "none")
    with pytest.raises(ConfigError, match=r"--metrics-bind-address 0\.0\.0\.0 is not a loopback"):
        Settings(metrics_bind_address="0.0.0.0").validate()
    with pytest.raises(ConfigError, match="--tls-cert-file: --metrics-auth=delegated"):
        Settings(metrics_bind_address="0.0.0.0", metrics_auth="delegated").validate()
    with pytest.raises(ConfigError, match="--health-port and --metrics-port are both 8080"):
        Settings(health_port=8080).validate()
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    secure = Settings(
        metrics_bind_address="0.0.0.0",
        metrics_auth="delegated",
        tls_cert_file=str(cert),
        tls_private_key_file=str(cert),
    )
    assert secure.validate() is secure


# --------------------------------------------------------------------------- kubeapi.serving


def test_delegated_auth_reviews_once_per_token_and_ttl(cluster: Emulator) -> None:
    now = [0.0]
    auth = DelegatedAuth(
        Endpoint(host=cluster.url, headers={}, ssl_context=None), clock=lambda: now[0]
    )
    assert auth.check(None, "/metrics").status == 401
    assert auth.check("Basic abc", "/metrics").status == 401
    assert auth.check("Bearer wrong", "/metrics").status == 401
    denied = auth.check("Bearer nosy-token", "/metrics")
    assert denied.status == 403
    assert 'User "system:serviceaccount:tenant:nosy" cannot get path "/metrics"' in denied.reason
    assert auth.check("Bearer prom-token", "/metrics").status == 200
    sent = auth.reviews
    for _ in range(5):  # cached: no review request
        assert auth.check("Bearer prom-token", "/metrics").status == 200
        assert auth.check("Bearer nosy-token", "/metrics").status == 403
    assert auth.reviews == sent
    now[0] += 11  # past the TTL: reviewed again
    assert auth.check("Bearer prom-token", "/metrics").status == 200
    assert auth.reviews == sent + 2  # a TokenReview and a SubjectAccessReview


def test_a_review_the_api_server_cannot_answer_is_a_500_and_not_cached() -> None:
    port = free_port()  # nothing listens there
    auth = DelegatedAuth(Endpoint(host=f"http://127.0.0.1:{port}", headers={}, ssl_context=None))
    assert auth.check("Bearer t", "/metrics").status == 500
    assert auth.check("Bearer t", "/metrics").status == 500
    assert auth.reviews == 2


def test_the_server_answers_from_its_own_threads_what_the_board_holds() -> None:
    board = Board()
    server = EndpointServer("127.0.0.1", 0, board, render=lambda: b"m 1\n").start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert http_get(base + "/readyz")[0] == 404  # nothing published
        board.publish("/healthz", Probe(True))
        board.publish("/readyz", Probe(False, "caches not synced\n"))
        assert http_get(base + "/healthz") == (200, "ok\n")
        assert http_get(base + "/livez") == (200, "ok\n")  # /healthz's answer
        assert http_get(base + "/readyz") == (503, "caches not synced\n")
        assert http_get(base + "/metrics") == (200, "m 1\n")
        assert http_get(base + "/other")[0] == 404
        assert server.handler_threads
        assert all(name.startswith("Thread-") for name in server.handler_threads)
    finally:
        server.close()


def test_a_burst_of_connections_waits_in_the_listen_queue() -> None:
    """An API server calls the admission webhook for many pods at once: the listen queue holds
    the connections until the server accepts them (the standard library's default queue of 5
    dropped the rest, and each waited a second or more for its SYN to be sent again)."""
    server = serving._Server(("127.0.0.1", 0), Board(), None, None, None, {})  # never accepts
    try:
        assert server.request_queue_size == listen_backlog() >= 128
        assert queued_connections(server.socket, 64) == 64
    finally:
        server.server_close()


def test_a_bad_certificate_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "c").write_text("not a certificate")
    with pytest.raises(ConfigError, match="--tls-cert-file"):
        tls_context(str(tmp_path / "c"), str(tmp_path / "c"))


# --------------------------------------------------------------------------- the controller


def test_controller_endpoints_answer_while_its_loop_is_busy(cluster: Emulator) -> None:
    metrics_port, health_port = free_port(), free_port()
    running = ControllerThread(
        cluster, fast_settings(metrics_port=metrics_port, health_port=health_port)
    ).start()
    try:
        wait(lambda: status_of(f"http://127.0.0.1:{health_port}/readyz") == 200, 10, "ready")
        assert running.controller is not None
        # Each GET runs *on the loop*, blocking it: only an endpoint served off the loop answers.
        for url, status, text in [
            (f"http://127.0.0.1:{metrics_port}/metrics", 200, "biaxial_controller_decisions"),
            (f"http://127.0.0.1:{metrics_port}/healthz", 200, "ok"),
            (f"http://127.0.0.1:{health_port}/readyz", 200, "ok (leader)"),
            (f"http://127.0.0.1:{health_port}/livez", 200, "ok"),
            (f"http://127.0.0.1:{health_port}/metrics", 404, ""),  # the probes' port: probes only
        ]:
            got = running.on_loop(lambda url=url: http_get(url))  # type: ignore[misc]
            assert got[0] == status, (url, got)
            assert text in got[1]
        threads = {n for s in running.controller.endpoints for n in s.handler_threads}
        assert threads
        assert "controller" not in threads  # the loop's thread (ControllerThread names it)
    finally:
        running.stop()
    assert running.error is None


def test_controller_metrics_with_delegated_auth(
    cluster: Emulator, serving_cert: tuple[str, str]
) -> None:
    cert, key = serving_cert
    port = free_port()
    settings = dataclasses.replace(
        fast_settings(),
        metrics_port=port,
        metrics_auth="delegated",
        tls_cert_file=cert,
        tls_private_key_file=key,
    ).validate()
    running = ControllerThread(cluster, settings).start()
    base = f"https://127.0.0.1:{port}"
    try:
        wait(lambda: status_of(base + "/readyz") == 200, 10, "ready over HTTPS")
        for path in PROBES:  # the kubelet's probes carry no credentials
            assert https_get(base + path)[0] == 200, path
        assert https_get(base + "/metrics")[0] == 401
        assert https_get(base + "/metrics", "stolen-token")[0] == 401
        assert https_get(base + "/metrics", "nosy-token")[0] == 403
        before = reviews(cluster)
        status, body = https_get(base + "/metrics", "prom-token")
        assert status == 200
        assert "biaxial_controller_queue_depth" in body
        assert reviews(cluster) == before + 2
        for _ in range(5):
            assert https_get(base + "/metrics", "prom-token")[0] == 200
        assert reviews(cluster) == before + 2  # verdicts cached for 10 s
        with pytest.raises(OSError):  # no plain HTTP on the secure port
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        running.stop()
    assert running.error is None


# --------------------------------------------------------------------------- the kubelet plugin


def test_plugin_endpoints_follow_its_health_states_from_their_own_threads() -> None:
    assert PluginSettings(node_name="n").metrics_address == "127.0.0.1"
    metrics, live, ready = PluginMetrics(), HealthState(), HealthState()
    metrics_port, health_port = free_port(), free_port()
    endpoints = serve(metrics, live, "127.0.0.1", metrics_port, ready, health_port=health_port)
    probes, scrape = f"http://127.0.0.1:{health_port}", f"http://127.0.0.1:{metrics_port}"
    try:
        assert http_get(probes + "/readyz") == (200, "ok")
        ready.set_problem("checkpoint", "unreadable")  # published as it changes
        assert http_get(probes + "/readyz") == (503, "checkpoint: unreadable")
        assert http_get(probes + "/healthz") == (200, "ok")  # liveness unaffected
        live.set_problem("registration", "refused")
        assert http_get(scrape + "/healthz") == (503, "registration: refused")
        ready.clear("checkpoint")
        live.clear("registration")
        assert http_get(probes + "/readyz") == (200, "ok")
        assert http_get(probes + "/metrics")[0] == 404  # the probes' port: probes only
        status, body = http_get(scrape + "/metrics")
        assert status == 200
        assert "biaxial_plugin_published_devices" in body
        threads = {n for s in endpoints.servers for n in s.handler_threads}
        assert threads
        assert threading.current_thread().name not in threads
    finally:
        endpoints.close()

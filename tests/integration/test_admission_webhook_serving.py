"""The admission webhook as the controller serves it (kubeapi.serving's POST endpoints over
TLS): a real HTTPS POST of an AdmissionReview answered with the patch, the HTTP edge cases
(no Content-Length, a body over the limit, an unknown path, a GET) answered and never a
traceback, a renewed certificate served without a restart, and ``biaxial controller``'s
settings wiring the listener (every replica serves it, from the start, off the loop).
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller import webhook
from kubeapi.serving import MAX_POST_BODY, Board, EndpointServer, reloading_tls_context
from tests.admission_cases import CASES, SCHEDULERS
from tests.cluster.controlplane import Pki, make_pki
from tests.emulator import Emulator
from tests.integration.controller_env import ControllerThread, fast_settings
from tests.integration.fake_kubelet import free_port, wait
from tests.unit.test_admission_webhook import review_of

SCOPE = webhook.scope(frozenset(SCHEDULERS), "biaxial")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("webhook-pki"))


@pytest.fixture
def server(pki: Pki) -> Iterator[EndpointServer]:
    running = EndpointServer(
        "127.0.0.1",
        0,
        Board(),
        tls=reloading_tls_context(str(pki.serving_cert), str(pki.serving_key), "test"),
        post={webhook.PATH: lambda body: webhook.review(body, SCOPE)},
    ).start()
    yield running
    running.close()


def connect(port: int, ca: Path) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(ca))
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)


def post(
    port: int,
    ca: Path,
    body: bytes,
    headers: dict[str, str] | None = None,
    path: str = webhook.PATH,
) -> tuple[int, bytes]:
    conn = connect(port, ca)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_a_review_over_https_gets_its_patch(server: EndpointServer, pki: Pki) -> None:
    kai = next(c for c in CASES if c.name == "kai-fraction").pod
    status, body = post(server.port, pki.ca_cert, json.dumps(review_of(kai)).encode())
    assert status == 200
    response = json.loads(body)["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        "7d1c3b5e",
        True,
        "JSONPatch",
    )
    patch = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": "biaxial"} in patch


def test_http_edge_cases_are_answered(server: EndpointServer, pki: Pki) -> None:
    port = server.port
    assert post(port, pki.ca_cert, b"{}", path="/mutate-services")[0] == 404
    # A body over the limit is refused unread (only the header claims its size here).
    conn = connect(port, pki.ca_cert)
    conn.putrequest("POST", webhook.PATH)
    conn.putheader("Content-Length", str(MAX_POST_BODY + 1))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    assert b"at most" in response.read()
    conn.close()
    # No Content-Length (a chunked body): 411, with the reason.
    conn = connect(port, pki.ca_cert)
    conn.putrequest("POST", webhook.PATH)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    response = conn.getresponse()
    assert (response.status, response.read()) == (411, b"a POST needs a Content-Length\n")
    conn.close()
    # Not JSON: the webhook's own 400 review.
    status, body = post(port, pki.ca_cert, b"not json")
    assert status == 400
    assert "the body is not JSON" in json.loads(body)["response"]["status"]["message"]
    conn = connect(port, pki.ca_cert)
    conn.request("GET", webhook.PATH)
    assert conn.getresponse().status == 404
    conn.close()


def _served_certificate(port: int, ca: Path) -> bytes:
    conn = connect(port, ca)
    conn.connect()
    assert conn.sock is not None
    der = conn.sock.getpeercert(binary_form=True)
    conn.close()
    assert der is not None
    return der


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    first, second = make_pki(tmp_path / "a"), make_pki(tmp_path / "b")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.serving_cert, cert)
    shutil.copy(first.serving_key, key)
    running = EndpointServer(
        "127.0.0.1",
        0,
        Board(),
        tls=reloading_tls_context(str(cert), str(key), "--admission-tls-cert-file"),
        post={webhook.PATH: lambda body: webhook.review(body, SCOPE)},
    ).start()
    try:
        before = _served_certificate(running.port, first.ca_cert)
        # As a Secret volume is updated: both files replaced (new mtimes).
        shutil.copy(second.serving_cert, cert)
        shutil.copy(second.serving_key, key)
        stamp = os.stat(cert).st_mtime_ns + 1_000_000  # noqa: PTH116
        os.utime(cert, ns=(stamp, stamp))
        after = _served_certificate(running.port, second.ca_cert)
        assert after != before
        # A broken renewal keeps the last good pair (logged), it does not stop serving.
        cert.write_text("not a certificate")
        os.utime(cert, ns=(stamp + 1_000_000, stamp + 1_000_000))
        assert _served_certificate(running.port, second.ca_cert) == after
    finally:
        running.close()


def test_the_controller_serves_the_webhook_when_asked(pki: Pki) -> None:
    port = free_port()
    settings = dataclasses.replace(
        fast_settings(),
        admission_webhook_port=port,
        admission_webhook_bind_address="127.0.0.1",
        admission_tls_cert_file=str(pki.serving_cert),
        admission_tls_private_key_file=str(pki.serving_key),
        admission_schedulers=("volcano",),
    ).validate()
    with Emulator() as cluster:
        running = ControllerThread(cluster, settings).start()
        try:
            # (served from the start; the test waits for the caches too, so that the stop
            # below never interrupts the first lists)
            wait(lambda: running.controller and running.controller.webhook_port, 10, "webhook")
            wait(lambda: running.controller and running.controller.ready, 30, "ready")
            volcano = next(c for c in CASES if c.name == "volcano").pod
            hami = next(c for c in CASES if c.name == "hami").pod  # default-scheduler: not taken
            for pod, patched in ((volcano, True), (hami, False)):
                status, body = post(port, pki.ca_cert, json.dumps(review_of(pod)).encode())
                assert status == 200
                assert ("patch" in json.loads(body)["response"]) is patched
        finally:
            running.stop()
        assert running.error is None

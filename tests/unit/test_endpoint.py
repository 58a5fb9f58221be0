"""Resolving the API endpoint: the direct way (in-cluster, plain kubeconfigs) gives exactly
what the official ``kubernetes`` package gives, every other shape goes through the package and
keeps its credentials, and what the client cannot honour is refused."""

from __future__ import annotations

import base64
import json
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.config import incluster_config

from driver.api.errors import ConfigError
from kubeapi import endpoint
from kubeapi.endpoint import Endpoint

#: A self-signed CA (test fixture, valid until 2126), so that CA loading can be compared.
TEST_CA = """-----BEGIN CERTIFICATE-----
MIIDFzCCAf+gAwIBAgIUXx3uuijmoL83E6AluxIdwp/PK/swDQYJKoZIhvcNAQEL
BQAwGjEYMBYGA1UEAwwPYmlheGlhbC10ZXN0LWNhMCAXDTI2MTEyNDA3NDkwNVoY
DzIxMjYxMDMxMDc0OTA1WjAaMRgwFgYDVQQDDA9iaWF4aWFsLXRlc3QtY2EwggEi
MA0GCSqGSIb3DQEBAQUAA4IBDwAwggEKAoIBAQC3rqwNb3YmVtCj2qW4vVva/jFF
pycU4qaAguhsPtYogkLiq0YStx9BeYGgPG7Mat3beLRr/q18X1IEVcxifMIu6HJK
RBWvYcPLHtbIBy1WiCTm+o8jS7Ay4Su4858ozANLaSbZTAqUjjGwFvRfX3sk/KnB
GB6VVoadFtEpbqrsGSqN1FpgIN2jDYMGvpvhTN+WewdLT8XDlOEYl2HJbYOAl/ok
2JuDjH4Jk+5Nv/pDWfJWDCBICBO/L+ePGN6uY2DHLQaxWB5rCJjFkS9zBFtqj4hV
cAFve8oGUWlVd1kvF8YuGHpYHJplWHgp5QG6zGMUqUi6VWsUDFWRZRtQovbLAgMB
AAGjUzBRMB0GA1UdDgQWBBQg2KhbDP1KAZAfXxs+LlXx/SNfGzAfBgNVHSMEGDAW
gBQg2KhbDP1KAZAfXxs+LlXx/SNfGzAPBgNVHRMBAf8EBTADAQH/MA0GCSqGSIb3
DQEBCwUAA4IBAQAmgGi1O6fNB9zdUuPWQJDap7gFMGlRyNMQrbl60w60lP0SZEjI
PJnOgJoYnv2NBw3raUwodd/U3D4p5E2at27Iew3YbcxQVbFYRceEwVliaw4Ie6ah
9zQbuEj9aj4foChG547cazUaIwwHY5N2vTWsHBBqnY9adw2noS20OxRgZw3Uup2F
f2odSqesLR19johyo/rHUQZsp0dGggoONI/dWXT3LAzx3mS8OyB2HcIOpmPromqG
JBnD+AXJIzYCoILGxtNL3mYZnTlowwiEhrkI2/dJcA89puv3KuKcZM1RoE3DAcae
B2bzsJvRFH0v1fx1BAN+dCZ18FhRcYqM2sua
-----END CERTIFICATE-----
"""


def kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any] | None) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "namespace": "ns"}}],
        "current-context": "x",
    }
    if user is not None:
        doc["contexts"][0]["context"]["user"] = "u"
        doc["users"] = [{"name": "u", "user": user}]
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def shown(e: Endpoint) -> dict[str, Any]:
    tls = e.ssl_context
    return {
        "host": e.host,
        "headers": dict(e.headers),
        "token_file": e.token_file,
        "tls": None
        if tls is None
        else (tls.verify_mode, tls.check_hostname, [c["subject"] for c in tls.get_ca_certs()]),
    }


def without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> Endpoint:
        raise AssertionError("resolved through the kubernetes package")

    monkeypatch.setattr(endpoint, "_loaded", refuse)


PLAIN = {
    "http, no user": ({"server": "http://127.0.0.1:8080/"}, None),
    "https, insecure, token": (
        {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True},
        {"token": "abc123"},
    ),
    "https, CA file beside the kubeconfig": (
        {"server": "https://api", "certificate-authority": "ca.pem"},
        {},
    ),
    "https, CA data, token": (
        {
            "server": "https://api:6443",
            "certificate-authority-data": base64.b64encode(TEST_CA.encode()).decode(),
        },
        {"token": "t"},
    ),
}


@pytest.mark.parametrize("shape", PLAIN, ids=list(PLAIN))
def test_a_plain_kubeconfig_resolves_directly_to_what_the_package_resolves(
    shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ca.pem").write_text(TEST_CA)
    path = kubeconfig(tmp_path, *PLAIN[shape])
    package = shown(endpoint._loaded(path, local_fallback=False))
    without_the_package(monkeypatch)
    assert shown(Endpoint.resolve(path)) == package


def exec_user(token: str) -> dict[str, Any]:
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": token},
    }
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
            "interactiveMode": "Never",
        }
    }


def test_credentials_only_the_package_resolves_reach_the_requests(tmp_path: Path) -> None:
    # kubernetes 37 files every credential of a kubeconfig user (token, tokenFile, an exec
    # plugin's token, basic auth) under api_key["BearerToken"]; reading only "authorization"
    # sent requests without any (a bug this pins).
    (tmp_path / "token").write_text("from-a-file")
    server = {"server": "https://api", "insecure-skip-tls-verify": True}
    cases = {
        "tokenFile": ({"tokenFile": "token"}, "Bearer from-a-file"),
        "exec plugin": (exec_user("from-exec"), "Bearer from-exec"),
        "basic auth": (
            {"username": "ann", "password": "pw"},
            "Basic " + base64.b64encode(b"ann:pw").decode(),
        ),
    }
    for name, (user, expected) in cases.items():
        resolved = Endpoint.resolve(kubeconfig(tmp_path, server, user))
        assert resolved.headers.get("Authorization") == expected, name


@pytest.mark.parametrize(
    ("setting", "value"),
    [("tls-server-name", "api.internal"), ("proxy-url", "http://proxy:3128")],
)
def test_settings_the_client_cannot_honour_are_refused(
    setting: str, value: str, tmp_path: Path
) -> None:
    path = kubeconfig(tmp_path, {"server": "https://api", setting: value}, {"token": "t"})
    with pytest.raises(ConfigError, match=f"sets {setting} \\({value}\\), which biaxial"):
        Endpoint.resolve(path)


@pytest.mark.parametrize("host", ["10.96.0.1", "fd00::1"])
def test_in_cluster_resolves_directly_to_what_the_package_resolves(
    host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_text(TEST_CA)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(endpoint, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    package = shown(endpoint._loaded(None, local_fallback=False))
    without_the_package(monkeypatch)
    direct = shown(Endpoint.resolve(None))
    assert direct == package
    assert direct["host"] == ("https://[fd00::1]:443" if ":" in host else f"https://{host}:443")
    assert direct["headers"] == {}  # the client reads the rotating token file per request
    assert direct["tls"][0] == ssl.CERT_REQUIRED


def test_an_empty_service_account_token_is_left_to_the_package_to_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("")
    (tmp_path / "ca.crt").write_text(TEST_CA)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(endpoint, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    with pytest.raises(ConfigError, match="Token file exists but empty"):
        Endpoint.resolve(None)

"""Smoke test of the emulator fixtures: the official client talks to a fresh emulator."""

from __future__ import annotations

from typing import Any

from tests.emulator import Emulator


def test_fixture_serves_the_official_client(emulator: Emulator, api_client: Any) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    names = {ns.metadata.name for ns in core.list_namespace().items}
    assert names == {"default", "kube-system", "kube-public", "kube-node-lease"}
    assert emulator.requests_for(verb="list", resource="namespaces")

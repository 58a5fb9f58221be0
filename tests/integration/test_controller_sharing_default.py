"""The shipped ``gpu.biaxial.dev`` class enforces shares out of the box (issue 15): its
``GpuConfig`` names ``hami-core`` and allows ``hami-core`` and ``mps``, so a tenant's claim
can pick MPS but not switch its share's limits off with ``none``. Scheduled through the real
controller against the API emulator, with the classes from ``deviceclasses/``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.emulator import Emulator
from tests.integration.controller_env import (
    DRIVER,
    ControllerThread,
    bound_pods,
    pod,
    pod_condition,
    resource_claim,
    seed_cluster,
)
from tests.unit.builders import gpu_config

CLASS_ENTRY = {
    "source": "FromClass",
    "opaque": {
        "driver": DRIVER,
        "parameters": {
            "apiVersion": "gpu.biaxial.dev/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "hami-core", "allowedStrategies": ["hami-core", "mps"]},
        },
    },
}


@pytest.fixture
def controller(emulator: Emulator) -> Iterator[ControllerThread]:
    seed_cluster(emulator)
    running = ControllerThread(emulator).start()
    try:
        yield running
    finally:
        running.stop()
    assert running.error is None


def share(name: str, strategy: str | None = None) -> dict[str, Any]:
    claim = resource_claim(name, memory="4Gi")
    if strategy is not None:
        claim["spec"]["devices"]["config"] = [{"requests": ["gpu"], **gpu_config(strategy)}]
    return claim


def allocation_config(emulator: Emulator, name: str) -> list[dict[str, Any]]:
    claim = emulator.get("resourceclaims", name) or {}
    return list(claim["status"]["allocation"]["devices"].get("config") or [])


def test_a_share_carries_the_class_policy_and_a_claim_may_choose_mps(
    emulator: Emulator, controller: ControllerThread
) -> None:
    emulator.create(share("plain"))
    emulator.create(share("mps", "mps"))
    emulator.create(pod("plain", claim="plain"))
    emulator.create(pod("mps", claim="mps"))
    emulator.wait_until(lambda: len(bound_pods(emulator, ["plain", "mps"])) == 2, timeout=20)
    assert allocation_config(emulator, "plain") == [CLASS_ENTRY]
    class_entry, claim_entry = allocation_config(emulator, "mps")
    assert class_entry == CLASS_ENTRY
    assert (claim_entry["source"], claim_entry["opaque"]) == (
        "FromClaim",
        gpu_config("mps")["opaque"],
    )


def test_a_claim_cannot_switch_its_share_limits_off(
    emulator: Emulator, controller: ControllerThread
) -> None:
    emulator.create(share("unlimited", "none"))
    emulator.create(pod("unlimited", claim="unlimited"))
    emulator.wait_until(lambda: pod_condition(emulator, "unlimited") is not None, timeout=20)
    condition = pod_condition(emulator, "unlimited")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert condition["message"] == (
        "claim default/unlimited: spec.devices.config[0] opaque.parameters: "
        "sharing.strategy: \"none\" is not allowed for request 'gpu' by the DeviceClass's "
        'sharing policy (sharing.allowedStrategies: "hami-core", "mps")'
    )
    assert not (emulator.get("resourceclaims", "unlimited") or {}).get("status")

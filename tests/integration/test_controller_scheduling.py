"""The controller against the API emulator: pods with claims from templates, named claims and
legacy ``nvidia.com/gpu`` pods are placed, their claims allocated and reserved, the pods bound;
unschedulable and invalid pods are reported; everything is released after the pods go."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.emulator import Emulator, ResourceClaimController
from tests.integration.controller_env import (
    ControllerThread,
    bound_pods,
    check_invariants,
    claim_template,
    delete_all_pods,
    leftovers,
    pod,
    seed_cluster,
)


@pytest.fixture
def cluster(emulator: Emulator, claim_controller: ResourceClaimController) -> Emulator:
    seed_cluster(emulator)
    return emulator


@pytest.fixture
def controller(cluster: Emulator) -> Iterator[ControllerThread]:
    running = ControllerThread(cluster).start()
    try:
        yield running
    finally:
        running.stop()
    assert running.error is None


def test_pods_with_template_claims_are_bound(
    cluster: Emulator, controller: ControllerThread
) -> None:
    cluster.create(claim_template("half", memory="7500Mi"))
    names = [f"p{i}" for i in range(4)]
    for name in names:
        cluster.create(
            pod(name, template="half", annotations={"biaxial.dev/node-policy": "binpack"})
        )
    cluster.wait_until(lambda: len(bound_pods(cluster, names)) == 4, timeout=20)
    assert check_invariants(cluster) == []
    delete_all_pods(cluster)
    cluster.wait_until(lambda: not leftovers(cluster), timeout=20, message=str(leftovers(cluster)))

"""Concurrent writers against one object: optimistic concurrency loses no update, the global
resourceVersion only grows, and a watch sees every committed change once, in order."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.emulator import Emulator

WRITERS = 4
UPDATES = 25


def test_conflicting_writers_lose_nothing_and_watch_sees_every_change(emulator: Emulator) -> None:
    emulator.create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "counter", "namespace": "default"},
            "spec": {"leaseTransitions": 0},
        }
    )
    start_rv = emulator.get("leases", "counter", "default")["metadata"]["resourceVersion"]
    seen: list[tuple[int, int]] = []
    watching = threading.Event()

    def watcher() -> None:
        with client.ApiClient(emulator.client_configuration()) as api:
            leases = client.CoordinationV1Api(api)
            w = watch.Watch()
            watching.set()
            for event in w.stream(
                leases.list_namespaced_lease,
                "default",
                resource_version=start_rv,
                timeout_seconds=30,
            ):
                obj = event["raw_object"]
                seen.append(
                    (int(obj["metadata"]["resourceVersion"]), obj["spec"]["leaseTransitions"])
                )
                if obj["spec"]["leaseTransitions"] == WRITERS * UPDATES:
                    w.stop()

    conflicts: list[int] = []
    first_round = threading.Barrier(WRITERS)

    def writer() -> None:
        with client.ApiClient(emulator.client_configuration()) as api:
            leases = client.CoordinationV1Api(api)
            done = 0
            racing = True
            while done < UPDATES:
                lease = leases.read_namespaced_lease("counter", "default")
                lease.spec.lease_transitions += 1
                if racing:  # everyone read the same version: all but one must conflict
                    first_round.wait(10)
                    racing = False
                try:
                    leases.replace_namespaced_lease("counter", "default", lease)
                except ApiException as exc:
                    conflicts.append(exc.status)
                    continue
                done += 1

    reader = threading.Thread(target=watcher)
    reader.start()
    watching.wait(5)
    threads: list[Any] = [threading.Thread(target=writer) for _ in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    reader.join(30)
    final = emulator.get("leases", "counter", "default")
    assert final["spec"]["leaseTransitions"] == WRITERS * UPDATES
    assert [value for _, value in seen] == list(range(1, WRITERS * UPDATES + 1))
    rvs = [rv for rv, _ in seen]
    assert rvs == sorted(rvs)
    assert len(set(rvs)) == len(rvs)
    assert len(conflicts) >= WRITERS - 1
    assert set(conflicts) == {409}

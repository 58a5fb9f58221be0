"""A GPU cluster's state written to the real API server as the administrator: Nodes (with the
status a kubelet would report) and the ResourceSlices the kubelet plugin would publish for
them, built by the project's own slice builder from fake GPU profiles.

:class:`Seeded` remembers what it created, and :meth:`Seeded.remove` deletes it again (the
session shares one control plane, so a test leaves no node or slice behind for the next).
Every node carries the label :data:`TEST_LABEL` with the test's name, so the test's pods can be
kept to its own nodes with a ``nodeSelector``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from tests.cluster.controlplane import ControlPlane, ControlPlaneError, object_path
from tests.integration.controller_env import DRIVER, node_object

JSON = dict[str, Any]
TEST_LABEL = "biaxial.dev/test"
NOT_READY = "node.kubernetes.io/not-ready"


def create(plane: ControlPlane, obj: Mapping[str, Any]) -> JSON:
    """POST ``obj`` as the administrator; the stored object."""
    named = {**obj, "metadata": {**obj["metadata"], "name": "-"}}  # may have generateName only
    status, body = plane.request("POST", object_path(named).rsplit("/", 1)[0], obj)
    if status != 201:
        raise ControlPlaneError(f"creating {obj['kind']} {obj['metadata']}: {status} {body}")
    return dict(body)


def get(plane: ControlPlane, obj: Mapping[str, Any]) -> JSON | None:
    status, body = plane.request("GET", object_path(obj))
    return dict(body) if status == 200 else None


@dataclass
class Seeded:
    plane: ControlPlane
    test: str
    created: list[JSON] = field(default_factory=list)

    def add(self, obj: Mapping[str, Any]) -> JSON:
        stored = create(self.plane, obj)
        self.created.append(stored)
        return stored

    def gpu_node(self, name: str, profile: str) -> JSON:
        """A Ready Node ``name`` and the slices of ``profile``'s fake GPUs on it.

        The API server's ``TaintNodesByCondition`` admission taints every new Node
        ``node.kubernetes.io/not-ready:NoSchedule``; the node lifecycle controller lifts it once
        the node reports Ready. That controller does not run here, so this does its part."""
        node = self.add(node_object(name, labels={TEST_LABEL: self.test}))
        node["spec"]["taints"] = [
            t for t in node["spec"].get("taints", []) if t["key"] != NOT_READY
        ]
        status, node = self.plane.request("PUT", f"/api/v1/nodes/{name}", node)
        if status != 200:
            raise ControlPlaneError(f"untainting node {name}: {status} {node}")
        with open_backend(profile, node_name=name) as backend:
            gpus = backend.discover()
        for resource_slice in build_slices(
            gpus, node_name=name, driver_name=DRIVER, node_uid=node["metadata"]["uid"]
        ):
            self.add(resource_slice.to_api())
        return node

    def namespace(self, name: str) -> JSON:
        return self.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def remove(self) -> None:
        """Delete everything created, newest first (a namespace takes its contents along).
        A pod goes at once (grace period 0, as its kubelet would confirm): no kubelet runs
        here, and no pod garbage collector, so a pod bound to a node would stay, being
        deleted, after its node is gone."""
        for obj in reversed(self.created):
            grace = "?gracePeriodSeconds=0" if obj["kind"] == "Pod" else ""
            self.plane.request("DELETE", object_path(obj) + grace)
        self.created.clear()


@contextlib.contextmanager
def seeded(plane: ControlPlane, test: str) -> Iterator[Seeded]:
    state = Seeded(plane, test)
    try:
        yield state
    finally:
        state.remove()


def on_test_nodes(pod: JSON, test: str) -> JSON:
    """``pod`` kept to the nodes of ``test``."""
    pod["spec"]["nodeSelector"] = {TEST_LABEL: test}
    return pod

"""The real control plane with biaxial's chart installed (marker ``apiserver``).

``chart_install`` applies, once per session, what the rendered Helm chart (default values)
gives the API server apart from the workloads: the Namespace, both ServiceAccounts, every
ClusterRole, Role and binding, the ValidatingAdmissionPolicy that pins a plugin to its node's
pool, the one that protects allocated claims' finalizers, and the DeviceClasses. The
components then run as local processes under real ServiceAccount tokens of those accounts
(:meth:`ChartInstall.controller_token`, :meth:`ChartInstall.plugin_token`), so the chart's
RBAC and policies are all that authorizes them: nothing else grants them anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane, ControlPlaneError
from tests.render_chart import NAMESPACE, render_objects

JSON = dict[str, Any]
WORKLOADS = {"Deployment", "DaemonSet"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.apiserver)


@dataclass
class ChartInstall:
    """The chart's objects on a real control plane, and tokens for its two accounts."""

    plane: ControlPlane
    objects: list[JSON]
    namespace: str = NAMESPACE
    _plugin_pods: dict[str, JSON] = field(default_factory=dict)

    def _account(self, component: str) -> str:
        for obj in self.objects:
            labels = obj["metadata"].get("labels", {})
            if obj["kind"] == "ServiceAccount" and (
                labels.get("app.kubernetes.io/component") == component
            ):
                return str(obj["metadata"]["name"])
        raise LookupError(f"the chart renders no ServiceAccount for {component}")

    @property
    def controller_account(self) -> str:
        return self._account("controller")

    @property
    def plugin_account(self) -> str:
        return self._account("kubelet-plugin")

    def controller_token(self) -> str:
        """A token of the controller's ServiceAccount, as its pod would mount."""
        return self.plane.service_account_token(
            self.namespace, self.controller_account, create=False
        )

    def plugin_token(self, node: str) -> str:
        """A token of the plugin's ServiceAccount bound to a plugin pod on ``node`` (the Node
        is created when missing): the API server puts the node's name in the token's user, as
        for the DaemonSet's pod there, which the chart's ResourceSlice policy reads."""
        ensure_node(self.plane, node)
        pod = self._plugin_pods.get(node)
        if pod is None:
            name = f"biaxial-kubelet-plugin-{node}"
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": self.plugin_account,
                    "containers": [{"name": "plugin", "image": "biaxial:test"}],
                },
            }
            status, stored = self.plane.request(
                "POST", f"/api/v1/namespaces/{self.namespace}/pods", body
            )
            if status != 201:
                raise ControlPlaneError(f"creating the plugin's pod on {node}: {status} {stored}")
            pod = self._plugin_pods[node] = stored
        return self.plane.service_account_token(
            self.namespace, self.plugin_account, create=False, bound_pod=pod
        )

    def wait_for_policies(self, timeout: float = 30.0) -> None:
        """Wait until the API server enforces the chart's ResourceSlice policy: a new policy
        takes effect only once the server's policy informer has seen it (a second or two), and
        until then a plugin may write anything its RBAC allows."""
        token = self.plugin_token("policy-probe-a")
        ensure_node(self.plane, "policy-probe-b")
        probe = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": "policy-probe-"},
            "spec": {
                "driver": "gpu.biaxial.dev",
                "pool": {"name": "policy-probe-b", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "policy-probe-b",
                "devices": [],
            },
        }
        path = "/apis/resource.k8s.io/v1/resourceslices?dryRun=All"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, _ = self.plane.request("POST", path, probe, token=token)
            if status == 422:
                return
            time.sleep(0.2)
        raise ControlPlaneError("the chart's ResourceSlice policy is not enforced after 30 s")

    def wait_for_claim_policy(self, timeout: float = 30.0) -> None:
        """The same for the claim-protection policy: a probe claim, allocated with the
        controller's finalizer, until a dry run that strips the finalizer is refused."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims"
        result = {"request": "gpu", "driver": "gpu.biaxial.dev", "pool": "probe", "device": "gpu-0"}
        probe: JSON = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "policy-probe", "finalizers": ["gpu.biaxial.dev/allocation"]},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "c"}}]}
            },
        }
        status, stored = self.plane.request("POST", path, probe)
        if status == 201:
            stored["status"] = {"allocation": {"devices": {"results": [result]}}}
            status, stored = self.plane.request("PUT", f"{path}/policy-probe/status", stored)
        if status != 200:
            raise ControlPlaneError(f"the claim-protection probe: {status} {stored}")
        stored["metadata"]["finalizers"] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, _ = self.plane.request("PUT", f"{path}/policy-probe?dryRun=All", stored)
            if status == 422:
                return
            time.sleep(0.2)
        raise ControlPlaneError("the chart's claim-protection policy is not enforced after 30 s")


def ensure_node(plane: ControlPlane, name: str, **labels: str) -> JSON:
    """A Node object (what a kubelet would register), created when missing."""
    status, body = plane.request("GET", f"/api/v1/nodes/{name}")
    if status == 200:
        return dict(body)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
    }
    status, body = plane.request("POST", "/api/v1/nodes", node)
    if status != 201:
        raise ControlPlaneError(f"creating node {name}: {status} {body}")
    return dict(body)


@pytest.fixture(scope="session")
def chart_install(control_plane: ControlPlane) -> ChartInstall:
    objects = [r.obj for r in render_objects() if r.kind not in WORKLOADS]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    control_plane.apply([namespace, *objects])
    install = ChartInstall(control_plane, objects)
    install.wait_for_policies()
    install.wait_for_claim_policy()
    return install

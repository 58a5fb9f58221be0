"""The chart's RBAC and ResourceSlice policy as the real API server enforces them."""

from __future__ import annotations

from tests.apiserver.conftest import ChartInstall, ensure_node


def _slice(node: str, *, pool: str | None = None, driver: str = "gpu.biaxial.dev") -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-"},
        "spec": {
            "driver": driver,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": "gpu-0"}],
        },
    }


def test_a_plugin_writes_only_its_own_nodes_pool(chart_install: ChartInstall) -> None:
    plane = chart_install.plane
    ensure_node(plane, "rbac-b")
    token = chart_install.plugin_token("rbac-a")
    path = "/apis/resource.k8s.io/v1/resourceslices"
    status, body = plane.request("POST", path, _slice("rbac-a"), token=token)
    assert status == 201, body
    # a ValidatingAdmissionPolicy denies with reason Invalid (422) unless it names another
    status, body = plane.request("POST", path, _slice("rbac-b"), token=token)
    assert status == 422, body
    assert "may only write ResourceSlices with spec.nodeName 'rbac-a'" in body["message"]
    status, body = plane.request("POST", path, _slice("rbac-a", pool="rbac-b"), token=token)
    assert status == 422, body
    assert "of pool 'rbac-a'" in body["message"]
    status, body = plane.request(
        "POST", path, _slice("rbac-a", driver="other.example.com"), token=token
    )
    assert status == 422, body
    assert "of driver gpu.biaxial.dev" in body["message"]

"""Contract: ``pods/{name}/binding`` and ``namespaces/{ns}/bindings`` (must-have item 7)."""

from __future__ import annotations

from typing import Any

from tests.contract.conftest import Api, pod


def _binding(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def test_bind_sets_node_name_and_pod_scheduled(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("p")), 201)
    response = api.post(api.pods("p") + "/binding", _binding("p", "node-a"))
    assert response.status == 201
    assert response.body["kind"] == "Status"
    assert response.body["status"] == "Success"
    assert response.body["code"] == 201
    bound = api.ok(api.get(api.pods("p")))
    assert bound["spec"]["nodeName"] == "node-a"
    scheduled = [c for c in bound["status"].get("conditions", []) if c["type"] == "PodScheduled"]
    assert len(scheduled) == 1
    assert scheduled[0]["status"] == "True"


def test_bind_clears_the_nominated_node_name(api: Api) -> None:
    # KEP-5278: the API server clears status.nominatedNodeName when a pod is bound (feature
    # gate ClearingNominatedNodeNameAfterBinding, beta and on by default since 1.35), whoever
    # nominated it (a scheduler's preemption, a cluster autoscaler).
    api.ok(api.post(api.pods(), pod("p")), 201)
    api.ok(api.patch(api.pods("p") + "/status", {"status": {"nominatedNodeName": "node-b"}}))
    assert api.ok(api.get(api.pods("p")))["status"]["nominatedNodeName"] == "node-b"
    assert api.post(api.pods("p") + "/binding", _binding("p", "node-a")).status == 201
    bound = api.ok(api.get(api.pods("p")))
    assert bound["spec"]["nodeName"] == "node-a"
    if api.minor < 35:  # before the gate existed the nomination stays (measured on v1.34.4)
        assert bound["status"]["nominatedNodeName"] == "node-b"
        return
    assert "nominatedNodeName" not in bound["status"]


def test_bind_missing_pod_is_404(api: Api) -> None:
    response = api.post(api.pods("ghost") + "/binding", _binding("ghost", "node-a"))
    assert response.status == 404
    assert response.reason == "NotFound"


def test_bind_twice_is_409(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("p")), 201)
    assert api.post(api.pods("p") + "/binding", _binding("p", "node-a")).status == 201
    again = api.post(api.pods("p") + "/binding", _binding("p", "node-b"))
    assert again.status == 409
    assert again.reason == "Conflict"
    assert "already assigned" in again.body["message"]
    assert api.ok(api.get(api.pods("p")))["spec"]["nodeName"] == "node-a"


def test_bind_pod_being_deleted_is_409(api: Api) -> None:
    body = pod("p")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    api.ok(api.post(api.pods(), body), 201)
    api.ok(api.delete(api.pods("p")))
    response = api.post(api.pods("p") + "/binding", _binding("p", "node-a"))
    assert response.status == 409
    assert "being deleted" in response.body["message"]
    api.ok(api.patch(api.pods("p"), {"metadata": {"finalizers": None}}))


def test_namespace_bindings_collection(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("p")), 201)
    response = api.post(f"{api.ns_path}/bindings", _binding("p", "node-c"))
    assert response.status == 201
    assert api.ok(api.get(api.pods("p")))["spec"]["nodeName"] == "node-c"


def test_node_name_cannot_be_set_by_update(api: Api) -> None:
    created = api.ok(api.post(api.pods(), pod("p")), 201)
    body = dict(created)
    body["spec"] = {**created["spec"], "nodeName": "node-a"}
    response = api.put(api.pods("p"), body)
    assert response.status == 422

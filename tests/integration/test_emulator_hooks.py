"""Emulator-only behaviour a real cluster cannot show: the request log, fault injection,
seeding and inspecting state, wait helpers, clean shutdown, node-identity mode, the
resourceclaim-controller stand-in and the standalone process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from tests.emulator import Emulator, ResourceClaimController

ROOT = Path(__file__).resolve().parents[2]


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "pause:3.10"}], **spec},
    }


def _slice(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.example.com",
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": "gpu-0"}],
        },
    }


def test_request_log_records_method_path_query_and_content_type(
    emulator: Emulator, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod("default", _pod("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})
    core.list_namespaced_pod("default", label_selector="a=b", limit=5)
    create, patch, listing = emulator.requests[-3:]
    assert (create.method, create.path, create.verb, create.status) == (
        "POST",
        "/api/v1/namespaces/default/pods",
        "create",
        201,
    )
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert listing.query == {"labelSelector": "a=b", "limit": "5"}
    assert [r.verb for r in emulator.requests_for(resource="pods")] == ["create", "patch", "list"]
    emulator.clear_requests()
    assert emulator.requests == []


def test_fail_next_write_gives_one_conflict(emulator: Emulator, api_client: Any) -> None:
    resource = client.ResourceV1Api(api_client)
    emulator.fail_next_write(409, resource="resourceslices", verb="create")
    with pytest.raises(ApiException) as conflict:
        resource.create_resource_slice(_slice("s", "n1"))
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "Conflict"
    assert emulator.get("resourceslices", "s") is None
    resource.create_resource_slice(_slice("s", "n1"))  # only the next one failed
    assert emulator.get("resourceslices", "s") is not None


def test_fail_next_filters_by_verb_and_resource(emulator: Emulator, api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    emulator.fail_next(503, verbs="list", resource="pods", count=2)
    core.list_namespace()  # other resources are unaffected
    for _ in range(2):
        with pytest.raises(ApiException) as unavailable:
            core.list_namespaced_pod("default")
        assert unavailable.value.status == 503
        assert json.loads(unavailable.value.body)["reason"] == "ServiceUnavailable"
    assert core.list_namespaced_pod("default").items == []


def test_added_latency(emulator: Emulator, api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    emulator.add_latency(0.5, verbs="get", count=1)
    start = time.perf_counter()
    core.read_namespace("default")
    assert time.perf_counter() - start >= 0.5
    start = time.perf_counter()
    core.read_namespace("default")  # only the next one was delayed
    assert time.perf_counter() - start < 0.4


def test_abruptly_dropped_watch_surfaces_as_a_protocol_error(
    emulator: Emulator, api_client: Any
) -> None:
    core = client.CoreV1Api(api_client)
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for _ in watch.Watch().stream(core.list_namespaced_pod, "default"):
                pass
        except (ProtocolError, ApiException) as exc:
            errors.append(exc)

    reader = threading.Thread(target=consume)
    reader.start()
    emulator.wait_for_watches(1, kind="pods")
    assert emulator.drop_watches("pods") == 1
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert errors
    assert isinstance(errors[0], ProtocolError)


def test_watch_dropped_with_an_error_410(emulator: Emulator, api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    w = watch.Watch()
    threading.Thread(
        target=lambda: (
            emulator.wait_for_watches(1, kind="pods"),
            emulator.drop_watches("pods", expire=True),
        ),
        daemon=True,
    ).start()
    with pytest.raises(ApiException) as gone:
        for _ in w.stream(core.list_namespaced_pod, "default", timeout_seconds=5):
            pass
    assert gone.value.status == 410


def test_stop_ends_open_watches() -> None:
    emulator = Emulator().start()
    configuration = emulator.client_configuration()
    ended = threading.Event()
    with client.ApiClient(configuration) as api:
        core = client.CoreV1Api(api)

        def consume() -> None:
            for _ in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=60):
                pass
            ended.set()

        reader = threading.Thread(target=consume)
        reader.start()
        emulator.wait_for_watches(1)
        start = time.monotonic()
        emulator.stop()
        reader.join(timeout=5)
        assert ended.is_set()
        assert time.monotonic() - start < 3
    assert emulator.open_watches() == 0


def test_seed_inspect_and_wait_without_http(emulator: Emulator) -> None:
    emulator.seed([_pod("a"), _pod("b"), _slice("s", "n1")])
    assert [p["metadata"]["name"] for p in emulator.list("pods", "default")] == ["a", "b"]
    snapshot = emulator.get("pods", "a", "default")
    assert snapshot is not None
    snapshot["metadata"]["name"] = "mutated"  # hooks hand out copies
    assert emulator.get("pods", "a", "default") is not None
    emulator.bind("a", "n1")
    assert emulator.get("pods", "a", "default")["spec"]["nodeName"] == "n1"
    threading.Timer(
        0.05,
        lambda: emulator.patch(
            "pods", "b", {"metadata": {"labels": {"ready": "1"}}}, namespace="default"
        ),
    ).start()
    found = emulator.wait_for(
        "pods", "b", lambda o: o["metadata"].get("labels") == {"ready": "1"}, namespace="default"
    )
    assert found["metadata"]["labels"] == {"ready": "1"}
    with pytest.raises(TimeoutError):
        emulator.wait_until(lambda: False, timeout=0.1)


def test_hooks_validate_like_the_api(emulator: Emulator) -> None:
    from tests.emulator import ApiStatusError

    broken = _slice("s", "n1")
    broken["spec"]["allNodes"] = True
    with pytest.raises(ApiStatusError) as invalid:
        emulator.create(broken)
    assert invalid.value.code == 422


def test_graceful_pod_deletion_and_the_kubelet_hook(emulator: Emulator) -> None:
    emulator.create(_pod("p", nodeName="n1"))
    emulator.delete("pods", "p", "default")
    assert emulator.get("pods", "p", "default")["metadata"]["deletionTimestamp"]
    assert emulator.finish_pod_deletions(node="n1") == 1
    assert emulator.get("pods", "p", "default") is None


@pytest.mark.emulator(node_identity="n1")
def test_node_identity_mode_requires_the_node_field_selector(
    emulator: Emulator, api_client: Any
) -> None:
    resource = client.ResourceV1Api(api_client)
    emulator.seed([_slice("s1", "n1"), _slice("s2", "n2")])
    with pytest.raises(ApiException) as forbidden:
        resource.list_resource_slice()
    assert forbidden.value.status == 403
    assert json.loads(forbidden.value.body)["reason"] == "Forbidden"
    with pytest.raises(ApiException):
        resource.list_resource_slice(field_selector="spec.nodeName=n2")
    mine = resource.list_resource_slice(field_selector="spec.nodeName=n1")
    assert [s.metadata.name for s in mine.items] == ["s1"]
    events = list(
        watch.Watch().stream(
            resource.list_resource_slice, field_selector="spec.nodeName=n1", timeout_seconds=1
        )
    )
    assert [e["object"].metadata.name for e in events] == ["s1"]
    assert resource.read_resource_slice("s2").metadata.name == "s2"  # get is not list


def test_node_identity_from_the_bearer_token(emulator: Emulator) -> None:
    configuration = emulator.client_configuration()
    configuration.api_key = {"authorization": "Bearer system:node:n7"}
    with client.ApiClient(configuration) as api:
        resource = client.ResourceV1Api(api)
        with pytest.raises(ApiException) as forbidden:
            resource.list_resource_slice()
        assert forbidden.value.status == 403
        assert resource.list_resource_slice(field_selector="spec.nodeName=n7").items == []


def _template() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {
            "metadata": {"labels": {"from": "template"}},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}
            },
        },
    }


def _claiming_pod(name: str) -> dict[str, Any]:
    body = _pod(name)
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
    body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return body


def test_resourceclaim_controller_on_demand(emulator: Emulator) -> None:
    emulator.seed([_template(), _claiming_pod("p")])
    controller = ResourceClaimController(emulator)
    assert controller.sync() == 2  # one claim created, one pod status written
    assert controller.sync() == 0  # idempotent
    pod = emulator.get("pods", "p", "default")
    statuses = pod["status"]["resourceClaimStatuses"]
    assert [s["name"] for s in statuses] == ["gpu"]
    claim = emulator.get("resourceclaims", statuses[0]["resourceClaimName"], "default")
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    assert claim["metadata"]["labels"] == {"from": "template"}
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Pod",
        "p",
        pod["metadata"]["uid"],
        True,
    )
    assert claim["metadata"]["name"].startswith("p-gpu-")
    # reservation of a pod that goes away is dropped, and the generated claim deleted
    emulator.update_status(
        "resourceclaims",
        claim["metadata"]["name"],
        {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.example.com",
                            "pool": "n1",
                            "device": "gpu-0",
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": pod["metadata"]["uid"]}],
        },
        namespace="default",
    )
    emulator.delete("pods", "p", "default")
    controller.sync()
    assert emulator.get("resourceclaims", claim["metadata"]["name"], "default") is None


def test_resourceclaim_controller_in_the_background(
    emulator: Emulator, claim_controller: ResourceClaimController, api_client: Any
) -> None:
    emulator.seed([_template()])
    client.CoreV1Api(api_client).create_namespaced_pod("default", _claiming_pod("p"))
    pod = emulator.wait_for(
        "pods",
        "p",
        lambda o: bool((o.get("status") or {}).get("resourceClaimStatuses")),
        namespace="default",
    )
    name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    assert emulator.get("resourceclaims", name, "default") is not None
    assert not claim_controller.failures


def test_standalone_process_serves_kubeconfig_clients(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.emulator", "--port", "0", "--kubeconfig", str(kubeconfig)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        assert configuration.host == line.removeprefix("listening on ")
        with client.ApiClient(configuration) as api:
            core = client.CoreV1Api(api)
            core.create_namespaced_pod("default", _pod("p"))
            assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["p"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]


def test_send_initial_events_ends_with_an_annotated_bookmark(emulator: Emulator) -> None:
    import urllib.request

    emulator.seed([_pod("a"), _pod("b")])
    url = (
        f"{emulator.url}/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true"
        "&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1"
    )
    with urllib.request.urlopen(url, timeout=10) as response:
        events = [json.loads(line) for line in response.read().splitlines() if line.strip()]
    kinds = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    assert kinds[:3] == [("ADDED", "a"), ("ADDED", "b"), ("BOOKMARK", None)]
    annotations = events[2]["object"]["metadata"]["annotations"]
    assert annotations == {"k8s.io/initial-events-end": "true"}
    refused = urllib.request.Request(
        f"{emulator.url}/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true"
    )
    with pytest.raises(urllib.error.HTTPError) as invalid:
        urllib.request.urlopen(refused, timeout=10)
    assert invalid.value.code == 422
    invalid.value.close()

"""Contract: HTTP/1.1 transport (keep-alive, low latency, chunked watch), discovery, and
``metav1.Status`` errors with the real reasons (must-have items 1 and 2)."""

from __future__ import annotations

from tests.contract.conftest import Api, needs_emulator, pod


def test_calls_reuse_one_kept_alive_connection(api: Api) -> None:
    # A server that closes after each response makes every call pay a connect (and, without
    # TCP_NODELAY, Nagle plus delayed ACK add ~40 ms each). What is timed belongs in bench/;
    # here the structure: HTTP/1.1 keep-alive, so 50 calls travel on the one connection.
    api.get("/api/v1/namespaces/default")
    pool = api.client.rest_client.pool_manager.connection_from_url(api.base)
    opened = pool.num_connections
    for _ in range(50):
        response = api.get(f"/api/v1/namespaces/{api.namespace}")
        assert response.status == 200
        assert response.headers.get("connection", "").lower() != "close"
    assert pool.num_connections == opened


def test_watch_is_a_chunked_stream(api: Api) -> None:
    stream = api.watch(api.pods(), timeoutSeconds="1")
    assert stream.headers.get("transfer-encoding") == "chunked"
    assert stream.headers.get("content-type", "").startswith("application/json")
    assert stream.rest() == []


def test_discovery_documents(api: Api) -> None:
    assert "v1" in api.ok(api.get("/api"))["versions"]
    groups = {g["name"]: g for g in api.ok(api.get("/apis"))["groups"]}
    for group in ("resource.k8s.io", "coordination.k8s.io", "events.k8s.io"):
        assert group in groups
    assert any(v["version"] == "v1" for v in groups["resource.k8s.io"]["versions"])
    core = {r["name"]: r for r in api.ok(api.get("/api/v1"))["resources"]}
    for name in (
        "pods",
        "pods/status",
        "pods/binding",
        "nodes",
        "nodes/status",
        "namespaces",
        "events",
        "bindings",
    ):
        assert name in core, name
    assert core["pods"]["namespaced"] is True
    assert core["nodes"]["namespaced"] is False
    assert "watch" in core["pods"]["verbs"]
    dra = {r["name"]: r for r in api.ok(api.get("/apis/resource.k8s.io/v1"))["resources"]}
    for name in (
        "resourceslices",
        "resourceclaims",
        "resourceclaims/status",
        "deviceclasses",
        "resourceclaimtemplates",
    ):
        assert name in dra, name
    assert dra["resourceslices"]["namespaced"] is False
    assert dra["resourceclaims"]["namespaced"] is True
    assert dra["resourceclaims"]["kind"] == "ResourceClaim"
    assert (
        api.ok(api.get("/apis/coordination.k8s.io/v1"))["groupVersion"] == "coordination.k8s.io/v1"
    )
    version = api.ok(api.get("/version"))
    assert version["major"] == "1"
    assert int(version["minor"].rstrip("+")) >= 34


def _status(api: Api, response: object, code: int, reason: str) -> None:
    from tests.contract.conftest import Response

    assert isinstance(response, Response)
    assert response.status == code, response
    body = response.body
    assert isinstance(body, dict)
    assert body["kind"] == "Status"
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["reason"] == reason, body
    assert body["code"] == code


def test_error_reasons(api: Api) -> None:
    missing = api.get(api.pods("nope"))
    _status(api, missing, 404, "NotFound")
    assert missing.body["details"] == {"name": "nope", "kind": "pods"}
    assert missing.body["message"] == 'pods "nope" not found'

    api.ok(api.post(api.pods(), pod("p")))
    _status(api, api.post(api.pods(), pod("p")), 409, "AlreadyExists")

    stale = api.ok(api.get(api.pods("p")))
    api.ok(api.patch(api.pods("p"), {"metadata": {"labels": {"a": "b"}}}))
    _status(api, api.put(api.pods("p"), stale), 409, "Conflict")

    _status(
        api,
        api.post(
            api.pods(),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "x"},
                "spec": {"containers": []},
            },
        ),
        422,
        "Invalid",
    )
    _status(api, api.get(api.pods(), fieldSelector="spec.bogus=1"), 400, "BadRequest")
    _status(api, api.request("PUT", api.pods(), pod("q")), 405, "MethodNotAllowed")
    _status(
        api, api.patch(api.pods("p"), b"{}", content_type="text/plain"), 415, "UnsupportedMediaType"
    )


def test_expired_continue_token_is_410(api: Api) -> None:
    emulator = needs_emulator(api)
    for i in range(3):
        api.ok(api.post(api.pods(), pod(f"page-{i}")))
    token = api.ok(api.get(api.pods(), limit="1"))["metadata"]["continue"]
    api.ok(api.post(api.pods(), pod("later")))
    emulator.compact()
    _status(api, api.get(api.pods(), limit="1", **{"continue": token}), 410, "Expired")


def test_not_found_for_unknown_paths(api: Api) -> None:
    response = api.get("/apis/resource.k8s.io/v1/nosuchthings")
    assert response.status == 404
    response = api.get("/apis/nosuch.example.com/v1/things")
    assert response.status == 404

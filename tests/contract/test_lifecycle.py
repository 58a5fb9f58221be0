"""Contract: namespace lifecycle, exact-RV lists, delete-collection, dry run, create on
update (Lease), and the create-time resourceVersion rule."""

from __future__ import annotations

import time

from tests.contract.conftest import Api, Response, claim, pod


def _eventually(check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_namespace_termination(api: Api) -> None:
    name = api.name("ns")
    api.ok(
        api.post(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
    )
    created = api.ok(api.get(f"/api/v1/namespaces/{name}"))
    assert created["status"]["phase"] == "Active"
    assert created["metadata"]["labels"]["kubernetes.io/metadata.name"] == name
    held = claim("held")
    held["metadata"]["finalizers"] = ["example.com/hold"]
    claims = f"/apis/resource.k8s.io/v1/namespaces/{name}/resourceclaims"
    api.ok(api.post(claims, held), 201)
    api.ok(api.post(f"/api/v1/namespaces/{name}/pods", pod("p")), 201)
    api.ok(api.delete(f"/api/v1/namespaces/{name}"))
    terminating = api.ok(api.get(f"/api/v1/namespaces/{name}"))
    assert terminating["metadata"]["deletionTimestamp"]
    assert terminating["status"]["phase"] == "Terminating"
    refused = api.post(f"/api/v1/namespaces/{name}/pods", pod("late"))
    assert refused.status == 403
    assert refused.reason == "Forbidden"
    _eventually(lambda: api.get(f"/api/v1/namespaces/{name}/pods/p").status == 404)
    _eventually(lambda: api.ok(api.get(f"{claims}/held"))["metadata"].get("deletionTimestamp"))
    api.ok(api.patch(f"{claims}/held", {"metadata": {"finalizers": None}}))
    _eventually(lambda: api.get(f"/api/v1/namespaces/{name}").status == 404)
    assert api.post(f"/api/v1/namespaces/{name}/pods", pod("later")).status == 404


def test_list_at_an_exact_resource_version(api: Api) -> None:
    api.ok(api.post(api.pods(), pod("a")), 201)
    rv = api.ok(api.get(api.pods()))["metadata"]["resourceVersion"]
    api.ok(api.post(api.pods(), pod("b")), 201)
    api.ok(api.patch(api.pods("a"), {"metadata": {"labels": {"changed": "yes"}}}))
    then = api.ok(api.get(api.pods(), resourceVersion=rv, resourceVersionMatch="Exact"))
    assert [p["metadata"]["name"] for p in then["items"]] == ["a"]
    assert "labels" not in then["items"][0]["metadata"]
    assert then["metadata"]["resourceVersion"] == rv
    # ValidateListOptions (apimachinery meta/internalversion/validation) runs before the read:
    # a match without a resourceVersion is a 422 on ListOptions, not a 400
    unanchored = api.get(api.pods(), resourceVersionMatch="Exact")
    assert unanchored.status == 422
    assert unanchored.reason == "Invalid"
    assert unanchored.body["details"]["kind"] == "ListOptions"
    assert "forbidden unless resourceVersion is provided" in unanchored.body["message"]


def test_delete_collection_with_a_label_selector(api: Api) -> None:
    for name, team in (("a", "x"), ("b", "x"), ("c", "y")):
        body = pod(name)
        body["metadata"]["labels"] = {"team": team}
        api.ok(api.post(api.pods(), body), 201)
    response = api.request("DELETE", api.pods(), query={"labelSelector": "team=x"})
    assert response.status == 200
    assert [p["metadata"]["name"] for p in api.ok(api.get(api.pods()))["items"]] == ["c"]


def test_dry_run_stores_nothing(api: Api) -> None:
    response = api.request("POST", api.pods(), pod("p"), query={"dryRun": "All"})
    assert response.status == 201
    assert response.body["metadata"]["name"] == "p"
    assert api.get(api.pods("p")).status == 404
    api.ok(api.post(api.pods(), pod("q")), 201)
    patched = api.request(
        "PATCH",
        api.pods("q"),
        {"metadata": {"labels": {"a": "b"}}},
        content_type="application/merge-patch+json",
        query={"dryRun": "All"},
    )
    assert patched.body["metadata"]["labels"] == {"a": "b"}
    assert "labels" not in api.ok(api.get(api.pods("q")))["metadata"]
    assert api.request("DELETE", api.pods("q"), query={"dryRun": "All"}).status == 200
    assert api.get(api.pods("q")).status == 200


def test_lease_put_creates(api: Api) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{api.namespace}/leases/leader"
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "leader"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
    }
    created = api.put(path, body)
    assert created.status == 201
    renewed = dict(created.body)
    renewed["spec"] = {**created.body["spec"], "holderIdentity": "b"}
    assert api.ok(api.put(path, renewed))["spec"]["holderIdentity"] == "b"
    assert api.put(path, renewed).status == 409


def test_resource_version_on_create_is_refused(api: Api) -> None:
    body = pod("p")
    body["metadata"]["resourceVersion"] = "12345"
    response = api.post(api.pods(), body)
    assert response.status == 500
    assert "resourceVersion should not be set" in response.body["message"]
    assert api.get(api.pods("p")).status == 404


def test_put_to_a_missing_pod_is_404(api: Api) -> None:
    assert api.put(api.pods("ghost"), pod("ghost")).status == 404


def test_namespace_and_node_status_subresources(api: Api) -> None:
    ns = api.ok(api.get(api.ns_path))
    ns["status"] = {"phase": "Active"}
    assert api.put(f"{api.ns_path}/status", ns).status == 200
    node_name = api.name("node")
    api.ok(
        api.post(
            "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name}}
        ),
        201,
    )
    node = api.ok(api.get(f"/api/v1/nodes/{node_name}"))
    node["status"] = {"capacity": {"example.com/widgets": "4"}}
    written = api.ok(api.put(f"/api/v1/nodes/{node_name}/status", node))
    assert written["status"]["capacity"]["example.com/widgets"] == "4"
    node["metadata"] = written["metadata"]
    node["status"] = {}
    node["metadata"]["labels"] = {"gpu": "yes"}
    kept = api.ok(api.put(f"/api/v1/nodes/{node_name}", node))
    assert kept["status"]["capacity"]["example.com/widgets"] == "4"


def test_bodies_without_content_type_or_in_yaml(api: Api) -> None:
    plain = api.request("POST", api.pods(), pod("json"), content_type=None)
    assert plain.status == 201
    yaml_body = (
        b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: yaml\nspec:\n  containers:\n"
        b"  - name: c\n    image: registry.k8s.io/pause:3.10\n"
    )
    created = api.request("POST", api.pods(), yaml_body, content_type="application/yaml")
    assert created.status == 201
    assert created.body["metadata"]["name"] == "yaml"


def test_events_of_both_apis_are_one_resource(api: Api) -> None:
    events_v1 = f"/apis/events.k8s.io/v1/namespaces/{api.namespace}/events"
    created = api.ok(
        api.post(
            events_v1,
            {
                "apiVersion": "events.k8s.io/v1",
                "kind": "Event",
                "metadata": {"name": "e1"},
                "eventTime": "2026-11-23T00:00:00.000000Z",
                "reportingController": "example.com/ctl",
                "reportingInstance": "ctl-1",
                "action": "Allocate",
                "reason": "Allocated",
                "type": "Normal",
                "note": "claim allocated",
                "regarding": {"kind": "ResourceClaim", "name": "c", "namespace": api.namespace},
            },
        ),
        201,
    )
    assert created["note"] == "claim allocated"
    core = api.ok(api.get(f"{api.ns_path}/events/e1"))
    assert core["message"] == "claim allocated"
    assert core["reportingComponent"] == "example.com/ctl"
    assert core["involvedObject"]["kind"] == "ResourceClaim"
    assert core["metadata"]["uid"] == created["metadata"]["uid"]
    patched = api.ok(api.patch(f"{api.ns_path}/events/e1", {"message": "changed"}))
    again = api.ok(api.get(f"{events_v1}/e1"))
    assert again["note"] == "changed"
    assert again["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]
    listed = api.ok(api.get(events_v1))
    assert [e["metadata"]["name"] for e in listed["items"]] == ["e1"]
    missing = api.post(
        events_v1,
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "e2"},
            "reason": "X",
            "type": "Normal",
        },
    )
    assert missing.status == 422
    api.ok(api.delete(f"{events_v1}/e1"))
    assert api.get(f"{api.ns_path}/events/e1").status == 404


def test_times_are_stored_in_canonical_form(api: Api) -> None:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{api.namespace}/leases"

    def lease(name: str, renew: str) -> Response:
        return api.post(
            path,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name},
                "spec": {"holderIdentity": "a", "renewTime": renew},
            },
        )

    stored = api.ok(lease("l", "2026-11-23T01:00:00.500000+01:00"), 201)
    assert stored["spec"]["renewTime"] == "2026-11-23T00:00:00.500000Z"  # MicroTime, in UTC
    # MicroTime parses with RFC3339Micro ("2006-01-02T15:04:05.000000Z07:00", apimachinery
    # meta/v1 micro_time.go): exactly six fractional digits, else the body does not decode
    for short in ("2026-11-23T01:00:00.5+01:00", "2026-11-23T01:00:00+01:00"):
        refused = lease("short", short)
        assert refused.status == 400, short
        assert refused.reason == "BadRequest"
    api.ok(api.post(api.pods(), pod("p")), 201)
    condition = {  # Time parses with time.RFC3339: a fraction is accepted and dropped
        "type": "example.com/Probe",
        "status": "True",
        "lastTransitionTime": "2026-11-23T02:00:00.75+02:00",
    }
    patched = api.ok(
        api.patch(
            api.pods("p") + "/status",
            {"status": {"conditions": [condition]}},
            "application/strategic-merge-patch+json",
        )
    )
    stored = next(c for c in patched["status"]["conditions"] if c["type"] == "example.com/Probe")
    assert stored["lastTransitionTime"] == "2026-11-23T00:00:00Z"  # Time: seconds, UTC
    bad = api.post(
        path,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "m"},
            "spec": {"renewTime": "yesterday"},
        },
    )
    assert bad.status == 400


def test_a_new_claim_without_a_class_gets_the_default_storage_class(api: Api) -> None:
    # The DefaultStorageClass admission plugin (plugin/pkg/admission/storage/storageclass/
    # setdefault) fills spec.storageClassName on create when the claim has none, with the
    # newest class marked default (GetDefaultClass); "" is left alone (no class, on purpose).
    name = api.name("default")
    api.ok(
        api.post(
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": name,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": "example.com/csi",
                "volumeBindingMode": "WaitForFirstConsumer",
            },
        ),
        201,
    )

    def claim_of(claim_name: str, **spec: object) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim_name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                **spec,
            },
        }

    claims = f"{api.ns_path}/persistentvolumeclaims"
    defaulted = api.ok(api.post(claims, claim_of("plain")), 201)
    assert defaulted["spec"]["storageClassName"] == name
    empty = api.ok(api.post(claims, claim_of("none", storageClassName="")), 201)
    assert empty["spec"]["storageClassName"] == ""

"""Contract: strict schema validation and the DRA semantic checks (must-have item 11).
Every rejected write leaves the stored state unchanged."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubeapi import codec
from tests.contract.conftest import Api, claim, pod, resource_slice


def _causes(body: dict[str, Any]) -> set[str]:
    return {c.get("field", "") for c in (body.get("details") or {}).get("causes", [])}


def _slice_count(api: Api) -> int:
    return len(
        api.ok(api.get(api.slices(), fieldSelector=f"spec.nodeName={api.name('node')}"))["items"]
    )


def test_unknown_field_is_400_naming_it(api: Api) -> None:
    body = pod("p")
    body["spec"]["containers"][0]["imagee"] = "typo"
    response = api.request("POST", api.pods(), body, query={"fieldValidation": "Strict"})
    assert response.status == 400
    assert "imagee" in response.body["message"]
    assert api.get(api.pods("p")).status == 404


def test_wrong_type_is_400(api: Api) -> None:
    body = resource_slice(api.name("s"), api.name("node"))
    body["spec"]["pool"]["generation"] = "one"
    response = api.post(api.slices(), body)
    assert response.status == 400
    assert "generation" in response.body["message"]
    assert _slice_count(api) == 0


def test_missing_required_field_is_422_with_cause(api: Api) -> None:
    body = resource_slice(api.name("s"), api.name("node"))
    del body["spec"]["pool"]["resourceSliceCount"]
    response = api.post(api.slices(), body)
    assert response.status == 422
    assert response.reason == "Invalid"
    assert "spec.pool.resourceSliceCount" in _causes(response.body)
    assert _slice_count(api) == 0


def test_malformed_json_is_400(api: Api) -> None:
    response = api.request("POST", api.slices(), b'{"apiVersion": ')
    assert response.status == 400
    assert _slice_count(api) == 0


def test_bad_quantity_is_rejected_naming_the_value(api: Api) -> None:
    body = resource_slice(api.name("s"), api.name("node"))
    body["spec"]["devices"][0]["capacity"]["memory"]["value"] = "16Gx"
    response = api.post(api.slices(), body)
    assert response.status == 400
    assert "quantities must match" in response.body["message"]
    assert _slice_count(api) == 0


_SEMANTIC: list[tuple[str, Any, str]] = []


def _case(field: str) -> Any:
    def register(fn: Any) -> Any:
        _SEMANTIC.append((fn.__name__, fn, field))
        return fn

    return register


@_case("spec")
def two_node_selection_fields(body: dict[str, Any]) -> None:
    body["spec"]["allNodes"] = True


@_case("spec")
def no_node_selection_field(body: dict[str, Any]) -> None:
    del body["spec"]["nodeName"]


@_case("spec.devices")
def too_many_devices(body: dict[str, Any]) -> None:
    device = body["spec"]["devices"][0]
    body["spec"]["devices"] = [{**copy.deepcopy(device), "name": f"gpu-{i}"} for i in range(129)]


@_case("spec.devices")
def too_many_devices_with_taints(body: dict[str, Any]) -> None:
    device = body["spec"]["devices"][0]
    body["spec"]["devices"] = [{**copy.deepcopy(device), "name": f"gpu-{i}"} for i in range(65)]
    body["spec"]["devices"][0]["taints"] = [{"key": "example.com/broken", "effect": "NoSchedule"}]


# validateSet (pkg/apis/resource/validation) names the duplicate item: spec.devices[1] since
# 1.37 (declarative list-map validation); 1.34 named its key, spec.devices[1].name
@_case("spec.devices[1]")
def duplicate_device_name(body: dict[str, Any]) -> None:
    body["spec"]["devices"].append(copy.deepcopy(body["spec"]["devices"][0]))


@_case("spec.devices[0].name")
def device_name_not_a_dns_label(body: dict[str, Any]) -> None:
    body["spec"]["devices"][0]["name"] = "GPU_0"


@_case("spec.driver")
def driver_not_a_dns_subdomain(body: dict[str, Any]) -> None:
    body["spec"]["driver"] = "Not_A_Domain"


@_case("spec.devices[0].attributes[model]")
def attribute_with_two_value_types(body: dict[str, Any]) -> None:
    body["spec"]["devices"][0]["attributes"]["model"] = {"string": "T4", "int": 4}


@_case("spec.devices[0].attributes[model]")
def attribute_without_value(body: dict[str, Any]) -> None:
    body["spec"]["devices"][0]["attributes"]["model"] = {}


@_case("spec.nodeSelector.nodeSelectorTerms")
def node_selector_with_two_terms(body: dict[str, Any]) -> None:
    del body["spec"]["nodeName"]
    term = {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
    body["spec"]["nodeSelector"] = {"nodeSelectorTerms": [term, term]}


@pytest.mark.parametrize(
    ("mutate", "field"),
    [(fn, field) for _, fn, field in _SEMANTIC],
    ids=[name for name, _, _ in _SEMANTIC],
)
def test_dra_semantic_checks_are_422_with_causes(api: Api, mutate: Any, field: str) -> None:
    body = resource_slice(api.name("s"), api.name("node"))
    mutate(body)
    if mutate is too_many_devices_with_taints and api.minor < 35:
        # v1.34.4 has no limit on devices with taints (measured): the slice is stored
        assert api.post(api.slices(), body).status == 201
        return
    response = api.post(api.slices(), body)
    assert response.status == 422, response
    assert response.reason == "Invalid"
    if field == "spec.devices[1]" and api.minor < 37:
        field = "spec.devices[1].name"
    assert field in _causes(response.body), response.body
    assert _slice_count(api) == 0


def test_rejected_update_leaves_state_unchanged(api: Api) -> None:
    name = api.name("s")
    created = api.ok(api.post(api.slices(), resource_slice(name, api.name("node"))), 201)
    broken = copy.deepcopy(created)
    broken["spec"]["devices"].append(copy.deepcopy(broken["spec"]["devices"][0]))
    assert api.put(api.slices(name), broken).status == 422
    # a patched object that does not decode is the patch handler's 422 on the field "patch"
    # (apiserver endpoints/handlers/patch.go), where a create or update with it is a 400
    unknown = api.request(
        "PATCH",
        api.slices(name),
        {"spec": {"devices": [{"name": "x", "bogus": 1}]}},
        content_type="application/merge-patch+json",
        query={"fieldValidation": "Strict"},
    )
    assert unknown.status == 422
    assert unknown.reason == "Invalid"
    assert _causes(unknown.body) == {"patch"}
    assert 'strict decoding error: unknown field "spec.devices[0].bogus"' in unknown.body["message"]
    mistyped = api.patch(api.slices(name), {"spec": {"pool": {"generation": "one"}}})
    assert mistyped.status == 422
    assert _causes(mistyped.body) == {"patch"}
    now = api.ok(api.get(api.slices(name)))
    assert now == created


def test_valid_slice_at_the_limit_is_accepted(api: Api) -> None:
    body = resource_slice(api.name("s"), api.name("node"), devices=128)
    assert api.post(api.slices(), body).status == 201


def test_field_validation_warn_and_ignore_drop_unknown_fields(api: Api) -> None:
    body = pod("warned")
    body["spec"]["containers"][0]["imagee"] = "typo"
    warned = api.request("POST", api.pods(), body, query={"fieldValidation": "Warn"})
    assert warned.status == 201
    assert "imagee" not in warned.body["spec"]["containers"][0]
    assert api.warnings(warned) == ['unknown field "spec.containers[0].imagee"']
    body["metadata"]["name"] = "ignored"
    ignored = api.request("POST", api.pods(), body, query={"fieldValidation": "Ignore"})
    assert ignored.status == 201
    assert "warning" not in ignored.headers
    # ValidateCreateOptions (apimachinery meta/v1/validation): a 422 on CreateOptions
    unsupported = api.request("POST", api.pods(), pod("x"), query={"fieldValidation": "Sometimes"})
    assert unsupported.status == 422
    assert unsupported.body["details"]["kind"] == "CreateOptions"
    assert [c["field"] for c in unsupported.body["details"]["causes"]] == ["fieldValidation"]


def test_cel_selectors_must_compile(api: Api) -> None:
    path = "/apis/resource.k8s.io/v1/deviceclasses"
    good = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": api.name("good")},
        "spec": {
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.contract.example.com"'}}]
        },
    }
    assert api.post(path, good).status == 201
    for expression in ("device.driver ==", "device.driver + 1", "device.driver"):
        bad = copy.deepcopy(good)
        bad["metadata"]["name"] = api.name("bad")
        bad["spec"]["selectors"][0]["cel"]["expression"] = expression
        response = api.post(path, bad)
        assert response.status == 422, (expression, response)
        assert "spec.selectors[0].cel.expression" in _causes(response.body)
    claim_body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu",
                            "selectors": [{"cel": {"expression": "device.attributes["}}],
                        },
                    }
                ]
            }
        },
    }
    response = api.post(api.claims(), claim_body)
    assert response.status == 422
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in _causes(response.body)


def _nested(levels: int) -> Any:
    """``[[...[]...]]``: ``levels`` arrays, one inside the next, built without recursion."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("levels", [1_000, 5_000])
def test_deeply_nested_opaque_parameters_are_accepted_and_served_back(
    api: Api, levels: int
) -> None:
    # The API server keeps opaque parameters as raw JSON (runtime.RawExtension); what bounds
    # them is the 10 KiB limit (resource/validation: "must have at most 10240 bytes") and the
    # JSON decoder's nesting limit of 10,000 (k8s.io/apimachinery's json.Unmarshal, via
    # sigs.k8s.io/json). 5,000 arrays are 10,000 bytes: within both.
    body = claim("deep")
    parameters = {"nested": _nested(levels)}
    body["spec"]["devices"]["config"] = [
        {"opaque": {"driver": "gpu.contract.example.com", "parameters": parameters}}
    ]
    created = api.post(api.claims(), body)
    assert created.status == 201, created
    stored = api.ok(api.get(api.claims("deep")))
    served = stored["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert codec.dumps(served) == codec.dumps(parameters)
    listed = api.ok(api.get(api.claims()))["items"]
    assert [c["metadata"]["name"] for c in listed] == ["deep"]


def _admin_claim(name: str) -> dict[str, Any]:
    body = claim(name)
    body["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    return body


def test_admin_access_needs_the_namespace_label(api: Api) -> None:
    # Upstream's AuthorizedForAdmin (pkg/registry/resource), run on create by the ResourceClaim
    # and ResourceClaimTemplate strategies: adminAccess needs the namespace label
    # resource.kubernetes.io/admin-access="true" (DRAAdminNamespaceLabelKey), else Forbidden.
    refused = api.post(api.claims(), _admin_claim("admin"))
    assert refused.status == 422, refused
    assert refused.reason == "Invalid"
    # the cause's path leaves out v1's `exactly` (upstream builds it from the request's index)
    assert _causes(refused.body) == {"spec.devices.requests[0].adminAccess"}
    assert (
        "admin access to devices requires the `resource.kubernetes.io/admin-access: true` label "
        "on the containing namespace"
    ) in refused.body["message"]
    assert api.get(api.claims("admin")).status == 404
    label = {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}
    api.ok(api.patch(api.ns_path, label))
    api.ok(api.post(api.claims(), _admin_claim("admin")))

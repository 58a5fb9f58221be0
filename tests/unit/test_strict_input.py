"""Manifests are read as strictly as kubectl sends them (server-side field validation
``Strict``, kubectl's default since 1.27): unknown fields and duplicate keys are refused with
the path; ``resource.k8s.io`` v1beta1 and v1beta2 objects are converted to v1 as the API
server converts them (kubernetes ``pkg/apis/resource/v1beta1/conversion.go``:
``Convert_v1beta1_DeviceRequest_To_resource_DeviceRequest`` moves the main request fields
under ``exactly`` when any is set, ``Convert_v1beta1_Device_To_resource_Device`` flattens
``basic``, ``Convert_v1beta1_ResourceSliceSpec_To_resource_ResourceSliceSpec`` unsets an empty
nodeName and a false allNodes; v1beta2 has the v1 shapes); older versions are refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from biaxial.simulate.convert import to_v1
from biaxial.simulate.manifests import load_objects
from driver.api.claims import ResourceClaim
from driver.api.errors import ManifestError
from driver.api.model import ResourceSlice
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from tests import gen_field_schema


def write(tmp_path: Path, text: str, name: str = "m.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


POD = """
apiVersion: v1
kind: Pod
metadata:
  name: p
spec:
  schedulerName: biaxial
  containers:
    - name: c
      image: busybox
      resources:
        limits:
          nvidia.com/gpu: 1
"""


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "limits:",
            "limit:",
            "spec.containers[0].resources.limit: unknown field; did you mean limits?",
        ),
        (
            "  schedulerName",
            "  schedulerNme",
            "spec.schedulerNme: unknown field; did you mean schedulerName?",
        ),
        (
            "  schedulerName: biaxial",
            "  schedulerName: biaxial\n  resourceClaim: []",
            "spec.resourceClaim: unknown field; did you mean resourceClaims?",
        ),
        (
            "image: busybox",
            "image: [busybox]",
            "spec.containers[0].image: expected a string, got a list",
        ),
        (
            "  containers:",
            "  containers: {}\n  initContainers:",
            "spec.containers: expected a list, got an object",
        ),
    ],
)
def test_unknown_fields_and_wrong_shapes_name_the_path(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    path = write(tmp_path, POD.replace(old, new, 1))
    with pytest.raises(ManifestError) as info:
        load_objects([path])
    assert str(info.value) == f"{path} document 1 (Pod p): {message}"


def test_an_unknown_capacity_field_in_a_claim_names_the_path(tmp_path: Path) -> None:
    claim = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: c
spec:
  devices:
    requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.biaxial.dev
          capacity:
            request:
              memory: 4Gi
"""
    with pytest.raises(
        ManifestError,
        match=r"requests\[0\]\.exactly\.capacity\.request: unknown field; did you mean requests\?",
    ):
        load_objects([write(tmp_path, claim)])


def test_alias_bombs_are_refused_before_anything_walks_them(tmp_path: Path) -> None:
    # PyYAML shares one object per anchor, so loading is cheap, but every later walk
    # (validation, conversion, JSON) would visit 10**9 values. kubectl's YAML decoder
    # (go-yaml) refuses such documents too ("excessive aliasing").
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = "\n".join(["apiVersion: v1", "kind: ConfigMap", "metadata: {name: lol}", "data:"])
    bomb += "\n" + "\n".join("  " + line for line in lines) + "\n"
    with pytest.raises(ManifestError, match=r"document 1: YAML aliases expand to more than"):
        load_objects([write(tmp_path, bomb)])
    # Ordinary anchors and aliases (the same limits written once) still load.
    shared = POD.replace("limits:", "limits: &gpu").replace(
        "nvidia.com/gpu: 1", "nvidia.com/gpu: 1\n        requests: *gpu"
    )
    (pod,) = load_objects([write(tmp_path, shared)])
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"nvidia.com/gpu": 1}


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    twice = POD.replace("  name: p", "  name: p\n  name: q")
    with pytest.raises(ManifestError, match="duplicate key 'name'"):
        load_objects([write(tmp_path, twice)])
    # Two objects concatenated without '---': YAML would merge them, last key winning.
    merged = POD + POD.replace("name: p", "name: other")
    with pytest.raises(
        ManifestError, match=r"duplicate key 'apiVersion' \(two objects without '---'"
    ):
        load_objects([write(tmp_path, merged)])
    # The same in JSON.
    with pytest.raises(ManifestError, match="duplicate key 'kind'"):
        load_objects(
            [write(tmp_path, '{"apiVersion": "v1", "kind": "Pod", "kind": "Node"}', "m.json")]
        )


def test_yaml_merge_keys_may_still_override(tmp_path: Path) -> None:
    text = """
apiVersion: v1
kind: Pod
metadata:
  name: p
  labels: &base {app: a, tier: web}
  annotations:
    <<: {x: "1"}
    x: "2"
spec:
  containers: [{name: c, image: i}]
"""
    (pod,) = load_objects([write(tmp_path, text)])
    assert pod["metadata"]["annotations"] == {"x": "2"}


def test_unquoted_timestamps_stay_strings(tmp_path: Path) -> None:
    text = POD.replace("  name: p", "  name: p\n  creationTimestamp: 2026-01-02T03:04:05Z")
    (pod,) = load_objects([write(tmp_path, text)])
    assert pod["metadata"]["creationTimestamp"] == "2026-01-02T03:04:05Z"


# --------------------------------------------------------------------------- conversion

V1BETA1_CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1beta1",
    "kind": "ResourceClaim",
    "metadata": {"name": "c", "namespace": "default"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "deviceClassName": "gpu.biaxial.dev",
                    "count": 2,
                    "capacity": {"requests": {"memory": "4Gi"}},
                },
                {"name": "admin", "deviceClassName": "gpu.biaxial.dev", "adminAccess": False},
                {
                    "name": "either",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "gpu.biaxial.dev", "count": 2},
                        {"name": "small", "deviceClassName": "gpu.biaxial.dev"},
                    ],
                },
            ],
            "constraints": [{"matchAttribute": "resource.kubernetes.io/numaNode"}],
        }
    },
}


def test_v1beta1_requests_move_under_exactly() -> None:
    before = copy.deepcopy(V1BETA1_CLAIM)
    claim = to_v1(V1BETA1_CLAIM, "test")
    assert before == V1BETA1_CLAIM, "conversion must not mutate its input"
    assert claim["apiVersion"] == "resource.k8s.io/v1"
    assert claim["spec"]["devices"]["requests"] == [
        {
            "name": "gpu",
            "exactly": {
                "deviceClassName": "gpu.biaxial.dev",
                "count": 2,
                "capacity": {"requests": {"memory": "4Gi"}},
            },
        },
        # adminAccess: false is set (a non-nil pointer upstream).
        {"name": "admin", "exactly": {"deviceClassName": "gpu.biaxial.dev", "adminAccess": False}},
        {
            "name": "either",
            "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.biaxial.dev", "count": 2},
                {"name": "small", "deviceClassName": "gpu.biaxial.dev"},
            ],
        },
    ]
    assert ResourceClaim.from_api(claim).requests[0].exactly is not None


def test_v1beta1_and_v1beta2_files_load_as_v1(tmp_path: Path) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "x"}]}}},
    }
    klass = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceClass",
        "metadata": {"name": "x"},
        "spec": {"selectors": [{"cel": {"expression": "true"}}]},
    }
    loaded = load_objects([write(tmp_path, yaml.safe_dump_all([template, klass]))])
    assert [o["apiVersion"] for o in loaded] == ["resource.k8s.io/v1"] * 2
    assert loaded[0]["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpu", "exactly": {"deviceClassName": "x"}}
    ]
    assert loaded[1]["spec"] == klass["spec"]


def test_v1beta1_slices_are_flattened_to_the_v1_slice() -> None:
    with open_backend("t4x4", node_name="n1") as backend:
        (v1,) = (
            s.to_api()
            for s in build_slices(backend.discover(), node_name="n1", driver_name="gpu.biaxial.dev")
        )
    beta = copy.deepcopy(v1)
    beta["apiVersion"] = "resource.k8s.io/v1beta1"
    beta["spec"]["allNodes"] = False
    beta["spec"]["devices"] = [
        {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
        for d in v1["spec"]["devices"]
    ]
    assert to_v1(beta, "test") == v1
    assert ResourceSlice.from_api(to_v1(beta, "test")) == ResourceSlice.from_api(v1)


@pytest.mark.parametrize("version", ["v1alpha2", "v1alpha3"])
def test_older_resource_versions_are_refused_by_name(tmp_path: Path, version: str) -> None:
    text = json.dumps(
        {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "ResourceClaim",
            "metadata": {"name": "c"},
        }
    )
    with pytest.raises(ManifestError) as info:
        load_objects([write(tmp_path, text, "c.json")])
    assert (
        f"resource.k8s.io/{version} ResourceClaim is not served by Kubernetes 1.34 or newer"
        in str(info.value)
    )


def test_unknown_fields_of_a_v1beta1_object_are_caught_before_conversion(tmp_path: Path) -> None:
    claim = copy.deepcopy(V1BETA1_CLAIM)
    claim["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": "x"}
    with pytest.raises(ManifestError, match=r"requests\[0\]\.exactly: unknown field"):
        load_objects([write(tmp_path, json.dumps(claim), "c.json")])


def test_the_field_schema_is_generated_from_the_official_schemas() -> None:
    assert gen_field_schema.OUTPUT.read_text(encoding="utf-8") == gen_field_schema.generate(), (
        "biaxial/simulate/fields.json is stale: run make fields"
    )


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.yaml", "a: " + "[" * 100_000 + "]" * 100_000),
        ("deep.json", "[" * 100_000 + "]" * 100_000),
        ("indent.yaml", "a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 1200))),
    ],
)
def test_absurd_nesting_is_refused_not_a_crash(tmp_path: Path, name: str, text: str) -> None:
    # libyaml's C parser overflows the C stack on deep nesting (a segfault, not an error).
    with pytest.raises(ManifestError, match="nested"):
        load_objects([write(tmp_path, text, name)])


def test_json_files_are_read_as_json_and_yaml_flow_still_works(tmp_path: Path) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c"}]},
    }
    assert load_objects([write(tmp_path, json.dumps(pod), "p.json")]) == [pod]
    flow = "{apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {containers: [{name: c}]}}"
    assert load_objects([write(tmp_path, flow, "p.yaml")]) == [pod]
    with pytest.raises(ManifestError, match="duplicate key 'name'"):
        load_objects([write(tmp_path, '{"metadata": {"name": "a", "name": "b"}}', "d.json")])


def test_every_kind_the_simulator_reads_is_checked_strictly() -> None:
    from biaxial.simulate.kinds import READ
    from biaxial.simulate.schema import known

    unchecked = [
        f"{spec.api_version} {kind}"
        for kind, spec in READ.items()
        if kind != "Cluster" and not known(spec.api_version, kind)
    ]
    assert unchecked == [], "add them to tests/gen_field_schema.py ROOTS and run make fields"


@pytest.mark.parametrize("version", ["resource.k8s.io/v1", "resource.k8s.io/v1beta2"])
def test_a_flat_v1beta1_request_in_v1_is_sent_under_exactly(tmp_path: Path, version: str) -> None:
    # Before: "spec.devices.requests[0].deviceClassName: unknown field".
    claim = f"""
apiVersion: {version}
kind: ResourceClaim
metadata:
  name: c
spec:
  devices:
    requests:
      - name: gpu
        deviceClassName: gpu.biaxial.dev
"""
    path = write(tmp_path, claim)
    with pytest.raises(ManifestError) as info:
        load_objects([path])
    assert str(info.value) == (
        f"{path} document 1 (ResourceClaim c): spec.devices.requests[0].deviceClassName: "
        f"unknown field: in {version} a request's deviceClassName goes under exactly: "
        "(requests[].exactly.deviceClassName); directly on the request is the v1beta1 shape"
    )


def test_the_pre_1_31_claim_source_shows_the_current_shape(tmp_path: Path) -> None:
    # Before: "spec.resourceClaims[0].source: unknown field".
    pod = POD.replace(
        "spec:\n",
        "spec:\n  resourceClaims:\n    - name: gpu\n      source:\n"
        "        resourceClaimTemplateName: gpu\n",
        1,
    )
    path = write(tmp_path, pod)
    with pytest.raises(ManifestError) as info:
        load_objects([path])
    assert str(info.value) == (
        f"{path} document 1 (Pod p): spec.resourceClaims[0].source: unknown field: source is "
        "the shape before Kubernetes 1.31; write resourceClaimName: <claim> or "
        "resourceClaimTemplateName: <template> on the entry itself"
    )

"""KEP-5004 bridge: the special claim, exactly as upstream shapes it, plus HAMi folding."""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace
from typing import Any

import pytest

from driver.api.claims import ResourceClaim
from driver.api.errors import ManifestError
from driver.api.quantity import Quantity
from driver.scheduling.bridge import (
    BridgeMemo,
    ExtendedResourceMap,
    PodLegacyResources,
    build_bridge_claim,
    dra_resources_on_node,
    is_bridge_claim,
    legacy_resources,
)

GIB = 1024**3


@dataclass(frozen=True)
class _Class:
    name: str
    extended_resource_name: str | None = None
    creation_timestamp: str = ""


CLASSES = ExtendedResourceMap.from_classes(
    [
        _Class("gpu.biaxial.dev", "nvidia.com/gpu", "2026-01-01T00:00:00Z"),
        _Class("mig.biaxial.dev"),
    ]
)


def container(
    name: str,
    *,
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "cuda", "resources": resources, **extra}


def pod(
    *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), name: str = "infer-0"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": "uid-1"},
        "spec": spec,
    }


def build(p: dict[str, Any], **kwargs: Any) -> Any:
    before = copy.deepcopy(p)
    parsed = legacy_resources(p, CLASSES, max_gpu_memory_bytes=24 * GIB)
    claim = build_bridge_claim(p, parsed, CLASSES, **kwargs)
    assert p == before, "the pod must not be mutated"
    return claim


def test_hami_container_yields_exact_kep5004_claim() -> None:
    p = pod(
        container(
            "cuda",
            limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": "7500", "nvidia.com/gpucores": 30},
            requests={"cpu": "1", "memory": "1Gi"},
        )
    )
    bridge = build(p)
    assert bridge is not None
    assert bridge.claim == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": "infer-0-extended-resources-",
            "namespace": "ml",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "infer-0",
                    "uid": "uid-1",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        # sorted keys: cpu, memory, nvidia.com/gpu, nvidia.com/gpucores, ...
                        "name": "container-0-request-2",
                        "exactly": {
                            "deviceClassName": "gpu.biaxial.dev",
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": {"memory": "7500Mi", "cores": "30"}},
                        },
                    }
                ]
            }
        },
    }
    assert bridge.pod_status("infer-0-extended-resources-abcde") == {
        "resourceClaimName": "infer-0-extended-resources-abcde",
        "requestMappings": [
            {
                "containerName": "cuda",
                "resourceName": "nvidia.com/gpu",
                "requestName": "container-0-request-2",
            }
        ],
    }
    assert is_bridge_claim(bridge.claim, "infer-0", "uid-1")
    assert not is_bridge_claim(bridge.claim, "infer-0", "other-uid")


def test_requests_sorted_and_indexed_per_container() -> None:
    p = pod(
        container("a", limits={"nvidia.com/gpu": 2}),
        container(
            "b",
            requests={
                "cpu": "1",
                "deviceclass.resource.kubernetes.io/mig.biaxial.dev": 1,
                "nvidia.com/gpu": 1,
            },
        ),
    )
    bridge = build(p)
    requests = bridge.claim["spec"]["devices"]["requests"]
    assert [
        (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in requests
    ] == [
        ("container-0-request-0", "gpu.biaxial.dev", 2),
        ("container-1-request-1", "mig.biaxial.dev", 1),
        ("container-1-request-2", "gpu.biaxial.dev", 1),
    ]
    assert "capacity" not in requests[0]["exactly"]


def test_init_container_reuses_later_long_lived_request() -> None:
    p = pod(
        container("main", limits={"nvidia.com/gpu": 2}),
        init=(container("warmup", limits={"nvidia.com/gpu": 1}),),
    )
    bridge = build(p)
    assert [r["name"] for r in bridge.claim["spec"]["devices"]["requests"]] == [
        "container-1-request-0"
    ]
    assert list(bridge.request_mappings) == [
        {
            "containerName": "main",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-1-request-0",
        },
        {
            "containerName": "warmup",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-1-request-0",
        },
    ]


def test_only_largest_short_lived_request_is_kept() -> None:
    p = pod(
        container("main", limits={"cpu": "1"}),
        init=(
            container("i0", limits={"nvidia.com/gpu": 1}),
            container("i1", limits={"nvidia.com/gpu": 3}),
            container("side", limits={"nvidia.com/gpu": 1}, restartPolicy="Always"),
        ),
    )
    bridge = build(p)
    requests = bridge.claim["spec"]["devices"]["requests"]
    # i0 and i1 start before the sidecar (index 2), so both may reuse its request (1 GPU).
    assert [(r["name"], r["exactly"]["count"]) for r in requests] == [
        ("container-1-request-0", 2),
        ("container-2-request-0", 1),
    ]
    by_container = [(m["containerName"], m["requestName"]) for m in bridge.request_mappings]
    assert by_container == [
        ("side", "container-2-request-0"),
        ("i0", "container-2-request-0"),
        ("i1", "container-2-request-0"),
        ("i1", "container-1-request-0"),
    ]


def test_gpumem_percentage_resolved_per_node() -> None:
    p = pod(container("c", limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}))
    bridge = build(p, gpu_memory_bytes=15360 * 1024 * 1024)
    assert bridge.claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": "7680Mi"}
    }


def test_node_with_device_plugin_skips_bridge() -> None:
    p = pod(container("c", limits={"nvidia.com/gpu": 1}))
    resources = legacy_resources(p, CLASSES).resources
    on_dp_node = dra_resources_on_node(resources, {"nvidia.com/gpu": Quantity.of(4)})
    assert on_dp_node == frozenset()
    assert build(p, dra_resources=on_dp_node) is None
    assert dra_resources_on_node(resources, {"nvidia.com/gpu": Quantity.of(0)}) == {
        "nvidia.com/gpu"
    }


def test_pod_without_dra_resources_needs_no_claim() -> None:
    assert build(pod(container("c", requests={"cpu": "1", "example.com/foo": 1}))) is None


def test_newest_class_wins_then_lower_name() -> None:
    classes = [
        _Class("old", "nvidia.com/gpu", "2025-01-01T00:00:00Z"),
        _Class("new-b", "nvidia.com/gpu", "2026-01-01T00:00:00Z"),
        _Class("new-a", "nvidia.com/gpu", "2026-01-01T00:00:00Z"),
    ]
    mapping = ExtendedResourceMap.from_classes(classes)
    assert mapping.class_for("nvidia.com/gpu") == "new-a"
    assert mapping.class_for("deviceclass.resource.kubernetes.io/old") == "old"


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"nvidia.com/gpumem": 1000}, "nvidia.com/gpumem given without nvidia.com/gpu"),
        ({"nvidia.com/gpucores": 10}, "nvidia.com/gpucores given without nvidia.com/gpu"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 101}, "out of range"),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10, "nvidia.com/gpumem-percentage": 10},
            "are exclusive",
        ),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100000}, "larger than every GPU"),
        ({"nvidia.com/gpu": "1500m"}, "not a whole number"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}, "out of range"),
        ({"nvidia.com/gpu": "lots"}, "invalid quantity"),
    ],
)
def test_bad_combinations_are_specific_errors(limits: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message) as info:
        legacy_resources(pod(container("c", limits=limits)), CLASSES, max_gpu_memory_bytes=24 * GIB)
    assert "pod ml/infer-0 container c" in str(info.value)


def _built(p: dict[str, Any], **kwargs: Any) -> tuple[Any, ResourceClaim] | None:
    """What the memo must give: the claim built and parsed for this pod alone."""
    claim = build(p, **kwargs)
    if claim is None:
        return None
    raw = copy.deepcopy(claim.claim)
    raw["metadata"].update(name="placeholder", uid=f"{p['metadata']['uid']}/x")
    return claim, ResourceClaim.from_api(raw)


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 30},
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50},
        {"cpu": 1},
    ],
)
def test_memo_gives_each_pod_of_a_shape_what_building_gives(limits: dict[str, Any]) -> None:
    checked: list[ResourceClaim] = []
    memo = BridgeMemo(CLASSES, "gpu.biaxial.dev", checked.append)
    given = []
    for i, namespace in enumerate(("ml", "ml", "other")):
        p = pod(container("main", limits=limits), name=f"infer-{i}")
        p["metadata"].update(namespace=namespace, uid=f"uid-{i}")
        p["metadata"]["annotations"] = (
            {"nvidia.com/vgpu-mode": "hami-core"} if "cpu" not in limits else {}
        )
        parsed = legacy_resources(p, CLASSES, max_gpu_memory_bytes=24 * GIB)
        kwargs: dict[str, Any] = {
            "dra_resources": frozenset({"nvidia.com/gpu"}),
            "gpu_memory_bytes": 24 * GIB,
        }
        got = memo.claim(p, parsed, name="placeholder", uid=f"uid-{i}/x", **kwargs)
        want = _built(p, driver_name="gpu.biaxial.dev", **kwargs)
        assert got == want
        given.append(got)
    assert len(checked) == (0 if "cpu" in limits else 1), "checked once per shape"
    if given[0] is None:
        return
    (first, first_model), (second, second_model) = given[0], given[1]
    assert first.claim["spec"] is not second.claim["spec"]
    assert (
        first.claim["spec"]["devices"]["requests"][0]
        is not (second.claim["spec"]["devices"]["requests"][0])
    )
    assert first.request_mappings[0] is not second.request_mappings[0]
    assert first_model.annotations is not second_model.annotations
    assert first_model.owner_references[0] is not second_model.owner_references[0]


def test_memo_keeps_no_refused_claim() -> None:
    def refuse(claim: ResourceClaim) -> None:
        raise ManifestError(f"claim {claim.key}: refused")

    memo = BridgeMemo(CLASSES, "gpu.biaxial.dev", refuse)
    for namespace in ("ml", "other"):
        p = pod(container("main", limits={"nvidia.com/gpu": 1}))
        p["metadata"]["namespace"] = namespace
        parsed = legacy_resources(p, CLASSES)
        with pytest.raises(ManifestError, match=f"claim {namespace}/placeholder: refused"):
            memo.claim(
                p,
                parsed,
                dra_resources=frozenset({"nvidia.com/gpu"}),
                gpu_memory_bytes=None,
                name="placeholder",
                uid="u",
            )


def test_a_renamed_demand_is_what_replace_gives() -> None:
    """``PodLegacyResources.named`` passes every other field on: a field added to the class
    must be passed on there too (the list below then fails until it is)."""
    assert [f.name for f in fields(PodLegacyResources)] == [
        "pod_name",
        "requests",
        "long_lived",
        "hints",
    ]
    p = pod(container("main", limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}))
    p["metadata"]["annotations"] = {"nvidia.com/use-gputype": "A100"}
    parsed = legacy_resources(p, CLASSES, max_gpu_memory_bytes=24 * GIB)
    assert parsed.named("ml/other") == replace(parsed, pod_name="ml/other")


def test_memo_parses_each_pod_of_a_shape_as_parsing_does() -> None:
    memo = BridgeMemo(CLASSES, "gpu.biaxial.dev", lambda claim: None)
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}
    for i in range(3):
        p = pod(container("main", limits=limits), name=f"infer-{i}")
        p["metadata"]["annotations"] = {"nvidia.com/use-gputype": "A100"}
        before = copy.deepcopy(p)
        got = memo.resources(p, max_gpu_memory_bytes=24 * GIB)
        assert p == before
        assert got == legacy_resources(p, CLASSES, max_gpu_memory_bytes=24 * GIB)
        assert got.pod_name == f"ml/infer-{i}"
    # 1 and True are equal keys but not equal counts: each is parsed for itself.
    for value in (1, True):
        p = pod(container("main", limits={"nvidia.com/gpu": value}))
        try:
            want: Any = legacy_resources(p, CLASSES)
        except ManifestError as exc:
            want = str(exc)
        try:
            got_: Any = memo.resources(p, max_gpu_memory_bytes=None)
        except ManifestError as exc:
            got_ = str(exc)
        assert got_ == want

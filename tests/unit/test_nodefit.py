"""The node filter, table-driven: kube-scheduler's checks and wording."""

from __future__ import annotations

import copy
import random
from fractions import Fraction
from typing import Any

import pytest

from driver.api.errors import ManifestError
from driver.scheduling.nodefit import (
    NodeUsage,
    PodSchedulingFacts,
    filter_node,
    pod_requests,
    resource_utilisation,
    unschedulable_message,
)
from tests.unit.builders import label_term, node, node_selector, taint, to_node


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
            ],
            **spec,
        },
    }


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": node_selector(
            label_term("zone", values=["a"])
        )
    }
}

FILTER = [
    ("fits", pod(), node(), NodeUsage(), None),
    ("cordoned", pod(), node(unschedulable=True), NodeUsage(), "node(s) were unschedulable"),
    (
        "cordoned but tolerated",
        pod(
            tolerations=[
                {
                    "key": "node.kubernetes.io/unschedulable",
                    "operator": "Exists",
                    "effect": "NoSchedule",
                }
            ]
        ),
        node(unschedulable=True),
        NodeUsage(),
        None,
    ),
    (
        "untolerated taint",
        pod(),
        node(taints=[taint("gpu", value="yes")]),
        NodeUsage(),
        "node(s) had untolerated taint {gpu: yes}",
    ),
    (
        "tolerated taint",
        pod(tolerations=[{"key": "gpu", "value": "yes"}]),
        node(taints=[taint("gpu", value="yes")]),
        NodeUsage(),
        None,
    ),
    (
        "tolerate everything",
        pod(tolerations=[{"operator": "Exists"}]),
        node(taints=[taint("a"), taint("b", "NoExecute")]),
        NodeUsage(),
        None,
    ),
    (
        "PreferNoSchedule does not filter",
        pod(),
        node(taints=[taint("soft", "PreferNoSchedule")]),
        NodeUsage(),
        None,
    ),
    (
        "toleration for another effect",
        pod(tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]),
        node(taints=[taint("gpu")]),
        NodeUsage(),
        "node(s) had untolerated taint {gpu: }",
    ),
    (
        "not ready",
        pod(),
        node(ready=False),
        NodeUsage(),
        "node(s) had untolerated taint {node.kubernetes.io/not-ready: }",
    ),
    (
        "nodeSelector mismatch",
        pod(nodeSelector={"zone": "b"}),
        node(labels={"zone": "a"}),
        NodeUsage(),
        "node(s) didn't match Pod's node affinity/selector",
    ),
    (
        "nodeSelector match",
        pod(nodeSelector={"zone": "a"}),
        node(labels={"zone": "a"}),
        NodeUsage(),
        None,
    ),
    (
        "affinity mismatch",
        pod(affinity=AFFINITY),
        node(labels={"zone": "b"}),
        NodeUsage(),
        "node(s) didn't match Pod's node affinity/selector",
    ),
    ("affinity match", pod(affinity=AFFINITY), node(labels={"zone": "a"}), NodeUsage(), None),
    ("cpu full", pod(), node(), NodeUsage(requested={"cpu": 15600}), "Insufficient cpu"),
    (
        "memory full",
        pod(),
        node(allocatable={"cpu": "4", "memory": "1Gi", "pods": "10"}),
        NodeUsage(requested={"memory": 1}),
        "Insufficient memory",
    ),
    (
        "pods full",
        pod(),
        node(allocatable={"cpu": "4", "memory": "8Gi", "pods": "2"}),
        NodeUsage(pods=2),
        "Too many pods",
    ),
    (
        "device-plugin resource short",
        pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]),
        node(allocatable={"cpu": "4", "memory": "8Gi", "pods": "10", "nvidia.com/gpu": "1"}),
        NodeUsage(),
        "Insufficient nvidia.com/gpu",
    ),
]


@pytest.mark.parametrize("row", FILTER, ids=[r[0] for r in FILTER])
def test_filter(row: tuple[Any, ...]) -> None:
    case, raw_pod, raw_node, usage, expected = row
    before = copy.deepcopy(raw_pod)
    facts = PodSchedulingFacts.from_pod(raw_pod)
    assert filter_node(facts, to_node(raw_node), usage) == expected, case
    assert raw_pod == before


def test_dra_resources_are_not_checked_against_allocatable() -> None:
    facts = PodSchedulingFacts.from_pod(
        pod(containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}])
    )
    assert filter_node(facts, to_node(node()), NodeUsage()) == "Insufficient nvidia.com/gpu"
    assert (
        filter_node(facts, to_node(node()), NodeUsage(), dra_resources={"nvidia.com/gpu"}) is None
    )


REQUESTS = [
    (
        "containers add up",
        {
            "containers": [
                {"resources": {"requests": {"cpu": "1"}}},
                {"resources": {"requests": {"cpu": "250m"}}},
            ]
        },
        {"cpu": 1250},
    ),
    (
        "limits default requests",
        {"containers": [{"resources": {"limits": {"memory": "1Ki"}}}]},
        {"memory": 1024},
    ),
    (
        "init container peak wins",
        {
            "initContainers": [{"resources": {"requests": {"cpu": "3"}}}],
            "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        },
        {"cpu": 3000},
    ),
    (
        "sidecars run beside later init containers and the app",
        {
            "initContainers": [
                {"restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                {"resources": {"requests": {"cpu": "2"}}},
            ],
            "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        },
        {"cpu": 3000},
    ),
    (
        "overhead is added",
        {"containers": [{"resources": {"requests": {"cpu": "1"}}}], "overhead": {"cpu": "100m"}},
        {"cpu": 1100},
    ),
]


@pytest.mark.parametrize("row", REQUESTS, ids=[r[0] for r in REQUESTS])
def test_pod_requests(row: tuple[Any, ...]) -> None:
    case, spec, expected = row
    assert pod_requests({"spec": spec}) == expected, case


def test_bad_pod_input_is_a_manifest_error() -> None:
    with pytest.raises(ManifestError, match="resource cpu"):
        PodSchedulingFacts.from_pod(
            pod(containers=[{"name": "c", "resources": {"requests": {"cpu": "lots"}}}])
        )
    with pytest.raises(ManifestError, match="unknown operator"):
        PodSchedulingFacts.from_pod(pod(tolerations=[{"key": "k", "operator": "Near"}]))


def test_message_sorted_like_kube_scheduler() -> None:
    message = unschedulable_message(
        5, {"Insufficient cpu": 2, "node(s) were unschedulable": 1, "insufficient GPU memory": 2}
    )
    assert message == (
        "0/5 nodes are available: 1 node(s) were unschedulable, 2 Insufficient cpu, "
        "2 insufficient GPU memory."
    )


# --------------------------------------------------------------------------- pod-level resources


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        # component-helpers PodRequests: pod-level requests replace the containers' sum
        ({"requests": {"cpu": "9"}}, {"cpu": 9000, "memory": 1024**3}),
        ({"requests": {"cpu": "2", "memory": "4Gi"}}, {"cpu": 2000, "memory": 4 * 1024**3}),
        # the API server defaults a pod-level request to the pod-level limit when no container
        # requests the resource, else to the containers' sum
        (
            {"limits": {"hugepages-2Mi": "4Mi"}},
            {"cpu": 500, "memory": 1024**3, "hugepages-2Mi": 4 * 1024**2},
        ),
        ({"limits": {"cpu": "4"}}, {"cpu": 500, "memory": 1024**3}),
        # only cpu, memory and hugepages are pod-level resources
        ({"requests": {"nvidia.com/gpu": "1"}}, {"cpu": 500, "memory": 1024**3}),
    ],
)
def test_pod_level_resources(resources: dict[str, Any], expected: dict[str, int]) -> None:
    assert pod_requests(pod(resources=resources)) == expected


def test_pod_level_cpu_is_checked_against_the_node() -> None:
    """The issue's measurement: a pod asking 9 CPUs at pod level on an 8-CPU node."""
    facts = PodSchedulingFacts.from_pod(pod(resources={"requests": {"cpu": "9"}}))
    eight = to_node(node(allocatable={"cpu": "8", "memory": "32Gi", "pods": "10"}))
    assert filter_node(facts, eight, NodeUsage()) == "Insufficient cpu"


def test_resource_utilisation_counts_unset_requests_as_upstreams_defaults() -> None:
    """NodeResourcesFit scoring: a pod without a cpu (memory) request counts 100m (200Mi);
    an explicit zero stays zero."""
    allocatable = {"cpu": 1000, "memory": 1000 * 1024**2}
    usage = NodeUsage().plus({})  # one pod without requests: 100m, 200Mi
    assert resource_utilisation(allocatable, usage, {"cpu": 400, "memory": 0}) == Fraction(
        5 + 2, 20
    )


@pytest.mark.parametrize("seed", range(5))
def test_a_node_usage_summed_in_one_pass_equals_one_pod_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    keys = ("cpu", "memory", "nvidia.com/gpu", "pods", "ephemeral-storage")
    pods = [
        {k: rng.choice((0, 1, 250, 2**40)) for k in rng.sample(keys, rng.randrange(len(keys)))}
        for _ in range(rng.randrange(12))
    ]
    start = NodeUsage(requested={"cpu": 500}, pods=2, nonzero_cpu=500, nonzero_memory=7)
    for base in (NodeUsage(), start):
        one_at_a_time = base
        for requests in pods:
            one_at_a_time = one_at_a_time.plus(requests)
        summed = base.plus_all(iter(pods))
        assert summed == one_at_a_time
        assert list(summed.requested) == list(one_at_a_time.requested)

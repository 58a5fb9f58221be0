"""The simulator: the four patterns from the examples, HAMi manifests unchanged, bad input per
pod, template claims, the summary and the plot."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from biaxial.simulate.manifests import load_objects
from biaxial.simulate.simulator import SimulationResult, expand_deployment, simulate
from biaxial.simulate.workloads import deployment_replicaset
from driver.api.errors import ManifestError
from driver.scheduling.policy import PolicyDefaults
from tests.unit.builders import device_class, gpu_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CLASSES = [
    o for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for o in load_objects([str(p)])
]
REFERENCE = load_objects([str(EXAMPLES / "reference-cluster.yaml")])


def run(*objects: dict[str, Any], **kwargs: Any) -> SimulationResult:
    inputs = [*REFERENCE, *objects]
    before = copy.deepcopy(inputs)
    result = simulate(inputs, default_classes=CLASSES, **kwargs)
    assert inputs == before, "simulate must not mutate its input"
    return result


def by_pod(result: SimulationResult) -> dict[str, tuple[str, str]]:
    return {p.pod.split("/")[1]: (p.node, str(p.devices[0]["device"])) for p in result.placements}


@pytest.mark.parametrize(
    ("example", "check"),
    [
        ("a-binpack-binpack", "one node, two GPUs"),
        ("b-spread-binpack", "two per node, one GPU per node"),
        ("c-binpack-spread", "one node, four GPUs"),
        ("d-spread-spread", "two per node, four distinct GPUs"),
    ],
)
def test_four_patterns_place_as_designed(example: str, check: str) -> None:
    objects = load_objects([str(EXAMPLES / "four-patterns" / f"{example}.yaml")])
    result = run(*objects)
    assert not result.unschedulable
    placed = list(by_pod(result).values())
    assert len(placed) == 4
    nodes = {n for n, _ in placed}
    gpus = set(placed)
    per_node = {n: sum(1 for m, _ in placed if m == n) for n in nodes}
    if check == "one node, two GPUs":
        assert len(nodes) == 1
        assert len(gpus) == 2
    elif check == "two per node, one GPU per node":
        assert per_node == {"gpu-t4": 2, "gpu-a10g": 2}
        assert len(gpus) == 2
    elif check == "one node, four GPUs":
        assert len(nodes) == 1
        assert len(gpus) == 4
    else:
        assert per_node == {"gpu-t4": 2, "gpu-a10g": 2}
        assert len(gpus) == 4
    again = run(*objects)
    assert again.to_json()["placements"] == result.to_json()["placements"], "deterministic"


def test_hami_deployment_runs_unchanged() -> None:
    objects = load_objects([str(EXAMPLES / "hami" / "vllm-deployment.yaml")])
    result = run(*objects)
    out = result.to_json()
    assert [p["pod"] for p in out["placements"]] == [
        "default/vllm-small-0",
        "default/vllm-small-1",
        "default/vllm-small-2",
    ]
    # hami.io policies: node binpack, GPU spread -> one node, one GPU per pod.
    assert {p["node"] for p in out["placements"]} == {"gpu-t4"}
    assert [p["devices"][0]["device"] for p in out["placements"]] == ["gpu-0", "gpu-1", "gpu-2"]
    pod = next(o for o in out["objects"] if o["kind"] == "Pod")
    claim_name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    assert claim_name.startswith("vllm-small-0-extended-resources-")
    assert len(claim_name) == len("vllm-small-0-extended-resources-") + 5
    claim = next(o for o in out["objects"] if o["metadata"].get("name") == claim_name)
    pod_uid = pod["metadata"]["uid"]
    assert claim["metadata"] == {
        "name": claim_name,
        "generateName": "vllm-small-0-extended-resources-",
        "namespace": "default",
        "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "vllm-small-0",
                "uid": pod_uid,
                "controller": True,
            }
        ],
        "uid": claim["metadata"]["uid"],
    }
    assert claim["spec"] == {
        "devices": {
            "requests": [
                {
                    "name": "container-0-request-2",
                    "exactly": {
                        "deviceClassName": "gpu.biaxial.dev",
                        "allocationMode": "ExactCount",
                        "count": 1,
                        "capacity": {"requests": {"memory": "6000Mi", "cores": "30"}},
                    },
                }
            ]
        }
    }
    result_0 = claim["status"]["allocation"]["devices"]["results"][0]
    assert result_0["consumedCapacity"] == {"cores": "30", "memory": "6000Mi"}
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "vllm-small-0", "uid": pod_uid}
    ]
    assert pod["spec"]["nodeName"] == "gpu-t4"
    assert pod["status"]["extendedResourceClaimStatus"]["requestMappings"] == [
        {
            "containerName": "vllm",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-0-request-2",
        }
    ]


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "biaxial", "containers": [{"name": "c", "image": "x"}], **spec},
    }


def template(
    name: str, *, cls: str = "gpu.biaxial.dev", selector: str | None = None, **exact: Any
) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": cls, **exact}
    if selector:
        request["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
    }


def with_claim(p: dict[str, Any], template_name: str) -> dict[str, Any]:
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template_name}]
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return p


def legacy(
    name: str, limits: dict[str, Any], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    p = pod(name)
    p["spec"]["containers"][0]["resources"] = {"limits": limits}
    if annotations:
        p["metadata"]["annotations"] = annotations
    return p


def test_every_bad_input_is_reported_and_the_rest_is_placed() -> None:
    result = run(
        template("good-t", capacity={"requests": {"memory": "2Gi"}}),
        template("unknown-class-t", cls="no-such-class"),
        template("bad-cel-t", selector="device.attributes[ 1"),
        template("huge-t", capacity={"requests": {"memory": "500Gi"}}),
        with_claim(pod("good"), "good-t"),
        with_claim(pod("unknown-class"), "unknown-class-t"),
        with_claim(pod("bad-cel"), "bad-cel-t"),
        with_claim(pod("huge"), "huge-t"),
        with_claim(pod("missing-template"), "nope"),
        legacy("bad-policy", {"nvidia.com/gpu": 1}, {"biaxial.dev/node-policy": "pack"}),
        legacy("too-much-gpumem", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 99999}),
        legacy("gpumem-alone", {"nvidia.com/gpumem": 1000}),
        legacy("also-good", {"nvidia.com/gpu": 1}),
        legacy("bad-quantity", {"nvidia.com/gpu": 1, "cpu": "lots"}),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}},
    )
    reasons = {f.pod: f.reason for f in result.unschedulable}
    assert set(by_pod(result)) == {"good", "also-good"}
    assert "DeviceClass 'no-such-class' does not exist" in reasons["default/unknown-class"]
    assert (
        "device.attributes[ 1" in reasons["default/bad-cel"]
        or "Syntax" in reasons["default/bad-cel"]
    )
    assert reasons["default/huge"] == "0/2 nodes are available: 2 insufficient GPU memory."
    assert reasons["default/missing-template"] == (
        "pod default/missing-template: resourceclaimtemplate default/nope not found"
    )
    assert (
        "annotation biaxial.dev/node-policy: unknown policy 'pack'" in reasons["default/bad-policy"]
    )
    assert "larger than every GPU in the cluster" in reasons["default/too-much-gpumem"]
    assert "nvidia.com/gpumem given without nvidia.com/gpu" in reasons["default/gpumem-alone"]
    assert "resource cpu: invalid quantity 'lots'" in reasons["default/bad-quantity"]
    assert result.notes == ["skipped 1 object(s) that do not affect scheduling: ConfigMap (1)"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "broken"},
                "spec": {"replicas": "two"},
            },
            "Deployment default/broken: spec.replicas must be a non-negative integer",
        ),
        (
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "rc"},
                "spec": {"devices": {"requests": [{"name": "r"}]}},
            },
            "ResourceClaim default/rc, request 'r': exactly one of exactly or firstAvailable",
        ),
        (
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"}},
            (
                "ResourceQuota default/q: ResourceQuota affects scheduling and quota admission "
                "is not modelled yet"
            ),
        ),
        (
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
            (
                "Widget w: unsupported kind example.com/v1 Widget (docs/simulator.md lists the "
                "kinds read)"
            ),
        ),
        (
            # a typo gets its near miss in one short line (before: a 963-character list)
            {"apiVersion": "v1", "kind": "Pdo", "metadata": {"name": "x"}},
            "Pdo x: unsupported kind v1 Pdo (did you mean Pod?)",
        ),
        (
            {
                "apiVersion": "batch.volcano.sh/v1alpha1",
                "kind": "Job",
                "metadata": {"name": "vj"},
                "spec": {"tasks": []},
            },
            (
                "Job default/vj: batch.volcano.sh/v1alpha1 Job is not read; give each task's "
                "template as a Deployment or Pods (schedulerName: biaxial)"
            ),
        ),
    ],
)
def test_bad_input_for_the_run_is_an_error(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError) as info:
        run(bad, legacy("p", {"nvidia.com/gpu": 1}))
    assert str(info.value).startswith(message), str(info.value)
    assert len(str(info.value)) < 200


def test_duplicate_objects_are_an_error_named_by_scope() -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}
    with pytest.raises(ManifestError, match=r"^Namespace ml: given twice$"):
        run(namespace, namespace)
    with pytest.raises(ManifestError, match=r"^Pod default/p: given twice$"):
        run(legacy("p", {"nvidia.com/gpu": 1}), legacy("p", {"nvidia.com/gpu": 2}))
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c"}]}}},
    }
    with pytest.raises(ManifestError, match=r"^Pod default/web-0: given twice$"):
        run(deployment, legacy("web-0", {"nvidia.com/gpu": 1}))


def test_a_gpu_config_the_node_would_refuse_is_unschedulable_and_allocates_nothing() -> None:
    bogus = gpu_config("bogus")["opaque"]["parameters"]
    shared_class = device_class("shared.gpu.biaxial.dev", config=[bogus])
    own = template("own-config-t", capacity={"requests": {"memory": "1Gi"}})
    own["spec"]["spec"]["devices"]["config"] = [gpu_config("timeslicing")]
    result = run(
        shared_class,
        template("class-config-t", cls="shared.gpu.biaxial.dev"),
        own,
        template("fine-t", capacity={"requests": {"memory": "1Gi"}}),
        with_claim(pod("through-class"), "class-config-t"),
        with_claim(pod("through-claim"), "own-config-t"),
        with_claim(pod("fine"), "fine-t"),
    )
    reasons = {f.pod: f.reason for f in result.unschedulable}
    assert set(reasons) == {"default/through-class", "default/through-claim"}
    assert re.fullmatch(
        r"claim default/through-class-gpu-\w+: DeviceClass shared\.gpu\.biaxial\.dev: "
        r"spec\.config\[0\] opaque\.parameters: sharing\.strategy: unknown value \"bogus\", "
        r'expected one of "hami-core", "mps", "none"',
        reasons["default/through-class"],
    ), reasons["default/through-class"]
    assert re.match(
        r"claim default/through-claim-gpu-\w+: spec\.devices\.config\[0\] opaque\.parameters: "
        r'sharing\.strategy: unknown value "timeslicing"',
        reasons["default/through-claim"],
    ), reasons["default/through-claim"]
    assert set(by_pod(result)) == {"fine"}
    allocated = [
        o["metadata"]["name"]
        for o in result.objects
        if o["kind"] == "ResourceClaim" and (o.get("status") or {}).get("allocation")
    ]
    assert len(allocated) == 1
    assert allocated[0].startswith("fine-gpu-")


def test_template_claims_are_named_annotated_and_reserved() -> None:
    result = run(
        template("t", capacity={"requests": {"memory": "1Gi"}}),
        with_claim(pod("p"), "t"),
    )
    out = result.to_json()
    claim = next(o for o in out["objects"] if o["kind"] == "ResourceClaim")
    name = claim["metadata"]["name"]
    assert name.startswith("p-gpu-")
    assert len(name) == len("p-gpu-") + 5
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "gpu"}
    placed_pod = next(o for o in out["objects"] if o["kind"] == "Pod")
    assert placed_pod["status"]["resourceClaimStatuses"] == [
        {"name": "gpu", "resourceClaimName": name}
    ]
    assert claim["status"]["reservedFor"][0]["uid"] == placed_pod["metadata"]["uid"]
    assert (
        claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"]
        == "1Gi"
    )
    assert out["placements"][0]["devices"][0]["claim"] == name


def test_summary_counts_and_fragmentation() -> None:
    objects = load_objects([str(EXAMPLES / "four-patterns" / "c-binpack-spread.yaml")])
    summary = run(*objects).summary()
    assert summary["placed"] == 4
    assert summary["gpusInUse"] == 4
    assert summary["wholeGpusFree"] == 4
    free_partial = 4 * (15360 - 7500)
    free_total = free_partial + 4 * 23028
    assert summary["fragmentation"] == round(free_partial / free_total, 4)
    assert set(summary["timing"]) == {
        "startupSeconds",
        "decisionSeconds",
        "podsPerSecond",
        "p99DecisionMs",
    }
    t4 = next(n for n in summary["nodes"] if n["node"] == "gpu-t4")
    assert t4["memoryUsedBytes"] == 4 * 7500 * 1024 * 1024


def test_policy_overrides_apply_to_pods_without_annotations() -> None:
    pods = [legacy(f"p{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "7500"}) for i in range(2)]
    spread = run(*pods, defaults=PolicyDefaults(node="spread", gpu="spread"))
    assert {n for n, _ in by_pod(spread).values()} == {"gpu-t4", "gpu-a10g"}
    packed = run(*pods, defaults=PolicyDefaults(node="binpack", gpu="binpack"))
    assert set(by_pod(packed).values()) == {("gpu-t4", "gpu-0")}


def test_deployment_expansion() -> None:
    """As the Deployment controller: the pods carry the template's labels plus the ReplicaSet's
    pod-template-hash, and that ReplicaSet is their controller."""
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "prod"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}},
        },
    }
    pods = expand_deployment(deployment)
    assert [p["metadata"]["name"] for p in pods] == ["web-0", "web-1"]
    assert pods[0]["metadata"]["namespace"] == "prod"
    rs_name, rs_selector = deployment_replicaset(deployment)
    template_hash = rs_name.removeprefix("web-")
    assert len(template_hash) == 10
    assert pods[0]["metadata"]["labels"] == {"a": "b", "pod-template-hash": template_hash}
    assert rs_selector == {"matchLabels": {"a": "b", "pod-template-hash": template_hash}}
    (owner,) = pods[0]["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["name"], owner["controller"]) == (
        "apps/v1",
        "ReplicaSet",
        rs_name,
        True,
    )


def test_bad_inventory_is_an_error_for_the_run() -> None:
    with pytest.raises(ManifestError, match="no nodes: give a Cluster inventory"):
        simulate([legacy("p", {"nvidia.com/gpu": 1})])
    inventory = {
        "apiVersion": "biaxial.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [{"name": "n", "gpus": "z80x9"}],
    }
    # No near miss: the built-in list follows the file without a dangling "; ".
    with pytest.raises(
        ManifestError,
        match=r"nodes\[0\] \(n\)\.gpus: no built-in profile 'z80x9' and no such file \(built-in: ",
    ):
        simulate([inventory])


def test_plot_writes_a_png(tmp_path: Path) -> None:
    from biaxial.simulate.plot import plot

    objects = load_objects([str(EXAMPLES / "four-patterns" / "a-binpack-binpack.yaml")])
    target = tmp_path / "a.png"
    plot(run(*objects), str(target))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_project_deviceclasses_are_found_from_the_checkout() -> None:
    from pathlib import Path

    from biaxial.simulate.simulator import project_deviceclasses_dir

    found = project_deviceclasses_dir()
    assert found == Path(__file__).resolve().parents[2] / "deviceclasses"
    assert (found / "gpu.biaxial.dev.yaml").is_file()


def test_a_dump_without_the_claims_of_running_pods_is_refused() -> None:
    # `kubectl get nodes,resourceslices,deviceclasses,pods -A -o yaml` leaves the claims out:
    # a running pod's GPU would look free and be given again. Before, it was, silently.
    running = pod(
        "trainer",
        nodeName="gpu-t4",
        resourceClaims=[{"name": "gpu", "resourceClaimName": "trainer-gpu"}],
    )
    running["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    bridged = legacy("legacy", {"nvidia.com/gpu": 1})
    bridged["spec"]["nodeName"] = "gpu-a10g"
    bridged["status"] = {
        "phase": "Running",
        "extendedResourceClaimStatus": {
            "resourceClaimName": "legacy-extended-resources-x7k2p",
            "requestMappings": [],
        },
    }
    with pytest.raises(ManifestError) as info:
        run(running, bridged, legacy("new", {"nvidia.com/gpu": 1}))
    assert str(info.value) == (
        "running pods use ResourceClaims the input does not hold (default/trainer-gpu, "
        "default/legacy-extended-resources-x7k2p), so their GPUs would look free; add them: "
        "kubectl get resourceclaims -A -o yaml (docs/simulator.md gives the whole dump command)"
    )


def test_the_docs_give_one_dump_recipe_and_it_holds_every_kind_read() -> None:
    from biaxial.simulate.kinds import READ
    from biaxial.simulate.simulator import DUMP_COMMAND

    for doc in ("simulator.md", "migration.md"):
        text = (ROOT / "docs" / doc).read_text()
        recipes = re.findall(r"^kubectl get nodes[^\n]*", text, re.MULTILINE)
        assert recipes, doc
        assert all(r.startswith(DUMP_COMMAND) for r in recipes), doc
    listed = DUMP_COMMAND.split()[2].split(",")
    # every kind a dump can carry (not the inventory, not the workloads users write)
    assert len(listed) == len(READ) - len({"Cluster", "Deployment", "DaemonSet", "Job"})


def test_replicas_no_cluster_in_the_input_could_run_are_refused_at_once() -> None:
    # replicas: 1000000000 reached 5.5 GB and printed nothing in 120 s: every pod was made
    # before the first was placed. The reference cluster's two nodes run 220 pods at most.
    huge = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "huge", "namespace": "default"},
        "spec": {
            "replicas": 1_000_000_000,
            "selector": {"matchLabels": {"app": "huge"}},
            "template": {
                "metadata": {"labels": {"app": "huge"}},
                "spec": {"schedulerName": "biaxial", "containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    with pytest.raises(ManifestError) as info:
        run(legacy("first", {"nvidia.com/gpu": 1}), huge)
    assert str(info.value) == (
        "Deployment default/huge: 1,000,000,000 pods are more than the 2 node(s) can run "
        "(220 allocatable pods in all, 1 taken by the pods before it); lower its replicas"
    )
    fits = copy.deepcopy(huge)
    fits["spec"]["replicas"] = 219
    assert len(run(legacy("first", {"nvidia.com/gpu": 1}), fits).placements) == 220


def test_gang_scheduling_side_objects_are_skipped_with_a_note() -> None:
    # KAI's and Volcano's Queue and PodGroup stopped the whole run (a 963-character line).
    queue = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "q"}}
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": "default"},
        "spec": {"minMember": 2},
    }
    result = run(queue, group, legacy("p", {"nvidia.com/gpu": 1}))
    assert set(by_pod(result)) == {"p"}
    assert result.notes == [
        "skipped 2 object(s) that do not affect scheduling: PodGroup (1), Queue (1)"
    ]


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (
            {"name": "gpu-pöd-测试"},
            (
                "Pod default/gpu-pöd-测试: metadata.name: not a valid name: lowercase letters, "
                "digits, '-' and '.', starting and ending with a letter or digit, at most 253 "
                "(RFC 1123)"
            ),
        ),
        (
            {"name": "p", "namespace": "Team_A"},
            (
                "Pod Team_A/p: metadata.namespace: not a valid namespace: lowercase letters, "
                "digits and '-', starting and ending with a letter or digit, at most 63 (RFC 1123)"
            ),
        ),
    ],
)
def test_names_the_api_server_refuses_are_refused(metadata: dict[str, str], message: str) -> None:
    # ValidatePodName (IsDNS1123Subdomain) and ValidateNamespaceName (IsDNS1123Label): the API
    # server refuses these pods; before, the simulator placed them.
    bad = legacy("x", {"nvidia.com/gpu": 1})
    bad["metadata"] = metadata
    with pytest.raises(ManifestError) as info:
        run(bad)
    assert str(info.value) == message


def test_a_deployment_whose_selector_misses_its_template_is_refused() -> None:
    # ValidateDeploymentSpec: "`selector` does not match template `labels`"; before, it was
    # expanded and its pods placed.
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "api"}},
                "spec": {"schedulerName": "biaxial", "containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    with pytest.raises(ManifestError) as info:
        run(deployment)
    assert str(info.value) == (
        "Deployment default/web: spec.selector does not match spec.template.metadata.labels; "
        "make the template carry the labels the selector asks for"
    )


def test_the_docs_list_every_built_in_profile_and_the_example_drivers_model() -> None:
    from driver.discovery.fake import builtin_profiles

    fields = (ROOT / "docs" / "simulator.md").read_text().split("| `gpus` |")[1].split("\n")[0]
    assert [p for p in builtin_profiles() if f"`{p}`" not in fields] == []
    example_driver = (
        (ROOT / "docs" / "migration.md").read_text().split("## From the DRA example driver")[1]
    )
    assert "`model` is biaxial's `productName`" in " ".join(example_driver.split())

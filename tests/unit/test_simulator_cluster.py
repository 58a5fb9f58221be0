"""The simulator models a real cluster: a ``kubectl get -A -o yaml`` dump needs no inventory,
running pods and allocated claims are state, pods are treated as the controller treats them
(``schedulerName``, scheduling gates, deletion, finished), the workload kinds create the pods
their controllers would, and the output counts what is really in use."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from biaxial.simulate.cluster import build_inventory
from biaxial.simulate.manifests import load_objects
from biaxial.simulate.simulator import SimulationResult, simulate
from driver.api.errors import ManifestError
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    o for p in sorted((ROOT / "deviceclasses").glob("*.yaml")) for o in load_objects([str(p)])
]
REFERENCE = load_objects([str(ROOT / "examples" / "reference-cluster.yaml")])
DRIVER = "gpu.biaxial.dev"


def run(*objects: dict[str, Any], cluster: list[dict[str, Any]] | None = None) -> SimulationResult:
    inputs = [*(REFERENCE if cluster is None else cluster), *objects]
    before = copy.deepcopy(inputs)
    result = simulate(inputs, default_classes=CLASSES)
    assert inputs == before, "simulate must not mutate its input"
    return result


def pod(name: str, *, gpus: int = 1, cpu: str | None = None, **spec: Any) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus} if gpus else {}
    if cpu:
        limits["cpu"] = cpu
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedulerName": "biaxial",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
            **spec,
        },
    }


def placed(result: SimulationResult) -> dict[str, str]:
    return {p.pod.split("/")[1]: p.node for p in result.placements}


def skipped(result: SimulationResult) -> dict[str, str]:
    return {f.pod.split("/")[1]: f.reason for f in result.skipped}


# --------------------------------------------------------------------------- a cluster dump


def node_object(name: str, cpu: str = "8") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"kubernetes.io/hostname": name},
        },
        "status": {
            "allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def slices_of(node: str, profile: str) -> list[dict[str, Any]]:
    with open_backend(profile, node_name=node) as backend:
        gpus = backend.discover()
    return [s.to_api() for s in build_slices(gpus, node_name=node, driver_name=DRIVER)]


def dump() -> list[dict[str, Any]]:
    """What `kubectl get nodes,resourceslices,deviceclasses,resourceclaims,pods -A -o yaml`
    holds for two nodes; one pod runs on gpu-a with a whole GPU and 6 of its 8 CPUs."""
    running_claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "runner-gpu", "namespace": "default", "uid": "uid-claim"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "gpu-a", "device": "gpu-0"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "runner", "uid": "uid-runner"}],
        },
    }
    runner = pod("runner", gpus=0, cpu="6")
    runner["metadata"]["uid"] = "uid-runner"
    runner["spec"]["nodeName"] = "gpu-a"
    runner["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "runner-gpu"}]
    runner["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    runner["status"] = {"phase": "Running"}
    return [
        node_object("gpu-a"),
        node_object("gpu-b"),
        *slices_of("gpu-a", "t4x4"),
        *slices_of("gpu-b", "t4x4"),
        *CLASSES,
        running_claim,
        runner,
    ]


def test_a_cluster_dump_simulates_with_no_inventory() -> None:
    result = run(pod("new", cpu="4"), pod("small", cpu="1"), cluster=dump())
    # gpu-a has 2 of 8 CPUs left (the running pod holds 6): "new" must go to gpu-b.
    assert placed(result) == {"new": "gpu-b", "small": "gpu-a"}
    assert result.running == 1
    by_device = {(g.node, g.device): g for g in result.gpus}
    assert by_device[("gpu-a", "gpu-0")].pod_names == ("default/runner",)
    small = next(p for p in result.placements if p.pod == "default/small")
    assert small.devices[0]["device"] != "gpu-0", "gpu-0 is held by the running pod"


def test_pods_are_treated_as_the_controller_treats_them() -> None:
    other = pod("other")
    other["spec"]["schedulerName"] = "default-scheduler"
    unnamed = pod("unnamed")
    del unnamed["spec"]["schedulerName"]
    gated = pod("gated", schedulingGates=[{"name": "example.com/quota"}])
    leaving = pod("leaving")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    done = pod("done", nodeName="gpu-t4")
    done["status"] = {"phase": "Succeeded"}
    result = run(other, unnamed, gated, leaving, done, pod("mine"))
    assert set(placed(result)) == {"mine"}
    assert skipped(result) == {
        "other": "schedulerName default-scheduler: another scheduler's pod (set schedulerName: "
        "biaxial to have biaxial place it)",
        "unnamed": "schedulerName default-scheduler: another scheduler's pod (set "
        "schedulerName: biaxial to have biaxial place it)",
        "gated": "waiting for its scheduling gates to be removed (example.com/quota)",
        "leaving": "being deleted",
    }
    assert "1 finished pod(s) (Succeeded or Failed) ignored" in result.notes
    assert result.running == 0


def test_a_pod_bound_to_an_unknown_node_is_an_error() -> None:
    with pytest.raises(ManifestError, match=r"spec\.nodeName 'gone' is not a node of the cluster"):
        run(pod("lost", nodeName="gone"))


def test_a_pod_being_deleted_from_a_deleted_node_is_skipped() -> None:
    """Measured on the real API server: a pod bound to a node stays, with its
    deletionTimestamp, after the Node is deleted, until the pod garbage collector removes it;
    ``--kubeconfig`` and a dump read it, and the rest of the cluster is still simulated."""
    leaving = pod("leaving", nodeName="gone")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    result = run(leaving, pod("mine"))
    assert set(placed(result)) == {"mine"}
    assert skipped(result) == {"leaving": "being deleted (its node gone is gone)"}


def test_namespace_labels_gate_admin_access_as_the_api_server_does() -> None:
    # k8s.io/api resource/v1: adminAccess needs the namespace label
    # resource.kubernetes.io/admin-access: "true" (the API server's admission checks it).
    plain = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}
    admin = shared_claim()
    admin["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    with pytest.raises(ManifestError) as info:
        run(plain, admin)
    assert str(info.value) == (
        "ResourceClaim default/shared: request 'gpu': adminAccess needs the label "
        'resource.kubernetes.io/admin-access: "true" on Namespace default'
    )
    labelled = copy.deepcopy(plain)
    labelled["metadata"]["labels"] = {"resource.kubernetes.io/admin-access": "true"}
    result = run(labelled, admin, claim_user("monitor"))
    assert set(placed(result)) == {"monitor"}
    assert result.summary()["gpusInUse"] == 0, "admin access is not use"


def test_kinds_that_do_not_affect_scheduling_are_one_note() -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s"}}
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "a"}}
    result = run(config, account, {**config, "metadata": {"name": "t"}}, pod("p"))
    assert result.notes == [
        "skipped 3 object(s) that do not affect scheduling: ConfigMap (2), ServiceAccount (1)"
    ]


def test_services_are_read_for_default_spreading() -> None:
    """A Service's selector is part of kube-scheduler's default spreading selector, so the
    simulator reads Services (and notes none as skipped)."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"selector": {"app": "x"}},
    }
    result = run(service, pod("p"))
    assert result.notes == []


def test_the_pod_claims_must_be_listed_in_the_pod() -> None:
    p = pod("p")
    p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    with pytest.raises(
        ManifestError, match=r"resources\.claims\[0\]\.name: 'gpu' is not in spec\.resourceClaims"
    ):
        run(p)


# --------------------------------------------------------------------------- workloads


def workload(kind: str, name: str, spec: dict[str, Any], api: str = "apps/v1") -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": name}},
        "spec": {
            "schedulerName": "biaxial",
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
            ],
        },
    }
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": template, **spec},
    }


def test_statefulsets_get_ordinal_names() -> None:
    result = run(workload("StatefulSet", "db", {"replicas": 2, "serviceName": "db"}))
    assert sorted(placed(result)) == ["db-0", "db-1"]
    result = run(workload("StatefulSet", "db", {"replicas": 2, "ordinals": {"start": 5}}))
    assert sorted(placed(result)) == ["db-5", "db-6"]


def test_statefulset_volume_claim_templates_need_names() -> None:
    # (Their claims and volumes: test_simulator_volumes.py.)
    sts = workload("StatefulSet", "db", {"volumeClaimTemplates": [{"metadata": {}}]})
    with pytest.raises(
        ManifestError,
        match=r"^StatefulSet default/db: spec.volumeClaimTemplates\[0\].metadata.name: required$",
    ):
        run(sts)


def test_jobs_run_their_parallelism() -> None:
    job = workload("Job", "train", {"parallelism": 3, "completions": 2}, api="batch/v1")
    names = sorted(placed(run(job)))
    assert len(names) == 2
    assert all(n.startswith("train-") and len(n) == len("train-") + 5 for n in names)
    indexed = workload(
        "Job", "idx", {"parallelism": 2, "completionMode": "Indexed"}, api="batch/v1"
    )
    assert sorted(n.rsplit("-", 1)[0] for n in placed(run(indexed))) == ["idx-0", "idx-1"]
    suspended = workload("Job", "later", {"suspend": True}, api="batch/v1")
    assert placed(run(suspended)) == {}


def test_daemonsets_run_one_pod_per_eligible_node() -> None:
    cluster = [
        {
            "apiVersion": "biaxial.dev/v1alpha1",
            "kind": "Cluster",
            "nodes": [
                {"name": "a", "gpus": "t4x4", "labels": {"gpu": "yes"}},
                {
                    "name": "b",
                    "gpus": "t4x4",
                    "labels": {"gpu": "yes"},
                    "taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}],
                },
                {"name": "c", "gpus": "t4x4"},
            ],
        }
    ]
    ds = workload("DaemonSet", "exporter", {})
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "yes"}
    result = run(ds, cluster=cluster)
    assert sorted(placed(result).values()) == ["a"]  # b is tainted, c is not selected
    tolerant = copy.deepcopy(ds)
    tolerant["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "dedicated", "operator": "Exists"}
    ]
    assert sorted(placed(run(tolerant, cluster=cluster)).values()) == ["a", "b"]


def test_existing_pods_of_a_workload_count() -> None:
    deployment = workload("Deployment", "web", {"replicas": 3})
    deployment["metadata"]["uid"] = "uid-web"
    replica_set = workload("ReplicaSet", "web-7d9f", {"replicas": 3})
    replica_set["metadata"]["uid"] = "uid-rs"
    replica_set["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "web",
            "uid": "uid-web",
            "controller": True,
        }
    ]
    running = pod("web-7d9f-abcde", nodeName="gpu-t4")
    running["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "web-7d9f",
            "uid": "uid-rs",
            "controller": True,
        }
    ]
    result = run(deployment, replica_set, running)
    assert sorted(placed(result)) == ["web-0", "web-1"]  # 3 replicas, one exists
    assert result.running == 1


# --------------------------------------------------------------------------- output


def shared_claim() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared", "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
    }


def claim_user(name: str) -> dict[str, Any]:
    p = pod(name, gpus=0)
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared"}]
    p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return p


def test_a_shared_claim_is_shown_on_every_pod_that_uses_it() -> None:
    result = run(shared_claim(), claim_user("first"), claim_user("second"))
    devices = {p.pod: [d["device"] for d in p.devices] for p in result.placements}
    assert devices["default/first"] == devices["default/second"] != []
    gpu = next(g for g in result.gpus if g.pod_names)
    assert gpu.pod_names == ("default/first", "default/second")
    assert gpu.memory_used == gpu.memory, "one claim: its GPU counted once"


def test_admin_access_is_not_use() -> None:
    admin = shared_claim()
    admin["metadata"]["name"] = "monitor"
    admin["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": "gpu-t4",
                        "device": f"gpu-{i}",
                        "adminAccess": True,
                    }
                    for i in range(4)
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "dcgm", "uid": "u"}],
    }
    result = run(admin, pod("p", gpus=1))
    summary = result.summary()
    assert 0.0 <= summary["fragmentation"] <= 1.0
    assert all(g.memory_used <= g.memory for g in result.gpus)
    assert summary["gpusInUse"] == 1  # only the pod's GPU


def test_mig_partitions_are_counted_under_their_gpu() -> None:
    cluster = load_objects([str(ROOT / "examples" / "requesting-gpus" / "cluster.yaml")])
    summary = run(cluster=cluster).summary()
    h100 = next(n for n in summary["nodes"] if n["node"] == "gpu-h100")
    assert h100["gpus"] == 8  # 6 whole GPUs and 2 in MIG mode, not 16 devices
    assert summary["wholeGpusFree"] == 4 + 6
    assert summary["migPartitionsFree"] == 7 + 3


def test_inventory_values_are_checked(tmp_path: Path) -> None:
    def inventory(**node: Any) -> dict[str, Any]:
        return {
            "apiVersion": "biaxial.dev/v1alpha1",
            "kind": "Cluster",
            "nodes": [{"name": "n", **node}],
        }

    for node, message in [
        (
            {"taints": [{"key": "k", "effect": "NoScheduel"}]},
            "effect: unsupported value 'NoScheduel'; did you mean NoSchedule?",
        ),
        ({"pods": -1}, "pods: -1 is negative"),
        ({"cpu": "lots"}, "cpu: invalid quantity 'lots'"),
        ({"gpu": "t4x4"}, "nodes[0].gpu: unknown field; did you mean gpus?"),
        ({"labels": {"a": 1}}, "labels: must map strings to strings"),
    ]:
        with pytest.raises(ManifestError, match=re.escape(message)):
            build_inventory(inventory(**node))


def test_profile_paths_are_relative_to_the_inventory_file(tmp_path: Path) -> None:
    folder = tmp_path / "cluster"
    folder.mkdir()
    profile = (ROOT / "driver" / "discovery" / "profiles" / "t4x4.yaml").read_text()
    (folder / "my-gpus.yaml").write_text(profile)
    inventory = folder / "inventory.yaml"
    inventory.write_text(
        "apiVersion: biaxial.dev/v1alpha1\nkind: Cluster\n"
        "nodes:\n  - {name: n, gpus: my-gpus.yaml}\n"
    )
    _nodes, slices = build_inventory(load_objects([str(inventory)])[0], inventory.parent)
    assert len(slices[0].devices) == 4
    binary = folder / "bad.yaml"
    binary.write_bytes(bytes(range(256)))
    inventory.write_text(
        "apiVersion: biaxial.dev/v1alpha1\nkind: Cluster\nnodes:\n  - {name: n, gpus: bad.yaml}\n"
    )
    with pytest.raises(ManifestError, match="is not a text"):
        build_inventory(load_objects([str(inventory)])[0], inventory.parent)


def test_a_misspelt_profile_name_gets_its_near_miss_and_the_list() -> None:
    # Before: "cannot read fake GPU profile '<dir>/T4x4': No such file or directory".
    inventory = {
        "apiVersion": "biaxial.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [{"name": "n1", "gpus": "T4x4"}],
    }
    with pytest.raises(ManifestError) as info:
        build_inventory(inventory, Path("/nonexistent"))
    assert str(info.value) == (
        "Cluster inventory: nodes[0] (n1).gpus: no built-in profile 'T4x4' and no such file; "
        "did you mean t4x4? (built-in: a100-40gbx8, a100-80gbx8, a100-80gbx8-dynmig, a10gx4, "
        "h100-80gbx8, h100-80gbx8-dynmig, t4x4)"
    )

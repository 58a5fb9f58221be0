"""``biaxial simulate`` with volumes: each of kube-scheduler's volume rules applied to the
simulated cluster as the controller applies them (the rules themselves are pinned against
upstream in test_volumes.py), the claims other controllers create (generic ephemeral volumes,
StatefulSet volumeClaimTemplates), what the placement writes for its volumes, and bad input."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from biaxial.simulate.manifests import load_objects
from biaxial.simulate.simulator import SimulationResult, simulate
from driver.api.errors import ManifestError
from tests.unit.builders import CSI_DRIVER, pv, pvc, storage_class, volume_pod
from tests.unit.test_simulator import CLASSES

JSON = dict[str, Any]
ZONE = "topology.kubernetes.io/zone"


def inventory(limit: int | None = None) -> JSON:
    """Two T4 nodes in zones a and b; ``limit``: gpu-a's attach limit for the test driver."""
    a: JSON = {"name": "gpu-a", "gpus": "t4x4", "labels": {ZONE: "a"}}
    if limit is not None:
        a["attachLimits"] = {CSI_DRIVER: limit}
    b: JSON = {"name": "gpu-b", "gpus": "t4x4", "labels": {ZONE: "b"}}
    return {"apiVersion": "biaxial.dev/v1alpha1", "kind": "Cluster", "nodes": [a, b]}


def gpu_pod(name: str, claims: tuple[str, ...] = (), **kwargs: Any) -> JSON:
    """A one-GPU pod of this scheduler mounting ``claims``."""
    out = volume_pod(name, claims, **kwargs)
    del out["metadata"]["uid"]  # the simulator gives one, as the API server would
    out["spec"]["schedulerName"] = "biaxial"
    out["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return out


def created(obj: JSON) -> JSON:
    """A builder object as a user writes it: no UID, no status."""
    out = copy.deepcopy(obj)
    out["metadata"].pop("uid", None)
    out.pop("status", None)
    return out


def run(*objects: JSON, cluster: JSON | None = None) -> SimulationResult:
    inputs = [cluster or inventory(), *objects]
    before = copy.deepcopy(inputs)
    result = simulate(inputs, default_classes=CLASSES)
    assert inputs == before, "simulate must not mutate its input"
    return result


def placed(result: SimulationResult) -> dict[str, str]:
    return {p.pod.split("/")[1]: p.node for p in result.placements}


def refused(result: SimulationResult) -> dict[str, str]:
    return {f.pod.split("/")[1]: f.reason for f in result.unschedulable}


def written(result: SimulationResult, kind: str) -> dict[str, JSON]:
    out = result.to_json()["objects"]
    return {o["metadata"]["name"]: o for o in out if o["kind"] == kind}


STATEFULSET: JSON = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "metadata": {"name": "db", "namespace": "default"},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"app": "db"}},
        "template": {
            "metadata": {"labels": {"app": "db"}},
            "spec": {
                "schedulerName": "biaxial",
                "containers": [
                    {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                ],
                "volumes": [{"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
            },
        },
        "volumeClaimTemplates": [
            {
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "zonal",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        ],
    },
}


def test_a_missing_claim_keeps_the_pod_pending_with_upstreams_message() -> None:
    # volumerestrictions PreFilter: `persistentvolumeclaim "data" not found` rules out every
    # node (UnschedulableAndUnresolvable); before, the pod was placed anyway.
    result = run(gpu_pod("p", ("data",)))
    assert refused(result) == {
        "p": '0/2 nodes are available: persistentvolumeclaim "data" not found.'
    }


def test_an_unbound_immediate_claim_keeps_the_pod_pending() -> None:
    # volumebinding PreFilter: an unbound claim of an Immediate class waits for the PV
    # controller ("pod has unbound immediate PersistentVolumeClaims").
    result = run(
        storage_class("fast", mode="Immediate"),
        created(pvc("data", cls="fast")),
        gpu_pod("p", ("data",)),
    )
    assert refused(result) == {
        "p": "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    }


def with_created(obj: JSON, timestamp: str) -> JSON:
    out = copy.deepcopy(obj)
    out["metadata"]["creationTimestamp"] = timestamp
    return out


def test_a_claim_without_a_class_gets_the_newest_default_class() -> None:
    # The DefaultStorageClass admission plugin (plugin/pkg/admission/storage/storageclass/
    # setdefault) fills spec.storageClassName of a claim that has none, with GetDefaultClass
    # (pkg/volume/util/storageclass.go): the newest class marked default, the lowest name
    # among equally new ones. Before, the claim kept no class: "pod has unbound immediate
    # PersistentVolumeClaims" although the default class waits for the first consumer.
    no_class = created(pvc("data", cls=None))
    old = with_created(storage_class("old", mode="Immediate", default=True), "2024-01-01T00:00:00Z")
    new = with_created(
        storage_class("new", allowed={ZONE: ["b"]}, default=True), "2025-01-01T00:00:00Z"
    )
    result = run(old, new, no_class, gpu_pod("p", ("data",)))
    assert placed(result) == {"p": "gpu-b"}
    assert written(result, "PersistentVolumeClaim")["data"]["spec"]["storageClassName"] == "new"
    # Equally new: the lowest name. The beta annotation counts as a mark too.
    beta = with_created(storage_class("a-beta", allowed={ZONE: ["a"]}), "2025-01-01T00:00:00Z")
    beta["metadata"]["annotations"] = {"storageclass.beta.kubernetes.io/is-default-class": "true"}
    tie = run(old, new, beta, no_class, gpu_pod("p", ("data",)))
    assert placed(tie) == {"p": "gpu-a"}
    # "" is a class (none): admission leaves it, and so does the simulator.
    empty = created(pvc("data", cls=""))
    assert refused(run(new, empty, gpu_pod("p", ("data",))))["p"].endswith(
        "pod has unbound immediate PersistentVolumeClaims."
    )


def test_statefulset_claims_without_a_class_get_the_default_class() -> None:
    statefulset = copy.deepcopy(STATEFULSET)
    del statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"]
    result = run(storage_class("zonal", allowed={ZONE: ["b"]}, default=True), statefulset)
    assert placed(result) == {"db-0": "gpu-b", "db-1": "gpu-b"}


def test_a_bound_local_pv_takes_the_pod_to_its_node() -> None:
    # volumebinding Filter (checkBoundClaims): a bound claim's PV must accept the node by its
    # required node affinity; the other node is "node(s) had volume node affinity conflict".
    result = run(
        storage_class("local", provisioner="kubernetes.io/no-provisioner"),
        created(pv("disk", cls="local", hostname="gpu-b", claim="data", claim_uid="u")),
        created(pvc("data", cls="local", volume="disk", bound=True)),
        gpu_pod("p", ("data",)),
        gpu_pod("busy", ("data",), node_name="gpu-a"),
    )
    assert placed(result) == {"p": "gpu-b"}
    pinned = run(
        storage_class("local", provisioner="kubernetes.io/no-provisioner"),
        created(pv("disk", cls="local", hostname="gpu-c", claim="data", claim_uid="u")),
        created(pvc("data", cls="local", volume="disk", bound=True)),
        gpu_pod("p", ("data",)),
    )
    assert refused(pinned) == {
        "p": "0/2 nodes are available: 2 node(s) had volume node affinity conflict."
    }


def test_volume_zone_sends_the_pod_to_its_pvs_zone() -> None:
    # volumezone Filter: the zone label of a bound claim's PV must hold the node's zone.
    result = run(
        created(pv("disk", zone="b", claim="data", claim_uid="u")),
        created(pvc("data", volume="disk", bound=True)),
        gpu_pod("p", ("data",)),
    )
    assert placed(result) == {"p": "gpu-b"}
    elsewhere = run(
        created(pv("disk", zone="c", claim="data", claim_uid="u")),
        created(pvc("data", volume="disk", bound=True)),
        gpu_pod("p", ("data",)),
    )
    assert refused(elsewhere) == {
        "p": "0/2 nodes are available: 2 node(s) had no available volume zone."
    }


def test_wait_for_first_consumer_is_provisioned_where_the_class_allows() -> None:
    # volumebinding: an unbound WaitForFirstConsumer claim without a matching PV is
    # provisioned on a node its class's allowedTopologies allow; PreBind writes
    # volume.kubernetes.io/selected-node, and a second pod of the claim follows it there.
    result = run(
        storage_class("zonal", allowed={ZONE: ["b"]}),
        created(pvc("data", cls="zonal")),
        gpu_pod("p", ("data",)),
        gpu_pod("q", ("data",)),
    )
    assert placed(result) == {"p": "gpu-b", "q": "gpu-b"}
    claim = written(result, "PersistentVolumeClaim")["data"]
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == "gpu-b"
    nowhere = run(
        storage_class("zonal", allowed={ZONE: ["c"]}),
        created(pvc("data", cls="zonal")),
        gpu_pod("p", ("data",)),
    )
    assert refused(nowhere) == {
        "p": "0/2 nodes are available: 2 node(s) didn't find available persistent volumes to bind."
    }


def test_a_static_pv_is_chosen_smallest_first_and_bound_before_the_pod() -> None:
    # volumebinding findMatchingVolumes (FindMatchingVolume): per node, the smallest
    # Available PV that matches the claim (class, size, modes) and accepts the node; PreBind
    # gives it the claim's claimRef. A PV written without a phase is Available (the PV
    # controller's first sync).
    result = run(
        storage_class("local", provisioner="kubernetes.io/no-provisioner"),
        created(pv("big", cls="local", size="50Gi", hostname="gpu-b")),
        created(pv("small", cls="local", size="20Gi", hostname="gpu-b")),
        created(pv("tiny", cls="local", size="5Gi", hostname="gpu-a")),
        created(pv("other", cls="elsewhere", size="20Gi", hostname="gpu-a")),
        created(pvc("data", cls="local", size="10Gi")),
        gpu_pod("p", ("data",)),
    )
    assert placed(result) == {"p": "gpu-b"}
    volumes = written(result, "PersistentVolume")
    assert list(volumes) == ["small"]
    ref = volumes["small"]["spec"]["claimRef"]
    assert (ref["namespace"], ref["name"]) == ("default", "data")
    assert ref["uid"]


def test_the_inventorys_attach_limit_counts_running_and_placed_pods() -> None:
    # nodevolumelimits (CSI): the unique volumes of the node's pods of every scheduler, an
    # unbound claim under its class's provisioner, plus the new pod's, against the CSINode's
    # allocatable.count ("node(s) exceed max volume count").
    zonal = storage_class("zonal", allowed={ZONE: ["a"]})
    claims = [created(pvc(name, cls="zonal")) for name in ("one", "two")]
    result = run(
        zonal, *claims, gpu_pod("p", ("one",)), gpu_pod("q", ("two",)), cluster=inventory(1)
    )
    assert placed(result) == {"p": "gpu-a"}
    assert refused(result)["q"] == (
        "0/2 nodes are available: 1 node(s) didn't find available persistent volumes to bind, "
        "1 node(s) exceed max volume count."
    )
    running = run(
        zonal,
        *claims,
        created(pv("disk", claim="one", claim_uid="u")),
        gpu_pod("old", ("one",), node_name="gpu-a"),
        gpu_pod("q", ("two",)),
        cluster=inventory(1),
    )
    assert "1 node(s) exceed max volume count" in refused(running)["q"]
    assert placed(run(zonal, *claims, gpu_pod("q", ("two",)), cluster=inventory(1))) == {
        "q": "gpu-a"
    }


def test_read_write_once_pod_admits_one_pod() -> None:
    # volumerestrictions PreFilter: a ReadWriteOncePod claim another pod uses rules out every
    # node; a running pod counts as one placed in this run does.
    rwop = created(
        pv("disk", modes=("ReadWriteOncePod",), claim="data", claim_uid="u", phase="Bound")
    )
    claim = created(pvc("data", modes=("ReadWriteOncePod",), volume="disk", bound=True))
    result = run(rwop, claim, gpu_pod("p", ("data",)), gpu_pod("q", ("data",)))
    message = (
        "0/2 nodes are available: 2 node has pod using PersistentVolumeClaim with the same "
        "name and ReadWriteOncePod access mode."
    )
    assert list(placed(result)) == ["p"]
    assert refused(result) == {"q": message}
    running = run(
        rwop, claim, gpu_pod("old", ("data",), node_name="gpu-a"), gpu_pod("q", ("data",))
    )
    assert refused(running) == {"q": message}


def test_generic_ephemeral_volumes_get_their_claim_from_the_template() -> None:
    # The ephemeral volume controller creates <pod>-<volume>, owned by the pod; volumebinding
    # then treats it as any claim (here: WaitForFirstConsumer, provisioned where allowed).
    result = run(storage_class("wffc", allowed={ZONE: ["a"]}), gpu_pod("p", ephemeral=("scratch",)))
    assert placed(result) == {"p": "gpu-a"}
    claim = written(result, "PersistentVolumeClaim")["p-scratch"]
    assert claim["metadata"]["ownerReferences"][0]["name"] == "p"
    assert claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == "gpu-a"
    # A claim of that name the pod does not own is refused, as upstream refuses it.
    foreign = run(
        storage_class("wffc"), created(pvc("p-scratch")), gpu_pod("p", ephemeral=("scratch",))
    )
    assert "was not created for pod default/p (pod is not owner)" in refused(foreign)["p"]


def test_statefulset_volume_claim_templates_become_claims_per_pod() -> None:
    # The StatefulSet controller (getPersistentVolumeClaims / updateStorage): claim
    # <template>-<set>-<ordinal> per pod, the pod's volume of the template's name mounting it;
    # an existing claim is used as it is (here bound to a local PV on gpu-b).
    statefulset = copy.deepcopy(STATEFULSET)
    result = run(
        storage_class("zonal", allowed={ZONE: ["a"]}),
        storage_class("local", provisioner="kubernetes.io/no-provisioner"),
        created(pv("disk", cls="local", hostname="gpu-b", claim="data-db-0", claim_uid="u")),
        created(pvc("data-db-0", cls="local", volume="disk", bound=True)),
        statefulset,
    )
    assert placed(result) == {"db-0": "gpu-b", "db-1": "gpu-a"}
    claim = written(result, "PersistentVolumeClaim")["data-db-1"]
    assert claim["metadata"]["labels"] == {"app": "db"}
    pod = next(o for o in result.to_json()["objects"] if o["metadata"]["name"] == "db-1")
    assert pod["spec"]["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-1"}},
        {"name": "tmp", "emptyDir": {}},
    ]


@pytest.mark.parametrize(
    ("objects", "message"),
    [
        (
            [
                {
                    "apiVersion": "storage.k8s.io/v1beta1",
                    "kind": "StorageClass",
                    "metadata": {"name": "s"},
                }
            ],
            "StorageClass s: apiVersion storage.k8s.io/v1beta1 is not read (use storage.k8s.io/v1)",
        ),
        (
            [
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "CSINode",
                    "metadata": {"name": "gpu-a"},
                    "spec": {"drivers": []},
                }
            ],
            "CSINode gpu-a: given twice (inventory and object)",
        ),
        (
            [{**created(pvc("data")), "spec": "big"}],
            "PersistentVolumeClaim default/data: spec must be an object",
        ),
    ],
)
def test_bad_volume_input_is_an_error_for_the_run(objects: list[JSON], message: str) -> None:
    with pytest.raises(ManifestError) as info:
        run(*objects, gpu_pod("p"), cluster=inventory(3))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({CSI_DRIVER: -1}, f"attachLimits.{CSI_DRIVER}: -1 is not a non-negative whole number"),
        ({CSI_DRIVER: "3"}, f"attachLimits.{CSI_DRIVER}: '3' is not a non-negative whole number"),
        ([CSI_DRIVER], "attachLimits: must map CSI driver names to volume counts"),
    ],
)
def test_inventory_attach_limits_are_checked(limits: Any, message: str) -> None:
    cluster = inventory()
    cluster["nodes"][0]["attachLimits"] = limits
    with pytest.raises(ManifestError, match=r"^Cluster inventory: nodes") as info:
        run(gpu_pod("p"), cluster=cluster)
    assert message in str(info.value)


def test_volume_kinds_pass_the_strict_field_check(tmp_path: Any) -> None:
    # The API server's field validation covers the volume kinds too (a misspelt field).
    path = tmp_path / "claim.yaml"
    path.write_text(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data}\n"
        "spec: {accessMode: [ReadWriteOnce]}\n"
    )
    with pytest.raises(
        ManifestError, match=r"spec.accessMode: unknown field; did you mean accessModes\?"
    ):
        load_objects([str(path)])

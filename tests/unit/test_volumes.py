"""The volume rules (kube-scheduler's VolumeRestrictions, NodeVolumeLimits, VolumeBinding and
VolumeZone plugins) through the decision engine, table by table, each citing the upstream rule
it pins (kubernetes/kubernetes ``pkg/scheduler/framework/plugins/...`` and
``k8s.io/component-helpers/storage/volume``)."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest

from driver.api.labels import label_selector_matches
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement, PodError, Unschedulable
from driver.scheduling.storage import VOLUME_KINDS, PodVolumes, VolumeBindings, zones_of
from driver.scheduling.volumes import (
    REASON_BIND_CONFLICT,
    REASON_CSINODE_MISSING,
    REASON_DISK_CONFLICT,
    REASON_MAX_VOLUMES,
    REASON_NODE_CONFLICT,
    REASON_NOT_ENOUGH_SPACE,
    REASON_PV_NOT_EXIST,
    REASON_RWOP_CONFLICT,
    REASON_ZONE_CONFLICT,
)
from tests.unit.builders import (
    CSI_DRIVER,
    GPU_CLASS,
    claim,
    csi_node,
    device_class,
    gpu,
    node,
    pv,
    pvc,
    slice_,
    snapshot,
    storage_class,
    to_claim,
    to_node,
    volume_pod,
)

JSON = dict[str, Any]
ZONE = "topology.kubernetes.io/zone"
NAMESPACED = {"PersistentVolumeClaim", "CSIStorageCapacity"}


def feed(eng: DecisionEngine, objects: Iterable[Mapping[str, Any]]) -> None:
    for raw in objects:
        meta = raw["metadata"]
        kind = raw["kind"]
        if kind == "Pod":
            pods = PodVolumes.from_pod(raw)
            eng.observe_pod(meta["uid"], raw["spec"].get("nodeName"), {}, pods)
            continue
        assert kind in VOLUME_KINDS
        key = (
            f"{meta.get('namespace', 'default')}/{meta['name']}"
            if kind in NAMESPACED
            else meta["name"]
        )
        eng.observe_volume(kind, key, raw)


def engine(nodes: Sequence[JSON], objects: Iterable[Mapping[str, Any]] = ()) -> DecisionEngine:
    eng = DecisionEngine(snapshot([], classes=[device_class()]), [to_node(n) for n in nodes])
    feed(eng, objects)
    return eng


def zoned(name: str, zone: str, **labels: str) -> JSON:
    return node(name, labels={ZONE: zone, **labels})


STANDARD = [storage_class("wffc"), storage_class("fast", mode="Immediate")]


def decide(eng: DecisionEngine, pod: JSON) -> Any:
    before = copy.deepcopy(pod)
    decision = eng.decide(pod)
    assert pod == before, "decide must not mutate the pod"
    return decision


def reasons(decision: Any) -> dict[str, int]:
    assert isinstance(decision, Unschedulable), decision
    return dict(decision.reasons)


# --------------------------------------------------------------------------- PreFilter

PREFILTER = [
    # VolumeRestrictions.PreFilter: the PVC lister's NotFound error.
    ("missing claim", [], volume_pod("p", ["data"]), 'persistentvolumeclaim "data" not found'),
    # VolumeBinding.podHasPVCs: a generic ephemeral volume's claim not created yet.
    (
        "ephemeral claim not created",
        [],
        volume_pod("p", ephemeral=["scratch"]),
        'waiting for ephemeral volume controller to create the persistentvolumeclaim "p-scratch"',
    ),
    # podHasPVCs: ClaimLost.
    (
        "lost claim",
        [pvc("data", volume="gone", phase="Lost")],
        volume_pod("p", ["data"]),
        'persistentvolumeclaim "data" bound to non-existent persistentvolume "gone"',
    ),
    # ephemeral.VolumeIsForPod: a claim of that name the pod does not control.
    (
        "ephemeral claim of someone else",
        [pvc("p-scratch", owner="uid-other")],
        volume_pod("p", ephemeral=["scratch"]),
        "PVC default/p-scratch was not created for pod default/p (pod is not owner)",
    ),
    # GetPodVolumeClaims: unbound claims of an Immediate class, of no class or of a class
    # that does not exist are "immediate" and must be bound already.
    (
        "unbound immediate claim",
        [pvc("data", cls="fast")],
        volume_pod("p", ["data"]),
        "pod has unbound immediate PersistentVolumeClaims",
    ),
    (
        "unbound claim without a class",
        [pvc("data", cls=None)],
        volume_pod("p", ["data"]),
        "pod has unbound immediate PersistentVolumeClaims",
    ),
    (
        "unbound claim of an unknown class",
        [pvc("data", cls="nope")],
        volume_pod("p", ["data"]),
        "pod has unbound immediate PersistentVolumeClaims",
    ),
    # Prebound PVCs (volumeName set, not bind-completed) are treated as unbound immediate.
    (
        "pre-bound claim not bound yet",
        [pvc("data", volume="pv-1"), pv("pv-1")],
        volume_pod("p", ["data"]),
        "pod has unbound immediate PersistentVolumeClaims",
    ),
    # VolumeZone.PreFilter: the bound claim's PV must exist (pvLister NotFound).
    (
        "bound claim whose PV is gone",
        [pvc("data", volume="pv-1", bound=True)],
        volume_pod("p", ["data"]),
        'persistentvolume "pv-1" not found',
    ),
]


@pytest.mark.parametrize(
    ("objects", "pod", "message"), [c[1:] for c in PREFILTER], ids=[c[0] for c in PREFILTER]
)
def test_prefilter_rejections_rule_out_every_node_with_upstreams_message(
    objects: list[JSON], pod: JSON, message: str
) -> None:
    eng = engine([node("a"), node("b")], [*STANDARD, *objects])
    decision = decide(eng, pod)
    assert isinstance(decision, Unschedulable)
    # FitError.Error(): a PreFilter message replaces the per-node histogram.
    assert decision.message == f"0/2 nodes are available: {message}."
    assert decision.reasons == {}


def test_a_claim_being_deleted_is_refused() -> None:
    raw = pvc("data", volume="pv-1", bound=True)
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    eng = engine([node("a")], [*STANDARD, raw, pv("pv-1")])
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Unschedulable)
    assert (
        decision.message
        == '0/1 nodes are available: persistentvolumeclaim "data" is being deleted.'
    )


def test_a_class_without_binding_mode_is_an_error_for_the_pod() -> None:
    # volume.IsDelayBindingMode: "VolumeBindingMode not set for StorageClass" (a scheduling
    # error upstream, not unschedulable).
    eng = engine([node("a")], [storage_class("odd", mode=None), pvc("data", cls="odd")])
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, PodError)
    assert decision.message == 'VolumeBindingMode not set for StorageClass "odd"'


def test_a_pod_without_volumes_never_reaches_the_rules() -> None:
    eng = engine([node("a")])
    pod = volume_pod("p")
    assert isinstance(decide(eng, pod), Placement)


# --------------------------------------------------------------------------- VolumeBinding


def test_a_bound_pv_pins_the_pod_to_its_node_affinity() -> None:
    # checkBoundClaims -> volume.CheckNodeAffinity(pv, node.Labels).
    eng = engine(
        [node("a"), node("b"), node("c")],
        [*STANDARD, pvc("data", volume="local-b", bound=True), pv("local-b", hostname="b")],
    )
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Placement)
    assert decision.node == "b"
    assert decision.volumes is None  # bound already: nothing to write (allBound)
    eng.observe_node("b", None)
    assert reasons(decide(eng, volume_pod("p", ["data"]))) == {REASON_NODE_CONFLICT: 2}


def test_a_bound_ephemeral_claim_without_its_pv_fails_per_node() -> None:
    # VolumeZone looks at persistentVolumeClaim volumes only; VolumeBinding's per-node
    # check then reports the missing PV (ErrReasonPVNotExist).
    eng = engine(
        [node("a")],
        [*STANDARD, pvc("p-scratch", volume="gone", bound=True, owner="uid-p")],
    )
    assert reasons(decide(eng, volume_pod("p", ephemeral=["scratch"]))) == {REASON_PV_NOT_EXIST: 1}


STATIC = [
    # FindMatchingVolume: the smallest PV that is big enough wins.
    (
        "smallest fit",
        [pv("big", size="100Gi"), pv("small", size="20Gi"), pv("tiny", size="5Gi")],
        {},
        "small",
    ),
    # ... of the claim's class only,
    ("class", [pv("other", cls="slow"), pv("mine", size="50Gi")], {}, "mine"),
    # ... with every requested access mode (CheckAccessModes),
    (
        "access modes",
        [pv("rwo"), pv("rwx", size="20Gi", modes=("ReadWriteMany", "ReadWriteOnce"))],
        {"modes": ("ReadWriteMany",)},
        "rwx",
    ),
    # ... whose labels the claim's selector selects,
    (
        "selector",
        [pv("plain"), pv("fast", size="20Gi", labels={"tier": "nvme"})],
        {"selector": {"matchLabels": {"tier": "nvme"}}},
        "fast",
    ),
    # ... Available (not Released or Bound),
    ("phase", [pv("released", phase="Released"), pv("free", size="20Gi")], {}, "free"),
    # ... not claimed by another claim,
    ("claimed", [pv("taken", claim="other"), pv("free", size="20Gi")], {}, "free"),
    # ... while a PV pre-bound to this very claim wins over any other (IsVolumeBoundToClaim).
    ("pre-bound PV", [pv("small"), pv("mine", size="90Gi", claim="data")], {}, "mine"),
]


@pytest.mark.parametrize(
    ("pvs", "claim_args", "chosen"), [c[1:] for c in STATIC], ids=[c[0] for c in STATIC]
)
def test_static_pv_matching(pvs: list[JSON], claim_args: dict[str, Any], chosen: str) -> None:
    eng = engine([node("a")], [*STANDARD, pvc("data", **claim_args), *pvs])
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Placement)
    assert decision.volumes == VolumeBindings("a", bind=(("default/data", chosen),))


def test_a_pv_of_another_volume_mode_or_attributes_class_does_not_match() -> None:
    block = pv("block")
    block["spec"]["volumeMode"] = "Block"
    vac = pv("vac")
    vac["spec"]["volumeAttributesClassName"] = "gold"
    deleting = pv("deleting")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    eng = engine(
        [node("a")],
        [
            storage_class("wffc", provisioner="kubernetes.io/no-provisioner"),
            pvc("data"),
            block,
            vac,
            deleting,
        ],
    )
    # No match and a class that cannot provision: the node cannot bind the claim.
    assert reasons(decide(eng, volume_pod("p", ["data"]))) == {REASON_BIND_CONFLICT: 1}


def test_a_local_pv_takes_the_pod_to_its_node() -> None:
    # FindMatchingVolume checks the PV's node affinity on the scheduler's path.
    eng = engine(
        [node("a"), node("b")],
        [
            storage_class("local", provisioner="kubernetes.io/no-provisioner"),
            pvc("data", cls="local"),
            pv("local-b", cls="local", hostname="b"),
        ],
    )
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Placement)
    assert decision.node == "b"
    assert decision.volumes == VolumeBindings("b", bind=(("default/data", "local-b"),))


def test_claims_of_one_pod_never_share_a_pv_and_go_by_size() -> None:
    # findMatchingVolumes sorts claims by request (byPVCSize) and excludes chosen PVs.
    eng = engine(
        [node("a")],
        [
            storage_class("wffc", provisioner="kubernetes.io/no-provisioner"),
            pvc("big", size="40Gi"),
            pvc("small", size="5Gi"),
            pv("pv-50", size="50Gi"),
            pv("pv-10", size="10Gi"),
        ],
    )
    decision = decide(eng, volume_pod("p", ["big", "small"]))
    assert isinstance(decision, Placement)
    assert decision.volumes is not None
    assert sorted(decision.volumes.bind) == [("default/big", "pv-50"), ("default/small", "pv-10")]
    eng2 = engine(
        [node("a")],
        [
            storage_class("wffc", provisioner="kubernetes.io/no-provisioner"),
            pvc("one"),
            pvc("two"),
            pv("only"),
        ],
    )
    assert reasons(decide(eng2, volume_pod("p", ["one", "two"]))) == {REASON_BIND_CONFLICT: 1}


def test_dynamic_provisioning_where_the_class_allows_it() -> None:
    # checkVolumeProvisions: a provisioner, and allowedTopologies matched by the node's labels.
    eng = engine(
        [zoned("a", "z1"), zoned("b", "z2")],
        [storage_class("wffc", allowed={ZONE: ["z2"]}), pvc("data")],
    )
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Placement)
    assert decision.node == "b"
    assert decision.volumes == VolumeBindings("b", provision=("default/data",))
    eng.observe_node("b", None)
    assert reasons(decide(eng, volume_pod("p", ["data"]))) == {REASON_BIND_CONFLICT: 1}


def test_a_class_without_provisioner_cannot_provision() -> None:
    eng = engine(
        [node("a")],
        [storage_class("wffc", provisioner="kubernetes.io/no-provisioner"), pvc("data")],
    )
    assert reasons(decide(eng, volume_pod("p", ["data"]))) == {REASON_BIND_CONFLICT: 1}


def test_a_selected_node_pins_the_claim() -> None:
    # FindPodVolumes' fast path: a claim whose provisioning started (selected-node) fits only
    # that node; there it is still "to provision" (PreBind writes nothing new for it).
    eng = engine([node("a"), node("b")], [*STANDARD, pvc("data", selected="b")])
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Placement)
    assert decision.node == "b"
    assert decision.volumes == VolumeBindings("b", provision=("default/data",))
    eng.observe_node("b", None)
    assert reasons(decide(eng, volume_pod("p", ["data"]))) == {REASON_BIND_CONFLICT: 1}


def test_storage_capacity_is_checked_for_drivers_that_publish_it() -> None:
    # hasEnoughCapacity: only for a CSIDriver with storageCapacity: true; a CSIStorageCapacity
    # of the class whose maximumVolumeSize (else capacity) fits and whose nodeTopology selects
    # the node.
    driver = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": CSI_DRIVER},
        "spec": {"storageCapacity": True},
    }

    def capacity(name: str, zone: str, size: str, maximum: str | None = None) -> JSON:
        raw: JSON = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIStorageCapacity",
            "metadata": {"name": name, "namespace": "kube-system"},
            "storageClassName": "wffc",
            "capacity": size,
            "nodeTopology": {"matchLabels": {ZONE: zone}},
        }
        if maximum is not None:
            raw["maximumVolumeSize"] = maximum
        return raw

    objects = [
        *STANDARD,
        pvc("data", size="50Gi"),
        driver,
        capacity("c1", "z1", "1Ti", maximum="20Gi"),
        capacity("c2", "z2", "100Gi"),
    ]
    eng = engine([zoned("a", "z1"), zoned("b", "z2"), zoned("c", "z3")], objects)
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Placement)
    assert decision.node == "b"
    eng.observe_node("b", None)
    assert reasons(decide(eng, volume_pod("p", ["data"]))) == {REASON_NOT_ENOUGH_SPACE: 2}
    # Without the driver's opt-in nothing is checked.
    eng.observe_volume("CSIDriver", CSI_DRIVER, None)
    assert isinstance(decide(eng, volume_pod("p", ["data"])), Placement)


def test_an_assumed_binding_hides_the_pv_from_other_pods_until_forgotten() -> None:
    # AssumePodVolumes: the PV is assumed pre-bound to the claim in the scheduler's cache.
    eng = engine(
        [node("a")],
        [
            storage_class("wffc", provisioner="kubernetes.io/no-provisioner"),
            pvc("one"),
            pvc("two"),
            pv("only"),
        ],
    )
    first = decide(eng, volume_pod("p1", ["one"]))
    assert isinstance(first, Placement)
    eng.assume(first, volume_pod("p1", ["one"]))
    assert reasons(decide(eng, volume_pod("p2", ["two"]))) == {REASON_BIND_CONFLICT: 1}
    eng.forget("uid-p1")
    assert isinstance(decide(eng, volume_pod("p2", ["two"])), Placement)


def test_an_assumed_provisioning_pins_a_shared_claim_to_its_node() -> None:
    # AssumePodVolumes: the claim is assumed with selected-node in the scheduler's cache.
    eng = engine([node("a"), node("b")], [*STANDARD, pvc("shared", modes=("ReadWriteMany",))])
    eng.observe_node("a", None)
    first = decide(eng, volume_pod("p1", ["shared"]))
    assert isinstance(first, Placement)
    assert first.node == "b"
    eng.assume(first, volume_pod("p1", ["shared"]))
    eng.observe_node("a", to_node(node("a")))
    eng.observe_node("b", to_node(node("b", labels={"cordon": "x"})))
    second = decide(eng, volume_pod("p2", ["shared"]))
    assert isinstance(second, Placement)
    assert second.node == "b"  # a would be first by name: the claim is pinned to b
    eng.forget("uid-p1")
    third = decide(eng, volume_pod("p2", ["shared"]))
    assert isinstance(third, Placement)
    assert third.node == "a"


# --------------------------------------------------------------------------- VolumeZone

ZONES = [
    # The PV's zone must be the node's.
    ({ZONE: "z1"}, "a"),
    # "a__b" lists several zones (LabelZonesToSet).
    ({ZONE: "z3__z2"}, "b"),
    # A beta label on the PV is matched against the node's GA label (translateToGALabel).
    ({"failure-domain.beta.kubernetes.io/zone": "z2"}, "b"),
    # Region labels too.
    ({"topology.kubernetes.io/region": "r2"}, "b"),
]


@pytest.mark.parametrize(("labels", "expected"), ZONES)
def test_volume_zone(labels: dict[str, str], expected: str) -> None:
    nodes = [
        node("a", labels={ZONE: "z1", "topology.kubernetes.io/region": "r1"}),
        node("b", labels={ZONE: "z2", "topology.kubernetes.io/region": "r2"}),
    ]
    eng = engine(
        nodes, [*STANDARD, pvc("data", volume="pv-1", bound=True), pv("pv-1", labels=labels)]
    )
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Placement)
    assert decision.node == expected
    eng.observe_node(expected, None)
    assert reasons(decide(eng, volume_pod("p", ["data"]))) == {REASON_ZONE_CONFLICT: 1}


def test_a_node_without_zone_labels_takes_any_zone() -> None:
    # VolumeZone.Filter: no topology label on the node -> single-zone cluster, no constraint.
    eng = engine(
        [node("plain")], [*STANDARD, pvc("data", volume="pv-1", bound=True), pv("pv-1", zone="z9")]
    )
    assert isinstance(decide(eng, volume_pod("p", ["data"])), Placement)


def test_zone_lists() -> None:
    assert zones_of("a__b") == frozenset({"a", "b"})
    assert zones_of("a") == frozenset({"a"})
    assert zones_of("a____b") is None  # an empty item: the label is ignored, as upstream


# --------------------------------------------------------------------------- NodeVolumeLimits


def test_attach_limit_counts_every_pod_on_the_node_once_per_volume() -> None:
    # CSILimits.Filter: unique volumes of the pods on the node (any scheduler's) plus the new
    # pod's, per driver, against CSINode allocatable.count; a volume shared by pods counts once.
    objects = [
        *STANDARD,
        csi_node("a", {CSI_DRIVER: 2}),
        pvc("d1", volume="pv-1", bound=True),
        pv("pv-1"),
        pvc("d2", volume="pv-2", bound=True),
        pv("pv-2"),
        pvc("d3", volume="pv-3", bound=True),
        pv("pv-3"),
        volume_pod("other-scheduler", ["d1"], node_name="a"),
        volume_pod("sharer", ["d1"], node_name="a"),
    ]
    eng = engine([node("a")], objects)
    assert isinstance(decide(eng, volume_pod("p", ["d1", "d2"])), Placement)  # d1 shared
    eng.observe_pod("uid-third", "a", {}, PodVolumes.from_pod(volume_pod("third", ["d2"])))
    assert reasons(decide(eng, volume_pod("p", ["d3"]))) == {REASON_MAX_VOLUMES: 1}
    eng.observe_pod("uid-third", None)
    assert isinstance(decide(eng, volume_pod("p", ["d3"])), Placement)


def test_attach_limit_counts_unbound_claims_and_volume_attachments() -> None:
    # getCSIDriverInfoFromSC: an unbound claim counts under its class's provisioner;
    # VolumeAttachments to the node count too (newest upstream), deduplicated with pods'.
    attachment = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": "va-1"},
        "spec": {
            "attacher": CSI_DRIVER,
            "nodeName": "a",
            "source": {"persistentVolumeName": "pv-old"},
        },
    }
    objects = [
        *STANDARD,
        csi_node("a", {CSI_DRIVER: 2}),
        pv("pv-old", claim="old", phase="Released"),
        pvc("new1"),
        pvc("new2"),
    ]
    eng = engine([node("a")], objects)
    assert isinstance(decide(eng, volume_pod("p", ["new1", "new2"])), Placement)
    eng.observe_volume("VolumeAttachment", "va-1", attachment)
    assert reasons(decide(eng, volume_pod("p", ["new1", "new2"]))) == {REASON_MAX_VOLUMES: 1}
    assert isinstance(decide(eng, volume_pod("p", ["new1"])), Placement)


def test_volume_attachments_count_even_for_the_pending_pods_own_volume() -> None:
    # kube-scheduler's csi_test.go, "should count VolumeAttachments towards volume limit when
    # no pods exist": two VolumeAttachments on the node (its limit 2), one of them for the
    # pending pod's own volume; CSILimits.Filter counts both and the new volume too:
    # Unschedulable. Before, the attached volume of the pod itself was left out and it fit.
    def attachment(name: str, volume: str) -> dict[str, object]:
        return {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment",
            "metadata": {"name": name},
            "spec": {
                "attacher": CSI_DRIVER,
                "nodeName": "a",
                "source": {"persistentVolumeName": volume},
            },
        }

    objects = [
        *STANDARD,
        csi_node("a", {CSI_DRIVER: 2}),
        pvc("d0", volume="pv-0", bound=True),
        pv("pv-0"),
        pv("pv-1"),
    ]
    eng = engine([node("a")], objects)
    eng.observe_volume("VolumeAttachment", "va-0", attachment("va-0", "pv-0"))
    assert isinstance(decide(eng, volume_pod("p", ["d0"])), Placement)  # one attached: 1 + 1
    eng.observe_volume("VolumeAttachment", "va-1", attachment("va-1", "pv-1"))
    assert reasons(decide(eng, volume_pod("p", ["d0"]))) == {REASON_MAX_VOLUMES: 1}


def test_attach_limits_for_in_tree_volumes_and_node_allocatable() -> None:
    # In-tree volumes count under their CSI driver where the CSINode lists the plugin as
    # migrated (isCSIMigrationOn); a Node's attachable-volumes-csi-<driver> is a limit too.
    ebs = {"awsElasticBlockStore": {"volumeID": "vol-1"}}
    objects = [
        *STANDARD,
        csi_node("a", {"ebs.csi.aws.com": 1}, migrated=["kubernetes.io/aws-ebs"]),
        volume_pod("running", inline=[ebs], node_name="a"),
    ]
    eng = engine([node("a")], objects)
    other = {"awsElasticBlockStore": {"volumeID": "vol-2"}}
    assert reasons(decide(eng, volume_pod("p", inline=[other]))) == {REASON_MAX_VOLUMES: 1}
    limited = node(
        "b",
        allocatable={
            "cpu": "8",
            "memory": "8Gi",
            "pods": "10",
            f"attachable-volumes-csi-{CSI_DRIVER}": "1",
        },
    )
    eng2 = engine([limited], [*STANDARD, pvc("d1"), pvc("d2")])
    assert reasons(decide(eng2, volume_pod("p", ["d1", "d2"]))) == {REASON_MAX_VOLUMES: 1}
    assert isinstance(decide(eng2, volume_pod("p", ["d1"])), Placement)


def test_a_driver_that_opts_in_needs_the_node_to_report_it() -> None:
    # VolumeLimitScaling (beta, on by default in 1.37): CSIDriver preventPodSchedulingIfMissing.
    driver = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": CSI_DRIVER},
        "spec": {"preventPodSchedulingIfMissing": True},
    }
    objects = [
        *STANDARD,
        driver,
        pvc("data"),
        csi_node("b", {"other.csi": None}),
        csi_node("c", {CSI_DRIVER: None}),
    ]
    eng = engine([node("a"), node("b"), node("c")], objects)
    decision = decide(eng, volume_pod("p", ["data"]))
    assert isinstance(decision, Placement)
    assert decision.node == "c"
    eng.observe_node("c", None)
    assert reasons(decide(eng, volume_pod("p", ["data"]))) == {
        REASON_CSINODE_MISSING: 1,
        f"node(s) did not have the CSI driver {CSI_DRIVER} installed": 1,
    }


# --------------------------------------------------------------------------- VolumeRestrictions


def test_read_write_once_pod_claim_in_use_rules_out_every_node() -> None:
    # VolumeRestrictions: a ReadWriteOncePod claim used by a scheduled pod (on any node).
    objects = [
        *STANDARD,
        pvc("solo", modes=("ReadWriteOncePod",), volume="pv-1", bound=True),
        pv("pv-1", modes=("ReadWriteOncePod",)),
    ]
    eng = engine([node("a"), node("b")], objects)
    first = decide(eng, volume_pod("p1", ["solo"]))
    assert isinstance(first, Placement)
    eng.assume(first, volume_pod("p1", ["solo"]))
    assert reasons(decide(eng, volume_pod("p2", ["solo"]))) == {REASON_RWOP_CONFLICT: 2}
    eng.forget("uid-p1")
    eng.observe_pod("uid-p1", "b", {}, PodVolumes.from_pod(volume_pod("p1", ["solo"])))
    assert reasons(decide(eng, volume_pod("p2", ["solo"]))) == {REASON_RWOP_CONFLICT: 2}
    eng.observe_pod("uid-p1", None)
    assert isinstance(decide(eng, volume_pod("p2", ["solo"])), Placement)


DISKS = [
    # isVolumeConflict: the same GCE PD conflicts unless both mounts are read-only,
    ({"gcePersistentDisk": {"pdName": "d"}}, {"gcePersistentDisk": {"pdName": "d"}}, True),
    (
        {"gcePersistentDisk": {"pdName": "d", "readOnly": True}},
        {"gcePersistentDisk": {"pdName": "d", "readOnly": True}},
        False,
    ),
    ({"gcePersistentDisk": {"pdName": "d"}}, {"gcePersistentDisk": {"pdName": "e"}}, False),
    # the same EBS volume always conflicts,
    (
        {"awsElasticBlockStore": {"volumeID": "v", "readOnly": True}},
        {"awsElasticBlockStore": {"volumeID": "v", "readOnly": True}},
        True,
    ),
    # the same iSCSI IQN unless both read-only,
    (
        {"iscsi": {"iqn": "q", "targetPortal": "t", "lun": 0}},
        {"iscsi": {"iqn": "q", "targetPortal": "t", "lun": 0, "readOnly": True}},
        True,
    ),
    # the same RBD pool and image on an overlapping monitor unless both read-only.
    (
        {"rbd": {"monitors": ["m1", "m2"], "image": "i"}},
        {"rbd": {"monitors": ["m2"], "image": "i"}},
        True,
    ),
    (
        {"rbd": {"monitors": ["m1"], "image": "i"}},
        {"rbd": {"monitors": ["m2"], "image": "i"}},
        False,
    ),
]


@pytest.mark.parametrize(("running", "new", "conflict"), DISKS)
def test_in_line_disk_conflicts(running: JSON, new: JSON, conflict: bool) -> None:
    eng = engine([node("a"), node("b")], [volume_pod("r", inline=[running], node_name="a")])
    decision = decide(eng, volume_pod("p", inline=[new]))
    assert isinstance(decision, Placement)
    assert decision.node == ("b" if conflict else "a")
    if conflict:
        eng.observe_node("b", None)
        assert reasons(decide(eng, volume_pod("p", inline=[new]))) == {REASON_DISK_CONFLICT: 1}


# --------------------------------------------------------------------------- the engine


def test_volume_rules_come_after_the_node_rules() -> None:
    # kube-scheduler's plugin order: NodeAffinity before the volume plugins.
    eng = engine(
        [node("a", labels={"x": "1"}), node("b")],
        [*STANDARD, pvc("data", volume="local-a", bound=True), pv("local-a", hostname="b")],
    )
    pod = volume_pod("p", ["data"])
    pod["spec"]["nodeSelector"] = {"x": "1"}
    assert reasons(decide(eng, pod)) == {
        "node(s) didn't match Pod's node affinity/selector": 1,
        REASON_NODE_CONFLICT: 1,
    }


def _gpu_cluster(seed: int) -> tuple[list[JSON], list[JSON], list[JSON]]:
    rng = random.Random(seed)
    nodes, slices, objects = [], [], [*STANDARD]
    for i in range(12):
        name = f"n{i:02d}"
        nodes.append(node(name, labels={ZONE: f"z{i % 3}"}))
        slices.append(
            slice_(
                f"{name}-gpus",
                node=name,
                devices=[gpu(g, memory="16Gi", shared=True) for g in range(4)],
            )
        )
    for j in range(6):
        zone = f"z{rng.randrange(3)}"
        objects += [pvc(f"d{j}", volume=f"pv-{j}", bound=True), pv(f"pv-{j}", zone=zone)]
    return nodes, slices, objects


@pytest.mark.parametrize("seed", range(4))
def test_pruned_search_equals_exhaustive_with_volume_filters(seed: int) -> None:
    nodes, slices, objects = _gpu_cluster(seed)
    rng = random.Random(seed)
    engines = []
    for exhaustive in (False, True):
        eng = DecisionEngine(snapshot(slices), [to_node(n) for n in nodes], exhaustive=exhaustive)
        feed(eng, objects)
        engines.append(eng)
    for i in range(20):
        pod = volume_pod(f"p{i}", [f"d{rng.randrange(6)}"])
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"c{i}"}]
        pod["metadata"]["annotations"] = {
            "biaxial.dev/node-policy": rng.choice(["binpack", "spread"])
        }
        gpu_claim = to_claim(
            claim(f"c{i}").request("gpu", cls=GPU_CLASS, capacity={"memory": "6Gi"})
        )
        decisions = [e.decide(pod, [gpu_claim]) for e in engines]
        assert type(decisions[0]) is type(decisions[1])
        if isinstance(decisions[0], Placement):
            assert isinstance(decisions[1], Placement)
            assert decisions[0].node == decisions[1].node
            for e, d in zip(engines, decisions, strict=True):
                e.assume(d, pod)
        else:
            assert isinstance(decisions[1], Unschedulable)
            assert decisions[0].message == decisions[1].message


def test_engine_state_includes_what_the_volume_rules_count() -> None:
    objects = [*STANDARD, pvc("data"), volume_pod("r", ["data"], node_name="a")]
    one = engine([node("a")], objects)
    two = engine([node("a")], list(reversed(objects)))
    assert one.state() == two.state()
    one.observe_pod("uid-r", None)
    assert one.state() != two.state()


def test_label_selectors() -> None:
    labels = {"a": "1", "b": "2"}
    assert label_selector_matches({}, labels)
    assert label_selector_matches({"matchLabels": {"a": "1"}}, labels)
    assert not label_selector_matches({"matchLabels": {"a": "2"}}, labels)
    expressions = [
        ({"key": "a", "operator": "In", "values": ["1", "3"]}, True),
        ({"key": "c", "operator": "NotIn", "values": ["1"]}, True),  # absent: NotIn holds
        ({"key": "b", "operator": "Exists"}, True),
        ({"key": "b", "operator": "DoesNotExist"}, False),
    ]
    for requirement, expected in expressions:
        assert label_selector_matches({"matchExpressions": [requirement]}, labels) is expected

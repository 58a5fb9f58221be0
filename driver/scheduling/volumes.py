"""Pods with volumes: kube-scheduler's VolumeRestrictions, NodeVolumeLimits, VolumeBinding and
VolumeZone rules, and the PV controller's contract with the scheduler.

:class:`ClusterVolumes` holds what the rules read, fed incrementally (``observe_*``, as
kube-scheduler's informers and assume caches feed its plugins): PersistentVolumeClaims,
PersistentVolumes, StorageClasses, CSINodes, CSIDrivers, CSIStorageCapacities,
VolumeAttachments, and the volumes of every pod on a node (any scheduler), plus the placements
of this scheduler in flight (:meth:`ClusterVolumes.assume`: the pod counts on its node, a PV it
binds shows that claim in ``claimRef``, a claim it provisions shows the node in
``volume.kubernetes.io/selected-node``; :meth:`~ClusterVolumes.forget` drops them).

For one pod, :meth:`ClusterVolumes.pod_context` runs the PreFilter checks once (None for a pod
without volumes: the rules cost nothing then) and raises
:class:`~driver.scheduling.outcome.PreFilterRejectedError` with upstream's message where every node
is ruled out:

==============================================  ==========================================
PreFilter (plugin)                              message
==============================================  ==========================================
a claim does not exist (VolumeRestrictions)     ``persistentvolumeclaim "x" not found``
a generic ephemeral volume's claim is missing   ``waiting for ephemeral volume controller to
(VolumeBinding)                                 create the persistentvolumeclaim "x"``
a claim is Lost / being deleted / not the       ``persistentvolumeclaim "x" bound to
pod's own ephemeral claim (VolumeBinding)       non-existent persistentvolume "y"`` /
                                                ``... is being deleted`` / ``PVC ns/x was not
                                                created for pod ns/p (pod is not owner)``
an unbound claim of an ``Immediate`` class, or  ``pod has unbound immediate
pre-bound and not bound yet (VolumeBinding)     PersistentVolumeClaims``
a bound claim's PV does not exist (VolumeZone)  ``persistentvolume "y" not found``
==============================================  ==========================================

:meth:`ClusterVolumes.filter` is then the per-node Filter, in kube-scheduler's plugin order,
returning the first reason that fails or the node's :class:`VolumeBindings`:

* **VolumeRestrictions**: an in-line GCE PD / AWS EBS / iSCSI / Ceph RBD disk another pod on
  the node mounts (``node(s) had no available disk``); a ``ReadWriteOncePod`` claim already
  used by a pod on any node (``node has pod using PersistentVolumeClaim with the same name and
  ReadWriteOncePod access mode``);
* **NodeVolumeLimits**: per CSI driver, the unique volumes of the pods on the node (every
  scheduler's; an unbound claim counts under its class's provisioner), of VolumeAttachments to
  the node, plus the pod's new ones, against the CSINode's ``allocatable.count`` (``node(s)
  exceed max volume count``); in-tree volumes count under their CSI driver where the CSINode
  names the plugin as migrated. A driver whose CSIDriver sets
  ``preventPodSchedulingIfMissing`` needs the node to report it in its CSINode (1.37's
  ``VolumeLimitScaling``, on by default);
* **VolumeBinding**: a bound claim's PV must accept the node (its required node affinity
  against the node's labels: ``node(s) had volume node affinity conflict``); an unbound
  ``WaitForFirstConsumer`` claim already annotated with a selected node only fits that node,
  else it takes the smallest available PV that matches (class, capacity, volume mode, volume
  attributes class, selector, access modes, node affinity; a PV pre-bound to the claim wins),
  else it is provisioned, which needs a class with a provisioner, ``allowedTopologies`` the
  node satisfies (``node(s) didn't find available persistent volumes to bind``) and, for a CSI
  driver that publishes storage capacity, a CSIStorageCapacity reachable from the node large
  enough (``node(s) did not have enough free storage``);
* **VolumeZone**: the zone and region labels of a bound claim's PV (``a__b`` lists several)
  must hold the node's value, when the node has any such label (``node(s) had no available
  volume zone``).

kube-scheduler may report several VolumeBinding reasons for one node; this reports the first
in upstream's order (node affinity, binding, storage, missing PV). Everything is deterministic:
PVs are compared by name when equally small, where upstream takes whichever its cache lists
first. Nothing mutates its inputs; models are frozen.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from driver.api.errors import InvalidInputError
from driver.api.labels import label_selector_matches
from driver.api.nodes import Node
from driver.scheduling.outcome import PreFilterRejectedError
from driver.scheduling.storage import (
    CSI_OF_PLUGIN,
    GA_LABEL,
    NO_PROVISIONER,
    READ_WRITE_ONCE_POD,
    TOPOLOGY_LABELS,
    ClaimRef,
    CSIDriverInfo,
    CSINodeInfo,
    PersistentVolume,
    PersistentVolumeClaim,
    PodVolumes,
    StorageCapacity,
    StorageClass,
    VolumeAttachment,
    VolumeBindings,
    bytes_of,
    topology_matches,
    volume_node_affinity_matches,
    zones_of,
)

log = logging.getLogger(f"biaxial.{__name__}")

# Upstream's per-node reasons.
REASON_DISK_CONFLICT: Final = "node(s) had no available disk"
REASON_RWOP_CONFLICT: Final = (
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
)
REASON_MAX_VOLUMES: Final = "node(s) exceed max volume count"
REASON_NODE_CONFLICT: Final = "node(s) had volume node affinity conflict"
REASON_BIND_CONFLICT: Final = "node(s) didn't find available persistent volumes to bind"
REASON_NOT_ENOUGH_SPACE: Final = "node(s) did not have enough free storage"
REASON_PV_NOT_EXIST: Final = (
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
)
REASON_ZONE_CONFLICT: Final = "node(s) had no available volume zone"
REASON_CSINODE_MISSING: Final = "node(s) did not report a CSINode"
MESSAGE_UNBOUND_IMMEDIATE: Final = "pod has unbound immediate PersistentVolumeClaims"

# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class PodVolumeContext:
    """One pod's PreFilter results, computed once per decision."""

    pod: PodVolumes
    claims: Mapping[str, PersistentVolumeClaim]  # by claim name, as the assume cache shows
    bound: tuple[PersistentVolumeClaim, ...]
    unbound: tuple[PersistentVolumeClaim, ...]  # WaitForFirstConsumer, smallest request first
    zones: tuple[tuple[str, str, frozenset[str]], ...]  # (PV, label, values) of bound claims
    rwop_conflict: bool
    #: per unbound claim key, the PVs that could take it on some node, by name: a PV
    #: pre-bound to it, or an Available one that matches all but the node's affinity
    candidates: Mapping[str, tuple[PersistentVolume, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _PodEntry:
    node: str
    volumes: PodVolumes
    assumed: bool


@dataclass(frozen=True, slots=True)
class VolumeState:
    """What a :class:`ClusterVolumes` holds, comparable between two of them (an incremental
    one must equal one built at once from the same cluster)."""

    claims: Mapping[str, PersistentVolumeClaim]
    volumes: Mapping[str, PersistentVolume]
    classes: Mapping[str, StorageClass]
    csi_nodes: Mapping[str, CSINodeInfo]
    drivers: Mapping[str, CSIDriverInfo]
    capacities: Mapping[str, StorageCapacity]
    attachments: Mapping[str, VolumeAttachment]
    pods: Mapping[str, tuple[str, PodVolumes, bool]]
    assumed_volumes: Mapping[str, tuple[str, ClaimRef]]
    assumed_claims: Mapping[str, tuple[str, str]]


def _replace(store: dict[str, Any], name: str, value: Any) -> Any:
    """Put ``value`` (None: remove) under ``name``; returns what was there."""
    old = store.get(name)
    if value is None:
        store.pop(name, None)
    else:
        store[name] = value
    return old


class ClusterVolumes:
    """See the module docstring."""

    def __init__(self) -> None:
        self._claims: dict[str, PersistentVolumeClaim] = {}
        self._volumes: dict[str, PersistentVolume] = {}
        self._by_class: dict[str, set[str]] = {}  # storage class -> PV names
        self._classes: dict[str, StorageClass] = {}
        self._csi_nodes: dict[str, CSINodeInfo] = {}
        self._drivers: dict[str, CSIDriverInfo] = {}
        self._capacities: dict[str, StorageCapacity] = {}
        self._attachments: dict[str, VolumeAttachment] = {}
        self._node_attachments: dict[str, set[str]] = {}
        self._pods: dict[str, _PodEntry] = {}  # pod uid -> where its volumes count
        self._node_pods: dict[str, set[str]] = {}
        self._claim_users: dict[str, set[str]] = {}  # claim key -> pod uids on nodes
        self._assumed_volumes: dict[str, tuple[str, ClaimRef]] = {}  # PV -> (pod, claimRef)
        self._assumed_claims: dict[str, tuple[str, str]] = {}  # claim -> (pod, selected node)

    # ------------------------------------------------------------------ observations
    def observe(self, kind: str, key: str, raw: Mapping[str, Any] | None) -> None:
        """An object of one of :data:`VOLUME_KINDS` (raw API JSON) appeared, changed or (None)
        went; ``key`` is ``namespace/name`` or the name. Raises
        :class:`~driver.api.errors.ManifestError` for a malformed object (nothing changes)."""
        if kind == "PersistentVolumeClaim":
            self.observe_claim(key, PersistentVolumeClaim.from_api(raw) if raw else None)
        elif kind == "PersistentVolume":
            self.observe_volume(key, PersistentVolume.from_api(raw) if raw else None)
        elif kind == "StorageClass":
            self.observe_storage_class(key, StorageClass.from_api(raw) if raw else None)
        elif kind == "CSINode":
            self.observe_csi_node(key, CSINodeInfo.from_api(raw) if raw else None)
        elif kind == "CSIDriver":
            self.observe_csi_driver(key, CSIDriverInfo.from_api(raw) if raw else None)
        elif kind == "CSIStorageCapacity":
            self.observe_capacity(key, StorageCapacity.from_api(raw) if raw else None)
        elif kind == "VolumeAttachment":
            self.observe_attachment(key, VolumeAttachment.from_api(raw) if raw else None)
        else:
            raise ValueError(f"not a volume kind: {kind}")

    def observe_claim(self, key: str, claim: PersistentVolumeClaim | None) -> None:
        """The PersistentVolumeClaim ``namespace/name`` appeared, changed or (None) went."""
        _replace(self._claims, key, claim)

    def observe_volume(self, name: str, volume: PersistentVolume | None) -> None:
        """The PersistentVolume ``name`` appeared, changed or (None) went."""
        old = _replace(self._volumes, name, volume)
        if old is not None:
            members = self._by_class.get(old.storage_class)
            if members is not None:
                members.discard(name)
                if not members:
                    del self._by_class[old.storage_class]
        if volume is not None:
            self._by_class.setdefault(volume.storage_class, set()).add(name)

    def observe_storage_class(self, name: str, storage_class: StorageClass | None) -> None:
        _replace(self._classes, name, storage_class)

    def observe_csi_node(self, name: str, info: CSINodeInfo | None) -> None:
        _replace(self._csi_nodes, name, info)

    def observe_csi_driver(self, name: str, info: CSIDriverInfo | None) -> None:
        _replace(self._drivers, name, info)

    def observe_capacity(self, key: str, capacity: StorageCapacity | None) -> None:
        _replace(self._capacities, key, capacity)

    def observe_attachment(self, name: str, attachment: VolumeAttachment | None) -> None:
        old = _replace(self._attachments, name, attachment)
        if old is not None:
            members = self._node_attachments.get(old.node)
            if members is not None:
                members.discard(name)
                if not members:
                    del self._node_attachments[old.node]
        if attachment is not None:
            self._node_attachments.setdefault(attachment.node, set()).add(name)

    def observe_pod(self, uid: str, node: str | None, volumes: PodVolumes | None = None) -> None:
        """The pod with UID ``uid`` runs on ``node`` with ``volumes`` (node None: it is gone
        or finished). A placement of ours assumed for it has landed then: its assumed PV and
        claim state is dropped (the cluster shows it)."""
        self._drop_assumed(uid)
        if node is None or volumes is None or volumes.empty:
            self._set_pod(uid, None)
        else:
            self._set_pod(uid, _PodEntry(node, volumes, assumed=False))

    # ------------------------------------------------------------------ our placements
    def assume(
        self, uid: str, node: str, volumes: PodVolumes, bindings: VolumeBindings | None
    ) -> None:
        """A placement of pod ``uid`` on ``node`` decided and not yet written: the pod's
        volumes count on the node, the PVs it binds and the claims it provisions show that."""
        if not volumes.empty:
            self._set_pod(uid, _PodEntry(node, volumes, assumed=True))
        if bindings is None:
            return
        for key, pv_name in bindings.bind:
            claim = self._claims.get(key)
            namespace, _, name = key.partition("/")
            ref = ClaimRef(namespace, name, claim.uid if claim is not None else "")
            self._assumed_volumes[pv_name] = (uid, ref)
        for key in bindings.provision:
            self._assumed_claims[key] = (uid, bindings.node)

    def forget(self, uid: str) -> None:
        """The placement assumed for pod ``uid`` will not be written (or was rolled back)."""
        self._drop_assumed(uid)
        entry = self._pods.get(uid)
        if entry is not None and entry.assumed:
            self._set_pod(uid, None)

    def state(self) -> VolumeState:
        return VolumeState(
            claims=dict(self._claims),
            volumes=dict(self._volumes),
            classes=dict(self._classes),
            csi_nodes=dict(self._csi_nodes),
            drivers=dict(self._drivers),
            capacities=dict(self._capacities),
            attachments=dict(self._attachments),
            pods={uid: (e.node, e.volumes, e.assumed) for uid, e in self._pods.items()},
            assumed_volumes=dict(self._assumed_volumes),
            assumed_claims=dict(self._assumed_claims),
        )

    # ------------------------------------------------------------------ reading
    def claim(self, key: str) -> PersistentVolumeClaim | None:
        """A claim as the assume cache shows it (with a selected node assumed by us)."""
        claim = self._claims.get(key)
        assumed = self._assumed_claims.get(key)
        if claim is not None and assumed is not None and claim.selected_node != assumed[1]:
            return dataclasses.replace(claim, selected_node=assumed[1])
        return claim

    def volume(self, name: str) -> PersistentVolume | None:
        """A PV as the assume cache shows it (bound to a claim by a placement in flight)."""
        volume = self._volumes.get(name)
        assumed = self._assumed_volumes.get(name)
        if volume is not None and assumed is not None and volume.claim_ref != assumed[1]:
            return dataclasses.replace(volume, claim_ref=assumed[1])
        return volume

    def storage_class(self, name: str) -> StorageClass | None:
        return self._classes.get(name)

    def claim_in_use(self, key: str) -> bool:
        """Whether a pod on a node (or a placement in flight) uses the claim ``key``."""
        return bool(self._claim_users.get(key))

    # ------------------------------------------------------------------ PreFilter
    def pod_context(self, pod: Mapping[str, Any]) -> PodVolumeContext | None:
        """The pod's PreFilter results (None: it has no volume the rules look at). Raises
        :class:`PreFilterRejectedError` where no node can take the pod, and
        :class:`~driver.api.errors.InvalidInputError` for a StorageClass without a binding
        mode (upstream's scheduling error)."""
        volumes = PodVolumes.from_pod(pod)
        if volumes.empty:
            return None
        observed: dict[str, PersistentVolumeClaim] = {}
        # VolumeRestrictions: every persistentVolumeClaim volume's claim must exist.
        for use in volumes.claims:
            key = f"{volumes.namespace}/{use.claim}"
            found = self._claims.get(key)
            if found is None and not use.ephemeral:
                raise PreFilterRejectedError(f'persistentvolumeclaim "{use.claim}" not found')
            if found is not None:
                observed[use.claim] = found
        # VolumeBinding: claims usable by this pod, then bound / delayed / immediate.
        for use in volumes.claims:
            found = observed.get(use.claim)
            if found is None:
                raise PreFilterRejectedError(
                    "waiting for ephemeral volume controller to create the "
                    f'persistentvolumeclaim "{use.claim}"'
                )
            if found.phase == "Lost":
                raise PreFilterRejectedError(
                    f'persistentvolumeclaim "{found.name}" bound to non-existent '
                    f'persistentvolume "{found.volume_name}"'
                )
            if found.deleting:
                raise PreFilterRejectedError(
                    f'persistentvolumeclaim "{found.name}" is being deleted'
                )
            if use.ephemeral and (
                found.namespace != volumes.namespace or found.controller_uid != volumes.uid
            ):
                raise PreFilterRejectedError(
                    f"PVC {found.namespace}/{found.name} was not created for pod "
                    f"{volumes.namespace}/{volumes.name} (pod is not owner)"
                )
        claims: dict[str, PersistentVolumeClaim] = {}
        bound: list[PersistentVolumeClaim] = []
        unbound: list[PersistentVolumeClaim] = []
        immediate = False
        for use in volumes.claims:
            claim = self.claim(f"{volumes.namespace}/{use.claim}")
            assert claim is not None  # observed above; assumed state never drops a claim
            claims[use.claim] = claim
            if claim.fully_bound:
                bound.append(claim)
            elif self._delays_binding(claim) and not claim.volume_name:
                unbound.append(claim)
            else:
                immediate = True  # unbound Immediate, or pre-bound and not bound yet
        if immediate:
            raise PreFilterRejectedError(MESSAGE_UNBOUND_IMMEDIATE)
        # VolumeZone: the zone labels of the PVs of bound persistentVolumeClaim volumes.
        zones: list[tuple[str, str, frozenset[str]]] = []
        for use in volumes.claims:
            if use.ephemeral:
                continue
            claim = observed[use.claim]
            if not claim.volume_name:
                continue  # unbound: WaitForFirstConsumer here (others were refused above)
            pv = self._volumes.get(claim.volume_name)
            if pv is None:
                raise PreFilterRejectedError(f'persistentvolume "{claim.volume_name}" not found')
            for label in TOPOLOGY_LABELS:
                value = pv.labels.get(label)
                if value is None:
                    continue
                allowed = zones_of(value)
                if allowed is None:
                    log.info("PV %s: label %s=%r is malformed, ignored", pv.name, label, value)
                    continue
                zones.append((pv.name, label, allowed))
        # VolumeRestrictions: a ReadWriteOncePod claim another pod already uses.
        rwop = any(
            READ_WRITE_ONCE_POD in observed[use.claim].access_modes
            and self.claim_in_use(f"{volumes.namespace}/{use.claim}")
            for use in volumes.claims
            if not use.ephemeral
        )
        return PodVolumeContext(
            pod=volumes,
            claims=claims,
            bound=tuple(bound),
            unbound=tuple(sorted(unbound, key=lambda c: c.request)),
            zones=tuple(zones),
            rwop_conflict=rwop,
            candidates={c.key: self._candidates(c) for c in unbound if c.selected_node is None},
        )

    def _delays_binding(self, claim: PersistentVolumeClaim) -> bool:
        """``IsDelayBindingMode``: the claim's class exists and waits for the first consumer
        (no class, or an unknown one, is Immediate)."""
        if not claim.storage_class:
            return False
        storage_class = self._classes.get(claim.storage_class)
        if storage_class is None:
            return False
        if storage_class.binding_mode is None:
            raise InvalidInputError(
                f'VolumeBindingMode not set for StorageClass "{storage_class.name}"'
            )
        return storage_class.delays_binding

    # ------------------------------------------------------------------ Filter
    def filter(self, ctx: PodVolumeContext, node: Node) -> VolumeBindings | str:
        """The node's outcome for the pod's volumes: the first reason it fails, in plugin
        order, or what would be written for them there."""
        # VolumeRestrictions
        if ctx.pod.disks and self._disk_conflict(ctx.pod, node.name):
            return REASON_DISK_CONFLICT
        if ctx.rwop_conflict:
            return REASON_RWOP_CONFLICT
        # NodeVolumeLimits
        reason = self._limits(ctx, node)
        if reason is not None:
            return reason
        # VolumeBinding
        outcome = self._binding(ctx, node)
        if isinstance(outcome, str):
            return outcome
        # VolumeZone
        if ctx.zones and any(label in node.labels for label in TOPOLOGY_LABELS):
            for _, label, allowed in ctx.zones:
                value = node.labels.get(label)
                if value is None:
                    value = node.labels.get(GA_LABEL.get(label, label))
                if value is None or value not in allowed:
                    return REASON_ZONE_CONFLICT
        return outcome

    def _disk_conflict(self, pod: PodVolumes, node: str) -> bool:
        for uid in self._node_pods.get(node, ()):
            other = self._pods[uid].volumes
            if any(mine.conflicts(theirs) for mine in pod.disks for theirs in other.disks):
                return True
        return False

    # ..................................................................... limits
    def _unique_volume(
        self, claim: PersistentVolumeClaim, csi_node: CSINodeInfo | None
    ) -> tuple[str, str] | None:
        """(driver, unique volume name) of a claim's volume (``getCSIDriverInfo``): from its
        PV, or for a claim not bound yet from its class's provisioner; None when it is not a
        CSI volume (nor a migrated in-tree one)."""
        pv = self.volume(claim.volume_name) if claim.volume_name else None
        if pv is not None:
            if pv.csi is not None:
                driver, handle = pv.csi
                return driver, f"{driver}/{handle}"
            if pv.in_tree is not None and csi_node is not None:
                plugin, ident = pv.in_tree
                if plugin in csi_node.migrated:
                    driver = CSI_OF_PLUGIN[plugin]
                    return driver, f"{driver}/{ident}"
            return None
        storage_class = self._classes.get(claim.storage_class) if claim.storage_class else None
        if storage_class is None:
            return None
        driver = storage_class.provisioner
        if driver in CSI_OF_PLUGIN:
            if csi_node is None or driver not in csi_node.migrated:
                return None
            driver = CSI_OF_PLUGIN[driver]
        # Unique per claim, and never equal to a real volume's name (a NUL cannot be in one).
        return driver, f"{driver}/\0{claim.key}"

    def _attachable(
        self, volumes: PodVolumes, csi_node: CSINodeInfo | None, out: dict[str, str]
    ) -> None:
        """``filterAttachableVolumes``: unique volume name -> driver, for one pod's volumes
        (claims it cannot see are not counted)."""
        for use in volumes.claims:
            claim = self.claim(f"{volumes.namespace}/{use.claim}")
            if claim is None:
                continue
            found = self._unique_volume(claim, csi_node)
            if found is not None:
                out[found[1]] = found[0]
        if csi_node is not None:
            for plugin, ident in volumes.in_tree:
                if plugin in csi_node.migrated:
                    driver = CSI_OF_PLUGIN[plugin]
                    out[f"{driver}/{ident}"] = driver

    def _limits(self, ctx: PodVolumeContext, node: Node) -> str | None:
        csi_node = self._csi_nodes.get(node.name)
        new: dict[str, str] = {}
        self._attachable(ctx.pod, csi_node, new)
        if not new:
            return None
        for driver in sorted(set(new.values())):
            info = self._drivers.get(driver)
            if info is None or not info.prevent_if_missing:
                continue
            if csi_node is None:
                return REASON_CSINODE_MISSING
            if driver not in csi_node.drivers:
                return f"node(s) did not have the CSI driver {driver} installed"
        limits: dict[str, int] = {}
        prefix = "attachable-volumes-csi-"
        for resource, quantity in node.allocatable.items():
            if resource.startswith(prefix):
                limits[resource.removeprefix(prefix)] = quantity.value()
        if csi_node is not None:
            limits.update(
                (driver, count) for driver, count in csi_node.drivers.items() if count is not None
            )
        if not limits:
            return None
        attached: dict[str, str] = {}
        for uid in self._node_pods.get(node.name, ()):
            self._attachable(self._pods[uid].volumes, csi_node, attached)
        counts: dict[str, int] = {}
        for unique, driver in attached.items():
            new.pop(unique, None)  # a volume the node's pods use is counted once
            counts[driver] = counts.get(driver, 0) + 1
        # VolumeAttachments add the volumes no pod there uses; as upstream counts them, one the
        # pending pod uses still counts as new too ("should count VolumeAttachments towards
        # volume limit when no pods exist", csi_test.go).
        for name in self._node_attachments.get(node.name, ()):
            found = self._attached_by(self._attachments[name])
            if found is not None and found[1] not in attached:
                attached[found[1]] = found[0]
                counts[found[0]] = counts.get(found[0], 0) + 1
        adding: dict[str, int] = {}
        for driver in new.values():
            adding[driver] = adding.get(driver, 0) + 1
        for driver, count in adding.items():
            limit = limits.get(driver)
            if limit is not None and counts.get(driver, 0) + count > limit:
                return REASON_MAX_VOLUMES
        return None

    def _attached_by(self, attachment: VolumeAttachment) -> tuple[str, str] | None:
        driver = attachment.attacher
        if attachment.inline_handle is not None:
            return driver, f"{driver}/{attachment.inline_handle}"
        pv = self._volumes.get(attachment.pv_name or "")
        if pv is None:
            return None
        if pv.csi is not None:
            return pv.csi[0], f"{pv.csi[0]}/{pv.csi[1]}"
        if pv.in_tree is not None:
            return driver, f"{driver}/{pv.in_tree[1]}"
        return None

    # ..................................................................... binding
    def _binding(self, ctx: PodVolumeContext, node: Node) -> VolumeBindings | str:
        """``FindPodVolumes`` for one node."""
        labels = node.labels
        for claim in ctx.bound:
            pv = self.volume(claim.volume_name)
            if pv is None:
                return REASON_PV_NOT_EXIST
            if not volume_node_affinity_matches(pv, labels):
                return REASON_NODE_CONFLICT
        if not ctx.unbound:
            return VolumeBindings(node.name)
        to_match: list[PersistentVolumeClaim] = []
        to_provision: list[PersistentVolumeClaim] = []
        for claim in ctx.unbound:
            if claim.selected_node is not None:
                if claim.selected_node != node.name:
                    return REASON_BIND_CONFLICT  # provisioning already started for another node
                to_provision.append(claim)
            else:
                to_match.append(claim)
        bind: list[tuple[str, str]] = []
        chosen: set[str] = set()
        for claim in to_match:
            pv = self._matching_volume(ctx.candidates[claim.key], claim, labels, chosen)
            if pv is None:
                to_provision.append(claim)
            else:
                chosen.add(pv.name)
                bind.append((claim.key, pv.name))
        for claim in to_provision:
            reason = self._provisionable(claim, labels)
            if reason is not None:
                return reason
        return VolumeBindings(
            node=node.name,
            bind=tuple(bind),
            provision=tuple(c.key for c in to_provision),
        )

    def _candidates(self, claim: PersistentVolumeClaim) -> tuple[PersistentVolume, ...]:
        """``FindMatchingVolume``'s checks that do not depend on the node, once per pod: the
        PVs of the claim's class, by name, that are pre-bound to it (whatever else they
        hold: that PV or nothing) or Available and matching it (size, volume mode,
        attributes class, selector, access modes)."""
        out: list[PersistentVolume] = []
        for name in sorted(self._by_class.get(claim.storage_class, ())):
            pv = self.volume(name)
            assert pv is not None
            if pv.claim_ref is not None and not pv.bound_to(claim):
                continue
            if pv.capacity < claim.request or pv.volume_mode != claim.volume_mode:
                continue
            if pv.attributes_class != claim.attributes_class or pv.deleting:
                continue
            if pv.bound_to(claim):
                out.append(pv)
                continue
            if pv.phase != "Available":
                continue
            if claim.selector is not None and not label_selector_matches(
                claim.selector, pv.labels, f"PersistentVolumeClaim {claim.key} selector"
            ):
                continue
            if pv.storage_class != claim.storage_class:
                continue
            if not claim.access_modes <= pv.access_modes:
                continue
            out.append(pv)
        return tuple(out)

    @staticmethod
    def _matching_volume(
        candidates: Sequence[PersistentVolume],
        claim: PersistentVolumeClaim,
        labels: Mapping[str, str],
        excluded: set[str],
    ) -> PersistentVolume | None:
        """``FindMatchingVolume`` on the scheduler's path, for one node: a PV pre-bound to
        the claim if it accepts the node (else nothing), otherwise the smallest available
        match that accepts it (``candidates``: :meth:`_candidates`)."""
        best: PersistentVolume | None = None
        for pv in candidates:
            if pv.name in excluded:
                continue
            fits_node = volume_node_affinity_matches(pv, labels)
            if pv.bound_to(claim):
                return pv if fits_node else None
            if fits_node and (best is None or pv.capacity < best.capacity):
                best = pv
        return best

    def _provisionable(self, claim: PersistentVolumeClaim, labels: Mapping[str, str]) -> str | None:
        """``checkVolumeProvisions`` for one claim: None when it can be provisioned for a
        node with ``labels``, else the reason."""
        storage_class = self._classes.get(claim.storage_class)
        if storage_class is None:
            raise InvalidInputError(f'failed to find storage class "{claim.storage_class}"')
        if storage_class.provisioner in ("", NO_PROVISIONER):
            return REASON_BIND_CONFLICT
        if not topology_matches(storage_class.allowed_topologies, labels):
            return REASON_BIND_CONFLICT
        if not self._enough_capacity(storage_class, claim, labels):
            return REASON_NOT_ENOUGH_SPACE
        return None

    def _enough_capacity(
        self, storage_class: StorageClass, claim: PersistentVolumeClaim, labels: Mapping[str, str]
    ) -> bool:
        """``hasEnoughCapacity``: checked only for a CSI driver that publishes capacity."""
        if not claim.request:
            return True
        driver = self._drivers.get(storage_class.provisioner)
        if driver is None or not driver.storage_capacity:
            return True
        size = bytes_of(claim.request)
        for capacity in self._capacities.values():
            if capacity.storage_class != storage_class.name:
                continue
            limit = capacity.limit()
            if limit is None or limit < size or capacity.node_topology is None:
                continue
            if label_selector_matches(capacity.node_topology, labels, capacity.key):
                return True
        return False

    # ------------------------------------------------------------------ internals
    def _drop_assumed(self, uid: str) -> None:
        for store in (self._assumed_volumes, self._assumed_claims):
            for name in [n for n, (owner, _) in store.items() if owner == uid]:
                del store[name]

    def _set_pod(self, uid: str, entry: _PodEntry | None) -> None:
        current = self._pods.pop(uid, None)
        if current is not None:
            members = self._node_pods.get(current.node)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._node_pods[current.node]
            for key in current.volumes.claim_keys():
                users = self._claim_users.get(key)
                if users is not None:
                    users.discard(uid)
                    if not users:
                        del self._claim_users[key]
        if entry is not None:
            self._pods[uid] = entry
            self._node_pods.setdefault(entry.node, set()).add(uid)
            for key in entry.volumes.claim_keys():
                self._claim_users.setdefault(key, set()).add(uid)

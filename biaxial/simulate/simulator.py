"""The simulator behind ``biaxial simulate``: a whole cluster in memory, the real decision code.

Input is a list of Kubernetes objects (already parsed and checked, see
:mod:`biaxial.simulate.manifests`); what each kind means is the table in
:mod:`biaxial.simulate.kinds`:

* the cluster: a ``Cluster`` inventory (:mod:`biaxial.simulate.cluster`: fake GPUs through
  the real slice builder) and/or the objects ``kubectl get -A -o yaml`` returns: Nodes,
  ResourceSlices, DeviceClasses (added to, and overriding by name, the default classes the
  caller passes), ResourceClaims (an allocated one is cluster state), Namespaces (their
  labels: ``adminAccess`` is admitted only where ``resource.kubernetes.io/admin-access:
  "true"`` is set, as the API server admits it; kept for the affinity rules'
  ``namespaceSelector``), Services (their selectors, for default topology spreading), and Pods
  bound to a node (``spec.nodeName``: running; they count on the node as the controller counts
  every bound pod -- requests, host ports, volumes, labels and affinity terms -- whatever
  their scheduler);
* the volumes: PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes (also from
  the inventory's ``attachLimits``), CSIDrivers, CSIStorageCapacities and VolumeAttachments,
  read by kube-scheduler's volume rules (:mod:`driver.scheduling.volumes`: missing and
  unbound ``Immediate`` claims, PV node affinity and zones, attach limits, ``ReadWriteOncePod``,
  static PV matching and ``WaitForFirstConsumer`` provisioning);
* the work: ResourceClaimTemplates, pending Pods, and the workload kinds, whose missing pods
  are created as their controllers would (:mod:`biaxial.simulate.workloads`).

Pods are treated as the controller treats them: a pod is placed only when it names this
scheduler (``spec.schedulerName``, ``biaxial`` by default), has no scheduling gates and is not
being deleted; other pending pods are reported as *skipped* with the reason; finished pods
count for nothing. Pods are placed highest ``spec.priority`` first, then in input order (as
kube-scheduler's PrioritySort), with :class:`~driver.scheduling.decision.DecisionEngine`; a
pod's priority is resolved from the PriorityClasses given as the API server's admission would
(:mod:`biaxial.simulate.priority`). A pending pod that fits nowhere is also run through the
engine's preemption dry run: ``preemptions`` lists the running pods (``spec.nodeName`` in the
input) it would preempt and where, honouring the PodDisruptionBudgets given; nothing is evicted
or nominated, so the pods after it see the cluster unchanged. The simulator plays the resourceclaim
controller for templates (a pod's claim is ``<pod>-<claim>-<5 characters>``, annotated
``resource.kubernetes.io/pod-claim-name``, unless the pod's status already names it) and the
API server for bridge claims (``<pod>-extended-resources-<5 characters>``). UIDs are UUIDv5 of
the object's identity, so a run is reproducible byte for byte (timings aside). It also plays
the controllers that create PersistentVolumeClaims: the ephemeral volume controller
(``<pod>-<volume>`` from a generic ephemeral volume's template, owned by the pod) and the
StatefulSet controller (``<template>-<pod>`` from ``volumeClaimTemplates``), each only where
the claim does not exist, and the PV controller's first sync for a PV written without a phase
(``Available``, or ``Bound`` when its ``claimRef`` has a UID). Volumes are bound as the
controller binds them before the pod: a PV chosen for a claim gets its ``claimRef``, a claim
to provision ``volume.kubernetes.io/selected-node``; provisioning is assumed to succeed on the
node chosen (which the class's ``allowedTopologies`` allow), so later pods follow the claim
there; a PV's binding is completed as the PV controller completes it before the pod is bound.

Bad input for the run (an unsupported kind, a duplicate object, a malformed claim, class, node
or slice, a pod the API server would refuse, a broken workload, no nodes) raises
:class:`~driver.api.errors.ManifestError`: nothing is simulated. Bad input for one pod's
scheduling (unknown class, invalid CEL, unknown policy or dialect key, impossible request)
becomes an entry in ``unschedulable`` with the specific reason, as the controller reports it
on the pod; the other pods are still placed.

Output (:class:`SimulationResult`): placements with the policies each pod got and every device
it uses (a shared claim's devices on every pod that shares it), unschedulable and skipped pods,
notes (skipped kinds, finished pods), per-GPU use counted from every allocated claim (admin
access is not use; MIG partitions are drawn inside their GPU and a GPU in MIG mode is never
"whole"). **Fragmentation** (``summary.fragmentation``): the share of free memory of whole
(non-MIG) and dynamic-MIG GPUs that sits on GPUs already partly in use, i.e. memory a whole-GPU
request cannot use. 0 means every free byte is on an idle GPU; 1 means no idle GPU is left
although memory is free.

**Dynamic MIG.** A node whose profile declares dynamic MIG (``a100-80gbx8-dynmig``, or
``mig: {enabled: true, dynamic: true}`` in a profile file) publishes each such GPU's counters
and every (profile, placement), as the kubelet plugin would. The placements the decisions take
are the partitions the plugin would create: each GPU lists them (device, profile, start, size,
pods) with its ``memorySlices``, ``freeMemorySlices`` and the largest profile still placeable;
unused placements are not listed. Such a GPU is whole until a partition is taken. Its free
memory is counted in MIG slots (its free memory slices' share of its memory), so fragmentation
covers the slots partitions leave behind; ``summary.mig`` totals them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from biaxial.simulate.admission import namespace_labels
from biaxial.simulate.cluster import (
    INVENTORY_API_VERSION,
    build_inventory,
)
from biaxial.simulate.kinds import object_label
from biaxial.simulate.priority import PriorityClasses, budget_from_api
from biaxial.simulate.reading import (
    FINISHED_PHASES,
    Input,
    Reading,
    check_pod_object,
    with_uid,
)
from biaxial.simulate.results import (
    GpuUsage,
    PartitionUsage,
    PodFailure,
    PodPlacement,
    PodPreemption,
    SimulationResult,
)
from biaxial.simulate.usage import gpu_usage
from biaxial.simulate.workloads import (
    deployment_replicaset,
    expand_deployment,
    generated_suffix,
    ns_name,
    stable_uid,
)
from driver.api.claims import AllocationResult, ResourceClaim
from driver.api.errors import BiaxialError, ManifestError
from driver.api.model import JSON
from driver.scheduling.admission import AdmissionScope, admit
from driver.scheduling.decision import DecisionEngine
from driver.scheduling.outcome import Placement, PodError, Preemption, Unschedulable
from driver.scheduling.policy import PolicyDefaults
from driver.scheduling.preemption import DisruptionBudget, pod_priority
from driver.scheduling.storage import (
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_SELECTED_NODE,
    PodVolumes,
)
from driver.scheduling.topologyspread import DefaultSpreading
from kubeapi import codec

POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
#: The one recipe for a dump of a cluster (docs/simulator.md and docs/migration.md show it).
DUMP_COMMAND: Final = (
    "kubectl get "
    + ",".join(
        (
            "nodes,resourceslices,deviceclasses,resourceclaims,resourceclaimtemplates,pods",
            "namespaces,services,replicasets,statefulsets,poddisruptionbudgets,priorityclasses",
            "pvc,pv,storageclasses,csinodes,csidrivers,csistoragecapacities,volumeattachments",
        )
    )
    + " -A -o yaml"
)
DEFAULT_SCHEDULER: Final = "biaxial"
MIB: Final = 1024 * 1024


def _claim_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return ns_name(obj)


# --------------------------------------------------------------------------- the run


class _Run:
    """One simulation: its input read (:class:`~biaxial.simulate.reading.Reading`), then every
    pending pod decided and recorded; holds the mutable bookkeeping so :func:`simulate` stays
    readable."""

    def __init__(
        self,
        objects: Sequence[Mapping[str, Any]],
        default_classes: Sequence[Mapping[str, Any]],
        defaults: PolicyDefaults,
        scheduler_name: str,
        base_dirs: Sequence[Path | None] | None,
        *,
        spreading: DefaultSpreading | None = None,
        admission: AdmissionScope | None = None,
    ) -> None:
        self.result = SimulationResult(policies=defaults)
        self.admission = admission
        self.defaults = defaults
        self.spreading = spreading
        self.scheduler_name = scheduler_name
        self.reading = Reading(objects, default_classes, base_dirs)
        self.claims: dict[tuple[str, str], JSON] = {}
        self.namespaces: dict[str, dict[str, str]] = {}
        self.touched: list[tuple[str, str]] = []
        self.placed_pods: list[JSON] = []
        self.budgets: list[DisruptionBudget] = []
        #: (kind, namespace/name or name) -> object, for every kind the volume rules read
        self.volumes = self.reading.volumes
        self.touched_volumes: list[tuple[str, str]] = []
        self._uuids: dict[tuple[str, str, str], str] = {}

    def run(self) -> SimulationResult:
        started = time.perf_counter()
        found = self.reading.collect()
        self.result.notes.extend(self.reading.notes)
        self.reading.check_admin_access(found)
        self.namespaces = found.namespaces  # for the affinity rules' namespaceSelector
        nodes, slices = self.reading.cluster(found)
        node_names = {str(n.name) for n in nodes}
        self.result.node_names = [n.name for n in nodes]
        self._uuids = {
            (s.driver, s.pool.name, d.name): str(d.attributes.get("uuid", ""))
            for s in slices
            for d in s.devices
        }
        classes = self.reading.classes(found)
        self.templates = found.templates
        existing: list[ResourceClaim] = []
        for raw_claim in found.claims:
            raw = with_uid(raw_claim)
            claim = ResourceClaim.from_api(raw)
            self.claims[_claim_key(raw)] = raw
            if claim.allocation is not None:
                existing.append(claim)
        running: list[JSON] = []
        pending: list[JSON] = []
        finished = 0
        priorities = PriorityClasses(found.priority_classes)
        for pod in self.reading.pods(found, nodes):
            pod = self._admit(pod, found)  # noqa: PLW2901 - the admitted pod replaces it
            pod = priorities.admit(pod)  # noqa: PLW2901
            pod_priority(pod, f"Pod {'/'.join(ns_name(pod))}")
            verdict = self._triage(pod, node_names)
            if verdict == "finished":
                finished += 1
            elif verdict == "running":
                running.append(pod)
            elif verdict == "pending":
                pending.append(pod)
        if finished:
            self.result.notes.append(f"{finished} finished pod(s) (Succeeded or Failed) ignored")
        self._check_running_claims(running)
        # As kube-scheduler's PrioritySort: higher spec.priority first, then input order.
        pending.sort(key=lambda p: -pod_priority(p))
        self.budgets = [budget_from_api(b, running) for b in found.budgets]
        from driver.structured.snapshot import ClusterSnapshot  # noqa: PLC0415 - keeps import cheap

        snapshot = ClusterSnapshot.build(slices, classes.values(), [])
        engine = DecisionEngine(snapshot, nodes, defaults=self.defaults, spreading=self.spreading)
        for claim in existing:
            # With the pods that reserve it: preemption frees a claim's devices only when
            # every one of them is a victim.
            engine.observe_allocation(
                f"{claim.namespace}/{claim.name}",
                claim.allocation,
                reserved_for=[r.uid for r in claim.reserved_for if r.uid],
            )
        for name, labels in found.namespaces.items():
            engine.observe_namespace(name, labels)
        self._owners(engine, found)
        for (kind, key), obj in self.volumes.items():
            engine.observe_volume(kind, key, obj)
        for pod in running:
            # Every running pod counts: its requests, host ports, volumes, and labels and
            # affinity terms for the rules between pods, whichever scheduler placed it.
            namespace, name = ns_name(pod)
            try:
                volumes = PodVolumes.from_pod(pod)
                engine.observe_pod(
                    pod["metadata"]["uid"],
                    str(pod["spec"]["nodeName"]),
                    volumes=None if volumes.empty else volumes,
                    raw=pod,
                )
            except BiaxialError as exc:
                raise ManifestError(f"Pod {namespace}/{name}: {exc}") from exc
            self.result.running += 1
        self.result.startup_seconds = time.perf_counter() - started
        for pod in pending:
            self._place(engine, pod)
        if not pending:
            self.result.notes.append("no pending pod for this scheduler to place")
        self.result.gpus = gpu_usage(self.claims, slices, self.result.node_names)
        self.result.objects = [
            *(self.claims[key] for key in dict.fromkeys(self.touched)),
            *(self.volumes[key] for key in dict.fromkeys(self.touched_volumes)),
            *self.placed_pods,
        ]
        return self.result

    def _check_running_claims(self, running: Sequence[JSON]) -> None:
        """Refuse a dump whose running pods use claims it does not hold (``kubectl get`` without
        ``resourceclaims``): their devices would look free and be given again."""
        missing: list[str] = []
        for pod in running:
            namespace, _ = ns_name(pod)
            status = pod.get("status") or {}
            named = [
                entry.get("resourceClaimName")
                for entry in (pod.get("spec") or {}).get("resourceClaims") or ()
                if isinstance(entry, Mapping)
            ]
            named += [
                entry.get("resourceClaimName")
                for entry in status.get("resourceClaimStatuses") or ()
                if isinstance(entry, Mapping)
            ]
            extended = status.get("extendedResourceClaimStatus")
            if isinstance(extended, Mapping):
                named.append(extended.get("resourceClaimName"))
            missing += [
                f"{namespace}/{claim}"
                for claim in named
                if isinstance(claim, str) and claim and (namespace, claim) not in self.claims
            ]
        if missing:
            listed = list(dict.fromkeys(missing))
            more = f" and {len(listed) - 3} more" if len(listed) > 3 else ""
            raise ManifestError(
                f"running pods use ResourceClaims the input does not hold "
                f"({', '.join(listed[:3])}{more}), so their GPUs would look free; add them: "
                "kubectl get resourceclaims -A -o yaml (docs/simulator.md gives the whole "
                "dump command)"
            )

    def _owners(self, engine: DecisionEngine, found: Input) -> None:
        """The selectors default topology spreading reads: Services, and the ReplicaSets and
        StatefulSets given or standing behind a Deployment's pods."""
        for obj in [*found.services, *found.work]:
            kind = str(obj.get("kind"))
            if kind not in ("Service", "ReplicaSet", "StatefulSet", "Deployment"):
                continue
            namespace, name = ns_name(obj)
            selector = (obj.get("spec") or {}).get("selector")
            try:
                if kind == "Deployment":
                    rs_name, rs_selector = deployment_replicaset(obj)
                    engine.observe_owner("ReplicaSet", namespace, rs_name, rs_selector)
                elif kind != "Service" or selector is not None:
                    engine.observe_owner(kind, namespace, name, selector)
            except BiaxialError as exc:
                raise ManifestError(f"{object_label(obj)}: spec.selector: {exc}") from exc

    def _admit(self, pod: JSON, found: Input) -> JSON:
        """The chart's admission step (``admission`` given) on a pod being created: one the
        input writes or a workload makes, not one a live cluster already has
        (``creationTimestamp``), which went through admission when it was created."""
        if self.admission is None or (pod.get("metadata") or {}).get("creationTimestamp"):
            return pod
        namespace, name = ns_name(pod)
        labels = namespace_labels(namespace, found.namespaces)
        change = admit(pod, labels, self.admission)
        if change is None:
            return pod
        self.result.admissions.append((f"{namespace}/{name}", change.note()))
        return change.apply(pod)

    def _triage(self, pod: JSON, node_names: set[str]) -> str:
        """``running``, ``finished``, ``pending`` (to place), or ``skipped`` (reported)."""
        namespace, name = ns_name(pod)
        key = f"{namespace}/{name}"
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            return "finished"
        node = spec.get("nodeName")
        if node:
            if node not in node_names and meta.get("deletionTimestamp"):
                # a live cluster's state: the node is gone and the pod, being deleted, waits
                # for kube-controller-manager's pod garbage collector to remove it
                self.result.skipped.append(
                    PodFailure(pod=key, reason=f"being deleted (its node {node} is gone)")
                )
                return "skipped"
            if node not in node_names:
                raise ManifestError(
                    f"Pod {key}: spec.nodeName {node!r} is not a node of the cluster"
                )
            return "running"
        reason = None
        scheduler = spec.get("schedulerName") or "default-scheduler"
        if meta.get("deletionTimestamp"):
            reason = "being deleted"
        elif scheduler != self.scheduler_name:
            reason = (
                f"schedulerName {scheduler}: another scheduler's pod (set schedulerName: "
                f"{self.scheduler_name} to have biaxial place it)"
            )
        elif spec.get("schedulingGates"):
            gates = ", ".join(str(g.get("name")) for g in spec["schedulingGates"])
            reason = f"waiting for its scheduling gates to be removed ({gates})"
        if reason is None:
            return "pending"
        self.result.skipped.append(PodFailure(pod=key, reason=reason))
        return "skipped"

    # ------------------------------------------------------------------ per pod
    def _pod_claims(self, pod: JSON) -> tuple[list[tuple[str, JSON]], list[JSON]]:
        """(pod claim name, claim JSON) in spec order; new template claims listed apart."""
        namespace, name = ns_name(pod)
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
            if isinstance(s, Mapping)
        }
        out: list[tuple[str, JSON]] = []
        created: list[JSON] = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            claim_name = str(entry["name"])
            named = entry.get("resourceClaimName") or statuses.get(claim_name)
            if named:
                key = (namespace, str(named))
                if key not in self.claims:
                    raise ManifestError(
                        f"pod {namespace}/{name}: resourceclaim {key[0]}/{key[1]} not found"
                    )
                out.append((claim_name, self.claims[key]))
                continue
            template_name = str(entry["resourceClaimTemplateName"])
            template = self.templates.get((namespace, template_name))
            if template is None:
                raise ManifestError(
                    f"pod {namespace}/{name}: resourceclaimtemplate "
                    f"{namespace}/{template_name} not found"
                )
            tspec = template.get("spec") or {}
            generated = (
                f"{name}-{claim_name}-{generated_suffix(pod['metadata']['uid'] + claim_name)}"
            )
            tmeta = tspec.get("metadata") or {}
            claim: JSON = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": generated,
                    "namespace": namespace,
                    "uid": stable_uid("ResourceClaim", namespace, generated),
                    "labels": dict(tmeta.get("labels") or {}),
                    "annotations": {
                        **dict(tmeta.get("annotations") or {}),
                        POD_CLAIM_NAME_ANNOTATION: claim_name,
                    },
                    "ownerReferences": [_owned_by_pod(pod)],
                },
                "spec": codec.copy(tspec.get("spec") or {}),
            }
            if not claim["metadata"]["labels"]:
                del claim["metadata"]["labels"]
            out.append((claim_name, claim))
            created.append(claim)
        return out, created

    def _place(self, engine: DecisionEngine, pod: JSON) -> None:
        namespace, name = ns_name(pod)
        pod_key = f"{namespace}/{name}"
        try:
            entries, created = self._pod_claims(pod)
            models = [ResourceClaim.from_api(raw) for _, raw in entries]
        except ManifestError as exc:
            self.result.unschedulable.append(PodFailure(pod=pod_key, reason=str(exc)))
            return
        for claim in self._ephemeral_claims(pod):
            engine.observe_volume("PersistentVolumeClaim", self.reading.volume_key(claim)[1], claim)
        started = time.perf_counter()
        decision = engine.decide(pod, models)
        elapsed = time.perf_counter() - started
        self.result.durations.append(elapsed)
        self.result.decision_seconds += elapsed
        if isinstance(decision, (Unschedulable, PodError)):
            self.result.unschedulable.append(PodFailure(pod=pod_key, reason=decision.message))
            if isinstance(decision, Unschedulable):
                self._preemption(engine, pod, pod_key, models)
            return
        engine.assume(decision, pod)
        self._record(pod, decision, entries, created)
        self._bind_volumes(engine, decision)

    def _ephemeral_claims(self, pod: JSON) -> list[JSON]:
        """The claims the ephemeral volume controller creates for the pod's generic ephemeral
        volumes and does not find: ``<pod>-<volume>`` with the template's metadata and spec,
        owned (controller) by the pod."""
        namespace, name = ns_name(pod)
        out: list[JSON] = []
        for volume in (pod.get("spec") or {}).get("volumes") or ():
            ephemeral = volume.get("ephemeral") if isinstance(volume, Mapping) else None
            if not isinstance(ephemeral, Mapping):
                continue
            template = ephemeral.get("volumeClaimTemplate") or {}
            claim_name = f"{name}-{volume.get('name')}"
            meta = codec.copy(dict(template.get("metadata") or {}))
            meta.update(
                name=claim_name,
                namespace=namespace,
                ownerReferences=[_owned_by_pod(pod)],
            )
            claim: JSON = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": meta,
                "spec": codec.copy(dict(template.get("spec") or {})),
                "status": {"phase": "Pending"},
            }
            if self.reading.volume_key(claim) not in self.volumes:
                out.append(self.reading.add_volume_object(claim))
        return out

    def _bind_volumes(self, engine: DecisionEngine, placement: Placement) -> None:
        """What the controller writes for the placement's volumes before the pod's binding:
        each chosen PV's ``claimRef``, each claim to provision its selected node. A PV bind is
        then completed as the PV controller completes it before the controller binds the pod
        (the claim's ``volumeName``, both ``Bound``), and the engine sees that, as the
        controller's does: a claim bound to a CSI volume counts under the PV's driver."""
        if placement.volumes is None:
            return
        for claim_key, pv_name in placement.volumes.bind:
            claim = self.volumes[("PersistentVolumeClaim", claim_key)]
            namespace, _, name = claim_key.partition("/")
            volume = self.volumes[("PersistentVolume", pv_name)]
            volume.setdefault("spec", {})["claimRef"] = {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": namespace,
                "name": name,
                "uid": claim["metadata"]["uid"],
            }
            volume["status"] = {"phase": "Bound"}
            claim.setdefault("spec", {})["volumeName"] = pv_name
            claim["metadata"]["annotations"] = {
                **(claim["metadata"].get("annotations") or {}),
                ANN_BIND_COMPLETED: "yes",
                ANN_BOUND_BY_CONTROLLER: "yes",
            }
            claim["status"] = {"phase": "Bound"}
            engine.observe_volume("PersistentVolume", pv_name, volume)
            engine.observe_volume("PersistentVolumeClaim", claim_key, claim)
            self.touched_volumes += [
                ("PersistentVolumeClaim", claim_key),
                ("PersistentVolume", pv_name),
            ]
        for claim_key in placement.volumes.provision:
            key = ("PersistentVolumeClaim", claim_key)
            meta = self.volumes[key]["metadata"]
            meta["annotations"] = {
                **(meta.get("annotations") or {}),
                ANN_SELECTED_NODE: placement.node,
            }
            self.touched_volumes.append(key)

    def _preemption(
        self, engine: DecisionEngine, pod: JSON, pod_key: str, models: list[ResourceClaim]
    ) -> None:
        """Report which running pods ``pod`` would preempt (the engine's dry run); nothing is
        evicted or nominated, so the pods after it see the cluster unchanged."""
        found = engine.preempt(pod, models, self.budgets)
        if isinstance(found, Preemption):
            self.result.preemptions.append(
                PodPreemption(
                    pod=pod_key,
                    node=found.node,
                    victims=tuple(f"{v.namespace}/{v.name}" for v in found.victims),
                    violations=found.violations,
                )
            )

    def _record(
        self,
        pod: JSON,
        placement: Placement,
        entries: list[tuple[str, JSON]],
        created: list[JSON],
    ) -> None:
        namespace, name = ns_name(pod)
        uid = pod["metadata"]["uid"]
        consumer = {"resource": "pods", "name": name, "uid": uid}
        allocations = {claim.key: allocation for claim, allocation in placement.claims}
        for raw in created:
            self.claims[(namespace, str(raw["metadata"]["name"]))] = raw
        devices: list[JSON] = []
        for _, raw in entries:
            key = (str(raw["metadata"]["namespace"]), str(raw["metadata"]["name"]))
            status = raw.setdefault("status", {})
            allocation = allocations.get(f"{key[0]}/{key[1]}")
            if allocation is not None:
                status["allocation"] = allocation.to_api()
            reserved = status.setdefault("reservedFor", [])
            if consumer not in reserved:
                reserved.append(consumer)
            self.touched.append(key)
            current = status.get("allocation")
            if current:  # this pod's allocation, or the one it shares
                devices.extend(
                    self._device_rows(key[1], AllocationResult.from_api(current, key[1]))
                )
        out_pod = codec.copy(pod)
        out_pod.setdefault("spec", {})["nodeName"] = placement.node
        status = out_pod.setdefault("status", {})
        if entries:
            status["resourceClaimStatuses"] = [
                {"name": claim_name, "resourceClaimName": raw["metadata"]["name"]}
                for claim_name, raw in entries
            ]
        if placement.bridge is not None and placement.bridge_allocation is not None:
            claim_name = f"{name}-extended-resources-{generated_suffix(uid + '/extended')}"
            bridge = codec.copy(placement.bridge.claim)
            bridge["metadata"] = {
                "name": claim_name,
                **bridge["metadata"],
                "uid": stable_uid("ResourceClaim", namespace, claim_name),
            }
            bridge["status"] = {
                "allocation": placement.bridge_allocation.to_api(),
                "reservedFor": [consumer],
            }
            key = (namespace, claim_name)
            self.claims[key] = bridge
            self.touched.append(key)
            status["extendedResourceClaimStatus"] = placement.bridge.pod_status(claim_name)
            devices.extend(self._device_rows(claim_name, placement.bridge_allocation))
        self.placed_pods.append(out_pod)
        self.result.placements.append(
            PodPlacement(
                pod=f"{namespace}/{name}",
                node=placement.node,
                devices=tuple(devices),
                policies=placement.policies,
            )
        )

    def _device_rows(self, claim_name: str, allocation: AllocationResult) -> list[JSON]:
        rows = []
        for r in allocation.results:
            row: JSON = {
                "claim": claim_name,
                "request": r.request,
                "device": r.device,
                "uuid": self._uuids.get((r.driver, r.pool, r.device), ""),
            }
            if r.admin_access:
                row["adminAccess"] = True
            if r.consumed_capacity is not None:
                row["consumedCapacity"] = {
                    k: str(v) for k, v in sorted(r.consumed_capacity.items())
                }
            rows.append(row)
        return rows


def _owned_by_pod(pod: Mapping[str, Any]) -> JSON:
    """The controller owner reference a claim created for ``pod`` carries."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": ns_name(pod)[1],
        "uid": pod["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def simulate(
    objects: Sequence[Mapping[str, Any]],
    *,
    default_classes: Sequence[Mapping[str, Any]] = (),
    defaults: PolicyDefaults | None = None,
    scheduler_name: str = DEFAULT_SCHEDULER,
    base_dirs: Sequence[Path | None] | None = None,
    spreading: DefaultSpreading | None = None,
    admission: AdmissionScope | None = None,
) -> SimulationResult:
    """Run the simulation (see the module docstring). ``base_dirs`` gives, per object, the
    folder of the file it came from (an inventory's profile paths are relative to it);
    ``spreading``: the default topology spread constraints (kube-scheduler's System defaults
    unless given, as the controller's); ``admission``: the chart's admission step's scope, to
    apply it to the pods being created (:mod:`biaxial.simulate.admission`). Raises
    ManifestError for bad input for the run; everything about single pods is reported in the
    result."""
    return _Run(
        objects,
        default_classes,
        defaults or PolicyDefaults(),
        scheduler_name,
        base_dirs,
        spreading=spreading,
        admission=admission,
    ).run()


def project_deviceclasses() -> list[JSON]:
    """The project's DeviceClasses (:func:`project_deviceclasses_dir`), which ``biaxial
    simulate`` and ``biaxial allocate`` load before their input's own (the input's win by
    name)."""
    from biaxial.simulate.manifests import load_objects  # noqa: PLC0415 - only for the CLI

    directory = project_deviceclasses_dir()
    paths = [str(p) for p in sorted(directory.iterdir()) if p.suffix in (".yaml", ".yml")]
    return [o for o in load_objects(paths) if o.get("kind") == "DeviceClass"]


def project_deviceclasses_dir() -> Path:
    """The project's ``deviceclasses/`` (loaded by default by ``biaxial simulate``): the
    source tree's when running from a checkout, else the copy a wheel installs under
    ``<prefix>/share/biaxial/deviceclasses``. Raises ManifestError when neither exists."""
    candidates = (
        Path(__file__).resolve().parents[2] / "deviceclasses",
        Path(sys.prefix) / "share" / "biaxial" / "deviceclasses",
    )
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise ManifestError(
        "the project's DeviceClasses were not found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); pass DeviceClass manifests as PATH or use --no-default-classes"
    )


__all__ = [
    "INVENTORY_API_VERSION",
    "GpuUsage",
    "PartitionUsage",
    "PodFailure",
    "PodPlacement",
    "SimulationResult",
    "build_inventory",
    "check_pod_object",
    "expand_deployment",
    "project_deviceclasses_dir",
    "simulate",
]

"""Which kinds ``biaxial simulate`` reads, skips or refuses: one table, extended as the
simulator learns more of the cluster.

* :data:`READ`: the kinds that make the simulated cluster, each with the role the simulator
  gives it (:class:`Role`) and the apiVersion it reads (``resource.k8s.io`` objects arrive as
  v1, converted by :mod:`biaxial.simulate.convert`);
* :data:`SKIPPED`: kinds that do not affect where a pod can run (ConfigMaps, RBAC,
  ...): left out with one summary note;
* :data:`NOT_YET`: kinds that affect scheduling but are not modelled yet (quota, ...): an
  error, because placements computed without them could be
  wrong. The scheduler rules that honour them move their kinds to :data:`READ`.

Any other kind is an error too. :func:`classify` gives an object's :class:`KindSpec` or raises
:class:`~driver.api.errors.ManifestError` with the reason. Pure.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from driver.api.errors import ManifestError

Role = Literal[
    "inventory",
    "namespace",
    "node",
    "slice",
    "class",
    "claim",
    "template",
    "pod",
    "workload",
    "service",
    "priorityclass",
    "budget",
    "volume",
    "skip",
]


@dataclass(frozen=True, slots=True)
class KindSpec:
    """How the simulator treats one kind."""

    role: Role
    api_version: str  # the version read ("" for skipped kinds: any)
    namespaced: bool


READ: Final[Mapping[str, KindSpec]] = {
    "Cluster": KindSpec("inventory", "biaxial.dev/v1alpha1", namespaced=False),
    "Namespace": KindSpec("namespace", "v1", namespaced=False),
    "Node": KindSpec("node", "v1", namespaced=False),
    "ResourceSlice": KindSpec("slice", "resource.k8s.io/v1", namespaced=False),
    "DeviceClass": KindSpec("class", "resource.k8s.io/v1", namespaced=False),
    "ResourceClaim": KindSpec("claim", "resource.k8s.io/v1", namespaced=True),
    "ResourceClaimTemplate": KindSpec("template", "resource.k8s.io/v1", namespaced=True),
    "Pod": KindSpec("pod", "v1", namespaced=True),
    "Service": KindSpec("service", "v1", namespaced=True),  # its selector: default spreading
    "Deployment": KindSpec("workload", "apps/v1", namespaced=True),
    "ReplicaSet": KindSpec("workload", "apps/v1", namespaced=True),
    "StatefulSet": KindSpec("workload", "apps/v1", namespaced=True),
    "DaemonSet": KindSpec("workload", "apps/v1", namespaced=True),
    "Job": KindSpec("workload", "batch/v1", namespaced=True),
    # spec.priority for pods without one, as the Priority admission plugin resolves it
    "PriorityClass": KindSpec("priorityclass", "scheduling.k8s.io/v1", namespaced=False),
    # which victims a preemption report avoids
    "PodDisruptionBudget": KindSpec("budget", "policy/v1", namespaced=True),
    # What kube-scheduler's volume rules read (driver.scheduling.volumes).
    "PersistentVolumeClaim": KindSpec("volume", "v1", namespaced=True),
    "PersistentVolume": KindSpec("volume", "v1", namespaced=False),
    "StorageClass": KindSpec("volume", "storage.k8s.io/v1", namespaced=False),
    "CSINode": KindSpec("volume", "storage.k8s.io/v1", namespaced=False),
    "CSIDriver": KindSpec("volume", "storage.k8s.io/v1", namespaced=False),
    "CSIStorageCapacity": KindSpec("volume", "storage.k8s.io/v1", namespaced=True),
    "VolumeAttachment": KindSpec("volume", "storage.k8s.io/v1", namespaced=False),
}

_NAMESPACED_SKIPPED: Final = (
    "ConfigMap",
    "Secret",
    "ServiceAccount",
    "Ingress",
    "NetworkPolicy",
    "Role",
    "RoleBinding",
    "Endpoints",
    "EndpointSlice",
    "Event",
    "Lease",
    "HorizontalPodAutoscaler",
    "ControllerRevision",
    "PodTemplate",
    "CronJob",
    # gang scheduling's side objects (KAI, Volcano, scheduler-plugins): each pod is placed
    # on its own
    "PodGroup",
)
_CLUSTER_SKIPPED: Final = (
    "ClusterRole",
    "ClusterRoleBinding",
    "IngressClass",
    "CustomResourceDefinition",
    "APIService",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "CertificateSigningRequest",
    "FlowSchema",
    "PriorityLevelConfiguration",
    "ComponentStatus",
    "Queue",  # KAI's and Volcano's queues: quota between teams, not placement
)
SKIPPED: Final[Mapping[str, KindSpec]] = {
    **{kind: KindSpec("skip", "", namespaced=True) for kind in _NAMESPACED_SKIPPED},
    **{kind: KindSpec("skip", "", namespaced=False) for kind in _CLUSTER_SKIPPED},
}

#: kind -> (why it is refused for now, whether it is namespaced)
NOT_YET: Final[Mapping[str, tuple[str, bool]]] = {
    "ResourceQuota": ("quota admission is not modelled yet", True),
    "LimitRange": ("LimitRange defaults for pod requests are not applied yet", True),
    "RuntimeClass": ("RuntimeClass pod overhead is not applied yet", False),
    "DeviceTaintRule": ("DeviceTaintRules (taints on devices) are not applied yet", False),
}


#: group -> kind -> what to give instead, for kinds other projects name like a read one
OTHER_GROUPS: Final[Mapping[str, Mapping[str, str]]] = {
    "batch.volcano.sh": {
        "Job": "give each task's template as a Deployment or Pods (schedulerName: biaxial)"
    },
}


def object_label(obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` for namespaced kinds, ``Kind name`` for cluster-scoped ones."""
    kind = str(obj.get("kind") or "object")
    raw_meta = obj.get("metadata")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    name = str(meta.get("name") or "<unnamed>")
    spec = READ.get(kind) or SKIPPED.get(kind)
    if spec is not None:
        namespaced = spec.namespaced
    elif kind in NOT_YET:
        namespaced = NOT_YET[kind][1]
    else:
        namespaced = bool(meta.get("namespace"))
    if not namespaced:
        return f"{kind} {name}"
    return f"{kind} {meta.get('namespace') or 'default'}/{name}"


def classify(obj: Mapping[str, Any]) -> KindSpec:
    """The object's :class:`KindSpec`; ManifestError for a kind the simulator cannot use."""
    kind = str(obj.get("kind"))
    api_version = str(obj.get("apiVersion"))
    spec = READ.get(kind)
    if spec is not None and kind not in OTHER_GROUPS.get(api_version.partition("/")[0], ()):
        if api_version != spec.api_version:
            raise ManifestError(
                f"{object_label(obj)}: apiVersion {api_version} is not read (use "
                f"{spec.api_version})"
            )
        return spec
    skipped = SKIPPED.get(kind)
    if skipped is not None:
        return skipped
    if kind in NOT_YET:
        raise ManifestError(
            f"{object_label(obj)}: {kind} affects scheduling and {NOT_YET[kind][0]}; leave "
            "it out to simulate without it"
        )
    if kind in OTHER_GROUPS.get(api_version.partition("/")[0], ()):
        raise ManifestError(
            f"{object_label(obj)}: {api_version} {kind} is not read; "
            f"{OTHER_GROUPS[api_version.partition('/')[0]][kind]}"
        )
    near = difflib.get_close_matches(kind, [*READ, *SKIPPED, *NOT_YET], n=1, cutoff=0.6)
    hint = f"did you mean {near[0]}?" if near else "docs/simulator.md lists the kinds read"
    raise ManifestError(f"{object_label(obj)}: unsupported kind {api_version} {kind} ({hint})")

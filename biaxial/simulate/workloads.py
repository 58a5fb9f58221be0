"""The workload kinds users annotate, turned into the pods their controllers would create.

=============  ==========================================================================
kind           pods
=============  ==========================================================================
Deployment     ``spec.replicas`` (default 1), named ``<deployment>-<n>``, owned by the
               ReplicaSet the Deployment controller would create
               (:func:`deployment_replicaset`: ``<deployment>-<pod-template-hash>``, its
               selector the Deployment's plus that label, which the pods carry)
ReplicaSet     ``spec.replicas`` (default 1), named ``<replicaset>-<n>``
StatefulSet    ``spec.replicas`` (default 1), ordinal names ``<statefulset>-<ordinal>``
               from ``spec.ordinals.start`` (default 0); each ``volumeClaimTemplates``
               entry becomes the pod's volume of that name, mounting the claim
               ``<template>-<pod>`` (:func:`statefulset_claims` makes the claims)
Job            ``min(parallelism, completions)`` (``parallelism`` default 1; none when
               ``suspend``), named ``<job>-<5 characters>`` (``Indexed``:
               ``<job>-<index>-<5 characters>`` with the completion-index annotation)
DaemonSet      one per node the DaemonSet controller would choose (the template's node
               selector and required node affinity, taints it tolerates with the
               tolerations the controller adds), pinned to that node with the node
               affinity the controller writes, named ``<daemonset>-<5 characters>``
=============  ==========================================================================

Pods that already exist and belong to the workload (the controller owner reference, by uid or
by kind and name; for a Deployment, through its ReplicaSets) count: only the missing pods are
created (a StatefulSet's existing ordinals are kept). Suffixes are derived from the pod's
identity, so runs are reproducible. Each pod carries the template's metadata and spec and a
controller owner reference. Raises :class:`~driver.api.errors.ManifestError` naming the
workload. Pure: inputs are never mutated.
"""

from __future__ import annotations

import copy
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

from driver.api.errors import BiaxialError, ManifestError
from driver.api.labels import label_selector_matches
from driver.api.nodes import Node, node_selector_matches
from driver.scheduling.nodefit import PodSchedulingFacts, PodToleration, untolerated_taint

JSON = dict[str, Any]
_UID_NAMESPACE: Final = uuid.UUID("2b0f5c3e-6f0a-5d61-8c2e-9a4b7d1e3f50")
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # upstream's generateName alphabet
JOB_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"
#: What the DaemonSet controller adds to every daemon pod (pkg/controller/daemon/util).
DAEMON_TOLERATIONS: Final = (
    PodToleration(key="node.kubernetes.io/not-ready", operator="Exists", effect="NoExecute"),
    PodToleration(key="node.kubernetes.io/unreachable", operator="Exists", effect="NoExecute"),
    PodToleration(key="node.kubernetes.io/disk-pressure", operator="Exists", effect="NoSchedule"),
    PodToleration(key="node.kubernetes.io/memory-pressure", operator="Exists", effect="NoSchedule"),
    PodToleration(key="node.kubernetes.io/pid-pressure", operator="Exists", effect="NoSchedule"),
    PodToleration(key="node.kubernetes.io/unschedulable", operator="Exists", effect="NoSchedule"),
)
_NETWORK_TOLERATION: Final = PodToleration(
    key="node.kubernetes.io/network-unavailable", operator="Exists", effect="NoSchedule"
)


def stable_uid(kind: str, namespace: str, name: str) -> str:
    return str(uuid.uuid5(_UID_NAMESPACE, f"{kind}/{namespace}/{name}"))


def generated_suffix(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_NAME_ALPHABET[b % len(_NAME_ALPHABET)] for b in digest[:5])


def ns_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def _controller(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def owned_by(pod: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    """Whether ``owner`` is the pod's controller (by uid when both have one, else by kind and
    name in the pod's namespace)."""
    ref = _controller(pod)
    if ref is None or ns_name(pod)[0] != ns_name(owner)[0]:
        return False
    owner_uid = (owner.get("metadata") or {}).get("uid")
    if owner_uid and ref.get("uid"):
        return bool(ref.get("uid") == owner_uid)
    return bool(ref.get("kind") == owner.get("kind") and ref.get("name") == ns_name(owner)[1])


def _int(spec: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = spec.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"{where}: spec.{key} must be a non-negative integer")
    return value


def _template(workload: Mapping[str, Any], where: str) -> tuple[JSON, JSON]:
    spec = workload.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ManifestError(f"{where}: spec must be an object")
    template = spec.get("template")
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise ManifestError(f"{where}: spec.template.spec is required")
    meta = template.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise ManifestError(f"{where}: spec.template.metadata must be an object")
    return dict(meta), dict(template["spec"])


def _pod(workload: Mapping[str, Any], name: str, meta: JSON, spec: JSON) -> JSON:
    namespace, owner = ns_name(workload)
    kind = str(workload.get("kind"))
    out_meta = copy.deepcopy(meta)
    out_meta["name"] = name
    out_meta["namespace"] = namespace
    out_meta["ownerReferences"] = [
        {
            "apiVersion": str(workload.get("apiVersion")),
            "kind": kind,
            "name": owner,
            "uid": str(
                (workload.get("metadata") or {}).get("uid") or stable_uid(kind, namespace, owner)
            ),
            "controller": True,
        }
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": out_meta, "spec": copy.deepcopy(spec)}


def _numbered(
    workload: Mapping[str, Any], count: int, existing: Sequence[Mapping[str, Any]], where: str
) -> list[JSON]:
    """``<name>-<n>`` pods up to ``count``, the existing ones counted first."""
    meta, spec = _template(workload, where)
    name = ns_name(workload)[1]
    taken = {ns_name(p)[1] for p in existing}
    out: list[JSON] = []
    n = 0
    while len(out) + len(existing) < count:
        candidate = f"{name}-{n}"
        n += 1
        if candidate not in taken:
            out.append(_pod(workload, candidate, meta, spec))
    return out


POD_TEMPLATE_HASH: Final = "pod-template-hash"


def _template_hash(deployment: Mapping[str, Any]) -> str:
    """A stand-in for the Deployment controller's pod-template-hash: derived from the
    template, so a changed template gets another ReplicaSet (10 characters, its alphabet)."""
    template = (deployment.get("spec") or {}).get("template") or {}
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(_NAME_ALPHABET[b % len(_NAME_ALPHABET)] for b in digest[:10])


def deployment_replicaset(deployment: Mapping[str, Any]) -> tuple[str, JSON]:
    """The name and ``spec.selector`` of the ReplicaSet the Deployment controller creates for
    the Deployment's template: ``<deployment>-<pod-template-hash>``, the Deployment's selector
    plus ``pod-template-hash`` in ``matchLabels``."""
    _, name = ns_name(deployment)
    template_hash = _template_hash(deployment)
    selector = copy.deepcopy((deployment.get("spec") or {}).get("selector") or {})
    if not isinstance(selector, dict):
        selector = {}
    match_labels = dict(selector.get("matchLabels") or {})
    match_labels[POD_TEMPLATE_HASH] = template_hash
    selector["matchLabels"] = match_labels
    return f"{name}-{template_hash}", selector


def expand_deployment(
    deployment: Mapping[str, Any], existing: Sequence[Mapping[str, Any]] = ()
) -> list[JSON]:
    """A Deployment's (or ReplicaSet's) missing pods, ``<name>-<n>``; a Deployment's are
    owned by its ReplicaSet (:func:`deployment_replicaset`)."""
    namespace, name = ns_name(deployment)
    where = f"{deployment.get('kind', 'Deployment')} {namespace}/{name}"
    if not name:
        raise ManifestError(f"{deployment.get('kind', 'Deployment')} without metadata.name")
    replicas = _int(deployment.get("spec") or {}, "replicas", 1, where)
    pods = _numbered(deployment, replicas, existing, where)
    if deployment.get("kind", "Deployment") == "Deployment":
        rs_name, _ = deployment_replicaset(deployment)
        template_hash = rs_name.removeprefix(f"{name}-")
        for pod in pods:
            meta = pod["metadata"]
            meta.setdefault("labels", {})[POD_TEMPLATE_HASH] = template_hash
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": rs_name,
                    "uid": stable_uid("ReplicaSet", namespace, rs_name),
                    "controller": True,
                }
            ]
    return pods


def expand_statefulset(
    statefulset: Mapping[str, Any], existing: Sequence[Mapping[str, Any]] = ()
) -> list[JSON]:
    namespace, name = ns_name(statefulset)
    where = f"StatefulSet {namespace}/{name}"
    spec = statefulset.get("spec") or {}
    replicas = _int(spec, "replicas", 1, where)
    ordinals = spec.get("ordinals") or {}
    start = _int(ordinals if isinstance(ordinals, Mapping) else {}, "start", 0, where)
    meta, pod_spec = _template(statefulset, where)
    templates = _claim_templates(statefulset, where)
    taken = {ns_name(p)[1] for p in existing}
    out = []
    for ordinal in range(start, start + replicas):
        pod_name = f"{name}-{ordinal}"
        if pod_name in taken:
            continue
        pod = _pod(statefulset, pod_name, meta, pod_spec)
        if templates:
            # updateStorage: a volume per claim template first, then the template's other
            # volumes (one of the same name is replaced).
            claimed = [
                {"name": t, "persistentVolumeClaim": {"claimName": f"{t}-{pod_name}"}}
                for t in templates
            ]
            others = [v for v in pod["spec"].get("volumes") or () if v.get("name") not in templates]
            pod["spec"]["volumes"] = claimed + others
        out.append(pod)
    return out


def _claim_templates(statefulset: Mapping[str, Any], where: str) -> dict[str, Mapping[str, Any]]:
    """``spec.volumeClaimTemplates`` by name."""
    out: dict[str, Mapping[str, Any]] = {}
    for i, template in enumerate((statefulset.get("spec") or {}).get("volumeClaimTemplates") or ()):
        name = ((template or {}).get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{where}: spec.volumeClaimTemplates[{i}].metadata.name: required")
        if name in out:
            raise ManifestError(
                f"{where}: spec.volumeClaimTemplates[{i}].metadata.name: duplicate {name!r}"
            )
        out[name] = template
    return out


def statefulset_claims(statefulset: Mapping[str, Any], pod_name: str) -> list[JSON]:
    """The PersistentVolumeClaims the StatefulSet controller creates for its pod ``pod_name``
    (``getPersistentVolumeClaims``): ``<template>-<pod>`` per ``volumeClaimTemplates`` entry,
    in the set's namespace, with the template's labels plus the set selector's
    ``matchLabels``, and the template's spec."""
    namespace, name = ns_name(statefulset)
    where = f"StatefulSet {namespace}/{name}"
    selector = (statefulset.get("spec") or {}).get("selector") or {}
    match = dict(selector.get("matchLabels") or {}) if isinstance(selector, Mapping) else {}
    out: list[JSON] = []
    for template_name, template in _claim_templates(statefulset, where).items():
        claim_name = f"{template_name}-{pod_name}"
        meta = copy.deepcopy(dict(template.get("metadata") or {}))
        meta.update(
            name=claim_name,
            namespace=namespace,
            uid=stable_uid("PersistentVolumeClaim", namespace, claim_name),
            labels={**(meta.get("labels") or {}), **match},
        )
        if not meta["labels"]:
            del meta["labels"]
        out.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": meta,
                "spec": copy.deepcopy(dict(template.get("spec") or {})),
                "status": {"phase": "Pending"},
            }
        )
    return out


def expand_job(job: Mapping[str, Any], existing: Sequence[Mapping[str, Any]] = ()) -> list[JSON]:
    namespace, name = ns_name(job)
    where = f"Job {namespace}/{name}"
    spec = job.get("spec") or {}
    if spec.get("suspend"):
        return []
    parallelism = _int(spec, "parallelism", 1, where)
    completions = spec.get("completions")
    count = parallelism
    if completions is not None:
        count = min(parallelism, _int(spec, "completions", 1, where))
    meta, pod_spec = _template(job, where)
    indexed = spec.get("completionMode") == "Indexed"
    out: list[JSON] = []
    for index in range(len(existing), count):
        seed = f"{namespace}/{name}/{index}"
        if indexed:
            pod_meta = copy.deepcopy(meta)
            pod_meta.setdefault("annotations", {})[JOB_INDEX_ANNOTATION] = str(index)
            pod_name = f"{name}-{index}-{generated_suffix(seed)}"
            out.append(_pod(job, pod_name, pod_meta, pod_spec))
        else:
            out.append(_pod(job, f"{name}-{generated_suffix(seed)}", meta, pod_spec))
    return out


def _daemon_runs_on(facts: PodSchedulingFacts, node: Node, where: str) -> bool:
    if any(node.labels.get(k) != v for k, v in facts.node_selector.items()):
        return False
    if facts.required_affinity is not None and not node_selector_matches(
        facts.required_affinity, node, where
    ):
        return False
    return untolerated_taint(facts, node) is None


def expand_daemonset(
    daemonset: Mapping[str, Any],
    nodes: Sequence[Node],
    existing: Sequence[Mapping[str, Any]] = (),
) -> list[JSON]:
    """One pod per node the DaemonSet controller would run it on, pinned to that node."""
    namespace, name = ns_name(daemonset)
    where = f"DaemonSet {namespace}/{name}"
    meta, spec = _template(daemonset, where)
    probe = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    try:
        facts = PodSchedulingFacts.from_pod(probe)
    except BiaxialError as exc:
        raise ManifestError(f"{where}: {exc}") from exc
    extra = [*DAEMON_TOLERATIONS]
    if spec.get("hostNetwork"):
        extra.append(_NETWORK_TOLERATION)
    tolerating = PodSchedulingFacts(
        name=facts.name,
        node_selector=facts.node_selector,
        required_affinity=facts.required_affinity,
        tolerations=(*facts.tolerations, *extra),
        requests=facts.requests,
    )
    covered = {str((p.get("spec") or {}).get("nodeName") or "") for p in existing}
    covered |= {_pinned_node(p) for p in existing}
    out: list[JSON] = []
    for node in sorted(nodes, key=lambda n: n.name):
        if node.name in covered or not _daemon_runs_on(tolerating, node, where):
            continue
        pod_spec = copy.deepcopy(spec)
        pod_spec["tolerations"] = [
            *(pod_spec.get("tolerations") or []),
            *({"key": t.key, "operator": t.operator, "effect": t.effect} for t in extra),
        ]
        affinity = pod_spec.setdefault("affinity", {})
        node_affinity = affinity.setdefault("nodeAffinity", {})
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
            ]
        }
        pod_name = f"{name}-{generated_suffix(f'{namespace}/{name}/{node.name}')}"
        out.append(_pod(daemonset, pod_name, meta, pod_spec))
    return out


def _pinned_node(pod: Mapping[str, Any]) -> str:
    required = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                values = field.get("values") or []
                if len(values) == 1:
                    return str(values[0])
    return ""


def requested_pods(workload: Mapping[str, Any]) -> int:
    """How many pods the workload asks for at most (``replicas``, a Job's ``parallelism``; 0
    for a DaemonSet, bounded by the nodes), read before any is made; 0 for a value the
    expansion refuses with its own message."""
    spec = workload.get("spec") or {}
    if not isinstance(spec, Mapping):
        return 0
    key = {"Deployment": "replicas", "ReplicaSet": "replicas", "StatefulSet": "replicas"}.get(
        str(workload.get("kind")), "parallelism" if workload.get("kind") == "Job" else ""
    )
    value = spec.get(key, 1) if key else 0
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _check_selector(workload: Mapping[str, Any]) -> None:
    """The API server's rule for apps/v1 workloads (ValidateDeploymentSpec and its twins): the
    ``spec.selector`` given selects the template's labels. (A workload without a selector is
    read as selecting its template, as the short examples people write assume.)"""
    namespace, name = ns_name(workload)
    where = f"{workload.get('kind')} {namespace}/{name}"
    spec = workload.get("spec") or {}
    selector = spec.get("selector") if isinstance(spec, Mapping) else None
    if not isinstance(selector, Mapping) or not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    ):
        return
    meta, _ = _template(workload, where)
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping) or not label_selector_matches(
        selector, {str(k): str(v) for k, v in labels.items()}, f"{where}: spec.selector"
    ):
        raise ManifestError(
            f"{where}: spec.selector does not match spec.template.metadata.labels; make the "
            "template carry the labels the selector asks for"
        )


def expand(
    workload: Mapping[str, Any], nodes: Sequence[Node], existing: Sequence[Mapping[str, Any]]
) -> list[JSON]:
    """The missing pods of any workload kind (see the module table)."""
    kind = workload.get("kind")
    if kind == "Job":
        return expand_job(workload, existing)
    if kind in ("Deployment", "ReplicaSet"):
        pods = expand_deployment(workload, existing)
    elif kind == "StatefulSet":
        pods = expand_statefulset(workload, existing)
    elif kind == "DaemonSet":
        pods = expand_daemonset(workload, nodes, existing)
    else:
        raise ManifestError(f"{kind}: not a workload kind")
    _check_selector(workload)  # after the spec's own checks, which name their fields
    return pods

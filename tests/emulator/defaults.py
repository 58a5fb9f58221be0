"""Server-side defaulting and create-time preparation, per kind (raw JSON, pure functions).

Mirrors what the real API server adds on create so that clients see the same objects: pod
``schedulerName``/``restartPolicy``/container defaults and the initial ``status`` (phase
Pending, QoS class), namespace ``kubernetes.io/metadata.name`` label, ``spec.finalizers`` and
phase, ResourceClaim ``allocationMode``/``count`` defaults (claims and templates),
PersistentVolumeClaim and PersistentVolume ``volumeMode`` (and a PV's reclaim policy) and
their initial ``status.phase: Pending``, StorageClass ``reclaimPolicy`` and
``volumeBindingMode``. Each function takes an object and returns a new one.
"""

from __future__ import annotations

from typing import Any

from kubeapi import codec
from tests.emulator.kinds import Kind


def _default_exact(req: dict[str, Any]) -> None:
    req.setdefault("allocationMode", "ExactCount")
    if req["allocationMode"] == "ExactCount":
        req.setdefault("count", 1)
    for toleration in req.get("tolerations") or []:
        if isinstance(toleration, dict):
            toleration.setdefault("operator", "Equal")


def default_claim_spec(spec: Any) -> None:
    if not isinstance(spec, dict):
        return
    for request in (spec.get("devices") or {}).get("requests") or []:
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            _default_exact(request["exactly"])
        for sub in request.get("firstAvailable") or []:
            if isinstance(sub, dict):
                _default_exact(sub)


def _image_pull_policy(image: str) -> str:
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail:
        return "IfNotPresent"
    if ":" not in tail or tail.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def _qos_class(spec: dict[str, Any]) -> str:
    containers = [
        c
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
        if isinstance(c, dict)
    ]
    requests_seen = limits_seen = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        requests = {
            k: v for k, v in (resources.get("requests") or {}).items() if k in {"cpu", "memory"}
        }
        limits = {
            k: v for k, v in (resources.get("limits") or {}).items() if k in {"cpu", "memory"}
        }
        requests_seen = requests_seen or bool(requests)
        limits_seen = limits_seen or bool(limits)
        effective_requests = {**limits, **requests}
        if set(limits) != {"cpu", "memory"} or effective_requests != limits:
            guaranteed = False
    if not requests_seen and not limits_seen:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _default_containers(containers: Any) -> None:
    for container in containers or []:
        if not isinstance(container, dict):
            continue
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", _image_pull_policy(str(container.get("image", ""))))
        container.setdefault("resources", {})
        resources = container["resources"]
        if (
            isinstance(resources, dict)
            and resources.get("limits")
            and not resources.get("requests")
        ):
            resources["requests"] = dict(resources["limits"])


def prepare_for_create(kind: Kind, obj: dict[str, Any], *, copy: bool = True) -> dict[str, Any]:
    """Apply defaults and the create-time status rules; returns a new object (``copy``
    False: ``obj`` itself, changed in place, for a caller that owns it)."""
    out = codec.copy(obj) if copy else obj
    if kind.kind == "Pod":
        spec = out.setdefault("spec", {})
        if isinstance(spec, dict):
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("securityContext", {})
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("enableServiceLinks", True)
            spec.setdefault("priority", 0)
            spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
            _default_containers(spec.get("containers"))
            _default_containers(spec.get("initContainers"))
            out["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
    elif kind.kind == "Namespace":
        name = (out.get("metadata") or {}).get("name")
        meta = out.setdefault("metadata", {})
        labels = meta.setdefault("labels", {}) if isinstance(meta, dict) else {}
        if isinstance(labels, dict) and isinstance(name, str):
            labels["kubernetes.io/metadata.name"] = name
        out["spec"] = {"finalizers": ["kubernetes"]}
        out["status"] = {"phase": "Active"}
    elif kind.kind == "ResourceClaim":
        out.pop("status", None)
        default_claim_spec(out.get("spec"))
    elif kind.kind == "ResourceClaimTemplate":
        default_claim_spec((out.get("spec") or {}).get("spec"))
    elif kind.kind in ("PersistentVolumeClaim", "PersistentVolume"):
        _default_volume(kind, out)
        out["status"] = {"phase": "Pending"}
    elif kind.kind == "StorageClass":
        _default_storage_class(out)
    return out


def _default_volume(kind: Kind, obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if isinstance(spec, dict):
        spec.setdefault("volumeMode", "Filesystem")
        if kind.kind == "PersistentVolume":
            spec.setdefault("persistentVolumeReclaimPolicy", "Retain")


def _default_storage_class(obj: dict[str, Any]) -> None:
    obj.setdefault("reclaimPolicy", "Delete")
    obj.setdefault("volumeBindingMode", "Immediate")


def apply_update_defaults(kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
    """Defaults that also apply to updates (so that an unchanged spec compares equal)."""
    if kind.kind == "ResourceClaim":
        out = codec.copy(obj)
        default_claim_spec(out.get("spec"))
        return out
    if kind.kind == "ResourceClaimTemplate":
        out = codec.copy(obj)
        default_claim_spec((out.get("spec") or {}).get("spec"))
        return out
    if kind.kind == "Pod":
        out = codec.copy(obj)
        spec = out.get("spec")
        if isinstance(spec, dict):
            _default_containers(spec.get("containers"))
            _default_containers(spec.get("initContainers"))
        return out
    if kind.kind in ("PersistentVolumeClaim", "PersistentVolume"):
        out = codec.copy(obj)
        _default_volume(kind, out)
        return out
    if kind.kind == "StorageClass":
        out = codec.copy(obj)
        _default_storage_class(out)
        return out
    return obj

"""A builder for pods that carry the rules between pods, and for the clusters they run on.

Every builder produces raw API JSON (what the API server serves)::

    pod("web-0").labels(app="web").anti(HOSTNAME, app="web").gpu().json()
    pod("db").labels(app="db").on("n1").json()           # a running pod (spec.nodeName)
    zoned_node("n0", zone="a", gpus=2)                    # (node JSON, its ResourceSlice)
"""

from __future__ import annotations

import copy
from typing import Any

from tests.unit.builders import gpu, node, slice_

JSON = dict[str, Any]
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def selector(**labels: str) -> JSON:
    return {"matchLabels": dict(labels)}


def _term(
    key: str,
    labels: dict[str, str],
    *,
    label_selector: JSON | None = None,
    namespaces: list[str] | None = None,
    namespace_selector: JSON | None = None,
    match_keys: tuple[str, ...] = (),
    mismatch_keys: tuple[str, ...] = (),
) -> JSON:
    term: JSON = {"topologyKey": key}
    if label_selector is not None:
        term["labelSelector"] = label_selector
    elif labels:
        term["labelSelector"] = selector(**labels)
    if namespaces is not None:
        term["namespaces"] = namespaces
    if namespace_selector is not None:
        term["namespaceSelector"] = namespace_selector
    if match_keys:
        term["matchLabelKeys"] = list(match_keys)
    if mismatch_keys:
        term["mismatchLabelKeys"] = list(mismatch_keys)
    return term


class PodBuilder:
    """Fluent pod JSON builder; ``.json()`` gives a fresh dict each time."""

    def __init__(self, name: str, namespace: str) -> None:
        self._meta: JSON = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
        self._container: JSON = {"name": "c", "image": "busybox"}
        self._spec: JSON = {"schedulerName": "biaxial", "containers": [self._container]}

    def labels(self, **labels: str) -> PodBuilder:
        self._meta.setdefault("labels", {}).update(labels)
        return self

    def annotate(self, **annotations: str) -> PodBuilder:
        self._meta.setdefault("annotations", {}).update(annotations)
        return self

    def policy(self, node: str | None = None, gpu_policy: str | None = None) -> PodBuilder:
        annotations = self._meta.setdefault("annotations", {})
        if node:
            annotations["biaxial.dev/node-policy"] = node
        if gpu_policy:
            annotations["biaxial.dev/gpu-policy"] = gpu_policy
        return self

    def _pod_rules(self, section: str, kind: str) -> list[JSON]:
        affinity = self._spec.setdefault("affinity", {}).setdefault(section, {})
        return affinity.setdefault(kind, [])  # type: ignore[no-any-return]

    def affinity(self, key: str, *, weight: int | None = None, **options: Any) -> PodBuilder:
        """Required pod affinity (``weight``: preferred) to pods with the keyword labels."""
        return self._add("podAffinity", key, weight, options)

    def anti(self, key: str, *, weight: int | None = None, **options: Any) -> PodBuilder:
        """Required pod anti-affinity (``weight``: preferred) to pods with the labels."""
        return self._add("podAntiAffinity", key, weight, options)

    def _add(
        self, section: str, key: str, weight: int | None, options: dict[str, Any]
    ) -> PodBuilder:
        named = {
            k: options.pop(k)
            for k in (
                "label_selector",
                "namespaces",
                "namespace_selector",
                "match_keys",
                "mismatch_keys",
            )
            if k in options
        }
        term = _term(key, options, **named)
        if weight is None:
            self._pod_rules(section, "requiredDuringSchedulingIgnoredDuringExecution").append(term)
        else:
            self._pod_rules(section, "preferredDuringSchedulingIgnoredDuringExecution").append(
                {"weight": weight, "podAffinityTerm": term}
            )
        return self

    def spread(
        self,
        key: str,
        max_skew: int = 1,
        *,
        when: str = "DoNotSchedule",
        min_domains: int | None = None,
        affinity_policy: str | None = None,
        taints_policy: str | None = None,
        match_keys: tuple[str, ...] = (),
        label_selector: JSON | None = None,
        **labels: str,
    ) -> PodBuilder:
        constraint: JSON = {"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": when}
        if label_selector is not None:
            constraint["labelSelector"] = label_selector
        elif labels:
            constraint["labelSelector"] = selector(**labels)
        if min_domains is not None:
            constraint["minDomains"] = min_domains
        if affinity_policy:
            constraint["nodeAffinityPolicy"] = affinity_policy
        if taints_policy:
            constraint["nodeTaintsPolicy"] = taints_policy
        if match_keys:
            constraint["matchLabelKeys"] = list(match_keys)
        self._spec.setdefault("topologySpreadConstraints", []).append(constraint)
        return self

    def port(
        self, host_port: int, *, protocol: str | None = None, ip: str | None = None
    ) -> PodBuilder:
        entry: JSON = {"containerPort": host_port, "hostPort": host_port}
        if protocol:
            entry["protocol"] = protocol
        if ip:
            entry["hostIP"] = ip
        self._container.setdefault("ports", []).append(entry)
        return self

    def sidecar_port(self, host_port: int) -> PodBuilder:
        self._spec.setdefault("initContainers", []).append(
            {
                "name": f"sidecar-{host_port}",
                "image": "busybox",
                "restartPolicy": "Always",
                "ports": [{"containerPort": host_port, "hostPort": host_port}],
            }
        )
        return self

    def requests(self, **amounts: str) -> PodBuilder:
        self._container.setdefault("resources", {}).setdefault("requests", {}).update(amounts)
        return self

    def pod_resources(
        self, requests: dict[str, str] | None = None, limits: dict[str, str] | None = None
    ) -> PodBuilder:
        resources: JSON = {}
        if requests:
            resources["requests"] = dict(requests)
        if limits:
            resources["limits"] = dict(limits)
        self._spec["resources"] = resources
        return self

    def gpu(self, count: int = 1, gpumem: int | None = None) -> PodBuilder:
        """Legacy GPU resources (the KEP-5004 bridge serves them)."""
        limits = self._container.setdefault("resources", {}).setdefault("limits", {})
        limits["nvidia.com/gpu"] = count
        if gpumem is not None:
            limits["nvidia.com/gpumem"] = str(gpumem)
        return self

    def node_selector(self, **labels: str) -> PodBuilder:
        self._spec.setdefault("nodeSelector", {}).update(labels)
        return self

    def prefer_node(self, weight: int, key: str, *values: str) -> PodBuilder:
        affinity = self._spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
            {
                "weight": weight,
                "preference": {
                    "matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]
                },
            }
        )
        return self

    def tolerate(self, key: str, effect: str = "", operator: str = "Exists") -> PodBuilder:
        toleration: JSON = {"key": key, "operator": operator}
        if effect:
            toleration["effect"] = effect
        self._spec.setdefault("tolerations", []).append(toleration)
        return self

    def owned(self, kind: str, name: str, api_version: str = "apps/v1") -> PodBuilder:
        self._meta["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": name,
                "uid": f"uid-{kind}-{name}",
                "controller": True,
            }
        ]
        return self

    def on(self, node_name: str) -> PodBuilder:
        self._spec["nodeName"] = node_name
        return self

    def scheduler(self, name: str) -> PodBuilder:
        self._spec["schedulerName"] = name
        return self

    def terminating(self) -> PodBuilder:
        self._meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return self

    def json(self) -> JSON:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": copy.deepcopy(self._meta),
            "spec": copy.deepcopy(self._spec),
        }


def pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


def zoned_node(
    name: str,
    zone: str | None = None,
    *,
    gpus: int = 2,
    memory: str = "16Gi",
    labels: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[JSON, JSON]:
    """A node with ``gpus`` shareable GPUs, its hostname label and (unless None) a zone."""
    all_labels = dict(labels or {})
    if zone is not None:
        all_labels[ZONE] = zone
    devices = [gpu(i, memory=memory, shared=True) for i in range(gpus)]
    return node(name, labels=all_labels, **kwargs), slice_(
        f"{name}-slice", node=name, devices=devices
    )

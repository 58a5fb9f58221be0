"""KEP-5004 extended-resource bridge: legacy ``nvidia.com/gpu`` pods served by DRA.

Given a pod's raw JSON and the DeviceClasses' extended-resource names, this module builds the
special ResourceClaim exactly as upstream kube-scheduler does (dra-api.md §4):

* ``metadata.generateName: <pod>-extended-resources-``, the pod's namespace, the annotation
  ``resource.kubernetes.io/extended-resource-claim: "true"`` and the Pod as controller owner;
* ``spec.devices.requests`` only: one request per (container, DRA-backed resource), named
  ``container-<i>-request-<j>`` with ``i`` the index in ``initContainers ++ containers`` and
  ``j`` the index of the resource in the sorted keys of that container's requests (cpu and
  memory included), ``exactly{deviceClassName, allocationMode: ExactCount, count}``, the
  requests sorted by name;
* init containers: a non-sidecar init container first reuses the requests of later long-lived
  containers (regular containers and sidecars), and only the largest remaining short-lived
  request is kept, the other init mappings pointing to it;
* ``pod.status.extendedResourceClaimStatus`` = ``{resourceClaimName, requestMappings}``.

biaxial's one addition: the HAMi resources ``nvidia.com/gpumem`` (MiB per GPU),
``nvidia.com/gpumem-percentage`` (percent of each GPU's memory) and ``nvidia.com/gpucores``
(percent of each GPU's compute) are not requests of their own. They modify the
``nvidia.com/gpu`` request of the same container and are folded into that request's
``capacity.requests`` as ``memory`` and ``cores``. (A reused long-lived request keeps the
capacity of the container that owns it, as upstream reuses the request as a whole.)

As the API server would, a resource given only under ``limits`` counts as requested (requests
default to limits), so manifests written for HAMi (``limits: {nvidia.com/gpu: 1}``) work as-is.

Conflicting or impossible combinations raise :class:`~driver.api.errors.ManifestError` with the
pod, container and resource named: gpumem or gpucores without gpu, a percentage outside
1..100 or given together with gpumem, gpucores outside 0..100, gpumem larger than every GPU in
the cluster, a GPU count that is not a whole number.

The per-node decision is upstream's: a resource is DRA-backed on a node only if the node's
``status.allocatable`` does not advertise it (> 0); there the device plugin path applies and
the bridge leaves it out. Everything here is pure and never mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from driver.api.errors import ManifestError, QuantityError
from driver.api.model import API_VERSION
from driver.api.quantity import Quantity

JSON = dict[str, Any]

EXTENDED_RESOURCE_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPUMEM_RESOURCE: Final = "nvidia.com/gpumem"
GPUMEM_PERCENT_RESOURCE: Final = "nvidia.com/gpumem-percentage"
GPUCORES_RESOURCE: Final = "nvidia.com/gpucores"
MODIFIER_RESOURCES: Final = frozenset({GPUMEM_RESOURCE, GPUMEM_PERCENT_RESOURCE, GPUCORES_RESOURCE})
LEGACY_RESOURCES: Final = frozenset({GPU_RESOURCE}) | MODIFIER_RESOURCES
_MAX_EXTENDED_NAME_PART: Final = 63
MIB: Final = 1024 * 1024


class DeviceClassLike(Protocol):
    """What the bridge needs from a DeviceClass (``driver.api.claims.DeviceClass`` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def extended_resource_name(self) -> str | None: ...
    @property
    def creation_timestamp(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ExtendedResourceMap:
    """Extended-resource name -> DeviceClass name, as upstream's extendedresourcecache.

    Explicit ``extendedResourceName`` entries: the newest ``creationTimestamp`` wins, on a tie
    the lexicographically lower class name. Every class also answers to its implicit name
    ``deviceclass.resource.kubernetes.io/<class>`` when that is a valid extended-resource name.
    """

    classes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_classes(cls, classes: Iterable[DeviceClassLike]) -> ExtendedResourceMap:
        best: dict[str, DeviceClassLike] = {}
        mapping: dict[str, str] = {}
        for dc in sorted(classes, key=lambda c: c.name):
            if len(dc.name) <= _MAX_EXTENDED_NAME_PART:
                mapping[IMPLICIT_PREFIX + dc.name] = dc.name
            name = dc.extended_resource_name
            if not name:
                continue
            current = best.get(name)
            # Sorted by name, so on equal timestamps the first (lower) name stays.
            if current is None or (dc.creation_timestamp or "") > (
                current.creation_timestamp or ""
            ):
                best[name] = dc
        for name, dc in best.items():
            mapping[name] = dc.name
        return cls(classes=mapping)

    def class_for(self, resource: str) -> str | None:
        return self.classes.get(resource)


@dataclass(frozen=True, slots=True)
class LegacyRequest:
    """One DRA-backed extended resource of one container, with its HAMi modifiers."""

    container_index: int  # index in initContainers ++ containers
    container_name: str
    resource: str
    request_index: int  # index in the container's sorted request keys
    count: int
    memory_mib: int | None = None
    memory_percent: int | None = None
    cores: int | None = None

    @property
    def request_name(self) -> str:
        return f"container-{self.container_index}-request-{self.request_index}"


@dataclass(frozen=True, slots=True)
class PodLegacyResources:
    """What a pod asks for through extended resources, parsed and validated once per pod."""

    pod_name: str
    requests: tuple[LegacyRequest, ...]
    long_lived: frozenset[int]  # container indices of regular containers and sidecars

    @property
    def resources(self) -> frozenset[str]:
        return frozenset(r.resource for r in self.requests)

    @property
    def max_memory_mib(self) -> int:
        return max((r.memory_mib or 0 for r in self.requests), default=0)

    def total(self, resource: str) -> int:
        """The pod's effective demand for ``resource`` (init containers overlap: max)."""
        long = sum(
            r.count
            for r in self.requests
            if r.resource == resource and r.container_index in self.long_lived
        )
        short = max(
            (
                r.count
                for r in self.requests
                if r.resource == resource and r.container_index not in self.long_lived
            ),
            default=0,
        )
        return max(long, short)


@dataclass(frozen=True, slots=True)
class BridgeClaim:
    """The special claim (``metadata.name`` unset: the API server generates it) and the
    request mappings for ``pod.status.extendedResourceClaimStatus``."""

    claim: JSON
    request_mappings: tuple[JSON, ...]

    def pod_status(self, claim_name: str) -> JSON:
        return {
            "resourceClaimName": claim_name,
            "requestMappings": [dict(m) for m in self.request_mappings],
        }


def _effective_requests(container: Mapping[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ManifestError(f"container {container.get('name')!r}: resources must be an object")
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        raise ManifestError(
            f"container {container.get('name')!r}: resources.limits/requests must be objects"
        )
    merged = dict(limits)
    merged.update(requests)
    return merged


def _containers(pod: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], int]:
    spec = pod.get("spec") or {}
    init = list(spec.get("initContainers") or ())
    regular = list(spec.get("containers") or ())
    return init + regular, len(init)


def _whole(value: Any, where: str, *, minimum: int, maximum: int | None = None) -> int:
    try:
        quantity = Quantity.of(value)
    except QuantityError as exc:
        raise ManifestError(f"{where}: {exc}") from exc
    if not quantity.is_integer():
        raise ManifestError(f"{where}: {quantity} is not a whole number")
    number = quantity.as_integer()
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ManifestError(f"{where}: {number} is out of range (must be {bound})")
    return number


def pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '<unnamed>'}"


def legacy_resources(
    pod: Mapping[str, Any],
    resource_map: ExtendedResourceMap,
    *,
    max_gpu_memory_bytes: int | None = None,
) -> PodLegacyResources:
    """Parse and validate the pod's DRA-backed extended resources (all nodes alike).

    ``max_gpu_memory_bytes`` is the largest GPU memory in the cluster; a ``gpumem`` above it
    can never be satisfied and is an error for the pod. Raises :class:`ManifestError`.
    """
    name = pod_name(pod)
    containers, n_init = _containers(pod)
    out: list[LegacyRequest] = []
    long_lived: set[int] = set()
    for index, container in enumerate(containers):
        if not isinstance(container, Mapping):
            raise ManifestError(f"pod {name}: container {index} is not an object")
        cname = str(container.get("name") or f"#{index}")
        is_sidecar = container.get("restartPolicy") == "Always"
        if index >= n_init or is_sidecar:
            long_lived.add(index)
        where = f"pod {name} container {cname}"
        requests = _effective_requests(container)
        keys = sorted(requests)
        modifiers = {k: requests[k] for k in MODIFIER_RESOURCES if k in requests}
        gpu_count: int | None = None
        if GPU_RESOURCE in requests:
            gpu_count = _whole(requests[GPU_RESOURCE], f"{where} {GPU_RESOURCE}", minimum=0)
        if modifiers and not gpu_count:
            listed = ", ".join(sorted(modifiers))
            raise ManifestError(f"{where}: {listed} given without {GPU_RESOURCE}")
        memory_mib = memory_percent = cores = None
        if GPUMEM_RESOURCE in modifiers:
            memory_mib = _whole(modifiers[GPUMEM_RESOURCE], f"{where} {GPUMEM_RESOURCE}", minimum=1)
            if max_gpu_memory_bytes is not None and memory_mib * MIB > max_gpu_memory_bytes:
                raise ManifestError(
                    f"{where}: {GPUMEM_RESOURCE} {memory_mib} MiB is larger than every GPU in "
                    f"the cluster (largest: {max_gpu_memory_bytes // MIB} MiB)"
                )
        if GPUMEM_PERCENT_RESOURCE in modifiers:
            if memory_mib is not None:
                raise ManifestError(
                    f"{where}: {GPUMEM_RESOURCE} and {GPUMEM_PERCENT_RESOURCE} are exclusive"
                )
            memory_percent = _whole(
                modifiers[GPUMEM_PERCENT_RESOURCE],
                f"{where} {GPUMEM_PERCENT_RESOURCE}",
                minimum=1,
                maximum=100,
            )
        if GPUCORES_RESOURCE in modifiers:
            cores = _whole(
                modifiers[GPUCORES_RESOURCE], f"{where} {GPUCORES_RESOURCE}", minimum=0, maximum=100
            )
        for resource in keys:
            if resource in MODIFIER_RESOURCES or resource_map.class_for(resource) is None:
                continue
            if resource == GPU_RESOURCE:
                count = gpu_count or 0
            else:
                count = _whole(requests[resource], f"{where} {resource}", minimum=0)
            if count == 0:
                continue
            is_gpu = resource == GPU_RESOURCE
            out.append(
                LegacyRequest(
                    container_index=index,
                    container_name=cname,
                    resource=resource,
                    request_index=keys.index(resource),
                    count=count,
                    memory_mib=memory_mib if is_gpu else None,
                    memory_percent=memory_percent if is_gpu else None,
                    cores=cores if is_gpu else None,
                )
            )
    return PodLegacyResources(pod_name=name, requests=tuple(out), long_lived=frozenset(long_lived))


def _device_request(
    req: LegacyRequest, count: int, class_name: str, gpu_memory_bytes: int | None
) -> JSON:
    exactly: JSON = {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": count}
    capacity: dict[str, str] = {}
    if req.memory_mib is not None:
        capacity["memory"] = f"{req.memory_mib}Mi"
    elif req.memory_percent is not None:
        if gpu_memory_bytes is None:
            raise ManifestError(
                f"{GPUMEM_PERCENT_RESOURCE} needs the GPU memory size of the node to resolve"
            )
        capacity["memory"] = f"{gpu_memory_bytes * req.memory_percent // 100 // MIB}Mi"
    if req.cores is not None:
        capacity["cores"] = str(req.cores)
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": req.request_name, "exactly": exactly}


def build_bridge_claim(
    pod: Mapping[str, Any],
    parsed: PodLegacyResources,
    resource_map: ExtendedResourceMap,
    *,
    dra_resources: Collection[str] | None = None,
    gpu_memory_bytes: int | None = None,
) -> BridgeClaim | None:
    """The special claim for one node, or None when the pod needs none there.

    ``dra_resources`` are the resources served by DRA on this node (those the node's
    allocatable does not advertise); None means all of them. ``gpu_memory_bytes`` resolves
    ``gpumem-percentage`` for this node's GPUs.
    """
    meta = pod.get("metadata") or {}
    requests: list[JSON] = []
    mappings: list[JSON] = []
    for resource in sorted(parsed.resources):
        if dra_resources is not None and resource not in dra_resources:
            continue
        class_name = resource_map.class_for(resource)
        if class_name is None:  # pragma: no cover - legacy_resources only keeps mapped ones
            continue
        by_container = {r.container_index: r for r in parsed.requests if r.resource == resource}
        long_requests: dict[int, JSON] = {}
        for index in sorted(i for i in by_container if i in parsed.long_lived):
            req = by_container[index]
            long_requests[index] = _device_request(req, req.count, class_name, gpu_memory_bytes)
            mappings.append(_mapping(req.container_name, resource, req.request_name))
        short_mappings: list[JSON] = []
        short_names: set[str] = set()
        largest: JSON | None = None
        for index in sorted(i for i in by_container if i not in parsed.long_lived):
            req = by_container[index]
            reused = 0
            satisfied = False
            for later in sorted(i for i in long_requests if i >= index):
                reusable = long_requests[later]
                reused += int(reusable["exactly"]["count"])
                short_mappings.append(_mapping(req.container_name, resource, reusable["name"]))
                if reused >= req.count:
                    satisfied = True
                    break
            if satisfied:
                continue
            own = _device_request(req, req.count - reused, class_name, gpu_memory_bytes)
            short_names.add(own["name"])
            if largest is None or int(largest["exactly"]["count"]) < int(own["exactly"]["count"]):
                largest = own
            short_mappings.append(_mapping(req.container_name, resource, own["name"]))
        if largest is not None and len(short_names) > 1:
            short_names.discard(largest["name"])
            for mapping in short_mappings:
                if mapping["requestName"] in short_names:
                    mapping["requestName"] = largest["name"]
        if largest is not None:
            requests.append(largest)
        requests.extend(long_requests.values())
        mappings.extend(short_mappings)
    if not requests:
        return None
    requests.sort(key=lambda r: str(r["name"]))
    pod_meta_name = str(meta.get("name") or "")
    claim: JSON = {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod_meta_name}-extended-resources-",
            "namespace": meta.get("namespace") or "default",
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_meta_name,
                    "uid": str(meta.get("uid") or ""),
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": {"requests": requests}},
    }
    return BridgeClaim(claim=claim, request_mappings=tuple(mappings))


def _mapping(container: str, resource: str, request: str) -> JSON:
    return {"containerName": container, "resourceName": resource, "requestName": request}


def dra_resources_on_node(
    resources: Iterable[str], allocatable: Mapping[str, Quantity]
) -> frozenset[str]:
    """The resources served by DRA on a node: those its allocatable does not advertise."""
    return frozenset(r for r in resources if (q := allocatable.get(r)) is None or q.sign() <= 0)


def is_bridge_claim(claim: Mapping[str, Any], pod_name_: str, pod_uid: str) -> bool:
    """True for the special claim of this pod (annotation plus controller owner)."""
    meta = claim.get("metadata") or {}
    if (meta.get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) != "true":
        return False
    return any(
        o.get("controller") and o.get("name") == pod_name_ and o.get("uid") == pod_uid
        for o in meta.get("ownerReferences") or ()
    )


def bridge_claim_owner(claim: Mapping[str, Any]) -> str | None:
    """The UID of the pod whose special claim this is (the annotation plus a controlling Pod
    owner); None for any other claim."""
    meta = claim.get("metadata") or {}
    if (meta.get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) != "true":
        return None
    for owner in meta.get("ownerReferences") or ():
        if owner.get("controller") and owner.get("kind") == "Pod":
            return str(owner.get("uid"))
    return None

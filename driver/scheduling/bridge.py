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

biaxial's additions, the dialects of the schedulers users migrate from:

* the HAMi resources ``nvidia.com/gpumem`` (MiB per GPU), ``nvidia.com/gpumem-percentage``
  (percent of each GPU's memory) and ``nvidia.com/gpucores`` (percent of each GPU's compute)
  are not requests of their own. They modify the ``nvidia.com/gpu`` request of the same
  container and are folded into that request's ``capacity.requests`` as ``memory`` and
  ``cores``. (A reused long-lived request keeps the capacity of the container that owns it,
  as upstream reuses the request as a whole.)
* Volcano's vGPU resources are the same family under other names: ``volcano.sh/vgpu-number``
  (GPUs; served by the class that serves ``nvidia.com/gpu`` unless a class names it),
  ``volcano.sh/vgpu-memory``, ``volcano.sh/vgpu-memory-percentage``, ``volcano.sh/vgpu-cores``.
  One container uses one family.
* the pod's dialect annotations (:mod:`driver.scheduling.dialects`) shape every GPU request
  (a request of either family): GPU type and UUID filters become request ``selectors``,
  ``numa-bind`` a ``matchAttribute`` constraint on ``resource.kubernetes.io/numaNode`` for each
  request of two or more GPUs, ``vgpu-mode`` ``hami-core`` / ``mps`` a ``GpuConfig`` entry in
  ``spec.devices.config`` for those requests, ``vgpu-mode`` ``mig`` a request of the MIG class
  with selectors on the partition's memory and cores, and KAI's ``gpu-fraction`` /
  ``gpu-memory`` the memory share of the target container's GPU request. So
  ``kubectl get resourceclaim -o yaml`` shows why a GPU was chosen.

As the API server would, a resource given only under ``limits`` counts as requested (requests
default to limits), so manifests written for HAMi (``limits: {nvidia.com/gpu: 1}``) work as-is.

Conflicting or impossible combinations raise :class:`~driver.api.errors.ManifestError` with the
pod, container and resource named: gpumem or gpucores without gpu, a percentage outside
1..100 or given together with gpumem, gpucores outside 0..100, gpumem larger than every GPU in
the cluster (with a hint when the value carries a unit: gpumem is MiB), a GPU count that is
not a whole number or too large, both families in one container, dialect annotations on a pod
without GPU requests, a KAI target container without a GPU request.

The per-node decision is upstream's: a resource is DRA-backed on a node only if the node's
``status.allocatable`` does not advertise it (> 0); there the device plugin path applies and
the bridge leaves it out. Everything here is pure and never mutates its inputs;
:class:`BridgeMemo` keeps what it parsed and built for pods of one shape (one Deployment's) and
gives each later pod its own copy, named for it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Final, Protocol

from driver.api.claims import ResourceClaim
from driver.api.config import API_VERSION as GPU_CONFIG_API_VERSION
from driver.api.config import KIND as GPU_CONFIG_KIND
from driver.api.errors import ManifestError, QuantityError
from driver.api.ids import DEFAULT_DRIVER_NAME
from driver.api.model import API_VERSION, json_copy
from driver.api.quantity import NANO, Quantity
from driver.api.records import builder
from driver.scheduling.dialects import (
    NUMA_ATTRIBUTE,
    VGPU_MODE,
    VOLCANO_VGPU_MODE,
    KaiShare,
    PodHints,
    mig_selectors,
    pod_hints,
)

JSON = dict[str, Any]

EXTENDED_RESOURCE_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
GPU_RESOURCE: Final = "nvidia.com/gpu"
GPUMEM_RESOURCE: Final = "nvidia.com/gpumem"
GPUMEM_PERCENT_RESOURCE: Final = "nvidia.com/gpumem-percentage"
GPUCORES_RESOURCE: Final = "nvidia.com/gpucores"
VOLCANO_NUMBER_RESOURCE: Final = "volcano.sh/vgpu-number"
VOLCANO_MEMORY_RESOURCE: Final = "volcano.sh/vgpu-memory"
VOLCANO_PERCENT_RESOURCE: Final = "volcano.sh/vgpu-memory-percentage"
VOLCANO_CORES_RESOURCE: Final = "volcano.sh/vgpu-cores"
MIG_CLASS: Final = "mig.biaxial.dev"
_MAX_EXTENDED_NAME_PART: Final = 63
_INT64_MAX: Final = 2**63 - 1
MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ResourceFamily:
    """A GPU count resource and the resources that modify it (one dialect's names)."""

    dialect: str
    count: str
    memory: str
    percent: str
    cores: str

    @property
    def modifiers(self) -> frozenset[str]:
        return frozenset({self.memory, self.percent, self.cores})


HAMI: Final = ResourceFamily(
    "HAMi", GPU_RESOURCE, GPUMEM_RESOURCE, GPUMEM_PERCENT_RESOURCE, GPUCORES_RESOURCE
)
VOLCANO: Final = ResourceFamily(
    "Volcano",
    VOLCANO_NUMBER_RESOURCE,
    VOLCANO_MEMORY_RESOURCE,
    VOLCANO_PERCENT_RESOURCE,
    VOLCANO_CORES_RESOURCE,
)
FAMILIES: Final = (HAMI, VOLCANO)
COUNT_RESOURCES: Final = frozenset(f.count for f in FAMILIES)
MODIFIER_RESOURCES: Final = frozenset().union(*(f.modifiers for f in FAMILIES))
LEGACY_RESOURCES: Final = COUNT_RESOURCES | MODIFIER_RESOURCES


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
    Volcano's ``volcano.sh/vgpu-number`` is served by the class of ``nvidia.com/gpu`` unless a
    class names it. ``class_names`` holds every class.
    """

    classes: Mapping[str, str] = field(default_factory=dict)
    class_names: frozenset[str] = frozenset()

    @classmethod
    def from_classes(cls, classes: Iterable[DeviceClassLike]) -> ExtendedResourceMap:
        best: dict[str, DeviceClassLike] = {}
        mapping: dict[str, str] = {}
        names: set[str] = set()
        for dc in sorted(classes, key=lambda c: c.name):
            names.add(dc.name)
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
        if GPU_RESOURCE in mapping:
            mapping.setdefault(VOLCANO_NUMBER_RESOURCE, mapping[GPU_RESOURCE])
        return cls(classes=mapping, class_names=frozenset(names))

    def class_for(self, resource: str) -> str | None:
        return self.classes.get(resource)


@dataclass(frozen=True, slots=True)
class LegacyRequest:
    """One DRA-backed extended resource of one container, with its modifiers and hints."""

    container_index: int  # index in initContainers ++ containers
    container_name: str
    resource: str
    request_index: int  # index in the container's sorted request keys
    count: int
    memory_mib: int | None = None
    memory_fraction: Fraction | None = None  # of each GPU's memory, resolved per node
    cores: int | None = None
    selectors: tuple[str, ...] = ()
    device_class: str | None = None  # instead of the resource's class (vgpu-mode mig)
    gpu: bool = False  # a GPU count request (dialect hints apply)

    @property
    def request_name(self) -> str:
        return f"container-{self.container_index}-request-{self.request_index}"


@dataclass(frozen=True, slots=True)
class PodLegacyResources:
    """What a pod asks for through extended resources, parsed and validated once per pod."""

    pod_name: str
    requests: tuple[LegacyRequest, ...]
    long_lived: frozenset[int]  # container indices of regular containers and sidecars
    hints: PodHints = field(default_factory=PodHints)

    def named(self, pod_name: str) -> PodLegacyResources:
        """The same demand for another pod of the same shape: what :func:`dataclasses.replace`
        gives, without its walk over the fields (once per pod, from :class:`BridgeMemo`)."""
        return _new_legacy_resources(pod_name, self.requests, self.long_lived, self.hints)

    @property
    def resources(self) -> frozenset[str]:
        return frozenset(r.resource for r in self.requests)

    @property
    def per_node_memory(self) -> bool:
        """Whether a request's memory share depends on the node's GPU memory (a percentage
        or a fraction): the bridge claim then differs per node."""
        return any(r.memory_fraction is not None for r in self.requests)

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


#: :meth:`PodLegacyResources.named`'s builder (:mod:`driver.api.records`).
_new_legacy_resources: Final = builder(PodLegacyResources)


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
    if quantity.nanos % NANO:
        raise ManifestError(f"{where}: {quantity} is not a whole number")
    if not quantity.is_integer():
        raise ManifestError(f"{where}: {quantity} is too large (at most {_INT64_MAX})")
    number = quantity.as_integer()
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ManifestError(f"{where}: {number} is out of range (must be {bound})")
    return number


def _unit_hint(resource: str, value: Any, mib: int) -> str:
    """For a MiB resource written with a unit (``4Gi``): say what it reads as, and what the
    user probably meant."""
    text = str(value).strip()
    if not isinstance(value, str) or not text or text.isdigit():
        return ""
    meant = max(1, Quantity.of(text).value() // MIB)
    return (
        f" ({resource} is a number of MiB, so {text} reads as {mib} MiB; for {text} write {meant})"
    )


def pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '<unnamed>'}"


def _family_of(requests: Mapping[str, Any], where: str) -> ResourceFamily | None:
    """The one resource family a container uses, if any (mixing families is an error)."""
    used = [f for f in FAMILIES if f.count in requests or f.modifiers & requests.keys()]
    if len(used) > 1:
        raise ManifestError(
            f"{where}: mixes HAMi ({GPU_RESOURCE}, ...) and Volcano "
            f"({VOLCANO_NUMBER_RESOURCE}, ...) resource names; use one family per container"
        )
    return used[0] if used else None


def _memory_mib(
    family: ResourceFamily, raw: Any, where: str, max_gpu_memory_bytes: int | None
) -> int:
    memory = _whole(raw, f"{where} {family.memory}", minimum=1)
    if max_gpu_memory_bytes is not None and memory * MIB > max_gpu_memory_bytes:
        raise ManifestError(
            f"{where}: {family.memory} {memory} MiB is larger than every GPU in "
            f"the cluster (largest: {max_gpu_memory_bytes // MIB} MiB)"
            + _unit_hint(family.memory, raw, memory)
        )
    return memory


@dataclass(frozen=True, slots=True)
class _GpuShare:
    """What one container's GPU resources (and a KAI annotation aimed at it) ask for."""

    count: int | None = None
    memory_mib: int | None = None
    memory_fraction: Fraction | None = None
    cores: int | None = None


def legacy_resources(
    pod: Mapping[str, Any],
    resource_map: ExtendedResourceMap,
    *,
    max_gpu_memory_bytes: int | None = None,
) -> PodLegacyResources:
    """Parse and validate the pod's DRA-backed extended resources and dialect annotations
    (all nodes alike).

    ``max_gpu_memory_bytes`` is the largest GPU memory in the cluster; a ``gpumem`` above it
    can never be satisfied and is an error for the pod. Raises :class:`ManifestError`.
    """
    name = pod_name(pod)
    hints = pod_hints(pod)
    containers, n_init = _containers(pod)
    out: list[LegacyRequest] = []
    long_lived: set[int] = set()
    mig = hints.mode == "mig"
    selectors = hints.selectors()
    if mig and MIG_CLASS not in resource_map.class_names:
        key = VGPU_MODE if VGPU_MODE in (hints.keys or {}) else VOLCANO_VGPU_MODE
        raise ManifestError(
            f"pod {name}: annotation {key}: mig needs the DeviceClass {MIG_CLASS}, "
            "which does not exist"
        )
    for index, container in enumerate(containers):
        if not isinstance(container, Mapping):
            raise ManifestError(f"pod {name}: container {index} is not an object")
        cname = str(container.get("name") or f"#{index}")
        if index >= n_init or container.get("restartPolicy") == "Always":
            long_lived.add(index)  # a regular container or a sidecar
        where = f"pod {name} container {cname}"
        requests = _effective_requests(container)
        family = _family_of(requests, where)
        share = _gpu_share(family, requests, where, max_gpu_memory_bytes)
        if hints.kai is not None and container.get("name") == hints.kai.container:
            share = _kai_share(hints.kai, family, share, where, max_gpu_memory_bytes)
        if mig and share.count and share.memory_fraction is not None:
            raise ManifestError(
                f"{where}: a memory percentage or fraction cannot choose a MIG partition "
                f"(vgpu-mode mig); give {GPUMEM_RESOURCE} in MiB"
            )
        keys = sorted(requests)
        for resource in keys:
            if resource in MODIFIER_RESOURCES or resource_map.class_for(resource) is None:
                continue
            is_gpu = family is not None and resource == family.count
            if is_gpu:
                count = share.count or 0
            else:
                count = _whole(requests[resource], f"{where} {resource}", minimum=0)
            if count == 0:
                continue
            out.append(
                LegacyRequest(
                    container_index=index,
                    container_name=cname,
                    resource=resource,
                    request_index=keys.index(resource),
                    count=count,
                    memory_mib=share.memory_mib if is_gpu and not mig else None,
                    memory_fraction=share.memory_fraction if is_gpu else None,
                    cores=share.cores if is_gpu and not mig else None,
                    selectors=(
                        (*selectors, *(mig_selectors(share.memory_mib, share.cores) if mig else ()))
                        if is_gpu
                        else ()
                    ),
                    device_class=MIG_CLASS if is_gpu and mig else None,
                    gpu=is_gpu,
                )
            )
    if hints.device_keys and not any(r.gpu for r in out):
        raise ManifestError(
            f"pod {name}: annotation {', '.join(hints.device_keys)}: shapes {GPU_RESOURCE} "
            f"(or {VOLCANO_NUMBER_RESOURCE}) requests, and the pod has none; for a "
            "ResourceClaim, write the same as a selector or config in the claim"
        )
    return PodLegacyResources(
        pod_name=name, requests=tuple(out), long_lived=frozenset(long_lived), hints=hints
    )


def _gpu_share(
    family: ResourceFamily | None,
    requests: Mapping[str, Any],
    where: str,
    max_gpu_memory_bytes: int | None,
) -> _GpuShare:
    """The GPU count and share one container's resources of ``family`` ask for."""
    if family is None:
        return _GpuShare()
    modifiers = {k: requests[k] for k in family.modifiers if k in requests}
    count = None
    if family.count in requests:
        count = _whole(requests[family.count], f"{where} {family.count}", minimum=0)
    if modifiers and not count:
        listed = ", ".join(sorted(modifiers))
        raise ManifestError(f"{where}: {listed} given without {family.count}")
    memory_mib = None
    if family.memory in modifiers:
        memory_mib = _memory_mib(family, modifiers[family.memory], where, max_gpu_memory_bytes)
    memory_fraction = None
    if family.percent in modifiers:
        if memory_mib is not None:
            raise ManifestError(f"{where}: {family.memory} and {family.percent} are exclusive")
        percent = _whole(
            modifiers[family.percent], f"{where} {family.percent}", minimum=1, maximum=100
        )
        memory_fraction = Fraction(percent, 100)
    cores = None
    if family.cores in modifiers:
        cores = _whole(modifiers[family.cores], f"{where} {family.cores}", minimum=0, maximum=100)
    return _GpuShare(count, memory_mib, memory_fraction, cores)


def _kai_share(
    kai: KaiShare,
    family: ResourceFamily | None,
    share: _GpuShare,
    where: str,
    max_gpu_memory_bytes: int | None,
) -> _GpuShare:
    """``share`` with the KAI annotations' share, for the container they name; the
    container must ask for the GPUs (the kubelet gives DRA devices only for a resource the
    container asks for) and give no share of its own."""
    what = ", ".join(kai.keys)
    if not share.count:
        devices = kai.devices or 1
        raise ManifestError(
            f"{where}: annotation {what}: add {GPU_RESOURCE}: {devices} to this "
            "container's resources.limits; the kubelet gives a container DRA devices "
            "only for an extended resource the container asks for, and biaxial makes "
            "that request the KAI share"
        )
    if kai.devices is not None and kai.devices != share.count:
        raise ManifestError(
            f"{where}: annotation gpu-fraction-num-devices is {kai.devices}, but the "
            f"container asks for {share.count} GPU(s); make them equal"
        )
    if share.memory_mib is not None or share.memory_fraction is not None:
        raise ManifestError(
            f"{where}: annotation {what} and a memory resource both give the share; keep one"
        )
    memory_mib = None
    if kai.memory_mib is not None:
        assert family is not None  # share.count is set: the family asked for GPUs
        memory_mib = _memory_mib(
            family, kai.memory_mib, f"{where} (annotation gpu-memory)", max_gpu_memory_bytes
        )
    return _GpuShare(share.count, memory_mib, kai.memory_fraction, share.cores)


def _device_request(
    req: LegacyRequest, count: int, class_name: str, gpu_memory_bytes: int | None
) -> JSON:
    exactly: JSON = {
        "deviceClassName": req.device_class or class_name,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if req.selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in req.selectors]
    capacity: dict[str, str] = {}
    if req.memory_mib is not None:
        capacity["memory"] = f"{req.memory_mib}Mi"
    elif req.memory_fraction is not None:
        if gpu_memory_bytes is None:
            raise ManifestError(
                "a memory percentage or fraction needs the GPU memory size of the node to resolve"
            )
        capacity["memory"] = f"{int(gpu_memory_bytes * req.memory_fraction) // MIB}Mi"
    if req.cores is not None:
        capacity["cores"] = str(req.cores)
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": req.request_name, "exactly": exactly}


def _hint_constraints_and_config(
    parsed: PodLegacyResources, requests: list[JSON], driver_name: str
) -> tuple[list[JSON], list[JSON]]:
    """The claim-level parts of the pod's hints: ``numa-bind`` constraints and the sharing
    strategy's ``GpuConfig``, for the GPU requests the claim holds."""
    gpu_names = {r.request_name for r in parsed.requests if r.gpu}
    held = [r for r in requests if r["name"] in gpu_names]
    constraints: list[JSON] = []
    if parsed.hints.numa_bind:
        constraints = [
            {"requests": [r["name"]], "matchAttribute": NUMA_ATTRIBUTE}
            for r in held
            if int(r["exactly"]["count"]) > 1
        ]
    config: list[JSON] = []
    strategy = parsed.hints.strategy
    if strategy is not None and held:
        config = [
            {
                "requests": [r["name"] for r in held],
                "opaque": {
                    "driver": driver_name,
                    "parameters": {
                        "apiVersion": GPU_CONFIG_API_VERSION,
                        "kind": GPU_CONFIG_KIND,
                        "sharing": {"strategy": strategy},
                    },
                },
            }
        ]
    return constraints, config


def build_bridge_claim(
    pod: Mapping[str, Any],
    parsed: PodLegacyResources,
    resource_map: ExtendedResourceMap,
    *,
    dra_resources: Collection[str] | None = None,
    gpu_memory_bytes: int | None = None,
    driver_name: str = DEFAULT_DRIVER_NAME,
) -> BridgeClaim | None:
    """The special claim for one node, or None when the pod needs none there.

    ``dra_resources`` are the resources served by DRA on this node (those the node's
    allocatable does not advertise); None means all of them. ``gpu_memory_bytes`` resolves
    percentages and fractions of memory for this node's GPUs. ``driver_name`` is whose
    ``GpuConfig`` a ``vgpu-mode`` becomes.
    """
    body = _bridge_body(parsed, resource_map, dra_resources, gpu_memory_bytes, driver_name)
    if body is None:
        return None
    devices, mappings = body
    return _bridge_object(pod, devices, mappings)


def bridge_shape(parsed: PodLegacyResources) -> tuple[object, ...]:
    """All :func:`build_bridge_claim` reads of ``parsed``: pods of one shape (one
    Deployment's) give equal keys and, on one node variant, the same claim up to names."""
    return (parsed.requests, parsed.long_lived, parsed.hints.numa_bind, parsed.hints.strategy)


def _bridge_body(
    parsed: PodLegacyResources,
    resource_map: ExtendedResourceMap,
    dra_resources: Collection[str] | None,
    gpu_memory_bytes: int | None,
    driver_name: str,
) -> tuple[JSON, tuple[JSON, ...]] | None:
    """The claim's ``spec.devices`` and the request mappings (what :func:`bridge_shape`
    decides), or None when the pod needs no claim on the node."""
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
    devices: JSON = {"requests": requests}
    constraints, config = _hint_constraints_and_config(parsed, requests, driver_name)
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return devices, tuple(mappings)


def _bridge_object(
    pod: Mapping[str, Any], devices: JSON, mappings: tuple[JSON, ...]
) -> BridgeClaim:
    """The pod's special claim around ``devices`` (taken as is, not copied)."""
    meta = pod.get("metadata") or {}
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
        "spec": {"devices": devices},
    }
    return BridgeClaim(claim=claim, request_mappings=mappings)


@dataclass(frozen=True, slots=True)
class _Template:
    """One shape's claim on one node variant: its ``spec.devices``, request mappings and
    checked model, copied for each pod."""

    body: bytes  # pickled (devices, mappings): one C call copies them
    model: ResourceClaim


class BridgeMemo:
    """The bridge claims of pods alike, built, parsed and checked once per pod shape and node
    variant (:func:`bridge_shape`, DRA-served resources, GPU memory); each pod gets its own
    copy of the JSON and its own model's metadata, so nothing a caller may change is shared.

    Valid for one ``resource_map`` and ``check`` (the DeviceClasses and driver): make a new
    one when they change. Only claims that passed ``check`` are kept, so a refusal is raised
    again, in its own pod's words, for every pod it concerns.
    """

    def __init__(
        self,
        resource_map: ExtendedResourceMap,
        driver_name: str,
        check: Callable[[ResourceClaim], None],
        *,
        limit: int = 4096,
    ) -> None:
        self._resource_map = resource_map
        self._driver_name = driver_name
        self._check = check
        self._limit = limit
        self._templates: dict[tuple[object, ...], _Template | None] = {}
        self._parsed: dict[tuple[object, ...], PodLegacyResources] = {}

    def resources(
        self, pod: Mapping[str, Any], *, max_gpu_memory_bytes: int | None
    ) -> PodLegacyResources:
        """:func:`legacy_resources` of the pod, parsed once per pod shape (:func:`_pod_shape`)
        and named for each pod; raising what it raises (refusals are not kept)."""
        key = _pod_shape(pod, max_gpu_memory_bytes)
        kept = self._parsed.get(key) if key is not None else None
        if kept is not None:
            return kept.named(pod_name(pod))
        parsed = legacy_resources(
            pod, self._resource_map, max_gpu_memory_bytes=max_gpu_memory_bytes
        )
        if key is not None:
            if len(self._parsed) >= self._limit:
                self._parsed.clear()
            self._parsed[key] = parsed
        return parsed

    def claim(
        self,
        pod: Mapping[str, Any],
        parsed: PodLegacyResources,
        *,
        dra_resources: frozenset[str],
        gpu_memory_bytes: int | None,
        name: str,
        uid: str,
    ) -> tuple[BridgeClaim, ResourceClaim] | None:
        """The pod's special claim on a node variant and its model (named ``name``, with
        ``uid``), or None when the pod needs none there; as :func:`build_bridge_claim` then
        :meth:`ResourceClaim.from_api` and ``check`` give, raising what they raise."""
        key = (bridge_shape(parsed), dra_resources, gpu_memory_bytes)
        if key in self._templates:
            kept = self._templates[key]
            if kept is None:
                return None
            body = pickle.loads(kept.body)  # noqa: S301 - bytes this memo pickled itself
            bridge = _bridge_object(pod, *body)
            meta = bridge.claim["metadata"]
            model = replace(
                kept.model,
                namespace=str(meta["namespace"]),
                uid=uid,
                annotations=dict(meta["annotations"]),
                labels={},
                owner_references=tuple(json_copy(o) for o in meta["ownerReferences"]),
            )
            return bridge, model
        body = _bridge_body(
            parsed, self._resource_map, dra_resources, gpu_memory_bytes, self._driver_name
        )
        if body is None:
            self._keep(key, None)
            return None
        devices, mappings = body
        kept_body = pickle.dumps((devices, mappings), pickle.HIGHEST_PROTOCOL)
        bridge = _bridge_object(pod, devices, mappings)
        raw = dict(bridge.claim)
        raw["metadata"] = {**raw["metadata"], "name": name, "uid": uid}
        model = ResourceClaim.from_api(raw)
        self._check(model)
        self._keep(key, _Template(kept_body, model))
        return bridge, model

    def _keep(self, key: tuple[object, ...], template: _Template | None) -> None:
        """Keep ``template`` (bounded: the memo is emptied when full)."""
        if len(self._templates) >= self._limit:
            self._templates.clear()
        self._templates[key] = template


def _pod_shape(
    pod: Mapping[str, Any], max_gpu_memory_bytes: int | None
) -> tuple[object, ...] | None:
    """All :func:`legacy_resources` reads of a pod but its name: the annotations and, per
    container, the name, restart policy and resources (each value with its type, as ``1`` and
    ``True`` are equal keys); None for input that is not plain JSON objects (parsed each time,
    so its refusal is raised)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    try:
        annotations = meta.get("annotations") or {}
        parts: list[object] = [max_gpu_memory_bytes, tuple(annotations.items())]
        for group in ("initContainers", "containers"):
            containers = []
            for container in spec.get(group) or ():
                resources = container.get("resources") or {}
                containers.append(
                    (
                        container.get("name"),
                        container.get("restartPolicy"),
                        *(
                            tuple((k, type(v), v) for k, v in (resources.get(part) or {}).items())
                            for part in ("limits", "requests")
                        ),
                    )
                )
            parts.append(tuple(containers))
        key = tuple(parts)
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


def filter_exempt(dra: Iterable[str], resources: Collection[str]) -> frozenset[str]:
    """What the node filter leaves to DRA: the DRA-served resources, plus the modifiers of
    every resource family whose count resource the pod asks for (they are not requests)."""
    exempt = set(dra)
    for family in FAMILIES:
        if family.count in resources:
            exempt |= family.modifiers
    return frozenset(exempt)


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

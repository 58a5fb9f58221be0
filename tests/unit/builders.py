"""Test builders for the allocator and everything that reads claims, slices, classes and nodes.

Every builder produces **raw API JSON dicts** (what the API server serves), which tests convert
with the models' ``from_api()``; the helpers at the bottom do that in one step (and
:func:`gpu_info` builds what discovery reports, the device table's input). Examples::

    claim("c0").request("r0", cls=GPU_CLASS, count=2).constraint(match=UUID_ATTR).json()
    slice_("s0", node="n0", devices=[gpu(0), gpu(1)])
    device("gpu-0", attrs={"index": 0, "productName": "Tesla T4"}, capacity={"memory": "16Gi"})
    node("n0", labels={"zone": "a"})

Attribute values are typed from Python: ``bool`` -> ``bool``, ``int`` -> ``int``, ``str`` ->
``string``, :func:`ver` -> ``version``, lists -> ``ints`` / ``bools`` / ``strings`` /
``versions``. A capacity is a quantity string, or :func:`cap` with a request policy.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from driver.api.claims import DeviceClass, ResourceClaim
from driver.api.model import ResourceSlice
from driver.api.nodes import Node
from driver.discovery.gpus import GpuInfo, MigInfo
from driver.structured.snapshot import ClusterSnapshot

JSON = dict[str, Any]

DRIVER = "gpu.biaxial.dev"
GPU_CLASS = "gpu.biaxial.dev"
MIG_CLASS = "mig.biaxial.dev"
UUID_ATTR = f"{DRIVER}/uuid"


@dataclass(frozen=True)
class ver:  # noqa: N801 - reads like the API's "version" keyword in tables
    """A ``version`` attribute value."""

    text: str


def _attribute(value: Any) -> JSON:
    if isinstance(value, ver):
        return {"version": value.text}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, str):
        return {"string": value}
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, ver):
            return {"versions": [v.text for v in value]}
        if isinstance(first, bool):
            return {"bools": list(value)}
        if isinstance(first, int):
            return {"ints": list(value)}
        return {"strings": list(value)}
    raise TypeError(f"unsupported attribute value {value!r}")


def cap(
    value: str,
    *,
    default: str | None = None,
    min: str | None = None,  # noqa: A002 - the API's field name
    max: str | None = None,  # noqa: A002
    step: str | None = None,
    values: Sequence[str] | None = None,
) -> JSON:
    """A ``DeviceCapacity`` with a request policy."""
    policy: JSON = {}
    if default is not None:
        policy["default"] = default
    if values is not None:
        policy["validValues"] = list(values)
    if min is not None:
        rng: JSON = {"min": min}
        if max is not None:
            rng["max"] = max
        if step is not None:
            rng["step"] = step
        policy["validRange"] = rng
    return {"value": value, "requestPolicy": policy}


def device(
    name: str,
    *,
    attrs: Mapping[str, Any] | None = None,
    capacity: Mapping[str, str | JSON] | None = None,
    multi: bool = False,
    taints: Sequence[JSON] = (),
    consumes: Mapping[str, Mapping[str, str]] | None = None,
    node_name: str | None = None,
    node_selector: JSON | None = None,
    all_nodes: bool = False,
    binds_to_node: bool = False,
    binding_conditions: Sequence[str] = (),
    binding_failure_conditions: Sequence[str] = (),
) -> JSON:
    """A ``Device`` (``consumes``: counter set -> counter -> value)."""
    out: JSON = {"name": name}
    if attrs:
        out["attributes"] = {k: _attribute(v) for k, v in attrs.items()}
    if capacity:
        out["capacity"] = {
            k: (dict(v) if isinstance(v, Mapping) else {"value": v}) for k, v in capacity.items()
        }
    if multi:
        out["allowMultipleAllocations"] = True
    if taints:
        out["taints"] = [dict(t) for t in taints]
    if consumes:
        out["consumesCounters"] = [
            {"counterSet": s, "counters": {k: {"value": v} for k, v in c.items()}}
            for s, c in consumes.items()
        ]
    if node_name:
        out["nodeName"] = node_name
    if node_selector is not None:
        out["nodeSelector"] = node_selector
    if all_nodes:
        out["allNodes"] = True
    if binds_to_node:
        out["bindsToNode"] = True
    if binding_conditions:
        out["bindingConditions"] = list(binding_conditions)
    if binding_failure_conditions:
        out["bindingFailureConditions"] = list(binding_failure_conditions)
    return out


def gpu(
    index: int,
    *,
    memory: str = "16Gi",
    product: str = "Tesla T4",
    numa: int | None = None,
    shared: bool = False,
    extra: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> JSON:
    """A biaxial-style GPU device ``gpu-<index>``; ``shared`` gives it consumable capacity
    with the DESIGN's policies (memory defaults to all of it in 1Mi steps, cores to 0)."""
    attrs: dict[str, Any] = {
        "type": "gpu",
        "index": index,
        "uuid": f"GPU-{index:08d}",
        "productName": product,
    }
    if numa is not None:
        attrs["resource.kubernetes.io/numaNode"] = numa
    attrs.update(extra or {})
    capacity: dict[str, str | JSON]
    if shared:
        capacity = {
            "memory": cap(memory, default=memory, min="1Mi", step="1Mi"),
            "cores": cap("100", default="0", min="0", step="1"),
        }
    else:
        capacity = {"memory": memory, "cores": "100"}
    return device(f"gpu-{index}", attrs=attrs, capacity=capacity, multi=shared, **kwargs)


def taint(key: str, effect: str = "NoSchedule", value: str = "") -> JSON:
    out: JSON = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    return out


def toleration(key: str = "", operator: str = "Equal", value: str = "", effect: str = "") -> JSON:
    out: JSON = {"operator": operator}
    if key:
        out["key"] = key
    if value:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def slice_(
    name: str,
    *,
    driver: str = DRIVER,
    pool: str | None = None,
    node: str | None = "node-0",
    devices: Sequence[JSON] = (),
    generation: int = 1,
    count: int = 1,
    all_nodes: bool = False,
    node_selector: JSON | None = None,
    per_device: bool = False,
    shared_counters: Mapping[str, Mapping[str, str]] | None = None,
    meta_generation: int = 1,
) -> JSON:
    """A ``ResourceSlice``; node-local to ``node`` unless another node selection is given.
    The pool defaults to the node name (or the slice name for cluster-wide slices)."""
    spec: JSON = {
        "driver": driver,
        "pool": {
            "name": pool
            or (node if node and not (all_nodes or node_selector or per_device) else name),
            "generation": generation,
            "resourceSliceCount": count,
        },
    }
    if all_nodes:
        spec["allNodes"] = True
    elif node_selector is not None:
        spec["nodeSelector"] = node_selector
    elif per_device:
        spec["perDeviceNodeSelection"] = True
    elif node:
        spec["nodeName"] = node
    if devices:
        spec["devices"] = [copy.deepcopy(d) for d in devices]
    if shared_counters:
        spec["sharedCounters"] = [
            {"name": s, "counters": {k: {"value": v} for k, v in c.items()}}
            for s, c in shared_counters.items()
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "generation": meta_generation},
        "spec": spec,
    }


def node_selector(*terms: JSON) -> JSON:
    return {"nodeSelectorTerms": list(terms)}


def label_term(key: str, operator: str = "In", values: Sequence[str] = ()) -> JSON:
    requirement: JSON = {"key": key, "operator": operator}
    if values:
        requirement["values"] = list(values)
    return {"matchExpressions": [requirement]}


def device_class(
    name: str = GPU_CLASS,
    *,
    selectors: Sequence[str] | None = None,
    config: Sequence[Mapping[str, Any]] = (),
    extended_resource_name: str | None = None,
    driver: str = DRIVER,
) -> JSON:
    """A ``DeviceClass``; by default it selects every device of ``driver``."""
    if selectors is None:
        selectors = [f'device.driver == "{driver}"']
    spec: JSON = {"selectors": [{"cel": {"expression": e}} for e in selectors]}
    if config:
        spec["config"] = [{"opaque": {"driver": driver, "parameters": dict(p)}} for p in config]
    if extended_resource_name:
        spec["extendedResourceName"] = extended_resource_name
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def _exact(
    cls: str,
    *,
    count: int | None,
    mode: str | None,
    selectors: Sequence[str],
    tolerations: Sequence[JSON],
    capacity: Mapping[str, str] | None,
) -> JSON:
    out: JSON = {"deviceClassName": cls}
    if selectors:
        out["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if mode:
        out["allocationMode"] = mode
    if count is not None:
        out["count"] = count
    if tolerations:
        out["tolerations"] = [dict(t) for t in tolerations]
    if capacity:
        out["capacity"] = {"requests": dict(capacity)}
    return out


def sub(
    name: str,
    *,
    cls: str = GPU_CLASS,
    count: int | None = None,
    mode: str | None = None,
    selectors: Sequence[str] = (),
    tolerations: Sequence[JSON] = (),
    capacity: Mapping[str, str] | None = None,
) -> JSON:
    """A ``firstAvailable`` subrequest."""
    return {
        "name": name,
        **_exact(
            cls,
            count=count,
            mode=mode,
            selectors=selectors,
            tolerations=tolerations,
            capacity=capacity,
        ),
    }


class ClaimBuilder:
    """Fluent ``ResourceClaim`` JSON builder; ``.json()`` gives a fresh dict each time."""

    def __init__(self, name: str, namespace: str, uid: str | None) -> None:
        self._meta: JSON = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
        self._requests: list[JSON] = []
        self._constraints: list[JSON] = []
        self._config: list[JSON] = []
        self._status: JSON = {}

    def request(
        self,
        name: str,
        *,
        cls: str = GPU_CLASS,
        count: int | None = None,
        mode: str | None = None,
        selectors: Sequence[str] = (),
        admin: bool = False,
        tolerations: Sequence[JSON] = (),
        capacity: Mapping[str, str] | None = None,
    ) -> ClaimBuilder:
        exact = _exact(
            cls,
            count=count,
            mode=mode,
            selectors=selectors,
            tolerations=tolerations,
            capacity=capacity,
        )
        if admin:
            exact["adminAccess"] = True
        self._requests.append({"name": name, "exactly": exact})
        return self

    def first_available(self, name: str, *subs: JSON) -> ClaimBuilder:
        self._requests.append({"name": name, "firstAvailable": [dict(s) for s in subs]})
        return self

    def constraint(
        self,
        *,
        match: str | None = None,
        distinct: str | None = None,
        requests: Sequence[str] = (),
    ) -> ClaimBuilder:
        out: JSON = {}
        if requests:
            out["requests"] = list(requests)
        if match:
            out["matchAttribute"] = match
        if distinct:
            out["distinctAttribute"] = distinct
        self._constraints.append(out)
        return self

    def config(
        self, parameters: Mapping[str, Any], *, requests: Sequence[str] = (), driver: str = DRIVER
    ) -> ClaimBuilder:
        out: JSON = {"opaque": {"driver": driver, "parameters": dict(parameters)}}
        if requests:
            out["requests"] = list(requests)
        self._config.append(out)
        return self

    def allocated(self, allocation: Mapping[str, Any]) -> ClaimBuilder:
        """Mark as allocated with this ``status.allocation`` object."""
        self._status["allocation"] = copy.deepcopy(dict(allocation))
        return self

    def holding(self, *devices: str, pool: str = "node-0", driver: str = DRIVER) -> ClaimBuilder:
        """Mark as allocated, exclusively, with ``devices`` of one pool."""
        return self.allocated(
            {
                "devices": {
                    "results": [
                        {"request": "r0", "driver": driver, "pool": pool, "device": d}
                        for d in devices
                    ]
                }
            }
        )

    def json(self) -> JSON:
        devices: JSON = {"requests": copy.deepcopy(self._requests)}
        if self._constraints:
            devices["constraints"] = copy.deepcopy(self._constraints)
        if self._config:
            devices["config"] = copy.deepcopy(self._config)
        out: JSON = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": dict(self._meta),
            "spec": {"devices": devices},
        }
        if self._status:
            out["status"] = copy.deepcopy(self._status)
        return out

    def model(self) -> ResourceClaim:
        return ResourceClaim.from_api(self.json())


def claim(name: str, *, namespace: str = "default", uid: str | None = None) -> ClaimBuilder:
    return ClaimBuilder(name, namespace, uid)


def node(
    name: str = "node-0",
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[JSON] = (),
    allocatable: Mapping[str, str] | None = None,
    unschedulable: bool = False,
    ready: bool = True,
) -> JSON:
    meta: JSON = {"name": name, "uid": f"uid-{name}"}
    meta["labels"] = {"kubernetes.io/hostname": name, **(labels or {})}
    spec: JSON = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    resources = dict(allocatable or {"cpu": "16", "memory": "64Gi", "pods": "110"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": meta,
        "spec": spec,
        "status": {
            "allocatable": resources,
            "capacity": dict(resources),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


# --------------------------------------------------------------------------- JSON -> models


def to_claim(raw: Mapping[str, Any] | ClaimBuilder) -> ResourceClaim:
    return ResourceClaim.from_api(raw.json() if isinstance(raw, ClaimBuilder) else raw)


def to_node(raw: Mapping[str, Any]) -> Node:
    return Node.from_api(raw)


def snapshot(
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]] | None = None,
    claims: Iterable[Mapping[str, Any] | ClaimBuilder] = (),
) -> ClusterSnapshot:
    """A snapshot from JSON; ``classes`` defaults to the standard GPU class."""
    return ClusterSnapshot.build(
        [ResourceSlice.from_api(s) for s in slices],
        [DeviceClass.from_api(c) for c in (classes if classes is not None else [device_class()])],
        [to_claim(c) for c in claims],
    )


def node_gpus(name: str = "node-0", count: int = 8, *, shared: bool = False, **kwargs: Any) -> JSON:
    """One node-local slice with ``count`` GPUs."""
    return slice_(
        f"{name}-gpus",
        node=name,
        devices=[gpu(i, shared=shared, **kwargs) for i in range(count)],
    )


# --------------------------------------------------------------------------- discovery values


def gpu_info(
    minor: int, *, mig_starts: Sequence[int] | None = None, pci: str = "", memory_mib: int = 40960
) -> GpuInfo:
    """What discovery reports for an A100 (not API JSON: the input of the device table).
    ``mig_starts`` given: MIG enabled, with 1g.5gb partitions (``MIG-<minor>-<start>``)."""
    migs = tuple(
        MigInfo(
            uuid=f"MIG-{minor}-{start}",
            profile="1g.5gb",
            start=start,
            size=1,
            memory_bytes=4864 * 1024 * 1024,
            multiprocessors=14,
            parent_uuid=f"GPU-{minor}",
            parent_minor=minor,
            gi_id=start + 1,
            ci_id=0,
            caps=(
                f"/dev/nvidia-caps/nvidia-cap{minor * 100 + 2 * start + 10}",
                f"/dev/nvidia-caps/nvidia-cap{minor * 100 + 2 * start + 11}",
            ),
        )
        for start in mig_starts or ()
    )
    return GpuInfo(
        uuid=f"GPU-{minor}",
        index=minor,
        minor=minor,
        product_name="NVIDIA A100-SXM4-40GB",
        brand="Nvidia",
        architecture="Ampere",
        cuda_compute_capability="8.0",
        driver_version="550.54.15",
        cuda_driver_version="12.4",
        memory_bytes=memory_mib * 1024 * 1024,
        multiprocessors=108,
        pci_bus_id=pci or f"0000:{0x10 + minor:02x}:00.0",
        mig_capable=True,
        mig_enabled=mig_starts is not None,
        mig_devices=migs,
    )


def gpu_config(strategy: str, *, driver: str = DRIVER) -> JSON:
    """A ``DeviceConfiguration`` holding a ``GpuConfig`` with ``sharing.strategy`` (as a class's
    ``spec.config`` or a claim's ``spec.devices.config`` entry)."""
    return {
        "opaque": {
            "driver": driver,
            "parameters": {
                "apiVersion": "gpu.biaxial.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": strategy},
            },
        }
    }


# --------------------------------------------------------------------------- volumes

CSI_DRIVER = "csi.test.biaxial.dev"


def storage_class(
    name: str,
    *,
    provisioner: str = CSI_DRIVER,
    mode: str | None = "WaitForFirstConsumer",
    allowed: Mapping[str, Sequence[str]] | None = None,
    default: bool = False,
) -> JSON:
    """A StorageClass; ``allowed``: one ``allowedTopologies`` term, label -> values."""
    raw: JSON = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        "reclaimPolicy": "Delete",
    }
    if mode is not None:
        raw["volumeBindingMode"] = mode
    if allowed:
        raw["allowedTopologies"] = [
            {"matchLabelExpressions": [{"key": k, "values": list(v)} for k, v in allowed.items()]}
        ]
    if default:
        raw["metadata"]["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
    return raw


def pvc(
    name: str,
    *,
    cls: str | None = "wffc",
    size: str = "10Gi",
    modes: Sequence[str] = ("ReadWriteOnce",),
    namespace: str = "default",
    volume: str = "",
    bound: bool = False,
    selected: str | None = None,
    selector: JSON | None = None,
    owner: str | None = None,
    phase: str = "Pending",
) -> JSON:
    """A PersistentVolumeClaim; ``bound``: bound to ``volume`` by the PV controller;
    ``owner``: the UID of the pod that controls it (a generic ephemeral volume's claim)."""
    meta: JSON = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    annotations: JSON = {}
    if bound:
        annotations["pv.kubernetes.io/bind-completed"] = "yes"
        phase = "Bound"
    if selected is not None:
        annotations["volume.kubernetes.io/selected-node"] = selected
    if annotations:
        meta["annotations"] = annotations
    if owner is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner, "controller": True}
        ]
    spec: JSON = {"accessModes": list(modes), "resources": {"requests": {"storage": size}}}
    if cls is not None:
        spec["storageClassName"] = cls
    if volume:
        spec["volumeName"] = volume
    if selector is not None:
        spec["selector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase},
    }


def pv(
    name: str,
    *,
    cls: str = "wffc",
    size: str = "10Gi",
    modes: Sequence[str] = ("ReadWriteOnce",),
    hostname: str | None = None,
    zone: str | None = None,
    labels: Mapping[str, str] | None = None,
    claim: str | None = None,
    claim_uid: str | None = None,
    phase: str = "Available",
    driver: str | None = CSI_DRIVER,
    source: JSON | None = None,
) -> JSON:
    """A PersistentVolume; ``hostname``: required node affinity on that node (a local PV);
    ``claim``: ``claimRef`` to ``default/<claim>``; ``source``: an in-tree source instead of
    CSI (``{"awsElasticBlockStore": {...}}``)."""
    spec: JSON = {
        "capacity": {"storage": size},
        "accessModes": list(modes),
        "storageClassName": cls,
        "persistentVolumeReclaimPolicy": "Retain",
    }
    if source is not None:
        spec.update(source)
    elif driver is not None:
        spec["csi"] = {"driver": driver, "volumeHandle": f"vol-{name}"}
    if hostname is not None:
        spec["nodeAffinity"] = {
            "required": node_selector(label_term("kubernetes.io/hostname", "In", [hostname]))
        }
    if claim is not None:
        spec["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": "default", "name": claim}
        if claim_uid is not None:
            spec["claimRef"]["uid"] = claim_uid
    all_labels = dict(labels or {})
    if zone is not None:
        all_labels["topology.kubernetes.io/zone"] = zone
    meta: JSON = {"name": name}
    if all_labels:
        meta["labels"] = all_labels
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase},
    }


def csi_node(name: str, limits: Mapping[str, int | None], *, migrated: Sequence[str] = ()) -> JSON:
    """A CSINode with one entry per driver (``None``: no ``allocatable.count``)."""
    drivers = []
    for driver, count in limits.items():
        entry: JSON = {"name": driver, "nodeID": name, "topologyKeys": None}
        if count is not None:
            entry["allocatable"] = {"count": count}
        drivers.append(entry)
    meta: JSON = {"name": name}
    if migrated:
        meta["annotations"] = {"storage.alpha.kubernetes.io/migrated-plugins": ",".join(migrated)}
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": meta,
        "spec": {"drivers": drivers},
    }


def volume_pod(
    name: str,
    claims: Sequence[str] = (),
    *,
    ephemeral: Sequence[str] = (),
    inline: Sequence[JSON] = (),
    namespace: str = "default",
    node_name: str | None = None,
) -> JSON:
    """A pod mounting the claims ``claims``, generic ephemeral volumes named ``ephemeral`` and
    in-line volume sources ``inline`` (``{"gcePersistentDisk": {...}}``)."""
    volumes: list[JSON] = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)
    ]
    template: JSON = {
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "wffc",
            "resources": {"requests": {"storage": "1Gi"}},
        }
    }
    volumes.extend(
        {"name": e, "ephemeral": {"volumeClaimTemplate": copy.deepcopy(template)}}
        for e in ephemeral
    )
    volumes.extend({"name": f"inline{i}", **source} for i, source in enumerate(inline))
    spec: JSON = {"containers": [{"name": "c", "image": "busybox"}], "volumes": volumes}
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec,
    }

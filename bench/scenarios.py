"""Deterministic benchmark scenarios: N nodes x 8 GPUs, some load already on them, and a stream
of pods to place.

A scenario is plain API JSON, as a controller would list it from the API server:

* ``nodes``: v1 Nodes (``bench-00000`` ...), Ready, with cpu/memory/pods allocatable;
* ``slices``: each node's pool from the real slice builder (8 x A100-SXM4-80GB, two NUMA nodes
  and two PCIe roots, shared GPUs with ``memory``/``cores`` consumable capacity);
* ``classes``: the project's DeviceClasses (``deviceclasses/``);
* ``claims``: allocated ResourceClaims already holding part of each node (fractions and whole
  GPUs; 0-70 % of a node's memory), so the cluster is realistically used, not empty;
* ``pods``: the pods to place, each with its own ResourceClaims (already created from
  templates), a mix of

  - whole-GPU legacy pods (``nvidia.com/gpu: 1``, served by the KEP-5004 bridge),
  - fractional legacy pods (``nvidia.com/gpu: 1`` + ``nvidia.com/gpumem`` (+ ``gpucores``)),
  - fractional claim pods (``capacity.requests`` memory and cores),
  - multi-GPU claim pods (2 or 4 GPUs with ``matchAttribute`` on the NUMA node or PCIe root),

  with node/GPU policies drawn from binpack and spread.

Everything derives from ``seed``; the same arguments give the same scenario.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biaxial.simulate.manifests import load_objects
from driver.discovery.backend import open_backend
from driver.discovery.devices import DeviceTable
from driver.discovery.fake import FakeBackend
from driver.discovery.gpus import GpuInfo
from driver.discovery.mig import DynamicMigPolicy
from driver.discovery.slices import build_slices

JSON = dict[str, Any]
PROFILE = "a100-80gbx8"
GPU_MIB = 81920
ROOT = Path(__file__).resolve().parent.parent
_NS = uuid.UUID("0c4c7f1e-54a8-5bd4-8a6e-5d2b7a1f9e33")


@dataclass(frozen=True)
class Scenario:
    nodes: list[JSON]
    slices: list[JSON]
    classes: list[JSON]
    claims: list[JSON]
    pods: list[tuple[JSON, list[JSON]]]
    #: (kind, namespace, name, spec.selector) of the pods' controllers (ReplicaSets): what
    #: the decision engine's default spreading reads (``DecisionEngine.observe_owner``).
    owners: list[tuple[str, str, str, JSON]] = dataclasses.field(default_factory=list)


def _uid(*parts: object) -> str:
    return str(uuid.uuid5(_NS, "/".join(str(p) for p in parts)))


def _node(name: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": _uid("node", name),
            "labels": {"kubernetes.io/hostname": name},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _held(node: str, index: int, device: str, memory_mib: int | None, cores: int) -> JSON:
    name = f"held-{node}-{index}"
    result: JSON = {"request": "gpu", "driver": "gpu.biaxial.dev", "pool": node, "device": device}
    result["shareID"] = _uid("share", name)
    result["consumedCapacity"] = {
        "cores": str(cores),
        "memory": f"{memory_mib if memory_mib is not None else GPU_MIB}Mi",
    }
    request: JSON = {"deviceClassName": "gpu.biaxial.dev", "count": 1}
    if memory_mib is not None:
        request["capacity"] = {"requests": {"memory": f"{memory_mib}Mi", "cores": str(cores)}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "load", "uid": _uid("claim", name)},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": name, "uid": _uid("pod", name)}],
        },
    }


def _pod(name: str, rng: random.Random) -> tuple[JSON, list[JSON]]:
    annotations = {
        "biaxial.dev/node-policy": rng.choice(("binpack", "binpack", "spread")),
        "biaxial.dev/gpu-policy": rng.choice(("binpack", "binpack", "spread")),
    }
    pod: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": _uid("pod", name),
            "annotations": annotations,
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
                }
            ]
        },
    }
    kind = rng.random()
    limits: JSON = {}
    claims: list[JSON] = []
    if kind < 0.35:
        limits = {"nvidia.com/gpu": 1}
    elif kind < 0.65:
        limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": rng.choice((5000, 10000, 20000, 40000))}
        if rng.random() < 0.5:
            limits["nvidia.com/gpucores"] = rng.choice((10, 25, 50))
    else:
        request: JSON = {"deviceClassName": "gpu.biaxial.dev"}
        constraints: list[JSON] = []
        if kind < 0.85:
            request["capacity"] = {
                "requests": {
                    "memory": f"{rng.choice((8, 16, 24))}Gi",
                    "cores": str(rng.choice((0, 20, 40))),
                }
            }
        else:
            request["count"] = rng.choice((2, 2, 4))
            attribute = rng.choice(
                ("resource.kubernetes.io/numaNode", "resource.kubernetes.io/pcieRoot")
            )
            constraints.append({"matchAttribute": attribute})
        claim_name = f"{name}-gpu"
        devices: JSON = {"requests": [{"name": "gpu", "exactly": request}]}
        if constraints:
            devices["constraints"] = constraints
        claims.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": claim_name,
                    "namespace": "bench",
                    "uid": _uid("claim", claim_name),
                },
                "spec": {"devices": devices},
            }
        )
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
        pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    if limits:
        pod["spec"]["containers"][0]["resources"]["limits"] = limits
    return pod, claims


def generate(nodes: int, pods: int, *, seed: int = 42, max_fill: float = 0.7) -> Scenario:
    """``nodes`` x 8 GPUs with 0..``max_fill`` of each node's GPU memory already held, and
    ``pods`` pods to place."""
    rng = random.Random(seed)
    with open_backend(fake=PROFILE, node_name="template") as backend:
        template = backend.discover()
    node_objs: list[JSON] = []
    slices: list[JSON] = []
    held: list[JSON] = []
    for n in range(nodes):
        name = f"bench-{n:05d}"
        node_objs.append(_node(name))
        gpus = [dataclasses.replace(g, uuid=f"GPU-{_uid(name, g.index)}") for g in template]
        slices.extend(
            s.to_api() for s in build_slices(gpus, node_name=name, node_uid=_uid("node", name))
        )
        budget = int(rng.uniform(0.0, max_fill) * len(gpus) * GPU_MIB)
        index = 0
        free = [GPU_MIB] * len(gpus)
        while budget > 0:
            whole = rng.random() < 0.3
            memory = GPU_MIB if whole else rng.choice((5000, 10000, 20000, 40000))
            device = rng.randrange(len(gpus))
            if free[device] < memory or (whole and free[device] != GPU_MIB):
                budget -= memory // 4  # give up on this one, keep the loop finite
                continue
            free[device] -= memory
            budget -= memory
            held.append(
                _held(
                    name,
                    index,
                    f"gpu-{device}",
                    None if whole else memory,
                    0 if whole else rng.choice((0, 10)),
                )
            )
            index += 1
    classes = load_objects(sorted(str(p) for p in (ROOT / "deviceclasses").glob("*.yaml")))
    pod_list = [_pod(f"pod-{i:06d}", rng) for i in range(pods)]
    return Scenario(nodes=node_objs, slices=slices, classes=classes, claims=held, pods=pod_list)


# --------------------------------------------------------------------------- the mixed cluster

#: (fake profile, share of the nodes). H100 nodes run MIG on GPUs 6 and 7 (the profile's own
#: existing partitions); everything else is whole, shareable GPUs.
MIXED_NODES: tuple[tuple[str, float], ...] = (
    ("t4x4", 0.15),
    ("a10gx4", 0.15),
    ("a100-80gbx8", 0.45),
    ("h100-80gbx8", 0.25),
)

#: The workload's pod shapes and their weights, per variant. Each Deployment has one shape and
#: one policy pair; its replicas are consecutive pods.
SHAPES: tuple[str, ...] = (
    "legacy-whole",  # nvidia.com/gpu: 1
    "claim-whole",  # a claim for one whole GPU
    "legacy-two",  # nvidia.com/gpu: 2
    "share-memory",  # capacity.requests memory
    "share-memory-cores",  # capacity.requests memory + cores
    "hami",  # nvidia.com/gpu: 1 + gpumem (+ gpucores)
    "hami-20g",  # nvidia.com/gpu: 1 + nvidia.com/gpumem: 20000
    "numa-pair",  # 2 GPUs, matchAttribute numaNode
    "pcie-quad",  # 4 GPUs, matchAttribute pcieRoot
    "mig",  # mig.biaxial.dev with a profile selector
    "product-class",  # a100-80gb.gpu.biaxial.dev, whole or a share
    "h100-selector-share",  # gpu.biaxial.dev + an H100 CEL selector + a memory share
)
VARIANTS: dict[str, dict[str, int]] = {
    "mixed": {
        "legacy-whole": 12,
        "claim-whole": 8,
        "legacy-two": 5,
        "share-memory": 14,
        "share-memory-cores": 10,
        "hami": 12,
        "numa-pair": 8,
        "pcie-quad": 4,
        "mig": 8,
        "product-class": 9,
        "h100-selector-share": 10,
    },
    "mig-heavy": {
        "legacy-whole": 8,
        "share-memory": 10,
        "hami": 8,
        "numa-pair": 4,
        "mig": 50,
        "h100-selector-share": 10,
        "product-class": 10,
    },
    "selector-heavy": {
        "legacy-whole": 10,
        "share-memory": 10,
        "hami": 5,
        "mig": 10,
        "product-class": 30,
        "h100-selector-share": 35,
    },
    # Dynamic MIG on half the nodes: MIG pods (partitions created on demand) mixed with
    # shares, whole GPUs and HAMi pods, which dynamic GPUs serve too (whole or shared, never
    # beside a partition).
    "dynamic-mig": {
        "mig": 40,
        "share-memory": 20,
        "share-memory-cores": 10,
        "hami": 15,
        "legacy-whole": 10,
        "claim-whole": 5,
    },
}
#: mig-heavy: half the nodes are H100s (MIG on two GPUs each).
VARIANT_NODES: dict[str, tuple[tuple[str, float], ...]] = {
    "mixed": MIXED_NODES,
    "mig-heavy": (("t4x4", 0.1), ("a10gx4", 0.1), ("a100-80gbx8", 0.3), ("h100-80gbx8", 0.5)),
    "selector-heavy": MIXED_NODES,
    "dynamic-mig": (
        ("a100-80gbx8", 0.25),
        ("a100-80gbx8-dynmig", 0.25),
        ("h100-80gbx8", 0.25),
        ("h100-80gbx8-dynmig", 0.25),
    ),
}
_MIG_PROFILES = ("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")
_H100 = 'device.attributes["gpu.biaxial.dev"].productName.startsWith("NVIDIA H100")'


def _claim(name: str, request: JSON, constraints: list[JSON] | None = None) -> JSON:
    devices: JSON = {"requests": [{"name": "gpu", "exactly": request}]}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench", "uid": _uid("claim", name)},
        "spec": {"devices": devices},
    }


def _shaped_pod(name: str, shape: str, policies: tuple[str, str], rng: random.Random) -> Any:
    """One replica of a Deployment of ``shape``: the pod and its claims (from its template)."""
    pod: JSON = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": _uid("pod", name),
            "annotations": {
                "biaxial.dev/node-policy": policies[0],
                "biaxial.dev/gpu-policy": policies[1],
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
                }
            ]
        },
    }
    resources = pod["spec"]["containers"][0]["resources"]
    request: JSON = {"deviceClassName": "gpu.biaxial.dev"}
    constraints: list[JSON] = []
    if shape == "legacy-whole":
        resources["limits"] = {"nvidia.com/gpu": 1}
        return pod, []
    if shape == "legacy-two":
        resources["limits"] = {"nvidia.com/gpu": 2}
        return pod, []
    if shape == "hami":
        limits: JSON = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": rng.choice((3000, 6000, 12000))}
        if rng.random() < 0.5:
            limits["nvidia.com/gpucores"] = rng.choice((10, 25, 50))
        resources["limits"] = limits
        return pod, []
    if shape == "hami-20g":
        resources["limits"] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}
        return pod, []
    if shape == "share-memory":
        request["capacity"] = {"requests": {"memory": f"{rng.choice((4, 8, 12))}Gi"}}
    elif shape == "share-memory-cores":
        request["capacity"] = {
            "requests": {"memory": f"{rng.choice((4, 8))}Gi", "cores": str(rng.choice((20, 40)))}
        }
    elif shape == "numa-pair":
        request["count"] = 2
        constraints.append({"matchAttribute": "resource.kubernetes.io/numaNode"})
    elif shape == "pcie-quad":
        request["count"] = 4
        constraints.append({"matchAttribute": "resource.kubernetes.io/pcieRoot"})
    elif shape == "mig":
        profile = rng.choice(_MIG_PROFILES)
        request = {
            "deviceClassName": "mig.biaxial.dev",
            "selectors": [
                {
                    "cel": {
                        "expression": (
                            f'device.attributes["gpu.biaxial.dev"].profile == "{profile}"'
                        )
                    }
                }
            ],
        }
    elif shape == "product-class":
        request = {"deviceClassName": "a100-80gb.gpu.biaxial.dev"}
        if rng.random() < 0.5:
            request["capacity"] = {"requests": {"memory": "20Gi"}}
    elif shape == "h100-selector-share":
        request["selectors"] = [{"cel": {"expression": _H100}}]
        request["capacity"] = {"requests": {"memory": f"{rng.choice((10, 20))}Gi"}}
    elif shape != "claim-whole":
        raise ValueError(f"unknown pod shape {shape!r}")
    claim = _claim(f"{name}-gpu", request, constraints)
    pod["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}
    ]
    resources["claims"] = [{"name": "gpu"}]
    return pod, [claim]


def _held_device(node: str, index: int, device: str, memory_mib: int | None) -> JSON:
    """A claim already holding ``device``: exclusive (``memory_mib`` None) or a memory share."""
    if memory_mib is not None:
        return _held(node, index, device, memory_mib, 0)
    claim = _held(node, index, device, None, 0)
    result = claim["status"]["allocation"]["devices"]["results"][0]
    del result["shareID"], result["consumedCapacity"]
    return claim


def generate_mixed(
    nodes: int, pods: int, *, variant: str = "mixed", seed: int = 42, max_fill: float = 0.0
) -> Scenario:
    """The realistic mixed cluster (:data:`VARIANT_NODES`) with 0..``max_fill`` of each node's
    GPUs already held, and ``pods`` pods in Deployments of :data:`VARIANTS` shapes, each with
    its own node and GPU policy."""
    rng = random.Random(seed)
    templates: dict[str, tuple[GpuInfo, ...]] = {}
    dynamic: dict[str, frozenset[int]] = {}  # profile -> indices of its dynamic-MIG GPUs
    for profile, _ in VARIANT_NODES[variant]:
        with FakeBackend.from_profile(profile, node_name="template") as backend:
            templates[profile] = backend.discover()
            dynamic[profile] = frozenset(
                g.index for g in templates[profile] if g.uuid in backend.dynamic_mig
            )
    node_objs: list[JSON] = []
    slices: list[JSON] = []
    held: list[JSON] = []
    bounds: list[tuple[float, str]] = []
    total = 0.0
    for profile, share in VARIANT_NODES[variant]:
        total += share
        bounds.append((total, profile))
    for n in range(nodes):
        name = f"mixed-{n:05d}"
        point = (n + 0.5) / nodes * total
        profile = next(p for bound, p in bounds if point < bound)
        node_objs.append(_node(name))
        gpus = [
            dataclasses.replace(g, uuid=f"GPU-{_uid(name, g.index)}") for g in templates[profile]
        ]
        policy = DynamicMigPolicy(
            gpus=frozenset(g.uuid for g in gpus if g.index in dynamic[profile])
        )
        built = build_slices(
            DeviceTable.from_gpus(gpus, policy), node_name=name, node_uid=_uid("node", name)
        )
        slices.extend(s.to_api() for s in built)
        index = 0
        for device in (d for s in built for d in s.devices):
            if rng.random() > max_fill or device.consumes_counters:
                continue  # dynamic-MIG devices start free: held ones must respect counters
            memory = device.capacity["memory"].value.value() // (1024 * 1024)
            share = device.allow_multiple_allocations and rng.random() < 0.7
            held.append(
                _held_device(
                    name, index, device.name, rng.randint(1, memory // 2) if share else None
                )
            )
            index += 1
    classes = load_objects(sorted(str(p) for p in (ROOT / "deviceclasses").glob("*.yaml")))
    weights = VARIANTS[variant]
    shapes = [s for s in SHAPES if s in weights]
    pod_list: list[tuple[JSON, list[JSON]]] = []
    deployment = 0
    while len(pod_list) < pods:
        shape = rng.choices(shapes, weights=[weights[s] for s in shapes])[0]
        policies = (
            rng.choice(("binpack", "binpack", "spread")),
            rng.choice(("binpack", "binpack", "spread")),
        )
        replicas = min(rng.choice((5, 10, 20, 40)), pods - len(pod_list))
        for replica in range(replicas):
            name = f"{shape}-{deployment:04d}-{replica:02d}"
            pod_list.append(_shaped_pod(name, shape, policies, rng))
        deployment += 1
    return Scenario(nodes=node_objs, slices=slices, classes=classes, claims=held, pods=pod_list)


# --------------------------------------------------------------------------- fixed mixes

#: Mixes of a few Deployments with fixed shapes and policies (issue 28's cliff: each alone
#: decides at thousands of pods/s, together they made the bounds stop pruning). Per mix: the
#: cluster's node profile and the Deployments, (shape, (node policy, GPU policy), replicas).
#: The Deployments' pods arrive interleaved, as from two rollouts at once.
MIXES: dict[str, tuple[str, tuple[tuple[str, tuple[str, str], int], ...]]] = {
    "plugin-hami": (
        "a100-80gbx8",
        (
            ("legacy-whole", ("binpack", "binpack"), 900),
            ("hami-20g", ("spread", "binpack"), 800),
        ),
    ),
    # Its parts, alone.
    "plugin": ("a100-80gbx8", (("legacy-whole", ("binpack", "binpack"), 900),)),
    "hami": ("a100-80gbx8", (("hami-20g", ("spread", "binpack"), 800),)),
}


def generate_mix(nodes: int, pods: int, *, mix: str, seed: int = 42) -> Scenario:
    """``nodes`` empty nodes of the mix's profile and its Deployments' pods, interleaved
    (round robin, each Deployment in proportion to its replicas), ``pods`` in all."""
    rng = random.Random(seed)
    profile, deployments = MIXES[mix]
    with FakeBackend.from_profile(profile, node_name="template") as backend:
        template = backend.discover()
    node_objs: list[JSON] = []
    slices: list[JSON] = []
    for n in range(nodes):
        name = f"mix-{n:05d}"
        node_objs.append(_node(name))
        gpus = [dataclasses.replace(g, uuid=f"GPU-{_uid(name, g.index)}") for g in template]
        built = build_slices(gpus, node_name=name, node_uid=_uid("node", name))
        slices.extend(s.to_api() for s in built)
    classes = load_objects(sorted(str(p) for p in (ROOT / "deviceclasses").glob("*.yaml")))
    wanted = sum(replicas for _, _, replicas in deployments)
    scaled = [max(1, replicas * pods // wanted) for _, _, replicas in deployments]
    streams = [
        [
            _owned(
                _shaped_pod(f"{shape}-{d:04d}-{replica:04d}", shape, policies, rng),
                f"{shape}-{d:04d}",
            )
            for replica in range(count)
        ]
        for d, ((shape, policies, _), count) in enumerate(zip(deployments, scaled, strict=True))
    ]
    owners = [
        ("ReplicaSet", "bench", f"{shape}-{d:04d}-rs", {"matchLabels": {"app": f"{shape}-{d:04d}"}})
        for d, (shape, _, _) in enumerate(deployments)
    ]
    pod_list: list[tuple[JSON, list[JSON]]] = []
    taken = [0] * len(streams)
    while len(pod_list) < sum(scaled):
        # The Deployment furthest behind its share goes next.
        d = min(range(len(streams)), key=lambda i: (taken[i] / scaled[i], i))
        pod_list.append(streams[d][taken[d]])
        taken[d] += 1
    return Scenario(
        nodes=node_objs, slices=slices, classes=classes, claims=[], pods=pod_list, owners=owners
    )


def _owned(pod_and_claims: Any, deployment: str) -> Any:
    """The pod as its Deployment's ReplicaSet makes it: the template's label, the owner
    reference (so the System default spreading applies, as in a real cluster)."""
    pod, claims = pod_and_claims
    meta = pod["metadata"]
    meta["labels"] = {"app": deployment}
    meta["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": f"{deployment}-rs",
            "uid": _uid("rs", deployment),
            "controller": True,
        }
    ]
    return pod, claims

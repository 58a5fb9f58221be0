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

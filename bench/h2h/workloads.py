"""The head-to-head's workloads as plain API JSON: what one run seeds and which pods it
creates, built by pure functions (no API server), so the same arguments give the same run.

* :func:`upstream_shape`: scheduler_perf's ``SchedulingWithResourceClaimTemplate`` burst
  (``claim-template``) and its pairs-with-``matchAttribute`` variant (``match-attribute``);
* :func:`steady_shape`: the same two, the cluster pre-filled with allocated claims (``empty``,
  ``half``, ``full``), pods created and deleted in a steady stream (``claim-template-half`` ...);
* :func:`churn_shape`: placement quality under churn on shareable A100s, and
  :func:`gpu_fill`: what its claims leave of the GPUs (whole ones free, stranded memory);
* :func:`mixed_shape`: the project's mixed cluster and workload, restricted to what
  kube-scheduler can express;
* :func:`patterns_shape`: the reference cluster and the four Deployments of the two axes.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from bench.processes import ROOT
from bench.scenarios import generate_mixed
from biaxial.simulate.manifests import load_objects
from biaxial.simulate.results import SimulationResult
from biaxial.simulate.usage import gpu_usage
from driver.api.model import ResourceSlice
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices

JSON = dict[str, Any]
DRIVER: Final = "test-driver.cdi.k8s.io"
CLASS: Final = "test-class"
NAMESPACE: Final = "bench"
INIT_NAMESPACE: Final = "init"  # the pre-filled claims of the steady-state workloads
DEVICES_PER_NODE: Final = 10
GPU_PROFILE: Final = "a100-80gbx8"
GPU_CLASS: Final = "gpu.biaxial.dev"
SHARES_GIB: Final = (10, 20, 40)
CHURN_ROUNDS: Final = 5
CHURN_DEPARTURES: Final = 0.4  # of the pods alive, after each round
#: scheduler_perf's steady state keeps this many pods waiting (its ``measurePods``)
STEADY_IN_FLIGHT: Final = 10
FILLS: Final = ("empty", "half", "full")
BURSTS: Final = ("claim-template", "match-attribute")
STEADY: Final = tuple(f"{base}-{fill}" for base in BURSTS for fill in FILLS)
WORKLOADS: Final = (*BURSTS, *STEADY, "churn", "mixed", "four-patterns")
#: the mixed workload's shapes kube-scheduler can allocate too: claims, classes, selectors and
#: ``nvidia.com/gpu`` through the bridge class (``extendedResourceName``). Left out: HAMi's
#: ``gpumem``/``gpucores`` (no DeviceClass names them) and MIG (partitions of a GPU that is
#: also published whole: kube-scheduler sees no counters between them in this cluster)
MIXED_SHAPES: Final = (
    "legacy-whole",
    "claim-whole",
    "legacy-two",
    "share-memory",
    "share-memory-cores",
    "numa-pair",
    "pcie-quad",
    "product-class",
    "h100-selector-share",
)
#: the reference cluster of the two axes: (node, fake profile, cpu, memory)
REFERENCE_NODES: Final = (("gpu-t4", "t4x4", "32", "128Gi"), ("gpu-a10g", "a10gx4", "48", "192Gi"))
#: pattern -> (node policy, GPU policy); four replicas each of one GPU share of 7500 MiB
PATTERNS: Final = {
    "A": ("binpack", "binpack"),
    "B": ("spread", "binpack"),
    "C": ("binpack", "spread"),
    "D": ("spread", "spread"),
}
PATTERN_REPLICAS: Final = 4
PATTERN_MIB: Final = 7500


@dataclass(frozen=True, slots=True)
class Churn:
    """The churn workload's schedule: rounds of (arrivals, departures), then the wave."""

    rounds: list[tuple[list[JSON], list[str]]]
    wave: list[JSON]
    gpus: int


@dataclass(frozen=True, slots=True)
class Inventory:
    """What one run starts from: cluster-scoped objects, the templates, the pods to create.

    ``held``: allocated claims seeded before the scheduler starts (the steady-state fill);
    ``claims``: per pod, the claims created just before it (the mixed workload's own claims);
    ``in_flight``: when set, the pods are a steady stream (at most this many waiting, each
    bound pod deleted and the next created); ``patterns``: the four-patterns Deployments, one
    after the other on the same cluster."""

    workload: str
    nodes: list[JSON]
    slices: list[JSON]
    classes: list[JSON]
    templates: list[JSON]
    pods: list[JSON]
    churn: Churn | None = None
    held: list[JSON] = field(default_factory=list)
    claims: dict[str, list[JSON]] = field(default_factory=dict)
    in_flight: int | None = None
    patterns: dict[str, list[JSON]] = field(default_factory=dict)
    devices: str = f"{DEVICES_PER_NODE} devices"  # what each node has, for the table's title


def node(name: str, cpu: str = "32", memory: str = "128Gi") -> JSON:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def simple_slice(node_name: str) -> JSON:
    """One pool per node of ``DEVICES_PER_NODE`` plain devices, paired by ``group``."""
    devices = [
        {"name": f"device-{i}", "attributes": {f"{DRIVER}/group": {"int": i // 2}}}
        for i in range(DEVICES_PER_NODE)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def pod(name: str, template: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {
                    "name": "pause",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "devices"}]},
                }
            ],
            "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
        },
    }


def gpu_pod(name: str, template: str) -> JSON:
    made = pod(name, template)
    made["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m", "memory": "256Mi"}
    return made


def template(name: str, device_class: str, exactly: JSON, constraints: Sequence[JSON] = ()) -> JSON:
    """A ResourceClaimTemplate of one request ``devices`` (``exactly``, of ``device_class``)."""
    devices: JSON = {
        "requests": [{"name": "devices", "exactly": {"deviceClassName": device_class, **exactly}}]
    }
    if constraints:
        devices["constraints"] = list(constraints)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": devices}},
    }


def _simple_class() -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def devices_per_pod(workload: str) -> int:
    return 2 if workload.startswith("match-attribute") else 1


def upstream_shape(workload: str, nodes: int, pods: int) -> Inventory:
    """scheduler_perf's DRA shape; ``match-attribute`` asks for a pair per pod (half the pods)."""
    names = [f"node-{i:05d}" for i in range(nodes)]
    if workload.startswith("match-attribute"):
        pair = {"requests": ["devices"], "matchAttribute": f"{DRIVER}/group"}
        claim_template = template("claim-template", CLASS, {"count": 2}, [pair])
        pods //= 2
    else:
        claim_template = template("claim-template", CLASS, {})
    return Inventory(
        workload=workload,
        nodes=[node(n) for n in names],
        slices=[simple_slice(n) for n in names],
        classes=[_simple_class()],
        templates=[claim_template],
        pods=[pod(f"pod-{i:05d}", "claim-template") for i in range(pods)],
    )


def fill_count(fill: str, nodes: int, per_pod: int) -> int:
    """Devices held before the stream, as scheduler_perf's steady states: none, half, or all
    but room for ``STEADY_IN_FLIGHT`` pods (``full``: 4990 of 5000 at one device a pod)."""
    total = nodes * DEVICES_PER_NODE
    if fill == "empty":
        return 0
    if fill == "half":
        return total // 2
    if fill == "full":
        return max(0, total - STEADY_IN_FLIGHT * per_pod)
    raise ValueError(f"unknown fill {fill!r}; known: {', '.join(FILLS)}")


def held_claim(name: str, node_name: str, device: str) -> JSON:
    """An allocated claim of one device of the simple driver (as scheduler_perf's
    ``allocResourceClaims``: allocated, reserved for no pod)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": INIT_NAMESPACE},
        "spec": {
            "devices": {"requests": [{"name": "devices", "exactly": {"deviceClassName": CLASS}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "devices",
                            "driver": DRIVER,
                            "pool": node_name,
                            "device": device,
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node_name]}
                            ]
                        }
                    ]
                },
            }
        },
    }


def steady_shape(workload: str, nodes: int, pods: int) -> Inventory:
    """``<claim-template|match-attribute>-<empty|half|full>``: the burst's cluster with
    :func:`fill_count` devices held, node by node in device order (so a pair is held whole and
    ``full`` leaves its free devices on the last nodes), and ``pods`` pods (pairs for
    match-attribute: ``pods`` // 2) streamed ``STEADY_IN_FLIGHT`` at a time."""
    base, _, fill = workload.rpartition("-")
    if base not in BURSTS:
        raise ValueError(f"not a steady-state workload: {workload!r}")
    burst = upstream_shape(base, nodes, pods)
    held = [
        held_claim(
            f"held-{k:05d}", f"node-{k // DEVICES_PER_NODE:05d}", f"device-{k % DEVICES_PER_NODE}"
        )
        for k in range(fill_count(fill, nodes, devices_per_pod(base)))
    ]
    return dataclasses.replace(burst, workload=workload, held=held, in_flight=STEADY_IN_FLIGHT)


def _gpu_slices(profile: str, names: Sequence[str]) -> list[JSON]:
    """Each node's pool as the kubelet plugin publishes it, from a fake GPU profile."""
    with open_backend(fake=profile, node_name="template") as backend:
        gpus_template = backend.discover()
    slices: list[JSON] = []
    for name in names:
        gpus = [dataclasses.replace(g, uuid=f"GPU-{name}-{g.index}") for g in gpus_template]
        slices.extend(built.to_api() for built in build_slices(gpus, node_name=name))
    return slices


def _project_classes(*names: str) -> list[JSON]:
    return load_objects([str(ROOT / "deviceclasses" / f"{n}.yaml") for n in names])


def churn_shape(nodes: int, pods: int, *, seed: int = 24) -> Inventory:
    """A shared-GPU cluster (``nodes`` x 8 A100-80GB from the project's slice builder, every
    GPU shareable by memory), ``pods`` arrivals in ``CHURN_ROUNDS`` rounds (3 in 4 a share of
    10, 20 or 40 GiB, 1 in 4 a whole GPU), after each round ``CHURN_DEPARTURES`` of the pods
    alive leave; then the wave: ``nodes // 4`` 8-GPU and ``2 * nodes`` 1-GPU training pods."""
    rng = random.Random(seed)
    names = [f"node-{i:05d}" for i in range(nodes)]
    slices = _gpu_slices(GPU_PROFILE, names)
    templates = [
        template(f"share-{gib}", GPU_CLASS, {"capacity": {"requests": {"memory": f"{gib}Gi"}}})
        for gib in SHARES_GIB
    ] + [template("whole-1", GPU_CLASS, {}), template("train-8", GPU_CLASS, {"count": 8})]
    rounds: list[tuple[list[JSON], list[str]]] = []
    alive: list[str] = []
    per_round = max(1, pods // CHURN_ROUNDS)
    for r in range(CHURN_ROUNDS):
        arrivals = []
        for i in range(per_round):
            name = f"job-{r}-{i:05d}"
            shape = f"share-{rng.choice(SHARES_GIB)}" if rng.random() < 0.75 else "whole-1"
            arrivals.append(gpu_pod(name, shape))
        alive += [p["metadata"]["name"] for p in arrivals]
        leaving = sorted(rng.sample(alive, int(CHURN_DEPARTURES * len(alive))))
        gone = set(leaving)
        alive = [n for n in alive if n not in gone]
        rounds.append((arrivals, leaving))
    wave = [gpu_pod(f"train8-{i:05d}", "train-8") for i in range(nodes // 4)]
    wave += [gpu_pod(f"train1-{i:05d}", "whole-1") for i in range(2 * nodes)]
    gpus_per_node = len(slices[0]["spec"]["devices"]) if slices else 0
    return Inventory(
        workload="churn",
        nodes=[node(n) for n in names],
        slices=slices,
        classes=_project_classes(GPU_CLASS),
        templates=templates,
        pods=[p for arrivals, _ in rounds for p in arrivals] + wave,
        churn=Churn(rounds=rounds, wave=wave, gpus=nodes * gpus_per_node),
        devices="8 A100-80GB (shareable)",
    )


def gpu_fill(claims: Sequence[JSON], slices: Sequence[JSON]) -> JSON:
    """What ``claims`` (API objects, allocated or not) leave of the GPUs ``slices`` publish,
    counted as ``biaxial simulate`` counts it (:func:`biaxial.simulate.usage.gpu_usage`: a
    share holds its consumed memory, a whole-GPU allocation all of it):

    * ``whole_gpus_free``: GPUs no claim holds any of;
    * ``stranded_gpus``: GPUs with **stranded memory**, partly held (by shares) with memory
      left that a whole-GPU or multi-GPU pod cannot use;
    * ``stranded_gib``: that memory, in GiB;
    * ``fragmentation``: its share of all free memory (the simulator's figure: 0 when every
      free byte is on an idle GPU, 1 when no idle GPU is left although memory is free)."""
    models = [ResourceSlice.from_api(s) for s in slices]
    node_names = sorted({str(m.node_name or m.pool.name) for m in models})
    by_name = {(c["metadata"].get("namespace", ""), c["metadata"]["name"]): c for c in claims}
    gpus = gpu_usage(by_name, models, node_names)
    summary = SimulationResult(gpus=gpus, node_names=node_names).summary()
    stranded = [g for g in gpus if not g.mig and g.in_use and g.free_memory > 0]
    return {
        "whole_gpus_free": summary["wholeGpusFree"],
        "stranded_gpus": len(stranded),
        "stranded_gib": sum(g.free_memory for g in stranded) / 2**30,
        "fragmentation": summary["fragmentation"],
    }


def mixed_shape(nodes: int, pods: int, *, seed: int = 42) -> Inventory:
    """``bench.scenarios`` mixed (15 % T4 x 4, 15 % A10G x 4, 45 % A100 x 8, 25 % H100 x 8;
    Deployments of 5-40 replicas) with only :data:`MIXED_SHAPES` and no per-pod policy (the
    annotations are dropped: biaxial uses its defaults, node and GPU binpack). Each pod's
    claims are created just before it, as the scenario's ReplicaSets would."""
    # the scenario's pods whose shape kube-scheduler can express, in order (names are
    # ``<shape>-<deployment>-<replica>``); drawn again with more pods until there are enough
    wanted = pods
    while True:
        scenario = generate_mixed(nodes, wanted, variant="mixed", seed=seed)
        kept = [pc for pc in scenario.pods if _shape_of(pc[0]) in MIXED_SHAPES][:pods]
        if len(kept) == pods:
            break
        wanted = 2 * wanted + 10
    made: list[JSON] = []
    claims: dict[str, list[JSON]] = {}
    for pod_obj, pod_claims in kept:
        meta = pod_obj["metadata"]
        meta.pop("annotations", None)
        meta.pop("uid", None)
        for claim in pod_claims:
            claim["metadata"].pop("uid", None)
        made.append(pod_obj)
        claims[meta["name"]] = pod_claims
    return Inventory(
        workload="mixed",
        nodes=[
            {**n, "metadata": {k: v for k, v in n["metadata"].items() if k != "uid"}}
            for n in scenario.nodes
        ],
        # the scenario's slices name their Node as owner by a made-up uid; the API server
        # gives the seeded Nodes their own, and the garbage collector would delete the slices
        slices=[
            {**sl, "metadata": {k: v for k, v in sl["metadata"].items() if k != "ownerReferences"}}
            for sl in scenario.slices
        ],
        classes=scenario.classes,
        templates=[],
        pods=made,
        claims=claims,
        devices="4-8 GPUs (T4, A10G, A100, H100)",
    )


def _shape_of(pod_obj: JSON) -> str:
    return str(pod_obj["metadata"]["name"]).rsplit("-", 2)[0]


def pattern_pod(pattern: str, replica: int) -> JSON:
    """One replica of the pattern's Deployment as a claim kube-scheduler can allocate: one GPU
    share of 7500 MiB (consumable capacity), the pattern's policy annotations (which only
    biaxial reads)."""
    node_policy, gpu_policy = PATTERNS[pattern]
    made = gpu_pod(f"pattern-{pattern.lower()}-{replica}", "share-7500")
    made["metadata"]["labels"] = {"app": f"pattern-{pattern.lower()}"}
    made["metadata"]["annotations"] = {
        "biaxial.dev/node-policy": node_policy,
        "biaxial.dev/gpu-policy": gpu_policy,
    }
    return made


def patterns_shape() -> Inventory:
    """The reference cluster (``gpu-t4`` 4 x T4, ``gpu-a10g`` 4 x A10G) and the four
    Deployments, run one after the other (each removed before the next)."""
    slices: list[JSON] = []
    for name, profile, _, _ in REFERENCE_NODES:
        slices += _gpu_slices(profile, [name])
    patterns = {
        p: [pattern_pod(p, replica) for replica in range(PATTERN_REPLICAS)] for p in PATTERNS
    }
    share = {"capacity": {"requests": {"memory": f"{PATTERN_MIB}Mi"}}}
    return Inventory(
        workload="four-patterns",
        nodes=[node(name, cpu, memory) for name, _, cpu, memory in REFERENCE_NODES],
        slices=slices,
        classes=_project_classes(GPU_CLASS),
        templates=[template("share-7500", GPU_CLASS, share)],
        pods=[p for replicas in patterns.values() for p in replicas],
        patterns=patterns,
        devices="4 GPUs (T4 / A10G)",
    )


def shape(workload: str, nodes: int, pods: int) -> Inventory:
    """The inventory of ``workload`` (one of :data:`WORKLOADS`)."""
    if workload in BURSTS:
        return upstream_shape(workload, nodes, pods)
    if workload in STEADY:
        return steady_shape(workload, nodes, pods)
    if workload == "churn":
        return churn_shape(nodes, pods)
    if workload == "mixed":
        return mixed_shape(nodes, pods)
    if workload == "four-patterns":
        return patterns_shape()
    raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")

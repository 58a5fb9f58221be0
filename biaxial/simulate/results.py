"""What ``biaxial simulate`` reports: placements, failures, preemptions, per-GPU use, and the
summary with its fragmentation figure (see :mod:`biaxial.simulate.simulator`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from driver.api.model import JSON
from driver.scheduling.policy import PodPolicies, PolicyDefaults
from kubeapi import codec

# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class PodPlacement:
    pod: str
    node: str
    devices: tuple[JSON, ...]
    policies: PodPolicies = field(default_factory=lambda: PodPolicies("binpack", "binpack"))


@dataclass(frozen=True, slots=True)
class PodFailure:
    pod: str
    reason: str


@dataclass(frozen=True, slots=True)
class PodPreemption:
    """A pending pod that fits nowhere would fit on ``node`` once ``victims`` (running pods,
    most important first) were preempted; nothing is performed."""

    pod: str
    node: str
    victims: tuple[str, ...]
    violations: int  # victims a PodDisruptionBudget protects


@dataclass(frozen=True, slots=True)
class PartitionUsage:
    """A MIG partition: exclusive, so in use or not. On a dynamic-MIG GPU, one the decisions
    took (the plugin would create it), with its first memory slice and size."""

    device: str
    profile: str
    memory: int
    pods: tuple[str, ...]
    start: int | None = None
    size: int = 0


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One physical GPU. A GPU in MIG mode has ``partitions`` (and its memory is theirs)."""

    node: str
    device: str
    uuid: str
    product: str
    memory: int
    memory_used: int
    cores: int
    cores_used: int
    pods: tuple[tuple[str, int], ...]  # (pod, memory bytes), whole-GPU use
    partitions: tuple[PartitionUsage, ...] = ()
    # Dynamic MIG only: the GPU's memory slices, those no partition covers, and the largest
    # profile still placeable.
    memory_slices: int = 0
    free_slices: int = 0
    largest_placeable: str = ""

    @property
    def mig(self) -> bool:
        return bool(self.partitions)

    @property
    def dynamic(self) -> bool:
        return self.memory_slices > 0

    @property
    def free_memory(self) -> int:
        """Free memory; on a cut dynamic-MIG GPU, its free memory slices' share of it."""
        if self.partitions and self.dynamic:
            return self.memory * self.free_slices // self.memory_slices
        return self.memory - self.memory_used

    @property
    def in_use(self) -> bool:
        return bool(self.pods) or any(p.pods for p in self.partitions)

    @property
    def pod_names(self) -> tuple[str, ...]:
        names = [p for p, _ in self.pods] + [p for part in self.partitions for p in part.pods]
        return tuple(dict.fromkeys(names))


@dataclass(slots=True)
class SimulationResult:
    placements: list[PodPlacement] = field(default_factory=list)
    unschedulable: list[PodFailure] = field(default_factory=list)
    skipped: list[PodFailure] = field(default_factory=list)
    preemptions: list[PodPreemption] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: (namespace/name, what the admission step changed), with ``admission`` given
    admissions: list[tuple[str, str]] = field(default_factory=list)
    gpus: list[GpuUsage] = field(default_factory=list)
    node_names: list[str] = field(default_factory=list)
    objects: list[JSON] = field(default_factory=list)
    running: int = 0
    startup_seconds: float = 0.0
    decision_seconds: float = 0.0
    durations: list[float] = field(default_factory=list)
    policies: PolicyDefaults = field(default_factory=PolicyDefaults)

    # ------------------------------------------------------------------ summary
    def policies_used(self) -> dict[str, int]:
        """``"node <policy>, GPU <policy>"`` -> number of placed pods that got it."""
        counts = Counter(f"node {p.policies.node}, GPU {p.policies.gpu}" for p in self.placements)
        return dict(sorted(counts.items()))

    def summary(self) -> JSON:
        by_node: dict[str, list[GpuUsage]] = {name: [] for name in self.node_names}
        for gpu in self.gpus:
            by_node.setdefault(gpu.node, []).append(gpu)
        nodes = []
        for name in self.node_names:
            gpus = by_node[name]
            memory = sum(g.memory for g in gpus)
            used = sum(g.memory_used for g in gpus)
            nodes.append(
                {
                    "node": name,
                    "gpus": len(gpus),
                    "gpusInUse": sum(1 for g in gpus if g.in_use),
                    "pods": len({p for g in gpus for p in g.pod_names}),
                    "memoryBytes": memory,
                    "memoryUsedBytes": used,
                    "memoryUtilisation": round(used / memory, 4) if memory else 0.0,
                }
            )
        whole = [g for g in self.gpus if not g.mig]
        counted = [g for g in self.gpus if not g.mig or g.dynamic]
        free_total = sum(g.free_memory for g in counted)
        free_partial = sum(g.free_memory for g in counted if g.in_use)
        dynamic = [g for g in self.gpus if g.dynamic]
        decisions = len(self.durations)
        ordered = sorted(self.durations)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
        return {
            "pods": len(self.placements) + len(self.unschedulable),
            "placed": len(self.placements),
            "unschedulable": len(self.unschedulable),
            "skipped": len(self.skipped),
            "running": self.running,
            "nodesUsed": len({p.node for p in self.placements}),
            "gpus": [_gpu_json(g) for g in self.gpus],
            "gpusInUse": sum(1 for g in self.gpus if g.in_use),
            "wholeGpusFree": sum(1 for g in whole if not g.in_use),
            "migPartitionsFree": sum(
                1 for g in self.gpus for part in g.partitions if not part.pods
            ),
            **(
                {
                    "mig": {
                        "dynamicGpus": len(dynamic),
                        "partitions": sum(len(g.partitions) for g in dynamic),
                        "memorySlices": sum(g.memory_slices for g in dynamic),
                        "freeMemorySlices": sum(g.free_slices for g in dynamic),
                        "freeMemorySlicesOnCutGpus": sum(
                            g.free_slices for g in dynamic if g.partitions
                        ),
                    }
                }
                if dynamic
                else {}
            ),
            "fragmentation": round(free_partial / free_total, 4) if free_total else 0.0,
            "policies": {
                "defaults": {"node": self.policies.node, "gpu": self.policies.gpu},
                "used": self.policies_used(),
            },
            "nodes": nodes,
            "timing": {
                "startupSeconds": round(self.startup_seconds, 6),
                "decisionSeconds": round(self.decision_seconds, 6),
                "podsPerSecond": round(decisions / self.decision_seconds, 1)
                if self.decision_seconds > 0
                else 0.0,
                "p99DecisionMs": round(p99 * 1000, 3),
            },
        }

    def to_json(self) -> JSON:
        summary = self.summary()
        return {
            "placements": [
                {
                    "pod": p.pod,
                    "node": p.node,
                    "policies": {"node": p.policies.node, "gpu": p.policies.gpu},
                    "devices": [dict(d) for d in p.devices],
                }
                for p in self.placements
            ],
            "unschedulable": [{"pod": f.pod, "reason": f.reason} for f in self.unschedulable],
            "skipped": [{"pod": f.pod, "reason": f.reason} for f in self.skipped],
            "preemptions": [
                {
                    "pod": p.pod,
                    "node": p.node,
                    "victims": list(p.victims),
                    "budgetViolations": p.violations,
                }
                for p in self.preemptions
            ],
            "notes": list(self.notes),
            "admission": [{"pod": pod, "changed": note} for pod, note in self.admissions],
            "summary": summary,
            "objects": codec.copy(self.objects),
        }


def _gpu_json(g: GpuUsage) -> JSON:
    out: JSON = {
        "node": g.node,
        "device": g.device,
        "uuid": g.uuid,
        "productName": g.product,
        "memoryBytes": g.memory,
        "memoryUsedBytes": g.memory_used,
        "coresUsed": g.cores_used,
        "pods": list(g.pod_names),
    }
    if g.dynamic:
        out["memorySlices"] = g.memory_slices
        out["freeMemorySlices"] = g.free_slices
        out["largestPlaceable"] = g.largest_placeable or None
    if g.partitions:
        out["migPartitions"] = [
            {
                "device": p.device,
                "profile": p.profile,
                "memoryBytes": p.memory,
                "pods": list(p.pods),
                **({"start": p.start, "size": p.size} if p.start is not None else {}),
            }
            for p in g.partitions
        ]
    return out

"""What the decision engine's rooms share: one pod's context, one node's outcome, the best
node so far, and the engine's counters.

The engine (:mod:`driver.scheduling.decision`) builds a :class:`PodContext` once per pod
(everything about the pod that does not depend on the node), evaluates nodes into
:class:`NodeOutcome` values, and keeps the best as a :class:`Best`. Its pruned node search
(:mod:`driver.scheduling.search`) and its preemption dry run
(:mod:`driver.scheduling.dryrun`) read these types and hand them back to the engine; only
the engine fills them. Values here compute nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, NamedTuple

from driver.api.claims import AllocationResult, ResourceClaim
from driver.api.nodes import Node
from driver.scheduling.bounds import Demand, ShapeBounds
from driver.scheduling.bridge import BridgeClaim, PodLegacyResources
from driver.scheduling.capacity_index import DeviceKind
from driver.scheduling.nodefit import PodSchedulingFacts
from driver.scheduling.podindex import ScheduledPod
from driver.scheduling.policy import PodPolicies
from driver.scheduling.rules import PodRules
from driver.scheduling.scoring import Rank
from driver.scheduling.storage import VolumeBindings
from driver.scheduling.volumes import PodVolumeContext

ZERO: Final = Fraction(0)


class BridgeKey(NamedTuple):
    """What sets one node's variant of the bridge claim apart: the legacy resources DRA
    serves there, and the GPU memory a percentage is taken of."""

    dra_resources: frozenset[str]
    gpu_memory: int | None


class BridgeVariant(NamedTuple):
    """The bridge claim for one node variant: the KEP-5004 object and its claim model."""

    bridge: BridgeClaim
    claim: ResourceClaim


class UsableKinds(NamedTuple):
    """The device kinds one request alternative may use (its class selects them and no
    selector rules them out), and whether that holds for every device of those kinds."""

    kinds: frozenset[DeviceKind]
    certain: bool


@dataclass(slots=True)
class PodContext:
    """Everything about one pod that does not depend on the node (parsed once)."""

    name: str
    pod: Mapping[str, Any]
    facts: PodSchedulingFacts
    scheduled: ScheduledPod
    rules: PodRules | None
    policies: PodPolicies
    legacy: PodLegacyResources
    user_claims: tuple[ResourceClaim, ...]
    to_allocate: tuple[ResourceClaim, ...]
    allocated_claims: tuple[ResourceClaim, ...]
    bridge_cache: dict[BridgeKey, BridgeVariant | None] = field(default_factory=dict)
    demand: Demand | None = None
    legacy_resources: frozenset[str] = frozenset()
    exempt: frozenset[str] = frozenset()  # resources the node filter leaves to DRA
    kinds: tuple[tuple[UsableKinds, ...], ...] = ()  # per request, per alternative
    shape_bounds: dict[int, ShapeBounds] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    volumes: PodVolumeContext | None = None  # None: no volume the volume rules look at


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """The pod on one node: its score, allocations, bridge variant and volume bindings."""

    score: Fraction  # the node score (two axes, or cpu/memory for a pod without devices)
    results: tuple[AllocationResult, ...]
    bridge: BridgeVariant | None
    volumes: VolumeBindings | None = None
    penalty: Fraction = ZERO  # the soft rules' weighted penalty
    tie: Fraction = ZERO  # the System default spreading's penalty (ties only)


@dataclass(frozen=True, slots=True)
class Best:
    """The best node found so far: its rank (smaller is better), outcome and node."""

    rank: Rank
    outcome: NodeOutcome
    node: Node


@dataclass(slots=True)
class DecisionStats:
    """Counters across decisions (for benchmarks, tests and metrics)."""

    decisions: int = 0
    nodes_evaluated: int = 0
    allocator_calls: int = 0
    search_steps: int = 0
    seconds: float = 0.0
    rebuilds: int = 0
    rebuild_seconds: float = 0.0
    updates: int = 0  # node and node-local slice changes applied node by node
    landed: int = 0  # observations recognised as an assumed placement's (nothing moved)
    preemptions: int = 0  # preemption dry runs
    preemption_seconds: float = 0.0
    victim_checks: int = 0  # "does it fit with these pods gone?" questions asked
    verdicts_reused: int = 0  # victim searches answered by an equivalent node's search

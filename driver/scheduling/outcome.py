"""What a decision says: the pod fits (:class:`Placement`), fits nowhere (:class:`Unschedulable`,
with kube-scheduler's per-node reasons) or is itself invalid (:class:`PodError`); and what a
preemption dry run says: the victims to evict (:class:`Preemption`) or why none
(:class:`NoPreemption`).

Outcomes are immutable values; nothing here computes. The ``REASON_*`` strings are the
per-node reasons the engine and its index precheck give for the device dimension, worded as
kube-scheduler words its own (``unschedulable_message`` turns the histogram into its text).
:class:`PreFilterRejectedError` is how a rule says that no node can take the pod before any node is
looked at (kube-scheduler's PreFilter rejections).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, NamedTuple

from driver.api.claims import AllocationResult, ResourceClaim
from driver.api.errors import BiaxialError
from driver.api.ids import NodeName
from driver.scheduling.bridge import BridgeClaim
from driver.scheduling.policy import PodPolicies
from driver.scheduling.preemption import PodOnNode
from driver.scheduling.storage import VolumeBindings

REASON_NO_GPUS: Final = "node(s) had no GPUs"
REASON_GPU_MEMORY: Final = "insufficient GPU memory"
REASON_GPU_CORES: Final = "insufficient GPU cores"
REASON_FREE_GPUS: Final = "insufficient free GPUs"
REASON_CLAIMS: Final = "cannot allocate all claims"
REASON_CLAIM_NODE: Final = "resourceclaim not available on the node"


class PreFilterRejectedError(BiaxialError):
    """No node can take the pod, for a reason found before any node is looked at (a
    kube-scheduler PreFilter plugin's ``UnschedulableAndUnresolvable``); the message is the
    rule's, and the decision is :class:`Unschedulable` with ``0/N nodes are available:
    <message>.``"""


class ClaimAllocation(NamedTuple):
    """One of the pod's claims and the allocation the decision gives it."""

    claim: ResourceClaim
    allocation: AllocationResult


@dataclass(frozen=True, slots=True)
class Placement:
    """The pod fits: its node, the allocation of each claim (pod claims in order, then the
    bridge claim), the score that won, and what its volumes need written first (None: every
    claim of the pod is bound already, or it has none)."""

    pod: str
    node: NodeName
    claims: tuple[ClaimAllocation, ...]
    bridge: BridgeClaim | None
    bridge_allocation: AllocationResult | None
    score: Fraction
    policies: PodPolicies
    evaluated: int = 0
    volumes: VolumeBindings | None = None

    @property
    def all_results(self) -> tuple[AllocationResult, ...]:
        out = [a for _, a in self.claims]
        if self.bridge_allocation is not None:
            out.append(self.bridge_allocation)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class Unschedulable:
    """No node fits; ``message`` is kube-scheduler's wording, ``reasons`` the histogram."""

    pod: str
    message: str
    reasons: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PodError:
    """The pod's own input is invalid (unknown class, bad CEL, unknown policy, ...)."""

    pod: str
    message: str


@dataclass(frozen=True, slots=True)
class Preemption:
    """The pod fits nowhere as the cluster is, but fits on ``node`` once ``victims`` (lower
    priority, most important first) are gone: ``violations`` of them are protected by a
    PodDisruptionBudget; ``placement`` is where it would then go on that node (what a
    nomination holds for it); ``candidates``: the nodes where preemption would help that the
    dry run examined."""

    pod: str
    node: str
    victims: tuple[PodOnNode, ...]
    violations: int
    placement: Placement
    candidates: int


@dataclass(frozen=True, slots=True)
class NoPreemption:
    """Preemption would not help (or is not allowed): ``message`` says why, as upstream's
    ``preemption: ...`` suffix of ``FailedScheduling``."""

    pod: str
    message: str


Decision = Placement | Unschedulable | PodError

"""Pods that are the same to the decision engine get the same "does not fit" while nothing
changed: a flood of a thousand replicas that fit nowhere costs one decision, not a thousand.

kube-scheduler keeps per-pod work cheap with pod *signatures* (opportunistic batching reuses
one pod's filtering for the next pod that has the same signature); biaxial uses the same idea
for the one answer that is safe to reuse, :class:`~driver.scheduling.outcome.Unschedulable`.

:func:`pod_signature` is everything a decision reads about a pod, with the names that differ
between replicas left out: namespace, labels, annotations, spec (less the names of the claims
it references), status (less the conditions the controller writes itself and the names of the
pod's generated claims), and the *spec* of each claim in ``spec.resourceClaims`` order (a claim
from a template is named after its pod).
It is ``None`` (never shared) when something else could set two such pods apart: an allocated
or reserved claim, a claim being deleted, a KEP-5004 bridge claim left from an earlier attempt,
or a volume backed by a claim (PVCs and PVs are state the feed does not version).

:class:`UnschedulableMemo` keeps, for the engine generation it was filled at
(:attr:`controller.feed.EngineFeed.generation`, which moves whenever anything the engine
counts changes), the unschedulable answer per signature; another generation empties it first.
So it never outlives a change, and holds at most one entry per distinct pod shape seen since.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from controller.api import meta
from driver.scheduling.outcome import Unschedulable
from kubeapi import codec

_OWN_STATUS: Final = frozenset({"conditions", "resourceClaimStatuses"})


def pod_signature(pod: Mapping[str, Any], claims: Sequence[Mapping[str, Any] | None]) -> str | None:
    """The pod's signature (see the module docstring); ``claims`` are the raw objects of its
    claims in ``spec.resourceClaims`` order. None when the pod must be decided on its own."""
    spec = pod.get("spec") or {}
    for volume in spec.get("volumes") or ():
        if "persistentVolumeClaim" in volume or "ephemeral" in volume:
            return None
    status = pod.get("status") or {}
    if status.get("extendedResourceClaimStatus"):
        return None
    claim_specs = []
    for claim in claims:
        if claim is None or meta(claim).get("deletionTimestamp"):
            return None
        claim_status = claim.get("status") or {}
        if claim_status.get("allocation") or claim_status.get("reservedFor"):
            return None
        claim_specs.append(claim.get("spec"))
    m = meta(pod)
    refs = [
        {k: v for k, v in ref.items() if k != "resourceClaimName"}
        for ref in spec.get("resourceClaims") or ()
    ]
    shape = [
        m.get("namespace") or "default",
        m.get("labels") or {},
        m.get("annotations") or {},
        {**spec, "resourceClaims": refs},
        {k: v for k, v in status.items() if k not in _OWN_STATUS},
        claim_specs,
    ]
    # At any depth: a pod nested 1,000 levels deep (which the API server stores) is that pod's
    # problem, reported on it, never a RecursionError in the scheduling loop.
    return codec.dumps(shape).decode()


class UnschedulableMemo:
    """Unschedulable answers per pod signature, valid for one engine generation."""

    def __init__(self) -> None:
        self._generation = -1
        self._answers: dict[str, Unschedulable] = {}
        self.hits = 0

    def get(self, signature: str | None, generation: int, pod: str) -> Unschedulable | None:
        """The answer for ``signature`` at ``generation``, addressed to ``pod``."""
        if signature is None or generation != self._generation:
            return None
        found = self._answers.get(signature)
        if found is None:
            return None
        self.hits += 1
        return Unschedulable(pod=pod, message=found.message, reasons=found.reasons)

    def put(self, signature: str | None, generation: int, answer: Unschedulable) -> None:
        if signature is None:
            return
        if generation != self._generation:
            self._answers.clear()
            self._generation = generation
        self._answers[signature] = answer

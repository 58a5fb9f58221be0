"""Acting on a preemption decision: nominate the pod, evict its victims, and undo the nomination
when that fails.

The decision engine says which lower-priority pods must go and where the pod would then fit
(:meth:`~driver.scheduling.decision.DecisionEngine.preempt`); :class:`Evictor` performs it as
kube-scheduler's DefaultPreemption does (``prepareCandidate`` and ``PreemptPod``):

1. **nominate**: ``status.nominatedNodeName`` of the preemptor (a merge patch of
   ``pods/status``), so that every scheduler (this one through its engine, kube-scheduler
   through its nominator) holds the freed resources for it against pods of equal or lower
   priority;
2. for each victim not already terminating: the ``DisruptionTarget`` condition
   (``status: "True"``, reason ``PreemptionByScheduler``, message ``<scheduler>: preempting to
   accommodate a higher priority pod``) by a strategic-merge patch of its status, then
   **delete** it with its own grace period, conditional on its UID (a pod recreated under the
   same name is never deleted for an old decision); a victim already gone counts as evicted;
3. events: ``Preempted`` on each victim (``Preempted by pod <uid> on node <node>``, as
   upstream) and ``Preempting`` on the preemptor (which pods, on which node).

Crash safety: every step is idempotent and the decision is recomputed after a restart from
what the cluster shows. A victim that already carries a ``deletionTimestamp`` is never deleted
again (upstream skips it too), and while one terminates on the pod's nominated node the pod
does not preempt again (:func:`terminating_victims`: upstream's ``PodEligibleToPreemptOthers``),
nor while a victim that is gone still holds devices there because the deallocator has not yet
released its claims (:func:`releasing_claims`: the pod would otherwise count those devices as
taken and choose further victims), so one decision never deletes a victim twice, and a
controller killed between the steps converges: the nomination is read back from the pod, and
victims not yet deleted are chosen again by the next dry run only if they are still needed.
Nothing is allocated here, so no device can be given twice.

If a write fails (other than NotFound), the nomination is cleared (``nominatedNodeName``
removed) and the pod goes back to the queue with a backoff. ``on_step`` is called after the
nomination (``nominate``) and after each deletion (``evict``) with the pod's key; tests raise
from it to simulate a crash there.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from controller.api import JSON, PODS, Api, meta, object_key
from controller.commit import PodRef, StepHook
from controller.events import Recorder, now_rfc3339
from driver.api.errors import ApiError, BiaxialError, NotFoundError
from driver.api.nodes import Node, node_selector_matches
from driver.scheduling.outcome import Preemption
from driver.scheduling.preemption import pod_priority

log = logging.getLogger(f"biaxial.{__name__}")

DISRUPTION_TARGET: Final = "DisruptionTarget"
REASON_PREEMPTION: Final = "PreemptionByScheduler"
EVENT_PREEMPTED: Final = "Preempted"
EVENT_PREEMPTING: Final = "Preempting"
NOT_ELIGIBLE_TERMINATING: Final = (
    "preemption: not eligible due to a terminating pod on the nominated node."
)
NOT_ELIGIBLE_RELEASING: Final = (
    "preemption: not eligible while the devices of pods gone from the nominated node are "
    "being released."
)
_FINISHED: Final = frozenset({"Succeeded", "Failed"})


def nominated_node(pod: Mapping[str, Any]) -> str | None:
    """``status.nominatedNodeName`` (None when unset or empty)."""
    return (pod.get("status") or {}).get("nominatedNodeName") or None


def terminating_by_preemption(pod: Mapping[str, Any]) -> bool:
    """Upstream ``podTerminatingByPreemption``: being deleted, with ``DisruptionTarget=True``
    for reason ``PreemptionByScheduler``."""
    if not meta(pod).get("deletionTimestamp"):
        return False
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == DISRUPTION_TARGET:
            return bool(
                condition.get("status") == "True" and condition.get("reason") == REASON_PREEMPTION
            )
    return False


def terminating_victims(pod: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a pod of lower priority than ``pod`` terminates by preemption on ``pod``'s
    nominated node (then it does not preempt again: upstream ``PodEligibleToPreemptOthers``)."""
    node = nominated_node(pod)
    if node is None:
        return False
    priority = pod_priority(pod)
    for other in pods:
        if (other.get("spec") or {}).get("nodeName") != node:
            continue
        try:
            lower = pod_priority(other) < priority
        except BiaxialError:
            continue
        if lower and terminating_by_preemption(other):
            return True
    return False


def live_pod_uids(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """The UIDs of the pods that exist and have not finished (what can still use a claim)."""
    return {
        str(meta(p).get("uid") or "")
        for p in pods
        if (p.get("status") or {}).get("phase") not in _FINISHED
    }


def releasing_claims(
    node: Node, claims: Iterable[Mapping[str, Any]], live: Collection[str], finalizer: str
) -> list[str]:
    """The claims this controller allocated on ``node`` (they carry ``finalizer``) whose
    devices are on their way back: still allocated, and no pod of ``live`` (UIDs) reserves
    them any more. The deallocator releases them (:mod:`controller.deallocate`); until it
    has, a victim that is gone still holds its devices, so a pod nominated there does not
    preempt again (upstream ``PodEligibleToPreemptOthers``: not while what an earlier
    preemption freed is still on its way)."""
    found = []
    for claim in claims:
        if finalizer not in (meta(claim).get("finalizers") or ()):
            continue
        status = claim.get("status") or {}
        allocation = status.get("allocation")
        if not allocation:
            continue
        selector = allocation.get("nodeSelector")
        if not selector or not node_selector_matches(selector, node):
            continue
        reserved = [str(r.get("uid") or "") for r in status.get("reservedFor") or ()]
        if not any(uid in live for uid in reserved):
            found.append(object_key(claim))
    return found


async def _noop(_step: str, _key: str) -> None:
    return None


class Evictor:
    """Performs preemptions (see the module docstring)."""

    def __init__(
        self,
        api: Api,
        recorder: Recorder,
        *,
        scheduler_name: str,
        on_step: StepHook | None = None,
    ) -> None:
        self.api = api
        self.recorder = recorder
        self.scheduler_name = scheduler_name
        self._on_step = on_step or _noop

    async def nominate(self, pod: PodRef, node: str | None) -> None:
        """Set (or with None, clear) the pod's ``status.nominatedNodeName``."""
        await self.api.patch(
            PODS,
            pod.name,
            {"status": {"nominatedNodeName": node}},
            namespace=pod.namespace,
            subresource="status",
            patch_type="merge",
        )

    async def clear(self, pod: PodRef) -> None:
        """Clear the nomination, best effort (the pod may be gone)."""
        try:
            await self.nominate(pod, None)
        except ApiError as exc:
            log.warning("pod %s: could not clear nominatedNodeName: %s", pod.key, exc)

    async def preempt(
        self, pod: PodRef, preemption: Preemption, current: Mapping[str, JSON]
    ) -> int:
        """Nominate ``pod`` and evict the victims; ``current``: the victims' pods as the cache
        shows them now (by UID; a missing one is gone already). Returns how many were deleted
        by this call. Raises ApiError when a write failed (the caller clears the
        nomination)."""
        await self.nominate(pod, preemption.node)
        await self._on_step("nominate", pod.key)
        deleted = 0
        for victim in preemption.victims:
            raw = current.get(victim.uid)
            if raw is None or meta(raw).get("deletionTimestamp"):
                continue  # gone, or already terminating: never deleted twice
            ref = PodRef(victim.namespace, victim.name, victim.uid)
            if await self._evict(ref):
                await self._on_step("evict", ref.key)
                deleted += 1
                await self.recorder.event(
                    ref,
                    "Normal",
                    EVENT_PREEMPTED,
                    f"Preempted by pod {pod.uid} on node {preemption.node}",
                )
        names = ", ".join(f"{v.namespace}/{v.name}" for v in preemption.victims)
        await self.recorder.event(
            pod,
            "Normal",
            EVENT_PREEMPTING,
            f"Preempting {len(preemption.victims)} pod(s) on node {preemption.node}: {names}",
        )
        return deleted

    async def _evict(self, victim: PodRef) -> bool:
        """DisruptionTarget, then delete with the pod's grace period; False when it was gone."""
        condition: JSON = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": REASON_PREEMPTION,
            "message": f"{self.scheduler_name}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": now_rfc3339(),
        }
        try:
            await self.api.patch(
                PODS,
                victim.name,
                {"status": {"conditions": [condition]}},
                namespace=victim.namespace,
                subresource="status",
                patch_type="strategic",
            )
            await self.api.delete(PODS, victim.name, victim.namespace, uid=victim.uid)
        except NotFoundError:
            log.info("victim %s is already gone", victim.key)
            return False
        log.info("victim %s deleted by preemption", victim.key, extra={"pod": victim.key})
        return True

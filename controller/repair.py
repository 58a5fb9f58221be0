"""Repairing what an interrupted placement attempt left behind, before its pod is tried again.

A crash or a rollback that could not finish (see :mod:`controller.commit`) can leave, for a
pod that is not bound: claims this controller allocated and reserved for it, and KEP-5004
bridge claims it created for it. Until repaired they hold their devices (the engine counts
every allocated claim), so nothing is ever given twice; the pod is not retried on top of them.

:class:`Repairer` follows the bridge claims per owning pod from the claim informer.
:meth:`Repairer.stale` says whether a pod has leftovers (a bridge claim, or a claim with our
finalizer reserved for it); :meth:`Repairer.repair` then *fences* the pod before it releases
anything: a strategic-merge patch of ``pods/status`` (``PodScheduled=False``, reason
``SchedulerError``, saying what is released) carrying as precondition the resourceVersion of
the pod this controller's cache shows unbound. Only when that write is accepted does it delete
the bridge claims and release the reservations and allocations (and our finalizer) of the
pod's claims.

Why the fence: the attempt that left those claims may still bind the pod: a crashed or deposed
controller's binding can be in flight and land at any time. Every binding carries the
resourceVersion its placement was decided on as precondition (:mod:`controller.commit`), and
the fence moves the pod past it (its message names the resourceVersion it replaces, so the
write is never a no-op that would leave the resourceVersion where it was). So either that
binding landed first (the fence fails with a 409 and nothing is released: the pod is bound
with its claims allocated and reserved) or it is refused. A released allocation can therefore
never belong to a pod that gets bound, which upstream requires: a pod is bound only once its
claims are allocated and reserved for it, and an allocation is never removed while a bound pod
reserves it.

It is idempotent; anything it cannot do now is retried on the pod's next attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from controller.api import JSON, PODS, Api, meta, object_key, pod_is_finished
from controller.cache import ClusterCache
from controller.commit import CommitAbortedError, Committer, PodRef, has_finalizer
from controller.metrics import Metrics
from driver.api.errors import ApiError, ConflictError, NotFoundError
from driver.scheduling.bridge import bridge_claim_owner, is_bridge_claim
from kubeapi.events import now_rfc3339

log = logging.getLogger(f"biaxial.{__name__}")


class Repairer:
    """See the module docstring."""

    def __init__(
        self,
        api: Api,
        cache: ClusterCache,
        committer: Committer,
        metrics: Metrics,
        *,
        finalizer: str,
    ) -> None:
        self.api = api
        self.cache = cache
        self.committer = committer
        self.metrics = metrics
        self.finalizer = finalizer
        self._bridges: dict[str, set[str]] = {}  # pod uid -> bridge claim keys
        cache.subscribe(self._on_event)

    def _on_event(self, kind: str, _etype: str, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        if obj is None:  # a malformed node, slice or class (stored as None): nothing here
            return
        if kind == "Pod":
            if new is None or pod_is_finished(new):
                self._bridges.pop(str(meta(obj).get("uid") or ""), None)
            return
        owner = bridge_claim_owner(obj) if kind == "ResourceClaim" else None
        if owner is None:
            return
        if new is None:
            self._bridges.get(owner, set()).discard(object_key(obj))
        else:
            self._bridges.setdefault(owner, set()).add(object_key(obj))

    def stale(self, ref: PodRef, keys: Iterable[str]) -> bool:
        """Whether an earlier attempt left something for this pod (``keys``: its claims)."""
        if self._bridges.get(ref.uid):
            return True
        for key in keys:
            claim = self._ours(key)
            if claim is not None and any(
                r.get("uid") == ref.uid
                for r in (claim.get("status") or {}).get("reservedFor") or ()
            ):
                return True
        return False

    def _ours(self, key: str) -> JSON | None:
        """The claim, when this controller allocated it (it carries our finalizer)."""
        claim = self.cache.overlay.get(key)
        return claim if claim is not None and has_finalizer(claim, self.finalizer) else None

    async def fence(self, ref: PodRef, resource_version: str) -> str | None:
        """Write to the pod on the condition that it is still at ``resource_version``, so that
        no binding decided on that version or an earlier one can land any more; returns the
        pod's new resourceVersion, None when the pod changed (or is gone) meanwhile."""
        condition: JSON = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "SchedulerError",
            "message": (
                "an interrupted scheduling attempt left claims reserved for this pod; "
                f"releasing them (pod resourceVersion {resource_version}) and trying again"
            ),
            "lastTransitionTime": now_rfc3339(),
        }
        body: JSON = {
            "metadata": {"resourceVersion": resource_version},
            "status": {"conditions": [condition]},
        }
        try:
            written = await self.api.patch(
                PODS,
                ref.name,
                body,
                namespace=ref.namespace,
                subresource="status",
                patch_type="strategic",
            )
        except (ConflictError, NotFoundError):
            return None  # bound (or otherwise changed) or deleted meanwhile: look again later
        return str(meta(written).get("resourceVersion") or "")

    async def repair(self, ref: PodRef, keys: Iterable[str], resource_version: str) -> str | None:
        """Release what an earlier attempt left for this pod, which the cache shows unbound at
        ``resource_version``. Returns the pod's resourceVersion after the fence (the one its
        next binding must carry); None: try later."""
        fenced = await self.fence(ref, resource_version)
        if fenced is None:
            return None
        log.info(
            "pod %s: releasing what an interrupted attempt left behind",
            ref.key,
            extra={"pod": ref.key},
        )
        try:
            for key in sorted(self._bridges.get(ref.uid, ())):
                claim = self.cache.claims.get(key)
                if claim is None or is_bridge_claim(claim, ref.name, ref.uid):
                    await self.committer.delete_claim(key)
                    self.metrics.deallocations.labels(action="delete-bridge").inc()
            self._bridges.pop(ref.uid, None)
            for key in keys:
                if self._ours(key) is None:
                    continue
                if await self.committer.unreserve(key, ref.uid, deallocate=True) is not None:
                    await self.committer.remove_finalizer(key)
                    self.metrics.deallocations.labels(action="unreserve").inc()
        except (CommitAbortedError, ApiError) as exc:
            log.warning(
                "pod %s: repair failed (%s); will retry", ref.key, exc, extra={"pod": ref.key}
            )
            return None
        return fenced

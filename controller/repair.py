"""Repairing what an interrupted placement attempt left behind, before its pod is tried again.

A crash or a rollback that could not finish (see :mod:`controller.commit`) can leave, for a
pod that is not bound: claims this controller allocated and reserved for it, and KEP-5004
bridge claims it created for it. Until repaired they hold their devices (the engine counts
every allocated claim), so nothing is ever given twice; the pod is not retried on top of them.

:class:`Repairer` follows the bridge claims per owning pod from the claim informer.
:meth:`Repairer.stale` says whether a pod has leftovers (a bridge claim, or a claim with our
finalizer reserved for it); :meth:`Repairer.repair` first confirms with a live GET that the pod
still exists, has the same UID and is unbound (the cache may be behind), then deletes the
bridge claims and releases the reservations and allocations (and our finalizer) of the pod's
claims. It is idempotent; anything it cannot do now is retried on the pod's next attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from controller.api import JSON, PODS, Api, meta, object_key, pod_is_finished, pod_node
from controller.cache import ClusterCache
from controller.commit import CommitAbortedError, Committer, PodRef, has_finalizer
from controller.metrics import Metrics
from driver.api.errors import ApiError, NotFoundError
from driver.scheduling.bridge import bridge_claim_owner, is_bridge_claim

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
        assert obj is not None
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

    async def repair(self, ref: PodRef, keys: Iterable[str]) -> bool:
        """Release what an earlier attempt left for this unbound pod. False: try later."""
        try:
            live = await self.api.get(PODS, ref.name, ref.namespace)
        except NotFoundError:
            return False
        if str(meta(live).get("uid")) != ref.uid or pod_node(live):
            return False  # the cache is behind: the pod changed or is bound
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
            return False
        return True

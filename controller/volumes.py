"""Binding a placement's volumes before its pod (what kube-scheduler's VolumeBinding PreBind
does), and waiting until the PV controller and the provisioner have bound them.

:meth:`VolumeBinder.write` makes the writes of a placement's
:class:`~driver.scheduling.volumes.VolumeBindings`, after its device claims are written:

* **static bindings**: the PV's ``spec.claimRef`` names the claim (namespace, name, UID), with
  ``pv.kubernetes.io/bound-by-controller`` unless the PV was pre-bound to it by its user
  (``GetBindVolumeToClaim``); one merge patch per PV carrying the resourceVersion read
  (step ``volume-binding``). The PV controller then binds the claim;
* **dynamic provisioning**: ``volume.kubernetes.io/selected-node: <node>`` on the claim, one
  merge patch with the resourceVersion read, none when the claim already names the node (an
  earlier attempt wrote it) (step ``selected-node``). The provisioner then creates the PV.

:meth:`VolumeBinder.wait` then waits, without holding a write slot, until every one of those
claims is bound (``spec.volumeName`` and ``pv.kubernetes.io/bind-completed``), reading the
watch caches (no API call) on every change of a claim, PV, pod or node, as upstream's
``checkBindings``: it fails when the pod is gone, a PV's ``claimRef`` was reset, the selected
node was removed from a claim (``provisioning failed for PVC "x"``: the provisioner's signal to
reschedule), a bound PV does not accept the node, or ``timeout_s`` passes.

A failure is a :class:`VolumeBindingError` worded as kube-scheduler words it (``running
PreBind plugin "VolumeBinding": binding volumes: ...``): the committer rolls back what the
attempt wrote to device claims, and the pod is retried with backoff and told why. What was
written to PVs and claims stays, as upstream leaves it: a PV whose ``claimRef`` names a claim is
bound to it by the PV controller anyway, and a claim keeps its selected node until the
provisioner removes it on failure; the next attempt for the pod finds them (the claim bound to
that PV, or pinned to that node) and goes on from there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from controller.api import JSON, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, Api, meta
from controller.cache import ClusterCache, rv_int
from controller.commit import RETRY, CommitAbortedError, Plan
from controller.prebind import wait_until_ready
from driver.api.errors import BiaxialError, NotFoundError
from driver.scheduling.storage import (
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_SELECTED_NODE,
    PersistentVolume,
    volume_node_affinity_matches,
)

log = logging.getLogger(f"biaxial.{__name__}")

_WATCHED = frozenset({"PersistentVolumeClaim", "PersistentVolume", "Pod", "Node"})

#: The resourceVersion each written object must at least reach in the caches before the wait
#: trusts them: ``("PersistentVolume" | "PersistentVolumeClaim", key) -> resourceVersion``.
Written = dict[tuple[str, str], int]


class VolumeBindingError(CommitAbortedError):
    """The placement's volumes could not be bound (the message says why, for the pod)."""

    def __init__(self, reason: str, *, conflict: bool = False) -> None:
        super().__init__(
            f'running PreBind plugin "VolumeBinding": binding volumes: {reason}', conflict=conflict
        )


def _split(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return meta(obj).get("annotations") or {}


def _fully_bound(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("spec") or {}).get("volumeName")) and (
        ANN_BIND_COMPLETED in _annotations(claim)
    )


class VolumeBinder:
    """See the module docstring. ``on_step(step, key)`` is called after every write."""

    def __init__(
        self,
        api: Api,
        cache: ClusterCache,
        *,
        timeout_s: float,
        on_step: Callable[[str, str], Awaitable[None]],
        on_conflict: Callable[[str], None],
    ) -> None:
        self.api = api
        self.cache = cache
        self.timeout_s = timeout_s
        self._on_step = on_step
        self._on_conflict = on_conflict
        self._waiters: set[asyncio.Event] = set()
        cache.subscribe(self._on_event)

    def _on_event(self, kind: str, _etype: str, _old: JSON | None, _new: JSON | None) -> None:
        if kind in _WATCHED:
            for waiter in self._waiters:
                waiter.set()

    # ------------------------------------------------------------------ writes
    async def write(self, plan: Plan) -> Written:
        """Bind the plan's static PVs and select its node on the claims it provisions."""
        volumes = plan.volumes
        written: Written = {}
        if volumes is None:
            return written
        for claim_key, pv_name in volumes.bind:
            written[("PersistentVolume", pv_name)] = await self._bind_volume(claim_key, pv_name)
            await self._on_step("volume-binding", pv_name)
        for claim_key in volumes.provision:
            written[("PersistentVolumeClaim", claim_key)] = await self._select_node(
                claim_key, plan.node
            )
            await self._on_step("selected-node", claim_key)
        return written

    async def _get(self, kind: str, key: str) -> JSON:
        try:
            if kind == "PersistentVolume":
                return await RETRY.call(lambda: self.api.get(PERSISTENT_VOLUMES, key))
            namespace, name = _split(key)
            return await RETRY.call(lambda: self.api.get(PERSISTENT_VOLUME_CLAIMS, name, namespace))
        except NotFoundError as exc:
            raise VolumeBindingError(f"{kind} {key} is gone", conflict=True) from exc

    async def _bind_volume(self, claim_key: str, pv_name: str) -> int:
        claim = self.cache.volumes["PersistentVolumeClaim"].get(claim_key) or await self._get(
            "PersistentVolumeClaim", claim_key
        )
        namespace, name = _split(claim_key)
        uid = str(meta(claim).get("uid") or "")
        volume = self.cache.volumes["PersistentVolume"].get(pv_name) or await self._get(
            "PersistentVolume", pv_name
        )
        conflicts = RETRY.attempts(on_conflict=lambda: self._on_conflict("volume-binding"))
        async for attempt in conflicts:
            ref = (volume.get("spec") or {}).get("claimRef") or {}
            named = ref.get("name") == name and ref.get("namespace") == namespace
            if named and ref.get("uid") == uid:
                return rv_int(volume)  # bound to the claim already (an earlier attempt)
            if ref and not (named and not ref.get("uid")):
                raise VolumeBindingError(
                    f'PersistentVolume "{pv_name}" was bound to another claim meanwhile',
                    conflict=True,
                )
            body: JSON = {
                "metadata": {"resourceVersion": meta(volume).get("resourceVersion")},
                "spec": {
                    "claimRef": {
                        "kind": "PersistentVolumeClaim",
                        "apiVersion": "v1",
                        "namespace": namespace,
                        "name": name,
                        "uid": uid,
                    }
                },
            }
            if not named:  # not pre-bound by its user: the controller (we) bound it
                body["metadata"]["annotations"] = {ANN_BOUND_BY_CONTROLLER: "yes"}
            async with attempt:
                patched = await self.api.patch(PERSISTENT_VOLUMES, pv_name, body)
                log.info("PV %s: claimRef set to %s", pv_name, claim_key)
                return rv_int(patched)
            volume = await self._get("PersistentVolume", pv_name)
        raise VolumeBindingError(f'could not bind PersistentVolume "{pv_name}"', conflict=True)

    async def _select_node(self, claim_key: str, node: str) -> int:
        claim = self.cache.volumes["PersistentVolumeClaim"].get(claim_key) or await self._get(
            "PersistentVolumeClaim", claim_key
        )
        namespace, name = _split(claim_key)
        conflicts = RETRY.attempts(on_conflict=lambda: self._on_conflict("selected-node"))
        async for attempt in conflicts:
            selected = _annotations(claim).get(ANN_SELECTED_NODE)
            if selected == node:
                return rv_int(claim)  # an earlier attempt (or a restart) wrote it
            if selected is not None or (claim.get("spec") or {}).get("volumeName"):
                raise VolumeBindingError(
                    f'PersistentVolumeClaim "{name}" was bound or provisioned elsewhere meanwhile',
                    conflict=True,
                )
            body = {
                "metadata": {
                    "resourceVersion": meta(claim).get("resourceVersion"),
                    "annotations": {ANN_SELECTED_NODE: node},
                }
            }
            async with attempt:
                patched = await self.api.patch(
                    PERSISTENT_VOLUME_CLAIMS, name, body, namespace=namespace
                )
                log.info("PVC %s: selected node %s for provisioning", claim_key, node)
                return rv_int(patched)
            claim = await self._get("PersistentVolumeClaim", claim_key)
        raise VolumeBindingError(f'could not select a node for PVC "{name}"', conflict=True)

    # ------------------------------------------------------------------ waiting
    async def wait(self, plan: Plan, written: Written) -> None:
        """Until every claim of ``plan.volumes`` is bound (see the module docstring;
        :func:`controller.prebind.wait_until_ready`)."""
        if plan.volumes is None:
            return
        changed = asyncio.Event()
        self._waiters.add(changed)
        try:
            await wait_until_ready(
                lambda: self._pending(plan, written),
                changed,
                timeout_s=self.timeout_s,
                timed_out=lambda pending: VolumeBindingError(
                    f"context deadline exceeded (claims not bound after "
                    f"{self.timeout_s:g}s: {', '.join(pending)})"
                ),
            )
        finally:
            self._waiters.discard(changed)
        log.info("pod %s: all its claims are bound", plan.pod.key)

    def _pending(self, plan: Plan, written: Written) -> list[str]:
        """The claims not bound yet (``checkBindings``); raises VolumeBindingError when
        waiting longer cannot help."""
        assert plan.volumes is not None
        pod = self.cache.pods.get(plan.pod.key)
        if pod is None or str(meta(pod).get("uid") or "") != plan.pod.uid:
            raise VolumeBindingError("pod does not exist any more")
        node = self.cache.nodes.get(plan.node)
        if node is None:
            raise VolumeBindingError(f'failed to get node "{plan.node}"')
        labels = node.labels
        claims = self.cache.volumes["PersistentVolumeClaim"]
        volumes = self.cache.volumes["PersistentVolume"]
        pending: list[str] = []
        for claim_key, pv_name in plan.volumes.bind:
            volume = volumes.get(pv_name)
            claim = claims.get(claim_key)
            if volume is None or claim is None:
                raise VolumeBindingError(f"failed to check binding: {claim_key} or {pv_name} gone")
            if rv_int(volume) < written.get(("PersistentVolume", pv_name), -1):
                pending.append(claim_key)  # our write has not reached the cache yet
                continue
            self._check_affinity(volume, plan.node, labels)
            ref = (volume.get("spec") or {}).get("claimRef") or {}
            if not ref.get("uid"):
                raise VolumeBindingError(f'ClaimRef got reset for pv "{pv_name}"')
            if not _fully_bound(claim):
                pending.append(claim_key)
        for claim_key in plan.volumes.provision:
            claim = claims.get(claim_key)
            if claim is None:
                raise VolumeBindingError(f"failed to check provisioning pvc: {claim_key} gone")
            if rv_int(claim) < written.get(("PersistentVolumeClaim", claim_key), -1):
                pending.append(claim_key)
                continue
            if _annotations(claim).get(ANN_SELECTED_NODE) != plan.node:
                # The provisioner removes the selected node to ask for another attempt.
                raise VolumeBindingError(f'provisioning failed for PVC "{meta(claim).get("name")}"')
            volume_name = str((claim.get("spec") or {}).get("volumeName") or "")
            if volume_name:
                volume = volumes.get(volume_name)
                if volume is None:
                    pending.append(claim_key)  # the PV may not have reached the cache yet
                    continue
                self._check_affinity(volume, plan.node, labels)
            if not _fully_bound(claim):
                pending.append(claim_key)
        return pending

    @staticmethod
    def _check_affinity(volume: JSON, node: str, labels: Mapping[str, str]) -> None:
        try:
            model = PersistentVolume.from_api(volume)
            fits = volume_node_affinity_matches(model, labels)
        except BiaxialError as exc:
            raise VolumeBindingError(f"pv {meta(volume).get('name')!r}: {exc}") from exc
        if not fits:
            raise VolumeBindingError(
                f'pv "{model.name}" node affinity doesn\'t match node "{node}": no matching '
                "NodeSelectorTerms"
            )

"""A stand-in for kube-controller-manager's resourceclaim controller (and the garbage
collector's part in it), for tests that need generated claims.

For every pod that is not terminating or finished, each ``spec.resourceClaims`` entry with a
``resourceClaimTemplateName`` gets a ResourceClaim generated from the template: name
``<pod>-<entry>-<random>`` (``generateName``), annotation
``resource.kubernetes.io/pod-claim-name: <entry>``, a controller owner reference to the pod,
the template's labels, annotations and spec; the pod's ``status.resourceClaimStatuses`` then
names it. It also drops ``status.reservedFor`` entries of pods that are gone or finished and
deletes generated claims whose pod is gone (or finished, once no longer reserved).

It works on the store directly (no HTTP), through the same write path as API calls, so
watches see every change. :meth:`sync` runs one pass on demand; :meth:`start` runs passes in a
background thread after every change until :meth:`stop`.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Final

from tests.emulator.errors import ApiStatusError
from tests.emulator.kinds import POD, RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE
from tests.emulator.patch import STRATEGIC_MERGE_PATCH
from tests.emulator.server import Emulator
from tests.emulator.storage import Obj

POD_CLAIM_NAME: Final = "resource.kubernetes.io/pod-claim-name"
_log = logging.getLogger(__name__)


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in {"Succeeded", "Failed"}


def _owner_uid(claim: Obj) -> str | None:
    for ref in _meta(claim).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            return str(ref.get("uid"))
    return None


class ResourceClaimController:
    """Generates claims for pods from templates; usable on demand or in the background."""

    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.store = emulator.store
        self.errors: list[ApiStatusError] = []
        self.failures: list[Exception] = []
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # ------------------------------------------------------------------ one pass
    def sync(self) -> int:
        """Run one reconciliation pass over every pod and claim; returns the writes made."""
        with self.store.lock:
            writes = 0
            pods = self.store.all(POD)
            pods_by_uid = {str(_meta(p).get("uid")): p for p in pods}
            for pod in pods:
                writes += self._sync_pod(pod)
            for claim in self.store.all(RESOURCE_CLAIM):
                writes += self._sync_claim(claim, pods_by_uid)
            return writes

    def _sync_pod(self, pod: Obj) -> int:
        meta = _meta(pod)
        if meta.get("deletionTimestamp") or _finished(pod):
            return 0
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        statuses = {
            s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        owned = {
            _meta(c).get("annotations", {}).get(POD_CLAIM_NAME): c
            for c in self.store.all(RESOURCE_CLAIM, namespace)
            if _owner_uid(c) == meta.get("uid")
        }
        new_statuses: list[dict[str, Any]] = []
        writes = 0
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            template_name = entry.get("resourceClaimTemplateName")
            entry_name = entry.get("name")
            if not template_name:
                continue
            claim = owned.get(entry_name)
            if claim is None:
                template = self.store.try_get(
                    RESOURCE_CLAIM_TEMPLATE, namespace, str(template_name)
                )
                if template is None:
                    continue
                claim = self._create_claim(pod, str(entry_name), template)
                if claim is None:
                    continue
                writes += 1
            claim_name = _meta(claim).get("name")
            if statuses.get(entry_name, {}).get("resourceClaimName") != claim_name:
                new_statuses.append({"name": entry_name, "resourceClaimName": claim_name})
        if new_statuses:
            body = json.dumps({"status": {"resourceClaimStatuses": new_statuses}}).encode()
            if self._write(
                lambda: self.store.patch(
                    POD, namespace, name, STRATEGIC_MERGE_PATCH, body, subresource="status"
                )
            ):
                writes += 1
        return writes

    def _create_claim(self, pod: Obj, entry: str, template: Obj) -> Obj | None:
        meta = _meta(pod)
        tspec = template.get("spec") or {}
        tmeta = tspec.get("metadata") or {}
        prefix = f"{meta.get('name')}-{entry}"
        prefix = prefix[:57] if len(prefix) > 57 else prefix
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": f"{prefix}-",
                "namespace": meta.get("namespace"),
                "labels": dict(tmeta.get("labels") or {}),
                "annotations": {**(tmeta.get("annotations") or {}), POD_CLAIM_NAME: entry},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta.get("name"),
                        "uid": meta.get("uid"),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": tspec.get("spec") or {},
        }
        if not claim["metadata"]["labels"]:
            del claim["metadata"]["labels"]
        created: list[Obj] = []
        self._write(
            lambda: created.append(
                self.store.create(RESOURCE_CLAIM, str(meta.get("namespace")), claim)
            )
        )
        return created[0] if created else None

    def _sync_claim(self, claim: Obj, pods_by_uid: dict[str, Obj]) -> int:
        meta = _meta(claim)
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        keep = [
            ref
            for ref in reserved
            if ref.get("resource") != "pods"
            or (ref.get("uid") in pods_by_uid and not _finished(pods_by_uid[str(ref.get("uid"))]))
        ]
        writes = 0
        if len(keep) != len(reserved):
            new_status = (
                {**status, "reservedFor": keep}
                if keep
                else {k: v for k, v in status.items() if k != "reservedFor"}
            )
            body = {**claim, "status": new_status}
            if self._write(
                lambda: self.store.replace(
                    RESOURCE_CLAIM, namespace, name, body, subresource="status"
                )
            ):
                writes += 1
                reserved = keep
        owner = _owner_uid(claim)
        if owner is None or meta.get("deletionTimestamp"):
            return writes
        pod = pods_by_uid.get(owner)
        gone = pod is None or (_finished(pod) and not reserved)
        if gone and self._write(lambda: self.store.delete(RESOURCE_CLAIM, namespace, name)):
            writes += 1
        return writes

    def _write(self, action: Any) -> bool:
        try:
            action()
        except ApiStatusError as exc:
            if exc.code in {404, 409}:
                return False
            _log.warning("resourceclaim controller: %s", exc)
            self.errors.append(exc)
            return False
        return True

    # ------------------------------------------------------------------ background
    def start(self) -> ResourceClaimController:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._run, name="resourceclaim-controller", daemon=True
            )
            self._thread.start()
        return self

    def _run(self) -> None:
        seen = -1
        while not self._stopping.is_set():
            with self.store.changed:
                if self.store.rv == seen:
                    self.store.changed.wait(0.05)
                    continue
                seen = self.store.rv
                try:
                    self.sync()
                except Exception as exc:  # noqa: BLE001 - a bug must not kill the loop; tests read failures
                    _log.exception("resourceclaim controller pass failed")
                    self.failures.append(exc)
                seen = self.store.rv

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> ResourceClaimController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""A stand-in for the storage controllers of a cluster, for tests with volumes: the PV
controller of kube-controller-manager, an external-provisioner for one CSI driver, the ephemeral
volume controller, and the garbage collector's part in them.

What it does, pass after pass (each a reconciliation of the whole store):

* **ephemeral volumes**: every generic ephemeral volume of a pod that is not terminating or
  finished gets its claim ``<pod>-<volume>`` from the volume's ``volumeClaimTemplate``, with a
  controller owner reference to the pod; a claim whose pod is gone is deleted;
* **binding** (the PV controller's ``syncUnboundClaim`` / ``bind``): a claim that a PV's
  ``claimRef`` names (the scheduler's binding, or a pre-bound PV) is bound to it: the PV gets the
  claim's UID and phase ``Bound``; the claim gets ``spec.volumeName``, the annotations
  ``pv.kubernetes.io/bind-completed`` and ``pv.kubernetes.io/bound-by-controller`` and phase
  ``Bound``. An unbound claim of an ``Immediate`` class takes the smallest ``Available`` PV of
  its class with room and the access modes, else it is provisioned when its class is ours; a
  ``WaitForFirstConsumer`` claim waits for ``volume.kubernetes.io/selected-node``;
* **provisioning** (the external-provisioner, for classes whose provisioner is
  :attr:`VolumeController.provisioner`): a claim annotated with a selected node gets
  ``volume.kubernetes.io/storage-provisioner`` and a PV ``pvc-<claim uid>`` of its size, modes
  and class, a CSI source of this driver, ``claimRef`` to it and node affinity to the node's
  zone (``topology.kubernetes.io/zone``) or, without one, to the node itself. A claim
  :meth:`VolumeController.fail` names, or whose selected node does not exist, has the annotation
  removed instead (upstream's ``rescheduleProvisioning``: the scheduler retries); a claim
  :meth:`VolumeController.hold` names is left alone until released;
* **phases and reclaim**: a PV with no claim is ``Available``; one whose claim is gone is
  ``Released`` and, with reclaim policy ``Delete``, deleted.

It works on the store directly (no HTTP), through the same write path as API calls, so watches
see every change. :meth:`sync` runs one pass; :meth:`start` runs passes in a background thread
after every change until :meth:`stop`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Final

from driver.api.quantity import Quantity
from kubeapi import codec
from tests.emulator.errors import ApiStatusError
from tests.emulator.kinds import (
    NODE,
    PERSISTENT_VOLUME,
    PERSISTENT_VOLUME_CLAIM,
    POD,
    STORAGE_CLASS,
)
from tests.emulator.patch import MERGE_PATCH
from tests.emulator.server import Emulator
from tests.emulator.storage import Obj

DEFAULT_PROVISIONER: Final = "csi.test.biaxial.dev"
SELECTED_NODE: Final = "volume.kubernetes.io/selected-node"
BIND_COMPLETED: Final = "pv.kubernetes.io/bind-completed"
BOUND_BY_CONTROLLER: Final = "pv.kubernetes.io/bound-by-controller"
STORAGE_PROVISIONER: Final = "volume.kubernetes.io/storage-provisioner"
PROVISIONED_BY: Final = "pv.kubernetes.io/provisioned-by"
ZONE: Final = "topology.kubernetes.io/zone"
HOSTNAME: Final = "kubernetes.io/hostname"
_log = logging.getLogger(__name__)


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _annotations(obj: Obj) -> dict[str, Any]:
    return dict(_meta(obj).get("annotations") or {})


def _class_of(obj: Obj) -> str:
    annotations = _annotations(obj)
    if "volume.beta.kubernetes.io/storage-class" in annotations:
        return str(annotations["volume.beta.kubernetes.io/storage-class"])
    return str((obj.get("spec") or {}).get("storageClassName") or "")


def _size(value: Any) -> int:
    return Quantity.of(value).nanos if value is not None else 0


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in {"Succeeded", "Failed"}


class VolumeController:
    """See the module docstring. ``provisioner``: the CSI driver whose classes it provisions."""

    def __init__(self, emulator: Emulator, *, provisioner: str = DEFAULT_PROVISIONER) -> None:
        self.emulator = emulator
        self.store = emulator.store
        self.provisioner = provisioner
        self.errors: list[ApiStatusError] = []
        self.failures: list[Exception] = []
        self.provisioned: list[str] = []  # claim keys, in order
        self.rescheduled: list[str] = []  # claim keys whose selected node was removed
        self._fail: set[str] = set()
        self._hold: set[str] = set()
        self._released = 0  # bumped by release(): the next pass must run
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # ------------------------------------------------------------------ test controls
    def fail(self, key: str) -> None:
        """Provisioning of claim ``namespace/name`` fails (the selected node is removed)."""
        with self.store.lock:
            self._fail.add(key)

    def hold(self, key: str) -> None:
        """Leave claim ``namespace/name`` unprovisioned until :meth:`release`."""
        with self.store.lock:
            self._hold.add(key)

    def release(self, key: str) -> None:
        with self.store.changed:
            self._hold.discard(key)
            self._fail.discard(key)
            self._released += 1
            self.store.changed.notify_all()

    # ------------------------------------------------------------------ one pass
    def sync(self) -> int:
        """One reconciliation pass; returns the writes made."""
        with self.store.lock:
            writes = self._ephemeral()
            classes = {str(_meta(c).get("name")): c for c in self.store.all(STORAGE_CLASS)}
            for claim in self.store.all(PERSISTENT_VOLUME_CLAIM):
                writes += self._sync_claim(claim, classes)
            claims = {
                f"{_meta(c).get('namespace')}/{_meta(c).get('name')}": c
                for c in self.store.all(PERSISTENT_VOLUME_CLAIM)
            }
            for volume in self.store.all(PERSISTENT_VOLUME):
                writes += self._sync_volume(volume, claims)
            return writes

    def _ephemeral(self) -> int:
        writes = 0
        pods = self.store.all(POD)
        live = {str(_meta(p).get("uid")) for p in pods}
        for pod in pods:
            meta = _meta(pod)
            if meta.get("deletionTimestamp") or _finished(pod):
                continue
            namespace, name = str(meta.get("namespace")), str(meta.get("name"))
            for volume in (pod.get("spec") or {}).get("volumes") or []:
                template = (volume.get("ephemeral") or {}).get("volumeClaimTemplate")
                if not template:
                    continue
                claim_name = f"{name}-{volume.get('name')}"
                if self.store.try_get(PERSISTENT_VOLUME_CLAIM, namespace, claim_name) is not None:
                    continue
                tmeta = template.get("metadata") or {}
                body: Obj = {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {
                        "name": claim_name,
                        "namespace": namespace,
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Pod",
                                "name": name,
                                "uid": meta.get("uid"),
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                        **{k: v for k, v in tmeta.items() if k in ("labels", "annotations")},
                    },
                    "spec": codec.copy(template.get("spec") or {}),
                }
                if self._write(
                    lambda b=body, ns=namespace: self.store.create(PERSISTENT_VOLUME_CLAIM, ns, b)
                ):
                    writes += 1
        for claim in self.store.all(PERSISTENT_VOLUME_CLAIM):
            meta = _meta(claim)
            owner = next(
                (
                    r
                    for r in meta.get("ownerReferences") or []
                    if r.get("controller") and r.get("kind") == "Pod"
                ),
                None,
            )
            if owner is None or owner.get("uid") in live or meta.get("deletionTimestamp"):
                continue
            if self._write(
                lambda m=meta: self.store.delete(
                    PERSISTENT_VOLUME_CLAIM, str(m.get("namespace")), str(m.get("name"))
                )
            ):
                writes += 1
        return writes

    def _sync_claim(self, claim: Obj, classes: dict[str, Obj]) -> int:
        meta = _meta(claim)
        if meta.get("deletionTimestamp"):
            return 0
        spec = claim.get("spec") or {}
        annotations = _annotations(claim)
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if spec.get("volumeName") and BIND_COMPLETED in annotations:
            return 0  # bound
        volume = self._volume_for(claim)
        if volume is not None:
            return self._bind(claim, volume)
        storage_class = classes.get(_class_of(claim))
        if storage_class is None or spec.get("volumeName"):
            return 0  # pre-bound to a PV that does not exist (yet), or no class to act on
        delayed = storage_class.get("volumeBindingMode") == "WaitForFirstConsumer"
        if not delayed:
            match = self._smallest_match(claim)
            if match is not None:
                return self._claim_volume(claim, match)
        ours = storage_class.get("provisioner") == self.provisioner
        selected = annotations.get(SELECTED_NODE)
        if not ours or (delayed and selected is None) or key in self._hold:
            return 0
        if key in self._fail or (
            selected is not None and self.store.try_get(NODE, None, str(selected)) is None
        ):
            return self._reschedule(claim, key)
        return self._provision(claim, storage_class, selected)

    def _volume_for(self, claim: Obj) -> Obj | None:
        """A PV whose claimRef names the claim (by name, and by UID when it has one)."""
        meta = _meta(claim)
        for volume in self.store.all(PERSISTENT_VOLUME):
            ref = (volume.get("spec") or {}).get("claimRef") or {}
            if ref.get("name") != meta.get("name") or ref.get("namespace") != meta.get("namespace"):
                continue
            if ref.get("uid") and ref.get("uid") != meta.get("uid"):
                continue
            return volume
        return None

    def _smallest_match(self, claim: Obj) -> Obj | None:
        spec = claim.get("spec") or {}
        want = _size(((spec.get("resources") or {}).get("requests") or {}).get("storage"))
        modes = set(spec.get("accessModes") or [])
        best: Obj | None = None
        for volume in sorted(self.store.all(PERSISTENT_VOLUME), key=lambda v: _meta(v)["name"]):
            vspec = volume.get("spec") or {}
            if vspec.get("claimRef") or (volume.get("status") or {}).get("phase") != "Available":
                continue
            if _class_of(volume) != _class_of(claim) or not modes <= set(
                vspec.get("accessModes") or []
            ):
                continue
            have = _size((vspec.get("capacity") or {}).get("storage"))
            if have < want:
                continue
            if best is None or have < _size(
                ((best.get("spec") or {}).get("capacity") or {}).get("storage")
            ):
                best = volume
        return best

    def _claim_volume(self, claim: Obj, volume: Obj) -> int:
        meta = _meta(claim)
        body = {
            "spec": {
                "claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "apiVersion": "v1",
                    "namespace": meta.get("namespace"),
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                }
            },
            "metadata": {"annotations": {BOUND_BY_CONTROLLER: "yes"}},
        }
        name = str(_meta(volume).get("name"))
        written = self._write(lambda: self._merge(PERSISTENT_VOLUME, None, name, body))
        return int(written) + (
            self._bind(claim, self.store.get(PERSISTENT_VOLUME, None, name)) if written else 0
        )

    def _bind(self, claim: Obj, volume: Obj) -> int:
        """Complete the binding of ``claim`` to ``volume`` (both sides, as ``bind`` does)."""
        meta = _meta(claim)
        vmeta = _meta(volume)
        writes = 0
        vname = str(vmeta.get("name"))
        ref = (volume.get("spec") or {}).get("claimRef") or {}
        if ref.get("uid") != meta.get("uid"):
            body = {"spec": {"claimRef": {**ref, "uid": meta.get("uid")}}}
            if not self._write(lambda: self._merge(PERSISTENT_VOLUME, None, vname, body)):
                return writes
            writes += 1
        volume = self.store.get(PERSISTENT_VOLUME, None, vname)
        if (volume.get("status") or {}).get("phase") != "Bound":
            current = self.store.get(PERSISTENT_VOLUME, None, vname)
            new = {**current, "status": {**(current.get("status") or {}), "phase": "Bound"}}
            if not self._write(
                lambda: self.store.replace(
                    PERSISTENT_VOLUME, None, vname, new, subresource="status"
                )
            ):
                return writes
            writes += 1
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        annotations = {BIND_COMPLETED: "yes"}
        if BOUND_BY_CONTROLLER in _annotations(volume) or not (claim.get("spec") or {}).get(
            "volumeName"
        ):
            annotations[BOUND_BY_CONTROLLER] = "yes"
        body = {"metadata": {"annotations": annotations}, "spec": {"volumeName": vname}}
        if not self._write(lambda: self._merge(PERSISTENT_VOLUME_CLAIM, namespace, name, body)):
            return writes
        writes += 1
        vspec = volume.get("spec") or {}
        current = self.store.get(PERSISTENT_VOLUME_CLAIM, namespace, name)
        status = {
            "phase": "Bound",
            "accessModes": list(vspec.get("accessModes") or []),
            "capacity": dict(vspec.get("capacity") or {}),
        }
        new = {**current, "status": status}
        if self._write(
            lambda: self.store.replace(
                PERSISTENT_VOLUME_CLAIM, namespace, name, new, subresource="status"
            )
        ):
            writes += 1
        return writes

    def _reschedule(self, claim: Obj, key: str) -> int:
        meta = _meta(claim)
        body = {"metadata": {"annotations": {SELECTED_NODE: None}}}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        if self._write(lambda: self._merge(PERSISTENT_VOLUME_CLAIM, namespace, name, body)):
            self.rescheduled.append(key)
            self._fail.discard(key)
            return 1
        return 0

    def _provision(self, claim: Obj, storage_class: Obj, selected: Any) -> int:
        meta = _meta(claim)
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        spec = claim.get("spec") or {}
        writes = 0
        if _annotations(claim).get(STORAGE_PROVISIONER) != self.provisioner:
            body = {"metadata": {"annotations": {STORAGE_PROVISIONER: self.provisioner}}}
            if not self._write(lambda: self._merge(PERSISTENT_VOLUME_CLAIM, namespace, name, body)):
                return writes
            writes += 1
        volume: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": f"pvc-{meta.get('uid')}",
                "annotations": {PROVISIONED_BY: self.provisioner},
            },
            "spec": {
                "capacity": {
                    "storage": ((spec.get("resources") or {}).get("requests") or {}).get(
                        "storage", "1Gi"
                    )
                },
                "accessModes": list(spec.get("accessModes") or []),
                "volumeMode": spec.get("volumeMode") or "Filesystem",
                "storageClassName": _meta(storage_class).get("name"),
                "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
                "claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "apiVersion": "v1",
                    "namespace": namespace,
                    "name": name,
                    "uid": meta.get("uid"),
                },
                "csi": {"driver": self.provisioner, "volumeHandle": f"vol-{meta.get('uid')}"},
            },
        }
        if selected is not None:
            node = self.store.get(NODE, None, str(selected))
            labels = _meta(node).get("labels") or {}
            key, value = (ZONE, labels[ZONE]) if ZONE in labels else (HOSTNAME, str(selected))
            volume["spec"]["nodeAffinity"] = {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
                    ]
                }
            }
        if self._write(lambda: self.store.create(PERSISTENT_VOLUME, None, volume)):
            writes += 1
            self.provisioned.append(f"{namespace}/{name}")
            created = self.store.get(PERSISTENT_VOLUME, None, volume["metadata"]["name"])
            writes += self._bind(self.store.get(PERSISTENT_VOLUME_CLAIM, namespace, name), created)
        return writes

    def _sync_volume(self, volume: Obj, claims: dict[str, Obj]) -> int:
        meta = _meta(volume)
        name = str(meta.get("name"))
        spec = volume.get("spec") or {}
        phase = (volume.get("status") or {}).get("phase")
        ref = spec.get("claimRef")
        if meta.get("deletionTimestamp"):
            return 0
        if ref is None or not ref.get("uid"):
            wanted = "Available"  # free, or pre-bound by name (the claim binds it)
        else:
            claim = claims.get(f"{ref.get('namespace')}/{ref.get('name')}")
            if claim is not None and _meta(claim).get("uid") == ref.get("uid"):
                return 0
            if spec.get("persistentVolumeReclaimPolicy") == "Delete":
                return int(self._write(lambda: self.store.delete(PERSISTENT_VOLUME, None, name)))
            wanted = "Released"
        if phase == wanted:
            return 0
        new = {**volume, "status": {**(volume.get("status") or {}), "phase": wanted}}
        return int(
            self._write(
                lambda: self.store.replace(PERSISTENT_VOLUME, None, name, new, subresource="status")
            )
        )

    # ------------------------------------------------------------------ writes
    def _merge(self, kind: Any, namespace: str | None, name: str, body: Obj) -> Obj:
        return self.store.patch(kind, namespace, name, MERGE_PATCH, json.dumps(body).encode())

    def _write(self, action: Callable[[], Any]) -> bool:
        try:
            action()
        except ApiStatusError as exc:
            if exc.code in {404, 409}:
                return False
            _log.warning("volume controller: %s", exc)
            self.errors.append(exc)
            return False
        return True

    # ------------------------------------------------------------------ background
    def start(self) -> VolumeController:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="volume-controller", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        seen = (-1, -1)
        while not self._stopping.is_set():
            with self.store.changed:
                now = (self.store.rv, self._released)
                if now == seen:
                    self.store.changed.wait(0.05)
                    continue
                seen = now
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - a bug must not kill the loop; tests read failures
                _log.exception("volume controller pass failed")
                self.failures.append(exc)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> VolumeController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

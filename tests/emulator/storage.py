"""The emulator's object store: one global resourceVersion, watch history, write semantics.

Contract:

* Stored objects are never mutated after they are stored (copy-on-write), so readers may
  serialise them without a copy. Callers of the public methods get objects they must not
  mutate either; :meth:`Store.get` and friends return deep copies only where they say so.
* Every successful write bumps the single global ``resourceVersion`` by one, records a watch
  event (``ADDED``/``MODIFIED``/``DELETED`` with the previous state) in a bounded history and
  fans it out to the open watches. A write that changes nothing keeps the RV and emits nothing.
* The write rules are the API server's: metadata ownership (uid, creationTimestamp,
  generation, deletionTimestamp), optimistic concurrency, status subresource rules, immutable
  specs, finalizers, pod binding, pod graceful deletion and namespace termination. Every write
  is validated (strict schema plus semantic checks) before it is stored; a rejected write
  changes nothing.
* All state is guarded by one re-entrant lock; :attr:`Store.changed` is notified after every
  commit (for wait-until helpers).
"""

from __future__ import annotations

import base64
import binascii
import builtins
import datetime as dt
import json
import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from driver.scheduling.storage import StorageClass, default_storage_class, with_default_class
from kubeapi import codec
from tests.emulator import errors, rawjson
from tests.emulator.defaults import apply_update_defaults, prepare_for_create
from tests.emulator.errors import ApiStatusError, FieldError
from tests.emulator.events import to_core, to_v1, v1_errors
from tests.emulator.kinds import (
    ALL_KINDS,
    EVENT,
    EVENT_V1,
    NAMESPACE,
    PERSISTENT_VOLUME_CLAIM,
    POD,
    STORAGE_CLASS,
    Kind,
)
from tests.emulator.patch import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from tests.emulator.selectors import FieldSelector, LabelSelector
from tests.emulator.validation import SchemaValidators, semantic_check

Obj = dict[str, Any]
ObjKey = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds

_NAME_CHARS: Final = "bcdfghjklmnpqrstvwxz2456789"
DEFAULT_NAMESPACES: Final = ("default", "kube-system", "kube-public", "kube-node-lease")
EXPIRED_CONTINUE: Final = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this response "
    "to retrieve the remainder of the results. Continuing with the provided token results in an "
    "inconsistent list - objects that were created, modified, or deleted between the time the "
    "first chunk was returned and now may show up in the list."
)


#: where object uids come from: a generator seeded once from the system's randomness, as
#: unique as ``uuid.uuid4`` (122 random bits) but without its system call per uid, which
#: lets go of the GIL while the store lock is held (the request threads that take the GIL
#: then block on the store lock: futex waits, wake-ups and GIL hand-overs per create)
_UIDS: Final = random.Random(os.urandom(32))  # unique, not a secret


def _new_uid() -> str:
    return str(uuid.UUID(int=_UIDS.getrandbits(128), version=4))


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _object(value: Any) -> dict[str, Any]:
    """``value`` when it is an object, else empty (for reading fields validation checked)."""
    return value if isinstance(value, dict) else {}


#: The namespace label upstream's DRAAdminNamespaceLabelKey names, and its refusal.
#: apimachinery's ``validate.UpdatePointer`` (NoModify) on ``status.allocation``.
MODIFIED_ONCE_SET: Final = "field cannot be modified once set"
ADMIN_ACCESS_LABEL: Final = "resource.kubernetes.io/admin-access"
ADMIN_ACCESS_DENIED: Final = (
    "admin access to devices requires the `resource.kubernetes.io/admin-access: true` label "
    "on the containing namespace"
)


@dataclass(frozen=True, slots=True)
class Event:
    """One committed change: ``type`` ADDED/MODIFIED/DELETED, new state, previous state."""

    rv: int
    kind: Kind
    type: str
    obj: Obj
    prev: Obj | None


@dataclass(slots=True, eq=False)
class Watcher:
    """One open watch: filters events for its kind, namespace and selectors into a queue."""

    kind: Kind
    namespace: str | None
    labels: LabelSelector | None
    fields: FieldSelector | None
    items: deque[tuple[str, Any]] = field(default_factory=deque)
    cond: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False
    #: the stream's writer for an event nothing is queued before (its server sets it): called
    #: under :attr:`cond`, it returns what it could not send at once, which is queued as a
    #: ``RAW`` item for the watch's own thread
    direct: Callable[[Any], bytes] | None = None
    #: the watch's own thread is writing what it took: events queue behind it
    busy: bool = False

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and _meta(obj).get("namespace") != self.namespace:
            return False
        if self.labels is not None and not self.labels.matches(obj):
            return False
        return self.fields is None or self.fields.matches(obj)

    def put(self, kind: str, payload: Any) -> None:
        if kind == "EVENT" and self.kind is EVENT_V1 and payload[0] != "BOOKMARK":
            payload = (payload[0], to_v1(payload[1]))
        with self.cond:
            if self.closed:
                return
            if kind == "EVENT" and self.direct is not None and not self.items and not self.busy:
                # nothing is ahead of it: the writer sends it (no wake-up of the watch's thread)
                rest = self.direct(payload)
                if not rest:
                    return
                kind, payload = "RAW", rest
            self.items.append((kind, payload))
            if kind == "CLOSE":
                self.closed = True
            self.cond.notify_all()

    def offer(self, event: Event) -> None:
        if event.kind.key != self.kind.key:
            return
        now_matches = self.matches(event.obj)
        if event.type == "DELETED":
            if now_matches:
                self.put("EVENT", ("DELETED", event.obj))
            return
        before = event.type == "MODIFIED" and self.matches(event.prev)
        if now_matches and before:
            self.put("EVENT", ("MODIFIED", event.obj))
        elif now_matches:
            self.put("EVENT", ("ADDED", event.obj))
        elif before and event.prev is not None:
            gone = dict(event.prev)
            gone["metadata"] = {**_meta(event.prev), "resourceVersion": str(event.rv)}
            self.put("EVENT", ("DELETED", gone))

    def take(self, timeout: float) -> list[tuple[str, Any]] | None:
        """Every queued item (waiting up to ``timeout`` seconds for one; None if none came),
        the watch's thread then :attr:`busy` writing them until :meth:`idle`."""
        with self.cond:
            if not self.items:
                self.cond.wait(timeout)
            if not self.items:
                return None
            items = list(self.items)
            self.items.clear()
            self.busy = True
            return items

    def claim(self) -> bool:
        """The watch's thread is about to write on its own (a bookmark): False when items are
        queued (they go first), else :attr:`busy` until :meth:`idle`."""
        with self.cond:
            if self.items:
                return False
            self.busy = True
            return True

    def idle(self) -> None:
        with self.cond:
            self.busy = False

    def end(self) -> None:
        """The stream ends: nothing is written to it directly any more."""
        with self.cond:
            self.direct = None
            self.busy = True

    def close(self, payload: Any = None) -> None:
        """End the watch: ``payload`` None ends it cleanly, "DROP" abruptly, a Status as ERROR."""
        self.put("CLOSE", payload)


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[Obj]
    resource_version: int
    continue_token: str | None
    remaining: int | None


class Store:
    """Objects of every served kind, the global resourceVersion and the watch history."""

    def __init__(
        self,
        validators: SchemaValidators,
        *,
        history_size: int = 10_000,
        pod_graceful_deletion: bool = True,
        require_namespaces: bool = True,
    ) -> None:
        self.validators = validators
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 1
        self.compacted_rv = 0
        self.history: deque[Event] = deque(maxlen=max(1, history_size))
        self.pod_graceful_deletion = pod_graceful_deletion
        self.require_namespaces = require_namespaces
        self._objects: dict[tuple[str, str], dict[ObjKey, Obj]] = {}
        #: A claim's opaque parameters as the bytes the server holds (by uid; :mod:`rawjson`).
        self._claim_bytes: dict[str, rawjson.Raw] = {}
        self._watchers: set[Watcher] = set()
        self._rng = random.Random()
        for name in DEFAULT_NAMESPACES:
            self.create(NAMESPACE, None, {"metadata": {"name": name}})

    # ------------------------------------------------------------------ helpers
    def _default_storage_class(self, claim: Obj) -> Obj:
        """The DefaultStorageClass admission plugin: a new claim without a class gets the
        default StorageClass stored now (the newest marked one)."""
        stored = (StorageClass.from_api(c) for c in self._bucket(STORAGE_CLASS).values())
        return with_default_class(claim, default_storage_class(stored))

    def _bucket(self, kind: Kind) -> dict[ObjKey, Obj]:
        return self._objects.setdefault(kind.key, {})

    @staticmethod
    def _key(kind: Kind, namespace: str | None, name: str) -> ObjKey:
        return (namespace or "" if kind.namespaced else "", name)

    def _require(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        found = self._bucket(kind).get(self._key(kind, namespace, name))
        if found is None:
            raise errors.not_found(kind, name)
        return found

    def _emit(self, kind: Kind, type_: str, obj: Obj, prev: Obj | None) -> None:
        if len(self.history) == self.history.maxlen:
            self.compacted_rv = self.history[0].rv
        event = Event(self.rv, kind, type_, obj, prev)
        self.history.append(event)
        for watcher in list(self._watchers):
            watcher.offer(event)
        self.changed.notify_all()

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _prune_unknown(self, kind: Kind, obj: Obj, mode: str, warnings: list[str] | None) -> Obj:
        """``fieldValidation=Ignore|Warn``: drop unknown fields (Warn also reports them), as the
        API server does; ``Strict`` keeps them so that validation answers 400."""
        if mode == "Strict":
            return obj
        if mode not in {"Ignore", "Warn"}:
            raise errors.bad_request(
                f'fieldValidation: Unsupported value: "{mode}": supported values: "Ignore", '
                '"Strict", "Warn"'
            )
        unknown = [i.path for i in self.validators.issues(kind, obj) if i.kind == "unknown"]
        if not unknown:
            return obj
        pruned = codec.copy(obj)
        for path in unknown:
            parent: Any = pruned
            for part in path[:-1]:
                parent = parent[part]
            parent.pop(path[-1], None)
            if mode == "Warn" and warnings is not None:
                warnings.append(f'unknown field "{_dotted(path)}"')
        return pruned

    def _event_in(self, body: Any, mode: str, warnings: list[str] | None) -> Obj:
        """Check an events.k8s.io/v1 Event as written and convert it to the stored core form."""
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        event = self._prune_unknown(EVENT_V1, self._check_type(EVENT_V1, body), mode, warnings)
        self.validators.check(EVENT_V1, event)
        problems = v1_errors(event)
        if problems:
            raise errors.invalid(EVENT_V1, str(_meta(event).get("name") or ""), problems)
        return to_core(event)

    def inject(self, kind: Kind, namespace: str | None, obj: Obj) -> Obj:
        """Store ``obj`` as it is, without validation or defaulting (only name, namespace,
        uid and resourceVersion are set), and tell watchers: a fault hook for readers'
        robustness (what another API server version, a conversion or a bug might serve)."""
        with self.lock:
            meta = _meta(obj)
            obj = {**obj, "metadata": {**meta, "uid": _new_uid()}}
            if not kind.namespaced:
                obj["metadata"].pop("namespace", None)
                namespace = None
            else:
                obj["metadata"]["namespace"] = namespace
            obj["metadata"]["resourceVersion"] = self._next_rv()
            key = self._key(kind, namespace, str(meta["name"]))
            old = self._bucket(kind).get(key)
            self._bucket(kind)[key] = obj
            self._emit(kind, "ADDED" if old is None else "MODIFIED", obj, old)
            return obj

    def _check_admin_access(self, kind: Kind, namespace: str | None, name: str, obj: Obj) -> None:
        """Upstream's ``AuthorizedForAdmin`` (pkg/registry/resource, run by the ResourceClaim
        and ResourceClaimTemplate strategies on create): a request with ``adminAccess: true``
        needs the label ``resource.kubernetes.io/admin-access: "true"`` on the namespace, else
        422 with a Forbidden cause per such request, at ``devices.requests[i].adminAccess``
        (the path upstream builds, without v1's ``exactly``: what v1.37.2 answers)."""
        if kind.kind == "ResourceClaim":
            prefix, spec = "spec", _object(obj.get("spec"))
        elif kind.kind == "ResourceClaimTemplate":
            prefix, spec = "spec.spec", _object(_object(obj.get("spec")).get("spec"))
        else:
            return
        requests = _object(spec.get("devices")).get("requests") or []
        paths = [
            f"{prefix}.devices.requests[{i}].adminAccess"
            for i, request in enumerate(requests)
            if isinstance(request, dict) and _object(request.get("exactly")).get("adminAccess")
        ]
        if not paths:
            return
        ns_obj = self._bucket(NAMESPACE).get(("", namespace or ""))
        labels = _object(_meta(ns_obj).get("labels")) if ns_obj is not None else {}
        if labels.get(ADMIN_ACCESS_LABEL) == "true":
            return
        raise errors.invalid(
            kind,
            name,
            [FieldError(p, "Forbidden", ADMIN_ACCESS_DENIED, show_value=False) for p in paths],
        )

    def _validate(self, kind: Kind, obj: Obj) -> Obj:
        """Validate a write; returns it with times in canonical form (what gets stored)."""
        self.validators.check(kind, obj)
        obj = self.validators.normalize(kind, obj)
        semantic_check(kind, obj)
        return obj

    @staticmethod
    def _strip_rv(obj: Obj) -> Obj:
        out = dict(obj)
        out["metadata"] = {k: v for k, v in _meta(obj).items() if k != "resourceVersion"}
        return out

    @staticmethod
    def _spec_part(obj: Obj) -> Obj:
        return {
            k: v for k, v in obj.items() if k not in {"metadata", "status", "kind", "apiVersion"}
        }

    # ------------------------------------------------------------------ reads
    def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        with self.lock:
            return _view(kind, self._require(kind, namespace, name))

    def try_get(self, kind: Kind, namespace: str | None, name: str) -> Obj | None:
        with self.lock:
            found = self._bucket(kind).get(self._key(kind, namespace, name))
            return None if found is None else _view(kind, found)

    def all(self, kind: Kind, namespace: str | None = None) -> list[Obj]:
        with self.lock:
            return [
                _view(kind, obj)
                for key, obj in sorted(self._bucket(kind).items())
                if namespace is None or key[0] == namespace
            ]

    def _state_at(self, kind: Kind, rv: int) -> dict[ObjKey, Obj]:
        if rv < self.compacted_rv:
            raise errors.too_old(rv)
        state = dict(self._bucket(kind))
        for event in reversed(self.history):
            if event.rv <= rv:
                break
            if event.kind.key != kind.key:
                continue
            meta = _meta(event.obj)
            key = self._key(kind, meta.get("namespace"), str(meta.get("name")))
            if event.type == "ADDED":
                state.pop(key, None)
            elif event.prev is not None:
                state[key] = event.prev
        return state

    def list(
        self,
        kind: Kind,
        namespace: str | None,
        *,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        resource_version: str | None = None,
        resource_version_match: str | None = None,
    ) -> ListResult:
        _check_list_options(resource_version, resource_version_match, continue_token)
        with self.lock:
            start_after = ""
            if continue_token:
                if resource_version not in (None, ""):
                    raise errors.bad_request(
                        "specifying resource version is not allowed when using continue"
                    )
                list_rv, start_after = _decode_continue(continue_token)
                if list_rv < self.compacted_rv:
                    raise errors.expired(EXPIRED_CONTINUE)
                state = self._state_at(kind, list_rv)
            elif resource_version_match == "Exact":
                list_rv = _parse_rv(resource_version)
                if list_rv > self.rv:
                    raise ApiStatusError(
                        504, "Timeout", f"Too large resource version: {list_rv}, current: {self.rv}"
                    )
                state = self._state_at(kind, list_rv)
            else:
                list_rv = self.rv
                state = self._bucket(kind)
            ordered = sorted(state.items(), key=lambda kv: _etcd_key(kv[0]))
            matching = [
                obj
                for key, obj in ordered
                if (namespace is None or key[0] == namespace)
                and _etcd_key(key) > start_after
                and (labels is None or labels.matches(obj))
                and (fields is None or fields.matches(obj))
            ]
            token = None
            remaining = None
            if limit and len(matching) > limit:
                rest = len(matching) - limit
                matching = matching[:limit]
                last = _meta(matching[-1])
                token = _encode_continue(
                    list_rv, _etcd_key((last.get("namespace") or "", str(last.get("name"))))
                )
                if labels is None and fields is None:
                    remaining = rest
            return ListResult([_view(kind, o) for o in matching], list_rv, token, remaining)

    # ------------------------------------------------------------------ watch
    def watch(
        self,
        kind: Kind,
        namespace: str | None,
        *,
        labels: LabelSelector | None,
        fields: FieldSelector | None,
        resource_version: str | None,
        send_initial_events: bool = False,
    ) -> Watcher:
        """Open a watch. RV unset/"0": synthetic ADDED for current state; RV=N: replay."""
        watcher = Watcher(kind, namespace, labels, fields)
        with self.lock:
            if resource_version in (None, "", "0") or send_initial_events:
                for obj in self.all(_stored(kind), namespace):
                    if watcher.matches(obj):
                        watcher.put("EVENT", ("ADDED", obj))
                if send_initial_events:
                    watcher.put(
                        "EVENT",
                        (
                            "BOOKMARK",
                            {
                                "kind": kind.kind,
                                "apiVersion": kind.api_version,
                                "metadata": {
                                    "resourceVersion": str(self.rv),
                                    "annotations": {"k8s.io/initial-events-end": "true"},
                                },
                            },
                        ),
                    )
            else:
                start = _parse_rv(resource_version)
                if start < self.compacted_rv:
                    raise errors.too_old(start)
                for event in self.history:
                    if event.rv > start:
                        watcher.offer(event)
            self._watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers.discard(watcher)

    def watchers(self, kind: Kind | None = None) -> builtins.list[Watcher]:
        with self.lock:
            return [w for w in self._watchers if kind is None or w.kind.key == kind.key]

    def compact(self) -> None:
        """Forget the watch history: every RV before the current one is now too old."""
        with self.lock:
            self.compacted_rv = self.rv
            self.history.clear()

    # ------------------------------------------------------------------ create
    def create(
        self,
        kind: Kind,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        field_validation: str = "Strict",
        warnings: builtins.list[str] | None = None,
        owned: bool = False,
    ) -> Obj:
        """``owned``: ``body`` is the caller's to give away (a request's decoded body), used
        as it is; otherwise it is copied first (a caller's object is never changed or kept)."""
        if not isinstance(body, dict):
            raise errors.bad_request(
                f"the body of the request must be a JSON object, not {type(body).__name__}"
            )
        if kind is EVENT_V1:
            with self.lock:
                core = self._event_in(body, field_validation, warnings)
                return to_v1(self.create(EVENT, namespace, core, dry_run=dry_run))
        with self.lock:
            obj = self._prune_unknown(
                kind, self._check_type(kind, body, copy=not owned), field_validation, warnings
            )
            meta = obj.get("metadata")
            if meta is None:
                meta = obj["metadata"] = {}
            if not isinstance(meta, dict):
                raise errors.bad_request(
                    f'{kind.kind} in version "{kind.version}" cannot be handled as a '
                    f"{kind.kind}: metadata must be an object"
                )
            namespace = self._check_namespace(kind, namespace, meta)
            if meta.get("resourceVersion"):
                raise errors.internal("resourceVersion should not be set on objects to be created")
            name = meta.get("name")
            if not name:
                prefix = meta.get("generateName")
                if not prefix:
                    raise errors.invalid(
                        kind,
                        "",
                        [
                            FieldError(
                                "metadata.name",
                                "Required value",
                                "name or generateName is required",
                            )
                        ],
                    )
                name = f"{prefix}{''.join(self._rng.choice(_NAME_CHARS) for _ in range(5))}"
                meta["name"] = name
            if not isinstance(name, str):
                raise errors.bad_request("metadata.name must be a string")
            if kind.namespaced and self.require_namespaces:
                ns_obj = self._bucket(NAMESPACE).get(("", namespace or ""))
                if ns_obj is None:
                    raise errors.namespace_not_found(namespace or "")
                if _meta(ns_obj).get("deletionTimestamp"):
                    raise errors.forbidden(
                        kind,
                        name,
                        f'{kind.group_resource} "{name}" is forbidden: unable to create new '
                        f"content in namespace {namespace} because it is being terminated",
                    )
            obj = prepare_for_create(kind, obj, copy=False)  # obj is _check_type's copy
            if kind is PERSISTENT_VOLUME_CLAIM:
                obj = self._default_storage_class(obj)
            meta = obj["metadata"]
            for server_field in (
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            ):
                meta.pop(server_field, None)
            meta["uid"] = _new_uid()
            meta["creationTimestamp"] = now()
            if kind.tracks_generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            obj = self._validate(kind, obj)
            self._check_admin_access(kind, namespace, name, obj)
            key = self._key(kind, namespace, name)
            if key in self._bucket(kind):
                raise errors.already_exists(kind, name)
            if dry_run:
                return obj
            obj["metadata"] = {**obj["metadata"], "resourceVersion": self._next_rv()}
            self._bucket(kind)[key] = obj
            self._emit(kind, "ADDED", obj, None)
            return obj

    @staticmethod
    def _check_type(kind: Kind, body: Obj, *, copy: bool = True) -> Obj:
        obj = codec.copy(body) if copy else body
        api_version = obj.get("apiVersion") or kind.api_version
        kind_name = obj.get("kind") or kind.kind
        if api_version != kind.api_version or kind_name != kind.kind:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({kind.api_version})"
                if api_version != kind.api_version
                else f"the kind in the data ({kind_name}) does not match the expected kind "
                f"({kind.kind})"
            )
        obj["apiVersion"] = kind.api_version
        obj["kind"] = kind.kind
        return obj

    @staticmethod
    def _check_namespace(kind: Kind, namespace: str | None, meta: dict[str, Any]) -> str | None:
        if not kind.namespaced:
            meta.pop("namespace", None)
            return None
        body_ns = meta.get("namespace")
        if body_ns and namespace and body_ns != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        namespace = namespace or body_ns
        if not namespace:
            raise errors.bad_request("the namespace of the object must be set")
        meta["namespace"] = namespace
        return str(namespace)

    # ------------------------------------------------------------------ update
    def replace(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_validation: str = "Strict",
        warnings: builtins.list[str] | None = None,
        raw_body: bytes | None = None,
        owned: bool = False,
    ) -> Obj:
        """A PUT of ``body``; ``raw_body`` is what the client sent, whose bytes of a claim's
        opaque parameters the server keeps; ``owned`` as for :meth:`create`."""
        if not isinstance(body, dict):
            raise errors.bad_request(
                f"the body of the request must be a JSON object, not {type(body).__name__}"
            )
        if kind is EVENT_V1:
            with self.lock:
                core = self._event_in(body, field_validation, warnings)
                return to_v1(
                    self.replace(
                        EVENT, namespace, name, core, subresource=subresource, dry_run=dry_run
                    )
                )
        with self.lock:
            obj = self._prune_unknown(
                kind, self._check_type(kind, body, copy=not owned), field_validation, warnings
            )
            meta = obj.get("metadata")
            if not isinstance(meta, dict):
                meta = obj["metadata"] = {}
            if meta.get("name") and meta["name"] != name:
                raise errors.bad_request(
                    f"the name of the object ({meta['name']}) does not match the name on the "
                    f"URL ({name})"
                )
            meta["name"] = name
            namespace = self._check_namespace(kind, namespace, meta)
            old = self._bucket(kind).get(self._key(kind, namespace, name))
            if old is None:
                if kind.create_on_update and subresource is None:
                    meta.pop("resourceVersion", None)
                    return self.create(
                        kind,
                        namespace,
                        obj,
                        dry_run=dry_run,
                        field_validation=field_validation,
                        warnings=warnings,
                        owned=True,  # _check_type's copy (or the owner's body)
                    )
                raise errors.not_found(kind, name)
            # only a claim's status keeps the bytes its writer sent
            sent = (
                rawjson.sent(raw_body, body)
                if raw_body is not None and kind.kind == "ResourceClaim" and subresource == "status"
                else None
            )
            return self._update(
                kind, old, obj, subresource=subresource, dry_run=dry_run, claim_bytes=sent
            )

    def patch(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        content_type: str,
        body: bytes,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_validation: str = "Strict",
        warnings: builtins.list[str] | None = None,
    ) -> Obj:
        with self.lock:
            old = self._require(kind, namespace, name)
            patched = _apply_patch(content_type, _view(kind, old), body)
            if not isinstance(patched.get("metadata"), dict):
                raise errors.bad_request("metadata must be an object")
            meta = patched["metadata"]
            if meta.get("name") != name:
                raise errors.bad_request(
                    f"the name of the object ({meta.get('name')}) does not match the name on "
                    f"the URL ({name})"
                )
            if kind.namespaced and meta.get("namespace") != _meta(old).get("namespace"):
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            if kind is EVENT_V1:
                core = self._event_in(patched, field_validation, warnings)
                return to_v1(self._update(EVENT, old, core, subresource=None, dry_run=dry_run))
            patched = self._check_type(kind, patched)
            self.validators.check_patched(kind, patched, strict=field_validation == "Strict")
            patched = self._prune_unknown(kind, patched, field_validation, warnings)
            held = None  # an allocation the patch sets is held as Go writes it
            if (old.get("status") or {}).get("allocation") is not None:
                held = rawjson.reencoded(self._held_bytes(old), content_type)
            return self._update(
                kind, old, patched, subresource=subresource, dry_run=dry_run, claim_bytes=held
            )

    def _update(
        self,
        kind: Kind,
        old: Obj,
        new: Obj,
        *,
        subresource: str | None,
        dry_run: bool,
        claim_bytes: rawjson.Raw | None = None,
    ) -> Obj:
        """``claim_bytes``: for a claim's status, its opaque parameters' bytes as written (the
        PUT's, or the patched stored ones; None: as Go writes them)."""
        old_meta = _meta(old)
        new_meta = _meta(new)
        name = str(old_meta.get("name"))
        want_rv = new_meta.get("resourceVersion")
        if want_rv and want_rv != old_meta.get("resourceVersion"):
            raise errors.conflict(kind, name, errors.STALE)
        if new_meta.get("uid") and new_meta["uid"] != old_meta.get("uid"):
            raise errors.conflict(
                kind,
                name,
                f"Precondition failed: UID in precondition: {new_meta['uid']}, UID in object "
                f"meta: {old_meta.get('uid')}",
            )
        if subresource == "status":
            # the status strategies keep the spec; most let metadata through
            # (pods/status, nodes/status ...), a few reset it (ResetObjectMetaForStatus)
            candidate = {**old, "metadata": new_meta}
            if "status" in new:
                candidate["status"] = new["status"]
            else:
                candidate.pop("status", None)
            if kind.status_resets_metadata:
                candidate["metadata"] = _reset_meta_for_status(new_meta, old_meta)
            elif kind is POD:  # podStatusStrategy keeps the owner references
                candidate["metadata"] = _keep(new_meta, old_meta, ("ownerReferences",))
        elif subresource is not None:
            raise errors.not_found(kind, name)
        else:
            candidate = apply_update_defaults(kind, new)
            if kind.status_subresource:
                if "status" in old:
                    candidate["status"] = old["status"]
                else:
                    candidate.pop("status", None)
        meta = dict(_meta(candidate))
        meta.pop("managedFields", None)
        meta.pop("selfLink", None)
        for owned in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if owned in old_meta:
                meta[owned] = old_meta[owned]
            else:
                meta.pop(owned, None)
        if kind.namespaced:
            meta["namespace"] = old_meta.get("namespace")
        candidate["metadata"] = meta
        if old_meta.get("deletionTimestamp"):
            added = [
                f
                for f in meta.get("finalizers") or []
                if f not in (old_meta.get("finalizers") or [])
            ]
            if added:
                raise errors.invalid(
                    kind,
                    name,
                    [
                        FieldError(
                            "metadata.finalizers",
                            "Forbidden",
                            "no new finalizers can be added if the object is being "
                            f"deleted, found new finalizers {json.dumps(added)}",
                        )
                    ],
                )
        if subresource is None:
            self._immutable(kind, old, candidate)
        if kind.tracks_generation and self._spec_part(candidate) != self._spec_part(old):
            meta["generation"] = int(old_meta.get("generation") or 0) + 1
        candidate["metadata"] = {
            **_meta(candidate),
            "resourceVersion": old_meta.get("resourceVersion"),
        }
        candidate = self._validate(kind, candidate)
        if kind.kind == "ResourceClaim" and subresource == "status":
            self._claim_status_rules(kind, old, candidate)
            claim_bytes = self._claim_bytes_rule(kind, old, candidate, claim_bytes)
            if not dry_run:
                self._claim_bytes[str(old_meta.get("uid"))] = claim_bytes
        if self._strip_rv(candidate) == self._strip_rv(old):
            return old
        if dry_run:
            return candidate
        meta = _meta(candidate)
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not self._graceful_pending(kind, candidate)
        ):
            self._remove(kind, old)
            return candidate
        meta["resourceVersion"] = self._next_rv()
        self._bucket(kind)[self._key(kind, meta.get("namespace"), name)] = candidate
        self._emit(kind, "MODIFIED", candidate, old)
        return candidate

    @staticmethod
    def _graceful_pending(kind: Kind, obj: Obj) -> bool:
        return kind is POD and bool(_meta(obj).get("deletionGracePeriodSeconds"))

    def _held_bytes(self, claim: Obj) -> rawjson.Raw:
        return self._claim_bytes.get(str(_meta(claim).get("uid"))) or rawjson.stored_form(claim)

    def _claim_bytes_rule(
        self, kind: Kind, old: Obj, new: Obj, written: rawjson.Raw | None
    ) -> rawjson.Raw:
        """An allocation kept must keep its opaque parameters' bytes (the real server compares
        them byte for byte); returns the bytes to hold."""
        written = rawjson.stored_form(new) if written is None else written
        old_alloc = (old.get("status") or {}).get("allocation")
        new_alloc = (new.get("status") or {}).get("allocation")
        if old_alloc is not None and new_alloc is not None and written != self._held_bytes(old):
            raise errors.invalid(
                kind,
                str(_meta(old).get("name")),
                [FieldError("status.allocation", "Invalid value", MODIFIED_ONCE_SET)],
            )
        return written if new_alloc is not None else []

    @staticmethod
    def _claim_status_rules(kind: Kind, old: Obj, new: Obj) -> None:
        name = str(_meta(old).get("name"))
        old_alloc = (old.get("status") or {}).get("allocation")
        new_alloc = (new.get("status") or {}).get("allocation")
        if old_alloc is not None and new_alloc is not None and old_alloc != new_alloc:
            raise errors.invalid(
                kind,
                name,
                [
                    FieldError(
                        "status.allocation",
                        "Invalid value",
                        "field is immutable",
                        new_alloc,
                        show_value=False,
                    )
                ],
            )
        if (
            old_alloc is not None
            and new_alloc is None
            and (old.get("status") or {}).get("reservedFor")
            and (new.get("status") or {}).get("reservedFor")
        ):
            raise errors.invalid(
                kind,
                name,
                [
                    FieldError(
                        "status.allocation",
                        "Forbidden",
                        "may not be removed while `reservedFor` is set",
                    )
                ],
            )
        if _meta(old).get("deletionTimestamp") and _added_reservations(old, new):
            # upstream's validateResourceClaimStatusUpdate: a claim marked for deletion takes
            # no new consumer
            raise errors.invalid(
                kind,
                name,
                [
                    FieldError(
                        "status.reservedFor",
                        "Forbidden",
                        "new entries may not be added while `deallocationRequested` or "
                        "`deletionTimestamp` are set",
                    )
                ],
            )
        if old_alloc is None and new_alloc is not None and _meta(old).get("deletionTimestamp"):
            raise errors.invalid(
                kind,
                name,
                [
                    FieldError(
                        "status.allocation",
                        "Forbidden",
                        "new allocation not allowed while the claim is being deleted",
                    )
                ],
            )

    @staticmethod
    def _immutable(kind: Kind, old: Obj, new: Obj) -> None:
        name = str(_meta(old).get("name"))
        if kind.spec_immutable and not codec.equal(new.get("spec"), old.get("spec")):
            raise errors.invalid(
                kind,
                name,
                [
                    FieldError(
                        "spec",
                        "Invalid value",
                        "field is immutable",
                        new.get("spec"),
                        show_value=False,
                    )
                ],
            )
        if kind.kind == "ResourceSlice":
            old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
            problems = [
                FieldError(path, "Invalid value", "field is immutable", value)
                for path, value, before in (
                    ("spec.driver", new_spec.get("driver"), old_spec.get("driver")),
                    (
                        "spec.pool.name",
                        (new_spec.get("pool") or {}).get("name"),
                        (old_spec.get("pool") or {}).get("name"),
                    ),
                    ("spec.nodeName", new_spec.get("nodeName"), old_spec.get("nodeName")),
                )
                if value != before
            ]
            if problems:
                raise errors.invalid(kind, name, problems)
        if kind.kind == "Pod":
            _check_pod_update(kind, old, new)
        elif kind.kind in _VOLUME_IMMUTABLE:
            _check_volume_update(kind, old, new)

    # ------------------------------------------------------------------ delete
    def delete(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        options: Any = None,
        *,
        dry_run: bool = False,
    ) -> Obj:
        """DELETE: preconditions, pod graceful deletion, finalizers, namespace termination."""
        return _view(kind, self._delete(kind, namespace, name, options, dry_run=dry_run))

    def _delete(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        options: Any = None,
        *,
        dry_run: bool = False,
    ) -> Obj:
        options = options if isinstance(options, dict) else {}
        with self.lock:
            old = self._require(kind, namespace, name)
            meta = _meta(old)
            pre = options.get("preconditions") or {}
            # rest.BeforeDelete checks the preconditions before anything else
            if pre.get("uid") and pre["uid"] != meta.get("uid"):
                raise errors.precondition_failed(
                    kind,
                    name,
                    f"the UID in the precondition ({pre['uid']}) does not match the UID in "
                    f"record ({meta.get('uid')}). The object might have been deleted and then "
                    "recreated",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
                raise errors.precondition_failed(
                    kind,
                    name,
                    f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does "
                    "not match the ResourceVersion in record "
                    f"({meta.get('resourceVersion')}). The object might have been modified",
                )
            if dry_run:
                return old
            grace = options.get("gracePeriodSeconds")
            if kind is POD and self.pod_graceful_deletion:
                grace_s = self._pod_grace(old, grace)
                if grace_s > 0 or meta.get("deletionGracePeriodSeconds") != 0:
                    # the pod strategy is graceful even at 0 s: the store writes the
                    # deletionTimestamp (a MODIFIED event) and deletes right after
                    # (generic/registry/store.go, updateForGracefulDeletionAndFinalizers)
                    old = self._mark_deleting(kind, old, grace_s)
                    if grace_s > 0:
                        return old
            if kind is NAMESPACE:
                return self._delete_namespace(old)
            if meta.get("finalizers"):
                return self._mark_deleting(kind, old, None)
            return self._remove(kind, old)

    def _pod_grace(self, pod: Obj, requested: Any) -> int:
        spec = pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in {"Succeeded", "Failed"}:
            return 0
        if isinstance(requested, int):
            grace = requested
        else:
            grace = int(spec.get("terminationGracePeriodSeconds") or 30)
        current = _meta(pod).get("deletionGracePeriodSeconds")
        if current is not None and grace >= int(current):
            return int(current)
        return max(grace, 0)

    def _mark_deleting(self, kind: Kind, old: Obj, grace: int | None) -> Obj:
        meta = dict(_meta(old))
        if grace is not None:
            if meta.get("deletionGracePeriodSeconds") == grace:
                return old
            stamp = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=grace)
            if not meta.get("deletionTimestamp") and meta.get("generation"):
                meta["generation"] = int(meta["generation"]) + 1  # rest.BeforeDelete
            meta["deletionTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["deletionGracePeriodSeconds"] = grace
        else:
            if meta.get("deletionTimestamp") and not meta.get("deletionGracePeriodSeconds"):
                return old
            meta["deletionTimestamp"] = meta.get("deletionTimestamp") or now()
            meta["deletionGracePeriodSeconds"] = 0
        meta["resourceVersion"] = self._next_rv()
        new = {**old, "metadata": meta}
        self._bucket(kind)[self._key(kind, meta.get("namespace"), str(meta["name"]))] = new
        self._emit(kind, "MODIFIED", new, old)
        return new

    def _remove(self, kind: Kind, old: Obj) -> Obj:
        meta = _meta(old)
        key = self._key(kind, meta.get("namespace"), str(meta.get("name")))
        stored = self._bucket(kind).pop(key)
        gone = {**stored, "metadata": {**_meta(stored), "resourceVersion": self._next_rv()}}
        self._emit(kind, "DELETED", gone, stored)
        if kind.namespaced:
            self._maybe_finish_namespace(str(meta.get("namespace")))
        return gone

    def _delete_namespace(self, ns_obj: Obj) -> Obj:
        name = str(_meta(ns_obj).get("name"))
        if not _meta(ns_obj).get("deletionTimestamp"):
            meta = {
                **_meta(ns_obj),
                "deletionTimestamp": now(),
                "deletionGracePeriodSeconds": 0,
                "resourceVersion": self._next_rv(),
            }
            updated = {**ns_obj, "metadata": meta, "status": {"phase": "Terminating"}}
            self._bucket(NAMESPACE)[("", name)] = updated
            self._emit(NAMESPACE, "MODIFIED", updated, ns_obj)
            ns_obj = updated
        for kind in ALL_KINDS:
            if not kind.namespaced:
                continue
            for key, obj in list(self._bucket(kind).items()):
                if key[0] != name or kind is NAMESPACE:
                    continue
                if _meta(obj).get("finalizers"):
                    self._mark_deleting(kind, obj, None)
                else:
                    self._remove(kind, obj)
        self._maybe_finish_namespace(name)
        return self._bucket(NAMESPACE).get(("", name), ns_obj)

    def _maybe_finish_namespace(self, name: str) -> None:
        ns_obj = self._bucket(NAMESPACE).get(("", name))
        if ns_obj is None or not _meta(ns_obj).get("deletionTimestamp"):
            return
        for kind in ALL_KINDS:
            if kind.namespaced and any(key[0] == name for key in self._bucket(kind)):
                return
        self._remove(NAMESPACE, ns_obj)

    def delete_collection(
        self,
        kind: Kind,
        namespace: str | None,
        *,
        labels: LabelSelector | None,
        fields: FieldSelector | None,
        options: Any = None,
    ) -> builtins.list[Obj]:
        with self.lock:
            victims = self.list(kind, namespace, labels=labels, fields=fields).items
            return [
                self.delete(kind, _meta(v).get("namespace"), str(_meta(v).get("name")), options)
                for v in victims
            ]

    # ------------------------------------------------------------------ pods
    def bind(self, namespace: str, name: str, binding: Any) -> None:
        """``pods/binding``: set ``spec.nodeName`` and ``PodScheduled=True`` and clear
        ``status.nominatedNodeName`` (KEP-5278: the API server does so since 1.35, feature gate
        ``ClearingNominatedNodeNameAfterBinding``, beta and on by default) (404/409 rules)."""
        if not isinstance(binding, dict):
            raise errors.bad_request("the body of the request must be a Binding object")
        meta = binding.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        target = binding.get("target") or {}
        if target.get("kind") not in (None, "", "Node"):
            raise errors.invalid(
                POD,
                name,
                [
                    FieldError(
                        "target.kind",
                        "Invalid value",
                        "must be empty or 'Node'",
                        target.get("kind"),
                    )
                ],
            )
        node = target.get("name")
        if not node:
            raise errors.invalid(POD, name, [FieldError("target.name", "Required value", "")])
        with self.lock:
            old = self._require(POD, namespace, name)
            old_meta = _meta(old)
            binding_kind = POD
            if meta.get("uid") and meta["uid"] != old_meta.get("uid"):
                raise errors.conflict(
                    binding_kind,
                    name,
                    f"Precondition failed: UID in precondition: {meta['uid']}, UID in object "
                    f"meta: {old_meta.get('uid')}",
                    resource="pods/binding",
                )
            if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta.get(
                "resourceVersion"
            ):
                raise errors.conflict(binding_kind, name, errors.STALE, resource="pods/binding")
            if old_meta.get("deletionTimestamp"):
                raise errors.conflict(
                    binding_kind,
                    name,
                    f"pod {name} is being deleted, cannot be assigned to a host",
                    resource="pods/binding",
                )
            current = (old.get("spec") or {}).get("nodeName")
            if current:
                raise errors.conflict(
                    binding_kind,
                    name,
                    f'pod {name} is already assigned to node "{current}"',
                    resource="pods/binding",
                )
            new = codec.copy(old)
            new["spec"]["nodeName"] = node
            if meta.get("annotations"):
                new["metadata"].setdefault("annotations", {}).update(meta["annotations"])
            status = new.setdefault("status", {})
            conditions = [
                c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"
            ]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now(),
                }
            )
            status["conditions"] = conditions
            status.pop("nominatedNodeName", None)
            new = self._validate(POD, new)
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._bucket(POD)[self._key(POD, namespace, name)] = new
            self._emit(POD, "MODIFIED", new, old)

    def finish_pod_deletions(self, node: str | None = None) -> int:
        """Play the kubelet: remove pods whose graceful deletion is pending; returns how many."""
        with self.lock:
            count = 0
            for obj in list(self._bucket(POD).values()):
                meta = _meta(obj)
                if not meta.get("deletionTimestamp") or not meta.get("deletionGracePeriodSeconds"):
                    continue
                if node is not None and (obj.get("spec") or {}).get("nodeName") != node:
                    continue
                self.delete(
                    POD, meta.get("namespace"), str(meta.get("name")), {"gracePeriodSeconds": 0}
                )
                count += 1
            return count

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds or ``timeout`` seconds pass; False on timeout.

        The predicate runs without the store lock (it may call the emulator over HTTP); it is
        re-checked after every commit and at least every 50 ms (for state outside the store,
        such as an informer's cache)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                seen = self.rv
            if predicate():
                return True
            with self.changed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if self.rv == seen:
                    self.changed.wait(min(left, 0.05))

    def close_watchers(self, payload: Any = None, kinds: Iterable[Kind] | None = None) -> int:
        keys = {k.key for k in kinds} if kinds is not None else None
        with self.lock:
            targets = [w for w in self._watchers if keys is None or w.kind.key in keys]
            for watcher in targets:
                watcher.close(payload)
            return len(targets)


_POD_MUTABLE_CONTAINER: Final = ("image",)


def _check_pod_update(kind: Kind, old: Obj, new: Obj) -> None:
    """Pod spec updates may only change images, activeDeadlineSeconds, add tolerations and
    remove scheduling gates (the same set the API server allows)."""
    old_spec = codec.copy(old.get("spec") or {})
    new_spec = codec.copy(new.get("spec") or {})
    for spec in (old_spec, new_spec):
        for group in ("containers", "initContainers", "ephemeralContainers"):
            for container in spec.get(group) or []:
                if isinstance(container, dict):
                    container.pop("image", None)
        spec.pop("activeDeadlineSeconds", None)
    old_tol = old_spec.pop("tolerations", None) or []
    new_tol = new_spec.pop("tolerations", None) or []
    old_gates = old_spec.pop("schedulingGates", None) or []
    new_gates = new_spec.pop("schedulingGates", None) or []
    ok = (
        old_spec == new_spec
        and all(t in new_tol for t in old_tol)
        and all(g in old_gates for g in new_gates)
    )
    if not ok:
        name = str(_meta(old).get("name"))
        raise errors.invalid(
            kind,
            name,
            [
                FieldError(
                    "spec",
                    "Forbidden",
                    "pod updates may not change fields other than `spec.containers[*].image`,"
                    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,"
                    "`spec.tolerations` "
                    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                    "(allow it to be set to 1 if it was previously negative)",
                )
            ],
        )


#: What the API server refuses to change once set, per volume kind (top-level object fields for
#: a StorageClass, ``spec`` fields otherwise): a PVC's spec except ``resources`` and
#: ``volumeAttributesClassName`` (``volumeName`` only while empty); a PV's ``volumeMode`` and
#: node affinity; a StorageClass's provisioner, parameters, reclaim policy and binding mode.
_VOLUME_IMMUTABLE: Final[Mapping[str, tuple[str, ...]]] = {
    "PersistentVolumeClaim": (
        "accessModes",
        "selector",
        "storageClassName",
        "volumeMode",
        "dataSource",
        "dataSourceRef",
    ),
    "PersistentVolume": ("volumeMode", "nodeAffinity"),
    "StorageClass": ("provisioner", "parameters", "reclaimPolicy", "volumeBindingMode"),
}


def _check_volume_update(kind: Kind, old: Obj, new: Obj) -> None:
    if kind.kind == "StorageClass":
        before, after, prefix = old, new, ""
    else:
        before, after, prefix = old.get("spec") or {}, new.get("spec") or {}, "spec."
    problems = [
        FieldError(f"{prefix}{name}", "Invalid value", "field is immutable", after.get(name))
        for name in _VOLUME_IMMUTABLE[kind.kind]
        if before.get(name) != after.get(name)
        and not (
            kind.kind == "PersistentVolume" and name == "nodeAffinity" and not before.get(name)
        )
    ]
    if (
        kind.kind == "PersistentVolumeClaim"
        and before.get("volumeName")
        and before.get("volumeName") != after.get("volumeName")
    ):
        problems.append(
            FieldError(
                "spec.volumeName", "Invalid value", "field is immutable", after.get("volumeName")
            )
        )
    if problems:
        raise errors.invalid(kind, str(_meta(old).get("name")), problems)


def _apply_patch(content_type: str, obj: Obj, body: bytes) -> Obj:
    if content_type == JSON_PATCH:
        return apply_json_patch(obj, body)
    if content_type == MERGE_PATCH:
        return apply_merge_patch(obj, body)
    if content_type == STRATEGIC_MERGE_PATCH:
        return apply_strategic_merge_patch(obj, body)
    raise errors.unsupported_media_type(content_type)


def _stored(kind: Kind) -> Kind:
    """The kind whose form is stored (events.k8s.io Events are stored as core Events)."""
    return EVENT if kind is EVENT_V1 else kind


def _view(kind: Kind, obj: Obj) -> Obj:
    """A stored object as ``kind`` shows it."""
    return to_v1(obj) if kind is EVENT_V1 else obj


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _etcd_key(key: ObjKey) -> str:
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


def _parse_rv(value: str | None) -> int:
    try:
        rv = int(str(value))
    except ValueError:
        raise errors.bad_request(
            f'resourceVersion: Invalid value: "{value}": must be an integer'
        ) from None
    if rv < 0:
        raise errors.bad_request(f'resourceVersion: Invalid value: "{value}": must be non-negative')
    return rv


def _encode_continue(rv: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


_STATUS_RESET: Final = (
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "deletionTimestamp",
    "generation",
)


def _keep(new_meta: dict[str, Any], old_meta: dict[str, Any], keys: Iterable[str]) -> Obj:
    """``new_meta`` with ``keys`` as they are in ``old_meta`` (absent there: absent)."""
    meta = {k: v for k, v in new_meta.items() if k not in keys}
    meta.update({k: old_meta[k] for k in keys if k in old_meta})
    return meta


def _reset_meta_for_status(new_meta: dict[str, Any], old_meta: dict[str, Any]) -> Obj:
    """``metav1.ResetObjectMetaForStatus``: what a status write may not change."""
    return _keep(new_meta, old_meta, _STATUS_RESET)


def _check_list_options(rv: str | None, match: str | None, continue_token: str | None) -> None:
    """``ValidateListOptions`` (apimachinery ``meta/internalversion/validation``): a bad
    ``resourceVersionMatch`` is a 422 on ``ListOptions``, checked before anything is read."""
    if not match:
        return
    problems: list[FieldError] = []
    if rv in (None, ""):
        problems.append(
            FieldError(
                "resourceVersionMatch",
                "Forbidden",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            )
        )
    if continue_token:
        problems.append(
            FieldError(
                "resourceVersionMatch",
                "Forbidden",
                "resourceVersionMatch is forbidden when continue is provided",
            )
        )
    if match not in ("Exact", "NotOlderThan"):
        problems.append(
            FieldError(
                "resourceVersionMatch",
                "Unsupported value",
                'supported values: "Exact", "NotOlderThan", ""',
                match,
            )
        )
    if match == "Exact" and rv == "0":
        problems.append(
            FieldError(
                "resourceVersionMatch",
                "Forbidden",
                'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
            )
        )
    if problems:
        raise errors.invalid_options("ListOptions", problems)


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        rv = int(data["rv"])
        start = str(data["start"]).rstrip("\x00")
        version = data.get("v")
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise errors.bad_request(f"continue key is not valid: {exc}") from exc
    if version != "meta.k8s.io/v1":
        raise errors.bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version "
            f"{version})"
        )
    return rv, start


def _added_reservations(old: Obj, new: Obj) -> bool:
    """Whether ``new`` reserves a claim for a consumer that ``old`` did not (whole references
    compared, as upstream's set difference)."""

    def refs(obj: Obj) -> set[tuple[tuple[str, Any], ...]]:
        entries = (obj.get("status") or {}).get("reservedFor") or []
        return {tuple(sorted(r.items())) for r in entries if isinstance(r, dict)}

    return bool(refs(new) - refs(old))

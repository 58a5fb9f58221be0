"""List+watch caches of raw JSON, and the claim overlay that makes in-flight decisions visible.

:class:`Informer` keeps one resource in memory: it lists, then watches from the list's
resourceVersion (the list is read page by page as it arrives, the next page requested before the
current one is parsed); when a watch ends it resumes from the last resourceVersion it saw (bookmarks
included); on 410 Gone it relists and reports the difference (objects that vanished during the
gap are reported as deletions); on any other API error it backs off and resumes. Objects are
stored as the raw JSON the API server sent and are never mutated; a changed object replaces
the stored one. ``version`` counts changes, so readers can tell cheaply whether anything moved.

:class:`ClaimOverlay` is the controller's own view on top of the claim informer, as
kube-scheduler's assume cache: a claim this controller has decided to allocate (``pending``)
or has written (``assumed``, keyed by the resourceVersion the write returned) is shown with
that state until the informer delivers an object at least as new. Pending state is what the
scheduling loop and the commit read (a pod sharing a claim sees it allocated); the engine's
feed (:mod:`controller.feed`) reads only the written state (:meth:`ClaimOverlay.latest_written`,
:meth:`ClaimOverlay.written`): the engine counts this process's decisions from the moment it
assumes them, so a device is never handed out twice while their writes are in flight. It also
shows the last written state of a deleted claim a running pod still uses, under a key of its
own, for as long as :mod:`controller.retention` keeps it.

:class:`ClusterCache` bundles the informers the controller needs and fans their changes out to
subscribers (the scheduling loop, the engine's feed, the repairer, the deallocator, the volume
binder): nodes, pods, DeviceClasses, ResourceSlices and ResourceClaims; what the volume rules
read (PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes, CSIDrivers,
CSIStorageCapacities, VolumeAttachments); PodDisruptionBudgets (for preemption); Namespaces
(their labels, for pod affinity terms' ``namespaceSelector``); and, when default topology
spreading is on, the objects whose selectors kube-scheduler's default spreading reads
(Services, ReplicationControllers, ReplicaSets, StatefulSets).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from controller.api import (
    DEVICE_CLASSES,
    JSON,
    NAMESPACES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    REPLICA_SETS,
    REPLICATION_CONTROLLERS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SERVICES,
    STATEFUL_SETS,
    VOLUME_RESOURCES,
    Api,
    Resource,
    meta,
    object_key,
)
from driver.api.claims import DeviceClass
from driver.api.errors import ApiError, BiaxialError, GoneError
from driver.api.model import ResourceSlice, WireSlice
from driver.api.nodes import Node
from driver.scheduling.preemption import DisruptionBudget
from kubeapi import codec
from kubeapi.retry import Backoff

log = logging.getLogger(f"biaxial.{__name__}")

#: ``(resource kind, event type, old object or None, new object or None)``, as stored (raw JSON
#: for pods and claims, the core's models for nodes, slices and classes).
Handler = Callable[[str, str, Any, Any], None]
_Stored = TypeVar("_Stored")
_Model = TypeVar("_Model")


def slim(obj: JSON) -> JSON:
    """The object without ``metadata.managedFields`` (often most of its size; never read)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj


#: Strings longer than this are left as decoded (no claim repeats them: names, UIDs, messages).
_INTERN_MAX: Final = 64
#: Fields whose strings nothing else repeats (UIDs, versions, share IDs): left as decoded,
#: since interning a string that is not repeated saves nothing and adds an entry to the
#: interpreter's table (7.7 MB of table at 35,000 held claims). Names and times are interned:
#: a claim's name may be its pod's, which ``reservedFor`` repeats, and claims made in the same
#: second have equal times.
_UNIQUE_STRINGS: Final = frozenset({"uid", "resourceVersion", "shareID"})
#: The parts of a claim that many claims have equal (the spec of claims made from one
#: template, the allocations on one node, of one share size, the configuration of one
#: DeviceClass that an allocation copies): stored once, whoever has them (stored objects are
#: never mutated).
_SHARED_PARTS: Final = frozenset({"spec", "nodeSelector", "consumedCapacity", "config"})
#: The keys :func:`_member` treats apart from the rest.
_KEPT_APART: Final = _SHARED_PARTS | _UNIQUE_STRINGS
#: Distinct shared parts kept before the table is started afresh (so that it stays bounded).
_SHARED_MAX: Final = 50_000
#: hash of a part's encoding -> the part (a hash, not the encoding: a spec that no other
#: claim has would otherwise cost its encoding here besides its object)
_shared: dict[int, Any] = {}


def _interned(value: Any) -> Any:
    """``value`` (JSON data) rebuilt with its short strings interned and the parts named in
    :data:`_SHARED_PARTS` shared with equal ones stored before."""
    kind = type(value)
    if kind is str:
        return sys.intern(value) if len(value) <= _INTERN_MAX else value
    if kind is dict:
        return _interned_dict(value)
    if kind is list:
        return [_interned(v) for v in value]
    return value


def _interned_dict(value: dict[str, Any]) -> dict[str, Any]:
    """:func:`_interned` of an object. Its strings and scalars are taken here, not by a call
    each (they are half of a claim's values; the first allocated version of every claim is
    rebuilt): 7 % less CPU for the claims of a 10,000-node run's watch, replayed."""
    rebuilt: dict[str, Any] = {}
    for k, v in value.items():
        kind = type(v)
        if k in _KEPT_APART:  # (most keys are neither shared nor unique)
            rebuilt[k] = _member(k, v)
        elif kind is str:
            rebuilt[k] = sys.intern(v) if len(v) <= _INTERN_MAX else v
        elif kind is dict:
            rebuilt[k] = _interned_dict(v)
        elif kind is list:
            rebuilt[k] = [_interned(item) for item in v]
        else:
            rebuilt[k] = v
    return rebuilt


def _member(key: str, value: Any) -> Any:
    """The value of field ``key`` as :func:`_interned` keeps it."""
    if key in _SHARED_PARTS:
        return _stored_part(value)
    if key in _UNIQUE_STRINGS and type(value) is str:
        return value
    return _interned(value)


def _stored_part(value: Any) -> Any:
    """``_share(_interned(value))``, with the table looked up before the rebuild: most parts
    have an equal one stored already (the specs of claims from one template, the allocations
    on one node), and rebuilding them only to find it was 29 of the 71 calls to
    :func:`_interned` that storing a newly allocated share claim made."""
    if type(value) is not dict and type(value) is not list:
        return _interned(value)
    key = hash(codec.dumps(value))  # (equal values, interned or not, encode alike)
    found = _shared.get(key)
    if found is not None and codec.equal(found, value):
        return found
    return _share(_interned(value), key)


def _share(value: Any, key: int | None = None) -> Any:
    """``value`` (as :func:`_interned` built it), or the equal part stored before; ``key``:
    the hash of its encoding, when known."""
    if type(value) is not dict and type(value) is not list:
        return value
    if key is None:
        key = hash(codec.dumps(value))
    found = _shared.get(key)
    if found is None:
        if len(_shared) >= _SHARED_MAX:
            _shared.clear()
        _shared[key] = value
        return value
    return found if codec.equal(found, value) else value  # (unequal: a hash collision)


def slim_claim(obj: JSON, previous: JSON | None = None) -> JSON:
    """What the caches keep of a ResourceClaim: :func:`slim`, and for an allocated claim the
    whole object rebuilt with the short strings that claims repeat interned and the spec, node
    selector and consumed capacities shared with equal ones. Tens of thousands of held claims
    repeat them (the decoder shares their keys already): a held claim's object is 5.0 -> 3.2
    KB, 2.2 KB with its spec shared (claims from one template have equal specs). The claims
    not allocated yet (those of the pods being placed) are kept as they came: they change
    again soon. Data nested too deep to rebuild is kept as it came.

    ``previous``, the claim's stored object when it was allocated already (so rebuilt): its
    ``spec`` and status fields equal to the new ones are taken as they are, not rebuilt
    again (a claim's spec never changes, nor its allocation once set; a comparison costs a
    fraction of the rebuild)."""
    obj = slim(obj)
    status = obj.get("status")
    if type(status) is not dict or not status.get("allocation"):
        return obj
    if previous is not None:
        before = previous.get("status")
        if type(before) is not dict or not before.get("allocation"):
            previous = None  # kept as it came, not rebuilt: nothing to take from it
    if previous is None:
        try:
            rebuilt: JSON = _interned(obj)
        except RecursionError:
            return obj
        return rebuilt
    kept: JSON = {}
    try:
        for k, v in obj.items():
            if k == "status":
                old_status = previous["status"]
                kept[k] = {
                    sk: old_status[sk]
                    if sk in old_status and codec.equal(old_status[sk], sv)
                    else _member(sk, sv)
                    for sk, sv in v.items()
                }
            elif k == "spec" and codec.equal(previous.get(k), v):
                kept[k] = previous[k]
            else:
                kept[k] = _member(k, v)
    except RecursionError:
        return obj
    return kept


def parse_or_skip(kind: str, parse: Callable[[JSON], _Model], raw: JSON) -> _Model | None:
    """The model of ``raw``; None, with a warning, when it is malformed (it is left out)."""
    try:
        return parse(raw)
    except BiaxialError as exc:
        log.warning("%s %s is malformed, skipped: %s", kind, object_key(raw), exc)
        return None


def _parser(kind: str, parse: Callable[[JSON], _Model]) -> Callable[[JSON], _Model | None]:
    return functools.partial(parse_or_skip, kind, parse)


@dataclass(frozen=True, slots=True)
class Labelled:
    """What the caches keep of a Namespace: its name and labels (``namespaceSelector``)."""

    name: str
    labels: Mapping[str, str]

    @classmethod
    def of(cls, raw: JSON) -> Labelled:
        m = meta(raw)
        return cls(
            str(m.get("name") or ""), {str(k): str(v) for k, v in (m.get("labels") or {}).items()}
        )


@dataclass(frozen=True, slots=True)
class Selecting:
    """What the caches keep of a Service, ReplicationController, ReplicaSet or StatefulSet:
    its ``spec.selector`` as the API shows it (default topology spreading reads it)."""

    kind: str
    namespace: str
    name: str
    selector: Mapping[str, Any] | None

    @classmethod
    def of(cls, kind: str, raw: JSON) -> Selecting:
        m = meta(raw)
        selector = (raw.get("spec") or {}).get("selector")
        return cls(
            kind,
            str(m.get("namespace") or "default"),
            str(m.get("name") or ""),
            selector if isinstance(selector, Mapping) else None,
        )


ADDED: Final = "ADDED"
#: A relist reads a page this many objects at a time, yielding to the loop in between: the
#: client has asked for the next page already (:meth:`kubeapi.Client.pages`), so the API
#: server prepares it while this one is parsed, and the loop stays responsive.
YIELD_EVERY: Final = 64
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"
#: How much of an object or error a log line quotes.
_QUOTE: Final = 200


def _prefix(value: object) -> str:
    """The start of ``value``'s text, for a log line (objects may be megabytes, or nested
    too deep for ``repr``)."""
    try:
        text = str(value)
    except RecursionError:
        text = f"<{type(value).__name__} nested too deep to show>"
    return text if len(text) <= _QUOTE else text[:_QUOTE] + "..."


_STRING_MAPS: Final = ("labels", "annotations")
_STRINGS: Final = ("name", "namespace", "resourceVersion", "uid", "deletionTimestamp")
# (isinstance against a tuple, and loops rather than all() over generators: the same checks
# at about half the cost, 1.9 -> 1.0 us a pod and 1.2 -> 0.6 a claim; every watch event
# and listed object passes here, about 4.3 events per bound pod)
_STRING_OR_NONE: Final = (str, type(None))
_OBJECT_OR_NONE: Final = (dict, type(None))


def envelope_problem(obj: object) -> str | None:
    """What is wrong with the parts of ``obj`` every reader relies on (None: nothing): an
    object; ``metadata`` an object with a string name; names, versions and timestamps strings;
    labels and annotations string maps; owner references objects; finalizers strings; ``spec``
    and ``status`` objects. The API server's schemas guarantee all of it; an object without it
    is left out by the informers, so no reader meets it."""
    if not isinstance(obj, dict):
        return f"not an object ({type(obj).__name__})"
    m = obj.get("metadata")
    if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
        return "metadata.name missing or not a string"
    for field in _STRINGS:
        if not isinstance(m.get(field), _STRING_OR_NONE):
            return f"metadata.{field} is not a string"
    for field in _STRING_MAPS:
        values = m.get(field)
        if values is not None and not (isinstance(values, dict) and _string_map(values)):
            return f"metadata.{field} is not a map of strings"
    owners = m.get("ownerReferences")
    if owners is not None and not (isinstance(owners, list) and _all_are(owners, dict)):
        return "metadata.ownerReferences is not a list of objects"
    finalizers = m.get("finalizers")
    if finalizers is not None and not (isinstance(finalizers, list) and _all_are(finalizers, str)):
        return "metadata.finalizers is not a list of strings"
    for part in ("spec", "status"):
        if not isinstance(obj.get(part), _OBJECT_OR_NONE):
            return f"{part} is not an object"
    return None


def _string_map(values: dict[Any, Any]) -> bool:
    for k, v in values.items():  # noqa: SIM110 - a loop: no generator (see above)
        if not isinstance(k, str) or not isinstance(v, str):
            return False
    return True


def _all_are(items: list[Any], kind: type) -> bool:
    for item in items:  # noqa: SIM110 - a loop: no generator (see above)
        if not isinstance(item, kind):
            return False
    return True


def rv_int(obj: Mapping[str, Any] | None) -> int:
    """An object's resourceVersion as an integer (-1 when missing or not numeric).

    resourceVersions are opaque by contract, but every API server in use (etcd revisions, the
    emulator) produces integers; like kube-scheduler's assume cache, this compares them so.
    """
    if obj is None:
        return -1
    try:
        return int(meta(obj).get("resourceVersion") or -1)
    except ValueError:
        return -1


@dataclass(frozen=True, slots=True)
class TypedList(Generic[_Stored]):
    """How an informer reads its list pages typed (:func:`kubeapi.codec.loads_list`):
    ``wire``, the ``msgspec`` type of an item's common form, whose ``metadata`` is the item's
    metadata as JSON data and which admits only items whose ``spec`` is an object and which
    have no ``status`` (so the item's envelope is its metadata's); ``transform``, what the
    store keeps of such an item, as the informer's own transform gives it for the item's
    JSON data, or None where the typed form does not decide (the JSON data is then read)."""

    wire: type
    transform: Callable[[Any], _Stored | None]


@dataclass(slots=True)
class InformerStats:
    lists: int = 0
    watches: int = 0
    relists_on_gone: int = 0
    errors: int = 0
    malformed: int = 0  # objects left out because they could not be read


class Informer(Generic[_Stored]):
    """One resource kept in memory by list+watch (see the module docstring).

    ``transform`` turns each object the API server sends into what the store keeps, once, as
    client-go's informer transform does: the store holds one representation of each object
    (the default drops ``metadata.managedFields``, which nothing here reads; the slice and node
    informers keep the core's parsed models, which the decision engine reads, instead of raw
    JSON beside them). Handlers and readers see the stored values. With ``typed``
    (:class:`TypedList`), list pages are read typed: an item of the common form goes from its
    text to what the store keeps without the JSON data in between (the slice informer: most
    of what start-up decodes), and is stored exactly as ``transform`` would store it.
    """

    def __init__(
        self,
        api: Api,
        resource: Resource,
        *,
        transform: Callable[[JSON], _Stored],
        handlers: Iterable[Handler] = (),
        field_selector: str | None = None,
        typed: TypedList[_Stored] | None = None,
        watch_timeout_s: int = 300,
        retry_initial_s: float = 0.2,
        retry_max_s: float = 5.0,
    ) -> None:
        self.api = api
        self.resource = resource
        self.kind = resource.kind
        self.field_selector = field_selector
        self.store: dict[str, _Stored] = {}
        self.resource_version = ""
        self.version = 0
        self.synced = asyncio.Event()
        self.stats = InformerStats()
        self._transform = transform
        self._typed = typed
        self._versions: dict[str, str] = {}  # key -> resourceVersion of the stored object
        self._handlers = list(handlers)
        self._watch_timeout_s = watch_timeout_s
        self._backoff = Backoff(retry_initial_s, retry_max_s, jitter=0.5)

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def get(self, key: str) -> _Stored | None:
        return self.store.get(key)

    def _notify(self, etype: str, old: _Stored | None, new: _Stored | None) -> None:
        self.version += 1
        for handler in self._handlers:
            try:
                handler(self.kind, etype, old, new)
            except Exception:
                log.exception("%s handler failed on %s", self.kind, etype)

    async def relist(self) -> None:
        """List everything and replace the store, reporting what changed."""
        old_store, old_versions = self.store, self._versions
        fresh: dict[str, _Stored] = {}
        versions: dict[str, str] = {}
        changed: list[str] = []
        resource_version = ""
        typed = self._typed
        async for page in self.api.pages(
            self.resource,
            field_selector=self.field_selector,
            typed=typed.wire if typed is not None else None,
        ):
            resource_version = page.resource_version
            for n, item in enumerate(page.items, 1):
                entry: object = item  # (JSON data, or with typed pages a codec.Typed)
                wire: codec.Typed[Any] | None = None
                obj = item
                if type(entry) is codec.Typed:
                    # Its envelope is its metadata's: the wire type admits an object with a
                    # spec that is one and no status (TypedList's contract).
                    wire = entry
                    obj = {"metadata": entry.value.metadata}
                identity = self._identity(obj)
                if identity is None:
                    continue
                key, rv = identity
                if key in old_store and old_versions.get(key) == rv:
                    fresh[key] = old_store[key]  # unchanged: keep what is stored
                    versions[key] = rv
                    continue
                if wire is not None and typed is not None:
                    admitted = self._admit_typed(key, wire, typed)
                else:
                    admitted = self._admit(key, obj)
                if admitted is not None:
                    fresh[key], versions[key] = admitted[0], rv
                    changed.append(key)
                if n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # the next page's request goes out meanwhile
        self.stats.lists += 1
        self.store, self._versions = fresh, versions
        self.resource_version = resource_version
        for key, gone in old_store.items():
            if key not in fresh:
                self._notify(DELETED, gone, None)
        for key in changed:
            previous = old_store.get(key)
            self._notify(ADDED if previous is None else MODIFIED, previous, fresh[key])
        log.info(
            "listed %d %s at resourceVersion %s",
            len(fresh),
            self.resource.plural,
            self.resource_version,
        )

    def apply(self, etype: str, obj: JSON) -> None:
        """Apply one watch event to the store. An object that cannot be stored (see
        :meth:`_admit`) counts as gone: readers never see a stale or half-read version."""
        if etype == "BOOKMARK":
            rv = meta(obj).get("resourceVersion") if isinstance(obj.get("metadata"), dict) else ""
            if rv and isinstance(rv, str):
                self.resource_version = rv
            return
        identity = self._identity(obj)
        if identity is None:
            return
        key, rv = identity
        if rv:
            self.resource_version = rv
        old = self.store.get(key)
        known = key in self.store
        admitted = None if etype == DELETED else self._admit(key, obj)
        if admitted is None:
            if known:
                del self.store[key]
                del self._versions[key]
                self._notify(DELETED, old, None)
            return
        self.store[key] = admitted[0]
        self._versions[key] = rv
        self._notify(MODIFIED if known else ADDED, old, admitted[0])

    def _identity(self, obj: JSON) -> tuple[str, str] | None:
        """``(key, resourceVersion)`` of an object; None, with a warning, when its envelope is
        not what every API object has (see :func:`envelope_problem`): it is left out."""
        problem = envelope_problem(obj)
        if problem is None:
            m = obj["metadata"]
            return object_key(obj), m.get("resourceVersion") or ""
        self.stats.malformed += 1
        m = obj.get("metadata") if isinstance(obj, dict) else None
        name = m.get("name") if isinstance(m, dict) else None
        log.warning("%s %s left out: %s", self.kind, _prefix(name), problem)
        return None

    def _admit_typed(
        self, key: str, wire: codec.Typed[Any], typed: TypedList[_Stored]
    ) -> tuple[_Stored] | None:
        """:meth:`_admit` of an item decoded as ``typed.wire``: its model from the typed form,
        or where that does not decide, from its JSON text as any other item."""
        try:
            stored = typed.transform(wire.value)
        except Exception:  # noqa: BLE001 - the JSON text decides (and names what is wrong)
            stored = None
        if stored is not None:
            return (stored,)
        return self._admit(key, codec.loads(bytes(wire.text)))

    def _admit(self, key: str, obj: JSON) -> tuple[_Stored] | None:
        """What the store keeps of ``obj`` (in a 1-tuple); None, with a warning, when the transform
        fails on it (any exception: a mistyped or too deeply nested object is that object's
        error, never the informer's)."""
        try:
            return (self._transform(obj),)
        except Exception as exc:  # noqa: BLE001 - any failure is this object's, logged here
            self.stats.malformed += 1
            log.warning("%s %s cannot be read, left out: %s", self.kind, key, _prefix(exc))
            return None

    async def run(self) -> None:
        """List, then watch forever (until cancelled); see the module docstring."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                    self.synced.set()
                self.stats.watches += 1
                async for event in self.api.watch(
                    self.resource,
                    resource_version=self.resource_version,
                    field_selector=self.field_selector,
                    timeout_s=self._watch_timeout_s,
                ):
                    self.apply(event.type, event.object)
                    self._backoff.reset()
            except GoneError:
                self.stats.relists_on_gone += 1
                log.info(
                    "%s watch expired at %s; relisting",
                    self.resource.plural,
                    self.resource_version,
                )
                need_list = True
            except ApiError as exc:
                self.stats.errors += 1
                delay = self._backoff.next()
                log.warning(
                    "%s list/watch failed (%s); retrying in %.1fs",
                    self.resource.plural,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)


@dataclass(frozen=True, slots=True)
class _Assumed:
    obj: JSON
    rv: int
    since: float


class ClaimOverlay:
    """In-flight claim state over the claim informer (see the module docstring)."""

    def __init__(self, informer: Informer[JSON], *, expiry_s: float = 60.0) -> None:
        self._informer = informer
        self._pending: dict[str, JSON] = {}
        self._assumed: dict[str, _Assumed] = {}
        self._retained: dict[str, JSON] = {}  # deleted claims still in use (controller.retention)
        self._expiry_s = expiry_s
        self._listeners: list[Callable[[str], None]] = []
        self._written_listeners: list[Callable[[str], None]] = []
        self.version = 0

    def add_listener(self, listener: Callable[[str], None], *, written: bool = False) -> None:
        """``listener(key)`` is called whenever what :meth:`get` answers for ``key`` may have
        changed (an informer event, pending or assumed state set or dropped); with
        ``written``, only when what :meth:`latest_written` answers may have changed (not
        when pending state alone moved, nor on an informer event older than the write this
        controller assumed, which it goes on showing)."""
        (self._written_listeners if written else self._listeners).append(listener)

    def touch(self, key: str, *, written: bool = True) -> None:
        self.version += 1
        for listener in self._listeners:
            listener(key)
        if written:
            for listener in self._written_listeners:
                listener(key)

    def set_pending(self, key: str, obj: JSON) -> None:
        """Show ``obj`` (e.g. a claim with the decided allocation) until cleared or assumed."""
        self._pending[key] = obj
        self.touch(key, written=False)

    def clear_pending(self, key: str) -> None:
        if self._pending.pop(key, None) is not None:
            self.touch(key, written=False)

    def assume(self, written: JSON) -> None:
        """Record what a successful write returned, until the informer catches up."""
        key = object_key(written)
        rv = rv_int(written)
        base = self._informer.get(key)
        if base is not None and rv_int(base) >= rv:
            # The informer caught up before the write returned (its event came first): no
            # reader would be shown the written object, and no later event would drop it (it
            # held every claim a pod's writes returned until the next expiry sweep).
            self._assumed.pop(key, None)
        else:
            self._assumed[key] = _Assumed(written, rv, time.monotonic())
        self._pending.pop(key, None)
        self.touch(key)

    def forget(self, key: str) -> None:
        """Drop pending and assumed state for ``key`` (after a rollback or a delete)."""
        changed = self._pending.pop(key, None) is not None
        changed = self._assumed.pop(key, None) is not None or changed
        if changed:
            self.touch(key)

    def retain(self, key: str, obj: JSON) -> None:
        """Keep showing the written state ``obj`` of a deleted claim under ``key`` (a key no
        claim has: :func:`controller.retention.retained_key`) until :meth:`release`."""
        self._retained[key] = obj
        self.touch(key)

    def release(self, key: str) -> None:
        if self._retained.pop(key, None) is not None:
            self.touch(key)

    def observe(self, key: str, obj: JSON | None) -> None:
        """Called on informer events: drop assumptions the informer has caught up with."""
        assumed = self._assumed.get(key)
        if assumed is not None and (obj is None or rv_int(obj) >= assumed.rv):
            del self._assumed[key]
            assumed = None
        self.touch(key, written=assumed is None)  # (else the assumed write still shows)

    def get(self, key: str) -> JSON | None:
        """The newest known state of one claim (pending, assumed, or informer)."""
        pending = self._pending.get(key)
        if pending is not None:
            return pending
        base = self._informer.get(key)
        assumed = self._assumed.get(key)
        if assumed is not None and rv_int(base) < assumed.rv:
            return assumed.obj
        return base

    def allocating(self, key: str) -> bool:
        """Whether an allocation this controller decided for ``key`` is being written: the
        claim shows allocated only through pending state."""
        pending = self._pending.get(key)
        if pending is None:
            return False
        written = self.latest_written(key)
        return written is None or not (written.get("status") or {}).get("allocation")

    def latest_written(self, key: str) -> JSON | None:
        """Like :meth:`get` but ignoring pending (unwritten) state: the base for a write."""
        base = self._informer.get(key) or self._retained.get(key)
        assumed = self._assumed.get(key)
        if assumed is not None and rv_int(base) < assumed.rv:
            return assumed.obj
        return base

    def written(self) -> dict[str, JSON]:
        """Every claim as :meth:`latest_written` shows it (no pending state), keyed
        ``namespace/name``, and the retained state of deleted claims still in use."""
        now = time.monotonic()
        expired = [k for k, a in self._assumed.items() if now - a.since > self._expiry_s]
        for key in expired:  # a write whose watch event never came: trust the informer again
            del self._assumed[key]
            self.touch(key)
        claims = dict(self._informer.store)
        claims.update(self._retained)
        for key, assumed in self._assumed.items():
            if rv_int(claims.get(key)) < assumed.rv:
                claims[key] = assumed.obj
        return claims

    def view(self) -> dict[str, JSON]:
        """All claims as this controller believes them to be, keyed ``namespace/name``."""
        claims = self.written()
        claims.update(self._pending)
        return claims

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._assumed)


class ClusterCache:
    """The informers (module docstring), plus the claim overlay. ``owners``: also watch the
    objects whose selectors default topology spreading reads."""

    def __init__(self, api: Api, *, watch_timeout_s: int = 300, owners: bool = True) -> None:
        timeout = watch_timeout_s
        # What scheduling reads of nodes, slices and classes is the core's model: the store
        # keeps only that. Pods and claims stay JSON (commit writes them), without
        # managedFields.
        self.nodes: Informer[Node | None] = Informer(
            api, NODES, transform=_parser("Node", Node.from_api), watch_timeout_s=timeout
        )
        self.pods: Informer[JSON] = Informer(api, PODS, transform=slim, watch_timeout_s=timeout)
        self.classes: Informer[DeviceClass | None] = Informer(
            api,
            DEVICE_CLASSES,
            transform=_parser("DeviceClass", DeviceClass.from_api),
            watch_timeout_s=timeout,
        )
        self.slices: Informer[ResourceSlice | None] = Informer(
            api,
            RESOURCE_SLICES,
            transform=_parser("ResourceSlice", ResourceSlice.from_api),
            # Their list pages are most of what start-up decodes (10,000 nodes: 88,000
            # devices): read typed, without the dicts in between (kubeapi.codec.loads_list).
            typed=TypedList(WireSlice, ResourceSlice.from_wire),
            watch_timeout_s=timeout,
        )
        self.claims: Informer[JSON] = Informer(
            api, RESOURCE_CLAIMS, transform=self._keep_claim, watch_timeout_s=timeout
        )
        self.namespaces: Informer[Labelled] = Informer(
            api, NAMESPACES, transform=Labelled.of, watch_timeout_s=timeout
        )
        self.owners: tuple[Informer[Selecting], ...] = (
            tuple(
                Informer(
                    api,
                    resource,
                    transform=functools.partial(Selecting.of, resource.kind),
                    watch_timeout_s=timeout,
                )
                for resource in (SERVICES, REPLICATION_CONTROLLERS, REPLICA_SETS, STATEFUL_SETS)
            )
            if owners
            else ()
        )
        # PodDisruptionBudgets, which preemption reads (as small records).
        self.budgets: Informer[DisruptionBudget] = Informer(
            api,
            POD_DISRUPTION_BUDGETS,
            transform=DisruptionBudget.from_api,
            watch_timeout_s=timeout,
        )
        #: kind -> informer, for every kind of driver.scheduling.volumes.VOLUME_KINDS (raw JSON:
        #: the volume binder writes them, the engine parses them)
        self.volumes: dict[str, Informer[JSON]] = {
            r.kind: Informer(api, r, transform=slim, watch_timeout_s=timeout)
            for r in VOLUME_RESOURCES
        }
        self.overlay = ClaimOverlay(self.claims)
        self.claims.add_handler(self._observe_claim)

    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        return (
            self.nodes,
            self.classes,
            self.slices,
            self.claims,
            self.namespaces,
            *self.owners,
            self.budgets,
            *self.volumes.values(),
            self.pods,
        )

    def _keep_claim(self, obj: JSON) -> JSON:
        """What the claim informer stores (:func:`slim_claim`, given the stored version)."""
        return slim_claim(obj, self.claims.store.get(object_key(obj)))

    def _observe_claim(self, _kind: str, _etype: str, old: JSON | None, new: JSON | None) -> None:
        obj = new if new is not None else old
        if obj is not None:
            self.overlay.observe(object_key(obj), new)

    def subscribe(self, handler: Handler) -> None:
        for informer in self.informers:
            informer.add_handler(handler)

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    async def wait_synced(self) -> None:
        for informer in self.informers:
            await informer.synced.wait()

    @property
    def version(self) -> tuple[int, int, int, int]:
        """Changes to what the decision core reads besides pods (snapshot invalidation)."""
        return (self.nodes.version, self.classes.version, self.slices.version, self.claims.version)

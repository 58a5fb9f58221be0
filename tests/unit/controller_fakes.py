"""An in-memory fake of :class:`controller.api.Api` for the controller's unit tests.

It keeps objects per (resource, namespace, name) with one global resourceVersion, enforces
resourceVersion preconditions (PUT, and merge patches that carry one) like the API server,
keeps status and main resource apart, honours finalizers on delete, binds pods, records every
call in :attr:`FakeApi.calls`, and can fail the next matching calls (:meth:`FakeApi.fail`) or
apply a write and then report a 5xx (:meth:`FakeApi.lose_answer`). Watches replay a queue that
tests feed (:meth:`FakeApi.push_event`, :meth:`FakeApi.end_watch`).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from controller.api import JSON, ListResult, PatchType, Resource, WatchEvent
from driver.api.errors import ApiError, ConflictError, NotFoundError, ServerError
from kubeapi import codec


@dataclass(frozen=True)
class Call:
    verb: str
    plural: str
    name: str
    subresource: str | None = None


def _as_read(items: list[JSON], typed: type | None) -> list[JSON]:
    """``items`` as :meth:`kubeapi.Client.pages` hands them over (``typed``: its argument)."""
    if typed is None:
        return items
    page: list[JSON] = codec.loads_list(codec.dumps({"items": items}), typed)["items"]
    return page


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


class FakeApi:
    """See the module docstring."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], JSON] = {}
        self.calls: list[Call] = []
        self.rv = itertools.count(100)
        self.last_rv = 100
        self._faults: list[tuple[str, str, ApiError]] = []
        self._lost: list[tuple[str, str]] = []
        self.watch_queues: dict[str, asyncio.Queue[WatchEvent | ApiError | None]] = {}
        self.watch_calls: list[tuple[str, str]] = []
        self.lists: list[ListResult] = []

    # ------------------------------------------------------------------ test hooks

    def fail(self, verb: str, plural: str, error: ApiError, count: int = 1) -> None:
        self._faults.extend([(verb, plural, error)] * count)

    def lose_answer(self, verb: str, plural: str) -> None:
        """The next matching write is applied, then answered with a 503."""
        self._lost.append((verb, plural))

    def _next_rv(self) -> str:
        self.last_rv = next(self.rv)
        return str(self.last_rv)

    def seed(self, res: Resource, obj: JSON) -> JSON:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        if res.namespaced:
            meta.setdefault("namespace", "default")
        meta["resourceVersion"] = self._next_rv()
        self.objects[self._key(res, meta.get("namespace"), meta["name"])] = obj
        return copy.deepcopy(obj)

    def stored(self, res: Resource, name: str, namespace: str | None = "default") -> JSON | None:
        found = self.objects.get(self._key(res, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def verbs(self) -> list[tuple[str, str, str | None]]:
        return [(c.verb, c.plural, c.subresource) for c in self.calls]

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _key(res: Resource, namespace: str | None, name: str) -> tuple[str, str, str]:
        return (res.plural, (namespace or "default") if res.namespaced else "", name)

    def _enter(self, verb: str, res: Resource, name: str, sub: str | None = None) -> bool:
        self.calls.append(Call(verb, res.plural, name, sub))
        for i, (fverb, plural, error) in enumerate(self._faults):
            if fverb == verb and plural == res.plural:
                del self._faults[i]
                raise error
        for i, (lverb, plural) in enumerate(self._lost):
            if lverb == verb and plural == res.plural:
                del self._lost[i]
                return True
        return False

    def _get(self, res: Resource, name: str, namespace: str | None) -> JSON:
        obj = self.objects.get(self._key(res, namespace, name))
        if obj is None:
            raise NotFoundError(f"{res.plural} {name} not found", status=404, reason="NotFound")
        return obj

    def _check_rv(self, current: JSON, body: JSON) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ConflictError("the object has been modified", status=409, reason="Conflict")

    def _store(self, res: Resource, obj: JSON) -> JSON:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.objects[self._key(res, meta.get("namespace"), meta["name"])]
            return copy.deepcopy(obj)
        meta["resourceVersion"] = self._next_rv()
        self.objects[self._key(res, meta.get("namespace"), meta["name"])] = obj
        return copy.deepcopy(obj)

    @staticmethod
    def _lost_answer() -> ServerError:
        return ServerError("503 ServiceUnavailable (answer lost)", status=503)

    # ------------------------------------------------------------------ the Api protocol

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON:
        await asyncio.sleep(0)  # let concurrent callers interleave, as over a network
        self._enter("get", res, name)
        return copy.deepcopy(self._get(res, name, namespace))

    async def pages(
        self,
        res: Resource,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        typed: type | None = None,
    ) -> AsyncIterator[ListResult]:
        """The next of :attr:`lists` if any, else what is stored; in one page, read from its
        text as the client reads it: with ``typed``, items that decode as it come
        as :class:`kubeapi.codec.Typed`)."""
        self._enter("list", res, "")
        if self.lists:
            page = self.lists.pop(0)
            yield ListResult(
                items=_as_read(page.items, typed), resource_version=page.resource_version
            )
            return
        items = [
            copy.deepcopy(o) for (p, _, _), o in sorted(self.objects.items()) if p == res.plural
        ]
        yield ListResult(items=_as_read(items, typed), resource_version=str(self.last_rv))

    async def watch(
        self,
        res: Resource,
        *,
        resource_version: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        self._enter("watch", res, "")
        self.watch_calls.append((res.plural, resource_version))
        queue = self.watch_queues.setdefault(res.plural, asyncio.Queue())
        while True:
            item = await queue.get()
            if item is None:
                return
            if isinstance(item, ApiError):
                raise item
            yield item

    def push_event(self, plural: str, event: WatchEvent | ApiError | None) -> None:
        self.watch_queues.setdefault(plural, asyncio.Queue()).put_nowait(event)

    def end_watch(self, plural: str) -> None:
        self.push_event(plural, None)

    async def create(self, res: Resource, body: JSON, namespace: str | None = None) -> JSON:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = meta.get("generateName", "obj-") + uuid.uuid4().hex[:5]
        lost = self._enter("create", res, meta["name"])
        if res.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        if self._key(res, meta.get("namespace"), meta["name"]) in self.objects:
            raise ConflictError("already exists", status=409, reason="AlreadyExists")
        meta["uid"] = str(uuid.uuid4())
        if res.plural == "resourceclaims":
            obj.pop("status", None)
        written = self._store(res, obj)
        if lost:
            raise self._lost_answer()
        return written

    async def replace(self, res: Resource, body: JSON, *, subresource: str | None = None) -> JSON:
        await asyncio.sleep(0)
        meta = body["metadata"]
        lost = self._enter("replace", res, meta["name"], subresource)
        current = self._get(res, meta["name"], meta.get("namespace"))
        self._check_rv(current, body)
        obj = copy.deepcopy(current)
        if subresource == "status":
            obj["status"] = copy.deepcopy(body.get("status") or {})
        else:
            obj = {**copy.deepcopy(body), "status": copy.deepcopy(current.get("status"))}
            obj["metadata"]["uid"] = current["metadata"]["uid"]
        written = self._store(res, obj)
        if lost:
            raise self._lost_answer()
        return written

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        *,
        namespace: str | None = None,
        subresource: str | None = None,
        patch_type: PatchType = "merge",
    ) -> JSON:
        lost = self._enter("patch", res, name, subresource)
        current = self._get(res, name, namespace)
        self._check_rv(current, body)
        patch = copy.deepcopy(body)
        (patch.get("metadata") or {}).pop("resourceVersion", None)
        if patch_type == "strategic" and "status" in patch and "conditions" in patch["status"]:
            existing = {c["type"]: c for c in (current.get("status") or {}).get("conditions") or []}
            for condition in patch["status"]["conditions"]:
                existing[condition["type"]] = condition
            patch["status"]["conditions"] = list(existing.values())
        written = self._store(res, _merge(current, patch))
        if lost:
            raise self._lost_answer()
        return written

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        self._enter("delete", res, name)
        current = self._get(res, name, namespace)
        if uid is not None and current["metadata"]["uid"] != uid:
            raise ConflictError("uid precondition failed", status=409, reason="Conflict")
        if current["metadata"].get("finalizers"):
            current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            self._store(res, current)
        else:
            del self.objects[self._key(res, namespace, name)]

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, *, resource_version: str = ""
    ) -> None:
        from controller.api import PODS

        lost = self._enter("bind", PODS, name, "binding")
        current = self._get(PODS, name, namespace)
        if (uid and current["metadata"].get("uid") not in (None, uid)) or (
            resource_version and current["metadata"].get("resourceVersion") != resource_version
        ):
            raise ConflictError("precondition failed", status=409, reason="Conflict")
        if current["spec"].get("nodeName"):
            raise ConflictError("already bound", status=409, reason="Conflict")
        current["spec"]["nodeName"] = node
        self._store(PODS, current)
        if lost:
            raise self._lost_answer()

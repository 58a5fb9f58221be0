"""ResourceSlice publisher: keeps this node's pool in the API equal to discovery, continuously.

Contract:

* The desired pool is ``driver.discovery.slices.build_slices(devices, node_name, driver_name,
  node_uid, taints, max_shares)`` for the node's device table (``max_shares``: the node's
  share cap, published as each shareable GPU's ``shares`` capacity); set it with
  :meth:`Publisher.set_inventory` (discovery, health). Slices are owned by the Node (its UID
  is read from the API at every sync, so a re-created Node is followed).
* :func:`plan_sync` (pure) compares the slices listed with field selector
  ``spec.nodeName=<node>,spec.driver=<driver>`` with the desired ones and decides, as upstream's
  helper: the pool generation is kept when at most one slice has to change and bumped by one
  otherwise (then every slice is rewritten with it); obsolete slices are deleted first, then
  changed ones updated (PUT with the listed ``resourceVersion`` as precondition), then missing
  ones created. Every slice written carries the final ``resourceSliceCount``. A slice the API
  server stored differently from what was sent (fields dropped by a disabled feature gate) is
  not rewritten while it stays as stored (one warning), so the loop never fights the server.
* :meth:`Publisher.run` loops: list -> plan -> apply, repeated until a list needs no write,
  then watches from that list's resourceVersion. Any event on one of the driver's slices for
  this node (another writer, a deletion by the kubelet), a new inventory or the resync period
  ends the watch and re-lists. 409 (or 404 on update) -> re-list and retry at once; 5xx /
  transport errors -> exponential backoff (0.2 s .. 30 s); a dropped watch or 410 -> re-list.
  A restart simply re-lists: names are deterministic, so an unchanged pool causes no writes.
* :meth:`Publisher.remove_all` deletes the pool (``--remove-slices-on-exit``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from driver.api.errors import ApiError, ConflictError, ManifestError, NotFoundError
from driver.api.model import DeviceTaint, ResourceSlice
from driver.discovery.devices import DeviceTable
from driver.discovery.gpus import GpuInfo
from driver.discovery.slices import build_slices
from kubeapi.retry import Backoff
from kubeapi.tasks import wait_at_most

log = logging.getLogger(f"biaxial.{__name__}")
JSON = dict[str, Any]

BACKOFF_MIN_S: Final = 0.2
BACKOFF_MAX_S: Final = 30.0
MAX_WRITE_ROUNDS: Final = 10  # consecutive list+write rounds before backing off (a fight)


class SliceApi(Protocol):
    """The part of :class:`kubeletplugin.api.PluginApi` the publisher uses: a narrow
    protocol, a true subset of its methods, so a test fake needs only these."""

    async def get_node(self, name: str) -> JSON: ...

    async def list_slices(self, field_selector: str) -> tuple[list[JSON], str]: ...

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, JSON]]: ...

    async def create_slice(self, body: Mapping[str, Any]) -> JSON: ...

    async def update_slice(self, body: Mapping[str, Any]) -> JSON: ...

    async def delete_slice(
        self, name: str, *, uid: str = "", resource_version: str = ""
    ) -> None: ...


# --------------------------------------------------------------------------- pure planning


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What to write, in order: delete, then update, then create."""

    generation: int
    delete: tuple[JSON, ...] = ()
    update: tuple[JSON, ...] = ()
    create: tuple[JSON, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.delete or self.update or self.create)

    def describe(self) -> str:
        return (
            f"generation {self.generation}: delete {len(self.delete)}, update "
            f"{len(self.update)}, create {len(self.create)}"
        )


def _owner_uids(owners: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str, bool], ...]:
    return tuple(
        sorted((str(o.get("kind")), str(o.get("uid")), bool(o.get("controller"))) for o in owners)
    )


def _matches(existing: JSON, desired: ResourceSlice) -> bool:
    """Same content (generation ignored), semantically: quantities, ordering of maps."""
    try:
        current = ResourceSlice.from_api(existing)
    except ManifestError:
        return False
    return (
        current.devices == desired.devices
        and current.shared_counters == desired.shared_counters
        and current.node_name == desired.node_name
        and current.node_selector == desired.node_selector
        and current.all_nodes == desired.all_nodes
        and current.per_device_node_selection == desired.per_device_node_selection
        and current.pool.name == desired.pool.name
        and current.pool.resource_slice_count == desired.pool.resource_slice_count
        and _owner_uids(current.owner_references) == _owner_uids(desired.owner_references)
    )


def _generation(obj: Mapping[str, Any]) -> int:
    try:
        return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)
    except (TypeError, ValueError):
        return 0


def _body(desired: ResourceSlice, generation: int, resource_version: str = "") -> JSON:
    body = replace(desired, pool=replace(desired.pool, generation=generation)).to_api()
    if resource_version:
        body["metadata"]["resourceVersion"] = resource_version
    return body


def fingerprint(desired: ResourceSlice) -> str:
    """A generation-independent identity of a desired slice's content."""
    return json.dumps(_body(desired, 0), sort_keys=True, separators=(",", ":"))


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def plan_sync(
    existing: Sequence[JSON],
    desired: Sequence[ResourceSlice],
    written: Mapping[str, tuple[str, str]] | None = None,
) -> SyncPlan:
    """Decide the writes that turn ``existing`` (this driver's slices on this node) into
    ``desired`` (see the module docstring). Never mutates its inputs.

    ``written`` maps a slice name to ``(resourceVersion, fingerprint)`` of this process's last
    write of it. A slice still at that resourceVersion, for an unchanged fingerprint, counts as
    up to date even if the API server dropped fields (a disabled feature gate), so such a
    pool is written once instead of forever.
    """
    written = written or {}
    by_name = {str((o.get("metadata") or {}).get("name", "")): o for o in existing}
    wanted = {s.name: s for s in desired}
    current_gen = max((_generation(o) for o in existing), default=0)
    obsolete = [o for name, o in sorted(by_name.items()) if name not in wanted]
    missing = [s for s in desired if s.name not in by_name]

    def up_to_date(obj: JSON, slice_: ResourceSlice) -> bool:
        if _generation(obj) != current_gen:
            return False
        ours = written.get(slice_.name)
        if ours is not None and ours == (_resource_version(obj), fingerprint(slice_)):
            return True
        return _matches(obj, slice_)

    changed = [s for s in desired if s.name in by_name and not up_to_date(by_name[s.name], s)]
    writes = len(obsolete) + len(missing) + len(changed)
    if writes == 0:
        return SyncPlan(generation=current_gen)
    if writes == 1 and current_gen > 0:
        generation = current_gen
    else:
        generation = current_gen + 1
        changed = [s for s in desired if s.name in by_name]  # all carry the new generation

    def rv(name: str) -> str:
        return _resource_version(by_name[name])

    return SyncPlan(
        generation=generation,
        delete=tuple(obsolete),
        update=tuple(_body(s, generation, rv(s.name)) for s in changed),
        create=tuple(_body(s, generation) for s in missing),
    )


# --------------------------------------------------------------------------- the loop


@dataclass(frozen=True, slots=True)
class Inventory:
    devices: DeviceTable
    taints: Mapping[str, tuple[DeviceTaint, ...]] = field(default_factory=dict)


class Publisher:
    """Publishes and maintains the node's pool (see the module docstring)."""

    def __init__(
        self,
        api: SliceApi,
        *,
        node_name: str,
        driver_name: str,
        resync_s: float = 60.0,
        max_shares: int | None = None,
    ) -> None:
        self._api = api
        self._node = node_name
        self._driver = driver_name
        self._max_shares = max_shares
        self._resync_s = resync_s
        self._selector = f"spec.nodeName={node_name},spec.driver={driver_name}"
        self._inventory: Inventory | None = None
        self._written: dict[str, tuple[str, str]] = {}
        self._dropped_warned: set[str] = set()
        self._wake = asyncio.Event()
        self.synced = asyncio.Event()  # set after the first sync that needed no writes
        self.published_devices = 0
        self.generation = 0
        self.syncs = 0
        self.writes = 0

    def set_inventory(
        self, inventory: DeviceTable | Iterable[GpuInfo], taints: Mapping[str, Any]
    ) -> None:
        """New desired state (the node's device table, or the GPUs it is derived from); the
        loop publishes it promptly."""
        wanted = Inventory(devices=DeviceTable.of(inventory), taints=dict(taints))
        if wanted != self._inventory:
            self._inventory = wanted
            self._wake.set()

    # ----------------------------------------------------------------- one sync

    async def _desired(self, inventory: Inventory) -> list[ResourceSlice]:
        node_uid = ""
        try:
            node = await self._api.get_node(self._node)
            node_uid = str((node.get("metadata") or {}).get("uid", ""))
        except NotFoundError:
            log.warning("node %s not found; publishing slices without an owner", self._node)
        return build_slices(
            inventory.devices,
            node_name=self._node,
            driver_name=self._driver,
            generation=0,
            node_uid=node_uid or None,
            taints=inventory.taints,
            max_shares=self._max_shares,
        )

    async def sync_once(self) -> tuple[SyncPlan, str]:
        """List, plan and apply once; returns the plan applied and the list's resourceVersion."""
        inventory = self._inventory
        if inventory is None:
            raise RuntimeError("sync before the first inventory")
        desired = await self._desired(inventory)
        existing, rv = await self._api.list_slices(self._selector)
        plan = plan_sync(existing, desired, self._written)
        self.syncs += 1
        if not plan.empty:
            started = time.monotonic()
            by_name = {s.name: s for s in desired}
            for obj in plan.delete:
                meta = obj.get("metadata") or {}
                self._written.pop(str(meta.get("name")), None)
                await self._api.delete_slice(
                    str(meta.get("name")),
                    uid=str(meta.get("uid", "")),
                    resource_version=str(meta.get("resourceVersion", "")),
                )
            for body in plan.update:
                self._record(by_name[body["metadata"]["name"]], await self._api.update_slice(body))
            for body in plan.create:
                self._record(by_name[body["metadata"]["name"]], await self._api.create_slice(body))
            self.writes += len(plan.delete) + len(plan.update) + len(plan.create)
            log.info(
                "pool %s: %s in %.1f ms",
                self._node,
                plan.describe(),
                (time.monotonic() - started) * 1000,
            )
        self.generation = plan.generation
        self.published_devices = sum(len(s.devices) for s in desired)
        return plan, rv

    def _record(self, desired: ResourceSlice, stored: JSON) -> None:
        """Remember what we wrote; warn (once per slice content) when the server changed it."""
        self._written[desired.name] = (_resource_version(stored), fingerprint(desired))
        if not _matches(stored, desired) and desired.name not in self._dropped_warned:
            self._dropped_warned.add(desired.name)
            log.warning(
                "pool %s: the API server dropped or changed fields of slice %s (a DRA feature "
                "gate such as DRADeviceTaints or DRAConsumableCapacity is probably off); "
                "publishing it as stored",
                self._node,
                desired.name,
            )

    async def remove_all(self) -> int:
        """Delete every slice of this driver on this node; returns how many were deleted."""
        existing, _ = await self._api.list_slices(self._selector)
        for obj in existing:
            meta = obj.get("metadata") or {}
            await self._api.delete_slice(str(meta.get("name")), uid=str(meta.get("uid", "")))
        log.info("pool %s: removed %d slice(s)", self._node, len(existing))
        return len(existing)

    # ----------------------------------------------------------------- the loop

    async def run(self) -> None:
        """Reconcile forever (cancel to stop)."""
        backoff = Backoff(BACKOFF_MIN_S, BACKOFF_MAX_S, jitter=0.5)
        rounds = 0
        while True:
            if self._inventory is None:
                await self._wake.wait()
            self._wake.clear()
            try:
                plan, rv = await self.sync_once()
            except (ConflictError, NotFoundError) as exc:
                # Someone changed or deleted a slice between our list and our write.
                log.info("pool %s: conflict (%s); re-listing", self._node, exc)
                rounds += 1
                if rounds >= MAX_WRITE_ROUNDS:
                    await self._pause(backoff.next())
                continue
            except ApiError as exc:
                delay = backoff.next()
                log.warning("pool %s: sync failed (%s); retry in %.1f s", self._node, exc, delay)
                await self._pause(delay)
                continue
            if not plan.empty:
                rounds += 1
                if rounds >= MAX_WRITE_ROUNDS:
                    delay = backoff.next()
                    log.warning(
                        "pool %s: still changing after %d rounds (another writer?); waiting %.1f s",
                        self._node,
                        rounds,
                        delay,
                    )
                    await self._pause(delay)
                continue
            rounds = 0
            backoff.reset()
            self.synced.set()
            if not await self._watch(rv):
                await self._pause(backoff.next())

    async def _pause(self, delay: float) -> None:
        await wait_at_most(self._wake.wait(), delay)

    async def _watch(self, resource_version: str) -> bool:
        """Return when a re-list is due: own inventory change, external slice change, watch
        end or error, or the resync period. False when the watch failed at once (back off)."""
        started = time.monotonic()
        watcher = asyncio.create_task(self._watch_stream(resource_version))
        waker = asyncio.create_task(self._wake.wait())
        try:
            await asyncio.wait(
                {watcher, waker}, timeout=self._resync_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (watcher, waker):
                task.cancel()
            await asyncio.gather(watcher, waker, return_exceptions=True)
        if watcher.done() and not watcher.cancelled() and watcher.exception() is not None:
            exc = watcher.exception()
            log.info("pool %s: watch ended (%s); re-listing", self._node, exc)
            return time.monotonic() - started > 1.0
        return True

    async def _watch_stream(self, resource_version: str) -> None:
        timeout = max(1, int(self._resync_s))
        async for etype, obj in self._api.watch_slices(
            self._selector, resource_version, timeout_s=timeout
        ):
            if etype == "BOOKMARK":
                continue
            name = (obj.get("metadata") or {}).get("name")
            log.debug("pool %s: slice %s %s externally; re-listing", self._node, name, etype)
            return

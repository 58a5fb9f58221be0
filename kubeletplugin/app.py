"""The kubelet plugin process: one asyncio loop running every part of the plugin.

Start-up, in order: open discovery (NVML, or a fake profile) and discover; resolve the API
config; build the Preparer and finish its crash/reboot recovery (with dynamic MIG, re-creating
the missing instances of prepared claims), then derive the node's device table from a fresh
discovery and the instances the checkpoint owns; start the DRA gRPC server (DRA v1 + v1beta1,
health v1alpha1 + v1) on the DRA socket; start ``/metrics``, ``/healthz`` (liveness) and
``/readyz`` (readiness); then, through one :class:`kubeapi.tasks.TaskGuard`: the node Event
recorder, the publisher, the health watcher, periodic re-discovery, reconciliation of the
checkpoint against the API (:mod:`kubeletplugin.reconcile`, which also destroys the dynamic
MIG instances of claims it releases), legacy node resources (when asked), the test-only fake
injector (with ``--fake-gpus``), and last the registration socket, so the kubelet only learns
about the plugin once everything it may call is up.

An unreadable checkpoint keeps the plugin serving: Prepare is refused, Unprepare proceeds,
``/readyz`` fails (never ``/healthz``: a restart does not mend the file), a
``CheckpointUnreadable`` Event is recorded on the Node, and every reconciliation period reads
the file again, so a repair clears readiness (``CheckpointReadable``).

Shutdown (SIGTERM / SIGINT, or a crashed task): tasks are cancelled one by one in reverse
start order (registration first: the kubelet stops calling), the DRA server is stopped
gracefully, the pool is deleted only with ``--remove-slices-on-exit``, discovery is closed.
A crashed task is logged with its traceback, counted, marks ``/healthz`` unhealthy and ends the
process with exit code 1 (the DaemonSet restarts it); a clean stop exits 0.

Test-only fault injection (``--fake-gpus`` only): JSON files dropped into
``<state-dir>/fake-inject/`` (write to a temporary name, then rename to ``*.json``) are applied
in name order and deleted. Each holds ``{"action": A, "gpu": INDEX_OR_UUID, ...}`` with A one
of ``lost``, ``xid`` (plus ``"xid": N``), ``recovered`` (health events through the fake
backend), ``remove`` / ``restore`` (the GPU disappears from / returns to discovery),
``mig-fail`` (the next MIG ``"operation"``, ``create`` or ``destroy``, fails with
``"message"``), ``mig-crash`` (the process dies right after NVML creates the next MIG instance,
before the checkpoint records it). With ``--fake-gpus`` the fake's MIG instances live in
``<state-dir>/fake-nvml-mig.json``, so they outlive a plugin restart as NVML's do.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from driver.api.errors import BiaxialError, CheckpointError, ConfigError
from driver.discovery.backend import GpuBackend, next_health_event, open_backend
from driver.discovery.devices import DeviceTable, OwnedInstance
from driver.discovery.fake import FakeBackend
from driver.discovery.gpus import GpuInfo
from driver.discovery.mig import (
    DynamicMigPolicy,
    MigGeometry,
    free_slices,
    still_placeable,
    unusable_reason,
)
from kubeapi.tasks import TaskGuard, wait_at_most
from kubeletplugin.api import Endpoint, PluginApi
from kubeletplugin.events import (
    CHECKPOINT_READABLE,
    CHECKPOINT_UNREADABLE,
    STALE_CLAIM_RELEASED,
    NodeEvents,
)
from kubeletplugin.health import HealthBroadcaster, HealthTracker
from kubeletplugin.metrics import Endpoints, HealthState, Metrics, serve
from kubeletplugin.noderesources import node_status_patch
from kubeletplugin.prepare import Preparer
from kubeletplugin.publisher import Publisher
from kubeletplugin.reconcile import Reconciler, Released
from kubeletplugin.registration import Registrar
from kubeletplugin.server import DraService, HealthService, unix_server
from kubeletplugin.settings import Settings, with_installed_hami_core

if TYPE_CHECKING:
    from grpc import aio

log = logging.getLogger(f"biaxial.{__name__}")

HEALTH_POLL_S: Final = 0.5  # NVML event wait slice; bounds shutdown latency of the thread
INJECT_POLL_S: Final = 0.2
EXIT_OK: Final = 0
EXIT_CRASH: Final = 1
EXIT_KILLED: Final = 137  # test-only mig-crash: as if SIGKILLed


def task_guard(metrics: Metrics, health: HealthState) -> TaskGuard:
    """The guard of the plugin's tasks: a crashed task is also counted and fails ``/healthz``."""

    def failed(name: str, reason: str) -> None:
        metrics.task_crashes.labels(name).inc()
        health.set_problem(f"task {name}", reason)

    return TaskGuard(on_failure=failed)


def dynamic_mig_policy(settings: Settings, backend: GpuBackend) -> DynamicMigPolicy:
    """The setting, plus the GPUs a fake profile declares dynamic."""
    policy = settings.dynamic_mig
    if isinstance(backend, FakeBackend):
        policy = policy.with_gpus(backend.dynamic_mig)
    return policy


class Plugin:
    """The running plugin's state shared by its tasks."""

    def __init__(self, settings: Settings, backend: GpuBackend, gpus: tuple[GpuInfo, ...]) -> None:
        self.settings = settings
        self.backend = backend
        self.gpus = gpus
        self.dynamic = dynamic_mig_policy(settings, backend)
        #: The MIG instances biaxial owns (the Preparer's checkpoint); set once it exists.
        self.owned: Callable[[], frozenset[OwnedInstance]] = frozenset
        self.table_key: tuple[object, ...] = ()  # the first rebuild always builds
        self.devices = DeviceTable.from_gpus(gpus, self.dynamic)  # per discovery, read by all
        self.hidden: set[str] = set()  # fake: UUIDs removed from discovery by the injector
        self.metrics = Metrics()
        self.health_state = HealthState()  # liveness: what a restart mends
        self.ready_state = HealthState()  # readiness: what an administrator must mend
        self.tracker = HealthTracker(self.devices, quiet_s=settings.xid_quiet_s)
        self.broadcaster = HealthBroadcaster(self.tracker)
        self.state_changed = asyncio.Event()  # inventory or health changed (node resources)
        self.rediscover_now = asyncio.Event()

    # ----------------------------------------------------------------- shared state

    async def on_change(self, publisher: Publisher) -> None:
        publisher.set_inventory(self.devices, self.tracker.taints())
        self.metrics.unhealthy_devices.set(len(self.tracker.unhealthy()))
        self.state_changed.set()
        await self.broadcaster.notify()

    async def discover(self) -> tuple[GpuInfo, ...]:
        gpus = await asyncio.to_thread(self.backend.discover)
        return tuple(g for g in gpus if g.uuid not in self.hidden)

    def rebuild(self, gpus: tuple[GpuInfo, ...]) -> bool:
        """Derive the device table from a discovery and the instances biaxial owns; True when
        anything changed (the caller tells the others)."""
        owned = self.owned()
        key = (gpus, owned)
        if key == self.table_key:
            return False
        self.table_key = key
        self.gpus = gpus
        self.devices = DeviceTable.from_gpus(gpus, self.dynamic, owned)
        self.tracker.observe_inventory(self.devices)
        self._mig_metrics(owned)
        return True

    def report_dynamic_mig(self) -> None:
        """Log, once at start, what dynamic MIG does on this node and why a GPU the setting
        selects cannot take part."""
        if self.dynamic.off:
            return
        for gpu in self.gpus:
            if not self.dynamic.selects(gpu):
                continue
            reason = unusable_reason(gpu)
            if reason is None:
                log.info("GPU %d (%s): dynamic MIG", gpu.minor, gpu.product_name)
            else:
                log.warning("dynamic MIG is off for %s", reason)

    def _mig_metrics(self, owned: frozenset[OwnedInstance]) -> None:
        self.metrics.mig_instances.set(len(owned))
        for gpu in self.devices.dynamic_gpus:
            geometry = MigGeometry.of(gpu)
            live = {(m.profile, m.start) for m in gpu.mig_devices}
            taken = [p for p in geometry.placements if (p.profile.name, p.start) in live]
            label = str(gpu.minor)
            self.metrics.mig_free_slices.labels(label).set(free_slices(geometry, taken))
            largest = max((p.profile.size for p in still_placeable(geometry, taken)), default=0)
            self.metrics.mig_largest_free.labels(label).set(largest)

    # ----------------------------------------------------------------- tasks

    async def health_loop(self, publisher: Publisher) -> None:
        """NVML events (in a thread) -> tracker -> taints and health streams."""
        while True:
            event = await next_health_event(self.backend, HEALTH_POLL_S)
            now = time.monotonic()
            changed = False
            if event is not None:
                changed = self.tracker.apply(event, wall=time.time(), monotonic=now)
            changed = self.tracker.tick(now) or changed
            if changed:
                await self.on_change(publisher)

    async def rediscover_loop(self, publisher: Publisher, preparer: Preparer) -> None:
        """Re-discover periodically (and on demand); follow appearing/disappearing GPUs."""
        while True:
            await wait_at_most(self.rediscover_now.wait(), self.settings.rediscover_s)
            self.rediscover_now.clear()
            try:
                gpus = await self.discover()
            except BiaxialError as exc:
                log.warning("re-discovery failed; keeping the last inventory: %s", exc)
                continue
            before = len(self.gpus)
            if self.rebuild(gpus):
                log.info("inventory changed: %d -> %d GPU(s)", before, len(gpus))
                preparer.observe_inventory(self.devices)
                await self.on_change(publisher)

    async def node_resources_loop(self, api: PluginApi) -> None:
        """Keep ``nvidia.com/gpumem`` / ``gpucores`` on the Node (re-applied periodically)."""
        while True:
            self.state_changed.clear()
            patch = node_status_patch(self.gpus, self.tracker.unhealthy_gpus())
            try:
                await api.patch_node_status(self.settings.node_name, patch)
                log.debug("node resources: %s", patch["status"])
            except BiaxialError as exc:
                log.warning("cannot patch node %s status: %s", self.settings.node_name, exc)
            await wait_at_most(self.state_changed.wait(), self.settings.resync_s)

    def checkpoint_changed(self, error: str | None, events: NodeEvents) -> None:
        """The checkpoint became unreadable (``error``) or readable again (``None``): the
        pod's readiness (never its liveness: a restart does not mend the file), the metric,
        and a node Event."""
        if error is not None:
            self.ready_state.set_problem("checkpoint", error)
            self.metrics.checkpoint_readable.set(0)
            events.post(
                "Warning",
                CHECKPOINT_UNREADABLE,
                f"{error}. Prepare is refused on this node until the file is repaired or "
                "removed; Unprepare proceeds (see the biaxial operations runbook)",
            )
            return
        self.ready_state.clear("checkpoint")
        self.metrics.checkpoint_readable.set(1)
        events.post("Normal", CHECKPOINT_READABLE, "the checkpoint can be read again")

    async def released(self, released: Released, events: NodeEvents) -> None:
        """Reconciliation unprepared a stale claim: count it, tell the administrator."""
        self.metrics.stale_claims_released.inc()
        events.post("Warning", STALE_CLAIM_RELEASED, released.message())

    async def inject_loop(self) -> None:
        """Test-only: apply fault-injection files (see the module docstring)."""
        folder = self.settings.inject_dir
        await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
        while True:
            for path in sorted(folder.glob("*.json")):
                self._inject(path)
            await asyncio.sleep(INJECT_POLL_S)

    def _inject(self, path: Path) -> None:
        backend = self.backend
        try:
            command = json.loads(path.read_text())
            action = command["action"]
            gpu = command["gpu"]
            if not isinstance(backend, FakeBackend):
                raise ConfigError("fault injection needs --fake-gpus")
            if action == "lost":
                backend.mark_lost(gpu, command.get("message", "GPU has fallen off the bus"))
            elif action == "xid":
                backend.inject_xid(gpu, int(command["xid"]), command.get("message", ""))
            elif action == "recovered":
                backend.mark_recovered(gpu)
            elif action == "mig-fail":
                backend.fail_next(command["operation"], command.get("message", "injected"))
            elif action == "mig-crash":
                # Dies with the instance made and saved, before the checkpoint records it.
                backend.after_create = lambda _: os._exit(EXIT_KILLED)
            elif action in {"remove", "restore"}:
                uuid = self._uuid(backend, gpu)
                if action == "remove":
                    self.hidden.add(uuid)
                else:
                    self.hidden.discard(uuid)
                self.rediscover_now.set()
            else:
                raise ConfigError(f"unknown action {action!r}")
            log.info("fault injection %s: %s", path.name, command)
        except (BiaxialError, ValueError, KeyError, TypeError, OSError) as exc:
            log.error("fault injection %s rejected: %s", path.name, exc)  # noqa: TRY400
        finally:
            path.unlink(missing_ok=True)

    @staticmethod
    def _uuid(backend: FakeBackend, gpu: object) -> str:
        for info in backend.discover():
            if gpu in (info.uuid, info.index):
                return info.uuid
        raise ConfigError(f"no GPU {gpu!r}")


def _signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def _make_dirs(settings: Settings) -> None:
    """Create the directories the plugin writes to; a failure names the flag."""
    for flag, path in (
        ("--registry-dir", settings.registry_dir),
        ("--plugin-dir", settings.dra_socket.parent),
        ("--cdi-dir", settings.cdi_dir),
        ("--state-dir", settings.state_dir),
    ):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{flag}: cannot create {path}: {exc}") from exc


async def run(settings: Settings) -> int:
    """Run the plugin until SIGTERM/SIGINT (exit 0) or a crashed task (exit 1)."""
    started = time.monotonic()
    stop = asyncio.Event()
    _signals(stop)
    await asyncio.to_thread(_make_dirs, settings)
    backend = await asyncio.to_thread(
        functools.partial(
            open_backend,
            settings.fake_gpus,
            node_name=settings.node_name,
            mig_state=settings.fake_mig_state if settings.fake_gpus is not None else None,
        )
    )
    try:
        gpus = await asyncio.to_thread(backend.discover)
        endpoint = await asyncio.to_thread(Endpoint.resolve, settings.kubeconfig)
        plugin = Plugin(settings, backend, gpus)
        async with PluginApi(endpoint) as api:
            return await _serve(plugin, api, stop, started)
    finally:
        # A cancelled NVML event wait keeps running in its thread until its (short) timeout;
        # wait for every worker thread before shutting NVML down underneath it.
        await asyncio.get_running_loop().shutdown_default_executor()
        backend.close()


async def _serve(plugin: Plugin, api: PluginApi, stop: asyncio.Event, started: float) -> int:
    """Recover, publish, serve DRA and run the plugin's loops until ``stop``; the exit code."""
    settings = plugin.settings
    events = NodeEvents(
        api,
        node_name=settings.node_name,
        namespace=settings.event_namespace,
        instance=f"{settings.node_name}/{settings.pod_uid or 'plugin'}",
    )
    preparer = await _recovered_preparer(plugin, api, events)
    publisher = _publisher(plugin, api)
    dra_server = _dra_server(plugin, preparer)
    await dra_server.start()
    log.info("DRA service on %s (%d GPU(s))", settings.dra_socket, len(plugin.gpus))
    guard = task_guard(plugin.metrics, plugin.health_state)
    endpoints: Endpoints | None = None
    try:
        endpoints = serve(
            plugin.metrics,
            plugin.health_state,
            settings.metrics_address,
            settings.metrics_port,
            ready=plugin.ready_state,
            health_host=settings.health_address,
            health_port=settings.health_port,
        )
        _start_loops(guard, plugin, api, events=events, publisher=publisher, preparer=preparer)
        log.info(
            "plugin %s on node %s ready in %.0f ms (%s)",
            settings.driver_name,
            settings.node_name,
            (time.monotonic() - started) * 1000,
            f"fake GPUs {settings.fake_gpus}" if settings.fake_gpus else "NVML",
        )
        await guard.until(stop)
        code = EXIT_CRASH if guard.tripped.is_set() else EXIT_OK
        log.info("stopping (%s)", guard.reason or "signal")
        await guard.stop(settings.grace_s)
    finally:
        await plugin.broadcaster.close()
        await dra_server.stop(settings.grace_s)
        settings.dra_socket.unlink(missing_ok=True)
        if endpoints is not None:
            await asyncio.to_thread(endpoints.close)
    if settings.remove_slices_on_exit and code == EXIT_OK:
        try:
            await publisher.remove_all()
        except BiaxialError as exc:
            log.error("could not remove this node's ResourceSlices: %s", exc)  # noqa: TRY400
    log.info("stopped")
    return code


async def _recovered_preparer(plugin: Plugin, api: PluginApi, events: NodeEvents) -> Preparer:
    """The Preparer, its checkpoint recovered (or the failure logged: Prepare then refuses
    with it per claim) and the inventory re-read, since recovery may have made instances."""
    settings = plugin.settings
    loop = asyncio.get_running_loop()

    def on_checkpoint(error: str | None) -> None:  # called from the Preparer's worker thread
        loop.call_soon_threadsafe(plugin.checkpoint_changed, error, events)

    def mig_changed() -> None:
        # A MIG instance came or went (in a worker thread): re-discover to see it.
        loop.call_soon_threadsafe(plugin.rediscover_now.set)

    preparer = Preparer(
        with_installed_hami_core(settings.prepare_settings()),
        plugin.devices,
        api.get_claim,
        on_checkpoint=on_checkpoint,
        mig=plugin.backend,
        on_mig_change=mig_changed,
    )
    plugin.report_dynamic_mig()
    try:
        await preparer.recover()
    except CheckpointError as exc:
        # Keep serving: Prepare refuses with this error per claim, Unprepare proceeds, the pod
        # is not ready, and reconciliation reads the file again every period.
        log.error("checkpoint recovery failed: %s", exc)  # noqa: TRY400 - no traceback needed
    plugin.owned = preparer.owned_instances
    if plugin.rebuild(await plugin.discover()):  # recovery may have made instances
        preparer.observe_inventory(plugin.devices)
    return preparer


def _publisher(plugin: Plugin, api: PluginApi) -> Publisher:
    """The ResourceSlice publisher with the current inventory, and the metrics read from it."""
    settings = plugin.settings
    publisher = Publisher(
        api,
        node_name=settings.node_name,
        driver_name=settings.driver_name,
        resync_s=settings.resync_s,
        max_shares=settings.max_shares,
    )
    publisher.set_inventory(plugin.devices, plugin.tracker.taints())
    metrics = plugin.metrics
    metrics.published_devices.set_function(lambda: publisher.published_devices)
    metrics.pool_generation.set_function(lambda: publisher.generation)
    metrics.unhealthy_devices.set(len(plugin.tracker.unhealthy()))  # (and on every change)
    return publisher


def _dra_server(plugin: Plugin, preparer: Preparer) -> aio.Server:
    """The kubelet's DRA and health services on the plugin's socket (not started)."""
    settings = plugin.settings
    server = unix_server(settings.dra_socket)
    server.add_generic_rpc_handlers(
        (
            *DraService(preparer, plugin.metrics).handlers(),
            *HealthService(
                plugin.broadcaster,
                pool_name=settings.node_name,
                resend_s=settings.health_resend_s,
                check_timeout_s=settings.health_check_timeout_s,
            ).handlers(),
        )
    )
    return server


def _start_loops(
    guard: TaskGuard,
    plugin: Plugin,
    api: PluginApi,
    *,
    events: NodeEvents,
    publisher: Publisher,
    preparer: Preparer,
) -> None:
    """Every background loop of the plugin, registration last: the kubelet calls the DRA
    service as soon as it has registered."""
    settings = plugin.settings
    reconciler = Reconciler(
        preparer,
        api.get_claim,
        node_name=settings.node_name,
        driver_name=settings.driver_name,
        grace_s=settings.release_grace_s,
    )
    guard.start("events", events.run())
    guard.start("publisher", publisher.run())
    guard.start("health", plugin.health_loop(publisher))
    guard.start("rediscover", plugin.rediscover_loop(publisher, preparer))
    guard.start(
        "reconcile", reconciler.run(settings.reconcile_s, lambda r: plugin.released(r, events))
    )
    if settings.advertise_legacy_resources:
        guard.start("node-resources", plugin.node_resources_loop(api))
    if settings.fake_gpus is not None:
        guard.start("fake-inject", plugin.inject_loop())
    registrar = Registrar(
        driver_name=settings.driver_name,
        socket_path=settings.registration_socket,
        endpoint=settings.dra_socket,
        metrics=plugin.metrics,
        health=plugin.health_state,
        grace_s=settings.grace_s,
    )
    guard.start("registration", registrar.run())

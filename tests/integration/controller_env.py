"""Support for the controller's integration tests: a seeded emulator cluster, a controller
running in-process on its own loop and thread, crash injection, and the invariants every run
must satisfy.

The crash model: :class:`KillableApi` wraps the real client; once killed, every call raises
:class:`Killed` (a ``BaseException``, so no rollback or retry path can catch it). What the API
server holds at that moment is exactly what a ``kill -9`` at that point would leave behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from controller.api import Api, Endpoint, GuardedApi, KubeApi
from controller.app import Controller
from controller.settings import Settings
from driver.api.quantity import Quantity
from driver.discovery.backend import open_backend
from driver.discovery.slices import build_slices
from tests.emulator import Emulator

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.biaxial.dev"
FINALIZER = f"{DRIVER}/allocation"
JSON = dict[str, Any]
T = TypeVar("T")


class Killed(BaseException):
    """The simulated process was killed."""


class KillableApi(GuardedApi):
    """An :class:`~controller.api.Api` that can be killed (see the module docstring)."""

    def __init__(self, inner: Api) -> None:
        super().__init__(inner)
        self.killed = False

    def guard(self, method: str, path: str) -> None:
        if self.killed:
            raise Killed

    def guard_event(self) -> None:
        if self.killed:
            raise Killed


def fast_settings(**overrides: Any) -> Settings:
    """Fast settings for tests (no leader election, no HTTP endpoint, short backoff)."""
    fields: dict[str, Any] = {
        "leader_elect": False,
        "metrics_port": 0,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.5,
        "unschedulable_flush_s": 2.0,
        "lease_duration_s": 2.0,
        "renew_deadline_s": 1.5,
        "retry_period_s": 0.2,
        "shutdown_grace_s": 2.0,
        "qps": 1000.0,
        "burst": 1000,
    }
    fields.update(overrides)
    return Settings(**fields).validate()


class ControllerThread:
    """One controller on its own event loop in a thread, talking HTTP to the emulator."""

    def __init__(
        self,
        emulator: Emulator,
        settings: Settings | None = None,
        *,
        crash_at: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.emulator = emulator
        self.settings = settings or fast_settings()
        self.crash_at = crash_at
        self.controller: Controller | None = None
        self.api: KillableApi | None = None
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self.crashed_at: tuple[str, str] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name="controller", daemon=True)

    def start(self) -> ControllerThread:
        self._thread.start()
        if not self._started.wait(10):
            raise TimeoutError("controller did not start")
        return self

    async def _on_step(self, step: str, key: str) -> None:
        if self.crash_at is not None and self.crash_at(step, key) and self.api is not None:
            self.crashed_at = (step, key)
            self.api.killed = True
            raise Killed

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Killed:
            self.exit_code = 137
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self.error = exc
            self._started.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        endpoint = Endpoint(host=self.emulator.url, headers={}, ssl_context=None)
        async with KubeApi(
            endpoint,
            qps=self.settings.qps,
            burst=self.settings.burst,
            user_agent=f"biaxial-controller ({self.settings.identity})",
        ) as real:
            self.api = KillableApi(real)
            self.controller = Controller(
                self.settings, self.api, on_step=self._on_step, review_endpoint=endpoint
            )
            self._started.set()
            self.exit_code = await self.controller.run()

    def call(self, fn: Callable[[], Any]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn)

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the controller's loop and return its result."""
        assert self._loop is not None

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def cached(self, kind: str) -> int:
        """How many objects of ``kind`` (``nodes``, ``resourceslices``, ...) the controller's
        caches hold now."""
        assert self.controller is not None
        cache = self.controller.scheduler.feed.cache
        found = next(i for i in cache.informers if i.resource.plural == kind)
        return self.on_loop(lambda: len(found.store))

    def engine_drift(self) -> dict[str, tuple[object, object]]:
        """Where the engine kept up to date differs from one built from the caches now."""
        assert self.controller is not None
        return self.on_loop(self.controller.scheduler.feed.drift)

    def assert_engine_settles(self, timeout: float = 5.0) -> None:
        """The engine kept up to date by the feed comes to equal one built from the caches.

        Each watch is a stream of its own, so the two may differ for a moment while one lags
        another (a claim's deletion heard before its pod's binding and deletion: the placement
        still in flight counts in an engine built now, not in the one that heard the claim go;
        a commit's own write assumed at once, its watch event a moment later), and agree again
        once the lagging stream delivers. The one comparison is repeated until they agree (two
        calls could see the caches move in between, as a CI run did); a drift that lasts past
        ``timeout`` fails, naming the parts that differ."""
        deadline = time.monotonic() + timeout
        drift = self.engine_drift()
        while drift and time.monotonic() < deadline:
            time.sleep(0.05)
            drift = self.engine_drift()
        shown = "; ".join(
            f"{part}: kept {kept!r:.400}, fresh {fresh!r:.400}"
            for part, (kept, fresh) in drift.items()
        )
        assert not drift, f"incremental engine state drifted from the caches: {shown}"

    def stop(self, timeout: float = 10.0) -> None:
        if self.controller is not None and self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self.call(self.controller.stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("controller did not stop")

    def kill(self, timeout: float = 10.0) -> None:
        """Simulate kill -9: no further API call succeeds, then the thread winds down."""
        if self.api is not None:
            self.api.killed = True
        self.stop(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


# --------------------------------------------------------------------------- cluster seeding


@contextlib.contextmanager
def checked_controller(
    emulator: Emulator, settings: Settings | None = None
) -> Iterator[ControllerThread]:
    """A running controller for one test; afterwards its incremental engine state must come
    to equal one built from its caches (:meth:`ControllerThread.assert_engine_settles`: once the
    watches have delivered what the test's last writes caused), and it must have stopped
    without an error."""
    running = ControllerThread(emulator, settings).start()
    try:
        yield running
        running.assert_engine_settles()
    finally:
        running.stop()
    assert running.error is None


def node_object(
    name: str,
    *,
    cpu: str = "32",
    memory: str = "128Gi",
    gpus: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> JSON:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def device_classes() -> list[JSON]:
    out = []
    for path in sorted((ROOT / "deviceclasses").glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


def seed_cluster(
    emulator: Emulator,
    nodes: Mapping[str, str] | None = None,
    *,
    classes: bool = True,
    slices: bool = True,
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    """Nodes with published slices (``{node: fake profile}``, ``labels`` per node; no slices
    when a plugin will publish them) and the DeviceClasses."""
    nodes = nodes or {"gpu-t4": "t4x4", "gpu-a10g": "a10gx4"}
    for name, profile in nodes.items():
        node = emulator.create(node_object(name, labels=(labels or {}).get(name)))
        if not (emulator.get("nodes", name) or {}).get("status"):
            emulator.update_status("nodes", name, node_object(name)["status"])
        if not slices:
            continue
        with open_backend(profile, node_name=name) as backend:
            gpus = backend.discover()
        for resource_slice in build_slices(
            gpus, node_name=name, driver_name=DRIVER, node_uid=node["metadata"]["uid"]
        ):
            emulator.create(resource_slice.to_api())
    if classes:
        for dc in device_classes():
            emulator.create(dc)


def claim_template(
    name: str, *, memory: str | None = None, count: int = 1, namespace: str = "default"
) -> JSON:
    exactly: JSON = {"deviceClassName": DRIVER, "count": count}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def resource_claim(
    name: str, *, device_class: str = DRIVER, memory: str | None = None, namespace: str = "default"
) -> JSON:
    exactly: JSON = {"deviceClassName": device_class}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod(
    name: str,
    *,
    template: str | None = None,
    claim: str | None = None,
    legacy_gpus: int | None = None,
    gpumem: int | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler: str = "biaxial",
    namespace: str = "default",
) -> JSON:
    container: JSON = {"name": "main", "image": "busybox"}
    spec: JSON = {"schedulerName": scheduler, "containers": [container]}
    if template is not None or claim is not None:
        ref: JSON = {"name": "gpu"}
        if template is not None:
            ref["resourceClaimTemplateName"] = template
        else:
            ref["resourceClaimName"] = claim
        spec["resourceClaims"] = [ref]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if legacy_gpus is not None:
        limits = {"nvidia.com/gpu": str(legacy_gpus)}
        if gpumem is not None:
            limits["nvidia.com/gpumem"] = str(gpumem)
        container["resources"] = {"limits": limits}
    metadata: JSON = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


# --------------------------------------------------------------------------- invariants


def _claims_by_key(emulator: Emulator) -> dict[str, JSON]:
    return {
        f"{c['metadata']['namespace']}/{c['metadata']['name']}": c
        for c in emulator.list("resourceclaims")
    }


def pod_claim_keys(p: Mapping[str, Any]) -> list[str]:
    namespace = p["metadata"].get("namespace", "default")
    status = p.get("status") or {}
    generated = {
        s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    keys = []
    for ref in p["spec"].get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        keys.append(f"{namespace}/{name}")
    ext = status.get("extendedResourceClaimStatus") or {}
    if ext.get("resourceClaimName"):
        keys.append(f"{namespace}/{ext['resourceClaimName']}")
    return keys


def device_capacity(emulator: Emulator) -> dict[tuple[str, str, str], dict[str, int]]:
    """Capacities (memory bytes, cores) of every published device."""
    out = {}
    for s in emulator.list("resourceslices"):
        for d in s["spec"].get("devices") or []:
            capacity = d.get("capacity") or {}
            out[(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])] = {
                name: int(Quantity.of(value["value"]).value()) for name, value in capacity.items()
            }
    return out


def check_invariants(emulator: Emulator, *, scheduler: str = "biaxial") -> list[str]:
    """Every violation of the controller's invariants, as text (empty when all hold)."""
    problems: list[str] = []
    with emulator.store.lock:  # claims and pods as of one moment (writers wait meanwhile)
        claims = _claims_by_key(emulator)
        capacity = device_capacity(emulator)
        pods = emulator.list("pods")
    exclusive: dict[tuple[str, str, str], str] = {}
    shared: dict[tuple[str, str, str], dict[str, int]] = {}
    for key, c in claims.items():
        allocation = (c.get("status") or {}).get("allocation")
        if not allocation:
            continue
        for r in allocation["devices"]["results"]:
            dev = (r["driver"], r["pool"], r["device"])
            if r.get("shareID"):
                used = shared.setdefault(dev, {})
                for name, value in (r.get("consumedCapacity") or {}).items():
                    used[name] = used.get(name, 0) + int(Quantity.of(value).value())
                if dev in exclusive:
                    problems.append(f"{dev} shared by {key} but exclusive to {exclusive[dev]}")
            else:
                if dev in exclusive or dev in shared:
                    problems.append(f"{dev} allocated twice ({key}, {exclusive.get(dev)})")
                exclusive[dev] = key
    for dev, used in shared.items():
        for name, amount in used.items():
            limit = capacity.get(dev, {}).get(name, 0)
            if amount > limit:
                problems.append(f"{dev}: {amount} of {name} allocated, capacity {limit}")
    for p in pods:
        if p["spec"].get("schedulerName") != scheduler or not p["spec"].get("nodeName"):
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # done: its claims may already be released
        uid = p["metadata"]["uid"]
        name = p["metadata"]["name"]
        for key in pod_claim_keys(p):
            c = claims.get(key)
            if c is None:
                problems.append(f"bound pod {name}: claim {key} missing")
                continue
            status = c.get("status") or {}
            if not status.get("allocation"):
                problems.append(f"bound pod {name}: claim {key} not allocated")
            if uid not in [r["uid"] for r in status.get("reservedFor") or []]:
                problems.append(f"bound pod {name}: claim {key} not reserved for it")
            if FINALIZER not in (c["metadata"].get("finalizers") or []):
                problems.append(f"bound pod {name}: claim {key} lacks {FINALIZER}")
            selector = (status.get("allocation") or {}).get("nodeSelector")
            if selector:
                values = [
                    v
                    for term in selector["nodeSelectorTerms"]
                    for f in term.get("matchFields") or []
                    for v in f.get("values") or []
                ]
                if values and p["spec"]["nodeName"] not in values:
                    problems.append(f"bound pod {name}: claim {key} allocated on {values}")
    return problems


def volume_problems(emulator: Emulator, *, scheduler: str = "biaxial") -> list[str]:
    """Every violation of the volume invariants: a bound pod of ours whose claims are not all
    bound to a PV that accepts its node; a claim whose selected node no pod of ours bound
    there uses (and no attempt can be reusing, once every pod is bound)."""
    problems: list[str] = []
    claims = {
        f"{c['metadata']['namespace']}/{c['metadata']['name']}": c
        for c in emulator.list("persistentvolumeclaims")
    }
    volumes = {v["metadata"]["name"]: v for v in emulator.list("persistentvolumes")}
    users: dict[str, set[str]] = {}
    for p in emulator.list("pods"):
        node = p["spec"].get("nodeName")
        if p["spec"].get("schedulerName") != scheduler or not node:
            continue
        namespace = p["metadata"]["namespace"]
        for v in p["spec"].get("volumes") or []:
            name = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if v.get("ephemeral") is not None:
                name = f"{p['metadata']['name']}-{v['name']}"
            if not name:
                continue
            key = f"{namespace}/{name}"
            users.setdefault(key, set()).add(node)
            claim = claims.get(key)
            annotations = (claim or {}).get("metadata", {}).get("annotations") or {}
            volume_name = ((claim or {}).get("spec") or {}).get("volumeName")
            if (
                claim is None
                or not volume_name
                or "pv.kubernetes.io/bind-completed" not in (annotations)
            ):
                problems.append(f"bound pod {p['metadata']['name']}: claim {key} not bound")
                continue
            labels = (emulator.get("nodes", node) or {}).get("metadata", {}).get("labels") or {}
            required = (
                ((volumes.get(volume_name) or {}).get("spec") or {})
                .get("nodeAffinity", {})
                .get("required")
            )
            if required and not any(
                all(
                    labels.get(e["key"]) in (e.get("values") or [])
                    for e in term.get("matchExpressions") or []
                )
                for term in required["nodeSelectorTerms"]
            ):
                problems.append(
                    f"bound pod {p['metadata']['name']}: PV {volume_name} not on {node}"
                )
    for key, claim in claims.items():
        selected = (claim["metadata"].get("annotations") or {}).get(
            "volume.kubernetes.io/selected-node"
        )
        if selected is not None and key in users and selected not in users[key]:
            problems.append(f"claim {key} selected {selected}, used on {sorted(users[key])}")
    return problems


def leftovers(emulator: Emulator) -> list[str]:
    """What must be gone once every pod is deleted: allocations, reservations, our
    finalizers, bridge claims."""
    out = []
    for c in emulator.list("resourceclaims"):
        status = c.get("status") or {}
        name = c["metadata"]["name"]
        if status.get("allocation"):
            out.append(f"{name}: still allocated")
        if status.get("reservedFor"):
            out.append(f"{name}: still reserved")
        if FINALIZER in (c["metadata"].get("finalizers") or []):
            out.append(f"{name}: still has {FINALIZER}")
        annotations = c["metadata"].get("annotations") or {}
        if annotations.get("resource.kubernetes.io/extended-resource-claim") == "true":
            out.append(f"{name}: bridge claim left behind")
    return out


def pod_condition(emulator: Emulator, name: str, namespace: str = "default") -> JSON | None:
    """The pod's ``PodScheduled`` condition, if it has one."""
    p = emulator.get("pods", name, namespace) or {}
    for c in (p.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return dict(c)
    return None


def pod_events(emulator: Emulator, name: str) -> list[tuple[str, str]]:
    """(reason, message) of every event about the object ``name``."""
    return [
        (e["reason"], e["message"])
        for e in emulator.list("events")
        if e["involvedObject"]["name"] == name
    ]


def bound_pods(emulator: Emulator, names: Iterable[str] | None = None) -> dict[str, str]:
    """Pod name -> node of the bound pods (``names`` only, when given). Pods whose ``spec``
    is not an object (the hostile ones a test injects, unvalidated) are not bound."""
    wanted = set(names) if names is not None else None
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in emulator.list("pods")
        if isinstance(p.get("spec"), dict)
        and p["spec"].get("nodeName")
        and (wanted is None or p["metadata"]["name"] in wanted)
    }


def delete_all_pods(emulator: Emulator) -> None:
    for p in emulator.list("pods"):
        if not p["metadata"].get("deletionTimestamp"):
            emulator.delete("pods", p["metadata"]["name"], p["metadata"]["namespace"])
    emulator.finish_pod_deletions()

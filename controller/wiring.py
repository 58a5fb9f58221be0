"""The controller's object graph, built in one place.

:func:`build` makes every long-lived collaborator of one controller and hands each the
others it uses, so no object reaches through another for a collaborator: the watch caches;
the scheduling queue; the write path (the volume binder, the binding-condition waiter, the
write slots and the committer, which the scheduler, its repairer and the deallocator share);
the reporting lane (the recorder and the jobs it runs on); the evictor; the scheduler; and the
deallocator. :class:`~controller.app.Controller` runs what it returns.

Order is part of the wiring: objects that watch the cache subscribe as they are built, and an
event reaches its subscribers in that order (the volume binder, then the scheduler and what it
builds after its own subscription, then the deallocator), as the controller has always had it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from controller.api import Api
from controller.binding import BindingWaiter
from controller.cache import ClusterCache
from controller.commit import Committer, Plan, StepHook
from controller.deallocate import Deallocator
from controller.equivalence import UnschedulableMemo
from controller.events import Recorder
from controller.metrics import Metrics
from controller.preempt import Evictor
from controller.queue import SchedulingQueue
from controller.scheduler import Scheduler
from controller.settings import Settings
from controller.volumes import VolumeBinder
from kubeapi.tasks import TaskGuard


async def _no_step(_step: str, _key: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Graph:
    """What :func:`build` made, for the controller to run."""

    cache: ClusterCache
    queue: SchedulingQueue
    committer: Committer
    scheduler: Scheduler
    deallocator: Deallocator


def build(
    settings: Settings,
    api: Api,
    metrics: Metrics,
    *,
    writer: Api | None = None,
    on_step: StepHook | None = None,
) -> Graph:
    """One controller's collaborators. ``api`` reads (the caches' lists and watches);
    ``writer`` writes (the leader-fenced client with leader election; ``api`` when None).
    ``on_step`` is called after each write step of a commit, eviction or volume binding
    (tests raise from it to simulate a crash there)."""
    writer = writer if writer is not None else api
    cache = ClusterCache(
        api,
        watch_timeout_s=settings.watch_timeout_s,
        owners=bool(settings.spreading.constraints),
    )
    queue = SchedulingQueue(
        backoff_initial_s=settings.backoff_initial_s,
        backoff_max_s=settings.backoff_max_s,
        flush_s=settings.unschedulable_flush_s,
    )

    def on_conflict(step: str) -> None:
        metrics.conflicts.labels(step=step).inc()

    volumes = VolumeBinder(
        writer,
        cache,
        timeout_s=settings.volume_bind_timeout_s,
        on_step=on_step or _no_step,
        on_conflict=on_conflict,
    )
    write_slots = asyncio.Semaphore(settings.max_concurrent_writes)
    binding = BindingWaiter(cache.overlay.get, timeout_s=settings.binding_timeout_s)
    cache.overlay.add_listener(binding.changed)
    jobs = TaskGuard()  # placement writes and reports in flight
    recorder = Recorder(
        writer,
        component=settings.scheduler_name,
        instance=settings.identity,
        spawn=jobs.spawn,
    )

    async def binding_pending(plan: Plan) -> None:
        await recorder.binding_pending(plan.pod, plan.node)

    committer = Committer(
        writer,
        cache.overlay,
        finalizer=settings.finalizer,
        on_step=on_step,
        on_conflict=on_conflict,
        write_slots=write_slots,
        volumes=volumes,
        binding=binding,
        on_waiting=binding_pending,
    )
    evictor = Evictor(writer, recorder, scheduler_name=settings.scheduler_name, on_step=on_step)
    scheduler = Scheduler(
        settings,
        writer,
        cache,
        metrics,
        queue=queue,
        committer=committer,
        recorder=recorder,
        evictor=evictor,
        memo=UnschedulableMemo(),
        jobs=jobs,
        write_slots=write_slots,
    )
    deallocator = Deallocator(writer, cache, committer, metrics, finalizer=settings.finalizer)
    return Graph(cache, queue, committer, scheduler, deallocator)

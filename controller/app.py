"""The controller process: one asyncio loop, every background task under one guard.

:class:`Controller` runs the caches, the scheduler and the deallocator (built together by
:func:`controller.wiring.build`), leader election and the HTTP endpoints:

* the informers start at once (a standby keeps warm caches, so it takes over quickly);
* once the caches are synced and (with leader election) the Lease is held, the scheduler and
  the deallocator start; a leader that cannot renew stops and the process exits non-zero, as
  client-go's ``OnStoppedLeading`` does;
* with leader election, the scheduler, committer and deallocator write through
  :class:`~controller.leader.FencedApi`: no write leaves a process whose lease is not known
  valid (:mod:`controller.leader`); the Lease itself goes through its own, unfenced client;
* once the caches are synced the decision engine is built from them (so the first pod does not
  pay for it, and a standby is as ready to take over as the leader). The garbage collector is
  off while the caches load and the engine is built (everything loaded lives as long as the
  process; collections over it were half the start-up time at 5000 nodes), then what was
  loaded is frozen out of its way (``gc.freeze``) and it runs again, its youngest generation
  collected every 20,000 allocations instead of every 700 (:data:`GC_THRESHOLDS`: each pod's
  events, requests and decision allocate thousands of short-lived objects; with CPython's
  defaults the collector took 0.61 s of CPU over a 2,000-pod mixed run at 5000 nodes, two
  thirds of it in the older generations' passes over what the pods kept, 0.23 s after);
* the endpoints are served off the loop (:mod:`kubeapi.serving`): ``/healthz`` (and
  ``/livez``) answer 200 while no background task has crashed, ``/readyz`` once the caches
  are synced and the engine is built, ``/metrics`` the Prometheus text format. The loop
  publishes the probes' answers when they change and the sampled gauges every
  :data:`PUBLISH_INTERVAL_S`; a request reads only what was published. ``/metrics`` listens on
  ``--metrics-bind-address`` (loopback by default) and, with ``--metrics-auth=delegated``,
  over HTTPS for callers the API server authenticates and authorizes; the probes also have a
  listener of their own (``--health-port``) for the kubelet; with ``--admission-webhook-port``
  every replica (leader or standby) serves the admission webhook (:mod:`controller.webhook`)
  over HTTPS on a listener of its own, from the start (it needs no cache);
* one :class:`kubeapi.tasks.TaskGuard` starts every background task; a task that crashes (or
  returns, since they are meant to run forever) is logged with its traceback and stops the
  process;
* shutdown (SIGTERM, SIGINT, :meth:`Controller.stop`): stop taking new pods, let writes in
  flight finish for ``shutdown_grace_s``, cancel the tasks in reverse start order, release
  the Lease, close the endpoint and the API session.

:func:`run` is the CLI entry: it resolves the kubeconfig, runs a controller until it stops,
and returns the exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from typing import Final

from controller import webhook
from controller.api import Api, Endpoint, KubeApi
from controller.commit import StepHook
from controller.leader import FencedApi, LeaderElector, WriteFence
from controller.metrics import Metrics
from controller.settings import FIELD_MANAGER, Settings
from controller.wiring import build
from driver.api.errors import ConfigError
from kubeapi.serving import (
    Board,
    DelegatedAuth,
    EndpointServer,
    Probe,
    reloading_tls_context,
    tls_context,
)
from kubeapi.tasks import TaskGuard

log = logging.getLogger(f"biaxial.{__name__}")

EXIT_OK = 0
EXIT_FAILED = 1
#: how often the loop hands the probes' answers and the sampled gauges (queue depths, claims
#: in flight) to the endpoint threads; changes of health and readiness are handed at once
PUBLISH_INTERVAL_S = 1.0
#: The collector's thresholds once start-up is done (see the module docstring): the youngest
#: generation every 20,000 net allocations, the older ones every 20 collections of the one
#: below (CPython's defaults: 700, 10, 10).
GC_THRESHOLDS: Final = (20_000, 20, 20)


class Controller:
    """One controller instance on the running loop (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        api: Api,
        *,
        on_step: StepHook | None = None,
        metrics: Metrics | None = None,
        lease_api: Api | None = None,
        fence: WriteFence | None = None,
        review_endpoint: Endpoint | None = None,
    ) -> None:
        self.settings = settings
        self.api = api
        self.metrics = metrics or Metrics()
        self.fence = fence if fence is not None else WriteFence()
        # Every write of the scheduler, committer and deallocator passes the leader fence.
        writer: Api = FencedApi(api, self.fence) if settings.leader_elect else api
        graph = build(settings, api, self.metrics, writer=writer, on_step=on_step)
        self.cache = graph.cache
        self.queue = graph.queue
        self.scheduler = graph.scheduler
        self.deallocator = graph.deallocator
        self.elector = (
            LeaderElector(lease_api or api, settings, self.metrics, self.fence)
            if settings.leader_elect
            else None
        )
        self.guard = TaskGuard(on_failure=lambda _name, _reason: self._publish())
        self.stopping = asyncio.Event()
        self.leading = asyncio.Event()
        self.review_endpoint = review_endpoint
        self.board = Board()
        self.endpoints: list[EndpointServer] = []
        self.http_port: int | None = None
        self.webhook_port: int | None = None
        self._scheduler_task: asyncio.Task[None] | None = None
        self._warm = False  # the decision engine is built

    @property
    def ready(self) -> bool:
        return self.cache.synced and self._warm

    def stop(self) -> None:
        self.stopping.set()

    # ------------------------------------------------------------------ endpoints

    def _start_endpoints(self) -> None:
        """The metrics and probe listeners, each in a thread of its own (kubeapi.serving)."""
        s = self.settings
        self._publish()
        if s.metrics_port:
            auth = tls = None
            if s.metrics_auth == "delegated":
                if self.review_endpoint is None:
                    raise ConfigError("--metrics-auth=delegated needs the API server's endpoint")
                auth = DelegatedAuth(self.review_endpoint)
                tls = tls_context(s.tls_cert_file or "", s.tls_private_key_file or "")
            server = EndpointServer(
                s.metrics_bind_address,
                s.metrics_port,
                self.board,
                render=self.metrics.render,
                auth=auth,
                tls=tls,
                name="metrics",
            )
            self.endpoints.append(server.start())
            self.http_port = server.port
            log.info(
                "serving /metrics (%s) and the probes on %s:%d",
                "HTTPS, delegated authorization" if auth else "plain HTTP",
                s.metrics_bind_address,
                server.port,
            )
        if s.health_port:
            server = EndpointServer(
                s.health_bind_address,
                s.health_port,
                self.board,
                name="health",
                flag="--health-port",
            )
            self.endpoints.append(server.start())
            log.info(
                "serving /healthz, /livez, /readyz on %s:%d", s.health_bind_address, server.port
            )
        if s.admission_webhook_port:
            scope = webhook.scope(frozenset(s.admission_schedulers), s.scheduler_name)
            server = EndpointServer(
                s.admission_webhook_bind_address,
                s.admission_webhook_port,
                self.board,
                tls=reloading_tls_context(
                    s.admission_tls_cert_file or "",
                    s.admission_tls_private_key_file or "",
                    "--admission-tls-cert-file",
                ),
                post={webhook.PATH: lambda body: webhook.review(body, scope)},
                name="admission-webhook",
                flag="--admission-webhook-port",
            )
            self.endpoints.append(server.start())
            self.webhook_port = server.port
            log.info(
                "serving the admission webhook (HTTPS POST %s, taking over %s) on %s:%d",
                webhook.PATH,
                ", ".join(s.admission_schedulers),
                s.admission_webhook_bind_address,
                server.port,
            )

    def _publish(self) -> None:
        """Hand the probe answers and the sampled gauges to the endpoint threads (the loop's
        state is only ever read here, on the loop)."""
        reason = self.guard.reason
        self.board.publish(
            "/healthz",
            Probe(False, f"unhealthy: {reason}\n", 500) if reason else Probe(True, "ok\n"),
        )
        if not self.ready:
            what = "caches not synced" if not self.cache.synced else "decision engine not built"
            self.board.publish("/readyz", Probe(False, f"{what}\n"))
        else:
            role = "leader" if self.leading.is_set() else "standby"
            self.board.publish("/readyz", Probe(True, f"ok ({role})\n"))
        self.metrics.set_queue_depths(self.queue.depths)
        self.metrics.in_flight_claims.set(self.cache.overlay.in_flight)

    async def _publish_loop(self) -> None:
        while True:
            self._publish()
            await asyncio.sleep(PUBLISH_INTERVAL_S)

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> int:
        """Run until stopped; returns the process exit code."""
        code = EXIT_OK
        gc.disable()  # until the engine is built: see the module docstring
        try:
            self._start_endpoints()
            self.guard.start("endpoints", self._publish_loop())
            for informer in self.cache.informers:
                self.guard.start(f"informer-{informer.resource.plural}", informer.run())
            if not await self.guard.until(self.stopping, self.cache.wait_synced()):
                return self._exit_code()
            log.info("caches synced")
            self._warm_up()
            self._publish()
            if self.elector is not None and not await self.guard.until(
                self.stopping, self.elector.acquire()
            ):
                return self._exit_code()
            self.leading.set()
            self._publish()
            self._scheduler_task = self.guard.start("scheduler", self.scheduler.run())
            self.guard.start("deallocator", self.deallocator.run())
            if self.elector is not None:
                self.guard.start("leader-renewal", self.elector.hold())
            await self.guard.until(self.stopping)
            code = self._exit_code()
        finally:
            await self._shutdown()
        return code

    def _warm_up(self) -> None:
        """Build the decision engine from the synced caches, then freeze what start-up loaded
        out of the collector's way (it lives as long as the process)."""
        started = time.perf_counter()
        self.scheduler.warm()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        gc.enable()
        self._warm = True
        log.info(
            "decision engine built in %.2f s; %d start-up objects frozen out of the collector",
            time.perf_counter() - started,
            gc.get_freeze_count(),
        )

    def _exit_code(self) -> int:
        if self.guard.tripped.is_set():
            log.error("stopping: %s", self.guard.reason)
            return EXIT_FAILED
        return EXIT_OK

    async def _shutdown(self) -> None:
        log.info("shutting down")
        gc.enable()  # (if it stopped before the engine was built)
        if self._scheduler_task is not None:  # take no new pods; let writes in flight finish
            self._scheduler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._scheduler_task
        await self.scheduler.stop(self.settings.shutdown_grace_s)
        await self.guard.stop(self.settings.shutdown_grace_s)
        if self.elector is not None:
            await self.elector.release()
        for server in reversed(self.endpoints):
            await asyncio.to_thread(server.close)
        self.endpoints.clear()
        self.leading.clear()


async def run(settings: Settings, *, install_signals: bool = True) -> int:
    """Resolve the kubeconfig, run one controller until it stops; the exit code."""
    endpoint = Endpoint.resolve(settings.kubeconfig, local_fallback=True)
    metrics = Metrics()
    fence = WriteFence() if settings.leader_elect else None
    user_agent = f"{FIELD_MANAGER} ({settings.identity})"  # audit logs name the replica
    async with (
        KubeApi(
            endpoint,
            qps=settings.qps,
            burst=settings.burst,
            request_timeout_s=settings.request_timeout_s,
            user_agent=user_agent,
            write_fence=fence.check if fence is not None else None,
        ) as api,
        KubeApi(
            endpoint,
            request_timeout_s=settings.request_timeout_s,
            user_agent=f"{user_agent} leader-election",
        ) as lease_api,
    ):
        metrics.api_requests.follow(lambda: api.requests)
        metrics.api_requests.follow(lambda: lease_api.requests)
        controller = Controller(
            settings,
            api,
            metrics=metrics,
            lease_api=lease_api,
            fence=fence,
            review_endpoint=endpoint,
        )
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, controller.stop)
        log.info(
            "biaxial controller %s starting: scheduler %s, driver %s, qps %.0f burst %d",
            settings.identity,
            settings.scheduler_name,
            settings.driver_name,
            settings.qps,
            settings.burst,
        )
        return await controller.run()

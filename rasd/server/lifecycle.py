"""The daemon's lifecycle (:class:`Daemon`), top to bottom: listen, bring up, serve, hand over,
stop. The walk through it: docs/architecture.md, "The roles of one daemon"; what each step
means to an operator: docs/operations.md, "The daemon on a host (systemd)".
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import socket
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from ..config import Config
from ..core.clock import Clock, GuardedClock, clock_from_env
from ..core.errors import RasdError
from ..core.rollout import ROLLOUT_KEY
from ..daemon.published import Published
from ..limits import InflightGate
from ..observe.metrics import Counters
from ..observe.pools import PoolMetrics
from ..observe.prom import LatencyHistograms, MetricsServer, MetricsUnavailable
from . import exporter, handover, socketfile
from .clockwatch import ClockGuard
from .connection import Connection
from .diagnostics import describe_cause
from .peercred import Acl
from .routing import Router
from .sdnotify import Notifier, run_watchdog, watchdog_interval
from .serving import Serving, Status
from .startup import BringUp

if TYPE_CHECKING:  # imported at run time by the bring-up, after the socket already serves
    from ..daemon.coordinator import Coordinator
    from ..dynamo.store import Store

log = structlog.get_logger("rasd.server")

#: Connections the kernel queues for the daemon to accept, the same as systemd/rasd.socket's
#: Backlog=: a burst of connects (every worker of a pre-fork web server at start-up) waits
#: in it instead of failing with EAGAIN, whether the daemon bound the socket itself
#: (``rasd serve --socket``) or inherited it. The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096


class Daemon:
    """One daemon process: its socket, its store and roles once up, its router, its
    connections and tasks."""

    def __init__(
        self,
        cfg: Config,
        *,
        clock: Clock | None = None,
        store: Store | None = None,
        counters: Counters | None = None,
        reloader: Callable[[], Config] | None = None,
    ) -> None:
        self.cfg = cfg
        self.reloader = reloader
        self.gate = InflightGate(cfg.max_inflight)
        self.latency = LatencyHistograms()
        self.pool_metrics = PoolMetrics()
        self.notifier = Notifier()
        raw = clock or clock_from_env()
        #: this host's clock, watched (``rasd.server.clockwatch``); the roles get it guarded:
        #: no wall time while it is not trusted
        #: the hit tables the cache publishes (None: ``hit_table`` off); paused while the
        #: clock is not trusted, as the hit is
        no_table = Published.unsupported() if cfg.hit_table else None
        if no_table is not None:
            log.warning("hit_table_off", why=no_table)
        self.published = Published(cfg.hit_table_slots) if cfg.hit_table and not no_table else None
        self.clock_guard = ClockGuard(
            cfg.clock_check,
            cfg.max_clock_skew,
            raw.now_us,
            raw.mono,
            on_verdict=None if self.published is None else self.published.pause,
        )
        self.clock = raw if cfg.clock_check == "off" else GuardedClock(raw, self.clock_guard)
        self.counters = counters or (store.counters if store else Counters())
        # Both exist once the store is up (self.up is set; :meth:`attach`); nothing reads
        # them before.
        self.store: Store
        self.coordinator: Coordinator
        #: Set once DynamoDB answered and the pools are loaded; requests wait on it.
        self.up = asyncio.Event()
        #: ready; why degraded (DynamoDB unreachable at start), or None; when started
        self.status = Status()
        #: The process's exit status: 2 when the start is refused (an AWS setting that cannot
        #: be honoured, a socket path another live process serves on).
        self.exit_status = 0
        self._bring_up_task: asyncio.Task[None] | None = None
        self.connections: set[Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.inflight: set[asyncio.Task[None]] = set()
        #: what each connection serves: every frame's handling (rasd.server.routing)
        self.router = Router(
            cfg,
            self.counters,
            acl=Acl.from_config(cfg.acl),
            gate=self.gate,
            latency=self.latency,
            pool_metrics=self.pool_metrics,
            status=self.status,
            up=self.up,
            connections=self.connections,
            inflight=self.inflight,
            # the monotonic clock of the request path (Clock.mono without a method call)
            mono=time.monotonic if type(raw) is Clock else raw.mono,
            clock_guard=self.clock_guard,
        )
        self._stop = asyncio.Event()
        self._bound_path: str | None = None
        self._bound_id: socketfile.Identity | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._metrics: MetricsServer | None = None
        self._socket_name = cfg.socket
        self._watchdog_started = False
        #: The inherited listening socket (fd 3 under socket activation), for a hand-over.
        self._listen_sock: socket.socket | None = None
        #: The start-up against DynamoDB; ``store``: one given by tests (a FaultyStore).
        self.bringup = BringUp(self, store)
        self.handover = handover.Handover(self)
        #: A hand-over's successor, until it accepts (its predecessor holds the metrics port).
        self._taking_over = False

    # ------------------------------------------------------------------ state
    def stats(self) -> dict[str, Any]:
        """What ``rasd stats`` reports (``Router.stats``)."""
        return self.router.stats()

    def attach(self, store: Store, coordinator: Coordinator) -> None:
        """The store is up and the roles made: the router serves with them (``up`` is set
        by the caller, once the rest of the start-up is done)."""
        self.store, self.coordinator = store, coordinator
        self.router.serve(Serving.of(store, coordinator))

    def came_up(self, store: Store, coordinator: Coordinator, pools: int) -> None:
        """The store answered and ``pools`` pools are loaded: serve with them, keep them
        fresh, READY=1."""
        self.attach(store, coordinator)
        self.spawn(self._refresh_pools())
        self.spawn(coordinator.reporter.report_misses_forever())
        self.status.serving()
        self.up.set()
        cfg = self.cfg
        self.announce(f"serving {pools} pools in {cfg.region}")
        log.info(
            "ready",
            socket=self._socket_name,
            region=cfg.region,
            table=cfg.table,
            pools=pools,
            endpoint=self.bringup.endpoint(),
            aws=store.aws.public() if store.aws is not None else None,
            acl="open" if self.router.acl.open else "enforced",
            metrics_port=self._metrics.port if self._metrics else None,
            startup_s=round(time.time() - self.status.started, 3),
        )

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """A background task of the daemon's, cancelled at shutdown."""
        self._tasks.append(asyncio.get_running_loop().create_task(coro))

    # ------------------------------------------------------------------ start
    @property
    def listen_sock(self) -> socket.socket | None:
        """The listening socket (None before :meth:`listen`)."""
        return self._listen_sock

    @property
    def stopping(self) -> bool:
        """Has a stop been asked for (SIGTERM, or a hand-over that completed)?"""
        return self._stop.is_set()

    async def listen(self, sock: socket.socket | None = None) -> None:
        """Accept on the socket now (and serve metrics, if asked). Nothing heavy happens here."""
        # Metrics first: a port that cannot be had stops the daemon before it binds its socket.
        if self.cfg.metrics_port:
            try:
                self._metrics = exporter.serve(self.cfg.metrics_port, self.router)
            except OSError as exc:
                if not (self._taking_over and exc.errno == errno.EADDRINUSE):
                    raise MetricsUnavailable(
                        f"metrics_port {self.cfg.metrics_port}: {exc.strerror} (another "
                        "daemon's metrics?): set metrics_port (RASD_METRICS_PORT) to a free "
                        "port, or unset it"
                    ) from exc
                # A hand-over's predecessor serves the port until it stops (it lets go of
                # it first thing): bind it then, so that one process at a time answers.
                self.spawn(self._bind_metrics_later())
        loop = asyncio.get_running_loop()
        if sock is not None:
            self._listen_sock = sock
            # asyncio and uvloop call listen() on a socket they are given, inherited ones too:
            # without the backlog they would cut systemd's Backlog= down to their default 100.
            self.server = await loop.create_unix_server(
                lambda: Connection(self.router), sock=sock, backlog=LISTEN_BACKLOG
            )
        else:
            # Our own socket file: never one another live process serves on (SocketInUse),
            # and removed at exit only while it is still the one bound here.
            path = self.cfg.socket
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            socketfile.claim(path)
            own = socketfile.bind(path)
            self._bound_path, self._bound_id = path, socketfile.identity(path)
            try:
                os.chmod(path, self.cfg.socket_mode)
                self.server = await loop.create_unix_server(
                    lambda: Connection(self.router), sock=own, backlog=LISTEN_BACKLOG
                )
            except BaseException:
                own.close()
                socketfile.remove_if_ours(path, self._bound_id)
                self._bound_path = None
                raise
        self._socket_name = self.cfg.socket if sock is None else "inherited"
        self.spawn(self._sweep_connections())
        self.spawn(self.clock_guard.watch(self._probe_clock))
        # Accepting now; requests wait for the store within their deadlines. READY=1 (and
        # the watchdog) follow once the store is up, or at the first failed attempt (degraded:
        # systemd's start timeout must not kill a daemon that is retrying on purpose).

    async def _probe_clock(self) -> None:
        """One cheap read of DynamoDB, for the Date header it answers with (the clock watch
        asks while the clock is doubted and the daemon's own traffic has stopped)."""
        if self.up.is_set():
            await self.store.get_item(ROLLOUT_KEY, time.monotonic() + 2.0)

    async def _sweep_connections(self) -> None:
        """Close connections past their frame or idle timeout (``Router.sweep``)."""
        while True:
            await asyncio.sleep(1.0)
            self.router.sweep()

    def announce(self, status: str) -> None:
        """READY=1 with STATUS=; the first call also starts the watchdog pings."""
        self.notifier.ready(status=status)
        if not self._watchdog_started:
            self._watchdog_started = True
            interval = watchdog_interval()
            if interval:
                self.spawn(run_watchdog(self.notifier, interval))

    async def startup(self, sock: socket.socket | None = None) -> None:
        """Listen, then bring the store up once; raises if that fails (tests, embedding)."""
        await self.listen(sock)
        await self.bringup.attempt()

    async def run(self, sock: socket.socket | None = None) -> None:
        """The daemon's whole life: serve at once, bring the store up in the background
        (retrying while DynamoDB is unreachable), stop on stop()."""
        handover_fd = os.environ.pop("RASD_HANDOVER_FD", None)
        if handover_fd is not None and sock is not None:
            # A hand-over's successor: bring the store up first, accept only then (a
            # successor that cannot start must not answer anybody; its predecessor serves on).
            # Not the main process yet: systemd (NotifyAccess=main) would refuse and log our
            # READY=1/WATCHDOG=1; the predecessor announces us (MAINPID=) instead.
            address, self.notifier.address = self.notifier.address, None
            self._taking_over = True
            try:
                async with asyncio.timeout(self.cfg.startup_deadline):
                    await self.bringup.attempt()
            except Exception as exc:  # noqa: BLE001 - any failure: the predecessor serves on
                log.error("handover_failed", cause=describe_cause(exc), side="successor")
                raise SystemExit(1) from None
            await handover.take_over(self, sock, int(handover_fd))
            self._taking_over = False
            self.notifier.address = address
        else:
            try:
                await self.listen(sock)
            except socketfile.SocketInUse as exc:  # another daemon serves there: refuse
                log.error("startup_refused", cause=str(exc))
                self.exit_status = 2
                self.notifier.close()
                return
            self._bring_up_task = asyncio.get_running_loop().create_task(self.bringup.until_up())
        try:
            await self.main_loop()
        finally:
            await self.shutdown(self.cfg.drain_timeout)

    # ------------------------------------------------------------------ serve
    async def main_loop(self) -> None:
        await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    def reconfigure(self, new: Config, acl: Acl) -> None:
        """A reload (SIGHUP): what is safe to change live, each by the role that holds it (the
        access list, the rate limits, ``max_inflight``); the rest of ``new`` is not taken."""
        self.router.regrant(acl)
        self.router.set_call_rate(new.call_rate_limit, new.call_rate_burst)
        self.gate.set_limit(new.max_inflight)
        if self.up.is_set():
            self.coordinator.driver.set_rates(new.rate_limit, new.rate_burst)
        self.cfg = dataclasses.replace(
            self.cfg,
            acl=new.acl,
            acl_open=new.acl_open,
            log_level=new.log_level,
            max_inflight=new.max_inflight,
            rate_limit=new.rate_limit,
            rate_burst=new.rate_burst,
            call_rate_limit=new.call_rate_limit,
            call_rate_burst=new.call_rate_burst,
        )

    def exit_with(self, status: int) -> None:
        """Stop, the process to exit with ``status`` (2: the start refused)."""
        self.exit_status = status
        self.stop()

    def hand_over(self) -> None:
        """SIGUSR2: start a successor on the same listening socket and stop once it serves
        (rasd.server.handover)."""
        self.handover.start()

    # ------------------------------------------------------------------- stop
    async def shutdown(self, drain: float = 5.0) -> None:
        """Hand the socket over: stop accepting, answer what was read, close, then clean up.

        1. Close our listening fd. Under socket activation systemd (rasd.socket) keeps its
           own, so the socket stays open and callers that connect now wait in its backlog
           for the next process (or the successor of a hand-over, which accepts already).
        2. Every connection stops reading (:meth:`Connection.quiesce`): idle ones close at
           once, the others as soon as their last request read is answered. A request is
           never read and then dropped: what a client sends after this stays unread, and its
           client retries it on a new connection (docs/protocol.md, "Restarts").
        3. In-flight requests finish within their own deadlines (bounded by ``drain``);
           then background writes are drained and the store closed, with no client waiting.
        """
        self.status.stopping()
        if self.published is not None:  # no answer from a table of this process from now
            self.published.close()
        if not self.handover.handed_over:  # after one the successor is the main process
            self.notifier.stopping(status="draining")
        log.info(
            "stopping",
            inflight=len(self.inflight),
            connections=len(self.connections),
            drain_s=drain,
            handed_over=self.handover.handed_over,
        )
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            conn.quiesce()
        if self._bring_up_task is not None:
            self._bring_up_task.cancel()
            await asyncio.gather(self._bring_up_task, return_exceptions=True)
        for t in self._tasks:
            t.cancel()
        if self._metrics is not None:
            self._metrics.close()
        end = time.monotonic() + drain
        while self.inflight and (left := end - time.monotonic()) > 0:
            await asyncio.wait(set(self.inflight), timeout=left)
        for t in set(self.inflight):
            t.cancel()  # past the drain bound: its connection closes unanswered (retried)
        for conn in list(self.connections):
            conn.close()
        if self.up.is_set():
            await self.coordinator.drain(timeout=drain)
            try:
                await self.coordinator.reporter.flush_misses(
                    time.monotonic() + self.cfg.flush_misses_timeout
                )
            except RasdError:
                pass
            await self.coordinator.prefetch.stop()
            await self.coordinator.driver.close_peers()
            await self.store.close()
        if self._bound_path:
            socketfile.remove_if_ours(self._bound_path, self._bound_id)
        self.notifier.close()
        log.info("stopped")

    # ------------------------------------------------------------ background
    async def _refresh_pools(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.pool_refresh)
            try:
                await self.coordinator.pool_table.load(
                    time.monotonic() + self.cfg.pool_refresh_timeout
                )
            except RasdError as exc:
                log.warning("pool_refresh_failed", error=str(exc))

    async def _bind_metrics_later(self) -> None:
        """The metrics port, once a hand-over's predecessor let go of it: tried every 0.1 s;
        a warning once if that takes longer than the predecessor's drain should."""
        port = self.cfg.metrics_port
        assert port
        warn_at: float | None = time.monotonic() + self.cfg.drain_timeout + 5.0
        while True:
            await asyncio.sleep(0.1)
            try:
                self._metrics = exporter.serve(port, self.router)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    log.error("metrics_unavailable", port=port, cause=str(exc))
                    return
                if warn_at is not None and time.monotonic() > warn_at:
                    log.warning("metrics_port_busy", port=port, note="still retrying")
                    warn_at = None
                continue
            log.info("metrics_serving", port=port)
            return

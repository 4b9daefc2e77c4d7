"""The daemon's lifecycle, top to bottom: start, serve, reload, hand over, stop.

Theory of operation
-------------------
::

    listen()    -> accept on the socket (our own, or systemd's via LISTEN_FDS) at once, before
                   the heavy imports (aioboto3 is ~1 s) and DynamoDB warm-up, so socket
                   activation answers its first call quickly; our own never where another
                   live process serves (rasd.server.socketfile: exit 2)
    bring_up()  -> import the store, open and warm the DynamoDB pool, load pool definitions,
                   prefetch first candidates (bounded); then READY=1 and the watchdog.
                   Requests that arrive meanwhile wait for it within their own deadline. If
                   DynamoDB cannot be reached the daemon does not exit: it runs *degraded*
                   (UNAVAILABLE at once, STATUS= says why, one structured log line per try
                   naming the endpoint and the cause) and retries with backoff
                   (``startup_retry_initial`` .. ``startup_retry_max``)
    startup()   -> listen() + one bring_up() attempt that raises on failure (tests, embedding)
    run()       -> listen() + bring_up() retrying in the background + main loop + shutdown();
                   a hand-over's successor brings its store up first and accepts only then
    main_loop() -> serve until stop() (SIGTERM/SIGINT); reload() on SIGHUP, hand_over() on
                   SIGUSR2
    shutdown()  -> STOPPING=1, stop accepting, drain in-flight requests within a bound, close

:func:`run_daemon` wires the signals and runs it (``rasd serve``, ``rasd dev``).

The other jobs live beside this file: each connection's framing in rasd.server.connection,
what a request frame leads to (the hit, a miss, the other ops, the slow path) in
rasd.server.routing (``Router``, which ``Daemon`` makes and its connections serve), the SIGUSR2
hand-over in rasd.server.handover, and what a failed start-up logs in
rasd.server.diagnostics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import importlib
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from ..config import Config
from ..core.clock import Clock
from ..core.errors import RasdError
from ..dynamo.aws import AwsSettingsError
from ..limits import InflightGate
from ..observe import log as logsetup
from ..observe.metrics import Counters
from ..observe.pools import PoolMetrics
from ..observe.prom import LatencyHistograms, MetricsServer
from . import exporter, handover, socketfile
from .connection import Connection
from .diagnostics import close_quietly, describe_cause, is_boto, loop_exception, probe_endpoint
from .peercred import Acl
from .routing import Router, Status
from .sdnotify import Notifier, run_watchdog, watchdog_interval

if TYPE_CHECKING:  # imported at run time by bring_up(), after the socket already serves
    from ..daemon.coordinator import Coordinator
    from ..dynamo.store import Store

log = structlog.get_logger("rasd.server")

#: Connections the kernel queues for the daemon to accept, the same as systemd/rasd.socket's
#: Backlog=: a burst of connects (every worker of a pre-fork web server at start-up) waits
#: in it instead of failing with EAGAIN, whether the daemon bound the socket itself
#: (``rasd serve --socket``) or inherited it. The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096

#: Seconds from up to botocore's check of cached AWS settings: the requests queued during
#: a restart are answered first. The check (about 0.2 s of CPU in a child) runs at the
#: daemon's priority under the unit, whose syscall filter refuses nice().
AWS_CONFIRM_DELAY = 1.0


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
        self.clock = clock or Clock()
        self.counters = counters or (store.counters if store else Counters())
        #: Given by tests (a FaultyStore); else made by bring_up() after the heavy import.
        self._given_store = store
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
        #: The DynamoDB endpoint botocore resolved, once a start-up attempt resolved it.
        self._endpoint: str | None = None
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
            mono=time.monotonic if type(self.clock) is Clock else self.clock.mono,
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
        self.router.serve(store, coordinator)

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
        if self.cfg.metrics_port:
            try:
                self._metrics = exporter.serve(self.cfg.metrics_port, self.router)
            except OSError as exc:
                if not (self._taking_over and exc.errno == errno.EADDRINUSE):
                    raise
                # A hand-over's predecessor serves the port until it stops (it lets go of
                # it first thing): bind it then, so that one process at a time answers.
                self._tasks.append(loop.create_task(self._bind_metrics_later()))
        # Accepting now; requests wait for the store within their deadlines. READY=1 (and
        # the watchdog) follow once the store is up, or at the first failed attempt (degraded:
        # systemd's start timeout must not kill a daemon that is retrying on purpose).

    def _announce(self, status: str) -> None:
        """READY=1 with STATUS=; the first call also starts the watchdog pings."""
        self.notifier.ready(status=status)
        if not self._watchdog_started:
            self._watchdog_started = True
            interval = watchdog_interval()
            if interval:
                loop = asyncio.get_running_loop()
                self._tasks.append(loop.create_task(run_watchdog(self.notifier, interval)))

    def endpoint(self) -> str:
        """The DynamoDB endpoint botocore resolved (before that, a guess), for log lines and
        STATUS=."""
        return (
            self._endpoint
            or self.cfg.endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
            or os.environ.get("AWS_ENDPOINT_URL")
            or f"https://dynamodb.{os.environ.get('AWS_REGION') or self.cfg.region}.amazonaws.com"
        )

    def ddb_region(self) -> str:
        """The DynamoDB client's region (``AWS_REGION``, else the RAS region)."""
        return os.environ.get("AWS_REGION") or self.cfg.region

    def _why_degraded(self, cause: str) -> str:
        """What STATUS= and UNAVAILABLE say while DynamoDB fails at start: where it was asked
        (a table missing there usually exists in another region or behind another endpoint)."""
        where = f"DynamoDB at {self.endpoint()} (region {self.ddb_region()})"
        if "ResourceNotFoundException" in cause:
            return (
                f"{where} has no table {self.cfg.table!r}: {cause}; if it exists, this is the "
                "wrong region or endpoint (AWS_REGION, endpoint_url, AWS_ENDPOINT_URL_DYNAMODB)"
            )
        return f"{where}, table {self.cfg.table!r}, unreachable: {cause}"

    async def _bring_up_once(self) -> int:
        """Import the store (in a thread: the loop keeps accepting), warm DynamoDB, load pools."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.startup_deadline
        roles_mod = await asyncio.to_thread(importlib.import_module, "rasd.daemon.coordinator")
        store_mod = importlib.import_module("rasd.dynamo.store")
        store = self._given_store or store_mod.Store(cfg, self.counters)
        try:
            await store.start()
            if store.aws is not None:
                self._endpoint = store.aws.endpoint_url
            await store.warm(cfg.startup_deadline)
            coordinator = roles_mod.Coordinator(cfg, store, self.clock, self.counters)
            n: int = await coordinator.pool_table.load(deadline)
        except BaseException:
            if store is not self._given_store:
                await close_quietly(store)
            raise
        await coordinator.prefetch.warm(list(coordinator.pools.values()), timeout=cfg.prefetch_warm)
        self.attach(store, coordinator)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._refresh_pools()))
        self._tasks.append(loop.create_task(coordinator.reporter.report_misses_forever()))
        self.status.ready = True
        self.status.degraded = None
        self.up.set()
        if store.aws is not None and store.aws.cache_key is not None:
            self._tasks.append(loop.create_task(self._confirm_aws(store)))
        self._announce(f"serving {n} pools in {cfg.region}")
        log.info(
            "ready",
            socket=self._socket_name,
            region=cfg.region,
            table=cfg.table,
            pools=n,
            endpoint=self.endpoint(),
            aws=store.aws.public() if store.aws is not None else None,
            acl="open" if self.router.acl.open else "enforced",
            metrics_port=self._metrics.port if self._metrics else None,
            startup_s=round(time.time() - self.status.started, 3),
        )
        return n

    async def _confirm_aws(self, store: Store) -> None:
        """The AWS settings came from an earlier start (rasd.dynamo.awscache): botocore,
        resolving them again now, must agree. If it refuses them or decides otherwise, stop:
        the next start runs on botocore's decision (a refusal: exit 2, as a refused start)."""
        await asyncio.sleep(AWS_CONFIRM_DELAY)
        t0 = time.monotonic()
        try:
            fresh = await store.confirm_aws()
        except AwsSettingsError as exc:
            self.status.degraded = str(exc)
            log.error("startup_refused", cause=str(exc))
            self.exit_status = 2
            self.stop()
            return
        except Exception as exc:  # noqa: BLE001 - no verdict: the cached settings stand
            log.warning("aws_settings_unconfirmed", cause=str(exc))
            return
        if fresh is None:
            log.info("aws_settings_confirmed", took_s=round(time.monotonic() - t0, 3))
        else:
            assert store.aws is not None
            log.error(
                "aws_settings_changed",
                cached=store.aws.public(),
                botocore=fresh.public(),
                action="stopping; the next start uses botocore's settings",
            )
            self.exit_status = 1
            self.stop()

    async def bring_up(self) -> None:
        """Retry :meth:`_bring_up_once` with backoff until it works: never exit for an
        unreachable DynamoDB. While it fails the daemon is degraded (UNAVAILABLE at once)."""
        cfg = self.cfg
        delay = cfg.startup_retry_initial
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._bring_up_once()
                return
            except asyncio.CancelledError:
                raise
            except AwsSettingsError as exc:  # retrying cannot help: refuse to start
                self.status.degraded = str(exc)
                log.error("startup_refused", cause=str(exc))
                self.exit_status = 2
                self.stop()
                return
            except Exception as exc:  # noqa: BLE001 - every failure is retried; logged below
                cause = describe_cause(exc)
                if "circuit breaker" in cause or "no answer" in cause:
                    # The store's error hides the network's: ask the network directly.
                    cause = f"{cause}; {await probe_endpoint(self.endpoint())}"
                self.status.degraded = self._why_degraded(cause)
                expected = isinstance(exc, RasdError | OSError | TimeoutError) or is_boto(exc)
                log.error(
                    "startup_failed",
                    endpoint=self.endpoint(),
                    region=self.ddb_region(),
                    table=cfg.table,
                    cause=cause,
                    attempt=attempt,
                    retry_in_s=round(delay, 2),
                    **({} if expected else {"exc_info": exc}),
                )
                self.counters.inc("startup.failed")
                self._announce(f"degraded: {self.status.degraded}; retry {attempt} in {delay:.1f}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, cfg.startup_retry_max)

    async def startup(self, sock: socket.socket | None = None) -> None:
        """Listen, then bring the store up once; raises if that fails (tests, embedding)."""
        await self.listen(sock)
        await self._bring_up_once()

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
                    await self._bring_up_once()
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
            self._bring_up_task = asyncio.get_running_loop().create_task(self.bring_up())
        try:
            await self.main_loop()
        finally:
            await self.shutdown(self.cfg.drain_timeout)

    # ------------------------------------------------------------------ serve
    async def main_loop(self) -> None:
        await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    def reload(self) -> None:
        """SIGHUP: re-read the config; apply what is safe to change live (acl, log_level,
        rate limits, max_inflight). A bad config is logged and the old one kept."""
        if self.reloader is None:
            return
        self.notifier.reloading()
        try:
            new = self.reloader()
            acl = Acl.from_config(new.acl)
        except ValueError as exc:  # ConfigError and AclError
            log.error("reload_failed", error=str(exc))
            self.notifier.ready(status="reload failed; old config kept")
            return
        from ..limits import BucketTable

        self.router.regrant(acl)
        self.gate.limit = new.max_inflight
        if self.up.is_set():
            self.coordinator.driver.buckets = BucketTable(new.rate_limit, new.rate_burst)
        logsetup.configure(new.log_level)
        self.cfg = dataclasses.replace(
            self.cfg,
            acl=new.acl,
            log_level=new.log_level,
            max_inflight=new.max_inflight,
            rate_limit=new.rate_limit,
            rate_burst=new.rate_burst,
        )
        self.notifier.ready(status="reloaded")
        log.info("reloaded", acl="open" if acl.open else "enforced")

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
        self.status.ready = False
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


async def run_daemon(
    cfg: Config,
    sock: socket.socket | None = None,
    *,
    reloader: Callable[[], Config] | None = None,
    daemon: Daemon | None = None,
    on_up: Callable[[], None] | None = None,
) -> int:
    """The one way to run the daemon (``rasd serve`` and ``rasd dev``): SIGTERM/SIGINT stop
    it (draining), SIGHUP reloads the config (``reloader``; without one the running config
    is kept and the reload is still acknowledged to systemd). ``on_up`` runs once the store
    is up (``rasd dev`` prints its banner then). Returns the exit status (2: start refused,
    an AWS setting rasd cannot honour or a socket another live process serves on)."""
    d = daemon or Daemon(cfg, reloader=reloader or (lambda: d.cfg))
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(loop_exception)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, d.stop)
    loop.add_signal_handler(signal.SIGHUP, d.reload)
    loop.add_signal_handler(signal.SIGUSR2, d.hand_over)
    if on_up is not None:

        async def _when_up() -> None:
            await d.up.wait()
            on_up()

        waiter = loop.create_task(_when_up())
    try:
        await d.run(sock)
    finally:
        if on_up is not None:
            waiter.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
            loop.remove_signal_handler(sig)
    return d.exit_status

"""The daemon: a Unix-socket server speaking msgpack frames, with a readable lifecycle.

    listen()    -> accept on the socket (our own, or systemd's via LISTEN_FDS) at once, before
                   the heavy imports (aioboto3 is ~1 s) and DynamoDB warm-up; READY=1 and the
                   watchdog start here, so socket activation answers its first call quickly
    bring_up()  -> import the store, open and warm the DynamoDB pool, load pool definitions,
                   prefetch first candidates (bounded). Requests that arrive meanwhile wait for
                   it within their own deadline. If DynamoDB cannot be reached the daemon does
                   not exit: it runs *degraded* (UNAVAILABLE at once, STATUS= says why, one
                   structured log line per try naming the endpoint and the cause) and retries
                   with backoff (``startup_retry_initial`` .. ``startup_retry_max``)
    startup()   -> listen() + one bring_up() attempt that raises on failure (tests, embedding)
    run()       -> listen() + bring_up() retrying in the background + main loop + shutdown()
    main_loop() -> serve until stop() (SIGTERM/SIGINT); reload() on SIGHUP
    shutdown()  -> STOPPING=1, stop accepting, drain in-flight requests within a bound, close

Admission, in order, for every request: the caller's Unix credentials (SO_PEERCRED, checked
once per connection) against the ACL -> FORBIDDEN; a cache hit is answered at once; anything
that needs DynamoDB must get a slot in the in-flight gate before its deadline or it is shed
with BUSY at once, never queued (the RTB bidder seed).

Each connection is an ``asyncio.Protocol``: frames are decoded as bytes arrive; a cache hit is
answered inside ``data_received`` without creating a task; anything else runs as a task that
writes its response (with the request's ``id``) when done, so one connection may carry many
requests at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from rasd_client.wire import (
    _HEADER,
    HEADER_SIZE,
    VERSION,
    BadFrame,
    FrameDecoder,
    FrameTooLarge,
    encode,
    error_payload,
)
from rasd_client.wire import _decode_body as decode_body

from . import log as logsetup
from . import protocol
from .aws import AwsSettingsError
from .cache import ID_MAX
from .clock import Clock
from .config import Config
from .errors import Busy, Forbidden, Internal, RasdError, Timeout, Unavailable
from .limits import InflightGate
from .metrics import Counters
from .peercred import Acl, Grant, peer_credentials, peer_gids
from .prom import LatencyHistograms
from .sdnotify import Notifier, run_watchdog, watchdog_interval

if TYPE_CHECKING:  # imported at run time by bring_up(), after the socket already serves
    from .acquire import Acquirer
    from .store import Store

log = structlog.get_logger("rasd.server")


_NOBODY = Grant(False, frozenset())
#: one cached hit in HIT_SAMPLE is timed for the latency histogram (a power of two)
HIT_SAMPLE = 16
HIT_SAMPLE_MASK = HIT_SAMPLE - 1
#: Connections the kernel queues for the daemon to accept, the same as systemd/rasd.socket's
#: Backlog=: a burst of connects (every worker of a pre-fork web server at start-up) waits
#: in it instead of failing with EAGAIN, whether the daemon bound the socket itself
#: (``rasd serve --socket``) or inherited it. The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096


class Connection(asyncio.Protocol):
    __slots__ = (
        "batch",
        "closed",
        "daemon",
        "decoder",
        "draining",
        "grant",
        "pending",
        "transport",
    )

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.decoder = FrameDecoder()
        self.pending = 0
        self.closed = False
        #: Shutdown began: read nothing more; close once every request read is answered.
        self.draining = False
        self.transport: asyncio.Transport | None = None
        self.grant = _NOBODY
        #: answers held while one data_received handles several frames (one write for all)
        self.batch: list[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.daemon.connections.add(self)
        self.daemon.counters.inc("conn.opened")
        self.grant = self.daemon.grant_for(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.daemon.connections.discard(self)

    def pause_writing(self) -> None:
        # The peer is not reading its answers (its socket and our write buffer are full):
        # stop reading its requests until it catches up, so a stuck or hostile client cannot
        # make the daemon buffer answers without bound.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed and not self.draining:
            self.transport.resume_reading()

    def quiesce(self) -> None:
        """Shutdown: read no more requests; close now if none is waiting for its answer, else
        once the last one is answered (:meth:`Daemon._slow`). Never read-and-dropped: what the
        peer sends from now on stays unread, and the close makes its client see the connection
        closed before any reply, which it retries on a new connection, answered by the next
        process from the listening socket's backlog (docs/protocol.md, "Restarts")."""
        self.draining = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        if self.pending == 0:
            self.close()

    def data_received(self, data: bytes) -> None:
        daemon = self.daemon
        n = len(data)
        if n > HEADER_SIZE and not self.decoder.buffered:
            # The usual case: exactly one whole frame, nothing buffered. Decoded in place,
            # without copying it through the decoder's buffer.
            (length,) = _HEADER.unpack_from(data, 0)
            if length == n - HEADER_SIZE and length <= self.decoder.max_frame:
                frame = decode_body(memoryview(data)[HEADER_SIZE:])  # type: ignore[arg-type]
                out = daemon.hit(self, frame)
                if out is None:
                    daemon.dispatch(self, frame)
                elif not self.closed:
                    self.transport.write(out)  # type: ignore[union-attr]
                return
        self.decoder.feed(data)
        # Several frames at once (a pipelining client): their immediate answers go out in one
        # write at the end; answers of requests that wait for DynamoDB are written when done.
        batch: list[bytes] = []
        self.batch = batch
        too_large: FrameTooLarge | None = None
        try:
            for frame in self.decoder.frames():
                out = daemon.hit(self, frame)
                if out is None:
                    daemon.dispatch(self, frame)
                else:
                    batch.append(out)
        except FrameTooLarge as exc:
            too_large = exc
            daemon.counters.inc("req.bad_frame")
            batch.append(encode(error_payload(None, "BAD_REQUEST", str(exc))))
        finally:
            self.batch = None
            if batch and not self.closed and self.transport is not None:
                self.transport.write(batch[0] if len(batch) == 1 else b"".join(batch))
        if too_large is not None:
            self.close()
        if self.draining and self.pending == 0:
            self.close()

    def send(self, payload: dict[str, Any]) -> None:
        if self.batch is not None:
            self.batch.append(encode(payload))
        elif not self.closed and self.transport is not None:
            self.transport.write(encode(payload))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Daemon:
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
        self.acl = Acl.from_config(cfg.acl)
        self.gate = InflightGate(cfg.max_inflight)
        self.latency = LatencyHistograms()
        self.notifier = Notifier()
        self.clock = clock or Clock()
        #: the monotonic clock of the request path (Clock.mono without a method call)
        self._mono: Callable[[], float] = (
            time.monotonic if type(self.clock) is Clock else self.clock.mono
        )
        self.counters = counters or (store.counters if store else Counters())
        #: Given by tests (a FaultyStore); else made by bring_up() after the heavy import.
        self._given_store = store
        # Both exist once the store is up (self.up is set); nothing reads them before.
        self.store: Store
        self.acquirer: Acquirer
        #: Set once DynamoDB answered and the pools are loaded; requests wait on it.
        self.up = asyncio.Event()
        #: Why the daemon is degraded (DynamoDB unreachable at start), or None.
        self.degraded: str | None = None
        #: The process's exit status: 2 when an AWS setting cannot be honoured (start refused).
        self.exit_status = 0
        #: The DynamoDB endpoint botocore resolved, once a start-up attempt resolved it.
        self._endpoint: str | None = None
        self._bring_up_task: asyncio.Task[None] | None = None
        self.connections: set[Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.inflight: set[asyncio.Task[None]] = set()
        self.started = time.time()
        self.ready = False
        self._stop = asyncio.Event()
        self._bound_path: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._metrics: Any = None
        self._socket_name = cfg.socket
        self._watchdog_started = False
        #: The inherited listening socket (fd 3 under socket activation), for a hand-over.
        self._listen_sock: socket.socket | None = None
        self._successor: Any = None  # subprocess.Popen of a hand-over's successor
        self._handed_over = False

    # ------------------------------------------------------------------ lifecycle
    async def listen(self, sock: socket.socket | None = None) -> None:
        """Accept on the socket now; READY=1 and the watchdog. Nothing heavy happens here."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            self._listen_sock = sock
            # asyncio and uvloop call listen() on a socket they are given, inherited ones too:
            # without the backlog they would cut systemd's Backlog= down to their default 100.
            self.server = await loop.create_unix_server(
                lambda: Connection(self), sock=sock, backlog=LISTEN_BACKLOG
            )
        else:
            path = self.cfg.socket
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            if os.path.exists(path):
                os.unlink(path)  # a stale socket from a crash
            self.server = await loop.create_unix_server(
                lambda: Connection(self), path=path, backlog=LISTEN_BACKLOG
            )
            os.chmod(path, self.cfg.socket_mode)
            self._bound_path = path
        self._socket_name = self.cfg.socket if sock is None else "inherited"
        if self.cfg.metrics_port:
            self._metrics = self._start_metrics(self.cfg.metrics_port)
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

    async def _bring_up_once(self) -> int:
        """Import the store (in a thread: the loop keeps accepting), warm DynamoDB, load pools."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.startup_deadline
        acquire_mod = await asyncio.to_thread(importlib.import_module, ".acquire", __package__)
        store_mod = importlib.import_module(".store", __package__)
        store = self._given_store or store_mod.Store(cfg, self.counters)
        try:
            await store.start()
            if store.aws is not None:
                self._endpoint = store.aws.endpoint_url
            await store.warm(cfg.startup_deadline)
            acquirer = acquire_mod.Acquirer(cfg, store, self.clock, self.counters)
            n: int = await acquirer.load_pools(deadline)
        except BaseException:
            if store is not self._given_store:
                await _close_quietly(store)
            raise
        await acquirer.prefetch.warm(list(acquirer.pools.values()), timeout=cfg.prefetch_warm)
        self.store, self.acquirer = store, acquirer
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._refresh_pools()))
        self._tasks.append(loop.create_task(acquirer.report_misses_forever()))
        self.ready = True
        self.degraded = None
        self.up.set()
        self._announce(f"serving {n} pools in {cfg.region}")
        log.info(
            "ready",
            socket=self._socket_name,
            region=cfg.region,
            table=cfg.table,
            pools=n,
            endpoint=self.endpoint(),
            aws=store.aws.public() if store.aws is not None else None,
            acl="open" if self.acl.open else "enforced",
            metrics_port=self._metrics.port if self._metrics else None,
            startup_s=round(time.time() - self.started, 3),
        )
        return n

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
                self.degraded = str(exc)
                log.error("startup_refused", cause=str(exc))
                self.exit_status = 2
                self.stop()
                return
            except Exception as exc:  # noqa: BLE001 - every failure is retried; logged below
                cause = describe_cause(exc)
                if "circuit breaker" in cause or "no answer" in cause:
                    # The store's error hides the network's: ask the network directly.
                    cause = f"{cause}; {await probe_endpoint(self.endpoint())}"
                self.degraded = f"DynamoDB at {self.endpoint()} unreachable: {cause}"
                expected = isinstance(exc, RasdError | OSError | TimeoutError) or _is_boto(exc)
                log.error(
                    "startup_failed",
                    endpoint=self.endpoint(),
                    table=cfg.table,
                    cause=cause,
                    attempt=attempt,
                    retry_in_s=round(delay, 2),
                    **({} if expected else {"exc_info": exc}),
                )
                self.counters.inc("startup.failed")
                self._announce(f"degraded: {self.degraded}; retry {attempt} in {delay:.1f}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, cfg.startup_retry_max)

    async def startup(self, sock: socket.socket | None = None) -> None:
        """Listen, then bring the store up once; raises if that fails (tests, embedding)."""
        await self.listen(sock)
        await self._bring_up_once()

    async def wait_up(self, deadline: float) -> None:
        """For a request that arrived before the store was up: wait for it within the
        request's deadline; fail fast (UNAVAILABLE) when the daemon is degraded. If the
        deadline comes first the answer is UNAVAILABLE too (nothing was done: retry), sent a
        little before the deadline so that it reaches the caller in time."""
        if self.up.is_set():
            return
        if self.degraded is not None:
            raise Unavailable(f"{self.degraded}; retrying in the background")
        self.counters.inc("req.waited_for_startup")
        left = deadline - time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, left - min(0.05, left * 0.1))):
                await self.up.wait()
        except TimeoutError:
            if self.degraded is not None:
                raise Unavailable(f"{self.degraded}; retrying in the background") from None
            raise Unavailable(
                "daemon still starting (connecting to DynamoDB); retry shortly", retry_after=0.1
            ) from None

    def _start_metrics(self, port: int) -> Any:
        from . import __version__
        from .prom import Gauge, build_registry, start_http

        def cache_leases() -> int:
            return self.acquirer.cache.size() if self.up.is_set() else 0

        def prefetch() -> dict[str, int]:
            if not self.up.is_set():
                return {}
            bufs = self.acquirer.prefetch.buffers
            return {f"{c}/{p}": len(b) for (c, p), b in bufs.items()}

        registry = build_registry(
            self.counters,
            self.latency,
            {
                "cache_leases": Gauge("Leases in the daemon's cache", cache_leases),
                "prefetch_candidates": Gauge("Prefetched claim candidates per pool", prefetch),
                "up": Gauge(
                    "1 once DynamoDB answered and pools are loaded, 0 while starting or degraded",
                    lambda: int(self.up.is_set()),
                ),
                "inflight": Gauge("Requests doing DynamoDB work", lambda: self.gate.inflight),
            },
            version=__version__,
        )
        return start_http(port, registry=registry)

    def grant_for(self, transport: asyncio.BaseTransport) -> Grant:
        """What the peer may use, from its kernel-reported uid and groups (SO_PEERCRED)."""
        acl = self.acl
        if acl.open:
            return acl.grant(0, ())
        sock = transport.get_extra_info("socket")
        try:
            cred = peer_credentials(sock)
            return acl.grant(cred.uid, peer_gids(sock, cred))
        except OSError as exc:
            log.warning("peer_credentials_failed", error=str(exc))
            return _NOBODY

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
        from .limits import BucketTable

        self.acl = acl
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.grant = self.grant_for(conn.transport)
        self.gate.limit = new.max_inflight
        if self.up.is_set():
            self.acquirer.buckets = BucketTable(new.rate_limit, new.rate_burst)
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

    async def main_loop(self) -> None:
        await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

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
        self.ready = False
        if not self._handed_over:  # after a hand-over the successor is the main process
            self.notifier.stopping(status="draining")
        log.info(
            "stopping",
            inflight=len(self.inflight),
            connections=len(self.connections),
            drain_s=drain,
            handed_over=self._handed_over,
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
            await self.acquirer.drain(timeout=drain)
            try:
                await self.acquirer.flush_misses(time.monotonic() + self.cfg.flush_misses_timeout)
            except RasdError:
                pass
            await self.store.close()
        if self._bound_path and os.path.exists(self._bound_path):
            os.unlink(self._bound_path)
        self.notifier.close()
        log.info("stopped")

    # -------------------------------------------------------------------- hand-over
    def hand_over(self) -> None:
        """SIGUSR2: start a successor on the same listening socket and stop once it serves.

        ``systemctl restart`` is stop-then-start: callers queued meanwhile wait for the new
        process's start-up (Python, imports, DynamoDB warm-up), longer than a 1 s timeout on
        a busy host. A hand-over overlaps instead: the successor (the same command line, so
        the code now on disk: an upgrade) gets the socket as fd 3 (LISTEN_FDS) and a pipe;
        it brings its store up *before* it accepts (silent to systemd meanwhile: with
        ``NotifyAccess=main`` it may not speak yet), then accepts alongside us and writes to
        the pipe. We then tell systemd the successor is the main process (``MAINPID=``, which
        the main process may send) and shut down as on SIGTERM, minus STOPPING=1. If the
        successor dies (or closes the pipe) first, we keep serving and log
        ``handover_failed``.
        """
        if self._successor is not None or self._stop.is_set():
            log.warning("handover_ignored", reason="a hand-over or a stop is under way")
            return
        sock = self._listen_sock
        if sock is None or sock.fileno() != 3:
            log.warning("handover_ignored", reason="not socket-activated (no inherited fd 3)")
            return
        import subprocess
        import sys

        rfd, wfd = os.pipe()
        env = dict(os.environ)
        env.update(LISTEN_FDS="1", LISTEN_FDNAMES="rasd", RASD_HANDOVER_FD=str(wfd))
        argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
        try:
            # sh sets LISTEN_PID/WATCHDOG_PID to its own pid, which exec keeps.
            self._successor = subprocess.Popen(
                ["/bin/sh", "-c", 'LISTEN_PID=$$ WATCHDOG_PID=$$ exec "$@"', "rasd", *argv],
                env=env,
                pass_fds=(3, wfd),
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            os.close(rfd)
            log.error("handover_failed", cause=f"cannot start the successor: {exc}")
            return
        finally:
            os.close(wfd)
        log.info("handover_started", successor=self._successor.pid)
        loop = asyncio.get_running_loop()

        def readable() -> None:
            try:
                data = os.read(rfd, 64)
            except OSError:
                data = b""
            loop.remove_reader(rfd)
            os.close(rfd)
            successor = self._successor
            if data and successor is not None:
                # WATCHDOG=1 too: the successor's next ping is at most one interval away.
                self.notifier.notify(
                    f"MAINPID={successor.pid}",
                    "READY=1",
                    "WATCHDOG=1",
                    f"STATUS=serving (took over from pid {os.getpid()})",
                )
                log.info("handed_over", successor=successor.pid)
                self._handed_over = True
                self.stop()
            else:
                code = successor.poll() if successor is not None else None
                log.error("handover_failed", cause="the successor exited before serving", code=code)
                self._successor = None

        loop.add_reader(rfd, readable)

    async def _take_over(self, sock: socket.socket, fd: int) -> None:
        """The successor's side of a hand-over, once the store is up: accept, then tell the
        predecessor, which makes us the main process and stops."""
        await self.listen(sock)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
        log.info("took_over", predecessor=os.getppid())

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
            try:
                async with asyncio.timeout(self.cfg.startup_deadline):
                    await self._bring_up_once()
            except Exception as exc:  # noqa: BLE001 - any failure: the predecessor serves on
                log.error("handover_failed", cause=describe_cause(exc), side="successor")
                raise SystemExit(1) from None
            await self._take_over(sock, int(handover_fd))
            self.notifier.address = address
        else:
            await self.listen(sock)
            self._bring_up_task = asyncio.get_running_loop().create_task(self.bring_up())
        try:
            await self.main_loop()
        finally:
            await self.shutdown(self.cfg.drain_timeout)

    async def _refresh_pools(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.pool_refresh)
            try:
                await self.acquirer.load_pools(time.monotonic() + self.cfg.pool_refresh_timeout)
            except RasdError as exc:
                log.warning("pool_refresh_failed", error=str(exc))

    # ------------------------------------------------------------------- requests
    def hit(self, conn: Connection, frame: dict[str, Any] | BadFrame) -> bytes | None:
        """The fast path: a well-formed get_lease the cache answers, as its answer frame; None
        for anything else, which the caller passes to :meth:`dispatch` (the full path, which
        alone answers errors). It decides nothing dispatch would decide otherwise: exact
        types as parse() checks them (True and 1.0 equal 1 in Python, not on the wire), the
        ACL, the pool's lease-end rule, the cache. The names' lengths are not checked: the
        cache holds only names parse() accepts (cache.py), so names that find an entry pass.
        One clock reading; nothing allocated but the answer when no background work is due."""
        if type(frame) is not dict or not self.up.is_set():
            return None
        get = frame.get
        if get("op") != "get_lease":
            return None
        v = get("v")
        rid = get("id")
        c = get("client_id")
        p = get("pool_id")
        k = get("key")
        e = get("lease_expires_us")
        d = get("deadline_ms")
        if not (
            type(v) is int
            and v == VERSION
            and type(rid) is int
            and 0 <= rid <= ID_MAX
            and type(c) is str
            and type(p) is str
            and type(k) is str
            and type(e) is int
            and (d is None or (type(d) is int and 0 < d <= protocol.MAX_DEADLINE_MS))
        ):
            return None
        grant = conn.grant
        if not grant.all and c not in grant.client_ids:
            return None
        now = self._mono()  # the request's one clock reading
        out = self.acquirer.hit_answer(c, p, k, e, now, rid)
        if out is not None:
            counters = self.counters
            counters.hits += 1
            if not counters.hits & HIT_SAMPLE_MASK:
                # one hit in HIT_SAMPLE is timed (a second clock reading): its latency
                # stands for the others in rasd_request_duration_seconds{path="hit"}
                self.latency.observe("hit", self._mono() - now)
        return out

    def dispatch(self, conn: Connection, frame: dict[str, Any] | BadFrame) -> None:
        counters = self.counters
        counters.inc("req.total")
        if isinstance(frame, BadFrame):
            counters.inc("req.bad_frame")
            conn.send(error_payload(None, "BAD_REQUEST", frame.reason))
            return
        try:
            req = protocol.parse(frame)
        except RasdError as exc:
            counters.inc("req.bad_request")
            conn.send(error_payload(protocol.request_id(frame), exc.code, exc.message))
            return
        if req.client_id and not conn.grant.allows(req.client_id):
            self._send_error(
                conn, req, Forbidden(f"this process may not use client_id {req.client_id!r}")
            )
            return
        now = self._mono()  # the request's one clock reading, passed down
        if req.op == "get_lease" and self.up.is_set():
            try:
                lease = self.acquirer.try_hit(
                    req.client_id, req.pool_id, req.key, req.lease_expires_us, now
                )
            except RasdError as exc:
                self._send_error(conn, req, exc)
                return
            if lease is not None:
                conn.send(protocol.lease_response(req.id, lease, False))
                counters.inc("cache.hit")
                return
            counters.inc("cache.miss")
        elif req.op == "get_lease" and self.degraded is not None:
            self._send_error(conn, req, Unavailable(f"{self.degraded}; retrying"))
            return
        elif req.op == "ping":
            conn.send(protocol.ok(req.id, ready=self.ready, region=self.cfg.region))
            return
        elif req.op == "stats":
            conn.send(protocol.ok(req.id, **self.stats()))
            return
        budget = (req.deadline_ms / 1000) if req.deadline_ms else self.cfg.default_deadline
        if self._mono is not time.monotonic:
            now = time.monotonic()  # a test's FakeClock: deadlines run on the real clock
        if conn.pending >= self.cfg.max_pending_per_conn:
            counters.inc("shed.conn_pending")
            self._send_error(conn, req, Busy("too many requests in flight on this connection"))
            return
        if not self.gate.try_enter(now + budget, now):
            counters.inc("shed.busy")
            self._send_error(conn, req, Busy("daemon at capacity; retry shortly", retry_after=0.01))
            return
        conn.pending += 1
        task = asyncio.get_running_loop().create_task(self._slow(conn, req, now, budget))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    async def _slow(
        self, conn: Connection, req: protocol.Request, t0: float, budget: float
    ) -> None:
        deadline = t0 + budget
        served_from = t0
        try:
            # The store enforces the deadline on DynamoDB calls; this outer bound (a little
            # later) catches everything else.
            async with asyncio.timeout(budget + 0.05):
                if not self.up.is_set():
                    await self.wait_up(deadline)
                    # Time spent waiting for start-up is not service time: counting it would
                    # make the gate shed every request right after a restart.
                    served_from = time.monotonic()
                acq = self.acquirer
                if req.op == "get_lease":
                    lease, new = await acq.get_lease(
                        req.client_id, req.pool_id, req.key, req.lease_expires_us, deadline
                    )
                    resp = protocol.lease_response(req.id, lease, new)
                    self.latency.observe("new" if new else "existing", time.monotonic() - t0)
                elif req.op == "release":
                    n = await acq.release(req.client_id, req.pool_id, req.key, deadline)
                    resp = protocol.ok(req.id, released=n)
                elif req.op == "headroom":
                    h = await acq.headroom(req.client_id, req.pool_id, deadline)
                    resp = protocol.ok(req.id, headroom=h)
                else:  # pragma: no cover - parse() admits only known ops
                    raise Internal(f"op {req.op} has no handler")
            conn.send(resp)
        except TimeoutError:
            self._send_error(conn, req, Timeout(f"deadline of {budget * 1000:.0f} ms passed"))
        except RasdError as exc:
            self._send_error(conn, req, exc)
        except Exception as exc:
            self.counters.inc("req.internal")
            log.exception("internal_error", op=req.op, error=repr(exc))
            self._send_error(conn, req, Internal(f"{type(exc).__name__}: {exc}"))
        finally:
            conn.pending -= 1
            self.gate.leave(time.monotonic() - served_from)
            if conn.draining and conn.pending == 0:
                conn.close()

    def _send_error(self, conn: Connection, req: protocol.Request, exc: RasdError) -> None:
        self.counters.inc(f"err.{exc.code}")
        conn.send(error_payload(req.id, exc.code, exc.message, exc.retry_after))

    def stats(self) -> dict[str, Any]:
        up = self.up.is_set()
        acq = self.acquirer if up else None
        return {
            "ready": self.ready,
            "degraded": self.degraded,
            "region": self.cfg.region,
            "uptime_s": round(time.time() - self.started, 3),
            "pid": os.getpid(),
            "cache_leases": len(acq.cache) if acq else 0,
            "pools": len(acq.pools) if acq else 0,
            "prefetch_depth": acq.prefetch.depth() if acq else 0,
            "connections": len(self.connections),
            "inflight": len(self.inflight),
            "breaker": self.store.breaker.state if up else "starting",
            "retry_quota": self.store.retry.quota.available if up else None,
            "latency": self.latency.snapshot(),
            "counters": self.counters.snapshot(),
        }


# ------------------------------------------------------------------------ start-up failures
def _is_boto(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp")


def describe_cause(exc: BaseException) -> str:
    """One line for the root cause of a start-up failure: the innermost exception of the
    chain (``Unavailable: circuit breaker open`` says nothing; the connect error under it
    does), with the outer message when it adds something."""
    chain = [exc]
    seen = {id(exc)}
    cur: BaseException | None = exc
    while cur is not None:
        cur = cur.__cause__ or cur.__context__
        if cur is None or id(cur) in seen:
            break
        seen.add(id(cur))
        chain.append(cur)
    # A cancelled or bare timeout at the bottom says nothing: take the deepest link that does.
    informative = [e for e in chain if not isinstance(e, asyncio.CancelledError) and str(e)]
    root = informative[-1] if informative else chain[-1]
    text = f"{type(root).__name__}: {root}".strip().rstrip(":")
    if root is not exc:
        text = f"{text} ({type(exc).__name__}: {exc})"
    return " ".join(text.split())[:500]


async def probe_endpoint(url: str, timeout: float = 1.0) -> str:
    """What a plain TCP connect to the endpoint says (refused, DNS failure, timeout, ok)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout):
            _reader, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"TCP connect to {host}:{port}: no answer within {timeout:.1f}s"
    except OSError as exc:
        return f"TCP connect to {host}:{port}: {type(exc).__name__}: {exc.strerror or exc}"
    writer.close()
    return f"TCP connect to {host}:{port} works (DynamoDB itself is failing)"


async def _close_quietly(store: Any) -> None:
    """Close a store whose start failed, so aiohttp reports no "Unclosed client session"."""
    try:
        await store.close()
    except Exception as exc:  # noqa: BLE001 - best effort on a failure path
        log.debug("store_close_failed", error=repr(exc))


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Unhandled errors on the loop as one structured line (not asyncio's multi-line dump).
    aiohttp's "Unclosed client session/connector" notices come from the garbage collector
    after a failed start-up attempt was already closed and logged: debug level only."""
    message = str(context.get("message", "unhandled error on the event loop"))
    exc = context.get("exception")
    if message.startswith(("Unclosed client session", "Unclosed connector")):
        log.debug("aiohttp_unclosed", message=message)
        return
    log.error(
        "loop_error",
        message=message,
        error=describe_cause(exc) if isinstance(exc, BaseException) else None,
        **({"exc_info": exc} if isinstance(exc, BaseException) else {}),
    )


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
    an AWS setting rasd cannot honour)."""
    d = daemon or Daemon(cfg, reloader=reloader or (lambda: d.cfg))
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_loop_exception)
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

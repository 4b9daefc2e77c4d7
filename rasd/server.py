"""The daemon: a Unix-socket server speaking msgpack frames, with a readable lifecycle.

    startup()   -> open and warm the DynamoDB pool, load pool definitions, prefetch their
                   first candidates (bounded), listen (our own
                   socket, or systemd's via LISTEN_FDS), then READY=1 and the watchdog
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
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import structlog

from rasd_client.wire import BadFrame, FrameDecoder, FrameTooLarge, encode, error_payload

from . import log as logsetup
from . import protocol
from .acquire import Acquirer
from .clock import Clock
from .config import Config
from .errors import Busy, Forbidden, Internal, RasdError, Timeout
from .limits import InflightGate
from .metrics import Counters
from .peercred import Acl, Grant, peer_credentials, peer_gids
from .prom import LatencyHistograms
from .sdnotify import Notifier, run_watchdog, watchdog_interval
from .store import Store

log = structlog.get_logger("rasd.server")

MAX_PENDING_PER_CONN = 256
STARTUP_DEADLINE = 30.0


_NOBODY = Grant(False, frozenset())


class Connection(asyncio.Protocol):
    __slots__ = ("closed", "daemon", "decoder", "grant", "pending", "transport")

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.decoder = FrameDecoder()
        self.pending = 0
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self.grant = _NOBODY

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
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        try:
            for frame in self.decoder.frames():
                self.daemon.dispatch(self, frame)
        except FrameTooLarge as exc:
            self.daemon.counters.inc("req.bad_frame")
            self.send(error_payload(None, "BAD_REQUEST", str(exc)))
            self.close()

    def send(self, payload: dict[str, Any]) -> None:
        if not self.closed and self.transport is not None:
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
        self.counters = counters or (store.counters if store else Counters())
        self.store = store or Store(cfg, self.counters)
        self.acquirer = Acquirer(cfg, self.store, self.clock, self.counters)
        self.connections: set[Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.inflight: set[asyncio.Task[None]] = set()
        self.started = time.time()
        self.ready = False
        self._stop = asyncio.Event()
        self._bound_path: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._metrics: Any = None

    # ------------------------------------------------------------------ lifecycle
    async def startup(self, sock: socket.socket | None = None) -> None:
        """Warm DynamoDB, load pools, then listen. Ready only once all of that worked."""
        deadline = time.monotonic() + STARTUP_DEADLINE
        await self.store.start()
        await self.store.warm()
        n = await self.acquirer.load_pools(deadline)
        await self.acquirer.prefetch.warm(list(self.acquirer.pools.values()), timeout=2.0)
        loop = asyncio.get_running_loop()
        if sock is not None:
            self.server = await loop.create_unix_server(lambda: Connection(self), sock=sock)
        else:
            path = self.cfg.socket
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            if os.path.exists(path):
                os.unlink(path)  # a stale socket from a crash
            self.server = await loop.create_unix_server(lambda: Connection(self), path=path)
            os.chmod(path, self.cfg.socket_mode)
            self._bound_path = path
        if self.cfg.metrics_port:
            self._metrics = self._start_metrics(self.cfg.metrics_port)
        self._tasks.append(loop.create_task(self._refresh_pools()))
        self._tasks.append(loop.create_task(self.acquirer.report_misses_forever()))
        interval = watchdog_interval()
        if interval:
            self._tasks.append(loop.create_task(run_watchdog(self.notifier, interval)))
        self.ready = True
        self.notifier.ready(status=f"serving {n} pools in {self.cfg.region}")
        log.info(
            "ready",
            socket=self.cfg.socket if sock is None else "inherited",
            region=self.cfg.region,
            table=self.cfg.table,
            pools=n,
            acl="open" if self.acl.open else "enforced",
            metrics_port=self._metrics.port if self._metrics else None,
        )

    def _start_metrics(self, port: int) -> Any:
        from . import __version__
        from .prom import Gauge, build_registry, start_http

        acq = self.acquirer
        registry = build_registry(
            self.counters,
            self.latency,
            {
                "cache_leases": Gauge("Leases in the daemon's cache", lambda: len(acq.cache._c)),
                "prefetch_candidates": Gauge(
                    "Prefetched claim candidates per pool",
                    lambda: {f"{c}/{p}": len(b) for (c, p), b in acq.prefetch.buffers.items()},
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
            return acl.grant(0, ())  # type: ignore[no-any-return]
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
        """Stop accepting, let in-flight requests finish (bounded), then close."""
        self.ready = False
        self.notifier.stopping(status="draining")
        log.info("stopping", inflight=len(self.inflight), drain_s=drain)
        if self.server is not None:
            self.server.close()
        for t in self._tasks:
            t.cancel()
        if self._metrics is not None:
            self._metrics.close()
        if self.inflight:
            await asyncio.wait(set(self.inflight), timeout=drain)
        for t in set(self.inflight):
            t.cancel()
        await self.acquirer.drain(timeout=drain)
        for conn in list(self.connections):
            conn.close()
        try:
            await self.acquirer.flush_misses(time.monotonic() + 1.0)
        except RasdError:
            pass
        await self.store.close()
        if self._bound_path and os.path.exists(self._bound_path):
            os.unlink(self._bound_path)
        self.notifier.close()
        log.info("stopped")

    async def run(self, sock: socket.socket | None = None) -> None:
        await self.startup(sock)
        try:
            await self.main_loop()
        finally:
            await self.shutdown(self.cfg.drain_timeout)

    async def _refresh_pools(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.pool_refresh)
            try:
                await self.acquirer.load_pools(time.monotonic() + 5.0)
            except RasdError as exc:
                log.warning("pool_refresh_failed", error=str(exc))

    # ------------------------------------------------------------------- requests
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
        if req.op == "get_lease":
            t0 = time.perf_counter()
            try:
                lease = self.acquirer.try_hit(
                    req.client_id, req.pool_id, req.key, req.lease_expires_us
                )
            except RasdError as exc:
                self._send_error(conn, req, exc)
                return
            if lease is not None:
                conn.send(protocol.lease_response(req.id, lease, False))
                counters.inc("cache.hit")
                self.latency.observe("hit", time.perf_counter() - t0)
                return
            counters.inc("cache.miss")
        elif req.op == "ping":
            conn.send(protocol.ok(req.id, ready=self.ready, region=self.cfg.region))
            return
        elif req.op == "stats":
            conn.send(protocol.ok(req.id, **self.stats()))
            return
        budget = (req.deadline_ms / 1000) if req.deadline_ms else self.cfg.default_deadline
        now = time.monotonic()
        if conn.pending >= MAX_PENDING_PER_CONN:
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
        acq = self.acquirer
        try:
            # The store enforces the deadline on DynamoDB calls; this outer bound (a little
            # later) catches everything else.
            async with asyncio.timeout(budget + 0.05):
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
            self.gate.leave(time.monotonic() - t0)

    def _send_error(self, conn: Connection, req: protocol.Request, exc: RasdError) -> None:
        self.counters.inc(f"err.{exc.code}")
        conn.send(error_payload(req.id, exc.code, exc.message, exc.retry_after))

    def stats(self) -> dict[str, Any]:
        acq = self.acquirer
        return {
            "ready": self.ready,
            "region": self.cfg.region,
            "uptime_s": round(time.time() - self.started, 3),
            "pid": os.getpid(),
            "cache_leases": len(acq.cache),
            "pools": len(acq.pools),
            "prefetch_depth": acq.prefetch.depth(),
            "connections": len(self.connections),
            "inflight": len(self.inflight),
            "breaker": self.store.breaker.state,
            "latency": self.latency.snapshot(),
            "counters": self.counters.snapshot(),
        }

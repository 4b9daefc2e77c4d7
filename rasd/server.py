"""The daemon: a Unix-socket server speaking msgpack frames, with a readable lifecycle.

    startup()   -> open and warm the DynamoDB pool, load pool definitions, bind the socket
    main_loop() -> serve until stop() (SIGTERM/SIGINT)
    shutdown()  -> stop accepting, drain in-flight requests within a bound, close everything

Each connection is an ``asyncio.Protocol``: frames are decoded as bytes arrive; a cache hit is
answered inside ``data_received`` without creating a task; anything else runs as a task that
writes its response (with the request's ``id``) when done, so one connection may carry many
requests at once.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import structlog
from rasd_client._wire import BadFrame, FrameDecoder, FrameTooLarge, encode, error_payload

from . import protocol
from .acquire import Acquirer
from .clock import Clock
from .config import Config
from .errors import Internal, RasdError, Timeout
from .metrics import Counters
from .store import Store

log = structlog.get_logger("rasd.server")

MAX_PENDING_PER_CONN = 256
STARTUP_DEADLINE = 30.0


class Connection(asyncio.Protocol):
    __slots__ = ("closed", "daemon", "decoder", "pending", "transport")

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.decoder = FrameDecoder()
        self.pending = 0
        self.closed = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.daemon.connections.add(self)
        self.daemon.counters.inc("conn.opened")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.daemon.connections.discard(self)

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
    ) -> None:
        self.cfg = cfg
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

    # ------------------------------------------------------------------ lifecycle
    async def startup(self, sock: socket.socket | None = None) -> None:
        """Warm DynamoDB, load pools, then listen. Ready only once all of that worked."""
        deadline = time.monotonic() + STARTUP_DEADLINE
        await self.store.start()
        await self.store.warm()
        n = await self.acquirer.load_pools(deadline)
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
        self.ready = True
        self._refresher = loop.create_task(self._refresh_pools())
        log.info(
            "ready",
            socket=self.cfg.socket if sock is None else "inherited",
            region=self.cfg.region,
            table=self.cfg.table,
            pools=n,
        )

    async def main_loop(self) -> None:
        await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()

    async def shutdown(self, drain: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then close."""
        self.ready = False
        log.info("stopping", inflight=len(self.inflight), drain_s=drain)
        if self.server is not None:
            self.server.close()
        if getattr(self, "_refresher", None):
            self._refresher.cancel()
        if self.inflight:
            await asyncio.wait(set(self.inflight), timeout=drain)
        for t in set(self.inflight):
            t.cancel()
        await self.acquirer.drain(timeout=drain)
        for conn in list(self.connections):
            conn.close()
        await self.store.close()
        if self._bound_path and os.path.exists(self._bound_path):
            os.unlink(self._bound_path)
        log.info("stopped")

    async def run(self, sock: socket.socket | None = None) -> None:
        await self.startup(sock)
        try:
            await self.main_loop()
        finally:
            await self.shutdown()

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
        if req.op == "get_lease":
            try:
                lease = self.acquirer.try_hit(
                    req.client_id, req.pool_id, req.key, req.lease_expires_us
                )
            except RasdError as exc:
                self._send_error(conn, req, exc)
                return
            if lease is not None:
                conn.send(protocol.lease_response(req.id, lease, False))
                return
        elif req.op == "ping":
            conn.send(protocol.ok(req.id, ready=self.ready, region=self.cfg.region))
            return
        elif req.op == "stats":
            conn.send(protocol.ok(req.id, **self.stats()))
            return
        if conn.pending >= MAX_PENDING_PER_CONN:
            counters.inc("shed.conn_pending")
            conn.send(
                error_payload(req.id, "BUSY", "too many requests in flight on this connection")
            )
            return
        conn.pending += 1
        task = asyncio.get_running_loop().create_task(self._slow(conn, req))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    async def _slow(self, conn: Connection, req: protocol.Request) -> None:
        budget = (req.deadline_ms / 1000) if req.deadline_ms else self.cfg.default_deadline
        deadline = time.monotonic() + budget
        acq = self.acquirer
        try:
            async with asyncio.timeout(budget):
                if req.op == "get_lease":
                    lease, new = await acq.get_lease(
                        req.client_id, req.pool_id, req.key, req.lease_expires_us, deadline
                    )
                    resp = protocol.lease_response(req.id, lease, new)
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
            "counters": self.counters.snapshot(),
        }

"""Routing: what the daemon does with each request frame. :meth:`Router.handle` follows a
frame through once: the hit answered in the callback, a miss admitted (rate, in-flight gate)
to the acquirer in a task, the outage budget's spare answers, and every other op
(docs/design.md, "Inside get_lease"). ``Daemon`` makes the router, and hands it the store and
the roles once they exist, in one :class:`Serving` (:meth:`Router.serve`).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from rasd_client.wire import BadFrame, error_payload

from .. import wire
from ..config import Config
from ..core.errors import (
    BadRequest,
    Busy,
    Forbidden,
    Internal,
    RasdError,
    Timeout,
    Unavailable,
)
from ..core.lease import Lease
from ..dynamo.heard import HEARD
from ..limits import BucketTable, InflightGate
from ..observe.metrics import Counters
from ..observe.pools import PoolMetrics
from ..observe.prom import LatencyHistograms
from ..wire import LeaseFields, lease_fields
from . import hittable
from .connection import Connection, connection_limits, regrant, sweep
from .hittable import Answer
from .peercred import Acl
from .serving import Serving, Status

if TYPE_CHECKING:
    from .clockwatch import ClockGuard

log = structlog.get_logger("rasd.server")

#: one cached hit in HIT_SAMPLE is timed for the latency histogram (a power of two)
HIT_SAMPLE = 16
HIT_SAMPLE_MASK = HIT_SAMPLE - 1


#: of a request that may fall back on an outage window's entry: the seconds kept back from
#: the acquirer to answer from it, at most this share of the deadline
SPARE_RESERVE, SPARE_RESERVE_SHARE = 0.05, 0.2


def _not_up(c: str, p: str, k: str, e: int, now: float, rid: int) -> bytes | None:
    raise AssertionError("the cache was asked before the store was up")


class Router:
    """The request paths: :meth:`handle` (the hit, a miss, the rest), :meth:`_slow`; and the
    frame handler a connection serves (``connection.Server``: ``connections``, ``counters``,
    ``acl``, ``limits``, ``handle``)."""

    def __init__(
        self,
        cfg: Config,
        counters: Counters,
        *,
        acl: Acl,
        gate: InflightGate,
        latency: LatencyHistograms,
        pool_metrics: PoolMetrics,
        status: Status,
        up: asyncio.Event,
        connections: set[Connection],
        inflight: set[asyncio.Task[None]],
        mono: Callable[[], float],
        clock_guard: ClockGuard,
    ) -> None:
        self.cfg = cfg
        self.counters = counters
        #: the access list new connections are granted by (:meth:`regrant` changes it)
        self.acl = acl
        self.gate = gate
        #: each client_id's requests that reach DynamoDB (``call_rate_limit``; reload: a new one)
        self.calls: BucketTable[str] = BucketTable(cfg.call_rate_limit, cfg.call_rate_burst)
        self.latency = latency
        self.pool_metrics = pool_metrics
        self.status = status
        #: set once the store is up (after :meth:`serve`); requests wait on it
        self.up = up
        #: the open connections and the requests in flight: the daemon's, read and joined here
        self.connections = connections
        self.inflight = inflight
        #: what each caller may hold open (checked as a connection is made)
        self.limits = connection_limits(
            cfg.max_connections_per_process,
            cfg.max_connections_per_uid,
            cfg.max_connections,
            cfg.max_buffered_bytes,
        )
        #: the monotonic clock of the request path (``Clock.mono`` without a method call)
        self._mono = mono
        #: whether this host's clock is trusted (``why`` is None): no hit is served otherwise
        self.clock_guard = clock_guard
        #: what exists once the store is up (:meth:`serve`); nothing reads it before
        self.serving: Serving
        #: the hit: the cache's ``answer``, bound once (``serving.answer``, one read less)
        self.answer: Answer = _not_up

    def serve(self, serving: Serving) -> None:
        """The store is up: what the request paths serve with. Called once, before ``up``
        is set."""
        self.serving = serving
        self.answer = serving.answer

    def set_call_rate(self, rate: float, burst: float) -> None:
        """A new ``call_rate_limit`` (a reload): each client_id's bucket starts again, full."""
        self.calls = BucketTable(rate, burst)

    def regrant(self, acl: Acl) -> None:
        """A new access list (SIGHUP): for new connections, and every open one granted again."""
        self.acl = acl
        revoked = regrant(self.connections, acl)
        if revoked and self.up.is_set() and self.serving.cache.published is not None:
            self.serving.cache.published.retire(revoked)  # a process may keep its map

    def sweep(self) -> None:
        """Once a second: close the connections that held a half-received frame for
        ``frame_timeout`` s or were idle for ``idle_timeout`` s (``Connection.tick``)."""
        self.calls.sweep(time.monotonic())
        idle, frame = math.ceil(self.cfg.idle_timeout), math.ceil(self.cfg.frame_timeout)
        sweep(self.connections, idle, frame, self.counters)

    def handle(self, conn: Connection, frame: dict[str, Any] | BadFrame) -> bytes | None:
        """Every frame: a cache hit as its answer frame (the connection writes it); None when
        the answer is sent otherwise (at once through ``conn.send``, or by a task). See the
        module docstring. On a hit: one clock reading; nothing allocated but the answer when
        no background work is due."""
        if type(frame) is dict:
            f = lease_fields(frame)
            if f is not None:
                rid, c, p, k, e, _ = f
                grant = conn.grant
                if (
                    (grant.all or c in grant.client_ids)
                    and self.up.is_set()
                    and self.clock_guard.why is None
                ):
                    now = self._mono()  # the request's one clock reading
                    try:
                        out = self.answer(c, p, k, e, now, rid)
                    except BadRequest as exc:  # a lease end the pool refuses
                        self.counters.inc("req.total")
                        self._send_error(conn, rid, exc)
                        return None
                    if out is not None:
                        counters = self.counters
                        counters.hits += 1
                        if not counters.hits & HIT_SAMPLE_MASK:
                            # one hit in HIT_SAMPLE is timed (a second clock reading): its
                            # latency stands for the others in
                            # rasd_request_duration_seconds{path="hit"}
                            self.latency.observe("hit", self._mono() - now)
                        return out
                    taken = None
                    pool = self.serving.pools.get((c, p))
                    if pool is not None and pool.outage_budget_us:  # its window: :meth:`_spare`
                        spare, taken = self._spare(c, p, k, e, now, rid)
                        if spare is not None:
                            return spare
                    self._lease(conn, f, True, taken)
                else:
                    self._lease(conn, f, False)
                return None
        self._walk(conn, frame)
        return None

    def _spare(
        self, c: str, p: str, k: str, e: int, now: float, rid: int
    ) -> tuple[bytes | None, bytes | None]:
        """A miss in a pool with an outage budget whose entry is inside its window (never in
        rollout mode: the paper's agent frees what its apps release at once): its answer now
        when DynamoDB's last word was a failure, else the entry, taken out of the cache (the
        request may learn the lease is gone) for the request to fall back on."""
        cache = self.serving.cache
        if cache.spare_entry(c, p, k, now) is None or self.serving.coordinator.driver.rollout.on:
            return None, None
        if self.serving.store.breaker.unreachable():
            self.counters.inc("outage.at_once")
            return cache.spare_answer(c, p, k, e, now, rid), None
        return None, cache.take(c, p, k)

    def _lease(
        self, conn: Connection, f: LeaseFields, missed: bool, spare: bytes | None = None
    ) -> None:
        """A well-formed get_lease the cache did not answer: ``missed`` when the cache was
        asked and missed, False when it was not asked (the ACL refuses the caller, or the
        store is not up yet); ``spare``: an outage window's entry to fall back on
        (:meth:`_spare`)."""
        counters = self.counters
        counters.inc("req.total")
        rid, client_id, pool_id, key, lease_expires_us, deadline_ms = f
        if not missed:
            grant = conn.grant
            if not (grant.all or client_id in grant.client_ids):
                self._send_error(
                    conn, rid, Forbidden(f"this process may not use client_id {client_id!r}")
                )
                return
            degraded = self.status.degraded
            if degraded is not None and not self.up.is_set():
                self._send_error(conn, rid, Unavailable(f"{degraded}; retrying"))
                return
            if self.clock_guard.why is not None:
                try:
                    self.clock_guard.check()
                except Unavailable as exc:
                    self._send_error(conn, rid, exc)
                    return
        else:
            counters.inc("cache.miss")
        args = (client_id, pool_id, key, lease_expires_us)
        if not self._admit(conn, rid, "get_lease", args, deadline_ms, spare) and spare is not None:
            self.serving.cache.restore(client_id, pool_id, key, spare)  # shed: entry kept

    def _walk(self, conn: Connection, frame: dict[str, Any] | BadFrame) -> None:
        """Every frame ``lease_fields`` refuses: errors named, other ops."""
        counters = self.counters
        counters.inc("req.total")
        if isinstance(frame, BadFrame):
            counters.inc("req.bad_frame")
            conn.send(error_payload(None, "BAD_REQUEST", frame.reason))
            return
        try:
            req = wire.parse(frame)
        except RasdError as exc:
            counters.inc("req.bad_request")
            conn.send(error_payload(wire.request_id(frame), exc.code, exc.message))
            return
        if req.client_id and not conn.grant.allows(req.client_id):
            self._send_error(
                conn, req.id, Forbidden(f"this process may not use client_id {req.client_id!r}")
            )
            return
        if req.op == "ping":  # for a caller that may use some client_id
            grant = conn.grant
            if not (grant.all or grant.client_ids):
                self._send_error(conn, req.id, Forbidden("this process may use no client_id"))
                return
            conn.send(wire.ok(req.id, ready=self.status.ready, region=self.cfg.region))
            return
        if req.op == "stats":  # every client's pools and counters: for a caller granted "*"
            if not conn.grant.all:
                why = 'stats reports every client_id\'s pools: it needs a grant of "*"'
                self._send_error(conn, req.id, Forbidden(why))
                return
            conn.send(wire.ok(req.id, **self.stats()))
            return
        if req.op == "touch":  # one way: no answer, whatever it finds
            if self.up.is_set() and self.clock_guard.why is None:
                hittable.touch(req, self.serving.coordinator.renewer.touched, counters)
            return
        if req.op == "table":
            cache = self.serving.cache if self.up.is_set() else None
            refused = hittable.hand_table(conn, req, cache, self._mono(), counters)
            if refused is not None:
                self._send_error(conn, req.id, refused)
            return
        args = (
            (req.client_id, req.pool_id, req.key)
            if req.op == "release"
            else (req.client_id, req.pool_id)
        )
        self._admit(conn, req.id, req.op, args, req.deadline_ms)

    def _admit(
        self,
        conn: Connection,
        rid: int,
        op: str,
        args: tuple[Any, ...],
        deadline_ms: int | None,
        spare: bytes | None = None,
    ) -> bool:
        """What needs DynamoDB: a slot in the gate before the deadline, or shed with BUSY at
        once (False); then a task (:meth:`_slow`) with ``args`` for the role's call. Deadlines
        run on time.monotonic, the clock of asyncio's timeouts and of the store's, whatever
        clock the daemon was given for its cache."""
        budget = (deadline_ms / 1000) if deadline_ms else self.cfg.default_deadline
        now = time.monotonic()
        if conn.pending >= self.cfg.max_pending_per_conn:
            self.counters.inc("shed.conn_pending")
            self._send_error(conn, rid, Busy("too many requests in flight on this connection"))
            return False
        wait = self.calls.try_take(args[0], now)
        if wait > 0:
            self.counters.inc("shed.call_rate_limited")
            why = f"client_id {args[0]!r} is past its {self.calls.rate:g} DynamoDB calls a second"
            self._send_error(conn, rid, Busy(why, retry_after=round(wait, 3)))
            return False
        if not self.gate.try_enter(now + budget, now):
            self.counters.inc("shed.busy")
            self._send_error(conn, rid, Busy("daemon at capacity; retry shortly", retry_after=0.01))
            return False
        conn.pending += 1
        task = asyncio.get_running_loop().create_task(
            self._slow(conn, rid, op, args, now, budget, spare)
        )
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)
        return True

    async def _slow(
        self,
        conn: Connection,
        rid: int,
        op: str,
        args: tuple[Any, ...],
        t0: float,
        budget: float,
        spare: bytes | None = None,
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
                if op == "get_lease":
                    c, p, k, e = args
                    if spare is None:
                        lease, new = await self.serving.acquirer.get_lease(c, p, k, e, deadline)
                    else:
                        got = await self._or_spare(args, rid, t0, deadline, spare)
                        if isinstance(got, bytes):
                            conn.send_frame(got)
                            return
                        lease, new = got
                    resp = wire.lease_response(rid, lease, new)
                    self.latency.observe("new" if new else "existing", time.monotonic() - t0)
                    if new:
                        self.pool_metrics.new_lease(c, p)
                elif op == "release":
                    c, p, k = args
                    n = await self.serving.releaser.release(c, p, k, deadline)
                    resp = wire.ok(rid, released=n)
                elif op == "headroom":
                    c, p = args
                    h = await self.serving.reporter.headroom(c, p, deadline)
                    resp = wire.ok(rid, headroom=h)
                else:  # pragma: no cover - parse() admits only known ops
                    raise Internal(f"op {op} has no handler")
            conn.send(resp)
        except TimeoutError:
            self._send_error(conn, rid, Timeout(f"deadline of {budget * 1000:.0f} ms passed"))
        except RasdError as exc:
            if exc.code == "NO_CAPACITY" and op == "get_lease":
                self.pool_metrics.no_capacity_answer(args[0], args[1])
            self._send_error(conn, rid, exc)
        except Exception as exc:
            self.counters.inc("req.internal")
            log.exception("internal_error", op=op, error=repr(exc))
            self._send_error(conn, rid, Internal(f"{type(exc).__name__}: {exc}"))
        finally:
            conn.pending -= 1
            self.gate.leave(time.monotonic() - served_from)
            if conn.draining and conn.pending == 0:
                conn.close()

    async def _or_spare(
        self, args: tuple[Any, ...], rid: int, t0: float, deadline: float, spare: bytes
    ) -> tuple[Lease, bool] | bytes:
        """The acquirer's answer within the deadline less a reserve; if that fails (UNAVAILABLE,
        TIMEOUT) with none of its DynamoDB calls answered (``HEARD``: nothing learnt,
        nothing written), the window entry's frame (:meth:`_spare`), put back in the cache."""
        c, p, k, e = args
        reserve = min(SPARE_RESERVE, (deadline - t0) * SPARE_RESERVE_SHARE)
        heard: list[float] = []
        HEARD.set(heard)  # this task's context, copied by the acquirer's flight it starts
        try:
            return await self.serving.acquirer.get_lease(c, p, k, e, deadline - reserve)
        except (Unavailable, Timeout):
            if heard:
                raise
            (cache := self.serving.cache).restore(c, p, k, spare)
            if (frame := cache.spare_answer(c, p, k, e, self._mono(), rid)) is None:
                raise
            self.counters.inc("outage.after_failure")
            return frame

    async def wait_up(self, deadline: float) -> None:
        """For a request that arrived before the store was up: wait for it within the
        request's deadline; fail fast (UNAVAILABLE) when the daemon is degraded. If the
        deadline comes first the answer is UNAVAILABLE too (nothing was done: retry), sent a
        little before the deadline so that it reaches the caller in time."""
        if self.up.is_set():
            return
        status = self.status
        if status.degraded is not None:
            raise Unavailable(f"{status.degraded}; retrying in the background")
        self.counters.inc("req.waited_for_startup")
        left = deadline - time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, left - min(0.05, left * 0.1))):
                await self.up.wait()
        except TimeoutError:
            if status.degraded is not None:
                raise Unavailable(f"{status.degraded}; retrying in the background") from None
            raise Unavailable(
                "daemon still starting (connecting to DynamoDB); retry shortly", retry_after=0.1
            ) from None

    def _send_error(self, conn: Connection, rid: int, exc: RasdError) -> None:
        self.counters.inc(f"err.{exc.code}")
        conn.send(error_payload(rid, exc.code, exc.message, exc.retry_after))

    def stats(self) -> dict[str, Any]:
        up = self.up.is_set()
        co = self.serving.coordinator if up else None
        status = self.status
        return {
            "ready": status.ready,
            "degraded": status.degraded,
            "region": self.cfg.region,
            "uptime_s": round(time.time() - status.started, 3),
            "pid": os.getpid(),
            "cache_leases": len(co.cache) if co else 0,
            "pools": len(co.pools) if co else 0,
            "prefetch_depth": co.prefetch.depth() if co else 0,
            "hit_table": co.cache.published.stats() if co and co.cache.published else None,
            "connections": len(self.connections),
            "buffered_bytes": self.limits.buffered,
            "inflight": len(self.inflight),
            "breaker": self.serving.store.breaker.state if up else "starting",
            # the rules it runs: the table's rollout record as last read (None: starting)
            "rollout": co.driver.rollout.on if co else None,
            "retry_quota": self.serving.store.retry.quota.available if up else None,
            "clock": self.clock_guard.snapshot(),
            "latency": self.latency.snapshot(),
            "counters": self.counters.snapshot(),
        }

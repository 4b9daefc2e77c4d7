"""Routing: what the daemon does with each request frame.

Theory of operation
-------------------
Three paths, tried in this order by the connection (rasd.server.connection):

``hit``       a well-formed ``get_lease`` the cache answers, answered inside
              ``data_received``: no task, no ``Request``, one clock reading, nothing allocated
              but the answer frame. Anything else returns None and goes on to ``dispatch``; the
              hit decides nothing ``dispatch`` would decide otherwise and answers no errors.
``dispatch``  the full path: ``protocol.parse`` (errors named), the ACL, a cache hit by the
              same reader the hit uses, ``ping`` and ``stats``; what needs DynamoDB must get a
              slot in the in-flight gate before its deadline or is shed with ``BUSY`` at once,
              never queued, and then runs as a task:
``_slow``     waits for the store if the daemon is still starting (:meth:`wait_up`), calls the
              role of the acquirer that answers the verb (``rasd.acquire``: the taker, the
              releaser, the reporter) within the request's deadline, and writes the answer
              with its ``id``.

Admission, in order, for every request: the caller's Unix credentials (SO_PEERCRED, read once
per connection) against the ACL -> ``FORBIDDEN``; a cache hit is answered at once; anything
that needs DynamoDB must get a slot in the in-flight gate before its deadline -> ``BUSY``.

:class:`Routing` is a part of ``Daemon`` (rasd.server.lifecycle), which provides the state
declared below; it is a class of its own so that the lifecycle reads in one file.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from rasd_client.wire import BadFrame, error_payload

from .. import protocol
from ..config import Config
from ..core.errors import Busy, Forbidden, Internal, RasdError, Timeout, Unavailable
from ..limits import InflightGate
from ..observe.metrics import Counters
from ..observe.prom import LatencyHistograms
from ..protocol import ID_MAX, lease_fields

if TYPE_CHECKING:  # imported at run time by bring_up(), after the socket already serves
    from ..acquire import Acquirer
    from ..store import Store
    from .connection import Connection

log = structlog.get_logger("rasd.server")

#: one cached hit in HIT_SAMPLE is timed for the latency histogram (a power of two)
HIT_SAMPLE = 16
HIT_SAMPLE_MASK = HIT_SAMPLE - 1


class Routing:
    """The request paths of ``Daemon``: :meth:`hit`, :meth:`dispatch`, :meth:`_slow`."""

    # The daemon's state the request paths read (set by Daemon.__init__ and bring_up).
    cfg: Config
    counters: Counters
    gate: InflightGate
    latency: LatencyHistograms
    up: asyncio.Event
    degraded: str | None
    ready: bool
    started: float
    store: Store
    acquirer: Acquirer
    connections: set[Connection]
    inflight: set[asyncio.Task[None]]
    _mono: Callable[[], float]

    def hit(self, conn: Connection, frame: dict[str, Any] | BadFrame) -> bytes | None:
        """The fast path: a well-formed get_lease the cache answers, as its answer frame; None
        for anything else, which the caller passes to :meth:`dispatch` (the full path, which
        alone answers errors). It decides nothing dispatch would decide otherwise: the same
        field check (``protocol.lease_fields``), the ACL, the same cache decision
        (``Acquirer.hit_answer``, which ``Acquirer.try_hit`` asks too). The names' lengths
        are not checked: the cache holds only names parse() accepts, so names that find an
        entry pass. An id the answer cannot carry as a uint64 (``protocol.ID_MAX``) goes to
        the full path. One clock reading; nothing allocated but the answer when no background
        work is due."""
        if type(frame) is not dict or not self.up.is_set():
            return None
        f = lease_fields(frame)
        if f is None:
            return None
        rid, c, p, k, e, _ = f
        if not 0 <= rid <= ID_MAX:
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
                    n = await acq.releaser.release(req.client_id, req.pool_id, req.key, deadline)
                    resp = protocol.ok(req.id, released=n)
                elif req.op == "headroom":
                    h = await acq.reporter.headroom(req.client_id, req.pool_id, deadline)
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

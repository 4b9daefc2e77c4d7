"""A fault-injecting HTTP proxy between one daemon and DynamoDB (moto), on loopback.

Theory of operation
-------------------
One proxy per daemon; every proxy of a run shares one ``FaultPlan``. The proxy reads each
HTTP/1.1 request whole, then decides its fate with its own seeded RNG:

* ``drop_request``: the connection is closed before anything is forwarded (nothing applied);
* ``drop_reply``: the request is forwarded and applied, and its reply is never delivered:
  the connection is closed at once, or held silent for ``hold_s`` (past the daemon's own
  timeouts) and then closed. The daemon cannot tell whether its write landed;
* ``http500``: an ``InternalServerError`` (HTTP 500) is answered, nothing forwarded;
* ``throttle``: HTTP 400 ``ProvisionedThroughputExceededException`` in DynamoDB's JSON
  format (``x-amzn-ErrorType`` header, ``__type`` body), nothing forwarded;
* ``latency``: the request (or its reply) is held for a random ``latency_s`` range;
* otherwise it is forwarded untouched.

Each kind takes an equal share of ``rate`` (default 5 % of calls in all). During the plan's
**outage window** every call of every proxy fails: half are dropped (connection closed), half
answered HTTP 500, so the daemons' circuit breakers see an outage. Faults start only when the
plan is enabled (after the daemons started), so a start-up is never sabotaged.

The upstream (werkzeug) closes its connection after each response; the proxy opens one
upstream connection per request and keeps the daemon's connection alive (HTTP/1.1), as
``bench/proxy.py`` does. Threads, one per daemon connection; all bounded by ``stop()``.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.proxy import HttpReader
from rasd.core.lease import US, parse_time

KINDS = ("drop_request", "drop_reply", "http500", "throttle", "latency")
_CONN_RE = re.compile(rb"(?im)^connection:[^\r\n]*\r\n")
_TARGET_RE = re.compile(rb"(?im)^x-amz-target:[ \t]*\S+\.(\w+)")


@dataclass
class FaultPlan:
    """What the proxies do; shared by all of them, changed only between phases."""

    rate: float = 0.05
    weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 1.0))
    latency_s: tuple[float, float] = (0.05, 1.5)
    hold_s: float = 2.5
    enabled: bool = False
    #: wall-clock [from, to) during which every call of every proxy fails
    outage: tuple[float, float] | None = None
    #: one host cut off: its proxy's name and the wall-clock [from, to) during which every
    #: call through that proxy alone fails, as in an outage
    partition: tuple[str, float, float] | None = None

    def in_outage(self, now: float | None = None, proxy: str = "") -> bool:
        t = time.time() if now is None else now
        cut = self.partition
        if cut is not None and proxy == cut[0] and cut[1] <= t < cut[2]:
            return True
        if self.outage is None:
            return False
        return self.outage[0] <= t < self.outage[1]


def error_response(status: int, reason: str, error_type: str, message: str) -> bytes:
    """An error reply in DynamoDB's JSON 1.0 protocol format."""
    body = json.dumps(
        {"__type": f"com.amazonaws.dynamodb.v20120810#{error_type}", "message": message}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"x-amzn-RequestId: chaos-{random.getrandbits(48):012x}\r\n"
        f"x-amzn-ErrorType: {error_type}\r\n"
        "Content-Type: application/x-amz-json-1.0\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\n\r\n"
    ).encode()
    return head + body


THROTTLE = (
    400,
    "Bad Request",
    "ProvisionedThroughputExceededException",
    "The level of configured provisioned throughput for the table was exceeded. "
    "Consider increasing your provisioning level with the UpdateTable API.",
)
ERROR_500 = (500, "Internal Server Error", "InternalServerError", "Internal server error")


def keep_alive(head: bytes, body: bytes, until_close: bool) -> bytes:
    """The upstream's reply made HTTP/1.1 keep-alive (the proxy, not werkzeug, decides the
    daemon's connection lifetime)."""
    head = _CONN_RE.sub(b"", head)
    if head.startswith(b"HTTP/1.0 "):
        head = b"HTTP/1.1 " + head[9:]
    extra = b"Connection: keep-alive\r\n"
    if until_close:
        extra += b"Content-Length: " + str(len(body)).encode() + b"\r\n"
    return head[:-2] + extra + b"\r\n" + body


class FaultProxy:
    """Listen on 127.0.0.1 (any free port), forward to ``upstream`` under ``plan``."""

    def __init__(
        self,
        upstream: tuple[str, int],
        plan: FaultPlan,
        seed: str,
        name: str = "",
        trace: Trace | None = None,
    ) -> None:
        self.upstream = upstream
        self.trace = trace
        #: what the calls this proxy forwarded did to leases (``lease_event``), in order
        self.events: list[dict[str, Any]] = []
        self.plan = plan
        self.name = name
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter()
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(256)
        self.host, self.port = self._lsock.getsockname()[:2]
        self._stop = threading.Event()
        self._socks: set[socket.socket] = set()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._accept, name=f"chaos-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._lsock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._lsock.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(5)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.stats)

    # ------------------------------------------------------------------------------ internals
    def _count(self, *names: str) -> None:
        with self._lock:
            for n in names:
                self.stats[n] += 1

    def decide(self) -> tuple[str, float]:
        """(fault kind or "" for none, a uniform draw for the kind's own choice)."""
        plan = self.plan
        with self._lock:
            u = self._rng.random()
            if not plan.enabled:
                return "", u
            if plan.in_outage(proxy=self.name):
                return "outage", u
            if self._rng.random() >= plan.rate:
                return "", u
            kinds = list(plan.weights)
            kind = self._rng.choices(kinds, [plan.weights[k] for k in kinds])[0]
            return kind, u

    def _latency(self, u: float) -> float:
        lo, hi = self.plan.latency_s
        return lo + (hi - lo) * u

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                csock, _ = self._lsock.accept()
            except OSError:
                return
            csock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._socks.add(csock)
                self.stats["connections"] += 1
            threading.Thread(target=self._conn, args=(csock,), daemon=True).start()

    def _conn(self, csock: socket.socket) -> None:
        cin = HttpReader(csock)
        try:
            while not self._stop.is_set():
                req = cin.message(request=True)
                if req is None:
                    return
                head, body, _ = req
                m = _TARGET_RE.search(head)
                op = m.group(1).decode() if m else "?"
                kind, u = self.decide()
                self._count("requests", f"op.{op}", f"fault.{kind or 'none'}")
                if kind == "outage":
                    if u < 0.5:
                        return  # connection closed, nothing forwarded
                    csock.sendall(error_response(*ERROR_500))
                    continue
                if kind == "drop_request":
                    return
                if kind == "http500":
                    csock.sendall(error_response(*ERROR_500))
                    continue
                if kind == "throttle":
                    csock.sendall(error_response(*THROTTLE))
                    continue
                if kind == "latency" and u < 0.5:
                    self._stop.wait(self._latency(u * 2))
                sent = time.time()
                reply = self._forward(head + body)
                if self.trace is not None:
                    self.trace.record(self.name, op, kind, sent, body, reply)
                if op in ("UpdateItem", "Query") and reply is not None:
                    ev = lease_event(op, body, reply)
                    if ev is not None:
                        ev.update(sent=sent, got=time.time(), proxy=self.name)
                        with self._lock:
                            self.events.append(ev)
                if reply is None:
                    self._count("upstream_failed")
                    return
                if kind == "drop_reply":
                    self._count(f"op.{op}.reply_dropped")
                    if u < 0.5:
                        self._stop.wait(self.plan.hold_s)  # silent until the caller gives up
                    return
                if kind == "latency" and u >= 0.5:
                    self._stop.wait(self._latency(u * 2 - 1))
                csock.sendall(reply)
        except Exception:  # noqa: BLE001 - a proxy thread must never raise
            return
        finally:
            with self._lock:
                self._socks.discard(csock)
            with contextlib.suppress(OSError):
                csock.close()

    def _forward(self, request: bytes) -> bytes | None:
        try:
            with socket.create_connection(self.upstream, timeout=30) as up:
                up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                up.sendall(request)
                resp = HttpReader(up).message(request=False)
        except OSError:
            return None
        if resp is None:
            return None
        return keep_alive(*resp)


def lease_event(op: str, body: bytes, reply: bytes) -> dict[str, Any] | None:
    """What a forwarded call that succeeded did to a key's leases, for the audit's "who made
    the second lease" (``chaos.audit.Makers``); None for anything else. The call took effect
    between the proxy's forwarding (``sent``) and the reply it read (``got``).

    * ``claim``: an UpdateItem that made a free item held for a key (rasd's ``claim`` or the
      paper's ``paper_claim``: both REMOVE ``lease_available``; the item comes back,
      ``ALL_NEW``, with its ``key``): resource, key, version, ``end`` (epoch seconds);
    * ``extend``: an UpdateItem that SET ``lease_expires`` of a held item without claiming
      it (rasd's ``extend_resource``; the paper's agent never extends): resource, key, end;
    * ``lookup``: a Query of ``leased_resources`` for a key: key and the ``resources`` it
      returned (what the index showed of the key at some point between sent and got);
    * ``free``: an UpdateItem that REMOVEd an item's ``key`` (a daemon's free, a liberator's,
      rasadmin's): the resource.
    """
    if not reply.startswith(b"HTTP/1.1 200") and not reply.startswith(b"HTTP/1.0 200"):
        return None
    try:
        req = json.loads(body)
        answer = json.loads(reply.partition(b"\r\n\r\n")[2])
        if op == "Query":
            if req.get("IndexName") != "leased_resources":
                return None
            return {
                "kind": "lookup",
                "key": req["ExpressionAttributeValues"][":k"]["S"],
                "resources": sorted(it["resource"]["S"] for it in answer.get("Items", [])),
            }
        if op != "UpdateItem":
            return None
        names = req.get("ExpressionAttributeNames") or {}
        expr = str(req.get("UpdateExpression") or "")

        def named(clause: str) -> set[str]:
            part = re.split(r"\b(?:SET|ADD|DELETE|REMOVE)\b", expr.partition(clause)[2])[0]
            if clause not in expr:
                return set()
            return {names.get(x, x) for x in re.findall(r"#\w+", part)}

        if "key" in named("REMOVE"):  # a free: the item no longer holds a key
            return {"kind": "free", "resource": req["Key"]["resource"]["S"]}
        item = answer.get("Attributes") or {}
        if "key" not in item or "lease_expires" not in item:
            return None
        out = {
            "resource": item["resource"]["S"],
            "key": item["key"]["S"],
            "version": int(item["version"]["N"]),
            "end": parse_time(item["lease_expires"]["S"]) / US,
        }
        if "lease_available" in named("REMOVE"):
            return {"kind": "claim", **out}
        if "lease_expires" in named("SET"):
            return {"kind": "extend", **out}
        return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class Trace:
    """The writes (and their replies) that reached DynamoDB, one JSON line each, for digging
    into a finding (``python -m chaos --trace``): proxy, operation, fault, ``sent`` (forwarded)
    and ``got`` (the upstream's reply read; the write applied in between), the HTTP status,
    the request's item key, condition and values, and for a failed condition its reason. Reads
    are left out (a run makes many), except Queries of the leased index (what an agent saw
    of a key)."""

    OPS = frozenset({"UpdateItem", "PutItem", "DeleteItem"})

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def record(
        self, proxy: str, op: str, fault: str, sent: float, body: bytes, reply: bytes | None
    ) -> None:
        got = time.time()
        try:
            req = json.loads(body)
        except ValueError:
            return
        leased = op == "Query" and req.get("IndexName") == "leased_resources"
        if op not in self.OPS and not leased:
            return
        status, answer = 0, ""
        if reply is not None:
            head, _, rbody = reply.partition(b"\r\n\r\n")
            with contextlib.suppress(ValueError, IndexError):
                status = int(head.split(b" ", 2)[1])
            answer = rbody.decode(errors="replace")[: 4000 if op == "Query" else 600]
        rec = {
            "p": proxy, "op": op, "fault": fault, "sent": round(sent, 6), "got": round(got, 6),
            "status": status,
            "key": req.get("Key"), "cond": req.get("ConditionExpression"),
            "update": req.get("UpdateExpression"), "values": req.get("ExpressionAttributeValues"),
            "answer": answer,
        }  # fmt: skip
        line = json.dumps(rec, separators=(",", ":"))
        with self._lock:
            self._f.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._f.close()


def start_proxies(
    upstreams: Sequence[str], plan: FaultPlan, seed: int, trace: Trace | None = None
) -> list[FaultProxy]:
    """One proxy to each ``http://host:port`` of ``upstreams`` (proxy ``i`` to the ``i``-th),
    each with its own RNG seeded from ``seed``."""
    out = []
    for i, url in enumerate(upstreams):
        host, port = url.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
        out.append(
            FaultProxy((host, int(port)), plan, seed=f"{seed}/proxy/{i}", name=f"p{i}", trace=trace)
        )
    return [px.start() for px in out]


def totals(proxies: list[FaultProxy]) -> dict[str, Any]:
    """Sum of the proxies' counters, and each proxy's."""
    total: Counter[str] = Counter()
    each = []
    for p in proxies:
        s = p.snapshot()
        total.update(s)
        each.append(s)
    return {"total": dict(sorted(total.items())), "each": each}

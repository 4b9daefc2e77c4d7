"""The proxy between a DynamoDB client and its backend, on loopback: a network's delay, faults,
and hooks that see each call (the bench's trace and meter, the chaos run's audit).

Delay
-----
Every byte that crosses the proxy, in either direction, is held back ``delay`` seconds (the
one-way latency), so a request/response pair costs one round trip of ``2 * delay`` on top of
the backend's own service time. A new connection also pays for its handshakes: the first bytes
a client sends on it are held ``handshake_rtts`` extra round trips (TCP's SYN/SYN-ACK, TLS); a
warm, kept-alive connection does not pay that again. In HTTP mode the handshakes run from the
moment the connection is accepted, as a real one's do from the connect: a client that opens a
connection ahead of its first request (a pool kept warm) has paid them by then.

Threads, not asyncio timers: an event loop's timers round to whole milliseconds, which would
turn 3.5 ms into 4. In TCP mode each direction of each connection has a reader thread that
stamps chunks with their due time and a writer thread that sleeps until then and sends them in
order; in HTTP mode one thread per client connection reads each request whole and holds it,
then the reply. ``time.sleep`` overshoots by tens of microseconds on Linux; ``self_test()``
measures what the proxy really adds.

HTTP mode keeps the client's connection alive whatever the upstream does (werkzeug, moto's
server, closes after every response: the proxy reconnects, which on loopback costs ~0.1 ms,
not the modelled handshakes), and gives each call to the hooks.

Faults (HTTP mode, a ``FaultPlan``)
-----------------------------------
Each request's fate is drawn from the proxy's own seeded RNG: ``drop_request`` (the connection
closed, nothing forwarded); ``drop_reply`` (forwarded and applied, the reply never delivered:
the connection closed at once, or held silent ``hold_s`` first, so the caller cannot tell
whether its write landed); ``http500`` and ``throttle`` (DynamoDB's error replies, nothing
forwarded); ``latency`` (the request or its reply held a random ``latency_s``). Each kind
takes its weight's share of ``rate``. During the plan's outage window (every proxy) or
partition window (the proxy it names) every call fails: half the connections closed, half
answered HTTP 500. Faults start only once the plan is enabled.

Run in its own process (``python -m fleet.proxy``, ``fleet.backends.ProxyProcess``) so that
neither the client's nor the backend's GIL stretches its timings.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import queue
import random
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from .httpwire import ERROR_500, THROTTLE, HttpReader, closes, error_response, keep_alive, operation

KINDS = ("drop_request", "drop_reply", "http500", "throttle", "latency")
_CLOSE = object()


class Meter(Protocol):
    """HTTP mode: shown each request before it goes upstream (and may rewrite it), and each
    answer after it went back to the client (e.g. what DynamoDB would bill)."""

    def request(self, head: bytes, body: bytes) -> tuple[bytes, bytes, Any]: ...
    def response(self, ctx: Any, rhead: bytes, rbody: bytes) -> None: ...
    def close(self) -> None: ...


#: HTTP mode: called after each forwarded call with the proxy's name, the operation, the fault
#: drawn ("" for none), when it was forwarded (epoch seconds), the request's body and the
#: upstream's reply (None when it gave none); what it returns, unless None, goes to ``events``
Observer = Callable[[str, str, str, float, bytes, bytes | None], dict[str, Any] | None]


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


def _sleep_until(due: float) -> None:
    wait = due - time.perf_counter()
    if wait > 0:
        time.sleep(wait)


class _Upstream:
    """One client connection's connection upstream: kept while the upstream keeps it."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        self.sock: socket.socket | None = None
        self.reader: HttpReader | None = None
        self.t_up = self.t_back = 0.0

    def exchange(self, request: bytes) -> tuple[bytes, bytes, bool] | None:
        """Send ``request``, read the reply whole (None when there is none). The upstream may
        have closed an idle kept-alive connection (dynalite does after 5 s): the request never
        reached it, so it goes again on a new one. The modelled endpoint, not the stand-in's
        idle timer, decides the client's connection lifetime."""
        resp = None
        for _attempt in (1, 2):
            reused = self.sock is not None
            try:
                if self.sock is None:
                    self.sock = socket.create_connection(self.addr, timeout=30)
                    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.reader = HttpReader(self.sock)
                assert self.reader is not None
                self.t_up = time.perf_counter()
                self.sock.sendall(request)
                resp = self.reader.message(request=False)
            except OSError:
                resp = None
            if resp is not None or not reused:
                break
            self.close()
        self.t_back = time.perf_counter()
        if resp is None or closes(resp[0], resp[2]):
            self.close()
        return resp

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        self.sock, self.reader = None, None


class Proxy:
    """Listen on ``listen_host:listen_port`` (0: any free port), forward to ``upstream``:
    ``delay_s`` each way, ``handshake_rtts`` more round trips on a new connection. ``http``:
    HTTP/1.1-aware (needed by everything below). ``timings``: a file it writes one JSON line
    per request to (operation and perf_counter stamps; on Linux perf_counter is
    CLOCK_MONOTONIC, comparable across processes); ``meter``: see :class:`Meter`; ``plan``:
    the faults, drawn from an RNG seeded with ``seed``; ``name``: the proxy's, in a
    partition and to ``observe`` (see :data:`Observer`)."""

    def __init__(
        self,
        upstream: tuple[str, int],
        delay_s: float = 0.0,
        handshake_rtts: float = 0.0,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        http: bool = False,
        timings: str | None = None,
        meter: Meter | None = None,
        plan: FaultPlan | None = None,
        seed: str = "",
        name: str = "",
        observe: Observer | None = None,
    ) -> None:
        if not http and (timings or meter or plan or observe):
            raise ValueError("timings, meter, plan and observe need http=True")
        self.upstream = upstream
        self.http = http
        self.meter = meter
        self.plan = plan
        self.name = name
        self.observe = observe
        #: what ``observe`` returned of the calls this proxy forwarded, in order
        self.events: list[dict[str, Any]] = []
        self._timings = open(timings, "a", buffering=1) if timings else None  # noqa: SIM115
        self.delay_s = delay_s
        self.handshake_s = handshake_rtts * 2 * delay_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.stats: Counter[str] = Counter()
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((listen_host, listen_port))
        self._lsock.listen(512)
        self.host, self.port = self._lsock.getsockname()[:2]
        self._stop = threading.Event()
        self._socks: set[socket.socket] = set()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Proxy:
        loop = self._accept_http if self.http else self._accept_tcp
        self._thread = threading.Thread(target=loop, name=f"proxy-{self.name}", daemon=True)
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
        if self._timings is not None:
            with self._lock:
                self._timings.close()
                self._timings = None

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> dict[str, int]:
        """Its counters: connections, requests, by operation and by fault."""
        with self._lock:
            return dict(self.stats)

    def decide(self) -> tuple[str, float]:
        """(fault kind or "" for none, a uniform draw for the kind's own choice)."""
        plan = self.plan
        if plan is None:
            return "", 0.0
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

    # ------------------------------------------------------------------------------ internals
    def _count(self, *names: str) -> None:
        with self._lock:
            for n in names:
                self.stats[n] += 1

    def _latency(self, u: float) -> float:
        assert self.plan is not None
        lo, hi = self.plan.latency_s
        return lo + (hi - lo) * u

    def _accept_tcp(self) -> None:
        while not self._stop.is_set():
            try:
                csock, _ = self._lsock.accept()
            except OSError:
                return
            try:
                usock = socket.create_connection(self.upstream, timeout=5)
                usock.settimeout(None)
            except OSError:
                csock.close()
                continue
            for s in (csock, usock):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._count("connections")
            # client -> upstream: the first chunk also waits for the modelled handshakes
            self._pipe(csock, usock, extra_first_s=self.handshake_s)
            self._pipe(usock, csock, extra_first_s=0.0)

    def _accept_http(self) -> None:
        while not self._stop.is_set():
            try:
                csock, _ = self._lsock.accept()
            except OSError:
                return
            csock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._socks.add(csock)
                self.stats["connections"] += 1
            threading.Thread(target=self._http_conn, args=(csock,), daemon=True).start()

    def _http_conn(self, csock: socket.socket) -> None:
        """One client connection, kept alive whatever the upstream does: each request read
        whole, held ``delay`` (and none goes before the handshakes begun at the accept are
        over), its fault applied, forwarded, and the reply, read whole, held ``delay`` again."""
        shaken = time.perf_counter() + self.handshake_s
        cin = HttpReader(csock)
        up = _Upstream(self.upstream)
        try:
            while not self._stop.is_set():
                req = cin.message(request=True)
                if req is None:
                    return
                due = max(time.perf_counter(), shaken) + self.delay_s
                head, body, _ = req
                op = operation(head)
                kind, u = self.decide()
                self._count("requests", f"op.{op}", f"fault.{kind or 'none'}")
                if kind in ("outage", "drop_request", "http500", "throttle"):
                    if kind == "drop_request" or (kind == "outage" and u < 0.5):
                        return  # connection closed, nothing forwarded
                    csock.sendall(error_response(*(THROTTLE if kind == "throttle" else ERROR_500)))
                    continue
                metered = None
                if self.meter is not None:
                    head, body, metered = self.meter.request(head, body)
                t_in = time.perf_counter()
                if kind == "latency" and u < 0.5:
                    self._stop.wait(self._latency(u * 2))
                _sleep_until(due)
                sent = time.time()
                resp = up.exchange(head + body)
                rhead, rbody = (keep_alive(*resp), resp[1]) if resp is not None else (b"", b"")
                if self.observe is not None:
                    reply = rhead + rbody if resp is not None else None
                    ev = self.observe(self.name, op, kind, sent, body, reply)
                    if ev is not None:
                        with self._lock:
                            self.events.append(ev)
                if resp is None:
                    self._count("upstream_failed")
                    return
                if kind == "drop_reply":
                    self._count(f"op.{op}.reply_dropped")
                    if u < 0.5:
                        self._stop.wait(self.plan.hold_s if self.plan else 0.0)  # until it gives up
                    return
                if kind == "latency" and u >= 0.5:
                    self._stop.wait(self._latency(u * 2 - 1))
                _sleep_until(up.t_back + self.delay_s)
                csock.sendall(rhead + rbody)
                if metered is not None:
                    assert self.meter is not None
                    self.meter.response(metered, rhead, rbody)
                if self._timings is not None:
                    stamps = (t_in, up.t_up, up.t_back, time.perf_counter())
                    self._log(head + body[:400], *stamps, rhead)
        except Exception:  # noqa: BLE001 - a proxy thread must never raise
            return
        finally:
            with self._lock:
                self._socks.discard(csock)
            with contextlib.suppress(OSError):
                csock.close()
            up.close()

    def _log(
        self, head: bytes, t_in: float, t_up: float, t_back: float, t_out: float, rhead: bytes
    ) -> None:
        ix = re.search(rb'"IndexName":\s*"(\w+)"', head)
        line = json.dumps(
            {
                "op": operation(head),
                "index": ix.group(1).decode() if ix else None,
                "conn": threading.get_native_id(),  # a thread per connection (ids reused last)
                "in": t_in,
                "up": t_up,
                "back": t_back,
                "out": t_out,
                "status": rhead[9:12].decode(errors="replace"),
            }
        )
        with self._lock:
            if self._timings is not None:
                self._timings.write(line + "\n")

    def _pipe(self, src: socket.socket, dst: socket.socket, extra_first_s: float) -> None:
        q: queue.SimpleQueue[tuple[float, bytes] | object] = queue.SimpleQueue()
        delay = self.delay_s

        def reader() -> None:
            extra = extra_first_s
            try:
                while True:
                    data = src.recv(262144)
                    now = time.perf_counter()
                    if not data:
                        break
                    q.put((now + delay + extra, data))
                    extra = 0.0
            except OSError:
                pass
            q.put(_CLOSE)

        def writer() -> None:
            try:
                while True:
                    item = q.get()
                    if item is _CLOSE:
                        break
                    due, data = cast(tuple[float, bytes], item)
                    wait = due - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    dst.sendall(data)
            except OSError:
                pass
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            # when both directions are done the sockets can go
            with contextlib.suppress(OSError):
                src.shutdown(socket.SHUT_RD)

        threading.Thread(target=reader, daemon=True, name="proxy-r").start()
        threading.Thread(target=writer, daemon=True, name="proxy-w").start()


def load_meter(factory: str, path: str, upstream: str, table: str | None) -> Meter:
    """The meter ``factory`` (``module:callable``) makes: called with the file it writes to,
    the upstream's URL and the table it copies at start (or None)."""
    module, _, attr = factory.partition(":")
    make = getattr(importlib.import_module(module), attr)
    return cast(Meter, make(path, upstream, table))


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    ap = argparse.ArgumentParser(prog="python -m fleet.proxy", description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", "--target", metavar="HOST:PORT", help="where to forward to")
    ap.add_argument(
        "--delay-ms", "--one-way-ms", type=float, default=3.5, help="one-way delay (default 3.5)"
    )
    ap.add_argument("--handshake-rtts", type=float, default=2.0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--http", action="store_true", help="HTTP/1.1-aware mode (see _http_conn)")
    ap.add_argument("--trace", metavar="FILE", help="HTTP mode: a JSON line per request")
    ap.add_argument("--meter", metavar="FILE", help="HTTP mode: the meter's output file")
    ap.add_argument("--meter-table", metavar="TABLE", help="--meter: the table it copies at start")
    ap.add_argument(
        "--meter-factory",
        metavar="MODULE:NAME",
        default="",
        help="--meter: what makes the meter (e.g. bench.meter:open_meter, DynamoDB's bill)",
    )
    ap.add_argument("--self-test", action="store_true", help="measure the added delay and exit")
    a = ap.parse_args(argv)
    if a.self_test:
        from .proxytest import print_self_tests

        print_self_tests(a.delay_ms / 1e3, a.handshake_rtts)
        return 0
    if not a.upstream:
        ap.error("--upstream is required")
    if (a.trace or a.meter) and not a.http:
        ap.error("--trace and --meter need --http")
    if a.meter and not a.meter_factory:
        ap.error("--meter needs --meter-factory")
    host, _, port = a.upstream.rpartition(":")
    meter = None
    if a.meter:
        meter = load_meter(a.meter_factory, a.meter, f"http://{a.upstream}", a.meter_table)
    px = Proxy(
        (host, int(port)),
        a.delay_ms / 1e3,
        a.handshake_rtts,
        listen_port=a.port,
        http=a.http,
        timings=a.trace,
        meter=meter,
    )
    px.start()
    print(f"PORT {px.port}", flush=True)  # the parent reads this line
    try:
        sys.stdin.read()  # run until the parent closes our stdin (or dies)
    except KeyboardInterrupt:
        pass
    px.stop()
    if meter is not None:
        meter.close()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())

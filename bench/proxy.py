"""A TCP proxy that adds a one-way delay: the latency model between a client and DynamoDB.

Theory of operation
-------------------
Every byte that crosses the proxy, in either direction, is held back for ``delay`` seconds
(the one-way latency), so a request/response pair costs one round trip of ``2 * delay`` on top
of the backend's own service time. Default 3.5 ms, about the 7 ms GetItem of the paper.

A new connection also pays for its handshakes. A real client to DynamoDB spends one round trip
on TCP's SYN/SYN-ACK and one or two more on TLS before its first request can leave, so the
first bytes a client sends on a new connection are held ``handshake_rtts`` extra round trips
(default 2). A warm, kept-alive connection pool does not pay that again, which is exactly the
saving the benchmark wants to show.

Threads, not asyncio timers: an event loop's timers round to whole milliseconds, which would
turn 3.5 ms into 4. Each direction of each connection has a reader thread that stamps chunks
with their due time and a writer thread that sleeps until that time and sends them, in order
(the delay is constant, so FIFO order is due-time order). ``time.sleep`` overshoots by tens of
microseconds on Linux; ``self_test()`` measures what the proxy really adds.

Runs in its own process in the benchmark (``python -m bench.proxy``) so that neither the
client's nor the backend's GIL stretches its timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, cast

_CLOSE = object()
_KEEPALIVE_RE = re.compile(rb"(?im)^connection:[ \t]*close[ \t]*(?=\r?$)")
_CLEN_RE = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")
_CHUNKED_RE = re.compile(rb"(?im)^transfer-encoding:[ \t]*chunked[ \t]*\r?$")


def _sleep_until(due: float) -> None:
    wait = due - time.perf_counter()
    if wait > 0:
        time.sleep(wait)


class HttpReader:
    """Buffered reads of whole HTTP/1.1 messages (Content-Length, chunked or until close).
    Shared with the chaos run's fault-injecting proxy (chaos/proxy.py)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(262144)
        if not data:
            return False
        self.buf += data
        return True

    def message(self, request: bool) -> tuple[bytes, bytes, bool] | None:
        """(head, body, body_ran_until_close) or None when the peer closed first."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                return None
        i = self.buf.index(b"\r\n\r\n") + 4
        head, self.buf = self.buf[:i], self.buf[i:]
        m = _CLEN_RE.search(head)
        if m:
            n = int(m.group(1))
            while len(self.buf) < n:
                if not self._fill():
                    return None
            body, self.buf = self.buf[:n], self.buf[n:]
            return head, body, False
        if _CHUNKED_RE.search(head):
            while True:
                end = self.buf.find(b"\r\n0\r\n\r\n")
                if end >= 0 or self.buf.startswith(b"0\r\n\r\n"):
                    cut = (end + 7) if end >= 0 else 5
                    body, self.buf = self.buf[:cut], self.buf[cut:]
                    return head, body, False
                if not self._fill():
                    return None
        if request:
            return head, b"", False
        while self._fill():  # no length: the body runs until the upstream closes
            pass
        body, self.buf = self.buf, b""
        return head, body, True


def closes(head: bytes, until_close: bool) -> bool:
    """Must the connection close after this message?"""
    return until_close or _KEEPALIVE_RE.search(head) is not None or head.startswith(b"HTTP/1.0")


@dataclass
class ProxyStats:
    connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class DelayProxy:
    """Listen on ``listen_host:listen_port`` (0: any free port), forward to ``upstream``."""

    def __init__(
        self,
        upstream: tuple[str, int],
        delay_s: float = 0.0035,
        handshake_rtts: float = 2.0,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        http: bool = False,
        trace: str | None = None,
        meter: Any = None,
    ) -> None:
        self.upstream = upstream
        self.http = http
        #: HTTP mode: ``bench.meter.Meter``, shown each request before it goes upstream and
        #: each answer after it went back (what DynamoDB would bill)
        self.meter = meter
        #: HTTP mode: one JSON line per request (operation and perf_counter stamps; on Linux
        #: perf_counter is CLOCK_MONOTONIC, comparable across processes). For bench.profile.
        self._trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115
        self._trace_lock = threading.Lock()
        self.delay_s = delay_s
        self.handshake_s = handshake_rtts * 2 * delay_s
        self.stats = ProxyStats()
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((listen_host, listen_port))
        self._lsock.listen(512)
        self.host, self.port = self._lsock.getsockname()[:2]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> DelayProxy:
        loop = self._accept_loop_http if self.http else self._accept_loop
        self._thread = threading.Thread(target=loop, name="proxy-accept", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._lsock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._lsock.close()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------ internals
    def _accept_loop(self) -> None:
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
            with self.stats.lock:
                self.stats.connections += 1
            # client -> upstream: the first chunk also waits for the modelled handshakes
            self._pipe(csock, usock, extra_first_s=self.handshake_s, up=True)
            self._pipe(usock, csock, extra_first_s=0.0, up=False)

    def _accept_loop_http(self) -> None:
        while not self._stop.is_set():
            try:
                csock, _ = self._lsock.accept()
            except OSError:
                return
            csock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.stats.lock:
                self.stats.connections += 1
            threading.Thread(target=self._http_conn, args=(csock,), daemon=True).start()

    def _http_conn(self, csock: socket.socket) -> None:
        """One client connection, kept alive whatever the upstream does.

        Requests are read whole, held ``delay`` (plus the handshakes on the connection's first
        request), sent upstream on a reused connection (a new one when the upstream closed
        it, as werkzeug/moto does after every response: on loopback that costs ~0.1 ms, not
        the modelled handshakes), and the response, read whole, is held ``delay`` again.
        """
        cin = HttpReader(csock)
        up: socket.socket | None = None
        uin: HttpReader | None = None
        extra = self.handshake_s
        try:
            while True:
                req = cin.message(request=True)
                if req is None:
                    return
                due = time.perf_counter() + self.delay_s + extra
                extra = 0.0
                head, body, _ = req
                metered = None
                if self.meter is not None:
                    head, body, metered = self.meter.request(head, body)
                t_in = time.perf_counter()
                with self.stats.lock:
                    self.stats.bytes_up += len(head) + len(body)
                _sleep_until(due)
                resp = None
                for _attempt in (1, 2):
                    reused = up is not None
                    if up is None:
                        up = socket.create_connection(self.upstream, timeout=30)
                        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        uin = HttpReader(up)
                    assert uin is not None
                    t_up = time.perf_counter()
                    try:
                        up.sendall(head + body)
                        resp = uin.message(request=False)
                    except OSError:
                        resp = None
                    if resp is not None or not reused:
                        break
                    # The upstream closed an idle kept-alive connection (dynalite does after
                    # 5 s): the request never reached it, so reconnect and send it again. The
                    # modelled endpoint, not the stand-in's idle timer, decides the client's
                    # connection lifetime.
                    up.close()
                    up, uin = None, None
                if resp is None:
                    return
                rhead, rbody, until_close = resp
                close = closes(rhead, until_close)
                t_back = time.perf_counter()
                due = t_back + self.delay_s
                if close:  # the upstream closes: we do not, the client keeps its connection
                    assert up is not None
                    up.close()
                    up, uin = None, None
                    rhead = _KEEPALIVE_RE.sub(b"Connection: keep-alive", rhead)
                    if rhead.startswith(b"HTTP/1.0 "):
                        rhead = b"HTTP/1.1 " + rhead[9:]
                with self.stats.lock:
                    self.stats.bytes_down += len(rhead) + len(rbody)
                _sleep_until(due)
                csock.sendall(rhead + rbody)
                if metered is not None:
                    self.meter.response(metered, rhead, rbody)
                if self._trace is not None:
                    self._log(head + body[:400], t_in, t_up, t_back, time.perf_counter(), rhead)
        except OSError:
            return
        finally:
            csock.close()
            if up is not None:
                up.close()

    def _log(
        self, head: bytes, t_in: float, t_up: float, t_back: float, t_out: float, rhead: bytes
    ) -> None:
        m = re.search(rb"(?im)^x-amz-target:[ \t]*\S+\.(\w+)", head)
        ix = re.search(rb'"IndexName":\s*"(\w+)"', head)
        line = json.dumps(
            {
                "op": m.group(1).decode() if m else "?",
                "index": ix.group(1).decode() if ix else None,
                "conn": threading.get_ident(),
                "in": t_in,
                "up": t_up,
                "back": t_back,
                "out": t_out,
                "status": rhead[9:12].decode(errors="replace"),
            }
        )
        with self._trace_lock:
            assert self._trace is not None
            self._trace.write(line + "\n")

    def _pipe(self, src: socket.socket, dst: socket.socket, extra_first_s: float, up: bool) -> None:
        q: queue.SimpleQueue[tuple[float, bytes] | object] = queue.SimpleQueue()
        delay = self.delay_s
        stats = self.stats

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
                    with stats.lock:
                        if up:
                            stats.bytes_up += len(data)
                        else:
                            stats.bytes_down += len(data)
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


# ---------------------------------------------------------------------------------- self-test
class _Echo:
    """A blocking loopback TCP echo server (one thread per connection)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.addr = self.sock.getsockname()[:2]
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    @staticmethod
    def _serve(c: socket.socket) -> None:
        with c:
            while True:
                try:
                    d = c.recv(65536)
                except OSError:
                    return
                if not d:
                    return
                c.sendall(d)

    def close(self) -> None:
        self.sock.close()


def _rtts(addr: tuple[str, int], n: int, payload: bytes = b"x" * 200) -> tuple[float, list[float]]:
    """Connect, time the first round trip, then ``n`` more on the same connection (seconds)."""
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out: list[float] = []
    first = 0.0
    with s:
        for i in range(n + 1):
            t0 = time.perf_counter_ns()
            s.sendall(payload)
            got = 0
            while got < len(payload):
                got += len(s.recv(65536))
            dt = (time.perf_counter_ns() - t0) / 1e9
            if i == 0:
                first = dt
            else:
                out.append(dt)
    return first, out


def _http_echo() -> tuple[Any, tuple[str, int]]:
    """A loopback HTTP server that answers POST with its body and closes the connection after
    every response, as werkzeug (moto's server) does."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    host, port = srv.server_address[:2]
    return srv, (str(host), int(port))


def http_self_test(
    delay_s: float = 0.0035, handshake_rtts: float = 2.0, n: int = 100
) -> dict[str, Any]:
    """HTTP mode: keep-alive client, upstream closing after every response."""
    import http.client

    srv, addr = _http_echo()

    def run(host: str, port: int, k: int) -> tuple[float, list[float]]:
        c = http.client.HTTPConnection(host, port)
        xs: list[float] = []
        for _ in range(k + 1):
            t0 = time.perf_counter_ns()
            c.request("POST", "/", body=b"x" * 200)
            r = c.getresponse()
            r.read()
            xs.append((time.perf_counter_ns() - t0) / 1e9)
            if r.will_close:
                c.close()
        c.close()
        return xs[0], xs[1:]

    try:
        _, direct = run(*addr, n)
        with DelayProxy(addr, delay_s, handshake_rtts, http=True) as px:
            first, proxied = run(px.host, px.port, n)
    finally:
        srv.shutdown()
    added = [(p - statistics.median(direct)) * 1e3 for p in proxied]
    return {
        "direct_p50_ms": statistics.median(direct) * 1e3,
        "proxied_p50_ms": statistics.median(proxied) * 1e3,
        "added_p50_ms": statistics.median(added),
        "overshoot_p50_ms": statistics.median(added) - 2 * delay_s * 1e3,
        "first_request_ms": first * 1e3,
        "expected_first_ms": 2 * delay_s * 1e3 * (1 + handshake_rtts),
    }


def self_test(delay_s: float = 0.0035, handshake_rtts: float = 2.0, n: int = 200) -> dict[str, Any]:
    """Measure what the proxy adds over a direct loopback echo. Returns a dict of ms figures."""
    echo = _Echo()
    try:
        _, direct = _rtts(echo.addr, n)
        with DelayProxy(echo.addr, delay_s, handshake_rtts) as px:
            firsts = [_rtts((px.host, px.port), 0)[0] for _ in range(5)]
            _, proxied = _rtts((px.host, px.port), n)
    finally:
        echo.close()

    def ms(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3

    expected_rtt = 2 * delay_s * 1e3
    added = [(p - statistics.median(direct)) * 1e3 for p in proxied]
    return {
        "delay_ms": delay_s * 1e3,
        "expected_rtt_ms": expected_rtt,
        "direct_p50_ms": ms(direct, 0.5),
        "proxied_p50_ms": ms(proxied, 0.5),
        "proxied_p99_ms": ms(proxied, 0.99),
        "proxied_max_ms": max(proxied) * 1e3,
        "added_p50_ms": statistics.median(added),
        "overshoot_p50_ms": statistics.median(added) - expected_rtt,
        "first_rtt_new_conn_p50_ms": statistics.median(firsts) * 1e3,
        "expected_first_rtt_ms": expected_rtt * (1 + handshake_rtts),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.proxy", description=__doc__.split("\n")[0])
    ap.add_argument("--upstream", help="host:port to forward to")
    ap.add_argument("--delay-ms", type=float, default=3.5, help="one-way delay (default 3.5)")
    ap.add_argument("--handshake-rtts", type=float, default=2.0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--http", action="store_true", help="HTTP/1.1-aware mode (see _http_conn)")
    ap.add_argument("--trace", metavar="FILE", help="HTTP mode: a JSON line per request")
    ap.add_argument(
        "--meter", metavar="FILE", help="HTTP mode: what DynamoDB would bill, to FILE (bench.meter)"
    )
    ap.add_argument("--meter-table", metavar="TABLE", help="--meter: the table it copies at start")
    ap.add_argument("--self-test", action="store_true", help="measure the added delay and exit")
    a = ap.parse_args(argv)
    if a.self_test:
        print("tcp mode (byte pipe, loopback echo):")
        for k, v in self_test(a.delay_ms / 1e3, a.handshake_rtts).items():
            print(f"  {k:28s} {v:8.3f}")
        print("http mode (keep-alive to the client, upstream closing after each response):")
        for k, v in http_self_test(a.delay_ms / 1e3, a.handshake_rtts).items():
            print(f"  {k:28s} {v:8.3f}")
        return 0
    if not a.upstream:
        ap.error("--upstream is required")
    host, _, port = a.upstream.rpartition(":")
    meter = None
    if a.meter:
        from .meter import Meter, seed_from_scan

        seed = seed_from_scan(f"http://{a.upstream}", a.meter_table) if a.meter_table else None
        meter = Meter(a.meter, seed)
    px = DelayProxy(
        (host, int(port)),
        a.delay_ms / 1e3,
        a.handshake_rtts,
        listen_port=a.port,
        http=a.http,
        trace=a.trace,
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

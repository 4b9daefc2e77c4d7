"""What the proxy (``fleet.proxy``) really adds: its delay measured against a direct loopback
echo, in TCP mode and in HTTP mode (``python -m fleet.proxy --self-test``)."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from typing import Any

from .proxy import Proxy


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

    def ahead(host: str, port: int) -> float:
        """A connection opened, then used once the handshakes had time to finish."""
        c = http.client.HTTPConnection(host, port)
        c.connect()
        time.sleep(2 * delay_s * (1 + handshake_rtts))
        t0 = time.perf_counter_ns()
        c.request("POST", "/", body=b"x" * 200)
        c.getresponse().read()
        c.close()
        return (time.perf_counter_ns() - t0) / 1e9

    try:
        _, direct = run(*addr, n)
        with Proxy(addr, delay_s, handshake_rtts, http=True) as px:
            first, proxied = run(px.host, px.port, n)
            opened_ahead = ahead(px.host, px.port)
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
        "opened_ahead_ms": opened_ahead * 1e3,
    }


def self_test(delay_s: float = 0.0035, handshake_rtts: float = 2.0, n: int = 200) -> dict[str, Any]:
    """Measure what the proxy adds over a direct loopback echo. Returns a dict of ms figures."""
    echo = _Echo()
    try:
        _, direct = _rtts(echo.addr, n)
        with Proxy(echo.addr, delay_s, handshake_rtts) as px:
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


def print_self_tests(delay_s: float, handshake_rtts: float) -> None:
    """Both self-tests, as a table of ms figures."""
    print("tcp mode (byte pipe, loopback echo):")
    for k, v in self_test(delay_s, handshake_rtts).items():
        print(f"  {k:28s} {v:8.3f}")
    print("http mode (keep-alive to the client, upstream closing after each response):")
    for k, v in http_self_test(delay_s, handshake_rtts).items():
        print(f"  {k:28s} {v:8.3f}")

"""CPU cost of one cached get_lease inside the daemon, without sockets: ``python -m bench.hotpath``.

Feeds encoded request frames to ``rasd.server.Connection.data_received`` (a cache hit is
answered right there) with a fake transport, and does the same with ``bench.echo.EchoConn``:
the difference is what the daemon spends per request above the IPC floor. Then prints the
top of a cProfile of the rasd loop. No DynamoDB, no event loop needed for a hit.
``--rounds``: the hit alone, median CPU per hit over 15 rounds and one hit's p50/p99 wall time
(for comparing two versions of the code, run one after the other).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from typing import Any

from rasd.config import Config
from rasd.core.lease import Lease, Pool
from rasd.server import Connection, Daemon
from rasd_client import wire

from .echo import EchoConn


class _FakeTransport:
    def __init__(self) -> None:
        self.out = 0

    def write(self, data: bytes) -> None:
        self.out += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None:
        pass


def _frames(n: int, exp_us: int) -> list[bytes]:
    return [
        wire.encode(
            {
                "v": 1,
                "id": i,
                "op": "get_lease",
                "client_id": "bench",
                "pool_id": "p",
                "key": f"k{i % 50}",
                "lease_expires_us": exp_us,
                "deadline_ms": 1000,
            }
        )
        for i in range(n)
    ]


def _setup(n: int) -> tuple[Connection, list[bytes]]:
    """A daemon with 50 cached leases and no DynamoDB, its connection, and n frames."""
    exp_us = int((time.time() + 7200) * 1e6)
    # confirm_interval: an hour, so that no hit of the run is past S/2 (a re-confirmation
    # would need an event loop, and is not what this measures)
    cfg = Config(
        table="t", socket="/nonexistent/x.sock", confirm_interval=3600.0, clock_check="date"
    )
    cfg = cfg.validate()
    daemon = Daemon(cfg)
    # What bring_up() does, minus DynamoDB: a store that is never started (a hit never uses
    # it), the roles, and "up".
    from rasd.daemon.coordinator import Coordinator
    from rasd.dynamo.store import Store

    store = Store(cfg, daemon.counters)
    roles = Coordinator(cfg, store, daemon.clock, daemon.counters)
    daemon.attach(store, roles)
    daemon.up.set()
    roles.pools[("bench", "p")] = Pool("bench", "p", 86400 * 1_000_000)
    now = roles.clock.mono()
    for i in range(50):
        roles.cache.put(
            Lease(
                "bench",
                "p",
                f"k{i}",
                f"res-{i}",
                "us-east-1",
                exp_us,
                1,
                exp_us - 10**9,
                f"{i:016x}",
            ),
            now,
        )
    conn = Connection(daemon.router)
    t = _FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    return conn, _frames(n, exp_us)


def measure(n: int = 50_000) -> dict[str, Any]:
    conn, frames = _setup(n)
    router = conn.server
    echo = EchoConn()
    echo.connection_made(_FakeTransport())  # type: ignore[arg-type]
    res: dict[str, Any] = {}
    for name, target in (("echo", echo), ("rasd", conn)):
        for f in frames[:2000]:
            target.data_received(f)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter_ns()
            for f in frames:
                target.data_received(f)
            best = min(best, (time.perf_counter_ns() - t0) / n / 1000)
        res[f"{name}_us_per_request"] = best
    hits = router.counters["cache.hit"]
    res["rasd_cache_hits"] = hits
    prof = cProfile.Profile()
    prof.enable()
    for f in frames:
        conn.data_received(f)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    res["profile"] = s.getvalue()
    return res


def rounds(k: int = 15, n: int = 20_000, timed: int = 5_000) -> dict[str, Any]:
    """CPU per hit (thread CPU time) of ``k`` rounds of ``n`` hits, and the wall time of each of
    ``timed`` single hits per round (``perf_counter_ns`` around each call: its own overhead
    included, the same for any code measured so); the garbage collector off while timing."""
    import gc
    import statistics

    conn, frames = _setup(n)
    feed = conn.data_received
    for f in frames[:timed]:
        feed(f)
    cpu_us: list[float] = []
    call_ns: list[int] = []
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for _ in range(k):
            t0 = time.thread_time_ns()
            for f in frames:
                feed(f)
            cpu_us.append((time.thread_time_ns() - t0) / n / 1000)
            for f in frames[:timed]:
                t = clock()
                feed(f)
                call_ns.append(clock() - t)
    finally:
        gc.enable()
    call_ns.sort()
    return {
        "cpu_us_per_hit_median": statistics.median(cpu_us),
        "cpu_us_per_hit_min": min(cpu_us),
        "cpu_us_per_hit_max": max(cpu_us),
        "call_ns_p50": call_ns[len(call_ns) // 2],
        "call_ns_p99": call_ns[int(len(call_ns) * 0.99)],
        "hits": conn.server.counters["cache.hit"],
    }


def pyinstrument_profile(n: int = 200_000) -> str:
    """The rasd loop of :func:`measure` under pyinstrument (sampling, 0.1 ms), as text."""
    from pyinstrument import Profiler

    conn, frames = _setup(n)
    prof = Profiler(interval=0.0001)
    prof.start()
    for f in frames:
        conn.data_received(f)
    prof.stop()
    return str(prof.output_text(unicode=False, color=False, show_all=False))


def main() -> int:
    if "--pyinstrument" in sys.argv[1:]:
        print(pyinstrument_profile())
        return 0
    if "--rounds" in sys.argv[1:]:
        r = rounds()
        print(
            f"cpu per hit  : median {r['cpu_us_per_hit_median']:.3f} us "
            f"(min {r['cpu_us_per_hit_min']:.3f}, max {r['cpu_us_per_hit_max']:.3f}; 15 x 20K)"
        )
        print(f"one hit, wall: p50 {r['call_ns_p50']} ns, p99 {r['call_ns_p99']} ns")
        return 0
    r = measure()
    print(f"echo (floor) : {r['echo_us_per_request']:.2f} us/request (decode + encode)")
    print(f"rasd (hit)   : {r['rasd_us_per_request']:.2f} us/request")
    print(f"cache hits   : {r['rasd_cache_hits']}")
    print(r["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One caller cannot take the host's leases away from the others: a daemon on moto's server,
one app flooding it with calls whose deadlines DynamoDB cannot meet, another app asking for
new keys beside it."""

from __future__ import annotations

import asyncio
import os
import resource
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from fleet.daemons import serve_argv
from rasd_client import aio as rasd_aio
from rasd_client.errors import RasdError
from tests.helpers.deadlines import WAIT, until
from tests.helpers.tables import seed_pool

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

HOUR = timedelta(hours=1)


async def test_one_callers_1ms_deadlines_leave_the_others_new_keys_answered(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """60 new keys asked one after another with a 1 ms deadline (each DynamoDB attempt cut
    after 1 ms) time out for their caller; they do not open the circuit breaker, so another
    client's new keys, asked right after, are all answered (with the cut attempts counted as
    failures, 20 of them opened it and the other client got UNAVAILABLE)."""
    seed_pool(ddb, table, client_id="other", count=70)
    seed_pool(ddb, table, client_id="demo", count=10)
    async with make_daemon() as d:
        sock = d.cfg.socket

        async def flood(i: int) -> str:
            try:
                await rasd_aio.get_lease(
                    "other", "default", f"f{i}", HOUR, socket_path=sock, timeout=0.001
                )
            except RasdError as exc:
                return f"{exc.code} {exc.message}"
            return "OK"

        # the client's connection first (a 1 ms timeout does not leave time to connect)
        await rasd_aio.get_lease("other", "default", "warm", HOUR, socket_path=sock, timeout=5)
        codes = [await flood(i) for i in range(60)]  # one at a time: past the gate
        # the flood reached the daemon and timed out there (an attempt cut after 1 ms, or,
        # on a loaded machine, a deadline that passed before the attempt could start)
        assert d.counters["err.TIMEOUT"] >= 20, (codes, d.counters.snapshot())
        leases = [
            await rasd_aio.get_lease("demo", "default", f"k{i}", HOUR, socket_path=sock, timeout=5)
            for i in range(10)
        ]
        assert all(lease.new for lease in leases)
        assert len({lease.resource for lease in leases}) == 10
        assert d.counters["ddb.timeouts_cut_short"] > 0, d.counters.snapshot()
        assert d.stats()["breaker"] == "closed"


async def test_one_clients_flood_of_table_calls_leaves_the_others_theirs(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """``other`` sends 60 requests that each need DynamoDB (releases of keys it never held,
    new keys of pools that do not exist): past its ``call_rate_burst`` (10 here, then 1 a
    second) they are answered BUSY, with retry_after, before reaching the table; ``demo``'s
    new keys, asked right after, are all answered: each client_id has a budget of its own.
    Without the limit all 60 reached the table."""
    seed_pool(ddb, table, client_id="demo", count=5)
    async with make_daemon(call_rate_limit=1.0, call_rate_burst=10.0) as d:
        sock = d.cfg.socket
        t0 = time.monotonic()
        codes = []
        for i in range(60):
            try:
                if i % 2:
                    await rasd_aio.release(
                        "other", "default", f"r{i}", socket_path=sock, timeout=WAIT
                    )
                else:
                    await rasd_aio.get_lease(
                        "other", f"none{i}", "k", HOUR, socket_path=sock, timeout=WAIT
                    )
                codes.append("OK")
            except RasdError as exc:
                codes.append(exc.code)
                assert exc.code != "BUSY" or exc.retry_after is not None, exc
        elapsed = time.monotonic() - t0
        busy = codes.count("BUSY")
        assert 60 - busy <= 10 + elapsed * 1.0 + 1, (elapsed, codes)
        assert d.counters["shed.call_rate_limited"] == busy, d.counters.snapshot()
        leases = [
            await rasd_aio.get_lease(
                "demo", "default", f"k{i}", HOUR, socket_path=sock, timeout=WAIT
            )
            for i in range(5)
        ]
        assert all(lease.new for lease in leases)


#: A process that opens N connections to the socket and holds them (until killed); prints
#: how many the kernel accepted.
HOLD = """
import socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
held, end = [], time.monotonic() + 20
while len(held) < n and time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(1.0)
    try:
        s.connect(path)
    except OSError:
        s.close()
        continue
    held.append(s)
print(len(held), flush=True)
time.sleep(120)
"""


#: Another process, connecting after the flood: a new key, then its hit; prints whether each
#: was new and its resource.
ASK = """
import sys
from datetime import timedelta
import rasd_client
for _ in range(2):
    lease = rasd_client.get_lease(
        "demo", "default", "k", timedelta(hours=1), socket_path=sys.argv[1], timeout=10
    )
    print(lease.new, lease.resource)
"""


def test_one_process_holding_1500_connections_leaves_another_served(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    """A daemon with 1,024 files (``rasd serve``, its own process): another process opens
    1,500 connections and holds them. It keeps its 256 (``max_connections_per_process``),
    the rest are closed at once, and this process's new key and hit are answered (without
    the limit the daemon ran out of files: no new connection, no DynamoDB connection)."""
    seed_pool(ddb, table, count=5)
    sock = str(short_tmp / "d.sock")

    def files_1024() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    env = {"RASD_ACL_OPEN": "true", **os.environ, "PYTHONPATH": str(ROOT)}
    daemon = subprocess.Popen(
        serve_argv(sock, table, moto_endpoint), env=env, preexec_fn=files_1024
    )
    flood = None
    try:
        until_ready(sock, daemon)
        flood = subprocess.Popen(
            [sys.executable, "-c", HOLD, sock, "1500"], stdout=subprocess.PIPE, text=True
        )
        assert flood.stdout is not None
        assert int(flood.stdout.readline()) == 1500  # the kernel took every one
        # another process, on a connection of its own made now: a new key, then its hit
        asked = subprocess.run(
            [sys.executable, "-c", ASK, sock], env=env, capture_output=True, text=True
        )
        assert asked.returncode == 0, asked.stderr
        new, resource_1, cached, resource_2 = asked.stdout.split()
        assert (new, cached) == ("True", "False") and resource_1 == resource_2
        stats = rasd_client.call_raw("stats", socket_path=sock, timeout=WAIT)
        assert stats["counters"].get("conn.refused.process", 0) >= 1, stats["counters"]
        # the flood's 256 and this call's own; the asking process's, closed as it exited,
        # may not be reaped yet when stats answers: asked again until it is
        deadline = time.monotonic() + WAIT
        while stats["connections"] > 256 + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
            stats = rasd_client.call_raw("stats", socket_path=sock, timeout=WAIT)
        assert stats["connections"] <= 256 + 1, stats
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        daemon.terminate()
        daemon.wait(timeout=WAIT)


def until_ready(sock: str, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        assert proc.poll() is None, "the daemon exited"
        try:
            if rasd_client.call_raw("ping", socket_path=sock, timeout=1.0)["ready"]:
                return
        except RasdError:
            pass
        time.sleep(0.1)
    raise AssertionError("the daemon never became ready")


async def demo_lease(sock: str) -> Any:
    return await rasd_aio.get_lease("demo", "default", "k", HOUR, socket_path=sock, timeout=WAIT)


async def test_half_sent_frames_stay_within_the_bound_and_are_closed(
    ddb: Any, table: str, make_daemon: Any, socket_only: None
) -> None:
    """40 connections each send 65,535 bytes of a 65,536-byte frame: the daemon holds at most
    ``max_buffered_bytes`` (1 MiB here) of them, closing the connections past it; the rest
    are closed after ``frame_timeout`` (3 s); a client beside them is served throughout."""
    seed_pool(ddb, table, count=5)
    bound = 1 << 20
    async with make_daemon(max_buffered_bytes=bound, frame_timeout=3.0) as d:
        sock = d.cfg.socket
        limits = d.router.limits
        writers = []
        for _ in range(40):
            reader, writer = await asyncio.open_unix_connection(sock)
            writer.write(struct.pack(">I", 65536) + b"\x00" * 65535)
            writers.append((reader, writer))
        most = 0

        def past_the_bound() -> bool:
            nonlocal most
            most = max(most, limits.buffered)
            return d.counters["conn.closed.buffered"] >= 1

        await until(past_the_bound, lambda: f"{limits!r} {d.counters.snapshot()}", WAIT)
        lease = await demo_lease(sock)
        assert lease.new
        await until(
            lambda: limits.buffered == 0 and len(d.connections) <= 1,  # the client's own
            lambda: f"{limits!r} {d.counters.snapshot()}",
            WAIT,
        )
        assert most <= bound, most
        assert d.counters["conn.closed.frame_timeout"] >= 1, d.counters.snapshot()
        for reader, writer in writers:
            assert await asyncio.wait_for(reader.read(), WAIT) == b""  # closed by the daemon
            writer.close()


async def test_an_idle_connection_is_closed_and_the_clients_reconnect(
    ddb: Any, table: str, make_daemon: Any, socket_only: None
) -> None:
    """``idle_timeout`` (1 s here): connections that ask nothing are closed, the sync and the
    async client's alike; each client's next call goes out on a new connection and is
    answered, its lease the same."""
    seed_pool(ddb, table, count=5)

    def sync_lease(sock: str) -> Any:
        return rasd_client.get_lease("demo", "default", "k", HOUR, socket_path=sock, timeout=WAIT)

    loop = asyncio.get_running_loop()
    thread = ThreadPoolExecutor(1)  # one thread: the sync client's connection is per thread
    async with make_daemon(idle_timeout=1.0) as d:
        sock = d.cfg.socket
        first = await demo_lease(sock)
        first_sync = await loop.run_in_executor(thread, sync_lease, sock)
        await until(
            lambda: d.counters["conn.closed.idle"] >= 2, lambda: str(d.counters.snapshot()), WAIT
        )
        again = await demo_lease(sock)
        again_sync = await loop.run_in_executor(thread, sync_lease, sock)
        opened = d.counters["conn.opened"]
    thread.shutdown()
    assert again.resource == first.resource == first_sync.resource == again_sync.resource
    assert not again.new and not again_sync.new
    assert opened == 4  # each client connected twice: the idle close came between

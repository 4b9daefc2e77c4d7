"""A stop hands the listening socket over without dropping a call (docs/protocol.md, "Restarts").

The test plays systemd's part: it owns the listening socket (as rasd.socket does) and gives each
daemon a duplicate of it, as socket activation does. Daemon A serves, then stops while a request
is in flight; callers that connect meanwhile wait in the backlog; daemon B takes the socket
over. Checked: the in-flight request is answered by A, A closes the idle connections, the
backlog caller and the caller whose idle connection A closed are answered by B (the client
retries a connection closed before any reply once, within its deadline), and nothing fails.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from rasd.config import Config
from rasd.server import Daemon
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration


def _dup(sock: socket.socket) -> socket.socket:
    return socket.socket(fileno=os.dup(sock.fileno()))


async def test_stop_answers_what_it_read_and_the_next_daemon_answers_the_rest(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    seed_pool(ddb, table, count=10)
    path = str(short_tmp / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    cfg = Config(
        clock_check="date",
        table=table,
        endpoint_url=moto_endpoint,
        socket=path,
        ddb_warm_connections=1,
    ).validate()
    a = Daemon(cfg)
    await a.startup(_dup(listener))
    hour = timedelta(hours=1)

    def call(key: str, timeout: float, out: dict[str, Any]) -> None:
        try:
            out[key] = rasd_client.get_lease(
                "demo", "default", key, hour, socket_path=path, timeout=timeout
            )
        except Exception as exc:  # noqa: BLE001 - the test reports it
            out[key] = exc

    results: dict[str, Any] = {}
    # An idle connection in one worker thread (the sync client keeps one per thread).
    one = ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(one, call, "k-idle", 5.0, results)
    assert isinstance(results["k-idle"], rasd_client.Lease)

    # A slow request in flight when the stop begins: answered by A, not dropped.
    real = a.coordinator.acquirer.get_lease

    async def slow(*args: Any) -> Any:
        await asyncio.sleep(0.3)
        return await real(*args)

    a.coordinator.acquirer.get_lease = slow  # type: ignore[method-assign]
    inflight = threading.Thread(target=call, args=("k-inflight", 5.0, results))
    inflight.start()
    for _ in range(100):
        if a.inflight:
            break
        await asyncio.sleep(0.01)
    assert a.inflight, "the slow request never arrived"
    await a.shutdown(drain=2.0)
    await asyncio.to_thread(inflight.join)
    assert isinstance(results["k-inflight"], rasd_client.Lease), results["k-inflight"]
    assert not a.connections, "A left connections open"

    # Nobody accepts now: a new caller waits in the backlog; the idle thread's connection was
    # closed by A, so its next call is retried on a new connection.
    backlog = threading.Thread(target=call, args=("k-backlog", 5.0, results))
    backlog.start()
    await asyncio.sleep(0.2)
    assert "k-backlog" not in results

    b = Daemon(cfg)
    await b.startup(_dup(listener))
    try:
        await asyncio.to_thread(backlog.join)
        assert isinstance(results["k-backlog"], rasd_client.Lease), results["k-backlog"]
        # the same thread as before: its cached connection is the one A closed
        results.pop("k-idle")
        await loop.run_in_executor(one, call, "k-idle", 5.0, results)
        assert isinstance(results["k-idle"], rasd_client.Lease), results["k-idle"]
        assert b.counters.snapshot().get("conn.opened", 0) >= 2
    finally:
        one.shutdown()
        await b.shutdown(drain=2.0)
        listener.close()


def test_retry_after_a_close_uses_what_is_left_of_the_deadline(short_tmp: Path) -> None:
    """A server that closes every connection before replying: the client tries twice, the
    second time with only the rest of its deadline, and raises UNAVAILABLE in time."""
    import time

    path = str(short_tmp / "c.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    seen: list[int] = []

    def serve() -> None:
        from rasd_client import wire

        for _ in range(2):
            conn, _ = srv.accept()
            dec = wire.FrameDecoder()
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                dec.feed(data)
                frames = list(dec.frames())
                if frames:
                    seen.append(int(frames[0]["deadline_ms"]))  # type: ignore[index]
                    time.sleep(0.3)
                    break
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(rasd_client.Unavailable):
        rasd_client.call_raw("ping", socket_path=path, timeout=1.0)
    elapsed = time.monotonic() - t0
    t.join(5)
    srv.close()
    assert len(seen) == 2
    assert seen[0] == 1000
    assert seen[1] < 800, seen  # only what was left after the first attempt
    assert elapsed < 1.0 + 0.25 + 0.5

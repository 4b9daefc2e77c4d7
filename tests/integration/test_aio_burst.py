"""An async worker's first burst, against ``rasd serve`` on moto's server.

A web worker on an event loop (uvicorn, and Starlette on top) may start hundreds of
``await rasd_client.aio.get_lease(...)`` at once before any of them has connected. They must
share one connection to the daemon, all be answered, and leave no reader task behind for the
garbage collector ("Task was destroyed but it is pending!"). The daemon's listening socket
must queue a connect storm from many processes as deep as systemd's socket unit does.

Connections are counted by the daemon (``conn.opened`` in ``stats``), asked over the test's
one blocking-client connection, which is opened before the count starts. The last test runs
the burst through a real ASGI server: uvicorn, in its own process, serving
``tests/integration/_asgi_app.py``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import uvloop

import rasd_client
from rasd.server import LISTEN_BACKLOG
from rasd_client import Lease, aio, wire
from tests.helpers.fleet import start_daemon
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
C, P = "demo", "default"
HOUR = timedelta(hours=1)
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
#: keys leased before the burst (the burst's cache hits) and keys the burst leases anew
OLD_KEYS = [f"old-{i:02d}" for i in range(50)]
NEW_KEYS = [f"new-{i:02d}" for i in range(10)]


@pytest.fixture
def daemon(ddb: Any, table: str, moto_endpoint: str, short_tmp: Path) -> Iterator[str]:
    """``rasd serve --socket`` in its own process, its pool seeded and OLD_KEYS leased."""
    seed_pool(ddb, table, count=len(OLD_KEYS) + len(NEW_KEYS) + 20)
    sock = str(short_tmp / "rasd.sock")
    # the connect storm comes from one process (this one), past the 256 a process may hold
    proc = start_daemon(sock, table, moto_endpoint, max_connections_per_process="1000")
    try:
        yield sock
    finally:
        proc.send_signal(signal.SIGCONT)  # in case a test stopped it
        proc.terminate()
        proc.wait(timeout=30)


def opened(sock: str) -> int:
    counters = rasd_client.call_raw("stats", socket_path=sock, timeout=5)["counters"]
    return int(counters.get("conn.opened", 0))


def lease_old_keys(sock: str) -> dict[str, str]:
    return {
        k: rasd_client.get_lease(C, P, k, HOUR, socket_path=sock, timeout=5).resource
        for k in OLD_KEYS
    }


async def first_burst(sock: str, keys: list[str]) -> tuple[list[Any], list[str]]:
    """One get_lease per key, all started at once on a loop that has not used the client;
    then a full collection while the loop still runs. Returns the answers and what the
    loop's exception handler was told."""
    loop = asyncio.get_running_loop()
    problems: list[str] = []
    loop.set_exception_handler(lambda _loop, ctx: problems.append(str(ctx.get("message"))))
    got = await asyncio.gather(
        *(aio.get_lease(C, P, k, HOUR, socket_path=sock, timeout=5) for k in keys),
        return_exceptions=True,
    )
    gc.collect()
    await asyncio.sleep(0)
    await aio.close()
    return got, problems


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_first_burst_of_500_calls_uses_one_connection(
    daemon: str, loop: str, caplog: pytest.LogCaptureFixture, socket_only: None
) -> None:
    """500 concurrent get_lease calls as a loop's first use of the client (490 cache hits
    over 50 keys, 10 new keys): one connection to the daemon, 500 leases, each key's answers
    the same resource and no resource answered to two keys, no task destroyed pending."""
    sock = daemon
    held = lease_old_keys(sock)
    keys = [OLD_KEYS[i % len(OLD_KEYS)] for i in range(500 - len(NEW_KEYS))] + NEW_KEYS
    before = opened(sock)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            got, problems = runner.run(first_burst(sock, keys))
        gc.collect()
    after = opened(sock)

    errors = [(k, g) for k, g in zip(keys, got, strict=True) if not isinstance(g, Lease)]
    assert errors == []
    assert after - before == 1
    assert problems == []
    assert "Task was destroyed" not in caplog.text
    answers: dict[str, set[str]] = {}
    for k, lease in zip(keys, got, strict=True):
        answers.setdefault(k, set()).add(lease.resource)
    assert {k: answers[k] for k in OLD_KEYS} == {k: {r} for k, r in held.items()}
    resources = [r for rs in answers.values() for r in rs]
    assert len(resources) == len(set(resources)) == len(OLD_KEYS) + len(NEW_KEYS)


def test_serve_queues_a_connect_storm_as_deep_as_the_socket_unit(daemon: str) -> None:
    """``rasd serve --socket`` listens with systemd/rasd.socket's backlog: while the daemon
    is stopped (SIGSTOP, so it accepts nothing) 500 connects are all queued, none refused
    with EAGAIN, and each is served once it runs again."""
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    if somaxconn < 500:
        pytest.skip(f"net.core.somaxconn is {somaxconn}: the kernel caps any backlog there")
    sock = daemon
    pid = rasd_client.call_raw("stats", socket_path=sock, timeout=5)["pid"]
    assert LISTEN_BACKLOG >= 500
    queued: list[socket.socket] = []
    refused = 0
    os.kill(pid, signal.SIGSTOP)
    try:
        for _ in range(500):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(sock)
            except BlockingIOError:
                s.close()
                refused += 1
            else:
                queued.append(s)
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        assert refused == 0
        last = queued[-1]
        last.setblocking(True)
        last.settimeout(10)
        last.sendall(wire.encode({"v": 1, "id": 1, "op": "ping"}))
        decoder = wire.FrameDecoder()
        while not (frames := list(decoder.frames())):
            data = last.recv(65536)
            assert data, "the daemon closed the queued connection"
            decoder.feed(data)
        assert frames[0]["ok"] and frames[0]["id"] == 1
    finally:
        for s in queued:
            s.close()


def start_uvicorn(sock: str, loop: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """uvicorn (one worker process) serving the test app on a free loopback port, once it
    answers /health (which does not use the rasd client)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RASD_SOCKET": sock}
    args = ["--host", "127.0.0.1", "--port", str(port), "--loop", loop, "--lifespan", "off"]
    args += ["--no-access-log", "--log-level", "warning"]
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.integration._asgi_app:app", *args],
            env=env,
            cwd=ROOT,
            stderr=err,
        )
    try:
        for _ in range(600):
            assert proc.poll() is None, log.read_text()
            try:
                if asyncio.run(http_get(port, "/health"))[0] == 200:
                    return proc, port
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"uvicorn never answered: {log.read_text()}")
    except BaseException:
        proc.kill()
        proc.wait(timeout=30)
        raise


async def http_get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_uvicorn_workers_first_burst_uses_one_connection(
    daemon: str, loop: str, short_tmp: Path, socket_only: None
) -> None:
    """uvicorn's worker gets 500 concurrent HTTP requests, each calling
    ``await rasd_client.aio.get_lease``, before it has used the client: all are answered
    with a lease, its process opens one connection to the daemon, each key maps to one
    resource (the one it already held) and no task is destroyed pending."""
    sock = daemon
    held = lease_old_keys(sock)
    keys = [OLD_KEYS[i % len(OLD_KEYS)] for i in range(500 - len(NEW_KEYS))] + NEW_KEYS
    before = opened(sock)
    log = short_tmp / "uvicorn.log"
    proc, port = start_uvicorn(sock, loop, log)
    try:

        async def burst() -> list[tuple[int, dict[str, Any]]]:
            paths = [f"/lease?key={k}&together={len(keys)}" for k in keys]
            got = await asyncio.gather(*(http_get(port, p) for p in paths))
            await http_get(port, "/gc")
            return got

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            got = runner.run(burst())
        after = opened(sock)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    stderr = log.read_text()

    assert [(s, b) for s, b in got if s != 200] == []
    assert after - before == 1
    assert "Task was destroyed" not in stderr, stderr
    answers: dict[str, set[str]] = {}
    for _, body in got:
        answers.setdefault(body["key"], set()).add(body["resource"])
    assert {k: answers[k] for k in OLD_KEYS} == {k: {r} for k, r in held.items()}
    resources = [r for rs in answers.values() for r in rs]
    assert len(resources) == len(set(resources)) == len(OLD_KEYS) + len(NEW_KEYS)

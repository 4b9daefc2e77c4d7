"""A daemon never takes over, nor deletes, a socket another live process serves on.

A second ``rasd serve --socket S`` (or a second ``rasd dev``) used to replace S while the
first daemon listened on it, and to delete S at its exit: the first daemon then ran on,
unreachable (ENOENT). Now it refuses to start (exit 2, naming the path and how to find the
other process); it replaces only a stale socket (connect: ECONNREFUSED); and at exit it
removes the path only while it still names the inode it bound. A socket it inherits
(systemd's, LISTEN_FDS) it never removes.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from fleet.daemons import serve_argv
from rasd.config import Config
from rasd.server import Daemon
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOUR = timedelta(hours=1)


def listening(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    return s


def inode(path: str) -> int:
    return os.stat(path).st_ino


def _config(table: str, endpoint: str, path: str) -> Config:
    """A daemon on ``path`` (this machine's kernel keeps no synchronised clock: the Date
    header alone)."""
    return Config(
        table=table, endpoint_url=endpoint, socket=path, ddb_warm_connections=1, clock_check="date"
    ).validate()


async def lease(path: str, key: str = "k") -> rasd_client.Lease:
    return await asyncio.to_thread(
        rasd_client.get_lease, "demo", "default", key, HOUR, socket_path=path, timeout=5
    )


async def test_a_second_daemon_refuses_a_socket_a_live_daemon_serves(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """The second daemon exits 2 without touching the path; the first serves on."""
    seed_pool(ddb, table, count=3)
    async with make_daemon() as first:
        path = first.cfg.socket
        before = inode(path)
        other = Daemon(first.cfg)
        await asyncio.wait_for(other.run(), 10)
        assert other.exit_status == 2
        assert inode(path) == before
        assert (await lease(path)).resource
        with pytest.raises(Exception, match=re.escape(f"ss -xlp | grep {path}")):
            await Daemon(first.cfg).startup()
        assert inode(path) == before


async def test_exit_leaves_a_path_another_process_bound_since(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """Someone replaced the daemon's socket file: the daemon's exit leaves theirs alone."""
    seed_pool(ddb, table, count=3)
    async with make_daemon() as d:
        path = d.cfg.socket
        os.unlink(path)
        theirs = listening(path)
        mine = inode(path)
    try:
        assert os.path.exists(path) and inode(path) == mine
    finally:
        theirs.close()


async def test_exit_removes_its_own_socket(ddb: Any, table: str, make_daemon: Any) -> None:
    seed_pool(ddb, table, count=3)
    async with make_daemon() as d:
        path = d.cfg.socket
        assert os.path.exists(path)
    assert not os.path.exists(path)


async def test_a_stale_socket_is_replaced(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    """A socket file nobody accepts on (its daemon crashed) is replaced, as before."""
    seed_pool(ddb, table, count=3)
    path = str(short_tmp / "stale.sock")
    listening(path).close()  # bound, then closed without unlinking: ECONNREFUSED
    d = Daemon(_config(table, moto_endpoint, path))
    await d.startup()
    try:
        assert (await lease(path)).resource
    finally:
        await d.shutdown(drain=2.0)
    assert not os.path.exists(path)


async def test_a_path_that_is_not_a_socket_is_refused(
    table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    path = short_tmp / "not-a-socket"
    path.write_text("keep me")
    cfg = Config(
        table=table, endpoint_url=moto_endpoint, socket=str(path), clock_check="date"
    ).validate()
    d = Daemon(cfg)
    await asyncio.wait_for(d.run(), 10)
    assert d.exit_status == 2
    assert path.read_text() == "keep me"


async def test_an_inherited_socket_is_never_removed(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    """Under socket activation the path is systemd's (rasd.socket): the daemon's exit leaves
    it, whatever its config's ``socket`` says."""
    seed_pool(ddb, table, count=3)
    path = str(short_tmp / "activated.sock")
    sock = listening(path)
    d = Daemon(_config(table, moto_endpoint, path))
    await d.startup(sock)
    try:
        assert (await lease(path)).resource
    finally:
        await d.shutdown(drain=2.0)
    assert os.path.exists(path)
    sock.close()


async def test_rasd_serve_on_a_live_socket_exits_2_naming_it(
    ddb: Any, table: str, moto_endpoint: str, make_daemon: Any
) -> None:
    """``rasd serve --socket S`` while a daemon serves on S: exit 2 at once, the message names
    S and ``ss -xlp``; the first daemon keeps serving on S."""
    seed_pool(ddb, table, count=3)
    async with make_daemon() as first:
        path = first.cfg.socket
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "LISTEN_"))}
        proc = await asyncio.create_subprocess_exec(
            *serve_argv(path, table, moto_endpoint, log_level=None),
            cwd=ROOT,
            env={**env, "PYTHONPATH": str(ROOT), "RASD_ACL_OPEN": "true"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        text = err.decode()
        assert proc.returncode == 2, text
        assert "startup_refused" in text and path in text and "ss -xlp" in text, text
        assert os.path.exists(path)
        assert (await lease(path)).resource


@pytest.mark.serial
def test_rasd_dev_twice_refuses_and_the_first_serves_on() -> None:
    """A second ``rasd dev`` in the same directory says another one serves there (exit 2)
    before starting anything; the first keeps serving and stops cleanly."""
    workdir = tempfile.mkdtemp(prefix="rasd-dev-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LISTEN_"))}
    argv = [sys.executable, "-m", "rasd", "dev", "--dir", workdir, "--resources", "5"]
    first = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        banner = []
        assert first.stdout is not None
        for line in first.stdout:
            banner.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        found = re.search(r"socket: (\S+)", "".join(banner))
        assert found, banner
        path = found.group(1)
        t0 = time.monotonic()
        again = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 2, again
        assert f"another process is serving on {path}" in again.stderr, again.stderr
        assert "another `rasd dev" in again.stderr, again.stderr
        assert "rasd dev is up" not in again.stdout
        assert time.monotonic() - t0 < 30  # refused before moto and the seeding
        got = rasd_client.get_lease("demo", "default", "k", HOUR, socket_path=path, timeout=10)
        assert got.resource.startswith("demo-")
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()

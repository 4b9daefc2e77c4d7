"""The hit table against a real daemon on moto over HTTP: answers read from shared memory
without the daemon, touches past S/2, what the table must never answer (a release on another
worker, a lease end the pool refuses, another ACL group's leases)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from rasd_client import _table
from rasd_client import aio as rasd_aio
from tests.helpers.deadlines import WAIT, until
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
C, P = "demo", "default"
TEN_MIN = timedelta(minutes=10)


def get(sock: str, key: str, ends: Any = TEN_MIN, client_id: str = C) -> rasd_client.Lease:
    return rasd_client.get_lease(client_id, P, key, ends, socket_path=sock, timeout=WAIT)


async def table_for(sock: str, client_id: str = C) -> None:
    """Wait until this process reads ``client_id``'s table (a thread asks for it after the
    first answer over the socket)."""

    def has() -> bool:
        holder = _table.current.holders.get(sock)
        return holder is not None and client_id in holder.tables

    await until(has, f"a table for {client_id}")


async def test_answers_come_from_the_table_without_the_daemon(
    ddb: Any, table: str, make_daemon: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """After the first answer over the socket, the same key is answered from the table: the
    daemon counts no hit for it. A lease end the pool refuses is still the daemon's to name.
    A release takes the key out before it answers, and the next call asks the daemon."""
    seed_pool(ddb, table, count=10, max_lease_s=3600)
    caplog.set_level(logging.DEBUG, logger="rasd_client")
    async with make_daemon() as d:
        s = d.cfg.socket
        first = await asyncio.to_thread(get, s, "k")
        await table_for(s)
        hits, served = d.counters.hits, _table.current.hits
        leases = await asyncio.to_thread(lambda: [get(s, "k") for _ in range(200)])
        assert {(x.resource, x.version, x.new) for x in leases} == {
            (first.resource, first.version, False)
        }
        assert d.counters.hits == hits and _table.current.hits == served + 200
        said = [r.getMessage() for r in caplog.records if r.name == "rasd_client"]
        assert sum(m.endswith("k: from the hit table") for m in said) == 200
        # sliding asks (now + 10 min): the first touches, the daemon tells the table when an
        # extension is due for asks that long, and the others are quiet
        await until(lambda: d.counters["table.touches"] >= 1, "the first touch")
        await asyncio.to_thread(lambda: [get(s, "k") for _ in range(200)])
        assert d.counters["table.touches"] <= 3, d.counters["table.touches"]
        assert rasd_client.table_stats()["tables"] >= 1
        stats = await rasd_aio.call_raw("stats", socket_path=s, timeout=WAIT)
        assert stats["hit_table"]["entries"] == 1 and stats["hit_table"]["tables"] == 1
        with pytest.raises(rasd_client.BadRequest, match="maximum lease"):
            await asyncio.to_thread(get, s, "k", timedelta(hours=2))
        await rasd_aio.release(C, P, "k", socket_path=s, timeout=WAIT)
        served = _table.current.hits
        again = await asyncio.to_thread(get, s, "k")
        assert again.new and _table.current.hits == served


async def test_with_hit_table_off_every_call_is_the_daemons(
    ddb: Any, table: str, make_daemon: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``hit_table = false``: the daemon refuses ``table`` (the client asks over the socket
    from then on, and says so at DEBUG); on, the client's log names the table."""
    seed_pool(ddb, table, count=5)
    caplog.set_level(logging.DEBUG, logger="rasd_client")
    async with make_daemon(hit_table=False) as d:
        s = d.cfg.socket
        await asyncio.to_thread(get, s, "k")
        await until(lambda: (s, C) in _table.current.refused, "the table refused")
        hits = d.counters.hits
        await asyncio.to_thread(lambda: [get(s, "k") for _ in range(20)])
        assert d.counters.hits == hits + 20 and d.counters.snapshot().get("table.handed") is None
        stats = await rasd_aio.call_raw("stats", socket_path=s, timeout=WAIT)
        assert stats["hit_table"] is None
    said = [r.getMessage() for r in caplog.records if r.name == "rasd_client"]
    assert any(m.endswith("k: over the socket") for m in said), said[-3:]
    assert not any("hit table" in m for m in said)


async def test_past_half_of_s_a_table_answer_touches_and_the_daemon_reconfirms(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """With S = 3 s, an answer served from the table past 1.5 s sends a touch; the daemon
    re-confirms (a consistent read) and publishes the entry again, so the key is served from
    the table past S with no miss: every call of 3.6 s is the table's, none reaches the
    daemon's cache (the re-confirmation has 1.5 s, under the flake hunt's stalls of 0.7 s)."""
    seed_pool(ddb, table, count=5)
    async with make_daemon(confirm_interval=3.0) as d:
        s = d.cfg.socket
        await asyncio.to_thread(get, s, "k")
        await table_for(s)
        start = time.monotonic()
        served, seen = _table.current.hits, d.counters.snapshot()
        calls = 0
        while time.monotonic() - start < 3.6:  # past S: served on only if re-confirmed
            await asyncio.to_thread(get, s, "k")
            calls += 1
            await asyncio.sleep(0.05)
        now = d.counters.snapshot()
        assert now.get("table.touches", 0) >= 1 and now.get("lease.reconfirmed", 0) >= 1, now
        assert _table.current.hits - served == calls
        for asked in ("cache.miss", "cache.hit"):  # the daemon answered none of them
            assert now.get(asked, 0) == seen.get(asked, 0), (asked, now)


async def test_no_worker_reads_a_released_lease_from_the_table(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """Four worker processes read eight keys as fast as they can while this process releases
    them one after another: no worker's call that began after a release returned is answered
    from the table with the lease released (docs/design.md, "The hit table")."""
    seed_pool(ddb, table, count=300)
    keys = [f"k{i}" for i in range(8)]
    async with make_daemon(acl_open=True) as d:
        s = d.cfg.socket
        for k in keys:
            await rasd_aio.get_lease(C, P, k, TEN_MIN, socket_path=s, timeout=WAIT)
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.integration._table_worker",
                s,
                str(seed),
                "3.0",
                *keys,
                stdout=subprocess.PIPE,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            for seed in range(4)
        ]
        await asyncio.sleep(1.0)  # the workers have their tables
        released: list[tuple[float, str, str]] = []
        for i in range(40):
            k = keys[i % len(keys)]
            lease = await rasd_aio.get_lease(C, P, k, TEN_MIN, socket_path=s, timeout=WAIT)
            await rasd_aio.release(C, P, k, socket_path=s, timeout=WAIT)
            released.append((time.monotonic(), k, lease.resource))
            await asyncio.sleep(0.03)
        outs = [await p.communicate() for p in procs]
    reads = [json.loads(line) for out, _ in outs for line in out.splitlines()]
    from_table = [r for r in reads if r["path"] == "table"]
    assert len(from_table) > 200, f"only {len(from_table)} answers from the table"
    late = [
        (r, done)
        for done, k, resource in released
        for r in from_table
        if r["key"] == k and r["resource"] == resource and r["began"] > done
    ]
    assert not late, f"a released lease answered from the table: {late[:3]}"
    assert sum(r["new"] for r in reads) >= 1  # some worker asked the daemon after a release


async def test_a_forked_child_asks_for_its_own_table(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """After fork() the child holds none of its parent's tables (their holder connection is
    the parent's): its first call goes over the socket, then it gets a table of its own."""
    seed_pool(ddb, table, count=5)
    async with make_daemon() as d:
        s = d.cfg.socket
        parent = await asyncio.to_thread(get, s, "k")
        await table_for(s)

        def child() -> dict[str, Any]:
            before = rasd_client.table_stats()
            first = get(s, "k")
            deadline = time.monotonic() + WAIT
            while rasd_client.table_stats()["tables"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            again = get(s, "k")
            return {
                "before": before,
                "same": first.resource == again.resource == parent.resource,
                "after": rasd_client.table_stats(),
            }

        def fork_and_wait() -> dict[str, Any]:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    os.write(w, json.dumps(child()).encode())
                finally:
                    os._exit(0)
            os.close(w)
            raw = _read_all(r)
            os.waitpid(pid, 0)
            return dict(json.loads(raw))

        seen = await asyncio.to_thread(fork_and_wait)
    assert seen["before"] == {"tables": 0, "hits": 0, "touches": 0}, seen
    assert seen["same"] and seen["after"]["tables"] == 1 and seen["after"]["hits"] == 1, seen


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another uid")
async def test_a_process_reads_only_the_tables_its_acl_grants(
    ddb: Any, table: str, make_daemon: Any, short_tmp: Path
) -> None:
    """Two users: root may use "demo", uid 65534 "other". A process of 65534 is refused
    "demo"'s table, gets its own, in which none of "demo"'s leases is, and cannot reach the
    daemon's fds through /proc."""
    seed_pool(ddb, table, count=5)
    seed_pool(ddb, table, client_id="other", count=5, prefix="o-")
    short_tmp.chmod(0o755)
    acl = {f"uid.{os.getuid()}": [C], "uid.65534": ["other"]}
    async with make_daemon(acl=acl, socket_mode=0o666) as d:
        s = d.cfg.socket
        await rasd_aio.get_lease(C, P, "shared-key", TEN_MIN, socket_path=s, timeout=WAIT)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the other user
            os.close(r)
            os.write(w, json.dumps(_as_other_user(s, os.getppid())).encode())
            os._exit(0)
        os.close(w)
        raw = await asyncio.to_thread(_read_all, r)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
    assert status == 0
    seen = json.loads(raw)
    assert seen["demo_table"].startswith("refused"), seen
    assert seen["other_table"] == "ok", seen
    assert seen["demo_key_in_other_table"] is False
    assert seen["proc_fds"] == "PermissionError"


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _as_other_user(sock: str, daemon_pid: int) -> dict[str, Any]:
    """Run in a forked child: become uid/gid 65534, then try what the test reports."""
    out: dict[str, Any] = {}
    try:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        tables = _table.Tables()
        try:
            tables._fetch(None, sock, C, 5.0)
            out["demo_table"] = "given"
        except (OSError, ValueError) as exc:
            out["demo_table"] = f"refused: {exc}"
        holder, mine = tables._fetch(None, sock, "other", 5.0)
        out["other_table"] = "ok"
        out["demo_key_in_other_table"] = mine.find(f"{P}shared-key".encode(), len(P)) is not None
        try:
            os.listdir(f"/proc/{daemon_pid}/fd")
            out["proc_fds"] = "listed"
        except PermissionError:
            out["proc_fds"] = "PermissionError"
        holder.close()
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out["error"] = repr(exc)
    return out

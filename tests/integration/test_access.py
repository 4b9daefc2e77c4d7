"""Who may call, and the daemon's life under a service manager.

* the ACL: the kernel-reported uid/gid of the peer (SO_PEERCRED) against ``[acl]``;
* SIGHUP reloads the ACL live, and a broken config on reload keeps the old one;
* sd_notify: READY=1 only once the daemon answers, WATCHDOG=1 pings, STOPPING=1 on SIGTERM;
* socket activation: a restart on the same inherited listening socket under load fails no
  client call (pending connections wait in the kernel's backlog).

The subprocess tests run ``python -m rasd serve`` against moto's server over HTTP.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from fleet.daemons import serve_argv
from rasd_client import aio as rasd_aio
from rasd_client import wire
from tests.helpers.deadlines import WAIT
from tests.helpers.fleet import audit
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
C, P = "demo", "default"
HOUR = timedelta(hours=1)
UID = os.getuid()


# ------------------------------------------------------------------------------ helpers
def fresh_get_lease(sock: str, client_id: str, key: str = "k") -> dict[str, Any]:
    """One get_lease on a brand-new connection (so the grant is computed afresh); the raw
    response map."""
    req = {
        "v": 1,
        "id": 1,
        "op": "get_lease",
        "client_id": client_id,
        "pool_id": P,
        "key": key,
        "lease_expires_us": (time.time_ns() // 1000) + 3600 * 1_000_000,
        "deadline_ms": 5000,
    }
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    try:
        s.connect(sock)
        s.sendall(wire.encode(req))
        dec = wire.FrameDecoder()
        while True:
            chunk = s.recv(65536)
            assert chunk, "daemon closed the connection without answering"
            dec.feed(chunk)
            for frame in dec.frames():
                assert isinstance(frame, dict)
                return frame
    finally:
        s.close()


def serve_env(acl_open: bool = True, **extra: str) -> dict[str, str]:
    """The environment of a ``rasd serve`` of these tests: ``acl_open``, every client_id open
    where the config has no [acl] (``RASD_ACL_OPEN``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RASD_ACL_OPEN", None)
    if acl_open:
        env["RASD_ACL_OPEN"] = "true"
    for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_PID", "LISTEN_FDS"):
        env.pop(var, None)
    env.update(extra)
    return env


def wait_ready(proc: subprocess.Popen[bytes], sock: str, log: Path) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            # The daemon answers ping with ready=False while it is still starting.
            if rasd_client.call_raw("ping", socket_path=sock, timeout=1.0)["ready"]:
                return
        except rasd_client.RasdError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"daemon never became ready: {log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


class NotifyListener:
    """The service manager's side of sd_notify: a bound AF_UNIX datagram socket."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(30)
        self.seen: list[dict[str, str]] = []

    def next(self) -> dict[str, str]:
        data = self.sock.recv(4096)
        msg = dict(line.split("=", 1) for line in data.decode().splitlines())
        self.seen.append(msg)
        return msg

    def wait_for(self, field: str) -> dict[str, str]:
        for _ in range(200):
            msg = self.next()
            if field in msg:
                return msg
        raise AssertionError(f"no {field} among {self.seen[-10:]}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(short_tmp: Path) -> Iterator[NotifyListener]:
    n = NotifyListener(short_tmp / "notify.sock")
    yield n
    n.close()


# ---------------------------------------------------------------------------------- ACL
async def test_acl_forbids_unlisted_uid(ddb: Any, table: str, make_daemon: Any) -> None:
    """A caller whose uid (root here) is not in a non-empty ACL gets FORBIDDEN, for every op:
    those that name a client_id, ``ping`` (for a caller that may use some client_id) and
    ``stats`` (every client's pools)."""
    seed_pool(ddb, table, count=3)
    async with make_daemon(acl={"uid.4242": [C]}) as d:
        s = d.cfg.socket
        with pytest.raises(rasd_client.Forbidden):
            await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=s, timeout=WAIT)
        with pytest.raises(rasd_client.Forbidden):
            await rasd_aio.release(C, P, "k", socket_path=s, timeout=WAIT)
        with pytest.raises(rasd_client.Forbidden):
            await rasd_aio.headroom(C, P, socket_path=s, timeout=WAIT)
        for op in ("ping", "stats"):
            with pytest.raises(rasd_client.Forbidden):
                await rasd_aio.call_raw(op, socket_path=s, timeout=WAIT)
        assert d.counters["err.FORBIDDEN"] == 5
        assert d.counters.snapshot().get("ddb.UpdateItem", 0) == 0


async def test_acl_allows_listed_uid_for_its_client_ids_only(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """A uid listed for "demo" may use "demo" and nothing else (``ping`` too, not ``stats``);
    a gid entry grants the same way; "*" grants every client_id, and ``stats``. Its requests
    wait for their answers (``WAIT``): at the client's default 1 s one timed out under the
    flake hunt's load before its first try."""
    seed_pool(ddb, table, count=3)
    seed_pool(ddb, table, client_id="other", count=3, prefix="o-")
    async with make_daemon(acl={f"uid.{UID}": [C]}) as d:
        s = d.cfg.socket
        assert (await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=s, timeout=WAIT)).new
        with pytest.raises(rasd_client.Forbidden):
            await rasd_aio.get_lease("other", P, "k", HOUR, socket_path=s, timeout=WAIT)
        assert (await rasd_aio.call_raw("ping", socket_path=s, timeout=WAIT))["ready"]
        with pytest.raises(rasd_client.Forbidden, match='a grant of "\\*"'):
            await rasd_aio.call_raw("stats", socket_path=s, timeout=WAIT)
    async with make_daemon(acl={f"gid.{os.getgid()}": ["other"]}) as d:
        s = d.cfg.socket
        assert (await rasd_aio.get_lease("other", P, "k", HOUR, socket_path=s, timeout=WAIT)).new
        with pytest.raises(rasd_client.Forbidden):
            await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=s, timeout=WAIT)
    async with make_daemon(acl={f"uid.{UID}": ["*"], "uid.4242": [C]}) as d:
        s = d.cfg.socket
        assert not (await rasd_aio.get_lease(C, P, "k", HOUR, socket_path=s, timeout=WAIT)).new
        assert not (
            await rasd_aio.get_lease("other", P, "k", HOUR, socket_path=s, timeout=WAIT)
        ).new
        with pytest.raises(rasd_client.UnknownPool):  # allowed; the pool just does not exist
            await rasd_aio.get_lease("nobody", P, "k", HOUR, socket_path=s, timeout=WAIT)
        assert "counters" in await rasd_aio.call_raw("stats", socket_path=s, timeout=WAIT)


# ------------------------------------------------------------------------------ SIGHUP
def write_config(path: Path, table: str, endpoint: str, sock: str, acl_lines: str) -> None:
    path.write_text(
        f'table = "{table}"\nregion = "us-east-1"\nendpoint_url = "{endpoint}"\n'
        f'socket = "{sock}"\nlog_level = "warning"\nddb_warm_connections = 1\n\n'
        f"[acl]\n{acl_lines}\n"
    )


def test_sighup_reloads_acl_and_keeps_old_config_when_broken(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path, notify: NotifyListener
) -> None:
    """SIGHUP re-reads the config file: a new ACL applies to new connections at once, with no
    restart. A reload of a broken file (bad TOML, bad ACL entry, no ACL at all without
    ``acl_open``) is refused: the old ACL stays in force and the daemon keeps serving."""
    seed_pool(ddb, table, count=3)
    seed_pool(ddb, table, client_id="other", count=3, prefix="o-")
    cfg, sock, log = short_tmp / "rasd.toml", str(short_tmp / "r.sock"), short_tmp / "r.log"
    write_config(cfg, table, moto_endpoint, sock, f'"uid.{UID}" = ["{C}"]')
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rasd", "serve", "--config", str(cfg)],
            env=serve_env(NOTIFY_SOCKET=notify.path, acl_open=False),
            stderr=err,
            cwd=ROOT,
        )
    no_acl = short_tmp / "no-acl.toml"
    write_config(no_acl, table, moto_endpoint, sock, "")
    try:
        notify.wait_for("READY")
        assert fresh_get_lease(sock, C)["ok"]
        assert fresh_get_lease(sock, "other")["code"] == "FORBIDDEN"

        write_config(cfg, table, moto_endpoint, sock, f'"uid.{UID}" = ["other"]')
        proc.send_signal(signal.SIGHUP)
        assert "MONOTONIC_USEC" in notify.wait_for("RELOADING")
        assert notify.wait_for("READY")["STATUS"] == "reloaded"
        assert fresh_get_lease(sock, C)["code"] == "FORBIDDEN"
        assert fresh_get_lease(sock, "other")["ok"]

        bad_acl = f'[acl]\n"user.no-such-user-{UID}" = ["{C}"]\n'
        for broken in ("[acl\nnot toml", bad_acl, no_acl.read_text()):
            cfg.write_text(broken)
            proc.send_signal(signal.SIGHUP)
            notify.wait_for("RELOADING")
            assert notify.wait_for("READY")["STATUS"] == "reload failed; old config kept"
            assert fresh_get_lease(sock, "other")["ok"]
            assert fresh_get_lease(sock, C)["code"] == "FORBIDDEN"
            assert proc.poll() is None
        assert stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert log.read_text().count("reload_failed") == 3
    assert "no [acl]: every user who can open the socket" in log.read_text()


def test_serve_without_an_acl_refuses_to_start(
    table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    """No [acl] and no ``acl_open``: ``rasd serve`` stops at once, exit 2, saying why and what
    to write, before it binds the socket (every local user who could open it would otherwise
    use every client_id)."""
    cfg, sock = short_tmp / "rasd.toml", str(short_tmp / "r.sock")
    write_config(cfg, table, moto_endpoint, sock, "")
    argv = [sys.executable, "-m", "rasd", "serve", "--config", str(cfg)]
    out = subprocess.run(
        argv, env=serve_env(acl_open=False), cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2, out.stderr
    assert "rasd: no [acl]: every user who can open the socket" in out.stderr, out.stderr
    assert "set acl_open = true" in out.stderr
    assert "Traceback" not in out.stderr
    assert not os.path.exists(sock)


# ----------------------------------------------------------------------------- sd_notify
def test_sd_notify_ready_watchdog_stopping(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path, notify: NotifyListener
) -> None:
    """READY=1 is sent only once the daemon is warm and answering (DynamoDB connection
    opened, pools loaded, socket listening): the first message is READY=1, and a ping right
    after it is answered ready. WATCHDOG=1 pings follow (WATCHDOG_USEC=200000 -> every 0.1 s).
    SIGTERM sends STOPPING=1 and the process exits 0."""
    seed_pool(ddb, table, count=3)
    sock, log = str(short_tmp / "n.sock"), short_tmp / "n.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            serve_argv(sock, table, moto_endpoint),
            env=serve_env(NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="200000"),
            stderr=err,
            cwd=ROOT,
        )
    try:
        first = notify.next()
        assert first.get("READY") == "1", f"first notification was {first}"
        assert "1 pools" in first["STATUS"]
        # no polling: the daemon must already answer when READY=1 arrives
        stats = rasd_client.call_raw("stats", socket_path=sock, timeout=5)
        assert stats["ready"] and stats["pools"] == 1
        assert stats["counters"]["ddb.GetItem"] >= 1, "warm-up call made before READY"
        assert stats["pid"] == proc.pid
        assert fresh_get_lease(sock, C)["ok"]
        pings = 0
        while pings < 3:
            msg = notify.next()
            assert "READY" not in msg and "STOPPING" not in msg, msg
            pings += msg.get("WATCHDOG") == "1"
        proc.send_signal(signal.SIGTERM)
        assert notify.wait_for("STOPPING")["STOPPING"] == "1"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not os.path.exists(sock), "the daemon removes the socket it bound"


# --------------------------------------------------------------------- socket activation
#: Exec ``rasd serve`` with the listening socket as fd 3 and LISTEN_PID = its own pid, as
#: systemd does (the pid is only known after fork, hence the wrapper).
ACTIVATE = (
    "import os, sys\n"
    "fd = int(sys.argv[1])\n"
    "if fd != 3:\n"
    "    os.dup2(fd, 3)\n"
    "    os.close(fd)\n"
    "os.environ['LISTEN_FDS'] = '1'\n"
    "os.environ['LISTEN_PID'] = str(os.getpid())\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'rasd', 'serve', *sys.argv[2:]])\n"
)


def activated(listener: socket.socket, table: str, endpoint: str, log: Path) -> Any:
    with log.open("ab") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                ACTIVATE,
                str(listener.fileno()),
                "--table",
                table,
                "--endpoint-url",
                endpoint,
                "--socket",
                "/nonexistent/ignored.sock",  # must not be used: the socket is inherited
                "--log-level",
                "warning",
            ],
            pass_fds=(listener.fileno(),),
            env=serve_env(),
            stderr=err,
            cwd=ROOT,
        )


def test_restart_on_inherited_socket_under_load_fails_no_call(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    """Socket activation: the listening socket belongs to the service manager, so a restart
    (SIGTERM, then a new daemon on the same fd) loses no connection attempt: callers wait in
    the kernel's backlog, and a connection the old daemon closes is re-opened once by the
    client. Under load (cached and new keys), every call succeeds, and the table audits clean.
    """
    seed_pool(ddb, table, count=300)
    path = str(short_tmp / "act.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    log = short_tmp / "act.log"
    first = activated(listener, table, moto_endpoint, log)
    second = None
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    calls = [0] * 4
    halt = threading.Event()
    lock = threading.Lock()

    def hammer(tid: int) -> None:
        rng = random.Random(tid)
        n = 0
        while not halt.is_set():
            n += 1
            # new keys, 50 a thread at most (answered from the table, the hot keys leave
            # the daemon free to take new ones as fast as it can: 300 resources hold them)
            key = f"new-{tid}-{n // 4 % 50}" if n % 4 == 0 else f"hot-{rng.randrange(30)}"
            try:
                lease = rasd_client.get_lease(C, P, key, HOUR, socket_path=path, timeout=10)
            except rasd_client.RasdError as exc:
                with lock:
                    failures.append(f"{key}: {exc.code}: {exc.message}")
                continue
            with lock:
                calls[tid] += 1
                results.append({"key": key, "resource": lease.resource, "version": lease.version})

    def wait_calls(more: int) -> None:
        target = [c + more for c in calls]
        for _ in range(3000):
            if all(c >= t for c, t in zip(calls, target, strict=True)) or failures:
                return
            time.sleep(0.01)
        raise AssertionError(f"clients stalled at {calls}; log: {log.read_text()[-2000:]}")

    try:
        wait_ready(first, path, log)
        threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        wait_calls(20)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
        before_restart = sum(calls)
        second = activated(listener, table, moto_endpoint, log)
        wait_calls(20)
        halt.set()
        for t in threads:
            t.join(timeout=30)
        stats = rasd_client.call_raw("stats", socket_path=path, timeout=5)
        assert stats["pid"] == second.pid
        assert stop(second) == 0
    finally:
        halt.set()
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        listener.close()
    assert not failures, failures[:10]
    print(
        f"restart under load: {len(results)} calls, {before_restart} before the restart, "
        f"0 failed; new daemon served {stats['counters'].get('req.total', 0)} requests"
    )
    summary = audit(ddb, table, results, "us-east-1")
    assert summary["keys"] == len({r["key"] for r in results})

"""systemd protocols: socket activation, sd_notify datagrams, watchdog interval."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rasd.server.sdnotify import Notifier, listen_fds_with_names, run_watchdog, watchdog_interval


# ----------------------------------------------------------------------- socket activation
@pytest.fixture
def listener(tmp_path: Path) -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "l.sock"))
    s.listen()
    yield s
    s.close()


def test_listen_fds_not_activated_returns_empty() -> None:
    """Without LISTEN_* the daemon binds its own socket: there is nothing to take."""
    assert listen_fds_with_names({}, 123) == []


def test_listen_fds_for_another_pid_is_ignored_and_unset(listener: socket.socket) -> None:
    """Fds meant for another pid (we are a forked child) are not taken, and the variables
    are removed so nothing below us acts on them either."""
    env = {"LISTEN_PID": "999", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x"}
    assert listen_fds_with_names(env, 123, first_fd=listener.fileno()) == []
    assert env == {}


def test_listen_fds_takes_inherited_socket_and_unsets(listener: socket.socket) -> None:
    """The inherited fd comes back as a usable listening socket with its name; the env
    variables are gone afterwards (sd_listen_fds(unset=1)); the fd is close-on-exec."""
    import fcntl

    fd = os.dup(listener.fileno())
    flags = fcntl.fcntl(fd, fcntl.F_GETFD)
    fcntl.fcntl(fd, fcntl.F_SETFD, flags & ~fcntl.FD_CLOEXEC)
    env = {"LISTEN_PID": "123", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "rasd.socket", "OTHER": "1"}
    got = listen_fds_with_names(env, 123, first_fd=fd)
    try:
        assert [name for name, _ in got] == ["rasd.socket"]
        sock = got[0][1]
        assert sock.fileno() == fd
        assert sock.family == socket.AF_UNIX
        assert sock.type == socket.SOCK_STREAM
        assert sock.getsockname() == listener.getsockname()
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert env == {"OTHER": "1"}
    finally:
        for _, s in got:
            s.close()


def test_listen_fds_unset_false_keeps_env(listener: socket.socket) -> None:
    """unset=False leaves the variables (for a caller that re-execs itself on purpose)."""
    fd = os.dup(listener.fileno())
    env = {"LISTEN_PID": "5", "LISTEN_FDS": "1"}
    for _, s in listen_fds_with_names(env, 5, unset=False, first_fd=fd):
        s.close()
    assert env == {"LISTEN_PID": "5", "LISTEN_FDS": "1"}


@pytest.mark.parametrize(
    "env",
    [
        {"LISTEN_PID": "abc", "LISTEN_FDS": "1"},
        {"LISTEN_PID": "7", "LISTEN_FDS": "-1"},
        {"LISTEN_PID": "7", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "only-one"},
    ],
)
def test_listen_fds_malformed_raises_and_still_unsets(env: dict[str, str]) -> None:
    """A broken unit is reported loudly rather than serving on a guessed fd."""
    with pytest.raises(ValueError):
        listen_fds_with_names(env, 7, first_fd=10_000)
    assert env == {}


def test_listen_fds_closed_fd_raises() -> None:
    """LISTEN_FDS naming a closed fd is an error, not a socket object on a random fd."""
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(ValueError, match="not open"):
        listen_fds_with_names({"LISTEN_PID": "7", "LISTEN_FDS": "1"}, 7, first_fd=r)


_CHILD = textwrap.dedent(
    """
    import json, os, socket, sys
    # systemd's side: put the passed fds at 3, 4 and say they are for this pid.
    passed = [int(x) for x in sys.argv[1:]]
    for i, fd in enumerate(passed):
        os.dup2(fd, 3 + i, inheritable=True)
    os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS=str(len(passed)),
                      LISTEN_FDNAMES="main:extra")
    from rasd.server.sdnotify import listen_fds_with_names
    got = listen_fds_with_names()
    out = {"names": [n for n, _ in got], "fds": [s.fileno() for _, s in got],
           "addrs": [s.getsockname() for _, s in got],
           "left": sorted(k for k in os.environ if k.startswith("LISTEN_"))}
    conn, _ = got[0][1].accept()
    conn.sendall(b"hello")
    print(json.dumps(out))
    """
)


def test_listen_fds_in_a_real_child_process(tmp_path: Path) -> None:
    """End to end as under systemd: a child gets two listening sockets at fds 3 and 4 with
    LISTEN_* for its own pid, finds them by name, and can accept on the first one."""
    a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    a.bind(str(tmp_path / "a.sock"))
    b.bind(str(tmp_path / "b.sock"))
    a.listen()
    b.listen()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(tmp_path / "a.sock"))  # queued in the backlog before the child runs
    env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(a.fileno()), str(b.fileno())],
            pass_fds=(a.fileno(), b.fileno()),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        out = json.loads(proc.stdout)
        assert out["names"] == ["main", "extra"]
        assert out["fds"] == [3, 4]
        assert out["addrs"] == [str(tmp_path / "a.sock"), str(tmp_path / "b.sock")]
        assert out["left"] == []
        assert client.recv(5) == b"hello"
    finally:
        for s in (a, b, client):
            s.close()


# --------------------------------------------------------------------------- notifications
@pytest.fixture
def path_receiver(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    r = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    r.bind(path)
    r.settimeout(10)
    yield path, r
    r.close()


@pytest.fixture
def abstract_receiver() -> Iterator[tuple[str, socket.socket]]:
    name = f"rasd-test-{uuid.uuid4().hex}"
    r = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    r.bind("\0" + name)
    r.settimeout(10)
    yield "@" + name, r
    r.close()


def test_notifier_sends_each_message_to_a_path_socket(
    path_receiver: tuple[str, socket.socket],
) -> None:
    """Every state change arrives as one datagram with systemd's exact field names."""
    path, r = path_receiver
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready(status="serving\non /run/rasd/rasd.sock")
    assert r.recv(4096) == b"READY=1\nSTATUS=serving on /run/rasd/rasd.sock"
    assert n.watchdog()
    assert r.recv(4096) == b"WATCHDOG=1"
    assert n.reloading(monotonic_us=123456789)
    assert r.recv(4096) == b"RELOADING=1\nMONOTONIC_USEC=123456789"
    assert n.stopping()
    assert r.recv(4096) == b"STOPPING=1"
    n.close()


def test_notifier_reloading_uses_clock_monotonic(
    path_receiver: tuple[str, socket.socket],
) -> None:
    """MONOTONIC_USEC is CLOCK_MONOTONIC in microseconds (what systemd compares it with)."""
    import time

    path, r = path_receiver
    n = Notifier({"NOTIFY_SOCKET": path})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    n.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    first, second = r.recv(4096).split(b"\n")
    assert first == b"RELOADING=1"
    assert second.startswith(b"MONOTONIC_USEC=")
    assert before <= int(second.split(b"=")[1]) <= after
    n.close()


def test_notifier_abstract_namespace(abstract_receiver: tuple[str, socket.socket]) -> None:
    """NOTIFY_SOCKET=@name addresses the abstract namespace (systemd uses it in containers)."""
    addr, r = abstract_receiver
    n = Notifier({"NOTIFY_SOCKET": addr})
    assert n.ready()
    assert r.recv(4096) == b"READY=1"
    n.close()


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "vsock:2:1234"}])
def test_notifier_without_socket_is_a_noop(env: dict[str, str]) -> None:
    """Outside systemd (rasd dev, tests, containers) the daemon calls the notifier
    unconditionally; nothing is sent and nothing raises."""
    n = Notifier(env)
    assert not n.enabled
    assert n.ready() is False
    assert n.watchdog() is False
    n.close()


def test_notifier_unreachable_socket_does_not_raise(tmp_path: Path) -> None:
    """A notify socket that went away is logged and reported as False, never raised:
    systemd trouble must not crash the daemon."""
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.enabled
    assert n.ready() is False
    n.close()


# -------------------------------------------------------------------------------- watchdog
@pytest.mark.parametrize(
    ("env", "pid", "expected"),
    [
        ({}, 1, None),
        ({"WATCHDOG_USEC": "10000000"}, 1, 5.0),
        ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"}, 1, 5.0),
        ({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "2"}, 1, None),
        ({"WATCHDOG_USEC": "0"}, 1, None),
        ({"WATCHDOG_USEC": "ten"}, 1, None),
        ({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "x"}, 1, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], pid: int, expected: float | None) -> None:
    """Pings at half of WATCHDOG_USEC, only for our pid; bad values mean no watchdog."""
    assert watchdog_interval(env, pid) == expected


async def test_run_watchdog_pings_every_interval(
    path_receiver: tuple[str, socket.socket],
) -> None:
    """The watchdog task pings, waits the interval, pings again, until cancelled."""
    path, r = path_receiver
    n = Notifier({"NOTIFY_SOCKET": path})
    waits: list[float] = []

    class Stop(Exception):
        pass

    async def fake_sleep(s: float) -> None:
        waits.append(s)
        if len(waits) == 3:
            raise Stop

    with pytest.raises(Stop):
        await run_watchdog(n, 5.0, sleep=fake_sleep)
    assert waits == [5.0, 5.0, 5.0]
    assert [r.recv(64) for _ in range(3)] == [b"WATCHDOG=1"] * 3
    n.close()

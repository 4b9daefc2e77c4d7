"""A SIGUSR2 hand-over of a daemon that serves Prometheus metrics (``metrics_port``).

The test plays systemd's part: it owns the listening socket and starts ``rasd serve`` with it
as fd 3 (``LISTEN_FDS``), as rasd.socket does, then sends SIGUSR2 as the package's postinst
does. The successor must take over (the predecessor exits) although the predecessor holds the
metrics port while the successor starts, and the port must then be served by the successor.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from fleet.daemons import serve_argv
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stats(path: str) -> dict[str, Any]:
    return rasd_client.call_raw("stats", socket_path=path, timeout=5)


def _scrape(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    return urllib.request.urlopen(url, timeout=5).read().decode()


def _wait(what: str, check: Any, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while True:
        try:
            got = check()
            if got:
                return got
        except Exception:  # not yet: try again until the timeout
            if time.monotonic() > end:
                raise
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def test_handover_with_metrics_port_completes_and_the_successor_serves_metrics(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    pytest.importorskip("prometheus_client")
    seed_pool(ddb, table, count=5)
    path = str(short_tmp / "rasd.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    port = _free_port()
    fd = listener.fileno()
    # a file, not a pipe: the successor inherits it and outlives the predecessor
    log = open(short_tmp / "rasd.log", "w+")  # noqa: SIM115 - closed in finally
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RASD_ACL_OPEN": "true",
        "LISTEN_FDS": "1",
        "LISTEN_FDNAMES": "rasd",
        "RASD_METRICS_PORT": str(port),
    }
    argv = serve_argv(None, table, moto_endpoint, log_level="info")
    # sh sets LISTEN_PID to its own pid, which exec keeps (as the hand-over does)
    old = subprocess.Popen(
        ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "rasd", *argv],
        env=env,
        pass_fds=(3, fd),
        preexec_fn=lambda: os.dup2(fd, 3),  # fd 3, as systemd passes it
        stdin=subprocess.DEVNULL,
        stderr=log,
    )
    new_pid = None
    try:
        _wait("the daemon ready", lambda: _stats(path)["ready"], 60)
        assert _stats(path)["pid"] == old.pid
        assert "rasd_up 1.0" in _wait("metrics", lambda: _scrape(port), 10)

        old.send_signal(signal.SIGUSR2)
        try:
            old.wait(timeout=45)  # postinst waits this long before it restarts instead
        except subprocess.TimeoutExpired:
            pytest.fail("the hand-over did not complete: the predecessor still serves")
        err = (short_tmp / "rasd.log").read_text()
        assert old.returncode == 0, err
        assert "handed_over" in err and "handover_failed" not in err, err

        new_pid = _stats(path)["pid"]
        assert new_pid != old.pid
        # the successor serves the port once the predecessor let it go
        body = _wait("the successor's metrics", lambda: _scrape(port), 10)
        assert "rasd_up 1.0" in body
        lease = rasd_client.get_lease(
            "demo", "default", "k1", __import__("datetime").timedelta(hours=1),
            socket_path=path, timeout=5,
        )  # fmt: skip
        assert lease.new
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()
        if new_pid is None:
            try:
                new_pid = _stats(path)["pid"]
            except rasd_client.RasdError:
                new_pid = None
        if new_pid and new_pid != old.pid:
            os.kill(new_pid, signal.SIGTERM)
            _wait("the successor's exit", lambda: not os.path.exists(f"/proc/{new_pid}"), 30)
        listener.close()
        log.close()

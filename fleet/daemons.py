"""``rasd serve`` daemons: starting one, waiting until it serves, asking for its stats."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import rasd_client

from .procs import popen

#: how to run the daemon: this interpreter, the checkout's rasd
RASD = [sys.executable, "-m", "rasd"]


def serve_argv(
    socket: str | None,
    table: str,
    endpoint: str | None = None,
    region: str | None = None,
    log_level: str | None = "warning",
    cmd: list[str] = RASD,
) -> list[str]:
    """``rasd serve`` for ``table`` as ``cmd`` runs it, on ``socket`` (None: the one systemd
    hands it); its table at ``endpoint`` and its ``region`` when given, at ``log_level``
    unless None."""
    argv = [*cmd, "serve", *(["--socket", socket] if socket else []), "--table", table]
    argv += ["--region", region] if region else []
    argv += ["--endpoint-url", endpoint] if endpoint else []
    argv += ["--log-level", log_level] if log_level else []
    return argv


def start_daemon(
    socket: str,
    table: str,
    region: str,
    endpoint: str,
    env: dict[str, str],
    log: str | Path,
    cmd: list[str] = RASD,
    group: bool = False,
    append: bool = True,
) -> subprocess.Popen[bytes]:
    """``rasd serve`` on ``socket`` for ``region``, its table at ``endpoint``, with ``env``;
    its log (stderr) to ``log``, appended to (``append=False``: written afresh). ``cmd``: how
    to run rasd; ``group``: in a process group of its own."""
    # a test fleet's daemons serve every client_id, and check their clock by the Date header
    # alone: the machines this runs on keep no synchronised kernel clock, and every backend
    # answers with this host's own (``env`` may say otherwise)
    env = {"RASD_ACL_OPEN": "true", "RASD_CLOCK_CHECK": "date", **env}
    argv = serve_argv(socket, table, endpoint, region, cmd=cmd)
    with open(log, "ab" if append else "wb") as err:
        proc: subprocess.Popen[bytes] = popen(
            argv,
            env,
            group=group,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return proc


def wait_ready(
    socket: str,
    proc: subprocess.Popen[Any] | None,
    timeout: float,
    ready: bool = True,
    poll: float = 0.1,
) -> bool:
    """Ask the daemon on ``socket`` (``ping``) every ``poll`` seconds until it says it is ready
    (``ready=False``: until it answers at all; it may still be starting). False when ``proc``
    exits (or is None) first, or ``timeout`` seconds pass; it is asked at least once."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is None or proc.poll() is not None:
            return False
        if os.path.exists(socket):
            try:
                answer = rasd_client.call_raw("ping", socket_path=socket, timeout=1.0)
                if answer.get("ready") or not ready:
                    return True
            except rasd_client.RasdError:
                pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def stats(socket: str, timeout: float = 2.0) -> dict[str, Any]:
    """The daemon's ``stats`` answer (rasd_client.RasdError when it gives none)."""
    return rasd_client.call_raw("stats", socket_path=socket, timeout=timeout)


def counters(socket: str, timeout: float = 2.0) -> dict[str, int]:
    """The daemon's counters since it started; empty when it does not answer (restarting,
    still starting, gone)."""
    try:
        found: dict[str, int] = stats(socket, timeout).get("counters", {})
    except rasd_client.RasdError:
        return {}
    return found

"""systemd integration without systemd: socket activation (:func:`listen_fds_with_names`),
sd_notify (:class:`Notifier`, best effort) and the watchdog (:func:`watchdog_interval`,
:func:`run_watchdog`, pinging from the event loop itself). docs/operations.md, "The daemon on
a host (systemd)".
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping

import structlog

log = structlog.get_logger("rasd.server.sdnotify")

#: The first inherited file descriptor (``SD_LISTEN_FDS_START``).
SD_LISTEN_FDS_START = 3

_LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


# ----------------------------------------------------------------------- socket activation
def listen_fds_with_names(
    env: MutableMapping[str, str] | None = None,
    pid: int | None = None,
    *,
    unset: bool = True,
    first_fd: int = SD_LISTEN_FDS_START,
) -> list[tuple[str, socket.socket]]:
    """The sockets systemd passed to this process, each with its name (``FileDescriptorName=``,
    default ``"unknown"``); ``[]`` when not socket-activated.

    ``env`` defaults to ``os.environ`` and ``pid`` to ``os.getpid()``: the fds are ours only if
    ``LISTEN_PID`` equals our pid (a forked child or an exec'd helper must not take them).
    With ``unset`` (the default) the three variables are removed whatever the outcome.
    ``first_fd`` exists for tests only; systemd always starts at 3.

    Raises ``ValueError`` when the variables are present for us but malformed, or an fd is not
    open: that is a broken unit, and guessing would serve on the wrong socket.
    """
    env = os.environ if env is None else env
    pid = os.getpid() if pid is None else pid
    try:
        raw_pid = env.get("LISTEN_PID")
        raw_fds = env.get("LISTEN_FDS")
        raw_names = env.get("LISTEN_FDNAMES")
        if raw_pid is None or raw_fds is None:
            return []
        try:
            target, n = int(raw_pid), int(raw_fds)
        except ValueError:
            raise ValueError(
                f"bad socket activation variables LISTEN_PID={raw_pid!r} LISTEN_FDS={raw_fds!r}"
            ) from None
        if target != pid:
            return []
        if n < 0:
            raise ValueError(f"bad LISTEN_FDS={raw_fds!r}")
        names = raw_names.split(":") if raw_names else []
        if names and len(names) != n:
            raise ValueError(f"LISTEN_FDNAMES has {len(names)} names for {n} fds")
        out: list[tuple[str, socket.socket]] = []
        for i in range(n):
            fd = first_fd + i
            try:
                flags = fcntl.fcntl(fd, fcntl.F_GETFD)
            except OSError as exc:
                raise ValueError(f"LISTEN_FDS={n} but fd {fd} is not open: {exc}") from None
            fcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)
            out.append((names[i] if names else "unknown", socket.socket(fileno=fd)))
        return out
    finally:
        if unset:
            for var in _LISTEN_VARS:
                env.pop(var, None)


# --------------------------------------------------------------------------- notifications
def _notify_address(raw: str | None) -> str | bytes | None:
    """``NOTIFY_SOCKET`` as an address for ``sendto``: a path, or the abstract ``\\0name``."""
    if not raw:
        return None
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    # vsock:... (systemd >= 253 in VMs) and anything newer: not supported, say so once.
    log.warning("notify_socket_unsupported", notify_socket=raw)
    return None


class Notifier:
    """Sends state changes to systemd's notify socket; a no-op without ``NOTIFY_SOCKET``.

    With ``NotifyAccess=main`` systemd accepts messages only from the main pid, so call this
    from the daemon process itself (not from a helper or a forked child).
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = _notify_address(env.get("NOTIFY_SOCKET"))
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def __repr__(self) -> str:
        return f"Notifier(address={self.address!r})"

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=VALUE`` fields in one datagram. True if sent (False when disabled/failed)."""
        if self.address is None:
            return False
        msg = "\n".join(fields).encode()
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)  # never stall the event loop on a full systemd queue
                self._sock = sock
            self._sock.sendto(msg, self.address)
        except OSError as exc:
            log.warning("sd_notify_failed", fields=list(fields), error=str(exc))
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Start-up (or a reload) finished: systemd moves the unit to active."""
        return self.notify("READY=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def reloading(self, monotonic_us: int | None = None) -> bool:
        """A reload (SIGHUP) began; send :meth:`ready` when it is done.

        ``MONOTONIC_USEC`` is CLOCK_MONOTONIC in microseconds, as systemd >= 253 requires to
        match the message to the reload it asked for; ``monotonic_us`` is for tests.
        """
        us = (
            time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            if monotonic_us is None
            else monotonic_us
        )
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={us}")

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown began (SIGTERM): systemd stops routing new work to us."""
        return self.notify("STOPPING=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def watchdog(self) -> bool:
        """I am alive: resets systemd's ``WatchdogSec=`` timer."""
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _one_line(text: str) -> str:
    return " ".join(text.split())


# -------------------------------------------------------------------------------- watchdog
def watchdog_interval(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings, or None when systemd runs no watchdog for us.

    Half of ``WATCHDOG_USEC`` (so one late ping is not fatal). ``WATCHDOG_PID``, when set,
    must be our pid. Bad values mean "no watchdog" (logged), never a crash.
    """
    env = os.environ if env is None else env
    pid = os.getpid() if pid is None else pid
    raw_usec = env.get("WATCHDOG_USEC")
    raw_pid = env.get("WATCHDOG_PID")
    if not raw_usec:
        return None
    try:
        usec = int(raw_usec)
        if raw_pid and int(raw_pid) != pid:
            return None
    except ValueError:
        log.warning("watchdog_env_invalid", watchdog_usec=raw_usec, watchdog_pid=raw_pid)
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000 / 2


async def run_watchdog(
    notifier: Notifier,
    interval: float,
    *,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Ping every ``interval`` seconds until cancelled. Run it as a task on the daemon's loop:
    the ping is then evidence that the loop still turns."""
    while True:
        notifier.watchdog()
        await sleep(interval)

"""The SIGUSR2 hand-over: a successor takes the listening socket over without a gap
(:meth:`Handover.start` in the predecessor, :func:`take_over` in the successor). The steps
and why: docs/operations.md, "The daemon on a host (systemd)" (Hand-over).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from typing import Protocol

import structlog

from .sdnotify import Notifier

log = structlog.get_logger("rasd.server")

#: the fd systemd passes the first listening socket as (sd_listen_fds)
LISTEN_FD = 3


class Serving(Protocol):
    """What a hand-over needs of the daemon it hands over: its listening socket, whether it
    is stopping already, its systemd notifier, stopping it, and listening on a socket."""

    notifier: Notifier

    @property
    def listen_sock(self) -> socket.socket | None: ...

    @property
    def stopping(self) -> bool: ...

    def stop(self) -> None: ...

    async def listen(self, sock: socket.socket | None = None) -> None: ...


class Handover:
    """The predecessor's side of a hand-over (SIGUSR2, :meth:`start`): the successor under
    way, if any, and whether the daemon handed its socket over (it then stops without
    telling systemd it stops: the successor is the main process)."""

    def __init__(self, daemon: Serving) -> None:
        self.daemon = daemon
        self.successor: subprocess.Popen[bytes] | None = None
        self.handed_over = False

    def start(self) -> None:
        """Start the successor; stop once it serves."""
        daemon = self.daemon
        if self.successor is not None or daemon.stopping:
            log.warning("handover_ignored", reason="a hand-over or a stop is under way")
            return
        sock = daemon.listen_sock
        if sock is None or sock.fileno() != LISTEN_FD:
            log.warning("handover_ignored", reason="not socket-activated (no inherited fd 3)")
            return
        rfd, wfd = os.pipe()
        env = dict(os.environ)
        env.update(LISTEN_FDS="1", LISTEN_FDNAMES="rasd", RASD_HANDOVER_FD=str(wfd))
        argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
        try:
            # sh sets LISTEN_PID/WATCHDOG_PID to its own pid, which exec keeps.
            self.successor = subprocess.Popen(
                ["/bin/sh", "-c", 'LISTEN_PID=$$ WATCHDOG_PID=$$ exec "$@"', "rasd", *argv],
                env=env,
                pass_fds=(LISTEN_FD, wfd),
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            os.close(rfd)
            log.error("handover_failed", cause=f"cannot start the successor: {exc}")
            return
        finally:
            os.close(wfd)
        log.info("handover_started", successor=self.successor.pid)
        asyncio.get_running_loop().add_reader(rfd, self._answered, rfd)

    def _answered(self, rfd: int) -> None:
        """The successor wrote to the pipe (it serves), or closed it (it died)."""
        try:
            data = os.read(rfd, 64)
        except OSError:
            data = b""
        asyncio.get_running_loop().remove_reader(rfd)
        os.close(rfd)
        successor = self.successor
        if data and successor is not None:
            # WATCHDOG=1 too: the successor's next ping is at most one interval away.
            self.daemon.notifier.notify(
                f"MAINPID={successor.pid}",
                "READY=1",
                "WATCHDOG=1",
                f"STATUS=serving (took over from pid {os.getpid()})",
            )
            log.info("handed_over", successor=successor.pid)
            self.handed_over = True
            self.daemon.stop()
        else:
            code = successor.poll() if successor is not None else None
            log.error("handover_failed", cause="the successor exited before serving", code=code)
            self.successor = None


async def take_over(daemon: Serving, sock: socket.socket, fd: int) -> None:
    """The successor's side, once its store is up: accept, then tell the predecessor (through
    the pipe ``fd``), which makes us the main process and stops."""
    await daemon.listen(sock)
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    log.info("took_over", predecessor=os.getppid())

"""The process's signals: SIGTERM/SIGINT stop the daemon (draining), SIGHUP reloads its
config, SIGUSR2 hands its socket over; :func:`run_daemon` wires them and runs it.

A reload applies what is safe to change live (acl, log_level, rate limits, max_inflight) and
keeps the rest: the socket, the table and the store stay as they started.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import Callable

import structlog

from ..config import Config, ConfigError, acl_refusal
from ..observe import log as logsetup
from .diagnostics import loop_exception
from .lifecycle import Daemon
from .peercred import Acl

log = structlog.get_logger("rasd.server")


def reload(d: Daemon) -> None:
    """SIGHUP: re-read the config; apply what is safe to change live (acl, log_level,
    rate limits, max_inflight). A bad config is logged and the old one kept."""
    if d.reloader is None:
        return
    d.notifier.reloading()
    try:
        new = d.reloader()
        refusal = acl_refusal(new)
        if refusal:
            raise ConfigError(refusal)
        acl = Acl.from_config(new.acl)
    except ValueError as exc:  # ConfigError and AclError
        log.error("reload_failed", error=str(exc))
        d.notifier.ready(status="reload failed; old config kept")
        return
    d.reconfigure(new, acl)
    logsetup.configure(new.log_level)
    d.notifier.ready(status="reloaded")
    log.info("reloaded", acl="open" if acl.open else "enforced")


async def run_daemon(
    cfg: Config,
    sock: socket.socket | None = None,
    *,
    reloader: Callable[[], Config] | None = None,
    daemon: Daemon | None = None,
    on_up: Callable[[], None] | None = None,
) -> int:
    """The one way to run the daemon (``rasd serve`` and ``rasd dev``): SIGTERM/SIGINT stop
    it (draining), SIGHUP reloads the config (``reloader``; without one the running config
    is kept and the reload is still acknowledged to systemd). ``on_up`` runs once the store
    is up (``rasd dev`` prints its banner then). Returns the exit status (2: start refused,
    an AWS setting rasd cannot honour or a socket another live process serves on)."""
    d = daemon or Daemon(cfg, reloader=reloader or (lambda: d.cfg))
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(loop_exception)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, d.stop)
    loop.add_signal_handler(signal.SIGHUP, reload, d)
    loop.add_signal_handler(signal.SIGUSR2, d.hand_over)
    if on_up is not None:

        async def _when_up() -> None:
            await d.up.wait()
            on_up()

        waiter = loop.create_task(_when_up())
    try:
        await d.run(sock)
    finally:
        if on_up is not None:
            waiter.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
            loop.remove_signal_handler(sig)
    return d.exit_status

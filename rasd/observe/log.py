"""structlog JSON logs on stderr, shared by the daemon and the jobs; under systemd each line
carries its syslog priority for journald (docs/operations.md, "The daemon on a host
(systemd)": Logs fit journald).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import structlog

#: structlog method name -> syslog priority (sd-daemon(3): <3> err, <4> warning, ...).
PRIORITIES = {
    "critical": 2,
    "exception": 3,
    "error": 3,
    "warning": 4,
    "warn": 4,
    "info": 6,
    "debug": 7,
}


def journal_prefix_wanted(env: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """True when ``fd`` is the journal's stream (JOURNAL_STREAM is its ``dev:inode``)."""
    env = os.environ if env is None else env
    forced = env.get("RASD_LOG_PRIORITY_PREFIX")
    if forced is not None:
        return forced.strip().lower() in ("1", "yes", "true", "on")
    stream = env.get("JOURNAL_STREAM")
    if not stream:
        return False
    try:
        dev, ino = (int(x) for x in stream.split(":"))
        st = os.fstat(fd)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def add_priority_prefix(_logger: Any, method: str, line: Any) -> Any:
    """Last processor: ``<N>`` before the rendered line (journald strips it)."""
    return f"<{PRIORITIES.get(method, 6)}>{line}"


def configure(
    level: str = "info",
    stream: TextIO | None = None,
    *,
    cache: bool = True,
    priority_prefix: bool | None = None,
) -> None:
    """One JSON object per line with an ISO UTC timestamp. Without ``stream`` the current
    ``sys.stderr`` is looked up whenever a logger is made (so tests that swap it work).
    ``priority_prefix`` defaults to :func:`journal_prefix_wanted`."""
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    if priority_prefix is None:
        priority_prefix = stream is None and journal_prefix_wanted()

    def factory(*_args: Any) -> structlog.WriteLogger:
        return structlog.WriteLogger(stream or sys.stderr)

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
            *([add_priority_prefix] if priority_prefix else []),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=factory,
        cache_logger_on_first_use=cache,
    )

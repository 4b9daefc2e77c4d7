"""structlog JSON logs on stderr, shared by the daemon and the jobs.

No per-request line at info level on the daemon's hot path.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog


def configure(level: str = "info", stream: TextIO | None = None, *, cache: bool = True) -> None:
    """One JSON object per line with an ISO UTC timestamp. Without ``stream`` the current
    ``sys.stderr`` is looked up whenever a logger is made (so tests that swap it work)."""
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)

    def factory(*_args: Any) -> structlog.WriteLogger:
        return structlog.WriteLogger(stream or sys.stderr)

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=factory,
        cache_logger_on_first_use=cache,
    )

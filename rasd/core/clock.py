"""Time as a parameter: the daemon asks a Clock; tests pass one they advance
(tests/doubles/clock.py)."""

from __future__ import annotations

import os
import time
from typing import Protocol


class Clock:
    """Wall time (for lease ends, which other hosts compare) and monotonic time (for timers)."""

    def now_us(self) -> int:
        return time.time_ns() // 1000

    def mono(self) -> float:
        return time.monotonic()


class OffsetClock(Clock):
    """Wall time off by the seconds a file says, read again once a second: a host whose
    clock is stepped, for the chaos run and the tests (``RASD_CLOCK_OFFSET_FILE``). A missing
    or unreadable file is no offset."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset_us = 0
        self._read_at = -1.0

    def now_us(self) -> int:
        mono = time.monotonic()
        if mono - self._read_at >= 1.0:
            self._read_at = mono
            try:
                with open(self.path) as f:
                    self._offset_us = int(float(f.read().strip() or 0) * 1_000_000)
            except (OSError, ValueError):
                self._offset_us = 0
        return time.time_ns() // 1000 + self._offset_us


def clock_from_env() -> Clock:
    """The daemon's clock: the host's, or an :class:`OffsetClock` where
    ``RASD_CLOCK_OFFSET_FILE`` names one (tests and chaos only)."""
    path = os.environ.get("RASD_CLOCK_OFFSET_FILE")
    return OffsetClock(path) if path else Clock()


class Guard(Protocol):
    """Whether the wall clock may be trusted (``rasd.server.clockwatch.ClockGuard``)."""

    #: why not; None while it may
    why: str | None

    def check(self) -> None:
        """Raises UNAVAILABLE, saying why, while it may not."""


class GuardedClock(Clock):
    """The daemon's clock for its programs and roles: wall time only while ``guard`` trusts
    it (else UNAVAILABLE, which the program that asked ends with); monotonic time always."""

    def __init__(self, inner: Clock, guard: Guard) -> None:
        self.inner = inner
        self.guard = guard

    def now_us(self) -> int:
        if self.guard.why is not None:
            self.guard.check()
        return self.inner.now_us()

    def mono(self) -> float:
        return self.inner.mono()

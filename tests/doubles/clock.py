"""A clock the test moves (``rasd.core.clock.Clock`` is the seam the daemon is given)."""

from __future__ import annotations

from rasd.core.clock import Clock


class FakeClock(Clock):
    """A clock that moves only when told to."""

    def __init__(self, now_us: int = 1_800_000_000 * 1_000_000, mono: float = 1000.0) -> None:
        self._now_us = now_us
        self._mono = mono

    def now_us(self) -> int:
        return self._now_us

    def mono(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now_us += int(seconds * 1_000_000)
        self._mono += seconds

    def step(self, seconds: float) -> None:
        """The wall clock alone moves (a step: NTP's, or an operator's); timers do not."""
        self._now_us += int(seconds * 1_000_000)

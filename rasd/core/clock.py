"""Time as a parameter: the daemon asks a Clock; tests pass one they advance
(tests/doubles/clock.py)."""

from __future__ import annotations

import time


class Clock:
    """Wall time (for lease ends, which other hosts compare) and monotonic time (for timers)."""

    def now_us(self) -> int:
        return time.time_ns() // 1000

    def mono(self) -> float:
        return time.monotonic()

"""The daemon's watch over its own clock: whether it may be trusted within the skew bound
(``rasd.core.clock_trust`` judges; docs/design.md, "A clock the daemon checks"). While it
may not, every request that needs the clock is refused (``UNAVAILABLE``, with the reason),
and so is every program of the daemon's that reads the wall clock
(``rasd.core.clock.GuardedClock``): nothing is written or served from a time it cannot vouch
for. It recovers by itself once the witnesses agree again.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..core import clock_trust
from ..core.errors import Unavailable
from ..core.lease import US
from ..kernelclock import read_kernel_bound

log = structlog.get_logger("rasd.clock")

#: the kernel's error bound is read this often, and a step looked for
WATCH_S = 1.0
#: while doubted, DynamoDB is asked (one cheap read) this often for a Date reading
PROBE_S = 2.0
#: a reading of the wall clock counts for step-finding only when the monotonic clock read
#: just before and just after it lie this close (a thread paused between two readings would
#: look like a step)
READ_WITHIN_S = 0.005


class ClockGuard:
    """The witnesses' latest readings and the verdict (``why``: None while trusted). The
    lean client hands it every response's ``Date`` header (:meth:`on_date`); :meth:`watch`
    reads the kernel and looks for steps once a second, and asks DynamoDB for a reading
    while the clock is doubted."""

    def __init__(
        self,
        mode: str,
        max_clock_skew: float,
        wall_us: Callable[[], int],
        mono: Callable[[], float] = time.monotonic,
        kernel: Callable[[], clock_trust.KernelBound] = read_kernel_bound,
        on_verdict: Callable[[bool], None] | None = None,
    ) -> None:
        if mode not in clock_trust.MODES:
            raise ValueError(
                f"clock_check must be one of {', '.join(clock_trust.MODES)}, not {mode!r}"
            )
        self.mode = mode
        self.limit_us = int(max_clock_skew * US / 2)
        #: the clock judged (its wall time), and the monotonic clock the lean client stamps
        #: its requests with
        self.wall_us = wall_us
        self.mono = mono
        self._kernel = kernel
        #: why the clock is not trusted now; None: it is
        self.why: str | None = None
        #: told each change of the verdict (True: not trusted), in the step that makes it
        self.on_verdict = on_verdict
        self.kernel: clock_trust.KernelBound | None = None
        #: the latest Date reading (signed microseconds; None: none yet) and when it came
        self.date_floor_us: int | None = None
        self.date_at: float = -1.0
        self._date_raw: bytes | None = None  # the last header parsed, and its second
        self._date_s = 0
        #: a step not yet vouched for (signed microseconds; 0: none), and when it was seen
        self.step_us = 0
        self._step_at = 0.0
        self._gap_us: int | None = None
        self.changes = 0

    # ---------------------------------------------------------------------- witnesses
    def on_date(self, raw: bytes, sent_mono: float) -> None:
        """A response's ``Date`` header; its request left at monotonic ``sent_mono``."""
        if self.mode == "off":
            return
        if raw != self._date_raw:
            try:
                parsed = email.utils.parsedate_to_datetime(raw.decode("ascii", "replace"))
            except (ValueError, TypeError, IndexError):
                return  # not a date (a proxy's header?): no reading, never a failed call
            self._date_raw, self._date_s = raw, int(parsed.timestamp())
        got_mono = self.mono()
        got_us = self.wall_us()
        sent_us = got_us - int((got_mono - sent_mono) * US)
        self.date_floor_us = clock_trust.date_offset_floor_us(self._date_s, sent_us, got_us)
        self.date_at = got_mono
        if self.step_us and sent_mono > self._step_at:
            self.step_us = 0  # a reading taken after the step speaks for the new time
        self._judge()

    def tick(self) -> None:
        """Once a second: the kernel's bound, and a step since the last tick."""
        if self.mode == "off":
            return
        if self.mode == "kernel":
            self.kernel = self._kernel()
        before = self.mono()
        wall = self.wall_us()
        mono = self.mono()
        if mono - before <= READ_WITHIN_S:
            # the two clocks read together; a reading the scheduler split proves nothing
            gap = wall - int((before + mono) / 2 * US)
            if self._gap_us is not None:
                step = clock_trust.stepped_us(self._gap_us, gap)
                if step:
                    self.step_us, self._step_at = step, mono
            self._gap_us = gap
        self._judge()

    def _judge(self) -> None:
        why = clock_trust.judge(self.limit_us, self.kernel, self.date_floor_us, self.step_us)
        if why != self.why:
            self.changes += 1
            if why is None:
                log.warning("clock_trusted", was=self.why)
            else:
                log.error(
                    "clock_untrusted",
                    why=why,
                    date_offset_floor_s=None
                    if self.date_floor_us is None
                    else self.date_floor_us / US,
                    kernel_maxerror_s=None if self.kernel is None else self.kernel.maxerror_us / US,
                )
            self.why = why
            if self.on_verdict is not None:
                self.on_verdict(why is not None)

    def snapshot(self) -> dict[str, Any]:
        """What ``rasd stats`` shows of the clock."""
        return {
            "check": self.mode,
            "trusted": self.why is None,
            "why": self.why,
            "date_offset_floor_s": None if self.date_floor_us is None else self.date_floor_us / US,
            "kernel_maxerror_s": None if self.kernel is None else self.kernel.maxerror_us / US,
            "kernel_synced": None if self.kernel is None else self.kernel.synced,
        }

    def check(self) -> None:
        """Raises UNAVAILABLE while the clock is not trusted."""
        if self.why is not None:
            raise Unavailable(f"this host's clock is not trusted: {self.why}", retry_after=1.0)

    async def watch(self, probe: Callable[[], Awaitable[object]]) -> None:
        """Forever: :meth:`tick` every WATCH_S; while doubted, ``probe`` (a cheap read of
        DynamoDB, whose answer brings a Date reading) every PROBE_S."""
        last_probe = -PROBE_S
        while True:
            self.tick()
            now = self.mono()
            if self.why is not None and self.mode != "off" and now - last_probe >= PROBE_S:
                last_probe = now
                try:
                    await probe()
                except Exception as exc:  # noqa: BLE001 - a probe that fails proves nothing
                    log.debug("clock_probe_failed", error=repr(exc))
            await asyncio.sleep(WATCH_S)

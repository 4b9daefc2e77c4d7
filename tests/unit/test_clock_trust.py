"""Whether the daemon trusts its clock: the pure judgement (rasd.core.clock_trust) and the
guard that keeps it (rasd.server.clockwatch), with readings and time passed in."""

from __future__ import annotations

import email.utils

import pytest

from rasd.core import clock_trust
from rasd.core.clock import GuardedClock
from rasd.core.errors import Unavailable
from rasd.core.lease import US
from rasd.kernelclock import read_kernel_bound
from rasd.server.clockwatch import ClockGuard
from tests.doubles.clock import FakeClock

LIMIT = US  # half of the default max_clock_skew


def test_a_date_reading_bounds_the_offset_from_outside_the_request() -> None:
    # the server stamped second 100 while the request was out from 100.2 to 100.4: nothing
    assert clock_trust.date_offset_floor_us(100, 100_200_000, 100_400_000) == 0
    # the clock read 105.2 at sending: at least 4.2 s ahead (the stamp is at most 101)
    assert clock_trust.date_offset_floor_us(100, 105_200_000, 105_300_000) == 4_200_000
    # the answer came at 97.5: at least 2.5 s behind
    assert clock_trust.date_offset_floor_us(100, 97_400_000, 97_500_000) == -2_500_000
    # a slow answer widens the window, never invents an offset
    assert clock_trust.date_offset_floor_us(100, 95_000_000, 110_000_000) == 0


def test_a_step_is_a_move_against_the_monotonic_clock_beyond_any_slew() -> None:
    assert clock_trust.stepped_us(1_000, 1_000 + clock_trust.STEP_US) == 0
    assert clock_trust.stepped_us(1_000, 1_000 + 5 * US) == 5 * US
    assert clock_trust.stepped_us(1_000, 1_000 - 3 * US) == -3 * US


@pytest.mark.parametrize(
    ("kernel", "floor", "step", "says"),
    [
        (clock_trust.KernelBound(True, 50_000), 0, 0, None),
        (clock_trust.KernelBound(False, 50_000), 0, 0, "not synchronised"),
        (clock_trust.KernelBound(True, 1_500_000), 0, 0, "error bound is 1.500s"),
        (None, 4_200_000, 0, "4.200s ahead of DynamoDB"),
        (None, -2_500_000, 0, "2.500s behind DynamoDB"),
        (None, 900_000, 0, None),
        (None, None, 0, None),
        (None, 0, 5 * US, "stepped by +5.000s"),
    ],
)
def test_the_verdict_names_the_witness_that_objects(
    kernel: clock_trust.KernelBound | None, floor: int | None, step: int, says: str | None
) -> None:
    why = clock_trust.judge(LIMIT, kernel, floor, step)
    assert (why is None) == (says is None)
    assert says is None or says in (why or "")


def _date(at_s: float) -> bytes:
    return email.utils.formatdate(at_s, usegmt=True).encode()


def test_the_guard_follows_the_date_header_both_ways() -> None:
    clock = FakeClock()
    g = ClockGuard("date", 2.0, clock.now_us, clock.mono)
    server = clock.now_us() / US
    sent = clock.mono()
    g.on_date(_date(server), sent)
    assert g.why is None
    # this host's clock jumps 5 s ahead between two ticks: a step, doubted at once
    g.tick()
    clock.step(5.0)
    g.tick()
    assert g.why is not None and "stepped by +5" in g.why
    with pytest.raises(Unavailable, match="clock is not trusted"):
        g.check()
    # DynamoDB's answer after the step says the clock is 4 s or more ahead: still refused
    clock.advance(0.5)
    sent = clock.mono()
    g.on_date(_date(server + 0.5), sent)
    assert g.why is not None and "ahead of DynamoDB" in g.why
    # stepped back: the next answer vouches for it
    clock.step(-5.0)
    g.tick()
    clock.advance(0.5)
    sent = clock.mono()
    g.on_date(_date(server + 1.0), sent)
    assert g.why is None
    assert g.changes == 3  # stepped; then the Date reading; then trusted


def test_the_kernel_witness_counts_only_in_kernel_mode() -> None:
    clock = FakeClock()
    unsynced = clock_trust.KernelBound(False, 16 * US)
    k = ClockGuard("kernel", 2.0, clock.now_us, clock.mono, kernel=lambda: unsynced)
    k.tick()
    assert k.why is not None and "not synchronised" in k.why
    d = ClockGuard("date", 2.0, clock.now_us, clock.mono, kernel=lambda: unsynced)
    d.tick()
    assert d.why is None
    off = ClockGuard("off", 2.0, clock.now_us, clock.mono, kernel=lambda: unsynced)
    clock.step(60.0)
    off.tick()
    off.on_date(_date(0), clock.mono())
    assert off.why is None


def test_the_guarded_clock_gives_no_wall_time_while_doubted() -> None:
    clock = FakeClock()
    g = ClockGuard(
        "kernel", 2.0, clock.now_us, clock.mono, kernel=lambda: clock_trust.KernelBound(True, 0)
    )
    guarded = GuardedClock(clock, g)
    g.tick()
    assert guarded.now_us() == clock.now_us()
    g.kernel = None
    g._kernel = lambda: clock_trust.KernelBound(True, 3 * US)
    g.tick()
    with pytest.raises(Unavailable, match=r"error bound is 3\.000s"):
        guarded.now_us()
    assert guarded.mono() == clock.mono()  # timers run on


def test_this_machines_kernel_answers() -> None:
    """adjtimex read-only works unprivileged; whatever it says, it says it in the struct."""
    got = read_kernel_bound()
    assert got.maxerror_us >= 0


def test_a_thread_paused_between_two_clock_readings_is_no_step() -> None:
    """The watch reads monotonic, wall, monotonic: when the thread was paused in between
    (half a second on a loaded host), the wall reading is set aside rather than taken for a
    step; a true step the next second is still seen."""
    t = {"mono": 1000.0, "off": 0.0, "pause": 0.0}

    def wall_us() -> int:
        t["mono"] += t["pause"]  # time passes while this thread is off the CPU
        return int((t["mono"] + 1_800_000_000 + t["off"]) * US)

    g = ClockGuard("date", 2.0, wall_us, lambda: t["mono"])
    g.tick()
    t["mono"] += 1.0
    t["pause"] = 0.5
    g.tick()
    assert g.why is None and g.step_us == 0
    t["pause"] = 0.0
    t["mono"] += 1.0
    t["off"] = 5.0
    g.tick()
    assert g.why is not None and "stepped by +5.000s" in g.why


def test_a_date_header_that_is_no_date_is_no_reading() -> None:
    clock = FakeClock()
    g = ClockGuard("date", 2.0, clock.now_us, clock.mono)
    for raw in (b"", b"yesterday", b"Mon, 99 Foo 2026 99:99:99 GMT"):
        g.on_date(raw, clock.mono())
    assert g.date_floor_us is None and g.why is None

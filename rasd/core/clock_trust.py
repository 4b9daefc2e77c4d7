"""Whether this host's clock may be trusted within the skew bound. Pure: readings in, a reason
out (None: trusted). The three witnesses (the kernel, DynamoDB's ``Date``, a step):
docs/design.md, "A clock the daemon checks".
"""

from __future__ import annotations

from dataclasses import dataclass

from .lease import US

#: the settings of ``clock_check``: which witnesses count (docs/operations.md)
MODES = ("kernel", "date", "off")

#: the kernel slews at most 500 ppm: between two readings a second apart, a wall clock that
#: moved against the monotonic one by more than this was stepped
STEP_US = 100_000


@dataclass(frozen=True, slots=True)
class KernelBound:
    """The kernel's account of its clock (``adjtimex`` read-only)."""

    synced: bool
    maxerror_us: int


def date_offset_floor_us(date_s: int, sent_us: int, got_us: int) -> int:
    """How far this clock is at least from the server's, signed (positive: ahead), from a
    response whose ``Date`` header says ``date_s`` (whole seconds) to a request sent at
    ``sent_us`` and answered at ``got_us`` on this clock. 0 when the reading cannot tell."""
    ahead = sent_us - (date_s + 1) * US
    behind = date_s * US - got_us
    if ahead > 0:
        return ahead
    if behind > 0:
        return -behind
    return 0


def stepped_us(prev_gap_us: int, gap_us: int) -> int:
    """How far the wall clock was stepped between two readings of ``wall - monotonic``
    (signed; 0 within the slew the kernel allows)."""
    moved = gap_us - prev_gap_us
    return moved if abs(moved) > STEP_US else 0


def judge(
    limit_us: int,
    kernel: KernelBound | None,
    date_floor_us: int | None,
    step_unverified_us: int,
) -> str | None:
    """Why the clock is not to be trusted (None: it is). ``limit_us``: the error one host may
    have (half the skew bound: two hosts each within it differ by at most the bound).
    ``kernel``: None where the kernel's bound is not consulted. ``date_floor_us``: the latest
    ``Date`` reading (None: none yet). ``step_unverified_us``: a step no later ``Date``
    reading has vouched for (0: none)."""
    if kernel is not None and not kernel.synced:
        return "the kernel says the clock is not synchronised (is chronyd or ntpd running?)"
    if kernel is not None and kernel.maxerror_us > limit_us:
        return (
            f"the kernel's error bound is {kernel.maxerror_us / US:.3f}s, beyond "
            f"{limit_us / US:.3f}s (half of max_clock_skew)"
        )
    if date_floor_us is not None and abs(date_floor_us) > limit_us:
        side = "ahead of" if date_floor_us > 0 else "behind"
        return (
            f"this clock is at least {abs(date_floor_us) / US:.3f}s {side} DynamoDB's "
            f"(its Date header), beyond {limit_us / US:.3f}s (half of max_clock_skew)"
        )
    if step_unverified_us:
        return (
            f"the clock was stepped by {step_unverified_us / US:+.3f}s; waiting for "
            "DynamoDB's Date header to vouch for the new time"
        )
    return None

"""Whether this host's clock may be trusted within the skew bound. Pure: readings in, a reason
out (None: trusted). The three witnesses (ClockBound or the kernel, DynamoDB's ``Date``, a step):
docs/design.md, "A clock the daemon checks".
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .lease import US

#: the settings of ``clock_check``: which witnesses count (docs/operations.md)
MODES = ("kernel", "date", "off")

#: the kernel slews at most 500 ppm: between two readings a second apart, a wall clock that
#: moved against the monotonic one by more than this was stepped
STEP_US = 100_000


@dataclass(frozen=True, slots=True)
class KernelBound:
    """A local witness's account of this clock: ClockBound's segment where it runs, else the
    kernel's (``adjtimex`` read-only). ``source`` names it in the reasons given."""

    synced: bool
    maxerror_us: int
    source: str = "the kernel"


#: ClockBound's shared memory segment (its protocol, versions 1 and 2): the magic number as two
#: native u32, then the segment's size (u32), version (u16) and generation (u16, odd while
#: the writer is in the middle of an update)
CLOCKBOUND_MAGIC = (0x414D5A4E, 0x43420200)
CLOCKBOUND_HEAD = struct.Struct("=2I I H H")
#: after the head: as-of and void-after (CLOCK_MONOTONIC_COARSE timespecs), the bound (ns)
#: at as-of; then v2: disruption marker (u64), max drift (u32, ppb), status (i32); v1: max
#: drift (u32, ppb), reserved (u32), status (i32)
_CB_BODY = {
    2: (struct.Struct("=qq qq q Q I i"), 6, 7),
    1: (struct.Struct("=qq qq q I I i"), 5, 7),
}
#: ClockBound's clock status: 1 synchronised, 2 free running (the bound still holds, and
#: grows by the drift); 0 unknown and 3 disrupted (e.g. a VM's live migration) bound nothing
CLOCKBOUND_BOUNDED = {1: "synchronised", 2: "free running"}
CLOCKBOUND_SIZE = CLOCKBOUND_HEAD.size + _CB_BODY[2][0].size


def clockbound_bound(segment: bytes, now_coarse_ns: int) -> KernelBound | None:
    """ClockBound's account of this clock from one consistent copy of its segment, at
    ``now_coarse_ns`` on CLOCK_MONOTONIC_COARSE: the bound at as-of grown by the maximum
    drift since; unbounded (``synced`` False) past void-after or with a status that bounds
    nothing. None when ``segment`` is no ClockBound segment this reads (a foreign magic or
    version, too short)."""
    if len(segment) < CLOCKBOUND_HEAD.size:
        return None
    m0, m1, _size, version, _generation = CLOCKBOUND_HEAD.unpack_from(segment)
    body = _CB_BODY.get(version)
    if (m0, m1) != CLOCKBOUND_MAGIC or body is None:
        return None
    layout, drift_at, status_at = body
    if len(segment) < CLOCKBOUND_HEAD.size + layout.size:
        return None
    f = layout.unpack_from(segment, CLOCKBOUND_HEAD.size)
    as_of_ns, void_after_ns = f[0] * 10**9 + f[1], f[2] * 10**9 + f[3]
    if f[status_at] not in CLOCKBOUND_BOUNDED or now_coarse_ns > void_after_ns:
        return KernelBound(False, 0, "ClockBound")
    bound_ns = f[4] + max(0, now_coarse_ns - as_of_ns) * f[drift_at] // 10**9
    return KernelBound(True, -(-bound_ns // 1000), "ClockBound")


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
        return f"{kernel.source} says the clock is not synchronised (is chronyd or ntpd running?)"
    if kernel is not None and kernel.maxerror_us > limit_us:
        return (
            f"{kernel.source}'s error bound is {kernel.maxerror_us / US:.3f}s, beyond "
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

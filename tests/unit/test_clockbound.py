"""ClockBound's segment, as its protocol lays it out, read by ``clock_trust.clockbound_bound``
(time passed in) and by ``kernelclock.ClockBoundReader`` from a file."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest

from rasd.core import clock_trust
from rasd.core.clock_trust import CLOCKBOUND_MAGIC, KernelBound, clockbound_bound
from rasd.core.lease import US
from rasd.kernelclock import CLOCK_MONOTONIC_COARSE, ClockBoundReader

SEC = 10**9  # ns


def segment(
    as_of_ns: int,
    void_after_ns: int,
    bound_ns: int,
    drift_ppb: int = 0,
    status: int = 1,
    version: int = 2,
    generation: int = 2,
    magic: tuple[int, int] = CLOCKBOUND_MAGIC,
) -> bytes:
    """A segment as ClockBound's daemon writes it (native byte order, 8-byte aligned)."""
    head = struct.pack("=2I I H H", *magic, 80, version, generation)
    stamps = (as_of_ns // SEC, as_of_ns % SEC, void_after_ns // SEC, void_after_ns % SEC, bound_ns)
    if version == 2:
        body = struct.pack("=qq qq q Q I i B7x", *stamps, 0, drift_ppb, status, 0)
    else:
        body = struct.pack("=qq qq q I I i 4x", *stamps, drift_ppb, 0, status)
    return head + body


def test_the_layout_is_the_protocols() -> None:
    """Version 2 is 80 bytes: magic 8, size 4, version 2, generation 2, two timespecs, the
    bound, the disruption marker, drift 4, status 4, the disruption flag and padding."""
    assert len(segment(0, 0, 0)) == 80
    assert len(segment(0, 0, 0, version=1)) == 72
    assert clock_trust.CLOCKBOUND_SIZE <= 80


@pytest.mark.parametrize("version", [1, 2])
def test_the_bound_grows_by_the_drift_since_as_of(version: int) -> None:
    seg = segment(100 * SEC, 200 * SEC, 2_000_000, drift_ppb=50_000, version=version)
    assert clockbound_bound(seg, 100 * SEC) == KernelBound(True, 2_000, "ClockBound")
    # 10 s at 50 ppm: 500 us more
    assert clockbound_bound(seg, 110 * SEC) == KernelBound(True, 2_500, "ClockBound")
    # a bound of a fraction of a microsecond rounds up, never down
    assert clockbound_bound(segment(0, SEC, 1), 0) == KernelBound(True, 1, "ClockBound")


@pytest.mark.parametrize(
    ("status", "now", "synced"),
    [
        (1, 150 * SEC, True),  # synchronised
        (2, 150 * SEC, True),  # free running: the bound holds, growing by the drift
        (0, 150 * SEC, False),  # unknown
        (3, 150 * SEC, False),  # disrupted: a VM's clock moved under it
        (1, 200 * SEC + 1, False),  # past void-after: the daemon stopped updating it
    ],
)
def test_what_bounds_nothing(status: int, now: int, synced: bool) -> None:
    got = clockbound_bound(segment(100 * SEC, 200 * SEC, 1_000, status=status), now)
    assert got is not None and got.synced is synced


def test_a_foreign_segment_is_not_read() -> None:
    assert clockbound_bound(segment(0, SEC, 0, magic=(1, 2)), 0) is None
    assert clockbound_bound(segment(0, SEC, 0, version=3), 0) is None
    assert clockbound_bound(segment(0, SEC, 0)[:20], 0) is None


def test_the_reason_names_clockbound() -> None:
    why = clock_trust.judge(US, KernelBound(True, 3 * US, "ClockBound"), None, 0)
    assert why is not None and why.startswith("ClockBound's error bound is 3.000s")
    why = clock_trust.judge(US, KernelBound(False, 0, "ClockBound"), None, 0)
    assert why is not None and why.startswith("ClockBound says the clock is not synchronised")


def _now() -> int:
    return time.clock_gettime_ns(CLOCK_MONOTONIC_COARSE)


def test_the_reader_maps_the_file_and_sees_updates(tmp_path: Path) -> None:
    path = tmp_path / "shm0"
    assert ClockBoundReader(str(path)).read() is None  # no ClockBound here: ask the kernel
    now = _now()
    path.write_bytes(segment(now, now + 60 * SEC, 4_000_000))
    reader = ClockBoundReader(str(path))
    first = reader.read()
    assert first is not None and first.synced and 4_000 <= first.maxerror_us < 4_100
    with open(path, "r+b") as f:  # the daemon rewrites it in place
        f.write(segment(now, now + 60 * SEC, 4_000_000, status=3, generation=4))
    assert reader.read() == KernelBound(False, 0, "ClockBound")


def test_a_segment_mid_update_is_never_read_as_bounded(tmp_path: Path) -> None:
    """An odd generation: the writer is in the middle of an update. No copy is consistent, so
    the reader gives up saying unbounded rather than trust a torn bound."""
    path = tmp_path / "shm0"
    now = _now()
    path.write_bytes(segment(now, now + 60 * SEC, 1_000, generation=3))
    assert ClockBoundReader(str(path)).read() == KernelBound(False, 0, "ClockBound")


def test_a_short_file_is_not_a_segment(tmp_path: Path) -> None:
    path = tmp_path / "shm0"
    path.write_bytes(b"\0" * 16)
    assert ClockBoundReader(str(path)).read() is None


def test_the_daemons_clock_watch_reads_clockbound_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ClockBound's segment is, the watch's default witness is ClockBound's, not the
    kernel's: a disrupted segment stops the daemon from trusting its clock, whatever the
    kernel says; with no segment, the kernel answers."""
    from rasd import kernelclock
    from rasd.server.clockwatch import ClockGuard
    from tests.doubles.clock import FakeClock

    path = tmp_path / "shm0"
    now = _now()
    path.write_bytes(segment(now, now + 60 * SEC, 1_000, status=3))
    monkeypatch.setattr(kernelclock, "_clockbound", ClockBoundReader(str(path)))
    monkeypatch.setattr(kernelclock, "read_kernel_bound", lambda: KernelBound(True, 0))
    clock = FakeClock()
    guard = ClockGuard("kernel", 2.0, clock.now_us, clock.mono)
    guard.tick()
    assert guard.why is not None and guard.why.startswith("ClockBound says")
    monkeypatch.setattr(kernelclock, "_clockbound", ClockBoundReader(str(tmp_path / "none")))
    guard.tick()
    assert guard.why is None


def test_a_segment_made_anew_is_mapped_anew(tmp_path: Path) -> None:
    """ClockBound restarted makes a new file at the path: the reader maps it, rather than
    read the old one (past its void-after time, unbounded) for ever; gone, the kernel
    answers again."""
    path = tmp_path / "shm0"
    now = _now()
    path.write_bytes(segment(now, now + 60 * SEC, 1_000, status=3))
    reader = ClockBoundReader(str(path))
    assert reader.read() == KernelBound(False, 0, "ClockBound")
    fresh = tmp_path / "shm0.new"
    fresh.write_bytes(segment(now, now + 60 * SEC, 2_000_000))
    fresh.replace(path)  # a new inode at the same path
    got = reader.read()
    assert got is not None and got.synced and got.maxerror_us >= 2_000
    path.unlink()
    assert reader.read() is None

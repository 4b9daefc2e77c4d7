"""This host's account of its clock: ClockBound's shared memory where its daemon runs, else
the kernel's (``adjtimex``, read-only): whether it is synchronised, and its error bound. Read
by the daemon's clock watch and by the jobs."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import time

from .core.clock_trust import CLOCKBOUND_HEAD, CLOCKBOUND_SIZE, KernelBound, clockbound_bound

#: where ClockBound's daemon (2.x) keeps its segment
CLOCKBOUND_SHM = "/var/run/clockbound/shm0"
#: Linux's CLOCK_MONOTONIC_COARSE, the clock ClockBound stamps its segment with
CLOCK_MONOTONIC_COARSE = 6

#: adjtimex's return value for a clock it does not hold synchronised
TIME_ERROR = 5
STA_UNSYNC = 0x0040


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """Linux's ``struct timex`` (read-only use: ``modes`` = 0)."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_pad", ctypes.c_int * 11),
    ]


_libc: ctypes.CDLL | None = None


def read_kernel_bound() -> KernelBound:
    """The kernel's clock state (``adjtimex`` with no modes: reads, changes nothing, needs no
    privilege). A failing call counts as unsynchronised."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    tx = _Timex()
    state = _libc.adjtimex(ctypes.byref(tx))
    synced = state not in (-1, TIME_ERROR) and not tx.status & STA_UNSYNC
    return KernelBound(synced, int(tx.maxerror))


class ClockBoundReader:
    """ClockBound's segment at ``path``, mapped read-only while the same file is there (a
    ClockBound restarted may make it anew: the path is looked at on every read, once a
    second, and a new file mapped in place of the old). A copy is taken between two equal,
    even generation numbers (the writer makes it odd while it updates)."""

    def __init__(self, path: str = CLOCKBOUND_SHM) -> None:
        self.path = path
        self._map: mmap.mmap | None = None
        self._file: tuple[int, int] | None = None  # (device, inode) of the file mapped

    def _mapped(self) -> mmap.mmap | None:
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        now = None if st is None else (st.st_dev, st.st_ino)
        if now != self._file and self._map is not None:
            self._map.close()
            self._map = None
        self._file = now
        if self._map is None and st is not None and st.st_size >= CLOCKBOUND_SIZE:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            try:
                opened = os.fstat(fd)
                if (opened.st_ino, opened.st_size) != (st.st_ino, st.st_size):
                    self._file = None  # replaced between the two looks: the next read maps it
                    return None
                self._map = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                os.close(fd)
        return self._map

    def read(self) -> KernelBound | None:
        """ClockBound's account now; None where no segment this reads is (the caller asks the
        kernel), unbounded when no consistent copy can be had."""
        seg = self._mapped()
        if seg is None:
            return None
        gen_at = CLOCKBOUND_HEAD.size - 2
        for _ in range(100):
            before = seg[gen_at : gen_at + 2]
            copy = seg[:CLOCKBOUND_SIZE]
            if int.from_bytes(before, sys.byteorder) & 1 or seg[gen_at : gen_at + 2] != before:
                continue
            return clockbound_bound(copy, time.clock_gettime_ns(CLOCK_MONOTONIC_COARSE))
        return KernelBound(False, 0, "ClockBound")


_clockbound = ClockBoundReader()


def read_host_bound() -> KernelBound:
    """ClockBound's account where its segment is, else the kernel's."""
    return _clockbound.read() or read_kernel_bound()

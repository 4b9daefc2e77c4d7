"""The kernel's account of this host's clock (``adjtimex``, read-only): whether it holds it
synchronised, and its error bound. Read by the daemon's clock watch and by the jobs."""

from __future__ import annotations

import ctypes
import ctypes.util

from .core.clock_trust import KernelBound

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

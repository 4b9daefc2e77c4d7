"""glibc malloc settings of the daemon process (``rasd serve`` only): one arena, and :func:`trim`
once the store is up (docs/operations.md, "The daemon on a host (systemd)", Memory).
"""

from __future__ import annotations

import os
from typing import Any

M_ARENA_MAX = -8  # glibc's malloc.h

_libc: Any = None


def _glibc() -> Any:
    global _libc
    if _libc is None:
        try:
            if not os.confstr("CS_GNU_LIBC_VERSION"):
                return None
        except (ValueError, OSError, AttributeError):
            return None
        import ctypes

        _libc = ctypes.CDLL(None)
    return _libc


def one_arena() -> bool:
    """One malloc arena for every thread; call before any other thread starts. True if set."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    libc = _glibc()
    return libc is not None and libc.mallopt(M_ARENA_MAX, 1) == 1


def trim() -> None:
    """Return the free pages of the malloc heap to the kernel (``malloc_trim(0)``)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)

"""glibc malloc settings of the daemon process (``rasd serve`` only; elsewhere nothing).

* One malloc arena (``M_ARENA_MAX`` = 1, what ``MALLOC_ARENA_MAX=1`` does): glibc gives every
  thread that allocates its own arena, and the daemon's one other thread (the default
  executor: the store's import, credentials) would keep about 1.5 MB of arena for a few objects
  it made. The loop thread does nearly all allocation, so one lock-shared arena costs nothing.
  A ``MALLOC_ARENA_MAX`` set by the operator wins (then this does nothing).
* :func:`trim` once the store is up: hands back to the kernel the heap pages that start-up
  (imports, the first DynamoDB exchanges) freed, about 1 MB.

Both go through ctypes (about 0.2 MB), loaded only on glibc.
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

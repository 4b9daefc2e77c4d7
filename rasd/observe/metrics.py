"""Counters and latency samples of one daemon. Plain ints: cheap on the hot path.

``Counters.snapshot()`` feeds the ``stats`` op and ``rasd stats``. ``hits`` counts the cache
hits the server's fast path answered (a plain attribute: one addition per hit); each is one
``req.total`` and one ``cache.hit``, which is how every reader sees them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

#: the counters each fast-path hit stands for
HIT_COUNTERS = ("req.total", "cache.hit")


class Counters:
    __slots__ = ("c", "hits")

    def __init__(self) -> None:
        self.c: Counter[str] = Counter()
        self.hits = 0

    def inc(self, name: str, n: int = 1) -> None:
        self.c[name] += n

    def __getitem__(self, name: str) -> int:
        return self.c[name] + (self.hits if name in HIT_COUNTERS else 0)

    def snapshot(self) -> dict[str, Any]:
        out = dict(self.c)
        if self.hits:
            for name in HIT_COUNTERS:
                out[name] = out.get(name, 0) + self.hits
        return out

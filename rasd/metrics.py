"""Counters and latency samples of one daemon. Plain ints: cheap on the hot path.

``Counters.snapshot()`` feeds the ``stats`` op and ``rasd stats``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class Counters:
    __slots__ = ("c",)

    def __init__(self) -> None:
        self.c: Counter[str] = Counter()

    def inc(self, name: str, n: int = 1) -> None:
        self.c[name] += n

    def __getitem__(self, name: str) -> int:
        return self.c[name]

    def snapshot(self) -> dict[str, Any]:
        return dict(self.c)

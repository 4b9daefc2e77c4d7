"""A small table of sub-partitions for the prefetcher's tests: what the available index
shows, changeable between reads, and a prefetcher over it on a clock that stands still."""

from __future__ import annotations

import asyncio
import random

from rasd.config import Config
from rasd.core.errors import Timeout
from rasd.core.lease import ResourceItem, fmt_time, partition_of


class _TableStore:
    """Answers ``query_available`` from a dict of sub-partition -> items in index order,
    so a test can change what the index shows between calls (a small table, not a fake of
    DynamoDB's semantics: no conditions, no versions checked)."""

    def __init__(self, parts: dict[int, list[ResourceItem]]) -> None:
        self.parts = parts
        self.reads: list[int] = []

    async def query_available(
        self, part: str, limit: int, forward: bool, deadline: float, after: object = None
    ) -> list[ResourceItem]:
        n = int(part.rsplit(".", 1)[1])
        self.reads.append(n)
        items = self.parts.get(n, [])
        return (items if forward else items[::-1])[:limit]

    async def query_quarantined(self, *args: object) -> tuple[list[str], bool]:
        return [], True  # after an empty sweep: no item in quarantine


class SlowStore(_TableStore):
    """Every read takes a moment, so that concurrent requests meet a sweep in flight;
    ``fail_next`` reads fail with Timeout."""

    fail_next = 0

    async def query_available(
        self, part: str, limit: int, forward: bool, deadline: float, after: object = None
    ) -> list[ResourceItem]:
        await asyncio.sleep(0.01)
        if self.fail_next:
            self.fail_next -= 1
            raise Timeout("deadline passed")
        return await super().query_available(part, limit, forward, deadline, after)


def _prefetcher(store: _TableStore, **kw: object) -> tuple[object, object]:
    from rasd.daemon.prefetch import Prefetcher
    from rasd.observe.metrics import Counters

    class Clock:
        t = 100.0

        def mono(self) -> float:
            return self.t

        def now_us(self) -> int:
            return 10**9

    cfg = Config(**kw).validate()  # type: ignore[arg-type]
    p = Prefetcher(cfg, store, Clock(), Counters(), random.Random(3), seed=0)  # type: ignore[arg-type]
    pool = type("P", (), {"client_id": "c", "pool_id": "p"})()
    return p, pool


def _free(name: str, version: int) -> ResourceItem:
    n = partition_of(name)
    return ResourceItem(
        "c", name, "p", "us-east-1", f"c.p.us-east-1.{n}", version, lease_available=fmt_time(0)
    )

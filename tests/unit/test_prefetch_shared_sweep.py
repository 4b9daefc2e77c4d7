"""Requests that find a pool's candidate buffer empty share the sweep under way
(rasd.daemon.prefetch): a burst that outruns the buffer costs one sweep at a time, not one per
waiting request."""

from __future__ import annotations

import asyncio
from typing import Any

from rasd.core.errors import Timeout
from rasd.core.lease import PARTITIONS, ResourceItem, partition_of
from tests.helpers.prefetch import SlowStore, _free, _prefetcher, _TableStore


def pool_items(n: int) -> dict[int, list[ResourceItem]]:
    parts: dict[int, list[ResourceItem]] = {k: [] for k in range(PARTITIONS)}
    for i in range(n):
        it = _free(f"r{i:04d}", 0)
        parts[partition_of(it.resource)].append(it)
    return parts


async def test_concurrent_requests_on_an_empty_buffer_share_one_sweep() -> None:
    store = SlowStore(pool_items(300))
    p: Any
    p, pool = _prefetcher(store, prefetch_min=1, prefetch_max=512, prefetch_page=512)
    got = await asyncio.gather(*(p.candidate(pool, 1e9) for _ in range(50)))
    assert all(c is not None for c in got)
    assert len({c.item.resource for c in got}) == 50
    assert p.counters["prefetch.sweeps_joined"] >= 40
    assert len(store.reads) <= 3 * PARTITIONS  # each request sweeping: 50 x 10 and more
    assert not p._sweeps


async def test_an_empty_pool_is_swept_once_for_all_and_answers_none() -> None:
    store = SlowStore({})
    p: Any
    p, pool = _prefetcher(store)
    got = await asyncio.gather(*(p.candidate(pool, 1e9) for _ in range(20)))
    assert got == [None] * 20
    assert sorted(set(store.reads)) == list(range(PARTITIONS))
    assert len(store.reads) <= 2 * PARTITIONS


async def test_a_failed_sweep_makes_the_waiting_requests_sweep_themselves() -> None:
    """The sweep's request had a nearer deadline: its failure is not the others' answer."""
    store = SlowStore(pool_items(50))
    store.fail_next = 1
    p: Any
    p, pool = _prefetcher(store, prefetch_min=1, prefetch_page=64)
    first = asyncio.ensure_future(p.candidate(pool, 1e9))
    await asyncio.sleep(0)
    others = [asyncio.ensure_future(p.candidate(pool, 1e9)) for _ in range(5)]
    done = await asyncio.gather(first, *others, return_exceptions=True)
    assert isinstance(done[0], Timeout)
    assert all(c is not None and not isinstance(c, BaseException) for c in done[1:])


class GatedStore(_TableStore):
    """The first read answers what the index showed when it was sent, but only once
    ``gate`` opens: a sweep slowed down by its first read (a stalled backend)."""

    def __init__(self, parts: dict[int, list[ResourceItem]]) -> None:
        super().__init__(parts)
        self.gate = asyncio.Event()
        self.first_sent = asyncio.Event()

    async def query_available(
        self, part: str, limit: int, forward: bool, deadline: float, after: object = None
    ) -> list[ResourceItem]:
        items = await super().query_available(part, limit, forward, deadline, after)
        if len(self.reads) == 1:
            self.first_sent.set()
            await self.gate.wait()
        return items


async def test_an_empty_sweep_begun_too_long_before_a_request_does_not_answer_it() -> None:
    """A request that joins a sweep begun more than ``exhausted_backoff`` before it came
    sweeps again when that sweep finds nothing, as the exhausted mark would have expired:
    here an item was freed in the sub-partition the slow sweep had already read."""
    store = GatedStore({})
    p: Any
    p, pool = _prefetcher(store)
    first = asyncio.ensure_future(p.candidate(pool, 1e9))
    await store.first_sent.wait()
    n = store.reads[0]
    name = next(f"r{i:04d}" for i in range(10_000) if partition_of(f"r{i:04d}") == n)
    store.parts[n] = [_free(name, 0)]
    p.clock.t += p.cfg.exhausted_backoff + 1.0
    second = asyncio.ensure_future(p.candidate(pool, 1e9))
    await asyncio.sleep(0)
    store.gate.set()
    got_first, got_second = await asyncio.gather(first, second)
    assert got_first is None  # its own sweep began when it came: the pool was empty then
    assert got_second is not None and got_second.item.resource == name
    assert p.counters["prefetch.sweeps_joined"] == 1
    assert p.counters["prefetch.sweeps_too_old"] == 1

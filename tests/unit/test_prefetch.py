"""CandidateBuffer: staleness, demand-sized targets, exhaustion memo, spreading."""

from __future__ import annotations

import random

from rasd.config import Config
from rasd.lease import ResourceItem, fmt_time
from rasd.prefetch import CandidateBuffer


def items(n: int, start: int = 0) -> list[ResourceItem]:
    return [
        ResourceItem(
            "c", f"r{i}", "p", "us-east-1", "c.p.us-east-1.0", 0, lease_available=fmt_time(i)
        )
        for i in range(start, start + n)
    ]


def buf(**kw: object) -> CandidateBuffer:
    return CandidateBuffer(Config(**kw).validate(), random.Random(1))  # type: ignore[arg-type]


def test_stale_candidates_are_dropped() -> None:
    """A candidate older than candidate_max_age is never handed out."""
    b = buf(candidate_max_age=10.0)
    b.add(items(2), now=100.0)
    assert b.take(105.0) is not None
    assert b.take(111.0) is None
    assert len(b) == 0


def test_target_follows_demand_within_bounds() -> None:
    """Idle pools keep prefetch_min candidates; busy pools more, never above prefetch_max."""
    b = buf(prefetch_min=4, prefetch_max=32)
    assert b.target() == 4
    now = 0.0
    for _ in range(2000):  # 200 takes per second for 10 s
        now += 0.005
        b.take(now)
    assert b.target() == 32
    b2 = buf(prefetch_min=4, prefetch_max=1000)
    now = 0.0
    for _ in range(200):  # 20 per second
        now += 0.05
        b2.take(now)
    assert 20 <= b2.target() <= 60


def test_add_samples_at_random_up_to_room() -> None:
    """From a page, the buffer keeps a random sample no larger than its target."""
    b = buf(prefetch_min=4, prefetch_max=4)
    kept = b.add(items(64), now=0.0)
    assert kept == 4 and len(b) == 4
    names = {c.item.resource for c in b.q}
    assert names != {"r0", "r1", "r2", "r3"}  # not simply the head of the index


def test_different_daemons_hold_different_items() -> None:
    """Two buffers reading the same page mostly pick different candidates (spreading)."""
    page = items(64)
    a = CandidateBuffer(Config(prefetch_min=8).validate(), random.Random(1))
    b = CandidateBuffer(Config(prefetch_min=8).validate(), random.Random(2))
    a.add(page, 0.0)
    b.add(page, 0.0)
    overlap = {c.item.resource for c in a.q} & {c.item.resource for c in b.q}
    assert len(overlap) <= 4


def test_exhaustion_memo() -> None:
    """After an empty sweep NO_CAPACITY is answered from memory until the backoff ends."""
    b = buf(exhausted_backoff=1.0)
    b.mark_exhausted(10.0)
    assert b.exhausted(10.5)
    assert not b.exhausted(11.1)


def test_start_point_within_seen_span() -> None:
    """Random starting points fall within the lease_available span seen in that partition."""
    b = buf()
    assert b.start_point(3) is None
    b.learn_span(3, items(100))
    points = [b.start_point(3) for _ in range(50)]
    seen = [p for p in points if p is not None]
    assert seen and all(fmt_time(0) <= p <= fmt_time(99) for p in seen)

"""CandidateBuffer: staleness, demand-sized targets, exhaustion memo, spreading."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from rasd.config import Config
from rasd.lease import PARTITIONS, ResourceItem, fmt_time
from rasd.prefetch import DEMAND_HALF_LIFE, REFILL_HORIZON, CandidateBuffer


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


# ------------------------------------------------------------------- demand (EWMA of takes/s)
def test_first_take_counts_as_one_take_per_half_life() -> None:
    """With no previous take the gap is taken as one half-life: alpha is exactly 1/2."""
    b = buf()
    b.take(100.0)
    assert b.rate == pytest.approx(0.5 * (1.0 / DEMAND_HALF_LIFE))


def test_ewma_step_uses_the_gap_since_the_previous_take() -> None:
    b = buf()
    b.take(100.0)
    before = b.rate
    b.take(101.0)  # dt = 1 s: alpha = 1 - 2 ** (-1 / half-life), target rate 1/s
    alpha = 1.0 - 2.0 ** (-1.0 / DEMAND_HALF_LIFE)
    assert b.rate == pytest.approx(before + alpha * (1.0 - before))


def test_steady_demand_converges_to_its_rate() -> None:
    b = buf(prefetch_min=1, prefetch_max=1000)
    now = 0.0
    for _ in range(600):  # 10 takes per second for 60 s
        now += 0.1
        b.take(now)
    assert b.rate == pytest.approx(10.0, rel=1e-3)
    assert b.target() == math.ceil(10.0 * REFILL_HORIZON)


def test_demand_falls_after_a_quiet_spell() -> None:
    """The next take after a long pause pulls the rate down to about one per pause."""
    b = buf()
    now = 0.0
    for _ in range(100):
        now += 0.01
        b.take(now)
    assert b.rate > 10
    b.take(now + 60.0)
    assert b.rate < 0.1


def test_takes_at_the_same_instant_are_bounded() -> None:
    """Two takes with no time between them count as 1 ms apart, never a division by zero."""
    b = buf(prefetch_max=100_000)
    b.take(5.0)
    b.take(5.0)
    assert 0 < b.rate <= 1000.0


# -------------------------------------------------------------------------------- sizing
def test_target_is_clamped_to_min_and_max() -> None:
    b = buf(prefetch_min=4, prefetch_max=16)
    b.rate = 0.0
    assert b.target() == 4
    b.rate = 5.0  # 10 candidates for REFILL_HORIZON = 2 s
    assert b.target() == 10
    b.rate = 1000.0
    assert b.target() == 16


def test_needs_refill_below_half_the_target() -> None:
    b = buf(prefetch_min=8, prefetch_max=8)
    assert b.needs_refill()
    b.add(items(4), now=0.0)
    assert not b.needs_refill()  # 4 is half of 8
    b.q.pop()
    assert b.needs_refill()


def test_needs_refill_when_empty_even_with_a_target_of_one() -> None:
    b = buf(prefetch_min=1, prefetch_max=1)
    assert b.needs_refill()
    b.add(items(1), now=0.0)
    assert not b.needs_refill()


# ----------------------------------------------------------------------- take and stale drop
def test_take_is_first_in_first_out() -> None:
    b = buf(prefetch_min=4, prefetch_max=4)
    b.add(items(1, start=0), now=0.0)
    b.add(items(1, start=1), now=1.0)
    first, second = b.take(2.0), b.take(2.0)
    assert first is not None and first.item.resource == "r0" and first.fetched == 0.0
    assert second is not None and second.item.resource == "r1" and second.fetched == 1.0


def test_take_drops_only_the_stale_head() -> None:
    """Stale candidates in front are discarded; the first fresh one is returned, the rest kept."""
    b = buf(prefetch_min=4, prefetch_max=4, candidate_max_age=10.0)
    b.add(items(2, start=0), now=0.0)
    b.add(items(2, start=2), now=8.0)
    c = b.take(10.5)  # r0, r1 are 10.5 s old; r2, r3 2.5 s
    assert c is not None and c.item.resource == "r2"
    assert [x.item.resource for x in b.q] == ["r3"]


def test_candidate_exactly_max_age_old_is_still_fresh() -> None:
    b = buf(candidate_max_age=10.0)
    b.add(items(1), now=0.0)
    assert b.take(10.0) is not None


def test_take_from_empty_returns_none_and_still_counts_demand() -> None:
    b = buf()
    assert b.take(1.0) is None
    assert b.rate > 0


# ------------------------------------------------------------------------------- sampling
def test_add_skips_items_already_held() -> None:
    b = buf(prefetch_min=8, prefetch_max=8)
    assert b.add(items(3), now=0.0) == 3
    assert b.add(items(5), now=1.0) == 2  # r0..r2 are held already
    assert sorted(c.item.resource for c in b.q) == [f"r{i}" for i in range(5)]


def test_add_to_a_full_buffer_keeps_nothing() -> None:
    b = buf(prefetch_min=4, prefetch_max=4)
    b.add(items(4), now=0.0)
    assert b.add(items(10, start=4), now=1.0) == 0
    assert len(b) == 4


def test_add_fills_exactly_the_room_left() -> None:
    b = buf(prefetch_min=6, prefetch_max=6)
    b.add(items(2), now=0.0)
    assert b.add(items(50, start=2), now=1.0) == 4
    assert len(b) == 6
    assert all(c.fetched == 1.0 for c in list(b.q)[2:])


def test_sample_is_reproducible_with_the_same_rng_seed() -> None:
    page = items(64)
    a, b = buf(prefetch_min=8), buf(prefetch_min=8)
    a.add(page, 0.0)
    b.add(page, 0.0)
    assert [c.item.resource for c in a.q] == [c.item.resource for c in b.q]


# ------------------------------------------------------------------------------ exhaustion
def test_exhaustion_lasts_exactly_the_backoff() -> None:
    b = buf(exhausted_backoff=2.5)
    assert not b.exhausted(0.0)
    b.mark_exhausted(10.0)
    assert b.exhausted(10.0)
    assert b.exhausted(12.49)
    assert not b.exhausted(12.5)


def test_a_new_empty_sweep_extends_the_exhaustion() -> None:
    b = buf(exhausted_backoff=1.0)
    b.mark_exhausted(10.0)
    b.mark_exhausted(10.8)
    assert b.exhausted(11.5)


def test_adding_candidates_does_not_clear_exhaustion() -> None:
    """A refill landing late does not clear the memo: only its end does."""
    b = buf(exhausted_backoff=1.0)
    b.mark_exhausted(10.0)
    b.add(items(2), now=10.1)
    assert b.exhausted(10.2)


# ------------------------------------------------------------------------------ spreading
def test_partitions_are_a_shuffled_permutation() -> None:
    b = buf()
    orders = [b.partitions() for _ in range(5)]
    assert all(sorted(o) == list(range(PARTITIONS)) for o in orders)
    assert len({tuple(o) for o in orders}) > 1


def test_learn_span_widens_and_ignores_items_without_a_time() -> None:
    b = buf()
    b.learn_span(0, items(5, start=10))
    assert b.span[0] == (10, 14)
    b.learn_span(0, items(2, start=3))
    assert b.span[0] == (3, 14)
    b.learn_span(1, [replace(it, lease_available=None) for it in items(3)])
    assert 1 not in b.span


def test_start_point_none_for_a_single_point_span() -> None:
    b = buf()
    b.learn_span(2, items(1, start=7))
    assert all(b.start_point(2) is None for _ in range(20))

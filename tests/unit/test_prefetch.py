"""CandidateBuffer: staleness, demand-sized targets, exhaustion memo, spreading."""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import replace

import pytest

from rasd.config import Config
from rasd.lease import PARTITIONS, ResourceItem, fmt_time
from rasd.prefetch import (
    DEMAND_HALF_LIFE,
    MIN_PAGE,
    NAMES_MAX,
    REFILL_HORIZON,
    SEEN_MAX,
    CandidateBuffer,
    NameModel,
    host_seed,
)


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


def test_learn_keeps_a_bounded_reservoir_per_partition() -> None:
    b = buf()
    b.learn(0, items(500))
    assert len(b.seen[0]) == SEEN_MAX
    assert set(b.seen[0]) <= {fmt_time(i) for i in range(500)}
    b.learn(1, [replace(it, lease_available=None) for it in items(3)])
    assert 1 not in b.seen


def test_no_start_key_before_anything_was_seen() -> None:
    b = buf()
    assert all(b.start_key(3) is None for _ in range(20))


def same_time_items(n: int, t: int = 7, part: int = 0) -> list[ResourceItem]:
    """A pool seeded in one batch: every item has the same lease_available."""
    return [
        ResourceItem(
            "c",
            f"res-{i:05d}",
            "p",
            "us-east-1",
            f"c.p.us-east-1.{part}",
            0,
            lease_available=fmt_time(t),
        )
        for i in range(n)
    ]


def test_start_keys_spread_when_all_times_are_equal() -> None:
    """The start key's resource varies even when every lease_available is the same, and
    stays shaped like the names seen (so it falls inside their range)."""
    b = buf()
    b.learn(0, same_time_items(64))
    keys = [b.start_key(0) for _ in range(200)]
    got = [k for k in keys if k is not None]
    assert len(got) > 150  # HEAD_SHARE of reads start at an end
    assert {t for t, _ in got} == {fmt_time(7)}
    names = [r for _, r in got]
    assert len(set(names)) > 40  # of the 70 names res-00000..res-00069
    assert all(len(r) == 9 and r.startswith("res-000") for r in names)


def test_name_model_fills_the_range_between_both_ends() -> None:
    """Names seen at the head (res-00000..31) and the tail (res-00168..199) of an index give
    starts all over the range: each position draws from the span of characters seen there."""
    rng = random.Random(3)
    m = NameModel()
    its = same_time_items(200)
    for it in its[:32] + its[-32:]:
        m.learn(it.resource, rng)
    draws = [d for d in (m.draw(rng) for _ in range(400)) if d is not None]
    middle = [d for d in draws if "res-00032" < d < "res-00168"]
    assert len(middle) > len(draws) // 3
    assert all("res-00000" <= d <= "res-00199" for d in draws)
    assert NameModel().draw(rng) is None


def test_first_reads_from_an_end_cover_both_ends() -> None:
    """Before any start key is known, a pool's second read from an end goes the other way."""
    for seed in range(10):
        b = CandidateBuffer(Config().validate(), random.Random(seed))
        first = b.end_direction()
        assert b.end_direction() is not first


def test_name_model_is_bounded() -> None:
    rng = random.Random(1)
    m = NameModel()
    for i in range(10_000):
        m.learn(f"n{i}", rng)
    assert len(m.names) == NAMES_MAX and m.n == 10_000


def test_home_partition_comes_first_most_of_the_time() -> None:
    """Daemons are spread over sub-partitions by their host identity, plus randomness."""
    b = CandidateBuffer(Config().validate(), random.Random(5), seed=13)
    firsts = [b.partitions()[0] for _ in range(400)]
    home = firsts.count(13 % PARTITIONS) / len(firsts)
    assert 0.65 < home < 0.9
    assert len(set(firsts)) == PARTITIONS
    assert all(sorted(b.partitions()) == list(range(PARTITIONS)) for _ in range(5))


def test_host_seed_is_stable() -> None:
    assert host_seed() == host_seed()


def test_page_follows_the_room_left() -> None:
    b = buf(prefetch_min=4, prefetch_max=64, prefetch_page=64)
    assert b.page() == max(MIN_PAGE, 8)  # target 4, empty: twice the room
    b.rate = 100.0  # target 64
    assert b.page() == 64
    b.add(items(60), now=0.0)
    assert b.page() == MIN_PAGE


def simulate(daemons: int, items_n: int, seed: int) -> float:
    """Daemons reading one sub-partition of same-time items through start keys (a sorted
    index, ExclusiveStartKey placed by bisection): the share of held candidates that another
    daemon holds too."""
    index = same_time_items(items_n)
    names = [it.resource for it in index]
    bufs = [
        CandidateBuffer(Config(prefetch_min=4).validate(), random.Random(seed + d), seed=d)
        for d in range(daemons)
    ]
    for b in bufs:
        b.learn(0, index[:32] + index[-32:])  # a cold start read the head and the tail
        b.q.clear()
    for b in bufs:
        start = b.start_key(0)
        page = b.page()
        if start is None:
            got = index[:page]
        else:
            i = bisect.bisect_right(names, start[1])
            got = index[i : i + page] or index[:page]
        b.add(got, 0.0)
    held = [c.item.resource for b in bufs for c in b.q]
    return 1 - len(set(held)) / len(held)


def test_daemons_on_a_same_time_pool_hold_different_items() -> None:
    """20 daemons, 200 same-time items: few candidates are held twice (reading the head,
    as before, they would all hold the same 64)."""
    shared = [simulate(20, 200, s) for s in range(5)]
    assert sorted(shared)[2] < 0.35


def test_target_covers_the_time_a_refill_takes() -> None:
    """A slow DynamoDB (or a loaded host) makes the buffer deeper, within prefetch_max."""
    b = buf(prefetch_min=4, prefetch_max=64)
    b.rate = 4.0
    assert b.target() == 8  # REFILL_HORIZON = 2 s
    for _ in range(40):
        b.note_refill(1.0)
    assert b.refill_s == pytest.approx(1.0, rel=1e-3)
    assert b.target() == 16  # 4/s x (2 s + 2 x 1 s)
    for _ in range(40):
        b.note_refill(100.0)
    assert b.target() == 64

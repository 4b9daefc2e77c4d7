"""CandidateBuffer: staleness, demand-sized targets, exhaustion memo, spreading."""

from __future__ import annotations

import bisect
import math
import random
from collections import Counter
from dataclasses import replace

import pytest

from rasd.config import Config
from rasd.core.lease import PARTITIONS, ResourceItem, fmt_time, partition_of
from rasd.daemon.candidates import MIN_PAGE, TAKEN_MAX, Candidate, CandidateBuffer
from rasd.daemon.lanes import (
    CONTENDED_MEMORY,
    END_KEEP,
    NAMES_MAX,
    SEEN_MAX,
    Lanes,
    NameModel,
    Read,
    StartKey,
    host_seed,
    spread_order,
)
from rasd.daemon.sizing import BURST_HALF_LIFE, DEMAND_HALF_LIFE, REFILL_HORIZON
from tests.helpers.prefetch import _free, _prefetcher, _TableStore


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
    """A candidate older than candidate_max_age is never handed out, and is counted as
    dropped (``prefetch.stale``: a miss for age, not for an empty buffer)."""
    b = buf(candidate_max_age=10.0)
    b.add(items(3), now=100.0)
    assert b.take(105.0) is not None
    assert b.stale == 0
    assert b.take(111.0) is None
    assert len(b) == 0
    assert b.stale == 2


def test_a_quiet_pool_keeps_its_candidates_longer() -> None:
    """Where free items sit claimable for minutes, a candidate is kept up to a quarter of
    that, at most candidate_max_age_quiet: a host that takes a new key now and then skips the
    index read. For a minute after a lost race, at most half the age of the candidate that
    lost; a busy pool, or the setting at 0: candidate_max_age."""
    b = buf(candidate_max_age=10.0, candidate_max_age_quiet=120.0)
    assert b.max_age(100.0) == 10.0  # nothing read yet: no idea how quiet
    b.fleet.observe(0, 20, False, [400.0] * 20, now=100.0)  # items claimable for 400 s
    assert b.max_age(100.0) == 100.0
    b.fleet.observe(1, 20, False, [4000.0] * 20, now=100.0)
    assert b.max_age(100.0) == 120.0  # at most the setting
    b.add(items(2), now=100.0)
    assert b.take(190.0) is not None  # 90 s old, kept
    # a lost race of a candidate 90 s old: for a minute, at most half that
    b.lost(Candidate(items(1)[0], 100.0))
    assert b.max_age(b.now) == 45.0
    assert b.take(191.0) is None  # the second, 91 s old, is dropped now
    assert b.max_age(b.now + 61.0) == 120.0
    # one lost at 15 s (young: others take what this host takes): the plain limit
    b.lost(Candidate(items(1)[0], b.now - 15.0))
    assert b.max_age(b.now) == 10.0
    # a busy pool (items claimed soon after they are freed): the plain limit
    busy = buf(candidate_max_age=10.0, candidate_max_age_quiet=120.0)
    busy.fleet.observe(0, 20, False, [20.0] * 20, now=0.0)
    assert busy.max_age(0.0) == 10.0
    # the setting at 0 turns it off
    off = buf(candidate_max_age=10.0, candidate_max_age_quiet=0.0)
    off.fleet.observe(0, 20, False, [4000.0] * 20, now=0.0)
    assert off.max_age(0.0) == 10.0


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


# ----------------------------------------------- demand (two decaying counts of takes, per s)
def test_first_take_counts_one_take_in_each_count() -> None:
    b = buf()
    b.take(100.0)
    assert b.fast == pytest.approx(math.log(2) / BURST_HALF_LIFE)
    assert b.slow == pytest.approx(math.log(2) / DEMAND_HALF_LIFE)
    assert b.rate == max(b.fast, b.slow)


def test_counts_decay_by_their_half_lives_between_takes() -> None:
    b = buf()
    b.take(100.0)
    fast, slow = b.fast, b.slow
    b.take(101.0)  # one second later: each count halves once per half-life, plus one take
    assert b.fast == pytest.approx(fast * 2 ** (-1 / BURST_HALF_LIFE) + fast)
    assert b.slow == pytest.approx(slow * 2 ** (-1 / DEMAND_HALF_LIFE) + slow)


def test_steady_demand_converges_to_its_rate() -> None:
    """10 takes a second: both counts settle near 10/s (just after a take, a little above)."""
    b = buf(prefetch_min=1, prefetch_max=1000)
    now = 0.0
    for _ in range(600):  # 10 takes per second for 60 s
        now += 0.1
        b.take(now)
    assert 10.0 <= b.slow <= b.fast <= 11.0
    assert b.target() == math.ceil(b.rate * REFILL_HORIZON)


def test_a_burst_after_a_pause_is_seen_within_a_few_takes() -> None:
    """Eight takes in 0.4 s after a 10 s pause: the demand (and the target) follow at once;
    the slow count alone (the old 3 s EWMA) would still say about 2 a second."""
    b = buf(prefetch_min=4, prefetch_max=64)
    b.take(0.0)
    now = 10.0
    for _ in range(8):
        now += 0.05
        b.take(now)
    assert b.slow < 3.0
    assert b.rate > 8.0
    assert b.target() >= math.ceil(8.0 * REFILL_HORIZON) > 4


def test_demand_falls_after_a_quiet_spell() -> None:
    """The next take after a long pause leaves about one take per burst half-life."""
    b = buf(prefetch_min=4)
    now = 0.0
    for _ in range(100):
        now += 0.01
        b.take(now)
    assert b.rate > 10
    b.take(now + 60.0)
    assert b.rate == pytest.approx(math.log(2) / BURST_HALF_LIFE, rel=1e-3)
    assert b.target() == 4


def test_takes_at_the_same_instant_are_bounded() -> None:
    """Two takes with no time between them count as 1 ms apart, never a division by zero."""
    b = buf(prefetch_max=100_000)
    b.take(5.0)
    b.take(5.0)
    assert b.rate == pytest.approx(2 * math.log(2) / BURST_HALF_LIFE)


# -------------------------------------------------------------------------------- sizing
def test_target_is_clamped_to_min_and_max() -> None:
    b = buf(prefetch_min=4, prefetch_max=16)
    b.rate = 0.0
    assert b.target() == 4
    b.rate = 10.0
    assert b.target() == math.ceil(10.0 * REFILL_HORIZON)
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
    orders = [b.lanes.partitions() for _ in range(5)]
    assert all(sorted(o) == list(range(PARTITIONS)) for o in orders)
    assert len({tuple(o) for o in orders}) > 1


def test_learn_keeps_a_bounded_reservoir_per_partition() -> None:
    b = buf()
    b.lanes.learn(0, items(500))
    assert len(b.lanes.seen[0]) == SEEN_MAX
    assert set(b.lanes.seen[0]) <= {fmt_time(i) for i in range(500)}
    b.lanes.learn(1, [replace(it, lease_available=None) for it in items(3)])
    assert 1 not in b.lanes.seen


def test_no_start_key_before_anything_was_seen() -> None:
    b = buf()
    assert all(b.lanes.start_key(3) is None for _ in range(20))


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


def both_ends_read(b: CandidateBuffer) -> CandidateBuffer:
    b.lanes.end_direction()
    b.lanes.end_direction()
    return b


def test_start_keys_spread_when_all_times_are_equal() -> None:
    """The start key's resource varies even when every lease_available is the same, and
    stays shaped like the names seen (so it falls inside their range)."""
    b = both_ends_read(buf())
    b.lanes.learn(0, same_time_items(64))
    keys = [b.lanes.start_key(0) for _ in range(200)]
    got = [k for k in keys if k is not None]
    assert len(got) == 200
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
        first = b.lanes.end_direction()
        assert b.lanes.end_direction() is not first


def test_name_model_is_bounded() -> None:
    rng = random.Random(1)
    m = NameModel()
    for i in range(10_000):
        m.learn(f"n{i}", rng)
    assert len(m.names) == NAMES_MAX and m.n == 10_000


def test_sweeps_follow_the_daemons_spread_order() -> None:
    """Daemons are spread over sub-partitions by a hash of their identity, the pool and the
    round: each sweep reads every sub-partition, in an order that changes every round."""
    b = CandidateBuffer(Config().validate(), random.Random(5), seed=13, pool="c/p")
    orders = [b.lanes.partitions() for _ in range(400)]
    assert all(sorted(o) == list(range(PARTITIONS)) for o in orders)
    assert orders[0] == spread_order(13, "c/p", 1) and orders[-1] == spread_order(13, "c/p", 400)
    firsts = Counter(o[0] for o in orders)
    assert len(firsts) == PARTITIONS and max(firsts.values()) < 0.2 * len(orders)


def test_host_seed_is_stable() -> None:
    assert host_seed() == host_seed()


def test_page_follows_the_room_left() -> None:
    b = buf(prefetch_min=4, prefetch_max=64, prefetch_page=64)
    assert b.page() == max(MIN_PAGE, 8)  # target 4, empty: twice the room
    b.rate = 100.0  # target 64
    assert b.page() == 64
    b.add(items(60), now=0.0)
    assert b.page() == MIN_PAGE


def test_target_covers_the_time_a_refill_takes() -> None:
    """A slow DynamoDB (or a loaded host) makes the buffer deeper, within prefetch_max."""
    b = buf(prefetch_min=4, prefetch_max=64)
    b.rate = 8.0
    assert b.target() == math.ceil(8.0 * REFILL_HORIZON)
    for _ in range(40):
        b.note_refill(1.0)
    assert b.refill_s == pytest.approx(1.0, rel=1e-3)
    assert b.target() == math.ceil(8.0 * (REFILL_HORIZON + 2 * 1.0))  # + twice the refill
    for _ in range(40):
        b.note_refill(100.0)
    assert b.target() == 64


# ---------------------------------------------------------------------------------- lanes
def sorted_index(n: int, part: int = 0) -> list[ResourceItem]:
    return same_time_items(n, part=part)


def serve(index: list[ResourceItem], read: Read) -> list[ResourceItem]:
    """What a Query of a same-time sub-partition returns: from an end, or after a position
    that need not name an item (placed where it would sort, as DynamoDB does)."""
    names = [it.resource for it in index]
    if read.after is None:
        page = index if read.forward else index[::-1]
    elif read.forward:
        page = index[bisect.bisect_right(names, read.after[1]) :]
    else:
        page = index[: bisect.bisect_left(names, read.after[1])][::-1]
    return page[: read.limit]


def known(b: CandidateBuffer, n: int = 0) -> CandidateBuffer:
    """A buffer that has read both ends of sub-partition ``n`` (res-00000 .. res-00199)."""
    both_ends_read(b)
    idx = sorted_index(200, part=n)
    b.lanes.learn(n, idx[:8] + idx[-8:])
    return b


def lane_at(monkeypatch: pytest.MonkeyPatch, b: CandidateBuffer, start: StartKey) -> Read:
    """``b``'s next read: a new lane after ``start`` (the position drawn, then not taken)."""
    drawn = Lanes.start_key
    with monkeypatch.context() as m:
        m.setattr(Lanes, "start_key", lambda lanes, n: (drawn(lanes, n), start)[1])
        return b.plan()


def test_before_both_ends_are_known_reads_are_from_an_end() -> None:
    """A cold pool: the first two reads go to opposite ends; in the background they keep
    nothing (every cold daemon reads there), for a waiting request END_KEEP items."""
    b = buf()
    first, second = b.plan(), b.plan(urgent=True)
    assert first.after is None and second.after is None and first.lane == second.lane == 0
    assert {first.forward, second.forward} == {True, False}
    assert first.keep == 0 and second.keep == END_KEEP
    idx = sorted_index(64)
    assert b.read_done(first, idx, idx, 0.0) == 0
    assert b.read_done(second, idx[::-1], idx[::-1], 0.0) == END_KEEP
    lane = b.plan()
    assert lane.lane and lane.after is not None and lane.forward


def test_a_lane_continues_after_the_last_item_it_read() -> None:
    b = known(buf(prefetch_min=8, prefetch_max=64))
    idx = sorted_index(200)
    r1 = b.plan()
    p1 = serve(idx, r1)
    assert len(p1) == r1.limit and b.read_done(r1, p1, p1, 0.0) == len(p1)
    assert [c.item.resource for c in b.q] == [it.resource for it in p1]  # in index order
    for _ in range(6):
        b.take(1.0)
    r2 = b.plan()
    assert r2.lane == r1.lane and r2.after == (p1[-1].lease_available, p1[-1].resource)
    p2 = serve(idx, r2)
    b.read_done(r2, p2, p2, 1.0)
    held = [c.item.resource for c in b.q]
    assert held == sorted(held) and len(set(held)) == len(held)  # contiguous, no repeats


def test_a_lane_wraps_to_the_head_at_the_end_and_ends_if_the_head_is_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b = known(buf(prefetch_min=8))
    idx = sorted_index(20)
    r1 = lane_at(monkeypatch, b, (idx[-3].lease_available or "", idx[-3].resource))
    r1 = Read(r1.n, r1.after, True, 8, r1.lane)
    tail = serve(idx, r1)
    assert len(tail) == 2
    b.read_done(r1, tail, tail, 0.0)
    r2 = b.plan()
    assert r2.lane == r1.lane and r2.after is None and r2.forward  # on from the head
    b.read_done(r2, idx[:5], idx[:5], 0.0)  # a short page from the head: the lane ends
    r3 = b.plan()
    assert r3.lane != r1.lane


def test_a_quarantined_tail_ends_the_page_like_the_end_of_the_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An item not claimable yet (an early free's future lease_available) sorts after the
    claimable ones: past it there is nothing to claim, so the lane goes on from the head."""
    for claimable_all in (True, False):
        b = known(buf(prefetch_min=8))
        idx = sorted_index(200)
        r = lane_at(monkeypatch, b, (fmt_time(7), "res-00050"))
        r = Read(r.n, r.after, True, 8, r.lane)
        page = serve(idx, r)
        assert len(page) == 8
        b.read_done(r, page, page if claimable_all else page[:-1], 0.0)
        nxt = b.plan()
        assert nxt.lane == r.lane
        if claimable_all:
            assert nxt.after == (fmt_time(7), page[-1].resource)
        else:
            assert nxt.after is None and nxt.forward


def test_a_lost_claim_ends_the_lane_and_drops_its_candidates() -> None:
    """The winner reads the same stretch: the loser leaves it (the lane's other candidates
    are dropped, a read of it still in flight keeps nothing) and notes the sub-partition."""
    b = known(buf(prefetch_min=8))
    idx = sorted_index(200)
    r1 = b.plan()
    b.read_done(r1, serve(idx, r1), serve(idx, r1), 0.0)
    b.q.append(Candidate(replace(idx[150], resource="zz-other"), 0.0, 0))
    inflight = b.plan()  # the next page of that lane, not back yet
    assert inflight.lane == r1.lane
    c = b.take(1.0)
    assert c is not None and c.lane == r1.lane
    dropped = b.lost(c)
    assert dropped == r1.limit - 1
    assert [x.item.resource for x in b.q] == ["zz-other"]  # another read's candidate stays
    assert b.lanes.contended == {partition_of(c.item.resource): 1}
    late = serve(idx, inflight)
    assert b.read_done(inflight, late, late, 1.0) == 0
    assert b.plan().lane not in (0, r1.lane)


def test_a_second_read_while_the_lanes_read_is_in_flight_starts_another_lane() -> None:
    """A sweep next to a refill must not read the same page twice."""
    b = known(buf())
    first = b.plan()
    second = b.plan()
    assert first.lane and second.lane and first.lane != second.lane
    b.lanes.read_failed(second)
    assert b.plan().lane == second.lane  # a failed read frees the lane for the next one


def test_new_lanes_avoid_contended_sub_partitions() -> None:
    b = CandidateBuffer(Config().validate(), random.Random(3), seed=4)
    for n in range(PARTITIONS):
        b.lanes.contended[n] = 1
    b.lanes.contended[4] = 3  # the home sub-partition lost most
    b.lanes.contended[7] = 0
    assert {b.lanes.lane_partition() for _ in range(50)} == {7}


def test_contention_is_forgotten_slowly() -> None:
    """Past CONTENDED_MEMORY lost claims the counts halve, so old contention fades."""
    b = known(buf())
    idx = sorted_index(200, part=partition_of("res-00001"))
    c = Candidate(idx[0], 0.0, 0)
    n = partition_of(c.item.resource)
    for _ in range(CONTENDED_MEMORY):
        b.lost(c)
    assert b.lanes.contended == {n: CONTENDED_MEMORY}
    b.lost(c)
    assert b.lanes.contended == {n: (CONTENDED_MEMORY + 1) // 2}


def test_an_item_taken_is_not_a_candidate_again_at_that_version() -> None:
    """Two lanes of one daemon may cross, two reads may return the same item, an index read
    may lag behind the claim: once taken (and claimed, or lost), an item is not handed out
    again at the version it was taken at (bounded memory)."""
    b = buf(prefetch_min=8)
    b.add(items(3), 0.0)
    c = b.take(0.0)
    assert c is not None
    assert b.add(items(3), 0.0, lane=0) == 0  # r1, r2 held, r0 taken at this version
    for i in range(TAKEN_MAX + 10):
        b._remember_taken(replace(items(1)[0], resource=f"t{i}"), 0.0)
    assert len(b._taken) == TAKEN_MAX and ("t0", 0) not in b._taken


def test_an_item_freed_after_it_was_taken_is_a_candidate_again() -> None:
    """The liberator (or a release) frees what this daemon claimed: the free writes a new
    version, and the item is a candidate like any other, however often it was taken."""
    b = buf(prefetch_min=4, prefetch_max=4)
    r0 = items(1)[0]
    for round_ in range(3):
        item = replace(r0, version=2 * round_)  # free at an even version, claimed at odd
        assert b.add([item], float(round_)) == 1
        c = b.take(float(round_))
        assert c is not None and c.item == item
        assert b.add([item], float(round_)) == 0  # a lagging index: the same version again


def test_a_take_is_forgotten_after_candidate_max_age() -> None:
    """A claim that never applied leaves the item claimable at the version taken: after
    ``candidate_max_age`` it is a candidate again (the claim's condition decides)."""
    b = buf(prefetch_min=4, candidate_max_age=10.0)
    r0 = items(1)[0]
    b.add([r0], 0.0)
    assert b.take(0.0) is not None
    assert b.add([r0], 9.0) == 0
    assert b.add([r0], 10.5) == 1


def simulate(daemons: int, per_partition: int, claims_each: int, seed: int) -> float:
    """Daemons on one same-time pool, each claiming in turn from its buffer and refilling it
    as rasd does (reads answered at once from a sorted index; a claim removes the item from
    the index): lost claims per claim made."""
    names = [f"res-{i:05d}" for i in range(per_partition * PARTITIONS)]
    free: dict[int, list[ResourceItem]] = {n: [] for n in range(PARTITIONS)}
    for name in names:
        n = partition_of(name)
        free[n].append(
            ResourceItem("c", name, "p", "r", f"c.p.r.{n}", 0, lease_available=fmt_time(7))
        )
    rng = random.Random(seed)
    cfg = Config().validate()
    bufs = [
        CandidateBuffer(cfg, random.Random(seed * 100 + d), seed=rng.getrandbits(32))
        for d in range(daemons)
    ]

    def fill(b: CandidateBuffer, urgent: bool) -> None:
        for _ in range(3):
            read = b.plan(urgent)
            page = serve(free[read.n], read)
            b.read_done(read, page, page, now)
            if not b.needs_refill():
                return

    now, claims, lost = 0.0, 0, 0
    for b in bufs:
        fill(b, False)  # warm at start-up
    for _ in range(claims_each):
        order = list(range(daemons))
        rng.shuffle(order)
        for d in order:
            b = bufs[d]
            now += 0.001
            while True:
                c = b.take(now)
                if c is None:
                    fill(b, True)
                    continue
                part = free[partition_of(c.item.resource)]
                if c.item in part:
                    part.remove(c.item)
                    claims += 1
                    break
                lost += 1
                b.lost(c)
            if b.needs_refill():
                fill(b, False)
    return lost / claims


def test_daemons_on_a_same_time_pool_rarely_lose_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """20 daemons, 2,000 same-time items, 30 claims each (scenario f's shape): lanes keep
    lost claims rare. The control, every lane starting at the head of the home sub-partition
    (what reading the head, or any start key every daemon shares, amounts to), loses often:
    the simulation can tell the two apart."""
    spread = [simulate(20, 200, 30, s) for s in range(3)]
    assert max(spread) < 0.05
    with monkeypatch.context() as m:
        m.setattr(Lanes, "start_key", lambda self, n: (fmt_time(7), "res-"))
        crowded = simulate(20, 200, 30, 0)
    assert crowded > 3 * max(spread) and crowded > 0.1


async def test_a_cold_pool_reads_both_ends_at_once_then_a_lane() -> None:
    """Start-up waits for the warm refill: the two reads from the ends go out together (one
    round trip), then the first lane read; nothing from the ends is kept in the background."""
    import asyncio

    from rasd.daemon.prefetch import Prefetcher
    from rasd.observe.metrics import Counters

    idx = sorted_index(200)
    calls: list[tuple[int, bool, bool]] = []  # (in flight when sent, forward, after given)
    inflight = 0

    class Store:
        async def query_available(
            self, part: str, limit: int, forward: bool, deadline: float, after: object = None
        ) -> list[ResourceItem]:
            nonlocal inflight
            calls.append((inflight, forward, after is not None))
            inflight += 1
            await asyncio.sleep(0)
            inflight -= 1
            if after is None:
                return (idx if forward else idx[::-1])[:limit]
            names = [it.resource for it in idx]
            return idx[bisect.bisect_right(names, after[2]) :][:limit]  # type: ignore[index]

    class Clock:
        def mono(self) -> float:
            return 0.0

        def now_us(self) -> int:
            return 10**9

    cfg = Config(prefetch_min=8).validate()
    p = Prefetcher(cfg, Store(), Clock(), Counters(), random.Random(1), seed=0)  # type: ignore[arg-type]
    pool = type("P", (), {"client_id": "c", "pool_id": "p"})()
    await p.warm([pool], timeout=5.0)  # type: ignore[list-item]
    assert [(f, a) for _, f, a in calls[:2]] in (
        [(True, False), (False, False)],
        [(False, False), (True, False)],
    )
    assert calls[1][0] == 1  # the second end read went out while the first was in flight
    assert calls[2][2]  # then a lane, after a random position
    buf = p.buffer(pool)  # type: ignore[arg-type]
    assert len(buf) >= 8 and all(c.lane for c in buf.q)


async def test_a_freed_item_comes_back_to_a_small_pool() -> None:
    """A one-item pool cycled through claim and free: every free (a new version) makes the
    item a candidate again; NO_CAPACITY only while the index shows nothing claimable."""
    item = _free("only", 0)
    store = _TableStore({})
    p, pool = _prefetcher(store, exhausted_backoff=0.0)
    for version in (0, 2, 4, 6):
        store.parts = {partition_of("only"): [replace(item, version=version)]}
        c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
        assert c is not None and c.item.version == version
        # claimed: the index still shows the version taken (it lags), nothing else
        assert await p.candidate(pool, 1e9) is None  # type: ignore[attr-defined]


async def test_no_capacity_only_after_every_sub_partition_was_read() -> None:
    """The home sub-partition shows only an item this daemon has just claimed (a lagging
    index): the sweep goes on to the other sub-partitions and finds the free one there."""
    taken = _free("taken", 0)
    other = next(
        _free(f"o{i}", 0) for i in range(100) if partition_of(f"o{i}") != partition_of("taken")
    )
    store = _TableStore({partition_of("taken"): [taken]})
    p, pool = _prefetcher(store, exhausted_backoff=0.0)
    c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
    assert c is not None and c.item == taken
    store.parts[partition_of(other.resource)] = [other]
    for _ in range(20):  # whatever sub-partition the sweep starts in
        c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
        assert c is not None and c.item == other
        store.parts[partition_of(other.resource)] = [
            other := replace(other, version=other.version + 2)
        ]
    # only the taken copies left: a full sweep, then NO_CAPACITY
    store.parts = {partition_of("taken"): [taken]}
    store.reads.clear()
    assert await p.candidate(pool, 1e9) is None  # type: ignore[attr-defined]
    assert set(store.reads) == set(range(PARTITIONS))


def test_an_item_whose_claim_never_applied_is_a_candidate_again() -> None:
    """``untake``: the claim failed for another reason than its condition (or its outcome is
    unknown): the item, read again at the same version, is a candidate."""
    b = buf(prefetch_min=4)
    r0 = items(1)[0]
    b.add([r0], 0.0)
    c = b.take(0.0)
    assert c is not None
    assert b.add([r0], 0.0) == 0
    b.untake(c.item)
    assert b.add([r0], 0.0) == 1


async def test_stop_cancels_refills_before_the_store_closes() -> None:
    """Shutdown: a refill in flight is cancelled and awaited by ``stop``, so none reads
    through the closed store afterwards (it would fail outside any caller: log noise)."""
    import asyncio

    from rasd.daemon.prefetch import Prefetcher
    from rasd.observe.metrics import Counters

    started = asyncio.Event()
    reads_after_close: list[str] = []

    class Store:
        closed = False

        async def query_available(
            self, part: str, limit: int, forward: bool, deadline: float, after: object = None
        ) -> list[ResourceItem]:
            if self.closed:
                reads_after_close.append(part)
            started.set()
            await asyncio.sleep(3600)
            return []

    class Clock:
        def mono(self) -> float:
            return 0.0

        def now_us(self) -> int:
            return 10**9

    store = Store()
    p = Prefetcher(Config().validate(), store, Clock(), Counters(), random.Random(1), seed=0)  # type: ignore[arg-type]
    pool = type("P", (), {"client_id": "c", "pool_id": "p"})()
    p._start_refill(pool, p.buffer(pool))  # type: ignore[arg-type]
    await started.wait()
    tasks = list(p._refills.values())
    await asyncio.wait_for(p.stop(), 5)  # without the cancel, the refill would never end
    store.closed = True
    assert all(t.cancelled() for t in tasks)
    assert not p._refills
    await asyncio.sleep(0)
    assert reads_after_close == []


async def test_a_slow_empty_sweep_counts_its_backoff_from_its_start() -> None:
    """The exhaustion memo answers for what the sweep read, which is as old as its first read:
    a sweep that took longer than the backoff (a loaded backend) leaves no memo behind, and
    the next request reads again and finds the item freed meanwhile."""
    store = _TableStore({})
    p, pool = _prefetcher(store, exhausted_backoff=1.0)
    clock = p.clock  # type: ignore[attr-defined]
    slow = store.query_available

    async def query(*a: object, **kw: object) -> list[ResourceItem]:
        clock.t += 0.5  # every read takes half a second
        return await slow(*a, **kw)  # type: ignore[arg-type]

    store.query_available = query  # type: ignore[method-assign]
    assert await p.candidate(pool, 1e9) is None  # type: ignore[attr-defined]
    assert clock.t >= 101.0  # the sweep outlasted the backoff
    store.parts = {partition_of("late"): [_free("late", 2)]}
    reads = len(store.reads)
    c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
    assert len(store.reads) > reads and c is not None and c.item.resource == "late"


async def test_a_miss_for_age_is_counted_apart_from_a_miss_for_an_empty_buffer() -> None:
    """``prefetch.stale`` counts the candidates a take dropped as too old: with
    ``prefetch.misses`` it tells a host too sparse for its candidates' age limit from one
    that ran out of them."""
    store = _TableStore({partition_of("a"): [_free("a", 0)], partition_of("b"): [_free("b", 0)]})
    p, pool = _prefetcher(store, candidate_max_age=10.0, candidate_max_age_quiet=0.0)
    p.buffer(pool).add([_free("a", 0), _free("b", 0)], now=100.0)  # type: ignore[attr-defined]
    p.clock.t = 111.0  # type: ignore[attr-defined]
    c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
    assert c is not None  # read again: both were too old
    got = p.counters.snapshot()  # type: ignore[attr-defined]
    assert got.get("prefetch.stale") == 2 and got.get("prefetch.misses") == 1

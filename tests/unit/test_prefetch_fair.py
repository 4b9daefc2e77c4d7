"""Prefetch in a short pool: buffers sized to a fair share of the free items, direct misses,
sub-partitions spread over daemons, and NO_CAPACITY still only after a whole sweep."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import replace

from rasd.config import Config
from rasd.core.errors import Timeout
from rasd.core.lease import PARTITIONS, ResourceItem, fmt_time, partition_of
from rasd.daemon.candidates import DIRECT_MAX_AGE, MIN_PAGE, Candidate, CandidateBuffer
from rasd.daemon.lanes import Read, spread_order
from rasd.daemon.sizing import FLEET_MEMORY, FleetView, size_buffer
from tests.helpers.prefetch import SlowStore, _free, _prefetcher, _TableStore

NOW_US = 10**12  # the wall clock of these buffers (µs)


def free_item(name: str, age_s: float, version: int = 0) -> ResourceItem:
    """A claimable item of its sub-partition, claimable for ``age_s`` seconds at NOW_US."""
    n = partition_of(name)
    la = fmt_time(NOW_US - int(age_s * 1e6))
    part = f"c.p.us-east-1.{n}"
    return ResourceItem("c", name, "p", "us-east-1", part, version, lease_available=la)


def by_partition(names: list[str], age_s: float) -> dict[int, list[ResourceItem]]:
    parts: dict[int, list[ResourceItem]] = {n: [] for n in range(PARTITIONS)}
    for name in names:
        parts[partition_of(name)].append(free_item(name, age_s))
    return parts


# ---------------------------------------------------------------------------- size_buffer
def test_unknown_supply_sizes_by_demand_within_bounds() -> None:
    assert size_buffer(0.0, 0.0, None, 1.0, 12, 64).target == 12
    assert size_buffer(40.0, 0.0, None, 1.0, 12, 64).target == 40
    assert size_buffer(400.0, 0.0, None, 1.0, 12, 64).target == 64
    assert not size_buffer(0.0, 0.0, None, 50.0, 12, 64).direct


def test_a_short_pool_caps_the_buffer_at_a_fair_share_floor_included() -> None:
    """16 daemons on 100 free items: 6 each, below the floor of 12."""
    s = size_buffer(0.7, 0.01, 100.0, 16.0, 12, 64)
    assert (s.target, s.fair, s.direct) == (6, 6, False)
    s = size_buffer(0.7, 0.01, 64.0, 16.0, 12, 64)
    assert (s.target, s.fair, s.direct) == (4, 4, False)


def test_a_share_below_four_keeps_no_buffer() -> None:
    s = size_buffer(5.0, 0.01, 60.0, 16.0, 12, 64)
    assert (s.target, s.fair, s.direct) == (1, 3, True)


def test_a_nearly_full_pool_is_direct_with_a_share_of_at_least_one() -> None:
    s = size_buffer(1.3, 0.01, 20.0, 16.0, 12, 64)
    assert (s.target, s.fair, s.direct) == (1, 1, True)
    s = size_buffer(1.3, 0.01, 0.0, 16.0, 12, 64)
    assert (s.target, s.fair, s.direct) == (1, 1, True)


def test_a_plentiful_pool_is_sized_by_demand_alone() -> None:
    s = size_buffer(30.0, 0.0, 5000.0, 20.0, 12, 64)
    assert (s.target, s.fair, s.direct) == (30, 250, False)


def test_one_daemon_holds_at_most_what_is_free() -> None:
    s = size_buffer(0.0, 0.0, 5.0, 1.0, 12, 64)
    assert (s.target, s.direct) == (5, False)


# ------------------------------------------------------------------------------ FleetView
def test_free_is_unknown_until_two_reads_then_stands_until_the_next() -> None:
    f = FleetView()
    assert f.free(0.0) is None
    f.observe(3, 2, False, [], 0.0)
    assert f.free(0.0) is None  # one sub-partition does not stand for the pool
    f.observe(4, 2, False, [], 0.0)
    assert f.free(FLEET_MEMORY) == 2 * PARTITIONS
    assert f.free(100.0) == 2 * PARTITIONS  # no read since: the last estimate
    f.observe(5, 4, False, [], 100.0)  # the older reads are past FLEET_MEMORY of this one
    assert f.free(100.0) is None
    f.observe(6, 6, False, [], 100.0 + FLEET_MEMORY)
    assert f.free(100.0 + FLEET_MEMORY) == 5 * PARTITIONS


def test_free_extrapolates_the_sub_partitions_not_read() -> None:
    f = FleetView()
    f.observe(0, 1, False, [], 0.0)
    f.observe(1, 3, False, [], 0.0)
    assert f.free(1.0) == 4 + 2 * (PARTITIONS - 2)


def test_a_read_after_a_position_counts_twice() -> None:
    """A lane's short page is the rest of its sub-partition after a random start."""
    b = CandidateBuffer(Config().validate(), random.Random(1), seed=5, pool="c/p")
    page = [free_item(f"a{i}", 1.0) for i in range(3)]
    b.read_done(Read(1, ("t", "r"), True, 8, 0), page, page, 1.0, NOW_US)
    b.read_done(Read(2, None, True, 8, 0), page, page, 1.0, NOW_US)
    assert b.fleet.counts[1][0] == 6 and b.fleet.counts[2][0] == 3


def test_a_full_page_says_the_pool_is_not_short() -> None:
    f = FleetView()
    f.observe(0, 1, False, [], 0.0)
    f.observe(1, 8, True, [], 0.0)
    assert f.free(1.0) is None


def test_daemons_by_littles_law() -> None:
    """20 free items that stay claimable 1 s are claimed at 20/s; at 1.25/s of its own, a
    daemon is one of 16."""
    f = FleetView()
    for n in range(PARTITIONS):
        f.observe(n, 2, False, [1.0, 1.0], 0.0)
    assert f.daemons(0.0, 1.25, f.free(0.0)) == 16.0
    # items read long after they were freed (a fresh pool): nobody is drawing on them
    g = FleetView()
    g.observe(0, 2, False, [3600.0, 3600.0], 0.0)
    assert g.daemons(0.0, 1.0, g.free(0.0)) == 1.0


def test_a_lost_claim_says_there_is_another_daemon() -> None:
    f = FleetView()
    assert f.daemons(0.0, 1.0, None) == 1.0
    f.lost_at = 10.0
    assert f.daemons(10.0 + FLEET_MEMORY, 1.0, None) == 2.0
    assert f.daemons(10.1 + FLEET_MEMORY, 1.0, None) == 1.0
    # in a short pool: a share of 1 until the races stop
    assert f.daemons(11.0, 1.0, 30.0) == 30.0
    assert size_buffer(1.0, 0.0, 30.0, f.daemons(11.0, 1.0, 30.0), 12, 64).direct
    assert f.daemons(11.0, 1.0, 500.0) == 2.0


# --------------------------------------------------------------------------- spread_order
def test_spread_order_is_a_permutation_that_changes_every_round() -> None:
    orders = [spread_order(7, "c/p", r) for r in range(20)]
    assert all(sorted(o) == list(range(PARTITIONS)) for o in orders)
    assert len({o[0] for o in orders}) >= 6
    assert spread_order(7, "c/p", 3) == spread_order(7, "c/p", 3)


def test_daemons_rarely_start_on_the_same_sub_partition() -> None:
    """Two daemons' first choices coincide about one round in ten (independent ranks), and
    over the rounds every sub-partition comes first about as often."""
    rounds = 2000
    same = sum(
        spread_order(11, "c/p", r)[0] == spread_order(12, "c/p", r)[0] for r in range(rounds)
    )
    assert same / rounds < 0.15
    firsts = Counter(spread_order(11, "c/p", r)[0] for r in range(rounds))
    assert max(firsts.values()) < 2 * rounds / PARTITIONS


# ------------------------------------------------------------------------ CandidateBuffer
def short_buffer(age_s: float = 1.0, per_partition: int = 2, takes: int = 4) -> CandidateBuffer:
    """A buffer that has read every sub-partition of a pool with ``per_partition`` free
    items claimable for ``age_s``, at 1 take a second."""
    b = CandidateBuffer(Config().validate(), random.Random(1), seed=5, pool="c/p")
    for i in range(takes):
        b.take(float(i))
    now = float(takes)
    names = [f"r{i}" for i in range(400)]
    parts = by_partition(names, age_s)
    for n in range(PARTITIONS):
        page = parts[n][:per_partition]
        b.read_done(Read(n, None, True, 64), page, page, now, NOW_US)
    b.q.clear()
    return b


def test_a_nearly_full_pool_reads_whole_sub_partitions_in_spread_order() -> None:
    b = short_buffer()
    assert b.whole() and b.direct() and b.target() == 1
    assert not b.needs_refill()  # direct: a miss reads for itself
    reads = [b.plan() for _ in range(PARTITIONS)]
    assert all(r.after is None and r.forward and not r.lane for r in reads)
    assert sorted(r.n for r in reads) == list(range(PARTITIONS))  # a round covers all
    assert [r.n for r in reads] == spread_order(5, "c/p", b.lanes.round)


def test_a_plentiful_pool_keeps_its_lanes() -> None:
    b = short_buffer(age_s=3600.0, per_partition=MIN_PAGE * 2)
    assert not b.whole() and not b.direct()


def test_a_direct_read_keeps_only_the_fair_share() -> None:
    b = short_buffer()
    names = [f"x{i}" for i in range(200) if partition_of(f"x{i}") == 4][:3]
    page = [free_item(x, 1.0) for x in names]
    assert b.read_done(Read(4, None, True, 64), page, page, 4.0, NOW_US) == 1
    assert len(b) == 1


def test_direct_candidates_go_stale_sooner() -> None:
    b = short_buffer()
    b.add([free_item("y", 1.0)], 4.0)
    assert b.direct()
    assert b.take(4.0 + DIRECT_MAX_AGE + 0.01) is None


def test_a_lost_claim_drops_the_rest_of_its_whole_read() -> None:
    b = short_buffer(per_partition=5)
    b.fleet.age = 100.0  # few daemons: a share of several
    names = [f"z{i}" for i in range(300) if partition_of(f"z{i}") == 2][:3]
    page = [free_item(x, 100.0) for x in names]
    assert b.whole() and not b.direct()
    assert b.read_done(Read(2, None, True, 64), page, page, 4.0, NOW_US) == 3
    c = b.take(4.0)
    assert c is not None
    assert b.lost(c) == 2 and len(b) == 0


# ---------------------------------------------------------------------- the sweep, direct
def direct_prefetcher(store: _TableStore) -> tuple[object, object]:
    p, pool = _prefetcher(store, exhausted_backoff=0.0)
    buf = p.buffer(pool)  # type: ignore[attr-defined]
    buf.fleet.age = 0.001  # items claimed as soon as they are free: many daemons
    for n in range(PARTITIONS):
        buf.fleet.observe(n, 1, False, [], 100.0)
    assert buf.direct()
    return p, pool


async def test_direct_no_capacity_only_after_every_sub_partition_was_read() -> None:
    """In direct mode a sweep reads in waves; it stops at the first wave that finds an item,
    and answers nothing only after every sub-partition was read."""
    store = _TableStore({})
    p, pool = direct_prefetcher(store)
    assert await p.candidate(pool, 1e9) is None  # type: ignore[attr-defined]
    assert sorted(store.reads) == list(range(PARTITIONS))
    # one free item, wherever it is: found, with fewer reads when the waves end early
    for i in range(30):
        item = _free(f"w{i}", 0)
        store.parts = {partition_of(item.resource): [item]}
        store.reads.clear()
        p, pool = direct_prefetcher(store)
        c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
        assert c is not None and c.item == item
        assert len(store.reads) <= PARTITIONS


def one_per_partition(n: int) -> dict[int, list[ResourceItem]]:
    """``n`` free items (at most ten), each in a sub-partition of its own."""
    parts: dict[int, list[ResourceItem]] = {}
    i = 0
    while len(parts) < n:
        item = _free(f"b{i}", 0)
        parts.setdefault(partition_of(item.resource), [item])
        i += 1
    return parts


async def test_a_burst_of_direct_misses_gets_every_free_item_and_no_capacity_only_past_it() -> None:
    """Direct mode keeps one candidate per sweep, so a burst of misses sweeps again and
    again as the others take what each sweep kept. No request answers NO_CAPACITY while the
    pool has an item it has not taken: only the requests past the pool's ten items get none
    (a fixed number of sweeps per request used to give up while items were free)."""
    store = SlowStore(one_per_partition(10))
    p, pool = direct_prefetcher(store)
    got = await asyncio.gather(*(p.candidate(pool, 1e9) for _ in range(9)))  # type: ignore[attr-defined]
    assert None not in got
    assert len({c.item.resource for c in got}) == 9

    store = SlowStore(one_per_partition(10))
    p, pool = direct_prefetcher(store)
    got = await asyncio.gather(*(p.candidate(pool, 1e9) for _ in range(13)))  # type: ignore[attr-defined]
    assert len({c.item.resource for c in got if c is not None}) == 10
    assert got.count(None) == 3


async def test_sweeping_again_stops_at_the_deadline_with_timeout_not_no_capacity() -> None:
    """Past its deadline a request whose sweeps' candidates all went to others gets
    TIMEOUT: the pool had free items, so NO_CAPACITY would be wrong."""
    store = SlowStore(one_per_partition(10))
    p, pool = direct_prefetcher(store)
    got = await asyncio.gather(
        *(p.candidate(pool, 0.0) for _ in range(3)),  # type: ignore[attr-defined]
        return_exceptions=True,
    )
    assert sum(isinstance(g, Candidate) for g in got) == 1
    assert sum(isinstance(g, Timeout) for g in got) == 2


async def test_a_taken_copy_is_not_free_and_the_sweep_goes_on() -> None:
    """Direct mode, a lagging index: the only item shown is the one just taken, at the
    version taken; another sub-partition has a free one, found by the same sweep's waves."""
    taken = _free("taken", 0)
    store = _TableStore({partition_of("taken"): [taken]})
    p, pool = direct_prefetcher(store)
    c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
    assert c is not None and c.item == taken
    other = next(
        _free(f"o{i}", 0) for i in range(100) if partition_of(f"o{i}") != partition_of("taken")
    )
    store.parts[partition_of(other.resource)] = [other]
    c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
    assert c is not None and c.item == other
    store.parts = {partition_of("taken"): [taken], partition_of(other.resource): [other]}
    store.reads.clear()
    assert await p.candidate(pool, 1e9) is None  # type: ignore[attr-defined]
    assert sorted(store.reads) == list(range(PARTITIONS))
    other = replace(other, version=2)  # freed again: a candidate again
    store.parts[partition_of(other.resource)] = [other]
    c = await p.candidate(pool, 1e9)  # type: ignore[attr-defined]
    assert c is not None and c.item == other

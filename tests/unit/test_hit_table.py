"""The hit table: the layout the daemon writes (``rasd.daemon.published``) and the client
reads (``rasd_client._table``), and the cache keeping it to what it would answer itself.
Time is an injected FakeClock; the memfds are real."""

from __future__ import annotations

import errno
import mmap
import os
import random

import pytest

from rasd.core import cache_rules, decide
from rasd.core.cache_rules import NEVER
from rasd.core.lease import US, Lease, Pool
from rasd.daemon.cache import LeaseCache
from rasd.daemon.published import Published, Table
from rasd_client import _table as table_layout
from tests.doubles.clock import FakeClock

S = 30.0
POOLS = {("c", "p"): Pool("c", "p", 86_400 * US), ("c", "q"): Pool("c", "q", 3600 * US)}


def reader(t: Table) -> table_layout.Table:
    """The client's view: the fd mapped read-only, as a process that was handed it."""
    return table_layout.Table(mmap.mmap(t.fd, 0, mmap.MAP_SHARED, mmap.PROT_READ))


def lease(key: str, resource: str = "r", pool: str = "p", end_us: int = 10**16) -> Lease:
    return Lease("c", pool, key, resource, "us-east-1", end_us, 3, token="t")


def find(r: table_layout.Table, pool: str, key: str) -> table_layout.Seen | None:
    found = r.find((pool + key).encode(), len(pool.encode()))
    return None if found is None else found[1]


def test_an_answer_written_is_read_back_with_its_numbers() -> None:
    t = Table("c", 64, 256)
    t.put("p", "k", 12.5, 7.0, 99, 3600 * US, lease("k", "res-1"))
    seen = find(reader(t), "p", "k")
    assert seen is not None
    _, _, name, plen, until, touch, after_us, asked_us, max_us, got = seen
    assert (name, plen, until, touch, max_us) == (b"pk", 1, 12.5, 7.0, 3600 * US)
    assert (after_us, asked_us) == (NEVER, 0)  # a lease it extends: any ask touches, at first
    assert (got.resource, got.version, got.region, got.new) == ("res-1", 3, "us-east-1", False)
    assert got.lease_expires.timestamp() == 10**16 / US
    # the names are told apart by the pool's length too: ("p", "k") is not ("pk", "")
    assert reader(t).find(b"pk", 2) is None


def test_a_slot_being_written_or_torn_is_never_read() -> None:
    t = Table("c", 64, 256)
    t.put("p", "k", 12.5, 7.0, 99, 3600, lease("k"))
    off = t.where[("p", "k")]
    seq = table_layout.SEQ.unpack_from(t.mm, off)[0]
    table_layout.SEQ.pack_into(t.mm, off, seq + 1)  # odd: the daemon is writing it
    assert find(reader(t), "p", "k") is None
    table_layout.SEQ.pack_into(t.mm, off, seq)
    assert find(reader(t), "p", "k") is not None
    t.mm[off + table_layout.SLOT_HEAD.size + 3] ^= (
        0xFF  # a byte changed under an unchanged seq: torn
    )
    assert find(reader(t), "p", "k") is None


def test_removed_paused_and_closed_tables_answer_nothing() -> None:
    t = Table("c", 64, 256)
    for k in ("a", "b"):
        t.put("p", k, 12.5, 7.0, 99, 3600, lease(k))
    t.put("q", "a", 12.5, 7.0, 99, 3600, lease("a", pool="q"))
    r = reader(t)
    assert find(r, "p", "a") is not None
    t.remove("p", "a")
    assert find(r, "p", "a") is None and find(r, "p", "b") is not None
    t.remove_pool("p")
    assert find(r, "p", "b") is None and find(r, "q", "a") is not None
    t.set_state(table_layout.PAUSED)
    assert find(r, "q", "a") is None
    t.set_state(table_layout.SERVING)
    assert find(r, "q", "a") is not None
    t.close()
    assert find(r, "q", "a") is None and r.state() == table_layout.CLOSED


def test_a_retired_table_is_emptied_for_a_process_that_kept_its_mapping() -> None:
    """A reload revoked a grant: the table is closed and zeroed, so a process that kept its
    mapping reads nothing from then on, and the client_id gets a new table."""
    published = Published(64)
    t = published.make("c")
    t.put("p", "k", 12.5, 7.0, 99, 3600, lease("k", "secret"))
    kept = reader(t)
    published.retire({"c"})
    assert kept.state() == table_layout.CLOSED and published.get("c") is None
    assert b"secret" not in bytes(kept.mm) and find(kept, "p", "k") is None
    assert published.make("c") is not t


def test_this_host_can_have_hit_tables() -> None:
    """The probe the daemon runs at start (a kernel without F_SEAL_FUTURE_WRITE: no tables,
    said in its log)."""
    assert Published.unsupported() is None


def test_a_full_bucket_gives_up_the_answer_served_the_shortest() -> None:
    t = Table("c", 1, 16)  # one bucket of four
    for i in range(4):
        t.put("p", f"k{i}", 10.0 + i, 0.0, 0, 3600, lease(f"k{i}"))
    t.put("p", "new", 20.0, 0.0, 0, 3600, lease("new"))
    r = reader(t)
    assert t.evictions == 1 and find(r, "p", "k0") is None
    assert all(find(r, "p", k) is not None for k in ("k1", "k2", "k3", "new"))
    assert len(t) == 4


def test_a_full_table_gives_up_its_oldest_answer_and_grows_only_as_filled() -> None:
    t = Table("c", 64, 2)
    for k in ("a", "b", "c"):
        t.put("p", k, 12.5, 7.0, 99, 3600, lease(k))
    r = reader(t)
    assert t.evictions == 1 and find(r, "p", "a") is None
    assert find(r, "p", "b") is not None and find(r, "p", "c") is not None
    t.remove("p", "b")
    t.put("p", "d", 12.5, 7.0, 99, 3600, lease("d"))  # the slot given back, no eviction
    assert t.evictions == 1 and t.used == 2 and find(r, "p", "d") is not None
    big = Table("c", 1 << 16, 1 << 18)  # the slots start on a page after the index
    assert big.slots_at % 4096 == 0 and big.size == big.slots_at + (1 << 18) * table_layout.SLOT


def test_a_touch_tells_the_table_when_asks_this_long_need_an_extension() -> None:
    """After a touch that started nothing, the entry is touched again only from the time an
    extension is due for asks of that length, or for a longer ask; a lease of another region
    (never extended here) only for its re-confirmation. A new lease end forgets the ask."""
    t = Table("c", 64, 256)
    t.put("p", "k", 12.5, 7.0, 10**16, 3600 * US, lease("k"))
    t.note("p", "k", 10**16, 600 * US, 10**16 - 300 * US)
    seen = find(reader(t), "p", "k")
    assert seen is not None and (seen[6], seen[7]) == (10**16 - 300 * US, 600 * US)
    t.put("p", "k", 20.0, 9.0, 10**16, 3600 * US, lease("k"))  # re-confirmed: kept
    seen = find(reader(t), "p", "k")
    assert seen is not None and (seen[4], seen[6], seen[7]) == (20.0, 10**16 - 300 * US, 600 * US)
    t.note("p", "k", 5, 1, 1)  # told of another lease end: not this entry's
    t.put("p", "k", 20.0, 9.0, 2 * 10**16, 3600 * US, lease("k", end_us=2 * 10**16))  # extended
    seen = find(reader(t), "p", "k")
    assert seen is not None and (seen[6], seen[7]) == (NEVER, 0)
    t.put("p", "far", 20.0, 9.0, NEVER, 3600 * US, lease("far"))
    seen = find(reader(t), "p", "far")
    assert seen is not None and (seen[6], seen[7]) == (NEVER, NEVER)


def test_extend_due_is_when_should_extend_starts_to_hold_for_a_sliding_ask() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        end = rng.randrange(10**9, 2 * 10**9)
        ask = rng.randrange(1, 10**9)
        fraction = rng.choice((0.5, 0.45, 0.3, 1.0))
        held = lease("k", end_us=end)
        due = cache_rules.extend_due_us(held, ask, fraction)
        for now in (due - 2, due - 1, due + 1, due + 2):
            assert decide.should_extend(held, now + ask, now, fraction) == (now > due), (end, ask)


def test_an_answer_too_long_for_a_slot_is_not_published() -> None:
    t = Table("c", 64, 256)
    t.put("p", "k", 12.5, 7.0, 99, 3600, lease("k", "x" * table_layout.SLOT_ROOM))
    assert t.too_big == 1 and len(t) == 0 and find(reader(t), "p", "k") is None


def test_the_clients_fd_cannot_write_grow_or_shrink_the_table() -> None:
    t = Table("c", 64, 256)
    with pytest.raises(PermissionError):
        mmap.mmap(t.fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    with pytest.raises(OSError) as exc:
        os.pwrite(t.fd, b"x", 0)
    assert exc.value.errno == errno.EPERM
    with pytest.raises(PermissionError):
        os.ftruncate(t.fd, 0)


# ------------------------------------------------------------------- the cache keeps it
def cache_with_tables(clock: FakeClock, maxsize: int = 1000) -> tuple[LeaseCache, Published]:
    published = Published(256)
    cache = LeaseCache(clock, maxsize, 5 * US, S, "us-east-1", pools=POOLS, published=published)
    return cache, published


def test_a_new_table_holds_every_answer_the_cache_gives_and_follows_it() -> None:
    clock = FakeClock()
    cache, _ = cache_with_tables(clock)
    cache.put(lease("k"), clock.mono())
    t = cache.open_table("c")
    assert t is not None
    r = reader(t)
    seen = find(r, "p", "k")
    assert seen is not None
    now = clock.mono()
    assert seen[4] == now + S and seen[5] == now + S / 2  # until, touch: S and S/2
    assert seen[7] == 0 and seen[8] == 86_400 * US  # any ask touches at first; the max lease
    clock.advance(10)
    cache.put(lease("k", "r2"), clock.mono())  # a newer confirmation: the new numbers
    seen = find(r, "p", "k")
    assert seen is not None and seen[4] == clock.mono() + S and seen[9].resource == "r2"
    cache.drop(("c", "p", "k"))
    assert find(r, "p", "k") is None
    assert cache.open_table("other") is not None  # each client_id its own


def test_no_table_without_published() -> None:
    clock = FakeClock()
    cache = LeaseCache(clock, 10, 5 * US, S, "us-east-1", pools=POOLS)
    assert cache.open_table("c") is None


def test_an_answer_of_a_pool_the_daemon_does_not_know_is_not_published() -> None:
    clock = FakeClock()
    cache, _ = cache_with_tables(clock)
    t = cache.open_table("c")
    assert t is not None
    cache.put(Lease("c", "gone", "k", "r", "us-east-1", 10**16, 1, token="t"), clock.mono())
    assert len(t) == 0


def _served(r: table_layout.Table, cache: LeaseCache, now: float) -> None:
    """Every answer the table would give now is the one the cache gives (table in cache)."""
    for pool, key in ((p, f"k{i}") for p in ("p", "q") for i in range(40)):
        seen = find(r, pool, key)
        if seen is None or not now < seen[4]:
            continue
        got = cache.get(("c", pool, key), now)
        assert got is not None, (pool, key)
        assert got.resource == seen[9].resource  # each put's resource is its own


class Counted(LeaseCache):
    """A cache that counts the purges that left it full (it then gives valid entries up)."""

    __slots__ = ("full",)

    def purge(self, now: float) -> int:
        left = super().purge(now)
        self.full = getattr(self, "full", 0) + (left >= self.maxsize)
        return left


def test_the_table_never_serves_what_the_cache_would_not() -> None:
    """Random puts, drops, takes, purges, evictions and time: after each step every answer
    the table would give at that time is the cache's own."""
    rng = random.Random(7)
    clock = FakeClock()
    cache = Counted(clock, 24, 5 * US, S, "us-east-1", pools=POOLS, published=Published(256))
    t = cache.open_table("c")
    assert t is not None
    r = reader(t)
    keys = [f"k{i}" for i in range(40)]
    for step in range(3000):
        op = rng.random()
        pool = rng.choice(("p", "q"))
        key = rng.choice(keys)
        now = clock.mono()
        if op < 0.55:
            end = clock.now_us() + rng.choice((20, 40, 3000)) * US
            confirmed = now - rng.choice((0.0, 0.0, 5.0, 29.0, 40.0))
            cache.put(lease(key, f"r{step}", pool, end), confirmed)
        elif op < 0.65:
            cache.drop(("c", pool, key))
        elif op < 0.7:
            cache.take("c", pool, key)
        elif op < 0.75:
            cache.purge(now)
        else:
            clock.advance(rng.choice((0.2, 1.0, 5.0)))
        _served(r, cache, clock.mono())
    assert len(t) > 0 and cache.full > 0  # the cache gave valid entries up for room


def test_a_put_confirmed_before_a_drop_is_older_news_and_not_kept() -> None:
    """A read sent before a release was written lands after the release dropped the key:
    neither the cache nor its table serves that lease again. A put confirmed after the drop
    is kept; the drops remembered stay within S and the cache's size."""
    clock = FakeClock()
    cache, _ = cache_with_tables(clock, maxsize=3)
    t = cache.open_table("c")
    assert t is not None
    sent = clock.mono()
    clock.advance(1)
    cache.drop(("c", "p", "k"))  # the release
    cache.put(lease("k", "old"), sent)  # the read sent before it
    assert cache.get(("c", "p", "k")) is None and find(reader(t), "p", "k") is None
    clock.advance(1)
    cache.put(lease("k", "new"), clock.mono())
    got = cache.get(("c", "p", "k"))
    assert got is not None and got.resource == "new"
    for i in range(5):
        cache.drop(("c", "p", f"x{i}"))
    assert len(cache.dropped) == 3
    clock.advance(S + 1)
    cache.drop(("c", "p", "y"))
    assert list(cache.dropped) == [("c", "p", "y")]


def test_refresh_of_extends_only_this_regions_held_leases_and_waits_out_a_backoff() -> None:
    """What a hit (or a table's touch) starts: an extension for a lease of this region with
    a token that needs one, none while its backoff runs; else a re-confirmation if stale."""
    now = 10**15
    held = Lease("c", "p", "k", "r", "us-east-1", now + 60 * US, 1, token="t")
    due = now + 600 * US  # asks 600 s, 60 s left: should_extend holds
    assert decide.should_extend(held, due, now, 0.5)
    assert (
        cache_rules.refresh_of(held, "us-east-1", due, now, 0.5, False)
        is cache_rules.Refresh.EXTEND
    )
    assert cache_rules.refresh_of(held, "us-east-1", due, now, 0.5, False, backing_off=True) is None
    assert cache_rules.refresh_of(held, "us-east-1", due, now, 0.5, True, backing_off=True) is None
    foreign = Lease("c", "p", "k", "r", "eu-west-1", now + 60 * US, 1, token="t")
    assert cache_rules.refresh_of(foreign, "us-east-1", due, now, 0.5, False) is None
    assert (
        cache_rules.refresh_of(foreign, "us-east-1", due, now, 0.5, True)
        is cache_rules.Refresh.RECONFIRM
    )
    tokenless = Lease("c", "p", "k", "r", "us-east-1", now + 60 * US, 1, token=None)
    assert cache_rules.refresh_of(tokenless, "us-east-1", due, now, 0.5, False) is None
    early = now + 70 * US  # asks 70 s, 60 s left: no extension yet
    assert cache_rules.refresh_of(held, "us-east-1", early, now, 0.5, False) is None
    assert (
        cache_rules.refresh_of(held, "us-east-1", early, now, 0.5, True)
        is cache_rules.Refresh.RECONFIRM
    )

"""The lease cache with an injected clock: an entry is served until the earlier of S after its
last confirmation and its lease end minus the skew margin (docs/design.md, I3)."""

from __future__ import annotations

import pytest

from rasd.core import cache_rules
from rasd.core.errors import BadRequest
from rasd.core.lease import US, Lease, Pool
from rasd.daemon.cache import NEVER, LeaseCache
from rasd.wire import ID_MAX, lease_response
from rasd_client.wire import FrameDecoder, encode
from tests.doubles.clock import FakeClock

K = ("c", "p", "k")
S = 30.0


def lease(clock: FakeClock, seconds: float, version: int = 1, resource: str = "r") -> Lease:
    exp = clock.now_us() + int(seconds * US)
    return Lease("c", "p", "k", resource, "us-east-1", exp, version, token="t")


def make(clock: FakeClock, maxsize: int = 100) -> LeaseCache:
    return LeaseCache(clock, maxsize, 5 * US, S)


def test_entry_expires_before_lease_by_margin() -> None:
    """A cached lease is never served within skew_margin of its end."""
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 20), clock.mono())
    clock.advance(14.9)
    assert cache.get(K) is not None
    clock.advance(0.2)
    assert cache.get(K) is None


def test_entry_is_served_at_most_s_after_confirmation() -> None:
    """I3: an hour-long lease is still dropped S after it was last confirmed."""
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 3600), clock.mono())
    clock.advance(S - 0.1)
    assert cache.get(K) is not None
    clock.advance(0.2)
    assert cache.get(K) is None


def test_confirmation_time_is_when_the_read_was_sent() -> None:
    """A slow read confirms as of its departure, not its arrival."""
    clock = FakeClock()
    cache = make(clock)
    sent = clock.mono()
    clock.advance(10)  # the read took 10 s
    cache.put(lease(clock, 3600), sent)
    clock.advance(S - 10 - 0.1)
    assert cache.get(K) is not None
    clock.advance(0.2)
    assert cache.get(K) is None


def test_stale_after_half_of_s() -> None:
    """A hit past S/2 asks for a background re-confirmation; a re-put restarts the clock."""
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 3600), clock.mono())
    clock.advance(S / 2 - 0.1)
    assert not cache.stale(K, clock.mono())
    clock.advance(0.2)
    assert cache.stale(K, clock.mono())
    cache.put(lease(clock, 3600), clock.mono())
    assert not cache.stale(K, clock.mono())
    clock.advance(S - 0.1)
    assert cache.get(K) is not None


def test_lease_inside_margin_is_not_cached() -> None:
    """A lease that is already within the margin is not kept at all."""
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 3), clock.mono())
    assert cache.get(K) is None


def test_older_confirmation_never_replaces_newer() -> None:
    """A late answer confirmed earlier does not roll the cache back."""
    clock = FakeClock()
    cache = make(clock)
    early = clock.mono()
    clock.advance(1)
    cache.put(lease(clock, 100, version=5), clock.mono())
    cache.put(lease(clock, 60, version=4), early)
    got = cache.get(K)
    assert got is not None and got.version == 5
    cache.put(lease(clock, 60, version=6, resource="other"), clock.mono())
    got = cache.get(K)
    assert got is not None and got.resource == "other"


def test_bounded_size() -> None:
    """The cache holds at most maxsize leases."""
    clock = FakeClock()
    cache = make(clock, maxsize=10)
    for i in range(50):
        exp = clock.now_us() + 3600 * US
        cache.put(Lease("c", "p", f"k{i}", f"r{i}", "us-east-1", exp, 1), clock.mono())
    assert len(cache) == 10


def test_bounded_size_keeps_the_latest_confirmations() -> None:
    """Past maxsize, the entries confirmed longest ago go first; a re-put counts as new."""
    clock = FakeClock()
    cache = make(clock, maxsize=16)
    exp = clock.now_us() + 3600 * US
    for i in range(16):
        cache.put(Lease("c", "p", f"k{i}", f"r{i}", "us-east-1", exp, 1), clock.mono())
        clock.advance(0.01)
    cache.put(Lease("c", "p", "k0", "r0", "us-east-1", exp, 1), clock.mono())  # reconfirmed
    cache.put(Lease("c", "p", "new", "rn", "us-east-1", exp, 1), clock.mono())
    assert len(cache) <= 16
    assert ("c", "p", "k0") in cache and ("c", "p", "new") in cache
    assert ("c", "p", "k1") not in cache


def test_expired_entries_make_room_before_live_ones() -> None:
    clock = FakeClock()
    cache = make(clock, maxsize=4)
    exp = clock.now_us() + 3600 * US
    for i in range(3):
        cache.put(Lease("c", "p", f"old{i}", "r", "us-east-1", exp, 1), clock.mono())
    clock.advance(S / 2)
    cache.put(Lease("c", "p", "live", "r", "us-east-1", exp, 1), clock.mono())
    clock.advance(S / 2 + 0.1)  # old* are past S, live is not
    cache.put(Lease("c", "p", "next", "r", "us-east-1", exp, 1), clock.mono())
    assert ("c", "p", "live") in cache and ("c", "p", "next") in cache
    assert len(cache) == 2


def test_pools_and_clients_are_apart() -> None:
    clock = FakeClock()
    cache = make(clock)
    exp = clock.now_us() + 3600 * US
    cache.put(Lease("c", "p", "k", "r1", "us-east-1", exp, 1), clock.mono())
    cache.put(Lease("c", "q", "k", "r2", "us-east-1", exp, 1), clock.mono())
    cache.put(Lease("d", "p", "k", "r3", "us-east-1", exp, 1), clock.mono())
    got = [cache.get(k) for k in (("c", "p", "k"), ("c", "q", "k"), ("d", "p", "k"))]
    assert [g.resource if g else None for g in got] == ["r1", "r2", "r3"]
    cache.drop(("c", "q", "k"))
    assert cache.get(("c", "q", "k")) is None and len(cache) == 2
    assert cache.entry("x", "p", "k", clock.mono()) is None


def test_read_takes_the_time_passed_in() -> None:
    """The hot path passes the request's one clock reading; validity is judged at it, and
    the entry's confirmation time comes with it."""
    clock = FakeClock()
    cache = make(clock)
    t = clock.mono()
    cache.put(lease(clock, 3600), t)
    r = cache.read("c", "p", "k", t + S - 0.1)
    assert r is not None and r[1] == t
    assert cache.read("c", "p", "k", t + S + 0.1) is None
    assert cache.size() == 0  # dropped when read past its validity


# ------------------------------------------------------------------ the compact entry
def test_entry_gives_back_the_lease_it_was_made_from() -> None:
    """One bytes object per lease: the Lease is rebuilt from it field for field."""
    clock = FakeClock()
    cache = make(clock)
    exp = clock.now_us() + 3600 * US
    for lease_in in (
        Lease("c", "p", "k", "rés-1", "us-east-1", exp, 2**40, exp - 7, "0123456789abcdef"),
        Lease("c", "p", "k2", "r" * 1024, "eu-west-1", exp, 0, 0, None),
    ):
        cache.put(lease_in, clock.mono())
        got = cache.get((lease_in.client_id, lease_in.pool_id, lease_in.key))
        assert got == lease_in


def test_the_hit_answer_is_the_answer_layout_for_any_id() -> None:
    """The entry holds a hit's whole answer frame but the id's value: LeaseCache.answer splices
    it in, and the frame decodes to what protocol.lease_response says; a negative id (no
    uint64) gives exactly the bytes lease_response encodes to."""
    clock = FakeClock()
    cache = make(clock)
    cache.pools[("c", "p")] = Pool("c", "p", 7200 * US)
    lease_in = lease(clock, 3600, version=9, resource="res-9")
    cache.put(lease_in, clock.mono())
    requested = clock.now_us() + 60 * US
    for rid in (0, 5, 255, 2**31, ID_MAX, -1, -200, -(2**63)):
        out = cache.answer("c", "p", "k", requested, clock.mono(), rid)
        assert out is not None
        dec = FrameDecoder()
        dec.feed(out)
        (got,) = list(dec.frames())
        assert got == lease_response(rid, lease_in, False)
        assert dec.buffered == 0
        if rid < 0:
            assert out == encode(lease_response(rid, lease_in, False))


def test_the_hit_answer_reads_the_entry_as_read_does() -> None:
    """LeaseCache.answer reads the entry itself (one call on the hit): at every moment it
    answers exactly when read() finds a valid entry, and drops an expired one alike."""
    clock = FakeClock()
    for reader in ("answer", "read"):
        cache = make(clock)
        cache.pools[("c", "p")] = Pool("c", "p", 7200 * US)
        t0 = clock.mono()
        cache.put(lease(clock, 3600), t0)
        seen = []
        for dt in (0.0, S / 2, S - 0.001, S, S + 1):
            requested = clock.now_us() + 60 * US
            if reader == "answer":
                seen.append(cache.answer("c", "p", "k", requested, t0 + dt, 1) is not None)
            else:
                seen.append(cache.read("c", "p", "k", t0 + dt) is not None)
        assert seen == [True, True, True, False, False], reader
        assert cache.size() == 0, reader


def test_the_hit_answer_needs_the_pool_and_refuses_its_bad_ends() -> None:
    """No pool known: no answer (the miss reads the pool). A lease end the pool refuses:
    BadRequest naming it, entry or not. No entry: no answer."""
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 3600), clock.mono())
    now = clock.mono()
    ok = clock.now_us() + 60 * US
    assert cache.answer("c", "p", "k", ok, now, 1) is None
    cache.pools[("c", "p")] = Pool("c", "p", 600 * US)
    assert cache.answer("c", "p", "k", ok, now, 1) is not None
    assert cache.answer("c", "p", "other", ok, now, 1) is None
    for key in ("k", "other"):
        with pytest.raises(BadRequest, match="in the past"):
            cache.answer("c", "p", key, clock.now_us() - 1, now, 1)
        with pytest.raises(BadRequest, match="maximum lease of 600s"):
            cache.answer("c", "p", key, clock.now_us() + 601 * US, now, 1)


def test_only_leases_of_this_region_are_marked_for_extension() -> None:
    clock = FakeClock()
    cache = LeaseCache(clock, 100, 5 * US, S, "us-east-1")
    exp = clock.now_us() + 3600 * US
    cache.put(Lease("c", "p", "own", "r", "us-east-1", exp, 1), clock.mono())
    cache.put(Lease("c", "p", "far", "r", "eu-west-1", exp, 1), clock.mono())
    own = cache.read("c", "p", "own", clock.mono())
    far = cache.read("c", "p", "far", clock.mono())
    assert own is not None and far is not None
    assert own[2] == exp
    assert far[2] == NEVER


def test_the_first_lease_of_a_pool_in_a_full_cache_is_kept() -> None:
    """Making room drops empty pools, the new lease's own included: it must still land in
    the pool the cache serves from."""
    clock = FakeClock()
    cache = make(clock, maxsize=2)
    exp = clock.now_us() + 3600 * US
    cache.put(Lease("c", "p", "a", "r", "us-east-1", exp, 1), clock.mono())
    cache.put(Lease("c", "q", "b", "r", "us-east-1", exp, 1), clock.mono())
    cache.put(Lease("c", "new", "k", "rn", "us-east-1", exp, 1), clock.mono())
    got = cache.get(("c", "new", "k"))
    assert got is not None and got.resource == "rn"
    assert cache.size() == len(cache)


@pytest.mark.parametrize("age", [0.0, S / 2 - 0.5, S / 2 + 0.5, S - 0.5, S + 0.5])
@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1"])
@pytest.mark.parametrize("more", [-60, 0, 60])
def test_the_hit_decides_as_the_cache_rules(age: float, region: str, more: int) -> None:
    """The hit inlines ``cache_rules.serves`` and ``cache_rules.hit_wants_refresh`` (a call
    costs 2 % of a hit): whether it answers, and whether it asks for a refresh, are theirs,
    for entries of either region, fresh, stale and expired, asked for less, as much or more
    than the lease has."""
    clock = FakeClock()
    asked: list[int] = []
    cache = LeaseCache(
        clock,
        100,
        5 * US,
        S,
        "us-east-1",
        pools={("c", "p"): Pool("c", "p", 7200 * US)},
        refresh=lambda k, le, req, now_us: asked.append(req),
    )
    held = Lease("c", "p", "k", "r", region, clock.now_us() + 3600 * US, 1, token="t")
    confirmed = clock.mono()
    cache.put(held, confirmed)
    until = cache_rules.valid_until(
        confirmed, S, clock.mono(), held.expires_us, 5 * US, clock.now_us()
    )
    clock.advance(age)
    now = clock.mono()
    requested = held.expires_us + more * US
    got = cache.answer("c", "p", "k", requested, now, 1)
    assert (got is not None) is cache_rules.serves(until, now)
    wants = cache_rules.hit_wants_refresh(
        confirmed, now, S, requested, cache_rules.extend_from(held, "us-east-1")
    )
    assert bool(asked) is (got is not None and wants)
    assert cache.stale(K, now) is (got is not None and cache_rules.stale(confirmed, now, S))

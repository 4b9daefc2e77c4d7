"""A pool's outage window in the lease cache, with an injected clock: past S an entry of a
pool with an outage budget is no hit, but stays for the router's outage path until its
window ends (``cache_rules.outage_window_us``), never within the skew margin of the lease's
end (docs/design.md, "An outage budget")."""

from __future__ import annotations

from rasd.config import Config
from rasd.core import cache_rules
from rasd.core.lease import US, Lease, Pool
from rasd.daemon.cache import LeaseCache
from rasd_client.wire import FrameDecoder
from tests.doubles.clock import FakeClock

RULES = Config().rules()  # S 30, skew 2, lag 25: Q 57
S = RULES.confirm_us / US
BUDGET = Pool("c", "p", 86_400 * US, None, 600 * US, 627 * US)
PLAIN = Pool("c", "plain", 86_400 * US)


def lease(clock: FakeClock, seconds: float, pool: str = "p") -> Lease:
    exp = clock.now_us() + int(seconds * US)
    return Lease("c", pool, "k", "r", "us-east-1", exp, 1, token="t")


def make(clock: FakeClock) -> LeaseCache:
    pools = {("c", "p"): BUDGET, ("c", "plain"): PLAIN}
    return LeaseCache(clock, 100, 5 * US, S, "us-east-1", pools=pools, rules=RULES)


def test_the_window_is_the_budget_when_the_pools_quarantine_covers_it() -> None:
    assert cache_rules.outage_window_us(RULES, BUDGET) == 600 * US
    short = Pool("c", "p", 1, None, 600 * US, 600 * US)  # a quarantine short of the skew+lag
    assert cache_rules.outage_window_us(RULES, short) == (600 - 2 - 25) * US
    assert cache_rules.outage_window_us(RULES, PLAIN) == RULES.confirm_us  # no budget: S
    assert cache_rules.outage_window_us(RULES, Pool("c", "p", 1, None, 10 * US, 37 * US)) == 30 * US


def test_past_s_an_entry_is_no_hit_but_answers_from_its_window_until_it_ends() -> None:
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 3600), clock.mono())
    clock.advance(S + 1)
    now = clock.mono()
    assert cache.get(("c", "p", "k")) is None  # no hit
    frame = cache.spare_answer("c", "p", "k", clock.now_us() + 3600 * US, now, 7)
    assert frame is not None
    (answer,) = list(_frames(frame))
    assert (answer["resource"], answer["id"]) == ("r", 7)
    clock.advance(600 - S - 1 - 0.1)
    assert cache.spare_entry("c", "p", "k", clock.mono()) is not None
    clock.advance(0.2)
    assert cache.spare_entry("c", "p", "k", clock.mono()) is None
    assert cache.size() == 1  # dropped when read past it
    assert cache.get(("c", "p", "k")) is None and cache.size() == 0


def test_the_window_never_reaches_the_lease_end_less_the_margin() -> None:
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 100), clock.mono())
    clock.advance(94.9)
    assert cache.spare_entry("c", "p", "k", clock.mono()) is not None
    clock.advance(0.2)  # 5 s (the margin) before its end
    assert cache.spare_entry("c", "p", "k", clock.mono()) is None


def test_a_pool_without_a_budget_has_no_window() -> None:
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 3600, pool="plain"), clock.mono())
    clock.advance(S + 0.1)
    assert cache.spare_entry("c", "plain", "k", clock.mono()) is None
    assert cache.size() == 1 and cache.get(("c", "plain", "k")) is None and cache.size() == 0


def test_a_deleted_pool_answers_nothing_from_its_window() -> None:
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 3600), clock.mono())
    clock.advance(S + 1)
    del cache.pools[("c", "p")]
    assert cache.spare_entry("c", "p", "k", clock.mono()) is None


def test_an_entry_taken_out_goes_back_only_where_nothing_took_its_place() -> None:
    clock = FakeClock()
    cache = make(clock)
    cache.put(lease(clock, 3600), clock.mono())
    e = cache.take("c", "p", "k")
    assert e is not None and cache.size() == 0 and cache.take("c", "p", "k") is None
    cache.restore("c", "p", "k", e)
    assert cache.size() == 1
    newer = lease(clock, 7200)
    cache.put(newer, clock.mono())
    cache.restore("c", "p", "k", e)  # a newer answer is kept
    got = cache.get(("c", "p", "k"))
    assert got is not None and got.expires_us == newer.expires_us


def _frames(data: bytes) -> list[dict[str, object]]:
    dec = FrameDecoder()
    dec.feed(data)
    return list(dec.frames())

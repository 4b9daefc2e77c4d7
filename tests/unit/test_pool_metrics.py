"""Per-pool capacity metrics of the daemon: names, labels and the cap on distinct pools."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rasd.observe.metrics import Counters
from rasd.observe.pools import MAX_POOLS, OVERFLOW, PoolMetrics
from rasd.observe.prom import build_registry


def scrape(pools: PoolMetrics, claimable: dict[tuple[str, str], float] | None = None) -> dict:
    reg = build_registry(
        Counters(),
        process=False,
        pools=pools,
        claimable=None if claimable is None else (lambda: claimable),
    )
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if s.name.startswith("rasd_pool_"):
                out[(s.name, s.labels["client_id"], s.labels["pool_id"])] = s.value
    return out


def test_new_leases_and_no_capacity_answers_are_counted_per_pool() -> None:
    m = PoolMetrics()
    m.new_lease("acme", "ads")
    m.new_lease("acme", "ads")
    m.no_capacity_answer("acme", "ads")
    m.no_capacity_answer("demo", "default")
    got = scrape(m, {("acme", "ads"): 7, ("demo", "default"): 0})
    assert got == {
        ("rasd_pool_new_leases_total", "acme", "ads"): 2,
        ("rasd_pool_no_capacity_total", "acme", "ads"): 1,
        ("rasd_pool_new_leases_total", "demo", "default"): 0,  # from its first count on
        ("rasd_pool_no_capacity_total", "demo", "default"): 1,
        ("rasd_pool_claimable_candidates", "acme", "ads"): 7,
        ("rasd_pool_claimable_candidates", "demo", "default"): 0,
    }


def test_pools_past_the_cap_share_the_overflow_labels() -> None:
    """The first ``max_pools`` pools counted keep their labels; the rest are summed under
    the overflow value, which no pool name can take; the scrape never adds a pool."""
    m = PoolMetrics(max_pools=2)
    m.no_capacity_answer("c", "p1")
    m.no_capacity_answer("c", "p2")
    for i in range(3, 50):
        m.no_capacity_answer("c", f"p{i}")
    m.new_lease("c", "p1")
    m.new_lease("c", "p9")
    got = scrape(m, {("c", "p1"): 3, ("c", "p7"): 4, ("c", "p8"): 5})
    assert got[("rasd_pool_no_capacity_total", "c", "p1")] == 1
    assert got[("rasd_pool_no_capacity_total", "c", "p2")] == 1
    assert got[("rasd_pool_no_capacity_total", OVERFLOW, OVERFLOW)] == 47
    assert got[("rasd_pool_new_leases_total", OVERFLOW, OVERFLOW)] == 1
    assert got[("rasd_pool_claimable_candidates", OVERFLOW, OVERFLOW)] == 9
    assert {k[1:] for k in got} == {("c", "p1"), ("c", "p2"), (OVERFLOW, OVERFLOW)}
    assert len(m._labelled) == 2  # overflowed pools are not remembered


def test_the_default_cap_bounds_the_series() -> None:
    m = PoolMetrics()
    for i in range(MAX_POOLS * 3):
        m.new_lease("c", f"p{i}")
    assert len(m.new) == MAX_POOLS + 1
    assert m.new[(OVERFLOW, OVERFLOW)] == MAX_POOLS * 2


def test_without_the_pool_collector_nothing_per_pool_is_exported() -> None:
    reg = build_registry(Counters(), process=False)
    assert "rasd_pool_" not in generate_latest(reg).decode()

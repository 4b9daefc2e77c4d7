"""The balancer's pure parts: demand smoothing, projection, targets, the move plan, the meta
items, and the stream record classification. No DynamoDB, no S3, time passed in."""

from __future__ import annotations

import itertools
import math
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from rasd.core.lease import HOSTS_CLIENT, US
from rasd_jobs import balance_model, stream

NOW = 1_800_000_000 * US
E, W, A = "us-east-1", "eu-west-1", "ap-southeast-1"


# ----------------------------------------------------------------------------------- EWMA
def test_ewma_first_value_and_weighting() -> None:
    """An EWMA starts at its first observation and moves alpha of the way to each new one."""
    assert balance_model.ewma(None, 10.0, 0.3) == 10.0
    assert balance_model.ewma(10.0, 20.0, 0.3) == pytest.approx(13.0)
    assert balance_model.ewma(13.0, 20.0, 0.3) == pytest.approx(15.1)


def test_ewma_over_several_steps_equals_repeated_single_steps() -> None:
    """A window of k intervals (a late run) decays like k runs observing the same rate, so
    demand smoothing depends on elapsed time, not on how often the job happened to run."""
    x = 100.0
    for _ in range(3):
        x = balance_model.ewma(x, 40.0, 0.25)
    assert balance_model.ewma(100.0, 40.0, 0.25, steps=3) == pytest.approx(x)


def test_holt_tracks_constant_demand_without_trend() -> None:
    """Constant demand keeps the level there and the trend at zero."""
    h = balance_model.Holt(50.0)
    for _ in range(10):
        h = h.update(50.0, 0.4, 0.2)
    assert h.level == pytest.approx(50.0)
    assert h.trend == pytest.approx(0.0)
    assert h.project(2) == pytest.approx(100.0)


def test_holt_single_step_matches_textbook_formula() -> None:
    """One step of Holt's linear method, worked by hand."""
    h = balance_model.Holt(10.0, 2.0).update(20.0, 0.5, 0.5)
    # forecast 12; level = .5*20 + .5*12 = 16; trend = .5*(16-10) + .5*2 = 4
    assert (h.level, h.trend) == (pytest.approx(16.0), pytest.approx(4.0))


def test_projection_on_a_ramp_converges_to_the_true_next_horizon() -> None:
    """On demand rising by c per interval, the projection converges to the true total of
    the next H intervals (a lagging EWMA alone would undershoot by about c * lag * H)."""
    p = balance_model.Params()
    c = 7.0
    sig: dict[balance_model.Key, balance_model.Signal] = {}
    k = ("demo", "default", E)
    x = 0
    for step in range(1, 60):
        x = int(c * step)
        sig = balance_model.observe(
            sig, {k: balance_model.Counts(acquired=x)}, {k}, p.interval_s, p
        )
    true_next = c * (59 + 1) + c * (59 + 2)  # H = 2 intervals
    assert balance_model.projected_demand(sig[k], p) == pytest.approx(true_next, rel=0.01)
    plain = balance_model.ewma(None, 0.0, p.alpha)
    for step in range(1, 60):
        plain = balance_model.ewma(plain, c * step, p.alpha)
    assert 2 * plain < true_next * 0.97  # the plain EWMA lags: why the trend is there


def test_projection_never_negative_on_a_falling_ramp() -> None:
    """A steep fall projects zero demand, not a negative number of items."""
    assert balance_model.Holt(5.0, -10.0).project(2) == 0.0


def test_observe_scales_counts_by_window_length() -> None:
    """Twenty acquisitions in a 10-minute window are a rate of ten per 5-minute interval."""
    p = balance_model.Params()
    k = ("c", "p", E)
    out = balance_model.observe({}, {k: balance_model.Counts(acquired=20)}, {k}, 600.0, p)
    assert out[k].demand == balance_model.Holt(10.0)
    assert out[k].acquired == 10.0


def test_observe_decays_keys_without_events() -> None:
    """A region that went quiet is observed at zero, so its demand decays instead of sticking."""
    p = balance_model.Params()
    k = ("c", "p", W)
    sig = {k: balance_model.Signal(balance_model.Holt(100.0))}
    out = balance_model.observe(sig, {}, {k}, p.interval_s, p)
    assert out[k].demand is not None and out[k].demand.level < 100.0


def test_misses_count_as_demand_releases_do_not() -> None:
    """Unmet demand (misses) adds to demand; releases are tracked but not credited."""
    p = balance_model.Params()
    k = ("c", "p", E)
    out = balance_model.observe(
        {}, {k: balance_model.Counts(acquired=3, released=50, missed=4)}, {k}, 300.0, p
    )
    assert out[k].demand == balance_model.Holt(7.0)
    assert out[k].released == 50.0


def test_signal_json_roundtrip() -> None:
    """State on S3 restores exactly what the model had."""
    s = balance_model.Signal(balance_model.Holt(3.5, -0.25), 1.0, 2.0, 3.0)
    assert balance_model.Signal.from_json(s.to_json()) == s
    assert (
        balance_model.Signal.from_json(balance_model.Signal().to_json()) == balance_model.Signal()
    )


def test_target_is_projection_times_safety_plus_floor() -> None:
    """Target free = ceil(projected x safety) + floor."""
    p = balance_model.Params(safety=1.5, floor=2)
    assert balance_model.target_free(0.0, p) == 2
    assert balance_model.target_free(10.0, p) == 17
    assert balance_model.target_free(10.1, p) == 18


# ----------------------------------------------------------------------------------- plan
def _free(c: str, p: str, **by_region: int) -> dict[balance_model.Key, int]:
    names = {"e": E, "w": W, "a": A}
    return {(c, p, names[r]): n for r, n in by_region.items()}


def test_two_regions_deficit_filled_from_surplus() -> None:
    """With two regions, the deficit is filled exactly, from the other region's surplus."""
    free = _free("c", "p", e=0, w=100)
    targets = _free("c", "p", e=30, w=10)
    moves, capped = balance_model.allocate(free, targets, 1000)
    assert moves == [balance_model.Move("c", "p", W, E, 30)]
    assert not capped


def test_donor_never_drained_below_its_target() -> None:
    """A donor gives only what it has above its own target, even if the recipient stays short."""
    free = _free("c", "p", e=0, w=25)
    targets = _free("c", "p", e=100, w=20)
    moves, _ = balance_model.allocate(free, targets, 1000)
    assert moves == [balance_model.Move("c", "p", W, E, 5)]
    after = balance_model.apply_moves(free, moves)
    assert after[("c", "p", W)] == 20


def test_three_regions_take_from_the_largest_surplus_ratio_first() -> None:
    """With 3 regions, the donor is the one with the highest free/target ratio: ap (90/10)
    gives before eu (120/60), although eu has more items above its target (60 vs 80)."""
    free = _free("c", "p", e=0, w=120, a=90)
    targets = _free("c", "p", e=20, w=60, a=10)
    moves, _ = balance_model.allocate(free, targets, 1000)
    assert moves == [balance_model.Move("c", "p", A, E, 20)]  # ap stays at 70/10 = 7 > 120/60 = 2


def test_three_regions_spread_the_taking_proportionally() -> None:
    """When the best donor's ratio falls to another donor's, both give in turn, so both end
    at about the same free/target ratio (no donor emptied first)."""
    free = _free("c", "p", e=0, w=100, a=100)
    targets = _free("c", "p", e=100, w=20, a=40)
    moves, _ = balance_model.allocate(free, targets, 1000)
    after = balance_model.apply_moves(free, moves)
    assert after[("c", "p", E)] == 100
    assert after[("c", "p", W)] >= 20 and after[("c", "p", A)] >= 40
    rw = after[("c", "p", W)] / 20
    ra = after[("c", "p", A)] / 40
    assert abs(rw - ra) <= 1 / 20 + 1 / 40  # equal up to one item's step
    assert {(m.src, m.dst) for m in moves} == {(W, E), (A, E)}


def test_three_regions_two_recipients_filled_most_starved_first() -> None:
    """Two recipients compete for a scarce surplus: the lowest free/target is served first,
    and the surplus ends up shared so both end at about the same ratio."""
    free = _free("c", "p", e=10, w=0, a=50)
    targets = _free("c", "p", e=40, w=20, a=20)
    moves, _ = balance_model.allocate(free, targets, 1000)
    after = balance_model.apply_moves(free, moves)
    assert after[("c", "p", A)] == 20  # the donor keeps its target
    assert after[("c", "p", E)] + after[("c", "p", W)] == 40
    assert abs(after[("c", "p", E)] / 40 - after[("c", "p", W)] / 20) <= 1 / 20


def test_ties_are_broken_by_region_name() -> None:
    """Equal ratios and amounts: the plan is the same on every run (region name order)."""
    free = _free("c", "p", e=0, w=50, a=50)
    targets = _free("c", "p", e=1, w=10, a=10)
    moves, _ = balance_model.allocate(free, targets, 1000)
    assert moves == [balance_model.Move("c", "p", A, E, 1)]  # "ap-southeast-1" < "eu-west-1"


def test_moves_capped_per_run() -> None:
    """max_moves bounds the items moved in one run over all pools; the plan says it was cut."""
    free = _free("c", "p", e=0, w=500) | _free("c", "q", e=0, w=500)
    targets = _free("c", "p", e=100, w=10) | _free("c", "q", e=100, w=10)
    moves, capped = balance_model.allocate(free, targets, 50)
    assert sum(m.count for m in moves) == 50
    assert capped
    # the cap is shared by need: both equally starved pools get half
    assert sorted(m.count for m in moves) == [25, 25]


def test_pools_never_exchange_items() -> None:
    """A surplus in one pool never serves another pool's deficit."""
    free = _free("c", "p", e=0, w=0) | _free("c", "q", e=100, w=100)
    targets = _free("c", "p", e=10, w=10) | _free("c", "q", e=10, w=10)
    moves, capped = balance_model.allocate(free, targets, 1000)
    assert moves == [] and not capped


@pytest.mark.parametrize("seed", range(30))
def test_plan_is_idempotent_and_safe_on_random_states(seed: int) -> None:
    """On random counts and targets (2-4 regions): no donor ends below its target, no region
    receives and gives in one plan, every recipient ends at most at its target, and planning
    again on the post-move counts yields no moves."""
    rng = random.Random(seed)
    regions = [E, W, A, "sa-east-1"][: rng.randint(2, 4)]
    free: dict[balance_model.Key, int] = {}
    targets: dict[balance_model.Key, int] = {}
    for pool, r in itertools.product(["p", "q"], regions):
        free[("c", pool, r)] = rng.randint(0, 200)
        targets[("c", pool, r)] = rng.randint(0, 120)
    moves, capped = balance_model.allocate(free, targets, 10_000)
    assert not capped
    after = balance_model.apply_moves(free, moves)
    for k in free:
        if free[k] > targets[k]:
            assert after[k] >= targets[k]
        else:
            assert free[k] <= after[k] <= max(free[k], targets[k])
    srcs = {(m.pool_id, m.src) for m in moves}
    dsts = {(m.pool_id, m.dst) for m in moves}
    assert not srcs & dsts
    assert balance_model.allocate(after, targets, 10_000) == ([], False)


def test_plan_uses_signals_for_targets() -> None:
    """plan(): demand in us-east-1 and none in eu-west-1 moves eu's spare items east."""
    p = balance_model.Params(safety=1.0, floor=2)
    k_e, k_w = ("c", "p", E), ("c", "p", W)
    sig = {
        k_e: balance_model.Signal(balance_model.Holt(10.0)),
        k_w: balance_model.Signal(balance_model.Holt(0.0)),
    }
    pl = balance_model.plan({k_e: 0, k_w: 50}, sig, p)
    assert pl.targets == {k_e: 22, k_w: 2}
    assert pl.moves == [balance_model.Move("c", "p", W, E, 22)]
    assert pl.total == 22


# ---------------------------------------------------------------------------- meta items
def test_miss_report_update_spec() -> None:
    """The daemon's miss report: one counter item per daemon, ADDed, with the time and a TTL."""
    kw = balance_model.miss_report_update("demo", "default", E, "host-1:4242", 3, NOW)
    assert kw["Key"] == {
        "client_id": {"S": HOSTS_CLIENT},
        "resource": {"S": f"misses#demo#default#{E}#host-1:4242"},
    }
    assert kw["UpdateExpression"] == "ADD #c :n SET #u = :now, #ttl = :ttl"
    assert kw["ExpressionAttributeNames"] == {"#c": "count", "#u": "updated", "#ttl": "ttl"}
    vals = kw["ExpressionAttributeValues"]
    assert vals[":n"] == {"N": "3"}
    assert vals[":now"] == {"S": "2027-01-15T08:00:00.000000Z"}
    assert int(vals[":ttl"]["N"]) == NOW // US + 7 * 86400
    assert "ConditionExpression" not in kw
    with pytest.raises(ValueError):
        balance_model.miss_report_update("demo", "default", E, "bad#id", 1, NOW)
    with pytest.raises(ValueError):
        balance_model.miss_report_update("demo", "default", E, "d", 0, NOW)


def test_miss_resource_parses_back() -> None:
    """The balancer recovers (client, pool, region) and the daemon id from the item's key,
    and ignores anything that is not a well-formed miss counter."""
    res = balance_model.miss_resource("demo", "default", E, "h:1")
    assert balance_model.parse_miss_resource(res) == (("demo", "default", E), "h:1")
    assert balance_model.parse_miss_resource("misses#demo#default") is None
    assert balance_model.parse_miss_resource("headroom#demo#default#us-east-1") is None
    assert balance_model.parse_miss_resource("misses#de.mo#default#us-east-1#h") is None


def test_miss_deltas() -> None:
    """Deltas since the last run: first run is only a baseline; a new daemon's counter counts
    in full; a counter that went down (reaped by TTL and restarted) counts in full."""
    a = balance_model.miss_resource("c", "p", E, "d1")
    b = balance_model.miss_resource("c", "p", E, "d2")
    w = balance_model.miss_resource("c", "p", W, "d3")
    deltas, mem = balance_model.miss_deltas({a: 10, w: 5}, None)
    assert deltas == {} and mem == {a: 10, w: 5}
    deltas, mem = balance_model.miss_deltas({a: 14, b: 2, w: 1}, mem)
    assert deltas == {("c", "p", E): 6, ("c", "p", W): 1}
    deltas, _ = balance_model.miss_deltas({a: 14, b: 2, w: 1}, mem)
    assert deltas == {}


def test_headroom_item_spec() -> None:
    """The headroom item the daemon serves: free, projected demand (rounded up), headroom."""
    it = balance_model.headroom_item(("demo", "default", E), 5, 7.2, NOW, 600)
    assert it == {
        "client_id": {"S": "#meta"},
        "resource": {"S": "headroom#demo#default#us-east-1"},
        "kind": {"S": "headroom"},
        "free": {"N": "5"},
        "projected_demand": {"N": "8"},
        "headroom": {"N": "-3"},
        "horizon_s": {"N": "600"},
        "updated": {"S": "2027-01-15T08:00:00.000000Z"},
    }


def test_meta_items_can_never_enter_an_index() -> None:
    """Meta items carry neither key nor partition, so they appear in neither sparse index."""
    items = [
        balance_model.headroom_item(("c", "p", E), 1, 1.0, NOW, 600),
        balance_model.miss_report_update("c", "p", E, "d", 1, NOW)["Key"],
    ]
    for it in items:
        assert "key" not in it and "partition" not in it and "lease_available" not in it


def test_params_validation() -> None:
    """Nonsense parameters are refused at start-up."""
    for bad in ({"interval_s": 0}, {"alpha": 0}, {"safety": 0.5}, {"floor": -1}):
        with pytest.raises(ValueError):
            balance_model.Params(**bad)  # type: ignore[arg-type]
    assert math.isclose(balance_model.Params().horizon_intervals, 2.0)


# ------------------------------------------------------------------------ stream records
def _img(key: str | None = None, region: str = E, **extra: str) -> dict[str, Any]:
    img: dict[str, Any] = {
        "client_id": {"S": "demo"},
        "resource": {"S": "r1"},
        "pool_id": {"S": "default"},
        "region": {"S": region},
        "version": {"N": "1"},
    }
    if key is not None:
        img["key"] = {"S": key}
        img["lease_expires"] = {"S": "2027-01-15T09:00:00.000000Z"}
    else:
        img["lease_available"] = {"S": "2027-01-15T07:00:00.000000Z"}
    img.update({k: {"S": v} for k, v in extra.items()})
    return img


def _rec(old: dict[str, Any] | None, new: dict[str, Any] | None, **ddb: Any) -> dict[str, Any]:
    name = "INSERT" if old is None else "REMOVE" if new is None else "MODIFY"
    d: dict[str, Any] = {"Keys": {"client_id": {"S": "demo"}, "resource": {"S": "r1"}}}
    if old is not None:
        d["OldImage"] = old
    if new is not None:
        d["NewImage"] = new
    d.update(ddb)
    return {"eventName": name, "dynamodb": d}


def test_classify_claim_is_an_acquisition() -> None:
    """Free -> leased is an acquisition in the item's region, with the record's time."""
    t = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
    evs = stream.classify(_rec(_img(), _img("k1"), ApproximateCreationDateTime=t))
    assert evs == [stream.Event(stream.ACQUIRE, "demo", "default", E, "r1", at_us=NOW)]


def test_classify_release_and_liberation() -> None:
    """Leased -> free (early release or liberation) is a release in the item's region."""
    evs = stream.classify(_rec(_img("k1", region=W), _img(region=W)))
    assert [(e.kind, e.region) for e in evs] == [(stream.RELEASE, W)]


def test_classify_move() -> None:
    """A region change is a move, from the old region to the new one; not an acquisition."""
    evs = stream.classify(_rec(_img(region=W), _img(region=E)))
    assert [(e.kind, e.from_region, e.region) for e in evs] == [(stream.MOVE, W, E)]


def test_classify_key_change_is_release_plus_acquisition() -> None:
    """A key replaced by another key: the old key let go, a new key acquired."""
    evs = stream.classify(_rec(_img("k1"), _img("k2")))
    assert [e.kind for e in evs] == [stream.RELEASE, stream.ACQUIRE]


def test_classify_ignores_extension_relet_and_free_inserts() -> None:
    """Writes that do not change who holds the item are not demand."""
    ext_new = _img("k1")
    ext_new["lease_expires"] = {"S": "2027-01-15T10:00:00.000000Z"}
    assert stream.classify(_rec(_img("k1"), ext_new)) == []  # extension / re-let, same key
    assert stream.classify(_rec(None, _img())) == []  # add-resources
    assert stream.classify(_rec(_img(), None)) == []  # delete of a free item


def test_classify_insert_with_key_and_delete_of_leased_item() -> None:
    """An item inserted already leased counts as an acquisition; a leased item deleted as a
    release."""
    assert [e.kind for e in stream.classify(_rec(None, _img("k")))] == [stream.ACQUIRE]
    assert [e.kind for e in stream.classify(_rec(_img("k"), None))] == [stream.RELEASE]


def test_classify_ignores_meta_items() -> None:
    """Pool definitions, counters, headroom, locks and acquisition locks are not resources."""
    for client in ("#meta", "#acq#demo#default#us-east-1"):
        old = _img()
        new = _img("k")
        old["client_id"] = new["client_id"] = {"S": client}
        assert stream.classify(_rec(old, new)) == []


def test_parents_first_orders_split_shards() -> None:
    """After a shard split, a parent shard still listed is read before its children."""
    shards = [
        {"ShardId": "a-child", "ParentShardId": "z-parent"},
        {"ShardId": "z-parent"},
        {"ShardId": "m-orphan", "ParentShardId": "gone"},
    ]
    assert [s["ShardId"] for s in stream.parents_first(shards)] == [
        "z-parent",
        "a-child",
        "m-orphan",
    ]


class _FakeStreams:
    """A stream client double: one open shard with a fixed list of records."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.iterator_types: list[str] = []

    def describe_stream(self, **kw: Any) -> dict[str, Any]:
        return {"StreamDescription": {"Shards": [{"ShardId": "s1"}]}}

    def get_shard_iterator(self, **kw: Any) -> dict[str, Any]:
        self.iterator_types.append(kw["ShardIteratorType"])
        start = 0
        if kw["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER":
            start = int(kw["SequenceNumber"]) + 1
        return {"ShardIterator": str(start)}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        i = int(ShardIterator)
        page = self.records[i : i + 2]
        return {"Records": page, "NextShardIterator": str(i + len(page))}


def test_read_stream_resumes_after_checkpoint() -> None:
    """Paged reading to the end records the last sequence number; the next read starts after
    it and sees only new records."""
    recs = [_rec(_img(), _img(f"k{i}")) for i in range(5)]
    for i, r in enumerate(recs):
        r["dynamodb"]["SequenceNumber"] = str(i)
    fake = _FakeStreams(recs)
    first = stream.read_stream(fake, "arn", {})
    assert (first.records, len(first.events), first.checkpoints) == (5, 5, {"s1": "4"})
    assert first.caught_up
    fake.records.append(_rec(_img("k9"), _img()))
    fake.records[-1]["dynamodb"]["SequenceNumber"] = "5"
    second = stream.read_stream(fake, "arn", first.checkpoints)
    assert [e.kind for e in second.events] == [stream.RELEASE]
    assert fake.iterator_types == ["TRIM_HORIZON", "AFTER_SEQUENCE_NUMBER"]


def test_read_stream_stops_at_budget_and_keeps_its_place() -> None:
    """A spent time budget ends the pass with a checkpoint at the last record read, so the
    next run continues there (no record skipped, none counted twice)."""
    recs = [_rec(_img(), _img(f"k{i}")) for i in range(6)]
    for i, r in enumerate(recs):
        r["dynamodb"]["SequenceNumber"] = str(i)
    # clock reads: the deadline, then one before each page: two pages in time, then late
    ticks = iter([0.0, 0.0, 0.0, 100.0, 100.0, 100.0])
    part = stream.read_stream(_FakeStreams(recs), "arn", {}, budget_s=10, clock=lambda: next(ticks))
    assert not part.caught_up
    assert part.checkpoints == {"s1": "3"}
    rest = stream.read_stream(_FakeStreams(recs), "arn", part.checkpoints)
    assert part.records + rest.records == 6

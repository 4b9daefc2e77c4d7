"""The simulation's pure parts: the traffic model and the replicator's last-writer-wins rule."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sim import traffic
from sim.capacity import ClaimableSample, no_capacity_while_claimable
from sim.replicator import audit_events, image_hash, stamp_of, wins
from sim.report import predict_duplicates, summary, validity
from sim.world import Outcome, explain_left

SCN = traffic.default_scenario()


# ----------------------------------------------------------------------------- traffic
def test_each_region_peaks_at_its_hour_without_events() -> None:
    calm = traffic.Scenario(SCN.regions)
    for prof in calm.regions:
        by_minute = {m: traffic.rate(calm, prof.name, m) for m in range(0, 1440, 5)}
        peak = max(by_minute, key=lambda m: by_minute[m])
        assert peak == pytest.approx(prof.peak_hour * 60, abs=5)
        assert by_minute[peak] == pytest.approx(prof.weight)
        trough = min(by_minute.values())
        assert trough == pytest.approx(prof.weight * prof.night, rel=0.01)


def test_peaks_are_at_different_utc_hours() -> None:
    assert len({p.peak_hour for p in SCN.regions}) == len(SCN.regions)


def test_spike_multiplies_only_its_region() -> None:
    s = SCN.spike
    assert s is not None
    mid = (s.start_min + s.end_min) / 2
    calm = traffic.Scenario(SCN.regions)
    for r in SCN.names:
        ratio = traffic.rate(traffic.Scenario(SCN.regions, spike=s), r, mid) / traffic.rate(
            calm, r, mid
        )
        assert ratio == pytest.approx(s.factor if r == s.region else 1.0)
    # fast rise, slower decay, nothing before
    assert traffic.spike_factor(s.start_min - 1, s, s.region) == 1.0
    assert traffic.spike_factor(s.start_min + s.rise_min, s, s.region) == pytest.approx(s.factor)
    after = traffic.spike_factor(s.end_min + s.decay_min / 2, s, s.region)
    assert 1.0 < after < s.factor
    assert traffic.spike_factor(s.end_min + s.decay_min + 1, s, s.region) == 1.0


def test_evacuation_empties_the_region_and_conserves_total() -> None:
    ev = SCN.evacuation
    assert ev is not None
    no_evac = traffic.Scenario(SCN.regions, spike=SCN.spike)
    for m in range(0, 1440, 7):
        a, b = traffic.rates(SCN, m), traffic.rates(no_evac, m)
        assert sum(a.values()) == pytest.approx(sum(b.values()))
        assert all(v >= 0 for v in a.values())
    mid = (ev.start_min + ev.end_min) / 2
    assert traffic.rates(SCN, mid)[ev.region] == 0.0
    assert traffic.rates(SCN, ev.end_min + ev.ramp_min + 1) == traffic.rates(
        no_evac, ev.end_min + ev.ramp_min + 1
    )


def test_schedule_is_deterministic_and_follows_the_rate() -> None:
    a = traffic.schedule(SCN, 7, day_s=60, keys_per_s=20, lease_s=5)
    b = traffic.schedule(SCN, 7, day_s=60, keys_per_s=20, lease_s=5)
    c = traffic.schedule(SCN, 8, day_s=60, keys_per_s=20, lease_s=5)
    assert a == b and a != c
    assert all(0 <= r.t < 60 for r in a.requests)
    assert [r.t for r in a.requests] == sorted(r.t for r in a.requests)
    # expected new keys: the integral of the rates
    expected = sum(
        sum(traffic.rates(SCN, traffic.sim_minute(i * 0.1 + 0.05, 60)).values()) * 20 * 0.1
        for i in range(600)
    )
    assert a.new_keys == pytest.approx(expected, rel=0.1)
    keys = [r.key for r in a.requests if r.first]
    assert len(keys) == len(set(keys))


def test_second_requests_go_elsewhere_within_the_lease() -> None:
    s = traffic.schedule(SCN, 3, day_s=60, keys_per_s=20, lease_s=5, p_global=1.0, gap_mean_s=2.0)
    firsts = {r.key: r for r in s.requests if r.first}
    seconds = [r for r in s.requests if not r.first]
    assert seconds
    for r in seconds:
        f = firsts[r.key]
        assert r.region != f.region
        assert r.gap < 5 and r.t == pytest.approx(f.t + r.gap)
    none = traffic.schedule(SCN, 3, day_s=60, keys_per_s=20, lease_s=5, p_global=0.0)
    assert none.second_requests == 0


def test_occupancy_counts_overlapping_leases() -> None:
    sched = traffic.Schedule(
        [
            traffic.Request(0.0, "a", "k1", True),
            traffic.Request(0.5, "a", "k2", True),
            traffic.Request(0.7, "b", "k1", False, 0.7),
        ],
        day_s=4.0,
    )
    occ = traffic.occupancy(sched, hold_s=1.0, names=("a", "b"), step_s=0.5)
    assert occ["a"][:4] == [1, 2, 2, 1]
    assert max(occ["b"]) == 0  # second requests hold nothing new


# ----------------------------------------------------------------------------- LWW rule
def test_wins_higher_version_first() -> None:
    assert wins((5, 100, "a", 1), (4, 999, "z", 9))
    assert not wins((4, 999, "z", 9), (5, 100, "a", 1))


def test_wins_equal_version_later_write_then_region() -> None:
    assert wins((5, 200, "a", 1), (5, 100, "b", 1))
    assert not wins((5, 100, "b", 1), (5, 200, "a", 1))
    assert wins((5, 100, "b", 1), (5, 100, "a", 1))  # same ms: region name decides
    assert not wins((5, 100, "a", 1), (5, 100, "b", 1))


def test_wins_is_a_total_order_so_replicas_converge() -> None:
    x, y = (3, 10, "eu-west-1", 4), (3, 10, "us-east-1", 2)
    assert wins(x, y) != wins(y, x)  # exactly one of two conflicting writes survives
    assert not wins(x, x)  # the same write is never applied twice
    assert wins(x, None)  # an absent item is always created


def _rec(old: dict | None, new: dict | None, t: float, seq: int = 1) -> dict:
    d: dict = {
        "Keys": {"client_id": {"S": "c"}, "resource": {"S": "r1"}},
        "ApproximateCreationDateTime": datetime.fromtimestamp(t, UTC),
        "SequenceNumber": str(seq),
    }
    if old is not None:
        d["OldImage"] = old
    if new is not None:
        d["NewImage"] = new
    return {"dynamodb": d}


def _img(version: int, region: str, key: str | None = None) -> dict:
    img = {
        "client_id": {"S": "c"},
        "resource": {"S": "r1"},
        "region": {"S": region},
        "version": {"N": str(version)},
    }
    if key:
        img["key"] = {"S": key}
    return img


def test_stamp_of_record() -> None:
    rec = _rec(None, _img(7, "eu-west-1"), 1000.5, 42)
    assert stamp_of(rec, "eu-west-1") == (7, 1000500, "eu-west-1", 42)


def test_conflict_claim_vs_move_resolves_by_time() -> None:
    """The race of docs/global.md: a move written in one replica and a claim in another, both
    from version 5. The later one wins, in both replicas."""
    move = stamp_of(_rec(_img(5, "b"), _img(6, "c"), 10.000), "a")
    claim = stamp_of(_rec(_img(5, "b"), _img(6, "b", "k"), 10.300), "b")
    assert wins(claim, move) and not wins(move, claim)


def test_image_hash_is_order_independent() -> None:
    a = {"x": {"S": "1"}, "y": {"N": "2"}}
    b = {"y": {"N": "2"}, "x": {"S": "1"}}
    assert image_hash(a) == image_hash(b)


def test_audit_flags_leased_moves_only() -> None:
    free_move = audit_events(_rec(_img(1, "a"), _img(2, "b"), 1.0), "a")
    assert free_move == [
        {"ev": "move", "res": "r1", "from": "a", "to": "b", "t": 1000, "leased": False, "in": "a"}
    ]
    bad = audit_events(_rec(_img(1, "a", "k"), _img(2, "b", "k"), 1.0), "a")
    assert bad[0]["leased"] is True
    acq = audit_events(_rec(_img(1, "a"), _img(2, "a", "k"), 1.0), "a")
    assert [e["ev"] for e in acq] == ["acq"]
    rel = audit_events(_rec(_img(2, "a", "k"), _img(3, "a"), 1.0), "a")
    assert [e["ev"] for e in rel] == ["rel"]
    meta = _rec(None, {"client_id": {"S": "#meta"}, "resource": {"S": "x"}}, 1.0)
    meta["dynamodb"]["Keys"]["client_id"] = {"S": "#meta"}
    assert audit_events(meta, "a") == []


# ---------------------------------------------------------------------------- capacity
class _Answer:
    def __init__(self, code: str, sent: float, done: float, region: str = "r") -> None:
        self.region, self.code, self.sent, self.done = region, code, sent, done


def _sample(start: float, *items: tuple[str, int], region: str = "r") -> ClaimableSample:
    return ClaimableSample(region, start, start + 0.1, frozenset(items))


def test_no_capacity_while_an_item_was_claimable_all_along_is_wrong() -> None:
    samples = [_sample(0.0, ("a", 1)), _sample(1.0, ("a", 1)), _sample(5.0, ("a", 1))]
    wrong = no_capacity_while_claimable([_Answer("NO_CAPACITY", 3.0, 3.2)], samples, 1.0)
    assert wrong == [{"region": "r", "sent": 3.0, "witness": "a"}]


def test_no_capacity_is_right_when_the_item_changed_or_the_window_is_not_covered() -> None:
    # claimed and freed again between the scans (a new version): not all along
    samples = [_sample(0.0, ("a", 1)), _sample(5.0, ("a", 3))]
    assert no_capacity_while_claimable([_Answer("NO_CAPACITY", 3.0, 3.2)], samples, 1.0) == []
    # a scan inside the back-off window cannot witness: the empty sweep may follow it
    samples = [_sample(2.5, ("a", 1)), _sample(5.0, ("a", 1))]
    assert no_capacity_while_claimable([_Answer("NO_CAPACITY", 3.0, 3.2)], samples, 1.0) == []
    # another region's items, answers that were leases, and no scan after the answer
    samples = [_sample(0.0, ("a", 1), region="x"), _sample(5.0, ("a", 1), region="x")]
    assert no_capacity_while_claimable([_Answer("NO_CAPACITY", 3.0, 3.2)], samples, 1.0) == []
    samples = [_sample(0.0, ("a", 1)), _sample(5.0, ("a", 1))]
    assert no_capacity_while_claimable([_Answer("OK", 3.0, 3.2)], samples, 1.0) == []
    assert no_capacity_while_claimable([_Answer("NO_CAPACITY", 3.0, 6.0)], samples, 1.0) == []


# ------------------------------------------------------------------- the report's judgements
def _o(key: str, first: bool, sent: float, done: float, code: str = "OK") -> Outcome:
    return Outcome(t=sent, region="r", key=key, first=first, gap=0.0, code=code, sent=sent,
                   done=done)  # fmt: skip


def test_duplicates_predicted_from_the_requests_as_made() -> None:
    outs = [
        # sent 0.3 s after the first: before any 1 s replication (certain)
        _o("a", True, 0.0, 0.01), _o("a", False, 0.3, 0.31),
        # 1.2 s after its send, 1.15 s after its answer: possible with a 1.4 s p99 lag only
        _o("b", True, 10.0, 10.05), _o("b", False, 11.2, 11.21),
        # 3 s later: replicated by then
        _o("c", True, 20.0, 20.01), _o("c", False, 23.0, 23.01),
        # 7.6 s into an 8 s lease: under the 0.5 s margin left, answered before its end
        # (certain); 7.95 s in, answered after its end: the claims may not overlap (possible)
        _o("d", True, 30.0, 30.01), _o("d", False, 37.6, 37.61),
        _o("g", True, 60.0, 60.01), _o("g", False, 67.95, 68.07),
        # the second request failed, or the first did: nothing to duplicate
        _o("e", True, 40.0, 40.01), _o("e", False, 40.1, 40.2, "NO_CAPACITY"),
        _o("f", True, 50.0, 50.01, "TIMEOUT"), _o("f", False, 50.1, 50.2),
    ]  # fmt: skip
    got = predict_duplicates(outs, lease_s=8.0, lag_lo_s=1.0, lag_hi_s=1.4, margin_s=0.5)
    assert (got["low"], got["high"]) == (2, 4)
    assert got["why"] == {
        "a": "replication",
        "b": "replication?",
        "d": "lease_end",
        "g": "lease_end?",
    }
    # with the lag achieved exactly as configured, b is not a possible duplicate
    assert predict_duplicates(outs, 8.0, 1.0, 1.0, 0.5)["high"] == 3


def _run(p99: float | None, requests: int, errors: dict[str, int]) -> dict[str, Any]:
    return {
        "replicator": {"achieved_lag_p99_s": p99},
        "requests": requests,
        "regions": {"r": {"other_errors": errors}},
    }


def test_a_run_is_valid_only_with_replication_and_backends_keeping_up() -> None:
    assert validity(_run(1.49, 1000, {"TIMEOUT": 9}), 1.0)["valid"]
    slow = validity(_run(1.51, 1000, {}), 1.0)
    assert not slow["valid"] and "replication lag p99 1.51 s > 1.5 s" in slow["why"]
    # 1 % of requests failing for another reason than capacity is too many
    assert not validity(_run(1.0, 1000, {"TIMEOUT": 6, "UNAVAILABLE": 4}), 1.0)["valid"]
    assert not validity(_run(None, 1000, {}), 1.0)["valid"]  # nothing replicated: no figure
    assert validity(_run(7.4, 1000, {"BUSY": 1}), 5.0)["valid"]


def _item(acquired: str, expires: str, region: str) -> dict[str, Any]:
    return {
        "lease_acquired": f"2026-11-27T00:00:{acquired}Z",
        "lease_expires": f"2026-11-27T00:{expires}Z",
        "region": region,
    }


def test_dedupe_leftovers_are_explained_by_their_survivor_not_outlasting_them() -> None:
    items = {
        "res-2": _item("01.000000", "02:00.000000", "eu-west-1"),  # the survivor: earliest
        "res-1": _item("01.100000", "01:59.000000", "us-east-1"),  # ends 1 s before it: kept
        "res-3": _item("01.200000", "01:00.000000", "us-west-2"),  # 60 s before: release it
    }
    rows = {r["extra"]: r for r in explain_left(items, need_s=7.0)}
    assert {r["survivor"] for r in rows.values()} == {"res-2"}
    assert rows["res-1"]["survivor_outlasts_s"] == 1.0 and rows["res-1"]["explained"]
    assert rows["res-3"]["survivor_outlasts_s"] == 60.0 and not rows["res-3"]["explained"]


def _seed(seed: int, bal: int, static: int, valid: bool = True) -> dict[str, Any]:
    def run(nc: int) -> dict[str, Any]:
        d = {"duplicate_keys": 2, "predicted_low": 1, "predicted_high": 3, "new_keys": 99}
        return {"no_capacity": nc, "validity": {"valid": valid}, "duplicates": d}

    ratio = {"ratio": bal / static, "met": bal * 5 <= static}
    return {
        "params": {"seed": seed},
        "verdicts": {"misses_balancer_le_one_fifth_static": ratio, "no_leased_item_moved": {
            "met": seed != 3}},
        "balancer": run(bal),
        "static": run(static),
    }  # fmt: skip


def test_over_seeds_the_misses_are_summed_and_every_other_verdict_holds_in_each() -> None:
    # seed 1 alone misses the fifth (0.3), the sum does not (12 / 70)
    got = summary([_seed(1, 6, 20), _seed(2, 6, 50)])
    assert got["valid"]
    assert got["verdicts"]["misses_balancer_le_one_fifth_static"]["met"]
    assert got["verdicts"]["misses_balancer_le_one_fifth_static"]["ratio"] == round(12 / 70, 4)
    assert got["verdicts"]["duplicates_balancer_totals"]["measured"] == 4
    bad = summary([_seed(1, 1, 50), _seed(3, 1, 50, valid=False)])
    assert not bad["valid"]
    assert bad["verdicts"]["no_leased_item_moved"] == {"seeds_missed": [3], "met": False}


def test_a_strict_pools_duplicates_count_only_answered_claims() -> None:
    """In a strict pool a claim named by its pending mapping may lose the agreement and be
    given back unanswered: only agreed (or confirmed live) claims count as leases."""
    from rasd.core.lease import fmt_time
    from sim.report import duplicates_from_audit

    end = fmt_time(10 * 1_000_000)
    audit = [
        {"ev": "acq", "res": "r1", "key": "k", "t": 0, "exp": end, "region": "a",
         "holder": "t1", "pool": "strict"},
        {"ev": "map", "key": "k", "pool": "strict", "region": "a", "state": "pending",
         "token": "t1", "res": "r1", "t": 0},
        {"ev": "acq", "res": "r2", "key": "k", "t": 100, "exp": end, "region": "b",
         "holder": "t2", "pool": "strict"},
        {"ev": "map", "key": "k", "pool": "strict", "region": "b", "state": "pending",
         "token": "t2", "res": "r2", "t": 100},
        {"ev": "agree", "token": "t1", "res": "r1", "t": 50},
        {"ev": "rel", "res": "r2", "key": "k", "t": 300},
    ]  # fmt: skip
    assert duplicates_from_audit(audit)["duplicate_keys"] == 1  # as a normal pool counts
    strict = duplicates_from_audit(audit, pool="strict", strict=True)
    assert strict["duplicate_keys"] == 0 and strict["claims_never_named"] == 1
    assert duplicates_from_audit(audit, pool="default")["keys_acquired"] == 0
    # a fallback's claim, confirmed live without an agreement, is a lease
    live = {**audit[3], "state": "live", "t": 120}
    assert duplicates_from_audit([*audit, live], strict=True)["duplicate_keys"] == 1

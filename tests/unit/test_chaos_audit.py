"""The chaos audit on small hand-made histories (chaos/audit.py): each finding is found when it
happened, and only then."""

from __future__ import annotations

from typing import Any

import pytest

from chaos import audit as chaos_audit
from rasd.core.lease import US, fmt_time

E, W = "us-east-1", "eu-west-1"


def get(
    app: int, key: str, res: str, t0: float, t1: float, exp: float, region: str = E
) -> dict[str, Any]:
    return {
        "op": "get_lease",
        "app": app,
        "key": key,
        "t0": t0,
        "t1": t1,
        "m0": t0,
        "m1": t1,
        "ok": True,
        "resource": res,
        "lease_expires": exp,
        "lease_region": region,
        "version": 1,
        "new": True,
    }


def rel(app: int, key: str, t0: float, t1: float, error: str | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"op": "release", "app": app, "key": key, "t0": t0, "t1": t1}
    r.update({"m0": t0, "m1": t1, "ok": error is None})
    if error:
        r["error"] = error
    return r


def err(app: int, key: str, t0: float, t1: float, code: str) -> dict[str, Any]:
    return {"op": "get_lease", "app": app, "key": key, "t0": t0, "t1": t1, "m0": t0, "m1": t1,
            "ok": False, "error": code}  # fmt: skip


# ------------------------------------------------------------------------- double allocation
def test_double_allocation_is_found() -> None:
    h = [get(0, "k1", "r1", 0, 1, 100), get(1, "k2", "r1", 10, 11, 50)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["double_allocations"] == 1
    ex = out["examples"]["double_allocations"][0]
    assert ex["resource"] == "r1" and ex["keys"] == ["k1", "k2"]
    assert ex["from"] == 11 and ex["to"] == 50


def test_same_key_on_same_resource_is_not_a_double_allocation() -> None:
    h = [get(0, "k1", "r1", 0, 1, 100), get(1, "k1", "r1", 10, 11, 100)]
    assert chaos_audit.audit(h, quarantine_window=0)["double_allocations"] == 0


def test_expired_answer_does_not_overlap() -> None:
    h = [get(0, "k1", "r1", 0, 1, 10), get(1, "k2", "r1", 10, 11, 50)]
    assert chaos_audit.audit(h, quarantine_window=0)["double_allocations"] == 0


def test_release_ends_validity() -> None:
    h = [
        get(0, "k1", "r1", 0, 1, 100),
        rel(0, "k1", 5, 6),
        get(1, "k2", "r1", 7, 8, 50),
    ]
    assert chaos_audit.audit(h, quarantine_window=0)["double_allocations"] == 0
    (a,) = [x for x in chaos_audit.answers(h) if x.key == "k1"]
    assert a.end == 5


def test_release_before_the_answer_does_not_end_it() -> None:
    """A release that was over before the answer came does not end the answer's validity."""
    h = [
        rel(0, "k1", 0.2, 0.5),
        get(0, "k1", "r1", 0, 1, 100),
        get(1, "k2", "r1", 10, 11, 50),
    ]
    assert chaos_audit.audit(h, quarantine_window=0)["double_allocations"] == 1


def test_release_concurrent_with_the_answer_ends_it() -> None:
    """Started before the answer came, ended after: unordered, so no false alarm."""
    h = [
        rel(2, "k1", 0.5, 2),
        get(0, "k1", "r1", 0, 1, 100),
        get(1, "k2", "r1", 10, 11, 50),
        get(0, "k1", "r2", 12, 13, 100),
    ]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["double_allocations"] == 0 and out["lost_leases"] == 0
    assert [a.end for a in chaos_audit.answers(h) if a.resource == "r1" and a.key == "k1"] == [1]


def test_definitely_refused_release_does_not_end_validity() -> None:
    h = [
        get(0, "k1", "r1", 0, 1, 100),
        rel(0, "k1", 5, 6, error="NOT_HELD"),
        get(1, "k2", "r1", 7, 8, 50),
    ]
    assert chaos_audit.audit(h, quarantine_window=0)["double_allocations"] == 1


def test_indeterminate_release_ends_validity() -> None:
    """A release that timed out may have been written: it must not raise a false alarm."""
    h = [
        get(0, "k1", "r1", 0, 1, 100),
        rel(0, "k1", 5, 7, error="TIMEOUT"),
        get(1, "k2", "r1", 7, 8, 50),
    ]
    assert chaos_audit.audit(h, quarantine_window=0)["double_allocations"] == 0


def test_release_scope_key_versus_app() -> None:
    """By default another app's release of the key ends validity (the lease is the key's);
    release_scope='app' counts only the same app's releases."""
    h = [
        get(0, "k1", "r1", 0, 1, 100),
        rel(2, "k1", 5, 6),
        get(1, "k2", "r1", 7, 8, 50),
    ]
    assert chaos_audit.audit(h, quarantine_window=0)["double_allocations"] == 0
    assert chaos_audit.audit(h, release_scope="app", quarantine_window=0)["double_allocations"] == 1
    with pytest.raises(ValueError):
        chaos_audit.answers(h, release_scope="host")


def test_a_double_allocation_is_counted_once_per_resource_and_key_pair() -> None:
    h = [get(0, "k1", "r1", i, i + 0.5, 100) for i in range(5)]
    h += [get(1, "k2", "r1", 10 + i, 10.5 + i, 100) for i in range(5)]
    h += [get(1, "k3", "r1", 20, 20.5, 100)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["double_allocations"] == 3  # {k1,k2}, {k1,k3}, {k2,k3}


# ------------------------------------------------------------------------------- splits
def test_in_region_split_is_found() -> None:
    h = [get(0, "k1", "r1", 0, 1, 100), get(1, "k1", "r2", 0, 2, 100)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["in_region_splits"] == 1
    ex = out["examples"]["in_region_splits"][0]
    assert ex["key"] == "k1" and ex["region"] == E and ex["resources"] == ["r1", "r2"]
    # concurrent calls (the second started before the first answer arrived): not a lost lease
    assert out["lost_leases"] == 0


def test_cross_region_duplicate_is_not_a_split() -> None:
    h = [get(0, "k1", "r1", 0, 1, 100, region=E), get(1, "k1", "w1", 0, 2, 100, region=W)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["in_region_splits"] == 0 and out["lost_leases"] == 0
    assert out["double_allocations"] == 0
    assert out["cross_region_duplicates"] == 1


def test_split_after_the_first_lease_expired_is_fine() -> None:
    h = [get(0, "k1", "r1", 0, 1, 5), get(1, "k1", "r2", 6, 7, 100)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["in_region_splits"] == 0 and out["lost_leases"] == 0


# --------------------------------------------------------------------------- lost leases
def test_lost_lease_is_found() -> None:
    h = [get(0, "k1", "r1", 0, 1, 100), get(0, "k1", "r2", 5, 6, 100)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["lost_leases"] == 1 and out["in_region_splits"] == 1
    ex = out["examples"]["lost_leases"][0]
    assert (ex["key"], ex["old"], ex["new"]) == ("k1", "r1", "r2")


def test_released_lease_is_not_lost() -> None:
    h = [get(0, "k1", "r1", 0, 1, 100), rel(3, "k1", 2, 3), get(0, "k1", "r2", 5, 6, 100)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["lost_leases"] == 0 and out["in_region_splits"] == 0


def test_lost_lease_in_other_region_is_not_lost() -> None:
    h = [get(0, "k1", "r1", 0, 1, 100, region=E), get(0, "k1", "w1", 5, 6, 100, region=W)]
    assert chaos_audit.audit(h, quarantine_window=0)["lost_leases"] == 0


# -------------------------------------------------------------------------- availability
def test_availability_latency_and_outage() -> None:
    h = [
        get(0, "k1", "r1", 0, 0.01, 100),
        get(0, "k1", "r1", 10.0, 10.002, 100),  # inside the outage: served from the cache
        err(1, "k2", 11.0, 12.0, "UNAVAILABLE"),
        err(1, "k2", 20.0, 21.0, "TIMEOUT"),
        rel(0, "k1", 30, 30.01),
    ]
    out = chaos_audit.audit(h, outage=(9.0, 17.0), quarantine_window=0)
    assert out["calls"] == {"get_lease": 4, "release": 1}
    assert out["outcomes"]["get_lease"] == {"TIMEOUT": 1, "UNAVAILABLE": 1, "ok": 2}
    assert out["answered_share"] == 0.5
    assert out["latency_ms"]["p50"] == pytest.approx(10.0)
    assert out["latency_ms"]["p99"] == pytest.approx(1000.0)
    assert out["outage"]["calls_inside"] == 2
    assert out["outage"]["served_from_cache"] == 1
    assert out["no_daemon"] == 0 and out["answered_share_daemon_up"] == 0.5


def test_calls_that_found_no_daemon() -> None:
    down = err(0, "k1", 1, 1.001, "UNAVAILABLE")
    down["message"] = "cannot connect to rasd at /tmp/x.sock: [Errno 111] Connection refused"
    h = [get(0, "k1", "r1", 0, 0.01, 100), down, err(0, "k1", 2, 3, "UNAVAILABLE")]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["no_daemon"] == 1
    assert out["answered_share"] == round(1 / 3, 4)
    assert out["answered_share_daemon_up"] == 0.5


def test_percentile_and_merge() -> None:
    assert chaos_audit.percentile([], 50) is None
    assert chaos_audit.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert chaos_audit.merge([(5, 6), (0, 2), (1, 3), (4, 4)]) == [(0, 3), (5, 6)]


# --------------------------------------------------------------------------------- table
def item(
    res: str,
    key: str | None = None,
    exp: float | None = None,
    avail: bool = False,
    region: str = E,
    client: str = "demo",
    holder: str | None = None,
) -> dict[str, Any]:
    it: dict[str, Any] = {"client_id": {"S": client}, "resource": {"S": res}}
    it["region"] = {"S": region}
    if key is not None:
        it["key"] = {"S": key}
        it["holder"] = {"S": holder or f"t-{res}"}
    if exp is not None:
        it["lease_expires"] = {"S": fmt_time(int(exp * US))}
    if avail:
        it["lease_available"] = {"S": fmt_time(0)}
    return it


def mapping(key: str, res: str, exp: float, region: str = E, token: str = "") -> dict[str, Any]:
    """A live mapping item naming ``res`` for ``key`` (token defaults to item()'s)."""
    return {
        "client_id": {"S": f"#map#demo#default#{key}"},
        "resource": {"S": region},
        "state": {"S": "live"},
        "token": {"S": token or f"t-{res}"},
        "res": {"S": res},
        "exp": {"S": fmt_time(int(exp * US))},
        "ver": {"N": "2"},
    }


def test_table_checks() -> None:
    now = 1_700_000_000.0
    items = [
        item("r1", avail=True),
        item("r2", key="k1", exp=now + 60),
        mapping("k1", "r2", now + 60),
        item("r3", key="k1", exp=now + 60),  # k1 holds r3 too, but no mapping names it: orphan
        item("w1", key="k1", exp=now + 60, region=W),  # cross-region: fine
        mapping("k1", "w1", now + 60, region=W),
        item("r4", key="k2", exp=now - 60),
        item("r5", key="k2", exp=now + 60),
        mapping("k2", "r5", now + 60),
        item("r6", key="k3", exp=now + 60, avail=True),  # both free and leased
        item("r7"),  # neither
        mapping("k4", "r1", now + 60),  # a live mapping naming a FREE resource: served free
        mapping("k5", "r5", now + 60, token="other"),  # names a resource k2's token holds
        mapping("k6", "r2", now - 60),  # expired: not served, fine
        item("y", key="k1", exp=now + 60, client="other"),
        {**item("r8"), "quarantine_until": {"S": fmt_time(int((now + 30) * US))}},  # free
    ]
    out = chaos_audit.table_checks(items, "demo", now)
    assert out["resources"] == 9
    assert out["both_free_and_leased"] == 1
    assert out["neither_free_nor_leased"] == 1
    assert out["orphans"] == 3  # r3, r4 (expired, unnamed) and r6
    assert out["keys_with_two_unexpired_in_region"] == 0
    assert out["live_mappings_not_held"] == 2
    assert out["examples"]["live_mappings_not_held"] == ["k4@us-east-1->r1", "k5@us-east-1->r5"]


def test_clean_table() -> None:
    now = 1_700_000_000.0
    items = [
        item("r1", avail=True),
        item("r2", key="k1", exp=now + 5),
        mapping("k1", "r2", now + 5),
    ]
    out = chaos_audit.table_checks(items, "demo", now)
    assert out["both_free_and_leased"] == out["live_mappings_not_held"] == out["orphans"] == 0


def test_a_released_resource_given_to_another_key_within_the_quarantine_is_flagged() -> None:
    """I1: after a release, the resource may go to another key only once the quarantine
    window (the daemons' quarantine minus the clock-skew bound) has passed."""
    h = [get(0, "k1", "r1", 0, 1, 100), rel(0, "k1", 5, 6), get(1, "k2", "r1", 7, 8, 50)]
    assert chaos_audit.audit(h, quarantine_window=55)["double_allocations"] == 1
    late = [*h[:2], get(1, "k2", "r1", 70, 71, 150)]
    assert chaos_audit.audit(late, quarantine_window=55)["double_allocations"] == 0


def test_a_stale_copy_of_a_released_lease_ends_with_the_lease() -> None:
    """A lease is (key, resource, version, region): a cached copy another daemon serves after
    the release ends with the lease (bounded staleness, I3), not at its own expiry; so
    neither the key's new lease nor the resource's next key conflicts with it."""

    def v(rec: dict[str, Any], version: int) -> dict[str, Any]:
        return {**rec, "version": version}

    h = [
        v(get(0, "k1", "r1", 0, 1, 100), 3),
        rel(0, "k1", 5, 6),
        v(get(1, "k1", "r1", 9, 10, 100), 3),  # a stale copy from another daemon's cache
        v(get(0, "k1", "r2", 11, 12, 100), 1),  # the key's new lease
        v(get(2, "k2", "r1", 70, 71, 150), 4),  # r1's next key, after the window
    ]
    out = chaos_audit.audit(h, quarantine_window=55)
    assert (out["double_allocations"], out["in_region_splits"]) == (0, 0), out
    # without the lease identity (versions differ), the stale copy would be a new lease
    assert (
        chaos_audit.audit([*h[:2], v(h[2], 9), *h[3:]], quarantine_window=55)["in_region_splits"]
        == 1
    )


# ----------------------------------------------------------------------------- mixed fleet
def paper(key: str, res: str, t0: float, t1: float, exp: float, region: str = E) -> dict[str, Any]:
    """An answer of the paper's agent (chaos.paper): the same record, ``agent: "paper"``."""
    return {**get(100, key, res, t0, t1, exp, region), "agent": "paper", "daemon": -1}


def test_a_paper_and_a_rasd_answer_of_one_resource_to_two_keys_is_a_double_allocation() -> None:
    """I1 across the agents: rasd answered r1 to k1, the paper's agent answered r1 to k2 while
    that lease ran (and the other way round). Both are flagged, with who answered."""
    h = [get(0, "k1", "r1", 0, 1, 100), paper("k2", "r1", 10, 11, 50)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["double_allocations"] == 1
    ex = out["examples"]["double_allocations"][0]
    assert ex["keys"] == ["k1", "k2"] and ex["agents"] == {"k1": ["rasd"], "k2": ["paper"]}
    h = [paper("k1", "r1", 0, 1, 100), get(0, "k2", "r1", 10, 11, 50)]
    assert chaos_audit.audit(h, quarantine_window=0)["double_allocations"] == 1


def test_a_paper_answer_holds_its_resource_to_its_end_through_a_release() -> None:
    """The paper's agent is never told of a release: after a release of k1, r1 may go to
    another key only once the paper's answer of it is over, quarantine or not."""
    h = [paper("k1", "r1", 0, 1, 100), rel(0, "k1", 5, 6), get(1, "k2", "r1", 70, 71, 150)]
    assert chaos_audit.audit(h, quarantine_window=55)["double_allocations"] == 1
    late = [*h[:2], get(1, "k2", "r1", 100, 101, 150)]
    assert chaos_audit.audit(late, quarantine_window=55)["double_allocations"] == 0


def test_a_key_split_across_a_rasd_and_a_paper_answer_is_flagged() -> None:
    """I2 across the agents: k1 answered r1 by rasd and r2 by the paper's agent, one region,
    overlapping: a split involving rasd, a failure; and a lost lease when the second call
    started after the first answer."""
    h = [get(0, "k1", "r1", 0, 1, 100), paper("k1", "r2", 10, 11, 50)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert (out["in_region_splits"], out["paper_only_splits"]) == (1, 0)
    ex = out["examples"]["in_region_splits"][0]
    assert ex["agents"] == ["paper/rasd"] and not ex["paper_only"] and not ex["concurrent"]
    assert (out["lost_leases"], out["paper_only_lost_leases"]) == (1, 0)
    # acquisitions that ran at once are still a failure, marked as such
    h = [get(0, "k1", "r1", 0, 2, 100), paper("k1", "r2", 1, 3, 50)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["in_region_splits"] == 1 and out["in_region_splits_concurrent"] == 1
    assert out["lost_leases"] == 0
    # the paper's answers in another region are cross-region duplicates, not splits
    h = [get(0, "k1", "r1", 0, 1, 100), paper("k1", "w1", 10, 11, 50, region=W)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert (out["in_region_splits"], out["cross_region_duplicates"]) == (0, 1)


def test_a_split_between_two_paper_answers_is_counted_apart() -> None:
    """The paper's own race splits a key between two of its answers: counted as
    ``paper_only_splits``, not as a failure; a rasd answer in the same overlap makes it one."""
    h = [paper("k1", "r1", 0, 1, 100), paper("k1", "r2", 10, 11, 50)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert (out["in_region_splits"], out["paper_only_splits"]) == (0, 1)
    assert (out["lost_leases"], out["paper_only_lost_leases"]) == (0, 1)
    h = [*h, get(0, "k1", "r2", 20, 21, 50)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert (out["in_region_splits"], out["paper_only_splits"]) == (1, 0)
    assert out["examples"]["in_region_splits"][0]["agents"] == ["paper/paper", "paper/rasd"]


def test_one_resource_answered_by_both_agents_to_one_key_is_fine() -> None:
    h = [get(0, "k1", "r1", 0, 1, 100), paper("k1", "r1", 10, 11, 100)]
    out = chaos_audit.audit(h, quarantine_window=0)
    assert out["double_allocations"] == out["in_region_splits"] == out["lost_leases"] == 0
    assert {a: g["answered"] for a, g in out["agents"].items()} == {"paper": 1, "rasd": 1}


def test_a_release_that_ended_during_a_paper_call_ends_its_answer() -> None:
    """The paper's agent reads its index, then answers: a release of the key that was over
    before the answer came but not before the call started may have written after that
    read. The answer counts for nothing (for splits); a later lease of the key on another
    resource is no split. A paper call that started once the release was over is ordered
    after it: a split."""
    h = [
        get(0, "k1", "r1", 0, 1, 100),
        rel(1, "k1", 5, 6),
        {**paper("k1", "r1", 5.5, 6.5, 100), "version": 2},  # began while the release ran
        get(0, "k1", "r2", 10, 11, 100),
    ]
    assert [a.end for a in chaos_audit.answers(h) if a.resource == "r1"] == [5, 6.5]
    assert chaos_audit.audit(h, quarantine_window=0)["in_region_splits"] == 0
    later = [*h[:2], {**h[2], "t0": 6.2, "m0": 6.2}, h[3]]
    assert chaos_audit.audit(later, quarantine_window=0)["in_region_splits"] == 1


# ------------------------------------------------------------------------------ replicas
def tombstone(res: str) -> dict[str, Any]:
    """A deleted name as ``rasadmin delete-resource`` leaves it (no pool, region, index)."""
    return {
        "client_id": {"S": "demo"},
        "resource": {"S": res},
        "hold_until": {"S": fmt_time(0)},
        "version": {"N": "3"},
    }


def test_replicas_that_agree_pass_and_tombstones_are_no_resources() -> None:
    now = 1_700_000_000.0
    same = [
        item("r1", avail=True),
        item("r2", key="k1", exp=now + 60),
        mapping("k1", "r2", now + 60),
    ]
    same.append(tombstone("r3"))
    out = chaos_audit.replica_checks({E: same, W: list(same)}, "demo", now)
    assert out["resources"] == 4  # two per replica: the tombstone is none
    assert out["tombstones"] == 2
    assert out["neither_free_nor_leased"] == 0
    assert out["leased_to_two_keys_across_replicas"] == 0
    assert out["regions_disagree"] == out["items_differ"] == 0
    assert chaos_audit.table_violations(out) == 0
    assert out["replicas"][E]["leased_unexpired"] == 1


def test_a_resource_leased_to_two_keys_on_two_replicas_is_a_violation() -> None:
    """Each replica alone is consistent; together they run two leases on r2: last-writer-wins
    kept a claim in one replica that the other replica's claim overwrote there."""
    now = 1_700_000_000.0
    east = [
        item("r2", key="k1", exp=now + 60, holder="a"),
        mapping("k1", "r2", now + 60, token="a"),
    ]
    west = [
        item("r2", key="k2", exp=now + 60, holder="b"),
        mapping("k2", "r2", now + 60, token="b"),
    ]
    west.append(item("r1", avail=True, region=W))
    east.append(item("r1", avail=True))  # a move not replicated yet
    out = chaos_audit.replica_checks({E: east, W: west}, "demo", now)
    assert out["leased_to_two_keys_across_replicas"] == 1
    assert out["examples"]["leased_to_two_keys_across_replicas"] == {
        "r2": {E: f"k1@{E}", W: f"k2@{E}"}
    }
    assert out["regions_disagree"] == 1
    assert chaos_audit.table_violations(out) == 1
    # the same lease in both replicas (one key), one of them expired in one: no violation
    west2 = [
        item("r2", key="k1", exp=now + 60, holder="a"),
        mapping("k1", "r2", now + 60, token="a"),
    ]
    assert (
        chaos_audit.replica_checks({E: east[:2], W: west2}, "demo", now)[
            "leased_to_two_keys_across_replicas"
        ]
        == 0
    )


def test_evidence_names_the_writes_near_a_finding() -> None:
    f = {"resource": "r1", "keys": ["k1", "k2"], "from": 100.0, "to": 110.0}
    writes = [
        {"t": 30.0, "res": "r1", "actor": "admin"},  # long before: left out
        {"t": 95.0, "res": "r1", "actor": "balancer", "ev": "move"},
        {"t": 101.0, "res": "r2", "actor": "daemon"},  # another resource
        {"t": 90.0, "res": "r1", "actor": "admin", "action": "readd"},
        {"t": 120.0, "res": "r1", "actor": "daemon"},  # long after: left out
    ]
    chaos_audit.evidence([f], writes, before_s=20.0, after_s=5.0)
    assert [w["actor"] for w in f["writes"]] == ["admin", "balancer"]


def test_calls_refused_past_a_redefined_max_lease_are_counted() -> None:
    refused = {
        "op": "get_lease", "app": 0, "key": "k1", "t0": 1.0, "t1": 1.1, "m0": 1.0, "m1": 1.1,
        "ok": False, "error": "BAD_REQUEST",
        "message": "lease_expires is beyond the pool's maximum lease of 45s",
    }  # fmt: skip
    other = {**refused, "message": "bad key"}
    assert (
        chaos_audit.availability([refused, other, get(0, "k1", "r1", 2, 3, 50)])[
            "refused_beyond_max_lease"
        ]
        == 1
    )


def test_rasadmin_refusals_are_told_apart() -> None:
    """The chaos run counts rasadmin's refusals by reason, from its messages (a quarantine's
    message speaks of the key that *released* it: not a lease)."""
    from chaos.admin import admin_summary

    def deleted(code: int, error: str = "") -> dict[str, Any]:
        return {"action": "delete", "region": E, "resources": ["r1"], "exit": code, "error": error}

    q = "refusing to delete 'r1': in quarantine until x (a daemon's cache may still serve it "
    q += "to the key that released it); wait, or pass --force"
    out = admin_summary(
        [
            deleted(0),
            deleted(1, "refusing to delete 'r1': leased by key 'k' until x; pass --force"),
            deleted(1, q),
            deleted(1, "'r1' changed after it was read; look again"),
            deleted(1, "cannot connect to DynamoDB at http://x:1 (region us-east-1): ..."),
            deleted(2, "usage"),
            {"action": "readd_elsewhere", "region": W, "resources": ["r1"], "exit": 0, "added": 1},
            {"action": "redefine", "region": W, "resources": [], "exit": 0},
        ]
    )
    assert out == {
        "deletes": 1,
        "delete_refused_leased": 1,
        "delete_refused_quarantine": 1,
        "delete_refused_changed": 1,
        "delete_refused_unreachable": 1,
        "delete_failed": 1,
        "re_adds": 1,
        "re_adds_held_by_tombstone": 0,
        "re_adds_in_the_other_region": 1,
        "re_adds_skipped_existing": 0,
        "redefinitions": 1,
    }


def made(key: str, res: str, sent: float, got: float, agent: str) -> dict[str, Any]:
    """A claim the run's proxies saw apply (chaos.proxy.lease_event), with its agent."""
    return {"key": key, "resource": res, "version": 1, "sent": sent, "got": got, "agent": agent}


def test_who_made_the_second_lease_of_a_split() -> None:
    """With the claims' write times, a split counts as rasd's failure when rasd made the
    second lease (its claim applied after the paper's had), and apart, as the paper's race,
    when the paper's agent did; the same for the lost lease it makes."""
    h = [get(0, "k1", "r1", 0, 2, 100), paper("k1", "r2", 1, 3, 50), paper("k1", "r2", 4, 5, 50)]
    rasd_second = [made("k1", "r2", 1.1, 1.2, "paper"), made("k1", "r1", 1.5, 1.6, "rasd")]
    out = chaos_audit.audit(h, quarantine_window=0, creations=rasd_second)
    assert (out["in_region_splits"], out["paper_made_splits"]) == (1, 0)
    second = out["examples"]["in_region_splits"][0]["second"]
    assert (second["resource"], second["by"]) == ("r1", "rasd")
    paper_second = [made("k1", "r1", 1.1, 1.2, "rasd"), made("k1", "r2", 1.5, 1.6, "paper")]
    out = chaos_audit.audit(h, quarantine_window=0, creations=paper_second)
    assert (out["in_region_splits"], out["paper_made_splits"]) == (0, 1)
    assert (out["lost_leases"], out["paper_made_lost_leases"]) == (0, 1)
    assert out["examples"]["paper_made_splits"][0]["second"]["by"] == "paper"
    # writes whose times overlap cannot be ordered: a failure, as without the claims
    unordered = [made("k1", "r1", 1.1, 1.6, "rasd"), made("k1", "r2", 1.5, 1.7, "paper")]
    out = chaos_audit.audit(h, quarantine_window=0, creations=unordered)
    assert (out["in_region_splits"], out["paper_made_splits"]) == (1, 0)
    assert out["examples"]["in_region_splits"][0]["second"] == {"by": "unknown"}
    # and without them at all
    assert chaos_audit.audit(h, quarantine_window=0)["in_region_splits"] == 1


def test_a_lease_answered_again_after_its_end_was_made_again_by_rasd() -> None:
    """rasd's lease r1 ran out at 10; the paper's agent claimed r2 at 12; rasd answered r1
    again at 13 (extended past its end). Its claim came first, but the lease running beside
    r2 was made again, by rasd, after the paper's: rasd's failure."""
    h = [
        get(0, "k1", "r1", 0, 1, 10),
        paper("k1", "r2", 11, 12.5, 50),
        get(0, "k1", "r1", 13, 14, 60),
    ]
    c = [made("k1", "r1", 0.2, 0.3, "rasd"), made("k1", "r2", 12, 12.2, "paper")]
    out = chaos_audit.audit(h, quarantine_window=0, creations=c)
    assert (out["in_region_splits"], out["paper_made_splits"]) == (1, 0)
    second = out["examples"]["in_region_splits"][0]["second"]
    assert (second["resource"], second["by"], second["made"]) == ("r1", "rasd", [13, 14])


def test_a_second_lease_rasd_made_counts_even_between_two_paper_answers() -> None:
    """rasd claimed r2 after the paper's r1 and never answered it, but the paper's lookup
    did: the split is between two paper answers, yet rasd made its second lease."""
    h = [paper("k1", "r1", 0, 2, 100), paper("k1", "r2", 5, 6, 50)]
    c = [made("k1", "r1", 1, 1.1, "paper"), made("k1", "r2", 3, 3.1, "rasd")]
    out = chaos_audit.audit(h, quarantine_window=0, creations=c)
    assert (out["in_region_splits"], out["paper_only_splits"]) == (1, 0)
    assert out["lost_leases"] == 1


def test_the_paper_agents_answer_of_a_lease_rasd_adopted_and_released_is_stale() -> None:
    """The paper's claim of r1 for k1 applied (its reply lost: no paper answer of it); rasd
    adopted it (answering it with the version its adoption wrote) and its app released k1;
    rasd then made k1's next lease, r2. The paper's agent answered r1 at 6, from an index
    that had not yet seen the free (at 3.5), with the claim's version: an answer of the
    released lease, stale as a cached copy is, not a second lease of k1. Counted still: the
    same answer to a call begun before the free landed (the index showed r1 held), and an
    answer of a claim of r1 made after the release."""
    adopted = {**get(0, "k1", "r1", 1, 2, 100), "version": 2, "new": False}
    h = [
        adopted,
        rel(0, "k1", 3, 4),
        get(0, "k1", "r2", 5, 5.5, 60),
        paper("k1", "r1", 5.8, 6, 100),
    ]
    free = {"kind": "free", "resource": "r1", "sent": 3.4, "got": 3.5}
    claims = [made("k1", "r1", 0.5, 0.6, "paper"), made("k1", "r2", 4.5, 4.6, "rasd")]
    out = chaos_audit.audit(h, quarantine_window=0, creations=[*claims, free])
    assert (out["in_region_splits"], out["lost_leases"]) == (0, 0), out["examples"]
    # without the claims and frees the audit cannot tell
    assert chaos_audit.audit(h, quarantine_window=0)["in_region_splits"] == 1
    late = {**free, "sent": 5.9, "got": 5.95}
    assert (
        chaos_audit.audit(h, quarantine_window=0, creations=[*claims, late])["in_region_splits"]
        == 1
    )
    # the paper's agent claimed r1 for k1 again after the release: a lease of its own
    again = [*claims, free, made("k1", "r1", 4.7, 4.8, "paper")]
    out = chaos_audit.audit(h, quarantine_window=0, creations=again)
    assert (out["in_region_splits"], out["paper_made_splits"]) == (0, 1)


def test_the_proxies_know_what_a_call_did_to_a_lease() -> None:
    """chaos.proxy.lease_event: rasd's claim and the paper's claim that applied are claims,
    rasd's extension an extension, a leased-index Query a lookup, a daemon's free and the
    liberator's a free; a refused write and an adoption are nothing."""
    import json

    from bench.baseline import paper_claim
    from chaos.proxy import lease_event
    from rasd.core import builders, decide
    from rasd.core import lease as lease_items
    from rasd.core.writes import render

    free = lease_items.ResourceItem("c", "r1", "p", E, "x", 4, lease_available=fmt_time(0))
    held = lease_items.ResourceItem("c", "r1", "p", E, "x", 5, "k", 10 * US, None, 0, "t", 1, 5)
    attrs = {"resource": {"S": "r1"}, "key": {"S": "k"}, "version": {"N": "5"}}
    attrs["lease_expires"] = {"S": fmt_time(10 * US)}

    def reply(status: str, body: dict[str, Any]) -> bytes:
        return f"HTTP/1.1 {status}\r\nContent-Type: x\r\n\r\n".encode() + json.dumps(body).encode()

    def ev(w: Any, r: bytes) -> dict[str, Any] | None:
        return lease_event("UpdateItem", json.dumps(render(w)).encode(), r)

    ok = reply("200 OK", {"Attributes": attrs})
    want = {"resource": "r1", "key": "k", "version": 5, "end": 10.0}
    refused = reply("400 Bad Request", {"__type": "x#ConditionalCheckFailedException"})
    for w in (builders.claim(free, "k", 10 * US, 1, "t", 1), paper_claim(free, "k", 10 * US)):
        assert ev(w, ok) == {"kind": "claim", **want}, w.kind
        assert ev(w, refused) is None
    lease = decide.lease_from_item(held)
    assert ev(builders.extend_resource(lease, 20 * US), ok) == {"kind": "extend", **want}
    unheld = reply("200 OK", {"Attributes": {"resource": {"S": "r1"}, "version": {"N": "6"}}})
    for w in (builders.free_claim(held.ident, "k", "t", 1, 2), builders.liberate(held, 11 * US)):
        assert ev(w, unheld) == {"kind": "free", "resource": "r1"}, w.kind
        assert ev(w, refused) is None
    assert ev(builders.adopt(held, "t2", 2, 1), ok) is None
    q = {"IndexName": "leased_resources", "ExpressionAttributeValues": {":k": {"S": "k"}}}
    items = {"Items": [{"resource": {"S": "r2"}}, {"resource": {"S": "r1"}}]}
    got = lease_event("Query", json.dumps(q).encode(), reply("200 OK", items))
    assert got == {"kind": "lookup", "key": "k", "resources": ["r1", "r2"]}


def test_a_paper_lease_with_a_stale_holder_is_no_rasd_lease_in_the_table() -> None:
    """The paper's agent claimed r2 for k1 after its liberator freed an old rasd lease of k0
    on it: r2 keeps that lease's holder (stale: hver behind version), which k0's lapsed
    mapping still names. r2 is the paper's lease, not a second rasd lease of k1 beside r1."""
    rasd = item("r1", "k1", 100.0)
    rasd.update(version={"N": "3"}, hver={"N": "3"})
    theirs = item("r2", "k1", 100.0, holder="t-old")
    theirs.update(version={"N": "7"}, hver={"N": "5"})
    maps = [mapping("k1", "r1", 90.0), mapping("k0", "r2", 5.0, token="t-old")]
    t = chaos_audit.table_checks([rasd, theirs, *maps], "demo", now=10.0)
    assert t["keys_with_two_unexpired_in_region"] == 0 and t["orphans"] == 1
    # the same item with its holder current would be a second lease of k1 in the region
    theirs["hver"] = {"N": "7"}
    t = chaos_audit.table_checks([rasd, theirs, *maps], "demo", now=10.0)
    assert t["keys_with_two_unexpired_in_region"] == 1


def test_extensions_and_index_reads_order_the_leases_of_a_split() -> None:
    """With the proxies' extension and lookup events: an extension that took effect before
    the lease's end does not make it again (it was never over); one sent after its end
    does; and when two claims' write times overlap, a read of the leased index that began
    after one took effect and did not show the other orders them."""
    h = [
        get(0, "k1", "r1", 0, 1, 10),
        paper("k1", "r2", 11, 12.5, 50),
        get(0, "k1", "r1", 13, 14, 60),
    ]
    base = [made("k1", "r1", 0.2, 0.3, "rasd"), made("k1", "r2", 12, 12.2, "paper")]
    for e in base:
        e.update(kind="claim", end=10.0 if e["resource"] == "r1" else 50.0)

    def ext(sent: float, got: float) -> dict[str, Any]:
        return {**made("k1", "r1", sent, got, "rasd"), "kind": "extend", "end": 60.0}

    early = chaos_audit.audit(h, quarantine_window=0, creations=[*base, ext(9.0, 9.1)])
    assert (early["in_region_splits"], early["paper_made_splits"]) == (0, 1)
    late = chaos_audit.audit(h, quarantine_window=0, creations=[*base, ext(13.1, 13.2)])
    assert (late["in_region_splits"], late["paper_made_splits"]) == (1, 0)
    # two claims whose writes overlap, a lookup between them
    h2 = [get(0, "k2", "r3", 0, 2, 100), paper("k2", "r4", 0.5, 2.5, 50)]
    claims = [made("k2", "r3", 1.0, 1.5, "rasd"), made("k2", "r4", 1.2, 1.8, "paper")]
    unknown = chaos_audit.audit(h2, quarantine_window=0, creations=claims)
    assert unknown["in_region_splits"] == 1
    look = {"kind": "lookup", "key": "k2", "resources": ["r3"], "sent": 1.55, "got": 1.6}
    ordered = chaos_audit.audit(h2, quarantine_window=0, creations=[*claims, look])
    assert (ordered["in_region_splits"], ordered["paper_made_splits"]) == (0, 1)
    # the same read showing both proves nothing
    both = {**look, "resources": ["r3", "r4"]}
    assert (
        chaos_audit.audit(h2, quarantine_window=0, creations=[*claims, both])["in_region_splits"]
        == 1
    )

"""Pure lease rules: time format, expiry checks, refresh-ahead, duplicate choice, write shapes."""

from __future__ import annotations

from collections import Counter

import pytest

from rasd import lease as L

NOW = 1_800_000_000 * L.US


def mk_lease(expires_us: int, version: int = 3, region: str = "us-east-1") -> L.Lease:
    return L.Lease("c", "p", "k", "r1", region, expires_us, version)


def test_time_roundtrip_and_fixed_width() -> None:
    """Times are fixed-width strings whose order is time order, and round-trip exactly."""
    samples = [0, 1, 999_999, NOW, NOW + 1, 253_402_300_799 * L.US]
    for us in samples:
        s = L.fmt_time(us)
        assert len(s) == 27 and s.endswith("Z")
        assert L.parse_time(s) == us
    strs = [L.fmt_time(us) for us in samples]
    assert strs == sorted(strs)


def test_parse_time_rejects_other_formats() -> None:
    """A time that is not the fixed-width UTC form is refused, not misread."""
    with pytest.raises(ValueError):
        L.parse_time("2026-01-01T00:00:00Z")


def test_check_expiry() -> None:
    """A lease end in the past, or beyond the pool's maximum, is refused with a reason."""
    max_us = 3600 * L.US
    assert L.check_expiry(NOW - 1, NOW, max_us) is not None
    assert L.check_expiry(NOW, NOW, max_us) is not None
    assert L.check_expiry(NOW + max_us + 1, NOW, max_us) is not None
    assert L.check_expiry(NOW + max_us, NOW, max_us) is None


def test_should_extend_only_below_fraction_and_never_shortens() -> None:
    """Sliding now+1h: no write while more than half is left; never a shorter lease."""
    hour = 3600 * L.US
    fresh = mk_lease(NOW + hour)
    assert not L.should_extend(fresh, NOW + hour + 10 * L.US, NOW, 0.5)
    half_gone = mk_lease(NOW + hour // 2 - 1)
    assert L.should_extend(half_gone, NOW + hour, NOW, 0.5)
    assert not L.should_extend(half_gone, NOW + hour // 4, NOW, 0.5)  # shorter: never
    assert not L.should_extend(half_gone, half_gone.expires_us, NOW, 0.5)


def test_pick_is_deterministic_earliest_claim() -> None:
    """Among duplicates every daemon picks the same one: earliest claim, then region/resource."""

    def item(res: str, region: str, acq: int) -> L.ResourceItem:
        return L.ResourceItem("c", res, "p", region, "x", 1, "k", NOW, None, acq)

    a, b, c = item("r2", "eu-west-1", 5), item("r1", "us-east-1", 5), item("r0", "us-east-1", 9)
    assert L.pick([a, b, c]) is a
    assert L.pick([c, b, a]) is a
    assert L.pick([]) is None


def test_partitions_spread_evenly() -> None:
    """Resources spread over the 10 sub-partitions evenly (within 10%) for generated names."""
    counts = Counter(L.partition_of(f"res-{i}") for i in range(10_000))
    assert set(counts) == set(range(10))
    assert max(counts.values()) <= 1100 and min(counts.values()) >= 900


def test_claim_is_conditional_on_version_free_and_region() -> None:
    """The claim asserts the version read, that the item is free, and our region; bumps version."""
    item = L.ResourceItem("c", "r", "p", "us-east-1", "c.p.us-east-1.3", 7, lease_available="x")
    upd = L.claim(item, "k", NOW + L.US, NOW, "us-east-1")
    cond = upd["ConditionExpression"]
    assert "version = :v" in cond and "attribute_exists(lease_available)" in cond
    assert "#r = :region" in cond
    assert upd["ExpressionAttributeValues"][":v"] == {"N": "7"}
    assert upd["ExpressionAttributeValues"][":nv"] == {"N": "8"}
    assert "REMOVE lease_available" in upd["UpdateExpression"]
    assert upd["ExpressionAttributeNames"]["#k"] == "key"


def test_writes_use_attribute_names_for_reserved_words() -> None:
    """key/region/partition/resource never appear bare in an expression (reserved words)."""
    lease = mk_lease(NOW + L.US)
    item = L.ResourceItem("c", "r", "p", "us-east-1", "c.p.us-east-1.3", 7, "k", NOW, None, NOW)
    free = L.ResourceItem("c", "r", "p", "us-east-1", "c.p.us-east-1.3", 7, lease_available="x")
    for upd in (
        L.extend(lease, NOW + 2 * L.US, "us-east-1"),
        L.release(lease, NOW, "us-east-1"),
        L.relet(lease, NOW + 2 * L.US, NOW, "us-east-1"),
        L.liberate(item, NOW),
        L.move(free, "eu-west-1"),
    ):
        text = upd["UpdateExpression"] + " " + upd["ConditionExpression"]
        for word in text.replace(",", " ").replace("(", " ").replace(")", " ").split():
            assert word not in ("key", "region", "partition", "resource"), (word, text)


def test_extend_never_shortens_by_condition() -> None:
    """The extension write itself refuses to move lease_expires earlier."""
    upd = L.extend(mk_lease(NOW + 10 * L.US), NOW + 20 * L.US, "us-east-1")
    assert "lease_expires < :exp" in upd["ConditionExpression"]


def test_move_only_free_items() -> None:
    """The balancer's move requires a free item of the source region."""
    free = L.ResourceItem("c", "r", "p", "us-east-1", "c.p.us-east-1.3", 7, lease_available="x")
    upd = L.move(free, "eu-west-1")
    assert "attribute_not_exists(#k)" in upd["ConditionExpression"]
    part = upd["ExpressionAttributeValues"][":part"]["S"]
    assert part.startswith("c.p.eu-west-1.")


def test_names() -> None:
    """client and pool names cannot contain the partition separator or the meta marker."""
    assert L.valid_name("demo_1-x")
    for bad in ("", "a.b", "#meta", "a b", "x" * 65, 3):
        assert not L.valid_name(bad)


def test_claim_records_claimant_and_release_clears_it() -> None:
    """A claim records its daemon (claimed_by); releasing and liberating remove it."""
    free = L.ResourceItem("c", "r", "p", "us-east-1", "c.p.us-east-1.3", 7, lease_available="x")
    upd = L.claim(free, "k", NOW + L.US, NOW, "us-east-1", owner="host:1:ab")
    assert "claimed_by = :owner" in upd["UpdateExpression"]
    assert upd["ExpressionAttributeValues"][":owner"] == {"S": "host:1:ab"}
    lease = mk_lease(NOW + L.US)
    assert "claimed_by" in L.release(lease, NOW, "us-east-1")["UpdateExpression"]


def test_claim_verdict_only_the_lock_owner_holds_a_lease() -> None:
    """A fresh claim is a lease only if its claimant holds the key's lock; a claim whose
    daemon lost the lock to another is not; with no lock (yet) it is undecided; an old claim,
    or one with no claimant recorded, is trusted."""
    fresh = 8 * L.US

    def item(by: str | None, acquired: int = NOW) -> L.ResourceItem:
        return L.ResourceItem(
            "c", "r", "p", "us-east-1", "x", 1, "k", NOW + L.US, None, acquired, by
        )

    def lock(owner: str, until: int) -> dict[str, dict[str, str]]:
        return {"lock_owner": {"S": owner}, "lock_expires": {"S": L.fmt_time(until)}}

    assert L.claim_verdict(item("a"), lock("a", NOW + L.US), NOW, fresh) is True
    assert L.claim_verdict(item("a"), lock("b", NOW + L.US), NOW, fresh) is False
    assert L.claim_verdict(item("a"), None, NOW, fresh) is None  # a's lock not landed yet
    assert L.claim_verdict(item("a"), lock("b", NOW - 1), NOW, fresh) is None  # stale lock
    assert L.claim_verdict(item(None), lock("b", NOW + L.US), NOW, fresh) is True
    old = item("a", acquired=NOW - fresh - 1)
    assert L.claim_verdict(old, lock("b", NOW + L.US), NOW, fresh) is True

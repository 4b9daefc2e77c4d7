"""Boundaries of the acquisition's pure core that only the protocol checker's searches used to
pin down (found by mutation testing, docs/checker.md "Mutation testing"): the claim, the
mapping's acquisition and confirmation and a claim's free written out in full, the
read-backs of ambiguous writes, ``Cond``'s comparisons and ``apply``'s increments, and the
decisions at exactly the margin, the refresh-ahead fraction and with several foreign leases.
Time is passed in."""

from __future__ import annotations

import pytest

from rasd.core import builders, decide, map_builders
from rasd.core import lease as lease_items
from rasd.core.writes import Cond, Write, apply
from tests.helpers.decisions import NOW, RULES, S, m, r

T = lease_items.fmt_time


# ------------------------------------------------------------------------------- writes.Cond
@pytest.mark.parametrize(
    ("op", "below", "equal", "above"),
    [
        ("=", False, True, False),
        ("<>", True, False, True),
        ("<", True, False, False),
        ("<=", True, True, False),
        (">", False, False, True),
        (">=", False, True, True),
    ],
)
def test_each_comparison_at_below_equal_and_above(
    op: str, below: bool, equal: bool, above: bool
) -> None:
    """The item's value compared with the condition's (``item op value``), for numbers and for
    the fixed-width time strings whose order is time order."""
    for lo, mid, hi in ((4, 5, 6), (T(NOW - 1), T(NOW), T(NOW + 1))):
        c = Cond("v", op, mid)  # type: ignore[arg-type]
        assert [c.holds({"v": lo}), c.holds({"v": mid}), c.holds({"v": hi})] == [
            below,
            equal,
            above,
        ]


@pytest.mark.parametrize("op", ["=", "<>", "<", "<=", ">", ">="])
def test_a_comparison_with_a_missing_or_other_typed_value_is_false(op: str) -> None:
    """As in DynamoDB: neither a missing attribute nor a string compared with a number (or the
    reverse) satisfies any comparison, ``<>`` included."""
    assert not Cond("v", op, 5).holds({})  # type: ignore[arg-type]
    assert not Cond("v", op, 5).holds(None)  # type: ignore[arg-type]
    assert not Cond("v", op, 5).holds({"v": "5"})  # type: ignore[arg-type]
    assert not Cond("v", op, "5").holds({"v": 5})  # type: ignore[arg-type]


def test_an_unknown_operator_is_named_in_the_error() -> None:
    with pytest.raises(AssertionError, match="~="):
        Cond("v", "~=", 1).holds({"v": 1})  # type: ignore[arg-type]


def test_an_increment_creates_the_attribute_at_one() -> None:
    w = Write(key=("c", "r"), conds=(), incr=("version", "hver"))
    assert apply({"client_id": "c", "resource": "r", "version": 4}, w) == {
        "client_id": "c",
        "resource": "r",
        "version": 5,
        "hver": 1,
    }
    assert apply(None, w) == {"client_id": "c", "resource": "r", "version": 1, "hver": 1}


# ------------------------------------------------------------------------ resource item writes
def _free(version: int = 7) -> lease_items.ResourceItem:
    return lease_items.ResourceItem(
        "c", "ra", "p", "r1", "part", version, lease_available=T(NOW - 10 * S)
    )


def _plain(it: lease_items.ResourceItem) -> dict[str, str | int]:
    out: dict[str, str | int] = {
        "client_id": it.client_id,
        "resource": it.resource,
        "pool_id": it.pool_id,
        "region": it.region,
        "partition": it.partition,
        "version": it.version,
    }
    if it.lease_available is not None:
        out["lease_available"] = it.lease_available
    return out


def test_claim_in_full() -> None:
    item = _free()
    w = builders.claim(item, "k1", NOW + 60 * S, NOW, "t1", 3)
    assert w == Write(
        key=("c", "ra"),
        conds=(
            Cond("version", "=", 7),
            Cond("lease_available", "exists"),
            Cond("lease_available", "<=", T(NOW)),
            Cond("region", "=", "r1"),
        ),
        set=(
            ("key", "k1"),
            ("lease_expires", T(NOW + 60 * S)),
            ("lease_acquired", T(NOW)),
            ("holder", "t1"),
            ("mver", 3),
            ("hver", 8),
            ("version", 8),
        ),
        remove=("lease_available",),
    )
    assert w.kind == "claim"
    held = apply(_plain(item), w)
    assert held is not None and held["lease_acquired"] == T(NOW)
    assert "lease_available" not in held


def test_free_claim_in_full_with_and_without_the_end_read() -> None:
    ident = ("c", "ra")
    held: dict[str, str | int] = {
        "client_id": "c",
        "resource": "ra",
        "region": "r1",
        "version": 8,
        "key": "k1",
        "holder": "t1",
        "lease_expires": T(NOW + 60 * S),
        "lease_acquired": T(NOW - S),
        "mver": 3,
        "hver": 8,
    }
    w = builders.free_claim(ident, "k1", "t1", NOW, NOW + 57 * S, NOW + 60 * S)
    assert w == Write(
        key=ident,
        conds=(
            Cond("holder", "=", "t1"),
            Cond("key", "=", "k1"),
            builders.HOLDER_CURRENT,
            Cond("lease_expires", "=", T(NOW + 60 * S)),
        ),
        set=(("quarantine_until", T(NOW + 57 * S)),),
        remove=("key", "lease_expires", "lease_acquired", "holder", "mver", "hver"),
        incr=("version",),
    )
    assert w.kind == "free_claim"
    assert apply(held, w) == {
        "client_id": "c",
        "resource": "ra",
        "region": "r1",
        "version": 9,
        "quarantine_until": T(NOW + 57 * S),
    }
    # extended since the end was read: left alone
    assert apply({**held, "lease_expires": T(NOW + 61 * S)}, w) is None
    # without the end: any end; a claim no mapping named is claimable at once
    lost = builders.free_claim(ident, "k1", "t1", NOW, NOW)
    assert lost.conds == (
        Cond("holder", "=", "t1"),
        Cond("key", "=", "k1"),
        builders.HOLDER_CURRENT,
    )
    assert lost.set == (("lease_available", T(NOW)),)
    after = apply({**held, "lease_expires": T(NOW + 61 * S)}, lost)
    assert after is not None and after["lease_available"] == T(NOW)
    # the paper's liberator freed our lease and its agent leased the item again to the same
    # key (version moved twice, hver not, our token left behind): the paper's, not freed
    # (the swarm, seed 11012318: rasadmin release-resource's free landing after both)
    assert apply({**held, "version": 10}, lost) is None
    # an item written before hver existed: its holder is taken as current
    legacy = {k: v for k, v in held.items() if k != "hver"}
    assert apply(legacy, lost) is not None


def test_ttl_is_whole_seconds_a_day_after() -> None:
    assert lease_items.ttl_after(NOW + S - 1) == NOW // S + 24 * 3600
    assert type(lease_items.ttl_after(NOW + 1)) is int


# -------------------------------------------------------------------------- mapping item writes
IDENT = (lease_items.map_pk("c", "p", "k"), "us-east-1")


def test_map_acquire_in_full() -> None:
    w = map_builders.map_acquire(IDENT, 3, "t1", "ra", 7, NOW + 60 * S + 5, NOW, "host-a")
    assert w == Write(
        key=IDENT,
        conds=(Cond("ver", "=", 3),),
        set=(
            ("state", lease_items.PENDING),
            ("token", "t1"),
            ("res", "ra"),
            ("rver", 7),
            ("exp", T(NOW + 60 * S + 5)),
            ("since", T(NOW)),
            ("owner", "host-a"),
            ("ttl", (NOW + 60 * S) // S + 24 * 3600),
            ("ver", 4),
        ),
    )
    assert w.kind == "map_acquire"
    assert map_builders.map_acquire(IDENT, 0, "t1", "ra", 7, NOW, NOW, "o").conds == (
        Cond("ver", "not_exists"),
    )


def test_map_confirm_in_full() -> None:
    pending = m(state=lease_items.PENDING, ver=4, token="t1")
    w = map_builders.map_confirm(pending)
    assert w == Write(
        key=pending.ident,
        conds=(
            Cond("ver", "=", 4),
            Cond("token", "=", "t1"),
            Cond("state", "=", lease_items.PENDING),
        ),
        set=(("state", lease_items.LIVE), ("ver", 5)),
    )
    assert w.kind == "map_confirm"
    item: dict[str, str | int] = {
        "client_id": IDENT[0],
        "resource": IDENT[1],
        "state": lease_items.PENDING,
        "token": "t1",
        "ver": 4,
    }
    assert apply(item, w) == {**item, "state": lease_items.LIVE, "ver": 5}
    for other in (
        {"ver": 5},
        {"token": "t2"},
        {"state": lease_items.LIVE},
        {"state": lease_items.FREE},
    ):
        assert apply({**item, **other}, w) is None
    with pytest.raises(AssertionError):
        map_builders.map_confirm(m(state=lease_items.PENDING, token=None))  # type: ignore[arg-type]


def test_read_backs_want_both_attributes() -> None:
    """Each read-back says the write landed only when both attributes it names match."""
    cases = [
        (map_builders.names_claim("t1", "ra"), "token", "t1", "res", "ra"),
        (map_builders.holds("t1", "k1"), "holder", "t1", "key", "k1"),
        (map_builders.confirmed("t1"), "token", "t1", "state", lease_items.LIVE),
    ]
    for mine, a, va, b, vb in cases:
        assert mine({a: va, b: vb})
        assert not mine({a: va, b: vb + "x"})
        assert not mine({a: va + "x", b: vb})
        assert not mine({a: va + "x", b: vb + "x"})
        assert not mine({b: vb})
        assert not mine({a: va})
        assert not mine({})
    assert not map_builders.confirmed("t1")({"token": "t1", "state": lease_items.PENDING})


# ------------------------------------------------------------------------------ decisions
def test_served_only_while_more_than_the_margin_is_left() -> None:
    """At exactly end - margin the lease is no longer served: it is extended first."""
    at = m(exp=NOW + RULES.margin_us)
    assert not decide.servable(at, NOW, RULES)
    assert decide.on_read(at, [], NOW, RULES) == decide.Extend(at)
    assert decide.servable(m(exp=NOW + RULES.margin_us + 1), NOW, RULES)


def test_the_earliest_of_several_foreign_leases_is_served_as_it_is() -> None:
    early = m(region="eu-west-1", since=NOW - 30 * S, res="r3", rver=8)
    later = m(region="ap-south-1", since=NOW - 20 * S, res="r2")
    own = m(since=NOW - 10 * S)
    for foreign in ([early, later], [later, early]):
        # own lease live but acquired after another region's: the earlier one wins
        d = decide.on_read(own, foreign, NOW, RULES)
        assert d == decide.Serve(decide.lease_from_mapping(early), foreign=True)
        assert d.lease.resource == "r3" and d.lease.region == "eu-west-1"  # type: ignore[union-attr]
        # nothing of our own
        d = decide.on_read(None, foreign, NOW, RULES)
        assert d == decide.Serve(decide.lease_from_mapping(early), foreign=True)
        assert d.lease.resource == "r3"  # type: ignore[union-attr]
        # ours is still pending: the foreign lease is served, ours is not verified
        d = decide.on_read(m(state=lease_items.PENDING), foreign, NOW, RULES)
        assert d == decide.Serve(decide.lease_from_mapping(early), foreign=True)
        assert d.lease.resource == "r3"  # type: ignore[union-attr]
    # our own, acquired first, is served as ours
    assert decide.on_read(m(since=NOW - 40 * S), [early], NOW, RULES) == decide.Serve(
        decide.lease_from_mapping(m(since=NOW - 40 * S))
    )


def test_a_verified_pending_lease_is_served_and_released_with_its_claim() -> None:
    pending = m(state=lease_items.PENDING, since=NOW - 10 * S, rver=4)
    d = decide.on_resource(pending, r(), NOW, RULES)
    assert isinstance(d, decide.Serve) and d.confirm == pending and not d.foreign
    assert (d.lease.resource, d.lease.token, d.lease.version) == ("r1", "tok", 5)
    assert d.lease.acquired_us == NOW - 10 * S
    rel = decide.on_release_resource(pending, r(), NOW, RULES)
    assert rel == decide.ReleaseLease(decide.lease_from_mapping(pending))
    assert isinstance(rel, decide.ReleaseLease) and rel.lease.resource == "r1"


def test_a_mapping_without_its_resource_or_end_names_no_lease() -> None:
    with pytest.raises(AssertionError):
        decide.lease_from_mapping(m(res=None))  # type: ignore[arg-type]
    with pytest.raises(AssertionError):
        decide.lease_from_mapping(m(exp=None))  # type: ignore[arg-type]


def test_an_unknown_outcome_gives_up_saying_which() -> None:
    """The caller's Timeout carries this text when no write reported an error."""
    A, U = decide.Outcome.APPLIED, decide.Outcome.UNKNOWN
    assert decide.after_acquire(U, A, 3) == decide.GiveUp(
        "DynamoDB's answer was lost (mapping unknown, claim applied)"
    )


def test_refresh_ahead_at_its_boundaries() -> None:
    lease = lease_items.Lease("c", "p", "k", "r1", "us-east-1", NOW + 50 * S, 3, token="tok")
    # asks for exactly the end it has: never extended, even once that end has passed
    assert not decide.should_extend(lease, NOW + 50 * S, NOW + 60 * S, 0.5)
    assert not decide.should_extend(lease, NOW + 50 * S, NOW, 0.5)
    # time left exactly the fraction of the requested duration: not yet
    assert not decide.should_extend(lease, NOW + 100 * S, NOW, 0.5)
    assert decide.should_extend(lease, NOW + 100 * S + 2, NOW, 0.5)

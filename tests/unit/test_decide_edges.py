"""Edges of rasd.core.decide's release decisions and of rasd.core.map_builders' read-backs
that neither tests/unit/test_decide.py nor the protocol checker's CI run pins down (found by
mutation testing, docs/checker.md "Mutation testing"). Time is passed in."""

from __future__ import annotations

from rasd.core import decide as D
from rasd.core import lease as L
from rasd.core import map_builders as MB
from tests.helpers.decisions import NOW, RULES, S, m, r


def test_release_says_why_nothing_is_held() -> None:
    none = D.NotHeld("the key holds no lease in this region")
    assert D.on_release_read(None, NOW, RULES) == none
    assert D.on_release_read(m(state=L.FREE), NOW, RULES) == none
    ended = D.NotHeld("the key's lease has ended")
    assert D.on_release_read(m(exp=NOW - 2 * S), NOW, RULES) == ended


def test_release_of_a_lease_ends_at_its_end_plus_grace() -> None:
    """The liberator may free it from its end + grace on: from then the key holds nothing;
    a moment before, the release goes ahead."""
    grace = RULES.grace_us
    assert isinstance(D.on_release_read(m(exp=NOW - grace), NOW, RULES), D.NotHeld)
    at = D.on_release_read(m(exp=NOW - grace + 1), NOW, RULES)
    assert isinstance(at, D.ReleaseLease) and at.lease.expires_us == NOW - grace + 1
    assert isinstance(D.on_release_read(m(exp=NOW - 1), NOW, RULES), D.ReleaseLease)


def test_release_of_a_pending_claim_that_may_still_land_fences_it() -> None:
    """Past the pending hold, the resource still at the version the claim was conditioned
    on: the claim may land yet, so the resource is fenced (not the mapping dropped)."""
    pending = m(state=L.PENDING, since=NOW - 10 * S, rver=5)
    free = r(holder=None, key=None, version=5)
    assert D.on_release_resource(pending, free, NOW, RULES) == D.FenceResource(free)
    moved = r(holder=None, key=None, version=6)
    assert D.on_release_resource(pending, moved, NOW, RULES) == D.DropMapping(pending)


def test_read_backs_of_extensions_and_releases() -> None:
    want = L.fmt_time(NOW)
    later = L.fmt_time(NOW + 1)
    assert MB.extended_to("t", want)({"holder": "t", "lease_expires": want})
    assert MB.extended_to("t", want)({"holder": "t", "lease_expires": later})
    assert not MB.extended_to("t", later)({"holder": "t", "lease_expires": want})
    assert not MB.extended_to("t", want)({"holder": "t"})  # no end: not extended
    assert not MB.extended_to("t", want)({"holder": "u", "lease_expires": later})
    assert MB.map_extended_to("t", want)({"token": "t", "exp": want})
    assert not MB.map_extended_to("t", want)({"token": "t", "exp": 5})
    assert not MB.map_extended_to("t", want)({"token": "u", "exp": later})
    assert not MB.map_extended_to("t", later)({"token": "t", "exp": want})
    assert MB.not_held_by("t")({"holder": "u"})
    assert MB.not_held_by("t")({})
    assert not MB.not_held_by("t")({"holder": "t"})
    assert MB.no_token("t")({"token": "u"})
    assert MB.no_token("t")({})
    assert not MB.no_token("t")({"token": "t"})


def test_extension_check_says_why_it_forgets() -> None:
    """The reason is logged with the extension's end: an operator reads it."""
    live = m()
    lease = D.lease_from_mapping(live)
    why = "the mapping still names the lease (extended further elsewhere)"
    assert D.on_extend_check(live, lease) == D.Forget(why)
    assert D.on_extend_check(m(state=L.FREE), lease) == D.FreeOrphan()


def test_extension_outcomes_say_why_they_forget() -> None:
    A, R, U = D.Outcome.APPLIED, D.Outcome.REJECTED, D.Outcome.UNKNOWN
    assert D.after_extend(R, None) == D.Forget("resource extension rejected")
    assert D.after_extend(U, None) == D.Forget("resource extension unknown")
    assert D.after_extend(A, U) == D.Forget("mapping extension unknown")
    assert D.after_extend(A, A) == D.Extended()
    assert D.after_extend(A, R) == D.CheckMapping()


def test_a_pending_mapping_is_waited_for_until_its_hold_ends() -> None:
    """For ``pending_hold`` after it was written another daemon may still be acquiring;
    from then on its claim is checked (and fenced if it may still land)."""
    hold = RULES.pending_hold_us
    free = r(holder=None, key=None, version=5)
    young = m(state=L.PENDING, since=NOW - hold + 1, rver=5)
    assert D.on_resource(young, free, NOW, RULES) == D.Wait("another daemon is acquiring this key")
    old = m(state=L.PENDING, since=NOW - hold, rver=5)
    assert D.on_resource(old, free, NOW, RULES) == D.FenceResource(free)

"""Edges of rasd.core.decide's release decisions and of rasd.core.map_builders' read-backs
that neither tests/unit/test_decide.py nor the protocol checker's CI run pins down (found by
mutation testing, docs/checker.md "Mutation testing"). Time is passed in."""

from __future__ import annotations

from rasd.core import decide, map_builders
from rasd.core import lease as lease_items
from tests.helpers.decisions import NOW, RULES, S, m, r


def test_release_says_why_nothing_is_held() -> None:
    none = decide.NotHeld("the key holds no lease in this region")
    assert decide.on_release_read(None, NOW, RULES) == none
    assert decide.on_release_read(m(state=lease_items.FREE), NOW, RULES) == none
    ended = decide.NotHeld("the key's lease has ended")
    assert decide.on_release_read(m(exp=NOW - 2 * S), NOW, RULES) == ended


def test_release_of_a_lease_ends_at_its_end_plus_grace() -> None:
    """The liberator may free it from its end + grace on: from then the key holds nothing;
    a moment before, the release goes ahead."""
    grace = RULES.grace_us
    assert isinstance(decide.on_release_read(m(exp=NOW - grace), NOW, RULES), decide.NotHeld)
    at = decide.on_release_read(m(exp=NOW - grace + 1), NOW, RULES)
    assert isinstance(at, decide.ReleaseLease) and at.lease.expires_us == NOW - grace + 1
    assert isinstance(decide.on_release_read(m(exp=NOW - 1), NOW, RULES), decide.ReleaseLease)


def test_release_of_a_pending_claim_that_may_still_land_fences_it() -> None:
    """Past the pending hold, the resource still at the version the claim was conditioned
    on: the claim may land yet, so the resource is fenced (not the mapping dropped)."""
    pending = m(state=lease_items.PENDING, since=NOW - 10 * S, rver=5)
    free = r(holder=None, key=None, version=5)
    assert decide.on_release_resource(pending, free, NOW, RULES) == decide.FenceResource(free)
    moved = r(holder=None, key=None, version=6)
    assert decide.on_release_resource(pending, moved, NOW, RULES) == decide.DropMapping(pending)


def test_read_backs_of_extensions_and_releases() -> None:
    want = lease_items.fmt_time(NOW)
    later = lease_items.fmt_time(NOW + 1)
    assert map_builders.extended_to("t", want)({"holder": "t", "lease_expires": want})
    assert map_builders.extended_to("t", want)({"holder": "t", "lease_expires": later})
    assert not map_builders.extended_to("t", later)({"holder": "t", "lease_expires": want})
    assert not map_builders.extended_to("t", want)({"holder": "t"})  # no end: not extended
    assert not map_builders.extended_to("t", want)({"holder": "u", "lease_expires": later})
    assert map_builders.map_extended_to("t", want)({"token": "t", "exp": want})
    assert not map_builders.map_extended_to("t", want)({"token": "t", "exp": 5})
    assert not map_builders.map_extended_to("t", want)({"token": "u", "exp": later})
    assert not map_builders.map_extended_to("t", later)({"token": "t", "exp": want})
    assert map_builders.not_held_by("t")({"holder": "u"})
    assert map_builders.not_held_by("t")({})
    assert not map_builders.not_held_by("t")({"holder": "t"})
    assert map_builders.no_token("t")({"token": "u"})
    assert map_builders.no_token("t")({})
    assert not map_builders.no_token("t")({"token": "t"})


def test_extension_check_says_why_it_forgets() -> None:
    """The reason is logged with the extension's end: an operator reads it."""
    live = m()
    lease = decide.lease_from_mapping(live)
    why = "the mapping still names the lease (extended further elsewhere)"
    assert decide.on_extend_check(live, lease) == decide.Forget(why)
    assert decide.on_extend_check(m(state=lease_items.FREE), lease) == decide.FreeOrphan()


def test_extension_outcomes_say_why_they_forget() -> None:
    A, R, U = decide.Outcome.APPLIED, decide.Outcome.REJECTED, decide.Outcome.UNKNOWN
    assert decide.after_extend(R, None) == decide.Forget("resource extension rejected")
    assert decide.after_extend(U, None) == decide.Forget("resource extension unknown")
    assert decide.after_extend(A, U) == decide.Forget("mapping extension unknown")
    assert decide.after_extend(A, A) == decide.Extended()
    assert decide.after_extend(A, R) == decide.CheckMapping()


def test_a_pending_mapping_is_waited_for_until_its_hold_ends() -> None:
    """For ``pending_hold`` after it was written another daemon may still be acquiring;
    from then on its claim is checked (and fenced if it may still land)."""
    hold = RULES.pending_hold_us
    free = r(holder=None, key=None, version=5)
    young = m(state=lease_items.PENDING, since=NOW - hold + 1, rver=5)
    assert decide.on_resource(young, free, NOW, RULES) == decide.Wait(
        "another daemon is acquiring this key"
    )
    old = m(state=lease_items.PENDING, since=NOW - hold, rver=5)
    assert decide.on_resource(old, free, NOW, RULES) == decide.FenceResource(free)

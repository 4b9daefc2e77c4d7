"""A strict pool's programs (rasd.steps.strict): agreeing a claim in the home region, giving
back one that lost, extending an agreement, and what each does when the home region does not
answer. Driven by the scripted tables of test_steps_daemon: our region's, and the home
region's for every call made ``At`` it. Time passed in."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rasd.core import agree as agree_rules
from rasd.core.decide import Extended, Outcome
from rasd.core.errors import Unavailable
from rasd.core.lease import FREE, Lease, Mapping, fmt_time, parse_time
from rasd.steps import At, GetItem, Send, Sleep, WriteResult
from rasd.steps import strict as strict_steps
from rasd.steps.daemon import BACKGROUND_DEADLINE, DaemonContext, Deadline
from rasd.steps.renew import confirm, extend
from tests.helpers.daemontable import EAST, HOUR, NOW, POOL, RULES, WEST, Table

END = NOW + HOUR
HOME = WEST
DOWN = Unavailable("connect timeout")


class Regions(Table):
    """Our region's table; every ``At(HOME, call)`` is performed on :attr:`home` (``down``:
    the error each such call raises instead)."""

    def __init__(self) -> None:
        super().__init__()
        self.home = Table()
        self.at: list[tuple[str, str]] = []
        self.down: Unavailable | None = None
        #: the kinds of every write sent, both tables', in order
        self.sent: list[str] = []

    def perform(self, eff: Any) -> Any:
        call = eff.call if isinstance(eff, At) else eff
        if isinstance(call, Send):
            self.sent.append(call.write.kind)
        if isinstance(eff, At):
            self.at.append((eff.region, type(eff.call).__name__))
            assert eff.region == HOME
            if self.down is not None:
                raise self.down
            return self.home.perform(eff.call)
        return super().perform(eff)


def daemon(home_down: str = "fail") -> DaemonContext:
    return DaemonContext(EAST, "host-1", RULES, homes=(("c", "p", HOME),), home_down=home_down)


def claim_of(t: Regions, key: str = "k", token: str = "t1") -> Mapping:
    return t.pending("r1", key, END, token)


def other_lease(t: Regions, key: str = "k", end: int = END) -> agree_rules.Agreement:
    """A in the home region names another region's lease of ``key`` (token ``t9``)."""
    theirs = Mapping("c", "p", key, "sa-east-1", 2, "pending", "t9", "r9", 6, end, NOW, "d9")
    item = t.home.land(
        agree_rules.agree_write(agree_rules.agree_key("c", "p", key), 0, theirs)
    ).item
    got = agree_rules.agreement_from(item)
    assert got is not None
    return got


def test_a_new_keys_claim_is_agreed_with_one_write_in_the_home_region() -> None:
    t = Regions()
    m = claim_of(t)
    assert t.run(strict_steps.agree(daemon(), POOL, HOME, m, (m,))) is None
    assert t.at == [(HOME, "Send")]
    a = agree_rules.agreement_from(t.home.items[agree_rules.agree_key("c", "p", "k")])
    assert a is not None and (a.token, a.region, a.resource, a.mver) == ("t1", EAST, "r1", m.ver)
    assert t.counts == {"strict.agreed": 1}
    assert not t.spawned
    assert not t.home.bare  # the write carries its read-back (an unknown outcome is resolved)


def test_a_key_agreed_elsewhere_answers_that_lease_and_withdraws_ours() -> None:
    t = Regions()
    m = claim_of(t)
    other_lease(t)
    got = t.run(strict_steps.agree(daemon(), POOL, HOME, m, (m,)))
    assert isinstance(got, Lease) and (got.token, got.resource, got.key) == ("t9", "r9", "k")
    assert t.at == [(HOME, "Send"), (HOME, "GetItem")]
    assert t.counts == {"strict.deferred": 1}
    (spawn,) = t.spawned
    assert spawn.fn is strict_steps.withdraw and spawn.args[1] == m


def test_a_reader_finds_our_claim_agreed_already() -> None:
    t = Regions()
    m = claim_of(t)
    t.home.land(agree_rules.agree_write(agree_rules.agree_key("c", "p", "k"), 0, m))
    assert t.run(strict_steps.agree(daemon(), POOL, HOME, m, (m,), expect=None)) is None
    assert t.at == [(HOME, "GetItem")]
    assert t.counts == {"strict.agreed": 1}


def test_an_agreement_whose_lease_is_over_is_taken_over_at_its_version() -> None:
    t = Regions()
    m = claim_of(t)
    other_lease(t, end=NOW - RULES.grace_us - 1)
    assert t.run(strict_steps.agree(daemon(), POOL, HOME, m, (m,))) is None
    assert t.at == [(HOME, "Send"), (HOME, "GetItem"), (HOME, "Send")]
    item = t.home.items[agree_rules.agree_key("c", "p", "k")]
    assert (item["token"], item["ver"]) == ("t1", 2)


def test_an_agreed_lease_ending_is_waited_for() -> None:
    """Too close to its end to answer: wait (doubling), read again, and take it over once it
    is over for every clock."""
    t = Regions()
    m = claim_of(t)
    other_lease(t, end=NOW + RULES.margin_us - 1)
    waits: list[float] = []

    def later(s: Sleep) -> None:
        waits.append(s.seconds)
        if len(waits) == 2:
            t.now = NOW + RULES.margin_us + RULES.grace_us

    t.on_sleep = later
    assert t.run(strict_steps.agree(daemon(), POOL, HOME, m, (m,), wait=0.005)) is None
    assert waits == [0.005, 0.01]
    assert t.counts == {"acq.waits": 2, "strict.agreed": 1}
    assert t.home.items[agree_rules.agree_key("c", "p", "k")]["token"] == "t1"


@pytest.mark.parametrize("fails", ["Send", "GetItem"])
def test_home_region_down_fails_the_new_key(fails: str) -> None:
    t = Regions()
    m = claim_of(t)
    if fails == "Send":
        t.home.script["agree"] = [WriteResult(Outcome.UNKNOWN, error=DOWN)]
    else:
        other_lease(t)
        t.home.fail[GetItem] = DOWN
    with pytest.raises(Unavailable) as err:
        t.run(strict_steps.agree(daemon(), POOL, HOME, m, (m,)))
    assert str(err.value) == (
        f"home region {HOME} of strict pool 'p' unreachable, the new lease is not agreed: {DOWN}"
    )
    assert t.counts == {"strict.home_unreachable": 1}
    assert not t.logs and not t.spawned


def taken_over_meanwhile(t: Regions, end: int) -> None:
    """Before the home region's third call (our write at the version we read), another
    region's lease of ``k`` (token ``t8``, until ``end``) takes A over."""
    ident = agree_rules.agree_key("c", "p", "k")
    theirs = Mapping("c", "p", "k", "sa-east-1", 3, "pending", "t8", "r8", 7, end, NOW, "d8")

    def take() -> None:
        assert t.home.land(agree_rules.agree_write(ident, 1, theirs)).outcome is Outcome.APPLIED

    t.home.before[3] = take


def test_a_proposal_refused_again_reads_and_answers_the_lease_that_won() -> None:
    """A named a lease that is over; our write at its version loses to another region's:
    read again and answer that lease, withdrawing ours, with what the first try had."""
    t = Regions()
    m = claim_of(t)
    other_lease(t, end=NOW - RULES.grace_us - 1)
    taken_over_meanwhile(t, END)
    d = daemon()
    got = t.run(strict_steps.agree(d, POOL, HOME, m, (m,)))
    assert isinstance(got, Lease) and (got.token, got.resource) == ("t8", "r8")
    assert t.at == [(HOME, "Send"), (HOME, "GetItem"), (HOME, "Send"), (HOME, "GetItem")]
    assert t.counts == {"strict.deferred": 1}
    (spawn,) = t.spawned
    assert spawn.fn is strict_steps.withdraw and spawn.args == (d, m)


@pytest.mark.parametrize("wait", [0.005, 0.04])
def test_a_proposal_refused_again_waits_for_a_lease_ending(wait: float) -> None:
    """The lease that won the second try is too close to its end: wait (the wait the request
    had come to: a proposal does not start the doubling over), then take A over once it is
    over for every clock."""
    t = Regions()
    m = claim_of(t)
    other_lease(t, end=NOW - RULES.grace_us - 1)
    taken_over_meanwhile(t, NOW + RULES.margin_us - 1)
    waits: list[float] = []

    def later(s: Sleep) -> None:
        waits.append(s.seconds)
        t.now = NOW + RULES.margin_us + RULES.grace_us

    t.on_sleep = later
    assert t.run(strict_steps.agree(daemon(), POOL, HOME, m, (m,), wait=wait)) is None
    assert waits == [wait]
    assert t.home.items[agree_rules.agree_key("c", "p", "k")]["token"] == "t1"
    assert t.counts == {"acq.waits": 1, "strict.agreed": 1}


@pytest.mark.parametrize("when", ["proposing", "after a wait"])
def test_home_region_down_later_in_the_request_fails_it(when: str) -> None:
    """The home region stops answering after the first read: the request fails naming the
    pool, whichever call found it down."""
    t = Regions()
    m = claim_of(t)
    if when == "proposing":
        other_lease(t, end=NOW - RULES.grace_us - 1)
        t.home.script["agree"] = [
            WriteResult(Outcome.REJECTED),
            WriteResult(Outcome.UNKNOWN, error=DOWN),
        ]
    else:
        other_lease(t, end=NOW + RULES.margin_us - 1)

        def down(_: Sleep) -> None:
            t.home.fail[GetItem] = DOWN

        t.on_sleep = down
    with pytest.raises(Unavailable) as err:
        t.run(strict_steps.agree(daemon(), POOL, HOME, m, (m,)))
    assert str(err.value) == (
        f"home region {HOME} of strict pool 'p' unreachable, the new lease is not agreed: {DOWN}"
    )


def test_home_region_down_at_the_first_write_falls_back_when_local() -> None:
    t = Regions()
    m = claim_of(t)
    t.home.script["agree"] = [WriteResult(Outcome.UNKNOWN, error=DOWN)]
    assert t.run(strict_steps.agree(daemon("local"), POOL, HOME, m, (m,))) is None
    assert t.counts == {"strict.home_unreachable": 1, "strict.fallback": 1}
    fields = (("pool", "p"), ("key", "k"), ("token", "t1"), ("error", str(DOWN)))
    assert t.logs == [("strict_fallback", fields, "warning")]


def test_home_region_down_falls_back_to_our_claim_when_local() -> None:
    t = Regions()
    m = claim_of(t)
    t.down = DOWN
    assert t.run(strict_steps.agree(daemon("local"), POOL, HOME, m, (m,), expect=None)) is None
    assert t.counts == {"strict.home_unreachable": 1, "strict.fallback": 1}
    fields = (("pool", "p"), ("key", "k"), ("token", "t1"), ("error", str(DOWN)))
    assert t.logs == [("strict_fallback", fields, "warning")]


def test_withdraw_frees_the_pending_mapping_then_the_claim() -> None:
    t = Regions()
    m = claim_of(t)
    t.run(strict_steps.withdraw(daemon(), m))
    assert t.of(Deadline)[0] == Deadline(BACKGROUND_DEADLINE)
    assert t.mapping("k").state == FREE
    assert t.res("r1").key is None
    # its mapping named it, so a reader may have answered it: held to the lease's end plus
    # the skew, not the quarantine alone, in the fast rules too
    until = t.res("r1").quarantine_until
    assert until is not None and parse_time(until) >= END + RULES.grace_us
    assert t.counts["strict.withdrawn"] == 1 and "strict.withdraw_left" not in t.counts


def test_withdraw_leaves_a_claim_whose_mapping_moved_on() -> None:
    t = Regions()
    m = claim_of(t)
    moved = dataclasses.replace(m, ver=m.ver - 1)  # our copy is older than the mapping
    t.run(strict_steps.withdraw(daemon(), moved))
    assert t.counts == {"strict.withdraw_left": 1}
    assert t.res("r1").key == "k"  # the claim runs out; nothing else is written
    assert t.writes() == ["map_drop_dead"]


def lease_of(t: Regions) -> Lease:
    m = claim_of(t)
    t.home.land(agree_rules.agree_write(agree_rules.agree_key("c", "p", "k"), 0, m))
    return Lease("c", "p", "k", "r1", EAST, END, m.rver + 1, NOW, "t1")


def test_an_extension_moves_the_agreements_end_first() -> None:
    t = Regions()
    lease = lease_of(t)
    assert t.run(strict_steps.extend_agreement(daemon(), HOME, lease, END + HOUR)) is True
    assert t.home.items[agree_rules.agree_key("c", "p", "k")]["exp"] == fmt_time(END + HOUR)
    assert t.at == [(HOME, "Send")]
    assert not t.home.bare


def test_an_extension_refused_reads_the_agreement() -> None:
    t = Regions()
    lease = lease_of(t)
    ident = agree_rules.agree_key("c", "p", "k")
    # already that far (another extension came first): go on
    assert t.run(strict_steps.extend_agreement(daemon(), HOME, lease, END)) is True
    assert t.at == [(HOME, "Send"), (HOME, "GetItem")]
    # A names another lease now: stop
    t.home.set(ident, token="t9")
    assert t.run(strict_steps.extend_agreement(daemon(), HOME, lease, END + HOUR)) is False
    del t.home.items[ident]
    assert t.run(strict_steps.extend_agreement(daemon(), HOME, lease, END + HOUR)) is False


def live_lease_of(t: Regions) -> Lease:
    """A live lease of ``k`` on r1 in our region (claimed, mapped, confirmed) that A names."""
    m = claim_of(t)
    t.run(confirm(m))
    t.home.land(agree_rules.agree_write(agree_rules.agree_key("c", "p", "k"), 0, m))
    return Lease("c", "p", "k", "r1", EAST, END, t.res("r1").version, NOW, "t1")


def test_an_extension_writes_the_resource_then_the_agreement_then_the_mapping() -> None:
    """Another region's reader answers A's end: A never passes the resource's end, as the
    mapping's never passes A's (a crash between two writes leaves each end within the one
    before it)."""
    t = Regions()
    lease = live_lease_of(t)
    step, _ = t.run(extend(daemon(), lease, END + HOUR))
    assert isinstance(step, Extended)
    assert [w for w in t.writes() if w != "map_confirm"] == ["extend_resource", "map_extend"]
    assert t.sent[-3:] == ["extend_resource", "agree_extend", "map_extend"]
    assert t.res("r1").lease_expires_us == END + HOUR
    assert t.home.items[agree_rules.agree_key("c", "p", "k")]["exp"] == fmt_time(END + HOUR)


def test_an_extension_whose_resource_is_gone_leaves_the_agreement_alone() -> None:
    """The resource write refused (liberated, released): A is not moved, so no reader of
    another region answers past the resource's end."""
    t = Regions()
    lease = live_lease_of(t)
    t.script["extend_resource"] = [WriteResult(Outcome.REJECTED)]
    t.run(extend(daemon(), lease, END + HOUR))
    assert t.at == []
    assert t.home.items[agree_rules.agree_key("c", "p", "k")]["exp"] == fmt_time(END)


@pytest.mark.parametrize("fails", ["Send", "GetItem"])
def test_an_extension_without_the_home_region(fails: str) -> None:
    for mode in ("fail", "local"):
        t = Regions()
        lease = lease_of(t)
        if fails == "Send":
            t.home.script["agree_extend"] = [WriteResult(Outcome.UNKNOWN, error=DOWN)]
        else:
            t.home.script["agree_extend"] = [WriteResult(Outcome.REJECTED)]
            t.home.fail[GetItem] = DOWN
        prog = strict_steps.extend_agreement(daemon(mode), HOME, lease, END + HOUR)
        if mode == "fail":
            with pytest.raises(Unavailable):
                t.run(prog)
            assert not t.counts and not t.logs
        else:
            assert t.run(prog) is True
            assert t.counts == {"strict.fallback": 1}
            fields = (("pool", "p"), ("key", "k"), ("token", "t1"), ("error", str(DOWN)))
            assert t.logs == [("strict_fallback", fields, "warning")]

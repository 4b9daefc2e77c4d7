"""Strict pools' agreement (rasd.core.agree): its writes as applied to an item, and its
decisions, with time passed in."""

from __future__ import annotations

import pytest

from rasd.config import ConfigError, load
from rasd.core import agree as agree_rules
from rasd.core.lease import LIVE, PENDING, US, Mapping, fmt_time
from rasd.core.writes import apply

NOW = 1_700_000_000 * US
MARGIN, GRACE = 5 * US, 2 * US
IDENT = agree_rules.agree_key("c", "p", "k")


def pending(
    region: str = "r2", token: str = "t2", ver: int = 1, exp: int = NOW + 60 * US
) -> Mapping:
    return Mapping("c", "p", "k", region, ver, PENDING, token, f"res-{region}", 4, exp, NOW, "o")


def agreed(m: Mapping, ver: int = 0) -> agree_rules.Agreement:
    item = apply(None, agree_rules.agree_write(IDENT, ver, m))
    got = agree_rules.agreement_from(item)
    assert got is not None
    return got


def test_a_new_keys_agreement_applies_once() -> None:
    first = apply(None, agree_rules.agree_write(IDENT, 0, pending("r1", "t1")))
    assert first is not None and first["token"] == "t1" and first["ver"] == 1
    assert (
        apply(first, agree_rules.agree_write(IDENT, 0, pending("r2", "t2"))) is None
    )  # lost: A exists
    taken = apply(first, agree_rules.agree_write(IDENT, 1, pending("r2", "t2")))
    assert taken is not None and taken["token"] == "t2" and taken["ver"] == 2


def test_an_agreement_names_the_lease_it_was_written_for() -> None:
    a = agreed(pending("r1", "t1"))
    lease = agree_rules.lease_of(a, "c", "p", "k")
    assert (lease.region, lease.resource, lease.token, lease.version) == ("r1", "res-r1", "t1", 5)
    assert lease.expires_us == NOW + 60 * US


def test_extension_only_for_its_own_token_and_only_later() -> None:
    item = apply(None, agree_rules.agree_write(IDENT, 0, pending("r1", "t1")))
    assert apply(item, agree_rules.agree_extend(IDENT, "t2", NOW + 90 * US)) is None
    assert apply(item, agree_rules.agree_extend(IDENT, "t1", NOW + 30 * US)) is None  # not later
    ext = apply(item, agree_rules.agree_extend(IDENT, "t1", NOW + 90 * US))
    assert ext is not None and ext["exp"] == fmt_time(NOW + 90 * US) and ext["ver"] == 2
    assert agree_rules.agreed_to("t1", fmt_time(NOW + 90 * US))(ext)
    assert not agree_rules.agreed_to("t1", fmt_time(NOW + 91 * US))(ext)


def decide(
    a: agree_rules.Agreement | None, mine: Mapping, seen: list[Mapping], now: int = NOW
) -> object:
    return agree_rules.on_agreement(a, mine, seen, now, MARGIN, GRACE)


def test_on_agreement() -> None:
    mine = pending("r2", "t2")
    other = agreed(pending("r1", "t1"))
    assert decide(None, mine, [mine]) == agree_rules.Propose(0)
    assert decide(agreed(mine), mine, [mine]) == agree_rules.Agreed()
    deferred = decide(other, mine, [mine])
    assert isinstance(deferred, agree_rules.Defer) and deferred.lease.token == "t1"
    # too close to its end to answer: wait; over for every clock: take it over
    assert isinstance(decide(other, mine, [mine], NOW + 56 * US), agree_rules.AwaitEnd)
    assert decide(other, mine, [mine], NOW + 63 * US) == agree_rules.Propose(other.ver)


def test_an_agreement_whose_lease_its_region_moved_past_is_taken_over() -> None:
    mine = pending("r2", "t2")
    other = agreed(pending("r1", "t1", ver=3))
    live = Mapping("c", "p", "k", "r1", 4, LIVE, "t1", "res-r1", 4, NOW + 60 * US, NOW, "o")
    freed = Mapping("c", "p", "k", "r1", 5, "free")
    older = Mapping("c", "p", "k", "r1", 2, "free")
    assert isinstance(
        decide(other, mine, [mine, live]), agree_rules.Defer
    )  # confirmed: still its lease
    assert isinstance(decide(other, mine, [mine, older]), agree_rules.Defer)  # our replica lags
    assert decide(other, mine, [mine, freed]) == agree_rules.Propose(other.ver)  # released


def test_peer_endpoints_and_home_down_settings() -> None:
    cfg = load(None, env={"RASD_PEER_ENDPOINTS": "us-east-1=http://a:1, eu-west-1=http://b:2"})
    assert cfg.peer_endpoints == {"us-east-1": "http://a:1", "eu-west-1": "http://b:2"}
    assert cfg.strict_home_down == "fail"
    assert load(None, env={"RASD_STRICT_HOME_DOWN": "local"}).strict_home_down == "local"
    for bad in ({"RASD_PEER_ENDPOINTS": "us-east-1"}, {"RASD_STRICT_HOME_DOWN": "maybe"}):
        with pytest.raises(ConfigError):
            load(None, env=bad)


def test_no_agreement_beside_the_papers_agent() -> None:
    """In rollout mode a strict pool is run as a normal one (the paper's agent maps keys with
    no agreement): the one rule every program asks, ``DaemonContext.home_of``."""
    from rasd.core.decide import Rules
    from rasd.steps.daemon import DaemonContext

    rules = Rules(MARGIN, GRACE, 2 * US, 57 * US, 30 * US)
    homes = (("c", "p", "r1"),)
    assert DaemonContext("r2", "o", rules, homes=homes).home_of("c", "p") == "r1"
    assert DaemonContext("r2", "o", rules, homes=homes).home_of("c", "q") is None
    assert (
        DaemonContext("r2", "o", rules, legacy_agents=True, homes=homes).home_of("c", "p") is None
    )


def test_the_writes_in_full() -> None:
    """Every attribute an agreement's writes set, the item they name, and their kinds (the
    checker's traces and the logs name writes by kind)."""
    from rasd.core.lease import ttl_after

    m = pending("r1", "t1", ver=3)
    w = agree_rules.agree_write(IDENT, 0, m)
    item = apply(None, w)
    assert item is not None and w.kind == "agree"
    assert (item["client_id"], item["resource"]) == IDENT == ("#agree#c#p#k", "#")
    assert item["ttl"] == ttl_after(NOW + 60 * US) and item["mver"] == 3 and item["rver"] == 4
    assert item["since"] == fmt_time(NOW) and item["areg"] == "r1" and item["res"] == "res-r1"
    ext = agree_rules.agree_extend(IDENT, "t1", NOW + 90 * US)
    after = apply(item, ext)
    assert after is not None and ext.kind == "agree_extend"
    assert after["ttl"] == ttl_after(NOW + 90 * US)
    assert (after["client_id"], after["resource"]) == IDENT
    for unfit in (
        Mapping("c", "p", "k", "r1", 1, PENDING, None, "res-r1", 4, NOW, NOW, "o"),
        Mapping("c", "p", "k", "r1", 1, PENDING, "t1", None, 4, NOW, NOW, "o"),
        Mapping("c", "p", "k", "r1", 1, PENDING, "t1", "res-r1", 4, None, NOW, "o"),
    ):
        with pytest.raises(AssertionError):  # only a landed claim is agreed
            agree_rules.agree_write(IDENT, 0, unfit)


def test_an_agreement_read_back() -> None:
    """What ``agreement_from`` makes of an item: every field, the defaults of the counters an
    older item may lack, and None for an item that names no lease."""
    item = apply(None, agree_rules.agree_write(IDENT, 0, pending("r1", "t1", ver=3)))
    assert item is not None
    assert agree_rules.agreement_from(item) == agree_rules.Agreement(
        1, "r1", "t1", "res-r1", 4, NOW + 60 * US, NOW, 3
    )
    bare = {k: v for k, v in item.items() if k not in ("ver", "rver", "mver")}
    assert agree_rules.agreement_from(bare) == agree_rules.Agreement(
        0, "r1", "t1", "res-r1", 0, NOW + 60 * US, NOW, 0
    )
    assert agree_rules.agreement_from(None) is None
    assert agree_rules.agreement_from({k: v for k, v in item.items() if k != "token"}) is None


def test_decisions_at_their_boundaries() -> None:
    """The lease ``Defer`` answers is the key's; A's end, less the margin, still answers it
    only strictly before; A's end plus the grace is over only strictly after; a mapping of
    A's region at the version that named A (another token: our replica's older copy) does
    not supersede it."""
    mine = pending("r2", "t2")
    other = agreed(pending("r1", "t1", ver=3))
    end = NOW + 60 * US
    deferred = decide(other, mine, [mine])
    assert isinstance(deferred, agree_rules.Defer)
    lease = deferred.lease
    assert (lease.client_id, lease.pool_id, lease.key, lease.acquired_us) == ("c", "p", "k", NOW)
    assert isinstance(decide(other, mine, [mine], end - MARGIN - 1), agree_rules.Defer)
    waiting = decide(other, mine, [mine], end - MARGIN)
    assert waiting == agree_rules.AwaitEnd("the key's agreed lease is ending")
    assert isinstance(decide(other, mine, [mine], end), agree_rules.AwaitEnd)
    assert isinstance(decide(other, mine, [mine], end + GRACE), agree_rules.AwaitEnd)
    assert decide(other, mine, [mine], end + GRACE + 1) == agree_rules.Propose(other.ver)
    same_ver = Mapping("c", "p", "k", "r1", 3, "free")
    assert isinstance(decide(other, mine, [mine, same_ver]), agree_rules.Defer)


def test_read_backs() -> None:
    item = apply(None, agree_rules.agree_write(IDENT, 0, pending("r1", "t1")))
    assert item is not None
    assert agree_rules.names("t1")(item) and not agree_rules.names("t2")(item)
    assert agree_rules.agree_extend(IDENT, "t1", NOW).key == IDENT

"""Strict pools: a key's lease agreed in the pool's home region, in its agreement item A(k).
Pure: no I/O.

:func:`agree_write` names a landed claim in A, :func:`on_agreement` says what a daemon
answers given A, :func:`agree_extend` extends it; the rules and why they keep I2 across
regions: docs/design.md, "Strict pools: one lease per key across regions".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .lease import AGREE_PREFIX, Lease, Mapping, fmt_time, parse_time, ttl_after
from .writes import Cond, ItemKey, Value, Write

#: the agreement item's sort key (one item per key, under its own partition)
AGREE_SK = "#"


@dataclass(frozen=True, slots=True)
class Agreement:
    """A(k) as read in the home region: which lease the key holds, in which region."""

    ver: int
    region: str
    token: str
    resource: str
    #: the resource's version the claim was conditioned on (the lease's version is one more)
    rver: int
    expires_us: int
    since_us: int
    #: the version of the claimant region's mapping item that named this claim
    mver: int


def agree_key(client_id: str, pool_id: str, key: str) -> ItemKey:
    return (f"{AGREE_PREFIX}{client_id}#{pool_id}#{key}", AGREE_SK)


def agreement_from(d: dict[str, Value] | None) -> Agreement | None:
    """A(k) from its plain-dict form; None when absent or naming nothing."""
    if d is None or not isinstance(d.get("token"), str):
        return None
    return Agreement(
        ver=int(d.get("ver", 0)),
        region=str(d["areg"]),
        token=str(d["token"]),
        resource=str(d["res"]),
        rver=int(d.get("rver", 0)),
        expires_us=parse_time(str(d["exp"])),
        since_us=parse_time(str(d["since"])),
        mver=int(d.get("mver", 0)),
    )


def lease_of(a: Agreement, client_id: str, pool_id: str, key: str) -> Lease:
    """The lease an agreement names (served as another region's lease: never written)."""
    return Lease(
        client_id, pool_id, key, a.resource, a.region, a.expires_us, a.rver + 1, a.since_us, a.token
    )


# ------------------------------------------------------------------------------ writes
def agree_write(ident: ItemKey, expect_ver: int, m: Mapping) -> Write:
    """Name ``m``'s claim (a pending mapping whose claim landed) in A, if A is still at the
    version read (0: absent)."""
    assert m.token is not None and m.resource is not None and m.expires_us is not None
    cond = Cond("ver", "not_exists") if expect_ver == 0 else Cond("ver", "=", expect_ver)
    return Write(
        key=ident,
        conds=(cond,),
        set=(
            ("areg", m.region),
            ("token", m.token),
            ("res", m.resource),
            ("rver", m.rver),
            ("exp", fmt_time(m.expires_us)),
            ("since", fmt_time(m.since_us)),
            ("mver", m.ver),
            ("ttl", ttl_after(m.expires_us)),
            ("ver", expect_ver + 1),
        ),
        kind="agree",
    )


def agree_extend(ident: ItemKey, token: str, expires_us: int) -> Write:
    """Push A's end later, while A still names ``token`` (before the resource and mapping
    are extended: A's end is never earlier than the lease's)."""
    return Write(
        key=ident,
        conds=(Cond("token", "=", token), Cond("exp", "<", fmt_time(expires_us))),
        set=(("exp", fmt_time(expires_us)), ("ttl", ttl_after(expires_us))),
        incr=("ver",),
        kind="agree_extend",
    )


def names(token: str) -> Callable[[dict[str, Value]], bool]:
    """Read-back of :func:`agree_write`: A names ``token``."""
    return lambda it: it.get("token") == token


def agreed_to(token: str, want: str) -> Callable[[dict[str, Value]], bool]:
    """Read-back of :func:`agree_extend`: A names ``token`` until at least ``want``."""
    return lambda it: (
        it.get("token") == token and isinstance(it.get("exp"), str) and (str(it["exp"]) >= want)
    )


# --------------------------------------------------------------------------- decisions
@dataclass(frozen=True, slots=True)
class Agreed:
    """A names our claim: answer it."""


@dataclass(frozen=True, slots=True)
class Propose:
    """A names nothing current: write it, conditional on ``expect_ver``."""

    expect_ver: int


@dataclass(frozen=True, slots=True)
class Defer:
    """A names another lease, current: answer it, give ours back."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class AwaitEnd:
    """A names another lease too close to its end to answer: wait for it to end or be
    extended."""

    why: str


AgreeStep = Agreed | Propose | Defer | AwaitEnd


def superseded(a: Agreement, seen: list[Mapping]) -> bool:
    """The region that holds A's lease has moved its mapping past the version that named
    it, to another acquisition or to none (released, lapsed, taken over), as ``seen`` shows
    it (our region's mapping, read consistently, and the others through our replica)."""
    return any(m.region == a.region and m.ver > a.mver and m.token != a.token for m in seen)


def on_agreement(
    a: Agreement | None,
    mine: Mapping,
    seen: list[Mapping],
    now_us: int,
    margin_us: int,
    grace_us: int,
) -> AgreeStep:
    """A as read in the home region, for our claim ``mine`` (a pending mapping whose claim
    landed). ``grace_us`` >= the clock-skew bound: A's lease is over for every clock."""
    if a is None:
        return Propose(0)
    if a.token == mine.token:
        return Agreed()
    if superseded(a, seen) or a.expires_us + grace_us < now_us:
        return Propose(a.ver)
    if a.expires_us - margin_us > now_us:
        return Defer(lease_of(a, mine.client_id, mine.pool_id, mine.key))
    return AwaitEnd("the key's agreed lease is ending")

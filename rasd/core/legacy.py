"""The daemon's decisions beside the paper's agent (``legacy_agents``). Pure: no I/O.

Adoption (:func:`adoptable`), settling (:func:`beside_legacy`, :func:`on_settle`,
:func:`rival`) and lapsed leases (:func:`on_lapsed`, :func:`extend_floor`): docs/design.md,
"Beside the paper's agent".
"""

from __future__ import annotations

from dataclasses import dataclass

from .decide import Decision, Extend, Rules, Serve, Wait, pick
from .lease import Mapping, ResourceItem


def adoptable(
    r: ResourceItem | None, client_id: str, pool_id: str, key: str, region: str, now_us: int
) -> bool:
    """Is ``r`` (read strongly consistently) a running lease of ``key`` in our region that
    rasd may adopt? Asked only when the key's mapping names no lease here
    (:func:`on_read` said Acquire), so no acquisition of ours serves it: the paper's agent
    took it (or a crash left it, held for this same key). Adoption keeps it where it is."""
    return (
        r is not None
        and _of_key(r, client_id, pool_id, key, region)
        and r.lease_expires_us is not None
        and r.lease_expires_us > now_us
    )


def _of_key(r: ResourceItem, client_id: str, pool_id: str, key: str, region: str) -> bool:
    """Is ``r`` held for ``key`` of that pool, in ``region``?"""
    return r.key == key and r.client_id == client_id and r.pool_id == pool_id and r.region == region


@dataclass(frozen=True, slots=True)
class Settle:
    """Beside the paper's agent: a pending mapping whose claim landed (``mapping``) is not
    served, by its acquirer or a reader, before one more look at the leased index made after
    the claim landed (:func:`on_settle`) and, if that shows no rival, the mapping confirmed."""

    mapping: Mapping


@dataclass(frozen=True, slots=True)
class Confirm:
    """No rival: write ``mapping`` live (``map_confirm``) and serve it once that applied."""

    mapping: Mapping


@dataclass(frozen=True, slots=True)
class YieldTo:
    """A lease of the paper's agent for the key in our region, ``item``, was made while our
    claim was in flight: adopt it at the pending mapping's version (our claim, which no one
    was answered with, is then given back)."""

    mapping: Mapping
    item: ResourceItem


def beside_legacy(d: Decision | Settle) -> Decision | Settle:
    """With ``legacy_agents``: what to do instead of serving a pending mapping whose claim
    landed (``Serve`` with ``confirm``), or extending it (``Extend`` with ``pending``):
    settle it, whoever reads it, its acquirer or another daemon (``on_settle``; a settle's
    writes are conditional on the pending mapping's version, so of two that race one wins,
    and nothing is answered before it won). Every other decision is unchanged (a Settle
    too)."""
    if isinstance(d, Serve) and d.confirm is not None:
        return Settle(d.confirm)
    if isinstance(d, Extend) and d.pending is not None:
        # Extending writes the mapping live: that confirms it too, so it is settled first.
        return Settle(d.pending)
    return d


#: A claim of rasd's that no mapping names is a rival (:func:`rival`) only if it was this old
#: (microseconds) when the settled acquisition began: a younger one is, as a rule, the losing
#: side of a race for the key whose acquirer is giving it back at that moment. Yielding to
#: it would chase a claim that is being freed, and two daemons racing one key would yield to
#: each other until the deadline.
ORPHAN_RIVAL_AGE_US = 2_000_000


def rival(m: Mapping, held: list[ResourceItem], now_us: int) -> ResourceItem | None:
    """Another running lease of ``m``'s key and region in ``held`` (the leased index, read
    after ``m``'s claim landed), or None: the paper's agent's, or a claim of rasd's that no
    mapping names and that was ``ORPHAN_RIVAL_AGE_US`` old when ``m`` was written (measured
    against ``m``'s start, not the reader's clock, so that every daemon that settles ``m``
    judges it alike, however late; its acquisition lost the
    mapping or its outcome was unknown, and no give-back followed: never served by rasd, but
    the paper's agent answers whatever the index shows for the key). ``m`` is the key's
    mapping in the region, so no other item held for the key there is a rasd lease. The
    earliest, as ``pick`` orders them (the paper's agent's lookup makes the same choice).

    Not covered: the paper's agent answering a losing claim of rasd's in the moment before it
    is given back (docs/design.md, "Two agents acquiring one key at once")."""
    found = [
        it
        for it in held
        if it.resource != m.resource
        and adoptable(it, m.client_id, m.pool_id, m.key, m.region, now_us)
        and not (
            it.holder_current
            and m.since_us - (it.lease_acquired_us or m.since_us) < ORPHAN_RIVAL_AGE_US
        )
    ]
    return pick(found)


def lapsing(
    held: list[ResourceItem],
    client_id: str,
    pool_id: str,
    key: str,
    region: str,
    now_us: int,
    grace_us: int,
) -> ResourceItem | None:
    """A lease of ``key`` in ``held`` (the leased index) that has reached its end on this
    host's clock but not on every host's (less than ``grace_us``, the clock-skew bound, ago):
    an app answered with it on a host whose clock is behind may still use it, and the key's
    next lease would run beside it (I2). The key's next lease waits, as :func:`on_lapsed`
    waits for one of ours."""
    return next(
        (
            r
            for r in held
            if _of_key(r, client_id, pool_id, key, region)
            and r.lease_expires_us is not None
            and r.lease_expires_us <= now_us < r.lease_expires_us + grace_us
        ),
        None,
    )


def past_every_clock(r: ResourceItem, grace_us: int) -> int:
    """When the lease ``r`` (one :func:`lapsing` found) has ended on every host's clock."""
    assert r.lease_expires_us is not None
    return r.lease_expires_us + grace_us


def on_settle(
    m: Mapping, held: list[ResourceItem], now_us: int, grace_us: int = 0
) -> Confirm | YieldTo | Wait:
    """A pending mapping ``m`` whose claim landed, and the leased index read after that.

    The paper's agent decides from the index alone and its claim is conditioned on nothing
    about the key, so while both agents acquire a key at once either can make the second
    lease. This rule makes it never rasd's answer: rasd serves its claim only if an index
    read made after the claim landed shows no rival; a rival that shows up later was made by
    the paper's agent after our lease was in the index (docs/design.md, "Two agents acquiring
    one key at once"). A lease of the key past its end on this host's clock by less than
    ``grace_us`` is neither a rival nor gone: wait (:func:`lapsing`)."""
    r = rival(m, held, now_us)
    if r is not None:
        return YieldTo(m, r)
    others = [it for it in held if it.resource != m.resource]
    ending = lapsing(others, m.client_id, m.pool_id, m.key, m.region, now_us, grace_us)
    if ending is not None:
        return Wait(
            "another lease of the key is at its end here, not yet on every host",
            until_us=past_every_clock(ending, grace_us),
        )
    return Confirm(m)


@dataclass(frozen=True, slots=True)
class EndLapsed:
    """Beside the paper's agent: our lease is past its end as its resource item records it
    (no answer of it, rasd's or the paper's agent's, runs any more). End it (the mapping
    released at the version read, then the resource freed) and read again: the key acquires
    anew, adopting what the paper's agent may have leased it since its end."""

    mapping: Mapping


def extend_floor(now_us: int, rules: Rules) -> int:
    """With ``legacy_agents``: an extension sent at ``now_us`` applies only to a lease that
    ends after this (``builders.extend_resource``'s ``floor_us``), and a lease that ends by
    then is not extended (:func:`on_lapsed`).

    The paper's agent takes a lease's end as final, on its own clock: past it, its lookup
    sees no lease and it claims another resource for the key. An extension that lands after
    the end, on any host's clock, makes the lease run again beside that one, a second lease
    rasd made. DynamoDB's condition cannot read the clock, so the sender asks for the end to
    lie more than ``rules.extend_margin_us`` (the clock-skew bound) after its own clock as
    it sends: the write then lands before the end on every host's clock unless it is in
    flight longer than that bound less the hosts' actual skew."""
    return now_us + rules.extend_margin_us


def at_its_end(end_us: int, requested_us: int, now_us: int, rules: Rules) -> bool:
    """With ``legacy_agents``: is our lease, which ends at ``end_us`` as its mapping says,
    past its end, or asked to run longer (``requested_us``) while it ends within the floor
    (:func:`extend_floor`)? Then its item is read and :func:`on_lapsed` decides."""
    return end_us <= now_us or (requested_us > end_us and end_us <= extend_floor(now_us, rules))


def on_lapsed(
    m: Mapping, r: ResourceItem | None, now_us: int, grace_us: int, margin_us: int = 0
) -> Extend | Wait | EndLapsed:
    """With ``legacy_agents``: ``on_read`` said Extend for our lease ``m``, already past its
    end (on the mapping) or within ``margin_us`` of it (``Rules.extend_margin_us``), and
    ``r`` is its resource item, read consistently after.

    The paper's agent takes a lease's end as final: past it, its lookup sees no lease and it
    claims another resource for the key. Extending ours then would make it run again beside
    that one. The item, not the mapping, says whether it is over: an extension writes the
    item first (the mapping can lag it), and both agents answer at most the item's end. An
    item that runs beyond ``now_us + margin_us`` is extended as before (:func:`extend_floor`);
    one that no longer carries our claim is ended, and so is one whose holder the paper's
    writes left stale (its liberator freed our lease, and its agent leased the item again,
    perhaps to the same key: that lease is the paper's, to adopt, not ours to extend). One
    that ends within ``margin_us``, or whose end has passed on this host's clock, is neither
    extended nor ended until its end has passed on every host's, ``grace_us`` (the
    clock-skew bound) after it: until then an app another host answered may still use it,
    and the key's next lease would run beside it. The request waits meanwhile."""
    held = r is not None and r.holder == m.token and r.holder_current and r.key == m.key
    if not held or r is None or r.lease_expires_us is None:
        return EndLapsed(m)
    if r.lease_expires_us > now_us + margin_us:
        return Extend(m)
    until = past_every_clock(r, grace_us)
    if r.lease_expires_us > now_us:
        return Wait("the lease ends within the clock-skew bound: not extended", until)
    if now_us < until:
        return Wait("the lease is at its end on this host's clock, not yet on every host's", until)
    return EndLapsed(m)

"""Taking a lease: the daemon's program for a cache miss, and the acquisition it makes.

Theory of operation
-------------------
:func:`resolve` is a cache miss (the taker's ``get_lease`` after single-flight): each round
reads the key's mappings and does what ``rasd.core.decide`` says: serve a live lease, verify
a pending one against its resource, adopt a lease of the paper's agent
(:mod:`rasd.steps.settle`), extend a lease too close to its end (:mod:`rasd.steps.renew`),
:func:`acquire`, fence, or wait. Part of the daemon's programs (:mod:`rasd.steps.daemon`).
"""

from __future__ import annotations

from ..core import decide as D
from ..core import legacy as LG
from ..core.builders import claim
from ..core.decide import Outcome
from ..core.errors import Busy, NoCapacity, Timeout
from ..core.lease import PENDING, Lease, Mapping, Pool, ResourceItem, map_pk
from ..core.map_builders import holds, map_acquire, names_claim
from . import Mono, Note, Now, Program, Send, Spawn, Together, goto
from .daemon import (
    WAIT_FIRST,
    CachePut,
    Daemon,
    LostCandidate,
    Miss,
    NewToken,
    RateLimit,
    RefillSoon,
    Refresh,
    TakeCandidate,
    Untake,
    error_of,
    fence_or_wait,
    read_first,
    resource,
)
from .give_back import fence_own_claim, free_claim, release, relist
from .renew import confirm, extend_bg, extend_now, reconfirm
from .settle import adopt_paper_lease, beside_legacy, end_lapsed


def resolve(
    d: Daemon,
    pool: Pool,
    key: str,
    requested_us: int,
    wait: float = WAIT_FIRST,
    mine: tuple[str, ...] = (),
) -> Program[tuple[Lease, bool]]:
    """A cache miss: the lease for ``key`` and whether this call acquired it. Each round
    reads the key's mappings and does what ``rasd.core.decide`` says; a round that must read
    again goes on as the next round (``Tail``). ``mine``: the tokens of the mappings earlier
    rounds of this call wrote, so that a lease this call acquired is answered as new also
    when a later round finds it (its confirmation lost to another daemon's, say)."""
    ops = d.ops
    sent = yield Mono()  # the answer is confirmed as of the read's departure
    own, others, held = yield from read_first(d, pool, key)
    dec = ops.on_read(own, others, (yield Now()), d.rules)
    if isinstance(dec, D.Verify):
        r = yield from resource(pool.client_id, dec.mapping.resource or "")
        dec = ops.on_resource(dec.mapping, r, (yield Now()), d.rules)
    if isinstance(dec, D.Acquire) and held:
        adopted = yield from adopt_paper_lease(d, pool, key, held, dec.expect_ver)
        if adopted is None:
            return (yield from goto(resolve, d, pool, key, requested_us, wait, mine))
        dec = adopted
    if d.legacy_agents:
        settled = yield from beside_legacy(d, pool, key, dec)
        if settled is None:
            return (yield from goto(resolve, d, pool, key, requested_us, wait, mine))
        dec = settled
    if isinstance(dec, D.Serve):
        yield CachePut(dec.lease, sent)
        if dec.confirm is not None:
            yield Spawn(confirm, (dec.confirm,))
        ours = dec.lease.token in mine
        yield Note("lease.new" if ours else "lease.existing")
        yield Refresh(dec.lease, requested_us)
        return dec.lease, ours
    if (
        isinstance(dec, D.Extend)
        and d.legacy_agents
        and dec.mapping.expires_us is not None
        and dec.mapping.expires_us <= (yield Now())
    ):
        r = yield from resource(pool.client_id, dec.mapping.resource or "")
        lapsed = ops.on_lapsed(dec.mapping, r, (yield Now()))
        if isinstance(lapsed, LG.EndLapsed):
            yield from end_lapsed(d, lapsed.mapping)
            return (yield from goto(resolve, d, pool, key, requested_us, wait, mine))
    if isinstance(dec, D.Extend):
        lease = yield from extend_now(d, dec.mapping, requested_us)
        if lease is not None:
            return lease, lease.token in mine
        return (yield from goto(resolve, d, pool, key, requested_us, wait, mine))
    if isinstance(dec, D.Acquire):
        got = yield from acquire(d, pool, key, requested_us, dec.expect_ver)
        if isinstance(got, Mapping):
            # legacy_agents: our claim won; served only once settled
            done = yield from beside_legacy(d, pool, key, LG.Settle(got))
            if isinstance(done, D.Serve):
                yield CachePut(done.lease, sent)
                ours = done.lease.resource == got.resource
                yield Note("lease.new" if ours else "lease.existing")
                return done.lease, ours
            # yielded, or settled by another daemon first: read again (the lease may be ours)
            mine = (*mine, got.token) if got.token is not None else mine
            return (yield from goto(resolve, d, pool, key, requested_us, wait, mine))
        if got is not None:
            return got, True
        return (yield from goto(resolve, d, pool, key, requested_us, wait, mine))
    # FenceResource, or Wait: another daemon of this region is acquiring this key.
    wait = yield from fence_or_wait(dec, wait)
    return (yield from goto(resolve, d, pool, key, requested_us, wait, mine))


def acquire(
    d: Daemon, pool: Pool, key: str, requested_us: int, expect_ver: int
) -> Program[Lease | Mapping | None]:
    """Claim a candidate and name it in the key's mapping, both in one round trip.
    None: re-read (someone else wrote the mapping first). With ``legacy_agents`` the claim
    goes out only once the mapping write applied (one round trip more), and a won claim is
    returned as its pending mapping, for the caller to settle: a daemon that loses the key's
    mapping to another never writes the item, so the paper's agent, which answers whatever
    the leased index shows, never sees (and answers) a claim about to be given back."""
    wait = yield RateLimit(pool)
    if wait > 0:
        yield Note("shed.rate_limited")
        raise Busy(
            f"acquisition rate limit of pool {pool.pool_id!r} reached",
            retry_after=round(wait, 3),
        )
    token = yield NewToken()
    ident = (map_pk(pool.client_id, pool.pool_id, key), d.region)
    while True:
        cand = yield TakeCandidate(pool)
        if cand is None:
            yield Note("lease.no_capacity")
            why = yield Miss(pool)
            said = f"no free resource in pool {pool.pool_id!r} in {d.region}"
            raise NoCapacity(f"{said}: {why}" if why else said)
        item: ResourceItem = cand.item
        now = yield Now()
        mw = map_acquire(
            ident, expect_ver, token, item.resource, item.version, requested_us, now, d.owner
        )
        cw = claim(item, key, requested_us, now, token, expect_ver + 1)
        sent = yield Mono()
        yield RefillSoon(pool)
        if d.legacy_agents:
            mres = yield Send(mw, names_claim(token, item.resource))
            cres = None
            if mres.outcome is Outcome.APPLIED:
                cres = yield Send(cw, holds(token, key))
        else:
            mres, cres = yield Together(
                (Send(mw, names_claim(token, item.resource)), Send(cw, holds(token, key)))
            )
        if cres is None or cres.outcome is Outcome.UNKNOWN or cres.error is not None:
            # not sent, or not refused by its condition: the item may still be free at this
            # version
            yield Untake(pool, cand)
        # a claim not sent is not on the item, as one refused
        claimed = Outcome.REJECTED if cres is None else cres.outcome
        step = d.ops.after_acquire(mres.outcome, claimed, expect_ver)
        if isinstance(step, D.Won):
            pending = Mapping(
                pool.client_id,
                pool.pool_id,
                key,
                d.region,
                expect_ver + 1,
                PENDING,
                token,
                item.resource,
                item.version,
                requested_us,
                now,
                d.owner,
            )
            if d.legacy_agents:
                return pending
            lease = Lease(
                pool.client_id,
                pool.pool_id,
                key,
                item.resource,
                d.region,
                requested_us,
                item.version + 1,
                now,
                token,
            )
            yield CachePut(lease, sent)
            yield Spawn(confirm, (pending,))
            yield Note("lease.new")
            return lease
        if isinstance(step, D.NextCandidate):
            yield Note("prefetch.conflicts")
            yield LostCandidate(pool, cand)
            expect_ver = step.expect_ver
            continue
        if isinstance(step, D.GiveBack):
            # No mapping names this claim, so nobody serves it: give it back in the
            # background (retried), and read again now.
            yield Note("acq.gave_back")
            yield Spawn(free_claim, (d, item.ident, key, token, D.Freed.LOST))
            return None
        if isinstance(step, D.FenceOwnClaim):
            yield Note("acq.fence_own")
            yield Spawn(fence_own_claim, (d, item, key, token))
            return None
        if isinstance(step, D.Reread):
            yield Note("acq.lost_mapping")
            return None
        assert isinstance(step, D.GiveUp)
        yield Note("acq.gave_up")
        raise error_of(mres, *([cres] if cres is not None else [])) or Timeout(step.why)


#: every program a daemon runs (the checker's divergence test names them)
PROGRAMS = (
    resolve,
    release,
    confirm,
    free_claim,
    relist,
    fence_own_claim,
    extend_bg,
    reconfirm,
)

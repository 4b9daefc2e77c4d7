"""Taking a lease: the daemon's program for a cache miss (:func:`resolve`), and the acquisition
it makes (:func:`acquire`; docs/design.md, "get_lease").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import decide
from ..core import legacy as legacy_rules
from ..core.builders import claim
from ..core.decide import Outcome
from ..core.errors import Busy, NoCapacity, Timeout
from ..core.lease import PENDING, Lease, Mapping, Pool, ResourceItem, map_pk
from ..core.map_builders import holds, map_acquire, map_acquire_unheld, names_claim
from . import (
    Mono,
    Note,
    Now,
    QueryLeased,
    QueryMappings,
    Send,
    Spawn,
    WriteResult,
    goto,
    together,
)
from .daemon import (
    WAIT_FIRST,
    CachePut,
    DaemonContext,
    DaemonProgram,
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
from .strict import agree, withdraw


def resolve(
    d: DaemonContext,
    pool: Pool,
    key: str,
    requested_us: int,
    wait: float = WAIT_FIRST,
    mine: tuple[str, ...] = (),
    first: bool = True,
    speculate: bool = True,
) -> DaemonProgram[tuple[Lease, bool]]:
    """A cache miss: the lease for ``key`` and whether this call acquired it. Each round
    reads the key's mappings and does what ``rasd.core.decide`` says; a round that must read
    again goes on as the next round (``Tail``). ``mine``: the tokens of the mappings earlier
    rounds of this call wrote, so that a lease this call acquired is answered as new also
    when a later round finds it (its confirmation lost to another daemon's, say). ``first``:
    this is the call's first round (in rollout mode it writes the key's mapping beside the
    read, :func:`read_speculating`, unless ``speculate`` is off: a key whose lease this host
    knew lately most likely still has one, which would refuse that write)."""
    ops = d.ops
    sent = yield from Mono()  # the answer is confirmed as of the read's departure
    if d.legacy_agents and first and speculate:
        own, others, held, spec = yield from read_speculating(d, pool, key, requested_us)
    else:
        if d.legacy_agents and first:
            yield Note("rollout.beside_read.known")
        (own, others, held), spec = (yield from read_first(d, pool, key)), None
    dec = ops.on_read(own, others, (yield from Now()), d.rules)
    if spec is not None:
        if spec.res.outcome is Outcome.APPLIED:
            # The key's mapping in this region named no lease: the pending one just written
            # is ours, whatever the read beside it saw (the mapping before it, or it).
            now = yield from Now()
            dec = ops.on_read(None, others, now, d.rules)
            # the leased index read beside it asks nothing of the key (no lease of it at its
            # end here, none to adopt): claim the candidate the write names
            clear = not held or (
                ops.lapsing(
                    held, pool.client_id, pool.pool_id, key, d.region, now, d.rules.grace_us
                )
                is None
                and not any(
                    legacy_rules.adoptable(r, pool.client_id, pool.pool_id, key, d.region, now)
                    for r in held
                )
            )
            if not (isinstance(dec, decide.Acquire) and clear):
                yield Untake(pool, spec.cand)  # never claimed
            if isinstance(dec, decide.Acquire):
                ver = _written_ver(spec.res)
                dec = decide.Acquire(ver)
                if clear:
                    got = yield from acquire(d, pool, key, requested_us, ver - 1, spec)
                    return (yield from _acquired(d, pool, key, requested_us, wait, mine, sent, got))
        elif spec.res.outcome is Outcome.REJECTED:
            yield Untake(pool, spec.cand)  # the key has a mapping: decide from the read
        else:  # the write may have landed: readers resolve a pending mapping never claimed
            yield LostCandidate(pool, spec.cand)
            yield Note("acq.gave_up")
            raise error_of(spec.res) or Timeout("mapping write outcome unknown")
    if isinstance(dec, decide.Verify):
        r = yield from resource(pool.client_id, dec.mapping.resource or "")
        dec = ops.on_resource(dec.mapping, r, (yield from Now()), d.rules)
        home = ops.strict_home(d, pool.client_id, pool.pool_id)
        landed = (
            dec.confirm
            if isinstance(dec, decide.Serve)
            else dec.pending
            if isinstance(dec, decide.Extend)
            else None
        )
        if home is not None and landed is not None:
            # a strict pool: a claim is answered only once agreed in the home region
            other = yield from agree(d, pool, home, landed, (landed, *others))
            if other is not None:
                dec = decide.Serve(other, foreign=True)
    ending = None
    if isinstance(dec, decide.Acquire) and held:
        now, grace = (yield from Now()), d.rules.grace_us
        ending = ops.lapsing(held, pool.client_id, pool.pool_id, key, d.region, now, grace)
    if ending is not None:
        # a lease of the key at its end here, not yet on every host: its apps may still
        # use it, and the key's next lease would run beside it (I2)
        dec = decide.Wait(
            "the key's lease is at its end on this host's clock, not on every host's",
            until_us=legacy_rules.past_every_clock(ending, d.rules.grace_us),
        )
    if isinstance(dec, decide.Acquire) and held:
        adopted = yield from adopt_paper_lease(d, pool, key, held, dec.expect_ver)
        if adopted is None:
            return (yield from goto(resolve, d, pool, key, requested_us, wait, mine, False))
        dec = adopted
    if d.legacy_agents:
        settled = yield from beside_legacy(d, pool, key, dec)
        if settled is None:
            return (yield from goto(resolve, d, pool, key, requested_us, wait, mine, False))
        dec = settled
    if isinstance(dec, decide.Serve):
        yield CachePut(dec.lease, sent)
        if dec.confirm is not None:
            yield Spawn(confirm, (dec.confirm,))
        ours = dec.lease.token in mine
        yield Note("lease.new" if ours else "lease.existing")
        yield Refresh(dec.lease, requested_us)
        return dec.lease, ours
    if (
        isinstance(dec, decide.Extend)
        and d.legacy_agents
        and dec.mapping.expires_us is not None
        and legacy_rules.at_its_end(
            dec.mapping.expires_us, requested_us, (yield from Now()), d.rules
        )
    ):
        # the item says whether it runs on (the mapping can lag an extension)
        r = yield from resource(pool.client_id, dec.mapping.resource or "")
        now = yield from Now()
        lapsed = ops.on_lapsed(dec.mapping, r, now, d.rules.grace_us, d.rules.extend_margin_us)
        if isinstance(lapsed, legacy_rules.EndLapsed):
            yield from end_lapsed(d, lapsed.mapping)
            return (yield from goto(resolve, d, pool, key, requested_us, wait, mine, False))
        dec = lapsed
    if isinstance(dec, decide.Extend):
        lease = yield from extend_now(d, dec.mapping, requested_us)
        if lease is not None:
            return lease, lease.token in mine
        return (yield from goto(resolve, d, pool, key, requested_us, wait, mine, False))
    if isinstance(dec, decide.Acquire):
        got = yield from acquire(d, pool, key, requested_us, dec.expect_ver, None, tuple(others))
        return (yield from _acquired(d, pool, key, requested_us, wait, mine, sent, got))
    # FenceResource, or Wait: another daemon of this region is acquiring this key.
    wait = yield from fence_or_wait(dec, wait)
    return (yield from goto(resolve, d, pool, key, requested_us, wait, mine, False))


def _acquired(
    d: DaemonContext,
    pool: Pool,
    key: str,
    requested_us: int,
    wait: float,
    mine: tuple[str, ...],
    sent: float,
    got: Lease | Mapping | None,
) -> DaemonProgram[tuple[Lease, bool]]:
    """What :func:`acquire` returned: the lease (served), a won claim's pending mapping
    (rollout mode: served once settled), or None (read again)."""
    if isinstance(got, Mapping):
        done = yield from beside_legacy(d, pool, key, legacy_rules.Settle(got), answer_first=True)
        if isinstance(done, decide.Serve):
            yield CachePut(done.lease, sent)
            ours = done.lease.resource == got.resource
            yield Note("lease.new" if ours else "lease.existing")
            return done.lease, ours
        # yielded, or settled by another daemon first: read again (the lease may be ours)
        mine = (*mine, got.token) if got.token is not None else mine
        return (yield from goto(resolve, d, pool, key, requested_us, wait, mine, False))
    if got is not None:
        return got, got.region == d.region  # another region's: a strict pool's agreement
    return (yield from goto(resolve, d, pool, key, requested_us, wait, mine, False))


def _written_ver(res: WriteResult) -> int:
    """The mapping version a speculative write that applied made (the item it returned, as
    written or as read back carrying it)."""
    ver = res.item.get("ver") if res.item is not None else None
    assert isinstance(ver, int), res
    return ver


@dataclass(frozen=True, slots=True)
class Speculated:
    """The new key's mapping write a call's first read carried (:func:`read_speculating`):
    the candidate it names, its token and time, and its result."""

    cand: Any
    token: str
    now: int
    res: WriteResult


def read_speculating(
    d: DaemonContext, pool: Pool, key: str, requested_us: int
) -> DaemonProgram[tuple[Mapping | None, list[Mapping], list[ResourceItem], Speculated | None]]:
    """Rollout mode, a call's first read: :func:`read_first`, and beside it, in the same
    round trip, the mapping write an acquisition would send next, naming a candidate already
    at hand: ``map_acquire_unheld``, which applies only where the key's mapping in this
    region names no lease (absent, free, or lapsed past the grace), so only where the read
    would have decided Acquire. A new key, or one whose lease ended, then takes three round
    trips (this, the claim, the settling read); for a key with a lease the write is refused
    and changes nothing. No candidate at hand, or no acquisition left in the pool's rate:
    the read alone (None)."""
    cand = None
    if (yield from RateLimit(pool)) == 0:
        cand = yield from TakeCandidate(pool, wait=False)
    if cand is None:
        yield Note("rollout.beside_read.no_candidate")
        own, others, held = yield from read_first(d, pool, key)
        return own, others, held, None
    token = yield from NewToken()
    now = yield from Now()
    item: ResourceItem = cand.item
    ident = (map_pk(pool.client_id, pool.pool_id, key), d.region)
    lapsed_by = now - d.rules.grace_us
    mw = map_acquire_unheld(
        ident, lapsed_by, token, item.resource, item.version, requested_us, now, d.owner
    )
    ms, held, res = yield from together(
        QueryMappings(pool.client_id, pool.pool_id, key),
        QueryLeased(pool.client_id, pool.pool_id, key),
        Send(mw, names_claim(token, item.resource)),
    )
    yield Note(f"rollout.beside_read.{res.outcome.value}")
    own = next((m for m in ms if m.region == d.region), None)
    others = [m for m in ms if m.region != d.region]
    return own, others, list(held), Speculated(cand, token, now, res)


def acquire(
    d: DaemonContext,
    pool: Pool,
    key: str,
    requested_us: int,
    expect_ver: int,
    spec: Speculated | None = None,
    others: tuple[Mapping, ...] = (),
) -> DaemonProgram[Lease | Mapping | None]:
    """Claim a candidate and name it in the key's mapping, both in one round trip.
    None: re-read (someone else wrote the mapping first). With ``legacy_agents`` the claim
    goes out only once the mapping write applied (one round trip more), and a won claim is
    returned as its pending mapping, for the caller to settle: a daemon that loses the key's
    mapping to another never writes the item, so the paper's agent, which answers whatever
    the leased index shows, never sees (and answers) a claim about to be given back.
    ``spec``: that first mapping write was already made, and applied (:func:`read_speculating`).
    ``others``: the other regions' mappings of the key as read (a strict pool's agreement
    judges the lease it names by them); a strict pool's won claim is answered once agreed, or
    the lease the agreement names instead (:func:`rasd.steps.strict.agree`)."""
    wait = 0.0 if spec is not None else (yield from RateLimit(pool))
    if wait > 0:
        yield Note("shed.rate_limited")
        raise Busy(
            f"acquisition rate limit of pool {pool.pool_id!r} reached",
            retry_after=round(wait, 3),
        )
    ident = (map_pk(pool.client_id, pool.pool_id, key), d.region)
    while True:
        # A token names one claim: the mapping an earlier candidate's write left names the
        # earlier token, so a reader never takes this claim for that one's.
        token = spec.token if spec is not None else (yield from NewToken())
        cand = spec.cand if spec is not None else (yield from TakeCandidate(pool))
        if cand is None:
            yield Note("lease.no_capacity")
            why = yield from Miss(pool)
            said = f"no free resource in pool {pool.pool_id!r} in {d.region}"
            raise NoCapacity(f"{said}: {why}" if why else said)
        item: ResourceItem = cand.item
        now = spec.now if spec is not None else (yield from Now())
        mw = map_acquire(
            ident, expect_ver, token, item.resource, item.version, requested_us, now, d.owner
        )
        cw = claim(item, key, requested_us, now, token, expect_ver + 1)
        sent = yield from Mono()
        yield RefillSoon(pool)
        if spec is not None:
            mres, spec = spec.res, None
            cres = yield from Send(cw, holds(token, key))
        elif d.legacy_agents:
            mres = yield from Send(mw, names_claim(token, item.resource))
            cres = None
            if mres.outcome is Outcome.APPLIED:
                cres = yield from Send(cw, holds(token, key))
        else:
            mres, cres = yield from together(
                Send(mw, names_claim(token, item.resource)), Send(cw, holds(token, key))
            )
        if cres is None or cres.outcome is Outcome.UNKNOWN or cres.error is not None:
            # not sent, or not refused by its condition: the item may still be free at this
            # version
            yield Untake(pool, cand)
        # a claim not sent is not on the item, as one refused
        claimed = Outcome.REJECTED if cres is None else cres.outcome
        step = d.ops.after_acquire(mres.outcome, claimed, expect_ver)
        if isinstance(step, decide.Won):
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
            home = d.ops.strict_home(d, pool.client_id, pool.pool_id)
            if home is not None:
                other = yield from agree(d, pool, home, pending, (pending, *others))
                if other is not None:
                    yield CachePut(other, sent)
                    yield Note("lease.existing")
                    return other
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
        if isinstance(step, decide.NextCandidate):
            yield Note("prefetch.conflicts")
            yield LostCandidate(pool, cand)
            expect_ver = step.expect_ver
            continue
        if isinstance(step, decide.GiveBack):
            # The mapping write lost, so no mapping names this claim: give it back in the
            # background (retried), and read again now.
            yield Note("acq.gave_back")
            freed = d.ops.given_back(step.proof)
            yield Spawn(free_claim, (d, item.ident, key, token, freed))
            return None
        if isinstance(step, decide.FenceOwnClaim):
            yield Note("acq.fence_own")
            yield Spawn(fence_own_claim, (d, item, key, token, step.proof))
            return None
        if isinstance(step, decide.Reread):
            yield Note("acq.lost_mapping")
            return None
        assert isinstance(step, decide.GiveUp)
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
    agree,
    withdraw,
)

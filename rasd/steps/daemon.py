"""The daemon's protocol as programs: resolution, acquisition, extension, release, give-back.

Theory of operation
-------------------
Every verb of the daemon that touches the table is a program here (:mod:`rasd.steps`): a
generator that yields effects and decides, through :mod:`rasd.core.decide`, from what they return.
Two interpreters run them, and nothing else states the protocol:

* ``rasd.acquire.Acquirer`` performs each effect for real (the store's calls with the
  request's deadline, the lease cache, the prefetcher, background tasks, counters and logs);
* the protocol checker (``check/effects.py``) performs each DynamoDB effect as one atomic
  step against its model of the table, branching on every outcome, and resolves the local
  effects below against its model of the daemon.

:func:`resolve` is a cache miss (``Acquirer.get_lease`` after single-flight): read the key's
mappings, serve a live lease, verify a pending one against its resource, adopt a lease of the
paper's agent, extend a lease too close to its end, acquire, fence, or wait. With
``legacy_agents`` (the paper's agents share the table) a pending mapping whose claim landed
is never served as it is: :func:`beside_legacy` settles it (:func:`settle`: the leased index
read after the claim landed, then :func:`confirm_now`, or the claim given back and the
paper's lease adopted instead), and a lease past its end as its item records it is ended
(:func:`end_lapsed`), not extended (docs/design.md, "Two agents acquiring one key at once").
:func:`release` gives a lease back. The background programs (:func:`confirm`, :func:`free_claim`,
:func:`fence_own_claim`, :func:`extend_bg`, :func:`reconfirm`, :func:`relist`) are started
with :class:`~rasd.steps.Spawn` (or by the driver after a cache hit).

A program learns the daemon it runs in from :class:`Daemon`: its region, owner name, time
rules, whether the paper's agents share the table, and :class:`Ops`, the pure functions it
decides with. The checker hands known-bad ``Ops`` (``check/rulesets.py``) to show that it
finds each bug once put back; production always runs :data:`REAL`.

Programs are deterministic in what they are sent (tokens come from :class:`NewToken`, clocks
from ``Now`` and ``Mono``): the checker keeps them as replayed traces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..core import builders as B
from ..core import decide as D
from ..core import legacy as LG
from ..core.builders import adopt, claim, extend_resource, fence_resource
from ..core.decide import Outcome, Rules, lease_from_mapping, pick
from ..core.errors import Busy, NoCapacity, NotHeld, RasdError, Timeout
from ..core.lease import PENDING, US, Lease, Mapping, Pool, ResourceItem, fmt_time, map_pk
from ..core.map_builders import (
    confirmed,
    extended_to,
    holds,
    map_acquire,
    map_confirm,
    map_drop_dead,
    map_extend,
    map_extended_to,
    map_release,
    names_claim,
    no_token,
    not_held_by,
)
from ..core.serialize import mapping_from, resource_from
from ..core.writes import ItemKey, Write
from . import (
    GetItem,
    Join,
    Mono,
    Note,
    Now,
    Program,
    QueryLeased,
    QueryMappings,
    Send,
    Sleep,
    Spawn,
    Together,
    goto,
)

#: (client_id, pool_id, key): a lease's place in the daemon's cache
CacheKey = tuple[str, str, str]

BACKGROUND_DEADLINE = 5.0  # extensions, confirmations, give-backs: not bound to a request
WAIT_FIRST = 0.005  # polling a pending mapping: 5 ms, doubling, up to WAIT_MAX
WAIT_MAX = 0.1
#: seconds after its quarantine's end that a daemon re-lists an item it quarantined
RELIST_SLACK = 1.0
#: a daemon re-lists what it freed only if that is due within this long (else the liberator)
RELIST_MAX_WAIT_US = 600 * US
#: attempts of a give-back (about a minute with the backoff between them)
FREE_CLAIM_ATTEMPTS = 6


# ------------------------------------------------------------------- the daemon's effects
@dataclass(frozen=True, slots=True)
class Deadline:
    """The calls from here on must end within ``seconds`` (a background program's own
    deadline; a request's calls have the request's). Result: None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class CachePut:
    """Cache ``lease``, confirmed as of monotonic time ``sent`` (``LeaseCache.put``)."""

    lease: Lease
    sent: float


@dataclass(frozen=True, slots=True)
class CacheDrop:
    """Forget the cached lease of ``key`` (``LeaseCache.drop``)."""

    key: CacheKey


@dataclass(frozen=True, slots=True)
class Refresh:
    """A lease was just served from the table: extend it in the background if the request
    asks for more than it has, else re-confirm it once stale (``Acquirer._maybe_refresh``,
    as after a cache hit)."""

    lease: Lease
    requested_us: int


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Take one acquisition from the pool's token bucket. Result: 0.0, or the seconds to
    wait before one is available (nothing taken)."""

    pool: Pool


@dataclass(frozen=True, slots=True)
class NewToken:
    """A fresh random lease token. Result: str."""


@dataclass(frozen=True, slots=True)
class TakeCandidate:
    """A free resource of the pool's region to claim (the prefetcher's buffer, refilled
    from the lagging available index). Result: an object with ``.item`` (a ResourceItem),
    handed back to :class:`Untake` / :class:`LostCandidate`; or None when there is none."""

    pool: Pool


@dataclass(frozen=True, slots=True)
class RefillSoon:
    """Top the pool's candidate buffer up in the background, queued behind the calls of the
    program's next round trip (so building the refill never delays them). Result: None."""

    pool: Pool


@dataclass(frozen=True, slots=True)
class Untake:
    """The claim of ``cand`` may not have landed: it may be taken again. Result: None."""

    pool: Pool
    cand: Any = field(compare=False)


@dataclass(frozen=True, slots=True)
class LostCandidate:
    """Someone else claimed ``cand`` first. Result: None."""

    pool: Pool
    cand: Any = field(compare=False)


@dataclass(frozen=True, slots=True)
class Miss:
    """A request found no free resource: counted for the balancer. Result: None."""

    pool: Pool


@dataclass(frozen=True, slots=True)
class RelistLater:
    """Start :func:`relist` for the item ``ident`` (quarantined until ``until_us``), not
    waited for on shutdown (``ras-liberator`` re-lists what is left). Result: None."""

    ident: ItemKey
    until_us: int


# ------------------------------------------------------------------------ what they use
def _quarantine(rules: Rules, give_back: bool) -> int:
    return rules.quarantine_us


@dataclass(frozen=True, eq=False)
class Ops:
    """The pure functions the programs decide and write with (:mod:`rasd.core.decide`,
    :mod:`rasd.core.builders`). Only the checker's known-bad rule sets replace one. Compared by
    identity (one instance per rule set), so a program's arguments hash fast."""

    name: str = "real"
    on_read: Callable[..., D.Decision] = field(default=D.on_read, repr=False)
    on_resource: Callable[..., D.Decision] = field(default=D.on_resource, repr=False)
    after_acquire: Callable[..., D.AcquireStep] = field(default=D.after_acquire, repr=False)
    after_extend: Callable[..., D.ExtendStep] = field(default=D.after_extend, repr=False)
    on_extend_check: Callable[..., D.ExtendStep] = field(default=D.on_extend_check, repr=False)
    on_release_read: Callable[..., D.Decision] = field(default=D.on_release_read, repr=False)
    on_release_resource: Callable[..., D.Decision] = field(
        default=D.on_release_resource, repr=False
    )
    #: with ``legacy_agents``: a pending mapping whose claim landed is settled, not served
    beside_legacy: Callable[..., D.Decision | LG.Settle] = field(
        default=LG.beside_legacy, repr=False
    )
    #: settling: confirm our claim, or yield to the paper's lease the leased index shows
    on_settle: Callable[..., LG.Confirm | LG.YieldTo] = field(default=LG.on_settle, repr=False)
    #: with ``legacy_agents``: extend our lease past its end on the mapping, or end it
    on_lapsed: Callable[..., D.Extend | LG.EndLapsed] = field(default=LG.on_lapsed, repr=False)
    #: the early free's write (``rasd.core.builders.free_claim``)
    free_claim: Callable[..., Write] = field(default=B.free_claim, repr=False)
    #: how long an early free stays unclaimable: (rules, give_back) -> microseconds
    quarantine_us: Callable[[Rules, bool], int] = field(default=_quarantine, repr=False)


REAL = Ops()


@dataclass(frozen=True)
class Daemon:
    """The daemon as its programs see it (values only: the checker keeps them in states)."""

    region: str
    owner: str
    rules: Rules
    #: the paper's agents share the table (adopt their leases; hold a free to a lease's end)
    legacy_agents: bool = False
    free_claim_attempts: int = FREE_CLAIM_ATTEMPTS
    ops: Ops = REAL


# ----------------------------------------------------------------------------- reading
def read(d: Daemon, pool: Pool, key: str) -> Program[tuple[Mapping | None, list[Mapping]]]:
    """The key's mappings (one strongly consistent Query): ours, and other regions'."""
    ms = yield QueryMappings(pool.client_id, pool.pool_id, key)
    own = next((m for m in ms if m.region == d.region), None)
    return own, [m for m in ms if m.region != d.region]


def read_first(
    d: Daemon, pool: Pool, key: str
) -> Program[tuple[Mapping | None, list[Mapping], list[ResourceItem]]]:
    """:func:`read`, and with ``legacy_agents`` the leased index's items of the key, read at
    once (one round trip): where a lease of the paper's agent would be."""
    if not d.legacy_agents:
        own, others = yield from read(d, pool, key)
        return own, others, []
    ms, held = yield Together(
        (
            QueryMappings(pool.client_id, pool.pool_id, key),
            QueryLeased(pool.client_id, pool.pool_id, key),
        )
    )
    own = next((m for m in ms if m.region == d.region), None)
    return own, [m for m in ms if m.region != d.region], list(held)


def resource(client_id: str, name: str) -> Program[ResourceItem | None]:
    got = yield GetItem((client_id, name))
    return resource_from(got) if got is not None else None


# -------------------------------------------------------------------------- resolution
def resolve(
    d: Daemon, pool: Pool, key: str, requested_us: int, wait: float = WAIT_FIRST
) -> Program[tuple[Lease, bool]]:
    """A cache miss: the lease for ``key`` and whether this call acquired it. Each round
    reads the key's mappings and does what ``rasd.core.decide`` says; a round that must read
    again goes on as the next round (``Tail``)."""
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
            return (yield from goto(resolve, d, pool, key, requested_us, wait))
        dec = adopted
    if d.legacy_agents:
        settled = yield from beside_legacy(d, pool, key, dec)
        if settled is None:
            return (yield from goto(resolve, d, pool, key, requested_us, wait))
        dec = settled
    if isinstance(dec, D.Serve):
        yield CachePut(dec.lease, sent)
        if dec.confirm is not None:
            yield Spawn(confirm, (dec.confirm,))
        yield Note("lease.existing")
        yield Refresh(dec.lease, requested_us)
        return dec.lease, False
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
            return (yield from goto(resolve, d, pool, key, requested_us, wait))
    if isinstance(dec, D.Extend):
        lease = yield from extend_now(d, dec.mapping, requested_us)
        if lease is not None:
            return lease, False
        return (yield from goto(resolve, d, pool, key, requested_us, wait))
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
            # yielded, then not servable at once: read again
            return (yield from goto(resolve, d, pool, key, requested_us, wait))
        if got is not None:
            return got, True
        return (yield from goto(resolve, d, pool, key, requested_us, wait))
    if isinstance(dec, D.FenceResource):
        yield from fence(dec.resource)
        return (yield from goto(resolve, d, pool, key, requested_us, wait))
    # Wait: another daemon of this region is acquiring this key.
    wait = yield from wait_for(wait)
    return (yield from goto(resolve, d, pool, key, requested_us, wait))


def wait_for(wait: float) -> Program[float]:
    """Another daemon of this region is acquiring the key: poll again after ``wait`` (5 ms,
    doubling, up to WAIT_MAX), within the deadline. Returns the next wait."""
    yield Note("acq.waits")
    yield Sleep(wait)
    return min(wait * 2, WAIT_MAX)


def fence(r: ResourceItem) -> Program[None]:
    """Move a resource's version past the claim a dead acquirer's mapping names."""
    res = yield Send(fence_resource(r.ident, r.version))
    yield Note("acq.fenced" if res.outcome is Outcome.APPLIED else "acq.fence_lost")
    if res.error is not None and res.outcome is not Outcome.REJECTED:
        raise res.error


def adopt_paper_lease(
    d: Daemon,
    pool: Pool,
    key: str,
    held: list[ResourceItem],
    expect_ver: int,
    give_back: tuple[ItemKey, str] | None = None,
) -> Program[D.Decision | None]:
    """The key has no lease in our mapping, but the leased index shows a resource of our
    region held for it: a lease of the paper's agent. Read the item (strongly consistent);
    if it is a running lease of the key, name it in the mapping (at the version read, like
    any acquisition), then record our token on the item (conditional on the version read).
    Returns what to do next: serve or extend the adopted lease, acquire (nothing to adopt,
    or it changed before our write: the mapping is then ours at the next version), or None
    to read again (another daemon wrote the mapping). ``give_back``: a claim of ours (item,
    token) the pending mapping named, given back once the mapping names the other lease."""
    now = yield Now()
    cid, pid = pool.client_id, pool.pool_id
    hint = pick([it for it in held if LG.adoptable(it, cid, pid, key, d.region, now)])
    if hint is None:
        return D.Acquire(expect_ver)
    r = yield from resource(cid, hint.resource)
    now = yield Now()
    if r is None or not LG.adoptable(r, cid, pid, key, d.region, now):
        return D.Acquire(expect_ver)
    assert r.lease_expires_us is not None
    token = yield NewToken()
    m = Mapping(
        cid,
        pid,
        key,
        d.region,
        expect_ver + 1,
        PENDING,
        token,
        r.resource,
        r.version,
        r.lease_expires_us,
        now,
        d.owner,
    )
    mw = map_acquire(
        m.ident, expect_ver, token, r.resource, r.version, r.lease_expires_us, now, d.owner
    )
    mres = yield Send(mw, names_claim(token, r.resource))
    ares = None
    if mres.outcome is Outcome.APPLIED:
        if give_back is not None:  # the mapping names the lease now, not yet adopted
            yield from give_back_now(d, give_back[0], key, give_back[1])
        ares = yield Send(adopt(r, token, expect_ver + 1, now), holds(token, key))
    # The writes went one after the other: the adoption is sent only once the mapping names
    # it, so it never holds a lease that no mapping can name.
    step = d.ops.after_acquire(mres.outcome, ares.outcome if ares else Outcome.REJECTED, expect_ver)
    if isinstance(step, D.Won):
        assert ares is not None and ares.item is not None
        yield Note("lease.adopted")
        dec = d.ops.on_resource(m, resource_from(ares.item), (yield Now()), d.rules)
        if isinstance(dec, D.Serve) and dec.confirm is not None:
            # Settled already: the lease is the paper agent's own. Confirmed before it is
            # served, as a settled claim is (readers wait for it meanwhile).
            return (yield from confirm_now(dec.confirm))
        return dec
    if isinstance(step, D.NextCandidate):
        yield Note("lease.adopt_lost")
        return D.Acquire(step.expect_ver)
    if isinstance(step, D.Reread):
        return None
    yield Note("acq.gave_up")
    raise _error_of(mres, *(() if ares is None else (ares,))) or Timeout("adoption outcome unknown")


def beside_legacy(
    d: Daemon, pool: Pool, key: str, dec: D.Decision | LG.Settle
) -> Program[D.Decision | None]:
    """With ``legacy_agents``, a pending mapping whose claim landed is settled, not served
    (``legacy.beside_legacy``): the leased index read once more, then the mapping confirmed
    and served, or the paper's agent's lease adopted instead. None: read again."""
    while True:
        b = d.ops.beside_legacy(dec)
        if not isinstance(b, LG.Settle):
            return b
        settled = yield from settle(d, pool, key, b.mapping)
        if settled is None:
            return None
        dec = settled


def settle(d: Daemon, pool: Pool, key: str, m: Mapping) -> Program[D.Decision | None]:
    """A pending mapping ``m`` whose claim landed: read the leased index (now, after the
    claim landed) and ask ``legacy.on_settle``. Confirm: ``map_confirm``, and serve once it
    applied (None: it lost, read again). YieldTo: adopt the paper's lease at ``m``'s
    version, once our claim is given back."""
    assert m.token is not None and m.resource is not None
    held = yield QueryLeased(pool.client_id, pool.pool_id, key)
    s = d.ops.on_settle(m, list(held), (yield Now()))
    if isinstance(s, LG.YieldTo):
        yield Note("lease.yielded")
        # The adoption's mapping write, at the pending version, names the other lease: our
        # claim can then no longer be confirmed, and no daemon served it. It is given back
        # before the adoption writes the other item (which refreshes its ``lease_acquired``),
        # so the paper's lookups never pick it beside that one (they may have answered it
        # already: held to its end). Should we stop before the adoption, readers resolve the
        # pending mapping (rule 2).
        ours = ((m.client_id, m.resource), m.token)
        return (yield from adopt_paper_lease(d, pool, key, [s.item], m.ver, ours))
    return (yield from confirm_now(s.mapping))


def confirm_now(m: Mapping) -> Program[D.Serve | None]:
    """Write the pending mapping ``m`` live; serve it once that applied (None: it lost to
    another daemon's settling, read again; unknown: an error, the state left as it is)."""
    assert m.token is not None
    res = yield Send(map_confirm(m), confirmed(m.token))
    yield Note(f"acq.confirm_{res.outcome.value}")
    if res.outcome is Outcome.APPLIED:
        return D.Serve(lease_from_mapping(m))
    if res.outcome is Outcome.REJECTED and res.error is None:
        return None
    raise res.error or Timeout("confirmation outcome unknown")


def end_lapsed(d: Daemon, m: Mapping) -> Program[None]:
    """``legacy.EndLapsed``: release the mapping at the version read (an extension that
    landed since makes this a lost race: read again), then free the resource in the
    background (held to its end, as every free beside the paper's agent)."""
    assert m.token is not None
    now = yield Now()
    res = yield Send(map_release(m.ident, m.token, now, m.ver), no_token(m.token))
    if res.outcome is Outcome.APPLIED:
        yield Note("lease.ended_lapsed")
        yield Spawn(free_claim, (d, (m.client_id, m.resource or ""), m.key, m.token))
        return
    if res.outcome is Outcome.REJECTED and res.error is None:
        return
    raise res.error or Timeout("release outcome unknown")


def acquire(
    d: Daemon, pool: Pool, key: str, requested_us: int, expect_ver: int
) -> Program[Lease | Mapping | None]:
    """Claim a candidate and name it in the key's mapping, both in one round trip.
    None: re-read (someone else wrote the mapping first). With ``legacy_agents`` a won
    claim is returned as its pending mapping, for the caller to settle."""
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
            yield Miss(pool)
            raise NoCapacity(f"no free resource in pool {pool.pool_id!r} in {d.region}")
        item: ResourceItem = cand.item
        now = yield Now()
        mw = map_acquire(
            ident, expect_ver, token, item.resource, item.version, requested_us, now, d.owner
        )
        cw = claim(item, key, requested_us, now, token, expect_ver + 1)
        sent = yield Mono()
        yield RefillSoon(pool)
        mres, cres = yield Together(
            (Send(mw, names_claim(token, item.resource)), Send(cw, holds(token, key)))
        )
        if cres.outcome is Outcome.UNKNOWN or cres.error is not None:
            # not refused by its condition: the item may still be free at this version
            yield Untake(pool, cand)
        step = d.ops.after_acquire(mres.outcome, cres.outcome, expect_ver)
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
            yield Spawn(free_claim, (d, item.ident, key, token, True))
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
        raise _error_of(mres, cres) or Timeout(step.why)


# ------------------------------------------------------------------- background writes
def confirm(m: Mapping) -> Program[None]:
    """Write a pending mapping ``live`` (its claim has landed)."""
    yield Deadline(BACKGROUND_DEADLINE)
    res = yield Send(map_confirm(m))
    yield Note(f"acq.confirm_{res.outcome.value}")


def free_claim(
    d: Daemon, ident: ItemKey, key: str, token: str, give_back: bool = False, attempt: int = 0
) -> Program[None]:
    """Free a claim that no mapping names, with quarantine (docs/design.md). Retried for
    about a minute (``attempt``: this one's number, from 0); if the daemon dies first, the
    liberator's orphan repair frees it. ``give_back``: the claim of an acquisition that lost
    (the rules may free it sooner). With ``legacy_agents`` not before the lease's end plus
    the skew either: the paper's agent answers any lease it finds in the leased index, to
    its end, and is never told of a release (the end is read first, and the free is
    conditional on it)."""
    if attempt >= d.free_claim_attempts:
        return
    yield Deadline(BACKGROUND_DEADLINE)
    error = yield from free_once(d, ident, key, token, give_back)
    if error is _AGAIN:
        return (yield from goto(free_claim, d, ident, key, token, give_back, attempt + 1))
    if error is None:
        return
    yield Note(
        "claim_not_given_back",
        (("resource", ident[1]), ("key", key), ("attempt", attempt + 1), ("error", str(error))),
        "warning",
    )
    yield Sleep(min(2.0**attempt, 16.0), bounded=False)
    return (yield from goto(free_claim, d, ident, key, token, give_back, attempt + 1))


def give_back_now(d: Daemon, ident: ItemKey, key: str, token: str) -> Program[None]:
    """:func:`free_claim` within a request (its deadline, no backoff): an error is raised,
    not retried; a free refused because the lease was extended since its end was read is
    tried again (at most ``free_claim_attempts`` times in all)."""
    for _ in range(d.free_claim_attempts):
        error = yield from free_once(d, ident, key, token, False)
        if error is None:
            return
        if error is not _AGAIN:
            raise error


class _Again(RasdError):
    """:func:`free_once`: extended since its end was read; read the end again."""


_AGAIN = _Again("extended since read")


def free_once(
    d: Daemon, ident: ItemKey, key: str, token: str, give_back: bool
) -> Program[RasdError | None]:
    """One attempt of :func:`free_claim`. Returns None when done (freed, or not ours any
    more), ``_AGAIN`` when the lease was extended since its end was read, or the error."""
    now = yield Now()
    available = now + d.ops.quarantine_us(d.rules, give_back)
    ends: int | None = None
    outcome, error = Outcome.UNKNOWN, None
    if d.legacy_agents:
        try:
            r = yield from resource(ident[0], ident[1])
        except RasdError as exc:
            error = exc
        else:
            if r is None or r.holder != token or r.key != key:
                return None  # not ours any more
            ends = r.lease_expires_us
        if ends is not None:
            available = max(available, ends + d.rules.grace_us)
    if not d.legacy_agents or ends is not None:
        w = d.ops.free_claim(ident, key, token, now, available, ends)
        res = yield Send(w, not_held_by(token))
        outcome, error = res.outcome, res.error
        if outcome is Outcome.REJECTED and error is None and ends is not None:
            return _AGAIN
    if outcome is not Outcome.UNKNOWN and error is None:
        yield Note(f"acq.free_claim_{outcome.value}")
        if outcome is Outcome.APPLIED and available - now <= RELIST_MAX_WAIT_US:
            yield RelistLater(ident, available)
        return None
    yield Note("acq.free_claim_errors")
    return error or Timeout("give-back outcome unknown")


def relist(ident: ItemKey, until_us: int) -> Program[None]:
    """Put an item this daemon quarantined back in the available index once the quarantine
    is over (read strongly consistent, then ``relist``, conditional on what was read). Best
    effort: if the daemon stops first, ``ras-liberator`` re-lists it."""
    now = yield Now()
    yield Sleep(max(0.0, (until_us - now) / US) + RELIST_SLACK, bounded=False)
    yield Deadline(BACKGROUND_DEADLINE)
    try:
        r = yield from resource(ident[0], ident[1])
        now = yield Now()
        if r is None or r.quarantine_until is None or r.quarantine_until > fmt_time(now):
            return  # taken, re-listed, or quarantined again (by its own freer) since
        res = yield Send(B.relist(r, now))
        yield Note(f"quarantine.relist_{res.outcome.value}")
    except RasdError as exc:
        yield Note("quarantine.relist_errors")
        yield Note("relist_failed", (("resource", ident[1]), ("error", str(exc))), "warning")


def fence_own_claim(d: Daemon, item: ResourceItem, key: str, token: str) -> Program[None]:
    """Our claim's outcome is unknown and no mapping names it: make sure it never lands,
    or give it back if it did."""
    yield Deadline(BACKGROUND_DEADLINE)
    res = yield Send(fence_resource(item.ident, item.version))
    if res.outcome is Outcome.APPLIED:
        return
    cur = yield from resource(item.client_id, item.resource)
    if cur is not None and cur.holder == token:
        return (yield from free_claim(d, item.ident, key, token))


# ---------------------------------------------------------- extension and re-confirmation
def extend(d: Daemon, lease: Lease, requested_us: int) -> Program[tuple[D.ExtendStep, Any]]:
    """The resource first, then the mapping: the mapping's end never passes the
    resource's. Returns the step and the last write's result."""
    want = fmt_time(requested_us)
    res = yield Send(extend_resource(lease, requested_us), extended_to(lease.token, want))
    mres = None
    if res.outcome is Outcome.APPLIED:
        mres = yield Send(map_extend(lease, requested_us), map_extended_to(lease.token, want))
    step = d.ops.after_extend(res.outcome, mres.outcome if mres else None)
    if isinstance(step, D.CheckMapping):
        try:
            got = yield GetItem((map_pk(lease.client_id, lease.pool_id, lease.key), lease.region))
        except RasdError as exc:  # unknown: leave any orphan to the liberator's repair
            return D.Forget(f"mapping unreadable: {exc}"), mres or res
        step = d.ops.on_extend_check(mapping_from(got) if got else None, lease)
    if isinstance(step, D.FreeOrphan):
        yield Note("lease.extend_orphaned")
        assert lease.token is not None
        yield Spawn(free_claim, (d, (lease.client_id, lease.resource), lease.key, lease.token))
    return step, mres or res


def extend_now(d: Daemon, m: Mapping, requested_us: int) -> Program[Lease | None]:
    """Our lease is too close to its end to serve: extend it (None: re-read)."""
    lease = lease_from_mapping(m)
    now = yield Now()
    if requested_us <= lease.expires_us:
        # The caller asks for no more than the lease has: it is valid until its end.
        return lease if lease.expires_us > now else None
    sent = yield Mono()
    step, last = yield from extend(d, lease, requested_us)
    if isinstance(step, D.Extended):
        new = replace(lease, expires_us=requested_us)
        yield CachePut(new, sent)
        yield Note("lease.extended")
        return new
    if last.outcome is Outcome.UNKNOWN or (
        last.error is not None and last.outcome is not Outcome.APPLIED
    ):
        raise last.error or Timeout("extension outcome unknown")
    if isinstance(step, D.Forget):
        # The resource write lost: if the resource is no longer ours the lease is over
        # (liberated), and the mapping is ended so the key can acquire again.
        r = yield from resource(m.client_id, lease.resource)
        if r is None or r.holder != m.token:
            assert m.token is not None
            yield Send(map_release(m.ident, m.token, now))
            yield Note("lease.ended_lapsed")
    return None


def extend_bg(d: Daemon, lease: Lease, requested_us: int) -> Program[RasdError | None]:
    """A hit asked for more than a sliding lease has left: extend it in the background.
    Returns None when done (extended, or lost and forgotten), else the error to retry
    after (the driver's backoff)."""
    yield Deadline(BACKGROUND_DEADLINE)
    sent = yield Mono()
    step, last = yield from extend(d, lease, requested_us)
    if isinstance(step, D.Extended):
        yield CachePut(replace(lease, expires_us=requested_us), sent)
        yield Note("lease.extended")
        return None
    if last.outcome is Outcome.REJECTED and last.error is None:
        # Lost: someone else extended, released or liberated it. Forget it here; the next
        # request reads the truth.
        yield Note("lease.extend_conflicts")
        yield CacheDrop((lease.client_id, lease.pool_id, lease.key))
        return None
    error: RasdError = last.error or Timeout("extension outcome unknown")
    return error


def reconfirm(d: Daemon, pool: Pool, lease: Lease) -> Program[None]:
    """A cached answer is past S/2: read the mapping again (I3). Still the same lease:
    confirmed as of this read. Anything else: dropped, the next request resolves it."""
    yield Deadline(BACKGROUND_DEADLINE)
    try:
        sent = yield Mono()
        own, others = yield from read(d, pool, lease.key)
        dec = d.ops.on_read(own, others, (yield Now()), d.rules)
        if (
            isinstance(dec, D.Serve)
            and dec.lease.resource == lease.resource
            and dec.lease.token == lease.token
        ):
            yield CachePut(dec.lease, sent)
            yield Note("lease.reconfirmed")
        else:
            yield CacheDrop((lease.client_id, lease.pool_id, lease.key))
            yield Note("lease.reconfirm_dropped")
    except RasdError as exc:
        yield Note("lease.reconfirm_errors")  # served until S, then dropped
        yield Note("reconfirm_failed", (("key", lease.key), ("error", str(exc))), "warning")


# ---------------------------------------------------------------------------- release
def release(
    d: Daemon, pool: Pool, key: str, wait: float = WAIT_FIRST, first: bool = True
) -> Program[int]:
    """Give back the key's lease in our region: the mapping first, then the resource with
    quarantine (docs/design.md, I3). Returns 1, or raises NotHeld. A round that must read
    again goes on as the next round (``Tail``)."""
    ops = d.ops
    k = (pool.client_id, pool.pool_id, key)
    if first:
        yield CacheDrop(k)
    own, others = yield from read(d, pool, key)
    now = yield Now()
    dec = ops.on_release_read(own, now, d.rules)
    if isinstance(dec, D.Verify):
        r = yield from resource(pool.client_id, dec.mapping.resource or "")
        dec = ops.on_release_resource(dec.mapping, r, now, d.rules)
    if isinstance(dec, D.NotHeld):
        held = sorted(m.region for m in others if D.servable(m, now, d.rules))
        if held:
            raise NotHeld(f"{key!r} holds no lease in {d.region} (held in {', '.join(held)})")
        raise NotHeld(f"{key!r} holds no lease in pool {pool.pool_id!r}")
    if isinstance(dec, D.ReleaseLease):
        lease = dec.lease
        assert lease.token is not None and own is not None
        res = yield Send(map_release(own.ident, lease.token, now), no_token(lease.token))
        if res.outcome is Outcome.REJECTED and res.error is None:
            # changed under us: read again
            return (yield from goto(release, d, pool, key, wait, False))
        if res.outcome is not Outcome.APPLIED:
            raise res.error or Timeout("release outcome unknown")
        yield CacheDrop(k)
        yield Note("lease.released", (("token", lease.token),))
        # The resource: quarantined, so caches elsewhere run out first. If this write is lost
        # the liberator's orphan repair frees it (also with quarantine).
        free = yield Spawn(free_claim, (d, (pool.client_id, lease.resource), key, lease.token))
        if d.legacy_agents:
            # The paper's agent answers whatever the leased index shows for the key: answer
            # the release once the resource no longer shows it, so that the key's next lease
            # (here, or the paper agent's) cannot overlap the one released. Within the
            # deadline; the free goes on in the background.
            yield Join(free)
        return 1
    if isinstance(dec, D.DropMapping):
        yield Send(map_drop_dead(dec.mapping, now))
        return (yield from goto(release, d, pool, key, wait, False))
    if isinstance(dec, D.FenceResource):
        yield from fence(dec.resource)
        return (yield from goto(release, d, pool, key, wait, False))
    wait = yield from wait_for(wait)
    return (yield from goto(release, d, pool, key, wait, False))


def _error_of(*results: Any) -> RasdError | None:
    return next((r.error for r in results if r.error is not None), None)


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

"""Releasing and giving back: the daemon's programs that free what it held.

Theory of operation
-------------------
:func:`release` gives the key's lease back: the mapping first, then the resource with
quarantine (docs/design.md, I3). :func:`free_claim` frees a claim no mapping names (a lost
acquisition's, a released lease's resource, a claim yielded to the paper's agent's lease),
retried in the background. :func:`relist` puts what this daemon quarantined back in the
available index once the quarantine is over; :func:`fence_own_claim` makes sure a claim whose
outcome is unknown never lands. Part of the daemon's programs (:mod:`rasd.steps.daemon`).
"""

from __future__ import annotations

from ..core import builders, decide
from ..core.builders import fence_resource
from ..core.decide import Freed, NeverNamed, Outcome
from ..core.errors import NotHeld, RasdError, Timeout
from ..core.lease import US, Pool, ResourceItem, fmt_time
from ..core.map_builders import map_drop_dead, map_release, no_token, not_held_by
from ..core.writes import ItemKey
from . import Join, Note, Now, Program, Send, Sleep, Spawn, goto
from .daemon import (
    BACKGROUND_DEADLINE,
    RELIST_MAX_WAIT_US,
    RELIST_SLACK,
    WAIT_FIRST,
    CacheDrop,
    DaemonContext,
    Deadline,
    RelistLater,
    fence_or_wait,
    read,
    resource,
)


def free_claim(
    d: DaemonContext,
    ident: ItemKey,
    key: str,
    token: str,
    why: Freed = Freed.RELEASED,
    pool_q_us: int = 0,
    attempt: int = 0,
) -> Program[None]:
    """Free a claim that no mapping names, with quarantine (docs/design.md). Retried for
    about a minute (``attempt``: this one's number, from 0); if the daemon dies first, the
    liberator's orphan repair frees it. ``why`` says what the free waits for
    (``decide.holds_to_end``): a lease no app released, or any free while the paper's agent
    may run, not before the lease's end plus the skew either (the end is read first, and the
    free is conditional on it); a claim no mapping ever named (``decide.given_back``) may be
    freed sooner. ``pool_q_us``: a released lease's pool's own quarantine (0: none), which
    is kept when longer than Q (a pool with an outage budget: docs/design.md)."""
    if attempt >= d.free_claim_attempts:
        return
    yield Deadline(BACKGROUND_DEADLINE)
    error = yield from free_once(d, ident, key, token, why, pool_q_us)
    if error is _AGAIN:
        return (yield from goto(free_claim, d, ident, key, token, why, pool_q_us, attempt + 1))
    if error is None:
        return
    yield Note(
        "claim_not_given_back",
        (("resource", ident[1]), ("key", key), ("attempt", attempt + 1), ("error", str(error))),
        "warning",
    )
    yield Sleep(min(2.0**attempt, 16.0), bounded=False)
    return (yield from goto(free_claim, d, ident, key, token, why, pool_q_us, attempt + 1))


class _Again(RasdError):
    """:func:`free_once`: extended since its end was read; read the end again."""


_AGAIN = _Again("extended since read")


def free_once(
    d: DaemonContext, ident: ItemKey, key: str, token: str, why: Freed, pool_q_us: int = 0
) -> Program[RasdError | None]:
    """One attempt of :func:`free_claim`. Returns None when done (freed, or not ours any
    more), ``_AGAIN`` when the lease was extended since its end was read, or the error."""
    now = yield Now()
    available = now + d.ops.quarantine_us(d.rules, why is Freed.UNNAMED, pool_q_us)
    ends: int | None = None
    outcome, error = Outcome.UNKNOWN, None
    to_end = d.ops.holds_to_end(why, d.legacy_agents)
    if to_end:
        try:
            r = yield from resource(ident[0], ident[1])
        except RasdError as exc:
            error = exc
        else:
            if r is None or r.holder != token or not r.holder_current or r.key != key:
                return None  # not ours any more (a stale holder: the paper's lease now)
            ends = r.lease_expires_us
        if ends is not None:
            available = max(available, ends + d.rules.grace_us)
    if not to_end or ends is not None:
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
        res = yield Send(builders.relist(r, now))
        yield Note(f"quarantine.relist_{res.outcome.value}")
    except RasdError as exc:
        yield Note("quarantine.relist_errors")
        yield Note("relist_failed", (("resource", ident[1]), ("error", str(exc))), "warning")


def fence_own_claim(
    d: DaemonContext, item: ResourceItem, key: str, token: str, proof: NeverNamed | None = None
) -> Program[None]:
    """Our claim's outcome is unknown and no mapping names it: make sure it never lands,
    or give it back if it did (``proof``: that no mapping ever named it)."""
    yield Deadline(BACKGROUND_DEADLINE)
    res = yield Send(fence_resource(item.ident, item.version))
    if res.outcome is Outcome.APPLIED:
        return
    cur = yield from resource(item.client_id, item.resource)
    if cur is not None and cur.holder == token and cur.holder_current:
        return (yield from free_claim(d, item.ident, key, token, d.ops.given_back(proof)))


def release(
    d: DaemonContext, pool: Pool, key: str, wait: float = WAIT_FIRST, first: bool = True
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
    if isinstance(dec, decide.Verify):
        r = yield from resource(pool.client_id, dec.mapping.resource or "")
        dec = ops.on_release_resource(dec.mapping, r, now, d.rules)
    if isinstance(dec, decide.NotHeld):
        held = sorted(m.region for m in others if decide.servable(m, now, d.rules))
        if held:
            raise NotHeld(f"{key!r} holds no lease in {d.region} (held in {', '.join(held)})")
        raise NotHeld(f"{key!r} holds no lease in pool {pool.pool_id!r}")
    if isinstance(dec, decide.ReleaseLease):
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
        free = yield Spawn(
            free_claim,
            (
                d,
                (pool.client_id, lease.resource),
                key,
                lease.token,
                Freed.RELEASED,
                pool.quarantine_us,
            ),
        )
        if d.legacy_agents:
            # The paper's agent answers whatever the leased index shows for the key: answer
            # the release once the resource no longer shows it, so that the key's next lease
            # (here, or the paper agent's) cannot overlap the one released. Within the
            # deadline; the free goes on in the background.
            yield Join(free)
        return 1
    if isinstance(dec, decide.DropMapping):
        yield Send(map_drop_dead(dec.mapping, now))
        return (yield from goto(release, d, pool, key, wait, False))
    wait = yield from fence_or_wait(dec, wait)
    return (yield from goto(release, d, pool, key, wait, False))

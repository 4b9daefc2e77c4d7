"""Settling beside the paper's agent: the daemon's programs when both share the table
(:func:`beside_legacy`, :func:`adopt_paper_lease`, :func:`end_lapsed`; docs/design.md, "Two
agents acquiring one key at once").
"""

from __future__ import annotations

from ..core import decide
from ..core import legacy as legacy_rules
from ..core.builders import adopt
from ..core.decide import Outcome, lease_from_mapping, pick
from ..core.errors import Timeout
from ..core.lease import PENDING, Mapping, Pool, ResourceItem
from ..core.map_builders import (
    confirmed,
    holds,
    map_acquire,
    map_confirm,
    map_release,
    names_claim,
    no_token,
)
from ..core.serialize import resource_from
from ..core.writes import ItemKey
from . import Join, Note, Now, QueryLeased, Send, Spawn
from .daemon import (
    WAIT_FIRST,
    DaemonContext,
    DaemonProgram,
    NewToken,
    error_of,
    fence_or_wait,
    resource,
)
from .give_back import free_claim
from .renew import confirm


def adopt_paper_lease(
    d: DaemonContext,
    pool: Pool,
    key: str,
    held: list[ResourceItem],
    expect_ver: int,
    give_back: tuple[ItemKey, str] | None = None,
) -> DaemonProgram[decide.Decision | None]:
    """The key has no lease in our mapping, but the leased index shows a resource of our
    region held for it: a lease of the paper's agent. Read the item (strongly consistent);
    if it is a running lease of the key, name it in the mapping (at the version read, like
    any acquisition), then record our token on the item (conditional on the version read).
    Returns what to do next: serve or extend the adopted lease, acquire (nothing to adopt,
    or it changed before our write: the mapping is then ours at the next version), or None
    to read again (another daemon wrote the mapping). ``give_back``: a claim of ours (item,
    token) the pending mapping named, given back once the mapping names the other lease."""
    now = yield from Now()
    cid, pid = pool.client_id, pool.pool_id
    hint = pick([it for it in held if legacy_rules.adoptable(it, cid, pid, key, d.region, now)])
    if hint is None:
        return decide.Acquire(expect_ver)
    r = yield from resource(cid, hint.resource)
    now = yield from Now()
    if r is None or not legacy_rules.adoptable(r, cid, pid, key, d.region, now):
        return decide.Acquire(expect_ver)
    assert r.lease_expires_us is not None
    token = yield from NewToken()
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
    mres = yield from Send(mw, names_claim(token, r.resource))
    ares = None
    if mres.outcome is Outcome.APPLIED:
        if give_back is not None:  # the mapping names the lease now, not yet adopted
            # Our claim is named by no mapping from here on: its give-back runs on its own,
            # retried, whatever becomes of this request (its deadline may pass now), and
            # the adoption waits for it (a deadline passed, the adoption is not sent).
            free = yield from Spawn(
                free_claim, (d, give_back[0], key, give_back[1], decide.Freed.UNRELEASED)
            )
            yield Join(free)
        ares = yield from Send(adopt(r, token, expect_ver + 1, now), holds(token, key))
    # The writes went one after the other: the adoption is sent only once the mapping names
    # it, so it never holds a lease that no mapping can name.
    step = d.ops.after_acquire(mres.outcome, ares.outcome if ares else Outcome.REJECTED, expect_ver)
    if isinstance(step, decide.Won):
        assert ares is not None and ares.item is not None
        yield Note("lease.adopted")
        dec = d.ops.on_resource(m, resource_from(ares.item), (yield from Now()), d.rules)
        if isinstance(dec, decide.Serve) and dec.confirm is not None:
            # Settled already: the lease is the paper agent's own. Confirmed before it is
            # served, as a settled claim is (readers wait for it meanwhile).
            return (yield from confirm_now(dec.confirm))
        if isinstance(dec, decide.Extend):
            return decide.Extend(dec.mapping)  # settled already, as above: extended, not settled
        return dec
    if isinstance(step, decide.NextCandidate):
        yield Note("lease.adopt_lost")
        return decide.Acquire(step.expect_ver)
    if isinstance(step, decide.Reread):
        return None
    yield Note("acq.gave_up")
    raise error_of(mres, *(() if ares is None else (ares,))) or Timeout("adoption outcome unknown")


def beside_legacy(
    d: DaemonContext,
    pool: Pool,
    key: str,
    dec: decide.Decision | legacy_rules.Settle,
    answer_first: bool = False,
) -> DaemonProgram[decide.Decision | None]:
    """With ``legacy_agents``, a pending mapping whose claim landed is settled, not served
    (``legacy.beside_legacy``): the leased index read once more, then the mapping confirmed
    and served, or the paper's agent's lease adopted instead. None: read again, as after
    settling a mapping the request would have extended (its lease too close to its end):
    the next round extends what the settling left live.
    ``answer_first``: the mapping is the acquisition this call just made (see :func:`settle`)."""
    while True:
        b = d.ops.beside_legacy(dec)
        if not isinstance(b, legacy_rules.Settle):
            return b
        settled = yield from settle(d, pool, key, b.mapping, answer_first)
        answer_first = False
        if settled is None or isinstance(dec, decide.Extend):
            return None
        dec = settled


def settle(
    d: DaemonContext, pool: Pool, key: str, m: Mapping, answer_first: bool = False
) -> DaemonProgram[decide.Decision | None]:
    """A pending mapping ``m`` whose claim landed: read the leased index (now, after the
    claim landed) and ask ``legacy.on_settle``. Confirm: ``map_confirm``, and serve once it
    applied (None: it lost, read again). YieldTo: adopt the paper's lease at ``m``'s
    version, once our claim is given back.

    ``answer_first``: ``m`` is the acquisition this call made. Confirm then serves at once
    and confirms in the background: a reader that settles ``m`` meanwhile decides as this
    call did, from the same items (``legacy.rival`` judges a claim's age against ``m``'s
    start, not the reader's clock), except for a lease of the paper's agent made after this
    read began, which the paper's agent made second (docs/design.md, "Two agents acquiring
    one key at once")."""
    assert m.token is not None and m.resource is not None
    held = yield from QueryLeased(pool.client_id, pool.pool_id, key)
    s = d.ops.on_settle(m, list(held), (yield from Now()), d.rules.grace_us)
    if isinstance(s, decide.Wait):
        yield from fence_or_wait(s, WAIT_FIRST)
        return None  # read again
    if isinstance(s, legacy_rules.YieldTo):
        yield Note("lease.yielded")
        # The adoption's mapping write, at the pending version, names the other lease: our
        # claim can then no longer be confirmed, and no daemon served it. It is given back
        # before the adoption writes the other item (which refreshes its ``lease_acquired``),
        # so the paper's lookups never pick it beside that one (they may have answered it
        # already: held to its end). Should we stop before the adoption, readers resolve the
        # pending mapping (rule 2).
        ours = ((m.client_id, m.resource), m.token)
        return (yield from adopt_paper_lease(d, pool, key, [s.item], m.ver, ours))
    if answer_first:
        yield Spawn(confirm, (s.mapping, True))
        return decide.Serve(lease_from_mapping(s.mapping))
    return (yield from confirm_now(s.mapping))


def confirm_now(m: Mapping) -> DaemonProgram[decide.Serve | None]:
    """Write the pending mapping ``m`` live; serve it once that applied (None: it lost to
    another daemon's settling, read again; unknown: an error, the state left as it is)."""
    assert m.token is not None
    res = yield from Send(map_confirm(m), confirmed(m.token))
    yield Note(f"acq.confirm_{res.outcome.value}")
    if res.outcome is Outcome.APPLIED:
        return decide.Serve(lease_from_mapping(m))
    if res.outcome is Outcome.REJECTED and res.error is None:
        return None
    raise res.error or Timeout("confirmation outcome unknown")


def end_lapsed(d: DaemonContext, m: Mapping) -> DaemonProgram[None]:
    """``legacy.EndLapsed``: release the mapping at the version read (an extension that
    landed since makes this a lost race: read again), then free the resource in the
    background (held to its end, as every free beside the paper's agent)."""
    assert m.token is not None
    now = yield from Now()
    res = yield from Send(map_release(m.ident, m.token, now, m.ver), no_token(m.token))
    if res.outcome is Outcome.APPLIED:
        yield Note("lease.ended_lapsed")
        ident = (m.client_id, m.resource or "")
        yield Spawn(free_claim, (d, ident, m.key, m.token, decide.Freed.UNRELEASED))
        return
    if res.outcome is Outcome.REJECTED and res.error is None:
        return
    raise res.error or Timeout("release outcome unknown")

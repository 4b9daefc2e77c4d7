"""Strict pools: the daemon's programs that agree a key's lease in the pool's home region.

Theory of operation
-------------------
:func:`agree` runs before a daemon answers a claim of its own region in a strict pool (the
acquisition that just won it, or a reader that found its pending mapping's claim landed): it
writes the key's agreement item A in the home region (``rasd.core.agree``) and answers what A
names. Our claim named: answer it. Another region's lease named: answer that one, and give
our claim back with :func:`withdraw` (it was never answered). :func:`extend_agreement` is an
extension's second write, after the resource's and before the mapping's. Part of the
daemon's programs (:mod:`rasd.steps.daemon`); the argument is in docs/design.md, "Strict
pools".
"""

from __future__ import annotations

from ..core import agree as agree_rules
from ..core.decide import Outcome
from ..core.errors import RasdError, Unavailable
from ..core.lease import Lease, Mapping, Pool, fmt_time
from ..core.map_builders import map_drop_dead
from . import At, GetItem, Note, Now, Program, Send, Spawn, goto
from .daemon import BACKGROUND_DEADLINE, WAIT_FIRST, DaemonContext, Deadline, wait_for
from .give_back import free_claim


def agree(
    d: DaemonContext,
    pool: Pool,
    home: str,
    m: Mapping,
    seen: tuple[Mapping, ...],
    expect: int | None = 0,
    wait: float = WAIT_FIRST,
) -> Program[Lease | None]:
    """Agree ``m`` (our region's pending mapping; its claim landed) in ``home``. None: A names
    it (or the home region is down and ``home_down`` is "local"): answer it. A lease: another
    region's, that A names: answer it instead (``m`` is withdrawn in the background).
    ``seen``: the key's mappings as read (ours consistently, others through our replica).
    ``expect``: A's version to write at (0: absent, a new key's one write); None: read A
    first."""
    ident = agree_rules.agree_key(m.client_id, m.pool_id, m.key)
    assert m.token is not None
    if expect is not None:
        res = yield At(
            home, Send(agree_rules.agree_write(ident, expect, m), agree_rules.names(m.token))
        )
        if res.outcome is Outcome.APPLIED:
            yield Note("strict.agreed")
            return None
        if res.error is not None:
            return (yield from home_down(d, pool, home, m, res.error))
    try:
        got = yield At(home, GetItem(ident))
    except RasdError as exc:
        return (yield from home_down(d, pool, home, m, exc))
    step = d.ops.on_agreement(
        agree_rules.agreement_from(got),
        m,
        list(seen),
        (yield Now()),
        d.rules.margin_us,
        d.rules.grace_us,
    )
    if isinstance(step, agree_rules.Agreed):
        yield Note("strict.agreed")
        return None
    if isinstance(step, agree_rules.Propose):
        return (yield from goto(agree, d, pool, home, m, seen, step.expect_ver, wait))
    if isinstance(step, agree_rules.Defer):
        yield Note("strict.deferred")
        yield Spawn(withdraw, (d, m))
        return step.lease
    wait = yield from wait_for(wait)
    return (yield from goto(agree, d, pool, home, m, seen, None, wait))


def home_down(
    d: DaemonContext, pool: Pool, home: str, m: Mapping, exc: RasdError
) -> Program[Lease | None]:
    """The home region did not answer: fail the request, leaving the claim for a later
    request to agree, or (``home_down`` "local") answer it unagreed, counted."""
    yield Note("strict.home_unreachable")
    if d.home_down == "local":
        yield from fallback(pool.pool_id, m.key, m.token, exc)
        return None
    raise Unavailable(
        f"home region {home} of strict pool {pool.pool_id!r} unreachable, the new lease is not "
        f"agreed: {exc}"
    )


def withdraw(d: DaemonContext, m: Mapping) -> Program[None]:
    """Give back a claim that lost the agreement: its pending mapping freed (only at the
    version it had, so a claim some daemon confirmed meanwhile stays), then the resource.
    Its mapping named it, so a reader may have answered it before the agreement was read
    (the home-down fallback answers a pending claim before its confirmation lands): it
    stays unclaimable to its lease's end plus the skew (``decide.given_back``)."""
    yield Deadline(BACKGROUND_DEADLINE)
    res = yield Send(map_drop_dead(m, (yield Now())))
    if res.outcome is not Outcome.APPLIED:
        yield Note("strict.withdraw_left")  # answered, changed, or unknown: the lease runs out
        return
    assert m.token is not None and m.resource is not None
    yield Note("strict.withdrawn")
    why = d.ops.given_back(None)  # named: no proof that nobody answered it
    yield from free_claim(d, (m.client_id, m.resource), m.key, m.token, why)


def extend_agreement(d: DaemonContext, home: str, lease: Lease, requested_us: int) -> Program[bool]:
    """An extension's second write: A's end, while A names the lease. False: A names another
    lease, and the extension must not go on. Raises when the home region does not answer
    (unless ``home_down`` is "local": then the extension goes on, counted)."""
    assert lease.token is not None
    ident = agree_rules.agree_key(lease.client_id, lease.pool_id, lease.key)
    want = fmt_time(requested_us)
    reached = agree_rules.agreed_to(lease.token, want)
    res = yield At(home, Send(agree_rules.agree_extend(ident, lease.token, requested_us), reached))
    if res.outcome is Outcome.APPLIED:
        return True
    error = res.error
    if error is None:  # refused: A names another lease, or already reaches that far
        try:
            got = yield At(home, GetItem(ident))
            return got is not None and reached(got)
        except RasdError as exc:
            error = exc
    if d.home_down != "local":
        raise error
    yield from fallback(lease.pool_id, lease.key, lease.token, error)
    return True


def fallback(pool_id: str, key: str, token: str | None, error: RasdError) -> Program[None]:
    """A lease answered or extended without the home region (``home_down`` "local"): counted,
    and logged with its token (the checker exempts that lease from I2 across regions)."""
    yield Note("strict.fallback")
    fields = (("pool", pool_id), ("key", key), ("token", token), ("error", str(error)))
    yield Note("strict_fallback", fields, "warning")

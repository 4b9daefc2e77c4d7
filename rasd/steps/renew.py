"""Renewing and confirming: the daemon's programs that keep a lease it serves.

Theory of operation
-------------------
:func:`confirm` writes a pending mapping live once its claim landed. :func:`extend` extends a
lease, the resource first, then (a strict pool) the agreement, then the mapping (the
mapping's end never passes the agreement's, nor the agreement's the resource's):
within a request (:func:`extend_now`, a lease too close to its end to serve) or in the
background after a hit (:func:`extend_bg`). :func:`reconfirm` reads a cached answer's mapping
again past S/2 (docs/design.md, I3). Part of the daemon's programs (:mod:`rasd.steps.daemon`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..core import decide
from ..core import legacy as legacy_rules
from ..core.builders import extend_resource
from ..core.decide import Outcome, lease_from_mapping
from ..core.errors import RasdError, Timeout
from ..core.lease import US, Lease, Mapping, Pool, fmt_time, map_pk
from ..core.map_builders import extended_to, map_confirm, map_extend, map_extended_to, map_release
from ..core.serialize import mapping_from
from . import GetItem, Mono, Note, Now, Program, Send, Spawn, WriteResult
from .daemon import (
    BACKGROUND_DEADLINE,
    CacheDrop,
    CachePut,
    DaemonContext,
    Deadline,
    read,
    read_key,
    resource,
)
from .give_back import free_claim
from .strict import extend_agreement


def confirm(m: Mapping, drop: bool = False) -> Program[None]:
    """Write a pending mapping ``live`` (its claim has landed). ``drop``: if the write is
    refused (a daemon settling the mapping decided first), forget the cached answer, so that
    the next request reads what it decided."""
    yield Deadline(BACKGROUND_DEADLINE)
    res = yield Send(map_confirm(m))
    yield Note(f"acq.confirm_{res.outcome.value}")
    if drop and res.outcome is Outcome.REJECTED:
        yield CacheDrop((m.client_id, m.pool_id, m.key))


def extend(
    d: DaemonContext, lease: Lease, requested_us: int, resent_us: int = 0
) -> Program[tuple[decide.ExtendStep, Any]]:
    """The resource first, then (a strict pool) the agreement, then the mapping: no end
    passes the one before it. Returns the step and the last write's result. ``resent_us``:
    how long after it is built the extension's write may still be sent again (its program's
    deadline)."""
    want = fmt_time(requested_us)
    home = d.ops.strict_home(d, lease.client_id, lease.pool_id)
    # Beside the paper's agent the extension must land before the lease's end (its lookup
    # takes the end as final): conditioned on an end past the floor as it is sent.
    floor = (
        legacy_rules.extend_floor((yield Now()) + resent_us, d.rules) if d.legacy_agents else None
    )
    w = extend_resource(lease, requested_us, floor)
    res = yield Send(w, extended_to(lease.token, want))
    mres = None
    if res.outcome is Outcome.APPLIED and home is not None and lease.region == d.region:
        # A strict pool: the agreement between the two, mapping <= agreement <= resource.
        # Another region's reader answers the agreement's end, and only a held resource
        # may back it; a lease whose agreement was taken over is not extended in the mapping.
        try:
            agreed = yield from extend_agreement(d, home, lease, requested_us)
        except RasdError as exc:
            return decide.Forget(f"home region unreachable: {exc}"), WriteResult(
                Outcome.UNKNOWN, error=exc
            )
        if not agreed:
            yield Note("strict.extend_refused")
            return decide.Forget("the agreement names another lease"), WriteResult(Outcome.REJECTED)
    if res.outcome is Outcome.APPLIED:
        mres = yield Send(map_extend(lease, requested_us), map_extended_to(lease.token, want))
    step = d.ops.after_extend(res.outcome, mres.outcome if mres else None)
    if isinstance(step, decide.CheckMapping):
        try:
            got = yield GetItem((map_pk(lease.client_id, lease.pool_id, lease.key), lease.region))
        except RasdError as exc:  # unknown: leave any orphan to the liberator's repair
            return decide.Forget(f"mapping unreadable: {exc}"), mres or res
        step = d.ops.on_extend_check(mapping_from(got) if got else None, lease)
    if isinstance(step, decide.FreeOrphan):
        yield Note("lease.extend_orphaned")
        assert lease.token is not None
        # No app released it: apps may use it to the end they were answered.
        ident = (lease.client_id, lease.resource)
        yield Spawn(free_claim, (d, ident, lease.key, lease.token, decide.Freed.UNRELEASED))
    return step, mres or res


def extend_now(d: DaemonContext, m: Mapping, requested_us: int) -> Program[Lease | None]:
    """Our lease is too close to its end to serve: extend it (None: re-read)."""
    lease = lease_from_mapping(m)
    now = yield Now()
    if requested_us <= lease.expires_us:
        # The caller asks for no more than the lease has: it is valid until its end.
        return lease if lease.expires_us > now else None
    sent = yield Mono()
    step, last = yield from extend(d, lease, requested_us)
    if isinstance(step, decide.Extended):
        new = replace(lease, expires_us=requested_us)
        yield CachePut(new, sent)
        yield Note("lease.extended")
        return new
    if last.outcome is Outcome.UNKNOWN or (
        last.error is not None and last.outcome is not Outcome.APPLIED
    ):
        raise last.error or Timeout("extension outcome unknown")
    if isinstance(step, decide.Forget):
        # The resource write lost: if the resource is no longer ours the lease is over
        # (liberated), and the mapping is ended so the key can acquire again.
        r = yield from resource(m.client_id, lease.resource)
        if r is None or r.holder != m.token or not r.holder_current:
            assert m.token is not None
            yield Send(map_release(m.ident, m.token, now))
            yield Note("lease.ended_lapsed")
    return None


def extend_bg(d: DaemonContext, lease: Lease, requested_us: int) -> Program[RasdError | None]:
    """A hit asked for more than a sliding lease has left: extend it in the background.
    With ``extend_read_first``, the key's mappings are read first, and a lease another host
    already extended far enough is served as read, nothing written. Returns None when done
    (extended, found extended, or lost and forgotten), else the error to retry after (the
    driver's backoff)."""
    yield Deadline(BACKGROUND_DEADLINE)
    sent = yield Mono()
    if d.extend_read_first:
        try:
            own, others = yield from read_key(d, lease.client_id, lease.pool_id, lease.key)
        except RasdError as exc:
            return exc
        now = yield Now()
        dec = d.ops.on_read(own, others, now, d.rules)
        got = d.ops.after_extend_read(dec, lease, requested_us, now, d.extend_fraction)
        if isinstance(got, decide.Forget):
            yield CacheDrop((lease.client_id, lease.pool_id, lease.key))
            yield Note("lease.extend_conflicts")
            return None
        if isinstance(dec, decide.Serve):  # still ours: confirmed as of this read
            yield CachePut(got or dec.lease, sent)
        if got is not None:
            yield Note("lease.extend_skipped")
            return None
        sent = yield Mono()
    step, last = yield from extend(d, lease, requested_us, int(BACKGROUND_DEADLINE * US))
    if isinstance(step, decide.Extended):
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


def reconfirm(d: DaemonContext, pool: Pool, lease: Lease) -> Program[None]:
    """A cached answer is past S/2: read the mapping again (I3). Still the same lease:
    confirmed as of this read. Anything else: dropped, the next request resolves it."""
    yield Deadline(BACKGROUND_DEADLINE)
    try:
        sent = yield Mono()
        own, others = yield from read(d, pool, lease.key)
        dec = d.ops.on_read(own, others, (yield Now()), d.rules)
        if isinstance(dec, decide.Serve) and decide.same_lease(dec.lease, lease):
            yield CachePut(dec.lease, sent)
            yield Note("lease.reconfirmed")
        else:
            yield CacheDrop((lease.client_id, lease.pool_id, lease.key))
            yield Note("lease.reconfirm_dropped")
    except RasdError as exc:
        yield Note("lease.reconfirm_errors")  # served until S, then dropped
        yield Note("reconfirm_failed", (("key", lease.key), ("error", str(exc))), "warning")

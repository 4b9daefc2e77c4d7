"""The jobs' lease writes, as programs: release a held resource, repair an orphan, the
liberator's per-item work (free an expired lease, check a held one for an orphan, re-list a
quarantined one).

Theory of operation
-------------------
The jobs (``ras-liberator``, ``ras-dedupe``, ``rasadmin``) write the table with the daemon's
rules (:mod:`rasd.core.verdicts`, :mod:`rasd.core.builders`) in the daemon's order (docs/design.md,
"Invariants"). Each per-item step is a program here (:mod:`rasd.steps`): the job's driver
(``jobs/rasd_jobs/leases.py``) performs its reads and writes against DynamoDB, the protocol checker
(``check/``) against its model, so both run one text.

* :func:`release_held`: give back a held resource the way a daemon does, mapping first, then
  the resource, claimable again only after the quarantine (and, when no app released it, not
  before its end plus the clock-skew bound: :func:`rasd.core.verdicts.held_free_at`).
* :func:`repair`: free a held resource no mapping names (a crash between two writes left it),
  fencing the mapping first when its acquisition's write could still land; it stays
  unclaimable until :func:`rasd.core.verdicts.orphan_free_at`.
* :func:`liberate_item`: one item of the liberator's scan of the leased index: an expired
  lease is freed (``rasd.core.builders.liberate``), an old held one is checked for an orphan on
  consistent reads and repaired; :func:`relist_item`: one item of its scan for quarantines
  that are over.

A write's outcome is a value: APPLIED goes on, REJECTED (its condition failed) is a lost race
and stops, an error stops too (:func:`applied` raises it, and the job counts it). Nothing is
retried blindly. Programs report what the jobs count and log with :class:`rasd.steps.Note`
(the job's driver counts a note without a level under its event name, and logs one with a
level).

Known-bad rule sets (``check/rulesets.py``) hand the programs other pure functions through
:class:`Ops`; the defaults are the real ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core import decide, verdicts
from ..core.builders import free_claim, free_orphan, liberate, relist
from ..core.errors import RasdError, Unavailable
from ..core.lease import Mapping, ResourceItem, fmt_time, map_pk
from ..core.map_builders import map_fence, map_release
from ..core.serialize import mapping_from, resource_from
from ..core.verdicts import Orphan
from ..core.writes import ItemKey, Write
from . import GetItem, Note, Program, Send

Result = Literal["released", "freed_orphan", "lease", "lost_race", "kept"]


def _same(w: Write) -> Write:
    return w


@dataclass(frozen=True)
class Ops:
    """The pure functions the jobs' programs decide and write with. The defaults are the real
    ones; the checker's known-bad rule sets replace one (never a flag in production code)."""

    orphan_verdict: Callable[[ResourceItem, Mapping | None], Orphan] = verdicts.orphan_verdict
    orphan_free_at: Callable[[ResourceItem, Mapping | None, int, int, int], int] = (
        verdicts.orphan_free_at
    )
    #: an early free as written (the real one: as built)
    early_free: Callable[[Write], Write] = _same
    map_release: Callable[..., Write] = map_release
    outlasts: Callable[[ResourceItem, ResourceItem, int], bool] = verdicts.outlasts
    served_end: Callable[[ResourceItem, Mapping | None], int | None] = verdicts.served_end
    dedupe_slack: Callable[[int, int], int] = verdicts.dedupe_slack
    survivor_seen_in: Callable[[ResourceItem, ResourceItem], str] = verdicts.survivor_seen_in
    #: how ``ras-dedupe`` releases an item it examined as an orphan (a program function with
    #: :func:`repair_examined`'s arguments)
    release_orphan: Callable[..., Program[Result]] | None = field(default=None)


OPS = Ops()


# --------------------------------------------------------------------------- helpers
def applied(res: Any) -> bool:
    """A write's ``rasd.steps.WriteResult`` as the jobs take it: True when APPLIED, False
    when its condition failed (a lost race); an error or an unknown outcome is raised (the
    job counts it; the next run looks again)."""
    if res.outcome is decide.Outcome.APPLIED:
        return True
    if res.outcome is decide.Outcome.REJECTED and res.error is None:
        return False
    raise res.error if res.error is not None else Unavailable("write outcome unknown")


def mapping_ident(r: ResourceItem) -> ItemKey:
    """The key's mapping item in ``r``'s region."""
    assert r.key is not None
    return (map_pk(r.client_id, r.pool_id, r.key), r.region)


def read_resource(ident: ItemKey) -> Program[ResourceItem | None]:
    got = yield GetItem(ident)
    return resource_from(got) if got else None


def read_mapping(r: ResourceItem) -> Program[Mapping | None]:
    got = yield GetItem(mapping_ident(r))
    return mapping_from(got) if got else None


def fields(r: ResourceItem, **more: object) -> tuple[tuple[str, object], ...]:
    """An item's log fields."""
    base: dict[str, object] = {
        "client_id": r.client_id,
        "pool_id": r.pool_id,
        "resource": r.resource,
        "region": r.region,
        "key": r.key,
        "version": r.version,
    }
    return tuple({**base, **more}.items())


# ------------------------------------------------------------------ release and repair
def release_held(
    r: ResourceItem,
    now_us: int,
    quarantine_us: int,
    grace_us: int,
    hold_to_end: bool = False,
    end_by_us: int | None = None,
    ops: Ops = OPS,
    by_operator: bool = False,
) -> Program[Result]:
    """Release what ``r`` (read consistently, held) holds: mapping, then resource, claimable
    again after the quarantine. ``hold_to_end`` (``ras-dedupe``'s extras, ``rasadmin
    release-resource``: no app released the lease, so apps may use it to its end): not
    before its end plus ``grace_us`` either (docs/design.md, I1). If ``r`` is no lease (no
    mapping names it) it is repaired as an orphan instead, with ``grace_us``.

    With ``end_by_us`` (``ras-dedupe``: when the survivor stops being served) the lease is
    released only if it ends by then, as read on the mapping, and the mapping's release is
    conditional on the version that end was read at: a daemon that extends the lease
    meanwhile (and answers apps with the later end) makes the release a lost race, so the
    key's region never goes without a servable lease while apps still use this one (I2).
    ``"kept"``: it ends later than that. ``by_operator`` (``rasadmin release-resource``):
    the operator's ending of the lease is noted (``lease_ended``) as the release goes out."""
    assert r.key is not None and r.holder is not None
    m = yield from read_mapping(r)
    if ops.orphan_verdict(r, m) is not Orphan.LEASE:
        return (yield from repair(r, m, now_us, quarantine_us, grace_us, ops=ops))
    assert m is not None
    ver: int | None = None
    if end_by_us is not None:
        if not verdicts.ends_by(r, m, end_by_us):
            return "kept"
        ver = m.ver
    if by_operator:  # the operator ends the key's lease as the release goes out
        yield Note("lease_ended", fields(r, token=r.holder), "debug")
    if not applied((yield Send(ops.map_release(mapping_ident(r), r.holder, now_us, ver)))):
        return "lost_race"
    available = now_us + quarantine_us
    if hold_to_end:
        # With the mapping released no extension of it can apply any more, so the resource's
        # end as read now bounds every answer a daemon gave.
        cur = (yield from read_resource(r.ident)) or r
        available = verdicts.held_free_at(r, cur, now_us, quarantine_us, grace_us)
    w = free_claim(r.ident, r.key, r.holder, now_us, available)
    applied((yield Send(ops.early_free(w) if available > now_us else w)))
    return "released"


def repair(
    r: ResourceItem,
    m: Mapping | None,
    now_us: int,
    quarantine_us: int,
    grace_us: int,
    hold_to_end: bool = False,
    ops: Ops = OPS,
) -> Program[Result]:
    """Free ``r`` if no mapping names it (``m``: its key's mapping, read for it), fencing
    the mapping first when needed. It stays unclaimable for the quarantine, and, if a
    mapping may have named it, until its lease's end plus ``grace_us``
    (``rasd.core.verdicts.orphan_free_at``). With ``hold_to_end`` (the paper's agent may run: it
    may have answered the claim from the leased index, to its end, whether or not a mapping
    named it) until its end plus ``grace_us`` in any case. ``"lease"``: it is no orphan."""
    verdict = ops.orphan_verdict(r, m)
    if verdict in (Orphan.LEASE, Orphan.FOREIGN):
        return "lease"
    if verdict is Orphan.FENCE_MAPPING:
        fence = map_fence(mapping_ident(r), m.ver if m else 0, now_us)
        if not applied((yield Send(fence))):
            return "lost_race"
    available = ops.orphan_free_at(r, m, now_us, quarantine_us, grace_us)
    if hold_to_end and r.lease_expires_us is not None:
        available = max(available, r.lease_expires_us + grace_us)
    w = free_orphan(r, now_us, available)
    if not applied((yield Send(ops.early_free(w) if available > now_us else w))):
        return "lost_race"
    return "freed_orphan"


def repair_examined(
    r: ResourceItem, now_us: int, quarantine_us: int, grace_us: int, ops: Ops = OPS
) -> Program[Result]:
    """Repair ``r``, examined as an orphan, only while it still is one: a claim whose mapping
    write was in flight when it was examined may have landed since, and been served. Then it
    is a lease (``"lease"``), left to the next run, which judges it as one."""
    m = yield from read_mapping(r)
    return (yield from repair(r, m, now_us, quarantine_us, grace_us, ops=ops))


# ------------------------------------------------------------------------ the liberator
@dataclass(frozen=True)
class LiberatorRun:
    """One ``ras-liberator`` run's bounds (its ``now`` fixed for the run), in microseconds."""

    now_us: int
    grace_us: int
    #: held items acquired longer ago than this are checked for orphans (None: never)
    orphan_age_us: int | None
    quarantine_us: int
    #: the paper's agent may run: a freed orphan is held to its lease's end plus the grace
    legacy_agents: bool = True
    dry_run: bool = False


def liberate_item(item: ResourceItem, run: LiberatorRun, ops: Ops = OPS) -> Program[str]:
    """One item of the liberator's scan of the leased index (eventually consistent: read
    again before anything but a conditional write is decided). An item whose lease ended
    more than the grace ago is freed, conditional on the version and end read
    (``rasd.core.builders.liberate``): a lease a daemon extended or re-let since is left alone (a
    lost race). An older held item is checked for an orphan (:func:`check_orphan`).
    Returns what was done (the notes say it for the summary)."""
    cutoff = run.now_us - run.grace_us
    if item.lease_expires_us is None or item.lease_expires_us >= cutoff:
        return (yield from check_orphan(item, run, ops))
    yield Note("expired")
    ctx = fields(item, lease_expires=fmt_time(item.lease_expires_us))
    if run.dry_run:
        yield Note("would_free")
        yield Note("would_free", ctx, "debug")
        return "would_free"
    res = yield Send(liberate(item, run.now_us))
    if res.outcome is decide.Outcome.APPLIED:
        yield Note("freed")
        yield Note("freed", ctx, "debug")
        return "freed"
    if res.error is None and res.outcome is decide.Outcome.REJECTED:
        yield Note("lost_races")
        yield Note("lost_race", ctx, "info")
        return "lost_race"
    yield Note("errors")
    yield Note("free_failed", (*ctx, ("error", repr(res.error))), "error")
    return "error"


def check_orphan(item: ResourceItem, run: LiberatorRun, ops: Ops = OPS) -> Program[str]:
    """A held item acquired longer ago than the orphan age, checked against its key's
    mapping on consistent reads; freed (:func:`repair`) when no mapping names it. A holder
    the paper's agent or its liberator left stale (``holder_current``) is that agent's lease:
    left to run to its end."""
    if run.orphan_age_us is None or item.holder is None:
        return "young"
    if item.lease_acquired_us is None or item.lease_acquired_us >= run.now_us - run.orphan_age_us:
        return "young"
    yield Note("checked")
    ctx = fields(item)
    try:
        fresh = yield from read_resource(item.ident)
        if fresh is None or fresh.holder != item.holder or fresh.key is None:
            return "gone"
        if ops.orphan_verdict(fresh, None) is Orphan.FOREIGN:  # a stale holder
            yield Note("foreign")
            return "foreign"
        m = yield from read_mapping(fresh)
        if ops.orphan_verdict(fresh, m) in (Orphan.LEASE, Orphan.FOREIGN):
            return "lease"
        yield Note("orphans")
        if run.dry_run:
            yield Note("would_free_orphan", ctx, "info")
            return "would_free_orphan"
        got = yield from repair(
            fresh,
            m,
            run.now_us,
            run.quarantine_us,
            run.grace_us,
            hold_to_end=run.legacy_agents,
            ops=ops,
        )
    except RasdError as exc:
        yield Note("errors")
        yield Note("repair_failed", (*ctx, ("error", repr(exc))), "error")
        return "error"
    if got == "freed_orphan":
        yield Note("orphans_freed")
        yield Note("orphan_freed", ctx, "warning")
    else:
        yield Note("lost_races")
        yield Note("lost_race", ctx, "warning")
    return got


def relist_item(item: ResourceItem, now_us: int, dry_run: bool = False) -> Program[str]:
    """One item of the liberator's scan for quarantined items: one whose quarantine is over
    goes back to the available index (``rasd.core.builders.relist``, conditional on what was
    read)."""
    if item.quarantine_until is None or item.quarantine_until > fmt_time(now_us):
        return "quarantined"
    yield Note("quarantine_over")
    if dry_run:
        return "would_relist"
    res = yield Send(relist(item, now_us))
    try:
        ok = applied(res)
    except RasdError as exc:
        yield Note("errors")
        yield Note("relist_failed", fields(item, error=repr(exc)), "error")
        return "error"
    yield Note("relisted" if ok else "lost_races")
    return "relisted" if ok else "lost_race"


__all__ = [
    "OPS",
    "LiberatorRun",
    "Ops",
    "Result",
    "applied",
    "check_orphan",
    "liberate_item",
    "mapping_ident",
    "read_mapping",
    "read_resource",
    "release_held",
    "relist_item",
    "repair",
    "repair_examined",
]

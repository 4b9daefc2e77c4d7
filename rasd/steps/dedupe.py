"""``ras-dedupe``'s protocol for one key that holds several resources, as a program.

:func:`dedupe_key` examines a group from the leased index on consistent reads
(:func:`examine`), keeps ``decide.pick``'s lease, repairs orphans and releases extras only
when the survivor outlasts them: docs/design.md, "Arguments, interleaving by interleaving"
(cross-region).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.decide import pick
from ..core.errors import RasdError
from ..core.lease import ResourceItem, fmt_time
from ..core.serialize import mapping_from
from ..core.verdicts import Orphan
from . import At, GetItem, Note, Program, in_region
from .repair import OPS, Ops, Result, mapping_ident, read_mapping, read_resource, release_held
from .repair import repair_examined as _repair_examined


@dataclass(frozen=True)
class DedupeRun:
    """One ``ras-dedupe`` run's region and bounds (from the daemons' config), microseconds."""

    region: str
    now_us: int
    quarantine_us: int
    #: the daemons' skew_margin
    margin_us: int
    #: the clock-skew bound (max_clock_skew)
    grace_us: int
    #: regions besides ``region`` whose replica the job may write (``--peer-endpoint``)
    peers: frozenset[str] = frozenset()
    dry_run: bool = False

    def writable(self, region: str) -> bool:
        return region == self.region or region in self.peers

    def replica(self, region: str) -> str | None:
        """Where ``region``'s items are read and written: the job's own replica (None), or
        that region's."""
        return None if region == self.region or region not in self.peers else region


def examine(
    items: tuple[ResourceItem, ...], run: DedupeRun, ops: Ops = OPS
) -> Program[tuple[list[ResourceItem], list[ResourceItem]]]:
    """(leases, orphans) among one key's items, on strongly consistent reads of each item and
    of its region's mapping: a held item its region's mapping does not name is an orphan,
    never a lease. An item that changed since the scan (released, liberated) is left out."""
    real: list[ResourceItem] = []
    orphans: list[ResourceItem] = []
    for it in items:
        where = run.replica(it.region)
        fresh = yield from in_region(where, read_resource(it.ident))
        if fresh is None or fresh.key != it.key or fresh.holder is None:
            continue
        m = yield from in_region(where, read_mapping(fresh))
        (real if ops.orphan_verdict(fresh, m) is Orphan.LEASE else orphans).append(fresh)
    return real, orphans


def dedupe_key(items: tuple[ResourceItem, ...], run: DedupeRun, ops: Ops = OPS) -> Program[None]:
    """One duplicate group (one key's items, from the scan): examine, keep one, release the
    rest that may go (see the module's docstring)."""
    it0 = items[0]
    ctx = (("client_id", it0.client_id), ("pool_id", it0.pool_id), ("key", it0.key))
    yield Note("duplicate_keys")
    try:
        real, orphans = yield from examine(items, run, ops)
    except RasdError as exc:
        yield Note("errors")
        yield Note("read_failed", (*ctx, ("error", repr(exc))), "error")
        return
    keep = pick(real)
    extras = sorted((it for it in real if it is not keep), key=lambda it: (it.region, it.resource))
    yield Note(
        "duplicate_key",
        (
            *ctx,
            ("keep", f"{keep.region}:{keep.resource}" if keep else None),
            ("extras", [f"{it.region}:{it.resource}" for it in extras]),
            ("orphans", [f"{it.region}:{it.resource}" for it in orphans]),
        ),
        "info",
    )
    for o in orphans:
        yield from release_one(o, "orphan", run, ctx, ops=ops)
    slack = ops.dedupe_slack(run.margin_us, run.grace_us)
    for e in extras:
        assert keep is not None
        ectx = (*ctx, ("resource", e.resource), ("region", e.region))
        if not ops.outlasts(keep, e, slack):
            # Releasing it now would leave its region with no servable lease before its
            # end: the region would acquire another while apps still use this one.
            yield Note("kept_until_survivor_outlasts")
            yield Note("extra_kept", ectx, "info")
            continue
        end_by: int | None = None
        if run.writable(e.region):
            # The survivor as the extra's region sees it (its replica may not show the
            # confirm or the extension yet), read there, consistently.
            seen_in = ops.survivor_seen_in(keep, e)
            read = GetItem(mapping_ident(keep))
            try:
                got = yield from (read if run.replica(seen_in) is None else At(seen_in, read))
            except RasdError as exc:
                yield Note("errors")
                yield Note("read_failed", (*ctx, ("error", repr(exc))), "error")
                continue
            end = ops.served_end(keep, mapping_from(got) if got else None)
            if end is None:
                yield Note("kept_until_survivor_outlasts")
                yield Note("extra_kept", (*ectx, ("why", "survivor not live there")), "info")
                continue
            end_by = end - slack
        # Checked again on the extra's mapping, and the release made conditional on its
        # version: a daemon may extend the extra (and answer apps with the later end).
        yield from release_one(e, "extra", run, ctx, end_by, ops)


def dedupe_groups(
    groups: tuple[tuple[ResourceItem, ...], ...], run: DedupeRun, ops: Ops = OPS
) -> Program[None]:
    """A whole run's duplicate groups, one after another (the checker's ``ras-dedupe``
    process; the job drives :func:`dedupe_key` per group, counting a failure per group)."""
    for items in groups:
        yield from dedupe_key(items, run, ops)


def release_one(
    it: ResourceItem,
    what: str,
    run: DedupeRun,
    ctx: tuple[tuple[str, object], ...],
    end_by_us: int | None = None,
    ops: Ops = OPS,
) -> Program[Result | None]:
    """Release an orphan or an extra in its region's replica; report it when the job has no
    endpoint there. Returns what was done (None: reported, dry run, or failed)."""
    ictx = (*ctx, ("resource", it.resource), ("region", it.region), ("version", it.version))
    if not run.writable(it.region):
        yield Note("foreign_reported")
        yield Note(
            "foreign_duplicate",
            (
                *ictx,
                ("kind", what),
                ("lease_acquired", fmt_time(it.lease_acquired_us or 0)),
                ("hint", f"run ras-dedupe --region {it.region} against that region's table"),
            ),
            "warning",
        )
        return None
    if run.dry_run:
        yield Note("would_release")
        yield Note("would_release", (*ictx, ("kind", what)), "info")
        return None
    where = run.replica(it.region)
    try:
        if what == "orphan":
            release = ops.release_orphan or _repair_examined
            prog = release(it, run.now_us, run.quarantine_us, run.grace_us, ops=ops)
        else:
            # No app released an extra: apps may use it until its end, so it is not
            # claimable before then (plus the skew), however short the quarantine (I1).
            prog = release_held(
                it,
                run.now_us,
                run.quarantine_us,
                run.grace_us,
                hold_to_end=True,
                end_by_us=end_by_us,
                ops=ops,
            )
        got = yield from in_region(where, prog)
    except RasdError as exc:
        yield Note("errors")
        yield Note("release_failed", (*ictx, ("error", repr(exc))), "error")
        return None
    if got == "kept":
        yield Note("kept_until_survivor_outlasts")
        yield Note("extra_kept", ictx, "info")
    elif got in ("lost_race", "lease"):
        yield Note("lost_races")
        yield Note("lost_race", (*ictx, ("kind", what)), "info")
    else:
        yield Note("orphans_freed" if got == "freed_orphan" else "released")
        yield Note("released", (*ictx, ("kind", what)), "info")
    return got


__all__ = ["DedupeRun", "dedupe_groups", "dedupe_key", "examine", "release_one"]

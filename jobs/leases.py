"""The lease writes the jobs make, with boto3: the same rules as the daemon (rasd.lease,
rasd.decide) in the same order (docs/design.md, "Invariants").

* ``release_held``: give back a held resource the way a daemon does: the key's mapping first,
  then the resource, claimable again only after the quarantine. Used by ``ras-dedupe`` and
  ``rasadmin release-resource``.
* ``repair``: a held resource that no mapping names (a crash between two writes left it) is
  freed, with quarantine, and not before its lease's end when a mapping may have named it
  (``rasd.decide.orphan_free_at``); if its acquisition's mapping write could still land, the
  mapping is fenced first. Used by ``ras-liberator`` and ``ras-dedupe``.

* ``delete``: delete a resource item (``rasadmin delete-resource``/``delete-pool``); a held
  one only after its key's mapping stops naming it, so no daemon reads a lease on a resource
  that is gone. It leaves a tombstone that holds the name until every lease and quarantine on
  it has run out (``rasd.decide.name_held_until``), so a re-add under the same name is not
  claimable before then (``rasd.lease.readd``).

Every write is a ``rasd.writes.Write`` rendered for UpdateItem; a failed condition is a lost
race (someone changed the item since it was read), reported as such, never retried blindly.
"""

from __future__ import annotations

from typing import Any, Literal

from rasd.config import Config
from rasd.decide import Orphan, name_held_until, orphan_free_at, orphan_verdict
from rasd.lease import (
    US,
    Mapping,
    ResourceItem,
    free_claim,
    free_orphan,
    is_tombstone,
    map_fence,
    map_pk,
    map_release,
    mapping_from,
    resource_from,
    tombstone,
)
from rasd.writes import ItemKey, Write, item_from_av, key_av, render

from . import common

Result = Literal["released", "freed_orphan", "lease", "lost_race", "kept"]

#: the clock-skew bound: what an orphan's hold adds to its lease's end when the caller names
#: no grace of its own
SKEW_US = int(Config().max_clock_skew * US)


def write(ddb: Any, table: str, w: Write) -> bool:
    """Apply ``w``; False when its condition failed (a lost race)."""
    try:
        ddb.update_item(TableName=table, **render(w))
    except Exception as exc:
        if common.is_lost_race(exc):
            return False
        raise
    return True


def mapping_ident(r: ResourceItem) -> ItemKey:
    assert r.key is not None
    return (map_pk(r.client_id, r.pool_id, r.key), r.region)


def get(ddb: Any, table: str, ident: ItemKey) -> dict[str, Any] | None:
    resp = ddb.get_item(TableName=table, Key=key_av(ident), ConsistentRead=True)
    raw = resp.get("Item")
    return item_from_av(raw) if raw else None


def get_mapping(ddb: Any, table: str, r: ResourceItem) -> Mapping | None:
    got = get(ddb, table, mapping_ident(r))
    return mapping_from(got) if got else None


def get_resource(ddb: Any, table: str, ident: ItemKey) -> ResourceItem | None:
    got = get(ddb, table, ident)
    return resource_from(got) if got else None


def release_held(
    ddb: Any,
    table: str,
    r: ResourceItem,
    now_us: int,
    quarantine_us: int,
    hold_to_end_grace_us: int | None = None,
    end_by_us: int | None = None,
) -> Result:
    """Release what ``r`` (read consistently, held) holds: mapping, then resource, claimable
    again after the quarantine. With ``hold_to_end_grace_us`` (``ras-dedupe``: no app
    released the lease, so apps may use it to its end) not before the lease's end plus that
    grace either (docs/design.md, I1).

    With ``end_by_us`` (``ras-dedupe``: when the survivor stops being served) the lease is
    released only if it ends by then, as read on the mapping, and the mapping's release is
    conditional on the version that end was read at: a daemon that extends the lease
    meanwhile (and answers apps with the later end) makes the release a lost race, so the
    key's region never goes without a servable lease while apps still use this one (I2).
    ``"kept"``: it ends later than that."""
    assert r.key is not None and r.holder is not None
    m = get_mapping(ddb, table, r)
    verdict = orphan_verdict(r, m)
    if verdict is not Orphan.LEASE:
        grace = SKEW_US if hold_to_end_grace_us is None else hold_to_end_grace_us
        return repair(ddb, table, r, m, now_us, quarantine_us, grace)
    assert m is not None
    ver: int | None = None
    if end_by_us is not None:
        ends = [e for e in (r.lease_expires_us, m.expires_us) if e is not None]
        if not ends or max(ends) > end_by_us:
            return "kept"
        ver = m.ver
    if not write(ddb, table, map_release(mapping_ident(r), r.holder, now_us, ver)):
        return "lost_race"
    available = now_us + quarantine_us
    if hold_to_end_grace_us is not None:
        # A daemon may have extended the lease (resource, then mapping) since ``r`` was
        # read, and answered apps with the later end. With the mapping released no extension
        # of it can apply any more, so the resource's end as read *now* bounds every answer.
        cur = get_resource(ddb, table, r.ident) or r
        ends = [e for e in (r.lease_expires_us, cur.lease_expires_us) if e is not None]
        available = max([available, *(e + hold_to_end_grace_us for e in ends)])
    write(ddb, table, free_claim(r.ident, r.key, r.holder, now_us, available))
    return "released"


def repair(
    ddb: Any,
    table: str,
    r: ResourceItem,
    m: Mapping | None,
    now_us: int,
    quarantine_us: int,
    grace_us: int,
    hold_to_end: bool = False,
) -> Result:
    """Free ``r`` if no mapping names it (fencing the mapping first when needed). It stays
    unclaimable for the quarantine, and, if a mapping may have named it (apps may use it to
    its end, and no app need have released it: a ``ras-dedupe`` stopped between its two
    writes), until its lease's end plus ``grace_us`` (``rasd.decide.orphan_free_at``). With
    ``hold_to_end`` (the paper's agent may run: it may have answered the claim from the leased
    index, to its end, whether or not a mapping named it) until its end plus ``grace_us``
    in any case."""
    verdict = orphan_verdict(r, m)
    if verdict in (Orphan.LEASE, Orphan.FOREIGN):
        return "lease"
    fence = map_fence(mapping_ident(r), m.ver if m else 0, now_us)
    if verdict is Orphan.FENCE_MAPPING and not write(ddb, table, fence):
        return "lost_race"
    available = orphan_free_at(r, m, now_us, quarantine_us, grace_us)
    if hold_to_end and r.lease_expires_us is not None:
        available = max(available, r.lease_expires_us + grace_us)
    if not write(ddb, table, free_orphan(r, now_us, available)):
        return "lost_race"
    return "freed_orphan"


def delete(
    ddb: Any,
    table: str,
    ident: ItemKey,
    now_us: int,
    force: bool,
    quarantine_us: int,
    grace_us: int,
) -> bool:
    """Delete a resource item; one with a running lease, or in quarantine, only with
    ``force``. The mapping of any lease on it (running or lapsed) is ended first. The item
    becomes a tombstone that holds its name until ``rasd.decide.name_held_until`` (what a
    re-add waits for). Conditional on the version read (re-read and retried a few times
    when a daemon writes it meanwhile). False: it is leased or quarantined and ``force`` was
    not given, or it kept changing."""
    for _ in range(5):
        raw = get(ddb, table, ident)
        if raw is None or is_tombstone(raw):
            return True
        r = resource_from(raw)
        if r.key is not None:
            if not force and not r.expired(now_us):
                return False
            if r.holder is not None:
                write(ddb, table, map_release(mapping_ident(r), r.holder, now_us))
        elif not force and not r.claimable(now_us):
            return False
        hold = name_held_until(r, now_us, quarantine_us, grace_us)
        if write(ddb, table, tombstone(r, now_us, hold)):
            return True
    return False

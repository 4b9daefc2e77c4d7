"""Every write made to a resource item, and the meta items' writes. Pure: no I/O.

Each is a :class:`rasd.core.writes.Write`, conditioned on what its writer read; the paper's
agent's two writes are here too, for the checker. The mapping items' writes are
:mod:`rasd.core.map_builders`'. Every write and its condition: docs/schema.md, "Writes";
why each is safe: docs/design.md, "Invariants".
"""

from __future__ import annotations

from typing import Any

from .lease import (
    HOSTS_CLIENT,
    META_CLIENT,
    MISS_TTL_S,
    US,
    Item,
    Lease,
    ResourceItem,
    fmt_time,
    headroom_resource,
    miss_resource,
    parse_time,
    partition_name,
    partition_of,
    ttl_after,
)
from .writes import Cond, ItemKey, Write

# ------------------------------------------------------------------------------- resource item
_HELD_ATTRS = ("key", "lease_expires", "lease_acquired", "holder", "mver", "hver")


def _free_until(available_us: int, now_us: int) -> tuple[str, str]:
    """The attribute an item freed now, claimable from ``available_us`` on, carries: a free
    claimable at once goes back to the available index (``lease_available``); one in
    quarantine stays out of it (``quarantine_until``) until re-listed (:func:`relist`), so
    that no agent that reads candidates from that index can see it at its current version
    (docs/design.md, "Beside the paper's agent")."""
    if available_us <= now_us:
        return ("lease_available", fmt_time(now_us))
    return ("quarantine_until", fmt_time(available_us))


def claim(
    item: ResourceItem, key: str, expires_us: int, now_us: int, token: str, mver: int
) -> Write:
    """Take a free item for ``key``: the version read, free, out of quarantine, our region.
    Records the acquisition's ``token`` and the mapping version ``mver`` it wrote."""
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("lease_available", "exists"),
            Cond("lease_available", "<=", fmt_time(now_us)),
            Cond("region", "=", item.region),
        ),
        set=(
            ("key", key),
            ("lease_expires", fmt_time(expires_us)),
            ("lease_acquired", fmt_time(now_us)),
            ("holder", token),
            ("mver", mver),
            ("hver", item.version + 1),
            ("version", item.version + 1),
        ),
        remove=("lease_available",),
        kind="claim",
    )


def fence_resource(ident: ItemKey, version: int) -> Write:
    """Bump a resource item's version if it is still ``version``: afterwards no write that was
    conditioned on ``version`` (a claim still in flight) can ever apply."""
    return Write(
        key=ident,
        conds=(Cond("version", "=", version),),
        set=(("version", version + 1),),
        kind="fence_resource",
    )


def free_claim(
    ident: ItemKey,
    key: str,
    token: str,
    now_us: int,
    available_us: int,
    expires_us: int | None = None,
) -> Write:
    """Free a claim held by ``token``: claimable again from ``available_us`` on. A claim that
    no mapping ever named (a lost acquisition's) may use ``now``; a lease that may have been
    served gets ``now + quarantine`` (see docs/design.md, I3). With ``expires_us``, only if
    the lease still ends then (``available_us`` was computed from that end). Only while
    ``holder`` is current: past a write of the paper's agent or its liberator (it freed our
    lease and leased the item again, perhaps to the same key, leaving our token behind) the
    lease is the paper's, not ours to free."""
    assert available_us >= now_us
    conds: tuple[Cond, ...] = (
        Cond("holder", "=", token),
        Cond("key", "=", key),
        HOLDER_CURRENT,
    )
    if expires_us is not None:
        conds += (Cond("lease_expires", "=", fmt_time(expires_us)),)
    return Write(
        key=ident,
        conds=conds,
        set=(_free_until(available_us, now_us),),
        remove=_HELD_ATTRS,
        incr=("version",),
        kind="free_claim",
    )


#: ``holder`` names the acquisition holding the item now (``ResourceItem.holder_current``):
#: a write of the paper's agent or its liberator moves ``version`` without ``hver``
HOLDER_CURRENT = Cond("hver", "absent_or_eq_attr", "version")


def extend_resource(lease: Lease, expires_us: int, floor_us: int | None = None) -> Write:
    """Push the resource's ``lease_expires`` later; only while ``lease.token`` holds it.

    ``floor_us``: beside the paper's agent (``legacy.extend_floor``), whose writes the item
    may carry. Then also only while the holder is current (its liberator freed our lease
    and its agent leased the item again, perhaps to the same key, leaving our token behind:
    that lease is the paper's), and while the lease ends after ``floor_us``: an extension
    that lands after the lease's end makes it run again beside a lease the paper's agent may
    have made for the key meanwhile."""
    assert lease.token is not None
    paper: tuple[Cond, ...] = ()
    if floor_us is not None:
        paper = (HOLDER_CURRENT, Cond("lease_expires", ">", fmt_time(floor_us)))
    return Write(
        key=(lease.client_id, lease.resource),
        conds=(
            Cond("holder", "=", lease.token),
            Cond("key", "=", lease.key),
            Cond("region", "=", lease.region),
            Cond("lease_expires", "<", fmt_time(expires_us)),
            *paper,
        ),
        set=(("lease_expires", fmt_time(expires_us)),),
        incr=("version", "hver"),
        kind="extend_resource",
    )


def liberate(item: ResourceItem, now_us: int) -> Write:
    """Free an expired lease (the liberator). Conditional on the version and expiry read (from
    the index, perhaps stale: the conditions are checked on the item itself), so a lease
    extended since is left alone. Claimable at once: its end has passed."""
    assert item.key is not None and item.lease_expires_us is not None
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("lease_expires", "=", fmt_time(item.lease_expires_us)),
            Cond("region", "=", item.region),
        ),
        set=(("lease_available", fmt_time(now_us)), ("version", item.version + 1)),
        remove=_HELD_ATTRS,
        kind="liberate",
    )


def free_orphan(item: ResourceItem, now_us: int, available_us: int) -> Write:
    """Free a held resource no mapping names (a crash left it), claimable again from
    ``available_us`` on: ``rasd.core.verdicts.orphan_free_at`` (it may have been served before the
    crash: at least the quarantine, and the lease's end when it may have been named). Until
    then it stays out of the available index (``_free_until``)."""
    assert item.holder is not None and available_us >= now_us
    return Write(
        key=item.ident,
        conds=(Cond("version", "=", item.version), Cond("holder", "=", item.holder)),
        set=(
            _free_until(available_us, now_us),
            ("version", item.version + 1),
        ),
        remove=_HELD_ATTRS,
        kind="free_orphan",
    )


def relist(item: ResourceItem, now_us: int) -> Write:
    """Put a quarantined item back in the available index once its quarantine is over (the
    daemon that freed it, else ``ras-liberator``): ``lease_available`` becomes the end of the
    quarantine. Conditional on the version and quarantine read, free and our region."""
    assert item.quarantine_until is not None
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("quarantine_until", "=", item.quarantine_until),
            Cond("quarantine_until", "<=", fmt_time(now_us)),
            Cond("key", "not_exists"),
            Cond("region", "=", item.region),
        ),
        set=(("lease_available", item.quarantine_until), ("version", item.version + 1)),
        remove=("quarantine_until",),
        kind="relist",
    )


def adopt(item: ResourceItem, token: str, mver: int, now_us: int) -> Write:
    """Make a lease of the paper's agent (held, no mapping names it) a rasd lease of the same
    key, to the same end: record the acquisition's ``token`` and the mapping version ``mver``
    it wrote first (``map_acquire``, rver = the version read). Conditional on the version,
    key, end and region read (strongly consistent), like a claim on the version."""
    assert item.key is not None and item.lease_expires_us is not None
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("key", "=", item.key),
            Cond("lease_expires", "=", fmt_time(item.lease_expires_us)),
            Cond("region", "=", item.region),
        ),
        set=(
            ("lease_acquired", fmt_time(now_us)),
            ("holder", token),
            ("mver", mver),
            ("hver", item.version + 1),
            ("version", item.version + 1),
        ),
        kind="adopt",
    )


def move(item: ResourceItem, to_region: str) -> Write:
    """Move a FREE item to another region (the balancer). Never touches a held item; a
    quarantined item stays quarantined (``lease_available`` is kept)."""
    return Write(
        key=item.ident,
        conds=(
            Cond("version", "=", item.version),
            Cond("region", "=", item.region),
            Cond("lease_available", "exists"),
            Cond("key", "not_exists"),
        ),
        set=(
            ("region", to_region),
            (
                "partition",
                partition_name(
                    item.client_id, item.pool_id, to_region, partition_of(item.resource)
                ),
            ),
            ("version", item.version + 1),
        ),
        kind="move",
    )


def tombstone(item: ResourceItem, now_us: int, hold_until_us: int) -> Write:
    """Delete a resource item (``rasadmin delete-resource``/``delete-pool``), leaving a
    tombstone under its name: no attribute of either index (``key``, ``partition``,
    ``lease_available``) and no ``pool_id``, so nothing lists, claims or serves it, and
    ``hold_until``: a re-add of the name (:func:`readd`) is claimable no earlier, so a lease
    or quarantine that still runs on the name runs out first (docs/design.md, I1).
    Conditional on the version read; the version goes on growing through a re-add (claims in
    flight fail, fencing tokens keep growing). DynamoDB's TTL reaps it a day after its hold."""
    return Write(
        key=item.ident,
        conds=(Cond("version", "=", item.version),),
        set=(
            ("hold_until", fmt_time(hold_until_us)),
            ("deleted", fmt_time(now_us)),
            ("ttl", ttl_after(hold_until_us)),
            ("version", item.version + 1),
        ),
        remove=(
            "pool_id",
            "region",
            "partition",
            "lease_available",
            "quarantine_until",
            *_HELD_ATTRS,
        ),
        kind="tombstone",
    )


def readd(
    ident: ItemKey, version: int, hold_until: str, pool_id: str, region: str, now_us: int
) -> Write:
    """Add a resource again under a tombstone's name (``rasadmin add-resources``): free,
    claimable from the later of now and the tombstone's ``hold_until`` (until then out of the
    available index, as a quarantine: ``_free_until``); only while the tombstone is still the
    one read (``version``)."""
    client_id, resource = ident
    return Write(
        key=ident,
        conds=(Cond("version", "=", version), Cond("hold_until", "exists")),
        set=(
            ("pool_id", pool_id),
            ("region", region),
            ("partition", partition_name(client_id, pool_id, region, partition_of(resource))),
            _free_until(parse_time(hold_until), now_us),
            ("version", version + 1),
        ),
        remove=("hold_until", "deleted", "ttl"),
        kind="readd",
    )


# ------------------------------------------------------------- writes: the paper's agent
def paper_claim(item: ResourceItem, key: str, expires_us: int) -> Write:
    """The paper's agent's claim (what a table keeps running beside rasd: ``bench.baseline``,
    ``rasd.steps.paper``): conditional on the version read (from the available index)
    alone; sets the key and the end, increments the version, removes ``lease_available``."""
    return Write(
        key=item.ident,
        conds=(Cond("version", "=", item.version),),
        set=(
            ("key", key),
            ("lease_expires", fmt_time(expires_us)),
            ("version", item.version + 1),
        ),
        remove=("lease_available",),
        kind="paper_claim",
    )


def paper_free(item: ResourceItem, now_us: int) -> Write:
    """The paper's liberator's write: conditional on the version read (from the leased
    index), clears ``key`` and ``lease_expires``, sets ``lease_available``, increments the
    version. Nothing else: attributes rasd added stay as they are."""
    return Write(
        key=item.ident,
        conds=(Cond("version", "=", item.version),),
        set=(("lease_available", fmt_time(now_us)), ("version", item.version + 1)),
        remove=("key", "lease_expires"),
        kind="paper_free",
    )


# ---------------------------------------------------------------------------------- meta items
def new_resource_item(
    client_id: str, pool_id: str, region: str, resource: str, now_us: int
) -> Item:
    """A free resource item as ``rasadmin add-resources`` writes it."""
    return {
        "client_id": {"S": client_id},
        "resource": {"S": resource},
        "pool_id": {"S": pool_id},
        "region": {"S": region},
        "partition": {"S": partition_name(client_id, pool_id, region, partition_of(resource))},
        "lease_available": {"S": fmt_time(now_us)},
        "version": {"N": "0"},
    }


def headroom_item(
    client_id: str, pool_id: str, region: str, free: int, demand: int, now_us: int, horizon_s: int
) -> Item:
    """The headroom meta item the balancer writes (PutItem ``Item``)."""
    return {
        "client_id": {"S": META_CLIENT},
        "resource": {"S": headroom_resource(client_id, pool_id, region)},
        "kind": {"S": "headroom"},
        "free": {"N": str(free)},
        "projected_demand": {"N": str(demand)},
        "headroom": {"N": str(free - demand)},
        "horizon_s": {"N": str(horizon_s)},
        "updated": {"S": fmt_time(now_us)},
    }


def miss_report_update(
    client_id: str, pool_id: str, region: str, daemon_id: str, n: int, now_us: int
) -> dict[str, Any]:
    """UpdateItem kwargs (without ``TableName``) with which a daemon reports ``n`` NO_CAPACITY
    answers since its previous report. One item per daemon, written only by that daemon in its
    own region, so concurrent ADDs never meet in different replicas of the global table."""
    if n <= 0:
        raise ValueError("report a positive number of misses")
    if not daemon_id or "#" in daemon_id:
        raise ValueError("daemon_id must be non-empty and contain no '#'")
    return {
        "Key": {
            "client_id": {"S": HOSTS_CLIENT},
            "resource": {"S": miss_resource(client_id, pool_id, region, daemon_id)},
        },
        "UpdateExpression": "ADD #c :n SET #u = :now, #ttl = :ttl",
        "ExpressionAttributeNames": {"#c": "count", "#u": "updated", "#ttl": "ttl"},
        "ExpressionAttributeValues": {
            ":n": {"N": str(n)},
            ":now": {"S": fmt_time(now_us)},
            ":ttl": {"N": str(now_us // US + MISS_TTL_S)},
        },
    }

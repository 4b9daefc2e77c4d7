"""``rasadmin``: create the table, define pools, add/list/show/release/delete resources, stats.

Listings print a human table, or one JSON document with ``--json``. Commands that change the
table print a one-line JSON summary on stdout. Logs and progress go to stderr (the progress
line only when stderr is a terminal). Exit 0 done, 1 failed or refused, 2 bad usage/names.

Read-only commands (list-*, show-*, stats) cover every region unless ``--region`` is given on
the command line; ``RASD_REGION`` is not applied to them as a filter. Commands that write a
region's items (add-resources, release-resource, delete-resource) need the region:
``--region`` or ``RASD_REGION``, and write only that region's items (in a global table an item
is written in its own region's replica, where its daemons' claims are ordered with the write);
``delete-pool`` writes other regions' items through ``--peer-endpoint``.

Every command keeps I1 (docs/design.md): nothing it frees, deletes or adds is claimable while a
lease or quarantine on that resource may still run. A release is held to the lease's end (no
app released it); a delete leaves a tombstone holding the name until the lease or quarantine
it had runs out, and a re-add of the name waits for it (``rasd.core.builders.tombstone``/``readd``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from rasd.config import Config
from rasd.core import schema
from rasd.core.lease import MAX_RESOURCE_LEN, US, ResourceItem
from rasd.core.serialize import (
    is_resource_item,
    is_tombstone,
    item_from_ddb,
    pool_from_ddb,
    pool_meta_key,
)
from rasd.steps import Note
from rasd.steps import admin as steps

from . import adopt, common, leases, rollout

log = structlog.get_logger("rasd_jobs.admin")

DEFAULT_MAX_LEASE_S = 86_400  # one day: the paper's leases are 1-1.5 h; room for long tests
PROG = "rasadmin"


# -------------------------------------------------------------------------------- helpers
def state_of(item: ResourceItem, now_us: int) -> str:
    """free (claimable now) | quarantined (no lease, not claimable yet: freed early, out of the
    available index until re-listed after ``quarantine_until``, or a ``lease_available`` in
    the future) | leased | expired (leased but past lease_expires, not yet liberated)."""
    if not item.leased:
        return "free" if item.claimable(now_us) else "quarantined"
    return "expired" if item.expired(now_us) else "leased"


def claimable_from(item: ResourceItem) -> str | None:
    """When an item no lease holds is claimable: the end of its quarantine (then once it is
    re-listed), else its ``lease_available``."""
    return None if item.leased else item.quarantine_until or item.lease_available


def row_of(item: ResourceItem, now_us: int) -> dict[str, Any]:
    return {
        "client_id": item.client_id,
        "pool_id": item.pool_id,
        "resource": item.resource,
        "region": item.region,
        "state": state_of(item, now_us),
        "key": item.key,
        "lease_expires": common.iso(item.lease_expires_us),
        "lease_acquired": common.iso(item.lease_acquired_us),
        "lease_available": item.lease_available,
        "quarantine_until": item.quarantine_until,
        "claimable_from": claimable_from(item),
        "partition": item.partition,
        "version": item.version,
    }


#: the counts of stats and show-pool: FREE (no lease) is CLAIMABLE plus QUARANTINED
COUNT_COLUMNS = ["free", "claimable", "quarantined", "leased", "expired", "total"]


def counts_of(states: Counter[str]) -> dict[str, int]:
    """The COUNT_COLUMNS from a count of :func:`state_of`'s states."""
    return {
        "free": states["free"] + states["quarantined"],
        "claimable": states["free"],
        "quarantined": states["quarantined"],
        "leased": states["leased"],
        "expired": states["expired"],
        "total": states.total(),
    }


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain left-aligned text table (no dependency); empty cells print as '-'."""
    cells = [[str(c).upper() for c in columns]]
    cells += [["-" if r.get(c) is None else str(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def show(args: argparse.Namespace, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(list(rows), default=str) + "\n")
    elif rows:
        sys.stdout.write(render_table(rows, columns) + "\n")
    else:
        sys.stdout.write("(none)\n")
    sys.stdout.flush()


def get_pool(ddb: Any, table: str, client_id: str, pool_id: str) -> dict[str, Any] | None:
    resp = ddb.get_item(TableName=table, Key=pool_meta_key(client_id, pool_id), ConsistentRead=True)
    item = resp.get("Item")
    if item is None:
        return None
    return pool_row(item)


def pool_row(item: dict[str, Any]) -> dict[str, Any]:
    pool = pool_from_ddb(item)
    return {
        "client_id": pool.client_id,
        "pool_id": pool.pool_id,
        "max_lease": _number(str(pool.max_lease_us / US)),
    }


def _number(n: str) -> int | float:
    x = float(n)
    return int(x) if x.is_integer() else x


def client_items(
    ddb: Any,
    table: str,
    client_id: str,
    pool_id: str | None = None,
    region: str | None = None,
) -> Iterator[ResourceItem]:
    """Resource items of a client (a Query on the base table), optionally of one pool/region.
    Strongly consistent: the admin acts on what it shows."""
    names: dict[str, str] = {}
    values: dict[str, Any] = {":c": {"S": client_id}}
    filters = []
    if pool_id is not None:
        filters.append("pool_id = :p")
        values[":p"] = {"S": pool_id}
    if region is not None:
        filters.append("#r = :r")
        names["#r"] = "region"
        values[":r"] = {"S": region}
    kw: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "client_id = :c",
        "ExpressionAttributeValues": values,
        "ConsistentRead": True,
    }
    if filters:
        kw["FilterExpression"] = " AND ".join(filters)
    if names:
        kw["ExpressionAttributeNames"] = names
    for page in common.scan_pages(ddb, kw):
        for raw in page.get("Items", []):
            if is_resource_item(raw):  # not a deleted resource's tombstone
                yield item_from_ddb(raw)


is_resource = is_resource_item


def require_pool(ddb: Any, table: str, client_id: str, pool_id: str) -> dict[str, Any]:
    pool = get_pool(ddb, table, client_id, pool_id)
    if pool is None:
        raise common.UsageError(
            f"no pool {client_id}/{pool_id} in table {table}: define it with `rasadmin add-pool`"
        )
    return pool


def get_resource(ddb: Any, table: str, client_id: str, resource: str) -> ResourceItem:
    resp = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": client_id}, "resource": {"S": resource}},
        ConsistentRead=True,
    )
    raw = resp.get("Item")
    if raw is None or not is_resource(raw):
        raise common.JobError(f"no resource {resource!r} of client {client_id} in {table}")
    return item_from_ddb(raw)


def check_resource_name(resource: str) -> None:
    if not resource or len(resource) > MAX_RESOURCE_LEN:
        raise common.UsageError(
            f"bad resource {resource[:40]!r}: 1-{MAX_RESOURCE_LEN} characters expected"
        )


def bounds(args: argparse.Namespace) -> tuple[int, int]:
    """(quarantine, clock-skew bound) in microseconds, as the daemons keep them (--config)."""
    cfg = common.daemon_config(args)
    return int(cfg.quarantine * US), int(cfg.max_clock_skew * US)


def own_region(args: argparse.Namespace, it: ResourceItem, verb: str) -> None:
    """Refuse to write an item of another region than the command's: in a global table it
    would be written in the wrong replica and race that region's claims (last writer wins)."""
    region = common.ras_region(args)
    if it.region != region:
        raise common.JobError(
            f"{it.resource!r} belongs to region {it.region}, not {region}: {verb} it with "
            f"--region {it.region} against that region's table"
        )


def ticking(it: Iterable[Any], progress: common.Progress) -> Iterator[Any]:
    for x in it:
        progress.add()
        yield x


# ------------------------------------------------------------------------------- commands
def cmd_create_table(ddb: Any, args: argparse.Namespace) -> int:
    created = schema.create_table(ddb, args.table, wait=not args.no_wait)
    common.emit({"command": "create-table", "table": args.table, "created": created})
    return 0


def cmd_add_pool(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    common.check_name("pool", args.pool)
    if not 0 < args.max_lease <= 366 * 86_400:
        raise common.UsageError(f"bad --max-lease {args.max_lease:g}: 1 s to 366 days")
    existed = get_pool(ddb, args.table, args.client, args.pool) is not None
    leases.run(ddb, args.table, steps.define_pool(args.client, args.pool, args.max_lease))
    common.emit(
        {
            "command": "add-pool",
            "client_id": args.client,
            "pool_id": args.pool,
            "max_lease": args.max_lease,
            "updated": existed,
        }
    )
    return 0


def cmd_list_pools(ddb: Any, args: argparse.Namespace) -> int:
    rows = sorted(
        (pool_row(it) for it in schema.list_pool_items(ddb, args.table)),
        key=lambda r: (r["client_id"], r["pool_id"]),
    )
    if args.client:
        rows = [r for r in rows if r["client_id"] == args.client]
    show(args, rows, ["client_id", "pool_id", "max_lease"])
    return 0


def cmd_show_pool(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    common.check_name("pool", args.pool)
    pool = get_pool(ddb, args.table, args.client, args.pool)
    now = common.now_us(args)
    per_region: dict[str, Counter[str]] = {}
    for it in client_items(ddb, args.table, args.client, args.pool, args.region):
        per_region.setdefault(it.region, Counter())[state_of(it, now)] += 1
    if pool is None and not per_region:
        raise common.JobError(f"no pool {args.client}/{args.pool} in table {args.table}")
    regions = [{"region": r, **counts_of(c)} for r, c in sorted(per_region.items())]
    doc = {
        "client_id": args.client,
        "pool_id": args.pool,
        "defined": pool is not None,
        "max_lease": pool["max_lease"] if pool else None,
        "regions": regions,
    }
    if args.json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        head = f"pool {args.client}/{args.pool}: "
        head += f"max_lease {pool['max_lease']:g}s" if pool else "NOT DEFINED (orphan items)"
        sys.stdout.write(head + "\n")
        show(args, regions, ["region", *COUNT_COLUMNS])
    return 0


def cmd_delete_pool(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    common.check_name("pool", args.pool)
    now = common.now_us(args)
    pool = get_pool(ddb, args.table, args.client, args.pool)
    items = list(client_items(ddb, args.table, args.client, args.pool))
    if pool is None and not items:
        raise common.JobError(f"no pool {args.client}/{args.pool} in table {args.table}")
    writers = pool_writers(ddb, args, items)
    quarantine_us, grace_us = bounds(args)
    summary: dict[str, Any] = {
        "command": "delete-pool",
        "client_id": args.client,
        "pool_id": args.pool,
        "dry_run": args.dry_run,
        "resources": len(items),
        "held": sum(state_of(it, now) == "leased" for it in items),
        "deleted": 0,
        "changed_meanwhile": 0,
    }
    progress = common.Progress("deleting", len(items))
    counts: Counter[str] = Counter()

    class Ticking(leases.Driver):
        def perform(self, eff: Any, ddb: Any = None) -> Any:
            got = super().perform(eff, ddb)
            if isinstance(eff, Note) and not eff.level:
                progress.add()
            return got

    driver = Ticking(ddb, args.table, peers=writers, log=log, counts=counts)
    job = steps.PoolDelete(
        client_id=args.client,
        pool_id=args.pool,
        defined=pool is not None,
        items=tuple(items),
        now_us=now,
        force=args.force,
        quarantine_us=quarantine_us,
        grace_us=grace_us,
        dry_run=args.dry_run,
    )
    # Definition first: daemons stop handing out this pool at their next pool refresh; then
    # each item only as we read it unless --force (a lease taken since then survives); with
    # --force a held item's mapping is ended before the item goes (rasd.steps.admin).
    got = driver.run(steps.delete_pool(job))
    progress.close()
    ex = got.item
    if got.status == "leased":
        assert ex is not None
        raise common.JobError(
            f"refusing to delete pool {args.client}/{args.pool}: {got.detail} lease(s) held "
            f"(e.g. {ex.resource!r} by key {ex.key!r} until "
            f"{common.iso(ex.lease_expires_us)}); wait for them to end or pass --force"
        )
    if got.status == "quarantined":
        assert ex is not None
        raise common.JobError(
            f"refusing to delete pool {args.client}/{args.pool}: {got.detail} "
            f"resource(s) in quarantine (e.g. {ex.resource!r} until "
            f"{ex.quarantine_until or ex.lease_available}: a cache may still serve it); wait or "
            "pass --force (their names stay held until then)"
        )
    summary["deleted"] = counts["deleted"]
    summary["changed_meanwhile"] = counts["changed_meanwhile"]
    common.emit(summary)
    return 1 if summary["changed_meanwhile"] else 0


def pool_writers(
    ddb: Any, args: argparse.Namespace, items: Sequence[ResourceItem]
) -> dict[str, Any]:
    """The client that writes each region's items: ours for ``--region`` (or every region
    with ``--unreplicated``), a ``--peer-endpoint``'s for the others. Refuses (before any
    write) when a region of ``items`` has none."""
    regions = {it.region for it in items}
    if args.unreplicated:
        return dict.fromkeys(regions, ddb)
    region = common.ras_region(args, required=False)
    peers = dict(common.parse_peer(s) for s in args.peer_endpoint)
    out = {r: common.client_for(url, r, pool=4) for r, url in peers.items() if r != region}
    if region is not None:
        out[region] = ddb
    missing = sorted(regions - set(out))
    if missing:
        raise common.JobError(
            f"refusing to delete pool {args.client}/{args.pool}: it has items in region(s) "
            f"{', '.join(missing)}, which this command would write in another region's "
            "replica (racing their daemons' claims); pass --region for this endpoint's region "
            "and --peer-endpoint REGION=URL for each other (or --unreplicated for one plain "
            "table)"
        )
    return out


def resource_names(args: argparse.Namespace, existing: set[str]) -> tuple[list[str], int]:
    """New names to add and how many given names already existed (skipped)."""
    if args.count is not None:
        prefix = args.prefix if args.prefix is not None else f"{args.pool}-"
        check_resource_name(prefix + "0" * 6)
        names: list[str] = []
        i = 0
        while len(names) < args.count:
            name = f"{prefix}{i:06d}"
            if name not in existing:
                names.append(name)
            i += 1
        return names, 0
    lines = read_lines(args.file)
    names, seen, skipped = [], set(), 0
    for n, line in enumerate(lines, 1):
        name = line.strip()
        if not name:
            continue
        if len(name) > MAX_RESOURCE_LEN:
            raise common.UsageError(f"{args.file}:{n}: resource longer than {MAX_RESOURCE_LEN}")
        if name in existing or name in seen:
            skipped += 1
            continue
        seen.add(name)
        names.append(name)
    return names, skipped


def read_lines(path: str) -> list[str]:
    """The lines of ``--file`` (``-``: stdin) as UTF-8 text; UsageError naming the file and
    the line of bytes that are not UTF-8."""
    try:
        if path == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            if stdin is None:  # already text (a test's StringIO)
                return str(sys.stdin.read()).splitlines()
            data: bytes = stdin.read()
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        raise common.UsageError(f"cannot read --file {path}: {exc.strerror}")
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise common.UsageError(
            f"{'stdin' if path == '-' else path}:{line}: not UTF-8 (byte "
            f"{data[exc.start]:#04x}); resource names are UTF-8 text, one per line"
        )


def cmd_add_resources(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    common.check_name("pool", args.pool)
    region = common.ras_region(args)
    assert region is not None
    require_pool(ddb, args.table, args.client, args.pool)
    # A resource is unique per client (it is the sort key): never overwrite an existing item,
    # which might be leased, whatever pool it is in. A deleted name (a tombstone) is added
    # again, claimable no earlier than the tombstone's hold.
    existing: set[str] = set()
    held = 0
    for page in common.scan_pages(
        ddb,
        {
            "TableName": args.table,
            "KeyConditionExpression": "client_id = :c",
            "ExpressionAttributeValues": {":c": {"S": args.client}},
            "ProjectionExpression": "#res, pool_id, hold_until",
            "ExpressionAttributeNames": {"#res": "resource"},
            "ConsistentRead": True,
        },
    ):
        for it in page.get("Items", []):
            if not is_tombstone(it):
                existing.add(it["resource"]["S"])
    names, skipped = resource_names(args, existing)
    added = 0
    if not args.dry_run and names:
        progress = common.Progress("adding", len(names))
        now = common.now_us(args)
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="add") as pool:
            for got in pool.map(lambda n: put_resource(ddb, args, region, n, now), names):
                progress.add()
                if got == "exists":
                    skipped += 1
                else:
                    added += 1
                    held += got == "held"
        progress.close()
    common.emit(
        {
            "command": "add-resources",
            "client_id": args.client,
            "pool_id": args.pool,
            "region": region,
            "dry_run": args.dry_run,
            "added": added,
            "held_by_tombstone": held,
            "skipped_existing": skipped,
            **({"would_add": len(names)} if args.dry_run else {}),
        }
    )
    return 0


def put_resource(ddb: Any, args: argparse.Namespace, region: str, name: str, now_us: int) -> str:
    """Add one name, free (``rasd.steps.admin.add_resource``): ``"added"`` (claimable now),
    ``"held"`` (a tombstone's name: claimable from its ``hold_until``), or ``"exists"`` (a
    resource took the name meanwhile: left alone)."""
    got = leases.run(
        ddb, args.table, steps.add_resource(args.client, args.pool, region, name, now_us)
    )
    if got == "changing":
        raise common.JobError(f"{name!r} kept changing while it was added; look again")
    return got


RESOURCE_COLUMNS = [
    "pool_id",
    "resource",
    "region",
    "state",
    "key",
    "lease_expires",
    "quarantine_until",
    "version",
]


def cmd_list_resources(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    if args.pool is not None:
        common.check_name("pool", args.pool)
    if args.region is not None:
        common.check_region(args.region)
    now = common.now_us(args)
    want = args.state
    rows = []
    for it in client_items(ddb, args.table, args.client, args.pool, args.region):
        if want is not None and state_of(it, now) != want:
            continue
        rows.append(row_of(it, now))
        if args.limit and len(rows) >= args.limit:
            break
    show(args, rows, RESOURCE_COLUMNS)
    return 0


def cmd_show_resource(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    check_resource_name(args.resource)
    it = get_resource(ddb, args.table, args.client, args.resource)
    row = row_of(it, common.now_us(args))
    if args.json:
        sys.stdout.write(json.dumps(row) + "\n")
    else:
        width = max(len(k) for k in row)
        for k, v in row.items():
            sys.stdout.write(f"{k.ljust(width)}  {'-' if v is None else v}\n")
    return 0


def cmd_release_resource(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    check_resource_name(args.resource)
    region = common.ras_region(args)
    assert region is not None
    now = common.now_us(args)
    quarantine_us, grace_us = bounds(args)
    if args.quarantine is not None:
        quarantine_us = int(args.quarantine * US)
    base = {"command": "release-resource", "client_id": args.client, "resource": args.resource}
    # No app released it: apps may use it until its end, so it is claimable only after that
    # end plus the skew, however short the quarantine (docs/design.md, I1).
    prog = steps.release_resource(
        (args.client, args.resource), region, now, quarantine_us, grace_us
    )
    got = leases.run(ddb, args.table, prog)
    refused(args, got, "release")
    it = got.item
    assert it is not None
    if got.status == "not_leased":
        common.emit({**base, "released": False, "reason": "not leased"})
        return 0
    if got.status == "no_holder":
        raise common.JobError(
            f"{args.resource!r} was leased by an older rasd (no holder token); the liberator "
            "frees it when its lease ends"
        )
    if got.status == "lost_race":
        raise common.JobError(
            f"{args.resource!r} changed after it was read (a daemon wrote it); look again"
        )
    common.emit({**base, "released": True, "key": it.key, "claimable_from": got.detail})
    return 0


def refused(args: argparse.Namespace, got: steps.AdminResult, verb: str) -> None:
    """The refusals every one-resource command shares: no such resource; another region's
    (in a global table it would be written in the wrong replica and race that region's
    claims, last writer wins)."""
    if got.status == "missing":
        raise common.JobError(
            f"no resource {args.resource!r} of client {args.client} in {args.table}"
        )
    if got.status == "other_region":
        region = common.ras_region(args)
        raise common.JobError(
            f"{args.resource!r} belongs to region {got.detail}, not {region}: {verb} it with "
            f"--region {got.detail} against that region's table"
        )


def cmd_delete_resource(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    check_resource_name(args.resource)
    region = common.ras_region(args)
    assert region is not None
    now = common.now_us(args)
    quarantine_us, grace_us = bounds(args)
    # A held item's mapping is ended first: daemons must not serve a lease on it (docs/design.md).
    prog = steps.delete_resource(
        (args.client, args.resource), region, now, args.force, quarantine_us, grace_us
    )
    got = leases.run(ddb, args.table, prog)
    refused(args, got, "delete")
    it = got.item
    assert it is not None
    if got.status == "leased":
        raise common.JobError(
            f"refusing to delete {args.resource!r}: leased by key {it.key!r} until "
            f"{common.iso(it.lease_expires_us)}; pass --force to delete it anyway"
        )
    if got.status == "quarantined":
        raise common.JobError(
            f"refusing to delete {args.resource!r}: in quarantine until {got.detail} "
            "(a daemon's cache may still serve it to the key that released it); wait, or "
            "pass --force (the name stays held until then: a re-add is claimable no earlier)"
        )
    if got.status == "changed":
        raise common.JobError(f"{args.resource!r} changed after it was read; look again")
    common.emit(
        {
            "command": "delete-resource",
            "client_id": it.client_id,
            "resource": it.resource,
            "deleted": True,
            "name_held_until": got.detail,
        }
    )
    return 0


STATS_PROJECTION = (
    "client_id, #res, pool_id, #r, #k, lease_expires, lease_available, quarantine_until"
)


def collect_stats(
    ddb: Any, table: str, now_us: int, client_id: str | None, segments: int
) -> dict[tuple[str, str, str], Counter[str]]:
    """(client, pool, region) -> Counter of :func:`state_of`'s states. Parallel Scan of the
    table (or a Query of one client), page by page."""
    per_seg: list[dict[tuple[str, str, str], Counter[str]]] = [{} for _ in range(segments)]
    progress = common.Progress("scanning")

    def handle(seg: int, page: dict[str, Any]) -> None:
        out = per_seg[seg]
        for raw in page.get("Items", []):
            if not is_resource(raw):
                continue
            item = item_from_ddb(raw)
            k = (item.client_id, item.pool_id, item.region)
            state = state_of(item, now_us)
            out.setdefault(k, Counter())[state] += 1
        progress.add(int(page.get("ScannedCount", 0)))

    kw: dict[str, Any] = {
        "TableName": table,
        "ProjectionExpression": STATS_PROJECTION,
        "ExpressionAttributeNames": {"#res": "resource", "#r": "region", "#k": "key"},
    }
    if client_id is not None:
        kw["KeyConditionExpression"] = "client_id = :c"
        kw["ExpressionAttributeValues"] = {":c": {"S": client_id}}
        for page in common.scan_pages(ddb, kw):
            handle(0, page)
    else:
        for exc in common.parallel_scan(ddb, kw, segments, handle):
            if exc is not None:
                raise exc
    progress.close()
    total: dict[tuple[str, str, str], Counter[str]] = {}
    for d in per_seg:
        for k, c in d.items():
            total.setdefault(k, Counter()).update(c)
    return total


def cmd_stats(ddb: Any, args: argparse.Namespace) -> int:
    if args.client is not None:
        common.check_name("client", args.client)
    if args.pool is not None:
        common.check_name("pool", args.pool)
    if args.region is not None:
        common.check_region(args.region)
    now = common.now_us(args)
    stats = collect_stats(ddb, args.table, now, args.client, args.segments)
    # Defined pools without any resource show up too (region "-"), so they are not forgotten.
    for it in schema.list_pool_items(ddb, args.table):
        pr = pool_row(it)
        if not any(k[:2] == (pr["client_id"], pr["pool_id"]) for k in stats):
            stats[(pr["client_id"], pr["pool_id"], "-")] = Counter()
    rows = []
    for (c, p, r), cnt in sorted(stats.items()):
        if args.client is not None and c != args.client:
            continue
        if args.pool is not None and p != args.pool:
            continue
        if args.region is not None and r != args.region:
            continue
        rows.append({"client_id": c, "pool_id": p, "region": r, **counts_of(cnt)})
    show(args, rows, ["client_id", "pool_id", "region", *COUNT_COLUMNS])
    return 0


# --------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    conn = common.connection_parent()
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="print JSON instead of a table")
    dry = argparse.ArgumentParser(add_help=False)
    dry.add_argument("--dry-run", action="store_true", help="report, change nothing")
    one = argparse.ArgumentParser(add_help=False)
    one.add_argument("--client", required=True, help="client_id")
    one.add_argument("--resource", required=True, help="the resource string")

    p = argparse.ArgumentParser(
        prog=PROG,
        description=common.wrap(
            "Admin CLI for rasd's DynamoDB table: the table, pools, resources, stats. "
            "Listings print a table (or JSON with --json); changes print a one-line JSON "
            "summary. Read-only commands cover every region unless --region is given on the "
            "command line (RASD_REGION is not used as a filter); add-resources and "
            "release-resource need --region or RASD_REGION. Run `rasadmin COMMAND --help` "
            "for each command's flags."
        ),
        epilog=common.ENV_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(
        name: str,
        fn: Callable[[Any, argparse.Namespace], int],
        help: str,
        parents: Sequence[argparse.ArgumentParser],
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(
            name,
            help=help,
            description=common.wrap(help),
            parents=[conn, *parents],
            epilog=common.ENV_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sp.set_defaults(func=fn)
        return sp

    def client_pool(sp: argparse.ArgumentParser, pool_required: bool = True) -> None:
        sp.add_argument("--client", required=True, help="client_id")
        sp.add_argument("--pool", required=pool_required, help="pool_id")

    sp = add(
        "create-table",
        cmd_create_table,
        "create the table with both indexes and the stream (no-op if it exists)",
        [],
    )
    sp.add_argument("--no-wait", action="store_true", help="do not wait until it is ACTIVE")

    sp = add("add-pool", cmd_add_pool, "define (or redefine) a client's pool", [])
    client_pool(sp)
    sp.add_argument(
        "--max-lease",
        type=float,
        default=DEFAULT_MAX_LEASE_S,
        metavar="SECONDS",
        help=f"longest lease a client may ask for (default {DEFAULT_MAX_LEASE_S})",
    )

    sp = add("list-pools", cmd_list_pools, "list pool definitions", [out])
    sp.add_argument("--client", help="only this client's pools")

    sp = add("show-pool", cmd_show_pool, "a pool's definition and counts per region", [out])
    client_pool(sp)

    sp = add(
        "delete-pool",
        cmd_delete_pool,
        "delete a pool's definition and all its resource items (every region); refuses "
        "while a lease in it is held",
        [dry],
    )
    client_pool(sp)
    sp.add_argument(
        "--force",
        action="store_true",
        help="delete even while leases are held or resources are in quarantine (their names "
        "stay held until those end: a re-add is claimable no earlier)",
    )
    common.add_peer_endpoint(
        sp,
        "DynamoDB endpoint of REGION's replica: that region's items are deleted there "
        "(repeatable; needed for every region of the pool but --region)",
    )
    sp.add_argument(
        "--unreplicated",
        action="store_true",
        help="one plain table holds every region's items (development, tests): delete them "
        "all through --endpoint-url",
    )

    sp = add(
        "add-resources",
        cmd_add_resources,
        "add free resources to a pool in one region (spread over the 10 sub-partitions); "
        "names that already exist for the client are skipped, never overwritten; a deleted "
        "name is added again, claimable only once the lease or quarantine it had has ended",
        [dry],
    )
    client_pool(sp)
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--count", type=common.positive_int, help="add N generated names")
    src.add_argument(
        "--file", metavar="F", help="one resource per line ('-' = stdin); blank lines skipped"
    )
    sp.add_argument(
        "--prefix", help="with --count: names are PREFIX000000, PREFIX000001... (default 'POOL-')"
    )

    sp = add("list-resources", cmd_list_resources, "list a client's resource items", [out])
    client_pool(sp, pool_required=False)
    st = sp.add_mutually_exclusive_group()
    for flag, what in (
        ("leased", "only leases that are running"),
        ("free", "only items claimable now"),
        (
            "quarantined",
            "only items no lease holds that are not claimable yet (quarantine_until, or a "
            "lease_available in the future)",
        ),
        ("expired", "only leases past their end, not yet liberated"),
    ):
        st.add_argument(f"--{flag}", dest="state", action="store_const", const=flag, help=what)
    sp.add_argument("--limit", type=common.positive_int, help="print at most N items")

    add("show-resource", cmd_show_resource, "one resource item, every attribute", [out, one])

    sp = add(
        "release-resource",
        cmd_release_resource,
        "give a leased item back the way a daemon does: the key's mapping first, then the "
        "item, claimable again after --quarantine and, since no app released it, not before "
        "its lease's end plus max_clock_skew (only items of --region)",
        [one],
    )
    sp.add_argument(
        "--quarantine",
        type=common.non_negative_float,
        default=None,
        help="seconds the item stays unclaimable, so daemons still serving it from their "
        "caches stop first; at least the daemons' confirm_interval + max_clock_skew + "
        f"replication_lag (default: that sum, from --config; {Config().quarantine:g} with the "
        "daemons' defaults)",
    )

    sp = add(
        "delete-resource",
        cmd_delete_resource,
        "delete one resource item of --region; refuses while it is leased or in quarantine. "
        "Its name stays held (a tombstone) until its lease or quarantine ends: a re-add is "
        "claimable no earlier",
        [one],
    )
    sp.add_argument(
        "--force", action="store_true", help="delete even while leased or in quarantine"
    )

    sp = add(
        "adopt",
        adopt.cmd_adopt,
        "bring a table the paper's agent wrote to rasd's schema in place: indexes, stream and "
        "TTL, pool definitions, and a mapping item for every running lease of --region (each "
        "keeps its resource and end). Idempotent; --resume-from continues an interrupted run",
        [dry],
    )
    adopt.add_parser(sp)

    add(
        "rollout",
        rollout.cmd_rollout,
        "show the table's rollout record: whether hosts running the paper's in-process agent "
        "may write it (rasd's daemons and jobs then keep the rules that are safe beside it)",
        [],
    )
    add(
        "end-rollout",
        rollout.cmd_end_rollout,
        "end rollout mode once no host runs the paper's agent: refused (exit 1) while any item "
        "holds a lease of that agent, running or not yet freed. Daemons follow within "
        "pool_refresh + pool_refresh_timeout",
        [dry],
    )

    sp = add(
        "stats",
        cmd_stats,
        "free (claimable + quarantined) / claimable / quarantined / leased / "
        "expired-not-liberated counts per client, pool and region",
        [out],
    )
    sp.add_argument("--client", help="only this client (a Query instead of a Scan)")
    sp.add_argument("--pool", help="only this pool")
    sp.add_argument(
        "--segments", type=common.positive_int, default=4, help="parallel Scan segments"
    )
    return p


def command(args: argparse.Namespace) -> int:
    """Run the command ``args`` name (it prints its own output): its exit status."""
    region = args.region or None
    if region is None:
        try:
            region = common.ras_region(args, required=False)
        except common.UsageError:
            region = None
    ddb = common.make_client(args, region, pool=getattr(args, "segments", 4) + 2)
    return int(args.func(ddb, args))


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(build_parser(), argv, command)


if __name__ == "__main__":
    raise SystemExit(main())

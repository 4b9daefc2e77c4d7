"""rasadmin's table and pool commands: create-table, add-pool, list-pools, show-pool and
delete-pool."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

import structlog

from rasd.core import schema
from rasd.core.lease import REGION_RE, ResourceItem
from rasd.steps import Note
from rasd.steps import admin as steps

from .. import common, leases
from .listing import COUNT_COLUMNS, counts_of, show, state_of
from .reads import bounds, client_items, get_pool, no_pool, pool_row

log = structlog.get_logger("rasd_jobs.admin")


def cmd_create_table(ddb: Any, args: argparse.Namespace) -> int:
    created = schema.create_table(ddb, args.table, wait=not args.no_wait)
    common.emit({"command": "create-table", "table": args.table, "created": created})
    return 0


def cmd_add_pool(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    common.check_name("pool", args.pool)
    if not 0 < args.max_lease <= 366 * 86_400:
        raise common.UsageError(f"bad --max-lease {args.max_lease:g}: 1 s to 366 days")
    if args.home is not None and not REGION_RE.match(args.home):
        raise common.UsageError(f"bad --home {args.home!r}: not a region name")
    existed = get_pool(ddb, args.table, args.client, args.pool) is not None
    define = steps.define_pool(args.client, args.pool, args.max_lease, home=args.home)
    leases.run(ddb, args.table, define)
    common.emit(
        {
            "command": "add-pool",
            "client_id": args.client,
            "pool_id": args.pool,
            "max_lease": common.seconds(args.max_lease),
            "home": args.home,
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
    show(args, rows, ["client_id", "pool_id", "max_lease", "home"])
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
        raise no_pool(args.table, args.client, args.pool)
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
        raise no_pool(args.table, args.client, args.pool)
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
    out = {
        r: common.client_for(url, r, pool=4, interactive=True)
        for r, url in peers.items()
        if r != region
    }
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

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
from rasd.steps import admin as admin_steps

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
    asked = outage_budget(args)
    old = get_pool(ddb, args.table, args.client, args.pool)
    budget, quarantine = kept_budget(args, old, asked)
    define = admin_steps.define_pool(
        args.client,
        args.pool,
        args.max_lease,
        home=args.home,
        outage_budget_s=budget,
        quarantine_s=quarantine,
    )
    leases.run(ddb, args.table, define)
    common.emit(
        {
            "command": "add-pool",
            "client_id": args.client,
            "pool_id": args.pool,
            "max_lease": common.seconds(args.max_lease),
            "home": args.home,
            "outage_budget": common.seconds(budget) if budget else None,
            "quarantine": common.seconds(quarantine) if budget else None,
            "updated": old is not None,
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
    show(args, rows, ["client_id", "pool_id", "max_lease", "home", "outage_budget", "quarantine"])
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
        "outage_budget": pool["outage_budget"] if pool else None,
        "quarantine": pool["quarantine"] if pool else None,
        "regions": regions,
    }
    if args.json:
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        head = f"pool {args.client}/{args.pool}: "
        head += f"max_lease {pool['max_lease']:g}s" if pool else "NOT DEFINED (orphan items)"
        if pool and pool["outage_budget"]:
            head += (
                f", outage budget {pool['outage_budget']:g}s (released resources quarantined "
                f"{pool['quarantine']:g}s)"
            )
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
    job = admin_steps.PoolDelete(
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
    got = driver.run(admin_steps.delete_pool(job))
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


def outage_budget(args: argparse.Namespace) -> tuple[float, float] | None:
    """The (outage budget, quarantine) in seconds add-pool was given, None when neither;
    refuses what would break I1 (docs/design.md, "An outage budget"): a budget comes with
    its quarantine, long enough on the daemons' bounds (--config)."""
    budget, quarantine = args.outage_budget, args.quarantine
    if budget is None and quarantine is None:
        return None
    if budget is None or budget <= 0:
        raise common.UsageError("--quarantine goes with --outage-budget (seconds, > 0)")
    cfg = common.daemon_config(args)
    if budget <= cfg.confirm_interval:
        raise common.UsageError(
            f"--outage-budget {budget:g}: no longer than confirm_interval "
            f"({cfg.confirm_interval:g} s), which every pool has already"
        )
    if budget > 7 * 86_400:
        raise common.UsageError(f"--outage-budget {budget:g}: at most 7 days")
    least = budget + cfg.max_clock_skew + cfg.replication_lag
    if quarantine is None or quarantine < least:
        raise common.UsageError(
            f"refusing --outage-budget {budget:g} without its quarantine: pass --quarantine "
            f"{least:g} or more (the budget + max_clock_skew {cfg.max_clock_skew:g} + "
            f"replication_lag {cfg.replication_lag:g}); every resource of the pool an app "
            "releases stays unclaimable that long"
        )
    if args.home is not None:
        raise common.UsageError("an outage budget is not offered for strict pools (--home)")
    return budget, quarantine


def kept_budget(
    args: argparse.Namespace, old: dict[str, Any] | None, asked: tuple[float, float] | None
) -> tuple[float, float]:
    """The pool's (outage budget, quarantine) to write, (0, 0) for none. A budget is set
    when the pool is defined: daemons read a definition at different times, so a change
    would let one host serve a released lease longer than another keeps its resource out.
    A redefinition that does not name them keeps the pool's."""
    kept = (old["outage_budget"] or 0.0, old["quarantine"] or 0.0) if old else (0.0, 0.0)
    if asked is None:
        return kept
    if old is not None and asked != kept:
        raise common.JobError(
            f"refusing to change the outage budget of pool {args.client}/{args.pool} "
            f"(now {kept[0]:g} s, its quarantine {kept[1]:g} s): daemons read the definition "
            "at different times, and one would serve a released lease longer than another "
            "keeps its resource out; define a new pool instead"
        )
    return asked

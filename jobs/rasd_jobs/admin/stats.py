"""rasadmin stats: the counts of each state per client, pool and region, from a parallel Scan
of the table (or a Query of one client)."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from rasd.core import schema
from rasd.core.serialize import item_from_ddb

from .. import common
from .listing import COUNT_COLUMNS, counts_of, show, state_of
from .reads import is_resource, no_pool, pool_row

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
    if args.pool is not None and not any(
        p == args.pool and args.client in (None, c) for c, p, _ in stats
    ):
        raise no_pool(args.table, args.client, args.pool)
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

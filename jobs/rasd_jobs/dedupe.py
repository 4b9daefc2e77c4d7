"""``ras-dedupe``: release the extra resources of a key that got several (Jenkins, 15 min).

Scans ``leased_resources``, groups live leases by (client_id, pool_id, key), and drives
``rasd.steps.dedupe.dedupe_key`` on each group of two or more. What it keeps, releases and
counts: docs/operations.md, "ras-dedupe"; why it is safe: docs/design.md, "Arguments,
interleaving by interleaving" (cross-region).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from rasd.config import Config
from rasd.core.lease import US, ResourceItem
from rasd.core.reads import LEASED_INDEX
from rasd.core.verdicts import outlasts, served_end
from rasd.steps.dedupe import DedupeRun, dedupe_key

from . import common, leases

log = structlog.get_logger("rasd_jobs.dedupe")

GroupKey = tuple[str, str, str]  # (client_id, pool_id, key)

PROJECTION = "client_id, #res, pool_id, #r, #p, #k, lease_expires, lease_acquired, version"
PROJECTION_NAMES = {"#res": "resource", "#r": "region", "#p": "partition", "#k": "key"}


@dataclass(frozen=True)
class Options:
    table: str
    region: str
    now_us: int
    segments: int = 4
    page_size: int | None = None
    dry_run: bool = False
    #: region -> boto3 client of that region's replica (from --peer-endpoint)
    peers: dict[str, Any] = field(default_factory=dict)
    quarantine_us: int = int(Config().quarantine * US)
    #: the daemons' skew_margin: a survivor must outlast an extra by this much
    margin_us: int = int(Config().skew_margin * US)
    #: the clock-skew bound: an extra is claimable no earlier than its end plus this
    grace_us: int = int(Config().max_clock_skew * US)


def duplicates(
    groups: dict[GroupKey, list[ResourceItem]],
) -> list[tuple[GroupKey, list[ResourceItem]]]:
    """Groups holding more than one item, in a stable order."""
    return sorted(((k, v) for k, v in groups.items() if len(v) > 1), key=lambda kv: kv[0])


def collect(ddb: Any, opts: Options, counts: Counter[str]) -> dict[GroupKey, list[ResourceItem]]:
    """Scan ``leased_resources`` in parallel segments; group items by (client, pool, key)."""
    kw: dict[str, Any] = {
        "TableName": opts.table,
        "IndexName": LEASED_INDEX,
        "ProjectionExpression": PROJECTION,
        "ExpressionAttributeNames": PROJECTION_NAMES,
    }
    if opts.page_size:
        kw["Limit"] = opts.page_size
    per_seg: list[list[ResourceItem]] = [[] for _ in range(opts.segments)]
    seg_counts: list[Counter[str]] = [Counter() for _ in range(opts.segments)]

    def handle(seg: int, page: dict[str, Any]) -> None:
        seg_counts[seg]["scanned"] += int(page.get("ScannedCount", 0))
        for raw in page.get("Items", []):
            item = common.parsed(raw, seg_counts[seg], log)
            if item is not None:
                per_seg[seg].append(item)

    failures = common.parallel_scan(ddb, kw, opts.segments, handle)
    counts.update(common.segments_total(seg_counts, failures, log))
    groups: dict[GroupKey, list[ResourceItem]] = {}
    for items in per_seg:
        for it in items:
            assert it.key is not None
            if it.expired(opts.now_us):
                # Lapsed leases are the liberator's. The daemons pick among live leases only,
                # so dedupe must too, or it could release the one they serve.
                counts["expired_skipped"] += 1
                continue
            groups.setdefault((it.client_id, it.pool_id, it.key), []).append(it)
        items.clear()
    return groups


def run(ddb: Any, opts: Options) -> dict[str, Any]:
    """Scan, group, and hand every duplicate group to ``rasd.steps.dedupe.dedupe_key``
    (driven by ``rasd_jobs.leases.Driver``: each region's items read and written in that region's
    replica, ``opts.peers``)."""
    started = time.monotonic()
    counts: Counter[str] = Counter()
    groups = collect(ddb, opts, counts)
    dups = duplicates(groups)
    del groups
    driver = leases.Driver(ddb, opts.table, peers=opts.peers, log=log, counts=counts)
    bounds = DedupeRun(
        region=opts.region,
        now_us=opts.now_us,
        quarantine_us=opts.quarantine_us,
        margin_us=opts.margin_us,
        grace_us=opts.grace_us,
        peers=frozenset(opts.peers),
        dry_run=opts.dry_run,
    )
    for (client_id, pool_id, key), items in dups:
        try:
            driver.run(dedupe_key(tuple(items), bounds))
        except Exception as exc:  # noqa: BLE001 - counted; the next run retries
            counts["errors"] += 1
            log.error("key_failed", client_id=client_id, pool_id=pool_id, key=key, error=repr(exc))
    summary: dict[str, Any] = {
        "job": "dedupe",
        "table": opts.table,
        "region": opts.region,
        "dry_run": opts.dry_run,
        "scanned": counts["scanned"],
        "duplicate_keys": counts["duplicate_keys"],
        "released": counts["released"],
        "orphans_freed": counts["orphans_freed"],
        "kept_until_survivor_outlasts": counts["kept_until_survivor_outlasts"],
        "foreign_reported": counts["foreign_reported"],
        "lost_races": counts["lost_races"],
        "errors": counts["errors"],
        "seconds": round(time.monotonic() - started, 3),
    }
    return common.summary_tail(summary, counts, "would_release")


def build_parser() -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = common.parser(
        "ras-dedupe",
        "Release extra resources of keys that got several (cross-region races): keep the "
        "one the daemons also pick (earliest lease_acquired, then region, then resource) and "
        "release the others of this region; report the other regions' extras, or release "
        "them through --peer-endpoint. Prints one JSON summary line on stdout: scanned, "
        "duplicate_keys, released, orphans_freed (held items their region's mapping does not "
        "name), foreign_reported, lost_races, errors, seconds.",
        [common.job_parent()],
    )
    common.add_peer_endpoint(
        p,
        "DynamoDB endpoint of another region's replica; extras of REGION are released "
        "there instead of reported (repeatable)",
    )
    return p


def job(args: argparse.Namespace) -> dict[str, Any]:
    """One run from the command line's ``args``: its summary."""
    region = common.ras_region(args)
    assert region is not None
    peers_urls = dict(common.parse_peer(s) for s in args.peer_endpoint)
    if region in peers_urls:
        raise common.UsageError(f"--peer-endpoint names this job's own region {region}")
    now = common.now_us(args)
    rules = common.daemon_config(args).rules()
    ddb = common.make_client(args, region, pool=args.segments + 2)
    peers = {r: common.client_for(url, r, pool=4) for r, url in peers_urls.items()}
    opts = Options(
        table=args.table,
        region=region,
        now_us=now,
        segments=args.segments,
        page_size=args.page_size,
        dry_run=args.dry_run,
        peers=peers,
        quarantine_us=rules.quarantine_us,
        margin_us=rules.margin_us,
        grace_us=rules.grace_us,
    )
    log.info("start", table=args.table, region=region, peers=sorted(peers_urls))
    return run(ddb, opts)


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(build_parser(), argv, job)


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "Options",
    "build_parser",
    "collect",
    "duplicates",
    "job",
    "main",
    "outlasts",
    "run",
    "served_end",
]

"""``ras-liberator``: free expired leases, repair orphans and re-list quarantines that are over
(Jenkins, hourly).

Scans the leased index in parallel segments, page by page, and drives ``rasd.steps.repair``
per item, in its own region only unless ``--all-regions``. Flags and summary:
docs/operations.md, "ras-liberator"; why each free is safe: docs/design.md, "Arguments,
interleaving by interleaving".
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from rasd.config import Config
from rasd.core.lease import US, ResourceItem, fmt_time
from rasd.core.reads import LEASED_INDEX
from rasd.core.rollout import Rollout, paper_lease
from rasd.core.serialize import is_resource_item
from rasd.steps import Program
from rasd.steps.repair import LiberatorRun, liberate_item, relist_item

from . import common, leases

log = structlog.get_logger("rasd_jobs.liberator")

DEFAULT_GRACE_S = 60.0
DEFAULT_ORPHAN_AGE_S = 120.0
DEFAULT_QUARANTINE_S = Config().quarantine


@dataclass(frozen=True)
class Options:
    table: str
    region: str | None  # None: every region (--all-regions)
    now_us: int
    grace_us: int = int(DEFAULT_GRACE_S * US)
    segments: int = 4
    page_size: int | None = None
    dry_run: bool = False
    #: held resources acquired longer ago than this are checked for orphans (None: never)
    orphan_age_us: int | None = int(DEFAULT_ORPHAN_AGE_S * US)
    quarantine_us: int = int(DEFAULT_QUARANTINE_S * US)
    #: put items whose quarantine is over back in the available index (a base-table Scan)
    relist: bool = True
    #: force rollout mode (the paper's agent may run: a freed orphan stays unclaimable until
    #: its lease's end plus the grace as well, since that agent may have answered it to its
    #: end); otherwise the table's rollout record, read at the start of the run, decides
    legacy_agents: bool = False


def scan_kwargs(opts: Options) -> dict[str, Any]:
    """The Scan of ``leased_resources`` with the expiry and age (and region) filtered
    server-side."""
    cond = "lease_expires < :cutoff"
    values: dict[str, Any] = {":cutoff": {"S": fmt_time(opts.now_us - opts.grace_us)}}
    if opts.orphan_age_us is not None:
        cond = "(lease_expires < :cutoff OR lease_acquired < :old)"
        values[":old"] = {"S": fmt_time(opts.now_us - opts.orphan_age_us)}
    return _scan(opts, cond, values, index=LEASED_INDEX)


def relist_scan_kwargs(opts: Options) -> dict[str, Any]:
    """The Scan of the base table for quarantined items whose quarantine is over."""
    return _scan(opts, "quarantine_until <= :now", {":now": {"S": fmt_time(opts.now_us)}})


def _scan(
    opts: Options, cond: str, values: dict[str, Any], index: str | None = None
) -> dict[str, Any]:
    """A Scan's arguments: ``cond`` (and the job's region, if it has one) filtered
    server-side, pages of ``page_size``."""
    names: dict[str, str] = {}
    if opts.region is not None:
        cond += " AND #r = :region"
        names["#r"] = "region"
        values = {**values, ":region": {"S": opts.region}}
    kw: dict[str, Any] = {
        "TableName": opts.table,
        "FilterExpression": cond,
        "ExpressionAttributeValues": values,
    }
    if index is not None:
        kw["IndexName"] = index
    if names:
        kw["ExpressionAttributeNames"] = names
    if opts.page_size:
        kw["Limit"] = opts.page_size
    return kw


def run(ddb: Any, opts: Options) -> dict[str, Any]:
    """Scan and free; returns the summary (scanned, expired, freed, lost_races, errors...).
    Each item of a page goes through ``rasd.steps.repair.liberate_item`` (or, for the
    quarantine Scan, ``relist_item``), driven by ``rasd_jobs.leases.Driver``."""
    started = time.monotonic()
    cutoff = opts.now_us - opts.grace_us
    # One counter (and driver) per segment thread, summed at the end: no shared mutable state.
    counts: list[Counter[str]] = [Counter() for _ in range(opts.segments)]
    drivers = [leases.Driver(ddb, opts.table, log=log, counts=c) for c in counts]
    try:
        record = common.read_rollout(ddb, opts.table)
    except Exception as exc:  # noqa: BLE001 - counted; rollout mode's rules are the safe ones
        counts[0]["errors"] += 1
        log.error("rollout_unreadable", error=common.describe_error(exc))
        record = Rollout(paper_agents=True)
    bounds = LiberatorRun(
        now_us=opts.now_us,
        grace_us=opts.grace_us,
        orphan_age_us=opts.orphan_age_us,
        quarantine_us=opts.quarantine_us,
        legacy_agents=opts.legacy_agents or record.paper_agents,
        dry_run=opts.dry_run,
    )
    # once a lease of the paper's agent shows up, the rest of the run keeps rollout mode's rules
    seen_paper = threading.Event()
    bounds_after = replace(bounds, legacy_agents=True)

    def watch(item: ResourceItem, c: Counter[str]) -> None:
        """A lease of the paper's agent in the scan while the record says none may run."""
        if bounds.legacy_agents or not paper_lease(item):
            return
        c["paper_leases_found"] += 1
        first = not seen_paper.is_set()
        seen_paper.set()
        if first and not opts.dry_run:
            common.raise_rollout(
                ddb, opts.table, f"ras-liberator:{socket.gethostname()}",
                f"paper lease on {item.resource}", log,
            )  # fmt: skip

    def ours(page: dict[str, Any], c: Counter[str]) -> Iterator[ResourceItem]:
        """The page's resource items of the job's region (an item that does not parse is
        counted as an error and logged)."""
        for raw in page.get("Items", []):
            if not is_resource_item(raw):
                continue
            item = common.parsed(raw, c, log)
            if item is not None and (opts.region is None or item.region == opts.region):
                yield item

    def handle(seg: int, page: dict[str, Any]) -> None:
        c = counts[seg]
        c["scanned"] += int(page.get("ScannedCount", 0))
        for item in ours(page, c):
            watch(item, c)
            run_item(
                seg, liberate_item(item, bounds_after if seen_paper.is_set() else bounds), item
            )

    def handle_quarantined(seg: int, page: dict[str, Any]) -> None:
        c = counts[seg]
        c["relist_scanned"] += int(page.get("ScannedCount", 0))
        for item in ours(page, c):
            run_item(seg, relist_item(item, opts.now_us, opts.dry_run), item)

    def run_item(seg: int, prog: Program[str], item: ResourceItem) -> None:
        """One item's program; a failure it did not count (an item that does not parse
        when read again) is counted here: the next run retries."""
        try:
            drivers[seg].run(prog)
        except Exception as exc:  # noqa: BLE001 - counted; the next run retries
            counts[seg]["errors"] += 1
            log.error("item_failed", resource=item.resource, error=repr(exc))

    failures = common.parallel_scan(ddb, scan_kwargs(opts), opts.segments, handle)
    if opts.relist:
        failures += common.parallel_scan(
            ddb, relist_scan_kwargs(opts), opts.segments, handle_quarantined
        )
    total = common.segments_total(counts, failures, log)
    summary: dict[str, Any] = {
        "job": "liberator",
        "table": opts.table,
        "region": opts.region if opts.region is not None else "*",
        "dry_run": opts.dry_run,
        "cutoff": fmt_time(cutoff),
        "scanned": total["scanned"],
        "expired": total["expired"],
        "freed": total["freed"],
        "lost_races": total["lost_races"],
        "orphans_checked": total["checked"],
        "orphans": total["orphans"],
        "orphans_freed": total["orphans_freed"],
        "foreign_held": total["foreign"],
        "quarantine_over": total["quarantine_over"],
        "relisted": total["relisted"],
        "rollout": bool(bounds.legacy_agents or seen_paper.is_set()),
        "paper_leases_found": total["paper_leases_found"],
        "errors": total["errors"],
        "seconds": round(time.monotonic() - started, 3),
    }
    return common.summary_tail(summary, total, "would_free")


def build_parser() -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = common.parser(
        "ras-liberator",
        "Free expired leases: every leased item of the region whose lease_expires is older "
        "than now minus --grace goes back to the available_resources index. Conditional "
        "writes make it safe next to daemons and other liberators. Prints one JSON summary "
        "line on stdout: scanned, expired, freed, lost_races (changed by someone else after "
        "our read; left alone), orphans_checked, orphans, orphans_freed (held resources no "
        "mapping names, freed with quarantine, and held to their lease end plus --grace "
        "when a mapping may have named them), foreign_held (held by the paper's agent with a "
        "stale holder: left to run), quarantine_over and relisted (quarantined items put back "
        "in the available index), errors, seconds.",
        [common.job_parent()],
    )
    p.add_argument(
        "--grace",
        type=common.non_negative_float,
        default=DEFAULT_GRACE_S,
        help=f"seconds a lease must be past its end before it is freed; covers clock skew "
        f"between hosts (default {DEFAULT_GRACE_S:g})",
    )
    p.add_argument(
        "--orphan-age",
        type=common.non_negative_float,
        default=DEFAULT_ORPHAN_AGE_S,
        help="held resources acquired longer ago than this many seconds are checked against "
        "their key's mapping and freed (with quarantine) when no mapping names them: what a "
        f"daemon killed between two writes leaves (default {DEFAULT_ORPHAN_AGE_S:g})",
    )
    p.add_argument(
        "--quarantine",
        type=common.non_negative_float,
        default=None,
        help="seconds a freed orphan stays unclaimable; at least the daemons' "
        "confirm_interval + max_clock_skew + replication_lag (default: that sum, from "
        f"--config; {DEFAULT_QUARANTINE_S:g} with the daemons' defaults)",
    )
    p.add_argument(
        "--legacy-agents",
        action="store_true",
        help="force rollout mode (a freed orphan held until its lease's end too, as while the "
        "paper's in-process agent runs); by default the table's rollout record decides "
        "(rasadmin adopt / end-rollout)",
    )
    p.add_argument(
        "--no-legacy-agents",
        action="store_true",
        help="accepted for old Jenkins jobs and ignored: the table's rollout record decides",
    )
    p.add_argument(
        "--no-relist",
        action="store_true",
        help="do not Scan the base table for quarantined items whose quarantine is over (the "
        "daemons re-list what they quarantined themselves; this catches the rest)",
    )
    p.add_argument(
        "--all-regions",
        action="store_true",
        help="free expired leases of every region, not just --region. Only for a single, "
        "unreplicated table or a region whose daemons are gone: on a global table, writing "
        "another region's items can race its daemons across replicas",
    )
    return p


def job(args: argparse.Namespace) -> dict[str, Any]:
    """One run from the command line's ``args``: its summary."""
    region = common.ras_region(args, required=not args.all_regions)
    cfg = common.daemon_config(args)
    if args.grace < cfg.max_clock_skew:
        raise common.UsageError(
            f"--grace {args.grace:g} is below the daemons' max_clock_skew "
            f"{cfg.max_clock_skew:g}: a lease could be freed while a host still serves it"
        )
    quarantine = cfg.quarantine if args.quarantine is None else args.quarantine
    opts = Options(
        table=args.table,
        region=None if args.all_regions else region,
        now_us=common.now_us(args),
        grace_us=int(args.grace * US),
        orphan_age_us=int(args.orphan_age * US),
        quarantine_us=int(quarantine * US),
        segments=args.segments,
        page_size=args.page_size,
        dry_run=args.dry_run,
        relist=not args.no_relist,
        legacy_agents=args.legacy_agents,
    )
    if args.no_legacy_agents:
        log.warning(
            "no_legacy_agents_ignored",
            hint="the table's rollout record decides (rasadmin end-rollout turns it off)",
        )
    ddb = common.make_client(args, region, pool=args.segments + 2)
    log.info("start", **{k: v for k, v in vars(args).items() if k != "now"})
    return run(ddb, opts)


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(build_parser(), argv, job)


if __name__ == "__main__":
    raise SystemExit(main())

"""``rasadmin adopt``: bring a table the paper's agent wrote to rasd's schema, in place.

What the paper's agent leaves is a table of resource items (``key`` and ``lease_expires``
while leased, ``lease_available`` while free, ``version`` on every write) with the two
indexes. rasd needs, besides (docs/schema.md):

1. the indexes, the stream (new and old images) and TTL on ``ttl``: checked, and what is
   missing is added (an index with other keys is an error: the command stops);
2. a pool definition (``#meta``/``pool#{client}#{pool}``) for every pool the items name,
   added when absent with ``--max-lease`` (an existing one is left as it is);
3. a mapping item for every running lease of the region: each is adopted where it is, by the
   daemon's own adoption (``map_acquire`` at the mapping version read, then ``adopt`` on the
   item conditional on the version read strongly consistent, then ``map_confirm``). The key
   keeps its resource and its end; the paper's agent keeps finding it through the leased
   index.

Every write is conditional and every step checks what is already there, so the command is
idempotent: a second run reads and writes nothing but the summary (``writes`` 0). It is
resumable: the Scan goes page by page and logs the position after each page on stderr
(``page_done``, ``resume_from``); ``--resume-from`` starts after it (a rerun from the start
only costs reads). ``--dry-run`` reads and counts, writes nothing.

A key the paper's agent split (it holds a running lease while its mapping names another
resource of the region) is counted in ``kept_split`` and left alone: rasd serves what the
mapping names; the other runs to its end (or ``ras-dedupe`` releases it).
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import time
from collections import Counter
from typing import Any

import structlog

from rasd.config import Config
from rasd.core import decide as D
from rasd.core import schema
from rasd.core.lease import ResourceItem
from rasd.core.serialize import is_resource_item, pool_meta_key, resource_from
from rasd.steps import admin as steps

from . import common, leases, rollout

log = structlog.get_logger("rasd_jobs.adopt")

#: log a progress line every this many items scanned
PROGRESS_EVERY = 1000


def ensure_schema(ddb: Any, table: str, dry_run: bool) -> list[str]:
    """Add what rasd needs and the table lacks: an index, the stream, TTL. Returns what was
    (or, with ``dry_run``, would be) changed. Raises JobError for an index with other keys."""
    desc = ddb.describe_table(TableName=table)["Table"]
    want = {g["IndexName"]: g for g in schema.table_spec(table)["GlobalSecondaryIndexes"]}
    have = {g["IndexName"]: g for g in desc.get("GlobalSecondaryIndexes", [])}
    changes: list[str] = []
    attrs = {a["AttributeName"]: a for a in schema.table_spec(table)["AttributeDefinitions"]}
    for name, spec in want.items():
        got = have.get(name)
        if got is not None:
            if got["KeySchema"] != spec["KeySchema"]:
                raise common.JobError(
                    f"index {name} has keys {got['KeySchema']}, rasd needs {spec['KeySchema']}"
                )
            continue
        changes.append(f"create index {name}")
        if dry_run:
            continue
        used = [attrs[k["AttributeName"]] for k in spec["KeySchema"]]
        ddb.update_table(
            TableName=table,
            AttributeDefinitions=used,
            GlobalSecondaryIndexUpdates=[{"Create": spec}],
        )
    stream = desc.get("StreamSpecification") or {}
    if not stream.get("StreamEnabled") or stream.get("StreamViewType") != "NEW_AND_OLD_IMAGES":
        changes.append("enable the stream (NEW_AND_OLD_IMAGES)")
        if not dry_run:
            if stream.get("StreamEnabled"):
                raise common.JobError(
                    f"the stream is on with {stream.get('StreamViewType')}; rasd needs "
                    "NEW_AND_OLD_IMAGES (turn it off first: readers of it lose their place)"
                )
            ddb.update_table(
                TableName=table,
                StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
            )
    try:
        ttl = ddb.describe_time_to_live(TableName=table).get("TimeToLiveDescription", {})
    except Exception:  # noqa: BLE001 - TTL is housekeeping, not correctness
        ttl = {}
    if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
        changes.append("enable TTL on ttl")
        if not dry_run:
            try:
                ddb.update_time_to_live(
                    TableName=table,
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"},
                )
            except Exception as exc:  # noqa: BLE001 - mapping items then stay: reported
                log.warning("ttl_not_enabled", error=repr(exc))
    return changes


def ensure_pool(ddb: Any, table: str, client_id: str, pool_id: str, max_lease_s: float) -> bool:
    """Define the pool unless it is defined: True when this call added it."""
    return leases.run(ddb, table, steps.define_pool(client_id, pool_id, max_lease_s, only_new=True))


def pool_defined(ddb: Any, table: str, client_id: str, pool_id: str) -> bool:
    got = ddb.get_item(TableName=table, Key=pool_meta_key(client_id, pool_id), ConsistentRead=True)
    return "Item" in got


def adopt_lease(
    ddb: Any, table: str, r: ResourceItem, now_us: int, rules: D.Rules, owner: str, dry: bool
) -> str:
    """Adopt the running lease ``r`` (read strongly consistent) the way a daemon does
    (``rasd.steps.admin.adopt_lease``, with a fresh acquisition token)."""
    prog = steps.adopt_lease(r, now_us, rules, owner, secrets.token_hex(8), dry)
    return leases.run(ddb, table, prog)


def run(
    ddb: Any,
    table: str,
    region: str | None,
    now_us: int,
    max_lease_s: float,
    dry_run: bool = False,
    resume_from: dict[str, Any] | None = None,
    page_size: int | None = None,
    rules: D.Rules | None = None,
) -> dict[str, Any]:
    """``rules``: the daemons' bounds (``--config``; default: the daemons' defaults)."""
    started = time.monotonic()
    rules = rules or Config().rules()
    owner = f"rasadmin-adopt:{socket.gethostname()}"
    c: Counter[str] = Counter()
    changes = ensure_schema(ddb, table, dry_run)
    c["writes"] += 0 if dry_run else len(changes)
    pools: dict[tuple[str, str], bool] = {}
    kw: dict[str, Any] = {"TableName": table}
    if page_size:
        kw["Limit"] = page_size
    if resume_from:
        kw["ExclusiveStartKey"] = resume_from
    for page in common.scan_pages(ddb, kw):
        for raw in page.get("Items", []):
            c["scanned"] += 1
            if c["scanned"] % PROGRESS_EVERY == 0:
                log.info("progress", scanned=c["scanned"], adopted=c["adopted"])
            if not is_resource_item(raw):
                continue
            it = common.parsed(raw, c, log)
            if it is None:
                continue
            c["resources"] += 1
            pk = (it.client_id, it.pool_id)
            if pk not in pools:
                pools[pk] = pool_defined(ddb, table, *pk)
                if not pools[pk]:
                    c["pools_added"] += 1
                    if not dry_run and ensure_pool(ddb, table, *pk, max_lease_s):
                        c["writes"] += 1
                    pools[pk] = True
            if it.key is None or (region is not None and it.region != region):
                continue
            if it.lease_expires_us is None or it.lease_expires_us <= now_us:
                continue  # not running: the liberators free it
            c["leases"] += 1
            try:
                raw = leases.get(ddb, table, it.ident)
                fresh = resource_from(raw) if raw else None
                got = (
                    "ended"
                    if fresh is None or fresh.key != it.key
                    else adopt_lease(ddb, table, fresh, now_us, rules, owner, dry_run)
                )
            except Exception as exc:  # noqa: BLE001 - counted; the next run retries
                c["errors"] += 1
                log.error("adopt_failed", resource=it.resource, key=it.key, error=repr(exc))
                continue
            c[got] += 1
            if got == "adopted":
                c["writes"] += 3
                log.info("adopted", client_id=it.client_id, resource=it.resource, key=it.key)
        if "LastEvaluatedKey" in page:
            log.info(
                "page_done",
                scanned=c["scanned"],
                resume_from=json.dumps(page["LastEvaluatedKey"], separators=(",", ":")),
            )
    summary: dict[str, Any] = {
        "job": "adopt",
        "table": table,
        "region": region if region is not None else "*",
        "dry_run": dry_run,
        "schema_changes": changes,
        "scanned": c["scanned"],
        "resources": c["resources"],
        "pools_added": c["pools_added"],
        "running_leases": c["leases"],
        "adopted": c["would_adopt"] if dry_run else c["adopted"],
        "already_rasd": c["rasd"],
        "kept_split": c["kept_split"],
        "ended": c["ended"],
        "lost_races": c["lost_race"],
        "writes": c["writes"],
        "errors": c["errors"],
        "seconds": round(time.monotonic() - started, 3),
    }
    return summary


def add_parser(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--max-lease",
        type=float,
        default=86_400,
        metavar="SECONDS",
        help="pools found without a definition get this longest lease (default 86400)",
    )
    sp.add_argument(
        "--all-regions",
        action="store_true",
        help="adopt the running leases of every region (a single, unreplicated table only; on "
        "a global table run it once per region against that region's replica)",
    )
    sp.add_argument(
        "--resume-from",
        metavar="JSON",
        help="start the Scan after this position (a page_done line's resume_from on stderr)",
    )
    sp.add_argument("--page-size", type=common.positive_int, help="items per Scan page")


def cmd_adopt(ddb: Any, args: argparse.Namespace) -> int:
    region = None if args.all_regions else common.ras_region(args)
    resume = json.loads(args.resume_from) if args.resume_from else None
    if resume is not None and not isinstance(resume, dict):
        raise common.UsageError("--resume-from: expected a JSON object")
    cfg = common.daemon_config(args)
    # Rollout mode first: every daemon and job keeps the rules that are safe beside the
    # paper's agent from now on (running daemons within the bound the summary gives).
    mode = rollout.begin(ddb, args.table, cfg, "rasadmin adopt", args.dry_run)
    summary = run(
        ddb,
        args.table,
        region,
        common.now_us(args),
        args.max_lease,
        dry_run=args.dry_run,
        resume_from=resume,
        page_size=args.page_size,
        rules=cfg.rules(),
    )
    summary["rollout"] = mode["rollout"]
    summary["paper_agents_may_start_at"] = mode["paper_agents_may_start_at"]
    common.emit(summary)
    return common.EXIT_ERRORS if summary["errors"] else common.EXIT_OK


__all__ = ["add_parser", "cmd_adopt", "run"]

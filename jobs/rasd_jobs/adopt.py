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

The fast rules' leftovers (docs/design.md, "Rollout mode, in the table"): the paper's agent
answers whatever the leased index shows for a key, so before it may start, no claim of
rasd's that no mapping names may be left there, and no claim may still land beside a lease
it makes. The same scan reaches both: a running claim of rasd's beside the key's lease is
freed by the liberator's orphan repair, held to its end (``steps.free_orphan``: the
``orphans_freed``), and a pending mapping whose claim may still land is fenced by the
readers' rule (``steps.settle_pending``: ``pending_fenced``). A daemon that has not yet
followed the record may leave such a leftover after the scan passed its key, until
``fast_rules_until`` (the record's change plus the daemons' follow bound and the longest
background program, plus the clock-skew bound): only a scan begun after that reaches them
all (``swept_after_fast_rules``). ``paper_agents_may_start_at`` is therefore: that run's
time when its scan was such a scan, else ``fast_rules_until`` plus the longest lease of any
pool (when every leftover made until then has ended) and ``sweep_again_after`` says when a
run again gives the earlier time; and in both cases no earlier than the end (plus the
grace) of any leftover the run saw but could not settle (``unsettled``; a dry run settles
none).
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
from rasd.core import decide, schema
from rasd.core.lease import META_CLIENT, PENDING, US, Mapping, ResourceItem, fmt_time, parse_time
from rasd.core.serialize import (
    is_mapping_pk,
    is_resource_item,
    mapping_from_ddb,
    pool_meta_key,
)
from rasd.steps import Delete, Put, Send, WriteResult
from rasd.steps import admin as admin_steps

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
    return leases.run(
        ddb, table, admin_steps.define_pool(client_id, pool_id, max_lease_s, only_new=True)
    )


def pool_defined(ddb: Any, table: str, client_id: str, pool_id: str) -> bool:
    got = ddb.get_item(TableName=table, Key=pool_meta_key(client_id, pool_id), ConsistentRead=True)
    return "Item" in got


class _Writes(leases.Driver):
    """The jobs' driver, counting the writes that applied (the summary's ``writes``)."""

    applied = 0

    def perform(self, eff: Any, ddb: Any = None) -> Any:
        res = super().perform(eff, ddb)
        if (
            isinstance(eff, (Send, Put, Delete))
            and isinstance(res, WriteResult)
            and res.outcome is decide.Outcome.APPLIED
        ):
            self.applied += 1
        return res


def settle_item(
    drv: leases.Driver, it: ResourceItem, now_us: int, rules: decide.Rules, owner: str, dry: bool
) -> admin_steps.Swept:
    """One running lease of the scan (``rasd.steps.admin.settle_lease``, with fresh
    acquisition tokens): adopted, found rasd's, freed as an orphan, ..."""
    tokens = tuple(secrets.token_hex(8) for _ in range(admin_steps.ATTEMPTS))
    return drv.run(admin_steps.settle_lease(it, now_us, rules, owner, tokens, dry))


def run(
    ddb: Any,
    table: str,
    region: str | None,
    now_us: int,
    max_lease_s: float,
    dry_run: bool = False,
    resume_from: dict[str, Any] | None = None,
    page_size: int | None = None,
    rules: decide.Rules | None = None,
) -> dict[str, Any]:
    """``rules``: the daemons' bounds (``--config``; default: the daemons' defaults)."""
    started = time.monotonic()
    rules = rules or Config().rules()
    owner = f"rasadmin-adopt:{socket.gethostname()}"
    c: Counter[str] = Counter()
    changes = ensure_schema(ddb, table, dry_run)
    c["writes"] += 0 if dry_run else len(changes)
    drv = _Writes(ddb, table)
    #: the latest end (plus the grace) of a leftover this run saw and could not settle
    unsettled_until: int | None = None
    #: the longest lease of any pool (its definition as scanned; ``max_lease_s`` for a pool
    #: this run defines, or when the scan does not start at the table's beginning)
    max_lease_us = int(max_lease_s * US) if resume_from else 0

    def unsettled(end_us: int | None, what: str, **ctx: Any) -> None:
        nonlocal unsettled_until
        c["unsettled"] += 1
        longest = max_lease_us or int(max_lease_s * US)
        until = (end_us if end_us is not None else now_us + longest) + rules.grace_us
        unsettled_until = max(unsettled_until or until, until)
        log.warning("leftover_not_settled", what=what, until=fmt_time(until), **ctx)

    def settle_mapping(raw: dict[str, Any]) -> None:
        """A mapping item of the scan: a pending one is judged as a reader would."""
        try:
            m: Mapping = mapping_from_ddb(raw)
        except (KeyError, ValueError):
            return  # not ours to judge here
        if m.state != PENDING or (region is not None and m.region != region):
            return
        c["pending"] += 1
        try:
            got = drv.run(admin_steps.settle_pending(m, now_us, rules, dry_run))
        except Exception as exc:  # noqa: BLE001 - counted; its claim may still land
            c["errors"] += 1
            log.error("pending_failed", key=m.key, resource=m.resource, error=repr(exc))
            got = "error"
        c["pending_" + got] += 1
        if got in admin_steps.PENDING_UNSETTLED or got == "error":
            # its claim may still land, to run at most to the mapping's end
            unsettled(m.expires_us, "pending", key=m.key, resource=m.resource)

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
                pk = raw.get("client_id", {}).get("S", "")
                if pk == META_CLIENT and "max_lease" in raw:
                    try:
                        lease_us = int(float(raw["max_lease"]["N"]) * US)
                    except (KeyError, ValueError):
                        lease_us = 0
                    max_lease_us = max(max_lease_us, lease_us)
                elif is_mapping_pk(pk):
                    settle_mapping(raw)
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
                    max_lease_us = max(max_lease_us, int(max_lease_s * US))
                    if not dry_run and ensure_pool(ddb, table, *pk, max_lease_s):
                        c["writes"] += 1
                    pools[pk] = True
            if it.key is None or (region is not None and it.region != region):
                continue
            if it.lease_expires_us is None or it.lease_expires_us <= now_us:
                continue  # not running: the liberators free it
            c["leases"] += 1
            rasd_claim = it.holder is not None and it.holder_current
            try:
                swept = settle_item(drv, it, now_us, rules, owner, dry_run)
            except Exception as exc:  # noqa: BLE001 - counted; the next run retries
                c["errors"] += 1
                log.error("adopt_failed", resource=it.resource, key=it.key, error=repr(exc))
                if rasd_claim:  # perhaps a leftover: the paper's agent may answer it to its end
                    unsettled(it.lease_expires_us, "claim", resource=it.resource, key=it.key)
                continue
            got, fresh = swept.outcome, swept.item
            c[got] += 1
            if got == "adopted":
                log.info("adopted", client_id=it.client_id, resource=it.resource, key=it.key)
            elif got == "freed_orphan":
                log.warning(
                    "orphan_freed", client_id=it.client_id, resource=it.resource, key=it.key
                )
            elif swept.unsettled:
                end = (fresh or it).lease_expires_us
                unsettled(end, "orphan", resource=it.resource, key=it.key)
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
        "orphans_freed": c["would_free_orphan"] if dry_run else c["freed_orphan"],
        "pending_fenced": c["pending_would_fence"] if dry_run else c["pending_fenced"],
        "unsettled": c["unsettled"],
        "ended": c["ended"],
        "lost_races": c["lost_race"] + c["pending_lost_race"],
        "writes": c["writes"] + drv.applied,
        "errors": c["errors"],
        "seconds": round(time.monotonic() - started, 3),
        "unsettled_until": None if unsettled_until is None else fmt_time(unsettled_until),
        "max_lease_s": (max_lease_us or int(max_lease_s * US)) / US,
    }
    return summary


def start_at(
    record_changed: str | None,
    now_us: int,
    cfg: Config,
    max_lease_s: float,
    unsettled_until: str | None,
) -> dict[str, Any]:
    """When the paper's agent may start, after a run whose scan began at ``now_us`` with the
    rollout record on since ``record_changed`` (None: not on, a dry run: as if now). The
    fast rules may still run until ``fast_rules_until``; a scan begun after it reached every
    leftover they made, an earlier one only those made before it, and one made after it is
    answered by the paper's agent at most to its end: ``fast_rules_until`` plus the longest
    lease. Never before what the run could not settle ends (``unsettled_until``)."""
    on_us = parse_time(record_changed) if record_changed else now_us
    bound = rollout.follow_bound_s(cfg) + rollout.background_life_s() + cfg.max_clock_skew
    fast_until = on_us + int(bound * US)
    complete = record_changed is not None and now_us >= fast_until
    at = now_us if complete else fast_until + int((max_lease_s + cfg.max_clock_skew) * US)
    if unsettled_until is not None:
        at = max(at, parse_time(unsettled_until))
    return {
        "fast_rules_until": fmt_time(fast_until),
        "swept_after_fast_rules": complete,
        "sweep_again_after": None if complete else fmt_time(fast_until),
        "paper_agents_may_start_at": fmt_time(at),
    }


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
    try:
        resume = json.loads(args.resume_from) if args.resume_from else None
    except json.JSONDecodeError as exc:
        raise common.UsageError(f"--resume-from: not JSON ({exc}): pass a resume_from as printed")
    if resume is not None and not isinstance(resume, dict):
        raise common.UsageError("--resume-from: expected a JSON object")
    cfg = common.daemon_config(args)
    # Rollout mode first: every daemon and job keeps the rules that are safe beside the
    # paper's agent from now on (running daemons within the bound the summary gives).
    mode = rollout.begin(ddb, args.table, cfg, "rasadmin adopt", args.dry_run)
    now = common.now_us(args)
    summary = run(
        ddb,
        args.table,
        region,
        now,
        args.max_lease,
        dry_run=args.dry_run,
        resume_from=resume,
        page_size=args.page_size,
        rules=cfg.rules(),
    )
    summary["rollout"] = mode["rollout"]
    rec = common.read_rollout(ddb, args.table)
    changed = rec.changed if rec.paper_agents else None  # a dry run may leave it off
    when = start_at(changed, now, cfg, summary.pop("max_lease_s"), summary["unsettled_until"])
    summary.update(when)
    if not when["swept_after_fast_rules"]:
        log.warning(
            "sweep_again",
            why="daemons may run the fast rules until fast_rules_until: a leftover they make "
            "after this scan is reached only by a run begun after it",
            sweep_again_after=when["sweep_again_after"],
            paper_agents_may_start_at=when["paper_agents_may_start_at"],
        )
    common.emit(summary)
    return common.EXIT_ERRORS if summary["errors"] else common.EXIT_OK


__all__ = ["add_parser", "cmd_adopt", "run"]

"""``ras-balancer``: move free resources between regions ahead of projected demand (Jenkins,
every 5 minutes). See docs/global.md.

One run, top to bottom (:func:`run`):

1. take the lock item ``#meta`` / ``lock#balancer`` (conditional UpdateItem; expires by itself)
   - when another balancer holds it, report ``"status": "locked"`` and stop (exit 0);
2. load the previous state from S3 (``rasd_jobs.s3state``);
3. read the table's stream in this region from the checkpoints (``rasd_jobs.stream``):
   acquisitions and releases per (client, pool, region);
4. read the daemons' miss counters (Query ``#hosts`` ``begins_with misses#``), take deltas;
5. count free items per (client, pool, region) (Query COUNT on ``available_resources`` over
   the 10 sub-partitions);
6. update the demand model and plan moves (``rasd_jobs.balance_model``, pure);
7. move: candidates from the donor region's ``available_resources`` index, each moved with
   ``rasd.core.builders.move`` (conditional on version, free and region; a lost race is counted and
   the next candidate tried);
8. write the headroom meta items; save state + snapshot to S3; release the lock.

``--dry-run`` does 2-6 and prints the plan in the summary; it writes nothing (no lock either).

Steps 1 and 8's lock release are :func:`run`; :func:`_run_locked` calls one function per step:
``_load_state`` (2), ``_read_stream`` (3), ``_observe`` (4, and what exists), ``_count_free``
(5), ``_plan`` (6), ``_move`` (7), ``_write_headroom`` and ``_save_state`` (8).

Replicas: a move of a donor region's item is written in that region's replica, where its
conditional check is ordered with the donor's own daemons' claims: in a global table, a move
written in another replica races a claim by last-writer-wins, and a claim the mapping names
can be lost. So ``--peer-endpoint REGION=URL`` must name every region but this one; a run that
finds a region without one refuses before it moves anything (``"status": "refused"``, exit 1),
unless ``--unreplicated`` says the table is one plain table holding every region's items
(development, tests), where every write goes through ``--endpoint-url``.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import boto3
import structlog
from botocore.exceptions import ClientError

from rasd.core.lease import (
    HOSTS_CLIENT,
    META_CLIENT,
    MISS_PREFIX,
    PARTITIONS,
    REGION_RE,
    ResourceItem,
    fmt_time,
    partition_name,
)
from rasd.core.reads import available_query
from rasd.core.schema import list_pool_items
from rasd.core.serialize import item_from_ddb, miss_count_from_ddb, pool_from_ddb
from rasd.steps.admin import move_free

from . import balance_model, common, leases, s3state, stream
from . import metrics as jobmetrics

log = structlog.get_logger("rasd_jobs.balancer")

STATE_VERSION = 1


# ---------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    table: str
    region: str  # whose stream and table this run reads and writes
    now_us: int
    params: balance_model.Params = field(default_factory=balance_model.Params)
    regions: tuple[str, ...] = ()  # the RAS regions; empty: the regions seen (see run())
    state_uri: str | None = None
    dry_run: bool = False
    lock_s: float = 240.0  # lock expiry; a run stops moving after lock_s - 30 s
    stream_budget_s: float = 60.0
    #: one plain table holds every region's items (no replicas): no peer endpoints needed
    unreplicated: bool = False


@dataclass
class Clients:
    """The boto3 clients of one run; tests pass wrappers (fault injection, races)."""

    ddb: Any  # this region's DynamoDB replica
    streams: Any  # this region's DynamoDB Streams
    s3: Any | None = None
    peers: dict[str, Any] = field(default_factory=dict)  # region -> that replica's DynamoDB

    def for_region(self, region: str) -> Any:
        """Where the items of ``region`` are read and moved: its replica if we know one."""
        return self.peers.get(region, self.ddb)


# ------------------------------------------------------------------------------------ lock
def lock_key() -> dict[str, Any]:
    return {"client_id": {"S": META_CLIENT}, "resource": {"S": balance_model.LOCK_RESOURCE}}


def take_lock(ddb: Any, table: str, owner: str, now_us: int, hold_s: float) -> str | None:
    """Take the balancer lock. Returns None when taken, else the current holder."""
    try:
        ddb.update_item(
            TableName=table,
            Key=lock_key(),
            UpdateExpression="SET lock_owner = :o, lock_expires = :until, lock_taken = :now",
            ConditionExpression="attribute_not_exists(lock_expires) OR lock_expires < :now",
            ExpressionAttributeValues={
                ":o": {"S": owner},
                ":until": {"S": fmt_time(now_us + int(hold_s * 1_000_000))},
                ":now": {"S": fmt_time(now_us)},
            },
        )
        return None
    except ClientError as exc:
        if not common.is_lost_race(exc):
            raise
    item = ddb.get_item(TableName=table, Key=lock_key(), ConsistentRead=True).get("Item", {})
    return str(item.get("lock_owner", {}).get("S", "?"))


def drop_lock(ddb: Any, table: str, owner: str) -> bool:
    """Release the lock if we still hold it (False: it expired and someone else took it)."""
    try:
        ddb.update_item(
            TableName=table,
            Key=lock_key(),
            UpdateExpression="REMOVE lock_expires, lock_owner",
            ConditionExpression="lock_owner = :o",
            ExpressionAttributeValues={":o": {"S": owner}},
        )
        return True
    except ClientError as exc:
        if common.is_lost_race(exc):
            return False
        raise


# ---------------------------------------------------------------------------------- reading
def read_pools(ddb: Any, table: str) -> tuple[list[tuple[str, str]], set[str]]:
    """Defined pools ``(client, pool)`` and any regions their items list (``regions``)."""
    pools: list[tuple[str, str]] = []
    regions: set[str] = set()
    for it in list_pool_items(ddb, table):
        try:
            pool = pool_from_ddb(it)
        except (KeyError, ValueError):
            continue
        pools.append((pool.client_id, pool.pool_id))
        raw = it.get("regions", {})
        for r in raw.get("SS", []) + [v.get("S", "") for v in raw.get("L", [])]:
            if REGION_RE.match(r):
                regions.add(r)
    return sorted(pools), regions


def read_miss_counters(ddb: Any, table: str) -> dict[str, int]:
    """All daemons' cumulative miss counters: ``misses#...`` resource -> count. Daemons write
    them under ``#hosts``; older daemons wrote them under ``#meta`` (reaped a week after their
    last report), so both are read. A daemon's counter is its own (its id names it)."""
    out: dict[str, int] = {}
    for partition in (HOSTS_CLIENT, META_CLIENT):
        kw: dict[str, Any] = {
            "TableName": table,
            "KeyConditionExpression": "client_id = :m AND begins_with(#res, :pfx)",
            "ProjectionExpression": "#res, #c",
            "ExpressionAttributeNames": {"#res": "resource", "#c": "count"},
            "ExpressionAttributeValues": {":m": {"S": partition}, ":pfx": {"S": MISS_PREFIX}},
        }
        for page in common.scan_pages(ddb, kw):
            for it in page.get("Items", []):
                out[it["resource"]["S"]] = miss_count_from_ddb(it)
    return out


#: COUNT queries in flight at once (step 5): a run with many pools is not a chain of round trips
COUNT_THREADS = 8


def count_part(ddb: Any, table: str, part: str) -> int:
    """Free items of one sub-partition: Select=COUNT, every page."""
    kw = {"TableName": table, **available_query(part, count=True)}
    return sum(int(page.get("Count", 0)) for page in common.scan_pages(ddb, kw))


def count_free(ddb: Any, table: str, client_id: str, pool_id: str, region: str) -> int:
    """Free items of one (client, pool, region): Select=COUNT over the 10 sub-partitions."""
    return sum(
        count_part(ddb, table, partition_name(client_id, pool_id, region, n))
        for n in range(PARTITIONS)
    )


def candidates(
    ddb: Any, table: str, client_id: str, pool_id: str, region: str, want: int
) -> list[ResourceItem]:
    """Up to ``want`` free items of (client, pool, region), spread over the sub-partitions
    (round robin), so that moving them keeps the donor's sub-partitions even."""
    per = math.ceil(want / PARTITIONS) + 1
    lists: list[list[ResourceItem]] = []
    more: list[tuple[int, dict[str, Any]]] = []
    for n in range(PARTITIONS):
        part = partition_name(client_id, pool_id, region, n)
        kw = {"TableName": table, **available_query(part, per)}
        resp = ddb.query(**kw)
        lists.append([item_from_ddb(i) for i in resp.get("Items", [])])
        if "LastEvaluatedKey" in resp:
            more.append((n, {**kw, "ExclusiveStartKey": resp["LastEvaluatedKey"]}))
    # uneven sub-partitions: top up from those that have more
    while sum(map(len, lists)) < want and more:
        n, kw = more.pop(0)
        resp = ddb.query(**{**kw, "Limit": want})
        lists[n].extend(item_from_ddb(i) for i in resp.get("Items", []))
        if "LastEvaluatedKey" in resp:
            more.append((n, {**kw, "ExclusiveStartKey": resp["LastEvaluatedKey"]}))
    out: list[ResourceItem] = []
    for i in range(max(map(len, lists), default=0)):
        out.extend(lst[i] for lst in lists if i < len(lst))
    return [it for it in out if it.region == region and not it.leased][:want]


# ----------------------------------------------------------------------------------- moving
@dataclass
class MoveResult:
    moved: int = 0
    lost_races: int = 0
    short: int = 0  # planned but no candidate left (claimed since the count)


def execute(
    ddb: Any, table: str, m: balance_model.Move, out_of_time: Callable[[], bool]
) -> MoveResult:
    """Move ``m.count`` free items from ``m.src`` to ``m.dst`` (``ddb``: the src replica)."""
    res = MoveResult()
    extra = max(2, m.count // 4)  # spare candidates for the races we will lose
    driver = leases.Driver(ddb, table, peers={m.src: ddb})
    for item in candidates(ddb, table, m.client_id, m.pool_id, m.src, m.count + extra):
        if res.moved >= m.count or out_of_time():
            break
        if driver.run(move_free(item, m.dst)):  # rasd.steps.admin: conditional on free
            res.moved += 1
        else:
            res.lost_races += 1  # claimed (or moved) since we read it: normal
    res.short = m.count - res.moved
    return res


# ------------------------------------------------------------------------------------- run
def _regions(
    opts: Options, state: dict[str, Any] | None, pool_regions: set[str], seen: set[str]
) -> list[str]:
    if opts.regions:
        return sorted(set(opts.regions))
    known = set((state or {}).get("regions", []))
    return sorted(known | pool_regions | seen | {opts.region})


def _window_s(
    opts: Options, state: dict[str, Any] | None, read: stream.StreamRead
) -> tuple[float, bool]:
    """Seconds the observed events cover, and whether this is the first run. First run: the
    stream (up to 24 h) since its oldest record, at least one interval."""
    last = (state or {}).get("last_run_us")
    if last is not None:
        return (opts.now_us - int(last)) / 1_000_000, False
    span = 0.0
    if read.first_at_us is not None and read.last_at_us is not None:
        span = (read.last_at_us - read.first_at_us) / 1_000_000
    return max(opts.params.interval_s, span), True


@dataclass
class CapacityReport:
    """Each (client, pool, region) as a run left it, for Prometheus (``rasd_jobs.metrics``)."""

    horizon_s: float = balance_model.Params().horizon_s
    pools: dict[balance_model.Key, jobmetrics.PoolCapacity] = field(default_factory=dict)

    def samples(self) -> list[jobmetrics.Sample]:
        return jobmetrics.pool_samples(self.pools, self.horizon_s) if self.pools else []


def run(
    opts: Options,
    clients: Clients,
    clock: Callable[[], float] = time.monotonic,
    report: CapacityReport | None = None,
) -> dict[str, Any]:
    """One balancer run. Returns the summary (also for ``--dry-run`` and ``locked``);
    fills ``report`` with each pool's capacity once it is known."""
    t0 = clock()
    owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    summary: dict[str, Any] = {"status": "ok", "dry_run": opts.dry_run}
    if not opts.dry_run:
        holder = take_lock(clients.ddb, opts.table, owner, opts.now_us, opts.lock_s)
        if holder is not None:
            log.warning("locked", holder=holder)
            return {"status": "locked", "holder": holder, "seconds": round(clock() - t0, 3)}
    try:
        summary |= _run_locked(opts, clients, clock, t0, report)
    finally:
        if not opts.dry_run and not drop_lock(clients.ddb, opts.table, owner):
            log.warning("lock_lost", owner=owner)
    summary["seconds"] = round(clock() - t0, 3)
    return summary


@dataclass
class _Observed:
    """What steps 3 and 4 read: the stream's events and the daemons' misses, and the
    (client, pool, region) keys they are counted for."""

    arn: str
    read: stream.StreamRead
    dt_s: float  # seconds the window covers
    first: bool  # no previous state: the first run
    misses: dict[balance_model.Key, int]
    miss_memory: dict[str, int]
    pools: list[tuple[str, str]]
    regions: list[str]
    keys: set[balance_model.Key]
    acq: Counter[balance_model.Key]
    rel: Counter[balance_model.Key]


def _run_locked(
    opts: Options,
    clients: Clients,
    clock: Callable[[], float],
    t0: float,
    report: CapacityReport | None = None,
) -> dict[str, Any]:
    """Steps 2-8 of a run (the module's docstring), one function each."""
    loc, state = _load_state(opts, clients)
    arn, read = _read_stream(opts, clients, state, clock)
    obs = _observe(opts, clients, state, arn, read)
    missing = missing_peers(opts, clients, obs.regions)
    if missing:
        return _refused(obs, missing)
    free = _count_free(opts, clients, obs.keys)
    signals, the_plan = _plan(opts, state, obs, free)
    summary = _summary(obs, the_plan)
    if opts.dry_run:
        summary["plan"] = _planned(the_plan.moves)
        _report(report, opts, free, the_plan)
        return summary
    done = _move(opts, clients, clock, t0, the_plan, summary)
    after = balance_model.apply_moves(free, done)
    _report(report, opts, after, the_plan)
    summary["headroom_items"] = _write_headroom(opts, clients, obs.keys, after, the_plan)
    _save_state(opts, clients, loc, obs, signals, free, after, the_plan, done)
    return summary


def _report(
    report: CapacityReport | None,
    opts: Options,
    free: dict[balance_model.Key, int],
    the_plan: balance_model.Plan,
) -> None:
    if report is None:
        return
    report.horizon_s = opts.params.horizon_s
    report.pools = {
        k: jobmetrics.PoolCapacity(n, the_plan.projected[k], the_plan.targets[k])
        for k, n in free.items()
    }


def missing_peers(opts: Options, clients: Clients, regions: Sequence[str]) -> list[str]:
    """Regions whose items this run may move but has no replica for: a move written in our
    replica races that region's claims by last-writer-wins (the module's docstring)."""
    if opts.unreplicated:
        return []
    return sorted(r for r in regions if r != opts.region and r not in clients.peers)


def _refused(obs: _Observed, missing: list[str]) -> dict[str, Any]:
    error = (
        f"no --peer-endpoint for region(s) {', '.join(missing)}: their items would be moved "
        f"in this region's replica, racing their daemons' claims by last-writer-wins; pass "
        f"--peer-endpoint REGION=URL for each (or --unreplicated for one plain table)"
    )
    log.error("refused", missing_peer_endpoints=missing, regions=obs.regions)
    return {
        "status": "refused",
        "error": error,
        "regions": obs.regions,
        "missing_peer_endpoints": missing,
        "moved": 0,
    }


def _load_state(
    opts: Options, clients: Clients
) -> tuple[s3state.Location | None, dict[str, Any] | None]:
    """Step 2: the previous run's state from S3 (None: no state URI, none yet, or a version
    this balancer does not know)."""
    loc = s3state.parse_uri(opts.state_uri) if opts.state_uri else None
    state: dict[str, Any] | None = None
    if loc is not None:
        assert clients.s3 is not None
        state, _ = s3state.load(clients.s3, loc)
    if state is not None and state.get("version") != STATE_VERSION:
        log.warning("state_version_unknown", version=state.get("version"))
        state = None
    return loc, state


def _read_stream(
    opts: Options, clients: Clients, state: dict[str, Any] | None, clock: Callable[[], float]
) -> tuple[str, stream.StreamRead]:
    """Step 3: the table's stream in this region, from the saved checkpoints (when they are
    for the same stream)."""
    arn = stream.stream_arn(clients.ddb, opts.table)
    sstate = (state or {}).get("stream", {})
    checkpoints = sstate.get("checkpoints", {}) if sstate.get("arn") == arn else {}
    read = stream.read_stream(clients.streams, arn, checkpoints, opts.stream_budget_s, clock)
    return arn, read


def _observe(
    opts: Options,
    clients: Clients,
    state: dict[str, Any] | None,
    arn: str,
    read: stream.StreamRead,
) -> _Observed:
    """Step 4, the misses since the last run; then what exists (pools and regions) and the
    stream's acquisitions and releases counted per (client, pool, region)."""
    dt_s, first = _window_s(opts, state, read)
    counters = read_miss_counters(clients.ddb, opts.table)
    misses, miss_memory = balance_model.miss_deltas(
        counters, None if state is None else state.get("misses", {})
    )
    pools, pool_regions = read_pools(clients.ddb, opts.table)
    seen = {e.region for e in read.events} | {e.from_region for e in read.events if e.from_region}
    seen |= {k[2] for k in misses}
    regions = _regions(opts, state, pool_regions, seen)
    keys = {(c, pl, r) for c, pl in pools for r in regions}
    acq: Counter[balance_model.Key] = Counter()
    rel: Counter[balance_model.Key] = Counter()
    for e in read.events:
        k = (e.client_id, e.pool_id, e.region)
        if k not in keys:
            continue
        if e.kind == stream.ACQUIRE:
            acq[k] += 1
        elif e.kind == stream.RELEASE:
            rel[k] += 1
    return _Observed(arn, read, dt_s, first, misses, miss_memory, pools, regions, keys, acq, rel)


def _count_free(
    opts: Options, clients: Clients, keys: set[balance_model.Key]
) -> dict[balance_model.Key, int]:
    """Step 5: free items per (client, pool, region), each read from its region's replica,
    COUNT_THREADS sub-partitions at a time (boto3's clients are thread-safe)."""
    parts = [(k, partition_name(*k, n)) for k in sorted(keys) for n in range(PARTITIONS)]
    with ThreadPoolExecutor(max_workers=COUNT_THREADS, thread_name_prefix="count") as pool:
        counts = pool.map(
            lambda kp: count_part(clients.for_region(kp[0][2]), opts.table, kp[1]), parts
        )
        out = dict.fromkeys(sorted(keys), 0)
        for (k, _), n in zip(parts, counts, strict=True):
            out[k] += n
    return out


def _plan(
    opts: Options, state: dict[str, Any] | None, obs: _Observed, free: dict[balance_model.Key, int]
) -> tuple[dict[balance_model.Key, balance_model.Signal], balance_model.Plan]:
    """Step 6: update the demand model with the window's counts, then plan the moves."""
    p = opts.params
    counts = {
        k: balance_model.Counts(obs.acq[k], obs.rel[k], obs.misses.get(k, 0))
        for k in obs.keys
        if obs.acq[k] or obs.rel[k] or obs.misses.get(k)
    }
    prev = {
        balance_model.key_parse(ks): balance_model.Signal.from_json(v)
        for ks, v in (state or {}).get("signals", {}).items()
    }
    signals = balance_model.observe(
        {k: v for k, v in prev.items() if k in obs.keys}, counts, obs.keys, obs.dt_s, p
    )
    the_plan = balance_model.plan(free, signals, p)
    log.info(
        "plan",
        window_s=round(obs.dt_s, 3),
        first_run=obs.first,
        moves=_planned(the_plan.moves),
        capped=the_plan.capped,
        stream_caught_up=obs.read.caught_up,
    )
    return signals, the_plan


def _planned(moves: Sequence[balance_model.Move]) -> list[dict[str, Any]]:
    return [
        {"client": m.client_id, "pool": m.pool_id, "from": m.src, "to": m.dst, "count": m.count}
        for m in moves
    ]


def _summary(obs: _Observed, the_plan: balance_model.Plan) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "pools": len(obs.pools),
        "regions": obs.regions,
        "moves_planned": the_plan.total,
        "moved": 0,
        "lost_races": 0,
        "stream_records": obs.read.records,
        "acquisitions": sum(obs.acq.values()),
        "releases": sum(obs.rel.values()),
        "misses": sum(obs.misses.values()),
        "capped": the_plan.capped,
    }
    if not obs.read.caught_up:
        summary["stream_caught_up"] = False
    return summary


def _move(
    opts: Options,
    clients: Clients,
    clock: Callable[[], float],
    t0: float,
    the_plan: balance_model.Plan,
    summary: dict[str, Any],
) -> list[balance_model.Move]:
    """Step 7: execute the planned moves until lock_s - 30 s after the start; counts go into
    ``summary``. Returns the moves done (with the counts actually moved)."""
    deadline = t0 + max(0.0, opts.lock_s - 30.0)
    done: list[balance_model.Move] = []
    short = 0
    for m in the_plan.moves:
        r = execute(clients.for_region(m.src), opts.table, m, lambda: clock() >= deadline)
        summary["moved"] += r.moved
        summary["lost_races"] += r.lost_races
        short += r.short
        if r.moved:
            done.append(balance_model.Move(m.client_id, m.pool_id, m.src, m.dst, r.moved))
        log.info(
            "moved",
            client=m.client_id,
            pool=m.pool_id,
            src=m.src,
            dst=m.dst,
            planned=m.count,
            moved=r.moved,
            lost_races=r.lost_races,
        )
    if short:
        summary["short"] = short
    return done


def _write_headroom(
    opts: Options,
    clients: Clients,
    keys: set[balance_model.Key],
    after: dict[balance_model.Key, int],
    the_plan: balance_model.Plan,
) -> int:
    """Step 8a: one headroom meta item per (client, pool, region). Returns how many."""
    for k in sorted(keys):
        clients.ddb.put_item(
            TableName=opts.table,
            Item=balance_model.headroom_item(
                k, after[k], the_plan.projected[k], opts.now_us, opts.params.horizon_s
            ),
        )
    return len(keys)


def _save_state(
    opts: Options,
    clients: Clients,
    loc: s3state.Location | None,
    obs: _Observed,
    signals: dict[balance_model.Key, balance_model.Signal],
    free: dict[balance_model.Key, int],
    after: dict[balance_model.Key, int],
    the_plan: balance_model.Plan,
    done: list[balance_model.Move],
) -> None:
    """Step 8b: the state the next run starts from, and the metadata snapshot, to S3."""
    if loc is None:
        log.warning("no_state_uri", note="demand is relearned on every run")
        return
    assert clients.s3 is not None
    p = opts.params
    new_state = {
        "version": STATE_VERSION,
        "last_run_us": opts.now_us,
        "regions": obs.regions,
        "signals": {balance_model.key_str(k): v.to_json() for k, v in sorted(signals.items())},
        "stream": {"arn": obs.arn, "checkpoints": obs.read.checkpoints},
        "misses": obs.miss_memory,
    }
    snapshot = {
        "now": fmt_time(opts.now_us),
        "window_s": obs.dt_s,
        "params": {
            "interval_s": p.interval_s,
            "horizon_s": p.horizon_s,
            "alpha": p.alpha,
            "beta": p.beta,
            "safety": p.safety,
            "floor": p.floor,
            "max_moves": p.max_moves,
        },
        "pools": {
            balance_model.key_str(k): {
                "free_before": free[k],
                "free_after": after[k],
                "projected_demand": round(the_plan.projected[k], 3),
                "target": the_plan.targets[k],
                "window": {
                    "acquired": obs.acq[k],
                    "released": obs.rel[k],
                    "missed": obs.misses.get(k, 0),
                },
                "signal": signals[k].to_json(),
            }
            for k in sorted(obs.keys)
        },
        "moves": _planned(done),
    }
    s3state.save(clients.s3, loc, new_state, snapshot, opts.now_us)


# ------------------------------------------------------------------------------------- CLI
def _regions_arg(s: str) -> tuple[str, ...]:
    out = tuple(r.strip() for r in s.split(",") if r.strip())
    if not out:
        raise argparse.ArgumentTypeError("empty region list")
    for r in out:
        if not REGION_RE.match(r):
            raise argparse.ArgumentTypeError(f"bad region {r!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    d = balance_model.Params()
    p: argparse.ArgumentParser = common.parser(
        "ras-balancer",
        "Move free resources between regions ahead of projected demand. Reads this region's "
        "stream and the daemons' miss counters, projects demand per (client, pool, region) "
        "over the horizon (Holt's EWMA level + trend), moves free items from regions above "
        "their target to regions below it, writes headroom items, and keeps its state on S3. "
        "One balancer at a time (lock item #meta/lock#balancer). Prints one JSON summary "
        "line on stdout: pools, regions, moves_planned, moved, lost_races, stream_records, "
        "misses, seconds. Exit 0 also when another balancer holds the lock (status "
        '"locked"). The stream is read at --endpoint-url, else '
        "AWS_ENDPOINT_URL_DYNAMODBSTREAMS, else AWS_ENDPOINT_URL_DYNAMODB. See docs/global.md.",
        [common.connection_parent()],
    )
    g = p.add_argument_group("balancer")
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="compute and print the plan (in the summary); write nothing",
    )
    g.add_argument(
        "--regions",
        type=_regions_arg,
        default=None,
        metavar="R1,R2,...",
        help="the RAS regions (default: regions named on pool items, seen in the "
        "stream, the miss counters or the previous state, plus --region)",
    )
    g.add_argument(
        "--state-uri",
        default=os.environ.get("RASD_STATE_URI"),
        help="s3://bucket/prefix for state and snapshot (env RASD_STATE_URI; "
        "required unless --dry-run; S3 endpoint: AWS_ENDPOINT_URL_S3 or "
        "AWS_ENDPOINT_URL, as boto3 reads them)",
    )
    g.add_argument(
        "--interval",
        type=common.non_negative_float,
        default=d.interval_s,
        help=f"seconds between runs: demand is a rate per interval (default {d.interval_s:g})",
    )
    g.add_argument(
        "--horizon",
        type=common.non_negative_float,
        default=d.horizon_s,
        help=f"seconds ahead to provision for (default {d.horizon_s:g})",
    )
    g.add_argument(
        "--max-moves",
        type=int,
        default=d.max_moves,
        help=f"items moved per run, all pools together (default {d.max_moves})",
    )
    g.add_argument(
        "--safety",
        type=float,
        default=d.safety,
        help=f"target free = projected demand x safety + floor (default {d.safety:g})",
    )
    g.add_argument(
        "--floor",
        type=int,
        default=d.floor,
        help=f"free items kept in every region (default {d.floor})",
    )
    common.add_peer_endpoint(
        g,
        "DynamoDB endpoint of REGION's replica: that region's items are read "
        "and moved there, ordered with its daemons' claims (repeatable). Required for "
        "every region but --region: a run that finds a region without one refuses "
        '(status "refused", exit 1)',
    )
    g.add_argument(
        "--unreplicated",
        action="store_true",
        help="the table is one plain table holding every region's items, not a global "
        "table (development, tests): every region's items are moved through --endpoint-url",
    )
    jobmetrics.add_flags(g)
    return p


def job(args: argparse.Namespace, report: CapacityReport | None = None) -> dict[str, Any]:
    """One run from the command line's ``args``: its summary (and ``report`` filled)."""
    region = common.ras_region(args)
    assert region is not None
    try:
        params = balance_model.Params(
            interval_s=args.interval,
            horizon_s=args.horizon,
            safety=args.safety,
            floor=args.floor,
            max_moves=args.max_moves,
        )
    except ValueError as exc:
        raise common.UsageError(str(exc))
    if not args.state_uri and not args.dry_run:
        raise common.UsageError("no state: pass --state-uri or set RASD_STATE_URI")
    if args.state_uri:
        try:
            s3state.parse_uri(args.state_uri)
        except ValueError as exc:
            raise common.UsageError(str(exc))
    peer_urls = dict(common.parse_peer(s) for s in args.peer_endpoint)
    peer_urls.pop(region, None)
    ddb = common.make_client(args, region)
    streams_url = (
        args.endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_DYNAMODBSTREAMS")
        or os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
    )
    streams = boto3.client(
        "dynamodbstreams",
        region_name=os.environ.get("AWS_REGION") or region,
        endpoint_url=streams_url,
    )
    s3 = boto3.client("s3") if args.state_uri else None
    clients = Clients(
        ddb=ddb,
        streams=streams,
        s3=s3,
        peers={r: common.client_for(u, r, exact_region=True) for r, u in peer_urls.items()},
    )
    opts = Options(
        table=args.table,
        region=region,
        now_us=common.now_us(args),
        params=params,
        regions=args.regions or (),
        state_uri=args.state_uri,
        dry_run=args.dry_run,
        unreplicated=args.unreplicated,
    )
    log.info(
        "start",
        table=args.table,
        region=region,
        regions=opts.regions,
        dry_run=opts.dry_run,
        peers=sorted(peer_urls),
    )
    try:
        return run(opts, clients, report=report)
    except stream.NoStream as exc:
        raise common.JobError(str(exc))


def refused(summary: dict[str, Any]) -> bool:
    """The balancer's verdict: exit 1 only when it refused to run (a region with no peer
    endpoint); a run that lost races or found the lock held exits 0."""
    return summary.get("status") == "refused"


def main(argv: Sequence[str] | None = None) -> int:
    report = CapacityReport()
    return common.run_main(
        build_parser(),
        argv,
        lambda args: job(args, report),
        failed=refused,
        metrics=report.samples,
    )


if __name__ == "__main__":
    raise SystemExit(main())

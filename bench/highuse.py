"""(h) A pool near full: N daemons beside N of the paper's agents, at 50 %, 90 % and 98 % use.

One table, two pools of ``h_pool`` items: ``p`` for the daemons, ``pp`` for the paper's agents
(``BaselineAgent(paper=True)``), driven at the same time with the same demand, so both see the
same machine and the same backend. Each daemon has an app (``WORKERS`` workers in this
process) asking for new keys with ``H_LEASE_S`` leases, never renewed; each paper agent is
``WORKERS`` threads in one other process. ``ras-liberator --grace 2 --legacy-agents``
(``rasd_jobs.liberator``'s ``run`` in a third process, so that no interpreter starts every
second) runs every second on the whole table; ``--legacy-agents`` keeps the table's rollout
record off (the paper's agents have their own pool), so the daemons run with
``legacy_agents`` off. That process also reads the available index of both pools every
second: the claimable items, for ``sim.capacity.no_capacity_while_claimable`` (the sim's
check), and how many items are in use.

Demand: use U needs U x pool / (lease + grace + half the liberator's period) new leases per
second (an item is listed again that long after it was claimed). Poisson arrivals per worker,
the same schedules for both sides; a worker whose call outlasts the gap sends the next at once.
Each level: ``h_warm`` seconds to reach its steady state, then ``h_measure`` seconds measured:
the requests sent in that window, and, for the daemons, their counters over it (every
DynamoDB call, background refills and confirms included); for the paper's agents the calls of
the requests sent in it (they make no other).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as futures
import json
import multiprocessing as mp
import os
import random
import threading
import time
from collections import Counter
from typing import Any, cast

import rasd_client
from rasd.config import Config

from .harness import CLIENT, POOL, REGION, Env
from .report import summarize_ns

H_LEASE_S = 6.0  # new leases, never renewed
H_GRACE_S = 2.0  # ras-liberator --grace
H_EVERY_S = 1.0  # the liberator's period
WORKERS = 2  # per daemon's app and per paper agent
PAPER_POOL = "pp"
TIMEOUT = 10.0
#: the label of each side in the claimable samples (sim.capacity's "region")
SIDES = {"rasd": POOL, "paper": PAPER_POOL}


def demand(use_pct: float, pool: int) -> float:
    """New leases per second that keep ``use_pct`` % of ``pool`` items in use."""
    return use_pct / 100 * pool / (H_LEASE_S + H_GRACE_S + H_EVERY_S / 2)


def _arrivals(seed: str, rate: float, t0: float, t_end: float) -> list[float]:
    rng = random.Random(seed)
    out: list[float] = []
    t = t0
    while True:
        t += rng.expovariate(rate)
        if t >= t_end:
            return out
        out.append(t)


# ------------------------------------------------------------------------ the daemons' apps
async def _rasd_level(
    socks: list[str], rate_w: float, t0: float, t_end: float, tag: str
) -> list[tuple[float, float, int, str]]:
    """(sent, done, ns, code) of every call; code "ok" for a new lease."""
    from rasd_client import aio

    out: list[tuple[float, float, int, str]] = []

    async def worker(di: int, wi: int) -> None:
        for i, at in enumerate(_arrivals(f"{tag}-{di}-{wi}", rate_w, t0, t_end)):
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            key = f"h{tag}-{di}-{wi}-{i}"
            sent, t_ns = time.monotonic(), time.perf_counter_ns()
            try:
                lease = await aio.get_lease(
                    CLIENT,
                    POOL,
                    key,
                    time.time() + H_LEASE_S,
                    socket_path=socks[di],
                    timeout=TIMEOUT,
                )
                code = "ok" if lease.new else "not_new"
            except rasd_client.RasdError as exc:
                code = exc.code
            out.append((sent, time.monotonic(), time.perf_counter_ns() - t_ns, code))

    try:
        await asyncio.gather(*(worker(di, wi) for di in range(len(socks)) for wi in range(WORKERS)))
    finally:
        await aio.close()
        await asyncio.sleep(0)  # let the cancelled reader tasks finish
    return out


# ---------------------------------------------------------------------- the paper's agents
def _paper_ping() -> int:
    from . import baseline  # noqa: F401 - imported once, before the first level

    return os.getpid()


def _paper_level(
    table: str, endpoint: str, n: int, rate_w: float, t0: float, t_end: float, tag: str
) -> list[tuple[float, float, int, str, dict[str, int], int]]:
    """In the paper agents' process: (sent, done, ns, code, calls by op, conflicts)."""
    from .baseline import BaselineAgent, NoCapacity

    out: list[tuple[float, float, int, str, dict[str, int], int]] = []
    lock = threading.Lock()

    def worker(ai: int, wi: int) -> None:
        agent = BaselineAgent(table, REGION, endpoint, paper=True, max_pool_connections=2)
        for i, at in enumerate(_arrivals(f"{tag}-{ai}-{wi}", rate_w, t0, t_end)):
            delay = at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            calls0, conf0 = Counter(agent.calls), agent.conflicts
            sent, t_ns = time.monotonic(), time.perf_counter_ns()
            try:
                exp = int((time.time() + H_LEASE_S) * 1e6)
                got = agent.get_lease(CLIENT, PAPER_POOL, f"H{tag}-{ai}-{wi}-{i}", exp)
                code = "ok" if got.new else "not_new"
            except NoCapacity:
                code = "NO_CAPACITY"
            except Exception as exc:  # noqa: BLE001 - counted, as the daemons' errors are
                code = type(exc).__name__
            row = (
                sent,
                time.monotonic(),
                time.perf_counter_ns() - t_ns,
                code,
                dict(agent.calls - calls0),
                agent.conflicts - conf0,
            )
            with lock:
                out.append(row)

    threads = [
        threading.Thread(target=worker, args=(ai, wi)) for ai in range(n) for wi in range(WORKERS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# ------------------------------------------------------------ the liberator and the sampler
def _liberate_and_sample(endpoint: str, table: str, stop: Any, out_path: str) -> None:
    """Every H_EVERY_S: one liberator run over the table, then the available index of both
    pools read whole. Writes the samples and the liberator's totals to ``out_path``."""
    import logging

    import boto3
    import structlog

    from rasd.core import serialize
    from rasd.core.lease import PARTITIONS, partition_name
    from rasd.core.reads import available_query
    from rasd_jobs import liberator

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION)
    samples: list[dict[str, Any]] = []
    totals: Counter[str] = Counter()
    while not stop.is_set():
        t_run = time.monotonic()
        # --legacy-agents: the paper's agents hold their own pool; without it the liberator
        # would turn the table's rollout mode on at their first lease, and the daemons with it
        opts = liberator.Options(
            table=table,
            region=REGION,
            now_us=time.time_ns() // 1000,
            grace_us=int(H_GRACE_S * 1e6),
            legacy_agents=True,
        )
        try:
            got = liberator.run(ddb, opts)
            for k in ("freed", "lost_races", "errors", "orphans_freed", "relisted"):
                if isinstance(got.get(k), int):
                    totals[k] += got[k]
            totals["runs"] += 1
        except Exception:  # noqa: BLE001 - a failed run is counted; the next one retries
            totals["run_failures"] += 1
        for side, pool_id in SIDES.items():
            start = time.monotonic()
            now_us = time.time_ns() // 1000
            listed, free = 0, []
            try:
                for n in range(PARTITIONS):
                    kw = available_query(partition_name(CLIENT, pool_id, REGION, n))
                    while True:
                        page = ddb.query(TableName=table, **kw)
                        for raw in page.get("Items", []):
                            it = serialize.item_from_ddb(cast(dict[str, Any], raw))
                            listed += 1
                            if it.claimable(now_us):
                                free.append([it.resource, it.version])
                        if "LastEvaluatedKey" not in page:
                            break
                        kw["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            except Exception:  # noqa: BLE001 - a missed sample is a gap
                continue
            end = time.monotonic()
            samples.append(
                {"side": side, "start": start, "end": end, "listed": listed, "free": free}
            )
        stop.wait(max(0.0, H_EVERY_S - (time.monotonic() - t_run)))
    with open(out_path, "w") as fh:
        json.dump({"samples": samples, "liberator": dict(totals)}, fh)


# ---------------------------------------------------------------------------- the figures
class _Answer:
    __slots__ = ("code", "done", "region", "sent")

    def __init__(self, region: str, code: str, sent: float, done: float) -> None:
        self.region, self.code, self.sent, self.done = region, code, sent, done


def _figures(
    side: str,
    calls: list[tuple[Any, ...]],
    new_leases: int,
    conflicts: int,
    ops: dict[str, int],
    samples: list[Any],
    backoff: float,
    pool: int,
    window: tuple[float, float],
) -> dict[str, Any]:
    from sim.capacity import ClaimableSample, no_capacity_while_claimable

    lat = [c[2] for c in calls if c[3] == "ok"]
    nocap = [c for c in calls if c[3] == "NO_CAPACITY"]
    errors = Counter(c[3] for c in calls if c[3] not in ("ok", "NO_CAPACITY"))
    mine = [s for s in samples if s["side"] == side]
    claimable = [
        ClaimableSample(side, s["start"], s["end"], frozenset((r, v) for r, v in s["free"]))
        for s in mine
    ]
    wrong = no_capacity_while_claimable(
        [_Answer(side, "NO_CAPACITY", c[0], c[1]) for c in nocap], claimable, backoff
    )
    inside = [s for s in mine if window[0] <= s["start"] <= window[1]]
    use = [1 - s["listed"] / pool for s in inside]
    free = [len(s["free"]) for s in inside]
    per = max(1, new_leases)
    return {
        "requests": len(calls),
        "new_leases": new_leases,
        "conflicts": conflicts,
        "conflicts_per_new_lease": conflicts / per,
        "ddb_calls": ops,
        "ddb_per_new_lease": sum(ops.values()) / per,
        "ddb_per_new_lease_by_op": {k: v / per for k, v in sorted(ops.items())},
        "latency": summarize_ns(lat, window[1] - window[0]),
        "no_capacity": len(nocap),
        "no_capacity_while_claimable": len(wrong),
        "no_capacity_while_claimable_examples": wrong[:5],
        "errors": dict(errors),
        "use_measured": sum(use) / len(use) if use else None,
        "claimable_mean": sum(free) / len(free) if free else None,
    }


def _ddb_ops(counters: dict[str, int]) -> dict[str, int]:
    """The daemon's DynamoDB calls by operation (``ddb.<Operation>``; the other ``ddb.*``
    counters are outcomes)."""
    return {
        k.split(".", 1)[1]: v
        for k, v in counters.items()
        if k.startswith("ddb.") and k[4:5].isupper() and v
    }


async def _drive(
    ds: list[Any], rate_w: float, t0: float, t_end: float, warm: float, tag: str
) -> tuple[list[Any], Counter[str], Counter[str]]:
    """The daemons' apps for one level, and the daemons' counters at the start of the
    measured window and once every request sent in it was answered."""
    loop = asyncio.get_running_loop()

    def snap() -> Counter[str]:
        c: Counter[str] = Counter()
        for d in ds:
            c.update(d.counters())
        return c

    load = asyncio.ensure_future(_rasd_level([d.socket for d in ds], rate_w, t0, t_end, tag))
    await asyncio.sleep(max(0.0, t0 + warm - time.monotonic()))
    before = await loop.run_in_executor(None, snap)
    calls = await load
    after = await loop.run_in_executor(None, snap)
    return calls, before, after


def _delta(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before[k] for k in set(after) | set(before)})


def highuse_h(env: Env, opts: dict[str, Any]) -> dict[str, Any]:
    pool = opts["h_pool"]
    warm, measure = float(opts["h_warm"]), float(opts["h_measure"])
    backoff = Config().exhausted_backoff
    table = env.new_table(resources=pool, prefix="h")
    from rasd.core import schema

    schema.put_pool(env.direct, table, CLIENT, PAPER_POOL, 86400)
    schema.add_resources(
        env.direct, table, CLIENT, PAPER_POOL, REGION, [f"hp-{i:07d}" for i in range(pool)]
    )
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    samples_path = os.path.join(env.tmp, f"h-samples-{table}.json")
    sampler = ctx.Process(
        target=_liberate_and_sample,
        args=(env.backend.endpoint, table, stop, samples_path),
    )
    paper = futures.ProcessPoolExecutor(1, mp_context=ctx)
    levels: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    try:
        sampler.start()
        paper.submit(_paper_ping).result(timeout=120)
        for n in opts["h_daemons"]:
            t_start = time.perf_counter()
            ds = env.start_daemons(table, n, prefix=f"h{n}-")
            startup = time.perf_counter() - t_start
            try:
                for use in opts["h_uses"]:
                    rate_w = demand(use, pool) / (n * WORKERS)
                    t0 = time.monotonic() + 1.0
                    t_end = t0 + warm + measure
                    tag = f"{n}x{use}"
                    load0 = os.getloadavg()
                    fut = paper.submit(_paper_level, table, env.endpoint, n, rate_w, t0, t_end, tag)

                    calls, before, after = asyncio.run(_drive(ds, rate_w, t0, t_end, warm, tag))
                    paper_calls = fut.result(timeout=warm + measure + 120)
                    window = (t0 + warm, t_end)
                    total = _delta(after, before)
                    r_calls = [c for c in calls if window[0] <= c[0] < window[1]]
                    p_calls = [c for c in paper_calls if window[0] <= c[0] < window[1]]
                    p_ops: Counter[str] = Counter()
                    for c in p_calls:
                        p_ops.update(c[4])
                    level = {
                        "daemons": n,
                        "use_pct": use,
                        "demand_per_s": demand(use, pool),
                        "startup_s": startup,
                        "load_before": load0,
                        "load_after": os.getloadavg(),
                        "window": window,
                        "rasd_calls": calls,
                        "paper_calls": [c[:4] for c in paper_calls],
                        "rasd_counters": {k: v for k, v in sorted(total.items()) if v},
                        "rasd": {
                            "new_leases_answered": sum(1 for c in r_calls if c[3] == "ok"),
                            "args": (
                                r_calls,
                                total["lease.new"],
                                total["prefetch.conflicts"],
                                _ddb_ops(total),
                            ),
                        },
                        "paper": {
                            "args": (
                                p_calls,
                                sum(1 for c in p_calls if c[3] == "ok"),
                                sum(c[5] for c in p_calls),
                                dict(p_ops),
                            )
                        },
                    }
                    levels.append(level)
                    print(
                        f"  (h) {n} daemons, {use} %: {len(r_calls)} rasd and {len(p_calls)} "
                        f"paper requests measured, load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
            finally:
                env.stop_daemons(ds)
    finally:
        stop.set()
        sampler.join(60)
        paper.shutdown(wait=True, cancel_futures=True)
    with open(samples_path) as fh:
        sampled = json.load(fh)
    env.drop_table(table)
    samples = sampled["samples"]
    for lv in levels:
        for side in ("rasd", "paper"):
            args = lv[side].pop("args")
            lv[side].update(
                _figures(  # type: ignore[call-arg]  # the args the workers recorded, in order
                    side,
                    *args,
                    samples,
                    backoff if side == "rasd" else 0.0,
                    pool,
                    lv["window"],
                )
            )
            s = lv[side]
            lat = s["latency"]
            rows.append(
                {
                    "scenario": "h",
                    "what": f"{lv['daemons']} daemons, {lv['use_pct']} % use",
                    "side": "rasd" if side == "rasd" else "paper agent",
                    **lat,
                    "note": (
                        f"conflicts/new {s['conflicts_per_new_lease']:.2f}, ddb/new "
                        f"{s['ddb_per_new_lease']:.2f}, NO_CAPACITY {s['no_capacity']} "
                        f"({s['no_capacity_while_claimable']} while claimable), use "
                        f"{(s['use_measured'] or 0):.0%}"
                    ),
                }
            )
    return {
        "title": "(h) a pool near full: daemons beside the paper's agents",
        "pool_size": pool,
        "lease_s": H_LEASE_S,
        "liberator_grace_s": H_GRACE_S,
        "liberator": sampled["liberator"],
        "levels": levels,
        "rows": rows,
        "table": markdown(levels),
    }


def _ops(by_op: dict[str, float]) -> str:
    short = {"Query": "Q", "GetItem": "G", "UpdateItem": "U", "PutItem": "P", "DeleteItem": "D"}
    return " ".join(f"{short.get(k, k)} {v:.2f}" for k, v in by_op.items())


def markdown(levels: list[dict[str, Any]]) -> str:
    """The table docs/performance.md shows."""
    out = [
        "| daemons, use (measured) | agent | conflicts per new lease | DynamoDB requests per "
        "new lease (Q/G/U) | new lease p50 / p99 | NO_CAPACITY (while claimable) | other errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        for side, name in (("rasd", "rasd"), ("paper", "paper's agent")):
            s = lv[side]
            lat = s["latency"]
            use = f"{s['use_measured']:.0%}" if s["use_measured"] is not None else "?"
            errs = ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "0"
            out.append(
                f"| {lv['daemons']}, {lv['use_pct']} % ({use}) | {name} | "
                f"{s['conflicts_per_new_lease']:.2f} | {s['ddb_per_new_lease']:.2f} "
                f"({_ops(s['ddb_per_new_lease_by_op'])}) | {lat['p50_ms']:.1f} / "
                f"{lat['p99_ms']:.1f} ms | {s['no_capacity']} ({s['no_capacity_while_claimable']}) "
                f"| {errs} |"
            )
    return "\n".join(out)

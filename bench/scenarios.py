"""The benchmark's scenarios, (a) to (g). Each returns a JSON-able dict with ``rows`` for the table.

Every timed call is one ``time.perf_counter_ns()`` pair around one client call; rasd and the
baseline are interleaved call by call where they measure the same thing, so both see the same
noise. DynamoDB calls are counted from the daemon's own counters (``stats`` op), before/after
(``ddb.Query`` + ``ddb.GetItem`` + ``ddb.UpdateItem``: every attempt, background work included).
In (a)-(c) the daemons also record every call at their store boundary (``bench.storetrace``),
so each request's own calls and round trips are counted, apart from background work.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import secrets
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import rasd_client
from rasd.core import builders, map_builders, serialize
from rasd.core import lease as lease_items
from rasd.core import writes as item_writes

from . import storetrace
from .baseline import BaselineAgent
from .harness import CLIENT, POOL, REGION, Echo, Env, cpu_split, lease_until
from .report import histogram_ms, summarize_ns

TIMEOUT = 10.0  # client deadline for bench calls: the backend on a busy 2-core box is slow


def _exp_us(exp_s: float) -> int:
    return int(exp_s * 1_000_000)


def _delta(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    keys = set(after) | set(before)
    return {k: after[k] - before[k] for k in sorted(keys) if after[k] - before[k]}


#: the daemon's counters of DynamoDB calls (rasd.dynamo.store counts every attempt as ``ddb.<op>``);
#: the other ``ddb.*`` counters (conditional_failed, timeouts...) are outcomes, not calls
DDB_CALLS = ("ddb.Query", "ddb.GetItem", "ddb.UpdateItem")


def _ddb_calls(counters: dict[str, int] | Counter[str]) -> int:
    return sum(counters.get(k, 0) for k in DDB_CALLS)


def _row(scen: str, what: str, side: str, s: dict[str, Any], note: str = "") -> dict[str, Any]:
    return {"scenario": scen, "what": what, "side": side, **s, "note": note}


def _timed(fn: Any, *a: Any, **kw: Any) -> tuple[int, Any]:
    t0 = time.perf_counter_ns()
    r = fn(*a, **kw)
    return time.perf_counter_ns() - t0, r


# ------------------------------------------------------------------------ (a), (b), (c)
def latency_abc(env: Env, opts: dict[str, Any]) -> dict[str, Any]:
    """Batches on fresh small tables (moto's index Query walks the whole table, so a small
    table keeps its service time near its floor): two daemons D1 and D2 and the baseline.

    (c) new lease: D1 and the baseline alternately acquire fresh keys.
    (b) held through another daemon: D2 reads the keys D1 acquired (never in D2's cache);
        the baseline reads the same keys (one Query each).
    (a) cached: D1 again on its own keys; the baseline's answer is the same Query as in (b).

    Both daemons record their DynamoDB calls at the store boundary (``bench.storetrace``):
    each rasd request's calls and round trips come from its own window of that trace.
    """
    m = opts["abc_per_batch"]
    batches = opts["abc_batches"]
    hits_n = opts["a_samples"]
    exp = lease_until()
    exp_us = _exp_us(exp)
    raw: dict[str, dict[str, list[int]]] = {
        s: {"rasd": [], "baseline": []} for s in ("a", "b", "c")
    }
    calls_c: Counter[str] = Counter()
    calls_b: Counter[str] = Counter()
    new_c = 0
    base_calls_c: Counter[str] = Counter()
    base_calls_b: Counter[str] = Counter()
    base_new = 0
    b_reqs = 0
    cpu_c = {"rasd_daemon": 0.0, "rasd_client": 0.0, "baseline": 0.0}  # CPU seconds in (c)
    bad: list[str] = []
    #: per scenario: the store-boundary view of each rasd request; the baseline's calls
    store: dict[str, list[dict[str, Any]]] = {s: [] for s in ("a", "b", "c")}
    base_per_req: dict[str, list[int]] = {s: [] for s in ("a", "b", "c")}
    for bi in range(batches):
        table = env.new_table(resources=int(m * 2.5) + 60, prefix=f"b{bi}")
        d1, d2 = env.start_daemons(table, 2, prefix=f"abc{bi}-", trace=True)
        base = BaselineAgent(table, REGION, env.endpoint)
        win: dict[str, list[tuple[float, float]]] = {s: [] for s in ("a", "b", "c")}
        try:
            # warm-up: connections (the proxy charges a new one 2 extra RTTs), pools, prefetch
            for i in range(3):
                for d in (d1, d2):
                    rasd_client.get_lease(
                        CLIENT,
                        POOL,
                        f"w{bi}-{d.name}-{i}",
                        exp,
                        socket_path=d.socket,
                        timeout=TIMEOUT,
                    )
                base.get_lease(CLIENT, POOL, f"wb{bi}-{i}", exp_us)
            time.sleep(0.3)  # let the prefetch refills started by the warm-up finish
            # (c) new leases, interleaved
            before = d1.counters()
            bc0 = Counter(base.calls)
            keys = []
            d_cpu0 = sum(cpu_split(d1.pid))
            for i in range(m):
                k = f"c{bi}-{i}"
                w0 = time.perf_counter()
                c0 = time.thread_time()
                dt, lease = _timed(
                    rasd_client.get_lease,
                    CLIENT,
                    POOL,
                    k,
                    exp,
                    socket_path=d1.socket,
                    timeout=TIMEOUT,
                )
                cpu_c["rasd_client"] += time.thread_time() - c0
                win["c"].append((w0, time.perf_counter()))
                if not lease.new:
                    bad.append(f"{k}: rasd lease not new")
                raw["c"]["rasd"].append(dt)
                keys.append(k)
                c0 = time.thread_time()
                dt, _ = _timed(base.get_lease, CLIENT, POOL, f"cb{bi}-{i}", exp_us)
                cpu_c["baseline"] += time.thread_time() - c0
                raw["c"]["baseline"].append(dt)
                base_per_req["c"].append(base.last_calls)
                base_new += 1
                time.sleep(0.002)  # a little air: an app does not acquire back to back
            # the daemon's CPU over the interval: background work included (confirmations,
            # refills), and the store trace the bench records
            cpu_c["rasd_daemon"] += sum(cpu_split(d1.pid)) - d_cpu0
            calls_c.update(_delta(d1.counters(), before))
            new_c += m
            base_calls_c.update(_delta(Counter(base.calls), bc0))
            # (b) the same keys through D2 (not in its cache), and the baseline on them
            before = d2.counters()
            bc0 = Counter(base.calls)
            for k in keys:
                w0 = time.perf_counter()
                dt, lease = _timed(
                    rasd_client.get_lease,
                    CLIENT,
                    POOL,
                    k,
                    exp,
                    socket_path=d2.socket,
                    timeout=TIMEOUT,
                )
                win["b"].append((w0, time.perf_counter()))
                if lease.new:
                    bad.append(f"{k}: D2 acquired a second resource")
                raw["b"]["rasd"].append(dt)
                dt, _ = _timed(base.get_lease, CLIENT, POOL, k, exp_us)
                raw["b"]["baseline"].append(dt)
                base_per_req["b"].append(base.last_calls)
            calls_b.update(_delta(d2.counters(), before))
            base_calls_b.update(_delta(Counter(base.calls), bc0))
            b_reqs += len(keys)
            # (a) cached on D1
            for _ in range(50):  # warm-up of the client connection and the code paths
                rasd_client.get_lease(CLIENT, POOL, keys[0], exp, socket_path=d1.socket)
            before = d1.counters()
            per = max(1, hits_n // batches)
            for i in range(per):
                w0 = time.perf_counter()
                dt, _ = _timed(
                    rasd_client.get_lease,
                    CLIENT,
                    POOL,
                    keys[i % len(keys)],
                    exp,
                    socket_path=d1.socket,
                )
                win["a"].append((w0, time.perf_counter()))
                raw["a"]["rasd"].append(dt)
            calls_a = _delta(d1.counters(), before)
            for i in range(max(1, opts["a_baseline_samples"] // batches)):
                dt, _ = _timed(base.get_lease, CLIENT, POOL, keys[i % len(keys)], exp_us)
                raw["a"]["baseline"].append(dt)
                base_per_req["a"].append(base.last_calls)
            time.sleep(0.1)  # let the last background calls (map_confirm) return
            t1, t2 = d1.trace(), d2.trace()
            store["c"] += storetrace.per_request(t1, win["c"])
            store["b"] += storetrace.per_request(t2, win["b"])
            store["a"] += storetrace.per_request(t1, win["a"])
        finally:
            env.stop_daemons([d1, d2])
            env.drop_table(table)

    out: dict[str, Any] = {}
    titles = {
        "a": "(a) existing lease, cached in the daemon",
        "b": "(b) existing lease held through another daemon",
        "c": "(c) new lease",
    }
    for s in ("a", "b", "c"):
        r = summarize_ns(raw[s]["rasd"])
        b = summarize_ns(raw[s]["baseline"])
        st = storetrace.summarize(store[s])
        bcalls = sum(base_per_req[s]) / max(1, len(base_per_req[s]))
        # per request, at the store boundary (rasd) / the agent's boto3 calls (baseline, which
        # makes its calls one after another: its round trips are its calls)
        r["ddb_calls"] = st.get("calls_per_request")
        r["round_trips"] = st.get("round_trips_per_request")
        b["ddb_calls"] = b["round_trips"] = bcalls
        out[s] = {
            "title": titles[s],
            "rasd": r,
            "baseline": b,
            "speedup_p50": b["p50_ms"] / r["p50_ms"],
            "speedup_p99": b["p99_ms"] / r["p99_ms"],
            "raw_ms": {
                "rasd": histogram_ms(raw[s]["rasd"]),
                "baseline": histogram_ms(raw[s]["baseline"]),
            },
            #: rasd, each request's own DynamoDB calls and round trips (bench.storetrace)
            "rasd_store": st,
            "baseline_calls_per_request": bcalls,
            "baseline_round_trips_per_request": bcalls,
        }
    # The daemon's counters: every call in the interval, background work included (the
    # background map_confirm of each new lease, prefetch refills, re-confirmations).
    out["c"]["rasd_counters"] = dict(calls_c)
    out["c"]["rasd_ddb_calls_per_new_lease"] = _ddb_calls(calls_c) / max(1, new_c)
    out["c"]["baseline_ddb_calls_per_new_lease"] = sum(base_calls_c.values()) / max(1, base_new)
    # CPU per new lease: the daemon's (from /proc, to the 10 ms tick, over every batch), the
    # calling thread's in rasd_client, and the paper-style agent's own (boto3 in this thread)
    per = {
        k: round(v / max(1, n) * 1e3, 3)
        for k, v, n in (
            ("rasd_daemon_ms", cpu_c["rasd_daemon"], new_c),
            ("rasd_client_ms", cpu_c["rasd_client"], new_c),
            ("baseline_ms", cpu_c["baseline"], base_new),
        )
    }
    if per["baseline_ms"]:
        per["daemon_vs_baseline"] = round(per["rasd_daemon_ms"] / per["baseline_ms"], 3)
    out["c"]["cpu_per_new_lease"] = per
    out["b"]["rasd_counters"] = dict(calls_b)
    out["b"]["rasd_ddb_calls_per_request"] = _ddb_calls(calls_b) / max(1, b_reqs)
    out["b"]["baseline_ddb_calls_per_request"] = sum(base_calls_b.values()) / max(1, b_reqs)
    out["a"]["rasd_ddb_calls"] = _ddb_calls(calls_a)
    out["problems"] = bad
    return out


# ------------------------------------------------------------------------------------ (d)
def _tp_worker(
    targets: list[tuple[str, str]],
    keys: list[str],
    exp: float,
    seconds: float,
    barrier: Any,
    results: Any,
    idx: int,
) -> None:
    try:
        counts = _tp_run(targets, keys, exp, seconds, barrier, idx)
    except BaseException:
        barrier.abort()  # the parent must not wait for a worker that died
        raise
    results.put(counts)


def _tp_run(
    targets: list[tuple[str, str]],
    keys: list[str],
    exp: float,
    seconds: float,
    barrier: Any,
    idx: int,
) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, path in targets:
        # warm-up: connect and run the code paths before the clock starts
        for i in range(20):
            rasd_client.get_lease(CLIENT, POOL, keys[i % len(keys)], exp, socket_path=path)
        barrier.wait()
        end = time.perf_counter() + seconds
        n = 0
        i = idx
        nk = len(keys)
        get = rasd_client.get_lease
        while time.perf_counter() < end:
            get(CLIENT, POOL, keys[i % nk], exp, socket_path=path)
            n += 1
            i += 1
        counts[name] = n
        barrier.wait()
    return counts


def throughput_d(env: Env, opts: dict[str, Any]) -> dict[str, Any]:
    """Cached get_lease from P client processes, next to the echo server (the IPC floor)."""
    table = env.new_table(resources=100, prefix="d")
    (daemon,) = env.start_daemons(table, 1, prefix="tp")
    echo = Echo(env)
    exp = lease_until()
    keys = [f"tp-{i}" for i in range(50)]
    try:
        for k in keys:
            rasd_client.get_lease(CLIENT, POOL, k, exp, socket_path=daemon.socket, timeout=TIMEOUT)
        before = daemon.counters()
        ctx = mp.get_context("fork")
        points = []
        rows = []
        for procs in opts["d_procs"]:
            rounds: dict[str, list[float]] = {"rasd": [], "echo": []}
            for rnd in range(opts["d_rounds"]):
                order = [("echo", echo.socket), ("rasd", daemon.socket)]
                if rnd % 2:
                    order.reverse()
                barrier = ctx.Barrier(procs + 1)
                results = ctx.Queue()
                ws = [
                    ctx.Process(
                        target=_tp_worker,
                        args=(order, keys, exp, opts["d_seconds"], barrier, results, i),
                    )
                    for i in range(procs)
                ]
                for w in ws:
                    w.start()
                totals: Counter[str] = Counter()
                for _ in order:
                    barrier.wait(timeout=60)  # start
                    barrier.wait(timeout=60)  # end
                for _ in ws:
                    totals.update(results.get(timeout=60))
                for w in ws:
                    w.join(30)
                for name in ("rasd", "echo"):
                    rounds[name].append(totals[name] / opts["d_seconds"])
            r = statistics.median(rounds["rasd"])
            e = statistics.median(rounds["echo"])
            points.append(
                {
                    "procs": procs,
                    "rasd_calls_per_s": r,
                    "echo_calls_per_s": e,
                    "ratio": r / e,
                    "rounds": rounds,
                }
            )
            rows.append(
                _row(
                    "d",
                    f"cached get_lease, {procs} procs",
                    "rasd",
                    {"calls_per_s": r},
                    f"{r / e:.0%} of IPC floor",
                )
            )
            rows.append(
                _row(
                    "d", f"cached get_lease, {procs} procs", "echo", {"calls_per_s": e}, "IPC floor"
                )
            )
        calls = _delta(daemon.counters(), before)
    finally:
        echo.stop()
        env.stop_daemons([daemon])
        env.drop_table(table)
    return {
        "title": "(d) throughput of cached get_lease vs the IPC floor",
        "points": points,
        "rows": rows,
        "seconds_per_point": opts["d_seconds"],
        "rounds": opts["d_rounds"],
        "rasd_ddb_calls": _ddb_calls(calls),
    }


# ------------------------------------------------------------------------------------ (e)
def scale_e(env: Env, opts: dict[str, Any]) -> dict[str, Any]:
    """New-lease latency and DynamoDB calls per acquisition as the pool grows (dynalite)."""
    m = opts["e_samples"]
    exp = lease_until()
    exp_us = _exp_us(exp)
    points = []
    rows = []
    for per_part in opts["e_sizes"]:
        total = per_part * lease_items.PARTITIONS
        t0 = time.perf_counter()
        table = env.new_table(resources=0)
        env.add_resources(table, total, prefix=f"e{per_part}", threads=4)
        seed_s = time.perf_counter() - t0
        (d,) = env.start_daemons(table, 1, prefix=f"e{per_part}-")
        base = BaselineAgent(table, REGION, env.endpoint)
        try:
            for i in range(5):
                rasd_client.get_lease(
                    CLIENT, POOL, f"ew{i}", exp, socket_path=d.socket, timeout=TIMEOUT
                )
                base.get_lease(CLIENT, POOL, f"ewb{i}", exp_us)
            time.sleep(0.3)
            before = d.counters()
            bc0 = Counter(base.calls)
            rs, bs = [], []
            for i in range(m):
                dt, _ = _timed(
                    rasd_client.get_lease,
                    CLIENT,
                    POOL,
                    f"e{i}",
                    exp,
                    socket_path=d.socket,
                    timeout=TIMEOUT,
                )
                rs.append(dt)
                dt, _ = _timed(base.get_lease, CLIENT, POOL, f"eb{i}", exp_us)
                bs.append(dt)
                time.sleep(0.002)
            calls = _delta(d.counters(), before)
            bcalls = _delta(Counter(base.calls), bc0)
        finally:
            env.stop_daemons([d])
        r, b = summarize_ns(rs), summarize_ns(bs)
        pt = {
            "per_subpartition": per_part,
            "total_resources": total,
            "seed_s": seed_s,
            "rasd": r,
            "baseline": b,
            "rasd_ddb_calls_per_new_lease": _ddb_calls(calls) / m,
            "baseline_ddb_calls_per_new_lease": sum(bcalls.values()) / m,
            "rasd_counters": calls,
        }
        points.append(pt)
        rows.append(
            _row(
                "e",
                f"new lease, {per_part:,}/sub-part",
                "rasd",
                r,
                f"{pt['rasd_ddb_calls_per_new_lease']:.2f} ddb calls/acq",
            )
        )
        rows.append(
            _row(
                "e",
                f"new lease, {per_part:,}/sub-part",
                "baseline",
                b,
                f"{pt['baseline_ddb_calls_per_new_lease']:.2f} ddb calls/acq",
            )
        )
        env.drop_table(table)
    p50s = [p["rasd"]["p50_ms"] for p in points]
    out = {
        "title": "(e) scale: new lease vs resources per sub-partition (dynalite)",
        "points": points,
        "rows": rows,
        "rasd_p50_spread": (max(p50s) - min(p50s)) / min(p50s) if p50s else None,
        "rasd_p50_last_vs_first": p50s[-1] / p50s[0] - 1 if p50s else None,
    }
    return out


# ------------------------------------------------------------------------------------ (f)
async def _contention_load(
    socks: list[str], keys_per_daemon: int, shared: int, inflight: int, exp: float
) -> tuple[dict[tuple[str, str], str], list[str], list[int]]:
    from rasd_client import aio

    got: dict[tuple[str, str], str] = {}  # (daemon socket, key) -> resource
    errors: list[str] = []
    lat: list[int] = []

    async def one(sock: str, key: str) -> None:
        t0 = time.perf_counter_ns()
        try:
            lease = await aio.get_lease(CLIENT, POOL, key, exp, socket_path=sock, timeout=TIMEOUT)
        except rasd_client.RasdError as exc:
            errors.append(f"{key}@{os.path.basename(sock)}: {exc.code} {exc.message}")
            return
        lat.append(time.perf_counter_ns() - t0)
        got[(sock, key)] = lease.resource

    async def worker(sock: str, keys: list[str]) -> None:
        for k in keys:
            await one(sock, k)

    tasks = []
    for di, sock in enumerate(socks):
        keys = [f"f{di}-{i}" for i in range(keys_per_daemon)]
        for w in range(inflight):
            tasks.append(worker(sock, keys[w::inflight]))
    # shared keys: each asked through three daemons at once (the race for the key's mapping)
    rng = random.Random(7)

    async def shared_key(i: int) -> None:
        await asyncio.sleep(rng.random() * 2.0)
        await asyncio.gather(*(one(s, f"shared-{i}") for s in rng.sample(socks, 3)))

    tasks += [shared_key(i) for i in range(shared)]
    await asyncio.gather(*tasks)
    await aio.close()
    await asyncio.sleep(0)  # let the cancelled reader tasks finish
    return got, errors, lat


def contention_f(env: Env, opts: dict[str, Any]) -> dict[str, Any]:
    n = opts["f_daemons"]
    per = opts["f_keys_per_daemon"]
    shared = opts["f_shared_keys"]
    acquisitions = n * per + shared
    pool_size = max(acquisitions * 3, opts.get("f_min_pool", 2000))
    table = env.new_table(resources=pool_size, prefix="f")
    t0 = time.perf_counter()
    ds = env.start_daemons(table, n, prefix="f")
    startup_s = time.perf_counter() - t0
    exp = lease_until()
    try:
        # cold: each daemon's first acquisition finds an empty prefetch buffer (counted apart)
        cold0 = {d.name: d.counters() for d in ds}

        async def warm() -> None:
            from rasd_client import aio

            try:
                await asyncio.gather(
                    *(
                        aio.get_lease(
                            CLIENT, POOL, f"fw-{d.name}", exp, socket_path=d.socket, timeout=TIMEOUT
                        )
                        for d in ds
                    )
                )
            finally:
                await aio.close()
                await asyncio.sleep(0)  # let the cancelled reader tasks finish

        asyncio.run(warm())
        cold: Counter[str] = Counter()
        for d in ds:
            cold.update(_delta(d.counters(), cold0[d.name]))
        time.sleep(1.0)  # let the refills the first takes started finish
        before = {d.name: d.counters() for d in ds}
        t0 = time.perf_counter()
        got, errors, lat = asyncio.run(
            _contention_load([d.socket for d in ds], per, shared, opts["f_inflight"], exp)
        )
        wall = time.perf_counter() - t0
        total: Counter[str] = Counter()
        for d in ds:
            total.update(_delta(d.counters(), before[d.name]))
        rss = [d.rss_kb() for d in ds]
    finally:
        env.stop_daemons(ds)
    # ---- audit: answers and table agree, no resource under two keys, no key with two
    by_key: dict[str, set[str]] = {}
    for (_, key), res in got.items():
        by_key.setdefault(key, set()).add(res)
    key_two_resources = {k: sorted(v) for k, v in by_key.items() if len(v) > 1}
    owners: dict[str, set[str]] = {}
    for key, rs in by_key.items():
        for r in rs:
            owners.setdefault(r, set()).add(key)
    resource_two_keys = {r: sorted(k) for r, k in owners.items() if len(k) > 1}
    items = _scan(env, table)
    leased = [it for it in items if "key" in it and it["client_id"]["S"] == CLIENT]
    # held items per key: a lease, plus any claim no mapping names (an orphan, never served)
    table_by_key: dict[str, list[str]] = {}
    for it in leased:
        table_by_key.setdefault(it["key"]["S"], []).append(it["resource"]["S"])
    table_dups = {k: v for k, v in table_by_key.items() if len(v) > 1}
    # the table's truth (docs/design.md): a key's lease is what its mapping names, held by the
    # mapping's token
    truth = _leases_in_table(items)
    named = set(truth.values())
    orphans = sorted(it["resource"]["S"] for it in leased if it["resource"]["S"] not in named)
    mismatch = [k for k, rs in by_key.items() if k in truth and rs != {truth[k]}]
    no_lease = [k for k in by_key if k not in truth]
    # the duplicated items as the table holds them (version, holder...), to debug
    dup_items = [
        {k: next(iter(v.values())) for k, v in it.items()}
        for it in leased
        if it["key"]["S"] in table_dups or it["key"]["S"] in key_two_resources
    ][:60]
    env.drop_table(table)
    new = total["lease.new"]
    conflicts = total["prefetch.conflicts"]
    hits, misses = total["prefetch.hits"], total["prefetch.misses"]
    double = len(key_two_resources) + len(resource_two_keys) + len(mismatch) + len(no_lease)
    s = summarize_ns(lat, wall)
    return {
        "title": f"(f) contention: {n} daemons, one pool",
        "daemons": n,
        "pool_size": pool_size,
        "cold_first_acquisition": {
            "prefetch_hits": cold["prefetch.hits"],
            "prefetch_misses": cold["prefetch.misses"],
            "conflicts": cold["prefetch.conflicts"],
            "leases_new": cold["lease.new"],
        },
        "acquisition_requests": acquisitions + 2 * shared,
        "distinct_keys": len(by_key),
        "leases_new": new,
        "conflicts": conflicts,
        "conflicts_per_acquisition": conflicts / max(1, new),
        "prefetch_hits": hits,
        "prefetch_misses": misses,
        "prefetch_hit_rate": hits / max(1, hits + misses),
        # the race for a key's mapping (docs/design.md, "New lease"): waits for another
        # daemon's pending mapping, lost mapping writes, claims given back or fenced
        "acq_waits": total["acq.waits"],
        "acq_lost_mapping": total["acq.lost_mapping"],
        "acq_gave_back": total["acq.gave_back"],
        "acq_fence_own": total["acq.fence_own"],
        "acq_fenced": total["acq.fenced"],
        "singleflight_joined": total["singleflight.joined"],
        "orphans_left": orphans,
        "double_allocations": double,
        "double_detail": {
            "key_with_two_resources": key_two_resources,
            "resource_with_two_keys": resource_two_keys,
            "answer_not_the_tables_lease": mismatch[:20],
            "answered_key_without_lease_in_table": no_lease[:20],
            # not a double allocation: orphaned claims are never served (orphans_left)
            "table_key_with_two_held_items": table_dups,
            "items": dup_items,
            "answers": {
                k: sorted(
                    {os.path.basename(sk): r for (sk, kk), r in got.items() if kk == k}.items()
                )
                for k in list(key_two_resources)[:20] + list(table_dups)[:20]
            },
        },
        "errors": errors[:50],
        "error_count": len(errors),
        "latency": s,
        "wall_s": wall,
        "startup_s": startup_s,
        "rss_kb_median": statistics.median(rss),
        "counters": dict(total),
        "rows": [
            _row(
                "f",
                f"{n} daemons, new leases",
                "rasd",
                s,
                f"conflicts/acq {conflicts / max(1, new):.3f}, prefetch hits "
                f"{hits / max(1, hits + misses):.1%}, double alloc {double}",
            )
        ],
    }


def _leases_in_table(items: list[dict[str, Any]]) -> dict[str, str]:
    """key -> resource of every lease the table holds for the bench pool in our region: the
    key's mapping item is pending or live and names (token, r), and r is held by that token
    for that key."""
    held = {
        it["resource"]["S"]: (it.get("holder", {}).get("S"), it["key"]["S"])
        for it in items
        if it["client_id"]["S"] == CLIENT and "key" in it
    }
    out: dict[str, str] = {}
    pfx = lease_items.map_pk(CLIENT, POOL, "")
    for it in items:
        pk = it["client_id"]["S"]
        if not pk.startswith(pfx) or it["resource"]["S"] != REGION:
            continue
        m = serialize.mapping_from_ddb(it)
        live = m.state in (lease_items.PENDING, lease_items.LIVE) and m.resource is not None
        if live and held.get(m.resource or "") == (m.token, m.key):
            out[m.key] = m.resource or ""
    return out


def _scan(env: Env, table: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    kw: dict[str, Any] = {"TableName": table}
    while True:
        r = env.direct.scan(**kw)
        out += r.get("Items", [])
        if "LastEvaluatedKey" not in r:
            return out
        kw["ExclusiveStartKey"] = r["LastEvaluatedKey"]


# ------------------------------------------------------------------------------------ (g)
async def _fill(sock: str, n: int, inflight: int, exp: float) -> dict[str, int]:
    """Acquire keys g0..g{n-1} with ``inflight`` requests in flight; BUSY is retried."""
    from rasd_client import aio

    errors: Counter[str] = Counter()
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            for _ in range(50):
                try:
                    await aio.get_lease(CLIENT, POOL, f"g{i}", exp, socket_path=sock, timeout=30.0)
                    break
                except rasd_client.Busy as exc:
                    errors["BUSY(retried)"] += 1
                    await asyncio.sleep(exc.retry_after or 0.01)
                except rasd_client.RasdError as exc:
                    errors[exc.code] += 1
                    break

    await asyncio.gather(*(worker() for _ in range(inflight)))
    await aio.close()
    await asyncio.sleep(0)  # let the cancelled reader tasks finish
    return dict(errors)


#: (g): S long enough that no answer leaves the cache during the fill (the daemon's default
#: of 30 s would measure only the leases of the fill's last 30 s)
G_CONFIRM_INTERVAL = 3600.0


def _leased_items(n: int, exp_us: int) -> Any:
    """Keys g0..g{n-1}, each holding resource g-{i} the way the protocol leaves a lease: the
    claim and the mapping write of one acquisition (same token), then the mapping confirmed
    ``live``. Built with the daemon's own write builders (``rasd.core.builders``) applied by
    ``rasd.core.writes.apply``, so the items are exactly what a daemon would have written.
    Yields resource and mapping items (DynamoDB attribute maps)."""
    now = time.time_ns() // 1000
    for i in range(n):
        free = item_writes.item_from_av(
            builders.new_resource_item(CLIENT, POOL, REGION, f"g-{i:07d}", now)
        )
        r = serialize.resource_from(free)
        token = secrets.token_hex(8)
        key = f"g{i}"
        held = item_writes.apply(free, builders.claim(r, key, exp_us, now, token, 1))
        ident = (lease_items.map_pk(CLIENT, POOL, key), REGION)
        mw = map_builders.map_acquire(
            ident, 0, token, r.resource, r.version, exp_us, now, "bench-seed"
        )
        pending = item_writes.apply(None, mw)
        assert held is not None and pending is not None
        live = item_writes.apply(pending, map_builders.map_confirm(serialize.mapping_from(pending)))
        assert live is not None
        yield {a: item_writes.to_av(v) for a, v in held.items()}
        yield {a: item_writes.to_av(v) for a, v in live.items()}


def memory_g(env: Env, opts: dict[str, Any]) -> dict[str, Any]:
    """Daemon RSS with N leases in its cache; and the client's import time.

    The N leases are written to the table already leased (keys g0..gN-1: a live mapping item
    and its resource held by the mapping's token, as an acquisition leaves them), and the
    daemon caches each on its first get_lease: one Query of the key's mapping items instead
    of a whole acquisition, so 100K fit in a few minutes. What ends up in the cache is the
    same Lease either way. ``fill_new_leases`` counts keys the daemon acquired instead of
    finding (must be 0: a seeding mistake would otherwise drain the 20 free resources).
    """
    from rasd.core import schema

    n = opts["g_leases"]
    exp = lease_until()
    table = env.new_table(resources=20, prefix="gfree")
    t0 = time.perf_counter()
    items = list(_leased_items(n, _exp_us(exp)))
    chunks = [items[i::4] for i in range(4)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda c: schema.batch_write(env.direct, table, c), chunks))
    del items, chunks
    seed_s = time.perf_counter() - t0
    # Filling a cache on purpose: lift the runaway-client rate limit and the in-flight gate,
    # and keep every answer cached for the whole fill (the cache drops an answer S =
    # confirm_interval after its confirmation: 30 s by default, shorter than a 100K fill).
    (d,) = env.start_daemons(
        table,
        1,
        prefix="g",
        rate_limit=1e6,
        rate_burst=1e6,
        call_rate_limit=1e6,
        call_rate_burst=1e6,
        max_inflight=max(64, opts["g_inflight"]),
        confirm_interval=G_CONFIRM_INTERVAL,
    )
    try:
        for i in range(5):
            rasd_client.get_lease(
                CLIENT, POOL, f"gw{i}", exp, socket_path=d.socket, timeout=TIMEOUT
            )
        rss0 = d.rss_kb()
        t0 = time.perf_counter()
        errors = asyncio.run(_fill(d.socket, n, opts["g_inflight"], exp))
        fill_s = time.perf_counter() - t0
        st = d.stats()
        rss1 = d.rss_kb()
        cached = st.get("cache_leases", 0)
        fill_counters = Counter(st.get("counters", {}))
    finally:
        env.stop_daemons([d])
        env.drop_table(table)
    imp = import_time(opts["import_runs"])
    per_lease = (rss1 - rss0) * 1024 / max(1, cached - 5)
    return {
        "title": "(g) memory and client import time",
        "leases_requested": n,
        "cached_leases": cached,
        "fill_errors": errors,
        # the 5 warm-up keys are new; every g-key must be found, not acquired
        "fill_new_leases": fill_counters["lease.new"] - 5,
        "fill_existing_leases": fill_counters["lease.existing"],
        "fill_ddb_calls": _ddb_calls(fill_counters),
        "daemon_settings": "RASD_RATE_LIMIT=1e6 RASD_RATE_BURST=1e6 RASD_CALL_RATE_LIMIT=1e6 "
        "RASD_CALL_RATE_BURST=1e6 RASD_MAX_INFLIGHT>=64 "
        f"RASD_CONFIRM_INTERVAL={G_CONFIRM_INTERVAL:g}",
        "fill_s": fill_s,
        "seed_s": seed_s,
        "cache_only": cache_only_memory(n),
        "rss_mb_start": rss0 / 1024,
        "rss_mb_full": rss1 / 1024,
        "bytes_per_cached_lease": per_lease,
        "rss_mb_at_100k_extrapolated": (rss0 * 1024 + per_lease * 100_000) / 2**20,
        "import": imp,
        "rows": [
            _row(
                "g",
                f"daemon RSS, {cached:,} cached leases",
                "rasd",
                {},
                f"{rss1 / 1024:.1f} MB (start {rss0 / 1024:.1f} MB, {per_lease:.0f} B/lease)",
            ),
            _row(
                "g",
                "import rasd_client",
                "client",
                {"p50_ms": imp["p50_ms"], "max_ms": imp["max_ms"], "n": imp["n"]},
                f"min {imp['min_ms']:.1f} ms; import msgpack alone {imp['msgpack_p50_ms']:.1f} ms",
            ),
        ],
    }


_IMPORT_SNIPPET = (
    "import time; t=time.perf_counter_ns(); import {mod}; print((time.perf_counter_ns()-t)/1e6)"
)


def import_time(runs: int) -> dict[str, Any]:
    """Median wall time of ``import rasd_client`` in a fresh interpreter (bytecode cached)."""

    def measure(mod: str) -> list[float]:
        xs = []
        for _ in range(runs + 1):
            out = subprocess.run(
                [sys.executable, "-c", _IMPORT_SNIPPET.format(mod=mod)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            xs.append(float(out.strip()))
        return sorted(xs[1:])  # the first run may write bytecode

    xs = measure("rasd_client")
    ms = measure("msgpack")
    return {
        "n": len(xs),
        "p50_ms": statistics.median(xs),
        "max_ms": max(xs),
        "min_ms": min(xs),
        "msgpack_p50_ms": statistics.median(ms),
    }


_CACHE_SNIPPET = """
import gc, json, sys, time, tracemalloc
from rasd.daemon.cache import LeaseCache
from rasd.core.clock import Clock
from rasd.core.lease import Lease
n = int(sys.argv[1])
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
exp = int((time.time() + 7200) * 1e6)
clock = Clock()
cache = LeaseCache(clock, 200_000, 5_000_000, 3600.0)
gc.collect(); r0 = rss(); tracemalloc.start()
for i in range(n):
    # fresh string objects per lease, as parsing a DynamoDB response makes them; a holder
    # token per lease, as the protocol caches it
    cache.put(Lease("".join(["ben", "ch"]), "".join(["p", ""]), f"g{i}", f"g-{i:07d}",
                    "".join(["us-east-", "1"]), exp, 1, exp - 3600_000_000, f"{i:016x}"),
              clock.mono())
gc.collect()
cur, _ = tracemalloc.get_traced_memory(); tracemalloc.stop()
print(json.dumps({"leases": len(cache), "traced_bytes_per_lease": cur / n,
                  "rss_bytes_per_lease": (rss() - r0) / n}))
"""


def cache_only_memory(n: int) -> dict[str, Any]:
    """Bytes per lease of rasd.daemon.cache.LeaseCache alone (no daemon, no DynamoDB)."""
    import json

    out = subprocess.run(
        [sys.executable, "-c", _CACHE_SNIPPET, str(n)], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)  # type: ignore[no-any-return]

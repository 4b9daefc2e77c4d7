"""The fleet bench (``make bench-fleet``): many hosts on one table, each asking now and then,
and what DynamoDB bills for it, beside the paper's agent on the same mix in the same run.

One dynalite, two tables (rasd's, the paper agent's), each behind its own delay proxy with a
capacity meter (``bench.meter``; the same delay for both). ``hosts`` daemons (``rasd serve``,
the shipped settings) serve rasd's side; the paper's agent (``BaselineAgent(paper=True)``,
threads of one process) the other. Each host's app asks, at Poisson times, for a new key
(probability ``share``) or for one of ``hot_keys`` keys shared by every host (Zipf, exponent
``zipf_s``), always with ``lease_expires = now + lease_s``: sliding leases, as apps use them.
A level is a per-host demand (a new key every ``new_every_s`` seconds on each host) and a
share; every level runs ``warm_s`` then ``measure_s`` seconds, and only the measured window
counts: the calls sent in it, the capacity billed in it. The pools' items have sat free
``free_since_s`` (an hour) when a phase begins, as in a pool in service.

The paper's agent has no per-host state (every call reads DynamoDB), so its side runs the
same schedules of ``paper_hosts`` hosts, not all of them: its latency and its bill per call do
not depend on how many hosts share the load, and a Python process cannot drive twenty hosts'
worth of boto3 calls on this machine beside the daemons. The liberators run every
``liberate_s`` (rasd's ``ras-liberator`` and the paper's) through the same meters, billed
apart ("job: ..." kinds), not in the per-call figures.

rasd runs in both modes: a fresh table (the fast rules, what ships) and a table in rollout
mode (``rasadmin adopt``'s record on), each with its own daemons.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import multiprocessing as mp
import os
import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fleet import daemons, tables
from fleet.backends import ProxyProcess, dynalite_status, install_dynalite

from . import meter
from .harness import CLIENT, POOL, REGION, Daemon, Env, aws_env, cpu_split
from .report import pct

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Level:
    new_every_s: float  # a new key on each host every this many seconds (on average)
    share: float  # of all calls, the share that asks for a new key

    @property
    def per_host_rate(self) -> float:
        return 1.0 / self.new_every_s / self.share

    @property
    def name(self) -> str:
        return f"new every {self.new_every_s:g} s, {self.share:.0%} new"


@dataclass
class Params:
    hosts: int = 20
    paper_hosts: int = 5
    items: int = 3000
    hot_keys: int = 300
    zipf_s: float = 1.1
    lease_s: float = 45.0
    warm_s: float = 15.0
    #: the rollout phase's one level starts on fresh daemons: warmed as long as the fast
    #: phase's reference level's daemons have run (its own 15 s after a 75 s level), and
    #: more, since rollout mode's speculation learns which keys a host served lately
    rollout_warm_s: float = 120.0
    measure_s: float = 60.0
    delay_ms: float = 3.5
    #: how long the pools' items have sat free when a phase begins: an hour, as in a pool in
    #: service (a daemon holds candidates longer the longer the items it reads sat free; on
    #: a pool seeded as the run begins it learns that only over its first minutes)
    free_since_s: float = 3600.0
    liberate_s: float = 5.0
    seed: int = 1
    #: the fast rules' levels: per-host demand at the reference share, then the share at 10 s
    levels: list[Level] = field(
        default_factory=lambda: [
            Level(1, 0.03),
            Level(10, 0.03),
            Level(60, 0.03),
            Level(10, 0.01),
            Level(10, 0.10),
        ]
    )
    #: rollout mode: the reference mix only
    rollout_levels: list[Level] = field(default_factory=lambda: [Level(10, 0.03)])
    #: each lever turned off, at the reference mix (and the sparsest demand for a lever that
    #: depends on it): its effect is these levels against the same levels of the fast
    #: phase, in the same run
    lever_levels: list[Level] = field(default_factory=lambda: [Level(10, 0.03), Level(60, 0.03)])


#: The levers of the fast rules (docs/performance.md, "A fleet"): name -> the daemons'
#: settings without it, and whether its effect depends on the per-host demand (then it runs
#: at every ``lever_levels``, else at the first only)
LEVERS: dict[str, tuple[dict[str, Any], bool]] = {
    "quiet candidates": ({"candidate_max_age_quiet": 0}, True),
    "read before extending": ({"extend_read_first": False}, False),
}


# ---------------------------------------------------------------------------- the schedule
def zipf_cdf(n: int, s: float) -> list[float]:
    w = [1.0 / (k**s) for k in range(1, n + 1)]
    total, acc, out = sum(w), 0.0, []
    for x in w:
        acc += x / total
        out.append(acc)
    return out


def schedule(p: Params, level: Level, hosts: int, tag: str) -> list[tuple[float, int, str]]:
    """(offset s, host, key) of every call of ``hosts`` hosts over warm + measure, in time
    order; the same for both sides (the paper's is the first ``paper_hosts`` hosts') and in
    every phase (only the new keys' names carry ``tag``)."""
    cdf = zipf_cdf(p.hot_keys, p.zipf_s)
    span = p.warm_s + p.measure_s
    out: list[tuple[float, int, str]] = []
    for h in range(hosts):
        rng = random.Random(f"{p.seed}/{level.name}/{h}")  # the same calls in every phase
        t, i = 0.0, 0
        while True:
            t += rng.expovariate(level.per_host_rate)
            if t >= span:
                break
            if rng.random() < level.share:
                i += 1
                key = f"{tag}-h{h}-n{i}"
            else:
                key = f"hot{bisect.bisect_left(cdf, rng.random())}"
            out.append((t, h, key))
    out.sort()
    return out


@dataclass
class Call:
    sent: float  # offset from the level's start
    host: int
    ms: float
    new: bool | None  # None: an error
    code: str = ""


def _figures(calls: list[Call], p: Params) -> dict[str, Any]:
    got = [c for c in calls if c.sent >= p.warm_s]
    new = sorted(c.ms for c in got if c.new)
    old = sorted(c.ms for c in got if c.new is False)
    errors = Counter(c.code for c in got if c.new is None)

    def lat(xs: list[float]) -> dict[str, float]:
        return {"n": len(xs), "p50_ms": pct(xs, 0.5), "p99_ms": pct(xs, 0.99)}

    return {
        "calls": len(got),
        "new_share": len(new) / max(1, len(got)),
        "new": lat(new),
        "existing": lat(old),
        "over_1s": {"new": sum(ms > 1000 for ms in new), "existing": sum(ms > 1000 for ms in old)},
        "errors": dict(errors),
    }


# ------------------------------------------------------------------------------- the apps
Events = list[tuple[float, int, str]]


def _rasd_app(sockets: list[str], events: Events, p: Params, out: str) -> None:
    import rasd_client
    from rasd_client import aio

    async def main() -> list[Call]:
        t0 = time.monotonic()
        calls: list[Call] = []

        async def one(at: float, host: int, key: str) -> None:
            end = time.time() + p.lease_s
            start = time.monotonic()
            try:
                lease = await aio.get_lease(
                    CLIENT, POOL, key, end, timeout=5.0, socket_path=sockets[host]
                )
                calls.append(Call(at, host, (time.monotonic() - start) * 1e3, lease.new))
            except rasd_client.RasdError as exc:
                code = getattr(exc, "code", type(exc).__name__)
                calls.append(Call(at, host, (time.monotonic() - start) * 1e3, None, code))

        tasks = []
        for at, host, key in events:
            wait = t0 + at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.ensure_future(one(at, host, key)))
        await asyncio.gather(*tasks)
        return calls

    calls = asyncio.run(main())
    Path(out).write_text(json.dumps([asdict(c) for c in calls]))


def _paper_app(endpoint: str, table: str, events: Events, p: Params, out: str) -> None:
    from .baseline import BaselineAgent, NoCapacity

    local = threading.local()
    calls: list[Call] = []
    lock = threading.Lock()

    def one(at: float, host: int, key: str) -> None:
        agent = getattr(local, "agent", None)
        if agent is None:
            agent = local.agent = BaselineAgent(table, REGION, endpoint, paper=True)
        end_us = int((time.time() + p.lease_s) * 1e6)
        start = time.monotonic()
        try:
            lease = agent.get_lease(CLIENT, POOL, key, end_us)
            c = Call(at, host, (time.monotonic() - start) * 1e3, lease.new)
        except NoCapacity:
            c = Call(at, host, (time.monotonic() - start) * 1e3, None, "NO_CAPACITY")
        except Exception as exc:  # noqa: BLE001 - counted, as the daemon's errors are
            c = Call(at, host, (time.monotonic() - start) * 1e3, None, type(exc).__name__)
        with lock:
            calls.append(c)

    t0 = time.monotonic()
    with ThreadPoolExecutor(24) as ex:
        for at, host, key in events:
            wait = t0 + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            ex.submit(one, at, host, key)
    Path(out).write_text(json.dumps([asdict(c) for c in calls]))


# ------------------------------------------------------------------------------- the jobs
def _liberate_forever(
    rasd: tuple[str, str], paper: tuple[str, str], every: float, stop: threading.Event
) -> None:
    """Both sides' liberators, through their meters, marked as jobs (billed apart)."""
    import logging

    import structlog
    from botocore.config import Config as BotoConfig

    from rasd_jobs import liberator

    from .baseline import paper_liberate

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))

    def client(endpoint: str) -> Any:
        import boto3

        cfg = BotoConfig(user_agent_extra=meter.JOB_MARK, retries={"max_attempts": 3})
        return boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION, config=cfg)

    r_ddb, p_ddb = client(rasd[0]), client(paper[0])
    while not stop.wait(every):
        now = time.time_ns() // 1000
        try:
            liberator.run(r_ddb, liberator.Options(table=rasd[1], region=REGION, now_us=now))
            paper_liberate(p_ddb, paper[1], now)
        except Exception:  # noqa: BLE001 - the next run retries
            pass


# ------------------------------------------------------------------------------- a phase
class Side:
    """One table behind its own metered proxy."""

    def __init__(
        self, env: Env, name: str, items: int, rollout: bool, tmp: str, free_since_s: float = 0.0
    ) -> None:
        self.table = f"fleet-{name}-{os.getpid()}"
        tables.seed_table(
            env.direct, self.table, CLIENT, POOL, max_lease_s=86400,
            rollout=("bench-fleet", "--rollout") if rollout else None,
        )  # fmt: skip
        since = time.time_ns() // 1000 - int(free_since_s * 1e6)
        env.add_resources(self.table, items, prefix=name, now_us=since)
        self.meter_file = os.path.join(tmp, f"{name}.meter.json")
        self.trace = os.path.join(tmp, f"{name}.trace.jsonl")
        self.proxy = ProxyProcess(
            env.backend.endpoint, env.delay_ms, trace=self.trace,
            meter=(self.meter_file, self.table, meter.FACTORY),
        )  # fmt: skip
        self.endpoint = self.proxy.endpoint

    def snapshot(self) -> dict[str, Any]:
        time.sleep(0.6)  # the meter replaces its file twice a second
        got: dict[str, Any] = json.loads(Path(self.meter_file).read_text())
        got["trace_at"] = os.path.getsize(self.trace) if os.path.exists(self.trace) else 0
        return got

    def service(self, start: int, end: int) -> dict[str, Any]:
        return trace_service(self.trace, start, end)


def trace_service(path: str, start: int, end: int) -> dict[str, Any]:
    """From a proxy's trace between two offsets: the backend's time per request (sent
    upstream to answered) by operation, median and p99 in ms, and the median of its whole
    time in the proxy (arrived to answered: the delays, the backend, the proxy's own
    overshoot), and how many requests came
    on a new connection (each paid its modelled handshakes), and the answers other than 200
    by operation and status (a refused condition is a 400)."""
    by: dict[str, list[float]] = {}
    span: dict[str, list[float]] = {}  # in the proxy: arrived to answered, delays included
    writes: list[tuple[float, float]] = []  # UpdateItems at the backend: (sent, answered)
    pages: list[tuple[float, float]] = []  # available-index Queries at the backend
    seen: set[int] = set()
    fresh, at = 0, 0
    failed: Counter[str] = Counter()
    with open(path, "rb") as f:
        for line in f.read(end).splitlines(keepends=True):
            at += len(line)
            try:
                t = json.loads(line)
            except ValueError:
                continue  # a line being written as the snapshot was taken
            first = t["conn"] not in seen
            seen.add(t["conn"])
            if at <= start:
                continue
            fresh += first
            op = t["op"] + (f" {t['index']}" if t["index"] else "")
            by.setdefault(op, []).append((t["back"] - t["up"]) * 1e3)
            span.setdefault(op, []).append((t["out"] - t["in"]) * 1e3)
            if op == "UpdateItem":
                writes.append((t["up"], t["back"]))
            elif op == "Query available_resources":
                pages.append((t["up"], t["back"]))
            if t["status"] != "200":
                failed[f"{op} {t['status']}"] += 1
    ops = {
        op: {
            "n": len(xs),
            "p50_ms": pct(sorted(xs), 0.5),
            "p99_ms": pct(sorted(xs), 0.99),
            "span_p50_ms": pct(sorted(span[op]), 0.5),
        }
        for op, xs in sorted(by.items())
    }
    return {
        "ops": ops,
        "new_connections": fresh,
        "not_200": dict(failed),
        "writes_meeting_a_page": _meeting(writes, pages),
    }


def _meeting(writes: list[tuple[float, float]], pages: list[tuple[float, float]]) -> dict[str, Any]:
    """The writes whose time at the backend overlapped an available-index page's (a refill
    served among them), and the backend time, p50 in ms, of those and of the others."""
    pages.sort()
    starts = [a for a, _ in pages]
    longest = max((b - a for a, b in pages), default=0.0)
    met: list[float] = []
    rest: list[float] = []
    for up, back in writes:
        lo = bisect.bisect_left(starts, up - longest)
        hit = any(a < back and b > up for a, b in pages[lo : bisect.bisect_right(starts, back)])
        (met if hit else rest).append((back - up) * 1e3)
    return {
        "writes": len(met),
        "of": len(writes),
        "p50_ms": pct(sorted(met), 0.5) if met else None,
        "others_p50_ms": pct(sorted(rest), 0.5) if rest else None,
    }


def _daemons_cpu(ds: list[Daemon]) -> float:
    return sum(sum(cpu_split(d.pid)) for d in ds)


def _daemons_counters(ds: list[Daemon]) -> Counter[str]:
    total: Counter[str] = Counter()
    for d in ds:
        total.update(daemons.counters(d.socket))
    return total


def run_level(
    p: Params, level: Level, rasd: Side, paper: Side, ds: list[Daemon], tmp: str, tag: str
) -> dict[str, Any]:
    ev_r = schedule(p, level, p.hosts, tag)
    ev_p = [e for e in ev_r if e[1] < p.paper_hosts]
    # spawn, not fork: this process runs threads (the liberators, boto3's) a fork would copy
    ctx = mp.get_context("spawn")
    out_r, out_p = os.path.join(tmp, "rasd.calls"), os.path.join(tmp, "paper.calls")
    apps = [
        ctx.Process(target=_rasd_app, args=([d.socket for d in ds], ev_r, p, out_r)),
        ctx.Process(target=_paper_app, args=(paper.endpoint, paper.table, ev_p, p, out_p)),
    ]
    t0 = time.monotonic()
    for proc in apps:
        proc.start()
    time.sleep(max(0.0, p.warm_s - 0.6))
    m0 = (rasd.snapshot(), paper.snapshot())
    cpu0, n0 = _daemons_cpu(ds), _daemons_counters(ds)
    time.sleep(max(0.0, t0 + p.warm_s + p.measure_s - time.monotonic() - 0.6))
    m1 = (rasd.snapshot(), paper.snapshot())
    cpu1, n1 = _daemons_cpu(ds), _daemons_counters(ds)
    for proc in apps:
        proc.join(120)
    got: dict[str, Any] = {"level": level.name, "new_every_s": level.new_every_s}
    got["share"] = level.share
    for side, path, (a, b) in (("rasd", out_r, (m0[0], m1[0])), ("paper", out_p, (m0[1], m1[1]))):
        calls = [Call(**c) for c in json.loads(Path(path).read_text())]
        fig = _figures(calls, p)
        kinds = meter.window(a, b)
        bill = meter.bill(kinds)
        per = 1000 / max(1, fig["calls"])
        fig["capacity_per_1000"] = {k: v * per for k, v in bill.items()}
        fig["jobs"] = meter.bill(
            {k: t for k, t in kinds.items() if k.startswith("job: ")}, jobs=True
        )
        fig["kinds"] = {k: {f: round(v, 2) for f, v in t.items()} for k, t in sorted(kinds.items())}
        writes = [
            t for k, t in kinds.items() if "refused" not in k and k.split()[0] in meter.WRITES
        ]
        fig["backend"] = (rasd if side == "rasd" else paper).service(a["trace_at"], b["trace_at"])
        fig["meter_check"] = {
            "base_write_units": sum(t["wru"] for t in writes),
            "backend_base_write_units": sum(t["backend"] for t in writes),
        }
        got[side] = fig
    got["rasd"]["daemon_cpu_ms_per_call"] = (cpu1 - cpu0) * 1e3 / max(1, got["rasd"]["calls"])
    got["rasd"]["counters"] = dict(sorted((n1 - n0).items()))  # the daemons', measured window
    return got


def run_phase(
    env: Env,
    p: Params,
    levels: list[Level],
    rollout: bool,
    tmp: str,
    mode: str = "",
    settings: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``levels`` on fresh tables and fresh daemons (``settings``: theirs), labelled ``mode``."""
    mode = mode or ("rollout" if rollout else "fast")
    tag = mode.replace(" ", "")
    rasd = Side(env, f"r{tag}", p.items, rollout, tmp, p.free_since_s)
    paper = Side(env, f"p{tag}", p.items, False, tmp, p.free_since_s)
    env.endpoint = rasd.endpoint  # the daemons' DynamoDB: rasd's metered proxy
    ds = env.start_daemons(rasd.table, p.hosts, prefix=f"{tag}-", **(settings or {}))
    stop = threading.Event()
    lib = threading.Thread(
        target=_liberate_forever,
        args=((rasd.endpoint, rasd.table), (paper.endpoint, paper.table), p.liberate_s, stop),
        daemon=True,
    )
    lib.start()
    out = []
    try:
        for i, level in enumerate(levels):
            got = run_level(p, level, rasd, paper, ds, tmp, f"{tag}{i}")
            got["mode"] = mode
            print(json.dumps(_line(got)), flush=True)
            out.append(got)
    finally:
        stop.set()
        env.stop_daemons(ds)
        rasd.proxy.stop()
        paper.proxy.stop()
    return out


def _line(got: dict[str, Any]) -> dict[str, Any]:
    r, pp = got["rasd"], got["paper"]
    return {
        "mode": got["mode"],
        "level": got["level"],
        "new_p50_ms": [round(r["new"]["p50_ms"], 1), round(pp["new"]["p50_ms"], 1)],
        "ratio": round(pp["new"]["p50_ms"] / r["new"]["p50_ms"], 2) if r["new"]["n"] else None,
        "weighted_per_1000": [
            round(r["capacity_per_1000"]["weighted"], 1),
            round(pp["capacity_per_1000"]["weighted"], 1),
        ],
        "calls": [r["calls"], pp["calls"]],
        "errors": [r["errors"], pp["errors"]],
    }


# ------------------------------------------------------------------------------- the report
def markdown(res: dict[str, Any]) -> str:
    rows = [
        "| mode | level | new lease p50 / p99 ms, rasd vs paper | ratio (p50) "
        "| existing p50 / p99 ms, rasd vs paper "
        "| capacity per 1,000 calls (RRU + 5 x WRU), rasd vs paper | ratio | new share seen "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for g in res["levels"]:
        r, pp = g["rasd"], g["paper"]
        ratio = pp["new"]["p50_ms"] / r["new"]["p50_ms"] if r["new"]["n"] else math.nan
        cost = r["capacity_per_1000"]["weighted"] / max(1e-9, pp["capacity_per_1000"]["weighted"])
        rows.append(
            f"| {g['mode']} | {g['level']} "
            f"| {r['new']['p50_ms']:.1f} / {r['new']['p99_ms']:.1f} vs "
            f"{pp['new']['p50_ms']:.1f} / {pp['new']['p99_ms']:.1f} | {ratio:.2f}x "
            f"| {r['existing']['p50_ms']:.2f} / {r['existing']['p99_ms']:.1f} vs "
            f"{pp['existing']['p50_ms']:.1f} / {pp['existing']['p99_ms']:.1f} "
            f"| {r['capacity_per_1000']['weighted']:.0f} vs "
            f"{pp['capacity_per_1000']['weighted']:.0f} "
            f"| {cost:.2f}x | {r['new_share']:.1%} / {pp['new_share']:.1%} "
            f"| {sum(r['errors'].values())} / {sum(pp['errors'].values())} |"
        )
    return "\n".join(rows)


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(
        (g for g in res["levels"] if g["mode"] == "fast" and g["new_every_s"] == 10),
        key=lambda g: g["share"],
    )
    roll = [g for g in res["levels"] if g["mode"] == "rollout"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for side, style in (("rasd", "o-"), ("paper", "s--")):
        xs = [g["share"] * 100 for g in pts]
        ax1.plot(xs, [g[side]["capacity_per_1000"]["weighted"] for g in pts], style, label=side)
        ax2.plot(xs, [g[side]["new"]["p50_ms"] for g in pts], style, label=f"{side} new p50")
    for g in roll:
        x = [g["share"] * 100]
        ax1.plot(x, [g["rasd"]["capacity_per_1000"]["weighted"]], "^", label="rasd, rollout mode")
        ax2.plot(x, [g["rasd"]["new"]["p50_ms"]], "^", label="rasd, rollout mode")
    ax1.set_xlabel("new keys, % of calls")
    ax1.set_ylabel("capacity per 1,000 calls (RRU + 5 WRU)")
    ax2.set_xlabel("new keys, % of calls")
    ax2.set_ylabel("new lease p50, ms")
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"{res['params']['hosts']} hosts, a new key every 10 s per host")
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=Params.hosts)
    ap.add_argument("--measure", type=float, default=Params.measure_s, help="seconds per level")
    ap.add_argument("--warm", type=float, default=Params.warm_s)
    ap.add_argument("--quick", action="store_true", help="one level per mode, short (a smoke test)")
    ap.add_argument("--backend", default="dynalite", choices=("dynalite", "moto"))
    ap.add_argument(
        "--phases", default="fast,rollout,levers",
        help="which phases to run, comma-separated (default: all three)",
    )  # fmt: skip
    ap.add_argument(
        "--levels", metavar="N:SHARE,...",
        help="the fast phase's levels instead of the default (a new key every N s per host, "
        "SHARE of the calls new), e.g. 10:0.03,60:0.03",
    )  # fmt: skip
    ap.add_argument(
        "--free-since", type=float, default=Params.free_since_s,
        help="seconds the pools' items have sat free when a phase begins (0: a pool seeded "
        "as the run begins)",
    )  # fmt: skip
    a = ap.parse_args(argv)
    p = Params(hosts=a.hosts, measure_s=a.measure, warm_s=a.warm, free_since_s=a.free_since)
    if a.levels:
        p.levels = [
            Level(float(n), float(sh)) for n, sh in (x.split(":") for x in a.levels.split(","))
        ]
    if a.quick:
        p.levels, p.rollout_levels = [Level(2, 0.1)], [Level(2, 0.1)]
        p.lever_levels = [Level(2, 0.1)]
        p.items, p.hot_keys, p.rollout_warm_s = 1000, 50, p.warm_s
    os.environ.update({k: v for k, v in aws_env().items() if k.startswith("AWS_")})
    if a.backend == "dynalite" and dynalite_status() is not None:
        install_dynalite()  # npm, into bench/node_modules
    env = Env(a.backend, p.delay_ms)
    started = time.time()
    res: dict[str, Any] = {"params": asdict(p), "backend": a.backend, "levels": []}
    try:
        phases = set(a.phases.split(","))
        if "fast" in phases:
            res["levels"] += run_phase(env, p, p.levels, False, env.tmp)
        if "rollout" in phases:
            warm = replace(p, warm_s=p.rollout_warm_s)
            res["levels"] += run_phase(env, warm, p.rollout_levels, True, env.tmp)
        for lever, (off, by_demand) in LEVERS.items() if "levers" in phases else ():
            mode = f"fast without {lever}"
            levels = p.lever_levels if by_demand else p.lever_levels[:1]
            res["levels"] += run_phase(env, p, levels, False, env.tmp, mode, off)
    finally:
        env.close()
    res["wall_s"] = time.time() - started
    res["load"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"{stamp}-fleet{'-quick' if a.quick else ''}.json"
    out.write_text(json.dumps(res, indent=1))
    plot(res, out.with_suffix(".png"))
    table = markdown(res)
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"results: {out} (and .md, .png); {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

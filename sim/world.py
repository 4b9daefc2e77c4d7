"""One run of the global simulation: three moto backends (one per region), the replicator, real
``rasd serve`` daemons, the jobs, a traffic driver and a sampler; then the end-of-run checks
(replicas converged, duplicates before and after one ``ras-dedupe`` run).

Every child is a separate process (moto's server and the daemons are CPU-bound Python; the
GIL would otherwise serialise them). Real time is compressed: the simulated UTC day lasts
``day_s`` real seconds and leases last ``lease_s`` real seconds (about one simulated hour).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from fleet import procs, tables
from fleet import replicator as fleet_replicator
from fleet.backends import Moto
from fleet.daemons import counters, start_daemon, wait_ready
from rasd.config import Config
from rasd.core.builders import miss_report_update
from rasd.core.lease import LIVE, PENDING, US, fmt_time, map_pk, parse_time
from rasd.core.serialize import mapping_from_ddb

from . import capacity, replicator, traffic

CLIENT, POOL = "sim", "default"
#: the daemons' ``skew_margin``: a lease read with less than this left is not served
SKEW_MARGIN_S = 0.5
#: the daemons' ``exhausted_backoff``: how long an empty sweep answers for later requests,
#: so the window in which a NO_CAPACITY may have been decided (``sim.capacity``)
EXHAUSTED_BACKOFF_S = 0.25
#: the end-of-run probe's keys (:meth:`World.probe`): not part of the day's figures
PROBE = "probe-"


@dataclass
class Params:
    """Everything one run depends on (both runs of a comparison share all but ``balancer``)."""

    seed: int = 1
    lag_s: float = 1.0
    day_s: float = 90.0  # real seconds per simulated day
    lease_s: float = 4.0  # real seconds per lease (about one simulated hour at day_s=90)
    keys_per_s: float = 6.0  # new keys per real second at relative demand 1.0
    p_global: float = 0.3
    gap_mean_s: float = 60.0
    capacity_factor: float = 1.25  # resources = factor x the most leases the traffic needs
    liberate_every_s: float = 0.5
    balance_every_s: float = 2.0
    horizon_s: float | None = None  # default 2 x balance_every_s
    daemons_per_region: int = 1
    sample_every_s: float = 1.0
    probe_keys: int = 10  # keys requested in all regions at once at the end (dedupe check)
    balancer: bool = True
    resources: int | None = None  # default: from the traffic (capacity_factor)
    table: str = "rasd-sim"


@dataclass
class Outcome:
    t: float
    region: str
    key: str
    first: bool
    gap: float
    code: str  # "OK" or the error code
    new: bool = False
    resource: str | None = None
    latency_ms: float = 0.0
    #: monotonic seconds when the request was sent and answered (the sampler's clock)
    sent: float = 0.0
    done: float = 0.0
    pool: str = "default"
    #: monotonic seconds when the answered lease ends (0: not answered), from its
    #: ``lease_expires``: another region's lease answered ends when that one does
    ends: float = 0.0


@dataclass
class RunResult:
    params: dict[str, Any]
    resources: int
    initial_split: dict[str, int]
    outcomes: list[Outcome] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    #: the sampler's claimable items (not written out: see capacity.no_capacity_while_claimable)
    claimable: list[capacity.ClaimableSample] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    audit: list[dict[str, Any]] = field(default_factory=list)
    replicator: dict[str, Any] = field(default_factory=dict)
    daemon_stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    end: dict[str, Any] = field(default_factory=dict)
    miss_reporter: str = "daemon"
    wall_s: float = 0.0


def daemon_reports_misses() -> bool:
    """Whether this checkout's daemon writes ``misses#`` counters (config setting
    ``miss_report_interval``). If not, the simulation's driver writes them for it, from the
    NO_CAPACITY answers it receives, with the same UpdateItem (balance_model)."""
    return "miss_report_interval" in Config.__dataclass_fields__


# --------------------------------------------------------------------------------- a run
class World:
    def __init__(self, p: Params, scn: traffic.Scenario, workdir: Path) -> None:
        self.p = p
        self.scn = scn
        self.regions = list(scn.names)
        self.dir = workdir
        self.children: list[subprocess.Popen[Any]] = []
        self.daemons: list[subprocess.Popen[Any]] = []
        self._sock_dir: Path | None = None
        self.endpoints: dict[str, str] = {}
        self.sockets: dict[str, list[str]] = {}
        self.env = procs.child_env()

    # -- set-up
    def start_backends(self) -> None:
        """One moto server per region (its replica), all started at once; they stop when
        their stdin closes."""
        motos = {
            r: Moto(
                self.env,
                stderr=subprocess.DEVNULL,
                wait=False,
                fast=True,
                count_file=str(self.dir / f"moto-{r}.requests.json"),
            )
            for r in self.regions
        }
        self.children += [moto.proc for moto in motos.values()]
        for r, moto in motos.items():
            self.endpoints[r] = moto.ready().endpoint

    def seed(self, split: dict[str, int]) -> None:
        """The same items in every replica (a global table's state): the pool, and the
        resources with their initial regions, with identical timestamps."""
        now = time.time_ns() // 1000
        names = resource_names(split, "res-")
        for r, url in self.endpoints.items():
            tables.seed_table(tables.client(url, r), self.p.table, CLIENT, POOL, names, now_us=now)
        self.seed_more(split, now)
        home = self.regions[0]
        tables.client(self.endpoints[home], home, "s3").create_bucket(Bucket="sim-balancer")

    def seed_more(self, split: dict[str, int], now_us: int) -> None:
        """More pools beside ``sim/default`` (none here)."""

    def pool_of(self, key: str) -> str:
        """The pool a key's requests ask (one pool here)."""
        return POOL

    def region_env(self, region: str) -> dict[str, str]:
        """Settings of ``region``'s daemons beside the common ones (none here)."""
        return {}

    def start_replicator(self) -> subprocess.Popen[str]:
        cmd = replicator.command(
            self.endpoints, self.p.table, self.p.lag_s, str(self.dir / "audit.jsonl")
        )
        proc = fleet_replicator.start_replicator(cmd, self.env, self.dir / "replicator.log")
        self.children.append(proc)
        return proc

    def start_daemons(self) -> None:
        env = dict(self.env)
        env.update(
            {
                "RASD_SKEW_MARGIN": str(SKEW_MARGIN_S),
                "RASD_EXHAUSTED_BACKOFF": str(EXHAUSTED_BACKOFF_S),
                "RASD_DDB_WARM_CONNECTIONS": "1",
                # compressed time: a pending mapping is left to its acquirer for 1 s, not 2
                "RASD_PENDING_HOLD": "1.0",
            }
        )
        if daemon_reports_misses():
            env["RASD_MISS_REPORT_INTERVAL"] = "0.5"
        sock_dir = Path(tempfile.mkdtemp(prefix="rasd-sim-"))
        self._sock_dir = sock_dir
        started: list[tuple[str, subprocess.Popen[bytes]]] = []
        for r in self.regions:
            self.sockets[r] = []
            for i in range(self.p.daemons_per_region):
                sock = str(sock_dir / f"{r}-{i}.sock")
                log = self.dir / f"rasd-{r}-{i}.log"
                renv = env | self.region_env(r)
                proc = start_daemon(sock, self.p.table, r, self.endpoints[r], renv, log)
                self.children.append(proc)
                self.daemons.append(proc)
                self.sockets[r].append(sock)
                started.append((sock, proc))
        # every daemon answering (it may still be starting), all within a minute
        deadline = time.monotonic() + 60
        for sock, proc in started:
            if not wait_ready(sock, proc, deadline - time.monotonic(), ready=False):
                raise RuntimeError(f"daemon {sock} did not start")

    def start_jobs(self) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "sim.jobs", "--table", self.p.table]
        cmd += ["--out", str(self.dir / "jobs.jsonl")]
        cmd += ["--liberate-every", str(self.p.liberate_every_s)]
        cmd += ["--balance-every", str(self.p.balance_every_s)]
        if self.p.horizon_s:
            cmd += ["--horizon", str(self.p.horizon_s)]
        if not self.p.balancer:
            cmd += ["--no-balancer"]
        for r, u in self.endpoints.items():
            cmd += ["--endpoint", f"{r}={u}"]
        with open(self.dir / "jobs.log", "a") as log:
            proc: subprocess.Popen[str] = procs.popen(
                cmd, self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                text=True,
            )  # fmt: skip
        self.children.append(proc)
        return proc

    def stop_all(self) -> None:
        """Daemons get SIGTERM (they drain and exit); the other children stop when their
        stdin closes. All are signalled first, then waited for."""
        for proc in self.children:
            if proc.poll() is None:
                with contextlib.suppress(OSError, ValueError):
                    if proc.stdin:
                        proc.stdin.close()
                if proc in self.daemons:
                    proc.terminate()
        for proc in reversed(self.children):
            if proc.poll() is None:
                procs.stop(proc, 10)
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)

    # -- reading the replicas
    def resource_items(self, region: str, sampled: bool = False) -> dict[str, dict[str, Any]]:
        """The pool's resource items in ``region``'s replica: one strongly consistent Query
        of their partition (a Scan would walk every mapping and meta item too, once a second
        per replica, and slow the backend the daemons use). ``sampled``: only what the
        sampler reads (``region``, ``key``, ``version``, ``lease_available``; the others are
        None), which halves what boto3 parses, three times a second."""
        only: dict[str, Any] = {}
        if sampled:
            only = {
                "ProjectionExpression": "#r, #g, #k, version, lease_available",
                "ExpressionAttributeNames": {"#r": "resource", "#g": "region", "#k": "key"},
            }
        out: dict[str, dict[str, Any]] = {}
        for it in tables.items(
            self._ddb(region),
            "query",
            TableName=self.p.table,
            ConsistentRead=True,
            KeyConditionExpression="client_id = :c",
            ExpressionAttributeValues={":c": {"S": CLIENT}},
            **only,
        ):
            out[it["resource"]["S"]] = {
                "region": it.get("region", {}).get("S"),
                "key": it.get("key", {}).get("S"),
                "version": int(it.get("version", {}).get("N", "0")),
                "pool_id": it.get("pool_id", {}).get("S"),
                "lease_acquired": it.get("lease_acquired", {}).get("S"),
                "lease_expires": it.get("lease_expires", {}).get("S"),
                "holder": it.get("holder", {}).get("S"),
                "lease_available": it.get("lease_available", {}).get("S"),
            }
        return out

    def leases_by_mapping(
        self, region: str, items: dict[str, dict[str, Any]]
    ) -> dict[str, list[str]]:
        """key -> the resources its mapping items name (one per region at most) in this
        replica, counting only mappings whose claim holds (the resource is held by the
        mapping's token): the leases as daemons see them (docs/design.md)."""
        out: dict[str, list[str]] = {}
        for raw in tables.scan(
            self._ddb(region),
            self.p.table,
            FilterExpression="begins_with(client_id, :m)",
            ExpressionAttributeValues={":m": {"S": map_pk(CLIENT, POOL, "")}},
        ):
            m = mapping_from_ddb(raw)
            if m.state not in (PENDING, LIVE) or m.resource is None:
                continue
            it = items.get(m.resource)
            if it and it["holder"] == m.token and it["key"] == m.key:
                out.setdefault(m.key, []).append(m.resource)
        return out

    def duplicate_keys(self, items: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
        by_key: dict[str, list[str]] = {}
        for res, it in items.items():
            if it["key"] is not None:
                by_key.setdefault(it["key"], []).append(res)
        return {k: v for k, v in by_key.items() if len(v) > 1}

    def settle(self, rep: subprocess.Popen[str], quiet_s: float) -> None:
        """Wait until the replicator has had nothing to do for ``quiet_s`` seconds."""
        replicator.settle(rep, quiet_s)

    # -- the run
    def run(self, sched: traffic.Schedule, split: dict[str, int]) -> RunResult:
        t_wall = time.monotonic()
        res = RunResult(
            params=asdict(self.p), resources=sum(split.values()), initial_split=dict(split)
        )
        res.miss_reporter = "daemon" if daemon_reports_misses() else "sim-driver"
        try:
            self.start_backends()
            self.seed(split)
            rep = self.start_replicator()
            self.start_daemons()
            jobs = self.start_jobs()
            sampler = Sampler(self, self.p.sample_every_s)
            sampler.start()
            res.outcomes, res.end["probe"] = asyncio.run(
                self.drive_and_probe(sched, res.miss_reporter == "sim-driver")
            )
            sampler.stop()
            res.samples = sampler.rows
            res.claimable = sampler.claimable
            wrong = capacity.no_capacity_while_claimable(
                res.outcomes, res.claimable, EXHAUSTED_BACKOFF_S
            )
            res.end["no_capacity_while_claimable"] = len(wrong)
            res.end["no_capacity_while_claimable_examples"] = wrong[:5]
            procs.stop(jobs, 30)
            res.jobs = _read_jsonl(self.dir / "jobs.jsonl")
            res.daemon_stats = self.daemon_stats()
            self.settle(rep, max(1.0, self.p.lag_s + 0.5))
            res.end |= self.check_and_dedupe(rep)
            out = fleet_replicator.stop_replicator(rep, 30)
            res.replicator = procs.summary_line(out or "") or {}
            res.audit = _read_jsonl(self.dir / "audit.jsonl")
        finally:
            self.stop_all()
        # what each backend served, per operation, over the whole run (set-up included)
        res.end["backend_requests"] = {
            r: json.loads(f.read_text())
            for r in self.regions
            if (f := self.dir / f"moto-{r}.requests.json").exists()
        }
        res.wall_s = round(time.monotonic() - t_wall, 1)
        return res

    def daemon_stats(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r, socks in self.sockets.items():
            total: Counter[str] = Counter()
            for s in socks:
                c = counters(s)
                total.update({k: v for k, v in c.items() if isinstance(v, int)})
            keep = ("lease.no_capacity", "err.NO_CAPACITY", "lease.new", "req.total")
            out[r] = {k: total[k] for k in keep if k in total} | {
                k: v
                for k, v in total.items()
                if k.startswith(("lease.", "err.", "misses.", "strict."))
            }
        return out

    def run_dedupe(self) -> dict[str, Any]:
        """``ras-dedupe`` once, as Jenkins would: the CLI, in the first region, with the
        other regions' replicas as peers (their extras are released there)."""
        home = self.regions[0]
        cmd = [sys.executable, "-m", "rasd_jobs.dedupe", "--table", self.p.table]
        cmd += ["--region", home, "--endpoint-url", self.endpoints[home], "--log-level", "warning"]
        for r in self.regions[1:]:
            cmd += ["--peer-endpoint", f"{r}={self.endpoints[r]}"]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        try:
            dedupe: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            dedupe = {"error": proc.stderr[-500:]}
        dedupe["exit"] = proc.returncode
        return dedupe

    def check_and_dedupe(self, rep: subprocess.Popen[str]) -> dict[str, Any]:
        views = {r: self.resource_items(r) for r in self.regions}
        home = self.regions[0]
        first = views[home]
        converged = all(v == first for v in views.values())
        dups_before = self.duplicate_keys(first)
        by_map = self.leases_by_mapping(home, first)
        dedupe = self.run_dedupe()
        self.settle(rep, max(1.0, self.p.lag_s + 0.5))
        views2 = {r: self.resource_items(r) for r in self.regions}
        first2 = views2[home]
        left = self.duplicate_keys(first2)
        by_map2 = self.leases_by_mapping(home, first2)
        named2 = {r for v in by_map2.values() for r in v}
        out: dict[str, Any] = {
            "converged_before_dedupe": converged,
            "duplicate_keys_before_dedupe": len(dups_before),
            "dedupe": dedupe,
            "duplicate_keys_after_dedupe": {
                r: len(self.duplicate_keys(v)) for r, v in views2.items()
            },
            "converged_after_dedupe": all(v == first2 for v in views2.values()),
            # the same, counted as the daemons see leases (mapping items naming held claims);
            # the figures above count held resource items (what ras-dedupe groups), which
            # also include claims no mapping names (orphans)
            "duplicate_keys_by_mapping_before_dedupe": sum(
                1 for v in by_map.values() if len(v) > 1
            ),
            "duplicate_keys_by_mapping_after_dedupe": sum(
                1 for v in by_map2.values() if len(v) > 1
            ),
            "held_items_no_mapping_names_end": sum(
                1 for r, it in first2.items() if it["key"] is not None and r not in named2
            ),
            "items_per_region_end": dict(Counter(it["region"] for it in first2.values())),
        }
        # every duplicate one dedupe left, with why: kept on purpose (its survivor does not
        # outlast it by what dedupe requires), or not explained (should have been released)
        need_s = Config().skew_margin + Config().max_clock_skew
        out["left_explained"] = [
            {"key": k, **row}
            for k, v in sorted(left.items())
            for row in explain_left({r: first2[r] for r in v}, need_s)
        ]
        if left:  # keep what is needed to understand it, and see whether a second run helps
            out["left_after_dedupe"] = {k: {r: first2[r] for r in v} for k, v in left.items()}
            out["left_before_dedupe"] = {
                k: {r: first[r] for r in v} for k, v in dups_before.items() if k in left
            }
            out["dedupe_second_run"] = self.run_dedupe()
            self.settle(rep, max(1.0, self.p.lag_s + 0.5))
            out["duplicate_keys_after_second_dedupe"] = len(
                self.duplicate_keys(self.resource_items(home))
            )
        return out

    async def drive_and_probe(
        self, sched: traffic.Schedule, report_misses: bool
    ) -> tuple[list[Outcome], dict[str, Any]]:
        from rasd_client import aio

        outcomes = await self.drive(sched, report_misses)
        probe = await self.probe()
        await aio.close()
        await asyncio.sleep(0.05)  # let the connections' reader tasks finish
        return outcomes, probe

    async def drive(self, sched: traffic.Schedule, report_misses: bool) -> list[Outcome]:
        """Replay the schedule against the daemons (rasd_client.aio, one connection per
        daemon); a region with several daemons spreads its requests round robin."""
        from rasd_client import RasdError, aio

        outcomes: list[Outcome] = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        rr: Counter[str] = Counter()
        misses: Counter[str] = Counter()

        async def one(req: traffic.Request) -> None:
            socks = self.sockets[req.region]
            sock = socks[rr[req.region] % len(socks)]
            rr[req.region] += 1
            t0 = time.perf_counter()
            o = Outcome(req.t, req.region, req.key, req.first, req.gap, "OK")
            o.pool = self.pool_of(req.key)
            o.sent = time.monotonic()
            try:
                lease = await aio.get_lease(
                    CLIENT,
                    o.pool,
                    req.key,
                    timedelta(seconds=self.p.lease_s),
                    timeout=2.0,
                    socket_path=sock,
                )
                o.new, o.resource = lease.new, lease.resource
                o.ends = time.monotonic() + lease.lease_expires.timestamp() - time.time()
            except RasdError as exc:
                o.code = exc.code
                if exc.code == "NO_CAPACITY":
                    misses[req.region] += 1
            o.latency_ms = round((time.perf_counter() - t0) * 1000, 2)
            o.done = time.monotonic()
            outcomes.append(o)

        reporter = None
        if report_misses:
            reporter = asyncio.create_task(self._report_misses(misses))
        tasks = []
        for req in sched.requests:
            delay = start + req.t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(req)))
        await asyncio.gather(*tasks)
        if reporter:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            await self._flush_misses(misses)
        return sorted(outcomes, key=lambda o: o.t)

    async def _report_misses(self, misses: Counter[str]) -> None:
        while True:
            await asyncio.sleep(0.5)
            await self._flush_misses(misses)

    async def _flush_misses(self, misses: Counter[str]) -> None:
        sent = getattr(self, "_sent", Counter())
        self._sent = sent
        loop = asyncio.get_running_loop()
        for r in self.regions:
            n = misses[r] - sent[r]
            if n <= 0:
                continue
            sent[r] += n
            kw = miss_report_update(CLIENT, POOL, r, "sim-driver", n, time.time_ns() // 1000)
            ddb = self._ddb(r)
            await loop.run_in_executor(
                None, functools.partial(ddb.update_item, TableName=self.p.table, **kw)
            )

    def _ddb(self, r: str) -> Any:
        cache: dict[str, Any] | None = getattr(self, "_ddbs", None)
        if cache is None:
            cache = {}
            self._ddbs = cache
        if r not in cache:
            cache[r] = tables.client(self.endpoints[r], r)
        return cache[r]

    async def probe(self) -> dict[str, Any]:
        """``probe_keys`` keys requested in every region within the replication lag (a global
        experiment launched everywhere at once), so that the end-of-run dedupe check has
        duplicates of both kinds to decide:

        * **staggered** (the first half): the first region asks first, for 120 s; the others
          ``stagger`` later, for 60 s. The first region's lease is usually the survivor
          (the earliest acquisition: not when its request was slower than the stagger) and
          then outlasts the extras by a minute: one ``ras-dedupe`` releases them.
        * **together** (the rest): every region at the same instant, for 120 s. The survivor
          ends within milliseconds of its extras, and ``ras-dedupe`` keeps an extra until its
          survivor outlasts it (releasing it would make its region acquire a third resource
          while apps still use the extra): kept on purpose, each explained in the report."""
        from rasd_client import RasdError, aio

        got: Counter[str] = Counter()

        async def one(key: str, region: str, lease_s: float, delay: float = 0.0) -> None:
            if delay:
                await asyncio.sleep(delay)
            try:
                lease = await aio.get_lease(
                    CLIENT,
                    POOL,
                    key,
                    timedelta(seconds=lease_s),
                    timeout=2.0,
                    socket_path=self.sockets[region][0],
                )
                got["new" if lease.new else "existing"] += 1
            except RasdError as exc:
                got[exc.code] += 1

        n = self.p.probe_keys
        staggered = [f"{PROBE}{self.p.seed}-s{i}" for i in range(n // 2)]
        together = [f"{PROBE}{self.p.seed}-t{i}" for i in range(n - n // 2)]
        stagger = min(0.2, self.p.lag_s / 4)
        first, rest = self.regions[0], self.regions[1:]
        calls = [one(k, first, 120.0) for k in staggered]
        calls += [one(k, r, 60.0, stagger) for k in staggered for r in rest]
        calls += [one(k, r, 120.0) for k in together for r in self.regions]
        await asyncio.gather(*calls)
        return {
            "keys": n,
            "staggered": staggered,
            "together": together,
            "requests": n * len(self.regions),
            **dict(got),
        }


class Sampler:
    """Every ``every`` seconds: per region, items assigned to it, items leased and items
    claimable (free, out of quarantine), read in that region's own replica (a consistent
    Scan: the tables are small). The claimable items, with their versions and the scan's
    monotonic start and end, are kept for ``capacity.no_capacity_while_claimable``."""

    def __init__(self, world: World, every: float) -> None:
        self.world = world
        self.every = every
        self.rows: list[dict[str, Any]] = []
        self.claimable: list[capacity.ClaimableSample] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self._t.start()

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic() - self.t0
            row: dict[str, Any] = {"t": round(t, 2)}
            for r in self.world.regions:
                start = time.monotonic()
                now = fmt_time(time.time_ns() // 1000)
                try:
                    items = self.world.resource_items(r, sampled=True)
                except Exception:  # noqa: BLE001 - a missed sample is a gap in the plot
                    continue
                mine = {n: it for n, it in items.items() if it["region"] == r}
                free = frozenset(
                    (n, it["version"])
                    for n, it in mine.items()
                    if not it["key"] and it["lease_available"] and it["lease_available"] <= now
                )
                self.claimable.append(capacity.ClaimableSample(r, start, time.monotonic(), free))
                row[r] = {
                    "items": len(mine),
                    "leased": sum(1 for it in mine.values() if it["key"]),
                    "claimable": len(free),
                }
            self.rows.append(row)
            self._stop.wait(max(0.0, self.every - (time.monotonic() - self.t0 - t)))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


# ------------------------------------------------------------------------------ helpers
def explain_left(items: dict[str, dict[str, Any]], need_s: float) -> list[dict[str, Any]]:
    """Why ``ras-dedupe`` left one key's held ``items`` (resource -> item, as
    :meth:`World.resource_items` reads them): the survivor is the earliest acquisition (then
    region, then resource: ``rasd.core.decide.pick``), and dedupe releases an extra only when
    the survivor outlasts it by ``need_s`` (the daemons' skew margin plus the clock-skew
    bound). One row per extra: ``explained`` False means it should have been released."""
    order = sorted(
        items.items(),
        key=lambda kv: (kv[1]["lease_acquired"] or "", kv[1]["region"] or "", kv[0]),
    )
    (sres, surv), extras = order[0], order[1:]
    send = parse_time(surv["lease_expires"]) if surv["lease_expires"] else 0
    rows = []
    for res, it in extras:
        eend = parse_time(it["lease_expires"]) if it["lease_expires"] else 0
        outlasts = round((send - eend) / US, 3)
        rows.append(
            {
                "survivor": sres,
                "survivor_region": surv["region"],
                "extra": res,
                "extra_region": it["region"],
                "survivor_outlasts_s": outlasts,
                "needs_s": need_s,
                "explained": outlasts < need_s,
            }
        )
    return rows


def resource_names(split: dict[str, int], prefix: str) -> dict[str, list[str]]:
    """The names of the resources each region starts with (``split``), numbered in order."""
    names: dict[str, list[str]] = {}
    n = 0
    for r, count in split.items():
        names[r] = [f"{prefix}{i:05d}" for i in range(n, n + count)]
        n += count
    return names


def schedule_of(p: Params, scn: traffic.Scenario) -> traffic.Schedule:
    """The requests of the run ``p`` describes (its seed, day, rate, lease, global keys)."""
    return traffic.schedule(scn, p.seed, p.day_s, p.keys_per_s, p.lease_s, p.p_global, p.gap_mean_s)


def size_pool(sched: traffic.Schedule, p: Params, regions: list[str]) -> tuple[int, dict[str, int]]:
    """Resources and their static equal split: ``capacity_factor`` x the most leases the
    whole traffic holds at once (lease + half a liberator period), rounded up to a multiple
    of the number of regions."""
    if p.resources is not None:
        total = p.resources
    else:
        occ = traffic.occupancy(sched, p.lease_s + p.liberate_every_s / 2, tuple(regions), 0.5)
        peak = max(sum(col) for col in zip(*occ.values(), strict=True))
        total = math.ceil(peak * p.capacity_factor)
    n = len(regions)
    total = math.ceil(total / n) * n
    return total, {r: total // n for r in regions}

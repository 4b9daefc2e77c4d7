"""The chaos run: start everything, break it for ``duration`` seconds, audit what the apps saw.

Layout of one run (all on 127.0.0.1; every child in its own process group)::

    moto (python -m rasd.motoserver, own process)  <── jobs: ras-liberator --all-regions,
      ▲   ▲   ▲   ▲   ▲                                      ras-dedupe per region (direct)
     p0  p1  p2  p3  p4     fault-injecting proxies (threads of this process, chaos.proxy)
      ▲   ▲   ▲   ▲   ▲
     d0  d1  d2  d3  d4     rasd serve, regions us-east-1 / eu-west-1 alternately; one is
      ▲   ▲   ▲   ▲   ▲     kill -9'd every --kill-every seconds and restarted at once
     apps (python -m chaos.app): get_lease/release over --keys keys, history as JSON lines

Sequence: moto, table and pool (resources in both regions), proxies (faults off), daemons
(ready), then faults on, the outage window set, apps, jobs and the killer started; after
``duration`` the apps stop by themselves, everything else is stopped, the table is scanned
directly, and ``chaos.audit`` judges the histories and the table. The result (JSON) goes to
``--results-dir`` as ``<stamp>-<label>.json`` and ``latest-<label>.json``.

Mixed mode (``--mixed``, docs/reliability.md "Mixed fleet"): beside the apps, workers of the
paper's in-process agent (``python -m chaos.paper agent``, half in each region, each through
its own fault-injecting proxy) ask for keys of the same key space, and the paper's liberator
(``python -m chaos.paper liberate --grace``) runs with the other jobs. Their answers go into
the same histories (``agent: "paper"``) and the audit judges the union.

Every loop is bounded by the run's deadline; ``finally`` kills every process group started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config as BotoConfig

import rasd_client
from rasd import schema

from . import audit as A
from .proxy import FaultPlan, FaultProxy, Trace, start_proxies, totals

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
REGIONS = ("us-east-1", "eu-west-1")
CLIENT, POOL = "demo", "default"


@dataclass
class Params:
    duration: float = 75.0  # seconds of traffic
    seed: int = 1
    daemons: int = 5
    apps: int = 6
    keys: int = 60
    resources_per_region: int = 45
    fault_rate: float = 0.05
    outage_at: float | None = None  # seconds into the traffic; default 40 % of the duration
    outage_s: float = 8.0
    kill_every: float = 6.0
    jobs_every: float = 4.0
    liberator_grace: float = 2.0  # ras-liberator refuses less than max_clock_skew (2 s)
    release_rate: float = 0.05
    think_ms: float = 20.0
    call_timeout: float = 2.0
    hold_s: float = 2.5
    label: str = "run"
    table: str = "rasd-chaos"
    results_dir: str = str(RESULTS)
    keep_workdir: bool = False
    #: record the writes reaching DynamoDB through the proxies (work dir's trace.jsonl; kept)
    trace: bool = False
    regions: tuple[str, ...] = REGIONS
    log: bool = True
    #: the mixed fleet: workers of the paper's agent and its liberator beside rasd
    mixed: bool = False
    paper_workers: int = 4  # alternately in each region
    paper_faults: bool = True  # each paper worker behind its own fault-injecting proxy
    #: the paper's liberator frees a lease this long past its end: the runbook's grace,
    #: at least the daemons' max_clock_skew (2 s)
    paper_liberator_grace: float = 2.0

    def outage_offset(self) -> float:
        return self.outage_at if self.outage_at is not None else 0.4 * self.duration


@dataclass
class Daemon:
    index: int
    region: str
    socket: str
    proxy_url: str
    log: str
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    last_start: float = 0.0


@dataclass
class Events:
    kills: list[dict[str, Any]] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)
    jobs: list[dict[str, Any]] = field(default_factory=list)


# ----------------------------------------------------------------------------- processes
def child_env() -> dict[str, str]:
    """Dummy credentials, no real AWS, and AWS_REGION pinned so that daemons and jobs of both
    RAS regions share moto's one us-east-1 table (a global table's stand-in)."""
    env = {
        k: v for k, v in os.environ.items() if not (k.startswith("AWS_") or k.startswith("RASD_"))
    }
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def popen(cmd: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, cwd=str(REPO), start_new_session=True, **kw)


def kill_group(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    """Signal the child's whole process group (it leads one: start_new_session). A child
    already reaped is left alone: its pid, and so its group id, may belong to another now."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def start_moto(env: dict[str, str], timeout: float = 60.0) -> tuple[subprocess.Popen[bytes], str]:
    proc = popen(
        [sys.executable, "-m", "rasd.motoserver"],
        env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.decode(errors="replace").split("\n")[:-1]:  # whole lines only
                if line.startswith("PORT "):
                    return proc, f"http://127.0.0.1:{int(line.split()[1])}"
        if proc.poll() is not None:
            break
    kill_group(proc)
    raise RuntimeError(f"moto did not start: {buf!r}")


def ddb_client(url: str) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BotoConfig(retries={"max_attempts": 8, "mode": "standard"}, read_timeout=30),
    )


def seed_table(ddb: Any, p: Params) -> dict[str, list[str]]:
    schema.create_table(ddb, p.table)
    schema.put_pool(ddb, p.table, CLIENT, POOL, 3600)
    names: dict[str, list[str]] = {}
    for region in p.regions:
        prefix = region.split("-")[0]
        names[region] = [f"{prefix}-{i:04d}" for i in range(p.resources_per_region)]
        schema.add_resources(ddb, p.table, CLIENT, POOL, region, names[region])
    return names


def scan(ddb: Any, table: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kw: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        resp = ddb.scan(**kw)
        items.extend(resp["Items"])
        if "LastEvaluatedKey" not in resp:
            return items
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def start_daemon(d: Daemon, table: str, env: dict[str, str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(d.socket)
    with open(d.log, "ab") as log:
        d.proc = popen(
            [
                sys.executable,
                "-m",
                "rasd",
                "serve",
                "--socket",
                d.socket,
                "--table",
                table,
                "--region",
                d.region,
                "--endpoint-url",
                d.proxy_url,
                "--log-level",
                "warning",
            ],
            env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    d.starts += 1
    d.last_start = time.monotonic()


def wait_ready(d: Daemon, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if d.proc is None or d.proc.poll() is not None:
            return False
        try:
            if rasd_client.call_raw("ping", socket_path=d.socket, timeout=1.0).get("ready"):
                return True
        except rasd_client.RasdError:
            pass
        time.sleep(0.1)
    return False


def daemon_stats(d: Daemon) -> dict[str, int]:
    try:
        c: dict[str, int] = rasd_client.call_raw("stats", socket_path=d.socket, timeout=2.0)[
            "counters"
        ]
        return c
    except (rasd_client.RasdError, KeyError):
        return {}


# ---------------------------------------------------------------------------------- jobs
class Jobs(threading.Thread):
    """ras-liberator (--all-regions) and ras-dedupe (per region) as their CLIs, straight
    against moto, every ``every`` seconds until stopped; one at a time, each bounded."""

    def __init__(self, p: Params, url: str, env: dict[str, str], events: Events) -> None:
        super().__init__(name="chaos-jobs", daemon=True)
        self.p, self.url, self.env, self.events = p, url, env, events
        self.stop_ev = threading.Event()
        self.current: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def commands(self) -> list[list[str]]:
        base = ["--table", self.p.table, "--endpoint-url", self.url, "--log-level", "error"]
        py = sys.executable
        cmds = [
            [py, "-m", "rasd_jobs.liberator", *base, "--region", self.p.regions[0],
             "--all-regions", "--grace", str(self.p.liberator_grace)],
        ]  # fmt: skip
        cmds += [[py, "-m", "rasd_jobs.dedupe", *base, "--region", r] for r in self.p.regions]
        if self.p.mixed:
            cmds.append(
                [py, "-m", "chaos.paper", "liberate", "--table", self.p.table,
                 "--endpoint-url", self.url, "--grace", str(self.p.paper_liberator_grace)]
            )  # fmt: skip
        return cmds

    def run(self) -> None:
        while not self.stop_ev.wait(self.p.jobs_every):
            for cmd in self.commands():
                if self.stop_ev.is_set():
                    return
                self.one(cmd)

    def one(self, cmd: list[str]) -> None:
        t0 = time.time()
        with self.lock:
            if self.stop_ev.is_set():
                return
            proc = popen(cmd, self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            self.current = proc
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out = b""
        finally:
            with self.lock:
                self.current = None
        try:
            summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            summary = {
                "job": "paper_liberator" if cmd[2] == "chaos.paper" else cmd[2].rsplit(".", 1)[-1],
                "region": cmd[cmd.index("--region") + 1] if "--region" in cmd else None,
                "unparsed": out.decode(errors="replace")[-300:],
            }
        summary.update(exit=proc.returncode, t0=round(t0, 3), t1=round(time.time(), 3))
        if self.stop_ev.is_set() and proc.returncode != 0:
            summary["stopped"] = True  # killed by stop(), at the end of the run: no failure
        self.events.jobs.append(summary)

    def stop(self) -> None:
        self.stop_ev.set()
        with self.lock:
            proc = self.current
        kill_group(proc)
        self.join(70)


def jobs_summary(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for j in jobs:
        name = str(j.get("job", "?"))
        if name == "dedupe":
            name = f"dedupe/{j.get('region')}"
        s = out.setdefault(name, Counter())
        s["runs"] += 1
        if j.get("stopped"):
            s["stopped_runs"] += 1
            continue
        s["failed_runs"] += int(j.get("exit") not in (0, None))
        for k in ("freed", "expired", "duplicate_keys", "released", "lost_races", "errors"):
            if isinstance(j.get(k), int):
                s[k] += j[k]
    return {k: dict(v) for k, v in sorted(out.items())}


# ------------------------------------------------------------------------------------ run
def say(p: Params, msg: str) -> None:
    if p.log:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(p: Params) -> dict[str, Any]:
    """One chaos run; returns the result (also written to ``p.results_dir``)."""
    rng = random.Random(f"{p.seed}/run")
    env = child_env()
    work = Path(tempfile.mkdtemp(prefix="rasd-chaos-"))  # short: AF_UNIX paths <= 107 bytes
    moto: subprocess.Popen[bytes] | None = None
    proxies: list[FaultProxy] = []
    daemons: list[Daemon] = []
    apps: list[subprocess.Popen[bytes]] = []
    jobs: Jobs | None = None
    events = Events()
    plan = FaultPlan(rate=p.fault_rate, hold_s=p.hold_s)
    started = time.monotonic()
    try:
        moto, url = start_moto(env)
        ddb = ddb_client(url)
        seed_table(ddb, p)
        say(p, f"moto {url}; table {p.table}; {p.resources_per_region} resources per region")
        paper_proxies = p.paper_workers if p.mixed and p.paper_faults else 0
        trace = Trace(str(work / "trace.jsonl")) if p.trace else None
        proxies = start_proxies(url, p.daemons + paper_proxies, plan, p.seed, trace)
        for i in range(p.daemons):
            daemons.append(
                Daemon(
                    index=i,
                    region=p.regions[i % len(p.regions)],
                    socket=str(work / f"d{i}.sock"),
                    proxy_url=proxies[i].url,
                    log=str(work / f"d{i}.log"),
                )
            )
        for d in daemons:
            start_daemon(d, p.table, env)
        for d in daemons:
            if not wait_ready(d, 60):
                raise RuntimeError(f"daemon {d.index} never became ready; see {d.log}")
        say(p, f"{p.daemons} daemons ready; faults on, {p.apps} apps for {p.duration:.0f}s")

        # -- the traffic phase
        t_start = time.time()
        t_end = t_start + p.duration
        outage = (t_start + p.outage_offset(), t_start + p.outage_offset() + p.outage_s)
        plan.outage = outage if p.outage_s > 0 else None
        plan.enabled = True
        histories = [work / f"app{i}.jsonl" for i in range(p.apps)]
        for i in range(p.apps):
            mine = [daemons[i % p.daemons], daemons[(i + 1) % p.daemons]]
            spec = ",".join(f"{d.index}={d.region}={d.socket}" for d in mine)
            cmd = [
                sys.executable, "-m", "chaos.app", "--app", str(i), "--sockets", spec,
                "--out", str(histories[i]), "--seed", str(p.seed),
                "--keys", str(p.keys), "--until", repr(t_end),
                "--release-rate", str(p.release_rate), "--think-ms", str(p.think_ms),
                "--timeout", str(p.call_timeout),
            ]  # fmt: skip
            with open(work / f"app{i}.err", "ab") as err:
                apps.append(
                    popen(cmd, env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
                )
        if p.mixed:
            for i in range(p.paper_workers):
                histories.append(work / f"paper{i}.jsonl")
                endpoint = proxies[p.daemons + i].url if p.paper_faults else url
                cmd = [
                    sys.executable, "-m", "chaos.paper", "agent", "--app", str(p.apps + i),
                    "--region", p.regions[i % len(p.regions)], "--endpoint-url", endpoint,
                    "--table", p.table, "--out", str(histories[-1]), "--seed", str(p.seed),
                    "--keys", str(p.keys), "--until", repr(t_end),
                    "--think-ms", str(p.think_ms), "--read-timeout", str(p.call_timeout),
                ]  # fmt: skip
                with open(work / f"paper{i}.err", "ab") as err:
                    quiet = subprocess.DEVNULL
                    apps.append(popen(cmd, env, stdin=quiet, stdout=quiet, stderr=err))
        jobs = Jobs(p, url, env, events)
        jobs.start()
        next_kill = time.monotonic() + p.kill_every if p.kill_every > 0 else float("inf")
        hard_stop = time.monotonic() + p.duration + 3 * p.call_timeout + 30
        while time.monotonic() < hard_stop and any(a.poll() is None for a in apps):
            now = time.monotonic()
            if now >= next_kill and time.time() < t_end:
                victim = rng.choice(daemons)
                kill_group(victim.proc)
                events.kills.append(
                    {"t": round(time.time(), 3), "daemon": victim.index, "region": victim.region}
                )
                start_daemon(victim, p.table, env)  # at once, on the same socket path
                next_kill = now + p.kill_every
            for d in daemons:  # a restart can die (e.g. during the outage): start it again
                if (
                    d.proc is not None
                    and d.proc.poll() is not None
                    and time.monotonic() - d.last_start > 1.0
                    and time.time() < t_end
                ):
                    events.restarts[str(d.index)] += 1
                    start_daemon(d, p.table, env)
            time.sleep(0.2)
        for a in apps:
            if a.poll() is None:
                kill_group(a)
        say(p, "traffic over; stopping jobs, auditing")
        jobs.stop()
        plan.enabled = False
        stats = {d.index: daemon_stats(d) for d in daemons}

        # -- the audit
        records: list[dict[str, Any]] = []
        for h in histories:
            if h.exists():
                with open(h) as f:
                    for line in f:
                        with contextlib.suppress(ValueError):
                            records.append(json.loads(line))
        scanned_at = time.time()
        table = A.table_checks(scan(ddb, p.table), CLIENT, scanned_at)
        made = creations(p, proxies)
        if made is not None:  # kept beside the result, for digging into a finding
            Path(p.results_dir).mkdir(parents=True, exist_ok=True)
            with open(Path(p.results_dir) / f"{p.label}-lease-events.jsonl", "w") as f:
                f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in made)
        result = {
            "label": p.label,
            "params": asdict(p),
            "started": t_start,
            "outage": list(outage) if p.outage_s > 0 else None,
            "seconds": round(time.monotonic() - started, 1),
            "audit": A.audit(records, plan.outage, creations=made),
            "table": table,
            "kills": len(events.kills),
            "kill_events": events.kills,
            "unplanned_restarts": dict(events.restarts),
            "daemon_starts": {d.index: d.starts for d in daemons},
            "jobs": jobs_summary(events.jobs),
            "proxies": totals(proxies),
            "daemon_counters": _sum_counters(stats),
        }
        result["ok"] = violations(result) == 0
        write(p, result)
        return result
    finally:
        if jobs is not None:
            jobs.stop()
        for a in apps:
            kill_group(a)
        for d in daemons:
            kill_group(d.proc)
        for px in proxies:
            px.stop()
        if proxies and proxies[0].trace is not None:
            proxies[0].trace.close()
        if moto is not None:
            with contextlib.suppress(OSError):
                if moto.stdin is not None:
                    moto.stdin.close()
            kill_group(moto)
        if p.keep_workdir or p.trace:
            say(p, f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def creations(p: Params, proxies: list[FaultProxy]) -> list[dict[str, Any]] | None:
    """The claims the proxies saw apply, each with the agent that sent it (the daemons' proxies
    come first, then the paper workers'), for the audit's "who made the second lease"; None
    unless the run is mixed with the paper's workers behind proxies (chaos.audit counts every
    split involving rasd then)."""
    if not (p.mixed and p.paper_faults):
        return None
    out: list[dict[str, Any]] = []
    for i, px in enumerate(proxies):
        agent = A.RASD if i < p.daemons else A.PAPER
        out.extend({**c, "agent": agent} for c in px.events)
    return out


def _sum_counters(stats: dict[int, dict[str, int]]) -> dict[str, int]:
    """The live daemons' counters since their last start (a killed daemon's are gone)."""
    total: Counter[str] = Counter()
    for s in stats.values():
        total.update({k: v for k, v in s.items() if isinstance(v, int)})
    keep = ("lease.", "acq.", "ddb.", "cache.", "prefetch.")
    return {k: v for k, v in sorted(total.items()) if k.startswith(keep)}


def violations(result: dict[str, Any]) -> int:
    a, t = result["audit"], result["table"]
    return int(
        a["double_allocations"]
        + a["in_region_splits"]
        + a["lost_leases"]
        + t["both_free_and_leased"]
        + t["keys_with_two_unexpired_in_region"]
        + t["live_mappings_not_held"]
    )


def write(p: Params, result: dict[str, Any]) -> Path:
    out = Path(p.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(result["started"]))
    path = out / f"{stamp}-{p.label}.json"
    text = json.dumps(result, indent=1, sort_keys=False, default=str) + "\n"
    path.write_text(text)
    (out / f"latest-{p.label}.json").write_text(text)
    result["path"] = str(path)
    return path


# -------------------------------------------------------------------------------- report
def table(result: dict[str, Any]) -> str:
    a, t = result["audit"], result["table"]
    lat = a["latency_ms"]
    o = a.get("outage") or {}
    rows = [
        ("double allocations", a["double_allocations"]),
        ("in-region splits", a["in_region_splits"]),
        ("lost leases", a["lost_leases"]),
        ("table: free and leased", t["both_free_and_leased"]),
        ("table: key with 2 unexpired in region", t["keys_with_two_unexpired_in_region"]),
        ("table: live mapping, resource not held", t["live_mappings_not_held"]),
        ("table: orphans (not served; repaired later)", t["orphans"]),
        ("cross-region duplicates (allowed)", a["cross_region_duplicates"]),
    ]
    agents = a.get("agents", {})
    if "paper" in agents:
        rows += [
            ("paper-only splits (the paper's race)", a["paper_only_splits"]),
            ("paper-only lost leases", a["paper_only_lost_leases"]),
            ("splits: second lease the paper's (its race)", a.get("paper_made_splits", "-")),
            ("lost leases: second lease the paper's", a.get("paper_made_lost_leases", "-")),
            ("  in-region splits whose acquisitions ran at once", a["in_region_splits_concurrent"]),
        ]
        for name, g in agents.items():
            rows.append(
                (f"{name}: calls / answered", f"{g['calls']} / {g['answered']} "
                 f"(p50 {g['latency_ms']['p50']} ms, p99 {g['latency_ms']['p99']} ms)")
            )  # fmt: skip
        rows.append(("paper: errors by code", _codes(agents["paper"]["outcomes"])))
    calls = "get_lease calls" + (" (rasd's; so are the rows below)" if "paper" in agents else "")
    rows += [
        (calls, a["calls"].get("get_lease", 0)),
        ("answered with a lease", a["answered_share"]),
        ("  of calls that found a daemon", a["answered_share_daemon_up"]),
        ("calls that found no daemon (killed)", a["no_daemon"]),
        ("errors by code", _codes(a["outcomes"].get("get_lease", {}))),
        ("release outcomes", _codes(a["outcomes"].get("release", {}), keep_ok=True)),
        ("latency p50 / p99 (ms)", f"{lat['p50']} / {lat['p99']}"),
        (
            "outage calls / served from cache",
            f"{o.get('calls_inside')} / {o.get('served_from_cache')}",
        ),
        ("kill -9", result["kills"]),
        ("proxy faults", _codes(_faults(result["proxies"]["total"]))),
        ("jobs", json.dumps(result["jobs"], separators=(",", ":"))),
        ("verdict", "PASS" if result["ok"] else "FAIL"),
    ]
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{w}}  {value}" for name, value in rows)


def _codes(c: dict[str, int], keep_ok: bool = False) -> str:
    items = [(k, v) for k, v in sorted(c.items()) if keep_ok or k != "ok"]
    return ", ".join(f"{k} {v}" for k, v in items) or "-"


def _faults(total: dict[str, int]) -> dict[str, int]:
    return {k[6:]: v for k, v in total.items() if k.startswith("fault.") and k != "fault.none"}


def build_parser() -> argparse.ArgumentParser:
    d = Params()
    ap = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Chaos run of rasd: daemons in two regions behind fault-injecting "
        "proxies, kill -9, an outage, the jobs on loops; then an audit of what apps saw. "
        "Exit 0 when the audit found no violation, 1 otherwise.",
    )
    ap.add_argument("--duration", type=float, default=d.duration, help="seconds of traffic")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--daemons", type=int, default=d.daemons)
    ap.add_argument("--apps", type=int, default=d.apps)
    ap.add_argument("--keys", type=int, default=d.keys)
    ap.add_argument("--resources-per-region", type=int, default=d.resources_per_region)
    ap.add_argument("--fault-rate", type=float, default=d.fault_rate)
    ap.add_argument("--outage-at", type=float, default=None, help="default: 40%% of duration")
    ap.add_argument("--outage", type=float, default=d.outage_s, help="outage seconds (0: none)")
    ap.add_argument("--kill-every", type=float, default=d.kill_every, help="0: no kills")
    ap.add_argument("--jobs-every", type=float, default=d.jobs_every)
    ap.add_argument("--liberator-grace", type=float, default=d.liberator_grace)
    ap.add_argument("--release-rate", type=float, default=d.release_rate)
    ap.add_argument("--think-ms", type=float, default=d.think_ms)
    ap.add_argument("--call-timeout", type=float, default=d.call_timeout)
    ap.add_argument("--label", default=None, help="results name (default: short/full)")
    ap.add_argument("--results-dir", default=d.results_dir)
    ap.add_argument("--keep-workdir", action="store_true", help="keep histories and logs")
    ap.add_argument(
        "--trace",
        action="store_true",
        help="record every write through the proxies in the work directory's trace.jsonl "
        "(kept, as with --keep-workdir)",
    )
    ap.add_argument(
        "--mixed",
        action="store_true",
        help="a mixed fleet: workers of the paper's agent and its liberator beside rasd",
    )
    ap.add_argument("--paper-workers", type=int, default=d.paper_workers)
    ap.add_argument(
        "--no-paper-faults",
        action="store_true",
        help="the paper's workers talk to moto directly, not through fault-injecting proxies",
    )
    ap.add_argument("--paper-liberator-grace", type=float, default=d.paper_liberator_grace)
    return ap


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through run()'s finally: children are killed


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    p = Params(
        duration=args.duration,
        seed=args.seed,
        daemons=args.daemons,
        apps=args.apps,
        keys=args.keys,
        resources_per_region=args.resources_per_region,
        fault_rate=args.fault_rate,
        outage_at=args.outage_at,
        outage_s=args.outage,
        kill_every=args.kill_every,
        jobs_every=args.jobs_every,
        liberator_grace=args.liberator_grace,
        release_rate=args.release_rate,
        think_ms=args.think_ms,
        call_timeout=args.call_timeout,
        label=args.label
        or ("mixed-" if args.mixed else "") + ("full" if args.duration >= 300 else "short"),
        results_dir=args.results_dir,
        keep_workdir=args.keep_workdir,
        trace=args.trace,
        mixed=args.mixed,
        paper_workers=args.paper_workers,
        paper_faults=not args.no_paper_faults,
        paper_liberator_grace=args.paper_liberator_grace,
    )
    result = run(p)
    print(table(result))
    print(f"result: {result['path']}")
    return 0 if result["ok"] else 1

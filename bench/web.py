"""The web bench (``make bench-web``): what a web app loses by calling rasd on a hot route.

``python -m bench.web [--duration 10] [--connections 16] [--workers 8] [--backend auto]``

One run, one machine, one backend and one latency for every route: a DynamoDB stand-in behind
the delay proxy (``bench.harness.Env``: dynalite when installed, else moto; ``--backend``), a
table whose pool holds ``--resources`` free resources, one ``rasd serve`` daemon beside the
app (``Env.start_daemons``), and gunicorn serving ``bench.webapp`` (the Flask app) with
``--workers`` sync workers on loopback. First every one of the ``--keys`` keys of each side
is leased once: rasd's keys (``web-0000``...) through the daemon, the paper agent's
(``paper-0000``..., a disjoint set) through ``bench.baseline.BaselineAgent``. Then wrk (one
thread, ``--connections``) drives one route per run, in this order:

1. ``/plain``: a small JSON body from a random key, no lease;
2. ``/lease``, table mode: the same and ``rasd_client.get_lease`` (the client's defaults);
3. ``/lease``, socket mode: the same with ``RASD_CLIENT_TABLE=0`` in the workers'
   environment (the client's shared-memory table hit path off: every call on the socket);
4. ``/paper``: the same with the paper's agent (one boto3 client per worker), every call a
   Query of the leased index through the proxy;
5. ``/plain`` again: the two plains show how much the machine drifted over the run.

Each run starts a gunicorn of its own (``--preload``) with the run's environment, waits for
all its workers, drives the route for ``--warmup`` seconds unmeasured (each worker opens its
rasd connection or its boto3 client), then measures for ``--duration`` seconds; so every run
is treated alike, and the two lease modes hit the same daemon with the same cache.

The daemon re-reads a hot key once half of its ``confirm_interval`` (S, 30 s) has passed
since it last confirmed it; keys leased together come due together, so their re-reads come in
waves S/2 apart while the keys are asked for. Each /lease run starts only when every key is
due (the bench waits for it, at most S/2 + ``--warmup`` + 1 s, its gunicorn ready), so that
each run's first hits bring the wave, in its unmeasured seconds, and not one mode's measured
window alone.

Output: a markdown table on stdout (req/s, p50, p99 and each run's share of /plain: its req/s over
the mean of the two plains) and ``bench/results/<stamp>-web.json`` with wrk's figures, the
CPU seconds of the daemon, the backend, the proxy, the gunicorn workers and wrk in each run,
the daemon's counters (per HTTP request: the calls it answered on the socket, and the
one-way touches of the client's table path: which /lease calls the table answered, and
what they still cost the daemon), the machine and the parameters.

Everything listens on 127.0.0.1; every step has a time bound; every child is stopped on exit,
Ctrl-C and SIGTERM included. wrk is Debian's package ``wrk`` (``apt-get install -y wrk``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import rasd_client
from fleet import procs
from fleet.backends import dynalite_status, free_port
from rasd.config import load as load_config

from . import report
from .baseline import BaselineAgent
from .harness import CLIENT, LOG_DIR, POOL, REGION, Daemon, Env, aws_env, cpu_split

RESULTS = Path(__file__).resolve().parent / "results"
RASD_PREFIX = "web-"
PAPER_PREFIX = "paper-"
LEASE = timedelta(minutes=10)
#: (name, route, the client's table path on); in the order they run
RUNS = [
    ("plain", "/plain", None),
    ("lease-table", "/lease", True),
    ("lease-socket", "/lease", False),
    ("paper", "/paper", None),
    ("plain", "/plain", None),
]
WRK_INSTALL = "apt-get update && apt-get install -y wrk  (Debian's package `wrk`)"


# ------------------------------------------------------------------------------------ wrk
_UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}


def _ms(text: str) -> float:
    """wrk's duration (``651.58us``, ``1.20ms``, ``2.00s``, ``1.00m``) in milliseconds."""
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNIT_MS[m.group(2)]


def parse_wrk(out: str) -> dict[str, Any]:
    """wrk's report (run with ``--latency``) as numbers: req/s, latency mean/stdev/max and
    the 50/75/90/99th percentiles in ms, requests, seconds, socket errors, non-2xx answers."""
    res: dict[str, Any] = {"non_2xx": 0, "socket_errors": {}}
    for line in out.splitlines():
        s = line.strip()
        if m := re.fullmatch(r"(50|75|90|99)%\s+(\S+)", s):
            res[f"p{m.group(1)}_ms"] = _ms(m.group(2))
        elif m := re.match(r"Latency\s+([\d.]+\w+)\s+([\d.]+\w+)\s+([\d.]+\w+)", s):
            res["mean_ms"], res["stdev_ms"], res["max_ms"] = (_ms(g) for g in m.groups())
        elif m := re.match(r"(\d+) requests in ([\d.]+\w+)", s):
            res["requests"], res["seconds"] = int(m.group(1)), _ms(m.group(2)) / 1e3
        elif m := re.match(
            r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", s
        ):
            res["socket_errors"] = dict(
                zip(("connect", "read", "write", "timeout"), map(int, m.groups()), strict=True)
            )
        elif m := re.match(r"Non-2xx or 3xx responses: (\d+)", s):
            res["non_2xx"] = int(m.group(1))
        elif m := re.match(r"Requests/sec:\s+([\d.]+)", s):
            res["req_s"] = float(m.group(1))
    missing = [k for k in ("req_s", "p50_ms", "p99_ms", "requests") if k not in res]
    if missing:
        raise RuntimeError(f"wrk's output lacks {missing}:\n{out}")
    res["errors"] = res["non_2xx"] + sum(res["socket_errors"].values())
    return res


def run_wrk(url: str, seconds: float, connections: int, threads: int) -> dict[str, Any]:
    """wrk against ``url`` for ``seconds``: its parsed report, its own CPU seconds."""
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency",
           "--timeout", "10s", url]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr}")
    res = parse_wrk(done.stdout)
    res["wrk_cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return res


# ------------------------------------------------------------------------------- gunicorn
def children(pid: int) -> list[int]:
    """The pids of the process's children (its workers, for a gunicorn master)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (0 once it is gone)."""
    try:
        return sum(cpu_split(pid))
    except (OSError, IndexError, ValueError):
        return 0.0


def machine_busy_s() -> float:
    """CPU seconds every CPU of the machine has spent busy (not idle, not waiting on I/O)."""
    with open("/proc/stat") as fh:
        # user nice system idle iowait irq softirq steal (guest time is in user already)
        fields = [int(x) for x in fh.readline().split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class Gunicorn:
    """gunicorn serving ``bench.webapp:app`` on a free loopback port with ``env``, in a
    process group of its own (a terminal's Ctrl-C reaches only us; we stop it)."""

    def __init__(self, env: dict[str, str], workers: int, log: Path) -> None:
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "gunicorn", "bench.webapp:app",
               "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers),
               "--worker-class", "sync", "--preload", "--backlog", "1024",
               "--timeout", "30", "--graceful-timeout", "5",
               "--log-level", "warning", "--error-logfile", "-"]  # fmt: skip
        with open(log, "ab") as out:
            self.proc = procs.popen(
                cmd,
                env,
                group=True,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def worker_pids(self) -> list[int]:
        return children(self.proc.pid)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every worker runs and ``/plain`` answers 200."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gunicorn exited ({self.proc.returncode}); {self.log}:\n"
                    + self.log.read_text()[-2000:]
                )
            if len(self.worker_pids()) >= self.workers:
                try:
                    with urllib.request.urlopen(self.url + "/plain", timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"gunicorn not ready after {timeout:.0f}s; see {self.log}")

    def stop(self) -> None:
        """SIGTERM (the master stops its workers and waits for them), then SIGKILL to the
        group if it is still there after 15 s."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                procs.kill_group(self.proc)


# -------------------------------------------------------------------------------- warm-up
def _retrying(what: str, fn: Any, deadline: float, tries: int = 5) -> Any:
    for attempt in range(1, tries + 1):
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm-up: out of time at {what}")
        try:
            return fn()
        except Exception as exc:  # retried, then raised with its name
            if attempt == tries:
                raise RuntimeError(f"warm-up: {what} failed {tries} times: {exc!r}") from exc
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def warm_rasd(socket: str, keys: int, deadline: float) -> dict[str, Any]:
    """Every rasd key leased once through the daemon (16 at a time)."""
    t0 = time.monotonic()

    def one(i: int) -> str:
        key = f"{RASD_PREFIX}{i:04d}"
        lease = _retrying(
            key,
            lambda: rasd_client.get_lease(CLIENT, POOL, key, LEASE, socket_path=socket, timeout=30),
            deadline,
        )
        return str(lease.resource)

    with ThreadPoolExecutor(16) as ex:
        got = list(ex.map(one, range(keys)))
    return {"keys": keys, "resources": len(set(got)), "seconds": time.monotonic() - t0}


def warm_paper(table: str, endpoint: str, keys: int, deadline: float) -> dict[str, Any]:
    """Every paper key leased once by the paper's agent (8 threads, one agent each)."""
    t0 = time.monotonic()
    local = threading.local()
    until_us = int((time.time() + LEASE.total_seconds()) * 1e6)

    def one(i: int) -> str:
        agent = getattr(local, "agent", None)
        if agent is None:
            agent = local.agent = BaselineAgent(table, REGION, endpoint, paper=True)
        key = f"{PAPER_PREFIX}{i:04d}"
        lease = _retrying(key, lambda: agent.get_lease(CLIENT, POOL, key, until_us), deadline)
        return str(lease.resource)

    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(one, range(keys)))
    return {"keys": keys, "resources": len(set(got)), "seconds": time.monotonic() - t0}


# ------------------------------------------------------------------------------ the runs
def app_env(
    a: argparse.Namespace, env: Env, table: str, daemon: Daemon, table_path: bool
) -> dict[str, str]:
    """The workers' environment: the client's settings and the app's ids and keys."""
    e = aws_env()
    e.pop("RASD_CLIENT_TABLE", None)  # the table mode: the client's default
    if not table_path:
        e["RASD_CLIENT_TABLE"] = "0"
    e.update(
        PYTHONPATH=str(procs.REPO) + os.pathsep + e.get("PYTHONPATH", ""),
        RASD_SOCKET=daemon.socket,
        RASD_TIMEOUT=str(a.client_timeout),
        WEBAPP_CLIENT=CLIENT,
        WEBAPP_POOL=POOL,
        WEBAPP_KEYS=str(a.keys),
        WEBAPP_RASD_PREFIX=RASD_PREFIX,
        WEBAPP_PAPER_PREFIX=PAPER_PREFIX,
        WEBAPP_TABLE=table,
        WEBAPP_ENDPOINT=env.endpoint,
        WEBAPP_REGION=REGION,
    )
    return e


def one_run(
    a: argparse.Namespace,
    env: Env,
    table: str,
    daemon: Daemon,
    route: str,
    table_path: bool,
    not_before: float = 0.0,
) -> dict[str, Any]:
    """One route driven by wrk through a gunicorn of its own; the first request is sent at
    ``not_before`` (``time.monotonic()``) or later, once every worker runs."""
    log = LOG_DIR / "web-gunicorn.log"
    g = Gunicorn(app_env(a, env, table, daemon, table_path), a.workers, log)
    try:
        g.wait_ready()
        waited = max(0.0, not_before - time.monotonic())
        if waited:
            print(f"bench.web: {waited:.1f}s until every key is due", file=sys.stderr)
            time.sleep(waited)
        first = time.monotonic()
        url = g.url + route
        if a.warmup > 0:
            run_wrk(url, a.warmup, a.connections, a.threads)
        pids = {
            "daemon": [daemon.pid],
            "backend": [env.backend.pid()],
            "proxy": [env.proxy.pid()],
            "gunicorn_workers": g.worker_pids(),
        }
        cpu0 = {k: {p: cpu_s(p) for p in ps} for k, ps in pids.items()}
        counters0 = daemon.counters()
        load0 = os.getloadavg()
        busy0 = machine_busy_s()
        res = run_wrk(url, a.duration, a.connections, a.threads)
        busy = machine_busy_s() - busy0
        counters1 = daemon.counters()
        res["cpu_s"] = {
            k: round(sum(cpu_s(p) - cpu0[k][p] for p in ps if p in cpu0[k]), 3)
            for k, ps in pids.items()
        }
        res["cpu_s"]["wrk"] = round(res.pop("wrk_cpu_s"), 3)
        # the machine's busy CPU seconds less ours: the bench itself, gunicorn's master, the
        # kernel's softirqs, and whatever else ran on the machine (the noise)
        res["cpu_s"]["machine"] = round(busy, 3)
        res["cpu_s"]["rest"] = round(busy - sum(res["cpu_s"][k] for k in (*pids, "wrk")), 3)
        res["load"] = {"before": load0, "after": os.getloadavg()}
        delta = {k: counters1[k] - counters0[k] for k in counters1 if counters1[k] != counters0[k]}
        res["daemon_counters"] = delta
        # what reached the daemon per HTTP request: the calls it answered (round trips on
        # the socket; less the stats call that reads these counters), and the one-way touches
        # of the client's table path (a hit past its touch time, for one thing a sliding
        # lease end later than the table's)
        touches = delta.get("table.touches", 0)
        n = max(1, res["requests"])
        res["socket_calls_per_request"] = max(0, delta.get("req.total", 0) - touches - 1) / n
        res["table_touches_per_request"] = touches / n
        res["worker_restarts"] = len(set(g.worker_pids()) - set(pids["gunicorn_workers"]))
        res["waited_s"], res["first_request_at"] = waited, first
        return res
    finally:
        g.stop()


def markdown(doc: dict[str, Any]) -> str:
    p, m = doc["params"], doc["machine"]
    plains = [r["req_s"] for r in doc["runs"] if r["route"] == "/plain"]
    base = sum(plains) / len(plains) if plains else float("nan")
    lines = [
        f"web bench {doc['stamp']}: nproc {m['nproc']} ({m.get('cpu', '?')}), "
        f"backend {doc['backend']} behind the delay proxy ({p['delay_ms']:g} ms each way), "
        f"gunicorn {p['workers']} sync workers, wrk {p['threads']} thread "
        f"{p['connections']} connections {p['duration']:g} s per run "
        f"(+{p['warmup']:g} s unmeasured), {p['keys']:,} keys per side, "
        f"{p['resources']:,} resources, leases of 10 min; load average (1 min) "
        f"{doc['load'][0]:.2f} at the start, {doc['load'][1]:.2f} at the end",
        "",
        "| run | route | mode | req/s | p50 ms | p99 ms | share of /plain "
        "| socket calls / req | touches / req | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(doc["runs"], 1):
        lines.append(
            f"| {i} | {r['route']} | {r['mode']} | {r['req_s']:,.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['req_s'] / base:.1%} | "
            f"{r['socket_calls_per_request']:.2f} | {r['table_touches_per_request']:.2f} | "
            f"{r['errors']} |"
        )
    if len(plains) == 2:
        lines += ["", f"plain drift: second/first {plains[1] / plains[0] - 1:+.1%}"]
    rc = [
        f"{r['mode']} {r['daemon_counters'].get('lease.reconfirmed', 0)}"
        for r in doc["runs"]
        if r["route"] == "/lease"
    ]
    lines.append(
        "CPU seconds outside the app, wrk, the daemon, the backend and the proxy in each run "
        "(the kernel, the bench, anything else on the machine): "
        + ", ".join(f"{r['cpu_s']['rest']:.1f}" for r in doc["runs"])
        + f" of {m['nproc'] * p['duration']:g}"
    )
    noisy = [
        str(i)
        for i, r in enumerate(doc["runs"], 1)
        if r["cpu_s"]["rest"] > 0.05 * m["nproc"] * p["duration"]
    ]
    if noisy:
        lines.append(
            f"more than 5 % of the CPU went elsewhere in run {', '.join(noisy)}: the machine "
            "was busy with something else, and those figures are what was left of it"
        )
    if rc:
        lines.append(
            "daemon re-confirmations in the /lease runs (a hot key is re-read once half of "
            f"confirm_interval has passed): {', '.join(rc)}"
        )
    return "\n".join(lines)


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.web", description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per run (default 10)")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each")
    ap.add_argument("--connections", type=int, default=16, help="wrk's connections (16)")
    ap.add_argument("--threads", type=int, default=1, help="wrk's threads (1)")
    ap.add_argument("--workers", type=int, default=8, help="gunicorn sync workers (8)")
    ap.add_argument("--keys", type=int, default=1000, help="keys per side (1000)")
    ap.add_argument("--resources", type=int, default=2200, help="the pool's resources (2200)")
    ap.add_argument("--delay-ms", type=float, default=3.5, help="one-way delay (default 3.5)")
    ap.add_argument(
        "--backend",
        choices=["auto", "moto", "dynalite"],
        default="auto",
        help="auto: dynalite when installed (keep-alive, as DynamoDB), else moto",
    )
    ap.add_argument("--client-timeout", type=float, default=5.0, help="RASD_TIMEOUT of the app")
    ap.add_argument("--warm-timeout", type=float, default=300.0, help="bound on the warm-up")
    a = ap.parse_args(argv)
    if a.resources < 2 * a.keys:
        ap.error(f"--resources must be at least 2 x --keys ({2 * a.keys}): one per key and side")
    if not shutil.which("wrk"):
        print(f"bench.web: wrk is not installed; install it: {WRK_INSTALL}", file=sys.stderr)
        return 2
    backend = a.backend
    if backend == "auto":
        backend = "dynalite" if dynalite_status() is None else "moto"
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    machine = report.machine()
    machine["nproc"] = len(os.sched_getaffinity(0))
    doc: dict[str, Any] = {
        "stamp": stamp,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backend": backend,
        "machine": machine,
        "params": {k: v for k, v in vars(a).items() if k != "backend"},
        "runs": [],
        "load_start": os.getloadavg()[0],
    }
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    (LOG_DIR / "web-gunicorn.log").write_bytes(b"")
    print(
        f"bench.web: backend {backend}, nproc {machine['nproc']}, "
        f"load {os.getloadavg()[0]:.2f}; logs in {LOG_DIR}",
        file=sys.stderr,
    )
    t_start = time.monotonic()
    env: Env | None = None
    code = 0
    try:
        env = Env(backend, a.delay_ms)
        table = env.new_table(resources=a.resources, prefix="r")
        (daemon,) = env.start_daemons(table, 1, prefix="web-")
        deadline = time.monotonic() + a.warm_timeout
        doc["warmup"] = {"rasd": warm_rasd(daemon.socket, a.keys, deadline)}
        doc["warmup"]["paper"] = warm_paper(table, env.endpoint, a.keys, deadline)
        print(f"bench.web: warm-up {json.dumps(doc['warmup'])}", file=sys.stderr)
        # when the rasd keys were last confirmed, all together: at the warm-up, then in the
        # unmeasured seconds of each /lease run, whose first hits re-confirm every key due
        confirmed = time.monotonic()
        half_s = load_config(env=aws_env()).confirm_interval / 2
        for name, route, table_path in RUNS:
            mode = {None: "-", True: "table", False: "socket"}[table_path]
            print(
                f"bench.web: [{time.monotonic() - t_start:5.0f}s] {route} {mode} ...",
                file=sys.stderr,
            )
            due = confirmed + half_s + a.warmup + 1.0 if route == "/lease" else 0.0
            res = one_run(a, env, table, daemon, route, bool(table_path), due)
            first = res.pop("first_request_at")
            if route == "/lease":
                confirmed = first
            doc["runs"].append({"name": name, "route": route, "mode": mode, **res})
            print(
                f"bench.web:   {res['req_s']:,.0f} req/s, p50 {res['p50_ms']:.2f} ms, "
                f"p99 {res['p99_ms']:.2f} ms, errors {res['errors']}",
                file=sys.stderr,
            )
    except (Exception, KeyboardInterrupt, SystemExit) as exc:  # noqa: BLE001 - recorded
        doc["error"] = f"{type(exc).__name__}: {exc}"
        print(f"bench.web: stopped: {doc['error']}", file=sys.stderr)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        if isinstance(exc, SystemExit) and isinstance(exc.code, int):
            code = exc.code
    finally:
        # the clean-up is not cut short by a second Ctrl-C or SIGTERM
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if env is not None:
            env.close()
    doc["elapsed_s"] = time.monotonic() - t_start
    doc["load"] = [doc["load_start"], os.getloadavg()[0]]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp}-web.json"
    out.write_text(json.dumps(doc, indent=1, default=str))
    if doc["runs"]:
        print(markdown(doc))
    print(f"\nresults: {out}; {doc['elapsed_s']:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())

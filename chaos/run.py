"""The chaos run: start everything, break it for ``duration`` seconds, audit what the apps saw.

Layout of one run (all on 127.0.0.1; every child in its own process group)::

    moto us-east-1  <── sim.replicator (last writer wins, --lag) ──>  moto eu-west-1
      ▲   ▲   ▲      <── per region, against its own replica: ras-liberator,  ▲   ▲
      │   │   │          ras-dedupe, rasadmin; ras-balancer in us-east-1 with  │   │
      │   │   │          --peer-endpoint eu-west-1 (its state on moto's S3)    │   │
     p0  p2  p4     fault-injecting proxies (threads of this process)         p1  p3
      ▲   ▲   ▲                                                                ▲   ▲
     d0  d2  d4     rasd serve --region (alternately); one is kill -9'd       d1  d3
                    every --kill-every seconds and restarted at once
     apps (python -m chaos.app): get_lease/release over --keys keys, history as JSON lines

Sequence: one moto server per region (the replicas), the table, pool and resources in each
(the same items), the replicator, proxies (faults off), daemons (ready), then faults on, the
outage window set, apps, jobs, the balancer, rasadmin and the killer started; after
``duration`` the apps stop by themselves, the other actors are stopped, the replicator is
let settle, each replica is scanned directly, and ``chaos.audit`` judges the histories and
the replicas. The result (JSON) goes to ``--results-dir`` as ``<stamp>-<label>.json`` and
``latest-<label>.json``. ``--one-table``: one moto table for both regions, no replicator,
every child signing for us-east-1 (the liberator then runs ``--all-regions`` and the
balancer ``--unreplicated``).

Mixed mode (``--mixed``, docs/reliability.md "Mixed fleet"): beside the apps, workers of the
paper's in-process agent (``python -m chaos.paper agent``, half in each region, each through
its own fault-injecting proxy) ask for keys of the same key space, and the paper's liberator
(``python -m chaos.paper liberate --grace``) runs with the other jobs. Their answers go into
the same histories (``agent: "paper"``) and the audit judges the union. The mixed fleet runs
on one table (the paper's agent knows one), without the balancer and rasadmin.

The end of the rollout (``--end-rollout-at``, mixed mode): at that time the paper's workers
(started to stop then) and its liberator stop, ``rasadmin end-rollout`` runs every few seconds
until it succeeds (``EndRollout``), and the daemons, still serving, follow the record to the
fast rules; the result's ``end_rollout`` says when each step happened.

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
from rasd.core import schema
from rasd.core.rollout import Rollout
from rasd.core.serialize import is_tombstone, item_from_ddb
from rasd_jobs import common as jobs_common
from sim import replicator

from . import audit as A
from .proxy import FaultPlan, FaultProxy, Trace, start_proxies, totals

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
REGIONS = ("us-east-1", "eu-west-1")
CLIENT, POOL = "demo", "default"
#: the DynamoDB region of the one table of a run without replicas (every child signs for it)
TABLE_REGION = "us-east-1"
BUCKET = "chaos-balancer"
#: the daemons' pool_refresh in a run that ends the rollout (the default is 30 s): they
#: follow the record within it plus pool_refresh_timeout (5 s)
END_ROLLOUT_POOL_REFRESH = 5.0


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
    #: the longest lease the paper's workers ask for (None: the apps' lengths, up to 60 s)
    paper_max_lease: float | None = None
    #: the end of the rollout, seconds into the traffic (mixed fleet only; None: never): the
    #: paper's workers and liberator stop, then ``rasadmin end-rollout`` runs every
    #: ``end_rollout_every`` seconds until it succeeds
    end_rollout_at: float | None = None
    end_rollout_every: float = 3.0
    #: the daemons' pool_refresh (None: their default, 30 s): how soon they follow the record
    pool_refresh: float | None = None
    #: two replicas, one moto server per region, joined by the simulation's replicator
    #: (``sim.replicator``: last writer wins after ``lag_s``); False: one table for both
    #: regions (the mixed fleet always runs so: the paper's agent knows one table)
    replicas: bool = True
    lag_s: float = 1.0
    #: free resources of each region at the start (in ``regions`` order): uneven, so that
    #: the balancer has items to move (the first region has more than the keys, the second
    #: far fewer); empty, and in the mixed fleet: ``resources_per_region`` each
    resources: tuple[int, ...] = (90, 20)
    #: ras-balancer on a loop of its own, every ``jobs_every`` seconds (its state on moto's
    #: S3): moves free items between regions (not in the mixed fleet)
    balancer: bool = True
    balancer_interval: float = 10.0  # its demand is a rate per this many seconds
    balancer_horizon: float = 5.0  # it provisions for this many seconds ahead
    balancer_safety: float = 1.0
    balancer_floor: int = 2
    #: rasadmin on a loop: delete-resource, add-resources of the deleted names, add-pool
    #: (not in the mixed fleet)
    admin: bool = True
    admin_every: float = 3.0
    #: add-pool redefines the pool with these max leases in turn (apps ask for up to 60 s)
    max_leases: tuple[float, ...] = (45.0, 3600.0)

    def outage_offset(self) -> float:
        return self.outage_at if self.outage_at is not None else 0.4 * self.duration

    def replicated(self) -> bool:
        return self.replicas and not self.mixed

    def check(self) -> None:
        """Refuse parameters whose end of the rollout cannot happen in the run."""
        if self.end_rollout_at is None:
            return
        if not self.mixed:
            raise ValueError("end_rollout_at: a mixed fleet only (--mixed)")
        if not 0 < self.end_rollout_at < self.duration:
            raise ValueError("end_rollout_at: within the traffic (0 < at < duration)")

    def counts(self) -> dict[str, int]:
        """Free resources of each region at the start."""
        if self.resources and not self.mixed:
            if len(self.resources) != len(self.regions):
                raise ValueError(f"resources: one count per region {self.regions}")
            return dict(zip(self.regions, self.resources, strict=True))
        return {r: self.resources_per_region for r in self.regions}


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
    admin: list[dict[str, Any]] = field(default_factory=list)


# ----------------------------------------------------------------------------- processes
def child_env(one_table: bool) -> dict[str, str]:
    """Dummy credentials, no real AWS. ``one_table``: AWS_REGION pinned so that daemons and
    jobs of both RAS regions share moto's one us-east-1 table. Else no region is set: every
    daemon and job signs for its own RAS region, whose replica (a moto server of its own)
    keeps the table in that region."""
    env = {
        k: v for k, v in os.environ.items() if not (k.startswith("AWS_") or k.startswith("RASD_"))
    }
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    if one_table:
        env.update(AWS_REGION=TABLE_REGION, AWS_DEFAULT_REGION=TABLE_REGION)
    return env


def popen(cmd: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, cwd=str(REPO), start_new_session=True, **kw)


def kill_group(proc: subprocess.Popen[Any] | None, sig: int = signal.SIGKILL) -> None:
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
        [sys.executable, "-m", "rasd.devtools.motoserver"],
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


def ddb_client(url: str, region: str = TABLE_REGION, service: str = "dynamodb") -> Any:
    return boto3.client(  # type: ignore[call-overload]
        service,
        endpoint_url=url,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=BotoConfig(retries={"max_attempts": 8, "mode": "standard"}, read_timeout=30),
    )


def seed_table(ddbs: list[Any], p: Params) -> dict[str, list[str]]:
    """The table, the pool and the resources, the same items (same timestamps) in every
    replica of ``ddbs``: a global table's state before the run."""
    now_us = time.time_ns() // 1000
    names: dict[str, list[str]] = {}
    for region, n in p.counts().items():
        prefix = region.split("-")[0]
        names[region] = [f"{prefix}-{i:04d}" for i in range(n)]
    for ddb in ddbs:
        schema.create_table(ddb, p.table)
        schema.put_pool(ddb, p.table, CLIENT, POOL, 3600)
        for region, ns in names.items():
            schema.add_resources(ddb, p.table, CLIENT, POOL, region, ns, now_us)
        if p.mixed:  # the paper's agent writes the table: rollout mode (rasadmin adopt)
            jobs_common.write_rollout(ddb, p.table, True, Rollout(), "chaos", "mixed fleet")
    return names


def start_replicator(
    endpoints: dict[str, str], p: Params, env: dict[str, str], work: Path
) -> subprocess.Popen[str]:
    """``sim.replicator`` between the replicas, from the streams' current ends."""
    with open(work / "replicator.log", "ab") as log:
        proc = subprocess.Popen(
            replicator.command(endpoints, p.table, p.lag_s, str(work / "replication.jsonl")),
            env=env,
            cwd=str(REPO),
            start_new_session=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"replicator did not start; see {work / 'replicator.log'}")
        if line.startswith("READY"):
            return proc


def stop_replicator(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Close its stdin (its signal to stop); its summary (one JSON line on stdout)."""
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return {"error": "did not stop"}
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    summary: dict[str, Any] = json.loads(lines[-1]) if lines else {"error": "no summary"}
    return summary


def scan(ddb: Any, table: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kw: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        resp = ddb.scan(**kw)
        items.extend(resp["Items"])
        if "LastEvaluatedKey" not in resp:
            return items
        kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def daemon_env(p: Params, env: dict[str, str]) -> dict[str, str]:
    """The daemons' environment: the run's, and its pool_refresh when it sets one."""
    if p.pool_refresh is None:
        return env
    return {**env, "RASD_POOL_REFRESH": f"{p.pool_refresh:g}"}


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


def daemon_rollout(d: Daemon) -> bool | None:
    """The rules the daemon runs (its ``stats``' ``rollout``): True rollout mode, False the
    fast rules, None no answer (restarting, or still starting)."""
    try:
        mode = rasd_client.call_raw("stats", socket_path=d.socket, timeout=2.0).get("rollout")
    except rasd_client.RasdError:
        return None
    return mode if isinstance(mode, bool) else None


def daemon_stats(d: Daemon) -> dict[str, int]:
    try:
        c: dict[str, int] = rasd_client.call_raw("stats", socket_path=d.socket, timeout=2.0)[
            "counters"
        ]
        return c
    except (rasd_client.RasdError, KeyError):
        return {}


# ---------------------------------------------------------------------------------- jobs
class Commands(threading.Thread):
    """A thread that runs commands one at a time, each as a child leading its own process
    group, each for at most :attr:`TIMEOUT` seconds (then killed, its output dropped);
    :meth:`stop` ends the loop and kills the command running."""

    TIMEOUT = 60.0

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stop_ev = threading.Event()
        self.current: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def call(self, cmd: list[str], env: dict[str, str]) -> tuple[int | None, bytes, bytes] | None:
        """Run ``cmd`` to its end: its exit status, stdout and stderr. None: stopped before
        it started (nothing ran)."""
        with self.lock:
            if self.stop_ev.is_set():
                return None
            proc = popen(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.current = proc
        try:
            out, err = proc.communicate(timeout=self.TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out = err = b""
        finally:
            with self.lock:
                self.current = None
        return proc.returncode, out, err

    def stop(self) -> None:
        self.stop_ev.set()
        with self.lock:
            proc = self.current
        kill_group(proc)
        self.join(self.TIMEOUT + 10)


def is_paper(cmd: list[str]) -> bool:
    """Is ``cmd`` (``python -m MODULE ...``) the paper's liberator?"""
    return cmd[2] == "chaos.paper"


def last_json(out: bytes, otherwise: dict[str, Any]) -> dict[str, Any]:
    """A command's summary: the last line of its stdout, as JSON; ``otherwise`` when that
    line is missing or not JSON."""
    try:
        summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return otherwise
    return summary


class Jobs(Commands):
    """The offline jobs as their CLIs, every ``jobs_every`` seconds until stopped; one at a
    time, each bounded. Two loops, as Jenkins schedules them apart: the maintenance jobs, and
    (``balancer=True``) ras-balancer alone. With replicas, as jobs/Jenkinsfile runs them:
    ras-liberator and ras-dedupe once per region, each against its own region's replica;
    ras-balancer in the first region (reading its replica's stream), with
    ``--peer-endpoint`` for the other region, its state on moto's S3. Without replicas:
    ras-liberator ``--all-regions``, ras-dedupe per region, ras-balancer
    ``--unreplicated``, all against the one table."""

    def __init__(
        self,
        p: Params,
        endpoints: dict[str, str],
        env: dict[str, str],
        events: Events,
        balancer: bool = False,
    ) -> None:
        super().__init__("chaos-balancer" if balancer else "chaos-jobs")
        self.p, self.endpoints, self.env, self.events = p, endpoints, env, events
        self.balancer = balancer
        #: held while the paper's liberator runs; once ``paper_stopped``, it runs no more
        self.paper_lock = threading.Lock()
        self.paper_stopped = False

    def commands(self) -> list[tuple[list[str], dict[str, str]]]:
        p, py, env = self.p, sys.executable, self.env
        home = p.regions[0]

        def base(region: str) -> list[str]:
            return ["--table", p.table, "--region", region,
                    "--endpoint-url", self.endpoints[region], "--log-level", "error"]  # fmt: skip

        if self.balancer:
            cmd = [
                py, "-m", "rasd_jobs.balancer", *base(home),
                "--regions", ",".join(p.regions), "--state-uri", f"s3://{BUCKET}/state",
                "--interval", str(p.balancer_interval), "--horizon", str(p.balancer_horizon),
                "--safety", str(p.balancer_safety), "--floor", str(p.balancer_floor),
            ]  # fmt: skip
            if p.replicated():
                for r in p.regions[1:]:
                    cmd += ["--peer-endpoint", f"{r}={self.endpoints[r]}"]
            else:
                cmd.append("--unreplicated")
            s3 = {"AWS_ENDPOINT_URL_S3": self.endpoints[home], "AWS_DEFAULT_REGION": home}
            return [(cmd, {**env, **s3})]
        grace = ["--grace", str(p.liberator_grace)]
        cmds: list[list[str]] = []
        if p.replicated():
            cmds += [[py, "-m", "rasd_jobs.liberator", *base(r), *grace] for r in p.regions]
        else:
            cmds.append([py, "-m", "rasd_jobs.liberator", *base(home), "--all-regions", *grace])
        cmds += [[py, "-m", "rasd_jobs.dedupe", *base(r)] for r in p.regions]
        out = [(c, env) for c in cmds]
        if p.mixed:
            cmd = [py, "-m", "chaos.paper", "liberate", "--table", p.table,
                   "--endpoint-url", self.endpoints[home],
                   "--grace", str(p.paper_liberator_grace)]  # fmt: skip
            out.append((cmd, env))
        return out

    def run(self) -> None:
        while not self.stop_ev.wait(self.p.jobs_every):
            for cmd, env in self.commands():
                if self.stop_ev.is_set():
                    return
                if is_paper(cmd):
                    with self.paper_lock:
                        if not self.paper_stopped:
                            self.one(cmd, env)
                else:
                    self.one(cmd, env)

    def stop_paper(self) -> None:
        """No more runs of the paper's liberator; returns once the one under way ended."""
        with self.paper_lock:
            self.paper_stopped = True

    def one(self, cmd: list[str], env: dict[str, str]) -> None:
        t0 = time.time()
        done = self.call(cmd, env)
        if done is None:
            return
        code, out, err = done
        name = "paper_liberator" if is_paper(cmd) else cmd[2].rsplit(".", 1)[-1]
        region = cmd[cmd.index("--region") + 1] if "--region" in cmd else None
        summary = last_json(out, {"unparsed": out.decode(errors="replace")[-300:]})
        summary.setdefault("job", name)
        summary.setdefault("region", region)
        summary.update(exit=code, t0=round(t0, 3), t1=round(time.time(), 3))
        if code not in (0, None):
            summary["stderr"] = err.decode(errors="replace")[-300:]
        if self.stop_ev.is_set() and code != 0:
            summary["stopped"] = True  # killed by stop(), at the end of the run: no failure
        self.events.jobs.append(summary)


class Admin(Commands):
    """An operator with ``rasadmin`` while the daemons serve, every ``admin_every`` seconds,
    the regions in turn:

    * ``delete-resource`` (no ``--force``) of a free item of the region, picked from its
      replica: a claimable one, or every third turn one in quarantine, which rasadmin must
      refuse (a claim can also take the item between the pick and the delete: refusals are
      counted by reason);
    * every second turn, ``add-resources`` of the names deleted so far (each held by its
      tombstone until the lease or quarantine it had is over), alternately in the region
      each was deleted from and in the other one (an operator moving capacity by hand: the
      tombstone written in one replica, the name re-added in the other);
    * every fifth turn, ``add-pool``: the pool redefined with the next of ``max_leases``.

    Each command runs against its region's replica, as rasadmin requires."""

    def __init__(
        self,
        p: Params,
        endpoints: dict[str, str],
        env: dict[str, str],
        events: Events,
        work: Path,
    ) -> None:
        super().__init__("chaos-admin")
        self.p, self.endpoints, self.env, self.events, self.work = p, endpoints, env, events, work
        self.rng = random.Random(f"{p.seed}/admin")
        self.ddb = {
            r: ddb_client(u, r if p.replicated() else TABLE_REGION) for r, u in endpoints.items()
        }
        self.deleted: list[tuple[str, str]] = []  # (region, name), not added again yet

    def run(self) -> None:
        turn = 0
        while not self.stop_ev.wait(self.p.admin_every):
            region = self.p.regions[turn % len(self.p.regions)]
            try:
                self.delete(region, quarantined=turn % 3 == 2)
            except Exception as exc:  # noqa: BLE001 - the pick's read failed: counted
                self.record("delete", region, [], None, {"status": "pick failed: " + repr(exc)})
            if turn % 2 == 1 and self.deleted:
                self.readd(elsewhere=turn % 4 == 3)
            if turn % 5 == 4:
                self.redefine(region, self.p.max_leases[(turn // 5) % len(self.p.max_leases)])
            turn += 1

    def free_items(self, region: str) -> tuple[list[str], list[str]]:
        """The region's free items, as its replica shows them now (strongly consistent):
        those claimable now, and those in quarantine."""
        now_us = time.time_ns() // 1000
        claimable: list[str] = []
        quarantined: list[str] = []
        kw: dict[str, Any] = {
            "TableName": self.p.table,
            "KeyConditionExpression": "client_id = :c",
            "ExpressionAttributeValues": {":c": {"S": CLIENT}},
            "ConsistentRead": True,
        }
        while True:
            resp = self.ddb[region].query(**kw)
            for raw in resp["Items"]:
                if is_tombstone(raw):
                    continue
                it = item_from_ddb(raw)
                if it.region == region and not it.leased:
                    (claimable if it.claimable(now_us) else quarantined).append(it.resource)
            if "LastEvaluatedKey" not in resp:
                return sorted(claimable), sorted(quarantined)
            kw["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def delete(self, region: str, quarantined: bool) -> None:
        """Delete a claimable item of ``region``, or (``quarantined``) one in quarantine,
        which rasadmin must refuse."""
        claimable, held = self.free_items(region)
        names = (held or claimable) if quarantined else (claimable or held)
        if not names:
            self.record("delete", region, [], None, {"status": "none free"})
            return
        name = self.rng.choice(names)
        rec = self.rasadmin(
            "delete", region, [name], ["delete-resource", "--client", CLIENT, "--resource", name]
        )
        if rec["exit"] == 0:
            self.deleted.append((region, name))

    def readd(self, elsewhere: bool) -> None:
        by_region: dict[str, list[str]] = {}
        regions = self.p.regions
        for region, name in self.deleted:
            if elsewhere:
                region = regions[(regions.index(region) + 1) % len(regions)]
            by_region.setdefault(region, []).append(name)
        self.deleted = []
        for region, names in by_region.items():
            f = self.work / f"readd-{region}.txt"
            f.write_text("".join(n + "\n" for n in names))
            args = ["add-resources", "--client", CLIENT, "--pool", POOL, "--file", str(f)]
            rec = self.rasadmin("readd_elsewhere" if elsewhere else "readd", region, names, args)
            if rec["exit"] != 0:
                self.deleted += [(region, n) for n in names]  # again next time

    def redefine(self, region: str, max_lease: float) -> None:
        args = ["add-pool", "--client", CLIENT, "--pool", POOL, "--max-lease", f"{max_lease:g}"]
        self.rasadmin("redefine", region, [], args)

    def rasadmin(
        self, action: str, region: str, names: list[str], args: list[str]
    ) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "rasd_jobs.admin", *args, "--table", self.p.table,
               "--region", region, "--endpoint-url", self.endpoints[region],
               "--log-level", "error"]  # fmt: skip
        t0 = time.time()
        done = self.call(cmd, self.env)
        if done is None:
            return {"exit": None}
        code, out, err = done
        summary = last_json(out, {"error": err.decode(errors="replace").strip()[-300:]})
        return self.record(action, region, names, code, summary, t0)

    def record(
        self,
        action: str,
        region: str,
        names: list[str],
        code: int | None,
        summary: dict[str, Any],
        t0: float | None = None,
    ) -> dict[str, Any]:
        now = time.time()
        rec = {"action": action, "region": region, "resources": names, "exit": code,
               "t0": round(t0 or now, 3), "t1": round(now, 3), **summary}  # fmt: skip
        if self.stop_ev.is_set() and code not in (0, None):
            rec["stopped"] = True
        self.events.admin.append(rec)
        return rec


#: rasadmin's refusals (its messages) -> the reason counted
REFUSALS = (
    ("in quarantine", "quarantine"),
    ("leased by key", "leased"),
    ("changed after it was read", "changed"),
    ("no resource", "gone"),
    ("region", "region"),
)


def refusal(message: str) -> str:
    """Why rasadmin refused (exit 1), from its message on stderr."""
    return next((why for text, why in REFUSALS if text in message), "other")


def admin_summary(admin: list[dict[str, Any]]) -> dict[str, Any]:
    """rasadmin's actions: what was done, what it refused (and why), what failed."""
    out: Counter[str] = Counter()
    for a in admin:
        act, code = a["action"], a.get("exit")
        if a.get("stopped") or code is None:
            out[f"{act}_stopped" if a.get("stopped") else f"{act}_skipped"] += 1
            continue
        if code == 0:
            if act == "delete":
                out["deletes"] += 1
            elif act.startswith("readd"):
                out["re_adds"] += int(a.get("added", 0))
                if act == "readd_elsewhere":
                    out["re_adds_in_the_other_region"] += int(a.get("added", 0))
                out["re_adds_held_by_tombstone"] += int(a.get("held_by_tombstone", 0))
                out["re_adds_skipped_existing"] += int(a.get("skipped_existing", 0))
            else:
                out["redefinitions"] += 1
            continue
        out[
            f"{act}_refused_{refusal(str(a.get('error', '')))}" if code == 1 else f"{act}_failed"
        ] += 1
    return dict(sorted(out.items()))


class EndRollout(Commands):
    """The end of the rollout as an operator does it (docs/operations.md, "When the old agent
    can be removed"), ``end_rollout_at`` seconds into the traffic, while the daemons serve:

    1. the paper's liberator stops (after its run under way), and its workers stop: they were
       started to stop then, each after the call under way, so every answer is in the audit;
    2. ``rasadmin end-rollout``, the CLI against the run's table, every ``end_rollout_every``
       seconds until it succeeds: it refuses while any item holds a lease of the paper's
       agent, running or ended and not yet freed (``ras-liberator`` frees those on its loop);
    3. each daemon's ``stats`` every second, until every one has reported the fast rules.

    :attr:`out` is the record: times in seconds into the traffic (``_s``)."""

    #: a paper worker still running this long after the end (its last call hung) is killed
    WORKER_BOUND = 30.0

    def __init__(
        self,
        p: Params,
        endpoint: str,
        env: dict[str, str],
        jobs: Jobs,
        workers: list[subprocess.Popen[bytes]],
        daemons: list[Daemon],
        t_start: float,
    ) -> None:
        super().__init__("chaos-end-rollout")
        self.p, self.endpoint, self.env, self.jobs = p, endpoint, env, jobs
        self.workers, self.daemons, self.t_start = workers, daemons, t_start
        self.out: dict[str, Any] = {
            "at_s": p.end_rollout_at,
            "every_s": p.end_rollout_every,
            "attempts": [],
            "succeeded_s": None,
            "daemons_off_s": {},
            "all_daemons_off_s": None,
        }

    def since(self) -> float:
        return round(time.time() - self.t_start, 3)

    def run(self) -> None:
        at = self.t_start + float(self.p.end_rollout_at or 0.0)
        if self.stop_ev.wait(max(0.0, at - time.time())):
            return
        self.jobs.stop_paper()
        self.out["paper_liberator_stopped_s"] = self.since()
        bound = at + self.WORKER_BOUND
        while any(w.poll() is None for w in self.workers) and time.time() < bound:
            if self.stop_ev.wait(0.2):
                return
        hung = [w for w in self.workers if w.poll() is None]
        for w in hung:
            kill_group(w)
        self.out["paper_workers_killed"] = len(hung)
        self.out["paper_workers_stopped_s"] = self.since()
        say(self.p, f"paper's workers and liberator stopped ({len(hung)} killed); end-rollout next")
        # the first attempt a pause after the last worker ended: a proxy may still hold its
        # last write (a latency fault) and forward it then
        while self.out["succeeded_s"] is None:
            if self.stop_ev.wait(self.p.end_rollout_every):
                return
            rec = self.attempt()
            if rec["exit"] == 0:
                self.out["succeeded_s"] = rec["s"]
                say(self.p, f"end-rollout succeeded at {rec['s']:.1f} s")
        off: dict[int, float] = self.out["daemons_off_s"]
        while len(off) < len(self.daemons) and not self.stop_ev.wait(1.0):
            for d in self.daemons:
                if d.index not in off and daemon_rollout(d) is False:
                    off[d.index] = self.since()
        if len(off) == len(self.daemons):
            self.out["all_daemons_off_s"] = max(off.values())
            say(self.p, f"every daemon on the fast rules by {max(off.values()):.1f} s")

    def attempt(self) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "rasd_jobs.admin", "end-rollout", "--table", self.p.table,
               "--region", self.p.regions[0], "--endpoint-url", self.endpoint,
               "--log-level", "error"]  # fmt: skip
        s = self.since()
        done = self.call(cmd, self.env)
        rec = {"s": s, **(end_rollout_attempt(*done) if done else {"exit": None})}
        if self.stop_ev.is_set() and rec["exit"] != 0:
            rec["stopped"] = True  # killed by stop(), at the end of the run
        self.out["attempts"].append(rec)
        return rec


def end_rollout_attempt(code: int | None, out: bytes, err: bytes) -> dict[str, Any]:
    """One ``rasadmin end-rollout`` as a record: its exit status, and why it refused:
    ``paper_leases`` (with how many running, how many ended and not yet freed, and a few
    items), ``record_changed`` (a concurrent change of the record), or ``error`` (no summary:
    its message on stderr)."""
    summary = last_json(out, {})
    rec: dict[str, Any] = {"exit": code}
    if code == 0:
        rec["changed"] = summary.get("changed")
        return rec
    found = summary.get("paper_leases") or {}
    if found.get("running") or found.get("ended"):
        rec.update(reason="paper_leases", running=found.get("running", 0))
        rec.update(ended=found.get("ended", 0), items=found.get("items", []))
    elif "refused" in summary:
        rec.update(reason="record_changed", message=str(summary["refused"]))
    else:
        rec.update(reason="error", message=err.decode(errors="replace").strip()[-300:])
    return rec


def end_rollout_result(
    p: Params,
    out: dict[str, Any],
    t_start: float,
    paper_proxies: list[FaultProxy],
    record: Rollout,
    modes: dict[int, bool | None],
) -> dict[str, Any]:
    """The end of the rollout as the result records it: :attr:`EndRollout.out`, the paper's
    last claim through its proxies (when it applied, and the end of the lease it made), the
    rollout record read from the table after the traffic, and the rules each daemon reported
    then."""
    claims = [e for px in paper_proxies for e in px.events if e.get("kind") == "claim"]
    res = dict(out)
    res["paper_last_claim_s"] = (
        round(max(e["got"] for e in claims) - t_start, 3) if claims else None
    )
    res["paper_last_lease_end_s"] = (
        round(max(e["end"] for e in claims) - t_start, 3) if claims else None
    )
    res["refusals"] = sum(
        1 for a in out["attempts"] if a["exit"] not in (0, None) and not a.get("stopped")
    )
    res["record_at_end"] = asdict(record)
    res["daemons_at_end"] = {
        "off": sum(1 for m in modes.values() if m is False),
        "on": sum(1 for m in modes.values() if m is True),
        "no_answer": sum(1 for m in modes.values() if m is None),
    }
    succeeded, last = res["succeeded_s"], res["paper_last_claim_s"]
    # the scenario's premise: no claim of the paper's agent landed after end-rollout's scan
    res["paper_claim_after_end"] = None not in (succeeded, last) and last > succeeded
    res["ok"] = (
        succeeded is not None
        and succeeded <= p.duration
        and not record.paper_agents
        and not res["paper_claim_after_end"]
    )
    return res


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
        if name == "balancer" and j.get("status") not in (None, "ok"):
            s[f"status_{j['status']}"] += 1
        for k in ("freed", "expired", "duplicate_keys", "released", "lost_races", "errors",
                  "moves_planned", "moved"):  # fmt: skip
            if isinstance(j.get(k), int):
                s[k] += j[k]
    return {k: dict(v) for k, v in sorted(out.items())}


def replication_writes(path: Path) -> list[dict[str, Any]]:
    """The replicas' own writes of resource items as the replicator read them from the
    streams (``sim.replicator.audit_events``), as evidence rows: ``t`` in epoch seconds,
    ``actor``: who can write such a change (a move: the balancer; an acquisition: a daemon;
    a release: a daemon, the liberator or ras-dedupe), ``in``: the replica written."""
    who = {"move": "balancer", "acq": "daemon", "rel": "daemon/liberator/dedupe"}
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    with open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if ev.get("ev") in who:
                    out.append({**ev, "t": ev["t"] / 1000.0, "actor": who[ev["ev"]]})
    return out


def admin_writes(admin: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """rasadmin's deletes and re-adds as evidence rows (one per resource)."""
    return [
        {"t": a["t0"], "t1": a["t1"], "res": n, "actor": "admin", "action": a["action"],
         "in": a["region"], "exit": a.get("exit")}
        for a in admin
        for n in a.get("resources", [])
    ]  # fmt: skip


# ------------------------------------------------------------------------------------ run
def say(p: Params, msg: str) -> None:
    if p.log:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(p: Params) -> dict[str, Any]:
    """One chaos run; returns the result (also written to ``p.results_dir``)."""
    p.check()
    rng = random.Random(f"{p.seed}/run")
    env = child_env(one_table=not p.replicated())
    denv = daemon_env(p, env)
    work = Path(tempfile.mkdtemp(prefix="rasd-chaos-"))  # short: AF_UNIX paths <= 107 bytes
    motos: list[subprocess.Popen[bytes]] = []
    rep: subprocess.Popen[str] | None = None
    proxies: list[FaultProxy] = []
    daemons: list[Daemon] = []
    apps: list[subprocess.Popen[bytes]] = []
    jobs: Jobs | None = None
    balancer: Jobs | None = None
    admin: Admin | None = None
    end_roll: EndRollout | None = None
    events = Events()
    plan = FaultPlan(rate=p.fault_rate, hold_s=p.hold_s)
    started = time.monotonic()
    try:
        endpoints: dict[str, str] = {}
        for r in p.regions if p.replicated() else p.regions[:1]:
            proc, endpoints[r] = start_moto(env)
            motos.append(proc)
        if not p.replicated():
            endpoints = {r: endpoints[p.regions[0]] for r in p.regions}
        ddbs = {
            r: ddb_client(u, r if p.replicated() else TABLE_REGION) for r, u in endpoints.items()
        }
        home = p.regions[0]
        seed_table([ddbs[r] for r in (p.regions if p.replicated() else [home])], p)
        if p.balancer and not p.mixed:
            ddb_client(endpoints[home], home, "s3").create_bucket(Bucket=BUCKET)
        if p.replicated():
            rep = start_replicator(endpoints, p, env, work)
        say(
            p,
            f"moto {', '.join(f'{r} {u}' for r, u in endpoints.items())}; table {p.table}; "
            f"resources {p.counts()}"
            + (f"; replicated, lag {p.lag_s:g}s" if p.replicated() else "; one table"),
        )
        paper_proxies = p.paper_workers if p.mixed and p.paper_faults else 0
        upstreams = [endpoints[p.regions[i % len(p.regions)]] for i in range(p.daemons)]
        upstreams += [endpoints[home]] * paper_proxies
        trace = Trace(str(work / "trace.jsonl")) if p.trace else None
        proxies = start_proxies(upstreams, plan, p.seed, trace)
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
            start_daemon(d, p.table, denv)
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
        paper: list[subprocess.Popen[bytes]] = []
        # the paper's workers stop by themselves at the end of the rollout, if it has one
        paper_until = t_end if p.end_rollout_at is None else t_start + p.end_rollout_at
        if p.mixed:
            for i in range(p.paper_workers):
                histories.append(work / f"paper{i}.jsonl")
                endpoint = proxies[p.daemons + i].url if p.paper_faults else endpoints[home]
                cmd = [
                    sys.executable, "-m", "chaos.paper", "agent", "--app", str(p.apps + i),
                    "--region", p.regions[i % len(p.regions)], "--endpoint-url", endpoint,
                    "--table", p.table, "--out", str(histories[-1]), "--seed", str(p.seed),
                    "--keys", str(p.keys), "--until", repr(paper_until),
                    "--think-ms", str(p.think_ms), "--read-timeout", str(p.call_timeout),
                ]  # fmt: skip
                if p.paper_max_lease is not None:
                    cmd += ["--max-asked", f"{p.paper_max_lease:g}"]
                with open(work / f"paper{i}.err", "ab") as err:
                    quiet = subprocess.DEVNULL
                    paper.append(popen(cmd, env, stdin=quiet, stdout=quiet, stderr=err))
            apps += paper
        jobs = Jobs(p, endpoints, env, events)
        jobs.start()
        if p.end_rollout_at is not None:
            end_roll = EndRollout(p, endpoints[home], env, jobs, paper, daemons, t_start)
            end_roll.start()
        if p.balancer and not p.mixed:
            balancer = Jobs(p, endpoints, env, events, balancer=True)
            balancer.start()
        if p.admin and not p.mixed:
            admin = Admin(p, endpoints, env, events, work)
            admin.start()
        next_kill = time.monotonic() + p.kill_every if p.kill_every > 0 else float("inf")
        hard_stop = time.monotonic() + p.duration + 3 * p.call_timeout + 30
        load: list[float] = []  # the 1-minute load average, every 10 s
        next_load = time.monotonic()
        while time.monotonic() < hard_stop and any(a.poll() is None for a in apps):
            now = time.monotonic()
            if now >= next_kill and time.time() < t_end:
                victim = rng.choice(daemons)
                kill_group(victim.proc)
                events.kills.append(
                    {"t": round(time.time(), 3), "daemon": victim.index, "region": victim.region}
                )
                start_daemon(victim, p.table, denv)  # at once, on the same socket path
                next_kill = now + p.kill_every
            for d in daemons:  # a restart can die (e.g. during the outage): start it again
                if (
                    d.proc is not None
                    and d.proc.poll() is not None
                    and time.monotonic() - d.last_start > 1.0
                    and time.time() < t_end
                ):
                    events.restarts[str(d.index)] += 1
                    start_daemon(d, p.table, denv)
            if time.monotonic() >= next_load:
                load.append(os.getloadavg()[0])
                next_load += 10.0
            time.sleep(0.2)
        for a in apps:
            if a.poll() is None:
                kill_group(a)
        say(p, "traffic over; stopping jobs, auditing")
        for actor in (jobs, balancer, admin, end_roll):
            if actor is not None:
                actor.stop()
        plan.enabled = False
        stats = {d.index: daemon_stats(d) for d in daemons}
        ended = None
        if end_roll is not None:
            ended = end_rollout_result(
                p,
                end_roll.out,
                t_start,
                proxies[p.daemons :],
                jobs_common.read_rollout(ddbs[home], p.table),
                {d.index: daemon_rollout(d) for d in daemons},
            )
        settled = None
        if rep is not None:
            settled = replicator.settle(rep, max(1.0, p.lag_s + 0.5))

        # -- the audit
        records: list[dict[str, Any]] = []
        for h in histories:
            if h.exists():
                with open(h) as f:
                    for line in f:
                        with contextlib.suppress(ValueError):
                            records.append(json.loads(line))
        scanned_at = time.time()
        if rep is not None:
            scans = {r: scan(ddbs[r], p.table) for r in p.regions}
            table = A.replica_checks(scans, CLIENT, scanned_at)
            table["settled"] = settled
            replication = stop_replicator(rep)
        else:
            table = A.table_checks(scan(ddbs[home], p.table), CLIENT, scanned_at)
            replication = None
        made = creations(p, proxies)
        if made is not None:  # kept beside the result, for digging into a finding
            Path(p.results_dir).mkdir(parents=True, exist_ok=True)
            with open(Path(p.results_dir) / f"{p.label}-lease-events.jsonl", "w") as f:
                f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in made)
        audit = A.audit(records, plan.outage, creations=made)
        writes = replication_writes(work / "replication.jsonl") + admin_writes(events.admin)
        for name in ("double_allocations", "in_region_splits", "lost_leases"):
            A.evidence(audit["examples"][name], writes)
        job_counts = jobs_summary(events.jobs)
        result = {
            "label": p.label,
            "params": asdict(p),
            "started": t_start,
            "outage": list(outage) if p.outage_s > 0 else None,
            "seconds": round(time.monotonic() - started, 1),
            "audit": audit,
            "table": table,
            "replication": replication,
            "actors": actors(job_counts, events.admin, writes if rep is not None else None, audit),
            "kills": len(events.kills),
            "kill_events": events.kills,
            "unplanned_restarts": dict(events.restarts),
            "daemon_starts": {d.index: d.starts for d in daemons},
            "jobs": job_counts,
            "job_events": events.jobs,
            "admin_events": events.admin,
            "proxies": totals(proxies),
            "daemon_counters": _sum_counters(stats),
            "load": _load(load),
            "end_rollout": ended,
        }
        result["ok"] = violations(result) == 0
        write(p, result)
        return result
    finally:
        for actor in (jobs, balancer, admin, end_roll):
            if actor is not None:
                actor.stop()
        for a in apps:
            kill_group(a)
        for d in daemons:
            kill_group(d.proc)
        for px in proxies:
            px.stop()
        if proxies and proxies[0].trace is not None:
            proxies[0].trace.close()
        if rep is not None:
            kill_group(rep)
        for moto in motos:
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


def _load(samples: list[float]) -> dict[str, Any]:
    """The machine's 1-minute load average during the traffic: lowest, mean, highest."""
    if not samples:
        return {"samples": 0}
    mean = sum(samples) / len(samples)
    return {"samples": len(samples), "min": round(min(samples), 2), "mean": round(mean, 2),
            "max": round(max(samples), 2)}  # fmt: skip


def _sum_counters(stats: dict[int, dict[str, int]]) -> dict[str, int]:
    """The live daemons' counters since their last start (a killed daemon's are gone)."""
    total: Counter[str] = Counter()
    for s in stats.values():
        total.update({k: v for k, v in s.items() if isinstance(v, int)})
    keep = ("lease.", "acq.", "ddb.", "cache.", "prefetch.")
    return {k: v for k, v in sorted(total.items()) if k.startswith(keep)}


def actors(
    jobs: dict[str, Any],
    admin: list[dict[str, Any]],
    writes: list[dict[str, Any]] | None,
    audit: dict[str, Any],
) -> dict[str, Any]:
    """What each actor besides the daemons did: the balancer's runs and moves (as it counts
    them, and as the replicas' streams show them: ``writes``, None without replicas),
    rasadmin's actions, and the get_lease calls refused while a redefinition's shorter max
    lease was in force."""
    bal: dict[str, Any] = dict(jobs.get("balancer", {}))
    moves = None if writes is None else [w for w in writes if w.get("ev") == "move"]
    bal["moves_in_streams"] = None if moves is None else len(moves)
    bal["leased_moves_in_streams"] = None if moves is None else sum(1 for w in moves if w["leased"])
    return {
        "balancer": bal,
        "admin": admin_summary(admin),
        "refused_beyond_max_lease": audit.get("refused_beyond_max_lease", 0),
    }


def violations(result: dict[str, Any]) -> int:
    a, t = result["audit"], result["table"]
    leased_moves = result.get("actors", {}).get("balancer", {}).get("leased_moves_in_streams") or 0
    ended = result.get("end_rollout")
    return int(
        a["double_allocations"]
        + a["in_region_splits"]
        + a["lost_leases"]
        + A.table_violations(t)
        + leased_moves
        + (ended is not None and not ended["ok"])
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
    load = result.get("load") or {}
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
    rep = result.get("replication")
    if rep is not None:
        rows += [
            ("replicas: resource leased to 2 keys", t["leased_to_two_keys_across_replicas"]),
            ("replicas: region differs / items differ", f"{t['regions_disagree']} / "
             f"{t['items_differ']} (settled {t.get('settled')})"),
            ("replication: lag set / p50 / p99 (s)", f"{rep.get('lag_s')} / "
             f"{rep.get('achieved_lag_p50_s')} / {rep.get('achieved_lag_p99_s')}"),
            ("replication: applied / LWW discarded / conflicts", f"{rep.get('applied')} / "
             f"{rep.get('lww_discarded')} / {rep.get('conflicts')}"),
        ]  # fmt: skip
    act = result.get("actors", {})
    bal = act.get("balancer", {})
    if bal.get("runs"):
        rows.append(
            ("balancer: runs / moved / in streams / leased", f"{bal.get('runs')} / "
             f"{bal.get('moved', 0)} / {bal.get('moves_in_streams')} / "
             f"{bal.get('leased_moves_in_streams')}")
        )  # fmt: skip
    if act.get("admin"):
        rows.append(("rasadmin", _codes(act["admin"], keep_ok=True)))
        rows.append(("refused: beyond the max lease", act.get("refused_beyond_max_lease")))
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
    ended = result.get("end_rollout")
    if ended:
        rows += end_rollout_rows(ended)
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
        (
            "load average (1 min): min / mean / max",
            " / ".join(str(load.get(k, "-")) for k in ("min", "mean", "max")),
        ),
        ("verdict", "PASS" if result["ok"] else "FAIL"),
    ]
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{w}}  {value}" for name, value in rows)


def end_rollout_rows(e: dict[str, Any]) -> list[tuple[str, Any]]:
    """The end of the rollout in the report; times in seconds into the traffic."""
    rec = e["record_at_end"]
    at_end = e["daemons_at_end"]
    return [
        ("end-rollout at (s): paper workers / liberator stopped",
         f"{e['at_s']:g}: {e.get('paper_workers_stopped_s')} (killed "
         f"{e.get('paper_workers_killed')}) / {e.get('paper_liberator_stopped_s')}"),
        ("  paper's last claim applied / its lease's end (s)",
         f"{e['paper_last_claim_s']} / {e['paper_last_lease_end_s']}"),
        ("  end-rollout attempts / refused / succeeded at (s)",
         f"{len(e['attempts'])} / {e['refusals']} / {e['succeeded_s']}"),
        ("  rollout record at the end", ("on" if rec["paper_agents"] else "off")
         + f" (version {rec['version']}, by {rec['by']}, {rec['why']})"),
        ("  daemons on the fast rules: all by (s); at the end",
         f"{e['all_daemons_off_s']}; off {at_end['off']}, on {at_end['on']}, "
         f"no answer {at_end['no_answer']}"),
    ]  # fmt: skip


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
    ap.add_argument(
        "--paper-max-lease",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the longest lease the paper's workers ask for (default: the apps' lengths, up "
        "to 60 s)",
    )
    ap.add_argument(
        "--end-rollout-at",
        type=float,
        default=None,
        metavar="SECONDS",
        help="--mixed: at this time into the traffic the paper's workers and liberator stop, "
        "then `rasadmin end-rollout` runs every --end-rollout-every seconds until it succeeds "
        "(the run fails if it never does); the daemons serve throughout",
    )
    ap.add_argument("--end-rollout-every", type=float, default=d.end_rollout_every)
    ap.add_argument(
        "--pool-refresh",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the daemons' pool_refresh: how soon they follow the rollout record (default: "
        f"theirs, 30 s; with --end-rollout-at, {END_ROLLOUT_POOL_REFRESH:g} s)",
    )
    ap.add_argument(
        "--one-table",
        action="store_true",
        help="one moto table for both regions, no replicator (--mixed always runs so)",
    )
    ap.add_argument("--lag", type=float, default=d.lag_s, help="replication lag, seconds")
    ap.add_argument(
        "--resources",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=d.resources,
        metavar="N1,N2",
        help="free resources of each region at the start (default: --resources-per-region)",
    )
    ap.add_argument("--no-balancer", action="store_true", help="no ras-balancer on the loop")
    ap.add_argument("--balancer-interval", type=float, default=d.balancer_interval)
    ap.add_argument("--balancer-horizon", type=float, default=d.balancer_horizon)
    ap.add_argument("--balancer-safety", type=float, default=d.balancer_safety)
    ap.add_argument("--balancer-floor", type=int, default=d.balancer_floor)
    ap.add_argument("--no-admin", action="store_true", help="no rasadmin on a loop")
    ap.add_argument("--admin-every", type=float, default=d.admin_every)
    return ap


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through run()'s finally: children are killed


def params(argv: list[str] | None = None) -> Params:
    """The run's parameters from the command line (argparse's exit on bad usage)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    pool_refresh = args.pool_refresh
    if args.end_rollout_at is not None:
        if not args.mixed:
            ap.error("--end-rollout-at: a mixed fleet only (--mixed)")
        if not 0 < args.end_rollout_at < args.duration:
            ap.error("--end-rollout-at: within the traffic (0 < SECONDS < --duration)")
        if pool_refresh is None:
            pool_refresh = END_ROLLOUT_POOL_REFRESH
    label = ("mixed-" if args.mixed else "") + ("endroll-" if args.end_rollout_at else "")
    return Params(
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
        label=args.label or label + ("full" if args.duration >= 300 else "short"),
        results_dir=args.results_dir,
        keep_workdir=args.keep_workdir,
        trace=args.trace,
        mixed=args.mixed,
        paper_workers=args.paper_workers,
        paper_faults=not args.no_paper_faults,
        paper_liberator_grace=args.paper_liberator_grace,
        paper_max_lease=args.paper_max_lease,
        end_rollout_at=args.end_rollout_at,
        end_rollout_every=args.end_rollout_every,
        pool_refresh=pool_refresh,
        replicas=not args.one_table,
        lag_s=args.lag,
        resources=args.resources,
        balancer=not args.no_balancer,
        balancer_interval=args.balancer_interval,
        balancer_horizon=args.balancer_horizon,
        balancer_safety=args.balancer_safety,
        balancer_floor=args.balancer_floor,
        admin=not args.no_admin,
        admin_every=args.admin_every,
    )


def main(argv: list[str] | None = None) -> int:
    p = params(argv)
    signal.signal(signal.SIGTERM, _terminate)
    result = run(p)
    print(table(result))
    print(f"result: {result['path']}")
    return 0 if result["ok"] else 1

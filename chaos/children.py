"""The chaos run's children on the shared harness (fleet/): their environment, the replicas'
clients and their seeding, the replicator, the daemons (each restarted on its socket after
every kill -9)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rasd_client
from fleet import daemons, procs, tables
from fleet import replicator as fleet_replicator
from sim import replicator

from .params import CLIENT, POOL, TABLE_REGION, Params


@dataclass
class Daemon:
    """One daemon of the run, behind its proxy; restarted on the same socket after a kill."""

    index: int
    region: str
    socket: str
    proxy_url: str
    log: str
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    last_start: float = 0.0


def child_env(one_table: bool) -> dict[str, str]:
    """Dummy credentials, no real AWS. ``one_table``: AWS_REGION pinned so that daemons and
    jobs of both RAS regions share moto's one us-east-1 table. Else no region is set: every
    daemon and job signs for its own RAS region, whose replica (a moto server of its own)
    keeps the table in that region."""
    pinned = {"AWS_REGION": TABLE_REGION, "AWS_DEFAULT_REGION": TABLE_REGION} if one_table else {}
    return procs.child_env(repo_on_path=True, **pinned)


def popen(cmd: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[bytes]:
    """A child of the run, leading a process group of its own (``fleet.procs.kill_group``)."""
    proc: subprocess.Popen[bytes] = procs.popen(cmd, env, group=True, **kw)
    return proc


def ddb_client(url: str, region: str = TABLE_REGION, service: str = "dynamodb") -> Any:
    return tables.client(url, region, service, read_timeout=30)


def seed_table(ddbs: list[Any], p: Params) -> dict[str, list[str]]:
    """The table, the pool and the resources, the same items (same timestamps) in every
    replica of ``ddbs``: a global table's state before the run. The mixed fleet's table is in
    rollout mode (the paper's agent writes it)."""
    now_us = time.time_ns() // 1000
    names: dict[str, list[str]] = {}
    for region, n in p.counts().items():
        prefix = region.split("-")[0]
        names[region] = [f"{prefix}-{i:04d}" for i in range(n)]
    rollout = ("chaos", "mixed fleet") if p.mixed else None
    for ddb in ddbs:
        tables.seed_table(
            ddb, p.table, CLIENT, POOL, names, now_us=now_us, rollout=rollout,
            outage_budget=(p.outage_budget or 0.0, p.pool_quarantine()),
        )  # fmt: skip
    return names


def start_replicator(
    endpoints: dict[str, str], p: Params, env: dict[str, str], work: Path
) -> subprocess.Popen[str]:
    """``sim.replicator`` between the replicas, from the streams' current ends."""
    cmd = replicator.command(endpoints, p.table, p.lag_s, str(work / "replication.jsonl"))
    return fleet_replicator.start_replicator(cmd, env, work / "replicator.log", group=True)


def stop_replicator(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Close its stdin (its signal to stop); its summary (one JSON line on stdout)."""
    out = fleet_replicator.stop_replicator(proc)
    if out is None:
        return {"error": "did not stop"}
    return procs.summary_line(out) or {"error": "no summary"}


def daemon_env(p: Params, env: dict[str, str]) -> dict[str, str]:
    """The daemons' environment: the run's, and its pool_refresh when it sets one."""
    if p.pool_refresh is None:
        return env
    return {**env, "RASD_POOL_REFRESH": f"{p.pool_refresh:g}"}


def start_daemon(d: Daemon, table: str, env: dict[str, str]) -> None:
    """(Re)start ``d`` on its socket, its log appended to."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(d.socket)
    d.proc = daemons.start_daemon(d.socket, table, d.region, d.proxy_url, env, d.log, group=True)
    d.starts += 1
    d.last_start = time.monotonic()


def wait_ready(d: Daemon, timeout: float) -> bool:
    return daemons.wait_ready(d.socket, d.proc, timeout)


def daemon_rollout(d: Daemon) -> bool | None:
    """The rules the daemon runs (its ``stats``' ``rollout``): True rollout mode, False the
    fast rules, None no answer (restarting, or still starting)."""
    try:
        mode = daemons.stats(d.socket).get("rollout")
    except rasd_client.RasdError:
        return None
    return mode if isinstance(mode, bool) else None


def daemon_clock(d: Daemon) -> dict[str, Any]:
    """What the daemon's ``stats`` say of its clock (empty: no answer)."""
    try:
        clock = daemons.stats(d.socket).get("clock")
    except rasd_client.RasdError:
        return {}
    return clock if isinstance(clock, dict) else {}


def daemon_stats(d: Daemon) -> dict[str, int]:
    return daemons.counters(d.socket)

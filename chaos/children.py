"""The chaos run's child processes and its replicas: the environment, process groups, moto's
servers, the table as seeded in every replica, the replicator, the daemons."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config as BotoConfig

import rasd_client
from rasd.core import schema
from rasd.core.rollout import Rollout
from rasd_jobs import common as jobs_common
from sim import replicator

from .params import CLIENT, POOL, TABLE_REGION, Params

REPO = Path(__file__).resolve().parents[1]


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

"""kill -9 under load, restart, and an audit of the table.

Two daemon processes (``rasd serve``) share a pool of 150 on moto's server; four client
processes (two per daemon) hammer get_lease over 100 keys, revealing new keys as they go so
that acquisitions are under way all along. Mid-run one daemon is killed with SIGKILL (no
drain, no goodbye) and restarted on the same socket path; the clients carry on. The daemon
keeps nothing DynamoDB does not (docs/design.md, "Crash safety"), so afterwards:

* no lease is lost: every lease a client was handed still maps its key in the table;
* no resource is handed to two keys, and each key holds exactly one resource in the region;
* calls that hit the dead daemon fail with UNAVAILABLE (counted), nothing else fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from tests.helpers.fleet import audit, start_daemon
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
POOL, KEYS, SUCCESSES = 150, 100, 1000

#: A client process: SUCCESSES good answers on key-000..key-099, reaching further into the key
#: space as it goes (new keys keep appearing). Clients of daemon 0 walk the keys up from 0,
#: clients of daemon 1 down from 99: they meet (and share keys) only in the second half of the
#: run, after the kill, so the kill never lands in the middle of a two-daemon race for one new
#: key (that window is tested, deterministically, in test_faults.py). An error is counted and
#: followed by a 10 ms pause, as a caller backing off would. Prints one JSON line per
#: (key, resource) seen, then a summary line.
WORKER = """
import json, random, sys, time
from collections import Counter
from datetime import timedelta
import rasd_client

sock, seed, successes, nkeys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
seen = {}
errors = Counter()
ok = 0
while ok < successes and sum(errors.values()) < 5000:
    i = rng.randrange(min(nkeys, 5 + ok // 8))
    key = f"key-{i if seed % 2 == 0 else nkeys - 1 - i:03d}"
    try:
        lease = rasd_client.get_lease(
            "demo", "default", key, timedelta(hours=1), socket_path=sock, timeout=5.0
        )
    except rasd_client.RasdError as exc:
        errors[exc.code] += 1
        time.sleep(0.01)
        continue
    ok += 1
    k = (key, lease.resource)
    n, version = seen.get(k, (0, 0))
    seen[k] = (n + 1, max(version, lease.version))
for (key, resource), (n, version) in seen.items():
    print(json.dumps({"key": key, "resource": resource, "version": version, "w": seed}))
print(json.dumps({"summary": {"ok": ok, "errors": dict(errors)}}), flush=True)
"""


def counters(sock: str) -> dict[str, int]:
    try:
        c: dict[str, int] = rasd_client.call_raw("stats", socket_path=sock, timeout=2)["counters"]
        return c
    except rasd_client.RasdError:
        return {}


def test_kill_9_under_load_loses_no_lease(ddb: Any, table: str, moto_endpoint: str) -> None:
    """SIGKILL of one of two daemons mid-run, then a restart on the same socket: no lease a
    client was handed is lost or doubled, each key holds exactly one resource, and the only
    failures are UNAVAILABLE answers for calls that reached the dead daemon."""
    seed_pool(ddb, table, count=POOL)
    tmp = Path(tempfile.mkdtemp(prefix="rasd-k-"))
    socks = [str(tmp / f"d{i}.sock") for i in range(2)]
    daemons = [start_daemon(s, table, moto_endpoint) for s in socks]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, socks[i % 2], str(i), str(SUCCESSES), str(KEYS)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for i in range(4)
    ]
    try:
        for _ in range(3000):  # mid-run: the victim has served a good share of its clients
            if counters(socks[0]).get("req.total", 0) >= 400:
                break
            time.sleep(0.01)
        killed_after = counters(socks[0])
        daemons[0].kill()
        assert daemons[0].wait(timeout=10) == -9
        daemons[0] = start_daemon(socks[0], table, moto_endpoint)
        results: list[dict[str, Any]] = []
        summaries: list[dict[str, Any]] = []
        for w in workers:
            out, _ = w.communicate(timeout=240)
            assert w.returncode == 0
            for line in out.splitlines():
                row = json.loads(line)
                (summaries if "summary" in row else results).append(row.get("summary", row))
        after = [counters(s) for s in socks]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        for p in daemons:
            p.terminate()
        for p in daemons:
            p.wait(timeout=30)

    errors: Counter[str] = Counter()
    for s in summaries:
        errors.update(s["errors"])
    calls = sum(s["ok"] for s in summaries) + sum(errors.values())
    shared = {r["key"] for r in results if r["w"] % 2} & {
        r["key"] for r in results if r["w"] % 2 == 0
    }
    print(
        f"kill -9: {len(shared)} of {len({r['key'] for r in results})} keys served by both "
        "daemons; "
        f"{calls} calls, {sum(s['ok'] for s in summaries)} ok, failed {dict(errors)}; "
        f"victim killed after {killed_after.get('req.total', 0)} requests "
        f"({killed_after.get('lease.new', 0)} new leases); after restart it served "
        f"{after[0].get('req.total', 0)} requests, the survivor {after[1].get('req.total', 0)}"
    )
    assert len(summaries) == 4 and all(s["ok"] == SUCCESSES for s in summaries), summaries
    assert set(errors) <= {"UNAVAILABLE"}, errors
    assert shared, "the two daemons' clients never shared a key"
    summary = audit(ddb, table, results, "us-east-1")
    handed = {r["key"] for r in results}
    assert summary["keys"] == len(handed), "a key that was handed a lease holds none, or more"
    assert summary["leased"] == len(handed), "a leased resource no client ever asked for"
    resources: dict[str, set[str]] = {}
    for r in results:
        resources.setdefault(r["key"], set()).add(r["resource"])
    two = {k: v for k, v in resources.items() if len(v) > 1}
    assert not two, f"keys handed two different resources: {two}"

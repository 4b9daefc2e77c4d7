"""Many daemons, many client processes, one pool; then an audit of the table.

3 daemon processes (``rasd serve``) share one table on moto's server; 8 client processes make
2000 get_lease calls over 300 keys from a pool of 400. Afterwards the table must show: no key
holding two resources in the region, and every lease a client was handed matching the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from rasd.core import lease as L
from rasd.core import serialize as S
from rasd.core import writes as W
from rasd_jobs import liberator
from tests.conftest import scan_all, seed_pool

pytestmark = [pytest.mark.integration, pytest.mark.concurrency]

ROOT = Path(__file__).resolve().parents[2]


def start_daemon(sock: str, table: str, endpoint: str, region: str = "us-east-1") -> Any:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rasd",
            "serve",
            "--socket",
            sock,
            "--table",
            table,
            "--region",
            region,
            "--endpoint-url",
            endpoint,
            "--log-level",
            "warning",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(300):
        if proc.poll() is not None:
            raise AssertionError(f"daemon died: {proc.stderr.read() if proc.stderr else ''}")
        try:
            # ping answers ready=False while the daemon is still starting
            if rasd_client.call_raw("ping", socket_path=sock, timeout=1.0)["ready"]:
                return proc
        except rasd_client.RasdError:
            pass
        time.sleep(0.1)
    raise AssertionError("daemon never became ready")


def audit(ddb: Any, table: str, results: list[dict[str, Any]], region: str) -> dict[str, int]:
    """The table against what clients were answered (docs/design.md, I1 and I2).

    Every client answer must be the lease its key's mapping names, held in the table by that
    key; no resource may have been answered to two keys. A held resource that no mapping
    names is an orphan (an acquisition whose outcome was lost): never answered to anyone,
    and freed by the liberator's orphan repair, after which no key holds two resources.
    """
    items = [W.item_from_av(it) for it in scan_all(ddb, table)]
    rows = [S.resource_from(it) for it in items if it["client_id"] == "demo"]
    maps = {
        (m.key, m.region): m
        for m in (S.mapping_from(it) for it in items if S.is_mapping_pk(str(it["client_id"])))
    }
    by_resource = {r.resource: r for r in rows}
    named: dict[str, str] = {}  # key -> the resource its mapping names (and that it holds)
    orphans = []
    for r in rows:
        if r.key is not None:
            assert r.lease_available is None, f"{r.resource} is both leased and available"
            m = maps.get((r.key, r.region))
            if m is not None and m.token == r.holder and m.resource == r.resource:
                if r.region == region:
                    assert r.key not in named, f"{r.key} has two leases in {region}"
                    named[r.key] = r.resource
            else:
                orphans.append(r)
        else:
            free = r.lease_available is not None or r.quarantine_until is not None
            assert free, f"{r.resource} neither leased nor free"
    seen_by_clients: dict[str, set[str]] = defaultdict(set)
    for res in results:
        if "error" in res:
            continue
        row = by_resource[res["resource"]]
        assert row.key == res["key"], f"client got {res}, table says {row}"
        assert named.get(res["key"]) == res["resource"], f"client got {res}, not its lease"
        assert row.version >= res["version"]
        seen_by_clients[res["resource"]].add(res["key"])
    two = {r: ks for r, ks in seen_by_clients.items() if len(ks) > 1}
    assert not two, f"resources handed to two keys: {two}"
    answered = {res["resource"] for res in results if "error" not in res}
    assert not answered & {o.resource for o in orphans}, "an orphan was answered"
    # The liberator's orphan repair frees what the daemons' give-backs did not.
    now = int(time.time() * L.US)
    got = liberator.run(
        ddb, liberator.Options(table=table, region=None, now_us=now, orphan_age_us=0)
    )
    assert got["orphans_freed"] == len(orphans) and got["errors"] == 0, got
    held: dict[str, list[str]] = defaultdict(list)
    for it in scan_all(ddb, table):
        r = S.item_from_ddb(it) if it["client_id"]["S"] == "demo" else None
        if r is not None and r.key is not None and r.region == region:
            held[r.key].append(r.resource)
    dup = {k: v for k, v in held.items() if len(v) > 1}
    assert not dup, f"keys holding several resources in {region}: {dup}"
    return {"leased": len(named), "keys": len(named), "orphans": len(orphans)}


@pytest.mark.slow
def test_three_daemons_eight_processes(ddb: Any, table: str, moto_endpoint: str) -> None:
    """2000 calls, 300 keys, pool of 400, 3 daemons, 8 processes: the table stays exact."""
    seed_pool(ddb, table, count=400)
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="rasd-c-"))
    socks = [str(tmp / f"d{i}.sock") for i in range(3)]
    daemons = [start_daemon(s, table, moto_endpoint) for s in socks]
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration._worker",
                    socks[i % 3],
                    str(i),
                    "250",
                    "300",
                ],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for i in range(8)
        ]
        results: list[dict[str, Any]] = []
        for w in workers:
            out, _ = w.communicate(timeout=240)
            assert w.returncode == 0
            results.extend(json.loads(line) for line in out.splitlines())
        stats = [rasd_client.call_raw("stats", socket_path=s)["counters"] for s in socks]
    finally:
        for p in daemons:
            p.terminate()
        for p in daemons:
            p.wait(timeout=30)
    assert len(results) == 2000
    errors = [r for r in results if "error" in r]
    assert not errors, errors[:5]
    summary = audit(ddb, table, results, "us-east-1")
    requested = {r["key"] for r in results}
    assert summary["keys"] == len(requested)
    assert summary["leased"] == len(requested)
    new = sum(r["new"] for r in results)
    assert new == len(requested), "each key was acquired exactly once"
    assert sum(s.get("lease.new", 0) for s in stats) == len(requested)
    print(
        "waits",
        sum(s.get("acq.waits", 0) for s in stats),
        "gave_back",
        sum(s.get("acq.gave_back", 0) for s in stats),
        "conflicts",
        sum(s.get("prefetch.conflicts", 0) for s in stats),
        "orphans",
        summary["orphans"],
    )

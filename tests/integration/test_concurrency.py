"""Many daemons, many client processes, one pool; then an audit of the table.

3 daemon processes (``rasd serve``) share one table on moto's server; 8 client processes make
1200 get_lease calls over 180 keys from a pool of 240. Afterwards the table must show: no key
holding two resources in the region, and every lease a client was handed matching the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from tests.helpers.fleet import audit, start_daemon
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]


def test_three_daemons_eight_processes(ddb: Any, table: str, moto_endpoint: str) -> None:
    """1200 calls, 180 keys, pool of 240, 3 daemons, 8 processes: the table stays exact."""
    seed_pool(ddb, table, count=240)
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
                    "150",
                    "180",
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
    assert len(results) == 1200
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

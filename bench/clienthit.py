"""CPU of one cached ``get_lease`` in the client, answered from the hit table:
``python -m bench.clienthit``.

A table made by the daemon's own writer (``rasd.daemon.published``) with 1,000 answers,
handed to this process's client state as the daemon hands it (the fd mapped read-only, a
holder connection that stays open and silent: a socketpair here), then
``rasd_client.get_lease`` on random keys of it, as an app calls it (a ``timedelta``).
Median CPU per call over 15 rounds, and the wall time of one call (p50, p99). The daemon
spends nothing on these calls: no frame reaches it.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import rasd_client
from rasd.core.lease import US, Lease
from rasd.daemon.published import Table as Writer
from rasd_client import _table

KEYS = 1000
PATH = "/nonexistent/rasd-bench.sock"


def setup() -> list[str]:
    """This process's client state holding one table of KEYS answers, valid for an hour."""
    writer = Writer("bench", 1 << 12, 1 << 12)
    now = time.monotonic()
    end_us = time.time_ns() // 1000 + 3600 * US
    keys = [f"key-{i:04d}" for i in range(KEYS)]
    for i, k in enumerate(keys):
        lease = Lease("bench", "p", k, f"res-{i:05d}", "us-east-1", end_us, 1, token="t")
        writer.put("p", k, now + 3600, now + 3600, end_us, 86_400 * US, lease)
    ours, _theirs = socket.socketpair()
    holder = _table._Holder(ours)
    holder.tables["bench"] = _table.Table(mmap.mmap(writer.fd, 0, mmap.MAP_SHARED, mmap.PROT_READ))
    tables = _table.Tables()
    tables.holders[PATH] = holder
    _table.current = tables
    setup.keep = (writer, _theirs)  # type: ignore[attr-defined]
    return keys


def rounds(k: int = 15, n: int = 20_000, timed: int = 5_000) -> dict[str, Any]:
    keys = setup()
    rng = random.Random(1)
    ask = [rng.choice(keys) for _ in range(n)]
    ten = timedelta(minutes=10)
    get = rasd_client.get_lease
    cpu = []
    for _ in range(k):
        t0 = time.process_time()
        for key in ask:
            get("bench", "p", key, ten, socket_path=PATH)
        cpu.append((time.process_time() - t0) / n * 1e6)
    walls = []
    for key in ask[:timed]:
        t0 = time.perf_counter_ns()
        get("bench", "p", key, ten, socket_path=PATH)
        walls.append((time.perf_counter_ns() - t0) / 1000)
    walls.sort()
    assert _table.current.hits == k * n + timed, "a call was not answered from the table"
    return {
        "calls_per_round": n,
        "cpu_us_median": round(statistics.median(cpu), 3),
        "cpu_us_min": round(min(cpu), 3),
        "cpu_us_max": round(max(cpu), 3),
        "wall_us_p50": round(walls[len(walls) // 2], 3),
        "wall_us_p99": round(walls[int(len(walls) * 0.99)], 3),
    }


def main() -> int:
    """Prints the figures and writes them to ``bench/results/<stamp>-clienthit.json``."""
    out = {"what": "rasd_client.get_lease from the hit table", **rounds()}
    out["load_1min"] = round(os.getloadavg()[0], 2)
    text = json.dumps(out, indent=2)
    print(text)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(__file__).parent / "results" / f"{stamp}-clienthit.json"
    path.write_text(text + "\n")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

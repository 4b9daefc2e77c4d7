"""A long outage of every backend, measured as an operator would (``python -m chaos.outage``).

Daemons (processes, each behind its fault proxy, on one moto table) serve a pool with an
outage budget and a pool without one. Before the outage, ``--keys`` keys of each pool are
leased for an hour and asked once on every daemon (each daemon confirmed them). Then every
call of every proxy fails (half the connections closed, half HTTP 500) for ``--outage-for``
seconds, while each daemon is asked every key of both pools, and one new key of the budget
pool, about once a second. Then the backend is back, and each daemon is asked a new key
until it answers.

What it reports (``chaos/results/<time>-outage.json``, and a summary on stdout):

* ``budget``: calls for the budget pool's keys during the outage and how many were answered
  with the key's lease (the issue's bar: all of them, within the budget);
* ``plain``: the same for the pool without a budget, by phase (within S of the outage's start,
  after it): the behaviour before budgets existed;
* ``new_keys``: new keys during the outage, their error codes and the slowest answer
  against their deadline;
* ``recovery_s``: per daemon, seconds from the backend's return to its first new lease.
Exit 0 when every budget call with its lease's time left was answered, every new key failed
with UNAVAILABLE within its deadline, and every daemon recovered within 30 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import rasd_client
from fleet import tables
from fleet.backends import Moto
from fleet.procs import kill_group
from fleet.proxy import FaultPlan
from rasd.config import Config
from rasd.core import schema

from .children import Daemon, child_env, ddb_client, start_daemon, wait_ready
from .params import CLIENT, RESULTS, TABLE_REGION
from .wiretap import start_proxies

TABLE = "rasd-outage"
BUDGET_POOL, PLAIN_POOL = "budget", "plain"


def _ask(d: Daemon, pool: str, key: str, timeout: float) -> tuple[str | None, str | None, float]:
    """(resource, error code, seconds) of one get_lease of an hour."""
    t0 = time.monotonic()
    try:
        lease = rasd_client.get_lease(
            CLIENT, pool, key, timedelta(hours=1), timeout=timeout, socket_path=d.socket
        )
        return lease.resource, None, time.monotonic() - t0
    except rasd_client.RasdError as exc:
        return None, exc.code, time.monotonic() - t0


def run(a: argparse.Namespace) -> dict[str, Any]:
    cfg = Config()
    quarantine = a.budget + cfg.max_clock_skew + cfg.replication_lag
    env = child_env(one_table=True)
    work = Path(tempfile.mkdtemp(prefix="rasd-outage-"))
    daemons: list[Daemon] = []
    with Moto(env) as moto:
        ddb = ddb_client(moto.endpoint)
        names = {TABLE_REGION: [f"b{i:04d}" for i in range(a.keys * 3)]}
        tables.seed_table(ddb, TABLE, CLIENT, BUDGET_POOL, names, max_lease_s=7200,
                          outage_budget=(a.budget, quarantine))  # fmt: skip
        schema.put_pool(ddb, TABLE, CLIENT, PLAIN_POOL, 7200)
        plain_names = [f"p{i:04d}" for i in range(a.keys * 3)]
        schema.add_resources(ddb, TABLE, CLIENT, PLAIN_POOL, TABLE_REGION, plain_names)
        plan = FaultPlan(rate=0.0, enabled=True)
        proxies = start_proxies([moto.endpoint] * a.daemons, plan, a.seed)
        try:
            for i in range(a.daemons):
                d = Daemon(i, TABLE_REGION, str(work / f"d{i}.sock"), proxies[i].url,
                           str(work / f"d{i}.log"))  # fmt: skip
                start_daemon(d, TABLE, env)
                daemons.append(d)
            for d in daemons:
                if not wait_ready(d, 60):
                    raise RuntimeError(f"daemon {d.index} never became ready; see {d.log}")
            keys = [f"k{i}" for i in range(a.keys)]
            held: dict[tuple[str, str], str] = {}
            for pool in (BUDGET_POOL, PLAIN_POOL):
                for k in keys:
                    for d in daemons:
                        res, code, _ = _ask(d, pool, k, 10.0)
                        if res is None:
                            raise RuntimeError(f"{pool}/{k} on d{d.index} before: {code}")
                        assert held.setdefault((pool, k), res) == res
            start = time.time()
            plan.outage = (start, start + a.outage_for)
            print(f"outage of every backend for {a.outage_for:g}s", file=sys.stderr)
            calls: Counter[str] = Counter()
            new_codes: Counter[str] = Counter()
            new_slowest = 0.0
            n = 0
            while time.time() < start + a.outage_for - 1.0:
                tick = time.time()
                since = tick - start
                for d in daemons:
                    for pool in (BUDGET_POOL, PLAIN_POOL):
                        phase = "within_S" if since < cfg.confirm_interval else "past_S"
                        for k in keys:
                            res, code, _ = _ask(d, pool, k, a.timeout)
                            ok = res == held[(pool, k)]
                            calls[f"{pool}.{phase}.{'answered' if ok else code or 'other'}"] += 1
                    n += 1
                    _, code, took = _ask(d, BUDGET_POOL, f"new-{n}", a.timeout)
                    new_codes[code or "answered"] += 1
                    new_slowest = max(new_slowest, took)
                time.sleep(max(0.0, 1.0 - (time.time() - tick)))
            while time.time() < start + a.outage_for:
                time.sleep(0.05)
            back = time.time()
            recovery: dict[int, float | None] = {}
            for d in daemons:
                recovery[d.index] = None
                while time.time() < back + 60:
                    res, _, _ = _ask(d, BUDGET_POOL, f"after-{d.index}", 1.0)
                    if res is not None:
                        recovery[d.index] = round(time.time() - back, 2)
                        break
                    time.sleep(0.1)
        finally:
            for d in daemons:
                if d.proc is not None:
                    kill_group(d.proc)
            for px in proxies:
                px.stop()
    shutil.rmtree(work, ignore_errors=True)
    budget_calls = {k.split(".", 1)[1]: v for k, v in calls.items() if k.startswith(BUDGET_POOL)}
    plain_calls = {k.split(".", 1)[1]: v for k, v in calls.items() if k.startswith(PLAIN_POOL)}
    answered = sum(v for k, v in budget_calls.items() if k.endswith(".answered"))
    total = sum(budget_calls.values())
    ok = (
        answered == total
        and set(new_codes) == {"UNAVAILABLE"}
        and new_slowest < a.timeout
        and all(r is not None and r < 30 for r in recovery.values())
    )
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "daemons": a.daemons,
        "keys": a.keys,
        "outage_s": a.outage_for,
        "budget_s": a.budget,
        "pool_quarantine_s": quarantine,
        "confirm_interval_s": cfg.confirm_interval,
        "call_timeout_s": a.timeout,
        "budget": {"calls": total, "answered": answered, "by_outcome": budget_calls},
        "plain": plain_calls,
        "new_keys": {"codes": dict(new_codes), "slowest_s": round(new_slowest, 3)},
        "recovery_s": recovery,
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos.outage", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--daemons", type=int, default=3)
    ap.add_argument("--keys", type=int, default=20, help="keys of each pool (default 20)")
    ap.add_argument("--outage-for", type=float, default=300.0, metavar="SECONDS")
    ap.add_argument("--budget", type=float, default=600.0, metavar="SECONDS")
    ap.add_argument("--timeout", type=float, default=1.0, help="each call's deadline")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    out = run(a)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{time.strftime('%Y%m%d-%H%M%S')}-outage.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("budget", "plain", "new_keys", "recovery_s", "ok")}))
    print(f"written to {path}", file=sys.stderr)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Where the time of a new lease goes: a timeline from the proxy's trace, plus a CPU profile.

    python -m bench.profile [--backend moto|dynalite] [--n 60] [--pyinstrument]

Starts a backend, the delay proxy with ``--trace`` (one JSON line per DynamoDB request with
perf_counter stamps: arrived, sent upstream, answered upstream, delivered), one daemon, and
then acquires ``n`` new keys one at a time, 50 ms apart, stamping each call in the client.
On Linux ``time.perf_counter`` is CLOCK_MONOTONIC, so the client's and the proxy's stamps
share one clock and each acquisition can be cut into:

* ``pre``:      client call -> the daemon's first DynamoDB request reaches the proxy
* ``query``:    the leased_resources Query at the proxy (2 x delay + backend service)
* ``gap``:      Query answer delivered -> next request arrives (daemon CPU between calls)
* ``writes``:   first write in -> last write out (the lock and the claim, sent together)
* ``post``:     last answer delivered -> client has the lease (daemon + IPC + decode)

and ``writes_overlap`` tells whether the backend really served the two writes at once.
The baseline is cut the same way. ``--pyinstrument`` runs the daemon under pyinstrument and
prints where its CPU went (text report in bench/.cache/).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import rasd_client

from .baseline import BaselineAgent
from .harness import CLIENT, LOG_DIR, POOL, REGION, Env, lease_until, rasd_bin


def _windows(trace: list[dict[str, Any]], calls: list[tuple[float, float]]) -> list[dict[str, Any]]:
    out = []
    for t0, t1 in calls:
        recs = sorted((r for r in trace if t0 <= r["in"] <= t1), key=lambda r: r["in"])
        q = [r for r in recs if r["op"] == "Query"]  # the first read: mappings, or leased
        w = [r for r in recs if r["op"] == "UpdateItem"]
        if not q or not w:
            continue
        q0 = q[0]
        first_w = min(r["in"] for r in w)
        last_out = max(r["out"] for r in w)
        ws = sorted(w, key=lambda r: r["up"])
        overlap = len(ws) >= 2 and ws[1]["up"] < ws[0]["back"]
        out.append(
            {
                "total": (t1 - t0) * 1e3,
                "pre": (q0["in"] - t0) * 1e3,
                "query": (q0["out"] - q0["in"]) * 1e3,
                "query_backend": (q0["back"] - q0["up"]) * 1e3,
                "gap": (first_w - q0["out"]) * 1e3,
                "writes": (last_out - first_w) * 1e3,
                "writes_backend": [round((r["back"] - r["up"]) * 1e3, 3) for r in ws],
                "writes_overlap": overlap,
                "post": (t1 - last_out) * 1e3,
                "n_requests": len(recs),
                "other": [f"{r['op']}:{r['index']}" for r in recs if r not in q[:1] and r not in w],
            }
        )
    return out


def _summary(ws: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ["total", "pre", "query", "query_backend", "gap", "writes", "post"]
    s: dict[str, Any] = {k: round(statistics.median(w[k] for w in ws), 3) for k in keys}
    s["n"] = len(ws)
    s["writes_overlap_share"] = sum(w["writes_overlap"] for w in ws) / max(1, len(ws))
    s["writes_backend_p50"] = round(
        statistics.median(x for w in ws for x in w["writes_backend"]), 3
    )
    s["with_other_requests"] = sum(1 for w in ws if w["other"])
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile")
    ap.add_argument("--backend", choices=["moto", "dynalite"], default="moto")
    ap.add_argument("--delay-ms", type=float, default=3.5)
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--pyinstrument", action="store_true")
    a = ap.parse_args(argv)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    trace_path = LOG_DIR / f"trace-{a.backend}.jsonl"
    trace_path.unlink(missing_ok=True)
    prof_out = LOG_DIR / f"pyinstrument-{a.backend}.txt"
    cmd = [rasd_bin()]
    if a.pyinstrument:
        cmd = [
            sys.executable, "-m", "pyinstrument", "-r", "text", "-o", str(prof_out),
            "--show-all", str(Path(rasd_bin())),
        ]  # fmt: skip
    env = Env(a.backend, a.delay_ms, trace=str(trace_path), daemon_cmd=cmd)
    try:
        table = env.new_table(resources=3 * a.n + 60, prefix="prof")
        (d,) = env.start_daemons(table, 1, prefix=f"prof-{a.backend}-")
        base = BaselineAgent(table, REGION, env.endpoint)
        exp = lease_until()
        for i in range(3):
            rasd_client.get_lease(CLIENT, POOL, f"pw{i}", exp, socket_path=d.socket, timeout=10)
            base.get_lease(CLIENT, POOL, f"pwb{i}", int(exp * 1e6))
        time.sleep(0.5)
        rasd_calls, base_calls = [], []
        for i in range(a.n):
            t0 = time.perf_counter()
            rasd_client.get_lease(CLIENT, POOL, f"p{i}", exp, socket_path=d.socket, timeout=10)
            rasd_calls.append((t0, time.perf_counter()))
            time.sleep(0.05)
            t0 = time.perf_counter()
            base.get_lease(CLIENT, POOL, f"pb{i}", int(exp * 1e6))
            base_calls.append((t0, time.perf_counter()))
            time.sleep(0.05)
        d.stop(signal.SIGINT)  # pyinstrument writes its report on a clean exit
    finally:
        env.close()
    time.sleep(0.3)
    trace = [json.loads(line) for line in trace_path.read_text().splitlines() if line]
    r = _windows(trace, rasd_calls)
    b = _windows(trace, base_calls)
    out = {"backend": a.backend, "delay_ms": a.delay_ms, "rasd": _summary(r)}
    if b:
        bs = {
            "total": round(statistics.median(w["total"] for w in b), 3),
            "n": len(b),
        }
        out["baseline"] = bs
    print(json.dumps(out, indent=1))
    res = Path(__file__).resolve().parent / "results"
    res.mkdir(exist_ok=True)
    (res / f"profile-{a.backend}.json").write_text(
        json.dumps({**out, "rasd_windows": r[:200]}, indent=1)
    )
    if a.pyinstrument and prof_out.exists():
        print(f"\npyinstrument report (daemon, whole run): {prof_out}")
        text = prof_out.read_text()
        print(text[:6000])
    elif a.pyinstrument:
        print(f"no pyinstrument report; see {LOG_DIR}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

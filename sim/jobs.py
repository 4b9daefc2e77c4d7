"""The scheduled jobs on a compressed schedule, in one child process of the simulation.

``ras-liberator`` (``--grace 0``) runs every ``--liberate-every`` seconds in every region
against that region's own backend (as in production, one liberator per region);
``ras-balancer`` (unless ``--no-balancer``) every ``--balance-every`` seconds in the first
region, reading that region's stream, keeping its state on S3 in that region's backend, and
moving each donor region's items in the donor's own replica (``--peer-endpoint``). Both are
called through their modules' ``run()``, with the same options their CLIs build.

Each job's one-line summary is appended to ``--out`` (JSON lines, with ``job`` and ``t``).
Runs until stdin closes.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from fleet.tables import client
from rasd_jobs import balance_model, balancer, common, liberator


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sim.jobs")
    ap.add_argument("--endpoint", action="append", required=True, metavar="REGION=URL")
    ap.add_argument("--table", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--liberate-every", type=float, default=1.0)
    ap.add_argument("--balance-every", type=float, default=3.0)
    ap.add_argument("--no-balancer", action="store_true")
    ap.add_argument("--state-uri", default="s3://sim-balancer/state")
    ap.add_argument("--horizon", type=float, default=None)
    ap.add_argument("--max-moves", type=int, default=500)
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    common.setup_logging(args.log_level)
    endpoints: dict[str, str] = dict(e.split("=", 1) for e in args.endpoint)
    regions = list(endpoints)
    home = regions[0]
    ddb = {r: client(u, r) for r, u in endpoints.items()}
    clients = balancer.Clients(
        ddb=ddb[home],
        streams=client(endpoints[home], home, "dynamodbstreams"),
        s3=client(endpoints[home], home, "s3"),
        peers={r: c for r, c in ddb.items() if r != home},
    )
    params = balance_model.Params(
        interval_s=args.balance_every,
        horizon_s=args.horizon if args.horizon else 2 * args.balance_every,
        max_moves=args.max_moves,
    )
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    out = open(args.out, "a")  # noqa: SIM115
    t0 = time.monotonic()
    next_bal = t0 + args.balance_every

    def emit(job: str, summary: dict[str, Any]) -> None:
        out.write(json.dumps({"job": job, "t": round(time.monotonic() - t0, 3), **summary}))
        out.write("\n")
        out.flush()

    lock = threading.Lock()  # one writer of the output file at a time

    def emit_locked(job: str, summary: dict[str, Any]) -> None:
        with lock:
            emit(job, summary)

    def liberate_loop() -> None:
        """Every region's liberator, in a thread of its own so that a slow balancer run does
        not delay the liberation of expired leases (and the other way round)."""
        while not stop.wait(args.liberate_every):
            for r in regions:
                opts = liberator.Options(
                    table=args.table,
                    region=r,
                    now_us=time.time_ns() // 1000,
                    grace_us=0,
                    segments=1,
                )
                try:
                    emit_locked("liberator", liberator.run(ddb[r], opts))
                except Exception as exc:  # noqa: BLE001 - a failed run is reported, not fatal
                    emit_locked("liberator", {"status": "error", "region": r, "error": repr(exc)})

    lib_thread = threading.Thread(target=liberate_loop, daemon=True)
    lib_thread.start()
    while not args.no_balancer and not stop.wait(max(0.0, next_bal - time.monotonic())):
        next_bal = time.monotonic() + args.balance_every
        opts_b = balancer.Options(
            table=args.table,
            region=home,
            now_us=time.time_ns() // 1000,
            params=params,
            regions=tuple(regions),
            state_uri=args.state_uri,
            stream_budget_s=args.balance_every,
        )
        try:
            emit_locked("balancer", balancer.run(opts_b, clients))
        except Exception as exc:  # noqa: BLE001
            emit_locked("balancer", {"status": "error", "error": repr(exc)})
    stop.wait()
    lib_thread.join(30)
    out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

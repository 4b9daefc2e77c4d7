"""Load for the real-systemd test: ``N`` get_lease calls from ``C`` threads with the client's
default timeout, keys drawn from a fixed set (so leases are reused and the pool suffices).
Prints one JSON line: calls, ok, failures by error code, and the slowest call. ``dropped``
counts the failures that are not about time: a connection closed before any reply twice, or
no socket to connect to (a daemon that dropped a request it had read, or a closed socket);
``dynamodb`` counts the daemon's answers that DynamoDB (moto here) was slow or failing; the
rest (TIMEOUT, BUSY, UNAVAILABLE "still starting") are callers that waited too long for a
process. ``fail_window``: per code, the first and last failure, seconds after the start."""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from collections import Counter
from datetime import timedelta

import rasd_client
from rasd_client.errors import ERRORS_BY_CODE

#: The client's own UNAVAILABLE messages for a connection that failed (closed before any reply
#: twice, or no socket to connect to); the daemon's UNAVAILABLE answers are not drops.
DROPPED = ("rasd connection failed", "rasd connection lost", "cannot connect to rasd")
CODES = set(ERRORS_BY_CODE)
#: The daemon's answers when DynamoDB (here moto, on the same overloaded machine) was slow or
#: failing: the backing store, not the daemon's lifecycle.
DYNAMODB = ("DynamoDB ",)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", default="/run/rasd/rasd.sock")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--keys", type=int, default=300)
    ap.add_argument("--client", default="demo")
    ap.add_argument("--pace", type=float, default=0.0, help="seconds between a thread's calls")
    ap.add_argument("--started", help="touch this file once the first call succeeded")
    ap.add_argument("--until", help="keep going (past --calls) until this file exists")
    args = ap.parse_args()
    lock = threading.Lock()
    failed: Counter[str] = Counter()
    examples: dict[str, str] = {}
    state = {"ok": 0, "left": args.calls, "slowest": 0.0, "dropped": 0, "dynamodb": 0}
    first_fail: dict[str, float] = {}
    last_fail: dict[str, float] = {}

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        while True:
            with lock:
                if state["left"] <= 0 and not (args.until and not os.path.exists(args.until)):
                    return
                state["left"] -= 1
            key = f"k-{rng.randrange(args.keys)}"
            t0 = time.monotonic()
            try:
                rasd_client.get_lease(
                    args.client, "default", key, timedelta(hours=1), socket_path=args.socket
                )
                code = None
            except rasd_client.RasdError as exc:
                code, msg = exc.code, exc.message
            except OSError as exc:
                code, msg = type(exc).__name__, str(exc)
            dt = time.monotonic() - t0
            with lock:
                state["slowest"] = max(state["slowest"], dt)
                if code is None:
                    state["ok"] += 1
                    if args.started and state["ok"] == 1:
                        open(args.started, "w").close()
                else:
                    failed[code] += 1
                    examples.setdefault(code, msg)
                    first_fail.setdefault(code, time.time())
                    last_fail[code] = time.time()
                    if (code == "UNAVAILABLE" and msg.startswith(DROPPED)) or code not in CODES:
                        state["dropped"] += 1
                    elif msg.startswith(DYNAMODB):
                        state["dynamodb"] += 1
            if args.pace:
                time.sleep(args.pace)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    t0 = time.monotonic()
    started_at = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(
        json.dumps(
            {
                "calls": state["ok"] + sum(failed.values()),
                "ok": state["ok"],
                "failed": sum(failed.values()),
                "dropped": state["dropped"],
                "dynamodb": state["dynamodb"],
                "by_code": dict(failed),
                "examples": examples,
                "slowest_s": round(state["slowest"], 3),
                "elapsed_s": round(time.monotonic() - t0, 2),
                "started_at": round(started_at, 2),
                "fail_window": {
                    c: [round(first_fail[c] - started_at, 2), round(last_fail[c] - started_at, 2)]
                    for c in first_fail
                },
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

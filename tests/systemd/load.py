"""Load for the real-systemd test: ``N`` get_lease calls from ``C`` threads with the client's
default timeout, keys drawn from a fixed set (so leases are reused and the pool suffices).
Prints one JSON line: calls, ok, failures by error code, and the slowest call. ``dropped``
counts the failures that are not about time: a connection closed before any reply twice, or
no socket to connect to (a daemon that dropped a request it had read, or a closed socket);
the rest (TIMEOUT, BUSY, UNAVAILABLE "still starting") are callers that waited too long."""

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
    state = {"ok": 0, "left": args.calls, "slowest": 0.0, "dropped": 0}

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
                    if (code == "UNAVAILABLE" and msg.startswith(DROPPED)) or code not in CODES:
                        state["dropped"] += 1
            if args.pace:
                time.sleep(args.pace)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    t0 = time.monotonic()
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
                "by_code": dict(failed),
                "examples": examples,
                "slowest_s": round(state["slowest"], 3),
                "elapsed_s": round(time.monotonic() - t0, 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

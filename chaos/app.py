"""One app process of the chaos run: get_lease (and sometimes release) over a keyspace, through
the daemons' sockets, recording every call as one JSON line.

``python -m chaos.app --app N --sockets 0=us-east-1=/path.sock,... --out history.jsonl ...``

A record: ``op``, ``app``, ``key``, ``sock``, ``daemon``, ``region`` (the daemon's), ``asked``
(seconds of lease asked for), ``m0``/``m1`` (monotonic start and end), ``t0``/``t1`` (wall
clock, epoch seconds), ``ok``, and either the answer (``resource``, ``lease_expires`` as epoch
seconds, ``lease_region``, ``version``, ``new``) or ``error`` (the rasd error code) and
``message``. Lines are flushed one by one, so a killed app leaves a readable history.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import rasd_client
from rasd_client import _table

#: lease_expires asked for, seconds from now: from shorter than the daemons' skew margin (so
#: never cached) to a minute (cached, extended, liberated after expiry)
DURATIONS = (3.0, 5.0, 10.0, 20.0, 40.0, 60.0)


def asked(max_asked: float | None) -> tuple[float, ...]:
    """The lease lengths an app asks for: :data:`DURATIONS` up to ``max_asked`` seconds
    (None: all of them; at least the shortest)."""
    if max_asked is None:
        return DURATIONS
    return tuple(d for d in DURATIONS if d <= max_asked) or DURATIONS[:1]


def parse_sockets(spec: str) -> list[tuple[int, str, str]]:
    """``IDX=REGION=PATH,...`` -> [(daemon index, region, socket path)]."""
    out = []
    for part in spec.split(","):
        idx, region, path = part.split("=", 2)
        out.append((int(idx), region, path))
    return out


def call(
    op: str,
    app: int,
    key: str,
    daemon: tuple[int, str, str],
    asked: float,
    client: str,
    pool: str,
    timeout: float,
) -> dict[str, Any]:
    idx, region, path = daemon
    rec: dict[str, Any] = {"op": op, "app": app, "key": key, "sock": path, "daemon": idx}
    rec["region"] = region
    m0, t0 = time.monotonic(), time.time()
    served = _table.current.hits
    try:
        if op == "get_lease":
            rec["asked"] = asked
            lease = rasd_client.get_lease(
                client, pool, key, t0 + asked, socket_path=path, timeout=timeout
            )
            rec.update(
                ok=True,
                resource=lease.resource,
                lease_expires=lease.lease_expires.timestamp(),
                lease_region=lease.region,
                version=lease.version,
                new=lease.new,
                table=_table.current.hits > served,  # answered from the hit table
            )
        else:
            rasd_client.release(client, pool, key, socket_path=path, timeout=timeout)
            rec["ok"] = True
    except rasd_client.RasdError as exc:
        rec.update(ok=False, error=exc.code, message=exc.message[:200])
    except Exception as exc:  # noqa: BLE001 - recorded as an indeterminate call
        rec.update(ok=False, error="CLIENT_" + type(exc).__name__, message=str(exc)[:200])
    rec.update(m0=m0, m1=time.monotonic(), t0=t0, t1=time.time())
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.app", description=__doc__)
    p.add_argument("--app", type=int, required=True)
    p.add_argument("--sockets", required=True, help="IDX=REGION=PATH,... the daemons to use")
    p.add_argument("--out", required=True, help="history file (JSON lines, appended)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keys", type=int, default=60)
    p.add_argument("--until", type=float, required=True, help="stop at this wall-clock time")
    p.add_argument("--max-ops", type=int, default=1_000_000)
    p.add_argument("--release-rate", type=float, default=0.05)
    p.add_argument("--think-ms", type=float, default=20.0, help="mean pause between calls")
    p.add_argument("--timeout", type=float, default=2.0, help="each call's deadline")
    p.add_argument("--client", default="demo")
    p.add_argument("--pool", default="default")
    p.add_argument("--max-asked", type=float, default=None, help="longest lease asked for, seconds")
    args = p.parse_args(argv)
    rng = random.Random(f"{args.seed}/app/{args.app}")
    durations = asked(args.max_asked)
    daemons = parse_sockets(args.sockets)
    n = 0
    with open(args.out, "a", buffering=1) as out:
        while n < args.max_ops and time.time() < args.until:
            key = f"key-{rng.randrange(args.keys):03d}"
            op = "release" if rng.random() < args.release_rate else "get_lease"
            rec = call(
                op,
                args.app,
                key,
                rng.choice(daemons),
                rng.choice(durations),
                args.client,
                args.pool,
                args.timeout,
            )
            out.write(json.dumps(rec) + "\n")
            n += 1
            if args.think_ms > 0:
                time.sleep(rng.expovariate(1000.0 / args.think_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

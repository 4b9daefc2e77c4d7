"""The paper's agent in the chaos run's mixed mode: worker processes and its hourly liberator.

``python -m chaos.paper agent --app N --region R --endpoint-url URL --out history.jsonl ...``
calls ``bench.baseline.BaselineAgent(paper=True)`` (what the paper's agent writes, nothing
more) in a loop over the same key space as ``chaos.app``, against DynamoDB at ``URL`` (a
fault-injecting proxy in front of moto), and writes one JSON line per call in
``chaos.app``'s format, plus ``agent: "paper"``. The agent has no daemon (``daemon`` is -1,
``sock`` empty) and no release, so every call is a ``get_lease``. ``--max-asked`` keeps the
leases it asks for short (a run that ends the rollout waits for the last one to end).

``python -m chaos.paper liberate --endpoint-url URL --grace G`` is the paper's liberator once
(``bench.baseline.paper_liberate``), freeing only leases whose end is ``G`` seconds past:
the grace the rollout runbook requires of it (docs/operations.md, at least
``max_clock_skew``). It prints a one-line JSON summary, as the rasd jobs do.

Every table is moto's one ``us-east-1`` table (the global table's stand-in), so the DynamoDB
client's region is pinned there; the agent's RAS region is ``--region``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import boto3
from botocore.config import Config as BotoConfig

from bench.baseline import BaselineAgent, BaselineLease, NoCapacity, paper_liberate
from rasd.core.lease import US

from .app import asked

#: the DynamoDB region of the run's one table (chaos.children.child_env pins it for every child)
TABLE_REGION = "us-east-1"


def ddb_client(url: str, read_timeout: float, max_attempts: int) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=url,
        region_name=TABLE_REGION,
        config=BotoConfig(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=1.0,
            read_timeout=read_timeout,
            tcp_keepalive=True,
        ),
    )


class StampedAgent(BaselineAgent):
    """The paper's agent, unchanged, that notes when its last lookup's answer arrived (the
    index as it read it: a lease made after this is one it could not see)."""

    looked: float = 0.0

    def lookup(self, client_id: str, pool_id: str, key: str, now_us: int) -> BaselineLease | None:
        try:
            return super().lookup(client_id, pool_id, key, now_us)
        finally:
            self.looked = time.time()


def call(
    agent: StampedAgent, app: int, key: str, asked: float, client: str, pool: str
) -> dict[str, Any]:
    """One get_lease of the paper's agent as a history record (``chaos.app.call``'s format)."""
    rec: dict[str, Any] = {"op": "get_lease", "agent": "paper", "app": app, "key": key}
    rec.update(sock="", daemon=-1, region=agent.region, asked=asked)
    m0, t0 = time.monotonic(), time.time()
    agent.looked = 0.0
    try:
        lease = agent.get_lease(client, pool, key, int((t0 + asked) * US))
        rec.update(
            ok=True,
            resource=lease.resource,
            lease_expires=lease.expires_us / US,
            lease_region=lease.region,
            version=lease.version,
            new=lease.new,
        )
    except NoCapacity as exc:
        rec.update(ok=False, error="NO_CAPACITY", message=str(exc)[:200])
    except Exception as exc:  # noqa: BLE001 - recorded as an indeterminate call
        rec.update(ok=False, error="CLIENT_" + type(exc).__name__, message=str(exc)[:200])
    rec.update(m0=m0, m1=time.monotonic(), t0=t0, t1=time.time())
    if agent.looked:
        rec["looked"] = agent.looked  # its lookup's answer arrived (wall clock)
    return rec


def run_agent(args: argparse.Namespace) -> int:
    rng = random.Random(f"{args.seed}/paper/{args.app}")
    ddb = ddb_client(args.endpoint_url, args.read_timeout, args.max_attempts)
    agent = StampedAgent(args.table, args.region, None, ddb=ddb, paper=True)
    durations = asked(args.max_asked)
    n = 0
    with open(args.out, "a", buffering=1) as out:
        while n < args.max_ops and time.time() < args.until:
            key = f"key-{rng.randrange(args.keys):03d}"
            rec = call(agent, args.app, key, rng.choice(durations), args.client, args.pool)
            out.write(json.dumps(rec) + "\n")
            n += 1
            if args.think_ms > 0:
                time.sleep(rng.expovariate(1000.0 / args.think_ms))
    return 0


def run_liberator(args: argparse.Namespace) -> int:
    ddb = ddb_client(args.endpoint_url, 30.0, 8)
    now_us = int((time.time() - args.grace) * US)  # "past its end" as of now - grace
    counts = paper_liberate(ddb, args.table, now_us)
    print(json.dumps({"job": "paper_liberator", "grace": args.grace, **counts}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos.paper", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("agent", help="a worker of the paper's agent, recording its history")
    a.add_argument("--app", type=int, required=True)
    a.add_argument("--region", required=True, help="the agent's RAS region")
    a.add_argument("--endpoint-url", required=True)
    a.add_argument("--table", default="rasd-chaos")
    a.add_argument("--out", required=True, help="history file (JSON lines, appended)")
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--keys", type=int, default=60)
    a.add_argument("--until", type=float, required=True, help="stop at this wall-clock time")
    a.add_argument("--max-ops", type=int, default=1_000_000)
    a.add_argument("--max-asked", type=float, default=None, help="longest lease asked for, seconds")
    a.add_argument("--think-ms", type=float, default=20.0, help="mean pause between calls")
    a.add_argument("--read-timeout", type=float, default=2.0)
    a.add_argument("--max-attempts", type=int, default=3, help="botocore's, as the bench's")
    a.add_argument("--client", default="demo")
    a.add_argument("--pool", default="default")
    lib = sub.add_parser("liberate", help="the paper's liberator, once, with a grace")
    lib.add_argument("--endpoint-url", required=True)
    lib.add_argument("--table", default="rasd-chaos")
    lib.add_argument("--grace", type=float, default=2.0, help="seconds past a lease's end")
    args = p.parse_args(argv)
    return run_agent(args) if args.cmd == "agent" else run_liberator(args)


if __name__ == "__main__":
    raise SystemExit(main())

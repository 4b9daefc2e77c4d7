"""``python -m chaos``: the command line, the run, its table."""

from __future__ import annotations

import argparse
import signal
from typing import Any

from .params import END_ROLLOUT_POOL_REFRESH, Params
from .run import run
from .summary import table


def build_parser() -> argparse.ArgumentParser:
    d = Params()
    ap = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Chaos run of rasd: daemons in two regions behind fault-injecting "
        "proxies, kill -9, an outage, the jobs on loops; then an audit of what apps saw. "
        "Exit 0 when the audit found no violation, 1 otherwise.",
    )
    ap.add_argument("--duration", type=float, default=d.duration, help="seconds of traffic")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--daemons", type=int, default=d.daemons)
    ap.add_argument("--apps", type=int, default=d.apps)
    ap.add_argument("--keys", type=int, default=d.keys)
    ap.add_argument("--resources-per-region", type=int, default=d.resources_per_region)
    ap.add_argument("--fault-rate", type=float, default=d.fault_rate)
    ap.add_argument("--outage-at", type=float, default=None, help="default: 40%% of duration")
    ap.add_argument("--outage", type=float, default=d.outage_s, help="outage seconds (0: none)")
    ap.add_argument("--kill-every", type=float, default=d.kill_every, help="0: no kills")
    ap.add_argument("--jobs-every", type=float, default=d.jobs_every)
    ap.add_argument("--liberator-grace", type=float, default=d.liberator_grace)
    ap.add_argument("--release-rate", type=float, default=d.release_rate)
    ap.add_argument("--think-ms", type=float, default=d.think_ms)
    ap.add_argument("--call-timeout", type=float, default=d.call_timeout)
    ap.add_argument("--label", default=None, help="results name (default: short/full)")
    ap.add_argument("--results-dir", default=d.results_dir)
    ap.add_argument("--keep-workdir", action="store_true", help="keep histories and logs")
    ap.add_argument(
        "--trace",
        action="store_true",
        help="record every write through the proxies in the work directory's trace.jsonl "
        "(kept, as with --keep-workdir)",
    )
    ap.add_argument(
        "--mixed",
        action="store_true",
        help="a mixed fleet: workers of the paper's agent and its liberator beside rasd",
    )
    ap.add_argument("--paper-workers", type=int, default=d.paper_workers)
    ap.add_argument(
        "--no-paper-faults",
        action="store_true",
        help="the paper's workers talk to moto directly, not through fault-injecting proxies",
    )
    ap.add_argument("--paper-liberator-grace", type=float, default=d.paper_liberator_grace)
    ap.add_argument(
        "--paper-max-lease",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the longest lease the paper's workers ask for (default: the apps' lengths, up "
        "to 60 s)",
    )
    ap.add_argument(
        "--app-max-lease",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the longest lease rasd's apps ask for (default: up to 60 s); end-rollout waits "
        "out every lease held when it first runs",
    )
    ap.add_argument(
        "--end-rollout-at",
        type=float,
        default=None,
        metavar="SECONDS",
        help="--mixed: at this time into the traffic the paper's workers and liberator stop, "
        "then `rasadmin end-rollout` runs every --end-rollout-every seconds until it succeeds "
        "(the run fails if it never does); the daemons serve throughout",
    )
    ap.add_argument("--end-rollout-every", type=float, default=d.end_rollout_every)
    ap.add_argument(
        "--partition-at",
        type=float,
        default=None,
        metavar="SECONDS",
        help="cut daemon 0 off from DynamoDB (its proxy fails every call) at this time into "
        "the traffic, for --partition-for seconds, while the rest go on",
    )
    ap.add_argument("--partition-for", type=float, default=d.partition_s, metavar="SECONDS")
    ap.add_argument(
        "--outage-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="define the pool with this outage budget (and the least quarantine add-pool "
        "takes for it): a host cut off keeps answering the leases it confirmed",
    )
    ap.add_argument(
        "--clock-step-at",
        type=float,
        default=None,
        metavar="SECONDS",
        help="step daemon 1's clock by --clock-step seconds at this time into the traffic, "
        "and back --clock-step-for seconds later; the run fails unless that daemon stops "
        "answering within 10 s, says why in its log, and answers nothing while stepped",
    )
    ap.add_argument("--clock-step", type=float, default=d.clock_step_s, metavar="SECONDS")
    ap.add_argument("--clock-step-for", type=float, default=d.clock_step_for, metavar="SECONDS")
    ap.add_argument(
        "--pool-refresh",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the daemons' pool_refresh: how soon they follow the rollout record (default: "
        f"theirs, 30 s; with --end-rollout-at, {END_ROLLOUT_POOL_REFRESH:g} s)",
    )
    ap.add_argument(
        "--one-table",
        action="store_true",
        help="one moto table for both regions, no replicator (--mixed always runs so)",
    )
    ap.add_argument("--lag", type=float, default=d.lag_s, help="replication lag, seconds")
    ap.add_argument(
        "--resources",
        type=lambda v: tuple(int(x) for x in v.split(",")),
        default=d.resources,
        metavar="N1,N2",
        help="free resources of each region at the start (default: --resources-per-region)",
    )
    ap.add_argument("--no-balancer", action="store_true", help="no ras-balancer on the loop")
    ap.add_argument("--balancer-interval", type=float, default=d.balancer_interval)
    ap.add_argument("--balancer-horizon", type=float, default=d.balancer_horizon)
    ap.add_argument("--balancer-safety", type=float, default=d.balancer_safety)
    ap.add_argument("--balancer-floor", type=int, default=d.balancer_floor)
    ap.add_argument("--no-admin", action="store_true", help="no rasadmin on a loop")
    ap.add_argument("--admin-every", type=float, default=d.admin_every)
    return ap


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through run()'s finally: children are killed


def params(argv: list[str] | None = None) -> Params:
    """The run's parameters from the command line (argparse's exit on bad usage)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    pool_refresh = args.pool_refresh
    if args.end_rollout_at is not None:
        if not args.mixed:
            ap.error("--end-rollout-at: a mixed fleet only (--mixed)")
        if not 0 < args.end_rollout_at < args.duration:
            ap.error("--end-rollout-at: within the traffic (0 < SECONDS < --duration)")
        if pool_refresh is None:
            pool_refresh = END_ROLLOUT_POOL_REFRESH
    label = (
        ("mixed-" if args.mixed else "")
        + ("endroll-" if args.end_rollout_at else "")
        + ("partition-" if args.partition_at is not None else "")
        + ("budget-" if args.outage_budget else "")
        + ("clockstep-" if args.clock_step_at is not None else "")
    )
    return Params(
        duration=args.duration,
        seed=args.seed,
        daemons=args.daemons,
        apps=args.apps,
        keys=args.keys,
        resources_per_region=args.resources_per_region,
        fault_rate=args.fault_rate,
        outage_at=args.outage_at,
        outage_s=args.outage,
        kill_every=args.kill_every,
        jobs_every=args.jobs_every,
        liberator_grace=args.liberator_grace,
        release_rate=args.release_rate,
        think_ms=args.think_ms,
        call_timeout=args.call_timeout,
        label=args.label or label + ("full" if args.duration >= 300 else "short"),
        results_dir=args.results_dir,
        keep_workdir=args.keep_workdir,
        trace=args.trace,
        mixed=args.mixed,
        paper_workers=args.paper_workers,
        paper_faults=not args.no_paper_faults,
        paper_liberator_grace=args.paper_liberator_grace,
        paper_max_lease=args.paper_max_lease,
        app_max_lease=args.app_max_lease,
        end_rollout_at=args.end_rollout_at,
        end_rollout_every=args.end_rollout_every,
        partition_at=args.partition_at,
        partition_s=args.partition_for,
        outage_budget=args.outage_budget,
        clock_step_at=args.clock_step_at,
        clock_step_s=args.clock_step,
        clock_step_for=args.clock_step_for,
        pool_refresh=pool_refresh,
        replicas=not args.one_table,
        lag_s=args.lag,
        resources=args.resources,
        balancer=not args.no_balancer,
        balancer_interval=args.balancer_interval,
        balancer_horizon=args.balancer_horizon,
        balancer_safety=args.balancer_safety,
        balancer_floor=args.balancer_floor,
        admin=not args.no_admin,
        admin_every=args.admin_every,
    )


def main(argv: list[str] | None = None) -> int:
    p = params(argv)
    signal.signal(signal.SIGTERM, _terminate)
    result = run(p)
    print(table(result))
    print(f"result: {result['path']}")
    return 0 if result["ok"] else 1

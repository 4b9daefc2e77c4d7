"""``python -m sim --quick|--full [--lag 1.0] [--seeds 1,2,3] [--out sim/results]``

Runs the global simulation twice per seed on the same traffic: with ``ras-balancer``, then with
the balancer off (the static equal split), each on fresh backends; prints the tables, the
verdicts per seed and over the seeds, and whether every run was valid (measured the protocol,
not an overloaded backend); writes ``{out}/{preset}.json`` and ``{out}/{preset}.png`` (the
first seed's plot). See docs/global.md, "Global simulation".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import report, strict, traffic
from .world import Params, World, schedule_of, size_pool

PRESETS: dict[str, dict[str, Any]] = {
    # about 4 minutes on 2 idle cores: two runs of a 100 s day plus set-up and checks.
    # Leases of 8 s are 2 simulated hours: shorter ones would make the balancer's reaction
    # time (interval + run + 2 replications, ~3-4 s) longer than a lease. The balancer runs
    # every second: a run takes about 1 s against moto, so runs follow each other.
    "quick": {
        "day_s": 100.0,
        "lease_s": 8.0,
        "keys_per_s": 6.0,
        "balance_every_s": 1.0,
        "horizon_s": 3.0,
        "liberate_every_s": 0.5,
    },
    # about 22 minutes: two runs of a 10-minute day. Leases of 25 s are one simulated hour
    # and the balancer runs every 2.5 s (6 simulated minutes) with a 5 s horizon: the
    # production ratios (1 h leases, every 5 minutes, 10-minute horizon). The liberator runs
    # every 5 s (12 simulated minutes): every second, its two Scans per region walked the whole
    # table (2,400 items by the end) under moto's lock 900 times a run and replication's p99
    # went past 1.5 s; hourly, as in production, the pool (sized for lease + half a period,
    # size_pool) ran out at the evening peak (docs/global.md, "Time compression").
    "full": {
        "day_s": 600.0,
        "lease_s": 25.0,
        "keys_per_s": 3.0,
        "balance_every_s": 2.5,
        "horizon_s": 5.0,
        "liberate_every_s": 5.0,
    },
    # the smoke test: seconds, not a measurement
    "tiny": {
        "day_s": 20.0,
        "lease_s": 2.0,
        "keys_per_s": 3.0,
        "balance_every_s": 2.0,
        "probe_keys": 3,
    },
}


def run_pair(
    params: Params, scn: traffic.Scenario, static: bool = True, log: Any = print
) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    sched = schedule_of(params, scn)
    total, split = size_pool(sched, params, list(scn.names))
    info = {
        "new_keys": sched.new_keys,
        "second_region_requests": sched.second_requests,
        "resources": total,
        "split": split,
    }
    log(
        f"traffic: {sched.new_keys} new keys, {sched.second_requests} second-region requests; "
        f"{total} resources, {split}"
    )
    results: dict[str, dict[str, Any]] = {}
    for mode in ("balancer", "static") if static else ("balancer",):
        p = replace(params, balancer=(mode == "balancer"), resources=total)
        with tempfile.TemporaryDirectory(prefix=f"sim-{mode}-") as d:
            t0 = time.monotonic()
            log(f"run {mode}: day of {p.day_s:g} s ...")
            res = World(p, scn, Path(d)).run(sched, split)
            results[mode] = report.analyze(res, scn)
            log(f"run {mode}: done in {time.monotonic() - t0:.0f} s")
    return results["balancer"], results.get("static"), info


def one_seed(params: Params, scn: traffic.Scenario, static: bool, log: Any) -> dict[str, Any]:
    """Both runs of one seed, their verdicts and everything the JSON keeps."""
    t0 = time.monotonic()
    bal, stat, info = run_pair(params, scn, static=static, log=log)
    return {
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "params": {k: v for k, v in vars(params).items() if k != "balancer"},
        "scenario": {
            "regions": [_dc(r) for r in scn.regions],
            "spike": _dc(scn.spike),
            "evacuation": _dc(scn.evacuation),
        },
        "traffic": info,
        "verdicts": report.verdicts(bal, stat, params.lag_s),
        "balancer": bal,
        "static": stat,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sim",
        description=__doc__.split("\n\n")[1],
        epilog="Exit status: 0 every run valid, 3 a run measured an overloaded backend "
        "(replication lag p99 over 1.5x the configured lag, or 1 % of requests failed "
        "for another reason than capacity), 2 bad usage; with --strict, 1 when the strict "
        "pool answered a key two resources across regions (the table's audit, the clients' "
        "answers or the probe), valid run or not. Missed targets are reported, not an exit "
        "status.",
    )
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_const", dest="preset", const="quick")
    g.add_argument("--full", action="store_const", dest="preset", const="full")
    g.add_argument("--tiny", action="store_const", dest="preset", const="tiny")
    ap.add_argument("--lag", type=float, default=1.0, help="replication lag, seconds (1.0)")
    ap.add_argument(
        "--seeds",
        default="1",
        metavar="N[,N...]",
        help="the traffic's seeds, one pair of runs each (default 1; make sim: 1,2,3)",
    )
    ap.add_argument(
        "--strict",
        action="store_true",
        help="a strict pool beside the normal one, one run per seed (balancer on): keys "
        "mapped twice per pool and new-key latency (docs/global.md, 'Strict pools')",
    )
    ap.add_argument(
        "--one-way-ms",
        type=float,
        default=35.0,
        help="with --strict: delay added each way to the home region's calls from the other "
        "regions (35: a 70 ms cross-region round trip)",
    )
    ap.add_argument("--out", default="sim/results")
    ap.add_argument("--no-static", action="store_true", help="skip the static-split run")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument(
        "--from-json", metavar="FILE", help="print the tables and verdicts of a saved run"
    )
    args = ap.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        if "strict_keys_mapped_twice" in saved:
            return _strict_status(saved)
        _print(saved)
        return 0 if saved["summary"]["valid"] else 3
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seeds: integers separated by commas, not {args.seeds!r}")
    if not seeds:
        ap.error("--seeds: at least one")
    preset = args.preset or "quick"
    scn = traffic.default_scenario()

    def log(msg: str) -> None:
        print(f"[sim {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    t0 = time.monotonic()
    if args.strict:
        return _strict(args, preset, seeds, scn, log, t0)
    runs = []
    for seed in seeds:
        log(f"seed {seed}")
        params = Params(seed=seed, lag_s=args.lag, **PRESETS[preset])
        runs.append(one_seed(params, scn, not args.no_static, log))
    out = {
        "preset": preset,
        "lag_s": args.lag,
        "seeds": seeds,
        "summary": report.summary(runs),
        "runs": runs,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    name = preset if args.lag == 1.0 else f"{preset}-lag{args.lag:g}"
    report.write(out, outdir / f"{name}.json")
    if not args.no_plot:
        report.plot(runs[0]["balancer"], runs[0]["static"], outdir / f"{name}.png")
    _print(out)
    print(f"wrote {outdir / (name + '.json')}" + ("" if args.no_plot else f", {name}.png"))
    return 0 if out["summary"]["valid"] else 3


def _strict(
    args: argparse.Namespace,
    preset: str,
    seeds: list[int],
    scn: traffic.Scenario,
    log: Any,
    t0: float,
) -> int:
    runs = []
    for seed in seeds:
        log(f"seed {seed} (strict)")
        params = Params(seed=seed, lag_s=args.lag, **PRESETS[preset])
        runs.append(strict.run(params, scn, args.one_way_ms, log))
        print(f"--- seed {seed}")
        print(strict.table(runs[-1]))
    out = {
        "preset": preset,
        "lag_s": args.lag,
        "one_way_ms": args.one_way_ms,
        "seeds": seeds,
        "valid": all(r["validity"]["valid"] for r in runs),
        "strict_keys_mapped_twice": sum(r["pools"]["strict"]["duplicate_keys"] for r in runs),
        "strict_keys_mapped_twice_clients": sum(
            r["pools"]["strict"]["duplicate_keys_clients"] for r in runs
        ),
        "strict_promise_broken": strict.promise_broken(runs),
        "runs": runs,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{preset}-strict-lag{args.lag:g}.json"
    report.write(out, path)
    print(f"wrote {path}")
    return _strict_status(out, tables=False)


def _strict_status(out: dict[str, Any], tables: bool = True) -> int:
    """A strict run's verdict, printed, as the exit status: 1 when the strict pool answered a
    key two resources (by either witness, valid run or not: its promise does not depend on
    load), else 3 when a run was invalid, else 0."""
    if tables:
        for run in out["runs"]:
            print(f"--- seed {run['params']['seed']}")
            print(strict.table(run))
    broken = strict.promise_broken(out["runs"])
    print(
        f"strict pool: {out['strict_keys_mapped_twice']} keys mapped twice (table audit), "
        f"{sum(r['pools']['strict']['duplicate_keys_clients'] for r in out['runs'])} "
        f"(clients) over seeds {out['seeds']}; " + ("VALID" if out["valid"] else "INVALID")
    )
    if broken:
        print(
            "FAILED: the strict pool answered a key two resources across regions while both "
            "leases ran (its promise holds whatever the load, so an invalid run fails too):"
        )
        for b in broken:
            print(
                f"  seed {b['seed']} ({'valid' if b['valid'] else 'INVALID'}): table audit "
                f"{b['audit']} {b['audit_keys']}; clients {b['clients']} {b['clients_keys']}; "
                f"probe {b['probe_keys']}"
            )
        return 1
    return 0 if out["valid"] else 3


def _print(saved: dict[str, Any]) -> None:
    for run in saved["runs"]:
        print(f"--- seed {run['params']['seed']}")
        print(report.table(run["balancer"], run["static"]))
        for k, v in run["verdicts"].items():
            print(f"{'MET   ' if v['met'] else 'MISSED'} {k}: {_short(v)}")
    print(f"--- over seeds {saved['seeds']}")
    for k, v in saved["summary"]["verdicts"].items():
        print(f"{'MET   ' if v['met'] else 'MISSED'} {k}: {_short(v)}")
    print(
        "VALID: every run measured the protocol"
        if saved["summary"]["valid"]
        else "INVALID: a run measured an overloaded backend (see its VALID/INVALID line)"
    )


def _dc(x: Any) -> Any:
    if x is None:
        return None
    return {f: getattr(x, f) for f in x.__dataclass_fields__}


def _short(v: dict[str, Any]) -> str:
    return ", ".join(f"{k}={w}" for k, w in v.items() if k != "met")


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m check [--quick] [--seed N] [--walks N]``: explore, print, write a JSON summary.

Exit status 0 when every known-bad rule set is caught and the real rules show no violation;
1 otherwise (the trace is printed; the seed or the printed steps replay it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from .explore import Result, bfs, format_trace, walks
from .model import Config
from .rulesets import BAD, BAD_C, REAL, Protocol

RESULTS = Path(__file__).parent / "results"

#: CI: exhaustive over a small configuration: every interleaving of two daemons' requests
#: for two keys over one resource, their background tasks, and at most one fault (any kind,
#: at any step). Its full state space is explored (docs/checker.md gives the counts).
QUICK_BFS = Config(
    daemons=2,
    keys=("k1", "k2"),
    resources=("ra",),
    max_faults=1,
    max_crashes=0,
    max_ops=2,
    horizon=0,
    liberator=False,
    release=False,
)
#: deep mode's exhaustive configurations, widest last (each bounded by --budget seconds)
DEEP_BFS = (
    QUICK_BFS,
    Config(
        daemons=2,
        keys=("k1", "k2"),
        resources=("ra", "rb"),
        max_faults=1,
        max_crashes=1,
        max_ops=3,
        horizon=6,
        ticks=(1, 5),
    ),
    Config(
        daemons=3,
        keys=("k1", "k2"),
        resources=("ra", "rb", "rc"),
        max_faults=1,
        max_crashes=1,
        max_ops=3,
        horizon=6,
        ticks=(1, 5),
    ),
)
#: random walks: faults, crashes, releases, the liberator, many app calls and time
WALK = Config(
    daemons=2,
    keys=("k1", "k2"),
    resources=("ra", "rb"),
    max_faults=2,
    max_crashes=1,
    max_ops=10,
    horizon=30,
)

#: deep mode's second walk configuration: three daemons, three resources
WALK3 = Config(
    daemons=3,
    keys=("k1", "k2"),
    resources=("ra", "rb", "rc"),
    max_faults=2,
    max_crashes=1,
    max_ops=12,
    horizon=30,
)


def _print(res: Result) -> None:
    v = f"VIOLATION {res.violation.name}" if res.violation else "no violation"
    extra = f", {res.walks} walks" if res.mode == "walks" else ""
    done = "" if res.complete else " (budget reached: not exhaustive)"
    print(
        f"  {res.protocol:<18} {res.mode:<6} states={res.states:<9} "
        f"transitions={res.transitions:<9} depth={res.max_depth:<4} {res.seconds:7.1f}s"
        f"{extra}{done}: {v}"
    )
    if res.violation is not None and res.protocol.startswith("real"):
        print("    " + format_trace(res).replace("\n", "\n    "))


def run(quick: bool, seed: int, n_walks: int, budget_s: float) -> int:
    started = time.monotonic()
    out: dict[str, object] = {"mode": "quick" if quick else "deep", "seed": seed, "runs": []}
    runs: list[dict[str, object]] = out["runs"]  # type: ignore[assignment]
    bfs_cfgs = (QUICK_BFS,) if quick else DEEP_BFS
    steps = 120 if quick else 200
    protos: list[Protocol] = [REAL, *BAD]
    ok = True
    walk_cfgs = (WALK,) if quick else (WALK, WALK3)
    for i, c in enumerate(bfs_cfgs):
        print(f"exhaustive #{i}: {c}")
    for i, c in enumerate(walk_cfgs):
        print(f"walks #{i}:     {c}")
    for proto in protos:
        found = False
        for i, cfg in enumerate(bfs_cfgs):
            if proto in BAD and (found or proto is BAD_C):
                break  # caught already (C needs releases and time: the walks find it)
            res = bfs(cfg, proto, max_seconds=budget_s)
            res.mode = f"bfs#{i}"
            _print(res)
            runs.append({**res.summary(), "config": asdict(cfg)})
            found = found or res.violation is not None
        for i, wcfg in enumerate(walk_cfgs):
            if proto in BAD and found:
                break
            seeds = range(seed, seed + n_walks)
            res = walks(wcfg, proto, seeds, steps, max_seconds=budget_s)
            res.mode = f"walk#{i}"
            _print(res)
            runs.append({**res.summary(), "config": asdict(wcfg)})
            found = found or res.violation is not None
        if proto is REAL and found:
            ok = False
        if proto in BAD and not found:
            print(f"  !! known-bad rule set {proto.name} was NOT caught")
            ok = False
    out["seconds"] = round(time.monotonic() - started, 1)
    out["ok"] = ok
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{out['mode']}.json"
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"total {out['seconds']}s; summary in {path}")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m check", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="the CI run (about a minute)")
    ap.add_argument("--seed", type=int, default=0, help="first random-walk seed")
    ap.add_argument("--walks", type=int, default=None, help="random walks per rule set")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds per search (default 120 quick, 600 deep)",
    )
    a = ap.parse_args(argv)
    n = a.walks if a.walks is not None else (300 if a.quick else 20_000)
    budget = a.budget if a.budget is not None else (120.0 if a.quick else 600.0)
    return run(a.quick, a.seed, n, budget)


if __name__ == "__main__":
    sys.exit(main())

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
from .rulesets import BAD, FIXED_EXTEND, REAL, Protocol

RESULTS = Path(__file__).parent / "results"

#: CI: exhaustive over a small configuration (every interleaving and fault within the bounds)
QUICK_BFS = Config(
    daemons=2,
    keys=("k1", "k2"),
    resources=("ra", "rb"),
    max_faults=1,
    max_crashes=0,
    max_ops=3,
    horizon=6,
    ticks=(1, 5),
)
#: random walks: more daemons, keys and faults, longer runs
WALK = Config(
    daemons=3,
    keys=("k1", "k2"),
    resources=("ra", "rb", "rc"),
    max_faults=2,
    max_crashes=1,
    max_ops=10,
    horizon=30,
)
#: deep mode's exhaustive configuration (the target one, bounded: see docs/checker.md)
DEEP_BFS = Config(
    daemons=3,
    keys=("k1", "k2"),
    resources=("ra", "rb", "rc"),
    max_faults=1,
    max_crashes=1,
    max_ops=4,
    horizon=8,
    ticks=(1, 5),
)


def _print(res: Result) -> None:
    v = f"VIOLATION {res.violation.name}" if res.violation else "no violation"
    extra = f", {res.walks} walks" if res.mode == "walks" else ""
    done = "" if res.complete else " (budget reached: not exhaustive)"
    print(
        f"  {res.protocol:<18} {res.mode:<5} states={res.states:<9} "
        f"transitions={res.transitions:<9} depth={res.max_depth:<4} {res.seconds:7.1f}s"
        f"{extra}{done}: {v}"
    )
    if res.violation is not None and res.protocol.startswith("real"):
        print("    " + format_trace(res).replace("\n", "\n    "))


def run(quick: bool, seed: int, n_walks: int, budget_s: float) -> int:
    started = time.monotonic()
    out: dict[str, object] = {"mode": "quick" if quick else "deep", "seed": seed, "runs": []}
    runs: list[dict[str, object]] = out["runs"]  # type: ignore[assignment]
    bfs_cfg = QUICK_BFS if quick else DEEP_BFS
    steps = 120 if quick else 200
    protos: list[Protocol] = [REAL, *BAD] if quick else [REAL, FIXED_EXTEND, *BAD]
    ok = True
    print(f"exhaustive: {bfs_cfg}")
    print(f"walks:      {WALK}")
    for proto in protos:
        for res, cfg in (
            (bfs(bfs_cfg, proto, max_seconds=budget_s), bfs_cfg),
            (
                walks(WALK, proto, range(seed, seed + n_walks), steps, max_seconds=budget_s),
                WALK,
            ),
        ):
            _print(res)
            runs.append({**res.summary(), "config": asdict(cfg)})
            if proto is REAL and res.violation is not None:
                ok = False
        caught = any(
            r["violation"] for r in runs if r["protocol"] == proto.name
        )
        if proto in BAD and not caught:
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
        "--budget", type=float, default=None, help="seconds per search (default 8 quick, 600 deep)"
    )
    a = ap.parse_args(argv)
    n = a.walks if a.walks is not None else (300 if a.quick else 20_000)
    budget = a.budget if a.budget is not None else (8.0 if a.quick else 600.0)
    return run(a.quick, a.seed, n, budget)


if __name__ == "__main__":
    sys.exit(main())

"""Two revisions' CPU per cached hit and per new lease, in one run: ``python -m bench.ab A B``.

    python -m bench.ab 46f3281 HEAD [--rounds 5] [--leases 300] [--backend dynalite|moto]

Each revision is checked out (``git worktree``, in ~/.cache/rasd-bench-ab/, outside the
repository, whose tests read every file in it) and run by this interpreter with its own tree
first on PYTHONPATH; the two alternate round by round (A, B, A, B, ...), so drift in the
machine's load falls on both. A round is ``bench.clienthit`` (the client's CPU per hit read
from the hit table), ``bench.hotpath --rounds`` (the daemon's CPU per hit asked over the
socket, median of 15 x 20K) and ``bench.spawn --runs 1`` (the daemon's CPU per new lease, from
/proc, over ``--leases`` leases). Prints a table of medians with min and max over rounds, and B
- A paired round by round (mean +- standard error), and writes it as JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rasd-bench-ab"
#: what a round measures, and its unit
FIELDS = {"client_cpu_us_per_table_hit": "us", "cpu_us_per_hit": "us", "cpu_ms_per_new_lease": "ms"}
_HIT_RE = re.compile(r"cpu per hit\s*:\s*median ([0-9.]+) us")


def checkout(rev: str) -> tuple[str, Path]:
    """The revision's commit and a worktree of it (made once, reused)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    tree = CACHE / sha[:12]
    if not tree.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), sha],
                       cwd=ROOT, check=True)  # fmt: skip
    modules = ROOT / "bench" / "node_modules"  # dynalite, installed once
    if modules.exists() and not (tree / "bench" / "node_modules").exists():
        (tree / "bench" / "node_modules").symlink_to(modules)
    return sha, tree


def _run(tree: Path, argv: list[str]) -> str:
    path = os.pathsep.join(str(tree / p) for p in ("", "client", "jobs"))
    # the clock check by the Date header alone, as the fleet's daemons: a revision's bench may
    # not say so itself, and a bench machine may keep no synchronised kernel clock
    env = {"RASD_CLOCK_CHECK": "date", **os.environ, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, *argv], cwd=tree, env=env, check=True,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    return out.stdout


def one_round(tree: Path, leases: int, backend: str) -> dict[str, float]:
    table = _run(tree, ["-m", "bench.clienthit"])
    table_hit = json.loads(table[table.index("{") : table.rindex("}") + 1])
    hit = _HIT_RE.search(_run(tree, ["-m", "bench.hotpath", "--rounds"]))
    if hit is None:
        raise RuntimeError(f"bench.hotpath in {tree} printed no CPU per hit")
    spawn = _run(tree, ["-m", "bench.spawn", "--runs", "1", "--leases", str(leases),
                        "--backend", backend])  # fmt: skip
    new = json.loads(spawn[spawn.index("{") :])
    return {
        "client_cpu_us_per_table_hit": float(table_hit["cpu_us_median"]),
        "cpu_us_per_hit": float(hit.group(1)),
        "cpu_ms_per_new_lease": float(new["cpu_per_new_lease_ms"]),
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    """B - A of each round, the two run back to back: the mean, and its standard error (the
    spread of the differences over the square root of their number)."""
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {"mean": statistics.mean(diffs), "stderr": se}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n")[0])
    ap.add_argument("a", help="the revision before (any git revision)")
    ap.add_argument("b", help="the revision after")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--leases", type=int, default=300)
    ap.add_argument("--backend", choices=["dynalite", "moto"], default="dynalite")
    args = ap.parse_args(argv)
    revs = {name: checkout(rev) for name, rev in (("a", args.a), ("b", args.b))}
    rounds: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    load0 = os.getloadavg()
    for i in range(args.rounds):
        for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
            rounds[name].append(one_round(revs[name][1], args.leases, args.backend))
            print(f"round {i + 1} {name}: {rounds[name][-1]}", file=sys.stderr)
    result: dict[str, Any] = {"backend": args.backend, "leases": args.leases,
                              "loadavg": [load0, os.getloadavg()]}  # fmt: skip
    for name, (sha, _tree) in revs.items():
        result[name] = {"commit": sha, "rounds": rounds[name]}
        for field in FIELDS:
            result[name][field] = summary([r[field] for r in rounds[name]])
    result["b_minus_a"] = {
        f: paired([r[f] for r in rounds["a"]], [r[f] for r in rounds["b"]]) for f in FIELDS
    }
    head = f"{'':28}{'A ' + revs['a'][0][:8]:>28}{'B ' + revs['b'][0][:8]:>28}"
    print(f"{head}{'B - A, paired':>26}")
    for field, unit in FIELDS.items():
        cells = []
        for name in ("a", "b"):
            s = result[name][field]
            cells.append(f"{s['median']:.3f} {unit} ({s['min']:.3f}-{s['max']:.3f})")
        d = result["b_minus_a"][field]
        diff = f"{d['mean']:+.3f} +- {d['stderr']:.3f} {unit}"
        print(f"{field:28}{cells[0]:>28}{cells[1]:>28}{diff:>26}")
    out = ROOT / "bench" / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}-ab.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The flake hunt (``make flake-hunt``, docs/testing.md): every tier of the suite, again and
again, on a machine made slow on purpose, to find the tests whose outcome depends on timing.

Beside each run: ``--burners`` processes spinning on a core each, and moto's server slowed
(``rasd.devtools.motoserver``: ``RASD_MOTO_DELAY`` adds a random wait to every request,
``RASD_MOTO_STALLS`` a long one to a share of them). Each run's output and tier records go to
build/flake-hunt/DATE-TIME/run-N/; the end is a table: each run's length, the load average,
the tests that failed. A failure here is traced to its cause (docs/testing.md says what was
found), never waved through by a wider tolerance.

    python -m tests.flake_hunt --runs 3 [--burners 2] [--delay 0.002] [--stalls 0.01:0.3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.tiers import RECORDS, ROOT, read_records

OUT = ROOT / "build" / "flake-hunt"
#: a burner stops by itself after this long, should the hunt be killed before it stops them
BURN_LIMIT_S = 2 * 3600


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    code = f"import time\nend = time.monotonic() + {BURN_LIMIT_S}\n"
    code += "while time.monotonic() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


@dataclass
class Run:
    n: int
    rc: int
    seconds: float
    load: tuple[float, float]  # the 1-minute load average: mean and highest, every 10 s
    ran: int
    failed: list[str]


def one_run(hunt: Path, n: int, env: dict[str, str]) -> Run:
    out = hunt / f"run-{n}"
    out.mkdir(parents=True)
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10.0 if loads else 0.0):
            loads.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    with (out / "output.txt").open("w") as log:
        rc = subprocess.call(
            [sys.executable, "-m", "tests.tiers", "all"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    took = time.monotonic() - t0
    done.set()
    sampler.join()
    records = read_records()
    for path in RECORDS.glob("*.txt"):
        shutil.copy(path, out / path.name)
    failed = sorted(
        f"{tier}: {nodeid}"
        for tier, outcomes in records.items()
        for nodeid, outcome in outcomes.items()
        if outcome == "failed"
    )
    ran = sum(len(o) for o in records.values())
    return Run(n, rc, took, (sum(loads) / len(loads), max(loads)), ran, failed)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--burners", type=int, default=2, help="CPU-bound processes beside the suite")
    ap.add_argument("--delay", default="0.002", help="RASD_MOTO_DELAY: mean wait per request, s")
    ap.add_argument("--stalls", default="0.01:0.3", help="RASD_MOTO_STALLS: share:seconds")
    args = ap.parse_args(argv)
    env = {**os.environ, "RASD_MOTO_DELAY": args.delay, "RASD_MOTO_STALLS": args.stalls}
    # the burners run at the default priority: searches niced below them would never end
    env["RASD_TIERS_NICE"] = "0"
    hunt = OUT / time.strftime("%Y%m%d-%H%M%S")
    print(
        f"flake hunt: {args.runs} runs, {args.burners} burners, "
        f"moto delay {args.delay} s, stalls {args.stalls} (output in {hunt})",
        flush=True,
    )
    runs = []
    procs = burners(args.burners)
    try:
        for n in range(1, args.runs + 1):
            r = one_run(hunt, n, env)
            runs.append(r)
            print(
                f"run {n}: {r.seconds:.0f} s, load {r.load[0]:.1f} (at most {r.load[1]:.1f}), "
                f"{r.ran} tests, {len(r.failed)} failed (exit {r.rc})",
                flush=True,
            )
            for f in r.failed:
                print(f"    {f}", flush=True)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    print("\n| run | length | load (1 min: mean, highest) | tests | failed |")
    print("|---|---|---|---|---|")
    for r in runs:
        failed = "<br>".join(r.failed) or "none"
        load = f"{r.load[0]:.1f}, {r.load[1]:.1f}"
        print(f"| {r.n} | {r.seconds:.0f} s | {load} | {r.ran} | {failed} |")
    return 1 if any(r.failed or r.rc for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The test tiers: what each one runs and how, the command that runs them, and the check that
a run of every tier ran each test of the suite exactly once (docs/testing.md).

=============  =====================================================  ==========================
tier           tests                                                  run
=============  =====================================================  ==========================
fast           tests/unit but the two below: pure, no network          xdist; the inner loop
search         the protocol checker's searches (marker ``search``),    xdist
               in tests/unit/test_check*.py
property       Hypothesis properties (marker ``property``)             xdist
integration    moto's server over HTTP (``integration``)               xdist: a moto per worker
serial         many processes, or a load or a run of fixed length      alone, one test at a time
               sized for the whole machine (``serial``)
=============  =====================================================  ==========================

A test's tier follows from its markers (:func:`tier_of`), so no test is in two tiers; a test
of tests/integration/ must be marked ``integration`` or ``serial``, one of tests/unit/ neither.
``serial`` tests are kept from xdist because their premise is the machine: several daemons
and client processes, kill -9, a load sized so that moto just keeps up, a simulation whose
figures are compared. Every other test may run beside another (each xdist worker has its own
moto server, tables named by pid, sockets in its own temporary directories).

    python -m tests.tiers fast [search ...] [-- PYTEST_ARGS]   the tiers named, each in turn
    python -m tests.tiers all [--first CMD] [--beside CMD]     every tier (ALL), then the check
    python -m tests.tiers check                                the check alone

``all`` runs fast, property and integration in one xdist run and then serial, with the
searches beside them at a low CPU priority (see ALL); ``--first`` runs a shell command at the
head of the first lane, ``--beside`` one in a lane of its own at the usual priority (make
test's lint, type check and real-systemd test, beside the tests). Each run records what each of its
tiers ran, and how it ended, in build/tiers/TIER.txt; the check collects the whole suite
once and compares. pytest's exit code 5 (nothing selected, say by a ``-k`` given after
``--``) is a tier that ran nothing, not a failure. ``all`` runs every tier even after one
failed, then ends with one line that counts every tier's tests.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "build" / "tiers"
SEARCH_FILES = tuple(sorted(f"tests/unit/{p.name}" for p in ROOT.glob("tests/unit/test_check*.py")))


@dataclass(frozen=True)
class Tier:
    name: str
    paths: tuple[str, ...]
    xdist: bool


TIERS = {
    t.name: t
    for t in (
        Tier("fast", ("tests/unit",), xdist=True),
        # the searches' files only: collecting all of tests/unit costs each of the run's
        # three processes 9 s (a search elsewhere is caught by the check: run by no tier)
        Tier("search", SEARCH_FILES, xdist=True),
        Tier("property", ("tests/unit",), xdist=True),
        Tier("integration", ("tests/integration",), xdist=True),
        Tier("serial", ("tests/integration",), xdist=False),
    )
}
#: what ``all`` (make test) runs: lanes at the same time, each a sequence of runs. The first
#: lane: fast, property and integration in one xdist run (the pure tests fill the cores while
#: integration tests wait on I/O), then serial. Beside it, the searches at a low CPU priority
#: (:data:`NICE`): the first lane has the machine whenever it wants it, as if alone, and the
#: searches use what it leaves (its processes wait on sockets and on each other much of the
#: time). A search leaves millions of objects that make its process's next garbage
#: collections take seconds, so no daemon or property runs in a search's process.
ALL: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("fast", "property", "integration"), ("serial",)),
    (("search",),),
)
#: the niceness of a tier's run in any lane but the first (0: as the runner's);
#: RASD_TIERS_NICE overrides it (the flake hunt: 0, so that its CPU burners, at 0, leave the
#: searches their share instead of starving them)
NICE = {"search": 15}
#: the tiers a test of each directory may be in
BY_DIR = {
    "tests/unit": ("fast", "search", "property"),
    "tests/integration": ("integration", "serial"),
}


def tier_of(item: pytest.Item) -> str:
    """serial, else integration, else search, else property, else fast."""
    marks = {m.name for m in item.iter_markers()}
    for tier in ("serial", "integration", "search", "property"):
        if tier in marks:
            return tier
    return "fast"


# ------------------------------------------------------------------ the plugin (conftest)
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tiers", "test tiers (tests/tiers.py)")
    group.addoption("--tier", type=_tier_names, help="run these tiers' tests only (a,b,...)")
    group.addoption(
        "--tier-records", metavar="DIR", help="write what ran, and how, to DIR/TIER.txt"
    )


def _tier_names(value: str) -> tuple[str, ...]:
    names = tuple(value.split(","))
    unknown = [n for n in names if n not in TIERS]
    if unknown:
        raise ValueError(f"unknown tiers {unknown}; {', '.join(TIERS)}")
    return names


def pytest_configure(config: pytest.Config) -> None:
    records = config.getoption("tier_records")
    tiers = config.getoption("tier")
    if records and tiers and not hasattr(config, "workerinput"):  # xdist's controller, or none
        config.pluginmanager.register(Recorder(Path(records), tiers), "tier-recorder")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers = config.getoption("tier")
    if tiers is None:
        return
    keep = [it for it in items if tier_of(it) in tiers]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[it for it in items if tier_of(it) not in tiers])
        items[:] = keep
    for it in keep:
        it.user_properties.append(("tier", tier_of(it)))  # for the records, in the reports


class Recorder:
    """Each test's outcome, from its reports (under xdist the workers' reach the controller):
    failed if a phase failed, else skipped if one was skipped (an xfail too), else passed;
    one file per tier run, empty when it selected nothing."""

    RANK = {"passed": 0, "skipped": 1, "failed": 2}

    def __init__(self, directory: Path, tiers: tuple[str, ...]) -> None:
        self.directory = directory
        self.outcomes: dict[str, dict[str, str]] = {t: {} for t in tiers}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        tier = str(dict(report.user_properties).get("tier") or self.guess(report.nodeid))
        outcomes = self.outcomes[tier]
        was = outcomes.get(report.nodeid, "passed")
        outcomes[report.nodeid] = max(was, report.outcome, key=self.RANK.__getitem__)

    def guess(self, nodeid: str) -> str:
        """The tier of a report without one: xdist's for a worker that crashed in a test
        (the first of this run's tiers that the test's directory allows)."""
        allowed = next((t for d, t in BY_DIR.items() if nodeid.startswith(d + "/")), ())
        return next((t for t in self.outcomes if t in allowed), next(iter(self.outcomes)))

    def pytest_sessionfinish(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for tier, outcomes in self.outcomes.items():
            lines = [f"{nodeid}\t{outcome}\n" for nodeid, outcome in sorted(outcomes.items())]
            (self.directory / f"{tier}.txt").write_text("".join(lines))


# ---------------------------------------------------------------------------- the runner
def command(names: tuple[str, ...], extra: list[str], beside: bool = False) -> list[str]:
    """The pytest command of one run of the tiers ``names`` (``beside``: beside the first
    lane)."""
    tiers = [TIERS[n] for n in names]
    paths = list(dict.fromkeys(p for t in tiers for p in t.paths))
    args = [sys.executable, "-m", "pytest", *paths, "--tier", ",".join(names)]
    args += ["--tier-records", str(RECORDS)]
    if all(t.xdist for t in tiers):
        # worksteal evens out tests of very different lengths
        args += ["-n", workers(names), "--dist", "worksteal"]
    nice = max((NICE.get(n, 0) for n in names), default=0) if beside else 0
    nice = int(os.environ.get("RASD_TIERS_NICE", nice)) if nice else 0
    return [*(["nice", "-n", str(nice)] if nice else []), *args, *extra]


def workers(names: tuple[str, ...]) -> str:
    """xdist's workers for a run: as many as cores, or twice that for a run with integration
    tests, which wait on moto and on timers much of the time (fast, property and integration
    in one run: 189 s on 2 workers, 138 s on 4, the same CPU). PYTEST_XDIST_AUTO_NUM_WORKERS
    overrides both."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or "integration" not in names:
        return "auto"
    return str(2 * len(os.sched_getaffinity(0)))


Ran = tuple[tuple[str, ...], int, float, float]


def run_lanes(
    lanes: tuple[tuple[tuple[str, ...], ...], ...],
    extra: list[str],
    first: str | None = None,
    beside: str | None = None,
) -> list[Ran]:
    """The lanes at the same time, each its runs in turn; for each run: its tiers, its exit
    code (5, nothing selected, as 0), its seconds and the CPU seconds of its processes
    (pytest's and every one under it that ended). ``first``, a shell command, runs at the
    head of the first lane; ``beside``, one, in a lane of its own. The first lane prints as
    it goes; each run of another writes to build/tiers/NAME.log, printed when it ends."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    out: list[Ran] = []
    printing = threading.Lock()
    threads = [
        threading.Thread(target=_lane, args=(lane, extra, i > 0, out, printing, first))
        for i, lane in enumerate(lanes)
    ]
    if beside:
        threads.append(threading.Thread(target=_beside, args=(beside, out, printing)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _lane(
    runs: tuple[tuple[str, ...], ...],
    extra: list[str],
    beside: bool,
    out: list[Ran],
    printing: threading.Lock,
    first: str | None,
) -> None:
    if first and not beside:
        with printing:
            print(f"== {first}", flush=True)
        out.append(_shell(first, None))
    for names in runs:
        for n in names:
            (RECORDS / f"{n}.txt").unlink(missing_ok=True)
        args = command(names, extra, beside)
        nice = f" (nice {args[2]}, beside the first lane)" if args[0] == "nice" else ""
        with printing:
            print(f"== {' '.join(args[args.index('-m') + 2 :])}{nice}", flush=True)
        path = RECORDS / f"{'+'.join(names)}.log"
        t0 = time.monotonic()
        with open(path, "wb") if beside else contextlib.nullcontext() as log:
            proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=log)
            _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        took, cpu = time.monotonic() - t0, usage.ru_utime + usage.ru_stime
        with printing:
            if beside:
                print(f"\n== {'+'.join(names)}, its output:", flush=True)
                sys.stdout.buffer.write(path.read_bytes())
                sys.stdout.flush()
            if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
                print(f"== {'+'.join(names)}: no test selected", flush=True)
                rc = 0
        out.append((names, rc, took, cpu))


def _shell(cmd: str, log: Path | None) -> Ran:
    """Run a shell command (its output to ``log``, else ours) and account for it as a run."""
    t0 = time.monotonic()
    with open(log, "wb") if log else contextlib.nullcontext() as f:
        proc = subprocess.Popen(cmd, shell=True, cwd=ROOT, stdout=f, stderr=f)
        _, status, usage = os.wait4(proc.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    return ((cmd,), rc, time.monotonic() - t0, usage.ru_utime + usage.ru_stime)


def _beside(cmd: str, out: list[Ran], printing: threading.Lock) -> None:
    with printing:
        print(f"== {cmd} (beside the tests)", flush=True)
    path = RECORDS / "beside.log"
    ran = _shell(cmd, path)
    with printing:
        print(f"\n== {cmd}, its output (exit {ran[1]}):", flush=True)
        sys.stdout.buffer.write(path.read_bytes())
        sys.stdout.flush()
    out.append(ran)


def read_records() -> dict[str, dict[str, str]]:
    """tier -> {nodeid: outcome}, for the tiers that left a record."""
    got = {}
    for name in TIERS:
        path = RECORDS / f"{name}.txt"
        if path.exists():
            lines = path.read_text().splitlines()
            got[name] = dict(line.rsplit("\t", 1) for line in lines if line)
    return got


class Collector:
    def __init__(self) -> None:
        self.items: list[tuple[str, str, bool]] = []  # (nodeid, tier, a Hypothesis property)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = [
            (it.nodeid, tier_of(it), getattr(getattr(it, "obj", None), "is_hypothesis_test", False))
            for it in session.items
        ]


def collect() -> list[tuple[str, str, bool]]:
    """Every test of the suite, with its tier (one collection, in this process; quiet)."""
    c = Collector()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = pytest.main(["--collect-only", "-q", "tests"], plugins=[c])
    if rc != pytest.ExitCode.OK:
        print(out.getvalue())
        raise SystemExit(f"tiers: collecting the suite failed (pytest exit {rc})")
    return c.items


def check(records: dict[str, dict[str, str]]) -> list[str]:
    """What is wrong with the split and with the records of a run of every tier."""
    problems = []
    items = collect()
    for nodeid, tier, hypothesis in items:
        where = next((d for d in BY_DIR if nodeid.startswith(d + "/")), None)
        if where is None:
            problems.append(f"{nodeid}: outside {' and '.join(BY_DIR)}")
        elif tier not in BY_DIR[where]:
            problems.append(f"{nodeid}: in {where}/ but in the {tier} tier")
        elif hypothesis and tier == "fast":
            problems.append(f"{nodeid}: a Hypothesis property, not marked property")
    missing = [name for name in TIERS if name not in records]
    problems += [f"tier {name}: no record of a run" for name in missing]
    ran: dict[str, list[str]] = defaultdict(list)
    for name, outcomes in records.items():
        for nodeid in outcomes:
            ran[nodeid].append(name)
    problems += [f"{n}: run by the tiers {', '.join(t)}" for n, t in ran.items() if len(t) > 1]
    collected = {nodeid for nodeid, _, _ in items}
    if not missing:
        problems += [f"{n}: run by no tier" for n in sorted(collected - ran.keys())]
    problems += [f"{n}: run, but no longer in the suite" for n in sorted(ran.keys() - collected)]
    return problems


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    names, extra = argv[:cut], argv[cut + 1 :]
    first = beside = None
    if "--first" in names[:-1]:
        i = names.index("--first")
        first, names = names[i + 1], names[:i] + names[i + 2 :]
    if "--beside" in names[:-1]:
        i = names.index("--beside")
        beside, names = names[i + 1], names[:i] + names[i + 2 :]
    os.chdir(ROOT)
    # each module's bytecode is written by the first process that imports it: a run starts
    # hundreds (daemons, jobs, moto servers, apps), and where PYTHONDONTWRITEBYTECODE is set
    # each would compile boto3, moto and ours again (about a tenth of the suite's CPU)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if names == ["check"]:
        problems = check(read_records())
        for p in problems:
            print(f"tiers: {p}")
        print("tiers: each test run by exactly one tier" if not problems else "tiers: FAILED")
        return 1 if problems else 0
    every = names == ["all"]
    lanes = ALL if every else (tuple((n,) for n in names),)
    unknown = [n for n in names if n not in TIERS] if not every else []
    if not names or unknown:
        print(__doc__)
        print(f"tiers: unknown {unknown}; one of {', '.join(TIERS)}, all, check")
        return 2
    if every:
        for path in RECORDS.glob("*.txt"):
            path.unlink()
    failed = []
    times: dict[str, tuple[float, float]] = {}
    for group, rc, secs, cpu in run_lanes(lanes, extra, first, beside):
        times["+".join(group)] = (secs, cpu)
        if rc != 0:
            failed.append(f"{'+'.join(group)} (exit {rc})")
    tiers = [n for lane in lanes for group in lane for n in group]
    records = read_records()
    counts: Counter[str] = Counter()
    for name in tiers:
        counts.update(records.get(name, {}).values())
    took = [f"{n} {secs:.0f} s (CPU {cpu:.0f} s)" for n, (secs, cpu) in times.items()]
    print("\n== tests by tier: " + ", ".join(f"{n} {len(records.get(n, {}))}" for n in tiers))
    print(f"== {', '.join(took)}; load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    problems = check(records) if every and not extra else []
    for p in problems:
        print(f"tiers: {p}")
    if failed or problems:
        print(f"tiers failed: {', '.join(failed) or 'the check'}")
    summary = f"{counts['passed']} passed, {counts['failed']} failed"
    print(f"tiers: {summary}, {counts['skipped']} skipped", flush=True)
    return 1 if failed or problems or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

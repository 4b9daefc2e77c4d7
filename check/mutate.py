"""``python -m check.mutate`` (``make mutate``): mutation testing of the protocol's pure code.

Runs mutmut on the functions of :data:`TARGETS`, in two phases (unit tests first, then the
checker's searches for what survives), scores the run less the mutants argued equivalent
(``check/mutate_equivalent.json``) and writes ``check/results/mutate.json``.
docs/checker.md, "Mutation testing".
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "check" / "results" / "mutate.json"
EQUIVALENT = ROOT / "check" / "mutate_equivalent.json"

#: What is mutated: a file (or a directory: every module in it, now and later) and the
#: functions of it that count (None: all of them; ``Class.method`` for a method).
TARGETS: dict[str, tuple[str, ...] | None] = {
    # the decisions (the acquisition's and the lease's rules, beside the paper's agent, the jobs')
    "rasd/core/decide.py": None,
    "rasd/core/legacy.py": None,
    "rasd/core/verdicts.py": None,
    "rasd/core/writes.py": None,
    # a strict pool's agreement: its writes and what a daemon decides from it
    "rasd/core/agree.py": None,
    # whether this host's clock is trusted within the skew bound (every margin rests on it)
    "rasd/core/clock_trust.py": None,
    # when a cached answer is served: S, the lease's end, a pool's outage window
    "rasd/core/cache_rules.py": None,
    "rasd/steps/": None,
    # the predicates the items' types keep, and the TTL every reaped item gets
    "rasd/core/lease.py": (
        "ResourceItem.leased",
        "ResourceItem.expired",
        "ResourceItem.holder_current",
        "ResourceItem.claimable",
        "Lease.remaining_us",
        "ttl_after",
    ),
    # the write builders (every conditional write the protocol sends), the paper's agent's
    # writes (as the checker runs it beside the daemons) and the read-backs; not the meta
    # items' writes (a new resource, headroom, miss counters)
    "rasd/core/builders.py": (
        "_free_until",
        "claim",
        "fence_resource",
        "free_claim",
        "extend_resource",
        "liberate",
        "free_orphan",
        "relist",
        "adopt",
        "move",
        "tombstone",
        "readd",
        "paper_claim",
        "paper_free",
    ),
    "rasd/core/map_builders.py": (
        "_ver_is",
        "_pending",
        "map_acquire",
        "map_acquire_unheld",
        "map_confirm",
        "map_extend",
        "map_release",
        "map_fence",
        "map_drop_dead",
        "names_claim",
        "holds",
        "not_held_by",
        "no_token",
        "extended_to",
        "map_extended_to",
        "_at_least",
    ),
    "rasd/core/serialize.py": ("is_tombstone",),
}

#: mutmut's exit codes, as its ``status_by_exit_code`` reads them
_STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "caught by type check",
}
_DETECTED = ("killed", "timeout", "caught by type check")


def _module(path: str) -> str:
    mod = path.removesuffix(".py").replace("/", ".")
    return mod.removesuffix(".__init__")


def target_files() -> list[str]:
    """Every file a target names, directories expanded (sorted, relative to the root)."""
    out: list[str] = []
    for target in TARGETS:
        if target.endswith("/"):
            out += sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / target).glob("*.py"))
        else:
            out.append(target)
    return out


def _mangled(function: str) -> str:
    cls, _, name = function.rpartition(".")
    return f"xǁ{cls}ǁ{name}" if cls else f"x_{name}"


def name_globs() -> list[str]:
    """The mutant names to run, as the globs ``mutmut run`` takes."""
    globs: list[str] = []
    for target, functions in TARGETS.items():
        if target.endswith("/"):
            globs += [f"{_module(f)}.x*" for f in target_files() if f.startswith(target)]
        elif functions is None:
            globs.append(f"{_module(target)}.x*")
        else:
            globs += [f"{_module(target)}.{_mangled(fn)}__mutmut_*" for fn in functions]
    return globs


def _file_of(mutant: str, files: list[str]) -> str | None:
    prefix = mutant.rpartition(".")[0]
    return next((f for f in files if _module(f) == prefix), None)


def _function_of(mutant: str) -> str:
    tail = mutant.rpartition(".")[2].partition("__mutmut_")[0]
    if tail.startswith("xǁ"):
        _, cls, name = tail.split("ǁ")
        return f"{cls}.{name}"
    return tail.removeprefix("x_")


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's (rasd.core.decide.x_on_read__mutmut_12)
    file: str
    function: str
    status: str
    line: int  # first changed line in the file, 0 if unknown
    old: str  # the changed source lines, whitespace collapsed, " / " between lines
    new: str

    @property
    def ident(self) -> str:
        """The stable id the equivalent list uses."""
        return f"{self.file}::{self.function}::{self.old} => {self.new}"


def _collapse(lines: list[str]) -> str:
    return " / ".join(re.sub(r"\s+", " ", ln).strip() for ln in lines)


def _def_lines(path: Path) -> dict[str, int]:
    """``function`` or ``Class.method`` -> the line of its ``def``."""
    tree = ast.parse(path.read_text())
    out: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    out[f"{node.name}.{sub.name}"] = sub.lineno
    return out


def _diff(mutant: str, file: str) -> tuple[int, list[str], list[str]]:
    """The offset of the first changed line from the ``def`` line, and the lines changed."""
    import libcst as cst
    from mutmut.mutation.diff_apply import (
        read_functions_from_index,
        read_mutant_function,
        read_mutants_module,
        read_original_function,
    )

    functions = read_functions_from_index(mutant, file)
    if functions is None:
        module = read_mutants_module(file)
        functions = (read_original_function(module, mutant), read_mutant_function(module, mutant))
    orig, mutated = (cst.Module([fn]).code.splitlines() for fn in functions)
    old: list[str] = []
    new: list[str] = []
    first = -1
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=orig, b=mutated).get_opcodes():
        if tag == "equal":
            continue
        first = i1 if first < 0 else first
        old += orig[i1:i2]
        new += mutated[j1:j2]
    # the function's text starts with the comments and decorators above its ``def``
    defs = [i for i, ln in enumerate(orig) if ln.lstrip().startswith(("def ", "async def "))]
    return first - (defs[0] if defs else 0), old, new


def collect(with_diffs: bool = True) -> list[Mutant]:
    """The results mutmut left in ``mutants/`` for the targets' mutants."""
    files = target_files()
    globs = name_globs()
    defs = {f: _def_lines(ROOT / f) for f in files if (ROOT / f).exists()}
    out: list[Mutant] = []
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        for f in files:
            meta = ROOT / "mutants" / (f + ".meta")
            if not meta.exists():
                continue
            codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
            for name, code in sorted(codes.items(), key=lambda kv: _natural(kv[0])):
                if not any(fnmatch.fnmatchcase(name, g) for g in globs):
                    continue
                status = "not checked" if code is None else _STATUS.get(code, "suspicious")
                function = _function_of(name)
                line, old, new = 0, list[str](), list[str]()
                if with_diffs and status not in (*_DETECTED, "not checked"):
                    offset, old, new = _diff(name, f)
                    line = defs[f].get(function, 0) + offset if function in defs[f] else 0
                out.append(Mutant(name, f, function, status, line, _collapse(old), _collapse(new)))
    finally:
        os.chdir(cwd)
    return out


def _natural(name: str) -> tuple[str, int]:
    base, _, n = name.rpartition("__mutmut_")
    return base, int(n) if n.isdigit() else 0


def load_equivalent() -> dict[str, str]:
    """id -> why, from ``check/mutate_equivalent.json``."""
    if not EQUIVALENT.exists():
        return {}
    entries: list[dict[str, str]] = json.loads(EQUIVALENT.read_text())
    return {e["id"]: e["why"] for e in entries}


def summarize(mutants: list[Mutant], seconds: float | None, command: list[str]) -> dict[str, Any]:
    """Counts per file, the score, the survivors; written to ``check/results/mutate.json``."""
    equivalent = load_equivalent()
    by_file: dict[str, Counter[str]] = {}
    survivors: list[dict[str, Any]] = []
    argued: list[dict[str, Any]] = []
    used: set[str] = set()
    for m in mutants:
        status = m.status
        if status not in _DETECTED and m.ident in equivalent:
            status = "equivalent"
            used.add(m.ident)
            argued.append({"id": m.ident, "line": m.line, "why": equivalent[m.ident]})
        by_file.setdefault(m.file, Counter())[status] += 1
        if status not in (*_DETECTED, "equivalent", "not checked"):
            survivors.append(
                {
                    "file": m.file,
                    "function": m.function,
                    "line": m.line,
                    "status": status,
                    "mutation": f"{m.old} => {m.new}",
                    "id": m.ident,
                    "mutmut": m.name,
                }
            )
    total: Counter[str] = Counter()
    for c in by_file.values():
        total.update(c)
    return {
        "tool": f"mutmut {version('mutmut')}",
        "command": " ".join(command),
        "seconds": None if seconds is None else round(seconds, 1),
        "files": {f: dict(sorted(c.items())) for f, c in by_file.items()},
        "total": dict(sorted(total.items())),
        "score": _score(total),
        "survivors": survivors,
        "equivalent": argued,
        "equivalent_unmatched": sorted(set(equivalent) - used),
    }


def _score(c: Counter[str]) -> float | None:
    detected = sum(c[s] for s in _DETECTED)
    counted = sum(c.values()) - c["equivalent"] - c["skipped"] - c["not checked"]
    return round(detected / counted, 4) if counted else None


def print_summary(out: dict[str, Any]) -> None:
    cols = ["killed", "timeout", "survived", "no tests", "equivalent", "not checked"]
    print(f"\n{out['tool']}, {out['seconds']} s")
    print(f"{'file':<28}{'mutants':>8}" + "".join(f"{c:>12}" for c in cols) + f"{'score':>8}")
    for f, c in [*out["files"].items(), ("total", out["total"])]:
        n = sum(c.values())
        sc = _score(Counter(c))
        print(
            f"{f:<28}{n:>8}"
            + "".join(f"{c.get(k, 0):>12}" for k in cols)
            + f"{'' if sc is None else f'{sc:.1%}':>8}"
        )
    for s in out["survivors"]:
        print(f"  {s['status']:>10}  {s['file']}:{s['line']} {s['function']}: {s['mutation']}")
    for ident in out["equivalent_unmatched"]:
        print(f"  (no mutant matches the equivalent entry {ident!r})")


#: a mutant the first phase let through, for the second
_AGAIN = ("survived", "no tests")


def _mutmut(names: list[str], jobs: int, fast: bool) -> int:
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *names]
    env = {k: v for k, v in os.environ.items() if k != "RASD_MUTATE_FAST"}
    if fast:
        env["RASD_MUTATE_FAST"] = "1"
    rc = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
    if rc != 0:
        print(f"mutmut exited {rc}", file=sys.stderr)
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m check.mutate", description=__doc__)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="mutants at once")
    ap.add_argument(
        "--summary-only", action="store_true", help="summarize the results left in mutants/"
    )
    ap.add_argument(
        "--phase",
        choices=("both", "fast", "checker"),
        default="both",
        help="fast: every mutant against the unit tests without the checker's searches; "
        "checker: the mutants still alive (survived, no tests; not argued equivalent) "
        "against every test; both (default): one, then the other",
    )
    ap.add_argument("--min-score", type=float, default=0.95, help="exit 1 below this score")
    ap.add_argument(
        "--seconds", type=float, help="with --summary-only: the run's measured time, to record"
    )
    ap.add_argument("--note", default="", help="a note to record in the summary")
    ap.add_argument("names", nargs="*", help="mutmut names or globs (default: every target)")
    a = ap.parse_args(argv)
    seconds = a.seconds
    phases: dict[str, float] = {}
    if not a.summary_only:
        if not a.names and a.phase != "checker":  # a full run starts clean
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        t0 = time.monotonic()
        if a.phase in ("both", "fast"):
            rc = _mutmut(a.names or name_globs(), a.jobs, fast=True)
            phases["fast"] = round(time.monotonic() - t0, 1)
            if rc != 0:
                return rc
        if a.phase in ("both", "checker"):
            equivalent = load_equivalent()
            wanted = a.names or name_globs()
            again = [
                m.name
                for m in collect()
                if m.status in _AGAIN
                and m.ident not in equivalent
                and any(fnmatch.fnmatchcase(m.name, g) for g in wanted)
            ]
            t1 = time.monotonic()
            if again:
                print(f"second phase: {len(again)} mutants against every test", flush=True)
                rc = _mutmut(again, a.jobs, fast=False)
                if rc != 0:
                    return rc
            phases["checker"] = round(time.monotonic() - t1, 1)
        seconds = time.monotonic() - t0
    out = summarize(collect(), seconds, ["python -m check.mutate", *(a.names or [])])
    if phases:
        out["phases_seconds"] = phases
    if a.note:
        out["note"] = a.note
    print_summary(out)
    if not a.names:  # a full run, or the summary of one
        RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["score"] is not None and out["score"] >= a.min_score else 1


if __name__ == "__main__":
    sys.exit(main())

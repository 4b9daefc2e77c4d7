"""One source for the daemon's protocol: the checker runs the driver's programs.

The protocol checker (check/) and the daemon's driver (rasd/daemon/driver.py, for the roles
rasd/daemon/coordinator.py composes) must not be able to diverge: both run the daemon's programs
(rasd.steps.daemon and the modules beside it: take, settle, renew, give_back), and nothing in
check/ builds the daemon's writes itself.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from check.model import Config, World, initial, successors
from check.procs import Proc
from check.rulesets import BAD_A, REAL
from rasd.daemon import acquire, coordinator, driver, releaser, renewer, reporter
from rasd.steps import daemon as daemon_steps
from rasd.steps import give_back, renew, settle, take

#: the daemon's programs, by name (a trace is named by its program's ``__qualname__``)
PROGRAMS = {f.__qualname__: f for f in take.PROGRAMS}
#: the modules that hold the daemon's programs
STEPS = (daemon_steps, give_back, renew, settle, take)
#: the driver and the roles that run them
ROLES = (acquire, coordinator, driver, releaser, renewer, reporter)

CHECK = Path(__file__).resolve().parents[2] / "check"

#: rasd.core.builders' and .map_builders' builders of the daemon's writes and read-backs: the
#: programs' alone
DAEMON_WRITES = {
    "adopt",
    "claim",
    "extend_resource",
    "extended_to",
    "fence_resource",
    "holds",
    "map_acquire",
    "map_confirm",
    "map_drop_dead",
    "map_extend",
    "map_extended_to",
    "names_claim",
    "no_token",
    "not_held_by",
}

SMALL = Config(
    daemons=2,
    keys=("k1", "k2"),
    resources=("ra",),
    max_faults=1,
    max_crashes=0,
    max_ops=3,
    horizon=6,
    ticks=(1, 5),
    release=True,
    liberator=False,
)


def _procs(w: World) -> list[Proc]:
    return [p for d in w.daemons for p in (d.req, *d.bg) if p is not None]


def test_the_checkers_daemon_processes_run_the_drivers_programs() -> None:
    """Every daemon process of every state reached is a trace of a program of
    the daemon's programs: replayed, its generator runs that function's code."""
    programs = {f.__code__ for f in take.PROGRAMS}
    seen: set[str] = set()
    frontier = [initial(SMALL, REAL)]
    for _ in range(12):  # breadth-first, a sample of each level
        nxt = []
        for w in frontier:
            for p in _procs(w):
                gen = p.trace.start()
                assert gen.gi_code in programs, p.trace.name  # type: ignore[attr-defined]
                assert PROGRAMS[p.trace.name].__code__ is gen.gi_code  # type: ignore[attr-defined]
                seen.add(p.trace.name)
                gen.close()
            nxt += [x for _, x in successors(w)]
        frontier = nxt[:: max(1, len(nxt) // 300)]
    # requests, releases, and the background programs a lease starts
    assert {"resolve", "release", "confirm", "free_claim"} <= seen, seen


def test_the_driver_runs_the_same_programs() -> None:
    """The roles rasd/daemon/coordinator.py composes drive the daemon's programs through
    rasd/daemon/driver.py, and decide nothing themselves: every program a daemon runs is
    started by a role (or spawned by another program), and no role names a write builder or
    a decision."""
    src = "\n".join(inspect.getsource(m) for m in ROLES)
    for name in ("resolve", "release", "extend_bg", "reconfirm", "relist"):
        assert f"{name}(" in src, name
    for m in ROLES:
        tree = ast.parse(inspect.getsource(m))
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not used & DAEMON_WRITES, (m.__name__, used & DAEMON_WRITES)
        assert "after_acquire" not in used and "on_read" not in used, m.__name__


def test_the_daemons_programs_import_no_role() -> None:
    """The programs' modules import one another downwards only (daemon, then give_back,
    renew, settle, take) and nothing of the daemon's driver or roles."""
    order = [m.__name__.rsplit(".", 1)[1] for m in STEPS]
    for i, m in enumerate(STEPS):
        tree = ast.parse(inspect.getsource(m))
        froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        steps = {(n.module or "").split(".")[0] for n in froms if n.level == 1}
        later = set(order[i:])
        assert not steps & later, (m.__name__, steps & later)
        rasd = {(n.module or "").split(".")[0] for n in froms if n.level == 2}
        assert rasd <= {"core"}, (m.__name__, rasd)


def test_check_builds_none_of_the_daemons_writes() -> None:
    """No module of check/ names a builder of the daemon's writes: the model's daemons
    write only what the programs send (the jobs and the liberator have their own)."""
    for path in sorted(CHECK.glob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
        names = {f.id for f in calls if isinstance(f, ast.Name)}
        names |= {f.attr for f in calls if isinstance(f, ast.Attribute)}
        names |= {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom)
            for a in n.names
        }
        assert not names & DAEMON_WRITES, (path.name, names & DAEMON_WRITES)


def test_a_known_bad_rule_set_changes_only_the_programs_functions() -> None:
    """The known-bad rule sets reach the daemons through Ops (check/rulesets.py), never
    through production code: the real rules run rasd.steps.daemon.REAL itself."""
    assert initial(SMALL, REAL).setups[0].ops is daemon_steps.REAL
    bad = initial(SMALL, BAD_A).setups[0].ops
    assert bad is not daemon_steps.REAL and bad.name == BAD_A.name
    for m in STEPS:
        assert "import" not in "".join(
            line for line in inspect.getsource(m).splitlines() if "check" in line
        ), m.__name__


CACHE_RULES = "rasd.core.cache_rules"


def _uses(path: Path, module: str) -> set[str]:
    """The attributes of ``module`` (``package.name``, imported under any name) that the file
    at ``path`` uses."""
    tree = ast.parse(path.read_text())
    package, _, name = module.rpartition(".")
    local = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").endswith(package.split(".")[-1])
        for a in n.names
        if a.name == name
    }
    return {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in local
    }


def test_the_cache_and_refresh_rules_are_the_cache_rules() -> None:
    """The daemon's local policy (an entry's validity, put precedence, the hit's refresh,
    extend or re-confirm) is ``rasd.core.cache_rules``: the lease cache, the renewer and the
    checker's model of a daemon all decide by it, and the model decides nothing of it
    itself (no extension rule of its own)."""
    rasd_dir = CHECK.parent / "rasd"
    rules = {"valid_until", "keeps_current", "serves", "stale", "refresh_of", "extend_from"}
    # the model of a daemon: its host, and the app calls (the cache hit)
    daemon = (CHECK / "daemon_host.py", CHECK / "model.py")
    model = set().union(*(_uses(path, CACHE_RULES) for path in daemon))
    assert rules | {"hit_wants_refresh"} <= model
    assert {"valid_until", "keeps_current", "serves", "stale", "extend_from"} <= _uses(
        rasd_dir / "daemon" / "cache.py", CACHE_RULES
    )
    assert {"refresh_of", "Refresh"} <= _uses(rasd_dir / "daemon" / "renewer.py", CACHE_RULES)
    names = {
        n.id
        for path in daemon
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Name)
    }
    assert "should_extend" not in names

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
from dataclasses import asdict, replace
from pathlib import Path

from .explore import Result, bfs, format_trace, walks
from .model import Config
from .rulesets import (
    BAD,
    BAD_C,
    BAD_D1,
    BAD_D2,
    BAD_E,
    BAD_G,
    BAD_HT,
    BAD_L,
    BAD_M,
    BAD_O,
    BAD_O2,
    BAD_P,
    BAD_R,
    BAD_S,
    BAD_X,
    REAL,
    Protocol,
)

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


#: two regions (d0 in r1, d1 in r2, clocks in step), one key, ra in r1 and rb, rc in r2;
#: d0's apps ask for 8 s leases, d1's for 6 s; one ras-dedupe run (its clock +1). Explored
#: from a cross-region duplicate (the paper's 0.1 %: both regions missed k1 and acquired):
DEDUPE = Config(
    daemons=2,
    regions=("r1", "r2"),
    offsets=(0, 0),
    keys=("k1",),
    resources=("ra", "rb", "rc"),
    resource_regions=("r1", "r2", "r2"),
    leases=(8, 6),
    max_faults=0,
    max_crashes=0,
    max_ops=2,
    liberator=False,
    release=False,
    dedupe_runs=1,
)


def _acquired(d: int, res: str) -> list[str]:
    return [
        f"d{d} get_lease(k1) called",
        f"d{d} get_lease(k1) read mapping",
        f"d{d} get_lease(k1) candidate {res}",
        f"d{d} get_lease(k1) map_acquire APPLIED",
        f"d{d} get_lease(k1) claim APPLIED",
    ]


#: ... both mappings still pending (their map_confirm not yet run): time to t = 3
DEDUPE_PENDING = (
    replace(DEDUPE, horizon=3, ticks=(3,)),
    [*_acquired(0, "ra"), *_acquired(1, "rb")],
)
#: ... both confirmed live: time to t = 8 (extensions, the survivor's end)
DEDUPE_LIVE = (
    replace(DEDUPE, horizon=8, ticks=(5, 3)),
    [
        *_acquired(0, "ra"),
        *_acquired(1, "rb"),
        "d0 bg confirm(k1) map_confirm APPLIED",
        "d1 bg confirm(k1) map_confirm APPLIED",
    ],
)
#: ras-dedupe against a daemon extending the extra in the background: as DEDUPE, k1 held
#: in both regions, d0's for 30 s (the survivor), d1's for 14 s and extended once 90 % of
#: that is left (so the answer that starts the extension still runs longer than Q = 5);
#: explored from d1's extension of rb applying at t = 2, right after a cached answer (rb
#: until 14), with one app call more (another key's acquisition can take whatever was freed)
#: and time in steps of 2 and 5. A give-back of the extra with the quarantine only (E) lets
#: k2 have rb at 7. The acquisitions differ with ``legacy_agents``, so each mode has its
#: own prefix; the search runs in both. The extension writes at once (``extend_read_first``
#: off): read first, here it would see the survivor's mapping and forget rb, and the race
#: happens only where that read misses it (replication lag), then with these same writes.
DEDUPE_EXTEND_CFG = replace(
    DEDUPE,
    extend_read_first=False,
    keys=("k1", "k2"),
    resources=("ra", "rb"),
    resource_regions=("r1", "r2"),
    leases=(30, 14),
    extend_fraction=0.9,
    max_ops=4,
    ticks=(2, 5),
    horizon=7,
)
_HIT_AND_EXTEND = [
    "time +2 -> t=2",
    "d1 get_lease(k1) CACHE HIT",
    "d1 bg extend(k1) extend_resource APPLIED",
]


def _acquired_beside_legacy() -> list[str]:
    """Both regions' daemons miss k1, then each acquires it (``legacy_agents``: the leased
    index read and the new key's mapping write beside the mapping read, the claim after the
    mapping, settled, answered, then confirmed)."""
    a, b = "d0 get_lease(k1)", "d1 get_lease(k1)"
    first = ("read mapping", "read leased index", "map_acquire APPLIED")
    return [
        *(
            f"{d} {s}"
            for d, r in ((a, "ra"), (b, "rb"))
            for s in ("called", f"candidate {r}", *first)
        ),
        *(f"{d} {s}" for d in (a, b) for s in ("claim APPLIED", "read leased index")),
        "d0 bg confirm(k1) map_confirm APPLIED",
        "d1 bg confirm(k1) map_confirm APPLIED",
    ]


#: (configuration, prefix) for each ``legacy_agents`` setting
DEDUPE_EXTEND = {
    False: (
        DEDUPE_EXTEND_CFG,
        [
            *_acquired(0, "ra"),
            *_acquired(1, "rb"),
            "d0 bg confirm(k1) map_confirm APPLIED",
            "d1 bg confirm(k1) map_confirm APPLIED",
            *_HIT_AND_EXTEND,
        ],
    ),
    True: (
        replace(DEDUPE_EXTEND_CFG, legacy_agents=True),
        [*_acquired_beside_legacy(), *_HIT_AND_EXTEND],
    ),
}
#: which dedupe search must catch each known-bad dedupe rule set
DEDUPE_BAD = ((BAD_D2, DEDUPE_PENDING), (BAD_D1, DEDUPE_LIVE))
#: deep mode: two regions with everything on (faults, a crash, the liberator and its orphan
#: repair, dedupe, releases, replication lag of one version), by random walks
WALK_REGIONS = Config(
    daemons=3,
    regions=("r1", "r2", "r2"),
    offsets=(0, 1, 0),
    keys=("k1", "k2"),
    resources=("ra", "rb", "rc", "rd"),
    resource_regions=("r1", "r1", "r2", "r2"),
    leases=(8, 6, 12),
    max_faults=2,
    max_crashes=1,
    max_ops=10,
    horizon=30,
    replica_history=1,
    dedupe_runs=3,
    repair_runs=3,
)


#: rasadmin beside two daemons: k1 acquired on ra through d0 and served by d1 too (cached
#: there), then released through d0 (ra early-freed, in quarantine while d1's cache may still
#: serve it). From there: one more app call, and two rasadmin commands among delete-resource
#: (with and without --force) of either resource, the re-add of a deleted name and add-pool
#: redefining the longest lease (12 s to 6 s), at one instant (rasadmin's clock +1)
ADMIN = Config(
    daemons=2,
    keys=("k1", "k2"),
    resources=("ra", "rb"),
    max_faults=0,
    max_crashes=0,
    max_ops=4,
    horizon=0,
    liberator=False,
    release=True,
    admin=("delete", "force", "add", "pool"),
    admin_runs=2,
    pool_lease=12,
    pool_leases=(6,),
)
ADMIN_RELEASED = (
    ADMIN,
    [
        *_acquired(0, "ra"),
        "d0 bg confirm(k1) map_confirm APPLIED",
        "d1 get_lease(k1) called",
        "d1 get_lease(k1) read mapping",  # served from the table, cached on d1
        "d0 release(k1) called",
        "d0 release(k1) read mapping",
        "d0 release(k1) map_release APPLIED",
        "d0 bg free_claim(ra, t1) free_claim APPLIED",
    ],
    1,  # app calls after the prefix
)
#: the balancer beside two regions' daemons (d0 in r1, d1 in r2, d1's clock ahead by the skew
#: bound): k1 and k2, ra in r1 and rb in r2, releases, one move of a free r1 item to r2 (the
#: balancer runs in r2), and time in steps of Q - skew and Q (quarantines run out, re-listing)
BALANCER = Config(
    daemons=2,
    regions=("r1", "r2"),
    offsets=(0, 1),
    keys=("k1", "k2"),
    resources=("ra", "rb"),
    resource_regions=("r1", "r2"),
    max_faults=0,
    max_crashes=0,
    max_ops=2,
    ticks=(4, 5),
    horizon=5,
    liberator=False,
    release=True,
    balancer_moves=1,
    balancer_region="r2",
)
#: ``legacy_agents``: one daemon and the paper's agent acquire k1 at once (one call each, two
#: ticks); the real rules settle, S serves its claim unsettled
MIXED = Config(
    daemons=1,
    keys=("k1",),
    resources=("ra", "rb"),
    max_ops=1,
    max_faults=0,
    max_crashes=0,
    liberator=False,
    release=False,
    ticks=(1,),
    horizon=2,
    paper_calls=1,
    paper_key="k1",
    legacy_agents=True,
)
#: ``legacy_agents`` with two daemons a tick of skew apart, two-tick leases (within a tick of
#: their end, by the margin), the paper's agent acquiring k1 once: d0 has written k1's
#: pending mapping for ra, and the paper's call has begun
MIXED_TWO = replace(MIXED, daemons=2, max_ops=2, leases=(2, 2), history=0)
_MIXED_CLAIMING = [
    "d0 get_lease(k1) called",
    "d0 get_lease(k1) candidate ra",
    "paper get_lease(k1) called",
    "d0 get_lease(k1) read mapping",
    "d0 get_lease(k1) read leased index",
    "d0 get_lease(k1) map_acquire APPLIED",
]
#: ... then d1's call, which may find the pending mapping too close to its end to serve (an
#: extension would confirm it: settled first, or P)
MIXED_EXTEND = (replace(MIXED_TWO, max_calls=5), _MIXED_CLAIMING)
#: ... d0's claim landed and settled, k1 answered ra: d1, whose clock is a tick ahead, is
#: asked at the lease's end on its clock, a tick before the true one (waits, or L)
MIXED_LAPSED = (
    MIXED_TWO,
    [*_MIXED_CLAIMING, "d0 get_lease(k1) claim APPLIED", "d0 get_lease(k1) read leased index"],
)
#: the rollout record switched with daemons that have not yet seen it: two daemons, two keys
#: over two resources, releases, two app calls, and the record's one change at any step, each
#: daemon following it at a step of its own (programs already running keep their mode).
#: ``end-rollout`` from rollout mode (no paper's agent left: its precondition), and ``adopt``
#: from the fast rules with the paper's agent calling once every daemon follows and no
#: program of the fast rules still runs (the bound ``adopt`` prints). The index is read
#: without lag there: that bound is minutes, index lag is seconds.
SWITCH = Config(
    daemons=2,
    keys=("k1", "k2"),
    resources=("ra", "rb"),
    max_faults=0,
    max_crashes=0,
    max_ops=2,
    horizon=0,
    liberator=False,
    release=True,
    rollout_switch=True,
)
SWITCH_OFF = replace(SWITCH, legacy_agents=True)
SWITCH_ON = replace(SWITCH, paper_calls=1, paper_key="k1", history=0)
#: a strict pool (home r1) in two regions (d0 in r1, d1 in r2, d1's clock a tick ahead), one
#: key, ra in r1 and rb in r2, another region's mapping read one version behind (replication
#: lag), one fault: both regions ask for k1 at once. I2 then holds across regions (docs/
#: global.md, "Strict pools"); with the agreement skipped (G) each region answers its own.
STRICT = Config(
    daemons=2,
    regions=("r1", "r2"),
    offsets=(0, 1),
    keys=("k1",),
    resources=("ra", "rb"),
    resource_regions=("r1", "r2"),
    max_faults=1,
    max_crashes=0,
    max_ops=2,
    horizon=0,
    liberator=False,
    release=False,
    replica_history=1,
    strict_home="r1",
)
#: ... with ``strict_home_down = "local"``: a fault on the home region's calls answers the
#: region's own lease unagreed (exempt from I2 across regions, still held to I1 and to I2
#: within its region)
STRICT_LOCAL = replace(STRICT, home_down="local")
#: deep mode: with time (6 s leases, extensions, their end), releases and three app calls
STRICT_TIME = replace(
    STRICT, max_ops=3, release=True, ticks=(1, 5), horizon=6, leases=(6, 6), max_faults=0
)
#: a key served on two daemons: k1 acquired through d0 (ra) and cached on d1, then two app
#: calls while time runs in steps of S to past the lease's end, the liberator beside: each
#: daemon extends the sliding lease, or finds it extended by the other and writes nothing
#: (``extend_read_first``; X trusts the end asked for)
EXTEND_SHARED = Config(
    daemons=2,
    keys=("k1",),
    resources=("ra",),
    max_faults=0,
    max_crashes=0,
    max_ops=3,
    horizon=15,
    ticks=(3,),
    liberator=True,
    release=False,
)
EXTEND_SHARED_PREFIX = [
    *_acquired(0, "ra"),
    "d0 bg confirm(k1) map_confirm APPLIED",
    "d1 get_lease(k1) called",
    "d1 get_lease(k1) read mapping",
]
#: a pool with an outage budget (6 ticks; S is 3, so its quarantine is 8, not 5): k1 acquired
#: through d0 (ra, the one resource) and cached on d1; then a release, k2 asking and k1 asked
#: again, while time runs: d1 may answer k1 from its outage window at any step, as if cut off
#: from DynamoDB, while d0, the liberator and the re-lister go on (O: the release quarantines
#: for the daemons' Q only; O2: the window runs twice the budget)
OUTAGE = Config(
    daemons=2,
    keys=("k1", "k2"),
    resources=("ra",),
    budget=6,
    max_faults=0,
    max_crashes=0,
    max_ops=6,
    lease=14,
    horizon=12,
    ticks=(3,),
    liberator=True,
    release=True,
)
OUTAGE_PREFIX = [
    *_acquired(0, "ra"),
    "d0 bg confirm(k1) map_confirm APPLIED",
    "d1 get_lease(k1) called",
    "d1 get_lease(k1) read mapping",
]
#: ... smaller: no liberator, no extension, the index current, to t = 9 (when the pool's
#: quarantine has run out on every clock): complete in seconds
OUTAGE_SMALL = replace(OUTAGE, liberator=False, extend_fraction=0.0, horizon=9, history=0)
#: ... then released through d0 (its free not yet sent)
OUTAGE_RELEASED = [
    *OUTAGE_PREFIX,
    "d0 release(k1) called",
    "d0 release(k1) read mapping",
    "d0 release(k1) map_release APPLIED",
]
#: the hit table: the same release, without a budget; d1's other workers read its table at
#: any step while d1 has a request in flight (HT: a table read past S)
HIT_TABLE = replace(OUTAGE_SMALL, budget=0, hit_table=True)
#: the quick run's actor searches: (name, configuration, prefix, app calls after it, the
#: known-bad set it must catch)
#: ``legacy_agents``, the paper's agent acquiring k1 twice beside d0's acquisition, the
#: request's deadline at its ninth call: settling finds the paper's lease, the deadline may
#: fall between the mapping write naming it and our claim's give-back (the mixed chaos run
#: found that give-back dying with its request; this world finds it in seconds)
MIXED_YIELD = replace(MIXED, paper_calls=2, max_calls=9)
ACTORS: tuple[tuple[str, Config, list[str] | None, int | None, Protocol], ...] = (
    ("admin", ADMIN_RELEASED[0], ADMIN_RELEASED[1], ADMIN_RELEASED[2], BAD_R),
    ("balancer", BALANCER, None, None, BAD_M),
    ("mixed", MIXED, None, None, BAD_S),
    ("mixed-extend", MIXED_EXTEND[0], MIXED_EXTEND[1], 1, BAD_P),
    ("mixed-lapsed", MIXED_LAPSED[0], MIXED_LAPSED[1], 1, BAD_L),
    ("mixed-yield", MIXED_YIELD, None, None, REAL),
    ("strict", STRICT, None, None, BAD_G),
    ("strict-local", STRICT_LOCAL, None, None, BAD_G),
    ("extend-shared", EXTEND_SHARED, EXTEND_SHARED_PREFIX, 2, BAD_X),
    ("outage", OUTAGE, OUTAGE_RELEASED, 2, BAD_O),
    ("outage-window", OUTAGE_SMALL, OUTAGE_RELEASED, 2, BAD_O2),
    ("hit-table", HIT_TABLE, OUTAGE_RELEASED, 2, BAD_HT),
    (
        "extend-shared-blind",
        replace(EXTEND_SHARED, extend_read_first=False),
        EXTEND_SHARED_PREFIX,
        2,
        REAL,
    ),
)
#: deep mode: the same actors from the initial state, wider (each bounded by --budget)
ADMIN_DEEP = replace(ADMIN, max_ops=3, max_faults=1, ticks=(1, 5), horizon=6)
BALANCER_DEEP = replace(
    BALANCER, max_faults=1, max_ops=3, balancer_moves=2, liberator=True, replica_history=1
)
#: rasadmin adopt beside the paper's agent and a legacy_agents daemon, both on k1 (the daemon
#: serves k2 too)
ADOPT = replace(MIXED, keys=("k1", "k2"), max_ops=2, admin=("adopt",), admin_runs=1)
#: (the real rules only: each known-bad set is caught by the quick run's search, which deep
#: mode runs too; from the initial state R's history lies deeper than a budget reaches)
DEEP_ACTORS: tuple[tuple[str, Config, list[str] | None, int | None, Protocol], ...] = (
    ("admin-deep", ADMIN_DEEP, None, None, REAL),
    ("balancer-deep", BALANCER_DEEP, None, None, REAL),
    ("adopt", ADOPT, None, None, REAL),
    ("strict-time", STRICT_TIME, None, None, REAL),
    ("strict-time-local", replace(STRICT_TIME, home_down="local"), None, None, REAL),
    ("extend-shared-fault", replace(EXTEND_SHARED, max_faults=1), EXTEND_SHARED_PREFIX, 2, REAL),
    (
        "extend-shared-blind-fault",
        replace(EXTEND_SHARED, max_faults=1, extend_read_first=False),
        EXTEND_SHARED_PREFIX,
        2,
        REAL,
    ),
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
    # two regions and ras-dedupe: the real rules pass from both duplicates, each known-bad
    # dedupe rule set is caught from its own
    real_dedupe = (DEDUPE_PENDING,) if quick else (DEDUPE_PENDING, DEDUPE_LIVE)
    dedupe_runs = [(REAL, c) for c in real_dedupe] + list(DEDUPE_BAD)
    for proto, (cfg, prefix) in dedupe_runs:
        res = bfs(cfg, proto, max_seconds=budget_s, prefix=prefix)
        res.mode = "bfs-dedupe-" + ("pending" if cfg.horizon == 3 else "live")
        _print(res)
        runs.append({**res.summary(), "config": asdict(cfg), "prefix": prefix})
        if proto is REAL and res.violation is not None:
            ok = False
        if proto is not REAL and res.violation is None:
            print(f"  !! known-bad rule set {proto.name} was NOT caught")
            ok = False
    # ras-dedupe against the extra's extension: the real rules pass in both modes; E is
    # caught where nothing else holds the free to the lease's end (without legacy_agents)
    for legacy, (ecfg, eprefix) in DEDUPE_EXTEND.items():
        for proto in (REAL,) if legacy else (REAL, BAD_E):
            res = bfs(ecfg, proto, max_seconds=budget_s, prefix=eprefix, ops_after_prefix=1)
            res.mode = "bfs-dedupe-extend" + ("-legacy" if legacy else "")
            _print(res)
            runs.append({**res.summary(), "config": asdict(ecfg), "prefix": eprefix})
            if (res.violation is None) != (proto is REAL):
                if proto is not REAL:
                    print(f"  !! known-bad rule set {proto.name} was NOT caught")
                ok = False
    # the rollout record's switch, both ways, with daemons that have not yet seen it
    for name, scfg in (("switch-off", SWITCH_OFF), ("switch-on", SWITCH_ON)):
        res = bfs(scfg, REAL, max_seconds=budget_s)
        res.mode = f"bfs-{name}"
        _print(res)
        runs.append({**res.summary(), "config": asdict(scfg)})
        ok = ok and res.violation is None
    # rasadmin, the balancer, both agents on one key: the real rules pass, each known-bad set
    # is caught in its configuration (the quick run's, from its prefix; deep mode's as well)
    actor_runs = ACTORS if quick else ACTORS + DEEP_ACTORS
    for name, acfg, pre, after, bad in actor_runs:
        for proto in (REAL,) if bad is REAL else (REAL, bad):
            res = bfs(acfg, proto, max_seconds=budget_s, prefix=pre, ops_after_prefix=after)
            res.mode = f"bfs-{name}"
            _print(res)
            runs.append({**res.summary(), "config": asdict(acfg), "prefix": pre})
            if (res.violation is None) != (proto is REAL):
                if proto is not REAL:
                    print(f"  !! known-bad rule set {proto.name} was NOT caught")
                ok = False
    if not quick:
        res = walks(WALK_REGIONS, REAL, range(seed, seed + n_walks), steps, max_seconds=budget_s)
        res.mode = "walk-regions"
        _print(res)
        runs.append({**res.summary(), "config": asdict(WALK_REGIONS)})
        ok = ok and res.violation is None
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

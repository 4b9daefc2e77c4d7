"""The swarm: every actor and every fault in one world, by seeded random walks.

Each run draws a world (:func:`draw`), walks the real programs through it, and shrinks a
walk that breaks an invariant (:func:`shrink`) to a trace printed with the seed that replays
it (``--replay SEED``); ``--rules NAME`` walks a known-bad set. docs/checker.md, "The swarm".
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

from .effects import forget_tracebacks
from .explore import Choose, Result, _no_gc, format_trace, walk
from .model import initial, successors
from .rulesets import PROTOCOLS, REAL, Protocol
from .world import FAULTS, Config, World

RESULTS = Path(__file__).parent / "results"

#: the rasadmin commands a run may give
ADMIN = ("release", "delete", "force", "add", "pool", "adopt")


def draw(rng: random.Random) -> Config:
    """One run's world: a random subset of every actor and fault the model has."""
    two = rng.random() < 0.6
    daemons = rng.choice((2, 3))
    resources: tuple[str, ...] = ("ra", "rb", "rc")
    resource_regions: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    if two:
        regions = ("r1", "r2", rng.choice(("r1", "r2")))[:daemons]
        resource_regions = ("r1", "r2", rng.choice(("r1", "r2")))
    else:
        resources = resources[: rng.choice((2, 3))]
    offsets = tuple(rng.choice((0, 1)) for _ in range(daemons))
    keys = ("k1", "k2") if rng.random() < 0.8 else ("k1", "k2", "k3")
    faults = tuple(f for f in FAULTS if rng.random() < 0.5) or (rng.choice(FAULTS),)
    legacy = rng.random() < 0.25
    switch = rng.random() < 0.25
    # the paper's agent beside rasd, or after adopt (and its sweep) from the fast rules
    paper = (legacy or switch) and rng.random() < 0.7
    # after adopt it calls minutes later (the bound adopt prints): the index has caught up
    history = 0 if paper and not legacy else 2
    # a strict pool is strict only while no daemon runs beside the paper's agent
    # (docs/global.md): never in rollout mode, nor across the switch
    strict = two and not legacy and not switch and rng.random() < 0.3
    # adopt runs once the table is in rollout mode (its first step turns it on)
    admin = tuple(a for a in ADMIN if rng.random() < 0.35 and (a != "adopt" or legacy))
    lease = rng.choice((6, 8, 12))
    cfg = Config(
        daemons=daemons,
        regions=regions,
        offsets=offsets,
        keys=keys,
        resources=resources,
        resource_regions=resource_regions,
        leases=tuple(rng.choice((lease, 6, 12)) for _ in range(daemons)),
        max_faults=rng.choice((0, 1, 2, 3)),
        faults=faults,
        max_crashes=rng.choice((0, 0, 1)),
        max_ops=rng.choice((3, 4, 6, 8)),
        horizon=rng.choice((6, 12, 20, 30)),
        ticks=rng.choice(((1, 3), (1, 5), (2, 5), (1, 3, 5))),
        extend_fraction=rng.choice((0.5, 0.9)),
        liberator=rng.random() < 0.6,
        release=rng.random() < 0.7,
        history=history,
        replica_history=rng.choice((0, 0, 1)) if two else 0,
        dedupe_runs=rng.choice((0, 1, 2)) if two else 0,
        repair_runs=rng.choice((0, 1, 2, 3)),
        legacy_agents=legacy,
        paper_calls=rng.choice((1, 2)) if paper else 0,
        paper_key=rng.choice(("kp", "k1")),
        paper_liberator=paper and rng.random() < 0.5,
        admin=admin,
        admin_runs=rng.choice((1, 2)) if admin else 0,
        pool_lease=12 if "pool" in admin else 0,
        pool_leases=(6,) if "pool" in admin else (),
        rollout_switch=switch,
        balancer_moves=rng.choice((0, 1)) if two else 0,
        balancer_region="r2",
        strict_home="r1" if strict else "",
        home_down=rng.choice(("fail", "local")),
        extend_read_first=rng.random() < 0.5,
        budget=0 if strict else rng.choice((0, 0, 5, 8)),
        hit_table=rng.random() < 0.5,
    )
    return cfg


# ------------------------------------------------------------------------------ coverage
_ACTOR = (
    (re.compile(r"^d\d+ get_lease\(\w+\) OUTAGE HIT"), "outage window"),
    (re.compile(r"^d\d+ get_lease\(\w+\) TABLE HIT"), "hit table"),
    (re.compile(r"^d\d+ get_lease"), "daemon get_lease"),
    (re.compile(r"^d\d+ release"), "daemon release"),
    (re.compile(r"^d\d+ bg "), "daemon background"),
    (re.compile(r"^d\d+ CRASHES"), "crash"),
    (re.compile(r"^d\d+ follows"), "rollout follow"),
    (re.compile(r"^rasadmin (end-rollout|adopt)( marks \d+)?$"), "rollout switch"),
    (re.compile(r"^rasadmin adopt sweep"), "adopt sweep"),
    (re.compile(r"^rasadmin ([a-z-]+)"), "rasadmin"),
    (re.compile(r"^balancer"), "balancer"),
    (re.compile(r"^liberator"), "liberator"),
    (re.compile(r"^relist"), "liberator"),
    (re.compile(r"^dedupe"), "dedupe"),
    (re.compile(r"^paper liberator"), "paper liberator"),
    (re.compile(r"^paper"), "paper agent"),
    (re.compile(r"^in-flight"), "in-flight write"),
    (re.compile(r"^time "), "time"),
)
_FAULT = (
    ("NOT SENT", "unsent"),
    ("DELAYED/LOST", "in_flight"),
    ("REPLY LOST, retry rejected", "reply_lost"),
    ("DELAYED, retry rejected", "delayed_retry"),
    ("REPLY LOST, read back later", "read_back_later"),
    ("read FAILED", "read_failed"),
    ("CRASHES", "crash"),
    (" behind", "replication lag"),
    ("answered after the deadline", "past deadline"),
)
_CALL = re.compile(r"\b([a-z_]+) (?:APPLIED|REJECTED|NOT SENT|DELAYED|applied|rejected)")


def actor(label: str) -> str:
    body = label.split("] ", 1)[-1]
    for rx, name in _ACTOR:
        m = rx.search(body)
        if m:
            return f"rasadmin {m.group(1)}" if name == "rasadmin" else name
    return "other"


def faults_in(label: str) -> list[tuple[str, str]]:
    """The faults a step's label shows, each with the call it hit."""
    out = []
    for text, kind in _FAULT:
        if text in label:
            m = _CALL.search(label)
            out.append((kind, m.group(1) if m else "read" if "read" in label else "-"))
    return out


@dataclass
class Coverage:
    runs: int = 0
    steps: int = 0
    seconds: float = 0.0
    actors: Counter[str] = field(default_factory=Counter)
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    faults: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, res: Result) -> None:
        self.runs += 1
        self.steps += len(res.trace)
        seen = {actor(lab) for lab, _ in res.trace} - {"time", "other"}
        self.actors.update(seen)
        for a in seen:
            for b in seen:
                if a < b:
                    self.pairs[(a, b)] += 1
        for lab, _ in res.trace:
            self.faults.update(faults_in(lab))

    def summary(self) -> dict[str, object]:
        return {
            "runs": self.runs,
            "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "actors": dict(self.actors.most_common()),
            "pairs": {f"{a} + {b}": n for (a, b), n in self.pairs.most_common()},
            "faults": {f"{k} on {c}": n for (k, c), n in self.faults.most_common()},
        }


# ---------------------------------------------------------------------------- one run
_LANE = re.compile(
    r"^(d\d+ (?:get_lease|release)\([^)]*\)|d\d+ bg \S+|d\d+ \S+|rasadmin [a-z-]+ ?\S*"
    r"|balancer|liberator|relist\([^)]*\)|dedupe|paper liberator|paper get_lease\([^)]*\)"
    r"|in-flight|time)"
)


#: how often a priority walk lets time pass when something else could step
TIME_SHARE = 0.08
#: steps after which their process is slow to go on (it waits out a timeout)
SLOW = ("REPLY LOST", "DELAYED", "NOT SENT", "FAILED", "deadline")


def lane(label: str) -> str:
    """The process (or the kind of step) a step belongs to: its label's subject."""
    m = _LANE.match(label)
    return m.group(1).rstrip(":") if m else label


def pct_walk(
    cfg: Config, proto: Protocol, seed: int, max_steps: int, depth: int = 4, switch: float = 0.0
) -> Result:
    """One seeded walk that schedules by priority, as probabilistic concurrency testing
    does: each lane (a process, writes in flight) gets a random priority when it first
    shows up, the highest enabled one steps (its branch, a fault or not, drawn at random),
    and at ``depth - 1`` random steps, or after a fault (its caller waits out a timeout),
    the running lane drops to the lowest priority; after any other step its priority is
    drawn again with probability ``switch``. Time passes at ``TIME_SHARE`` of the steps.
    A bug that needs a few processes ordered just so is found with a probability bounded
    below, where a uniform walk's shrinks with every other step enabled. One step in ten
    is drawn uniformly, as :func:`check.explore.walk` does."""
    return walk(cfg, proto, seed, max_steps, partial(_by_priority, depth, switch, max_steps), "pct")


def _by_priority(depth: int, switch: float, steps: int, rng: random.Random) -> Choose:
    """:func:`pct_walk`'s choice of each step, with its lanes' priorities."""
    prio: dict[str, float] = {}
    drops = set(rng.sample(range(steps), min(steps, max(0, depth - 1))))

    def choose(i: int, nxt: list[tuple[str, World]]) -> tuple[str, World]:
        lanes: dict[str, list[tuple[str, World]]] = {}
        for lab, x in nxt:
            lanes.setdefault(lane(lab), []).append((lab, x))
        for ln in lanes:
            if ln not in prio:
                prio[ln] = rng.random()
        ticks = lanes.pop("time", None)
        if ticks and (not lanes or rng.random() < TIME_SHARE):
            return rng.choice(ticks)
        if rng.random() < 0.1:
            return rng.choice([x for ls in lanes.values() for x in ls])
        top = max(lanes, key=lambda ln: prio[ln])
        label, w2 = rng.choice(lanes[top])
        if i in drops or any(f in label for f in SLOW):
            # a lost reply, a request in flight, a failed call: its caller waits out a
            # timeout while the others go on
            prio[top] = -rng.random()
        elif rng.random() < switch:
            prio[top] = rng.random()  # a call's answer takes its time: others may go first
        return label, w2

    return choose


def run_one(seed: int, proto: Protocol = REAL, steps: int = 160) -> tuple[Config, Result]:
    """The run of ``seed``: its world (drawn from the seed: one of the small ``WORLDS`` one
    run in five) and its walk (the same seed)."""
    rng = random.Random(seed)
    cfg = draw(rng)
    if rng.random() < SMALL_SHARE:
        cfg = WORLDS[rng.choice(sorted(WORLDS))]
    return cfg, walk_in(cfg, proto, seed, steps, rng)


def walk_in(
    cfg: Config, proto: Protocol, seed: int, steps: int, rng: random.Random | None = None
) -> Result:
    """One walk of world ``cfg``: half by priority (:func:`pct_walk`), half uniform
    (:func:`check.explore.walk`), as ``seed`` says."""
    rng = rng or random.Random(seed)
    if rng.random() < 0.5:
        depth, switch = rng.choice((2, 3, 4, 6)), rng.choice((0.0, 0.2, 0.4))
        return pct_walk(cfg, proto, seed, steps, depth, switch)
    return walk(cfg, proto, seed, steps)


#: how many runs walk one of the small worlds
SMALL_SHARE = 0.2
#: Small worlds the swarm also walks: a few actors and one kind of fault each,
#: where an interleaving that needs them all is likely enough for CI's budget. Each is a
#: world, not a script: the walks choose every step.
WORLDS: dict[str, Config] = {
    # two daemons of one region, rasadmin release-resource, lost replies read back later
    "release-vs-lost-reply": Config(
        daemons=2,
        keys=("k1",),
        resources=("ra", "rb"),
        admin=("release",),
        admin_runs=1,
        faults=("read_back_later",),
        max_faults=1,
        max_crashes=0,
        liberator=False,
        release=False,
        ticks=(5,),
        horizon=5,
        max_ops=3,
    ),
    # a strict pool: its home region's daemon and two of another region, the home region's
    # calls failing, the fallback answering unagreed
    "strict-fallback": Config(
        daemons=3,
        regions=("r1", "r2", "r2"),
        offsets=(0, 0, 0),
        keys=("k1",),
        resources=("rh", "re", "rf"),
        resource_regions=("r1", "r2", "r2"),
        faults=("unsent", "read_failed"),
        max_faults=1,
        max_crashes=0,
        liberator=False,
        release=False,
        strict_home="r1",
        home_down="local",
        ticks=(5,),
        horizon=5,
        max_ops=3,
    ),
    # the fast rules: two daemons race for k1 and one may die before its losing claim is
    # given back; rasadmin adopt, its sweep, then the paper's agent asks for k1 (minutes
    # later: the index has caught up, as in SWITCH_ON)
    "fast-leftover-then-adopt": Config(
        daemons=2,
        history=0,
        keys=("k1",),
        resources=("ra", "rb"),
        rollout_switch=True,
        paper_calls=1,
        paper_key="k1",
        paper_liberator=False,
        faults=(),
        max_faults=0,
        max_crashes=1,
        liberator=False,
        release=False,
        ticks=(5,),
        horizon=5,
        max_ops=2,
    ),
    # beside the paper's agent: a daemon adopts its lease of k1 (or the agent answers k1
    # with rasd's lease), end-rollout marks the record and later turns it off, a release
    "adopt-then-end-rollout": Config(
        daemons=1,
        lease=6,
        leases=(6, 6),
        keys=("k1", "k2"),
        resources=("ra", "rb"),
        legacy_agents=True,
        rollout_switch=True,
        paper_calls=1,
        paper_key="k1",
        paper_liberator=False,
        faults=(),
        max_faults=0,
        max_crashes=0,
        liberator=False,
        ticks=(1, 3, 5),
        horizon=9,
        max_ops=4,
    ),
}


def shrink(cfg: Config, proto: Protocol, labels: list[str], budget_s: float = 60.0) -> list[str]:
    """A shorter list of steps that still breaks an invariant (removing chunks of steps,
    halving the chunk, as delta debugging does); every list tried is replayed step by step
    through :func:`replay`, so the result is a real trace (cut at its violation)."""
    deadline = time.monotonic() + budget_s
    best = labels
    chunk = max(1, len(best) // 2)
    while chunk >= 1 and time.monotonic() < deadline:
        i, shrunk = 0, False
        while i < len(best) and time.monotonic() < deadline:
            got = _breaks(cfg, proto, best[:i] + best[i + chunk :])
            if got is not None:
                best, shrunk = got, True
            else:
                i += chunk
        if not shrunk:
            chunk //= 2
    return best


def replay(cfg: Config, proto: Protocol, labels: list[str]) -> Result | None:
    """Follow ``labels`` exactly (each the whole label of an enabled step, the first such
    taken); None when one is not enabled. Stops at a violation."""
    res = Result(proto.name, "replay")
    w = initial(cfg, proto)
    for want in labels:
        nxt = next((x for lab, x in successors(w) if lab == want), None)
        if nxt is None:
            return None
        res.trace.append((f"[t={w.t}] {want}", list(nxt.notes)))
        w = nxt
        if w.violation is not None:
            res.violation = w.violation
            break
    res.transitions = len(res.trace)
    return res


def _breaks(cfg: Config, proto: Protocol, labels: list[str]) -> list[str] | None:
    """The steps of ``labels`` up to the violation they reach, or None."""
    res = replay(cfg, proto, labels) if labels else None
    if res is None or res.violation is None:
        return None
    return labels[: len(res.trace)]


def _labels(res: Result) -> list[str]:
    return [lab.split("] ", 1)[-1] for lab, _ in res.trace]


@dataclass
class Found:
    seed: int
    config: Config
    walk: Result
    shrunk: Result


#: the collector runs once this many runs (off during the walks, as in every search, where a
#: walk's generators and their frames leave cycles behind)
COLLECT_EVERY = 50


def swarm(
    seeds: range,
    proto: Protocol = REAL,
    seconds: float | None = None,
    steps: int = 160,
    progress: float | None = None,
    shrink_s: float = 60.0,
) -> tuple[Coverage, Found | None]:
    """Runs ``seeds`` (or until ``seconds``); stops at the first violation, shrunk."""
    cov = Coverage()
    start = last = time.monotonic()
    with _no_gc():
        for seed in seeds:
            cfg, res = run_one(seed, proto, steps)
            cov.add(res)
            forget_tracebacks()
            if cov.runs % COLLECT_EVERY == 0:
                gc.collect()  # a walk's cycles (generators, their frames) freed in one pass
            if res.violation is not None:
                cov.seconds = time.monotonic() - start
                labels = shrink(cfg, proto, _labels(res), shrink_s)
                shrunk = replay(cfg, proto, labels) if labels != _labels(res) else None
                return cov, Found(seed, cfg, res, shrunk or res)
            now = time.monotonic()
            if progress is not None and now - last >= progress:
                last = now
                print(f"  {cov.runs} runs, {cov.steps} steps, {now - start:.0f}s", flush=True)
            if seconds is not None and now - start > seconds:
                break
    cov.seconds = time.monotonic() - start
    return cov, None


def _report(cov: Coverage, found: Found | None, proto: Protocol) -> dict[str, object]:
    out: dict[str, object] = {"rules": proto.name, **cov.summary()}
    if found is not None:
        out["violation"] = {
            "seed": found.seed,
            "invariant": found.walk.violation.name if found.walk.violation else None,
            "detail": found.walk.violation.detail if found.walk.violation else None,
            "steps": len(found.walk.trace),
            "shrunk_steps": len(found.shrunk.trace),
            "trace": [lab for lab, _ in found.shrunk.trace],
            "config": asdict(found.config),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m check.swarm", description=__doc__)
    ap.add_argument("--seed", type=int, default=0, help="first seed (each run is one seed)")
    ap.add_argument("--runs", type=int, default=None, help="how many runs (default: by time)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long (default 60)")
    ap.add_argument("--steps", type=int, default=160, help="steps per walk (default 160)")
    ap.add_argument(
        "--rules", default="real", choices=sorted(PROTOCOLS), help="the rule set walked"
    )
    ap.add_argument("--replay", type=int, default=None, help="replay one seed, print its trace")
    ap.add_argument("--json", type=Path, default=None, help="write the summary here too")
    a = ap.parse_args(argv)
    proto = PROTOCOLS[a.rules]
    if a.replay is not None:
        cfg, res = run_one(a.replay, proto, a.steps)
        print(f"seed {a.replay}: {cfg}")
        print(format_trace(res) if res.violation else "no violation")
        return 1 if res.violation else 0
    seeds = range(a.seed, a.seed + a.runs) if a.runs is not None else range(a.seed, 2**62)
    seconds = None if a.runs is not None else a.seconds
    print(f"swarm: rules {proto.name}, seeds from {a.seed}, {a.steps} steps a walk", flush=True)
    cov, found = swarm(seeds, proto, seconds, a.steps, progress=30.0)
    out = _report(cov, found, proto)
    print(f"{cov.runs} runs, {cov.steps} steps in {cov.seconds:.0f}s")
    print("actors (runs):", ", ".join(f"{k} {v}" for k, v in cov.actors.most_common()))
    print(f"actor pairs met in one run: {len(cov.pairs)}")
    print("faults fired (kind on call):")
    for (kind, call), n in cov.faults.most_common():
        print(f"  {kind:<16} {call:<18} {n}")
    if found is not None:
        print(
            f"VIOLATION (seed {found.seed}; replay: python -m check.swarm --replay "
            f"{found.seed} --rules {proto.name}); shrunk to {len(found.shrunk.trace)} of "
            f"{len(found.walk.trace)} steps:"
        )
        print(format_trace(replace(found.shrunk, seed=found.seed)))
    path = a.json or RESULTS / f"swarm-{proto.name}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"summary in {path}")
    return 1 if found is not None else 0


if __name__ == "__main__":
    sys.exit(main())

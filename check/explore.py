"""Exhaustive breadth-first exploration with state hashing, and seeded random walks.

BFS visits every state reachable within the configuration's bounds once (a state is its
canonical :meth:`check.world.World.key`), checks the invariants on every transition and stops
at the first violation, which it returns as the shortest trace to it. A random walk follows
one seeded path; the same seed replays the same path.
"""

from __future__ import annotations

import gc
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from .effects import forget_tracebacks
from .model import initial, successors
from .rulesets import Protocol
from .world import Config, Violation, World

Step = tuple[str, list[str]]  # label, notes (answers, releases, errors) of that step


@dataclass
class Result:
    protocol: str
    mode: str
    states: int = 0
    transitions: int = 0
    max_depth: int = 0
    seconds: float = 0.0
    complete: bool = True  # False: stopped by the state or time budget
    violation: Violation | None = None
    trace: list[Step] = field(default_factory=list)
    seed: int | None = None
    walks: int = 0

    def summary(self) -> dict[str, object]:
        return {
            "protocol": self.protocol,
            "mode": self.mode,
            "states": self.states,
            "transitions": self.transitions,
            "max_depth": self.max_depth,
            "seconds": round(self.seconds, 2),
            "complete": self.complete,
            "walks": self.walks,
            "violation": None
            if self.violation is None
            else {"invariant": self.violation.name, "detail": self.violation.detail},
            "seed": self.seed,
            "trace": [lab + "".join(f"\n      {n}" for n in notes) for lab, notes in self.trace],
        }


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a search runs: its passes over the millions of
    tuples the visited set holds cost about 40 % of a search's time, and a search makes few
    cycles (left to the collector's next pass once it is on again; a full pass at once would
    cost seconds)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def bfs(
    cfg: Config,
    proto: Protocol,
    max_states: int | None = None,
    max_seconds: float | None = None,
    prefix: list[str] | None = None,
    ops_after_prefix: int | None = None,
) -> Result:
    """Every state reachable within ``cfg``'s bounds, from the initial state or from the
    state a written ``prefix`` (see :func:`script`) leads to; after it, ``ops_after_prefix``
    app calls (default: ``cfg.max_ops``)."""
    with _no_gc():
        return _bfs(cfg, proto, max_states, max_seconds, prefix, ops_after_prefix)


def _bfs(
    cfg: Config,
    proto: Protocol,
    max_states: int | None,
    max_seconds: float | None,
    prefix: list[str] | None,
    ops_after_prefix: int | None,
) -> Result:
    start = time.monotonic()
    res = Result(proto.name, "bfs")
    w0 = _start(cfg, proto, prefix, ops_after_prefix)
    k0 = w0.key()
    parent: dict[object, tuple[object, str, int]] = {k0: (None, "", 0)}
    # Each state's key is made once and hashed once (setdefault): the keys are deep tuples
    # whose hashes Python does not keep.
    queue: deque[tuple[World, object, int]] = deque([(w0, k0, 0)])
    taken = 0
    while queue:
        w, kw, depth = queue.popleft()
        taken += 1
        if taken % 4096 == 0:
            forget_tracebacks()
        for label, nxt in successors(w):
            res.transitions += 1
            kn = nxt.key()
            seen = (kw, label, depth + 1)
            if parent.setdefault(kn, seen) is not seen and nxt.violation is None:
                continue
            if nxt.violation is not None:
                res.violation = nxt.violation
                res.trace = _trace(cfg, proto, parent, kn, prefix, ops_after_prefix)
                res.states = len(parent)
                res.seconds = time.monotonic() - start
                return res
            res.max_depth = max(res.max_depth, depth + 1)
            queue.append((nxt, kn, depth + 1))
        if (max_states is not None and len(parent) >= max_states) or (
            max_seconds is not None and time.monotonic() - start > max_seconds
        ):
            res.complete = False
            break
    res.states = len(parent)
    res.seconds = time.monotonic() - start
    return res


def _trace(
    cfg: Config,
    proto: Protocol,
    parent: dict[object, tuple[object, str, int]],
    k: object,
    prefix: list[str] | None = None,
    ops_after_prefix: int | None = None,
) -> list[Step]:
    """The path to ``k``, replayed from the initial state to collect each step's notes."""
    keys: list[object] = []
    cur: object = k
    while cur is not None:
        keys.append(cur)
        cur = parent[cur][0]
    keys.reverse()
    w = _start(cfg, proto, prefix, ops_after_prefix)
    steps: list[Step] = [(f"(prefix) {lab}", []) for lab in prefix or []]
    for nk in keys[1:]:
        for label, nxt in successors(w):
            if nxt.key() == nk:
                steps.append((f"[t={w.t}] {label}", list(nxt.notes)))
                w = nxt
                break
        else:  # pragma: no cover - the model is deterministic
            raise AssertionError("trace does not replay")
    return steps


#: how a walk picks its next step: (step number, the steps enabled) -> the one taken
Choose = Callable[[int, list[tuple[str, World]]], tuple[str, World]]


def walk(
    cfg: Config,
    proto: Protocol,
    seed: int,
    max_steps: int = 200,
    chooser: Callable[[random.Random], Choose] | None = None,
    mode: str = "walk",
) -> Result:
    """One seeded random walk (the same seed, config and rules replay it exactly); its
    trace is the steps it took, up to the first violation. ``chooser`` makes, from the
    walk's random source, how it picks each step (default: weighted at random, ``_weight``)."""
    start = time.monotonic()
    rng = random.Random(seed)
    choose = chooser(rng) if chooser is not None else _weighted(rng)
    res = Result(proto.name, mode, seed=seed, walks=1)
    w = initial(cfg, proto)
    steps: list[Step] = []
    for i in range(max_steps):
        nxt = successors(w)
        if not nxt:
            break
        res.transitions += 1
        label, w2 = choose(i, nxt)
        steps.append((f"[t={w.t}] {label}", list(w2.notes)))
        w = w2
        if w.violation is not None:
            res.violation = w.violation
            break
    forget_tracebacks()
    res.trace = steps
    res.states = res.transitions + 1
    res.max_depth = len(steps)
    res.seconds = time.monotonic() - start
    return res


def _weighted(rng: random.Random) -> Choose:
    def choose(i: int, nxt: list[tuple[str, World]]) -> tuple[str, World]:
        return rng.choices(nxt, weights=[_weight(lab) for lab, _ in nxt])[0]

    return choose


_FAULTS = ("NOT SENT", "REPLY LOST", "REQUEST LOST", "DELAYED", "FAILED", "CRASHES")


def _weight(label: str) -> float:
    """Walks prefer progress: time and faults are rarer than protocol steps (each stays
    possible at every step, as in the exhaustive search)."""
    if label.startswith("time +"):
        return 0.3
    if any(f in label for f in _FAULTS):
        return 0.15
    return 1.0


def walks(
    cfg: Config,
    proto: Protocol,
    seeds: range,
    max_steps: int = 200,
    max_seconds: float | None = None,
) -> Result:
    """Many seeded walks; stops at the first violation (its seed replays it)."""
    with _no_gc():
        return _walks(cfg, proto, seeds, max_steps, max_seconds)


def _walks(
    cfg: Config, proto: Protocol, seeds: range, max_steps: int, max_seconds: float | None
) -> Result:
    start = time.monotonic()
    total = Result(proto.name, "walks")
    for seed in seeds:
        r = walk(cfg, proto, seed, max_steps)
        total.walks += 1
        total.transitions += r.transitions
        total.states += r.states
        total.max_depth = max(total.max_depth, r.max_depth)
        if r.violation is not None:
            total.violation, total.trace, total.seed = r.violation, r.trace, seed
            break
        if max_seconds is not None and time.monotonic() - start > max_seconds:
            total.complete = False
            break
    total.seconds = time.monotonic() - start
    return total


def format_trace(res: Result) -> str:
    lines = []
    if res.violation is not None:
        lines.append(f"VIOLATION of {res.violation.name}: {res.violation.detail}")
    if res.seed is not None:
        lines.append(f"seed {res.seed}")
    for i, (label, notes) in enumerate(res.trace, 1):
        lines.append(f"{i:3d}. {label}")
        lines.extend(f"       {n}" for n in notes)
    return "\n".join(lines)


def script(cfg: Config, proto: Protocol, labels: list[str]) -> Result:
    """Follow a written scenario: each entry must match the start of exactly the label of one
    enabled step (the first such step is taken). Replays a trace printed by the checker."""
    res = Result(proto.name, "script")
    w = initial(cfg, proto)
    for want in labels:
        want = want.split("] ", 1)[-1]  # accept lines copied from a printed trace
        choices = [(lab, nxt) for lab, nxt in successors(w) if lab.startswith(want)]
        if not choices:
            opts = "\n  ".join(lab for lab, _ in successors(w))
            raise ValueError(f"step {want!r} is not enabled at t={w.t}; enabled:\n  {opts}")
        label, nxt = choices[0]
        res.trace.append((f"[t={w.t}] {label}", list(nxt.notes)))
        res.transitions += 1
        w = nxt
        if w.violation is not None:
            res.violation = w.violation
            break
    res.states = res.transitions + 1
    return res


def _start(
    cfg: Config, proto: Protocol, prefix: list[str] | None, ops_after_prefix: int | None
) -> World:
    """A search's first state: the initial one, or the one ``prefix`` leads to, with
    ``ops_after_prefix`` app calls left (default: ``cfg.max_ops``)."""
    if not prefix:
        return initial(cfg, proto)
    w = _run(cfg, proto, prefix)
    if ops_after_prefix is not None:
        w.ops = max(0, cfg.max_ops - ops_after_prefix)
    return w


def _run(cfg: Config, proto: Protocol, labels: list[str]) -> World:
    w = initial(cfg, proto)
    for want in labels:
        want = want.split("] ", 1)[-1]
        w = next(nxt for lab, nxt in successors(w) if lab.startswith(want))
    w.ops = 0  # the prefix's app calls do not count against the bound
    return w

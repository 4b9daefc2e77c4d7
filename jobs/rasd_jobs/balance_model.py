"""The balancer's model: demand per (client, pool, region), projection, targets, the move plan.

Pure: no I/O, time is always passed in; ``rasd_jobs.balancer`` reads and writes. The signals,
Holt's smoothing, the targets and the plan's rule: docs/global.md, "Signals", "Demand model"
and "The plan: which region gives to which".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from rasd.core.builders import headroom_item as lease_headroom_item
from rasd.core.builders import miss_report_update  # noqa: F401 - the daemon side, as below
from rasd.core.lease import (  # noqa: F401 - the daemon side lives in rasd.core.lease
    HEADROOM_PREFIX,
    META_CLIENT,
    MISS_PREFIX,
    MISS_TTL_S,
    REGION_RE,
    US,
    fmt_time,
    headroom_resource,
    miss_resource,
    valid_name,
)

#: (client_id, pool_id, region)
Key = tuple[str, str, str]


# ---------------------------------------------------------------------------------- params
@dataclass(frozen=True, slots=True)
class Params:
    """Every knob of the model, with its default and why."""

    interval_s: float = 300.0  # the Jenkins period: demand is a rate per interval
    horizon_s: float = 600.0  # plan for the next 10 minutes (two runs: one may fail)
    alpha: float = 0.4  # level smoothing per interval: half-life ~1.4 intervals (7 min)
    beta: float = 0.2  # trend smoothing per interval: slower, a trend needs a few runs
    safety: float = 1.5  # free target = projected demand x safety (+ floor)
    floor: int = 2  # free items kept in every region, even a quiet one
    max_moves: int = 500  # moves per run, all pools together (bounds the writes per run)
    max_window_intervals: float = 288.0  # a run after a long gap counts at most 1 day

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.horizon_s <= 0:
            raise ValueError("interval and horizon must be positive")
        if not (0 < self.alpha <= 1 and 0 <= self.beta <= 1):
            raise ValueError("alpha must be in (0, 1], beta in [0, 1]")
        if self.safety < 1 or self.floor < 0 or self.max_moves < 0:
            raise ValueError("safety >= 1, floor >= 0, max_moves >= 0")

    @property
    def horizon_intervals(self) -> float:
        return self.horizon_s / self.interval_s


# ---------------------------------------------------------------------------------- EWMA
def ewma(prev: float | None, x: float, alpha: float, steps: float = 1.0) -> float:
    """Exponentially weighted moving average; ``steps`` intervals elapsed since ``prev``."""
    if prev is None:
        return x
    a = 1.0 - float((1.0 - alpha) ** steps)
    return a * x + (1.0 - a) * prev


@dataclass(frozen=True, slots=True)
class Holt:
    """Holt's linear smoothing state: ``level`` (per interval) and ``trend`` (per interval^2)."""

    level: float
    trend: float = 0.0

    def update(self, x: float, alpha: float, beta: float, steps: float = 1.0) -> Holt:
        """Observe rate ``x`` (per interval) for a window of ``steps`` intervals."""
        a = 1.0 - (1.0 - alpha) ** steps
        b = 1.0 - (1.0 - beta) ** steps
        forecast = self.level + self.trend * steps
        level = a * x + (1.0 - a) * forecast
        trend = b * (level - self.level) / steps + (1.0 - b) * self.trend
        return Holt(level, trend)

    def project(self, intervals: float) -> float:
        """Total expected over the next ``intervals`` intervals (sum of the step forecasts)."""
        h = intervals
        return max(0.0, h * self.level + self.trend * h * (h + 1) / 2)


@dataclass(slots=True)
class Signal:
    """What the model keeps per (client, pool, region) between runs (JSON-able)."""

    demand: Holt | None = None
    acquired: float = 0.0  # EWMA of acquisitions per interval (observability)
    released: float = 0.0  # EWMA of releases per interval (observability, not credited)
    missed: float = 0.0  # EWMA of misses per interval (observability)

    def to_json(self) -> dict[str, float]:
        d = {"acquired": self.acquired, "released": self.released, "missed": self.missed}
        if self.demand is not None:
            d |= {"level": self.demand.level, "trend": self.demand.trend}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Signal:
        demand = Holt(float(d["level"]), float(d.get("trend", 0.0))) if "level" in d else None
        return cls(
            demand=demand,
            acquired=float(d.get("acquired", 0.0)),
            released=float(d.get("released", 0.0)),
            missed=float(d.get("missed", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class Counts:
    """Events seen for one key during one window."""

    acquired: int = 0
    released: int = 0
    missed: int = 0


def key_str(k: Key) -> str:
    """``client.pool.region``: none of the three can contain a dot (``rasd.core.lease`` rules)."""
    return ".".join(k)


def key_parse(s: str) -> Key:
    c, p, r = s.split(".")
    return (c, p, r)


def window_steps(dt_s: float, p: Params) -> float:
    """Length of a window in intervals; a non-positive window (clock trouble) counts as one."""
    if dt_s <= 0:
        return 1.0
    return min(max(dt_s / p.interval_s, 1e-3), p.max_window_intervals)


def observe(
    signals: dict[Key, Signal], counts: dict[Key, Counts], keys: set[Key], dt_s: float, p: Params
) -> dict[Key, Signal]:
    """New signals after a window of ``dt_s`` seconds. Every key in ``keys`` (all known
    (client, pool, region)) is observed, with zero counts when nothing happened, so demand
    decays in a region gone quiet. Returns a new dict; the input is not changed."""
    s = window_steps(dt_s, p)
    out: dict[Key, Signal] = {}
    for k in sorted(keys | set(counts)):
        prev = signals.get(k)
        c = counts.get(k, Counts())
        x_acq, x_rel, x_miss = c.acquired / s, c.released / s, c.missed / s
        x = x_acq + x_miss
        if prev is None or prev.demand is None:
            out[k] = Signal(Holt(x), x_acq, x_rel, x_miss)
            continue
        out[k] = Signal(
            prev.demand.update(x, p.alpha, p.beta, s),
            ewma(prev.acquired, x_acq, p.alpha, s),
            ewma(prev.released, x_rel, p.alpha, s),
            ewma(prev.missed, x_miss, p.alpha, s),
        )
    return out


def projected_demand(sig: Signal | None, p: Params) -> float:
    """Acquisitions (incl. misses) expected over the horizon."""
    if sig is None or sig.demand is None:
        return 0.0
    return sig.demand.project(p.horizon_intervals)


def target_free(projected: float, p: Params) -> int:
    """Free items a region should hold: projected demand x safety, plus the floor."""
    return math.ceil(projected * p.safety - 1e-9) + p.floor


# ---------------------------------------------------------------------------------- plan
@dataclass(frozen=True, slots=True, order=True)
class Move:
    """Move ``count`` free items of (client, pool) from ``src`` to ``dst``."""

    client_id: str
    pool_id: str
    src: str
    dst: str
    count: int


@dataclass(frozen=True, slots=True)
class Plan:
    moves: list[Move] = field(default_factory=list)
    targets: dict[Key, int] = field(default_factory=dict)
    projected: dict[Key, float] = field(default_factory=dict)
    capped: bool = False  # max_moves stopped the plan before every deficit was served

    @property
    def total(self) -> int:
        return sum(m.count for m in self.moves)


def _ratio(free: int, target: int) -> Fraction:
    return Fraction(free, max(target, 1))


def allocate(
    free: dict[Key, int], targets: dict[Key, int], max_moves: int
) -> tuple[list[Move], bool]:
    """The move plan for current ``free`` counts and ``targets`` (same keys). See the module
    docstring for the rule. Returns the moves (merged per (pool, src, dst), sorted) and whether
    ``max_moves`` cut the plan short."""
    cur = dict(free)
    pools: dict[tuple[str, str], list[str]] = {}
    for c, p, r in sorted(free):
        pools.setdefault((c, p), []).append(r)
    merged: dict[tuple[str, str, str, str], int] = {}
    done = 0
    while True:
        best: tuple[Any, ...] | None = None
        for (c, p), regions in pools.items():
            donors = [r for r in regions if cur[(c, p, r)] > targets[(c, p, r)]]
            if not donors:
                continue
            for r in regions:
                k = (c, p, r)
                deficit = targets[k] - cur[k]
                if deficit <= 0:
                    continue
                rank = (_ratio(cur[k], targets[k]), -deficit, c, p, r)
                if best is None or rank < best[0]:
                    best = (rank, c, p, r, donors)
        if best is None:
            return _merge(merged), False
        if done >= max_moves:
            return _merge(merged), True
        _, c, p, dst, donors = best
        src = min(
            donors,
            key=lambda r: (
                -_ratio(cur[(c, p, r)], targets[(c, p, r)]),
                -(cur[(c, p, r)] - targets[(c, p, r)]),
                r,
            ),
        )
        cur[(c, p, src)] -= 1
        cur[(c, p, dst)] += 1
        merged[(c, p, src, dst)] = merged.get((c, p, src, dst), 0) + 1
        done += 1


def _merge(merged: dict[tuple[str, str, str, str], int]) -> list[Move]:
    return sorted(Move(c, p, s, d, n) for (c, p, s, d), n in merged.items())


def plan(free: dict[Key, int], signals: dict[Key, Signal], p: Params) -> Plan:
    """Targets from the signals, then :func:`allocate`. ``free`` decides the keys planned for."""
    projected = {k: projected_demand(signals.get(k), p) for k in free}
    targets = {k: target_free(v, p) for k, v in projected.items()}
    moves, capped = allocate(free, targets, p.max_moves)
    return Plan(moves, targets, projected, capped)


def apply_moves(free: dict[Key, int], moves: list[Move]) -> dict[Key, int]:
    """Free counts after ``moves`` (for headroom items and the idempotence check)."""
    out = dict(free)
    for m in moves:
        out[(m.client_id, m.pool_id, m.src)] -= m.count
        out[(m.client_id, m.pool_id, m.dst)] += m.count
    return out


# ---------------------------------------------------------------------------- meta items
LOCK_RESOURCE = "lock#balancer"


def parse_miss_resource(resource: str) -> tuple[Key, str] | None:
    """``misses#{client}#{pool}#{region}#{daemon_id}`` -> ((client, pool, region), daemon_id)."""
    if not resource.startswith(MISS_PREFIX):
        return None
    parts = resource[len(MISS_PREFIX) :].split("#", 3)
    if len(parts) != 4 or not all(parts):
        return None
    c, p, r, d = parts
    if not (valid_name(c) and valid_name(p) and REGION_RE.match(r)):
        return None
    return (c, p, r), d


def miss_deltas(
    counters: dict[str, int], last: dict[str, int] | None
) -> tuple[dict[Key, int], dict[str, int]]:
    """Misses per key since the previous run, from the daemons' cumulative counters.

    ``last`` is None on the very first run: the counters are then only a baseline (they hold
    history of unknown age). A counter that went down was reaped by TTL and started again, so
    its whole value is new; a counter first seen after the first run is new in full.
    Returns (deltas per key, the counters to remember)."""
    deltas: dict[Key, int] = {}
    remember: dict[str, int] = {}
    for res, count in sorted(counters.items()):
        parsed = parse_miss_resource(res)
        if parsed is None:
            continue
        remember[res] = count
        if last is None:
            continue
        prev = last.get(res, 0)
        d = count - prev if count >= prev else count
        if d > 0:
            deltas[parsed[0]] = deltas.get(parsed[0], 0) + d
    return deltas, remember


def headroom_item(
    k: Key, free: int, projected: float, now_us: int, horizon_s: float
) -> dict[str, Any]:
    """The headroom meta item for one (client, pool, region), as a PutItem ``Item`` (its
    shape is ``rasd.core.builders.headroom_item``'s: the daemon reads it)."""
    c, p, r = k
    demand = math.ceil(projected - 1e-9)
    return lease_headroom_item(c, p, r, free, demand, now_us, int(horizon_s))

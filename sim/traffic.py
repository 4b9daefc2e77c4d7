"""The traffic model of the global simulation. Pure: no I/O, no clock; randomness from a seed.

Simulated time runs over one UTC day, ``minute`` 0..1440. Demand is a **rate of new keys** per
region (experiments / traffic segments appearing, each needing one lease):

* **day cycles**: every region has a diurnal curve peaking at its own UTC hour (its local
  afternoon), with a night floor; us-east-1 is the biggest region (the paper: "considerably
  more traffic in us-east-1");
* **a news spike**: one region's demand multiplied for a couple of hours, with a fast rise and a
  slower decay;
* **a region evacuation**: operations swing one region's traffic out for a few hours; its
  demand goes to the other regions in proportion to their own demand at that minute.

:func:`rate` gives demand in *relative units* (1.0 = us-east-1 at its peak); the world scales
it to keys per real second. :func:`schedule` draws the arrivals of a whole run (Poisson per
region per step, plus the second-region requests of "global" keys) so that the balancer run and
the static-split run replay exactly the same requests.

Second-region requests (the duplicate race): a fraction ``p_global`` of new keys is also
requested in one other region, ``gap`` real seconds after the first request, with ``gap``
exponential (mean ``gap_mean_s``). If the gap is longer than the lease the request is not made
(the key is gone by then). A second request that comes before the first region's claim has
replicated makes the second region claim its own resource: a duplicate key mapping.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

DAY_MIN = 1440.0


@dataclass(frozen=True, slots=True)
class RegionProfile:
    name: str
    weight: float  # demand at its peak, relative (us-east-1 = 1.0)
    peak_hour: float  # UTC hour of the daily peak
    night: float = 0.15  # floor, as a fraction of the peak


@dataclass(frozen=True, slots=True)
class Spike:
    region: str
    start_min: float
    end_min: float
    factor: float  # demand multiplier at the top
    rise_min: float = 10.0
    decay_min: float = 40.0


@dataclass(frozen=True, slots=True)
class Evacuation:
    region: str
    start_min: float
    end_min: float
    ramp_min: float = 10.0  # traffic is swung out (and back) over this many minutes


@dataclass(frozen=True, slots=True)
class Scenario:
    regions: tuple[RegionProfile, ...]
    spike: Spike | None = None
    evacuation: Evacuation | None = None
    sharpness: float = 2.0  # exponent of the diurnal bump: higher = narrower peaks

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)


def default_scenario() -> Scenario:
    """The scenario of docs/global.md: three regions, a news spike in eu-west-1 in the European
    morning, and eu-west-1 evacuated in the early afternoon UTC (its traffic swung to the US
    regions as us-east-1 climbs to its peak)."""
    return Scenario(
        regions=(
            RegionProfile("us-east-1", 1.0, 18.0),
            RegionProfile("eu-west-1", 0.7, 12.0),
            RegionProfile("us-west-2", 0.5, 21.0),
        ),
        spike=Spike("eu-west-1", start_min=6 * 60.0, end_min=8 * 60.0, factor=2.5),
        evacuation=Evacuation("eu-west-1", start_min=14 * 60.0, end_min=17 * 60.0),
    )


# ------------------------------------------------------------------------------------ rates
def diurnal(minute: float, profile: RegionProfile, sharpness: float = 2.0) -> float:
    """Relative demand of one region before spikes and evacuations: ``weight`` at the peak
    hour, ``weight * night`` twelve hours away, a smooth raised-cosine bump in between."""
    x = (minute / 60.0 - profile.peak_hour) / 24.0 * 2.0 * math.pi
    bump = float(((1.0 + math.cos(x)) / 2.0) ** sharpness)
    return profile.weight * (profile.night + (1.0 - profile.night) * bump)


def _window(minute: float, start: float, end: float, rise: float, fall: float) -> float:
    """0..1: 0 outside [start, end + fall], ramps up over ``rise``, decays over ``fall``."""
    if minute < start:
        return 0.0
    if minute < start + rise:
        return (minute - start) / rise if rise > 0 else 1.0
    if minute <= end:
        return 1.0
    if fall > 0 and minute < end + fall:
        return 1.0 - (minute - end) / fall
    return 0.0


def spike_factor(minute: float, spike: Spike | None, region: str) -> float:
    if spike is None or spike.region != region:
        return 1.0
    w = _window(minute, spike.start_min, spike.end_min, spike.rise_min, spike.decay_min)
    return 1.0 + (spike.factor - 1.0) * w


def evacuated_fraction(minute: float, evac: Evacuation | None) -> float:
    """Fraction (0..1) of the evacuated region's traffic swung away at ``minute``."""
    if evac is None:
        return 0.0
    return _window(minute, evac.start_min, evac.end_min, evac.ramp_min, evac.ramp_min)


def rates(scn: Scenario, minute: float) -> dict[str, float]:
    """Relative demand of every region at ``minute`` (0..1440, wraps), spikes and evacuation
    applied. The evacuation conserves the total: what leaves the evacuated region arrives in
    the others, in proportion to their own demand at that minute."""
    m = minute % DAY_MIN
    out = {
        p.name: diurnal(m, p, scn.sharpness) * spike_factor(m, scn.spike, p.name)
        for p in scn.regions
    }
    ev = scn.evacuation
    f = evacuated_fraction(m, ev)
    if ev is not None and f > 0 and ev.region in out:
        moved = out[ev.region] * f
        out[ev.region] -= moved
        others = {r: v for r, v in out.items() if r != ev.region}
        total = sum(others.values())
        for r, v in others.items():
            out[r] = v + moved * (v / total if total > 0 else 1.0 / len(others))
    return out


def rate(scn: Scenario, region: str, minute: float) -> float:
    return rates(scn, minute)[region]


def peak_total(scn: Scenario, step_min: float = 5.0) -> float:
    """Highest total relative demand over the day (sampled every ``step_min``)."""
    n = int(DAY_MIN / step_min)
    return max(sum(rates(scn, i * step_min).values()) for i in range(n))


def peak_of(scn: Scenario, region: str, step_min: float = 5.0) -> float:
    n = int(DAY_MIN / step_min)
    return max(rates(scn, i * step_min)[region] for i in range(n))


# -------------------------------------------------------------------------------- arrivals
@dataclass(frozen=True, slots=True, order=True)
class Request:
    """One get_lease call the driver makes: at ``t`` real seconds from the run's start."""

    t: float
    region: str
    key: str
    first: bool  # True: the key's first request (a new key); False: a second-region request
    gap: float = 0.0  # second requests: seconds after the key's first request


@dataclass(frozen=True, slots=True)
class Schedule:
    requests: list[Request] = field(default_factory=list)
    day_s: float = 0.0

    @property
    def new_keys(self) -> int:
        return sum(1 for r in self.requests if r.first)

    @property
    def second_requests(self) -> int:
        return sum(1 for r in self.requests if not r.first)


def sim_minute(t_real: float, day_s: float) -> float:
    """Real seconds since the start of the run -> simulated UTC minute of the day."""
    return t_real / day_s * DAY_MIN


def _poisson(rng: random.Random, lam: float) -> int:
    """Knuth's method (lam is small: a few arrivals per step)."""
    if lam <= 0:
        return 0
    if lam > 30:  # normal approximation, never negative
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def schedule(
    scn: Scenario,
    seed: int,
    day_s: float,
    keys_per_s: float,
    lease_s: float,
    p_global: float = 0.3,
    gap_mean_s: float = 60.0,
    step_s: float = 0.1,
    run_s: float | None = None,
) -> Schedule:
    """Every request of a run. ``keys_per_s`` scales relative demand 1.0 to new keys per real
    second; ``day_s`` is the real length of the simulated day; ``run_s`` (default ``day_s``)
    how long the run lasts. Deterministic for a seed."""
    rng = random.Random(seed)
    names = scn.names
    run_s = day_s if run_s is None else run_s
    out: list[Request] = []
    n = 0
    steps = int(math.ceil(run_s / step_s))
    for i in range(steps):
        t0 = i * step_s
        rs = rates(scn, sim_minute(t0 + step_s / 2, day_s))
        for region in names:
            for _ in range(_poisson(rng, rs[region] * keys_per_s * step_s)):
                t = t0 + rng.random() * step_s
                key = f"k{seed}-{n:06d}"
                n += 1
                out.append(Request(t, region, key, True))
                if rng.random() < p_global:
                    gap = rng.expovariate(1.0 / gap_mean_s) if gap_mean_s > 0 else 0.0
                    other = _pick_other(rng, rs, region)
                    if other is not None and gap < lease_s and t + gap < run_s:
                        out.append(Request(t + gap, other, key, False, gap))
    out.sort()
    return Schedule(out, day_s)


def _pick_other(rng: random.Random, rs: dict[str, float], region: str) -> str | None:
    """Another region, chosen in proportion to its current demand (an evacuated region gets
    no traffic, so no second request either)."""
    others = [(r, v) for r, v in sorted(rs.items()) if r != region and v > 1e-9]
    total = sum(v for _, v in others)
    if total <= 0:
        return None
    x = rng.random() * total
    for r, v in others:
        x -= v
        if x <= 0:
            return r
    return others[-1][0]


def occupancy(
    sched: Schedule, hold_s: float, names: tuple[str, ...], step_s: float = 1.0
) -> dict[str, list[int]]:
    """Leases each region would hold at every ``step_s`` if every first request got one for
    ``hold_s`` seconds (lease plus liberation delay): the capacity the traffic needs."""
    steps = int(math.ceil(sched.day_s / step_s)) + 1
    out = {r: [0] * steps for r in names}
    for req in sched.requests:
        if not req.first:
            continue
        a = int(req.t // step_s)
        b = min(steps, int((req.t + hold_s) // step_s) + 1)
        row = out[req.region]
        for i in range(a, b):
            row[i] += 1
    return out

"""How many candidates a pool's buffer holds: the daemon's demand, capped by a fair share of
a short pool (:func:`size_buffer`, :class:`FleetView`). Pure, time passed in;
``CandidateBuffer`` counts the takes and asks (docs/design.md, "Prefetch", "A pool near
full").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.lease import PARTITIONS

REFILL_HORIZON = 1.0  # seconds of demand a buffer should hold (plus the refill's time)
DEMAND_HALF_LIFE = 3.0  # seconds: the steady demand, kept through a short lull
BURST_HALF_LIFE = 0.5  # seconds: a burst after a pause is seen within a few takes
FLEET_MEMORY = 5.0  # seconds a read's count of a sub-partition's free items stands for it
FLEET_MIN_SEEN = 2  # sub-partitions read lately before their counts stand for the pool
AGE_WEIGHT = 0.25  # EWMA weight of one read's mean age of its claimable items
MIN_AGE = 0.05  # seconds: floor of that age (clock skew, items freed just now)
MIN_RATE = 0.05  # takes per second: floor of a daemon's own demand (an idle daemon)
DIRECT_SHARE = 4  # a fair share below this: no buffer; a miss reads, then claims (direct)
WHOLE_FREE = 60  # free items below which sub-partitions are read whole, from the head


@dataclass(frozen=True, slots=True)
class Sizing:
    """How many candidates a buffer holds (``target``); ``fair``, the pool's free items over
    the daemons drawing on them (None: not known to be short); ``direct``: the share is too
    small for a buffer, so a miss reads and claims at once and nothing refills ahead."""

    target: int
    fair: int | None
    direct: bool


def size_buffer(
    rate: float, refill_s: float, free: float | None, daemons: float, lo: int, hi: int
) -> Sizing:
    """The buffer's size. Demand: ``rate`` takes per second over REFILL_HORIZON plus twice
    the refill's time ``refill_s``, clamped to ``lo..hi``. Supply: when the free items are
    known (``free``, this region's, shared by ``daemons``), never more than the fair share
    free / daemons (at least 1), the floor ``lo`` included: a floor every daemon keeps would
    hold the same few items in every buffer of a nearly full pool. A share below
    ``DIRECT_SHARE`` is direct: a miss reads and claims one, as the paper's agent does."""
    want = math.ceil(rate * (REFILL_HORIZON + 2 * refill_s))
    target = max(lo, min(hi, want))
    if free is None:
        return Sizing(target, None, False)
    fair = max(1, int(free / max(1.0, daemons)))
    if fair < DIRECT_SHARE:
        return Sizing(1, fair, True)  # the candidate a miss claims at once, nothing ahead
    return Sizing(min(target, fair), fair, False)


class FleetView:
    """What a daemon's own index reads say about one pool, for :func:`size_buffer`; no read
    is made for it. Pure: time passed in.

    * Free items: per sub-partition, the claimable items its last read returned (not those
      this daemon just took), twice that for a read after a position (a lane's or a random
      start: half the sub-partition on average). A page that came back full says only "at
      least a page": the pool is not short (None). With at least ``FLEET_MIN_SEEN`` read
      within ``FLEET_MEMORY`` of the latest read, those not read count as the mean of
      those read. The estimate stands until the next read, however old: a daemon whose
      buffer makes it read seldom must not fall back to a full-size buffer for that.
    * Daemons drawing on them: Little's law. The free items are claimed at the fleet's rate
      free / age, where age is how long the claimable items read had been claimable (their
      ``lease_available``, an EWMA); over this daemon's own rate, that is how many daemons
      of its demand share the pool. A claim lost lately says there is at least one other,
      and in a short pool (under ``WHOLE_FREE``) that the share held was too big: a share
      of 1. (The age of the items read over-weights those that linger, so this count errs
      low.)
      Items read at their seeding time are old, so a fresh pool counts few daemons."""

    __slots__ = ("age", "counts", "lost_at")

    def __init__(self) -> None:
        #: sub-partition -> (claimable items read, the page was full, when: monotonic)
        self.counts: dict[int, tuple[int, bool, float]] = {}
        self.age: float | None = None
        self.lost_at = -math.inf

    def observe(self, n: int, claimable: int, full: bool, ages: list[float], now: float) -> None:
        self.counts[n] = (claimable, full, now)
        if ages:
            mean = max(MIN_AGE, sum(ages) / len(ages))
            self.age = mean if self.age is None else self.age + AGE_WEIGHT * (mean - self.age)

    def free(self, now: float) -> float | None:
        # the reads within FLEET_MEMORY of the latest one: a daemon that reads less often (a
        # bigger buffer) keeps its last estimate until it reads again
        newest = max((at for _, _, at in self.counts.values()), default=now)
        fresh = [(c, full) for c, full, at in self.counts.values() if newest - at <= FLEET_MEMORY]
        if len(fresh) < FLEET_MIN_SEEN or any(full for _, full in fresh):
            return None
        seen = sum(c for c, _ in fresh)
        return seen + seen / len(fresh) * (PARTITIONS - len(fresh))

    def daemons(self, now: float, own_rate: float, free: float | None) -> float:
        d = 1.0
        if free is not None and self.age is not None:
            d = max(1.0, free / self.age / max(own_rate, MIN_RATE))
        if now - self.lost_at <= FLEET_MEMORY:
            d = max(d, 2.0)
            if free is not None and free < WHOLE_FREE:
                # a lost race in a short pool: others claim what this daemon holds, however
                # few the age says they are; a share of 1 (direct) until the races stop
                d = max(d, free)
        return d

"""What NO_CAPACITY says about a pool's free items that are not claimable: how many are in
quarantine and until when (one bounded read after an empty sweep: they are in no index), and
how many the sweep read with a ``lease_available`` ahead. Pure pieces and the prefetcher over
a small stand-in store; the daemon end to end is in tests/integration/test_quarantine_listings.py.
"""

from __future__ import annotations

import random
from typing import Any

from rasd.config import Config
from rasd.core.decide import Rules
from rasd.core.errors import NoCapacity, Unavailable
from rasd.core.lease import US, Pool, ResourceItem, fmt_time, partition_of
from rasd.daemon.candidates import UNCLAIMABLE_MAX, why_empty
from rasd.daemon.prefetch import QUARANTINE_READ, Prefetcher
from rasd.observe.metrics import Counters
from rasd.steps import Note
from rasd.steps.daemon import DaemonContext, Miss, NewToken, RateLimit, TakeCandidate
from rasd.steps.take import acquire

NOW = 1_700_000_000 * US
T = fmt_time(NOW)
LATER, LATEST = fmt_time(NOW + 60 * US), fmt_time(NOW + 3600 * US)
EARLIER = fmt_time(NOW - 60 * US)


def test_why_empty_counts_quarantined_and_not_yet_claimable_items() -> None:
    assert why_empty([], [], True, T) is None
    assert why_empty([], [LATEST], True, T) == (
        f"1 in quarantine (until {LATEST}, then claimable once re-listed)"
    )
    said = why_empty([LATEST, LATER], [LATEST, LATER, LATEST], False, T)
    assert said is not None
    assert said.startswith(f"at least 3 in quarantine (the first until {LATER}")
    assert said.endswith(f"; 2 not claimable before {LATER}")
    over = why_empty([], [EARLIER], True, T)
    assert over is not None and "it is over" in over and "ras-liberator" in over
    assert why_empty([LATER] * UNCLAIMABLE_MAX, [], True, T) == (
        f"{UNCLAIMABLE_MAX}+ not claimable before {LATER}"
    )


def _item(name: str, available: str) -> ResourceItem:
    n = partition_of(name)
    return ResourceItem("c", name, "p", "us-east-1", f"c.p.us-east-1.{n}", 1, None, None, available)


class Store:
    """The available index as sub-partition -> items, and the pool's quarantined items."""

    def __init__(self, parts: dict[int, list[ResourceItem]], quarantined: list[str]) -> None:
        self.parts = parts
        self.quarantined = quarantined
        self.quarantine_reads: list[tuple[str, str, str, int]] = []
        self.fail = False

    async def query_available(
        self, part: str, limit: int, forward: bool, deadline: float, after: object = None
    ) -> list[ResourceItem]:
        items = self.parts.get(int(part.rsplit(".", 1)[1]), [])
        return (items if forward else items[::-1])[:limit]

    async def query_quarantined(
        self, client_id: str, pool_id: str, region: str, limit: int, deadline: float
    ) -> tuple[list[str], bool]:
        self.quarantine_reads.append((client_id, pool_id, region, limit))
        if self.fail:
            raise Unavailable("DynamoDB Query failed")
        return self.quarantined, True


class Clock:
    t = 100.0

    def mono(self) -> float:
        return self.t

    def now_us(self) -> int:
        return NOW


def prefetcher(store: Store) -> tuple[Prefetcher, Any, Clock]:
    clock = Clock()
    cfg = Config(exhausted_backoff=1.0).validate()
    p = Prefetcher(cfg, store, clock, Counters(), random.Random(3), seed=0)  # type: ignore[arg-type]
    pool = Pool("c", "p", 3600 * US)
    return p, pool, clock


async def test_an_empty_sweep_explains_itself_until_the_backoff_ends() -> None:
    """The sweep reads an item claimable only later; one bounded read finds two in
    quarantine: every NO_CAPACITY of the backoff says both, from memory."""
    ahead = _item("soon", LATER)
    store = Store({partition_of("soon"): [ahead]}, [LATEST, LATER])
    p, pool, clock = prefetcher(store)
    assert await p.candidate(pool, 1e9) is None
    assert store.quarantine_reads == [("c", "p", "us-east-1", QUARANTINE_READ)]
    said = p.why_empty(pool)
    assert said == (
        f"2 in quarantine (the first until {LATER}, then claimable once re-listed); "
        f"1 not claimable before {LATER}"
    )
    clock.t += 0.5
    assert await p.candidate(pool, 1e9) is None  # from memory: no read
    assert p.why_empty(pool) == said and len(store.quarantine_reads) == 1
    clock.t += 1.0  # the backoff is over: nothing said until the next sweep
    assert p.why_empty(pool) is None


async def test_a_failed_or_unaffordable_quarantine_read_says_only_what_the_sweep_read() -> None:
    store = Store({partition_of("soon"): [_item("soon", LATER)]}, [LATEST])
    store.fail = True
    p, pool, clock = prefetcher(store)
    assert await p.candidate(pool, 1e9) is None
    assert p.why_empty(pool) == f"1 not claimable before {LATER}"
    clock.t += 2.0
    store.fail = False
    assert await p.candidate(pool, 0.0) is None  # the deadline has passed: no second read
    assert len(store.quarantine_reads) == 1
    assert p.why_empty(pool) == f"1 not claimable before {LATER}"


def test_no_capacity_carries_what_the_daemon_knows() -> None:
    """The acquisition's NO_CAPACITY adds the ``Miss`` effect's answer; without one, the
    message is as it was."""

    def no_capacity(why: str | None) -> str:
        rules = Rules(
            margin_us=5 * US,
            grace_us=2 * US,
            pending_hold_us=2 * US,
            quarantine_us=57 * US,
            confirm_us=US,
        )
        prog = acquire(
            DaemonContext("us-east-1", "d1", rules), Pool("c", "p", 3600 * US), "k", NOW, 0
        )
        result: Any = None
        while True:
            try:
                eff = prog.send(result)
            except NoCapacity as exc:
                return str(exc)
            if isinstance(eff, RateLimit):
                result = 0.0
            elif isinstance(eff, NewToken):
                result = "t1"
            elif isinstance(eff, Miss):
                result = why
            elif isinstance(eff, (TakeCandidate, Note)):
                result = None
            else:
                raise AssertionError(eff)

    plain = "no free resource in pool 'p' in us-east-1"
    assert no_capacity(None) == plain
    assert no_capacity("") == plain
    assert no_capacity(f"1 in quarantine (until {LATEST})") == (
        f"{plain}: 1 in quarantine (until {LATEST})"
    )

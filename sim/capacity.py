"""Was a NO_CAPACITY answered while its region held a claimable item? (Pure.)

The sampler scans each region's replica every second and keeps the claimable items (free, out
of quarantine) as (resource, version) pairs. An item claimable with the *same version* in two
scans was claimable all the time between them: nothing wrote it, and a ``lease_available`` in
the past stays in the past. A NO_CAPACITY answer is wrong when such an item spans the whole
window in which the daemon may have decided it: from ``exhausted_backoff`` before the request
was sent (an empty sweep that recent may answer for it) to the answer. Items claimed and freed
again between scans are not counted, so the check can miss a wrong answer but never blames a
right one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ClaimableSample:
    region: str
    start: float  # monotonic seconds: the scan began (its "now" was taken then)
    end: float  # the scan ended
    items: frozenset[tuple[str, int]]  # (resource, version) claimable at ``start``


class Answer(Protocol):
    region: str
    code: str
    sent: float
    done: float


def no_capacity_while_claimable(
    outcomes: Iterable[Answer], samples: Iterable[ClaimableSample], backoff: float
) -> list[dict[str, object]]:
    """Every NO_CAPACITY answered while an item of its region was claimable throughout
    [sent - backoff, done], with one such item as the witness."""
    by_region: dict[str, list[ClaimableSample]] = {}
    for s in samples:
        by_region.setdefault(s.region, []).append(s)
    for rows in by_region.values():
        rows.sort(key=lambda s: s.start)
    wrong: list[dict[str, object]] = []
    for o in outcomes:
        if o.code != "NO_CAPACITY" or not o.sent:
            continue
        rows = by_region.get(o.region, [])
        before = [s for s in rows if s.end <= o.sent - backoff]
        after = [s for s in rows if s.start >= o.done]
        if not before or not after:
            continue
        both = before[-1].items & after[0].items
        if both:
            wrong.append({"region": o.region, "sent": round(o.sent, 3), "witness": min(both)[0]})
    return wrong

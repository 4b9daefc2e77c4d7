"""Where a daemon reads a pool's ``available_resources`` index: lanes, the ends, spread order.

``Lanes`` (pure; randomness passed in) picks the stretch of the index the next read of a
pool covers, so that daemons' claims rarely meet; :func:`spread_order` orders sweeps and
whole reads. The rules: docs/design.md, "Prefetch" and "Lanes and the buffer, in detail".
"""

from __future__ import annotations

import os
import random
import socket
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..core.lease import PARTITIONS, ResourceItem

HOME_SHARE = 0.75  # share of lanes that start in the daemon's home sub-partition
SEEN_MAX = 32  # lease_available values remembered per sub-partition
NAMES_MAX = 64  # resource names remembered per pool (NameModel)
END_KEEP = 4  # items kept from a read from an end (where every cold daemon reads)
CONTENDED_MEMORY = 32  # lost claims remembered per pool (then halved) to steer new lanes

#: (lease_available, resource): with the partition and client_id, an index position
StartKey = tuple[str, str]


def spread_order(seed: int, pool: str, round_: int) -> list[int]:
    """Every sub-partition once, ranked by a hash of (daemon, pool, round): two daemons
    rarely rank the same one first, and each round ranks them anew."""
    return random.Random(f"{seed}:{pool}:{round_}").sample(range(PARTITIONS), PARTITIONS)


def host_seed() -> int:
    """A stable number for this daemon (hostname and pid): its home sub-partition."""
    return zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode())


class NameModel:
    """Random resource names shaped like the ones seen: per character position, any character
    between the lowest and the highest seen there (names read at both ends of an index thus
    span its whole range). Pure; bounded (a reservoir of ``NAMES_MAX`` names)."""

    __slots__ = ("_chars", "_dirty", "n", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.n = 0  # names offered so far (reservoir sampling)
        self._chars: list[str] = []
        self._dirty = False

    def learn(self, name: str, rng: random.Random) -> None:
        self.n += 1
        if len(self.names) < NAMES_MAX:
            self.names.append(name)
        else:
            j = rng.randrange(self.n)
            if j >= NAMES_MAX:
                return
            self.names[j] = name
        self._dirty = True

    def draw(self, rng: random.Random) -> str | None:
        if not self.names:
            return None
        if self._dirty:
            width = max(len(x) for x in self.names)
            chars = []
            for i in range(width):
                seen = [ord(x[i]) for x in self.names if len(x) > i]
                chars.append("".join(map(chr, range(min(seen), max(seen) + 1))))
            self._chars = chars
            self._dirty = False
        length = len(rng.choice(self.names))
        return "".join(rng.choice(self._chars[i]) for i in range(length))


@dataclass(slots=True, frozen=True)
class Read:
    """One Query of sub-partition ``n``: ``after`` a position, or from an end (None)."""

    n: int
    after: StartKey | None
    forward: bool
    limit: int
    #: the lane this read continues or starts (keeps the page in order); 0: keep a sample
    lane: int = 0
    #: the most a sampled read keeps (None: up to the target)
    keep: int | None = None


class Lanes:
    """Where the reads of one pool go: its current lane, what its reads saw of the index
    (times per sub-partition, names, which ends), the contended sub-partitions, the spread
    order. ``page``: the most items a read asks for (``prefetch_page``)."""

    def __init__(self, rng: random.Random, page: int, seed: int = 0, pool: str = "") -> None:
        self.rng = rng
        self.page = page
        self.seed = seed
        self.pool = pool
        self.home = seed % PARTITIONS
        self.round = 0  # spread_order's round: one per sweep, or per pass of whole reads
        self._order: list[int] = []  # what is left of this round's order
        #: per sub-partition: lease_available values seen claimable (a reservoir)
        self.seen: dict[int, list[str]] = {}
        self._seen_n: dict[int, int] = {}
        self.names = NameModel()
        self._ends: set[bool] = set()  # directions of reads from an end so far
        #: the current lane: its sub-partition, the position after which it continues, its id
        self.lane_n = 0
        self.lane_after: StartKey | None = None
        self.lane_id = 0
        self.lane_wrap = False  # the lane reached the end: it goes on from the head
        #: sub-partitions where claims lost lately (how many; halved past CONTENDED_MEMORY):
        #: new lanes avoid them
        self.contended: dict[int, int] = {}
        self._lanes = 0  # lane ids handed out
        self._busy: set[int] = set()  # lanes with a read in flight
        self._lost_lanes: deque[int] = deque(maxlen=8)  # lanes ended by a lost claim

    # -- what to read ----------------------------------------------------------------------
    def plan(self, room: Callable[[], int], urgent: bool = False) -> Read:
        """The next read that is not a whole sub-partition: the current lane, or a new one
        (mostly in the home sub-partition) after a random position, or from an end when the
        pool's two ends are not known yet. A lane read asks for ``room()`` items. A read
        from an end keeps nothing in the background (a lane read follows), and ``END_KEEP``
        items when a request waits (``urgent``)."""
        if (
            self.lane_id
            and self.lane_id not in self._busy
            and (self.lane_after is not None or self.lane_wrap)
        ):
            self._busy.add(self.lane_id)
            return Read(self.lane_n, self.lane_after, True, room(), self.lane_id)
        # no lane, or its read is still in flight (a sweep next to a refill): a new lane
        n = self.lane_partition()
        start = self.start_key(n)
        if start is None:
            keep = END_KEEP if urgent else 0
            return Read(n, None, self.end_direction(), self.page, keep=keep)
        self._lanes += 1
        self.lane_n, self.lane_after, self.lane_id = n, start, self._lanes
        self.lane_wrap = False
        self._busy.add(self.lane_id)
        return Read(n, start, True, room(), self.lane_id)

    def lane_partition(self) -> int:
        """Where a new lane starts: mostly the home sub-partition, else one at random; either
        way one of those where claims lost least often."""
        n = self.home if self.rng.random() < HOME_SHARE else self.rng.randrange(PARTITIONS)
        if self.contended.get(n):
            least = min(self.contended.get(i, 0) for i in range(PARTITIONS))
            if self.contended[n] > least:
                n = self.rng.choice(
                    [i for i in range(PARTITIONS) if self.contended.get(i, 0) == least]
                )
        return n

    def next_partition(self) -> int:
        """The next sub-partition of this round's :func:`spread_order` (a new round once
        every one was read)."""
        if not self._order:
            self.round += 1
            self._order = spread_order(self.seed, self.pool, self.round)
        return self._order.pop(0)

    def partitions(self) -> list[int]:
        """Sub-partitions in the order a sweep reads them: every one, ranked by
        :func:`spread_order` for a new round."""
        self.round += 1
        self._order = []
        return spread_order(self.seed, self.pool, self.round)

    def probe(self, n: int) -> Read:
        """A read of sub-partition ``n`` that starts no lane (a sweep of the others, a
        fallback to the head): a whole page from a random position or an end, sampled."""
        start = self.start_key(n)
        forward = self.rng.random() < 0.5 if start is not None else self.end_direction()
        return Read(n, start, forward, self.page)

    def start_key(self, n: int) -> StartKey | None:
        """A random position to read sub-partition ``n`` after (None: nothing known yet).
        The time is one seen in ``n``, or in another sub-partition of the pool when none is
        known there (a pool seeded in one batch has one time everywhere). None too until
        both ends of the pool have been read: the names seen at one end span only a part of
        the range, and every daemon would start its lanes in that part."""
        if not self.ends_known():
            return None
        seen = self.seen.get(n)
        if not seen:
            pools = [s for s in self.seen.values() if s]
            if not pools:
                return None
            seen = self.rng.choice(pools)
        name = self.names.draw(self.rng)
        if name is None:
            return None
        return self.rng.choice(seen), name

    def ends_known(self) -> bool:
        """Both ends of the pool have been read (lanes can start)."""
        return len(self._ends) == 2

    def end_direction(self) -> bool:
        """The direction of a read from an end of the index (True: forward, from the head).
        The pool's first two go opposite ways, so names from both ends feed the NameModel."""
        left = [d for d in (True, False) if d not in self._ends]
        forward = self.rng.choice(left) if left else self.rng.random() < 0.5
        self._ends.add(forward)
        return forward

    # -- what came back --------------------------------------------------------------------
    def read_done(self, read: Read, raw: list[ResourceItem], claimable: list[ResourceItem]) -> bool:
        """Take in what ``read`` returned (``claimable``: those claimable now): move the lane
        on past the page (or end it), learn where claimable items are. False when a claim
        from the read's lane lost meanwhile: the read keeps nothing."""
        self._busy.discard(read.lane)
        if read.lane and read.lane == self.lane_id:
            last = claimable[-1] if claimable else None
            if last is None or last.lease_available is None:
                self._end_lane()  # nothing claimable at all: another lane, elsewhere
            elif len(raw) < read.limit or len(claimable) < len(raw):
                # the end of the sub-partition, or its quarantined tail: on from the head,
                # unless this read was from the head already
                if read.after is None:
                    self._end_lane()
                else:
                    self.lane_after, self.lane_wrap = None, True
            else:
                self.lane_after = (last.lease_available, last.resource)
                self.lane_wrap = False
        self.learn(read.n, claimable)
        return not (read.lane and read.lane in self._lost_lanes)

    def read_failed(self, read: Read) -> None:
        """``read`` raised: its lane may be read again."""
        self._busy.discard(read.lane)

    def learn(self, n: int, items: list[ResourceItem]) -> None:
        """Remember where claimable items of sub-partition ``n`` are (``items``: claimable)."""
        seen = self.seen.setdefault(n, [])
        count = self._seen_n.get(n, 0)
        for it in items:
            if it.lease_available is None:
                continue
            count += 1
            if len(seen) < SEEN_MAX:
                seen.append(it.lease_available)
            else:
                j = self.rng.randrange(count)
                if j < SEEN_MAX:
                    seen[j] = it.lease_available
            self.names.learn(it.resource, self.rng)
        self._seen_n[n] = count
        if not seen:
            del self.seen[n]

    def contend(self, n: int) -> None:
        """A claim in sub-partition ``n`` lost the race: new lanes start elsewhere a while."""
        self.contended[n] = self.contended.get(n, 0) + 1
        if sum(self.contended.values()) > CONTENDED_MEMORY:  # forget slowly: halve them all
            self.contended = {i: c // 2 for i, c in self.contended.items() if c > 1}

    def leave(self, lane: int) -> None:
        """A claim from ``lane`` lost the race: the winner reads the same stretch. End the
        lane if it is the current one; a read of it still in flight keeps nothing."""
        if lane == self.lane_id:
            self._end_lane()
        self._lost_lanes.append(lane)

    def _end_lane(self) -> None:
        self.lane_id, self.lane_after, self.lane_wrap = 0, None, False

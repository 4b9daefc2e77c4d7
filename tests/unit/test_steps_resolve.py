"""The daemon's cache miss (``rasd.steps.take.resolve``) and acquisition (``acquire``), and the
steps they share (``rasd.steps.daemon``), driven over plain items with ``rasd.core.writes.apply``
(as the checker evaluates writes): what is served and counted, the writes sent and what they
leave on the table, and every round a miss goes on to (``Tail``), with time passed in."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from rasd.core.builders import claim, extend_resource, new_resource_item, paper_claim
from rasd.core.decide import Freed, NeverNamed, Outcome, Rules, lease_from_mapping
from rasd.core.errors import Busy, NoCapacity, RasdError, Timeout, Unavailable
from rasd.core.lease import LIVE, PENDING, US, Lease, Mapping, Pool, ResourceItem, map_pk
from rasd.core.map_builders import map_acquire, map_confirm, map_release
from rasd.core.serialize import mapping_from, resource_from
from rasd.core.writes import ItemKey, Value, apply, item_from_av
from rasd.steps import (
    GetItem,
    Join,
    Mono,
    Note,
    Now,
    Program,
    QueryLeased,
    QueryMappings,
    Send,
    Sleep,
    Spawn,
    Tail,
    Together,
    WriteResult,
)
from rasd.steps.daemon import (
    WAIT_FIRST,
    WAIT_MAX,
    CacheDrop,
    CachePut,
    DaemonContext,
    Deadline,
    LostCandidate,
    Miss,
    NewToken,
    RateLimit,
    RefillSoon,
    Refresh,
    RelistLater,
    TakeCandidate,
    Untake,
    fence,
    read,
    read_first,
    resource,
)
from rasd.steps.take import acquire, resolve

NOW = 1_700_000_000 * US
HOUR = 3600 * US
EAST, WEST = "us-east-1", "us-west-2"
POOL = Pool("c", "p", 24 * HOUR)
RULES = Rules(
    margin_us=5 * US, grace_us=2 * US, pending_hold_us=2 * US, quarantine_us=57 * US, confirm_us=US
)
REQ = NOW + HOUR  # the end a request asks for
WAIT = 0.02  # the wait a miss starts with (not WAIT_FIRST: a round that drops it shows)

Item = dict[str, Value]


@dataclass
class Cand:
    item: ResourceItem


class Host:
    """A daemon's world: plain items by key, its clock and candidates; ``perform`` runs a
    program's effects on them. ``fates`` scripts how a write of a kind ends, in turn:
    ``refused`` (condition failed, nothing written), ``unsent`` (REJECTED with an error),
    ``lost`` (written, reply lost: UNKNOWN), ``dropped`` (not written, reply lost: UNKNOWN),
    ``broken`` (not written, UNKNOWN with the store's Unavailable),
    ``retried`` (written, the retry refused: read back with the write's own check)."""

    def __init__(self, legacy: bool = False) -> None:
        self.d = DaemonContext(EAST, "d1", RULES, legacy_agents=legacy)
        self.items: dict[ItemKey, Item] = {}
        self.now = NOW
        self.mono = 0.0
        self.cands: list[str | ResourceItem] = []
        self.at_hand = True  # candidates in the buffer (False: only after an index read)
        self.rate_wait = 0.0
        self.tokens = 0
        self.seen: list[Any] = []
        self.counts: Counter[str] = Counter()
        self.fates: dict[str, list[str]] = {}
        self.before: dict[str, Callable[[], None]] = {}  # write kind -> hook, run once
        self.tails: list[Tail] = []

    # ------------------------------------------------------------------ running programs
    def run(self, prog: Program[Any]) -> Any:
        """Drive ``prog`` to its end (as ``drive_sync``), recording each ``Tail``."""
        result: Any = None
        error: RasdError | None = None
        while True:
            try:
                eff = prog.send(result) if error is None else prog.throw(error)
            except StopIteration as stop:
                return stop.value
            if isinstance(eff, Tail):
                self.tails.append(eff)
                assert len(self.tails) < 100, "a miss that never ends"
                prog, result, error = eff.fn(*eff.args), None, None
                continue
            try:
                result, error = self.perform(eff), None
            except RasdError as exc:
                result, error = None, exc

    def perform(self, eff: Any) -> Any:
        self.seen.append(eff)
        if isinstance(eff, Note):
            self.counts[eff.event] += 1
            return None
        if isinstance(eff, Now):
            return self.now
        if isinstance(eff, Mono):
            self.mono += 1.0
            return self.mono
        if isinstance(eff, Sleep):
            assert eff.bounded
            self.now += int(eff.seconds * US)
            return None
        if isinstance(eff, RateLimit):
            assert eff.pool == POOL
            return self.rate_wait
        if isinstance(eff, NewToken):
            self.tokens += 1
            return f"t{self.tokens}"
        if isinstance(eff, TakeCandidate):
            assert eff.pool == POOL
            if not self.cands or not (eff.wait or self.at_hand):
                return None
            c = self.cands.pop(0)
            return Cand(self.res(c) if isinstance(c, str) else c)
        if isinstance(eff, Together):
            return tuple(self.call(c) for c in eff.calls)
        if isinstance(eff, (GetItem, QueryMappings, QueryLeased, Send)):
            return self.call(eff)
        if isinstance(eff, Spawn):
            return eff  # the handle a Join takes
        if isinstance(eff, Join):  # the request waits for it: it runs now
            self.run(eff.handle.fn(*eff.handle.args))
            return None
        local = (CachePut, CacheDrop, Refresh, RefillSoon, Untake, LostCandidate, Miss)
        if isinstance(eff, (*local, Deadline, RelistLater)):
            return None
        raise AssertionError(eff)

    def call(self, eff: Any) -> Any:
        if isinstance(eff, GetItem):
            got = self.items.get(eff.key)
            return dict(got) if got is not None else None
        if isinstance(eff, QueryMappings):
            pk = map_pk(eff.client_id, eff.pool_id, eff.key)
            return [mapping_from(v) for k, v in sorted(self.items.items()) if k[0] == pk]
        if isinstance(eff, QueryLeased):
            return [
                resource_from(v)
                for k, v in sorted(self.items.items())
                if k[0] == eff.client_id and v.get("pool_id") == eff.pool_id
                if v.get("key") == eff.key
            ]
        assert isinstance(eff, Send)
        w = eff.write
        hook = self.before.pop(w.kind, None)
        if hook is not None:
            hook()
        fate = self.fates.get(w.kind, [])
        how = fate.pop(0) if fate else "ok"
        if how == "refused":
            return WriteResult(Outcome.REJECTED)
        if how == "unsent":
            return WriteResult(Outcome.REJECTED, error=Unavailable("throttled"))
        if how == "dropped":
            return WriteResult(Outcome.UNKNOWN, error=Timeout("reply lost"))
        if how == "broken":
            return WriteResult(Outcome.UNKNOWN, error=Unavailable("connection reset"))
        res = self.land(w)
        if how == "lost":
            return WriteResult(Outcome.UNKNOWN, error=Timeout("reply lost"))
        if how == "retried":
            cur = self.items.get(w.key)
            if res.outcome is Outcome.APPLIED and eff.readback and cur and eff.readback(cur):
                return WriteResult(Outcome.APPLIED, dict(cur))
            return WriteResult(Outcome.REJECTED)
        assert how == "ok", how
        return res

    def land(self, w: Any) -> WriteResult:
        new = apply(self.items.get(w.key), w)
        if new is None:
            return WriteResult(Outcome.REJECTED)
        self.items[w.key] = new
        return WriteResult(Outcome.APPLIED, dict(new))

    # ------------------------------------------------------------------ what happened
    def writes(self) -> list[str]:
        """The writes in the order they went out (one round trip of several: joined by +)."""
        out = []
        for e in self.seen:
            if isinstance(e, Send):
                out.append(e.write.kind)
            elif isinstance(e, Together) and any(isinstance(c, Send) for c in e.calls):
                out.append("+".join(c.write.kind for c in e.calls if isinstance(c, Send)))
        return out

    def of(self, cls: type) -> list[Any]:
        return [e for e in self.seen if isinstance(e, cls)]

    def waits(self) -> list[float]:
        return [e.seconds for e in self.of(Sleep)]

    def rounds(self, *waits: float, mine: tuple[str, ...] = ()) -> None:
        """Every round after the first was this miss again, with these waits (and the tokens
        of the mappings this call wrote, ``mine``)."""
        assert [t.fn for t in self.tails] == [resolve] * len(waits)
        want = [(self.d, POOL, "k", REQ, w, mine, False) for w in waits]
        assert [t.args for t in self.tails] == want

    def notes(self) -> dict[str, int]:
        return dict(self.counts)

    # ------------------------------------------------------------------ building the table
    def res(self, name: str) -> ResourceItem:
        return resource_from(self.items[("c", name)])

    def mapping(self, key: str = "k", region: str = EAST) -> Mapping:
        return mapping_from(self.items[(map_pk("c", "p", key), region)])

    def free(self, name: str, region: str = EAST) -> ResourceItem:
        self.items[("c", name)] = item_from_av(
            new_resource_item("c", "p", region, name, NOW - HOUR)
        )
        return self.res(name)

    def ours(
        self,
        name: str,
        end: int,
        key: str = "k",
        region: str = EAST,
        state: str = LIVE,
        since: int = NOW - HOUR,
        landed: bool = True,
        token: str = "old",
    ) -> Mapping:
        """A lease of ``key`` acquired by a daemon of ``region`` at ``since``: its mapping (in
        ``state``) names ``name``; ``landed``: the claim is on the item."""
        r = self.free(name, region)
        mid = (map_pk("c", "p", key), region)
        assert self.land(map_acquire(mid, 0, token, name, r.version, end, since, "d0")).outcome
        if landed:
            self.land(claim(r, key, end, since, token, 1))
        if state == LIVE:
            self.land(map_confirm(self.mapping(key, region)))
        return self.mapping(key, region)

    def paper(self, name: str, end: int, key: str = "k") -> ResourceItem:
        """A lease of the paper's agent: the item claimed for ``key``, no mapping, no holder."""
        self.land(paper_claim(self.free(name), key, end))
        return self.res(name)


def resolve_k(h: Host, wait: float = WAIT) -> Any:
    try:
        return h.run(resolve(h.d, POOL, "k", REQ, wait))
    except RasdError as exc:
        return exc


# ------------------------------------------------------------------- a miss, no paper agent
def test_a_miss_on_a_new_key_acquires_and_serves_the_claim() -> None:
    h = Host()
    h.free("r1")
    h.cands = ["r1"]
    lease, new = resolve_k(h)
    assert new is True
    assert (lease.resource, lease.key, lease.token, lease.expires_us) == ("r1", "k", "t1", REQ)
    assert (lease.region, lease.version, lease.acquired_us) == (EAST, 1, NOW)
    assert h.writes() == ["map_acquire+claim"]
    assert h.notes() == {"lease.new": 1}
    # cached as of the departure of the round trip that wrote it (the second clock reading)
    assert h.of(CachePut) == [CachePut(lease, 2.0)]
    m = h.mapping()
    assert (m.state, m.ver, m.token, m.resource, m.rver, m.owner) == (
        PENDING,
        1,
        "t1",
        "r1",
        0,
        "d1",
    )
    r = h.res("r1")
    assert (r.key, r.holder, r.mver, r.version) == ("k", "t1", 1, 1)
    (spawn,) = h.of(Spawn)
    assert spawn.fn.__name__ == "confirm" and spawn.args == (m,)
    h.run(spawn.fn(*spawn.args))
    assert h.mapping().state == LIVE
    assert h.of(RefillSoon) and not h.of(Untake) and not h.tails


def test_a_live_lease_is_served_as_it_is_and_refreshed() -> None:
    h = Host()
    m = h.ours("r1", NOW + HOUR)
    lease, new = resolve_k(h)
    assert new is False
    assert (lease.resource, lease.token, lease.expires_us) == ("r1", "old", NOW + HOUR)
    assert h.writes() == [] and h.notes() == {"lease.existing": 1}
    assert h.of(CachePut) == [CachePut(lease, 1.0)]  # confirmed as of the read's departure
    assert h.of(Refresh) == [Refresh(lease, REQ)]
    assert h.of(QueryMappings) == [QueryMappings("c", "p", "k")]
    assert not h.of(Spawn) and not h.tails and m.state == LIVE


def test_another_regions_lease_is_served_when_ours_is_absent() -> None:
    h = Host()
    h.ours("w1", NOW + HOUR, region=WEST)
    lease, new = resolve_k(h)
    assert (lease.resource, lease.region, new) == ("w1", WEST, False)
    assert h.writes() == [] and h.notes() == {"lease.existing": 1}


def test_ours_is_served_before_an_older_foreign_lease_only_if_it_is_older() -> None:
    h = Host()
    h.ours("w1", NOW + HOUR, region=WEST, since=NOW - 2 * HOUR)
    h.ours("r1", NOW + HOUR)
    lease, _ = resolve_k(h)
    assert lease.resource == "w1"  # the earlier acquisition wins, whoever reads
    h = Host()
    h.ours("w1", NOW + HOUR, region=WEST)
    h.ours("r1", NOW + HOUR, since=NOW - 2 * HOUR)
    lease, _ = resolve_k(h)
    assert lease.resource == "r1"


def test_a_pending_mapping_whose_claim_landed_is_served_and_confirmed() -> None:
    h = Host()
    m = h.ours("r1", NOW + HOUR, state=PENDING, since=NOW - 1)
    lease, new = resolve_k(h)
    assert (lease.resource, lease.token, new) == ("r1", "old", False)
    assert h.of(GetItem) == [GetItem(("c", "r1"))]
    assert h.notes() == {"lease.existing": 1} and h.writes() == []
    (spawn,) = h.of(Spawn)
    assert spawn.fn.__name__ == "confirm" and spawn.args == (m,)


def test_a_young_pending_claim_is_waited_for_then_fenced_then_taken_over() -> None:
    """Another daemon's acquisition that has not landed: polled (5 ms doubling, up to
    WAIT_MAX) while younger than the pending hold, then its resource fenced so it never
    lands, then the mapping is ours to acquire at its version."""
    h = Host()
    h.ours("r1", NOW + HOUR, state=PENDING, since=NOW, landed=False)
    h.free("r2")
    h.cands = ["r2"]
    lease, new = resolve_k(h, WAIT_FIRST)
    assert (lease.resource, new) == ("r2", True)
    waits = h.waits()
    assert waits[:6] == [0.005, 0.01, 0.02, 0.04, 0.08, WAIT_MAX]
    assert set(waits[5:]) == {WAIT_MAX}
    assert (
        sum(int(w * US) for w in waits[:-1])
        < RULES.pending_hold_us
        <= sum(int(w * US) for w in waits)
    )
    assert h.notes() == {"acq.waits": len(waits), "acq.fenced": 1, "lease.new": 1}
    assert h.writes() == ["fence_resource", "map_acquire+claim"]
    assert h.res("r1").version == 1 and h.res("r1").key is None  # fenced, never claimed
    assert h.mapping().ver == 2 and h.mapping().resource == "r2"
    h.rounds(*waits[1:], WAIT_MAX, WAIT_MAX)


# ------------------------------------------------------------------------ the acquisition
def released(h: Host) -> int:
    """The key's mapping after a lease of it was released (free, at version 3): the version
    an acquisition expects."""
    h.ours("r0", NOW - HOUR, since=NOW - 2 * HOUR)
    h.land(map_release(h.mapping().ident, "old", NOW - HOUR))
    assert h.mapping().ver == 3
    return 3


def take(h: Host, *names: str, version: int = 0) -> int:
    """Free items ``names`` (at ``version``) as candidates, after a released mapping."""
    for n in names:
        h.free(n)
        h.items[("c", n)]["version"] = version
    h.cands = list(names)
    return released(h)


def acquire_k(h: Host, expect_ver: int) -> Any:
    try:
        return h.run(acquire(h.d, POOL, "k", REQ, expect_ver))
    except RasdError as exc:
        return exc


@pytest.mark.parametrize("legacy", [False, True])
def test_a_won_acquisition_writes_the_mapping_and_the_claim(legacy: bool) -> None:
    h = Host(legacy)
    ev = take(h, "r1", version=5)
    h.now += 7
    got = acquire_k(h, ev)
    m = h.mapping()
    assert (m.ver, m.state, m.token, m.resource, m.rver) == (4, PENDING, "t1", "r1", 5)
    assert (m.expires_us, m.since_us, m.owner, m.region) == (REQ, NOW + 7, "d1", EAST)
    r = h.res("r1")
    assert (r.key, r.holder, r.mver, r.version, r.hver) == ("k", "t1", 4, 6, 6)
    assert (r.lease_expires_us, r.lease_acquired_us, r.lease_available) == (REQ, NOW + 7, None)
    assert h.of(RefillSoon) == [RefillSoon(POOL)] and not h.of(Untake)
    if legacy:
        assert got == m  # the pending mapping, to settle
        assert h.writes() == ["map_acquire", "claim"]
        assert h.notes() == {} and not h.of(CachePut) and not h.of(Spawn)
        return
    assert h.writes() == ["map_acquire+claim"]
    assert got == Lease("c", "p", "k", "r1", EAST, REQ, 6, NOW + 7, "t1")
    assert h.of(CachePut) == [CachePut(got, 1.0)]
    assert h.notes() == {"lease.new": 1}
    assert [(s.fn.__name__, s.args) for s in h.of(Spawn)] == [("confirm", (m,))]


@pytest.mark.parametrize("legacy", [False, True])
def test_a_candidate_taken_meanwhile_is_dropped_and_the_next_claimed(legacy: bool) -> None:
    """The mapping write won but the claim lost its condition (another daemon claimed the
    candidate first): the mapping is ours at the version written, the next candidate is
    claimed under it."""
    h = Host(legacy)
    ev = take(h, "r1", "r2")
    stale = h.res("r1")
    h.land(claim(stale, "other", REQ, NOW, "x", 1))  # someone else took it since
    h.cands = [stale, "r2"]
    got = acquire_k(h, ev)
    assert got.resource == "r2"
    assert h.notes() == (
        {"prefetch.conflicts": 1} if legacy else {"prefetch.conflicts": 1, "lease.new": 1}
    )
    (lost,) = h.of(LostCandidate)
    assert lost.pool == POOL and lost.cand.item == stale
    assert not h.of(Untake)
    m = h.mapping()
    assert (m.ver, m.resource, m.token) == (5, "r2", "t2")  # a token names one claim
    assert h.res("r2").mver == 5 and h.res("r1").holder == "x"
    seq = ["map_acquire", "claim"] if legacy else ["map_acquire+claim"]
    assert h.writes() == seq * 2


def test_a_claim_whose_mapping_lost_is_given_back() -> None:
    h = Host()
    ev = take(h, "r1")
    h.fates["map_acquire"] = ["refused"]
    assert acquire_k(h, ev) is None  # read again
    assert h.notes() == {"acq.gave_back": 1}
    assert [(s.fn.__name__, s.args) for s in h.of(Spawn)] == [
        ("free_claim", (h.d, ("c", "r1"), "k", "t1", Freed.UNNAMED))
    ]
    assert not h.of(Untake) and h.res("r1").holder == "t1"
    spawn = h.of(Spawn)[0]
    h.run(spawn.fn(*spawn.args))
    assert h.res("r1").key is None  # given back


def test_both_writes_refused_reads_again() -> None:
    h = Host()
    ev = take(h, "r1")
    h.fates = {"map_acquire": ["refused"], "claim": ["refused"]}
    assert acquire_k(h, ev) is None
    assert h.notes() == {"acq.lost_mapping": 1}
    assert not h.of(Untake) and not h.of(Spawn)


def test_a_claim_of_unknown_outcome_whose_mapping_lost_is_fenced() -> None:
    h = Host()
    ev = take(h, "r1", version=2)
    cand = h.res("r1")
    h.fates = {"map_acquire": ["refused"], "claim": ["dropped"]}
    assert acquire_k(h, ev) is None
    assert h.notes() == {"acq.fence_own": 1}
    assert [(s.fn.__name__, s.args) for s in h.of(Spawn)] == [
        ("fence_own_claim", (h.d, cand, "k", "t1", NeverNamed("map_acquire")))
    ]
    (untake,) = h.of(Untake)
    assert untake.pool == POOL and untake.cand.item == cand


@pytest.mark.parametrize(
    ("fates", "error", "untake"),
    [
        ({"map_acquire": ["lost"]}, Timeout, False),
        ({"map_acquire": ["dropped"], "claim": ["unsent"]}, Timeout, True),
        ({"map_acquire": ["broken"]}, Unavailable, False),
        ({"map_acquire": ["broken"], "claim": ["lost"]}, Unavailable, True),
        ({"claim": ["lost"]}, Timeout, True),
        ({"claim": ["broken"]}, Unavailable, True),
    ],
)
def test_an_unknown_outcome_gives_up_with_the_first_error(
    fates: dict[str, list[str]], error: type, untake: bool
) -> None:
    h = Host()
    ev = take(h, "r1")
    h.fates = {k: list(v) for k, v in fates.items()}
    got = acquire_k(h, ev)
    assert type(got) is error
    assert h.notes() == {"acq.gave_up": 1}
    assert bool(h.of(Untake)) is untake and not h.of(Spawn) and not h.of(CachePut)


def test_beside_the_paper_agent_a_lost_mapping_sends_no_claim() -> None:
    for fate, want in (
        ("refused", None),
        ("unsent", None),
        ("dropped", Timeout),
        ("broken", Unavailable),
    ):
        h = Host(legacy=True)
        ev = take(h, "r1")
        h.fates = {"map_acquire": [fate]}
        got = acquire_k(h, ev)
        assert got is None if want is None else type(got) is want
        assert h.writes() == ["map_acquire"]
        assert len(h.of(Untake)) == 1  # not sent: the item may still be free
        assert h.res("r1").key is None
        assert h.notes() == ({"acq.lost_mapping": 1} if want is None else {"acq.gave_up": 1})


@pytest.mark.parametrize(("wait", "shown"), [(0.25, 0.25), (0.12345, 0.123), (1.5, 1.5)])
def test_the_rate_limit_sheds_before_anything_is_sent(wait: float, shown: float) -> None:
    h = Host()
    ev = take(h, "r1")
    h.rate_wait = wait
    got = acquire_k(h, ev)
    assert isinstance(got, Busy) and got.retry_after == shown
    assert "'p'" in str(got)
    assert h.notes() == {"shed.rate_limited": 1}
    assert h.seen == [RateLimit(POOL), Note("shed.rate_limited")]


def test_no_candidate_is_no_capacity_and_counted_for_the_balancer() -> None:
    h = Host()
    ev = take(h)
    got = acquire_k(h, ev)
    assert isinstance(got, NoCapacity)
    assert str(got) == "no free resource in pool 'p' in us-east-1"
    assert h.notes() == {"lease.no_capacity": 1}
    assert h.of(Miss) == [Miss(POOL)] and h.writes() == []


# ------------------------------------------------------------------------ extending in a miss
@pytest.mark.parametrize("legacy", [False, True])
def test_a_lease_too_close_to_its_end_is_extended_before_it_is_served(legacy: bool) -> None:
    h = Host(legacy)
    h.ours("r1", NOW + 3 * US)  # within the margin
    h.fates["extend_resource"] = ["refused"]  # the first try loses: read again
    lease, new = resolve_k(h)
    assert (lease.resource, lease.expires_us, new) == ("r1", REQ, False)
    assert h.writes() == ["extend_resource", "extend_resource", "map_extend"]
    assert h.res("r1").lease_expires_us == REQ and h.mapping().expires_us == REQ
    beside = {"rollout.beside_read.no_candidate": 1} if legacy else {}
    assert h.notes() == {"lease.extended": 1, **beside}
    assert not h.of(Refresh)
    h.rounds(WAIT)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_mapping_at_its_end_whose_item_runs_on_is_extended(legacy: bool) -> None:
    """The mapping's end is now (the extension wrote the item first): beside the paper's
    agent the item decides, and it still runs; without it, no item is read."""
    h = Host(legacy)
    h.ours("r1", NOW)
    h.land(extend_resource(lease_from_mapping(h.mapping()), NOW + 1))
    lease, _ = resolve_k(h)
    assert lease.expires_us == REQ
    assert h.writes() == ["extend_resource", "map_extend"]
    assert h.of(GetItem) == ([GetItem(("c", "r1"))] if legacy else [])


def test_beside_the_paper_agent_a_lease_at_its_end_waits_for_every_clock_then_acquires_anew() -> (
    None
):
    """At its end on this host's clock: neither extended (the paper's agent takes the end as
    final) nor ended (a host whose clock is behind by up to the skew bound may still serve
    it). The call waits until the end has passed on every clock, in one sleep (no read
    before then can end the wait), then the key acquires anew (nothing free here); the
    lapsed item is the liberator's."""
    h = Host(legacy=True)
    h.ours("r1", NOW)
    got = resolve_k(h, WAIT_FIRST)
    assert isinstance(got, NoCapacity)
    assert h.waits() == [RULES.grace_us / US]
    assert h.writes() == []
    assert h.of(GetItem) == [GetItem(("c", "r1"))]  # the item, before the wait only
    nothing_at_hand = {"rollout.beside_read.no_candidate": 1}
    assert h.notes() == {"acq.waits": 1, "lease.no_capacity": 1, **nothing_at_hand}
    assert h.res("r1").key == "k" and h.mapping().resource == "r1"


def test_beside_the_paper_agent_a_lease_at_its_end_no_longer_on_its_item_is_ended() -> None:
    """The item no longer carries our claim (freed, taken): the lease is over on every clock,
    so the mapping is released at once and the key acquires anew."""
    h = Host(legacy=True)
    h.ours("r1", NOW)
    h.free("r1")
    got = resolve_k(h)
    assert isinstance(got, NoCapacity)  # the key acquires anew: nothing at hand
    assert h.writes() == ["map_release"]
    assert h.of(GetItem) == [GetItem(("c", "r1"))]
    nothing_at_hand = {"rollout.beside_read.no_candidate": 1}
    assert h.notes() == {"lease.ended_lapsed": 1, "lease.no_capacity": 1, **nothing_at_hand}
    assert [(s.fn.__name__, s.args) for s in h.of(Spawn)] == [
        ("free_claim", (h.d, ("c", "r1"), "k", "old", Freed.UNRELEASED))
    ]
    h.rounds(WAIT)


# ------------------------------------------------------------------ beside the paper's agent
def test_beside_the_paper_agent_a_new_claim_is_settled_then_served() -> None:
    h = Host(legacy=True)
    h.free("r1")
    h.cands = ["r1"]
    lease, new = resolve_k(h)
    assert (lease.resource, lease.token, new) == ("r1", "t1", True)
    # the mapping write went out beside the first read, the claim once it applied
    assert h.writes() == ["map_acquire", "claim"]
    [first, *_] = h.of(Together)
    assert first.calls[2].write.kind == "map_acquire"
    assert h.of(QueryLeased) == [QueryLeased("c", "p", "k")]  # settling, after the claim
    assert h.notes() == {"lease.new": 1, "rollout.beside_read.applied": 1}
    assert h.of(CachePut) == [CachePut(lease, 1.0)]
    # answered first, then confirmed in the background (dropping the answer if refused)
    [spawn] = h.of(Spawn)
    assert spawn.fn.__name__ == "confirm" and spawn.args == (h.mapping(), True)
    assert h.mapping().state == PENDING and not h.tails
    h.run(spawn.fn(*spawn.args))
    assert h.mapping().state == LIVE


def test_a_new_key_with_a_mapping_elsewhere_costs_its_read_alone() -> None:
    """Rollout mode: a key that has a mapping here refuses the new key's mapping write sent
    beside the first read; the call decides from the read, and the candidate goes back."""
    h = Host(legacy=True)
    h.ours("r1", NOW + HOUR)
    h.free("r2")
    h.cands = ["r2"]
    lease, new = resolve_k(h)
    assert (lease.resource, new) == ("r1", False)
    assert h.writes() == ["map_acquire"] and h.mapping().resource == "r1"
    assert len(h.of(Untake)) == 1 and not h.of(LostCandidate)


def test_a_claim_that_meets_a_paper_lease_yields_to_it() -> None:
    h = Host(legacy=True)
    h.free("r1")
    h.cands = ["r1"]
    h.before["claim"] = lambda: h.paper("r9", NOW + HOUR) and None
    lease, new = resolve_k(h)
    assert (lease.resource, lease.expires_us, new) == ("r9", NOW + HOUR, False)
    assert h.notes()["lease.existing"] == 1 and "lease.new" not in h.notes()
    assert h.of(CachePut) == [CachePut(lease, 1.0)]
    assert h.res("r1").key is None and h.res("r9").holder == lease.token


def test_a_background_confirmation_refused_drops_the_answer() -> None:
    """Rollout mode: the acquisition was answered, then its confirmation refused (another
    daemon settled the pending mapping first): the cached answer is dropped, so the next
    request reads what that daemon decided."""
    h = Host(legacy=True)
    h.free("r1")
    h.cands = ["r1"]
    h.fates["map_confirm"] = ["refused"]
    lease, new = resolve_k(h)
    assert (lease.resource, new) == ("r1", True)
    [spawn] = h.of(Spawn)
    h.run(spawn.fn(*spawn.args))
    assert h.of(CacheDrop) == [CacheDrop(("c", "p", "k"))]


def test_without_a_candidate_at_hand_the_mapping_write_follows_the_read() -> None:
    """Rollout mode, the prefetch buffer empty: the first read goes alone, then the mapping
    write, the claim and the settling read, one after the other (four round trips)."""
    h = Host(legacy=True)
    h.free("r1")
    h.cands = ["r1"]
    h.at_hand = False
    lease, new = resolve_k(h)
    assert (lease.resource, new) == ("r1", True)
    assert h.writes() == ["map_acquire", "claim"]
    assert len(h.of(Together)[0].calls) == 2  # the read alone
    assert [s.fn.__name__ for s in h.of(Spawn)] == ["confirm"]


def test_a_pending_claim_found_beside_the_paper_agent_is_settled_first() -> None:
    h = Host(legacy=True)
    h.ours("r1", NOW + HOUR, state=PENDING, since=NOW - 1)
    h.fates["map_confirm"] = ["refused"]
    lease, new = resolve_k(h)
    assert (lease.resource, new) == ("r1", False)
    assert h.writes() == ["map_confirm", "map_confirm"]
    assert h.notes()["lease.existing"] == 1 and not h.of(Spawn)
    assert h.of(Refresh) == [Refresh(lease, REQ)]
    h.rounds(WAIT)


@pytest.mark.parametrize("lose", [False, True])
def test_a_paper_lease_of_the_key_is_adopted(lose: bool) -> None:
    h = Host(legacy=True)
    h.paper("r9", NOW + HOUR)
    if lose:
        h.fates["map_acquire"] = ["refused"]
    lease, new = resolve_k(h)
    assert (lease.resource, lease.expires_us, new) == ("r9", NOW + HOUR, False)
    assert h.writes() == ["map_acquire"] * lose + ["map_acquire", "adopt", "map_confirm"]
    assert h.of(Together)[0].calls == (QueryMappings("c", "p", "k"), QueryLeased("c", "p", "k"))
    assert h.notes()["lease.adopted"] == 1 and h.notes()["lease.existing"] == 1
    assert h.of(CachePut) == [CachePut(lease, 1.0 + lose)]
    h.rounds(*[WAIT] * lose)


def test_a_mapping_lost_to_another_daemon_serves_its_lease() -> None:
    h = Host()
    h.free("r1")
    h.cands = ["r1"]
    h.before["map_acquire"] = lambda: h.ours("r2", NOW + HOUR, state=PENDING, since=NOW) and None
    lease, new = resolve_k(h)
    assert (lease.resource, new) == ("r2", False)
    assert h.notes() == {"acq.gave_back": 1, "lease.existing": 1}
    h.rounds(WAIT)


# ------------------------------------------------------------------ the steps they share
@pytest.mark.parametrize(
    ("fate", "note", "raises"),
    [
        ("ok", "acq.fenced", None),
        ("refused", "acq.fence_lost", None),  # moved on already: nothing to fence
        ("unsent", "acq.fence_lost", None),  # not sent: the next round reads again
        ("dropped", "acq.fence_lost", Timeout),
    ],
)
def test_fence_bumps_the_version_a_dead_claim_was_conditioned_on(
    fate: str, note: str, raises: type | None
) -> None:
    h = Host()
    r = h.free("r1")
    h.items[("c", "r1")]["version"] = 4
    h.fates["fence_resource"] = [fate]
    try:
        got: Any = h.run(fence(h.res("r1")))
    except RasdError as exc:
        got = exc
    assert (type(got) if raises else got) is raises
    assert h.notes() == {note: 1}
    (send,) = h.of(Send)
    assert send.write.key == r.ident
    assert h.res("r1").version == (5 if fate == "ok" else 4)


def test_reads_split_our_regions_mapping_from_the_others() -> None:
    for legacy in (False, True):
        h = Host(legacy)
        h.ours("w1", NOW + HOUR, region=WEST)
        mine = h.ours("r1", NOW + HOUR)
        h.ours("x1", NOW + HOUR, key="other")
        held = h.paper("r9", NOW + HOUR)
        own, others, leased = h.run(read_first(h.d, POOL, "k"))
        assert own == mine and others == [h.mapping(region=WEST)]
        assert leased == ([h.res("r1"), held, h.res("w1")] if legacy else [])
        assert h.run(read(h.d, POOL, "k")) == (mine, others)
    assert h.run(resource("c", "nothing")) is None
    assert h.run(resource("c", "r9")) == held


@pytest.mark.parametrize("legacy", [False, True])
def test_writes_whose_retry_was_refused_are_read_back_as_applied(legacy: bool) -> None:
    """A retried write refused because its first attempt landed: the item read back carries
    our token (the write's own check), so the acquisition won."""
    h = Host(legacy)
    ev = take(h, "r1")
    h.fates = {"map_acquire": ["retried"], "claim": ["retried"]}
    got = acquire_k(h, ev)
    assert got.resource == "r1" and got.token == "t1"
    assert not h.of(Untake) and bool(h.of(Spawn)) is not legacy  # confirm, or settle
    assert h.notes() == ({} if legacy else {"lease.new": 1})


def test_a_pending_claim_that_meets_a_paper_lease_when_settled_yields_to_it() -> None:
    h = Host(legacy=True)
    h.ours("r1", NOW + HOUR, state=PENDING, since=NOW - 1)
    h.paper("r9", NOW + HOUR)
    lease, new = resolve_k(h)
    assert (lease.resource, new) == ("r9", False)
    assert h.of(QueryLeased) == [QueryLeased("c", "p", "k")]  # the settle's, after the read
    assert h.notes()["lease.yielded"] == 1 and h.notes()["lease.adopted"] == 1
    assert h.res("r1").key is None and h.mapping().resource == "r9"


def test_beside_the_paper_agent_a_key_whose_lease_ended_takes_the_write_beside_the_read() -> None:
    """A key whose lease ended the grace ago (its item still held for it, in the leased index:
    the liberator has not freed it): the mapping write beside the first read applies on the
    lapsed mapping, and its candidate is claimed; no mapping write in between."""
    h = Host(legacy=True)
    h.ours("r1", NOW - RULES.grace_us)
    h.free("r2")
    h.cands = ["r2"]
    lease, new = resolve_k(h)
    assert (lease.resource, new) == ("r2", True)
    assert h.writes() == ["map_acquire", "claim"]
    [first, *_] = h.of(Together)
    assert first.calls[2].write.kind == "map_acquire"
    assert h.mapping().resource == "r2" and h.mapping().ver == 3  # the lapsed one's + 1
    assert h.notes() == {"lease.new": 1, "rollout.beside_read.applied": 1}
    assert not h.tails  # one round

"""Beside the paper's agent, a lease of rasd ends where the paper's agent sees it end.

Two ways rasd made a lease run again after that agent took it as over (docs/design.md,
"Beside the paper's agent"):

* an extension that lands after the lease's end (sent 130 ms before it, applied 12 ms after):
  the extension is conditioned on an end past ``legacy.extend_floor`` as it is sent, and a
  lease that ends by then is not extended;
* a ``holder`` the paper's writes left stale (its liberator freed our lease, its agent leased
  the item again to the same key) taken for our claim: the item is extended, served and
  given back as ours, and our mapping names the paper's lease (a live mapping whose item's
  holder is not current). Every decision and the extension's write check
  ``holder_current``.

Pure decisions on items and time, and the daemon's programs on a scripted table.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rasd.config import Config
from rasd.core import decide
from rasd.core import legacy as legacy_rules
from rasd.core.builders import (
    adopt,
    claim,
    extend_resource,
    new_resource_item,
    paper_claim,
    paper_free,
)
from rasd.core.decide import Outcome, lease_from_mapping
from rasd.core.errors import RasdError
from rasd.core.lease import LIVE, US, Mapping, Pool, ResourceItem, fmt_time, map_pk
from rasd.core.map_builders import extended_to, map_acquire, map_confirm
from rasd.core.serialize import mapping_from, resource_from
from rasd.core.writes import ItemKey, Value, Write, apply, item_from_av
from rasd.steps import (
    GetItem,
    Join,
    Mono,
    Note,
    Now,
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
)
from rasd.steps.give_back import free_claim
from rasd.steps.renew import extend_bg
from rasd.steps.take import resolve

NOW = 1_700_000_000 * US
MS = 1_000
HOUR = 3600 * US
EAST = "us-east-1"
POOL = Pool("c", "p", 24 * HOUR)
#: the production rules: margin 5 s, clock-skew bound 2 s, extension margin 2 s
RULES = Config().rules()
REQ = NOW + HOUR
Item = dict[str, Value]


class World:
    """One daemon's view of a table: plain items by key, its clock (moved by its waits),
    every effect seen; spawned programs are kept, not run."""

    def __init__(self, legacy: bool = True) -> None:
        self.d = DaemonContext(EAST, "d1", RULES, legacy_agents=legacy)
        self.items: dict[ItemKey, Item] = {}
        self.now = NOW
        self.seen: list[Any] = []
        self.counts: Counter[str] = Counter()
        self.tokens = 0
        self.rounds = 0
        #: write kind -> hook run just before that write lands (once)
        self.before: dict[str, Any] = {}

    def run(self, prog: Any) -> Any:
        result: Any = None
        error: RasdError | None = None
        while True:
            try:
                eff = prog.send(result) if error is None else prog.throw(error)
            except StopIteration as stop:
                return stop.value
            if isinstance(eff, Tail):
                self.rounds += 1
                assert self.rounds < 100, "a call that never ends"
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
            return 1.0
        if isinstance(eff, Sleep):
            self.now += int(eff.seconds * US)
            return None
        if isinstance(eff, RateLimit):
            return 0.0
        if isinstance(eff, TakeCandidate):
            return None  # nothing free: an acquisition here can only adopt
        if isinstance(eff, NewToken):
            self.tokens += 1
            return f"t{self.tokens}"
        if isinstance(eff, Together):
            return tuple(self.perform(c) for c in eff.calls)
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
                if k[0] == eff.client_id and v.get("key") == eff.key
            ]
        if isinstance(eff, Send):
            hook = self.before.pop(eff.write.kind, None)
            if hook is not None:
                hook()
            return self.land(eff.write)
        local = (CachePut, CacheDrop, Refresh, Spawn, RefillSoon, Untake, LostCandidate, Miss)
        if isinstance(eff, (*local, Deadline, RelistLater, Join)):
            return None
        raise AssertionError(eff)

    def land(self, w: Write) -> WriteResult:
        new = apply(self.items.get(w.key), w)
        if new is None:
            return WriteResult(Outcome.REJECTED)
        self.items[w.key] = new
        return WriteResult(Outcome.APPLIED, dict(new))

    def writes(self) -> list[str]:
        return [e.write.kind for e in self.seen if isinstance(e, Send)] + [
            c.write.kind
            for e in self.seen
            if isinstance(e, Together)
            for c in e.calls
            if isinstance(c, Send)
        ]

    # ------------------------------------------------------------------ the table
    def res(self, name: str) -> ResourceItem:
        return resource_from(self.items[("c", name)])

    def mapping(self, key: str = "k") -> Mapping:
        return mapping_from(self.items[(map_pk("c", "p", key), EAST)])

    def free(self, name: str) -> ResourceItem:
        self.items[("c", name)] = item_from_av(new_resource_item("c", "p", EAST, name, NOW - HOUR))
        return self.res(name)

    def ours(self, name: str, end: int, token: str = "t0", key: str = "k") -> Mapping:
        """A live lease of rasd: the item claimed by ``token``, the mapping naming it."""
        r = self.free(name)
        mid = (map_pk("c", "p", key), EAST)
        assert self.land(map_acquire(mid, 0, token, name, r.version, end, NOW - HOUR, "d0"))
        assert self.land(claim(r, key, end, NOW - HOUR, token, 1)).outcome is Outcome.APPLIED
        assert self.land(map_confirm(self.mapping(key))).outcome is Outcome.APPLIED
        return self.mapping(key)

    def paper(self, name: str, end: int, key: str = "k") -> ResourceItem:
        """A lease of the paper's agent: claimed for ``key``, no mapping, no holder."""
        assert self.land(paper_claim(self.free(name), key, end)).outcome is Outcome.APPLIED
        return self.res(name)

    def freed_and_leased_again(self, name: str, end: int, key: str = "k") -> ResourceItem:
        """The paper's liberator frees ``name`` (past its end), then its agent leases it to
        ``key`` until ``end``: rasd's ``holder`` stays on the item, stale."""
        assert self.land(paper_free(self.res(name), self.now)).outcome is Outcome.APPLIED
        assert self.land(paper_claim(self.res(name), key, end)).outcome is Outcome.APPLIED
        return self.res(name)


def resolve_k(w: World) -> Any:
    try:
        return w.run(resolve(w.d, POOL, "k", REQ, 0.02))
    except RasdError as exc:
        return exc


def stale_item(end: int, paper_end: int) -> tuple[Mapping, ResourceItem, ResourceItem]:
    """rasd's lease of k on r1 (token t0) until ``end``; the paper's liberator frees it and its
    agent leases r1 to k again until ``paper_end``. (mapping, rasd's item, the paper's)."""
    w = World()
    m = w.ours("r1", end)
    mine = w.res("r1")
    return m, mine, w.freed_and_leased_again("r1", paper_end)


# ------------------------------------------------------- a holder the paper left stale
def test_a_holder_the_papers_writes_left_stale_is_not_our_claim() -> None:
    """The item carries k and our token, but the paper's agent leased it since: neither a
    lapsed lease to extend (``on_lapsed``) nor a pending claim that landed
    (``claim_landed``)."""
    m, mine, theirs = stale_item(NOW, NOW + HOUR)
    assert (theirs.key, theirs.holder) == ("k", "t0") and not theirs.holder_current
    now = NOW + US  # within the grace: on_read says Extend
    assert isinstance(decide.on_read(m, [], now, RULES), decide.Extend)
    assert legacy_rules.on_lapsed(m, theirs, now, RULES.grace_us, RULES.extend_margin_us) == (
        legacy_rules.EndLapsed(m)
    )
    assert isinstance(legacy_rules.on_lapsed(m, mine, now - 3 * US, RULES.grace_us), decide.Extend)
    pending = Mapping("c", "p", "k", EAST, 1, "pending", "t0", "r1", mine.version - 1, NOW)
    assert decide.claim_landed(pending, mine) and not decide.claim_landed(pending, theirs)
    # past the pending hold, the claim can never land: the mapping is taken over
    assert decide.on_resource(pending, theirs, NOW + HOUR, RULES) == decide.Acquire(1)


def test_the_extension_beside_the_paper_agent_refuses_a_stale_holder() -> None:
    """The write's own condition, for an extension decided before the paper's writes (or
    sent from the cache): ``hver`` must equal ``version`` (or be absent, as written before
    it existed)."""
    _m, mine, theirs = stale_item(NOW + HOUR, NOW + 2 * HOUR)
    lease = decide.lease_from_item(mine)
    w = extend_resource(lease, NOW + 3 * HOUR, legacy_rules.extend_floor(NOW, RULES))
    item = {k: v for k, v in (("hver", theirs.hver), ("version", theirs.version)) if v}
    assert item["hver"] != item["version"]
    stale = _item(theirs)
    assert apply(stale, w) is None
    assert apply(_item(mine), w) is not None
    legacy = dict(_item(mine))
    del legacy["hver"]  # an item written before ``hver``: its holder is current
    assert apply(legacy, w) is not None


def test_a_read_back_does_not_take_a_stale_holder_for_our_extension() -> None:
    """An extension whose reply was lost is read back: the paper's lease of the same key
    under our stale token, ending later than asked, is not our extension."""
    _m, _mine, theirs = stale_item(NOW + HOUR, NOW + 3 * HOUR)
    want = fmt_time(NOW + 2 * HOUR)
    assert not extended_to("t0", want)(_item(theirs))
    ours = {**_item(theirs), "hver": theirs.version}
    assert extended_to("t0", want)(ours)


def _item(r: ResourceItem) -> Item:
    out: Item = {
        "client_id": r.client_id,
        "resource": r.resource,
        "region": r.region,
        "version": r.version,
    }
    for k, v in (("key", r.key), ("holder", r.holder), ("hver", r.hver)):
        if v is not None:
            out[k] = v
    if r.lease_expires_us is not None:
        out["lease_expires"] = fmt_time(r.lease_expires_us)
    return out


def test_a_lapsed_lease_whose_item_the_paper_leased_again_is_ended_and_adopted() -> None:
    """The table chaos found (a live mapping naming an item whose holder is not current):
    rasd's lease of k on r1 ended; the paper's liberator freed r1 and its agent leased it to
    k again. A daemon asked for k within the grace must not extend that lease as its own: it
    ends its mapping and adopts the paper's lease, with a token of its own on the item."""
    w = World()
    w.ours("r1", NOW)
    w.now = NOW + 3 * US
    w.freed_and_leased_again("r1", NOW + HOUR)
    w.now = NOW + US  # this host's clock: within the grace of the mapping's end
    lease, new = resolve_k(w)
    assert (lease.resource, new) == ("r1", False)
    assert lease.token != "t0" and lease.expires_us == REQ
    m, r = w.mapping(), w.res("r1")
    assert (m.state, m.token, m.resource) == (LIVE, lease.token, "r1")
    assert r.holder == lease.token and r.holder_current and r.lease_expires_us == REQ
    assert w.counts["lease.ended_lapsed"] == 1 and w.counts["lease.adopted"] == 1
    assert w.writes()[:1] == ["map_release"]


def test_a_give_back_leaves_the_papers_lease_under_a_stale_holder_alone() -> None:
    """A free of our claim (held to its end beside the paper's agent) reads the item: a
    stale holder is the paper's lease, not ours to free."""
    w = World()
    w.ours("r1", NOW)
    w.now = NOW + 3 * US
    theirs = w.freed_and_leased_again("r1", NOW + HOUR)
    w.run(free_claim(w.d, ("c", "r1"), "k", "t0", decide.Freed.UNRELEASED))
    assert w.writes() == [] and w.res("r1") == theirs


# ------------------------------------------------------ an extension past the lease's end
def test_the_extension_floor_is_the_clock_skew_bound_after_now() -> None:
    assert RULES.extend_margin_us == RULES.grace_us == 2 * US
    assert legacy_rules.extend_floor(NOW, RULES) == NOW + 2 * US


def test_an_extension_sent_130_ms_before_the_end_cannot_land_after_it() -> None:
    """The chaos run's extension: sent 130 ms before the lease's end, it applied 12 ms after
    it, making the lease run again beside the paper's. Beside the paper's agent the write
    is conditioned on an end past the floor as it is sent, so it applies nowhere near the
    end, whenever it lands; without the floor (no paper's agent) it is unchanged."""
    w = World()
    m = w.ours("r1", NOW)
    item = w.items[("c", "r1")]
    lease = lease_from_mapping(m)
    sent = NOW - 130 * MS
    assert apply(item, extend_resource(lease, REQ, legacy_rules.extend_floor(sent, RULES))) is None
    assert apply(item, extend_resource(lease, REQ)) is not None
    early = NOW - 2 * US - 1
    assert (
        apply(item, extend_resource(lease, REQ, legacy_rules.extend_floor(early, RULES)))
        is not None
    )


def test_on_lapsed_extends_only_past_the_floor_and_ends_only_past_every_clock() -> None:
    w = World()
    m = w.ours("r1", NOW)
    r = w.res("r1")
    g, margin = RULES.grace_us, RULES.extend_margin_us

    def at(now: int) -> object:
        return legacy_rules.on_lapsed(m, r, now, g, margin)

    assert isinstance(at(NOW - 2 * US - 1), decide.Extend)
    assert isinstance(at(NOW - 2 * US), decide.Wait)  # ends within the floor: not extended
    assert isinstance(at(NOW - 130 * MS), decide.Wait)
    assert isinstance(at(NOW + US), decide.Wait)  # past it here, not on every clock
    assert at(NOW + 2 * US) == legacy_rules.EndLapsed(m)


def test_two_paper_leases_of_a_key_the_one_adopted_ends_and_is_not_extended() -> None:
    """CHANGELOG's reproduction: two paper agents split k (r1 until NOW, r2 for an hour);
    rasd adopted r1. Asked for k 130 ms before r1's end, the daemon does not extend r1 (the
    extension could land past the end, beside r2): it waits until r1's end has passed on
    every clock, then takes it as lapsed and adopts r2 (r1 is the liberator's). With the
    extension's old condition it extended r1 and answered it beside r2."""
    w = World()
    w.paper("r1", NOW)
    w.paper("r2", NOW + HOUR)
    r1 = w.res("r1")
    mid = (map_pk("c", "p", "k"), EAST)
    assert w.land(map_acquire(mid, 0, "t0", "r1", r1.version, NOW, NOW - HOUR, "d0"))
    assert w.land(adopt(r1, "t0", 1, NOW - HOUR)).outcome is Outcome.APPLIED
    assert w.land(map_confirm(w.mapping())).outcome is Outcome.APPLIED
    w.now = NOW - 130 * MS
    lease, new = resolve_k(w)
    assert "extend_resource" not in w.writes()
    assert w.res("r1").lease_expires_us == NOW
    assert (lease.resource, new) == ("r2", False)
    assert w.now >= NOW + RULES.grace_us  # waited until r1's end passed on every clock
    assert w.counts["lease.adopted"] == 1 and w.mapping().resource == "r2"


def test_a_background_extension_near_the_end_is_refused_and_forgotten() -> None:
    """An extension from a cache hit may be sent again until its program's deadline
    (``BACKGROUND_DEADLINE``): its floor lies that much further. Within it the write is
    refused by its condition and the cached answer dropped (the next request reads the
    truth); without the paper's agent it applies."""
    for legacy, applied in ((True, False), (False, True)):
        w = World(legacy)
        m = w.ours("r1", NOW + 6 * US)  # past the clock-skew bound, within it + 5 s
        assert w.run(extend_bg(w.d, lease_from_mapping(m), REQ)) is None
        assert w.writes()[0] == "extend_resource"
        assert (w.res("r1").lease_expires_us == REQ) is applied
        assert any(isinstance(e, CacheDrop) for e in w.seen) is not applied
    w = World()
    m = w.ours("r1", NOW + 8 * US)
    assert w.run(extend_bg(w.d, lease_from_mapping(m), REQ)) is None
    assert w.res("r1").lease_expires_us == REQ and w.counts["lease.extended"] == 1


def test_a_request_asking_no_more_than_the_lease_has_is_served_near_its_end() -> None:
    """Within the floor nothing is extended, but a request that asks for no more than the
    lease has is answered with it, as before."""
    w = World()
    w.ours("r1", NOW + US)
    lease, _ = w.run(resolve(w.d, POOL, "k", NOW + US, 0.02))
    assert (lease.resource, lease.expires_us) == ("r1", NOW + US) and w.writes() == []


def test_without_the_paper_agent_a_lease_near_its_end_is_extended_as_before() -> None:
    w = World(legacy=False)
    w.ours("r1", NOW + 130 * MS)
    lease, _ = resolve_k(w)
    assert lease.expires_us == REQ and w.writes() == ["extend_resource", "map_extend"]

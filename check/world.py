"""The model's state: one DynamoDB table, the daemons' local state, the jobs' bookkeeping and
the answers apps hold, as one :class:`World` value; and its configuration (:class:`Config`).
It imports none of the modules that step it. docs/checker.md, "What is modeled".
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from dataclasses import replace as _dc_replace
from typing import TypeVar

from rasd.core.decide import Rules
from rasd.core.lease import (
    LIVE,
    META_CLIENT,
    US,
    Lease,
    Mapping,
    Pool,
    ResourceItem,
    fmt_time,
    map_pk,
    parse_time,
    partition_name,
    partition_of,
)
from rasd.core.serialize import is_tombstone, mapping_from, resource_from
from rasd.core.writes import ItemKey, Value, Write, apply
from rasd.steps import daemon as daemon_steps

from .procs import Proc
from .rulesets import Protocol, ops_of

CLIENT, POOL, REGION = "c", "p", "r1"
T0 = 1_700_000_000  # seconds since the epoch at tick 0
#: the model's one pool (its lease bound never refuses a request)
POOL_ = Pool(CLIENT, POOL, 10**12)
Item = dict[str, Value]
FrozenItem = tuple[tuple[str, Value], ...]
_T = TypeVar("_T")


#: every kind of fault the model injects (``Config.faults``)
FAULTS = ("unsent", "in_flight", "reply_lost", "delayed_retry", "read_back_later", "read_failed")


@dataclass(frozen=True)
class Config:
    """One configuration to explore. Times in ticks (seconds)."""

    daemons: int = 2
    keys: tuple[str, ...] = ("k1", "k2")
    resources: tuple[str, ...] = ("ra", "rb", "rc")
    #: clock offset of each daemon (ticks); any two hosts differ by at most ``skew``
    offsets: tuple[int, ...] = (0, 1, 0, 1, 0, 1)
    liberator_offset: int = 1
    skew: int = 1
    margin: int = 1
    pending_hold: int = 2
    confirm: int = 3  # S
    lag: int = 1  # replication lag term of the quarantine (config.quarantine)
    lease: int = 12  # every get_lease asks for now + lease (longer than Q, as in production)
    #: the pool's outage budget (0: none): a daemon may serve a cached answer this long
    #: after its last confirmation, at any step, as if cut off from DynamoDB (the model's
    #: strongest partition: it never needs its calls to fail first); the pool's quarantine
    #: is then budget + skew + lag, as rasadmin add-pool requires
    budget: int = 0
    #: the daemons publish their caches in a hit table (``hit_table``): another worker of a
    #: host reads it at any step, while its daemon has a request in flight too
    hit_table: bool = False
    extend_fraction: float = 0.5
    #: the daemons' ``extend_read_first``: a background extension reads the key's mappings
    #: first and writes nothing when another daemon already extended the lease far enough
    extend_read_first: bool = True
    horizon: int = 16  # no tick past this true time
    deadline: int = 1  # a request fails with TIMEOUT once this many ticks have passed
    max_calls: int = 8  # ... or once it has made this many DynamoDB calls (time stands still)
    ticks: tuple[int, ...] = (1, 3)
    max_faults: int = 2  # lost requests/replies, delayed writes, read errors
    max_crashes: int = 1
    max_ops: int = 4  # app calls (get_lease / release) in one run
    history: int = 2  # earlier versions of each resource item the lagging index may return
    free_claim_attempts: int = 2  # the driver tries 6; 2 already covers "retried after error"
    liberator: bool = True
    release: bool = True
    #: region of each daemon (empty: all in ``r1``); a daemon writes only its region's items
    regions: tuple[str, ...] = ()
    #: region of each resource (empty: all in ``r1``)
    resource_regions: tuple[str, ...] = ()
    #: the lease length each daemon's apps ask for (empty: ``lease`` for all)
    leases: tuple[int, ...] = ()
    #: replication lag: a daemon may read another region's mapping at any of this many
    #: earlier versions (0: the current one), written less than ``lag`` ticks ago (a tick of
    #: at least ``lag`` lets every replica catch up)
    replica_history: int = 0
    #: runs of ``ras-dedupe`` (``rasd.steps.dedupe``), one at a time, each a process
    dedupe_runs: int = 0
    dedupe_offset: int = 1
    #: runs of the liberator's orphan repair (``rasd.steps.repair.check_orphan``), each a
    #: process; a held item is checked once acquired ``orphan_age`` ago
    repair_runs: int = 0
    orphan_age: int = 2
    #: get_lease calls of the paper's in-process agent (bench/baseline.py, paper=True) for
    #: ``paper_key``, one at a time: the leased index (lagging) by key, else a candidate from
    #: the available index (lagging, any ``lease_available``) and a claim on its version alone
    paper_calls: int = 0
    paper_key: str = "kp"
    paper_offset: int = 1
    #: the paper's liberator (bench/baseline.py paper_liberate): frees every lease past its
    #: end on its clock (no grace) read from the lagging index, on the version read alone
    paper_liberator: bool = False
    #: how long past a lease's end the paper's liberator waits (docs/operations.md asks for
    #: at least the clock-skew bound: with none, a clock ahead by the skew frees a lease that
    #: early, which this checker found)
    paper_grace: int = 1
    #: the daemons run with ``legacy_agents`` (the leased index read with the mapping, the
    #: paper's leases adopted, a won claim settled before it is served, a lapsed lease ended
    #: rather than extended), each with an owner name of its own
    legacy_agents: bool = False
    #: rasadmin's commands the model runs (``check.admin``), one at a time, at most
    #: ``admin_runs`` in all: "delete" (delete-resource), "force" (delete-resource --force),
    #: "add" (add-resources of a deleted name: its re-add), "pool" (add-pool redefining the
    #: longest lease to each of ``pool_leases``), "adopt" (rasadmin adopt of a running lease),
    #: "release" (release-resource of a held item)
    admin: tuple[str, ...] = ()
    #: the table's rollout record changes once, at any step (``rasadmin end-rollout`` when the
    #: run starts in rollout mode, ``rasadmin adopt`` otherwise); each daemon follows it at a
    #: step of its own (its pool refresh), and every program it started before keeps the mode
    #: it started with. ``end-rollout`` is refused while an item holds a lease of the paper's
    #: agent, whose calls stop once it applied; after ``adopt`` the paper's agent calls only
    #: once every daemon follows it and no program of the old mode still runs (the bound
    #: ``rasadmin adopt`` prints)
    rollout_switch: bool = False
    admin_runs: int = 0
    admin_offset: int = 1
    #: the pool's longest lease as first defined (ticks; 0: no definition in the table, the
    #: daemons' pool never refuses) and what ``rasadmin add-pool`` may redefine it to
    pool_lease: int = 0
    pool_leases: tuple[int, ...] = ()
    #: the balancer's moves (``rasd.steps.admin.move_free``), one at a time: a free item of
    #: another region, from that region's lagging available index, moved to
    #: ``balancer_region``, where the balancer runs
    balancer_moves: int = 0
    balancer_region: str = "r2"
    #: a strict pool (docs/global.md, "Strict pools"): its home region ("": a normal pool).
    #: A key then holds one resource at a time across regions too (I2 across regions), but
    #: for a lease answered unagreed by the home-down fallback
    strict_home: str = ""
    #: the daemons' ``strict_home_down``: "fail" or "local"
    home_down: str = "fail"
    #: the kinds of fault the run may inject (each costs one of ``max_faults``; crashes are
    #: ``max_crashes``', replication lag ``replica_history``'s): a write "unsent" (refused
    #: before it could apply: a throttle, a connection refused), "in_flight" (its request
    #: or reply lost, a timeout: it lands at any later step, or never), "reply_lost" (it
    #: applied, the retry is refused, read back at once), "delayed_retry" (the retry is
    #: refused while the first attempt is still in flight, read back), "read_back_later"
    #: (it applied, the reply was lost, read back at a later step of its own), and a read
    #: "read_failed". The searches leave out "read_back_later" unless they ask for it (it
    #: multiplies every exhaustive search's states); the swarm draws from all of them
    faults: tuple[str, ...] = tuple(f for f in FAULTS if f != "read_back_later")

    def region(self, daemon: int) -> str:
        return self.regions[daemon] if self.regions else REGION

    def res_region(self, res: str) -> str:
        if not self.resource_regions:
            return REGION
        return self.resource_regions[self.resources.index(res)]

    @property
    def all_regions(self) -> tuple[str, ...]:
        return tuple(sorted({*self.regions, *self.resource_regions})) or (REGION,)

    @property
    def makers(self) -> bool:
        """Is the paper's agent in the run (who made each lease is then tracked)?"""
        return self.legacy_agents or self.paper_calls > 0

    def lease_of(self, daemon: int) -> int:
        return self.leases[daemon] if self.leases else self.lease

    @property
    def quarantine(self) -> int:
        return self.confirm + self.skew + self.lag  # config.quarantine

    @property
    def pool_quarantine(self) -> int:
        """The pool's own quarantine of a released lease (0: the daemons' Q)."""
        return self.budget + self.skew + self.lag if self.budget else 0

    def rules(self) -> Rules:
        return Rules(
            margin_us=self.margin * US,
            grace_us=self.skew * US,
            pending_hold_us=self.pending_hold * US,
            quarantine_us=self.quarantine * US,
            confirm_us=self.confirm * US,
        )


@dataclass(frozen=True)
class Entry:
    lease: Lease
    confirmed: int  # true tick (monotonic clock)
    until: float  # true time from which the cache no longer serves it (cache_rules.serves)
    #: true time until which it answers while DynamoDB cannot be reached (the pool's outage
    #: window, ``decide.outage_window_us``; ``until`` when the pool has no budget)
    spare: float = 0.0


@dataclass(frozen=True)
class DaemonState:
    idx: int
    offset: int
    req: Proc | None = None
    bg: tuple[Proc, ...] = ()
    cache: tuple[tuple[str, Entry], ...] = ()
    refreshing: frozenset[str] = frozenset()

    def entry(self, key: str) -> Entry | None:
        return next((e for k, e in self.cache if k == key), None)

    def with_entry(self, key: str, e: Entry | None) -> DaemonState:
        rest = tuple((k, x) for k, x in self.cache if k != key)
        if e is not None:
            rest = tuple(sorted((*rest, (key, e)), key=lambda kv: kv[0]))
        return replace(self, cache=rest)


@dataclass(frozen=True)
class Answer:
    key: str
    resource: str
    exp: int  # us
    token: str
    at: int = 0  # true us when it was given
    #: the region of the lease it answered (whose mapping names it): I2 holds per region,
    #: and a resource the balancer moved is another region's from then on
    region: str = ""


@dataclass(frozen=True)
class Violation:
    name: str
    detail: str


def replace(obj: _T, **kw: object) -> _T:
    """``dataclasses.replace`` for the model's own (dict-backed, frozen) dataclasses, fast."""
    if not hasattr(obj, "__dict__"):
        return _dc_replace(obj, **kw)  # type: ignore[type-var]
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(kw)
    return new


@functools.lru_cache(maxsize=200_000)
def _res_of(f: FrozenItem) -> ResourceItem | None:
    """The resource item ``f`` is (None: a deleted name's tombstone, no resource)."""
    it = dict(f)
    return None if is_tombstone(it) else resource_from(it)


@functools.lru_cache(maxsize=200_000)
def _map_of(f: FrozenItem) -> Mapping:
    return mapping_from(dict(f))


def freeze(it: Item | None) -> FrozenItem | None:
    return None if it is None else tuple(sorted(it.items()))


SWEEP_NOT_BEGUN, SWEEP_RUNNING, SWEEP_SETTLED, SWEEP_UNSETTLED = range(4)


def mkey(key: str, region: str = REGION) -> ItemKey:
    return (map_pk(CLIENT, POOL, key), region)


def rkey(res: str) -> ItemKey:
    return (CLIENT, res)


# ----------------------------------------------------------------------------- the world
def _one_lease(
    a: Answer,
    b: Answer,
    made_of: tuple[tuple[str, int, str], ...] = (),
    lagged: frozenset[str] = frozenset(),
) -> bool:
    """Is ``b`` an answer of the lease ``a`` answers (so that ``a``'s validity runs from the
    lease's first answer)? The same token; or two answers of the paper's agent (which names
    each answer, having no token) of one key, resource and end: it never extends, so that is
    the lease it made, answered again from its index; or ``a`` the paper's agent's answer
    from an index that lagged the free of its item (``lagged``) and ``b`` of the same key
    and resource, made by one claim (``made_of``): a lease rasd adopted keeps its claim,
    resource and end, and that answer is a stale copy of it, as a cache's is. Not an answer
    from an index that still shows the item held, after a release whose free has not landed
    (docs/design.md, "Not covered" (3)); nor the other way round: rasd's adoption after a
    release of the key is a lease of its own."""
    if a.token == b.token:
        return True
    if (a.key, a.resource) != (b.key, b.resource) or not a.token.startswith("paper"):
        return False
    if b.token.startswith("paper") and a.exp == b.exp:
        return True
    if a.token not in lagged:
        return False
    ma = next((m for m in made_of if m[0] == a.token), None)
    mb = next((m for m in made_of if m[0] == b.token), None)
    return ma is not None and mb is not None and ma[1] == mb[1]


_TOKEN = re.compile(r"\bt\d+\b")


def _tokens_of(procs: tuple[Proc | None, ...]) -> frozenset[str]:
    """Every token the processes' arguments and results name (the model's are ``t<n>``)."""
    return frozenset(_TOKEN.findall(repr([(p.trace.args, p.trace.sent) for p in procs if p])))


class World:
    """A mutable working copy of one global state; :meth:`key` is its canonical hash key."""

    __slots__ = (
        "admin",
        "adopt_sweep",
        "answers",
        "cfg",
        "crash_tokens",
        "crashes",
        "daemons",
        "dedupe_done",
        "ended",
        "fallbacks",
        "faults",
        "hist",
        "inflight",
        "inv_q",
        "jobs",
        "lagged",
        "made",
        "made_of",
        "notes",
        "ops",
        "paper",
        "proto",
        "read_claims",
        "release_calls",
        "released",
        "repair_done",
        "rollout",
        "rollout_mark",
        "rules",
        "setups",
        "t",
        "table",
        "tokens",
        "unsettled",
        "violation",
    )

    def __init__(self, cfg: Config, proto: Protocol) -> None:
        self.cfg = cfg
        self.proto = proto
        self.rules = proto.rules(cfg.rules())
        # the invariants' Q: the real rules', always (the pool's own for a released lease)
        self.inv_q = max(cfg.rules().quarantine_us, cfg.pool_quarantine * US)
        self.t = 0
        self.table: dict[ItemKey, FrozenItem] = {}
        self.hist: dict[ItemKey, tuple[FrozenItem, ...]] = {}
        for r in cfg.resources:
            self.table[rkey(r)] = freeze(
                {
                    "client_id": CLIENT,
                    "resource": r,
                    "pool_id": POOL,
                    "region": cfg.res_region(r),
                    "partition": partition_name(CLIENT, POOL, cfg.res_region(r), partition_of(r)),
                    "lease_available": fmt_time(T0 * US),
                    "version": 0,
                }
            )  # type: ignore[assignment]
            self.hist[rkey(r)] = ()
        self.daemons = tuple(DaemonState(i, cfg.offsets[i]) for i in range(cfg.daemons))
        #: each daemon as its programs see it (rasd.steps.daemon.DaemonContext)
        self.setups = tuple(
            daemon_steps.DaemonContext(
                cfg.region(i),
                f"d{i}" if cfg.legacy_agents or cfg.rollout_switch else "owner",
                self.rules,
                legacy_agents=cfg.legacy_agents,
                free_claim_attempts=cfg.free_claim_attempts,
                ops=ops_of(proto),
                homes=((CLIENT, POOL, cfg.strict_home),) if cfg.strict_home else (),
                home_down=cfg.home_down,
                extend_read_first=cfg.extend_read_first,
                extend_fraction=cfg.extend_fraction,
            )
            for i in range(cfg.daemons)
        )
        #: (the record changed, which daemons follow it)
        self.rollout: tuple[bool, tuple[bool, ...]] = (False, (False,) * cfg.daemons)
        #: ``end-rollout``'s mark on the record: it turns it off no earlier (rasadmin's clock)
        self.rollout_mark: int | None = None
        #: ``rasadmin adopt``'s sweep of the fast rules' leftovers: not begun, running, ended
        #: with every leftover settled, or not (then the paper's agent never calls)
        self.adopt_sweep = SWEEP_NOT_BEGUN
        self.inflight: tuple[Write, ...] = ()
        self.answers: frozenset[Answer] = frozenset()
        self.released: tuple[tuple[str, int], ...] = ()  # (token, true us)
        #: leases the operator ended (rasadmin release-resource, delete-resource --force) as
        #: their mapping's release went out: for I2 only (apps may use them to their end, I1)
        self.ended: tuple[tuple[str, int], ...] = ()  # (token, true us)
        self.release_calls: tuple[tuple[str, int], ...] = ()  # (key, true us of the call)
        self.faults = 0
        #: tokens of leases answered unagreed (a strict pool's home-down fallback)
        self.fallbacks: frozenset[str] = frozenset()
        #: answers of the paper's agent that read a claim of rasd's no live mapping names
        #: (before its settling yields it, or through the index's lag after): the window
        #: docs/design.md leaves open beside that agent ("Not covered" (1)), exempt from I2;
        #: not a claim left on its item that no process will give back (``abandoned``)
        self.unsettled: frozenset[str] = frozenset()
        #: answers of the paper's agent of a released lease: read from a leased index that
        #: lagged the write that took the key off the item (a free, a liberation), or while
        #: the release's free was still under way: stale copies (``_one_lease``)
        self.lagged: frozenset[str] = frozenset()
        #: (answer of the paper's agent, the token of rasd's claim on the item it read): a
        #: stale answer (``lagged``) of a claim released or ended is of that released lease
        self.read_claims: tuple[tuple[str, str], ...] = ()
        #: tokens the processes of a crashed daemon held: claims a crash may leave given back
        #: by no one (docs/design.md, "Not covered" (2))
        self.crash_tokens: frozenset[str] = frozenset()
        self.crashes = 0
        self.ops = 0
        self.tokens = 0
        self.violation: Violation | None = None
        self.notes: list[str] = []
        #: the job processes (check.jobs): ras-dedupe, orphan checks, the paper's agent
        self.jobs: tuple[Proc, ...] = ()
        self.dedupe_done = 0
        self.repair_done = 0
        #: get_lease calls the paper's agent has started
        self.paper = 0
        #: rasadmin commands and balancer moves started
        self.admin = (0, 0)
        #: with ``legacy_agents``: each resource's latest claim, (resource, order, maker:
        #: "rasd" or "paper"; order: 1 for the run's first claim, then 2...), and each
        #: answered token's lease as made, (token, order, maker)
        self.made: tuple[tuple[str, int, str], ...] = ()
        self.made_of: tuple[tuple[str, int, str], ...] = ()
        if cfg.pool_lease:
            from rasd.steps.admin import pool_key

            self.table[pool_key(CLIENT, POOL)] = freeze(
                {"client_id": META_CLIENT, "resource": pool_key(CLIENT, POOL)[1],
                 "kind": "pool", "max_lease": str(float(cfg.pool_lease))}
            )  # type: ignore[assignment]  # fmt: skip

    def clone(self) -> World:
        w = World.__new__(World)
        for s in World.__slots__:
            setattr(w, s, getattr(self, s))
        w.table = dict(self.table)
        w.hist = dict(self.hist)
        w.notes = []
        return w

    def key(self) -> tuple[object, ...]:
        return (
            self.t,
            tuple(sorted(self.table.items())),
            tuple(sorted(self.hist.items())),
            self.daemons,
            tuple(sorted(self.inflight, key=repr)),
            tuple(sorted((a.key, a.resource, a.exp, a.token) for a in self.answers)),
            self.released,
            self.ended,
            self.release_calls,
            self.faults,
            self.fallbacks,
            self.unsettled,
            self.lagged,
            self.read_claims,
            self.crash_tokens,
            self.crashes,
            self.ops,
            self.tokens,
            self.jobs,
            self.dedupe_done,
            self.repair_done,
            self.paper,
            self.admin,
            self.made,
            self.made_of,
            self.rollout,
            self.rollout_mark,
            self.adopt_sweep,
        )

    # --------------------------------------------------------------------- clocks
    def true_us(self) -> int:
        return (T0 + self.t) * US

    def now_us(self, offset: int) -> int:
        return (T0 + self.t + offset) * US

    # ---------------------------------------------------------------------- table
    def get(self, k: ItemKey) -> Item | None:
        f = self.table.get(k)
        return None if f is None else dict(f)

    def put(self, k: ItemKey, it: Item) -> None:
        old = self.table.get(k)
        if k[0] == CLIENT and old is not None:
            h = (old, *self.hist.get(k, ()))
            self.hist[k] = tuple(dict.fromkeys(h))[: self.cfg.history]
        elif k[0] != CLIENT and k[0] != META_CLIENT and self.cfg.replica_history:
            # another region's replica may still show an earlier version (replication lag)
            h = (old or (), *self.hist.get(k, ()))  # (): the item did not exist yet
            self.hist[k] = tuple(dict.fromkeys(h))[: self.cfg.replica_history]
        self.table[k] = freeze(it)  # type: ignore[assignment]

    def replicas(self, key: str, region: str) -> list[tuple[str, list[Mapping]]]:
        """The other regions' mappings of ``key`` as a daemon of ``region`` reads them from
        its replica: the current version, or (with ``replica_history``) an earlier one."""
        per: list[list[tuple[str, Mapping | None]]] = []
        for other in self.cfg.all_regions:
            if other == region:
                continue
            k = mkey(key, other)
            cur = self.table.get(k)
            opts: list[tuple[str, Mapping | None]] = [("", None if cur is None else _map_of(cur))]
            for i, f in enumerate(self.hist.get(k, ())):
                opts.append((f" (replica of {other} {i + 1} behind)", _map_of(f) if f else None))
            per.append(opts)
        out: list[tuple[str, list[Mapping]]] = [("", [])]
        for opts in per:
            out = [
                (lab + lab2, [*ms, *([] if m is None else [m])])
                for lab, ms in out
                for lab2, m in opts
            ]
        return out

    def land(self, w: Write) -> bool:
        old = self.get(w.key)
        new = apply(old, w)
        if new is None:
            return False
        self.put(w.key, new)
        if (
            self.cfg.makers
            and w.key[0] == CLIENT
            and new.get("key") is not None
            and (old is None or old.get("key") is None)
        ):  # a claim: a new lease
            self.made_by(str(new["resource"]), "paper" if w.kind == "paper_claim" else "rasd")
        return True

    def made_by(self, res: str, maker: str) -> None:
        """``res`` was just claimed (a new lease), by ``maker``."""
        seq = 1 + max((m[1] for m in (*self.made, *self.made_of)), default=0)
        mine = ((res, seq, maker),)
        self.made = tuple(sorted((*(m for m in self.made if m[0] != res), *mine)))

    def pool(self) -> Pool:
        """The pool as the daemons read it (at their pool refresh: here, at once)."""
        f = self.table.get((META_CLIENT, f"pool#{CLIENT}#{POOL}"))
        cfg = self.cfg
        if f is None and not cfg.budget:
            return POOL_
        lease_us = POOL_.max_lease_us if f is None else int(float(dict(f)["max_lease"]) * US)
        return Pool(CLIENT, POOL, lease_us, None, cfg.budget * US, cfg.pool_quarantine * US)

    def mapping(self, key: str, region: str = REGION) -> Mapping | None:
        f = self.table.get(mkey(key, region))
        return None if f is None else _map_of(f)

    def resource(self, res: str) -> ResourceItem | None:
        f = self.table.get(rkey(res))
        return None if f is None else _res_of(f)  # None too for a tombstone

    # ---------------------------------------------------------------- daemons
    def set_daemon(self, d: DaemonState) -> None:
        ds = list(self.daemons)
        ds[d.idx] = d
        self.daemons = tuple(ds)

    def new_token(self) -> str:
        self.tokens += 1
        return f"t{self.tokens}"

    # ---------------------------------------------------------- the invariants
    def _end(self, a: Answer, quarantine: bool) -> int:
        """When answer ``a`` stops being valid (docs/design.md, I1 and I2).

        I1 (``quarantine``): at its lease end, or, once its lease's release has completed,
        Q - max_clock_skew after it (the quarantine, as the most advanced clock sees it).
        I2: at its lease end, when an app calls release(key) after the lease's first answer,
        whatever that call answers (an app that asked to release stops using it), or when a
        release of the key applied to this lease, whenever it was called (release is per
        key: it ends whatever lease the key holds when it applies, docs/protocol.md)."""
        if quarantine:
            rel = next((t for tok, t in self.released if tok == a.token), None)
            if rel is None:
                return a.exp
            return min(a.exp, rel + self.inv_q - self.cfg.rules().grace_us)
        # per lease (its token), not per answer: a cached copy served after the release by
        # another daemon belongs to the released lease (stale for at most S, I3), and so does
        # the paper's agent's answer of a lease it found through its lagging index
        same = (b.at for b in self.answers if _one_lease(a, b, self.made_of, self.lagged))
        first = min(same, default=a.at)
        first = min(first, a.at)
        call = min((t for k, t in self.release_calls if k == a.key and t >= first), default=None)
        mine = {a.token}
        if a.token in self.lagged:  # a stale answer: of the claim it read, released or not
            mine |= {c for p, c in self.read_claims if p == a.token}
        applied = next((t for tok, t in (*self.released, *self.ended) if tok in mine), None)
        return min(t for t in (a.exp, call, applied) if t is not None)

    def answer(self, d: DaemonState, key: str, lease: Lease) -> None:
        """An app got ``lease`` for ``key`` from daemon ``d`` now: check I1 and I2."""
        now = self.true_us()
        new = Answer(key, lease.resource, lease.expires_us, lease.token or "", now, lease.region)
        if self.cfg.makers and all(m[0] != new.token for m in self.made_of):
            made = next((m for m in self.made if m[0] == new.resource), None)
            if made is not None:
                self.made_of = tuple(sorted((*self.made_of, (new.token, made[1], made[2]))))
        self.notes.append(
            f"ANSWER d{d.idx} {key} -> {lease.resource} tok={lease.token} "
            f"exp={_tick(lease.expires_us)}"
        )
        for a in self.answers:
            if a.resource == new.resource and a.key != key and self._end(a, True) > now:
                self.violation = Violation(
                    "I1",
                    f"{new.resource} answered to {a.key} (tok {a.token}, valid until "
                    f"{_tick(self._end(a, True))}) and now to {key} (tok {new.token}) at "
                    f"t={self.t}",
                )
            if (
                a.key == key
                and a.resource != new.resource
                and (
                    a.region == new.region
                    or (
                        bool(self.cfg.strict_home)
                        and a.token not in self.fallbacks
                        and new.token not in self.fallbacks
                    )
                )
                and self._end(a, False) > now
                and self._end(new, False) > now
                and not self._paper_made_second(a, new)
                and not self._unsettled_beside_paper(a, new)
            ):
                self.violation = Violation(
                    "I2",
                    f"{key} answered {a.resource} (tok {a.token}, valid until "
                    f"{_tick(self._end(a, False))}) and now {new.resource} (tok {new.token}) "
                    f"at t={self.t}",
                )
        self.answers = self.answers | {new}

    def _unsettled_beside_paper(self, a: Answer, b: Answer) -> bool:
        """One of the two answers is the paper's agent's of a claim of rasd's that no live
        mapping named (``unsettled``), the other an answer of the paper's agent's own lease
        (by that agent, or by a daemon that adopted it: its claim the paper's, ``made_of``):
        two agents acquiring the key at once, the window docs/design.md leaves open ("Not
        covered" (1), (4)). Beside a lease rasd made it is a split rasd made, and counts."""
        for x, y in ((a, b), (b, a)):
            paper_own = y.token.startswith("paper") or any(
                m[0] == y.token and m[2] == "paper" for m in self.made_of
            )
            if x.token in self.unsettled and paper_own and y.token not in self.unsettled:
                return True
        return False

    def _paper_made_second(self, a: Answer, b: Answer) -> bool:
        """With ``legacy_agents``: of the two leases of one key ``a`` and ``b`` answer, the
        later made is the paper's agent's (its race: it decides from the index alone, and
        no agent beside it can stop that; docs/design.md, "Two agents acquiring one key at
        once"). A tie or an unknown order counts as rasd's."""
        if not self.cfg.makers:
            return False
        ma = next((m for m in self.made_of if m[0] == a.token), None)
        mb = next((m for m in self.made_of if m[0] == b.token), None)
        if ma is None or mb is None or ma[1] == mb[1]:
            return False
        return (ma if ma[1] > mb[1] else mb)[2] == "paper"

    def known_tokens(self, d: DaemonState) -> frozenset[str]:
        """The tokens ``d``'s processes hold (made, read or sent): claims one of them may
        still confirm or give back."""
        return _tokens_of((d.req, *d.bg))

    def in_hands(self, token: str) -> bool:
        """Does a running process, a daemon's or a job's (not the paper's agent, which only
        reads it), hold ``token``?"""
        return any(token in self.known_tokens(d) for d in self.daemons) or (
            token in _tokens_of(self._rasd_jobs())
        )

    def _rasd_jobs(self) -> tuple[Proc, ...]:
        return tuple(p for p in self.jobs if not p.label.startswith("paper"))

    def abandoned(self, token: str, resource: str, key: str) -> bool:
        """Is ``token``'s claim on ``resource`` (for ``key``) still on the item, named by no
        mapping, and in no process's hands, its daemon alive: a claim nothing will give back,
        left by a program that stopped (a request's deadline) rather than by a crash? A claim
        a pending mapping names is not: a reader of the key settles it (docs/design.md, "Not
        covered" (4))."""
        f = self.table.get(rkey(resource))
        r = _res_of(f) if f is not None else None
        if r is None or r.holder != token or not r.holder_current or r.key != key:
            return False
        if any(
            m is not None and m.token == token
            for m in (self.mapping(key, g) for g in self.cfg.all_regions)
        ):
            return False
        return token not in self.crash_tokens and not self.in_hands(token)

    def release_under_way(self, token: str) -> bool:
        """Was ``token``'s lease released (by its app or the operator) by a call still under
        way (the app's release waits for its free; rasadmin's command frees before it ends)?
        An answer of the paper's agent meanwhile is concurrent with that call, as the chaos
        audit counts it. Not once the call has ended, its free left to the background: the
        paper's agent may then answer the released lease from a current index ("Not covered"
        (3)), and that counts."""
        done = any(tk == token for tk, _ in (*self.released, *self.ended))
        calls = tuple(d.req for d in self.daemons) + self._rasd_jobs()
        return done and token in _tokens_of(calls)

    def release_called(self, key: str) -> None:
        self.release_calls = (*self.release_calls, (key, self.true_us()))

    def lease_ended(self, key: str, token: object) -> None:
        """The operator ended ``key``'s lease (``token``'s, when it has one) now."""
        self.release_called(key)
        if isinstance(token, str):
            self.ended = (*self.ended, (token, self.true_us()))

    def release_done(self, token: str) -> None:
        self.notes.append(f"RELEASED tok={token}")
        self.released = (*self.released, (token, self.true_us()))

    def prune(self) -> None:
        now = self.true_us()
        live = frozenset(a for a in self.answers if self._end(a, True) > now)
        self.answers = live
        # A release matters to answers given until rel + Q (later ones have empty intervals),
        # including answers for its token given after it (a reader that read before it), and
        # to a live stale answer of the paper's agent of its claim (``read_claims``).
        held = {a.token for a in live}
        self.read_claims = tuple(rc for rc in self.read_claims if rc[0] in held)
        held |= {c for _, c in self.read_claims}
        self.released = tuple(
            sorted((tk, t) for tk, t in self.released if tk in held or t + self.inv_q > now)
        )
        self.ended = tuple(
            sorted((tk, t) for tk, t in self.ended if tk in held or t + self.inv_q > now)
        )
        # A release call ends (for I2) only answers given before it: older calls matter to
        # no live answer and to no later one.
        first = min((a.at for a in live), default=now)
        self.release_calls = tuple(sorted((k, t) for k, t in self.release_calls if t >= first))

    def check_state(self) -> None:
        """Cheap state invariants: a live mapping never outlives its resource's lease; and a
        free item is never claimable (``quarantine_until``, else ``lease_available``, on
        the most advanced clock) before an answer given with it has run out (I1 as the
        table has it, checked as soon as a free makes it so, before any key takes it)."""
        if self.answers:
            self._check_claimable()
        for key, region in ((k, g) for k in self.cfg.keys for g in self.cfg.all_regions):
            m = self.mapping(key, region)
            if m is None or m.state != LIVE or m.resource is None:
                continue
            r = self.resource(m.resource)
            if (
                r is not None
                and r.holder == m.token
                and r.holder_current  # a stale holder: the paper's lease now, not ours
                and r.lease_expires_us is not None
                and m.expires_us is not None
                and m.expires_us > r.lease_expires_us
            ):
                self.violation = Violation(
                    "M<=R", f"mapping of {key} ends after its resource {m.resource}"
                )

    def _check_claimable(self) -> None:
        skew = self.cfg.skew * US  # the grace the rules give (``Config.rules``)
        now = self.true_us()
        for a in self.answers:
            f = self.table.get(rkey(a.resource))
            r = _res_of(f) if f is not None else None
            if r is None or r.key is not None:
                continue
            mark = r.quarantine_until or r.lease_available
            end = self._end(a, True)
            if mark is None or end <= now:
                continue
            if parse_time(mark) - skew < end:
                self.violation = Violation(
                    "I1",
                    f"{a.resource} claimable from {_tick(parse_time(mark))} (on a clock "
                    f"{self.cfg.skew} ahead: {_tick(parse_time(mark) - skew)}) while its "
                    f"answer to {a.key} (tok {a.token}) runs until {_tick(end)}, t={self.t}",
                )
                return


#: the steps a process may take from a world: each step's label and the world after it
Out = list[tuple[str, World]]


def _tick(us: int) -> int:
    return us // US - T0


# ------------------------------------------------------------------------------ the jobs
def scans(w: World) -> list[list[ResourceItem]]:
    """Every scan the lagging index may return: for each item, its current held version or an
    earlier held one (or nothing, if no version in the history is held)."""
    per: list[list[ResourceItem | None]] = []
    for k in sorted(w.table):
        if k[0] != CLIENT:
            continue
        vs: list[ResourceItem | None] = []
        for f in (w.table[k], *w.hist.get(k, ())):
            it = _res_of(f)
            if it is not None and it.key is not None and it.holder is not None and it not in vs:
                vs.append(it)
        cur = _res_of(w.table[k])
        if not vs or cur is None or cur.key is None:
            vs.append(None)
        per.append(vs)
    out: list[list[ResourceItem]] = [[]]
    for vs in per:
        out = [[*sc, *([] if v is None else [v])] for sc in out for v in vs]
    return out

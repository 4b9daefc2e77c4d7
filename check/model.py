"""The model: one DynamoDB table, daemons and jobs running their drivers' own programs.

Theory of operation
-------------------
A world (``check.world.World``: the table, its recent history, the daemons' state, writes in
flight, the answers apps hold, the fault budget) is one global state.

:func:`successors` lists every step any process may take from a world, each as
``(label, next_world)``; faults are steps too. A daemon's request and background tasks are
the daemon's programs (``rasd.steps.daemon`` and the modules beside it, the ones the roles of
``rasd.daemon.coordinator`` drive), run by the interpreter of ``check/effects.py``: each step is one
DynamoDB call, and :class:`DaemonHost` gives their local effects (cache, tokens, candidates
from the lagging index, spawning) their meaning in the model. Decisions are the real
``rasd.core.decide`` functions, reached through the programs' ``Ops``; a known-bad rule set
(:mod:`check.rulesets`) hands them others.

Regions: each daemon has one and writes only its region's items; other regions' mappings are
read as replicated copies (optionally lagging, ``replica_history``) and a live foreign lease
is served as it is (``decide.on_read``). The jobs (``ras-dedupe``, the liberator's expiry
free, orphan repair and re-listing, the paper's agent and liberator) are processes of the
programs their drivers run (``rasd.steps.repair``, ``.dedupe``, ``.paper``), stepped by the
same interpreter (:mod:`check.jobs`).

Time is discrete: ``World.t`` is the true time in ticks (one tick = one second); a daemon's
clock reads ``t + offset``. Every answer is checked against I1 and I2 when it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace as _dc_replace

from rasd.core import cache_rules as CR
from rasd.core.decide import check_expiry
from rasd.core.lease import (
    FREE,
    US,
    Lease,
    ResourceItem,
)
from rasd.core.rollout import paper_lease
from rasd.steps import Done, GetItem, Note, QueryLeased, QueryMappings, Spawn
from rasd.steps import daemon as S
from rasd.steps.give_back import fence_own_claim, free_claim, release
from rasd.steps.renew import confirm, extend_bg, reconfirm
from rasd.steps.take import resolve

from . import admin, jobs
from .effects import Host, start, step
from .procs import Proc
from .rulesets import Protocol
from .world import (
    CLIENT,
    POOL_,
    Config,
    Daemon,
    Entry,
    Out,
    World,
    _res_of,
    replace,
)

# ------------------------------------------------------------------------ the daemon


@dataclass(frozen=True)
class Cand:
    """A candidate as the model's prefetcher hands it out (``TakeCandidate``)."""

    item: ResourceItem


def _bg_order(p: Proc) -> tuple[str, str]:
    return (p.label, repr(p.trace.sent))


class DaemonHost(Host):
    """Daemon ``di``'s processes: its request (``req``) and background tasks (``bg``), run
    on its clock, with its cache and its region's replicas and available index."""

    __slots__ = ("di",)

    def __init__(self, di: int) -> None:
        self.di = di

    def place(self, w: World, old: Proc | None, new: Proc | None) -> None:
        d = w.daemons[self.di]
        is_req = d.req is old if old is not None else new is not None and new.bound
        if is_req:
            d = replace(d, req=new)
        else:
            bg = list(d.bg)
            if old is not None:
                bg.remove(old)
            if new is not None:
                bg.append(new)
            d = replace(d, bg=tuple(sorted(bg, key=_bg_order)))
        w.set_daemon(d)

    def chooses(self, eff: object) -> bool:
        return isinstance(eff, S.TakeCandidate)

    def choices(self, w: World, p: Proc, eff: object) -> list[tuple[str, object]]:
        items = _candidates(w, w.now_us(p.offset), w.cfg.region(self.di))
        if not items:
            return [("no candidate", None)]
        return [(f"candidate {it.resource}@v{it.version}", Cand(it)) for it in items]

    def query(self, w: World, p: Proc, eff: object) -> list[tuple[str, object]]:
        region = w.cfg.region(self.di)
        if isinstance(eff, QueryMappings):
            own = w.mapping(eff.key, region)
            mine = () if own is None else (own,)
            return [(lab, (*mine, *others)) for lab, others in w.replicas(eff.key, region)]
        assert isinstance(eff, QueryLeased)
        held = tuple(
            r
            for k in sorted(w.table)
            if k[0] == CLIENT
            for r in (_res_of(w.table[k]),)
            if r is not None and r.key == eff.key
        )  # consistent, as moto's index; the paper's claims carry no holder
        return [("", held)]

    def describe(self, eff: object) -> str:
        if isinstance(eff, GetItem):
            return f"resource {eff.key[1]}" if eff.key[0] == CLIENT else "mapping"
        return "leased index" if isinstance(eff, QueryLeased) else "mapping"

    def local(self, w: World, p: Proc, eff: object) -> object:
        if isinstance(eff, S.CachePut):
            _cache_put(w, self.di, eff.lease, int(eff.sent))
        elif isinstance(eff, S.CacheDrop):
            _cache_drop(w, self.di, eff.key[2])
        elif isinstance(eff, S.Refresh):
            _maybe_refresh(w, self.di, eff.lease.key, eff.lease, eff.requested_us)
        elif isinstance(eff, S.NewToken):
            return w.new_token()
        elif isinstance(eff, S.RateLimit):
            return 0.0  # no rate limit in the model
        elif not isinstance(
            eff,
            (S.Deadline, S.RefillSoon, S.Untake, S.LostCandidate, S.Miss, S.RelistLater),
        ):  # RelistLater: the relister process re-lists, on any host's clock
            raise TypeError(f"no such effect: {eff!r}")
        return None

    def spawn(self, w: World, p: Proc, eff: Spawn) -> None:
        start(w, self, eff.trace(), f"d{self.di} bg {_bg_label(eff)}", offset=p.offset)

    def note(self, w: World, p: Proc, eff: Note) -> None:
        if eff.event == "lease.released":  # the mapping's release applied (I1's clock starts)
            w.release_done(str(dict(eff.fields)["token"]))

    def finished(self, w: World, p: Proc, done: Done) -> None:
        name, args = p.trace.name, p.trace.args
        if name == "resolve":
            if done.error is None:
                lease, _ = done.value
                w.answer(w.daemons[self.di], args[2], lease)
        elif name in ("extend_bg", "reconfirm"):
            lease = args[1] if name == "extend_bg" else args[2]
            d = w.daemons[self.di]
            w.set_daemon(replace(d, refreshing=d.refreshing - {lease.key}))
        if done.error is not None:
            w.notes.append(f"{p.label} -> error: {done.error}")


def _bg_label(eff: Spawn) -> str:
    """How a background program's steps are named (from its arguments)."""
    a = eff.args
    fn = eff.fn
    if fn is confirm:
        return f"confirm({a[0].key})"
    if fn is free_claim:
        return f"free_claim({a[1][1]}, {a[3]})"
    if fn is fence_own_claim:
        return f"fence_own({a[1].resource})"
    if fn is extend_bg:
        return f"extend({a[1].key})"
    if fn is reconfirm:
        return f"reconfirm({a[2].key})"
    return fn.__name__


def _confirm_s(w: World) -> float:
    return w.rules.confirm_us / US


def _cache_put(w: World, di: int, lease: Lease, sent: int) -> None:
    """``LeaseCache.put``, by the cache's rules, on the daemon's monotonic clock (true
    ticks) and its wall clock (with its offset)."""
    d = w.daemons[di]
    cur = d.entry(lease.key)
    if cur is not None and CR.keeps_current(cur.confirmed, cur.until, sent, w.t):
        return
    until = CR.valid_until(
        sent, _confirm_s(w), w.t, lease.expires_us, w.rules.margin_us, w.now_us(d.offset)
    )
    entry = Entry(lease, sent, until) if CR.serves(until, w.t) else None
    w.set_daemon(d.with_entry(lease.key, entry))


def _cache_drop(w: World, di: int, key: str) -> None:
    w.set_daemon(w.daemons[di].with_entry(key, None))


def _maybe_refresh(w: World, di: int, key: str, lease: Lease, requested: int) -> None:
    """``Renewer.maybe_refresh``, by the cache's rules: extend a sliding lease, or
    re-confirm a stale answer (no extension backoff: the model's extensions fail only as
    its faults make them, and each is explored)."""
    d = w.daemons[di]
    if key in d.refreshing:
        return
    e = d.entry(key)
    stale = e is not None and CR.stale(e.confirmed, w.t, _confirm_s(w))
    kind = CR.refresh_of(
        lease, w.cfg.region(di), requested, w.now_us(d.offset), w.cfg.extend_fraction, stale
    )
    setup = w.setups[di]
    if kind is CR.Refresh.EXTEND:
        w.set_daemon(replace(d, refreshing=d.refreshing | {key}))
        _start_bg(w, di, Spawn(extend_bg, (setup, lease, requested)))
    elif kind is CR.Refresh.RECONFIRM:
        w.set_daemon(replace(d, refreshing=d.refreshing | {key}))
        _start_bg(w, di, Spawn(reconfirm, (setup, POOL_, lease)))


def _start_bg(w: World, di: int, sp: Spawn) -> None:
    host = DaemonHost(di)
    start(w, host, sp.trace(), f"d{di} bg {_bg_label(sp)}", offset=w.daemons[di].offset)


def _candidates(w: World, now_us: int, region: str) -> list[ResourceItem]:
    """The available_resources index, lagging: any free version of an item the table held
    recently (current or one of ``history`` earlier ones), lease_available <= now; the
    daemon's own region's partitions only (prefetch.py)."""
    seen: dict[tuple[str, int], ResourceItem] = {}
    for k in sorted(w.table):
        if k[0] != CLIENT:
            continue
        for f in (w.table[k], *w.hist.get(k, ())):
            it = _res_of(f)
            if (
                it is not None
                and it.key is None
                and it.region == region
                and it.lease_available is not None
                and it.claimable(now_us)
            ):
                seen.setdefault((it.resource, it.version), it)
    return list(seen.values())


# ---------------------------------------------------------------------------- app calls
def app_calls(w0: World, di: int) -> Out:
    """The app asks daemon ``di`` (idle) for get_lease(k) or release(k)."""
    out: Out = []
    d0 = w0.daemons[di]
    if d0.req is not None or w0.ops >= w0.cfg.max_ops:
        return out
    host = DaemonHost(di)
    setup = w0.setups[di]
    for key in w0.cfg.keys:
        w = w0.clone()
        w.ops += 1
        d = w.daemons[di]
        requested = w.now_us(d.offset) + w0.cfg.lease_of(di) * US
        pool = w.pool()
        why = check_expiry(requested, w.now_us(d.offset), pool.max_lease_us)  # the hit, _check
        e = d.entry(key)
        if why:
            w.notes.append(f"d{di} get_lease({key}) -> error: {why}")
            out.append((f"d{di} get_lease({key}) REFUSED (the pool's longest lease)", w))
        elif e is not None and CR.serves(e.until, w.t):  # LeaseCache.answer
            w.answer(d, key, e.lease)
            ext = CR.extend_from(e.lease, w.cfg.region(di))
            if CR.hit_wants_refresh(e.confirmed, w.t, _confirm_s(w), requested, ext):
                _maybe_refresh(w, di, key, e.lease, requested)
            out.append((f"d{di} get_lease({key}) CACHE HIT", w))
        else:
            w.set_daemon(d.with_entry(key, None))
            prog = Spawn(resolve, (setup, pool, key, requested))
            start(w, host, prog.trace(), f"d{di} get_lease({key})", offset=d.offset, bound=True)
            out.append((f"d{di} get_lease({key}) called", w))
        if w0.cfg.release:
            w = w0.clone()
            w.ops += 1
            w.release_called(key)
            prog = Spawn(release, (setup, POOL_, key))
            start(w, host, prog.trace(), f"d{di} release({key})", offset=d0.offset, bound=True)
            out.append((f"d{di} release({key}) called", w))
    return out


# --------------------------------------------------------------------------- successors
def successors(w0: World) -> Out:
    out: Out = []
    for di, d in enumerate(w0.daemons):
        if d.req is not None:
            out += step(w0, DaemonHost(di), d.req)
        else:
            out += app_calls(w0, di)
        for p in d.bg:
            out += step(w0, DaemonHost(di), p)
        if w0.crashes < w0.cfg.max_crashes and (d.req is not None or d.bg or d.cache):
            w = w0.clone()
            w.crashes += 1
            w.set_daemon(Daemon(di, d.offset))
            out.append((f"d{di} CRASHES (cache and tasks lost)", w))
    for i, wr in enumerate(w0.inflight):
        w = w0.clone()
        ok = w.land(wr)
        w.inflight = w0.inflight[:i] + w0.inflight[i + 1 :]
        out.append(
            (
                f"in-flight {wr.kind} on {wr.key[1] if wr.key[0] == CLIENT else wr.key[0]} "
                f"lands: {'applied' if ok else 'rejected'}",
                w,
            )
        )
    if w0.cfg.liberator:
        out += jobs.liberator(w0)
    out += jobs.relister(w0)
    if w0.cfg.rollout_switch:
        out += rollout_steps(w0)
    if w0.cfg.paper_calls and paper_may_call(w0):
        out += jobs.paper_agent(w0)
    if w0.cfg.paper_liberator:
        out += jobs.paper_liberator(w0)
    out += jobs.start_jobs(w0)
    if w0.cfg.admin_runs or w0.cfg.balancer_moves:
        out += admin.actions(w0)
    out += jobs.step_jobs(w0)
    for dt in w0.cfg.ticks:
        if w0.t + dt <= w0.cfg.horizon:
            w = w0.clone()
            w.t += dt
            if dt >= w.cfg.lag:  # replication catches up within ``lag`` ticks
                w.hist = {k: v for k, v in w.hist.items() if k[0] == CLIENT}
            out.append((f"time +{dt} -> t={w.t}", w))
    for _lab, w in out:
        if w.violation is None:
            w.check_state()
        w.prune()
    return out


# ------------------------------------------------------------------------ the rollout switch
def _paper_held(w: World) -> bool:
    """Does an item hold a lease of the paper's agent (``rollout.paper_lease``)?"""
    for k in sorted(w.table):
        if k[0] == CLIENT:
            r = _res_of(w.table[k])
            if r is not None and paper_lease(r):
                return True
    return False


def _old_mode_runs(w: World) -> bool:
    """Does any daemon still run a program started in the mode before the switch?"""
    before = w.cfg.legacy_agents
    for d in w.daemons:
        for p in (d.req, *d.bg):
            if p is None:
                continue
            setup = next((a for a in p.trace.args if isinstance(a, S.Daemon)), None)
            if setup is not None and setup.legacy_agents == before:
                return True
    return False


def rollout_steps(w0: World) -> Out:
    """The record's one change, then each daemon following it."""
    switched, seen = w0.rollout
    out: Out = []
    if not switched:
        if w0.cfg.legacy_agents and (_paper_held(w0) or _paper_running(w0)):
            return out  # end-rollout refuses while the paper's agent holds a lease
        w = w0.clone()
        w.rollout = (True, seen)
        out.append(("rasadmin " + ("end-rollout" if w0.cfg.legacy_agents else "adopt"), w))
        return out
    for i, follows in enumerate(seen):
        if follows:
            continue
        w = w0.clone()
        w.rollout = (True, (*seen[:i], True, *seen[i + 1 :]))
        setups = list(w.setups)
        setups[i] = _dc_replace(setups[i], legacy_agents=not w0.cfg.legacy_agents)
        w.setups = tuple(setups)
        out.append((f"d{i} follows the rollout record", w))
    return out


def _paper_running(w: World) -> bool:
    return any(jobs.is_paper_call(p) for p in w.jobs)


def paper_may_call(w: World) -> bool:
    """The paper's agent calls while the table is in rollout mode: before ``end-rollout``;
    after ``adopt`` only once no daemon runs the fast rules any more."""
    if not w.cfg.rollout_switch:
        return True
    switched, seen = w.rollout
    if w.cfg.legacy_agents:
        return not switched
    return switched and all(seen) and not _old_mode_runs(w)


def initial(cfg: Config, proto: Protocol) -> World:
    return World(cfg, proto)


__all__ = ["FREE", "Config", "World", "field", "initial", "successors"]

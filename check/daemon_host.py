"""The daemon in the model: where its processes live and what its local effects do.

Theory of operation
-------------------
A daemon's request and background tasks are the daemon's programs (``rasd.steps.daemon`` and
the modules beside it, the ones the roles of ``rasd.daemon.coordinator`` drive), run by the
interpreter of ``check/effects.py``: each step is one DynamoDB call. :class:`DaemonHost` gives
the local effects between two calls their meaning in the model: the lease cache, by the
cache's own rules (``rasd.core.cache_rules``); tokens; candidates from the lagging available
index; spawning a background program. The daemon's request is started by the app calls
(:func:`check.model.app_calls`); its background programs by its request and by its refreshes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_never

from rasd.core import cache_rules
from rasd.core.lease import US, Lease, ResourceItem
from rasd.steps import At, Done, GetItem, Note, QueryLeased, QueryMappings, Spawn
from rasd.steps import daemon as daemon_steps
from rasd.steps.give_back import fence_own_claim, free_claim
from rasd.steps.renew import confirm, extend_bg, reconfirm

from .effects import Host, frozen, start
from .procs import Proc
from .world import CLIENT, POOL_, Entry, World, _res_of, replace


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
        return isinstance(eff, daemon_steps.TakeCandidate)

    def choices(self, w: World, p: Proc, eff: object) -> list[tuple[str, object]]:
        items = _candidates(w, w.now_us(p.offset), w.cfg.region(self.di))
        if not items:
            return [("no candidate", None)]
        return [(f"candidate {it.resource}@v{it.version}", Cand(it)) for it in items]

    def query(self, w: World, p: Proc, eff: object) -> list[tuple[str, object]]:
        region = w.cfg.region(self.di)
        if isinstance(eff, At) and isinstance(eff.call, GetItem):
            # a strict pool's agreement, read in its home region (where alone it is written)
            return [(f" in {eff.region}", frozen(w.get(eff.call.key)))]
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
        if isinstance(eff, At):
            return "agreement"
        if isinstance(eff, GetItem):
            return f"resource {eff.key[1]}" if eff.key[0] == CLIENT else "mapping"
        return "leased index" if isinstance(eff, QueryLeased) else "mapping"

    def local(self, w: World, p: Proc, eff: Any) -> object:
        """The daemon's own effects (``rasd.steps.daemon.DaemonOwn``), each handled: one
        added without a case here fails mypy (``assert_never``), as in the daemon's driver."""
        own: daemon_steps.DaemonOwn = eff
        match own:
            case daemon_steps.CachePut():
                _cache_put(w, self.di, own.lease, int(own.sent))
            case daemon_steps.CacheDrop():
                _cache_drop(w, self.di, own.key[2])
            case daemon_steps.Refresh():
                _maybe_refresh(w, self.di, own.lease.key, own.lease, own.requested_us)
            case daemon_steps.NewToken():
                return w.new_token()
            case daemon_steps.RateLimit():
                return 0.0  # no rate limit in the model
            case (
                daemon_steps.Deadline()
                | daemon_steps.RefillSoon()
                | daemon_steps.Untake()
                | daemon_steps.LostCandidate()
                | daemon_steps.Miss()
            ):
                pass
            case daemon_steps.RelistLater():
                pass  # the relister process re-lists, on any host's clock
            case daemon_steps.TakeCandidate():
                raise TypeError("a candidate is a step of its own (chooses), not local")
            case _:
                assert_never(own)
        return None

    def spawn(self, w: World, p: Proc, eff: Spawn) -> None:
        start(w, self, eff.trace(), f"d{self.di} bg {_bg_label(eff)}", offset=p.offset)

    def note(self, w: World, p: Proc, eff: Note) -> None:
        if eff.event == "lease.released":  # the mapping's release applied (I1's clock starts)
            w.release_done(str(dict(eff.fields)["token"]))
        elif eff.event == "strict_fallback":  # answered unagreed: may be a duplicate
            w.fallbacks = w.fallbacks | {str(dict(eff.fields)["token"])}

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
    if cur is not None and cache_rules.keeps_current(cur.confirmed, cur.until, sent, w.t):
        return
    now_us = w.now_us(d.offset)
    until = cache_rules.valid_until(
        sent, _confirm_s(w), w.t, lease.expires_us, w.rules.margin_us, now_us
    )
    window_s = w.proto.outage_window_us(w.rules, w.pool()) / US
    spare = cache_rules.valid_until(
        sent, window_s, w.t, lease.expires_us, w.rules.margin_us, now_us
    )
    entry = Entry(lease, sent, until, spare) if cache_rules.serves(spare, w.t) else None
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
    stale = e is not None and cache_rules.stale(e.confirmed, w.t, _confirm_s(w))
    kind = cache_rules.refresh_of(
        lease, w.cfg.region(di), requested, w.now_us(d.offset), w.cfg.extend_fraction, stale
    )
    setup = w.setups[di]
    if kind is cache_rules.Refresh.EXTEND:
        w.set_daemon(replace(d, refreshing=d.refreshing | {key}))
        _start_bg(w, di, Spawn(extend_bg, (setup, lease, requested)))
    elif kind is cache_rules.Refresh.RECONFIRM:
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

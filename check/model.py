"""The model: one DynamoDB table, daemons and jobs running their drivers' own programs.

:func:`successors` lists every step any process may take from a world, faults included;
:func:`app_calls` starts a request. docs/checker.md, "What is modeled" and "What is not
modeled (honestly)".
"""

from __future__ import annotations

from dataclasses import field

from rasd.core import cache_rules
from rasd.core.decide import check_expiry
from rasd.core.lease import FREE, US
from rasd.steps import Spawn
from rasd.steps.daemon import WAIT_FIRST
from rasd.steps.give_back import release
from rasd.steps.take import resolve

from . import admin, jobs
from .daemon_host import DaemonHost, _confirm_s, _maybe_refresh
from .effects import start, step
from .rollout import paper_may_call, rollout_steps
from .rulesets import Protocol
from .world import CLIENT, Config, DaemonState, Out, World


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
        elif e is not None and cache_rules.serves(e.until, w.t):  # LeaseCache.answer
            w.answer(d, key, e.lease)
            ext = cache_rules.extend_from(e.lease, w.cfg.region(di))
            if cache_rules.hit_wants_refresh(e.confirmed, w.t, _confirm_s(w), requested, ext):
                _maybe_refresh(w, di, key, e.lease, requested)
            out.append((f"d{di} get_lease({key}) CACHE HIT", w))
        else:
            if e is not None and cache_rules.serves(e.spare, w.t) and not setup.legacy_agents:
                # the outage path (``Router``'s spare answer): DynamoDB unreachable, as far
                # as this daemon can tell, at any step; or not, and the miss below
                x = w.clone()
                x.answer(d, key, e.lease)
                _maybe_refresh(x, di, key, e.lease, requested)
                out.append((f"d{di} get_lease({key}) OUTAGE HIT (cut off)", x))
            w.set_daemon(d.with_entry(key, None))
            # ``Acquirer``'s hint: a key whose lease this daemon knew lately (here: an entry,
            # lapsed) is read before its mapping is written beside the read (rollout mode)
            speculate = e is None
            prog = Spawn(resolve, (setup, pool, key, requested, WAIT_FIRST, (), True, speculate))
            start(w, host, prog.trace(), f"d{di} get_lease({key})", offset=d.offset, bound=True)
            out.append((f"d{di} get_lease({key}) called", w))
        if w0.cfg.release:
            w = w0.clone()
            w.ops += 1
            w.release_called(key)
            prog = Spawn(release, (setup, w.pool(), key))
            start(w, host, prog.trace(), f"d{di} release({key})", offset=d0.offset, bound=True)
            out.append((f"d{di} release({key}) called", w))
    return out


def table_hits(w0: World, di: int) -> Out:
    """Another worker of daemon ``di``'s host reads the hit table while the daemon has a
    request in flight (a release, a miss of the same key): the table is the cache, written in
    the daemon's own steps, so it answers what the cache holds now, with no background work
    (the touch is the idle daemon's CACHE HIT). ``rasd_client._table``: the entry's ``until``
    and the pool's longest lease, compared with the host's clocks."""
    out: Out = []
    d0 = w0.daemons[di]
    if w0.ops >= w0.cfg.max_ops:
        return out
    for key, e in d0.cache:
        requested = w0.now_us(d0.offset) + w0.cfg.lease_of(di) * US
        if check_expiry(requested, w0.now_us(d0.offset), w0.pool().max_lease_us):
            continue  # the daemon names it, over the socket
        serves = w0.proto.table_serves
        if not serves(e.until, e.lease.expires_us, w0.t, w0.rules.margin_us, d0.offset):
            continue
        w = w0.clone()
        w.ops += 1
        w.answer(w.daemons[di], key, e.lease)
        out.append((f"d{di} get_lease({key}) TABLE HIT (daemon busy)", w))
    return out


# --------------------------------------------------------------------------- successors
def successors(w0: World) -> Out:
    out: Out = []
    for di, d in enumerate(w0.daemons):
        if d.req is not None:
            out += step(w0, DaemonHost(di), d.req)
            if w0.cfg.hit_table:
                out += table_hits(w0, di)
        else:
            out += app_calls(w0, di)
        for p in d.bg:
            out += step(w0, DaemonHost(di), p)
        if w0.crashes < w0.cfg.max_crashes and (d.req is not None or d.bg or d.cache):
            w = w0.clone()
            w.crashes += 1
            w.crash_tokens = w.crash_tokens | w.known_tokens(d)
            w.set_daemon(DaemonState(di, d.offset))
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


def initial(cfg: Config, proto: Protocol) -> World:
    return World(cfg, proto)


__all__ = ["FREE", "Config", "World", "field", "initial", "successors"]

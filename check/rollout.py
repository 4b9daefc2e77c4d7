"""The rollout switch in the model: the table's rollout record changes once, and each
daemon follows it.

Theory of operation
-------------------
With ``Config.rollout_switch`` the record changes once: ``rasadmin end-rollout`` when the
daemons start beside the paper's agent (``legacy_agents``), by the real command's decision
(``rasd.core.rollout.on_end``): refused while an item holds a lease of that agent (or one of
its calls runs), else, while a lease the table holds may have been answered, a mark with the
latest end and the switch at a run after it; ``rasadmin adopt`` otherwise. Then each daemon
follows it at a step of its own (its later programs run in the new mode; one already running
keeps the old). The paper's agent calls only while the table is in rollout mode and, after
``end-rollout``'s mark, not at all: the operator stopped its hosts (:func:`paper_may_call`).

After ``adopt``, once every daemon follows and no program of the fast rules still runs (the
bound the command waits out), its sweep (:func:`adopt_sweep`: the command's own per-item
programs over a scan of the table) settles what the fast rules left; the paper's agent
calls only after a sweep that settled everything (the real command then prints a later
start, which the model does not wait for: it never calls).
"""

from __future__ import annotations

from dataclasses import replace as _dc_replace
from typing import Any

from rasd.core.errors import RasdError
from rasd.core.lease import PENDING, US, Mapping, ResourceItem, fmt_time
from rasd.core.rollout import End, Rollout, answers_end, paper_lease
from rasd.core.serialize import mapping_from
from rasd.steps import Program, Spawn
from rasd.steps import daemon as daemon_steps
from rasd.steps.admin import ATTEMPTS, PENDING_UNSETTLED, settle_lease, settle_pending

from . import jobs
from .effects import start
from .rulesets import admin_ops
from .world import (
    CLIENT,
    SWEEP_NOT_BEGUN,
    SWEEP_RUNNING,
    SWEEP_SETTLED,
    Out,
    World,
    _res_of,
    _tick,
    mkey,
)


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
            setup = next(
                (a for a in p.trace.args if isinstance(a, daemon_steps.DaemonContext)), None
            )
            if setup is not None and setup.legacy_agents == before:
                return True
    return False


def rollout_steps(w0: World) -> Out:
    """The record's one change, then each daemon following it."""
    switched, seen = w0.rollout
    out: Out = []
    if not switched:
        if not w0.cfg.legacy_agents:
            w = w0.clone()
            w.rollout = (True, seen)
            return [("rasadmin adopt", w)]
        if _paper_running(w0):
            return out  # end-rollout is run once the paper's agent has stopped
        return _end_rollout(w0)
    # adopt's sweep once every daemon follows and no program of the fast rules runs
    sweep = not w0.cfg.legacy_agents and w0.adopt_sweep == SWEEP_NOT_BEGUN
    if sweep and all(seen) and not _old_mode_runs(w0):
        out.append(_sweep(w0))
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


def _end_rollout(w0: World) -> Out:
    """``rasadmin end-rollout``, as the real command decides from the table (a run that
    changes nothing is no step)."""
    now, grace = w0.now_us(w0.cfg.admin_offset), w0.cfg.skew * US
    items = [r for k, f in sorted(w0.table.items()) if k[0] == CLIENT and (r := _res_of(f))]
    record = Rollout(paper_agents=True, ends_at=None)
    if w0.rollout_mark is not None:
        record = Rollout(paper_agents=True, ends_at=fmt_time(w0.rollout_mark))
    until = answers_end(items, grace)
    step = w0.proto.on_end(_paper_held(w0), record, until, now)
    w = w0.clone()
    if step is End.MARK:
        w.rollout_mark = until
        return [(f"rasadmin end-rollout marks {_tick(until)}", w)]
    if step is End.TURN_OFF:
        w.rollout = (True, w0.rollout[1])
        return [("rasadmin end-rollout", w)]
    return []


def adopt_sweep(
    pendings: tuple[Mapping, ...],
    leases: tuple[tuple[ResourceItem, tuple[str, ...]], ...],
    now_us: int,
    rules: Any,
    ops: Any,
) -> Program[bool]:
    """``rasadmin adopt``'s sweep as its driver runs it (``rasd_jobs.adopt.run``): each pending
    mapping of the scan (``settle_pending``), then each running lease with its tokens
    (``settle_lease``), a failure of one counted and the next taken. True: every leftover
    settled (the command's ``unsettled`` is 0)."""
    settled = True
    for m in pendings:
        try:
            got = yield from settle_pending(m, now_us, rules, False)
        except RasdError:
            got = "error"
        settled = settled and got not in PENDING_UNSETTLED and got != "error"
    for it, tokens in leases:
        try:
            swept = yield from settle_lease(it, now_us, rules, "rasadmin-adopt", tokens, False, ops)
        except RasdError:
            settled = settled and not (it.holder is not None and it.holder_current)
            continue
        settled = settled and not swept.unsettled
    return settled


def _sweep(w0: World) -> tuple[str, World]:
    """Start ``adopt``'s sweep on the table as it is now (its scan)."""
    w = w0.clone()
    now = w.now_us(w.cfg.admin_offset)
    pendings = []
    for key in w.cfg.keys:
        for region in w.cfg.all_regions:
            raw = w.get(mkey(key, region))
            m = mapping_from(raw) if raw else None
            if m is not None and m.state == PENDING:
                pendings.append(m)
    leases = []
    for k, f in sorted(w.table.items()):
        r = _res_of(f) if k[0] == CLIENT else None
        if r is not None and r.key is not None and (r.lease_expires_us or 0) > now:
            leases.append((r, tuple(w.new_token() for _ in range(ATTEMPTS))))
    w.adopt_sweep = SWEEP_RUNNING
    args = (tuple(pendings), tuple(leases), now, w.rules, admin_ops(w.proto))
    sweep = Spawn(adopt_sweep, args).trace()
    start(w, jobs.HOST, sweep, "rasadmin adopt sweep", offset=w.cfg.admin_offset)
    return ("rasadmin adopt sweeps", w)


def _paper_running(w: World) -> bool:
    return any(jobs.is_paper_call(p) for p in w.jobs)


def paper_may_call(w: World) -> bool:
    """The paper's agent calls while the table is in rollout mode: before ``end-rollout``;
    after ``adopt`` only once no daemon runs the fast rules any more."""
    if not w.cfg.rollout_switch:
        return True
    switched, seen = w.rollout
    if w.cfg.legacy_agents:
        return not switched and w.rollout_mark is None
    return switched and all(seen) and not _old_mode_runs(w) and w.adopt_sweep == SWEEP_SETTLED

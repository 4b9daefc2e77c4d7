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
"""

from __future__ import annotations

from dataclasses import replace as _dc_replace

from rasd.core.lease import US, fmt_time
from rasd.core.rollout import End, Rollout, answers_end, paper_lease
from rasd.steps import daemon as S

from . import jobs
from .world import CLIENT, Out, World, _res_of, _tick


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
        if not w0.cfg.legacy_agents:
            w = w0.clone()
            w.rollout = (True, seen)
            return [("rasadmin adopt", w)]
        if _paper_running(w0):
            return out  # end-rollout is run once the paper's agent has stopped
        return _end_rollout(w0)
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
    return switched and all(seen) and not _old_mode_runs(w)

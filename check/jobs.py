"""The jobs as the checker runs them: the programs the jobs drive, stepped over the model.

Theory of operation
-------------------
Every job process of the model runs the very program its job drives (``rasd.steps``), kept
as a :class:`rasd.steps.Trace` and stepped by :mod:`check.effects` one DynamoDB call at a time,
with every way each call can end:

* ``ras-dedupe`` (:func:`start_jobs`): a run's scan of the lagging leased index is any
  combination of recent held versions; its duplicate groups go to
  ``rasd.steps.dedupe.dedupe_groups``, which examines each group on consistent reads and
  releases in each region's replica; the survivor read in another region's replica
  (``At``) may see any recent version of its mapping (:meth:`JobHost.query`);
* the liberator's orphan repair: a held item acquired ``orphan_age`` ago, from a lagging
  scan, goes to ``rasd.steps.repair.check_orphan``;
* the liberator's expiry free (:func:`liberator`), the re-listing of quarantines that are
  over (:func:`relister`) and the paper's liberator (:func:`paper_liberator`): one
  conditional write each (``liberate_item``, ``relist_item``, ``paper_free_expired``),
  started and sent in one step;
* the paper's agent (:func:`paper_agent`): ``rasd.steps.paper.paper_get_lease``, whose index
  reads may return any recent version (the leased index: any running lease of the key;
  the available index: any free version of the region's items, claimed on its version).

The known-bad rule sets reach the jobs through the programs' ``ops``
(``check.rulesets.job_ops``): nothing here re-states a job.
"""

from __future__ import annotations

from typing import Any

from rasd.core.builders import liberate, paper_free, relist
from rasd.core.lease import LIVE, US, Lease, ResourceItem, fmt_time
from rasd.core.writes import apply
from rasd.steps import At, Done, GetItem, Note, QueryAvailable, QueryLeased, Spawn
from rasd.steps.dedupe import DedupeRun, dedupe_groups
from rasd.steps.paper import PaperAnswer, paper_free_expired, paper_get_lease
from rasd.steps.repair import LiberatorRun, check_orphan, liberate_item, relist_item

from .effects import Host, frozen, start, step
from .procs import Proc
from .rulesets import job_ops
from .world import (
    CLIENT,
    POOL,
    REGION,
    SWEEP_SETTLED,
    SWEEP_UNSETTLED,
    DaemonState,
    Out,
    World,
    _res_of,
    scans,
)


def _versions(w: World, k: Any) -> list[ResourceItem]:
    """The versions of a resource item a lagging index may return: current and recent
    (a tombstone is in neither index)."""
    out: list[ResourceItem] = []
    for f in (w.table[k], *w.hist.get(k, ())):
        it = _res_of(f)
        if it is not None and it not in out:
            out.append(it)
    return out


def _res_keys(w: World) -> list[Any]:
    return [k for k in sorted(w.table) if k[0] == CLIENT]


class JobHost(Host):
    """The job processes (``World.jobs``): where they live, what their reads may return."""

    __slots__ = ()

    def place(self, w: World, old: Proc | None, new: Proc | None) -> None:
        js = list(w.jobs)
        if old is not None:
            js.remove(old)
        if new is not None:
            js.append(new)
        w.jobs = tuple(sorted(js, key=lambda p: (p.label, repr(p.trace.sent))))

    def query(self, w: World, p: Proc, eff: Any) -> list[tuple[str, Any]]:
        if isinstance(eff, At):
            k = eff.call.key
            if k[0] == CLIENT or k[1] == eff.region:  # the region's own item: current
                return [("", frozen(w.get(k)))]
            opts: list[tuple[str, Any]] = [("", frozen(w.get(k)))]
            for i, f in enumerate(w.hist.get(k, ())):
                opts.append(
                    (f" (replica of {k[1]} {i + 1} behind)", frozen(dict(f)) if f else None)
                )
            return opts
        now = w.now_us(p.offset)
        if isinstance(eff, QueryLeased):
            held = [
                it
                for k in _res_keys(w)
                for it in _versions(w, k)
                if it.key == eff.key and it.lease_expires_us is not None
                and it.lease_expires_us > now
            ]  # fmt: skip
            if not held:
                return [(" (none)", ())]
            return [(f" shows {it.resource}@v{it.version}", (it,)) for it in held]
        assert isinstance(eff, QueryAvailable)
        cands = [
            it
            for k in _res_keys(w)
            for it in _versions(w, k)
            if it.key is None and it.lease_available is not None and it.region == eff.region
        ]
        if not cands:
            return [(" (none)", ())]
        return [(f" candidate {it.resource}@v{it.version}", (it,)) for it in cands]

    def describe(self, eff: Any) -> str:
        call = eff.call if isinstance(eff, At) else eff
        if isinstance(call, GetItem):
            k = call.key
            if k[0] == CLIENT:
                what = f"resource {k[1]}"
            elif isinstance(eff, At) and k[1] != eff.region:
                what = f"{k[1]} mapping"
            else:
                what = "mapping"
            return what + (f" in {eff.region}" if isinstance(eff, At) else "")
        if isinstance(call, QueryLeased):
            return "leased index"
        return "available index"

    def written_in(self, w: World, p: Proc, eff: At) -> str | None:
        """The balancer's driver writes an item in its region's replica when it has an
        endpoint for it (``--peer-endpoint``; it refuses to run without one for each region);
        with the known-bad rule set that drops that requirement, in its own."""
        own = w.cfg.balancer_region
        if p.label.startswith("balancer") and w.proto.balancer_no_peers and eff.region != own:
            return own
        return None

    def note(self, w: World, p: Proc, eff: Note) -> None:
        if eff.event == "lease_ended" and p.label.startswith("rasadmin"):
            # the operator ends the key's lease as its mapping's release goes out: for I2,
            # as if its app had asked to release it (I1 still holds it to its end)
            f = dict(eff.fields)
            w.lease_ended(str(f["key"]), f.get("token"))
            return
        if eff.level:
            said = " ".join(f"{k}={v}" for k, v in eff.fields if k in _SAID)
            w.notes.append(f"{p.label}: {eff.event} {said}".rstrip())

    def finished(self, w: World, p: Proc, done: Done) -> None:
        if done.error is not None:
            w.notes.append(f"{p.label} -> error: {done.error}")
        elif p.label.startswith(("rasadmin", "balancer")):
            v = done.value
            said = getattr(v, "status", v)
            detail = getattr(v, "detail", None)
            w.notes.append(f"{p.label} -> {said}" + (f" ({detail})" if detail else ""))
        if p.trace.name == "adopt_sweep":
            w.adopt_sweep = SWEEP_SETTLED if done.value is True else SWEEP_UNSETTLED
        if p.trace.name == paper_get_lease.__qualname__ and isinstance(done.value, PaperAnswer):
            it, key = done.value.item, p.trace.args[2]
            assert it.lease_expires_us is not None
            n = w.paper - 1
            ver, tok = (it.version, f"paper{n}") if done.value.new else (
                it.version + 1, f"paper-found{n}"
            )  # fmt: skip
            lease = Lease(CLIENT, POOL, key, it.resource, it.region, it.lease_expires_us,
                          ver, 0, tok)  # fmt: skip
            made = next((m for m in w.made if m[0] == it.resource), None)
            by_rasd = made is None or made[2] == "rasd"  # not the paper's lease, adopted
            if not done.value.new and it.holder is not None and it.holder_current and by_rasd:
                m = w.mapping(key, it.region)
                if (m is None or m.state != LIVE or m.token != it.holder) and not w.abandoned(
                    it.holder, it.resource, key
                ):
                    w.unsettled = w.unsettled | {tok}
            cur = w.get(it.ident)
            if not done.value.new and (
                cur is None
                or cur.get("key") != key  # the index lagged a write that took k off it
                or (it.holder is not None and w.release_under_way(it.holder))
            ):
                w.lagged = w.lagged | {tok}
                if it.holder is not None:
                    w.read_claims = (*w.read_claims, (tok, it.holder))
            w.answer(DaemonState(9, w.cfg.paper_offset), key, lease)


HOST = JobHost()
#: the fields of a job's notes the model's traces show
_SAID = ("resource", "kind", "why", "keep", "extras", "orphans")


def _kinds(w: World) -> set[str]:
    return {p.trace.name for p in w.jobs}


def _run_now(w0: World, sp: Spawn, label: str, offset: int) -> Out:
    """Start ``sp`` and make its first call in one step (a one-call job: the old model's
    granularity)."""
    w = w0.clone()
    start(w, HOST, sp.trace(), label, offset=offset)
    p = next((q for q in w.jobs if q.label == label), None)
    if p is None:  # it ended without a call
        return []
    return step(w, HOST, p)


# ------------------------------------------------------------------- one-call jobs
def liberator(w0: World) -> Out:
    """The liberator's expiry free: any expired version a (lagging) scan may show, freed
    conditional on the version and end read (``rasd.steps.repair.liberate_item``)."""
    out: Out = []
    off = w0.cfg.liberator_offset
    run = LiberatorRun(w0.now_us(off), w0.rules.grace_us, None, w0.cfg.rules().quarantine_us)
    cutoff = run.now_us - run.grace_us
    seen: set[tuple[str, int]] = set()
    for k in _res_keys(w0):
        for it in _versions(w0, k):
            if it.key is None or it.lease_expires_us is None or it.lease_expires_us >= cutoff:
                continue
            if (it.resource, it.version) in seen:
                continue
            seen.add((it.resource, it.version))
            if apply(w0.get(k), liberate(it, run.now_us)) is None:
                continue  # refused now and for ever (the version only grows)
            sp = Spawn(liberate_item, (it, run))
            out += _run_now(w0, sp, f"liberator liberate({it.resource}@v{it.version})", off)
    return out


def relister(w0: World) -> Out:
    """The releaser's re-listing and the liberator's: an item whose quarantine is over goes
    back to the available index (``relist_item``), on the clock furthest ahead."""
    out: Out = []
    off = max((*w0.cfg.offsets, w0.cfg.liberator_offset))
    now = w0.now_us(off)
    for k in _res_keys(w0):
        it = _res_of(w0.table[k])
        if it is None or it.quarantine_until is None or it.quarantine_until > fmt_time(now):
            continue
        if apply(w0.get(k), relist(it, now)) is None:
            continue
        out += _run_now(w0, Spawn(relist_item, (it, now)), f"relist({it.resource})", off)
    return out


def paper_liberator(w0: World) -> Out:
    """The paper's liberator: a lease past its end plus ``paper_grace`` on its clock, from a
    lagging scan, freed on the version read alone (``paper_free_expired``)."""
    out: Out = []
    off = w0.cfg.paper_offset
    now = w0.now_us(off)
    grace = w0.cfg.paper_grace * US
    for k in _res_keys(w0):
        for it in _versions(w0, k):
            if it.key is None or it.lease_expires_us is None or it.lease_expires_us > now - grace:
                continue
            if apply(w0.get(k), paper_free(it, now)) is None:
                continue
            sp = Spawn(paper_free_expired, (it, now, grace))
            out += _run_now(w0, sp, f"paper liberator frees {it.resource}@v{it.version}", off)
    return out


# ---------------------------------------------------------------------- processes
def is_paper_call(p: Proc) -> bool:
    """Is ``p`` a ``get_lease`` call of the paper's agent?"""
    return p.trace.name == paper_get_lease.__qualname__


def paper_agent(w0: World) -> Out:
    """The paper's agent: ``get_lease`` calls for ``paper_key``, one at a time."""
    cfg = w0.cfg
    if paper_get_lease.__qualname__ in _kinds(w0) or w0.paper >= cfg.paper_calls:
        return []
    w = w0.clone()
    w.paper += 1
    now = w.now_us(cfg.paper_offset)
    args = (CLIENT, POOL, cfg.paper_key, REGION, now + cfg.lease * US, now, (0,), 1)
    label = f"paper get_lease({cfg.paper_key})"
    start(w, HOST, Spawn(paper_get_lease, args).trace(), label, offset=cfg.paper_offset)
    return [(f"{label} called", w)]


def start_jobs(w0: World) -> Out:
    """A ``ras-dedupe`` run (one at a time) on any scan the lagging index may return; a
    liberator's orphan check of any held version acquired ``orphan_age`` ago."""
    out: Out = []
    kinds = _kinds(w0)
    cfg = w0.cfg
    if dedupe_groups.__qualname__ not in kinds and w0.dedupe_done < cfg.dedupe_runs:
        now = w0.now_us(cfg.dedupe_offset)
        rules = w0.rules
        others = frozenset(cfg.all_regions) - {REGION}
        run = DedupeRun(REGION, now, cfg.rules().quarantine_us, rules.margin_us,
                        rules.grace_us, peers=others)  # fmt: skip
        for scan in scans(w0):
            groups: dict[str, list[ResourceItem]] = {}
            for it in scan:
                assert it.key is not None
                if not it.expired(now):  # lapsed leases are the liberator's
                    groups.setdefault(it.key, []).append(it)
            dups = tuple(tuple(v) for _k, v in sorted(groups.items()) if len(v) > 1)
            w = w0.clone()
            w.dedupe_done += 1
            lab = ", ".join(f"{it.resource}@v{it.version}" for g in dups for it in g) or "none"
            if dups:
                sp = Spawn(dedupe_groups, (dups, run, job_ops(w0.proto)))
                start(w, HOST, sp.trace(), "dedupe", offset=cfg.dedupe_offset)
            out.append((f"dedupe scan: duplicates {lab}", w))
    if check_orphan.__qualname__ not in kinds and w0.repair_done < cfg.repair_runs:
        now = w0.now_us(cfg.liberator_offset)
        run2 = LiberatorRun(
            now,
            w0.rules.grace_us,
            cfg.orphan_age * US,
            cfg.rules().quarantine_us,
            # the paper agent's extra hold (to the lease's end) is not modelled: the
            # quarantine and orphan_free_at are what I1 rests on (D5 and H show it)
            legacy_agents=False,
        )
        cutoff = now - w0.rules.grace_us
        old = now - cfg.orphan_age * US
        for k in _res_keys(w0):
            for it in _versions(w0, k):
                if (
                    it.holder is None
                    or it.lease_expires_us is None
                    or it.lease_expires_us < cutoff  # expired: the expiry free's
                    or it.lease_acquired_us is None
                    or it.lease_acquired_us >= old
                ):
                    continue
                w = w0.clone()
                w.repair_done += 1
                sp = Spawn(check_orphan, (it, run2, job_ops(w0.proto)))
                label = f"liberator orphan check {it.resource}"
                start(w, HOST, sp.trace(), label, offset=cfg.liberator_offset)
                out.append((f"{label}@v{it.version} ({it.holder})", w))
    return out


def step_jobs(w0: World) -> Out:
    """Every running job process's next call."""
    out: Out = []
    for p in w0.jobs:
        out += step(w0, HOST, p)
    return out


__all__ = [
    "HOST",
    "JobHost",
    "liberator",
    "paper_agent",
    "paper_liberator",
    "relister",
    "start_jobs",
    "step_jobs",
]

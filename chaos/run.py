"""The chaos run: start everything, break it for ``duration`` seconds, audit what the apps saw.

Layout of one run (all on 127.0.0.1; every child in its own process group)::

    moto us-east-1  <── sim.replicator (last writer wins, --lag) ──>  moto eu-west-1
      ▲   ▲   ▲      <── per region, against its own replica: ras-liberator,  ▲   ▲
      │   │   │          ras-dedupe, rasadmin; ras-balancer in us-east-1 with  │   │
      │   │   │          --peer-endpoint eu-west-1 (its state on moto's S3)    │   │
     p0  p2  p4     fault-injecting proxies (threads of this process)         p1  p3
      ▲   ▲   ▲                                                                ▲   ▲
     d0  d2  d4     rasd serve --region (alternately); one is kill -9'd       d1  d3
                    every --kill-every seconds and restarted at once
     apps (python -m chaos.app): get_lease/release over --keys keys, history as JSON lines

Sequence: one moto server per region (the replicas), the table, pool and resources in each
(the same items), the replicator, proxies (faults off), daemons (ready), then faults on, the
outage window set, apps, jobs, the balancer, rasadmin and the killer started; after
``duration`` the apps stop by themselves, the other actors are stopped, the replicator is
let settle, each replica is scanned directly, and ``chaos.audit`` judges the histories and
the replicas. The result (JSON) goes to ``--results-dir`` as ``<stamp>-<label>.json`` and
``latest-<label>.json``. ``--one-table``: one moto table for both regions, no replicator,
every child signing for us-east-1 (the liberator then runs ``--all-regions`` and the
balancer ``--unreplicated``).

Mixed mode (``--mixed``, docs/reliability.md "Mixed fleet"): beside the apps, workers of the
paper's in-process agent (``python -m chaos.paper agent``, half in each region, each through
its own fault-injecting proxy) ask for keys of the same key space, and the paper's liberator
(``python -m chaos.paper liberate --grace``) runs with the other jobs. Their answers go into
the same histories (``agent: "paper"``) and the audit judges the union. The mixed fleet runs
on one table (the paper's agent knows one), without the balancer and rasadmin.

The end of the rollout (``--end-rollout-at``, mixed mode): at that time the paper's workers
(started to stop then) and its liberator stop, ``rasadmin end-rollout`` runs every few seconds
until it succeeds (``EndRollout``; past the traffic if need be, the jobs beside it, for at
most ``END_ROLLOUT_BOUND``), and the daemons, still serving, follow the record to the fast
rules; the result's ``end_rollout`` says when each step happened.

Every loop is bounded by the run's deadline; ``finally`` kills every process group started.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fleet import tables
from fleet.backends import Moto
from fleet.procs import kill_group
from rasd.config import Config
from rasd_jobs import common as jobs_common
from sim import replicator

from . import audit as chaos_audit
from .admin import Admin, admin_writes
from .children import (
    Daemon,
    child_env,
    daemon_clock,
    daemon_env,
    daemon_rollout,
    daemon_stats,
    ddb_client,
    popen,
    seed_table,
    start_daemon,
    start_replicator,
    stop_replicator,
    wait_ready,
)
from .commands import Events, Jobs, jobs_summary
from .end_rollout import EndRollout, end_rollout_result
from .params import BUCKET, CLIENT, TABLE_REGION, Params, say
from .proxy import FaultPlan, FaultProxy, Trace, start_proxies, totals
from .summary import actors, violations, write

#: how long ``rasadmin end-rollout`` may go on succeeding after the traffic, on a loaded machine
END_ROLLOUT_BOUND = 90.0


def run(p: Params) -> dict[str, Any]:
    """One chaos run; returns the result (also written to ``p.results_dir``)."""
    p.check()
    rng = random.Random(f"{p.seed}/run")
    env = child_env(one_table=not p.replicated())
    denv = daemon_env(p, env)
    work = Path(tempfile.mkdtemp(prefix="rasd-chaos-"))  # short: AF_UNIX paths <= 107 bytes
    motos: list[Moto] = []
    rep: subprocess.Popen[str] | None = None
    proxies: list[FaultProxy] = []
    daemons: list[Daemon] = []
    apps: list[subprocess.Popen[bytes]] = []
    jobs: Jobs | None = None
    balancer: Jobs | None = None
    admin: Admin | None = None
    end_roll: EndRollout | None = None
    events = Events()
    plan = FaultPlan(rate=p.fault_rate, hold_s=p.hold_s)
    started = time.monotonic()
    try:
        endpoints: dict[str, str] = {}
        for r in p.regions if p.replicated() else p.regions[:1]:
            moto = Moto(env, group=True, stderr=subprocess.DEVNULL)
            motos.append(moto)
            endpoints[r] = moto.endpoint
        if not p.replicated():
            endpoints = {r: endpoints[p.regions[0]] for r in p.regions}
        ddbs = {
            r: ddb_client(u, r if p.replicated() else TABLE_REGION) for r, u in endpoints.items()
        }
        home = p.regions[0]
        seed_table([ddbs[r] for r in (p.regions if p.replicated() else [home])], p)
        if p.balancer and not p.mixed:
            ddb_client(endpoints[home], home, "s3").create_bucket(Bucket=BUCKET)
        if p.replicated():
            rep = start_replicator(endpoints, p, env, work)
        say(
            p,
            f"moto {', '.join(f'{r} {u}' for r, u in endpoints.items())}; table {p.table}; "
            f"resources {p.counts()}"
            + (f"; replicated, lag {p.lag_s:g}s" if p.replicated() else "; one table"),
        )
        paper_proxies = p.paper_workers if p.mixed and p.paper_faults else 0
        upstreams = [endpoints[p.regions[i % len(p.regions)]] for i in range(p.daemons)]
        upstreams += [endpoints[home]] * paper_proxies
        trace = Trace(str(work / "trace.jsonl")) if p.trace else None
        proxies = start_proxies(upstreams, plan, p.seed, trace)
        for i in range(p.daemons):
            daemons.append(
                Daemon(
                    index=i,
                    region=p.regions[i % len(p.regions)],
                    socket=str(work / f"d{i}.sock"),
                    proxy_url=proxies[i].url,
                    log=str(work / f"d{i}.log"),
                )
            )
        clock = ClockStep(p, work)

        def env_of(d: Daemon) -> dict[str, str]:
            return clock.env(d.index, denv)

        for d in daemons:
            start_daemon(d, p.table, env_of(d))
        for d in daemons:
            if not wait_ready(d, 60):
                raise RuntimeError(f"daemon {d.index} never became ready; see {d.log}")
        say(p, f"{p.daemons} daemons ready; faults on, {p.apps} apps for {p.duration:.0f}s")

        # -- the traffic phase
        t_start = time.time()
        t_end = t_start + p.duration
        outage = (t_start + p.outage_offset(), t_start + p.outage_offset() + p.outage_s)
        plan.outage = outage if p.outage_s > 0 else None
        if p.partition_at is not None:
            plan.partition = (
                "p0",
                t_start + p.partition_at,
                t_start + p.partition_at + p.partition_s,
            )
        clock.begin(t_start)
        plan.enabled = True
        histories = [work / f"app{i}.jsonl" for i in range(p.apps)]
        for i in range(p.apps):
            mine = [daemons[i % p.daemons], daemons[(i + 1) % p.daemons]]
            spec = ",".join(f"{d.index}={d.region}={d.socket}" for d in mine)
            cmd = [
                sys.executable, "-m", "chaos.app", "--app", str(i), "--sockets", spec,
                "--out", str(histories[i]), "--seed", str(p.seed),
                "--keys", str(p.keys), "--until", repr(t_end),
                "--release-rate", str(p.release_rate), "--think-ms", str(p.think_ms),
                "--timeout", str(p.call_timeout),
            ]  # fmt: skip
            if p.app_max_lease is not None:
                cmd += ["--max-asked", f"{p.app_max_lease:g}"]
            with open(work / f"app{i}.err", "ab") as err:
                apps.append(
                    popen(cmd, env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
                )
        paper: list[subprocess.Popen[bytes]] = []
        # the paper's workers stop by themselves at the end of the rollout, if it has one
        paper_until = t_end if p.end_rollout_at is None else t_start + p.end_rollout_at
        if p.mixed:
            for i in range(p.paper_workers):
                histories.append(work / f"paper{i}.jsonl")
                endpoint = proxies[p.daemons + i].url if p.paper_faults else endpoints[home]
                cmd = [
                    sys.executable, "-m", "chaos.paper", "agent", "--app", str(p.apps + i),
                    "--region", p.regions[i % len(p.regions)], "--endpoint-url", endpoint,
                    "--table", p.table, "--out", str(histories[-1]), "--seed", str(p.seed),
                    "--keys", str(p.keys), "--until", repr(paper_until),
                    "--think-ms", str(p.think_ms), "--read-timeout", str(p.call_timeout),
                ]  # fmt: skip
                if p.paper_max_lease is not None:
                    cmd += ["--max-asked", f"{p.paper_max_lease:g}"]
                with open(work / f"paper{i}.err", "ab") as err:
                    quiet = subprocess.DEVNULL
                    paper.append(popen(cmd, env, stdin=quiet, stdout=quiet, stderr=err))
            apps += paper
        jobs = Jobs(p, endpoints, env, events)
        jobs.start()
        if p.end_rollout_at is not None:
            end_roll = EndRollout(p, endpoints[home], env, jobs, paper, daemons, t_start)
            end_roll.start()
        if p.balancer and not p.mixed:
            balancer = Jobs(p, endpoints, env, events, balancer=True)
            balancer.start()
        if p.admin and not p.mixed:
            admin = Admin(p, endpoints, env, events, work)
            admin.start()
        next_kill = time.monotonic() + p.kill_every if p.kill_every > 0 else float("inf")
        hard_stop = time.monotonic() + p.duration + 3 * p.call_timeout + 30
        load: list[float] = []  # the 1-minute load average, every 10 s
        next_load = time.monotonic()
        # answers from a pool's outage window, per daemon: a killed daemon's counted first
        window: Counter[int] = Counter()
        while time.monotonic() < hard_stop and any(a.poll() is None for a in apps):
            now = time.monotonic()
            if now >= next_kill and time.time() < t_end:
                victim = rng.choice(daemons)
                if p.outage_budget:
                    window[victim.index] += _window_answers(daemon_stats(victim))
                kill_group(victim.proc)
                events.kills.append(
                    {"t": round(time.time(), 3), "daemon": victim.index, "region": victim.region}
                )
                start_daemon(victim, p.table, env_of(victim))  # at once, on the same socket path
                next_kill = now + p.kill_every
            for d in daemons:  # a restart can die (e.g. during the outage): start it again
                if (
                    d.proc is not None
                    and d.proc.poll() is not None
                    and time.monotonic() - d.last_start > 1.0
                    and time.time() < t_end
                ):
                    events.restarts[str(d.index)] += 1
                    start_daemon(d, p.table, env_of(d))
            clock.tick(daemons)
            if time.monotonic() >= next_load:
                load.append(os.getloadavg()[0])
                next_load += 10.0
            time.sleep(0.2)
        for a in apps:
            if a.poll() is None:
                kill_group(a)
        if end_roll is not None and end_roll.out["succeeded_s"] is None:
            say(p, "traffic over; end-rollout goes on, the jobs beside it")
            end_roll.finish(END_ROLLOUT_BOUND)
        say(p, "traffic over; stopping jobs, auditing")
        for actor in (jobs, balancer, admin, end_roll):
            if actor is not None:
                actor.stop()
        plan.enabled = False
        stats = {d.index: daemon_stats(d) for d in daemons}
        for i, s in stats.items():
            window[i] += _window_answers(s)
        ended = None
        if end_roll is not None:
            ended = end_rollout_result(
                p,
                end_roll.out,
                t_start,
                proxies[p.daemons :],
                jobs_common.read_rollout(ddbs[home], p.table),
                {d.index: daemon_rollout(d) for d in daemons},
            )
        settled = None
        if rep is not None:
            settled = replicator.settle(rep, max(1.0, p.lag_s + 0.5))

        # -- the audit
        records: list[dict[str, Any]] = []
        for h in histories:
            if h.exists():
                with open(h) as f:
                    for line in f:
                        with contextlib.suppress(ValueError):
                            records.append(json.loads(line))
        scanned_at = time.time()
        if rep is not None:
            scans = {r: tables.scan(ddbs[r], p.table) for r in p.regions}
            table = chaos_audit.replica_checks(scans, CLIENT, scanned_at)
            table["settled"] = settled
            replication = stop_replicator(rep)
        else:
            table = chaos_audit.table_checks(tables.scan(ddbs[home], p.table), CLIENT, scanned_at)
            replication = None
        made = creations(p, proxies)
        if made is not None:  # kept beside the result, for digging into a finding
            Path(p.results_dir).mkdir(parents=True, exist_ok=True)
            with open(Path(p.results_dir) / f"{p.label}-lease-events.jsonl", "w") as f:
                f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in made)
        q_window = p.pool_quarantine() - Config().max_clock_skew if p.outage_budget else None
        audit = chaos_audit.audit(records, plan.outage, quarantine_window=q_window, creations=made)
        writes = replication_writes(work / "replication.jsonl") + admin_writes(events.admin)
        for name in ("double_allocations", "in_region_splits", "lost_leases"):
            chaos_audit.evidence(audit["examples"][name], writes)
        job_counts = jobs_summary(events.jobs)
        result = {
            "label": p.label,
            "params": asdict(p),
            "started": t_start,
            "outage": list(outage) if p.outage_s > 0 else None,
            "seconds": round(time.monotonic() - started, 1),
            "audit": audit,
            "table": table,
            "replication": replication,
            "actors": actors(job_counts, events.admin, writes if rep is not None else None, audit),
            "kills": len(events.kills),
            "kill_events": events.kills,
            "unplanned_restarts": dict(events.restarts),
            "daemon_starts": {d.index: d.starts for d in daemons},
            "jobs": job_counts,
            "job_events": events.jobs,
            "admin_events": events.admin,
            "proxies": totals(proxies),
            "daemon_counters": _sum_counters(stats),
            "load": _load(load),
            "end_rollout": ended,
            "partition": None
            if plan.partition is None
            else {"daemon": 0, "from": plan.partition[1], "to": plan.partition[2]},
            "outage_budget": None
            if not p.outage_budget
            else {
                "budget_s": p.outage_budget,
                "pool_quarantine_s": p.pool_quarantine(),
                "window_answers": dict(sorted(window.items())),
            },
            "clock_step": clock.result(records, daemons),
        }
        result["ok"] = violations(result) == 0
        write(p, result)
        return result
    finally:
        for actor in (jobs, balancer, admin, end_roll):
            if actor is not None:
                actor.stop()
        for a in apps:
            kill_group(a)
        for d in daemons:
            kill_group(d.proc)
        for px in proxies:
            px.stop()
        if proxies and proxies[0].trace is not None:
            proxies[0].trace.close()
        if rep is not None:
            kill_group(rep)
        for moto in motos:
            with contextlib.suppress(OSError):
                if moto.proc.stdin is not None:
                    moto.proc.stdin.close()
            moto.kill()
        if p.keep_workdir or p.trace:
            say(p, f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


class ClockStep:
    """Daemon 1's clock stepped (``Params.clock_step_at``): its offset file, written at the
    step and set right again; its ``stats`` watched for when it stopped trusting its clock;
    then what its apps saw. Nothing when the run steps no clock."""

    #: the stepped daemon must stop answering within this (the issue's bound)
    WITHIN_S = 10.0
    INDEX = 1

    def __init__(self, p: Params, work: Path) -> None:
        self.p = p
        self.file = work / f"d{self.INDEX}.clock"
        self.on = p.clock_step_at is not None
        self.at = self.back = math.inf
        self.stepped = self.restored = False
        self.untrusted_at: float | None = None  # first seen untrusted after the step
        self.why: str | None = None
        if self.on:
            self.file.write_text("0")

    def env(self, index: int, env: dict[str, str]) -> dict[str, str]:
        if not self.on or index != self.INDEX:
            return env
        return {**env, "RASD_CLOCK_OFFSET_FILE": str(self.file)}

    def begin(self, t_start: float) -> None:
        if self.on:
            assert self.p.clock_step_at is not None
            self.at = t_start + self.p.clock_step_at
            self.back = self.at + self.p.clock_step_for

    def tick(self, daemons: list[Daemon]) -> None:
        if not self.on:
            return
        now = time.time()
        if not self.stepped and now >= self.at:
            self.file.write_text(f"{self.p.clock_step_s:g}")
            self.stepped = True
        if not self.restored and now >= self.back:
            self.file.write_text("0")
            self.restored = True
        if self.stepped and not self.restored and self.untrusted_at is None:
            clock = daemon_clock(daemons[self.INDEX])
            if clock.get("trusted") is False:
                self.untrusted_at, self.why = now, clock.get("why")

    def result(self, records: list[dict[str, Any]], daemons: list[Daemon]) -> dict[str, Any] | None:
        """When the stepped daemon stopped trusting its clock, what it answered while
        stepped (from ``WITHIN_S`` after the step until it was set right: nothing may have
        been a lease), whether its log says why; ``ok`` when all three hold."""
        if not self.on:
            return None
        answered = [
            r
            for r in records
            if r.get("op") == "get_lease"
            and r.get("ok")
            and r.get("daemon") == self.INDEX
            and self.at + self.WITHIN_S <= float(r["t0"])
            and float(r["t1"]) <= self.back
        ]
        refused = sum(1 for r in records if "clock is not trusted" in str(r.get("message") or ""))
        try:
            logged = "clock_untrusted" in Path(daemons[self.INDEX].log).read_text()
        except OSError:
            logged = False
        after = None if self.untrusted_at is None else round(self.untrusted_at - self.at, 3)
        return {
            "daemon": self.INDEX,
            "step_s": self.p.clock_step_s,
            "at": self.at,
            "back": self.back,
            "untrusted_after_s": after,
            "why": self.why,
            "answered_while_stepped": len(answered),
            "refused_for_the_clock": refused,
            "logged": logged,
            "ok": after is not None and after <= self.WITHIN_S and not answered and logged,
        }


def creations(p: Params, proxies: list[FaultProxy]) -> list[dict[str, Any]] | None:
    """The claims the proxies saw apply, each with the agent that sent it (the daemons' proxies
    come first, then the paper workers'), for the audit's "who made the second lease"; None
    unless the run is mixed with the paper's workers behind proxies (chaos.audit counts every
    split involving rasd then)."""
    if not (p.mixed and p.paper_faults):
        return None
    out: list[dict[str, Any]] = []
    for i, px in enumerate(proxies):
        agent = chaos_audit.RASD if i < p.daemons else chaos_audit.PAPER
        out.extend({**c, "agent": agent} for c in px.events)
    return out


def _load(samples: list[float]) -> dict[str, Any]:
    """The machine's 1-minute load average during the traffic: lowest, mean, highest."""
    if not samples:
        return {"samples": 0}
    mean = sum(samples) / len(samples)
    return {"samples": len(samples), "min": round(min(samples), 2), "mean": round(mean, 2),
            "max": round(max(samples), 2)}  # fmt: skip


def _window_answers(counters: dict[str, int]) -> int:
    """A daemon's answers from a pool's outage window since it started."""
    return counters.get("outage.at_once", 0) + counters.get("outage.after_failure", 0)


def _sum_counters(stats: dict[int, dict[str, int]]) -> dict[str, int]:
    """The live daemons' counters since their last start (a killed daemon's are gone)."""
    total: Counter[str] = Counter()
    for s in stats.values():
        total.update({k: v for k, v in s.items() if isinstance(v, int)})
    keep = ("lease.", "acq.", "ddb.", "cache.", "prefetch.")
    return {k: v for k, v in sorted(total.items()) if k.startswith(keep)}


def replication_writes(path: Path) -> list[dict[str, Any]]:
    """The replicas' own writes of resource items as the replicator read them from the
    streams (``sim.replicator.audit_events``), as evidence rows: ``t`` in epoch seconds,
    ``actor``: who can write such a change (a move: the balancer; an acquisition: a daemon;
    a release: a daemon, the liberator or ras-dedupe), ``in``: the replica written."""
    who = {"move": "balancer", "acq": "daemon", "rel": "daemon/liberator/dedupe"}
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    with open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if ev.get("ev") in who:
                    out.append({**ev, "t": ev["t"] / 1000.0, "actor": who[ev["ev"]]})
    return out

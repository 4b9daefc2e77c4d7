"""The end of the rollout during a mixed run (:class:`EndRollout`), and its record."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

from fleet.procs import kill_group
from fleet.proxy import Proxy
from rasd.core.rollout import Rollout

from .children import Daemon, daemon_rollout
from .commands import Commands, Jobs, last_json
from .params import Params, say


class EndRollout(Commands):
    """The end of the rollout as an operator does it (docs/operations.md, "When the old agent
    can be removed"), ``end_rollout_at`` seconds into the traffic, while the daemons serve:

    1. the paper's liberator stops (after its run under way), and its workers stop: they were
       started to stop then, each after the call under way, so every answer is in the audit;
    2. ``rasadmin end-rollout``, the CLI against the run's table, every ``end_rollout_every``
       seconds until it succeeds: it refuses while any item holds a lease of the paper's
       agent, running or ended and not yet freed (``ras-liberator`` frees those on its loop),
       then marks the record with the latest end of a lease held and succeeds after it;
    3. each daemon's ``stats`` every second, until every one has reported the fast rules.

    :attr:`out` is the record: times in seconds into the traffic (``_s``)."""

    #: a paper worker still running this long after the end (its last call hung) is killed
    WORKER_BOUND = 30.0

    def __init__(
        self,
        p: Params,
        endpoint: str,
        env: dict[str, str],
        jobs: Jobs,
        workers: list[subprocess.Popen[bytes]],
        daemons: list[Daemon],
        t_start: float,
    ) -> None:
        super().__init__("chaos-end-rollout")
        self.p, self.endpoint, self.env, self.jobs = p, endpoint, env, jobs
        self.workers, self.daemons, self.t_start = workers, daemons, t_start
        self.out: dict[str, Any] = {
            "at_s": p.end_rollout_at,
            "every_s": p.end_rollout_every,
            "attempts": [],
            "succeeded_s": None,
            "daemons_off_s": {},
            "all_daemons_off_s": None,
        }

    def since(self) -> float:
        return round(time.time() - self.t_start, 3)

    def run(self) -> None:
        at = self.t_start + float(self.p.end_rollout_at or 0.0)
        if self.stop_ev.wait(max(0.0, at - time.time())):
            return
        self.jobs.stop_paper()
        self.out["paper_liberator_stopped_s"] = self.since()
        bound = at + self.WORKER_BOUND
        while any(w.poll() is None for w in self.workers) and time.time() < bound:
            if self.stop_ev.wait(0.2):
                return
        hung = [w for w in self.workers if w.poll() is None]
        for w in hung:
            kill_group(w)
        self.out["paper_workers_killed"] = len(hung)
        self.out["paper_workers_stopped_s"] = self.since()
        say(self.p, f"paper's workers and liberator stopped ({len(hung)} killed); end-rollout next")
        # the first attempt a pause after the last worker ended: a proxy may still hold its
        # last write (a latency fault) and forward it then
        while self.out["succeeded_s"] is None:
            if self.stop_ev.wait(self.p.end_rollout_every):
                return
            rec = self.attempt()
            if rec["exit"] == 0:
                self.out["succeeded_s"] = rec["s"]
                say(self.p, f"end-rollout succeeded at {rec['s']:.1f} s")
        off: dict[int, float] = self.out["daemons_off_s"]
        while len(off) < len(self.daemons) and not self.stop_ev.wait(1.0):
            for d in self.daemons:
                if d.index not in off and daemon_rollout(d) is False:
                    off[d.index] = self.since()
        if len(off) == len(self.daemons):
            self.out["all_daemons_off_s"] = max(off.values())
            say(self.p, f"every daemon on the fast rules by {max(off.values()):.1f} s")

    def finish(self, bound_s: float) -> None:
        """After the traffic: the attempts (and the liberator beside them) go on until one
        succeeds or ``bound_s`` passes. A loaded machine stretches every step (each
        ``rasadmin`` and liberator run is a process); only a defect keeps the end from
        coming within the bound."""
        t0 = time.time()
        while self.out["succeeded_s"] is None and self.is_alive() and time.time() < t0 + bound_s:
            time.sleep(0.2)
        self.out["waited_after_traffic_s"] = round(time.time() - t0, 3)

    def attempt(self) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "rasd_jobs.admin", "end-rollout", "--table", self.p.table,
               "--region", self.p.regions[0], "--endpoint-url", self.endpoint,
               "--log-level", "error"]  # fmt: skip
        s = self.since()
        done = self.call(cmd, self.env)
        rec = {"s": s, **(end_rollout_attempt(*done) if done else {"exit": None})}
        if self.stop_ev.is_set() and rec["exit"] != 0:
            rec["stopped"] = True  # killed by stop(), at the end of the run
        self.out["attempts"].append(rec)
        return rec


def end_rollout_attempt(code: int | None, out: bytes, err: bytes) -> dict[str, Any]:
    """One ``rasadmin end-rollout`` as a record: its exit status, and why it refused:
    ``paper_leases`` (with how many running, how many ended and not yet freed, and a few
    items), ``answers_running`` (marked, or waiting for its mark: ``ends_at``),
    ``record_changed`` (a concurrent change of the record), or ``error`` (no summary: its
    message on stderr)."""
    summary = last_json(out, {})
    rec: dict[str, Any] = {"exit": code}
    if code == 0:
        rec["changed"] = summary.get("changed")
        return rec
    found = summary.get("paper_leases") or {}
    if found.get("running") or found.get("ended"):
        rec.update(reason="paper_leases", running=found.get("running", 0))
        rec.update(ended=found.get("ended", 0), items=found.get("items", []))
    elif summary.get("ends_at"):
        rec.update(reason="answers_running", ends_at=summary["ends_at"])
        if summary.get("latest_lease"):
            rec["latest_lease"] = summary["latest_lease"]
    elif "refused" in summary:
        rec.update(reason="record_changed", message=str(summary["refused"]))
    else:
        rec.update(reason="error", message=err.decode(errors="replace").strip()[-300:])
    return rec


def end_rollout_result(
    p: Params,
    out: dict[str, Any],
    t_start: float,
    paper_proxies: list[Proxy],
    record: Rollout,
    modes: dict[int, bool | None],
) -> dict[str, Any]:
    """The end of the rollout as the result records it: :attr:`EndRollout.out`, the paper's
    last claim through its proxies (when it applied, and the end of the lease it made), the
    rollout record read from the table after the traffic, and the rules each daemon reported
    then."""
    claims = [e for px in paper_proxies for e in px.events if e.get("kind") == "claim"]
    res = dict(out)
    res["paper_last_claim_s"] = (
        round(max(e["got"] for e in claims) - t_start, 3) if claims else None
    )
    res["paper_last_lease_end_s"] = (
        round(max(e["end"] for e in claims) - t_start, 3) if claims else None
    )
    res["refusals"] = sum(
        1 for a in out["attempts"] if a["exit"] not in (0, None) and not a.get("stopped")
    )
    res["record_at_end"] = asdict(record)
    res["daemons_at_end"] = {
        "off": sum(1 for m in modes.values() if m is False),
        "on": sum(1 for m in modes.values() if m is True),
        "no_answer": sum(1 for m in modes.values() if m is None),
    }
    succeeded, last = res["succeeded_s"], res["paper_last_claim_s"]
    # the scenario's premise: no claim of the paper's agent landed after end-rollout's scan
    res["paper_claim_after_end"] = None not in (succeeded, last) and last > succeeded
    # within the traffic, or after it (``EndRollout.finish``) on a loaded machine
    res["within_traffic"] = succeeded is not None and succeeded <= p.duration
    res["ok"] = (
        succeeded is not None and not record.paper_agents and not res["paper_claim_after_end"]
    )
    return res

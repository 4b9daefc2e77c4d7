"""``rasadmin rollout`` and ``rasadmin end-rollout``: the table's rollout record
(``rasd.core.rollout``). docs/design.md, "Rollout mode, in the table", argues both
directions of the switch; docs/operations.md, "Rolling out beside the paper's agent", runs
them.
"""

from __future__ import annotations

import argparse
import socket
import time
from collections import Counter
from typing import Any

import structlog

from rasd.config import Config
from rasd.core.lease import US, fmt_time
from rasd.core.rollout import End, answers_end, on_end, paper_lease, running_paper_lease
from rasd.core.serialize import is_resource_item
from rasd.steps.daemon import BACKGROUND_DEADLINE, FREE_CLAIM_ATTEMPTS

from . import common

log = structlog.get_logger("rasd_jobs.rollout")

#: an item of the paper's agent listed in end-rollout's refusal, at most this many
EXAMPLES = 5


def follow_bound_s(cfg: Config) -> float:
    """How long after a change every daemon runs by it: one pool refresh and its read."""
    return cfg.pool_refresh + cfg.pool_refresh_timeout


def background_life_s() -> float:
    """The longest a daemon's background program started before a change keeps the old
    rules: a give-back, retried with its backoff, each attempt with its own deadline."""
    tries = range(FREE_CLAIM_ATTEMPTS)
    return sum(BACKGROUND_DEADLINE + min(2.0**a, 16.0) for a in tries)


def status(ddb: Any, table: str, cfg: Config) -> dict[str, Any]:
    """The record as a summary line."""
    r = common.read_rollout(ddb, table)
    return {
        "table": table,
        "rollout": r.paper_agents,
        "changed": r.changed,
        "by": r.by,
        "why": r.why,
        "version": r.version,
        "ends_at": r.ends_at,
        # the daemons' signal (a raise above what the record last cleared turns the mode on)
        "signal": r.signal,
        "seen_cleared": r.cleared,
        "daemons_follow_within_s": follow_bound_s(cfg),
    }


def begin(ddb: Any, table: str, cfg: Config, why: str, dry_run: bool) -> dict[str, Any]:
    """Turn rollout mode on (``rasadmin adopt``'s first step), removing a mark of
    ``end-rollout``'s. Idempotent."""
    for _ in range(3):
        seen = common.read_rollout(ddb, table)
        if (seen.paper_agents and seen.ends_at is None) or dry_run:
            break
        if common.write_rollout(ddb, table, True, seen, _by(), why):
            break
    out = status(ddb, table, cfg)
    out["rollout"] = True
    # every running daemon follows it by then, and what it had started before has ended
    wait = follow_bound_s(cfg) + background_life_s()
    out["paper_agents_may_start_at"] = fmt_time(int((time.time() + wait) * US))
    return out


def paper_leases(ddb: Any, table: str, now_us: int, grace_us: int) -> dict[str, Any]:
    """Every item holding a lease of the paper's agent (a Scan of the table): running, or
    ended and not yet freed; and ``answers_until``, the latest end plus ``grace_us`` of any
    lease held (``rollout.answers_end``), in microseconds."""
    c: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    until, latest = answers_end((), grace_us), None
    for page in common.scan_pages(ddb, {"TableName": table}):
        for raw in page.get("Items", []):
            c["scanned"] += 1
            if not is_resource_item(raw):
                continue
            it = common.parsed(raw, c, log)
            if it is not None and answers_end((it,), grace_us) > until:
                until, latest = answers_end((it,), grace_us), it
            if it is None or not paper_lease(it):
                continue
            running = running_paper_lease(it, now_us, grace_us)
            c["running" if running else "ended"] += 1
            if len(examples) < EXAMPLES:
                examples.append(_example(it, now_us, grace_us))
    return {
        "scanned": c["scanned"],
        "running": c["running"],
        "ended": c["ended"],
        "items": examples,
        "answers_until_us": until,
        "latest": None if latest is None else _example(latest, now_us, grace_us),
    }


def _example(it: Any, now_us: int, grace_us: int) -> dict[str, Any]:
    return {
        "resource": it.resource,
        "region": it.region,
        "key": it.key,
        "lease_expires": common.iso(it.lease_expires_us),
        "running": running_paper_lease(it, now_us, grace_us),
    }


def end(
    ddb: Any, table: str, cfg: Config, now_us: int, dry_run: bool
) -> tuple[int, dict[str, Any]]:
    """Turn rollout mode off, unless an item holds a lease of the paper's agent. Returns the
    exit status and the summary."""
    found = paper_leases(ddb, table, now_us, int(cfg.max_clock_skew * US))
    until, latest = found.pop("answers_until_us"), found.pop("latest")
    out: dict[str, Any] = {"job": "end-rollout", "table": table, "dry_run": dry_run}
    out["paper_leases"] = found
    seen = common.read_rollout(ddb, table)
    if not seen.paper_agents:
        if found["running"] or found["ended"]:
            out["refused"] = _paper_found(found)
            return common.EXIT_ERRORS, out
        out["rollout"] = False
        out["changed"] = False
        return common.EXIT_OK, out
    step = on_end(bool(found["running"] or found["ended"]), seen, until, now_us)
    out["rollout"] = step is not End.TURN_OFF or dry_run  # a dry run changes nothing
    out["changed"] = False
    if step is End.REFUSE:
        out["refused"] = _paper_found(found)
        if seen.ends_at is not None and not dry_run:  # the agent still writes: the mark is void
            common.write_rollout(ddb, table, True, seen, _by(), "end-rollout: paper lease found")
        return common.EXIT_ERRORS, out
    if step is End.MARK:
        if not dry_run and not common.write_rollout(
            ddb, table, True, seen, _by(), "end-rollout: waiting for answers", ends_at_us=until
        ):
            out["refused"] = _changed()
            return common.EXIT_ERRORS, out
        out["ends_at"] = common.iso(until)
        out["latest_lease"] = latest  # the lease held to the latest end: the one waited for
        out["refused"] = _wait(out["ends_at"])
        return common.EXIT_ERRORS, out
    if step is End.WAIT:
        out["ends_at"] = seen.ends_at
        out["refused"] = _wait(seen.ends_at)
        return common.EXIT_ERRORS, out
    if not dry_run and not common.write_rollout(ddb, table, False, seen, _by(), "end-rollout"):
        out["refused"] = _changed()
        return common.EXIT_ERRORS, out
    out["changed"] = not dry_run
    out["daemons_follow_within_s"] = follow_bound_s(cfg)
    return common.EXIT_OK, out


def _paper_found(found: dict[str, Any]) -> str:
    return (
        f"{found['running']} running and {found['ended']} ended-but-not-freed leases of the "
        "paper's agent are in the table: stop its hosts, wait for their leases to end and "
        "for ras-liberator to free them (or run it now), then try again"
    )


def _wait(ends_at: str | None) -> str:
    return (
        "the paper's agent may have answered a lease the table holds (its own, or one of "
        f"rasd's it found), in use until {ends_at}: the record stays on until then; run "
        "end-rollout again after it (nothing else to do: its hosts must stay stopped)"
    )


def _changed() -> str:
    return "the rollout record changed while this ran: run end-rollout again"


def _by() -> str:
    return f"rasadmin:{socket.gethostname()}"


def cmd_rollout(ddb: Any, args: argparse.Namespace) -> int:
    common.emit(status(ddb, args.table, common.daemon_config(args)))
    return common.EXIT_OK


def cmd_end_rollout(ddb: Any, args: argparse.Namespace) -> int:
    code, out = end(ddb, args.table, common.daemon_config(args), common.now_us(args), args.dry_run)
    common.emit(out)
    return code


__all__ = ["begin", "cmd_end_rollout", "cmd_rollout", "end", "follow_bound_s", "status"]

"""The chaos run's result: what the actors did, its violations, the JSON written, the table."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from . import audit as chaos_audit
from .admin import admin_summary
from .params import Params


def actors(
    jobs: dict[str, Any],
    admin: list[dict[str, Any]],
    writes: list[dict[str, Any]] | None,
    audit: dict[str, Any],
) -> dict[str, Any]:
    """What each actor besides the daemons did: the balancer's runs and moves (as it counts
    them, and as the replicas' streams show them: ``writes``, None without replicas),
    rasadmin's actions, and the get_lease calls refused while a redefinition's shorter max
    lease was in force."""
    bal: dict[str, Any] = dict(jobs.get("balancer", {}))
    moves = None if writes is None else [w for w in writes if w.get("ev") == "move"]
    bal["moves_in_streams"] = None if moves is None else len(moves)
    bal["leased_moves_in_streams"] = None if moves is None else sum(1 for w in moves if w["leased"])
    return {
        "balancer": bal,
        "admin": admin_summary(admin),
        "refused_beyond_max_lease": audit.get("refused_beyond_max_lease", 0),
    }


def violations(result: dict[str, Any]) -> int:
    a, t = result["audit"], result["table"]
    leased_moves = result.get("actors", {}).get("balancer", {}).get("leased_moves_in_streams") or 0
    ended = result.get("end_rollout")
    return int(
        a["double_allocations"]
        + a["in_region_splits"]
        + a["lost_leases"]
        + chaos_audit.table_violations(t)
        + leased_moves
        + (ended is not None and not ended["ok"])
        + (result.get("clock_step") is not None and not result["clock_step"]["ok"])
    )


def write(p: Params, result: dict[str, Any]) -> Path:
    out = Path(p.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(result["started"]))
    path = out / f"{stamp}-{p.label}.json"
    text = json.dumps(result, indent=1, sort_keys=False, default=str) + "\n"
    path.write_text(text)
    (out / f"latest-{p.label}.json").write_text(text)
    result["path"] = str(path)
    return path


# -------------------------------------------------------------------------------- report
def table(result: dict[str, Any]) -> str:
    a, t = result["audit"], result["table"]
    lat = a["latency_ms"]
    o = a.get("outage") or {}
    load = result.get("load") or {}
    rows = [
        ("double allocations", a["double_allocations"]),
        ("in-region splits", a["in_region_splits"]),
        ("lost leases", a["lost_leases"]),
        ("table: free and leased", t["both_free_and_leased"]),
        ("table: key with 2 unexpired in region", t["keys_with_two_unexpired_in_region"]),
        ("table: live mapping, resource not held", t["live_mappings_not_held"]),
        ("table: orphans (not served; repaired later)", t["orphans"]),
        ("cross-region duplicates (allowed)", a["cross_region_duplicates"]),
    ]
    rep = result.get("replication")
    if rep is not None:
        rows += [
            ("replicas: resource leased to 2 keys", t["leased_to_two_keys_across_replicas"]),
            ("replicas: region differs / items differ", f"{t['regions_disagree']} / "
             f"{t['items_differ']} (settled {t.get('settled')})"),
            ("replication: lag set / p50 / p99 (s)", f"{rep.get('lag_s')} / "
             f"{rep.get('achieved_lag_p50_s')} / {rep.get('achieved_lag_p99_s')}"),
            ("replication: applied / LWW discarded / conflicts", f"{rep.get('applied')} / "
             f"{rep.get('lww_discarded')} / {rep.get('conflicts')}"),
        ]  # fmt: skip
    act = result.get("actors", {})
    bal = act.get("balancer", {})
    if bal.get("runs"):
        rows.append(
            ("balancer: runs / moved / in streams / leased", f"{bal.get('runs')} / "
             f"{bal.get('moved', 0)} / {bal.get('moves_in_streams')} / "
             f"{bal.get('leased_moves_in_streams')}")
        )  # fmt: skip
    if act.get("admin"):
        rows.append(("rasadmin", _codes(act["admin"], keep_ok=True)))
        rows.append(("refused: beyond the max lease", act.get("refused_beyond_max_lease")))
    agents = a.get("agents", {})
    if "paper" in agents:
        rows += [
            ("paper-only splits (the paper's race)", a["paper_only_splits"]),
            ("paper-only lost leases", a["paper_only_lost_leases"]),
            ("splits: second lease the paper's (its race)", a.get("paper_made_splits", "-")),
            ("lost leases: second lease the paper's", a.get("paper_made_lost_leases", "-")),
            ("  in-region splits whose acquisitions ran at once", a["in_region_splits_concurrent"]),
        ]
        for name, g in agents.items():
            rows.append(
                (f"{name}: calls / answered", f"{g['calls']} / {g['answered']} "
                 f"(p50 {g['latency_ms']['p50']} ms, p99 {g['latency_ms']['p99']} ms)")
            )  # fmt: skip
        rows.append(("paper: errors by code", _codes(agents["paper"]["outcomes"])))
    ended = result.get("end_rollout")
    if ended:
        rows += end_rollout_rows(ended)
    step = result.get("clock_step")
    if step:
        rows += [
            (f"daemon {step['daemon']}'s clock {step['step_s']:+g}s: untrusted after (s)",
             step["untrusted_after_s"]),
            ("  answered while stepped / refused for the clock", f"{step['answered_while_stepped']}"
             f" / {step['refused_for_the_clock']}"),
            ("  its log says why", step["logged"]),
        ]  # fmt: skip
    cut = result.get("partition")
    if cut:
        rows.append(
            (f"daemon {cut['daemon']} cut off from DynamoDB (s)", round(cut["to"] - cut["from"], 1))
        )
    budget = result.get("outage_budget")
    if budget:
        rows.append(
            (f"outage budget {budget['budget_s']:g}s (quarantine "
             f"{budget['pool_quarantine_s']:g}s): window answers by daemon",
             budget["window_answers"] or "none")
        )  # fmt: skip
    calls = "get_lease calls" + (" (rasd's; so are the rows below)" if "paper" in agents else "")
    rows += [
        (calls, a["calls"].get("get_lease", 0)),
        ("answered with a lease", a["answered_share"]),
        ("  from the hit table (no round trip)", a.get("from_table", 0)),
        ("  of calls that found a daemon", a["answered_share_daemon_up"]),
        ("calls that found no daemon (killed)", a["no_daemon"]),
        ("errors by code", _codes(a["outcomes"].get("get_lease", {}))),
        ("release outcomes", _codes(a["outcomes"].get("release", {}), keep_ok=True)),
        ("latency p50 / p99 (ms)", f"{lat['p50']} / {lat['p99']}"),
        (
            "outage calls / served from cache",
            f"{o.get('calls_inside')} / {o.get('served_from_cache')}",
        ),
        ("kill -9", result["kills"]),
        ("proxy faults", _codes(_faults(result["proxies"]["total"]))),
        ("jobs", json.dumps(result["jobs"], separators=(",", ":"))),
        (
            "load average (1 min): min / mean / max",
            " / ".join(str(load.get(k, "-")) for k in ("min", "mean", "max")),
        ),
        ("verdict", "PASS" if result["ok"] else "FAIL"),
    ]
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{w}}  {value}" for name, value in rows)


def end_rollout_rows(e: dict[str, Any]) -> list[tuple[str, Any]]:
    """The end of the rollout in the report; times in seconds into the traffic."""
    rec = e["record_at_end"]
    at_end = e["daemons_at_end"]
    return [
        ("end-rollout at (s): paper workers / liberator stopped",
         f"{e['at_s']:g}: {e.get('paper_workers_stopped_s')} (killed "
         f"{e.get('paper_workers_killed')}) / {e.get('paper_liberator_stopped_s')}"),
        ("  paper's last claim applied / its lease's end (s)",
         f"{e['paper_last_claim_s']} / {e['paper_last_lease_end_s']}"),
        ("  end-rollout attempts / refused / succeeded at (s)",
         f"{len(e['attempts'])} / {e['refusals']} / {e['succeeded_s']}"),
        ("  rollout record at the end", ("on" if rec["paper_agents"] else "off")
         + f" (version {rec['version']}, by {rec['by']}, {rec['why']})"),
        ("  daemons on the fast rules: all by (s); at the end",
         f"{e['all_daemons_off_s']}; off {at_end['off']}, on {at_end['on']}, "
         f"no answer {at_end['no_answer']}"),
    ]  # fmt: skip


def _codes(c: dict[str, int], keep_ok: bool = False) -> str:
    items = [(k, v) for k, v in sorted(c.items()) if keep_ok or k != "ok"]
    return ", ".join(f"{k} {v}" for k, v in items) or "-"


def _faults(total: dict[str, int]) -> dict[str, int]:
    return {k[6:]: v for k, v in total.items() if k.startswith("fault.") and k != "fault.none"}

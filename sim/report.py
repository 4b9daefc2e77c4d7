"""Figures of a simulation run, the comparison of the two runs, the table, the JSON and the plot."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from rasd.core.lease import parse_time

from . import traffic
from .world import PROBE, SKEW_MARGIN_S, Outcome, RunResult


def _rate(n: int, d: int) -> float | None:
    return round(n / d, 5) if d else None


def duplicates_from_audit(
    audit: list[dict[str, Any]],
    exclude_prefix: str = "probe-",
    pool: str | None = None,
    strict: bool = False,
) -> dict[str, Any]:
    """Keys that held two different resources at the same time, from the stream audit of
    every region's local writes (acquisitions, releases, mapping writes).

    A lease is a claim some mapping item named (docs/design.md: the mapping is the truth); a
    claim that lost the race for its key's mapping is never served and is given back, so it
    is not a duplicate (``claims_never_named`` counts them). Claims without a ``holder``
    (none in this simulation) are all counted, as before the mapping items existed.

    ``pool``: that pool's claims only (None: all). ``strict``: a strict pool's, where a claim
    is answered only once an agreement names it (or, by the home-down fallback, once its
    mapping is confirmed live): a pending mapping names claims that may lose the agreement
    and are given back unanswered."""
    maps = [e for e in audit if e["ev"] == "map"]
    if strict:
        named = {(e["token"], e["res"]) for e in audit if e["ev"] == "agree"}
        named |= {(e["token"], e["res"]) for e in maps if e["state"] == "live"}
    else:
        named = {(e["token"], e["res"]) for e in maps}
    claims = [
        e
        for e in audit
        if e["ev"] == "acq"
        and not e["key"].startswith(exclude_prefix)
        and (pool is None or e.get("pool") == pool)
    ]
    acqs = [e for e in claims if e.get("holder") is None or (e["holder"], e["res"]) in named]
    rels: dict[str, list[int]] = defaultdict(list)
    for e in audit:
        if e["ev"] == "rel":
            rels[e["res"]].append(e["t"])
    for v in rels.values():
        v.sort()
    by_key: dict[str, list[tuple[int, int, str, str]]] = defaultdict(list)
    for e in acqs:
        end = parse_time(e["exp"]) // 1000 if e.get("exp") else e["t"]
        later = [t for t in rels[e["res"]] if t >= e["t"]]
        if later:
            end = min(end, later[0])
        by_key[e["key"]].append((e["t"], end, e["res"], e.get("region") or ""))
    dup_keys = []
    for k, ivs in by_key.items():
        ivs.sort()
        if any(a[2] != b[2] and b[0] < a[1] for i, a in enumerate(ivs) for b in ivs[i + 1 :]):
            dup_keys.append(k)
    return {
        "keys_acquired": len(by_key),
        "duplicate_keys": len(dup_keys),
        "keys": sorted(dup_keys),
        "intervals": {k: sorted(v) for k, v in by_key.items()},
        "claims_never_named": len(claims) - len(acqs),
    }


def duplicates_from_clients(outcomes: list[Outcome], lease_s: float) -> dict[str, Any]:
    """Keys the clients saw answered two different resources in two regions while both
    leases ran: a key's second-region answer (OK) of another resource than its first answer
    (OK), both received before either lease's end. An answer was given before it arrived
    and its lease runs to the end it names, so at the later arrival both leases ran: a sure
    double answer, however late the driver or the daemons were.

    Not counted: the first resource answered again (one lease, whatever the ``new`` flag
    says), and an answer that arrived after the first lease's end. The schedule puts every
    second request within a lease of the first (its ``gap``), but under load the driver
    sends late and the daemons answer late, so a second request can come after the first
    lease is over, and then a new lease is right (a strict pool takes the key's agreement
    over). An answer of another resource while the first runs counts whatever its ``new``
    flag: the promise is about resources. ``rows``: every second-region answer of another
    resource, with its times and ``overlap`` (counted or not), to read a disagreement with
    the audit. ``lease_s``: the lease asked, for outcomes without the end answered."""
    firsts = {o.key: o for o in outcomes if o.first and o.code == "OK"}
    rows: list[dict[str, Any]] = []
    for o in outcomes:
        f = firsts.get(o.key)
        if o.first or o.code != "OK" or f is None or o.region == f.region:
            continue
        if o.resource == f.resource:
            continue
        f_end, o_end = f.ends or f.sent + lease_s, o.ends or o.sent + lease_s
        both_answered = max(f.done, o.done)
        rows.append(
            {
                "key": o.key,
                "regions": [f.region, o.region],
                "resources": [f.resource, o.resource],
                "new": o.new,
                "gap": round(o.gap, 3),
                "first": [round(f.sent, 3), round(f.done, 3), round(f_end, 3)],
                "second": [round(o.sent, 3), round(o.done, 3), round(o_end, 3)],
                "overlap": both_answered < min(f_end, o_end),
            }
        )
    keys = sorted({str(r["key"]) for r in rows if r["overlap"]})
    return {"duplicate_keys": len(keys), "keys": keys, "rows": rows}


#: the share of requests that may fail for reasons other than capacity (an overloaded
#: backend: TIMEOUT, UNAVAILABLE, BUSY...) in a run that measures the protocol
MAX_BACKEND_ERROR_RATE = 0.01
#: how far the achieved replication lag (p99) may exceed the configured one in a valid run
MAX_LAG_FACTOR = 1.5


def predict_duplicates(
    outcomes: list[Outcome], lease_s: float, lag_lo_s: float, lag_hi_s: float, margin_s: float
) -> dict[str, Any]:
    """How many keys the traffic itself maps twice, from the requests as they were made:
    a pure function of the outcomes, the lease and the lag.

    A key is mapped twice when its second region's request (answered OK, after a first one
    answered OK) either

    * **races replication**: it is sent before the first region's lease has replicated there,
      so the second region sees no lease and acquires its own. The first lease is written
      between the first request's send and its answer, and reaches the second region that
      write plus the lag later: certain within ``lag_lo_s`` of the first request's send, possible
      within ``lag_hi_s`` of its answer; or
    * **meets a lease about to end**: it comes with less than ``margin_s`` (the daemons'
      ``skew_margin``) left on the first lease, which the second region then does not serve
      (it never extends another region's lease) and acquires its own, overlapping the first
      for under ``margin_s``: certain when the second answer came before the first lease's
      end, possible when only its request did.

    Returns the low and high predictions (keys) and each key's reason."""
    first: dict[str, Outcome] = {}
    for o in outcomes:
        if o.first and o.code == "OK":
            first[o.key] = o
    lo = hi = 0
    why: dict[str, str] = {}
    for o in outcomes:
        f = first.get(o.key)
        if o.first or o.code != "OK" or f is None:
            continue
        since_sent, since_done = o.sent - f.sent, o.sent - f.done
        if since_sent >= lease_s - margin_s:
            # the first lease ends ``lease_s`` after the first request's send: the second
            # claim overlaps it for sure only if it was answered before that end
            if o.done - f.sent < lease_s:
                lo, hi, why[o.key] = lo + 1, hi + 1, "lease_end"
            elif since_sent < lease_s:
                hi, why[o.key] = hi + 1, "lease_end?"
        elif since_sent < lag_lo_s:
            lo, hi, why[o.key] = lo + 1, hi + 1, "replication"
        elif since_done < lag_hi_s:
            hi, why[o.key] = hi + 1, "replication?"
    return {"low": lo, "high": hi, "why": why}


def validity(run: dict[str, Any], lag_s: float) -> dict[str, Any]:
    """Whether a run measured the protocol rather than an overloaded backend: the achieved
    replication lag within MAX_LAG_FACTOR of the configured one at p99, and fewer than
    MAX_BACKEND_ERROR_RATE of the requests failed for another reason than capacity."""
    p99 = run["replicator"].get("achieved_lag_p99_s")
    errors = _other(run)
    reqs = run["requests"]
    limit = round(lag_s * MAX_LAG_FACTOR, 3)
    why = []
    if p99 is None or p99 > limit:
        why.append(f"replication lag p99 {p99} s > {limit} s")
    if not reqs or errors >= MAX_BACKEND_ERROR_RATE * reqs:
        why.append(f"{errors} of {reqs} requests failed for another reason than capacity")
    return {
        "lag_p99_s": p99,
        "lag_limit_s": limit,
        "backend_errors": errors,
        "requests": reqs,
        "backend_error_rate": _rate(errors, reqs),
        "valid": not why,
        "why": why,
    }


def analyze(res: RunResult, scn: traffic.Scenario, buckets: int = 48) -> dict[str, Any]:
    p = res.params
    regions = list(scn.names)
    outs = [o for o in res.outcomes if not o.key.startswith(PROBE)]
    per: dict[str, dict[str, Any]] = {}
    for r in regions:
        mine = [o for o in outs if o.region == r]
        codes = Counter(o.code for o in mine)
        first = [o for o in mine if o.first]
        miss_first = sum(1 for o in first if o.code == "NO_CAPACITY")
        per[r] = {
            "requests": len(mine),
            "new_key_requests": len(first),
            "ok": codes["OK"],
            "no_capacity": codes["NO_CAPACITY"],
            "no_capacity_rate": _rate(codes["NO_CAPACITY"], len(mine)),
            "no_capacity_new_keys": miss_first,
            "other_errors": {c: n for c, n in codes.items() if c not in ("OK", "NO_CAPACITY")},
            "daemon_counters": res.daemon_stats.get(r, {}),
            "initial_items": res.initial_split.get(r, 0),
            "final_items": res.end.get("items_per_region_end", {}).get(r),
        }
    total_req = sum(v["requests"] for v in per.values())
    total_miss = sum(v["no_capacity"] for v in per.values())
    bal = [j for j in res.jobs if j.get("job") == "balancer"]
    lib = [j for j in res.jobs if j.get("job") == "liberator"]
    # duplicates
    first_ok = {o.key for o in outs if o.first and o.code == "OK"}
    seconds = [o for o in outs if not o.first]
    lease_s = float(p["lease_s"])
    # the clients' witness: second-region answers of another resource while both leases ran
    clients_keys = set(duplicates_from_clients(outs, lease_s)["keys"])
    dup_driver = [o for o in seconds if o.code == "OK" and o.key in clients_keys]
    eligible = [o for o in seconds if o.key in first_ok]
    new_keys = len({o.key for o in outs if o.first})
    audit_d = duplicates_from_audit(res.audit)
    gaps_dup = sorted(o.gap for o in dup_driver)
    gaps_nodup = sorted(o.gap for o in eligible if o not in dup_driver and o.code == "OK")
    lag_s = float(p["lag_s"])
    rep_p99 = (res.replicator or {}).get("achieved_lag_p99_s") or lag_s
    pred = predict_duplicates(outs, lease_s, lag_s, max(lag_s, rep_p99), SKEW_MARGIN_S)
    moves_audit = [e for e in res.audit if e["ev"] == "move"]
    leased_moves = [e for e in moves_audit if e["leased"]]
    out: dict[str, Any] = {
        "mode": "balancer" if p["balancer"] else "static",
        "wall_s": res.wall_s,
        "resources": res.resources,
        "miss_reporter": res.miss_reporter,
        "regions": per,
        "requests": total_req,
        "no_capacity": total_miss,
        "no_capacity_rate": _rate(total_miss, total_req),
        # answered while the region held an item claimable all along (sim.capacity): 0
        "no_capacity_while_claimable": res.end.get("no_capacity_while_claimable"),
        "balancer": {
            "runs": len(bal),
            "ok_runs": sum(1 for j in bal if j.get("status") == "ok"),
            "errors": [j.get("error") for j in bal if j.get("status") == "error"][:3],
            "moved": sum(int(j.get("moved", 0)) for j in bal),
            "lost_races": sum(int(j.get("lost_races", 0)) for j in bal),
            "misses_seen": sum(int(j.get("misses", 0)) for j in bal),
            "mean_seconds": round(sum(j.get("seconds", 0) for j in bal) / len(bal), 3)
            if bal
            else None,
        },
        "liberator": {
            "runs": len(lib),
            "freed": sum(int(j.get("freed", 0)) for j in lib),
            "errors": sum(int(j.get("errors", 0)) for j in lib)
            + sum(1 for j in lib if j.get("status") == "error"),
        },
        "balancer_trace": [
            {
                k: j.get(k)
                for k in (
                    "t",
                    "moved",
                    "moves_planned",
                    "misses",
                    "acquisitions",
                    "releases",
                    "lost_races",
                    "seconds",
                )
            }
            for j in bal
        ],
        "moves_in_streams": len(moves_audit),
        "leased_items_moved": len(leased_moves),
        "replicator": res.replicator,
        "duplicates": {
            "new_keys": new_keys,
            "second_region_requests": len(seconds),
            "second_requests_after_a_lease": len(eligible),
            "duplicate_keys_driver": len(dup_driver),
            "duplicate_keys_audit": audit_d["duplicate_keys"],
            "claims_never_named": audit_d["claims_never_named"],
            "rate_of_new_keys": _rate(audit_d["duplicate_keys"], new_keys),
            "gap_s_of_duplicates_max": round(gaps_dup[-1], 3) if gaps_dup else None,
            "gap_s_of_non_duplicates_min": round(gaps_nodup[0], 3) if gaps_nodup else None,
            "second_requests_within_1s": sum(1 for o in eligible if o.gap < 1.0),
            # the table's audit decides (claims that overlapped in time); the clients' view
            # (a second region answered another resource while both leases ran:
            # duplicates_from_clients) cross-checks it, and each key only one of them saw is
            # listed with its claims
            "duplicate_keys": audit_d["duplicate_keys"],
            "audit_only": sorted(set(audit_d["keys"]) - {o.key for o in dup_driver}),
            "driver_only": [
                {
                    "key": o.key,
                    "region": o.region,
                    "gap": round(o.gap, 3),
                    "resource": o.resource,
                    "claims": audit_d["intervals"].get(o.key),
                    "first": [
                        (f.region, f.resource, round(f.sent, 3), round(f.done, 3))
                        for f in outs
                        if f.first and f.key == o.key
                    ],
                    "second_sent": round(o.sent, 3),
                    "second_done": round(o.done, 3),
                }
                for o in dup_driver
                if o.key not in set(audit_d["keys"])
            ],
            "predicted_low": pred["low"],
            "predicted_high": pred["high"],
            "predicted_why": pred["why"],
            "driver_keys_by_reason": dict(
                Counter(pred["why"].get(o.key, "unpredicted") for o in dup_driver)
            ),
        },
        "end": res.end,
        "timeline": timeline(res, regions, buckets),
    }
    out["validity"] = validity(out, lag_s)
    return out


def timeline(res: RunResult, regions: list[str], buckets: int) -> dict[str, Any]:
    """Per bucket of simulated time: demand (new keys per real second), allocation (items
    assigned, sampled), leased (sampled) and misses, per region."""
    day_s = float(res.params["day_s"])
    width = day_s / buckets
    hours = [round((i + 0.5) * 24 / buckets, 3) for i in range(buckets)]
    demand = {r: [0.0] * buckets for r in regions}
    misses = {r: [0] * buckets for r in regions}
    for o in res.outcomes:
        if o.key.startswith("probe-"):
            continue
        i = min(buckets - 1, int(o.t // width))
        if o.first:
            demand[o.region][i] += 1 / width
        if o.code == "NO_CAPACITY":
            misses[o.region][i] += 1
    alloc: dict[str, list[float | None]] = {r: [None] * buckets for r in regions}
    leased: dict[str, list[float | None]] = {r: [None] * buckets for r in regions}
    acc: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for row in res.samples:
        i = int(row["t"] // width)
        if i >= buckets:
            continue
        for r in regions:
            if r in row:
                acc[(r, i)].append((row[r]["items"], row[r]["leased"]))
    for (r, i), vals in acc.items():
        alloc[r][i] = round(sum(v[0] for v in vals) / len(vals), 2)
        leased[r][i] = round(sum(v[1] for v in vals) / len(vals), 2)
    return {
        "sim_hour": hours,
        "demand_keys_per_s": {r: [round(x, 3) for x in v] for r, v in demand.items()},
        "allocation": alloc,
        "leased": leased,
        "misses": misses,
    }


# --------------------------------------------------------------------------------- output
def verdicts(bal: dict[str, Any], static: dict[str, Any] | None, lag: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, run in (("balancer", bal), ("static", static)):
        if run is not None:
            v = run["validity"]
            out[f"valid_run_{name}"] = {
                "lag_p99_s": v["lag_p99_s"],
                "limit_s": v["lag_limit_s"],
                "backend_errors": v["backend_errors"],
                "requests": v["requests"],
                "met": v["valid"],
            }
    for name, run in (("balancer", bal), ("static", static)):
        if run is None:
            continue
        d = run["duplicates"]
        measured = d["duplicate_keys"]
        out[f"duplicates_within_prediction_{name}"] = {
            "measured": measured,
            "predicted_low": d["predicted_low"],
            "predicted_high": d["predicted_high"],
            "rate_of_new_keys": d["rate_of_new_keys"],
            "met": d["predicted_low"] <= measured <= d["predicted_high"],
        }
    out["one_dedupe_leaves_only_explained"] = _dedupe_verdict(bal["end"])
    if static is not None:
        sb, ss = bal["no_capacity"], static["no_capacity"]
        out["misses_balancer_le_one_fifth_static"] = {
            "balancer": sb,
            "static": ss,
            "ratio": round(sb / ss, 4) if ss else None,
            "met": ss > 0 and sb * 5 <= ss,
            # every failed request, capacity or not (TIMEOUT/BUSY/UNAVAILABLE: overload)
            "all_failures_balancer": sb + _other(bal),
            "all_failures_static": ss + _other(static),
        }
    for name, run in (("balancer", bal), ("static", static)):
        if run is not None:
            n = run.get("no_capacity_while_claimable")
            out[f"no_capacity_only_when_nothing_claimable_{name}"] = {
                "no_capacity": run["no_capacity"],
                "while_claimable": n,
                "met": n == 0,
            }
    out["no_leased_item_moved"] = {
        "leased_items_moved": bal["leased_items_moved"],
        "met": bal["leased_items_moved"] == 0 and bal["replicator"].get("leased_moves", 0) == 0,
    }
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdicts over several seeds (each ``runs`` entry: one seed's ``verdicts``,
    ``balancer`` and ``static``): every run valid; the balancer's NO_CAPACITY answers, summed,
    at most a fifth of the static split's; and every per-seed verdict met in every seed."""
    out: dict[str, Any] = {}
    valid = all(r[m]["validity"]["valid"] for r in runs for m in ("balancer", "static") if r[m])
    statics = [r for r in runs if r["static"] is not None]
    if statics:
        sb = sum(r["balancer"]["no_capacity"] for r in statics)
        ss = sum(r["static"]["no_capacity"] for r in statics)
        out["misses_balancer_le_one_fifth_static"] = {
            "balancer": sb,
            "static": ss,
            "ratio": round(sb / ss, 4) if ss else None,
            "per_seed": [
                r["verdicts"]["misses_balancer_le_one_fifth_static"]["ratio"] for r in statics
            ],
            "met": ss > 0 and sb * 5 <= ss,
        }
    names = [k for k in runs[0]["verdicts"] if k != "misses_balancer_le_one_fifth_static"]
    for k in names:
        missed = [r["params"]["seed"] for r in runs if not r["verdicts"][k]["met"]]
        out[k] = {"seeds_missed": missed, "met": not missed}
    for m in ("balancer", "static"):
        ds = [r[m]["duplicates"] for r in runs if r[m] is not None]
        if ds:
            out[f"duplicates_{m}_totals"] = {
                "measured": sum(d["duplicate_keys"] for d in ds),
                "predicted_low": sum(d["predicted_low"] for d in ds),
                "predicted_high": sum(d["predicted_high"] for d in ds),
                "new_keys": sum(d["new_keys"] for d in ds),
                "met": all(
                    d["predicted_low"] <= d["duplicate_keys"] <= d["predicted_high"] for d in ds
                ),
            }
    return {"valid": valid, "verdicts": out}


def _dedupe_verdict(end: dict[str, Any]) -> dict[str, Any]:
    """One ``ras-dedupe`` run leaves only extras it keeps on purpose, each explained
    (``sim.world.explain_left``: its survivor does not outlast it by what dedupe requires),
    in every replica. The staggered probe keys make it release some (``released``)."""
    after = end.get("duplicate_keys_after_dedupe", {})
    rows = end.get("left_explained", [])
    left_keys = {r["key"] for r in rows}
    return {
        "before": end.get("duplicate_keys_before_dedupe"),
        "released": end.get("dedupe", {}).get("released"),
        "after": after,
        "left_explained": sum(1 for r in rows if r["explained"]),
        "left_unexplained": sum(1 for r in rows if not r["explained"]),
        "met": bool(after)
        and all(n == len(left_keys) for n in after.values())
        and all(r["explained"] for r in rows),
    }


def _other(run: dict[str, Any]) -> int:
    return sum(sum(v["other_errors"].values()) for v in run["regions"].values())


def table(bal: dict[str, Any], static: dict[str, Any] | None) -> str:
    lines = []
    regions = list(bal["regions"])
    hdr = f"{'':28}" + "".join(f"{r:>14}" for r in regions) + f"{'total':>14}"
    lines.append(hdr)
    for name, run in (("balancer", bal), ("static split", static)):
        if run is None:
            continue
        cells = [
            f"{run['regions'][r]['no_capacity']}/{run['regions'][r]['requests']}" for r in regions
        ]
        tot = f"{run['no_capacity']}/{run['requests']}"
        lines.append(
            f"{'NO_CAPACITY ' + name:28}" + "".join(f"{c:>14}" for c in cells) + f"{tot:>14}"
        )
        rates = [run["regions"][r]["no_capacity_rate"] or 0 for r in regions]
        lines.append(
            f"{'  rate':28}"
            + "".join(f"{x * 100:>13.2f}%" for x in rates)
            + f"{(run['no_capacity_rate'] or 0) * 100:>13.2f}%"
        )
    lines.append(
        f"{'  while claimable':28}"
        + f"{bal.get('no_capacity_while_claimable')} (balancer)"
        + (
            f", {static.get('no_capacity_while_claimable')} (static split)"
            if static is not None
            else ""
        )
    )
    for name, run in (("balancer", bal), ("static split", static)):
        if run is None:
            continue
        other: Counter[str] = Counter()
        for r in regions:
            other.update(run["regions"][r]["other_errors"])
        if other:
            lines.append(f"other errors, {name}: {dict(other)} (overloaded backends, not capacity)")
    lines.append(
        f"{'items end (balancer)':28}"
        + "".join(f"{bal['regions'][r]['final_items'] or 0:>14}" for r in regions)
        + f"{bal['resources']:>14}"
    )
    d = bal["duplicates"]
    lines.append(
        f"moved by the balancer: {bal['balancer']['moved']} in {bal['balancer']['runs']} runs; "
        f"leased items moved: {bal['leased_items_moved']}"
    )
    kept = [r for r in bal["end"].get("left_explained", []) if r["explained"]]
    lines.append(
        f"end of run: {bal['end'].get('duplicate_keys_before_dedupe')} duplicate keys before "
        f"ras-dedupe, {bal['end'].get('duplicate_keys_after_dedupe')} after "
        f"({len(kept)} extras kept on purpose: survivor outlasts them by less than "
        f"{kept[0]['needs_s'] if kept else '-'} s)"
    )
    lines.append(
        f"as daemons see leases (mapping items): "
        f"{bal['end'].get('duplicate_keys_by_mapping_before_dedupe')} duplicate keys before "
        f"ras-dedupe, {bal['end'].get('duplicate_keys_by_mapping_after_dedupe')} after; "
        f"claims no mapping named: {d.get('claims_never_named')}, "
        f"held items no mapping names at the end: "
        f"{bal['end'].get('held_items_no_mapping_names_end')}"
    )
    rep = bal["replicator"]
    lines.append(
        f"replication: lag {rep.get('lag_s')} s, achieved p50 {rep.get('achieved_lag_p50_s')} "
        f"p99 {rep.get('achieved_lag_p99_s')} s, applied {rep.get('applied')}, "
        f"conflicts {rep.get('conflicts')}, converged {bal['end'].get('converged_after_dedupe')}"
    )
    for name, run in (("balancer", bal), ("static split", static)):
        if run is None:
            continue
        dd, v = run["duplicates"], run["validity"]
        lines.append(
            f"duplicates, {name}: {dd['duplicate_keys']} of {dd['new_keys']} new keys "
            f"({(dd['rate_of_new_keys'] or 0) * 100:.3f}%; table audit "
            f"{dd['duplicate_keys_audit']}, clients {dd['duplicate_keys_driver']}); "
            f"the traffic predicts {dd['predicted_low']}-{dd['predicted_high']}"
        )
        lines.append(
            f"{'VALID' if v['valid'] else 'INVALID'} run, {name}: replication p99 "
            f"{v['lag_p99_s']} s (limit {v['lag_limit_s']}), {v['backend_errors']} of "
            f"{v['requests']} requests failed for another reason than capacity"
            + (f": {'; '.join(v['why'])}" if v["why"] else "")
        )
    return "\n".join(lines)


def plot(bal: dict[str, Any], static: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regions = list(bal["regions"])
    runs = [("balancer", bal)] + ([("static split", static)] if static else [])
    fig, axes = plt.subplots(
        len(regions),
        len(runs),
        figsize=(6.5 * len(runs), 2.6 * len(regions)),
        sharex=True,
        squeeze=False,
    )
    for j, (name, run) in enumerate(runs):
        tl = run["timeline"]
        x = tl["sim_hour"]
        for i, r in enumerate(regions):
            ax = axes[i][j]
            for series, label, color in (
                (tl["allocation"][r], "items in region", "tab:blue"),
                (tl["leased"][r], "leased", "tab:green"),
            ):  # buckets without a sample (a slow scan) are skipped, not drawn as gaps
                pts = [(a, b) for a, b in zip(x, series, strict=True) if b is not None]
                ax.plot([a for a, _ in pts], [b for _, b in pts], label=label, color=color)
            ax2 = ax.twinx()
            ax2.plot(
                x,
                tl["demand_keys_per_s"][r],
                label="demand (new keys/s)",
                color="tab:gray",
                linestyle="--",
            )
            ax.bar(
                x,
                tl["misses"][r],
                width=0.4,
                color="tab:red",
                alpha=0.7,
                label="NO_CAPACITY",
            )
            ax.set_title(f"{name}: {r}", fontsize=9)
            ax.set_ylabel("items / misses", fontsize=8)
            ax2.set_ylabel("keys/s", fontsize=8)
            if i == 0 and j == 0:
                h1, l1 = ax.get_legend_handles_labels()
                h2, l2 = ax2.get_legend_handles_labels()
                ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
        axes[-1][j].set_xlabel("simulated UTC hour")
        axes[-1][j].set_xticks(range(0, 25, 3))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(out: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")

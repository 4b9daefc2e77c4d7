"""python -m bench --quick|--full [--scenarios a,...,h,s] [--delay-ms 3.5] [--backend moto|dynalite]

Runs rasd and the baseline (the paper's in-process boto3 agent) against a DynamoDB stand-in
behind a delay proxy, prints a table, writes ``bench/results/<stamp>-<mode>.json`` (and
``latest-<mode>.json``) and PNG plots. Targets are goals reported as met/missed, never asserted.
Scenario (s) is ``bench.spawn``: spawn to first answer and daemon CPU per new lease. The
targets table (every figure from this one run) is printed last and kept under ``targets``:
``make bench-targets`` runs it in full on dynalite. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Any

from fleet.backends import BackendUnavailable, dynalite_status, install_dynalite
from fleet.proxytest import self_test

from . import highuse, report, scenarios, spawn
from .harness import CLIENT, POOL, REGION, Env

QUICK: dict[str, Any] = {
    "abc_per_batch": 100,
    "abc_batches": 1,
    "a_samples": 3000,
    "a_baseline_samples": 200,
    "d_procs": [1, 8, 32],
    "d_seconds": 1.5,
    "d_rounds": 1,
    "e_sizes": [1_000, 10_000],
    "e_samples": 50,
    "f_daemons": 20,
    "f_keys_per_daemon": 8,
    "f_shared_keys": 10,
    "f_inflight": 2,
    "g_leases": 500,
    "g_inflight": 16,
    "import_runs": 10,
    "s_runs": 5,
    "s_leases": 200,
    # (h), a pool near full: run only when named (--scenarios h), on dynalite
    "h_daemons": [8, 16],
    "h_uses": [50, 90, 98],
    "h_pool": 200,
    "h_warm": 9,
    "h_measure": 15,
}
FULL: dict[str, Any] = {
    **QUICK,
    "abc_batches": 4,
    "a_samples": 20000,
    "a_baseline_samples": 400,
    "d_seconds": 3.0,
    "d_rounds": 3,
    "e_sizes": [1_000, 10_000, 100_000],
    "e_samples": 150,
    "f_keys_per_daemon": 30,
    "f_shared_keys": 30,
    "g_leases": 100_000,
    "g_inflight": 128,
    "import_runs": 30,
    "s_runs": 7,
    "s_leases": 500,
    "h_daemons": [8, 16, 32],
    "h_measure": 40,
}


def calibrate(env: Env, n: int) -> dict[str, Any]:
    """One DynamoDB round trip as this run sees it: a Query on a small table, direct to the
    backend (its service time) and through the proxy (service time + modelled network)."""
    import boto3

    from .baseline import BaselineAgent

    table = env.new_table(resources=50, prefix="cal")
    try:
        direct = BaselineAgent(table, REGION, env.backend.endpoint)
        proxied = BaselineAgent(table, REGION, env.endpoint)
        exp = int((time.time() + 3600) * 1e6)
        direct.get_lease(CLIENT, POOL, "cal", exp)
        out: dict[str, Any] = {}
        for name, ag in (("direct", direct), ("proxied", proxied)):
            ag.lookup(CLIENT, POOL, "cal", 0)
            xs = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                ag.lookup(CLIENT, POOL, "cal", 0)
                xs.append(time.perf_counter_ns() - t0)
            out[name] = report.summarize_ns(xs)
        # a brand-new connection pays the modelled handshakes
        fresh = []
        for _ in range(5):
            c = boto3.client("dynamodb", endpoint_url=env.endpoint, region_name=REGION)
            t0 = time.perf_counter_ns()
            c.describe_table(TableName=table)
            fresh.append((time.perf_counter_ns() - t0) / 1e6)
            c.close()
        out["new_connection_first_call_ms"] = sorted(fresh)[len(fresh) // 2]
    finally:
        env.drop_table(table)
    return out


def verdicts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    sc = doc["scenarios"]
    # One round trip = the baseline's existing-lease Query in (b): same table, same moment,
    # so it carries the backend's real service time at that table size.
    rt = (sc.get("b") or {}).get("baseline", {}).get("p50_ms")
    out: list[dict[str, Any]] = []

    def add(t: str, goal: str, met: bool | None, measured: str) -> None:
        out.append({"target": t, "goal": goal, "met": met, "measured": measured})

    a = sc.get("a")
    if a and "rasd" in a:
        r = a["rasd"]
        add("a", "p50 <= 0.1 ms", r["p50_ms"] <= 0.1, f"p50 {r['p50_ms']:.3f} ms")
        add("a", "p99 <= 0.5 ms", r["p99_ms"] <= 0.5, f"p99 {r['p99_ms']:.3f} ms")
        add("a", ">= 50x baseline (p50)", a["speedup_p50"] >= 50, f"{a['speedup_p50']:.0f}x")
    b = sc.get("b")
    if b and "rasd" in b:
        st = b.get("rasd_store") or {}
        if st.get("requests"):
            rts = st["round_trips_per_request"]
            add(
                "b",
                "one round trip (at the store boundary)",
                rts <= 1.0 + 1e-9,
                f"{rts:.2f} round trips, {st['calls_per_request']:.2f} calls per request "
                f"(daemon counters: {b['rasd_ddb_calls_per_request']:.2f} calls/request)",
            )
        if rt:
            lim = rt + 1.0
            add(
                "b",
                f"p50 <= 1 RT + 1 ms = {lim:.2f} ms",
                b["rasd"]["p50_ms"] <= lim,
                f"p50 {b['rasd']['p50_ms']:.2f} ms (baseline {b['baseline']['p50_ms']:.2f})",
            )
    c = sc.get("c")
    if c and "rasd" in c:
        st = c.get("rasd_store") or {}
        if st.get("requests"):
            rts = st["round_trips_per_request"]
            add(
                "c",
                "two round trips (at the store boundary)",
                rts <= 2.0 + 1e-9,
                f"{rts:.2f} round trips (requests by round trips: {st['round_trips_hist']}; "
                f"extra rounds are lost races for a candidate, prefetch.conflicts "
                f"{c.get('rasd_counters', {}).get('prefetch.conflicts', 0)}), "
                f"{st['calls_per_request']:.2f} calls per request "
                f"+ {st['background_calls_per_request']:.2f} in the background",
            )
        if rt:
            lim = 2 * rt + 2.0
            add(
                "c",
                f"p50 <= 2 RT + 2 ms = {lim:.2f} ms",
                c["rasd"]["p50_ms"] <= lim,
                f"p50 {c['rasd']['p50_ms']:.2f} ms, p99 {c['rasd']['p99_ms']:.2f} ms",
            )
        add(
            "c",
            ">= 1.4x faster than baseline (p50)",
            c["speedup_p50"] >= 1.4,
            f"{c['speedup_p50']:.2f}x (baseline p50 {c['baseline']['p50_ms']:.2f} ms)",
        )
    d = sc.get("d")
    if d and d.get("points"):
        p8 = [p for p in d["points"] if p["procs"] == 8]
        if p8:
            add(
                "d",
                ">= 70% of IPC floor at 8 procs",
                p8[0]["ratio"] >= 0.7,
                f"{p8[0]['ratio']:.0%} ({p8[0]['rasd_calls_per_s']:,.0f} vs "
                f"{p8[0]['echo_calls_per_s']:,.0f} calls/s)",
            )
    e = sc.get("e")
    if e and e.get("points"):
        sizes = [p["per_subpartition"] for p in e["points"]]
        full_range = min(sizes) <= 1000 and max(sizes) >= 100_000
        spread = e["rasd_p50_spread"]
        add(
            "e",
            "flat within 10% from 1K to 100K" + ("" if full_range else " (partial range)"),
            spread <= 0.10 if full_range else None,
            f"p50 spread {spread:.1%} over {', '.join(f'{s:,}' for s in sizes)}",
        )
    f = sc.get("f")
    if f and "conflicts_per_acquisition" in f:
        add(
            "f",
            "conflicts <= 2% per acquisition",
            f["conflicts_per_acquisition"] <= 0.02,
            f"{f['conflicts_per_acquisition']:.2%}",
        )
        add(
            "f",
            "prefetch hits >= 95%",
            f["prefetch_hit_rate"] >= 0.95,
            f"{f['prefetch_hit_rate']:.1%}",
        )
        add("f", "0 double allocations", f["double_allocations"] == 0, f"{f['double_allocations']}")
    g = sc.get("g")
    if g and "rss_mb_full" in g:
        measured_100k = g["cached_leases"] >= 100_000
        val = g["rss_mb_full"] if measured_100k else g["rss_mb_at_100k_extrapolated"]
        add(
            "g",
            "RSS <= 80 MB with 100K cached leases" + ("" if measured_100k else " (extrapolated)"),
            val <= 80 if measured_100k else None,
            f"{val:.1f} MB"
            + ("" if measured_100k else f" extrapolated from {g['cached_leases']:,} leases"),
        )
        add(
            "g",
            "client import <= 30 ms",
            g["import"]["p50_ms"] <= 30,
            f"{g['import']['p50_ms']:.1f} ms",
        )
    return out


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets table: each figure, its target, and whether this run met it."""
    sc = doc["scenarios"]
    out: list[dict[str, Any]] = []

    def add(figure: str, target: str, met: bool | None, measured: str, src: str) -> None:
        out.append(
            {"figure": figure, "target": target, "met": met, "measured": measured, "from": src}
        )

    s = sc.get("s") or {}
    if "cpu_per_new_lease_ms" in s:
        v = s["cpu_per_new_lease_ms"]
        add(
            f"daemon CPU per new lease ({s['backend']}, no added latency)",
            "<= 1.5 ms",
            v <= 1.5,
            f"{v:.2f} ms ({s['leases']} leases, one after another)",
            "s",
        )
    c = sc.get("c") or {}
    if "speedup_p50" in c:
        add(
            f"new lease p50 at {2 * doc['delay_ms']:g} ms RTT vs the paper-style baseline",
            ">= 2.5x",
            c["speedup_p50"] >= 2.5,
            f"{c['speedup_p50']:.2f}x ({c['rasd']['p50_ms']:.1f} vs "
            f"{c['baseline']['p50_ms']:.1f} ms)",
            "c",
        )
    f = sc.get("f") or {}
    if "conflicts_per_acquisition" in f:
        ok = f["conflicts_per_acquisition"] <= 0.02 and f["prefetch_hit_rate"] >= 0.95
        add(
            f"conflicts / prefetch hits, {doc['options']['f_daemons']} daemons on one pool "
            f"({f.get('backend', '?')})",
            "<= 2 % / >= 95 %",
            ok and f["double_allocations"] == 0,
            f"{f['conflicts_per_acquisition']:.1%} / {f['prefetch_hit_rate']:.1%}, "
            f"{f['double_allocations']} double allocations",
            "f",
        )
    g = sc.get("g") or {}
    if "rss_mb_full" in g:
        at_100k = g["cached_leases"] >= 100_000
        v = g["rss_mb_full"] if at_100k else g["rss_mb_at_100k_extrapolated"]
        add(
            "RSS at 100K cached leases",
            "<= 80 MB",
            v <= 80,
            f"{v:.1f} MB"
            + (
                f" ({g['cached_leases']:,} leases cached)"
                if at_100k
                else f" extrapolated from {g['cached_leases']:,} leases"
            ),
            "g",
        )
    if "spawn_to_first_new_lease_s" in s:
        sp = s["spawn_to_first_new_lease_s"]
        add(
            "spawn to first answer (a new lease)",
            "<= 0.5 s",
            sp["median"] <= 0.5,
            f"{sp['median']:.2f} s median of {len(sp['runs'])} ({sp['min']:.2f}-{sp['max']:.2f})",
            "s",
        )
    d = sc.get("d") or {}
    pts = {p["procs"]: p for p in d.get("points", [])}
    if 8 in pts and 32 in pts:
        r8, r32 = pts[8]["ratio"], pts[32]["ratio"]
        add(
            "cached-hit throughput from 8 / 32 client processes, share of the echo floor",
            ">= 90 % / >= 80 %",
            r8 >= 0.9 and r32 >= 0.8,
            f"{r8:.0%} / {r32:.0%}",
            "d",
        )
    e = sc.get("e") or {}
    if e.get("points"):
        sizes = [p["per_subpartition"] for p in e["points"]]
        full_range = min(sizes) <= 1000 and max(sizes) >= 100_000
        add(
            "new-lease latency from 1K to 100K resources per sub-partition",
            "flat within 10 %",
            e["rasd_p50_spread"] <= 0.10 if full_range else None,
            f"p50 spread {e['rasd_p50_spread']:.1%} over {', '.join(f'{z:,}' for z in sizes)}",
            "e",
        )
    return out


def rows_for(name: str, s: dict[str, Any]) -> list[dict[str, Any]]:
    if "rows" in s:
        rows: list[dict[str, Any]] = s["rows"]
        return rows
    if "rasd" in s and "baseline" in s:
        what = s["title"].split(") ", 1)[-1]
        rows = [
            {
                "scenario": name,
                "what": what,
                "side": "rasd",
                **s["rasd"],
                "note": f"{s['speedup_p50']:.1f}x faster (p50)",
            },
            {"scenario": name, "what": what, "side": "baseline", **s["baseline"], "note": ""},
        ]
        st = s.get("rasd_store") or {}
        if st.get("requests") and st.get("background_calls_per_request"):
            rows[0]["note"] += f", +{st['background_calls_per_request']:.2f} bg calls/req"
        if name == "b":
            rows[0]["note"] += f"; counters {s['rasd_ddb_calls_per_request']:.2f} calls/req"
        if name == "c":
            rows[0]["note"] += f"; counters {s['rasd_ddb_calls_per_new_lease']:.2f} calls/acq"
            cpu = s.get("cpu_per_new_lease") or {}
            if cpu.get("baseline_ms"):
                rows[0]["note"] += (
                    f"; CPU/acq daemon {cpu['rasd_daemon_ms']:.2f} ms (client"
                    f" {cpu['rasd_client_ms']:.2f}) vs baseline {cpu['baseline_ms']:.2f} ms:"
                    f" {cpu['daemon_vs_baseline']:.2f}x"
                )
        return rows
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small samples, < 3 minutes (default)")
    mode.add_argument("--full", action="store_true", help="bigger samples and (e) on dynalite")
    ap.add_argument("--scenarios", default="a,b,c,d,e,f,g,s", help="comma list (default all)")
    ap.add_argument("--delay-ms", type=float, default=3.5, help="one-way delay (default 3.5)")
    ap.add_argument("--handshake-rtts", type=float, default=2.0)
    ap.add_argument(
        "--backend",
        choices=["moto", "dynalite"],
        default="moto",
        help="backend for a-d, f, g (default moto); (e) always uses dynalite",
    )
    ap.add_argument(
        "--f-backend",
        choices=["auto", "moto", "dynalite"],
        default="auto",
        help="backend of (f); auto: dynalite when installed, else --backend",
    )
    ap.add_argument(
        "--install-dynalite",
        action="store_true",
        help="npm-install dynalite into bench/node_modules first",
    )
    ap.add_argument(
        "--rollout",
        action="store_true",
        help="tables in rollout mode (as rasadmin adopt leaves them): the cost of running "
        "beside the paper's agent; default: a fresh table, as rasd creates it",
    )
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a sample-size option, e.g. --opt g_leases=5000 "
        "(lists: --opt e_sizes=1000,10000)",
    )
    a = ap.parse_args(argv)
    full = bool(a.full)
    opts = dict(FULL if full else QUICK)
    for o in a.opt:
        k, _, v = o.partition("=")
        if k not in opts:
            ap.error(f"unknown option {k!r}; known: {', '.join(sorted(opts))}")
        opts[k] = [int(x) for x in v.split(",")] if isinstance(opts[k], list) else type(opts[k])(v)
    wanted = [s.strip() for s in a.scenarios.split(",") if s.strip()]
    explicit_e = "e" in a.scenarios.split(",") and a.scenarios != ap.get_default("scenarios")

    if a.install_dynalite:
        try:
            install_dynalite()
        except Exception as exc:  # noqa: BLE001
            print(f"bench: could not install dynalite: {exc}", file=sys.stderr)
    dyn_why = dynalite_status()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    doc: dict[str, Any] = {
        "mode": "full" if full else "quick",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "delay_ms": a.delay_ms,
        "handshake_rtts": a.handshake_rtts,
        "backend": a.backend,
        "rollout": a.rollout,
        "machine": report.machine(),
        "options": opts,
        "scenarios": {},
        "skipped": {},
        "load": {},
    }
    t_start = time.perf_counter()
    print(
        f"rasd bench ({doc['mode']}): backend {a.backend}, one-way delay {a.delay_ms} ms, "
        f"{doc['machine'].get('cpus')} CPUs, load {os.getloadavg()[0]:.2f}",
        file=sys.stderr,
    )
    doc["proxy_self_test"] = self_test(a.delay_ms / 1e3, a.handshake_rtts, n=200)
    print(
        f"proxy self-test: adds {doc['proxy_self_test']['added_p50_ms']:.3f} ms per round "
        f"trip (model {2 * a.delay_ms:.3f})",
        file=sys.stderr,
    )

    envs: dict[str, Env] = {}

    def env_for(kind: str) -> Env:
        if kind not in envs:
            envs[kind] = Env(kind, a.delay_ms, a.handshake_rtts, rollout=a.rollout)
        return envs[kind]

    def run(name: str, fn: Any, *args: Any) -> Any:
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        print(f"[{time.perf_counter() - t_start:6.1f}s] scenario {name} ...", file=sys.stderr)
        try:
            res = fn(*args)
        except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the rest
            traceback.print_exc()
            res = {"error": f"{type(exc).__name__}: {exc}"}
        doc["load"][name] = {
            "before": load0,
            "after": os.getloadavg(),
            "seconds": time.perf_counter() - t0,
        }
        report.write_partial(doc, stamp, name, res)
        return res

    try:
        main_env = env_for(a.backend)
        doc["calibration"] = calibrate(main_env, 100 if full else 50)
        cal = doc["calibration"]
        print(
            f"one round trip (Query, p50): direct {cal['direct']['p50_ms']:.2f} ms, "
            f"through the proxy {cal['proxied']['p50_ms']:.2f} ms",
            file=sys.stderr,
        )
        if any(s in wanted for s in "abc"):
            res = run("abc", scenarios.latency_abc, main_env, opts)
            if "error" in res:
                doc["scenarios"]["abc"] = res
            else:
                doc["abc_problems"] = res.pop("problems", [])
                for s in "abc":
                    if s in wanted:
                        doc["scenarios"][s] = res[s]
        if "d" in wanted:
            doc["scenarios"]["d"] = run("d", scenarios.throughput_d, main_env, opts)
        dyn_env = None
        if "e" in wanted:
            if dyn_why:
                doc["skipped"]["e"] = dyn_why
                print(f"scenario e skipped: {dyn_why}", file=sys.stderr)
            elif not full and not explicit_e:
                doc["skipped"]["e"] = "quick mode (run --full, or --scenarios e)"
            else:
                try:
                    dyn_env = env_for("dynalite")
                    res = run("e", scenarios.scale_e, dyn_env, opts)
                    doc["scenarios"]["e"] = res
                except BackendUnavailable as exc:
                    doc["skipped"]["e"] = str(exc)
        if "f" in wanted:
            # 20 daemons on moto overload it (its index Query walks the table under one GIL):
            # requests then hit the 2 s read timeout and (f) measures timeouts, not contention.
            f_kind = a.f_backend
            if f_kind == "auto":
                f_kind = "dynalite" if not dyn_why else a.backend
            f_env = env_for(f_kind)
            doc["scenarios"]["f"] = run("f", scenarios.contention_f, f_env, opts)
            doc["scenarios"]["f"]["backend"] = f_kind
        if "h" in wanted:
            # many daemons' index Queries: moto's walks the table under one GIL, dynalite's not
            if dyn_why:
                doc["skipped"]["h"] = dyn_why
                print(f"scenario h skipped: {dyn_why}", file=sys.stderr)
            else:
                doc["scenarios"]["h"] = run("h", highuse.highuse_h, env_for("dynalite"), opts)
        if "g" in wanted:
            # 100K leases need a backend whose index Query does not walk the table: dynalite
            g_env, g_opts = main_env, dict(opts)
            if full and a.backend == "moto":
                if dyn_why:
                    g_opts["g_leases"] = 5000
                    doc["skipped"]["g_100k"] = f"{dyn_why}; measured 5,000 leases on moto"
                else:
                    g_env = env_for("dynalite")
            doc["scenarios"]["g"] = run("g", scenarios.memory_g, g_env, g_opts)
            doc["scenarios"]["g"]["backend"] = g_env.backend_kind
        if "s" in wanted:
            # the daemon's CPU per new lease is a target on dynalite (keep-alive, as DynamoDB)
            s_kind = "dynalite" if not dyn_why else a.backend
            doc["scenarios"]["s"] = run(
                "s", spawn.measure, s_kind, opts["s_runs"], opts["s_leases"]
            )
    finally:
        for e in envs.values():
            e.close()

    doc["elapsed_s"] = time.perf_counter() - t_start
    doc["verdicts"] = verdicts(doc)
    doc["targets"] = targets(doc)
    rows: list[dict[str, Any]] = []
    for name in "abcdefgh":
        s = doc["scenarios"].get(name)
        if s and "error" not in s:
            rows += rows_for(name, s)
    print()
    print(report.table(rows))
    print()
    for name, s in doc["scenarios"].items():
        if "error" in s:
            print(f"scenario {name} FAILED: {s['error']}")
    for name, why in doc["skipped"].items():
        print(f"scenario {name} skipped: {why}")
    h = doc["scenarios"].get("h")
    if h and "table" in h:
        print("(h) a pool near full:")
        print(h["table"])
        print()
    if doc.get("abc_problems"):
        print("problems seen in a-c:", doc["abc_problems"][:10])
    print()
    for v in doc["verdicts"]:
        mark = {True: "MET   ", False: "MISSED", None: "n/a   "}[v["met"]]
        print(f"  ({v['target']}) {mark} {v['goal']}: {v['measured']}")
    if doc["targets"]:
        print("\nthe targets, this run (load average before/after each scenario):")
        print(report.targets_table(doc["targets"], doc["load"]))
    path = report.write_json(doc, stamp)
    print(f"\nresults: {path}")
    if not a.no_plots:
        for p in report.plot(doc, stamp):
            print(f"plot:    {p}")
    print(f"elapsed: {doc['elapsed_s']:.0f} s, load avg now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

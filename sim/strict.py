"""A strict pool beside a normal one (``python -m sim --strict``; docs/global.md, "Strict
pools").

The run is the simulation's balancer run (same traffic, backends, replicator, jobs) with a
second pool, ``sim/strict``, whose home region is the first region (us-east-1): each key's
requests go to one of the two pools (by a hash of the key: about half each), each pool has
the resources the traffic would need alone. The other regions' daemons reach the home
region through :mod:`fleet.proxy`, which adds ``one_way_ms`` in each direction: the
cross-region round trip a new key of a strict pool pays. At the end, the probe's keys are
requested in every region at once in both pools.

What it measures, per pool: keys mapped twice by two witnesses, the table's audit (claims
answered, overlapping in time) and the clients (another resource answered in a second region
while both leases ran), next to what the traffic predicts for a normal pool; the latency of
new keys and of second-region requests, per region; the daemons' ``strict.*`` counters.
A strict key answered twice by either witness, or by the probe, fails the run
(:func:`promise_broken`), valid or not.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import zlib
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from fleet import procs, tables
from rasd.core import schema

from . import report, traffic
from .world import (
    CLIENT,
    POOL,
    PROBE,
    SKEW_MARGIN_S,
    Params,
    RunResult,
    World,
    resource_names,
    schedule_of,
    size_pool,
)

STRICT_POOL = "strict"
#: the end-of-run probe of the strict pool: counted with its duplicates (there must be none)
STRICT_PROBE = "strict-probe-"


class StrictWorld(World):
    def __init__(self, p: Params, scn: traffic.Scenario, workdir: Path, one_way_ms: float) -> None:
        super().__init__(p, scn, workdir)
        self.home = self.regions[0]
        self.one_way_ms = one_way_ms
        self.proxy_url = ""

    def start_backends(self) -> None:
        super().start_backends()
        port = self.endpoints[self.home].rsplit(":", 1)[1]
        # a byte pipe holding every chunk one_way_ms each way; no handshakes modelled
        cmd = [sys.executable, "-m", "fleet.proxy", "--upstream", f"127.0.0.1:{port}"]
        cmd += ["--delay-ms", str(self.one_way_ms), "--handshake-rtts", "0"]
        proc = procs.popen(cmd, self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.children.append(proc)
        assert proc.stdout is not None
        self.proxy_url = f"http://127.0.0.1:{int(proc.stdout.readline().split()[1])}"  # PORT n

    def seed_more(self, split: dict[str, int], now_us: int) -> None:
        names = resource_names(split, "str-")
        for r, url in self.endpoints.items():
            ddb = tables.client(url, r)
            schema.put_pool(ddb, self.p.table, CLIENT, STRICT_POOL, 3600, home=self.home)
            for region, ns in names.items():
                schema.add_resources(ddb, self.p.table, CLIENT, STRICT_POOL, region, ns, now_us)

    def pool_of(self, key: str) -> str:
        if key.startswith(STRICT_PROBE):
            return STRICT_POOL
        return STRICT_POOL if zlib.crc32(key.encode()) % 2 else POOL

    def region_env(self, region: str) -> dict[str, str]:
        if region == self.home:
            return {}
        return {"RASD_PEER_ENDPOINTS": f"{self.home}={self.proxy_url}"}

    async def probe(self) -> dict[str, Any]:
        """The normal pool's probe, then the strict pool's: ``probe_keys`` keys asked in
        every region at the same instant (the case that duplicates every key of a normal
        pool)."""
        from rasd_client import RasdError, aio

        out = await super().probe()
        got: Counter[str] = Counter()
        answered: dict[str, set[str]] = {}

        async def one(key: str, region: str) -> None:
            try:
                lease = await aio.get_lease(
                    CLIENT,
                    STRICT_POOL,
                    key,
                    timedelta(seconds=120),
                    timeout=2.0,
                    socket_path=self.sockets[region][0],
                )
                got["new" if lease.new else "existing"] += 1
                answered.setdefault(key, set()).add(lease.resource)
            except RasdError as exc:
                got[exc.code] += 1

        keys = [f"{STRICT_PROBE}{self.p.seed}-{i}" for i in range(self.p.probe_keys)]
        await asyncio.gather(*(one(k, r) for k in keys for r in self.regions))
        out["strict"] = {
            "keys": keys,
            "requests": len(keys) * len(self.regions),
            "codes": dict(got),
            "keys_answered_two_resources": sorted(k for k, v in answered.items() if len(v) > 1),
        }
        return out


def _ms(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))]
    return {"n": len(xs), "median": round(statistics.median(xs), 1), "p99": round(p99, 1)}


def pool_report(res: RunResult, pool: str, strict: bool) -> dict[str, Any]:
    """One pool's figures: keys mapped twice (audit, clients, prediction) and latencies."""
    p = res.params
    outs = [o for o in res.outcomes if o.pool == pool and not o.key.startswith(PROBE)]
    lease_s, lag_s = float(p["lease_s"]), float(p["lag_s"])
    rep_p99 = (res.replicator or {}).get("achieved_lag_p99_s") or lag_s
    pred = report.predict_duplicates(outs, lease_s, lag_s, max(lag_s, rep_p99), SKEW_MARGIN_S)
    audit = report.duplicates_from_audit(res.audit, pool=pool, strict=strict)
    clients = report.duplicates_from_clients(outs, lease_s)
    lat: dict[str, Any] = {}
    for r in sorted({o.region for o in outs}):
        mine = [o for o in outs if o.region == r and o.code == "OK"]
        lat[r] = {
            "new_key": _ms([o.latency_ms for o in mine if o.first and o.new]),
            "second_region": _ms([o.latency_ms for o in mine if not o.first]),
        }
    codes = Counter(o.code for o in outs)
    return {
        "pool": pool,
        "strict": strict,
        "requests": len(outs),
        "codes": dict(codes),
        "new_keys": len({o.key for o in outs if o.first}),
        "second_region_requests": sum(1 for o in outs if not o.first),
        "duplicate_keys": audit["duplicate_keys"],
        "duplicate_keys_list": audit["keys"][:20],
        "probe_duplicate_keys": sum(1 for k in audit["keys"] if k.startswith(STRICT_PROBE)),
        "claims_never_answered": audit["claims_never_named"],
        "duplicate_keys_clients": clients["duplicate_keys"],
        "duplicate_keys_clients_list": clients["keys"][:20],
        # every second-region answer of another resource, counted or not (after the first
        # lease's end), with its times: what to read when the two witnesses disagree
        "clients_other_resource": clients["rows"][:20],
        "predicted_for_a_normal_pool": [pred["low"], pred["high"]],
        "latency_ms": lat,
    }


def run(params: Params, scn: traffic.Scenario, one_way_ms: float, log: Any) -> dict[str, Any]:
    """One strict run (the balancer on): both pools' figures, and the run's validity."""
    sched = schedule_of(params, scn)
    total, split = size_pool(sched, params, list(scn.names))
    p = replace(params, balancer=True, resources=total)
    log(f"strict run: {sched.new_keys} new keys, {total} resources per pool, {one_way_ms} ms")
    with tempfile.TemporaryDirectory(prefix="sim-strict-") as d:
        res = StrictWorld(p, scn, Path(d), one_way_ms).run(sched, split)
    whole = report.analyze(res, scn)
    return {
        "params": {k: v for k, v in vars(p).items() if k != "balancer"},
        "one_way_ms": one_way_ms,
        "validity": whole["validity"],
        "replicator": whole["replicator"],
        "pools": {
            POOL: pool_report(res, POOL, strict=False),
            STRICT_POOL: pool_report(res, STRICT_POOL, strict=True),
        },
        "probe": res.end.get("probe"),
        "daemon_counters": {
            r: {k: v for k, v in c.items() if k.startswith("strict.")}
            for r, c in res.daemon_stats.items()
        },
        "wall_s": res.wall_s,
    }


def promise_broken(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every seed whose strict pool answered a key two resources across regions while both
    leases ran, by either witness: the table's audit (agreed claims overlapping in time),
    the clients' answers (``report.duplicates_from_clients``) or the probe (one key asked in
    every region at once answered two resources). Whatever the run's validity: a strict
    pool's promise does not depend on load."""
    out = []
    for r in runs:
        v = r["pools"][STRICT_POOL]
        probe = ((r.get("probe") or {}).get("strict") or {}).get("keys_answered_two_resources")
        row = {
            "seed": r["params"]["seed"],
            "valid": r["validity"]["valid"],
            "audit": v["duplicate_keys"],
            "audit_keys": v.get("duplicate_keys_list", []),
            "clients": v["duplicate_keys_clients"],
            "clients_keys": v.get("duplicate_keys_clients_list", []),
            "probe_keys": probe or [],
        }
        if row["audit"] or row["clients"] or row["probe_keys"]:
            out.append(row)
    return out


def table(run: dict[str, Any]) -> str:
    """The run's figures, one pool per block."""
    lines = [
        f"lag {run['params']['lag_s']} s, cross-region one way {run['one_way_ms']} ms; "
        f"{'VALID' if run['validity']['valid'] else 'INVALID'} "
        f"(replication p99 {run['validity']['lag_p99_s']} s, "
        f"{run['validity']['backend_errors']} backend errors)"
    ]
    for pool, v in run["pools"].items():
        lo, hi = v["predicted_for_a_normal_pool"]
        lines.append(
            f"  {pool:<8} {'strict' if v['strict'] else 'normal'}: {v['new_keys']} new keys, "
            f"{v['second_region_requests']} second-region requests; keys mapped twice "
            f"{v['duplicate_keys']} (clients {v['duplicate_keys_clients']}; a normal pool: "
            f"{lo}-{hi} predicted); claims never answered {v['claims_never_answered']}"
        )
        for r, lat in v["latency_ms"].items():
            nk, sr = lat["new_key"], lat["second_region"]
            lines.append(
                f"    {r:<10} new key median {nk.get('median')} p99 {nk.get('p99')} ms "
                f"(n={nk['n']}); second region median {sr.get('median')} p99 {sr.get('p99')} "
                f"ms (n={sr['n']})"
            )
    probe = (run.get("probe") or {}).get("strict") or {}
    lines.append(
        f"  strict probe: {len(probe.get('keys', []))} keys asked in every region at once: "
        f"{probe.get('codes')}; answered two resources: {probe.get('keys_answered_two_resources')}"
    )
    lines.append(f"  strict counters: {run['daemon_counters']}")
    return "\n".join(lines)

"""Daemons as processes (``rasd serve``) and the audit of a table against what their clients
were answered (docs/design.md, I1 and I2): for the tests that run many daemons on one table."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import rasd_client
from rasd.core import lease as lease_items
from rasd.core import serialize
from rasd.core import writes as item_writes
from rasd_jobs import liberator
from tests.helpers.tables import scan_all

ROOT = Path(__file__).resolve().parents[2]


def start_daemon(
    sock: str, table: str, endpoint: str, region: str = "us-east-1", **settings: str
) -> Any:
    """``rasd serve`` in its own process, once it answers ready; ``settings`` as ``RASD_*``."""
    env = {"RASD_ACL_OPEN": "true", **os.environ, "PYTHONPATH": str(ROOT)}
    env.update({f"RASD_{name.upper()}": value for name, value in settings.items()})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rasd",
            "serve",
            "--socket",
            sock,
            "--table",
            table,
            "--region",
            region,
            "--endpoint-url",
            endpoint,
            "--log-level",
            "warning",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(300):
        if proc.poll() is not None:
            raise AssertionError(f"daemon died: {proc.stderr.read() if proc.stderr else ''}")
        try:
            # ping answers ready=False while the daemon is still starting
            if rasd_client.call_raw("ping", socket_path=sock, timeout=1.0)["ready"]:
                return proc
        except rasd_client.RasdError:
            pass
        time.sleep(0.1)
    raise AssertionError("daemon never became ready")


def audit(ddb: Any, table: str, results: list[dict[str, Any]], region: str) -> dict[str, int]:
    """The table against what clients were answered (docs/design.md, I1 and I2).

    Every client answer must be the lease its key's mapping names, held in the table by that
    key; no resource may have been answered to two keys. A held resource that no mapping
    names is an orphan (an acquisition whose outcome was lost): never answered to anyone,
    and freed by the liberator's orphan repair, after which no key holds two resources.
    """
    items = [item_writes.item_from_av(it) for it in scan_all(ddb, table)]
    rows = [serialize.resource_from(it) for it in items if it["client_id"] == "demo"]
    maps = {
        (m.key, m.region): m
        for m in (
            serialize.mapping_from(it)
            for it in items
            if serialize.is_mapping_pk(str(it["client_id"]))
        )
    }
    by_resource = {r.resource: r for r in rows}
    named: dict[str, str] = {}  # key -> the resource its mapping names (and that it holds)
    orphans = []
    for r in rows:
        if r.key is not None:
            assert r.lease_available is None, f"{r.resource} is both leased and available"
            m = maps.get((r.key, r.region))
            if m is not None and m.token == r.holder and m.resource == r.resource:
                if r.region == region:
                    assert r.key not in named, f"{r.key} has two leases in {region}"
                    named[r.key] = r.resource
            else:
                orphans.append(r)
        else:
            free = r.lease_available is not None or r.quarantine_until is not None
            assert free, f"{r.resource} neither leased nor free"
    seen_by_clients: dict[str, set[str]] = defaultdict(set)
    for res in results:
        if "error" in res:
            continue
        row = by_resource[res["resource"]]
        assert row.key == res["key"], f"client got {res}, table says {row}"
        assert named.get(res["key"]) == res["resource"], f"client got {res}, not its lease"
        assert row.version >= res["version"]
        seen_by_clients[res["resource"]].add(res["key"])
    two = {r: ks for r, ks in seen_by_clients.items() if len(ks) > 1}
    assert not two, f"resources handed to two keys: {two}"
    answered = {res["resource"] for res in results if "error" not in res}
    assert not answered & {o.resource for o in orphans}, "an orphan was answered"
    # The liberator's orphan repair frees what the daemons' give-backs did not.
    now = int(time.time() * lease_items.US)
    got = liberator.run(
        ddb, liberator.Options(table=table, region=None, now_us=now, orphan_age_us=0)
    )
    assert got["orphans_freed"] == len(orphans) and got["errors"] == 0, got
    held: dict[str, list[str]] = defaultdict(list)
    for it in scan_all(ddb, table):
        r = serialize.item_from_ddb(it) if it["client_id"]["S"] == "demo" else None
        if r is not None and r.key is not None and r.region == region:
            held[r.key].append(r.resource)
    dup = {k: v for k, v in held.items() if len(v) > 1}
    assert not dup, f"keys holding several resources in {region}: {dup}"
    return {"leased": len(named), "keys": len(named), "orphans": len(orphans)}

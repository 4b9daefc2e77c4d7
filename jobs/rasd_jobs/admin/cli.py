"""rasadmin's command line: the parser of every command, and running the one it names."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from rasd.config import Config

from .. import adopt, common, rollout
from .pools import cmd_add_pool, cmd_create_table, cmd_delete_pool, cmd_list_pools, cmd_show_pool
from .resources import (
    cmd_add_resources,
    cmd_delete_resource,
    cmd_list_resources,
    cmd_release_resource,
    cmd_show_resource,
)
from .stats import cmd_stats

DEFAULT_MAX_LEASE_S = 86_400  # one day: the paper's leases are 1-1.5 h; room for long tests
PROG = "rasadmin"
EPILOG = common.ENV_VARS + (
    "\nexit status: 0 done; 1 failed, refused or not found (stderr says which); 2 bad usage,\n"
    "names or settings (no region, say). Each command's: docs/operations.md, 'Exit status'.\n"
)


def build_parser() -> argparse.ArgumentParser:
    conn = common.connection_parent()
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--json", action="store_true", help="print JSON instead of a table")
    dry = argparse.ArgumentParser(add_help=False)
    dry.add_argument("--dry-run", action="store_true", help="report, change nothing")
    one = argparse.ArgumentParser(add_help=False)
    one.add_argument("--client", required=True, help="client_id")
    one.add_argument("--resource", required=True, help="the resource string")

    p = argparse.ArgumentParser(
        prog=PROG,
        description=common.wrap(
            "Admin CLI for rasd's DynamoDB table: the table, pools, resources, stats. "
            "Listings print a table (or JSON with --json); changes print a one-line JSON "
            "summary. Read-only commands cover every region unless --region is given on the "
            "command line (RASD_REGION is not used as a filter); add-resources, "
            "release-resource and delete-resource need --region or RASD_REGION. Every command "
            "needs a region for its DynamoDB client: AWS_REGION, else --region or RASD_REGION "
            "(without one it exits 2). Run `rasadmin COMMAND --help` for each command's flags."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(
        name: str,
        fn: Callable[[Any, argparse.Namespace], int],
        help: str,
        parents: Sequence[argparse.ArgumentParser],
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(
            name,
            help=help,
            description=common.wrap(help),
            parents=[conn, *parents],
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sp.set_defaults(func=fn)
        return sp

    def client_pool(sp: argparse.ArgumentParser, pool_required: bool = True) -> None:
        sp.add_argument("--client", required=True, help="client_id")
        sp.add_argument("--pool", required=pool_required, help="pool_id")

    sp = add(
        "create-table",
        cmd_create_table,
        "create the table with both indexes and the stream (no-op if it exists)",
        [],
    )
    sp.add_argument("--no-wait", action="store_true", help="do not wait until it is ACTIVE")

    sp = add("add-pool", cmd_add_pool, "define (or redefine) a client's pool", [])
    client_pool(sp)
    sp.add_argument(
        "--max-lease",
        type=float,
        default=DEFAULT_MAX_LEASE_S,
        metavar="SECONDS",
        help=f"longest lease a client may ask for (default {DEFAULT_MAX_LEASE_S})",
    )
    sp.add_argument(
        "--home",
        metavar="REGION",
        help="make the pool strict: each key's lease is agreed in this region, so no key holds "
        "resources in two regions at once (new keys pay one round trip to it; docs/global.md, "
        "'Strict pools'). Without it the pool is normal (and a redefinition makes it so)",
    )
    sp.add_argument(
        "--outage-budget",
        type=float,
        metavar="SECONDS",
        help="while a host cannot reach DynamoDB, it keeps answering this pool's leases it "
        "confirmed for up to this long after their last confirmation (never past a lease's "
        "end; new keys still fail fast). Default: none (confirm_interval, 30 s). Needs "
        "--quarantine; set when the pool is defined, never changed after "
        "(docs/operations.md, 'Choosing an outage budget')",
    )
    sp.add_argument(
        "--quarantine",
        type=float,
        metavar="SECONDS",
        help="with --outage-budget: how long an app's release keeps a resource of this pool "
        "unclaimable, at least the budget + max_clock_skew + replication_lag of --config: "
        "released resources stay idle that long, the capacity the budget costs",
    )

    sp = add("list-pools", cmd_list_pools, "list pool definitions", [out])
    sp.add_argument("--client", help="only this client's pools")

    sp = add("show-pool", cmd_show_pool, "a pool's definition and counts per region", [out])
    client_pool(sp)

    sp = add(
        "delete-pool",
        cmd_delete_pool,
        "delete a pool's definition and all its resource items (every region); refuses "
        "while a lease in it is held",
        [dry],
    )
    client_pool(sp)
    sp.add_argument(
        "--force",
        action="store_true",
        help="delete even while leases are held or resources are in quarantine (their names "
        "stay held until those end: a re-add is claimable no earlier)",
    )
    common.add_peer_endpoint(
        sp,
        "DynamoDB endpoint of REGION's replica: that region's items are deleted there "
        "(repeatable; needed for every region of the pool but --region)",
    )
    sp.add_argument(
        "--unreplicated",
        action="store_true",
        help="one plain table holds every region's items (development, tests): delete them "
        "all through --endpoint-url",
    )

    sp = add(
        "add-resources",
        cmd_add_resources,
        "add free resources to a pool in one region (spread over the 10 sub-partitions); "
        "names that already exist for the client are skipped, never overwritten; a deleted "
        "name is added again, claimable only once the lease or quarantine it had has ended",
        [dry],
    )
    client_pool(sp)
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--count", type=common.positive_int, help="add N generated names")
    src.add_argument(
        "--file", metavar="F", help="one resource per line ('-' = stdin); blank lines skipped"
    )
    sp.add_argument(
        "--prefix", help="with --count: names are PREFIX000000, PREFIX000001... (default 'POOL-')"
    )

    sp = add("list-resources", cmd_list_resources, "list a client's resource items", [out])
    client_pool(sp, pool_required=False)
    st = sp.add_mutually_exclusive_group()
    for flag, what in (
        ("leased", "only leases that are running"),
        ("free", "only items claimable now"),
        (
            "quarantined",
            "only items no lease holds that are not claimable yet (quarantine_until, or a "
            "lease_available in the future)",
        ),
        ("expired", "only leases past their end, not yet liberated"),
    ):
        st.add_argument(f"--{flag}", dest="state", action="store_const", const=flag, help=what)
    sp.add_argument("--limit", type=common.positive_int, help="print at most N items")

    add("show-resource", cmd_show_resource, "one resource item, every attribute", [out, one])

    sp = add(
        "release-resource",
        cmd_release_resource,
        "give a leased item back the way a daemon does: the key's mapping first, then the "
        "item, claimable again after --quarantine and, since no app released it, not before "
        "its lease's end plus max_clock_skew (only items of --region)",
        [one],
    )
    sp.add_argument(
        "--quarantine",
        type=common.non_negative_float,
        default=None,
        help="seconds the item stays unclaimable, so daemons still serving it from their "
        "caches stop first; at least the daemons' confirm_interval + max_clock_skew + "
        f"replication_lag (default: that sum, from --config; {Config().quarantine:g} with the "
        "daemons' defaults)",
    )

    sp = add(
        "delete-resource",
        cmd_delete_resource,
        "delete one resource item of --region; refuses while it is leased or in quarantine. "
        "Its name stays held (a tombstone) until its lease or quarantine ends: a re-add is "
        "claimable no earlier",
        [one],
    )
    sp.add_argument(
        "--force", action="store_true", help="delete even while leased or in quarantine"
    )

    sp = add(
        "adopt",
        adopt.cmd_adopt,
        "bring a table the paper's agent wrote to rasd's schema in place: indexes, stream and "
        "TTL, pool definitions, and a mapping item for every running lease of --region (each "
        "keeps its resource and end). Idempotent; --resume-from continues an interrupted run",
        [dry],
    )
    adopt.add_parser(sp)

    add(
        "rollout",
        rollout.cmd_rollout,
        "show the table's rollout record: whether hosts running the paper's in-process agent "
        "may write it (rasd's daemons and jobs then keep the rules that are safe beside it)",
        [],
    )
    add(
        "end-rollout",
        rollout.cmd_end_rollout,
        "end rollout mode once no host runs the paper's agent: refused (exit 1) while any item "
        "holds a lease of that agent, running or not yet freed. Daemons follow within "
        "pool_refresh + pool_refresh_timeout",
        [dry],
    )

    sp = add(
        "stats",
        cmd_stats,
        "free (claimable + quarantined) / claimable / quarantined / leased / "
        "expired-not-liberated counts per client, pool and region",
        [out],
    )
    sp.add_argument("--client", help="only this client (a Query instead of a Scan)")
    sp.add_argument("--pool", help="only this pool")
    sp.add_argument(
        "--segments", type=common.positive_int, default=4, help="parallel Scan segments"
    )
    return p


def command(args: argparse.Namespace) -> int:
    """Run the command ``args`` name (it prints its own output): its exit status. A command
    without any region stops here (exit 2), before DynamoDB is asked anything."""
    region = common.ras_region(args, required=False)
    pool = getattr(args, "segments", 4) + 2
    ddb = common.make_client(args, region, pool=pool, interactive=True)
    return int(args.func(ddb, args))


def main(argv: Sequence[str] | None = None) -> int:
    return common.run_main(build_parser(), argv, command)

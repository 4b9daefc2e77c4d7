"""rasadmin's resource commands: add-resources (the names from ``--count`` or ``--file``),
list-resources, show-resource, release-resource and delete-resource."""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rasd.core.lease import MAX_RESOURCE_LEN, US, ResourceItem
from rasd.core.serialize import is_tombstone
from rasd.steps import admin as admin_steps

from .. import common, leases
from .listing import row_of, show, state_of
from .reads import bounds, client_items, get_resource, require_pool, require_pool_or_items


def check_resource_name(resource: str) -> None:
    if not resource or len(resource) > MAX_RESOURCE_LEN:
        raise common.UsageError(
            f"bad resource {resource[:40]!r}: 1-{MAX_RESOURCE_LEN} characters expected"
        )


def own_region(args: argparse.Namespace, it: ResourceItem, verb: str) -> None:
    """Refuse to write an item of another region than the command's: in a global table it
    would be written in the wrong replica and race that region's claims (last writer wins)."""
    region = common.ras_region(args)
    if it.region != region:
        raise common.JobError(
            f"{it.resource!r} belongs to region {it.region}, not {region}: {verb} it with "
            f"--region {it.region} against that region's table"
        )


def resource_names(args: argparse.Namespace, existing: set[str]) -> tuple[list[str], int]:
    """New names to add and how many given names already existed (skipped)."""
    if args.count is not None:
        prefix = args.prefix if args.prefix is not None else f"{args.pool}-"
        check_resource_name(prefix + "0" * 6)
        names: list[str] = []
        i = 0
        while len(names) < args.count:
            name = f"{prefix}{i:06d}"
            if name not in existing:
                names.append(name)
            i += 1
        return names, 0
    lines = read_lines(args.file)
    names, seen, skipped = [], set(), 0
    for n, line in enumerate(lines, 1):
        name = line.strip()
        if not name:
            continue
        if len(name) > MAX_RESOURCE_LEN:
            raise common.UsageError(f"{args.file}:{n}: resource longer than {MAX_RESOURCE_LEN}")
        if name in existing or name in seen:
            skipped += 1
            continue
        seen.add(name)
        names.append(name)
    return names, skipped


def read_lines(path: str) -> list[str]:
    """The lines of ``--file`` (``-``: stdin) as UTF-8 text; UsageError naming the file and
    the line of bytes that are not UTF-8."""
    try:
        if path == "-":
            stdin = getattr(sys.stdin, "buffer", None)
            if stdin is None:  # already text (a test's StringIO)
                return str(sys.stdin.read()).splitlines()
            data: bytes = stdin.read()
        else:
            with open(path, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        raise common.UsageError(f"cannot read --file {path}: {exc.strerror}")
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise common.UsageError(
            f"{'stdin' if path == '-' else path}:{line}: not UTF-8 (byte "
            f"{data[exc.start]:#04x}); resource names are UTF-8 text, one per line"
        )


def cmd_add_resources(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    common.check_name("pool", args.pool)
    region = common.ras_region(args)
    assert region is not None
    require_pool(ddb, args.table, args.client, args.pool)
    # A resource is unique per client (it is the sort key): never overwrite an existing item,
    # which might be leased, whatever pool it is in. A deleted name (a tombstone) is added
    # again, claimable no earlier than the tombstone's hold.
    existing: set[str] = set()
    held = 0
    for page in common.scan_pages(
        ddb,
        {
            "TableName": args.table,
            "KeyConditionExpression": "client_id = :c",
            "ExpressionAttributeValues": {":c": {"S": args.client}},
            "ProjectionExpression": "#res, pool_id, hold_until",
            "ExpressionAttributeNames": {"#res": "resource"},
            "ConsistentRead": True,
        },
    ):
        for it in page.get("Items", []):
            if not is_tombstone(it):
                existing.add(it["resource"]["S"])
    names, skipped = resource_names(args, existing)
    added = 0
    if not args.dry_run and names:
        progress = common.Progress("adding", len(names))
        now = common.now_us(args)
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="add") as pool:
            for got in pool.map(lambda n: put_resource(ddb, args, region, n, now), names):
                progress.add()
                if got == "exists":
                    skipped += 1
                else:
                    added += 1
                    held += got == "held"
        progress.close()
    common.emit(
        {
            "command": "add-resources",
            "client_id": args.client,
            "pool_id": args.pool,
            "region": region,
            "dry_run": args.dry_run,
            "added": added,
            "held_by_tombstone": held,
            "skipped_existing": skipped,
            **({"would_add": len(names)} if args.dry_run else {}),
        }
    )
    return 0


def put_resource(ddb: Any, args: argparse.Namespace, region: str, name: str, now_us: int) -> str:
    """Add one name, free (``rasd.steps.admin.add_resource``): ``"added"`` (claimable now),
    ``"held"`` (a tombstone's name: claimable from its ``hold_until``), or ``"exists"`` (a
    resource took the name meanwhile: left alone)."""
    got = leases.run(
        ddb, args.table, admin_steps.add_resource(args.client, args.pool, region, name, now_us)
    )
    if got == "changing":
        raise common.JobError(f"{name!r} kept changing while it was added; look again")
    return got


RESOURCE_COLUMNS = [
    "pool_id",
    "resource",
    "region",
    "state",
    "key",
    "lease_expires",
    "quarantine_until",
    "version",
]


def cmd_list_resources(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    if args.pool is not None:
        common.check_name("pool", args.pool)
    if args.region is not None:
        common.check_region(args.region)
    now = common.now_us(args)
    want = args.state
    rows = []
    for it in client_items(ddb, args.table, args.client, args.pool, args.region):
        if want is not None and state_of(it, now) != want:
            continue
        rows.append(row_of(it, now))
        if args.limit and len(rows) >= args.limit:
            break
    if not rows and args.pool is not None:
        require_pool_or_items(ddb, args.table, args.client, args.pool)
    show(args, rows, RESOURCE_COLUMNS)
    return 0


def cmd_show_resource(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    check_resource_name(args.resource)
    it = get_resource(ddb, args.table, args.client, args.resource)
    row = row_of(it, common.now_us(args))
    if args.json:
        sys.stdout.write(json.dumps(row) + "\n")
    else:
        width = max(len(k) for k in row)
        for k, v in row.items():
            sys.stdout.write(f"{k.ljust(width)}  {'-' if v is None else v}\n")
    return 0


def cmd_release_resource(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    check_resource_name(args.resource)
    region = common.ras_region(args)
    assert region is not None
    now = common.now_us(args)
    quarantine_us, grace_us = bounds(args)
    if args.quarantine is not None:
        quarantine_us = int(args.quarantine * US)
    base = {"command": "release-resource", "client_id": args.client, "resource": args.resource}
    # No app released it: apps may use it until its end, so it is claimable only after that
    # end plus the skew, however short the quarantine (docs/design.md, I1).
    prog = admin_steps.release_resource(
        (args.client, args.resource), region, now, quarantine_us, grace_us
    )
    got = leases.run(ddb, args.table, prog)
    refused(args, got, "release")
    it = got.item
    assert it is not None
    if got.status == "not_leased":
        common.emit({**base, "released": False, "reason": "not leased"})
        return 0
    if got.status == "no_holder":
        raise common.JobError(
            f"{args.resource!r} was leased by an older rasd (no holder token); the liberator "
            "frees it when its lease ends"
        )
    if got.status == "lost_race":
        raise common.JobError(
            f"{args.resource!r} changed after it was read (a daemon wrote it); look again"
        )
    common.emit({**base, "released": True, "key": it.key, "claimable_from": got.detail})
    return 0


def refused(args: argparse.Namespace, got: admin_steps.AdminResult, verb: str) -> None:
    """The refusals every one-resource command shares: no such resource; another region's
    (in a global table it would be written in the wrong replica and race that region's
    claims, last writer wins)."""
    if got.status == "missing":
        raise common.JobError(
            f"no resource {args.resource!r} of client {args.client} in {args.table}"
        )
    if got.status == "other_region":
        region = common.ras_region(args)
        raise common.JobError(
            f"{args.resource!r} belongs to region {got.detail}, not {region}: {verb} it with "
            f"--region {got.detail} against that region's table"
        )


def cmd_delete_resource(ddb: Any, args: argparse.Namespace) -> int:
    common.check_name("client", args.client)
    check_resource_name(args.resource)
    region = common.ras_region(args)
    assert region is not None
    now = common.now_us(args)
    quarantine_us, grace_us = bounds(args)
    # A held item's mapping is ended first: daemons must not serve a lease on it (docs/design.md).
    prog = admin_steps.delete_resource(
        (args.client, args.resource), region, now, args.force, quarantine_us, grace_us
    )
    got = leases.run(ddb, args.table, prog)
    refused(args, got, "delete")
    it = got.item
    assert it is not None
    if got.status == "leased":
        raise common.JobError(
            f"refusing to delete {args.resource!r}: leased by key {it.key!r} until "
            f"{common.iso(it.lease_expires_us)}; pass --force to delete it anyway"
        )
    if got.status == "quarantined":
        raise common.JobError(
            f"refusing to delete {args.resource!r}: in quarantine until {got.detail} "
            "(a daemon's cache may still serve it to the key that released it); wait, or "
            "pass --force (the name stays held until then: a re-add is claimable no earlier)"
        )
    if got.status == "changed":
        raise common.JobError(f"{args.resource!r} changed after it was read; look again")
    common.emit(
        {
            "command": "delete-resource",
            "client_id": it.client_id,
            "resource": it.resource,
            "deleted": True,
            "name_held_until": got.detail,
        }
    )
    return 0

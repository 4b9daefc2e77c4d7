"""How rasadmin shows what it read: an item's state, its row, the counts of states, and the
rows as a table or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rasd.core.lease import ResourceItem

from .. import common


def state_of(item: ResourceItem, now_us: int) -> str:
    """free (claimable now) | quarantined (no lease, not claimable yet: freed early, out of the
    available index until re-listed after ``quarantine_until``, or a ``lease_available`` in
    the future) | leased | expired (leased but past lease_expires, not yet liberated)."""
    if not item.leased:
        return "free" if item.claimable(now_us) else "quarantined"
    return "expired" if item.expired(now_us) else "leased"


def claimable_from(item: ResourceItem) -> str | None:
    """When an item no lease holds is claimable: the end of its quarantine (then once it is
    re-listed), else its ``lease_available``."""
    return None if item.leased else item.quarantine_until or item.lease_available


def row_of(item: ResourceItem, now_us: int) -> dict[str, Any]:
    return {
        "client_id": item.client_id,
        "pool_id": item.pool_id,
        "resource": item.resource,
        "region": item.region,
        "state": state_of(item, now_us),
        "key": item.key,
        "lease_expires": common.iso(item.lease_expires_us),
        "lease_acquired": common.iso(item.lease_acquired_us),
        "lease_available": item.lease_available,
        "quarantine_until": item.quarantine_until,
        "claimable_from": claimable_from(item),
        "partition": item.partition,
        "version": item.version,
    }


#: the counts of stats and show-pool: FREE (no lease) is CLAIMABLE plus QUARANTINED
COUNT_COLUMNS = ["free", "claimable", "quarantined", "leased", "expired", "total"]


def counts_of(states: Counter[str]) -> dict[str, int]:
    """The COUNT_COLUMNS from a count of :func:`state_of`'s states."""
    return {
        "free": states["free"] + states["quarantined"],
        "claimable": states["free"],
        "quarantined": states["quarantined"],
        "leased": states["leased"],
        "expired": states["expired"],
        "total": states.total(),
    }


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain left-aligned text table (no dependency); empty cells print as '-'."""
    cells = [[str(c).upper() for c in columns]]
    cells += [["-" if r.get(c) is None else str(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def show(args: argparse.Namespace, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(list(rows), default=str) + "\n")
    elif rows:
        sys.stdout.write(render_table(rows, columns) + "\n")
    else:
        sys.stdout.write("(none)\n")
    sys.stdout.flush()


def ticking(it: Iterable[Any], progress: common.Progress) -> Iterator[Any]:
    for x in it:
        progress.add()
        yield x

"""What DynamoDB bills for a request, by its documented on-demand rules. Pure: no I/O.

Item size: the sum of each attribute's name and value (a string its UTF-8 bytes, a number one
byte per two significant digits plus one, a list or map 3 bytes plus one per element);
``CapacityUnitCalculations`` in the DynamoDB developer guide.

- **Reads** (read request units): a strongly consistent read costs one unit per 4 KB, an
  eventually consistent one half that; a GetItem of an absent item still costs the minimum.
  A Query is billed per page on the summed size of the items it read, filtered out or not,
  rounded up to 4 KB once (so the backend's own ``ConsumedCapacity`` is the measure for
  Queries: it alone knows what a page read).
- **Writes** (write request units): one unit per 1 KB of the larger of the item before and
  after. A write whose condition fails still costs the existing item's size (1 unit when
  there is none). Each global secondary index the write changes costs its own: an entry put
  or removed is one write of the entry's size; a changed index key is two (the old entry
  removed, the new one put); any other change of an item in the index is one. An entry's
  size is the item's projected attributes plus 100 bytes (projection ALL: the item + 100).

On-demand pricing weighs a write unit 5x a read unit ($1.25 against $0.25 per million in
us-east-1): :func:`weighted`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

AV = Mapping[str, Any]  # one attribute value, DynamoDB JSON: {"S": ...}, {"N": ...}, ...
Item = Mapping[str, AV]

READ_UNIT = 4096
WRITE_UNIT = 1024
INDEX_OVERHEAD = 100
WRITE_WEIGHT = 5  # on-demand: a write request unit costs five read request units


@dataclass(frozen=True)
class Index:
    """A global secondary index: its key attributes (projection ALL)."""

    name: str
    hash: str
    range: str | None = None

    def holds(self, item: Item | None) -> bool:
        """Is the item in the index (sparse: it has every key attribute)?"""
        return item is not None and self.hash in item and (self.range is None or self.range in item)

    def key(self, item: Item) -> tuple[Any, ...]:
        return (_plain(item[self.hash]), None if self.range is None else _plain(item[self.range]))


#: rasd's table (docs/schema.md): both indexes project ALL
INDEXES = (
    Index("leased_resources", "key", "pool_id"),
    Index("available_resources", "partition", "lease_available"),
)


def _plain(av: AV) -> Any:
    ((kind, v),) = av.items()
    return (kind, repr(v))


def _number_size(text: str) -> int:
    d = Decimal(text).normalize()
    digits = len(d.as_tuple().digits) if d != 0 else 1
    return (digits + 1) // 2 + 1


def value_size(av: AV) -> int:
    """The size of one attribute value (without its name)."""
    ((kind, v),) = av.items()
    if kind == "S":
        return len(v.encode())
    if kind == "N":
        return _number_size(v)
    if kind == "B":
        return len(v) * 3 // 4 if isinstance(v, str) else len(v)  # base64 text or raw bytes
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in v)
    if kind == "NS":
        return sum(_number_size(s) for s in v)
    if kind == "BS":
        return sum(len(b) for b in v)
    if kind == "L":
        return 3 + sum(value_size(e) + 1 for e in v)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(e) + 1 for k, e in v.items())
    raise ValueError(f"unknown attribute type {kind!r}")


def item_size(item: Item | None) -> int:
    """The item's size in bytes (0: no item)."""
    if item is None:
        return 0
    return sum(len(name.encode()) + value_size(av) for name, av in item.items())


def read_units(size: int, consistent: bool) -> float:
    """One item read (GetItem), or one Query page of ``size`` bytes read in all."""
    units = max(1, math.ceil(size / READ_UNIT))
    return units if consistent else units / 2


def write_units(before: Item | None, after: Item | None) -> int:
    """The base table's units of a write that applied (after None: a delete)."""
    return max(1, math.ceil(max(item_size(before), item_size(after)) / WRITE_UNIT))


def refused_write_units(existing: Item | None) -> int:
    """A write whose condition failed: the existing item's size, at least one unit."""
    return max(1, math.ceil(item_size(existing) / WRITE_UNIT))


def _entry_units(item: Item) -> int:
    return max(1, math.ceil((item_size(item) + INDEX_OVERHEAD) / WRITE_UNIT))


def index_write_units(
    before: Item | None, after: Item | None, indexes: tuple[Index, ...] = INDEXES
) -> dict[str, int]:
    """What each index bills for a write that applied (indexes it does not touch: absent)."""
    out: dict[str, int] = {}
    for ix in indexes:
        was, now = ix.holds(before), ix.holds(after)
        if was and now:
            assert before is not None and after is not None
            if ix.key(before) != ix.key(after):
                out[ix.name] = _entry_units(before) + _entry_units(after)
            elif dict(before) != dict(after):
                out[ix.name] = _entry_units(after)
        elif was:
            assert before is not None
            out[ix.name] = _entry_units(before)
        elif now:
            assert after is not None
            out[ix.name] = _entry_units(after)
    return out


def weighted(read: float, write: float) -> float:
    """Read-unit equivalents of a bill: writes weighed as on-demand pricing weighs them."""
    return read + WRITE_WEIGHT * write


__all__ = [
    "INDEXES",
    "Index",
    "index_write_units",
    "item_size",
    "read_units",
    "refused_write_units",
    "value_size",
    "weighted",
    "write_units",
]

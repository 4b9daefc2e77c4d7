"""A scripted table for the steps' programs (rasd.steps) and the jobs' programs built on them:
plain items by key, one dict per region's replica, on which ``perform`` runs a program's
effects (writes through ``rasd.core.writes.apply``, as the checker evaluates them), recording
every call; with fixed time and the rules and liberator run the tests share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from rasd.core.builders import claim, new_resource_item
from rasd.core.decide import Outcome, Rules
from rasd.core.lease import US, Mapping, ResourceItem, fmt_time, map_pk
from rasd.core.map_builders import map_acquire, map_confirm
from rasd.core.serialize import mapping_from, resource_from
from rasd.core.writes import ItemKey, Value, Write, apply, item_from_av
from rasd.steps import At, Delete, GetItem, Note, Put, Send, WriteResult, drive_sync
from rasd.steps import repair as repair_steps

NOW = 1_700_000_000 * US
HOUR = 3600 * US
Q = 57 * US  # quarantine
G = 5 * US  # clock-skew bound
M = 10 * US  # skew margin
EAST, WEST = "us-east-1", "us-west-2"

Item = dict[str, Value]


class Table:
    """Plain items by key, one dict per region's replica (all equal unless a test says);
    ``perform`` runs a program's effects on them and records the calls."""

    def __init__(self) -> None:
        self.items: dict[ItemKey, Item] = {}
        self.lagging: dict[str, dict[ItemKey, Item]] = {}  # region -> what its replica shows
        self.calls: list[Any] = []
        self.counts: Counter[str] = Counter()
        self.before: dict[int, Callable[[], None]] = {}  # call number -> hook

    def perform(self, eff: Any) -> Any:
        if isinstance(eff, Note):
            if not eff.level:
                self.counts[eff.event] += 1
            return None
        self.calls.append(eff)
        hook = self.before.pop(len(self.calls), None)
        if hook is not None:
            hook()
        region = None
        if isinstance(eff, At):
            region, eff = eff.region, eff.call
        if isinstance(eff, GetItem):
            view = self.lagging.get(region or "", self.items)
            got = view.get(eff.key)
            return dict(got) if got is not None else None
        if isinstance(eff, Send):
            return self.land(eff.write)
        if isinstance(eff, Put):
            if eff.only_new and eff.key in self.items:
                return WriteResult(Outcome.REJECTED)
            self.items[eff.key] = {k: str(next(iter(v.values()))) for k, v in eff.item.items()}
            return WriteResult(Outcome.APPLIED)
        if isinstance(eff, Delete):
            self.items.pop(eff.key, None)
            return WriteResult(Outcome.APPLIED)
        raise AssertionError(eff)

    def land(self, w: Write) -> WriteResult:
        new = apply(self.items.get(w.key), w)
        if new is None:
            return WriteResult(Outcome.REJECTED)
        self.items[w.key] = new
        return WriteResult(Outcome.APPLIED, dict(new))

    def run(self, prog: Any) -> Any:
        return drive_sync(prog, self.perform)

    def res(self, name: str) -> ResourceItem:
        return resource_from(self.items[("c", name)])

    def mapping(self, key: str, region: str = EAST) -> Mapping:
        return mapping_from(self.items[(map_pk("c", "p", key), region)])

    def writes(self) -> list[str]:
        return [
            (e.call if isinstance(e, At) else e).write.kind
            for e in self.calls
            if isinstance(e.call if isinstance(e, At) else e, Send)
        ]

    # ---------------------------------------------------------------- building the table
    def free(self, name: str, region: str = EAST) -> ResourceItem:
        self.items[("c", name)] = item_from_av(new_resource_item("c", "p", region, name, NOW))
        return self.res(name)

    def lease(
        self,
        name: str,
        key: str,
        end: int,
        region: str = EAST,
        acquired: int = NOW - HOUR,
        mapped: bool = True,
        token: str | None = None,
    ) -> ResourceItem:
        """A held item (claimed at ``acquired``); with ``mapped`` its key's mapping names it,
        live."""
        r = self.free(name, region)
        tok = token or f"t-{name}"
        mid = (map_pk("c", "p", key), region)
        ver = int(self.items.get(mid, {}).get("ver", 0))
        self.items[("c", name)] = self.items[("c", name)] | {"lease_available": fmt_time(acquired)}
        assert self.land(claim(self.res(name), key, end, acquired, tok, ver + 1)).outcome is (
            Outcome.APPLIED
        )
        if mapped:
            self.land(map_acquire(mid, ver, tok, name, r.version, end, acquired, "d1"))
            self.land(map_confirm(self.mapping(key, region)))
        return self.res(name)


RULES = Rules(margin_us=M, grace_us=G, pending_hold_us=2 * US, quarantine_us=Q, confirm_us=US)

RUN = repair_steps.LiberatorRun(NOW, grace_us=60 * US, orphan_age_us=120 * US, quarantine_us=Q)


class Rec(Table):
    """A Table that also records every note: (event, level, fields)."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[tuple[str, str, dict[str, object]]] = []
        self.results: dict[int, WriteResult] = {}  # call number -> forced write result

    def perform(self, eff: Any) -> Any:
        if isinstance(eff, Note):
            self.notes.append((eff.event, eff.level, dict(eff.fields)))
        if isinstance(eff, Send) and len(self.calls) + 1 in self.results:
            self.calls.append(eff)
            return self.results.pop(len(self.calls))
        return super().perform(eff)

    def counted(self) -> list[str]:
        return [e for e, lvl, _ in self.notes if not lvl]

    def logged(self) -> list[tuple[str, str, dict[str, object]]]:
        return [n for n in self.notes if n[1]]

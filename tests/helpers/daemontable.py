"""The scripted table that drives the daemon's programs (rasd.steps) in the unit tests: plain
items by key, on which ``perform`` runs a program's effects (writes through
``rasd.core.writes.apply``, as the checker evaluates them) and records them; with fixed time,
the rules and a pool the tests share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from rasd.core.builders import claim, new_resource_item
from rasd.core.decide import Outcome, Rules
from rasd.core.errors import RasdError
from rasd.core.lease import (
    US,
    Mapping,
    Pool,
    ResourceItem,
    fmt_time,
    map_pk,
)
from rasd.core.map_builders import map_acquire, map_confirm
from rasd.core.serialize import mapping_from, resource_from
from rasd.core.writes import ItemKey, Value, Write, apply, item_from_av
from rasd.steps import (
    GetItem,
    Join,
    Mono,
    Note,
    Now,
    QueryLeased,
    QueryMappings,
    Send,
    Sleep,
    Spawn,
    WriteResult,
    drive_sync,
)
from rasd.steps.daemon import (
    CacheDrop,
    CachePut,
    DaemonContext,
    Deadline,
    NewToken,
    RelistLater,
)

NOW = 1_700_000_000 * US
HOUR = 3600 * US
Q = 57 * US  # quarantine
G = 5 * US  # grace (clock-skew bound)
M = 10 * US  # margin
EAST, WEST, SOUTH = "us-east-1", "us-west-2", "sa-east-1"
RULES = Rules(margin_us=M, grace_us=G, pending_hold_us=2 * US, quarantine_us=Q, confirm_us=US)
POOL = Pool("c", "p", 2 * HOUR)
MONO = 42.0  # what Mono answers

Item = dict[str, Value]


def daemon(legacy: bool = False, **kw: Any) -> DaemonContext:
    return DaemonContext(EAST, "host-1", RULES, legacy_agents=legacy, **kw)


class Table:
    """Plain items by key; ``perform`` runs a program's effects on them and records them.
    ``script``: results to answer a write of that kind with, instead of applying it;
    ``fail``: the error a call of that type raises; ``before``: hooks run before the call of
    that number (1-based, notes not counted); spawned programs are kept for :meth:`drain`."""

    def __init__(self) -> None:
        self.items: dict[ItemKey, Item] = {}
        self.calls: list[Any] = []
        self.counts: Counter[str] = Counter()
        self.logs: list[tuple[str, tuple[tuple[str, object], ...], str]] = []
        self.now = NOW
        self.script: dict[str, list[WriteResult]] = {}
        self.scripted: Counter[str] = Counter()
        self.fail: dict[type, RasdError] = {}
        self.before: dict[int, Callable[[], None]] = {}
        self.on_sleep: Callable[[Sleep], None] | None = None
        self.spawned: list[Spawn] = []
        self.bare: list[str] = []  # kinds of the writes sent without a read-back

    def perform(self, eff: Any) -> Any:
        if isinstance(eff, Note):
            if eff.level:
                self.logs.append((eff.event, eff.fields, eff.level))
            else:
                self.counts[eff.event] += 1
            return None
        self.calls.append(eff)
        hook = self.before.pop(len(self.calls), None)
        if hook is not None:
            hook()
        if type(eff) in self.fail:
            raise self.fail[type(eff)]
        if isinstance(eff, Now):
            return self.now
        if isinstance(eff, Mono):
            return MONO
        if isinstance(eff, NewToken):
            return "tok"
        if isinstance(eff, GetItem):
            got = self.items.get(eff.key)
            return dict(got) if got is not None else None
        if isinstance(eff, QueryMappings):
            pk = map_pk(eff.client_id, eff.pool_id, eff.key)
            return [mapping_from(v) for k, v in self.items.items() if k[0] == pk]
        if isinstance(eff, QueryLeased):
            return [
                resource_from(v)
                for k, v in self.items.items()
                if not k[0].startswith("#")
                and (v.get("client_id"), v.get("pool_id"), v.get("key"))
                == (eff.client_id, eff.pool_id, eff.key)
            ]
        if isinstance(eff, Send):
            if eff.readback is None:
                self.bare.append(eff.write.kind)
            scripted = self.script.get(eff.write.kind, [])
            n = self.scripted[eff.write.kind]
            if n < len(scripted):  # the lists are left as given (parameters are shared)
                self.scripted[eff.write.kind] += 1
                return scripted[n]
            return self.land(eff.write, eff.readback)
        if isinstance(eff, Spawn):
            self.spawned.append(eff)
            return len(self.spawned)
        if isinstance(eff, Sleep):
            if self.on_sleep is not None:
                self.on_sleep(eff)
            return None
        if isinstance(eff, (Deadline, CachePut, CacheDrop, RelistLater, Join)):
            return None
        raise AssertionError(eff)

    def land(self, w: Write, readback: Any = None) -> WriteResult:
        old = self.items.get(w.key)
        new = apply(old, w)
        if new is None:
            return WriteResult(Outcome.REJECTED)
        if readback is not None:
            assert readback(new), f"{w.kind}: the read-back misses the write"
            assert old is None or not readback(old), f"{w.kind}: the read-back holds before"
        self.items[w.key] = new
        return WriteResult(Outcome.APPLIED, dict(new))

    def run(self, prog: Any) -> Any:
        return drive_sync(prog, self.perform)

    def drain(self) -> None:
        """Run the spawned programs (and theirs) to their end."""
        while self.spawned:
            s = self.spawned.pop(0)
            self.run(s.fn(*s.args))

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.calls if isinstance(e, kind)]

    def writes(self) -> list[str]:
        return [e.write.kind for e in self.of(Send)]

    def res(self, name: str) -> ResourceItem:
        return resource_from(self.items[("c", name)])

    def mapping(self, key: str, region: str = EAST) -> Mapping:
        return mapping_from(self.items[(map_pk("c", "p", key), region)])

    def set(self, ident: ItemKey, **attrs: Value | None) -> None:
        item = dict(self.items[ident])
        for a, v in attrs.items():
            if v is None:
                item.pop(a, None)
            else:
                item[a] = v
        self.items[ident] = item

    # ---------------------------------------------------------------- building the table
    def free(self, name: str, region: str = EAST) -> ResourceItem:
        self.items[("c", name)] = item_from_av(new_resource_item("c", "p", region, name, NOW))
        return self.res(name)

    def claimed(self, name: str, key: str, end: int, token: str, region: str = EAST) -> int:
        """A claim of ``token`` on a new item; returns the mapping version it names."""
        self.free(name, region)
        mid = (map_pk("c", "p", key), region)
        ver = int(self.items.get(mid, {}).get("ver", 0))
        self.set(("c", name), lease_available=fmt_time(NOW - HOUR))
        got = self.land(claim(self.res(name), key, end, NOW - HOUR, token, ver + 1))
        assert got.outcome is Outcome.APPLIED
        return ver

    def pending(
        self, name: str, key: str, end: int, token: str, region: str = EAST, landed: bool = True
    ) -> Mapping:
        """The key's mapping names ``token``'s claim of ``name``, pending (since NOW - HOUR);
        with ``landed`` the claim is on the item."""
        mid = (map_pk("c", "p", key), region)
        ver = int(self.items.get(mid, {}).get("ver", 0))
        if landed:
            self.claimed(name, key, end, token, region)
        else:
            self.free(name, region)
        r = self.res(name)
        rver = r.version - 1 if landed else r.version
        self.land(map_acquire(mid, ver, token, name, rver, end, NOW - HOUR, "d1"))
        return self.mapping(key, region)

    def lease(
        self, name: str, key: str, end: int, token: str = "t1", region: str = EAST
    ) -> Mapping:
        """A live lease of ``key`` on ``name``, held by ``token``."""
        self.pending(name, key, end, token, region)
        self.land(map_confirm(self.mapping(key, region)))
        return self.mapping(key, region)

    def paper(self, name: str, key: str, end: int, region: str = EAST) -> ResourceItem:
        """A lease of the paper's agent: the item holds the key, no mapping names it."""
        self.free(name, region)
        self.set(("c", name), key=key, lease_expires=fmt_time(end), lease_available=None)
        return self.res(name)

"""The rollout record (``rasd.core.rollout``) and how a daemon follows it, on a stub store.

A daemon runs rollout mode's rules when the table's record says so or its config forces it;
it reads the record with its pools; a resource item it reads that holds a lease of the
paper's agent, while the record says none writes the table, turns the mode on at once and
writes the record on.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from rasd.config import Config
from rasd.core import rollout
from rasd.core.decide import Outcome
from rasd.core.lease import META_CLIENT, ResourceItem, fmt_time
from rasd.core.writes import Value, Write, apply
from rasd.daemon.coordinator import Coordinator
from rasd.dynamo.store import Store
from rasd.observe.metrics import Counters
from rasd.steps import GetItem, WriteResult
from tests.doubles.clock import FakeClock

NOW = 1_700_000_000 * 1_000_000


class _Store:
    """A dict of items: GetItem, conditional writes (``rasd.core.writes.apply``), pools."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.items: dict[tuple[str, str], dict[str, Value]] = {}
        self.writes: list[Write] = []

    async def list_pools(self, deadline: float) -> list[Any]:
        return []

    async def get_item(self, key: tuple[str, str], deadline: float) -> dict[str, Value] | None:
        it = self.items.get(key)
        return None if it is None else dict(it)

    read_rollout = Store.read_rollout  # the real one, over get_item above

    async def write(self, w: Write, deadline: float, readback: Any = None) -> WriteResult:
        self.writes.append(w)
        new = apply(self.items.get(w.key), w)
        if new is None:
            return WriteResult(Outcome.REJECTED)
        self.items[w.key] = new
        return WriteResult(Outcome.APPLIED, item=new)


def _daemon(store: _Store, **cfg: Any) -> Coordinator:
    c = Config(table="t", socket="/nonexistent/x.sock", region="us-east-1", **cfg).validate()
    return Coordinator(c, store, FakeClock(now_us=NOW))  # type: ignore[arg-type]


def test_the_record_reads_off_when_absent_and_writes_conditionally() -> None:
    assert rollout.rollout_from(None) == rollout.Rollout(paper_agents=False, version=0)
    on = apply(None, rollout.set_rollout(True, rollout.Rollout(), NOW, "me", "adopt"))
    assert on is not None and rollout.rollout_from(on).paper_agents and on["version"] == 1
    assert "partition" not in on and "key" not in on  # in neither index
    # a writer that read an older record loses: no blind overwrite
    assert apply(on, rollout.set_rollout(False, rollout.Rollout(), NOW, "me", "end")) is None
    off = apply(on, rollout.set_rollout(False, rollout.rollout_from(on), NOW, "me", "end"))
    assert off is not None and not rollout.rollout_from(off).paper_agents and off["version"] == 2


def test_a_paper_lease_is_one_no_current_rasd_holder_names() -> None:
    base = ResourceItem("c", "r", "p", "us-east-1", "c.p.us-east-1.0", 3)
    held = ResourceItem(
        "c", "r", "p", "us-east-1", "c.p.us-east-1.0", 3, key="k", lease_expires_us=NOW + 10
    )
    assert not rollout.paper_lease(base)  # free
    assert rollout.paper_lease(held)  # no holder at all
    assert not rollout.paper_lease(replace(held, holder="t", hver=3))
    assert rollout.paper_lease(replace(held, holder="t", hver=2))  # a stale holder
    assert rollout.running_paper_lease(held, NOW, 0)
    assert not rollout.running_paper_lease(held, NOW + 11, 0)
    assert rollout.running_paper_lease(held, NOW + 11, 5)  # within the grace


def test_the_daemon_follows_the_record_it_reads_with_its_pools() -> None:
    store = _Store()
    acq = _daemon(store)
    drv = acq.driver
    asyncio.run(acq.pool_table.load(1e12))
    assert drv.steps_daemon().legacy_agents is False
    store.items[rollout.ROLLOUT_KEY] = dict(
        apply(None, rollout.set_rollout(True, rollout.Rollout(), NOW, "me", "adopt")) or {}
    )
    asyncio.run(acq.pool_table.load(1e12))
    assert drv.steps_daemon().legacy_agents is True
    forced = _daemon(_Store(), legacy_agents=True)
    asyncio.run(forced.pool_table.load(1e12))
    assert forced.driver.steps_daemon().legacy_agents is True  # no record, forced on


def test_a_paper_lease_read_turns_rollout_mode_on_and_raises_the_record() -> None:
    store = _Store()
    store.items[("c", "rp")] = {
        "client_id": "c", "resource": "rp", "pool_id": "p", "region": "us-east-1",
        "partition": "c.p.us-east-1.0", "version": 4, "key": "k",
        "lease_expires": fmt_time(NOW + 3_600_000_000),
    }  # fmt: skip
    acq = _daemon(store)
    drv = acq.driver

    async def read_it() -> None:
        from rasd.daemon.driver import Run

        await Run(drv, 1e12).perform(GetItem(("c", "rp")))
        await drv.tasks.drain(5.0)

    asyncio.run(read_it())
    assert drv.rollout.on and drv.counters["rollout.paper_lease_seen"] == 1
    # the daemon raises the signal; the record (in #meta) is the jobs' and rasadmin's
    assert rollout.ROLLOUT_KEY not in store.items
    assert [w.key for w in store.writes] == [rollout.SIGNAL_KEY]
    signal = store.items[rollout.SIGNAL_KEY]
    assert signal["why"] == "paper lease on rp"
    assert rollout.rollout_from(None, signal).paper_agents  # every reader now runs rollout mode
    assert drv.counters["rollout.raised"] == 1
    # another daemon reads it with its pools and follows
    other = _daemon(store)
    asyncio.run(other.pool_table.load(1e12))
    assert other.driver.steps_daemon().legacy_agents is True
    # a meta item or a rasd lease read is no evidence
    store2 = _Store()
    store2.items[(META_CLIENT, "x")] = {"client_id": META_CLIENT, "resource": "x", "key": "k"}
    acq2 = _daemon(store2)
    asyncio.run(_read(acq2, (META_CLIENT, "x")))
    assert not acq2.driver.rollout.on and store2.writes == []


def test_turning_off_clears_the_signal_as_read_and_a_later_raise_turns_it_on_again() -> None:
    on = apply(None, rollout.set_rollout(True, rollout.Rollout(), NOW, "adm", "adopt"))
    sig1 = apply(None, rollout.raise_signal(rollout.rollout_from(on), NOW, "d1", "seen"))
    assert on is not None and sig1 is not None
    seen = rollout.rollout_from(on, sig1)
    assert seen.paper_agents and seen.signal == 1 and seen.cleared == 0
    # end-rollout turns off at the signal it read
    off = apply(on, rollout.set_rollout(False, seen, NOW, "adm", "end"))
    assert off is not None and off["seen_cleared"] == 1
    assert not rollout.rollout_from(off, sig1).paper_agents
    # a raise after that read (version 2) turns every reader on again, record untouched
    sig2 = apply(
        sig1, rollout.raise_signal(rollout.rollout_from(off, sig1), NOW, "d2", "seen again")
    )
    assert sig2 is not None and rollout.rollout_from(off, sig2).paper_agents
    # a raiser that read an older signal loses its write (no blind overwrite), and reads again
    assert (
        apply(sig2, rollout.raise_signal(rollout.rollout_from(off, sig1), NOW, "d3", "late"))
        is None
    )
    # turning on (adopt) keeps the cleared mark; the next off clears the newer signal
    on2 = apply(
        off, rollout.set_rollout(True, rollout.rollout_from(off, sig2), NOW, "adm", "adopt")
    )
    assert on2 is not None and on2["seen_cleared"] == 1
    off2 = apply(
        on2, rollout.set_rollout(False, rollout.rollout_from(on2, sig2), NOW, "adm", "end")
    )
    assert off2 is not None and not rollout.rollout_from(off2, sig2).paper_agents
    # a raise with no record at all is on, and an off without a record clears it
    alone = rollout.rollout_from(None, sig1)
    assert alone.paper_agents and alone.version == 0
    first = apply(None, rollout.set_rollout(False, alone, NOW, "adm", "end"))
    assert first is not None and not rollout.rollout_from(first, sig1).paper_agents


async def _read(acq: Coordinator, key: tuple[str, str]) -> None:
    from rasd.daemon.driver import Run

    await Run(acq.driver, 1e12).perform(GetItem(key))

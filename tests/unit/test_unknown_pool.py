"""A pool that does not exist is remembered UNKNOWN_POOL_TTL on the daemon's clock, and only the
newest UNKNOWN_POOL_MAX of them: made-up pool names cannot grow the daemon."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rasd.config import Config
from rasd.core.errors import UnknownPool
from rasd.daemon.coordinator import Coordinator
from rasd.daemon.pools import UNKNOWN_POOL_MAX, UNKNOWN_POOL_TTL
from rasd.observe.metrics import Counters
from tests.doubles.clock import FakeClock


class _PoolStore:
    """Only what PoolTable.get asks of a store: every pool is missing; lookups are counted."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.lookups = 0

    async def get_pool(self, client_id: str, pool_id: str, deadline: float) -> Any:
        self.lookups += 1
        return None


def _unknown(acq: Coordinator, pool_id: str) -> None:
    with pytest.raises(UnknownPool):
        asyncio.run(acq.pool_table.get("c", pool_id, deadline=1e12))


def test_a_pool_miss_is_remembered_for_its_ttl_then_asked_again() -> None:
    clock, store = FakeClock(), _PoolStore()
    cfg = Config(table="t", socket="/nonexistent/x.sock", region="us-east-1").validate()
    acq = Coordinator(cfg, store, clock)  # type: ignore[arg-type]
    _unknown(acq, "nope")
    _unknown(acq, "nope")
    assert store.lookups == 1
    clock.advance(UNKNOWN_POOL_TTL + 0.001)
    _unknown(acq, "nope")
    assert store.lookups == 2


def test_made_up_pool_names_stay_bounded() -> None:
    clock, store = FakeClock(), _PoolStore()
    cfg = Config(table="t", socket="/nonexistent/x.sock", region="us-east-1").validate()
    acq = Coordinator(cfg, store, clock)  # type: ignore[arg-type]
    for i in range(UNKNOWN_POOL_MAX + 50):
        _unknown(acq, f"p{i}")
    assert len(acq.pool_table._unknown) == UNKNOWN_POOL_MAX
    _unknown(acq, "p0")  # the oldest went first: asked again
    assert store.lookups == UNKNOWN_POOL_MAX + 51

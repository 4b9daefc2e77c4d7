"""A daemon whose clock is stepped 5 s ahead while it serves (``RASD_CLOCK_OFFSET_FILE``'s
clock, read again once a second): it stops answering, the hit included, within seconds, says
why, and serves the same lease again once the clock is back, by itself.

One daemon on moto over HTTP, ``clock_check = "date"`` (this machine's kernel keeps no
synchronised clock; moto's Date header is this host's true time)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import rasd_client
from rasd.core.clock import OffsetClock
from rasd_client import aio
from tests.helpers.deadlines import WAIT
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration]


async def _until(cond: Any, within: float) -> float:
    """Seconds until ``cond()`` held (polled every 50 ms); fails past ``within``."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < within, "not within the bound"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


@pytest.mark.parametrize("client", ["lean", "botocore"])
async def test_a_stepped_clock_stops_the_daemon_until_it_is_back(
    make_daemon: Any, ddb: Any, table: str, tmp_path: Path, client: str
) -> None:
    """Either DynamoDB client reports the Date header (the lean one as it parses an answer,
    botocore's through the store)."""
    seed_pool(ddb, table, count=8)
    offset = tmp_path / "offset"
    offset.write_text("0")
    clock = OffsetClock(str(offset))
    async with make_daemon(clock=clock, clock_check="date", ddb_client=client) as d:

        async def ask(key: str) -> rasd_client.Lease:
            return await aio.get_lease(
                "demo", "default", key, timedelta(minutes=10), timeout=WAIT,
                socket_path=d.cfg.socket,
            )  # fmt: skip

        try:
            first = await ask("k1")
            assert (await ask("k1")).resource == first.resource  # a hit
            guard = d.router.clock_guard
            assert guard.why is None

            offset.write_text("5")
            took = await _until(lambda: guard.why is not None, within=10.0)
            # the step (as measured against the monotonic clock, within the slew of a loaded
            # host), or DynamoDB's answer after it, whichever came first
            assert "stepped by +" in (guard.why or "") or "ahead of DynamoDB" in (guard.why or "")
            for key in ("k1", "k2"):  # the hit and a new key
                with pytest.raises(rasd_client.Unavailable, match="clock is not trusted"):
                    await ask(key)
            with pytest.raises(rasd_client.Unavailable, match="clock is not trusted"):
                await aio.release("demo", "default", "k1", timeout=WAIT, socket_path=d.cfg.socket)
            # its probe's answer (the daemon's own traffic stopped) confirms the offset
            await _until(lambda: "ahead of DynamoDB" in (guard.why or ""), within=10.0)

            offset.write_text("0")
            await _until(lambda: guard.why is None, within=10.0)
            assert (await ask("k1")).resource == first.resource  # nothing was lost
        finally:
            await aio.close()
    assert took < 10.0

"""One caller cannot take the host's leases away from the others: a daemon on moto's server,
one app flooding it with calls whose deadlines DynamoDB cannot meet, another app asking for
new keys beside it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from rasd_client import aio as rasd_aio
from rasd_client.errors import RasdError
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

HOUR = timedelta(hours=1)


async def test_one_callers_1ms_deadlines_leave_the_others_new_keys_answered(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """60 new keys asked one after another with a 1 ms deadline (each DynamoDB attempt cut
    after 1 ms) time out for their caller; they do not open the circuit breaker, so another
    client's new keys, asked right after, are all answered (with the cut attempts counted as
    failures, 20 of them opened it and the other client got UNAVAILABLE)."""
    seed_pool(ddb, table, client_id="other", count=70)
    seed_pool(ddb, table, client_id="demo", count=10)
    async with make_daemon() as d:
        sock = d.cfg.socket

        async def flood(i: int) -> str:
            try:
                await rasd_aio.get_lease(
                    "other", "default", f"f{i}", HOUR, socket_path=sock, timeout=0.001
                )
            except RasdError as exc:
                return f"{exc.code} {exc.message}"
            return "OK"

        # the client's connection first (a 1 ms timeout does not leave time to connect)
        await rasd_aio.get_lease("other", "default", "warm", HOUR, socket_path=sock, timeout=5)
        codes = [await flood(i) for i in range(60)]  # one at a time: past the gate
        # the flood reached the daemon and timed out there (an attempt cut after 1 ms, or,
        # on a loaded machine, a deadline that passed before the attempt could start)
        assert d.counters["err.TIMEOUT"] >= 20, (codes, d.counters.snapshot())
        leases = [
            await rasd_aio.get_lease("demo", "default", f"k{i}", HOUR, socket_path=sock, timeout=5)
            for i in range(10)
        ]
        assert all(lease.new for lease in leases)
        assert len({lease.resource for lease in leases}) == 10
        assert d.counters["ddb.timeouts_cut_short"] > 0, d.counters.snapshot()
        assert d.stats()["breaker"] == "closed"

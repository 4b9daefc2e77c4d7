"""Reading the available index after a random position (``Store.query_available`` with
``after``: the prefetch's random start), against moto over HTTP: a start key that names no
item is placed where it would sort, in both directions, even when every item has the same
lease_available (a pool seeded in one batch)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rasd.config import Config
from rasd.core.lease import partition_of
from rasd.dynamo.store import Store
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration


async def test_start_key_that_names_no_item(moto_endpoint: str, table: str, ddb: Any) -> None:
    names = seed_pool(ddb, table, count=60)
    store = Store(Config(table=table, endpoint_url=moto_endpoint).validate())
    await store.start()
    try:
        part = next(partition_of(n) for n in names)
        deadline = time.monotonic() + 10
        head = await store.query_available(f"demo.default.us-east-1.{part}", 100, True, deadline)
        in_part = sorted(it.resource for it in head)
        assert len({it.lease_available for it in head}) == 1  # seeded in one batch
        when = head[0].lease_available
        assert when is not None
        p = f"demo.default.us-east-1.{part}"
        # "res-00030x" names no item: the page starts with the first name after it
        after = [n for n in in_part if n > "res-00030x"]
        got = await store.query_available(p, 3, True, deadline, after=(when, "demo", "res-00030x"))
        assert [it.resource for it in got] == after[:3]
        before = [n for n in in_part if n < "res-00030x"][::-1]
        got = await store.query_available(p, 3, False, deadline, after=(when, "demo", "res-00030x"))
        assert [it.resource for it in got] == before[:3]
        # past the last item: nothing (the prefetcher then reads the head)
        got = await store.query_available(p, 3, True, deadline, after=(when, "demo", "res-99999"))
        assert got == []
    finally:
        await store.close()

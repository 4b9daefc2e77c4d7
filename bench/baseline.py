"""The baseline: the paper's agent, a plain in-process boto3 module with no daemon and no cache.

``get_lease(client_id, pool_id, key, lease_expires)`` does what the paper describes:

1. Query the ``leased_resources`` index by ``key`` (the paper's "GetItem(key)"): if the key
   holds an unexpired lease in the pool, return it. One round trip.
2. On a miss, Query one random sub-partition of ``available_resources``.
3. Make the conditional claim (``rasd.core.builders.claim``, rendered by
   ``rasd.core.writes.render``: the same UpdateItem the daemon sends for its claim, on the
   same table, so the comparison is fair). Three round trips for a new lease.

This is a baseline of the paper's design, not of rasd's protocol: it writes **no mapping
items** (the paper has none) and finds leases through the ``leased_resources`` index, which
rasd never decides from. Its claim carries a fresh random ``holder`` token and ``mver`` 0, so
its items look like rasd's held items; but no rasd daemon will serve them (no mapping names
them), and ``ras-liberator`` may treat them as orphans once they are older than its
``--orphan-age``. Keep its keys apart from the daemons' keys when both write one table.

With ``paper=True`` it writes what the paper's agent writes, nothing more: the claim is
conditioned on the ``version`` read from the index alone and sets ``key``, ``lease_expires``
and ``version`` (``rasd.core.builders.paper_claim``), and :func:`paper_liberate` is the
paper's hourly liberator. That is the old agent a table keeps running while rasd rolls out
beside it (docs/operations.md): the mixed-fleet tests and the chaos run's mixed mode use it.

A lost race (the condition failed) tries the next candidate of the page; an empty
sub-partition tries another random one. Every DynamoDB call is counted in ``calls``; the
calls of the last ``get_lease`` are in ``last_calls`` (it makes them one after another, so
its round trips are its calls).
"""

from __future__ import annotations

import random
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

import boto3
from botocore.config import Config as BotoConfig

from rasd.core import builders, decide, serialize
from rasd.core import lease as lease_items
from rasd.core.builders import paper_claim, paper_free
from rasd.core.reads import LEASED_INDEX, available_query, leased_query
from rasd.core.writes import render
from rasd.steps.paper import paper_free_expired, paper_get_lease
from rasd_jobs.leases import Driver


def paper_liberate(ddb: Any, table: str, now_us: int) -> dict[str, int]:
    """The paper's liberator, once: Scan the leased index, free every lease whose end has
    passed on this clock (no grace), conditional on the version the Scan read
    (``rasd.steps.paper.paper_free_expired``, the program the protocol checker runs)."""
    counts = {"scanned": 0, "freed": 0, "lost_races": 0}
    driver = Driver(ddb, table)
    kw: dict[str, Any] = {"TableName": table, "IndexName": LEASED_INDEX}
    while True:
        page = ddb.scan(**kw)
        for raw in page.get("Items", []):
            counts["scanned"] += 1
            got = driver.run(paper_free_expired(serialize.item_from_ddb(raw), now_us))
            if got == "freed":
                counts["freed"] += 1
            elif got == "lost_race":
                counts["lost_races"] += 1
        if "LastEvaluatedKey" not in page:
            return counts
        kw["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@dataclass(frozen=True)
class BaselineLease:
    resource: str
    expires_us: int
    version: int
    new: bool
    #: the item's region (a lookup answers an unexpired item of any region)
    region: str = ""


class NoCapacity(Exception):
    pass


class BaselineAgent:
    def __init__(
        self,
        table: str,
        region: str,
        endpoint_url: str | None,
        page: int = 10,
        ddb: Any = None,
        max_pool_connections: int = 10,
        paper: bool = False,
    ) -> None:
        self.table = table
        self.paper = paper
        self.region = region
        self.page = page
        self.calls: Counter[str] = Counter()
        self.last_calls = 0
        self.conflicts = 0
        self.ddb = ddb or boto3.client(
            "dynamodb",
            endpoint_url=endpoint_url,
            region_name=region,
            config=BotoConfig(
                retries={"max_attempts": 3, "mode": "standard"},
                max_pool_connections=max_pool_connections,
                tcp_keepalive=True,
            ),
        )

    def _query(self, **kw: Any) -> dict[str, Any]:
        self.calls["Query"] += 1
        self.last_calls += 1
        return cast(dict[str, Any], self.ddb.query(TableName=self.table, **kw))

    def lookup(self, client_id: str, pool_id: str, key: str, now_us: int) -> BaselineLease | None:
        resp = self._query(**leased_query(key, pool_id))
        items = [serialize.item_from_ddb(it) for it in resp.get("Items", [])]
        items = [it for it in items if it.client_id == client_id and not it.expired(now_us)]
        it = decide.pick(items)
        if it is None:
            return None
        assert it.lease_expires_us is not None
        return BaselineLease(it.resource, it.lease_expires_us, it.version, False, it.region)

    def get_lease(
        self, client_id: str, pool_id: str, key: str, lease_expires_us: int, now_us: int = 0
    ) -> BaselineLease:
        """``now_us``: this host's clock (0: the system's)."""
        self.last_calls = 0
        now = now_us or time.time_ns() // 1000
        if self.paper:
            return self._paper_get_lease(client_id, pool_id, key, lease_expires_us, now)
        found = self.lookup(client_id, pool_id, key, now)
        if found is not None:
            return found
        parts = list(range(lease_items.PARTITIONS))
        random.shuffle(parts)
        for n in parts:
            part = lease_items.partition_name(client_id, pool_id, self.region, n)
            resp = self._query(**available_query(part, self.page))
            cands = [serialize.item_from_ddb(it) for it in resp.get("Items", [])]
            random.shuffle(cands)
            for cand in cands:
                token = secrets.token_hex(8)  # 16 hex digits, as the daemon's tokens
                w = builders.claim(cand, key, lease_expires_us, now, token, 0)
                self.calls["UpdateItem"] += 1
                self.last_calls += 1
                try:
                    r = self.ddb.update_item(
                        TableName=self.table, ReturnValues="ALL_NEW", **render(w)
                    )
                except self.ddb.exceptions.ConditionalCheckFailedException:
                    self.conflicts += 1
                    continue
                it = serialize.item_from_ddb(cast(dict[str, Any], r["Attributes"]))
                return BaselineLease(it.resource, lease_expires_us, it.version, True, it.region)
        raise NoCapacity(f"no free resource in {client_id}/{pool_id}/{self.region}")

    def _paper_get_lease(
        self, client_id: str, pool_id: str, key: str, lease_expires_us: int, now_us: int
    ) -> BaselineLease:
        """The paper's agent: ``rasd.steps.paper.paper_get_lease`` (the program the protocol
        checker runs), over sub-partitions and candidates in a random order."""
        parts = list(range(lease_items.PARTITIONS))
        random.shuffle(parts)
        driver = Driver(self.ddb, self.table)
        prog = paper_get_lease(
            client_id,
            pool_id,
            key,
            self.region,
            lease_expires_us,
            now_us,
            tuple(parts),
            self.page,
            seed=random.getrandbits(32),
        )
        try:
            got = driver.run(prog)
        finally:
            self.calls.update(driver.calls)
            self.last_calls += driver.calls.total()
            self.conflicts += driver.counts["conflicts"]
        if got is None:
            raise NoCapacity(f"no free resource in {client_id}/{pool_id}/{self.region}")
        it = got.item
        assert it.lease_expires_us is not None
        return BaselineLease(it.resource, it.lease_expires_us, it.version, got.new, it.region)


__all__ = [
    "BaselineAgent",
    "BaselineLease",
    "NoCapacity",
    "paper_claim",
    "paper_free",
    "paper_liberate",
]

"""The jobs' driver: the protocol's programs (``rasd.steps.repair``, ``.dedupe``, ``.admin``,
``.paper``) run against DynamoDB with boto3, blocking.

Theory of operation
-------------------
The jobs' protocol is written once, as sans-I/O programs that the protocol checker runs too;
a job scans (its pages are the programs' inputs), hands each item or group to a program, and
:class:`Driver` performs what the program asks, one call at a time:

* a read (``GetItem``, the index queries) returns plain items; a failed read is thrown into
  the program as a :class:`rasd.core.errors.RasdError` whose ``__cause__`` is boto3's exception;
* a write (``Send``: a conditional UpdateItem rendered by ``rasd.core.writes.render``; ``Put``;
  ``Delete``) returns a ``rasd.steps.WriteResult``: APPLIED with the item as written,
  REJECTED when its condition failed (a lost race, a value), UNKNOWN with ``error`` when the
  call failed otherwise (botocore has retried it already; a ``readback`` given with the
  write resolves it by a consistent read, as the daemon does);
* ``At(region, call)`` makes ``call`` in ``region``'s replica (``peers``); a write to a
  region with no endpoint is refused (the programs never ask for one: they check first);
* a ``Note`` with no level is counted under its event name (the job's summary), one with a
  level is logged.

A program that ends with a RasdError it did not catch re-raises boto3's own exception from
:meth:`Driver.run`, so the commands report DynamoDB's failures as before
(``common.run_main``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping as MappingT
from typing import Any

import structlog
from botocore.exceptions import BotoCoreError, ClientError

from rasd.core.decide import Outcome
from rasd.core.errors import RasdError, Unavailable
from rasd.core.lease import ResourceItem, partition_name
from rasd.core.reads import available_query, leased_query
from rasd.core.serialize import item_from_ddb
from rasd.core.writes import ItemKey, item_from_av, key_av, render
from rasd.steps import (
    At,
    Delete,
    GetItem,
    Mono,
    Note,
    Now,
    Program,
    Put,
    QueryAvailable,
    QueryLeased,
    R,
    Send,
    Sleep,
    Together,
    WriteResult,
    drive_sync,
)

from . import common

_log = structlog.get_logger("rasd_jobs")

#: the effects that write (refused in a region with no endpoint)
WRITES = (Send, Put, Delete)


class Driver:
    """Performs programs' effects against ``table`` through ``ddb`` (and ``peers``: region ->
    client of that region's replica). ``counts`` collects the notes' counts."""

    def __init__(
        self,
        ddb: Any,
        table: str,
        peers: MappingT[str, Any] | None = None,
        log: Any = None,
        counts: Counter[str] | None = None,
    ) -> None:
        self.ddb = ddb
        self.table = table
        self.peers = dict(peers or {})
        self.log = log or _log
        self.counts: Counter[str] = Counter() if counts is None else counts
        #: DynamoDB calls made, by operation
        self.calls: Counter[str] = Counter()

    def run(self, prog: Program[R]) -> R:
        """Run ``prog`` to its end. An uncaught failure of a DynamoDB call is re-raised as
        boto3 raised it."""
        try:
            return drive_sync(prog, self.perform)
        except RasdError as exc:
            if isinstance(exc.__cause__, (ClientError, BotoCoreError)):
                raise exc.__cause__ from None
            raise

    # ------------------------------------------------------------------------- effects
    def perform(self, eff: Any, ddb: Any = None) -> Any:
        ddb = ddb or self.ddb
        if isinstance(eff, At):
            peer = self.peers.get(eff.region)
            if peer is None and isinstance(eff.call, WRITES):
                raise Unavailable(f"no endpoint for region {eff.region}: its items are not written")
            return self.perform(eff.call, peer or ddb)
        if isinstance(eff, Note):
            if eff.level:
                getattr(self.log, eff.level)(eff.event, **dict(eff.fields))
            else:
                self.counts[eff.event] += 1
            return None
        if isinstance(eff, GetItem):
            return self.get(ddb, eff.key)
        if isinstance(eff, Send):
            return self.send(ddb, eff)
        if isinstance(eff, Put):
            return self._write(
                "PutItem",
                lambda: ddb.put_item(
                    TableName=self.table,
                    Item=eff.item,
                    **(
                        {"ConditionExpression": "attribute_not_exists(client_id)"}
                        if eff.only_new
                        else {}
                    ),
                ),
            )
        if isinstance(eff, Delete):
            return self._write(
                "DeleteItem", lambda: ddb.delete_item(TableName=self.table, Key=key_av(eff.key))
            )
        if isinstance(eff, QueryLeased):
            return self.query(ddb, leased_query(eff.key, eff.pool_id))
        if isinstance(eff, QueryAvailable):
            part = partition_name(eff.client_id, eff.pool_id, eff.region, eff.partition)
            return self.query(ddb, available_query(part, eff.limit))
        if isinstance(eff, Together):
            return tuple(self.perform(c, ddb) for c in eff.calls)
        if isinstance(eff, Now):
            return time.time_ns() // 1000
        if isinstance(eff, Mono):
            return time.monotonic()
        if isinstance(eff, Sleep):
            time.sleep(eff.seconds)
            return None
        raise TypeError(f"the jobs' driver cannot perform {eff!r}")

    def get(self, ddb: Any, ident: ItemKey) -> dict[str, Any] | None:
        """One strongly consistent GetItem, as a plain dict (None: no item)."""
        resp = self._read(
            "GetItem",
            lambda: ddb.get_item(TableName=self.table, Key=key_av(ident), ConsistentRead=True),
        )
        raw = resp.get("Item")
        return item_from_av(raw) if raw else None

    def query(self, ddb: Any, kw: dict[str, Any]) -> list[ResourceItem]:
        """One page of an index Query (``rasd.core.reads``), its items parsed."""
        resp = self._read("Query", lambda: ddb.query(TableName=self.table, **kw))
        return [item_from_ddb(it) for it in resp.get("Items", [])]

    def send(self, ddb: Any, eff: Send) -> WriteResult:
        res = self._write(
            "UpdateItem",
            lambda: ddb.update_item(
                TableName=self.table, ReturnValues="ALL_NEW", **render(eff.write)
            ),
        )
        if res.outcome is Outcome.UNKNOWN and eff.readback is not None:
            try:
                cur = self.get(ddb, eff.write.key)
            except RasdError:
                return res
            if cur is not None and eff.readback(cur):
                return WriteResult(Outcome.APPLIED, cur)
        return res

    def _read(self, op: str, call: Any) -> Any:
        self.calls[op] += 1
        try:
            return call()
        except Exception as exc:
            raise Unavailable(f"DynamoDB {op}: {exc!r}") from exc

    def _write(self, op: str, call: Any) -> WriteResult:
        self.calls[op] += 1
        try:
            resp = call()
        except Exception as exc:  # noqa: BLE001 - an outcome: the program decides
            if common.is_lost_race(exc):
                return WriteResult(Outcome.REJECTED)
            err = Unavailable(f"DynamoDB {op}: {exc!r}")
            err.__cause__ = exc
            return WriteResult(Outcome.UNKNOWN, error=err)
        attrs = resp.get("Attributes") if isinstance(resp, dict) else None
        return WriteResult(Outcome.APPLIED, item_from_av(attrs) if attrs else None)


def run(ddb: Any, table: str, prog: Program[R], peers: MappingT[str, Any] | None = None) -> R:
    """Run one program against ``table`` (no counts kept)."""
    return Driver(ddb, table, peers).run(prog)


def get(ddb: Any, table: str, ident: ItemKey) -> dict[str, Any] | None:
    """One strongly consistent read, outside any program (a command's report)."""
    resp = ddb.get_item(TableName=table, Key=key_av(ident), ConsistentRead=True)
    raw = resp.get("Item")
    return item_from_av(raw) if raw else None

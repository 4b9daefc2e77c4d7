"""The jobs' driver (:class:`Driver`): the protocol's programs (``rasd.steps.repair``,
``.dedupe``, ``.admin``, ``.paper``) run against DynamoDB with boto3, blocking. How each
effect is performed and what a write's outcome is: docs/design.md, "The jobs, written once".
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping as MappingT
from concurrent.futures import ThreadPoolExecutor
from typing import Any, assert_never, cast

import structlog
from botocore.exceptions import BotoCoreError, ClientError

from rasd.core.decide import Outcome
from rasd.core.errors import RasdError, Unavailable
from rasd.core.lease import ResourceItem, partition_name
from rasd.core.map_builders import read_back
from rasd.core.reads import available_query, leased_query
from rasd.core.serialize import item_from_ddb
from rasd.core.writes import ItemKey, item_from_av, key_av, render
from rasd.dynamo.retry import attempt_failed, classify_code, classify_exception, never_sent
from rasd.steps import (
    At,
    Common,
    DdbCall,
    Delete,
    GetItem,
    Join,
    Mono,
    Note,
    Now,
    Program,
    Put,
    QueryAvailable,
    QueryLeased,
    QueryMappings,
    R,
    Send,
    Sleep,
    Spawn,
    Together,
    WriteResult,
    drive_sync,
)

from . import common

_log = structlog.get_logger("rasd_jobs")

#: the effects that write (refused in a region with no endpoint)
WRITES = (Send, Put, Delete)


class _Call(threading.local):
    """The call under way in this thread: did a failed attempt of it possibly apply?"""

    ambiguous = False


_CALL = _Call()


def _attempt(response: Any = None, caught_exception: BaseException | None = None, **_: Any) -> None:
    """botocore's ``needs-retry`` event, after every attempt of a call: record an attempt
    that failed in a way that may have applied (a 5xx, a read timeout, a connection lost
    after the request went out), as the daemon's store judges its own attempts."""
    if caught_exception is not None:
        failure = classify_exception(caught_exception)
        sent = not never_sent(caught_exception)
    elif response is not None:
        http, parsed = response
        code = (parsed or {}).get("Error", {}).get("Code", "")
        if not code and http.status_code < 300:
            return
        failure, sent = classify_code(code, http.status_code), True
    else:
        return
    if failure.may_have_applied and sent:
        _CALL.ambiguous = True


def _watch(ddb: Any) -> None:
    """Judge every attempt of ``ddb``'s calls (:func:`_attempt`). Once per client: botocore
    keeps one handler per ``unique_id`` (a set of ids kept here would miss a new client that
    reuses a collected one's id)."""
    if hasattr(ddb, "meta"):
        ddb.meta.events.register("needs-retry.dynamodb", _attempt, unique_id=_ATTEMPT_ID)


_ATTEMPT_ID = "rasd-jobs-judge-attempt"


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
        for c in (ddb, *self.peers.values()):
            _watch(c)
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
    def perform(self, eff: Common, ddb: Any = None) -> Any:
        """Perform one effect; ``match`` over every effect a job's program may yield, so an
        effect added without a handler here fails mypy (``assert_never``)."""
        ddb = ddb or self.ddb
        match eff:
            case At():
                peer = self.peers.get(eff.region)
                if peer is None and isinstance(eff.call, WRITES):
                    raise Unavailable(
                        f"no endpoint for region {eff.region}: its items are not written"
                    )
                return self.perform(cast(DdbCall, eff.call), peer or ddb)
            case Note():
                if eff.level:
                    getattr(self.log, eff.level)(eff.event, **dict(eff.fields))
                else:
                    self.counts[eff.event] += 1
                return None
            case GetItem():
                return self.get(ddb, eff.key)
            case Send():
                return self.send(ddb, eff)
            case Put():
                only_new = {"ConditionExpression": "attribute_not_exists(client_id)"}
                return self._write(
                    "PutItem",
                    lambda: ddb.put_item(
                        TableName=self.table, Item=eff.item, **(only_new if eff.only_new else {})
                    ),
                )
            case Delete():
                return self._write(
                    "DeleteItem",
                    lambda: ddb.delete_item(TableName=self.table, Key=key_av(eff.key)),
                )
            case QueryLeased():
                return self.query(ddb, leased_query(eff.key, eff.pool_id))
            case QueryAvailable():
                part = partition_name(eff.client_id, eff.pool_id, eff.region, eff.partition)
                return self.query(ddb, available_query(part, eff.limit))
            case Together():
                return self.together(eff, ddb)
            case Now():
                return time.time_ns() // 1000
            case Mono():
                return time.monotonic()
            case Sleep():
                time.sleep(eff.seconds)
                return None
            case QueryMappings() | Spawn() | Join():
                raise TypeError(f"the jobs' driver cannot perform {eff!r}")
            case _:
                assert_never(eff)

    def together(self, eff: Together, ddb: Any) -> tuple[Any, ...]:
        """The calls at once, as the daemon sends them (boto3's clients are thread-safe);
        their results in order. A read that fails fails the effect, once every call ended."""
        if len(eff.calls) < 2:
            return tuple(self.perform(c, ddb) for c in eff.calls)
        with ThreadPoolExecutor(max_workers=len(eff.calls)) as pool:
            futures = [pool.submit(self.perform, c, ddb) for c in eff.calls]
        return tuple(f.result() for f in futures)

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
        res, ambiguous = self._attempted(
            "UpdateItem",
            lambda: ddb.update_item(
                TableName=self.table, ReturnValues="ALL_NEW", **render(eff.write)
            ),
        )
        if res.outcome is Outcome.APPLIED or not ambiguous:
            return res
        # An attempt may have applied; a lost race then may be our own attempt that won.
        race = res.error is None
        if res.outcome is Outcome.REJECTED and not race:
            return res  # nothing that could apply was sent
        if eff.readback is None:
            if not race:
                return res
            why = "a retry lost its condition after an attempt that may have applied"
            return WriteResult(Outcome.UNKNOWN, error=Unavailable(f"DynamoDB UpdateItem: {why}"))
        try:
            cur = self.get(ddb, eff.write.key)
        except RasdError as exc:
            return WriteResult(Outcome.UNKNOWN, error=res.error or exc)
        seen = read_back(eff.write, cur, eff.readback)
        if seen is True:
            return WriteResult(Outcome.APPLIED, cur)
        if seen is False:
            return WriteResult(Outcome.REJECTED)
        # not shown, not disproved: it may have applied and been written over since
        why = "an attempt may have applied; the item read back neither shows nor disproves it"
        return WriteResult(
            Outcome.UNKNOWN, error=res.error or Unavailable(f"DynamoDB UpdateItem: {why}")
        )

    def _read(self, op: str, call: Any) -> Any:
        self.calls[op] += 1
        try:
            return call()
        except Exception as exc:
            raise Unavailable(f"DynamoDB {op}: {exc!r}") from exc

    def _write(self, op: str, call: Any) -> WriteResult:
        return self._attempted(op, call)[0]

    def _attempted(self, op: str, call: Any) -> tuple[WriteResult, bool]:
        """One write call: its outcome by the store's rules (the module docstring), and
        whether an attempt of it may have applied. A lost race is REJECTED with no error;
        after such an attempt it may be our own earlier attempt that won (:meth:`send`
        reads the write back)."""
        self.calls[op] += 1
        _CALL.ambiguous = False
        try:
            resp = call()
        except common.JobError:
            raise  # refused before it was sent (this host's clock): the job stops
        except Exception as exc:  # noqa: BLE001 - an outcome: the program decides
            failure, unsent, *_ = attempt_failed(exc, "")  # the last attempt, judged again
            ambiguous = _CALL.ambiguous or (failure.may_have_applied and not unsent)
            if common.is_lost_race(exc):
                return WriteResult(Outcome.REJECTED), ambiguous
            err = Unavailable(f"DynamoDB {op}: {exc!r}")
            err.__cause__ = exc
            return WriteResult(Outcome.UNKNOWN if ambiguous else Outcome.REJECTED, error=err), True
        attrs = resp.get("Attributes") if isinstance(resp, dict) else None
        return WriteResult(Outcome.APPLIED, item_from_av(attrs) if attrs else None), False


def run(ddb: Any, table: str, prog: Program[R], peers: MappingT[str, Any] | None = None) -> R:
    """Run one program against ``table`` (no counts kept)."""
    return Driver(ddb, table, peers).run(prog)


def get(ddb: Any, table: str, ident: ItemKey) -> dict[str, Any] | None:
    """One strongly consistent read, outside any program (a command's report)."""
    resp = ddb.get_item(TableName=table, Key=key_av(ident), ConsistentRead=True)
    raw = resp.get("Item")
    return item_from_av(raw) if raw else None

"""The three drivers of the protocol's programs agree on what a write returned: the daemon's
(``rasd.daemon.driver.Run`` over the real ``Store``), the jobs' (``rasd_jobs.leases.Driver``
over boto3) and the checker's interpreter (``check.effects`` over its model of the table).

A program that cannot tell which driver runs it decides alike under each, so every case
below runs the same effect under all three and compares what the program is sent
(``rasd.steps.WriteResult``: the outcome, and whether an error decided it) with the contract
(``rasd.steps``, ``rasd.dynamo.store``, docs/design.md I4), and what the table holds after:

a. a ``Together`` of two writes whose conditions hold: both APPLIED, both changes made;
b. a ``Together`` where one condition fails: that one REJECTED, the other APPLIED (the calls
   are sent at once, not as a transaction);
c. a write never sent (the connection refused): REJECTED with the error, the table unchanged;
d. a write sent whose answer is lost (it applied): the retry's answer lost too, UNKNOWN with
   the error, or APPLIED where a read-back finds it; the retry refused by its condition and
   the write read back, APPLIED; with no read-back, UNKNOWN (a write that applied is never
   REJECTED).

How each driver meets the faults:

* the daemon's: ``tests.doubles.store.Faults`` below the store's client (``down``: the
  connection refused; ``lost_reply``: the call made, then a read timeout; ``timeout``);
  the store's own retries run as in production;
* the jobs': a ``before-send`` hook on the boto3 client, where botocore raises what the
  network does: ``EndpointConnectionError`` (refused) before sending, or the request sent to
  moto by the hook itself and then ``ReadTimeoutError`` (a reply dropped). botocore's own
  retries run, judged by the driver's ``needs-retry`` hook; the client makes two attempts
  rather than the jobs' eight, so each case waits at most one backoff;
* the checker's: the branches ``check.effects.step`` makes of each call, chosen by their
  labels (``NOT SENT``, ``DELAYED/LOST``, ``REPLY LOST, retry rejected, read-back``), and the
  fault-free ones in both orders for a ``Together``. A write in flight lands at a later
  step of the model, so there the table is checked only in the real drivers, and a
  read-back cannot find it yet: the model's read-back after a lost reply is the branch
  where the write landed at once.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from random import Random
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from check.effects import Host, start, step
from check.procs import Proc
from check.rulesets import REAL
from check.world import Config as ModelConfig
from check.world import World
from rasd.config import Config
from rasd.core.clock import Clock
from rasd.core.writes import Cond, ItemKey, Value, Write, item_from_av, key_av, to_av
from rasd.daemon.driver import Driver, RolloutMode, Run
from rasd.daemon.prefetch import Prefetcher
from rasd.steps import Done, Effect, Program, Send, Together, Trace, WriteResult, drive
from rasd_jobs import leases
from tests.doubles.store import Faults, FaultyStore

pytestmark = pytest.mark.integration

A: ItemKey = ("drivers", "ra")
B: ItemKey = ("drivers", "rb")
#: what each case's items hold before it
SEED: dict[ItemKey, int] = {A: 1, B: 1}

#: what a program is sent by a write: its outcome, and whether an error decided it
Seen = tuple[str, bool]
#: the table's items of the case: key -> (version, mark)
Table = dict[ItemKey, tuple[object, object]]


def bump(key: ItemKey, expect: int, mark: str) -> Write:
    """A conditional write, as the protocol's are: on the version read, bumping it."""
    conds = (Cond("version", "=", expect),)
    return Write(key, conds, set=(("version", expect + 1), ("mark", mark)), kind=f"{key[1]}")


def marked(mark: str) -> Callable[[dict[str, Any]], bool]:
    """The read-back of :func:`bump`: the item carries its mark."""
    return lambda item: item.get("mark") == mark


def perform(eff: Effect) -> Program[Any]:
    """The smallest program: ``eff``, and what it was sent."""
    return (yield eff)


def seen(result: WriteResult | tuple[WriteResult, ...]) -> tuple[Seen, ...]:
    results = result if isinstance(result, tuple) else (result,)
    return tuple((r.outcome.value, r.error is not None) for r in results)


def marks(result: WriteResult | tuple[WriteResult, ...]) -> tuple[object, ...]:
    """The mark of the item each APPLIED write returned (None: no item)."""
    results = result if isinstance(result, tuple) else (result,)
    return tuple(None if r.item is None else r.item.get("mark") for r in results)


# ------------------------------------------------------------------------------ the table
def seed(ddb: Any, table: str) -> None:
    for key, version in SEED.items():
        item: dict[str, Value] = {"client_id": key[0], "resource": key[1], "version": version}
        ddb.put_item(TableName=table, Item={k: to_av(v) for k, v in item.items()})


def table_of(ddb: Any, table: str) -> Table:
    out: Table = {}
    for key in SEED:
        raw = ddb.get_item(TableName=table, Key=key_av(key), ConsistentRead=True)["Item"]
        item = item_from_av(raw)
        out[key] = (item.get("version"), item.get("mark"))
    return out


def unchanged() -> Table:
    return {key: (version, None) for key, version in SEED.items()}


def after(**changed: str) -> Table:
    """The table once the writes marked ``changed`` (resource -> mark) applied."""
    out = unchanged()
    for key in SEED:
        if key[1] in changed:
            out[key] = (SEED[key] + 1, changed[key[1]])
    return out


# ----------------------------------------------------------------------- the daemon's driver
class NoLocal:
    """The driver's local effects, none performed: these effects are DynamoDB calls."""

    def _none(self, *args: object) -> None:
        raise AssertionError(f"a local effect: {args!r}")

    refresh = cache_put = cache_drop = miss = relist_later = _none


async def by_daemon(
    moto_endpoint: str, table: str, eff: Effect, plan: Callable[[Faults], object] | None = None
) -> WriteResult | tuple[WriteResult, ...]:
    """``eff`` performed by the daemon's driver, its store's client faulty as ``plan`` says."""
    cfg = Config(table=table, endpoint_url=moto_endpoint, ddb_warm_connections=1).validate()
    faults = Faults(seed=1)
    if plan is not None:
        plan(faults)
    store = FaultyStore(cfg, faults=faults)
    await store.start()
    try:
        clock, rng = Clock(), Random(1)
        prefetch = Prefetcher(cfg, store, clock, store.counters, rng)
        drv = Driver(
            cfg, store, clock, store.counters, rng, RolloutMode(False), NoLocal(), prefetch
        )
        result: WriteResult | tuple[WriteResult, ...] = await drive(
            perform(eff), Run(drv, time.monotonic() + 10).perform
        )
        return result
    finally:
        await store.close()


def lost_replies(faults: Faults, retries: str) -> None:
    """The first UpdateItem applies and its reply is lost; ``retries``: "answered", or
    "lost" too (each times out)."""
    faults.add("lost_reply", ops={"UpdateItem"}, times=1)
    if retries == "lost":
        faults.add("timeout", ops={"UpdateItem"})


# ------------------------------------------------------------------------- the jobs' driver
@pytest.fixture(scope="module")
def jobs_ddb(moto_endpoint: str) -> Any:
    """The jobs' boto3 client: two attempts per call, in botocore's standard mode."""
    client = boto3.client(
        "dynamodb",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        config=BotoConfig(retries={"max_attempts": 2, "mode": "standard"}, read_timeout=5),
    )
    return client


Hook = Callable[..., object]


@contextmanager
def before_send(client: Any, hook: Hook | None) -> Iterator[None]:
    event = "before-send.dynamodb.UpdateItem"
    if hook is not None:
        client.meta.events.register(event, hook)
    try:
        yield
    finally:
        if hook is not None:
            client.meta.events.unregister(event, hook)


def refused(request: Any, **_: Any) -> None:
    """Every attempt: the connection refused before the request left."""
    raise EndpointConnectionError(
        endpoint_url=request.url, error=ConnectionRefusedError(111, "Connection refused")
    )


def reply_lost(retries: str) -> Hook:
    """The first attempt is sent (it applies) and its reply dropped; ``retries``:
    "answered" (sent by botocore), or "lost" (no answer, the request lost)."""
    attempts = [0]

    def hook(request: Any, **_: Any) -> None:
        attempts[0] += 1
        if attempts[0] == 1:
            body = request.body.encode() if isinstance(request.body, str) else request.body
            sent = urllib.request.Request(
                request.url, data=body, headers=dict(request.headers.items()), method="POST"
            )
            with urllib.request.urlopen(sent, timeout=5) as resp:
                resp.read()
        elif retries == "answered":
            return
        raise ReadTimeoutError(endpoint_url=request.url)

    return hook


def by_jobs(
    client: Any, table: str, eff: Effect, hook: Hook | None = None
) -> WriteResult | tuple[WriteResult, ...]:
    with before_send(client, hook):
        result: WriteResult | tuple[WriteResult, ...] = leases.Driver(client, table).run(
            perform(eff)
        )
    return result


# -------------------------------------------------------------------------- the checker's
class Alone(Host):
    """One process on the model's table: where it waits in each world, or how it ended."""

    def __init__(self) -> None:
        self.waiting: dict[int, Proc] = {}
        self.done: dict[int, Done] = {}
        self.worlds: list[World] = []  # kept alive: the dicts above are keyed by id

    def place(self, w: World, old: Proc | None, new: Proc | None) -> None:
        self.worlds.append(w)
        if new is not None:
            self.waiting[id(w)] = new

    def finished(self, w: World, p: Proc, done: Done) -> None:
        self.worlds.append(w)
        self.done[id(w)] = done


def by_checker(eff: Effect) -> list[tuple[str, World, Any]]:
    """Every way the model's interpreter may end ``eff`` (at most one fault): the steps'
    labels, the world after, what the program was sent."""
    w0 = World(ModelConfig(daemons=1, resources=(), max_faults=1, max_crashes=0), REAL)
    for key, version in SEED.items():
        w0.put(key, {"client_id": key[0], "resource": key[1], "version": version})
    host = Alone()
    start(w0, host, Trace("perform", partial(perform, eff), (eff,)), "p")
    ends: list[tuple[str, World, Any]] = []
    frontier = [("", w0)]
    while frontier:
        labels, w = frontier.pop()
        if id(w) in host.done:
            ends.append((labels, w, host.done[id(w)].value))
            continue
        for lab, nxt in step(w, host, host.waiting[id(w)]):
            frontier.append((f"{labels}; {lab}", nxt))
    return ends


def model_table(w: World) -> Table:
    out: Table = {}
    for key in SEED:
        item: dict[str, Value] | None = w.get(key)
        assert item is not None
        out[key] = (item.get("version"), item.get("mark"))
    return out


def one_of(ends: list[tuple[str, World, Any]], label: str) -> list[tuple[str, World, Any]]:
    """The ends whose steps' labels include ``label`` (or, "": those with no fault)."""
    picked = [e for e in ends if (label in e[0] if label else e[1].faults == 0)]
    assert picked, f"the checker has no branch {label!r}: {[e[0] for e in ends]}"
    return picked


# ------------------------------------------------------------------------------ the cases
Show = Callable[[Any, Table], object]


def result_and_table(r: Any, t: Table) -> object:
    return seen(r), marks(r), t


def outcome_and_table(r: Any, t: Table) -> object:
    return seen(r), t


async def real_drivers(
    ddb: Any,
    table: str,
    moto_endpoint: str,
    jobs_ddb: Any,
    eff: Effect,
    show: Show = result_and_table,
    plan: Callable[[Faults], object] | None = None,
    hook: Hook | None = None,
) -> dict[str, object]:
    """``eff`` performed by the daemon's driver (its store's client faulty as ``plan``
    says) and by the jobs' (``hook`` before each send), each on a freshly seeded table:
    ``show`` of what each was sent and of the table after it."""
    got: dict[str, object] = {}
    seed(ddb, table)
    got["daemon"] = show(await by_daemon(moto_endpoint, table, eff, plan), table_of(ddb, table))
    seed(ddb, table)
    got["jobs"] = show(by_jobs(jobs_ddb, table, eff, hook), table_of(ddb, table))
    return got


def checker_ends(eff: Effect, label: str, show: Show = result_and_table) -> dict[str, object]:
    """``show`` of each of the checker's ends of ``eff`` whose labels include ``label``
    ("": those with no fault), keyed by the labels."""
    return {
        f"checker{labels}": show(r, model_table(w))
        for labels, w, r in one_of(by_checker(eff), label)
    }


def agree(got: dict[str, object], want: object) -> None:
    """Each driver's answer is the contract's (a failure shows every driver's)."""
    assert got == dict.fromkeys(got, want)


async def test_a_together_whose_conditions_hold_applies_both(
    ddb: Any, table: str, moto_endpoint: str, jobs_ddb: Any
) -> None:
    """a. Both writes APPLIED, each returning the item as it wrote it; both changes made."""
    eff = Together((Send(bump(A, 1, "a")), Send(bump(B, 1, "b"))))
    want = (("applied", False), ("applied", False)), ("a", "b"), after(ra="a", rb="b")
    got = await real_drivers(ddb, table, moto_endpoint, jobs_ddb, eff)
    got |= checker_ends(eff, "")  # either call may land first
    assert len(got) == 4  # the daemon's, the jobs' and the checker's in both orders
    agree(got, want)


async def test_a_together_is_not_a_transaction(
    ddb: Any, table: str, moto_endpoint: str, jobs_ddb: Any
) -> None:
    """b. One condition fails: that write REJECTED (no error: a lost race is a value), the
    other APPLIED all the same."""
    eff = Together((Send(bump(A, 1, "a")), Send(bump(B, 7, "b"))))
    want = (("applied", False), ("rejected", False)), ("a", None), after(ra="a")
    got = await real_drivers(ddb, table, moto_endpoint, jobs_ddb, eff)
    got |= checker_ends(eff, "")
    assert len(got) == 4
    agree(got, want)


async def test_a_write_never_sent_is_rejected_with_its_error(
    ddb: Any, table: str, moto_endpoint: str, jobs_ddb: Any
) -> None:
    """c. The connection refused on every attempt: nothing that could apply left, so
    REJECTED with the error that says why, and the table as it was."""
    eff = Send(bump(A, 1, "a"), marked("a"))
    down = outcome_and_table
    got = await real_drivers(
        ddb, table, moto_endpoint, jobs_ddb, eff, down,
        plan=lambda f: f.add("down", ops={"UpdateItem"}), hook=refused,
    )  # fmt: skip
    got |= checker_ends(eff, "NOT SENT", down)
    agree(got, ((("rejected", True),), unchanged()))


def landed(r: Any, t: Table) -> object:
    """What was sent, and whether the table shows the write applied."""
    return seen(r), t == after(ra="a")


async def test_a_write_whose_answers_are_lost_is_unknown(
    ddb: Any, table: str, moto_endpoint: str, jobs_ddb: Any
) -> None:
    """d. The write applied and its reply was lost; the retry got no answer either, and the
    write has no read-back: UNKNOWN with the error (I4: nothing is decided on it). The real
    drivers' table shows the write applied; the model's keeps it in flight, to land at a
    step of its choosing."""
    eff = Send(bump(A, 1, "a"))
    got = await real_drivers(
        ddb, table, moto_endpoint, jobs_ddb, eff, landed,
        plan=lambda f: lost_replies(f, "lost"), hook=reply_lost("lost"),
    )  # fmt: skip
    for labels, w, r in one_of(by_checker(eff), "DELAYED/LOST"):
        got[f"checker{labels}"] = seen(r), w.inflight == (eff.write,)
    agree(got, ((("unknown", True),), True))


async def test_a_write_whose_answers_are_lost_is_read_back_when_it_can_be(
    ddb: Any, table: str, moto_endpoint: str, jobs_ddb: Any
) -> None:
    """d. As above with a read-back: ``Send``'s read-back "resolves an unknown outcome by a
    consistent read, where the driver can", and here it can (the table answers reads, the
    deadline is far): APPLIED, with the item as read. In the checker, the lost write is in
    flight, not yet in the table, so the read-back finds it only when it landed at once:
    the branch of the next test."""
    eff = Send(bump(A, 1, "a"), marked("a"))
    got = await real_drivers(
        ddb, table, moto_endpoint, jobs_ddb, eff,
        plan=lambda f: lost_replies(f, "lost"), hook=reply_lost("lost"),
    )  # fmt: skip
    agree(got, ((("applied", False),), ("a",), after(ra="a")))


async def test_a_lost_reply_whose_retry_is_refused_is_read_back_as_applied(
    ddb: Any, table: str, moto_endpoint: str, jobs_ddb: Any
) -> None:
    """d. The write applied and its reply was lost; the retry is refused by its condition
    (the first attempt changed the version), so the item is read back with the write's
    read-back, which finds it: APPLIED, with the item as read, never a lost race."""
    eff = Send(bump(A, 1, "a"), marked("a"))
    got = await real_drivers(
        ddb, table, moto_endpoint, jobs_ddb, eff,
        plan=lambda f: lost_replies(f, "answered"), hook=reply_lost("answered"),
    )  # fmt: skip
    got |= checker_ends(eff, "applied, REPLY LOST, retry rejected")
    agree(got, ((("applied", False),), ("a",), after(ra="a")))


async def test_a_lost_reply_whose_retry_is_refused_without_a_read_back_is_unknown(
    ddb: Any, table: str, moto_endpoint: str, jobs_ddb: Any
) -> None:
    """d. As above with no read-back (the daemon's map_confirm, fence and relist writes have
    none): the write applied, so it is not REJECTED ("did not and will not apply",
    rasd.dynamo.store), and nothing read tells that it applied: UNKNOWN, with the error.
    The checker's branch for it is the write in flight landing at once."""
    eff = Send(bump(A, 1, "a"))
    got = await real_drivers(
        ddb, table, moto_endpoint, jobs_ddb, eff, landed,
        plan=lambda f: lost_replies(f, "answered"), hook=reply_lost("answered"),
    )  # fmt: skip
    ends = by_checker(eff)
    assert not [e for e in ends if "retry rejected" in e[0]], "no read-back: no branch of its own"
    for labels, w, r in one_of(ends, "DELAYED/LOST"):
        got[f"checker{labels}"] = seen(r), w.inflight == (eff.write,)
    agree(got, ((("unknown", True),), True))

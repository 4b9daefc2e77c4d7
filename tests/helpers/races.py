"""The plumbing of the race scenarios (the evidence scripts made tests): real daemons' roles
(``rasd.daemon.coordinator.Coordinator`` over a real Store) on one FakeClock against moto's
server, in either mode of the table's rollout record, the items read back, and the probe of I1
that ends each scenario (a resource is never answered to two keys while a lease on it runs).

The modes: ``fast`` is a fresh table with the shipped defaults (``Config().legacy_agents`` is
False: the table decides, and a table rasd creates has no record); ``rollout`` is the table's
record turned on by the real ``rasadmin adopt`` before any daemon starts. :func:`start` checks
the mode each daemon actually runs, so a scenario cannot silently run the wrong rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from rasd.config import Config
from rasd.core import lease as lease_items
from rasd.core.errors import NoCapacity, RasdError
from rasd.core.writes import item_from_av
from rasd.daemon.coordinator import Coordinator
from rasd.dynamo.store import Store
from rasd_jobs import admin, common, liberator
from tests.doubles.clock import FakeClock

#: the two modes every race scenario runs in
MODES = ("fast", "rollout")
#: how long a scenario waits for an event another actor makes happen: far more than it takes
#: on a loaded 2-core machine (the wait ends as soon as the event happens)
WAIT = 20.0


def set_mode(ddb: Any, url: str, table: str, mode: str, region: str = "us-east-1") -> None:
    """Put a fresh ``table`` in ``mode``: ``rollout`` through the real ``rasadmin adopt``
    (whose first step turns the table's rollout record on), ``fast`` as rasd created it."""
    assert mode in MODES, mode
    if mode == "rollout":
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = admin.main(["adopt", "--endpoint-url", url, "--table", table, "--region", region])
        lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("{")]
        out = json.loads(lines[-1]) if lines else None
        assert rc == 0 and out and out.get("rollout") is True, (rc, out)
    assert common.read_rollout(ddb, table).paper_agents is (mode == "rollout")


async def start(
    url: str,
    table: str,
    name: str,
    clock: FakeClock,
    region: str = "us-east-1",
    mode: str | None = None,
    **overrides: Any,
) -> Coordinator:
    """A daemon's roles on ``clock`` (``overrides``: Config settings, else the shipped
    defaults), its pool table loaded; ``mode``: the mode it must run after reading the
    table's record (checked)."""
    cfg = Config(
        table=table, endpoint_url=url, region=region, socket=f"/nonexistent/{name}.sock",
        **overrides,
    )  # fmt: skip
    store = Store(cfg.validate())
    await store.start()
    d = Coordinator(cfg, store, clock=clock)
    d.driver.owner = name
    await d.pool_table.load(time.monotonic() + WAIT)
    if mode is not None:
        runs = "rollout" if d.driver.rollout.on else "fast"
        assert runs == mode, f"{name} runs {runs}, the scenario wants {mode}"
    return d


async def settle(d: Coordinator, timeout: float = WAIT) -> None:
    """Wait until ``d`` has no background work or shared resolution left running (each may
    start more), at most ``timeout``; nothing is cancelled."""
    tasks = d.driver.tasks
    end = time.monotonic() + timeout
    while pending := tasks.background | tasks.requests:
        left = end - time.monotonic()
        assert left > 0, f"{d.driver.owner}: background work still running after {timeout} s"
        await asyncio.wait(pending, timeout=left)


async def close(*ds: Coordinator) -> None:
    for d in ds:
        await d.drain(2.0)
        refills = [t for t in d.prefetch._refills.values() if not t.done()]
        if refills:
            await asyncio.wait(refills, timeout=2.0)
        await d.prefetch.stop()
        await d.store.close()
        await d.driver.close_peers()


def dead_endpoint() -> str:
    """An endpoint nothing listens on (a region whose link is down)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def item(ddb: Any, table: str, resource: str, client_id: str = "demo") -> dict[str, Any] | None:
    raw = ddb.get_item(
        TableName=table,
        Key={"client_id": {"S": client_id}, "resource": {"S": resource}},
        ConsistentRead=True,
    ).get("Item")
    return item_from_av(raw) if raw else None


def mapping(
    ddb: Any, table: str, key: str, region: str, client_id: str = "demo", pool_id: str = "default"
) -> dict[str, Any] | None:
    raw = ddb.get_item(
        TableName=table,
        Key={
            "client_id": {"S": lease_items.map_pk(client_id, pool_id, key)},
            "resource": {"S": region},
        },
        ConsistentRead=True,
    ).get("Item")
    return item_from_av(raw) if raw else None


def claimable_from(it: dict[str, Any] | None) -> int | None:
    """When a free item is claimable: the end of its quarantine (``quarantine_until``: out of
    the available index until re-listed) or, once listed, its ``lease_available``; None for
    an item still held (or gone)."""
    if it is None or it.get("key") is not None:
        return None
    v = it.get("quarantine_until") or it.get("lease_available")
    return None if v is None else lease_items.parse_time(str(v))


def names(kw: dict[str, Any]) -> set[str]:
    """The attributes an UpdateItem's expressions name."""
    return set(kw.get("ExpressionAttributeNames", {}).values())


def removed(kw: dict[str, Any]) -> set[str]:
    """The attributes an UpdateItem REMOVEs."""
    expr = kw.get("UpdateExpression", "")
    if "REMOVE" not in expr:
        return set()
    part = expr.split("REMOVE", 1)[1].split(" ADD ")[0].split(" SET ")[0]
    alias = kw.get("ExpressionAttributeNames", {})
    return {alias.get(a.strip(), a.strip()) for a in part.split(",")}


def error_code(exc: BaseException) -> str:
    """A botocore ClientError's code, else the exception's type."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    return str(code) if code else type(exc).__name__


async def noted(seen: list[str], what: str, call: Awaitable[Any]) -> Any:
    """Make a hooked call and note in ``seen`` that ``what`` applied or was refused."""
    try:
        out = await call
    except Exception as exc:
        seen.append(f"{what} refused ({error_code(exc)})")
        raise
    seen.append(f"{what} applied")
    return out


@dataclass
class Probe:
    """What :func:`probe_second_key` saw: when ``resource`` was claimable after the race
    (None: still held), the moment of the probe, what the other key was answered, and when
    the resource was claimable after the liberator's pass."""

    t0: int
    resource: str
    ends: int
    skew_us: int
    claimable: int | None
    at: int
    got: str | None
    claimable_after: int | None

    def rel(self, us: int | None) -> str:
        return "held" if us is None else f"t0{(us - self.t0) / lease_items.US:+.0f}s"

    def check(self, story: str = "") -> None:
        """I1: the other key is never answered the resource while the first answer runs,
        and the freed resource is not claimable before that answer's end plus the skew
        (``story``: what the scenario saw, for the failure's message)."""
        floor = self.ends + self.skew_us
        what = (
            f"{self.resource} claimable from {self.rel(self.claimable)} (after the liberator: "
            f"{self.rel(self.claimable_after)}); the first key was answered {self.resource} "
            f"until {self.rel(self.ends)} (+ skew {self.skew_us / lease_items.US:g} s); at "
            f"{self.rel(self.at)} another key was answered {self.got}. {story}"
        )
        overlap = self.got == self.resource and self.at < self.ends
        assert not overlap, "I1 broken: " + what
        early = [w for w in (self.claimable, self.claimable_after) if w is not None and w < floor]
        assert not early, "claimable before the first answer's end plus the skew: " + what


async def probe_second_key(
    ddb: Any,
    url: str,
    table: str,
    clock: FakeClock,
    resource: str,
    ends: int,
    t0: int,
    region: str = "us-east-1",
    mode: str | None = None,
    client_id: str = "demo",
    pool_id: str = "default",
    key: str = "k2",
    **overrides: Any,
) -> Probe:
    """The earliest moment ``resource`` can be served to another key before ``ends`` (the end
    of the first answer of it): just past its claimable time if it is free, else just before
    ``ends``. There the real ``ras-liberator`` re-lists (and repairs) ``region``'s items, then
    a new daemon of the region asks for ``key``."""
    claimable = claimable_from(item(ddb, table, resource, client_id))
    at = (
        ends - lease_items.US
        if claimable is None
        else min(claimable + lease_items.US, ends - lease_items.US)
    )
    if at > clock.now_us():
        clock.advance((at - clock.now_us()) / lease_items.US)
    liberator.run(
        ddb, liberator.Options(table=table, region=region, now_us=clock.now_us(), segments=1)
    )
    after = claimable_from(item(ddb, table, resource, client_id))
    d = await start(url, table, "prober", clock, region, mode=mode, **overrides)
    try:
        lease, _ = await d.acquirer.get_lease(
            client_id, pool_id, key, clock.now_us() + 600 * lease_items.US, time.monotonic() + WAIT
        )
        got: str | None = lease.resource
    except NoCapacity:
        got = None
    except RasdError as exc:
        got = f"none ({type(exc).__name__})"
    finally:
        await close(d)
    skew_us = int(Config().max_clock_skew * lease_items.US)
    return Probe(t0, resource, ends, skew_us, claimable, clock.now_us(), got, after)

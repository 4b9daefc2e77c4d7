"""One room per job: a get_lease followed from the daemon's entry down to DynamoDB.

A request walks through the daemon's modules as through rooms: it enters each once on its
way in and leaves it once, beside the driver's own calls out and back (the driver runs a
program of rasd/steps/, which asks it for each effect, which the store performs). The trace
is taken with ``sys.setprofile`` in the event loop's thread (the client runs in another),
kept to rasd's modules; the pure core (rasd.core), instrumentation (rasd.observe) and the
limits (rasd.limits) are services any room may call, not rooms. :func:`reentries` is the
rule; ``test_the_rule_*`` show what it catches.
"""

from __future__ import annotations

import asyncio
import dis
import socket
import sys
import time
from types import FrameType
from typing import Any

import pytest

from rasd_client import wire
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

C, P = "demo", "default"
#: modules any room may call: not rooms themselves
SERVICES = ("rasd.core.", "rasd.observe.", "rasd.limits")
#: where the way in ends: the request written to DynamoDB's connection
DYNAMODB = "rasd.dynamo.http1"
DRIVER = "rasd.daemon.driver"
_YIELDS = {dis.opmap["YIELD_VALUE"]}

#: an event of the trace: ("enter" or "leave", module, task, caller module or None)
Event = tuple[str, str, int, str | None]


def reentries(events: list[Event]) -> list[str]:
    """The rule: a module entered again, from another module, after a request left it.
    ``events`` are module-level steps, per task (an entry from no module: a task's or a
    callback's start, a continuation of whoever started it, never checked). A module left
    while the driver is below it on the stack is one of the driver's calls out (a program's
    step, a store call): it may be entered again."""
    stacks: dict[int, list[str]] = {}
    left: set[str] = set()
    found = []
    for kind, mod, task, caller in events:
        stack = stacks.setdefault(task, [])
        if kind == "enter":
            if caller is not None and mod in left:
                found.append(f"{mod} entered again from {caller}")
            stack.append(mod)
        else:
            if stack and stack[-1] == mod:
                stack.pop()
            if DRIVER not in stack and not any(mod in s for s in stacks.values()):
                left.add(mod)
    return found


def test_the_rule_catches_validation_done_twice() -> None:
    """routing asks protocol, then acquire, then protocol again: protocol re-entered."""
    t = 1
    seq: list[Event] = [
        ("enter", "rasd.server.routing", t, None),
        ("enter", "rasd.wire", t, "rasd.server.routing"),
        ("leave", "rasd.wire", t, None),
        ("enter", "rasd.daemon.acquire", t, "rasd.server.routing"),
        ("leave", "rasd.daemon.acquire", t, None),
        ("enter", "rasd.wire", t, "rasd.server.routing"),
    ]
    assert reentries(seq) == ["rasd.wire entered again from rasd.server.routing"]


def test_the_rule_allows_the_drivers_calls_out_and_back() -> None:
    """driver -> steps -> driver -> store, twice: the driver's own calls, not re-entries."""
    t = 1
    seq: list[Event] = [
        ("enter", "rasd.daemon.acquire", t, None),
        ("enter", DRIVER, t, "rasd.daemon.acquire"),
    ]
    for _ in range(2):
        seq += [
            ("enter", "rasd.steps.take", t, DRIVER),
            ("leave", "rasd.steps.take", t, None),
            ("enter", "rasd.dynamo.store", t, DRIVER),
            ("leave", "rasd.dynamo.store", t, None),
        ]
    assert reentries(seq) == []
    seq += [("leave", DRIVER, t, None), ("enter", DRIVER, t, "rasd.daemon.acquire")]
    assert reentries(seq) == [f"{DRIVER} entered again from rasd.daemon.acquire"]


class _Tracer:
    """The module-level steps of the loop thread's rasd code (``sys.setprofile``): entries
    and leaves per task; a coroutine's suspension and resumption are neither."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.frames: list[tuple[str, FrameType]] = []  # every room entered, for client checks
        self._seen: set[FrameType] = set()
        self.stop = False

    @staticmethod
    def _mod(frame: FrameType | None) -> str | None:
        while frame is not None:
            m = frame.f_globals.get("__name__", "")
            if m.startswith(("rasd", "rasd_client")):
                return str(m)
            frame = frame.f_back
        return None

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.stop or event not in ("call", "return"):
            return
        m = frame.f_globals.get("__name__", "")
        if not m.startswith(("rasd", "rasd_client")) or m.startswith(SERVICES):
            return
        try:
            task = id(asyncio.current_task())
        except RuntimeError:
            task = 0
        caller = self._mod(frame.f_back)
        if event == "call":
            if frame in self._seen:
                return  # a coroutine resumed
            self._seen.add(frame)
            self.frames.append((m, frame))
            if caller != m or caller is None:
                self.events.append(("enter", m, task, caller))
            if m == DYNAMODB:
                self.stop = True  # the way in ends here
        else:
            if frame.f_code.co_code[frame.f_lasti] in _YIELDS:
                return  # suspended, not left
            if caller != m:
                self.events.append(("leave", m, task, None))


async def _traced(coro: Any) -> _Tracer:
    tracer = _Tracer()
    sys.setprofile(tracer)
    try:
        await coro
    finally:
        sys.setprofile(None)
    return tracer


def _no_client_module(tracer: _Tracer, edge: str | None) -> None:
    """No module of rasd_client is entered by the daemon's code (``edge``: but for the
    framing the connection shares with the client, rasd_client.wire)."""
    for m, frame in tracer.frames:
        if m.startswith("rasd_client"):
            caller = _Tracer._mod(frame.f_back)
            assert caller == edge and m == "rasd_client.wire", (m, caller)


async def test_a_new_lease_enters_each_module_once_from_the_acquirer_down(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """The acquirer's get_lease (as the slow path calls it, after the cache missed) down to
    DynamoDB: the acquirer, the pool table, the task group, the driver, the programs, the store,
    the lean client: each entered once; and nothing of rasd_client."""
    seed_pool(ddb, table, count=5)
    async with make_daemon() as d:
        await d.coordinator.prefetch.idle()
        deadline = time.monotonic() + 5
        requested = d.clock.now_us() + 3600 * 10**6
        tracer = await _traced(d.coordinator.acquirer.get_lease(C, P, "k", requested, deadline))
        mods = [m for k, m, _, _ in tracer.events if k == "enter"]
        # a real path: it went all the way down, through the rooms named here
        for room in ("rasd.daemon.acquire", "rasd.daemon.pools", "rasd.daemon.tasks", DRIVER):
            assert room in mods, room
        assert "rasd.steps.take" in mods and "rasd.dynamo.store" in mods and DYNAMODB in mods
        assert reentries(tracer.events) == [], mods
        _no_client_module(tracer, None)


async def test_a_new_lease_enters_each_module_once_from_the_socket(
    ddb: Any, table: str, make_daemon: Any
) -> None:
    """The same from the socket: the connection, routing, protocol, the cache (a miss), then
    the acquirer down."""
    seed_pool(ddb, table, count=5)
    async with make_daemon() as d:
        await d.coordinator.prefetch.idle()
        req = wire.encode(
            {
                "v": 1,
                "id": 1,
                "op": "get_lease",
                "client_id": C,
                "pool_id": P,
                "key": "k",
                "lease_expires_us": d.clock.now_us() + 3600 * 10**6,
                "deadline_ms": 5000,
            }
        )

        def client() -> bytes:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(d.cfg.socket)
                s.sendall(req)
                return s.recv(65536)

        tracer = await _traced(asyncio.to_thread(client))
        mods = [m for k, m, _, _ in tracer.events if k == "enter"]
        for room in ("rasd.server.connection", "rasd.server.routing", "rasd.wire"):
            assert room in mods, room
        assert "rasd.daemon.cache" in mods and "rasd.daemon.acquire" in mods and DYNAMODB in mods
        _no_client_module(tracer, "rasd.server.connection")
        assert reentries(tracer.events) == [], mods

"""The step machinery: the drivers and the checker's replay run a program the same way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rasd.core.errors import Timeout
from rasd.core.writes import Write
from rasd.steps import (
    Done,
    GetItem,
    Now,
    Program,
    Raised,
    Send,
    Spawn,
    Tail,
    advance,
    drive,
    drive_sync,
    goto,
)


def prog(ident: tuple[str, str]) -> Program[str]:
    now = yield Now()
    try:
        item = yield GetItem(ident)
    except Timeout:
        return "unread"
    if item is None:
        return f"gone at {now}"
    res = yield Send(Write(ident, (), set=(("x", 1),)))
    return f"wrote {res}"


def perform_with(results: dict[type, Any]) -> Any:
    def perform(eff: Any) -> Any:
        r = results[type(eff)]
        if isinstance(r, Exception):
            raise r
        return r

    return perform


def test_drive_sync_sends_results_and_throws_errors() -> None:
    assert drive_sync(prog(("c", "r")), perform_with({Now: 5, GetItem: None})) == "gone at 5"
    assert drive_sync(prog(("c", "r")), perform_with({Now: 5, GetItem: Timeout("t")})) == "unread"
    got = drive_sync(prog(("c", "r")), perform_with({Now: 5, GetItem: {"a": 1}, Send: "ok"}))
    assert got == "wrote ok"


def test_drive_async_matches_sync() -> None:
    async def go() -> str:
        results = {Now: 5, GetItem: {"a": 1}, Send: "ok"}

        async def perform(eff: Any) -> Any:
            return perform_with(results)(eff)

        return await drive(prog(("c", "r")), perform)

    assert asyncio.run(go()) == "wrote ok"


def test_trace_replays_to_the_pending_effect() -> None:
    t = Spawn(prog, (("c", "r"),)).trace()
    gen, eff = t.resume()
    assert gen is not None and isinstance(eff, Now)
    t = t.then(7)
    _, eff = t.resume()
    assert eff == GetItem(("c", "r"))
    _, done = t.then(None).resume()
    assert done == Done("gone at 7")
    _, done = t.then(Raised(Timeout("t"))).resume()
    assert done == Done("unread")
    # equal traces are the same state, whatever built them
    assert t == Spawn(prog, (("c", "r"),)).trace().then(7)
    assert hash(t) == hash(Spawn(prog, (("c", "r"),)).trace().then(7))


def test_an_error_the_program_raises_leaves_the_driver() -> None:
    def raiser() -> Program[None]:
        yield Now()
        raise Timeout("mine")

    with pytest.raises(Timeout, match="mine"):
        drive_sync(raiser(), lambda eff: 1)


def rounds(n: int, last: int) -> Program[str]:
    """A loop as rounds: each round reads the clock and goes on as the next (Tail)."""
    now = yield Now()
    if n == last:
        return f"round {n} at {now}"
    return (yield from goto(rounds, n + 1, last))


def test_tail_goes_on_as_the_next_round() -> None:
    assert drive_sync(rounds(0, 3), lambda eff: 7) == "round 3 at 7"

    async def perform(eff: Any) -> int:
        return 8

    assert asyncio.run(drive(rounds(0, 2), perform)) == "round 2 at 8"
    # the program yields the Tail itself: the rest of the program is the next round's call
    gen = rounds(0, 1)
    assert isinstance(gen.send(None), Now)
    assert gen.send(5) == Tail(rounds, (1, 1))


def test_advance_follows_a_tail_and_says_which() -> None:
    """What the checker starts a fresh trace from: the last Tail one step followed."""
    gen, eff, tail = advance(rounds(0, 2))
    assert isinstance(eff, Now) and tail is None
    gen2, eff, tail = advance(gen, 5)
    assert isinstance(eff, Now) and tail == Tail(rounds, (1, 2)) and gen2 is not gen
    assert gen.gi_frame is None  # the round it left is closed
    gen3, eff, tail = advance(gen2, 6)
    assert isinstance(eff, Now) and tail == Tail(rounds, (2, 2))
    assert advance(gen3, 7)[1:] == (Done("round 2 at 7"), None)
    # a replay runs across a Tail as a driver does
    t = Spawn(rounds, (0, 2)).trace()
    assert t.then(5).then(6).then(7).resume() == (None, Done("round 2 at 7"))


def test_advance_ends_a_program_that_raises_with_its_error() -> None:
    gen, _, _ = advance(rounds(0, 1))
    _, done, tail = advance(gen, Raised(Timeout("t")))
    assert isinstance(done, Done) and isinstance(done.error, Timeout) and tail is None

    def broken() -> Program[None]:
        yield Now()
        raise KeyError("x")

    gen, _, _ = advance(broken())
    with pytest.raises(KeyError):  # anything else is a bug: it propagates
        advance(gen, 1)


def test_in_region_sends_only_the_calls_to_the_region_and_passes_errors_through() -> None:
    from rasd.steps import At, in_region

    seen: list[Any] = []

    def perform(eff: Any) -> Any:
        seen.append(eff)
        if isinstance(eff, At) and isinstance(eff.call, GetItem):
            raise Timeout("far")
        return 9

    assert drive_sync(in_region("us-west-2", prog(("c", "r"))), perform) == "unread"
    assert seen == [Now(), At("us-west-2", GetItem(("c", "r")))]
    seen.clear()
    got = drive_sync(in_region("us-west-2", prog(("c", "r"))), lambda eff: seen.append(eff) or {})
    assert got == "wrote {}" and isinstance(seen[2], At) and seen[2].region == "us-west-2"
    seen.clear()
    assert drive_sync(in_region(None, prog(("c", "r"))), perform) == "wrote 9"
    assert seen == [Now(), GetItem(("c", "r")), Send(Write(("c", "r"), (), set=(("x", 1),)))]


def test_in_region_keeps_a_tail_in_the_region() -> None:
    from rasd.steps import At, in_region

    def reads(n: int) -> Program[int]:
        yield GetItem(("c", str(n)))
        return n if n == 2 else (yield from goto(reads, n + 1))

    seen: list[Any] = []
    assert drive_sync(in_region("r2", reads(0)), lambda eff: seen.append(eff)) == 2
    assert seen == [At("r2", GetItem(("c", str(n)))) for n in range(3)]

"""rasd.steps: what the drivers and the checker's replay do with errors, and what a trace
keeps (its name and arguments are part of the checker's state)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rasd.core.errors import RasdError, Timeout
from rasd.steps import Done, GetItem, Now, Program, Raised, Spawn, Trace, drive, drive_sync


def reader(ident: tuple[str, str]) -> Program[str]:
    try:
        item = yield GetItem(ident)
    except Timeout as exc:
        got = yield Now()  # a program goes on after an error
        return f"timeout {exc} at {got}"
    return f"item {item}"


def failing(ident: tuple[str, str]) -> Program[str]:
    yield GetItem(ident)
    raise Timeout("gave up")


def test_async_driver_throws_a_failed_call_into_the_program_and_goes_on() -> None:
    calls: list[Any] = []

    async def perform(eff: Any) -> Any:
        calls.append(eff)
        if isinstance(eff, GetItem):
            raise Timeout("slow")
        return 5

    assert asyncio.run(drive(reader(("c", "r")), perform)) == "timeout slow at 5"
    assert calls == [GetItem(("c", "r")), Now()]


def test_drivers_let_other_errors_through() -> None:
    def perform(eff: Any) -> Any:
        raise KeyError("not a RasdError")

    async def aperform(eff: Any) -> Any:
        raise KeyError("not a RasdError")

    with pytest.raises(KeyError):
        drive_sync(reader(("c", "r")), perform)
    with pytest.raises(KeyError):
        asyncio.run(drive(reader(("c", "r")), aperform))


def test_a_program_that_raises_ends_with_its_error() -> None:
    t = Spawn(failing, (("c", "r"),)).trace()
    _, done = t.then({"a": 1}).resume()
    assert isinstance(done, Done) and isinstance(done.error, Timeout)
    assert str(done.error) == "gave up"
    _, done = t.then(Raised(RasdError("lost"))).resume()
    assert isinstance(done, Done) and isinstance(done.error, RasdError)


def test_a_trace_keeps_its_name_and_arguments() -> None:
    t = Spawn(reader, (("c", "r"),)).trace()
    assert (t.name, t.args, t.sent) == ("reader", (("c", "r"),), ())
    t2 = t.then(7)
    assert (t2.name, t2.args, t2.sent) == ("reader", (("c", "r"),), (7,))
    other = Spawn(reader, (("c", "s"),)).trace()
    assert other != t and other.then(7) != t2
    assert Trace("failing", t.start, t.args) != t

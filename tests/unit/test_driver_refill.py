"""The daemon's driver starts a prefetch refill (``RefillSoon``) once the round trip it
follows is answered, not beside it: a backend serves the refill's index page among the
claim's writes otherwise (dynalite, one thread, after them or before), and the new lease
waits for it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from rasd.daemon.driver import Run
from rasd.steps import Send, Together
from rasd.steps.daemon import RefillSoon


def _run(events: list[tuple[str, Any]]) -> Run:
    class Store:
        async def write(self, write: Any, deadline: float, readback: Any) -> str:
            events.append(("sent", write))
            await asyncio.sleep(0)  # in flight
            events.append(("answered", write))
            return "ok"

    class Prefetch:
        def refill_soon(self, pool: Any) -> None:
            events.append(("refill", pool))

    return Run(SimpleNamespace(store=Store(), prefetch=Prefetch()), 1e12)  # type: ignore[arg-type]


async def test_a_refill_waits_for_the_writes_sent_together() -> None:
    events: list[tuple[str, Any]] = []
    run = _run(events)
    await run.perform(RefillSoon("pool"))  # type: ignore[arg-type]
    got = await run.perform(Together((Send("acquire"), Send("claim"))))  # type: ignore[arg-type]
    assert got == ("ok", "ok")
    assert events == [
        ("sent", "acquire"),
        ("sent", "claim"),
        ("answered", "acquire"),
        ("answered", "claim"),
        ("refill", "pool"),
    ]


async def test_a_refill_waits_for_a_write_sent_alone() -> None:
    events: list[tuple[str, Any]] = []
    run = _run(events)
    await run.perform(RefillSoon("pool"))  # type: ignore[arg-type]
    assert await run.perform(Send("claim")) == "ok"  # type: ignore[arg-type]
    await run.perform(Send("confirm"))  # type: ignore[arg-type]
    assert events == [
        ("sent", "claim"),
        ("answered", "claim"),
        ("refill", "pool"),
        ("sent", "confirm"),
        ("answered", "confirm"),
    ]

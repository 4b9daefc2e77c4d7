"""The deadlines of the tests' requests, and the one way a test waits for background work."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: The deadline of a request whose answer a test waits for, when how fast it comes is not what
#: the test is about: on a loaded machine the client's default (1 s) can pass first, and the
#: daemon then answers TIMEOUT, as it must (docs/testing.md, "The flake hunt").
WAIT = 10.0

#: How long a test waits for a daemon's background work (a give-back, an extension) to show in
#: its counters or the table. Each background program ends by its own deadline
#: (``rasd.steps.daemon.BACKGROUND_DEADLINE``, 5 s) and runs as soon as it is spawned, beside
#: the requests: under the flake hunt's load one takes well under a second. Only a defect
#: reaches this bound (a program that never ends, a note never made, a give-back left undone).
SETTLE = 30.0


async def until(
    cond: Callable[[], bool | Awaitable[bool]],
    what: str | Callable[[], str],
    within: float = SETTLE,
    every: float = 0.01,
) -> None:
    """Wait for ``cond()`` (true, or an awaitable of true): the event the test needs, polled
    every ``every`` seconds for at most ``within`` seconds of the monotonic clock (a count of
    sleeps is no bound: each sleep takes longer on a loaded machine). Past it, AssertionError
    with ``what`` (a callable: what the test saw by then, say the counters). Not a timing
    assertion: how fast the event comes is never what a test that uses this is about.

    A daemon under test runs in the test's event loop: a condition that reads the table with
    a blocking client (boto3) stalls the daemon for the call's length, and its own calls can
    then time out. Read it in a thread (``asyncio.to_thread``) from an async ``cond``."""
    end = time.monotonic() + within
    while True:
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        if time.monotonic() >= end:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {within:g} s: {said}")
        await asyncio.sleep(every)

"""The daemon's one task group (:class:`Tasks`): what its roles and programs run beside the
requests, by how shutdown treats it (docs/design.md, "The roles, and what each keeps").
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

from ..observe.metrics import Counters

log = structlog.get_logger("rasd.daemon.tasks")

R = TypeVar("R")


class Tasks:
    """The daemon's one task group. ``background``: work a program or a role started
    (extensions, confirmations, give-backs), waited for at shutdown, then cancelled; failures
    are counted and logged. ``requests``: resolutions that requests share, waited for at
    shutdown. ``detached``: re-listings, cancelled at once at shutdown (``ras-liberator``
    re-lists what is left)."""

    __slots__ = ("background", "counters", "detached", "requests")

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.background: set[asyncio.Task[Any]] = set()
        self.requests: set[asyncio.Task[Any]] = set()
        self.detached: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self._bg_done)
        return task

    def _bg_done(self, task: asyncio.Task[Any]) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.counters.inc("background.errors")
            log.warning("background_task_failed", error=repr(task.exception()))

    def request(self, coro: Coroutine[Any, Any, R]) -> asyncio.Task[R]:
        task = asyncio.get_running_loop().create_task(coro)
        self.requests.add(task)
        task.add_done_callback(self.requests.discard)
        return task

    def detach(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.detached.add(task)
        task.add_done_callback(self.detached.discard)
        return task

    async def drain(self, timeout: float) -> None:
        for t in set(self.detached):
            t.cancel()
        pending = self.background | self.requests
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        for t in set(self.background):
            t.cancel()

"""asyncio client: the same functions as ``rasd_client``, as coroutines.

One connection per (event loop, socket path) carries many requests at once: each request has an
id and a reader task hands responses to the waiting coroutines.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import weakref
from typing import Any

from . import wire
from ._common import (
    DEFAULT_TIMEOUT,
    SOCKET_GRACE,
    Lease,
    LeaseExpires,
    get_lease_request,
    headroom_from,
    headroom_request,
    lease_from,
    raise_for,
    release_request,
    retry_budget,
    socket_path,
    with_deadline,
)
from .errors import RasdError, Timeout, Unavailable

__all__ = ["call_raw", "close", "get_lease", "headroom", "release"]


class _AioConn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pid = os.getpid()
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.closed = False
        self.task = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        decoder = wire.FrameDecoder()
        err: BaseException = ConnectionResetError("rasd closed the connection")
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                decoder.feed(data)
                for frame in decoder.frames():
                    if isinstance(frame, wire.BadFrame):
                        continue
                    fut = self.waiting.pop(frame.get("id"), None)  # type: ignore[arg-type]
                    if fut is not None and not fut.done():
                        fut.set_result(frame)
        except (OSError, wire.FrameTooLarge) as exc:
            err = exc
        finally:
            self.closed = True
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(Unavailable(f"rasd connection lost: {err}"))
            self.waiting.clear()
            self.writer.close()

    async def call(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        req_id = next(self.ids)
        req["v"] = wire.VERSION
        req["id"] = req_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[req_id] = fut
        self.writer.write(wire.encode(req))
        try:
            return await asyncio.wait_for(fut, timeout + SOCKET_GRACE)
        except TimeoutError as exc:
            raise Timeout(f"no answer from rasd within {timeout:.3f}s") from exc
        finally:
            self.waiting.pop(req_id, None)

    def close(self) -> None:
        self.closed = True
        self.task.cancel()
        self.writer.close()


_conns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _AioConn]] = (
    weakref.WeakKeyDictionary()
)


async def _conn(path: str) -> _AioConn:
    loop = asyncio.get_running_loop()
    per_loop = _conns.setdefault(loop, {})
    conn = per_loop.get(path)
    if conn is not None and (conn.closed or conn.pid != os.getpid()):
        conn = None
    if conn is None:
        try:
            reader, writer = await asyncio.open_unix_connection(path)
        except OSError as exc:
            raise Unavailable(f"cannot connect to rasd at {path}: {exc}") from exc
        conn = _AioConn(reader, writer)
        per_loop[path] = conn
    return conn


async def _call(req: dict[str, Any], path: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    for attempt in (1, 2):
        conn = await _conn(path)
        try:
            return await conn.call(dict(req), timeout)
        except Unavailable as exc:  # the connection closed before the reply
            conn.close()
            err: Exception = exc
        except (ConnectionError, OSError) as exc:
            conn.close()
            err = Unavailable(f"rasd connection failed: {exc}")
        # Once more on a new connection within the caller's deadline: see the sync client.
        budget = retry_budget(deadline)
        if attempt == 2 or budget is None:
            raise err
        timeout = budget
        req = with_deadline(req, timeout)
    raise RasdError("unreachable")


async def get_lease(
    client_id: str,
    pool_id: str,
    key: str,
    lease_expires: LeaseExpires,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    socket_path: str | None = None,
) -> Lease:
    req = get_lease_request(client_id, pool_id, key, lease_expires, timeout)
    return lease_from(await _call(req, _path(socket_path), timeout))


async def release(
    client_id: str,
    pool_id: str,
    key: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    socket_path: str | None = None,
) -> None:
    req = release_request(client_id, pool_id, key, timeout)
    raise_for(await _call(req, _path(socket_path), timeout))


async def headroom(
    client_id: str,
    pool_id: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    socket_path: str | None = None,
) -> int:
    req = headroom_request(client_id, pool_id, timeout)
    return headroom_from(await _call(req, _path(socket_path), timeout))


async def call_raw(
    op: str, *, timeout: float = DEFAULT_TIMEOUT, socket_path: str | None = None, **fields: Any
) -> dict[str, Any]:
    req = {"op": op, "deadline_ms": int(timeout * 1000), **fields}
    return raise_for(await _call(req, _path(socket_path), timeout))


async def close() -> None:
    """Close this event loop's connections (optional; they close with the loop anyway)."""
    per_loop = _conns.pop(asyncio.get_running_loop(), {})
    for conn in per_loop.values():
        conn.close()


def _path(explicit: str | None) -> str:
    return socket_path(explicit)

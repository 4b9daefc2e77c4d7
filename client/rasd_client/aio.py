"""asyncio client: the same functions as ``rasd_client``, as coroutines.

One connection per (event loop, socket path) carries every call of that loop at once, opened
by one connect that concurrent first calls share (:class:`_Link`), retried while no daemon
listens, within the call's timeout. docs/protocol.md, "Connections of the Python clients".
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import socket
import time
import weakref
from typing import Any

from . import _table, wire
from ._common import (
    CONNECT_RETRY_INITIAL,
    CONNECT_RETRY_MAX,
    MIN_RETRY_BUDGET,
    SOCKET_GRACE,
    Lease,
    LeaseExpires,
    call_timeout,
    deadline_ms,
    encode_request,
    get_lease_request,
    headroom_from,
    headroom_request,
    lease_from,
    raise_for,
    refused_frame,
    release_request,
    retry_budget,
    socket_path,
    with_deadline,
)
from .errors import RasdError, Timeout, Unavailable

__all__ = ["call_raw", "close", "get_lease", "headroom", "release"]

log = logging.getLogger("rasd_client")

#: connect(2) errors that mean "not now" (a full backlog, a daemon restarting), not "never".
TRANSIENT_CONNECT_ERRORS = frozenset({errno.EAGAIN, errno.ECONNREFUSED, errno.ENOENT})


class _AioConn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pid = os.getpid()
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.closed = False
        self.task = asyncio.get_running_loop().create_task(self._read_loop())

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<_AioConn {state} pid={self.pid} waiting={len(self.waiting)}>"

    @property
    def usable(self) -> bool:
        return not self.closed and self.pid == os.getpid()

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
                    if refused_frame(frame):
                        self._refused(frame)
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

    def _refused(self, frame: dict[str, Any]) -> None:
        """An error without an id: the daemon refused a frame without reading its id. The
        calls it may answer all end with it (this client never sends such a frame, so more
        than one call waiting means a daemon that does not speak this protocol), and the
        connection is given up (the daemon may close it)."""
        self.closed = True
        waiting = list(self.waiting.values())
        self.waiting.clear()
        for fut in waiting:
            if not fut.done():
                fut.set_result(frame)

    async def call(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.closed:
            # Sent on a connection already given up, it would never be answered: this is a
            # close before the reply, which the caller retries on a new connection.
            raise Unavailable("rasd connection lost: closed before the request was sent")
        req_id = next(self.ids)
        req["v"] = wire.VERSION
        req["id"] = req_id
        frame_out = encode_request(req)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[req_id] = fut
        self.writer.write(frame_out)
        try:
            return await asyncio.wait_for(fut, timeout + SOCKET_GRACE)
        except TimeoutError as exc:
            raise Timeout(f"no answer from rasd within {timeout:.3f}s") from exc
        finally:
            self.waiting.pop(req_id, None)

    async def close(self) -> None:
        """Close the socket and end the reader task (waiting calls get ``Unavailable``)."""
        self.closed = True
        self.task.cancel()
        self.writer.close()
        await asyncio.wait([self.task])


class _Link:
    """One event loop's connection to one socket path, and the connect under way, if any."""

    __slots__ = ("conn", "opening", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn: _AioConn | None = None
        self.opening: asyncio.Task[_AioConn] | None = None

    def __repr__(self) -> str:
        return f"<_Link {self.path!r} conn={self.conn!r} opening={self.opening is not None}>"

    async def _open(self) -> _AioConn:
        """One connect attempt; the new connection becomes this link's."""
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                # On a Unix socket a non-blocking connect never is "in progress": it is
                # accepted into the backlog or fails now (EAGAIN when the backlog is full).
                sock.connect(self.path)
                reader, writer = await asyncio.open_unix_connection(sock=sock)
            except BaseException:
                sock.close()
                raise
            old, self.conn = self.conn, _AioConn(reader, writer)
            if old is not None:
                await old.close()
            return self.conn
        finally:
            self.opening = None

    async def conn_for(self, deadline: float) -> _AioConn:
        """This link's connection, opened if needed. Calls that arrive while it is being
        opened wait for that connect; a transient failure is tried again, after a short
        pause, until ``deadline`` (time.monotonic())."""
        delay = CONNECT_RETRY_INITIAL
        while True:
            conn = self.conn
            if conn is not None and conn.usable:
                return conn
            if self.opening is None:
                self.opening = asyncio.get_running_loop().create_task(self._open())
            try:
                # shield: a caller that gives up does not cancel the connect the others await
                return await asyncio.shield(self.opening)
            except OSError as exc:
                if exc.errno not in TRANSIENT_CONNECT_ERRORS:
                    raise Unavailable(f"cannot connect to rasd at {self.path}: {exc}") from exc
                if deadline - time.monotonic() - delay < MIN_RETRY_BUDGET:
                    raise Unavailable(
                        f"cannot connect to rasd at {self.path} within the timeout: {exc}"
                    ) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, CONNECT_RETRY_MAX)

    async def drop(self, conn: _AioConn) -> None:
        """A call found ``conn`` broken: close it; the next call opens a new one."""
        if self.conn is conn:
            self.conn = None
        await conn.close()


_links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Link]] = (
    weakref.WeakKeyDictionary()
)


def _link(path: str) -> _Link:
    per_loop = _links.setdefault(asyncio.get_running_loop(), {})
    link = per_loop.get(path)
    if link is None:
        link = per_loop[path] = _Link(path)
    return link


async def _call(req: dict[str, Any], path: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    link = _link(path)
    for attempt in (1, 2):
        conn = link.conn
        if conn is None or not conn.usable:
            conn = await link.conn_for(deadline)
            # The connect took part of the caller's time: tell the daemon what is left.
            budget = retry_budget(deadline)
            if budget is None:
                raise Unavailable(f"cannot connect to rasd at {path} within the timeout")
            timeout = budget
            req = with_deadline(req, timeout)
        try:
            return await conn.call(dict(req), timeout)
        except Unavailable as exc:  # the connection closed before the reply
            await link.drop(conn)
            err: Exception = exc
        except (ConnectionError, OSError) as exc:
            await link.drop(conn)
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
    timeout: float | None = None,
    socket_path: str | None = None,
) -> Lease:
    lease = _table.current.lease(socket_path, client_id, pool_id, key, lease_expires)
    if lease is not None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("get_lease %s/%s/%s: from the hit table", client_id, pool_id, key)
        return lease
    timeout = call_timeout(timeout)
    req = get_lease_request(client_id, pool_id, key, lease_expires, timeout)
    lease = lease_from(await _call(req, _path(socket_path), timeout))
    _table.current.answered(socket_path, client_id)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("get_lease %s/%s/%s: over the socket", client_id, pool_id, key)
    return lease


async def release(
    client_id: str,
    pool_id: str,
    key: str,
    *,
    timeout: float | None = None,
    socket_path: str | None = None,
) -> None:
    timeout = call_timeout(timeout)
    req = release_request(client_id, pool_id, key, timeout)
    raise_for(await _call(req, _path(socket_path), timeout))


async def headroom(
    client_id: str,
    pool_id: str,
    *,
    timeout: float | None = None,
    socket_path: str | None = None,
) -> int:
    timeout = call_timeout(timeout)
    req = headroom_request(client_id, pool_id, timeout)
    return headroom_from(await _call(req, _path(socket_path), timeout))


async def call_raw(
    op: str, *, timeout: float | None = None, socket_path: str | None = None, **fields: Any
) -> dict[str, Any]:
    timeout = call_timeout(timeout)
    req = {"op": op, "deadline_ms": deadline_ms(timeout), **fields}
    return raise_for(await _call(req, _path(socket_path), timeout))


async def close() -> None:
    """Close this event loop's connections and end their reader tasks (optional; they close
    with the loop anyway). A later call opens a new one."""
    for link in list(_links.get(asyncio.get_running_loop(), {}).values()):
        if link.opening is not None:
            await asyncio.wait([link.opening])
        conn, link.conn = link.conn, None
        if conn is not None:
            await conn.close()


def _path(explicit: str | None) -> str:
    return socket_path(explicit)

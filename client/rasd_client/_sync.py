"""Blocking client: one connection per (process, thread), rebuilt after fork() or any error."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from typing import Any

from . import _table, wire
from ._common import (
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

log = logging.getLogger("rasd_client")


class _Conn:
    __slots__ = ("decoder", "ids", "path", "pid", "sock")

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.pid = os.getpid()
        self.decoder = wire.FrameDecoder()
        self.ids = itertools.count(1)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise Unavailable(f"cannot connect to rasd at {path}: {exc}") from exc
        self.sock = sock

    def call(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        req_id = next(self.ids)
        req["v"] = wire.VERSION
        req["id"] = req_id
        frame_out = encode_request(req)
        self.sock.settimeout(timeout + SOCKET_GRACE)
        self.sock.sendall(frame_out)
        while True:
            try:
                for frame in self.decoder.frames():
                    if isinstance(frame, wire.BadFrame):
                        raise RasdError(f"daemon sent a bad frame: {frame.reason}")
                    # one request at a time: an error without an id is this one's
                    if frame.get("id") == req_id or refused_frame(frame):
                        return frame
            except wire.FrameTooLarge as exc:
                raise RasdError(f"daemon sent a bad frame: {exc}") from exc
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionResetError("rasd closed the connection")
            self.decoder.feed(data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Local(threading.local):
    conns: dict[str, _Conn]

    def __init__(self) -> None:
        self.conns = {}


_local = _Local()


def _reset_after_fork() -> None:
    # The parent's sockets are shared with the child after fork(); never use them here.
    global _local
    _local = _Local()


os.register_at_fork(after_in_child=_reset_after_fork)


def _call(req: dict[str, Any], path: str, timeout: float) -> dict[str, Any]:
    conns = _local.conns
    conn = conns.get(path)
    if conn is not None and conn.pid != os.getpid():
        conn = None
    deadline = time.monotonic() + timeout
    for attempt in (1, 2):
        if conn is None:
            conn = _Conn(path, timeout)
            conns[path] = conn
        try:
            resp = conn.call(dict(req), timeout)
            if refused_frame(resp):
                # the daemon may close a connection whose frame it refused: not used again
                conn.close()
                conns.pop(path, None)
            return resp
        except TimeoutError as exc:
            conn.close()
            conns.pop(path, None)
            raise Timeout(f"no answer from rasd within {timeout:.3f}s") from exc
        except (ConnectionError, BrokenPipeError, OSError) as exc:
            # Closed before any reply: a daemon that stops (a restart, an upgrade) closes idle
            # connections and never drops a request it has read, and every op is safe to send
            # again (docs/protocol.md, "Restarts"). Once more on a new connection, within the
            # caller's own deadline; the next daemon answers it from the socket's backlog.
            conn.close()
            conns.pop(path, None)
            conn = None
            budget = retry_budget(deadline)
            if attempt == 2 or budget is None:
                raise Unavailable(f"rasd connection failed: {exc}") from exc
            timeout = budget
            req = with_deadline(req, timeout)
    raise AssertionError("unreachable")


def get_lease(
    client_id: str,
    pool_id: str,
    key: str,
    lease_expires: LeaseExpires,
    *,
    timeout: float | None = None,
    socket_path: str | None = None,
) -> Lease:
    """Return the lease ``key`` holds in the pool, acquiring one if needed."""
    lease = _table.current.lease(socket_path, client_id, pool_id, key, lease_expires)
    if lease is not None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("get_lease %s/%s/%s: from the hit table", client_id, pool_id, key)
        return lease
    timeout = call_timeout(timeout)
    req = get_lease_request(client_id, pool_id, key, lease_expires, timeout)
    lease = lease_from(_call(req, _path(socket_path), timeout))
    _table.current.answered(socket_path, client_id)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("get_lease %s/%s/%s: over the socket", client_id, pool_id, key)
    return lease


def release(
    client_id: str,
    pool_id: str,
    key: str,
    *,
    timeout: float | None = None,
    socket_path: str | None = None,
) -> None:
    """Give the lease back early. Raises NotHeld when ``key`` holds no lease."""
    timeout = call_timeout(timeout)
    raise_for(_call(release_request(client_id, pool_id, key, timeout), _path(socket_path), timeout))


def headroom(
    client_id: str,
    pool_id: str,
    *,
    timeout: float | None = None,
    socket_path: str | None = None,
) -> int:
    """Estimated free resources of the pool in this daemon's region."""
    timeout = call_timeout(timeout)
    req = headroom_request(client_id, pool_id, timeout)
    return headroom_from(_call(req, _path(socket_path), timeout))


def call_raw(
    op: str, *, timeout: float | None = None, socket_path: str | None = None, **fields: Any
) -> dict[str, Any]:
    """Send any op (``ping``, ``stats``...) and return the raw response map."""
    timeout = call_timeout(timeout)
    req = {"op": op, "deadline_ms": deadline_ms(timeout), **fields}
    return raise_for(_call(req, _path(socket_path), timeout))


def _path(explicit: str | None) -> str:
    return socket_path(explicit)

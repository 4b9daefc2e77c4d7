"""One client connection (:class:`Connection`): msgpack frames in, answers out, back-pressure.

Each frame goes to the router once; a hit is written inside ``data_received``, other answers
when ready, many requests at once. The caller's grant is read at connect, its limits are
checked each second (docs/design.md, "Inside get_lease" and "One caller against the
others").
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
from typing import Any, Protocol

import structlog

from rasd_client.wire import (
    HEADER_SIZE,
    MAX_FRAME,
    BadFrame,
    FrameDecoder,
    FrameTooLarge,
    decode_body,
    encode,
    error_payload,
    length_prefix,
)

from ..limits import ConnectionLimits
from ..observe.metrics import Counters
from .peercred import NOBODY, Acl, PeerCred, identify


class Server(Protocol):
    """What a connection needs of the daemon it serves (its ``Router``): the set of open
    connections it joins and leaves, counters, the access list its peer is judged by, the
    limits its caller is held to, and the handling of each frame (``Router.handle``: an
    answer frame to write, or None when it answers otherwise)."""

    connections: set[Connection]
    counters: Counters
    acl: Acl
    limits: ConnectionLimits

    def handle(self, conn: Connection, frame: dict[str, Any] | BadFrame) -> bytes | None: ...


log = structlog.get_logger("rasd.server")

#: the open files the daemon keeps for itself when it bounds its callers' connections
FILES_KEPT = 256


def connection_limits(
    per_process: int, per_uid: int, total: int, max_buffered: int
) -> ConnectionLimits:
    """The limits of the config's settings; ``total`` 0: the open-file limit less FILES_KEPT."""
    if total == 0:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        total = max(64, soft - FILES_KEPT) if soft != resource.RLIM_INFINITY else 1 << 20
    return ConnectionLimits(per_process, per_uid, total, max_buffered)


class Connection(asyncio.Protocol):
    __slots__ = (
        "batch",
        "closed",
        "cred",
        "decoder",
        "draining",
        "frames",
        "grant",
        "handed",
        "held",
        "pending",
        "quiet",
        "seen",
        "server",
        "transport",
    )

    def __init__(self, server: Server) -> None:
        #: the frame handler this connection serves (the daemon's router)
        self.server = server
        #: the frames of a read that was not exactly one (None while it holds nothing)
        self.decoder: FrameDecoder | None = None
        self.pending = 0
        self.closed = False
        #: Shutdown began: read nothing more; close once every request read is answered.
        self.draining = False
        self.transport: asyncio.Transport | None = None
        self.grant = NOBODY
        #: answers held while one data_received handles several frames (one write for all)
        self.batch: list[bytes] | None = None
        #: the caller, once admitted (counted in the server's limits until the close)
        self.cred: PeerCred | None = None
        #: whole frames received; their count at the last sweep; sweeps since it changed
        self.frames = 0
        self.seen = 0
        self.quiet = 0
        #: bytes of a half-received frame, as counted in the server's limits
        self.held = 0
        #: the client_ids whose hit tables were handed over on this connection
        self.handed: set[str] = set()

    @property
    def buffered(self) -> int:
        """Bytes read and not yet a whole frame."""
        return 0 if self.decoder is None else self.decoder.buffered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        server = self.server
        cred, grant = identify(server.acl, transport.get_extra_info("socket"))
        self.grant = grant
        refused = server.limits.admit(cred.pid, cred.uid, grant.all or bool(grant.client_ids))
        if refused is not None:
            self.closed = True
            transport.close()
            name = f"conn.refused.{refused}"
            server.counters.inc(name)
            n = server.counters[name]
            if not n & (n - 1):  # the 1st, 2nd, 4th, 8th ... of each kind
                log.warning(
                    "connection_refused", limit=refused, pid=cred.pid, uid=cred.uid, refused=n
                )
            return
        self.cred = cred
        server.connections.add(self)
        server.counters.inc("conn.opened")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        server = self.server
        server.connections.discard(self)
        cred = self.cred
        if cred is not None:
            self.cred = None
            server.limits.release(cred.pid, cred.uid)
            if self.held:
                server.limits.hold(self.held, 0)
                self.held = 0

    def tick(self, idle_after: int, frame_after: int) -> str | None:
        """The daemon's sweep, once a second: why this connection is to be closed now
        (``frame_timeout``: a frame begun and not finished for ``frame_after`` seconds;
        ``idle``: nothing asked or in flight for ``idle_after`` seconds, 0: never), or None.
        Counted in sweeps since a whole frame came: one more than the seconds, since the
        last frame (or the connect) may have come just before the first of them."""
        if self.frames != self.seen:
            self.seen = self.frames
            self.quiet = 0
            return None
        self.quiet += 1
        if self.held and self.quiet > frame_after:
            return "frame_timeout"
        if idle_after and self.pending == 0 and self.quiet > idle_after:
            return "idle"
        return None

    def pause_writing(self) -> None:
        # The peer is not reading its answers (its socket and our write buffer are full):
        # stop reading its requests until it catches up, so a stuck or hostile client cannot
        # make the daemon buffer answers without bound.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed and not self.draining:
            self.transport.resume_reading()

    def quiesce(self) -> None:
        """Shutdown: read no more requests; close now if none is waiting for its answer, else
        once the last one is answered (``Router._slow``). Never read-and-dropped: what the
        peer sends from now on stays unread, and the close makes its client see the connection
        closed before any reply, which it retries on a new connection, answered by the next
        process from the listening socket's backlog (docs/protocol.md, "Restarts")."""
        self.draining = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        if self.pending == 0:
            self.close()

    def data_received(self, data: bytes) -> None:
        server = self.server
        n = len(data)
        if n > HEADER_SIZE and self.decoder is None:
            # The usual case: exactly one whole frame, nothing buffered. Decoded in place.
            (length,) = length_prefix.unpack_from(data, 0)
            if length == n - HEADER_SIZE and length <= MAX_FRAME:
                self.frames += 1
                frame = decode_body(memoryview(data)[HEADER_SIZE:])  # type: ignore[arg-type]
                out = server.handle(self, frame)
                if out is not None and not self.closed:
                    self.transport.write(out)  # type: ignore[union-attr]
                return
        decoder = self.decoder
        if decoder is None:
            decoder = self.decoder = FrameDecoder()
        decoder.feed(data)
        # Several frames at once (a pipelining client): their immediate answers go out in one
        # write at the end; answers of requests that wait for DynamoDB are written when done.
        batch: list[bytes] = []
        self.batch = batch
        too_large: FrameTooLarge | None = None
        try:
            for frame in decoder.frames():
                self.frames += 1
                out = server.handle(self, frame)
                if out is not None:
                    batch.append(out)
        except FrameTooLarge as exc:
            too_large = exc
            server.counters.inc("req.bad_frame")
            batch.append(encode(error_payload(None, "BAD_REQUEST", str(exc))))
        finally:
            self.batch = None
            if batch and not self.closed and self.transport is not None:
                self.transport.write(batch[0] if len(batch) == 1 else b"".join(batch))
        held = len(decoder._buf)
        if not held:
            self.decoder = None
        if held != self.held and self.cred is not None:
            if server.limits.hold(self.held, held):
                self.held = held
            else:  # past the bound for all connections: let go of these bytes, and close
                server.limits.hold(held, 0)
                self.held = 0
                server.counters.inc("conn.closed.buffered")
                self.close()
        if too_large is not None:
            self.close()
        if self.draining and self.pending == 0:
            self.close()

    def send(self, payload: dict[str, Any]) -> None:
        if self.batch is not None:
            self.batch.append(encode(payload))
        elif not self.closed and self.transport is not None:
            self.transport.write(encode(payload))

    def send_fd(self, payload: dict[str, Any], fd: int) -> bool:
        """Send ``payload`` with a copy of ``fd`` (SCM_RIGHTS), straight to the socket: only
        when nothing else waits to be written before it. False when it could not be sent
        whole now (nothing, or the connection is closed: part of a frame breaks the
        stream)."""
        transport = self.transport
        if self.closed or transport is None or self.batch or transport.get_write_buffer_size():
            return False
        frame = encode(payload)
        fileno = transport.get_extra_info("socket").fileno()
        with socket.socket(fileno=os.dup(fileno)) as sock:
            try:
                sent = socket.send_fds(sock, [frame], [fd], socket.MSG_DONTWAIT)
            except OSError:
                return False
        if sent != len(frame):
            self.close()
            return False
        return True

    def send_frame(self, frame: bytes) -> None:
        """Send an answer already encoded (a cache entry's)."""
        if self.batch is not None:
            self.batch.append(frame)
        elif not self.closed and self.transport is not None:
            self.transport.write(frame)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def regrant(connections: set[Connection], acl: Acl) -> set[str]:
    """Every open connection granted again by ``acl`` (a reload); one that holds a hit table
    its new grant does not cover is closed. Returns the client_ids of such tables."""
    revoked: set[str] = set()
    for conn in list(connections):
        if conn.transport is None or conn.cred is None:
            continue
        _, conn.grant = identify(acl, conn.transport.get_extra_info("socket"))
        lost = {c for c in conn.handed if not conn.grant.allows(c)}
        if lost:
            revoked |= lost
            conn.close()
    return revoked


def sweep(connections: set[Connection], idle: int, frame: int, counters: Counters) -> None:
    """Close the connections :meth:`Connection.tick` says to close now, counted by why."""
    for conn in list(connections):
        why = conn.tick(idle, frame)
        if why is not None:
            counters.inc(f"conn.closed.{why}")
            conn.close()

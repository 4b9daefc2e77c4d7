"""HTTP/1.1 connections for the lean DynamoDB client: one asyncio protocol per connection,
responses parsed by httptools (llhttp, in C), and the CONNECT tunnel through a proxy.

One request outstanding per connection; unasked-for bytes spoil it. Errors while connecting
are :class:`ConnectFailed` (never sent); after the request was written, a lost connection or
a malformed answer may have applied.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httptools

#: A pooled connection idle longer than this is closed rather than reused (DynamoDB and load
#: balancers drop idle connections; a request on a dropped one would be ambiguous).
IDLE_MAX = 50.0
READ_SIZE = 65536


class ReadTimedOut(Exception):
    """Set on a round trip's future when ``read_timeout`` passed without a whole answer."""


def expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(ReadTimedOut())


class ConnectFailed(OSError):
    """The cause of an ``EndpointConnectionError`` raised while connecting: the request was
    never sent (``rasd.dynamo.retry.never_sent`` relies on it)."""


class Conn(asyncio.Protocol):
    """One HTTP/1.1 connection: requests written as given, responses parsed by httptools
    (llhttp, in C) as they arrive; the parser's callbacks complete the round trip's future,
    so a response costs one wake-up of the awaiting task however many packets it came in.

    At most one request is outstanding; anything the server sends while none is (or after
    its response ended) makes the connection unusable, never the answer to a later request.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        #: when the connection was opened (monotonic seconds)
        self.born = time.monotonic()
        #: a request is outstanding (written, its response not yet complete)
        self.busy = False
        #: the last response allows the connection to be used again
        self.keep_alive = False
        self._parser: httptools.HttpResponseParser | None = None
        self._fut: asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes]] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._framed = False  # Content-Length or Transfer-Encoding seen
        self._head_done = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None or not self.busy:  # nothing asked: no answer can be trusted
            self.close()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            self.close()

    def eof_received(self) -> bool | None:
        if self.busy:
            if self._head_done and not self._framed:  # a body that ends with the connection
                self._complete(keep_alive=False)
            else:
                self._fail(ConnectionResetError("connection closed before the response ended"))
        self.keep_alive = False
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.busy:
            self._fail(exc or ConnectionResetError("connection lost before the response ended"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        if not self.busy:  # a message after the answer: the connection is spoilt
            self.keep_alive = False
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.busy:
            return
        name = name.lower()
        if name == b"content-length" or name == b"transfer-encoding":
            self._framed = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        if self.busy:
            self._chunks.append(body)

    def on_message_complete(self) -> None:
        assert self._parser is not None
        if not self.busy:
            return
        if self._parser.get_status_code() < 200:  # informational (100 Continue): skip it
            self._headers = []
            self._chunks = []
            self._framed = self._head_done = False
            return
        self._complete(self._parser.should_keep_alive())

    # round trip
    def _complete(self, keep_alive: bool) -> None:
        assert self._parser is not None
        self.busy = False
        self.keep_alive = keep_alive
        fut = self._fut
        if fut is not None and not fut.done():
            chunks = self._chunks
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            fut.set_result((self._parser.get_status_code(), self._headers, body))

    def _fail(self, exc: BaseException) -> None:
        self.busy = False
        self.keep_alive = False
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_exception(exc)

    def usable(self, now: float, max_age: float) -> bool:
        """A pooled connection is reused only if nothing says the server closed it, it was
        not idle too long and it is younger than ``max_age``."""
        t = self.transport
        return (
            not self.lost
            and self.keep_alive
            and not self.busy
            and t is not None
            and not t.is_closing()
            and now - self.idle_since < IDLE_MAX
            and now - self.born < max_age
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.lost = True

    def round_trip(
        self, data: bytes
    ) -> asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes]]:
        """Send one request (already encoded) and return the future of its response:
        (status, lower-cased headers, body). A lost connection or a malformed response sets
        an OSError or ``httptools.HttpParserError`` on it."""
        assert self.transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._headers = []
        self._chunks = []
        self._framed = self._head_done = False
        self.keep_alive = False
        self.busy = True
        fut = self._fut = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return fut


class ProxyRefused(ConnectFailed):
    """The proxy answered CONNECT with something other than 2xx (407: it wants credentials)."""


class Tunnel(asyncio.Protocol):
    """The proxy's side of a CONNECT: the answer's head, then nothing until TLS starts."""

    def __init__(self) -> None:
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._buf = b""

    def data_received(self, data: bytes) -> None:
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if self.done.done():
            return
        if end >= 0:
            if end + 4 != len(self._buf):  # the endpoint speaks first in TLS: nobody may yet
                self.done.set_exception(ConnectFailed("proxy sent bytes after its CONNECT answer"))
            else:
                self.done.set_result(self._buf[:end])
        elif len(self._buf) > 65536:
            self.done.set_exception(ConnectFailed("proxy's CONNECT answer is too long"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(
                ConnectFailed(f"proxy closed the connection during CONNECT ({exc or 'EOF'})")
            )

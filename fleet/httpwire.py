"""HTTP/1.1 as the proxy (``fleet.proxy``) handles it: whole messages read off a socket, a
reply made keep-alive, DynamoDB's error replies, a request's operation."""

from __future__ import annotations

import json
import random
import re
import socket

_CONN_RE = re.compile(rb"(?im)^connection:[^\r\n]*\r\n")
_CLOSE_RE = re.compile(rb"(?im)^connection:[ \t]*close[ \t]*(?=\r?$)")
_CLEN_RE = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")
_CHUNKED_RE = re.compile(rb"(?im)^transfer-encoding:[ \t]*chunked[ \t]*\r?$")
_TARGET_RE = re.compile(rb"(?im)^x-amz-target:[ \t]*\S+\.(\w+)")


class HttpReader:
    """Buffered reads of whole HTTP/1.1 messages (Content-Length, chunked or until close)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(262144)
        if not data:
            return False
        self.buf += data
        return True

    def message(self, request: bool) -> tuple[bytes, bytes, bool] | None:
        """(head, body, body_ran_until_close) or None when the peer closed first."""
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                return None
        i = self.buf.index(b"\r\n\r\n") + 4
        head, self.buf = self.buf[:i], self.buf[i:]
        m = _CLEN_RE.search(head)
        if m:
            n = int(m.group(1))
            while len(self.buf) < n:
                if not self._fill():
                    return None
            body, self.buf = self.buf[:n], self.buf[n:]
            return head, body, False
        if _CHUNKED_RE.search(head):
            while True:
                end = self.buf.find(b"\r\n0\r\n\r\n")
                if end >= 0 or self.buf.startswith(b"0\r\n\r\n"):
                    cut = (end + 7) if end >= 0 else 5
                    body, self.buf = self.buf[:cut], self.buf[cut:]
                    return head, body, False
                if not self._fill():
                    return None
        if request:
            return head, b"", False
        while self._fill():  # no length: the body runs until the upstream closes
            pass
        body, self.buf = self.buf, b""
        return head, body, True


def closes(head: bytes, until_close: bool) -> bool:
    """Must the connection close after this message?"""
    return until_close or _CLOSE_RE.search(head) is not None or head.startswith(b"HTTP/1.0")


def keep_alive(head: bytes, body: bytes, until_close: bool) -> bytes:
    """The head of the upstream's reply made HTTP/1.1 keep-alive (the proxy, not the upstream,
    decides the client's connection lifetime); a body that ran until close gets its length."""
    head = _CONN_RE.sub(b"", head)
    if head.startswith(b"HTTP/1.0 "):
        head = b"HTTP/1.1 " + head[9:]
    extra = b"Connection: keep-alive\r\n"
    if until_close:
        extra += b"Content-Length: " + str(len(body)).encode() + b"\r\n"
    return head[:-2] + extra + b"\r\n"


def operation(head: bytes) -> str:
    """The DynamoDB operation a request's ``X-Amz-Target`` names ("?" without one)."""
    m = _TARGET_RE.search(head)
    return m.group(1).decode() if m else "?"


def error_response(status: int, reason: str, error_type: str, message: str) -> bytes:
    """An error reply in DynamoDB's JSON 1.0 protocol format."""
    body = json.dumps(
        {"__type": f"com.amazonaws.dynamodb.v20120810#{error_type}", "message": message}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"x-amzn-RequestId: chaos-{random.getrandbits(48):012x}\r\n"
        f"x-amzn-ErrorType: {error_type}\r\n"
        "Content-Type: application/x-amz-json-1.0\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\n\r\n"
    ).encode()
    return head + body


THROTTLE = (
    400,
    "Bad Request",
    "ProvisionedThroughputExceededException",
    "The level of configured provisioned throughput for the table was exceeded. "
    "Consider increasing your provisioning level with the UpdateTable API.",
)
ERROR_500 = (500, "Internal Server Error", "InternalServerError", "Internal server error")

"""The wire format of rasd, shared by the client and the daemon (public: ``rasd_client.wire``).
No I/O here. ``FrameDecoder`` turns a byte stream into payloads (``FrameTooLarge``: the
connection must close; ``BadFrame``: the stream goes on). docs/protocol.md, "Framing", is the
contract; docs/errors.md the codes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import msgpack

VERSION = 1
MAX_FRAME = 64 * 1024
#: a frame's header: the body's length, big-endian
length_prefix = struct.Struct(">I")
HEADER_SIZE = length_prefix.size


class FrameTooLarge(Exception):
    """The peer announced a frame longer than MAX_FRAME; the stream cannot be trusted."""


class BadFrame:
    """A delimited frame whose payload is not a msgpack map. Carries the reason."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"BadFrame({self.reason!r})"


def encode(payload: dict[str, Any]) -> bytes:
    """One frame: length prefix + msgpack of ``payload``."""
    body: bytes = msgpack.packb(payload, use_bin_type=True)
    return length_prefix.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: ``feed(data)`` then iterate ``frames()``."""

    __slots__ = ("_buf", "max_frame")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self.max_frame = max_frame

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> Iterator[dict[str, Any] | BadFrame]:
        buf = self._buf
        while len(buf) >= HEADER_SIZE:
            (length,) = length_prefix.unpack_from(buf, 0)
            if length > self.max_frame:
                raise FrameTooLarge(f"frame of {length} bytes exceeds {self.max_frame}")
            end = HEADER_SIZE + length
            if len(buf) < end:
                return
            body = bytes(buf[HEADER_SIZE:end])
            del buf[:end]
            yield decode_body(body)


def decode_body(body: bytes) -> dict[str, Any] | BadFrame:
    """A frame's body as a map, or what is wrong with it (BadFrame): never raises."""
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        return BadFrame(f"payload is not msgpack: {type(exc).__name__}")
    if not isinstance(obj, dict):
        return BadFrame(f"payload is a {type(obj).__name__}, expected a map")
    return obj


def error_payload(
    req_id: Any, code: str, message: str, retry_after: float | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "v": VERSION,
        "id": req_id,
        "ok": False,
        "code": code,
        "message": message,
    }
    if retry_after is not None:
        out["retry_after"] = retry_after
    return out

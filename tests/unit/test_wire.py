"""Framing and request parsing: bytes in, requests out, with no event loop."""

from __future__ import annotations

import struct

import msgpack
import pytest

from rasd import wire as daemon_wire
from rasd.core.errors import BadRequest
from rasd_client import wire


def test_roundtrip_byte_by_byte() -> None:
    """Frames split at any byte boundary decode to the same payloads, in order."""
    payloads = [{"v": 1, "id": i, "op": "ping", "x": "é" * i} for i in range(5)]
    data = b"".join(wire.encode(p) for p in payloads)
    dec = wire.FrameDecoder()
    out = []
    for b in data:
        dec.feed(bytes([b]))
        out.extend(dec.frames())
    assert out == payloads
    assert dec.buffered == 0


def test_too_large_frame_raises() -> None:
    """A length prefix above MAX_FRAME cannot be resynchronised: the decoder refuses it."""
    dec = wire.FrameDecoder()
    dec.feed(struct.pack(">I", wire.MAX_FRAME + 1))
    with pytest.raises(wire.FrameTooLarge):
        list(dec.frames())


def test_garbage_payload_is_a_bad_frame_and_stream_continues() -> None:
    """A delimited but undecodable payload yields BadFrame; the next frame still decodes."""
    dec = wire.FrameDecoder()
    dec.feed(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    dec.feed(struct.pack(">I", 1) + msgpack.packb(5))
    dec.feed(wire.encode({"v": 1, "id": 1, "op": "ping"}))
    frames = list(dec.frames())
    assert isinstance(frames[0], wire.BadFrame)
    assert isinstance(frames[1], wire.BadFrame) and "int" in frames[1].reason
    assert frames[2] == {"v": 1, "id": 1, "op": "ping"}


def good() -> dict[str, object]:
    return {
        "v": 1,
        "id": 7,
        "op": "get_lease",
        "client_id": "demo",
        "pool_id": "default",
        "key": "k1",
        "lease_expires_us": 123,
        "deadline_ms": 500,
    }


def test_parse_good_request() -> None:
    """A well-formed get_lease parses into a typed Request."""
    req = daemon_wire.parse(good())
    assert (req.id, req.op, req.key, req.lease_expires_us, req.deadline_ms) == (
        7,
        "get_lease",
        "k1",
        123,
        500,
    )


@pytest.mark.parametrize(
    "change",
    [
        {"v": 2},
        {"v": True},
        {"v": 1.0},
        {"id": "7"},
        {"id": True},
        {"op": "steal"},
        {"client_id": 5},
        {"pool_id": ""},
        {"key": None},
        {"key": "k" * 600},
        {"lease_expires_us": 1.5},
        {"lease_expires_us": True},
        {"deadline_ms": 0},
        {"deadline_ms": 10**9},
    ],
)
def test_parse_rejects_bad_fields(change: dict[str, object]) -> None:
    """Every missing, mistyped or out-of-range field is a BadRequest, never a crash."""
    frame = good()
    frame.update(change)
    with pytest.raises(BadRequest):
        daemon_wire.parse(frame)


def test_parse_rejects_missing_field() -> None:
    """A get_lease without lease_expires_us is refused."""
    frame = good()
    del frame["lease_expires_us"]
    with pytest.raises(BadRequest):
        daemon_wire.parse(frame)

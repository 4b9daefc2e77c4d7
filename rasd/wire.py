"""Requests and responses of the wire protocol (docs/protocol.md): what a frame must hold, and
what an answer holds. Pure: frames in, Requests and answers out, no I/O.

:func:`lease_fields` checks a ``get_lease`` frame in one pass, :func:`parse` names what is
wrong; :func:`lease_response` and :func:`answer_head` are the one answer layout
(docs/design.md, "Inside get_lease").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from rasd_client.wire import HEADER_SIZE, VERSION, encode, length_prefix

from .core.errors import BadRequest
from .core.lease import MAX_KEY_LEN, Lease

OPS = frozenset({"get_lease", "release", "headroom", "ping", "stats", "table", "touch"})
_NEEDS_POOL = frozenset({"get_lease", "release", "headroom", "touch"})
MAX_DEADLINE_MS = 60_000
MAX_ID_LEN = 64  # client_id and pool_id, characters
#: the largest id ``ID_PACK`` packs (a msgpack uint64); a negative id takes :func:`answer_wide`
ID_MAX = 2**64 - 1
#: packs the id's value after an answer's head (:func:`answer_head`): 8 bytes, big-endian
ID_PACK = struct.Struct(">Q").pack
#: the fields of a well-formed get_lease: id, client_id, pool_id, key, lease_expires_us,
#: deadline_ms (None when absent)
LeaseFields = tuple[int, str, str, str, int, int | None]


@dataclass(slots=True)
class Request:
    id: int
    op: str
    client_id: str = ""
    pool_id: str = ""
    key: str = ""
    lease_expires_us: int = 0
    deadline_ms: int | None = None


def _str(frame: dict[str, Any], name: str, max_len: int = 256) -> str:
    v = frame.get(name)
    if not isinstance(v, str) or not v:
        raise BadRequest(f"{name} must be a non-empty string")
    if len(v) > max_len:
        raise BadRequest(f"{name} is longer than {max_len} characters")
    return v


def _int(frame: dict[str, Any], name: str) -> int:
    v = frame.get(name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{name} must be an integer")
    return v


def request_id(frame: dict[str, Any]) -> int | None:
    rid = frame.get("id")
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else None


def lease_fields(frame: dict[str, Any]) -> LeaseFields | None:
    """The one check of a get_lease frame: its fields when every one is well-formed (types,
    values, the names' lengths), else None (:func:`parse` then names the first wrong one).
    Exact types: True and 1.0 equal 1 in Python, not on the wire."""
    try:
        if frame["op"] != "get_lease":
            return None
        v = frame["v"]
        rid = frame["id"]
        c = frame["client_id"]
        p = frame["pool_id"]
        k = frame["key"]
        e = frame["lease_expires_us"]
    except KeyError:
        return None
    d = frame.get("deadline_ms")
    if (
        type(v) is int
        and v == VERSION
        and type(rid) is int
        and type(c) is str
        and 0 < len(c) <= MAX_ID_LEN
        and type(p) is str
        and 0 < len(p) <= MAX_ID_LEN
        and type(k) is str
        and 0 < len(k) <= MAX_KEY_LEN
        and type(e) is int
        and (d is None or (type(d) is int and 0 < d <= MAX_DEADLINE_MS))
    ):
        return rid, c, p, k, e, d
    return None


def parse(frame: dict[str, Any]) -> Request:
    """The Request a frame asks for; raises BadRequest naming the first field that is wrong.
    (The server parses only the frames :func:`lease_fields` refuses: a well-formed get_lease
    goes on with its tuple.)"""
    f = lease_fields(frame)
    if f is not None:
        rid, client_id, pool_id, key, lease_expires_us, deadline_ms = f
        return Request(rid, "get_lease", client_id, pool_id, key, lease_expires_us, deadline_ms)
    req = _parse_checked(frame)
    if req.op == "get_lease":
        # lease_fields alone accepts a get_lease; the walk names what is wrong, and finds
        # something in every frame it refuses
        raise BadRequest("malformed get_lease")
    return req


def _parse_checked(frame: dict[str, Any]) -> Request:
    """Every op, field by field; raises BadRequest naming the first field that is wrong. The
    acceptance of a get_lease is :func:`lease_fields`'s alone (see :func:`parse`)."""
    v = frame.get("v")
    if type(v) is not int or v != VERSION:  # True and 1.0 equal 1 in Python, not on the wire
        raise BadRequest(f"unsupported protocol version {frame.get('v')!r} (this daemon: 1)")
    rid = request_id(frame)
    if rid is None:
        raise BadRequest("id must be an integer")
    op = frame.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise BadRequest(f"unknown op {op!r}; ops: {', '.join(sorted(OPS))}")
    req = Request(id=rid, op=op)
    if "deadline_ms" in frame and frame["deadline_ms"] is not None:
        d = _int(frame, "deadline_ms")
        if not 0 < d <= MAX_DEADLINE_MS:
            raise BadRequest(f"deadline_ms must be in 1..{MAX_DEADLINE_MS}")
        req.deadline_ms = d
    if op in _NEEDS_POOL:
        req.client_id = _str(frame, "client_id", MAX_ID_LEN)
        req.pool_id = _str(frame, "pool_id", MAX_ID_LEN)
    elif op == "table":
        req.client_id = _str(frame, "client_id", MAX_ID_LEN)
    if op in ("get_lease", "release", "touch"):
        req.key = _str(frame, "key", MAX_KEY_LEN)
    if op in ("get_lease", "touch"):
        req.lease_expires_us = _int(frame, "lease_expires_us")
    return req


def ok(req_id: int, **fields: Any) -> dict[str, Any]:
    return {"v": VERSION, "id": req_id, "ok": True, **fields}


def lease_response(req_id: int, lease: Lease, new: bool) -> dict[str, Any]:
    """The answer to a get_lease (the one layout: a cached hit's bytes are this frame). The
    ``id`` comes last, so that :func:`answer_head` can leave its value out."""
    return {
        "v": VERSION,
        "ok": True,
        "resource": lease.resource,
        "lease_expires_us": lease.expires_us,
        "version": lease.version,
        "new": new,
        "region": lease.region,
        "id": req_id,
    }


def answer_head(lease: Lease) -> bytes:
    """The encoded :func:`lease_response` of a hit on ``lease`` (``new`` false) but for the
    value of its ``id``: the frame's length counts 8 bytes more, and the id's value, packed
    last as one byte (0x00, id 0), is replaced by the uint64 marker 0xcf. The answer to
    request ``req_id`` (0 <= req_id <= ID_MAX) is ``head + ID_PACK(req_id)``; for a negative
    one, :func:`answer_wide`."""
    frame = encode(lease_response(0, lease, False))
    return length_prefix.pack(len(frame) - HEADER_SIZE + 8) + frame[HEADER_SIZE:-1] + b"\xcf"


def answer_wide(head: bytes, req_id: int) -> bytes:
    """The answer to request ``req_id`` from an :func:`answer_head` when ``ID_PACK`` cannot
    carry the id (a negative one; msgpack decodes no int above ``ID_MAX``): the id packed as
    msgpack packs it, the length counted again: ``encode(lease_response(req_id, ...))``."""
    body: bytes = head[HEADER_SIZE:-1] + msgpack.packb(req_id)
    return length_prefix.pack(len(body)) + body

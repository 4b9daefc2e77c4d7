"""Requests and responses of the wire protocol (docs/protocol.md). Pure: dicts in, dicts out.

``parse()`` validates one decoded frame into a ``Request`` or raises ``BadRequest``; the server
never touches an unvalidated field. A well-formed ``get_lease`` (the cached hit's frame) is
checked in one pass: one exact type check and, for strings, one length check per field, and
nothing allocated but the ``Request``. Any frame that fails that pass goes through
``_parse_checked``, the field-by-field walk that names what is wrong; so the fast pass decides
nothing it could get wrong, it only lets through frames the walk would accept too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rasd_client.wire import VERSION

from .errors import BadRequest
from .lease import MAX_KEY_LEN, Lease

OPS = frozenset({"get_lease", "release", "headroom", "ping", "stats"})
_NEEDS_POOL = frozenset({"get_lease", "release", "headroom"})
MAX_DEADLINE_MS = 60_000
MAX_ID_LEN = 64  # client_id and pool_id, characters


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


def parse(frame: dict[str, Any]) -> Request:
    get = frame.get
    if get("op") == "get_lease":
        v = get("v")
        rid = get("id")
        c = get("client_id")
        p = get("pool_id")
        k = get("key")
        e = get("lease_expires_us")
        d = get("deadline_ms")
        # exact types: True and 1.0 equal 1 in Python, not on the wire
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
            return Request(rid, "get_lease", c, p, k, e, d)
    return _parse_checked(frame)


def _parse_checked(frame: dict[str, Any]) -> Request:
    """Every op, field by field; raises BadRequest naming the first field that is wrong."""
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
    if op in ("get_lease", "release"):
        req.key = _str(frame, "key", MAX_KEY_LEN)
    if op == "get_lease":
        req.lease_expires_us = _int(frame, "lease_expires_us")
    return req


def ok(req_id: int, **fields: Any) -> dict[str, Any]:
    return {"v": VERSION, "id": req_id, "ok": True, **fields}


def lease_response(req_id: int, lease: Lease, new: bool) -> dict[str, Any]:
    return {
        "v": VERSION,
        "id": req_id,
        "ok": True,
        "resource": lease.resource,
        "lease_expires_us": lease.expires_us,
        "version": lease.version,
        "new": new,
        "region": lease.region,
    }

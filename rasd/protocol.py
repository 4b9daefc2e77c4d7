"""Requests and responses of the wire protocol (docs/protocol.md). Pure: dicts in, dicts out.

``parse()`` validates one decoded frame into a ``Request`` or raises ``BadRequest``; the server
never touches an unvalidated field.
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

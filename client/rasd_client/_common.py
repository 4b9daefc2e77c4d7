"""Pieces shared by the sync and async clients: the Lease type and argument handling."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .errors import BadRequest, RasdError, error_from_wire

DEFAULT_SOCKET = "/run/rasd/rasd.sock"
DEFAULT_TIMEOUT = 1.0
#: Grace the client waits past its own deadline for the daemon's TIMEOUT/BUSY answer.
SOCKET_GRACE = 0.25
#: A retry after a connection closed before any reply needs at least this much of the
#: caller's deadline left, else the first failure is raised.
MIN_RETRY_BUDGET = 0.02
#: The async client tries a connect that failed for a transient reason (a full listen backlog,
#: no daemon listening while one restarts) again after this pause, doubling up to
#: CONNECT_RETRY_MAX, for as long as the caller's timeout allows.
CONNECT_RETRY_INITIAL = 0.005
CONNECT_RETRY_MAX = 0.1

LeaseExpires = datetime | timedelta | int | float


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease on one resource. ``version`` is the resource's version when this lease was
    claimed: the same across extensions, greater for every later holder of the resource, so
    it serves as a fencing token."""

    resource: str
    lease_expires: datetime
    version: int
    new: bool
    region: str = ""


def socket_path(explicit: str | None) -> str:
    return explicit or os.environ.get("RASD_SOCKET") or DEFAULT_SOCKET


def expires_us(lease_expires: LeaseExpires, now: float | None = None) -> int:
    """Convert the accepted forms of ``lease_expires`` to epoch microseconds."""
    if isinstance(lease_expires, bool):
        raise BadRequest("lease_expires must be a datetime, timedelta or epoch seconds")
    if isinstance(lease_expires, datetime):
        if lease_expires.tzinfo is None or lease_expires.utcoffset() is None:
            raise BadRequest("lease_expires must be an aware datetime (naive given)")
        return int(round(lease_expires.timestamp() * 1_000_000))
    if isinstance(lease_expires, timedelta):
        base = time.time() if now is None else now
        return int(round((base + lease_expires.total_seconds()) * 1_000_000))
    if isinstance(lease_expires, (int, float)):
        return int(round(lease_expires * 1_000_000))
    raise BadRequest(
        f"lease_expires must be a datetime, timedelta or epoch seconds, "
        f"not {type(lease_expires).__name__}"
    )


def check_str(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} must be a non-empty str")
    return value


def get_lease_request(
    client_id: str, pool_id: str, key: str, lease_expires: LeaseExpires, timeout: float
) -> dict[str, Any]:
    return {
        "op": "get_lease",
        "client_id": check_str("client_id", client_id),
        "pool_id": check_str("pool_id", pool_id),
        "key": check_str("key", key),
        "lease_expires_us": expires_us(lease_expires),
        "deadline_ms": int(timeout * 1000),
    }


def release_request(client_id: str, pool_id: str, key: str, timeout: float) -> dict[str, Any]:
    return {
        "op": "release",
        "client_id": check_str("client_id", client_id),
        "pool_id": check_str("pool_id", pool_id),
        "key": check_str("key", key),
        "deadline_ms": int(timeout * 1000),
    }


def headroom_request(client_id: str, pool_id: str, timeout: float) -> dict[str, Any]:
    return {
        "op": "headroom",
        "client_id": check_str("client_id", client_id),
        "pool_id": check_str("pool_id", pool_id),
        "deadline_ms": int(timeout * 1000),
    }


def retry_budget(deadline: float) -> float | None:
    """Seconds left for a retry before ``deadline`` (time.monotonic()), or None if too few."""
    left = deadline - time.monotonic()
    return left if left >= MIN_RETRY_BUDGET else None


def with_deadline(req: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The request again, telling the daemon only the time that is left."""
    return {**req, "deadline_ms": max(1, int(timeout * 1000))}


def raise_for(resp: dict[str, Any]) -> dict[str, Any]:
    if resp.get("ok"):
        return resp
    raise error_from_wire(
        str(resp.get("code", "INTERNAL")), str(resp.get("message", "")), resp.get("retry_after")
    )


def lease_from(resp: dict[str, Any]) -> Lease:
    raise_for(resp)
    try:
        return Lease(
            resource=resp["resource"],
            lease_expires=datetime.fromtimestamp(resp["lease_expires_us"] / 1_000_000, UTC),
            version=int(resp["version"]),
            new=bool(resp["new"]),
            region=str(resp.get("region", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RasdError(f"malformed lease from daemon: {exc!r}") from exc


def headroom_from(resp: dict[str, Any]) -> int:
    raise_for(resp)
    return int(resp["headroom"])

"""Pieces shared by the sync and async clients: the Lease type and argument handling."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from . import wire
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
#: The longest ``timeout`` a call may have: the wire's ``deadline_ms`` is at most 60000.
MAX_TIMEOUT = 60.0
#: The longest socket path AF_UNIX takes, in bytes (sun_path less its terminating NUL).
MAX_SOCKET_PATH = 107

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


def shown(value: Any) -> str:
    """``value`` for an error message: its repr, cut short (any repr may fail: a huge int's)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a message must never raise
        return f"a {type(value).__name__}"
    return text if len(text) <= 40 else f"{text[:37]}..."


def socket_path(explicit: Any) -> str:
    """The socket to call: ``explicit``, else ``$RASD_SOCKET``, else the default. BadRequest
    for a path AF_UNIX cannot take (not a path, not encodable, too long)."""
    path = explicit or os.environ.get("RASD_SOCKET") or DEFAULT_SOCKET
    try:
        path = os.fsdecode(path)
        size = len(os.fsencode(path))
    except (TypeError, ValueError) as exc:  # not a path; a lone surrogate
        raise BadRequest(f"socket_path must be a file system path, not {shown(path)}") from exc
    if size > MAX_SOCKET_PATH:
        raise BadRequest(f"socket_path is {size} bytes long, over AF_UNIX's {MAX_SOCKET_PATH}")
    return path


def call_timeout(explicit: Any) -> Any:
    """A call's timeout: ``explicit``, else ``$RASD_TIMEOUT`` (seconds; set per deployment,
    as ``RASD_SOCKET``), else DEFAULT_TIMEOUT. Checked where it is used (``check_timeout``)."""
    if explicit is not None:
        return explicit
    raw = os.environ.get("RASD_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT:  # nan too
        msg = f"RASD_TIMEOUT must be seconds in (0, {MAX_TIMEOUT:g}], not {shown(raw)}"
        raise BadRequest(msg)
    return value


def check_timeout(timeout: Any) -> float:
    """``timeout`` (seconds) if it is one the protocol can carry, else BadRequest."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= MAX_TIMEOUT
    ):
        raise BadRequest(f"timeout must be in (0, {MAX_TIMEOUT:g}] seconds, not {shown(timeout)}")
    return float(timeout)


def deadline_ms(timeout: Any) -> int:
    """The wire's ``deadline_ms`` for a call's ``timeout`` (checked)."""
    return max(1, int(check_timeout(timeout) * 1000))


#: ``lease_expires_us`` must fit the wire's signed 64-bit integers
_MAX_US = 2**63 - 1
#: Epoch seconds over this far in the past are refused here, naming the time they mean: a
#: number that small is most likely a duration (``3600`` for an hour), and the daemon would
#: only say "in the past". Far beyond any clock skew, so a time that has just passed still
#: reaches the daemon's own check. It is also the longest lease a pool may have.
_YEAR_S = 366 * 86_400


def expires_us(lease_expires: LeaseExpires, now: float | None = None) -> int:
    """Convert the accepted forms of ``lease_expires`` to epoch microseconds; BadRequest for
    any other value, one out of range (infinite, NaN, beyond 64 bits), or epoch seconds over
    a year in the past (:func:`not_a_time`: a duration, most likely)."""
    forms = "an aware datetime, a timedelta or epoch seconds"
    try:
        if isinstance(lease_expires, bool):
            raise BadRequest(f"lease_expires must be {forms}, not a bool")
        if isinstance(lease_expires, datetime):
            if lease_expires.tzinfo is None or lease_expires.utcoffset() is None:
                raise BadRequest("lease_expires must be an aware datetime (naive given)")
            us = round(lease_expires.timestamp() * 1_000_000)
        elif isinstance(lease_expires, timedelta):
            base = time.time() if now is None else now
            us = round((base + lease_expires.total_seconds()) * 1_000_000)
        elif isinstance(lease_expires, float) and not math.isfinite(lease_expires):
            raise BadRequest(f"lease_expires must be a finite number, not {lease_expires!r}")
        elif isinstance(lease_expires, (int, float)):
            us = round(lease_expires * 1_000_000)
            not_a_time(lease_expires, time.time() if now is None else now)
        else:
            raise BadRequest(f"lease_expires must be {forms}, not {type(lease_expires).__name__}")
    except (OverflowError, ValueError, OSError) as exc:
        raise BadRequest(f"lease_expires is out of range: {shown(lease_expires)}") from exc
    if not 0 < us <= _MAX_US:
        raise BadRequest(f"lease_expires is out of range: {shown(lease_expires)}")
    return int(us)


def not_a_time(seconds: float, now: float) -> None:
    """BadRequest for epoch seconds over a year before ``now``; a number no longer than a
    year is told how to pass it as a duration. Not positive: out of range (the caller)."""
    if seconds <= 0 or seconds >= now - _YEAR_S:
        return
    when = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    said = f"lease_expires {shown(seconds)} is epoch seconds ({when}), in the past"
    if seconds <= _YEAR_S:
        raise BadRequest(f"{said}; for a duration pass timedelta(seconds={shown(seconds)})")
    raise BadRequest(f"{said} by over a year: pass the lease's end, or a timedelta from now")


def check_str(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} must be a non-empty str, not {shown(value)}")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise BadRequest(f"{name} is not valid Unicode text (a lone surrogate)") from None
    return value


def encode_request(req: dict[str, Any]) -> bytes:
    """One request frame; BadRequest when it cannot be sent: a field msgpack cannot carry
    (``call_raw``'s), or a frame over the protocol's limit, which the daemon would refuse."""
    try:
        frame = wire.encode(req)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadRequest(f"request cannot be encoded: {exc}") from exc
    size = len(frame) - wire.HEADER_SIZE
    if size > wire.MAX_FRAME:
        raise BadRequest(
            f"request of {size} bytes is over the protocol's limit of {wire.MAX_FRAME} "
            "(a key or name far too long?)"
        )
    return frame


def refused_frame(resp: dict[str, Any]) -> bool:
    """An error answer without an id: the daemon refused a frame without reading its id (too
    large, not a map). On a connection that carries one request at a time it is that
    request's answer."""
    return resp.get("id") is None and resp.get("ok") is False


def get_lease_request(
    client_id: str, pool_id: str, key: str, lease_expires: LeaseExpires, timeout: float
) -> dict[str, Any]:
    return {
        "op": "get_lease",
        "client_id": check_str("client_id", client_id),
        "pool_id": check_str("pool_id", pool_id),
        "key": check_str("key", key),
        "lease_expires_us": expires_us(lease_expires),
        "deadline_ms": deadline_ms(timeout),
    }


def release_request(client_id: str, pool_id: str, key: str, timeout: float) -> dict[str, Any]:
    return {
        "op": "release",
        "client_id": check_str("client_id", client_id),
        "pool_id": check_str("pool_id", pool_id),
        "key": check_str("key", key),
        "deadline_ms": deadline_ms(timeout),
    }


def headroom_request(client_id: str, pool_id: str, timeout: float) -> dict[str, Any]:
    return {
        "op": "headroom",
        "client_id": check_str("client_id", client_id),
        "pool_id": check_str("pool_id", pool_id),
        "deadline_ms": deadline_ms(timeout),
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
    except (KeyError, TypeError, ValueError, OverflowError, OSError) as exc:
        raise RasdError(f"malformed lease from daemon: {exc!r}") from exc


def headroom_from(resp: dict[str, Any]) -> int:
    raise_for(resp)
    try:
        return int(resp["headroom"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise RasdError(f"malformed headroom from daemon: {exc!r}") from exc

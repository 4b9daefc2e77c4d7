"""rasd's errors: the same hierarchy the client raises (one source of codes)."""

from rasd_client.errors import (
    ERRORS_BY_CODE,
    BadRequest,
    Busy,
    Forbidden,
    Internal,
    NoCapacity,
    NotHeld,
    RasdError,
    Timeout,
    Unavailable,
    UnknownPool,
)

__all__ = [
    "ERRORS_BY_CODE",
    "BadRequest",
    "Busy",
    "Forbidden",
    "Internal",
    "NoCapacity",
    "NotHeld",
    "RasdError",
    "Timeout",
    "Unavailable",
    "UnknownPool",
]

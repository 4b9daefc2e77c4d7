"""rasd_client: get an exclusive, expiring lease on a resource from the local rasd daemon.

    import rasd_client
    from datetime import timedelta
    lease = rasd_client.get_lease("demo", "default", "exp-42", timedelta(hours=1))
    lease.resource, lease.lease_expires, lease.version, lease.new

Depends on msgpack only. Safe across fork() and threads. ``rasd_client.aio`` has coroutines.
"""

from ._common import DEFAULT_SOCKET, DEFAULT_TIMEOUT, Lease
from ._sync import call_raw, get_lease, headroom, release
from ._table import table_stats
from .errors import (
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
    "DEFAULT_SOCKET",
    "DEFAULT_TIMEOUT",
    "BadRequest",
    "Busy",
    "Forbidden",
    "Internal",
    "Lease",
    "NoCapacity",
    "NotHeld",
    "RasdError",
    "Timeout",
    "Unavailable",
    "UnknownPool",
    "call_raw",
    "get_lease",
    "headroom",
    "release",
    "table_stats",
]
__version__ = "0.1.0"

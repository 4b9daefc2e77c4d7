"""The hit table's two ops: ``table`` hands a process its client's table, ``touch`` hears
that an entry past its touch time was served from one (docs/protocol.md, "The hit table")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import wire
from ..core.errors import BadRequest, RasdError, Unavailable
from ..observe.metrics import Counters
from .connection import Connection

if TYPE_CHECKING:
    from ..daemon.cache import LeaseCache

#: what the cache answers a get_lease (``LeaseCache.answer``)
Answer = Callable[[str, str, str, int, float, int], bytes | None]
#: what a touch asks of the renewer (``Renewer.touched``): the key, the lease end asked for
Touched = Callable[[tuple[str, str, str], int], None]


def hand_table(
    conn: Connection,
    req: wire.Request,
    cache: LeaseCache | None,
    now: float,
    counters: Counters,
) -> RasdError | None:
    """Send ``req.client_id``'s table (its fd, SCM_RIGHTS) with the daemon's monotonic time,
    by which the client checks that it shares this clock; the error to answer otherwise.
    The connection then only carries touches: the client reads the table while it stays
    open and silent."""
    if cache is None:
        return Unavailable("the daemon is starting")
    table = cache.open_table(req.client_id)
    if table is None:
        return BadRequest("this daemon publishes no hit table (hit_table = false)")
    answer = wire.ok(req.id, size=table.size, mono=now)
    if not conn.send_fd(answer, table.fd):
        return Unavailable("the table could not be handed over now; ask again")
    conn.handed.add(req.client_id)
    counters.inc("table.handed")
    return None


def touch(req: wire.Request, touched: Touched, counters: Counters) -> None:
    """An entry past its touch time was served from the table: the renewer does what a hit
    past it does (a re-confirmation, an extension: ``Renewer.touched``). One way: never
    answered."""
    counters.inc("table.touches")
    touched((req.client_id, req.pool_id, req.key), req.lease_expires_us)

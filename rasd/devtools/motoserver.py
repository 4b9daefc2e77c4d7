"""moto's DynamoDB server on loopback, for ``rasd dev``, the tests, the benchmarks and the
simulation. (Development only: production is real DynamoDB; moto is never imported by
``rasd serve``.)

moto's threaded server does not serialise conditional writes: two UpdateItems on one item can
both evaluate their condition before either writes, and both "succeed". Real DynamoDB never
does that, and rasd's correctness rests on it. ``start()`` therefore wraps the DynamoDB
backend's write operations in one lock, so each conditional write is atomic, as in DynamoDB.

Query and Scan take the lock too: moto's Query picks the index's items (those with every key
attribute) and then sorts them by those attributes, without a lock; a claim that removes
``lease_available`` in between (an item leaving the sparse ``available_resources`` index)
made the sort raise ``KeyError: 'lease_available'``, answered as a 500. In DynamoDB a Query
sees each item either in the index or not. GetItem stays concurrent.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

_LOCK = threading.RLock()
_PATCHED = False
WRITE_OPS = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
#: reads that walk many items and must not see one half-written (see above)
READ_OPS = ("query", "scan")


def make_writes_atomic() -> None:
    """Serialise moto's DynamoDB writes, and the Queries and Scans that walk an index, in
    this process (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    from moto.dynamodb.models import DynamoDBBackend

    for name in WRITE_OPS + READ_OPS:
        original = getattr(DynamoDBBackend, name)

        @functools.wraps(original)
        def locked(self: Any, *args: Any, __original: Any = original, **kw: Any) -> Any:
            with _LOCK:
                return __original(self, *args, **kw)

        setattr(DynamoDBBackend, name, locked)
    _PATCHED = True


def start(host: str = "127.0.0.1", port: int = 0, log_file: str | None = None) -> tuple[Any, str]:
    """Start moto's server in a thread; returns (server, endpoint_url). ``server.stop()``."""
    from moto.server import ThreadedMotoServer

    make_writes_atomic()
    wlog = logging.getLogger("werkzeug")
    if log_file:
        wlog.handlers[:] = [logging.FileHandler(log_file)]
        wlog.propagate = False
        wlog.setLevel(logging.INFO)
    else:
        wlog.setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    h, p = server.get_host_and_port()
    return server, f"http://{h}:{p}"


def serve_forever(host: str = "127.0.0.1", port: int = 0) -> None:
    """``python -m rasd.devtools.motoserver``: print ``PORT n`` and serve until stdin closes (for
    harnesses that want moto in its own process, away from their GIL)."""
    import sys

    server, url = start(host, port)
    print("PORT", url.rsplit(":", 1)[1], flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    serve_forever()

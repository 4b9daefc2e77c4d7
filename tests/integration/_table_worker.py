"""A worker process for the hit-table release test: get_lease on random keys for a while,
one JSON line per call with when it began (CLOCK_MONOTONIC, shared by the host's processes)
and whether the table answered it. Run as
``python -m tests.integration._table_worker SOCKET SEED SECONDS KEY...``."""

from __future__ import annotations

import json
import random
import sys
import time
from datetime import timedelta

import rasd_client
from rasd_client import _table
from tests.helpers.deadlines import WAIT


def main() -> None:
    sock, seed, seconds, keys = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    lines = []
    while (began := time.monotonic()) < end:
        key = rng.choice(keys)
        before = _table.current.hits
        lease = rasd_client.get_lease(
            "demo", "default", key, timedelta(minutes=10), socket_path=sock, timeout=WAIT
        )
        path = "table" if _table.current.hits > before else "socket"
        lines.append(
            {"began": began, "key": key, "resource": lease.resource, "new": lease.new, "path": path}
        )
        time.sleep(0.0002)
    sys.stdout.write("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    main()

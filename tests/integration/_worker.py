"""A client process for the concurrency audit: N get_lease calls on random keys, results as
JSON lines on stdout. Run as ``python -m tests.integration._worker SOCKET SEED N KEYS``."""

from __future__ import annotations

import json
import random
import sys
from datetime import timedelta

import rasd_client
from tests.helpers.deadlines import WAIT


def main() -> None:
    sock, seed, n, nkeys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    for _ in range(n):
        key = f"key-{rng.randrange(nkeys):04d}"
        try:
            lease = rasd_client.get_lease(
                # the audit is about what the table holds, not how fast: the answer is waited for
                "demo",
                "default",
                key,
                timedelta(hours=1),
                socket_path=sock,
                timeout=WAIT,
            )
            out = {
                "key": key,
                "resource": lease.resource,
                "version": lease.version,
                "new": lease.new,
                "region": lease.region,
            }
        except rasd_client.RasdError as exc:
            out = {"key": key, "error": exc.code, "message": exc.message}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

"""`rasd dev` takes a demo's first load test: 200 concurrent new keys through
``rasd_client.aio``, twice, every call answered with its own resource (README, "Two commands
on a fresh machine")."""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import time
from datetime import timedelta
from typing import Any

import pytest

from rasd_client import Lease, aio
from tests.helpers.devproc import rasd_dev

pytestmark = [pytest.mark.integration, pytest.mark.serial]

BURST = 200
#: the client's timeout for a burst on moto (README: what `rasd dev` can take)
TIMEOUT = 30.0


async def burst(sock: str, prefix: str) -> list[Any]:
    try:
        return await asyncio.gather(
            *(
                aio.get_lease(
                    "demo",
                    "default",
                    f"{prefix}-{i}",
                    timedelta(hours=1),
                    socket_path=sock,
                    timeout=TIMEOUT,
                )
                for i in range(BURST)
            ),
            return_exceptions=True,
        )
    finally:
        await aio.close()


def test_rasd_dev_serves_bursts_of_200_new_keys() -> None:
    workdir = tempfile.mkdtemp(prefix="rasd-dev-")
    with rasd_dev(workdir, stop_timeout=60, stderr=subprocess.DEVNULL) as dev:
        assert "with 1000 resources" in dev.banner, dev.banner
        seen: set[str] = set()
        for prefix in ("first", "second"):
            t0 = time.monotonic()
            got = asyncio.run(burst(dev.socket, prefix))
            took = time.monotonic() - t0
            errors = [g for g in got if not isinstance(g, Lease)]
            assert errors == [], f"{len(errors)} errors, e.g. {errors[:3]}"
            assert all(g.new for g in got)
            resources = {g.resource for g in got}
            assert len(resources) == BURST, "a resource answered to two keys"
            assert not resources & seen
            seen |= resources
            print(f"{prefix} burst of {BURST} new keys: {took:.1f} s")
    assert dev.rc == 0

"""`rasd dev` takes a demo's first load test: 200 concurrent new keys through
``rasd_client.aio``, twice, every call answered with its own resource (README, "Two commands
on a fresh machine")."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rasd_client import Lease, aio

pytestmark = [pytest.mark.integration, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rasd", "dev", "--dir", workdir],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = []
        for line in proc.stdout:
            banner.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        text = "".join(banner)
        sock = re.search(r"socket: (\S+)", text)
        assert sock, text
        assert "with 1000 resources" in text, text
        seen: set[str] = set()
        for prefix in ("first", "second"):
            t0 = time.monotonic()
            got = asyncio.run(burst(sock.group(1), prefix))
            took = time.monotonic() - t0
            errors = [g for g in got if not isinstance(g, Lease)]
            assert errors == [], f"{len(errors)} errors, e.g. {errors[:3]}"
            assert all(g.new for g in got)
            resources = {g.resource for g in got}
            assert len(resources) == BURST, "a resource answered to two keys"
            assert not resources & seen
            seen |= resources
            print(f"{prefix} burst of {BURST} new keys: {took:.1f} s")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0

"""`promtool check metrics` accepts the live exposition of a running daemon (after traffic, so
counters, labelled families and the latency histogram are all present)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import urllib.request
from datetime import timedelta
from typing import Any

import pytest

from rasd_client import aio as rasd_aio
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration]
PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package `prometheus`: `make tools` installs it)",
)
async def test_promtool_accepts_live_metrics(ddb: Any, table: str, make_daemon: Any) -> None:
    pytest.importorskip("prometheus_client")
    seed_pool(ddb, table, count=3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with make_daemon(metrics_port=port) as d:
        for key in ("a", "b", "a"):
            await rasd_aio.get_lease(
                "demo", "default", key, timedelta(hours=1), socket_path=d.cfg.socket, timeout=10
            )
        url = f"http://127.0.0.1:{port}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
    assert b"rasd_up 1.0" in body
    assert b"rasd_cache_lookups_total" in body
    out = await asyncio.to_thread(
        lambda: subprocess.run(
            [str(PROMTOOL), "check", "metrics"], input=body, capture_output=True, timeout=60
        )
    )
    # exit 0: valid; promtool prints lint hints (not errors) on stdout/stderr
    assert out.returncode == 0, (out.stdout + out.stderr).decode()

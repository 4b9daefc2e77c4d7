"""Start-up: the daemon answers before its store is up (requests wait for it
within their deadline), and an unreachable DynamoDB leaves it running *degraded* (UNAVAILABLE
at once, one structured log line per try naming the endpoint and the cause, no traceback, no
"Unclosed client session"), retrying until DynamoDB comes back."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

import rasd_client
from fleet.daemons import serve_argv
from rasd.core import schema
from rasd.devtools import motoserver
from tests.helpers.tables import seed_pool

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
HOUR = timedelta(hours=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(sock: str, endpoint: str, table: str, log: Path, **env: str) -> Any:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("NOTIFY_", "LISTEN_"))}
    full.update(
        {
            "PYTHONPATH": str(ROOT),
            "RASD_ACL_OPEN": "true",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "RASD_STARTUP_RETRY_INITIAL": "0.2",
            "RASD_STARTUP_RETRY_MAX": "0.5",
            "RASD_DDB_CONNECT_TIMEOUT": "0.2",
            "RASD_STARTUP_DEADLINE": "1.0",
            **env,
        }
    )
    with log.open("ab") as err:
        return subprocess.Popen(
            serve_argv(sock, table, endpoint, log_level="info"),
            env=full,
            stderr=err,
            cwd=ROOT,
        )


def _poll(pred: Any, what: str, tries: int = 600) -> Any:
    """Bounded poll (not a timing assertion)."""
    last: Any = None
    for _ in range(tries):
        try:
            last = pred()
            if last:
                return last
        except (rasd_client.RasdError, OSError) as exc:
            last = exc
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what} (last: {last!r})")


def _stop(proc: Any) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return int(proc.wait(timeout=30))
    finally:
        if proc.poll() is None:
            proc.kill()


def test_unreachable_dynamodb_degrades_then_recovers(short_tmp: Path) -> None:
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    sock, log = str(short_tmp / "deg.sock"), short_tmp / "deg.log"
    proc = _serve(sock, endpoint, "rasd", log)
    server = None
    try:
        _poll(lambda: os.path.exists(sock), "socket bound")

        def unavailable() -> bool:
            try:
                rasd_client.get_lease("demo", "default", "k", HOUR, socket_path=sock)
            except rasd_client.RasdError as exc:
                return exc.code == "UNAVAILABLE" and endpoint in exc.message
            return False

        _poll(unavailable, "UNAVAILABLE naming the endpoint while degraded")
        stats = rasd_client.call_raw("stats", socket_path=sock)
        assert stats["ready"] is False and endpoint in stats["degraded"]
        assert proc.poll() is None, "the daemon must not exit for an unreachable DynamoDB"

        # DynamoDB comes back on the same address: the daemon recovers on its own.
        server, url = motoserver.start(port=port)
        ddb = boto3.client(
            "dynamodb",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        schema.create_table(ddb, "rasd")
        seed_pool(ddb, "rasd", count=3)
        lease = _poll(
            lambda: rasd_client.get_lease("demo", "default", "k", HOUR, socket_path=sock),
            "a lease once DynamoDB is back",
        )
        assert lease.new
        assert rasd_client.call_raw("stats", socket_path=sock)["degraded"] is None
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server is not None:
            server.stop()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "Unclosed" not in text, text[-3000:]
    failures = [json.loads(line) for line in text.splitlines() if "startup_failed" in line]
    assert failures, text[-3000:]
    for f in failures:
        assert f["endpoint"] == endpoint and f["cause"] and f["level"] == "error"
        assert "retry_in_s" in f and "attempt" in f
    assert any(json.loads(line).get("event") == "ready" for line in text.splitlines())


def test_requests_during_startup_wait_for_the_store(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    """A call sent the moment the socket exists (before the store is up) is answered with a
    lease, not an error: it waited within its deadline for the store."""
    seed_pool(ddb, table, count=3)
    sock, log = str(short_tmp / "early.sock"), short_tmp / "early.log"
    proc = _serve(sock, moto_endpoint, table, log, RASD_STARTUP_DEADLINE="30")
    try:
        _poll(lambda: os.path.exists(sock), "socket bound", tries=2000)
        lease = rasd_client.get_lease("demo", "default", "k", HOUR, socket_path=sock, timeout=30)
        assert lease.new
        stats = rasd_client.call_raw("stats", socket_path=sock)
        assert stats["ready"] is True
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_restart_takes_the_aws_settings_from_the_cache(
    ddb: Any, table: str, moto_endpoint: str, short_tmp: Path
) -> None:
    """`rasd serve` twice with the same inputs: the first start asks botocore (in a child
    process), the second serves on its settings at once, and botocore confirms them in the
    background."""
    seed_pool(ddb, table, count=3)
    cache = short_tmp / "cache"

    def one_start(n: int, confirmed: bool) -> list[dict[str, Any]]:
        sock, log = str(short_tmp / f"c{n}.sock"), short_tmp / f"c{n}.log"
        proc = _serve(sock, moto_endpoint, table, log, CACHE_DIRECTORY=str(cache))
        try:
            _poll(lambda: os.path.exists(sock), "socket bound", tries=2000)
            lease = rasd_client.get_lease(
                "demo", "default", f"k{n}", HOUR, socket_path=sock, timeout=30
            )
            assert lease.new
            if confirmed:
                _poll(lambda: "aws_settings_confirmed" in log.read_text(), "botocore's check")
            assert _stop(proc) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "Traceback" not in log.read_text()
        return [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]

    for n, origin in enumerate(["botocore", "cache"]):
        lines = one_start(n, confirmed=origin == "cache")
        events = [e.get("event") for e in lines]
        assert "ready" in events, lines
        ready = lines[events.index("ready")]
        origins = {origin}
        if n == 0 and "startup_failed" in events[: events.index("ready")]:
            # An attempt that failed after botocore answered (DynamoDB unanswered within the
            # start-up deadline, on a loaded machine) had written the entry: the next attempt
            # of the same start reads it, and botocore confirms it in the background.
            origins.add("cache")
        assert ready["aws"]["origin"] in origins, lines
    assert len(list(cache.glob("aws-*.json"))) == 1

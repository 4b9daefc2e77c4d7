"""`rasd dev` takes the daemon's settings as `rasd serve` does: `RASD_METRICS_PORT=N rasd dev`
serves metrics on N and its banner gives the URL; a port it cannot have stops it with the fix
before moto starts (and `rasd serve` before its socket). moto's server run by hand with
`--until-signal` outlives its stdin."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import boto3
import pytest

from tests.helpers.devproc import ROOT, dev_env, rasd_dev

pytestmark = [pytest.mark.integration]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def workdir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="rasd-dev-")  # AF_UNIX paths are short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_rasd_dev_serves_metrics_on_rasd_metrics_port(workdir: str) -> None:
    port = free_port()
    with rasd_dev(workdir, "--resources", "20", env=dev_env(RASD_METRICS_PORT=str(port))) as dev:
        url = f"http://127.0.0.1:{port}/metrics"
        assert re.search(rf"^  metrics: {re.escape(url)}$", dev.banner, re.M), dev.banner
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
        assert re.search(r"^rasd_up 1(\.0)?$", body, re.M), body[:2000]
    assert dev.rc == 0, dev.stderr()


def with_metrics_port_taken(
    argv: list[str], **env: str
) -> tuple[int, subprocess.CompletedProcess[str]]:
    """``rasd ARGV`` with ``RASD_METRICS_PORT`` set to a port another socket listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port: int = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "rasd", *argv],
            cwd=ROOT,
            env=dev_env(RASD_METRICS_PORT=str(port), **env),
            capture_output=True,
            text=True,
            timeout=60,
        )
    return port, out


def test_a_taken_metrics_port_stops_rasd_dev_with_the_fix(workdir: str) -> None:
    started = time.monotonic()
    port, out = with_metrics_port_taken(["dev", "--dir", workdir, "--resources", "5"])
    assert out.returncode == 2, out.stderr
    assert f"rasd dev: metrics_port {port}: Address already in use" in out.stderr, out.stderr
    assert "set RASD_METRICS_PORT to a free port, or unset it" in out.stderr
    assert "Traceback" not in out.stderr and "rasd dev is up" not in out.stdout
    assert not os.path.exists(os.path.join(workdir, "moto.log"))  # moto never started
    assert time.monotonic() - started < 30


def test_a_taken_metrics_port_stops_rasd_serve_with_the_fix(workdir: str) -> None:
    """`rasd serve` the same: exit 2 with the fix, no traceback, and no socket file left (the
    port is bound before the socket). It stops before any DynamoDB call: none is reachable."""
    sock = os.path.join(workdir, "rasd.sock")
    port, out = with_metrics_port_taken(
        ["serve"],
        RASD_ACL_OPEN="true",
        RASD_SOCKET=sock,
        RASD_ENDPOINT_URL="http://127.0.0.1:9",
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="x",
    )
    assert out.returncode == 2, out.stderr
    assert f"rasd: metrics_port {port}: Address already in use" in out.stderr, out.stderr
    assert "(RASD_METRICS_PORT) to a free port, or unset it" in out.stderr
    assert "Traceback" not in out.stderr
    assert not os.path.exists(sock)


def test_motoserver_until_signal_outlives_its_stdin() -> None:
    """Without it the server stops once its stdin closes (its parent's pipe); with it, a
    shell's moto with nothing on stdin serves until SIGTERM, then exits 0."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rasd.devtools.motoserver", "--until-signal", "--port", str(port)],
        cwd=ROOT,
        env=dev_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == f"PORT {port}\n"
        time.sleep(0.5)  # stdin is long closed
        assert proc.poll() is None
        ddb = boto3.client(
            "dynamodb",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        assert ddb.list_tables()["TableNames"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, proc.stderr.read() if proc.stderr else ""

"""`rasd dev`, the README's run command: it comes up, its printed example returns a lease, and
Ctrl-C stops everything cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def test_rasd_dev_example_returns_a_lease() -> None:
    """The copy-paste example that `rasd dev` prints works as printed (run from the checkout),
    and SIGINT stops moto and the daemon with exit status 0."""
    workdir = tempfile.mkdtemp(prefix="rasd-dev-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rasd", "dev", "--dir", workdir, "--resources", "50"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = []
        assert proc.stdout is not None
        for line in proc.stdout:
            banner.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        text = "".join(banner)
        sock = re.search(r"socket: (\S+)", text)
        assert sock, text
        example = re.search(r"(RASD_SOCKET=\S+) \.venv/bin/python -c '(.*?)'\n", text, re.S)
        assert example, text
        deadline = time.monotonic() + 30
        while not os.path.exists(sock.group(1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        out = subprocess.run(
            [sys.executable, "-c", example.group(2)],
            env={**env, "RASD_SOCKET": sock.group(1), "PYTHONPATH": str(ROOT / "client")},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "Lease(resource='demo-" in out.stdout and "new=True" in out.stdout
        assert os.path.exists(os.path.join(workdir, "moto.log"))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    assert not os.path.exists(sock.group(1)), "socket file left behind"

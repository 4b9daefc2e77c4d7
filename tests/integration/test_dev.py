"""`rasd dev`, the README's run command: it comes up, its printed example returns a lease, and
Ctrl-C stops everything cleanly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from tests.helpers.devproc import ROOT, dev_env, rasd_dev

pytestmark = [pytest.mark.integration]


def test_rasd_dev_example_returns_a_lease() -> None:
    """The copy-paste example that `rasd dev` prints works as printed (run from the checkout),
    and SIGINT stops moto and the daemon with exit status 0."""
    workdir = tempfile.mkdtemp(prefix="rasd-dev-")
    with rasd_dev(workdir, "--resources", "50") as dev:
        example = re.search(r"(RASD_SOCKET=\S+) \.venv/bin/python -c '(.*?)'\n", dev.banner, re.S)
        assert example, dev.banner
        deadline = time.monotonic() + 30
        while not os.path.exists(dev.socket) and time.monotonic() < deadline:
            time.sleep(0.05)
        out = subprocess.run(
            [sys.executable, "-c", example.group(2)],
            env=dev_env(RASD_SOCKET=dev.socket, PYTHONPATH=str(ROOT / "client")),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "Lease(resource='demo-" in out.stdout and "new=True" in out.stdout
        assert os.path.exists(os.path.join(workdir, "moto.log"))
    assert dev.rc == 0, dev.stderr()
    assert not os.path.exists(dev.socket), "socket file left behind"

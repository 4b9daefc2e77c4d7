"""`rasd dev` as the README runs it, in a child process: started, its banner read (the socket
it serves on), and stopped with Ctrl-C (SIGINT), its exit status kept for the test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the banner's last line
LAST_LINE = "Ctrl-C stops everything"


def dev_env(**extra: str) -> dict[str, str]:
    """This environment without AWS's settings or the daemon's, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RASD_"))}
    return {**env, **extra}


@dataclass
class Dev:
    proc: subprocess.Popen[str]
    #: the banner, as printed
    banner: str = ""
    #: exit status, once stopped
    rc: int | None = None

    @property
    def socket(self) -> str:
        found = re.search(r"socket: (\S+)", self.banner)
        assert found, self.banner
        return found.group(1)

    def stderr(self) -> str:
        """What it wrote on stderr (once stopped; empty unless piped)."""
        return self.proc.stderr.read() if self.proc.stderr else ""


@contextmanager
def rasd_dev(
    workdir: str,
    *args: str,
    env: dict[str, str] | None = None,
    stop_timeout: float = 30.0,
    stderr: int = subprocess.PIPE,
) -> Iterator[Dev]:
    """``rasd dev --dir workdir *args`` up to the end of its banner; Ctrl-C at the end of the
    block, however it ends (``Dev.rc`` then holds the exit status)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rasd", "dev", "--dir", workdir, *args],
        cwd=ROOT,
        env=dev_env() if env is None else env,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    dev = Dev(proc)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(LAST_LINE):
                break
        dev.banner = "".join(lines)
        assert lines and lines[-1].startswith(LAST_LINE), f"no banner: {dev.banner}"
        yield dev
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            dev.rc = proc.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise

"""The replicator between the replicas (``python -m sim.replicator``) as a child: started once it
says READY, stopped with its summary."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .procs import popen, stop


def start_replicator(
    cmd: list[str], env: dict[str, str], log: Path, group: bool = False
) -> subprocess.Popen[str]:
    """Run ``cmd`` (``sim.replicator.command``: text pipes for stdin and stdout, its log
    appended to ``log``) until it says READY; RuntimeError when it closes its stdout first
    (then it is stopped). ``group``: in a process group of its own."""
    with open(log, "ab") as err:
        proc: subprocess.Popen[str] = popen(
            cmd, env, group=group, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            text=True,
        )  # fmt: skip
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            stop(proc)
            raise RuntimeError(f"replicator did not start; see {log}")
        if line.startswith("READY"):
            return proc


def stop_replicator(proc: subprocess.Popen[str], timeout: float = 30.0) -> str | None:
    """Close its stdin (its signal to stop) and return the rest of its stdout, which ends with
    its summary (``fleet.procs.summary_line``); None when it had not stopped ``timeout``
    seconds later (then it is stopped with SIGTERM, SIGKILL)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        return None
    return out

"""Child processes: their environment, each in its own process group or not, stopping them,
the lines they announce themselves with."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: the repository: the children's working directory, so that ``python -m`` finds every tool
REPO = Path(__file__).resolve().parents[1]

#: credentials moto and dynalite accept; nothing here may ever reach real AWS
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


#: settings of the embedded moto server itself (rasd.devtools.motoserver: the flake hunt's
#: slowed DynamoDB), not of rasd: every child keeps them, so a moto a tool starts obeys them
MOTO_SETTINGS = ("RASD_MOTO_DELAY", "RASD_MOTO_STALLS")


def child_env(
    drop_prefixes: Iterable[str] = ("AWS_", "RASD_"),
    drop: Iterable[str] = (),
    repo_on_path: bool = False,
    **settings: str,
) -> dict[str, str]:
    """This process's environment for a child: without the variables whose names start with
    one of ``drop_prefixes`` (by default every AWS and rasd setting but :data:`MOTO_SETTINGS`:
    no profile, region or endpoint of the developer's leaks in) or are in ``drop``, with the
    fake credentials and ``RASD_CLOCK_CHECK=date``, ``settings`` on top. ``repo_on_path``:
    the repository first on PYTHONPATH."""
    prefixes, names = tuple(drop_prefixes), set(drop)
    env = {
        k: v
        for k, v in os.environ.items()
        if (k in MOTO_SETTINGS or not k.startswith(prefixes)) and k not in names
    }
    env.update(FAKE_CREDENTIALS)
    # A fleet runs on one host, whose kernel may keep no synchronised clock, and every backend
    # answers with this host's clock: daemons and jobs check theirs by the Date header alone.
    env["RASD_CLOCK_CHECK"] = "date"
    if repo_on_path:
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(settings)
    return env


def popen(
    cmd: list[str],
    env: dict[str, str] | None,
    group: bool = False,
    cwd: Path | None = REPO,
    **kw: Any,
) -> subprocess.Popen[Any]:
    """Start ``cmd`` in ``cwd`` with ``env`` (None: this process's). ``group``: the child
    leads a process group of its own (a new session), so that :func:`kill_group` reaches
    whatever it starts, and a terminal's Ctrl-C reaches only this process."""
    return subprocess.Popen(
        cmd, env=env, cwd=None if cwd is None else str(cwd), start_new_session=group, **kw
    )


def kill_group(proc: subprocess.Popen[Any] | None, sig: int = signal.SIGKILL) -> None:
    """Signal the child's whole process group (it leads one: ``popen(group=True)``). A child
    already reaped is left alone: its pid, and so its group id, may belong to another now."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def stop(proc: subprocess.Popen[Any], grace: float = 0.0) -> None:
    """Close the child's stdin (the signal to stop of the children that serve until it
    closes), give it ``grace`` seconds to exit, then SIGTERM, then SIGKILL; then close its
    stdout, whatever is left in it unread."""
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin:
            proc.stdin.close()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    with contextlib.suppress(OSError, ValueError):
        if proc.stdout:
            proc.stdout.close()


def summary_line(out: str) -> dict[str, Any] | None:
    """The last line of ``out`` that starts with ``{``, as JSON (a child's summary); None
    without one."""
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        return None
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary

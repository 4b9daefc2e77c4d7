"""DynamoDB stand-ins, each in its own process, and the delay proxy in front of one.

* ``moto``: moto's ``ThreadedMotoServer`` via ``rasd.devtools.motoserver`` (conditional writes
  made atomic, as in DynamoDB: plain moto lets two conditional UpdateItems on one item both
  succeed; werkzeug closes the connection after every response). It is in the dev
  dependencies. Its index Query walks every item of the table in Python, so its service time
  grows with the table: fine for latency shapes at small sizes, wrong for scale.
* ``dynalite``: the npm package (LevelDB/memdown-backed, keeps connections alive, index
  queries are range scans: flat with size). Installed on demand into ``bench/node_modules``
  (gitignored) when node/npm are on the machine (``python -m bench --install-dynalite``).

Each runs in a child process so that the backend's CPU (and moto's GIL) is not the caller's.
``endpoint`` is the backend itself; :class:`ProxyProcess` puts ``fleet.proxy``'s delay model in
front of one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from rasd.devtools import motoserver
from rasd.devtools.motoserver import announced_port

from .procs import REPO, child_env, kill_group, popen, stop

BENCH_DIR = REPO / "bench"
NODE_DIR = BENCH_DIR / "node_modules"
DYNALITE_BIN = NODE_DIR / ".bin" / "dynalite"
DYNALITE_VERSION = "3.2.2"


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (e.g. no node); the message says why and what to do."""


class Child:
    """A child that serves until stopped; a context manager that stops it."""

    proc: subprocess.Popen[Any]
    name = "child"
    #: the child leads a process group of its own (``popen(group=True)``)
    group = False

    def pid(self) -> int:
        return int(self.proc.pid)

    def stop(self) -> None:
        """Close its stdin, then SIGTERM, then SIGKILL."""
        if self.proc.poll() is None:
            stop(self.proc)

    def kill(self) -> None:
        """SIGKILL, to its process group when it leads one."""
        if self.group:
            kill_group(self.proc)
        elif self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def _port(self, timeout: float) -> int:
        """Its announced port; killed when it announces none."""
        try:
            return announced_port(self.proc, timeout)
        except RuntimeError:
            self.kill()
            raise

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------- moto
class Moto(Child):
    """moto's server as a child (``rasd.devtools.motoserver.spawn``) with ``env`` (default:
    :func:`fleet.procs.child_env`); ``group``: in a process group of its own; ``stderr``:
    where its log goes (default: ours). It serves until its stdin closes. ``wait=False``:
    started, not waited for (several start at once); :meth:`ready` waits. ``fast``: Queries
    cost what their partition holds (``rasd.devtools.motoserver.fast_queries``: the same
    answers, tested); ``count_file``: where it writes the requests it served by operation
    (JSON) once it stops."""

    name = "moto"

    def __init__(
        self,
        env: dict[str, str] | None = None,
        group: bool = False,
        stderr: int | None = None,
        timeout: float = 60.0,
        wait: bool = True,
        fast: bool = False,
        count_file: str | None = None,
    ) -> None:
        self.group = group
        self.timeout = timeout
        self.server = motoserver.spawn(
            fast=fast,
            count_file=count_file,
            env=child_env() if env is None else env,
            group=group,
            stderr=stderr,
            cwd=str(REPO),
            wait=False,
        )
        self.proc = self.server.proc
        self.port = 0
        self.endpoint = ""
        if wait:
            self.ready()

    def ready(self) -> Moto:
        """Once it has announced its port (``endpoint`` set); killed when it announces none."""
        if not self.port:
            try:
                self.server.ready(self.timeout)
            except RuntimeError:
                self.kill()
                raise
            self.port, self.endpoint = self.server.port, self.server.endpoint
        return self


# --------------------------------------------------------------------------------- dynalite
def dynalite_status() -> str | None:
    """None when dynalite can run, else the reason it cannot."""
    if DYNALITE_BIN.exists():
        return None if shutil.which("node") else "node is not on PATH"
    if not shutil.which("node") or not shutil.which("npm"):
        return "node/npm are not installed: dynalite scenarios are skipped"
    return (
        f"dynalite is not installed: run `python -m bench --install-dynalite` (npm into {NODE_DIR})"
    )


def install_dynalite() -> None:
    """``npm install dynalite`` into bench/node_modules (gitignored). No package.json is kept."""
    if DYNALITE_BIN.exists():
        return
    if not shutil.which("npm"):
        raise BackendUnavailable("npm is not installed; cannot install dynalite")
    cmd = [
        "npm",
        "install",
        "--no-save",
        "--no-package-lock",
        "--no-audit",
        "--no-fund",
        "--prefix",
        str(BENCH_DIR),
        f"dynalite@{DYNALITE_VERSION}",
    ]
    print("installing dynalite:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """Until something listens on ``port``; RuntimeError when ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"backend exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on port {port} after {timeout}s")


class Dynalite(Child):
    """dynalite on a free port; its log in bench/.cache/. ``path``: its LevelDB directory
    (default: in memory)."""

    name = "dynalite"

    def __init__(self, path: str | None = None) -> None:
        why = dynalite_status()
        if why:
            raise BackendUnavailable(why)
        self.port = free_port()
        cmd = [
            str(DYNALITE_BIN),
            "--port",
            str(self.port),
            "--host",
            "127.0.0.1",
            "--createTableMs",
            "0",
            "--deleteTableMs",
            "0",
            "--updateTableMs",
            "0",
        ]
        if path:
            cmd += ["--path", path]
        env = dict(os.environ)
        # 1M items (the 100K-per-sub-partition scale point) need more than node's default heap
        env["NODE_OPTIONS"] = (env.get("NODE_OPTIONS", "") + " --max-old-space-size=12288").strip()
        self.log_path = BENCH_DIR / ".cache" / f"dynalite-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = popen(
                cmd, env, cwd=None, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        wait_port(self.port, self.proc)
        self.endpoint = f"http://127.0.0.1:{self.port}"


def start_backend(kind: str, env: dict[str, str] | None = None) -> Moto | Dynalite:
    """A backend by name (``moto``, ``dynalite``); ``env``: moto's environment."""
    if kind == "moto":
        return Moto(env)
    if kind == "dynalite":
        return Dynalite()
    raise ValueError(f"unknown backend {kind!r}")


# ------------------------------------------------------------------------------------ proxy
class ProxyProcess(Child):
    """``python -m fleet.proxy`` in its own process, in HTTP mode, in front of ``upstream``
    (an http://host:port URL): ``delay_ms`` each way, ``handshake_rtts`` more round trips on
    a new connection's first request; ``trace``: a file it writes a JSON line per request to;
    ``meter``: (file, table, factory), the meter ``factory`` (``module:callable``) makes,
    e.g. what DynamoDB would bill."""

    name = "proxy"

    def __init__(
        self,
        upstream: str,
        delay_ms: float,
        handshake_rtts: float = 2.0,
        trace: str | None = None,
        meter: tuple[str, str, str] | None = None,
    ) -> None:
        hostport = upstream.split("://", 1)[-1].rstrip("/")
        meter_args = []
        if meter is not None:
            meter_args = [
                "--meter",
                meter[0],
                "--meter-table",
                meter[1],
                "--meter-factory",
                meter[2],
            ]
        self.proc = popen(
            [
                sys.executable,
                "-m",
                "fleet.proxy",
                "--upstream",
                hostport,
                "--delay-ms",
                str(delay_ms),
                "--handshake-rtts",
                str(handshake_rtts),
                "--http",
                *(["--trace", trace] if trace else []),
                *meter_args,
            ],
            None,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.port = self._port(60.0)
        self.endpoint = f"http://127.0.0.1:{self.port}"

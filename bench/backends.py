"""DynamoDB stand-ins for the benchmark, each in its own process, plus the delay proxy.

* ``moto``: moto's ``ThreadedMotoServer`` via ``rasd.devtools.motoserver`` (conditional writes made
  atomic, as in DynamoDB; werkzeug closes the connection after every response, which the
  proxy hides from the client). The default: it is in the dev dependencies. Its index Query
  walks every item of the table in Python, so its service time grows with the table: fine
  for latency shapes at small sizes, wrong for scale.
* ``dynalite``: the npm package (LevelDB/memdown-backed, keeps connections alive, index
  queries are range scans: flat with size). Used for the scale scenario. Installed on demand
  into ``bench/node_modules`` (gitignored) when node/npm are on the machine.

Both run in a child process so that the backend's CPU (and moto's GIL) is not the client's.
``Backend.endpoint`` is the backend itself; ``Proxy.endpoint`` is the same through the
``bench.proxy`` delay model, which is what the daemon and the baseline are pointed at.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
NODE_DIR = BENCH_DIR / "node_modules"
DYNALITE_BIN = NODE_DIR / ".bin" / "dynalite"
DYNALITE_VERSION = "3.2.2"

#: Credentials moto and dynalite accept; nothing here may ever reach real AWS.
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def aws_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("AWS_PROFILE", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"):
        env.pop(k, None)
    env.update(FAKE_AWS_ENV)
    return env


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (e.g. no node); the message says why and what to do."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
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


def _read_port(proc: subprocess.Popen[str], timeout: float = 30.0) -> int:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child exited ({proc.poll()}) before announcing its port")
        if line.startswith("PORT "):
            return int(line.split()[1])
    raise RuntimeError("child did not announce its port")


class _Child:
    proc: subprocess.Popen  # type: ignore[type-arg]
    name = "child"

    def pid(self) -> int:
        return int(self.proc.pid)

    def stop(self) -> None:
        p = self.proc
        if p.poll() is None:
            try:
                if p.stdin:
                    p.stdin.close()
            except OSError:
                pass
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------------------------------------- moto
class Moto(_Child):
    name = "moto"

    def __init__(self) -> None:
        # rasd.devtools.motoserver: moto's server with atomic conditional writes (plain moto
        # lets two conditional UpdateItems on one item both succeed, which real DynamoDB never does)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rasd.devtools.motoserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=aws_env(),
        )
        self.port = _read_port(self.proc)
        self.endpoint = f"http://127.0.0.1:{self.port}"


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


class Dynalite(_Child):
    name = "dynalite"

    def __init__(self, path: str | None = None) -> None:
        why = dynalite_status()
        if why:
            raise BackendUnavailable(why)
        self.port = _free_port()
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
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        _wait_port(self.port, self.proc)
        self.endpoint = f"http://127.0.0.1:{self.port}"


# ------------------------------------------------------------------------------------ proxy
class Proxy(_Child):
    """``bench.proxy`` in its own process, in front of ``upstream`` (an http://host:port URL)."""

    name = "proxy"

    def __init__(
        self, upstream: str, delay_ms: float, handshake_rtts: float = 2.0, trace: str | None = None
    ) -> None:
        hostport = upstream.split("://", 1)[-1].rstrip("/")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.proxy",
                "--upstream",
                hostport,
                "--delay-ms",
                str(delay_ms),
                "--handshake-rtts",
                str(handshake_rtts),
                "--http",
                *(["--trace", trace] if trace else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(BENCH_DIR.parent),
        )
        self.port = _read_port(self.proc)
        self.endpoint = f"http://127.0.0.1:{self.port}"


def start_backend(kind: str) -> Moto | Dynalite:
    if kind == "moto":
        return Moto()
    if kind == "dynalite":
        return Dynalite()
    raise ValueError(f"unknown backend {kind!r}")
